/* Point-to-point figures for a transport backend: ping-pong latency of
 * small messages and one-way bandwidth of large ones, two workers.
 * Usage: bench_tp [BACKEND [ITERS]]. A meson benchmark(), not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/transport.h"

typedef struct bench {
    dsim_rt *rt;
    dsim_ep *ep[2];
    size_t len;
    int iters;
    int failed;
    double secs;
} bench;

static int bench_xchg(bench *b, int me, void *sbuf, void *rbuf, uint32_t tag)
{
    dsim_req *q[2];
    int64_t dl = dsim_rt_deadline(b->rt, 30000000000LL);
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

static void bench_worker(void *p)
{
    bench *b = ((bench **)p)[0];
    int me = (int)(size_t)((bench **)p)[1];
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

int main(int argc, char **argv)
{
    const char *backend = argc > 1 ? argv[1] : "inproc";
    int scale = argc > 2 ? atoi(argv[2]) : 1;
    dsim_rt *rt;
    if (dsim_rt_create("threads", &rt) != DSIM_OK) {
        fprintf(stderr, "%s\n", dsim_errmsg());
        return 1;
    }
    static const size_t sizes[] = {8, 1024, 65536, 1 << 20, 8 << 20};
    printf("# %s: ping-pong between two workers (each iteration: one message each way)\n", backend);
    printf("%10s %10s %12s %12s\n", "bytes", "iters", "half-rtt_us", "GB/s");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        dsim_fabric_cfg cfg = {.backend = backend, .nranks = 2, .rt = rt};
        dsim_fabric *f;
        if (dsim_fabric_open(&cfg, &f) != DSIM_OK) {
            fprintf(stderr, "%s\n", dsim_errmsg());
            return 1;
        }
        bench b = {.rt = rt, .len = sizes[k]};
        b.iters = scale * (sizes[k] >= (1 << 20) ? 200 : 20000);
        dsim_ep_open(f, 0, &b.ep[0]);
        dsim_ep_open(f, 1, &b.ep[1]);
        void *args[2][2] = {{&b, (void *)0}, {&b, (void *)1}};
        dsim_task *t[2];
        for (int i = 0; i < 2; i++)
            dsim_rt_spawn(rt, i, bench_worker, args[i], &t[i]);
        for (int i = 0; i < 2; i++)
            dsim_rt_join(rt, t[i]);
        if (b.failed) {
            fprintf(stderr, "bench failed: %s\n", dsim_errmsg());
            return 1;
        }
        double half = b.secs / b.iters / 2;
        printf("%10zu %10d %12.2f %12.2f\n", sizes[k], b.iters, half * 1e6,
               (double)sizes[k] / half / 1e9);
        dsim_ep_close(b.ep[0]);
        dsim_ep_close(b.ep[1]);
        dsim_fabric_close(f);
    }
    dsim_rt_destroy(rt);
    return 0;
}
