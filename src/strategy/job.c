/* The job of dsim_train: failing it (the first direct cause wins, the
 * fabric is aborted), its references (the driver and each worker) and the
 * jobs a hung run left behind, the parameter servers' update records, the
 * phases' names, freeing a result, and the gradient norms of its steps (what
 * each update applied, from the optimizer's note: model/optim_int.h). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "model/optim_int.h"
#include "train_int.h"

/* Wakes every server's waiters after an abort. The abort flag is not set
 * under a server's lock, so the wake takes the lock: a waiter that tested
 * the flag just before the abort is then already asleep and gets the wake,
 * instead of sleeping through it until its deadline. */
void train_wake_servers(train_job *job)
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
void train_fail(train_job *job, const char *who, int index, int rank)
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

void train_abandon(train_job *job)
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
    free(job->grad_filled);
    free(job->checkpoint_path);
    free(job);
}

void train_job_unref(train_job *job)
{
    if (atomic_fetch_sub(&job->refs, 1) == 1)
        train_job_free(job);
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
    free(res->padded);
    free(res->step_ns);
    free(res->comm_ns);
    free(res->trace);
    free(res->trace_grad);
    free(res->trace_slots);
    free(res->update_norm);
    free(res->follow_dist);
    free(res->follow_ulps);
    free(res->follow_path);
    free(res->follow_grad_dist);
    free(res->follow_grad_ulps);
    free(res->follow_grad_norm);
    free(res->follow_grad_off);
    free(res->follow_grad_lo);
    free(res->follow_grad_hi);
    free(res->follow_grad_prev);
    free(res->follow_part);
    free(res->mp_scale);
    free(res->mp_skipped);
    free(res->var_sig);
    free(res->grad_norm);
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

double *train_grad_norms_alloc(size_t n)
{
    double *v = malloc((n ? n : 1) * sizeof(double));
    for (size_t k = 0; v && k < n; k++)
        v[k] = NAN;
    return v;
}

void train_grads_close(train_job *job)
{
    dsim_train_result *res = job->res;
    size_t P = job->su.n_params;
    bool any = false;
    for (uint64_t j = 0; res->trace_grad && j < res->trace_grad_rows; j++)
        any |= job->grad_filled[j] != 0;
    if (!any) {
        free(res->trace_grad);
        free(res->trace_slots);
        res->trace_grad = res->trace_slots = NULL;
        res->trace_grad_rows = 0;
        return;
    }
    size_t S = dsim_optim_rule_slots(&job->cfg->optim) * P; /* a row of trace_slots */
    for (uint64_t j = 0; j < res->trace_grad_rows; j++) {
        for (size_t q = 0; !job->grad_filled[j] && q < P; q++)
            res->trace_grad[j * P + q] = NAN;
        for (size_t q = 0; res->trace_slots && !job->grad_filled[j] && q < S; q++)
            res->trace_slots[j * S + q] = NAN;
    }
}

double train_grad_norm_take(size_t P)
{
    size_t n = 0;
    double v = optim_seen_take(&n);
    return n == OPTIM_SEEN_GLOBAL || n == P ? v : NAN;
}
