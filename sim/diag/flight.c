/* Flight records: written as JSON with PyTorch's field names, read back and
 * analysed for the first collective the ranks did not all complete. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "diag/flight.h"

/* PyTorch's names for the collectives and dtypes. */
const char *dsim_flight_profiling_name(unsigned coll)
{
    switch ((dsim_coll_kind)coll) {
    case DSIM_COLL_ALLREDUCE:
        return "dsim:all_reduce";
    case DSIM_COLL_REDUCE:
        return "dsim:reduce";
    case DSIM_COLL_BROADCAST:
        return "dsim:broadcast";
    case DSIM_COLL_ALLGATHER:
        return "dsim:all_gather";
    case DSIM_COLL_REDUCE_SCATTER:
        return "dsim:reduce_scatter";
    case DSIM_COLL_BARRIER:
        return "dsim:barrier";
    default:
        return "dsim:unknown";
    }
}

const char *dsim_flight_dtype_name(unsigned t)
{
    static const char *const names[DSIM_DTYPE_COUNT] = {
        [DSIM_F32] = "Float",     [DSIM_F64] = "Double", [DSIM_F16] = "Half",
        [DSIM_BF16] = "BFloat16", [DSIM_I32] = "Int",    [DSIM_I64] = "Long",
    };
    return t < DSIM_DTYPE_COUNT ? names[t] : NULL;
}

void dsim_flight_path(const char *db_path, uint64_t run_id, char *buf, size_t cap)
{
    const char *db = db_path && *db_path ? db_path : "dsim.db";
    const char *slash = strrchr(db, '/');
    int dlen = slash ? (int)(slash - db) : 0;
    if (slash && dlen == 0)
        dlen = 1; /* "/dsim.db": the root */
    snprintf(buf, cap, "%.*s%sdsim-flight/run-%" PRIu64 ".json", dlen, db,
             slash ? (dlen == 1 && db[0] == '/' ? "" : "/") : "", run_id);
}

/* The element counts of a call's input and output, as PyTorch lists tensor
 * sizes: [[count]] (one tensor), [] for a barrier. */
static json_t *fl_sizes(const dsim_coll_fp *fp, int size, int output)
{
    json_t *a = json_array();
    if (!a || fp->coll == DSIM_COLL_BARRIER || fp->coll == DSIM_COLL_NONE)
        return a;
    uint64_t n = fp->count;
    if ((fp->coll == DSIM_COLL_ALLGATHER && output) ||
        (fp->coll == DSIM_COLL_REDUCE_SCATTER && !output))
        n *= (uint64_t)size;
    json_array_append_new(a, json_pack("[I]", (json_int_t)n));
    return a;
}

static json_t *fl_dtypes(const dsim_coll_fp *fp)
{
    json_t *a = json_array();
    const char *d = dsim_flight_dtype_name(fp->dtype);
    if (a && d)
        json_array_append_new(a, json_string(d));
    return a;
}

static json_t *fl_entry(const dsim_fr_dump *d, const dsim_fr_entry *e, size_t record,
                        int64_t timeout_ns)
{
    const dsim_coll_fp *fp = &e->fp;
    char what[160];
    dsim_coll_fp_str(fp, what, sizeof what);
    double dur = e->t_completed >= 0 ? (double)(e->t_completed - e->t_created) / 1e6 : -1;
    json_t *fpj = json_pack("{s:I, s:I, s:i, s:i, s:i, s:I, s:i, s:i}", "comm_id",
                            (json_int_t)fp->comm_id, "seq", (json_int_t)fp->seq, "coll",
                            (int)fp->coll, "op", (int)fp->op, "dtype", (int)fp->dtype, "count",
                            (json_int_t)fp->count, "root", (int)fp->root, "algo", (int)fp->algo);
    json_t *ds =
        json_pack("{s:s, s:i, s:s, s:i, s:s?, s:s, s:o}", "reduce_op",
                  fp->op < DSIM_OP_COUNT ? dsim_op_name((dsim_op)fp->op) : "none", "root",
                  (int)fp->root, "algorithm", dsim_algo_name((dsim_algo)fp->algo), "waiting_for",
                  (int)e->waiting_for, "error", e->error ? dsim_strerror((dsim_err)e->error) : NULL,
                  "call", what, "fingerprint", fpj);
    json_t *pg = json_pack("[s, s]", "1", "world");
    char pgid[16];
    snprintf(pgid, sizeof pgid, "%" PRIu32, d->comm_id);
    json_array_set_new(pg, 0, json_string(pgid));
    json_t *j = json_pack(
        "{s:I, s:I, s:o, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:f, s:o, s:o, s:o, s:o, s:s, s:b, "
        "s:b, s:f, s:[], s:o}",
        "record_id", (json_int_t)record, "pg_id", (json_int_t)d->comm_id, "process_group", pg,
        "collective_seq_id", (json_int_t)fp->seq, "p2p_seq_id", (json_int_t)0, "op_id",
        (json_int_t)fp->seq, "profiling_name", dsim_flight_profiling_name(fp->coll),
        "time_created_ns", (json_int_t)e->t_created, "time_discovered_started_ns",
        (json_int_t)e->t_started, "time_discovered_completed_ns", (json_int_t)e->t_completed,
        "duration_ms", dur, "input_sizes", fl_sizes(fp, d->size, 0), "input_dtypes", fl_dtypes(fp),
        "output_sizes", fl_sizes(fp, d->size, 1), "output_dtypes", fl_dtypes(fp), "state",
        dsim_fr_state_name((dsim_fr_state)e->state), "is_p2p", 0, "retired",
        e->state == DSIM_FR_COMPLETED || e->error != 0, "timeout_ms",
        timeout_ns > 0 ? (double)timeout_ns / 1e6 : 0.0, "frames", "dsim", ds);
    return j;
}

static int fl_mkdirs(const char *path)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(dir, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

dsim_err dsim_flight_write(const char *path, uint64_t run_id, const char *scenario,
                           const dsim_train_result *res, const char *error, int64_t timeout_ns)
{
    if (!path || !res)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_flight_write: path or result is NULL");
    if (!res->flight || res->n_flight <= 0)
        return DSIM_ERR(DSIM_ENOENT, -1, "the run kept no flight records (it never formed)");
    json_t *ranks = json_array();
    char members[64] = "[";
    for (int r = 0; r < res->n_flight; r++) {
        const dsim_fr_dump *d = &res->flight[r];
        json_t *entries = json_array();
        for (size_t i = 0; entries && i < d->n; i++)
            json_array_append_new(entries,
                                  fl_entry(d, &d->entries[i], d->calls - d->n + i, timeout_ns));
        /* A replica the watchdog left running: its recorder was not read
         * (its thread may still write it); where it was stands instead. */
        char left[256] = "";
        for (size_t k = 0; k < res->n_stuck && res->stuck; k++)
            if (res->stuck[k].where.server < 0 && res->stuck[k].where.replica == d->rank)
                dsim_train_stuck_describe(&res->stuck[k], left, sizeof left);
        /* Calls made and none kept: the recorder was not read, which the
         * driver does only for a replica it left running (a worker process
         * reports that one without saying where it was). */
        if (!left[0] && d->calls > 0 && d->n == 0)
            snprintf(left, sizeof left,
                     "replica %d, in or after its call %" PRIu64
                     " (its worker process did not say where)",
                     d->rank, d->calls);
        json_array_append_new(ranks,
                              json_pack("{s:i, s:I, s:I, s:o, s:s?}", "rank", d->rank, "pg_id",
                                        (json_int_t)d->comm_id, "calls", (json_int_t)d->calls,
                                        "entries", entries, "left_running", left[0] ? left : NULL));
        size_t ml = strlen(members);
        if (ml + 16 < sizeof members)
            snprintf(members + ml, sizeof members - ml, "%s%d", r ? ", " : "", r);
        else if (ml + 5 < sizeof members && !strstr(members, "..."))
            snprintf(members + ml, sizeof members - ml, ", ...");
    }
    snprintf(members + strlen(members), sizeof members - strlen(members), "]");
    char pgid[16];
    snprintf(pgid, sizeof pgid, "%u", (unsigned)(res->n_flight ? res->flight[0].comm_id : 1u));
    json_t *root = json_pack(
        "{s:s, s:I, s:s?, s:s?, s:s, s:{s:{s:s, s:s, s:s}}, s:o}", "version", "2.4", "run_id",
        (json_int_t)run_id, "scenario", scenario, "error", error && *error ? error : NULL, "clock",
        "ns on the run's runtime clock (CLOCK_MONOTONIC for the threads engine)", "pg_config", pgid,
        "name", "world", "desc", "every replica of the job", "ranks", members, "ranks", ranks);
    if (!root)
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "out of memory building the flight records of run %" PRIu64, run_id);
    if (fl_mkdirs(path) != 0) {
        json_decref(root);
        return DSIM_ERR(DSIM_EIO, -1, "cannot create the directory of %s: %s", path,
                        strerror(errno));
    }
    int rc = json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0)
        return DSIM_ERR(DSIM_EIO, -1, "cannot write %s: %s", path, strerror(errno));
    return DSIM_OK;
}

/* ---- reading back ---- */

typedef struct fl_call {
    dsim_coll_fp fp;
    int state; /* dsim_fr_state */
    int waiting_for;
    char error[48];
} fl_call;

typedef struct fl_rank {
    int rank;
    uint64_t calls;
    size_t n;
    fl_call *c;     /* by seq, the last n calls: seq calls - n + 1 .. calls */
    char left[256]; /* where the watchdog left it running ("": it returned) */
} fl_rank;

static int fl_state_of(const char *s)
{
    for (int k = 0; k < DSIM_FR_STATE_COUNT; k++)
        if (s && strcmp(s, dsim_fr_state_name((dsim_fr_state)k)) == 0)
            return k;
    return DSIM_FR_SCHEDULED;
}

static dsim_err fl_read(const char *path, json_t **rootp, fl_rank **out, int *nout)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        FILE *f = fopen(path, "r");
        if (!f)
            return DSIM_ERR(DSIM_ENOENT, -1,
                            "no flight records at %s: a run writes them only when it fails (a "
                            "timeout, an abort, a crash or a failed check), and only with a "
                            "results store",
                            path);
        fclose(f);
        return DSIM_ERR(DSIM_EPROTO, -1, "%s:%d:%d: not a flight record file: %s", path, je.line,
                        je.column, je.text);
    }
    json_t *ranks = json_object_get(root, "ranks");
    if (!json_is_array(ranks) || json_array_size(ranks) == 0) {
        json_decref(root);
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: no \"ranks\" array", path);
    }
    int n = (int)json_array_size(ranks);
    fl_rank *rk = calloc((size_t)n, sizeof *rk);
    if (!rk) {
        json_decref(root);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading %s", path);
    }
    for (int i = 0; i < n; i++) {
        json_t *r = json_array_get(ranks, (size_t)i);
        json_t *es = json_object_get(r, "entries");
        rk[i].rank = (int)json_integer_value(json_object_get(r, "rank"));
        rk[i].calls = (uint64_t)json_integer_value(json_object_get(r, "calls"));
        const char *lr = json_string_value(json_object_get(r, "left_running"));
        snprintf(rk[i].left, sizeof rk[i].left, "%s", lr ? lr : "");
        size_t ne = json_is_array(es) ? json_array_size(es) : 0;
        rk[i].c = calloc(ne ? ne : 1, sizeof *rk[i].c);
        if (!rk[i].c)
            break;
        for (size_t k = 0; k < ne; k++) {
            json_t *e = json_array_get(es, k), *ds = json_object_get(e, "dsim");
            json_t *fj = json_object_get(ds, "fingerprint");
            fl_call *c = &rk[i].c[rk[i].n++];
            c->fp.magic = DSIM_COLL_FP_MAGIC;
            c->fp.comm_id = (uint32_t)json_integer_value(json_object_get(fj, "comm_id"));
            c->fp.seq = (uint64_t)json_integer_value(json_object_get(e, "collective_seq_id"));
            c->fp.coll = (uint8_t)json_integer_value(json_object_get(fj, "coll"));
            c->fp.op = (uint8_t)json_integer_value(json_object_get(fj, "op"));
            c->fp.dtype = (uint8_t)json_integer_value(json_object_get(fj, "dtype"));
            c->fp.count = (uint64_t)json_integer_value(json_object_get(fj, "count"));
            c->fp.root = (int32_t)json_integer_value(json_object_get(fj, "root"));
            c->fp.algo = (uint8_t)json_integer_value(json_object_get(fj, "algo"));
            c->state = fl_state_of(json_string_value(json_object_get(e, "state")));
            json_t *w = json_object_get(ds, "waiting_for");
            c->waiting_for = json_is_integer(w) ? (int)json_integer_value(w) : -1;
            const char *er = json_string_value(json_object_get(ds, "error"));
            snprintf(c->error, sizeof c->error, "%s", er ? er : "");
        }
    }
    *rootp = root;
    *out = rk;
    *nout = n;
    return DSIM_OK;
}

/* Rank r's call of number seq, or NULL when its recorder does not hold it
 * (before the kept window, or never made: seq > calls). */
static const fl_call *fl_at(const fl_rank *r, uint64_t seq)
{
    if (seq == 0 || seq > r->calls || r->calls - seq >= r->n)
        return NULL;
    return &r->c[r->n - 1 - (size_t)(r->calls - seq)];
}

static const fl_call *fl_last_done(const fl_rank *r)
{
    for (size_t k = r->n; k-- > 0;)
        if (r->c[k].state == DSIM_FR_COMPLETED)
            return &r->c[k];
    return NULL;
}

/* "ranks 0, 1 and 2" / "rank 3" from a list. */
static void fl_ranks(FILE *out, const int *v, int n)
{
    fprintf(out, "%s ", n == 1 ? "rank" : "ranks");
    for (int i = 0; i < n; i++)
        fprintf(out, "%s%d", i == 0 ? "" : i + 1 == n ? " and " : ", ", v[i]);
}

/* The call numbers the recorders hold (*lo .. *hi; *lo UINT64_MAX: none),
 * and the report's first lines. */
static void fl_header(FILE *out, json_t *root, const fl_rank *rk, int n, uint64_t *lo, uint64_t *hi)
{
    *lo = UINT64_MAX;
    *hi = 0;
    for (int i = 0; i < n; i++) {
        if (rk[i].n && rk[i].calls - rk[i].n + 1 < *lo)
            *lo = rk[i].calls - rk[i].n + 1;
        if (rk[i].calls > *hi)
            *hi = rk[i].calls;
    }
    const char *err = json_string_value(json_object_get(root, "error"));
    json_t *rid = json_object_get(root, "run_id");
    fprintf(out, "run %" PRId64 " (%s): %d ranks, calls %" PRIu64 "..%" PRIu64 " recorded\n",
            (int64_t)json_integer_value(rid),
            json_string_value(json_object_get(root, "scenario"))
                ? json_string_value(json_object_get(root, "scenario"))
                : "?",
            n, *lo == UINT64_MAX ? 0 : *lo, *hi);
    if (err)
        fprintf(out, "the run failed: %s\n", err);
}

/* The call to explain: the first one the ranks disagree about, if any (an
 * abort it caused can leave slower ranks unfinished in earlier calls: they
 * are its victims, not its cause); else the first one not every rank
 * completed; 0 when there is none. */
static uint64_t fl_pick(const fl_rank *rk, int n, uint64_t lo, uint64_t hi, bool *disagree)
{
    uint64_t s = 0;
    for (uint64_t q = lo; lo != UINT64_MAX && q <= hi && !s; q++) {
        const fl_call *first = NULL;
        for (int i = 0; i < n && !s; i++) {
            const fl_call *c = fl_at(&rk[i], q);
            if (c && first && dsim_coll_fp_diff(&c->fp, &first->fp, NULL, 0) != 0)
                s = q;
            else if (c && !first)
                first = c;
        }
    }
    *disagree = s != 0;
    for (uint64_t q = lo; lo != UINT64_MAX && q <= hi && !s; q++)
        for (int i = 0; i < n && !s; i++) {
            const fl_call *c = fl_at(&rk[i], q);
            if (q > rk[i].calls || (c && c->state != DSIM_FR_COMPLETED))
                s = q;
        }
    return s;
}

/* The call most ranks made under number s. */
static const fl_call *fl_majority(const fl_rank *rk, int n, uint64_t s)
{
    const fl_call *ref = NULL;
    int best = 0;
    for (int i = 0; i < n; i++) {
        const fl_call *c = fl_at(&rk[i], s);
        if (!c)
            continue;
        int same = 0;
        for (int j = 0; j < n; j++) {
            const fl_call *d = fl_at(&rk[j], s);
            same += d && dsim_coll_fp_diff(&c->fp, &d->fp, NULL, 0) == 0;
        }
        if (same > best) {
            best = same;
            ref = c;
        }
    }
    return ref;
}

/* One line per rank about call s, against the majority's ref; the ranks
 * that completed it go to done, those that never made it to miss. */
static void fl_rank_lines(FILE *out, const fl_rank *rk, int n, uint64_t s, const fl_call *ref,
                          int *done, int *nd, int *miss, int *nm, dsim_desync *ds)
{
    char b[160], diff[96];
    for (int i = 0; i < n; i++) {
        const fl_call *c = fl_at(&rk[i], s);
        if (s > rk[i].calls) {
            miss[(*nm)++] = rk[i].rank;
        } else if (c && ref && dsim_coll_fp_diff(&c->fp, &ref->fp, NULL, 0) != 0) {
            ds->n_different++;
            dsim_coll_fp_diff(&c->fp, &ref->fp, diff, sizeof diff);
            fprintf(out, "  rank %d called %s instead (%s %s)%s%s\n", rk[i].rank,
                    dsim_coll_fp_str(&c->fp, b, sizeof b), diff,
                    strchr(diff, ' ') && strstr(diff, " and ") ? "differ" : "differs",
                    c->error[0] ? ": " : "", c->error);
        } else if (c && c->state == DSIM_FR_COMPLETED) {
            done[(*nd)++] = rk[i].rank;
        } else if (c) {
            if (c->error[0])
                ds->n_failed++;
            else
                ds->n_waiting++;
            fprintf(out, "  rank %d %s it", rk[i].rank,
                    c->state == DSIM_FR_STARTED ? "started" : "entered");
            if (c->waiting_for >= 0)
                fprintf(out, " and was waiting for rank %d", c->waiting_for);
            fprintf(out, "%s%s\n", c->error[0] ? "; it ended with: " : ", not done", c->error);
        } else if (rk[i].left[0]) {
            ds->n_waiting++;
            fprintf(out,
                    "  rank %d began it (call %" PRIu64 " of its %" PRIu64
                    ") and was left running by the watchdog, its recorder not read: %s\n",
                    rk[i].rank, s, rk[i].calls, rk[i].left);
        } else {
            fprintf(out, "  rank %d: call #%" PRIu64 " is older than its recorder holds\n",
                    rk[i].rank, s);
        }
    }
}

/* The ranks that never made the call, and where each of them was. */
static void fl_missing(FILE *out, const fl_rank *rk, int n, const int *miss, int nm)
{
    char b[160];
    fprintf(out, "  ");
    fl_ranks(out, miss, nm);
    fprintf(out, " never called it:");
    for (int k = 0; k < nm; k++) {
        const fl_rank *r = NULL;
        for (int i = 0; i < n; i++)
            if (rk[i].rank == miss[k])
                r = &rk[i];
        const fl_call *last = r && r->n ? &r->c[r->n - 1] : NULL;
        if (last) {
            fprintf(out, "%s rank %d's last call was #%" PRIu64 " (%s, %s", k ? ";" : "", miss[k],
                    last->fp.seq, dsim_coll_fp_str(&last->fp, b, sizeof b),
                    dsim_fr_state_name((dsim_fr_state)last->state));
            if (last->state != DSIM_FR_COMPLETED && last->waiting_for >= 0)
                fprintf(out, ", waiting for rank %d", last->waiting_for);
            if (last->error[0])
                fprintf(out, ", ended with: %s", last->error);
            fprintf(out, ")");
        } else if (r && r->left[0])
            fprintf(out,
                    "%s rank %d was left running by the watchdog after %" PRIu64
                    " call%s, its recorder not read: %s",
                    k ? ";" : "", miss[k], r->calls, r->calls == 1 ? "" : "s", r->left);
        else
            fprintf(out, "%s rank %d made no collective call", k ? ";" : "", miss[k]);
    }
    fprintf(out, "\n");
}

static void fl_verdict(FILE *out, uint64_t s, const dsim_desync *ds, int nm)
{
    fprintf(out, "\n");
    if (ds->n_different)
        fprintf(out,
                "verdict: the ranks disagree about call #%" PRIu64
                ": a rank called another collective (or the same one with other "
                "arguments); look at the strategy's code path on the ranks named above%s\n",
                s,
                nm ? " (the ranks that never called it were still in an earlier call when "
                     "the job was aborted)"
                   : "");
    else if (nm)
        fprintf(out,
                "verdict: call #%" PRIu64 " was never made by the rank%s named above: %s "
                "stuck before it (in its own code, or in a call the others did not make); "
                "the other ranks waited for %s\n",
                s, nm == 1 ? "" : "s", nm == 1 ? "it was" : "they were", nm == 1 ? "it" : "them");
    else
        fprintf(out,
                "verdict: every rank joined call #%" PRIu64
                " but it did not complete everywhere: a lost message, a dead or paused "
                "peer, or a timeout too short (see who waited for whom above)\n",
                s);
}

/* What each rank did about call s, and the verdict. */
static void fl_explain(FILE *out, const fl_rank *rk, int n, uint64_t s, bool disagree,
                       dsim_desync *ds)
{
    char a[160];
    const fl_call *ref = fl_majority(rk, n, s);
    fprintf(out, "\nthe first collective %s: #%" PRIu64 ", %s\n",
            disagree ? "the ranks disagree about" : "not every rank completed", s,
            ref ? dsim_coll_fp_str(&ref->fp, a, sizeof a) : "?");
    int *done = calloc((size_t)n, sizeof(int)), nd = 0;
    int *miss = calloc((size_t)n, sizeof(int)), nm = 0;
    if (done && miss)
        fl_rank_lines(out, rk, n, s, ref, done, &nd, miss, &nm, ds);
    if (nd) {
        fprintf(out, "  ");
        fl_ranks(out, done, nd);
        fprintf(out, " completed it\n");
    }
    if (nm) {
        ds->n_missing = nm;
        fl_missing(out, rk, n, miss, nm);
    }
    fl_verdict(out, s, ds, nm);
    free(done);
    free(miss);
}

/* No recorded call is unfinished: where the ranks the watchdog left
 * running were, or that the failure lies outside the collectives. */
static void fl_no_call(FILE *out, const fl_rank *rk, int n)
{
    int n_left = 0;
    for (int i = 0; i < n; i++)
        n_left += rk[i].left[0] != '\0';
    if (!n_left) {
        fprintf(out, "\nevery rank completed every recorded collective: no desynchronisation; "
                     "the failure happened outside the collectives (see the run's error)\n");
        return;
    }
    /* Every recorder read is complete, and those that would say more were
     * not read: say where their ranks were. */
    fprintf(out,
            "\nno recorded collective is left unfinished, but the watchdog left %d rank%s "
            "running, whose recorder%s could not be read:\n",
            n_left, n_left == 1 ? "" : "s", n_left == 1 ? "" : "s");
    for (int i = 0; i < n; i++)
        if (rk[i].left[0])
            fprintf(out, "  rank %d: %s\n", rk[i].rank, rk[i].left);
    fprintf(out,
            "\nverdict: the rank%s above never returned: stuck in %s own code or in "
            "the collective named, which no abort could end\n",
            n_left == 1 ? "" : "s", n_left == 1 ? "its" : "their");
}

static void fl_last_calls(FILE *out, const fl_rank *rk, int n)
{
    char a[160];
    fprintf(out, "\nthe last call each rank completed:\n");
    for (int i = 0; i < n; i++) {
        const fl_call *c = fl_last_done(&rk[i]);
        if (c)
            fprintf(out, "  rank %d: #%" PRIu64 " %s\n", rk[i].rank, c->fp.seq,
                    dsim_coll_fp_str(&c->fp, a, sizeof a));
        else if (rk[i].left[0])
            fprintf(out, "  rank %d: not read (left running after %" PRIu64 " calls)\n", rk[i].rank,
                    rk[i].calls);
        else
            fprintf(out, "  rank %d: none recorded\n", rk[i].rank);
    }
}

dsim_err dsim_flight_desync(const char *path, FILE *out, dsim_desync *sum)
{
    json_t *root = NULL;
    fl_rank *rk = NULL;
    int n = 0;
    DSIM_CHECK(fl_read(path, &root, &rk, &n));
    dsim_desync ds;
    memset(&ds, 0, sizeof ds);
    ds.ranks = n;
    uint64_t lo, hi;
    fl_header(out, root, rk, n, &lo, &hi);
    bool disagree = false;
    uint64_t s = fl_pick(rk, n, lo, hi, &disagree);
    ds.seq = s;
    if (!s)
        fl_no_call(out, rk, n);
    else
        fl_explain(out, rk, n, s, disagree, &ds);
    fl_last_calls(out, rk, n);
    for (int i = 0; i < n; i++)
        free(rk[i].c);
    free(rk);
    json_decref(root);
    if (sum)
        *sum = ds;
    return DSIM_OK;
}
