/* The world of a dsim_train job: the runtime, the fabric, every local
 * rank's endpoint and communicators, the replicas' and servers' contexts,
 * and one health check per worker (dsim/health.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "train_int.h"

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
dsim_err train_open_world(train_job *job)
{
    const dsim_train_cfg *cfg = job->cfg;
    int N = job->N, P = job->P;
    /* the replicas and the servers' handlers are the job's workers (ids 0 ..
     * N + P * N - 1): where they fill the CPUs, each binds to one (dsim_rt_bind_worker) */
    job->host_workers_prev = dsim_rt_host_workers();
    job->host_workers_set = 1;
    dsim_rt_set_host_workers(N + P * N);
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
    /* On a TPU slice the world communicator knows the replicas' torus. */
    dsim_comm_cfg torus = {0};
    DSIM_CHECK(dsim_train_torus(cfg, &torus, &job->torus_rank));
    for (int r = 0; r < N; r++) {
        if (!train_local(job, r))
            continue;
        dsim_comm_cfg cc = torus;
        cc.ep = job->eps[r];
        cc.size = N;
        cc.comm_id = DSIM_STRATEGY_COMM_WORLD;
        cc.timeout_ns = job->timeout_ns;
        cc.algo = cfg->communication;
        cc.local_size = cfg->devices_per_host;
        DSIM_CHECK(dsim_comm_create(&cc, &job->world[r]));
        dsim_comm_set_decide(job->world[r], cfg->decide, cfg->decide_user);
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
            .precision =
                cfg->precision == DSIM_POLICY_DEFAULT ? DSIM_POLICY_FLOAT32 : cfg->precision,
            .gradient_dtype = cfg->gradient_dtype,
        };
        dsim_loss_scale_init(&rp->ctx.loss_scale, rp->ctx.precision);
        if (job->has_ls && rp->ctx.loss_scale.dynamic) {
            /* resumed: where the checkpoint's job had it */
            rp->ctx.loss_scale.scale = job->ls_scale;
            rp->ctx.loss_scale.counter = job->ls_counter;
        }
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

/* A job that ended well leaves nothing unreceived but the health check's
 * last pings and answers. Anything else a rank was sent and never received
 * (a strategy that sends more than its peers receive, or a frame no rank
 * asked for: a communicator or tag nothing here uses, from a peer or from
 * outside the job) is logged as it is dropped. A job that failed leaves
 * frames behind as a matter of course: nothing is said then. */
#define TRAIN_UNRECV_SHOW 4

static void train_report_unreceived(train_job *job)
{
    if (!job->fab || job->failed || dsim_fabric_aborted(job->fab))
        return;
    dsim_unreceived u[TRAIN_UNRECV_SHOW];
    static const uint32_t health[] = {DSIM_HEALTH_COMM_PING, DSIM_HEALTH_COMM_PONG};
    for (int r = 0; job->eps && r < job->N + job->P; r++) {
        if (!job->eps[r])
            continue;
        uint64_t total = dsim_ep_unreceived(job->eps[r], health, 2, u, TRAIN_UNRECV_SHOW);
        if (total == 0)
            continue;
        char what[640] = "";
        size_t at = 0;
        uint64_t told = 0;
        for (size_t i = 0; i < TRAIN_UNRECV_SHOW && u[i].count; i++) {
            told += u[i].count;
            if (at < sizeof what)
                at += (size_t)snprintf(what + at, sizeof what - at,
                                       "%s%" PRIu64 " from rank %d on communicator %" PRIu32
                                       " (first tag %" PRIu32 ", %" PRIu64 " bytes)",
                                       i ? "; " : "", u[i].count, u[i].src, u[i].comm_id, u[i].tag,
                                       u[i].bytes);
        }
        char more[48] = "";
        if (total > told)
            snprintf(more, sizeof more, "; %" PRIu64 " more", total - told);
        dsim_warn("rank %d ended with %" PRIu64 " message(s) that nothing received, dropped: %s%s; "
                  "a peer sent what no receive asked for (a strategy that sends more than its "
                  "peers receive, or frames on a communicator or tag that nothing in this job "
                  "uses)",
                  r, total, what, more);
    }
}

void train_close_world(train_job *job)
{
    if (job->host_workers_set)
        dsim_rt_set_host_workers(job->host_workers_prev);
    job->host_workers_set = 0;
    train_stop_health(job);
    train_report_unreceived(job);
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
    free(job->torus_rank);
    job->torus_rank = NULL;
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
