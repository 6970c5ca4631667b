/* A strategy of your own, built as a shared object and loaded by name.
 *
 * "custom_mirrored" keeps a copy of the variables on every replica of any
 * number of hosts (like multi_worker_mirrored) but always combines the
 * gradients with TF's ReductionToOneDevice: gather everything on replica 0,
 * add it up there, send the sum back. Every replica then applies the same
 * optimizer update to the same bits, so all copies stay identical.
 *
 * Build:  meson compile -C build   (this folder's meson.build), or by hand:
 *   cc -shared -fPIC -I<dsim>/src/include custom_strategy.c -o libcustom_strategy.so -ldsim
 * Load:   dsim_strategy_load("custom_mirrored", "./libcustom_strategy.so");
 *         then train with cfg.strategy = "custom_mirrored"
 *         (or set cfg.plugin_path and dsim_train loads it for you).
 *
 * Everything below uses only the public headers: a plugin sees exactly what
 * a user of libdsim sees. */

/* The ops table, the context structs, DSIM_STRATEGY_ABI_VERSION. */
#include "dsim/spi/strategy.h"

#include <stdlib.h>
#include <string.h>

/* What each replica keeps between calls. The driver allocates
 * replica_priv_size zeroed bytes for it and hands them over as ctx->priv. */
typedef struct custom_replica {
    dsim_optim *opt; /* this replica's optimizer: its slots live with its copy */
} custom_replica;

/* Which clusters we accept. Anything hosts x devices works, but we keep no
 * variables on parameter servers, so num_ps must be 0. The message names the
 * shape we got and what we accept: it is what the user reads. */
static dsim_err custom_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "custom_mirrored takes no parameter servers; got %d host(s) x %d "
                        "device(s) with %d ps (set num_ps to 0)",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

/* Creating the variables. Only the chief (replica 0) gets `init`: the initial
 * values (fresh, or from a checkpoint) with the optimizer's slots and step.
 * Everybody else must get them from the chief, as TF does. */
static dsim_err custom_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    custom_replica *me = ctx->priv;
    /* Each replica owns an optimizer for the whole model. */
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    /* The chief copies its initial values into its variables... */
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    /* ...and broadcasts them: afterwards every replica holds the same bits. */
    e = dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
    if (e != DSIM_OK)
        return e;
    /* The optimizer's slots and step follow the same way, so that a run
     * restored from a checkpoint continues exactly. Slots first (none for
     * plain SGD)... */
    size_t len = dsim_optim_state_len(me->opt);
    float *slots = calloc(len ? len : 1, sizeof(float));
    if (!slots)
        return DSIM_ERR(DSIM_ENOMEM, -1, "custom_mirrored: out of memory");
    if (ctx->replica == 0 && len)
        memcpy(slots, init->optim_state, len * sizeof(float));
    int64_t step = ctx->replica == 0 ? (int64_t)init->optim_step : 0;
    if (len)
        e = dsim_broadcast(ctx->world, slots, len, DSIM_F32, 0);
    /* ...then the step counter, which Adam's bias correction depends on. */
    if (e == DSIM_OK)
        e = dsim_broadcast(ctx->world, &step, 1, DSIM_I64, 0);
    if (e == DSIM_OK)
        e = dsim_optim_set_state(me->opt, len ? slots : NULL, len, (uint64_t)step);
    free(slots);
    return e;
}

/* One step's update. `grad` is this replica's gradient, ALREADY multiplied by
 * 1/global_batch by the driver (TF's compute_average_loss). The gradient of
 * the global batch is therefore the SUM over the replicas -- not the MEAN,
 * which would shrink every step by the number of replicas. */
static dsim_err custom_apply(dsim_replica_ctx *ctx, float *grad)
{
    custom_replica *me = ctx->priv;
    /* SUM over all replicas, forcing TF's ReductionToOneDevice algorithm
     * whatever the job's `communication` option says. In place is allowed. */
    dsim_err e = dsim_allreduce_with(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM,
                                     DSIM_ALGO_REDUCE_TO_ONE);
    if (e != DSIM_OK)
        return e;
    /* Timing only (`dsim whatif` of a scenario naming this plugin, or a
     * synthetic model under the sim engine): the collectives above ran
     * with virtual payloads and were timed; the buffers mean nothing, so
     * skip the arithmetic. */
    if (dsim_comm_virtual(ctx->world))
        return DSIM_OK;
    /* Every replica now holds the same summed gradient; the same update on
     * the same bits keeps the copies identical. */
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

/* strategy.reduce(op, value): the driver SUM-reduces each replica's scaled
 * loss with it, which gives the global batch's mean loss. */
static dsim_err custom_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                              size_t n)
{
    if (op != DSIM_SUM && op != DSIM_MEAN)
        return DSIM_ERR(DSIM_EINVAL, -1, "custom_mirrored: reduce takes SUM or MEAN");
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

/* A checkpoint: the driver writes what the chief (replica 0) fills in. Every
 * replica holds the same values, so each one just copies its own. */
static dsim_err custom_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    custom_replica *me = ctx->priv;
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
    size_t len = dsim_optim_state_len(me->opt);
    if (len)
        memcpy(out->optim_state, dsim_optim_state(me->opt), len * sizeof(float));
    out->optim_step = dsim_optim_step(me->opt);
    return DSIM_OK;
}

/* Called once per replica at the end, after a failure too. */
static void custom_fini(dsim_replica_ctx *ctx)
{
    custom_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    me->opt = NULL;
}

/* The table. `size` first, so that libdsim can refuse a table built against
 * another version of the header; the members not set here (finish,
 * is_chief, the parameter-server ones, ...) get their documented defaults. */
static const struct dsim_strategy_ops custom_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "custom_mirrored",
    .summary = "mirrored variables on any hosts x devices, gradients summed with "
               "reduce_to_one (a worked example of a plugin)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(custom_replica),
    .check_shape = custom_check_shape,
    .create_variables = custom_create,
    .apply_gradients = custom_apply,
    .reduce = custom_reduce,
    .save = custom_save,
    .replica_fini = custom_fini,
};

/* The one symbol libdsim looks up (DSIM_STRATEGY_PLUGIN_SYMBOL). It says
 * which ABI it was compiled against, and returns the table. */
__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &custom_ops;
}
