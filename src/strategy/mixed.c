/* Mixed precision inside the strategy layer: what the driver does around
 * the gradient (scale, unscale, record each replica's loss scale and skip
 * decision) and what a strategy's apply_gradients calls (the all-reduce in
 * the gradients' dtype, Keras's LossScaleOptimizer on the aggregated
 * gradient). dsim/precision.h has the rules. */
#include <stdlib.h>
#include <string.h>

#include "strategy_int.h"

dsim_err dsim_strategy_allreduce_grad(dsim_replica_ctx *ctx, dsim_comm *comm, float *grad, size_t n)
{
    if (!ctx || !comm || (!grad && n))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_strategy_allreduce_grad: ctx, comm or grad is NULL");
    ctx->gradient_dtype_applied = true;
    dsim_dtype t = ctx->gradient_dtype;
    if (t == DSIM_F32)
        return dsim_allreduce(comm, grad, grad, n, DSIM_F32, DSIM_SUM);
    if (t != DSIM_F16 && t != DSIM_BF16)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "gradient_dtype %s: gradients are all-reduced in float32, float16 or "
                        "bfloat16",
                        dsim_precision_dtype_name(t));
    uint16_t *narrow = malloc((n ? n : 1) * sizeof *narrow);
    if (!narrow)
        return DSIM_ERR(DSIM_ENOMEM, -1, "all-reduce in %s: out of memory for %zu gradients",
                        dsim_precision_dtype_name(t), n);
    dsim_err e = dsim_convert(narrow, t, grad, DSIM_F32, n);
    if (e == DSIM_OK)
        e = dsim_allreduce(comm, narrow, narrow, n, t, DSIM_SUM);
    if (e == DSIM_OK)
        e = dsim_convert(grad, DSIM_F32, narrow, t, n);
    free(narrow);
    return e;
}

dsim_err dsim_strategy_apply_scaled(dsim_replica_ctx *ctx, dsim_optim *opt, float *params,
                                    const float *grad, size_t n, bool *applied)
{
    if (!ctx || !opt)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_strategy_apply_scaled: ctx or opt is NULL");
    bool finite = !ctx->loss_scale.dynamic || dsim_all_finite(grad, n);
    bool apply = dsim_loss_scale_record(&ctx->loss_scale, finite);
    if (applied)
        *applied = apply;
    if (!apply) {
        dsim_optim_skip(opt);
        return DSIM_OK;
    }
    return dsim_optim_apply(opt, params, grad, n);
}

dsim_err train_mixed_grad(const dsim_train_cfg *cfg, const dsim_train_setup *su,
                          dsim_loss_scale *ls, const float *params, const float *x, const float *y,
                          size_t n, float scale, float *grad, double *loss_sum)
{
    dsim_dtype cd = dsim_precision_compute_dtype(cfg->precision);
    if (cd == DSIM_F32)
        return dsim_model_loss_grad_set(&su->model, params, x, y, n, scale, grad, loss_sum);
    /* Keras: scaled_loss = loss * S; grads = tape.gradient(scaled_loss) / S.
     * S is a power of two, so the unscaling is exact in float. */
    float S = ls ? ls->scale : 1.0f;
    DSIM_CHECK(
        dsim_model_loss_grad_mixed(&su->model, cd, params, x, y, n, scale * S, grad, loss_sum));
    if (S != 1.0f) {
        float inv = 1.0f / S;
        for (size_t k = 0; k < su->n_params; k++)
            grad[k] *= inv;
    }
    return DSIM_OK;
}

dsim_err train_check_precision(const dsim_train_cfg *cfg)
{
    if ((int)cfg->precision < 0 || cfg->precision >= DSIM_POLICY_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: precision %d is not a policy; use float32, mixed_float16 or "
                        "mixed_bfloat16",
                        (int)cfg->precision);
    dsim_dtype g = cfg->gradient_dtype;
    if (g != DSIM_F32 && g != DSIM_F16 && g != DSIM_BF16)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: gradient_dtype %s; gradients are all-reduced in float32, "
                        "float16 or bfloat16",
                        dsim_precision_dtype_name(g));
    if (cfg->synthetic_params > 0 && (cfg->precision > DSIM_POLICY_FLOAT32 || g != DSIM_F32))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: a synthetic model (timing only) computes no numbers, so "
                        "mixed_precision and gradient_dtype do not apply to it; remove them");
    return dsim_train_check_builtin(cfg);
}

dsim_err dsim_train_check_builtin(const dsim_train_cfg *cfg)
{
    if (!cfg)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_train_check_builtin: cfg is NULL");
    /* The built-in parameter servers apply each its own shard of the
     * gradients (and central_storage reduces to its host in float32): what
     * needs the whole gradient on a replica, or a narrow all-reduce, does not
     * apply to them. Refused before the job, not left to fail at the first
     * step as a strategy bug would. */
    const char *st = cfg->strategy ? cfg->strategy : "";
    bool ps = strcmp(st, "parameter_server") == 0 && !cfg->plugin_path;
    bool cs = strcmp(st, "central_storage") == 0 && !cfg->plugin_path;
    if ((ps || cs) && cfg->gradient_dtype != DSIM_F32)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s sends the gradients to %s in float32, it does not all-reduce them: "
                        "gradient_dtype %s does not apply to it (remove it; the mirrored "
                        "strategies, one_device and tpu take it)",
                        st, ps ? "the parameter servers" : "the host",
                        dsim_precision_dtype_name(cfg->gradient_dtype));
    if (ps && dsim_optim_needs_global_norm(&cfg->optim))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "parameter_server does not clip by the global norm (global_clipnorm): "
                        "each server applies its own shard of the gradients and none sees the "
                        "whole gradient's norm; use clipvalue, or a mirrored strategy");
    if (ps && cfg->optim.clipnorm > 0.0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "parameter_server does not clip by each variable's norm (clipnorm): "
                        "each server applies its own shard of the gradients, which cuts "
                        "variables; use clipvalue, or a mirrored strategy");
    if (ps && cfg->optim.kind == DSIM_OPTIM_LAMB)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "parameter_server does not run lamb: each server applies its own shard "
                        "of the parameters, and LAMB's trust ratio needs each variable's whole "
                        "norm; use adam, or a mirrored strategy");
    if (ps && cfg->precision == DSIM_POLICY_MIXED_FLOAT16)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "parameter_server does not run mixed_float16: its servers apply the "
                        "gradients shard by shard, and dynamic loss scaling needs every replica "
                        "to see whether the whole gradient is finite; use mixed_bfloat16 (no "
                        "loss scale) or float32");
    return DSIM_OK;
}

dsim_err train_mixed_after(const char *strategy, dsim_replica_ctx *ctx, uint64_t gs)
{
    if (ctx->loss_scale.dynamic && !ctx->loss_scale.recorded)
        return DSIM_ERR(DSIM_ESTATE, -1,
                        "strategy '%s' ran mixed_float16 without dynamic loss scaling: replica "
                        "%d's apply_gradients at global step %llu never recorded whether the "
                        "aggregated gradient was finite; call dsim_strategy_apply_scaled (or "
                        "dsim_loss_scale_record) there, or run mixed_bfloat16 or float32",
                        strategy, ctx->replica, (unsigned long long)gs);
    if (ctx->gradient_dtype != DSIM_F32 && !ctx->gradient_dtype_applied)
        return DSIM_ERR(DSIM_ESTATE, -1,
                        "strategy '%s' ignores gradient_dtype %s: replica %d's apply_gradients "
                        "at global step %llu did not all-reduce through "
                        "dsim_strategy_allreduce_grad; use it, or remove gradient_dtype",
                        strategy, dsim_precision_dtype_name(ctx->gradient_dtype), ctx->replica,
                        (unsigned long long)gs);
    return DSIM_OK;
}
