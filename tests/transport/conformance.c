/* The transport conformance suite, written once and run against every
 * backend: `conformance BACKEND` (registered once per backend in
 * meson.build). Exits 77 if BACKEND is not registered in this build.
 *
 * Worker threads never call cmocka asserts (they longjmp): they record the
 * first failure in their job and the main thread checks it. */
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
#include "fault/fault.h"

#define MS      1000000LL
#define MAXR    16
#define LONG_NS (20000 * MS) /* "never" for waits that must succeed */

static const char *tp_backend = "inproc";
/* `conformance BACKEND filter`: every fabric runs under the fault filter
 * with no faults (pass-through), which must change nothing. */
static int tp_filtered;

typedef struct job job;
static void job_filter(job *j, dsim_fabric_cfg *cfg);

struct job {
    dsim_rt *rt;
    dsim_fabric *f;
    dsim_ep *ep[MAXR];
    int n;
    dsim_faults *fs;
};

static void job_open_opts(job *j, int n, const char *options)
{
    memset(j, 0, sizeof *j);
    assert_true(n <= MAXR);
    assert_int_equal(dsim_rt_create("threads", &j->rt), DSIM_OK);
    dsim_fabric_cfg cfg = {.backend = tp_backend, .nranks = n, .rt = j->rt, .options = options};
    job_filter(j, &cfg);
    assert_int_equal(dsim_fabric_open(&cfg, &j->f), DSIM_OK);
    j->n = n;
    for (int r = 0; r < n; r++) {
        assert_int_equal(dsim_ep_open(j->f, r, &j->ep[r]), DSIM_OK);
        assert_int_equal(dsim_ep_rank(j->ep[r]), r);
    }
}

static void job_open(job *j, int n)
{
    job_open_opts(j, n, NULL);
}

static void job_close(job *j)
{
    for (int r = 0; r < j->n; r++)
        dsim_ep_close(j->ep[r]);
    dsim_fabric_close(j->f);
    dsim_rt_destroy(j->rt);
    dsim_faults_destroy(j->fs);
    j->fs = NULL;
}

static int64_t dl(job *j, int64_t ns)
{
    return dsim_rt_deadline(j->rt, ns);
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

static int check_pattern(const uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        if (p[i] != (uint8_t)(x >> 16))
            return 0;
    }
    return 1;
}

/* Sends one message from a to b and checks it arrives intact. */
static void xfer(job *j, int a, int b, uint32_t comm, uint32_t tag, size_t len, int recv_first)
{
    uint8_t *s = calloc(len ? len : 1, 1), *d = malloc(len + 16);
    fill_pattern(s, len, (uint32_t)len + tag);
    memset(d, 0xEE, len + 16);
    dsim_req *rs = NULL, *rr = NULL;
    if (recv_first)
        assert_int_equal(dsim_irecv(j->ep[b], a, comm, tag, d, len + 16, &rr), DSIM_OK);
    assert_int_equal(dsim_isend(j->ep[a], b, comm, tag, s, len, &rs), DSIM_OK);
    if (!recv_first)
        assert_int_equal(dsim_irecv(j->ep[b], a, comm, tag, d, len + 16, &rr), DSIM_OK);
    size_t got = 12345;
    assert_int_equal(dsim_wait(rr, dl(j, LONG_NS), &got), DSIM_OK);
    assert_int_equal(dsim_wait(rs, dl(j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, len);
    assert_true(check_pattern(d, len, (uint32_t)len + tag));
    for (size_t i = len; i < len + 16; i++)
        assert_int_equal(d[i], 0xEE); /* nothing written past the message */
    free(s);
    free(d);
}

/* ---- ordering ---- */

static const size_t order_sizes[] = {0, 1, 100, 4096, 65536, 65537, 300000};
#define NSIZES (sizeof order_sizes / sizeof order_sizes[0])

static void test_order_per_peer_and_tag(void **state)
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

static void test_any_tag_takes_oldest(void **state)
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

static void test_zero_length(void **state)
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
static void test_seq_tables_bounded(void **state)
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

static void test_sizes_both_orders(void **state)
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

static void test_multi_mib(void **state)
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

static void test_many_peers_all_to_all(void **state)
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

static void test_truncation(void **state)
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
static void test_sideband(void **state)
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
static void test_poll(void **state)
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

static void test_deadline_names_peer(void **state)
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

static void test_abort_wakes_waiters(void **state)
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

static void test_ops_after_abort(void **state)
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

static void test_concurrent_abort_visible_on_return(void **state)
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

static void inject(job *j, int from, int to, const dsim_tp_hdr *h, const void *p, size_t len)
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

static void test_stale_epoch_rejected(void **state)
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

static void test_misrouted_rejected(void **state)
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

static void test_duplicate_rejected(void **state)
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

static void test_corrupt_rejected(void **state)
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
static void test_payload_checksum(void **state)
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

static void test_gap_fails_receive(void **state)
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
static void test_gap_other_tag(void **state)
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

/* ---- receiving from whoever calls ---- */

/* Polls dsim_probe_any until it finds a message (frames may arrive on
 * another thread for some backends); the source, or -1 after 5 s. */
static int probe_wait(job *j, int rank, uint32_t comm)
{
    int64_t end = dl(j, 5000 * MS);
    for (;;) {
        int src = -7;
        if (dsim_probe_any(j->ep[rank], comm, &src))
            return src;
        assert_int_equal(src, -7); /* untouched when nothing is there */
        if (dsim_rt_now(j->rt) > end)
            return -1;
        dsim_rt_sleep_until(j->rt, dl(j, 1 * MS));
    }
}

static void send_u32(job *j, int from, int to, uint32_t comm, uint32_t tag, uint32_t v)
{
    dsim_req *s;
    assert_int_equal(dsim_isend(j->ep[from], to, comm, tag, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(j, LONG_NS), NULL), DSIM_OK);
}

static uint32_t recv_u32(job *j, int at, int from, uint32_t comm, dsim_err want)
{
    uint32_t v = 0;
    dsim_req *r;
    assert_int_equal(dsim_irecv(j->ep[at], from, comm, DSIM_ANY_TAG, &v, sizeof v, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(j, LONG_NS), NULL), want);
    return v;
}

/* dsim_probe_any names the source of the oldest message nobody has taken on
 * one communicator, whatever its source and tag; it takes nothing, and
 * neither other communicators, nor messages already taken, nor a receive
 * still posted count. Lost frames count as a message of their source. */
static void test_probe_any(void **state)
{
    (void)state;
    job j;
    job_open(&j, 4);
    int src = -7;
    assert_int_equal(dsim_probe_any(j.ep[0], 7, &src), 0);
    assert_int_equal(dsim_probe_any(NULL, 7, &src), 0);
    assert_int_equal(src, -7);
    /* A large message on another communicator (a rendezvous on inproc: its
     * send finishes when it is received). */
    size_t big = 300000;
    uint8_t *s = calloc(big, 1), *d = malloc(big);
    fill_pattern(s, big, 8);
    dsim_req *bs, *br;
    assert_int_equal(dsim_isend(j.ep[2], 0, 8, 1, s, big, &bs), DSIM_OK);
    assert_int_equal(probe_wait(&j, 0, 8), 2);
    assert_int_equal(dsim_probe_any(j.ep[0], 7, &src), 0);
    /* Rank 3 then rank 1 on comm 7: the oldest first, and probing twice
     * takes nothing. */
    send_u32(&j, 3, 0, 7, 30, 300);
    assert_int_equal(probe_wait(&j, 0, 7), 3);
    send_u32(&j, 1, 0, 7, 10, 100);
    assert_int_equal(probe_wait(&j, 0, 7), 3);
    assert_int_equal(probe_wait(&j, 0, 7), 3);
    assert_int_equal(recv_u32(&j, 0, 3, 7, DSIM_OK), 300);
    assert_int_equal(probe_wait(&j, 0, 7), 1);
    assert_int_equal(recv_u32(&j, 0, 1, 7, DSIM_OK), 100);
    assert_int_equal(dsim_probe_any(j.ep[0], 7, &src), 0);
    /* The big one is still there, then taken. */
    assert_int_equal(probe_wait(&j, 0, 8), 2);
    assert_int_equal(dsim_irecv(j.ep[0], 2, 8, DSIM_ANY_TAG, d, big, &br), DSIM_OK);
    assert_int_equal(dsim_wait(br, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(dsim_wait(bs, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_true(check_pattern(d, big, 8));
    assert_int_equal(dsim_probe_any(j.ep[0], 8, &src), 0);
    /* A message that meets a posted receive never shows. */
    dsim_req *pr;
    uint32_t v = 0;
    assert_int_equal(dsim_irecv(j.ep[0], 1, 7, DSIM_ANY_TAG, &v, sizeof v, &pr), DSIM_OK);
    send_u32(&j, 1, 0, 7, 11, 111);
    assert_int_equal(dsim_wait(pr, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(v, 111);
    assert_int_equal(dsim_probe_any(j.ep[0], 7, &src), 0);
    /* Frames lost from rank 2: the receive the probe leads to fails, then
     * the frame that showed the gap is the next one. */
    dsim_tp_hdr h;
    uint32_t w = 42;
    assert_int_equal(dsim_tp_hdr_next(j.ep[2], 0, 7, 3, sizeof w, &h), DSIM_OK);
    h.seq += 2;
    inject(&j, 2, 0, &h, &w, sizeof w);
    assert_int_equal(probe_wait(&j, 0, 7), 2);
    recv_u32(&j, 0, 2, 7, DSIM_EPROTO);
    assert_int_equal(probe_wait(&j, 0, 7), 2);
    assert_int_equal(recv_u32(&j, 0, 2, 7, DSIM_OK), 42);
    assert_int_equal(dsim_probe_any(j.ep[0], 7, &src), 0);
    /* After an abort nothing is there to take. */
    send_u32(&j, 3, 0, 7, 31, 301);
    assert_int_equal(probe_wait(&j, 0, 7), 3);
    dsim_fabric_abort(j.f, 3, "test");
    assert_int_equal(dsim_probe_any(j.ep[0], 7, &src), 0);
    free(s);
    free(d);
    job_close(&j);
}

/* ---- reducing receives ---- */

static void reduce_case(job *j, size_t count, int recv_first)
{
    float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    for (size_t i = 0; i < count; i++) {
        a[i] = (float)(i % 1000);
        b[i] = 0.5f * (float)(i % 7);
    }
    dsim_req *s, *r;
    if (recv_first)
        assert_int_equal(dsim_irecv_reduce(j->ep[1], 0, 2, 2, a, count, DSIM_F32, DSIM_SUM, &r),
                         DSIM_OK);
    assert_int_equal(dsim_isend(j->ep[0], 1, 2, 2, b, count * sizeof *b, &s), DSIM_OK);
    if (!recv_first)
        assert_int_equal(dsim_irecv_reduce(j->ep[1], 0, 2, 2, a, count, DSIM_F32, DSIM_SUM, &r),
                         DSIM_OK);
    size_t got = 0;
    assert_int_equal(dsim_wait(r, dl(j, LONG_NS), &got), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, count * sizeof *a);
    for (size_t i = 0; i < count; i++)
        if (a[i] != (float)(i % 1000) + 0.5f * (float)(i % 7))
            fail_msg("element %zu is %g", i, (double)a[i]);
    for (size_t i = 0; i < count; i++)
        assert_true(b[i] == 0.5f * (float)(i % 7)); /* the sender's buffer is untouched */
    free(a);
    free(b);
}

static void test_irecv_reduce(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    reduce_case(&j, 0, 0);
    reduce_case(&j, 5, 0);
    reduce_case(&j, 5, 1);
    reduce_case(&j, 1u << 20, 0);
    reduce_case(&j, 1u << 20, 1);
    /* Integers and another op. */
    int32_t x[4] = {1, -5, 7, 0}, y[4] = {3, -9, 2, 0};
    dsim_req *s, *r;
    assert_int_equal(dsim_irecv_reduce(j.ep[0], 1, 2, 3, x, 4, DSIM_I32, DSIM_MAX, &r), DSIM_OK);
    assert_int_equal(dsim_isend(j.ep[1], 0, 2, 3, y, sizeof y, &s), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(x[0], 3);
    assert_int_equal(x[1], -5);
    assert_int_equal(x[2], 7);
    /* Sizes must agree exactly: longer is ETRUNC, shorter EPROTO, and the
     * buffer is left alone. */
    int32_t z[4] = {1, 1, 1, 1};
    assert_int_equal(dsim_irecv_reduce(j.ep[0], 1, 2, 3, z, 3, DSIM_I32, DSIM_SUM, &r), DSIM_OK);
    assert_int_equal(dsim_isend(j.ep[1], 0, 2, 3, y, sizeof y, &s), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_ETRUNC);
    assert_non_null(strstr(dsim_errmsg(), "rank 1"));
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(dsim_irecv_reduce(j.ep[0], 1, 2, 3, z, 4, DSIM_I32, DSIM_SUM, &r), DSIM_OK);
    assert_int_equal(dsim_isend(j.ep[1], 0, 2, 3, y, 3 * sizeof *y, &s), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(z[i], 1);
    /* Bad dtype / op. */
    assert_int_equal(dsim_irecv_reduce(j.ep[0], 1, 2, 3, z, 4, DSIM_DTYPE_COUNT, DSIM_SUM, &r),
                     DSIM_EINVAL);
    assert_int_equal(dsim_irecv_reduce(j.ep[0], 1, 2, 3, z, 4, DSIM_I32, DSIM_OP_COUNT, &r),
                     DSIM_EINVAL);
    job_close(&j);
}

/* ---- cancel, waitall, close ---- */

static void test_cancel_pending(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    uint32_t old = 0, v = 9, got = 0;
    dsim_req *r, *s;
    /* A cancelled receive never takes a message. */
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 1, &old, sizeof old, &r), DSIM_OK);
    assert_int_equal(dsim_req_peer(r), 0);
    dsim_req_cancel(r);
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 1, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 1, &got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, 9);
    assert_int_equal(old, 0);
    /* A cancelled large send is never delivered, and its buffer may go. */
    size_t len = 1u << 20;
    uint8_t *big = calloc(1, len);
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 2, big, len, &s), DSIM_OK);
    assert_int_equal(dsim_req_peer(s), 1);
    dsim_req_cancel(s);
    free(big);
    uint8_t small[8];
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 2, small, sizeof small, &r), DSIM_OK);
    dsim_err e = dsim_wait(r, dl(&j, 40 * MS), NULL);
    /* A backend that had already moved the bytes delivers them (and the
     * receive truncates); one that had not delivers nothing. */
    assert_true(e == DSIM_ETIMEDOUT || e == DSIM_ETRUNC);
    /* Cancelling finished requests just frees them. */
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 3, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 3, &got, sizeof got, &r), DSIM_OK);
    while (!dsim_req_done(r))
        dsim_rt_sleep_until(j.rt, dl(&j, MS));
    dsim_req_cancel(r);
    dsim_req_cancel(s);
    dsim_req_cancel(NULL);
    job_close(&j);
}

static void test_waitall(void **state)
{
    (void)state;
    job j;
    job_open(&j, 3);
    uint32_t a = 1, b = 2, ra = 0, rb = 0;
    uint8_t small[2];
    dsim_req *reqs[5];
    assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 1, &ra, sizeof ra, &reqs[0]), DSIM_OK);
    reqs[1] = NULL;
    assert_int_equal(dsim_irecv(j.ep[0], 2, 1, 1, &rb, sizeof rb, &reqs[2]), DSIM_OK);
    assert_int_equal(dsim_irecv(j.ep[0], 2, 1, 2, small, sizeof small, &reqs[3]), DSIM_OK);
    assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 9, &ra, sizeof ra, &reqs[4]), DSIM_OK);
    dsim_req *s;
    assert_int_equal(dsim_isend(j.ep[2], 0, 1, 2, &b, sizeof b, &s), DSIM_OK); /* truncates */
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    int failed = -7;
    assert_int_equal(dsim_waitall(reqs, 5, dl(&j, LONG_NS), &failed), DSIM_ETRUNC);
    assert_int_equal(failed, 3);
    assert_int_equal(dsim_last_error()->peer, 2);
    for (int i = 0; i < 5; i++)
        assert_null(reqs[i]); /* all freed */
    /* All succeed. */
    assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 1, &ra, sizeof ra, &reqs[0]), DSIM_OK);
    assert_int_equal(dsim_isend(j.ep[1], 0, 1, 1, &a, sizeof a, &reqs[1]), DSIM_OK);
    assert_int_equal(dsim_waitall(reqs, 2, dl(&j, LONG_NS), &failed), DSIM_OK);
    assert_int_equal(failed, -1);
    assert_int_equal(ra, 1);
    /* A timeout names the peer of the request that did not finish. */
    assert_int_equal(dsim_irecv(j.ep[0], 2, 1, 5, &ra, sizeof ra, &reqs[0]), DSIM_OK);
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 5, &a, sizeof a, &reqs[1]), DSIM_OK);
    assert_int_equal(dsim_waitall(reqs, 2, dl(&j, 40 * MS), &failed), DSIM_ETIMEDOUT);
    assert_int_equal(failed, 0);
    assert_int_equal(dsim_last_error()->peer, 2);
    assert_int_equal(dsim_waitall(NULL, 0, 0, NULL), DSIM_OK);
    job_close(&j);
}

static void test_close_with_pending(void **state)
{
    (void)state;
    job j;
    job_open(&j, 3);
    uint32_t v = 3, got;
    dsim_req *r, *s;
    /* Rank 1 leaves a receive posted and a large send queued at rank 2;
     * rank 0 leaves a large message queued at rank 1. */
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 1, &got, sizeof got, &r), DSIM_OK);
    size_t len = 1u << 20;
    uint8_t *big = calloc(1, len), *big0 = calloc(1, len);
    assert_int_equal(dsim_isend(j.ep[1], 2, 1, 2, big, len, &s), DSIM_OK);
    dsim_req *s0;
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 3, big0, len, &s0), DSIM_OK);
    dsim_ep_close(j.ep[1]);
    free(big); /* rank 1's requests are gone with its endpoint */
    /* Rank 0's large send finishes one way or another, without hanging. */
    dsim_err e = dsim_wait(s0, dl(&j, 2000 * MS), NULL);
    assert_true(e == DSIM_OK || e == DSIM_EPEER);
    free(big0);
    uint8_t b[8];
    assert_int_equal(dsim_irecv(j.ep[2], 1, 1, 2, b, sizeof b, &r), DSIM_OK);
    /* Nothing of rank 1's arrives, except on a backend that had already put
     * the large message on the wire before the close (it then truncates);
     * one with connections may also know that rank 1 went away: EPEER. */
    e = dsim_wait(r, dl(&j, 30 * MS), NULL);
    assert_true(e == DSIM_ETIMEDOUT || e == DSIM_EPEER || e == DSIM_ETRUNC);
    assert_int_equal(dsim_last_error()->peer, 1);
    /* Sending to a closed endpoint fails or is dropped; never hangs. */
    e = dsim_isend(j.ep[0], 1, 1, 1, &v, sizeof v, &s);
    if (e == DSIM_OK)
        e = dsim_wait(s, dl(&j, 2000 * MS), NULL);
    assert_true(e == DSIM_OK || e == DSIM_EPEER);
    if (e == DSIM_EPEER)
        assert_int_equal(dsim_last_error()->peer, 1);
    /* The closed endpoint cannot be reopened. */
    dsim_ep *again;
    assert_int_equal(dsim_ep_open(j.f, 1, &again), DSIM_ESTATE);
    j.ep[1] = NULL;
    job_close(&j);
}

/* ---- races between cancellation and copying ---- */

/* Large messages whose deadlines run out about when the copy is under way:
 * each side sometimes times out while the other is copying into or out of
 * its buffer. Whatever happens, a message received is intact, and a buffer
 * freed after a failed wait is never read again (the sender scribbles on it
 * first; ASan sees a read after free). */
#define RACE_LEN ((size_t)4 << 20)
static const int race_ms[4] = {0, 1, 2, 4};

typedef struct racer {
    job *j;
    int iters;
    int got, bad;
    char why[160];
} racer;

/* Both sides start iteration i together. */
static dsim_err race_barrier(racer *w, int me, int i)
{
    dsim_req *q[2];
    dsim_err e = dsim_isend(w->j->ep[me], 1 - me, 2, (uint32_t)i, NULL, 0, &q[0]);
    if (e == DSIM_OK &&
        (e = dsim_irecv(w->j->ep[me], 1 - me, 2, (uint32_t)i, NULL, 0, &q[1])) != DSIM_OK)
        dsim_req_cancel(q[0]);
    if (e == DSIM_OK)
        e = dsim_waitall(q, 2, dsim_rt_deadline(w->j->rt, LONG_NS), NULL);
    if (e != DSIM_OK) {
        snprintf(w->why, sizeof w->why, "barrier: %s", dsim_errmsg());
        w->bad++;
    }
    return e;
}

static void race_receiver(void *p)
{
    racer *w = p;
    uint8_t *d = malloc(RACE_LEN), *ref = malloc(RACE_LEN);
    for (int i = 0; i < w->iters; i++) {
        dsim_req *r;
        if (race_barrier(w, 1, i) != DSIM_OK)
            break;
        if (dsim_irecv(w->j->ep[1], 0, 1, (uint32_t)i, d, RACE_LEN, &r) != DSIM_OK) {
            snprintf(w->why, sizeof w->why, "irecv: %s", dsim_errmsg());
            w->bad++;
            break;
        }
        dsim_err e = dsim_wait(r, dsim_rt_deadline(w->j->rt, race_ms[i / 4 % 4] * MS), NULL);
        if (e == DSIM_OK) {
            w->got++;
            memset(ref, i % 250 + 1, RACE_LEN);
            if (memcmp(d, ref, RACE_LEN) != 0) {
                snprintf(w->why, sizeof w->why, "message %d corrupt", i);
                w->bad++;
            }
        } else if (e != DSIM_ETIMEDOUT) {
            snprintf(w->why, sizeof w->why, "wait: %s", dsim_errmsg());
            w->bad++;
        }
    }
    free(d);
    free(ref);
}

static void race_sender(void *p)
{
    racer *w = p;
    for (int i = 0; i < w->iters; i++) {
        uint8_t *s = malloc(RACE_LEN);
        memset(s, i % 250 + 1, RACE_LEN);
        dsim_req *r;
        if (race_barrier(w, 0, i) != DSIM_OK) {
            free(s);
            break;
        }
        if (dsim_isend(w->j->ep[0], 1, 1, (uint32_t)i, s, RACE_LEN, &r) != DSIM_OK) {
            snprintf(w->why, sizeof w->why, "isend: %s", dsim_errmsg());
            w->bad++;
            free(s);
            break;
        }
        dsim_err e = dsim_wait(r, dsim_rt_deadline(w->j->rt, race_ms[i % 4] * MS), NULL);
        if (e == DSIM_OK)
            w->got++;
        else if (e != DSIM_ETIMEDOUT) {
            snprintf(w->why, sizeof w->why, "send wait: %s", dsim_errmsg());
            w->bad++;
        }
        memset(s, 0xAB, RACE_LEN);
        free(s);
    }
}

static void test_cancel_races_copy(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    racer rx = {.j = &j, .iters = 80}, tx = {.j = &j, .iters = 80};
    dsim_task *a, *b;
    assert_int_equal(dsim_rt_spawn(j.rt, 1, race_receiver, &rx, &a), DSIM_OK);
    assert_int_equal(dsim_rt_spawn(j.rt, 0, race_sender, &tx, &b), DSIM_OK);
    assert_int_equal(dsim_rt_join(j.rt, a), DSIM_OK);
    assert_int_equal(dsim_rt_join(j.rt, b), DSIM_OK);
    print_message("race: %d of %d messages received, %d sends finished\n", rx.got, rx.iters,
                  tx.got);
    if (rx.why[0] || tx.why[0])
        print_message("receiver: %s / sender: %s\n", rx.why, tx.why);
    assert_int_equal(rx.bad + tx.bad, 0);
    /* A receive that succeeded means its send did too (the sender waited
     * for the copy rather than give up mid-way). */
    assert_true(tx.got >= rx.got);
    job_close(&j);
}

/* ---- bad arguments ---- */

static void test_bad_arguments(void **state)
{
    (void)state;
    job j;
    job_open(&j, 2);
    uint32_t v = 0;
    dsim_req *r = (dsim_req *)&v;
    assert_int_equal(dsim_isend(j.ep[0], 2, 0, 0, &v, sizeof v, &r), DSIM_EINVAL);
    assert_null(r);
    assert_non_null(strstr(dsim_errmsg(), "rank 2"));
    assert_int_equal(dsim_isend(j.ep[0], -1, 0, 0, &v, sizeof v, &r), DSIM_EINVAL);
    assert_int_equal(dsim_irecv(j.ep[0], 5, 0, 0, &v, sizeof v, &r), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "rank 5"));
    assert_int_equal(dsim_isend(j.ep[0], 1, 0, DSIM_ANY_TAG, &v, sizeof v, &r), DSIM_EINVAL);
    assert_int_equal(dsim_isend(j.ep[0], 1, 0, 0, NULL, 4, &r), DSIM_EINVAL);
    assert_int_equal(dsim_irecv(j.ep[0], 1, 0, 0, NULL, 4, &r), DSIM_EINVAL);
    assert_int_equal(dsim_isend(NULL, 1, 0, 0, &v, sizeof v, &r), DSIM_EINVAL);
    assert_int_equal(dsim_wait(NULL, 0, NULL), DSIM_EINVAL);
    dsim_ep *e2;
    assert_int_equal(dsim_ep_open(j.f, 2, &e2), DSIM_EINVAL);
    assert_int_equal(dsim_ep_open(j.f, 0, &e2), DSIM_ESTATE);
    assert_non_null(strstr(dsim_errmsg(), "already open"));
    assert_int_equal(dsim_fabric_nranks(j.f), 2);
    assert_string_equal(dsim_fabric_backend(j.f), tp_backend);
    assert_ptr_equal(dsim_ep_rt(j.ep[0]), j.rt);
    job_close(&j);

    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_fabric *f = (dsim_fabric *)&v;
    dsim_fabric_cfg cfg = {.backend = "no_such_transport", .nranks = 2, .rt = rt};
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_ENOENT);
    assert_null(f);
    assert_non_null(strstr(dsim_errmsg(), "no_such_transport"));
    assert_non_null(strstr(dsim_errmsg(), tp_backend));
    assert_non_null(strstr(dsim_errmsg(), "inproc"));
    cfg.backend = tp_backend;
    cfg.nranks = 0;
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_EINVAL);
    cfg.nranks = 2;
    cfg.rt = NULL;
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_EINVAL);
    cfg.rt = rt;
    cfg.options = "no_such_option=1";
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "no_such_option"));
    cfg.options = "garbage";
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_EINVAL);
    assert_int_equal(dsim_fabric_open(NULL, &f), DSIM_EINVAL);
    dsim_rt_destroy(rt);
}

static void job_filter(job *j, dsim_fabric_cfg *cfg)
{
    if (!tp_filtered)
        return;
    assert_int_equal(dsim_faults_create(NULL, 0, 1, cfg->nranks, 1, 0, &j->fs), DSIM_OK);
    dsim_train_cfg tc;
    memset(&tc, 0, sizeof tc);
    dsim_faults_attach(j->fs, &tc);
    cfg->filter = tc.transport_filter;
    cfg->filter_user = tc.transport_filter_user;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        tp_backend = argv[1];
    if (argc > 2 && strcmp(argv[2], "filter") == 0)
        tp_filtered = 1;
    int known = 0;
    for (const char *const *n = dsim_transport_names(); *n; n++)
        known |= strcmp(*n, tp_backend) == 0;
    if (!known) {
        fprintf(stderr, "transport backend '%s' is not in this build; skipping\n", tp_backend);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_per_peer_and_tag),
        cmocka_unit_test(test_any_tag_takes_oldest),
        cmocka_unit_test(test_zero_length),
        cmocka_unit_test(test_seq_tables_bounded),
        cmocka_unit_test(test_sizes_both_orders),
        cmocka_unit_test(test_multi_mib),
        cmocka_unit_test(test_many_peers_all_to_all),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_sideband),
        cmocka_unit_test(test_poll),
        cmocka_unit_test(test_deadline_names_peer),
        cmocka_unit_test(test_abort_wakes_waiters),
        cmocka_unit_test(test_ops_after_abort),
        cmocka_unit_test(test_concurrent_abort_visible_on_return),
        cmocka_unit_test(test_stale_epoch_rejected),
        cmocka_unit_test(test_misrouted_rejected),
        cmocka_unit_test(test_duplicate_rejected),
        cmocka_unit_test(test_corrupt_rejected),
        cmocka_unit_test(test_payload_checksum),
        cmocka_unit_test(test_gap_fails_receive),
        cmocka_unit_test(test_gap_other_tag),
        cmocka_unit_test(test_probe_any),
        cmocka_unit_test(test_irecv_reduce),
        cmocka_unit_test(test_cancel_pending),
        cmocka_unit_test(test_waitall),
        cmocka_unit_test(test_close_with_pending),
        cmocka_unit_test(test_cancel_races_copy),
        cmocka_unit_test(test_bad_arguments),
    };
    char name[64];
    snprintf(name, sizeof name, "conformance-%s", tp_backend);
    return cmocka_run_group_tests_name(name, tests, NULL, NULL);
}
