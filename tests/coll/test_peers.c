/* Per-peer state of a communicator (src/coll/peers.c): a rank keeps state
 * only for the peers it exchanges with, so a communicator of 65,536 ranks
 * whose rank talks to 16 peers holds a few KiB, not 65,536 x ~150 bytes;
 * fingerprints still go and mismatches are still found between ranks far
 * apart in the table; and the failure check after a timeout, which talks to
 * every rank, makes the state it needs then.
 *
 * The star test drives the collective layer's own step runner
 * (dsim_coll_run, coll_int.h) on 17 endpoints of a 65,536-rank inproc
 * fabric: rank 0 exchanges with 16 ranks spread over the whole range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "coll_harness.h"
#include "coll_int.h"
#include "dsim/err.h"

#define MS       ((int64_t)1000000)
#define BIG      65536
#define SPOKES   16
#define STAR_CNT 4
/* What the state of 16 peers may take: 16 x ~150 bytes plus the table. */
#define STAR_BYTES_MAX (6 * 1024)

typedef struct star {
    coll_failures s;
    dsim_comm *comms[SPOKES + 1];
    int ranks[SPOKES + 1];
    int odd; /* > 0: spoke odd - 1 calls with another count in call 2 */
    dsim_err got[SPOKES + 1];
    char msg[SPOKES + 1][256];
    float in[SPOKES + 1][SPOKES][STAR_CNT];
} star;

typedef struct star_worker {
    star *st;
    int k; /* 0: the hub, rank 0; 1..SPOKES: spoke k */
} star_worker;

/* One call: the hub sends STAR_CNT floats to every spoke and receives as
 * many from each; count is what the fingerprint says. */
static dsim_err star_call(star *st, int k, uint64_t count)
{
    dsim_comm *c = st->comms[k];
    dsim_coll x;
    dsim_coll_begin(c, &x, "star", NULL, DSIM_F32, DSIM_SUM, 1);
    dsim_coll_fp_set(&x, DSIM_COLL_ALLREDUCE, DSIM_SUM, DSIM_F32, count, -1, DSIM_ALGO_RING);
    static float out[SPOKES + 1][STAR_CNT];
    for (int i = 0; i < STAR_CNT; i++)
        out[k][i] = (float)(st->ranks[k] + i);
    dsim_xfer xf[2 * SPOKES];
    int n = 0;
    if (k == 0) {
        for (int s = 1; s <= SPOKES; s++) {
            xf[n++] =
                (dsim_xfer){DSIM_XF_RECV, st->ranks[s], 1, st->in[0][s - 1], sizeof out[0], NULL};
            xf[n++] = (dsim_xfer){DSIM_XF_SEND, st->ranks[s], 1, out[0], sizeof out[0], NULL};
        }
    } else {
        xf[n++] = (dsim_xfer){DSIM_XF_RECV, 0, 1, st->in[k][0], sizeof out[0], NULL};
        xf[n++] = (dsim_xfer){DSIM_XF_SEND, 0, 1, out[k], sizeof out[0], NULL};
    }
    dsim_err e = dsim_coll_end(&x, dsim_coll_run(&x, xf, n));
    st->got[k] = e;
    snprintf(st->msg[k], sizeof st->msg[k], "%s", e == DSIM_OK ? "" : dsim_errmsg());
    return e;
}

static void star_main(void *p)
{
    star_worker *w = p;
    star *st = w->st;
    int k = w->k;
    if (star_call(st, k, 7) != DSIM_OK) {
        coll_fail(&st->s, "rank %d, call 1: %s", st->ranks[k], st->msg[k]);
        return;
    }
    for (int i = 0; i < STAR_CNT; i++) {
        float want = k == 0 ? (float)(st->ranks[1 + 0] + i) : (float)i;
        if (st->in[k][0][i] != want)
            coll_fail(&st->s, "rank %d got %g at %d, not %g", st->ranks[k], (double)st->in[k][0][i],
                      i, (double)want);
    }
    for (int s = 1; k == 0 && s <= SPOKES; s++)
        if (st->in[0][s - 1][STAR_CNT - 1] != (float)(st->ranks[s] + STAR_CNT - 1))
            coll_fail(&st->s, "the hub's data from rank %d is wrong", st->ranks[s]);
    if (st->odd)
        (void)star_call(st, k, k == st->odd - 1 ? 8 : 7);
}

/* Bytes the heap holds now (glibc), or 0 where that cannot be asked. */
static size_t star_heap(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#else
    return 0;
#endif
}

/* Opens the 17 ranks of the star on a fabric of BIG ranks, runs both calls,
 * and leaves the communicators in st (closed by star_close). */
typedef struct star_job {
    dsim_rt *rt;
    dsim_fabric *fab;
    dsim_ep *eps[SPOKES + 1];
} star_job;

static void star_close(star_job *j, star *st)
{
    for (int k = 0; k <= SPOKES; k++) {
        dsim_comm_destroy(st->comms[k]);
        if (j->eps[k])
            dsim_ep_close(j->eps[k]);
    }
    if (j->fab)
        dsim_fabric_close(j->fab);
    if (j->rt)
        dsim_rt_destroy(j->rt);
}

static void star_run(star_job *j, star *st)
{
    memset(j, 0, sizeof *j);
    pthread_mutex_init(&st->s.mu, NULL);
    assert_int_equal(dsim_rt_create("threads", &j->rt), DSIM_OK);
    dsim_fabric_cfg fc = {.backend = "inproc", .nranks = BIG, .rt = j->rt};
    if (dsim_fabric_open(&fc, &j->fab) != DSIM_OK)
        fail_msg("opening a fabric of %d ranks: %s", BIG, dsim_errmsg());
    for (int k = 0; k <= SPOKES; k++) {
        /* 4095, 8191, ..., 65535: spread over the whole range. */
        st->ranks[k] = k == 0 ? 0 : k * (BIG / SPOKES) - 1;
        assert_int_equal(dsim_ep_open(j->fab, st->ranks[k], &j->eps[k]), DSIM_OK);
        dsim_comm_cfg cc = {.ep = j->eps[k], .size = BIG, .timeout_ns = 10000 * MS};
        size_t before = star_heap();
        if (dsim_comm_create(&cc, &st->comms[k]) != DSIM_OK)
            fail_msg("a communicator of %d ranks: %s", BIG, dsim_errmsg());
        /* The whole communicator, not only what dsim_coll_peer_bytes
         * counts: arrays indexed by rank took ~10 MB here. */
        size_t grew = star_heap() - before;
        if (grew > 16 * 1024)
            fail_msg("a communicator of %d ranks took %zu bytes of heap", BIG, grew);
        /* Nothing yet: no state grows with the rank count. */
        assert_int_equal(dsim_coll_peer_count(st->comms[k]), 0);
        assert_int_equal((int)dsim_coll_peer_bytes(st->comms[k]), 0);
    }
    star_worker ws[SPOKES + 1];
    dsim_task *ts[SPOKES + 1];
    for (int k = 0; k <= SPOKES; k++) {
        ws[k] = (star_worker){st, k};
        assert_int_equal(dsim_rt_spawn(j->rt, st->ranks[k], star_main, &ws[k], &ts[k]), DSIM_OK);
    }
    for (int k = 0; k <= SPOKES; k++)
        assert_int_equal(dsim_rt_join(j->rt, ts[k]), DSIM_OK);
}

static void test_star_state_is_per_peer_used(void **state)
{
    (void)state;
    static star st;
    memset(&st, 0, sizeof st);
    star_job j;
    star_run(&j, &st);
    if (st.s.failures)
        fail_msg("%d failure(s); the first: %s", st.s.failures, st.s.first);
    dsim_comm *hub = st.comms[0];
    size_t hub_bytes = dsim_coll_peer_bytes(hub);
    print_message("hub: %d peers in %zu bytes (a communicator of %d ranks)\n",
                  dsim_coll_peer_count(hub), hub_bytes, BIG);
    assert_int_equal(dsim_coll_peer_count(hub), SPOKES);
    assert_true(hub_bytes > 0);
    assert_true(hub_bytes <= STAR_BYTES_MAX);
    for (int k = 1; k <= SPOKES; k++) {
        assert_int_equal(dsim_coll_peer_count(st.comms[k]), 1);
        assert_true(dsim_coll_peer_bytes(st.comms[k]) <= 2048);
        /* Each spoke's peer is the hub, and the fingerprints went both
         * ways on it (call 1 is call number 0: marks are 1). */
        dsim_coll_peer *q = dsim_coll_peer_get(st.comms[k], 0);
        assert_non_null(q);
        assert_int_equal(q->rank, 0);
        assert_int_equal((int)q->fp_sent, 1);
        assert_int_equal((int)q->fp_seen, 1);
        assert_null(dsim_coll_peer_get(st.comms[k], 1));
        dsim_coll_peer *h = dsim_coll_peer_get(hub, st.ranks[k]);
        assert_non_null(h);
        assert_int_equal(h->rank, st.ranks[k]);
        assert_int_equal((int)h->heard, 1);
    }
    /* Ranks the hub never talked to have no state. */
    assert_null(dsim_coll_peer_get(hub, 1));
    assert_null(dsim_coll_peer_get(hub, BIG / 2));
    star_close(&j, &st);
}

/* A rank far out in the table calls with another count: the hub finds the
 * mismatch from the fingerprint that rode on that rank's payload. */
static void test_star_mismatch_found(void **state)
{
    (void)state;
    static star st;
    memset(&st, 0, sizeof st);
    st.odd = SPOKES + 1; /* spoke SPOKES, rank 65535 */
    star_job j;
    star_run(&j, &st);
    if (st.s.failures)
        fail_msg("%d failure(s); the first: %s", st.s.failures, st.s.first);
    /* The two ranks that disagree both fail with it (the others may
     * finish: their data came before the hub took rank 65535's). */
    int ends[2] = {0, SPOKES};
    for (int i = 0; i < 2; i++) {
        int k = ends[i];
        if (st.got[k] == DSIM_OK || !strstr(st.msg[k], "collective mismatch") ||
            !strstr(st.msg[k], "rank 65535") || !strstr(st.msg[k], "rank 0"))
            fail_msg("rank %d did not report the mismatch: %s", st.ranks[k], st.msg[k]);
    }
    assert_true(dsim_coll_peer_count(st.comms[0]) == SPOKES);
    star_close(&j, &st);
}

/* The failure check after a timeout talks to every rank: a rank of a ring
 * of 8 in which rank 5 never joins makes the state of all 8 then (itself
 * included), and still names rank 5. */
typedef struct absent {
    coll_failures s;
    int peers[8];
    char msg[8][256];
} absent;

static void absent_rank(coll_harness *h, int rank, void *arg)
{
    absent *a = arg;
    if (rank == 5)
        return;
    float buf[64] = {0};
    dsim_err e = dsim_allreduce(h->comms[rank], buf, buf, 64, DSIM_F32, DSIM_SUM);
    if (e == DSIM_OK)
        coll_fail(&a->s, "rank %d finished an allreduce that rank 5 never joined", rank);
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", dsim_errmsg());
    a->peers[rank] = dsim_coll_peer_count(h->comms[rank]);
}

static void test_failure_check_makes_every_peer(void **state)
{
    (void)state;
    absent a;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.s.mu, NULL);
    coll_harness h;
    coll_harness_cfg cfg = {.nranks = 8, .timeout_ns = 200 * MS, .algo = DSIM_ALGO_RING};
    if (coll_harness_open(&h, &cfg) != DSIM_OK)
        fail_msg("opening 8 ranks: %s", dsim_errmsg());
    dsim_err e = coll_harness_run(&h, absent_rank, &a);
    coll_harness_close(&h);
    assert_int_equal(e, DSIM_OK);
    if (a.s.failures)
        fail_msg("%d failure(s); the first: %s", a.s.failures, a.s.first);
    /* Rank 6 waits for rank 5 itself in the ring's first step. */
    if (!strstr(a.msg[6], "rank 5"))
        fail_msg("rank 6's error does not name rank 5: %s", a.msg[6]);
    for (int r = 0; r < 8; r++)
        if (r != 5 && a.peers[r] != 8)
            fail_msg("rank %d holds the state of %d peers after the failure check, not 8: %s", r,
                     a.peers[r], a.msg[r]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_star_state_is_per_peer_used),
        cmocka_unit_test(test_star_mismatch_found),
        cmocka_unit_test(test_failure_check_makes_every_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
