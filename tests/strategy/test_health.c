/* The health check in a training job: with no collective timeout at all, a
 * replica the hooks kill is found by the health check within the detection
 * bound, and every survivor's error names it; a replica that is only slow
 * (it pauses for several intervals) is never reported and the job ends with
 * the same bits as an undisturbed one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "dsim/health.h"
#include "dsim/strategy.h"
#include "strat_common.h"

#define MS   1000000LL
#define SLOP (300 * MS) /* thread scheduling on a loaded (or sanitized) machine */

typedef struct hh_state {
    int victim;       /* replica the hooks kill, or -1 */
    dsim_phase phase; /* where */
    uint64_t step;    /* when */
    int slow;         /* replica that pauses at compute, or -1 */
    int64_t pause_ns; /* how long, at every third step */
} hh_state;

static dsim_hook_action hh_phase(void *user, int r, dsim_phase p, uint64_t gs)
{
    hh_state *h = user;
    if (r == h->victim && p == h->phase && gs == h->step)
        return DSIM_HOOK_DIE;
    if (r == h->slow && p == DSIM_PHASE_COMPUTE && gs % 3 == 1) {
        struct timespec ts = {.tv_sec = h->pause_ns / 1000000000,
                              .tv_nsec = h->pause_ns % 1000000000};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    return DSIM_HOOK_GO;
}

static const dsim_train_hooks hh_hooks = {.size = sizeof(dsim_train_hooks), .phase = hh_phase};

static void hh_cfg(dsim_train_cfg *cfg, int hosts, int devices, int64_t interval, int64_t timeout,
                   int retries)
{
    sc_cfg(cfg, "multi_worker_mirrored", hosts, devices);
    cfg->timeout_ns = 0; /* no deadline: only the health check ends a wait */
    cfg->health_interval_ns = interval;
    cfg->health_timeout_ns = timeout;
    cfg->health_retries = retries;
}

/* Kills `victim` at `phase` of step `step`; every survivor must fail within
 * the bound with an error that names `peer` (the first rank of the
 * victim's worker, whose health check went silent). */
static void kill_and_detect(int hosts, int devices, int victim, int peer, dsim_phase phase,
                            uint64_t step, int64_t interval, int64_t timeout, int retries)
{
    dsim_train_cfg cfg;
    hh_cfg(&cfg, hosts, devices, interval, timeout, retries);
    hh_state h = {.victim = victim, .phase = phase, .step = step, .slow = -1};
    cfg.hooks = &hh_hooks;
    cfg.hooks_user = &h;
    int64_t bound = dsim_train_detection_bound(&cfg);
    assert_int_equal(bound, dsim_detection_bound_health(interval, timeout, retries));
    dsim_train_result res;
    dsim_err e = dsim_train(&cfg, &res);
    assert_int_equal(e, DSIM_EABORTED);
    char want[128];
    snprintf(want, sizeof want, "peer %d is down: it did not answer %d health check%s of %lld ms",
             peer, retries, retries == 1 ? "" : "s", (long long)(timeout / MS));
    if (!strstr(res.error.msg, want))
        fail_msg("the job's error '%s' lacks '%s'", res.error.msg, want);
    assert_int_equal(res.error.peer, peer);
    assert_true(res.replicas[victim].killed);
    int64_t died = res.replicas[victim].t_end, worst = 0;
    int N = hosts * devices;
    for (int r = 0; r < N; r++) {
        if (r == victim)
            continue;
        assert_false(res.replicas[r].killed);
        assert_int_not_equal(res.replicas[r].status, DSIM_OK);
        if (!strstr(res.replicas[r].msg, want))
            fail_msg("replica %d's error '%s' lacks '%s'", r, res.replicas[r].msg, want);
        int64_t took = res.replicas[r].t_end - died;
        if (took > worst)
            worst = took;
        if (took > bound + SLOP)
            fail_msg("replica %d failed %lld ms after replica %d died; the bound is %lld ms", r,
                     (long long)(took / MS), victim, (long long)(bound / MS));
    }
    printf("# %dx%d, kill replica %d at %s of step %llu, health %lld ms / %lld ms / %d, no "
           "timeout: every survivor failed within %.1f ms (bound %.1f ms)\n",
           hosts, devices, victim, dsim_phase_name(phase), (unsigned long long)step,
           (long long)(interval / MS), (long long)(timeout / MS), retries, (double)worst / 1e6,
           (double)bound / 1e6);
    printf("#   %s\n", res.error.msg);
    dsim_train_result_free(&res);
}

static void test_health_check_finds_killed_replica(void **state)
{
    (void)state;
    kill_and_detect(4, 1, 3, 3, DSIM_PHASE_ALLREDUCE, 3, 100 * MS, 50 * MS, 2);
    kill_and_detect(4, 1, 1, 1, DSIM_PHASE_REDUCE_LOSS, 5, 50 * MS, 20 * MS, 3);
    /* the second device of worker 1 dies: its process is gone, and the
     * error names the worker's rank that the check pings */
    kill_and_detect(2, 2, 3, 2, DSIM_PHASE_COMPUTE, 2, 100 * MS, 50 * MS, 2);
    /* before the first step: the others wait in the chief's broadcast */
    kill_and_detect(3, 1, 2, 2, DSIM_PHASE_CREATE_VARIABLES, 0, 100 * MS, 50 * MS, 1);
}

/* Replica 1 pauses 250 ms (five intervals) at every third step while the
 * others wait for it with no timeout: its worker's check answers for it. */
static void test_slow_replica_is_not_down(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    hh_cfg(&cfg, 2, 2, 50 * MS, 20 * MS, 2);
    cfg.epochs = 1;
    dsim_train_result plain, slow;
    assert_int_equal(dsim_train(&cfg, &plain), DSIM_OK);
    hh_state h = {.victim = -1, .slow = 1, .pause_ns = 250 * MS};
    cfg.hooks = &hh_hooks;
    cfg.hooks_user = &h;
    dsim_err e = dsim_train(&cfg, &slow);
    if (e != DSIM_OK)
        fail_msg("a slow replica failed the job: %s", slow.error.msg);
    assert_memory_equal(plain.params, slow.params, plain.n_params * sizeof(float));
    assert_true(slow.in_sync_every_step);
    dsim_train_result_free(&plain);
    dsim_train_result_free(&slow);
}

/* Bad settings are refused before anything runs. */
static void test_health_settings_checked(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    hh_cfg(&cfg, 2, 1, 100 * MS, 0, 3);
    dsim_train_result res;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EINVAL);
    assert_non_null(strstr(res.error.msg, "health check"));
    dsim_train_result_free(&res);
    hh_cfg(&cfg, 2, 1, -1, 10 * MS, 3);
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EINVAL);
    dsim_train_result_free(&res);
}

int main(void)
{
    if (!sc_dataset()) {
        fprintf(stderr, "cannot make the dataset: %s\n", dsim_errmsg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_check_finds_killed_replica),
        cmocka_unit_test(test_slow_replica_is_not_down),
        cmocka_unit_test(test_health_settings_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
