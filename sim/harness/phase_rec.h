/* The phase recorder: when each replica entered each phase of the driver
 * (dsim_train_hooks.phase), kept in memory during a run and stored after
 * it, so that reports see the collectives' times, the cold-start phases and
 * the checkpoint writes.
 *
 * Stored (sim/store/SCHEMA.md):
 *   collectives  a row per replica for its "allreduce" phase
 *                (apply_gradients: the gradients' reduction and the update)
 *                and its "reduce_loss" phase of each step kept, from the
 *                phase's entry to the next phase's; bytes: the gradients';
 *                status DSIM_EABORTED when the step did not go on
 *   events       'phase' per replica for start, rendezvous, restore,
 *                create_variables and finish; 'checkpoint' for each of the
 *                chief's (replica 0's) checkpoint phases, where it writes;
 *                detail JSON {phase, global_step, dur_ns}
 *
 * Bounded: a run of more than DSIM_PHASE_REC_STEPS steps keeps the step
 * phases of every k-th step (the metric collective_sampling is k), and at
 * most DSIM_PHASE_REC_CAP entries in all (the metric
 * phase_entries_dropped counts the rest). Only where the steps' clock is
 * CLOCK_MONOTONIC: the threads engine, where the hooks run in this process,
 * and the processes engine, whose children time each entry and send it to
 * the parent (h_phase_rec_note, dsim_proc_attempt.on_phase). */
#ifndef DSIM_HARNESS_PHASE_REC_H
#define DSIM_HARNESS_PHASE_REC_H

#include <stdint.h>

#include "dsim/strategy.h"
#include "store.h"

#define DSIM_PHASE_REC_STEPS 1024
#define DSIM_PHASE_REC_CAP   (1 << 18)

typedef struct h_phase_rec h_phase_rec;

/* NULL when out of memory (the run goes on unrecorded). total_steps 0:
 * unknown (every step kept, up to the cap). */
h_phase_rec *h_phase_rec_create(int replicas, uint64_t total_steps);
/* Puts the recorder's hooks into cfg (none must be there yet). */
void h_phase_rec_attach(h_phase_rec *pr, dsim_train_cfg *cfg);
/* An entry timed elsewhere (user: the recorder; t_ns on CLOCK_MONOTONIC):
 * a replica of a child process entered phase (a dsim_phase) at global
 * step gs. Entries of one replica must come in order. */
void h_phase_rec_note(void *user, int replica, int phase, uint64_t gs, int64_t t_ns);
/* Stores what was recorded for run `run` (algorithm: the all-reduce's
 * name or NULL; grad_bytes: the gradients' size). */
dsim_err h_phase_rec_store(const h_phase_rec *pr, dsim_store *st, dsim_run_id run,
                           const char *algorithm, uint64_t grad_bytes);
void h_phase_rec_destroy(h_phase_rec *pr);

#endif
