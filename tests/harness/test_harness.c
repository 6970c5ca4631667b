/* The harness as a library call: a catalogue scenario run through
 * dsim_harness_run without a store, with a store opened from a path, and on
 * a store the caller holds; a scenario given as text; overrides, progress,
 * a failing check, and bad input.
 *
 * DSIM_SCENARIO_DIR is the catalogue folder. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <sqlite3.h>

#include "harness/harness.h"

static char ht_tmp[256];

static void ht_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", ht_tmp, name);
}

static dsim_scenario *ht_load(const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s.yaml", getenv("DSIM_SCENARIO_DIR"), name);
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(p, &s) != DSIM_OK)
        fail_msg("%s: %s", p, dsim_errmsg());
    return s;
}

static long long ht_sql_int(const char *db, const char *sql)
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

static void ht_sql_text(const char *db, const char *sql, char *buf, size_t cap)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(h));
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    const unsigned char *t = sqlite3_column_text(q, 0);
    snprintf(buf, cap, "%s", t ? (const char *)t : "");
    sqlite3_finalize(q);
    sqlite3_close(h);
}

static void ht_all_passed(const dsim_harness_result *r, size_t n)
{
    assert_int_equal(r->n_checks, n);
    assert_int_equal(r->n_failed, 0);
    for (size_t i = 0; i < r->n_checks; i++) {
        if (!r->checks[i].passed)
            fail_msg("%s: %s", r->checks[i].name, r->checks[i].result.message);
        assert_true(r->checks[i].result.message[0] != '\0');
    }
}

/* Counts the progress calls; checks they are in order. */
typedef struct ht_prog {
    atomic_int calls, finished, bad;
    _Atomic uint64_t last_step, total;
} ht_prog;

static void ht_progress(const dsim_harness_progress *p, void *user)
{
    ht_prog *h = user;
    if (p->finished) {
        atomic_fetch_add(&h->finished, 1);
        return;
    }
    atomic_fetch_add(&h->calls, 1);
    if (p->step == 0 || (p->total && p->step > p->total) || p->elapsed_s < 0)
        atomic_fetch_add(&h->bad, 1);
    atomic_store(&h->last_step, p->step);
    atomic_store(&h->total, p->total);
}

static void test_without_store(void **state)
{
    (void)state;
    dsim_scenario *s = ht_load("quickstart");
    ht_prog prog;
    memset(&prog, 0, sizeof prog);
    dsim_harness_opts o = {.size = sizeof o, .progress = ht_progress, .progress_user = &prog};
    dsim_harness_result r;
    assert_int_equal(dsim_harness_run(s, &o, &r), DSIM_OK);
    assert_int_equal(r.run_id, 0);
    assert_int_equal(r.status, DSIM_RUN_PASSED);
    assert_int_equal(r.train_err, DSIM_OK);
    assert_false(r.harness_error);
    ht_all_passed(&r, 3);
    assert_string_equal(r.checks[0].name, "gradient_consistency");
    assert_string_equal(r.checks[1].name, "shard_coverage");
    assert_string_equal(r.checks[2].name, "convergence");
    assert_int_equal(r.steps, 48);
    /* every replica reads every example once per epoch: 3 x 512 */
    assert_int_equal(r.examples, 3 * 512);
    assert_true(r.final_loss < 0.6);
    assert_true(r.wall_s > 0);
    /* one progress call per step of replica 0, then the finishing one */
    assert_int_equal(atomic_load(&prog.calls), 48);
    assert_int_equal(atomic_load(&prog.finished), 1);
    assert_int_equal(atomic_load(&prog.bad), 0);
    assert_int_equal(atomic_load(&prog.total), 48);
    dsim_harness_result_free(&r);

    /* NULL opts: the same, quietly */
    assert_int_equal(dsim_harness_run(s, NULL, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_PASSED);
    ht_all_passed(&r, 3);
    dsim_harness_result_free(&r);
    dsim_scenario_free(s);
}

static void test_with_store(void **state)
{
    (void)state;
    char db[512], status[64];
    ht_path(db, sizeof db, "h.db");
    dsim_scenario *s = ht_load("mirrored");
    /* a store opened from a path and closed by the call */
    dsim_harness_opts o = {.size = sizeof o, .db_path = db, .has_seed = true, .seed = 77};
    dsim_harness_result r;
    assert_int_equal(dsim_harness_run(s, &o, &r), DSIM_OK);
    assert_int_equal(r.run_id, 1);
    assert_int_equal(r.status, DSIM_RUN_PASSED);
    size_t nchecks = r.n_checks;
    assert_true(nchecks >= 1);
    ht_all_passed(&r, nchecks);
    ht_sql_text(db, "SELECT status FROM runs WHERE id = 1", status, sizeof status);
    assert_string_equal(status, "passed");
    /* the override is what was run and stored; the scenario is unchanged */
    assert_int_equal(ht_sql_int(db, "SELECT seed FROM runs WHERE id = 1"), 77);
    assert_int_not_equal(s->seed, 77);
    assert_int_equal(ht_sql_int(db, "SELECT count(*) FROM checks WHERE run_id = 1 AND passed"),
                     (long long)nchecks);
    assert_int_equal(ht_sql_int(db, "SELECT count(DISTINCT step) FROM steps WHERE run_id = 1"),
                     (long long)r.steps);
    assert_int_equal(ht_sql_int(db, "SELECT value FROM metrics WHERE run_id = 1 AND "
                                    "name = 'steps'"),
                     (long long)r.steps);
    dsim_harness_result_free(&r);

    /* a store the caller holds: two runs on it, ids in order */
    dsim_store *st = NULL;
    assert_int_equal(dsim_store_open(db, &st), DSIM_OK);
    dsim_harness_opts o2 = {.size = sizeof o2, .store = st};
    assert_int_equal(dsim_harness_run(s, &o2, &r), DSIM_OK);
    assert_int_equal(r.run_id, 2);
    dsim_harness_result_free(&r);
    dsim_scenario *q = ht_load("quickstart");
    assert_int_equal(dsim_harness_run(q, &o2, &r), DSIM_OK);
    assert_int_equal(r.run_id, 3);
    assert_int_equal(r.status, DSIM_RUN_PASSED);
    dsim_harness_result_free(&r);
    assert_int_equal(dsim_store_close(st), DSIM_OK);
    ht_sql_text(db, "SELECT scenario FROM runs WHERE id = 3", status, sizeof status);
    assert_string_equal(status, "quickstart");
    assert_int_equal(ht_sql_int(db, "SELECT count(*) FROM runs WHERE status = 'passed'"), 3);
    dsim_scenario_free(q);
    dsim_scenario_free(s);
}

#define HT_SMALL                                                                                   \
    "cluster: {hosts: 2, devices_per_host: 2}\n"                                                   \
    "strategy: {name: multi_worker_mirrored}\n"                                                    \
    "model: {kind: softmax}\n"                                                                     \
    "optimizer: {kind: sgd, learning_rate: 0.5}\n"                                                 \
    "data: {examples: 128, features: 4, classes: 3, files: 4, global_batch: 16, epochs: 1}\n"

/* The outcome named name, or fail. */
static const dsim_check_outcome *ht_outcome(const dsim_harness_result *r, const char *name)
{
    for (size_t i = 0; i < r->n_checks; i++)
        if (strcmp(r->checks[i].name, name) == 0)
            return &r->checks[i];
    fail_msg("no outcome named %s", name);
    return NULL;
}

/* Safety then liveness: the healed job must reach the step in time; one
 * that cannot is a liveness failure, and a step past the job's end is
 * named as such. Under sim the times are virtual, so the verdicts are
 * exact. */
static void test_liveness(void **state)
{
    (void)state;
    dsim_harness_opts sim = {.size = sizeof sim, .engine_override = "sim"};
    dsim_harness_result r;
    const char *ok = "name: live\n" HT_SMALL "liveness: {reach_step: 8, within: 10s}\n";
    assert_int_equal(dsim_harness_run_text("live.yaml", ok, strlen(ok), &sim, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_PASSED);
    const dsim_check_outcome *c = ht_outcome(&r, "liveness");
    assert_true(c->passed);
    assert_true(c->result.measured > 0 && c->result.measured < 10);
    assert_non_null(strstr(c->result.message, "reached step 8"));
    uint64_t h = r.trace_hash;
    dsim_harness_result_free(&r);

    const char *slow = "name: live\n" HT_SMALL "liveness: {reach_step: 8, within: 1ns}\n";
    assert_int_equal(dsim_harness_run_text("live.yaml", slow, strlen(slow), &sim, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_FAILED);
    c = ht_outcome(&r, "liveness");
    assert_false(c->passed);
    assert_non_null(strstr(c->result.message, "LIVENESS FAILURE"));
    assert_non_null(strstr(c->result.message, "over the 1e-09 s allowed"));
    assert_true(r.trace_hash == h); /* the same events, another verdict */
    dsim_harness_result_free(&r);

    const char *far = "name: live\n" HT_SMALL "liveness: {reach_step: 99, within: 10s}\n";
    assert_int_equal(dsim_harness_run_text("live.yaml", far, strlen(far), &sim, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_FAILED);
    c = ht_outcome(&r, "liveness");
    assert_false(c->passed);
    assert_non_null(strstr(c->result.message, "beyond the job's last step 8"));
    dsim_harness_result_free(&r);
}

static void test_text_and_failures(void **state)
{
    (void)state;
    char db[512], status[64];
    ht_path(db, sizeof db, "t.db");
    dsim_harness_opts o = {.size = sizeof o, .db_path = db};
    dsim_harness_result r;

    const char *fail = "name: too_ambitious\n" HT_SMALL
                       "expect:\n  shard_coverage: {}\n  convergence: {max_final_loss: 1e-6}\n";
    assert_int_equal(dsim_harness_run_text("fail.yaml", fail, strlen(fail), &o, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_FAILED);
    assert_int_equal(r.n_checks, 3); /* and gradient_consistency, by default */
    assert_int_equal(r.n_failed, 1);
    assert_true(r.checks[0].passed);
    assert_false(r.checks[1].passed);
    assert_string_equal(r.checks[2].name, "gradient_consistency");
    assert_true(r.checks[2].by_default && r.checks[2].passed);
    assert_false(r.checks[0].by_default || r.checks[1].by_default);
    assert_non_null(strstr(r.checks[1].result.message, "ABOVE max_final_loss"));
    ht_sql_text(db, "SELECT status FROM runs WHERE id = 1", status, sizeof status);
    assert_string_equal(status, "failed");
    dsim_harness_result_free(&r);

    /* a run that fails (FILE sharding, one file for two workers) */
    const char *err = "name: refused\ncluster: {hosts: 2, devices_per_host: 1}\n"
                      "data: {examples: 64, files: 1, shard_policy: file}\n"
                      "expect:\n  error: \"fewer\"\n";
    assert_int_equal(dsim_harness_run_text("err.yaml", err, strlen(err), &o, &r), DSIM_OK);
    assert_int_not_equal(r.train_err, DSIM_OK);
    assert_true(r.train_msg[0] != '\0');
    assert_int_equal(r.status, DSIM_RUN_PASSED);
    assert_int_equal(ht_sql_int(db, "SELECT count(*) FROM events WHERE run_id = 2 AND "
                                    "kind = 'error'"),
                     1);
    dsim_harness_result_free(&r);

    /* text that does not parse: nothing runs, the message has file:line */
    const char *bad = "name: broken\ncluster: {hosts: 2\n";
    assert_int_equal(dsim_harness_run_text("broken.yaml", bad, strlen(bad), &o, &r), DSIM_EINVAL);
    assert_true(r.harness_error);
    assert_non_null(strstr(r.harness_msg, "broken.yaml:"));
    dsim_harness_result_free(&r);
    assert_int_equal(ht_sql_int(db, "SELECT count(*) FROM runs"), 2);

    /* an engine this build does not run, and a wrong opts.size */
    const char *good = "name: good\n" HT_SMALL "expect:\n  shard_coverage: {}\n";
    dsim_harness_opts warp = {.size = sizeof warp, .engine_override = "warp"};
    assert_int_equal(dsim_harness_run_text("good.yaml", good, strlen(good), &warp, &r),
                     DSIM_ENOTSUP);
    assert_non_null(strstr(r.harness_msg, "not supported"));
    dsim_harness_result_free(&r);
    /* the sim engine runs it, deterministically: the same hash twice,
     * another with another seed */
    dsim_harness_opts sim = {.size = sizeof sim, .engine_override = "sim"};
    assert_int_equal(dsim_harness_run_text("good.yaml", good, strlen(good), &sim, &r), DSIM_OK);
    assert_int_equal(r.status, DSIM_RUN_PASSED);
    assert_true(r.deterministic);
    assert_true(r.trace_events > 0);
    uint64_t h1 = r.trace_hash;
    dsim_harness_result_free(&r);
    assert_int_equal(dsim_harness_run_text("good.yaml", good, strlen(good), &sim, &r), DSIM_OK);
    assert_true(r.trace_hash == h1);
    dsim_harness_result_free(&r);
    sim.has_seed = true;
    sim.seed = 12345;
    assert_int_equal(dsim_harness_run_text("good.yaml", good, strlen(good), &sim, &r), DSIM_OK);
    assert_true(r.trace_hash != h1);
    dsim_harness_result_free(&r);
    dsim_harness_opts wrong = {.size = 8};
    assert_int_equal(dsim_harness_run_text("good.yaml", good, strlen(good), &wrong, &r),
                     DSIM_EINVAL);
    assert_non_null(strstr(r.harness_msg, "opts.size"));
    dsim_harness_result_free(&r);

    /* prepare applies the overrides in place */
    dsim_scenario *s = NULL;
    assert_int_equal(dsim_scenario_parse("good.yaml", good, strlen(good), &s), DSIM_OK);
    dsim_harness_opts seed = {.size = sizeof seed, .has_seed = true, .seed = 9};
    assert_int_equal(dsim_harness_prepare(s, &seed), DSIM_OK);
    assert_int_equal(s->seed, 9);
    assert_int_equal(s->train.seed, 9);
    assert_int_equal(dsim_harness_prepare(s, &warp), DSIM_ENOTSUP);
    assert_int_equal(dsim_harness_prepare(s, &sim), DSIM_OK);
    assert_string_equal(s->train.engine, "sim");
    assert_int_equal(s->seed, 12345);
    dsim_scenario_free(s);
}

/* The harness's and the scenario's calls misused: DSIM_EINVAL naming the
 * call (in the result's harness_msg where there is a result), never a
 * crash; a results store that cannot be opened is a harness error. */
static void test_misuse(void **state)
{
    (void)state;
    dsim_harness_result r;
    const char *good = "name: good\n" HT_SMALL "expect:\n  shard_coverage: {}\n";
    dsim_scenario *s = NULL;
    assert_int_equal(dsim_scenario_parse("good.yaml", good, strlen(good), &s), DSIM_OK);
    assert_int_equal(dsim_harness_run(NULL, NULL, &r), DSIM_EINVAL);
    assert_true(r.harness_error);
    assert_non_null(strstr(r.harness_msg, "dsim_harness_run: the scenario is NULL"));
    dsim_harness_result_free(&r);
    assert_int_equal(dsim_harness_run(s, NULL, NULL), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "dsim_harness_run: out is NULL"));
    assert_int_equal(dsim_harness_run_text("x.yaml", NULL, 0, NULL, &r), DSIM_EINVAL);
    assert_non_null(strstr(r.harness_msg, "dsim_harness_run_text: text is NULL"));
    dsim_harness_result_free(&r);
    assert_int_equal(dsim_harness_run_text("x.yaml", good, strlen(good), NULL, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_harness_prepare(NULL, NULL), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "dsim_harness_prepare: the scenario is NULL"));
    dsim_harness_replay_info info;
    assert_int_equal(dsim_harness_replay("x.db", 1, NULL, NULL, &info), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "dsim_harness_replay: out and info are needed"));
    /* a store in a folder that is not there: the run is not made */
    char db[600];
    ht_path(db, sizeof db, "no/such/folder/x.db");
    dsim_harness_opts o = {.size = sizeof o, .db_path = db};
    assert_int_not_equal(dsim_harness_run(s, &o, &r), DSIM_OK);
    assert_true(r.harness_error);
    assert_non_null(strstr(r.harness_msg, "no/such/folder/x.db"));
    assert_int_equal(r.run_id, 0);
    dsim_harness_result_free(&r);
    /* no such run to replay */
    ht_path(db, sizeof db, "replay.db");
    dsim_harness_opts ro = {.size = sizeof ro, .db_path = db};
    assert_int_equal(dsim_harness_run(s, &ro, &r), DSIM_OK);
    dsim_harness_result_free(&r);
    assert_int_equal(dsim_harness_replay(db, 42, NULL, &r, &info), DSIM_ENOENT);
    assert_non_null(strstr(dsim_errmsg(), "42"));
    dsim_harness_result_free(&r);
    /* the scenario's own calls */
    dsim_scenario *one = NULL;
    assert_int_equal(dsim_scenario_combination(NULL, 0, &one), DSIM_EINVAL);
    assert_int_equal(dsim_scenario_combination(s, 1, &one), DSIM_EINVAL);
    assert_int_equal(dsim_scenario_parse("x.yaml", good, strlen(good), NULL), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "dsim_scenario_parse: out is NULL"));
    assert_int_equal(dsim_scenario_parse("x.yaml", NULL, 3, &one), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "the text is NULL"));
    assert_int_equal(dsim_scenario_load(NULL, &one), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "dsim_scenario_load: no file given"));
    assert_int_equal(dsim_scenario_load("x.yaml", NULL), DSIM_EINVAL);
    dsim_scenario_free(s);
}

static int ht_setup(void **state)
{
    (void)state;
    snprintf(ht_tmp, sizeof ht_tmp, "%s/dsim-harness.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(ht_tmp) ? 0 : -1;
}

static int ht_teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ht_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* The one-device reference replayed beside the job (the default on the sim
 * engine, where the machine has a second CPU) and after it give the same
 * reference: the same checks, measured to the bit, the same reference
 * losses stored; the threads engine never replays beside its job. */
static void test_reference_beside(void **state)
{
    (void)state;
    const char *text =
        "name: beside\nengine: sim\n" HT_SMALL "expect:\n  gradient_consistency: {}\n"
        "  convergence: {within_pct_of_reference: 5}\n";
    char db[2][512];
    dsim_harness_result r[2];
    for (int k = 0; k < 2; k++) {
        ht_path(db[k], sizeof db[k], k ? "after.db" : "beside.db");
        dsim_harness_opts o = {.size = sizeof o, .db_path = db[k], .reference_after = k == 1};
        assert_int_equal(dsim_harness_run_text("beside.yaml", text, strlen(text), &o, &r[k]),
                         DSIM_OK);
        ht_all_passed(&r[k], 3); /* and shard_coverage, by default */
    }
    assert_int_equal(r[0].reference_beside, sysconf(_SC_NPROCESSORS_ONLN) >= 2);
    assert_false(r[1].reference_beside);
    for (size_t i = 0; i < r[0].n_checks; i++) {
        const dsim_check_outcome *a = &r[0].checks[i], *b = &r[1].checks[i];
        assert_string_equal(a->name, b->name);
        assert_memory_equal(&a->result.measured, &b->result.measured, sizeof(double));
        assert_string_equal(a->result.message, b->result.message);
    }
    assert_true(r[0].trace_hash == r[1].trace_hash);
    char la[4096], lb[4096];
    const char *q = "SELECT group_concat(printf('%.17g', loss), ' ') FROM "
                    "(SELECT loss FROM reference_steps ORDER BY step)";
    ht_sql_text(db[0], q, la, sizeof la);
    ht_sql_text(db[1], q, lb, sizeof lb);
    assert_true(strlen(la) > 20); /* 8 steps' losses */
    assert_string_equal(la, lb);
    dsim_harness_result_free(&r[0]);
    dsim_harness_result_free(&r[1]);

    /* threads: after the job, always */
    dsim_harness_opts th = {.size = sizeof th, .engine_override = "threads"};
    dsim_harness_result t;
    assert_int_equal(dsim_harness_run_text("beside.yaml", text, strlen(text), &th, &t), DSIM_OK);
    ht_all_passed(&t, 3);
    assert_false(t.reference_beside);
    dsim_harness_result_free(&t);
}

int main(void)
{
    if (!getenv("DSIM_SCENARIO_DIR")) {
        fprintf(stderr, "usage: DSIM_SCENARIO_DIR=DIR test_harness\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_without_store),     cmocka_unit_test(test_with_store),
        cmocka_unit_test(test_text_and_failures), cmocka_unit_test(test_liveness),
        cmocka_unit_test(test_reference_beside),  cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, ht_setup, ht_teardown);
}
