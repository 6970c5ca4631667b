/* The fault layer holds frames at their receiver (a delay, a retransmission):
 * when their sender then closes its connection (its process is done), the
 * receiver gets the frames first and hears of the close after them, as a
 * real network delivers what was sent before a FIN. Two tcp fabrics in this
 * process stand for two processes: rank 0's without faults, rank 1's with
 * the fault filter. A link cut for good still lets the close through at
 * once (the receiver fails fast rather than waiting for its timeout). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "loopback.h"

#include "dsim/rt.h"
#include "dsim/strategy.h"
#include "dsim/transport.h"
#include "fault/fault.h"

#define MS (1000LL * 1000)

typedef struct side {
    dsim_rt *rt;
    dsim_fabric *f;
    dsim_ep *ep;
} side;

static void side_open(side *s, int rank, const int *ports, int lfd, dsim_faults *fs)
{
    char opts[256];
    snprintf(opts, sizeof opts, "addrs=127.0.0.1:%d;127.0.0.1:%d,local=%d,listen_fds=%d", ports[0],
             ports[1], rank, lfd);
    assert_int_equal(dsim_rt_create("threads", &s->rt), DSIM_OK);
    dsim_fabric_cfg cfg = {.backend = "tcp", .nranks = 2, .rt = s->rt, .options = opts};
    if (fs) {
        dsim_train_cfg tc;
        memset(&tc, 0, sizeof tc);
        dsim_faults_attach(fs, &tc);
        cfg.filter = tc.transport_filter;
        cfg.filter_user = tc.transport_filter_user;
    }
    if (dsim_fabric_open(&cfg, &s->f) != DSIM_OK)
        fail_msg("opening rank %d's fabric: %s", rank, dsim_errmsg());
    assert_int_equal(dsim_ep_open(s->f, rank, &s->ep), DSIM_OK);
}

static void side_close(side *s)
{
    if (s->ep)
        dsim_ep_close(s->ep);
    dsim_fabric_close(s->f);
    dsim_rt_destroy(s->rt);
    memset(s, 0, sizeof *s);
}

static dsim_fault link_fault(dsim_fault_what what)
{
    dsim_fault f;
    memset(&f, 0, sizeof f);
    f.what = what;
    f.rank = f.worker = f.ps = -1;
    f.link_from = 0;
    f.link_to = 1;
    f.one_way = true;
    f.step = -1;
    return f;
}

/* Rank 0 sends tags 1..nsend (8 bytes each: the tag, repeated) and closes; then
 * rank 1 posts its receives. Returns what the receive of `tag` returned and
 * the ms it took, its payload checked when it succeeded. */
typedef struct outcome {
    dsim_err e[4];
    int64_t ms[4];
    char msg[4][256];
} outcome;

static void run(const dsim_fault *f, int nsend, outcome *o)
{
    int ports[2], lfd[2];
    for (int r = 0; r < 2; r++)
        if ((lfd[r] = test_listen_loopback(&ports[r])) < 0)
            fail_msg("cannot listen on 127.0.0.1");
    dsim_faults *fs = NULL;
    assert_int_equal(dsim_faults_create(f, 1, 1, 2, 1, 0, &fs), DSIM_OK);
    side a, b;
    side_open(&b, 1, ports, lfd[1], fs);
    side_open(&a, 0, ports, lfd[0], NULL);
    uint64_t out[3];
    for (int t = 1; t <= nsend; t++) {
        out[t - 1] = 0x0101010101010101ull * (uint64_t)t;
        dsim_req *rq = NULL;
        assert_int_equal(dsim_isend(a.ep, 1, 7, (uint32_t)t, &out[t - 1], 8, &rq), DSIM_OK);
        assert_int_equal(dsim_wait(rq, dsim_rt_deadline(a.rt, 5000 * MS), NULL), DSIM_OK);
    }
    side_close(&a); /* rank 0's process is done */
    for (int t = 1; t <= 4; t++) {
        uint64_t in = 0;
        size_t len = 0;
        dsim_req *rq = NULL;
        int64_t t0 = dsim_rt_now(b.rt);
        o->e[t - 1] = dsim_irecv(b.ep, 0, 7, (uint32_t)t, &in, sizeof in, &rq);
        if (o->e[t - 1] == DSIM_OK)
            o->e[t - 1] = dsim_wait(rq, dsim_rt_deadline(b.rt, 3000 * MS), &len);
        o->ms[t - 1] = (dsim_rt_now(b.rt) - t0) / MS;
        snprintf(o->msg[t - 1], sizeof o->msg[0], "%s", o->e[t - 1] ? dsim_errmsg() : "");
        if (o->e[t - 1] == DSIM_OK) {
            assert_int_equal(len, 8);
            assert_true(in == 0x0101010101010101ull * (uint64_t)t);
        }
    }
    side_close(&b);
    dsim_faults_destroy(fs);
}

static void test_delayed_frames_before_the_close(void **state)
{
    (void)state;
    dsim_fault f = link_fault(DSIM_FAULT_DELAY);
    f.when = DSIM_WHEN_PROBABILITY;
    f.probability = 1;
    f.duration_ns = 150 * MS;
    outcome o;
    run(&f, 3, &o);
    for (int t = 0; t < 3; t++)
        if (o.e[t] != DSIM_OK)
            fail_msg("the receive of tag %d failed although its frame arrived before the close: "
                     "%s",
                     t + 1, o.msg[t]);
    /* and after them the close, not a wait for the deadline */
    assert_int_equal(o.e[3], DSIM_EPEER);
    assert_non_null(strstr(o.msg[3], "closed"));
    assert_true(o.ms[3] < 2000);
}

static void test_retransmitted_frame_before_the_close(void **state)
{
    (void)state;
    dsim_fault f = link_fault(DSIM_FAULT_DROP);
    f.when = DSIM_WHEN_PROBABILITY;
    f.probability = 1;
    f.retransmit = true;
    f.rto_ns = 100 * MS;
    outcome o;
    run(&f, 3, &o);
    for (int t = 0; t < 3; t++)
        if (o.e[t] != DSIM_OK)
            fail_msg("the receive of tag %d failed although its frame was retransmitted: %s", t + 1,
                     o.msg[t]);
    assert_int_equal(o.e[3], DSIM_EPEER);
}

static void test_cut_for_good_lets_the_close_through(void **state)
{
    (void)state;
    dsim_fault f = link_fault(DSIM_FAULT_PARTITION);
    f.when = DSIM_WHEN_TIME;
    f.time_ns = 0;
    outcome o;
    run(&f, 3, &o);
    assert_int_equal(o.e[0], DSIM_EPEER);
    assert_true(o.ms[0] < 2000);
}

/* A reordered frame waits for the next one on its link to pass it: when
 * the sender closes after it, none will, and it goes before the close. */
static void test_reordered_last_frame_before_the_close(void **state)
{
    (void)state;
    dsim_fault f = link_fault(DSIM_FAULT_REORDER);
    f.when = DSIM_WHEN_PROBABILITY;
    f.probability = 1;
    outcome o;
    run(&f, 1, &o);
    if (o.e[0] != DSIM_OK)
        fail_msg("the receive of the reordered last frame failed: %s", o.msg[0]);
    assert_int_equal(o.e[1], DSIM_EPEER);
    assert_true(o.ms[1] < 2000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delayed_frames_before_the_close),
        cmocka_unit_test(test_retransmitted_frame_before_the_close),
        cmocka_unit_test(test_cut_for_good_lets_the_close_through),
        cmocka_unit_test(test_reordered_last_frame_before_the_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
