/* dsim plan: what a scenario will do, before it runs, as JSON. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "cmds.h"
#include "scenario/plan.h"
#include "scenario/scenario.h"

void cmd_plan_help(FILE *out)
{
    fprintf(out, "usage: dsim plan SCENARIO [--json] [--plugin-dir DIR]\n"
                 "\n"
                 "  --plugin-dir DIR  look for a strategy plugin named by a bare file name in\n"
                 "                    DIR first, as 'dsim run' does (it is not loaded: plan\n"
                 "                    runs no code of the scenario's; \"plugin\" in the JSON\n"
                 "                    and a line on stderr say which file 'dsim run' will\n"
                 "                    load, and that loading it runs its code)\n"
                 "\n"
                 "Prints what the scenario will do, as JSON (the only format; --json is\n"
                 "accepted for symmetry with other commands): the resolved cluster (hosts,\n"
                 "devices, ps, chief, every replica's worker and device), the strategy and the\n"
                 "all-reduce algorithm it will use (auto resolved for the model's gradient\n"
                 "size), the model and its parameter count, the optimizer, the shard policy\n"
                 "asked for and the one applied (and why), per worker the files and example ids\n"
                 "it reads in the first epoch (as [first, last] ranges), the steps per epoch,\n"
                 "and every replica's batch size in each step of the first epoch.\n"
                 "\n"
                 "A scenario that is bound to fail (e.g. FILE sharding with fewer files than\n"
                 "workers) or that this build cannot run yet still prints the plan, with\n"
                 "\"runnable\": false, the reason in \"not_runnable\" (and a data plan's error\n"
                 "in \"error\"), and the reason on stderr. \"runnable\" is true exactly when\n"
                 "the exit status is 0.\n"
                 "\n"
                 "Exit status: 0 the plan runs, 2 bad input or a run that would fail.\n");
}

#define PLAN_DUMP_FLAGS (JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))

/* Pretty-printed as json_dumpf with JSON_INDENT(2) would, except that an
 * array of plain values stays on one line: the per-step batch sizes and
 * id ranges would otherwise take a line per number. */
static int plan_print(json_t *v, FILE *f, int indent)
{
    bool nested = false;
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) nested = nested || json_is_object(e) || json_is_array(e);
    }
    if (!json_is_object(v) && !nested)
        return json_dumpf(v, f, PLAN_DUMP_FLAGS);
    bool obj = json_is_object(v);
    size_t n = obj ? json_object_size(v) : json_array_size(v);
    if (n == 0)
        return fputs(obj ? "{}" : "[]", f) < 0 ? -1 : 0;
    if (fputc(obj ? '{' : '[', f) == EOF)
        return -1;
    size_t k = 0;
    if (obj) {
        const char *key;
        json_t *e;
        json_object_foreach(v, key, e)
        {
            json_t *ks = json_string(key);
            int rc = !ks || fprintf(f, "%s\n%*s", k ? "," : "", indent + 2, "") < 0 ||
                     json_dumpf(ks, f, PLAN_DUMP_FLAGS) != 0 || fputs(": ", f) < 0 ||
                     plan_print(e, f, indent + 2) != 0;
            json_decref(ks);
            if (rc)
                return -1;
            k++;
        }
    } else {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            if (fprintf(f, "%s\n%*s", i ? "," : "", indent + 2, "") < 0 ||
                plan_print(e, f, indent + 2) != 0)
                return -1;
        }
    }
    return fprintf(f, "\n%*s%c", indent, "", obj ? '}' : ']') < 0 ? -1 : 0;
}

int cmd_plan(int argc, char **argv)
{
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int missing = 0;
        const char *v;
        if (strcmp(a, "--json") == 0)
            continue;
        if ((v = dsim_cli_flag(argc, argv, &i, "--plugin-dir", &missing))) {
            if (dsim_cli_plugin_dir("plan", v) != 0)
                return 2;
            continue;
        }
        if (missing) {
            fprintf(stderr, "dsim plan: %s needs a value; see 'dsim plan --help'\n", a);
            return 2;
        }
        if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr,
                    "dsim plan: unknown option '%s' (accepted: --json, --plugin-dir DIR); see "
                    "'dsim plan --help'\n",
                    a);
            return 2;
        }
        if (file) {
            fprintf(stderr, "dsim plan: one scenario at a time ('%s' and '%s' given)\n", file, a);
            return 2;
        }
        file = a;
    }
    if (!file) {
        fprintf(stderr, "dsim plan: no scenario given; usage: dsim plan SCENARIO [--json]\n");
        return 2;
    }
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(file, &s) != DSIM_OK) {
        const char *msg = dsim_errmsg();
        if (strncmp(msg, file, strlen(file)) == 0)
            fprintf(stderr, "dsim plan: %s\n", msg);
        else
            fprintf(stderr, "dsim plan: %s: %s\n", file, msg);
        return 2;
    }
    json_t *j = NULL;
    dsim_err e = dsim_scenario_plan(s, &j);
    char why[512] = "";
    if (e != DSIM_OK)
        snprintf(why, sizeof why, "%s", dsim_errmsg());
    /* A plugin: which file dsim run will load, and that it runs its code. */
    dsim_plugin_notice pn;
    if (j && dsim_scenario_plugin_notice(s, &pn)) {
        json_object_set_new(j, "plugin",
                            json_pack("{s:s, s:b, s:b, s:s}", "file", pn.file,
                                      "loading_runs_its_code", 1, "outside_scenario_folder",
                                      pn.outside, "notice", pn.text));
        fprintf(stderr, "dsim plan: %s:%d:%d: %s%s\n", file, s->plugin_pos.line,
                s->plugin_pos.column, pn.outside ? "warning: " : "", pn.text);
    }
    dsim_scenario_free(s);
    if (!j) {
        fprintf(stderr, "dsim plan: %s\n", why);
        return 2;
    }
    int rc = plan_print(j, stdout, 0);
    json_decref(j);
    if (rc != 0 || fputc('\n', stdout) == EOF || fflush(stdout) != 0) {
        fprintf(stderr, "dsim plan: could not write to standard output\n");
        return 2;
    }
    if (e != DSIM_OK) {
        if (strncmp(why, file, strlen(file)) == 0)
            fprintf(stderr, "dsim plan: %s\n", why);
        else
            fprintf(stderr, "dsim plan: %s: %s\n", file, why);
        return 2;
    }
    return 0;
}
