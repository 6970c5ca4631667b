/* one_device: TF's OneDeviceStrategy. One replica holds the variables and
 * applies its own gradients; reduce is the identity. The baseline every other
 * strategy is compared with. */
#include <string.h>

#include "../strategy_int.h"

static dsim_err one_device_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_replicas != 1 || s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "one_device runs exactly 1 replica (1 host x 1 device, no parameter "
                        "servers); got %d host(s) x %d device(s) with %d ps. Use mirrored for "
                        "several devices, multi_worker_mirrored for several hosts",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

static dsim_err one_device_apply(dsim_replica_ctx *ctx, float *grad)
{
    dsim_replicated *rp = ctx->priv;
    /* One replica: nothing to sum, but a narrow gradient dtype still rounds
     * (what an all-reduce of one rank in that dtype gives). */
    if (ctx->gradient_dtype != DSIM_F32)
        DSIM_CHECK(dsim_strategy_allreduce_grad(ctx, ctx->world, grad, ctx->n_params));
    return dsim_strategy_apply_scaled(ctx, rp->opt, ctx->params, grad, ctx->n_params, NULL);
}

static dsim_err one_device_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                                  size_t n)
{
    (void)ctx;
    if (op != DSIM_SUM && op != DSIM_MEAN)
        return DSIM_ERR(DSIM_EINVAL, -1, "reduce: op %s is not SUM or MEAN", dsim_op_name(op));
    memmove(out, in, n * sizeof(double)); /* SUM and MEAN of one value are the value */
    return DSIM_OK;
}

const struct dsim_strategy_ops dsim_strategy_one_device_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "one_device",
    .summary = "one replica on one device (TF OneDeviceStrategy)",
    .placement = DSIM_PLACE_ONE_DEVICE,
    .replica_priv_size = sizeof(dsim_replicated),
    .check_shape = one_device_check_shape,
    .replica_fini = dsim_replicated_fini,
    .create_variables = dsim_replicated_create,
    .apply_gradients = one_device_apply,
    .reduce = one_device_reduce,
    .save = dsim_replicated_save,
};
