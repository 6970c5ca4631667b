/* dsim bench: times one collective over N ranks, each a worker of the
 * threads engine on an inproc or tcp fabric (--transport), and prints
 * nccl-tests' table plus the
 * percentage of the memory-bandwidth bound. The flags, inputs, check and
 * columns are shared with tests/bench/mpi_bench.c (bench_common.c), so the
 * two tables compare line by line. */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "bench_common.h"
#include "cmds.h"
#include "dsim/comm.h"
#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/reduce.h"
#include "dsim/transport.h"
#include "model/calibrate.h"
#include "model/costmodel.h"
#include <math.h>
#include <time.h>

#define BENCH_PROG "dsim bench"
/* Bytes of the memcpy that measures copy bandwidth: far beyond any cache. */
#define BENCH_COPY_BYTES ((size_t)128 << 20)

typedef struct bench_result {
    int64_t ns;   /* this rank's time for the -n timed iterations */
    size_t wrong; /* wrong elements in its output */
    dsim_err err; /* DSIM_OK, or why the rank stopped */
    char msg[640];
} bench_result;

/* What every rank of one size step shares; read-only while workers run,
 * except each rank's own result slot. */
typedef struct bench_job {
    const bench_opts *o;
    dsim_algo algo;
    dsim_ep **eps;
    bench_size sz;
    uint32_t comm_id;
    int corrupt_rank; /* -1, or the rank whose output gets one wrong element */
    bench_result *res;
} bench_job;

typedef struct bench_worker_arg {
    bench_job *job;
    int rank;
} bench_worker_arg;

static void bench_fail(bench_result *res, dsim_err e, const char *what, const char *detail)
{
    res->err = e;
    snprintf(res->msg, sizeof res->msg, "%s: %s (%s)", what, detail && *detail ? detail : "",
             dsim_strerror(e));
}

static dsim_err bench_run_once(const bench_job *job, dsim_comm *comm, const void *send, void *recv)
{
    const bench_opts *o = job->o;
    switch (o->coll) {
    case BENCH_ALLREDUCE:
        return dsim_allreduce_with(comm, send, recv, job->sz.count, o->dtype, o->op, job->algo);
    case BENCH_REDUCE_SCATTER:
        return dsim_reduce_scatter(comm, send, recv, job->sz.rank_count, o->dtype, o->op);
    case BENCH_ALLGATHER:
        return dsim_allgather(comm, send, recv, job->sz.rank_count, o->dtype);
    case BENCH_BROADCAST:
    default:
        return dsim_broadcast(comm, recv, job->sz.count, o->dtype, o->root);
    }
}

static void bench_worker(void *p)
{
    const bench_worker_arg *arg = p;
    bench_job *job = arg->job;
    const bench_opts *o = job->o;
    int rank = arg->rank;
    bench_result *res = &job->res[rank];
    dsim_ep *ep = job->eps[rank];
    dsim_rt *rt = dsim_ep_rt(ep);
    size_t es = dsim_dtype_size(o->dtype);
    size_t in_bytes = bench_in_count(o->coll, &job->sz) * es;
    size_t out_bytes = bench_out_count(o->coll, &job->sz) * es;
    void *send = NULL, *recv = NULL;
    double *scratch = NULL;
    dsim_comm *comm = NULL;

    res->err = DSIM_OK;
    /* Generous: a slow shared machine must not turn a large step into a
     * timeout, yet a real hang still ends. */
    int64_t timeout = 30000000000LL + 10 * (int64_t)job->sz.bytes * o->ranks;
    dsim_comm_cfg cfg = {.ep = ep,
                         .size = o->ranks,
                         .comm_id = job->comm_id,
                         .timeout_ns = timeout,
                         .algo = job->algo,
                         .no_fingerprint = !o->fingerprint};
    dsim_err e = dsim_comm_create(&cfg, &comm);
    if (e != DSIM_OK) {
        bench_fail(res, e, "creating the communicator", dsim_errmsg());
        dsim_ep_abort(ep, rank, "a rank could not create its communicator");
        return;
    }

    scratch = malloc(BENCH_CHUNK * sizeof *scratch);
    /* Broadcast is in place: its one buffer is recv, filled like an input. */
    if (o->coll != BENCH_BROADCAST)
        send = malloc(in_bytes);
    recv = malloc(out_bytes);
    if (!scratch || !recv || (o->coll != BENCH_BROADCAST && !send)) {
        bench_fail(res, DSIM_ENOMEM, "allocating the buffers", "lower -e or --ranks");
        dsim_ep_abort(ep, rank, "a rank ran out of memory for its buffers");
        goto out;
    }
    bench_fill(o->coll, o->op, o->dtype, o->ranks, o->root, rank, &job->sz,
               o->coll == BENCH_BROADCAST ? recv : send, scratch);
    if (o->coll != BENCH_BROADCAST)
        memset(recv, 0xff, out_bytes);

    for (int i = 0; i < o->warmup; i++) {
        e = bench_run_once(job, comm, send, recv);
        if (e != DSIM_OK)
            goto coll_failed;
    }
    e = dsim_barrier(comm);
    if (e != DSIM_OK)
        goto coll_failed;
    int64_t t0 = dsim_rt_now(rt);
    for (int i = 0; i < o->iters; i++) {
        e = bench_run_once(job, comm, send, recv);
        if (e != DSIM_OK)
            goto coll_failed;
    }
    res->ns = dsim_rt_now(rt) - t0;

    if (rank == job->corrupt_rank)
        ((unsigned char *)recv)[0] ^= 1;
    if (o->check && bench_check_output(o->coll, o->op, o->dtype, o->ranks, o->root, rank, &job->sz,
                                       recv, &res->wrong) != 0)
        bench_fail(res, DSIM_ENOMEM, "checking the output", "out of memory");
    goto out;

coll_failed : {
    const dsim_error *ce = dsim_comm_error(comm);
    bench_fail(res, e, bench_coll_name(o->coll),
               ce && ce->code != DSIM_OK ? ce->msg : dsim_errmsg());
}
out:
    free(scratch);
    free(send);
    free(recv);
    dsim_comm_destroy(comm);
}

/* Bytes all ranks' buffers take at a size step (to refuse, up front, a
 * sweep that cannot fit). */
static double bench_mem_needed(const bench_opts *o, const bench_size *sz)
{
    size_t es = dsim_dtype_size(o->dtype);
    double per_rank = (double)bench_out_count(o->coll, sz) * (double)es;
    if (o->coll != BENCH_BROADCAST)
        per_rank += (double)bench_in_count(o->coll, sz) * (double)es;
    return per_rank * o->ranks;
}

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

/* The row of one size step from every rank's result: the slowest rank's
 * time; 0, or 1 after printing which rank failed and why. */
static int bench_collect(const bench_job *job, int spawned, bench_row *row)
{
    const bench_opts *o = job->o;
    int rc = 0;
    int64_t slowest = 0;
    uint64_t wrong = 0;
    for (int r = 0; r < spawned && rc == 0; r++) {
        if (job->res[r].err != DSIM_OK) {
            fprintf(stderr, "%s: %s of %zu B failed on rank %d: %s\n", BENCH_PROG,
                    bench_coll_name(o->coll), job->sz.bytes, r, job->res[r].msg);
            rc = 1;
        }
        if (job->res[r].ns > slowest)
            slowest = job->res[r].ns;
        wrong += job->res[r].wrong;
    }
    if (rc == 0) {
        row->sz = job->sz;
        row->dtype = o->dtype;
        row->redop = bench_redop_name(o->coll, o->op);
        row->seconds = (double)slowest / 1e9 / o->iters;
        row->checked = o->check;
        row->wrong = wrong;
    }
    return rc;
}

/* Runs one size step on every rank; 0, or 1 after printing why it failed. */
static int bench_step(bench_job *job, dsim_rt *rt, dsim_fabric *fab, bench_row *row)
{
    const bench_opts *o = job->o;
    int n = o->ranks;
    bench_worker_arg *args = calloc((size_t)n, sizeof *args);
    dsim_task **tasks = calloc((size_t)n, sizeof *tasks);
    int rc = 0;
    if (!args || !tasks) {
        fprintf(stderr, "%s: out of memory for %d workers\n", BENCH_PROG, n);
        free(args);
        free(tasks);
        return 1;
    }
    memset(job->res, 0, (size_t)n * sizeof *job->res);
    int spawned = 0;
    for (int r = 0; r < n; r++) {
        args[r].job = job;
        args[r].rank = r;
        dsim_err e = dsim_rt_spawn(rt, r, bench_worker, &args[r], &tasks[r]);
        if (e != DSIM_OK) {
            fprintf(stderr, "%s: could not start the worker of rank %d: %s (%s)\n", BENCH_PROG, r,
                    dsim_errmsg(), dsim_strerror(e));
            dsim_fabric_abort(fab, r, "the benchmark could not start every worker");
            rc = 1;
            break;
        }
        spawned++;
    }
    for (int r = 0; r < spawned; r++)
        dsim_rt_join(rt, tasks[r]);

    if (rc == 0)
        rc = bench_collect(job, spawned, row);
    free(args);
    free(tasks);
    return rc;
}

/* ---- --engine processes: every rank a forked process over tcp ---- */

static void bench_child_report(int wfd, const bench_result *res)
{
    const char *p = (const char *)res;
    size_t left = sizeof *res;
    while (left) {
        ssize_t w = write(wfd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w, left -= (size_t)w;
    }
}

/* Rank r's process: the whole sweep over its one endpoint; one result per
 * size step down the pipe. Never returns. */
static void bench_child(const bench_opts *o, dsim_algo algo, int corrupt, int r, const char *addrs,
                        int lfd, int wfd)
{
    size_t cap = strlen(addrs) + 128;
    char *opts = malloc(cap);
    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    dsim_ep **eps = calloc((size_t)o->ranks, sizeof *eps);
    bench_result *res = calloc((size_t)o->ranks, sizeof *res);
    bench_result fail = {.err = DSIM_ENOMEM};
    snprintf(fail.msg, sizeof fail.msg, "rank %d: out of memory", r);
    dsim_err e = opts && eps && res ? DSIM_OK : DSIM_ENOMEM;
    if (e == DSIM_OK) {
        snprintf(opts, cap, "addrs=%s,local=%d,listen_fds=%d", addrs, r, lfd);
        e = dsim_rt_create("threads", &rt);
    }
    if (e == DSIM_OK) {
        dsim_fabric_cfg fcfg = {.backend = "tcp", .nranks = o->ranks, .rt = rt, .options = opts};
        e = dsim_fabric_open(&fcfg, &fab);
    }
    if (e == DSIM_OK)
        e = dsim_ep_open(fab, r, &eps[r]);
    if (e != DSIM_OK) {
        fail.err = e;
        snprintf(fail.msg, sizeof fail.msg, "rank %d could not join the tcp fabric: %s", r,
                 dsim_errmsg());
    }
    bench_job job = {.o = o, .algo = algo, .eps = eps, .corrupt_rank = corrupt, .res = res};
    int nsteps = bench_nsteps(o);
    for (int s = 0; s < nsteps; s++) {
        job.sz = bench_size_for(o->coll, bench_step_bytes(o, s), o->ranks, o->dtype);
        if (job.sz.bytes == 0)
            continue;
        if (e != DSIM_OK) {
            bench_child_report(wfd, &fail);
            continue;
        }
        job.comm_id = (uint32_t)s + 1;
        bench_worker_arg arg = {.job = &job, .rank = r};
        dsim_task *task = NULL;
        memset(&res[r], 0, sizeof res[r]);
        dsim_err se = dsim_rt_spawn(rt, r, bench_worker, &arg, &task);
        if (se == DSIM_OK)
            dsim_rt_join(rt, task);
        else
            bench_fail(&res[r], se, "starting the rank's worker", dsim_errmsg());
        bench_child_report(wfd, &res[r]);
        if (res[r].err != DSIM_OK) {
            e = res[r].err;
            fail = res[r];
        }
    }
    if (eps && eps[r])
        dsim_ep_close(eps[r]);
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    _exit(e == DSIM_OK ? 0 : 1);
}

/* Forks the ranks, each over the whole sweep; out[s * ranks + r] gets rank
 * r's result of step s (steps too small for whole elements are skipped by
 * every rank alike and stay zero). 0, or 1 after printing why. */
static int bench_processes(const bench_opts *o, dsim_algo algo, int corrupt, bench_result *out)
{
    int n = o->ranks, nsteps = bench_nsteps(o), rc = 0;
    int *lfd = calloc((size_t)n, sizeof *lfd), *port = calloc((size_t)n, sizeof *port);
    int *rfd = calloc((size_t)n, sizeof *rfd);
    pid_t *pid = calloc((size_t)n, sizeof *pid);
    char *addrs = malloc((size_t)n * 24 + 1);
    if (!lfd || !port || !rfd || !pid || !addrs) {
        fprintf(stderr, "%s: out of memory for %d ranks\n", BENCH_PROG, n);
        rc = 1;
        goto out;
    }
    for (int r = 0; r < n; r++)
        lfd[r] = rfd[r] = -1;
    size_t len = 0;
    for (int r = 0; r < n && rc == 0; r++) {
        lfd[r] = dsim_calib_listen_loopback(&port[r]);
        if (lfd[r] < 0) {
            fprintf(stderr, "%s: --engine processes: cannot listen on 127.0.0.1: %s\n", BENCH_PROG,
                    strerror(errno));
            rc = 1;
        }
        len += (size_t)sprintf(addrs + len, "%s127.0.0.1:%d", r ? ";" : "", port[r]);
    }
    fflush(NULL);
    for (int r = 0; r < n && rc == 0; r++) {
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0 || (pid[r] = fork()) < 0) {
            fprintf(stderr, "%s: --engine processes: cannot start rank %d: %s\n", BENCH_PROG, r,
                    strerror(errno));
            rc = 1;
            break;
        }
        if (pid[r] == 0) {
            close(pfd[0]);
            for (int k = 0; k < n; k++)
                if (k != r)
                    close(lfd[k]);
            bench_child(o, algo, corrupt, r, addrs, lfd[r], pfd[1]);
        }
        close(pfd[1]);
        rfd[r] = pfd[0];
    }
    for (int r = 0; r < n; r++) {
        for (int s = 0; s < nsteps && rfd[r] >= 0; s++) {
            if (bench_size_for(o->coll, bench_step_bytes(o, s), n, o->dtype).bytes == 0)
                continue;
            bench_result *res = &out[(size_t)s * (size_t)n + (size_t)r];
            char *p = (char *)res;
            size_t left = sizeof *res;
            while (left) {
                ssize_t got = read(rfd[r], p, left);
                if (got < 0 && errno == EINTR)
                    continue;
                if (got <= 0)
                    break;
                p += got, left -= (size_t)got;
            }
            if (left) {
                memset(res, 0, sizeof *res);
                res->err = DSIM_EIO;
                snprintf(res->msg, sizeof res->msg, "the process of rank %d ended early", r);
            }
        }
    }
    for (int r = 0; r < n; r++) {
        int st;
        if (pid[r] > 0)
            while (waitpid(pid[r], &st, 0) < 0 && errno == EINTR)
                ;
    }
out:
    for (int r = 0; lfd && r < n; r++) {
        if (lfd[r] >= 0)
            close(lfd[r]);
        if (rfd && rfd[r] >= 0)
            close(rfd[r]);
    }
    free(lfd);
    free(port);
    free(rfd);
    free(pid);
    free(addrs);
    return rc;
}

/* --model 1: the cost model calibrated on this machine in this run
 * (sim/model/calibrate.h: per-message cost and link rate from a ping-pong
 * over this engine's transport, copy and reduction rates per core with every
 * core busy at each size, the cores) beside each measured allreduce time. */
static int bench_model(const bench_opts *o, const char *engine, const bench_row *rows,
                       const dsim_algo *used, int nrows)
{
    dsim_calib cal;
    dsim_calib_row *cr = calloc((size_t)(nrows ? nrows : 1), sizeof *cr);
    if (!cr || dsim_calib_measure(engine, o->ranks, &cal) != DSIM_OK) {
        fprintf(stderr, "%s: --model: could not calibrate the %s engine: %s\n", BENCH_PROG, engine,
                cr ? dsim_errmsg() : "out of memory");
        free(cr);
        return 1;
    }
    if (o->dtype != DSIM_F32)
        printf("# model: calibrated with float32 sums; this table is %s\n",
               dsim_dtype_name(o->dtype));
    for (int i = 0; i < nrows; i++)
        cr[i] = (dsim_calib_row){.algo = used[i], .bytes = rows[i].sz.count * sizeof(float)};
    if (dsim_calib_predict(&cal, cr, nrows) != DSIM_OK) {
        fprintf(stderr, "%s: --model: could not calibrate the %s engine: %s\n", BENCH_PROG, engine,
                dsim_errmsg());
        free(cr);
        return 1;
    }
    printf("# model: calibrated here (dsim calibrate --engine %s --ranks %d): ping-pong alpha "
           "%.2f us per message, link %.2f GB/s (fit); a ring exchange of 64 B over the %d ranks "
           "%.2f us; %d cores; per row, a ring exchange of the algorithm's message size (plain "
           "and combining receives) and the copy rate\n",
           cal.engine, o->ranks, cal.alpha_s * 1e6, cal.link_Bps / 1e9, o->ranks,
           cal.alpha_x_s * 1e6, cal.cores);
    printf("#  %10s  %-14s %12s %12s %8s %10s %12s %12s\n", "size", "algo", "measured_us",
           "model_us", "error", "msg", "xchg_us", "xchg_red_us");
    double abs_sum = 0;
    int n = 0;
    for (int i = 0; i < nrows; i++) {
        double m = cr[i].seconds;
        double err = rows[i].seconds > 0 ? (m - rows[i].seconds) / rows[i].seconds : NAN;
        printf("#  %10zu  %-14s %12.1f %12.1f %+7.0f%% %10zu %12.1f %12.1f\n", rows[i].sz.bytes,
               dsim_algo_name(used[i]), rows[i].seconds * 1e6, m * 1e6, 100 * err, cr[i].msg,
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
    if (rc != 0)
        return rc;
    if (!o.have_coll) {
        fprintf(stderr,
                "%s: name a collective: allreduce, reduce_scatter, allgather or broadcast "
                "(e.g. 'dsim bench allreduce -b 1M -e 64M')\n",
                BENCH_PROG);
        return 2;
    }
    dsim_algo algo;
    if (dsim_algo_parse(o.algo, &algo) != DSIM_OK) {
        fprintf(stderr,
                "%s: --algo '%s' is not an algorithm; accepted: auto, ring, rhd, tree, "
                "reduce_to_one\n",
                BENCH_PROG, o.algo);
        return 2;
    }
    if (algo != DSIM_ALGO_AUTO && o.coll != BENCH_ALLREDUCE) {
        fprintf(stderr, "%s: --algo '%s' applies to allreduce only; drop it for %s\n", BENCH_PROG,
                o.algo, bench_coll_name(o.coll));
        return 2;
    }
    if (o.root >= o.ranks) {
        fprintf(stderr, "%s: -r %d is not a rank of %d; accepted: 0 to %d\n", BENCH_PROG, o.root,
                o.ranks, o.ranks - 1);
        return 2;
    }
    if (strcmp(o.transport, "inproc") != 0 && strcmp(o.transport, "tcp") != 0) {
        fprintf(stderr, "%s: --transport '%s' is not a transport; accepted: inproc, tcp\n",
                BENCH_PROG, o.transport);
        return 2;
    }
    if (strcmp(o.engine, "processes") == 0) {
        if (strcmp(o.transport, "inproc") != 0 && strcmp(o.transport, "tcp") != 0)
            return 2; /* refused above */
        /* separate processes share no memory: they are joined by tcp */
        o.transport = "tcp";
    }
    if (o.model && (o.coll != BENCH_ALLREDUCE ||
                    (strcmp(o.engine, "threads") == 0 && strcmp(o.transport, "inproc") != 0))) {
        fprintf(stderr,
                "%s: --model 1 models allreduce on the threads engine over inproc and on the "
                "processes engine; drop it for %s over %s on %s\n",
                BENCH_PROG, bench_coll_name(o.coll), o.transport, o.engine);
        return 2;
    }
    int corrupt = -1;
    rc = bench_parse_corrupt(o.ranks, &corrupt);
    if (rc != 0)
        return rc;

    int nsteps = bench_nsteps(&o);
    double most = 0;
    for (int s = 0; s < nsteps; s++) {
        bench_size sz = bench_size_for(o.coll, bench_step_bytes(&o, s), o.ranks, o.dtype);
        double need = bench_mem_needed(&o, &sz);
        most = need > most ? need : most;
    }
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (phys > 0 && most > 0.75 * phys) {
        fprintf(stderr,
                "%s: -e %zu with --ranks %d needs %.1f GiB of buffers but this machine has "
                "%.1f GiB; lower -e or --ranks\n",
                BENCH_PROG, o.maxbytes, o.ranks, most / (1 << 30), phys / (1 << 30));
        return 2;
    }

    double copy_bw = bench_copy_bandwidth(BENCH_COPY_BYTES, 5);

    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    dsim_ep **eps = calloc((size_t)o.ranks, sizeof *eps);
    bench_result *res = calloc((size_t)o.ranks, sizeof *res);
    if (!eps || !res) {
        fprintf(stderr, "%s: out of memory for %d ranks\n", BENCH_PROG, o.ranks);
        free(eps);
        free(res);
        return 1;
    }
    rc = 1;
    /* processes: the ranks are forked before this process starts a thread */
    int procs = strcmp(o.engine, "processes") == 0;
    bench_result *pres = NULL;
    if (procs) {
        pres = calloc((size_t)nsteps * (size_t)o.ranks, sizeof *pres);
        if (!pres) {
            fprintf(stderr, "%s: out of memory for %d ranks\n", BENCH_PROG, o.ranks);
            goto out;
        }
        if (bench_processes(&o, algo, corrupt, pres) != 0)
            goto out;
    } else {
        dsim_err e = dsim_rt_create("threads", &rt);
        if (e != DSIM_OK) {
            fprintf(stderr, "%s: could not start the threads engine: %s\n", BENCH_PROG,
                    dsim_errmsg());
            goto out;
        }
        dsim_fabric_cfg fcfg = {.backend = o.transport, .nranks = o.ranks, .rt = rt};
        e = dsim_fabric_open(&fcfg, &fab);
        if (e != DSIM_OK) {
            fprintf(stderr, "%s: could not open the %s fabric: %s\n", BENCH_PROG, o.transport,
                    dsim_errmsg());
            goto out;
        }
        for (int r = 0; r < o.ranks; r++) {
            e = dsim_ep_open(fab, r, &eps[r]);
            if (e != DSIM_OK) {
                fprintf(stderr, "%s: could not open the endpoint of rank %d: %s\n", BENCH_PROG, r,
                        dsim_errmsg());
                goto out;
            }
        }
    }

    printf("# dsim bench %s: %d ranks, engine %s (one %s per rank, %ld CPUs online), "
           "transport %s, algo %s, fingerprints %s\n",
           bench_coll_name(o.coll), o.ranks, procs ? "processes" : dsim_rt_name(rt),
           procs ? "process" : "thread", sysconf(_SC_NPROCESSORS_ONLN),
           procs ? "tcp" : dsim_fabric_backend(fab),
           o.coll == BENCH_ALLREDUCE ? dsim_algo_name(algo) : "fixed (only allreduce has a choice)",
           o.fingerprint ? "on" : "off (--fingerprint 0)");
    bench_print_header(stdout, &o, copy_bw, BENCH_COPY_BYTES,
                       "the slowest rank's average per iteration; each rank times its -n "
                       "iterations from a dsim_barrier after the -w warm-ups");

    bench_job job = {.o = &o, .algo = algo, .eps = eps, .corrupt_rank = corrupt, .res = res};
    bench_row kept[64];
    dsim_algo kept_algo[64];
    int nkept = 0;
    uint64_t wrong = 0;
    double busbw_sum = 0;
    int rows = 0;
    char decided[1024] = "";
    size_t dlen = 0;
    rc = 0;
    for (int s = 0; s < nsteps && rc == 0; s++) {
        job.sz = bench_size_for(o.coll, bench_step_bytes(&o, s), o.ranks, o.dtype);
        if (job.sz.bytes == 0) {
            printf("# %zu B: too small for whole %s elements on %d ranks; skipped\n",
                   bench_step_bytes(&o, s), dsim_dtype_name(o.dtype), o.ranks);
            continue;
        }
        /* A fresh communicator id per step: no message of one step can be
         * matched by the next. */
        job.comm_id = (uint32_t)s + 1;
        bench_row row;
        memset(&row, 0, sizeof row);
        if (procs) {
            job.res = &pres[(size_t)s * (size_t)o.ranks];
            rc = bench_collect(&job, o.ranks, &row);
        } else {
            rc = bench_step(&job, rt, fab, &row);
        }
        if (rc != 0)
            break;
        bench_row_finish(&row, o.coll, o.ranks, copy_bw);
        bench_print_row(stdout, &row);
        if (nkept < 64) {
            kept[nkept] = row;
            kept_algo[nkept++] =
                algo == DSIM_ALGO_AUTO ? dsim_allreduce_decide(row.sz.bytes, o.ranks) : algo;
        }
        wrong += row.wrong;
        busbw_sum += row.busbw;
        rows++;
        if (o.coll == BENCH_ALLREDUCE && algo == DSIM_ALGO_AUTO && dlen < sizeof decided - 64)
            dlen += (size_t)snprintf(decided + dlen, sizeof decided - dlen, " %zu:%s", row.sz.bytes,
                                     dsim_algo_name(dsim_allreduce_decide(row.sz.bytes, o.ranks)));
    }
    if (rc == 0) {
        bench_print_footer(stdout, wrong, o.check, rows ? busbw_sum / rows : 0.0);
        if (dlen)
            printf("# algo auto chose (bytes:algo):%s\n", decided);
        if (wrong) {
            fprintf(stderr, "%s: %" PRIu64 " wrong elements; the collective's results are wrong\n",
                    BENCH_PROG, wrong);
            rc = 1;
        }
    }
    if (rc == 0 && o.model)
        rc = bench_model(&o, o.engine, kept, kept_algo, nkept);

out:
    free(pres);
    for (int r = 0; r < o.ranks; r++)
        if (eps[r])
            dsim_ep_close(eps[r]);
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    free(eps);
    free(res);
    return rc;
}

void cmd_bench_help(FILE *out)
{
    fprintf(out, "usage: dsim bench allreduce|reduce_scatter|allgather|broadcast [flags]\n"
                 "       dsim bench model [flags]   (the models' compute: dsim bench model "
                 "--help)\n"
                 "\n"
                 "Times one collective over --ranks ranks, each a worker thread of the threads\n"
                 "engine on an inproc fabric (--transport tcp: sockets over 127.0.0.1 instead),\n"
                 "and prints nccl-tests' columns: size, count, type, redop, time, algbw, busbw\n"
                 "(GB = 1e9 B), #wrong, plus %%bound: how close the time is to reading every\n"
                 "rank's input once and writing its output once at this machine's memcpy\n"
                 "bandwidth (measured at start-up and printed in the header).\n"
                 "For reduce_scatter and allgather the size is the full buffer of all ranks'\n"
                 "blocks, as in nccl-tests.\n"
                 "\n"
                 "flags:\n");
    bench_flags_help(out, BENCH_FLAG_DSIM);
    fprintf(out, "\n"
                 "Exit status: 0 all results right, 1 a wrong result or a failed collective,\n"
                 "2 bad flags.\n"
                 "Testing: DSIM_BENCH_CORRUPT=<rank> flips a bit of that rank's output before the\n"
                 "check, to show the check catches it.\n");
}
