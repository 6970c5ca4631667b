/* A test fixture: a mirrored strategy whose is_chief says yes on replicas 0
 * and 2, so two replicas would write the checkpoint. dsim_train must refuse
 * it, naming both, before any file is touched. */
#include <string.h>

#include "dsim/spi/strategy.h"

typedef struct two_replica {
    dsim_optim *opt;
} two_replica;

static dsim_err two_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "two_chiefs takes no parameter servers; got %d",
                        s->num_ps);
    return DSIM_OK;
}

static dsim_err two_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    two_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    if (init)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static dsim_err two_apply(dsim_replica_ctx *ctx, float *grad)
{
    two_replica *me = ctx->priv;
    dsim_err e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
    if (e != DSIM_OK)
        return e;
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

static dsim_err two_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                           size_t n)
{
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

static dsim_err two_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
    return DSIM_OK;
}

static int two_is_chief(const dsim_replica_ctx *ctx)
{
    return ctx->replica == 0 || ctx->replica == 2; /* THE BUG: two chiefs */
}

static void two_fini(dsim_replica_ctx *ctx)
{
    two_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
}

static const struct dsim_strategy_ops two_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "two_chiefs",
    .summary = "claims the chief on replicas 0 and 2 (a test fixture: wrong on purpose)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(two_replica),
    .check_shape = two_check_shape,
    .create_variables = two_create,
    .apply_gradients = two_apply,
    .reduce = two_reduce,
    .save = two_save,
    .is_chief = two_is_chief,
    .replica_fini = two_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &two_ops;
}
