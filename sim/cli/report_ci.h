/* `dsim run`'s reports for CI dashboards: JUnit XML (--junit FILE) and TAP
 * on standard output (--tap, for meson's `protocol: 'tap'`).
 *
 * Both say the same thing: one test per check per scenario, named
 * SCENARIO: CHECK (JUnit: classname dsim.SCENARIO, name CHECK), passed
 * when the check met the scenario's expectation (a check the scenario
 * expects to fail passes by failing), failed with the check's sentence
 * otherwise. A scenario without checks is one test named "run". A run that
 * could not be judged (the harness failed, the run was not carried out to
 * its end, the file could not be loaded) is a JUnit <error> (TAP: not ok)
 * named "run" or "load", with the reason.
 *
 * JUnit: the layout Ant's junit task writes and Jenkins, GitLab and the
 * GitHub actions read (<testsuites>, a <testsuite> per scenario with name,
 * tests, failures, errors, skipped, time, timestamp, hostname, id, package,
 * <properties>, <testcase name classname time> with <failure message type>
 * or <error message type> or <skipped message>, <system-out>, <system-err>);
 * sim/cli/junit.xsd
 * is that schema, and the tests validate the output against it. The file is
 * written when dsim run ends (to FILE.tmp, then renamed), whatever the exit
 * status, unless the run is interrupted.
 *
 * TAP (version 13): with --tap, standard output carries only TAP: the
 * table, progress and summary go to standard error. A line per test as it
 * is judged, the check's sentence as a "# " comment under it, and the plan
 * (1..N) last.
 *
 * Not thread-safe: dsim run calls it from its main thread. */
#ifndef DSIM_CLI_REPORT_CI_H
#define DSIM_CLI_REPORT_CI_H

#include <stdbool.h>

#include "harness/harness.h"
#include "scenario/scenario.h"

typedef struct dsim_ci_report dsim_ci_report;

/* Starts the reports: junit_path (NULL: none), tap (moves standard output
 * aside for TAP and points file descriptor 1 at standard error). *out is
 * NULL when neither is asked for; every other call accepts NULL. `cmd`
 * starts the messages ("dsim run"). Returns 0, or 2 after a message on
 * stderr (the JUnit file's folder is missing or not writable: said before
 * anything runs). */
int dsim_ci_open(const char *cmd, const char *junit_path, bool tap, dsim_ci_report **out);

/* A scenario file that could not be loaded or prepared: msg says why. */
void dsim_ci_load_failed(dsim_ci_report *r, const char *file, const char *msg);

/* A test that was not run because it does not apply (dsim conformance: a
 * case the strategy cannot take): a testsuite `name` with one testcase
 * "run" that is <skipped> with the reason (TAP: ok # SKIP). */
void dsim_ci_skipped(dsim_ci_report *r, const char *name, const char *reason);

/* A scenario that was run (whatever came of it). */
void dsim_ci_run(dsim_ci_report *r, const char *file, const dsim_scenario *s,
                 const dsim_harness_result *rep);

/* Ends the TAP stream with its plan and writes the JUnit file; frees r.
 * Returns 0, or 2 after a message on stderr when the JUnit file could not
 * be written. */
int dsim_ci_close(dsim_ci_report *r);

#endif
