/* The processes engine (DESIGN §2): one OS process per TF task.
 *
 * dsim_processes_train runs a job as one child process per worker (its
 * devices as threads inside it) and one per parameter server, forked from
 * the caller and joined by the tcp transport on loopback. The parent binds
 * every rank's listening socket before it forks (so no port is raced for)
 * and hands each child its own; each child runs dsim_train for its ranks
 * (dsim_train_cfg.local_first/local_count) and streams what it sees to the
 * parent over a pipe: every step of every replica (the caller's observer
 * sees them, in the parent, as under the threads engine), its fault events,
 * and at the end its part of the result. The parent merges the parts into
 * one dsim_train_result, as dsim_train fills it in one process.
 *
 * Faults are real: a kill is a SIGKILL of the worker's process at the
 * scheduled point (a kill of any rank takes its whole worker process, as a
 * machine that dies takes all its devices); a pause is a SIGSTOP, and a
 * SIGCONT when it ends; a crash of a child (a strategy that segfaults or
 * aborts) is a node loss like any other, reported with the signal. Link
 * faults act in each receiving process's transport filter.
 *
 * No child outlives the call: once one has failed, the others have the
 * detection bound plus a grace to end, then are killed and reported as
 * hung, with the phase and step of their last report; a job where nothing
 * is reported for long (no deadline and no health check, say) is stopped the
 * same way.
 *
 * Thread-safety: one call at a time per process (it forks). */
#ifndef DSIM_SIM_PROCESSES_H
#define DSIM_SIM_PROCESSES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/strategy.h"
#include "fault/fault.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsim_proc_attempt {
    const dsim_fault *faults; /* the scenario's fault list, or NULL */
    size_t n_faults;
    uint64_t seed;
    const bool *fault_done; /* [n_faults]: fired in an earlier attempt, or NULL */
    /* How long the others may take to end once one has failed, beyond the
     * detection bound (<= 0: 5 s). */
    int64_t grace_ns;
} dsim_proc_attempt;

typedef struct dsim_proc_outcome {
    dsim_fault_event *events; /* from every child, in the order received */
    size_t n_events;
    bool *fault_fired; /* [n_faults] */
    int lost_rank;     /* first rank lost for good, or -1 */
    int64_t t_loss;    /* CLOCK_MONOTONIC ns, or -1 */
    dsim_faults_stats stats;
    int hung;    /* children killed for not ending in time */
    int crashed; /* children that died of a signal nobody sent */
    char note[512];
} dsim_proc_outcome;

dsim_err dsim_processes_train(const dsim_train_cfg *cfg, const dsim_proc_attempt *a,
                              dsim_train_result *res, dsim_proc_outcome *out);
void dsim_proc_outcome_free(dsim_proc_outcome *o);

#ifdef __cplusplus
}
#endif
#endif
