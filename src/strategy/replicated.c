/* What the strategies that keep the variables on every replica share
 * (one_device, mirrored, multi_worker_mirrored): the chief's initial values
 * broadcast to every replica, a SUM all-reduce of the already-scaled
 * gradients, and the same optimizer update applied on every replica, which
 * keeps the copies bit-identical because every replica applies the same
 * update to the same bits. */
#include <stdlib.h>
#include <string.h>

#include "strategy_int.h"

dsim_err dsim_strategy_optim_from_vars(const dsim_optim_spec *spec, size_t n,
                                       const dsim_strategy_vars *init, dsim_optim **out)
{
    *out = NULL;
    dsim_optim *opt = NULL;
    DSIM_CHECK(dsim_optim_create(spec, n, &opt));
    if (init) {
        size_t want = dsim_optim_state_len(opt);
        if (init->optim_state_len != want) {
            dsim_optim_destroy(opt);
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "the saved optimizer state has %zu floats but a %s optimizer of %zu "
                            "parameters has %zu; restore with the optimizer the checkpoint was "
                            "written with",
                            init->optim_state_len, dsim_optim_kind_name(spec->kind), n, want);
        }
        dsim_err e = dsim_optim_set_state(opt, init->optim_state, want, init->optim_step);
        if (e != DSIM_OK) {
            dsim_optim_destroy(opt);
            return e;
        }
    }
    *out = opt;
    return DSIM_OK;
}

dsim_err dsim_strategy_optim_to_vars(const dsim_optim *opt, dsim_strategy_vars *out)
{
    size_t len = dsim_optim_state_len(opt);
    if (out->optim_state_len != len)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "save: the checkpoint has room for %zu optimizer floats, the optimizer "
                        "has %zu",
                        out->optim_state_len, len);
    if (len)
        memcpy(out->optim_state, dsim_optim_state(opt), len * sizeof(float));
    out->optim_step = dsim_optim_step(opt);
    return DSIM_OK;
}

dsim_err dsim_replicated_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    dsim_replicated *rp = ctx->priv;
    size_t n = ctx->n_params;
    if (ctx->replica == 0) {
        if (!init || init->n_params != n)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "create_variables: the chief needs initial values for %zu "
                            "parameters",
                            n);
        memcpy(ctx->params, init->params, n * sizeof(float));
        DSIM_CHECK(dsim_strategy_optim_from_vars(ctx->optim, n, init, &rp->opt));
    } else {
        DSIM_CHECK(dsim_strategy_optim_from_vars(ctx->optim, n, NULL, &rp->opt));
    }
    if (ctx->shape.num_replicas == 1)
        return DSIM_OK;
    /* TF initializes mirrored variables on the chief and broadcasts them;
     * the slots and the step travel too, so a restore is exact everywhere. */
    DSIM_CHECK(dsim_broadcast(ctx->world, ctx->params, n, DSIM_F32, 0));
    size_t len = dsim_optim_state_len(rp->opt);
    float *state = NULL;
    if (len) {
        state = malloc(len * sizeof(float));
        if (!state)
            return DSIM_ERR(DSIM_ENOMEM, -1, "create_variables: out of memory");
        memcpy(state, dsim_optim_state(rp->opt), len * sizeof(float));
        dsim_err e = dsim_broadcast(ctx->world, state, len, DSIM_F32, 0);
        if (e != DSIM_OK) {
            free(state);
            return e;
        }
    }
    int64_t step = (int64_t)dsim_optim_step(rp->opt);
    dsim_err e = dsim_broadcast(ctx->world, &step, 1, DSIM_I64, 0);
    if (e == DSIM_OK && ctx->replica != 0)
        e = dsim_optim_set_state(rp->opt, state, len, (uint64_t)step);
    free(state);
    return e;
}

dsim_err dsim_replicated_apply(dsim_replica_ctx *ctx, float *grad)
{
    dsim_replicated *rp = ctx->priv;
    /* The gradients are already scaled by 1/global_batch: SUM, not MEAN. */
    DSIM_CHECK(dsim_strategy_allreduce_grad(ctx, ctx->world, grad, ctx->n_params));
    /* Keras's LossScaleOptimizer tests the aggregated gradient: every
     * replica holds the same bits and decides alike. */
    return dsim_strategy_apply_scaled(ctx, rp->opt, ctx->params, grad, ctx->n_params, NULL);
}

dsim_err dsim_replicated_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    dsim_replicated *rp = ctx->priv;
    if (out->n_params != ctx->n_params)
        return DSIM_ERR(DSIM_EINVAL, -1, "save: %zu parameters asked for, the model has %zu",
                        out->n_params, ctx->n_params);
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
    return dsim_strategy_optim_to_vars(rp->opt, out);
}

void dsim_replicated_fini(dsim_replica_ctx *ctx)
{
    dsim_replicated *rp = ctx->priv;
    dsim_optim_destroy(rp->opt);
    rp->opt = NULL;
}

dsim_err dsim_replicated_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                                size_t n)
{
    if (op != DSIM_SUM && op != DSIM_MEAN)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "reduce: op %s is not SUM or MEAN (tf.distribute.ReduceOp)",
                        dsim_op_name(op));
    if (out != in)
        memcpy(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}
