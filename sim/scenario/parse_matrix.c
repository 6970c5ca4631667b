/* The scenario's matrix: (parse_int.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenario/parse_int.h"

/* ---- matrix: one file, a cross product of runs ----
 *
 *   matrix:
 *     cluster: [{hosts: 1, devices_per_host: 3}, {hosts: 5, devices_per_host: 1}]
 *     data.features: [1, 6]
 *     strategy.communication: [ring, rhd]
 *     seed: [1, 2]
 *
 * Each key is a section ("cluster", "seed") or a section's key
 * ("data.features"); each value a list of what to put there. Combination k
 * counts through the lists like digits, the first key slowest. A mapping
 * put on a section is merged into it key by key. The combination is then
 * parsed as if the file said it, so a bad value is reported where the
 * matrix gives it. */
#define SCEN_MAX_COMBINATIONS DSIM_SCEN_MAX_COMBINATIONS

static const char *const scen_matrix_sections[] = {"seed",      "engine",   "transport",
                                                   "cluster",   "strategy", "model",
                                                   "optimizer", "data",     "checkpoint"};

/* Checks the matrix, counts its combinations, and for k >= 0 writes
 * combination k into the tree and its label into label[cap]. */
dsim_err scen_matrix(const scen_ctx *c, scen_node *root, const scen_node *mx, long k, size_t *count,
                     char *label, size_t cap)
{
    char show[96];
    *count = 1;
    label[0] = '\0';
    if (mx->kind != DSIM_YAML_MAP || mx->n == 0)
        return scen_fail(c, mx,
                         "matrix: %s is not a mapping of keys to lists; e.g. matrix: {seed: [1, "
                         "2], data.features: [3, 7]}",
                         scen_show(mx, show, sizeof show));
    for (size_t p = 0; p + 1 < mx->n; p += 2) {
        const scen_node *key = mx->kid[p], *val = mx->kid[p + 1];
        char sec[64];
        snprintf(sec, sizeof sec, "%.*s", (int)strcspn(key->s, "."), key->s);
        bool ok = false;
        for (size_t i = 0; i < SCEN_N(scen_matrix_sections); i++)
            ok = ok || strcmp(sec, scen_matrix_sections[i]) == 0;
        const char *dot = strchr(key->s, '.');
        if (!ok || (dot && (!dot[1] || strchr(dot + 1, '.'))))
            return scen_fail(c, key,
                             "matrix.%s: not a setting a matrix can vary; accepted: seed, "
                             "engine, cluster, strategy, model, optimizer, data, checkpoint, or "
                             "one of their keys (cluster.hosts, data.features, "
                             "strategy.communication, ...)",
                             key->s);
        if (val->kind != DSIM_YAML_SEQ || val->n == 0)
            return scen_fail(c, val, "matrix.%s: %s is not a list of values; e.g. [1, 2]", key->s,
                             scen_show(val, show, sizeof show));
        if (*count * val->n > SCEN_MAX_COMBINATIONS)
            return scen_fail(c, val,
                             "matrix.%s: the matrix makes more than %d combinations; run fewer "
                             "(split the file)",
                             key->s, SCEN_MAX_COMBINATIONS);
        *count *= val->n;
    }
    if (k < 0)
        return DSIM_OK;
    size_t stride = *count;
    for (size_t p = 0; p + 1 < mx->n; p += 2) {
        const scen_node *key = mx->kid[p], *val = mx->kid[p + 1];
        stride /= val->n;
        const scen_node *pick = val->kid[((size_t)k / stride) % val->n];
        /* the label: axis=value, or the keys of a mapping */
        size_t ll = strlen(label);
        if (pick->kind == DSIM_YAML_MAP) {
            for (size_t q = 0; q + 1 < pick->n; q += 2)
                snprintf(label + strlen(label), cap - strlen(label), "%s%s=%s",
                         strlen(label) ? "," : "", pick->kid[q]->s,
                         pick->kid[q + 1]->kind == DSIM_YAML_SCALAR ? pick->kid[q + 1]->s : "...");
        } else {
            snprintf(label + ll, cap - ll, "%s%s=%s", ll ? "," : "", key->s,
                     pick->kind == DSIM_YAML_SCALAR ? pick->s : "...");
        }
        /* write it into the tree */
        char sec[64];
        snprintf(sec, sizeof sec, "%.*s", (int)strcspn(key->s, "."), key->s);
        const char *sub = strchr(key->s, '.');
        scen_node *target = dsim_yaml_map_get(root, sec);
        if (sub || (pick->kind == DSIM_YAML_MAP && target && target->kind == DSIM_YAML_MAP)) {
            if (!target || dsim_yaml_is_null(target)) {
                scen_node *m = calloc(1, sizeof *m);
                if (!m)
                    return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
                m->kind = DSIM_YAML_MAP;
                m->line = pick->line;
                m->column = pick->column;
                DSIM_CHECK(dsim_yaml_map_set(root, sec, m));
                target = m;
            } else if (target->kind != DSIM_YAML_MAP) {
                return scen_fail(c, key, "matrix.%s: the file's '%s' is %s, not a mapping", key->s,
                                 sec, scen_show(target, show, sizeof show));
            }
            if (sub) {
                scen_node *v = dsim_yaml_copy(pick);
                if (!v)
                    return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
                DSIM_CHECK(dsim_yaml_map_set(target, sub + 1, v));
            } else {
                for (size_t q = 0; q + 1 < pick->n; q += 2) {
                    scen_node *v = dsim_yaml_copy(pick->kid[q + 1]);
                    if (!v)
                        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
                    DSIM_CHECK(dsim_yaml_map_set(target, pick->kid[q]->s, v));
                }
            }
        } else {
            scen_node *v = dsim_yaml_copy(pick);
            if (!v)
                return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
            DSIM_CHECK(dsim_yaml_map_set(root, sec, v));
        }
    }
    return DSIM_OK;
}
