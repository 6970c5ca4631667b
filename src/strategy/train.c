/* The training driver: one job of hosts x devices_per_host replicas (and
 * num_ps parameter servers) under a strategy.
 *
 *   dsim_train (caller's thread)
 *     check cfg, strategy shape, dataset, model, optimizer, input
 *     initial variables: a checkpoint (restore) or the model's init
 *     runtime + inproc fabric: ranks 0..N-1 replicas, N..N+P-1 servers
 *     spawn: one worker per (server, replica) running serve()
 *            one worker per replica running train_replica_run
 *     join everything; collect the result
 *
 *   train_replica_run (worker r = worker w, device d)
 *     its own copy of worker w's input (deterministic: the same on every
 *     replica of w), taking slot d of every step
 *     replica_init, create_variables (initial values on the chief only)
 *     per step: gather batch -> loss_grad(scale) -> ledger -> apply_gradients
 *               -> reduce(SUM) of the scaled loss -> observer
 *               -> [save + the chief writes the checkpoint]
 *     finish, replica_fini
 *
 * A replica or server that fails records its error and aborts the fabric,
 * which fails every pending and later transfer of every rank, and wakes the
 * servers' locks: every worker returns, none waits for the failed one.
 *
 * The watchdog (train_watch): the driver does not join blindly. Workers
 * say when they return; the driver waits on the job's lock with a
 * deadline: the grace after the job failed, or the progress bound (last
 * phase entered + progress_timeout) before it has. A stall aborts the job
 * like a failure; a grace that runs out leaves the workers still inside the
 * strategy's code running (detached) and returns DSIM_EHUNG. The job is
 * reference-counted (driver + one per worker) so that such a worker, if it
 * ever comes back, finds it alive; the caller's observer and hooks are
 * reached only through a gate that the driver closes before it returns.
 *
 * The files: train.c (this driver), world.c, replica.c, watchdog.c, job.c
 * and setup.c (train_int.h says what each holds). */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsim/log.h"
#include "train_int.h"

void dsim_train_cfg_init(dsim_train_cfg *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->hosts = 1;
    cfg->devices_per_host = 1;
    cfg->ps_mode = DSIM_PS_SYNC;
    cfg->communication = DSIM_ALGO_AUTO;
    cfg->timeout_ns = DSIM_COMM_DEFAULT_TIMEOUT_NS;
    cfg->health_interval_ns = DSIM_HEALTH_DEFAULT_INTERVAL_NS;
    cfg->health_timeout_ns = DSIM_HEALTH_DEFAULT_TIMEOUT_NS;
    cfg->health_retries = DSIM_HEALTH_DEFAULT_RETRIES;
    dsim_optim_spec_default(&cfg->optim, DSIM_OPTIM_SGD);
    cfg->shard = DSIM_SHARD_AUTO;
    cfg->hint = DSIM_HINT_NONE;
    cfg->global_batch = 32;
    cfg->epochs = 1;
    cfg->seed = 1;
}

/* A job that will write checkpoints finds out now, not after its first
 * steps, that it cannot. */
static dsim_err train_check_checkpoint_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory");
    const char *dir = dirname(copy);
    struct stat sb;
    dsim_err e = DSIM_OK;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        e = DSIM_ERR(DSIM_ENOENT, -1,
                     "train: the checkpoint directory %s (of checkpoint_path %s) does not exist; "
                     "create it or choose another path",
                     dir, path);
    free(copy);
    return e;
}

static dsim_err train_check_cfg(const dsim_train_cfg *cfg)
{
    if (!(cfg->device_flops >= 0) || isinf(cfg->device_flops))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: device_flops is %g; it must be a finite rate >= 0 (0: no "
                        "modelled compute)",
                        cfg->device_flops);
    if (cfg->hosts < 1 || cfg->devices_per_host < 1 ||
        (long long)cfg->hosts * cfg->devices_per_host > DSIM_TRAIN_MAX_REPLICAS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: the cluster is %d host(s) x %d device(s); both must be >= 1 and "
                        "the product at most %d",
                        cfg->hosts, cfg->devices_per_host, DSIM_TRAIN_MAX_REPLICAS);
    if (cfg->num_ps < 0 || cfg->num_ps > DSIM_TRAIN_MAX_PS)
        return DSIM_ERR(DSIM_EINVAL, -1, "train: num_ps is %d; it must be 0..%d", cfg->num_ps,
                        DSIM_TRAIN_MAX_PS);
    long long workers = (long long)cfg->hosts * cfg->devices_per_host * (1 + cfg->num_ps);
    if (workers > DSIM_TRAIN_MAX_WORKERS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: %d replica(s) and %d parameter server(s) need %lld runtime "
                        "workers (one per replica and one per server and replica); at most %d: "
                        "use fewer replicas or servers",
                        cfg->hosts * cfg->devices_per_host, cfg->num_ps, workers,
                        DSIM_TRAIN_MAX_WORKERS);
    if ((int)cfg->ps_mode < 0 || cfg->ps_mode >= DSIM_PS_MODE_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "train: ps_mode %d is not sync or async",
                        (int)cfg->ps_mode);
    if ((int)cfg->communication < 0 || cfg->communication >= DSIM_ALGO_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: communication %d is not an algorithm; use auto, ring, rhd, tree "
                        "or reduce_to_one",
                        (int)cfg->communication);
    if (cfg->checkpoint_every && !cfg->checkpoint_path)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: checkpoint_every is %llu but checkpoint_path is not set",
                        (unsigned long long)cfg->checkpoint_every);
    if (cfg->restore && !cfg->checkpoint_path)
        return DSIM_ERR(DSIM_EINVAL, -1, "train: restore is set but checkpoint_path is not");
    bool preempt = cfg->preempt_after || cfg->preempt_notice;
    if (preempt && !cfg->checkpoint_path)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: a preemption notice (preempt_after or preempt_notice) saves a "
                        "checkpoint to resume from, but checkpoint_path is not set");
    if (cfg->checkpoint_every || preempt)
        DSIM_CHECK(train_check_checkpoint_dir(cfg->checkpoint_path));
    if (cfg->health_interval_ns < 0 ||
        (cfg->health_interval_ns > 0 && cfg->health_timeout_ns <= 0) || cfg->health_retries < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: health check interval %lld ns, timeout %lld ns, retries %d: the "
                        "interval must be >= 0 (0: off), and with an interval the timeout > 0; "
                        "retries >= 0",
                        (long long)cfg->health_interval_ns, (long long)cfg->health_timeout_ns,
                        cfg->health_retries);
    long long ranks = (long long)cfg->hosts * cfg->devices_per_host + cfg->num_ps;
    if (cfg->local_count < 0 || cfg->local_first < 0 ||
        (cfg->local_count > 0 && cfg->local_first + (long long)cfg->local_count > ranks))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: the local ranks [%d, %d) are not within the job's %lld ranks",
                        cfg->local_first, cfg->local_first + cfg->local_count, ranks);
    DSIM_CHECK(train_check_precision(cfg));
    if (cfg->hooks && cfg->hooks->size != sizeof(dsim_train_hooks))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: hooks.size is %zu; set it to sizeof(dsim_train_hooks) (%zu)",
                        cfg->hooks->size, sizeof(dsim_train_hooks));
    DSIM_CHECK(dsim_train_check_tpu(cfg));
    return dsim_train_check_static_shapes(cfg);
}

/* Exactly one replica writes checkpoints. Asked of every replica before
 * anything runs (so before any file is read or written), from what a
 * strategy may base it on: the shape and the replica's place in it. */
static dsim_err train_check_chief(train_job *job)
{
    const dsim_train_cfg *cfg = job->cfg;
    job->chief = -1;
    for (int r = 0; r < job->N; r++) {
        dsim_replica_ctx ctx = {
            .shape = job->shape,
            .replica = r,
            .worker = r / cfg->devices_per_host,
            .device = r % cfg->devices_per_host,
            .server_rank0 = job->N,
        };
        if (!dsim_strategy_is_chief(job->strat, &ctx))
            continue;
        if (job->chief >= 0)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "strategy '%s': replicas %d and %d both claim to be the chief; "
                            "exactly one replica writes checkpoints (fix its is_chief)",
                            job->strat->name, job->chief, r);
        job->chief = r;
    }
    if (job->chief < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "strategy '%s': none of the %d replicas claims to be the chief; exactly "
                        "one replica writes checkpoints (fix its is_chief)",
                        job->strat->name, job->N);
    return DSIM_OK;
}

/* The initial variables: the checkpoint's when restoring from one, else the
 * model's initializer. */
static dsim_err train_initial_values(train_job *job)
{
    const dsim_train_cfg *cfg = job->cfg;
    const dsim_train_setup *su = &job->su;
    dsim_strategy_vars *v = &job->init;
    v->n_params = su->n_params;
    v->optim_state_len = su->optim_state_len;
    v->params = calloc(su->n_params, sizeof(float));
    v->optim_state = su->optim_state_len ? calloc(su->optim_state_len, sizeof(float)) : NULL;
    if (!v->params || (su->optim_state_len && !v->optim_state))
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the initial values");
    /* a fresh job's slots (Adagrad's accumulator starts above 0); a
     * restore replaces them */
    dsim_optim_init_state(&cfg->optim, su->n_params, v->optim_state);
    if (cfg->restore) {
        dsim_checkpoint *ck = NULL;
        dsim_err e = dsim_checkpoint_read(cfg->checkpoint_path, &ck);
        if (e == DSIM_ENOENT) {
            /* BackupAndRestore: no backup yet means a fresh start. */
            dsim_info("train: no checkpoint at %s; starting fresh", cfg->checkpoint_path);
            dsim_clear_error();
        } else if (e != DSIM_OK) {
            return e;
        } else {
            const char *bad = NULL;
            char why[512];
            if (ck->version < 2) {
                e = DSIM_ERR(DSIM_EINVAL, -1,
                             "checkpoint %s has format version %u, which does not record the "
                             "global batch and data layout it was written with, so resuming "
                             "from it cannot be checked; delete it to start fresh",
                             cfg->checkpoint_path, ck->version);
                dsim_checkpoint_free(ck);
                return e;
            }
            if (train_checkpoint_mismatch(job, ck, why, sizeof why)) {
                e = DSIM_ERR(DSIM_EINVAL, -1,
                             "%s (a checkpoint resumes only a job with the same global batch and "
                             "data layout: the steps after it would read other examples)",
                             why);
                dsim_checkpoint_free(ck);
                return e;
            }
            if (ck->n_params != su->n_params)
                bad = "its parameter count differs from the model's";
            else if (ck->optim_kind != su->optim.kind)
                bad = "it was written with another optimizer";
            else if (ck->optim_state_len != su->optim_state_len)
                bad = "its optimizer keeps another number of slots (Adam's amsgrad, RMSprop's "
                      "momentum or centered, or gradient_accumulation_steps differ from this "
                      "job's)";
            else if (ck->epoch >= cfg->epochs + (ck->step == 0 ? 1u : 0u) ||
                     ck->step > job->su.steps_per_epoch ||
                     ck->global_step != (uint64_t)ck->epoch * su->steps_per_epoch + ck->step)
                bad = "its position does not fit this job's epochs and steps";
            if (bad) {
                e = DSIM_ERR(DSIM_EINVAL, -1,
                             "checkpoint %s does not belong to this job: %s (it holds %zu "
                             "parameters, optimizer %s, position epoch %u step %llu; this job "
                             "has %u epochs of %llu steps)",
                             cfg->checkpoint_path, bad, ck->n_params,
                             dsim_optim_kind_name(ck->optim_kind), ck->epoch,
                             (unsigned long long)ck->step, cfg->epochs,
                             (unsigned long long)su->steps_per_epoch);
                dsim_checkpoint_free(ck);
                return e;
            }
            memcpy(v->params, ck->params, su->n_params * sizeof(float));
            if (su->optim_state_len)
                memcpy(v->optim_state, ck->optim_state, su->optim_state_len * sizeof(float));
            v->optim_step = ck->optim_step;
            job->has_ls = ck->has_loss_scale;
            job->ls_scale = ck->loss_scale;
            job->ls_counter = ck->loss_scale_counter;
            job->start_epoch = ck->epoch;
            job->start_step = ck->step;
            job->first_step = ck->global_step;
            dsim_checkpoint_free(ck);
            return DSIM_OK;
        }
    }
    return dsim_train_init_params(cfg, su, v->params);
}

static dsim_err train_alloc_result(train_job *job)
{
    dsim_train_result *res = job->res;
    size_t steps = (size_t)(job->end_step - job->first_step), N = (size_t)job->N;
    size_t P = job->su.n_params;
    res->steps = steps;
    res->n_params = P;
    res->n_vars = job->su.n_vars;
    memcpy(res->vars, job->su.vars, sizeof res->vars);
    res->params = calloc(P, sizeof(float));
    res->loss = calloc(steps ? steps : 1, sizeof(double));
    res->local_loss = calloc(steps * N + 1, sizeof(double));
    res->checksum = calloc(steps * N + 1, sizeof(uint64_t));
    res->examples = calloc(steps * N + 1, sizeof(uint64_t));
    res->padded = calloc(steps * N + 1, sizeof(uint64_t));
    res->step_ns = calloc(steps * N + 1, sizeof(int64_t));
    res->comm_ns = calloc(steps * N + 1, sizeof(int64_t));
    res->checkpoint_writes = calloc(N, sizeof(uint64_t));
    res->replicas = calloc(N, sizeof *res->replicas);
    res->trace_every = job->cfg->trace_every > 1 ? job->cfg->trace_every : 1;
    if (job->cfg->record_params)
        res->trace = calloc(steps / res->trace_every * P + 1, sizeof(float));
    if (job->cfg->record_grads) {
        res->trace_grad_rows = (steps + res->trace_every - 1) / res->trace_every;
        res->trace_grad = calloc(res->trace_grad_rows * P + 1, sizeof(float));
        job->grad_filled = calloc(res->trace_grad_rows + 1, 1);
        if (dsim_optim_is_adaptive(&job->cfg->optim) && res->trace_every > 1)
            res->trace_slots =
                calloc(res->trace_grad_rows * dsim_optim_rule_slots(&job->cfg->optim) * P + 1,
                       sizeof(float));
    }
    res->mp_scale = calloc(steps * N + 1, sizeof(float));
    res->mp_skipped = calloc(steps * N + 1, 1);
    res->var_sig = calloc(steps * N * DSIM_MODEL_MAX_VARS + 1, sizeof(uint16_t));
    if (!(res->grad_norm = train_grad_norms_alloc(steps * N)))
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the result of %zu steps", steps);
    if (job->cfg->probe_restore && job->first_step > 0) {
        res->restored_params = calloc(P ? P : 1, sizeof(float));
        res->restored_optim_state = calloc(job->su.optim_state_len + 1, sizeof(float));
        if (!res->restored_params || !res->restored_optim_state)
            return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the restore probe");
    }
    if (!res->params || !res->loss || !res->local_loss || !res->checksum || !res->examples ||
        !res->padded || !res->step_ns || !res->comm_ns || !res->checkpoint_writes ||
        !res->replicas || !res->mp_scale || !res->mp_skipped || !res->var_sig ||
        (job->cfg->record_params && !res->trace) ||
        (res->trace_grad_rows && (!res->trace_grad || !job->grad_filled)) ||
        (res->trace_grad_rows && dsim_optim_is_adaptive(&job->cfg->optim) && res->trace_every > 1 &&
         !res->trace_slots))
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the result of %zu steps", steps);
    for (size_t k = 0; k < steps; k++)
        res->loss[k] = NAN;
    return dsim_ledger_create(job->su.ds->spec.n_examples, job->cfg->epochs, job->cfg->hosts,
                              job->cfg->devices_per_host, &res->ledger);
}

/* A preemption stops every replica at the same step: the run is then as
 * long as that. */
static void train_preempted(train_job *job)
{
    for (int r = 0; r < job->N; r++) {
        const train_replica *rp = &job->reps[r];
        if (rp->killed || !rp->preempted_at)
            continue;
        job->res->preempted = true;
        job->res->preempted_at = rp->preempted_at;
        job->res->steps = rp->preempted_at - job->first_step;
        return;
    }
}

/* Filled for a failed run too: which checkpoints exist is what a caller
 * needs to resume it. */
static void train_count_checkpoints(train_job *job)
{
    dsim_train_result *res = job->res;
    if (!job->reps || !res->checkpoint_writes)
        return;
    res->checkpoints_written = 0;
    for (int r = 0; r < job->N; r++) {
        res->checkpoint_writes[r] = job->reps[r].ckpt_writes;
        res->checkpoints_written += job->reps[r].ckpt_writes;
    }
}

static void train_collect(train_job *job)
{
    dsim_train_result *res = job->res;
    int N = job->N;
    size_t P = job->su.n_params;
    /* A killed replica's variables stop where it died: the job's are the
     * first survivor's, and only survivors are compared. */
    int first = 0;
    while (first < N - 1 && (job->reps[first].killed || !train_local(job, first)))
        first++;
    /* A server's process has no replica: the replicas' results are elsewhere. */
    bool any = train_local(job, first);
    if (any)
        memcpy(res->params, job->reps[first].final, P * sizeof(float));
    res->replicas_agree = true;
    for (int r = first + 1; any && r < N; r++)
        if (train_local(job, r) && !job->reps[r].killed &&
            memcmp(job->reps[r].final, job->reps[first].final, P * sizeof(float)) != 0)
            res->replicas_agree = false;
    res->in_sync_every_step = true;
    for (size_t k = 0; any && k < res->steps; k++)
        for (int r = first + 1; r < N; r++)
            if (train_local(job, r) && !job->reps[r].killed &&
                res->checksum[k * (size_t)N + (size_t)r] != res->checksum[k * (size_t)N + first])
                res->in_sync_every_step = false;
    for (size_t i = 0; i < res->steps * (size_t)N; i++)
        res->padded_total += res->padded[i];
    res->final_loss = any ? dsim_train_mean_loss(&job->su, res->params) : NAN;
    if (any) {
        res->skipped_steps = job->reps[first].ctx.loss_scale.skips;
        res->final_loss_scale = job->reps[first].ctx.loss_scale.scale;
    }
    size_t total = 0;
    for (int s = 0; s < job->P; s++)
        total += job->srvs[s].n_updates;
    if (total) {
        res->updates = malloc(total * sizeof *res->updates);
        if (res->updates) {
            for (int s = 0; s < job->P; s++) {
                if (!job->srvs[s].n_updates)
                    continue; /* a server of another process */
                memcpy(res->updates + res->n_updates, job->srvs[s].updates,
                       job->srvs[s].n_updates * sizeof *res->updates);
                res->n_updates += job->srvs[s].n_updates;
            }
            for (size_t i = 0; i < res->n_updates; i++)
                if (res->updates[i].staleness > res->max_staleness)
                    res->max_staleness = res->updates[i].staleness;
        }
    }
}

/* What each replica's collectives came to, for a harness to explain a
 * failure with. Only the recorders no thread writes any more are copied:
 * a replica the watchdog left running (abandoned) may still be inside a
 * collective, so its entry holds only its rank and how many calls it had
 * begun (read atomically), no entries. A rank of another process has none. */
static void train_collect_flight(train_job *job)
{
    dsim_train_result *res = job->res;
    if (!job->world || res->flight || !(res->flight = calloc((size_t)job->N, sizeof *res->flight)))
        return;
    res->n_flight = job->N;
    for (int r = 0; r < job->N; r++) {
        dsim_fr_dump *d = &res->flight[r];
        d->rank = d->world_rank = r;
        d->size = job->N;
        d->comm_id = DSIM_STRATEGY_COMM_WORLD;
        d->color = -1;
        if (!job->world[r])
            continue;
        if (job->reps && job->reps[r].abandoned) {
            dsim_comm_last_call(job->world[r], NULL, &d->calls);
            continue;
        }
        (void)dsim_comm_flight_dump(job->world[r], d);
    }
    /* then the strategy's sub-communicators, replica by replica */
    for (int r = 0; r < job->N; r++) {
        dsim_fr_dump *subs = NULL;
        size_t ns = 0;
        if (!job->world[r] || (job->reps && job->reps[r].abandoned) ||
            dsim_comm_flight_dump_subs(job->world[r], &subs, &ns) != DSIM_OK || !ns)
            continue;
        dsim_fr_dump *all = realloc(res->flight, ((size_t)res->n_flight + ns) * sizeof *all);
        if (!all) {
            for (size_t i = 0; i < ns; i++)
                dsim_fr_dump_free(&subs[i]);
            free(subs);
            continue;
        }
        res->flight = all;
        memcpy(all + res->n_flight, subs, ns * sizeof *subs);
        res->n_flight += (int)ns;
        free(subs);
    }
}

/* Hands the job's result to the caller: moved when every worker returned;
 * when some were left running, only what they no longer write. */
static void train_hand_over(train_job *job, dsim_train_result *res, bool hung)
{
    *res = job->resv;
    if (!hung) {
        memset(&job->resv, 0, sizeof job->resv);
        return;
    }
    res->params = NULL;
    res->loss = NULL;
    res->local_loss = NULL;
    res->checksum = NULL;
    res->examples = NULL;
    res->padded = NULL;
    res->step_ns = NULL;
    res->comm_ns = NULL;
    res->trace = NULL;
    res->trace_rows = 0;
    res->trace_grad = NULL;
    res->trace_grad_rows = 0;
    res->mp_scale = NULL;
    res->mp_skipped = NULL;
    res->var_sig = NULL;
    res->grad_norm = NULL;
    res->ledger = NULL;
    res->updates = NULL;
    res->n_updates = 0;
    res->checkpoint_writes = NULL;
    res->replicas = NULL;
    res->restored_params = NULL;
    res->restored_optim_state = NULL;
    res->has_restored = false;
    /* Made by the driver alone before the workers ran or after the
     * watchdog gave up on them: moved like stuck. */
    job->resv.initial_params = NULL;
    job->resv.flight = NULL;
    job->resv.n_flight = 0;
    job->resv.optim_state = NULL;
    res->stuck = job->stuck;
    res->n_stuck = job->n_stuck;
    job->stuck = NULL;
    job->n_stuck = 0;
    if (!job->resv.replicas)
        return;
    res->replicas = calloc((size_t)job->N, sizeof *res->replicas);
    if (!res->replicas)
        return;
    /* A returned replica wrote its entry before it said so under the lock;
     * a stuck one's is made here from where it was. */
    for (int r = 0; r < job->N; r++)
        if (job->reps[r].task && !job->reps[r].abandoned)
            res->replicas[r] = job->resv.replicas[r];
    for (size_t i = 0; i < res->n_stuck; i++) {
        const dsim_train_stuck *st = &res->stuck[i];
        if (st->where.server >= 0)
            continue;
        dsim_train_replica_end *end = &res->replicas[st->where.replica];
        end->phase = st->where.phase;
        end->global_step = st->where.global_step;
        end->status = DSIM_EHUNG;
        dsim_train_stuck_describe(st, end->msg, sizeof end->msg);
    }
}

dsim_err dsim_train(const dsim_train_cfg *cfg, dsim_train_result *res)
{
    if (!res)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_train: res is NULL");
    memset(res, 0, sizeof *res);
    res->error.peer = -1;
    if (!cfg) {
        dsim_err e = DSIM_ERR(DSIM_EINVAL, -1, "dsim_train: cfg is NULL");
        dsim_error_copy(&res->error);
        return e;
    }
    if (cfg->synthetic_params > 0) { /* a synthetic model: timing only */
        dsim_err e = dsim_train_timing(cfg, res);
        if (e != DSIM_OK)
            dsim_error_copy(&res->error);
        return e;
    }
    dsim_err e = train_check_cfg(cfg);
    if (e != DSIM_OK) {
        dsim_error_copy(&res->error);
        return e;
    }
    train_job *job = calloc(1, sizeof *job);
    if (!job) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "dsim_train: out of memory");
        dsim_error_copy(&res->error);
        return e;
    }
    atomic_init(&job->refs, 1);
    /* The workers read the job's copy: one the watchdog leaves running may
     * outlive the caller's. */
    job->cfgv = *cfg;
    job->cfg = &job->cfgv;
    job->res = &job->resv;
    job->resv.error.peer = -1;
    bool hung = false;
    if (cfg->checkpoint_path && !(job->checkpoint_path = strdup(cfg->checkpoint_path)))
        e = DSIM_ERR(DSIM_ENOMEM, -1, "dsim_train: out of memory");
    job->cfgv.checkpoint_path = job->checkpoint_path;
    cfg = job->cfg;
    /* Everything below fills the job's result; out is the caller's. */
    dsim_train_result *out = res;
    res = job->res;
    if (e == DSIM_OK && cfg->plugin_path)
        e = dsim_strategy_load(cfg->strategy, cfg->plugin_path);
    if (e == DSIM_OK)
        e = dsim_strategy_lookup(cfg->strategy, &job->strat);
    if (e != DSIM_OK)
        goto out;
    job->N = cfg->hosts * cfg->devices_per_host;
    job->P = cfg->num_ps;
    job->shape = (dsim_strategy_shape){
        .hosts = cfg->hosts,
        .devices_per_host = cfg->devices_per_host,
        .num_replicas = job->N,
        .num_ps = cfg->num_ps,
        .ps_mode = cfg->ps_mode,
        .global_batch = cfg->global_batch,
        .tpu = cfg->tpu.replicas > 0 ? &cfg->tpu : NULL,
    };
    if ((e = dsim_strategy_check_shape(job->strat, &job->shape)) != DSIM_OK ||
        (e = train_check_chief(job)) != DSIM_OK)
        goto out;
    job->preempt_armed = cfg->preempt_after || cfg->preempt_notice;
    if ((cfg->checkpoint_every || job->preempt_armed) &&
        (e = dsim_strategy_check_save(job->strat)) != DSIM_OK)
        goto out;
    if ((e = dsim_train_setup_open(cfg, &job->su)) != DSIM_OK)
        goto out;
    job->timeout_ns = cfg->timeout_ns >= 0 ? cfg->timeout_ns : DSIM_COMM_DEFAULT_TIMEOUT_NS;
    int nris = dsim_strategy_replicas_in_sync(job->strat, &job->shape);
    if (nris < 1 || nris > job->N) {
        e = DSIM_ERR(DSIM_EINVAL, -1, "strategy '%s' says %d replicas are in sync, outside 1..%d",
                     job->strat->name, nris, job->N);
        goto out;
    }
    /* TF's compute_average_loss: divide by per-replica batch x replicas in
     * sync; exactly 1/G when every replica is in sync. */
    job->loss_scale = nris == job->N ? 1.0f / (float)cfg->global_batch
                                     : (float)((double)job->N / ((double)cfg->global_batch * nris));
    snprintf(res->strategy, sizeof res->strategy, "%s", job->strat->name);
    res->placement = (int)job->strat->ops->placement;
    res->num_workers = cfg->hosts;
    res->devices_per_host = cfg->devices_per_host;
    res->num_replicas = job->N;
    res->num_ps = job->P;
    res->num_replicas_in_sync = nris;
    res->loss_scale = job->loss_scale;
    res->precision = cfg->precision == DSIM_POLICY_DEFAULT ? DSIM_POLICY_FLOAT32 : cfg->precision;
    res->gradient_dtype = cfg->gradient_dtype;
    res->shard_applied = job->su.applied;
    res->input_from_strategy = job->su.input_ops != NULL;
    res->steps_per_epoch = job->su.steps_per_epoch;
    job->total_steps = job->su.steps_per_epoch * cfg->epochs;
    if ((e = train_initial_values(job)) != DSIM_OK)
        goto out;
    job->end_step = job->total_steps;
    if (cfg->stop_after && cfg->stop_after < job->end_step)
        job->end_step = cfg->stop_after;
    if (job->end_step < job->first_step)
        job->end_step = job->first_step;
    res->first_step = job->first_step;
    res->initial_loss = dsim_train_mean_loss(&job->su, job->init.params);
    res->initial_checksum = dsim_params_checksum(job->init.params, job->su.n_params);
    if ((e = train_alloc_result(job)) != DSIM_OK)
        goto out;
    if (cfg->record_params) {
        res->initial_params = malloc(job->su.n_params * sizeof(float) + 1);
        if (!res->initial_params) {
            e = DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the initial variables");
            goto out;
        }
        memcpy(res->initial_params, job->init.params, job->su.n_params * sizeof(float));
    }
    if ((e = train_open_world(job)) == DSIM_OK)
        e = train_run_workers(job);
    hung = e == DSIM_EHUNG;
    if (!hung)
        train_count_checkpoints(job);
    train_collect_flight(job);
    if (e == DSIM_OK && job->failed) {
        dsim_error *er = &job->err;
        e = dsim_set_error(er->code, er->peer, er->file, er->line, "%s", er->msg);
    }
    if (e == DSIM_OK)
        train_preempted(job);
    if (e == DSIM_OK)
        train_collect(job);
    if (e == DSIM_OK && res->preempted)
        e = DSIM_ERR(DSIM_EPREEMPTED, -1,
                     "train: preempted after global step %llu; checkpoint %s holds it: run the "
                     "job again with restore to resume",
                     (unsigned long long)res->preempted_at, cfg->checkpoint_path);
out:
    if (job->rt) {
        /* the outcome closes the trace: equal hashes mean equal parameters */
        dsim_rt_trace(job->rt, DSIM_TRACE_RESULT, (uint64_t)e,
                      e == DSIM_OK ? dsim_params_checksum(res->params, job->su.n_params) : 0,
                      res->steps);
        res->trace_hash = dsim_rt_trace_hash(job->rt, &res->trace_events);
    }
    if (res->trace)
        res->trace_rows = res->steps / res->trace_every;
    if (res->trace_grad) {
        res->trace_grad_rows = (res->steps + res->trace_every - 1) / res->trace_every;
        train_grads_close(job);
    }
    train_hand_over(job, out, hung);
    if (hung)
        train_abandon(job);
    train_job_unref(job);
    if (e != DSIM_OK)
        dsim_error_copy(&out->error);
    return e;
}
