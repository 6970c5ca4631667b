/* central_storage: TF's CentralStorageStrategy. One worker; the variables
 * and the optimizer's slots live once, on the host (the worker's memory,
 * held by replica 0's context, which doubles as device 0); the devices only
 * compute. Each step the gradients are reduced to the host, the host applies
 * the update, and every device reads the new values back:
 *
 *   device 0 (host)   device 1  ...  device D-1
 *        g0              g1             gD-1
 *        |<--------------+--------------'      reduce SUM to the host
 *   w -= f(g)                                  one optimizer, on the host
 *        |-------------->+-------------->      broadcast w (every device reads it)
 *
 * The `communication` option does not apply: there is no all-reduce. */
#include <string.h>

#include "../strategy_int.h"

typedef struct central_priv {
    dsim_optim *opt; /* on the host (replica 0) only */
} central_priv;

static dsim_err central_check_shape(const dsim_strategy_shape *s)
{
    if (s->hosts != 1 || s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "central_storage runs on one worker without parameter servers (1 host "
                        "x D devices); got %d host(s) x %d device(s) with %d ps. Use "
                        "parameter_server to keep variables off the workers",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

static dsim_err central_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    central_priv *p = ctx->priv;
    if (ctx->replica == 0) {
        if (!init || init->n_params != ctx->n_params)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "central_storage: the host needs initial values for %zu parameters",
                            ctx->n_params);
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
        DSIM_CHECK(dsim_strategy_optim_from_vars(ctx->optim, ctx->n_params, init, &p->opt));
    }
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static dsim_err central_apply(dsim_replica_ctx *ctx, float *grad)
{
    central_priv *p = ctx->priv;
    /* In place on the root: dsim_reduce writes recvbuf on root only, and the
     * host's own gradient is its first contribution. */
    if (ctx->gradient_dtype != DSIM_F32)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "central_storage reduces the gradients to the host in float32; "
                        "gradient_dtype %s does not apply to it (remove it)",
                        dsim_precision_dtype_name(ctx->gradient_dtype));
    DSIM_CHECK(dsim_reduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM, 0));
    int64_t applied = 1;
    if (ctx->replica == 0) {
        bool a = true;
        DSIM_CHECK(dsim_strategy_apply_scaled(ctx, p->opt, ctx->params, grad, ctx->n_params, &a));
        applied = a;
    }
    /* Under dynamic loss scaling only the host saw the sum: it tells the
     * others whether the step was applied, so every replica's scale moves
     * alike. */
    if (ctx->loss_scale.dynamic) {
        DSIM_CHECK(dsim_broadcast(ctx->world, &applied, 1, DSIM_I64, 0));
        if (ctx->replica != 0)
            (void)dsim_loss_scale_record(&ctx->loss_scale, applied != 0);
    }
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static dsim_err central_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    central_priv *p = ctx->priv;
    if (ctx->replica != 0)
        return DSIM_OK; /* only the host has the slots; the chief is the host */
    if (out->n_params != ctx->n_params)
        return DSIM_ERR(DSIM_EINVAL, -1, "save: %zu parameters asked for, the model has %zu",
                        out->n_params, ctx->n_params);
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
    return dsim_strategy_optim_to_vars(p->opt, out);
}

static void central_fini(dsim_replica_ctx *ctx)
{
    central_priv *p = ctx->priv;
    dsim_optim_destroy(p->opt);
    p->opt = NULL;
}

const struct dsim_strategy_ops dsim_strategy_central_storage_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "central_storage",
    .summary = "variables on the host, devices compute; gradients reduced to the host, "
               "values broadcast back (TF CentralStorageStrategy)",
    .placement = DSIM_PLACE_CENTRAL,
    .replica_priv_size = sizeof(central_priv),
    .check_shape = central_check_shape,
    .replica_fini = central_fini,
    .create_variables = central_create,
    .apply_gradients = central_apply,
    .reduce = dsim_replicated_reduce,
    .save = central_save,
};
