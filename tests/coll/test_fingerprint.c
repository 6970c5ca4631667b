/* Collective fingerprints: ranks that call different collectives, or the
 * same one with another dtype, count, op, root or algorithm, all fail at
 * once with a message naming both ranks and both calls, well before their
 * timeout (or, where they disagree on the root, at it); matched calls of
 * every kind are unaffected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "coll_harness.h"
#include "dsim/err.h"

#define MS ((int64_t)1000000)
#define NR 4

static int64_t fp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the text ---------------------------------------------------------- */

static void test_strings(void **state)
{
    (void)state;
    dsim_coll_fp a = {.magic = DSIM_COLL_FP_MAGIC,
                      .comm_id = 3,
                      .seq = 17,
                      .count = 36,
                      .root = -1,
                      .coll = DSIM_COLL_ALLREDUCE,
                      .op = DSIM_SUM,
                      .dtype = DSIM_F32,
                      .algo = DSIM_ALGO_TREE};
    dsim_coll_fp b = a;
    b.count = 18;
    b.dtype = DSIM_F64;
    char buf[128], diff[96];
    assert_string_equal(dsim_coll_fp_str(&a, buf, sizeof buf),
                        "allreduce #17 with 36 float32 (sum, tree)");
    assert_int_equal(dsim_coll_fp_diff(&a, &b, diff, sizeof diff), 2);
    assert_string_equal(diff, "dtype and count");
    assert_int_equal(dsim_coll_fp_diff(&a, &a, diff, sizeof diff), 0);
    assert_string_equal(diff, "");

    b = a;
    b.coll = DSIM_COLL_BROADCAST;
    b.op = DSIM_COLL_FP_NONE;
    b.root = 2;
    assert_int_equal(dsim_coll_fp_diff(&a, &b, diff, sizeof diff), 3);
    assert_string_equal(diff, "collective, reduce op and root");
    assert_string_equal(dsim_coll_fp_str(&b, buf, sizeof buf),
                        "broadcast #17 with 36 float32 from root 2 (tree)");
    b.coll = DSIM_COLL_REDUCE;
    b.op = DSIM_MAX;
    assert_string_equal(dsim_coll_fp_str(&b, buf, sizeof buf),
                        "reduce #17 with 36 float32 to root 2 (max, tree)");
    b.coll = DSIM_COLL_ALLGATHER;
    b.op = DSIM_COLL_FP_NONE;
    b.algo = DSIM_ALGO_RING;
    assert_string_equal(dsim_coll_fp_str(&b, buf, sizeof buf),
                        "allgather #17 with 36 float32 per rank (ring)");
    b.coll = DSIM_COLL_BARRIER;
    assert_string_equal(dsim_coll_fp_str(&b, buf, sizeof buf), "barrier #17");
    assert_string_equal(dsim_coll_kind_name(DSIM_COLL_REDUCE_SCATTER), "reduce_scatter");
    assert_string_equal(dsim_coll_kind_name((dsim_coll_kind)99), "unknown");
}

/* ---- mismatches -------------------------------------------------------- */

typedef enum fp_call {
    FP_ALLREDUCE,
    FP_BROADCAST,
    FP_REDUCE,
    FP_ALLGATHER,
    FP_REDUCE_SCATTER,
    FP_BARRIER,
} fp_call;

/* What one rank calls. */
typedef struct fp_spec {
    fp_call call;
    size_t count;
    dsim_dtype t;
    dsim_op op;
    int root;
    dsim_algo algo;
} fp_spec;

typedef struct fp_case {
    const char *name;
    int nranks;
    int odd;       /* the rank that calls `other` */
    fp_spec usual; /* what the other ranks call */
    fp_spec other;
    const char *differ; /* "dtype and count differ" */
    int fast;           /* 1: every rank fails long before the timeout */
} fp_case;

typedef struct fp_arg {
    coll_failures s;
    const fp_case *c;
    int64_t timeout_ns;
    dsim_err err[NR + 4];
    char msg[NR + 4][512];
    int64_t took[NR + 4];
    int finished[NR + 4]; /* the call itself returned DSIM_OK */
} fp_arg;

#define FP_MAXB ((size_t)8 << 20)

static dsim_err fp_do(dsim_comm *c, const fp_spec *sp, unsigned char *in, unsigned char *out)
{
    switch (sp->call) {
    case FP_ALLREDUCE:
        return dsim_allreduce_with(c, in, out, sp->count, sp->t, sp->op, sp->algo);
    case FP_BROADCAST:
        return dsim_broadcast(c, in, sp->count, sp->t, sp->root);
    case FP_REDUCE:
        return dsim_reduce(c, in, out, sp->count, sp->t, sp->op, sp->root);
    case FP_ALLGATHER:
        return dsim_allgather(c, in, out, sp->count, sp->t);
    case FP_REDUCE_SCATTER:
        return dsim_reduce_scatter(c, in, out, sp->count, sp->t, sp->op);
    case FP_BARRIER:
        return dsim_barrier(c);
    }
    return DSIM_EINVAL;
}

static void fp_rank(coll_harness *h, int rank, void *p)
{
    fp_arg *a = p;
    const fp_spec *sp = rank == a->c->odd ? &a->c->other : &a->c->usual;
    unsigned char *in = malloc(FP_MAXB), *out = malloc(FP_MAXB);
    if (!in || !out) {
        coll_fail(&a->s, "out of memory");
        free(in);
        free(out);
        return;
    }
    memset(in, rank == a->c->odd ? 0x5A : 0x11, FP_MAXB);
    memset(out, 0xEE, FP_MAXB);
    int64_t t0 = fp_now_ns();
    a->err[rank] = fp_do(h->comms[rank], sp, in, out);
    a->took[rank] = fp_now_ns() - t0;
    /* A rank whose part of a rooted collective was checked and done may
     * finish before the mismatch elsewhere is found; it learns at its next
     * call. */
    a->finished[rank] = a->err[rank] == DSIM_OK;
    if (a->finished[rank]) {
        /* Long enough for ranks that only find it through the failure check
         * after their own timeout. */
        dsim_comm_set_timeout(h->comms[rank], 10000 * MS);
        a->err[rank] = dsim_barrier(h->comms[rank]);
    }
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", dsim_errmsg());
    free(in);
    free(out);
}

static void fp_run_case(const fp_case *c)
{
    fp_arg a = {.c = c, .timeout_ns = c->fast ? 20000 * MS : 400 * MS};
    pthread_mutex_init(&a.s.mu, NULL);
    coll_harness h;
    coll_harness_cfg cfg = {.nranks = c->nranks, .comm_id = 7, .timeout_ns = a.timeout_ns};
    if (coll_harness_open(&h, &cfg) != DSIM_OK)
        fail_msg("%s: opening %d ranks: %s", c->name, c->nranks, dsim_errmsg());
    dsim_err e = coll_harness_run(&h, fp_rank, &a);
    coll_harness_close(&h);
    pthread_mutex_destroy(&a.s.mu);
    if (e != DSIM_OK)
        fail_msg("%s: running: %s", c->name, dsim_errmsg());
    if (a.s.failures)
        fail_msg("%s: %s", c->name, a.s.first);

    int direct = 0;
    for (int r = 0; r < c->nranks; r++)
        print_message("# %s: rank %d: %s: %s\n", c->name, r, dsim_strerror(a.err[r]), a.msg[r]);
    for (int r = 0; r < c->nranks; r++) {
        int rooted = c->usual.call == FP_BROADCAST || c->usual.call == FP_REDUCE ||
                     c->other.call == FP_BROADCAST || c->other.call == FP_REDUCE;
        if (a.err[r] == DSIM_OK || (a.finished[r] && !rooted))
            fail_msg("%s: rank %d finished its call as if nothing were wrong", c->name, r);
        if (!strstr(a.msg[r], "collective mismatch on communicator 7: rank "))
            fail_msg("%s: rank %d's error does not name the mismatch: %s", c->name, r, a.msg[r]);
        if (!strstr(a.msg[r], c->differ))
            fail_msg("%s: rank %d's error does not say \"%s\": %s", c->name, r, c->differ,
                     a.msg[r]);
        if (a.err[r] == DSIM_EPROTO)
            direct++;
        else if (a.err[r] != DSIM_EABORTED)
            fail_msg("%s: rank %d returned %s", c->name, r, dsim_strerror(a.err[r]));
        if (c->fast && a.took[r] > 2000 * MS)
            fail_msg("%s: rank %d took %lld ms to fail (timeout %lld ms)", c->name, r,
                     (long long)(a.took[r] / MS), (long long)(a.timeout_ns / MS));
    }
    if (!direct)
        fail_msg("%s: no rank found the mismatch itself", c->name);
}

#define AR(n, tt, o, al)                                                                           \
    {                                                                                              \
        FP_ALLREDUCE, (n), (tt), (o), 0, (al)                                                      \
    }

static const fp_case fp_cases[] = {
    /* The bug that passed silently before: 8 bytes either way. */
    {"2 float32 vs 1 float64 (ring)", 4, 1, AR(1, DSIM_F64, DSIM_SUM, DSIM_ALGO_RING),
     AR(2, DSIM_F32, DSIM_SUM, DSIM_ALGO_RING), "dtype and count differ", 1},
    {"2 float32 vs 1 float64 (rhd)", 4, 1, AR(1, DSIM_F64, DSIM_SUM, DSIM_ALGO_RHD),
     AR(2, DSIM_F32, DSIM_SUM, DSIM_ALGO_RHD), "dtype and count differ", 1},
    {"2 float32 vs 1 float64 (tree)", 4, 1, AR(1, DSIM_F64, DSIM_SUM, DSIM_ALGO_TREE),
     AR(2, DSIM_F32, DSIM_SUM, DSIM_ALGO_TREE), "dtype and count differ", 1},
    {"2 float32 vs 1 float64 (reduce_to_one)", 4, 1,
     AR(1, DSIM_F64, DSIM_SUM, DSIM_ALGO_REDUCE_TO_ONE),
     AR(2, DSIM_F32, DSIM_SUM, DSIM_ALGO_REDUCE_TO_ONE), "dtype and count differ", 1},
    {"2 float32 vs 1 float64 (auto, 2 ranks)", 2, 1, AR(1, DSIM_F64, DSIM_SUM, DSIM_ALGO_AUTO),
     AR(2, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO), "dtype and count differ", 1},
    {"36 float32 vs 18 float64 (auto, 5 ranks)", 5, 3, AR(18, DSIM_F64, DSIM_SUM, DSIM_ALGO_AUTO),
     AR(36, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO), "dtype and count differ", 1},
    {"the last rank's count (rhd, 7 ranks)", 7, 6, AR(100, DSIM_F32, DSIM_SUM, DSIM_ALGO_RHD),
     AR(99, DSIM_F32, DSIM_SUM, DSIM_ALGO_RHD), "count differs", 1},
    {"sum vs mean", 4, 2, AR(10, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO),
     AR(10, DSIM_F32, DSIM_MEAN, DSIM_ALGO_AUTO), "reduce op differs", 1},
    {"forced ring vs tree", 4, 0, AR(10, DSIM_F32, DSIM_SUM, DSIM_ALGO_TREE),
     AR(10, DSIM_F32, DSIM_SUM, DSIM_ALGO_RING), "algorithm differs", 1},
    /* Counts on both sides of the decision's threshold: the ranks run
     * different algorithms, and one finds the other's fingerprint while it
     * waits for a message that does not come. */
    {"counts across the tree/rhd threshold", 4, 2, AR(1000, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO),
     AR(100000, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO), "count and algorithm differ", 1},
    {"counts across the rhd/ring threshold (7 ranks)", 7, 5,
     AR(1 << 20, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO),
     AR(1 << 21, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO), "count and algorithm differ", 1},
    {"count 0 vs 5", 4, 3, AR(5, DSIM_I32, DSIM_SUM, DSIM_ALGO_AUTO),
     AR(0, DSIM_I32, DSIM_SUM, DSIM_ALGO_AUTO), "count differs", 1},
    {"allreduce vs broadcast",
     4,
     2,
     AR(10, DSIM_F32, DSIM_SUM, DSIM_ALGO_TREE),
     {FP_BROADCAST, 10, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_TREE},
     "collective, reduce op and root differ",
     1},
    {"barrier vs allreduce",
     4,
     1,
     {FP_BARRIER, 0, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     AR(4, DSIM_F32, DSIM_SUM, DSIM_ALGO_AUTO),
     "differ",
     1},
    {"allgather counts",
     4,
     2,
     {FP_ALLGATHER, 8, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     {FP_ALLGATHER, 9, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     "count differs",
     1},
    {"reduce_scatter dtypes",
     4,
     2,
     {FP_REDUCE_SCATTER, 8, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     {FP_REDUCE_SCATTER, 8, DSIM_I32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     "dtype differs",
     1},
    {"broadcast dtypes",
     5,
     4,
     {FP_BROADCAST, 8, DSIM_F32, DSIM_SUM, 1, DSIM_ALGO_AUTO},
     {FP_BROADCAST, 8, DSIM_I32, DSIM_SUM, 1, DSIM_ALGO_AUTO},
     "dtype differs",
     1},
    /* Ranks that disagree on the root run different trees: without the
     * answers a rooted collective waits for, every rank could finish. */
    {"broadcast roots",
     4,
     1,
     {FP_BROADCAST, 8, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     {FP_BROADCAST, 8, DSIM_F32, DSIM_SUM, 1, DSIM_ALGO_AUTO},
     "root differs",
     0},
    {"every rank its own broadcast root",
     4,
     2,
     {FP_BROADCAST, 8, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     {FP_BROADCAST, 8, DSIM_F32, DSIM_SUM, 2, DSIM_ALGO_AUTO},
     "root differs",
     0},
    {"reduce roots",
     4,
     3,
     {FP_REDUCE, 8, DSIM_F32, DSIM_SUM, 0, DSIM_ALGO_AUTO},
     {FP_REDUCE, 8, DSIM_F32, DSIM_SUM, 3, DSIM_ALGO_AUTO},
     "root differs",
     0},
};

static void test_mismatches(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof fp_cases / sizeof fp_cases[0]; i++)
        fp_run_case(&fp_cases[i]);
}

/* ---- matched calls ----------------------------------------------------- */

typedef struct ok_arg {
    coll_failures s;
} ok_arg;

static void ok_rank(coll_harness *h, int rank, void *p)
{
    ok_arg *a = p;
    dsim_comm *c = h->comms[rank];
    float in[64], out[64 * 8];
    memset(out, 0, sizeof out);
    for (int i = 0; i < 64; i++)
        in[i] = (float)(rank + i);
    dsim_err e = DSIM_OK;
    for (int round = 0; round < 3 && e == DSIM_OK; round++) {
        if (e == DSIM_OK)
            e = dsim_allreduce(c, in, out, 0, DSIM_F32, DSIM_SUM);
        if (e == DSIM_OK)
            e = dsim_allreduce(c, NULL, NULL, 0, DSIM_F64, DSIM_MAX);
        if (e == DSIM_OK)
            e = dsim_broadcast(c, NULL, 0, DSIM_F32, round % h->n);
        if (e == DSIM_OK)
            e = dsim_reduce(c, NULL, NULL, 0, DSIM_F32, DSIM_SUM, 1 % h->n);
        if (e == DSIM_OK)
            e = dsim_allgather(c, NULL, NULL, 0, DSIM_I32);
        if (e == DSIM_OK)
            e = dsim_reduce_scatter(c, NULL, NULL, 0, DSIM_I32, DSIM_SUM);
        for (int al = 0; al < DSIM_ALGO_COUNT && e == DSIM_OK; al++)
            e = dsim_allreduce_with(c, in, out, 37, DSIM_F32, DSIM_SUM, (dsim_algo)al);
        if (e == DSIM_OK)
            e = dsim_broadcast(c, in, 64, DSIM_F32, (round + 1) % h->n);
        if (e == DSIM_OK)
            e = dsim_reduce(c, in, out, 64, DSIM_F32, DSIM_MAX, round % h->n);
        if (e == DSIM_OK)
            e = dsim_allgather(c, in, out, 64, DSIM_F32);
        if (e == DSIM_OK)
            e = dsim_reduce_scatter(c, out, in, 8, DSIM_F32, DSIM_SUM);
        if (e == DSIM_OK)
            e = dsim_barrier(c);
    }
    if (e != DSIM_OK) {
        coll_fail(&a->s, "rank %d: %s", rank, dsim_errmsg());
        return;
    }
    const dsim_coll_fp *fp = dsim_comm_fingerprint(c);
    if (fp->seq != 3 * (6 + DSIM_ALGO_COUNT + 5) || fp->coll != DSIM_COLL_BARRIER ||
        fp->comm_id != 7)
        coll_fail(&a->s, "rank %d: the last fingerprint is seq %llu, %s, comm %u", rank,
                  (unsigned long long)fp->seq, dsim_coll_kind_name((dsim_coll_kind)fp->coll),
                  (unsigned)fp->comm_id);
}

static void test_matched_calls(void **state)
{
    (void)state;
    for (int n = 1; n <= 6; n++) {
        ok_arg a;
        memset(&a, 0, sizeof a);
        pthread_mutex_init(&a.s.mu, NULL);
        coll_harness h;
        coll_harness_cfg cfg = {.nranks = n, .comm_id = 7, .timeout_ns = 10000 * MS};
        assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
        assert_int_equal(coll_harness_run(&h, ok_rank, &a), DSIM_OK);
        coll_harness_close(&h);
        pthread_mutex_destroy(&a.s.mu);
        if (a.s.failures)
            fail_msg("%d ranks: %s", n, a.s.first);
    }
}

/* ---- the flight recorder ------------------------------------------------ */

typedef struct fr_arg {
    coll_failures s;
    dsim_fr_dump d[3];
} fr_arg;

static void fr_rank(coll_harness *h, int rank, void *p)
{
    fr_arg *a = p;
    dsim_comm *c = h->comms[rank];
    float buf[8] = {0};
    for (int i = 0; i < 11; i++)
        if (dsim_allreduce(c, buf, buf, 8, DSIM_F32, DSIM_SUM) != DSIM_OK)
            coll_fail(&a->s, "rank %d call %d: %s", rank, i, dsim_errmsg());
    /* call 12: rank 2 never makes it; the others time out in it */
    if (rank != 2 && dsim_allreduce(c, buf, buf, 4, DSIM_F32, DSIM_MAX) == DSIM_OK)
        coll_fail(&a->s, "rank %d: the all-reduce without rank 2 succeeded", rank);
    coll_harness_sync(h);
    if (dsim_comm_flight_dump(c, &a->d[rank]) != DSIM_OK)
        coll_fail(&a->s, "rank %d: dump: %s", rank, dsim_errmsg());
}

/* ---- a rank without fingerprints ------------------------------------- */

typedef struct plain_arg {
    coll_failures s;
    dsim_algo algo;
    dsim_err err[NR];
    char msg[NR][512];
} plain_arg;

static void plain_rank(coll_harness *h, int rank, void *p)
{
    plain_arg *a = p;
    float buf[64];
    for (int i = 0; i < 64; i++)
        buf[i] = (float)rank;
    a->err[rank] = dsim_allreduce_with(h->comms[rank], buf, buf, 64, DSIM_F32, DSIM_SUM, a->algo);
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", dsim_errmsg());
}

/* The fingerprint rides on the payload: a payload that comes without one
 * where one is due is from a rank whose communicator runs without
 * fingerprints, and the rank that received it says so. */
static void test_rank_without_fingerprints(void **state)
{
    (void)state;
    static const dsim_algo algos[] = {DSIM_ALGO_RING, DSIM_ALGO_RHD, DSIM_ALGO_TREE,
                                      DSIM_ALGO_REDUCE_TO_ONE};
    for (size_t k = 0; k < sizeof algos / sizeof algos[0]; k++) {
        plain_arg a = {.algo = algos[k]};
        pthread_mutex_init(&a.s.mu, NULL);
        coll_harness h;
        coll_harness_cfg cfg = {.nranks = 4, .comm_id = 7, .timeout_ns = 400 * MS, .plain_rank = 3};
        assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
        assert_int_equal(coll_harness_run(&h, plain_rank, &a), DSIM_OK);
        coll_harness_close(&h);
        pthread_mutex_destroy(&a.s.mu);
        int named = 0;
        for (int r = 0; r < 4; r++) {
            /* Every rank learns it (the fabric is revoked), none at its
             * timeout. */
            if (a.err[r] != DSIM_EPROTO && a.err[r] != DSIM_EABORTED)
                fail_msg("%s: rank %d returned %s: %s", dsim_algo_name(algos[k]), r,
                         dsim_strerror(a.err[r]), a.msg[r]);
            print_message("# %s: rank %d: %s: %s\n", dsim_algo_name(algos[k]), r,
                          dsim_strerror(a.err[r]), a.msg[r]);
            if (a.err[r] == DSIM_EPROTO &&
                strstr(a.msg[r], "rank 2 sent its data without the collective fingerprint") &&
                strstr(a.msg[r], "no_fingerprint must be the same on every rank"))
                named++;
        }
        if (!named)
            fail_msg("%s: no rank said that rank 2 runs without fingerprints",
                     dsim_algo_name(algos[k]));
    }
}

static void test_flight_recorder(void **state)
{
    (void)state;
    fr_arg a;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.s.mu, NULL);
    coll_harness h;
    coll_harness_cfg cfg = {.nranks = 3, .comm_id = 5, .timeout_ns = 200 * MS};
    assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
    /* a recorder of 5 calls: the ring wraps */
    for (int r = 0; r < 3; r++) {
        dsim_comm_destroy(h.comms[r]);
        dsim_comm_cfg cc = {
            .ep = h.eps[r], .size = 3, .comm_id = 5, .timeout_ns = 200 * MS, .flight_recorder = 5};
        assert_int_equal(dsim_comm_create(&cc, &h.comms[r]), DSIM_OK);
    }
    assert_int_equal(coll_harness_run(&h, fr_rank, &a), DSIM_OK);
    coll_harness_close(&h);
    pthread_mutex_destroy(&a.s.mu);
    if (a.s.failures)
        fail_msg("%s", a.s.first);

    const dsim_fr_dump *d0 = &a.d[0], *d2 = &a.d[2];
    assert_int_equal(d0->calls, 12);
    assert_int_equal(d0->n, 5);
    assert_int_equal(d0->comm_id, 5);
    for (size_t i = 0; i < 4; i++) {
        const dsim_fr_entry *e = &d0->entries[i];
        assert_int_equal(e->fp.seq, 8 + i);
        assert_int_equal(e->fp.coll, DSIM_COLL_ALLREDUCE);
        assert_int_equal(e->fp.count, 8);
        assert_int_equal(e->state, DSIM_FR_COMPLETED);
        assert_int_equal(e->error, 0);
        assert_int_equal(e->waiting_for, -1);
        assert_true(e->t_created <= e->t_started && e->t_started <= e->t_completed);
    }
    const dsim_fr_entry *last = &d0->entries[4];
    assert_int_equal(last->fp.seq, 12);
    assert_int_equal(last->fp.coll, DSIM_COLL_ALLREDUCE);
    assert_int_equal(last->fp.count, 4);
    assert_int_equal(last->fp.op, DSIM_MAX);
    assert_int_equal(last->state, DSIM_FR_STARTED);
    assert_int_not_equal(last->error, 0);
    assert_true(last->waiting_for == 1 || last->waiting_for == 2);
    assert_true(last->t_completed >= last->t_started);
    assert_string_equal(dsim_fr_state_name(DSIM_FR_STARTED), "started");
    /* rank 2 made 11 calls, all completed */
    assert_int_equal(d2->calls, 11);
    assert_int_equal(d2->entries[d2->n - 1].fp.seq, 11);
    assert_int_equal(d2->entries[d2->n - 1].state, DSIM_FR_COMPLETED);
    for (int r = 0; r < 3; r++)
        dsim_fr_dump_free(&a.d[r]);

    /* off */
    dsim_fr_dump none;
    coll_harness h1;
    coll_harness_cfg c1 = {.nranks = 1};
    assert_int_equal(coll_harness_open(&h1, &c1), DSIM_OK);
    dsim_comm_destroy(h1.comms[0]);
    dsim_comm_cfg off = {.ep = h1.eps[0], .size = 1, .flight_recorder = -1};
    assert_int_equal(dsim_comm_create(&off, &h1.comms[0]), DSIM_OK);
    assert_int_equal(dsim_barrier(h1.comms[0]), DSIM_OK);
    assert_int_equal(dsim_comm_flight_dump(h1.comms[0], &none), DSIM_OK);
    assert_int_equal(none.calls, 1);
    assert_int_equal(none.n, 0);
    dsim_fr_dump_free(&none);
    coll_harness_close(&h1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strings),         cmocka_unit_test(test_mismatches),
        cmocka_unit_test(test_matched_calls),   cmocka_unit_test(test_rank_without_fingerprints),
        cmocka_unit_test(test_flight_recorder),
    };
    return cmocka_run_group_tests_name("fingerprint", tests, NULL, NULL);
}
