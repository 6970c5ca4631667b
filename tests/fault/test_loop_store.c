/* Fault loop over the results store's writes (sim/store/SCHEMA.md; ARCHITECTURE.md §6): in a run's
 * lifetime through the store (open the database, begin the run, its
 * replicas, steps flushed one by one, a burst of steps, an event, a check
 * and a metric, end it, close), the 1st, 2nd, 3rd ... SQLite write fails in
 * turn (the points dsim/store/open and dsim/store/write), until a lifetime
 * has none left. Each time: the first call to fail returns DSIM_EIO naming
 * the database and SQLite's message, every later call fails too, close
 * returns that failure; then, read with sqlite3 itself: the file is sound,
 * another run committed before is whole, every step row the store confirmed
 * is there (and none it did not accept), the run is never left 'running'
 * after close (passed if its end committed, else unfinished), and a run
 * that an earlier process left running is marked unfinished by the next
 * open. Leaks are LeakSanitizer's to find (the sanitizer build). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim_config.h"
#include "store.h"
#include "store_util.h"

#if DSIM_HAVE_FIU
#include "fiu_loop.h"

#define NREP          2
#define FLUSHED_STEPS 4  /* recorded and flushed one at a time: a transaction each */
#define BURST_STEPS   24 /* recorded back to back: the writer batches what it finds */
/* A pid no Linux process has (pid_max is at most 2^22). */
#define DEAD_PID 99999999

static char tmpdir[4096];
static char base[4200]; /* the database every lifetime starts from */

static void st_step(int step, dsim_step_rec *s)
{
    *s = (dsim_step_rec){.replica = step % NREP,
                         .epoch = 0,
                         .step = step,
                         .loss = 100.0 - step,
                         .reduced_loss = 50.0,
                         .checksum = 1000 + (uint64_t)step,
                         .examples = 4,
                         .t_start_ns = step,
                         .t_end_ns = step + 1};
}

/* Run A, committed before any failure: begun, 3 steps, ended passed. Then
 * run C, left 'running' by a process that is gone (inserted by hand, as a
 * killed dsim leaves it). */
static void make_base(void)
{
    snprintf(base, sizeof base, "%s/base.db", tmpdir);
    dsim_store *st;
    assert_int_equal(dsim_store_open(base, &st), DSIM_OK);
    dsim_run_info ri = {.scenario = "A", .engine = "threads", .seed = 1};
    dsim_run_id a;
    assert_int_equal(dsim_store_begin_run(st, &ri, &a), DSIM_OK);
    for (int i = 0; i < 3; i++) {
        dsim_step_rec s;
        st_step(i, &s);
        assert_int_equal(dsim_store_step(st, a, &s), DSIM_OK);
    }
    assert_int_equal(dsim_store_event(st, a, -1, 0, DSIM_EVENT_PHASE, "start"), DSIM_OK);
    assert_int_equal(dsim_store_check(st, a, "convergence", true, 0.1, 0.5, "ok"), DSIM_OK);
    assert_int_equal(dsim_store_end_run(st, a, DSIM_RUN_PASSED, "abc", 0), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    sqlite3 *db = su_open(base);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO runs (scenario, seed, engine, dsim_version, status, started_ns, host, "
             "pid) VALUES ('C', 1, 'threads', 'x', 'running', 1, '%s', %d)",
             host, DEAD_PID);
    su_exec(db, sql);
    sqlite3_close(db);
}

static void copy_file(const char *from, const char *to)
{
    size_t n;
    unsigned char *b = su_slurp(from, &n);
    assert_non_null(b);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
    free(b);
}

/* What one lifetime saw. */
typedef struct lt {
    const char *path;
    int calls;      /* store calls made */
    dsim_err first; /* the first failure a call returned */
    int first_call;
    char first_what[64];
    char first_msg[512];
    bool opened, begun, ended;
    dsim_run_id run;
    int confirmed; /* step rows a call that returned OK said were committed */
    int accepted;  /* step rows the store took */
    dsim_err closed;
    char close_msg[512];
} lt;

/* Records a call's outcome: once one failed, none may succeed. */
static bool lt_ok(lt *l, dsim_err e, const char *what)
{
    l->calls++;
    if (e == DSIM_OK) {
        if (l->first != DSIM_OK)
            fail_msg("%s succeeded (call %d) after %s failed (call %d): %s", what, l->calls,
                     l->first_what, l->first_call, l->first_msg);
        return true;
    }
    if (l->first == DSIM_OK) {
        l->first = e;
        l->first_call = l->calls;
        snprintf(l->first_what, sizeof l->first_what, "%s", what);
        snprintf(l->first_msg, sizeof l->first_msg, "%s", dsim_errmsg());
    }
    return false;
}

/* One run's life through the store, as the harness lives it; stops issuing
 * records once a call fails (the store has failed for good), but always
 * closes. */
static void lifetime(lt *l)
{
    dsim_store *st = NULL;
    if (!lt_ok(l, dsim_store_open(l->path, &st), "open"))
        return;
    l->opened = true;
    dsim_run_info ri = {.scenario = "B", .engine = "threads", .seed = 2, .strategy = "mirrored"};
    if (lt_ok(l, dsim_store_begin_run(st, &ri, &l->run), "begin_run")) {
        l->begun = true;
        bool ok = true;
        for (int r = 0; r < NREP && ok; r++)
            ok = lt_ok(l, dsim_store_replica(st, l->run, r, r, "cpu:0", "h"), "replica");
        ok = ok && lt_ok(l, dsim_store_flush(st), "flush");
        for (int i = 0; i < FLUSHED_STEPS && ok; i++) {
            dsim_step_rec s;
            st_step(i, &s);
            ok = lt_ok(l, dsim_store_step(st, l->run, &s), "step");
            if (ok)
                l->accepted++;
            ok = ok && lt_ok(l, dsim_store_flush(st), "flush");
            if (ok)
                l->confirmed = l->accepted;
        }
        for (int i = FLUSHED_STEPS; i < FLUSHED_STEPS + BURST_STEPS && ok; i++) {
            dsim_step_rec s;
            st_step(i, &s);
            ok = lt_ok(l, dsim_store_step(st, l->run, &s), "step");
            if (ok)
                l->accepted++;
        }
        ok = ok &&
             lt_ok(l, dsim_store_event(st, l->run, 1, 5, DSIM_EVENT_CHECKPOINT, "{}"), "event");
        ok = ok && lt_ok(l,
                         dsim_store_check(st, l->run, "gradient_consistency", true, 0.0, 1e-4,
                                          "every replica agrees"),
                         "check");
        ok =
            ok && lt_ok(l, dsim_store_metric(st, l->run, "steps_per_s", 10.0, "1/s", -1), "metric");
        if (ok && lt_ok(l, dsim_store_end_run(st, l->run, DSIM_RUN_PASSED, NULL, 0), "end_run")) {
            l->ended = true;
            l->confirmed = l->accepted;
        }
    }
    /* The failure sticks: later calls report it. */
    if (l->first != DSIM_OK)
        assert_int_equal(dsim_store_flush(st), DSIM_EIO);
    l->closed = dsim_store_close(st);
    snprintf(l->close_msg, sizeof l->close_msg, "%s", dsim_errmsg());
    l->calls++;
}

static void assert_base_whole(sqlite3 *db)
{
    char buf[64];
    assert_string_equal(su_text(db, buf, sizeof buf, "PRAGMA integrity_check"), "ok");
    assert_string_equal(
        su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE scenario = 'A'"), "passed");
    assert_int_equal(su_int(db,
                            "SELECT count(*) FROM steps JOIN runs ON runs.id = run_id WHERE "
                            "scenario = 'A' AND checksum = 1000 + step AND loss = 100.0 - step"),
                     3);
    assert_int_equal(su_int(db, "SELECT count(*) FROM events JOIN runs ON runs.id = run_id WHERE "
                                "scenario = 'A'"),
                     1);
    assert_int_equal(su_int(db, "SELECT count(*) FROM checks JOIN runs ON runs.id = run_id WHERE "
                                "scenario = 'A'"),
                     1);
}

/* Everything the lifetime was told is committed is there, nothing it was
 * not allowed to write is, and its run is settled. */
static void check_after(const lt *l, int k)
{
    char buf[64];
    sqlite3 *db = su_open(l->path);
    assert_base_whole(db);
    int64_t nb = su_int(db, "SELECT count(*) FROM runs WHERE scenario = 'B'");
    if (!l->begun) {
        assert_int_equal(nb, 0);
    } else {
        assert_int_equal(nb, 1);
        const char *status = su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE id = %lld",
                                     (long long)l->run);
        if (strcmp(status, l->ended ? "passed" : "unfinished") != 0)
            fail_msg("write %d failed (%s: %s): run B is '%s' after close, expected '%s'", k,
                     l->first_what, l->first_msg, status, l->ended ? "passed" : "unfinished");
        int64_t n = su_int(db, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)l->run);
        if (n < l->confirmed || n > l->accepted)
            fail_msg("write %d failed (%s): %lld step rows of run B; %d were confirmed "
                     "committed, %d accepted",
                     k, l->first_what, (long long)n, l->confirmed, l->accepted);
        assert_int_equal(su_int(db,
                                "SELECT count(*) FROM steps WHERE run_id = %lld AND checksum = "
                                "1000 + step AND loss = 100.0 - step AND replica = step %% %d "
                                "AND examples = 4",
                                (long long)l->run, NREP),
                         n);
        if (l->ended) {
            assert_int_equal(
                su_int(db, "SELECT count(*) FROM replicas WHERE run_id = %lld", (long long)l->run),
                NREP);
            assert_int_equal(
                su_int(db, "SELECT count(*) FROM metrics WHERE run_id = %lld", (long long)l->run),
                1);
        }
    }
    sqlite3_close(db);

    /* The next open settles the run the gone process left. */
    dsim_store *st;
    assert_int_equal(dsim_store_open(l->path, &st), DSIM_OK);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    db = su_open(l->path);
    assert_string_equal(
        su_text(db, buf, sizeof buf, "SELECT status FROM runs WHERE scenario = 'C'"), "unfinished");
    assert_int_equal(su_int(db, "SELECT count(*) FROM runs WHERE status = 'running'"), 0);
    assert_base_whole(db);
    sqlite3_close(db);
}

static void test_store_write_loop(void **state)
{
    (void)state;
    make_base();
    char path[4200];
    snprintf(path, sizeof path, "%s/loop.db", tmpdir);
    int k, shown = 0;
    for (k = 1;; k++) {
        char side[4300];
        unlink(path);
        snprintf(side, sizeof side, "%s-wal", path);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", path);
        unlink(side);
        copy_file(base, path);
        lt l = {.path = path, .run = -1};
        fl_arm("dsim/store/*", k, NULL);
        lifetime(&l);
        fl_disarm();
        if (!fl_fired()) {
            /* Nothing failed: the whole run is there, and the count is k - 1. */
            if (l.first != DSIM_OK || l.closed != DSIM_OK)
                fail_msg("nothing injected, yet %s failed: %s", l.first_what, l.first_msg);
            assert_true(l.ended);
            /* fewer writes than k (the writer batches the burst of steps as
             * it finds them, so a lifetime's count varies by a few) */
            assert_true(fl_calls() <= k - 1);
            check_after(&l, k);
            sqlite3 *db = su_open(path);
            assert_int_equal(
                su_int(db, "SELECT count(*) FROM steps WHERE run_id = %lld", (long long)l.run),
                FLUSHED_STEPS + BURST_STEPS);
            sqlite3_close(db);
            break;
        }
        /* A clear error: EIO, the file, SQLite's words; close says it too. */
        if (l.first != DSIM_EIO)
            fail_msg("write %d failed, but the first call to fail (%s) returned %s: %s", k,
                     l.first_what, dsim_strerror(l.first), l.first_msg);
        if (!strstr(l.first_msg, path) || !strstr(l.first_msg, "disk I/O error"))
            fail_msg("write %d failed: the message does not name %s and SQLite's error: %s", k,
                     path, l.first_msg);
        if (l.opened) {
            assert_int_equal(l.closed, DSIM_EIO);
            assert_non_null(strstr(l.close_msg, path));
        }
        if (shown < 6 && (k == 1 || strcmp(l.first_what, "open") != 0)) {
            printf("# write %d: %s failed: %s\n", k, l.first_what, l.first_msg);
            shown++;
        }
        check_after(&l, k);
    }
    printf("# %d writes in a run's life through the store, each failed in turn (%d lifetimes)\n",
           k - 1, k);
}

/* Creating a database fails at each of its writes in turn: refused with
 * EIO, and the next open creates it whole. */
static void test_store_create_loop(void **state)
{
    (void)state;
    char path[4200];
    snprintf(path, sizeof path, "%s/new.db", tmpdir);
    int k;
    for (k = 1;; k++) {
        char side[4300];
        unlink(path);
        snprintf(side, sizeof side, "%s-wal", path);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", path);
        unlink(side);
        dsim_store *st = NULL;
        fl_arm("dsim/store/*", k, NULL);
        dsim_err e = dsim_store_open(path, &st);
        fl_disarm();
        if (!fl_fired()) {
            assert_int_equal(e, DSIM_OK);
            assert_int_equal(dsim_store_close(st), DSIM_OK);
            assert_int_equal(fl_calls(), k - 1);
            break;
        }
        assert_int_equal(e, DSIM_EIO);
        assert_null(st);
        assert_non_null(strstr(dsim_errmsg(), path));
        if (k <= 2)
            printf("# create, write %d: %s\n", k, dsim_errmsg());
        /* Left at version 0 (or absent): the next open makes it. */
        assert_int_equal(dsim_store_open(path, &st), DSIM_OK);
        assert_int_equal(dsim_store_close(st), DSIM_OK);
        sqlite3 *db = su_open(path);
        assert_int_equal(su_int(db, "PRAGMA user_version"), DSIM_STORE_SCHEMA_VERSION);
        assert_int_equal(su_int(db, "SELECT count(*) FROM runs"), 0);
        sqlite3_close(db);
    }
    printf("# creating a database: %d writes, each failed in turn\n", k - 1);
}

int main(void)
{
    fl_init();
    su_mkdtemp(tmpdir, sizeof tmpdir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_create_loop),
        cmocka_unit_test(test_store_write_loop),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    su_rmdir(tmpdir);
    return rc;
}
#else
int main(void)
{
    printf("# built without libfiu: no fault points to loop over\n");
    return 77;
}
#endif
