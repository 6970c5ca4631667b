/* The workers of dsim_train: a replica's steps (train_replica_run: input,
 * gradients, the strategy's update, the loss, checkpoints, preemption, lost
 * replicas' steps re-run) and a parameter server's handler for one client;
 * where a worker is (dsim_train_where_am_i). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "model/optim_int.h"
#include "train_int.h"

/* The worker running on this thread, for dsim_train_where_am_i. */
static _Thread_local struct train_self {
    train_replica *rp;
    train_handler *h;
} train_self;

/* Saved and restored by engines that run many workers on one OS thread. */
static void *train_self_addr(void)
{
    return &train_self;
}

__attribute__((constructor)) static void train_register_state(void)
{
    dsim_rt_worker_state_add(train_self_addr, NULL, sizeof train_self);
}

/* The gate to the caller's code (observer, hooks): false once the driver
 * has given up on the job, whose caller may have freed their user data. */
static bool train_gate_enter(train_job *job, train_replica *rp, int cb)
{
    atomic_fetch_add(&job->gate_in, 1);
    if (atomic_load(&job->gate_closed)) {
        atomic_fetch_sub(&job->gate_in, 1);
        return false;
    }
    atomic_store(&rp->in_cb, cb);
    return true;
}

static void train_gate_leave(train_job *job, train_replica *rp)
{
    atomic_store(&rp->in_cb, TRAIN_CB_NONE);
    atomic_fetch_sub(&job->gate_in, 1);
}

/* Enters a phase: records it and asks the hooks. TRAIN_DIED when the hooks
 * kill the replica here, or when the driver has given up on the job (a
 * replica that comes back after that stops at once). */
static dsim_err train_enter(train_replica *rp, dsim_phase p, uint64_t gs)
{
    train_job *job = rp->job;
    int64_t now = dsim_rt_now(job->rt);
    atomic_store_explicit(&rp->phase, (int)p, memory_order_relaxed);
    atomic_store_explicit(&rp->step, gs, memory_order_relaxed);
    atomic_store_explicit(&rp->t_phase, now, memory_order_relaxed);
    /* the replica's own entry: nobody else writes it until it returns */
    dsim_train_replica_end *en = &job->res->replicas[rp->index];
    if (!en->t_first[p])
        en->t_first[p] = now;
    atomic_store_explicit(&job->last_progress, dsim_rt_now(job->rt), memory_order_relaxed);
    const dsim_train_cfg *cfg = job->cfg;
    if (!cfg->hooks) {
        if (!atomic_load(&job->gate_closed))
            return DSIM_OK;
        rp->killed = true;
        return TRAIN_DIED;
    }
    if (!train_gate_enter(job, rp, TRAIN_CB_HOOK)) {
        rp->killed = true;
        return TRAIN_DIED;
    }
    const dsim_train_hooks *h = cfg->hooks;
    dsim_hook_action a = h->phase ? h->phase(cfg->hooks_user, rp->index, p, gs) : DSIM_HOOK_GO;
    train_gate_leave(job, rp);
    if (a == DSIM_HOOK_DIE) {
        rp->killed = true;
        atomic_store_explicit(&rp->dead, 1, memory_order_release);
        /* A dead process stops answering its peers' health checks now. */
        if (rp->job->health)
            dsim_health_poke(rp->job->health[rp->ctx.worker].h);
        return TRAIN_DIED;
    }
    return DSIM_OK;
}

#define TRAIN_ENTER(rp, p, gs)                                                                     \
    do {                                                                                           \
        if ((e = train_enter((rp), (p), (gs))) != DSIM_OK)                                         \
            goto out;                                                                              \
    } while (0)

/* What a checkpoint records of the job that wrote it: what resuming must
 * match. */
static void train_checkpoint_job(const train_job *job, dsim_checkpoint *ck)
{
    const dsim_train_cfg *cfg = job->cfg;
    ck->global_batch = cfg->global_batch;
    ck->hosts = (uint32_t)cfg->hosts;
    ck->devices_per_host = (uint32_t)cfg->devices_per_host;
    ck->shard = job->su.applied;
    ck->n_examples = job->su.desc.n_examples;
    ck->n_files = job->su.desc.n_files;
    ck->shuffle = cfg->shuffle;
    ck->drop_remainder = cfg->drop_remainder;
    ck->seed = cfg->seed;
    ck->steps_per_epoch = job->su.steps_per_epoch;
    ck->epochs = cfg->epochs;
}

/* NULL if the checkpoint was written by a job with this job's global batch
 * and data layout, else the message that says which value differs (both
 * values named). */
const char *train_checkpoint_mismatch(const train_job *job, const dsim_checkpoint *ck, char *buf,
                                      size_t cap)
{
    dsim_checkpoint me = {0};
    train_checkpoint_job(job, &me);
    const char *path = job->cfg->checkpoint_path;
#define TRAIN_CK_DIFF(field, name, fmt, conv)                                                      \
    if (ck->field != me.field) {                                                                   \
        snprintf(buf, cap, "checkpoint %s was written with %s " fmt "; this job has " fmt, path,   \
                 name, conv(ck->field), conv(me.field));                                           \
        return buf;                                                                                \
    }
#define TRAIN_CK_LL(x)   ((long long)(x))
#define TRAIN_CK_ULL(x)  ((unsigned long long)(x))
#define TRAIN_CK_BOOL(x) ((x) ? "true" : "false")
#define TRAIN_CK_POL(x)  dsim_shard_policy_name(x)
    TRAIN_CK_DIFF(global_batch, "global_batch", "%lld", TRAIN_CK_LL)
    TRAIN_CK_DIFF(hosts, "hosts", "%llu", TRAIN_CK_ULL)
    TRAIN_CK_DIFF(devices_per_host, "devices_per_host", "%llu", TRAIN_CK_ULL)
    TRAIN_CK_DIFF(shard, "shard policy", "%s", TRAIN_CK_POL)
    TRAIN_CK_DIFF(n_examples, "examples", "%llu", TRAIN_CK_ULL)
    TRAIN_CK_DIFF(n_files, "files", "%llu", TRAIN_CK_ULL)
    TRAIN_CK_DIFF(shuffle, "shuffle", "%s", TRAIN_CK_BOOL)
    TRAIN_CK_DIFF(seed, "seed", "%llu", TRAIN_CK_ULL)
    TRAIN_CK_DIFF(drop_remainder, "drop_remainder", "%s", TRAIN_CK_BOOL)
    TRAIN_CK_DIFF(steps_per_epoch, "steps per epoch", "%llu", TRAIN_CK_ULL)
#undef TRAIN_CK_DIFF
#undef TRAIN_CK_LL
#undef TRAIN_CK_ULL
#undef TRAIN_CK_BOOL
#undef TRAIN_CK_POL
    return NULL;
}

static dsim_err train_write_checkpoint(train_replica *rp, const dsim_strategy_vars *v,
                                       const dsim_input_step *st, uint64_t done)
{
    train_job *job = rp->job;
    dsim_checkpoint ck = {
        .epoch = st->end_of_epoch ? st->epoch + 1 : st->epoch,
        .step = st->end_of_epoch ? 0 : st->step + 1,
        .global_step = done,
        .optim_kind = job->su.optim.kind,
        .optim_step = v->optim_step,
        .n_params = v->n_params,
        .params = v->params,
        .optim_state_len = v->optim_state_len,
        .optim_state = v->optim_state,
        /* the chief's, as its next step will use it */
        .has_loss_scale = rp->ctx.loss_scale.dynamic,
        .loss_scale = rp->ctx.loss_scale.scale,
        .loss_scale_counter = rp->ctx.loss_scale.counter,
    };
    uint64_t spe = job->su.steps_per_epoch;
    if (v->resume_before && v->resume_step < done && spe) {
        /* some replica's earlier steps are not applied yet: resume there */
        ck.global_step = v->resume_step;
        ck.epoch = (uint32_t)(v->resume_step / spe);
        ck.step = v->resume_step % spe;
    }
    train_checkpoint_job(job, &ck);
    DSIM_CHECK(dsim_checkpoint_write(job->cfg->checkpoint_path, &ck));
    rp->ckpt_writes++;
    dsim_debug("replica %d wrote checkpoint %s at step %llu", rp->index, job->cfg->checkpoint_path,
               (unsigned long long)done);
    return DSIM_OK;
}

/* 1 once this replica knows of a preemption notice, `done` steps in. */
static int train_preempt_noticed(const train_replica *rp, uint64_t done)
{
    const dsim_train_cfg *cfg = rp->job->cfg;
    if (cfg->preempt_after && done >= cfg->preempt_after)
        return 1;
    return cfg->preempt_notice && cfg->preempt_notice(cfg->preempt_user, rp->index) != 0;
}

/* Tells the caller's observer about one step of rp (of lost replica
 * rerun_of when >= 0: a re-run). */
static void train_observe(train_replica *rp, const dsim_input_step *st, const dsim_replica_batch *b,
                          uint64_t padded, double local, double loss, uint64_t cks, int64_t t0,
                          int64_t tc, int64_t t1, int rerun_of)
{
    train_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    if (!cfg->observer || !train_gate_enter(job, rp, TRAIN_CB_OBSERVER))
        return;
    dsim_train_step_info info = {
        .replica = rp->index,
        .worker = rp->ctx.worker,
        .device = rp->ctx.device,
        .epoch = st->epoch,
        .step = st->step,
        .global_step = rp->ctx.global_step,
        .examples = b->n,
        .local_loss = local,
        .loss = loss,
        .checksum = cks,
        .t_start = t0,
        .t_comm = tc,
        .t_end = t1,
        .ids = b->ids,
        .rerun = rerun_of >= 0,
        .rerun_of = rerun_of,
        .mp_scale = 1.0f,
        .padded = padded,
        .grad_norm = NAN,
    };
    if (rerun_of < 0 && rp->ctx.global_step >= job->first_step) {
        size_t at =
            (size_t)(rp->ctx.global_step - job->first_step) * (size_t)job->N + (size_t)rp->index;
        info.mp_scale = job->res->mp_scale[at];
        info.mp_skipped = job->res->mp_skipped[at] != 0;
        info.grad_norm = job->res->grad_norm[at];
        memcpy(info.var_sig, job->res->var_sig + at * DSIM_MODEL_MAX_VARS, sizeof info.var_sig);
    }
    cfg->observer(&info, cfg->observer_user);
    train_gate_leave(job, rp);
}

/* Runs lost replica `lost`'s steps from `from` to the end of the job on rp
 * (dsim_strategy_ops.lost_work): its batches, rp's variables. The coverage
 * ledger records them as re-runs of the lost replica's steps, so a step it
 * had begun counts as read at least once, not twice. */
static dsim_err train_rerun(train_replica *rp, int lost, uint64_t from, float *x, float *y,
                            float *grad, size_t maxb)
{
    train_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    const dsim_train_setup *su = &job->su;
    dsim_replica_ctx *ctx = &rp->ctx;
    const dsim_strategy *s = job->strat;
    size_t P = su->n_params;
    int D = cfg->devices_per_host;
    if (from < job->first_step)
        from = job->first_step;
    if (from >= job->end_step)
        return DSIM_OK;
    dsim_input *in = NULL;
    dsim_err e = dsim_train_input(cfg, su, lost / D, &in);
    if (e == DSIM_OK && job->first_step > 0)
        e = dsim_input_seek(in, job->start_epoch, job->start_step);
    dsim_input_step st;
    for (uint64_t gs = job->first_step; e == DSIM_OK && gs < from; gs++)
        e = dsim_input_next(in, &st);
    if (e == DSIM_OK)
        dsim_info("train: replica %d re-runs lost replica %d's steps %llu..%llu", rp->index, lost,
                  (unsigned long long)from, (unsigned long long)job->end_step - 1);
    for (uint64_t gs = from; e == DSIM_OK && gs < job->end_step; gs++) {
        ctx->global_step = gs;
        TRAIN_ENTER(rp, DSIM_PHASE_COMPUTE, gs);
        if ((e = dsim_input_next(in, &st)) != DSIM_OK)
            break;
        if (st.done) {
            e = DSIM_ERR(DSIM_ESTATE, -1, "replica %d's input ended at global step %llu of %llu",
                         lost, (unsigned long long)gs, (unsigned long long)job->end_step);
            break;
        }
        const dsim_replica_batch *b = &st.batch[lost % D];
        size_t nb = (size_t)b->n;
        if (nb > maxb) {
            e = DSIM_ERR(DSIM_ESTATE, -1,
                         "a batch of %zu examples exceeds the global batch or the dataset (%zu)",
                         nb, maxb);
            break;
        }
        int64_t t0 = dsim_rt_now(job->rt);
        if (nb && (e = dsim_dataset_gather(su->ds, b->ids, nb, x, y)) != DSIM_OK)
            break;
        double loss_sum = 0;
        if ((e = train_mixed_grad(cfg, su, &ctx->loss_scale, ctx->params, nb ? x : NULL,
                                  nb ? y : NULL, nb, job->loss_scale, grad, &loss_sum)) != DSIM_OK)
            break;
        if ((e = dsim_ledger_record_rerun(job->res->ledger, rp->index, lost, st.epoch, st.step,
                                          b->ids, b->n)) != DSIM_OK)
            break;
        TRAIN_ENTER(rp, DSIM_PHASE_ALLREDUCE, gs);
        if ((e = dsim_strategy_apply_gradients(s, ctx, grad)) != DSIM_OK)
            break;
        rp->good_checksum = dsim_params_checksum(ctx->params, P);
        job->res->replicas[rp->index].reruns++;
        train_observe(rp, &st, b, 0, loss_sum * (double)job->loss_scale, NAN, rp->good_checksum, t0,
                      t0, dsim_rt_now(job->rt), lost);
    }
out:
    dsim_input_destroy(in);
    return e;
}

/* What a replica's steps work in: a batch, the gradient, a copy of the
 * variables for checkpoints (when the job may write one) and its input. */
typedef struct replica_work {
    size_t maxb; /* the largest batch a replica can get */
    dsim_input *in;
    float *x, *y, *grad;
    dsim_strategy_vars save;
} replica_work;

static dsim_err replica_work_alloc(train_replica *rp, replica_work *w)
{
    train_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    const dsim_train_setup *su = &job->su;
    size_t in_dim = su->model.in_dim, y_dim = su->ds->y_dim, P = su->n_params;
    /* A replica's batch is a part of one global batch of the dataset, and
     * a strategy's feed may pad it to a static batch of up to its share of
     * the global batch (TPUStrategy's ceil(global / replicas)) even where
     * the dataset holds fewer examples than that. */
    size_t gb = (size_t)cfg->global_batch, N = job->N > 0 ? (size_t)job->N : 1;
    size_t share = (gb + N - 1) / N;
    w->maxb = su->ds->spec.n_examples > share ? su->ds->spec.n_examples : share;
    if (w->maxb > gb)
        w->maxb = gb;
    w->x = malloc(w->maxb * in_dim * sizeof(float));
    w->y = malloc(w->maxb * y_dim * sizeof(float));
    w->grad = dsim_buf_alloc(P * sizeof(float)); /* the all-reduce's buffer */
    if (!w->x || !w->y || !w->grad)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for a batch of %zu examples", w->maxb);
    if (cfg->checkpoint_every || job->preempt_armed || cfg->probe_restore) {
        dsim_strategy_vars *save = &w->save;
        save->n_params = P;
        save->params = malloc(P * sizeof(float));
        save->optim_state_len = su->optim_state_len;
        save->optim_state =
            su->optim_state_len ? malloc(su->optim_state_len * sizeof(float)) : NULL;
        if (!save->params || (su->optim_state_len && !save->optim_state))
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for a checkpoint buffer");
    }
    dsim_err e = dsim_train_input(cfg, su, rp->ctx.worker, &w->in);
    if (e == DSIM_OK && job->first_step > 0 && job->first_step < job->end_step)
        e = dsim_input_seek(w->in, job->start_epoch, job->start_step);
    return e;
}

static void replica_work_free(replica_work *w)
{
    dsim_input_destroy(w->in);
    free(w->x);
    free(w->y);
    free(w->grad);
    free(w->save.params);
    free(w->save.optim_state);
}

/* A strategy call that returned success although a collective of the
 * replica's world communicator failed inside it: an error the strategy
 * swallowed. The first is kept with where it was; the rest are counted. */
static void replica_swallowed(train_replica *rp, dsim_phase p, uint64_t gs)
{
    uint64_t n = dsim_comm_failed_calls(rp->ctx.world);
    if (n <= rp->coll_failed)
        return;
    rp->coll_failed = n;
    dsim_train_replica_end *end = &rp->job->res->replicas[rp->index];
    if (end->swallowed++ == 0) {
        const dsim_error *ce = dsim_comm_error(rp->ctx.world);
        end->swallowed_phase = p;
        end->swallowed_step = gs;
        end->swallowed_err = ce->code;
        size_t n_msg = strnlen(ce->msg, sizeof end->swallowed_msg - 1);
        memcpy(end->swallowed_msg, ce->msg, n_msg);
        end->swallowed_msg[n_msg] = '\0';
    }
}

/* cfg.probe_restore: what the strategy holds right after the restore, by
 * its own save(), every replica calling it; the chief's is kept. */
static dsim_err replica_probe_restore(train_replica *rp, dsim_strategy_vars *save)
{
    train_job *job = rp->job;
    dsim_err e = dsim_strategy_save(job->strat, &rp->ctx, save);
    dsim_train_result *res = job->res;
    if (e != DSIM_OK || rp->index != job->chief || !res->restored_params)
        return e;
    memcpy(res->restored_params, save->params, save->n_params * sizeof(float));
    if (save->optim_state_len && res->restored_optim_state)
        memcpy(res->restored_optim_state, save->optim_state, save->optim_state_len * sizeof(float));
    res->restored_optim_state_len = save->optim_state_len;
    res->restored_optim_step = save->optim_step;
    res->has_restored = true;
    return DSIM_OK;
}

/* The hooks' batch member: the replica read b in st, as the ledger has it. */
static void replica_note_batch(train_replica *rp, const dsim_input_step *st,
                               const dsim_replica_batch *b)
{
    train_job *job = rp->job;
    const dsim_train_hooks *hk = job->cfg->hooks;
    if (hk && hk->size >= sizeof *hk && hk->batch && train_gate_enter(job, rp, TRAIN_CB_HOOK)) {
        hk->batch(job->cfg->hooks_user, rp->index, st->epoch, st->step, b->ids, b->n);
        train_gate_leave(job, rp);
    }
}

/* From the rendezvous to the variables: the strategy's replica_init, then
 * create_variables with the initial values (given to replica 0); with
 * cfg.probe_restore after a restore, what the strategy then holds. */
static dsim_err replica_begin(train_replica *rp, dsim_strategy_vars *save)
{
    train_job *job = rp->job;
    const dsim_strategy *s = job->strat;
    dsim_replica_ctx *ctx = &rp->ctx;
    dsim_err e;
    /* the step about to be run: after a restore, the checkpoint's */
    ctx->global_step = job->first_step;
    if ((e = train_enter(rp, DSIM_PHASE_RENDEZVOUS, job->first_step)) != DSIM_OK ||
        (e = dsim_strategy_replica_init(s, ctx)) != DSIM_OK)
        return e;
    if (job->first_step > 0 &&
        (e = train_enter(rp, DSIM_PHASE_RESTORE, job->first_step)) != DSIM_OK)
        return e;
    if ((e = train_enter(rp, DSIM_PHASE_CREATE_VARIABLES, job->first_step)) != DSIM_OK ||
        (e = dsim_strategy_create_variables(s, ctx, rp->index == 0 ? &job->init : NULL)) != DSIM_OK)
        return e;
    rp->good_checksum = dsim_params_checksum(ctx->params, job->su.n_params);
    job->res->replicas[rp->index].created_checksum = rp->good_checksum;
    replica_swallowed(rp, DSIM_PHASE_CREATE_VARIABLES, job->first_step);
    if (job->cfg->probe_restore && job->first_step > 0)
        return replica_probe_restore(rp, save);
    return DSIM_OK;
}

/* Step gs's outcome into the job's result, in the replica's own slots (and
 * the loss and the variables' trace for replica 0). */
static void replica_record(train_replica *rp, uint64_t gs, const dsim_replica_batch *b,
                           uint64_t padded, double local, double loss, uint64_t cks,
                           const uint16_t *sig, int64_t t0, int64_t tc, int64_t t1)
{
    train_job *job = rp->job;
    dsim_train_result *res = job->res;
    size_t P = job->su.n_params, N = (size_t)job->N, i = (size_t)rp->index;
    size_t k = (size_t)(gs - job->first_step);
    if (k == 0) {
        dsim_train_replica_end *re = &res->replicas[rp->index];
        re->t_first_step = t1;
        /* Every pair its first step's collectives use is connected by
         * now: the connection set-up phase of its cold start. */
        dsim_ep_conn_stats cs;
        dsim_ep_get_conn_stats(rp->ctx.ep, &cs);
        re->conn_count = cs.connections;
        re->conn_slowest_peer = cs.slowest_peer;
        re->conn_modelled = cs.modelled;
        re->conn_max_ns = cs.max_ns;
        re->conn_total_ns = cs.total_ns;
    }
    res->checksum[k * N + i] = cks;
    memcpy(res->var_sig + (k * N + i) * DSIM_MODEL_MAX_VARS, sig,
           DSIM_MODEL_MAX_VARS * sizeof *sig);
    res->replicas[rp->index].steps_done = k + 1;
    res->local_loss[k * N + i] = local;
    res->examples[k * N + i] = b->n;
    res->padded[k * N + i] = padded;
    res->step_ns[k * N + i] = t1 - t0;
    res->comm_ns[k * N + i] = t1 - tc;
    if (rp->index == 0) {
        res->loss[k] = loss;
        uint64_t every = res->trace_every;
        if (res->trace && (k + 1) % every == 0)
            memcpy(res->trace + ((k + 1) / every - 1) * P, rp->ctx.params, P * sizeof(float));
    }
}

/* The row of the result's trace_grad for step gs, where step gs begins a
 * span of the trace (cfg.record_grads); else NULL. Replica 0 copies a
 * whole model's gradient into it; every replica its part where its
 * optimizer updates one (dsim_optim_set_part: a sharded optimizer). */
static float *replica_grad_row(const train_replica *rp, uint64_t gs, unsigned char **filled,
                               float **slots)
{
    const train_job *job = rp->job;
    dsim_train_result *res = job->res;
    uint64_t k = gs - job->first_step, every = res->trace_every;
    if (!res->trace_grad || k % every != 0 || k / every >= res->trace_grad_rows)
        return NULL;
    *filled = &job->grad_filled[k / every];
    *slots = res->trace_slots
                 ? res->trace_slots +
                       k / every * dsim_optim_rule_slots(&job->cfg->optim) * job->su.n_params
                 : NULL;
    return res->trace_grad + k / every * job->su.n_params;
}

/* Whether the job stops after its step `done` for a preemption (*stop).
 * Every replica runs the same steps, so a MAX of "I have a notice" at every
 * boundary makes them all see the first notice at the same boundary: there
 * they fix the step to stop at (*stop_at). */
static dsim_err replica_preempt(train_replica *rp, uint64_t done, uint64_t *stop_at, bool *stop)
{
    train_job *job = rp->job;
    *stop = false;
    if (!job->preempt_armed)
        return DSIM_OK;
    if (*stop_at == UINT64_MAX && done < job->end_step) {
        int64_t mine = train_preempt_noticed(rp, done) ? 1 : 0, any = 0;
        dsim_err e = dsim_allreduce(job->ctl[rp->index], &mine, &any, 1, DSIM_I64, DSIM_MAX);
        if (e != DSIM_OK)
            return e;
        if (any) {
            *stop_at = done + job->cfg->preempt_grace_steps;
            if (rp->index == job->chief)
                dsim_info("train: preemption notice at global step %llu; stopping after "
                          "step %llu with a checkpoint",
                          (unsigned long long)done, (unsigned long long)*stop_at);
        }
    }
    *stop = done == *stop_at && done < job->end_step;
    return DSIM_OK;
}

/* The padding rows of a static batch (dsim_strategy_ops.feed): rows nb ..
 * rows-1 of the step's buffers, zero features and targets, run forward and
 * backward as the device runs them and weighted by the feed's padding
 * weight: 0 masks them out of the loss and the gradient, as TensorFlow's
 * padded examples carry a sample weight of 0. */
static dsim_err replica_padding(train_replica *rp, replica_work *w, size_t nb, size_t rows,
                                float weight, double *loss_sum)
{
    train_job *job = rp->job;
    const dsim_train_setup *su = &job->su;
    size_t in_dim = su->model.in_dim, y_dim = su->ds->y_dim, np = rows - nb;
    memset(w->x + nb * in_dim, 0, np * in_dim * sizeof(float));
    memset(w->y + nb * y_dim, 0, np * y_dim * sizeof(float));
    double pad = 0;
    DSIM_CHECK(dsim_model_loss_grad(&su->model, rp->ctx.params, w->x + nb * in_dim,
                                    w->y + nb * y_dim, np, job->loss_scale * weight, w->grad,
                                    &pad));
    *loss_sum += (double)weight * pad;
    return DSIM_OK;
}

/* One global step of rp: its batch, the gradient, the strategy's update,
 * the loss, the result's record, and a checkpoint when one is due. *stop:
 * a preemption stops the job after this step. */
static dsim_err replica_step(train_replica *rp, replica_work *w, uint64_t gs, uint64_t *stop_at,
                             bool *stop)
{
    train_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    const dsim_train_setup *su = &job->su;
    dsim_replica_ctx *ctx = &rp->ctx;
    const dsim_strategy *s = job->strat;
    size_t P = su->n_params;
    dsim_err e;
    ctx->global_step = gs;
    if ((e = train_enter(rp, DSIM_PHASE_COMPUTE, gs)) != DSIM_OK)
        return e;
    dsim_input_step st;
    if ((e = dsim_input_next(w->in, &st)) != DSIM_OK)
        return e;
    if (st.done)
        return DSIM_ERR(DSIM_ESTATE, -1, "the input ended at global step %llu of %llu",
                        (unsigned long long)gs, (unsigned long long)job->end_step);
    /* what this replica computes on: its slot of its worker's step, or
     * what the strategy's feed makes of the step */
    dsim_replica_feed fd;
    if ((e = dsim_strategy_feed(s, ctx, &st, w->maxb, &fd)) != DSIM_OK)
        return e;
    dsim_replica_batch view = {
        .ids = fd.ids, .n = fd.n, .has_value = fd.n > 0 || st.batch[ctx->device].has_value};
    const dsim_replica_batch *b = &view;
    /* The batch is this replica's now: recorded (and told to the hooks:
     * the processes engine writes it to its parent) before its compute is
     * timed, which is the model's alone. */
    if ((e = dsim_ledger_record(job->res->ledger, rp->index, st.epoch, st.step, b->ids, b->n)) !=
        DSIM_OK)
        return e;
    replica_note_batch(rp, &st, b);
    int64_t t0 = dsim_rt_now(job->rt);
    size_t nb = (size_t)b->n, rows = (size_t)fd.static_batch;
    if (nb && (e = dsim_dataset_gather(su->ds, b->ids, nb, w->x, w->y)) != DSIM_OK)
        return e;
    double loss_sum = 0;
    float mp_scale = ctx->loss_scale.scale; /* this step's gradient's */
    if ((e = train_mixed_grad(cfg, su, &ctx->loss_scale, ctx->params, nb ? w->x : NULL,
                              nb ? w->y : NULL, nb, job->loss_scale, w->grad, &loss_sum)) !=
        DSIM_OK)
        return e;
    if (rows > nb &&
        (e = replica_padding(rp, w, nb, rows, fd.padding_weight, &loss_sum)) != DSIM_OK)
        return e;
    if (cfg->device_flops > 0)
        dsim_rt_charge(job->rt,
                       (int64_t)(6.0 * (double)P * (double)rows / cfg->device_flops * 1e9));
    if ((e = train_enter(rp, DSIM_PHASE_ALLREDUCE, gs)) != DSIM_OK)
        return e;
    int64_t tc = dsim_rt_now(job->rt); /* compute ends, the exchange begins */
    ctx->loss_scale.skipped = ctx->loss_scale.recorded = false;
    ctx->gradient_dtype_applied = false;
    /* Replica 0's first step says what the exchange was, for the report. */
    int label = rp->index == 0 && !job->res->exchange[0];
    if (label)
        dsim_comm_exchange_begin(ctx->world);
    /* the norm of what the update applies: replica 0's, and every
     * replica's clip (which computes it anyway) */
    optim_seen_begin(rp->index == 0);
    /* the row is NaN where no update was given a gradient (set so at
     * the first copy into it, or at the run's end) */
    unsigned char *filled = NULL;
    float *srow = NULL, *grow = replica_grad_row(rp, gs, &filled, &srow);
    if (grow)
        optim_seen_copy(grow, srow, P, rp->index == 0, filled);
    e = dsim_strategy_apply_gradients(s, ctx, w->grad);
    double grad_norm = train_grad_norm_take(P);
    if (label)
        dsim_comm_exchange_end(ctx->world, job->res->exchange, sizeof job->res->exchange);
    if (e != DSIM_OK || (e = train_mixed_after(s->name, ctx, gs)) != DSIM_OK)
        return e;
    size_t k = (size_t)(gs - job->first_step), at = k * (size_t)job->N + (size_t)rp->index;
    job->res->mp_scale[at] = mp_scale;
    job->res->mp_skipped[at] = ctx->loss_scale.skipped;
    job->res->grad_norm[at] = grad_norm;
    replica_swallowed(rp, DSIM_PHASE_ALLREDUCE, gs);
    /* what a failure later in the step must leave untouched */
    rp->good_checksum = dsim_params_checksum(ctx->params, P);
    if (s->builtin) /* the step's own, below; a plugin's are read again there */
        dsim_params_var_sig(ctx->params, su->vars, su->n_vars, rp->good_sig);
    if ((e = train_enter(rp, DSIM_PHASE_REDUCE_LOSS, gs)) != DSIM_OK)
        return e;
    double local = loss_sum * (double)job->loss_scale, loss = NAN;
    e = dsim_strategy_reduce(s, ctx, DSIM_SUM, &local, &loss, 1);
    if (e == DSIM_ENOTSUP) {
        loss = NAN;
        e = DSIM_OK;
    } else if (e != DSIM_OK) {
        return e;
    }
    replica_swallowed(rp, DSIM_PHASE_REDUCE_LOSS, gs);
    int64_t t1 = dsim_rt_now(job->rt);
    /* The variables at the step's end. libdsim's own strategies touch them
     * only in apply_gradients, so the checksum taken after it stands (a
     * second read of them, out of the cache by now under the sim engine,
     * was a tenth of a 1024-replica job); a plugin's are read again, in
     * case its reduce wrote them. */
    uint64_t cks = s->builtin ? rp->good_checksum : dsim_params_checksum(ctx->params, P);
    uint16_t sig[DSIM_MODEL_MAX_VARS];
    if (s->builtin)
        memcpy(sig, rp->good_sig, sizeof sig);
    else
        dsim_params_var_sig(ctx->params, su->vars, su->n_vars, sig);
    replica_record(rp, gs, b, rows - nb, local, loss, cks, sig, t0, tc, t1);
    train_observe(rp, &st, b, rows - nb, local, loss, cks, t0, tc, t1, -1);
    uint64_t done = gs + 1;
    if ((e = replica_preempt(rp, done, stop_at, stop)) != DSIM_OK)
        return e;
    if ((cfg->checkpoint_every && done % cfg->checkpoint_every == 0) || *stop) {
        /* the checkpoint's own global step (the steps it holds), as its
         * file, the restore and every message name it */
        if ((e = train_enter(rp, DSIM_PHASE_CHECKPOINT, done)) != DSIM_OK ||
            (e = dsim_strategy_save(s, ctx, &w->save)) != DSIM_OK)
            return e;
        if (rp->index == job->chief &&
            (e = train_write_checkpoint(rp, &w->save, &st, done)) != DSIM_OK)
            return e;
    }
    return DSIM_OK;
}

/* A lost replica's steps, when the strategy re-runs them (asynchronous
 * parameter servers); a preempted job stops everywhere instead. */
static dsim_err replica_lost_work(train_replica *rp, replica_work *w)
{
    train_job *job = rp->job;
    dsim_err e;
    for (int lost = 0; !rp->preempted_at && lost >= 0;) {
        uint64_t from = 0;
        if ((e = dsim_strategy_lost_work(job->strat, &rp->ctx, &lost, &from)) != DSIM_OK)
            return e;
        if (lost >= 0 &&
            ((e = train_rerun(rp, lost, from, w->x, w->y, w->grad, w->maxb)) != DSIM_OK ||
             (e = train_enter(rp, DSIM_PHASE_FINISH, job->end_step)) != DSIM_OK))
            return e;
    }
    return DSIM_OK;
}

static dsim_err train_replica_run(train_replica *rp, int *inited)
{
    train_job *job = rp->job;
    replica_work w = {0};
    dsim_err e = replica_work_alloc(rp, &w);
    if (e != DSIM_OK)
        goto out;
    *inited = 1;
    if ((e = replica_begin(rp, &w.save)) != DSIM_OK)
        goto out;
    uint64_t stop_at = UINT64_MAX; /* where a preemption stops the job, once agreed */
    for (uint64_t gs = job->first_step; gs < job->end_step; gs++) {
        bool stop = false;
        if ((e = replica_step(rp, &w, gs, &stop_at, &stop)) != DSIM_OK)
            goto out;
        if (stop) {
            rp->preempted_at = gs + 1;
            break;
        }
    }
    if ((e = train_enter(rp, DSIM_PHASE_FINISH,
                         rp->preempted_at ? rp->preempted_at : job->end_step)) != DSIM_OK ||
        (e = replica_lost_work(rp, &w)) != DSIM_OK ||
        (e = dsim_strategy_finish(job->strat, &rp->ctx)) != DSIM_OK)
        goto out;
    memcpy(rp->final, rp->ctx.params, job->su.n_params * sizeof(float));
out:
    replica_work_free(&w);
    return e;
}

/* The last thing a worker does: says it returned (the driver's watch waits
 * for that) and lets go of the job. */
static void train_worker_returned(train_job *job, bool *returned)
{
    dsim_waitq_lock(job->lock);
    *returned = true;
    job->n_running--;
    atomic_store_explicit(&job->last_progress, dsim_rt_now(job->rt), memory_order_relaxed);
    dsim_waitq_wake(job->lock);
    dsim_waitq_unlock(job->lock);
    train_self.rp = NULL;
    train_self.h = NULL;
    train_job_unref(job);
}

void train_replica_main(void *arg)
{
    train_replica *rp = arg;
    train_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    train_self.rp = rp;
    int inited = 0;
    dsim_err e = train_enter(rp, DSIM_PHASE_START, job->first_step);
    if (e == DSIM_OK)
        e = train_replica_run(rp, &inited);
    dsim_train_replica_end *end = &job->res->replicas[rp->index];
    if (e != DSIM_OK && e != TRAIN_DIED && cfg->hooks && train_gate_enter(job, rp, TRAIN_CB_HOOK)) {
        if (cfg->hooks->killed && cfg->hooks->killed(cfg->hooks_user, rp->index))
            rp->killed = true;
        train_gate_leave(job, rp);
    }
    end->phase = (dsim_phase)atomic_load_explicit(&rp->phase, memory_order_relaxed);
    end->global_step = atomic_load_explicit(&rp->step, memory_order_relaxed);
    end->t_phase = atomic_load_explicit(&rp->t_phase, memory_order_relaxed);
    end->killed = rp->killed;
    end->t_end = dsim_rt_now(job->rt);
    if (inited && rp->ctx.params)
        end->end_checksum = dsim_params_checksum(rp->ctx.params, rp->ctx.n_params);
    end->good_checksum = rp->good_checksum;
    if (rp->killed) {
        /* A killed process reports nothing: the survivors must find out. */
        end->status = DSIM_OK;
    } else if (e != DSIM_OK) {
        end->status = e;
        snprintf(end->msg, sizeof end->msg, "%s", dsim_errmsg());
        train_fail(job, "replica", rp->index, rp->index);
    }
    atomic_store_explicit(&rp->phase, (int)DSIM_PHASE_DONE, memory_order_relaxed);
    if (inited)
        dsim_strategy_replica_fini(job->strat, &rp->ctx);
    train_worker_returned(job, &rp->returned);
}

void train_handler_main(void *arg)
{
    train_handler *h = arg;
    train_job *job = h->job;
    train_self.h = h;
    train_server *ts = &job->srvs[h->server];
    const dsim_train_cfg *cfg = job->cfg;
    if (dsim_strategy_serve(job->strat, &ts->ctx, h->client) != DSIM_OK) {
        /* A killed server says nothing; neither does the server of a
         * killed client (parameter-server training goes on without it). */
        const dsim_train_hooks *hk = cfg->hooks;
        const dsim_error *le = dsim_last_error();
        /* A client whose process is gone (its connection closed) is a lost
         * worker too: asynchronous training goes on without it. */
        bool client_gone =
            job->shape.ps_mode == DSIM_PS_ASYNC && le->code == DSIM_EPEER && le->peer == h->client;
        if (client_gone || (hk && hk->killed &&
                            (hk->killed(cfg->hooks_user, job->N + h->server) ||
                             hk->killed(cfg->hooks_user, h->client)))) {
            dsim_clear_error();
            train_worker_returned(job, &h->returned);
            return;
        }
        train_fail(job, "parameter server", h->server, job->N + h->server);
    }
    train_worker_returned(job, &h->returned);
}
bool dsim_train_where_am_i(dsim_train_where *out)
{
    train_replica *rp = train_self.rp;
    train_handler *h = train_self.h;
    if (!out || (!rp && !h))
        return false;
    int server = -1;
    if (!rp) {
        server = h->server;
        rp = &h->job->reps[h->client];
    }
    out->replica = rp->index;
    out->server = server;
    out->phase = (dsim_phase)atomic_load_explicit(&rp->phase, memory_order_relaxed);
    out->global_step = atomic_load_explicit(&rp->step, memory_order_relaxed);
    return true;
}
