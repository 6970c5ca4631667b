/* Transport conformance: abort, and the receive path's header checks
 * (stale, misrouted, duplicate, corrupt, gaps) (conformance.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/log.h"
#include "dsim/rt.h"
#include "dsim/spi/transport.h"
#include "dsim/transport.h"
#include "conformance.h"
#include "fault/fault.h"

/* ---- abort ---- */

typedef struct waiter {
    job *j;
    int rank, peer;
    int send; /* wait on a large send instead of a receive */
    dsim_err rc;
    int64_t woke;
    char msg[512];
} waiter;

static void waiter_fn(void *p)
{
    waiter *w = p;
    dsim_req *r;
    uint8_t buf[16];
    uint8_t *big = w->send ? calloc(1, 1u << 21) : NULL;
    dsim_err e = w->send ? dsim_isend(w->j->ep[w->rank], w->peer, 4, 4, big, 1u << 21, &r)
                         : dsim_irecv(w->j->ep[w->rank], w->peer, 4, 4, buf, sizeof buf, &r);
    if (e == DSIM_OK)
        e = dsim_wait(r, dsim_rt_deadline(w->j->rt, 10000 * MS), NULL);
    w->rc = e;
    w->woke = dsim_rt_now(w->j->rt);
    snprintf(w->msg, sizeof w->msg, "%s", dsim_errmsg());
    free(big);
}

void test_abort_wakes_waiters(void **state)
{
    (void)state;
    job j;
    job_open(&j, 4);
    waiter w[3] = {
        {.j = &j, .rank = 0, .peer = 1},
        {.j = &j, .rank = 1, .peer = 0},
        {.j = &j, .rank = 3, .peer = 2, .send = 1},
    };
    dsim_task *t[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(dsim_rt_spawn(j.rt, i, waiter_fn, &w[i], &t[i]), DSIM_OK);
    assert_int_equal(dsim_rt_sleep_until(j.rt, dl(&j, 100 * MS)), DSIM_OK);
    assert_false(dsim_fabric_aborted(j.f));
    int64_t t0 = dsim_rt_now(j.rt);
    dsim_ep_abort(j.ep[2], 2, "heartbeat lost");
    assert_true(dsim_fabric_aborted(j.f));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dsim_rt_join(j.rt, t[i]), DSIM_OK);
        if (w[i].send && w[i].rc == DSIM_OK && w[i].woke < t0)
            continue; /* a backend that buffers large sends finished it before the abort */
        assert_int_equal(w[i].rc, DSIM_EABORTED);
        assert_true(w[i].woke - t0 < 2000 * MS);
        assert_non_null(strstr(w[i].msg, "heartbeat lost"));
        assert_non_null(strstr(w[i].msg, "rank 2"));
    }
    job_close(&j);
}

void test_ops_after_abort(void **state)
{
    (void)state;
    job j;
    job_open(&j, 3);
    uint32_t v = 1;
    dsim_req *pending, *r;
    assert_int_equal(dsim_irecv(j.ep[0], 1, 0, 0, &v, sizeof v, &pending), DSIM_OK);
    assert_false(dsim_req_done(pending));
    dsim_fabric_abort(j.f, 1, "node 1 lost power");
    dsim_fabric_abort(j.f, 2, "a second abort"); /* the first reason stands */
    assert_true(dsim_req_done(pending));
    assert_int_equal(dsim_wait(pending, dl(&j, LONG_NS), NULL), DSIM_EABORTED);
    assert_int_equal(dsim_last_error()->peer, 1);
    assert_non_null(strstr(dsim_errmsg(), "node 1 lost power"));
    assert_int_equal(dsim_isend(j.ep[0], 1, 0, 0, &v, sizeof v, &r), DSIM_EABORTED);
    assert_null(r);
    assert_non_null(strstr(dsim_errmsg(), "node 1 lost power"));
    assert_int_equal(dsim_irecv(j.ep[1], 0, 0, 0, &v, sizeof v, &r), DSIM_EABORTED);
    assert_int_equal(dsim_irecv_reduce(j.ep[1], 0, 0, 0, &v, 1, DSIM_I32, DSIM_SUM, &r),
                     DSIM_EABORTED);
    assert_int_equal(dsim_last_error()->peer, 1);
    dsim_tp_hdr h;
    assert_int_equal(dsim_tp_hdr_next(j.ep[0], 1, 0, 0, sizeof v, &h), DSIM_OK);
    assert_int_equal(dsim_tp_inject(j.ep[0], 1, &h, &v, sizeof v, &r), DSIM_EABORTED);
    job_close(&j);
}

/* Two aborts at once: the second must not return before the fabric is
 * revoked ("every future operation fails"). The first is given a very long
 * reason, which keeps it formatting for milliseconds after it has claimed the
 * abort and before it revokes the fabric. */
typedef struct slow_abort {
    dsim_fabric *f;
    const char *why;
    atomic_int started;
} slow_abort;

static void slow_abort_fn(void *p)
{
    slow_abort *a = p;
    atomic_store(&a->started, 1);
    dsim_fabric_abort(a->f, 1, a->why);
}

void test_concurrent_abort_visible_on_return(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    size_t n = (size_t)64 << 20;
    char *why = malloc(n + 1);
    assert_non_null(why);
    memset(why, 'x', n);
    why[n] = '\0';
    slow_abort a = {.f = j.f, .why = why};
    atomic_init(&a.started, 0);
    dsim_task *t;
    assert_int_equal(dsim_rt_spawn(j.rt, 1, slow_abort_fn, &a, &t), DSIM_OK);
    while (!atomic_load(&a.started))
        dsim_rt_sleep_until(j.rt, dl(&j, MS / 10));
    dsim_rt_sleep_until(j.rt, dl(&j, MS));
    dsim_fabric_abort(j.f, 0, "a second abort");
    assert_true(dsim_fabric_aborted(j.f));
    uint32_t v = 1;
    dsim_req *r;
    assert_int_equal(dsim_isend(j.ep[0], 1, 0, 0, &v, sizeof v, &r), DSIM_EABORTED);
    assert_int_equal(dsim_rt_join(j.rt, t), DSIM_OK);
    free(why);
    job_close(&j);
}

/* ---- header checks ---- */

static void expect_nothing(job *j, int dst, int src, uint32_t comm, uint32_t tag)
{
    uint8_t b[64];
    dsim_req *r;
    assert_int_equal(dsim_irecv(j->ep[dst], src, comm, tag, b, sizeof b, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(j, 40 * MS), NULL), DSIM_ETIMEDOUT);
}

void inject(job *j, int from, int to, const dsim_tp_hdr *h, const void *p, size_t len)
{
    dsim_req *r;
    assert_int_equal(dsim_tp_inject(j->ep[from], to, h, p, len, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(j, LONG_NS), NULL), DSIM_OK);
}

/* Polls rank's counters until the counter at `field` reaches want (frames
 * may be checked on another thread for some backends). */
static dsim_ep_stats wait_stats(job *j, int rank, size_t field, uint64_t want)
{
    dsim_ep_stats st;
    int64_t end = dl(j, 5000 * MS);
    for (;;) {
        dsim_ep_get_stats(j->ep[rank], &st);
        uint64_t v;
        memcpy(&v, (char *)&st + field, sizeof v);
        if (v >= want || dsim_rt_now(j->rt) > end)
            return st;
        dsim_rt_sleep_until(j->rt, dl(j, 1 * MS));
    }
}

void test_stale_epoch_rejected(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    dsim_ep_set_epoch(j.ep[1], 5, 3);
    /* Rank 0 still sends in epoch 0 for comm 5: stale. */
    uint32_t v = 11;
    dsim_req *s;
    assert_int_equal(dsim_isend(j.ep[0], 1, 5, 1, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    dsim_ep_stats st = wait_stats(&j, 1, offsetof(dsim_ep_stats, rejected_stale), 1);
    assert_int_equal(st.rejected_stale, 1);
    expect_nothing(&j, 1, 0, 5, 1);
    /* A hand-made frame one epoch behind is stale too, large or small. */
    dsim_ep_set_epoch(j.ep[0], 5, 3);
    dsim_tp_hdr h;
    assert_int_equal(dsim_tp_hdr_next(j.ep[0], 1, 5, 1, sizeof v, &h), DSIM_OK);
    assert_int_equal(h.epoch, 3);
    h.epoch = 2;
    inject(&j, 0, 1, &h, &v, sizeof v);
    size_t big = 200000;
    uint8_t *bp = calloc(1, big);
    h.len = big;
    h.seq++; /* stale for its epoch alone, not as a repeat */
    inject(&j, 0, 1, &h, bp, big);
    st = wait_stats(&j, 1, offsetof(dsim_ep_stats, rejected_stale), 3);
    assert_int_equal(st.rejected_stale, 3);
    expect_nothing(&j, 1, 0, 5, 1);
    /* In the same epoch the stream works; other comms were never affected. */
    xfer(&j, 0, 1, 5, 1, 8, 0);
    xfer(&j, 0, 1, 6, 1, 8, 0);
    /* Raising the epoch drops queued messages of older epochs. */
    assert_int_equal(dsim_isend(j.ep[0], 1, 5, 2, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    dsim_req *bs;
    assert_int_equal(dsim_isend(j.ep[0], 1, 5, 2, bp, big, &bs), DSIM_OK);
    dsim_ep_get_stats(j.ep[1], &st);
    uint64_t before = st.rejected_stale;
    /* Whether they are queued by now or arrive later, both are stale. */
    dsim_ep_set_epoch(j.ep[1], 5, 4);
    /* The large send finishes (its message was dropped) and nothing is
     * delivered. */
    assert_int_equal(dsim_wait(bs, dl(&j, LONG_NS), NULL), DSIM_OK);
    st = wait_stats(&j, 1, offsetof(dsim_ep_stats, rejected_stale), before + 2);
    assert_int_equal(st.rejected_stale, before + 2);
    expect_nothing(&j, 1, 0, 5, 2);
    /* Epochs only go up. */
    dsim_ep_set_epoch(j.ep[1], 5, 1);
    dsim_ep_set_epoch(j.ep[0], 5, 4);
    xfer(&j, 0, 1, 5, 2, 8, 1);
    free(bp);
    job_close(&j);
}

void test_misrouted_rejected(void **state)
{
    (void)state;
    job j;
    job_open(&j, 3);
    uint32_t v = 5;
    dsim_tp_hdr h;
    assert_int_equal(dsim_tp_hdr_next(j.ep[0], 2, 1, 1, sizeof v, &h), DSIM_OK);
    inject(&j, 0, 1, &h, &v, sizeof v); /* addressed to 2, handed to 1 */
    h.dst = 99;
    inject(&j, 0, 1, &h, &v, sizeof v);
    dsim_ep_stats st = wait_stats(&j, 1, offsetof(dsim_ep_stats, rejected_misrouted), 2);
    assert_int_equal(st.rejected_misrouted, 2);
    assert_int_equal(st.msgs_recv, 0);
    expect_nothing(&j, 1, 0, 1, 1);
    expect_nothing(&j, 2, 0, 1, 1);
    /* It consumed no sequence number at rank 2. */
    xfer(&j, 0, 2, 1, 1, 4, 0);
    job_close(&j);
}

void test_duplicate_rejected(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    size_t lens[] = {8, 150000};
    for (int i = 0; i < 2; i++) {
        size_t len = lens[i];
        uint8_t *p = malloc(len);
        fill_pattern(p, len, 3);
        dsim_tp_hdr h;
        assert_int_equal(dsim_tp_hdr_next(j.ep[0], 1, 2, 6, len, &h), DSIM_OK);
        xfer(&j, 0, 1, 2, 6, len, i); /* uses h.seq */
        inject(&j, 0, 1, &h, p, len);
        h.seq = 0; /* never valid */
        inject(&j, 0, 1, &h, p, len);
        dsim_ep_stats st =
            wait_stats(&j, 1, offsetof(dsim_ep_stats, rejected_stale), 2 * (uint64_t)(i + 1));
        assert_int_equal(st.rejected_stale, 2 * (i + 1));
        expect_nothing(&j, 1, 0, 2, 6);
        free(p);
    }
    job_close(&j);
}

void test_corrupt_rejected(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    uint8_t p[32] = {1, 2, 3};
    dsim_tp_hdr good, h;
    assert_int_equal(dsim_tp_hdr_next(j.ep[0], 1, 1, 1, sizeof p, &good), DSIM_OK);
    h = good;
    h.magic ^= 0x01000000u;
    inject(&j, 0, 1, &h, p, sizeof p);
    h = good;
    h.version = DSIM_TP_VERSION + 1;
    inject(&j, 0, 1, &h, p, sizeof p);
    h = good;
    h.len = sizeof p + 1; /* says more than it carries */
    inject(&j, 0, 1, &h, p, sizeof p);
    h = good;
    h.len = DSIM_TP_MAX_LEN + 1;
    inject(&j, 0, 1, &h, p, sizeof p);
    h = good;
    h.src = 7; /* no such rank */
    inject(&j, 0, 1, &h, p, sizeof p);
    h = good;
    h.tag = DSIM_ANY_TAG;
    inject(&j, 0, 1, &h, p, sizeof p);
    dsim_ep_stats st = wait_stats(&j, 1, offsetof(dsim_ep_stats, rejected_corrupt), 6);
    assert_int_equal(st.rejected_corrupt, 6);
    assert_int_equal(st.msgs_recv, 0);
    expect_nothing(&j, 1, 0, 1, 1);
    /* None of them consumed the sequence number: the good frame is taken. */
    inject(&j, 0, 1, &good, p, sizeof p);
    uint8_t d[32];
    dsim_req *r;
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 1, d, sizeof d, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_memory_equal(d, p, sizeof p);
    job_close(&j);
}

/* A payload that does not match its checksum is never used: its receive
 * fails with EPROTO saying "corrupt", whatever its tag, and the stream goes
 * on with the next frame. A matching checksum is delivered as usual. */
void test_payload_checksum(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    uint8_t p[4096], d[4096];
    for (size_t i = 0; i < sizeof p; i++)
        p[i] = (uint8_t)(i * 7 + 1);
    dsim_tp_hdr h;
    assert_int_equal(dsim_tp_hdr_next(j.ep[0], 1, 1, 5, sizeof p, &h), DSIM_OK);
    h.flags |= DSIM_TP_F_CHECKSUM;
    h.checksum = dsim_tp_checksum(p, sizeof p) ^ 1u;
    inject(&j, 0, 1, &h, p, sizeof p);
    dsim_req *r;
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 6, d, sizeof d, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "corrupt"));
    assert_int_equal(dsim_last_error()->peer, 0);
    dsim_ep_stats st;
    dsim_ep_get_stats(j.ep[1], &st);
    assert_int_equal(st.rejected_corrupt, 1);
    /* injected frames do not move the sender's counter: the next one by hand */
    h.seq++;
    h.checksum = dsim_tp_checksum(p, sizeof p);
    inject(&j, 0, 1, &h, p, sizeof p);
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 5, d, sizeof d, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_memory_equal(d, p, sizeof p);
    /* CRC-32C's check value */
    assert_int_equal(dsim_tp_checksum("123456789", 9), 0xE3069283u);
    job_close(&j);
}

void test_gap_fails_receive(void **state)
{
    (void)state;
    job j;
    job_open(&j, 3);
    uint32_t v = 42, got = 0;
    dsim_tp_hdr h;
    assert_int_equal(dsim_tp_hdr_next(j.ep[2], 0, 4, 3, sizeof v, &h), DSIM_OK);
    h.seq += 2; /* two frames lost on the way */
    inject(&j, 2, 0, &h, &v, sizeof v);
    dsim_req *r;
    assert_int_equal(dsim_irecv(j.ep[0], 2, 4, 3, &got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
    assert_int_equal(dsim_last_error()->peer, 2);
    assert_non_null(strstr(dsim_errmsg(), "rank 2"));
    assert_non_null(strstr(dsim_errmsg(), "lost"));
    /* The frame that revealed the gap is still delivered after it. */
    assert_int_equal(dsim_irecv(j.ep[0], 2, 4, 3, &got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, 42);
    /* A receive posted before the gap is seen fails the same way. */
    assert_int_equal(dsim_irecv(j.ep[0], 2, 4, 3, &got, sizeof got, &r), DSIM_OK);
    h.seq += 3;
    inject(&j, 2, 0, &h, &v, sizeof v);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
    assert_int_equal(dsim_last_error()->peer, 2);
    job_close(&j);
}

/* Sequence numbers run per pair, not per tag: the frame that reveals a gap
 * may carry another tag than the lost one. The receive waiting for the lost
 * frame fails at once, and the one whose message arrived gets it. */
void test_gap_other_tag(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    uint32_t v = 42, g1, g2;
    dsim_req *r1, *r2;
    /* comm 4: both receives posted before the frame; comm 5: after it. */
    for (uint32_t comm = 4; comm <= 5; comm++) {
        int posted_first = comm == 4;
        g1 = g2 = 0;
        if (posted_first) {
            assert_int_equal(dsim_irecv(j.ep[1], 0, comm, 1, &g1, sizeof g1, &r1), DSIM_OK);
            assert_int_equal(dsim_irecv(j.ep[1], 0, comm, 2, &g2, sizeof g2, &r2), DSIM_OK);
        }
        dsim_tp_hdr h;
        assert_int_equal(dsim_tp_hdr_next(j.ep[0], 1, comm, 2, sizeof v, &h), DSIM_OK);
        h.seq++; /* the frame before it, with tag 1, was lost */
        inject(&j, 0, 1, &h, &v, sizeof v);
        if (!posted_first) {
            assert_int_equal(dsim_irecv(j.ep[1], 0, comm, 1, &g1, sizeof g1, &r1), DSIM_OK);
            assert_int_equal(dsim_irecv(j.ep[1], 0, comm, 2, &g2, sizeof g2, &r2), DSIM_OK);
        }
        assert_int_equal(dsim_wait(r2, dl(&j, 2000 * MS), NULL), DSIM_OK);
        assert_int_equal(g2, 42);
        assert_int_equal(dsim_wait(r1, dl(&j, 2000 * MS), NULL), DSIM_EPROTO);
        assert_int_equal(dsim_last_error()->peer, 0);
        assert_non_null(strstr(dsim_errmsg(), "lost 1 message"));
        assert_int_equal(g1, 0);
    }
    job_close(&j);
}
