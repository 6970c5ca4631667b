/* A hierarchical strategy of your own, written on sub-communicators.
 *
 * "hierarchical_leaders" keeps a copy of the variables on every replica (as
 * multi_worker_mirrored does) and sums the gradients in two levels, the way
 * people do by hand when the links inside a host are much faster than the
 * ones between hosts:
 *
 *        host 0                  host 1                  host 2
 *   r0   r1   r2   r3       r4   r5   r6   r7       r8   r9   r10  r11
 *    \    |    |   /         \    |    |   /         \    |    |   /
 *     reduce to r0            reduce to r4            reduce to r8     1. in each host
 *          r0 ---------------- r4 ---------------- r8                  2. all-reduce among
 *                                                                         the hosts' leaders
 *     broadcast from r0       broadcast from r4       broadcast from r8 3. in each host
 *
 * Two communicators of its own do it, made once from ctx->world with
 * dsim_comm_split: `host` (the replicas of one worker, color = worker) and
 * `leaders` (each worker's first device, color 0; every other replica
 * passes DSIM_COMM_UNDEFINED and gets NULL). Everything dsim checks on the
 * world it checks on them: fingerprints, timeouts, a lost peer named in
 * both numberings ("rank 1 (world rank 5)"), flight records for `dsim trace
 * desync`; and reports name the exchange as it is ("reduce on
 * sub-communicator ... (4 ranks) + allreduce(ring) on sub-communicator ...
 * (3 ranks) + broadcast on ..."). dsim's own `communication: hierarchical`
 * does the same job in one collective with the reduce-scatter variant
 * (src/coll/hierarchical.c); this file is the by-hand version, for a
 * strategy that wants its own.
 *
 * Build (dsim tree): meson compile -C build. Out of tree, against an
 * installed dsim:
 *   cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags dsim) \
 *      hierarchical_strategy.c -o libhierarchical_strategy.so $(pkg-config --libs dsim)
 * Run: scenarios/hierarchical_strategy.yaml names it (strategy.plugin). */
#include "dsim/spi/strategy.h"

#include <stdlib.h>
#include <string.h>

/* What each replica keeps: its optimizer and its two communicators. */
typedef struct hier_replica {
    dsim_optim *opt;
    dsim_comm *host;    /* this worker's replicas; rank = device */
    dsim_comm *leaders; /* every worker's device 0; NULL on the others */
} hier_replica;

/* Any hosts x devices, no parameter servers. */
static dsim_err hier_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "hierarchical_leaders takes no parameter servers; got %d host(s) x %d "
                        "device(s) with %d ps (set num_ps to 0)",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

/* The communicators. dsim_comm_split is a collective over ctx->world: every
 * replica calls it, here, at the same point. Replicas of one color form a
 * communicator ordered by key: the device in the host, the worker among
 * the leaders. The world's settings carry over: the timeout, fingerprints,
 * timing only, and the job's all-reduce algorithm (ctx->algo), which the
 * leaders' all-reduce runs. */
static dsim_err hier_init(dsim_replica_ctx *ctx)
{
    hier_replica *me = ctx->priv;
    dsim_err e = dsim_comm_split(ctx->world, ctx->worker, ctx->device, &me->host);
    if (e == DSIM_OK)
        e = dsim_comm_split(ctx->world, ctx->device == 0 ? 0 : DSIM_COMM_UNDEFINED, ctx->worker,
                            &me->leaders);
    return e;
}

/* Released after any failure too. */
static void hier_fini(dsim_replica_ctx *ctx)
{
    hier_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    dsim_comm_free(me->leaders);
    dsim_comm_free(me->host);
    me->opt = NULL;
    me->leaders = me->host = NULL;
}

/* The chief's initial values (and optimizer slots and step) go to every
 * replica over the world, as TF initializes variables on the chief. */
static dsim_err hier_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    hier_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    e = dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
    size_t len = dsim_optim_state_len(me->opt);
    float *slots = calloc(len ? len : 1, sizeof(float));
    if (e == DSIM_OK && !slots)
        e = DSIM_ERR(DSIM_ENOMEM, -1, "hierarchical_leaders: out of memory");
    int64_t step = ctx->replica == 0 ? (int64_t)init->optim_step : 0;
    if (e == DSIM_OK && ctx->replica == 0 && len)
        memcpy(slots, init->optim_state, len * sizeof(float));
    if (e == DSIM_OK && len)
        e = dsim_broadcast(ctx->world, slots, len, DSIM_F32, 0);
    if (e == DSIM_OK)
        e = dsim_broadcast(ctx->world, &step, 1, DSIM_I64, 0);
    if (e == DSIM_OK)
        e = dsim_optim_set_state(me->opt, len ? slots : NULL, len, (uint64_t)step);
    free(slots);
    return e;
}

/* One step: the three levels, then the same update everywhere. grad is
 * already scaled by 1/global_batch: SUM it (never MEAN). */
static dsim_err hier_apply(dsim_replica_ctx *ctx, float *grad)
{
    hier_replica *me = ctx->priv;
    size_t n = ctx->n_params;
    /* 1. the host's sum on its device 0 (in place on the root) */
    dsim_err e = dsim_reduce(me->host, grad, grad, n, DSIM_F32, DSIM_SUM, 0);
    /* 2. the leaders sum the hosts' sums */
    if (e == DSIM_OK && me->leaders)
        e = dsim_allreduce(me->leaders, grad, grad, n, DSIM_F32, DSIM_SUM);
    /* 3. the total back to every device of the host */
    if (e == DSIM_OK)
        e = dsim_broadcast(me->host, grad, n, DSIM_F32, 0);
    if (e != DSIM_OK)
        return e;
    /* Timing only (dsim whatif, a synthetic model): the buffers mean
     * nothing and only the collectives are timed; skip the arithmetic. */
    if (dsim_comm_virtual(ctx->world))
        return DSIM_OK;
    return dsim_optim_apply(me->opt, ctx->params, grad, n);
}

/* strategy.reduce: the loss, over the world. */
static dsim_err hier_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                            size_t n)
{
    if (op != DSIM_SUM && op != DSIM_MEAN)
        return DSIM_ERR(DSIM_EINVAL, -1, "hierarchical_leaders: reduce takes SUM or MEAN");
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

/* A checkpoint: every replica holds the same values; the chief's are kept. */
static dsim_err hier_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    hier_replica *me = ctx->priv;
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
    size_t len = dsim_optim_state_len(me->opt);
    if (len)
        memcpy(out->optim_state, dsim_optim_state(me->opt), len * sizeof(float));
    out->optim_step = dsim_optim_step(me->opt);
    return DSIM_OK;
}

static const struct dsim_strategy_ops hier_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "hierarchical_leaders",
    .summary = "mirrored variables; gradients reduced in each host, all-reduced among the "
               "hosts' leaders, broadcast back (by hand on dsim_comm_split)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(hier_replica),
    .check_shape = hier_check_shape,
    .replica_init = hier_init,
    .replica_fini = hier_fini,
    .create_variables = hier_create,
    .apply_gradients = hier_apply,
    .reduce = hier_reduce,
    .save = hier_save,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &hier_ops;
}
