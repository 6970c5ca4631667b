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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsim/reduce.h"
#include "dsim/rt.h"
#include "dsim/transport.h"
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

enum { CAL_PINGPONG, CAL_EXCHANGE, CAL_EXCHANGE_REDUCE };

typedef struct cal_pp {
    dsim_ep *ep;
    int rank, nranks, mode;
    const size_t *sizes;
    int n, iters, reps;
    double *secs; /* rank 0 fills it */
    char *buf, *buf2;
    dsim_err err;
} cal_pp;

static dsim_err cal_xchg(cal_pp *p, size_t len, uint32_t tag)
{
    dsim_rt *rt = dsim_ep_rt(p->ep);
    int64_t dl = dsim_rt_deadline(rt, CAL_TIMEOUT_NS);
    dsim_req *q[2] = {NULL, NULL};
    if (p->mode != CAL_PINGPONG) {
        /* every rank receives from its left and sends to its right at once,
         * as a step of a ring (or any schedule) does */
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
    if (p->err != DSIM_OK)
        dsim_ep_abort(p->ep, (p->rank + 1) % p->nranks, "the calibration exchange failed");
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
    p->buf = malloc(cap);
    p->buf2 = malloc(cap);
    if (!p->buf || !p->buf2)
        return DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory for %zu B messages", cap);
    /* small floats: a sum of them stays finite however often it is taken */
    for (size_t i = 0; i + sizeof(float) <= cap; i += sizeof(float)) {
        float v = 1.0f / 1024;
        memcpy(p->buf + i, &v, sizeof v);
        memcpy(p->buf2 + i, &v, sizeof v);
    }
    return DSIM_OK;
}

static dsim_err cal_run_threads(const cal_pp *tmpl)
{
    int P = tmpl->nranks;
    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    cal_pp *p = calloc((size_t)P, sizeof *p);
    dsim_task **task = calloc((size_t)P, sizeof *task);
    dsim_err e = p && task ? dsim_rt_create("threads", &rt)
                           : DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory");
    if (e == DSIM_OK) {
        dsim_fabric_cfg cfg = {.backend = "inproc", .nranks = P, .rt = rt};
        e = dsim_fabric_open(&cfg, &fab);
    }
    size_t cap = cal_max_size(tmpl->sizes, tmpl->n);
    for (int r = 0; r < P && e == DSIM_OK; r++) {
        p[r] = *tmpl;
        p[r].rank = r;
        p[r].buf = p[r].buf2 = NULL;
        e = cal_bufs(&p[r], cap);
        if (e == DSIM_OK)
            e = dsim_ep_open(fab, r, &p[r].ep);
    }
    for (int r = 0; r < P && e == DSIM_OK; r++)
        e = dsim_rt_spawn(rt, r, cal_pp_main, &p[r], &task[r]);
    if (e != DSIM_OK && fab)
        dsim_fabric_abort(fab, 0, "the calibration could not start every rank");
    for (int r = 0; task && r < P; r++)
        if (task[r])
            dsim_rt_join(rt, task[r]);
    for (int r = 0; p && r < P && e == DSIM_OK; r++)
        e = p[r].err;
    for (int r = 0; p && r < P; r++) {
        if (p[r].ep)
            dsim_ep_close(p[r].ep);
        free(p[r].buf);
        free(p[r].buf2);
    }
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    free(p);
    free(task);
    return e;
}

int dsim_calib_listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* One process's rank of a tcp fabric of tmpl->nranks ranks. */
static dsim_err cal_tcp_side(const cal_pp *tmpl, int rank, const char *addrs, int lfd)
{
    size_t ocap = strlen(addrs) + 96;
    char *opts = malloc(ocap);
    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    cal_pp p = *tmpl;
    p.rank = rank;
    p.buf = p.buf2 = NULL;
    p.ep = NULL;
    dsim_err e = opts ? dsim_rt_create("threads", &rt)
                      : DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory");
    if (e == DSIM_OK) {
        snprintf(opts, ocap, "addrs=%s,local=%d,listen_fds=%d", addrs, rank, lfd);
        dsim_fabric_cfg cfg = {.backend = "tcp", .nranks = p.nranks, .rt = rt, .options = opts};
        e = dsim_fabric_open(&cfg, &fab);
    }
    if (e == DSIM_OK)
        e = cal_bufs(&p, cal_max_size(p.sizes, p.n));
    if (e == DSIM_OK)
        e = dsim_ep_open(fab, rank, &p.ep);
    if (e == DSIM_OK) {
        dsim_task *t = NULL;
        e = dsim_rt_spawn(rt, rank, cal_pp_main, &p, &t);
        if (e == DSIM_OK) {
            dsim_rt_join(rt, t);
            e = p.err;
        }
    }
    if (p.ep)
        dsim_ep_close(p.ep);
    free(p.buf);
    free(p.buf2);
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    free(opts);
    return e;
}

/* Ranks 1.. in forked children, rank 0 here, over tcp on loopback. The
 * caller has started no thread of its own that a child could need. */
static dsim_err cal_run_processes(const cal_pp *tmpl)
{
    int P = tmpl->nranks, made = 0;
    int *lfd = calloc((size_t)P, sizeof *lfd), *port = calloc((size_t)P, sizeof *port);
    pid_t *pid = calloc((size_t)P, sizeof *pid);
    char *addrs = malloc((size_t)P * 24 + 1);
    dsim_err e = lfd && port && pid && addrs
                     ? DSIM_OK
                     : DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory");
    size_t len = 0;
    for (int r = 0; r < P && e == DSIM_OK; r++, made++) {
        lfd[r] = dsim_calib_listen_loopback(&port[r]);
        if (lfd[r] < 0)
            e = DSIM_ERR(DSIM_EIO, errno,
                         "calibration: cannot listen on 127.0.0.1 for the processes engine: %s",
                         strerror(errno));
        else
            len += (size_t)sprintf(addrs + len, "%s127.0.0.1:%d", r ? ";" : "", port[r]);
    }
    fflush(NULL);
    for (int r = 1; r < P && e == DSIM_OK; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            e = DSIM_ERR(DSIM_EIO, errno, "calibration: fork failed: %s", strerror(errno));
            break;
        }
        if (pid[r] == 0) {
            for (int k = 0; k < P; k++)
                if (k != r)
                    close(lfd[k]);
            _exit(cal_tcp_side(tmpl, r, addrs, lfd[r]) == DSIM_OK ? 0 : 1);
        }
    }
    for (int r = 1; r < made; r++)
        close(lfd[r]);
    if (e == DSIM_OK)
        e = cal_tcp_side(tmpl, 0, addrs, lfd[0]);
    if (made > 0)
        close(lfd[0]);
    for (int r = 1; pid && r < P; r++) {
        if (pid[r] <= 0)
            continue;
        int st = 0;
        if (e != DSIM_OK)
            kill(pid[r], SIGKILL);
        while (waitpid(pid[r], &st, 0) < 0 && errno == EINTR)
            ;
        if (e == DSIM_OK && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
            e = DSIM_ERR(DSIM_EIO, -1, "calibration: the process of rank %d failed (status %d)", r,
                         st);
    }
    free(lfd);
    free(port);
    free(pid);
    free(addrs);
    return e;
}

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
    if (strcmp(engine, "threads") == 0)
        return cal_run_threads(tmpl);
    if (strcmp(engine, "processes") == 0)
        return cal_run_processes(tmpl);
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "calibration: engine '%s' is not calibrated; accepted: threads, processes",
                    engine);
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
    cal_pp t = {.nranks = ranks,
                .mode = reduce ? CAL_EXCHANGE_REDUCE : CAL_EXCHANGE,
                .sizes = sizes,
                .n = n,
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
    DSIM_CHECK(dsim_calib_exchange(engine, ranks, 0, sizes, 1, 50, 5, &ax));
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = strcmp(engine, "threads") == 0;
    *out = (dsim_calib){.engine = threads ? "threads" : "processes",
                        .transport = threads ? "inproc" : "tcp",
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

int dsim_calib_xranks(dsim_algo algo, int ranks)
{
    /* ring's and rhd's steps move a message from every rank at once; tree's
     * and reduce_to_one's move one or a few, each alone on a core: a pair
     * exchanging is what they see, not a crowd of p */
    const dsim_algo_cost *cost = dsim_algo_cost_of(algo);
    return (cost && cost->every_rank_sends) || ranks < 2 ? ranks : 2;
}

void dsim_calib_topology(const dsim_calib *c, int xranks, size_t msg, double step_copy_s,
                         double step_reduce_s, dsim_topology *t)
{
    int P = xranks > 0 ? xranks : c->ranks, eff = P < c->cores ? P : c->cores;
    double alpha = c->alpha_x_s;
    /* One exchange is a step in which all P ranks move `msg` at once; the
     * evaluator makes such a step last alpha + P x (one transfer's CPU time)
     * / cores. Solving for one transfer gives the rates that make it agree
     * with the exchange measured, for a copy and for a combining receive. */
    double mv = (step_copy_s > alpha ? step_copy_s - alpha : step_copy_s * 1e-3) * eff / P;
    double rd = (step_reduce_s > alpha ? step_reduce_s - alpha : step_reduce_s * 1e-3) * eff / P;
    dsim_link_model l = {c->transport, "this machine, calibrated", alpha, (double)msg / mv,
                         "dsim calibrate"};
    dsim_device_model d = {"cpu", "this machine, calibrated", 1,
                           1,     3.0 * (double)msg / rd,     "dsim calibrate"};
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

dsim_err dsim_calib_predict_at(const dsim_calib *c, dsim_algo algo, size_t bytes,
                               const dsim_calib_row *at, double *seconds)
{
    dsim_topology t;
    dsim_calib_topology(c, at->xranks, at->msg, at->step_copy_s, at->step_reduce_s, &t);
    DSIM_CHECK(dsim_cost_allreduce(&t, algo, bytes, sizeof(float), seconds, NULL));
    int serial = 0, P = c->ranks;
    double local = dsim_calib_local_copy(algo, P, (double)bytes, &serial);
    int par = P < c->cores ? P : c->cores;
    if (local > 0 && at->copy_Bps > 0)
        *seconds +=
            serial ? (double)bytes / at->copy_Bps : local / (at->copy_Bps * (par > 0 ? par : 1));
    return DSIM_OK;
}

dsim_err dsim_calib_predict(const dsim_calib *c, dsim_calib_row *rows, int n)
{
    dsim_err e = DSIM_OK;
    for (int i = 0; i < n && e == DSIM_OK; i++) {
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
        rows[i].xranks = dsim_calib_xranks(rows[i].algo, c->ranks);
        rows[i].step_copy_s = rows[i].step_reduce_s = -1;
    }
    size_t *sz = calloc((size_t)n + 1, sizeof *sz);
    double *tx = calloc((size_t)n + 1, sizeof *tx), *tr = calloc((size_t)n + 1, sizeof *tr);
    if (!sz || !tx || !tr)
        e = DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory");
    /* one pair of exchanges (plain, combining) per rank count, over every
     * message size the rows at that count need */
    int counts[2] = {c->ranks, 2};
    for (int k = 0; k < 2 && e == DSIM_OK; k++) {
        if (k == 1 && counts[1] == counts[0])
            break;
        int ns = 0;
        for (int i = 0; i < n; i++) {
            if (rows[i].xranks != counts[k])
                continue;
            int j = 0;
            while (j < ns && sz[j] != rows[i].msg)
                j++;
            if (j == ns)
                sz[ns++] = rows[i].msg;
        }
        if (ns == 0)
            continue;
        /* fewer exchanges for large messages: the time is long enough to read */
        size_t big = cal_max_size(sz, ns);
        int iters = big >= ((size_t)1 << 22) ? 5 : big >= ((size_t)1 << 18) ? 10 : 30;
        e = dsim_calib_exchange(c->engine, counts[k], 0, sz, ns, iters, 5, tx);
        if (e == DSIM_OK)
            e = dsim_calib_exchange(c->engine, counts[k], 1, sz, ns, iters, 5, tr);
        for (int i = 0; i < n && e == DSIM_OK; i++) {
            if (rows[i].xranks != counts[k])
                continue;
            int j = 0;
            while (sz[j] != rows[i].msg)
                j++;
            rows[i].step_copy_s = tx[j];
            rows[i].step_reduce_s = tr[j];
        }
    }
    for (int i = 0; i < n && e == DSIM_OK; i++) {
        double red = 0;
        e = dsim_calib_rates(c->cores, dsim_calib_rate_bytes(c->ranks, c->cores, rows[i].bytes),
                             &rows[i].copy_Bps, &red);
        if (e == DSIM_OK)
            e = dsim_calib_predict_at(c, rows[i].algo, rows[i].bytes, &rows[i], &rows[i].seconds);
    }
    free(sz);
    free(tx);
    free(tr);
    return e;
}
