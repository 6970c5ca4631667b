/* A deliberately wrong strategy, kept as a test fixture: it MEAN-reduces
 * gradients that the driver has already scaled by 1/global_batch, so each
 * update is the global batch's gradient divided by the number of replicas
 * (the effective learning rate shrinks by that factor). Its replicas still
 * agree bit for bit after every step -- only the comparison with the
 * single-device reference can catch it, and test_strategy checks that it
 * does. Do not copy this; see examples/custom_strategy for the right way. */
#include <stdlib.h>
#include <string.h>

#include "dsim/spi/strategy.h"

typedef struct wrong_replica {
    dsim_optim *opt;
} wrong_replica;

static dsim_err wrong_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "wrong_mean takes no parameter servers; got %d",
                        s->num_ps);
    return DSIM_OK;
}

static dsim_err wrong_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    wrong_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static dsim_err wrong_apply(dsim_replica_ctx *ctx, float *grad)
{
    wrong_replica *me = ctx->priv;
    /* THE BUG: MEAN of gradients already averaged over the global batch. */
    dsim_err e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_MEAN);
    if (e != DSIM_OK)
        return e;
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

static dsim_err wrong_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                             size_t n)
{
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

static void wrong_fini(dsim_replica_ctx *ctx)
{
    wrong_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
}

static const struct dsim_strategy_ops wrong_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "wrong_mean",
    .summary = "MEAN-reduces already globally scaled gradients (a test fixture: wrong on purpose)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(wrong_replica),
    .check_shape = wrong_check_shape,
    .create_variables = wrong_create,
    .apply_gradients = wrong_apply,
    .reduce = wrong_reduce,
    .replica_fini = wrong_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &wrong_ops;
}
