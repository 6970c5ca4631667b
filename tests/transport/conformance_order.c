/* Transport conformance: ordering per peer and tag, many peers at once,
 * truncation, the sideband, polling and deadlines (conformance.h). */
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

/* ---- ordering ---- */

static const size_t order_sizes[] = {0, 1, 100, 4096, 65536, 65537, 300000};
#define NSIZES (sizeof order_sizes / sizeof order_sizes[0])

void test_order_per_peer_and_tag(void **state)
{
    (void)state;
    job j;
    job_open(&j, 3);
    enum { N = 60, NTAGS = 3 };
    /* Message i goes with tag i % NTAGS; its size cycles through eager and
     * rendezvous sizes so the two paths interleave on one stream. The first
     * third of each tag's receives are posted before any send. */
    uint8_t *sbuf[N], *rbuf[N];
    dsim_req *rs[N], *rr[N];
    int per_tag[NTAGS] = {0};
    int idx_of[NTAGS][N]; /* receive k of tag t expects message idx_of[t][k] */
    for (int i = 0; i < N; i++) {
        int t = i % NTAGS;
        idx_of[t][per_tag[t]++] = i;
        size_t len = order_sizes[i % NSIZES];
        sbuf[i] = malloc(len + 8);
        fill_pattern(sbuf[i], len, (uint32_t)i);
        rbuf[i] = malloc(300000 + 8);
    }
    int posted[NTAGS] = {0};
    for (int t = 0; t < NTAGS; t++)
        for (; posted[t] < per_tag[t] / 3; posted[t]++) {
            int k = posted[t];
            assert_int_equal(dsim_irecv(j.ep[2], 0, 7, (uint32_t)(10 + t), rbuf[idx_of[t][k]],
                                        300000 + 8, &rr[idx_of[t][k]]),
                             DSIM_OK);
        }
    for (int i = 0; i < N; i++) {
        size_t len = order_sizes[i % NSIZES];
        assert_int_equal(
            dsim_isend(j.ep[0], 2, 7, (uint32_t)(10 + i % NTAGS), sbuf[i], len, &rs[i]), DSIM_OK);
        /* A second sender on other tags must not disturb rank 0's order. */
        dsim_req *x;
        uint32_t v = (uint32_t)i;
        assert_int_equal(dsim_isend(j.ep[1], 2, 7, 10, &v, sizeof v, &x), DSIM_OK);
        assert_int_equal(dsim_wait(x, dl(&j, LONG_NS), NULL), DSIM_OK);
    }
    /* Post the rest in reverse tag order. */
    for (int t = NTAGS - 1; t >= 0; t--)
        for (; posted[t] < per_tag[t]; posted[t]++) {
            int k = posted[t];
            assert_int_equal(dsim_irecv(j.ep[2], 0, 7, (uint32_t)(10 + t), rbuf[idx_of[t][k]],
                                        300000 + 8, &rr[idx_of[t][k]]),
                             DSIM_OK);
        }
    for (int i = 0; i < N; i++) {
        size_t len = order_sizes[i % NSIZES], got = 0;
        assert_int_equal(dsim_wait(rr[i], dl(&j, LONG_NS), &got), DSIM_OK);
        assert_int_equal(got, len);
        assert_true(check_pattern(rbuf[i], len, (uint32_t)i));
        assert_int_equal(dsim_wait(rs[i], dl(&j, LONG_NS), NULL), DSIM_OK);
        free(sbuf[i]);
        free(rbuf[i]);
    }
    for (uint32_t i = 0; i < N; i++) {
        uint32_t v = 0;
        dsim_req *r;
        assert_int_equal(dsim_irecv(j.ep[2], 1, 7, 10, &v, sizeof v, &r), DSIM_OK);
        assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
        assert_int_equal(v, i);
    }
    dsim_ep_stats st;
    dsim_ep_get_stats(j.ep[2], &st);
    assert_int_equal(st.msgs_recv, 2 * N);
    assert_int_equal(st.rejected_corrupt + st.rejected_stale + st.rejected_misrouted, 0);
    dsim_ep_get_stats(j.ep[0], &st);
    assert_int_equal(st.msgs_sent, N);
    job_close(&j);
}

void test_any_tag_takes_oldest(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    uint32_t tags[] = {5, 3, 9, 3};
    for (int i = 0; i < 4; i++) {
        dsim_req *s;
        uint32_t v = 100 + (uint32_t)i;
        assert_int_equal(dsim_isend(j.ep[0], 1, 1, tags[i], &v, sizeof v, &s), DSIM_OK);
        assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    }
    /* A specific-tag receive skips older messages of other tags... */
    uint32_t v = 0;
    dsim_req *r;
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 9, &v, sizeof v, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(v, 102);
    /* ...and DSIM_ANY_TAG takes what is left, oldest first. */
    uint32_t want[] = {100, 101, 103};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dsim_irecv(j.ep[1], 0, 1, DSIM_ANY_TAG, &v, sizeof v, &r), DSIM_OK);
        assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
        assert_int_equal(v, want[i]);
    }
    /* Another comm_id never matches. */
    dsim_req *s;
    assert_int_equal(dsim_isend(j.ep[0], 1, 2, 5, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, DSIM_ANY_TAG, &v, sizeof v, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, 30 * MS), NULL), DSIM_ETIMEDOUT);
    job_close(&j);
}

void test_zero_length(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    for (int first = 0; first < 2; first++) {
        dsim_req *s, *r;
        if (first)
            assert_int_equal(dsim_irecv(j.ep[1], 0, 0, 4, NULL, 0, &r), DSIM_OK);
        assert_int_equal(dsim_isend(j.ep[0], 1, 0, 4, NULL, 0, &s), DSIM_OK);
        if (!first)
            assert_int_equal(dsim_irecv(j.ep[1], 0, 0, 4, NULL, 0, &r), DSIM_OK);
        size_t got = 99;
        assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), &got), DSIM_OK);
        assert_int_equal(got, 0);
        assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    }
    xfer(&j, 1, 0, 0, 4, 0, 0); /* into a real buffer: nothing written */
    /* To itself as well. */
    xfer(&j, 1, 1, 0, 4, 0, 1);
    job_close(&j);
}

/* Collectives use a fresh tag for every call; the per-endpoint sequence
 * tables must not grow with the number of tags, only with peers x comms. */
void test_seq_tables_bounded(void **state)
{
    (void)state;
    job j;
    job_open(&j, 3);
    for (uint32_t tag = 0; tag < 3000; tag++) {
        xfer(&j, 0, 1, 5, tag, 8, tag & 1);
        xfer(&j, 2, 1, 5, tag + 7, 0, 0);
    }
    dsim_ep_stats st;
    dsim_ep_get_stats(j.ep[1], &st);
    assert_int_equal(st.msgs_recv, 6000);
    assert_int_equal(st.seq_streams, 2); /* from rank 0 and rank 2 on comm 5 */
    dsim_ep_get_stats(j.ep[0], &st);
    assert_int_equal(st.seq_streams, 1);
    job_close(&j);
}

void test_sizes_both_orders(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    for (size_t i = 0; i < NSIZES; i++)
        for (int first = 0; first < 2; first++)
            xfer(&j, 0, 1, 3, (uint32_t)i, order_sizes[i], first);
    /* Self-sends take the same paths. */
    xfer(&j, 1, 1, 3, 50, 300000, 0);
    xfer(&j, 1, 1, 3, 50, 300000, 1);
    job_close(&j);
}

void test_multi_mib(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    size_t len = 8u << 20;
    xfer(&j, 0, 1, 1, 1, len, 0);
    xfer(&j, 0, 1, 1, 1, len, 1);
    job_close(&j);
}

/* ---- many peers, one thread each ---- */

typedef struct a2a {
    job *j;
    int rank;
    atomic_int *fails;
    char why[160];
} a2a;

#define A2A_LEN(src, dst)                                                                          \
    ((size_t)(((src)*7 + (dst)*13) % 5 == 0 ? 150000 : ((src)*31 + (dst)) % 2000))

static void a2a_worker(void *p)
{
    a2a *w = p;
    job *j = w->j;
    int n = j->n, me = w->rank;
    uint8_t *sb[MAXR], *rb[MAXR];
    dsim_req *reqs[2 * MAXR];
    for (int round = 0; round < 3; round++) {
        for (int q = 0; q < n; q++) {
            size_t sl = A2A_LEN(me, q), rl = A2A_LEN(q, me);
            sb[q] = malloc(sl + 1);
            rb[q] = malloc(rl + 1);
            fill_pattern(sb[q], sl, (uint32_t)(me * 100 + q + round));
        }
        /* Receives and sends in a rank-dependent order: some find the
         * message there, some are there first. */
        int k = 0;
        for (int i = 0; i < n; i++) {
            int q = (me + i) % n;
            if (dsim_irecv(j->ep[me], q, 9, (uint32_t)round, rb[q], A2A_LEN(q, me), &reqs[k++]) !=
                DSIM_OK)
                goto fail;
            int d = (me + n - i) % n;
            if (dsim_isend(j->ep[me], d, 9, (uint32_t)round, sb[d], A2A_LEN(me, d), &reqs[k++]) !=
                DSIM_OK)
                goto fail;
        }
        int failed = -2;
        if (dsim_waitall(reqs, k, dsim_rt_deadline(j->rt, LONG_NS), &failed) != DSIM_OK)
            goto fail;
        for (int q = 0; q < n; q++) {
            if (!check_pattern(rb[q], A2A_LEN(q, me), (uint32_t)(q * 100 + me + round))) {
                snprintf(w->why, sizeof w->why, "rank %d: bad data from rank %d round %d", me, q,
                         round);
                atomic_fetch_add(w->fails, 1);
            }
            free(sb[q]);
            free(rb[q]);
        }
    }
    return;
fail:
    snprintf(w->why, sizeof w->why, "rank %d: %s", me, dsim_errmsg());
    atomic_fetch_add(w->fails, 1);
}

void test_many_peers_all_to_all(void **state)
{
    (void)state;
    job j;
    job_open(&j, MAXR);
    atomic_int fails = 0;
    a2a w[MAXR];
    dsim_task *t[MAXR];
    for (int r = 0; r < MAXR; r++) {
        w[r] = (a2a){.j = &j, .rank = r, .fails = &fails};
        assert_int_equal(dsim_rt_spawn(j.rt, r, a2a_worker, &w[r], &t[r]), DSIM_OK);
    }
    for (int r = 0; r < MAXR; r++)
        assert_int_equal(dsim_rt_join(j.rt, t[r]), DSIM_OK);
    for (int r = 0; r < MAXR; r++)
        if (w[r].why[0])
            print_message("%s\n", w[r].why);
    assert_int_equal(atomic_load(&fails), 0);
    dsim_ep_stats st;
    dsim_ep_get_stats(j.ep[5], &st);
    assert_int_equal(st.msgs_recv, 3 * MAXR);
    assert_int_equal(st.msgs_sent, 3 * MAXR);
    job_close(&j);
}

/* ---- errors on the receive side ---- */

void test_truncation(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    size_t lens[] = {100, 400000};
    for (int i = 0; i < 2; i++)
        for (int first = 0; first < 2; first++) {
            size_t len = lens[i];
            uint8_t *s = calloc(1, len), *d = calloc(1, len);
            dsim_req *rs, *rr;
            if (first)
                assert_int_equal(dsim_irecv(j.ep[1], 0, 2, 8, d, len / 2, &rr), DSIM_OK);
            assert_int_equal(dsim_isend(j.ep[0], 1, 2, 8, s, len, &rs), DSIM_OK);
            if (!first)
                assert_int_equal(dsim_irecv(j.ep[1], 0, 2, 8, d, len / 2, &rr), DSIM_OK);
            assert_int_equal(dsim_wait(rr, dl(&j, LONG_NS), NULL), DSIM_ETRUNC);
            assert_int_equal(dsim_last_error()->peer, 0);
            assert_non_null(strstr(dsim_errmsg(), "rank 0"));
            /* The sender is not to blame. */
            assert_int_equal(dsim_wait(rs, dl(&j, LONG_NS), NULL), DSIM_OK);
            free(s);
            free(d);
        }
    /* The stream goes on after a truncated message. */
    xfer(&j, 0, 1, 2, 8, 10, 0);
    job_close(&j);
}

/* ---- sideband ---- */

/* Waits (tcp delivers on its own thread) until a queued message from src
 * with a sideband shows to dsim_ep_peek_side; 1 if it did. */
static int peek_soon(job *j, int dst, int src, uint32_t comm, uint32_t tag, uint32_t mask,
                     uint8_t *side)
{
    for (int i = 0; i < 10000; i++) {
        if (dsim_ep_peek_side(j->ep[dst], src, comm, tag, mask, side))
            return 1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* A message's sideband reaches the receive that takes it, whatever the
 * size (eager or handed over), the order of posting and the kind of
 * receive, and when the payload does not fit; a plain message has none; a
 * receiver can look at a queued one without taking it. */
void test_sideband(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    static const size_t lens[] = {0, 100, 65537, 400000};
    uint8_t side[DSIM_TP_SIDE_LEN], got_side[DSIM_TP_SIDE_LEN], peek[DSIM_TP_SIDE_LEN];
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (int mode = 0; mode < 4; mode++) {
            /* mode 0: sent first, 1: posted first, 2: reducing, sent first,
             * 3: a receive too short for the payload. */
            size_t len = mode == 2 ? lens[i] & ~(size_t)3 : lens[i]; /* whole floats */
            uint32_t tag = 0x5000u + (uint32_t)(i * 4 + (size_t)mode);
            fill_pattern(side, sizeof side, tag);
            if (mode == 3 && len == 0)
                continue; /* nothing to cut short */
            uint8_t *s = calloc(len + 16, 1), *d = calloc(len + 16, 1);
            fill_pattern(s, len, tag);
            size_t cap = mode == 3 ? len / 2 : len + 16;
            dsim_req *rs = NULL, *rr = NULL;
            if (mode == 1)
                assert_int_equal(dsim_irecv(j.ep[1], 0, 3, tag, d, cap, &rr), DSIM_OK);
            assert_int_equal(dsim_isend_side(j.ep[0], 1, 3, tag, s, len, side, &rs), DSIM_OK);
            if (mode != 1) {
                /* Queued: found by the bits the mask keeps, not by others. */
                memset(peek, 0, sizeof peek);
                assert_true(peek_soon(&j, 1, 0, 3, tag & 0xF000u, 0xF000u, peek));
                assert_memory_equal(peek, side, sizeof side);
                assert_false(dsim_ep_peek_side(j.ep[1], 0, 3, 0x6000u, 0xF000u, peek));
                assert_false(dsim_ep_peek_side(j.ep[1], 0, 4, tag, ~0u, peek));
                if (mode == 2)
                    assert_int_equal(dsim_irecv_reduce(j.ep[1], 0, 3, tag, d, len / sizeof(float),
                                                       DSIM_F32, DSIM_SUM, &rr),
                                     DSIM_OK);
                else
                    assert_int_equal(dsim_irecv(j.ep[1], 0, 3, tag, d, cap, &rr), DSIM_OK);
            }
            int has = -1;
            size_t got = 12345;
            memset(got_side, 0, sizeof got_side);
            dsim_err e = dsim_wait_side(rr, dl(&j, LONG_NS), &got, got_side, &has);
            assert_int_equal(e, mode == 3 ? DSIM_ETRUNC : DSIM_OK);
            assert_int_equal(has, 1);
            assert_memory_equal(got_side, side, sizeof side);
            if (mode != 3) {
                assert_int_equal(got, len);
                if (mode != 2)
                    assert_true(check_pattern(d, len, tag));
            }
            assert_int_equal(dsim_wait(rs, dl(&j, LONG_NS), NULL), DSIM_OK);
            /* Taken: nothing is left to look at. */
            assert_false(dsim_ep_peek_side(j.ep[1], 0, 3, tag, ~0u, peek));
            free(s);
            free(d);
        }
    /* A plain message carries none, and the sideband of one message does
     * not stick to the next. */
    uint32_t v = 7, w = 0;
    dsim_req *rs, *rr;
    assert_int_equal(dsim_isend(j.ep[0], 1, 3, 9, &v, sizeof v, &rs), DSIM_OK);
    assert_int_equal(dsim_irecv(j.ep[1], 0, 3, 9, &w, sizeof w, &rr), DSIM_OK);
    int has = -1;
    assert_int_equal(dsim_wait_side(rr, dl(&j, LONG_NS), NULL, got_side, &has), DSIM_OK);
    assert_int_equal(has, 0);
    assert_int_equal(w, 7);
    assert_int_equal(dsim_wait(rs, dl(&j, LONG_NS), NULL), DSIM_OK);
    /* A receive that times out has none either. */
    assert_int_equal(dsim_irecv(j.ep[1], 0, 3, 10, &w, sizeof w, &rr), DSIM_OK);
    has = -1;
    assert_int_equal(dsim_wait_side(rr, dl(&j, 1 * MS), NULL, got_side, &has), DSIM_ETIMEDOUT);
    assert_int_equal(has, 0);
    /* No sideband to send is an error naming the call. */
    assert_int_equal(dsim_isend_side(j.ep[0], 1, 3, 9, &v, sizeof v, NULL, &rs), DSIM_EINVAL);
    assert_null(rs);
    assert_non_null(strstr(dsim_errmsg(), "dsim_isend_side"));
    job_close(&j);
}

/* A poll collects what is there; "not yet" leaves the error context alone. */
void test_poll(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    uint32_t got = 0, v = 41;
    dsim_req *r, *s;
    assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 9, &got, sizeof got, &r), DSIM_OK);
    DSIM_ERR(DSIM_EPEER, 5, "an earlier failure");
    assert_int_equal(dsim_poll(r, NULL), DSIM_ETIMEDOUT);
    assert_int_equal(dsim_last_error()->code, DSIM_EPEER);
    assert_string_equal(dsim_errmsg(), "an earlier failure");
    /* a quiet wait whose deadline passes is as quiet; a loud one names the peer */
    assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 9, &got, sizeof got, &r), DSIM_OK);
    int has = 1;
    assert_int_equal(dsim_wait_flags(r, dl(&j, MS), DSIM_WAIT_QUIET, NULL, NULL, &has),
                     DSIM_ETIMEDOUT);
    assert_int_equal(has, 0);
    assert_string_equal(dsim_errmsg(), "an earlier failure");
    assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 9, &got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait_flags(r, dl(&j, MS), 0, NULL, NULL, NULL), DSIM_ETIMEDOUT);
    assert_int_equal(dsim_last_error()->peer, 1);
    assert_non_null(strstr(dsim_errmsg(), "timed out after"));
    /* the polled receive was withdrawn: the message goes to the next one */
    assert_int_equal(dsim_isend(j.ep[1], 0, 1, 9, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, 0);
    assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 9, &got, sizeof got, &r), DSIM_OK);
    size_t len = 0;
    dsim_err e = DSIM_ETIMEDOUT;
    for (int i = 0; i < 1000 && e == DSIM_ETIMEDOUT; i++) {
        /* a backend may deliver from a thread of its own: poll until it has */
        if (i > 0) {
            assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 9, &got, sizeof got, &r), DSIM_OK);
            dsim_rt_sleep_until(j.rt, dsim_rt_now(j.rt) + MS);
        }
        e = dsim_poll(r, &len);
    }
    assert_int_equal(e, DSIM_OK);
    assert_int_equal(len, sizeof got);
    assert_int_equal(got, 41);
    assert_int_equal(dsim_poll(NULL, NULL), DSIM_EINVAL);
    job_close(&j);
}

void test_deadline_names_peer(void **state)
{
    (void)state;
    job j;
    job_open(&j, 4);
    uint8_t b[8];
    dsim_req *r;
    assert_int_equal(dsim_irecv(j.ep[0], 3, 1, 7, b, sizeof b, &r), DSIM_OK);
    int64_t t0 = dsim_rt_now(j.rt);
    assert_int_equal(dsim_wait(r, t0 + 300 * MS, NULL), DSIM_ETIMEDOUT);
    int64_t el = dsim_rt_now(j.rt) - t0;
    assert_true(el >= 300 * MS);
    assert_true(el < 3000 * MS);
    const dsim_error *e = dsim_last_error();
    assert_int_equal(e->code, DSIM_ETIMEDOUT);
    assert_int_equal(e->peer, 3);
    assert_non_null(strstr(e->msg, "timed out after"));
    assert_non_null(strstr(e->msg, "rank 3 (comm 1, tag 7)"));
    /* The timed-out receive was withdrawn: a later message goes to a new
     * receive, not into the old buffer. */
    memset(b, 0, sizeof b);
    uint32_t v = 77, got = 0;
    dsim_req *s;
    assert_int_equal(dsim_isend(j.ep[3], 0, 1, 7, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    for (size_t i = 0; i < sizeof b; i++)
        assert_int_equal(b[i], 0);
    assert_int_equal(dsim_irecv(j.ep[0], 3, 1, 7, &got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, 77);
    /* A large send nobody receives times out too, naming the receiver. */
    size_t len = 1u << 20;
    uint8_t *big = calloc(1, len);
    assert_int_equal(dsim_isend(j.ep[1], 2, 1, 7, big, len, &s), DSIM_OK);
    dsim_err se = dsim_wait(s, dl(&j, 50 * MS), NULL);
    if (se != DSIM_OK) { /* a backend may buffer even large sends */
        assert_int_equal(se, DSIM_ETIMEDOUT);
        assert_int_equal(dsim_last_error()->peer, 2);
        assert_non_null(strstr(dsim_errmsg(), "rank 2"));
        /* Withdrawn: rank 2 never sees it, and the buffer may go. */
        free(big);
        big = NULL;
        uint8_t one;
        assert_int_equal(dsim_irecv(j.ep[2], 1, 1, 7, &one, 1, &r), DSIM_OK);
        assert_int_equal(dsim_wait(r, dl(&j, 30 * MS), NULL), DSIM_ETIMEDOUT);
    }
    free(big);
    /* A deadline already passed still returns a finished request's result
     * (finished first: over a network the message takes a moment). */
    assert_int_equal(dsim_isend(j.ep[3], 0, 1, 8, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_irecv(j.ep[0], 3, 1, 8, &got, sizeof got, &r), DSIM_OK);
    for (int64_t end = dl(&j, LONG_NS); !dsim_req_done(r) && dsim_rt_now(j.rt) < end;)
        dsim_rt_sleep_until(j.rt, dl(&j, MS));
    assert_int_equal(dsim_wait(r, 0, NULL), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    job_close(&j);
}
