/* Planted bugs in the sharded-optimizer example (ZeRO stage 1,
 * examples/sharded_optimizer), the two people make when they write one:
 *
 *   ZERO_BUG_SAVE     save() writes only the chief's own shard of the
 *                     optimizer's slots (the state was never consolidated:
 *                     PyTorch's ZeroRedundancyOptimizer needs
 *                     consolidate_state_dict() before state_dict()); the
 *                     other shards' slots are left zero in the file
 *   ZERO_BUG_RESTORE  create_variables() gives every replica the slots of
 *                     shard 0 of the restored checkpoint, not its own
 *   ZERO_BUG_CLIP     each replica's shard of the gradient applied with
 *                     dsim_optim_apply, which clips it (global_clipnorm) by
 *                     the shard's own norm, not the whole gradient's
 *   ZERO_BUG_MEAN     the gradients reduce-scattered with MEAN, though each
 *                     replica's is already scaled by 1 / global batch (the
 *                     update is 1/N of the right one: under Adam, whose
 *                     update hardly depends on the gradient's scale, it
 *                     shows only in the gradient applied)
 *
 * The first two train correctly until a checkpoint is read back; dsim's
 * checkpoint_roundtrip names the op that is wrong. The third trains wrong
 * wherever the clip acts, the fourth everywhere; gradient_consistency
 * fails. And ZERO_UNSAID, no bug: the example as one writes it who does not
 * tell dsim which part of the model each optimizer updates
 * (dsim_optim_set_part), whose gradients dsim cannot put together. Built
 * from the example's own source, with its entry point renamed. */
#include "dsim/comm.h"
#include "dsim/optim.h"
#if defined(ZERO_BUG_CLIP)
/* the example's call, as one who does not know the shard is a part makes it */
#define dsim_optim_apply_norm(opt, p, g, n, norm) ((void)(norm), dsim_optim_apply(opt, p, g, n))
#elif defined(ZERO_BUG_MEAN)
#define dsim_reduce_scatter(comm, s, r, n, t, op) dsim_reduce_scatter(comm, s, r, n, t, DSIM_MEAN)
#elif defined(ZERO_UNSAID)
#define dsim_optim_set_part(opt, offset, n) ((void)(opt), (void)(offset), (void)(n), DSIM_OK)
#endif
#define dsim_strategy_plugin zero_example_plugin
#include "../../examples/sharded_optimizer/sharded_optimizer.c"
#undef dsim_strategy_plugin

#if defined(ZERO_BUG_SAVE)
static dsim_err bug_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    zero_replica *me = ctx->priv;
    memcpy(out->params, ctx->params, me->n * sizeof(float));
    const float *st = dsim_optim_state(me->opt);
    for (size_t s = 0; s < me->slots && out->optim_state; s++) {
        memset(out->optim_state + s * me->n, 0, me->n * sizeof(float));
        memcpy(out->optim_state + s * me->n + me->lo, st + s * me->len, me->len * sizeof(float));
    }
    out->optim_step = dsim_optim_step(me->opt);
    return DSIM_OK;
}
#define BUG_NAME   "zero_bug_save"
#define BUG_SAVE   bug_save
#define BUG_CREATE zero_create
#elif defined(ZERO_BUG_RESTORE)
static dsim_err bug_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    zero_replica *me = ctx->priv;
    size_t lo = me->lo;
    me->lo = 0; /* reads shard 0's slots ... */
    dsim_err e = zero_create(ctx, init);
    me->lo = lo; /* ... and goes on updating its own shard with them */
    return e;
}
#define BUG_NAME   "zero_bug_restore"
#define BUG_SAVE   zero_save
#define BUG_CREATE bug_create
#elif defined(ZERO_BUG_CLIP)
#define BUG_NAME   "zero_bug_clip"
#define BUG_SAVE   zero_save
#define BUG_CREATE zero_create
#elif defined(ZERO_BUG_MEAN)
#define BUG_NAME   "zero_bug_mean"
#define BUG_SAVE   zero_save
#define BUG_CREATE zero_create
#elif defined(ZERO_UNSAID)
#define BUG_NAME   "zero_unsaid"
#define BUG_SAVE   zero_save
#define BUG_CREATE zero_create
#else
#error "define ZERO_BUG_SAVE, ZERO_BUG_RESTORE, ZERO_BUG_CLIP, ZERO_BUG_MEAN or ZERO_UNSAID"
#endif

static const struct dsim_strategy_ops bug_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = BUG_NAME,
    .summary = "zero_sharded with a planted bug",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(zero_replica),
    .check_shape = zero_check_shape,
    .replica_init = zero_init,
    .create_variables = BUG_CREATE,
    .apply_gradients = zero_apply,
    .reduce = zero_reduce,
    .save = BUG_SAVE,
    .replica_fini = zero_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    (void)zero_example_plugin;
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &bug_ops;
}
