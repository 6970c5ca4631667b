/* The scenario's expect: section (parse_int.h): each check it names (the
 * registry of sim/check) with its thresholds, range-checked, and whether
 * it is expected to pass or fail; or error: the text a refused run's error
 * must contain. Then the correctness checks that apply to the run and that
 * the scenario neither names nor turns off (`NAME: off`), judged by
 * default with their default thresholds:
 *
 *   gradient_consistency   a synchronous strategy (all but asynchronous
 *                          parameter servers; a plugin counts as one)
 *   shard_coverage         every run
 *   checkpoint_roundtrip   a checkpoint is written (checkpoint.path with
 *                          every, or a preemption), synchronous strategies
 *   node_loss              the scenario has faults
 *
 * None for a run that must be refused (expect.error) or a timing-only run
 * (model.synthetic: nothing they measure exists). Checks whose limits are
 * the user's (performance, cold_start, convergence) stay opt-in. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenario/parse_int.h"

static dsim_err scen_expect_check(const scen_ctx *c, const scen_node *key, const scen_node *val,
                                  const dsim_check_ops *ops, dsim_expect *x)
{
    char kp[96], show[96], keys[400];
    x->check = ops;
    x->pos = scen_pos(key);
    dsim_check_defaults(ops, x->values);
    if (!val || dsim_yaml_is_null(val))
        return DSIM_OK;
    /* every threshold, then `expect` */
    size_t o = 0;
    keys[0] = '\0';
    for (int i = 0; i < ops->n_params && o < sizeof keys; i++)
        o += (size_t)snprintf(keys + o, sizeof keys - o, "%s, ", ops->params[i].key);
    if (o < sizeof keys)
        snprintf(keys + o, sizeof keys - o, "expect");
    if (val->kind != DSIM_YAML_MAP)
        return scen_fail(c, val,
                         "expect.%s: %s is not a mapping; accepted: {} or thresholds "
                         "(%s)",
                         ops->name, scen_show(val, show, sizeof show), keys);
    bool seen[DSIM_CHECK_MAX_PARAMS + 1] = {false};
    const scen_node *seen_at[DSIM_CHECK_MAX_PARAMS + 1] = {NULL};
    for (size_t p = 0; p + 1 < val->n; p += 2) {
        const scen_node *k = val->kid[p], *v = val->kid[p + 1];
        int idx = strlen(k->s) == k->len ? dsim_check_param_index(ops, k->s) : -1;
        bool is_expect = strcmp(k->s, "expect") == 0 && k->len == 6;
        if (idx < 0 && !is_expect)
            return scen_fail(c, k, "expect.%s: unknown threshold %s; accepted: %s", ops->name,
                             scen_show(k, show, sizeof show), keys);
        int slot = is_expect ? DSIM_CHECK_MAX_PARAMS : idx;
        if (seen[slot])
            return scen_fail(c, k,
                             "expect.%s.%s: the key appears twice (first at line %d, column %d); "
                             "keep one",
                             ops->name, k->s, seen_at[slot]->line, seen_at[slot]->column);
        seen[slot] = true;
        seen_at[slot] = k;
        snprintf(kp, sizeof kp, "expect.%s.%s", ops->name, k->s);
        if (is_expect) {
            static const scen_name outcomes[] = {{"pass", 0}, {"fail", 1}};
            int out = 0;
            DSIM_CHECK(scen_enum_v(c, v, kp, "an outcome", outcomes, 2, &out));
            x->expect_fail = out == 1;
            continue;
        }
        const dsim_check_param *pa = &ops->params[idx];
        double d;
        bool b;
        if (pa->integer && pa->min >= 0 && pa->max <= 1 && scen_parse_bool(v, &b)) {
            d = b ? 1 : 0;
        } else if (!scen_parse_real(v, &d)) {
            return scen_fail(c, v, "%s: %s is not a number; accepted: %s%g..%g (%s)", kp,
                             scen_show(v, show, sizeof show),
                             pa->integer ? "a whole number in " : "", pa->min, pa->max, pa->doc);
        }
        if (pa->integer && d != floor(d))
            return scen_fail(c, v,
                             "%s: %s is not a whole number; accepted: a whole number in "
                             "%g..%g (%s)",
                             kp, scen_show(v, show, sizeof show), pa->min, pa->max, pa->doc);
        if (d < pa->min || d > pa->max)
            return scen_fail(c, v, "%s: %s is out of range; accepted: %s%g..%g (%s)", kp,
                             scen_show(v, show, sizeof show),
                             pa->integer ? "a whole number in " : "", pa->min, pa->max, pa->doc);
        x->values[idx] = d;
    }
    return DSIM_OK;
}

static dsim_err scen_expect_named(const scen_ctx *c, scen_state *st);

/* `NAME: off` (or false): the check is not judged, named or by default. */
static bool scen_expect_off(const scen_node *v)
{
    bool b;
    if (!v || v->kind == DSIM_YAML_MAP)
        return false;
    if (v->kind == DSIM_YAML_SCALAR && v->len == 3 && strcmp(v->s, "off") == 0)
        return true;
    return scen_parse_bool(v, &b) && !b;
}

static bool scen_is_off(const dsim_scenario *s, const dsim_check_ops *ops)
{
    for (size_t i = 0; i < s->n_off; i++)
        if (s->off[i] == ops)
            return true;
    return false;
}

/* Whether the scenario writes a checkpoint: a path and a period, or a
 * preemption (which saves at its stop). */
static bool scen_writes_checkpoint(const dsim_scenario *s)
{
    if (!s->train.checkpoint_path)
        return false;
    if (s->train.checkpoint_every)
        return true;
    for (size_t i = 0; i < s->n_faults; i++)
        if (s->faults[i].what == DSIM_FAULT_PREEMPT)
            return true;
    return false;
}

bool dsim_scenario_check_applies(const dsim_scenario *s, const dsim_check_ops *ops)
{
    if (!s || !ops || s->expect_error || s->train.synthetic_params > 0)
        return false;
    bool sync = !(s->train.num_ps > 0 && s->train.ps_mode == DSIM_PS_ASYNC);
    if (strcmp(ops->name, "gradient_consistency") == 0)
        return sync;
    if (strcmp(ops->name, "shard_coverage") == 0)
        return true;
    if (strcmp(ops->name, "checkpoint_roundtrip") == 0)
        return sync && scen_writes_checkpoint(s);
    if (strcmp(ops->name, "node_loss") == 0)
        return s->n_faults > 0;
    return false;
}

/* The checks that apply and are neither named nor off, appended. */
static dsim_err scen_default_checks(const scen_ctx *c)
{
    dsim_scenario *s = c->s;
    size_t n = dsim_check_count();
    dsim_expect *x = realloc(s->expect, (s->n_expect + n + 1) * sizeof *x);
    if (!x)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    s->expect = x;
    for (size_t i = 0; i < n; i++) {
        const dsim_check_ops *ops = dsim_check_at(i);
        bool named = false;
        for (size_t k = 0; k < s->n_expect; k++)
            named |= s->expect[k].check == ops;
        if (named || scen_is_off(s, ops) || !dsim_scenario_check_applies(s, ops))
            continue;
        dsim_expect *e = &s->expect[s->n_expect++];
        memset(e, 0, sizeof *e);
        e->check = ops;
        e->by_default = true;
        dsim_check_defaults(ops, e->values);
    }
    return DSIM_OK;
}

dsim_err scen_expect(const scen_ctx *c, scen_state *st)
{
    DSIM_CHECK(scen_expect_named(c, st));
    return scen_default_checks(c);
}

static dsim_err scen_expect_named(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    const scen_node *ev = st->top.val[T_EXPECT];
    if (!ev || dsim_yaml_is_null(ev))
        return DSIM_OK;
    char show[96], names[400];
    size_t o = 0;
    names[0] = '\0';
    for (size_t i = 0; i < dsim_check_count() && o < sizeof names; i++)
        o += (size_t)snprintf(names + o, sizeof names - o, "%s, ", dsim_check_at(i)->name);
    if (o < sizeof names)
        snprintf(names + o, sizeof names - o, "error");
    if (ev->kind != DSIM_YAML_MAP)
        return scen_fail(c, ev, "expect: %s is not a mapping; accepted keys: %s",
                         scen_show(ev, show, sizeof show), names);
    s->expect = calloc(ev->n / 2 + 1, sizeof *s->expect);
    if (!s->expect)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    const scen_node *error_key = NULL;
    for (size_t p = 0; p + 1 < ev->n; p += 2) {
        const scen_node *k = ev->kid[p], *v = ev->kid[p + 1];
        bool nul = strlen(k->s) != k->len;
        if (!nul && strcmp(k->s, "error") == 0) {
            if (error_key)
                return scen_fail(c, k,
                                 "expect.error: the key appears twice (first at line %d, column "
                                 "%d); keep one",
                                 error_key->line, error_key->column);
            error_key = k;
            DSIM_CHECK(scen_str_v(c, v, "expect.error", "the text the run's error must contain",
                                  &s->expect_error));
            continue;
        }
        const dsim_check_ops *ops = nul ? NULL : dsim_check_find(k->s);
        if (!ops) {
            const char *near = NULL;
            size_t bd = 3;
            for (size_t i = 0; !nul && i < dsim_check_count(); i++) {
                size_t d = scen_distance(k->s, dsim_check_at(i)->name);
                if (d < bd) {
                    bd = d;
                    near = dsim_check_at(i)->name;
                }
            }
            char hint[64] = "";
            if (near)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            return scen_fail(c, k, "expect: unknown check %s%s; accepted: %s",
                             scen_show(k, show, sizeof show), hint, names);
        }
        for (size_t i = 0; i < s->n_expect; i++)
            if (s->expect[i].check == ops)
                return scen_fail(c, k,
                                 "expect.%s: the key appears twice (first at line %d, column "
                                 "%d); keep one",
                                 ops->name, s->expect[i].pos.line, s->expect[i].pos.column);
        if (scen_is_off(s, ops))
            return scen_fail(c, k, "expect.%s: the key appears twice; keep one", ops->name);
        if (scen_expect_off(v)) {
            if (s->n_off < DSIM_SCENARIO_MAX_OFF)
                s->off[s->n_off++] = ops;
            continue;
        }
        DSIM_CHECK(scen_expect_check(c, k, v, ops, &s->expect[s->n_expect]));
        s->n_expect++;
    }
    if (error_key && s->n_off > 0)
        return scen_fail(c, error_key,
                         "expect.error: a run that must fail runs no checks, so turning %s off "
                         "means nothing; keep either error or the checks",
                         s->off[0]->name);
    if (error_key && s->n_expect > 0)
        return scen_fail(c, error_key,
                         "expect.error: a run that must fail runs no checks, but %s is also "
                         "expected (line %d); keep either error or the checks",
                         s->expect[0].check->name, s->expect[0].pos.line);
    return DSIM_OK;
}
