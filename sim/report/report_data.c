/* Reading one run out of the results store for the report and the trace. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report.h"
#include "diag/flight.h"
#include "report_int.h"
#include "store.h"

static char *rp_dup_col(sqlite3_stmt *q, int col)
{
    const unsigned char *t = sqlite3_column_text(q, col);
    return t ? strdup((const char *)t) : NULL;
}

dsim_err rp_db_open(const char *db_path, sqlite3 **out)
{
    *out = NULL;
    struct stat sb;
    if (stat(db_path, &sb) != 0)
        return DSIM_ERR(DSIM_ENOENT, -1,
                        "no results store at '%s' (%s); run 'dsim run' first, or name the "
                        "database with --db PATH",
                        db_path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return DSIM_ERR(DSIM_EINVAL, -1, "'%s' is not a file; name a results store with --db PATH",
                        db_path);
    /* Through the store first: it migrates an old file, refuses a foreign or
     * corrupt one with a message naming it, and marks runs whose process is
     * gone as unfinished. */
    dsim_store *st = NULL;
    dsim_err e = dsim_store_open(db_path, &st);
    if (e != DSIM_OK)
        return e;
    e = dsim_store_close(st);
    if (e != DSIM_OK)
        return e;
    sqlite3 *h = NULL;
    if (sqlite3_open_v2(db_path, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        e = DSIM_ERR(DSIM_EIO, -1, "cannot open '%s' to read: %s", db_path,
                     h ? sqlite3_errmsg(h) : "out of memory");
        sqlite3_close(h);
        return e;
    }
    sqlite3_busy_timeout(h, 5000);
    *out = h;
    return DSIM_OK;
}

static dsim_err rp_sql_err(sqlite3 *h, const char *db_path, int64_t id, const char *what)
{
    return DSIM_ERR(DSIM_EIO, -1,
                    "reading %s of run %" PRId64 " from '%s' failed: %s; the file may be "
                    "damaged ('sqlite3 %s \"PRAGMA integrity_check\"' checks it): restore a copy, "
                    "or run the scenario again with another --db",
                    what, id, db_path, sqlite3_errmsg(h), db_path);
}

/* Runs sql (one ?1 = run id) and hands each row to fn. */
static dsim_err rp_query(sqlite3 *h, const char *db_path, int64_t id, const char *what,
                         const char *sql, bool (*fn)(sqlite3_stmt *q, rp_run *r), rp_run *r)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) != SQLITE_OK)
        return rp_sql_err(h, db_path, id, what);
    sqlite3_bind_int64(q, 1, id);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (!fn(q, r)) {
            sqlite3_finalize(q);
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading %s of run %" PRId64, what, id);
        }
    }
    dsim_err e = rc == SQLITE_DONE ? DSIM_OK : rp_sql_err(h, db_path, id, what);
    sqlite3_finalize(q);
    return e;
}

#define RP_GROW(arr, n)                                                                            \
    do {                                                                                           \
        if (((n) & ((n)-1)) == 0) {                                                                \
            void *p_ = realloc((arr), ((n) ? (n)*2 : 16) * sizeof *(arr));                         \
            if (!p_)                                                                               \
                return false;                                                                      \
            (arr) = p_;                                                                            \
        }                                                                                          \
    } while (0)

static void rp_see_replica(rp_run *r, int replica)
{
    if (replica + 1 > r->n_replicas)
        r->n_replicas = replica + 1;
}

static void rp_see_time(rp_run *r, int64_t t)
{
    if (!r->has_times || t < r->t_origin)
        r->t_origin = t;
    if (!r->has_times || t > r->t_last)
        r->t_last = t;
    r->has_times = true;
}

static bool rp_row_step(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->steps, r->n_steps);
    rp_step *s = &r->steps[r->n_steps++];
    memset(s, 0, sizeof *s);
    s->replica = sqlite3_column_int(q, 0);
    s->epoch = sqlite3_column_int(q, 1);
    s->step = sqlite3_column_int64(q, 2);
    s->has_loss = sqlite3_column_type(q, 3) != SQLITE_NULL;
    s->loss = sqlite3_column_double(q, 3);
    s->has_reduced = sqlite3_column_type(q, 4) != SQLITE_NULL;
    s->reduced = sqlite3_column_double(q, 4);
    s->has_checksum = sqlite3_column_type(q, 5) != SQLITE_NULL;
    s->checksum = (uint64_t)sqlite3_column_int64(q, 5);
    s->examples = sqlite3_column_int64(q, 6);
    s->t0 = sqlite3_column_int64(q, 7);
    s->t1 = sqlite3_column_int64(q, 8);
    if (s->t1 < s->t0)
        s->t1 = s->t0;
    if (s->replica >= 0)
        rp_see_replica(r, s->replica);
    rp_see_time(r, s->t0);
    rp_see_time(r, s->t1);
    return true;
}

static bool rp_row_event(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->events, r->n_events);
    rp_event *e = &r->events[r->n_events++];
    e->replica = sqlite3_column_type(q, 0) == SQLITE_NULL ? -1 : sqlite3_column_int(q, 0);
    e->t = sqlite3_column_int64(q, 1);
    e->kind = rp_dup_col(q, 2);
    e->detail = rp_dup_col(q, 3);
    if (e->replica >= 0)
        rp_see_replica(r, e->replica);
    rp_see_time(r, e->t);
    return e->kind != NULL;
}

static bool rp_row_check(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->checks, r->n_checks);
    rp_check *c = &r->checks[r->n_checks++];
    c->name = rp_dup_col(q, 0);
    c->passed = sqlite3_column_int(q, 1) != 0;
    c->has_measured = sqlite3_column_type(q, 2) != SQLITE_NULL;
    c->measured = sqlite3_column_double(q, 2);
    c->has_expected = sqlite3_column_type(q, 3) != SQLITE_NULL;
    c->expected = sqlite3_column_double(q, 3);
    c->message = rp_dup_col(q, 4);
    return c->name != NULL;
}

static bool rp_row_coll(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->colls, r->n_colls);
    rp_coll *c = &r->colls[r->n_colls++];
    c->replica = sqlite3_column_int(q, 0);
    c->op = rp_dup_col(q, 1);
    c->algorithm = rp_dup_col(q, 2);
    c->bytes = sqlite3_column_int64(q, 3);
    c->t0 = sqlite3_column_int64(q, 4);
    c->t1 = sqlite3_column_int64(q, 5);
    if (c->t1 < c->t0)
        c->t1 = c->t0;
    c->status = sqlite3_column_int(q, 6);
    c->error = rp_dup_col(q, 7);
    if (c->replica >= 0)
        rp_see_replica(r, c->replica);
    rp_see_time(r, c->t0);
    rp_see_time(r, c->t1);
    return c->op != NULL;
}

static bool rp_row_metric(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->metrics, r->n_metrics);
    rp_metric *m = &r->metrics[r->n_metrics++];
    m->name = rp_dup_col(q, 0);
    m->has_value = sqlite3_column_type(q, 1) != SQLITE_NULL;
    m->value = sqlite3_column_double(q, 1);
    m->unit = rp_dup_col(q, 2);
    m->replica = sqlite3_column_type(q, 3) == SQLITE_NULL ? -1 : sqlite3_column_int(q, 3);
    return m->name != NULL;
}

static bool rp_row_flight(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->flights, r->n_flights);
    rp_flight *x = &r->flights[r->n_flights++];
    x->replica = sqlite3_column_int(q, 0);
    x->seq = sqlite3_column_int64(q, 1);
    x->name = rp_dup_col(q, 2);
    x->count = sqlite3_column_type(q, 3) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 3);
    x->dtype = rp_dup_col(q, 4);
    x->op = rp_dup_col(q, 5);
    x->state = rp_dup_col(q, 6);
    x->t0 = sqlite3_column_int64(q, 7);
    x->t1 = sqlite3_column_type(q, 8) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 8);
    x->waiting_for = sqlite3_column_type(q, 9) == SQLITE_NULL ? -1 : sqlite3_column_int(q, 9);
    x->error = rp_dup_col(q, 10);
    if (x->replica >= 0)
        rp_see_replica(r, x->replica);
    rp_see_time(r, x->t0);
    if (x->t1 >= x->t0)
        rp_see_time(r, x->t1);
    return x->name != NULL && x->state != NULL;
}

static bool rp_row_refloss(sqlite3_stmt *q, rp_run *r)
{
    if (r->n_ref % 64 == 0) {
        double *a = realloc(r->ref_step, (r->n_ref + 64) * sizeof *a);
        if (!a)
            return false;
        r->ref_step = a;
        double *b = realloc(r->ref_loss, (r->n_ref + 64) * sizeof *b);
        if (!b)
            return false;
        r->ref_loss = b;
    }
    r->ref_step[r->n_ref] = (double)sqlite3_column_int64(q, 0);
    r->ref_loss[r->n_ref++] =
        sqlite3_column_type(q, 1) == SQLITE_NULL ? NAN : sqlite3_column_double(q, 1);
    return true;
}

static bool rp_row_msg(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->msgs, r->n_msgs);
    rp_msg *m = &r->msgs[r->n_msgs++];
    m->attempt = sqlite3_column_int(q, 0);
    m->src = sqlite3_column_int(q, 1);
    m->dst = sqlite3_column_int(q, 2);
    m->comm = sqlite3_column_int64(q, 3);
    m->tag = sqlite3_column_int64(q, 4);
    m->seq = sqlite3_column_int64(q, 5);
    m->bytes = sqlite3_column_int64(q, 6);
    m->t0 = sqlite3_column_type(q, 7) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 7);
    m->t1 = sqlite3_column_type(q, 8) == SQLITE_NULL ? -1 : sqlite3_column_int64(q, 8);
    /* not rp_see_replica: a parameter server's rank is no replica */
    if (m->t0 >= 0)
        rp_see_time(r, m->t0);
    if (m->t1 >= 0)
        rp_see_time(r, m->t1);
    return true;
}

static bool rp_row_replica(sqlite3_stmt *q, rp_run *r)
{
    RP_GROW(r->replicas, r->n_replicas_rows);
    rp_replica *p = &r->replicas[r->n_replicas_rows++];
    p->replica = sqlite3_column_int(q, 0);
    p->worker = sqlite3_column_int(q, 1);
    p->device = rp_dup_col(q, 2);
    p->host = rp_dup_col(q, 3);
    if (p->replica >= 0)
        rp_see_replica(r, p->replica);
    return true;
}

/* "1..17", "1, 3, 9", or "none" for the message on an unknown id. */
static void rp_known_ids(sqlite3 *h, char *buf, size_t cap)
{
    snprintf(buf, cap, "none");
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, "SELECT min(id), max(id), count(*) FROM runs", -1, &q, NULL) !=
        SQLITE_OK)
        return;
    if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_int64(q, 2) > 0) {
        long long lo = sqlite3_column_int64(q, 0), hi = sqlite3_column_int64(q, 1);
        long long n = sqlite3_column_int64(q, 2);
        if (n == hi - lo + 1)
            snprintf(buf, cap, "%lld..%lld", lo, hi);
        else
            snprintf(buf, cap, "%lld ids between %lld and %lld", n, lo, hi);
    }
    sqlite3_finalize(q);
}

dsim_err rp_run_load(sqlite3 *h, const char *db_path, int64_t id, rp_run *r)
{
    memset(r, 0, sizeof *r);
    r->id = id;
    dsim_flight_path(db_path, (uint64_t)id, r->flight_path, sizeof r->flight_path);
    sqlite3_stmt *q = NULL;
    const char *sql = "SELECT scenario, engine, strategy, status, "
                      "datetime(started_ns / 1000000000, 'unixepoch'), dsim_version, config, "
                      "seed, (ended_ns - started_ns) / 1e9, scenario_text FROM runs WHERE id = ?1";
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) != SQLITE_OK)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "'%s' is not a dsim results store this dsim can read (%s); name another "
                        "with --db PATH",
                        db_path, sqlite3_errmsg(h));
    sqlite3_bind_int64(q, 1, id);
    int rc = sqlite3_step(q);
    if (rc != SQLITE_ROW) {
        dsim_err e;
        if (rc == SQLITE_DONE) {
            char known[96];
            rp_known_ids(h, known, sizeof known);
            e = DSIM_ERR(DSIM_ENOENT, -1,
                         "run %" PRId64 " is not in '%s' (it holds runs %s); 'dsim list runs "
                         "--db %s' lists them",
                         id, db_path, known, db_path);
        } else {
            e = rp_sql_err(h, db_path, id, "the run");
        }
        sqlite3_finalize(q);
        return e;
    }
    r->scenario = rp_dup_col(q, 0);
    r->engine = rp_dup_col(q, 1);
    r->strategy = rp_dup_col(q, 2);
    r->status = rp_dup_col(q, 3);
    r->started = rp_dup_col(q, 4);
    r->version = rp_dup_col(q, 5);
    r->config = rp_dup_col(q, 6);
    r->seed = (uint64_t)sqlite3_column_int64(q, 7);
    r->has_duration = sqlite3_column_type(q, 8) != SQLITE_NULL;
    r->duration_s = sqlite3_column_double(q, 8);
    r->text = rp_dup_col(q, 9);
    sqlite3_finalize(q);

    static const struct {
        const char *what, *sql;
        bool (*row)(sqlite3_stmt *q, rp_run *r);
    } rp_tables[] = {
        {"the steps",
         "SELECT replica, epoch, step, loss, reduced_loss, checksum, examples, t_start_ns, "
         "t_end_ns FROM steps WHERE run_id = ?1 ORDER BY rowid",
         rp_row_step},
        {"the events",
         "SELECT replica, t_ns, kind, detail FROM events WHERE run_id = ?1 ORDER BY t_ns, rowid",
         rp_row_event},
        {"the checks",
         "SELECT name, passed, measured, expected, message FROM checks WHERE run_id = ?1 "
         "ORDER BY rowid",
         rp_row_check},
        {"the collectives",
         "SELECT replica, op, algorithm, bytes, t_start_ns, t_end_ns, status, error "
         "FROM collectives WHERE run_id = ?1 ORDER BY t_start_ns, rowid",
         rp_row_coll},
        {"the metrics",
         "SELECT name, value, unit, replica FROM metrics WHERE run_id = ?1 ORDER BY rowid",
         rp_row_metric},
        {"the replicas",
         "SELECT replica, worker, device, host FROM replicas WHERE run_id = ?1 ORDER BY replica",
         rp_row_replica},
        {"the flight records",
         "SELECT replica, collective_seq_id, profiling_name, input_count, input_dtype, "
         "reduce_op, state, time_created_ns, time_discovered_completed_ns, waiting_for, error "
         "FROM flight_records WHERE run_id = ?1 ORDER BY replica, record_id",
         rp_row_flight},
        {"the reference's losses",
         "SELECT step, loss FROM reference_steps WHERE run_id = ?1 ORDER BY step", rp_row_refloss},
        {"the messages",
         "SELECT attempt, src, dst, comm_id, tag, seq, bytes, t_sent_ns, t_recv_ns FROM messages "
         "WHERE run_id = ?1 ORDER BY t_sent_ns, rowid",
         rp_row_msg},
    };
    dsim_err e = DSIM_OK;
    for (size_t k = 0; k < sizeof rp_tables / sizeof rp_tables[0] && e == DSIM_OK; k++)
        e = rp_query(h, db_path, id, rp_tables[k].what, rp_tables[k].sql, rp_tables[k].row, r);
    if (e != DSIM_OK) {
        rp_run_free(r);
        return e;
    }
    /* attempts: a replica whose step count goes back was restarted */
    int64_t *last = calloc((size_t)r->n_replicas + 1, sizeof *last);
    int *att = calloc((size_t)r->n_replicas + 1, sizeof *att);
    if (!last || !att) {
        free(last);
        free(att);
        rp_run_free(r);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading run %" PRId64, id);
    }
    for (int i = 0; i <= r->n_replicas; i++)
        last[i] = -1;
    for (size_t i = 0; i < r->n_steps; i++) {
        rp_step *s = &r->steps[i];
        if (s->replica < 0)
            continue;
        if (s->step <= last[s->replica])
            att[s->replica]++;
        last[s->replica] = s->step;
        s->attempt = att[s->replica];
    }
    free(last);
    free(att);
    return DSIM_OK;
}

void rp_run_free(rp_run *r)
{
    if (!r)
        return;
    free(r->scenario);
    free(r->engine);
    free(r->strategy);
    free(r->status);
    free(r->started);
    free(r->version);
    free(r->config);
    free(r->text);
    free(r->steps);
    free(r->msgs);
    free(r->ref_step);
    free(r->ref_loss);
    for (size_t i = 0; i < r->n_flights; i++) {
        free(r->flights[i].name);
        free(r->flights[i].dtype);
        free(r->flights[i].op);
        free(r->flights[i].state);
        free(r->flights[i].error);
    }
    free(r->flights);
    for (size_t i = 0; i < r->n_events; i++) {
        free(r->events[i].kind);
        free(r->events[i].detail);
    }
    free(r->events);
    for (size_t i = 0; i < r->n_checks; i++) {
        free(r->checks[i].name);
        free(r->checks[i].message);
    }
    free(r->checks);
    for (size_t i = 0; i < r->n_colls; i++) {
        free(r->colls[i].op);
        free(r->colls[i].algorithm);
        free(r->colls[i].error);
    }
    free(r->colls);
    for (size_t i = 0; i < r->n_metrics; i++) {
        free(r->metrics[i].name);
        free(r->metrics[i].unit);
    }
    free(r->metrics);
    for (size_t i = 0; i < r->n_replicas_rows; i++) {
        free(r->replicas[i].device);
        free(r->replicas[i].host);
    }
    free(r->replicas);
    memset(r, 0, sizeof *r);
}

const rp_metric *rp_metric_find(const rp_run *r, const char *name)
{
    for (size_t i = 0; i < r->n_metrics; i++)
        if (r->metrics[i].replica < 0 && strcmp(r->metrics[i].name, name) == 0)
            return &r->metrics[i];
    return NULL;
}

typedef struct rp_sum {
    int64_t step;
    int attempt;
    uint64_t checksum;
} rp_sum;

static int rp_sum_cmp(const void *pa, const void *pb)
{
    const rp_sum *a = pa, *b = pb;
    if (a->step != b->step)
        return a->step < b->step ? -1 : 1;
    if (a->attempt != b->attempt)
        return a->attempt < b->attempt ? -1 : 1;
    return 0;
}

int64_t rp_first_divergent_step(const rp_run *r)
{
    rp_sum *v = malloc((r->n_steps ? r->n_steps : 1) * sizeof *v);
    if (!v)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < r->n_steps; i++)
        if (r->steps[i].has_checksum)
            v[n++] = (rp_sum){r->steps[i].step, r->steps[i].attempt, r->steps[i].checksum};
    qsort(v, n, sizeof *v, rp_sum_cmp);
    int64_t found = -1;
    for (size_t i = 1; i < n && found < 0; i++)
        if (rp_sum_cmp(&v[i - 1], &v[i]) == 0 && v[i - 1].checksum != v[i].checksum)
            found = v[i].step;
    free(v);
    return found;
}

dsim_err rp_write_file(const char *path, dsim_err (*fn)(FILE *out, void *arg), void *arg)
{
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        dsim_err e = DSIM_ERR(DSIM_EIO, -1, "cannot write '%s': %s (choose another -o FILE)", tmp,
                              strerror(errno));
        free(tmp);
        return e;
    }
    dsim_err e = fn(f, arg);
    int werr = ferror(f);
    if (fclose(f) != 0 || werr) {
        if (e == DSIM_OK)
            e = DSIM_ERR(DSIM_EIO, -1, "writing '%s' failed: %s (is the disk full?)", tmp,
                         strerror(errno));
    }
    if (e == DSIM_OK && rename(tmp, path) != 0)
        e = DSIM_ERR(DSIM_EIO, -1, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (e != DSIM_OK)
        (void)unlink(tmp);
    free(tmp);
    return e;
}

dsim_err dsim_report_last_run(const char *db_path, int64_t *out)
{
    sqlite3 *h = NULL;
    dsim_err e = rp_db_open(db_path, &h);
    if (e != DSIM_OK)
        return e;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, "SELECT max(id) FROM runs", -1, &q, NULL) != SQLITE_OK) {
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "'%s' is not a dsim results store this dsim can read (%s); name another "
                     "with --db PATH",
                     db_path, sqlite3_errmsg(h));
    } else if (sqlite3_step(q) != SQLITE_ROW || sqlite3_column_type(q, 0) == SQLITE_NULL) {
        e = DSIM_ERR(DSIM_ENOENT, -1, "'%s' holds no runs yet; run 'dsim run' first", db_path);
    } else {
        *out = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    sqlite3_close(h);
    return e;
}

dsim_err dsim_report_parse_run_id(const char *db_path, const char *arg, int64_t *out)
{
    if (strcmp(arg, "last") == 0)
        return dsim_report_last_run(db_path, out);
    char *end = NULL;
    errno = 0;
    long long v = strtoll(arg, &end, 10);
    if (!*arg || *end || errno || v < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "'%s' is not a run id (accepted: a whole number >= 1 as 'dsim list runs' "
                        "shows it, or 'last')",
                        arg);
    *out = v;
    return DSIM_OK;
}
