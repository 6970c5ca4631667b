/* What `dsim report` and `dsim trace` render from the results store: one
 * self-contained HTML page (inline SVG plots, no scripts, no network) of one
 * or more runs side by side, and one run as Chrome trace-event JSON for
 * Perfetto or chrome://tracing.
 *
 * Both read the store through a read-only SQLite connection, after opening
 * it once through the store (sim/store) so that an older database is
 * migrated and runs whose process is gone read as 'unfinished'. Errors
 * (dsim_errmsg) name the database and the run and say what to do. */
#ifndef DSIM_REPORT_H
#define DSIM_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsim/err.h"

/* The trace keeps at most this many step slices per replica; a longer run
 * keeps every k-th step (k the smallest stride that fits) and says so in
 * the trace's metadata (otherData.sampling). */
#define DSIM_TRACE_MAX_STEPS_PER_REPLICA 5000
/* Flow arrows ("who waited for whom": from the last replica to enter a
 * collective to each call that was waiting for it) only for runs of at
 * most this many replicas and collective calls per replica. */
#define DSIM_TRACE_FLOW_MAX_REPLICAS 8
#define DSIM_TRACE_FLOW_MAX_CALLS    256
/* Arrows from a frame's send to its arrival: at most this many drawn. The
 * store holds frames of jobs of at most DSIM_TRACE_MSG_MAX_RANKS ranks, the
 * first DSIM_TRACE_MSG_PER_LINK of each link per attempt (the message log's
 * rule, sim/fault/msglog.h; the harness asserts they agree). */
#define DSIM_TRACE_MAX_MESSAGES  50000
#define DSIM_TRACE_MSG_MAX_RANKS 16
#define DSIM_TRACE_MSG_PER_LINK  256

/* Writes the HTML report of runs ids[0..n) of the database at db_path to
 * out_path (written whole, then renamed into place). n >= 1; with n > 1 the
 * runs are compared side by side. */
dsim_err dsim_report_html_write(const char *db_path, const int64_t *ids, size_t n,
                                const char *out_path);

/* Writes run id of the database at db_path as Chrome trace-event JSON to
 * out_path (written whole, then renamed into place). */
dsim_err dsim_report_trace_write(const char *db_path, int64_t id, const char *out_path);

/* The id of the newest run in the database at db_path (DSIM_ENOENT, with a
 * message, when it holds none). */
dsim_err dsim_report_last_run(const char *db_path, int64_t *out);

/* Parses a run id as the commands take it: a whole number >= 1, or "last"
 * (the newest run). `cmd` starts the error message ("dsim report"). */
dsim_err dsim_report_parse_run_id(const char *db_path, const char *arg, int64_t *out);

/* The same two into an open stream. */
dsim_err dsim_report_html(const char *db_path, const int64_t *ids, size_t n, FILE *out);
dsim_err dsim_report_trace(const char *db_path, int64_t id, FILE *out);

#endif
