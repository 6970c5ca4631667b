/* Timing-only training: dsim_train of a synthetic model (cfg.synthetic_params
 * > 0), a model given by its parameter count and forward FLOPs per example
 * alone, with no weights and no data.
 *
 * Every replica runs the schedule of a mirrored strategy's step for real --
 * the same communicator, the same collective calls with their algorithms'
 * steps, peers and message sizes -- but on a communicator whose payloads
 * are virtual (dsim_comm_cfg.virtual_payload): each transfer carries its
 * length, not its bytes. So a ResNet-50-sized job (25.6 M parameters, 102 MB
 * of gradients per replica) allocates no gradient buffer at all, and a cost
 * model on the transport (the sim engine's network model, sim/fault) times
 * every message as if its bytes had moved.
 *
 *   replica r, step k:
 *     t0 --- charge(compute) ---> t1 --- allreduce(grads) --- allreduce(loss) ---> t2
 *            3 x flops x examples           P float32, SUM        1 float64, SUM
 *            / device_flops                 (apply_gradients)     (the loss's reduction)
 *
 *   step_ns = t2 - t0, comm_ns = t2 - t1, as dsim_train records them.
 *
 * Compute: forward + backward = 3 x the forward FLOPs (the backward pass
 * costs about twice the forward one) per example, at cfg.device_flops (the
 * device's achieved rate). The optimizer's update is not charged. A
 * strategy that pads short batches to a static shape (tpu) computes its
 * padding rows too: they are charged, as a TPU core runs them.
 *
 * On a TPU slice (cfg.tpu) the communicator carries the slice's torus, so
 * the torus algorithm runs its rings over the replicas' real places and a
 * network model that knows the slice (sim/fault) times them on its ICI.
 *
 * Only under the sim engine: on threads the charges are only counted and
 * the run would say nothing. The gradient buffer every replica passes is
 * one address range mapped PROT_NONE: a byte read or written by mistake
 * ends the process instead of going unnoticed.
 *
 * A strategy plugin runs its own schedule instead: its replica_init,
 * create_variables, then every step its apply_gradients and reduce, then
 * finish and replica_fini, with ctx->world virtual (dsim_comm_virtual says
 * so), so that every collective it calls -- on the world or on the
 * sub-communicators it splits from it, which inherit the virtual payloads
 * -- is timed as it would run. Its own arithmetic runs on real buffers
 * (it may copy, add, update), but on three scratch ranges shared by every
 * replica (the variables, the initial values and the gradient), mapped
 * without reserve so that only what it touches is ever allocated; their
 * values mean nothing. The optimizer is plain SGD (no slots per replica).
 * What the exchange was is recorded as for a real run
 * (dsim_train_result.exchange). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dsim/comm.h"
#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "dsim/spi/strategy.h"
#include "dsim/strategy.h"
#include "dsim/transport.h"
#include "strategy_int.h"

typedef struct tm_job tm_job;

typedef struct tm_rep {
    tm_job *job;
    int r;
    dsim_task *task;
    dsim_replica_ctx ctx; /* a plugin's */
} tm_rep;

struct tm_job {
    const dsim_train_cfg *cfg;
    dsim_train_result *res;
    dsim_rt *rt;
    dsim_fabric *fab;
    dsim_ep **eps;
    tm_rep *reps;
    int N;
    uint64_t steps;
    size_t count; /* gradient elements */
    void *grad;   /* the virtual gradient buffer (PROT_NONE) */
    size_t grad_map;
    /* A plugin's schedule: the strategy, the scratch the replicas share
     * (variables, initial values, gradient: grad_map bytes each), the
     * shape, the model and optimizer it is told of. */
    const dsim_strategy *strat;
    float *scratch[3];
    dsim_strategy_shape shape;
    dsim_model_spec model;
    dsim_optim_spec optim;
    int64_t timeout_ns;
    dsim_waitq *lock;
    bool failed;
    dsim_error err;
    /* The strategy whatever it is: its feed decides the rows a replica
     * computes on (a plugin's schedule runs only through strat above). */
    const dsim_strategy *feeder;
    dsim_comm_cfg torus; /* the slice's torus (cfg.tpu), else none */
    int *torus_rank;
    uint64_t *zero_ids; /* a step's worth of ids for the strategy's feed (all 0) */
};

/* Examples of replica r in step k: the global batch of that step split as
 * batch_sizes_for_worker splits it (floor, the first remainder one more). */
static uint64_t tm_examples(const tm_job *job, uint64_t k, int r)
{
    const dsim_train_cfg *cfg = job->cfg;
    uint64_t n = cfg->data.n_examples, G = (uint64_t)cfg->global_batch;
    uint64_t per_epoch = job->steps / (cfg->epochs ? cfg->epochs : 1);
    uint64_t kk = per_epoch ? k % per_epoch : 0;
    uint64_t b = n - kk * G < G ? n - kk * G : G;
    uint64_t N = (uint64_t)job->N, fl = b / N, rem = b - fl * N;
    return fl + ((uint64_t)r < rem ? 1 : 0);
}

/* The rows replica r computes on for ex examples: the strategy's static
 * batch when it pads (its feed, asked with a step of ex placeholder ids:
 * no example is read), else ex. */
static dsim_err tm_rows(const tm_job *job, int r, uint64_t ex, uint64_t *rows)
{
    const dsim_train_cfg *cfg = job->cfg;
    *rows = ex;
    if (!job->feeder->ops->feed)
        return DSIM_OK;
    int D = cfg->devices_per_host;
    dsim_replica_batch *all = malloc((size_t)D * sizeof *all);
    if (!all)
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for a step of %d devices", D);
    for (int d = 0; d < D; d++)
        all[d] = (dsim_replica_batch){.ids = job->zero_ids, .n = ex, .has_value = ex > 0};
    dsim_input_step st = {.replicas = D, .batch = all, .examples = ex * (uint64_t)D};
    dsim_replica_ctx ctx = {
        .shape = {.hosts = cfg->hosts,
                  .devices_per_host = D,
                  .num_replicas = job->N,
                  .global_batch = cfg->global_batch,
                  .tpu = cfg->tpu.replicas > 0 ? &cfg->tpu : NULL},
        .replica = r,
        .worker = r / D,
        .device = r % D,
    };
    dsim_replica_feed fd;
    dsim_err e = dsim_strategy_feed(job->feeder, &ctx, &st, (uint64_t)cfg->global_batch, &fd);
    free(all);
    if (e == DSIM_OK)
        *rows = fd.static_batch;
    return e;
}

static void tm_fail(tm_job *job)
{
    dsim_waitq_lock(job->lock);
    if (!job->failed) {
        job->failed = true;
        dsim_error_copy(&job->err);
    }
    dsim_waitq_unlock(job->lock);
}

/* One step's exchange: the mirrored schedule (the gradient's all-reduce,
 * then the loss's), or a plugin's own (apply_gradients, then reduce).
 * Replica 0's first step says what the exchange was. */
static dsim_err tm_exchange(tm_rep *rp, dsim_comm *comm, uint64_t k)
{
    tm_job *job = rp->job;
    int label = rp->r == 0 && k == 0;
    double loss = 0, out = 0;
    if (label)
        dsim_comm_exchange_begin(comm);
    dsim_err e;
    if (job->strat) {
        rp->ctx.global_step = k;
        e = dsim_strategy_apply_gradients(job->strat, &rp->ctx, job->scratch[2]);
    } else {
        e = dsim_allreduce(comm, job->grad, job->grad, job->count, DSIM_F32, DSIM_SUM);
    }
    if (label)
        dsim_comm_exchange_end(comm, job->res->exchange, sizeof job->res->exchange);
    if (e != DSIM_OK)
        return e;
    if (!job->strat)
        return dsim_allreduce(comm, &loss, &loss, 1, DSIM_F64, DSIM_SUM);
    e = dsim_strategy_reduce(job->strat, &rp->ctx, DSIM_SUM, &loss, &out, 1);
    return e == DSIM_ENOTSUP ? DSIM_OK : e;
}

/* A plugin's context and set-up: replica_init, then create_variables (the
 * chief with initial values). */
static dsim_err tm_plugin_start(tm_rep *rp, dsim_comm *comm, void *priv)
{
    tm_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    int r = rp->r;
    rp->ctx = (dsim_replica_ctx){
        .shape = job->shape,
        .replica = r,
        .worker = r / cfg->devices_per_host,
        .device = r % cfg->devices_per_host,
        .rt = job->rt,
        .fabric = job->fab,
        .ep = job->eps[r],
        .world = comm,
        .algo = cfg->communication,
        .server_rank0 = job->N,
        .timeout_ns = job->timeout_ns > 0 ? job->timeout_ns : -1,
        .model = &job->model,
        .optim = &job->optim,
        .n_params = job->count,
        .params = job->scratch[0],
        .priv = priv,
    };
    DSIM_CHECK(dsim_strategy_replica_init(job->strat, &rp->ctx));
    dsim_strategy_vars init = {.n_params = job->count, .params = job->scratch[1]};
    return dsim_strategy_create_variables(job->strat, &rp->ctx, r == 0 ? &init : NULL);
}

static void *tm_aligned_zalloc(size_t n)
{
    void *p = NULL;
    if (n == 0 || posix_memalign(&p, 16, (n + 15) & ~(size_t)15) != 0)
        return NULL;
    memset(p, 0, n);
    return p;
}

static void tm_replica_main(void *arg)
{
    tm_rep *rp = arg;
    tm_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    int N = job->N, r = rp->r;
    dsim_comm *comm = NULL;
    dsim_comm_cfg cc = job->torus;
    cc.ep = job->eps[r];
    cc.size = N;
    cc.comm_id = DSIM_STRATEGY_COMM_WORLD;
    cc.timeout_ns = job->timeout_ns;
    cc.algo = cfg->communication;
    cc.virtual_payload = 1;
    cc.local_size = cfg->devices_per_host;
    if (dsim_comm_create(&cc, &comm) != DSIM_OK) {
        tm_fail(job);
        return;
    }
    dsim_comm_set_decide(comm, cfg->decide, cfg->decide_user);
    dsim_train_result *res = job->res;
    void *priv = job->strat ? tm_aligned_zalloc(job->strat->ops->replica_priv_size) : NULL;
    dsim_err e = DSIM_OK;
    if (job->strat && job->strat->ops->replica_priv_size && !priv)
        e = DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for replica %d", r);
    else if (job->strat)
        e = tm_plugin_start(rp, comm, priv);
    if (e != DSIM_OK)
        tm_fail(job);
    for (uint64_t k = 0; e == DSIM_OK && k < job->steps; k++) {
        uint64_t ex = tm_examples(job, k, r), rows = ex;
        if ((e = tm_rows(job, r, ex, &rows)) != DSIM_OK) {
            tm_fail(job);
            break;
        }
        int64_t t0 = dsim_rt_now(job->rt);
        if (cfg->device_flops > 0)
            dsim_rt_charge(job->rt, (int64_t)llround(3.0 * cfg->synthetic_flops * (double)rows /
                                                     cfg->device_flops * 1e9));
        int64_t t1 = dsim_rt_now(job->rt);
        if ((e = tm_exchange(rp, comm, k)) != DSIM_OK) {
            tm_fail(job);
            break;
        }
        int64_t t2 = dsim_rt_now(job->rt);
        size_t i = (size_t)k * (size_t)N + (size_t)r;
        res->step_ns[i] = t2 - t0;
        res->comm_ns[i] = t2 - t1;
        res->examples[i] = ex;
        res->padded[i] = rows - ex;
        res->replicas[r].global_step = k + 1;
        if (cfg->observer) {
            dsim_train_step_info info = {
                .replica = r,
                .worker = r / cfg->devices_per_host,
                .device = r % cfg->devices_per_host,
                .epoch = (uint32_t)(k / res->steps_per_epoch),
                .step = k % res->steps_per_epoch,
                .global_step = k,
                .examples = ex,
                .local_loss = NAN,
                .loss = NAN,
                .t_start = t0,
                .t_end = t2,
                .t_comm = t1,
                .rerun_of = -1,
                .padded = rows - ex,
            };
            cfg->observer(&info, cfg->observer_user);
        }
    }
    if (job->strat) {
        if (e == DSIM_OK && (e = dsim_strategy_finish(job->strat, &rp->ctx)) != DSIM_OK)
            tm_fail(job);
        dsim_strategy_replica_fini(job->strat, &rp->ctx);
    }
    free(priv);
    res->replicas[r].phase = DSIM_PHASE_DONE;
    res->replicas[r].t_end = dsim_rt_now(job->rt);
    dsim_comm_destroy(comm);
}

static dsim_err tm_check(const dsim_train_cfg *cfg, const dsim_strategy **strat)
{
    if (!(dsim_rt_engine_flags(cfg->engine) & DSIM_RT_VIRTUAL_TIME))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: a synthetic model runs timing only, which needs engine sim (the "
                        "virtual clock charges its compute and the network model its messages); "
                        "engine is %s",
                        cfg->engine ? cfg->engine : "threads");
    if (!(cfg->synthetic_params >= 1 && cfg->synthetic_params <= 1e12) ||
        !(cfg->synthetic_flops >= 0 && isfinite(cfg->synthetic_flops)))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: a synthetic model of %g parameters and %g FLOPs per example; "
                        "give 1..1T parameters and finite FLOPs >= 0",
                        cfg->synthetic_params, cfg->synthetic_flops);
    if (cfg->hosts < 1 || cfg->devices_per_host < 1 || cfg->global_batch < 1 ||
        cfg->data.n_examples < 1 || cfg->epochs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: hosts, devices_per_host, global_batch, examples and epochs must "
                        "all be >= 1");
    if (cfg->plugin_path)
        DSIM_CHECK(dsim_strategy_load(cfg->strategy, cfg->plugin_path));
    DSIM_CHECK(dsim_strategy_lookup(cfg->strategy, strat));
    DSIM_CHECK(dsim_train_check_tpu(cfg));
    DSIM_CHECK(dsim_train_check_static_shapes(cfg));
    /* A plugin runs its own schedule; the built-ins that keep variables
     * elsewhere have no timing-only form. */
    if (!(*strat)->path[0] && (*strat)->ops->placement != DSIM_PLACE_MIRRORED &&
        (*strat)->ops->placement != DSIM_PLACE_ONE_DEVICE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: strategy '%s' keeps its variables %s; a synthetic model (timing "
                        "only) runs the all-reduce schedule of mirrored, multi_worker_mirrored, "
                        "tpu and one_device",
                        cfg->strategy, dsim_var_placement_name((*strat)->ops->placement));
    /* cfg->hooks (a fault layer's phase hooks) are accepted and not called:
     * the transport's faults (delay, drop, partition, slow links) still
     * apply to the virtual frames. */
    if (cfg->num_ps > 0 || cfg->checkpoint_path || cfg->restore || cfg->local_count)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: a synthetic model (timing only) runs without parameter servers, "
                        "checkpoints or ranks in other processes");
    if ((*strat)->path[0]) {
        dsim_strategy_shape shape = {.hosts = cfg->hosts,
                                     .devices_per_host = cfg->devices_per_host,
                                     .num_replicas = cfg->hosts * cfg->devices_per_host};
        DSIM_CHECK(dsim_strategy_check_shape(*strat, &shape));
    }
    return DSIM_OK;
}

/* A plugin's scratch: three ranges of the model's size that every replica
 * shares, allocated only where written. */
static dsim_err tm_plugin_scratch(tm_job *job)
{
    for (int i = 0; i < 3; i++) {
        void *m = mmap(NULL, job->grad_map, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return DSIM_ERR(DSIM_ENOMEM, -1,
                            "train: cannot reserve %zu bytes of address space for a plugin's "
                            "timing-only scratch",
                            job->grad_map);
        job->scratch[i] = m;
    }
    job->shape = (dsim_strategy_shape){.hosts = job->cfg->hosts,
                                       .devices_per_host = job->cfg->devices_per_host,
                                       .num_replicas = job->N};
    /* plain SGD: no slots per replica; the rate is immaterial */
    job->optim = (dsim_optim_spec){.kind = DSIM_OPTIM_SGD, .lr = 0.01};
    return DSIM_OK;
}

dsim_err dsim_train_timing(const dsim_train_cfg *cfg, dsim_train_result *res)
{
    const dsim_strategy *strat = NULL;
    dsim_err e = tm_check(cfg, &strat);
    if (e != DSIM_OK)
        return e;
    tm_job job = {.cfg = cfg, .res = res, .feeder = strat};
    job.N = cfg->hosts * cfg->devices_per_host;
    uint64_t G = (uint64_t)cfg->global_batch, n = cfg->data.n_examples;
    uint64_t per_epoch = cfg->drop_remainder ? n / G : (n + G - 1) / G;
    if (per_epoch == 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: %llu examples make no global batch of %llu with drop_remainder",
                        (unsigned long long)n, (unsigned long long)G);
    job.steps = per_epoch * cfg->epochs;
    if ((e = dsim_train_torus(cfg, &job.torus, &job.torus_rank)) != DSIM_OK)
        return e;
    job.zero_ids = calloc((size_t)cfg->global_batch, sizeof *job.zero_ids);
    if (!job.zero_ids) {
        free(job.torus_rank);
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for a step's ids");
    }
    job.count = (size_t)llround(cfg->synthetic_params);
    job.timeout_ns = cfg->timeout_ns >= 0 ? cfg->timeout_ns : DSIM_COMM_DEFAULT_TIMEOUT_NS;
    size_t N = (size_t)job.N, S = (size_t)job.steps;
    snprintf(res->strategy, sizeof res->strategy, "%s", strat->name);
    res->placement = (int)strat->ops->placement;
    res->num_workers = cfg->hosts;
    res->devices_per_host = cfg->devices_per_host;
    res->num_replicas = job.N;
    res->num_replicas_in_sync = job.N;
    res->loss_scale = 1.0f / (float)cfg->global_batch;
    res->steps_per_epoch = per_epoch;
    res->initial_loss = res->final_loss = NAN;
    res->loss = malloc(S * sizeof *res->loss);
    res->local_loss = malloc(S * N * sizeof *res->local_loss);
    res->checksum = calloc(S * N, sizeof *res->checksum);
    res->examples = calloc(S * N, sizeof *res->examples);
    res->padded = calloc(S * N, sizeof *res->padded);
    res->step_ns = calloc(S * N, sizeof *res->step_ns);
    res->comm_ns = calloc(S * N, sizeof *res->comm_ns);
    res->replicas = calloc(N, sizeof *res->replicas);
    job.eps = calloc(N, sizeof *job.eps);
    job.reps = calloc(N, sizeof *job.reps);
    if (!res->loss || !res->local_loss || !res->checksum || !res->examples || !res->padded ||
        !res->step_ns || !res->comm_ns || !res->replicas || !job.eps || !job.reps) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for %zu replicas x %zu steps", N, S);
        goto out;
    }
    for (size_t i = 0; i < S; i++)
        res->loss[i] = NAN;
    for (size_t i = 0; i < S * N; i++)
        res->local_loss[i] = NAN;
    /* Address space only: no page of it is ever touched. */
    job.grad_map = job.count * sizeof(float);
    job.grad =
        mmap(NULL, job.grad_map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (job.grad == MAP_FAILED) {
        job.grad = NULL;
        e = DSIM_ERR(DSIM_ENOMEM, -1,
                     "train: cannot reserve %zu bytes of address space for the virtual gradients",
                     job.grad_map);
        goto out;
    }
    if (strat->path[0]) {
        job.strat = strat;
        if ((e = tm_plugin_scratch(&job)) != DSIM_OK)
            goto out;
    }
    if ((e = dsim_rt_create_seeded(cfg->engine, cfg->seed, &job.rt)) != DSIM_OK ||
        (e = dsim_waitq_create(job.rt, &job.lock)) != DSIM_OK)
        goto out;
    dsim_fabric_cfg fc = {
        .backend = cfg->transport ? cfg->transport : "inproc",
        .nranks = job.N,
        .rt = job.rt,
        .options = cfg->transport_options,
        .filter = cfg->transport_filter,
        .filter_user = cfg->transport_filter_user,
    };
    if ((e = dsim_fabric_open(&fc, &job.fab)) != DSIM_OK)
        goto out;
    for (int r = 0; r < job.N; r++)
        if ((e = dsim_ep_open(job.fab, r, &job.eps[r])) != DSIM_OK)
            goto out;
    res->t_start = dsim_rt_now(job.rt);
    int started = 0;
    for (int r = 0; r < job.N; r++) {
        job.reps[r] = (tm_rep){.job = &job, .r = r};
        if ((e = dsim_rt_spawn(job.rt, r, tm_replica_main, &job.reps[r], &job.reps[r].task)) !=
            DSIM_OK)
            break;
        started++;
    }
    if (e != DSIM_OK) /* the others wait for it until their timeout */
        tm_fail(&job);
    for (int r = 0; r < started; r++)
        dsim_rt_join(job.rt, job.reps[r].task);
    if (job.failed) {
        dsim_error *er = &job.err;
        e = dsim_set_error(er->code, er->peer, er->file, er->line, "%s", er->msg);
    } else {
        res->steps = job.steps;
        for (size_t i = 0; i < S * N; i++)
            res->padded_total += res->padded[i];
    }
    dsim_rt_trace(job.rt, DSIM_TRACE_RESULT, (uint64_t)e, 0, res->steps);
    res->trace_hash = dsim_rt_trace_hash(job.rt, &res->trace_events);
out:
    for (int r = 0; job.eps && r < job.N; r++)
        if (job.eps[r])
            dsim_ep_close(job.eps[r]);
    if (job.fab)
        dsim_fabric_close(job.fab);
    if (job.lock)
        dsim_waitq_destroy(job.lock);
    if (job.rt)
        dsim_rt_destroy(job.rt);
    if (job.grad)
        munmap(job.grad, job.grad_map);
    for (int i = 0; i < 3; i++)
        if (job.scratch[i])
            munmap(job.scratch[i], job.grad_map);
    free(job.eps);
    free(job.reps);
    free(job.torus_rank);
    free(job.zero_ids);
    return e;
}
