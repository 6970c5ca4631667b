/* The formation-progress thread costs a run nothing: it sleeps until the
 * job has formed or training has ended, either of which wakes it at once,
 * or until its next report (about once a second). Counted, not timed
 * (dsim_harness_totals): a thread that slept in ticks would notice the end
 * of the job's forming or of the run only at its next tick, on its own
 * clock (forming_late), and the run would wait for that tick; its other
 * ticks would neither report nor end it (forming_idle).
 *
 *   - runs that form at once (the quickstart, on the threads and sim
 *     engines) start a thread each, whose only wake-up ends it;
 *   - a run whose workers start up to 2 s apart (faults/staggered_start)
 *     reports while it forms, and each of the thread's wake-ups is a report
 *     or its end; the reports are the progress callback's forming calls.
 *
 * DSIM_SCENARIO_DIR is the catalogue folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "harness/harness.h"

static dsim_scenario *tf_load(const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s.yaml", getenv("DSIM_SCENARIO_DIR"), name);
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(p, &s) != DSIM_OK)
        fail_msg("%s: %s", p, dsim_errmsg());
    return s;
}

typedef struct tf_seen {
    atomic_int forming, finished;
} tf_seen;

static void tf_progress(const dsim_harness_progress *p, void *user)
{
    tf_seen *s = user;
    if (p->forming)
        atomic_fetch_add(&s->forming, 1);
    if (p->finished)
        atomic_fetch_add(&s->finished, 1);
}

/* Runs `name` on `engine` with a progress callback; the thread's counters
 * of this run into *d. */
static void tf_run(const char *name, const char *engine, dsim_harness_stats *d, tf_seen *seen)
{
    dsim_scenario *s = tf_load(name);
    dsim_harness_opts o = {.size = sizeof o,
                           .engine_override = engine,
                           .progress = tf_progress,
                           .progress_user = seen,
                           .no_crash_guard = true};
    dsim_harness_stats before, after;
    dsim_harness_totals(&before);
    dsim_harness_result r;
    assert_int_equal(dsim_harness_run(s, &o, &r), DSIM_OK);
    if (r.status != DSIM_RUN_PASSED)
        fail_msg("%s on %s: %s %s", name, engine, dsim_run_status_name(r.status), r.train_msg);
    dsim_harness_result_free(&r);
    dsim_scenario_free(s);
    dsim_harness_totals(&after);
    d->forming_threads = after.forming_threads - before.forming_threads;
    d->forming_wakeups = after.forming_wakeups - before.forming_wakeups;
    d->forming_reports = after.forming_reports - before.forming_reports;
    d->forming_idle = after.forming_idle - before.forming_idle;
    d->forming_late = after.forming_late - before.forming_late;
}

static void test_formed_at_once(void **state)
{
    (void)state;
    static const char *engines[] = {"threads", "sim"};
    for (int k = 0; k < 3; k++) {
        for (size_t e = 0; e < sizeof engines / sizeof engines[0]; e++) {
            dsim_harness_stats d;
            tf_seen seen = {0};
            tf_run("quickstart", engines[e], &d, &seen);
            /* 2 hosts x 2 devices with a callback: one thread per run */
            assert_int_equal(d.forming_threads, 1);
            assert_int_equal(d.forming_late, 0);
            assert_int_equal(d.forming_idle, 0);
            /* it ended on its first wake-up (or never slept), or it
             * reported first (a machine slow enough to take a second) */
            assert_true(d.forming_wakeups <= d.forming_reports + 1);
            assert_int_equal(d.forming_reports, atomic_load(&seen.forming));
            assert_int_equal(atomic_load(&seen.finished), 1);
        }
    }
}

static void test_staggered(void **state)
{
    (void)state;
    dsim_harness_stats d;
    tf_seen seen = {0};
    tf_run("faults/staggered_start", "threads", &d, &seen);
    assert_int_equal(d.forming_threads, 1);
    assert_int_equal(d.forming_late, 0);
    assert_int_equal(d.forming_idle, 0);
    /* workers up to 2 s apart: at least one report while it formed */
    assert_true(d.forming_reports >= 1);
    assert_true(d.forming_wakeups <= d.forming_reports + 1);
    assert_int_equal(d.forming_reports, atomic_load(&seen.forming));
}

/* No thread where the engine forks, or for one replica. */
static void test_no_thread(void **state)
{
    (void)state;
    dsim_harness_stats d;
    tf_seen seen = {0};
    tf_run("quickstart", "processes", &d, &seen);
    assert_int_equal(d.forming_threads, 0);
    assert_int_equal(d.forming_wakeups, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formed_at_once),
        cmocka_unit_test(test_staggered),
        cmocka_unit_test(test_no_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
