/* Running a training job under a distribution strategy.
 *
 * dsim_train runs one job: hosts x devices_per_host replicas (and num_ps
 * parameter servers) as workers of a runtime engine, joined by an inproc
 * fabric, each replica reading its share of a synthetic dataset through the
 * input pipeline (dsim/data.h) and training a reference model (dsim/model.h)
 * with an optimizer (dsim/optim.h), while the named strategy keeps the
 * variables (dsim/spi/strategy.h). An observer sees every replica after every
 * step; the result holds the final parameters, the per-step losses and
 * parameter checksums of every replica, the coverage ledger, and for
 * parameter servers every update's staleness.
 *
 * dsim_train_reference replays the same global batches on one device, so
 * that a run can be compared with it (dsim_params_compare).
 *
 * Built-in strategies (TF names): one_device, mirrored,
 * multi_worker_mirrored, central_storage, parameter_server, tpu. A user's
 * own strategy is a shared object loaded with dsim_strategy_load.
 *
 * Cluster shapes accepted:
 *   one_device             1 host x 1 device, no ps
 *   mirrored               1 host x D devices, no ps
 *   central_storage        1 host x D devices, no ps
 *   multi_worker_mirrored  H hosts x D devices, no ps
 *   parameter_server       H hosts x D devices, num_ps >= 1, sync or async
 *   tpu                    a TPU slice (cfg.tpu): its hosts x replicas per host,
 *                          no ps. Simulated: no TPU is used (dsim/tpu.h)
 *
 * Determinism: with a synchronous strategy the same configuration gives the
 * same bits on every run (every collective is deterministic for a given
 * algorithm and rank count, and the parameter servers sum contributions in
 * replica order). Asynchronous parameter-server runs depend on scheduling. */
#ifndef DSIM_STRATEGY_H
#define DSIM_STRATEGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/comm.h"
#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/err.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/precision.h"
#include "dsim/tpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_ps_mode {
    DSIM_PS_SYNC = 0, /* every step's updates aggregated, then applied once */
    DSIM_PS_ASYNC,    /* each replica's update applied as it arrives */
    DSIM_PS_MODE_COUNT
} dsim_ps_mode;

/* "sync", "async". */
DSIM_API const char *dsim_ps_mode_name(dsim_ps_mode m);
DSIM_API dsim_err dsim_ps_mode_parse(const char *s, dsim_ps_mode *out);

/* ---- the strategy registry ---- */

/* Loads a strategy from a shared object and registers it under the name in
 * its ops table. `name`, when not NULL, is the name the caller expects (a
 * scenario's strategy.name): a table that names another strategy is refused
 * (DSIM_EINVAL naming both), never registered under a second name. The
 * object exports
 * `const struct dsim_strategy_ops *dsim_strategy_plugin(uint32_t *abi)`
 * (dsim/spi/strategy.h). Loading the same table again is a no-op. Errors
 * name the path and the problem: DSIM_ENOENT when dlopen fails (with
 * dlerror()), DSIM_EINVAL when the symbol is missing, the ABI version
 * differs, the table is incomplete or names another strategy. The object
 * stays loaded for the life of the process.
 *
 * Loading runs the object's code with the process's rights (its
 * constructors at dlopen, then the plugin function): load only plugins you
 * would run as a program. */
DSIM_API dsim_err dsim_strategy_load(const char *name, const char *path);

/* 1 if a strategy of that name is registered (built-ins included). */
DSIM_API int dsim_strategy_exists(const char *name);

/* Writes the registered names, comma-separated, into buf (always
 * terminated). Returns how many there are. */
DSIM_API int dsim_strategy_list(char *buf, size_t cap);

/* The summary line of a registered strategy, or NULL. */
DSIM_API const char *dsim_strategy_summary(const char *name);

/* What a strategy plugin's shared object holds, read without registering
 * it (`dsim list strategies` lists the plugins of its directories so). */
typedef struct dsim_strategy_plugin_info {
    char name[32];        /* its table's .name ("" when its table is unusable) */
    char summary[256];    /* its table's .summary ("" when none) */
    unsigned abi_version; /* the DSIM_STRATEGY_ABI_VERSION it was built with */
    int usable;           /* 1: dsim_strategy_load would accept it */
    char why[512];        /* why not, when not (the message the loader gives) */
} dsim_strategy_plugin_info;

/* Opens the shared object at path, reads its plugin function's ABI version
 * and, when that is this library's, its table; then closes it. DSIM_OK when
 * it is a strategy plugin (usable or not: out says), DSIM_ENOENT when it
 * cannot be loaded, DSIM_EINVAL when it is no strategy plugin. It runs the
 * object's code (constructors, the plugin function) as loading does. */
DSIM_API dsim_err dsim_strategy_plugin_probe(const char *path, dsim_strategy_plugin_info *out);

/* ---- training ---- */

/* The largest job dsim_train runs on one host: hosts x devices_per_host
 * replicas (each a runtime worker with its own endpoint). What bounds it in
 * practice is the engine: a thread per replica (threads; the harness keeps
 * those jobs to DSIM_TRAIN_MAX_THREAD_REPLICAS) or memory (sim). Under sim
 * a replica costs about 0.4 MiB plus its model's parameters four times
 * over (8192 replicas of 8 Ki parameters: 3.3 GiB), and with the health
 * check on, its first round, which pings every pair of workers as TF's
 * does, adds some 300-400 bytes and 2.5 us per pair: 4096 workers take
 * about 5 GiB and a minute more, 8192 some 20 GiB (figures:
 * reports/bench-sim-scale.txt). dsim run refuses a job whose check would
 * not fit in the machine's memory, naming the fix, and a job whose
 * replicas would not (about 0.5 MiB each with payloads, 48 KiB timing only:
 * 65,536 timing-only replicas take about 1.8 GB). */
#define DSIM_TRAIN_MAX_REPLICAS        65536
#define DSIM_TRAIN_MAX_THREAD_REPLICAS 1024
/* Parameter servers in one run. */
#define DSIM_TRAIN_MAX_PS 64
/* Runtime workers in one run: a worker per replica plus, for parameter
 * servers, one serving worker per (server, replica) pair. */
#define DSIM_TRAIN_MAX_WORKERS 65536

/* The phases of a replica's life, in order. The driver announces each to the
 * hooks (dsim_train_hooks) and keeps the last one per replica, so a harness
 * can inject a fault at a phase and say where a stuck replica is. */
typedef enum dsim_phase {
    DSIM_PHASE_START = 0,        /* the worker started */
    DSIM_PHASE_RENDEZVOUS,       /* replica_init: joining the group */
    DSIM_PHASE_RESTORE,          /* resuming from a checkpoint (restored runs only) */
    DSIM_PHASE_CREATE_VARIABLES, /* create_variables: the chief's initial broadcast */
    DSIM_PHASE_COMPUTE,          /* a step's input, forward and backward pass */
    DSIM_PHASE_ALLREDUCE,        /* apply_gradients: the gradients' reduction and update */
    DSIM_PHASE_REDUCE_LOSS,      /* reduce of the step's loss */
    DSIM_PHASE_CHECKPOINT,       /* save, and the chief's checkpoint write */
    DSIM_PHASE_FINISH,           /* finish: the job's final variables */
    DSIM_PHASE_DONE,             /* returned */
    DSIM_PHASE_COUNT
} dsim_phase;

/* "start", "rendezvous", "restore", "create_variables", "compute",
 * "allreduce", "reduce_loss", "checkpoint", "finish", "done". */
DSIM_API const char *dsim_phase_name(dsim_phase p);
/* DSIM_EINVAL for a name that is not one of those. */
DSIM_API dsim_err dsim_phase_parse(const char *s, dsim_phase *out);

/* What a phase hook tells the replica to do. */
typedef enum dsim_hook_action {
    DSIM_HOOK_GO = 0, /* carry on */
    DSIM_HOOK_DIE,    /* stop here as a killed process would: return at once,
                         report no error, abort nothing, never touch the
                         fabric again; the survivors must find out */
} dsim_hook_action;

/* The harness's seam into the driver: fault injection, pauses, progress.
 * Every member is optional; members are called on replicas' own workers,
 * concurrently, and must be thread-safe. */
typedef struct dsim_train_hooks {
    size_t size; /* sizeof(dsim_train_hooks) as the caller was compiled */
    /* Replica `replica` enters `phase` at global step `global_step`. May
     * block through the runtime API (a paused replica). */
    dsim_hook_action (*phase)(void *user, int replica, dsim_phase phase, uint64_t global_step);
    /* 1 if rank `replica` has been killed by the harness outside a phase
     * hook (e.g. isolated by a fault transport in the middle of a
     * collective). The driver asks when the replica fails: a killed
     * replica's error is not the job's failure, and it stops as
     * DSIM_HOOK_DIE would. Asked for parameter-server ranks too
     * (num_replicas + server): the serving workers of a killed server, or
     * of a killed client, end without failing the job. The health check of
     * the replica's worker also asks, at every tick (from its own runtime
     * worker): once it says 1 the worker stops answering its peers' pings,
     * as a dead process would. */
    int (*killed)(void *user, int replica);
    /* Replica `replica` read its batch of (epoch, step): ids[0..n), as the
     * coverage ledger records it, right after its compute and before the
     * exchange. What an engine whose tasks can die at any moment (a killed
     * process) reports at once, so that a read the job relied on is never
     * lost with the process. */
    void (*batch)(void *user, int replica, uint32_t epoch, uint64_t step, const uint64_t *ids,
                  uint64_t n);
} dsim_train_hooks;

/* Where a replica ended (dsim_train_result.replicas). */
typedef struct dsim_train_replica_end {
    dsim_phase phase;       /* the last phase entered */
    uint64_t global_step;   /* the global step it was on */
    bool killed;            /* stopped by DSIM_HOOK_DIE / hooks->killed */
    dsim_err status;        /* DSIM_OK, or the error it returned with */
    int64_t t_end;          /* dsim_rt_now when it returned */
    int64_t t_phase;        /* dsim_rt_now when it entered that last phase */
    uint64_t steps_done;    /* steps it completed (observer called) in this run */
    uint64_t end_checksum;  /* dsim_params_checksum of its variables when it returned
                               (0 if it never had variables) */
    uint64_t good_checksum; /* ... after its last create_variables or apply_gradients
                               that succeeded (0: none did): a failure must leave
                               the variables so */
    uint64_t reruns;        /* steps of lost replicas it re-ran (lost_work) */
    char msg[256];          /* the error's message ("" when none) */
    /* Cold start: dsim_rt_now when it first entered each phase in this run
     * (0: never), and when its first step was done (0: none). */
    int64_t t_first[DSIM_PHASE_COUNT];
    int64_t t_first_step;
    /* Cold start: the connections its endpoint set up by the end of its
     * first step (dsim_ep_get_conn_stats; connections 0: none, as on
     * inproc), measured by the transport or modelled by the network model. */
    int conn_count, conn_slowest_peer, conn_modelled;
    int64_t conn_max_ns, conn_total_ns;
    /* dsim_params_checksum of its variables when create_variables returned
     * (after a restore: the restored variables, broadcast or not); 0 if it
     * never returned. */
    uint64_t created_checksum;
    /* Strategy calls that returned success although a collective on the
     * replica's world communicator failed inside them: an error the
     * strategy swallowed (dsim_comm_failed_calls). The first one's phase
     * (create_variables, allreduce: apply_gradients, reduce_loss: reduce),
     * global step, and the collective's error and message. */
    uint64_t swallowed;
    dsim_phase swallowed_phase;
    uint64_t swallowed_step;
    dsim_err swallowed_err;
    char swallowed_msg[256];
} dsim_train_replica_end;

/* Where a worker of a running job is: a replica, or a parameter server's
 * handler serving one replica. */
typedef struct dsim_train_where {
    int replica;          /* the replica; for a handler, the replica it serves */
    int server;           /* -1: a replica; else the parameter server of the handler */
    dsim_phase phase;     /* the replica's last phase (for a handler: its client's) */
    uint64_t global_step; /* the global step it was on */
} dsim_train_where;

/* A worker the watchdog gave up on (dsim_train_result.stuck). */
typedef struct dsim_train_stuck {
    dsim_train_where where;
    /* The last collective the replica began on its world communicator (a
     * static string such as "allreduce"; NULL: none yet, or a handler) and
     * how many it had begun: fewer than the others means it never joined
     * the call they were waiting in. */
    const char *collective;
    uint64_t collective_calls;
    /* "the phase hook" or "the observer" when it was inside one of the
     * caller's callbacks, else NULL. */
    const char *callback;
} dsim_train_stuck;

/* A sentence for a stuck worker: "replica 1 in phase allreduce at global
 * step 2 (last collective: allreduce, call 6)". Returns snprintf's count. */
DSIM_API int dsim_train_stuck_describe(const dsim_train_stuck *s, char *buf, size_t cap);

/* Whether the calling thread is a worker of a dsim_train in progress, and
 * if so where it is. Async-signal-safe (it reads a thread-local pointer the
 * worker set when it started, and atomics): a crash handler's question. */
DSIM_API bool dsim_train_where_am_i(dsim_train_where *out);

/* Jobs that a hung dsim_train left behind whose workers have not all
 * returned yet (their state is freed when the last one returns). */
DSIM_API size_t dsim_train_abandoned_jobs(void);

/* What the observer sees: one replica after one step. */
typedef struct dsim_train_step_info {
    int replica, worker, device;
    uint32_t epoch;         /* 0-based */
    uint64_t step;          /* 0-based within the epoch */
    uint64_t global_step;   /* 0-based over the whole job (restored steps included) */
    uint64_t examples;      /* in this replica's batch */
    double local_loss;      /* this replica's loss sum times the loss scale */
    double loss;            /* the strategy's SUM-reduce of local_loss (NaN if the
                               strategy does not reduce, as async parameter servers) */
    uint64_t checksum;      /* dsim_params_checksum of the replica's variables after the step */
    int64_t t_start, t_end; /* dsim_rt_now at the step's start and end */
    int64_t t_comm;         /* ... when its compute ended and apply_gradients began
                               (t_end - t_comm: the exchange, waits included) */
    const uint64_t *ids;    /* the example ids of this replica's batch (examples of
                               them), valid during the call */
    bool rerun;             /* a lost replica's step, re-run by `replica`
                               (dsim_strategy_ops.lost_work); the batch is the lost
                               replica's, and the per-step results keep only the
                               replicas' own steps */
    int rerun_of;           /* that lost replica; -1 for a replica's own step */
    float mp_scale;         /* mixed precision: the loss scale this step's gradient was
                               computed with (1 unless mixed_float16) */
    bool mp_skipped;        /* ... and the strategy skipped its update (non-finite) */
    uint64_t padded;        /* rows of padding computed beside the examples to fill
                               the strategy's static batch (masked, not read) */
    double grad_norm;       /* the global norm of the gradient this step's update
                               applied through dsim_optim_apply: with
                               optimizer.global_clipnorm, the norm it clipped by (or
                               the one given dsim_optim_apply_norm) on every replica;
                               without, replica 0's only. NaN where not known (no
                               such update, or one of a part of the parameters) */
    uint16_t var_sig[DSIM_MODEL_MAX_VARS]; /* the signature of each of the model's
                                              variables after the step
                                              (dsim_train_result.var_sig) */
} dsim_train_step_info;

/* Called on the replica's own worker thread, concurrently for different
 * replicas: it must be thread-safe. */
typedef void (*dsim_train_observer)(const dsim_train_step_info *info, void *user);

typedef struct dsim_train_cfg {
    /* strategy */
    const char *strategy;    /* a registered name, e.g. "mirrored" */
    const char *plugin_path; /* optional: dsim_strategy_load(strategy, plugin_path) first */
    int hosts;               /* >= 1 */
    int devices_per_host;    /* >= 1 */
    int num_ps;              /* parameter servers, >= 0 */
    dsim_ps_mode ps_mode;
    dsim_algo communication; /* all-reduce algorithm; AUTO: the decision function */
    /* Every collective and wait (TF's CommunicationOptions.timeout_seconds):
     * > 0 the bound; 0 none, so that only the health check (below) or an
     * abort ends a wait for a lost peer; < 0 (DSIM_TIMEOUT_DEFAULT) 30 s. */
    int64_t timeout_ns;
    /* The health check (TF MultiWorkerMirroredStrategy's _check_health,
     * dsim/health.h): every worker pings every other worker `interval` after
     * its last answer, each ping waits `timeout`, and after `retries`
     * unanswered pings in a row all collectives are aborted with "peer R is
     * down". It runs when the job has two or more workers and no parameter
     * servers (TF runs it in multi-worker collective jobs only; parameter-
     * server training has no peer check: its coordinator sees a lost worker
     * or server through its own RPCs, which here are bounded by timeout_ns).
     * interval 0: off. Defaults (TF's): 30 s, 10 s, 3. */
    int64_t health_interval_ns;
    int64_t health_timeout_ns;
    int health_retries;
    const char *engine; /* NULL: "threads" */
    /* Modelled compute: each step charges 6 x parameters x local batch
     * floating-point operations at this rate to the replica's runtime
     * (dsim_rt_charge: virtual time under the sim engine, only counted on
     * the others). 0: nothing is charged. */
    double device_flops;
    /* A synthetic model (timing only): > 0 parameters make the run one that
     * moves no payload. model and the data's features are then unused; the
     * data's examples, global_batch and epochs still set the steps. Every
     * replica charges 3 x synthetic_flops (forward FLOPs per example) x its
     * examples at device_flops, then all-reduces synthetic_params float32
     * gradients (and its loss) on a communicator with virtual payloads
     * (dsim/comm.h): the algorithm's real steps and message sizes, no bytes.
     * Only under engine sim, with a mirrored or one_device strategy; the
     * result has step times and no numbers (params NULL, losses NaN). */
    double synthetic_params;
    double synthetic_flops;
    /* The fabric's backend (NULL: "inproc") and options string, and an
     * optional fault filter over it (dsim_fabric_cfg.filter). */
    const char *transport;
    const char *transport_options;
    const struct dsim_tp_filter *transport_filter;
    void *transport_filter_user;
    /* The ranks this process hosts: [local_first, local_first + local_count)
     * of the job's replicas (0..R-1, worker w = wD..wD+D-1) and servers
     * (R..R+P-1); local_count 0: all of them (one process). A job spread over
     * processes (one per worker or server, the `processes` engine or real
     * machines) runs dsim_train in each with its own range over a transport
     * that reaches the others (tcp); each fills only its ranks' part of the
     * result. */
    int local_first;
    int local_count;
    const dsim_train_hooks *hooks; /* optional */
    void *hooks_user;

    /* model and optimizer; model.in_dim == 0 takes the model that fits the
     * dataset (dsim_dataset_model_spec) */
    dsim_model_spec model;
    dsim_optim_spec optim;

    /* data */
    dsim_dataset_spec data;      /* made with dsim_dataset_make when dataset is NULL */
    const dsim_dataset *dataset; /* borrowed, optional */
    bool in_memory;              /* present the data as a source without files
                                    (AUTO then shards by DATA) */
    dsim_shard_policy shard;
    dsim_shard_hint hint;
    int64_t global_batch; /* >= 1 */
    uint32_t epochs;      /* >= 1 */
    bool shuffle;
    bool drop_remainder;
    uint64_t seed; /* model init ("model.init") and shuffling ("data.shuffle") */

    /* checkpoints (BackupAndRestore) */
    const char *checkpoint_path; /* NULL: none */
    uint64_t checkpoint_every;   /* save after every k-th global step; 0: never */
    bool restore;                /* start from checkpoint_path if it exists */
    uint64_t stop_after;         /* stop once this many global steps are done
                                    (an interruption); 0: run to the end */

    /* Preemption (TF's PreemptionCheckpointHandler). A notice (TF: SIGTERM
     * on the worker about to lose its machine) may reach any replica at any
     * time. At every step boundary the replicas all-reduce (MAX) whether any
     * of them has one, so they all see the first notice at the same boundary
     * B; they run preempt_grace_steps more steps, the chief saves a
     * checkpoint at B + grace (to checkpoint_path), every replica stops, and
     * dsim_train returns DSIM_EPREEMPTED with result.preempted set: run the
     * job again with restore to resume it, and it ends as an uninterrupted
     * run would. A stop that falls at or after the job's last step is just
     * the end of the job. Needs checkpoint_path and a strategy with save. */
    uint64_t preempt_after; /* a notice once this many global steps are done; 0: none */
    /* Optional: asked by every replica at every step boundary (on its own
     * worker: thread-safe); nonzero once `replica`'s worker has a notice. */
    int (*preempt_notice)(void *user, int replica);
    void *preempt_user;
    uint64_t preempt_grace_steps; /* steps run after the agreed boundary, before the save */

    bool record_params; /* keep replica 0's variables after every step (result.trace) */
    /* With record_params: keep them after every trace_every-th step only
     * (global steps trace_every, 2 * trace_every, ... of the run), so that
     * a long run's trace fits; 0 or 1: after every step. */
    uint32_t trace_every;
    /* Keep the gradient the update applied at the first step of each span
     * of trace_every steps (the run's steps 0, trace_every,
     * 2 * trace_every, ...: result.trace_grad), where a replay that follows
     * the run starts from its variables: replica 0's where its optimizer
     * updates the whole model, each replica's part where the optimizers
     * update parts (dsim_optim_set_part); under an adaptive optimizer
     * (dsim_optim_is_adaptive: adam, adamax, rmsprop, adagrad, lion) with
     * trace_every > 1, the optimizer's slots before that update too
     * (result.trace_slots), which the replay then starts the span with. */
    bool record_grads;
    /* dsim_train_reference_follow(_run): a second replay beside the first,
     * from the same rows (and the run's trace_slots), whose gradient sums
     * the gradients of the replicas' batches in float, as an all-reduce
     * does (result.follow_part): how far two right replays part within a
     * span. float32 only; twice the replay's work. */
    bool follow_parting;
    /* After a restore, every replica calls save() once more, right after
     * create_variables and before its first step, and the chief's is kept
     * in result.restored: what the strategy holds once it restored (and
     * broadcast) the checkpoint, to compare with the file. */
    bool probe_restore;
    dsim_train_observer observer;
    void *observer_user;

    /* The watchdog (see dsim_train). 0 takes the default, < 0 turns it off.
     * watchdog_grace_ns: once the job has failed, how long every worker has
     * to return before the driver stops waiting for the rest; default half
     * the timeout, at least 1 s. progress_timeout_ns: abort the job when no
     * replica has entered a phase or returned for this long (a replica
     * spinning where no collective times out); default twice the timeout
     * (three times with parameter servers), at least 1 s. */
    int64_t watchdog_grace_ns;
    int64_t progress_timeout_ns;

    /* Mixed precision (dsim/precision.h): Keras's policy (DEFAULT: float32)
     * and the dtype the strategy all-reduces gradients in (F32, F16 or BF16;
     * Horovod's fp16 compression). */
    dsim_precision_policy precision;
    dsim_dtype gradient_dtype;
    /* A TPU slice (dsim/tpu.h; all zero: none). No TPU is used: the slice
     * gives the job its shape -- hosts and devices_per_host must be its
     * hosts and replicas per host -- and the replicas' places on its torus:
     * the world communicator carries them (the torus algorithm runs over
     * them), the strategy sees the slice in its shape, and a network model
     * on the transport may route over its ICI. */
    dsim_tpu_topology tpu;
    /* Static shapes only: TPUStrategy with TF's RunOptions.
     * experimental_enable_dynamic_batch_size false. dsim_train refuses,
     * before anything runs, a job in which some replica's batch in some step
     * is not global_batch / replicas (see dsim_train_check_static_shapes). */
    bool static_shapes;
    /* What communication AUTO runs on the world communicator and the
     * strategy's sub-communicators (dsim_comm_set_decide; NULL: the built-in
     * decision): dsim's harness passes a cost model of the scenario's
     * network. */
    dsim_decide_fn decide;
    void *decide_user;
} dsim_train_cfg;

/* With cfg->static_shapes, DSIM_OK when every replica's batch in every step
 * of an epoch is exactly global_batch / replicas, as static shapes need;
 * else DSIM_EINVAL saying which (a global batch the replicas do not divide,
 * or the first step and replica whose batch is short: a partial last batch)
 * and the fix. DSIM_OK without static_shapes. Reads the data's layout
 * (cfg->dataset, or cfg->data's examples and files), O(examples). */
DSIM_API dsim_err dsim_train_check_static_shapes(const dsim_train_cfg *cfg);

/* DSIM_OK when the built-in strategy cfg->strategy (not a plugin) runs the
 * options cfg sets; else DSIM_EINVAL naming what it cannot run and the fix:
 * parameter_server refuses strategy.gradient_dtype, global_clipnorm and
 * mixed_float16 (its servers apply the gradients shard by shard),
 * central_storage gradient_dtype (it sends the gradients to the host in
 * float32). dsim_train asks it before the job; a scenario asks it at each
 * of those keys, so a refusal names the key. */
DSIM_API dsim_err dsim_train_check_builtin(const dsim_train_cfg *cfg);

/* Defaults: 1 host x 1 device, no ps (sync), AUTO, 30 s timeout, a health
 * check every 30 s with a 10 s timeout and 3 retries, threads,
 * sgd with Keras' defaults, shard AUTO, global batch 32, 1 epoch, seed 1,
 * no checkpoints. Strategy, model and data are left for the caller. */
DSIM_API void dsim_train_cfg_init(dsim_train_cfg *cfg);

/* The detection bound of a job (dsim_detection_bound, dsim/health.h): the
 * longest time after a replica is lost until every survivor has returned an
 * error, given cfg's timeout and, when the job runs one (see
 * health_interval_ns), its health check. DSIM_NO_DEADLINE: never (no timeout
 * and no health check: the survivors wait for ever). */
DSIM_API int64_t dsim_train_detection_bound(const dsim_train_cfg *cfg);
/* 1 if a job of cfg's shape runs the health check (two or more workers, no
 * parameter servers, an interval, not timing only). */
DSIM_API int dsim_train_runs_health_check(const dsim_train_cfg *cfg);

/* One parameter-server update. */
typedef struct dsim_ps_update {
    int replica;
    int server;
    uint64_t global_step;     /* the replica's step */
    uint64_t version_read;    /* server version the replica computed with */
    uint64_t version_applied; /* server version when it was applied */
    uint64_t staleness;       /* version_applied - version_read */
} dsim_ps_update;

typedef struct dsim_train_result {
    char strategy[32];
    int placement; /* dsim_var_placement (dsim/spi/strategy.h) */
    int num_workers, devices_per_host, num_replicas, num_ps;
    int num_replicas_in_sync;
    float loss_scale; /* what each replica's loss sum was multiplied by */
    dsim_shard_policy shard_applied;
    uint64_t steps_per_epoch;
    uint64_t first_step; /* global step of the first step run (> 0 after a restore) */
    uint64_t steps;      /* steps run */

    size_t n_params;
    float *params;           /* replica 0's variables at the end */
    bool replicas_agree;     /* every replica ended with the same bits */
    bool in_sync_every_step; /* every replica had the same bits after every step */
    double initial_loss;     /* mean per-example loss over the dataset, at the start */
    double final_loss;       /* ... and at the end (replica 0's variables) */

    double *loss;             /* [steps]: replica 0's reduced loss (NaN: not reduced) */
    double *local_loss;       /* [steps * num_replicas] */
    uint64_t *checksum;       /* [steps * num_replicas]: after each step */
    uint64_t *examples;       /* [steps * num_replicas] */
    uint64_t *padded;         /* [steps * num_replicas]: padding rows each replica's step
                                 computed on and masked (a strategy that pads to a static
                                 batch, dsim_strategy_ops.feed; 0 for the others) */
    uint64_t padded_total;    /* their sum */
    int64_t *step_ns;         /* [steps * num_replicas]: each step's time, start to end */
    int64_t *comm_ns;         /* ... of which in apply_gradients and the loss's reduction
                                 (the exchange, waits for slower replicas included) */
    float *trace;             /* [trace_rows * n_params] if cfg.record_params, else NULL: row j
                                 the variables after the run's step (j + 1) * trace_every */
    uint64_t trace_rows;      /* steps / trace_every */
    uint32_t trace_every;     /* cfg.trace_every, at least 1 */
    float *initial_params;    /* [n_params] if cfg.record_params: the variables before the
                                 first step run (restored ones after a restore) */
    float *trace_grad;        /* [trace_grad_rows * n_params] if cfg.record_grads and any
                                 update was given a gradient to keep, else NULL: row j the
                                 gradient the update applied at the run's step
                                 j * trace_every, as the strategy gave it to the optimizer
                                 (before any clip): replica 0's, or the parts the replicas'
                                 optimizers of parts applied (dsim_optim_set_part); NaN
                                 where that step applied none, or where no part covers
                                 (an optimizer of a part that did not say which) */
    uint64_t trace_grad_rows; /* ceil(steps / trace_every) */
    float *trace_slots;       /* [trace_grad_rows * S * n_params], S = dsim_optim_rule_slots,
                                 under an adaptive optimizer with trace_grad and
                                 trace_every > 1, else NULL: row j the rule's slots
                                 before that update (adam's m then v, n_params
                                 each; where the optimizers of parts applied it,
                                 each part's at its place), NaN as trace_grad */

    dsim_ledger *ledger; /* who read what (replica = worker * D + device) */

    dsim_ps_update *updates; /* parameter servers: every update, by server then order */
    size_t n_updates;
    uint64_t max_staleness;

    dsim_train_replica_end *replicas; /* [num_replicas]: how each replica ended */
    int64_t t_start;                  /* dsim_rt_now when the workers were started */
    uint64_t initial_checksum;        /* dsim_params_checksum of the initial variables */

    uint64_t checkpoints_written;
    uint64_t *checkpoint_writes; /* [num_replicas]: files written by each replica */

    bool preempted;        /* stopped by a preemption notice (DSIM_EPREEMPTED): restart
                              from the checkpoint, with restore */
    uint64_t preempted_at; /* global steps done when it stopped: the checkpoint's */

    /* The flight recorders as the job ended (dsim/comm.h): [n_flight], the
     * first num_replicas those of every replica's world communicator, by
     * replica, then those of the sub-communicators the strategy made from
     * it (dsim_comm_flight_dump_subs: each replica's in turn, each naming
     * its communicator and its ranks' world ranks); NULL when the job never
     * formed. What a harness writes out after a failure. */
    dsim_fr_dump *flight;
    int n_flight;

    /* The exchange the strategy actually made: what replica 0's
     * apply_gradients called in the first step it ran, as
     * dsim_comm_exchange_end writes it ("ring" for one all-reduce on the
     * world communicator; "reduce on sub-communicator 2913746501 (4 ranks)
     * + allreduce(ring) on sub-communicator 811942093 (2 ranks) + ..." for a
     * strategy's own scheme); "" when it called no collective (parameter
     * servers, point-to-point messages) or failed before. */
    char exchange[256];

    /* dsim_train_reference only: the optimizer's slots (whole-model layout
     * of dsim/optim.h) and step when it ended. NULL / 0 from dsim_train,
     * whose optimizers belong to the strategy. */
    float *optim_state;
    size_t optim_state_len;
    uint64_t optim_step;

    /* cfg.probe_restore on a restored job: the chief's save() right after
     * the restore (has_restored), in the driver's layout. */
    bool has_restored;
    float *restored_params;      /* [n_params] */
    float *restored_optim_state; /* [restored_optim_state_len] */
    size_t restored_optim_state_len;
    uint64_t restored_optim_step;

    dsim_error error; /* the failure, when dsim_train did not return DSIM_OK */

    /* DSIM_EHUNG: the workers left running, replicas first. */
    dsim_train_stuck *stuck;
    size_t n_stuck;

    /* The event trace's hash (dsim_rt_trace), ending with the outcome and
     * the final parameters' checksum; 0 unless the engine is deterministic
     * (sim). Equal scenario and seed give equal hashes. */
    uint64_t trace_hash;
    uint64_t trace_events;

    /* Mixed precision: the policy run (never DEFAULT) and the gradients'
     * all-reduce dtype; every replica's loss scale at each step (the one its
     * gradient was computed with) and whether it skipped that step's update;
     * replica 0's skipped updates and its loss scale at the end. */
    dsim_precision_policy precision;
    dsim_dtype gradient_dtype;
    float *mp_scale;     /* [steps * num_replicas] */
    uint8_t *mp_skipped; /* [steps * num_replicas]: 1 skipped, 0 applied */
    /* [steps * num_replicas] (the reference: [steps]): the global norm of
     * the gradient each step's update applied (dsim_train_step_info.grad_norm);
     * NaN where not known. */
    double *grad_norm;
    uint64_t skipped_steps;
    float final_loss_scale;

    /* The strategy's input_fn made every replica's batches
     * (distribute_datasets_from_function); no shard policy was applied. */
    bool input_from_strategy;

    /* dsim_train_reference / _follow with record_params: [steps], the
     * Euclidean norm of each step's update (after - before, over the
     * parameters). */
    double *update_norm;

    /* dsim_train_reference_follow(_run) only, else NULL. [trace_rows]: for
     * the span of the run's row j (the trace_every steps that end there),
     * the Euclidean distance of the replay's variables at its end from the
     * run's row j, the size of a float rounding of each variable there
     * (the norm of their ulps), and the path of the span (the sum of its
     * steps' update_norm). [trace_grad_rows] (following a run with
     * trace_grad): at the first step of each span, where the replay starts
     * from the run's variables, the distance of its gradient from the
     * run's row of trace_grad (NaN where that row is), the norm of their
     * ulps, and the norm of its gradient; and which elements are off by
     * more than 1 % of their size (beyond 1e-4 of the gradient's root mean
     * square): how many, the first and the last. */
    double *follow_dist, *follow_ulps, *follow_path;
    double *follow_grad_dist, *follow_grad_ulps, *follow_grad_norm;
    uint64_t *follow_grad_off, *follow_grad_lo, *follow_grad_hi;
    /* ... and with trace_every 1, the distance of the run's row j from one
     * device's gradient of the step before (at the run's variables of that
     * step; NaN at row 0): a strategy that applies each gradient a step
     * late is that close to it. */
    double *follow_grad_prev;
    /* ... and with cfg.follow_parting, [trace_rows]: the distance of the
     * second replay's variables at the end of span j from the first's (NaN
     * where it did not run: a mixed policy). */
    double *follow_part;

    /* dsim_train (n_vars and vars: the reference too): the model's
     * variables (dsim_model_vars of the model it trained, its sizes taken
     * from the data where cfg.model left them 0),
     * and [steps * num_replicas * DSIM_MODEL_MAX_VARS], as checksum but per
     * variable: a 16-bit signature of each, 0 past n_vars and where the step
     * was not kept. Where two replicas' checksums differ after a step, the
     * variables whose signatures differ are those they parted in. */
    size_t n_vars;
    dsim_model_var vars[DSIM_MODEL_MAX_VARS];
    uint16_t *var_sig;
} dsim_train_result;

/* Runs the job. On failure returns the error of the replica or server that
 * failed first (the message names it) after every replica has returned: a
 * failing replica aborts the fabric so nobody waits for it. DSIM_EPREEMPTED
 * when a preemption notice stopped it after saving its checkpoint (see
 * preempt_after): not a failure, a request to be restarted; the result is
 * filled as for a run that ended there. *res is filled as far as the run
 * got; release it with dsim_train_result_free either way.
 *
 * The watchdog: no call outlives its bounds, whatever a strategy's code
 * does. Once the job has failed, every worker has watchdog_grace_ns to
 * return (an honest one is woken by the abort at once, or finishes the
 * step it is computing). When no replica has entered a phase or returned
 * for progress_timeout_ns (every replica spinning, or a one-device replica
 * that never reaches a collective that could time out), the driver aborts
 * the job itself with DSIM_ETIMEDOUT, and the grace runs from then. After
 * the grace the driver stops waiting: it returns DSIM_EHUNG, naming the
 * workers left running and where each was (res->stuck; the stuck replicas'
 * res->replicas[r] have status DSIM_EHUNG), with the failure that began it
 * in the message.
 *
 * What a worker left running may still use, the job's state (fabric,
 * communicators, buffers, this result's arrays, a copy of cfg), is
 * reference-counted: the driver and every worker hold a reference and the
 * last to let go frees it, so a worker that comes back later touches
 * nothing freed. It stops at its next phase. On DSIM_EHUNG the arrays a
 * worker writes (params, loss, local_loss, checksum, examples, trace,
 * ledger, checkpoint_writes, updates) are NULL in *res; replicas is a copy.
 * The caller's own memory is reached only through the observer and the
 * hooks, which are called through a gate the driver closes (and waits on)
 * before it returns, so neither is called after dsim_train returns unless
 * a worker was already inside one and stuck there (res->stuck[i].callback
 * says so: then their user data must be left alive). Two things must
 * always outlive a hung job: a borrowed cfg->dataset and
 * cfg->transport_filter_user (the fabric's filter keeps using it). A worker's thread is detached,
 * not joined (threads engine); dsim_train_abandoned_jobs counts the jobs still waiting for theirs.
 */
DSIM_API dsim_err dsim_train(const dsim_train_cfg *cfg, dsim_train_result *res);

/* Replays the global batches of cfg on one device from the same initial
 * variables: at each step the batches of all replicas, concatenated in
 * replica order, in one dsim_model_loss_grad call with scale 1/global_batch,
 * then the same optimizer. Ignores the strategy, servers and checkpoints;
 * stops after cfg->stop_after global steps when that is set. Fills params,
 * steps, loss, trace and update_norm (if record_params), initial/final loss, the
 * optimizer's final slots and step, ledger (as replica 0); num_replicas
 * is 1. */
DSIM_API dsim_err dsim_train_reference(const dsim_train_cfg *cfg, dsim_train_result *res);

/* The same replay, step by step from a run's variables: before its step s
 * (s >= 1) it takes rows[(s - 1) * n_params ..] as its variables (its
 * optimizer state and loss scale stay its own), so each of its steps
 * starts where the run's step did and res->trace (with record_params) is
 * where one device takes the run from there. It runs min(n_rows + 1, the
 * job's) steps. With cfg->trace_every = k > 1 the rows are a trace kept
 * every k steps (dsim_train_result.trace): it takes row j before its step
 * (j + 1) * k, runs min((n_rows + 1) * k, the job's) steps and keeps its
 * own trace every k steps, so each of its rows is where one device takes
 * the run's variables k steps on. Fills res->follow_dist, follow_ulps and
 * follow_path. gradient_consistency uses it to tell float rounding built
 * up over many steps from a step computed wrong. */
DSIM_API dsim_err dsim_train_reference_follow(const dsim_train_cfg *cfg, const float *rows,
                                              uint64_t n_rows, dsim_train_result *res);

/* The same replay following a run's result: its trace (rows, trace_rows)
 * and, where it has one, its trace_grad, which each first step of a span
 * is compared with (res->follow_grad_dist ...). */
DSIM_API dsim_err dsim_train_reference_follow_run(const dsim_train_cfg *cfg,
                                                  const dsim_train_result *run,
                                                  dsim_train_result *res);

DSIM_API void dsim_train_result_free(dsim_train_result *res);

/* ---- comparing parameters ---- */

/* A 64-bit checksum of the n floats' bytes (little-endian, len = 4n): eight
 * lanes of FNV-1a's xor-multiply over 64-bit words, then a final mix, so not
 * FNV-1a 64 itself. Lane k starts at 0xcbf29ce484222325 + 0x9e3779b97f4a7c15
 * * k; each whole 64-byte block's word k (little-endian u64) goes into lane k
 * as h = (h ^ w) * 0x100000001b3. Then r = len; the bytes past the last
 * whole block: r = (r ^ byte) * 0x100000001b3; then for k = 0..7: r =
 * mix(r ^ mix(h[k] + k)), mix(h) = h ^= h >> 33, h *= 0xff51afd7ed558ccd,
 * h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53, h ^ (h >> 33); all mod 2^64.
 * `dsim export` writes the same text in its manifest, and
 * examples/compare/replay.py computes it in Python. */
DSIM_API uint64_t dsim_params_checksum(const float *p, size_t n);

typedef struct dsim_params_diff {
    double max_abs;    /* max |a - b| */
    double max_rel;    /* max |a - b| / max(|a|, |b|), 0 where both are 0 */
    uint64_t max_ulps; /* max distance in float ulps (UINT64_MAX if a NaN differs) */
    size_t worst;      /* index of max_abs */
    size_t n_diff;     /* elements whose bits differ */
} dsim_params_diff;

DSIM_API void dsim_params_compare(const float *a, const float *b, size_t n, dsim_params_diff *out);

/* ---- checkpoints ---- */

/* A checkpoint file: little-endian, written to PATH.tmp, fsync'ed and
 * renamed over PATH (then the directory fsync'ed), so a reader sees the old
 * file or the new one, never half of one. Version 2 (written now):
 *   0  magic "DSIMCKPT"   8  u32 version (2)   12 u32 optimizer kind
 *   16 u32 epoch          20 u32 flags (bit 0 shuffle, bit 1 drop_remainder)
 *   24 u64 step (within the epoch)   32 u64 global_step
 *   40 u64 n_params       48 u64 optim_step    56 u64 optim_state_len
 *   64 u64 global_batch   72 u32 hosts         76 u32 devices_per_host
 *   80 u32 shard policy applied (dsim_shard_policy)   84 u32 files (0: no files)
 *   88 u64 examples       96 u64 seed         104 u64 steps_per_epoch
 *   112 u32 epochs        116 f32 loss scale  120 u32 its counter
 *   124 u32 1 when 116 and 120 hold the dynamic loss scale, else 0
 *   128 f32 params[n_params]  f32 optim_state[optim_state_len]
 *   u64 FNV-1a 64 of every byte before it.
 * Version 1 has the same first 64 bytes (20: 0), then the floats: it does
 * not say which job wrote it. dsim_checkpoint_read reads both (version 1
 * with the job fields 0); dsim_train refuses to resume from version 1,
 * because it cannot check that the file belongs to the job. */
#define DSIM_CHECKPOINT_VERSION 2u

typedef struct dsim_checkpoint {
    uint32_t version; /* of the file read; dsim_checkpoint_write writes the current one */
    uint32_t epoch;   /* where to resume: (epoch, step) is the next step */
    uint64_t step;
    uint64_t global_step; /* steps done */
    dsim_optim_kind optim_kind;
    uint64_t optim_step;
    /* The job that wrote it (version 2): resuming needs the same global
     * batch and data layout, or the steps after the checkpoint would read
     * other examples than the interrupted run would have. */
    int64_t global_batch;
    uint32_t hosts, devices_per_host;
    dsim_shard_policy shard; /* as applied (AUTO resolved to FILE or DATA) */
    uint64_t n_examples;
    uint32_t n_files; /* 0: a source without files */
    bool shuffle, drop_remainder;
    uint64_t seed;
    uint64_t steps_per_epoch;
    uint32_t epochs; /* informational: a resumed job may run more */
    size_t n_params;
    float *params;
    size_t optim_state_len;
    float *optim_state;
    /* Mixed precision's dynamic loss scale after global_step, and its count
     * of finite steps since it last changed (Keras's LossScaleOptimizer
     * keeps both as variables, saved with the rest): a resumed job skips
     * and scales as the interrupted one would have. has_loss_scale false:
     * the job had none (float32, mixed_bfloat16), or a file written before
     * it was kept (the job then starts from the policy's initial scale). */
    bool has_loss_scale;
    float loss_scale;
    uint32_t loss_scale_counter;
} dsim_checkpoint;

DSIM_API dsim_err dsim_checkpoint_write(const char *path, const dsim_checkpoint *ck);
/* DSIM_ENOENT if the file is missing, DSIM_EIO on a read error, DSIM_EPROTO
 * if it is truncated or corrupt; the message names the file. */
DSIM_API dsim_err dsim_checkpoint_read(const char *path, dsim_checkpoint **out);
DSIM_API void dsim_checkpoint_free(dsim_checkpoint *ck);

#ifdef __cplusplus
}
#endif
#endif
