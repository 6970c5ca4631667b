/* `dsim run` on strategies that never return or take the process down
 * (tests/harness/scenarios, plugins from misbehave_strategy.c): each run
 * ends within its bound, with the right exit status (1, or death by the
 * signal), says which replica, phase, step and signal, and is in the store
 * as 'hung' or 'crashed' with the detail as events.
 *
 * argv[1] is the dsim executable; DSIM_HARNESS_SCENARIOS the scenario
 * folder; DSIM_HARNESS_PLUGINS the folder the plugins were built in. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <sqlite3.h>

/* The safety net: a run still going after this is killed and fails. */
#define HC_KILL_AFTER_S 60

static const char *hc_dsim;
static char hc_tmp[256];
static char *hc_out, *hc_err;
static double hc_secs; /* how long the last run took */

static char *hc_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = '\0';
    fclose(f);
    return b;
}

static double hc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sets a sanitizer's options in the child for a crash on purpose: it must
 * reach dsim's own handler and kill the process, not become a sanitizer
 * report. (A hang keeps the suite's options, leak checks included.) */
static void hc_crash_env(void)
{
    setenv("ASAN_OPTIONS",
           "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:handle_abort=0:"
           "allow_user_segv_handler=1:detect_leaks=0",
           1);
    setenv("UBSAN_OPTIONS", "print_stacktrace=1", 1);
    setenv("TSAN_OPTIONS",
           "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:"
           "handle_abort=0:report_signal_unsafe=0",
           1);
}

/* Runs `dsim run SCENARIO.yaml --db DB --plugin-dir ... [extra]`; returns
 * the wait status. */
static int hc_run(const char *scenario, const char *db, const char *extra)
{
    char file[512], out[512], err[512];
    snprintf(file, sizeof file, "%s/%s.yaml", getenv("DSIM_HARNESS_SCENARIOS"), scenario);
    snprintf(out, sizeof out, "%s/stdout.txt", hc_tmp);
    snprintf(err, sizeof err, "%s/stderr.txt", hc_tmp);
    double t0 = hc_now();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0)
            _exit(126);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        if (strncmp(scenario, "crash_", 6) == 0)
            hc_crash_env();
        char *args[] = {(char *)hc_dsim,
                        "run",
                        file,
                        "--db",
                        (char *)db,
                        "--plugin-dir",
                        getenv("DSIM_HARNESS_PLUGINS"),
                        (char *)extra,
                        NULL};
        execv(hc_dsim, args);
        _exit(127);
    }
    int st = 0;
    pid_t got = 0;
    while ((got = waitpid(pid, &st, WNOHANG)) == 0 && hc_now() - t0 < HC_KILL_AFTER_S) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    hc_secs = hc_now() - t0;
    free(hc_out);
    free(hc_err);
    hc_out = hc_slurp(out);
    hc_err = hc_slurp(err);
    if (got == 0)
        fail_msg("dsim run %s did not end within %d s; stdout:\n%s\nstderr:\n%s", scenario,
                 HC_KILL_AFTER_S, hc_out, hc_err);
    return st;
}

static void hc_has(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        fail_msg("output lacks \"%s\":\n%s", needle, text);
}

static long long hc_sql_int(const char *db, const char *sql)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(h));
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    long long v = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(h);
    return v;
}

static void hc_status(const char *db, const char *want)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    assert_int_equal(
        sqlite3_prepare_v2(h, "SELECT status FROM runs ORDER BY id DESC LIMIT 1", -1, &q, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    const char *got = (const char *)sqlite3_column_text(q, 0);
    if (!got || strcmp(got, want) != 0)
        fail_msg("the run is stored as '%s', not '%s'", got ? got : "(null)", want);
    sqlite3_finalize(q);
    sqlite3_close(h);
}

static void hc_db(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s.db", hc_tmp, name);
}

static void hc_exited(int st, int code)
{
    if (!WIFEXITED(st))
        fail_msg("dsim died of signal %d; stderr:\n%s", WIFSIGNALED(st) ? WTERMSIG(st) : -1,
                 hc_err);
    if (WEXITSTATUS(st) != code)
        fail_msg("dsim exited %d, not %d; stdout:\n%s\nstderr:\n%s", WEXITSTATUS(st), code, hc_out,
                 hc_err);
}

static void hc_signalled(int st, int sig)
{
    if (!WIFSIGNALED(st) || WTERMSIG(st) != sig)
        fail_msg("dsim did not die of signal %d (status 0x%x); stdout:\n%s\nstderr:\n%s", sig, st,
                 hc_out, hc_err);
}

/* (a) replica 1 sleeps for ever in apply_gradients at step 2: the others
 * time out (300 ms), the grace (1 s) passes, the run is hung. */
static void test_hang_sleep(void **state)
{
    (void)state;
    char db[512];
    hc_db(db, sizeof db, "sleep");
    int st = hc_run("hang_sleep", db, NULL);
    hc_exited(st, 1);
    assert_true(hc_secs < 15);
    hc_has(hc_out, "the run hung; left running:");
    hc_has(hc_out, "replica 1 in phase allreduce at global step 2 (last collective: allreduce");
    hc_has(hc_out, "hang_sleep: hung");
    hc_status(db, "hung");
    assert_int_equal(hc_sql_int(db, "SELECT count(*) FROM events WHERE kind = 'error' AND "
                                    "replica = 1 AND json_extract(detail, '$.error') = 'hung' "
                                    "AND json_extract(detail, '$.phase') = 'allreduce' AND "
                                    "json_extract(detail, '$.global_step') = 2"),
                     1);
    assert_int_equal(hc_sql_int(db, "SELECT count(*) FROM events WHERE replica IS NULL AND "
                                    "detail LIKE '%the job hung%'"),
                     1);
    /* the steps taken before it are kept */
    assert_int_equal(hc_sql_int(db, "SELECT count(DISTINCT step) FROM steps"), 2);

    /* --json says the same */
    st = hc_run("hang_sleep", db, "--json");
    hc_exited(st, 1);
    hc_has(hc_out, "\"status\": \"hung\"");
    hc_has(hc_out, "\"stuck\": [");
    hc_has(hc_out, "\"phase\": \"allreduce\"");
    hc_status(db, "hung");
}

/* (b) every replica spins before any collective: nothing times out; the
 * progress bound (1 s) aborts the job, then the grace. */
static void test_hang_spin(void **state)
{
    (void)state;
    char db[512];
    hc_db(db, sizeof db, "spin");
    int st = hc_run("hang_spin", db, NULL);
    hc_exited(st, 1);
    assert_true(hc_secs < 15);
    hc_has(hc_out, "no replica entered a new phase or returned for 1.00 s");
    hc_has(hc_out, "replica 0 in phase create_variables at global step 0 (before its first "
                   "collective)");
    hc_has(hc_out, "replica 1 in phase create_variables at global step 0");
    hc_status(db, "hung");
    assert_int_equal(hc_sql_int(db, "SELECT count(*) FROM events WHERE "
                                    "json_extract(detail, '$.error') = 'hung' AND "
                                    "json_extract(detail, '$.phase') = 'create_variables'"),
                     2);
}

static void hc_crashed(const char *db, const char *what)
{
    hc_status(db, "crashed");
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM events WHERE kind = 'error' AND replica = 1 AND "
             "json_extract(detail, '$.error') = 'crashed' AND "
             "json_extract(detail, '$.global_step') = 2 AND "
             "json_extract(detail, '$.phase') = 'allreduce' AND %s",
             what);
    assert_int_equal(hc_sql_int(db, sql), 1);
    /* what was committed before the crash stays */
    assert_true(hc_sql_int(db, "SELECT count(*) FROM steps") >= 2);
    assert_int_equal(hc_sql_int(db, "SELECT ended_ns IS NOT NULL FROM runs"), 1);
}

/* (c) replica 1 segfaults at step 2 */
static void test_crash_segv(void **state)
{
    (void)state;
    char db[512];
    hc_db(db, sizeof db, "segv");
    int st = hc_run("crash_segv", db, NULL);
    hc_signalled(st, SIGSEGV);
    assert_true(hc_secs < 15);
    hc_has(hc_err, "dsim: replica 1 crashed with signal 11 (SIGSEGV) in phase allreduce at global "
                   "step 2; storing the run as crashed");
    hc_has(hc_err, "stored as crashed in");
    hc_crashed(db, "json_extract(detail, '$.signal_name') = 'SIGSEGV'");
}

/* (d) replica 1 calls abort() at step 2 */
static void test_crash_abort(void **state)
{
    (void)state;
    char db[512];
    hc_db(db, sizeof db, "abort");
    int st = hc_run("crash_abort", db, NULL);
    hc_signalled(st, SIGABRT);
    assert_true(hc_secs < 15);
    hc_has(hc_err, "dsim: replica 1 crashed with signal 6 (SIGABRT) in phase allreduce at global "
                   "step 2");
    hc_crashed(db, "json_extract(detail, '$.signal') = 6");
}

/* (e) replica 1 calls exit(3) at step 2: stored as crashed, exit status 1 */
static void test_crash_exit(void **state)
{
    (void)state;
    char db[512];
    hc_db(db, sizeof db, "exit");
    int st = hc_run("crash_exit", db, NULL);
    hc_exited(st, 1);
    assert_true(hc_secs < 15);
    hc_has(hc_err, "dsim: replica 1 called exit(3) in phase allreduce at global step 2");
    hc_crashed(db, "json_extract(detail, '$.exit_status') = 3");
}

static int hc_setup(void **state)
{
    (void)state;
    snprintf(hc_tmp, sizeof hc_tmp, "%s/dsim-hcli.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(hc_tmp) ? 0 : -1;
}

static int hc_teardown(void **state)
{
    (void)state;
    free(hc_out);
    free(hc_err);
    hc_out = hc_err = NULL;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", hc_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !getenv("DSIM_HARNESS_SCENARIOS") || !getenv("DSIM_HARNESS_PLUGINS")) {
        fprintf(stderr, "usage: DSIM_HARNESS_SCENARIOS=DIR DSIM_HARNESS_PLUGINS=DIR "
                        "test_harness_cli PATH/TO/dsim\n");
        return 77;
    }
    hc_dsim = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hang_sleep), cmocka_unit_test(test_hang_spin),
        cmocka_unit_test(test_crash_segv), cmocka_unit_test(test_crash_abort),
        cmocka_unit_test(test_crash_exit),
    };
    return cmocka_run_group_tests(tests, hc_setup, hc_teardown);
}
