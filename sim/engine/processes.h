/* The processes engine (ARCHITECTURE.md §1): one OS process per TF task.
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
 * The parent is processes.c, the records between them proc_wire.h, what
 * the parent makes of them proc_merge.c, the child proc_child.c, the agent
 * of a task under a chief elsewhere proc_agent.c; the engine's table
 * (engine.h) proc_engine.c.
 *
 * Thread-safety: one call at a time per process (it forks). */
#ifndef DSIM_SIM_PROCESSES_H
#define DSIM_SIM_PROCESSES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/strategy.h"
#include "engine.h"
#include "fault/fault.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A job spread over machines (dsim worker, sim/engine/multihost.h): this
 * process hosts task `task` (its child runs that task's ranks, as above);
 * every other task runs under its own dsim worker, an agent
 * (dsim_proc_agent) that forks that task's child the same way and relays
 * its records over a results connection. Tasks are the workers in worker-id
 * order, then the parameter servers. */
typedef struct dsim_proc_hosts {
    int task;
    const char *addrs;     /* the tcp option addrs= of every rank */
    const int *listen_fds; /* this task's ranks' listeners, kept for every attempt */
    const int *conn;       /* [tasks]: the results connection of each other task */
    const char *tcp_extra; /* more tcp options (secret_file=...), or NULL */
} dsim_proc_hosts;

/* An attempt and what its tasks reported: the engine table's (engine.h);
 * of the attempt, in_process and fs are not read here. */
typedef dsim_engine_attempt dsim_proc_attempt;
typedef dsim_engine_outcome dsim_proc_outcome;

dsim_err dsim_processes_train(const dsim_train_cfg *cfg, const dsim_proc_attempt *a,
                              dsim_train_result *res, dsim_proc_outcome *out);
void dsim_proc_outcome_free(dsim_proc_outcome *o);

/* What parents read from their children over this process's life, for
 * tests: records of every kind, the phase records among them, and the
 * phase entries those held (of a step's phases: compute, all-reduce, the
 * loss's reduction). A child sends a step's phases with its replicas'
 * other records, not on their own (proc_child.c). */
typedef struct dsim_proc_stats {
    uint64_t records;
    uint64_t phase_records;
    uint64_t phase_entries;
    uint64_t step_phase_entries;
} dsim_proc_stats;

void dsim_proc_totals(dsim_proc_stats *out);

/* Tells an agent (over its results connection) that the job is over. */
void dsim_proc_bye(int fd);

/* A task's ranks: workers first (devices_per_host each), then servers. */
void dsim_proc_task_ranks(const dsim_train_cfg *cfg, int task, int *lo, int *hi);

/* The agent of task h->task under a chief that runs dsim_processes_train
 * with hosts set: for each attempt the chief starts (with the faults that
 * already fired and whether to restore), forks the task's child, relays
 * its records to the chief over `chief_fd` and applies the signals the
 * chief sends (a kill, the watchdog's); ends the pauses its child begins.
 * Returns DSIM_OK when the chief says the job is over, an error when the
 * chief's connection is lost. */
/* For dsim worker's SIGINT/SIGTERM handler on an agent (async-signal-safe):
 * while an attempt runs, the agent tells the chief (which then ends the job
 * as an interrupt: every task told, the run stored as unfinished) and
 * returns when it says goodbye; otherwise it exits at once with 128 + sig.
 * dsim_proc_agent_signal() is the signal taken, or 0. */
void dsim_proc_agent_interrupt(int sig);
int dsim_proc_agent_signal(void);
dsim_err dsim_proc_agent(const dsim_train_cfg *cfg, const dsim_fault *faults, size_t n_faults,
                         uint64_t seed, const dsim_proc_hosts *h, int chief_fd);

#ifdef __cplusplus
}
#endif
#endif
