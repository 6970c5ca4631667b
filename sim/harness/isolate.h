/* A scenario run in a child process of its own (dsim explore, dsim
 * conformance): a run that crashes the process, calls exit() or outlives its
 * wall-clock bound ends only that run, never the search or the battery that
 * made it.
 *
 * dsim_isolated_run forks; the child runs the text through
 * dsim_harness_run_text with the given options (no crash guard: the parent
 * is the guard), writes what came of it into a pipe and ends with _exit.
 * The parent reads it back into out->r, a dsim_harness_result as the
 * child's run filled it (status, messages, the checks' outcomes, figures,
 * the timeline), or, when the child handed nothing back, says how it ended:
 * killed at the bound (timed_out; out->r.status is then 'hung') or by a
 * signal, or an exit status (out->r.status 'crashed'), in out->why and
 * out->r.train_msg. The
 * stuck workers of a hung run are not handed back (out->r.n_stuck is 0);
 * its train_msg names them.
 *
 * The child's standard output and error go to /dev/null: a run's own
 * messages would interleave with the caller's progress. Call it from a
 * thread that may fork (no other thread of the caller holding a lock the
 * child needs: dsim's commands call it from their main thread). */
#ifndef DSIM_SIM_HARNESS_ISOLATE_H
#define DSIM_SIM_HARNESS_ISOLATE_H

#include <stdbool.h>

#include "harness.h"

typedef struct dsim_isolated {
    dsim_harness_result r; /* what the child's run came to (see above) */
    dsim_err err;          /* what dsim_harness_run_text returned there */
    bool ended;            /* the child handed its result back */
    bool timed_out;        /* the child was killed at the bound */
    int term_signal;       /* the signal that ended the child, or 0 */
    int exit_status;       /* its exit status otherwise (-1: unknown) */
    char why[256];         /* a sentence when !ended: how the child ended */
} dsim_isolated;

/* Runs `text` (named `path` in messages and anchoring a relative plugin) in
 * a child, bounded by timeout_s seconds of wall time, in directory `cwd`
 * (NULL: the caller's). ho may be NULL; its store, progress and crash
 * guard are ignored. Fills *out (free with dsim_isolated_free); returns
 * DSIM_OK when a child was run, whatever came of it, or the error of pipe
 * or fork with a message. */
dsim_err dsim_isolated_run(const char *path, const char *text, const dsim_harness_opts *ho,
                           double timeout_s, const char *cwd, dsim_isolated *out);

void dsim_isolated_free(dsim_isolated *o);

/* How a run failed, in a word: the name of its first check that did not
 * meet its expectation, or hung / crashed / timeout / error / failed; ""
 * when it passed. msg gets that check's or the run's sentence. */
void dsim_isolated_signature(const dsim_isolated *o, char *sig, size_t sig_cap, char *msg,
                             size_t msg_cap);

#endif
