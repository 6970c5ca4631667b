/* `dsim run` and `dsim list` end to end: exit codes 0/1/2, the results
 * store's rows after a run (read with sqlite3), --json that parses, help
 * texts, an interrupted run stored as unfinished, and a catalogue test for
 * every scenario file.
 *
 * argv[1] is the dsim executable; DSIM_SCENARIO_DIR the catalogue folder;
 * DSIM_CATALOGUE the names the scenarios suite runs, separated by spaces. */
#include <dirent.h>
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>
#include <sqlite3.h>

static const char *cli_dsim;
static char cli_tmp[256];

/* Output of the last cli_run. */
static char *cli_out, *cli_err;

static char *cli_slurp(const char *path)
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

static void cli_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", cli_tmp, name);
}

static pid_t cli_spawn(char *const *args)
{
    char out[512], err[512];
    cli_path(out, sizeof out, "stdout.txt");
    cli_path(err, sizeof err, "stderr.txt");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0)
            _exit(126);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        execv(cli_dsim, args);
        _exit(127);
    }
    return pid;
}

static int cli_collect(pid_t pid)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char out[512], err[512];
    cli_path(out, sizeof out, "stdout.txt");
    cli_path(err, sizeof err, "stderr.txt");
    free(cli_out);
    free(cli_err);
    cli_out = cli_slurp(out);
    cli_err = cli_slurp(err);
    if (WIFSIGNALED(st))
        fail_msg("dsim died of signal %d; stderr: %s", WTERMSIG(st), cli_err);
    return WEXITSTATUS(st);
}

/* Runs dsim with the arguments (NULL-terminated); returns its exit status. */
static int cli_run(const char *first, ...)
{
    char *args[32];
    int n = 0;
    args[n++] = (char *)cli_dsim;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 31; a = va_arg(ap, const char *))
        args[n++] = (char *)a;
    va_end(ap);
    args[n] = NULL;
    return cli_collect(cli_spawn(args));
}

static void cli_has(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        fail_msg("output lacks \"%s\":\n%s", needle, text);
}

/* A scenario file in the temp folder. */
static void cli_write(const char *name, const char *text)
{
    char p[512];
    cli_path(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

#define CLI_SMALL                                                                                  \
    "cluster: {hosts: 2, devices_per_host: 2}\n"                                                   \
    "strategy: {name: multi_worker_mirrored}\n"                                                    \
    "model: {kind: softmax}\n"                                                                     \
    "optimizer: {kind: sgd, learning_rate: 0.5}\n"                                                 \
    "data: {examples: 128, features: 4, classes: 3, files: 4, global_batch: 16, epochs: 1}\n"

/* One integer from the database. */
static long long cli_sql_int(const char *db, const char *sql)
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

static char *cli_sql_text(const char *db, const char *sql)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(h));
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    const unsigned char *t = sqlite3_column_text(q, 0);
    char *v = strdup(t ? (const char *)t : "");
    sqlite3_finalize(q);
    sqlite3_close(h);
    return v;
}

static void test_help(void **state)
{
    (void)state;
    assert_int_equal(cli_run("--help", NULL), 0);
    cli_has(cli_out, "run ");
    cli_has(cli_out, "list ");
    assert_int_equal(cli_run("help", "run", NULL), 0);
    cli_has(cli_out, "--engine");
    cli_has(cli_out, "--seed");
    cli_has(cli_out, "--db");
    cli_has(cli_out, "--json");
    cli_has(cli_out, "Exit status");
    assert_int_equal(cli_run("run", "--help", NULL), 0);
    cli_has(cli_out, "--engine");
    assert_int_equal(cli_run("list", "--help", NULL), 0);
    cli_has(cli_out, "strategies|algorithms|checks|runs");
}

static void test_run_passes_and_is_stored(void **state)
{
    (void)state;
    char db[512], quick[512];
    cli_path(db, sizeof db, "pass.db");
    snprintf(quick, sizeof quick, "%s/quickstart.yaml", getenv("DSIM_SCENARIO_DIR"));
    assert_int_equal(cli_run("run", quick, "--db", db, NULL), 0);
    cli_has(cli_out, "gradient_consistency");
    cli_has(cli_out, "shard_coverage");
    cli_has(cli_out, "convergence");
    cli_has(cli_out, "PASS");
    cli_has(cli_out, "run 1 stored in");
    /* not a terminal: plain progress lines, a few, not one per step */
    cli_has(cli_out, "ex/s");
    int lines = 0;
    for (const char *p = cli_out; (p = strstr(p, "ex/s\n")); p++)
        lines++;
    assert_true(lines >= 2 && lines <= 12);

    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM runs"), 1);
    char *status = cli_sql_text(db, "SELECT status FROM runs WHERE id = 1");
    assert_string_equal(status, "passed");
    free(status);
    assert_int_equal(cli_sql_int(db, "SELECT seed FROM runs WHERE id = 1"), 42);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM checks WHERE run_id = 1 AND passed"), 3);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM checks WHERE run_id = 1 AND "
                                     "name = 'gradient_consistency' AND measured IS NOT NULL "
                                     "AND expected = 1e-4 AND message <> ''"),
                     1);
    /* a step row per replica per step */
    long long steps = cli_sql_int(db, "SELECT count(DISTINCT step) FROM steps WHERE run_id = 1");
    assert_true(steps > 0);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM steps WHERE run_id = 1"), steps * 4);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM replicas WHERE run_id = 1"), 4);
    assert_int_equal(cli_sql_int(db, "SELECT value FROM metrics WHERE run_id = 1 AND "
                                     "name = 'steps'"),
                     steps);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM metrics WHERE run_id = 1 AND name IN "
                                     "('examples_per_s', 'wall_time', 'allreduce_algorithm')"),
                     3);
    /* the scenario text and the resolved configuration */
    char *text = cli_sql_text(db, "SELECT scenario_text FROM runs WHERE id = 1");
    cli_has(text, "name: quickstart");
    free(text);
    char *config = cli_sql_text(db, "SELECT config FROM runs WHERE id = 1");
    json_error_t je;
    json_t *cj = json_loads(config, 0, &je);
    if (!cj)
        fail_msg("config is not JSON: %s: %s", je.text, config);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(cj, "cluster"), "hosts")),
                     2);
    assert_string_equal(json_string_value(json_object_get(json_object_get(cj, "strategy"), "name")),
                        "multi_worker_mirrored");
    json_decref(cj);
    free(config);

    /* dsim list runs reads it back */
    assert_int_equal(cli_run("list", "runs", "--db", db, NULL), 0);
    cli_has(cli_out, "quickstart");
    cli_has(cli_out, "passed");
    cli_has(cli_out, "3 passed, 0 failed");
    cli_has(cli_out, "  ENGINE  ");
    cli_has(cli_out, "  threads  ");
    assert_int_equal(cli_run("list", "runs", "--db", db, "--json", NULL), 0);
    json_t *lj = json_loads(cli_out, 0, &je);
    assert_non_null(lj);
    assert_int_equal(json_array_size(lj), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(lj, 0), "checks_passed")),
                     3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(lj, 0), "engine")),
                        "threads");
    json_decref(lj);
}

/* dsim list runs shows a matrix's long names whole (each row its own) and
 * the engine of each run. */
static void test_list_runs_matrix(void **state)
{
    (void)state;
    cli_write("matrix.yaml", "name: hier_matrix_with_a_long_name\n" CLI_SMALL "matrix:\n"
                             "  cluster:\n"
                             "    - {hosts: 1, devices_per_host: 3}\n"
                             "    - {hosts: 2, devices_per_host: 2}\n"
                             "  strategy.communication: [ring, rhd]\n");
    char db[512], file[512];
    cli_path(db, sizeof db, "matrix.db");
    cli_path(file, sizeof file, "matrix.yaml");
    assert_int_equal(cli_run("run", file, "--db", db, "--engine", "sim", NULL), 0);
    assert_int_equal(cli_run("list", "runs", "--db", db, NULL), 0);
    static const char *const names[] = {
        "hier_matrix_with_a_long_name[hosts=1,devices_per_host=3,strategy.communication=ring]",
        "hier_matrix_with_a_long_name[hosts=1,devices_per_host=3,strategy.communication=rhd]",
        "hier_matrix_with_a_long_name[hosts=2,devices_per_host=2,strategy.communication=ring]",
        "hier_matrix_with_a_long_name[hosts=2,devices_per_host=2,strategy.communication=rhd]"};
    for (size_t i = 0; i < 4; i++) {
        char row[256];
        /* the whole name, then the engine column */
        snprintf(row, sizeof row, "%s%s  sim  ", names[i], i % 2 ? " " : "");
        cli_has(cli_out, row);
    }
}

static void test_run_check_fails(void **state)
{
    (void)state;
    /* a bound no 1-epoch run reaches: the check fails for real */
    cli_write("fail.yaml",
              "name: too_ambitious\n" CLI_SMALL
              "expect:\n  shard_coverage: {}\n  convergence: {max_final_loss: 1e-6}\n");
    char db[512], file[512];
    cli_path(db, sizeof db, "fail.db");
    cli_path(file, sizeof file, "fail.yaml");
    assert_int_equal(cli_run("run", file, "--db", db, NULL), 1);
    cli_has(cli_out, "FAIL");
    cli_has(cli_out, "ABOVE max_final_loss");
    char *status = cli_sql_text(db, "SELECT status FROM runs WHERE id = 1");
    assert_string_equal(status, "failed");
    free(status);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM checks WHERE NOT passed AND "
                                     "name = 'convergence'"),
                     1);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM checks WHERE passed AND "
                                     "name = 'shard_coverage'"),
                     1);

    /* a correct strategy does not meet "expect: fail" */
    cli_write("nofail.yaml", "name: expects_a_failure\n" CLI_SMALL
                             "expect:\n  gradient_consistency: {expect: fail}\n");
    cli_path(file, sizeof file, "nofail.yaml");
    assert_int_equal(cli_run("run", file, "--db", db, NULL), 1);
    cli_has(cli_out, "expected to fail, but passed");

    /* expect.error on a run that succeeds */
    cli_write("noerr.yaml",
              "name: expects_an_error\n" CLI_SMALL "expect:\n  error: \"fewer than the\"\n");
    cli_path(file, sizeof file, "noerr.yaml");
    assert_int_equal(cli_run("run", file, "--db", db, NULL), 1);
    cli_has(cli_out, "the run succeeded");

    /* no expect section: a run that fails (FILE sharding, 1 file for 2
     * workers) is a failure, not a pass with nothing judged */
    cli_write("noexpect.yaml", "name: fails_unjudged\n"
                               "cluster: {hosts: 2, devices_per_host: 1}\n"
                               "data: {examples: 64, files: 1, shard_policy: file}\n");
    cli_path(file, sizeof file, "noexpect.yaml");
    assert_int_equal(cli_run("run", file, "--db", db, NULL), 1);
    cli_has(cli_out, "the run failed:");
    status = cli_sql_text(db, "SELECT status FROM runs ORDER BY id DESC LIMIT 1");
    assert_string_equal(status, "failed");
    free(status);

    /* a run that fails in its collectives (a 1 ns timeout): the steps it
     * reports, printed and stored as the 'steps' metric, are the steps it
     * took (as stored), not the steps it was to take */
    cli_write("timeout.yaml", "name: times_out\n"
                              "cluster: {hosts: 2, devices_per_host: 2}\n"
                              "strategy: {name: multi_worker_mirrored, timeout: 1ns}\n"
                              "data: {examples: 64, files: 2, global_batch: 8, epochs: 1}\n"
                              "expect:\n  shard_coverage: {}\n");
    cli_path(file, sizeof file, "timeout.yaml");
    int trc = cli_run("run", file, "--db", db, NULL);
    assert_true(trc == 0 || trc == 1);
    long long tid = cli_sql_int(db, "SELECT max(id) FROM runs");
    char sql[300];
    snprintf(sql, sizeof sql,
             "SELECT (SELECT value FROM metrics WHERE run_id = %lld AND name = 'steps') = "
             "(SELECT count(DISTINCT step) FROM steps WHERE run_id = %lld)",
             tid, tid);
    assert_int_equal(cli_sql_int(db, sql), 1);
    cli_path(file, sizeof file, "noerr.yaml");

    /* several scenarios: one failure makes the whole command fail */
    char quick[512];
    snprintf(quick, sizeof quick, "%s/quickstart.yaml", getenv("DSIM_SCENARIO_DIR"));
    assert_int_equal(cli_run("run", quick, file, "--db", db, NULL), 1);
    cli_has(cli_out, "2 scenarios: 1 passed, 1 did not");
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM runs"), 7);
}

static void test_run_bad_input(void **state)
{
    (void)state;
    char db[512], file[512];
    cli_path(db, sizeof db, "bad.db");

    cli_write("broken.yaml", "name: broken\ncluster: {hosts: 2\n");
    cli_path(file, sizeof file, "broken.yaml");
    assert_int_equal(cli_run("run", file, "--db", db, NULL), 2);
    cli_has(cli_err, "broken.yaml:");
    /* nothing ran, so no store was made */
    assert_true(access(db, F_OK) != 0);

    cli_write("unknown.yaml", "name: unknown\n" CLI_SMALL "expect:\n  shard_coverage: {}\n"
                              "colour: blue\n");
    cli_path(file, sizeof file, "unknown.yaml");
    assert_int_equal(cli_run("run", file, "--db", db, NULL), 2);
    cli_has(cli_err, "unknown.yaml:");
    cli_has(cli_err, "colour");

    assert_int_equal(cli_run("run", "/nonexistent/scenario.yaml", "--db", db, NULL), 2);
    cli_has(cli_err, "/nonexistent/scenario.yaml");

    /* a good scenario with bad options */
    cli_write("good.yaml", "name: good\n" CLI_SMALL "expect:\n  shard_coverage: {}\n");
    cli_path(file, sizeof file, "good.yaml");
    assert_int_equal(cli_run("run", file, "--engine", "warp", NULL), 2);
    cli_has(cli_err, "threads, processes, sim");
    assert_int_equal(cli_run("run", file, "--seed", "-3", NULL), 2);
    assert_int_equal(cli_run("run", file, "--seed", NULL), 2);
    assert_int_equal(cli_run("run", file, "--frobnicate", NULL), 2);
    cli_has(cli_err, "--frobnicate");
    assert_true(access(db, F_OK) != 0);

    /* a store that cannot be opened */
    assert_int_equal(cli_run("run", file, "--db", "/nonexistent-dir/sub/x.db", NULL), 2);
    cli_has(cli_err, "/nonexistent-dir/sub/x.db");
    char junk[512];
    cli_path(junk, sizeof junk, "junk.db");
    cli_write("junk.db", "this is not a database, and it is long enough to look like a file "
                         "that is not SQLite at all............................................");
    assert_int_equal(cli_run("run", file, "--db", junk, NULL), 2);
    cli_has(cli_err, "junk.db");
    char *after = cli_slurp(junk);
    cli_has(after, "this is not a database");
    free(after);

    /* --engine overrides the file's engine both ways */
    cli_write("simeng.yaml",
              "name: simeng\nengine: sim\n" CLI_SMALL "expect:\n  shard_coverage: {}\n");
    char simf[512];
    cli_path(simf, sizeof simf, "simeng.yaml");
    assert_true(access(db, F_OK) != 0);
    assert_int_equal(cli_run("run", simf, "--db", db, "--engine", "threads", NULL), 0);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM runs WHERE engine = 'threads'"), 1);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM runs WHERE trace_hash IS NULL"), 1);
    assert_int_equal(cli_run("run", simf, "--db", db, NULL), 0);
    cli_has(cli_out, "s virtual");
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM runs WHERE engine = 'sim' AND "
                                     "length(trace_hash) = 16"),
                     1);
    /* replay: the sim run matches; the threads run and a missing one are bad input */
    assert_int_equal(cli_run("replay", "2", "--db", db, NULL), 0);
    cli_has(cli_out, "trace matches");
    assert_int_equal(cli_run("replay", "1", "--db", db, NULL), 2);
    cli_has(cli_err, "engine threads");
    assert_int_equal(cli_run("replay", "77", "--db", db, NULL), 2);
    cli_has(cli_err, "no run 77");
    assert_int_equal(cli_run("replay", "x", "--db", db, NULL), 2);
    assert_int_equal(cli_run("replay", "--db", db, NULL), 2);
    assert_int_equal(cli_sql_int(db, "SELECT count(*) FROM runs"), 3);

    /* the good scenario is fine, with the seed overridden */
    assert_int_equal(cli_run("run", file, "--db", db, "--seed", "5", NULL), 0);
    assert_int_equal(cli_sql_int(db, "SELECT seed FROM runs WHERE id = 4"), 5);

    /* list */
    assert_int_equal(cli_run("list", NULL), 2);
    assert_int_equal(cli_run("list", "everything", NULL), 2);
    cli_has(cli_err, "strategies, algorithms, checks, runs");
    assert_int_equal(cli_run("list", "runs", "--db", "/nonexistent-dir/x.db", NULL), 2);
    assert_true(access("/nonexistent-dir", F_OK) != 0);
    assert_int_equal(cli_run("list", "runs", "--db", junk, NULL), 2);
}

static void test_run_json(void **state)
{
    (void)state;
    char db[512], quick[512];
    cli_path(db, sizeof db, "json.db");
    snprintf(quick, sizeof quick, "%s/quickstart.yaml", getenv("DSIM_SCENARIO_DIR"));
    assert_int_equal(cli_run("run", quick, "--db", db, "--json", NULL), 0);
    json_error_t je;
    json_t *j = json_loads(cli_out, 0, &je);
    if (!j)
        fail_msg("--json output does not parse: %s (line %d):\n%s", je.text, je.line, cli_out);
    assert_true(json_is_true(json_object_get(j, "passed")));
    assert_int_equal(json_integer_value(json_object_get(j, "exit_status")), 0);
    json_t *runs = json_object_get(j, "runs");
    assert_int_equal(json_array_size(runs), 1);
    json_t *r = json_array_get(runs, 0);
    assert_string_equal(json_string_value(json_object_get(r, "scenario")), "quickstart");
    assert_string_equal(json_string_value(json_object_get(r, "status")), "passed");
    assert_int_equal(json_integer_value(json_object_get(r, "run_id")), 1);
    assert_true(json_integer_value(json_object_get(r, "steps")) > 0);
    json_t *checks = json_object_get(r, "checks");
    assert_int_equal(json_array_size(checks), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *c = json_array_get(checks, i);
        assert_true(json_is_true(json_object_get(c, "passed")));
        assert_true(json_is_number(json_object_get(c, "measured")));
        assert_true(json_is_string(json_object_get(c, "message")));
    }
    json_decref(j);

    assert_int_equal(cli_run("list", "checks", "--json", NULL), 0);
    j = json_loads(cli_out, 0, &je);
    assert_non_null(j);
    assert_int_equal(json_array_size(j), 7);
    json_decref(j);
    assert_int_equal(cli_run("list", "checks", NULL), 0);
    cli_has(cli_out, "checkpoint_roundtrip");
    cli_has(cli_out, "gradient_consistency");
    cli_has(cli_out, "max_rel_error");
    cli_has(cli_out, "max_straggler_factor");
    cli_has(cli_out, "total_per_worker_s");
    assert_int_equal(cli_run("list", "strategies", NULL), 0);
    cli_has(cli_out, "multi_worker_mirrored");
    cli_has(cli_out, "parameter_server");
    assert_int_equal(cli_run("list", "algorithms", NULL), 0);
    cli_has(cli_out, "ring");
    cli_has(cli_out, "reduce_to_one");
    assert_int_equal(cli_run("list", "faults", NULL), 0);
    cli_has(cli_out, "partition");
    cli_has(cli_out, "preempt");
    assert_int_equal(cli_run("list", "faults", "--json", NULL), 0);
    j = json_loads(cli_out, 0, &je);
    assert_non_null(j);
    assert_int_equal(json_array_size(j), 12);
    json_decref(j);
}

/* Waits (at most 20 s, then SIGKILL, so that a hang fails rather than
 * blocks) for pid to exit; its exit status, its output read. */
static int cli_exit_within(pid_t pid)
{
    int st = 0;
    pid_t got = 0;
    for (int i = 0; i < 400 && got == 0; i++) {
        got = waitpid(pid, &st, WNOHANG);
        if (got == 0) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail_msg("dsim run did not exit within 20 s of the signal");
    }
    char out[512], err[512];
    cli_path(out, sizeof out, "stdout.txt");
    cli_path(err, sizeof err, "stderr.txt");
    free(cli_out);
    free(cli_err);
    cli_out = cli_slurp(out);
    cli_err = cli_slurp(err);
    if (!WIFEXITED(st))
        fail_msg("dsim died of signal %d; stderr: %s", WTERMSIG(st), cli_err);
    return WEXITSTATUS(st);
}

/* SIGINT in the middle of a long run: exit 130, the run row unfinished,
 * the steps committed before it kept. */
static void test_run_interrupted(void **state)
{
    (void)state;
    cli_write("long.yaml",
              "name: long\n"
              "cluster: {hosts: 2, devices_per_host: 1}\n"
              "strategy: {name: multi_worker_mirrored}\n"
              "model: {kind: softmax}\n"
              "data: {examples: 4096, features: 4, classes: 3, files: 2, global_batch: 8, "
              "epochs: 1000}\n"
              "expect:\n  shard_coverage: {}\n");
    char db[512], file[512];
    cli_path(db, sizeof db, "long.db");
    cli_path(file, sizeof file, "long.yaml");
    char *args[] = {(char *)cli_dsim, "run", file, "--db", db, NULL};
    pid_t pid = cli_spawn(args);
    /* wait until steps are being stored */
    bool going = false;
    for (int i = 0; i < 600 && !going; i++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        sqlite3 *h = NULL;
        if (access(db, F_OK) == 0 &&
            sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
            sqlite3_stmt *q = NULL;
            if (sqlite3_prepare_v2(h, "SELECT count(*) FROM steps", -1, &q, NULL) == SQLITE_OK &&
                sqlite3_step(q) == SQLITE_ROW && sqlite3_column_int64(q, 0) > 0)
                going = true;
            sqlite3_finalize(q);
        }
        sqlite3_close(h);
    }
    if (!going) {
        kill(pid, SIGKILL);
        cli_collect(pid);
        fail_msg("the long run stored no step within 30 s");
    }
    assert_int_equal(kill(pid, SIGINT), 0);
    assert_int_equal(cli_exit_within(pid), 130);
    cli_has(cli_err, "dsim run: interrupted (SIGINT); run 1 stored as unfinished in");
    char *status = cli_sql_text(db, "SELECT status FROM runs WHERE id = 1");
    assert_string_equal(status, "unfinished");
    free(status);
    assert_true(cli_sql_int(db, "SELECT count(*) FROM steps WHERE run_id = 1") > 0);
}

/* A signal after "run N stored" (DSIM_RUN_AFTER_STORED_S holds dsim run
 * right there): exit 130 / 143, the run keeps the status it was stored
 * with, and the message does not claim to store it as unfinished. */
static void test_run_interrupted_after_stored(void **state)
{
    (void)state;
    static const int sigs[] = {SIGINT, SIGTERM};
    for (int k = 0; k < 2; k++) {
        char db[512], quick[512], out[512];
        snprintf(db, sizeof db, "%s/late-%d.db", cli_tmp, k);
        snprintf(quick, sizeof quick, "%s/quickstart.yaml", getenv("DSIM_SCENARIO_DIR"));
        cli_path(out, sizeof out, "stdout.txt");
        char *args[] = {(char *)cli_dsim, "run", quick, "--db", db, NULL};
        setenv("DSIM_RUN_AFTER_STORED_S", "60", 1);
        pid_t pid = cli_spawn(args);
        unsetenv("DSIM_RUN_AFTER_STORED_S");
        bool stored = false;
        for (int i = 0; i < 1200 && !stored; i++) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            char *o = cli_slurp(out);
            stored = strstr(o, "run 1 stored in") != NULL;
            free(o);
        }
        if (!stored) {
            kill(pid, SIGKILL);
            cli_collect(pid);
            fail_msg("no 'run 1 stored' line within 60 s: %s", cli_err);
        }
        assert_int_equal(kill(pid, sigs[k]), 0);
        assert_int_equal(cli_exit_within(pid), 128 + sigs[k]);
        cli_has(cli_err, k == 0 ? "dsim run: interrupted (SIGINT) after run 1 was stored; it "
                                  "stays passed, and no run was in progress"
                                : "dsim run: interrupted (SIGTERM) after run 1 was stored; it "
                                  "stays passed");
        if (strstr(cli_err, "unfinished"))
            fail_msg("the message claims a change: %s", cli_err);
        char *status = cli_sql_text(db, "SELECT status FROM runs WHERE id = 1");
        assert_string_equal(status, "passed");
        free(status);
    }
}

/* Every scenario file in the catalogue is run by the scenarios suite. */
static void test_catalogue_complete(void **state)
{
    (void)state;
    const char *dir = getenv("DSIM_SCENARIO_DIR");
    const char *list = getenv("DSIM_CATALOGUE");
    assert_non_null(dir);
    assert_non_null(list);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".yaml") != 0)
            continue;
        char want[300];
        snprintf(want, sizeof want, " %.*s ", (int)(len - 5), e->d_name);
        char padded[4096];
        snprintf(padded, sizeof padded, " %s ", list);
        if (!strstr(padded, want))
            fail_msg("scenarios/%s has no test: add it to tests/scenarios/meson.build", e->d_name);
        n++;
    }
    closedir(d);
    assert_true(n >= 12);
}

static int cli_setup(void **state)
{
    (void)state;
    snprintf(cli_tmp, sizeof cli_tmp, "%s/dsim-cli.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(cli_tmp) ? 0 : -1;
}

static int cli_teardown(void **state)
{
    (void)state;
    free(cli_out);
    free(cli_err);
    cli_out = cli_err = NULL;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cli_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !getenv("DSIM_SCENARIO_DIR")) {
        fprintf(stderr, "usage: DSIM_SCENARIO_DIR=DIR test_run_cli PATH/TO/dsim\n");
        return 77;
    }
    cli_dsim = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_run_passes_and_is_stored),
        cmocka_unit_test(test_run_check_fails),
        cmocka_unit_test(test_list_runs_matrix),
        cmocka_unit_test(test_run_bad_input),
        cmocka_unit_test(test_run_json),
        cmocka_unit_test(test_run_interrupted),
        cmocka_unit_test(test_run_interrupted_after_stored),
        cmocka_unit_test(test_catalogue_complete),
    };
    return cmocka_run_group_tests(tests, cli_setup, cli_teardown);
}
