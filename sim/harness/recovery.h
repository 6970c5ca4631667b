/* A job under faults, with BackupAndRestore recovery (ARCHITECTURE.md §7), on any
 * engine (sim/engine/engine.h): the part of a run that the harness repeats
 * when the job fails and may restart. */
#ifndef DSIM_SIM_RECOVERY_H
#define DSIM_SIM_RECOVERY_H

#include <stdbool.h>
#include <stdio.h>

#include "dsim/strategy.h"
#include "fault/fault.h"

struct dsim_proc_hosts;
struct dsim_engine_ops;

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsim_recovery_opts {
    const dsim_fault *faults; /* the fault list (n_faults entries) */
    size_t n_faults;
    uint64_t seed;
    bool restart;     /* recovery: restart */
    int max_restarts; /* at most this many restarts */
    bool want_clean;  /* also run the job without faults (for node_loss) */
    /* The engine that runs every attempt; NULL: the one cfg->engine names
     * (sim/engine/engine.h). */
    const struct dsim_engine_ops *engine;
    const struct dsim_proc_hosts *hosts; /* an engine over machines, or NULL */
    /* the network model (engines in one address space), or NULL */
    const dsim_net_links *net;
    /* The frames between ranks, every attempt's (sim/fault/msglog.h; the
     * log's attempt is raised before each restart), or NULL. */
    struct dsim_msg_log *msgs;
    /* an engine that forks: each replica's phases from its process
     * (dsim_engine_attempt.on_phase), or NULL */
    void (*on_phase)(void *user, int replica, int phase, uint64_t gs, int64_t t_ns);
    void *on_phase_user;
} dsim_recovery_opts;

typedef struct dsim_recovery_run {
    /* The attempt that ended the job: the first one if it did not fail or
     * nothing restarted, else the last restart. err is its error. After a
     * restart its ledger is the job's over the committed steps of every
     * attempt (dsim_ledger_copy_steps: each attempt's steps up to the
     * checkpoint the next resumed from; the steps rolled back are kept as
     * such) and its initial_loss the job's, at its very start. */
    dsim_train_result final;
    dsim_err err;
    /* The first attempt, when the faults broke it and a restart followed
     * (else has_broken is false and the broken attempt is `final`). */
    dsim_train_result broken;
    bool has_broken;
    dsim_err broken_err;
    int lost_rank;  /* dsim_faults_first_loss of the broken attempt */
    int64_t t_loss; /* on the broken attempt's runtime clock, or -1 */
    int restarts;   /* restarts made */
    int crashed;    /* an engine that forks: the final attempt lost a process to
                       a signal nobody sent (a strategy that crashed) */
    /* The checkpoint the failed first attempt left: 0 none written, 1
     * intact (ckpt_step its global step), -1 unreadable (ckpt_msg why). */
    int ckpt_state;
    uint64_t ckpt_step;
    char ckpt_msg[256];
    /* The attempts between the broken one and the final one (restarts >= 2),
     * in order: attempt k is mid[k - 1]. */
    dsim_train_result *mid;
    size_t n_mid;
    /* [n_ranks]: the ranks the broken attempt lost for good (killed, paused
     * for good, cut off), however the engine learnt it; NULL when it lost
     * none. */
    bool *lost;
    int n_ranks;
    /* [restarts + 1]: the checkpoint attempt k resumed from (NULL: attempt
     * 0, or a fresh start), as it was read before that restart. */
    dsim_checkpoint **resumed;
    int n_resumed;
    /* Steps run more than once: an attempt's steps after the checkpoint the
     * next one resumed from (the next runs them again). */
    uint64_t steps_rolled_back;
    dsim_train_result clean; /* want_clean: the job without faults */
    bool has_clean;
    dsim_err clean_err;
    /* Every fault event of every attempt, and the restarts, in order;
     * t_ns from the start of each attempt's fabric, attempt says which. */
    dsim_fault_event *events;
    int *event_attempt;
    size_t n_events;
    dsim_faults_stats stats; /* summed over the attempts */
    /* The attempts' trace hashes folded in order (clean run first); 0
     * parts unless the engine is deterministic. */
    uint64_t trace_hash;
} dsim_recovery_run;

/* Runs cfg (not changed) under the faults: attempt 0 with the faults from
 * the start and no restore; on failure, with `restart`, restarts the whole
 * job from the chief's last checkpoint (cfg->checkpoint_path; a fresh start
 * when none was written yet), faults that already fired left out, until it
 * finishes or max_restarts is reached. An attempt that hung (DSIM_EHUNG: a
 * worker left running) is not restarted: it ends the job as it is. Before attempt 0 an old
 * checkpoint at cfg->checkpoint_path is removed when restarts are allowed, so that a restart never
 * resumes from another run's backup (BackupAndRestore owns its backup directory). Release *out with
 * dsim_recovery_run_free. */
dsim_err dsim_recovery_run_job(const dsim_train_cfg *cfg, const dsim_recovery_opts *o,
                               dsim_recovery_run *out);
void dsim_recovery_run_free(dsim_recovery_run *r);

/* The attempts made, and attempt k (0: the first; the last is `final`). */
size_t dsim_recovery_attempt_count(const dsim_recovery_run *r);
const dsim_train_result *dsim_recovery_attempt(const dsim_recovery_run *r, size_t k);

/* Prints the timeline of a failed or recovered run: fault events, each
 * replica's end in the broken attempt (phase, step, error, time after the
 * loss), the restarts. */
void dsim_recovery_print_timeline(const dsim_recovery_run *r, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
