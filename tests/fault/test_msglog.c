/* The message log (sim/fault/msglog.h): halves logged in different
 * processes join into frames, the bound per link holds on both sides alike,
 * attempts keep restarted sequence numbers apart, halves logged from many
 * threads at once all land (no lock on their path) and the cap holds, and a
 * real job's frames
 * (threads and sim engines, without and with the faults' filter) each have
 * a send no later than their arrival. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "dsim/strategy.h"
#include "fault/fault.h"
#include "engine/sim.h"
#include "fault/msglog.h"
#include "strat_common.h"

static dsim_tp_hdr hdr(int src, int dst, uint64_t seq, uint64_t len)
{
    return (dsim_tp_hdr){.src = src, .dst = dst, .comm_id = 1, .tag = 5, .seq = seq, .len = len};
}

/* A sender's process and a receiver's log their halves apart; the parent
 * adds both and joins them. */
static void test_join_across_processes(void **state)
{
    (void)state;
    dsim_msg_log *a, *b, *p;
    assert_int_equal(dsim_msg_log_create(&a), DSIM_OK);
    assert_int_equal(dsim_msg_log_create(&b), DSIM_OK);
    assert_int_equal(dsim_msg_log_create(&p), DSIM_OK);
    for (uint64_t s = 1; s <= 3; s++) {
        dsim_tp_hdr h = hdr(0, 1, s, 100 * s);
        dsim_msg_log_sent(a, 0, &h, 1000 * (int64_t)s);
        if (s < 3) /* the third never arrives */
            dsim_msg_log_arrived(b, 1, &h, 1000 * (int64_t)s + 50);
    }
    dsim_tp_hdr h1 = hdr(0, 1, 1, 100);
    dsim_msg_log_arrived(b, 1, &h1, 9000); /* a duplicate, later */
    /* beyond the bound: not logged on either side, counted where sent */
    dsim_tp_hdr far = hdr(0, 1, DSIM_MSG_LOG_PER_LINK + 1, 8);
    dsim_msg_log_sent(a, 0, &far, 20000);
    dsim_msg_log_arrived(b, 1, &far, 20001);

    dsim_msg_rec *ha, *hb;
    uint64_t da, db;
    size_t na = dsim_msg_log_halves(a, &ha, &da), nb = dsim_msg_log_halves(b, &hb, &db);
    assert_int_equal(na, 3);
    assert_int_equal(nb, 3);
    assert_int_equal(da, 1);
    assert_int_equal(db, 0);
    dsim_msg_log_add(p, hb, nb, db); /* arrivals first: order does not matter */
    dsim_msg_log_add(p, ha, na, da);
    free(ha);
    free(hb);

    dsim_msg_rec *m;
    size_t n;
    uint64_t dropped;
    assert_int_equal(dsim_msg_log_join(p, &m, &n, &dropped), DSIM_OK);
    assert_int_equal(n, 3);
    assert_int_equal(dropped, 1);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(m[i].seq, i + 1);
        assert_int_equal(m[i].src, 0);
        assert_int_equal(m[i].dst, 1);
        assert_int_equal(m[i].bytes, 100 * (i + 1));
        assert_int_equal(m[i].t_sent_ns, 1000 * (int64_t)(i + 1));
    }
    assert_int_equal(m[0].t_recv_ns, 1050); /* the first arrival, not the duplicate */
    assert_int_equal(m[1].t_recv_ns, 2050);
    assert_int_equal(m[2].t_recv_ns, -1);
    free(m);
    dsim_msg_log_destroy(a);
    dsim_msg_log_destroy(b);
    dsim_msg_log_destroy(p);
}

/* A restart numbers frames from 1 again: the attempts stay apart. An
 * arrival logged before its send (inproc delivers inside the send) makes
 * the send no later than the arrival. */
static void test_attempts_and_inproc_order(void **state)
{
    (void)state;
    dsim_msg_log *l;
    assert_int_equal(dsim_msg_log_create(&l), DSIM_OK);
    dsim_tp_hdr h = hdr(2, 3, 1, 64);
    dsim_msg_log_arrived(l, 3, &h, 500);
    dsim_msg_log_sent(l, 2, &h, 520);
    assert_int_equal(dsim_msg_log_attempt(l), 0);
    dsim_msg_log_next_attempt(l);
    assert_int_equal(dsim_msg_log_attempt(l), 1);
    dsim_msg_log_sent(l, 2, &h, 900);
    dsim_msg_log_arrived(l, 3, &h, 950);
    dsim_msg_rec *m;
    size_t n;
    uint64_t dropped;
    assert_int_equal(dsim_msg_log_join(l, &m, &n, &dropped), DSIM_OK);
    assert_int_equal(n, 2);
    assert_int_equal(dropped, 0);
    assert_int_equal(m[0].attempt, 0);
    assert_int_equal(m[0].t_sent_ns, 500);
    assert_int_equal(m[0].t_recv_ns, 500);
    assert_int_equal(m[1].attempt, 1);
    assert_int_equal(m[1].t_sent_ns, 900);
    assert_int_equal(m[1].t_recv_ns, 950);
    free(m);
    dsim_msg_log_destroy(l);
}

/* A real job: every frame of the first steps is logged with both times,
 * send no later than arrival, between two distinct ranks of the job. */
static void run_job(const char *engine, bool faults)
{
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "mirrored", 1, 4);
    cfg.engine = engine;
    cfg.epochs = 1;
    dsim_msg_log *l;
    assert_int_equal(dsim_msg_log_create(&l), DSIM_OK);
    dsim_faults *fs = NULL;
    if (faults) {
        /* a delay on the link 0 - 1: its frames are held, logged when
         * released */
        dsim_fault f = {.what = DSIM_FAULT_DELAY,
                        .when = DSIM_WHEN_PROBABILITY,
                        .probability = 1.0,
                        .rank = -1,
                        .worker = -1,
                        .ps = -1,
                        .link_from = 0,
                        .link_to = 1,
                        .duration_ns = 2000000,
                        .step = -1};
        assert_int_equal(dsim_faults_create(&f, 1, 7, 1, 4, 0, &fs), DSIM_OK);
        dsim_faults_set_msg_log(fs, l);
        dsim_faults_attach(fs, &cfg);
    } else {
        dsim_msg_log_attach(l, &cfg);
    }
    dsim_train_result res;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_OK);
    dsim_msg_rec *m;
    size_t n;
    uint64_t dropped;
    assert_int_equal(dsim_msg_log_join(l, &m, &n, &dropped), DSIM_OK);
    assert_true(n > 0);
    bool delayed = false;
    for (size_t i = 0; i < n; i++) {
        assert_true(m[i].t_sent_ns >= 0);
        assert_true(m[i].t_recv_ns >= m[i].t_sent_ns);
        assert_true(m[i].src != m[i].dst && m[i].src < 4 && m[i].dst < 4);
        assert_true(m[i].seq >= 1 && m[i].seq <= DSIM_MSG_LOG_PER_LINK);
        assert_true(i == 0 || m[i].t_sent_ns >= m[i - 1].t_sent_ns);
        if (m[i].src + m[i].dst == 1 && m[i].t_recv_ns - m[i].t_sent_ns >= 2000000)
            delayed = true;
    }
    assert_true(delayed == faults);
    free(m);
    dsim_train_result_free(&res);
    dsim_faults_destroy(fs);
    dsim_msg_log_destroy(l);
}

static void test_threads_job(void **state)
{
    (void)state;
    run_job("threads", false);
}

static void test_threads_job_faults(void **state)
{
    (void)state;
    run_job("threads", true);
}

static void test_sim_job_faults(void **state)
{
    (void)state;
    assert_int_equal(dsim_sim_engine_register(), DSIM_OK);
    run_job("sim", true);
}

/* Each thread logs its own link's sends and arrivals, 300 frames, at once
 * with the others: every kept half lands (9 links x 256 frames, across
 * the log's chunks of 4096 halves), each frame joins whole, and the sends
 * beyond the bound are counted. */
#define CT_THREADS 9
#define CT_FRAMES  300

typedef struct ct_arg {
    dsim_msg_log *log;
    int src;
    pthread_barrier_t *go;
} ct_arg;

static void *ct_main(void *p)
{
    ct_arg *a = p;
    pthread_barrier_wait(a->go);
    for (uint64_t s = 1; s <= CT_FRAMES; s++) {
        dsim_tp_hdr h = hdr(a->src, a->src + 100, s, s);
        dsim_msg_log_sent(a->log, a->src, &h, (int64_t)(10 * s));
        dsim_msg_log_arrived(a->log, a->src + 100, &h, (int64_t)(10 * s + 3));
    }
    return NULL;
}

static void test_concurrent_halves(void **state)
{
    (void)state;
    dsim_msg_log *log;
    assert_int_equal(dsim_msg_log_create(&log), DSIM_OK);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, CT_THREADS);
    pthread_t t[CT_THREADS];
    ct_arg a[CT_THREADS];
    for (int i = 0; i < CT_THREADS; i++) {
        a[i] = (ct_arg){.log = log, .src = i, .go = &go};
        assert_int_equal(pthread_create(&t[i], NULL, ct_main, &a[i]), 0);
    }
    for (int i = 0; i < CT_THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&go);
    dsim_msg_rec *m;
    size_t n;
    uint64_t dropped;
    assert_int_equal(dsim_msg_log_join(log, &m, &n, &dropped), DSIM_OK);
    assert_int_equal(n, (size_t)CT_THREADS * DSIM_MSG_LOG_PER_LINK);
    assert_int_equal(dropped, (uint64_t)CT_THREADS * (CT_FRAMES - DSIM_MSG_LOG_PER_LINK));
    int seen[CT_THREADS][DSIM_MSG_LOG_PER_LINK + 1];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < n; i++) {
        assert_true(m[i].src >= 0 && m[i].src < CT_THREADS && m[i].dst == m[i].src + 100);
        assert_true(m[i].seq >= 1 && m[i].seq <= DSIM_MSG_LOG_PER_LINK);
        assert_int_equal(m[i].t_sent_ns, (int64_t)(10 * m[i].seq));
        assert_int_equal(m[i].t_recv_ns, (int64_t)(10 * m[i].seq + 3));
        assert_int_equal(m[i].bytes, m[i].seq);
        seen[m[i].src][m[i].seq]++;
    }
    for (int i = 0; i < CT_THREADS; i++)
        for (int s = 1; s <= DSIM_MSG_LOG_PER_LINK; s++)
            assert_int_equal(seen[i][s], 1);
    free(m);
    dsim_msg_log_destroy(log);
}

/* More kept halves than the log holds: it keeps DSIM_MSG_LOG_CAP of them and
 * counts the sends it could not keep as dropped. */
static void test_cap(void **state)
{
    (void)state;
    dsim_msg_log *log;
    assert_int_equal(dsim_msg_log_create(&log), DSIM_OK);
    int links = DSIM_MSG_LOG_CAP / (2 * DSIM_MSG_LOG_PER_LINK) + 10;
    for (int l = 0; l < links; l++)
        for (uint64_t s = 1; s <= DSIM_MSG_LOG_PER_LINK; s++) {
            dsim_tp_hdr h = hdr(l, l + 1, s, 8);
            dsim_msg_log_sent(log, l, &h, 1);
            dsim_msg_log_arrived(log, l + 1, &h, 2);
        }
    dsim_msg_rec *h;
    uint64_t dropped;
    size_t n = dsim_msg_log_halves(log, &h, &dropped);
    assert_int_equal(n, DSIM_MSG_LOG_CAP);
    assert_int_equal(dropped, (uint64_t)10 * DSIM_MSG_LOG_PER_LINK); /* the sends of 10 links */
    free(h);
    dsim_msg_log_destroy(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_across_processes),
        cmocka_unit_test(test_attempts_and_inproc_order),
        cmocka_unit_test(test_concurrent_halves),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_threads_job),
        cmocka_unit_test(test_threads_job_faults),
        cmocka_unit_test(test_sim_job_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
