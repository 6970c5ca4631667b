/* Allreduce verification matrix for one algorithm:
 *
 *     test_allreduce ALGO small|large
 *
 * every dtype x op x rank count {1,2,3,4,5,7,8,16} x element count (small:
 * 0, 1, 7, 1023; large: 2^20 + 13, which no rank count divides). The
 * communicators know their hosts (4 ranks: 2 x 2; 8: 2 x 4; 16: 4 x 4), so
 * hierarchical runs its two levels there.
 *
 * torus runs on a torus of each rank count (ar_torus below): 2, 3, 5 and 7
 * as one dimension, 4 as 2x2, 8 as 2x2x2, 16 as 2x4x2 and 12 as 3x2x2 with
 * the ranks placed out of order (as a TPU slice's replicas are), and 6
 * without a torus (one ring of every rank, the fallback). Inputs come
 * from coll_data (exact results known); each result is checked exactly (MEAN
 * on floats within 1 ulp), every rank's result is compared bit for bit with
 * rank 0's, and out of place the send buffer must come back untouched. Half
 * the cases run in place (sendbuf == recvbuf), alternating over op and count.
 *
 * Each rank count runs on one set of workers that loop over all the cases,
 * so thousands of calls go through one communicator (the call counter in the
 * tags gets exercised too). Checking is split across the ranks: rank r checks
 * its slice of rank 0's result against the formula. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coll_data.h"
#include "coll_harness.h"
#include "dsim/err.h"

#define AR_MAX_RANKS 16

static const int ar_ranks[] = {1, 2, 3, 4, 5, 7, 8, 16};
static const size_t ar_small[] = {0, 1, 7, 1023};
static const size_t ar_large[] = {((size_t)1 << 20) + 13};

/* The torus algorithm's shape for each rank count: dims (0-terminated) and
 * whether the ranks sit at their places in a shuffled order. */
typedef struct ar_torus_shape {
    int n, dims[DSIM_TORUS_MAX_DIMS], shuffled;
} ar_torus_shape;

static const int ar_torus_ranks[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16};
static const ar_torus_shape ar_torus[] = {
    {2, {2}, 0}, {3, {3}, 0},       {4, {2, 2}, 1},     {5, {5}, 0},        {6, {0}, 0},
    {7, {7}, 0}, {8, {2, 2, 2}, 1}, {12, {3, 2, 2}, 1}, {16, {2, 4, 2}, 1},
};

static dsim_algo ar_algo;
static const size_t *ar_counts;
static int ar_ncounts;

typedef struct ar_shared {
    dsim_dtype t;
    int n;
    void *res[AR_MAX_RANKS];
    int stop;
    coll_failures fl;
} ar_shared;

static void ar_rank(coll_harness *h, int rank, void *arg)
{
    ar_shared *s = arg;
    dsim_comm *c = h->comms[rank];
    dsim_dtype t = s->t;
    int n = s->n;
    size_t es = dsim_dtype_size(t), maxc = 1;
    for (int k = 0; k < ar_ncounts; k++)
        if (ar_counts[k] > maxc)
            maxc = ar_counts[k];
    char *sb = malloc(maxc * es), *rb = malloc(maxc * es);
    s->res[rank] = rb;
    char msg[400];
    if (!sb || !rb)
        coll_fail(&s->fl, "rank %d: out of memory", rank);
    coll_harness_sync(h);
    if (__atomic_load_n(&s->fl.failures, __ATOMIC_RELAXED))
        goto out;

    for (int op = 0; op < DSIM_OP_COUNT; op++) {
        for (int k = 0; k < ar_ncounts; k++) {
            size_t count = ar_counts[k];
            int inplace = (op + k) % 2 == 0;
            char *in = inplace ? rb : sb;
            const char *what = inplace ? "in place" : "out of place";
            coll_fill(t, (dsim_op)op, rank, in, 0, count);
            dsim_err e = dsim_allreduce_with(c, in, rb, count, t, (dsim_op)op, ar_algo);
            if (e != DSIM_OK) {
                coll_fail(&s->fl, "%s %s %s, %d ranks, count %zu, %s: rank %d returned %s: %s",
                          dsim_algo_name(ar_algo), dsim_dtype_name(t), dsim_op_name((dsim_op)op), n,
                          count, what, rank, dsim_strerror(e), dsim_errmsg());
                __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
            }
            coll_harness_sync(h);
            if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED))
                goto out;

            size_t lo = count * (size_t)rank / (size_t)n,
                   hi = count * (size_t)(rank + 1) / (size_t)n;
            long bad = coll_check(t, (dsim_op)op, n, (char *)s->res[0] + lo * es, lo, hi - lo, msg,
                                  sizeof msg);
            if (bad >= 0)
                coll_fail(&s->fl, "%s, count %zu, %s: %s", dsim_algo_name(ar_algo), count, what,
                          msg);
            if (rank != 0 && count && memcmp(rb, s->res[0], count * es) != 0) {
                size_t j = 0;
                while (memcmp(rb + j * es, (char *)s->res[0] + j * es, es) == 0)
                    j++;
                coll_fail(&s->fl,
                          "%s %s %s, %d ranks, count %zu, %s: rank %d differs from rank 0 at "
                          "element %zu (%.17g vs %.17g)",
                          dsim_algo_name(ar_algo), dsim_dtype_name(t), dsim_op_name((dsim_op)op), n,
                          count, what, rank, j, dsim_dtype_get(t, rb, j),
                          dsim_dtype_get(t, s->res[0], j));
            }
            if (!inplace &&
                coll_check_vals(t, (dsim_op)op, rank, sb, 0, count, msg, sizeof msg) >= 0)
                coll_fail(&s->fl, "%s, %d ranks, count %zu: the send buffer was modified: %s",
                          dsim_algo_name(ar_algo), n, count, msg);
            coll_harness_sync(h);
        }
    }
out:
    coll_harness_sync(h);
    free(sb);
    free(rb);
}

/* cfg's torus for n ranks (the torus algorithm only); rank_at has room for
 * AR_MAX_RANKS. */
static void ar_torus_cfg(int n, coll_harness_cfg *cfg, int *rank_at)
{
    if (ar_algo != DSIM_ALGO_TORUS)
        return;
    for (size_t k = 0; k < sizeof ar_torus / sizeof ar_torus[0]; k++) {
        const ar_torus_shape *sh = &ar_torus[k];
        if (sh->n != n)
            continue;
        for (int i = 0; i < DSIM_TORUS_MAX_DIMS && sh->dims[i]; i++)
            cfg->torus_dims[cfg->torus_ndims++] = sh->dims[i];
        /* 5 is coprime to every count here: place p holds rank 5p + 3 */
        for (int p = 0; p < n; p++)
            rank_at[p] = sh->shuffled ? (5 * p + 3) % n : p;
        cfg->torus_rank = sh->shuffled ? rank_at : NULL;
    }
}

static void test_dtype(void **state)
{
    dsim_dtype t = (dsim_dtype)(intptr_t)*state;
    int torus = ar_algo == DSIM_ALGO_TORUS;
    size_t nr = torus ? sizeof ar_torus_ranks / sizeof ar_torus_ranks[0]
                      : sizeof ar_ranks / sizeof ar_ranks[0];
    for (size_t i = 0; i < nr; i++) {
        ar_shared s = {.t = t, .n = torus ? ar_torus_ranks[i] : ar_ranks[i]};
        pthread_mutex_init(&s.fl.mu, NULL);
        coll_harness h;
        /* Hosts for the hierarchical algorithm (and auto, which picks it
         * over hosts): 2 x 2, 2 x 4, 4 x 4; the other counts have no
         * uniform hosts, where it is the ring. */
        int local = s.n == 4 ? 2 : s.n % 4 == 0 ? 4 : 0;
        coll_harness_cfg cfg = {
            .nranks = s.n, .timeout_ns = 60LL * 1000000000LL, .local_size = local};
        int rank_at[AR_MAX_RANKS];
        ar_torus_cfg(s.n, &cfg, rank_at);
        if (coll_harness_open(&h, &cfg) != DSIM_OK)
            fail_msg("opening %d ranks: %s", s.n, dsim_errmsg());
        dsim_err e = coll_harness_run(&h, ar_rank, &s);
        coll_harness_close(&h);
        pthread_mutex_destroy(&s.fl.mu);
        if (e != DSIM_OK)
            fail_msg("running %d ranks: %s", s.n, dsim_errmsg());
        if (s.fl.failures)
            fail_msg("%d failure(s); the first: %s", s.fl.failures, s.fl.first);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3 || dsim_algo_parse(argv[1], &ar_algo) != DSIM_OK ||
        (strcmp(argv[2], "small") && strcmp(argv[2], "large"))) {
        fprintf(stderr, "usage: %s ALGO small|large (ALGO: auto or an algorithm)\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[2], "small") == 0) {
        ar_counts = ar_small;
        ar_ncounts = sizeof ar_small / sizeof ar_small[0];
    } else {
        ar_counts = ar_large;
        ar_ncounts = 1;
    }
    coll_data_init();
    static void *states[DSIM_DTYPE_COUNT];
    struct CMUnitTest tests[DSIM_DTYPE_COUNT];
    static char names[DSIM_DTYPE_COUNT][64];
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++) {
        states[t] = (void *)(intptr_t)t;
        snprintf(names[t], sizeof names[t], "allreduce_%s_%s_%s", argv[1], argv[2],
                 dsim_dtype_name((dsim_dtype)t));
        tests[t] = (struct CMUnitTest){names[t], test_dtype, NULL, NULL, states[t]};
    }
    return _cmocka_run_group_tests(argv[1], tests, DSIM_DTYPE_COUNT, NULL, NULL);
}
