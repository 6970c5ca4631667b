/* dsim bench: times one collective over N ranks of an engine and prints
 * nccl-tests' table plus the percentage of the memory-bandwidth bound. This
 * file parses the flags and prints; the benchmark is sim/bench/bench.h (the
 * engine's rank program, sim/engine/engine.h). The flags, inputs, check and
 * columns are shared with tests/bench/mpi_bench.c (bench_common.h), so the
 * two tables compare line by line. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cmds.h"
#include "dsim/err.h"

#define BENCH_PROG "dsim bench"
/* Bytes of the memcpy that measures copy bandwidth: far beyond any cache. */
#define BENCH_COPY_BYTES ((size_t)128 << 20)
#define BENCH_KEPT       64

static int bench_parse_corrupt(int nranks, int *out)
{
    const char *s = getenv("DSIM_BENCH_CORRUPT");
    *out = -1;
    if (!s || !*s)
        return 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 0 || v >= nranks) {
        fprintf(stderr, "%s: DSIM_BENCH_CORRUPT='%s' is not a rank; accepted: 0 to %d, or unset\n",
                BENCH_PROG, s, nranks - 1);
        return 2;
    }
    *out = (int)v;
    return 0;
}

/* The flags beyond their own syntax: the collective, the algorithm, the
 * root, the transport, the engine, --model. 0, or 2 after a message. */
static int bench_check(bench_opts *o, dsim_algo *algo, const dsim_engine_ops **eng)
{
    char names[160];
    if (!o->have_coll) {
        fprintf(stderr,
                "%s: name a collective: allreduce, reduce_scatter, allgather or broadcast "
                "(e.g. 'dsim bench allreduce -b 1M -e 64M')\n",
                BENCH_PROG);
        return 2;
    }
    if (dsim_algo_parse(o->algo, algo) != DSIM_OK) {
        char names[256];
        fprintf(stderr, "%s: --algo '%s' is not an algorithm; accepted: %s\n", BENCH_PROG, o->algo,
                dsim_algo_list(names, sizeof names, 1, ", ", ", "));
        return 2;
    }
    if (*algo != DSIM_ALGO_AUTO && o->coll != BENCH_ALLREDUCE) {
        fprintf(stderr, "%s: --algo '%s' applies to allreduce only; drop it for %s\n", BENCH_PROG,
                o->algo, bench_coll_name(o->coll));
        return 2;
    }
    if (o->root >= o->ranks) {
        fprintf(stderr, "%s: -r %d is not a rank of %d; accepted: 0 to %d\n", BENCH_PROG, o->root,
                o->ranks, o->ranks - 1);
        return 2;
    }
    if (strcmp(o->transport, "inproc") != 0 && strcmp(o->transport, "tcp") != 0 &&
        strcmp(o->transport, "shm") != 0) {
        fprintf(stderr, "%s: --transport '%s' is not a transport; accepted: inproc, shm, tcp\n",
                BENCH_PROG, o->transport);
        return 2;
    }
    if (dsim_engine_find(o->engine, eng) != DSIM_OK || !(*eng)->ranks) {
        fprintf(stderr, "%s: --engine '%s' is not an engine that runs ranks; accepted: %s\n",
                BENCH_PROG, o->engine, dsim_engine_names(0, true, names, sizeof names));
        return 2;
    }
    o->transport = dsim_bench_transport(*eng, o->transport);
    if (o->model &&
        (o->coll != BENCH_ALLREDUCE || strcmp(o->transport, dsim_calib_transport(*eng)) != 0)) {
        fprintf(stderr,
                "%s: --model 1 models allreduce on the threads engine over inproc and on the "
                "processes engine (each engine over the transport its calibration measures); "
                "drop it for %s over %s on %s\n",
                BENCH_PROG, bench_coll_name(o->coll), o->transport, o->engine);
        return 2;
    }
    double most = dsim_bench_mem_needed(o);
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (phys > 0 && most > 0.75 * phys) {
        fprintf(stderr,
                "%s: -e %zu with --ranks %d needs %.1f GiB of buffers but this machine has "
                "%.1f GiB; lower -e or --ranks\n",
                BENCH_PROG, o->maxbytes, o->ranks, most / (1 << 30), phys / (1 << 30));
        return 2;
    }
    return 0;
}

/* What the table has printed so far. */
typedef struct bench_print {
    const bench_opts *o;
    dsim_algo algo; /* as asked */
    bench_row kept[BENCH_KEPT];
    dsim_algo kept_algo[BENCH_KEPT];
    int nkept, rows;
    uint64_t wrong;
    double busbw_sum;
    char decided[1024];
    size_t dlen;
} bench_print;

/* The 8-byte all-reduce beside the table: its time a call. */
static int bench_on_latency(const bench_row *row, dsim_algo used, size_t step_bytes, void *user)
{
    (void)used;
    (void)step_bytes;
    if (row)
        *(double *)user = row->seconds;
    return 0;
}

/* An 8-byte all-reduce (two floats) on the same engine, transport and
 * algorithm: the latency floor that every step's loss reduction pays. */
static void bench_print_latency(const bench_opts *o, const dsim_bench_sweep *sw)
{
    bench_opts lo = *o;
    lo.minbytes = lo.maxbytes = 8;
    lo.dtype = DSIM_F32;
    lo.iters = o->iters > 100 ? o->iters : 100;
    double secs = -1;
    dsim_bench_sweep ls = *sw;
    ls.o = &lo;
    ls.on_row = bench_on_latency;
    ls.user = &secs;
    ls.corrupt_rank = -1;
    if (dsim_bench_run(&ls) == 0 && secs >= 0)
        printf("# 8-byte all-reduce   : %.2f us a call (%d iterations; the latency floor a "
               "step's loss reduction pays)\n",
               secs * 1e6, lo.iters);
}

static int bench_on_row(const bench_row *row, dsim_algo used, size_t step_bytes, void *user)
{
    bench_print *p = user;
    const bench_opts *o = p->o;
    if (!row) {
        printf("# %zu B: too small for whole %s elements on %d ranks; skipped\n", step_bytes,
               dsim_dtype_name(o->dtype), o->ranks);
        return 0;
    }
    bench_print_row(stdout, row);
    if (p->nkept < BENCH_KEPT) {
        p->kept[p->nkept] = *row;
        p->kept_algo[p->nkept++] = used;
    }
    p->wrong += row->wrong;
    p->busbw_sum += row->busbw;
    p->rows++;
    if (o->coll == BENCH_ALLREDUCE && p->algo == DSIM_ALGO_AUTO && p->dlen < sizeof p->decided - 64)
        p->dlen += (size_t)snprintf(p->decided + p->dlen, sizeof p->decided - p->dlen, " %zu:%s",
                                    row->sz.bytes, dsim_algo_name(used));
    return 0;
}

/* --model 1: the cost model calibrated on this machine in this run
 * (sim/model/calibrate.h: per-message cost and link rate from a ping-pong
 * over this engine's transport, copy and reduction rates per core with every
 * core busy at each size, the cores) beside each measured allreduce time. */
static int bench_print_model(const bench_opts *o, const bench_print *p)
{
    dsim_calib cal;
    dsim_calib_row *cr = calloc((size_t)(p->nkept ? p->nkept : 1), sizeof *cr);
    if (!cr ||
        dsim_bench_model(o, o->engine, p->kept, p->kept_algo, p->nkept, &cal, cr) != DSIM_OK) {
        fprintf(stderr, "%s: --model: could not calibrate the %s engine: %s\n", BENCH_PROG,
                o->engine, cr ? dsim_errmsg() : "out of memory");
        free(cr);
        return 1;
    }
    if (o->dtype != DSIM_F32)
        printf("# model: calibrated with float32 sums; this table is %s\n",
               dsim_dtype_name(o->dtype));
    printf("# model: calibrated here (dsim calibrate --engine %s --ranks %d): ping-pong alpha "
           "%.2f us per message, link %.2f GB/s (fit); a ring exchange of 64 B over the %d ranks "
           "%.2f us; %d cores; per row, the algorithm's own steps replayed over the ranks at 64 B "
           "(its latency) and at its message size (xchg_us, xchg_red_us: a step of it, plain and "
           "combining receives), and the copy rate\n",
           cal.engine, o->ranks, cal.alpha_s * 1e6, cal.link_Bps / 1e9, o->ranks,
           cal.alpha_x_s * 1e6, cal.cores);
    printf("#  %10s  %-14s %12s %12s %8s %10s %12s %12s\n", "size", "algo", "measured_us",
           "model_us", "error", "msg", "xchg_us", "xchg_red_us");
    double abs_sum = 0;
    int n = 0;
    for (int i = 0; i < p->nkept; i++) {
        const bench_row *row = &p->kept[i];
        double m = cr[i].seconds;
        double err = row->seconds > 0 ? (m - row->seconds) / row->seconds : NAN;
        printf("#  %10zu  %-14s %12.1f %12.1f %+7.0f%% %10zu %12.1f %12.1f\n", row->sz.bytes,
               dsim_algo_name(p->kept_algo[i]), row->seconds * 1e6, m * 1e6, 100 * err, cr[i].msg,
               cr[i].step_copy_s * 1e6, cr[i].step_reduce_s * 1e6);
        if (isfinite(err)) {
            abs_sum += fabs(err);
            n++;
        }
    }
    if (n)
        printf("# model: mean absolute error %.0f%% over %d sizes\n", 100 * abs_sum / n, n);
    free(cr);
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "model") == 0)
        return cmd_bench_model(argc - 1, argv + 1);
    bench_opts o;
    bench_opts_default(&o);
    int rc = bench_parse(BENCH_PROG, argc, argv, 1, BENCH_FLAG_DSIM, &o, stderr);
    dsim_algo algo = DSIM_ALGO_AUTO;
    const dsim_engine_ops *eng = NULL;
    if (rc == 0)
        rc = bench_check(&o, &algo, &eng);
    int corrupt = -1;
    if (rc == 0)
        rc = bench_parse_corrupt(o.ranks, &corrupt);
    if (rc != 0)
        return rc;
    double copy_bw = bench_copy_bandwidth(BENCH_COPY_BYTES, 5);
    bool forks = (eng->flags & DSIM_ENGINE_FORKS) != 0;
    printf("# dsim bench %s: %d ranks, engine %s (one %s per rank, %ld CPUs online), "
           "transport %s, algo %s, fingerprints %s\n",
           bench_coll_name(o.coll), o.ranks, eng->name, forks ? "process" : "thread",
           sysconf(_SC_NPROCESSORS_ONLN), o.transport,
           o.coll == BENCH_ALLREDUCE ? dsim_algo_name(algo) : "fixed (only allreduce has a choice)",
           o.fingerprint ? "on" : "off (--fingerprint 0)");
    bench_print_header(stdout, &o, copy_bw, BENCH_COPY_BYTES,
                       "the slowest rank's average per iteration; each rank times its -n "
                       "iterations from a dsim_barrier after the -w warm-ups");
    bench_print *p = calloc(1, sizeof *p);
    if (!p) {
        fprintf(stderr, "%s: out of memory\n", BENCH_PROG);
        return 1;
    }
    p->o = &o;
    p->algo = algo;
    dsim_bench_sweep sw = {.o = &o,
                           .engine = eng,
                           .algo = algo,
                           .corrupt_rank = corrupt,
                           .copy_bw = copy_bw,
                           .on_row = bench_on_row,
                           .user = p,
                           .err = stderr};
    rc = dsim_bench_run(&sw);
    if (rc == 0) {
        bench_print_footer(stdout, p->wrong, o.check, p->rows ? p->busbw_sum / p->rows : 0.0);
        if (o.coll == BENCH_ALLREDUCE && !p->wrong)
            bench_print_latency(&o, &sw);
        if (p->dlen)
            printf("# algo auto chose (bytes:algo):%s\n", p->decided);
        if (p->wrong) {
            fprintf(stderr, "%s: %" PRIu64 " wrong elements; the collective's results are wrong\n",
                    BENCH_PROG, p->wrong);
            rc = 1;
        }
    }
    if (rc == 0 && o.model)
        rc = bench_print_model(&o, p);
    free(p);
    return rc;
}

void cmd_bench_help(FILE *out)
{
    fprintf(out, "usage: dsim bench allreduce|reduce_scatter|allgather|broadcast [flags]\n"
                 "       dsim bench model [flags]   (the models' compute: below)\n"
                 "\n"
                 "Times one collective over --ranks ranks, each a worker thread of the threads\n"
                 "engine on an inproc fabric (--transport shm or tcp: one shared mapping, or\n"
                 "sockets over 127.0.0.1, instead; --engine processes: a process per rank),\n"
                 "and prints nccl-tests' columns: size, count, type, redop, time, algbw, busbw\n"
                 "(GB = 1e9 B), #wrong, plus %%bound: how close the time is to reading every\n"
                 "rank's input once and writing its output once at this machine's memcpy\n"
                 "bandwidth (measured at start-up and printed in the header).\n"
                 "For reduce_scatter and allgather the size is the full buffer of all ranks'\n"
                 "blocks, as in nccl-tests.\n"
                 "\n"
                 "flags:\n");
    bench_flags_help(out, BENCH_FLAG_DSIM);
    fprintf(out, "\nengines (--engine):\n");
    const dsim_engine_ops *e;
    for (int i = 0; (e = dsim_engine_at(i)); i++)
        if (e->ranks)
            fprintf(out, "  %-22s %s\n", e->name, e->summary);
    fprintf(out, "\n"
                 "Exit status: 0 all results right, 1 a wrong result or a failed collective,\n"
                 "2 bad flags.\n"
                 "Testing: DSIM_BENCH_CORRUPT=<rank> flips a bit of that rank's output before the\n"
                 "check, to show the check catches it.\n\n");
    cmd_bench_model_help(out);
}
