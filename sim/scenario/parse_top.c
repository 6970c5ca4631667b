/* The scenario's top level (parse_int.h): its accepted keys, and the
 * settings that stand there: name, description, seed, engine, transport
 * (inproc | shm | tcp: how the ranks talk), recovery (none | restart, or
 * {policy, max_restarts}) and liveness. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "scenario/defaults.h"
#include "scenario/parse_int.h"

static const scen_name scen_recoveries[] = {{"none", 0}, {"restart", 1}};
static const char *const scen_top_keys[T_N] = {
    "name",   "description", "seed",     "engine",     "cluster",        "strategy",
    "model",  "optimizer",   "data",     "checkpoint", "faults",         "recovery",
    "expect", "matrix",      "liveness", "transport",  "mixed_precision"};
static const scen_name scen_transports[] = {{"inproc", 0}, {"shm", 1}, {"tcp", 2}};

static bool scen_name_ok(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.' && *s != '-')
            return false;
    return true;
}

dsim_err scen_top(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    char show[96];
    const scen_node *root = c->root;
    if (!root)
        return scen_fail(c, NULL,
                         "the file is empty; a scenario needs at least 'name: NAME' (see "
                         "scenarios/FORMAT.md or dsim validate --defaults)");
    if (root->kind != DSIM_YAML_MAP)
        return scen_fail(c, root,
                         "the top level is %s, not a mapping; a scenario is keys such as "
                         "'name: NAME' (see dsim validate --defaults)",
                         scen_show(root, show, sizeof show));
    scen_map *m = &st->top;
    DSIM_CHECK(scen_map_read(c, root, root, "", scen_top_keys, T_N, m));
    if (!m->val[T_NAME])
        return scen_fail(c, root,
                         "name: missing; every scenario has a name ([A-Za-z0-9_.-]+), "
                         "e.g. name: quickstart");
    DSIM_CHECK(scen_str_v(c, m->val[T_NAME], "name", "a name ([A-Za-z0-9_.-]+)", &s->name));
    if (!scen_name_ok(s->name) || strlen(s->name) > 128)
        return scen_fail(c, m->val[T_NAME],
                         "name: %s is not a name; accepted: 1-128 characters of A-Z, a-z, 0-9, "
                         "_, . and -",
                         scen_show(m->val[T_NAME], show, sizeof show));
    if (m->val[T_DESC])
        DSIM_CHECK(scen_str_v(c, m->val[T_DESC], "description", "text", &s->description));
    if (m->val[T_SEED]) {
        const scen_node *v = m->val[T_SEED];
        bool ok = scen_is_scalar(v) && v->plain && strlen(v->s) == v->len && v->s[0] >= '0' &&
                  v->s[0] <= '9';
        for (const char *q = ok ? v->s : ""; *q; q++)
            ok = ok && *q >= '0' && *q <= '9';
        errno = 0;
        char *end = NULL;
        unsigned long long x = ok ? strtoull(v->s, &end, 10) : 0;
        if (!ok || errno == ERANGE || *end)
            return scen_fail(c, v, "seed: %s is %s; accepted: 0..18446744073709551615",
                             scen_show(v, show, sizeof show),
                             ok ? "out of range" : "not a whole number");
        s->seed = x;
    }
    s->train.seed = s->seed;
    int v = 0;
    scen_name engines[8]; /* the engine table's (engine/engine.h) */
    size_t ne = 0;
    for (const dsim_engine_ops *e; ne < SCEN_N(engines) && (e = dsim_engine_at((int)ne)); ne++)
        engines[ne] = (scen_name){e->name, (int)ne};
    DSIM_CHECK(scen_enum(c, m, T_ENGINE, "an engine", engines, ne, &v));
    DSIM_CHECK(scen_set_str(c, &s->engine, engines[v].name));
    s->train.engine = s->engine;
    s->engine_pos = scen_pos(m->val[T_ENGINE]);
    if (m->val[T_TRANSPORT]) {
        /* how the ranks talk; whether the engine takes it is judged with
         * the engine (dsim_scenario_runnable) */
        int tv = 0;
        DSIM_CHECK(scen_enum(c, m, T_TRANSPORT, "a transport", scen_transports,
                             SCEN_N(scen_transports), &tv));
        DSIM_CHECK(scen_set_str(c, &s->transport, scen_transports[tv].name));
        s->train.transport = s->transport;
        s->transport_pos = scen_pos(m->val[T_TRANSPORT]);
    }
    v = 0;
    s->max_restarts = DSIM_SCENARIO_DEF_MAX_RESTARTS;
    const scen_node *rv = m->val[T_RECOVERY];
    if (rv && rv->kind == DSIM_YAML_MAP) {
        /* recovery: {policy: restart, max_restarts: 3} */
        enum { R_POLICY, R_MAX, R_N };
        static const char *const rkeys[R_N] = {"policy", "max_restarts"};
        scen_map rm;
        DSIM_CHECK(scen_map_read(c, rv, m->key[T_RECOVERY], "recovery", rkeys, R_N, &rm));
        DSIM_CHECK(scen_enum(c, &rm, R_POLICY, "a recovery", scen_recoveries,
                             SCEN_N(scen_recoveries), &v));
        int64_t mx = DSIM_SCENARIO_DEF_MAX_RESTARTS;
        DSIM_CHECK(scen_int(c, &rm, R_MAX, 0, DSIM_SCEN_MAX_RESTARTS, &mx));
        if (rm.val[R_MAX] && v == 0)
            return scen_fail(c, rm.key[R_MAX],
                             "recovery.max_restarts: policy is none, so nothing restarts; set "
                             "policy: restart or remove it");
        s->max_restarts = (int)mx;
    } else {
        DSIM_CHECK(scen_enum(c, m, T_RECOVERY, "a recovery", scen_recoveries,
                             SCEN_N(scen_recoveries), &v));
    }
    DSIM_CHECK(scen_set_str(c, &s->recovery, scen_recoveries[v].name));
    s->recovery_pos = scen_pos(m->val[T_RECOVERY]);
    const scen_node *lv = m->val[T_LIVENESS];
    if (lv) {
        /* liveness: {reach_step: 40, within: 60s} */
        enum { L_STEP, L_WITHIN, L_N };
        static const char *const lkeys[L_N] = {"reach_step", "within"};
        scen_map lm;
        DSIM_CHECK(scen_map_read(c, lv, m->key[T_LIVENESS], "liveness", lkeys, L_N, &lm));
        if (!lm.val[L_STEP] || !lm.val[L_WITHIN])
            return scen_fail(c, m->key[T_LIVENESS],
                             "liveness: needs both reach_step (the global step the healed job "
                             "must reach) and within (how long it may take)");
        int64_t step = 0, within = 0;
        DSIM_CHECK(scen_int(c, &lm, L_STEP, 1, DSIM_SCEN_MAX_STEP, &step));
        DSIM_CHECK(scen_duration(c, &lm, L_WITHIN, 1, &within));
        s->has_liveness = true;
        s->liveness_step = (uint64_t)step;
        s->liveness_within_ns = within;
    }
    return DSIM_OK;
}
