/* Planted bugs in a TPUStrategy of one's own, for the checks that catch
 * them. Each is built as its own plugin (tests/strategy/meson.build):
 *
 *   TPU_BUG_ONE_PIPELINE  "tpu_one_pipeline": every core of a host is fed
 *       from the host's one pipeline as a whole -- each core computes on
 *       the host's entire batch instead of its share of it -- so every
 *       example is read once per core. shard_coverage must say so.
 *   TPU_BUG_UNMASKED      "tpu_unmasked": short batches are padded to the
 *       static shape, as TPUStrategy does, but the padding is not masked
 *       (weight 1), so made-up zero examples enter the loss and the
 *       gradient. gradient_consistency (the one-device reference on the
 *       real examples) must catch it.
 *
 * Otherwise a correct TPU-style mirrored strategy: one SUM all-reduce of
 * the scaled gradients over every replica, the same update everywhere,
 * written against the public headers only, as a user's plugin is. */
#include "dsim/spi/strategy.h"

#include <stdlib.h>
#include <string.h>

#if defined(TPU_BUG_ONE_PIPELINE)
#define TPU_BUG_NAME "tpu_one_pipeline"
#elif defined(TPU_BUG_UNMASKED)
#define TPU_BUG_NAME "tpu_unmasked"
#else
#error "define TPU_BUG_ONE_PIPELINE or TPU_BUG_UNMASKED"
#endif

typedef struct tb_replica {
    dsim_optim *opt;
    uint64_t *ids; /* the host's whole batch (TPU_BUG_ONE_PIPELINE) */
    size_t cap;
} tb_replica;

static dsim_err tb_check_shape(const dsim_strategy_shape *s)
{
    if (!s->tpu || s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        TPU_BUG_NAME " runs on a TPU slice (cluster.tpu) without parameter "
                                     "servers; got %d host(s) x %d device(s), %d ps",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

static dsim_err tb_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    tb_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static dsim_err tb_apply(dsim_replica_ctx *ctx, float *grad)
{
    tb_replica *me = ctx->priv;
    dsim_err e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
    if (e != DSIM_OK)
        return e;
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

static dsim_err tb_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                          size_t n)
{
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

static void tb_fini(dsim_replica_ctx *ctx)
{
    tb_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    free(me->ids);
    me->opt = NULL;
    me->ids = NULL;
}

static dsim_err tb_feed(dsim_replica_ctx *ctx, const dsim_input_step *st, dsim_replica_feed *out)
{
#if defined(TPU_BUG_ONE_PIPELINE)
    /* The bug: the host's pipeline as a whole, on every core. */
    tb_replica *me = ctx->priv;
    if (st->examples > me->cap) {
        free(me->ids);
        me->ids = malloc(st->examples * sizeof *me->ids);
        me->cap = me->ids ? st->examples : 0;
        if (!me->ids)
            return DSIM_ERR(DSIM_ENOMEM, -1, TPU_BUG_NAME ": out of memory");
    }
    uint64_t k = 0;
    for (int d = 0; d < st->replicas; d++)
        for (uint64_t i = 0; i < st->batch[d].n; i++)
            me->ids[k++] = st->batch[d].ids[i];
    out->ids = me->ids;
    out->n = k;
    out->static_batch = k;
    out->padding_weight = 0.0f;
#else
    int64_t n = ctx->shape.num_replicas, g = ctx->shape.global_batch;
    uint64_t static_batch = (uint64_t)((g + n - 1) / n);
    const dsim_replica_batch *b = &st->batch[ctx->device];
    out->ids = b->ids;
    out->n = b->n;
    out->static_batch = b->n > static_batch ? b->n : static_batch;
    /* The bug: the padding weighs as much as a real example. */
    out->padding_weight = 1.0f;
#endif
    return DSIM_OK;
}

static const struct dsim_strategy_ops tb_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = TPU_BUG_NAME,
    .summary = "a TPUStrategy of one's own with a planted bug (tests/strategy)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(tb_replica),
    .check_shape = tb_check_shape,
    .create_variables = tb_create,
    .apply_gradients = tb_apply,
    .reduce = tb_reduce,
    .replica_fini = tb_fini,
    .feed = tb_feed,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &tb_ops;
}
