/* The scenario's faults: section (parse_int.h): each entry's kind (the
 * table of fault/kinds.c), when (one trigger), where (one scope), the
 * rules of its kind and the settings that belong to it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenario/parse_int.h"

/* dsim_phase names, and the names people also use for them. */
static const scen_name scen_phases[] = {{"start", DSIM_PHASE_START},
                                        {"rendezvous", DSIM_PHASE_RENDEZVOUS},
                                        {"connect", DSIM_PHASE_RENDEZVOUS},
                                        {"restore", DSIM_PHASE_RESTORE},
                                        {"create_variables", DSIM_PHASE_CREATE_VARIABLES},
                                        {"broadcast", DSIM_PHASE_CREATE_VARIABLES},
                                        {"compute", DSIM_PHASE_COMPUTE},
                                        {"first_step", DSIM_PHASE_COMPUTE},
                                        {"allreduce", DSIM_PHASE_ALLREDUCE},
                                        {"reduce_loss", DSIM_PHASE_REDUCE_LOSS},
                                        {"checkpoint", DSIM_PHASE_CHECKPOINT},
                                        {"finish", DSIM_PHASE_FINISH}};
static const scen_name scen_scopes[] = {
    {"one", DSIM_SCOPE_ONE}, {"all", DSIM_SCOPE_ALL}, {"majority", DSIM_SCOPE_MAJORITY}};
static const scen_name scen_directions[] = {{"to", 0}, {"from", 1}, {"both", 2}};

enum {
    F_WHAT,
    F_STEP,
    F_PHASE,
    F_TIME,
    F_PROB,
    F_RANK,
    F_WORKER,
    F_LINK,
    F_DURATION,
    F_FACTOR,
    F_ONEWAY,
    F_LOSS,
    F_CORR,
    F_PS,
    F_RANKS,
    F_SCOPE,
    F_LATENCY,
    F_JITTER,
    F_DIRECTION,
    F_AFTER,
    F_RETRANSMIT,
    F_RTO,
    F_GRACE,
    F_N
};
static const char *const scen_fault_keys[F_N] = {
    "what",  "at_step",    "at_phase", "at_time", "probability", "rank",           "worker",
    "link",  "duration",   "factor",   "one_way", "loss",        "correlation",    "ps",
    "ranks", "scope",      "latency",  "jitter",  "direction",   "after_messages", "retransmit",
    "rto",   "grace_steps"};

/* One entry of faults: as it is read, step by step. */
typedef struct scen_fe {
    scen_map m;
    char path[32];     /* "faults[2]" */
    const char *what;  /* the kind's name */
    bool on_task;      /* kill, restart, pause: it acts on a process */
    int nwhere, first; /* how many 'where' keys were given; the first */
} scen_fe;

/* The entry's keys and its kind (fault/kinds.c's table). */
static dsim_err scen_fault_what(const scen_ctx *c, const scen_node *fv, scen_fe *e, dsim_fault *f)
{
    scen_map *m = &e->m;
    DSIM_CHECK(scen_map_read(c, fv, fv, e->path, scen_fault_keys, F_N, m));
    if (!m->node)
        return scen_fail(c, fv,
                         "%s: an empty fault; write what:, when (at_step, at_phase, "
                         "at_time or probability) and where (rank, worker or link)",
                         e->path);
    dsim_src_pos pos = scen_pos(fv);
    f->line = pos.line;
    f->column = pos.column;
    f->rank = f->worker = f->ps = f->link_from = f->link_to = -1;
    f->step = -1;
    if (!m->val[F_WHAT]) {
        char kinds[256];
        return scen_fail(c, fv, "%s.what: missing; accepted: %s", e->path,
                         dsim_fault_kind_list(kinds, sizeof kinds));
    }
    scen_name kinds[DSIM_FAULT_WHAT_COUNT];
    for (int w = 0; w < DSIM_FAULT_WHAT_COUNT; w++)
        kinds[w] = (scen_name){dsim_fault_what_name((dsim_fault_what)w), w};
    int v = 0;
    DSIM_CHECK(scen_enum(c, m, F_WHAT, "a fault", kinds, DSIM_FAULT_WHAT_COUNT, &v));
    f->what = (dsim_fault_what)v;
    e->what = kinds[v].name;
    e->on_task =
        f->what == DSIM_FAULT_KILL || f->what == DSIM_FAULT_RESTART || f->what == DSIM_FAULT_PAUSE;
    return DSIM_OK;
}

/* When: one of at_step, at_phase (with at_step if you like), at_time,
 * probability, loss; and a probability's correlation. */
static dsim_err scen_fault_when(const scen_ctx *c, scen_fe *e, dsim_fault *f)
{
    const scen_map *m = &e->m;
    const char *path = e->path;
    static const int whens[] = {F_STEP, F_PHASE, F_TIME, F_PROB, F_LOSS};
    int nwhen = 0, first = -1, v = 0;
    for (size_t i = 0; i < SCEN_N(whens); i++) {
        if (!m->val[whens[i]])
            continue;
        bool pair = (first == F_STEP && whens[i] == F_PHASE);
        if (nwhen++ == 0 || pair) {
            if (first < 0)
                first = whens[i];
            continue;
        }
        return scen_fail(c, m->key[whens[i]],
                         "%s.%s: a fault has one 'when', and %s is already given; keep "
                         "one of at_step, at_phase (with at_step if you like), at_time, "
                         "probability, loss",
                         path, scen_fault_keys[whens[i]], scen_fault_keys[first]);
    }
    if (nwhen == 0 && f->what != DSIM_FAULT_STAGGER)
        return scen_fail(c, m->key[F_WHAT],
                         "%s: the %s fault has no 'when'; add one of at_step: N, at_phase: NAME, "
                         "at_time: DURATION, probability: P (loss: PERCENT for drops)",
                         path, e->what);
    if (m->val[F_PHASE]) {
        f->when = DSIM_WHEN_PHASE;
        DSIM_CHECK(scen_enum(c, m, F_PHASE, "a phase", scen_phases, SCEN_N(scen_phases), &v));
        f->phase = strdup(dsim_phase_name((dsim_phase)v));
        if (!f->phase)
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
        if (m->val[F_STEP])
            DSIM_CHECK(scen_int(c, m, F_STEP, 0, DSIM_SCEN_MAX_STEP, &f->step));
    } else if (m->val[F_STEP]) {
        f->when = DSIM_WHEN_STEP;
        DSIM_CHECK(scen_int(c, m, F_STEP, 0, DSIM_SCEN_MAX_STEP, &f->step));
    } else if (m->val[F_TIME]) {
        f->when = DSIM_WHEN_TIME;
        DSIM_CHECK(scen_duration(c, m, F_TIME, 0, &f->time_ns));
    } else if (m->val[F_PROB]) {
        f->when = DSIM_WHEN_PROBABILITY;
        DSIM_CHECK(scen_real(c, m, F_PROB, 0, 1, true, false, &f->probability));
    } else if (m->val[F_LOSS]) {
        if (f->what != DSIM_FAULT_DROP)
            return scen_fail(c, m->key[F_LOSS],
                             "%s.loss: loss is the drop fault's rate; use probability: for a %s "
                             "fault",
                             path, e->what);
        f->when = DSIM_WHEN_PROBABILITY;
        double pct = 0;
        DSIM_CHECK(scen_real(c, m, F_LOSS, 0, 100, true, false, &pct));
        f->probability = pct / 100.0;
    } else {
        f->when = DSIM_WHEN_PHASE; /* stagger: at the start */
        f->phase = strdup("start");
        if (!f->phase)
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    }
    if (m->val[F_CORR]) {
        if (f->when != DSIM_WHEN_PROBABILITY)
            return scen_fail(c, m->key[F_CORR],
                             "%s.correlation: only a fault drawn per frame (probability: or "
                             "loss:) has a correlation; remove it",
                             path);
        double pct = 0;
        DSIM_CHECK(scen_real(c, m, F_CORR, 0, 100, false, false, &pct));
        f->correlation = pct / 100.0;
    }
    return DSIM_OK;
}

/* link: [FROM, TO], two different ranks. */
static dsim_err scen_fault_link(const scen_ctx *c, const scen_fe *e, int64_t replicas,
                                dsim_fault *f)
{
    const scen_node *lv = e->m.val[F_LINK];
    char kp[64], show[96];
    snprintf(kp, sizeof kp, "%s.link", e->path);
    if (lv->kind != DSIM_YAML_SEQ || lv->n != 2)
        return scen_fail(c, lv,
                         "%s: %s is not a link; accepted: [FROM, TO], two ranks in "
                         "0..%" PRId64,
                         kp, scen_show(lv, show, sizeof show), replicas - 1);
    int64_t a, b;
    snprintf(kp, sizeof kp, "%s.link[0]", e->path);
    DSIM_CHECK(scen_int_v(c, lv->kid[0], kp, 0, replicas - 1, &a));
    snprintf(kp, sizeof kp, "%s.link[1]", e->path);
    DSIM_CHECK(scen_int_v(c, lv->kid[1], kp, 0, replicas - 1, &b));
    if (a == b)
        return scen_fail(c, lv,
                         "%s.link: [%" PRId64 ", %" PRId64 "] joins a rank to itself; "
                         "a link is two different ranks",
                         e->path, a, b);
    f->link_from = (int)a;
    f->link_to = (int)b;
    return DSIM_OK;
}

/* Where: at most one of rank, worker, ps, link, ranks, scope. */
static dsim_err scen_fault_where(const scen_ctx *c, scen_fe *e, dsim_fault *f)
{
    const dsim_train_cfg *t = &c->s->train;
    const scen_map *m = &e->m;
    const char *path = e->path;
    char kp[64], show[96];
    static const int wheres[] = {F_RANK, F_WORKER, F_PS, F_LINK, F_RANKS, F_SCOPE};
    e->first = -1;
    for (size_t i = 0; i < SCEN_N(wheres); i++) {
        if (m->val[wheres[i]]) {
            if (e->nwhere++ == 0)
                e->first = wheres[i];
            else
                return scen_fail(c, m->key[wheres[i]],
                                 "%s.%s: a fault has one 'where', and %s is already given; keep "
                                 "one of rank, worker, ps, link, ranks, scope",
                                 path, scen_fault_keys[wheres[i]], scen_fault_keys[e->first]);
        }
    }
    int64_t replicas = (int64_t)t->hosts * t->devices_per_host;
    int64_t x;
    int v = 0;
    if (m->val[F_RANK]) {
        snprintf(kp, sizeof kp, "%s.rank", path);
        DSIM_CHECK(scen_int_v(c, m->val[F_RANK], kp, 0, replicas - 1, &x));
        f->rank = (int)x;
    }
    if (m->val[F_WORKER]) {
        snprintf(kp, sizeof kp, "%s.worker", path);
        DSIM_CHECK(scen_int_v(c, m->val[F_WORKER], kp, 0, t->hosts - 1, &x));
        f->worker = (int)x;
    }
    if (m->val[F_PS]) {
        snprintf(kp, sizeof kp, "%s.ps", path);
        if (t->num_ps < 1)
            return scen_fail(c, m->key[F_PS],
                             "%s: this job has no parameter servers (cluster.ps is 0); name a "
                             "rank or worker instead",
                             kp);
        DSIM_CHECK(scen_int_v(c, m->val[F_PS], kp, 0, t->num_ps - 1, &x));
        f->ps = (int)x;
    }
    if (m->val[F_SCOPE]) {
        DSIM_CHECK(scen_enum(c, m, F_SCOPE, "a scope", scen_scopes, SCEN_N(scen_scopes), &v));
        f->scope = (dsim_fault_scope)v;
    }
    if (m->val[F_RANKS]) {
        const scen_node *lv = m->val[F_RANKS];
        snprintf(kp, sizeof kp, "%s.ranks", path);
        if (lv->kind != DSIM_YAML_SEQ || lv->n == 0 || lv->n > DSIM_SCEN_MAX_FAULT_RANKS)
            return scen_fail(c, lv,
                             "%s: %s is not a list of ranks; accepted: [R, R, ...], 1 to %d "
                             "ranks in 0..%" PRId64,
                             kp, scen_show(lv, show, sizeof show), DSIM_SCEN_MAX_FAULT_RANKS,
                             replicas - 1);
        for (size_t k = 0; k < lv->n; k++) {
            snprintf(kp, sizeof kp, "%s.ranks[%zu]", path, k);
            DSIM_CHECK(scen_int_v(c, lv->kid[k], kp, 0, replicas - 1, &x));
            f->ranks[f->n_ranks++] = (int)x;
        }
    }
    if (m->val[F_LINK])
        DSIM_CHECK(scen_fault_link(c, e, replicas, f));
    return DSIM_OK;
}

/* What a kind needs to act on, where it may act, and the preemption's own
 * rules. */
static dsim_err scen_fault_kind_rules(const scen_ctx *c, const scen_fe *e, dsim_fault *f)
{
    const scen_map *m = &e->m;
    const char *path = e->path, *what = e->what;
    if ((e->on_task || f->what == DSIM_FAULT_SLOW) && m->val[F_LINK] && f->what != DSIM_FAULT_SLOW)
        return scen_fail(c, m->key[F_LINK],
                         "%s: a %s fault acts on a process, not a link; use "
                         "rank:, worker:, ps:, ranks: or scope:",
                         path, what);
    if (e->on_task && e->nwhere == 0)
        return scen_fail(c, m->key[F_WHAT],
                         "%s: a %s fault needs a rank:, worker:, ps:, ranks: or scope: to act on",
                         path, what);
    if (f->what == DSIM_FAULT_SLOW && e->nwhere == 0)
        return scen_fail(c, m->key[F_WHAT],
                         "%s: a slow fault needs a rank: (a straggler) or a link: (a slow link)",
                         path);
    if (f->what == DSIM_FAULT_STAGGER && e->nwhere == 0)
        f->scope = DSIM_SCOPE_ALL;
    if (f->what == DSIM_FAULT_PARTITION && e->nwhere == 0)
        return scen_fail(c, m->key[F_WHAT],
                         "%s: a partition needs a link: [FROM, TO], a rank:, worker:, ranks: or "
                         "scope: to cut off",
                         path);
    if (m->val[F_PS] && f->what != DSIM_FAULT_KILL && f->what != DSIM_FAULT_PARTITION &&
        f->what != DSIM_FAULT_DELAY && f->what != DSIM_FAULT_DROP)
        return scen_fail(c, m->key[F_PS],
                         "%s.ps: a parameter server can be killed, cut off, delayed or lose "
                         "frames; a %s fault acts on replicas",
                         path, what);

    if (f->what == DSIM_FAULT_PREEMPT) {
        if (f->when != DSIM_WHEN_STEP)
            return scen_fail(c, m->key[F_WHAT],
                             "%s: a preemption notice comes at_step: N (after N steps); other "
                             "triggers are not supported for it",
                             path);
        if (e->nwhere)
            return scen_fail(c, m->key[e->first],
                             "%s.%s: a preemption notice goes to the whole job; remove it", path,
                             scen_fault_keys[e->first]);
        if (!c->s->train.checkpoint_path)
            return scen_fail(c, m->key[F_WHAT],
                             "%s: a preempted job saves a checkpoint to resume from; add "
                             "checkpoint: {path: ...}",
                             path);
    }
    if (m->val[F_GRACE] && f->what != DSIM_FAULT_PREEMPT)
        return scen_fail(c, m->key[F_GRACE], "%s.grace_steps: only a preemption has a grace", path);
    DSIM_CHECK(scen_int(c, m, F_GRACE, 0, DSIM_SCEN_MAX_GRACE_STEPS, &f->grace_steps));
    return DSIM_OK;
}

/* duration / latency, jitter, factor: the settings of some kinds only. */
static dsim_err scen_fault_lengths(const scen_ctx *c, const scen_fe *e, dsim_fault *f)
{
    const scen_map *m = &e->m;
    const char *path = e->path;
    bool has_duration = f->what != DSIM_FAULT_KILL && f->what != DSIM_FAULT_PREEMPT;
    bool needs_duration = f->what == DSIM_FAULT_STAGGER;
    if (m->val[F_DURATION] && m->val[F_LATENCY])
        return scen_fail(c, m->key[F_LATENCY],
                         "%s.latency: latency and duration say the same for a delay; keep one",
                         path);
    if (m->val[F_LATENCY] && f->what != DSIM_FAULT_DELAY)
        return scen_fail(c, m->key[F_LATENCY], "%s.latency: only a delay has a latency", path);
    if (f->what == DSIM_FAULT_DELAY && !m->val[F_DURATION] && !m->val[F_LATENCY])
        return scen_fail(c, m->key[F_WHAT], "%s: a delay fault needs latency: (e.g. 50ms)", path);
    if (m->val[F_DURATION] && !has_duration)
        return scen_fail(c, m->key[F_DURATION],
                         "%s.duration: a kill is for good; use restart with a duration for a "
                         "process that comes back",
                         path);
    if (needs_duration && !m->val[F_DURATION])
        return scen_fail(c, m->key[F_WHAT], "%s: a %s fault needs duration: (e.g. 2s)", path,
                         e->what);
    DSIM_CHECK(scen_duration(c, m, m->val[F_LATENCY] ? F_LATENCY : F_DURATION,
                             needs_duration ? 1 : 0, &f->duration_ns));
    if (m->val[F_JITTER] && f->what != DSIM_FAULT_DELAY)
        return scen_fail(c, m->key[F_JITTER], "%s.jitter: only a delay has jitter", path);
    DSIM_CHECK(scen_duration(c, m, F_JITTER, 0, &f->jitter_ns));
    if (m->val[F_FACTOR] && f->what != DSIM_FAULT_SLOW)
        return scen_fail(c, m->key[F_FACTOR],
                         "%s.factor: only a slow fault has a factor; remove it", path);
    if (f->what == DSIM_FAULT_SLOW && !m->val[F_FACTOR])
        return scen_fail(c, m->key[F_WHAT],
                         "%s: a slow fault needs factor: how many times slower (more than 1)",
                         path);
    DSIM_CHECK(scen_real(c, m, F_FACTOR, 1, DSIM_SCEN_MAX_SLOW_FACTOR, true, false, &f->factor));
    return DSIM_OK;
}

/* direction / one_way, after_messages, retransmit and rto. */
static dsim_err scen_fault_options(const scen_ctx *c, const scen_fe *e, dsim_fault *f)
{
    const scen_map *m = &e->m;
    const char *path = e->path;
    if ((m->val[F_ONEWAY] || m->val[F_DIRECTION]) && !m->val[F_LINK])
        return scen_fail(c, m->val[F_ONEWAY] ? m->key[F_ONEWAY] : m->key[F_DIRECTION],
                         "%s: a direction is one of a link's two; add link: [FROM, TO] (to: FROM "
                         "-> TO only, from: TO -> FROM only, both)",
                         path);
    if (m->val[F_ONEWAY] && m->val[F_DIRECTION])
        return scen_fail(c, m->key[F_DIRECTION],
                         "%s.direction: one_way and direction say the same; keep direction", path);
    DSIM_CHECK(scen_bool(c, m, F_ONEWAY, &f->one_way));
    if (m->val[F_DIRECTION]) {
        int v = 0;
        DSIM_CHECK(scen_enum(c, m, F_DIRECTION, "a direction", scen_directions,
                             SCEN_N(scen_directions), &v));
        if (v == 1) { /* from: TO -> FROM */
            int tmp = f->link_from;
            f->link_from = f->link_to;
            f->link_to = tmp;
        }
        f->one_way = v != 2;
    }
    if (m->val[F_AFTER] && (!e->on_task || f->when != DSIM_WHEN_PHASE))
        return scen_fail(c, m->key[F_AFTER],
                         "%s.after_messages: only a kill, restart or pause at_phase: fires after "
                         "the frames it sent in that phase",
                         path);
    DSIM_CHECK(scen_int(c, m, F_AFTER, 1, DSIM_SCEN_MAX_STEP, &f->after_messages));
    if ((m->val[F_RETRANSMIT] || m->val[F_RTO]) && f->what != DSIM_FAULT_DROP)
        return scen_fail(c, m->val[F_RTO] ? m->key[F_RTO] : m->key[F_RETRANSMIT],
                         "%s: only a drop is retransmitted", path);
    DSIM_CHECK(scen_bool(c, m, F_RETRANSMIT, &f->retransmit));
    if (m->val[F_RTO] && !f->retransmit)
        return scen_fail(c, m->key[F_RTO],
                         "%s.rto: set retransmit: true for a retransmission "
                         "timeout to apply",
                         path);
    DSIM_CHECK(scen_duration(c, m, F_RTO, 1, &f->rto_ns));
    return DSIM_OK;
}

/* faults[idx]: what, when, where, its kind's rules, its settings. */
static dsim_err scen_fault(const scen_ctx *c, const scen_node *fv, size_t idx, dsim_fault *f)
{
    scen_fe e;
    memset(&e, 0, sizeof e);
    snprintf(e.path, sizeof e.path, "faults[%zu]", idx);
    DSIM_CHECK(scen_fault_what(c, fv, &e, f));
    DSIM_CHECK(scen_fault_when(c, &e, f));
    DSIM_CHECK(scen_fault_where(c, &e, f));
    DSIM_CHECK(scen_fault_kind_rules(c, &e, f));
    DSIM_CHECK(scen_fault_lengths(c, &e, f));
    return scen_fault_options(c, &e, f);
}

dsim_err scen_faults(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    const scen_node *fv = st->top.val[T_FAULTS];
    if (!fv || dsim_yaml_is_null(fv))
        return DSIM_OK;
    char show[96];
    if (fv->kind != DSIM_YAML_SEQ)
        return scen_fail(c, fv,
                         "faults: %s is not a list; write each fault as an item "
                         "starting with '- what: ...'",
                         scen_show(fv, show, sizeof show));
    if (fv->n == 0)
        return DSIM_OK;
    s->faults = calloc(fv->n, sizeof *s->faults);
    if (!s->faults)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    for (size_t i = 0; i < fv->n; i++) {
        s->n_faults = i + 1; /* so that free releases what this one holds */
        DSIM_CHECK(scen_fault(c, fv->kid[i], i, &s->faults[i]));
    }
    return DSIM_OK;
}
