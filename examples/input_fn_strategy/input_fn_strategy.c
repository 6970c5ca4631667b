/* A strategy that distributes its own input: TF's
 * strategy.distribute_datasets_from_function(input_fn).
 *
 * "sharded_input" keeps a copy of the variables on every replica (as
 * multi_worker_mirrored) and, instead of dsim's auto-sharding, says itself
 * which examples each replica reads. Its input_fn is what a TF user writes:
 *
 *   def input_fn(ctx):                      # tf.distribute.InputContext
 *       b = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
 *       ds = dataset.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
 *       return ds.shuffle(...).batch(b)
 *
 * except that its shard is a contiguous range (the first n % P pipelines
 * get one example more), so that its planted bugs (below) are easy to see.
 * dsim calls it once per pipeline (worker) and epoch, hands element k to
 * the worker's local replica k % devices at step k / devices, records what
 * each replica read, and shard_coverage judges the choice.
 *
 * Build:  meson compile -C build (this folder's meson.build), or by hand:
 *   cc -shared -fPIC -I<dsim>/src/include input_fn_strategy.c \
 *      -o libinput_fn_strategy.so -ldsim
 * Use:    strategy: {name: sharded_input, plugin: libinput_fn_strategy.so}
 *         (scenarios/input_fn.yaml).
 *
 * Built with one of these it is a test fixture with a bug shard_coverage
 * must name (tests/verdicts):
 *   -DBUG_WHOLE        every pipeline reads the whole dataset (no shard)
 *   -DBUG_PER_REPLICA  shards into num_replicas_in_sync pieces, one per
 *                      replica, but there is one pipeline per worker
 *   -DBUG_DROP_LAST    each pipeline takes n / P examples, rounded down:
 *                      the remainder at the dataset's end is read by nobody */
#include "dsim/spi/strategy.h"

#include <stdlib.h>
#include <string.h>

#if defined(BUG_WHOLE)
#define SI_NAME "sharded_input_whole"
#elif defined(BUG_PER_REPLICA)
#define SI_NAME "sharded_input_per_replica"
#elif defined(BUG_DROP_LAST)
#define SI_NAME "sharded_input_drop_last"
#else
#define SI_NAME "sharded_input"
#endif

typedef struct si_replica {
    dsim_optim *opt;
} si_replica;

/* This pipeline's examples: [*first, *first + *count). */
static void si_share(const dsim_input_context *ic, uint64_t n, uint64_t *first, uint64_t *count)
{
    size_t f = 0, c = 0;
#if defined(BUG_WHOLE)
    /* THE BUG: no shard at all. */
    (void)ic;
    c = (size_t)n;
#elif defined(BUG_PER_REPLICA)
    /* THE BUG: one shard per replica, but the pipelines are the workers. */
    dsim_strategy_shard_range((size_t)n, ic->num_replicas_in_sync, ic->input_pipeline_id, &f, &c);
#elif defined(BUG_DROP_LAST)
    /* THE BUG: n / P each; the last n % P examples belong to nobody. */
    c = (size_t)(n / (uint64_t)ic->num_input_pipelines);
    f = c * (size_t)ic->input_pipeline_id;
#else
    dsim_strategy_shard_range((size_t)n, ic->num_input_pipelines, ic->input_pipeline_id, &f, &c);
#endif
    *first = f;
    *count = c;
}

static dsim_err si_input_fn(const dsim_input_context *ic, uint32_t epoch, dsim_input_batches *out)
{
    int64_t b = 0;
    DSIM_CHECK(dsim_input_context_per_replica_batch(ic, ic->global_batch, &b));
    uint64_t first = 0, count = 0;
    si_share(ic, ic->dataset->n_examples, &first, &count);
    uint64_t *ids = malloc((count ? count : 1) * sizeof *ids);
    if (!ids)
        return DSIM_ERR(DSIM_ENOMEM, -1, SI_NAME ": out of memory for %llu ids",
                        (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++)
        ids[i] = first + i;
    if (ic->shuffle) {
        /* a shuffle of its own, the same on every call: keyed by the job's
         * seed, the epoch and the pipeline */
        dsim_rng r;
        dsim_rng_init(&r, ic->seed, "sharded_input.shuffle",
                      (uint64_t)epoch * (uint64_t)ic->num_input_pipelines +
                          (uint64_t)ic->input_pipeline_id);
        for (uint64_t i = count; i > 1; i--) {
            uint64_t j = dsim_rng_below(&r, i), t = ids[i - 1];
            ids[i - 1] = ids[j];
            ids[j] = t;
        }
    }
    dsim_err e = DSIM_OK;
    for (uint64_t at = 0; at < count && e == DSIM_OK; at += (uint64_t)b) {
        uint64_t k = count - at < (uint64_t)b ? count - at : (uint64_t)b;
        if (k < (uint64_t)b && ic->drop_remainder)
            break;
        e = dsim_input_batches_add(out, ids + at, k);
    }
    free(ids);
    return e;
}

static dsim_err si_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        SI_NAME " takes no parameter servers; got %d host(s) x %d device(s) with "
                                "%d ps (set num_ps to 0)",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

static dsim_err si_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    si_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    if (ctx->replica == 0) {
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
        e = dsim_optim_set_state(me->opt, init->optim_state, init->optim_state_len,
                                 init->optim_step);
        if (e != DSIM_OK)
            return e;
    }
    e = dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
    size_t len = dsim_optim_state_len(me->opt);
    float *slots = calloc(len ? len : 1, sizeof(float));
    if (!slots)
        return DSIM_ERR(DSIM_ENOMEM, -1, SI_NAME ": out of memory");
    if (len)
        memcpy(slots, dsim_optim_state(me->opt), len * sizeof(float));
    int64_t step = (int64_t)dsim_optim_step(me->opt);
    if (e == DSIM_OK && len)
        e = dsim_broadcast(ctx->world, slots, len, DSIM_F32, 0);
    if (e == DSIM_OK)
        e = dsim_broadcast(ctx->world, &step, 1, DSIM_I64, 0);
    if (e == DSIM_OK)
        e = dsim_optim_set_state(me->opt, len ? slots : NULL, len, (uint64_t)step);
    free(slots);
    return e;
}

/* The gradients (already scaled by 1/global_batch) SUM-all-reduced in the
 * job's gradient dtype, then Keras's loss-scale rules on the sum. */
static dsim_err si_apply(dsim_replica_ctx *ctx, float *grad)
{
    si_replica *me = ctx->priv;
    DSIM_CHECK(dsim_strategy_allreduce_grad(ctx, ctx->world, grad, ctx->n_params));
    return dsim_strategy_apply_scaled(ctx, me->opt, ctx->params, grad, ctx->n_params, NULL);
}

static dsim_err si_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                          size_t n)
{
    if (op != DSIM_SUM && op != DSIM_MEAN)
        return DSIM_ERR(DSIM_EINVAL, -1, SI_NAME ": reduce takes SUM or MEAN");
    memmove(out, in, n * sizeof(double));
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
}

static dsim_err si_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    si_replica *me = ctx->priv;
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
    size_t len = dsim_optim_state_len(me->opt);
    if (len)
        memcpy(out->optim_state, dsim_optim_state(me->opt), len * sizeof(float));
    out->optim_step = dsim_optim_step(me->opt);
    return DSIM_OK;
}

static void si_fini(dsim_replica_ctx *ctx)
{
    si_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    me->opt = NULL;
}

static const struct dsim_strategy_ops si_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = SI_NAME,
    .summary = "mirrored variables, each worker's input from the strategy's own input_fn "
               "(distribute_datasets_from_function; a worked example)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(si_replica),
    .check_shape = si_check_shape,
    .create_variables = si_create,
    .apply_gradients = si_apply,
    .reduce = si_reduce,
    .save = si_save,
    .replica_fini = si_fini,
    .input_fn = si_input_fn,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &si_ops;
}
