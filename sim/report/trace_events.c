/* dsim trace: one run as Chrome trace-event JSON (the "JSON Object Format"
 * that Perfetto's UI and chrome://tracing open).
 *
 * Layout: one process (pid 1) named after the run; thread 0 is the job
 * (events that concern the whole run), thread R+1 is replica R, thread
 * 2^20+R holds replica R's collectives (a collective may straddle a step's
 * end, and complete events on one thread must nest).
 *
 *   replica R:   B "attempt A" ... X "step S" (args: epoch, loss, reduced
 *                loss, checksum, examples) ... E; a restart starts the next
 *                attempt; faults, errors, restarts, checkpoints, phases of
 *                the replica as instant events (ph "i", scope thread)
 *   job:         the run's own events as instant events (scope global)
 *   collectives: X "op (algorithm)" with bytes and status
 *   flight records (a failed run's, thread 2^21+R): X "dsim:all_reduce #N"
 *                with the call's fingerprint, state and whom it waited for
 *   messages:    an arrow (cat "message") from each stored transport frame's
 *                send, on the sender's track, to its arrival on the
 *                receiver's: the collectives track when a call encloses the
 *                end, else the replica's own (an attempt or a cold-start
 *                phase); the store keeps them for small jobs only
 *                (sim/fault/msglog.h), at most DSIM_TRACE_MAX_MESSAGES drawn
 *   flows:       for runs of at most DSIM_TRACE_FLOW_MAX_REPLICAS replicas
 *                and DSIM_TRACE_FLOW_MAX_CALLS collectives per replica, an
 *                arrow to each call that was waiting when another replica
 *                entered the same operation, from the last such arrival
 *                (who waited for whom); only where the store holds
 *                collective times
 *
 * Timestamps are microseconds from the run's first record on its engine
 * clock. A replica with more than DSIM_TRACE_MAX_STEPS_PER_REPLICA steps
 * keeps every k-th step's slice; otherData.sampling says which. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "report.h"
#include "report_int.h"

#define TE_PID         1
#define TE_JOB_TID     0
#define TE_COLL_TID0   (1 << 20) /* above any replica's thread */
#define TE_FLIGHT_TID0 (1 << 21) /* a failed run's flight records, per replica */

static double te_us(const rp_run *r, int64_t t)
{
    return (double)(t - r->t_origin) / 1e3;
}

/* json_pack with a failure check folded into the array append. */
static bool te_add(json_t *arr, json_t *ev)
{
    return ev && json_array_append_new(arr, ev) == 0;
}

static bool te_meta(json_t *arr, const char *what, int tid, json_t *args)
{
    return te_add(arr, json_pack("{s:s, s:s, s:i, s:i, s:i, s:o}", "name", what, "ph", "M", "ts", 0,
                                 "pid", TE_PID, "tid", tid, "args", args));
}

static json_t *te_num(bool has, double v)
{
    return has && isfinite(v) ? json_real(v) : json_null();
}

/* An event's detail: its JSON when it is JSON, else the text. */
static json_t *te_detail(const char *detail)
{
    if (!detail)
        return json_null();
    json_t *j = json_loads(detail, JSON_DECODE_ANY, NULL);
    if (j && json_is_object(j))
        return j;
    json_decref(j);
    return json_string(detail);
}

static bool te_steps(json_t *arr, const rp_run *r, int k, int stride)
{
    int tid = k + 1, att = -1;
    int64_t last_end = 0;
    char name[64];
    for (size_t i = 0; i <= r->n_steps; i++) {
        const rp_step *p = i < r->n_steps ? &r->steps[i] : NULL;
        if (p && p->replica != k)
            continue;
        if (!p || p->attempt != att) {
            if (att >= 0 &&
                !te_add(arr, json_pack("{s:s, s:s, s:f, s:i, s:i}", "name", name, "ph", "E", "ts",
                                       te_us(r, last_end), "pid", TE_PID, "tid", tid)))
                return false;
            if (!p)
                break;
            att = p->attempt;
            snprintf(name, sizeof name, "attempt %d", att);
            if (!te_add(arr,
                        json_pack("{s:s, s:s, s:s, s:f, s:i, s:i}", "name", name, "cat", "attempt",
                                  "ph", "B", "ts", te_us(r, p->t0), "pid", TE_PID, "tid", tid)))
                return false;
            last_end = p->t0;
        }
        /* B/E must enclose the steps even when a later step's end is earlier
         * than an earlier one's (clocks of different processes) */
        if (p->t1 > last_end)
            last_end = p->t1;
        if (stride > 1 && p->step % stride != 0)
            continue;
        char sname[48], sum[24];
        snprintf(sname, sizeof sname, "step %" PRId64, p->step);
        snprintf(sum, sizeof sum, "%016" PRIx64, p->checksum);
        json_t *args = json_pack("{s:i, s:I, s:o, s:o, s:s?, s:I}", "epoch", p->epoch, "step",
                                 (json_int_t)p->step, "loss", te_num(p->has_loss, p->loss),
                                 "reduced_loss", te_num(p->has_reduced, p->reduced), "checksum",
                                 p->has_checksum ? sum : NULL, "examples", (json_int_t)p->examples);
        if (!te_add(arr, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", sname, "cat",
                                   "step", "ph", "X", "ts", te_us(r, p->t0), "dur",
                                   (double)(p->t1 - p->t0) / 1e3, "pid", TE_PID, "tid", tid, "args",
                                   args)))
            return false;
    }
    return true;
}

/* A cold-start phase event of a replica is drawn as a slice (before the
 * replica's first step): its length in ns, else -1. d: its detail. */
static int64_t te_phase_slice(const rp_run *r, const rp_event *e, const json_t *d)
{
    if (e->replica < 0 || e->replica >= r->n_replicas || strcmp(e->kind, "phase") != 0 ||
        !json_is_object(d))
        return -1;
    const char *ph = json_string_value(json_object_get(d, "phase"));
    json_t *dur = json_object_get(d, "dur_ns");
    if (!ph || !json_is_integer(dur) || json_integer_value(dur) < 0 ||
        !(strcmp(ph, "start") == 0 || strcmp(ph, "rendezvous") == 0 || strcmp(ph, "restore") == 0 ||
          strcmp(ph, "create_variables") == 0))
        return -1;
    return json_integer_value(dur);
}

static bool te_events(json_t *arr, const rp_run *r)
{
    for (size_t i = 0; i < r->n_events; i++) {
        const rp_event *e = &r->events[i];
        bool job = e->replica < 0 || e->replica >= r->n_replicas;
        char name[96];
        json_t *d = te_detail(e->detail);
        /* a short name: the kind and the detail's "error" or start of text */
        const char *what = NULL;
        if (json_is_object(d) && json_is_string(json_object_get(d, "error")))
            what = json_string_value(json_object_get(d, "error"));
        else if (e->detail)
            what = e->detail;
        const char *ph = json_is_object(d) ? json_string_value(json_object_get(d, "phase")) : NULL;
        int64_t dur = te_phase_slice(r, e, d);
        if (dur >= 0) {
            if (!te_add(arr, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:{s:o}}", "name", ph,
                                       "cat", "phase", "ph", "X", "ts", te_us(r, e->t), "dur",
                                       (double)dur / 1e3, "pid", TE_PID, "tid", e->replica + 1,
                                       "args", "detail", d)))
                return false;
            continue;
        }
        if (ph && !(json_is_object(d) && json_object_get(d, "error")))
            what = ph;
        snprintf(name, sizeof name, "%s%s%.60s", e->kind, what ? ": " : "", what ? what : "");
        if (!te_add(arr, json_pack("{s:s, s:s, s:s, s:s, s:f, s:i, s:i, s:{s:o}}", "name", name,
                                   "cat", e->kind, "ph", "i", "s", job ? "g" : "t", "ts",
                                   te_us(r, e->t), "pid", TE_PID, "tid",
                                   job ? TE_JOB_TID : e->replica + 1, "args", "detail", d)))
            return false;
    }
    return true;
}

static bool te_collectives(json_t *arr, const rp_run *r, bool flows, int *n_flows)
{
    for (size_t i = 0; i < r->n_colls; i++) {
        const rp_coll *c = &r->colls[i];
        char name[320]; /* a strategy's own exchange is named whole (up to 255) */
        snprintf(name, sizeof name, "%s%s%s%s", c->op, c->algorithm ? " (" : "",
                 c->algorithm ? c->algorithm : "", c->algorithm ? ")" : "");
        if (!te_add(arr, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:{s:I, s:i, s:s?}}",
                                   "name", name, "cat", "collective", "ph", "X", "ts",
                                   te_us(r, c->t0), "dur", (double)(c->t1 - c->t0) / 1e3, "pid",
                                   TE_PID, "tid", TE_COLL_TID0 + c->replica, "args", "bytes",
                                   (json_int_t)c->bytes, "status", c->status, "error", c->error)))
            return false;
    }
    /* Flows: a call b that was waiting when another replica entered the
     * same operation waited (at least) for the last such arrival a; an
     * arrow from a's entry to b's end. Matching by time, not by count,
     * holds across restarts. colls are sorted by start. */
    for (size_t j = 0; flows && j < r->n_colls; j++) {
        const rp_coll *b = &r->colls[j];
        const rp_coll *a = NULL;
        for (size_t i = j + 1; i < r->n_colls && r->colls[i].t0 <= b->t1; i++) {
            const rp_coll *c = &r->colls[i];
            if (c->replica != b->replica && strcmp(c->op, b->op) == 0 && c->t0 > b->t0)
                a = c; /* the latest so far: colls are sorted by start */
        }
        if (!a)
            continue;
        int id = ++*n_flows;
        /* s inside the late replica's call, f inside the waiting one's
         * (binding point: the enclosing slice) */
        if (!te_add(arr, json_pack("{s:s, s:s, s:s, s:i, s:f, s:i, s:i}", "name", "waited for",
                                   "cat", "wait", "ph", "s", "id", id, "ts", te_us(r, a->t0), "pid",
                                   TE_PID, "tid", TE_COLL_TID0 + a->replica)) ||
            !te_add(arr,
                    json_pack("{s:s, s:s, s:s, s:i, s:s, s:f, s:i, s:i}", "name", "waited for",
                              "cat", "wait", "ph", "f", "id", id, "bp", "e", "ts", te_us(r, b->t1),
                              "pid", TE_PID, "tid", TE_COLL_TID0 + b->replica)))
            return false;
    }
    return true;
}

/* The slices that enclose flow ends, per replica: on its collectives track
 * (sorted by start, one call after the other) and on its own track (its
 * attempts, as te_steps draws them, and its cold-start phase slices). */
typedef struct te_span {
    int64_t t0, t1;
} te_span;

typedef struct te_cover {
    te_span *coll, *own;
    size_t n_coll, n_own;
} te_cover;

static bool te_span_add(te_span **a, size_t *n, int64_t t0, int64_t t1)
{
    if (*n % 32 == 0) {
        te_span *g = realloc(*a, (*n + 32) * sizeof *g);
        if (!g)
            return false;
        *a = g;
    }
    (*a)[(*n)++] = (te_span){t0, t1};
    return true;
}

static void te_cover_free(te_cover *c, int R)
{
    for (int k = 0; c && k < R; k++) {
        free(c[k].coll);
        free(c[k].own);
    }
    free(c);
}

static te_cover *te_cover_make(const rp_run *r)
{
    int R = r->n_replicas;
    te_cover *c = calloc((size_t)(R > 0 ? R : 1), sizeof *c);
    bool ok = c != NULL;
    for (size_t i = 0; ok && i < r->n_colls; i++) {
        const rp_coll *x = &r->colls[i];
        if (x->replica >= 0 && x->replica < R)
            ok = te_span_add(&c[x->replica].coll, &c[x->replica].n_coll, x->t0, x->t1);
    }
    /* attempts: from the first step's start to the latest end before the
     * next attempt (te_steps) */
    for (int k = 0; ok && k < R; k++) {
        int att = -1;
        for (size_t i = 0; ok && i < r->n_steps; i++) {
            const rp_step *p = &r->steps[i];
            if (p->replica != k)
                continue;
            if (p->attempt != att) {
                att = p->attempt;
                ok = te_span_add(&c[k].own, &c[k].n_own, p->t0, p->t1 > p->t0 ? p->t1 : p->t0);
            } else if (p->t1 > c[k].own[c[k].n_own - 1].t1) {
                c[k].own[c[k].n_own - 1].t1 = p->t1;
            }
        }
    }
    for (size_t i = 0; ok && i < r->n_events; i++) {
        const rp_event *e = &r->events[i];
        if (e->replica < 0 || e->replica >= R || strcmp(e->kind, "phase") != 0)
            continue;
        json_t *d = te_detail(e->detail);
        int64_t dur = te_phase_slice(r, e, d);
        json_decref(d);
        if (dur >= 0)
            ok = te_span_add(&c[e->replica].own, &c[e->replica].n_own, e->t, e->t + dur);
    }
    if (!ok) {
        te_cover_free(c, R);
        return NULL;
    }
    return c;
}

/* The track of replica k whose slice encloses time t: its collectives'
 * when a call was under way, else its own; -1 when none does. */
static int te_cover_tid(const te_cover *c, int k, int64_t t)
{
    const te_cover *x = &c[k];
    size_t lo = 0, hi = x->n_coll; /* the last call that started by t */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x->coll[mid].t0 <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t j = lo; j-- > 0 && lo - j <= 2;)
        if (x->coll[j].t0 <= t && t <= x->coll[j].t1)
            return TE_COLL_TID0 + k;
    for (size_t j = 0; j < x->n_own; j++)
        if (x->own[j].t0 <= t && t <= x->own[j].t1)
            return k + 1;
    return -1;
}

/* An arrow from each stored frame's send (on the sender's track) to its
 * arrival (on the receiver's), each end bound to the slice that encloses it.
 * Not drawn: frames that never arrived and frames to or from a parameter
 * server (no track). *unbound counts the arrows with an end outside every
 * slice (given a slice of its own). */
static bool te_messages(json_t *arr, const rp_run *r, int *n_flows, int *drawn, int *lost,
                        int *no_track, int *unbound)
{
    if (!r->n_msgs)
        return true;
    te_cover *c = te_cover_make(r);
    if (!c)
        return false;
    bool ok = true;
    int R = r->n_replicas;
    for (size_t i = 0; ok && i < r->n_msgs && *drawn < DSIM_TRACE_MAX_MESSAGES; i++) {
        const rp_msg *m = &r->msgs[i];
        if (m->t0 < 0 || m->t1 < 0 || m->t1 < m->t0) {
            ++*lost;
            continue;
        }
        if (m->src < 0 || m->src >= R || m->dst < 0 || m->dst >= R) {
            ++*no_track;
            continue;
        }
        int ts = te_cover_tid(c, m->src, m->t0), tf = te_cover_tid(c, m->dst, m->t1);
        /* An end no slice encloses (a frame that arrived before its
         * receiver started, one sent or received after the replica's last
         * step) gets a slice of its own, of no length, on the replica's
         * track: outside every slice there, it nests. */
        if (ts < 0 || tf < 0)
            ++*unbound;
        if (ts < 0) {
            ts = m->src + 1;
            ok = te_add(arr, json_pack("{s:s, s:s, s:s, s:f, s:i, s:i, s:i}", "name", "frame sent",
                                       "cat", "message", "ph", "X", "ts", te_us(r, m->t0), "dur", 0,
                                       "pid", TE_PID, "tid", ts));
        }
        if (ok && tf < 0) {
            tf = m->dst + 1;
            ok = te_add(arr, json_pack("{s:s, s:s, s:s, s:f, s:i, s:i, s:i}", "name",
                                       "frame arrived", "cat", "message", "ph", "X", "ts",
                                       te_us(r, m->t1), "dur", 0, "pid", TE_PID, "tid", tf));
        }
        if (!ok)
            break;
        int id = ++*n_flows;
        ++*drawn;
        char name[64];
        snprintf(name, sizeof name, "%d -> %d", m->src, m->dst);
        json_t *args = json_pack("{s:I, s:I, s:I, s:I, s:i}", "bytes", (json_int_t)m->bytes, "comm",
                                 (json_int_t)m->comm, "tag", (json_int_t)m->tag, "seq",
                                 (json_int_t)m->seq, "attempt", m->attempt);
        ok = args &&
             te_add(arr, json_pack("{s:s, s:s, s:s, s:i, s:f, s:i, s:i, s:O}", "name", name, "cat",
                                   "message", "ph", "s", "id", id, "ts", te_us(r, m->t0), "pid",
                                   TE_PID, "tid", ts, "args", args)) &&
             te_add(arr, json_pack("{s:s, s:s, s:s, s:i, s:s, s:f, s:i, s:i, s:O}", "name", name,
                                   "cat", "message", "ph", "f", "id", id, "bp", "e", "ts",
                                   te_us(r, m->t1), "pid", TE_PID, "tid", tf, "args", args));
        json_decref(args);
    }
    te_cover_free(c, R);
    return ok;
}

/* A failed run's flight records: each recorded collective call as a slice
 * with its fingerprint (sequence number, operation, count, dtype, reduce
 * op), its state and whom it waited for; a call that never completed lasts
 * to the run's last record. */
static bool te_flights(json_t *arr, const rp_run *r)
{
    int R = r->n_replicas;
    for (int k = 0; k < R; k++) {
        bool any = false;
        for (size_t i = 0; i < r->n_flights && !any; i++)
            any = r->flights[i].replica == k;
        if (!any)
            continue;
        char tname[80];
        snprintf(tname, sizeof tname, "replica %d flight records", k);
        if (!te_meta(arr, "thread_name", TE_FLIGHT_TID0 + k, json_pack("{s:s}", "name", tname)) ||
            !te_meta(arr, "thread_sort_index", TE_FLIGHT_TID0 + k,
                     json_pack("{s:i}", "sort_index", 2 * k + 1)))
            return false;
    }
    int64_t prev_end = INT64_MIN;
    int prev_rep = -1;
    for (size_t i = 0; i < r->n_flights; i++) {
        const rp_flight *x = &r->flights[i];
        if (x->replica < 0 || x->replica >= R)
            continue;
        if (x->replica != prev_rep) {
            prev_rep = x->replica;
            prev_end = INT64_MIN;
        }
        int64_t t0 = x->t0 < prev_end ? prev_end : x->t0; /* slices of a track must not overlap */
        int64_t t1 = x->t1 >= t0 ? x->t1 : (r->t_last > t0 ? r->t_last : t0);
        prev_end = t1;
        char name[96];
        snprintf(name, sizeof name, "%s #%" PRId64, x->name, x->seq);
        json_t *args = json_pack("{s:I, s:s, s:s}", "collective_seq_id", (json_int_t)x->seq,
                                 "profiling_name", x->name, "state", x->state);
        if (!args)
            return false;
        if (x->count >= 0)
            json_object_set_new(args, "input_count", json_integer(x->count));
        if (x->dtype)
            json_object_set_new(args, "input_dtype", json_string(x->dtype));
        if (x->op)
            json_object_set_new(args, "reduce_op", json_string(x->op));
        if (x->waiting_for >= 0)
            json_object_set_new(args, "waiting_for", json_integer(x->waiting_for));
        if (x->error)
            json_object_set_new(args, "error", json_string(x->error));
        if (!te_add(arr, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", name, "cat",
                                   "flight", "ph", "X", "ts", te_us(r, t0), "dur",
                                   (double)(t1 - t0) / 1e3, "pid", TE_PID, "tid",
                                   TE_FLIGHT_TID0 + x->replica, "args", args)))
            return false;
    }
    return true;
}

static json_t *te_build(const rp_run *r)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    int R = r->n_replicas;
    char pname[256];
    snprintf(pname, sizeof pname, "run %" PRId64 ": %.200s (%s)", r->id,
             r->scenario ? r->scenario : "", r->status ? r->status : "");
    bool ok = te_meta(arr, "process_name", TE_JOB_TID, json_pack("{s:s}", "name", pname)) &&
              te_meta(arr, "thread_name", TE_JOB_TID, json_pack("{s:s}", "name", "job")) &&
              te_meta(arr, "thread_sort_index", TE_JOB_TID, json_pack("{s:i}", "sort_index", -1));
    /* the stride that keeps every replica under the cap */
    size_t most = 0;
    size_t *cnt = calloc((size_t)R + 1, sizeof *cnt);
    bool *has_coll_tid = calloc((size_t)R + 1, sizeof *has_coll_tid);
    if (!cnt || !has_coll_tid)
        ok = false;
    for (size_t i = 0; cnt && i < r->n_steps; i++)
        if (r->steps[i].replica >= 0 && r->steps[i].replica < R &&
            ++cnt[r->steps[i].replica] > most)
            most = cnt[r->steps[i].replica];
    free(cnt);
    int stride = most > DSIM_TRACE_MAX_STEPS_PER_REPLICA
                     ? (int)((most + DSIM_TRACE_MAX_STEPS_PER_REPLICA - 1) /
                             DSIM_TRACE_MAX_STEPS_PER_REPLICA)
                     : 1;
    for (size_t i = 0; i < r->n_colls; i++)
        if (has_coll_tid && r->colls[i].replica >= 0 && r->colls[i].replica < R)
            has_coll_tid[r->colls[i].replica] = true;
    for (int k = 0; ok && k < R; k++) {
        const char *host = NULL;
        int worker = -1;
        for (size_t i = 0; i < r->n_replicas_rows; i++)
            if (r->replicas[i].replica == k) {
                host = r->replicas[i].host;
                worker = r->replicas[i].worker;
            }
        char tname[160];
        if (worker >= 0)
            snprintf(tname, sizeof tname, "replica %d (worker %d%s%.100s)", k, worker,
                     host ? ", " : "", host ? host : "");
        else
            snprintf(tname, sizeof tname, "replica %d", k);
        ok = te_meta(arr, "thread_name", k + 1, json_pack("{s:s}", "name", tname)) &&
             te_meta(arr, "thread_sort_index", k + 1, json_pack("{s:i}", "sort_index", 2 * k)) &&
             te_steps(arr, r, k, stride);
        if (ok && has_coll_tid[k]) {
            snprintf(tname, sizeof tname, "replica %d collectives", k);
            ok = te_meta(arr, "thread_name", TE_COLL_TID0 + k, json_pack("{s:s}", "name", tname)) &&
                 te_meta(arr, "thread_sort_index", TE_COLL_TID0 + k,
                         json_pack("{s:i}", "sort_index", 2 * k + 1));
        }
    }
    free(has_coll_tid);
    ok = ok && te_events(arr, r);
    int n_flows = 0;
    bool flows = R <= DSIM_TRACE_FLOW_MAX_REPLICAS &&
                 r->n_colls <= (size_t)DSIM_TRACE_FLOW_MAX_CALLS * (size_t)(R > 0 ? R : 1);
    ok = ok && te_collectives(arr, r, flows, &n_flows);
    int m_drawn = 0, m_lost = 0, m_ps = 0, m_unbound = 0;
    ok = ok && te_messages(arr, r, &n_flows, &m_drawn, &m_lost, &m_ps, &m_unbound);
    ok = ok && te_flights(arr, r);
    char sampling[160];
    if (stride > 1)
        snprintf(sampling, sizeof sampling,
                 "every %d-th step's slice (the replica with most steps has %zu; at most %d "
                 "kept per replica); attempts, events and collectives are all kept",
                 stride, most, DSIM_TRACE_MAX_STEPS_PER_REPLICA);
    else
        snprintf(sampling, sizeof sampling, "none: every stored step is a slice");
    char flow_note[200];
    if (r->n_colls == 0)
        snprintf(flow_note, sizeof flow_note, "none: the run stored no collective times");
    else if (!flows)
        snprintf(flow_note, sizeof flow_note,
                 "none: drawn for at most %d replicas and %d collectives per replica",
                 DSIM_TRACE_FLOW_MAX_REPLICAS, DSIM_TRACE_FLOW_MAX_CALLS);
    else
        snprintf(flow_note, sizeof flow_note,
                 "%d: to each collective call that waited, from the last replica to enter "
                 "the same operation while it waited",
                 n_flows);
    char msg_note[512];
    const rp_metric *nl = rp_metric_find(r, "messages_not_logged");
    if (!r->n_msgs)
        snprintf(msg_note, sizeof msg_note,
                 "none: the run stored no messages (they are stored for jobs of at most %d "
                 "ranks, on the threads, sim and processes engines)",
                 DSIM_TRACE_MSG_MAX_RANKS);
    else
        snprintf(msg_note, sizeof msg_note,
                 "%d arrows from a frame's send to its arrival (cat message), of %zu frames "
                 "stored: the first %d of each link and communicator per attempt; %.0f later "
                 "frames not stored; %d never arrived; %d to or from a parameter server not "
                 "drawn; %d with an end outside the replica's slices (before it started, "
                 "after its last step: a 'frame sent' or 'frame arrived' slice of no length)%s",
                 m_drawn, r->n_msgs, DSIM_TRACE_MSG_PER_LINK, nl && nl->has_value ? nl->value : 0.0,
                 m_lost, m_ps, m_unbound,
                 m_drawn >= DSIM_TRACE_MAX_MESSAGES ? "; drawing stopped at the cap" : "");
    json_t *root = ok ? json_pack("{s:o, s:s, s:{s:I, s:s?, s:s?, s:s?, s:s?, s:s, s:s, s:s, "
                                  "s:s}}",
                                  "traceEvents", arr, "displayTimeUnit", "ms", "otherData", "run",
                                  (json_int_t)r->id, "scenario", r->scenario, "status", r->status,
                                  "engine", r->engine, "strategy", r->strategy, "clock",
                                  "engine clock, from the run's first record", "sampling", sampling,
                                  "flows", flow_note, "messages", msg_note)
                      : NULL;
    if (!ok)
        json_decref(arr);
    return root;
}

typedef struct te_args {
    const char *db;
    int64_t id;
} te_args;

static dsim_err te_render(FILE *out, void *arg)
{
    const te_args *a = arg;
    sqlite3 *h = NULL;
    dsim_err e = rp_db_open(a->db, &h);
    if (e != DSIM_OK)
        return e;
    rp_run r;
    e = rp_run_load(h, a->db, a->id, &r);
    sqlite3_close(h);
    if (e != DSIM_OK)
        return e;
    json_t *root = te_build(&r);
    rp_run_free(&r);
    if (!root)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory building the trace of run %" PRId64, a->id);
    int rc = json_dumpf(root, out, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0 || fputc('\n', out) == EOF)
        return DSIM_ERR(DSIM_EIO, -1, "writing the trace of run %" PRId64 " failed", a->id);
    return DSIM_OK;
}

dsim_err dsim_report_trace(const char *db_path, int64_t id, FILE *out)
{
    te_args a = {db_path, id};
    return te_render(out, &a);
}

dsim_err dsim_report_trace_write(const char *db_path, int64_t id, const char *out_path)
{
    te_args a = {db_path, id};
    return rp_write_file(out_path, te_render, &a);
}
