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
 * reached only through a gate that the driver closes before it returns. */
#include <libgen.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsim/health.h"
#include "dsim/log.h"
#include "dsim/rng.h"
#include "dsim/spi/rt.h"
#include "strategy_int.h"

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

/* ---- setup shared with the reference ---- */

void dsim_train_setup_close(dsim_train_setup *su)
{
    dsim_dataset_free(su->ds_owned);
    free(su->file_start);
    free(su->file_ids);
    memset(su, 0, sizeof *su);
}

dsim_err dsim_train_input(const dsim_train_cfg *cfg, const dsim_train_setup *su, int worker,
                          dsim_input **out)
{
    dsim_input_config ic = {
        .dataset = &su->desc,
        .policy = cfg->shard,
        .global_batch = cfg->global_batch,
        .num_workers = cfg->hosts,
        .replicas_per_worker = cfg->devices_per_host,
        .worker = worker,
        .seed = cfg->seed,
        .shuffle = cfg->shuffle,
        .drop_remainder = cfg->drop_remainder,
        .epochs = cfg->epochs,
        /* 0 while the setup makes the first input; then every worker's
         * input skips what that one already did for the whole job */
        .steps_per_epoch = su->steps_per_epoch,
    };
    return dsim_input_create(&ic, out);
}

dsim_err dsim_train_setup_open(const dsim_train_cfg *cfg, dsim_train_setup *su)
{
    memset(su, 0, sizeof *su);
    if (cfg->hosts < 1 || cfg->devices_per_host < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: the cluster is %d host(s) x %d device(s); both must be >= 1",
                        cfg->hosts, cfg->devices_per_host);
    if (cfg->global_batch < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "train: global_batch is %lld; it must be >= 1",
                        (long long)cfg->global_batch);
    if (cfg->epochs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "train: epochs is %u; it must be >= 1", cfg->epochs);
    if (cfg->dataset) {
        su->ds = cfg->dataset;
    } else {
        DSIM_CHECK(dsim_dataset_make(&cfg->data, &su->ds_owned));
        su->ds = su->ds_owned;
    }
    const dsim_dataset *ds = su->ds;
    dsim_err e = DSIM_OK;
    if (cfg->model.in_dim == 0)
        dsim_dataset_model_spec(ds, &su->model);
    else
        su->model = cfg->model;
    if ((e = dsim_model_validate(&su->model)) != DSIM_OK ||
        (e = dsim_dataset_check_model(ds, &su->model)) != DSIM_OK ||
        (e = dsim_optim_validate(&cfg->optim)) != DSIM_OK)
        goto fail;
    su->optim = cfg->optim;
    su->n_params = dsim_model_num_params(&su->model);
    {
        dsim_optim *probe = NULL;
        if ((e = dsim_optim_create(&su->optim, su->n_params, &probe)) != DSIM_OK)
            goto fail;
        su->optim_state_len = dsim_optim_state_len(probe);
        dsim_optim_destroy(probe);
    }
    /* The dataset's record files become the input's file list. */
    uint64_t n = ds->spec.n_examples;
    su->desc.n_examples = n;
    su->desc.hint = cfg->hint;
    if (!cfg->in_memory) {
        size_t nf = ds->spec.n_files;
        su->file_start = malloc((nf + 1) * sizeof *su->file_start);
        su->file_ids = malloc((n ? n : 1) * sizeof *su->file_ids);
        if (!su->file_start || !su->file_ids) {
            e = DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the file list");
            goto fail;
        }
        for (size_t f = 0; f <= nf; f++)
            su->file_start[f] = ds->file_start[f];
        for (uint64_t i = 0; i < n; i++)
            su->file_ids[i] = i;
        su->desc.n_files = (uint32_t)nf;
        su->desc.file_start = su->file_start;
        su->desc.file_ids = su->file_ids;
    }
    {
        dsim_input *in = NULL;
        if ((e = dsim_train_input(cfg, su, 0, &in)) != DSIM_OK)
            goto fail;
        su->steps_per_epoch = dsim_input_steps_per_epoch(in);
        su->applied = dsim_input_policy_applied(in);
        dsim_input_destroy(in);
    }
    return DSIM_OK;
fail:
    dsim_train_setup_close(su);
    return e;
}

dsim_err dsim_train_init_params(const dsim_train_cfg *cfg, const dsim_train_setup *su,
                                float *params)
{
    dsim_rng r;
    dsim_rng_init(&r, cfg->seed, "model.init", 0);
    return dsim_model_init(&su->model, params, &r);
}

double dsim_train_mean_loss(const dsim_train_setup *su, const float *params)
{
    double sum = NAN;
    size_t n = su->ds->spec.n_examples;
    if (dsim_model_eval(&su->model, params, su->ds->x, su->ds->y, n, &sum, NULL) != DSIM_OK)
        return NAN;
    return sum / (double)n;
}

/* ---- the job ---- */

typedef struct train_job train_job;

typedef struct train_replica {
    train_job *job;
    int index;
    dsim_replica_ctx ctx;
    void *priv;
    float *final;
    dsim_task *task;
    uint64_t ckpt_writes;
    uint64_t preempted_at;   /* global steps done when a preemption stopped it; 0: none */
    _Atomic int phase;       /* dsim_phase: where the replica is now */
    _Atomic uint64_t step;   /* the global step it is on */
    _Atomic int64_t t_phase; /* when it entered the phase */
    uint64_t good_checksum;  /* its variables after the last update that succeeded */
    uint64_t coll_failed;    /* its world communicator's failed calls, as last seen */
    bool killed;             /* stopped by the hooks, as a killed process */
    _Atomic int dead;        /* killed by a phase hook: its worker's health check stops */
    _Atomic int in_cb;       /* TRAIN_CB_*: inside the caller's code */
    bool returned;           /* under job->lock */
    bool abandoned;          /* the driver's: left running by the watchdog */
} train_replica;

typedef struct train_server {
    train_job *job;
    dsim_server_ctx ctx;
    void *priv;
    int inited;
    dsim_ps_update *updates;
    size_t n_updates, cap_updates;
} train_server;

typedef struct train_handler {
    train_job *job;
    int server, client;
    dsim_task *task;
    bool returned;  /* under job->lock */
    bool abandoned; /* the driver's */
} train_handler;

/* One worker's health check (dsim/health.h). */
typedef struct train_health {
    train_job *job;
    int worker;
    dsim_health *h;
} train_health;

/* Where a replica is inside the caller's code. */
enum { TRAIN_CB_NONE, TRAIN_CB_HOOK, TRAIN_CB_OBSERVER };

struct train_job {
    const dsim_train_cfg *cfg;
    const dsim_strategy *strat;
    dsim_strategy_shape shape;
    dsim_train_setup su;
    int N, P;
    int chief;          /* the replica that writes checkpoints */
    int64_t timeout_ns; /* collectives': > 0 the bound, 0 none */
    float loss_scale;
    uint64_t total_steps, first_step, end_step;
    uint32_t start_epoch;
    uint64_t start_step;
    dsim_strategy_vars init;
    dsim_rt *rt;
    dsim_fabric *fab;
    dsim_ep **eps;     /* N + P */
    dsim_comm **world; /* N */
    dsim_comm **ctl;   /* N, comm id DSIM_STRATEGY_COMM_CONTROL: preemption's agreement */
    bool preempt_armed;
    train_replica *reps;
    train_server *srvs;
    train_handler *handlers; /* P * N */
    train_health *health;    /* [hosts] when the job runs the health check, else NULL */
    dsim_waitq *lock;
    int failed;
    dsim_error err;
    dsim_train_result *res; /* &resv */

    /* What the workers may use after a hung dsim_train has returned: the
     * caller's configuration copied, and the result they write. */
    dsim_train_cfg cfgv;
    char *checkpoint_path;
    dsim_train_result resv;
    atomic_int refs; /* the driver and each worker not yet returned */

    /* the watchdog; under lock unless atomic */
    int spawned_r, spawned_h;
    int n_running;                 /* spawned and not returned */
    int64_t failed_at;             /* dsim_rt_now when failed was set */
    _Atomic int64_t last_progress; /* a phase entered or a worker returned */
    dsim_train_stuck *stuck;
    size_t n_stuck;
    /* the gate to the caller's observer and hooks */
    atomic_int gate_in;
    atomic_bool gate_closed;
    train_job *abandoned_next; /* under train_abandoned_mu */
};

/* Does this process host rank r? */
static bool train_local(const train_job *job, int r)
{
    const dsim_train_cfg *cfg = job->cfg;
    return cfg->local_count <= 0 ||
           (r >= cfg->local_first && r < cfg->local_first + cfg->local_count);
}

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

static void *train_aligned_zalloc(size_t n)
{
    if (n == 0)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 16, (n + 15) & ~(size_t)15) != 0)
        return NULL;
    memset(p, 0, n);
    return p;
}

/* Wakes every server's waiters after an abort. The abort flag is not set
 * under a server's lock, so the wake takes the lock: a waiter that tested
 * the flag just before the abort is then already asleep and gets the wake,
 * instead of sleeping through it until its deadline. */
static void train_wake_servers(train_job *job)
{
    for (int s = 0; s < job->P; s++) {
        dsim_waitq *q = job->srvs[s].ctx.lock;
        if (!q)
            continue;
        dsim_waitq_lock(q);
        dsim_waitq_wake(q);
        dsim_waitq_unlock(q);
    }
}

/* How directly an error names a cause: an abort only echoes another
 * failure, a timeout says something did not come, anything else (a lost or
 * corrupt message, a peer that reset, a strategy's own error) says what
 * happened. */
static int train_err_rank(dsim_err e)
{
    return e == DSIM_EABORTED ? 0 : e == DSIM_ETIMEDOUT ? 1 : 2;
}

/* Records the calling worker's failure (the first one wins, except that a
 * more direct cause replaces an abort or a timeout it caused) and aborts
 * the job. */
static void train_fail(train_job *job, const char *who, int index, int rank)
{
    dsim_error err;
    dsim_error_copy(&err);
    char msg[sizeof err.msg + 64];
    snprintf(msg, sizeof msg, "%s %d: %s", who, index, err.msg);
    msg[sizeof err.msg - 1] = '\0'; /* a long message loses its tail */
    memcpy(err.msg, msg, sizeof err.msg);
    dsim_waitq_lock(job->lock);
    if (!job->failed || train_err_rank(err.code) > train_err_rank(job->err.code)) {
        if (!job->failed)
            job->failed_at = dsim_rt_now(job->rt);
        job->failed = 1;
        job->err = err;
        dsim_waitq_wake(job->lock); /* the driver's grace starts now */
    }
    dsim_waitq_unlock(job->lock);
    dsim_fabric_abort(job->fab, err.peer >= 0 ? err.peer : rank, msg);
    train_wake_servers(job);
}

dsim_err dsim_server_record_update(dsim_server_ctx *srv, int replica, uint64_t step,
                                   uint64_t version_read, uint64_t version_applied)
{
    train_server *ts = srv ? srv->driver : NULL;
    if (!ts)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_server_record_update: not a driver's server");
    if (ts->n_updates == ts->cap_updates) {
        size_t cap = ts->cap_updates ? 2 * ts->cap_updates : 64;
        dsim_ps_update *u = realloc(ts->updates, cap * sizeof *u);
        if (!u)
            return DSIM_ERR(DSIM_ENOMEM, -1,
                            "parameter server %d: out of memory recording "
                            "updates",
                            srv->server);
        ts->updates = u;
        ts->cap_updates = cap;
    }
    ts->updates[ts->n_updates++] = (dsim_ps_update){
        .replica = replica,
        .server = srv->server,
        .global_step = step,
        .version_read = version_read,
        .version_applied = version_applied,
        .staleness = version_applied >= version_read ? version_applied - version_read : 0,
    };
    return DSIM_OK;
}

static const char *const train_phase_names[DSIM_PHASE_COUNT] = {
    [DSIM_PHASE_START] = "start",
    [DSIM_PHASE_RENDEZVOUS] = "rendezvous",
    [DSIM_PHASE_RESTORE] = "restore",
    [DSIM_PHASE_CREATE_VARIABLES] = "create_variables",
    [DSIM_PHASE_COMPUTE] = "compute",
    [DSIM_PHASE_ALLREDUCE] = "allreduce",
    [DSIM_PHASE_REDUCE_LOSS] = "reduce_loss",
    [DSIM_PHASE_CHECKPOINT] = "checkpoint",
    [DSIM_PHASE_FINISH] = "finish",
    [DSIM_PHASE_DONE] = "done",
};

const char *dsim_phase_name(dsim_phase p)
{
    return (int)p >= 0 && p < DSIM_PHASE_COUNT ? train_phase_names[p] : "unknown";
}

dsim_err dsim_phase_parse(const char *s, dsim_phase *out)
{
    for (int i = 0; s && i < DSIM_PHASE_COUNT; i++) {
        if (strcmp(s, train_phase_names[i]) == 0) {
            *out = (dsim_phase)i;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "'%s' is not a phase; accepted: start, rendezvous, restore, create_variables, "
                    "compute, allreduce, reduce_loss, checkpoint, finish, done",
                    s ? s : "(null)");
}

/* Why a replica stopped without an error of its own. */
#define TRAIN_DIED ((dsim_err)-1)

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
static const char *train_checkpoint_mismatch(const train_job *job, const dsim_checkpoint *ck,
                                             char *buf, size_t cap)
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
    };
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
                          double local, double loss, uint64_t cks, int64_t t0, int64_t tc,
                          int64_t t1, int rerun_of)
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
    };
    cfg->observer(&info, cfg->observer_user);
    train_gate_leave(job, rp);
}

/* A strategy call that returned success although a collective of the
 * replica's world communicator failed inside it: an error the strategy
 * swallowed. The first is kept with where it was; the rest are counted. */
static void train_swallowed(train_replica *rp, dsim_phase p, uint64_t gs)
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

/* The hooks' batch member: the replica read b in st, as the ledger has it. */
static void train_note_batch(train_replica *rp, const dsim_input_step *st,
                             const dsim_replica_batch *b)
{
    train_job *job = rp->job;
    const dsim_train_hooks *hk = job->cfg->hooks;
    if (hk && hk->size >= sizeof *hk && hk->batch && train_gate_enter(job, rp, TRAIN_CB_HOOK)) {
        hk->batch(job->cfg->hooks_user, rp->index, st->epoch, st->step, b->ids, b->n);
        train_gate_leave(job, rp);
    }
}

/* cfg.probe_restore: what the strategy holds right after the restore, by
 * its own save(), every replica calling it; the chief's is kept. */
static dsim_err train_probe_restore(train_replica *rp, dsim_strategy_vars *save)
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
        memset(grad, 0, P * sizeof(float));
        double loss_sum = 0;
        if ((e = dsim_model_loss_grad(&su->model, ctx->params, nb ? x : NULL, nb ? y : NULL, nb,
                                      job->loss_scale, grad, &loss_sum)) != DSIM_OK)
            break;
        if ((e = dsim_ledger_record_rerun(job->res->ledger, rp->index, lost, st.epoch, st.step,
                                          b->ids, b->n)) != DSIM_OK)
            break;
        TRAIN_ENTER(rp, DSIM_PHASE_ALLREDUCE, gs);
        if ((e = dsim_strategy_apply_gradients(s, ctx, grad)) != DSIM_OK)
            break;
        rp->good_checksum = dsim_params_checksum(ctx->params, P);
        job->res->replicas[rp->index].reruns++;
        train_observe(rp, &st, b, loss_sum * (double)job->loss_scale, NAN, rp->good_checksum, t0,
                      t0, dsim_rt_now(job->rt), lost);
    }
out:
    dsim_input_destroy(in);
    return e;
}

static dsim_err train_replica_run(train_replica *rp, int *inited)
{
    train_job *job = rp->job;
    const dsim_train_cfg *cfg = job->cfg;
    const dsim_train_setup *su = &job->su;
    dsim_replica_ctx *ctx = &rp->ctx;
    dsim_train_result *res = job->res;
    const dsim_strategy *s = job->strat;
    size_t in_dim = su->model.in_dim, y_dim = su->ds->y_dim, P = su->n_params;
    /* A replica's batch is a part of one global batch of the dataset. */
    size_t maxb = (size_t)cfg->global_batch;
    if (maxb > su->ds->spec.n_examples)
        maxb = su->ds->spec.n_examples;
    dsim_input *in = NULL;
    float *x = malloc(maxb * in_dim * sizeof(float));
    float *y = malloc(maxb * y_dim * sizeof(float));
    float *grad = malloc(P * sizeof(float));
    dsim_strategy_vars save = {0};
    dsim_err e = DSIM_OK;
    if (!x || !y || !grad) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for a batch of %zu examples", maxb);
        goto out;
    }
    if (cfg->checkpoint_every || job->preempt_armed || cfg->probe_restore) {
        save.n_params = P;
        save.params = malloc(P * sizeof(float));
        save.optim_state_len = su->optim_state_len;
        save.optim_state = su->optim_state_len ? malloc(su->optim_state_len * sizeof(float)) : NULL;
        if (!save.params || (su->optim_state_len && !save.optim_state)) {
            e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for a checkpoint buffer");
            goto out;
        }
    }
    if ((e = dsim_train_input(cfg, su, ctx->worker, &in)) != DSIM_OK)
        goto out;
    if (job->first_step > 0 && job->first_step < job->end_step &&
        (e = dsim_input_seek(in, job->start_epoch, job->start_step)) != DSIM_OK)
        goto out;
    *inited = 1;
    /* the step about to be run: after a restore, the checkpoint's */
    ctx->global_step = job->first_step;
    TRAIN_ENTER(rp, DSIM_PHASE_RENDEZVOUS, job->first_step);
    if ((e = dsim_strategy_replica_init(s, ctx)) != DSIM_OK)
        goto out;
    if (job->first_step > 0)
        TRAIN_ENTER(rp, DSIM_PHASE_RESTORE, job->first_step);
    TRAIN_ENTER(rp, DSIM_PHASE_CREATE_VARIABLES, job->first_step);
    if ((e = dsim_strategy_create_variables(s, ctx, rp->index == 0 ? &job->init : NULL)) != DSIM_OK)
        goto out;
    rp->good_checksum = dsim_params_checksum(ctx->params, P);
    job->res->replicas[rp->index].created_checksum = rp->good_checksum;
    train_swallowed(rp, DSIM_PHASE_CREATE_VARIABLES, job->first_step);
    if (cfg->probe_restore && job->first_step > 0 &&
        (e = train_probe_restore(rp, &save)) != DSIM_OK)
        goto out;
    int chief = rp->index == job->chief;
    uint64_t stop_at = UINT64_MAX; /* where a preemption stops the job, once agreed */
    int N = job->N;
    for (uint64_t gs = job->first_step; gs < job->end_step; gs++) {
        ctx->global_step = gs;
        TRAIN_ENTER(rp, DSIM_PHASE_COMPUTE, gs);
        dsim_input_step st;
        if ((e = dsim_input_next(in, &st)) != DSIM_OK)
            goto out;
        if (st.done) {
            e = DSIM_ERR(DSIM_ESTATE, -1, "the input ended at global step %llu of %llu",
                         (unsigned long long)gs, (unsigned long long)job->end_step);
            goto out;
        }
        const dsim_replica_batch *b = &st.batch[ctx->device];
        int64_t t0 = dsim_rt_now(job->rt);
        size_t nb = (size_t)b->n;
        if (nb > maxb) {
            e = DSIM_ERR(DSIM_ESTATE, -1,
                         "a batch of %zu examples exceeds the global batch or the dataset (%zu)",
                         nb, maxb);
            goto out;
        }
        if (nb && (e = dsim_dataset_gather(su->ds, b->ids, nb, x, y)) != DSIM_OK)
            goto out;
        memset(grad, 0, P * sizeof(float));
        double loss_sum = 0;
        if ((e = dsim_model_loss_grad(&su->model, ctx->params, nb ? x : NULL, nb ? y : NULL, nb,
                                      job->loss_scale, grad, &loss_sum)) != DSIM_OK)
            goto out;
        if (cfg->device_flops > 0)
            dsim_rt_charge(job->rt,
                           (int64_t)(6.0 * (double)P * (double)nb / cfg->device_flops * 1e9));
        if ((e = dsim_ledger_record(res->ledger, rp->index, st.epoch, st.step, b->ids, b->n)) !=
            DSIM_OK)
            goto out;
        train_note_batch(rp, &st, b);
        TRAIN_ENTER(rp, DSIM_PHASE_ALLREDUCE, gs);
        int64_t tc = dsim_rt_now(job->rt); /* compute ends, the exchange begins */
        if ((e = dsim_strategy_apply_gradients(s, ctx, grad)) != DSIM_OK)
            goto out;
        train_swallowed(rp, DSIM_PHASE_ALLREDUCE, gs);
        /* what a failure later in the step must leave untouched */
        rp->good_checksum = dsim_params_checksum(ctx->params, P);
        TRAIN_ENTER(rp, DSIM_PHASE_REDUCE_LOSS, gs);
        double local = loss_sum * (double)job->loss_scale, loss = NAN;
        e = dsim_strategy_reduce(s, ctx, DSIM_SUM, &local, &loss, 1);
        if (e == DSIM_ENOTSUP) {
            loss = NAN;
            e = DSIM_OK;
        } else if (e != DSIM_OK) {
            goto out;
        }
        train_swallowed(rp, DSIM_PHASE_REDUCE_LOSS, gs);
        int64_t t1 = dsim_rt_now(job->rt);
        uint64_t cks = dsim_params_checksum(ctx->params, P);
        size_t k = (size_t)(gs - job->first_step);
        if (k == 0) {
            dsim_train_replica_end *re = &job->res->replicas[rp->index];
            re->t_first_step = t1;
            /* Every pair its first step's collectives use is connected by
             * now: the connection set-up phase of its cold start. */
            dsim_ep_conn_stats cs;
            dsim_ep_get_conn_stats(ctx->ep, &cs);
            re->conn_count = cs.connections;
            re->conn_slowest_peer = cs.slowest_peer;
            re->conn_modelled = cs.modelled;
            re->conn_max_ns = cs.max_ns;
            re->conn_total_ns = cs.total_ns;
        }
        res->checksum[k * (size_t)N + (size_t)rp->index] = cks;
        job->res->replicas[rp->index].steps_done = k + 1;
        res->local_loss[k * (size_t)N + (size_t)rp->index] = local;
        res->examples[k * (size_t)N + (size_t)rp->index] = b->n;
        res->step_ns[k * (size_t)N + (size_t)rp->index] = t1 - t0;
        res->comm_ns[k * (size_t)N + (size_t)rp->index] = t1 - tc;
        if (rp->index == 0) {
            res->loss[k] = loss;
            if (res->trace)
                memcpy(res->trace + k * P, ctx->params, P * sizeof(float));
        }
        train_observe(rp, &st, b, local, loss, cks, t0, tc, t1, -1);
        uint64_t done = gs + 1;
        bool stop_here = false;
        if (job->preempt_armed) {
            /* Every replica runs the same steps, so a MAX of "I have a
             * notice" at every boundary makes them all see the first notice
             * at the same boundary: there they fix the step to stop at. */
            if (stop_at == UINT64_MAX && done < job->end_step) {
                int64_t mine = train_preempt_noticed(rp, done) ? 1 : 0, any = 0;
                if ((e = dsim_allreduce(job->ctl[rp->index], &mine, &any, 1, DSIM_I64, DSIM_MAX)) !=
                    DSIM_OK)
                    goto out;
                if (any) {
                    stop_at = done + cfg->preempt_grace_steps;
                    if (rp->index == job->chief)
                        dsim_info("train: preemption notice at global step %llu; stopping after "
                                  "step %llu with a checkpoint",
                                  (unsigned long long)done, (unsigned long long)stop_at);
                }
            }
            stop_here = done == stop_at && done < job->end_step;
        }
        if ((cfg->checkpoint_every && done % cfg->checkpoint_every == 0) || stop_here) {
            /* the checkpoint's own global step (the steps it holds), as
             * its file, the restore and every message name it */
            TRAIN_ENTER(rp, DSIM_PHASE_CHECKPOINT, done);
            if ((e = dsim_strategy_save(s, ctx, &save)) != DSIM_OK)
                goto out;
            if (chief && (e = train_write_checkpoint(rp, &save, &st, done)) != DSIM_OK)
                goto out;
        }
        if (stop_here) {
            rp->preempted_at = done;
            break;
        }
    }
    TRAIN_ENTER(rp, DSIM_PHASE_FINISH, rp->preempted_at ? rp->preempted_at : job->end_step);
    /* A lost replica's steps, when the strategy re-runs them (asynchronous
     * parameter servers); a preempted job stops everywhere instead. */
    for (int lost = 0; !rp->preempted_at && lost >= 0;) {
        uint64_t from = 0;
        if ((e = dsim_strategy_lost_work(s, ctx, &lost, &from)) != DSIM_OK)
            goto out;
        if (lost >= 0 && (e = train_rerun(rp, lost, from, x, y, grad, maxb)) != DSIM_OK)
            goto out;
        if (lost >= 0)
            TRAIN_ENTER(rp, DSIM_PHASE_FINISH, job->end_step);
    }
    if ((e = dsim_strategy_finish(s, ctx)) != DSIM_OK)
        goto out;
    memcpy(rp->final, ctx->params, P * sizeof(float));
out:
    dsim_input_destroy(in);
    free(x);
    free(y);
    free(grad);
    free(save.params);
    free(save.optim_state);
    return e;
}

static void train_job_unref(train_job *job);

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

static void train_replica_main(void *arg)
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

static void train_handler_main(void *arg)
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

/* ---- where a worker is ---- */

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

int dsim_train_stuck_describe(const dsim_train_stuck *s, char *buf, size_t cap)
{
    if (!s)
        return snprintf(buf, cap, "(none)");
    const dsim_train_where *w = &s->where;
    char coll[96] = "";
    if (w->server < 0 && s->collective)
        snprintf(coll, sizeof coll, " (last collective: %s, call %llu)", s->collective,
                 (unsigned long long)s->collective_calls);
    else if (w->server < 0)
        snprintf(coll, sizeof coll, " (before its first collective)");
    char cb[48] = "";
    if (s->callback)
        snprintf(cb, sizeof cb, ", inside %s", s->callback);
    if (w->server >= 0)
        return snprintf(buf, cap,
                        "parameter server %d's handler for replica %d (replica %d in phase %s at "
                        "global step %llu)%s",
                        w->server, w->replica, w->replica, dsim_phase_name(w->phase),
                        (unsigned long long)w->global_step, cb);
    return snprintf(buf, cap, "replica %d in phase %s at global step %llu%s%s", w->replica,
                    dsim_phase_name(w->phase), (unsigned long long)w->global_step, coll, cb);
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
    if (cfg->hooks && cfg->hooks->size != sizeof(dsim_train_hooks))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: hooks.size is %zu; set it to sizeof(dsim_train_hooks) (%zu)",
                        cfg->hooks->size, sizeof(dsim_train_hooks));
    return DSIM_OK;
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
            else if (ck->optim_kind != su->optim.kind || ck->optim_state_len != su->optim_state_len)
                bad = "it was written with another optimizer";
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
    res->params = calloc(P, sizeof(float));
    res->loss = calloc(steps ? steps : 1, sizeof(double));
    res->local_loss = calloc(steps * N + 1, sizeof(double));
    res->checksum = calloc(steps * N + 1, sizeof(uint64_t));
    res->examples = calloc(steps * N + 1, sizeof(uint64_t));
    res->step_ns = calloc(steps * N + 1, sizeof(int64_t));
    res->comm_ns = calloc(steps * N + 1, sizeof(int64_t));
    res->checkpoint_writes = calloc(N, sizeof(uint64_t));
    res->replicas = calloc(N, sizeof *res->replicas);
    if (job->cfg->record_params)
        res->trace = calloc(steps * P + 1, sizeof(float));
    if (job->cfg->probe_restore && job->first_step > 0) {
        res->restored_params = calloc(P ? P : 1, sizeof(float));
        res->restored_optim_state = calloc(job->su.optim_state_len + 1, sizeof(float));
        if (!res->restored_params || !res->restored_optim_state)
            return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the restore probe");
    }
    if (!res->params || !res->loss || !res->local_loss || !res->checksum || !res->examples ||
        !res->step_ns || !res->comm_ns || !res->checkpoint_writes || !res->replicas ||
        (job->cfg->record_params && !res->trace))
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the result of %zu steps", steps);
    for (size_t k = 0; k < steps; k++)
        res->loss[k] = NAN;
    return dsim_ledger_create(job->su.ds->spec.n_examples, job->cfg->epochs, job->cfg->hosts,
                              job->cfg->devices_per_host, &res->ledger);
}

int dsim_train_runs_health_check(const dsim_train_cfg *cfg)
{
    /* a timing-only run (synthetic model) runs no health check */
    return cfg && cfg->health_interval_ns > 0 && cfg->hosts >= 2 && cfg->num_ps == 0 &&
           !(cfg->synthetic_params > 0);
}

int64_t dsim_train_detection_bound(const dsim_train_cfg *cfg)
{
    if (!cfg)
        return DSIM_NO_DEADLINE;
    if (!dsim_train_runs_health_check(cfg))
        return dsim_detection_bound_timeout(cfg->timeout_ns);
    return dsim_detection_bound(cfg->timeout_ns, cfg->health_interval_ns, cfg->health_timeout_ns,
                                cfg->health_retries);
}

/* A worker is dead once any of its replicas is: a killed replica stands for
 * its process, and the process takes its health check with it. */
static int train_health_dead(void *user)
{
    train_health *th = user;
    train_job *job = th->job;
    const dsim_train_hooks *hk = job->cfg->hooks;
    int D = job->cfg->devices_per_host;
    for (int r = th->worker * D; r < (th->worker + 1) * D; r++) {
        if (atomic_load_explicit(&job->reps[r].dead, memory_order_acquire))
            return 1;
        if (hk && hk->killed && hk->killed(job->cfg->hooks_user, r))
            return 1;
    }
    return 0;
}

/* TF starts the check once the cluster is up; here, once every replica of
 * the worker is past replica_init (the rendezvous). */
static int train_health_ready(void *user)
{
    train_health *th = user;
    train_job *job = th->job;
    int D = job->cfg->devices_per_host;
    for (int r = th->worker * D; r < (th->worker + 1) * D; r++)
        if (atomic_load_explicit(&job->reps[r].phase, memory_order_relaxed) < DSIM_PHASE_RESTORE)
            return 0;
    return 1;
}

/* One health check per worker, each on its own runtime worker (ids after the
 * replicas' and the servers'), over the worker's first replica's endpoint. */
static dsim_err train_start_health(train_job *job)
{
    const dsim_train_cfg *cfg = job->cfg;
    if (!dsim_train_runs_health_check(cfg))
        return DSIM_OK;
    int H = cfg->hosts, D = cfg->devices_per_host;
    job->health = calloc((size_t)H, sizeof *job->health);
    if (!job->health)
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for %d health checks", H);
    for (int w = 0; w < H; w++) {
        train_health *th = &job->health[w];
        th->job = job;
        th->worker = w;
        if (!train_local(job, w * D))
            continue;
        dsim_health_cfg hc = {
            .ep = job->eps[w * D],
            .worker = w,
            .num_workers = H,
            .ranks_per_worker = D,
            .interval_ns = cfg->health_interval_ns,
            .timeout_ns = cfg->health_timeout_ns,
            .retries = cfg->health_retries,
            .dead = train_health_dead,
            .ready = train_health_ready,
            .user = th,
            .task_id = job->N + job->P * job->N + w,
        };
        DSIM_CHECK(dsim_health_start(&hc, &th->h));
    }
    return DSIM_OK;
}

/* Stops and joins every health check: the job is over (or never started). */
static void train_stop_health(train_job *job)
{
    for (int w = 0; job->health && w < job->cfg->hosts; w++)
        dsim_health_stop(job->health[w].h);
    free(job->health);
    job->health = NULL;
}

/* Runtime, fabric, endpoints, communicators and contexts. */
static dsim_err train_open_world(train_job *job)
{
    const dsim_train_cfg *cfg = job->cfg;
    int N = job->N, P = job->P;
    DSIM_CHECK(dsim_rt_create_seeded(cfg->engine ? cfg->engine : "threads", cfg->seed, &job->rt));
    DSIM_CHECK(dsim_waitq_create(job->rt, &job->lock));
    dsim_fabric_cfg fc = {
        .backend = cfg->transport ? cfg->transport : "inproc",
        .nranks = N + P,
        .rt = job->rt,
        .options = cfg->transport_options,
        .filter = cfg->transport_filter,
        .filter_user = cfg->transport_filter_user,
    };
    DSIM_CHECK(dsim_fabric_open(&fc, &job->fab));
    job->eps = calloc((size_t)(N + P), sizeof *job->eps);
    job->world = calloc((size_t)N, sizeof *job->world);
    job->ctl = calloc((size_t)N, sizeof *job->ctl);
    job->reps = calloc((size_t)N, sizeof *job->reps);
    job->srvs = calloc((size_t)(P ? P : 1), sizeof *job->srvs);
    job->handlers = calloc((size_t)(P * N + 1), sizeof *job->handlers);
    if (!job->eps || !job->world || !job->ctl || !job->reps || !job->srvs || !job->handlers)
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for %d ranks", N + P);
    for (int r = 0; r < N + P; r++)
        if (train_local(job, r))
            DSIM_CHECK(dsim_ep_open(job->fab, r, &job->eps[r]));
    const struct dsim_strategy_ops *ops = job->strat->ops;
    for (int r = 0; r < N; r++) {
        if (!train_local(job, r))
            continue;
        dsim_comm_cfg cc = {
            .ep = job->eps[r],
            .size = N,
            .comm_id = DSIM_STRATEGY_COMM_WORLD,
            .timeout_ns = job->timeout_ns,
            .algo = cfg->communication,
        };
        DSIM_CHECK(dsim_comm_create(&cc, &job->world[r]));
        if (job->preempt_armed) {
            cc.comm_id = DSIM_STRATEGY_COMM_CONTROL;
            cc.algo = DSIM_ALGO_AUTO;
            DSIM_CHECK(dsim_comm_create(&cc, &job->ctl[r]));
        }
        train_replica *rp = &job->reps[r];
        rp->job = job;
        rp->index = r;
        rp->priv = train_aligned_zalloc(ops->replica_priv_size);
        rp->final = calloc(job->su.n_params, sizeof(float));
        float *params = calloc(job->su.n_params, sizeof(float));
        if ((ops->replica_priv_size && !rp->priv) || !rp->final || !params) {
            free(params);
            return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for replica %d", r);
        }
        rp->ctx = (dsim_replica_ctx){
            .shape = job->shape,
            .replica = r,
            .worker = r / cfg->devices_per_host,
            .device = r % cfg->devices_per_host,
            .rt = job->rt,
            .fabric = job->fab,
            .ep = job->eps[r],
            .world = job->world[r],
            .algo = cfg->communication,
            .server_rank0 = N,
            .timeout_ns = job->timeout_ns > 0 ? job->timeout_ns : -1,
            .model = &job->su.model,
            .optim = &job->su.optim,
            .n_params = job->su.n_params,
            .params = params,
            .global_step = job->first_step,
            .priv = rp->priv,
        };
    }
    for (int s = 0; s < P; s++) {
        train_server *ts = &job->srvs[s];
        ts->job = job;
        ts->priv = train_aligned_zalloc(ops->server_priv_size);
        if (ops->server_priv_size && !ts->priv)
            return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for parameter server %d", s);
        ts->ctx = (dsim_server_ctx){
            .shape = job->shape,
            .server = s,
            .rank = N + s,
            .rt = job->rt,
            .fabric = job->fab,
            .ep = job->eps[N + s],
            .timeout_ns = job->timeout_ns > 0 ? job->timeout_ns : -1,
            .model = &job->su.model,
            .optim = &job->su.optim,
            .n_params = job->su.n_params,
            .priv = ts->priv,
            .driver = ts,
        };
        DSIM_CHECK(dsim_waitq_create(job->rt, &ts->ctx.lock));
    }
    return train_start_health(job);
}

static void train_close_world(train_job *job)
{
    train_stop_health(job);
    for (int s = 0; job->srvs && s < job->P; s++) {
        train_server *ts = &job->srvs[s];
        if (ts->inited)
            dsim_strategy_server_fini(job->strat, &ts->ctx);
        if (ts->ctx.lock)
            dsim_waitq_destroy(ts->ctx.lock);
        free(ts->priv);
        free(ts->updates);
    }
    for (int r = 0; job->reps && r < job->N; r++) {
        free(job->reps[r].priv);
        free(job->reps[r].final);
        free(job->reps[r].ctx.params);
    }
    for (int r = 0; job->world && r < job->N; r++)
        dsim_comm_destroy(job->world[r]);
    for (int r = 0; job->ctl && r < job->N; r++)
        dsim_comm_destroy(job->ctl[r]);
    for (int r = 0; job->eps && r < job->N + job->P; r++)
        if (job->eps[r])
            dsim_ep_close(job->eps[r]);
    if (job->fab)
        dsim_fabric_close(job->fab);
    if (job->lock)
        dsim_waitq_destroy(job->lock);
    if (job->rt)
        dsim_rt_destroy(job->rt);
    free(job->eps);
    free(job->world);
    free(job->ctl);
    free(job->reps);
    free(job->srvs);
    free(job->handlers);
}

/* ---- the job's life: references, the watchdog ---- */

#define TRAIN_SEC               (1000LL * 1000 * 1000)
#define TRAIN_MIN_GRACE_NS      TRAIN_SEC
#define TRAIN_MIN_PROGRESS_NS   TRAIN_SEC
#define TRAIN_CALLBACK_DRAIN_NS TRAIN_SEC
#define TRAIN_CALLBACK_POLL_NS  (1000LL * 1000)

/* Jobs a hung dsim_train left behind, so that they stay reachable (and
 * countable) until their last worker returns. */
static pthread_mutex_t train_abandoned_mu = PTHREAD_MUTEX_INITIALIZER;
static train_job *train_abandoned;
static size_t train_n_abandoned;

size_t dsim_train_abandoned_jobs(void)
{
    pthread_mutex_lock(&train_abandoned_mu);
    size_t n = train_n_abandoned;
    pthread_mutex_unlock(&train_abandoned_mu);
    return n;
}

static void train_abandon(train_job *job)
{
    pthread_mutex_lock(&train_abandoned_mu);
    job->abandoned_next = train_abandoned;
    train_abandoned = job;
    train_n_abandoned++;
    pthread_mutex_unlock(&train_abandoned_mu);
}

static void train_job_free(train_job *job)
{
    pthread_mutex_lock(&train_abandoned_mu);
    for (train_job **pp = &train_abandoned; *pp; pp = &(*pp)->abandoned_next) {
        if (*pp == job) {
            *pp = job->abandoned_next;
            train_n_abandoned--;
            break;
        }
    }
    pthread_mutex_unlock(&train_abandoned_mu);
    train_close_world(job);
    free(job->init.params);
    free(job->init.optim_state);
    dsim_train_setup_close(&job->su);
    dsim_train_result_free(&job->resv);
    free(job->stuck);
    free(job->checkpoint_path);
    free(job);
}

static void train_job_unref(train_job *job)
{
    if (atomic_fetch_sub(&job->refs, 1) == 1)
        train_job_free(job);
}

static int64_t train_sat_add(int64_t a, int64_t b)
{
    return b > 0 && a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* How long the workers have to return once the job failed; -1: for ever. */
static int64_t train_grace_ns(const train_job *job)
{
    int64_t g = job->cfg->watchdog_grace_ns;
    if (g < 0)
        return -1;
    if (g > 0)
        return g;
    g = job->timeout_ns / 2;
    return g < TRAIN_MIN_GRACE_NS ? TRAIN_MIN_GRACE_NS : g;
}

/* How long the job may go without any phase entered; -1: no bound. */
static int64_t train_progress_ns(const train_job *job)
{
    int64_t b = job->cfg->progress_timeout_ns;
    if (b < 0)
        return -1;
    if (b > 0)
        return b;
    b = train_sat_add(job->timeout_ns, job->timeout_ns);
    /* A parameter server waits up to twice the timeout for a quiet
     * client's next request before it counts the client lost (and a
     * survivor that ran out of work waits for that, entering no phase):
     * the watchdog gives that wait a timeout more to end. */
    if (job->cfg->num_ps > 0)
        b = train_sat_add(b, job->timeout_ns);
    return b < TRAIN_MIN_PROGRESS_NS ? TRAIN_MIN_PROGRESS_NS : b;
}

/* The progress watchdog fires: the job fails as if a worker had, and is
 * aborted. Called and returns with job->lock held. */
static void train_stall(train_job *job, int64_t now, int64_t bound)
{
    job->failed = 1;
    job->failed_at = now;
    job->err = (dsim_error){.code = DSIM_ETIMEDOUT, .peer = -1, .file = __FILE__, .line = __LINE__};
    char why[96];
    if (job->cfg->progress_timeout_ns > 0)
        snprintf(why, sizeof why, "the progress timeout");
    else
        snprintf(why, sizeof why, "%s the %.3g s timeout, at least 1 s",
                 job->cfg->num_ps > 0 ? "three times" : "twice", (double)job->timeout_ns / 1e9);
    snprintf(job->err.msg, sizeof job->err.msg,
             "no replica entered a new phase or returned for %.2f s (the progress watchdog: %s); "
             "the job was aborted",
             (double)bound / 1e9, why);
    char msg[sizeof job->err.msg];
    memcpy(msg, job->err.msg, sizeof msg);
    dsim_waitq_unlock(job->lock);
    dsim_fabric_abort(job->fab, -1, msg);
    train_wake_servers(job);
    dsim_waitq_lock(job->lock);
}

static const char *train_cb_name(int cb)
{
    return cb == TRAIN_CB_HOOK ? "the phase hook" : cb == TRAIN_CB_OBSERVER ? "the observer" : NULL;
}

/* Records the workers that have not returned as stuck, and where. Called
 * with job->lock held. */
static void train_note_stuck(train_job *job)
{
    /* Only spawned workers have a task (a process runs its own ranks). */
    size_t n = 0;
    for (int r = 0; r < job->N; r++)
        n += job->reps[r].task && !job->reps[r].returned;
    for (int i = 0; i < job->P * job->N; i++)
        n += job->handlers[i].task && !job->handlers[i].returned;
    job->stuck = calloc(n ? n : 1, sizeof *job->stuck);
    job->n_stuck = 0;
    for (int r = 0; r < job->N; r++) {
        train_replica *rp = &job->reps[r];
        if (!rp->task || rp->returned)
            continue;
        rp->abandoned = true;
        if (!job->stuck)
            continue;
        dsim_train_stuck *st = &job->stuck[job->n_stuck++];
        st->where = (dsim_train_where){
            .replica = r,
            .server = -1,
            .phase = (dsim_phase)atomic_load_explicit(&rp->phase, memory_order_relaxed),
            .global_step = atomic_load_explicit(&rp->step, memory_order_relaxed),
        };
        dsim_comm_last_call(job->world[r], &st->collective, &st->collective_calls);
        st->callback = train_cb_name(atomic_load(&rp->in_cb));
    }
    for (int i = 0; i < job->P * job->N; i++) {
        train_handler *h = &job->handlers[i];
        if (!h->task || h->returned)
            continue;
        h->abandoned = true;
        if (!job->stuck)
            continue;
        train_replica *c = &job->reps[h->client];
        job->stuck[job->n_stuck++] = (dsim_train_stuck){
            .where =
                {
                    .replica = h->client,
                    .server = h->server,
                    .phase = (dsim_phase)atomic_load_explicit(&c->phase, memory_order_relaxed),
                    .global_step = atomic_load_explicit(&c->step, memory_order_relaxed),
                },
        };
    }
}

/* Waits until every worker has returned (DSIM_OK), or the watchdog gives up
 * on those that have not (DSIM_EHUNG, with job->stuck filled). */
static dsim_err train_watch(train_job *job)
{
    int64_t grace = train_grace_ns(job), bound = train_progress_ns(job);
    dsim_waitq_lock(job->lock);
    for (;;) {
        if (job->n_running == 0) {
            dsim_waitq_unlock(job->lock);
            return DSIM_OK;
        }
        int64_t now = dsim_rt_now(job->rt), deadline = DSIM_NO_DEADLINE;
        if (job->failed) {
            if (grace >= 0) {
                deadline = train_sat_add(job->failed_at, grace);
                if (now >= deadline)
                    break;
            }
        } else if (bound >= 0) {
            deadline = train_sat_add(
                atomic_load_explicit(&job->last_progress, memory_order_relaxed), bound);
            if (now >= deadline) {
                train_stall(job, now, bound);
                continue;
            }
        }
        (void)dsim_waitq_wait(job->lock, deadline);
    }
    train_note_stuck(job);
    dsim_waitq_unlock(job->lock);
    return DSIM_EHUNG;
}

/* After the watchdog gave up: no call into the caller's code from now on;
 * waits a little for those in progress. */
static void train_close_gate(train_job *job)
{
    atomic_store(&job->gate_closed, true);
    int64_t until = dsim_rt_deadline(job->rt, TRAIN_CALLBACK_DRAIN_NS);
    while (atomic_load(&job->gate_in) > 0 && dsim_rt_now(job->rt) < until)
        (void)dsim_rt_sleep_until(job->rt, dsim_rt_deadline(job->rt, TRAIN_CALLBACK_POLL_NS));
}

/* The error a hung job returns: who was left running, where, and the
 * failure that began it. */
static dsim_err train_hung_error(train_job *job)
{
    char who[384] = "";
    size_t len = 0;
    for (size_t i = 0; i < job->n_stuck && len < sizeof who - 1; i++) {
        char one[256];
        dsim_train_stuck_describe(&job->stuck[i], one, sizeof one);
        int k = snprintf(who + len, sizeof who - len, "%s%s", i ? "; " : "", one);
        len += k > 0 ? (size_t)k : 0;
    }
    int peer = job->n_stuck && job->stuck[0].where.server < 0 ? job->stuck[0].where.replica : -1;
    int64_t grace = train_grace_ns(job);
    return dsim_set_error(DSIM_EHUNG, peer, __FILE__, __LINE__,
                          "the job hung: %zu worker%s did not return within %.2f s after the job "
                          "failed and %s left running: %s. The failure: %s",
                          job->n_stuck, job->n_stuck == 1 ? "" : "s", (double)grace / 1e9,
                          job->n_stuck == 1 ? "was" : "were", who, job->err.msg);
}

/* Spawns every server worker and replica and waits for them under the
 * watchdog: joins those that returned, detaches those left running. */
static dsim_err train_run_workers(train_job *job)
{
    int N = job->N, P = job->P;
    dsim_err e = DSIM_OK;
    for (int s = 0; s < P && e == DSIM_OK; s++) {
        if (!train_local(job, N + s))
            continue;
        e = dsim_strategy_server_init(job->strat, &job->srvs[s].ctx);
        job->srvs[s].inited = 1;
    }
    job->res->t_start = dsim_rt_now(job->rt);
    atomic_store(&job->last_progress, job->res->t_start);
    for (int s = 0; s < P && e == DSIM_OK; s++) {
        for (int c = 0; c < N && e == DSIM_OK; c++) {
            train_handler *h = &job->handlers[s * N + c];
            *h = (train_handler){.job = job, .server = s, .client = c};
            if (!train_local(job, N + s))
                continue;
            dsim_waitq_lock(job->lock);
            job->n_running++;
            dsim_waitq_unlock(job->lock);
            atomic_fetch_add(&job->refs, 1);
            e = dsim_rt_spawn(job->rt, N + s * N + c, train_handler_main, h, &h->task);
            if (e == DSIM_OK) {
                job->spawned_h++;
            } else {
                atomic_fetch_sub(&job->refs, 1);
                dsim_waitq_lock(job->lock);
                job->n_running--;
                dsim_waitq_unlock(job->lock);
            }
        }
    }
    for (int r = 0; r < N && e == DSIM_OK; r++) {
        if (!train_local(job, r))
            continue;
        dsim_waitq_lock(job->lock);
        job->n_running++;
        dsim_waitq_unlock(job->lock);
        atomic_fetch_add(&job->refs, 1);
        e = dsim_rt_spawn(job->rt, r, train_replica_main, &job->reps[r], &job->reps[r].task);
        if (e == DSIM_OK) {
            job->spawned_r++;
        } else {
            atomic_fetch_sub(&job->refs, 1);
            dsim_waitq_lock(job->lock);
            job->n_running--;
            dsim_waitq_unlock(job->lock);
        }
    }
    if (e != DSIM_OK) {
        /* Those already running must not wait for the ones that never
         * started; the grace applies to them from now. */
        dsim_error saved;
        dsim_error_copy(&saved);
        dsim_waitq_lock(job->lock);
        if (!job->failed) {
            job->failed = 1;
            job->failed_at = dsim_rt_now(job->rt);
            job->err = saved;
        }
        dsim_waitq_unlock(job->lock);
        dsim_fabric_abort(job->fab, -1, "the job could not start all its workers");
        train_wake_servers(job);
        dsim_error_restore(&saved);
    }
    dsim_err w = train_watch(job);
    if (w != DSIM_OK)
        train_close_gate(job);
    for (int r = 0; r < N; r++) {
        train_replica *rp = &job->reps[r];
        if (!rp->task)
            continue; /* another process's, or never started */
        if (!rp->abandoned || dsim_rt_detach(job->rt, rp->task) != DSIM_OK)
            dsim_rt_join(job->rt, rp->task);
    }
    for (int i = 0; i < P * N; i++) {
        train_handler *h = &job->handlers[i];
        if (!h->task)
            continue;
        if (!h->abandoned || dsim_rt_detach(job->rt, h->task) != DSIM_OK)
            dsim_rt_join(job->rt, h->task);
    }
    if (w != DSIM_OK)
        return train_hung_error(job);
    return e;
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
    res->final_loss = any ? dsim_train_mean_loss(&job->su, res->params) : NAN;
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
        d->rank = r;
        d->size = job->N;
        d->comm_id = DSIM_STRATEGY_COMM_WORLD;
        if (!job->world[r])
            continue;
        if (job->reps && job->reps[r].abandoned) {
            dsim_comm_last_call(job->world[r], NULL, &d->calls);
            continue;
        }
        (void)dsim_comm_flight_dump(job->world[r], d);
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
    res->step_ns = NULL;
    res->comm_ns = NULL;
    res->trace = NULL;
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
    res->shard_applied = job->su.applied;
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
    train_hand_over(job, out, hung);
    if (hung)
        train_abandon(job);
    train_job_unref(job);
    if (e != DSIM_OK)
        dsim_error_copy(&out->error);
    return e;
}

void dsim_train_result_free(dsim_train_result *res)
{
    if (!res)
        return;
    free(res->params);
    free(res->loss);
    free(res->local_loss);
    free(res->checksum);
    free(res->examples);
    free(res->step_ns);
    free(res->comm_ns);
    free(res->trace);
    free(res->initial_params);
    free(res->updates);
    free(res->checkpoint_writes);
    free(res->replicas);
    free(res->optim_state);
    free(res->restored_params);
    free(res->restored_optim_state);
    for (int r = 0; res->flight && r < res->n_flight; r++)
        dsim_fr_dump_free(&res->flight[r]);
    free(res->flight);
    free(res->stuck);
    dsim_ledger_destroy(res->ledger);
    memset(res, 0, sizeof *res);
}
