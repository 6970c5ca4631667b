/* The results store: every kind of record, read back with plain SQL; the
 * views; bad input; eight threads recording at once; and the example
 * queries of SCHEMA.md run against a populated database.
 *
 * argv[1]: path of sim/store/SCHEMA.md. SQLITE3_SHELL (optional): the sqlite3
 * program, to run the examples the way a user would. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsim/err.h"
#include "store.h"
#include "store_util.h"

static const char *schema_doc;
static char tmpdir[4096];

static void db_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmpdir, name);
}

static dsim_run_info run_info(const char *scenario)
{
    dsim_run_info ri = {
        .scenario = scenario,
        .scenario_text = "name: quick\nseed: 7\nengine: threads\n",
        .seed = 7,
        .engine = "threads",
        .strategy = "mirrored",
        .config_json = "{\"replicas\": 2, \"algorithm\": \"ring\"}",
    };
    return ri;
}

/* The checksum test_every_kind's steps carry (and variations of it). */
static const uint64_t every_sum = 0xDEADBEEFCAFEF00Dull;

/* One record of every kind in run `run`: two replicas (one recorded twice),
 * three steps of each (one loss NaN, one checksum off), three collectives
 * (one failed), events, checks and metrics. */
static void every_kind_write(dsim_store *st, dsim_run_id run)
{
    assert_int_equal(dsim_store_replica(st, run, 0, 0, "CPU:0", "host-a"), DSIM_OK);
    assert_int_equal(dsim_store_replica(st, run, 1, 1, "CPU:0", "host-b"), DSIM_OK);
    /* Again after a "restart": replaces the row. */
    assert_int_equal(dsim_store_replica(st, run, 1, 1, "GPU:1", "host-c"), DSIM_OK);

    for (int step = 0; step < 3; step++) {
        for (int r = 0; r < 2; r++) {
            dsim_step_rec s = {
                .replica = r,
                .epoch = step / 2,
                .step = step,
                .loss = 1.0 / (step + 1) + 0.01 * r,
                .reduced_loss = 1.0 / (step + 1) + 0.005,
                .checksum = step == 2 && r == 1 ? every_sum + 1 : every_sum + (uint64_t)step,
                .examples = 16,
                .t_start_ns = 1000 * step,
                .t_end_ns = 1000 * step + 100 + 50 * r,
            };
            if (step == 1 && r == 1)
                s.loss = NAN;
            assert_int_equal(dsim_store_step(st, run, &s), DSIM_OK);
        }
    }
    dsim_coll_rec c = {.replica = 0,
                       .op = "allreduce",
                       .algorithm = "ring",
                       .bytes = 4096,
                       .t_start_ns = 10,
                       .t_end_ns = 30,
                       .status = DSIM_OK};
    assert_int_equal(dsim_store_collective(st, run, &c), DSIM_OK);
    c.t_end_ns = 50;
    c.replica = 1;
    assert_int_equal(dsim_store_collective(st, run, &c), DSIM_OK);
    c.t_end_ns = 20;
    c.status = DSIM_ETIMEDOUT;
    assert_int_equal(dsim_store_collective(st, run, &c), DSIM_OK);

    assert_int_equal(dsim_store_event(st, run, 1, 555, DSIM_EVENT_FAULT, "{\"kill\": 1}"), DSIM_OK);
    assert_int_equal(dsim_store_event(st, run, -1, 10, DSIM_EVENT_PHASE, "connect"), DSIM_OK);
    assert_int_equal(dsim_store_check(st, run, "gradient_consistency", false, 2, 1,
                                      "replica 1 diverged at step 2"),
                     DSIM_OK);
    assert_int_equal(dsim_store_check(st, run, "convergence", true, NAN, 0.5, NULL), DSIM_OK);
    assert_int_equal(dsim_store_metric(st, run, "step_time_p50", 125.5, "us", -1), DSIM_OK);
    assert_int_equal(dsim_store_metric(st, run, "examples_per_s", 900, "1/s", 0), DSIM_OK);
}

/* The runs row of test_every_kind's run, and the database's identity. */
static void every_kind_check_run(sqlite3 *db, const dsim_run_info *ri)
{
    char buf[256];
    /* runs */
    assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
    assert_int_equal(su_int(db, "PRAGMA application_id"), DSIM_STORE_APPLICATION_ID);
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA journal_mode"), "wal");
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT scenario FROM runs"), "every-kind");
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT scenario_text FROM runs"),
                        ri->scenario_text);
    assert_true((uint64_t)su_int(db, "SELECT seed FROM runs") == ri->seed);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT engine || '/' || strategy FROM runs"),
                        "threads/mirrored");
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT dsim_version FROM runs"),
                        "9.9.9-test");
    assert_int_equal(su_int(db, "SELECT json_extract(config, '$.replicas') FROM runs"), 2);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT status FROM runs"), "failed");
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT trace_hash FROM runs"), "00ff00ff");
    assert_int_equal(su_int(db, "SELECT started_ns FROM runs"), 1700000000123456789);
    assert_int_equal(su_int(db, "SELECT ended_ns FROM runs"), 1700000005123456789);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT host FROM runs"), host);
}

/* Every table's rows as every_kind_write wrote them. */
static void every_kind_check_rows(sqlite3 *db)
{
    char buf[256];
    /* replicas */
    assert_int_equal(su_int(db, "SELECT count(*) FROM replicas"), 2);
    assert_string_equal(
        su_text(db, buf, sizeof buf, "SELECT device || '@' || host FROM replicas WHERE replica=1"),
        "GPU:1@host-c");

    /* steps: every column of one row, the checksum's bits, NaN as NULL */
    assert_int_equal(su_int(db, "SELECT epoch FROM steps WHERE step=2 AND replica=1"), 1);
    assert_true(fabs(su_real(db, "SELECT loss FROM steps WHERE step=2 AND replica=1") -
                     (1.0 / 3 + 0.01)) < 1e-15);
    assert_true(fabs(su_real(db, "SELECT reduced_loss FROM steps WHERE step=2 AND replica=1") -
                     (1.0 / 3 + 0.005)) < 1e-15);
    assert_true((uint64_t)su_int(db, "SELECT checksum FROM steps WHERE step=0 AND replica=0") ==
                every_sum);
    assert_string_equal(su_text(db, buf, sizeof buf,
                                "SELECT printf('%%016x', checksum) FROM steps WHERE step=0 AND "
                                "replica=0"),
                        "deadbeefcafef00d");
    assert_int_equal(su_int(db, "SELECT examples FROM steps WHERE step=2 AND replica=1"), 16);
    assert_int_equal(su_int(db, "SELECT t_start_ns FROM steps WHERE step=2 AND replica=1"), 2000);
    assert_int_equal(su_int(db, "SELECT t_end_ns FROM steps WHERE step=2 AND replica=1"), 2150);
    assert_int_equal(su_int(db, "SELECT loss IS NULL FROM steps WHERE step=1 AND replica=1"), 1);

    /* collectives */
    assert_int_equal(su_int(db, "SELECT count(*) FROM collectives"), 3);
    assert_int_equal(su_int(db, "SELECT status FROM collectives WHERE t_end_ns=20"),
                     DSIM_ETIMEDOUT);
    assert_string_equal(
        su_text(db, buf, sizeof buf, "SELECT error FROM collectives WHERE t_end_ns=20"),
        dsim_strerror(DSIM_ETIMEDOUT));
    assert_int_equal(su_int(db, "SELECT error IS NULL FROM collectives WHERE t_end_ns=30"), 1);

    /* events, checks, metrics */
    assert_string_equal(su_text(db, buf, sizeof buf,
                                "SELECT kind || ':' || replica || ':' || t_ns || ':' || detail "
                                "FROM events WHERE replica IS NOT NULL"),
                        "fault:1:555:{\"kill\": 1}");
    assert_string_equal(su_text(db, buf, sizeof buf,
                                "SELECT kind || ':' || detail FROM events WHERE replica IS NULL"),
                        "phase:connect");
    assert_string_equal(
        su_text(db, buf, sizeof buf,
                "SELECT passed || ':' || measured || ':' || expected || ':' || message FROM checks "
                "WHERE name='gradient_consistency'"),
        "0:2.0:1.0:replica 1 diverged at step 2");
    assert_int_equal(
        su_int(db, "SELECT measured IS NULL AND message IS NULL FROM checks WHERE passed"), 1);
    assert_string_equal(su_text(db, buf, sizeof buf,
                                "SELECT value || ' ' || unit FROM metrics WHERE replica IS NULL"),
                        "125.5 us");
    assert_int_equal(su_int(db, "SELECT replica FROM metrics WHERE name='examples_per_s'"), 0);
}

/* The views over test_every_kind's run, and the database's integrity. */
static void every_kind_check_views(sqlite3 *db)
{
    char buf[256];
    /* views */
    assert_int_equal(su_int(db, "SELECT steps FROM run_summary"), 3);
    assert_int_equal(su_int(db, "SELECT examples FROM run_summary"), 96);
    assert_int_equal(su_int(db, "SELECT replicas FROM run_summary"), 2);
    assert_int_equal(su_int(db, "SELECT checks_passed * 10 + checks_failed FROM run_summary"), 11);
    assert_int_equal(su_int(db, "SELECT faults FROM run_summary"), 1);
    assert_true(fabs(su_real(db, "SELECT duration_s FROM run_summary") - 5.0) < 1e-9);
    assert_true(fabs(su_real(db, "SELECT final_loss FROM run_summary") - (1.0 / 3 + 0.005)) <
                1e-15);
    assert_string_equal(su_text(db, buf, sizeof buf, "SELECT started FROM run_summary"),
                        "2023-11-14 22:13:20");
    assert_int_equal(su_int(db, "SELECT count(*) FROM step_stats"), 3);
    assert_int_equal(su_int(db, "SELECT checksums_agree FROM step_stats WHERE step=1"), 1);
    assert_int_equal(su_int(db, "SELECT checksums_agree FROM step_stats WHERE step=2"), 0);
    assert_int_equal(su_int(db, "SELECT slowest_replica FROM step_stats WHERE step=2"), 1);
    assert_int_equal(su_int(db, "SELECT slowest_ns FROM step_stats WHERE step=2"), 150);
    assert_int_equal(su_int(db, "SELECT step_ns FROM step_stats WHERE step=2"), 150);
    assert_int_equal(su_int(db, "SELECT examples FROM step_stats WHERE step=0"), 32);
    assert_true(fabs(su_real(db, "SELECT loss_max - loss_min FROM step_stats WHERE step=0") -
                     0.01) < 1e-12);
    assert_int_equal(su_int(db, "SELECT calls FROM collective_stats"), 3);
    assert_int_equal(su_int(db, "SELECT failed FROM collective_stats"), 1);
    assert_int_equal(su_int(db, "SELECT bytes FROM collective_stats"), 3 * 4096);
    assert_int_equal(su_int(db, "SELECT p50_ns FROM collective_stats"), 20); /* of 10, 20, 40 */
    assert_int_equal(su_int(db, "SELECT max_ns FROM collective_stats"), 40);
    assert_int_equal(su_int(db, "PRAGMA foreign_key_check"), -999999);
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA integrity_check"), "ok");
}

static void test_every_kind(void **state)
{
    (void)state;
    char path[4200], buf[256];
    db_path(path, sizeof path, "every.db");
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    assert_string_equal(dsim_store_path(st), path);

    dsim_run_info ri = run_info("every-kind");
    ri.seed = 0xFFFFFFFFFFFFFFF0ull;
    ri.started_ns = 1700000000123456789;
    ri.dsim_version = "9.9.9-test";
    dsim_run_id run = -1;
    assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_OK);
    assert_true(run > 0);

    /* The run is committed before begin_run returns: another connection
     * sees it while the store is open. */
    sqlite3 *db = su_open(path);
    assert_string_equal(
        su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE id=%lld", (long long)run),
        "running");
    assert_int_equal(su_int(db, "SELECT pid FROM runs WHERE id=%lld", (long long)run), getpid());

    every_kind_write(st, run);
    assert_int_equal(dsim_store_flush(st), DSIM_OK);

    /* Committed, hence visible to another connection, before close. */
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps WHERE run_id=%lld", (long long)run), 6);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_FAILED, "00ff00ff", 1700000005123456789),
                     DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    every_kind_check_run(db, &ri);
    every_kind_check_rows(db);
    every_kind_check_views(db);
    sqlite3_close(db);
}

static void test_bad_input(void **state)
{
    (void)state;
    char path[4200];
    db_path(path, sizeof path, "bad.db");
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_info ri = run_info("bad-input");
    dsim_run_id run;

    ri.config_json = "{\"replicas\": ";
    assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "JSON"));
    assert_non_null(strstr(dsim_errmsg(), path));
    ri = run_info("bad-input");
    ri.engine = "";
    assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "engine"));
    ri = run_info("bad-input");
    assert_int_equal(dsim_store_begin_run(st, NULL, &run), DSIM_EINVAL);
    assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_OK);

    dsim_step_rec s = {.replica = 0, .step = 0, .examples = 1};
    /* A run this store never began. */
    assert_int_equal(dsim_store_step(st, run + 1000, &s), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "not open"));
    s.replica = -1;
    assert_int_equal(dsim_store_step(st, run, &s), DSIM_EINVAL);
    assert_int_equal(dsim_store_step(st, run, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_store_event(st, run, 0, 0, (dsim_event_kind)42, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_store_check(st, run, "", true, 0, 0, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_store_metric(st, run, NULL, 1, NULL, -1), DSIM_EINVAL);
    dsim_coll_rec c = {.op = NULL};
    assert_int_equal(dsim_store_collective(st, run, &c), DSIM_EINVAL);
    c.op = "allreduce";
    c.status = (dsim_err)99;
    assert_int_equal(dsim_store_collective(st, run, &c), DSIM_EINVAL);
    assert_int_equal(dsim_store_end_run(st, run, (dsim_run_status)7, NULL, 0), DSIM_EINVAL);

    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    /* Ended: no more records, no second end. */
    s.replica = 0;
    assert_int_equal(dsim_store_step(st, run, &s), DSIM_EINVAL);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_EINVAL);
    /* None of the refused records reached the database; the store still
     * works. */
    assert_int_equal(dsim_store_flush(st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    assert_int_equal(dsim_store_close(NULL), DSIM_OK);
    assert_int_equal(dsim_store_open(path, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_store_open("", &st), DSIM_EINVAL);

    sqlite3 *db = su_open(path);
    assert_int_equal(su_int(db, "SELECT count(*) FROM runs"), 1);
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), 0);
    assert_int_equal(su_int(db, "SELECT count(*) FROM collectives"), 0);
    assert_int_equal(su_int(db, "SELECT ended_ns > started_ns FROM runs"), 1);
    sqlite3_close(db);
}

/* Eight threads record into one run at once; the queue (16384 records) is
 * smaller than what they send, so callers also wait for the writer. */
#define CONC_THREADS 8
#define CONC_STEPS   4000
#define CONC_EVENTS  200

typedef struct conc_arg {
    dsim_store *st;
    dsim_run_id run;
    int replica;
    int failures;
} conc_arg;

static void *conc_worker(void *p)
{
    conc_arg *a = p;
    for (int i = 0; i < CONC_STEPS; i++) {
        dsim_step_rec s = {.replica = a->replica,
                           .step = i,
                           .examples = a->replica + 1,
                           .loss = i,
                           .reduced_loss = i,
                           .checksum = (uint64_t)i * 31,
                           .t_start_ns = i,
                           .t_end_ns = i + 1};
        a->failures += dsim_store_step(a->st, a->run, &s) != DSIM_OK;
        if (i % (CONC_STEPS / CONC_EVENTS) == 0) {
            a->failures +=
                dsim_store_event(a->st, a->run, a->replica, i, DSIM_EVENT_PHASE, "tick") != DSIM_OK;
            a->failures +=
                dsim_store_metric(a->st, a->run, "tick", i, "step", a->replica) != DSIM_OK;
        }
        if (i == CONC_STEPS / 2)
            a->failures += dsim_store_flush(a->st) != DSIM_OK;
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    char path[4200];
    db_path(path, sizeof path, "conc.db");
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_info ri = run_info("concurrent");
    dsim_run_id run;
    assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_OK);
    pthread_t th[CONC_THREADS];
    conc_arg args[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) {
        args[i] = (conc_arg){.st = st, .run = run, .replica = i};
        assert_int_equal(pthread_create(&th[i], NULL, conc_worker, &args[i]), 0);
    }
    for (int i = 0; i < CONC_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);

    sqlite3 *db = su_open(path);
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), CONC_THREADS * CONC_STEPS);
    assert_int_equal(su_int(db, "SELECT count(*) FROM events"), CONC_THREADS * CONC_EVENTS);
    assert_int_equal(su_int(db, "SELECT count(*) FROM metrics"), CONC_THREADS * CONC_EVENTS);
    /* Every replica's rows, whole and in step order within the replica. */
    for (int r = 0; r < CONC_THREADS; r++) {
        assert_int_equal(su_int(db, "SELECT count(DISTINCT step) FROM steps WHERE replica=%d", r),
                         CONC_STEPS);
        assert_int_equal(su_int(db, "SELECT sum(examples) FROM steps WHERE replica=%d", r),
                         (int64_t)CONC_STEPS * (r + 1));
        assert_int_equal(su_int(db,
                                "SELECT count(*) FROM steps a JOIN steps b ON a.replica=b.replica "
                                "AND a.rowid < b.rowid AND a.step > b.step WHERE a.replica=%d "
                                "AND a.step %% 500 = 0",
                                r),
                         0);
    }
    assert_int_equal(su_int(db, "SELECT count(*) FROM step_stats WHERE checksums_agree"),
                     CONC_STEPS);
    assert_string_equal(su_text(db, (char[16]){0}, 16, "SELECT status FROM runs"), "passed");
    sqlite3_close(db);
}

/* Step records that trickle in (one every 100 us, as a job's replicas
 * report) are written in batches, a few per STORE_IDLE_MS, not one commit
 * each; they reach the database without a flush; a flush is not held up by
 * the wait for more. */
static double ts_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void test_batched_wakeups(void **state)
{
    (void)state;
    char path[4200];
    db_path(path, sizeof path, "batched.db");
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    dsim_run_info ri = run_info("batched");
    dsim_run_id run;
    assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_OK);
    uint64_t b0 = dsim_store_batches(st);
    double t0 = ts_ms();
    enum { N = 200 };
    for (int i = 0; i < N; i++) {
        dsim_step_rec s = {.replica = 0, .step = i, .examples = 1};
        assert_int_equal(dsim_store_step(st, run, &s), DSIM_OK);
        usleep(100);
    }
    double spent = ts_ms() - t0;
    /* at most one batch per 20 ms of pushing, and the last one's */
    uint64_t most = (uint64_t)(spent / 20.0) + 2;
    /* no flush: the rows arrive by themselves (a hang guard of 10 s) */
    sqlite3 *db = su_open(path);
    int64_t rows = 0;
    for (int i = 0; i < 1000 && rows < N; i++) {
        usleep(10000);
        rows = su_int(db, "SELECT count(*) FROM steps");
    }
    assert_int_equal(rows, N);
    uint64_t took = dsim_store_batches(st) - b0;
    if (took > most)
        fail_msg("%d step records over %.1f ms took %llu batches (at most %llu)", N, spent,
                 (unsigned long long)took, (unsigned long long)most);
    /* a flush right after a record: taken at once, not after the wait */
    dsim_step_rec s = {.replica = 0, .step = N, .examples = 1};
    assert_int_equal(dsim_store_step(st, run, &s), DSIM_OK);
    assert_int_equal(dsim_store_flush(st), DSIM_OK);
    assert_int_equal(su_int(db, "SELECT count(*) FROM steps"), N + 1);
    sqlite3_close(db);
    assert_int_equal(dsim_store_end_run(st, run, DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
}

/* Eight threads each begin, fill and end their own run at once. */
static void *runs_worker(void *p)
{
    conc_arg *a = p;
    char name[32];
    snprintf(name, sizeof name, "parallel-%d", a->replica);
    dsim_run_info ri = run_info(name);
    if (dsim_store_begin_run(a->st, &ri, &a->run) != DSIM_OK) {
        a->failures++;
        return NULL;
    }
    for (int i = 0; i < 100; i++) {
        dsim_step_rec s = {.replica = 0, .step = i, .examples = a->replica};
        a->failures += dsim_store_step(a->st, a->run, &s) != DSIM_OK;
    }
    a->failures += dsim_store_end_run(a->st, a->run, DSIM_RUN_PASSED, NULL, 0) != DSIM_OK;
    return NULL;
}

static void test_concurrent_runs(void **state)
{
    (void)state;
    char path[4200];
    db_path(path, sizeof path, "runs.db");
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    pthread_t th[CONC_THREADS];
    conc_arg args[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) {
        args[i] = (conc_arg){.st = st, .replica = i};
        assert_int_equal(pthread_create(&th[i], NULL, runs_worker, &args[i]), 0);
    }
    for (int i = 0; i < CONC_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    sqlite3 *db = su_open(path);
    assert_int_equal(su_int(db, "SELECT count(*) FROM runs WHERE status='passed'"), CONC_THREADS);
    for (int i = 0; i < CONC_THREADS; i++)
        assert_int_equal(su_int(db,
                                "SELECT count(*) FROM steps s JOIN runs r ON r.id=s.run_id WHERE "
                                "r.scenario='parallel-%d' AND s.examples=%d",
                                i, i),
                         100);
    sqlite3_close(db);
}

/* ---- the example queries of SCHEMA.md --------------------------------- */

typedef struct example {
    char name[64];
    char *sql;
} example;

/* Each ```sql block of the doc whose first line is "-- example: NAME". */
static int load_examples(example *ex, int max)
{
    size_t len = 0;
    char *doc = (char *)su_slurp(schema_doc, &len);
    if (!doc)
        fail_msg("cannot read %s", schema_doc);
    doc = realloc(doc, len + 1);
    doc[len] = '\0';
    int n = 0;
    const char *p = doc;
    while ((p = strstr(p, "```sql\n")) != NULL) {
        p += strlen("```sql\n");
        const char *end = strstr(p, "```");
        if (!end)
            break;
        if (strncmp(p, "-- example: ", 12) == 0 && n < max) {
            const char *nl = strchr(p, '\n');
            size_t nlen = (size_t)(nl - p - 12);
            assert_true(nlen < sizeof ex[n].name);
            memcpy(ex[n].name, p + 12, nlen);
            ex[n].name[nlen] = '\0';
            ex[n].sql = strndup(p, (size_t)(end - p));
            n++;
        }
        p = end + 3;
    }
    free(doc);
    return n;
}

/* Two runs: the first clean, the second diverging at step 3 with a failed
 * check, and flight records in which replica 2 never completed call 2. */
static void populate(const char *path)
{
    dsim_store *st;
    assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
    for (int k = 0; k < 2; k++) {
        dsim_run_info ri = run_info(k == 0 ? "clean" : "diverges");
        dsim_run_id run;
        assert_int_equal(dsim_store_begin_run(st, &ri, &run), DSIM_OK);
        for (int step = 0; step < 5; step++)
            for (int r = 0; r < 4; r++) {
                dsim_step_rec s = {.replica = r,
                                   .step = step,
                                   .examples = 8,
                                   .loss = 1,
                                   .checksum =
                                       (k == 1 && step >= 3 && r == 2) ? 99 : (uint64_t)step,
                                   .t_start_ns = step * 10,
                                   .t_end_ns = step * 10 + 5};
                assert_int_equal(dsim_store_step(st, run, &s), DSIM_OK);
            }
        assert_int_equal(dsim_store_check(st, run, "gradient_consistency", k == 0, k ? 3 : NAN, NAN,
                                          k ? "replica 2 diverged at step 3" : NULL),
                         DSIM_OK);
        assert_int_equal(dsim_store_check(st, run, "shard_coverage", true, 40, 40, NULL), DSIM_OK);
        for (int call = 1; k == 1 && call <= 2; call++)
            for (int r = 0; r < 3; r++) {
                bool stuck = call == 2 && r == 2;
                dsim_flight_rec fr = {.replica = r,
                                      .record_id = (uint64_t)call - 1,
                                      .pg_id = 1,
                                      .collective_seq_id = (uint64_t)call,
                                      .profiling_name = "dsim:all_reduce",
                                      .input_count = 36,
                                      .input_dtype = "Float",
                                      .reduce_op = "sum",
                                      .root = -1,
                                      .algorithm = "ring",
                                      .state = stuck ? "started" : "completed",
                                      .waiting_for = stuck ? 1 : -1,
                                      .time_created_ns = call * 100,
                                      .time_started_ns = call * 100 + 1,
                                      .time_completed_ns = stuck ? -1 : call * 100 + 50};
                assert_int_equal(dsim_store_flight(st, run, &fr), DSIM_OK);
            }
        assert_int_equal(
            dsim_store_end_run(st, run, k ? DSIM_RUN_FAILED : DSIM_RUN_PASSED, NULL, 0), DSIM_OK);
    }
    assert_int_equal(dsim_store_close(st), DSIM_OK);
}

static void test_doc_examples(void **state)
{
    (void)state;
    char path[4200];
    db_path(path, sizeof path, "examples.db");
    populate(path);
    example ex[8];
    int n = load_examples(ex, 8);
    assert_int_equal(n, 4);

    sqlite3 *db = su_open(path);
    for (int i = 0; i < n; i++) {
        sqlite3_stmt *s;
        const char *tail;
        if (sqlite3_prepare_v2(db, ex[i].sql, -1, &s, &tail) != SQLITE_OK)
            fail_msg("example '%s' does not compile: %s", ex[i].name, sqlite3_errmsg(db));
        /* One statement per example, as pasted into the shell. */
        while (*tail == ' ' || *tail == '\n')
            tail++;
        assert_string_equal(tail, "");
        int rows = 0;
        while (sqlite3_step(s) == SQLITE_ROW) {
            if (strcmp(ex[i].name, "recent runs") == 0) {
                /* newest first: the diverging run, failed, one failed check */
                if (rows == 0) {
                    assert_string_equal((const char *)sqlite3_column_text(s, 1), "diverges");
                    assert_string_equal((const char *)sqlite3_column_text(s, 3), "failed");
                    assert_int_equal(sqlite3_column_int(s, 5), 5);
                    assert_int_equal(sqlite3_column_int(s, 6), 160);
                    assert_int_equal(sqlite3_column_int(s, 7), 1);
                    assert_int_equal(sqlite3_column_int(s, 8), 1);
                } else {
                    assert_string_equal((const char *)sqlite3_column_text(s, 3), "passed");
                    assert_int_equal(sqlite3_column_int(s, 8), 0);
                }
            } else if (strcmp(ex[i].name, "first divergent step") == 0) {
                assert_int_equal(sqlite3_column_int(s, 0), 2);
                assert_int_equal(sqlite3_column_int(s, 1), 3);
            } else if (strcmp(ex[i].name, "failed checks") == 0) {
                assert_int_equal(sqlite3_column_int(s, 0), 2);
                assert_string_equal((const char *)sqlite3_column_text(s, 2),
                                    "gradient_consistency");
                assert_string_equal((const char *)sqlite3_column_text(s, 5),
                                    "replica 2 diverged at step 3");
            } else if (strcmp(ex[i].name, "calls not every replica completed") == 0) {
                assert_int_equal(sqlite3_column_int(s, 0), 2);
                assert_int_equal(sqlite3_column_int(s, 1), 2);
                assert_string_equal((const char *)sqlite3_column_text(s, 2), "dsim:all_reduce");
                assert_int_equal(sqlite3_column_int(s, 3), 2);
                assert_int_equal(sqlite3_column_int(s, 4), 3);
                assert_string_equal((const char *)sqlite3_column_text(s, 5), "2 waiting for 1");
            } else {
                fail_msg("SCHEMA.md has an example this test does not know: '%s'", ex[i].name);
            }
            rows++;
        }
        sqlite3_finalize(s);
        int want = strcmp(ex[i].name, "recent runs") == 0 ? 2 : 1;
        if (rows != want)
            fail_msg("example '%s' returned %d rows, expected %d", ex[i].name, rows, want);
    }
    sqlite3_close(db);

    /* The same text through the sqlite3 shell, as a user runs it. */
    const char *shell = getenv("SQLITE3_SHELL");
    if (shell && *shell) {
        for (int i = 0; i < n; i++) {
            char sqlfile[4200], cmd[12800];
            snprintf(sqlfile, sizeof sqlfile, "%s/example%d.sql", tmpdir, i);
            FILE *f = fopen(sqlfile, "w");
            assert_non_null(f);
            fputs(ex[i].sql, f);
            fclose(f);
            snprintf(cmd, sizeof cmd, "'%s' -batch -bail -header -column '%s' < '%s'", shell, path,
                     sqlfile);
            FILE *out = popen(cmd, "r");
            assert_non_null(out);
            char line[512];
            int lines = 0;
            while (fgets(line, sizeof line, out))
                lines++;
            int rc = pclose(out);
            if (rc != 0 || lines < 3) /* header, rule, at least one row */
                fail_msg("sqlite3 shell on example '%s': exit %d, %d lines", ex[i].name, rc, lines);
        }
    }
    for (int i = 0; i < n; i++)
        free(ex[i].sql);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/SCHEMA.md\n", argv[0]);
        return 2;
    }
    schema_doc = argv[1];
    su_mkdtemp(tmpdir, sizeof tmpdir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind),      cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_concurrent),      cmocka_unit_test(test_concurrent_runs),
        cmocka_unit_test(test_batched_wakeups), cmocka_unit_test(test_doc_examples),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    su_rmdir(tmpdir);
    return rc;
}
