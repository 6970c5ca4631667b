/* The strategy dispatch file: every call into a strategy's ops table goes
 * through here, so the "not supported" stubs, the defaults of optional
 * members and the checks of what a strategy hands back live in one place. */
#include <stdio.h>
#include <string.h>

#include "dsim/log.h"
#include "strategy_int.h"

static const char *const strategy_placement_names[DSIM_PLACE_COUNT] = {
    [DSIM_PLACE_UNSPECIFIED] = "unspecified", [DSIM_PLACE_ONE_DEVICE] = "one_device",
    [DSIM_PLACE_MIRRORED] = "mirrored",       [DSIM_PLACE_CENTRAL] = "central",
    [DSIM_PLACE_SHARDED] = "sharded",
};

const char *dsim_var_placement_name(dsim_var_placement p)
{
    if ((int)p < 0 || p >= DSIM_PLACE_COUNT)
        return "unknown";
    return strategy_placement_names[p];
}

dsim_err dsim_strategy_check_shape(const dsim_strategy *s, const dsim_strategy_shape *shape)
{
    dsim_err e = s->ops->check_shape(shape);
    if (e != DSIM_OK && dsim_last_error()->code != e)
        return DSIM_ERR(e, -1, "strategy '%s' refuses %d hosts x %d devices with %d ps", s->name,
                        shape->hosts, shape->devices_per_host, shape->num_ps);
    if (e == DSIM_OK && shape->num_ps > 0 && !s->ops->serve)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "strategy '%s' accepted %d parameter servers but has no serve member; "
                        "set num_ps to 0 or implement server_init/serve",
                        s->name, shape->num_ps);
    return e;
}

int dsim_strategy_replicas_in_sync(const dsim_strategy *s, const dsim_strategy_shape *shape)
{
    if (!s->ops->num_replicas_in_sync)
        return shape->num_replicas;
    return s->ops->num_replicas_in_sync(shape);
}

static dsim_err strategy_owned_check(const dsim_strategy *s, const char *member,
                                     dsim_replica_ctx *ctx, const dsim_replica_ctx *was,
                                     dsim_err e);

dsim_err dsim_strategy_replica_init(const dsim_strategy *s, dsim_replica_ctx *ctx)
{
    if (!s->ops->replica_init)
        return DSIM_OK; /* optional: nothing to set up */
    dsim_replica_ctx was = *ctx;
    return strategy_owned_check(s, "replica_init", ctx, &was, s->ops->replica_init(ctx));
}

void dsim_strategy_replica_fini(const dsim_strategy *s, dsim_replica_ctx *ctx)
{
    if (s->ops->replica_fini)
        s->ops->replica_fini(ctx);
}

/* A strategy that fails without saying why still leaves a sentence naming
 * itself and the member. */
static dsim_err strategy_failed(const dsim_strategy *s, const char *member, dsim_err e)
{
    if (dsim_last_error()->code != e || dsim_errmsg()[0] == '\0')
        return DSIM_ERR(e, -1, "strategy '%s': %s failed: %s", s->name, member, dsim_strerror(e));
    return e;
}

/* The replica context's contract: the driver fills and owns every field;
 * a strategy writes the values behind ctx->params and its own ctx->priv,
 * and under mixed precision ctx->loss_scale and ctx->gradient_dtype_applied
 * (dsim_strategy_apply_scaled and dsim_strategy_allreduce_grad do), nothing
 * else. A strategy that "fixes up" a field (ctx->device to a local
 * index, ctx->world to a communicator of its own) breaks the driver's view
 * of the job in ways that show up much later, if at all, so every call
 * that hands a strategy the context is bracketed by a snapshot of it and a
 * comparison. On a difference the field is put back and the call fails,
 * naming the member and the field. */
#define STRATEGY_OWNED(X)                                                                          \
    X(shape.hosts)                                                                                 \
    X(shape.devices_per_host)                                                                      \
    X(shape.num_replicas)                                                                          \
    X(shape.num_ps)                                                                                \
    X(shape.ps_mode)                                                                               \
    X(shape.global_batch)                                                                          \
    X(replica)                                                                                     \
    X(worker)                                                                                      \
    X(device)                                                                                      \
    X(algo)                                                                                        \
    X(server_rank0)                                                                                \
    X(timeout_ns)                                                                                  \
    X(n_params)                                                                                    \
    X(global_step)                                                                                 \
    X(precision)                                                                                   \
    X(gradient_dtype)
#define STRATEGY_OWNED_PTR(X)                                                                      \
    X(shape.tpu) X(rt) X(fabric) X(ep) X(world) X(model) X(optim) X(params) X(priv)

static dsim_err strategy_owned_check(const dsim_strategy *s, const char *member,
                                     dsim_replica_ctx *ctx, const dsim_replica_ctx *was, dsim_err e)
{
    const char *field = NULL;
    long long before = 0, after = 0;
    int is_ptr = 0;
#define STRATEGY_CMP(f)                                                                            \
    if (!field && ctx->f != was->f) {                                                              \
        field = #f;                                                                                \
        before = (long long)was->f;                                                                \
        after = (long long)ctx->f;                                                                 \
    }
#define STRATEGY_CMP_PTR(f)                                                                        \
    if (!field && ctx->f != was->f) {                                                              \
        field = #f;                                                                                \
        is_ptr = 1;                                                                                \
    }
    STRATEGY_OWNED(STRATEGY_CMP)
    STRATEGY_OWNED_PTR(STRATEGY_CMP_PTR)
#undef STRATEGY_CMP
#undef STRATEGY_CMP_PTR
    if (!field)
        return e;
    *ctx = *was; /* the driver goes on with its own values */
    if (is_ptr)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "strategy '%s': %s on replica %d replaced ctx->%s, a field the driver "
                        "owns; a strategy writes only the values behind ctx->params and its "
                        "own ctx->priv (keep what you need in priv)",
                        s->name, member, was->replica, field);
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "strategy '%s': %s on replica %d wrote ctx->%s (it was %lld, the strategy "
                    "left %lld), a field the driver owns; a strategy writes only the values "
                    "behind ctx->params and its own ctx->priv (keep what you need in priv)",
                    s->name, member, was->replica, field, before, after);
}

dsim_err dsim_strategy_create_variables(const dsim_strategy *s, dsim_replica_ctx *ctx,
                                        const dsim_strategy_vars *init)
{
    dsim_replica_ctx was = *ctx;
    dsim_err e = s->ops->create_variables(ctx, init);
    if (e != DSIM_OK)
        e = strategy_failed(s, "create_variables", e);
    return strategy_owned_check(s, "create_variables", ctx, &was, e);
}

dsim_err dsim_strategy_apply_gradients(const dsim_strategy *s, dsim_replica_ctx *ctx, float *grad)
{
    dsim_replica_ctx was = *ctx;
    dsim_err e = s->ops->apply_gradients(ctx, grad);
    if (e != DSIM_OK)
        e = strategy_failed(s, "apply_gradients", e);
    return strategy_owned_check(s, "apply_gradients", ctx, &was, e);
}

dsim_err dsim_strategy_reduce(const dsim_strategy *s, dsim_replica_ctx *ctx, dsim_op op,
                              const double *in, double *out, size_t n)
{
    dsim_replica_ctx was = *ctx;
    dsim_err e = s->ops->reduce(ctx, op, in, out, n);
    /* ENOTSUP is an answer ("my replicas are not in step"), not a failure. */
    if (e != DSIM_OK && e != DSIM_ENOTSUP)
        e = strategy_failed(s, "reduce", e);
    return strategy_owned_check(s, "reduce", ctx, &was, e);
}

dsim_err dsim_strategy_feed(const dsim_strategy *s, dsim_replica_ctx *ctx,
                            const dsim_input_step *st, uint64_t max_rows, dsim_replica_feed *out)
{
    memset(out, 0, sizeof *out);
    if (ctx->device < 0 || ctx->device >= st->replicas)
        return DSIM_ERR(DSIM_ESTATE, -1, "replica %d: its worker's step has %d replicas' batches",
                        ctx->replica, st->replicas);
    const dsim_replica_batch *b = &st->batch[ctx->device];
    if (!s->ops->feed) {
        out->ids = b->ids;
        out->n = b->n;
        out->static_batch = b->n;
        return DSIM_OK;
    }
    dsim_replica_ctx was = *ctx;
    dsim_err e = s->ops->feed(ctx, st, out);
    if (e != DSIM_OK)
        e = strategy_failed(s, "feed", e);
    e = strategy_owned_check(s, "feed", ctx, &was, e);
    if (e != DSIM_OK)
        return e;
    if (out->static_batch == 0)
        out->static_batch = out->n;
    if ((out->n && !out->ids) || out->static_batch < out->n || out->static_batch > max_rows ||
        !(out->padding_weight == out->padding_weight))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "strategy '%s': feed on replica %d gave %llu examples%s padded to %llu "
                        "rows (padding weight %g); accepted: ids for every example, a static "
                        "batch of at least the examples and at most %llu rows (the global "
                        "batch, or the larger of the dataset and a replica's share of the "
                        "global batch), a finite weight",
                        s->name, ctx->replica, (unsigned long long)out->n,
                        out->n && !out->ids ? " without ids" : "",
                        (unsigned long long)out->static_batch, (double)out->padding_weight,
                        (unsigned long long)max_rows);
    return DSIM_OK;
}

dsim_err dsim_strategy_check_save(const dsim_strategy *s)
{
    if (!s->ops->save)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "strategy '%s' does not support checkpoints (its table has no save "
                        "member); run without checkpoint_every",
                        s->name);
    return DSIM_OK;
}

dsim_err dsim_strategy_save(const dsim_strategy *s, dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    DSIM_CHECK(dsim_strategy_check_save(s));
    dsim_replica_ctx was = *ctx;
    /* what save() leaves out is zero in the file, never the buffer's last
     * contents (or uninitialised memory): the same bits every run, and a
     * save that forgets a part reads as exactly that */
    if (out->params)
        memset(out->params, 0, out->n_params * sizeof(float));
    if (out->optim_state)
        memset(out->optim_state, 0, out->optim_state_len * sizeof(float));
    out->optim_step = 0;
    out->resume_before = false;
    out->resume_step = 0;
    dsim_err e = s->ops->save(ctx, out);
    if (e != DSIM_OK)
        e = strategy_failed(s, "save", e);
    return strategy_owned_check(s, "save", ctx, &was, e);
}

int dsim_strategy_is_chief(const dsim_strategy *s, const dsim_replica_ctx *ctx)
{
    if (!s->ops->is_chief)
        return ctx->replica == 0;
    return s->ops->is_chief(ctx) != 0;
}

dsim_err dsim_strategy_finish(const dsim_strategy *s, dsim_replica_ctx *ctx)
{
    if (!s->ops->finish)
        return DSIM_OK; /* optional: the variables are already final */
    dsim_replica_ctx was = *ctx;
    dsim_err e = s->ops->finish(ctx);
    if (e != DSIM_OK)
        e = strategy_failed(s, "finish", e);
    return strategy_owned_check(s, "finish", ctx, &was, e);
}

dsim_err dsim_strategy_lost_work(const dsim_strategy *s, dsim_replica_ctx *ctx, int *replica,
                                 uint64_t *from_step)
{
    *replica = -1;
    *from_step = 0;
    if (!s->ops->lost_work)
        return DSIM_OK; /* optional: nothing is re-run */
    dsim_replica_ctx was = *ctx;
    dsim_err e = s->ops->lost_work(ctx, replica, from_step);
    if (e != DSIM_OK)
        e = strategy_failed(s, "lost_work", e);
    else if (*replica != -1 &&
             (*replica < 0 || *replica >= ctx->shape.num_replicas || *replica == ctx->replica))
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "strategy '%s': lost_work on replica %d named replica %d, which is not "
                     "another of the job's %d replicas (-1: no work)",
                     s->name, ctx->replica, *replica, ctx->shape.num_replicas);
    return strategy_owned_check(s, "lost_work", ctx, &was, e);
}

dsim_err dsim_strategy_server_init(const dsim_strategy *s, dsim_server_ctx *srv)
{
    if (!s->ops->server_init) {
        if (s->ops->serve)
            return DSIM_OK; /* a server without state of its own */
        return DSIM_ERR(DSIM_ENOTSUP, -1, "strategy '%s' has no parameter servers", s->name);
    }
    dsim_err e = s->ops->server_init(srv);
    return e == DSIM_OK ? e : strategy_failed(s, "server_init", e);
}

dsim_err dsim_strategy_serve(const dsim_strategy *s, dsim_server_ctx *srv, int client)
{
    if (!s->ops->serve)
        return DSIM_ERR(DSIM_ENOTSUP, -1, "strategy '%s' has no parameter servers", s->name);
    dsim_err e = s->ops->serve(srv, client);
    return e == DSIM_OK ? e : strategy_failed(s, "serve", e);
}

void dsim_strategy_server_fini(const dsim_strategy *s, dsim_server_ctx *srv)
{
    if (s->ops->server_fini)
        s->ops->server_fini(srv);
}

void dsim_strategy_shard_range(size_t n, int nshards, int s, size_t *first, size_t *count)
{
    if (nshards < 1 || s < 0 || s >= nshards) {
        *first = 0;
        *count = 0;
        return;
    }
    size_t k = (size_t)nshards, i = (size_t)s;
    size_t q = n / k, r = n % k;
    *first = i * q + (i < r ? i : r);
    *count = q + (i < r ? 1 : 0);
}
