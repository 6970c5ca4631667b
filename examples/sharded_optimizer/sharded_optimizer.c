/* A strategy that shards the optimizer's state over the replicas, as
 * DeepSpeed's ZeRO stage 1 and PyTorch's ZeroRedundancyOptimizer do.
 *
 * "zero_sharded" keeps the whole model on every replica (like
 * multi_worker_mirrored) but each replica owns the optimizer's slots of one
 * shard of the parameters only (Adam's m and v: 2/N of the model's size a
 * replica instead of 2). A step:
 *
 *   reduce-scatter the gradients      replica r gets the sum of shard r
 *   update shard r                    with its own optimizer, on its own slots
 *   all-gather the parameters         every replica holds every shard again
 *
 * The update is element-wise, so updating a shard gives the same bits as
 * updating the whole model; each element is computed by one replica and
 * copied to the others, so every replica ends the step with the same bits,
 * as dsim's gradient_consistency checks. The model's size need not divide
 * by the replica count: the buffers are padded with zeros to N shards of
 * equal length (what dsim_reduce_scatter and dsim_allgather take), and the
 * padding is never written to the variables.
 *
 * Under mixed_float16 the replicas skip a step together when the summed
 * gradient is not finite anywhere (Keras's LossScaleOptimizer: they agree
 * on it first, each holding a shard of it).
 *
 * A checkpoint holds the whole model's slots (dsim/optim.h's layout): save()
 * gathers every replica's shard of each slot; create_variables() gives
 * each replica its shard of the slots the chief holds (a restart resumes
 * with the optimizer where it was).
 *
 * Build:  in the dsim tree it is built with everything else
 *         (build/examples/sharded_optimizer/libsharded_optimizer.so); out of
 *         tree:
 *   cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags dsim) \
 *      sharded_optimizer.c -o libsharded_optimizer.so $(pkg-config --libs dsim)
 * Run:    dsim conformance build/examples/sharded_optimizer/libsharded_optimizer.so
 *         dsim run scenarios/sharded_optimizer.yaml --plugin-dir DIR */
#include "dsim/spi/strategy.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct zero_replica {
    dsim_optim *opt; /* the optimizer of this replica's shard */
    size_t n;        /* parameters of the model */
    size_t shard;    /* parameters of a shard: ceil(n / replicas) */
    size_t lo, len;  /* this replica's shard: [lo, lo + len) of the model, len <= shard */
    size_t slots;    /* slot arrays of the optimizer: 0 (sgd) to 4 (dsim/optim.h) */
    float *padded;   /* replicas x shard floats: the gradient, then the parameters */
    float *mine;     /* shard floats: this replica's summed gradient */
} zero_replica;

static dsim_err zero_oom(void)
{
    return DSIM_ERR(DSIM_ENOMEM, -1, "zero_sharded: out of memory");
}

static dsim_err zero_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "zero_sharded takes no parameter servers; got %d host(s) x %d "
                        "device(s) with %d ps (set num_ps to 0)",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

static dsim_err zero_init(dsim_replica_ctx *ctx)
{
    zero_replica *me = ctx->priv;
    size_t n = ctx->n_params, N = (size_t)ctx->shape.num_replicas;
    if (ctx->gradient_dtype != DSIM_F32)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "zero_sharded reduce-scatters the gradients in float32; leave "
                        "strategy.gradient_dtype at float32 (mixed_precision's policies are "
                        "fine)");
    me->n = n;
    me->shard = (n + N - 1) / N;
    me->lo = (size_t)ctx->replica * me->shard;
    me->len = me->lo >= n ? 0 : (n - me->lo < me->shard ? n - me->lo : me->shard);
    me->padded = calloc(N * me->shard + 1, sizeof(float));
    me->mine = calloc(me->shard + 1, sizeof(float));
    if (!me->padded || !me->mine)
        return zero_oom();
    /* The optimizer of the shard alone (of at least one parameter: a
     * replica whose shard is past the model's end keeps an idle one). */
    dsim_err e = dsim_optim_create(ctx->optim, me->len ? me->len : 1, &me->opt);
    if (e != DSIM_OK)
        return e;
    /* Which parameters of the model it updates: dsim then puts the shards'
     * gradients together and compares them with one device's (under Adam,
     * whose updates would hide an error in them). */
    if (me->len && (e = dsim_optim_set_part(me->opt, me->lo, n)) != DSIM_OK)
        return e;
    size_t per = me->len ? me->len : 1;
    me->slots = dsim_optim_state_len(me->opt) / per;
    return DSIM_OK;
}

static dsim_err zero_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    zero_replica *me = ctx->priv;
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, me->n * sizeof(float));
    dsim_err e = dsim_broadcast(ctx->world, ctx->params, me->n, DSIM_F32, 0);
    /* The whole model's slots from the chief, then each keeps its shard. */
    size_t all = me->slots * me->n;
    float *slots = calloc(all + 1, sizeof(float));
    if (!slots)
        return zero_oom();
    if (ctx->replica == 0 && all)
        memcpy(slots, init->optim_state, all * sizeof(float));
    int64_t step = ctx->replica == 0 ? (int64_t)init->optim_step : 0;
    if (e == DSIM_OK && all)
        e = dsim_broadcast(ctx->world, slots, all, DSIM_F32, 0);
    if (e == DSIM_OK)
        e = dsim_broadcast(ctx->world, &step, 1, DSIM_I64, 0);
    if (e == DSIM_OK) {
        size_t per = me->len ? me->len : 1;
        float *mine = calloc(me->slots * per + 1, sizeof(float));
        if (!mine) {
            free(slots);
            return zero_oom();
        }
        for (size_t s = 0; s < me->slots && me->len; s++)
            memcpy(mine + s * per, slots + s * me->n + me->lo, me->len * sizeof(float));
        e = dsim_optim_set_state(me->opt, me->slots ? mine : NULL, me->slots * per, (uint64_t)step);
        free(mine);
    }
    free(slots);
    return e;
}

static dsim_err zero_apply(dsim_replica_ctx *ctx, float *grad)
{
    zero_replica *me = ctx->priv;
    size_t N = (size_t)ctx->shape.num_replicas;
    /* The gradient padded to N equal shards; replica r gets shard r's sum. */
    memcpy(me->padded, grad, me->n * sizeof(float));
    memset(me->padded + me->n, 0, (N * me->shard - me->n) * sizeof(float));
    dsim_err e =
        dsim_reduce_scatter(ctx->world, me->padded, me->mine, me->shard, DSIM_F32, DSIM_SUM);
    if (e != DSIM_OK)
        return e;
    if (dsim_comm_virtual(ctx->world))
        return dsim_allgather(ctx->world, me->mine, me->padded, me->shard, DSIM_F32);
    /* Under mixed_float16's dynamic loss scale, Keras's LossScaleOptimizer:
     * every replica skips the update alike when any value of the AGGREGATED
     * gradient is not finite. Each replica holds a shard of it, so the
     * replicas agree on the answer first. */
    bool apply = true;
    if (ctx->loss_scale.dynamic) {
        int32_t bad = 0;
        for (size_t i = 0; i < me->len && !bad; i++)
            bad = !isfinite(me->mine[i]);
        e = dsim_allreduce(ctx->world, &bad, &bad, 1, DSIM_I32, DSIM_MAX);
        if (e != DSIM_OK)
            return e;
        apply = dsim_loss_scale_record(&ctx->loss_scale, bad == 0);
    }
    /* Keras's global_clipnorm clips the aggregated gradient by the norm of
     * ALL of it: each replica holds a shard, so the shards' sums of squares
     * are summed first. (dsim_optim_apply would clip each shard by its own
     * norm: every shard scaled differently.) */
    double norm = 0.0;
    if (dsim_optim_needs_global_norm(ctx->optim)) {
        double sq = dsim_optim_grad_sqsum(me->mine, me->len);
        e = dsim_allreduce(ctx->world, &sq, &sq, 1, DSIM_F64, DSIM_SUM);
        if (e != DSIM_OK)
            return e;
        norm = sqrt(sq);
    }
    /* This replica's shard of the parameters, updated; its padding stays 0. */
    float *out = me->padded + (size_t)ctx->replica * me->shard;
    memset(out, 0, me->shard * sizeof(float));
    if (me->len)
        memcpy(out, ctx->params + me->lo, me->len * sizeof(float));
    if (me->len && apply)
        e = dsim_optim_apply_norm(me->opt, out, me->mine, me->len, norm);
    else
        dsim_optim_skip(me->opt); /* its step counter keeps up */
    if (e != DSIM_OK)
        return e;
    /* In place: each replica's block already sits at its own offset. */
    e = dsim_allgather(ctx->world, out, me->padded, me->shard, DSIM_F32);
    if (e != DSIM_OK)
        return e;
    memcpy(ctx->params, me->padded, me->n * sizeof(float));
    return DSIM_OK;
}

static dsim_err zero_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                            size_t n)
{
    if (op != DSIM_SUM && op != DSIM_MEAN)
        return DSIM_ERR(DSIM_EINVAL, -1, "zero_sharded: reduce takes SUM or MEAN");
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

/* Collective: every replica's shard of each slot goes to everyone (an
 * all-gather per slot array), and the chief's copy is written. */
static dsim_err zero_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    zero_replica *me = ctx->priv;
    memcpy(out->params, ctx->params, me->n * sizeof(float));
    const float *st = dsim_optim_state(me->opt);
    size_t per = me->len ? me->len : 1;
    float *block = calloc(me->shard + 1, sizeof(float));
    if (!block)
        return zero_oom();
    dsim_err e = DSIM_OK;
    for (size_t s = 0; s < me->slots && e == DSIM_OK; s++) {
        memset(block, 0, me->shard * sizeof(float));
        if (me->len)
            memcpy(block, st + s * per, me->len * sizeof(float));
        e = dsim_allgather(ctx->world, block, me->padded, me->shard, DSIM_F32);
        if (e == DSIM_OK && out->optim_state)
            memcpy(out->optim_state + s * me->n, me->padded, me->n * sizeof(float));
    }
    free(block);
    out->optim_step = dsim_optim_step(me->opt);
    return e;
}

static void zero_fini(dsim_replica_ctx *ctx)
{
    zero_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    free(me->padded);
    free(me->mine);
    memset(me, 0, sizeof *me);
}

static const struct dsim_strategy_ops zero_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "zero_sharded",
    .summary = "mirrored variables, the optimizer's slots sharded over the replicas "
               "(ZeRO stage 1): reduce-scatter, update a shard, all-gather",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(zero_replica),
    .check_shape = zero_check_shape,
    .replica_init = zero_init,
    .create_variables = zero_create,
    .apply_gradients = zero_apply,
    .reduce = zero_reduce,
    .save = zero_save,
    .replica_fini = zero_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &zero_ops;
}
