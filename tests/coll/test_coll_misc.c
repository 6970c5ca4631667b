/* Collectives beyond the result matrix: determinism with non-integer data,
 * failures (a rank that never joins, an abort mid-collective, a late rank
 * whose stale messages must not feed the next call), argument errors, and
 * how the allreduce algorithm is chosen. */
#include <setjmp.h>
#include <stdatomic.h>
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
#include "dsim/rng.h"

#define MS ((int64_t)1000000)

static const dsim_algo misc_algos[] = {DSIM_ALGO_RING, DSIM_ALGO_RHD, DSIM_ALGO_TREE,
                                       DSIM_ALGO_REDUCE_TO_ONE, DSIM_ALGO_RECURSIVE_DOUBLING};
#define MISC_NALGOS 5

typedef coll_failures misc_shared;

static void misc_sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Opens n ranks, runs fn, closes; fails the cmocka test on any recorded
 * failure. */
static void misc_run_fp(int n, int64_t timeout_ns, int no_fingerprint, coll_rank_fn fn, void *arg,
                        misc_shared *s)
{
    coll_harness h;
    coll_harness_cfg cfg = {
        .nranks = n, .timeout_ns = timeout_ns, .no_fingerprint = no_fingerprint};
    if (coll_harness_open(&h, &cfg) != DSIM_OK)
        fail_msg("opening %d ranks: %s", n, dsim_errmsg());
    dsim_err e = coll_harness_run(&h, fn, arg);
    coll_harness_close(&h);
    if (e != DSIM_OK)
        fail_msg("running %d ranks: %s", n, dsim_errmsg());
    if (s->failures)
        fail_msg("%d failure(s); the first: %s", s->failures, s->first);
}

static void misc_run(int n, int64_t timeout_ns, coll_rank_fn fn, void *arg, misc_shared *s)
{
    misc_run_fp(n, timeout_ns, 0, fn, arg, s);
}

/* ---- determinism ----------------------------------------------------- */

#define DET_COUNT 100003

typedef struct det_arg {
    misc_shared s;
    dsim_algo algo;
    dsim_dtype t;
    dsim_op op;
    void *res[2][16];
} det_arg;

static void det_fill(dsim_dtype t, int rank, void *buf)
{
    dsim_rng rng;
    dsim_rng_init(&rng, 42, "coll.test.determinism", (uint64_t)rank);
    for (size_t i = 0; i < DET_COUNT; i++) {
        float v = (float)(dsim_rng_uniform(&rng) * 2.0 - 1.0);
        if (t == DSIM_F32)
            ((float *)buf)[i] = v;
        else
            ((uint16_t *)buf)[i] = dsim_f32_to_bf16(v);
    }
}

/* The documented combination order of each algorithm, for SUM: a + b
 * rounded to the dtype after every combination, as one dsim_irecv_reduce
 * does. v[r] is rank r's element; i and count place the element in its
 * block. */
static float det_add(dsim_dtype t, float a, float b)
{
    float s = a + b;
    return t == DSIM_F32 ? s : dsim_bf16_to_f32(dsim_f32_to_bf16(s));
}

static float det_tree_acc(dsim_dtype t, const float *v, int n, int r)
{
    float acc = v[r];
    for (int mask = 1; mask < n && !(r & mask); mask <<= 1)
        if (r + mask < n)
            acc = det_add(t, acc, det_tree_acc(t, v, n, r + mask));
    return acc;
}

static float det_rhd_t(dsim_dtype t, const float *u, int p, int q, int k)
{
    if (k == 0)
        return u[q];
    int d = p >> k;
    return det_add(t, det_rhd_t(t, u, p, q, k - 1), det_rhd_t(t, u, p, q ^ d, k - 1));
}

/* Recursive doubling: the ranks q .. q+size-1 (new numbering), the lower
 * half's partial result on the left. */
static float det_rd(dsim_dtype t, const float *u, int q, int size)
{
    if (size == 1)
        return u[q];
    return det_add(t, det_rd(t, u, q, size / 2), det_rd(t, u, q + size / 2, size / 2));
}

static float det_reference(dsim_algo algo, dsim_dtype t, const float *v, int n, size_t i,
                           size_t count)
{
    float acc;
    switch (algo) {
    case DSIM_ALGO_RING: {
        /* the block of element i, as src/coll splits count over n */
        int k = 0;
        while (k + 1 < n && (size_t)(k + 1) * (count / n) +
                                    ((size_t)(k + 1) < count % n ? (size_t)(k + 1) : count % n) <=
                                i)
            k++;
        acc = v[k];
        for (int j = 1; j < n; j++)
            acc = det_add(t, v[(k + j) % n], acc);
        return acc;
    }
    case DSIM_ALGO_RHD: {
        int p = 1, levels = 0;
        while (p * 2 <= n) {
            p *= 2;
            levels++;
        }
        int rem = n - p;
        float u[16];
        for (int q = 0; q < p; q++)
            u[q] = q < rem ? det_add(t, v[2 * q + 1], v[2 * q]) : v[q + rem];
        int b = 0;
        while (b + 1 < p && (size_t)(b + 1) * (count / p) +
                                    ((size_t)(b + 1) < count % p ? (size_t)(b + 1) : count % p) <=
                                i)
            b++;
        return det_rhd_t(t, u, p, b, levels);
    }
    case DSIM_ALGO_TREE:
        return det_tree_acc(t, v, n, 0);
    case DSIM_ALGO_RECURSIVE_DOUBLING: {
        int p = 1;
        while (p * 2 <= n)
            p *= 2;
        int rem = n - p;
        float u[16];
        for (int q = 0; q < p; q++)
            u[q] = q < rem ? det_add(t, v[2 * q], v[2 * q + 1]) : v[q + rem];
        return det_rd(t, u, 0, p);
    }
    default:
        acc = v[0];
        for (int r = 1; r < n; r++)
            acc = det_add(t, acc, v[r]);
        return acc;
    }
}

static void det_rank(coll_harness *h, int rank, void *p)
{
    det_arg *a = p;
    int n = h->n;
    size_t es = dsim_dtype_size(a->t);
    for (int run = 0; run < 2; run++)
        a->res[run][rank] = malloc(DET_COUNT * es);
    char *in = malloc(DET_COUNT * es);
    if (!in || !a->res[0][rank] || !a->res[1][rank]) {
        coll_fail(&a->s, "out of memory");
        goto out;
    }
    for (int run = 0; run < 2; run++) {
        det_fill(a->t, rank, in);
        /* The second run starts the ranks in the opposite order, so any
         * combination that followed arrival order would change. */
        misc_sleep_us(300L * (run == 0 ? rank : n - 1 - rank));
        void *dst = a->res[run][rank];
        int inplace = run == 1;
        if (inplace)
            memcpy(dst, in, DET_COUNT * es);
        dsim_err e = dsim_allreduce_with(h->comms[rank], inplace ? dst : in, dst, DET_COUNT, a->t,
                                         a->op, a->algo);
        if (e != DSIM_OK)
            coll_fail(&a->s, "%s run %d rank %d: %s", dsim_algo_name(a->algo), run, rank,
                      dsim_errmsg());
    }
    coll_harness_sync(h);
    if (a->s.failures)
        goto out;
    for (int run = 0; run < 2; run++)
        if (memcmp(a->res[run][rank], a->res[0][0], DET_COUNT * es) != 0)
            coll_fail(&a->s, "%s %s %s, %d ranks: rank %d's run %d differs from rank 0's run 0",
                      dsim_algo_name(a->algo), dsim_dtype_name(a->t), dsim_op_name(a->op), n, rank,
                      run);
    /* Identical bits must still be the right sum: compare a slice with the
     * sum in double, within the rounding of n-1 additions in the dtype. */
    if (rank == 0) {
        double eps = a->t == DSIM_F32 ? 0x1p-24 : 0x1p-8;
        char *all = malloc((size_t)n * DET_COUNT * es);
        if (!all) {
            coll_fail(&a->s, "out of memory");
            goto out;
        }
        for (int r = 0; r < n; r++)
            det_fill(a->t, r, all + (size_t)r * DET_COUNT * es);
        for (size_t i = 0; i < DET_COUNT; i += 97) {
            double sum = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                double v = dsim_dtype_get(a->t, all + (size_t)r * DET_COUNT * es, i);
                sum += v;
                mag += v < 0 ? -v : v;
            }
            if (a->op == DSIM_MEAN) {
                sum /= n;
                mag /= n;
            }
            double got = dsim_dtype_get(a->t, a->res[0][0], i);
            if (a->op == DSIM_SUM) {
                float v[16];
                for (int r = 0; r < n; r++)
                    v[r] = (float)dsim_dtype_get(a->t, all + (size_t)r * DET_COUNT * es, i);
                float want = det_reference(a->algo, a->t, v, n, i, DET_COUNT);
                if ((float)got != want) {
                    coll_fail(&a->s,
                              "%s %s sum, %d ranks, element %zu: got %.9g, the algorithm's "
                              "documented order gives %.9g",
                              dsim_algo_name(a->algo), dsim_dtype_name(a->t), n, i, got,
                              (double)want);
                    break;
                }
            }
            double err = got - sum;
            if (err < 0)
                err = -err;
            if (err > (n + 1) * eps * mag + 1e-30) {
                coll_fail(&a->s, "%s %s %s, %d ranks, element %zu: got %.9g, want %.9g",
                          dsim_algo_name(a->algo), dsim_dtype_name(a->t), dsim_op_name(a->op), n, i,
                          got, sum);
                break;
            }
        }
        free(all);
    }
out:
    coll_harness_sync(h);
    free(in);
}

static void test_determinism(void **state)
{
    (void)state;
    static const int ranks[] = {3, 4, 7};
    static const dsim_dtype types[] = {DSIM_F32, DSIM_BF16};
    static const dsim_op ops[] = {DSIM_SUM, DSIM_MEAN};
    for (int ai = 0; ai < MISC_NALGOS; ai++)
        for (int ri = 0; ri < 3; ri++)
            for (int ti = 0; ti < 2; ti++)
                for (int oi = 0; oi < 2; oi++) {
                    det_arg a = {.algo = misc_algos[ai], .t = types[ti], .op = ops[oi]};
                    pthread_mutex_init(&a.s.mu, NULL);
                    misc_run(ranks[ri], 20000 * MS, det_rank, &a, &a.s);
                    for (int run = 0; run < 2; run++)
                        for (int r = 0; r < ranks[ri]; r++)
                            free(a.res[run][r]);
                    pthread_mutex_destroy(&a.s.mu);
                }
}

/* ---- recursive doubling: one order on both ranks of a pair ----------- */

/* Every rank computes every element, so a pair must combine in one order:
 * x86 keeps the first operand's payload of two NaNs, and max(+0, -0) or
 * min gives either zero by order. Rank r's element 0 is a NaN with payload
 * r + 1, element 1 a zero of sign r % 2, element 2 -0 on every rank but
 * the last, element 3 a number; every rank's result must be rank 0's bits. */
#define RDO_COUNT 4

typedef struct rdo_arg {
    misc_shared s;
    dsim_dtype t;
    dsim_op op;
    unsigned char res[16][RDO_COUNT * 8];
} rdo_arg;

static void rdo_rank(coll_harness *h, int rank, void *p)
{
    rdo_arg *a = p;
    unsigned char in[RDO_COUNT * 8];
    size_t es = dsim_dtype_size(a->t);
    for (int k = 0; k < RDO_COUNT; k++) {
        double v = k == 1   ? (rank % 2 ? -0.0 : 0.0)
                   : k == 2 ? (rank == h->n - 1 ? 0.0 : -0.0)
                            : 1.0 + rank * 0.25;
        if (a->t == DSIM_F32) {
            float f = (float)v;
            if (k == 0) {
                uint32_t bits = 0x7fc00000u | (uint32_t)(rank + 1);
                memcpy(&f, &bits, sizeof f);
            }
            memcpy(in + k * es, &f, es);
        } else {
            if (k == 0) {
                uint64_t bits = 0x7ff8000000000000ull | (uint64_t)(rank + 1);
                memcpy(&v, &bits, sizeof v);
            }
            memcpy(in + k * es, &v, es);
        }
    }
    dsim_err e = dsim_allreduce_with(h->comms[rank], in, a->res[rank], RDO_COUNT, a->t, a->op,
                                     DSIM_ALGO_RECURSIVE_DOUBLING);
    if (e != DSIM_OK)
        coll_fail(&a->s, "rank %d: %s", rank, dsim_errmsg());
    coll_harness_sync(h);
    if (!a->s.failures && memcmp(a->res[rank], a->res[0], RDO_COUNT * es) != 0) {
        char got[200];
        int o = 0;
        for (size_t b = 0; b < RDO_COUNT * es && o < 180; b += es) {
            uint64_t u0 = 0, u1 = 0;
            memcpy(&u0, a->res[rank] + b, es);
            memcpy(&u1, a->res[0] + b, es);
            o += snprintf(got + o, sizeof got - (size_t)o, " %llx/%llx", (unsigned long long)u0,
                          (unsigned long long)u1);
        }
        coll_fail(&a->s, "%s %s, %d ranks: rank %d's bits differ from rank 0's:%s",
                  dsim_dtype_name(a->t), dsim_op_name(a->op), h->n, rank, got);
    }
    coll_harness_sync(h);
}

static void test_recursive_doubling_order(void **state)
{
    (void)state;
    static const int ranks[] = {2, 3, 4, 6, 8};
    static const dsim_op ops[] = {DSIM_SUM, DSIM_MAX, DSIM_MIN, DSIM_PROD, DSIM_MEAN};
    static const dsim_dtype types[] = {DSIM_F32, DSIM_F64};
    for (size_t ri = 0; ri < sizeof ranks / sizeof ranks[0]; ri++)
        for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++)
            for (int ti = 0; ti < 2; ti++) {
                rdo_arg a = {.t = types[ti], .op = ops[oi]};
                pthread_mutex_init(&a.s.mu, NULL);
                misc_run(ranks[ri], 20000 * MS, rdo_rank, &a, &a.s);
                pthread_mutex_destroy(&a.s.mu);
            }
}

/* ---- a rank that never joins ----------------------------------------- */

typedef enum absent_call {
    ABSENT_ALLREDUCE,
    ABSENT_ALLGATHER,
    ABSENT_REDUCE_SCATTER,
    ABSENT_BARRIER
} absent_call;

typedef struct absent_arg {
    misc_shared s;
    absent_call call;
    dsim_algo algo;
    int absent;
    int64_t timeout_ns;
} absent_arg;

static void absent_rank(coll_harness *h, int rank, void *p)
{
    absent_arg *a = p;
    if (rank == a->absent)
        return;
    int n = h->n;
    dsim_comm *c = h->comms[rank];
    float sb[64] = {0}, rb[64 * 16];
    char prefix[64];
    int64_t t0 = dsim_rt_now(h->rt);
    dsim_err e;
    switch (a->call) {
    case ABSENT_ALLGATHER:
        snprintf(prefix, sizeof prefix, "allgather(ring) step ");
        e = dsim_allgather(c, sb, rb, 4, DSIM_F32);
        break;
    case ABSENT_REDUCE_SCATTER:
        snprintf(prefix, sizeof prefix, "reduce_scatter(ring) step ");
        e = dsim_reduce_scatter(c, rb, sb, 4, DSIM_F32, DSIM_SUM);
        break;
    case ABSENT_BARRIER:
        snprintf(prefix, sizeof prefix, "barrier(dissemination) step ");
        e = dsim_barrier(c);
        break;
    default:
        snprintf(prefix, sizeof prefix, "allreduce(%s) step ", dsim_algo_name(a->algo));
        e = dsim_allreduce_with(c, sb, rb, 64, DSIM_F32, DSIM_SUM, a->algo);
        break;
    }
    int64_t took = dsim_rt_now(h->rt) - t0;
    const dsim_error *ce = dsim_comm_error(c);
    const dsim_error *te = dsim_last_error();
    char want_ms[64], want_rank[32];
    snprintf(want_ms, sizeof want_ms, "timed out after %lld ms waiting for rank ",
             (long long)(a->timeout_ns / MS));
    snprintf(want_rank, sizeof want_rank, "rank %d", a->absent);
    if (e != DSIM_ETIMEDOUT)
        coll_fail(&a->s, "%s%d ranks, rank %d absent: rank %d returned %s, want a timeout: %s",
                  prefix, n, a->absent, rank, dsim_strerror(e), dsim_errmsg());
    else if (ce->code != DSIM_ETIMEDOUT || ce->peer != a->absent || te->peer != a->absent)
        coll_fail(&a->s,
                  "%s%d ranks, rank %d absent: rank %d blames rank %d (thread: %d), code %s: %s",
                  prefix, n, a->absent, rank, ce->peer, te->peer, dsim_strerror(ce->code), ce->msg);
    else if (strncmp(ce->msg, prefix, strlen(prefix)) != 0 || !strstr(ce->msg, want_ms) ||
             !strstr(ce->msg, want_rank) || strcmp(ce->msg, te->msg) != 0)
        coll_fail(&a->s, "rank %d: the message \"%s\" should start \"%s\" and name %s", rank,
                  ce->msg, prefix, want_rank);
    /* Not before the deadline; after it, at most the failure check's grace
     * (timeout / 2) plus slack for a loaded machine or a sanitizer. */
    if (took < a->timeout_ns - 2 * MS || took > a->timeout_ns * 3 / 2 + 1500 * MS)
        coll_fail(&a->s, "%s: rank %d failed after %lld ms with a %lld ms timeout", prefix, rank,
                  (long long)(took / MS), (long long)(a->timeout_ns / MS));
}

static void absent_case(int n, absent_call call, dsim_algo algo, int absent)
{
    absent_arg a = {.call = call, .algo = algo, .absent = absent, .timeout_ns = 200 * MS};
    pthread_mutex_init(&a.s.mu, NULL);
    misc_run(n, a.timeout_ns, absent_rank, &a, &a.s);
    pthread_mutex_destroy(&a.s.mu);
}

static void test_absent_rank(void **state)
{
    (void)state;
    for (int ai = 0; ai < MISC_NALGOS; ai++) {
        absent_case(4, ABSENT_ALLREDUCE, misc_algos[ai], 3);
        absent_case(4, ABSENT_ALLREDUCE, misc_algos[ai], 0);
        absent_case(5, ABSENT_ALLREDUCE, misc_algos[ai], 2);
    }
    absent_case(6, ABSENT_ALLREDUCE, DSIM_ALGO_RHD, 4); /* a rank that folds in */
    absent_case(4, ABSENT_ALLGATHER, DSIM_ALGO_AUTO, 1);
    absent_case(4, ABSENT_REDUCE_SCATTER, DSIM_ALGO_AUTO, 2);
    absent_case(5, ABSENT_BARRIER, DSIM_ALGO_AUTO, 4);
}

/* ---- a late rank is not blamed as absent ---------------------------- */

/* Ring on 4 ranks, 1 s timeout: rank 3 never joins, rank 1 joins 600 ms
 * late. Rank 1's first message reaches rank 2 long before rank 2's deadline
 * (1 s), but rank 1's own deadline (1.6 s) comes after rank 2's failure
 * check has given up (1 s + 500 ms grace), so rank 2 hears no answer from
 * it. Rank 1 did send in this call, so rank 2 must not say it never joined.
 * Ranks 0 and 1 name rank 3. */
static void late_rank(coll_harness *h, int rank, void *p)
{
    misc_shared *s = p;
    if (rank == 3)
        return;
    if (rank == 1)
        misc_sleep_us(600 * 1000);
    float b[64] = {0};
    dsim_err e = dsim_allreduce_with(h->comms[rank], b, b, 64, DSIM_F32, DSIM_SUM, DSIM_ALGO_RING);
    const dsim_error *ce = dsim_comm_error(h->comms[rank]);
    if (e != DSIM_ETIMEDOUT) {
        coll_fail(s, "rank %d returned %s, want a timeout", rank, dsim_strerror(e));
        return;
    }
    if (ce->peer == 1 && strstr(ce->msg, "never joined"))
        coll_fail(s, "rank %d blames rank 1, which joined late, as absent: %s", rank, ce->msg);
    if (ce->peer == 1 && !strstr(ce->msg, "joined this call but did not answer"))
        coll_fail(s, "rank %d blames rank 1 without saying it joined: %s", rank, ce->msg);
    if (ce->peer != 1 && ce->peer != 3)
        coll_fail(s, "rank %d names rank %d: %s", rank, ce->peer, ce->msg);
}

static void test_late_rank_not_absent(void **state)
{
    (void)state;
    misc_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    misc_run(4, 1000 * MS, late_rank, &s, &s);
    pthread_mutex_destroy(&s.mu);
}

/* ---- a late rank's stale messages ------------------------------------ */

/* Rank 1 joins call k only after rank 0 gave up on it and moved on to call
 * k+1. Rank 1's call-k messages carry junk; if they matched rank 0's call
 * k+1, rank 0's result would include the junk. With wrap set, the next real
 * call is k + 0xFFFFF, whose tags repeat call k's (the tag keeps the call
 * number mod 0xFFFFF): the junk still waiting at rank 0 must not match it
 * either. The calls in between have count 0 and move nothing. */
typedef struct stale_arg {
    misc_shared s;
    dsim_algo algo;
    int wrap;
} stale_arg;

static void stale_rank(coll_harness *h, int rank, void *p)
{
    stale_arg *a = p;
    dsim_comm *c = h->comms[rank];
    enum { N = 1000 };
    float junk[N], in[N], out[N];
    char msg[300];
    for (int i = 0; i < N; i++)
        junk[i] = 1000.0f;
    coll_fill(DSIM_F32, DSIM_SUM, rank, in, 0, N);
    if (rank == 1)
        misc_sleep_us(400 * 1000);
    dsim_comm_set_timeout(c, (rank == 0 ? 100 : 150) * MS);
    dsim_err e = dsim_allreduce_with(c, junk, out, N, DSIM_F32, DSIM_SUM, a->algo);
    /* Recursive doubling on two ranks is one exchange: rank 0 sent its whole
     * buffer before it gave up, so the late rank 1 has everything it needs
     * and may finish (with the right sum of the two calls' buffers). */
    int may_finish = rank == 1 && a->algo == DSIM_ALGO_RECURSIVE_DOUBLING;
    if (may_finish && e == DSIM_OK) {
        for (int i = 0; i < N; i++)
            if (out[i] != 2000.0f) {
                coll_fail(&a->s, "%s: rank 1 finished the abandoned call with %g at %d, want 2000",
                          dsim_algo_name(a->algo), (double)out[i], i);
                break;
            }
    } else if (e != DSIM_ETIMEDOUT)
        coll_fail(&a->s, "%s: rank %d's abandoned call returned %s, want a timeout",
                  dsim_algo_name(a->algo), rank, dsim_strerror(e));
    dsim_comm_set_timeout(c, 10000 * MS);
    for (long k = 1; a->wrap && k < 0xFFFFF; k++)
        if ((e = dsim_allreduce_with(c, NULL, NULL, 0, DSIM_F32, DSIM_SUM, a->algo)) != DSIM_OK) {
            coll_fail(&a->s, "rank %d: count-0 call %ld failed: %s", rank, k, dsim_errmsg());
            return;
        }
    e = dsim_allreduce_with(c, in, out, N, DSIM_F32, DSIM_SUM, a->algo);
    if (e != DSIM_OK)
        coll_fail(&a->s, "%s%s: rank %d's next call failed: %s", dsim_algo_name(a->algo),
                  a->wrap ? " (tag wrap)" : "", rank, dsim_errmsg());
    else if (coll_check(DSIM_F32, DSIM_SUM, 2, out, 0, N, msg, sizeof msg) >= 0)
        coll_fail(&a->s, "%s%s: rank %d's next call took in stale data: %s",
                  dsim_algo_name(a->algo), a->wrap ? " (tag wrap)" : "", rank, msg);
}

static void test_stale_messages(void **state)
{
    (void)state;
    for (int wrap = 0; wrap < 2; wrap++)
        for (int ai = 0; ai < MISC_NALGOS; ai++) {
            stale_arg a = {.algo = misc_algos[ai], .wrap = wrap};
            pthread_mutex_init(&a.s.mu, NULL);
            /* The tag wrap takes 0xFFFFF calls: without fingerprints the
             * count-0 ones among them move nothing and take no time. */
            misc_run_fp(2, 10000 * MS, wrap, stale_rank, &a, &a.s);
            pthread_mutex_destroy(&a.s.mu);
        }
}

/* ---- abort mid-collective -------------------------------------------- */

#define ABORT_COUNT (1 << 20)

typedef struct abort_arg {
    misc_shared s;
    dsim_algo algo;
    coll_harness *h;
    int64_t abort_at; /* set just before the abort */
    int calls[16];
} abort_arg;

static void *abort_thread(void *p)
{
    abort_arg *a = p;
    misc_sleep_us(60 * 1000);
    __atomic_store_n(&a->abort_at, dsim_rt_now(a->h->rt), __ATOMIC_SEQ_CST);
    dsim_fabric_abort(a->h->fab, 2, "rank 2 was stopped by the test");
    return NULL;
}

static void abort_rank(coll_harness *h, int rank, void *p)
{
    abort_arg *a = p;
    float *buf = malloc(ABORT_COUNT * sizeof *buf);
    if (!buf) {
        coll_fail(&a->s, "out of memory");
        return;
    }
    for (size_t i = 0; i < ABORT_COUNT; i++)
        buf[i] = 1.0f;
    dsim_err e = DSIM_OK;
    int calls = 0;
    while (e == DSIM_OK && calls < 100000) {
        e = dsim_allreduce_with(h->comms[rank], buf, buf, ABORT_COUNT, DSIM_F32, DSIM_MAX, a->algo);
        calls++;
    }
    int64_t back = dsim_rt_now(h->rt);
    int64_t at = __atomic_load_n(&a->abort_at, __ATOMIC_SEQ_CST);
    const dsim_error *ce = dsim_comm_error(h->comms[rank]);
    if (e != DSIM_EABORTED || ce->code != DSIM_EABORTED || ce->peer != 2 ||
        !strstr(ce->msg, "aborted") || !strstr(ce->msg, "rank 2 was stopped by the test"))
        coll_fail(&a->s, "%s: rank %d returned %s (peer %d): %s", dsim_algo_name(a->algo), rank,
                  dsim_strerror(e), ce->peer, ce->msg);
    else if (at == 0 || back - at > 2000 * MS)
        coll_fail(&a->s, "%s: rank %d returned %lld ms after the abort", dsim_algo_name(a->algo),
                  rank, (long long)((back - at) / MS));
    /* The abort is permanent: the next call fails at once. */
    int64_t t1 = dsim_rt_now(h->rt);
    e = dsim_allreduce_with(h->comms[rank], buf, buf, ABORT_COUNT, DSIM_F32, DSIM_MAX, a->algo);
    if (e != DSIM_EABORTED || dsim_rt_now(h->rt) - t1 > 1000 * MS)
        coll_fail(&a->s, "%s: rank %d's call after the abort returned %s", dsim_algo_name(a->algo),
                  rank, dsim_strerror(e));
    a->calls[rank] = calls;
    free(buf);
}

static void test_abort(void **state)
{
    (void)state;
    for (int ai = 0; ai < MISC_NALGOS; ai++) {
        abort_arg a = {.algo = misc_algos[ai]};
        pthread_mutex_init(&a.s.mu, NULL);
        coll_harness h;
        coll_harness_cfg cfg = {.nranks = 4, .timeout_ns = 30000 * MS};
        if (coll_harness_open(&h, &cfg) != DSIM_OK)
            fail_msg("opening 4 ranks: %s", dsim_errmsg());
        a.h = &h;
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, abort_thread, &a), 0);
        dsim_err e = coll_harness_run(&h, abort_rank, &a);
        pthread_join(th, NULL);
        coll_harness_close(&h);
        pthread_mutex_destroy(&a.s.mu);
        assert_int_equal(e, DSIM_OK);
        if (a.s.failures)
            fail_msg("%d failure(s); the first: %s", a.s.failures, a.s.first);
    }
}

/* ---- argument errors ------------------------------------------------- */

static void expect_err(dsim_err got, dsim_err want, const char *needle)
{
    if (got != want)
        fail_msg("got %s, want %s (%s)", dsim_strerror(got), dsim_strerror(want), dsim_errmsg());
    if (needle && !strstr(dsim_errmsg(), needle))
        fail_msg("the message \"%s\" does not mention \"%s\"", dsim_errmsg(), needle);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    coll_harness h;
    coll_harness_cfg cfg = {.nranks = 1};
    assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
    dsim_comm *c = h.comms[0];
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];

    expect_err(dsim_allreduce(NULL, a, b, 8, DSIM_F32, DSIM_SUM), DSIM_EINVAL, "NULL");
    expect_err(dsim_allreduce(c, a, b, 8, (dsim_dtype)99, DSIM_SUM), DSIM_EINVAL, "dtype 99");
    assert_int_equal(dsim_comm_error(c)->code, DSIM_EINVAL);
    assert_non_null(strstr(dsim_comm_error(c)->msg, "dtype 99"));
    expect_err(dsim_allreduce(c, a, b, 8, DSIM_F32, (dsim_op)77), DSIM_EINVAL, "op 77");
    expect_err(dsim_reduce_scatter(c, a, b, 2, DSIM_F32, (dsim_op)-1), DSIM_EINVAL, "op -1");
    expect_err(dsim_allreduce_with(c, a, b, 8, DSIM_F32, DSIM_SUM, (dsim_algo)42), DSIM_EINVAL,
               "algorithm 42");
    expect_err(dsim_allreduce(c, NULL, b, 8, DSIM_F32, DSIM_SUM), DSIM_EINVAL, "sendbuf");
    expect_err(dsim_allreduce(c, a, NULL, 8, DSIM_F32, DSIM_SUM), DSIM_EINVAL, "recvbuf");
    expect_err(dsim_allreduce(c, a, a + 1, 4, DSIM_F32, DSIM_SUM), DSIM_EINVAL, "overlap");
    expect_err(dsim_allreduce(c, a, b, SIZE_MAX / 2, DSIM_F64, DSIM_SUM), DSIM_EINVAL, "too large");
    expect_err(dsim_reduce(c, a, b, 8, DSIM_F32, DSIM_SUM, 1), DSIM_EINVAL, "root 1");
    expect_err(dsim_broadcast(c, a, 8, DSIM_F32, -1), DSIM_EINVAL, "root -1");
    expect_err(dsim_reduce_scatter(c, a, a, 2, DSIM_F32, DSIM_SUM), DSIM_EINVAL, "overlaps");
    dsim_comm_set_algo(c, (dsim_algo)9);
    expect_err(dsim_allreduce(c, a, b, 8, DSIM_F32, DSIM_SUM), DSIM_EINVAL, "algorithm 9");
    dsim_comm_set_algo(c, DSIM_ALGO_AUTO);

    /* NULL buffers are fine with nothing to move; one rank copies. */
    assert_int_equal(dsim_allreduce(c, NULL, NULL, 0, DSIM_F32, DSIM_SUM), DSIM_OK);
    assert_int_equal(dsim_allreduce(c, a, b, 8, DSIM_F32, DSIM_MEAN), DSIM_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(dsim_allgather(c, a, b, 8, DSIM_F32), DSIM_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(dsim_barrier(c), DSIM_OK);

    dsim_comm *bad = NULL;
    dsim_comm_cfg cc = {.ep = NULL, .size = 1};
    expect_err(dsim_comm_create(&cc, &bad), DSIM_EINVAL, "dsim_ep_open");
    cc.ep = h.eps[0];
    cc.size = 0;
    expect_err(dsim_comm_create(&cc, &bad), DSIM_EINVAL, "cfg.size is 0");
    assert_null(bad);
    coll_harness_close(&h);

    dsim_algo al;
    for (int i = 0; i < DSIM_ALGO_COUNT; i++) {
        assert_int_equal(dsim_algo_parse(dsim_algo_name((dsim_algo)i), &al), DSIM_OK);
        assert_int_equal(al, i);
    }
    expect_err(dsim_algo_parse("butterfly", &al), DSIM_EINVAL, "reduce_to_one");
}

/* The table of algorithms (src/coll/algos.c): every dsim_algo has a name
 * that parses back to it and a summary; the listing for messages names
 * them all, in order, with the separators asked for. */
static void test_algorithm_table(void **state)
{
    (void)state;
    char all[256], some[256];
    dsim_algo_list(all, sizeof all, 1, ", ", " or ");
    dsim_algo_list(some, sizeof some, 0, " | ", " | ");
    assert_true(strncmp(all, "auto, ", 6) == 0);
    size_t off = 0;
    for (int a = 0; a < DSIM_ALGO_COUNT; a++) {
        const char *name = dsim_algo_name((dsim_algo)a);
        assert_string_not_equal(name, "unknown");
        assert_true(strlen(dsim_algo_summary((dsim_algo)a)) > 10);
        dsim_algo back;
        assert_int_equal(dsim_algo_parse(name, &back), DSIM_OK);
        assert_int_equal(back, a);
        const char *at = strstr(all + off, name);
        assert_non_null(at);
        off = (size_t)(at - all) + strlen(name);
        if (a > 0)
            assert_non_null(strstr(some, name));
    }
    assert_int_equal(off, strlen(all)); /* the last name ends the list */
    char tail[64];
    snprintf(tail, sizeof tail, " or %s", dsim_algo_name((dsim_algo)(DSIM_ALGO_COUNT - 1)));
    assert_non_null(strstr(all, tail));
    assert_null(strstr(some, "auto"));
    assert_null(strstr(some, ","));
    assert_string_equal(dsim_algo_name(DSIM_ALGO_COUNT), "unknown");
    assert_string_equal(dsim_algo_summary(DSIM_ALGO_COUNT), "");
    char tiny[6];
    dsim_algo_list(tiny, sizeof tiny, 1, ", ", ", ");
    assert_true(strlen(tiny) < sizeof tiny); /* cut, terminated */
}

/* ---- choosing the algorithm ------------------------------------------ */

/* Messages each rank of 4 sends in one allreduce, by algorithm, which show
 * which one ran: its payload messages alone, since the collective
 * fingerprints ride on them (a separate fingerprint message would show
 * here: ring 6 + 1, rhd 4 + 2, tree 2 + 0, 1 + 1, 2 + 1, 1 + 1,
 * reduce_to_one 3 + 0, 1 + 1; torus, without a torus one ring of 4 run
 * both ways, 12 + 0). */
static const uint64_t sel_msgs[DSIM_ALGO_COUNT][4] = {
    [DSIM_ALGO_RING] = {6, 6, 6, 6},
    [DSIM_ALGO_RHD] = {4, 4, 4, 4},
    [DSIM_ALGO_TREE] = {2, 1, 2, 1},
    [DSIM_ALGO_REDUCE_TO_ONE] = {3, 1, 1, 1},
    /* no topology here (local_size 0): the levels collapse into the ring */
    [DSIM_ALGO_HIERARCHICAL] = {6, 6, 6, 6},
    [DSIM_ALGO_TORUS] = {12, 12, 12, 12},
    [DSIM_ALGO_RECURSIVE_DOUBLING] = {2, 2, 2, 2},
};

typedef struct sel_arg {
    misc_shared s;
    size_t count;
    int mode; /* 0: dsim_allreduce (cfg.algo), 1: set_algo, 2: allreduce_with */
    dsim_algo algo;
    dsim_algo expect;
} sel_arg;

static void sel_rank(coll_harness *h, int rank, void *p)
{
    sel_arg *a = p;
    dsim_comm *c = h->comms[rank];
    float *buf = calloc(a->count, sizeof *buf);
    if (!buf) {
        coll_fail(&a->s, "out of memory");
        return;
    }
    dsim_ep_stats st0, st1;
    dsim_ep_get_stats(h->eps[rank], &st0);
    dsim_err e;
    if (a->mode == 1) {
        dsim_comm_set_algo(c, a->algo);
        e = dsim_allreduce(c, buf, buf, a->count, DSIM_F32, DSIM_SUM);
    } else if (a->mode == 2) {
        e = dsim_allreduce_with(c, buf, buf, a->count, DSIM_F32, DSIM_SUM, a->algo);
    } else {
        e = dsim_allreduce(c, buf, buf, a->count, DSIM_F32, DSIM_SUM);
    }
    dsim_ep_get_stats(h->eps[rank], &st1);
    if (e != DSIM_OK)
        coll_fail(&a->s, "rank %d: %s", rank, dsim_errmsg());
    else if (st1.msgs_sent - st0.msgs_sent != sel_msgs[a->expect][rank])
        coll_fail(&a->s, "mode %d, algo %s, count %zu: rank %d sent %llu messages, %s sends %llu",
                  a->mode, dsim_algo_name(a->algo), a->count, rank,
                  (unsigned long long)(st1.msgs_sent - st0.msgs_sent), dsim_algo_name(a->expect),
                  (unsigned long long)sel_msgs[a->expect][rank]);
    free(buf);
}

/* dsim_comm_set_decide: the caller's decision for AUTO, asked with the
 * communicator's shape; no opinion (AUTO), a value out of range or an
 * algorithm the communicator cannot run leave the built-in one; a
 * sub-communicator inherits it and asks with its own shape. */
typedef struct dec_arg {
    misc_shared s;
    atomic_int calls;
    atomic_int bad_shape;
    dsim_algo answer; /* for buffers of 4 KiB and more */
    int want_ranks, want_hosts, want_local;
} dec_arg;

static dsim_algo dec_fn(void *user, size_t bytes, int nranks, int hosts, int local)
{
    dec_arg *a = user;
    atomic_fetch_add(&a->calls, 1);
    if (nranks != a->want_ranks || hosts != a->want_hosts || local != a->want_local)
        atomic_fetch_add(&a->bad_shape, 1);
    return bytes >= 4096 ? a->answer : DSIM_ALGO_AUTO;
}

static void dec_rank(coll_harness *h, int rank, void *p)
{
    dec_arg *a = p;
    dsim_comm *c = h->comms[rank];
    float buf[1024] = {0};
    dsim_comm_set_decide(c, dec_fn, a);
    /* 64 floats: no opinion, recursive doubling; 1024: the answer (or the
     * built-in pick where the answer cannot run) */
    static const size_t counts[] = {64, 1024};
    for (int k = 0; k < 2; k++) {
        dsim_ep_stats st0, st1;
        dsim_ep_get_stats(h->eps[rank], &st0);
        dsim_err e = dsim_allreduce(c, buf, buf, counts[k], DSIM_F32, DSIM_SUM);
        dsim_ep_get_stats(h->eps[rank], &st1);
        dsim_algo want = k == 0 ? DSIM_ALGO_RECURSIVE_DOUBLING
                         : a->answer == DSIM_ALGO_HIERARCHICAL || (int)a->answer >= DSIM_ALGO_COUNT
                             ? dsim_allreduce_decide(counts[k] * sizeof(float), 4)
                             : a->answer;
        if (e != DSIM_OK)
            coll_fail(&a->s, "rank %d: %s", rank, dsim_errmsg());
        else if (st1.msgs_sent - st0.msgs_sent != sel_msgs[want][rank])
            coll_fail(&a->s, "answer %d, %zu floats: rank %d sent %llu messages, %s sends %llu",
                      (int)a->answer, counts[k], rank,
                      (unsigned long long)(st1.msgs_sent - st0.msgs_sent), dsim_algo_name(want),
                      (unsigned long long)sel_msgs[want][rank]);
    }
    /* a sub-communicator of two asks with its own shape */
    dsim_comm *sub = NULL;
    if (dsim_comm_split(c, rank % 2, rank, &sub) != DSIM_OK) {
        coll_fail(&a->s, "rank %d: split: %s", rank, dsim_errmsg());
        return;
    }
    coll_harness_sync(h);
    if (rank == 0) {
        a->want_ranks = 2;
        a->want_hosts = 2;
        a->want_local = 1;
    }
    coll_harness_sync(h);
    int before = atomic_load(&a->calls);
    coll_harness_sync(h);
    if (dsim_allreduce(sub, buf, buf, 1024, DSIM_F32, DSIM_SUM) != DSIM_OK)
        coll_fail(&a->s, "rank %d: sub allreduce: %s", rank, dsim_errmsg());
    coll_harness_sync(h);
    if (rank == 0 && atomic_load(&a->calls) - before != 4)
        coll_fail(&a->s, "the sub-communicators asked %d times, not once per rank",
                  atomic_load(&a->calls) - before);
    dsim_comm_free(sub);
}

static void test_caller_decides(void **state)
{
    (void)state;
    static const dsim_algo answers[] = {DSIM_ALGO_RING, DSIM_ALGO_RHD, DSIM_ALGO_HIERARCHICAL,
                                        (dsim_algo)99};
    for (size_t i = 0; i < sizeof answers / sizeof answers[0]; i++) {
        dec_arg a = {.answer = answers[i], .want_ranks = 4, .want_hosts = 4, .want_local = 1};
        atomic_init(&a.calls, 0);
        atomic_init(&a.bad_shape, 0);
        pthread_mutex_init(&a.s.mu, NULL);
        coll_harness h;
        /* a rank per host: hierarchical cannot run here */
        coll_harness_cfg cfg = {.nranks = 4, .local_size = 1};
        assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
        dsim_err e = coll_harness_run(&h, dec_rank, &a);
        coll_harness_close(&h);
        pthread_mutex_destroy(&a.s.mu);
        assert_int_equal(e, DSIM_OK);
        if (a.s.failures)
            fail_msg("%s", a.s.first);
        assert_int_equal(atomic_load(&a.calls), 4 * 3);
        assert_int_equal(atomic_load(&a.bad_shape), 0);
    }
}

static void test_algorithm_choice(void **state)
{
    (void)state;
    static const size_t counts[] = {64, 1 << 20};
    for (int ci = 0; ci < 2; ci++)
        for (int algo = 0; algo < DSIM_ALGO_COUNT; algo++)
            for (int mode = 0; mode < 3; mode++) {
                sel_arg a = {.count = counts[ci], .mode = mode, .algo = (dsim_algo)algo};
                a.expect = algo == DSIM_ALGO_AUTO
                               ? dsim_allreduce_decide(counts[ci] * sizeof(float), 4)
                               : (dsim_algo)algo;
                pthread_mutex_init(&a.s.mu, NULL);
                coll_harness h;
                coll_harness_cfg cfg = {.nranks = 4, .algo = mode == 0 ? a.algo : DSIM_ALGO_AUTO};
                assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
                dsim_err e = coll_harness_run(&h, sel_rank, &a);
                coll_harness_close(&h);
                pthread_mutex_destroy(&a.s.mu);
                assert_int_equal(e, DSIM_OK);
                if (a.s.failures)
                    fail_msg("%s", a.s.first);
            }

    /* The documented thresholds (src/coll/decide.c). */
    /* a power of two of ranks and up to 8 KiB: recursive doubling */
    assert_int_equal(dsim_allreduce_decide(4096, 4), DSIM_ALGO_RECURSIVE_DOUBLING);
    assert_int_equal(dsim_allreduce_decide(8192, 16), DSIM_ALGO_RECURSIVE_DOUBLING);
    assert_int_equal(dsim_allreduce_decide(8, 2), DSIM_ALGO_RECURSIVE_DOUBLING);
    assert_int_equal(dsim_allreduce_decide(8196, 4), DSIM_ALGO_TREE);
    assert_int_equal(dsim_allreduce_decide(4096, 6), DSIM_ALGO_TREE);
    assert_int_equal(dsim_allreduce_decide(64 << 10, 16), DSIM_ALGO_TREE);
    assert_int_equal(dsim_allreduce_decide((64 << 10) + 4, 4), DSIM_ALGO_RHD);
    assert_int_equal(dsim_allreduce_decide((size_t)16 << 20, 4), DSIM_ALGO_RHD);
    assert_int_equal(dsim_allreduce_decide((size_t)64 << 20, 8), DSIM_ALGO_RHD);
    /* blocks of 16 MiB: the ring, which streams them (over sockets) */
    assert_int_equal(dsim_allreduce_decide((size_t)64 << 20, 4), DSIM_ALGO_RING);
    assert_int_equal(dsim_allreduce_decide(((size_t)64 << 20) - 4, 4), DSIM_ALGO_RHD);
    assert_int_equal(dsim_allreduce_decide((size_t)4 << 20, 7), DSIM_ALGO_RHD);
    assert_int_equal(dsim_allreduce_decide((size_t)64 << 20, 7), DSIM_ALGO_RING);

    /* Over hosts: hierarchical above 64 KiB on >= 2 hosts of >= 2 ranks;
     * otherwise what the flat decision says. */
    assert_int_equal(dsim_allreduce_decide_hosts((64 << 10) + 4, 2, 2), DSIM_ALGO_HIERARCHICAL);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)100 << 20, 16, 8), DSIM_ALGO_HIERARCHICAL);
    assert_int_equal(dsim_allreduce_decide_hosts(64 << 10, 4, 4), DSIM_ALGO_TREE);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)16 << 20, 1, 4), DSIM_ALGO_RHD);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)64 << 20, 7, 1), DSIM_ALGO_RING);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)16 << 20, 0, 0), DSIM_ALGO_RING);
    /* Against rhd the two levels' ring across hosts must pay for its 2 (H-1)
     * slow steps with the NIC bytes it saves: 512 x 8 with 4 MB yes, 8,192
     * x 8 no; a host count that is no power of two (the flat ring) yes. */
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)4 << 20, 512, 8), DSIM_ALGO_HIERARCHICAL);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)4 << 20, 8192, 8), DSIM_ALGO_RHD);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)1 << 20, 512, 8), DSIM_ALGO_RHD);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)64 << 20, 7, 2), DSIM_ALGO_HIERARCHICAL);
    assert_int_equal(dsim_allreduce_decide_hosts((size_t)102400000, 4, 4), DSIM_ALGO_HIERARCHICAL);

    /* The decision never answers AUTO, for any size and rank count. */
    for (int n = 1; n <= 1024; n = n < 16 ? n + 1 : n * 2)
        for (size_t bytes = 0; bytes <= ((size_t)1 << 32); bytes = bytes ? bytes * 4 : 1) {
            dsim_algo d = dsim_allreduce_decide(bytes, n);
            if (d <= DSIM_ALGO_AUTO || d >= DSIM_ALGO_COUNT)
                fail_msg("dsim_allreduce_decide(%zu, %d) = %d", bytes, n, (int)d);
        }
}

/* ---- the torus algorithm's shape ---------------------------------------- */

typedef struct torus_arg {
    misc_shared s;
    uint64_t sent[4];
} torus_arg;

static void torus_rank_fn(coll_harness *h, int rank, void *p)
{
    torus_arg *a = p;
    float buf[64];
    for (int i = 0; i < 64; i++)
        buf[i] = (float)(rank + i);
    dsim_ep_stats st0, st1;
    dsim_ep_get_stats(h->eps[rank], &st0);
    if (dsim_allreduce_with(h->comms[rank], buf, buf, 64, DSIM_F32, DSIM_SUM, DSIM_ALGO_TORUS) !=
        DSIM_OK)
        coll_fail(&a->s, "rank %d: %s", rank, dsim_errmsg());
    dsim_ep_get_stats(h->eps[rank], &st1);
    a->sent[rank] = st1.msgs_sent - st0.msgs_sent;
    for (int i = 0; i < 64; i++)
        if (buf[i] != (float)(6 + 4 * i))
            coll_fail(&a->s, "rank %d: element %d is %g, not %d", rank, i, (double)buf[i],
                      6 + 4 * i);
}

/* A communicator's torus: refused when it does not hold the ranks exactly,
 * and followed when it does (a 2x2 torus: 2 steps a dimension, both
 * directions: 8 messages a rank, where one ring of 4 sends 12). */
static void test_torus_shape(void **state)
{
    (void)state;
    coll_harness h;
    coll_harness_cfg cfg = {.nranks = 8};
    assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
    dsim_comm *bad = NULL;
    dsim_comm_cfg cc = {.ep = h.eps[3], .size = 8, .torus_ndims = 2, .torus_dims = {2, 3}};
    expect_err(dsim_comm_create(&cc, &bad), DSIM_EINVAL,
               "the torus 2x3 has 6 places but the communicator has 8 ranks");
    cc.torus_dims[1] = 0;
    expect_err(dsim_comm_create(&cc, &bad), DSIM_EINVAL, "cfg.torus_dims[1] is 0");
    cc.torus_ndims = DSIM_TORUS_MAX_DIMS + 1;
    expect_err(dsim_comm_create(&cc, &bad), DSIM_EINVAL, "cfg.torus_ndims is 5");
    int twice[8] = {0, 1, 2, 3, 4, 5, 6, 6};
    cc.torus_ndims = 2;
    cc.torus_dims[1] = 4;
    cc.torus_rank = twice;
    expect_err(dsim_comm_create(&cc, &bad), DSIM_EINVAL,
               "cfg.torus_rank[7] is 6, a rank given twice");
    assert_null(bad);
    coll_harness_close(&h);

    for (int shaped = 0; shaped < 2; shaped++) {
        torus_arg a = {0};
        pthread_mutex_init(&a.s.mu, NULL);
        coll_harness_cfg c4 = {.nranks = 4, .torus_ndims = shaped ? 2 : 0, .torus_dims = {2, 2}};
        assert_int_equal(coll_harness_open(&h, &c4), DSIM_OK);
        assert_int_equal(coll_harness_run(&h, torus_rank_fn, &a), DSIM_OK);
        coll_harness_close(&h);
        pthread_mutex_destroy(&a.s.mu);
        if (a.s.failures)
            fail_msg("%s", a.s.first);
        for (int r = 0; r < 4; r++)
            assert_int_equal(a.sent[r], shaped ? 8 : 12);
    }
}

int main(void)
{
    coll_data_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_algorithm_choice),
        cmocka_unit_test(test_caller_decides),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_absent_rank),
        cmocka_unit_test(test_stale_messages),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_late_rank_not_absent),
        cmocka_unit_test(test_algorithm_table),
        cmocka_unit_test(test_torus_shape),
        cmocka_unit_test(test_recursive_doubling_order),
    };
    return cmocka_run_group_tests_name("coll_misc", tests, NULL, NULL);
}
