/* The Gloo side of the comparison: times Gloo's all-reduce over its tcp
 * device on loopback with `dsim bench`'s flags, inputs, check and columns
 * (sim/cli/bench_common.c), one process per rank, as mpi_bench does for MPI:
 *
 *   gloo_bench [allreduce] [--ranks 4] [--algo ring_chunked|halving_doubling]
 *              -b 4K -e 64M -f 4
 *
 * It forks its ranks itself (rank 0 is this process); they meet through a
 * Gloo FileStore in a fresh temporary directory. float32 only, and the ops
 * Gloo has (sum, prod, min, max). Exit status: 0, 1 if an output was wrong
 * or a rank failed, 2 for bad flags, 77 when no rank group could be formed
 * on loopback (nothing to measure here). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

extern "C" {
#include "bench_common.h"
}

#define GB_PROG       "gloo_bench"
#define GB_COPY_BYTES ((size_t)128 << 20)
#define GB_MAX_RANKS  64

enum gb_algo { GB_RING_CHUNKED, GB_HALVING_DOUBLING };

static void gb_usage(FILE *out)
{
    fprintf(out,
            "usage: %s [allreduce] [--ranks N] [--algo ring_chunked|halving_doubling] [flags]\n\n"
            "  --ranks N   processes, one rank each (default 4, at most %d)\n"
            "  --algo A    ring_chunked (default) or halving_doubling\n\nflags:\n",
            GB_PROG, GB_MAX_RANKS);
    bench_flags_help(out, 0);
}

static const gloo::ReductionFunction<float> *gb_fn(dsim_op op)
{
    switch (op) {
    case DSIM_PROD:
        return gloo::ReductionFunction<float>::product;
    case DSIM_MIN:
        return gloo::ReductionFunction<float>::min;
    case DSIM_MAX:
        return gloo::ReductionFunction<float>::max;
    default:
        return gloo::ReductionFunction<float>::sum;
    }
}

typedef struct gb_opts {
    bench_opts o;
    int ranks;
    gb_algo algo;
} gb_opts;

/* Takes --ranks and --algo out of argv, then the shared flags. */
static int gb_parse(int argc, char **argv, gb_opts *g)
{
    bench_opts_default(&g->o);
    g->ranks = 4;
    g->algo = GB_RING_CHUNKED;
    std::vector<char *> rest;
    rest.push_back(argv[0]);
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        std::string val;
        bool ranks = a == "--ranks" || a.rfind("--ranks=", 0) == 0;
        bool algo = a == "--algo" || a.rfind("--algo=", 0) == 0;
        if (!ranks && !algo) {
            rest.push_back(argv[i]);
            continue;
        }
        size_t eq = a.find('=');
        if (eq != std::string::npos) {
            val = a.substr(eq + 1);
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            fprintf(stderr, "%s: %s needs a value\n", GB_PROG, a.c_str());
            return 2;
        }
        if (ranks) {
            char *end = nullptr;
            long n = strtol(val.c_str(), &end, 10);
            if (end == val.c_str() || *end || n < 2 || n > GB_MAX_RANKS) {
                fprintf(stderr, "%s: --ranks %s: accepted: 2 to %d\n", GB_PROG, val.c_str(),
                        GB_MAX_RANKS);
                return 2;
            }
            g->ranks = (int)n;
        } else if (val == "ring_chunked") {
            g->algo = GB_RING_CHUNKED;
        } else if (val == "halving_doubling") {
            g->algo = GB_HALVING_DOUBLING;
        } else {
            fprintf(stderr, "%s: --algo %s: accepted: ring_chunked, halving_doubling\n", GB_PROG,
                    val.c_str());
            return 2;
        }
    }
    g->o.ranks = g->ranks;
    int rc = bench_parse(GB_PROG, (int)rest.size(), rest.data(), 1, 0, &g->o, stderr);
    if (rc != 0)
        return rc;
    if (g->o.coll != BENCH_ALLREDUCE || g->o.dtype != DSIM_F32 || g->o.op == DSIM_MEAN) {
        fprintf(stderr,
                "%s: Gloo is measured on allreduce of float with sum, prod, min or max; got %s "
                "of %s with %s\n",
                GB_PROG, bench_coll_name(g->o.coll), dsim_dtype_name(g->o.dtype),
                bench_redop_name(g->o.coll, g->o.op));
        return 2;
    }
    for (int s = 0; s < bench_nsteps(&g->o); s++)
        if (bench_size_for(g->o.coll, bench_step_bytes(&g->o, s), g->ranks, g->o.dtype).count >
            (size_t)INT32_MAX) {
            fprintf(stderr, "%s: -e %zu is above Gloo's int count; lower -e\n", GB_PROG,
                    g->o.maxbytes);
            return 2;
        }
    return 0;
}

static void gb_run_once(const gb_opts *g, const std::shared_ptr<gloo::Context> &ctx, float *buf,
                        int count)
{
    std::vector<float *> ptrs{buf};
    if (g->algo == GB_RING_CHUNKED) {
        gloo::AllreduceRingChunked<float> a(ctx, ptrs, count, gb_fn(g->o.op));
        a.run();
    } else {
        gloo::AllreduceHalvingDoubling<float> a(ctx, ptrs, count, gb_fn(g->o.op));
        a.run();
    }
}

/* The slowest rank's time, known on every rank. */
static double gb_max(const std::shared_ptr<gloo::Context> &ctx, double mine)
{
    std::vector<double *> ptrs{&mine};
    gloo::AllreduceRing<double> a(ctx, ptrs, 1, gloo::ReductionFunction<double>::max);
    a.run();
    return mine;
}

static uint64_t gb_sum(const std::shared_ptr<gloo::Context> &ctx, uint64_t mine)
{
    double v = (double)mine;
    std::vector<double *> ptrs{&v};
    gloo::AllreduceRing<double> a(ctx, ptrs, 1, gloo::ReductionFunction<double>::sum);
    a.run();
    return (uint64_t)v;
}

/* Shutting down. Gloo's tcp device throws from its event loop's thread when
 * a peer closes its connection, which terminates the process, and one rank
 * always closes first. So every rank passes a last barrier, keeps its
 * context (never destroyed: no destructor joins the loop's thread) and
 * leaves with _exit; a close seen after that barrier only parks the loop's
 * thread. Before it, a close is a failure as usual. */
static std::atomic<bool> gb_done{false};

static void gb_on_terminate()
{
    if (gb_done.load())
        for (;;)
            pause();
    abort();
}

static void gb_barrier(const std::shared_ptr<gloo::Context> &ctx)
{
    gloo::BarrierAllToOne b(ctx);
    b.run();
}

/* One rank's sweep; rank 0 prints. Returns the exit status. */
static int gb_rank(const gb_opts *g, int rank, const std::string &dir)
{
    const bench_opts *o = &g->o;
    int n = g->ranks;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore store(dir);
        ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
        ctx->setTimeout(std::chrono::seconds(60));
        ctx->connectFullMesh(store, dev);
    } catch (const std::exception &e) {
        fprintf(stderr, "%s: rank %d cannot join the group on loopback: %s\n", GB_PROG, rank,
                e.what());
        return 77;
    }
    double copy_bw = 0;
    if (rank == 0)
        copy_bw = bench_copy_bandwidth(GB_COPY_BYTES, 5);
    gb_barrier(ctx);
    if (rank == 0) {
        printf("# %s %s: %d ranks (one process each, %ld CPUs online), gloo::%s over its tcp "
               "device (127.0.0.1), Gloo %d.%d.%d\n",
               GB_PROG, bench_coll_name(o->coll), n, sysconf(_SC_NPROCESSORS_ONLN),
               g->algo == GB_RING_CHUNKED ? "AllreduceRingChunked" : "AllreduceHalvingDoubling",
               GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH);
        bench_print_header(stdout, o, copy_bw, GB_COPY_BYTES,
                           "the slowest rank's average per iteration; each rank times its -n "
                           "iterations from a barrier after the -w warm-ups (in place: a last, "
                           "untimed call from the input is the one checked)");
    }
    std::vector<double> scratch(BENCH_CHUNK);
    uint64_t wrong_total = 0;
    double busbw_sum = 0;
    int rows = 0;
    for (int s = 0; s < bench_nsteps(o); s++) {
        bench_size sz = bench_size_for(o->coll, bench_step_bytes(o, s), n, o->dtype);
        if (sz.bytes == 0)
            continue;
        /* Allocated as dsim's own buffers are (bench_buf_alloc). */
        std::unique_ptr<float, decltype(&free)> input_(
            static_cast<float *>(bench_buf_alloc(sz.count * sizeof(float))), &free),
            buf_(static_cast<float *>(bench_buf_alloc(sz.count * sizeof(float))), &free);
        if (!input_ || !buf_) {
            fprintf(stderr, "%s: rank %d: out of memory for %zu B; lower -e\n", GB_PROG, rank,
                    sz.bytes);
            return 1;
        }
        float *input = input_.get(), *buf = buf_.get();
        size_t nbytes = sz.count * sizeof(float);
        bench_fill(o->coll, o->op, o->dtype, n, o->root, rank, &sz, input, scratch.data());
        /* Gloo reduces in place, so the timed iterations reduce what the
         * one before left (the values grow; the time does not care), and
         * one more from the input, untimed, is what gets checked. */
        memcpy(buf, input, nbytes);
        for (int i = 0; i < o->warmup; i++)
            gb_run_once(g, ctx, buf, (int)sz.count);
        gb_barrier(ctx);
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < o->iters; i++)
            gb_run_once(g, ctx, buf, (int)sz.count);
        double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double slowest = gb_max(ctx, spent);
        memcpy(buf, input, nbytes);
        gb_run_once(g, ctx, buf, (int)sz.count);
        size_t w = 0;
        if (o->check &&
            bench_check_output(o->coll, o->op, o->dtype, n, o->root, rank, &sz, buf, &w) != 0) {
            fprintf(stderr, "%s: rank %d: out of memory checking the output\n", GB_PROG, rank);
            return 1;
        }
        uint64_t wrong = gb_sum(ctx, w);
        wrong_total += wrong;
        if (rank == 0) {
            bench_row row = {};
            row.sz = sz;
            row.dtype = o->dtype;
            row.redop = bench_redop_name(o->coll, o->op);
            row.seconds = slowest / o->iters;
            row.checked = o->check;
            row.wrong = wrong;
            bench_row_finish(&row, o->coll, n, copy_bw);
            bench_print_row(stdout, &row);
            fflush(stdout);
            busbw_sum += row.busbw;
        }
        rows++;
    }
    if (rank == 0)
        bench_print_footer(stdout, wrong_total, o->check, rows ? busbw_sum / rows : 0.0);
    gb_barrier(ctx);
    gb_done.store(true);
    new std::shared_ptr<gloo::rendezvous::Context>(ctx); /* kept to the _exit (above) */
    return wrong_total ? 1 : 0;
}

static void gb_rmdir(const std::string &dir)
{
    DIR *d = opendir(dir.c_str());
    if (d) {
        while (struct dirent *e = readdir(d))
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            gb_usage(stdout);
            return 0;
        }
    gb_opts g;
    std::set_terminate(gb_on_terminate);
    int rc = gb_parse(argc, argv, &g);
    if (rc != 0)
        return rc;
    const char *tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/gloo_bench.XXXXXX";
    std::vector<char> path(tmpl.begin(), tmpl.end());
    path.push_back('\0');
    if (!mkdtemp(path.data())) {
        fprintf(stderr, "%s: cannot make a directory for the rendezvous in %s: %s\n", GB_PROG,
                tmpl.c_str(), strerror(errno));
        return 1;
    }
    std::string dir = path.data();
    fflush(stdout);
    std::vector<pid_t> kids;
    for (int r = 1; r < g.ranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "%s: fork: %s\n", GB_PROG, strerror(errno));
            for (pid_t k : kids)
                kill(k, SIGKILL);
            gb_rmdir(dir);
            return 1;
        }
        if (pid == 0) {
            if (!freopen("/dev/null", "w", stdout))
                _exit(1);
            _exit(gb_rank(&g, r, dir));
        }
        kids.push_back(pid);
    }
    rc = gb_rank(&g, 0, dir);
    for (pid_t k : kids) {
        int st = 0;
        if (rc == 77)
            kill(k, SIGKILL);
        waitpid(k, &st, 0);
        int krc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
        if (rc == 0 && krc != 0)
            rc = krc;
    }
    gb_rmdir(dir);
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
}
