/* Calibrating the cost model to this machine (calibrate.h): ping-pong over
 * the engine's transport, copy and reduction rates with every core busy,
 * the least-squares fit of alpha and beta. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsim/comm.h"
#include "dsim/reduce.h"
#include "dsim/rt.h"
#include "dsim/spi/rt.h"
#include "dsim/transport.h"
#include "engine/engine.h"
#include "model/calibrate.h"
#include "model/cost_int.h"

#define CAL_COMM       0xca1bu
#define CAL_TIMEOUT_NS 30000000000LL

static double cal_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cal_dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double cal_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cal_dbl_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

dsim_err dsim_calib_fit_ab(const double *x, const double *t, int n, double *alpha, double *beta)
{
    double S = 0, Sx = 0, Sy = 0, Sxx = 0, Sxy = 0;
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        if (!(t[i] > 0) || !(x[i] >= 0) || !isfinite(t[i]))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "calibration fit: point %d (%g B, %g s) needs a time > 0 and a size "
                            ">= 0; drop it or measure again",
                            i, x[i], t[i]);
        if (i > 0 && x[i] != x[0])
            distinct = 1;
        double w = 1.0 / (t[i] * t[i]);
        S += w, Sx += w * x[i], Sy += w * t[i], Sxx += w * x[i] * x[i], Sxy += w * x[i] * t[i];
    }
    if (n < 2 || !distinct)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "calibration fit: %d point(s) of one size cannot give both alpha and "
                        "beta; measure at two sizes or more",
                        n);
    double b = (S * Sxy - Sx * Sy) / (S * Sxx - Sx * Sx), a = (Sy - b * Sx) / S;
    /* A negative intercept or slope is noise, not physics: refit the other
     * term alone. */
    if (a < 0)
        a = 0, b = Sxy / Sxx;
    if (b < 0)
        b = 0, a = Sy / S;
    *alpha = a;
    *beta = b;
    return DSIM_OK;
}

/* ---- ping-pong and ring exchange ---- */

enum { CAL_PINGPONG, CAL_EXCHANGE, CAL_EXCHANGE_REDUCE, CAL_CALL };

typedef struct cal_pp {
    dsim_ep *ep;
    int rank, nranks, mode;
    const size_t *sizes;
    int n, iters, reps;
    /* set: every exchange replays this pattern's steps (an algorithm's
     * schedule), each transfer a message of the size at hand */
    const dsim_cost_pattern *pat;
    int in_max;   /* the most transfers into one rank in one step */
    int io_max;   /* the most into and out of one rank in one step */
    int span;     /* a replay's messages move through span x their size */
    double *secs; /* rank 0 fills it */
    char *buf, *buf2;
    dsim_req **reqs; /* a replay's step: io_max, at least 2 */
    dsim_algo algo;  /* CAL_CALL: the all-reduce's algorithm */
    dsim_comm *comm; /* CAL_CALL: the ranks' communicator */
    dsim_err err;
} cal_pp;

/* One replay of p->pat: in each step a rank posts a receive (combining in
 * CAL_EXCHANGE_REDUCE) from every rank that sends to it and sends to every
 * rank it sends to, then waits for them all before the next step, as the
 * algorithm's own steps do. Receives of one step land in slices of buf2. */
static dsim_err cal_replay(cal_pp *p, size_t len, uint32_t tag, int64_t dl)
{
    const dsim_cost_pattern *pt = p->pat;
    dsim_req **q = p->reqs;
    dsim_err e = DSIM_OK;
    size_t span = p->span > 1 ? (size_t)p->span : 1, nin = p->in_max > 1 ? (size_t)p->in_max : 1;
    for (int k = 0; k < pt->steps && e == DSIM_OK; k++) {
        uint32_t t = tag * (uint32_t)pt->steps + (uint32_t)k;
        /* each step's messages at the next place of the span, as an
         * algorithm's blocks lie side by side in its buffers */
        size_t w = (size_t)t % span;
        int nq = 0, in = 0;
        for (int i = pt->off[k]; i < pt->off[k + 1] && e == DSIM_OK; i++) {
            if (pt->dst[i] != p->rank)
                continue;
            char *at = p->buf2 + (w * nin + (size_t)in++) * len;
            e = p->mode == CAL_EXCHANGE_REDUCE
                    ? dsim_irecv_reduce(p->ep, pt->src[i], CAL_COMM, t, at, len / sizeof(float),
                                        DSIM_F32, DSIM_SUM, &q[nq])
                    : dsim_irecv(p->ep, pt->src[i], CAL_COMM, t, at, len, &q[nq]);
            nq += e == DSIM_OK;
        }
        for (int i = pt->off[k]; i < pt->off[k + 1] && e == DSIM_OK; i++) {
            if (pt->src[i] != p->rank)
                continue;
            e = dsim_isend(p->ep, pt->dst[i], CAL_COMM, t, p->buf + w * len, len, &q[nq]);
            nq += e == DSIM_OK;
        }
        if (e != DSIM_OK) {
            for (int i = 0; i < nq; i++)
                dsim_req_cancel(q[i]);
            return e;
        }
        if (nq)
            e = dsim_waitall(q, nq, dl, NULL);
    }
    return e;
}

static dsim_err cal_xchg(cal_pp *p, size_t len, uint32_t tag)
{
    dsim_rt *rt = dsim_ep_rt(p->ep);
    int64_t dl = dsim_rt_deadline(rt, CAL_TIMEOUT_NS);
    dsim_req *q[2] = {NULL, NULL};
    if (p->pat)
        return cal_replay(p, len, tag, dl);
    if (p->mode == CAL_CALL) /* the library's own call, with all it does around the steps */
        return dsim_allreduce_with(p->comm, p->buf, p->buf2, len / sizeof(float), DSIM_F32,
                                   DSIM_SUM, p->algo);
    if (p->mode != CAL_PINGPONG) {
        /* every rank receives from its left and sends to its right at once,
         * as a step of a ring does */
        int left = (p->rank + p->nranks - 1) % p->nranks, right = (p->rank + 1) % p->nranks;
        if (p->mode == CAL_EXCHANGE_REDUCE)
            DSIM_CHECK(dsim_irecv_reduce(p->ep, left, CAL_COMM, tag, p->buf2, len / sizeof(float),
                                         DSIM_F32, DSIM_SUM, &q[0]));
        else
            DSIM_CHECK(dsim_irecv(p->ep, left, CAL_COMM, tag, p->buf2, len, &q[0]));
        dsim_err e = dsim_isend(p->ep, right, CAL_COMM, tag, p->buf, len, &q[1]);
        if (e != DSIM_OK) {
            dsim_req_cancel(q[0]);
            return e;
        }
        return dsim_waitall(q, 2, dl, NULL);
    }
    int peer = 1 - p->rank;
    if (p->rank == 0) {
        DSIM_CHECK(dsim_isend(p->ep, peer, CAL_COMM, tag, p->buf, len, &q[0]));
        DSIM_CHECK(dsim_wait(q[0], dl, NULL));
        DSIM_CHECK(dsim_irecv(p->ep, peer, CAL_COMM, tag, p->buf, len, &q[0]));
        return dsim_wait(q[0], dl, NULL);
    }
    DSIM_CHECK(dsim_irecv(p->ep, peer, CAL_COMM, tag, p->buf, len, &q[0]));
    DSIM_CHECK(dsim_wait(q[0], dl, NULL));
    DSIM_CHECK(dsim_isend(p->ep, peer, CAL_COMM, tag, p->buf, len, &q[0]));
    return dsim_wait(q[0], dl, NULL);
}

static void cal_pp_main(void *arg)
{
    cal_pp *p = arg;
    double *batch = calloc((size_t)p->reps, sizeof *batch);
    uint32_t tag = 0;
    p->err = batch ? DSIM_OK : DSIM_ENOMEM;
    for (int s = 0; s < p->n && p->err == DSIM_OK; s++) {
        for (int w = 0; w < 3 && p->err == DSIM_OK; w++)
            p->err = cal_xchg(p, p->sizes[s], tag++);
        for (int r = 0; r < p->reps && p->err == DSIM_OK; r++) {
            double t0 = cal_now();
            for (int i = 0; i < p->iters && p->err == DSIM_OK; i++)
                p->err = cal_xchg(p, p->sizes[s], tag++);
            /* a ping-pong's time is a round trip: half of it is one message */
            batch[r] = (cal_now() - t0) / ((p->mode == CAL_PINGPONG ? 2.0 : 1.0) * p->iters);
        }
        if (p->rank == 0 && p->err == DSIM_OK)
            p->secs[s] = cal_median(batch, p->reps);
    }
    if (p->err != DSIM_OK) {
        char why[200];
        snprintf(why, sizeof why, "rank %d's calibration exchange failed: %s", p->rank,
                 dsim_errmsg());
        dsim_ep_abort(p->ep, (p->rank + 1) % p->nranks, why);
    }
    free(batch);
}

static size_t cal_max_size(const size_t *sizes, int n)
{
    size_t m = 1;
    for (int i = 0; i < n; i++)
        m = sizes[i] > m ? sizes[i] : m;
    return m;
}

static dsim_err cal_bufs(cal_pp *p, size_t cap)
{
    size_t in = p->in_max > 1 ? (size_t)p->in_max : 1, span = p->span > 1 ? (size_t)p->span : 1;
    if (cap > SIZE_MAX / span / in)
        return DSIM_ERR(DSIM_ENOMEM, -1, "calibration: %zu B messages x %zu x %zu overflow", cap,
                        span, in);
    cap *= span;
    /* as a job's own buffers (replica.c): from 2 MiB up on huge pages,
     * which a peer over shm reads faster */
    p->buf = dsim_buf_alloc(cap);
    p->buf2 = dsim_buf_alloc(cap * in);
    p->reqs = calloc(p->io_max > 2 ? (size_t)p->io_max : 2, sizeof *p->reqs);
    if (!p->buf || !p->buf2 || !p->reqs)
        return DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory for %zu B messages", cap);
    /* small floats: a sum of them stays finite however often it is taken */
    for (size_t i = 0; i + sizeof(float) <= cap * in; i += sizeof(float)) {
        float v = 1.0f / 1024;
        if (i < cap)
            memcpy(p->buf + i, &v, sizeof v);
        memcpy(p->buf2 + i, &v, sizeof v);
    }
    return DSIM_OK;
}

/* What a rank hands back: its error, and rank 0 its times. */
typedef struct cal_out {
    dsim_err err;
    double secs[];
} cal_out;

/* The engine's rank_main: one rank of the ping-pong or the exchange. */
static void cal_rank_main(dsim_ep *ep, int rank, int round, void *result, void *user)
{
    (void)round;
    const cal_pp *tmpl = user;
    cal_out *out = result;
    cal_pp p = *tmpl;
    p.rank = rank;
    p.ep = ep;
    p.buf = p.buf2 = NULL;
    p.reqs = NULL;
    p.secs = out->secs;
    p.comm = NULL;
    p.err = cal_bufs(&p, cal_max_size(p.sizes, p.n));
    if (p.err == DSIM_OK && p.mode == CAL_CALL) {
        dsim_comm_cfg cc = {.ep = ep,
                            .size = p.nranks,
                            .comm_id = CAL_COMM + 1,
                            .timeout_ns = CAL_TIMEOUT_NS,
                            .algo = p.algo};
        p.err = dsim_comm_create(&cc, &p.comm);
    }
    if (p.err == DSIM_OK)
        cal_pp_main(&p);
    else
        dsim_ep_abort(ep, (rank + 1) % p.nranks, "a calibration rank could not begin");
    out->err = p.err;
    dsim_comm_destroy(p.comm);
    free(p.buf);
    free(p.buf2);
    free(p.reqs);
}

/* The engine's on_round: the first rank's error, else rank 0's times. */
static int cal_on_round(int round, const void *results, void *user)
{
    (void)round;
    cal_pp *tmpl = user;
    size_t rs = sizeof(cal_out) + (size_t)tmpl->n * sizeof(double);
    tmpl->err = DSIM_OK;
    for (int r = 0; r < tmpl->nranks && tmpl->err == DSIM_OK; r++) {
        const cal_out *o = (const cal_out *)(const void *)((const char *)results + (size_t)r * rs);
        if (o->err != DSIM_OK) {
            tmpl->err = o->err;
            tmpl->rank = r;
        }
    }
    if (tmpl->err == DSIM_OK)
        memcpy(tmpl->secs, ((const cal_out *)results)->secs, (size_t)tmpl->n * sizeof(double));
    return 0;
}

const char *dsim_calib_transport(const dsim_engine_ops *eng)
{
    /* each engine's default: inproc in one address space, shm between the
     * processes of one host */
    return eng->flags & DSIM_ENGINE_INPROC ? "inproc" : "shm";
}

/* The ranks of tmpl on the engine's rank program (sim/engine/engine.h),
 * over the transport its calibration measures. */
static dsim_err cal_run(const char *engine, cal_pp *tmpl)
{
    if (!engine || !tmpl->sizes || !tmpl->secs || tmpl->n < 1 || tmpl->iters < 1 ||
        tmpl->reps < 1 || tmpl->nranks < 2)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "calibration: an engine, >= 2 ranks, >= 1 size, iters and reps >= 1 "
                        "needed");
    for (int i = 0; i < tmpl->n; i++)
        if (tmpl->sizes[i] < sizeof(float) || tmpl->sizes[i] % sizeof(float))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "calibration: %zu B is not a whole number of float32 elements",
                            tmpl->sizes[i]);
    const dsim_engine_ops *eng;
    if (dsim_engine_find(engine, &eng) != DSIM_OK || !eng->ranks) {
        char names[160];
        return DSIM_ERR(DSIM_EINVAL, -1, "calibration: engine '%s' is not calibrated; accepted: %s",
                        engine, dsim_engine_names(0, true, names, sizeof names));
    }
    dsim_engine_ranks job = {
        .nranks = tmpl->nranks,
        .transport = dsim_calib_transport(eng),
        .rounds = 1,
        .rank_main = cal_rank_main,
        .user = tmpl,
        .result_size = sizeof(cal_out) + (size_t)tmpl->n * sizeof(double),
        .on_round = cal_on_round,
    };
    tmpl->err = DSIM_ENOMEM; /* until a round is reported */
    /* every measurement as a fresh process would find the waits, not as
     * the measurement before left them (dsim_rt_spin_reset) */
    dsim_rt_spin_reset();
    dsim_err e = eng->ranks(&job);
    if (e != DSIM_OK)
        return DSIM_ERR(e, -1, "calibration on the %s engine: %s", eng->name, dsim_strerror(e));
    if (tmpl->err != DSIM_OK)
        return DSIM_ERR(tmpl->err, tmpl->rank, "calibration: rank %d of the %s engine failed (%s)",
                        tmpl->rank, eng->name, dsim_strerror(tmpl->err));
    return DSIM_OK;
}

dsim_err dsim_calib_pingpong(const char *engine, const size_t *sizes, int n, int iters, int reps,
                             double *secs)
{
    cal_pp t = {.nranks = 2,
                .mode = CAL_PINGPONG,
                .sizes = sizes,
                .n = n,
                .iters = iters,
                .reps = reps,
                .secs = secs};
    return cal_run(engine, &t);
}

dsim_err dsim_calib_exchange(const char *engine, int ranks, int reduce, const size_t *sizes, int n,
                             int iters, int reps, double *secs)
{
    return dsim_calib_exchange_pattern(engine, ranks, reduce, NULL, 1, sizes, n, iters, reps, secs);
}

dsim_err dsim_calib_exchange_pattern(const char *engine, int ranks, int reduce,
                                     const dsim_cost_pattern *pat, int span, const size_t *sizes,
                                     int n, int iters, int reps, double *secs)
{
    if (span < 1 || span > 1024)
        return DSIM_ERR(DSIM_EINVAL, -1, "calibration: a span of %d messages; 1 to 1024", span);
    cal_pp t = {.nranks = ranks,
                .pat = pat,
                .span = span,
                .mode = reduce ? CAL_EXCHANGE_REDUCE : CAL_EXCHANGE,
                .sizes = sizes,
                .n = n,
                .iters = iters,
                .reps = reps,
                .secs = secs};
    if (pat) {
        if (pat->steps < 1 || pat->steps > (1 << 16))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "calibration: a pattern of %d steps; 1 to %d can be replayed",
                            pat->steps, 1 << 16);
        int *in = calloc(2 * (size_t)ranks, sizeof *in);
        if (!in)
            return DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory");
        int *io = in + ranks;
        for (int k = 0; k < pat->steps; k++) {
            memset(in, 0, 2 * (size_t)ranks * sizeof *in);
            for (int i = pat->off[k]; i < pat->off[k + 1]; i++) {
                if (pat->src[i] < 0 || pat->src[i] >= ranks || pat->dst[i] < 0 ||
                    pat->dst[i] >= ranks || pat->src[i] == pat->dst[i]) {
                    free(in);
                    return DSIM_ERR(DSIM_EINVAL, -1,
                                    "calibration: the pattern's step %d sends %d -> %d, not "
                                    "between two of the %d ranks",
                                    k, pat->src[i], pat->dst[i], ranks);
                }
                if (++in[pat->dst[i]] > t.in_max)
                    t.in_max = in[pat->dst[i]];
                if (++io[pat->dst[i]] > t.io_max)
                    t.io_max = io[pat->dst[i]];
                if (++io[pat->src[i]] > t.io_max)
                    t.io_max = io[pat->src[i]];
            }
        }
        free(in);
    }
    return cal_run(engine, &t);
}

dsim_err dsim_calib_call(const char *engine, int ranks, dsim_algo algo, size_t bytes, int iters,
                         int reps, double *secs)
{
    cal_pp t = {.nranks = ranks,
                .mode = CAL_CALL,
                .algo = algo,
                .sizes = &bytes,
                .n = 1,
                .iters = iters,
                .reps = reps,
                .secs = secs};
    return cal_run(engine, &t);
}

/* ---- copy and reduction rates ---- */

typedef struct cal_rate {
    atomic_int *start; /* 1: go; every thread starts together */
    int reduce, loops;
    size_t n; /* floats */
    float *a, *b;
    double secs;
} cal_rate;

static void *cal_rate_main(void *arg)
{
    cal_rate *c = arg;
    while (!atomic_load(c->start))
        ;
    double t0 = cal_now();
    for (int i = 0; i < c->loops; i++) {
        if (c->reduce)
            dsim_reduce_local(c->b, c->a, c->n, DSIM_F32, DSIM_SUM);
        else
            memcpy(c->b, c->a, c->n * sizeof(float));
        c->a[i % c->n] = c->b[(size_t)i % c->n]; /* keep every pass */
    }
    c->secs = cal_now() - t0;
    return NULL;
}

/* The per-core rate, median of 5 runs of the mean over cores. */
static double cal_rate_of(int cores, size_t bytes, int reduce)
{
    size_t n = bytes / sizeof(float) ? bytes / sizeof(float) : 1;
    /* enough passes for a run of >= 64 MiB per core: timer noise stays far
     * below the rate */
    int loops = (int)(((size_t)64 << 20) / (n * sizeof(float)));
    loops = loops < 1 ? 1 : loops;
    cal_rate *c = calloc((size_t)cores, sizeof *c);
    pthread_t *th = calloc((size_t)cores, sizeof *th);
    atomic_int go;
    double runs[5];
    int ok = c && th, nruns = 0;
    for (int k = 0; ok && k < cores; k++) {
        c[k] = (cal_rate){.start = &go,
                          .reduce = reduce,
                          .loops = loops,
                          .n = n,
                          .a = calloc(n, sizeof(float)),
                          .b = calloc(n, sizeof(float))};
        ok = c[k].a && c[k].b;
    }
    for (int rep = 0; ok && rep < 5; rep++) {
        int started = 0;
        atomic_store(&go, 0);
        for (int k = 0; k < cores && ok; k++) {
            ok = pthread_create(&th[k], NULL, cal_rate_main, &c[k]) == 0;
            started += ok;
        }
        atomic_store(&go, 1); /* also when one failed to start: the others end */
        for (int k = 0; k < started; k++)
            pthread_join(th[k], NULL);
        if (!ok)
            break;
        double sum = 0;
        for (int k = 0; k < cores; k++)
            sum += c[k].secs;
        runs[nruns++] = (double)loops * (double)(n * sizeof(float)) / (sum / cores);
    }
    for (int k = 0; c && k < cores; k++) {
        free(c[k].a);
        free(c[k].b);
    }
    free(c);
    free(th);
    return ok && nruns ? cal_median(runs, nruns) : 0;
}

dsim_err dsim_calib_rates(int cores, size_t bytes, double *copy_Bps, double *reduce_Bps)
{
    if (cores < 1 || bytes < sizeof(float))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "calibration rates: >= 1 core and >= 4 bytes needed (got %d, %zu)", cores,
                        bytes);
    *copy_Bps = cal_rate_of(cores, bytes, 0);
    *reduce_Bps = cal_rate_of(cores, bytes, 1);
    if (*copy_Bps <= 0 || *reduce_Bps <= 0)
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "calibration rates: could not start %d threads with %zu B buffers each",
                        cores, bytes);
    return DSIM_OK;
}

/* ---- the model ---- */

size_t dsim_calib_rate_bytes(int ranks, int cores, size_t bytes)
{
    double b = (double)bytes * (ranks > 0 ? ranks : 1) / (cores > 0 ? cores : 1);
    size_t lo = 4096, hi = (size_t)256 << 20;
    return b < (double)lo ? lo : b > (double)hi ? hi : (size_t)b;
}

dsim_err dsim_calib_measure(const char *engine, int ranks, dsim_calib *out)
{
    static const size_t sizes[] = {64, 4096, 65536, 1 << 20, 4 << 20};
    enum { N = sizeof sizes / sizeof sizes[0] };
    double secs[N], x[N];
    memset(out, 0, sizeof *out);
    if (ranks < 2)
        return DSIM_ERR(DSIM_EINVAL, -1, "calibration: %d ranks; an all-reduce needs >= 2", ranks);
    DSIM_CHECK(dsim_calib_pingpong(engine, sizes, N, 50, 5, secs));
    for (int i = 0; i < N; i++)
        x[i] = (double)sizes[i];
    double a = 0, b = 0;
    DSIM_CHECK(dsim_calib_fit_ab(x, secs, N, &a, &b));
    double ax = 0;
    DSIM_CHECK(dsim_calib_exchange(engine, ranks, 0, sizes, 1, 200, 5, &ax));
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    const dsim_engine_ops *eng;
    DSIM_CHECK(dsim_engine_find(engine, &eng));
    *out = (dsim_calib){.engine = eng->name,
                        .transport = dsim_calib_transport(eng),
                        .cores = nc > 0 ? (int)nc : 1,
                        .ranks = ranks,
                        .alpha_s = a,
                        .link_Bps = b > 0 ? 1.0 / b : 0,
                        .pp_small_s = secs[0],
                        .alpha_x_s = ax};
    return DSIM_OK;
}

size_t dsim_calib_msg_bytes(dsim_algo algo, int ranks, size_t bytes)
{
    /* AUTO, not an algorithm of its own: the whole buffer */
    const dsim_algo_cost *cost = dsim_algo_cost_of(algo);
    size_t elems = bytes / sizeof(float);
    size_t m = cost && ranks > 0 ? cost->msg_elems(elems, ranks) : elems;
    return (m ? m : 1) * sizeof(float);
}

void dsim_calib_pattern_turns(const dsim_cost_pattern *pt, int cores, double *kcopy, double *kred)
{
    /* the evaluator (costmodel.c) on a machine of `cores` cores: a step of
     * n transfers of one size lasts alpha + (one transfer) x max(1, n /
     * cores) when they copy; when they combine on arrival, the rank that
     * receives most combines them one after another */
    double c = cores > 0 ? cores : 1;
    *kcopy = *kred = 0;
    for (int k = 0; k < pt->steps; k++) {
        int n = pt->off[k + 1] - pt->off[k], in_max = 0;
        for (int i = pt->off[k]; i < pt->off[k + 1]; i++) {
            int in = 0;
            for (int j = pt->off[k]; j < pt->off[k + 1]; j++)
                in += pt->dst[j] == pt->dst[i];
            in_max = in > in_max ? in : in_max;
        }
        double share = n / c;
        *kcopy += share > 1 ? share : 1;
        *kred += share > in_max ? share : in_max;
    }
}

void dsim_calib_fit_pattern(const dsim_cost_pattern *pt, int cores, double alpha, double t_copy,
                            double t_reduce, double *move_s, double *red_s)
{
    double kc, kr, lat = alpha * pt->steps;
    dsim_calib_pattern_turns(pt, cores, &kc, &kr);
    /* a replay no longer than its latency (noise) still gets a rate */
    *move_s = (t_copy > lat ? t_copy - lat : t_copy * 1e-3) / (kc > 0 ? kc : 1);
    *red_s = (t_reduce > lat ? t_reduce - lat : t_reduce * 1e-3) / (kr > 0 ? kr : 1);
}

void dsim_calib_topology(const dsim_calib *c, double alpha, size_t msg, double move_s, double red_s,
                         dsim_topology *t)
{
    dsim_link_model l = {c->transport, "this machine, calibrated", alpha, (double)msg / move_s,
                         "dsim calibrate"};
    dsim_device_model d = {"cpu", "this machine, calibrated", 1,
                           1,     3.0 * (double)msg / red_s,  "dsim calibrate"};
    *t = (dsim_topology){.hosts = 1,
                         .devices_per_host = c->ranks,
                         .intra = l,
                         .inter = l,
                         .device = d,
                         .cores = c->cores,
                         .fused_reduce = true};
}

/* Bytes an algorithm copies locally, sendbuf into recvbuf (or scratch), on
 * all ranks together, out of place: not a transfer, so not in the
 * schedule, yet CPU time all the same (each algorithm's in algo_cost.c). */
double dsim_calib_local_copy(dsim_algo algo, int p, double n, int *serial)
{
    const dsim_algo_cost *cost = dsim_algo_cost_of(algo);
    *serial = 0;
    if (p <= 1 || !cost)
        return 0;
    return cost->local_copy(p, n, serial);
}

/* The size of the library's call a row is anchored to: 64 B, a float a
 * rank at least. */
static size_t cal_call_bytes(const dsim_calib *c)
{
    size_t b = (size_t)c->ranks * sizeof(float);
    return b > 64 ? b : 64;
}

dsim_err dsim_calib_predict_at(const dsim_calib *c, dsim_algo algo, size_t bytes,
                               const dsim_calib_row *at, double *seconds)
{
    dsim_topology t;
    /* the latency of the row's own pattern, else the ring's */
    double alpha = at->alpha_s > 0 ? at->alpha_s : c->alpha_x_s;
    if (!(at->move_s > 0) || !(at->red_s > 0) || at->msg == 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "calibration: the row of %zu B (%s) has no fitted rates (msg %zu B, "
                        "move %g s, combine %g s)",
                        bytes, dsim_algo_name(algo), at->msg, at->move_s, at->red_s);
    if (bytes < cal_call_bytes(c) && at->call_measured_s > 0) {
        /* a few elements: the call, measured at this size */
        *seconds = at->call_measured_s;
        return DSIM_OK;
    }
    dsim_calib_topology(c, alpha, at->msg, at->move_s, at->red_s, &t);
    DSIM_CHECK(dsim_cost_allreduce(&t, algo, bytes, sizeof(float), seconds, NULL));
    /* anchored to the library's call at the smallest size */
    *seconds += at->call_s;
    int serial = 0, P = c->ranks;
    double local = dsim_calib_local_copy(algo, P, (double)bytes, &serial);
    int par = P < c->cores ? P : c->cores;
    if (local > 0 && at->copy_Bps > 0)
        *seconds +=
            serial ? (double)bytes / at->copy_Bps : local / (at->copy_Bps * (par > 0 ? par : 1));
    /* never below the call measured at the smallest size */
    if (*seconds < at->call_measured_s)
        *seconds = at->call_measured_s;
    return DSIM_OK;
}

/* How many replays of a pattern at messages of msg bytes make a batch. */
static int cal_replays(size_t msg)
{
    return msg >= ((size_t)4 << 20)   ? 5
           : msg >= ((size_t)1 << 20) ? 20
           : msg >= ((size_t)1 << 18) ? 50
           : msg >= ((size_t)1 << 16) ? 100
                                      : 200;
}

/* The library's own all-reduce of every row's algorithm at 64 B, and at a
 * row's own size where that is smaller, into call_measured_s: a replay's latency
 * is its pattern's, every transfer sent; the library's call does what a
 * call does besides (the communicator's bookkeeping, the fingerprint, the
 * local copy) and skips what it need not (the empty blocks of a ring of a
 * few elements). Each row is anchored to it (dsim_calib_row.call_s).
 * Measured before any replay: after one of megabytes, whose steps hold a
 * core for milliseconds, a waiter's yield comes back that much later and
 * the process's waits sleep at once for a while (dsim_rt_spin_look's calm
 * window), and a call of 64 B took 60-80 us instead of 6. */
static dsim_err cal_calls(const dsim_calib *c, dsim_calib_row *rows, int n)
{
    size_t cb = cal_call_bytes(c);
    for (int i = 0; i < n; i++) {
        /* an algorithm or a size measured for a row before: not again */
        int same = -1;
        for (int k = 0; k < i; k++)
            if (rows[k].algo == rows[i].algo &&
                (rows[k].bytes == rows[i].bytes || (rows[k].bytes >= cb && rows[i].bytes >= cb)))
                same = k;
        if (same >= 0) {
            rows[i].call_measured_s = rows[same].call_measured_s;
            continue;
        }
        size_t at = rows[i].bytes < cb ? rows[i].bytes : cb;
        DSIM_CHECK(dsim_calib_call(c->engine, c->ranks, rows[i].algo, at, cal_replays(at), 5,
                                   &rows[i].call_measured_s));
    }
    return DSIM_OK;
}

/* Replays algo's pattern (plain, then combining) at 64 B and at every
 * message size of its rows, and fits each of those rows. */
static dsim_err cal_fit_algo(const dsim_calib *c, dsim_algo algo, dsim_calib_row *rows, int n)
{
    dsim_cost_pattern pt;
    DSIM_CHECK(dsim_cost_pattern_of(algo, c->ranks, &pt));
    size_t *sz = calloc((size_t)n + 1, sizeof *sz);
    double *tx = calloc((size_t)n + 1, sizeof *tx), *tr = calloc((size_t)n + 1, sizeof *tr);
    dsim_err e = DSIM_OK;
    if (!sz || !tx || !tr)
        e = DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory");
    int ns = 0;
    if (e == DSIM_OK)
        sz[ns++] = 64;
    for (int i = 0; i < n && e == DSIM_OK; i++) {
        if (rows[i].algo != algo)
            continue;
        int j = 0;
        while (j < ns && sz[j] != rows[i].msg)
            j++;
        if (j == ns)
            sz[ns++] = rows[i].msg;
    }
    /* a ring's messages move through as much memory as the all-reduce's
     * buffer (its p blocks in turn), so that the replay meets the caches and
     * the memory traffic the algorithm does */
    int span = 1;
    const dsim_algo_cost *cost = dsim_algo_cost_of(algo);
    for (int i = 0; cost && cost->walks_buffer && i < n; i++)
        if (rows[i].algo == algo && rows[i].msg > 0) {
            double r = ceil((double)rows[i].bytes / (double)rows[i].msg);
            span = r > span ? (r < 1024 ? (int)r : 1024) : span;
        }
    /* smallest first, then each class of sizes with its own count of
     * replays (cal_replays): fewer for large messages, whose time is long
     * enough to read; many for small ones, so that a batch lasts long
     * enough (milliseconds, beyond the first touches of its memory) for the
     * ranks' turns on the cores to even out within it */
    for (int i = 1; i < ns; i++)
        for (int j = i; j > 0 && sz[j - 1] > sz[j]; j--) {
            size_t t = sz[j];
            sz[j] = sz[j - 1];
            sz[j - 1] = t;
        }
    for (int lo = 0, hi; lo < ns && e == DSIM_OK; lo = hi) {
        int iters = cal_replays(sz[lo]);
        for (hi = lo + 1; hi < ns && cal_replays(sz[hi]) == iters; hi++)
            ;
        e = dsim_calib_exchange_pattern(c->engine, c->ranks, 0, &pt, span, sz + lo, hi - lo, iters,
                                        5, tx + lo);
        if (e == DSIM_OK)
            e = dsim_calib_exchange_pattern(c->engine, c->ranks, 1, &pt, span, sz + lo, hi - lo,
                                            iters, 5, tr + lo);
    }
    for (int i = 0; i < n && e == DSIM_OK; i++) {
        if (rows[i].algo != algo)
            continue;
        int j = 0;
        while (sz[j] != rows[i].msg)
            j++;
        int j64 = 0;
        while (sz[j64] != 64)
            j64++;
        /* a call that takes less than the replay (noise between two
         * measurements of a few microseconds) does not take the larger
         * sizes down; a row below 64 B is its call (dsim_calib_predict_at) */
        double call = rows[i].call_measured_s;
        rows[i].call_s = rows[i].bytes >= cal_call_bytes(c) && call > tx[j64] ? call - tx[j64] : 0;
        rows[i].steps = pt.steps;
        rows[i].alpha_s = tx[j64] / pt.steps;
        rows[i].step_copy_s = tx[j] / pt.steps;
        rows[i].step_reduce_s = tr[j] / pt.steps;
        dsim_calib_fit_pattern(&pt, c->cores, rows[i].alpha_s, tx[j], tr[j], &rows[i].move_s,
                               &rows[i].red_s);
    }
    free(sz);
    free(tx);
    free(tr);
    dsim_cost_pattern_free(&pt);
    return e;
}

dsim_err dsim_calib_predict(const dsim_calib *c, dsim_calib_row *rows, int n)
{
    for (int i = 0; i < n; i++) {
        if (rows[i].bytes < sizeof(float) || rows[i].bytes % sizeof(float) ||
            !dsim_algo_cost_of(rows[i].algo)) {
            char names[256];
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "calibration: row %d: %zu B with algorithm %s; whole float32 "
                            "elements and %s needed",
                            i, rows[i].bytes, dsim_algo_name(rows[i].algo),
                            dsim_algo_list(names, sizeof names, 0, ", ", " or "));
        }
        rows[i].msg = dsim_calib_msg_bytes(rows[i].algo, c->ranks, rows[i].bytes);
        rows[i].steps = 0;
    }
    /* every row is fitted to its own algorithm's pattern (who sends to whom
     * in each of its steps, costmodel.h), replayed on the engine: at 64 B
     * for the latency of one of its steps, at the row's message size for
     * its copy and combine rates. What P ranks on this machine's cores make
     * of those steps (turns on a core, wake-ups, a root's messages queueing
     * one behind another) is then in the row's figures. */
    dsim_err e = cal_calls(c, rows, n);
    for (int i = 0; i < n && e == DSIM_OK; i++)
        if (rows[i].steps == 0)
            e = cal_fit_algo(c, rows[i].algo, rows, n);
    for (int i = 0; i < n && e == DSIM_OK; i++) {
        double red = 0;
        e = dsim_calib_rates(c->cores, dsim_calib_rate_bytes(c->ranks, c->cores, rows[i].bytes),
                             &rows[i].copy_Bps, &red);
        if (e == DSIM_OK)
            e = dsim_calib_predict_at(c, rows[i].algo, rows[i].bytes, &rows[i], &rows[i].seconds);
    }
    return e;
}
