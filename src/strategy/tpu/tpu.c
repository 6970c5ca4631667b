/* tpu: TF's TPUStrategy, on a simulated TPU slice. There is no TPU here:
 * every replica (a TensorCore on v2/v3, a chip on v4 and v5e) is a dsim
 * worker on this machine's CPU, and the slice (dsim/tpu.h) gives the job its
 * shape: its hosts, the replicas of each host, their places on the torus.
 *
 * What TPUStrategy does, and this strategy does:
 *   - every replica in sync: one SUM all-reduce of the already-scaled
 *     gradients over every replica (the job's algorithm; torus runs the
 *     rings of the slice's ICI), then the same update everywhere;
 *   - variables mirrored on every core: TPUMirroredVariable, the chief's
 *     initial values broadcast (dsim_replicated_*);
 *   - one input pipeline per TPU host, feeding that host's cores: the
 *     driver's input is one per worker, and a worker here is a TPU host
 *     (InputContext.num_input_pipelines = hosts); the host's share of each
 *     global batch is split over its cores (st->batch[device]);
 *   - TensorFlow's shape rules. With RunOptions.
 *     experimental_enable_dynamic_batch_size (the default), a short batch --
 *     a partial last batch, or a global batch the replicas do not divide --
 *     is padded to the static per-replica batch ceil(global / replicas) and
 *     the padding is masked out of the loss and the gradient (weight 0);
 *     padded examples are never recorded as read. With it off
 *     (dsim_train_cfg.static_shapes) such a job is refused before it runs
 *     (dsim_train_check_static_shapes).
 *
 *   host 0 pipeline ── batch of G/H ─┬─ core 0: G/N (+ padding, masked)
 *                                    ├─ core 1: G/N
 *                                    └─ ...            all-reduce SUM over
 *   host 1 pipeline ── batch of G/H ─┬─ core 0          every core (torus)
 *                                    └─ ...
 *
 * Precision: TPU scenarios default to Keras' mixed_bfloat16 policy
 * (DSIM_TPU_DEFAULT_POLICY): the driver rounds each replica's passes to
 * bfloat16; variables and the all-reduce stay float32. */
#include "../strategy_int.h"

static dsim_err tpu_check_shape(const dsim_strategy_shape *s)
{
    if (!s->tpu)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "tpu runs on a TPU slice (TPUStrategy needs a TPU system): give the "
                        "slice, e.g. cluster: {tpu: v3-8} (simulated; no TPU is used); got %d "
                        "host(s) x %d device(s) without one. On GPUs or CPUs use mirrored or "
                        "multi_worker_mirrored",
                        s->hosts, s->devices_per_host);
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "tpu takes no parameter servers; got %d ps on %s (set cluster.ps to 0, "
                        "or use parameter_server)",
                        s->num_ps, s->tpu->name);
    if (s->hosts != s->tpu->hosts || s->devices_per_host != s->tpu->replicas_per_host)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "tpu: the job is %d host(s) x %d device(s) but TPU %s is %d host(s) x %d "
                        "replica(s); run the slice's shape",
                        s->hosts, s->devices_per_host, s->tpu->name, s->tpu->hosts,
                        s->tpu->replicas_per_host);
    return DSIM_OK;
}

/* Each core computes on its own sub-batch of its host's step, padded to the
 * static per-replica batch; the padding weighs nothing. */
static dsim_err tpu_feed(dsim_replica_ctx *ctx, const dsim_input_step *st, dsim_replica_feed *out)
{
    const dsim_replica_batch *b = &st->batch[ctx->device];
    int64_t n = ctx->shape.num_replicas, g = ctx->shape.global_batch;
    uint64_t static_batch = (uint64_t)((g + n - 1) / n);
    out->ids = b->ids;
    out->n = b->n;
    out->static_batch = b->n > static_batch ? b->n : static_batch;
    out->padding_weight = 0.0f;
    return DSIM_OK;
}

const struct dsim_strategy_ops dsim_strategy_tpu_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "tpu",
    .summary = "TPUStrategy on a simulated TPU slice (no TPU used): one input pipeline per "
               "host, short batches padded and masked, variables mirrored on every core",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(dsim_replicated),
    .check_shape = tpu_check_shape,
    .replica_fini = dsim_replicated_fini,
    .create_variables = dsim_replicated_create,
    .apply_gradients = dsim_replicated_apply,
    .reduce = dsim_replicated_reduce,
    .save = dsim_replicated_save,
    .feed = tpu_feed,
};
