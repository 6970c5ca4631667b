/* Test fixtures: a correct mirrored strategy with one realistic bug each,
 * chosen at build time, for the checks that must catch them. Do not copy
 * these; see examples/custom_strategy for the right way.
 *
 *   -DBROKEN_MISMATCH   replica 1 packs its float gradient as half as many
 *                       doubles before the all-reduce ("it is the same
 *                       bytes"): the collective fingerprint stops the job
 *                       ("... allreduce #N with 18 float64 ...; ... with 36
 *                       float32: dtype and count differ") before any hang.
 *   -DBROKEN_REDUCE_OP  reduce() always MEAN-reduces, whatever op it is
 *                       asked for: every reported loss is the replicas'
 *                       mean where their sum was asked for (loss_consistency).
 *   -DBROKEN_SAVE       save() writes the parameters but not the optimizer's
 *                       slots or step: a restored run would restart momentum
 *                       from zero (checkpoint_roundtrip).
 *   -DBROKEN_CTX        apply_gradients() "fixes up" ctx->device, a field the
 *                       driver owns: refused by the driver's context check.
 *   -DBROKEN_STALE      applies each step's reduced gradient one step late
 *                       (an overlap of communication and compute gone wrong):
 *                       gradient_consistency says "stale by one step".
 *   -DBROKEN_TAIL       reduces its gradient in two buckets and averages the
 *                       last one: gradient_consistency names the parameter
 *                       range that is updated otherwise.
 *   -DBROKEN_RESTORE    create_variables() restores the parameters but starts
 *                       the optimizer afresh: init's slots and step are left
 *                       out. save() is right, the restore is not
 *                       (checkpoint_roundtrip: "restore: ...", node_loss:
 *                       "the optimizer state differs").
 *   -DBROKEN_RESTORE_STEP  the optimizer's step is restored one too high (a
 *                       step resumed off by one): Adam's bias correction
 *                       goes wrong after a restart.
 *   -DBROKEN_BCAST      the variables are broadcast on a fresh start only
 *                       (ctx->global_step 0): after a restore the chief holds
 *                       the checkpoint's variables and every other replica
 *                       keeps its own ("variables not broadcast after the
 *                       restore").
 *   -DBROKEN_LOCAL_SKIP under mixed_float16, decides whether to skip a step
 *                       from its own gradient before the all-reduce, so a
 *                       replica whose part overflowed skips and the others
 *                       apply the non-finite sum (gradient_consistency
 *                       names the disagreement)
 *   -DBROKEN_HANG       at global step 3, replica 3 waits in its own code for
 *                       a message nobody sends, until its timeout: the others
 *                       wait for it in the all-reduce (a planted hang for
 *                       `dsim trace desync`).
 *   -DBROKEN_SUB_MISMATCH  sums in two levels on communicators of its own
 *                       (dsim_comm_split: the host's replicas, then each
 *                       device's across the hosts), and replica 3 packs its
 *                       gradient as doubles in the host's all-reduce: the
 *                       fingerprint names the sub-communicator and the ranks
 *                       in both numberings, and `dsim trace desync` finds it
 *                       there.
 *   -DBROKEN_F16        all-reduces its gradient in float16 to halve the
 *                       bytes, though the job trains in float32 (and without
 *                       a loss scale): each update is off by float16's
 *                       rounding, a few 1e-4 of it, too little for any one
 *                       step to show against the one-device replay; over a
 *                       long run it builds up, and gradient_consistency's
 *                       step-by-step replay from the run's own variables
 *                       names the step (so that rounding built up over a
 *                       correct run is told from it).
 *   -DBROKEN_EARLY_APPLY  reduces its gradient in two buckets and applies
 *                       each as soon as its all-reduce is done, to overlap
 *                       the update with the next reduction: when the second
 *                       bucket's all-reduce fails, the first half of the
 *                       variables is updated and the rest is not (node_loss:
 *                       "applied a partial update").
 *   -DBROKEN_RETRY      wraps its update in a retry that re-applies it when
 *                       the all-reduce was slow; the retry fires at every
 *                       8th global step, after the update had gone through:
 *                       those steps are applied twice (under Adam the
 *                       second apply moves by about a step again, with the
 *                       same gradient: gradient_consistency's replay names
 *                       the spans that hold such a step).
 *   -DBROKEN_LOCAL_CLIP clips by the global norm (optimizer.global_clipnorm)
 *                       inside the replica, on its own gradient before the
 *                       all-reduce (tf.clip_by_global_norm in the function
 *                       strategy.run runs), and applies the sum unclipped:
 *                       Keras clips the aggregated gradient, so the updates
 *                       differ from the one-device replay's wherever the
 *                       clip acts (gradient_consistency). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/dtype.h"
#include "dsim/spi/strategy.h"

#if defined(BROKEN_MISMATCH)
#define BROKEN_NAME    "broken_mismatch"
#define BROKEN_SUMMARY "replica 1 all-reduces its gradient as doubles (a test fixture)"
#elif defined(BROKEN_REDUCE_OP)
#define BROKEN_NAME    "broken_reduce_op"
#define BROKEN_SUMMARY "reduce() ignores the op it is asked for (a test fixture)"
#elif defined(BROKEN_SAVE)
#define BROKEN_NAME    "broken_save"
#define BROKEN_SUMMARY "checkpoints without the optimizer's slots (a test fixture)"
#elif defined(BROKEN_CTX)
#define BROKEN_NAME    "broken_ctx"
#define BROKEN_SUMMARY "writes ctx->device, which the driver owns (a test fixture)"
#elif defined(BROKEN_STALE)
#define BROKEN_NAME    "broken_stale"
#define BROKEN_SUMMARY "applies each step's gradient one step late (a test fixture)"
#elif defined(BROKEN_TAIL)
#define BROKEN_NAME    "broken_tail"
#define BROKEN_SUMMARY "averages the last bucket of its gradient (a test fixture)"
#elif defined(BROKEN_HANG)
#define BROKEN_NAME    "broken_hang"
#define BROKEN_SUMMARY "replica 3 stops in its own code at step 3 (a test fixture)"
#elif defined(BROKEN_SUB_MISMATCH)
#define BROKEN_NAME "broken_sub_mismatch"
#define BROKEN_SUMMARY                                                                             \
    "replica 3 all-reduces as doubles on its host's sub-communicator (a test fixture)"
#elif defined(BROKEN_RESTORE)
#define BROKEN_NAME    "broken_restore"
#define BROKEN_SUMMARY "restores without the optimizer's slots and step (a test fixture)"
#elif defined(BROKEN_RESTORE_STEP)
#define BROKEN_NAME    "broken_restore_step"
#define BROKEN_SUMMARY "restores the optimizer's step off by one (a test fixture)"
#elif defined(BROKEN_BCAST)
#define BROKEN_NAME    "broken_bcast"
#define BROKEN_SUMMARY "does not broadcast the variables after a restore (a test fixture)"
#elif defined(BROKEN_LOCAL_SKIP)
#define BROKEN_NAME    "broken_local_skip"
#define BROKEN_SUMMARY "decides loss-scale skips from its local gradient (a test fixture)"
#elif defined(BROKEN_EARLY_APPLY)
#define BROKEN_NAME    "broken_early_apply"
#define BROKEN_SUMMARY "applies each bucket once it is reduced (a test fixture)"
#elif defined(BROKEN_LOCAL_CLIP)
#define BROKEN_NAME    "broken_local_clip"
#define BROKEN_SUMMARY "clips each replica's gradient by its own norm (a test fixture)"
#elif defined(BROKEN_RETRY)
#define BROKEN_NAME    "broken_retry"
#define BROKEN_SUMMARY "applies every 8th step's update twice (a test fixture)"
#elif defined(BROKEN_GATHER_TAIL)
#define BROKEN_NAME    "broken_gather_tail"
#define BROKEN_SUMMARY "copies back its all-gather but for the last element (a test fixture)"
#elif defined(BROKEN_F16)
#define BROKEN_NAME    "broken_f16"
#define BROKEN_SUMMARY "all-reduces its float32 gradient in float16 (a test fixture)"
#else
#error                                                                                             \
    "build with one of -DBROKEN_MISMATCH, -DBROKEN_REDUCE_OP, -DBROKEN_SAVE, -DBROKEN_CTX, -DBROKEN_STALE, -DBROKEN_TAIL"
#endif

/* The last bucket of -DBROKEN_TAIL: this many parameters. */
#define BROKEN_TAIL_LEN 9

typedef struct broken_replica {
    dsim_optim *opt;
    float *prev; /* -DBROKEN_STALE: the previous step's reduced gradient */
    /* -DBROKEN_SUB_MISMATCH: the host's replicas; each device's across hosts */
    dsim_comm *host, *across;
    dsim_optim *opt2; /* -DBROKEN_EARLY_APPLY: the second bucket's (opt: the first's) */
} broken_replica;

static dsim_err broken_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s takes no parameter servers; got %d", BROKEN_NAME,
                        s->num_ps);
    return DSIM_OK;
}

static dsim_err broken_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    broken_replica *me = ctx->priv;
#if defined(BROKEN_EARLY_APPLY)
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params / 2, &me->opt);
    if (e == DSIM_OK)
        e = dsim_optim_create(ctx->optim, ctx->n_params - ctx->n_params / 2, &me->opt2);
#elif defined(BROKEN_LOCAL_CLIP)
    /* the optimizer without the clip: the replica clips by itself */
    dsim_optim_spec unclipped = *ctx->optim;
    unclipped.global_clipnorm = 0.0;
    dsim_err e = dsim_optim_create(&unclipped, ctx->n_params, &me->opt);
#else
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
#endif
#if defined(BROKEN_SUB_MISMATCH)
    if (e == DSIM_OK)
        e = dsim_comm_split(ctx->world, ctx->worker, ctx->device, &me->host);
    if (e == DSIM_OK)
        e = dsim_comm_split(ctx->world, ctx->device, ctx->worker, &me->across);
#endif
    if (e != DSIM_OK)
        return e;
    if (init)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
#if defined(BROKEN_BCAST)
    /* THE BUG: "the variables were sent when the job started". */
    e = ctx->global_step == 0 ? dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0)
                              : DSIM_OK;
#else
    e = dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
#endif
    size_t len = dsim_optim_state_len(me->opt);
    float *slots = calloc(len ? len : 1, sizeof(float));
    if (!slots)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", BROKEN_NAME);
#if defined(BROKEN_RESTORE)
    /* THE BUG: the optimizer starts afresh whatever init holds. */
    int64_t step = 0;
#else
    if (init && len)
        memcpy(slots, init->optim_state, len * sizeof(float));
    int64_t step = init ? (int64_t)init->optim_step : 0;
#endif
#if defined(BROKEN_RESTORE_STEP)
    if (init && init->optim_step > 0)
        step++; /* THE BUG: resumed one step ahead */
#endif
    if (e == DSIM_OK && len)
        e = dsim_broadcast(ctx->world, slots, len, DSIM_F32, 0);
    if (e == DSIM_OK)
        e = dsim_broadcast(ctx->world, &step, 1, DSIM_I64, 0);
    if (e == DSIM_OK)
        e = dsim_optim_set_state(me->opt, len ? slots : NULL, len, (uint64_t)step);
    free(slots);
    return e;
}

static dsim_err broken_apply(dsim_replica_ctx *ctx, float *grad)
{
    broken_replica *me = ctx->priv;
    dsim_err e;
#if defined(BROKEN_HANG)
    if (ctx->replica == 3 && ctx->global_step == 3) {
        /* THE BUG: a wait of its own that nothing ends but the timeout. */
        dsim_req *r = NULL;
        uint64_t word = 0;
        e = dsim_irecv(ctx->ep, 0, DSIM_STRATEGY_COMM_USER, 1, &word, sizeof word, &r);
        if (e == DSIM_OK)
            e = dsim_wait(r,
                          ctx->timeout_ns > 0 ? dsim_rt_deadline(ctx->rt, 3 * ctx->timeout_ns)
                                              : DSIM_NO_DEADLINE,
                          NULL);
        return e == DSIM_OK ? DSIM_ERR(DSIM_EPROTO, -1, "%s: unexpected message", BROKEN_NAME) : e;
    }
#endif
#if defined(BROKEN_MISMATCH)
    if (ctx->replica == 1 && ctx->n_params % 2 == 0)
        /* THE BUG: the same bytes, another dtype and count. */
        e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params / 2, DSIM_F64, DSIM_SUM);
    else
#elif defined(BROKEN_SUB_MISMATCH)
    if (ctx->replica == 3 && ctx->n_params % 2 == 0)
        /* THE BUG: the same bytes, another dtype and count, in the host. */
        e = dsim_allreduce(me->host, grad, grad, ctx->n_params / 2, DSIM_F64, DSIM_SUM);
    else
        e = dsim_allreduce(me->host, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
    if (e == DSIM_OK)
        e = dsim_allreduce(me->across, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
    if (0) /* not the world's all-reduce below */
#elif defined(BROKEN_TAIL)
    size_t head = ctx->n_params > BROKEN_TAIL_LEN ? ctx->n_params - BROKEN_TAIL_LEN : 0;
    e = dsim_allreduce(ctx->world, grad + head, grad + head, ctx->n_params - head, DSIM_F32,
                       DSIM_MEAN); /* THE BUG: the last bucket averaged */
    if (e == DSIM_OK && head)
        e = dsim_allreduce(ctx->world, grad, grad, head, DSIM_F32, DSIM_SUM);
    else
#elif defined(BROKEN_EARLY_APPLY)
    /* THE BUG: the first bucket applied before the second is reduced. */
    size_t half = ctx->n_params / 2;
    e = dsim_allreduce(ctx->world, grad, grad, half, DSIM_F32, DSIM_SUM);
    if (e == DSIM_OK)
        e = dsim_optim_apply(me->opt, ctx->params, grad, half);
    if (e == DSIM_OK)
        e = dsim_allreduce(ctx->world, grad + half, grad + half, ctx->n_params - half, DSIM_F32,
                           DSIM_SUM);
    if (e == DSIM_OK)
        e = dsim_optim_apply(me->opt2, ctx->params + half, grad + half, ctx->n_params - half);
    return e;
    if (0)
#elif defined(BROKEN_GATHER_TAIL)
    /* A reduce-scatter of chunks padded to a multiple of the replicas, then
     * an all-gather; THE BUG: the copy back out of the padded buffer is one
     * element short, so the last element keeps the replica's own gradient. */
    size_t nr = (size_t)dsim_comm_size(ctx->world), chunk = (ctx->n_params + nr - 1) / nr;
    float *pad = calloc(2 * chunk * nr + chunk + 1, sizeof *pad);
    if (!pad)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", BROKEN_NAME);
    float *mine = pad + chunk * nr, *all = mine + chunk;
    memcpy(pad, grad, ctx->n_params * sizeof *grad);
    e = dsim_reduce_scatter(ctx->world, pad, mine, chunk, DSIM_F32, DSIM_SUM);
    if (e == DSIM_OK)
        e = dsim_allgather(ctx->world, mine, all, chunk, DSIM_F32);
    if (e == DSIM_OK)
        memcpy(grad, all, (ctx->n_params - 1) * sizeof *grad);
    free(pad);
    if (e != DSIM_OK)
        return e;
    if (0) /* not the world's all-reduce below */
#elif defined(BROKEN_F16)
    /* THE BUG: half the bytes on the wire, float16's rounding in every
     * update. */
    uint16_t *half = malloc(ctx->n_params * sizeof *half + 1);
    if (!half)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", BROKEN_NAME);
    e = dsim_convert(half, DSIM_F16, grad, DSIM_F32, ctx->n_params);
    if (e == DSIM_OK)
        e = dsim_allreduce(ctx->world, half, half, ctx->n_params, DSIM_F16, DSIM_SUM);
    if (e == DSIM_OK)
        e = dsim_convert(grad, DSIM_F32, half, DSIM_F16, ctx->n_params);
    free(half);
    if (e != DSIM_OK)
        return e;
    if (0) /* not the world's float32 all-reduce below */
#endif
#if defined(BROKEN_LOCAL_CLIP)
        /* THE BUG: the replica's own gradient clipped by its own norm, before
         * the all-reduce. */
        double norm = sqrt(dsim_optim_grad_sqsum(grad, ctx->n_params));
    if (ctx->optim->global_clipnorm > 0.0 && norm > ctx->optim->global_clipnorm) {
        float scale = (float)(ctx->optim->global_clipnorm / norm);
        for (size_t i = 0; i < ctx->n_params; i++)
            grad[i] *= scale;
    }
#endif
#if defined(BROKEN_LOCAL_SKIP)
    /* THE BUG: finiteness judged on this replica's own gradient, before
     * the all-reduce; Keras tests the aggregated one. */
    bool local_finite = dsim_all_finite(grad, ctx->n_params);
#endif
    e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
    if (e != DSIM_OK)
        return e;
#if defined(BROKEN_LOCAL_SKIP)
    if (!dsim_loss_scale_record(&ctx->loss_scale, local_finite)) {
        dsim_optim_skip(me->opt);
        return DSIM_OK;
    }
#endif
#if defined(BROKEN_STALE)
    /* THE BUG: last step's gradient applied, this one kept for the next. */
    if (!me->prev && !(me->prev = calloc(ctx->n_params, sizeof(float))))
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", BROKEN_NAME);
    for (size_t i = 0; i < ctx->n_params; i++) {
        float g = grad[i];
        grad[i] = me->prev[i];
        me->prev[i] = g;
    }
#endif
#if defined(BROKEN_CTX)
    /* THE BUG: the driver's field, "corrected" to a local device index. */
    ctx->device = 0;
#endif
#if defined(BROKEN_RETRY)
    /* THE BUG: the "retry" of an update that had gone through. */
    if (ctx->global_step % 8 == 7 &&
        (e = dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params)) != DSIM_OK)
        return e;
#endif
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

static dsim_err broken_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                              size_t n)
{
    memmove(out, in, n * sizeof(double));
#if defined(BROKEN_REDUCE_OP)
    (void)op; /* THE BUG: the op asked for is ignored. */
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, DSIM_MEAN);
#else
    return dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
#endif
}

static dsim_err broken_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    broken_replica *me = ctx->priv;
    memcpy(out->params, ctx->params, ctx->n_params * sizeof(float));
#if defined(BROKEN_SAVE)
    /* THE BUG: the optimizer's slots and step are left out. */
    (void)me;
#else
    size_t len = dsim_optim_state_len(me->opt);
    if (len)
        memcpy(out->optim_state, dsim_optim_state(me->opt), len * sizeof(float));
    out->optim_step = dsim_optim_step(me->opt);
#endif
    return DSIM_OK;
}

static void broken_fini(dsim_replica_ctx *ctx)
{
    broken_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    dsim_optim_destroy(me->opt2);
    free(me->prev);
    dsim_comm_free(me->host);
    dsim_comm_free(me->across);
}

static const struct dsim_strategy_ops broken_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = BROKEN_NAME,
    .summary = BROKEN_SUMMARY,
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(broken_replica),
    .check_shape = broken_check_shape,
    .create_variables = broken_create,
    .apply_gradients = broken_apply,
    .reduce = broken_reduce,
    .save = broken_save,
    .replica_fini = broken_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &broken_ops;
}
