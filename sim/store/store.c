/* The results store: a bounded queue in front of one writer thread that owns
 * the SQLite connection.
 *
 * Callers copy a record into the ring under the mutex and return; the writer
 * takes everything queued (up to STORE_BATCH_MAX records) and commits it in
 * one transaction, so the cost of a commit is shared by all the rows that
 * arrived while the previous one was being written. Each record gets a
 * sequence number at enqueue; done_seq is the highest one the writer has
 * finished with, which is all flush needs to wait on. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
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

/* Most records one transaction holds; bounds the writer's scratch buffer and
 * how long a flush can wait behind one commit. */
#define STORE_BATCH_MAX 4096
/* How long a write waits for another program's lock before failing. */
#define STORE_BUSY_TIMEOUT_MS 10000

enum store_kind {
    REC_BEGIN,
    REC_END,
    REC_REPLICA,
    REC_STEP,
    REC_COLL,
    REC_EVENT,
    REC_CHECK,
    REC_METRIC,
    REC_FLIGHT,
    REC_REFLOSS,
    REC_MSG,
    REC_NKINDS
};

typedef struct store_rec {
    int kind;
    uint64_t seq;
    dsim_run_id run;
    union {
        struct {
            char *scenario, *text, *engine, *strategy, *version, *config;
            uint64_t seed;
            int64_t started;
            dsim_run_id *reply; /* the caller waits for this record */
        } begin;
        struct {
            int status;
            char *trace_hash;
            int64_t ended;
        } end;
        struct {
            int replica, worker;
            char *device, *host;
        } replica;
        dsim_step_rec step;
        struct {
            int replica;
            char *op, *algorithm;
            uint64_t bytes;
            int64_t t0, t1;
            int status;
        } coll;
        struct {
            int replica, kind;
            int64_t t;
            char *detail;
        } event;
        struct {
            char *name, *message;
            int passed;
            double measured, expected;
        } check;
        struct {
            char *name, *unit;
            double value;
            int replica;
        } metric;
        struct {
            dsim_flight_rec f; /* its strings owned by the record */
        } flight;
        struct {
            uint64_t step;
            double loss;
        } refloss;
        dsim_msg_row msg;
    } u;
} store_rec;

struct dsim_store {
    char *path;
    sqlite3 *db;
    sqlite3_stmt *stmt[REC_NKINDS];
    char host[256];
    long pid;
    int64_t pid_start; /* -1 where /proc is not available */

    pthread_t writer;
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full, done;
    store_rec *ring;
    size_t head, count;
    store_rec *batch; /* the writer's; filled with the lock dropped */
    uint64_t enq_seq, done_seq;
    uint64_t ok_seq; /* the last record of the last batch committed */
    bool stop;
    /* The first write failure; sticky. */
    dsim_err fail_code;
    char fail_msg[400];
    uint64_t lost; /* records discarded because of it */
    /* Runs begun on this store and not ended: the only ones it records. */
    dsim_run_id *active;
    size_t nactive, active_cap, reserved;
    /* Runs whose row this store committed and whose end it has not seen
     * committed (active ones and ends that failed): close marks those still
     * 'running' unfinished. Same capacity as active. */
    dsim_run_id *unsettled;
    size_t nunsettled;
    /* The SQLite code a libfiu point injected on the connection's owner
     * (writer, or open/close), for the message in place of sqlite3_errmsg. */
    int fiu_rc;
};

static const char *const store_insert_sql[REC_NKINDS] = {
    [REC_BEGIN] = "INSERT INTO runs (scenario, scenario_text, seed, engine, strategy, "
                  "dsim_version, config, status, started_ns, host, pid, pid_start) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)",
    [REC_END] = "UPDATE runs SET status = ?, trace_hash = ?, ended_ns = ? WHERE id = ?",
    [REC_REPLICA] = "INSERT OR REPLACE INTO replicas (run_id, replica, worker, device, host) "
                    "VALUES (?, ?, ?, ?, ?)",
    [REC_STEP] = "INSERT INTO steps (run_id, replica, epoch, step, loss, reduced_loss, checksum, "
                 "examples, t_start_ns, t_end_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [REC_COLL] = "INSERT INTO collectives (run_id, replica, op, algorithm, bytes, t_start_ns, "
                 "t_end_ns, status, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [REC_EVENT] = "INSERT INTO events (run_id, replica, t_ns, kind, detail) VALUES (?, ?, ?, ?, ?)",
    [REC_CHECK] = "INSERT INTO checks (run_id, name, passed, measured, expected, message) "
                  "VALUES (?, ?, ?, ?, ?, ?)",
    [REC_METRIC] =
        "INSERT INTO metrics (run_id, name, value, unit, replica) VALUES (?, ?, ?, ?, ?)",
    [REC_FLIGHT] = "INSERT INTO flight_records (run_id, replica, record_id, pg_id, "
                   "collective_seq_id, profiling_name, input_count, input_dtype, reduce_op, root, "
                   "algorithm, state, waiting_for, error, time_created_ns, "
                   "time_discovered_started_ns, time_discovered_completed_ns) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [REC_REFLOSS] = "INSERT OR REPLACE INTO reference_steps (run_id, step, loss) VALUES (?, ?, ?)",
    [REC_MSG] = "INSERT INTO messages (run_id, attempt, src, dst, comm_id, tag, seq, bytes, "
                "t_sent_ns, t_recv_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
};

static const char *const store_status_names[] = {"passed", "failed", "error", "hung", "crashed"};

const char *dsim_run_status_name(dsim_run_status s)
{
    return (unsigned)s <= DSIM_RUN_CRASHED ? store_status_names[s] : "unknown";
}
static const char *const store_event_names[] = {"fault", "error", "restart", "checkpoint", "phase"};

static int64_t store_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- who owns a running run ------------------------------------------- */

/* Reads state and start time (clock ticks since boot) of a process from
 * /proc/<pid>/stat. -1: no such process; -2: /proc could not be read. */
static int store_proc_stat(long pid, char *state, int64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -1 : -2;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -2;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: the
     * fields after it start after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return -2;
    p += 2;
    *state = *p;
    /* start time is field 22: 20 fields after the state (field 3). */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -2;
        p++;
    }
    *start = strtoll(p, NULL, 10);
    return 0;
}

/* A process is the run's owner if it exists, is not a zombie, and (where
 * both are known) started when the owner did: a pid reused by a later
 * process does not keep a dead run 'running'. */
static bool store_owner_alive(long pid, int64_t pid_start, bool have_start)
{
    char state;
    int64_t start;
    int r = store_proc_stat(pid, &state, &start);
    if (r == -1)
        return false;
    if (r == 0)
        return state != 'Z' && state != 'X' && !(have_start && start != pid_start);
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

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

static int store_exec(sqlite3 *db, const char *sql)
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

static int store_exec_at(dsim_store *st, const char *point, const char *sql)
{
    int rc = store_fiu(st, point);
    return rc != SQLITE_OK ? rc : store_exec(st->db, sql);
}

static int store_step_at(dsim_store *st, const char *point, sqlite3_stmt *s)
{
    int rc = store_fiu(st, point);
    return rc != SQLITE_OK ? rc : sqlite3_step(s);
}

/* The message of the last failure on the connection: an injected one's, or
 * SQLite's. */
static const char *store_errmsg(const dsim_store *st)
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
        break;
    case REC_REFLOSS:
        sqlite3_bind_int64(s, 1, r->run);
        sqlite3_bind_int64(s, 2, (int64_t)r->u.refloss.step);
        store_bind_real(s, 3, r->u.refloss.loss);
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

static void store_rec_free(store_rec *r)
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

static void *store_writer(void *arg)
{
    dsim_store *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (st->count == 0 && !st->stop)
            pthread_cond_wait(&st->not_empty, &st->mu);
        if (st->count == 0)
            break;
        size_t n = st->count < STORE_BATCH_MAX ? st->count : STORE_BATCH_MAX;
        size_t first = n < DSIM_STORE_QUEUE_CAP - st->head ? n : DSIM_STORE_QUEUE_CAP - st->head;
        memcpy(st->batch, st->ring + st->head, first * sizeof *st->batch);
        memcpy(st->batch + first, st->ring, (n - first) * sizeof *st->batch);
        st->head = (st->head + n) % DSIM_STORE_QUEUE_CAP;
        st->count -= n;
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

/* ---- the callers' side ------------------------------------------------- */

/* Re-raises the writer's failure on the calling thread. Lock held. */
static dsim_err store_report_locked(dsim_store *st)
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
    /* The writer sleeps only on an empty queue. */
    if (st->count++ == 0)
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
    if (!st)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_check: store is NULL");
    DSIM_CHECK(store_need(st, "dsim_store_check", "check name", name));
    bool oom = false;
    store_rec r = {.kind = REC_CHECK, .run = run};
    r.u.check.name = store_dup(name, &oom);
    r.u.check.message = store_dup(message, &oom);
    r.u.check.passed = passed ? 1 : 0;
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

/* ---- open and close ---------------------------------------------------- */

/* SQLite's first 16 bytes. An empty file is a database SQLite will create. */
static dsim_err store_check_file(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT)
            return DSIM_OK;
        return DSIM_ERR(DSIM_EIO, -1, "results database %s: cannot stat: %s", path,
                        strerror(errno));
    }
    if (!S_ISREG(sb.st_mode))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s is not a regular file; give a file path with --db",
                        path);
    if (sb.st_size == 0)
        return DSIM_OK;
    static const char magic[16] = "SQLite format 3";
    char head[16] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return DSIM_ERR(DSIM_EIO, -1, "results database %s: cannot read: %s; check its permissions",
                        path, strerror(errno));
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    if (n != (ssize_t)sizeof head || memcmp(head, magic, sizeof magic) != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s is not a dsim results database (not an SQLite file); dsim left it "
                        "unchanged; choose another file with --db",
                        path);
    return DSIM_OK;
}

static int store_pragma_int(sqlite3 *db, const char *sql, int64_t *v)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *v = sqlite3_column_int64(s, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc;
}

/* Reads what identifies the file: application_id, user_version, and the
 * number of schema objects. */
static dsim_err store_identify(dsim_store *st, int64_t *app, int64_t *ver, int64_t *nobj)
{
    int rc = store_pragma_int(st->db, "PRAGMA application_id", app);
    if (rc == SQLITE_OK)
        rc = store_pragma_int(st->db, "PRAGMA user_version", ver);
    if (rc == SQLITE_OK)
        rc = store_pragma_int(
            st->db, "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'", nobj);
    if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s is not a usable SQLite database (%s); dsim left it unchanged; choose "
                        "another file with --db",
                        st->path, sqlite3_errmsg(st->db));
    if (rc != SQLITE_OK)
        return DSIM_ERR(DSIM_EIO, -1, "results database %s: cannot read its header: %s", st->path,
                        sqlite3_errmsg(st->db));
    return DSIM_OK;
}

/* Refuses what this dsim must not write to. */
static dsim_err store_classify(const dsim_store *st, int64_t app, int64_t ver, int64_t nobj)
{
    if (app == DSIM_STORE_APPLICATION_ID && ver > DSIM_STORE_SCHEMA_VERSION)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "results database %s has schema version %lld, newer than version %d that "
                        "dsim %s supports; dsim left it unchanged; upgrade dsim, or use another "
                        "database with --db",
                        st->path, (long long)ver, DSIM_STORE_SCHEMA_VERSION, DSIM_VERSION);
    if (app == DSIM_STORE_APPLICATION_ID && ver >= 1)
        return DSIM_OK;
    if (app == 0 && ver == 0 && nobj == 0)
        return DSIM_OK; /* a new, empty database */
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "%s is an SQLite database but not a dsim results database (application_id "
                    "0x%llx, user_version %lld, %lld schema objects); dsim left it unchanged; "
                    "choose another file with --db",
                    st->path, (unsigned long long)app, (long long)ver, (long long)nobj);
}

static dsim_err store_sql_fail(dsim_store *st, const char *what)
{
    dsim_err e =
        DSIM_ERR(DSIM_EIO, -1, "results database %s: %s: %s", st->path, what, store_errmsg(st));
    if (!sqlite3_get_autocommit(st->db))
        store_exec(st->db, "ROLLBACK");
    return e;
}

/* Applies the migrations from the file's version to ours, all in one
 * transaction: a failure leaves the file at its old version. */
static dsim_err store_migrate_locked(dsim_store *st);

/* Whether PRAGMA foreign_key_check finds nothing. */
static bool store_fk_clean(dsim_store *st)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "PRAGMA foreign_key_check", -1, &s, NULL) != SQLITE_OK)
        return false;
    bool clean = sqlite3_step(s) == SQLITE_DONE;
    sqlite3_finalize(s);
    return clean;
}

static dsim_err store_migrate(dsim_store *st)
{
    int64_t app, ver, nobj;
    DSIM_CHECK(store_identify(st, &app, &ver, &nobj));
    if (ver == DSIM_STORE_SCHEMA_VERSION)
        return DSIM_OK;
    /* A migration may rebuild a table others reference (SQLite cannot change
     * a CHECK in place): foreign keys are off while it runs, which can only
     * be set outside a transaction, and checked before the commit. */
    if (store_exec(st->db, "PRAGMA foreign_keys = OFF") != SQLITE_OK)
        return store_sql_fail(st, "cannot prepare it for a schema upgrade");
    dsim_err me = store_migrate_locked(st);
    if (store_exec(st->db, "PRAGMA foreign_keys = ON") != SQLITE_OK && me == DSIM_OK)
        me = store_sql_fail(st, "cannot turn foreign keys back on after the schema upgrade");
    return me;
}

static dsim_err store_migrate_locked(dsim_store *st)
{
    int64_t app, ver, nobj;
    if (store_exec_at(st, "dsim/store/open", "BEGIN IMMEDIATE") != SQLITE_OK)
        return store_sql_fail(st, "cannot lock it to upgrade the schema");
    /* Another process may have upgraded it since we looked. */
    dsim_err e = store_identify(st, &app, &ver, &nobj);
    if (e == DSIM_OK)
        e = store_classify(st, app, ver, nobj);
    if (e != DSIM_OK) {
        store_exec(st->db, "ROLLBACK");
        return e;
    }
    int64_t from = ver;
    for (; ver < DSIM_STORE_SCHEMA_VERSION; ver++) {
        if (store_exec_at(st, "dsim/store/open", store_migrations[ver]) != SQLITE_OK) {
            char what[128];
            snprintf(what, sizeof what,
                     "upgrading the schema from version %lld to %lld failed (file unchanged)",
                     (long long)ver, (long long)ver + 1);
            dsim_err e2 = store_sql_fail(st, what);
            store_exec(st->db, "ROLLBACK");
            return e2;
        }
    }
    if (!store_fk_clean(st)) {
        dsim_err e2 = DSIM_ERR(DSIM_EIO, -1,
                               "results database %s: upgrading the schema to version %d broke a "
                               "foreign key (file unchanged)",
                               st->path, DSIM_STORE_SCHEMA_VERSION);
        store_exec(st->db, "ROLLBACK");
        return e2;
    }
    char sql[128];
    snprintf(sql, sizeof sql, "PRAGMA application_id = %d; PRAGMA user_version = %d",
             DSIM_STORE_APPLICATION_ID, DSIM_STORE_SCHEMA_VERSION);
    if (store_exec_at(st, "dsim/store/open", sql) != SQLITE_OK ||
        store_exec_at(st, "dsim/store/open", "COMMIT") != SQLITE_OK)
        return store_sql_fail(st, "cannot commit the schema upgrade (file unchanged)");
    if (from > 0)
        dsim_info("results database %s: schema upgraded from version %lld to %d", st->path,
                  (long long)from, DSIM_STORE_SCHEMA_VERSION);
    return DSIM_OK;
}

/* Marks runs left 'running' by a process of this host that is gone. */
static dsim_err store_mark_unfinished(dsim_store *st)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(st->db,
                           "SELECT id, pid, pid_start FROM runs WHERE status = 'running' AND "
                           "host = ? AND pid IS NOT NULL",
                           -1, &s, NULL) != SQLITE_OK)
        return store_sql_fail(st, "cannot look for unfinished runs");
    sqlite3_bind_text(s, 1, st->host, -1, SQLITE_STATIC);
    dsim_run_id *dead = NULL;
    size_t ndead = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        long pid = (long)sqlite3_column_int64(s, 1);
        bool have_start = sqlite3_column_type(s, 2) != SQLITE_NULL && st->pid_start >= 0;
        if (store_owner_alive(pid, sqlite3_column_int64(s, 2), have_start))
            continue;
        if (ndead == cap) {
            cap = cap ? 2 * cap : 8;
            dsim_run_id *d = realloc(dead, cap * sizeof *d);
            if (!d) {
                free(dead);
                sqlite3_finalize(s);
                return DSIM_ERR(DSIM_ENOMEM, -1, "results database %s: out of memory", st->path);
            }
            dead = d;
        }
        dead[ndead++] = sqlite3_column_int64(s, 0);
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        free(dead);
        return store_sql_fail(st, "cannot look for unfinished runs");
    }
    dsim_err e = DSIM_OK;
    if (ndead > 0) {
        if (store_exec_at(st, "dsim/store/open", "BEGIN IMMEDIATE") != SQLITE_OK ||
            sqlite3_prepare_v2(st->db,
                               "UPDATE runs SET status = 'unfinished' WHERE id = ? AND "
                               "status = 'running'",
                               -1, &s, NULL) != SQLITE_OK) {
            free(dead);
            return store_sql_fail(st, "cannot mark unfinished runs");
        }
        for (size_t i = 0; i < ndead && e == DSIM_OK; i++) {
            sqlite3_bind_int64(s, 1, dead[i]);
            if (store_step_at(st, "dsim/store/open", s) != SQLITE_DONE)
                e = DSIM_EIO;
            sqlite3_reset(s);
        }
        sqlite3_finalize(s);
        if (e != DSIM_OK || store_exec_at(st, "dsim/store/open", "COMMIT") != SQLITE_OK)
            e = store_sql_fail(st, "cannot mark unfinished runs");
        else
            dsim_info("results database %s: %zu run(s) whose process is gone marked unfinished",
                      st->path, ndead);
    }
    free(dead);
    return e;
}

static void store_free(dsim_store *st)
{
    for (int k = 0; k < REC_NKINDS; k++)
        sqlite3_finalize(st->stmt[k]);
    if (st->db)
        sqlite3_close(st->db);
    free(st->ring);
    free(st->batch);
    free(st->active);
    free(st->unsettled);
    free(st->path);
    free(st);
}

dsim_err dsim_store_open(const char *path, dsim_store **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_open: out is NULL");
    *out = NULL;
    if (!path)
        path = DSIM_STORE_DEFAULT_PATH;
    if (!*path)
        return DSIM_ERR(DSIM_EINVAL, -1, "results database path is empty; give a file with --db");
    DSIM_CHECK(store_check_file(path));

    dsim_store *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return DSIM_ERR(DSIM_ENOMEM, -1, "results database %s: out of memory", path);
    }
    st->pid = (long)getpid();
    char state;
    if (store_proc_stat(st->pid, &state, &st->pid_start) != 0)
        st->pid_start = -1;
    if (gethostname(st->host, sizeof st->host - 1) != 0)
        snprintf(st->host, sizeof st->host, "localhost");

    dsim_err e = DSIM_OK;
    int rc = sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        e = DSIM_ERR(DSIM_EIO, -1,
                     "cannot open results database %s: %s; check that its directory exists and "
                     "is writable, or choose another file with --db",
                     path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
        goto fail;
    }
    sqlite3_extended_result_codes(st->db, 1);
    sqlite3_busy_timeout(st->db, STORE_BUSY_TIMEOUT_MS);

    int64_t app, ver, nobj;
    if ((e = store_identify(st, &app, &ver, &nobj)) != DSIM_OK ||
        (e = store_classify(st, app, ver, nobj)) != DSIM_OK)
        goto fail;
    if (sqlite3_db_readonly(st->db, "main") == 1) {
        e = DSIM_ERR(DSIM_EIO, -1,
                     "results database %s is read-only; dsim writes every run's results: fix its "
                     "permissions or choose another file with --db",
                     path);
        goto fail;
    }
    /* Only now that the file is known to be ours may it change. */
    if (store_exec_at(st, "dsim/store/open", "PRAGMA journal_mode = WAL") != SQLITE_OK ||
        store_exec(st->db, "PRAGMA synchronous = NORMAL") != SQLITE_OK ||
        store_exec(st->db, "PRAGMA foreign_keys = ON") != SQLITE_OK) {
        e = store_sql_fail(st, "cannot set WAL mode");
        goto fail;
    }
    if ((e = store_migrate(st)) != DSIM_OK || (e = store_mark_unfinished(st)) != DSIM_OK)
        goto fail;
    for (int k = 0; k < REC_NKINDS; k++) {
        if (sqlite3_prepare_v3(st->db, store_insert_sql[k], -1, SQLITE_PREPARE_PERSISTENT,
                               &st->stmt[k], NULL) != SQLITE_OK) {
            e = store_sql_fail(st, "cannot prepare its statements");
            goto fail;
        }
    }

    st->ring = malloc(DSIM_STORE_QUEUE_CAP * sizeof *st->ring);
    st->batch = malloc(STORE_BATCH_MAX * sizeof *st->batch);
    if (!st->ring || !st->batch) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "results database %s: out of memory for its queue", path);
        goto fail;
    }
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->not_empty, NULL);
    pthread_cond_init(&st->not_full, NULL);
    pthread_cond_init(&st->done, NULL);
    store_gate_install();
    rc = pthread_create(&st->writer, NULL, store_writer, st);
    if (rc != 0) {
        e = DSIM_ERR(DSIM_EIO, -1, "results database %s: cannot start its writer thread: %s", path,
                     strerror(rc));
        pthread_cond_destroy(&st->done);
        pthread_cond_destroy(&st->not_full);
        pthread_cond_destroy(&st->not_empty);
        pthread_mutex_destroy(&st->mu);
        goto fail;
    }
    *out = st;
    return DSIM_OK;
fail:
    store_free(st);
    return e;
}

dsim_err dsim_store_close(dsim_store *st)
{
    if (!st)
        return DSIM_OK;
    pthread_mutex_lock(&st->mu);
    st->stop = true;
    pthread_cond_signal(&st->not_empty);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->writer, NULL);

    /* The writer is gone: the connection is ours again. Runs not ended,
     * or whose end was not committed, become 'unfinished', even after a
     * write failure: it may have been passing (a lock held too long), and a
     * run left 'running' by a live process is never marked by anyone else. */
    dsim_err e = st->fail_code != DSIM_OK ? store_report_locked(st) : DSIM_OK;
    if (st->nunsettled > 0) {
        sqlite3_stmt *s = NULL;
        bool ok = store_exec_at(st, "dsim/store/write", "BEGIN IMMEDIATE") == SQLITE_OK &&
                  sqlite3_prepare_v2(st->db,
                                     "UPDATE runs SET status = 'unfinished' WHERE id = ? AND "
                                     "status = 'running'",
                                     -1, &s, NULL) == SQLITE_OK;
        for (size_t i = 0; ok && i < st->nunsettled; i++) {
            sqlite3_bind_int64(s, 1, st->unsettled[i]);
            ok = store_step_at(st, "dsim/store/write", s) == SQLITE_DONE;
            sqlite3_reset(s);
        }
        sqlite3_finalize(s);
        if (ok && store_exec_at(st, "dsim/store/write", "COMMIT") != SQLITE_OK)
            ok = false;
        if (!ok) {
            dsim_err m = store_sql_fail(st, "cannot mark the runs left open as unfinished");
            if (e == DSIM_OK)
                e = m;
            else
                (void)store_report_locked(st); /* the first failure is the one to report */
        }
    }
    for (int k = 0; k < REC_NKINDS; k++) {
        sqlite3_finalize(st->stmt[k]);
        st->stmt[k] = NULL;
    }
    int rc = sqlite3_close(st->db);
    if (rc != SQLITE_OK && e == DSIM_OK)
        e = DSIM_ERR(DSIM_EIO, -1, "results database %s: closing failed: %s", st->path,
                     sqlite3_errstr(rc));
    st->db = NULL;
    pthread_cond_destroy(&st->done);
    pthread_cond_destroy(&st->not_full);
    pthread_cond_destroy(&st->not_empty);
    pthread_mutex_destroy(&st->mu);
    store_free(st);
    return e;
}
