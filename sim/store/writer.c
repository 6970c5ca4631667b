/* The store's writer thread: it owns the SQLite connection, takes what the
 * callers queued and commits it in one transaction per batch; the first
 * failure is kept and reported to the callers (store.c). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "dsim/fiu.h"
#include "dsim/log.h"
#include "dsim_config.h"
#include "store.h"
#include "store_int.h"

#if DSIM_HAVE_FIU
#include <fiu-local.h>
#else
#define fiu_do_on(name, action)
#endif

static const char *const store_status_names[] = {"passed", "failed", "error", "hung", "crashed"};

const char *dsim_run_status_name(dsim_run_status s)
{
    return (unsigned)s <= DSIM_RUN_CRASHED ? store_status_names[s] : "unknown";
}

static const char *const store_event_names[] = {"fault", "error", "restart", "checkpoint", "phase"};

/* ---- the writer -------------------------------------------------------- */

static void store_bind_text(sqlite3_stmt *s, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, i);
}

static void store_bind_real(sqlite3_stmt *s, int i, double v)
{
    if (isnan(v))
        sqlite3_bind_null(s, i);
    else
        sqlite3_bind_double(s, i, v);
}

static void store_bind_replica(sqlite3_stmt *s, int i, int replica)
{
    if (replica < 0)
        sqlite3_bind_null(s, i);
    else
        sqlite3_bind_int(s, i, replica);
}

/* NULL for a value that is not there (< 0). */
static void store_bind_nonneg(sqlite3_stmt *s, int i, int64_t v)
{
    if (v < 0)
        sqlite3_bind_null(s, i);
    else
        sqlite3_bind_int64(s, i, v);
}

int store_exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* libfiu points (dsim/fiu.h): dsim/store/open before each write that
 * opening makes (WAL mode, migrations, marking runs unfinished), and
 * dsim/store/write before each statement the writer (and close) runs:
 * BEGIN, every row, COMMIT. One that fires stands for SQLite returning its
 * failinfo as the result code (default SQLITE_IOERR_WRITE, "disk I/O
 * error"), so the failure takes the path of a real one. Called only by the
 * connection's owner. */
static int store_fiu(dsim_store *st, const char *name)
{
#if DSIM_HAVE_FIU && defined(FIU_ENABLE)
    if (dsim_fiu_armed() && fiu_fail(name)) {
        st->fiu_rc = fiu_failinfo() ? (int)(intptr_t)fiu_failinfo() : SQLITE_IOERR_WRITE;
        return st->fiu_rc;
    }
#else
    (void)name;
#endif
    st->fiu_rc = SQLITE_OK;
    return SQLITE_OK;
}

int store_exec_at(dsim_store *st, const char *point, const char *sql)
{
    int rc = store_fiu(st, point);
    return rc != SQLITE_OK ? rc : store_exec(st->db, sql);
}

int store_step_at(dsim_store *st, const char *point, sqlite3_stmt *s)
{
    int rc = store_fiu(st, point);
    return rc != SQLITE_OK ? rc : sqlite3_step(s);
}

/* The message of the last failure on the connection: an injected one's, or
 * SQLite's. */
const char *store_errmsg(const dsim_store *st)
{
    return st->fiu_rc != SQLITE_OK ? sqlite3_errstr(st->fiu_rc) : sqlite3_errmsg(st->db);
}

static int store_apply(dsim_store *st, store_rec *r)
{
    sqlite3_stmt *s = st->stmt[r->kind];
    switch (r->kind) {
    case REC_BEGIN:
        store_bind_text(s, 1, r->u.begin.scenario);
        store_bind_text(s, 2, r->u.begin.text);
        sqlite3_bind_int64(s, 3, (int64_t)r->u.begin.seed);
        store_bind_text(s, 4, r->u.begin.engine);
        store_bind_text(s, 5, r->u.begin.strategy);
        store_bind_text(s, 6, r->u.begin.version);
        store_bind_text(s, 7, r->u.begin.config);
        sqlite3_bind_int64(s, 8, r->u.begin.started);
        store_bind_text(s, 9, st->host);
        sqlite3_bind_int64(s, 10, st->pid);
        if (st->pid_start >= 0)
            sqlite3_bind_int64(s, 11, st->pid_start);
        else
            sqlite3_bind_null(s, 11);
        break;
    case REC_END:
        sqlite3_bind_text(s, 1, store_status_names[r->u.end.status], -1, SQLITE_STATIC);
        store_bind_text(s, 2, r->u.end.trace_hash);
        sqlite3_bind_int64(s, 3, r->u.end.ended);
        sqlite3_bind_int64(s, 4, r->run);
        break;
    case REC_REPLICA:
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int(s, 2, r->u.replica.replica);
        sqlite3_bind_int(s, 3, r->u.replica.worker);
        store_bind_text(s, 4, r->u.replica.device);
        store_bind_text(s, 5, r->u.replica.host);
        break;
    case REC_STEP: {
        const dsim_step_rec *p = &r->u.step;
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int(s, 2, p->replica);
        sqlite3_bind_int(s, 3, p->epoch);
        sqlite3_bind_int64(s, 4, p->step);
        store_bind_real(s, 5, p->loss);
        store_bind_real(s, 6, p->reduced_loss);
        /* SQLite integers are signed: the checksum's bits, as int64. */
        sqlite3_bind_int64(s, 7, (int64_t)p->checksum);
        sqlite3_bind_int64(s, 8, p->examples);
        sqlite3_bind_int64(s, 9, p->t_start_ns);
        sqlite3_bind_int64(s, 10, p->t_end_ns);
        break;
    }
    case REC_COLL:
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int(s, 2, r->u.coll.replica);
        store_bind_text(s, 3, r->u.coll.op);
        store_bind_text(s, 4, r->u.coll.algorithm);
        sqlite3_bind_int64(s, 5, (int64_t)r->u.coll.bytes);
        sqlite3_bind_int64(s, 6, r->u.coll.t0);
        sqlite3_bind_int64(s, 7, r->u.coll.t1);
        sqlite3_bind_int(s, 8, r->u.coll.status);
        if (r->u.coll.status != DSIM_OK)
            sqlite3_bind_text(s, 9, dsim_strerror((dsim_err)r->u.coll.status), -1, SQLITE_STATIC);
        else
            sqlite3_bind_null(s, 9);
        break;
    case REC_EVENT:
        sqlite3_bind_int64(s, 1, r->run);
        store_bind_replica(s, 2, r->u.event.replica);
        sqlite3_bind_int64(s, 3, r->u.event.t);
        sqlite3_bind_text(s, 4, store_event_names[r->u.event.kind], -1, SQLITE_STATIC);
        store_bind_text(s, 5, r->u.event.detail);
        break;
    case REC_CHECK:
        sqlite3_bind_int64(s, 1, r->run);
        store_bind_text(s, 2, r->u.check.name);
        sqlite3_bind_int(s, 3, r->u.check.passed);
        store_bind_real(s, 4, r->u.check.measured);
        store_bind_real(s, 5, r->u.check.expected);
        store_bind_text(s, 6, r->u.check.message);
        sqlite3_bind_int(s, 7, r->u.check.by_default);
        break;
    case REC_REFLOSS:
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int64(s, 2, (int64_t)r->u.refloss.step);
        store_bind_real(s, 3, r->u.refloss.loss);
        break;
    case REC_PARAMS:
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int64(s, 2, (int64_t)r->u.params.step);
        sqlite3_bind_blob64(s, 3, r->u.params.data, (sqlite3_uint64)(r->u.params.n * sizeof(float)),
                            SQLITE_STATIC);
        break;
    case REC_MSG: {
        const dsim_msg_row *m = &r->u.msg;
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int(s, 2, m->attempt);
        sqlite3_bind_int(s, 3, m->src);
        sqlite3_bind_int(s, 4, m->dst);
        sqlite3_bind_int64(s, 5, m->comm_id);
        sqlite3_bind_int64(s, 6, m->tag);
        sqlite3_bind_int64(s, 7, (int64_t)m->seq);
        sqlite3_bind_int64(s, 8, (int64_t)m->bytes);
        if (m->t_sent_ns >= 0)
            sqlite3_bind_int64(s, 9, m->t_sent_ns);
        if (m->t_recv_ns >= 0)
            sqlite3_bind_int64(s, 10, m->t_recv_ns);
        break;
    }
    case REC_METRIC:
        sqlite3_bind_int64(s, 1, r->run);
        store_bind_text(s, 2, r->u.metric.name);
        store_bind_real(s, 3, r->u.metric.value);
        store_bind_text(s, 4, r->u.metric.unit);
        store_bind_replica(s, 5, r->u.metric.replica);
        break;
    case REC_FLIGHT: {
        const dsim_flight_rec *f = &r->u.flight.f;
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int(s, 2, f->replica);
        sqlite3_bind_int64(s, 3, (int64_t)f->record_id);
        sqlite3_bind_int64(s, 4, (int64_t)f->pg_id);
        sqlite3_bind_int64(s, 5, (int64_t)f->collective_seq_id);
        store_bind_text(s, 6, f->profiling_name);
        store_bind_nonneg(s, 7, f->input_count);
        store_bind_text(s, 8, f->input_dtype);
        store_bind_text(s, 9, f->reduce_op);
        store_bind_nonneg(s, 10, f->root);
        store_bind_text(s, 11, f->algorithm);
        store_bind_text(s, 12, f->state);
        store_bind_nonneg(s, 13, f->waiting_for);
        store_bind_text(s, 14, f->error);
        sqlite3_bind_int64(s, 15, f->time_created_ns);
        store_bind_nonneg(s, 16, f->time_started_ns);
        store_bind_nonneg(s, 17, f->time_completed_ns);
        break;
    }
    default:
        return SQLITE_MISUSE;
    }
    int rc = store_step_at(st, "dsim/store/write", s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE)
        return rc;
    if (r->kind == REC_BEGIN)
        *r->u.begin.reply = sqlite3_last_insert_rowid(st->db);
    return SQLITE_OK;
}

void store_rec_free(store_rec *r)
{
    switch (r->kind) {
    case REC_BEGIN:
        free(r->u.begin.scenario);
        free(r->u.begin.text);
        free(r->u.begin.engine);
        free(r->u.begin.strategy);
        free(r->u.begin.version);
        free(r->u.begin.config);
        break;
    case REC_END:
        free(r->u.end.trace_hash);
        break;
    case REC_PARAMS:
        free(r->u.params.data);
        break;
    case REC_REPLICA:
        free(r->u.replica.device);
        free(r->u.replica.host);
        break;
    case REC_COLL:
        free(r->u.coll.op);
        free(r->u.coll.algorithm);
        break;
    case REC_EVENT:
        free(r->u.event.detail);
        break;
    case REC_CHECK:
        free(r->u.check.name);
        free(r->u.check.message);
        break;
    case REC_METRIC:
        free(r->u.metric.name);
        free(r->u.metric.unit);
        break;
    case REC_FLIGHT:
        free((char *)r->u.flight.f.profiling_name);
        free((char *)r->u.flight.f.input_dtype);
        free((char *)r->u.flight.f.reduce_op);
        free((char *)r->u.flight.f.algorithm);
        free((char *)r->u.flight.f.state);
        free((char *)r->u.flight.f.error);
        break;
    default:
        break;
    }
}

/* Called by the writer with the lock held. */
static void store_fail_locked(dsim_store *st, int rc, const char *what, size_t nrows)
{
    if (st->fail_code != DSIM_OK)
        return;
    st->fail_code = DSIM_EIO;
    snprintf(st->fail_msg, sizeof st->fail_msg,
             "results database %s: %s failed: %s (SQLite error %d); %zu queued rows and any "
             "recorded later are not saved, rows committed before are intact; check free "
             "space, permissions and other programs holding the file, or use another --db",
             st->path, what, store_errmsg(st), rc, nrows);
}

/* Writes a batch in one transaction; on failure rolls it back whole. */
static void store_commit_batch(dsim_store *st, store_rec *b, size_t n)
{
    fiu_do_on("dsim_store/readonly", store_exec(st->db, "PRAGMA query_only = ON"));
    const char *what = "starting a transaction";
    int rc = store_exec_at(st, "dsim/store/write", "BEGIN IMMEDIATE");
    for (size_t i = 0; rc == SQLITE_OK && i < n; i++) {
        rc = store_apply(st, &b[i]);
        what = "inserting a row";
    }
    if (rc == SQLITE_OK) {
        what = "committing";
        rc = store_exec_at(st, "dsim/store/write", "COMMIT");
    }
    if (rc == SQLITE_OK)
        return;
    /* Capture SQLite's message before the rollback replaces it. */
    pthread_mutex_lock(&st->mu);
    store_fail_locked(st, rc, what, n + st->count);
    pthread_mutex_unlock(&st->mu);
    if (!sqlite3_get_autocommit(st->db))
        store_exec(st->db, "ROLLBACK");
}

void *store_writer(void *arg)
{
    dsim_store *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        st->writer_state = STORE_W_ASLEEP;
        while (st->count == 0 && !st->stop)
            pthread_cond_wait(&st->not_empty, &st->mu);
        /* Records are taken when a batch's worth waits, when one is waited
         * for, at the stop, or STORE_IDLE_MS after the first came. */
        if (st->count < STORE_WAKE_AT && st->flush_to <= st->done_seq && !st->stop) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += STORE_IDLE_MS * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            st->writer_state = STORE_W_GATHERING;
            while (st->count < STORE_WAKE_AT && st->flush_to <= st->done_seq && !st->stop &&
                   pthread_cond_timedwait(&st->not_empty, &st->mu, &until) == 0)
                ;
        }
        st->writer_state = STORE_W_BUSY;
        if (st->count == 0)
            break;
        size_t n = st->count < STORE_BATCH_MAX ? st->count : STORE_BATCH_MAX;
        size_t first = n < DSIM_STORE_QUEUE_CAP - st->head ? n : DSIM_STORE_QUEUE_CAP - st->head;
        memcpy(st->batch, st->ring + st->head, first * sizeof *st->batch);
        memcpy(st->batch + first, st->ring, (n - first) * sizeof *st->batch);
        st->head = (st->head + n) % DSIM_STORE_QUEUE_CAP;
        st->count -= n;
        st->batches++;
        bool failed = st->fail_code != DSIM_OK;
        pthread_cond_broadcast(&st->not_full);
        pthread_mutex_unlock(&st->mu);

        store_gate_enter(); /* no fork() while SQLite or the allocator is ours */
        if (!failed)
            store_commit_batch(st, st->batch, n);
        uint64_t last = st->batch[n - 1].seq;
        for (size_t i = 0; i < n; i++)
            store_rec_free(&st->batch[i]);
        store_gate_leave();

        pthread_mutex_lock(&st->mu);
        if (st->fail_code != DSIM_OK)
            st->lost += n;
        else
            st->ok_seq = last;
        st->done_seq = last;
        pthread_cond_broadcast(&st->done);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}
