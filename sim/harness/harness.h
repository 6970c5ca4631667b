/* Running a scenario: one library call that does everything a run is.
 *
 * dsim_harness_run takes a loaded scenario (sim/scenario/scenario.h) and
 *   1. begins a run row in the results store (when there is one) with the
 *      scenario's text, seed, engine and resolved configuration, and a row
 *      per replica;
 *   2. trains under the scenario's strategy (dsim_train), queuing one step
 *      row per replica per step and reporting progress to a callback;
 *   3. replays the same global batches on one device when a check of the
 *      expect list needs the reference (dsim_train_reference): beside the
 *      job on an engine with virtual time (see reference_after);
 *   4. judges the expect list (sim/check), stores the checks, the metrics
 *      and the run's error, and ends the run row with its status;
 * and hands back the checks' outcomes, the run id and the figures. `dsim
 * run` is a thin caller of it (flags, printing, interrupts); so can a
 * user's own C test be. The engine is looked up in sim/engine/engine.h's
 * table by name; what the run does differently on it follows the table's
 * flags.
 *
 * The store is optional: without one the run is judged the same way and
 * nothing is written (run_id 0).
 *
 * Hangs. No run outlives its bound, whatever the strategy's code does: the
 * driver's watchdog (dsim_train in dsim/strategy.h) gives every worker a
 * grace period to return once the job has failed, aborts a job in which no
 * replica has entered a phase for twice the collective timeout (at least
 * 1 s), and then stops waiting for the workers still inside strategy code,
 * leaving them running. Such a run is stored with status 'hung', with the
 * run's error event and one error event per stuck worker (JSON: "error":
 * "hung", replica, server, phase, global_step, collective,
 * collective_calls, message); out->stuck says the same. A hang is never
 * what a scenario expects: the status is 'hung' whatever the checks say.
 *
 * Crashes (threads engine). The first run installs, once per process:
 *   - a handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT. Outside a
 *     run it hands the signal to whatever handler was there before. Inside
 *     one, on the crashing thread, it does only async-signal-safe things:
 *     asks the driver where the thread is (dsim_train_where_am_i: the
 *     replica or parameter-server handler, its phase and global step, kept
 *     in a thread-local by the driver), writes "dsim: replica 1 crashed with
 *     signal 11 (SIGSEGV) in phase allreduce at global step 2; storing the
 *     run as crashed" to stderr with write(2), and hands the same record
 *     through a pipe to a watcher thread; then it waits (at most 10 s) for
 *     the watcher's answer on a second pipe, restores the default action
 *     and lets the signal kill the process (a fault recurs on return, a
 *     sent signal is raised again), so the exit status and a core dump are
 *     the crash's own. A second crash on another thread meanwhile waits to
 *     die. The watcher, a normal thread started with every signal blocked,
 *     takes the store lock (waiting at most 5 s for the calls in flight),
 *     stores an error event (JSON: "error": "crashed", replica, server,
 *     phase, global_step, signal, signal_name, message) and ends every run
 *     in progress as 'crashed', closes their stores so it all commits, and
 *     answers.
 *   - an on_exit handler: a replica or handler that calls exit(N) is
 *     reported ("replica 1 called exit(3) in phase allreduce at global step
 *     2"), stored the same way with exit_status, and the process then ends
 *     with status 1, a run that did not pass. exit() from any other thread
 *     is left alone.
 * Not caught: _exit(), a stack overflow (no alternate signal stack on the
 * workers), SIGKILL; those runs are marked 'unfinished' when the store is
 * next opened. opts.no_crash_guard skips the installation.
 *
 * Ownership: the scenario and the options are borrowed for the call; the
 * result owns what it points to (dsim_harness_result_free). A store passed
 * in opts.store stays the caller's (a crash closes it: the process is
 * dying); one opened from opts.db_path is closed before the call returns.
 * After a hang the stuck workers keep the driver's job state alive (it is
 * reference-counted there); the harness's own observer state is left
 * allocated only if a worker is stuck inside the observer.
 *
 * Thread-safety: runs on different threads may go on at once, each with its
 * own scenario and result (a store may be shared: dsim_store is
 * thread-safe). The progress callback is called on the replicas' worker
 * threads and on the caller's thread; it must be thread-safe. */
#ifndef DSIM_HARNESS_H
#define DSIM_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "check/check.h"
#include "dsim/err.h"
#include "scenario/scenario.h"
#include "store.h"

struct dsim_proc_hosts;

#ifdef __cplusplus
extern "C" {
#endif

/* Where a run is, for a progress line. */
typedef struct dsim_harness_progress {
    uint64_t step;     /* global steps replica 0 has finished */
    uint64_t total;    /* steps the run will take; 0 when unknown */
    double loss;       /* replica 0's reduced loss at that step (NaN: none) */
    uint64_t examples; /* examples read so far, every replica */
    double elapsed_s;  /* since training started */
    bool finished;     /* training has returned: the run's last call */
    /* While the job forms (until every replica has taken its first step),
     * about once a second from a thread of the harness's own: forming is
     * set, step is 0, and these say who is there and who is awaited. */
    bool forming;
    int formed, replicas; /* replicas that have taken a first step, of */
    char awaiting[160];   /* "replica 2 (worker 1), replica 3 (worker 1)" */
} dsim_harness_progress;

/* Called after each of replica 0's steps (on its worker thread), about
 * once a second while the job forms (forming set, on a harness thread), and
 * once with finished set when training returns (on the caller's thread). */
typedef void (*dsim_harness_progress_fn)(const dsim_harness_progress *p, void *user);

typedef struct dsim_harness_opts {
    size_t size; /* sizeof(dsim_harness_opts) as the caller was compiled */
    /* The results store: an open one (borrowed), or a path to open for this
     * run (and close before returning); neither: no store. */
    dsim_store *store;
    const char *db_path;
    /* Overrides of the scenario's engine and seed (NULL / has_seed false:
     * the scenario's own). The seed drives model init, data and shuffling. */
    const char *engine_override;
    bool has_seed;
    uint64_t seed;
    dsim_harness_progress_fn progress; /* optional */
    void *progress_user;
    /* The watchdog's bounds (dsim_train_cfg.watchdog_grace_ns and
     * progress_timeout_ns); 0: the scenario's, i.e. the driver's defaults. */
    int64_t grace_ns;
    int64_t progress_timeout_ns;
    /* Leave the process's signal handlers and exit() alone (see "Crashes"
     * above): a crash then kills the process without storing anything. */
    bool no_crash_guard;
    /* A job over machines (dsim worker, sim/engine/multihost.h): the tasks
     * and their results connections; the run goes through the processes
     * engine whatever the scenario's engine. NULL: one machine. */
    const struct dsim_proc_hosts *hosts;
    /* Replay the one-device reference after the job, never beside it. By
     * default, on an engine with virtual time (every worker on one OS
     * thread, times from the cost model) and a machine with a second CPU,
     * the replay runs on a thread of its own while the job trains: the same
     * result, in less wall time. Elsewhere it always runs after the job,
     * whose wall-clock times it would disturb. */
    bool reference_after;
    /* Override of the scenario's transport: ("inproc", "shm" or "tcp");
     * NULL: the scenario's own, else the engine's default (inproc in one
     * address space, shm between processes of one host, tcp across). */
    const char *transport_override;
    /* Keep the variables after every step in the store's params table
     * (dsim run --keep-params; `dsim export` then writes them without
     * training the run again). Replica 0's, as the driver records them. */
    bool keep_params;
} dsim_harness_opts;

/* What a run came to. */
typedef struct dsim_harness_result {
    dsim_run_id run_id;     /* the run's row; 0 without a store */
    dsim_run_status status; /* as stored */
    /* How training ended: DSIM_OK, or its error and message. */
    dsim_err train_err;
    char train_msg[512];
    /* The harness itself failed (the store could not be written, out of
     * memory): status is then DSIM_RUN_ERROR; `dsim run` exits 2. */
    bool harness_error;
    char harness_msg[600];
    /* A note worth printing that did not change the verdict (e.g. the
     * one-device reference failed, so checks that need it say so); "" if
     * none. It is stored as an error event. */
    char note[600];
    /* The one-device reference was replayed beside the job (reference_after
     * in the options), not after it. */
    bool reference_beside;
    /* The expect list's outcomes, in file order (sim/check). */
    dsim_check_outcome *checks;
    size_t n_checks, n_failed;
    uint64_t steps;       /* the job's global steps: the step it ended at (the store's
                             distinct steps), or reached when the run failed */
    uint64_t steps_rerun; /* of those, steps run twice: rolled back by a restart */
    uint64_t examples;    /* examples read, every replica */
    double wall_s, examples_per_s;
    double final_loss; /* NaN when the run failed */
    /* Runs with faults: restarts made by recovery, and the timeline of
     * what happened (fault events, how each replica ended, restarts) when a
     * node was lost or the run failed; NULL otherwise. */
    int restarts;
    char *timeline;
    /* Runs with faults: one line of what the faults did ("" otherwise). */
    char fault_summary[256];
    /* A run that failed or failed a check, with a store: the file its
     * flight records were written to (sim/diag/flight.h), for `dsim trace
     * desync RUN_ID`; "" when none was written. */
    char flight_path[512];
    /* status DSIM_RUN_HUNG: the workers the watchdog left running and where
     * each was (dsim_train_stuck_describe makes a sentence of one). */
    dsim_train_stuck *stuck;
    size_t n_stuck;
    /* engine sim: the hash of the run's event trace (every attempt's, for
     * a run with faults), as stored in runs.trace_hash; equal scenario and
     * seed give equal hashes. deterministic is false (and the hash 0) on
     * the other engines. */
    bool deterministic;
    uint64_t trace_hash;
    uint64_t trace_events; /* in the last attempt's trace */
    /* Time on the engine's clock from the workers' start to the last one's
     * return (virtual under sim; 0 when the run failed before). */
    int64_t engine_ns;
    /* A run under the sim engine with a network model or a synthetic model
     * (a what-if): two lines, what the modelled cluster would take (step
     * time, all-reduce share, speed-up over one device, the algorithm) and
     * where the figures come from; "" otherwise. */
    char whatif[1536];
    /* The run's median step and the time in the exchange of it (the
     * performance check's figures: step_s, allreduce_share x step_s), in
     * the engine's seconds; NaN when the run took no step. */
    double step_s, exchange_s;
} dsim_harness_result;

/* Applies opts' overrides to s in place and checks that this build can run
 * it: the engine, dsim_scenario_runnable, and the strategy plugin, which is
 * loaded (so a plugin that cannot be loaded is bad input found before any
 * run). DSIM_EINVAL / DSIM_ENOTSUP / DSIM_ENOENT with a message naming the
 * file. opts may be NULL. */
dsim_err dsim_harness_prepare(dsim_scenario *s, const dsim_harness_opts *opts);

/* Runs the scenario (with opts' overrides applied to a private copy) and
 * fills *out. Returns DSIM_OK when the run was carried out (whatever its
 * checks said: see out->status and out->n_failed); the error of the store
 * or of the preparation otherwise, with out->harness_msg saying what
 * failed. *out is filled as far as the run got either way: free it with
 * dsim_harness_result_free. opts may be NULL (no store, no progress). */
dsim_err dsim_harness_run(const dsim_scenario *s, const dsim_harness_opts *opts,
                          dsim_harness_result *out);

/* The same for a scenario given as text (parsed with dsim_scenario_parse;
 * `path` names it in messages and anchors a relative strategy.plugin).
 * A text that does not parse is DSIM_EINVAL with FILE:LINE:COLUMN in
 * out->harness_msg. */
dsim_err dsim_harness_run_text(const char *path, const char *text, size_t len,
                               const dsim_harness_opts *opts, dsim_harness_result *out);

void dsim_harness_result_free(dsim_harness_result *r);

/* What dsim_harness_replay compared. */
typedef struct dsim_harness_replay_info {
    char scenario[128];   /* the stored run's scenario name */
    uint64_t seed;        /* its seed */
    char stored_hash[24]; /* its trace hash (hex) */
    char replay_hash[24]; /* the new run's */
    bool matched;         /* equal hashes: the same events in the same order */
} dsim_harness_replay_info;

/* Runs stored run `id` of the database at db_path again, from its stored
 * scenario text and seed on the sim engine, and compares the trace hashes.
 * opts (may be NULL) says where the new run is stored, as for
 * dsim_harness_run; its engine and seed overrides are ignored. DSIM_OK when
 * the replay ran (info->matched says whether it matched); DSIM_ENOENT for
 * no such run, DSIM_ENOTSUP for a run that did not run under sim (only
 * those are deterministic), with a message. */
dsim_err dsim_harness_replay(const char *db_path, dsim_run_id id, const dsim_harness_opts *opts,
                             dsim_harness_result *out, dsim_harness_replay_info *info);

/* ---- exporting a run for another framework ---- */

/* What dsim_harness_export wrote and checked. */
typedef struct dsim_harness_export_info {
    char scenario[128]; /* the stored run's scenario name */
    uint64_t seed;
    uint64_t steps; /* global steps exported */
    int replicas;
    size_t n_params, n_examples;
    /* The stored run's parameter checksums (steps x replicas) compared with
     * the run trained again here, and how many differed (0: the files are
     * the stored run's, bit for bit). */
    uint64_t checked, differed;
    uint64_t initial_checksum, final_checksum; /* dsim_params_checksum */
    double ref_max_abs; /* largest |final - the one-device reference's final| */
    /* Steps whose variables the run kept (dsim run --keep-params; 0: none),
     * written as params_per_step.npy from the store, and how many of the
     * kept rows differed from the run trained again (counted in differed
     * too). */
    uint64_t kept_steps, kept_differed;
} dsim_harness_export_info;

/* Writes what another framework needs to replay stored run `id` of the
 * database at db_path into folder dir (created if missing, one level): the
 * dataset, the initial and final parameters, the reference's optimizer
 * state, every replica's example ids per step (.npy) and manifest.json
 * (export.c's head lists them). The run is trained again in this process
 * from its stored scenario text and seed, on its engine, and checked
 * against the stored checksums (info). per_step: also replica 0's
 * parameters after every step. DSIM_ENOENT for no such run, DSIM_ENOTSUP
 * for a run with faults, with a message. */
dsim_err dsim_harness_export(const char *db_path, dsim_run_id id, const char *dir, bool per_step,
                             dsim_harness_export_info *info);

/* ---- what a program that runs scenarios starts with ---- */

/* A supervising parent process, for what the crash guard cannot see: a
 * SIGKILL (the kernel's out-of-memory killer, kill -9), or a strategy that
 * calls _exit(). Forks; returns in the child, which runs the scenarios (and
 * where there is no supervisor: DSIM_NO_SUPERVISOR=1, e.g. under a
 * debugger, or a fork that failed). The parent only waits: when the child
 * ends, the runs it left 'running' in the store at db_path are stored as
 * 'crashed' with how it ended and its peak memory (said on stderr, after
 * `prog: ` for errors), and the parent ends as the child did (same status,
 * or the same signal; status 1 when a run was left behind after an exit 0).
 * Signals sent to the parent (an interrupt, a terminate) are passed on; if
 * the parent is killed, the child is sent SIGTERM. Call it before any
 * thread is started. */
void dsim_harness_supervise(const char *db_path, const char *prog);

/* Jobs of this many replicas or more, on an engine that runs every worker
 * as a coroutine in this process, run best with huge pages for malloc. */
#define DSIM_HARNESS_HUGEPAGES_REPLICAS 4096
bool dsim_harness_wants_hugepages(const dsim_scenario *s);

/* For a job that touches gigabytes at random (tens of thousands of workers
 * under sim): executes this program again (main_argv: main's argv) with
 * glibc's tunable glibc.malloc.hugetlb=1, which glibc reads only at start
 * and with which malloc asks for transparent huge pages: every worker's
 * state then costs a fraction of the TLB misses. Returns when that is not
 * to be done: DSIM_HUGEPAGES=0, already done, the kernel's THP mode is not
 * `madvise`, a run under valgrind, or the exec failed. */
void dsim_harness_reexec_hugepages(char **main_argv);

/* What the formation-progress threads of this process did, summed over
 * every run (for tests and benchmarks). A thread is started for a run with
 * a progress callback and more than one replica on an engine that does not
 * fork; it sleeps until the job has formed or training has ended (either
 * wakes it at once) or until its next report (about once a second). So a
 * run never waits for the thread to notice its end: forming_late (threads
 * that found the end on a wake-up of their own clock, not woken by it) and
 * forming_idle (wake-ups that neither reported nor ended the thread) stay
 * 0, but for a job that forms or ends within microseconds of a report. */
typedef struct dsim_harness_stats {
    uint64_t forming_threads;
    uint64_t forming_wakeups;
    uint64_t forming_reports;
    uint64_t forming_idle;
    uint64_t forming_late;
} dsim_harness_stats;

void dsim_harness_totals(dsim_harness_stats *out);

/* For a thread that ends the process next (an interrupt): waits for the
 * store calls in flight of every run in progress, refuses any later one,
 * and closes the stores of the runs in progress and `extra` (the caller's
 * own store, or NULL), each once. A run begun and not ended is thereby
 * stored as 'unfinished'; everything committed before stays, and a run
 * whose end was committed keeps its status. Returns how many runs it
 * stored as unfinished (their ids in unfinished[cap]; NULL with cap 0 for
 * none): 0 when the signal came between runs or after the last was stored.
 * Returns with the harness's store lock held for good: call _exit next. */
size_t dsim_harness_shutdown(dsim_store *extra, dsim_run_id *unfinished, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
