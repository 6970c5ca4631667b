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
    case DSIM_COLL_SPLIT:
        return "dsim:comm_split";
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

/* A communicator's name in the records: "world" for the replicas' world
 * communicator, "split of 1, color 0" or "group of 1" for a sub-communicator
 * of the strategy's. */
static const char *fl_pg_name(const dsim_fr_dump *d, char *buf, size_t cap)
{
    if (d->origin == DSIM_COMM_ORIGIN_SPLIT)
        snprintf(buf, cap, "split of %u, color %d", (unsigned)d->parent_id, d->color);
    else if (d->origin == DSIM_COMM_ORIGIN_GROUP)
        snprintf(buf, cap, "group of %u", (unsigned)d->parent_id);
    else
        snprintf(buf, cap, "world");
    return buf;
}

/* The world rank of d's rank. */
static int fl_world_rank(const dsim_fr_dump *d)
{
    return d->origin != DSIM_COMM_ORIGIN_CREATE ? d->world_rank : d->rank;
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
    char pgid[16], pgn[64];
    snprintf(pgid, sizeof pgid, "%" PRIu32, d->comm_id);
    json_t *pg = json_pack("[s, s]", pgid, fl_pg_name(d, pgn, sizeof pgn));
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

/* pg_config: one entry per communicator, its members' world ranks in its
 * ranks' order ("[5, 6, 7, 4]"). */
static json_t *fl_pg_config(const dsim_train_result *res)
{
    json_t *cfg = json_object();
    for (int r = 0; cfg && r < res->n_flight; r++) {
        const dsim_fr_dump *d = &res->flight[r];
        char pgid[16], name[64], desc[128], members[512] = "[";
        snprintf(pgid, sizeof pgid, "%" PRIu32, d->comm_id);
        if (json_object_get(cfg, pgid))
            continue;
        for (int k = 0; k < d->size; k++) {
            size_t ml = strlen(members);
            int wr = d->world_ranks ? d->world_ranks[k] : k;
            if (ml + 16 < sizeof members)
                snprintf(members + ml, sizeof members - ml, "%s%d", k ? ", " : "", wr);
            else if (ml + 5 < sizeof members && !strstr(members, "..."))
                snprintf(members + ml, sizeof members - ml, ", ...");
        }
        snprintf(members + strlen(members), sizeof members - strlen(members), "]");
        fl_pg_name(d, name, sizeof name);
        if (d->origin == DSIM_COMM_ORIGIN_CREATE)
            snprintf(desc, sizeof desc, "every replica of the job");
        else
            snprintf(desc, sizeof desc, "the strategy's sub-communicator %" PRIu32 " (%s)",
                     d->comm_id, name);
        json_object_set_new(
            cfg, pgid, json_pack("{s:s, s:s, s:s}", "name", name, "desc", desc, "ranks", members));
    }
    return cfg;
}

dsim_err dsim_flight_write(const char *path, uint64_t run_id, const char *scenario,
                           const dsim_train_result *res, const char *error, int64_t timeout_ns)
{
    if (!path || !res)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_flight_write: path or result is NULL");
    if (!res->flight || res->n_flight <= 0)
        return DSIM_ERR(DSIM_ENOENT, -1, "the run kept no flight records (it never formed)");
    json_t *ranks = json_array();
    for (int r = 0; r < res->n_flight; r++) {
        const dsim_fr_dump *d = &res->flight[r];
        json_t *entries = json_array();
        for (size_t i = 0; entries && i < d->n; i++)
            json_array_append_new(entries,
                                  fl_entry(d, &d->entries[i], d->calls - d->n + i, timeout_ns));
        /* A replica the watchdog left running: its recorder was not read
         * (its thread may still write it); where it was stands instead. */
        char left[256] = "";
        for (size_t k = 0; k < res->n_stuck && res->stuck && d->origin == DSIM_COMM_ORIGIN_CREATE;
             k++)
            if (res->stuck[k].where.server < 0 && res->stuck[k].where.replica == d->rank)
                dsim_train_stuck_describe(&res->stuck[k], left, sizeof left);
        /* Calls made and none kept: the recorder was not read, which the
         * driver does only for a replica it left running (a worker process
         * reports that one without saying where it was). */
        if (!left[0] && d->calls > 0 && d->n == 0)
            snprintf(left, sizeof left,
                     "replica %d, in or after its call %" PRIu64
                     " (its worker process did not say where)",
                     fl_world_rank(d), d->calls);
        json_array_append_new(ranks,
                              json_pack("{s:i, s:I, s:i, s:I, s:o, s:s?}", "rank", d->rank, "pg_id",
                                        (json_int_t)d->comm_id, "world_rank", fl_world_rank(d),
                                        "calls", (json_int_t)d->calls, "entries", entries,
                                        "left_running", left[0] ? left : NULL));
    }
    json_t *root = json_pack("{s:s, s:I, s:s?, s:s?, s:s, s:o, s:o}", "version", "2.4", "run_id",
                             (json_int_t)run_id, "scenario", scenario, "error",
                             error && *error ? error : NULL, "clock",
                             "ns on the run's runtime clock (CLOCK_MONOTONIC for the threads "
                             "engine)",
                             "pg_config", fl_pg_config(res), "ranks", ranks);
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
    int rank;  /* in its communicator */
    int world; /* its world rank (the replica) */
    uint32_t pg;
    uint64_t calls;
    size_t n;
    fl_call *c;     /* by seq, the last n calls: seq calls - n + 1 .. calls */
    char left[256]; /* where the watchdog left it running ("": it returned) */
} fl_rank;

/* One communicator's records: the world's, or a sub-communicator's. */
typedef struct fl_group {
    uint32_t pg;
    int sub;       /* a sub-communicator of the strategy's */
    char name[96]; /* "sub-communicator 2913746501 (split of 1, color 0)" */
    fl_rank *rk;   /* its ranks' records, by rank (not owned) */
    int n;
    int *world; /* [nworld]: world rank of each rank, -1 unknown */
    int nworld;
} fl_group;

static int fl_state_of(const char *s)
{
    for (int k = 0; k < DSIM_FR_STATE_COUNT; k++)
        if (s && strcmp(s, dsim_fr_state_name((dsim_fr_state)k)) == 0)
            return k;
    return DSIM_FR_SCHEDULED;
}

static void fl_read_entries(fl_rank *r, json_t *es)
{
    size_t ne = json_is_array(es) ? json_array_size(es) : 0;
    r->c = calloc(ne ? ne : 1, sizeof *r->c);
    if (!r->c)
        return;
    for (size_t k = 0; k < ne; k++) {
        json_t *e = json_array_get(es, k), *ds = json_object_get(e, "dsim");
        json_t *fj = json_object_get(ds, "fingerprint");
        fl_call *c = &r->c[r->n++];
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
        rk[i].rank = (int)json_integer_value(json_object_get(r, "rank"));
        json_t *w = json_object_get(r, "world_rank"), *pg = json_object_get(r, "pg_id");
        rk[i].world = json_is_integer(w) ? (int)json_integer_value(w) : rk[i].rank;
        rk[i].pg = json_is_integer(pg) ? (uint32_t)json_integer_value(pg) : 1u;
        rk[i].calls = (uint64_t)json_integer_value(json_object_get(r, "calls"));
        const char *lr = json_string_value(json_object_get(r, "left_running"));
        snprintf(rk[i].left, sizeof rk[i].left, "%s", lr ? lr : "");
        fl_read_entries(&rk[i], json_object_get(r, "entries"));
        if (!rk[i].c)
            break;
    }
    *rootp = root;
    *out = rk;
    *nout = n;
    return DSIM_OK;
}

static int fl_rank_cmp(const void *a, const void *b)
{
    const fl_rank *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The records grouped by communicator, in the order the file first names
 * each (the world's first); groups[k].rk are copies of the records. */
static int fl_groups(json_t *root, const fl_rank *rk, int n, fl_group **out)
{
    fl_group *g = calloc((size_t)n, sizeof *g);
    int ng = 0;
    if (!g)
        return 0;
    json_t *cfg = json_object_get(root, "pg_config");
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < ng && g[k].pg != rk[i].pg)
            k++;
        if (k == ng) {
            g[ng].pg = rk[i].pg;
            g[ng].rk = calloc((size_t)n, sizeof *g[ng].rk);
            if (!g[ng].rk)
                break;
            char pgid[16];
            snprintf(pgid, sizeof pgid, "%" PRIu32, rk[i].pg);
            const char *name =
                json_string_value(json_object_get(json_object_get(cfg, pgid), "name"));
            g[ng].sub = name && strcmp(name, "world") != 0;
            if (g[ng].sub)
                snprintf(g[ng].name, sizeof g[ng].name, "sub-communicator %" PRIu32 " (%s)",
                         rk[i].pg, name);
            else
                snprintf(g[ng].name, sizeof g[ng].name, "communicator %" PRIu32, rk[i].pg);
            ng++;
        }
        g[k].rk[g[k].n++] = rk[i];
    }
    for (int k = 0; k < ng; k++) {
        qsort(g[k].rk, (size_t)g[k].n, sizeof *g[k].rk, fl_rank_cmp);
        int mx = 0;
        for (int i = 0; i < g[k].n; i++)
            if (g[k].rk[i].rank + 1 > mx)
                mx = g[k].rk[i].rank + 1;
        g[k].world = malloc((size_t)(mx ? mx : 1) * sizeof *g[k].world);
        g[k].nworld = g[k].world ? mx : 0;
        for (int i = 0; i < g[k].nworld; i++)
            g[k].world[i] = -1;
        for (int i = 0; i < g[k].n && g[k].world; i++)
            g[k].world[g[k].rk[i].rank] = g[k].rk[i].world;
    }
    *out = g;
    return ng;
}

static void fl_groups_free(fl_group *g, int ng)
{
    for (int k = 0; k < ng; k++) {
        free(g[k].rk);
        free(g[k].world);
    }
    free(g);
}

/* "rank 5" on the world, "rank 1 (world rank 5)" on a sub-communicator. */
static const char *fl_rn(const fl_group *g, int r, char *buf, size_t cap)
{
    if (g->sub && r >= 0 && r < g->nworld && g->world[r] >= 0)
        snprintf(buf, cap, "rank %d (world rank %d)", r, g->world[r]);
    else
        snprintf(buf, cap, "rank %d", r);
    return buf;
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

/* "ranks 0, 1 and 2" / "rank 3" / "ranks 1 (world rank 5) and 2 (world
 * rank 6)" from a list. */
static void fl_ranks(FILE *out, const fl_group *g, const int *v, int n)
{
    char b[48];
    fprintf(out, "%s ", n == 1 ? "rank" : "ranks");
    for (int i = 0; i < n; i++)
        fprintf(out, "%s%s",
                i == 0       ? ""
                : i + 1 == n ? " and "
                             : ", ",
                fl_rn(g, v[i], b, sizeof b) + 5);
}

/* The call numbers a group's recorders hold (*lo .. *hi; *lo UINT64_MAX:
 * none). */
static void fl_window(const fl_group *g, uint64_t *lo, uint64_t *hi)
{
    *lo = UINT64_MAX;
    *hi = 0;
    for (int i = 0; i < g->n; i++) {
        const fl_rank *r = &g->rk[i];
        if (r->n && r->calls - r->n + 1 < *lo)
            *lo = r->calls - r->n + 1;
        if (r->calls > *hi)
            *hi = r->calls;
    }
}

/* The report's first lines. */
static void fl_header(FILE *out, json_t *root, const fl_group *w, int ng)
{
    uint64_t lo, hi;
    fl_window(w, &lo, &hi);
    const char *err = json_string_value(json_object_get(root, "error"));
    json_t *rid = json_object_get(root, "run_id");
    const char *sc = json_string_value(json_object_get(root, "scenario"));
    fprintf(out, "run %" PRId64 " (%s): %d ranks, calls %" PRIu64 "..%" PRIu64 " recorded",
            (int64_t)json_integer_value(rid), sc ? sc : "?", w->n, lo == UINT64_MAX ? 0 : lo, hi);
    if (ng > 1)
        fprintf(out, "; and %d sub-communicator%s of the strategy's", ng - 1, ng == 2 ? "" : "s");
    fprintf(out, "\n");
    if (err)
        fprintf(out, "the run failed: %s\n", err);
}

/* The call to explain: the first one the ranks disagree about, if any (an
 * abort it caused can leave slower ranks unfinished in earlier calls: they
 * are its victims, not its cause); else the first one not every rank
 * completed; 0 when there is none. */
static uint64_t fl_pick(const fl_group *g, bool *disagree)
{
    const fl_rank *rk = g->rk;
    int n = g->n;
    uint64_t lo, hi, s = 0;
    fl_window(g, &lo, &hi);
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
static const fl_call *fl_majority(const fl_group *g, uint64_t s)
{
    const fl_call *ref = NULL;
    int best = 0;
    for (int i = 0; i < g->n; i++) {
        const fl_call *c = fl_at(&g->rk[i], s);
        if (!c)
            continue;
        int same = 0;
        for (int j = 0; j < g->n; j++) {
            const fl_call *d = fl_at(&g->rk[j], s);
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
static void fl_rank_lines(FILE *out, const fl_group *g, uint64_t s, const fl_call *ref, int *done,
                          int *nd, int *miss, int *nm, dsim_desync *ds)
{
    char b[160], diff[96], rn[48], wn[48];
    for (int i = 0; i < g->n; i++) {
        const fl_rank *r = &g->rk[i];
        const fl_call *c = fl_at(r, s);
        fl_rn(g, r->rank, rn, sizeof rn);
        if (s > r->calls) {
            miss[(*nm)++] = r->rank;
        } else if (c && ref && dsim_coll_fp_diff(&c->fp, &ref->fp, NULL, 0) != 0) {
            ds->n_different++;
            dsim_coll_fp_diff(&c->fp, &ref->fp, diff, sizeof diff);
            fprintf(out, "  %s called %s instead (%s %s)%s%s\n", rn,
                    dsim_coll_fp_str(&c->fp, b, sizeof b), diff,
                    strchr(diff, ' ') && strstr(diff, " and ") ? "differ" : "differs",
                    c->error[0] ? ": " : "", c->error);
        } else if (c && c->state == DSIM_FR_COMPLETED) {
            done[(*nd)++] = r->rank;
        } else if (c) {
            if (c->error[0])
                ds->n_failed++;
            else
                ds->n_waiting++;
            fprintf(out, "  %s %s it", rn, c->state == DSIM_FR_STARTED ? "started" : "entered");
            if (c->waiting_for >= 0)
                fprintf(out, " and was waiting for %s", fl_rn(g, c->waiting_for, wn, sizeof wn));
            fprintf(out, "%s%s\n", c->error[0] ? "; it ended with: " : ", not done", c->error);
        } else if (r->left[0]) {
            ds->n_waiting++;
            fprintf(out,
                    "  %s began it (call %" PRIu64 " of its %" PRIu64
                    ") and was left running by the watchdog, its recorder not read: %s\n",
                    rn, s, r->calls, r->left);
        } else {
            fprintf(out, "  %s: call #%" PRIu64 " is older than its recorder holds\n", rn, s);
        }
    }
}

/* The ranks that never made the call, and where each of them was. */
static void fl_missing(FILE *out, const fl_group *g, const int *miss, int nm)
{
    char b[160], rn[48], wn[48];
    fprintf(out, "  ");
    fl_ranks(out, g, miss, nm);
    fprintf(out, " never called it:");
    for (int k = 0; k < nm; k++) {
        const fl_rank *r = NULL;
        for (int i = 0; i < g->n; i++)
            if (g->rk[i].rank == miss[k])
                r = &g->rk[i];
        const fl_call *last = r && r->n ? &r->c[r->n - 1] : NULL;
        fl_rn(g, miss[k], rn, sizeof rn);
        if (last) {
            fprintf(out, "%s %s's last call was #%" PRIu64 " (%s, %s", k ? ";" : "", rn,
                    last->fp.seq, dsim_coll_fp_str(&last->fp, b, sizeof b),
                    dsim_fr_state_name((dsim_fr_state)last->state));
            if (last->state != DSIM_FR_COMPLETED && last->waiting_for >= 0)
                fprintf(out, ", waiting for %s", fl_rn(g, last->waiting_for, wn, sizeof wn));
            if (last->error[0])
                fprintf(out, ", ended with: %s", last->error);
            fprintf(out, ")");
        } else if (r && r->left[0])
            fprintf(out,
                    "%s %s was left running by the watchdog after %" PRIu64
                    " call%s, its recorder not read: %s",
                    k ? ";" : "", rn, r->calls, r->calls == 1 ? "" : "s", r->left);
        else
            fprintf(out, "%s %s made no collective call", k ? ";" : "", rn);
    }
    fprintf(out, "\n");
}

static void fl_verdict(FILE *out, const fl_group *g, uint64_t s, const dsim_desync *ds, int nm)
{
    char on[140] = "";
    if (g->sub)
        snprintf(on, sizeof on, " on %s", g->name);
    fprintf(out, "\n");
    if (ds->n_different)
        fprintf(out,
                "verdict: the ranks disagree about call #%" PRIu64
                "%s: a rank called another collective (or the same one with other "
                "arguments); look at the strategy's code path on the ranks named above%s\n",
                s, on,
                nm ? " (the ranks that never called it were still in an earlier call when "
                     "the job was aborted)"
                   : "");
    else if (nm)
        fprintf(out,
                "verdict: call #%" PRIu64 "%s was never made by the rank%s named above: %s "
                "stuck before it (in its own code, or in a call the others did not make); "
                "the other ranks waited for %s\n",
                s, on, nm == 1 ? "" : "s", nm == 1 ? "it was" : "they were",
                nm == 1 ? "it" : "them");
    else
        fprintf(out,
                "verdict: every rank joined call #%" PRIu64
                "%s but it did not complete everywhere: a lost message, a dead or paused "
                "peer, or a timeout too short (see who waited for whom above)\n",
                s, on);
}

/* What each rank did about call s, and the verdict. */
static void fl_explain(FILE *out, const fl_group *g, uint64_t s, bool disagree, dsim_desync *ds)
{
    char a[160];
    const fl_call *ref = fl_majority(g, s);
    fprintf(out, "\nthe first collective %s%s%s: #%" PRIu64 ", %s\n",
            disagree ? "the ranks disagree about" : "not every rank completed",
            g->sub ? " on " : "", g->sub ? g->name : "", s,
            ref ? dsim_coll_fp_str(&ref->fp, a, sizeof a) : "?");
    if (g->sub) {
        fprintf(out, "  (its ranks are world ranks");
        for (int i = 0; i < g->nworld; i++)
            fprintf(out, "%s%d", i ? ", " : " ", g->world[i]);
        fprintf(out, ", in its order)\n");
    }
    int *done = calloc((size_t)g->n, sizeof(int)), nd = 0;
    int *miss = calloc((size_t)g->n, sizeof(int)), nm = 0;
    if (done && miss)
        fl_rank_lines(out, g, s, ref, done, &nd, miss, &nm, ds);
    if (nd) {
        fprintf(out, "  ");
        fl_ranks(out, g, done, nd);
        fprintf(out, " completed it\n");
    }
    if (nm) {
        ds->n_missing = nm;
        fl_missing(out, g, miss, nm);
    }
    fl_verdict(out, g, s, ds, nm);
    free(done);
    free(miss);
}

/* No recorded call is unfinished: where the ranks the watchdog left
 * running were, or that the failure lies outside the collectives. */
static void fl_no_call(FILE *out, const fl_group *g, int ng)
{
    int n_left = 0;
    for (int i = 0; i < g->n; i++)
        n_left += g->rk[i].left[0] != '\0';
    if (!n_left) {
        fprintf(out,
                "\nevery rank completed every recorded collective%s: no desynchronisation; "
                "the failure happened outside the collectives (see the run's error)\n",
                ng > 1 ? ", on the world and on the strategy's sub-communicators" : "");
        return;
    }
    /* Every recorder read is complete, and those that would say more were
     * not read: say where their ranks were. */
    fprintf(out,
            "\nno recorded collective is left unfinished, but the watchdog left %d rank%s "
            "running, whose recorder%s could not be read:\n",
            n_left, n_left == 1 ? "" : "s", n_left == 1 ? "" : "s");
    for (int i = 0; i < g->n; i++)
        if (g->rk[i].left[0])
            fprintf(out, "  rank %d: %s\n", g->rk[i].rank, g->rk[i].left);
    fprintf(out,
            "\nverdict: the rank%s above never returned: stuck in %s own code or in "
            "the collective named, which no abort could end\n",
            n_left == 1 ? "" : "s", n_left == 1 ? "its" : "their");
}

static void fl_last_calls(FILE *out, const fl_group *g)
{
    char a[160], rn[48];
    fprintf(out, "\nthe last call each rank completed%s%s:\n", g->sub ? " on " : "",
            g->sub ? g->name : "");
    for (int i = 0; i < g->n; i++) {
        const fl_rank *r = &g->rk[i];
        const fl_call *c = fl_last_done(r);
        fl_rn(g, r->rank, rn, sizeof rn);
        if (c)
            fprintf(out, "  %s: #%" PRIu64 " %s\n", rn, c->fp.seq,
                    dsim_coll_fp_str(&c->fp, a, sizeof a));
        else if (r->left[0])
            fprintf(out, "  %s: not read (left running after %" PRIu64 " calls)\n", rn, r->calls);
        else
            fprintf(out, "  %s: none recorded\n", rn);
    }
}

/* At most this many communicators are explained (a job with many
 * sub-communicators in trouble: the first ones say enough). */
#define FL_EXPLAIN_MAX 4

dsim_err dsim_flight_desync(const char *path, FILE *out, dsim_desync *sum)
{
    json_t *root = NULL;
    fl_rank *rk = NULL;
    int n = 0;
    DSIM_CHECK(fl_read(path, &root, &rk, &n));
    fl_group *g = NULL;
    int ng = fl_groups(root, rk, n, &g);
    if (ng == 0) {
        for (int i = 0; i < n; i++)
            free(rk[i].c);
        free(rk);
        json_decref(root);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading %s", path);
    }
    dsim_desync ds;
    memset(&ds, 0, sizeof ds);
    ds.ranks = g[0].n;
    fl_header(out, root, &g[0], ng);
    /* Communicators whose ranks disagree (the cause: the abort it made
     * leaves victims elsewhere, not explained); else those with a call
     * left unfinished; the world before the strategy's own. */
    uint64_t *pick = calloc((size_t)ng, sizeof *pick);
    bool *dis = calloc((size_t)ng, sizeof *dis);
    int explained = 0;
    for (int pass = 0; pick && dis && pass < 2 && !(pass == 1 && explained); pass++)
        for (int k = 0; k < ng && explained < FL_EXPLAIN_MAX; k++) {
            if (pass == 0)
                pick[k] = fl_pick(&g[k], &dis[k]);
            if (!pick[k] || dis[k] != (pass == 0))
                continue;
            dsim_desync one;
            memset(&one, 0, sizeof one);
            fl_explain(out, &g[k], pick[k], dis[k], &one);
            if (!explained) {
                ds.seq = pick[k];
                ds.n_missing = one.n_missing;
                ds.n_waiting = one.n_waiting;
                ds.n_different = one.n_different;
                ds.n_failed = one.n_failed;
            }
            if (g[k].sub)
                fl_last_calls(out, &g[k]);
            explained++;
        }
    if (!explained)
        fl_no_call(out, &g[0], ng);
    fl_last_calls(out, &g[0]);
    free(pick);
    free(dis);
    fl_groups_free(g, ng);
    for (int i = 0; i < n; i++)
        free(rk[i].c);
    free(rk);
    json_decref(root);
    if (sum)
        *sum = ds;
    return DSIM_OK;
}
