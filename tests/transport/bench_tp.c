/* Point-to-point figures for a transport backend: ping-pong latency of
 * small messages and one-way bandwidth of large ones, two ranks.
 *
 * Usage: bench_tp [--procs] [BACKEND [SCALE [OPTIONS]]]
 *   BACKEND  inproc (default), tcp or shm
 *   SCALE    multiplies the iteration counts (default 1)
 *   OPTIONS  extra backend options, e.g. cma=off for shm (with --procs,
 *            shm's ring= and bounce= go to dsim_shm_create)
 *   --procs  each rank in a process of its own (rank 1 forked), as the
 *            processes engine runs them: shm through one mapping made
 *            before the fork, tcp over loopback with listeners bound first
 * A meson benchmark(), not a test. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/spi/shm.h"
#include "dsim/transport.h"

static const size_t bench_sizes[] = {8, 4096, 65536, 1 << 20, 16 << 20, 64 << 20};
#define NSIZES (sizeof bench_sizes / sizeof bench_sizes[0])

typedef struct bench {
    dsim_rt *rt;
    dsim_ep *ep[2];
    size_t len;
    int iters;
    int failed;
    double secs;
} bench;

static int bench_iters(size_t len, int scale)
{
    if (len <= 65536)
        return scale * 20000;
    long n = (long)((size_t)4 << 30) / (long)len; /* about 4 GiB each way */
    return scale * (int)(n < 20 ? 20 : n > 2000 ? 2000 : n);
}

static int bench_xchg(bench *b, int me, void *sbuf, void *rbuf, uint32_t tag)
{
    dsim_req *q[2];
    int64_t dl = dsim_rt_deadline(b->rt, 60000000000LL);
    if (me == 0) {
        if (dsim_isend(b->ep[0], 1, 0, tag, sbuf, b->len, &q[0]) != DSIM_OK ||
            dsim_irecv(b->ep[0], 1, 0, tag, rbuf, b->len, &q[1]) != DSIM_OK)
            return -1;
    } else {
        if (dsim_irecv(b->ep[1], 0, 0, tag, rbuf, b->len, &q[0]) != DSIM_OK)
            return -1;
        if (dsim_wait(q[0], dl, NULL) != DSIM_OK)
            return -1;
        q[0] = NULL;
        if (dsim_isend(b->ep[1], 0, 0, tag, sbuf, b->len, &q[1]) != DSIM_OK)
            return -1;
    }
    return dsim_waitall(q, 2, dl, NULL) == DSIM_OK ? 0 : -1;
}

/* One rank's part of one size: warm-up, then the timed iterations. */
static void bench_rank(bench *b, int me)
{
    void *s = malloc(b->len ? b->len : 1), *r = malloc(b->len ? b->len : 1);
    memset(s, me + 1, b->len);
    memset(r, 0, b->len);
    for (int i = 0; i < 10; i++) /* warm up: pages, caches */
        if (bench_xchg(b, me, s, r, 1) != 0)
            b->failed = 1;
    int64_t t0 = dsim_rt_now(b->rt);
    for (int i = 0; i < b->iters && !b->failed; i++)
        if (bench_xchg(b, me, s, r, 2) != 0)
            b->failed = 1;
    if (me == 0)
        b->secs = (double)(dsim_rt_now(b->rt) - t0) / 1e9;
    free(s);
    free(r);
}

static void bench_worker(void *p)
{
    bench *b = ((bench **)p)[0];
    bench_rank(b, (int)(size_t)((bench **)p)[1]);
}

static void bench_row(size_t len, int iters, double secs)
{
    double half = secs / iters / 2;
    printf("%10zu %10d %12.2f %12.2f\n", len, iters, half * 1e6, (double)len / half / 1e9);
    fflush(stdout);
}

/* Both ranks as threads of this process. */
static int bench_threads(const char *backend, const char *options, int scale)
{
    dsim_rt *rt;
    dsim_fabric *f;
    if (dsim_rt_create("threads", &rt) != DSIM_OK)
        return -1;
    dsim_fabric_cfg cfg = {.backend = backend, .nranks = 2, .rt = rt, .options = options};
    if (dsim_fabric_open(&cfg, &f) != DSIM_OK)
        return -1;
    bench b = {.rt = rt};
    if (dsim_ep_open(f, 0, &b.ep[0]) != DSIM_OK || dsim_ep_open(f, 1, &b.ep[1]) != DSIM_OK)
        return -1;
    for (size_t k = 0; k < NSIZES && !b.failed; k++) {
        b.len = bench_sizes[k];
        b.iters = bench_iters(b.len, scale);
        void *args[2][2] = {{&b, (void *)0}, {&b, (void *)1}};
        dsim_task *t[2];
        for (int i = 0; i < 2; i++)
            dsim_rt_spawn(rt, i, bench_worker, args[i], &t[i]);
        for (int i = 0; i < 2; i++)
            dsim_rt_join(rt, t[i]);
        if (!b.failed)
            bench_row(b.len, b.iters, b.secs);
    }
    dsim_ep_close(b.ep[0]);
    dsim_ep_close(b.ep[1]);
    dsim_fabric_close(f);
    dsim_rt_destroy(rt);
    return b.failed ? -1 : 0;
}

/* Rank `me` of a two-process job, in this process. */
static int bench_proc(int me, const char *backend, const char *options, int scale)
{
    dsim_rt *rt;
    dsim_fabric *f;
    if (dsim_rt_create("threads", &rt) != DSIM_OK)
        return -1;
    dsim_fabric_cfg cfg = {.backend = backend, .nranks = 2, .rt = rt, .options = options};
    if (dsim_fabric_open(&cfg, &f) != DSIM_OK)
        return -1;
    bench b = {.rt = rt};
    if (dsim_ep_open(f, me, &b.ep[me]) != DSIM_OK)
        return -1;
    for (size_t k = 0; k < NSIZES && !b.failed; k++) {
        b.len = bench_sizes[k];
        b.iters = bench_iters(b.len, scale);
        bench_rank(&b, me);
        if (me == 0 && !b.failed)
            bench_row(b.len, b.iters, b.secs);
    }
    if (me == 1 && !b.failed) {
        /* The last reply may still be on its way: stay until rank 0 says
         * it has it. */
        uint8_t bye;
        dsim_req *r;
        if (dsim_irecv(b.ep[1], 0, 0, 3, &bye, 1, &r) == DSIM_OK)
            dsim_wait(r, dsim_rt_deadline(rt, 60000000000LL), NULL);
    } else if (me == 0 && !b.failed) {
        uint8_t bye = 1;
        dsim_req *r;
        if (dsim_isend(b.ep[0], 1, 0, 3, &bye, 1, &r) == DSIM_OK)
            dsim_wait(r, dsim_rt_deadline(rt, 60000000000LL), NULL);
    }
    if (b.failed)
        fprintf(stderr, "rank %d: %s\n", me, dsim_errmsg());
    dsim_ep_close(b.ep[me]);
    dsim_fabric_close(f);
    dsim_rt_destroy(rt);
    return b.failed ? -1 : 0;
}

static int bench_listen(int *fd, int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(*fd, 64) != 0 ||
        getsockname(*fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return 0;
}

/* Each rank in a process of its own. */
static int bench_procs(const char *backend, const char *extra, int scale)
{
    char opts[2][512];
    int fds[2] = {-1, -1};
    if (strcmp(backend, "shm") == 0) {
        /* ring= and bounce= size the mapping; the rest is each fabric's. */
        char make[256] = "", mine[256] = "";
        for (const char *p = extra; p && *p;) {
            const char *end = strchr(p, ',');
            size_t n = end ? (size_t)(end - p) : strlen(p);
            char *to = strncmp(p, "ring=", 5) == 0 || strncmp(p, "bounce=", 7) == 0 ? make : mine;
            size_t used = strlen(to);
            snprintf(to + used, 256 - used, "%s%.*s", used ? "," : "", (int)n, p);
            p = end ? end + 1 : p + n;
        }
        int fd;
        if (dsim_shm_create(2, make[0] ? make : NULL, &fd) != DSIM_OK)
            return -1;
        for (int r = 0; r < 2; r++)
            snprintf(opts[r], sizeof opts[r], "fd=%d,local=%d%s%s", fd, r, mine[0] ? "," : "",
                     mine);
    } else if (strcmp(backend, "tcp") == 0) {
        int port[2];
        for (int r = 0; r < 2; r++)
            if (bench_listen(&fds[r], &port[r]) != 0) {
                perror("bench_tp: listen");
                return -1;
            }
        for (int r = 0; r < 2; r++)
            snprintf(opts[r], sizeof opts[r],
                     "addrs=127.0.0.1:%d;127.0.0.1:%d,local=%d,listen_fds=%d%s%s", port[0], port[1],
                     r, fds[r], extra ? "," : "", extra ? extra : "");
    } else {
        fprintf(stderr, "bench_tp: --procs runs tcp or shm, not %s\n", backend);
        return -1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (fds[0] >= 0)
            close(fds[0]);
        _exit(bench_proc(1, backend, opts[1], scale) == 0 ? 0 : 1);
    }
    if (fds[1] >= 0)
        close(fds[1]);
    int rc = bench_proc(0, backend, opts[0], scale);
    int st = 0;
    waitpid(pid, &st, 0);
    return rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    int procs = 0, a = 1;
    if (argc > 1 && strcmp(argv[1], "--procs") == 0) {
        procs = 1;
        a++;
    }
    const char *backend = argc > a ? argv[a] : "inproc";
    int scale = argc > a + 1 ? atoi(argv[a + 1]) : 1;
    const char *options = argc > a + 2 ? argv[a + 2] : NULL;
    if (scale < 1)
        scale = 1;
    printf("# %s%s%s: ping-pong between two ranks (%s; each iteration: one message each way)\n",
           backend, options ? " " : "", options ? options : "",
           procs ? "a process each" : "threads of one process");
    printf("%10s %10s %12s %12s\n", "bytes", "iters", "half-rtt_us", "GB/s");
    int rc = procs ? bench_procs(backend, options, scale) : bench_threads(backend, options, scale);
    if (rc != 0) {
        fprintf(stderr, "bench failed: %s\n", dsim_errmsg());
        return 1;
    }
    return 0;
}
