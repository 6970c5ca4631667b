/* The watchdog of dsim_train: the driver spawns the workers and does not
 * join them blindly. It waits on the job's lock with a deadline: the grace
 * after the job failed, or the progress bound (last phase entered +
 * progress_timeout) before it has. A stall aborts the job like a failure;
 * a grace that runs out leaves the workers still inside the strategy's code
 * running (detached) and returns DSIM_EHUNG naming where each was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "train_int.h"

#define TRAIN_SEC               (1000LL * 1000 * 1000)
#define TRAIN_MIN_GRACE_NS      TRAIN_SEC
#define TRAIN_MIN_PROGRESS_NS   TRAIN_SEC
#define TRAIN_CALLBACK_DRAIN_NS TRAIN_SEC
#define TRAIN_CALLBACK_POLL_NS  (1000LL * 1000)

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
dsim_err train_run_workers(train_job *job)
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
