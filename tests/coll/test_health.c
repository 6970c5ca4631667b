/* The health check (dsim/health.h) on a bare fabric: it finds a dead worker
 * within the detection bound and fails the collectives that wait for it
 * without any timeout, naming it; later calls fail at once with the same
 * cause; a worker that is slow but alive is never reported; and the bound's
 * values follow its formula; a peer whose process ends is let go, not
 * pinged for ever. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <cmocka.h>

#include "loopback.h"

#include "coll_harness.h"
#include "dsim/health.h"
#include "dsim/log.h"
#include "dsim/strategy.h"

#define MS   1000000LL
#define NW   4
#define SLOP (300 * MS) /* thread scheduling on a loaded (or sanitized) machine */

static void test_bound_values(void **state)
{
    (void)state;
    assert_int_equal(dsim_health_tick_ns(100 * MS, 50 * MS), 5 * MS);
    assert_int_equal(dsim_health_tick_ns(30000 * MS, 10000 * MS), 1000 * MS);
    assert_int_equal(dsim_health_tick_ns(5 * MS, 2 * MS), 1 * MS); /* at least 1 ms */
    assert_int_equal(dsim_health_tick_ns(3600000 * MS, 3600000 * MS), 1000 * MS); /* at most 1 s */

    /* interval + retries x timeout + 2 ticks */
    assert_int_equal(dsim_detection_bound_health(100 * MS, 50 * MS, 2), 210 * MS);
    assert_int_equal(dsim_detection_bound_health(30000 * MS, 10000 * MS, 3), 62000 * MS);
    assert_int_equal(dsim_detection_bound_health(100 * MS, 50 * MS, 0),
                     dsim_detection_bound_health(100 * MS, 50 * MS, 1));
    assert_int_equal(dsim_detection_bound_health(0, 50 * MS, 2), DSIM_NO_DEADLINE);

    /* timeout + grace (timeout / 2 within [50 ms, 2 s]) */
    assert_int_equal(dsim_detection_bound_timeout(300 * MS), 450 * MS);
    assert_int_equal(dsim_detection_bound_timeout(60 * MS), 110 * MS);
    assert_int_equal(dsim_detection_bound_timeout(10000 * MS), 12000 * MS);
    assert_int_equal(dsim_detection_bound_timeout(DSIM_TIMEOUT_DEFAULT), 32000 * MS);
    assert_int_equal(dsim_detection_bound_timeout(0), DSIM_NO_DEADLINE);

    /* the shorter of the two; never when both are off */
    assert_int_equal(dsim_detection_bound(0, 100 * MS, 50 * MS, 2), 210 * MS);
    assert_int_equal(dsim_detection_bound(300 * MS, 30000 * MS, 10000 * MS, 3), 450 * MS);
    assert_int_equal(dsim_detection_bound(0, 0, 10000 * MS, 3), DSIM_NO_DEADLINE);
    assert_int_equal(dsim_detection_bound_health(INT64_MAX / 2, INT64_MAX / 2, 1000),
                     DSIM_NO_DEADLINE); /* saturates, never wraps */

    /* a job runs the check with two or more hosts and no parameter servers */
    dsim_train_cfg cfg;
    dsim_train_cfg_init(&cfg);
    cfg.timeout_ns = 0;
    cfg.health_interval_ns = 100 * MS;
    cfg.health_timeout_ns = 50 * MS;
    cfg.health_retries = 2;
    cfg.hosts = 2;
    assert_true(dsim_train_runs_health_check(&cfg));
    assert_int_equal(dsim_train_detection_bound(&cfg), 210 * MS);
    cfg.hosts = 1;
    assert_false(dsim_train_runs_health_check(&cfg));
    assert_int_equal(dsim_train_detection_bound(&cfg), DSIM_NO_DEADLINE);
    cfg.hosts = 2;
    cfg.num_ps = 1;
    assert_int_equal(dsim_train_detection_bound(&cfg), DSIM_NO_DEADLINE);
    cfg.timeout_ns = 300 * MS;
    assert_int_equal(dsim_train_detection_bound(&cfg), 450 * MS);
}

typedef struct hc_shared {
    coll_failures f;
    dsim_health *hc[NW];
    atomic_int dead[NW];
    int victim;       /* worker that dies, or -1 */
    int victim2;      /* a second one that dies with it (0: none) */
    int slow;         /* worker that sleeps before its second call, or -1 */
    int64_t sleep_ns; /* how long the victim lives / the slow one sleeps */
    int64_t died_at;  /* written by the victim before it dies */
    int64_t returned[NW];
    dsim_err err[NW], later[NW];
    int64_t later_took[NW];
    char msg[NW][512], later_msg[NW][512];
} hc_shared;

typedef struct hc_user {
    hc_shared *s;
    int w;
} hc_user;

static int hc_dead(void *user)
{
    hc_user *u = user;
    return atomic_load(&u->s->dead[u->w]);
}

static void hc_rank(coll_harness *h, int rank, void *arg)
{
    hc_shared *s = arg;
    dsim_comm *c = h->comms[rank];
    /* the group is up */
    if (dsim_barrier(c) != DSIM_OK) {
        coll_fail(&s->f, "rank %d: first barrier: %s", rank, dsim_errmsg());
        return;
    }
    if (rank == s->victim || (s->victim2 > 0 && rank == s->victim2)) {
        dsim_rt_sleep_until(h->rt, dsim_rt_deadline(h->rt, s->sleep_ns));
        if (rank == s->victim) /* the second victim's time is not kept */
            s->died_at = dsim_rt_now(h->rt);
        atomic_store(&s->dead[rank], 1);
        dsim_health_poke(s->hc[rank]);
        return; /* as a killed process: silent from here on */
    }
    if (rank == s->slow)
        dsim_rt_sleep_until(h->rt, dsim_rt_deadline(h->rt, s->sleep_ns));
    /* No timeout: only the health check can end this wait if a peer died. */
    s->err[rank] = dsim_barrier(c);
    s->returned[rank] = dsim_rt_now(h->rt);
    snprintf(s->msg[rank], sizeof s->msg[rank], "%s", dsim_comm_error(c)->msg);
    if (s->err[rank] == DSIM_OK)
        return;
    double x = 1.0;
    int64_t t0 = dsim_rt_now(h->rt);
    s->later[rank] = dsim_allreduce(c, &x, &x, 1, DSIM_F64, DSIM_SUM);
    s->later_took[rank] = dsim_rt_now(h->rt) - t0;
    snprintf(s->later_msg[rank], sizeof s->later_msg[rank], "%s", dsim_comm_error(c)->msg);
}

static void hc_run(hc_shared *s, int64_t interval, int64_t timeout, int retries)
{
    coll_harness h;
    coll_harness_cfg cfg = {.nranks = NW};
    assert_int_equal(coll_harness_open(&h, &cfg), DSIM_OK);
    for (int r = 0; r < NW; r++)
        dsim_comm_set_timeout(h.comms[r], 0);
    hc_user users[NW];
    for (int w = 0; w < NW; w++) {
        users[w] = (hc_user){.s = s, .w = w};
        dsim_health_cfg hc = {
            .ep = h.eps[w],
            .worker = w,
            .num_workers = NW,
            .ranks_per_worker = 1,
            .interval_ns = interval,
            .timeout_ns = timeout,
            .retries = retries,
            .dead = hc_dead,
            .user = &users[w],
            .task_id = 100 + w,
        };
        assert_int_equal(dsim_health_start(&hc, &s->hc[w]), DSIM_OK);
    }
    assert_int_equal(coll_harness_run(&h, hc_rank, s), DSIM_OK);
    for (int w = 0; w < NW; w++) {
        dsim_health_stats st;
        dsim_health_get_stats(s->hc[w], &st);
        printf("# worker %d: %llu pings, %llu answers, answered %llu, %llu retries, down %d\n", w,
               (unsigned long long)st.pings_sent, (unsigned long long)st.answers_received,
               (unsigned long long)st.pings_answered, (unsigned long long)st.retries,
               st.down_worker);
        if (w != s->victim && w != s->victim2)
            assert_true(st.answers_received > 0);
        if (s->victim < 0)
            assert_int_equal(st.down_worker, -1);
        dsim_health_stop(s->hc[w]);
    }
    coll_harness_close(&h);
}

/* Worker 3 dies; the others wait in a barrier without a timeout and fail
 * within the bound, naming it; their next call fails at once, with the
 * same cause. Then the same at the defaults' proportions, faster. */
static void detect(int64_t interval, int64_t timeout, int retries)
{
    hc_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.f.mu, NULL);
    s.victim = 3;
    s.slow = -1;
    s.sleep_ns = 300 * MS; /* survivors wait longer than an interval first */
    hc_run(&s, interval, timeout, retries);
    if (s.f.failures)
        fail_msg("%s", s.f.first);
    int64_t bound = dsim_detection_bound(0, interval, timeout, retries);
    char want[128];
    snprintf(want, sizeof want, "peer 3 is down: it did not answer %d health checks of %lld ms",
             retries, (long long)(timeout / MS));
    for (int r = 0; r < NW - 1; r++) {
        int64_t took = s.returned[r] - s.died_at;
        printf("# interval %lld ms, timeout %lld ms, retries %d: rank %d failed %.1f ms after "
               "the death (bound %.1f ms): %s\n",
               (long long)(interval / MS), (long long)(timeout / MS), retries, r,
               (double)took / 1e6, (double)bound / 1e6, s.msg[r]);
        assert_int_equal(s.err[r], DSIM_EABORTED);
        if (!strstr(s.msg[r], want))
            fail_msg("rank %d: '%s' lacks '%s'", r, s.msg[r], want);
        assert_true(took > 0);
        if (took > bound + SLOP)
            fail_msg("rank %d failed %lld ms after the death; the bound is %lld ms", r,
                     (long long)(took / MS), (long long)(bound / MS));
        /* the first unanswered ping left at the death at the earliest, and
         * every retry waited its timeout: nobody gave up early */
        assert_true(took >= retries * timeout - dsim_health_tick_ns(interval, timeout));
        assert_int_equal(s.later[r], DSIM_EABORTED);
        assert_true(s.later_took[r] < 50 * MS);
        if (!strstr(s.later_msg[r], want))
            fail_msg("rank %d's later call: '%s' lacks '%s'", r, s.later_msg[r], want);
    }
}

/* The check's warnings, as the log handler gets them. */
typedef struct hc_log {
    pthread_mutex_t mu;
    int n, both;
    char first[512];
} hc_log;

static void hc_log_fn(dsim_log_level level, const char *file, int line, const char *msg, void *user)
{
    (void)file;
    (void)line;
    hc_log *l = user;
    if (level != DSIM_LOG_WARN || !strstr(msg, "health check of worker"))
        return;
    pthread_mutex_lock(&l->mu);
    if (l->n++ == 0)
        snprintf(l->first, sizeof l->first, "%s", msg);
    l->both += strstr(msg, "2 peers seem down, retrying: peer 2 (worker 2) 1/3, peer 3 "
                           "(worker 3) 1/3") != NULL;
    pthread_mutex_unlock(&l->mu);
}

/* Workers 2 and 3 die at once: a survivor tells the peers it retries in
 * one warning a wake-up, not a line each, and fails naming a dead one.
 * Peers pinged together stay in step whenever their answers come (a ping
 * every interval from when the last one left), so both deadlines pass in
 * the same wake-up unless a ping went out between the two deaths; the run
 * is tried up to 5 times for that. No run may warn more than a line a peer
 * and retry. (Before the pings kept in step, a loaded machine grouped the
 * two about one run in three: the answers came in different wake-ups.) */
static void test_two_down_one_warning(void **state)
{
    (void)state;
    int both = 0;
    for (int attempt = 0; attempt < 5 && !both; attempt++) {
        hc_log lg = {.mu = PTHREAD_MUTEX_INITIALIZER};
        dsim_log_set_handler(hc_log_fn, &lg);
        hc_shared s;
        memset(&s, 0, sizeof s);
        pthread_mutex_init(&s.f.mu, NULL);
        s.victim = 3;
        s.victim2 = 2;
        s.slow = -1;
        s.sleep_ns = 300 * MS;
        hc_run(&s, 50 * MS, 20 * MS, 3);
        dsim_log_set_handler(NULL, NULL);
        if (s.f.failures)
            fail_msg("%s", s.f.first);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(s.err[r], DSIM_EABORTED);
            if (!strstr(s.msg[r], "is down"))
                fail_msg("rank %d: %s", r, s.msg[r]);
        }
        printf("# %d warning(s), %d naming both peers; the first: %s\n", lg.n, lg.both, lg.first);
        /* 2 survivors x 2 peers x 2 retries before the third miss */
        assert_true(lg.n >= 2 && lg.n <= 8);
        both = lg.both;
    }
    assert_true(both >= 1);
}

static void test_detects_dead_worker(void **state)
{
    (void)state;
    detect(100 * MS, 50 * MS, 2);
    detect(50 * MS, 20 * MS, 3);
}

/* Worker 1 sleeps eight intervals before its barrier, longer than the
 * check takes to find a dead worker (260 ms), while the others wait without
 * a timeout: its check keeps answering, nobody is reported. (Timeouts of
 * 20 ms reported a live worker beside a loaded machine's other work, load
 * 8 on 2 CPUs, where a thread may wait 40 ms for a CPU.) */
static void test_slow_worker_is_not_down(void **state)
{
    (void)state;
    hc_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.f.mu, NULL);
    s.victim = -1;
    s.slow = 1;
    s.sleep_ns = 400 * MS;
    assert_true(s.sleep_ns > dsim_detection_bound_health(50 * MS, 100 * MS, 2));
    hc_run(&s, 50 * MS, 100 * MS, 2);
    if (s.f.failures)
        fail_msg("%s", s.f.first);
    for (int r = 0; r < NW; r++)
        if (s.err[r] != DSIM_OK)
            fail_msg("rank %d: %s", r, s.msg[r]);
}

static int hc_never_ready(void *user)
{
    (void)user;
    return 0;
}

/* Sends a ping (seq, sender's worker) as a check would. */
static void hc_ping(dsim_rt *rt, dsim_ep *from, int to, uint32_t seq, uint32_t worker, size_t len)
{
    uint32_t m[3] = {seq, worker, 0};
    dsim_req *r;
    assert_int_equal(dsim_isend(from, to, DSIM_HEALTH_COMM_PING, seq, m, len, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dsim_rt_deadline(rt, 5000 * MS), NULL), DSIM_OK);
}

/* The check of worker 1 of 2^20 workers, 2 ranks each, that never starts
 * pinging: it answers each peer's ping whoever sends it, drains what is not
 * a worker's ping without answering, and keeps nothing per peer until the
 * first ping comes (an idle check's cost does not grow with the workers:
 * it used to post a receive and keep a record for every one). */
static void test_answers_whoever_pings(void **state)
{
    (void)state;
    dsim_rt *rt;
    dsim_fabric *f;
    dsim_ep *ep[6];
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_fabric_cfg fc = {.backend = "inproc", .nranks = 6, .rt = rt};
    assert_int_equal(dsim_fabric_open(&fc, &f), DSIM_OK);
    for (int r = 0; r < 6; r++)
        assert_int_equal(dsim_ep_open(f, r, &ep[r]), DSIM_OK);
    dsim_health_cfg hc = {
        .ep = ep[2],
        .worker = 1,
        .num_workers = 1 << 20,
        .ranks_per_worker = 2,
        .interval_ns = 20 * MS,
        .timeout_ns = 10 * MS,
        .retries = 2,
        .ready = hc_never_ready,
        .task_id = 100,
    };
    dsim_health *h;
#ifdef __GLIBC__
    size_t before = mallinfo2().uordblks;
#endif
    assert_int_equal(dsim_health_start(&hc, &h), DSIM_OK);
    dsim_rt_sleep_until(rt, dsim_rt_deadline(rt, 20 * MS)); /* a few ticks */
#ifdef __GLIBC__
    size_t grew = mallinfo2().uordblks - before;
    printf("# an idle check of 2^20 workers holds %zu bytes of heap\n", grew);
    assert_true(grew < 64 * 1024);
#endif
    /* worker 0's check (rank 0) and worker 2's (rank 4) ping; rank 3 is a
     * replica, not a check; rank 4 also sends a ping of the wrong size */
    hc_ping(rt, ep[0], 2, 5, 0, 2 * sizeof(uint32_t));
    hc_ping(rt, ep[3], 2, 7, 1, 2 * sizeof(uint32_t));
    hc_ping(rt, ep[4], 2, 8, 2, 3 * sizeof(uint32_t));
    hc_ping(rt, ep[4], 2, 9, 2, 2 * sizeof(uint32_t));
    uint32_t got[2];
    dsim_req *r;
    assert_int_equal(dsim_irecv(ep[0], 2, DSIM_HEALTH_COMM_PONG, 5, got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dsim_rt_deadline(rt, 5000 * MS), NULL), DSIM_OK);
    assert_int_equal(got[0], 5);
    assert_int_equal(got[1], 1);
    assert_int_equal(dsim_irecv(ep[4], 2, DSIM_HEALTH_COMM_PONG, 9, got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dsim_rt_deadline(rt, 5000 * MS), NULL), DSIM_OK);
    assert_int_equal(got[0], 9);
    assert_int_equal(got[1], 1);
    /* nothing for the replica, nor for the ping of the wrong size */
    assert_int_equal(dsim_irecv(ep[3], 2, DSIM_HEALTH_COMM_PONG, DSIM_ANY_TAG, got, sizeof got, &r),
                     DSIM_OK);
    assert_int_equal(dsim_wait(r, dsim_rt_deadline(rt, 50 * MS), NULL), DSIM_ETIMEDOUT);
    assert_int_equal(dsim_irecv(ep[4], 2, DSIM_HEALTH_COMM_PONG, DSIM_ANY_TAG, got, sizeof got, &r),
                     DSIM_OK);
    assert_int_equal(dsim_wait(r, dsim_rt_deadline(rt, 50 * MS), NULL), DSIM_ETIMEDOUT);
    /* every ping was taken off the endpoint, the stray ones too */
    assert_int_equal(dsim_probe_any(ep[2], DSIM_HEALTH_COMM_PING, NULL), 0);
    dsim_health_stats st;
    dsim_health_get_stats(h, &st);
    assert_int_equal(st.pings_answered, 2);
    assert_int_equal(st.pings_sent, 0);
    dsim_health_stop(h);
    for (int i = 0; i < 6; i++)
        dsim_ep_close(ep[i]);
    dsim_fabric_close(f);
    dsim_rt_destroy(rt);
}

/* ---- a peer whose process ends: two tcp fabrics stand for two ---- */

typedef struct hc_proc {
    dsim_rt *rt;
    dsim_fabric *f;
    dsim_ep *ep;
    dsim_health *hc;
} hc_proc;

static void hc_proc_open(hc_proc *p, int w, const int *ports, int lfd)
{
    char opts[256];
    snprintf(opts, sizeof opts, "addrs=127.0.0.1:%d;127.0.0.1:%d,local=%d,listen_fds=%d", ports[0],
             ports[1], w, lfd);
    assert_int_equal(dsim_rt_create("threads", &p->rt), DSIM_OK);
    dsim_fabric_cfg cfg = {.backend = "tcp", .nranks = 2, .rt = p->rt, .options = opts};
    if (dsim_fabric_open(&cfg, &p->f) != DSIM_OK)
        fail_msg("tcp fabric of worker %d: %s", w, dsim_errmsg());
    assert_int_equal(dsim_ep_open(p->f, w, &p->ep), DSIM_OK);
    dsim_health_cfg hc = {.ep = p->ep,
                          .worker = w,
                          .num_workers = 2,
                          .ranks_per_worker = 1,
                          .interval_ns = 20 * MS,
                          .timeout_ns = 200 * MS,
                          .retries = 2,
                          .task_id = 100 + w};
    assert_int_equal(dsim_health_start(&hc, &p->hc), DSIM_OK);
}

static void hc_proc_close(hc_proc *p)
{
    dsim_health_stop(p->hc);
    dsim_ep_close(p->ep);
    dsim_fabric_close(p->f);
    dsim_rt_destroy(p->rt);
    memset(p, 0, sizeof *p);
}

static int64_t hc_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Worker 0 finishes: its check stops and then its process closes its
 * connections while worker 1's check has a ping out to it. Worker 1's check
 * stops pinging it (its receive for the answer fails at once, for good: it
 * used to post it again and again, never looking at the stop, so that the
 * job's end waited on it for ever), does not call a peer that closed down,
 * and stops when asked. */
static void test_peer_that_closes(void **state)
{
    (void)state;
    int ports[2], lfd[2];
    for (int w = 0; w < 2; w++)
        if ((lfd[w] = test_listen_loopback(&ports[w])) < 0)
            fail_msg("cannot listen on 127.0.0.1");
    hc_proc p[2];
    memset(p, 0, sizeof p);
    hc_proc_open(&p[1], 1, ports, lfd[1]);
    hc_proc_open(&p[0], 0, ports, lfd[0]);
    dsim_rt_sleep_until(p[1].rt, dsim_rt_deadline(p[1].rt, 150 * MS));
    dsim_health_stats st;
    dsim_health_get_stats(p[1].hc, &st);
    assert_true(st.answers_received > 0);
    /* its check stops first: worker 1's next ping goes unanswered, and
     * its process ends while that ping waits (well within the timeout) */
    dsim_health_stop(p[0].hc);
    p[0].hc = NULL;
    dsim_rt_sleep_until(p[1].rt, dsim_rt_deadline(p[1].rt, 30 * MS));
    hc_proc_close(&p[0]);
    alarm(30); /* a check that never stops ends the test here, not at meson's timeout */
    int64_t c0 = hc_cpu_ns(), t0 = dsim_rt_now(p[1].rt);
    dsim_rt_sleep_until(p[1].rt, dsim_rt_deadline(p[1].rt, 500 * MS));
    int64_t cpu = hc_cpu_ns() - c0, wall = dsim_rt_now(p[1].rt) - t0;
    dsim_health_get_stats(p[1].hc, &st);
    printf("# worker 1 after worker 0 closed: %llu pings, %llu answers, down %d, %.0f ms of CPU "
           "in %.0f ms\n",
           (unsigned long long)st.pings_sent, (unsigned long long)st.answers_received,
           st.down_worker, (double)cpu / 1e6, (double)wall / 1e6);
    assert_int_equal(st.down_worker, -1);
    if (cpu > wall / 2)
        fail_msg("worker 1's check spun: %.0f ms of CPU in %.0f ms after its peer closed",
                 (double)cpu / 1e6, (double)wall / 1e6);
    hc_proc_close(&p[1]);
    alarm(0);
}

static void test_bad_config(void **state)
{
    (void)state;
    dsim_health *h = NULL;
    dsim_health_cfg hc = {.worker = 0, .num_workers = 2, .ranks_per_worker = 1};
    assert_int_equal(dsim_health_start(&hc, &h), DSIM_EINVAL);
    assert_null(h);
    assert_int_equal(dsim_health_start(NULL, &h), DSIM_EINVAL);
    dsim_health_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_values),
        cmocka_unit_test(test_detects_dead_worker),
        cmocka_unit_test(test_slow_worker_is_not_down),
        cmocka_unit_test(test_two_down_one_warning),
        cmocka_unit_test(test_answers_whoever_pings),
        cmocka_unit_test(test_peer_that_closes),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
