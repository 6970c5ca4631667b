/* The driver's watchdog without the CLI: a replica that sleeps for ever in
 * apply_gradients, and replicas that spin for ever before any collective
 * (on one device and on every replica), end dsim_train with DSIM_EHUNG
 * within their bounds, naming who was left running and where; the workers
 * left behind, once let go, touch nothing freed (run this under ASan) and
 * free the job themselves; the caller's observer is not called after
 * dsim_train returns.
 *
 * $DSIM_HANG_SLEEP_PLUGIN and $DSIM_HANG_SPIN_PLUGIN are the fixtures
 * (misbehave_strategy.c); $DSIM_HARNESS_SCENARIOS the scenarios naming them,
 * found through $DSIM_PLUGIN_PATH. The last test runs one through the
 * harness, which stores it as 'hung'. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <sqlite3.h>

#include "dsim/strategy.h"
#include "harness/harness.h"

#define MS (1000LL * 1000)

static int64_t wd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void wd_cfg(dsim_train_cfg *cfg, const char *strategy, const char *plugin_env, int hosts,
                   int devices)
{
    dsim_train_cfg_init(cfg);
    cfg->strategy = strategy;
    cfg->plugin_path = getenv(plugin_env);
    cfg->hosts = hosts;
    cfg->devices_per_host = devices;
    cfg->data = (dsim_dataset_spec){.kind = DSIM_DATA_CLASSIFICATION,
                                    .n_examples = 128,
                                    .in_dim = 4,
                                    .out_dim = 3,
                                    .seed = 3,
                                    .n_files = 4};
    cfg->global_batch = 16;
    cfg->epochs = 1;
    cfg->timeout_ns = 200 * MS;
}

static void wd_call(const char *plugin_env, const char *fn)
{
    void *h = dlopen(getenv(plugin_env), RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    void (*f)(void) = (void (*)(void))dlsym(h, fn);
    assert_non_null(f);
    f();
    dlclose(h);
}

/* Lets a fixture's stuck threads go and waits for them to free the job. */
static void wd_release(const char *plugin_env)
{
    wd_call(plugin_env, "misbehave_release");
    for (int i = 0; i < 1000 && dsim_train_abandoned_jobs() > 0; i++) {
        struct timespec ts = {0, 10 * MS};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(dsim_train_abandoned_jobs(), 0);
}

static atomic_int wd_observed;
static atomic_int wd_observer_open = 1;
static atomic_int wd_late_calls;

static void wd_observer(const dsim_train_step_info *info, void *user)
{
    (void)info;
    (void)user;
    atomic_fetch_add(&wd_observed, 1);
    if (!atomic_load(&wd_observer_open))
        atomic_fetch_add(&wd_late_calls, 1);
}

static void test_sleep_forever_in_apply_gradients(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    wd_cfg(&cfg, "hang_sleep", "DSIM_HANG_SLEEP_PLUGIN", 2, 2);
    cfg.watchdog_grace_ns = 300 * MS;
    cfg.observer = wd_observer;
    dsim_train_result res;
    int64_t t0 = wd_now();
    dsim_err e = dsim_train(&cfg, &res);
    int64_t took = wd_now() - t0;
    atomic_store(&wd_observer_open, 0);
    assert_int_equal(e, DSIM_EHUNG);
    assert_int_equal(res.error.code, DSIM_EHUNG);
    assert_int_equal(res.error.peer, 1);
    /* the others time out (200 ms, + their failure check), then the grace */
    assert_true(took < 3000 * MS);
    assert_true(took >= 300 * MS);
    assert_int_equal(res.n_stuck, 1);
    const dsim_train_stuck *st = &res.stuck[0];
    assert_int_equal(st->where.replica, 1);
    assert_int_equal(st->where.server, -1);
    assert_int_equal(st->where.phase, DSIM_PHASE_ALLREDUCE);
    assert_int_equal(st->where.global_step, 2);
    /* one broadcast, then two allreduces per step for steps 0 and 1 */
    assert_non_null(st->collective);
    assert_string_equal(st->collective, "allreduce");
    assert_int_equal(st->collective_calls, 5);
    assert_null(st->callback);
    assert_non_null(strstr(res.error.msg, "replica 1 in phase allreduce at global step 2"));
    assert_non_null(strstr(res.error.msg, "The failure: replica"));
    /* how each replica ended: the stuck one, and the others' own errors */
    assert_non_null(res.replicas);
    assert_int_equal(res.replicas[1].status, DSIM_EHUNG);
    assert_int_equal(res.replicas[1].phase, DSIM_PHASE_ALLREDUCE);
    for (int r = 0; r < 4; r++)
        if (r != 1)
            assert_true(res.replicas[r].status != DSIM_OK && res.replicas[r].msg[0]);
    /* what the stuck replica may still write is not the caller's */
    assert_null(res.checksum);
    assert_null(res.ledger);
    char buf[256];
    dsim_train_stuck_describe(st, buf, sizeof buf);
    assert_non_null(strstr(buf, "last collective: allreduce, call 5"));
    dsim_train_result_free(&res);

    assert_int_equal(dsim_train_abandoned_jobs(), 1);
    int seen = atomic_load(&wd_observed);
    wd_release("DSIM_HANG_SLEEP_PLUGIN");
    /* the released replica stopped at its next phase without calling the
     * observer of a dsim_train that has returned */
    assert_int_equal(atomic_load(&wd_late_calls), 0);
    assert_int_equal(atomic_load(&wd_observed), seen);
}

static void test_spin_forever_before_any_collective(void **state)
{
    (void)state;
    /* one replica: nothing could ever time out; the progress bound (twice
     * 200 ms, at least 1 s) aborts the job, then the grace */
    dsim_train_cfg cfg;
    wd_cfg(&cfg, "hang_spin", "DSIM_HANG_SPIN_PLUGIN", 1, 1);
    cfg.watchdog_grace_ns = 200 * MS;
    dsim_train_result res;
    int64_t t0 = wd_now();
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EHUNG);
    int64_t took = wd_now() - t0;
    assert_true(took >= 1000 * MS && took < 4000 * MS);
    assert_int_equal(res.n_stuck, 1);
    assert_int_equal(res.stuck[0].where.replica, 0);
    assert_int_equal(res.stuck[0].where.phase, DSIM_PHASE_CREATE_VARIABLES);
    assert_null(res.stuck[0].collective);
    assert_non_null(strstr(res.error.msg, "no replica entered a new phase"));
    assert_non_null(strstr(res.error.msg, "before its first collective"));
    dsim_train_result_free(&res);

    /* every replica of 2 x 2, with a progress bound of its own */
    wd_cfg(&cfg, "hang_spin", "DSIM_HANG_SPIN_PLUGIN", 2, 2);
    cfg.watchdog_grace_ns = 200 * MS;
    cfg.progress_timeout_ns = 300 * MS;
    t0 = wd_now();
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EHUNG);
    took = wd_now() - t0;
    assert_true(took >= 500 * MS && took < 3000 * MS);
    assert_int_equal(res.n_stuck, 4);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(res.stuck[r].where.replica, r);
        assert_int_equal(res.replicas[r].status, DSIM_EHUNG);
    }
    assert_non_null(strstr(res.error.msg, "4 workers did not return"));
    dsim_train_result_free(&res);
    assert_int_equal(dsim_train_abandoned_jobs(), 2);
    wd_release("DSIM_HANG_SPIN_PLUGIN");
}

/* A job that never stalls is left alone by the progress bound. */
static void test_healthy_run_untouched(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    wd_cfg(&cfg, "multi_worker_mirrored", "NO_SUCH_VARIABLE", 2, 2);
    cfg.progress_timeout_ns = 200 * MS;
    cfg.watchdog_grace_ns = 100 * MS;
    dsim_train_result res;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_OK);
    assert_int_equal(res.n_stuck, 0);
    assert_null(res.stuck);
    assert_true(res.replicas_agree);
    dsim_train_result_free(&res);
}

/* The harness stores a hung run as 'hung', with where the replica was,
 * with or without a store, and says so in its result. */
static void test_harness_hung_run(void **state)
{
    (void)state;
    wd_call("DSIM_HANG_SLEEP_PLUGIN", "misbehave_hold");
    char file[512];
    snprintf(file, sizeof file, "%s/hang_sleep.yaml", getenv("DSIM_HARNESS_SCENARIOS"));
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(file, &s) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    dsim_harness_opts o = {.size = sizeof o, .grace_ns = 300 * MS};
    dsim_harness_result r;
    assert_int_equal(dsim_harness_run(s, &o, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_HUNG);
    assert_int_equal(r.train_err, DSIM_EHUNG);
    assert_int_equal(r.run_id, 0);
    assert_int_equal(r.n_stuck, 1);
    assert_int_equal(r.stuck[0].where.replica, 1);
    assert_int_equal(r.stuck[0].where.global_step, 2);
    assert_int_equal(r.steps, 2);
    assert_int_equal(r.n_failed, 1);
    dsim_harness_result_free(&r);

    char db[600];
    snprintf(db, sizeof db, "%s/wd-%d.db", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    remove(db);
    o.db_path = db;
    assert_int_equal(dsim_harness_run(s, &o, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_HUNG);
    assert_int_equal(r.run_id, 1);
    dsim_harness_result_free(&r);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(h,
                                        "SELECT (SELECT status FROM runs WHERE id = 1), "
                                        "(SELECT count(*) FROM events WHERE replica = 1 AND "
                                        "json_extract(detail, '$.error') = 'hung')",
                                        -1, &q, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(q, 0), "hung");
    assert_int_equal(sqlite3_column_int(q, 1), 1);
    sqlite3_finalize(q);
    sqlite3_close(h);
    char side[700];
    remove(db);
    snprintf(side, sizeof side, "%s-wal", db);
    remove(side);
    snprintf(side, sizeof side, "%s-shm", db);
    remove(side);
    dsim_scenario_free(s);
    assert_int_equal(dsim_train_abandoned_jobs(), 2);
    wd_release("DSIM_HANG_SLEEP_PLUGIN");
}

int main(void)
{
    if (!getenv("DSIM_HANG_SLEEP_PLUGIN") || !getenv("DSIM_HANG_SPIN_PLUGIN")) {
        fprintf(stderr, "DSIM_HANG_SLEEP_PLUGIN and DSIM_HANG_SPIN_PLUGIN must name the "
                        "fixtures\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sleep_forever_in_apply_gradients),
        cmocka_unit_test(test_spin_forever_before_any_collective),
        cmocka_unit_test(test_healthy_run_untouched),
        cmocka_unit_test(test_harness_hung_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
