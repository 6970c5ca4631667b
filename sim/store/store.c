/* The results store: a bounded queue in front of one writer thread that owns
 * the SQLite connection.
 *
 * Callers copy a record into the ring under the mutex and return; the writer
 * takes everything queued (up to STORE_BATCH_MAX records) and commits it in
 * one transaction, so the cost of a commit is shared by all the rows that
 * arrived while the previous one was being written. Each record gets a
 * sequence number at enqueue; done_seq is the highest one the writer has
 * finished with, which is all flush needs to wait on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <sqlite3.h>

#include "dsim/log.h"
#include "dsim_config.h"
#include "store.h"
#include "store_int.h"

int64_t store_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
/* ---- the callers' side ------------------------------------------------- */

/* Re-raises the writer's failure on the calling thread. Lock held. */
dsim_err store_report_locked(dsim_store *st)
{
    char msg[sizeof st->fail_msg];
    memcpy(msg, st->fail_msg, sizeof msg);
    return DSIM_ERR(st->fail_code, -1, "%s", msg);
}

static bool store_active_locked(const dsim_store *st, dsim_run_id run)
{
    for (size_t i = 0; i < st->nactive; i++)
        if (st->active[i] == run)
            return true;
    return false;
}

/* Queues rec (taking its strings) and returns its sequence number in *seq.
 * check_run: refuse a run not begun here or already ended. */
static dsim_err store_push(dsim_store *st, store_rec *rec, bool check_run, uint64_t *seq)
{
    dsim_err e = DSIM_OK;
    pthread_mutex_lock(&st->mu);
    if (check_run && !store_active_locked(st, rec->run)) {
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "results database %s: run %lld is not open on this store (begin it with "
                     "dsim_store_begin_run; after dsim_store_end_run it takes no more records)",
                     st->path, (long long)rec->run);
        goto out;
    }
    while (st->count == DSIM_STORE_QUEUE_CAP && st->fail_code == DSIM_OK)
        pthread_cond_wait(&st->not_full, &st->mu);
    if (st->fail_code != DSIM_OK) {
        e = store_report_locked(st);
        goto out;
    }
    rec->seq = ++st->enq_seq;
    st->ring[(st->head + st->count) % DSIM_STORE_QUEUE_CAP] = *rec;
    /* The first record wakes a writer asleep on the empty queue; it then
     * gathers for up to STORE_IDLE_MS unless a batch's worth comes first. */
    st->count++;
    if ((st->count == 1 && st->writer_state == STORE_W_ASLEEP) ||
        (st->count == STORE_WAKE_AT && st->writer_state == STORE_W_GATHERING))
        pthread_cond_signal(&st->not_empty);
    if (seq)
        *seq = rec->seq;
out:
    pthread_mutex_unlock(&st->mu);
    if (e != DSIM_OK)
        store_rec_free(rec);
    return e;
}

static dsim_err store_wait(dsim_store *st, uint64_t seq)
{
    dsim_err e = DSIM_OK;
    pthread_mutex_lock(&st->mu);
    if (st->done_seq < seq) {
        if (seq > st->flush_to)
            st->flush_to = seq;
        if (st->writer_state != STORE_W_BUSY)
            pthread_cond_signal(&st->not_empty);
    }
    while (st->done_seq < seq)
        pthread_cond_wait(&st->done, &st->mu);
    if (st->fail_code != DSIM_OK)
        e = store_report_locked(st);
    pthread_mutex_unlock(&st->mu);
    return e;
}

dsim_err dsim_store_flush(dsim_store *st)
{
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_flush: store is NULL");
    pthread_mutex_lock(&st->mu);
    uint64_t seq = st->enq_seq;
    pthread_mutex_unlock(&st->mu);
    return store_wait(st, seq);
}

const char *dsim_store_path(const dsim_store *st)
{
    return st ? st->path : NULL;
}

/* strdup that keeps NULL; *oom set when a copy fails. */
static char *store_dup(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

static dsim_err store_need(const dsim_store *st, const char *fn, const char *what, const char *v)
{
    if (!v || !*v)
        return DSIM_ERR(DSIM_EINVAL, -1, "results database %s: %s needs a non-empty %s", st->path,
                        fn, what);
    return DSIM_OK;
}

static dsim_err store_push_checked(dsim_store *st, store_rec *rec, bool oom)
{
    if (oom) {
        store_rec_free(rec);
        return DSIM_ERR(DSIM_ENOMEM, -1, "results database %s: out of memory copying a record",
                        st->path);
    }
    return store_push(st, rec, true, NULL);
}

dsim_err dsim_store_begin_run(dsim_store *st, const dsim_run_info *info, dsim_run_id *out)
{
    if (!st || !info || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_begin_run: store, info and out are required");
    DSIM_CHECK(store_need(st, "dsim_store_begin_run", "scenario name", info->scenario));
    DSIM_CHECK(store_need(st, "dsim_store_begin_run", "engine", info->engine));
    if (info->config_json) {
        json_error_t jerr;
        json_t *j = json_loads(info->config_json, JSON_DECODE_ANY, &jerr);
        if (!j)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "results database %s: run config is not valid JSON: %s at line %d "
                            "column %d",
                            st->path, jerr.text, jerr.line, jerr.column);
        json_decref(j);
    }
    bool oom = false;
    dsim_run_id id = -1;
    store_rec r = {.kind = REC_BEGIN};
    r.u.begin.scenario = store_dup(info->scenario, &oom);
    r.u.begin.text = store_dup(info->scenario_text, &oom);
    r.u.begin.engine = store_dup(info->engine, &oom);
    r.u.begin.strategy = store_dup(info->strategy, &oom);
    r.u.begin.version = store_dup(info->dsim_version ? info->dsim_version : DSIM_VERSION, &oom);
    r.u.begin.config = store_dup(info->config_json, &oom);
    r.u.begin.seed = info->seed;
    r.u.begin.started = info->started_ns ? info->started_ns : store_wall_ns();
    r.u.begin.reply = &id;
    if (oom) {
        store_rec_free(&r);
        return DSIM_ERR(DSIM_ENOMEM, -1, "results database %s: out of memory copying the run",
                        st->path);
    }
    /* Room for the id before the run exists, so that remembering it cannot
     * fail after the row is committed; concurrent begins each hold a slot. */
    pthread_mutex_lock(&st->mu);
    /* nactive <= nunsettled: one capacity for both lists. */
    if (st->nunsettled + st->reserved == st->active_cap) {
        size_t cap = st->active_cap ? 2 * st->active_cap : 4;
        dsim_run_id *a = realloc(st->active, cap * sizeof *a);
        if (a)
            st->active = a;
        dsim_run_id *u = a ? realloc(st->unsettled, cap * sizeof *u) : NULL;
        if (!u) {
            pthread_mutex_unlock(&st->mu);
            store_rec_free(&r);
            return DSIM_ERR(DSIM_ENOMEM, -1, "results database %s: out of memory", st->path);
        }
        st->unsettled = u;
        st->active_cap = cap;
    }
    st->reserved++;
    pthread_mutex_unlock(&st->mu);
    uint64_t seq = 0;
    dsim_err e = store_push(st, &r, false, &seq);
    if (e == DSIM_OK)
        e = store_wait(st, seq);
    pthread_mutex_lock(&st->mu);
    st->reserved--;
    if (e == DSIM_OK)
        st->active[st->nactive++] = id;
    /* A later batch may have failed after this one committed the row: the
     * call fails (the store has), but close still settles the run. */
    if (e == DSIM_OK || (seq != 0 && seq <= st->ok_seq))
        st->unsettled[st->nunsettled++] = id;
    pthread_mutex_unlock(&st->mu);
    if (e != DSIM_OK)
        return e;
    *out = id;
    return DSIM_OK;
}

dsim_err dsim_store_end_run(dsim_store *st, dsim_run_id run, dsim_run_status status,
                            const char *trace_hash, int64_t ended_ns)
{
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_end_run: store is NULL");
    if ((unsigned)status > DSIM_RUN_CRASHED)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: run status %d is not passed, failed, error, hung "
                        "or crashed",
                        st->path, (int)status);
    bool oom = false;
    store_rec r = {.kind = REC_END, .run = run};
    r.u.end.status = (int)status;
    r.u.end.trace_hash = store_dup(trace_hash, &oom);
    r.u.end.ended = ended_ns ? ended_ns : store_wall_ns();
    if (oom)
        return store_push_checked(st, &r, true);
    /* Retire the id and queue the update under one lock, so that no record
     * for the run can be queued after its end. */
    dsim_err e = DSIM_OK;
    uint64_t seq = 0;
    pthread_mutex_lock(&st->mu);
    size_t i = 0;
    while (i < st->nactive && st->active[i] != run)
        i++;
    if (i == st->nactive) {
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "results database %s: run %lld is not open on this store (never begun "
                     "here, or already ended)",
                     st->path, (long long)run);
    } else {
        st->active[i] = st->active[--st->nactive];
    }
    pthread_mutex_unlock(&st->mu);
    if (e != DSIM_OK) {
        store_rec_free(&r);
        return e;
    }
    DSIM_CHECK(store_push(st, &r, false, &seq));
    e = store_wait(st, seq);
    pthread_mutex_lock(&st->mu);
    if (seq <= st->ok_seq) {
        for (i = 0; i < st->nunsettled && st->unsettled[i] != run; i++)
            ;
        if (i < st->nunsettled)
            st->unsettled[i] = st->unsettled[--st->nunsettled];
    }
    pthread_mutex_unlock(&st->mu);
    return e;
}

size_t dsim_store_unsettled(dsim_store *st, dsim_run_id *ids, size_t cap)
{
    if (!st)
        return 0;
    pthread_mutex_lock(&st->mu);
    size_t n = st->nunsettled;
    for (size_t i = 0; i < n && i < cap; i++)
        ids[i] = st->unsettled[i];
    pthread_mutex_unlock(&st->mu);
    return n;
}

dsim_err dsim_store_replica(dsim_store *st, dsim_run_id run, int replica, int worker,
                            const char *device, const char *host)
{
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_replica: store is NULL");
    if (replica < 0 || worker < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: replica %d / worker %d: both must be >= 0", st->path,
                        replica, worker);
    bool oom = false;
    store_rec r = {.kind = REC_REPLICA, .run = run};
    r.u.replica.replica = replica;
    r.u.replica.worker = worker;
    r.u.replica.device = store_dup(device, &oom);
    r.u.replica.host = store_dup(host, &oom);
    return store_push_checked(st, &r, oom);
}

dsim_err dsim_store_step(dsim_store *st, dsim_run_id run, const dsim_step_rec *rec)
{
    if (!st || !rec)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_step: store and record are required");
    if (rec->replica < 0 || rec->step < 0 || rec->epoch < 0 || rec->examples < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: step record has replica %d, epoch %d, step %lld, "
                        "examples %lld; none may be negative",
                        st->path, rec->replica, rec->epoch, (long long)rec->step,
                        (long long)rec->examples);
    store_rec r = {.kind = REC_STEP, .run = run};
    r.u.step = *rec;
    return store_push(st, &r, true, NULL);
}

dsim_err dsim_store_collective(dsim_store *st, dsim_run_id run, const dsim_coll_rec *rec)
{
    if (!st || !rec)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_collective: store and record are required");
    DSIM_CHECK(store_need(st, "dsim_store_collective", "op", rec->op));
    if (rec->replica < 0 || (unsigned)rec->status >= DSIM_ERR_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: collective record has replica %d and status %d; "
                        "replica must be >= 0 and status a dsim_err",
                        st->path, rec->replica, (int)rec->status);
    bool oom = false;
    store_rec r = {.kind = REC_COLL, .run = run};
    r.u.coll.replica = rec->replica;
    r.u.coll.op = store_dup(rec->op, &oom);
    r.u.coll.algorithm = store_dup(rec->algorithm, &oom);
    r.u.coll.bytes = rec->bytes;
    r.u.coll.t0 = rec->t_start_ns;
    r.u.coll.t1 = rec->t_end_ns;
    r.u.coll.status = (int)rec->status;
    return store_push_checked(st, &r, oom);
}

dsim_err dsim_store_event(dsim_store *st, dsim_run_id run, int replica, int64_t t_ns,
                          dsim_event_kind kind, const char *detail)
{
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_event: store is NULL");
    if ((unsigned)kind > DSIM_EVENT_PHASE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: event kind %d is not one of fault, error, restart, "
                        "checkpoint, phase",
                        st->path, (int)kind);
    bool oom = false;
    store_rec r = {.kind = REC_EVENT, .run = run};
    r.u.event.replica = replica < 0 ? -1 : replica;
    r.u.event.kind = (int)kind;
    r.u.event.t = t_ns;
    r.u.event.detail = store_dup(detail, &oom);
    return store_push_checked(st, &r, oom);
}

dsim_err dsim_store_check(dsim_store *st, dsim_run_id run, const char *name, bool passed,
                          double measured, double expected, const char *message)
{
    return dsim_store_check_row(st, run, name, passed, measured, expected, message, false);
}

dsim_err dsim_store_check_row(dsim_store *st, dsim_run_id run, const char *name, bool passed,
                              double measured, double expected, const char *message,
                              bool by_default)
{
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_check: store is NULL");
    DSIM_CHECK(store_need(st, "dsim_store_check", "check name", name));
    bool oom = false;
    store_rec r = {.kind = REC_CHECK, .run = run};
    r.u.check.name = store_dup(name, &oom);
    r.u.check.message = store_dup(message, &oom);
    r.u.check.passed = passed ? 1 : 0;
    r.u.check.by_default = by_default ? 1 : 0;
    r.u.check.measured = measured;
    r.u.check.expected = expected;
    return store_push_checked(st, &r, oom);
}

dsim_err dsim_store_metric(dsim_store *st, dsim_run_id run, const char *name, double value,
                           const char *unit, int replica)
{
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_metric: store is NULL");
    DSIM_CHECK(store_need(st, "dsim_store_metric", "metric name", name));
    bool oom = false;
    store_rec r = {.kind = REC_METRIC, .run = run};
    r.u.metric.name = store_dup(name, &oom);
    r.u.metric.unit = store_dup(unit, &oom);
    r.u.metric.value = value;
    r.u.metric.replica = replica < 0 ? -1 : replica;
    return store_push_checked(st, &r, oom);
}

dsim_err dsim_store_reference_loss(dsim_store *st, dsim_run_id run, uint64_t step, double loss)
{
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_reference_loss: store is NULL");
    if (step > (uint64_t)INT64_MAX)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: reference step %llu does not fit a row", st->path,
                        (unsigned long long)step);
    store_rec r = {.kind = REC_REFLOSS, .run = run};
    r.u.refloss.step = step;
    r.u.refloss.loss = loss;
    return store_push_checked(st, &r, false);
}

dsim_err dsim_store_params(dsim_store *st, dsim_run_id run, uint64_t step, const float *p, size_t n)
{
    if (!st || (!p && n))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_params: store and parameters are required");
    if (step > (uint64_t)INT64_MAX || n > ((size_t)1 << 28))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: %zu parameters at step %llu do not fit a row",
                        st->path, n, (unsigned long long)step);
    store_rec r = {.kind = REC_PARAMS, .run = run};
    r.u.params.step = step;
    r.u.params.n = n;
    r.u.params.data = malloc(n ? n * sizeof(float) : 1);
    if (r.u.params.data && n)
        memcpy(r.u.params.data, p, n * sizeof(float));
    return store_push_checked(st, &r, r.u.params.data == NULL);
}

dsim_err dsim_store_message(dsim_store *st, dsim_run_id run, const dsim_msg_row *m)
{
    if (!st || !m)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_message: store and message are required");
    if (m->src < 0 || m->dst < 0 || m->attempt < 0 || m->seq > (uint64_t)INT64_MAX ||
        m->bytes > (uint64_t)INT64_MAX)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: message %d -> %d (attempt %d) has a negative rank "
                        "or attempt, or a sequence number or size beyond a row",
                        st->path, m->src, m->dst, m->attempt);
    store_rec r = {.kind = REC_MSG, .run = run};
    r.u.msg = *m;
    return store_push_checked(st, &r, false);
}

dsim_err dsim_store_flight(dsim_store *st, dsim_run_id run, const dsim_flight_rec *rec)
{
    if (!st || !rec)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_flight: store and record are required");
    DSIM_CHECK(store_need(st, "dsim_store_flight", "profiling_name", rec->profiling_name));
    DSIM_CHECK(store_need(st, "dsim_store_flight", "state", rec->state));
    if (rec->replica < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s: flight record has replica %d; it must be >= 0",
                        st->path, rec->replica);
    bool oom = false;
    store_rec r = {.kind = REC_FLIGHT, .run = run};
    dsim_flight_rec *f = &r.u.flight.f;
    *f = *rec;
    f->profiling_name = store_dup(rec->profiling_name, &oom);
    f->input_dtype = store_dup(rec->input_dtype, &oom);
    f->reduce_op = store_dup(rec->reduce_op, &oom);
    f->algorithm = store_dup(rec->algorithm, &oom);
    f->state = store_dup(rec->state, &oom);
    f->error = store_dup(rec->error, &oom);
    return store_push_checked(st, &r, oom);
}

uint64_t dsim_store_batches(dsim_store *st)
{
    if (!st)
        return 0;
    pthread_mutex_lock(&st->mu);
    uint64_t n = st->batches;
    pthread_mutex_unlock(&st->mu);
    return n;
}
