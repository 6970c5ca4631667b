/* dsim conformance PLUGIN.so | STRATEGY: the standard battery against one
 * strategy (sim/harness/conformance.h does the work), one table and, with
 * --junit, JUnit XML. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmds.h"
#include "dsim/err.h"
#include "dsim/strategy.h"
#include "harness/conformance.h"
#include "report_ci.h"
#include "scenario/scenario.h"

#define CF_CMD "dsim conformance"

void cmd_conformance_help(FILE *out)
{
    fprintf(out,
            "usage: dsim conformance PLUGIN.so|STRATEGY [--quick] [--junit FILE]\n"
            "                        [--case LIST] [--engine LIST] [--ps-mode sync|async]\n"
            "                        [--plugin-dir DIR] [--timeout SECONDS] [--keep DIR]\n"
            "       dsim conformance --list\n"
            "\n"
            "Runs a standard battery of cases against one strategy: a plugin (a file ending in\n"
            ".so or a path; a bare file name is looked for as a scenario's strategy.plugin is)\n"
            "or a registered strategy's name. The cases: the catalogue's shape and awkward\n"
            "ones (1 replica, primes, hosts x devices pairs that differ, parameter counts the\n"
            "replicas do not divide, fewer parameters than replicas, global batches with\n"
            "remainders, one-example tails, fewer examples a step than replicas), sgd,\n"
            "momentum, adam (and amsgrad), adamax, rmsprop, adagrad, lion and lamb,\n"
            "gradients all-reduced in bfloat16, every engine, checkpoints with a restart, a\n"
            "kill with recovery, a partition and a straggler (--list shows them).\n"
            "\n"
            "Each case is a scenario made from its row with the strategy put in, run through\n"
            "the harness on each of its engines in a child process, and judged by its checks\n"
            "as `dsim run` judges a file. A case is fitted to what the strategy accepts: its\n"
            "shape as asked, else with parameter servers, else on one host, else one\n"
            "replica (a TPU-only strategy: the smallest slice); a strategy whose own input_fn\n"
            "refuses the case's global batch (one its replicas do not divide, as TF's\n"
            "get_per_replica_batch_size) gets the next multiple, said in the row. A case the\n"
            "strategy cannot take (a partition of a one-worker strategy, checkpoints without\n"
            "save, a restore replayed by an asynchronous strategy) is n/a, with the reason.\n"
            "\n"
            "  --quick            the reduced battery (for a project's default test suite)\n"
            "  --junit FILE       JUnit XML: a testsuite per case and engine, a testcase per\n"
            "                     check (sim/cli/junit.xsd); an n/a case is <skipped>\n"
            "  --case LIST        only these cases (comma-separated)\n"
            "  --engine LIST      run every case on these engines instead of its own\n"
            "  --ps-mode MODE     sync or async, for a parameter-server strategy\n"
            "  --plugin-dir DIR   where to look for a plugin named by a bare file name first\n"
            "  --timeout SECONDS  wall-clock bound of one run (default 120)\n"
            "  --keep DIR         run in DIR (it must exist) and leave the scenarios there\n"
            "                     (CASE.ENGINE.yaml), to run one again with dsim run\n"
            "  --list             print the battery's cases and exit\n"
            "\n"
            "In your own meson.build, one line runs it as a test:\n"
            "  test('conformance', find_program('dsim'), args : ['conformance', my_plugin,\n"
            "       '--quick'], depends : my_plugin)\n"
            "\n"
            "Exit status: 0 every case passed or is n/a, 1 a case failed (or its scenario\n"
            "was refused), 2 bad input (no such strategy or plugin, an unknown case or\n"
            "engine).\n");
}

static void cf_list(void)
{
    printf("%-20s %-7s %-19s %-5s  %s\n", "CASE", "SHAPE", "ENGINES", "QUICK", "WHAT");
    for (size_t i = 0; i < dsim_conf_case_count(); i++) {
        const dsim_conf_case *c = dsim_conf_case_at(i);
        char shape[16];
        snprintf(shape, sizeof shape, "%dx%d", c->hosts, c->devices_per_host);
        printf("%-20s %-7s %-19s %-5s  %s\n", c->name, shape, c->engines, c->quick ? "yes" : "",
               c->about);
    }
}

static void cf_row(const dsim_conf_outcome *oc, void *user)
{
    (void)user;
    char shape[48] = "-";
    if (oc->hosts)
        snprintf(shape, sizeof shape, "%dx%d", oc->hosts, oc->devices_per_host);
    if (oc->hosts && oc->ps)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "+%dps", oc->ps);
    if (oc->tpu[0]) /* a TPU strategy: the slice it ran on */
        snprintf(shape, sizeof shape, "%s", oc->tpu);
    printf("  %-20s %-9s %-24s %-7s %s\n", oc->c->name, shape, oc->engines[0] ? oc->engines : "-",
           dsim_conf_verdict_name(oc->verdict), oc->message);
    fflush(stdout);
}

/* Loads a plugin and says which strategy it registered (*name, static). */
static int cf_load(const char *target, char **path, char *name, size_t cap)
{
    char *found = NULL;
    if (dsim_scenario_plugin_find(target, &found) != DSIM_OK) {
        fprintf(stderr, CF_CMD ": %s\n", dsim_errmsg());
        return 2;
    }
    char *abs = realpath(found, NULL);
    free(found);
    if (!abs) {
        fprintf(stderr, CF_CMD ": %s: %s\n", target, strerror(errno));
        return 2;
    }
    char before[1024], after[1024];
    dsim_strategy_list(before, sizeof before);
    if (dsim_strategy_load(NULL, abs) != DSIM_OK) {
        fprintf(stderr, CF_CMD ": %s\n", dsim_errmsg());
        free(abs);
        return 2;
    }
    dsim_strategy_list(after, sizeof after);
    name[0] = '\0';
    char *save = NULL;
    for (char *t = strtok_r(after, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        size_t n = strlen(t);
        bool seen = false;
        for (const char *p = strstr(before, t); p && !seen; p = strstr(p + 1, t))
            seen = (p == before || p[-1] == ' ' || p[-1] == ',') && (p[n] == '\0' || p[n] == ',');
        if (!seen)
            snprintf(name, cap, "%s", t);
    }
    if (!name[0]) {
        fprintf(stderr, CF_CMD ": %s was loaded but registered no new strategy\n", abs);
        free(abs);
        return 2;
    }
    *path = abs;
    return 0;
}

/* The JUnit suites of the battery: one per case and engine. */
static void cf_junit(dsim_ci_report *ci, const dsim_conf_result *res)
{
    for (size_t i = 0; i < res->n_cases; i++) {
        const dsim_conf_outcome *oc = &res->cases[i];
        if (oc->verdict == DSIM_CONF_NA) {
            dsim_ci_skipped(ci, oc->c->name, oc->message);
            continue;
        }
        for (size_t k = 0; k < oc->n_runs; k++) {
            const dsim_conf_run *run = &oc->runs[k];
            char name[96];
            snprintf(name, sizeof name, "%s.%s", oc->c->name, run->engine);
            dsim_scenario *s = NULL;
            if (!run->text ||
                dsim_scenario_parse(name, run->text, strlen(run->text), &s) != DSIM_OK) {
                dsim_ci_load_failed(ci, name, oc->message);
                continue;
            }
            dsim_ci_run(ci, name, s, &run->iso.r);
            dsim_scenario_free(s);
        }
        if (oc->verdict == DSIM_CONF_ERROR && oc->n_runs == 0)
            dsim_ci_load_failed(ci, oc->c->name, oc->message);
    }
}

/* --keep: the scenarios of the runs, to run again with dsim run. */
static void cf_keep(const char *dir, const dsim_conf_result *res)
{
    for (size_t i = 0; i < res->n_cases; i++) {
        for (size_t k = 0; k < res->cases[i].n_runs; k++) {
            const dsim_conf_run *run = &res->cases[i].runs[k];
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s.%s.yaml", dir, res->cases[i].c->name, run->engine);
            FILE *f = run->text ? fopen(path, "w") : NULL;
            if (f) {
                fputs(run->text, f);
                fclose(f);
            }
        }
    }
}

typedef struct cf_args {
    dsim_conf_opts o;
    const char *target, *junit, *keep;
    bool list;
} cf_args;

static int cf_parse(int argc, char **argv, cf_args *a)
{
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "--quick") == 0) {
            a->o.quick = true;
        } else if (strcmp(argv[i], "--list") == 0) {
            a->list = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--junit", &missing))) {
            a->junit = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--case", &missing))) {
            a->o.cases = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--engine", &missing))) {
            a->o.engines = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--ps-mode", &missing))) {
            a->o.ps_mode = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--keep", &missing))) {
            struct stat sb;
            if (!*v || stat(v, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(v, W_OK) != 0) {
                fprintf(stderr,
                        CF_CMD ": --keep is '%s', which is not a writable directory (make it "
                               "first)\n",
                        v);
                return 2;
            }
            a->keep = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--plugin-dir", &missing))) {
            if (dsim_cli_plugin_dir("conformance", v))
                return 2;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--timeout", &missing))) {
            char *end = NULL;
            errno = 0;
            double t = strtod(v, &end);
            if (!*v || *end || errno || !(t > 0) || t > 86400) {
                fprintf(stderr,
                        CF_CMD ": --timeout is '%s' (accepted: seconds, more than 0, at most "
                               "86400)\n",
                        v);
                return 2;
            }
            a->o.run_timeout_s = t;
        } else if (missing) {
            fprintf(stderr, CF_CMD ": %s needs a value (dsim conformance --help)\n", argv[i]);
            return 2;
        } else if (argv[i][0] == '-' || a->target) {
            fprintf(stderr,
                    CF_CMD ": unexpected '%s' (usage: dsim conformance PLUGIN.so|STRATEGY "
                           "[--quick]; dsim conformance --help)\n",
                    argv[i]);
            return 2;
        } else {
            a->target = argv[i];
        }
    }
    return 0;
}

int cmd_conformance(int argc, char **argv)
{
    cf_args a = {.o = {.size = sizeof a.o, .run_timeout_s = 120, .on_case = cf_row}};
    int rc = cf_parse(argc, argv, &a);
    if (rc)
        return rc;
    if (a.list) {
        cf_list();
        return 0;
    }
    if (!a.target) {
        fprintf(stderr, CF_CMD ": which strategy? (usage: dsim conformance PLUGIN.so|STRATEGY; "
                               "dsim conformance --help)\n");
        return 2;
    }
    char name[64];
    char *plugin = NULL;
    size_t tl = strlen(a.target);
    if (strchr(a.target, '/') || (tl > 3 && strcmp(a.target + tl - 3, ".so") == 0)) {
        if ((rc = cf_load(a.target, &plugin, name, sizeof name)) != 0)
            return rc;
        a.o.strategy = name;
        a.o.plugin = plugin;
    } else {
        a.o.strategy = a.target;
    }
    a.o.workdir = a.keep;
    dsim_ci_report *ci = NULL;
    if ((rc = dsim_ci_open(CF_CMD, a.junit, false, &ci)) != 0) {
        free(plugin);
        return rc;
    }
    printf("dsim conformance: strategy %s%s%s%s%s%s\n\n", a.o.strategy, plugin ? " (plugin " : "",
           plugin ? plugin : "", plugin ? ")" : "", a.o.ps_mode ? ", ps_mode " : "",
           a.o.ps_mode ? a.o.ps_mode : "");
    printf("  %-20s %-9s %-24s %-7s %s\n", "CASE", "SHAPE", "ENGINES", "VERDICT", "MESSAGE");
    fflush(stdout);
    dsim_conf_result res;
    if (dsim_conformance(&a.o, &res) != DSIM_OK) {
        fprintf(stderr, CF_CMD ": %s\n", dsim_errmsg());
        dsim_conf_result_free(&res);
        dsim_ci_close(ci);
        free(plugin);
        return 2;
    }
    printf("\n%s: %zu case%s: %zu passed, %zu failed, %zu n/a", a.o.strategy, res.n_cases,
           res.n_cases == 1 ? "" : "s", res.passed, res.failed, res.not_applicable);
    if (res.errors)
        printf(", %zu refused", res.errors);
    printf(" (%.1f s)\n", res.wall_s);
    if (a.keep) {
        cf_keep(a.keep, &res);
        printf("the cases' scenarios are in %s (CASE.ENGINE.yaml): run one there with dsim run\n",
               a.keep);
    }
    cf_junit(ci, &res);
    rc = res.failed || res.errors ? 1 : 0;
    if (dsim_ci_close(ci) != 0)
        rc = 2;
    dsim_conf_result_free(&res);
    free(plugin);
    return rc;
}
