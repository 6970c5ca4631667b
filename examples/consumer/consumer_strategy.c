/* The consumer project's own strategy: mirrored variables, SGD-style
 * updates, gradients SUM-reduced with whatever algorithm the job chose. A
 * shorter cousin of examples/custom_strategy (which explains every line);
 * it has no save member, so it runs only without checkpoints. */
#include <stdint.h>
#include <string.h>

#include "dsim/spi/strategy.h"

typedef struct consumer_replica {
    dsim_optim *opt;
} consumer_replica;

static dsim_err consumer_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "consumer_mirrored takes no parameter servers (%d)",
                        s->num_ps);
    return DSIM_OK;
}

static dsim_err consumer_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    consumer_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static dsim_err consumer_apply(dsim_replica_ctx *ctx, float *grad)
{
    consumer_replica *me = ctx->priv;
    /* already scaled by 1/global_batch: SUM, never MEAN */
    dsim_err e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
    if (e != DSIM_OK)
        return e;
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

static dsim_err consumer_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                                size_t n)
{
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

static void consumer_fini(dsim_replica_ctx *ctx)
{
    consumer_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    me->opt = NULL;
}

static const struct dsim_strategy_ops consumer_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "consumer_mirrored",
    .summary = "the consumer example's mirrored strategy",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(consumer_replica),
    .check_shape = consumer_check_shape,
    .create_variables = consumer_create,
    .apply_gradients = consumer_apply,
    .reduce = consumer_reduce,
    .replica_fini = consumer_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version);
__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &consumer_ops;
}
