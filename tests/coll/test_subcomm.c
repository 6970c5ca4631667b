/* Sub-communicators (dsim_comm_split, dsim_comm_create_group): MPI's
 * semantics, derived ids, the verification matrix of every collective on
 * splits of 2 to 16 ranks (several colors, keys that reorder, nested
 * splits), a desync, a lost rank and an abort on a sub-communicator, timing
 * only on one, its flight records and the exchange log.
 *
 * The world is 16 ranks on 4 hosts of 4 (local_size 4), so that splits
 * inherit hosts: "halves" (2 hosts x 4) and "evens" (4 hosts x 2) run the
 * hierarchical algorithm's two levels, "quads" (a rank per host) and
 * "thirds" (unequal hosts) its ring. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cmocka.h>

#include "coll_data.h"
#include "coll_harness.h"
#include "dsim/err.h"

#define SC_WORLD  16
#define SC_LOCAL  4
#define SC_MAXC   1023
#define SC_CANARY 0xA5
#define SC_S      1000000000LL
#define SC_MS     1000000LL

static const size_t sc_counts[] = {0, 1, 7, SC_MAXC};
#define SC_NCOUNTS (sizeof sc_counts / sizeof sc_counts[0])

/* ---- split schemes: a color and a key for each world rank ---- */

typedef struct sc_scheme {
    const char *name;
    int (*color)(int r);
    int (*key)(int r);
    /* nested: split the result again by color2 (key: the rank) */
    int (*color2)(int r);
} sc_scheme;

static int c_pairs(int r)
{
    return r % 8;
}
static int c_quads(int r)
{
    return r % 4;
}
static int c_halves(int r)
{
    return r / 8;
}
static int c_thirds(int r)
{
    return r % 3;
}
static int c_whole(int r)
{
    (void)r;
    return 0;
}
static int c_evens(int r)
{
    return r == 15 ? DSIM_COMM_UNDEFINED : r % 2;
}
static int c_nested2(int r)
{
    return (r / 2) % 2;
}
static int k_rev(int r)
{
    return -r;
}
static int k_mix(int r)
{
    return (r * 7) % SC_WORLD;
}
static int k_five(int r)
{
    return (r * 5) % SC_WORLD;
}
static int k_same(int r)
{
    (void)r;
    return 0;
}
static int k_up(int r)
{
    return r;
}

static const sc_scheme sc_schemes[] = {
    {"pairs (8 x 2, keys reversed)", c_pairs, k_rev, NULL},
    {"quads (4 x 4, a rank per host, keys shuffled)", c_quads, k_five, NULL},
    {"halves (2 x 8 on 2 hosts x 4, keys reversed)", c_halves, k_rev, NULL},
    {"thirds (6 + 5 + 5, equal keys: parent order)", c_thirds, k_same, NULL},
    {"whole (16, keys shuffled)", c_whole, k_mix, NULL},
    {"evens and odds (8 on 4 hosts x 2, 7; rank 15 undefined)", c_evens, k_up, NULL},
    {"halves split again (4 x 4)", c_halves, k_up, c_nested2},
};
#define SC_NSCHEMES (sizeof sc_schemes / sizeof sc_schemes[0])

/* The members of world rank r's sub-communicator under scheme sc, in their
 * new order (what MPI_Comm_split promises): their world ranks into m,
 * returning how many; 0 when r is undefined. */
static int sc_expected(const sc_scheme *sc, int r, int *m)
{
    int c = sc->color(r);
    if (c < 0)
        return 0;
    int n = 0;
    for (int q = 0; q < SC_WORLD; q++)
        if (sc->color(q) == c && (!sc->color2 || sc->color2(q) == sc->color2(r)))
            m[n++] = q;
    /* stable by key (then parent rank: the world's order) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && sc->key(m[j - 1]) > sc->key(m[j]); j--) {
            int t = m[j];
            m[j] = m[j - 1];
            m[j - 1] = t;
        }
    /* a nested scheme's second split keys by the rank in the first: the
     * same order */
    return n;
}

static void *sc_open(coll_harness *h, int n, int local, int64_t timeout_ns)
{
    coll_harness_cfg cfg = {.nranks = n, .timeout_ns = timeout_ns, .local_size = local};
    if (coll_harness_open(h, &cfg) != DSIM_OK)
        fail_msg("opening %d ranks: %s", n, dsim_errmsg());
    return h;
}

/* Splits by scheme sc (and again when it is nested); *out NULL when this
 * rank is undefined. */
static dsim_err sc_split(dsim_comm *world, const sc_scheme *sc, int r, dsim_comm **out)
{
    dsim_comm *a = NULL;
    DSIM_CHECK(dsim_comm_split(world, sc->color(r), sc->key(r), &a));
    if (!sc->color2 || !a) {
        *out = a;
        return DSIM_OK;
    }
    dsim_err e = dsim_comm_split(a, sc->color2(r), dsim_comm_rank(a), out);
    dsim_comm_free(a);
    return e;
}

/* ---- semantics ---- */

typedef struct sem_shared {
    coll_failures fl;
    uint32_t id[SC_NSCHEMES][SC_WORLD];
} sem_shared;

static void sem_rank(coll_harness *h, int rank, void *p)
{
    sem_shared *s = p;
    dsim_comm *w = h->comms[rank];
    for (size_t k = 0; k < SC_NSCHEMES; k++) {
        const sc_scheme *sc = &sc_schemes[k];
        dsim_comm *c = NULL;
        dsim_err e = sc_split(w, sc, rank, &c);
        if (e != DSIM_OK) {
            coll_fail(&s->fl, "%s: rank %d: split failed: %s", sc->name, rank, dsim_errmsg());
            return;
        }
        int m[SC_WORLD], n = sc_expected(sc, rank, m);
        if (n == 0) {
            if (c)
                coll_fail(&s->fl, "%s: rank %d is undefined but got a communicator", sc->name,
                          rank);
            continue;
        }
        if (!c) {
            coll_fail(&s->fl, "%s: rank %d got no communicator", sc->name, rank);
            continue;
        }
        if (dsim_comm_size(c) != n)
            coll_fail(&s->fl, "%s: rank %d: size %d, want %d", sc->name, rank, dsim_comm_size(c),
                      n);
        for (int i = 0; i < n && i < dsim_comm_size(c); i++) {
            if (dsim_comm_world_rank(c, i) != m[i])
                coll_fail(&s->fl, "%s: rank %d: sub-rank %d is world rank %d, want %d", sc->name,
                          rank, i, dsim_comm_world_rank(c, i), m[i]);
            if (m[i] == rank && dsim_comm_rank(c) != i)
                coll_fail(&s->fl, "%s: world rank %d is sub-rank %d, want %d", sc->name, rank,
                          dsim_comm_rank(c), i);
        }
        if (dsim_comm_host(c, dsim_comm_rank(c)) != rank / SC_LOCAL)
            coll_fail(&s->fl, "%s: rank %d: host %d, want %d", sc->name, rank,
                      dsim_comm_host(c, dsim_comm_rank(c)), rank / SC_LOCAL);
        uint32_t pid = 0;
        int color = -2;
        if (dsim_comm_origin_of(c, &pid, &color) != DSIM_COMM_ORIGIN_SPLIT ||
            (!sc->color2 && (pid != dsim_comm_id(w) || color != sc->color(rank))))
            coll_fail(&s->fl, "%s: rank %d: origin says parent %u color %d", sc->name, rank,
                      (unsigned)pid, color);
        if (!(dsim_comm_id(c) & 0x80000000u))
            coll_fail(&s->fl, "%s: derived id %u lacks the top bit", sc->name,
                      (unsigned)dsim_comm_id(c));
        s->id[k][rank] = dsim_comm_id(c);
        dsim_comm_free(c);
    }
}

static void sem_run(sem_shared *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->fl.mu, NULL);
    coll_harness h;
    sc_open(&h, SC_WORLD, SC_LOCAL, 20 * SC_S);
    dsim_err e = coll_harness_run(&h, sem_rank, s);
    coll_harness_close(&h);
    pthread_mutex_destroy(&s->fl.mu);
    assert_int_equal(e, DSIM_OK);
    if (s->fl.failures)
        fail_msg("%d failure(s); the first: %s", s->fl.failures, s->fl.first);
}

static void test_split_semantics(void **state)
{
    (void)state;
    static sem_shared a, b;
    sem_run(&a);
    sem_run(&b);
    for (size_t k = 0; k < SC_NSCHEMES; k++) {
        const sc_scheme *sc = &sc_schemes[k];
        for (int r = 0; r < SC_WORLD; r++) {
            /* the same ids on a second job: derived, not drawn */
            assert_int_equal(a.id[k][r], b.id[k][r]);
            int m[SC_WORLD], n = sc_expected(sc, r, m);
            for (int q = 0; q < SC_WORLD && n; q++) {
                int mq[SC_WORLD], nq = sc_expected(sc, q, mq);
                int same = nq && mq[0] == m[0];
                if (same && a.id[k][q] != a.id[k][r])
                    fail_msg("%s: world ranks %d and %d share a communicator with two ids",
                             sc->name, r, q);
                if (!same && nq && a.id[k][q] == a.id[k][r])
                    fail_msg("%s: world ranks %d and %d are in different communicators of one "
                             "id %u",
                             sc->name, r, q, (unsigned)a.id[k][r]);
            }
            /* and not the id of any other scheme's communicators */
            for (size_t j = 0; j < k && n; j++)
                for (int q = 0; q < SC_WORLD; q++)
                    if (a.id[j][q] && a.id[j][q] == a.id[k][r])
                        fail_msg("%s and %s made the same id", sc_schemes[j].name, sc->name);
        }
    }
}

/* ---- the verification matrix on every scheme ---- */

static const dsim_algo sc_algos[] = {DSIM_ALGO_AUTO,          DSIM_ALGO_RING,
                                     DSIM_ALGO_RHD,           DSIM_ALGO_TREE,
                                     DSIM_ALGO_REDUCE_TO_ONE, DSIM_ALGO_HIERARCHICAL};
#define SC_NALGOS (sizeof sc_algos / sizeof sc_algos[0])
#define SC_NCASES (SC_NALGOS * DSIM_DTYPE_COUNT * DSIM_OP_COUNT * SC_NCOUNTS)

typedef struct mx_shared {
    coll_failures fl;
    const sc_scheme *sc;
    int stop;
    /* allreduce results' hashes, by case and world rank: members of one
     * sub-communicator must hold the same bits */
    uint64_t hash[SC_NCASES][SC_WORLD];
    uint32_t id[SC_WORLD];
    int arrived[SC_WORLD][16]; /* barrier rounds, by the sub-communicator's first member */
} mx_shared;

static uint64_t mx_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static int mx_failed(mx_shared *s, dsim_err e, const char *what, int rank)
{
    if (e == DSIM_OK)
        return 0;
    coll_fail(&s->fl, "%s: %s: world rank %d returned %s: %s", s->sc->name, what, rank,
              dsim_strerror(e), dsim_errmsg());
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
    return 1;
}

static int mx_untouched(const unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != SC_CANARY)
            return 0;
    return 1;
}

/* Every allreduce algorithm x dtype x op x count, half in place. */
static void mx_allreduce(mx_shared *s, dsim_comm *c, int wr, unsigned char *sb, unsigned char *rb)
{
    int n = dsim_comm_size(c), me = dsim_comm_rank(c);
    char msg[400], what[200];
    size_t ci = 0;
    for (size_t a = 0; a < SC_NALGOS; a++)
        for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
            for (int op = 0; op < DSIM_OP_COUNT; op++)
                for (size_t k = 0; k < SC_NCOUNTS; k++, ci++) {
                    if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED))
                        return;
                    size_t count = sc_counts[k], es = dsim_dtype_size((dsim_dtype)t);
                    int inplace = (op + (int)k) % 2 == 0;
                    unsigned char *in = inplace ? rb : sb;
                    memset(rb, SC_CANARY, count * es + 8);
                    coll_fill((dsim_dtype)t, (dsim_op)op, me, in, 0, count);
                    snprintf(what, sizeof what, "allreduce(%s) %s %s, %d ranks, count %zu%s",
                             dsim_algo_name(sc_algos[a]), dsim_dtype_name((dsim_dtype)t),
                             dsim_op_name((dsim_op)op), n, count, inplace ? ", in place" : "");
                    dsim_err e = dsim_allreduce_with(c, in, rb, count, (dsim_dtype)t, (dsim_op)op,
                                                     sc_algos[a]);
                    if (mx_failed(s, e, what, wr))
                        return;
                    if (coll_check((dsim_dtype)t, (dsim_op)op, n, rb, 0, count, msg, sizeof msg) >=
                        0)
                        coll_fail(&s->fl, "%s: %s: world rank %d: %s", s->sc->name, what, wr, msg);
                    if (!mx_untouched(rb + count * es, 8))
                        coll_fail(&s->fl, "%s: %s: written past count", s->sc->name, what);
                    if (!inplace && coll_check_vals((dsim_dtype)t, (dsim_op)op, me, sb, 0, count,
                                                    msg, sizeof msg) >= 0)
                        coll_fail(&s->fl, "%s: %s: the send buffer was modified", s->sc->name,
                                  what);
                    s->hash[ci][wr] = mx_hash(rb, count * es);
                }
}

/* reduce and broadcast from every root, allgather, reduce_scatter. */
static void mx_others(mx_shared *s, dsim_comm *c, int wr, unsigned char *sb, unsigned char *rb)
{
    int n = dsim_comm_size(c), me = dsim_comm_rank(c);
    char msg[400], what[200];
    for (int root = 0; root < n; root++)
        for (int t = 0; t < DSIM_DTYPE_COUNT; t++) {
            dsim_dtype dt = (dsim_dtype)t;
            size_t es = dsim_dtype_size(dt);
            for (size_t k = 0; k < SC_NCOUNTS; k++) {
                if (__atomic_load_n(&s->stop, __ATOMIC_RELAXED))
                    return;
                size_t count = sc_counts[k];
                dsim_op op = (dsim_op)((root + t + (int)k) % DSIM_OP_COUNT);
                coll_fill(dt, op, me, sb, 0, count);
                memset(rb, SC_CANARY, count * es + 8);
                snprintf(what, sizeof what, "reduce %s %s, root %d of %d, count %zu",
                         dsim_dtype_name(dt), dsim_op_name(op), root, n, count);
                if (mx_failed(s, dsim_reduce(c, sb, rb, count, dt, op, root), what, wr))
                    return;
                if (me == root && coll_check(dt, op, n, rb, 0, count, msg, sizeof msg) >= 0)
                    coll_fail(&s->fl, "%s: %s: %s", s->sc->name, what, msg);
                if (me != root && !mx_untouched(rb, count * es))
                    coll_fail(&s->fl, "%s: %s: a rank not the root had its recvbuf written",
                              s->sc->name, what);
                memset(rb, SC_CANARY, count * es + 8);
                if (me == root)
                    coll_fill(dt, DSIM_SUM, root, rb, 0, count);
                snprintf(what, sizeof what, "broadcast %s, root %d of %d, count %zu",
                         dsim_dtype_name(dt), root, n, count);
                if (mx_failed(s, dsim_broadcast(c, rb, count, dt, root), what, wr))
                    return;
                if (coll_check_vals(dt, DSIM_SUM, root, rb, 0, count, msg, sizeof msg) >= 0)
                    coll_fail(&s->fl, "%s: %s: world rank %d: %s", s->sc->name, what, wr, msg);
            }
        }
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
        for (size_t k = 0; k < SC_NCOUNTS; k++) {
            dsim_dtype dt = (dsim_dtype)t;
            size_t count = sc_counts[k], es = dsim_dtype_size(dt), blen = count * es;
            coll_fill(dt, DSIM_SUM, me, sb, 0, count);
            memset(rb, SC_CANARY, (size_t)n * blen + 8);
            snprintf(what, sizeof what, "allgather %s, %d ranks, count %zu", dsim_dtype_name(dt), n,
                     count);
            if (mx_failed(s, dsim_allgather(c, sb, rb, count, dt), what, wr))
                return;
            for (int r = 0; r < n; r++)
                if (coll_check_vals(dt, DSIM_SUM, r, rb + (size_t)r * blen, 0, count, msg,
                                    sizeof msg) >= 0)
                    coll_fail(&s->fl, "%s: %s: block %d: %s", s->sc->name, what, r, msg);
            dsim_op op = (dsim_op)((t + (int)k) % DSIM_OP_COUNT);
            coll_fill(dt, op, me, sb, 0, (size_t)n * count);
            memset(rb, SC_CANARY, blen + 8);
            snprintf(what, sizeof what, "reduce_scatter %s %s, %d ranks, recvcount %zu",
                     dsim_dtype_name(dt), dsim_op_name(op), n, count);
            if (mx_failed(s, dsim_reduce_scatter(c, sb, rb, count, dt, op), what, wr))
                return;
            if (coll_check(dt, op, n, rb, (size_t)me * count, count, msg, sizeof msg) >= 0)
                coll_fail(&s->fl, "%s: %s: world rank %d: %s", s->sc->name, what, wr, msg);
        }
}

/* Barriers: a different rank is late each round; nobody leaves before all
 * of its sub-communicator arrived. */
static void mx_barrier(mx_shared *s, dsim_comm *c, int wr)
{
    int n = dsim_comm_size(c), first = dsim_comm_world_rank(c, 0);
    for (int round = 0; round < 16; round++) {
        if (round % n == dsim_comm_rank(c)) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        __atomic_add_fetch(&s->arrived[first][round], 1, __ATOMIC_SEQ_CST);
        if (mx_failed(s, dsim_barrier(c), "barrier", wr))
            return;
        int seen = __atomic_load_n(&s->arrived[first][round], __ATOMIC_SEQ_CST);
        if (seen != n)
            coll_fail(&s->fl, "%s: barrier round %d: world rank %d left with %d of %d arrived",
                      s->sc->name, round, wr, seen, n);
    }
}

static void mx_rank(coll_harness *h, int rank, void *p)
{
    mx_shared *s = p;
    dsim_comm *c = NULL;
    if (mx_failed(s, sc_split(h->comms[rank], s->sc, rank, &c), "split", rank) || !c)
        return;
    s->id[rank] = dsim_comm_id(c);
    size_t cap = (size_t)SC_WORLD * SC_MAXC * 8 + 64;
    unsigned char *a = malloc(cap), *b = malloc(cap);
    if (!a || !b)
        coll_fail(&s->fl, "out of memory");
    else {
        mx_allreduce(s, c, rank, a, b);
        mx_others(s, c, rank, a, b);
        mx_barrier(s, c, rank);
    }
    free(a);
    free(b);
    dsim_comm_free(c);
}

static void test_matrix_on_splits(void **state)
{
    (void)state;
    for (size_t k = 0; k < SC_NSCHEMES; k++) {
        mx_shared *s = calloc(1, sizeof *s);
        assert_non_null(s);
        s->sc = &sc_schemes[k];
        pthread_mutex_init(&s->fl.mu, NULL);
        coll_harness h;
        sc_open(&h, SC_WORLD, SC_LOCAL, 60 * SC_S);
        dsim_err e = coll_harness_run(&h, mx_rank, s);
        coll_harness_close(&h);
        pthread_mutex_destroy(&s->fl.mu);
        assert_int_equal(e, DSIM_OK);
        if (s->fl.failures)
            fail_msg("%d failure(s); the first: %s", s->fl.failures, s->fl.first);
        /* every member of a sub-communicator holds the same bits */
        for (size_t ci = 0; ci < SC_NCASES; ci++)
            for (int r = 0; r < SC_WORLD; r++)
                for (int q = r + 1; q < SC_WORLD; q++)
                    if (s->id[r] && s->id[r] == s->id[q] && s->hash[ci][r] != s->hash[ci][q])
                        fail_msg("%s: allreduce case %zu: world ranks %d and %d differ",
                                 s->sc->name, ci, r, q);
        free(s);
    }
}

/* ---- dsim_comm_create_group ---- */

typedef struct grp_shared {
    coll_failures fl;
    uint32_t id[8][2];
    char bad[3][512];
} grp_shared;

static void grp_rank(coll_harness *h, int rank, void *p)
{
    grp_shared *s = p;
    dsim_comm *w = h->comms[rank];
    /* 6, 1, 3 in that order: rank 6 is rank 0 of the group */
    static const int list[] = {6, 1, 3};
    int me = rank == 6 ? 0 : rank == 1 ? 1 : rank == 3 ? 2 : -1;
    if (me < 0) {
        dsim_comm *c = NULL;
        if (rank == 0 && dsim_comm_create_group(w, 3, list, &c) != DSIM_EINVAL)
            coll_fail(&s->fl, "a non-member made the group");
        if (rank == 0)
            snprintf(s->bad[0], sizeof s->bad[0], "%s", dsim_errmsg());
        return;
    }
    for (int k = 0; k < 2; k++) {
        dsim_comm *c = NULL;
        if (dsim_comm_create_group(w, 3, list, &c) != DSIM_OK) {
            coll_fail(&s->fl, "rank %d: create_group: %s", rank, dsim_errmsg());
            return;
        }
        if (dsim_comm_rank(c) != me || dsim_comm_size(c) != 3 || dsim_comm_world_rank(c, 0) != 6 ||
            dsim_comm_origin_of(c, NULL, NULL) != DSIM_COMM_ORIGIN_GROUP)
            coll_fail(&s->fl, "rank %d: group rank %d of %d", rank, dsim_comm_rank(c),
                      dsim_comm_size(c));
        s->id[rank][k] = dsim_comm_id(c);
        double v = me + 1;
        if (dsim_allreduce(c, &v, &v, 1, DSIM_F64, DSIM_SUM) != DSIM_OK || v != 6)
            coll_fail(&s->fl, "rank %d: allreduce on the group: %g (%s)", rank, v, dsim_errmsg());
        dsim_comm_free(c);
    }
    if (rank == 1) {
        dsim_comm *c = NULL;
        static const int dup[] = {1, 3, 1}, out[] = {1, 99};
        if (dsim_comm_create_group(w, 3, dup, &c) != DSIM_EINVAL || c)
            coll_fail(&s->fl, "a rank listed twice was accepted");
        snprintf(s->bad[1], sizeof s->bad[1], "%s", dsim_errmsg());
        if (dsim_comm_create_group(w, 2, out, &c) != DSIM_EINVAL || c)
            coll_fail(&s->fl, "a rank out of range was accepted");
        snprintf(s->bad[2], sizeof s->bad[2], "%s", dsim_errmsg());
    }
}

static void test_create_group(void **state)
{
    (void)state;
    grp_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.fl.mu, NULL);
    coll_harness h;
    sc_open(&h, 8, 0, 10 * SC_S);
    assert_int_equal(coll_harness_run(&h, grp_rank, &s), DSIM_OK);
    coll_harness_close(&h);
    pthread_mutex_destroy(&s.fl.mu);
    if (s.fl.failures)
        fail_msg("%d failure(s); the first: %s", s.fl.failures, s.fl.first);
    /* the members agree; the second group of the same ranks is another one */
    assert_int_equal(s.id[1][0], s.id[6][0]);
    assert_int_equal(s.id[3][1], s.id[6][1]);
    assert_true(s.id[6][0] != s.id[6][1]);
    assert_non_null(strstr(s.bad[0], "not in the group"));
    assert_non_null(strstr(s.bad[1], "listed twice"));
    assert_non_null(strstr(s.bad[2], "not a rank of the parent"));
}

/* ---- a desync on a sub-communicator ---- */

typedef struct ds_shared {
    coll_failures fl;
    int out; /* ranks out of the world's barrier */
    char msg[SC_WORLD][512];
    dsim_err err[SC_WORLD];
    int peer[SC_WORLD];
} ds_shared;

/* 8 ranks split in two by host (local 4); in the second communicator,
 * world rank 5 (its rank 1) calls allreduce with 2 float32 where the others
 * pass 1 float64. */
static void ds_rank(coll_harness *h, int rank, void *p)
{
    ds_shared *s = p;
    dsim_comm *c = NULL;
    if (dsim_comm_split(h->comms[rank], rank / 4, rank, &c) != DSIM_OK) {
        coll_fail(&s->fl, "rank %d: split: %s", rank, dsim_errmsg());
        __atomic_add_fetch(&s->out, 1, __ATOMIC_SEQ_CST);
        return;
    }
    double d[2] = {1, 2};
    dsim_err e = dsim_allreduce(c, d, d, 1, DSIM_F64, DSIM_SUM); /* #1 agrees */
    /* the first communicator is done before the second one's mismatch
     * revokes the fabric: every rank out of the world's barrier (a rank
     * leaves a dissemination barrier before its last peers do) */
    if (e == DSIM_OK)
        e = dsim_barrier(h->comms[rank]);
    __atomic_add_fetch(&s->out, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&s->out, __ATOMIC_SEQ_CST) < 8) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (e == DSIM_OK && rank / 4 == 1)
        e = rank == 5 ? dsim_allreduce(c, d, d, 2, DSIM_F32, DSIM_SUM)
                      : dsim_allreduce(c, d, d, 1, DSIM_F64, DSIM_SUM);
    s->err[rank] = e;
    s->peer[rank] = dsim_comm_error(c)->peer;
    snprintf(s->msg[rank], sizeof s->msg[rank], "%s", dsim_comm_error(c)->msg);
    dsim_comm_free(c);
}

static void test_desync_on_sub(void **state)
{
    (void)state;
    ds_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.fl.mu, NULL);
    coll_harness h;
    sc_open(&h, 8, 4, 10 * SC_S);
    int64_t t0 = dsim_rt_now(h.rt);
    assert_int_equal(coll_harness_run(&h, ds_rank, &s), DSIM_OK);
    int64_t took = dsim_rt_now(h.rt) - t0;
    coll_harness_close(&h);
    pthread_mutex_destroy(&s.fl.mu);
    if (s.fl.failures)
        fail_msg("%s", s.fl.first);
    /* found at once, not at the 10 s timeout */
    assert_true(took < 5 * SC_S);
    int named = 0;
    for (int r = 4; r < 8; r++) {
        printf("world rank %d: %s: %s\n", r, dsim_strerror(s.err[r]), s.msg[r]);
        if (s.err[r] != DSIM_EPROTO && s.err[r] != DSIM_EABORTED)
            fail_msg("world rank %d returned %s: %s", r, dsim_strerror(s.err[r]), s.msg[r]);
        if (!strstr(s.msg[r], "collective mismatch on sub-communicator") ||
            !strstr(s.msg[r], "(split of 0, color 1)"))
            fail_msg("world rank %d does not name the sub-communicator: %s", r, s.msg[r]);
        if (strstr(s.msg[r], "rank 1 (world rank 5) called allreduce #2 with 2 float32"))
            named++;
    }
    assert_true(named >= 1);
    /* the first communicator's ranks were done before the mismatch */
    for (int r = 0; r < 4; r++)
        assert_int_equal(s.err[r], DSIM_OK);
}

/* ---- a rank lost during a sub-communicator's all-reduce ---- */

typedef struct dead_shared {
    coll_failures fl;
    dsim_err err[SC_WORLD];
    int peer[SC_WORLD];
    char msg[SC_WORLD][512];
    int64_t took[SC_WORLD];
    dsim_algo algo;
} dead_shared;

/* 8 ranks, two communicators of 4 by host (local 4), keys reversed. World
 * rank 5 dies (its worker returns) after the first all-reduce; the other
 * members of its communicator must fail naming it, in both numberings,
 * within the timeout and the failure check's grace, and the other
 * communicator's ranks go on untouched. */
static void dead_rank(coll_harness *h, int rank, void *p)
{
    dead_shared *s = p;
    dsim_comm *c = NULL;
    if (dsim_comm_split(h->comms[rank], rank / 4, -rank, &c) != DSIM_OK) {
        coll_fail(&s->fl, "rank %d: split: %s", rank, dsim_errmsg());
        return;
    }
    float b[4096];
    for (int i = 0; i < 4096; i++)
        b[i] = 1;
    dsim_err e = dsim_allreduce_with(c, b, b, 4096, DSIM_F32, DSIM_SUM, s->algo);
    if (e == DSIM_OK && rank != 5) {
        int64_t t0 = dsim_rt_now(h->rt);
        e = dsim_allreduce_with(c, b, b, 4096, DSIM_F32, DSIM_SUM, s->algo);
        s->took[rank] = dsim_rt_now(h->rt) - t0;
    }
    s->err[rank] = e;
    s->peer[rank] = dsim_comm_error(c)->peer;
    snprintf(s->msg[rank], sizeof s->msg[rank], "%s", dsim_comm_error(c)->msg);
    dsim_comm_free(c);
}

static void test_rank_lost_on_sub(void **state)
{
    (void)state;
    static const dsim_algo algos[] = {DSIM_ALGO_RING, DSIM_ALGO_RHD, DSIM_ALGO_TREE,
                                      DSIM_ALGO_HIERARCHICAL};
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
        dead_shared s;
        memset(&s, 0, sizeof s);
        s.algo = algos[a];
        pthread_mutex_init(&s.fl.mu, NULL);
        coll_harness h;
        sc_open(&h, 8, 2, 1 * SC_S); /* hosts of 2: the split's 4 are 2 x 2 */
        assert_int_equal(coll_harness_run(&h, dead_rank, &s), DSIM_OK);
        coll_harness_close(&h);
        pthread_mutex_destroy(&s.fl.mu);
        if (s.fl.failures)
            fail_msg("%s", s.fl.first);
        for (int r = 0; r < 8; r++) {
            if (r / 4 == 0) {
                assert_int_equal(s.err[r], DSIM_OK);
                continue;
            }
            if (r == 5)
                continue;
            if (a == 0)
                printf("world rank %d (%s): %s: %s\n", r, dsim_algo_name(algos[a]),
                       dsim_strerror(s.err[r]), s.msg[r]);
            if (s.err[r] != DSIM_ETIMEDOUT && s.err[r] != DSIM_EABORTED)
                fail_msg("%s: world rank %d returned %s: %s", dsim_algo_name(algos[a]), r,
                         dsim_strerror(s.err[r]), s.msg[r]);
            if (s.peer[r] != 5 || !strstr(s.msg[r], "(world rank 5)"))
                fail_msg("%s: world rank %d does not name world rank 5 (peer %d): %s",
                         dsim_algo_name(algos[a]), r, s.peer[r], s.msg[r]);
            /* timeout 1 s + the failure check's grace (0.5 s), with room */
            if (s.took[r] > 4 * SC_S)
                fail_msg("%s: world rank %d took %lld ms", dsim_algo_name(algos[a]), r,
                         (long long)(s.took[r] / SC_MS));
        }
    }
}

/* ---- an abort during a sub-communicator's all-reduce ---- */

typedef struct ab_shared {
    coll_failures fl;
    coll_harness *h;
    int64_t abort_at;
    int started; /* ranks inside their loop */
    dsim_err err[8], again[8];
    int peer[8];
    char msg[8][512], msg2[8][512];
    int64_t back[8], again_ns[8];
} ab_shared;

static void *ab_thread(void *p)
{
    ab_shared *s = p;
    while (__atomic_load_n(&s->started, __ATOMIC_SEQ_CST) < 8) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    __atomic_store_n(&s->abort_at, dsim_rt_now(s->h->rt), __ATOMIC_SEQ_CST);
    /* world rank 6 (rank 2 of the second host's communicator) was lost */
    dsim_fabric_abort(s->h->fab, 6, "world rank 6 was stopped by the test");
    return NULL;
}

/* 8 ranks split by host (local 4), each looping on its sub-communicator's
 * all-reduce (the algorithm of the round) until the fabric is aborted from
 * outside: every rank returns DSIM_EABORTED at once, naming the abort's
 * reason and the sub-communicator, and its next call fails at once too. */
static void ab_rank(coll_harness *h, int rank, void *p)
{
    ab_shared *s = p;
    dsim_comm *c = NULL;
    if (dsim_comm_split(h->comms[rank], rank / 4, rank, &c) != DSIM_OK || !c) {
        coll_fail(&s->fl, "rank %d: split: %s", rank, dsim_errmsg());
        __atomic_add_fetch(&s->started, 1, __ATOMIC_SEQ_CST);
        return;
    }
    size_t n = (size_t)1 << 18;
    float *b = malloc(n * sizeof *b);
    if (!b) {
        coll_fail(&s->fl, "out of memory");
        __atomic_add_fetch(&s->started, 1, __ATOMIC_SEQ_CST);
        dsim_comm_free(c);
        return;
    }
    for (size_t i = 0; i < n; i++)
        b[i] = 1;
    __atomic_add_fetch(&s->started, 1, __ATOMIC_SEQ_CST);
    dsim_err e = DSIM_OK;
    for (int calls = 0; e == DSIM_OK && calls < 1000000; calls++)
        e = dsim_allreduce(c, b, b, n, DSIM_F32, DSIM_MAX);
    s->back[rank] = dsim_rt_now(h->rt);
    s->err[rank] = e;
    s->peer[rank] = dsim_comm_error(c)->peer;
    snprintf(s->msg[rank], sizeof s->msg[rank], "%s", dsim_comm_error(c)->msg);
    int64_t t0 = dsim_rt_now(h->rt);
    s->again[rank] = dsim_allreduce(c, b, b, n, DSIM_F32, DSIM_MAX);
    s->again_ns[rank] = dsim_rt_now(h->rt) - t0;
    snprintf(s->msg2[rank], sizeof s->msg2[rank], "%s", dsim_comm_error(c)->msg);
    free(b);
    dsim_comm_free(c);
}

static void test_abort_on_sub(void **state)
{
    (void)state;
    ab_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.fl.mu, NULL);
    coll_harness h;
    sc_open(&h, 8, 4, 30 * SC_S);
    s.h = &h;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, ab_thread, &s), 0);
    assert_int_equal(coll_harness_run(&h, ab_rank, &s), DSIM_OK);
    pthread_join(th, NULL);
    coll_harness_close(&h);
    pthread_mutex_destroy(&s.fl.mu);
    if (s.fl.failures)
        fail_msg("%s", s.fl.first);
    for (int r = 0; r < 8; r++) {
        if (r == 0 || r == 4)
            printf("world rank %d: %s: %s\n  then: %s\n", r, dsim_strerror(s.err[r]), s.msg[r],
                   s.msg2[r]);
        if (s.err[r] != DSIM_EABORTED || s.peer[r] != 6 ||
            !strstr(s.msg[r], "world rank 6 was stopped by the test") ||
            !strstr(s.msg[r], "aborted"))
            fail_msg("world rank %d returned %s (peer %d): %s", r, dsim_strerror(s.err[r]),
                     s.peer[r], s.msg[r]);
        /* a call in flight names the sub-communicator it was on */
        if (!strstr(s.msg[r], "on sub-communicator ") ||
            !strstr(s.msg[r], r < 4 ? "(split of 0, color 0)" : "(split of 0, color 1)"))
            fail_msg("world rank %d does not name its sub-communicator: %s", r, s.msg[r]);
        /* within 2 s of the abort, not at the 30 s timeout */
        if (s.back[r] - s.abort_at > 2 * SC_S)
            fail_msg("world rank %d returned %lld ms after the abort", r,
                     (long long)((s.back[r] - s.abort_at) / SC_MS));
        /* permanent: the next call fails at once */
        if (s.again[r] != DSIM_EABORTED || s.again_ns[r] > 1 * SC_S ||
            !strstr(s.msg2[r], "world rank 6 was stopped by the test"))
            fail_msg("world rank %d's call after the abort returned %s: %s", r,
                     dsim_strerror(s.again[r]), s.msg2[r]);
    }
}

/* ---- timing only on a sub-communicator ---- */

typedef struct virt_shared {
    coll_failures fl;
    void *none; /* PROT_NONE: a byte read or written kills the test */
    size_t len;
} virt_shared;

static void virt_rank(coll_harness *h, int rank, void *p)
{
    virt_shared *s = p;
    dsim_comm *c = NULL;
    /* the split's own exchange carries real colors on a virtual world */
    if (dsim_comm_split(h->comms[rank], rank % 2, rank, &c) != DSIM_OK || !c) {
        coll_fail(&s->fl, "rank %d: split: %s", rank, dsim_errmsg());
        return;
    }
    if (dsim_comm_size(c) != 4 || dsim_comm_world_rank(c, 1) != 2 + rank % 2)
        coll_fail(&s->fl, "rank %d: a virtual world split wrongly", rank);
    size_t n = s->len / sizeof(float) / 8;
    char *none = s->none;
    dsim_err e = DSIM_OK;
    for (int a = DSIM_ALGO_RING; a < DSIM_ALGO_COUNT && e == DSIM_OK; a++)
        e = dsim_allreduce_with(c, none, none + s->len / 2, n, DSIM_F32, DSIM_MEAN, (dsim_algo)a);
    if (e == DSIM_OK)
        e = dsim_reduce(c, none, none + s->len / 2, n, DSIM_F32, DSIM_MAX, 2);
    if (e == DSIM_OK)
        e = dsim_broadcast(c, none, n, DSIM_F32, 3);
    if (e == DSIM_OK)
        e = dsim_allgather(c, none, none, n / 4, DSIM_F32);
    if (e == DSIM_OK)
        e = dsim_reduce_scatter(c, none, none + s->len / 2, n / 4, DSIM_F32, DSIM_SUM);
    if (e != DSIM_OK)
        coll_fail(&s->fl, "rank %d: %s", rank, dsim_errmsg());
    dsim_comm_free(c);
}

static void test_virtual_sub(void **state)
{
    (void)state;
    virt_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.fl.mu, NULL);
    s.len = (size_t)1 << 24;
    s.none = mmap(NULL, s.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(s.none != MAP_FAILED);
    coll_harness h;
    coll_harness_cfg cfg = {.nranks = 8, .timeout_ns = 20 * SC_S, .local_size = 2};
    assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
    /* the harness made plain communicators: remake them virtual */
    for (int r = 0; r < 8; r++) {
        dsim_comm_destroy(h.comms[r]);
        dsim_comm_cfg cc = {.ep = h.eps[r],
                            .size = 8,
                            .timeout_ns = 20 * SC_S,
                            .virtual_payload = 1,
                            .local_size = 2};
        assert_int_equal(dsim_comm_create(&cc, &h.comms[r]), DSIM_OK);
    }
    dsim_ep_stats st0;
    dsim_ep_get_stats(h.eps[0], &st0);
    assert_int_equal(coll_harness_run(&h, virt_rank, &s), DSIM_OK);
    dsim_ep_stats st1;
    dsim_ep_get_stats(h.eps[0], &st1);
    coll_harness_close(&h);
    munmap(s.none, s.len);
    pthread_mutex_destroy(&s.fl.mu);
    if (s.fl.failures)
        fail_msg("%s", s.fl.first);
    /* virtual frames carry 8 bytes each, whatever they stand for */
    assert_true(st1.bytes_sent - st0.bytes_sent < 64 * 1024);
}

/* ---- flight records and the exchange log ---- */

typedef struct fx_shared {
    coll_failures fl;
    char label[8][512];
    dsim_fr_dump *d[8];
    size_t nd[8];
} fx_shared;

/* The leader scheme a strategy writes by hand: reduce in the host, all-
 * reduce among the hosts' first ranks, broadcast back. */
static void fx_rank(coll_harness *h, int rank, void *p)
{
    fx_shared *s = p;
    dsim_comm *w = h->comms[rank], *host = NULL, *leaders = NULL, *spare = NULL;
    if (dsim_comm_split(w, rank / 4, rank, &host) != DSIM_OK ||
        dsim_comm_split(w, rank % 4 == 0 ? 0 : DSIM_COMM_UNDEFINED, rank, &leaders) != DSIM_OK ||
        dsim_comm_split(w, 0, rank, &spare) != DSIM_OK) {
        coll_fail(&s->fl, "rank %d: split: %s", rank, dsim_errmsg());
        return;
    }
    float g[64];
    for (int i = 0; i < 64; i++)
        g[i] = (float)rank;
    (void)dsim_barrier(spare); /* a call, then freed: its record is retired */
    dsim_comm_free(spare);
    dsim_comm_exchange_begin(w);
    dsim_err e = dsim_reduce(host, g, g, 64, DSIM_F32, DSIM_SUM, 0);
    if (e == DSIM_OK && leaders)
        e = dsim_allreduce_with(leaders, g, g, 64, DSIM_F32, DSIM_SUM, DSIM_ALGO_RING);
    if (e == DSIM_OK)
        e = dsim_broadcast(host, g, 64, DSIM_F32, 0);
    dsim_comm_exchange_end(w, s->label[rank], sizeof s->label[rank]);
    if (e != DSIM_OK || g[5] != 28)
        coll_fail(&s->fl, "rank %d: the leader scheme gave %g (%s)", rank, g[5], dsim_errmsg());
    if (dsim_comm_flight_dump_subs(w, &s->d[rank], &s->nd[rank]) != DSIM_OK)
        coll_fail(&s->fl, "rank %d: dump: %s", rank, dsim_errmsg());
    dsim_comm_free(leaders);
    /* the world destroyed before host is freed: freeing it is still safe */
    if (rank == 7) {
        dsim_comm_destroy(w);
        h->comms[rank] = NULL;
    }
    dsim_comm_free(host);
}

static void test_flight_and_label(void **state)
{
    (void)state;
    fx_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.fl.mu, NULL);
    coll_harness h;
    sc_open(&h, 8, 4, 10 * SC_S);
    assert_int_equal(coll_harness_run(&h, fx_rank, &s), DSIM_OK);
    coll_harness_close(&h);
    pthread_mutex_destroy(&s.fl.mu);
    if (s.fl.failures)
        fail_msg("%s", s.fl.first);
    printf("exchange of rank 0: %s\nexchange of rank 5: %s\n", s.label[0], s.label[5]);
    assert_non_null(strstr(s.label[0], "reduce on sub-communicator "));
    assert_non_null(strstr(s.label[0], " (4 ranks) + allreduce(ring) on sub-communicator "));
    assert_non_null(strstr(s.label[0], " (2 ranks) + broadcast on sub-communicator "));
    assert_null(strstr(s.label[5], "allreduce"));
    /* rank 4: the retired spare (1 call), then host and leaders */
    assert_int_equal(s.nd[4], 3);
    assert_int_equal(s.d[4][0].size, 8);
    assert_int_equal(s.d[4][0].calls, 1);
    assert_int_equal(s.d[4][1].size, 4);
    assert_int_equal(s.d[4][1].rank, 0);
    assert_int_equal(s.d[4][1].world_rank, 4);
    assert_int_equal(s.d[4][1].origin, DSIM_COMM_ORIGIN_SPLIT);
    assert_int_equal(s.d[4][1].color, 1);
    assert_int_equal(s.d[4][1].world_ranks[3], 7);
    assert_int_equal(s.d[4][2].size, 2);
    assert_int_equal(s.d[4][2].world_ranks[1], 4);
    assert_int_equal(s.d[4][1].entries[0].fp.coll, DSIM_COLL_REDUCE);
    assert_int_equal(s.d[4][1].entries[0].state, DSIM_FR_COMPLETED);
    /* rank 5 is no leader: the spare and host */
    assert_int_equal(s.nd[5], 2);
    for (int r = 0; r < 8; r++) {
        for (size_t i = 0; i < s.nd[r]; i++)
            dsim_fr_dump_free(&s.d[r][i]);
        free(s.d[r]);
    }
}

/* ---- the hierarchical algorithm's two levels, by its messages ---- */

typedef struct lv_shared {
    coll_failures fl;
    uint64_t sent[3][SC_WORLD];
} lv_shared;

static void lv_rank(coll_harness *h, int rank, void *p)
{
    lv_shared *s = p;
    dsim_comm *halves = NULL, *quads = NULL;
    if (dsim_comm_split(h->comms[rank], rank / 8, rank, &halves) != DSIM_OK ||
        dsim_comm_split(h->comms[rank], rank % 4, rank, &quads) != DSIM_OK) {
        coll_fail(&s->fl, "rank %d: split: %s", rank, dsim_errmsg());
        return;
    }
    dsim_comm *cs[3] = {h->comms[rank], halves, quads};
    float b[1024] = {0};
    for (int k = 0; k < 3; k++) {
        dsim_ep_stats a, z;
        dsim_ep_get_stats(h->eps[rank], &a);
        if (dsim_allreduce_with(cs[k], b, b, 1024, DSIM_F32, DSIM_SUM, DSIM_ALGO_HIERARCHICAL) !=
            DSIM_OK)
            coll_fail(&s->fl, "rank %d: %s", rank, dsim_errmsg());
        dsim_ep_get_stats(h->eps[rank], &z);
        s->sent[k][rank] = z.msgs_sent - a.msgs_sent;
    }
    dsim_comm_free(halves);
    dsim_comm_free(quads);
}

static void test_hier_levels(void **state)
{
    (void)state;
    lv_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.fl.mu, NULL);
    coll_harness h;
    sc_open(&h, SC_WORLD, SC_LOCAL, 10 * SC_S);
    assert_int_equal(coll_harness_run(&h, lv_rank, &s), DSIM_OK);
    coll_harness_close(&h);
    pthread_mutex_destroy(&s.fl.mu);
    if (s.fl.failures)
        fail_msg("%s", s.fl.first);
    for (int r = 0; r < SC_WORLD; r++) {
        /* 4 hosts x 4: 2 (4-1) + 2 (4-1) messages, not the ring's 2 (16-1) */
        assert_int_equal(s.sent[0][r], 12);
        /* halves, 2 hosts x 4: 2 (4-1) + 2 (2-1) */
        assert_int_equal(s.sent[1][r], 8);
        /* quads, a rank per host: the ring of 4 */
        assert_int_equal(s.sent[2][r], 6);
    }
}

int main(void)
{
    coll_data_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_semantics),  cmocka_unit_test(test_create_group),
        cmocka_unit_test(test_matrix_on_splits), cmocka_unit_test(test_desync_on_sub),
        cmocka_unit_test(test_rank_lost_on_sub), cmocka_unit_test(test_abort_on_sub),
        cmocka_unit_test(test_virtual_sub),      cmocka_unit_test(test_flight_and_label),
        cmocka_unit_test(test_hier_levels),
    };
    return cmocka_run_group_tests_name("subcomm", tests, NULL, NULL);
}
