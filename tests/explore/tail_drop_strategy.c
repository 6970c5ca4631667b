/* A test fixture: a mirrored strategy with its own all-reduce (a
 * reduce-scatter, then an all-gather, both through the strategy SPI) that
 * splits the gradient into num_replicas blocks of n / num_replicas
 * parameters and forgets the n % num_replicas left over: those stay each
 * replica's own gradient, never summed, so the replicas drift apart there.
 *
 * At the catalogue's sizes the bug is invisible: a softmax of 8 features x
 * 4 classes has 36 parameters, which 1, 2, 3, 4 and 6 replicas divide.
 * `dsim explore --shapes` finds it (tests/explore/test_explore.sh) and
 * `dsim conformance` fails its awkward-shape cases (tests/conformance).
 * Otherwise it is correct: variables, the optimizer's slots and step
 * broadcast from the chief, checkpoints with the slots. */
#include <stdlib.h>
#include <string.h>

#include "dsim/spi/strategy.h"

typedef struct td_replica {
    dsim_optim *opt;
    float *block; /* n / num_replicas floats */
} td_replica;

static dsim_err td_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "tail_drop takes no parameter servers; got %d host(s) x %d device(s) "
                        "with %d ps",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

static dsim_err td_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    td_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    size_t per = ctx->n_params / (size_t)ctx->shape.num_replicas;
    me->block = calloc(per ? per : 1, sizeof(float));
    if (!me->block)
        return DSIM_ERR(DSIM_ENOMEM, -1, "tail_drop: out of memory");
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    e = dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
    size_t len = dsim_optim_state_len(me->opt);
    float *slots = calloc(len ? len : 1, sizeof(float));
    if (!slots)
        return DSIM_ERR(DSIM_ENOMEM, -1, "tail_drop: out of memory");
    if (ctx->replica == 0 && len)
        memcpy(slots, init->optim_state, len * sizeof(float));
    int64_t step = ctx->replica == 0 ? (int64_t)init->optim_step : 0;
    if (e == DSIM_OK && len)
        e = dsim_broadcast(ctx->world, slots, len, DSIM_F32, 0);
    if (e == DSIM_OK)
        e = dsim_broadcast(ctx->world, &step, 1, DSIM_I64, 0);
    if (e == DSIM_OK)
        e = dsim_optim_set_state(me->opt, len ? slots : NULL, len, (uint64_t)step);
    free(slots);
    return e;
}

/* The bug: the blocks cover per * N parameters; the last n % N are left
 * out of both collectives. */
static dsim_err td_apply(dsim_replica_ctx *ctx, float *grad)
{
    td_replica *me = ctx->priv;
    size_t per = ctx->n_params / (size_t)ctx->shape.num_replicas;
    if (per > 0) {
        dsim_err e = dsim_reduce_scatter(ctx->world, grad, me->block, per, DSIM_F32, DSIM_SUM);
        if (e == DSIM_OK)
            e = dsim_allgather(ctx->world, me->block, grad, per, DSIM_F32);
        if (e != DSIM_OK)
            return e;
    }
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

static dsim_err td_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                          size_t n)
{
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

static dsim_err td_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    td_replica *me = ctx->priv;
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
    size_t len = dsim_optim_state_len(me->opt);
    if (len)
        memcpy(out->optim_state, dsim_optim_state(me->opt), len * sizeof(float));
    out->optim_step = dsim_optim_step(me->opt);
    return DSIM_OK;
}

static void td_fini(dsim_replica_ctx *ctx)
{
    td_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    free(me->block);
    me->opt = NULL;
    me->block = NULL;
}

static const struct dsim_strategy_ops td_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "tail_drop",
    .summary = "a reduce-scatter all-reduce that drops the n % N tail (a test fixture)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(td_replica),
    .check_shape = td_check_shape,
    .create_variables = td_create,
    .apply_gradients = td_apply,
    .reduce = td_reduce,
    .save = td_save,
    .replica_fini = td_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &td_ops;
}
