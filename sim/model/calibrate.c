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

#define CAL_COMM 0xca1bu
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

/* ---- ping-pong ---- */

typedef struct cal_pp {
    dsim_ep *ep;
    int rank;
    const size_t *sizes;
    int n, iters, reps;
    double *secs; /* rank 0 fills it */
    char *buf;
    dsim_err err;
} cal_pp;

static dsim_err cal_xchg(cal_pp *p, size_t len, uint32_t tag)
{
    dsim_rt *rt = dsim_ep_rt(p->ep);
    int64_t dl = dsim_rt_deadline(rt, CAL_TIMEOUT_NS);
    dsim_req *q = NULL;
    int peer = 1 - p->rank;
    if (p->rank == 0) {
        DSIM_CHECK(dsim_isend(p->ep, peer, CAL_COMM, tag, p->buf, len, &q));
        DSIM_CHECK(dsim_wait(q, dl, NULL));
        DSIM_CHECK(dsim_irecv(p->ep, peer, CAL_COMM, tag, p->buf, len, &q));
        return dsim_wait(q, dl, NULL);
    }
    DSIM_CHECK(dsim_irecv(p->ep, peer, CAL_COMM, tag, p->buf, len, &q));
    DSIM_CHECK(dsim_wait(q, dl, NULL));
    DSIM_CHECK(dsim_isend(p->ep, peer, CAL_COMM, tag, p->buf, len, &q));
    return dsim_wait(q, dl, NULL);
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
            batch[r] = (cal_now() - t0) / (2.0 * p->iters);
        }
        if (p->rank == 0 && p->err == DSIM_OK)
            p->secs[s] = cal_median(batch, p->reps);
    }
    if (p->err != DSIM_OK)
        dsim_ep_abort(p->ep, 1 - p->rank, "the calibration ping-pong failed");
    free(batch);
}

static size_t cal_max_size(const size_t *sizes, int n)
{
    size_t m = 1;
    for (int i = 0; i < n; i++)
        m = sizes[i] > m ? sizes[i] : m;
    return m;
}

static dsim_err cal_pp_threads(const size_t *sizes, int n, int iters, int reps, double *secs)
{
    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    cal_pp p[2];
    memset(p, 0, sizeof p);
    dsim_task *task[2] = {NULL, NULL};
    dsim_err e = dsim_rt_create("threads", &rt);
    if (e == DSIM_OK) {
        dsim_fabric_cfg cfg = {.backend = "inproc", .nranks = 2, .rt = rt};
        e = dsim_fabric_open(&cfg, &fab);
    }
    size_t cap = cal_max_size(sizes, n);
    for (int r = 0; r < 2 && e == DSIM_OK; r++) {
        p[r] = (cal_pp){.rank = r, .sizes = sizes, .n = n, .iters = iters, .reps = reps,
                        .secs = secs, .buf = malloc(cap)};
        if (!p[r].buf)
            e = DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory for a %zu B ping-pong", cap);
        else
            memset(p[r].buf, r + 1, cap);
        if (e == DSIM_OK)
            e = dsim_ep_open(fab, r, &p[r].ep);
    }
    for (int r = 0; r < 2 && e == DSIM_OK; r++)
        e = dsim_rt_spawn(rt, r, cal_pp_main, &p[r], &task[r]);
    for (int r = 0; r < 2; r++)
        if (task[r])
            dsim_rt_join(rt, task[r]);
    for (int r = 0; r < 2 && e == DSIM_OK; r++)
        e = p[r].err;
    for (int r = 0; r < 2; r++) {
        if (p[r].ep)
            dsim_ep_close(p[r].ep);
        free(p[r].buf);
    }
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    return e;
}

/* A socket listening on 127.0.0.1, any free port; its port in *port. */
static int cal_listen(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* One side of the processes ping-pong: rank `rank` of a 2-rank tcp fabric. */
static dsim_err cal_pp_tcp_side(int rank, const int *port, int lfd, const size_t *sizes, int n,
                                int iters, int reps, double *secs)
{
    char opts[256];
    snprintf(opts, sizeof opts, "addrs=127.0.0.1:%d;127.0.0.1:%d,local=%d,listen_fds=%d", port[0],
             port[1], rank, lfd);
    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    cal_pp p = {.rank = rank, .sizes = sizes, .n = n, .iters = iters, .reps = reps, .secs = secs};
    dsim_err e = dsim_rt_create("threads", &rt);
    if (e == DSIM_OK) {
        dsim_fabric_cfg cfg = {.backend = "tcp", .nranks = 2, .rt = rt, .options = opts};
        e = dsim_fabric_open(&cfg, &fab);
    }
    size_t cap = cal_max_size(sizes, n);
    if (e == DSIM_OK && !(p.buf = calloc(1, cap)))
        e = DSIM_ERR(DSIM_ENOMEM, -1, "calibration: out of memory for a %zu B ping-pong", cap);
    if (e == DSIM_OK)
        e = dsim_ep_open(fab, rank, &p.ep);
    if (e == DSIM_OK) {
        cal_pp_main(&p);
        e = p.err;
    }
    if (p.ep)
        dsim_ep_close(p.ep);
    free(p.buf);
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    return e;
}

static dsim_err cal_pp_processes(const size_t *sizes, int n, int iters, int reps, double *secs)
{
    int port[2], lfd[2];
    lfd[0] = cal_listen(&port[0]);
    lfd[1] = lfd[0] >= 0 ? cal_listen(&port[1]) : -1;
    if (lfd[1] < 0) {
        if (lfd[0] >= 0)
            close(lfd[0]);
        return DSIM_ERR(DSIM_EIO, errno,
                        "calibration: cannot listen on 127.0.0.1 for the processes ping-pong: %s",
                        strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(lfd[0]);
        close(lfd[1]);
        return DSIM_ERR(DSIM_EIO, errno, "calibration: fork failed: %s", strerror(errno));
    }
    if (pid == 0) {
        close(lfd[0]);
        dsim_err ce = cal_pp_tcp_side(1, port, lfd[1], sizes, n, iters, reps, NULL);
        _exit(ce == DSIM_OK ? 0 : 1);
    }
    close(lfd[1]);
    dsim_err e = cal_pp_tcp_side(0, port, lfd[0], sizes, n, iters, reps, secs);
    int st = 0;
    if (e != DSIM_OK)
        kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (e == DSIM_OK && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        e = DSIM_ERR(DSIM_EIO, -1, "calibration: the ping-pong's child process failed (status %d)",
                     st);
    return e;
}

dsim_err dsim_calib_pingpong(const char *engine, const size_t *sizes, int n, int iters, int reps,
                             double *secs)
{
    if (!engine || !sizes || !secs || n < 1 || iters < 1 || reps < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "calibration ping-pong: an engine, >= 1 size, iters and reps >= 1 needed");
    if (strcmp(engine, "threads") == 0)
        return cal_pp_threads(sizes, n, iters, reps, secs);
    if (strcmp(engine, "processes") == 0)
        return cal_pp_processes(sizes, n, iters, reps, secs);
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "calibration: engine '%s' is not calibrated; accepted: threads, processes",
                    engine);
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
        c[k] = (cal_rate){.start = &go, .reduce = reduce, .loops = loops, .n = n,
                          .a = calloc(n, sizeof(float)), .b = calloc(n, sizeof(float))};
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

dsim_err dsim_calib_measure(const char *engine, dsim_calib *out)
{
    static const size_t sizes[] = {64, 4096, 65536, 1 << 20, 4 << 20};
    enum { N = sizeof sizes / sizeof sizes[0] };
    double secs[N], x[N];
    memset(out, 0, sizeof *out);
    DSIM_CHECK(dsim_calib_pingpong(engine, sizes, N, 50, 5, secs));
    for (int i = 0; i < N; i++)
        x[i] = (double)sizes[i];
    double a = 0, b = 0;
    DSIM_CHECK(dsim_calib_fit_ab(x, secs, N, &a, &b));
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = strcmp(engine, "threads") == 0;
    *out = (dsim_calib){.engine = threads ? "threads" : "processes",
                        .transport = threads ? "inproc" : "tcp",
                        .cores = nc > 0 ? (int)nc : 1,
                        .alpha_s = a,
                        .link_Bps = b > 0 ? 1.0 / b : 0,
                        .pp_small_s = secs[0]};
    return DSIM_OK;
}

void dsim_calib_topology(const dsim_calib *c, int ranks, double copy_Bps, double reduce_Bps,
                         dsim_topology *t)
{
    int inproc = strcmp(c->transport, "inproc") == 0;
    /* More ranks than cores: a message's receiver must wait for a core
     * before it wakes, so every message of a step costs its share of the
     * oversubscription. */
    double over = c->cores > 0 && ranks > c->cores ? (double)ranks / c->cores : 1.0;
    /* inproc moves a message with one memcpy (or combines straight from the
     * sender's buffer); tcp moves it through two socket buffers at the
     * fitted rate */
    double bw = inproc || c->link_Bps <= 0 ? copy_Bps : c->link_Bps;
    dsim_link_model l = {c->transport, "this machine, calibrated", c->alpha_s * over, bw,
                         "dsim calibrate"};
    dsim_device_model d = {"cpu", "this machine, calibrated", 1, 1, 3.0 * reduce_Bps,
                           "dsim calibrate"};
    *t = (dsim_topology){.hosts = 1, .devices_per_host = ranks, .intra = l, .inter = l,
                         .device = d, .cores = c->cores, .fused_reduce = inproc};
}

/* Bytes an algorithm copies locally, sendbuf into recvbuf (or scratch), on
 * all ranks together, out of place: not a transfer, so not in the
 * schedule, yet CPU time all the same. From src/coll: ring copies each block
 * just before combining into it, (p-1)/p of the buffer per rank; rhd copies
 * the half it keeps at the first halving (a power of two of ranks; a folded
 * rank copies the whole); tree copies the whole into its accumulator on
 * every rank that receives in the reduce (ranks of even index); reduce_to_one
 * on rank 0 only. *serial: the copy lies on one rank's path alone (tree's
 * and reduce_to_one's root), not spread over the cores. */
double dsim_calib_local_copy(dsim_algo algo, int p, double n, int *serial)
{
    *serial = 0;
    if (p <= 1)
        return 0;
    switch (algo) {
    case DSIM_ALGO_RING:
        return (double)(p - 1) * n;
    case DSIM_ALGO_RHD: {
        int q = 1;
        while (q * 2 <= p)
            q *= 2;
        return (double)q * n / 2 + (double)(p - q) * n;
    }
    case DSIM_ALGO_TREE:
        *serial = 1;
        return (double)((p + 1) / 2) * n;
    case DSIM_ALGO_REDUCE_TO_ONE:
        *serial = 1;
        return n;
    default:
        return 0;
    }
}

dsim_err dsim_calib_predict(const dsim_calib *c, int ranks, dsim_algo algo, size_t bytes,
                            size_t esize, double copy_Bps, double reduce_Bps, double *seconds)
{
    dsim_topology t;
    dsim_calib_topology(c, ranks, copy_Bps, reduce_Bps, &t);
    DSIM_CHECK(dsim_cost_allreduce(&t, algo, bytes, esize, seconds, NULL));
    int serial = 0;
    double local = dsim_calib_local_copy(algo, ranks, (double)bytes, &serial);
    int par = ranks < c->cores ? ranks : c->cores;
    if (local > 0 && copy_Bps > 0)
        *seconds += serial ? (double)bytes / copy_Bps : local / (copy_Bps * (par > 0 ? par : 1));
    return DSIM_OK;
}
