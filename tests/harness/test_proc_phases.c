/* The processes engine's children tell their parent each replica's phases
 * (for the collectives and events the store keeps), and a step's phases
 * go with the replica's other records: a record of their own was a pipe
 * write in the middle of the replica's timed step, and woke the parent
 * there. With 4 replicas on a 2-CPU host that made one replica's compute
 * look 4x the others' in most runs, and the performance check named it a
 * straggler. Counted, not timed (dsim_proc_totals): every step phase
 * reaches the parent, and no phase record travels alone but for the
 * phases outside a step (start, rendezvous, checkpoint, finish, ...) and
 * a full buffer. The store's collectives are checked against the steps.
 *
 * DSIM_SCENARIO_DIR is the catalogue folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cmocka.h>
#include <sqlite3.h>

#include "engine/processes.h"
#include "harness/harness.h"

static void test_phases_go_with_records(void **state)
{
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/quickstart.yaml", getenv("DSIM_SCENARIO_DIR"));
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(p, &s) != DSIM_OK)
        fail_msg("%s: %s", p, dsim_errmsg());
    char dir[] = "/tmp/dsim-proc-phases-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char db[600];
    snprintf(db, sizeof db, "%s/r.db", dir);
    dsim_harness_opts o = {
        .size = sizeof o, .db_path = db, .engine_override = "processes", .no_crash_guard = true};
    dsim_proc_stats a, b;
    dsim_proc_totals(&a);
    dsim_harness_result r;
    assert_int_equal(dsim_harness_run(s, &o, &r), DSIM_OK);
    if (r.status != DSIM_RUN_PASSED)
        fail_msg("quickstart on processes: %s %s", dsim_run_status_name(r.status), r.train_msg);
    dsim_run_id run = r.run_id;
    dsim_harness_result_free(&r);
    dsim_scenario_free(s);
    dsim_proc_totals(&b);
    uint64_t records = b.records - a.records, phase_records = b.phase_records - a.phase_records,
             entries = b.phase_entries - a.phase_entries,
             step_entries = b.step_phase_entries - a.step_phase_entries;
    /* 48 steps of 4 replicas, 3 phases each */
    const uint64_t steps = 48, replicas = 4;
    assert_int_equal(step_entries, 3 * steps * replicas);
    /* Each phase record went with a record of another kind (written just
     * before it, in the same hold of the pipe), but for the phases outside
     * a step, sent at once, and a buffer that filled: no more phase
     * records than that. Sent alone, a step's phases alone (3 per step of
     * each replica) outnumber the steps' and reads' records (2). */
    uint64_t others = records - phase_records, alone = entries - step_entries;
    if (phase_records > others + alone + step_entries / 64)
        fail_msg("%llu phase records (%llu entries, %llu of a step's) against %llu records "
                 "of other kinds",
                 (unsigned long long)phase_records, (unsigned long long)entries,
                 (unsigned long long)step_entries, (unsigned long long)others);
    /* and the store has each replica's all-reduce and loss reduction of
     * every step, as the threads engine stores them */
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(h,
                                        "SELECT count(*), sum(status != 0) FROM collectives "
                                        "WHERE run_id = ?",
                                        -1, &q, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(q, 1, (sqlite3_int64)run);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(q, 0), (sqlite3_int64)(2 * steps * replicas));
    assert_int_equal(sqlite3_column_int64(q, 1), 0);
    sqlite3_finalize(q);
    sqlite3_close(h);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phases_go_with_records),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
