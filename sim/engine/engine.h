/* Engines: how a job's workers run. One const ops table per engine,
 * registered by name; everything above this layer (the harness, the
 * scenario checks, dsim bench, dsim calibrate) chooses an engine by looking
 * its name up here and asks the table's flags what it can do, never the
 * name.
 *
 *   threads    every worker a thread of this process, wall-clock time
 *   processes  every task a forked process, tcp between them, results
 *              merged in the parent (processes.h)
 *   sim        every worker a coroutine on one thread, a virtual clock,
 *              deterministic (sim.h)
 *
 * An engine's workers run, within one process, on a runtime engine of
 * libdsim (dsim/spi/rt.h: "threads" or "sim"), named by `runtime`; the
 * table above it says how the job's processes, faults and results are
 * arranged around that.
 *
 * Rules of the table (as for transports, strategies and runtimes): `size`
 * first, set to sizeof(dsim_engine_ops); name, summary, runtime, prepare and
 * train are required and checked at registration; ranks is optional (NULL:
 * the engine cannot run a rank program, e.g. dsim bench). Built-ins register
 * themselves on first use. Thread-safe. */
#ifndef DSIM_SIM_ENGINE_TABLE_H
#define DSIM_SIM_ENGINE_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/strategy.h"
#include "dsim/transport.h"
#include "fault/fault.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an engine can do. */
enum {
    /* Time is a virtual clock that the compute model and the network model
     * move: timing-only (synthetic) models and the what-if summary need it,
     * and the one-device baseline is timed by the same model. */
    DSIM_ENGINE_VIRTUAL_TIME = 1u << 0,
    /* The same scenario and seed give the same events in the same order
     * (a trace hash, dsim replay, dsim explore). */
    DSIM_ENGINE_DETERMINISTIC = 1u << 1,
    /* Every task is an OS process forked from the caller: no thread of the
     * caller may be running while it forks, each child times its own
     * phases, a crash of a task is a node loss reported by the parent. */
    DSIM_ENGINE_FORKS = 1u << 2,
    /* Every worker runs in this address space: the fault layer, the phase
     * hooks and the crash guard act here. */
    DSIM_ENGINE_ONE_SPACE = 1u << 3,
    /* Runs the inproc transport (ranks in one address space). */
    DSIM_ENGINE_INPROC = 1u << 4,
    /* Runs the tcp transport (real sockets; needs wall-clock time). */
    DSIM_ENGINE_TCP = 1u << 5,
    /* Its ranks are joined by tcp whatever the scenario names: its links are
     * real, so a network model (cluster.network) does not apply. */
    DSIM_ENGINE_REAL_LINKS = 1u << 6,
    /* Every replica is an OS thread: at most DSIM_TRAIN_MAX_THREAD_REPLICAS. */
    DSIM_ENGINE_THREAD_PER_REPLICA = 1u << 7,
    /* Runs a job over machines (dsim worker, multihost.h). */
    DSIM_ENGINE_HOSTS = 1u << 8,
};

struct dsim_proc_hosts;
struct dsim_msg_log;

/* One attempt of a job (a run, or a restart of it under recovery). */
typedef struct dsim_engine_attempt {
    /* Run the whole job in this process, its workers on the engine's
     * runtime, whatever the engine does otherwise (a check's extra run: the
     * job without faults, the liveness phase). */
    bool in_process;
    /* DSIM_ENGINE_ONE_SPACE: the job's fault layer, made by the caller from
     * the fault list and kept over the attempts (what fired stays fired);
     * attached to the job here. NULL: none. */
    dsim_faults *fs;
    /* DSIM_ENGINE_FORKS: each task makes its own fault layer from the list,
     * with fault_done[] (fired in an earlier attempt; NULL: none) left out. */
    const dsim_fault *faults;
    size_t n_faults;
    uint64_t seed;
    const bool *fault_done;
    /* How long the others may take to end once one has failed, beyond the
     * detection bound (<= 0: 5 s). */
    int64_t grace_ns;
    const struct dsim_proc_hosts *hosts; /* DSIM_ENGINE_HOSTS; NULL: one machine */
    /* DSIM_ENGINE_FORKS: each replica's phases of the driver (timed in its
     * process on CLOCK_MONOTONIC), in order per replica (NULL: not wanted).
     * Called on the caller's thread. */
    void (*on_phase)(void *user, int replica, int phase, uint64_t gs, int64_t t_ns);
    void *on_phase_user;
    /* DSIM_ENGINE_FORKS: the frames between ranks, each task's halves added
     * here at its end (NULL: not logged). One-space engines log through
     * the fault layer or the job's transport filter (fault/msglog.h). */
    struct dsim_msg_log *msgs;
} dsim_engine_attempt;

/* What the tasks of a forking engine reported beyond the result (one-space
 * engines leave it as dsim_engine_outcome_init made it: their fault layer
 * is the caller's to read). */
typedef struct dsim_engine_outcome {
    dsim_fault_event *events; /* from every task, in the order received */
    size_t n_events;
    bool *fault_fired; /* [n_faults] */
    int lost_rank;     /* first rank lost for good, or -1 */
    int64_t t_loss;    /* CLOCK_MONOTONIC ns, or -1 */
    dsim_faults_stats stats;
    int hung;    /* tasks killed for not ending in time */
    int crashed; /* tasks that died of a signal nobody sent */
    char note[512];
} dsim_engine_outcome;

void dsim_engine_outcome_init(dsim_engine_outcome *o);
void dsim_engine_outcome_free(dsim_engine_outcome *o);

/* A rank program: `nranks` ranks joined by one fabric, run in `rounds`
 * rounds. In each round every rank runs rank_main once (in a worker of the
 * engine's runtime, with its endpoint), filling its result; then on_round
 * sees every rank's result of that round, on the caller's thread, in round
 * order. What dsim bench and dsim calibrate time. */
typedef struct dsim_engine_ranks {
    int nranks;
    /* The transport an engine in one address space opens ("inproc" or
     * "tcp"); an engine whose ranks are processes uses tcp. */
    const char *transport;
    int rounds;
    /* Rank `rank`'s part of round `round`; result (result_size bytes) is
     * zeroed before. Under an engine that forks, it runs in the rank's own
     * process and user is that process's copy. */
    void (*rank_main)(dsim_ep *ep, int rank, int round, void *result, void *user);
    void *user;
    size_t result_size;
    /* results[r * result_size] is rank r's; 0 goes on, non-zero stops the
     * program (the remaining rounds are not reported). */
    int (*on_round)(int round, const void *results, void *user);
} dsim_engine_ranks;

typedef struct dsim_engine_ops {
    size_t size;         /* sizeof(dsim_engine_ops), checked at registration */
    const char *name;    /* as a scenario's `engine:` and --engine name it */
    const char *summary; /* one line for help texts */
    unsigned flags;      /* DSIM_ENGINE_* */
    const char *runtime; /* the dsim_rt engine its workers run on within a process */
    /* Makes the engine ready in this process (registers its runtime);
     * idempotent, thread-safe. */
    dsim_err (*prepare)(void);
    /* Runs one attempt of cfg's job (cfg->engine is this engine's name, or
     * NULL) into *res (filled as dsim_train fills it; release with
     * dsim_train_result_free) and *out (release with
     * dsim_engine_outcome_free). Returns the job's error. */
    dsim_err (*train)(const dsim_train_cfg *cfg, const dsim_engine_attempt *a,
                      dsim_train_result *res, dsim_engine_outcome *out);
    /* Runs a rank program; DSIM_OK when every round was reported (whatever
     * the ranks' results say), else the error that stopped it. Optional. */
    dsim_err (*ranks)(const dsim_engine_ranks *job);
} dsim_engine_ops;

/* Registers an engine; required members are checked, a name taken is an
 * error. */
dsim_err dsim_engine_register(const dsim_engine_ops *ops);

/* The engine named `name` (NULL: "threads"): DSIM_OK, or DSIM_ENOTSUP with
 * a message naming it and the accepted names (see dsim_engine_names). */
dsim_err dsim_engine_find(const char *name, const dsim_engine_ops **out);

/* The first registered engine with every flag of `flags`, or NULL. */
const dsim_engine_ops *dsim_engine_with(unsigned flags);

/* The names of the registered engines with every flag of `flags` and,
 * with `ranks`, a ranks op, in registration order ("threads, processes,
 * sim"), into buf. Returns buf. */
const char *dsim_engine_names(unsigned flags, bool ranks, char *buf, size_t cap);

/* The i-th registered engine (0-based), or NULL past the last. */
const dsim_engine_ops *dsim_engine_at(int i);

/* The built-in tables. */
extern const dsim_engine_ops dsim_engine_threads;
extern const dsim_engine_ops dsim_engine_processes;
extern const dsim_engine_ops dsim_engine_sim;

/* A socket listening on 127.0.0.1 on any free port (its port in *port), for
 * the tcp fabric of ranks in processes; -1 with errno on failure. */
int dsim_engine_listen_loopback(int *port);

#ifdef __cplusplus
}
#endif
#endif
