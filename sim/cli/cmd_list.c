/* dsim list: what this build offers (strategies, all-reduce algorithms,
 * checks, fault kinds) and what the results store holds (runs). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <sqlite3.h>

#include "check/check.h"
#include "cmds.h"
#include "dsim_config.h"
#include "dsim/comm.h"
#include "dsim/err.h"
#include "dsim/strategy.h"
#include "fault/fault.h"
#include "scenario/scenario.h"
#include "store.h"

void cmd_list_help(FILE *out)
{
    fprintf(out,
            "usage: dsim list strategies|algorithms|checks|runs|faults|devices [--json]\n"
            "                 [--db PATH] [--limit N] [--plugin-dir DIR]\n"
            "\n"
            "  strategies   the built-in distribution strategies, then the strategy plugins\n"
            "               (*.so) found in --plugin-dir, $DSIM_PLUGIN_PATH and the installed\n"
            "               plugin directory, with their summaries and files (a plugin built\n"
            "               for another strategy ABI is listed as refused, saying why)\n"
            "  algorithms   the all-reduce algorithms strategy.communication can name\n"
            "  checks       the checks a scenario's expect: can ask for, with each\n"
            "               threshold's range and default\n"
            "  runs         the runs in the results store: id, scenario (a matrix's whole\n"
            "               name: columns are as wide as their longest value), engine,\n"
            "               strategy, status, start time (UTC), duration, checks\n"
            "               passed/failed\n"
            "  faults       the fault kinds a scenario's faults: can name (what:)\n"
            "  devices      the devices each backend finds here (host CPU, CUDA GPUs): memory,\n"
            "               compute capability, peak bandwidth, peer access; the last line says\n"
            "               whether replicas can use GPUs (\"no GPU found: CPU\" when not)\n"
            "\n"
            "  --json       print JSON instead of a table\n"
            "  --db PATH    the results store for 'runs' (default %s)\n"
            "  --limit N    'runs': only the N most recent (default all)\n"
            "  --plugin-dir DIR  'strategies': look for plugins in DIR first\n"
            "\n"
            "Exit status: 0 listed, 2 bad input or a store that cannot be read.\n",
            DSIM_STORE_DEFAULT_PATH);
}

static int list_print_json(json_t *j)
{
    if (!j) {
        fprintf(stderr, "dsim list: out of memory\n");
        return 2;
    }
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) {
        fprintf(stderr, "dsim list: out of memory\n");
        return 2;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

/* One directory's plugins (*.so, in name order), probed without being
 * registered: usable ones with their table's name and summary, refused ones
 * with the loader's reason; objects that are no strategy plugin are
 * skipped. Returns how many were listed. */
static int list_plugin_dir(const char *dir, json_t *arr, char (*seen)[PATH_MAX], int *nseen)
{
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort), listed = 0;
    for (int i = 0; i < n; i++) {
        const char *f = ents[i]->d_name;
        size_t l = strlen(f);
        char path[PATH_MAX], real[PATH_MAX];
        int skip = l < 4 || strcmp(f + l - 3, ".so") != 0 ||
                   snprintf(path, sizeof path, "%s/%s", dir, f) >= (int)sizeof path ||
                   !realpath(path, real);
        for (int k = 0; !skip && k < *nseen; k++)
            skip = strcmp(seen[k], real) == 0;
        free(ents[i]);
        if (skip)
            continue;
        if (*nseen < 256)
            snprintf(seen[(*nseen)++], PATH_MAX, "%s", real);
        dsim_strategy_plugin_info pi;
        if (dsim_strategy_plugin_probe(path, &pi) != DSIM_OK)
            continue; /* not a strategy plugin */
        listed++;
        if (arr)
            json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:i, s:b, s:s?}", "name", pi.name,
                                                 "summary", pi.summary, "plugin", path,
                                                 "abi_version", (int)pi.abi_version, "usable",
                                                 pi.usable, "refused", pi.usable ? NULL : pi.why));
        else if (pi.usable)
            printf("%-24s %s\n%-24s   (plugin %s)\n", pi.name, pi.summary, "", path);
        else
            printf("%-24s %s\n", "(refused)", pi.why);
    }
    free(ents);
    return listed;
}

static int list_strategies(bool as_json)
{
    char buf[1024];
    dsim_strategy_list(buf, sizeof buf);
    json_t *arr = as_json ? json_array() : NULL;
    if (!as_json)
        printf("%-24s %s\n", "STRATEGY", "SUMMARY");
    char *save = NULL;
    for (char *name = strtok_r(buf, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
        const char *sum = dsim_strategy_summary(name);
        if (as_json)
            json_array_append_new(arr,
                                  json_pack("{s:s, s:s}", "name", name, "summary", sum ? sum : ""));
        else
            printf("%-24s %s\n", name, sum ? sum : "");
    }
    /* The plugins: --plugin-dir (in front of $DSIM_PLUGIN_PATH), the path,
     * then the installed directories, as a scenario's plugin is looked for
     * (the build tree's, which a program of the build tree also searches,
     * hold its test fixtures: not listed). */
    static char seen[256][PATH_MAX];
    int nseen = 0, listed = 0;
    const char *env = getenv("DSIM_PLUGIN_PATH");
    char installed[8192];
    size_t u = 0, root = strlen(DSIM_BUILD_ROOT);
    installed[0] = '\0';
    char *all = strdup(dsim_scenario_plugin_dirs()), *s1 = NULL;
    for (char *d = all ? strtok_r(all, ":", &s1) : NULL; d; d = strtok_r(NULL, ":", &s1))
        if (!(strncmp(d, DSIM_BUILD_ROOT, root) == 0 && d[root] == '/') && u < sizeof installed)
            u += (size_t)snprintf(installed + u, sizeof installed - u, "%s%s", u ? ":" : "", d);
    free(all);
    char *dirs = NULL;
    if (asprintf(&dirs, "%s%s%s", env ? env : "", env && *env ? ":" : "", installed) < 0)
        dirs = NULL;
    if (!as_json)
        printf("\nplugins in $DSIM_PLUGIN_PATH (and --plugin-dir) and %s:\n", installed);
    char *s2 = NULL;
    for (char *d = dirs ? strtok_r(dirs, ":", &s2) : NULL; d; d = strtok_r(NULL, ":", &s2))
        listed += list_plugin_dir(d, arr, seen, &nseen);
    free(dirs);
    if (as_json)
        return list_print_json(arr);
    if (!listed)
        printf("(none)\n");
    printf("\nA scenario names a plugin with strategy.plugin: a path, or a file name looked "
           "for next to it and in these directories.\n");
    return 0;
}

static int list_algorithms(bool as_json)
{
    json_t *arr = as_json ? json_array() : NULL;
    if (!as_json)
        printf("%-16s %s\n", "ALGORITHM", "WHAT IT DOES");
    for (int a = 0; a < DSIM_ALGO_COUNT; a++) {
        const char *doc = dsim_algo_summary((dsim_algo)a);
        if (as_json)
            json_array_append_new(
                arr, json_pack("{s:s, s:s}", "name", dsim_algo_name((dsim_algo)a), "doc", doc));
        else
            printf("%-16s %s\n", dsim_algo_name((dsim_algo)a), doc);
    }
    return as_json ? list_print_json(arr) : 0;
}

static int list_faults(bool as_json)
{
    static const char *const loses[] = {
        [DSIM_FAULT_LOSES_NOTHING] = "nothing",
        [DSIM_FAULT_LOSES_PEER] = "peer",
        [DSIM_FAULT_LOSES_MESSAGE] = "message",
    };
    json_t *arr = as_json ? json_array() : NULL;
    if (!as_json)
        printf("%-10s %-8s %s\n", "FAULT", "LOSES", "WHAT IT DOES");
    for (int w = 0; w < DSIM_FAULT_WHAT_COUNT; w++) {
        const dsim_fault_kind *k = dsim_fault_kind_of((dsim_fault_what)w);
        if (as_json)
            json_array_append_new(arr, json_pack("{s:s, s:s, s:s}", "name", k->name, "summary",
                                                 k->summary, "loses", loses[k->loses]));
        else
            printf("%-10s %-8s %s\n", k->name, loses[k->loses], k->summary);
    }
    if (as_json)
        return list_print_json(arr);
    printf("\nIn a scenario: faults: [{what: KIND, when, where, ...}]; scenarios/FORMAT.md has\n"
           "each kind's settings.\n");
    return 0;
}

static void list_num(char *buf, size_t cap, double v)
{
    if (isnan(v))
        snprintf(buf, cap, "unset");
    else if (v >= DSIM_CHECK_NO_LIMIT)
        snprintf(buf, cap, "no limit");
    else
        snprintf(buf, cap, "%g", v);
}

static int list_checks(bool as_json)
{
    json_t *arr = as_json ? json_array() : NULL;
    for (size_t i = 0; i < dsim_check_count(); i++) {
        const dsim_check_ops *c = dsim_check_at(i);
        if (as_json) {
            json_t *params = json_array();
            for (int k = 0; k < c->n_params; k++) {
                const dsim_check_param *p = &c->params[k];
                json_array_append_new(
                    params, json_pack("{s:s, s:s, s:f, s:f, s:o, s:b}", "key", p->key, "doc",
                                      p->doc, "min", p->min, "max", p->max, "default",
                                      isnan(p->def) ? json_null() : json_real(p->def), "integer",
                                      p->integer));
            }
            json_array_append_new(
                arr, json_pack("{s:s, s:s, s:b, s:o, s:o}", "name", c->name, "summary", c->summary,
                               "available", c->available, "by_default",
                               c->by_default ? json_string(c->by_default) : json_null(), "params",
                               params));
            continue;
        }
        printf("%s%s\n  %s\n", c->name, c->available ? "" : "  (not available in this build yet)",
               c->summary);
        if (c->by_default)
            printf("  judged by default: %s (turn it off with %s: off)\n", c->by_default, c->name);
        else
            printf("  judged only when the scenario names it\n");
        for (int k = 0; k < c->n_params; k++) {
            const dsim_check_param *p = &c->params[k];
            char def[32], lo[32], hi[32];
            list_num(def, sizeof def, p->def);
            list_num(lo, sizeof lo, p->min);
            list_num(hi, sizeof hi, p->max);
            printf("    %-26s default %-9s range %s..%s%s\n      %s\n", p->key, def, lo, hi,
                   p->integer ? ", whole numbers" : "", p->doc);
        }
        printf("\n");
    }
    if (as_json)
        return list_print_json(arr);
    printf("In a scenario: expect: { CHECK: { KEY: VALUE, ... } }; add 'expect: fail' under a\n"
           "check when the scenario is meant to make it fail, or CHECK: off to leave out a check\n"
           "judged by default.\n");
    return 0;
}

/* One row of `dsim list runs`: text[] is scenario, engine, strategy,
 * status, started (each may be NULL). */
typedef struct list_run {
    long long id;
    char *text[5];
    bool has_dur;
    double dur;
    long long passed, failed;
} list_run;

static int list_runs_json(const list_run *rows, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        const list_run *r = &rows[i];
        json_array_append_new(
            arr,
            json_pack("{s:I, s:s, s:s?, s:s?, s:s, s:s?, s:o, s:I, s:I}", "id", (json_int_t)r->id,
                      "scenario", r->text[0] ? r->text[0] : "", "engine", r->text[1], "strategy",
                      r->text[2], "status", r->text[3] ? r->text[3] : "", "started", r->text[4],
                      "duration_s", r->has_dur ? json_real(r->dur) : json_null(), "checks_passed",
                      (json_int_t)r->passed, "checks_failed", (json_int_t)r->failed));
    }
    return list_print_json(arr);
}

/* The table: every column as wide as its longest value, so that a
 * matrix's long names are shown whole and rows that differ only at the
 * end can be told apart. */
static int list_runs_table(const list_run *rows, size_t n, const char *path)
{
    static const char *const head[5] = {"SCENARIO", "ENGINE", "STRATEGY", "STATUS",
                                        "STARTED (UTC)"};
    int w[5];
    for (int c = 0; c < 5; c++) {
        w[c] = (int)strlen(head[c]);
        for (size_t i = 0; i < n; i++)
            if (rows[i].text[c] && (int)strlen(rows[i].text[c]) > w[c])
                w[c] = (int)strlen(rows[i].text[c]);
    }
    printf("%5s  %-*s  %-*s  %-*s  %-*s  %-*s  %9s  %s\n", "RUN", w[0], head[0], w[1], head[1],
           w[2], head[2], w[3], head[3], w[4], head[4], "DURATION", "CHECKS");
    for (size_t i = 0; i < n; i++) {
        const list_run *r = &rows[i];
        char durs[32];
        if (r->has_dur)
            snprintf(durs, sizeof durs, "%.2fs", r->dur);
        else
            snprintf(durs, sizeof durs, "-");
        printf("%5lld  %-*s  %-*s  %-*s  %-*s  %-*s  %9s  %lld passed, %lld failed\n", r->id, w[0],
               r->text[0] ? r->text[0] : "", w[1], r->text[1] ? r->text[1] : "", w[2],
               r->text[2] ? r->text[2] : "", w[3], r->text[3] ? r->text[3] : "", w[4],
               r->text[4] ? r->text[4] : "", durs, r->passed, r->failed);
    }
    if (n == 0)
        printf("(no runs in %s yet)\n", path);
    return 0;
}

static int list_runs(const char *db, bool as_json, long limit)
{
    const char *path = db ? db : DSIM_STORE_DEFAULT_PATH;
    struct stat stbuf;
    if (stat(path, &stbuf) != 0) {
        fprintf(stderr,
                "dsim list runs: no results store at '%s' (%s); run 'dsim run' first, or name "
                "one with --db\n",
                path, strerror(errno));
        return 2;
    }
    /* Opening through the store migrates an old file and marks runs whose
     * process is gone as unfinished, so the list shows their real state. */
    dsim_store *st = NULL;
    if (dsim_store_open(path, &st) != DSIM_OK) {
        fprintf(stderr, "dsim list runs: %s\n", dsim_errmsg());
        return 2;
    }
    if (dsim_store_close(st) != DSIM_OK) {
        fprintf(stderr, "dsim list runs: %s\n", dsim_errmsg());
        return 2;
    }
    sqlite3 *h = NULL;
    if (sqlite3_open_v2(path, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        fprintf(stderr, "dsim list runs: cannot open '%s': %s\n", path,
                h ? sqlite3_errmsg(h) : "out of memory");
        sqlite3_close(h);
        return 2;
    }
    sqlite3_busy_timeout(h, 5000);
    const char *sql =
        "SELECT run_id, scenario, engine, strategy, status, started, duration_s, checks_passed, "
        "checks_failed FROM (SELECT * FROM run_summary ORDER BY run_id DESC LIMIT ?) "
        "ORDER BY run_id";
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) != SQLITE_OK) {
        fprintf(stderr, "dsim list runs: '%s' is not a dsim results store this dsim can read: %s\n",
                path, sqlite3_errmsg(h));
        sqlite3_close(h);
        return 2;
    }
    sqlite3_bind_int64(q, 1, limit > 0 ? limit : -1);
    list_run *rows = NULL;
    size_t n = 0, cap = 0;
    int rc;
    bool oom = false;
    while (!oom && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            list_run *nr = realloc(rows, cap * sizeof *rows);
            if (!nr) {
                oom = true;
                break;
            }
            rows = nr;
        }
        list_run *r = &rows[n++];
        r->id = sqlite3_column_int64(q, 0);
        for (int c = 0; c < 5; c++) {
            const char *t = (const char *)sqlite3_column_text(q, 1 + c);
            r->text[c] = t ? strdup(t) : NULL;
        }
        r->has_dur = sqlite3_column_type(q, 6) != SQLITE_NULL;
        r->dur = sqlite3_column_double(q, 6);
        r->passed = sqlite3_column_int64(q, 7);
        r->failed = sqlite3_column_int64(q, 8);
    }
    int bad = oom || rc != SQLITE_DONE;
    if (bad)
        fprintf(stderr, "dsim list runs: reading '%s' failed: %s\n", path,
                oom ? "out of memory" : sqlite3_errmsg(h));
    sqlite3_finalize(q);
    sqlite3_close(h);
    int out = bad ? 2 : as_json ? list_runs_json(rows, n) : list_runs_table(rows, n, path);
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < 5; c++)
            free(rows[i].text[c]);
    free(rows);
    return out;
}

int cmd_list(int argc, char **argv)
{
    const char *what = NULL, *db = NULL;
    bool as_json = false;
    long limit = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            as_json = true;
        } else if (strcmp(a, "--db") == 0 || strncmp(a, "--db=", 5) == 0) {
            if (a[4] == '=')
                db = a + 5;
            else if (i + 1 < argc)
                db = argv[++i];
            else {
                fprintf(stderr, "dsim list: --db needs a path; see 'dsim list --help'\n");
                return 2;
            }
            if (!*db) {
                fprintf(stderr, "dsim list: --db is empty (accepted: a file path)\n");
                return 2;
            }
        } else if (strcmp(a, "--limit") == 0 || strncmp(a, "--limit=", 8) == 0) {
            const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            errno = 0;
            long x = v ? strtol(v, &end, 10) : 0;
            if (!v || !*v || *end || errno || x < 1) {
                fprintf(stderr, "dsim list: --limit is '%s' (accepted: a whole number >= 1)\n",
                        v ? v : "");
                return 2;
            }
            limit = x;
        } else if (strcmp(a, "--plugin-dir") == 0 || strncmp(a, "--plugin-dir=", 13) == 0) {
            const char *v = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            struct stat sb;
            if (!v || stat(v, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
                fprintf(stderr, "dsim list: --plugin-dir is '%s' (accepted: a directory)\n",
                        v ? v : "");
                return 2;
            }
            if (dsim_cli_plugin_dir("list", v))
                return 2;
        } else if (a[0] == '-') {
            fprintf(stderr,
                    "dsim list: unknown option '%s' (accepted: --json, --db PATH, --limit N, "
                    "--plugin-dir DIR)\n",
                    a);
            return 2;
        } else if (!what) {
            what = a;
        } else {
            fprintf(stderr, "dsim list: one thing at a time: '%s' and '%s'\n", what, a);
            return 2;
        }
    }
    if (!what) {
        fprintf(stderr, "dsim list: what to list? (accepted: strategies, algorithms, checks, "
                        "runs, faults, devices)\n");
        return 2;
    }
    if (strcmp(what, "strategies") == 0)
        return list_strategies(as_json);
    if (strcmp(what, "algorithms") == 0)
        return list_algorithms(as_json);
    if (strcmp(what, "checks") == 0)
        return list_checks(as_json);
    if (strcmp(what, "runs") == 0)
        return list_runs(db, as_json, limit);
    if (strcmp(what, "faults") == 0)
        return list_faults(as_json);
    if (strcmp(what, "devices") == 0)
        return cmd_list_devices(as_json);
    fprintf(stderr,
            "dsim list: cannot list '%s' (accepted: strategies, algorithms, checks, runs, faults, "
            "devices)\n",
            what);
    return 2;
}
