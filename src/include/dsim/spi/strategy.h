/* For people who write a distribution strategy: the ops table.
 *
 * A strategy decides where the variables live and how a step's gradients
 * turn into the next step's variables. It mirrors tf.distribute.Strategy and
 * StrategyExtended: check the cluster shape, create variables with a
 * placement, reduce per-replica values, apply gradients, save a checkpoint,
 * num_replicas_in_sync, is_chief. Everything else a training job does is the
 * driver's (src/strategy/train.c, dsim_train in dsim/strategy.h):
 *
 *   driver                                   strategy
 *   ------                                   --------
 *   check_shape(shape)                       accept or refuse hosts x devices, ps
 *   one runtime worker per replica:
 *     replica_init(ctx)                      set up ctx->priv (optimizer, buffers)
 *     create_variables(ctx, init)            place the variables; ctx->params holds
 *                                            them on every replica on return
 *     for every step:
 *       input -> its worker's step; feed(ctx, step) -> this replica's batch
 *       grad = 0; loss_grad(ctx->params, batch, scale = 1/global_batch)
 *         [+ padding rows to the static batch, masked out]
 *       apply_gradients(ctx, grad)           ctx->params: next step's variables
 *       reduce(ctx, SUM, local loss)         the step's loss
 *       [save(ctx, vars) when a checkpoint is due; the chief's is written]
 *     finish(ctx)                            ctx->params: the job's final variables
 *     replica_fini(ctx)
 *   one runtime worker per (parameter server, replica), if num_ps > 0:
 *     server_init(srv) once per server, serve(srv, client), server_fini(srv)
 *
 * Loss scaling (TF's compute_average_loss): the driver scales each replica's
 * per-example loss sum, and so its gradient, by 1 / (per-replica batch *
 * num_replicas_in_sync) = num_replicas / (global_batch *
 * num_replicas_in_sync), which is 1/global_batch for a strategy whose
 * replicas are all in sync. The gradients a replica hands apply_gradients are
 * therefore already averaged over the global batch: a synchronous strategy
 * must SUM them over the replicas. MEAN would divide the learning rate by the
 * number of replicas, which dsim's reference comparison catches.
 *
 * Rules of the table (as for transports and engines):
 *   - const, `size` first (sizeof(struct dsim_strategy_ops), checked at
 *     registration), designated initializers;
 *   - the members marked "required" are checked at registration
 *     (DSIM_EINVAL naming the member); an optional member left NULL gets the
 *     behaviour its comment states;
 *   - src/strategy/strategy.c is the only caller of these members.
 *
 * A strategy in a shared object exports one function named
 * DSIM_STRATEGY_PLUGIN_SYMBOL (see dsim_strategy_plugin_fn) and is loaded
 * with dsim_strategy_load (dsim/strategy.h); examples/custom_strategy is a
 * worked example. */
#ifndef DSIM_SPI_STRATEGY_H
#define DSIM_SPI_STRATEGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/comm.h"
#include "dsim/data.h"
#include "dsim/err.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/precision.h"
#include "dsim/reduce.h"
#include "dsim/data.h"
#include "dsim/rt.h"
#include "dsim/strategy.h"
#include "dsim/tpu.h"
#include "dsim/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever struct dsim_strategy_ops or the context structs below
 * change incompatibly, or what the driver promises a strategy changes; a
 * plugin built against another version is refused (dsim_strategy_load says
 * which version it has and that it must be rebuilt against this header). */
#define DSIM_STRATEGY_ABI_VERSION 2u

/* ---- ABI version 2: sub-communicators, hierarchical all-reduce, plugins in
 * every command ----
 *
 * What version 2 promises a strategy (and version 1 did not):
 *
 *   - ctx->world knows its hosts (dsim_comm_cfg.local_size =
 *     shape.devices_per_host; dsim_comm_host), and a strategy may build its
 *     own communicators from it: dsim_comm_split (collective over the
 *     world: every replica calls it at the same point, e.g. in
 *     replica_init or create_variables) and dsim_comm_create_group, freed
 *     with dsim_comm_free in replica_fini (dsim/comm.h). Their traffic goes
 *     through the job's endpoints, fault layer, health check and network
 *     model; their collectives have the job's timeout and fingerprints; the
 *     driver keeps their flight records with the world's
 *     (dsim_train_result.flight) for `dsim trace desync`, and reports what
 *     apply_gradients called on them (dsim_train_result.exchange: "reduce
 *     on sub-communicator ... + allreduce(ring) on ...") wherever a run's
 *     exchange is named (the report, the trace, the what-if summary).
 *   - ctx->algo may be DSIM_ALGO_HIERARCHICAL.
 *   - A synthetic model (timing only, under the sim engine) runs a plugin's
 *     own schedule: replica_init, create_variables, then per step
 *     apply_gradients and reduce, then finish and replica_fini, on a
 *     virtual ctx->world (dsim_comm_virtual) whose sub-communicators are
 *     virtual too; ctx->params, the initial values and the gradient are
 *     scratch that every replica shares, their values meaningless; the
 *     optimizer is SGD. `dsim whatif` of a scenario that names a plugin
 *     times the plugin's exchange this way.
 *   - Communicator ids: below 2^31 a program's own (DSIM_STRATEGY_COMM_USER
 *     up to 0x7FFFFFFF for a strategy's messages); from 2^31 up, the ids
 *     derived for sub-communicators (never pass those to dsim_comm_create).
 *
 * Version 2 also brings (for TPUStrategy and any strategy that feeds its
 * replicas itself): the feed member (which examples of its worker's step a
 * replica computes on, padded to a static batch and masked), and the job's
 * global batch and TPU slice in the shape.
 *
 * ---- end of ABI version 2's additions ---- */

/* The function every strategy plugin exports. It stores the ABI version the
 * plugin was compiled with (DSIM_STRATEGY_ABI_VERSION) in *abi_version and
 * returns the plugin's ops table (static storage; never freed). */
#define DSIM_STRATEGY_PLUGIN_SYMBOL "dsim_strategy_plugin"
typedef const struct dsim_strategy_ops *dsim_strategy_plugin_fn(uint32_t *abi_version);

/* Communicator ids. The driver's communicator over every replica uses
 * DSIM_STRATEGY_COMM_WORLD; ids below DSIM_STRATEGY_COMM_USER are reserved
 * for the driver (2 and 3 carry the health check's pings and answers,
 * dsim/health.h; DSIM_STRATEGY_COMM_CONTROL the replicas' agreement on where
 * to stop after a preemption notice), and a strategy sends its own messages
 * (dsim_isend) with ids from DSIM_STRATEGY_COMM_USER up to 0x7FFFFFFF (the
 * ids above are its sub-communicators', see above). */
#define DSIM_STRATEGY_COMM_WORLD   1u
#define DSIM_STRATEGY_COMM_CONTROL 4u
#define DSIM_STRATEGY_COMM_USER    16u

/* Where a strategy keeps the variables (informational: reported in
 * dsim_train_result.placement). */
typedef enum dsim_var_placement {
    DSIM_PLACE_UNSPECIFIED = 0,
    DSIM_PLACE_ONE_DEVICE, /* one copy, on the only replica */
    DSIM_PLACE_MIRRORED,   /* a copy on every replica, kept identical */
    DSIM_PLACE_CENTRAL,    /* one copy on the host (the chief's worker) */
    DSIM_PLACE_SHARDED,    /* split over the parameter servers */
    DSIM_PLACE_COUNT
} dsim_var_placement;

/* "unspecified", "one_device", "mirrored", "central", "sharded". */
DSIM_API const char *dsim_var_placement_name(dsim_var_placement p);

/* The cluster a job asks for. */
typedef struct dsim_strategy_shape {
    int hosts;            /* workers (TF tasks), >= 1 */
    int devices_per_host; /* >= 1 */
    int num_replicas;     /* hosts * devices_per_host */
    int num_ps;           /* parameter servers, >= 0 */
    dsim_ps_mode ps_mode; /* what the job asked of the parameter servers */
    int64_t global_batch; /* the job's global batch (dsim_train_cfg.global_batch) */
    /* The TPU slice the job runs on (dsim_train_cfg.tpu), or NULL: its hosts
     * and replicas per host are hosts and devices_per_host. Owned by the
     * driver; valid while the job lasts. */
    const dsim_tpu_topology *tpu;
} dsim_strategy_shape;

/* Everything a checkpoint holds about the variables: the parameters and the
 * optimizer's slots in the whole-model layout of dsim/optim.h. */
typedef struct dsim_strategy_vars {
    size_t n_params;
    float *params;          /* n_params floats */
    size_t optim_state_len; /* dsim_optim_state_len for n_params parameters */
    float *optim_state;     /* optim_state_len floats (NULL when 0) */
    uint64_t optim_step;    /* updates applied (TF's optimizer.iterations) */
    /* save() only, where the replicas are not in step (asynchronous
     * parameter servers): resume_before set says that some replica's steps
     * before the chief's are not all applied yet (a lost worker's, say):
     * the checkpoint then resumes at global step resume_step, so that no
     * step is skipped (the steps after it run again: at least once, as
     * TF's coordinator runs a closure). The driver clears it before save(). */
    bool resume_before;
    uint64_t resume_step;
} dsim_strategy_vars;

/* One replica's view of the job. The driver fills every field before
 * replica_init and owns them; the strategy reads them, writes ctx->params,
 * its own ctx->priv and the mixed-precision state at the end
 * (loss_scale, gradient_dtype_applied), and nothing else. */
typedef struct dsim_replica_ctx {
    dsim_strategy_shape shape;
    int replica; /* worker * devices_per_host + device; also this replica's rank */
    int worker;
    int device;
    dsim_rt *rt;
    dsim_fabric *fabric;
    dsim_ep *ep;        /* this replica's endpoint (rank = replica) */
    dsim_comm *world;   /* every replica, comm id DSIM_STRATEGY_COMM_WORLD, set to the
                           job's all-reduce algorithm (algo below) */
    dsim_algo algo;     /* the job's `communication` option */
    int server_rank0;   /* rank of parameter server 0 (= num_replicas); server s is
                           server_rank0 + s */
    int64_t timeout_ns; /* bound for every wait, as dsim_rt_deadline takes it: > 0 ns,
                           or -1 when the job has no timeout (collectives use it
                           already) */
    const dsim_model_spec *model;
    const dsim_optim_spec *optim;
    size_t n_params;
    float *params;        /* n_params floats: the variables this replica's next step reads */
    uint64_t global_step; /* the step being run, counting from 0 over the whole job
                             (restored steps included); in create_variables the
                             first step to run: > 0 after a restore */
    void *priv;           /* replica_priv_size bytes, zeroed, 16-byte aligned */

    /* Mixed precision (dsim/precision.h); appended, so a table built before
     * them still reads the fields above where they were. */
    dsim_precision_policy precision; /* the job's policy (never DEFAULT) */
    dsim_dtype gradient_dtype;       /* the dtype the gradients are all-reduced in
                                        (strategy.gradient_dtype): F32, F16 or BF16 */
    /* This replica's loss scale. The driver computed this step's gradient
     * with loss_scale.scale and unscaled it; apply_gradients must test the
     * AGGREGATED gradient and call dsim_loss_scale_record once (or
     * dsim_strategy_apply_scaled, which does both), on every replica. Under
     * mixed_float16 a step whose apply_gradients never recorded it fails. */
    dsim_loss_scale loss_scale;
    /* Set by dsim_strategy_allreduce_grad; under a gradient_dtype other than
     * F32 a step that did not set it fails (the strategy ignored it). */
    bool gradient_dtype_applied;
} dsim_replica_ctx;

/* One parameter server. serve() runs once per client replica, each on its own
 * runtime worker, all sharing this context: guard shared state with `lock`
 * (dsim_waitq_lock/unlock; wait on it with dsim_waitq_wait, woken by
 * dsim_waitq_wake). The driver wakes `lock` when the job is aborted, so a
 * waiter re-tests dsim_fabric_aborted(srv->fabric) with its condition. */
typedef struct dsim_server_ctx {
    dsim_strategy_shape shape;
    int server; /* 0 .. num_ps - 1 */
    int rank;   /* num_replicas + server */
    dsim_rt *rt;
    dsim_fabric *fabric;
    dsim_ep *ep; /* this server's endpoint, shared by its serve() workers */
    dsim_waitq *lock;
    int64_t timeout_ns; /* as dsim_replica_ctx.timeout_ns: > 0 ns, or -1 for none */
    const dsim_model_spec *model;
    const dsim_optim_spec *optim;
    size_t n_params;
    void *priv;   /* server_priv_size bytes, zeroed, 16-byte aligned */
    void *driver; /* the driver's; do not touch */
} dsim_server_ctx;

/* What one replica computes on in one step (the feed member below). */
typedef struct dsim_replica_feed {
    const uint64_t *ids; /* the examples, ids of the dataset (n of them) */
    uint64_t n;
    /* Rows the step computes on: n (dynamic shapes), or more when the
     * strategy pads a short batch to a static shape, as TPUStrategy does
     * with experimental_enable_dynamic_batch_size: rows n .. static_batch-1
     * are padding (zero features and targets). 0 reads as n. At most the
     * global batch, and at most the larger of the dataset's examples and a
     * replica's share of the global batch (ceil(global / replicas)). */
    uint64_t static_batch;
    /* What a padding row weighs in the loss and the gradient: 0 masks the
     * padding out, which is what TensorFlow does (the padded examples'
     * sample weights are 0). Anything else lets made-up examples into the
     * gradient: a bug, which the comparison with the one-device reference
     * (gradient_consistency) catches. */
    float padding_weight;
} dsim_replica_feed;

struct dsim_strategy_ops {
    size_t size;         /* sizeof(struct dsim_strategy_ops) */
    const char *name;    /* required: [a-z0-9_]+, at most 31 characters */
    const char *summary; /* one line for `dsim list`; optional */
    dsim_var_placement placement;
    size_t replica_priv_size; /* bytes of ctx->priv per replica */
    size_t server_priv_size;  /* bytes of srv->priv per parameter server */

    /* Required. Accepts or refuses the cluster before anything starts.
     * Refusal: DSIM_EINVAL with a message naming the shape asked for and the
     * shapes accepted, e.g. "mirrored runs on one worker; got 2 hosts x 2
     * devices (use multi_worker_mirrored)". */
    dsim_err (*check_shape)(const dsim_strategy_shape *shape);

    /* Optional (NULL: shape->num_replicas). How many replicas contribute to
     * one update: the denominator of TF's loss scaling, with the global
     * batch. An asynchronous strategy, where each replica's update stands
     * alone, returns 1. */
    int (*num_replicas_in_sync)(const dsim_strategy_shape *shape);

    /* Optional (NULL: nothing to do). Called on every replica's worker before
     * create_variables; sets up ctx->priv. On failure replica_fini is still
     * called. */
    dsim_err (*replica_init)(dsim_replica_ctx *ctx);

    /* Optional. Releases what replica_init and later calls kept in ctx->priv.
     * Called once per replica, after any failure too. */
    void (*replica_fini)(dsim_replica_ctx *ctx);

    /* Required. Creates the variables with the strategy's placement. `init`
     * is non-NULL on the chief replica only (replica 0): the initial values,
     * fresh or restored from a checkpoint, with the optimizer's slots and
     * step. Other replicas get NULL and obtain the values from the chief
     * (broadcast, parameter servers, ...), as TF initializes variables on the
     * chief. On return ctx->params holds the variables on every replica.
     * Collective: every replica calls it. */
    dsim_err (*create_variables)(dsim_replica_ctx *ctx, const dsim_strategy_vars *init);

    /* Required. grad (n_params floats, writable scratch) is this replica's
     * gradient, already scaled (see the top of this file). Combines the
     * replicas' gradients, updates the variables and leaves in ctx->params
     * the variables this replica's next step reads. A synchronous strategy
     * leaves the same bits on every replica. Called once per step on every
     * replica, empty batches included (their grad is zero). */
    dsim_err (*apply_gradients)(dsim_replica_ctx *ctx, float *grad);

    /* Required. out[i] = op over the replicas of in[i], for n doubles, as
     * tf.distribute.Strategy.reduce (op SUM or MEAN; others may be refused
     * with DSIM_EINVAL). Every replica gets the result. Collective. A
     * strategy whose replicas do not run in step returns DSIM_ENOTSUP, and
     * the driver reports the step's loss as not reduced (NaN). */
    dsim_err (*reduce)(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out, size_t n);

    /* Optional (NULL: DSIM_ENOTSUP, "strategy X does not support
     * checkpoints"). Fills `out` (arrays allocated by the driver, sized for
     * the whole model) with the job's variables as of the end of the current
     * step, on the replica for which is_chief is true; the driver writes
     * only that replica's. Called on every replica at the same step
     * (collective). */
    dsim_err (*save)(dsim_replica_ctx *ctx, dsim_strategy_vars *out);

    /* Optional (NULL: replica == 0). 1 on exactly one replica of the job:
     * the one that writes checkpoints (the chief task's first device), as
     * TF's extended.should_checkpoint. The driver asks it for every replica
     * before the job starts, with a context that holds only shape, replica,
     * worker, device and server_rank0 (before replica_init: no priv), and
     * refuses the job unless exactly one replica says 1. */
    int (*is_chief)(const dsim_replica_ctx *ctx);

    /* Optional (NULL: nothing to do). Called on every replica after its last
     * step, before replica_fini: leaves in ctx->params the job's final
     * variables (a parameter-server strategy pulls them once every replica
     * is done). */
    dsim_err (*finish)(dsim_replica_ctx *ctx);

    /* Optional (NULL: no work is ever re-run). Called on every replica
     * after its last step and before finish, again after each piece of work
     * it returns, until it sets *replica = -1: then every replica's steps
     * have been run (or the job cannot tolerate a lost replica, as a
     * synchronous one). Setting *replica = R >= 0 (another replica, lost)
     * with *from_step = S asks this replica to run R's steps S .. the end
     * of the job (TF's ClusterCoordinator re-running a failed worker's
     * closures, at least once): the driver feeds it R's batches and calls
     * apply_gradients for each, with ctx->global_step set to the step; the
     * strategy knows from its own state that these are R's steps. A step
     * before the job's first is taken as the first. */
    dsim_err (*lost_work)(dsim_replica_ctx *ctx, int *replica, uint64_t *from_step);

    /* Optional (NULL: nothing to set up). Called once per parameter server
     * before any serve(), on the driver's thread; sets up srv->priv. On
     * failure server_fini is still called and the job does not start. */
    dsim_err (*server_init)(dsim_server_ctx *srv);

    /* Optional (NULL: DSIM_ENOTSUP; a job with num_ps > 0 is then refused
     * before it starts, whatever check_shape says). Answers the
     * requests of one client replica until that client says it is done
     * (return DSIM_OK) or something fails (return the error; the driver
     * aborts the job). Runs on its own runtime worker, concurrently with the
     * server's other serve() calls. Every wait is bounded by
     * srv->timeout_ns. */
    dsim_err (*serve)(dsim_server_ctx *srv, int client);

    /* Optional. Releases srv->priv; after every serve() returned. */
    void (*server_fini)(dsim_server_ctx *srv);

    /* Optional (NULL: the replica computes on its own sub-batch of its
     * worker's step, st->batch[ctx->device], as it is). TF's
     * experimental_distribute_dataset as the strategy does it: which
     * examples of its worker's input step this replica's step computes on,
     * and the static batch it pads them to. The input pipeline is one per
     * worker (TF's input worker; for TPUStrategy, one per TPU host:
     * InputContext.num_input_pipelines is the number of hosts), and it has
     * already split the worker's share of the global batch over the
     * worker's replicas: st->batch[d] is device d's. out->ids must stay
     * valid until the step ends (point into st, or into ctx->priv). Called
     * once per step on every replica (ctx->global_step set), before its
     * gradient. The driver records out's examples in the coverage ledger
     * (padding is not recorded: nobody read it), computes the loss and the
     * gradient on them plus static_batch - n padding rows weighted by
     * padding_weight, and charges the modelled compute for all
     * static_batch rows. */
    dsim_err (*feed)(dsim_replica_ctx *ctx, const dsim_input_step *st, dsim_replica_feed *out);

    /* Optional (NULL: dsim's own pipeline, TF's
     * experimental_distribute_dataset: the job's shard policy, then the
     * global batch split over the replicas). TF's
     * distribute_datasets_from_function(input_fn): the strategy decides
     * which examples each replica reads. Called for each input pipeline
     * (one per worker) and epoch with TF's InputContext (dsim/data.h:
     * num_input_pipelines, input_pipeline_id, num_replicas_in_sync;
     * dsim_input_context_per_replica_batch gives the per-replica batch) and
     * the dataset's description; appends that pipeline's elements, each one
     * replica's batch of example ids, in order (dsim_input_batches_add):
     * element k goes to the worker's local replica k % devices at step
     * k / devices. Called on every replica, by the one-device reference
     * and by `dsim plan`, so it keeps no state and gives the same answer
     * each time. What the replicas read is recorded as read, so
     * shard_coverage judges this choice. */
    dsim_err (*input_fn)(const dsim_input_context *ic, uint32_t epoch, dsim_input_batches *out);
};

/* Registers a strategy under ops->name; required members are checked
 * (DSIM_EINVAL naming the member). Registering the same table twice is a
 * no-op; another table under a taken name is DSIM_EINVAL. The built-ins
 * (one_device, mirrored, multi_worker_mirrored, central_storage,
 * parameter_server) register themselves on first use. */
DSIM_API dsim_err dsim_strategy_register(const struct dsim_strategy_ops *ops);

/* What a registered strategy says of a job's shape, asked as dsim_train
 * asks it before a job starts; for tools that fit a job to a strategy
 * (dsim conformance). */
typedef struct dsim_strategy_traits {
    int replicas_in_sync; /* its num_replicas_in_sync for the shape: fewer than
                             shape->num_replicas for an asynchronous strategy */
    int can_save;         /* 1: it has save (checkpoints), 0: not */
    int has_servers;      /* 1: it has serve (parameter servers), 0: not */
    dsim_var_placement placement;
} dsim_strategy_traits;

/* Fills *out for the strategy registered as `name` (built-ins included)
 * and returns whether it accepts `shape`: DSIM_OK, or its check_shape's
 * refusal with its message (DSIM_EINVAL, also for parameter servers
 * accepted by a strategy without serve). DSIM_ENOENT naming the registered
 * strategies when there is none of that name (*out is then zeroed). */
DSIM_API dsim_err dsim_strategy_probe(const char *name, const dsim_strategy_shape *shape,
                                      dsim_strategy_traits *out);

/* The input_fn of the strategy registered as `name`, as the input layer
 * takes it (dsim_input_config.input_fn, with *user as input_fn_user), or
 * NULL when it has none or there is no such strategy: for tools that show
 * what a job will read (dsim plan). */
DSIM_API dsim_input_fn dsim_strategy_input_fn(const char *name, void **user);

/* For parameter servers: records that `replica`'s update read at
 * version_read was applied when the server was at version_applied
 * (staleness = version_applied - version_read, in versions). Call it with
 * srv->lock held; the records come back in dsim_train_result.updates. */
DSIM_API dsim_err dsim_server_record_update(dsim_server_ctx *srv, int replica, uint64_t step,
                                            uint64_t version_read, uint64_t version_applied);

/* For apply_gradients: SUM-all-reduces n gradients over comm in
 * ctx->gradient_dtype, in place: float32 as they are; float16 or bfloat16
 * (Horovod's Compression.fp16) cast to that dtype, all-reduced in it (every
 * partial sum rounds to it) and widened back. Sets
 * ctx->gradient_dtype_applied. Collective over comm. */
DSIM_API dsim_err dsim_strategy_allreduce_grad(dsim_replica_ctx *ctx, dsim_comm *comm, float *grad,
                                               size_t n);

/* For apply_gradients, after the gradients are aggregated: Keras's
 * LossScaleOptimizer. Tests the n aggregated gradients for inf and NaN,
 * records the outcome in ctx->loss_scale (dsim_loss_scale_record) and, when
 * they are finite or the scale is fixed, applies them with opt to params;
 * otherwise skips the update (dsim_optim_skip). *applied (optional) says
 * which. Every replica that holds the same aggregated gradient decides
 * alike. */
DSIM_API dsim_err dsim_strategy_apply_scaled(dsim_replica_ctx *ctx, dsim_optim *opt, float *params,
                                             const float *grad, size_t n, bool *applied);

/* The contiguous share of n parameters that shard s of nshards holds, as
 * even as possible (the first n % nshards shards get one more):
 * [*first, *first + *count). */
DSIM_API void dsim_strategy_shard_range(size_t n, int nshards, int s, size_t *first, size_t *count);

#ifdef __cplusplus
}
#endif
#endif
