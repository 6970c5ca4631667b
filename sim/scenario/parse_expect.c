/* The scenario's expect: section (parse_int.h): each check it names (the
 * registry of sim/check) with its thresholds, range-checked, and whether
 * it is expected to pass or fail; or error: the text a refused run's error
 * must contain. */
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
    for (int i = 0; i < ops->n_params && i < DSIM_CHECK_MAX_PARAMS; i++)
        x->values[i] = ops->params[i].def;
    for (int i = ops->n_params; i < DSIM_CHECK_MAX_PARAMS; i++)
        x->values[i] = NAN;
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

dsim_err scen_expect(const scen_ctx *c, scen_state *st)
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
        DSIM_CHECK(scen_expect_check(c, k, v, ops, &s->expect[s->n_expect]));
        s->n_expect++;
    }
    if (error_key && s->n_expect > 0)
        return scen_fail(c, error_key,
                         "expect.error: a run that must fail runs no checks, but %s is also "
                         "expected (line %d); keep either error or the checks",
                         s->expect[0].check->name, s->expect[0].pos.line);
    return DSIM_OK;
}
