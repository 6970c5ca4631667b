/* Opening a store (the file's checks, its identity, migrations, runs left
 * 'running' by a process that is gone) and closing it. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "dsim/log.h"
#include "dsim_config.h"
#include "store.h"
#include "store_int.h"

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
    [REC_CHECK] = "INSERT INTO checks (run_id, name, passed, measured, expected, message, "
                  "by_default) VALUES (?, ?, ?, ?, ?, ?, ?)",
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
    [REC_PARAMS] = "INSERT OR REPLACE INTO params (run_id, step, data) VALUES (?, ?, ?)",
};

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
    /* Every replica of a threads-engine job queues its step's record here
     * as its step ends, and a synchronous job's replicas end their steps
     * together: the queue's lock is taken by all of them at once, for the
     * copy of a record. A waiter that spins briefly before it sleeps (glibc's
     * adaptive mutex) takes it without a futex sleep and wake-up: steps of
     * 5 and 8 replicas on 2 CPUs (mirrored) 8-18 % shorter, the quickstart's
     * 24.7 -> 22.3 us (medians of alternating runs); 3 replicas within the
     * noise. */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&st->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->not_empty, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&st->not_full, NULL);
    pthread_cond_init(&st->done, NULL);
    store_gate_install();
    rc = dsim_thread_start(&st->writer, NULL, store_writer, st);
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
