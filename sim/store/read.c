/* Reading a run back from a store file (dsim_store_read_run), and marking
 * the runs of a process that died as crashed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "dsim/log.h"
#include "store.h"
#include "store_int.h"

/* ---- reading a run back ---- */

static char *store_col_dup(sqlite3_stmt *q, int col, bool *oom)
{
    const unsigned char *t = sqlite3_column_text(q, col);
    if (!t)
        return NULL;
    char *d = strdup((const char *)t);
    if (!d)
        *oom = true;
    return d;
}

void dsim_stored_run_free(dsim_stored_run *r)
{
    if (!r)
        return;
    free(r->scenario);
    free(r->scenario_text);
    free(r->engine);
    free(r->status);
    free(r->trace_hash);
    free(r->config);
    memset(r, 0, sizeof *r);
}

dsim_err dsim_store_mark_dead_process(const char *path, long pid, int64_t since_ns,
                                      const char *detail, dsim_run_id *ids, size_t cap, size_t *n)
{
    *n = 0;
    if (!path)
        path = DSIM_STORE_DEFAULT_PATH;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "localhost");
    sqlite3 *h = NULL;
    if (sqlite3_open_v2(path, &h, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        dsim_err e = DSIM_ERR(DSIM_ENOENT, -1, "%s: cannot open the results store: %s", path,
                              h ? sqlite3_errmsg(h) : "out of memory");
        sqlite3_close(h);
        return e;
    }
    sqlite3_busy_timeout(h, 10000);
    sqlite3_stmt *q = NULL, *up = NULL, *ev = NULL;
    dsim_err e = DSIM_OK;
    int64_t now = store_wall_ns();
    if (sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(h,
                           "SELECT id FROM runs WHERE host = ? AND pid = ? AND started_ns >= ? AND "
                           "status = 'running' ORDER BY id",
                           -1, &q, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(h, "UPDATE runs SET status = 'crashed', ended_ns = ? WHERE id = ?", -1,
                           &up, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(h,
                           "INSERT INTO events (run_id, replica, t_ns, kind, detail) VALUES "
                           "(?, NULL, ?, 'error', ?)",
                           -1, &ev, NULL) != SQLITE_OK) {
        e = DSIM_ERR(DSIM_EIO, -1, "%s: cannot mark the runs of process %ld crashed: %s", path, pid,
                     sqlite3_errmsg(h));
        goto out;
    }
    sqlite3_bind_text(q, 1, host, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, pid);
    sqlite3_bind_int64(q, 3, since_ns);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        dsim_run_id id = sqlite3_column_int64(q, 0);
        sqlite3_bind_int64(up, 1, now);
        sqlite3_bind_int64(up, 2, id);
        sqlite3_bind_int64(ev, 1, id);
        sqlite3_bind_int64(ev, 2, now);
        sqlite3_bind_text(ev, 3, detail, -1, SQLITE_STATIC);
        if (sqlite3_step(up) != SQLITE_DONE || sqlite3_step(ev) != SQLITE_DONE) {
            rc = SQLITE_ERROR;
            break;
        }
        sqlite3_reset(up);
        sqlite3_reset(ev);
        if (*n < cap)
            ids[*n] = id;
        (*n)++;
    }
    if (rc != SQLITE_DONE || sqlite3_exec(h, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        e = DSIM_ERR(DSIM_EIO, -1, "%s: cannot mark the runs of process %ld crashed: %s", path, pid,
                     sqlite3_errmsg(h));
out:
    sqlite3_finalize(q);
    sqlite3_finalize(up);
    sqlite3_finalize(ev);
    if (e != DSIM_OK) {
        sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
        *n = 0;
    }
    sqlite3_close(h);
    return e;
}

/* The store at path opened read-only for one reader (DSIM_ENOENT naming
 * the file when it cannot be). */
static dsim_err rd_open(const char *path, sqlite3 **out)
{
    sqlite3 *h = NULL;
    if (sqlite3_open_v2(path, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        dsim_err e = DSIM_ERR(DSIM_ENOENT, -1, "%s: cannot open the results store: %s", path,
                              h ? sqlite3_errmsg(h) : "out of memory");
        sqlite3_close(h);
        return e;
    }
    sqlite3_busy_timeout(h, 5000);
    *out = h;
    return DSIM_OK;
}

dsim_err dsim_store_read_run(const char *path, dsim_run_id id, dsim_stored_run *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_store_read_run: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path)
        path = DSIM_STORE_DEFAULT_PATH;
    sqlite3 *h = NULL;
    DSIM_CHECK(rd_open(path, &h));
    sqlite3_stmt *q = NULL;
    dsim_err e = DSIM_OK;
    if (sqlite3_prepare_v2(
            h,
            "SELECT scenario, scenario_text, seed, engine, status, trace_hash, config "
            "FROM runs WHERE id = ?",
            -1, &q, NULL) != SQLITE_OK) {
        e = DSIM_ERR(DSIM_EIO, -1, "%s: not a dsim results store (%s)", path, sqlite3_errmsg(h));
        sqlite3_close(h);
        return e;
    }
    sqlite3_bind_int64(q, 1, id);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        bool oom = false;
        out->scenario = store_col_dup(q, 0, &oom);
        out->scenario_text = store_col_dup(q, 1, &oom);
        out->seed = (uint64_t)sqlite3_column_int64(q, 2);
        out->engine = store_col_dup(q, 3, &oom);
        out->status = store_col_dup(q, 4, &oom);
        out->trace_hash = store_col_dup(q, 5, &oom);
        out->config = store_col_dup(q, 6, &oom);
        if (oom)
            e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading run %lld", (long long)id);
    } else if (rc == SQLITE_DONE) {
        e = DSIM_ERR(DSIM_ENOENT, -1, "%s: there is no run %lld (dsim list runs shows them)", path,
                     (long long)id);
    } else {
        e = DSIM_ERR(DSIM_EIO, -1, "%s: reading run %lld: %s", path, (long long)id,
                     sqlite3_errmsg(h));
    }
    sqlite3_finalize(q);
    sqlite3_close(h);
    if (e != DSIM_OK)
        dsim_stored_run_free(out);
    return e;
}

dsim_err dsim_store_read_params(const char *path, dsim_run_id id, size_t n, float **out,
                                uint64_t *steps)
{
    *out = NULL;
    *steps = 0;
    if (!path)
        path = DSIM_STORE_DEFAULT_PATH;
    sqlite3 *h = NULL;
    DSIM_CHECK(rd_open(path, &h));
    sqlite3_stmt *q = NULL;
    dsim_err e = DSIM_OK;
    float *rows = NULL;
    uint64_t got = 0, cap = 0;
    /* a store from before version 8 has no params table: nothing kept */
    if (sqlite3_prepare_v2(h, "SELECT step, data FROM params WHERE run_id = ? ORDER BY step", -1,
                           &q, NULL) != SQLITE_OK)
        goto done;
    sqlite3_bind_int64(q, 1, id);
    while (e == DSIM_OK && sqlite3_step(q) == SQLITE_ROW) {
        int64_t step = sqlite3_column_int64(q, 0);
        const void *b = sqlite3_column_blob(q, 1);
        size_t len = (size_t)sqlite3_column_bytes(q, 1);
        if (step != (int64_t)got || len != n * sizeof(float) || (!b && n)) {
            e = DSIM_ERR(DSIM_EPROTO, -1,
                         "%s: run %lld's kept variables: step %lld %s (expected step %llu of "
                         "%zu bytes)",
                         path, (long long)id, (long long)step,
                         step != (int64_t)got ? "is out of order or one is missing"
                                              : "has another size",
                         (unsigned long long)got, n * sizeof(float));
            break;
        }
        if (got == cap) {
            cap = cap ? 2 * cap : 64;
            float *more = realloc(rows, (size_t)cap * (n ? n : 1) * sizeof *rows);
            if (!more) {
                e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading run %lld's variables",
                             (long long)id);
                break;
            }
            rows = more;
        }
        if (n)
            memcpy(rows + (size_t)got * n, b, n * sizeof(float));
        got++;
    }
done:
    sqlite3_finalize(q);
    sqlite3_close(h);
    if (e != DSIM_OK || !got) {
        free(rows);
        return e;
    }
    *out = rows;
    *steps = got;
    return DSIM_OK;
}

dsim_err dsim_store_read_checksums(const char *path, dsim_run_id id, uint64_t **out,
                                   uint64_t *steps, int *replicas)
{
    *out = NULL;
    *steps = 0;
    *replicas = 0;
    if (!path)
        path = DSIM_STORE_DEFAULT_PATH;
    sqlite3 *h = NULL;
    DSIM_CHECK(rd_open(path, &h));
    sqlite3_stmt *q = NULL;
    dsim_err e = DSIM_OK;
    int64_t max_step = -1, max_rep = -1;
    if (sqlite3_prepare_v2(h, "SELECT max(step), max(replica) FROM steps WHERE run_id = ?", -1, &q,
                           NULL) != SQLITE_OK) {
        e = DSIM_ERR(DSIM_EIO, -1, "%s: not a dsim results store (%s)", path, sqlite3_errmsg(h));
        goto done;
    }
    sqlite3_bind_int64(q, 1, id);
    if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_type(q, 0) != SQLITE_NULL) {
        max_step = sqlite3_column_int64(q, 0);
        max_rep = sqlite3_column_int64(q, 1);
    }
    sqlite3_finalize(q);
    q = NULL;
    if (max_step < 0 || max_rep < 0 || max_rep >= (1 << 24) || max_step >= ((int64_t)1 << 40))
        goto done;
    size_t n = (size_t)(max_step + 1) * (size_t)(max_rep + 1);
    uint64_t *cs = calloc(n, sizeof *cs);
    if (!cs) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading run %lld's checksums", (long long)id);
        goto done;
    }
    if (sqlite3_prepare_v2(h, "SELECT step, replica, checksum FROM steps WHERE run_id = ?", -1, &q,
                           NULL) != SQLITE_OK) {
        free(cs);
        e = DSIM_ERR(DSIM_EIO, -1, "%s: reading run %lld: %s", path, (long long)id,
                     sqlite3_errmsg(h));
        goto done;
    }
    sqlite3_bind_int64(q, 1, id);
    while (sqlite3_step(q) == SQLITE_ROW) {
        int64_t st = sqlite3_column_int64(q, 0), rp = sqlite3_column_int64(q, 1);
        if (st >= 0 && st <= max_step && rp >= 0 && rp <= max_rep)
            cs[(size_t)st * (size_t)(max_rep + 1) + (size_t)rp] =
                (uint64_t)sqlite3_column_int64(q, 2);
    }
    sqlite3_finalize(q);
    *out = cs;
    *steps = (uint64_t)max_step + 1;
    *replicas = (int)max_rep + 1;
done:
    sqlite3_close(h);
    return e;
}
