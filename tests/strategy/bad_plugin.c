/* Broken plugins for the loader's error paths, one per build flag:
 *   BAD_NOSYM    exports no dsim_strategy_plugin symbol at all
 *   BAD_ABI      says it was built against another ABI version
 *   BAD_ABI_V1   says it was built against version 1 (before sub-communicators),
 *                as a plugin built against an older dsim does
 *   BAD_MISSING  returns a table without apply_gradients
 *   BAD_FAIL     a working all-reduce strategy whose replica 1 fails at global
 *                step 2, while the others wait for it in the all-reduce */
#include <string.h>

#include "dsim/spi/strategy.h"

#if defined(BAD_NOSYM)
__attribute__((visibility("default"))) int dsim_not_a_strategy(void);
__attribute__((visibility("default"))) int dsim_not_a_strategy(void)
{
    return 42;
}
#else
static dsim_err bad_check_shape(const dsim_strategy_shape *s)
{
    (void)s;
    return DSIM_OK;
}

static dsim_err bad_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static dsim_err bad_apply(dsim_replica_ctx *ctx, float *grad)
{
#if defined(BAD_FAIL)
    if (ctx->replica == 1 && ctx->global_step == 2)
        return DSIM_ERR(DSIM_EIO, -1, "injected failure on replica 1 at step 2");
#endif
    dsim_err e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
    for (size_t k = 0; e == DSIM_OK && k < ctx->n_params; k++)
        ctx->params[k] -= 0.1f * grad[k];
    return e;
}

static dsim_err bad_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                           size_t n)
{
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

static const struct dsim_strategy_ops bad_ops = {
    .size = sizeof(struct dsim_strategy_ops),
#if defined(BAD_FAIL)
    .name = "fails_at_step_2", /* a plugin registers under its table's name */
#else
    .name = "bad_plugin",
#endif
    .check_shape = bad_check_shape,
    .create_variables = bad_create,
#if !defined(BAD_MISSING)
    .apply_gradients = bad_apply,
#endif
    .reduce = bad_reduce,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version);
__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
#if defined(BAD_ABI)
    *abi_version = DSIM_STRATEGY_ABI_VERSION + 100;
#elif defined(BAD_ABI_V1)
    *abi_version = 1;
#else
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
#endif
    (void)bad_apply;
    return &bad_ops;
}
#endif
