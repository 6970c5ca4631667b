/* reduce, broadcast, allgather, reduce_scatter and barrier over rank counts
 * {1,2,3,4,5,7,8,16}, every root, every dtype (and op where there is one),
 * element counts 0, 1, 7, 1023. Results are checked exactly against the
 * coll_data formulas (MEAN on floats within 1 ulp); buffers a rank must not
 * write (recvbuf off the root, the send buffer) are checked untouched. Every
 * rank checks its own result, so the ranks run the whole case list without
 * stopping to line up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "coll_data.h"
#include "coll_harness.h"
#include "dsim/err.h"

static const int cl_ranks[] = {1, 2, 3, 4, 5, 7, 8, 16};
static const size_t cl_counts[] = {0, 1, 7, 1023};
#define CL_NCOUNTS (sizeof cl_counts / sizeof cl_counts[0])
#define CL_MAXC    1023
#define CL_CANARY  0xA5

typedef struct cl_shared {
    int n;
    coll_failures fl;
    int stop;
    int arrived[64]; /* barrier test: arrivals per round */
} cl_shared;

/* A collective failed: record it and make every rank stop at the next
 * checkpoint (their call counters no longer agree). */
static int cl_call_failed(cl_shared *s, dsim_err e, int rank, const char *what)
{
    if (e == DSIM_OK)
        return 0;
    coll_fail(&s->fl, "%s: rank %d returned %s: %s", what, rank, dsim_strerror(e), dsim_errmsg());
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
    return 1;
}

static int cl_stopped(cl_shared *s)
{
    return __atomic_load_n(&s->stop, __ATOMIC_RELAXED);
}

static int cl_untouched(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != CL_CANARY)
            return 0;
    return 1;
}

typedef void (*cl_body)(coll_harness *h, int rank, cl_shared *s, unsigned char *a,
                        unsigned char *b);

typedef struct cl_run {
    cl_shared *s;
    cl_body body;
} cl_run;

static void cl_rank(coll_harness *h, int rank, void *arg)
{
    cl_run *run = arg;
    size_t cap = (size_t)h->n * CL_MAXC * 8 + 64;
    unsigned char *a = malloc(cap), *b = malloc(cap);
    if (!a || !b)
        coll_fail(&run->s->fl, "rank %d: out of memory", rank);
    else
        run->body(h, rank, run->s, a, b);
    free(a);
    free(b);
}

static void cl_for_ranks(cl_body body)
{
    for (size_t i = 0; i < sizeof cl_ranks / sizeof cl_ranks[0]; i++) {
        cl_shared s = {.n = cl_ranks[i]};
        pthread_mutex_init(&s.fl.mu, NULL);
        coll_harness h;
        coll_harness_cfg cfg = {.nranks = s.n, .timeout_ns = 20LL * 1000000000LL};
        if (coll_harness_open(&h, &cfg) != DSIM_OK)
            fail_msg("opening %d ranks: %s", s.n, dsim_errmsg());
        cl_run run = {&s, body};
        dsim_err e = coll_harness_run(&h, cl_rank, &run);
        coll_harness_close(&h);
        pthread_mutex_destroy(&s.fl.mu);
        if (e != DSIM_OK)
            fail_msg("running %d ranks: %s", s.n, dsim_errmsg());
        if (s.fl.failures)
            fail_msg("%d ranks: %d failure(s); the first: %s", s.n, s.fl.failures, s.fl.first);
    }
}

/* ---- reduce ---------------------------------------------------------- */

static void reduce_body(coll_harness *h, int rank, cl_shared *s, unsigned char *sb,
                        unsigned char *rb)
{
    int n = h->n;
    char msg[400];
    int ncase = 0;
    for (int root = 0; root < n; root++)
        for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
            for (int op = 0; op < DSIM_OP_COUNT; op++)
                for (size_t k = 0; k < CL_NCOUNTS; k++, ncase++) {
                    if (cl_stopped(s))
                        return;
                    size_t count = cl_counts[k], es = dsim_dtype_size((dsim_dtype)t);
                    /* On the root, every other case runs in place. */
                    int inplace = rank == root && ncase % 2 == 0;
                    unsigned char *in = inplace ? rb : sb;
                    if (!inplace)
                        memset(rb, CL_CANARY, count * es + 8);
                    memset(in + count * es, CL_CANARY, 8);
                    coll_fill((dsim_dtype)t, (dsim_op)op, rank, in, 0, count);
                    char what[160];
                    snprintf(what, sizeof what, "reduce %s %s, %d ranks, root %d, count %zu%s",
                             dsim_dtype_name((dsim_dtype)t), dsim_op_name((dsim_op)op), n, root,
                             count, inplace ? ", in place" : "");
                    dsim_err e = dsim_reduce(h->comms[rank], in, rb, count, (dsim_dtype)t,
                                             (dsim_op)op, root);
                    if (cl_call_failed(s, e, rank, what))
                        return;
                    if (rank == root) {
                        if (coll_check((dsim_dtype)t, (dsim_op)op, n, rb, 0, count, msg,
                                       sizeof msg) >= 0)
                            coll_fail(&s->fl, "%s: %s", what, msg);
                        if (!cl_untouched(rb + count * es, 8))
                            coll_fail(&s->fl, "%s: the root's recvbuf was written past count",
                                      what);
                    } else if (!cl_untouched(rb, count * es + 8)) {
                        coll_fail(&s->fl, "%s: rank %d (not the root) had its recvbuf written",
                                  what, rank);
                    }
                    if (!inplace && coll_check_vals((dsim_dtype)t, (dsim_op)op, rank, sb, 0, count,
                                                    msg, sizeof msg) >= 0)
                        coll_fail(&s->fl, "%s: rank %d's send buffer was modified: %s", what, rank,
                                  msg);
                }
}

static void test_reduce(void **state)
{
    (void)state;
    cl_for_ranks(reduce_body);
}

/* ---- broadcast ------------------------------------------------------- */

static void bcast_body(coll_harness *h, int rank, cl_shared *s, unsigned char *buf,
                       unsigned char *unused)
{
    (void)unused;
    int n = h->n;
    char msg[400];
    for (int root = 0; root < n; root++)
        for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
            for (size_t k = 0; k < CL_NCOUNTS; k++) {
                if (cl_stopped(s))
                    return;
                size_t count = cl_counts[k], es = dsim_dtype_size((dsim_dtype)t);
                memset(buf, CL_CANARY, count * es + 8);
                if (rank == root)
                    coll_fill((dsim_dtype)t, DSIM_SUM, root, buf, 0, count);
                char what[160];
                snprintf(what, sizeof what, "broadcast %s, %d ranks, root %d, count %zu",
                         dsim_dtype_name((dsim_dtype)t), n, root, count);
                dsim_err e = dsim_broadcast(h->comms[rank], buf, count, (dsim_dtype)t, root);
                if (cl_call_failed(s, e, rank, what))
                    return;
                if (coll_check_vals((dsim_dtype)t, DSIM_SUM, root, buf, 0, count, msg,
                                    sizeof msg) >= 0)
                    coll_fail(&s->fl, "%s: rank %d: %s", what, rank, msg);
                if (!cl_untouched(buf + count * es, 8))
                    coll_fail(&s->fl, "%s: rank %d's buffer was written past count", what, rank);
            }
}

static void test_broadcast(void **state)
{
    (void)state;
    cl_for_ranks(bcast_body);
}

/* ---- allgather ------------------------------------------------------- */

static void allgather_body(coll_harness *h, int rank, cl_shared *s, unsigned char *sb,
                           unsigned char *rb)
{
    int n = h->n;
    char msg[400];
    int ncase = 0;
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
        for (size_t k = 0; k < CL_NCOUNTS; k++, ncase++) {
            if (cl_stopped(s))
                return;
            size_t count = cl_counts[k], es = dsim_dtype_size((dsim_dtype)t);
            size_t blen = count * es;
            /* Every other case in place: the send block already sits at
             * this rank's place in recvbuf. */
            int inplace = ncase % 2 == 1;
            memset(rb, CL_CANARY, (size_t)n * blen + 8);
            unsigned char *in = inplace ? rb + (size_t)rank * blen : sb;
            coll_fill((dsim_dtype)t, DSIM_SUM, rank, in, 0, count);
            char what[160];
            snprintf(what, sizeof what, "allgather %s, %d ranks, count %zu%s",
                     dsim_dtype_name((dsim_dtype)t), n, count, inplace ? ", in place" : "");
            dsim_err e = dsim_allgather(h->comms[rank], in, rb, count, (dsim_dtype)t);
            if (cl_call_failed(s, e, rank, what))
                return;
            for (int r = 0; r < n; r++)
                if (coll_check_vals((dsim_dtype)t, DSIM_SUM, r, rb + (size_t)r * blen, 0, count,
                                    msg, sizeof msg) >= 0)
                    coll_fail(&s->fl, "%s: rank %d, block %d: %s", what, rank, r, msg);
            if (!cl_untouched(rb + (size_t)n * blen, 8))
                coll_fail(&s->fl, "%s: rank %d's recvbuf was written past n * count", what, rank);
        }
}

static void test_allgather(void **state)
{
    (void)state;
    cl_for_ranks(allgather_body);
}

/* ---- reduce_scatter -------------------------------------------------- */

static void reduce_scatter_body(coll_harness *h, int rank, cl_shared *s, unsigned char *sb,
                                unsigned char *rb)
{
    int n = h->n;
    char msg[400];
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
        for (int op = 0; op < DSIM_OP_COUNT; op++)
            for (size_t k = 0; k < CL_NCOUNTS; k++) {
                if (cl_stopped(s))
                    return;
                size_t count = cl_counts[k], es = dsim_dtype_size((dsim_dtype)t);
                size_t total = (size_t)n * count;
                memset(rb, CL_CANARY, count * es + 8);
                coll_fill((dsim_dtype)t, (dsim_op)op, rank, sb, 0, total);
                char what[160];
                snprintf(what, sizeof what, "reduce_scatter %s %s, %d ranks, recvcount %zu",
                         dsim_dtype_name((dsim_dtype)t), dsim_op_name((dsim_op)op), n, count);
                dsim_err e =
                    dsim_reduce_scatter(h->comms[rank], sb, rb, count, (dsim_dtype)t, (dsim_op)op);
                if (cl_call_failed(s, e, rank, what))
                    return;
                if (coll_check((dsim_dtype)t, (dsim_op)op, n, rb, (size_t)rank * count, count, msg,
                               sizeof msg) >= 0)
                    coll_fail(&s->fl, "%s: rank %d: %s", what, rank, msg);
                if (!cl_untouched(rb + count * es, 8))
                    coll_fail(&s->fl, "%s: rank %d's recvbuf was written past recvcount", what,
                              rank);
                if (coll_check_vals((dsim_dtype)t, (dsim_op)op, rank, sb, 0, total, msg,
                                    sizeof msg) >= 0)
                    coll_fail(&s->fl, "%s: rank %d's send buffer was modified: %s", what, rank,
                              msg);
            }
}

static void test_reduce_scatter(void **state)
{
    (void)state;
    cl_for_ranks(reduce_scatter_body);
}

/* ---- barrier --------------------------------------------------------- */

/* Each round, ranks arrive at staggered times (a different rank is late each
 * round); nobody may leave a barrier before everyone has arrived at it. */
static void barrier_body(coll_harness *h, int rank, cl_shared *s, unsigned char *a,
                         unsigned char *b)
{
    (void)a;
    (void)b;
    int n = h->n;
    for (int round = 0; round < 64; round++) {
        if (round % 8 == rank % 8) {
            struct timespec ts = {0, 200000}; /* 0.2 ms late */
            nanosleep(&ts, NULL);
        }
        __atomic_add_fetch(&s->arrived[round], 1, __ATOMIC_SEQ_CST);
        char what[64];
        snprintf(what, sizeof what, "barrier round %d, %d ranks", round, n);
        if (cl_call_failed(s, dsim_barrier(h->comms[rank]), rank, what))
            return;
        int seen = __atomic_load_n(&s->arrived[round], __ATOMIC_SEQ_CST);
        if (seen != n)
            coll_fail(&s->fl, "%s: rank %d left while only %d of %d ranks had arrived", what, rank,
                      seen, n);
    }
}

static void test_barrier(void **state)
{
    (void)state;
    cl_for_ranks(barrier_body);
}

int main(void)
{
    coll_data_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce),    cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_allgather), cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_barrier),
    };
    return cmocka_run_group_tests_name("coll_collectives", tests, NULL, NULL);
}
