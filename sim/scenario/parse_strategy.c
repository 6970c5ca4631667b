/* The scenario's strategy: section (parse_int.h): a built-in strategy and
 * the cluster shapes it accepts, or a plugin (found next to the scenario,
 * in $DSIM_PLUGIN_PATH or the plugin folders, never loaded here); the
 * all-reduce algorithm (src/coll/algos.c's table), the parameter-server
 * mode, the collective timeout and the health check. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "dsim_config.h"
#include "scenario/defaults.h"
#include "scenario/parse_int.h"

static const scen_name scen_ps_modes[] = {{"sync", DSIM_PS_SYNC}, {"async", DSIM_PS_ASYNC}};

/* The built-in strategies and the cluster shapes they accept (strategy.h). */
typedef struct scen_builtin {
    const char *name;
    bool one_host, one_device, needs_ps, no_ps, needs_tpu;
} scen_builtin;

static const scen_builtin scen_builtins[] = {
    {"one_device", true, true, false, true, false},
    {"mirrored", true, false, false, true, false},
    {"central_storage", true, false, false, true, false},
    {"multi_worker_mirrored", false, false, false, true, false},
    {"parameter_server", false, false, true, false, false},
    {"tpu", false, false, false, true, true},
};

static const scen_builtin *scen_builtin_find(const char *name)
{
    for (size_t i = 0; i < SCEN_N(scen_builtins); i++)
        if (strcmp(scen_builtins[i].name, name) == 0)
            return &scen_builtins[i];
    return NULL;
}

enum { S_NAME, S_PLUGIN, S_COMM, S_PSMODE, S_TIMEOUT, S_HEALTH, S_DYN, S_GDTYPE, S_N };
static const char *const scen_strategy_keys[S_N] = {
    "name",    "plugin",       "communication",      "ps_mode",
    "timeout", "health_check", "dynamic_batch_size", "gradient_dtype"};
static const scen_name scen_grad_dtypes[] = {
    {"float32", DSIM_F32}, {"float16", DSIM_F16}, {"bfloat16", DSIM_BF16}};
enum { H_INTERVAL, H_TIMEOUT, H_RETRIES, H_N };
static const char *const scen_health_keys[H_N] = {"interval", "timeout", "retries"};

static bool scen_strategy_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 31)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return false;
    return true;
}

/* Finds a strategy plugin. A path with a '/' is taken relative to the
 * scenario file's directory (or as is, when absolute). A bare file name is
 * looked for in that directory, then in each directory of $DSIM_PLUGIN_PATH
 * (colon-separated; `dsim run --plugin-dir` prepends to it), then in this
 * build's and the installed plugin directories (dsim_scenario_plugin_dirs), so a
 * catalogue scenario can name its plugin without knowing where it was built.
 * Returns the first candidate that is a regular file, else NULL with the
 * places searched in `searched`. */
static int scen_is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static char *scen_join(const char *dir, size_t dlen, const char *file)
{
    char *out = NULL;
    if (dlen == 0) {
        /* a scenario path without a folder: relative to the working one */
        dir = ".";
        dlen = 1;
    }
    if (asprintf(&out, "%.*s/%s", (int)dlen, dir, file) < 0)
        return NULL;
    return out;
}

static char *scen_search_dirs(const char *dirs, const char *file, char *searched, size_t cap)
{
    for (const char *d = dirs; d && *d;) {
        const char *end = strchr(d, ':');
        size_t len = end ? (size_t)(end - d) : strlen(d);
        if (len) {
            char *cand = scen_join(d, len, file);
            if (cand && scen_is_file(cand))
                return cand;
            size_t used = strlen(searched);
            snprintf(searched + used, cap - used, "%s%.*s", used ? ", " : "", (int)len, d);
            free(cand);
        }
        d = end ? end + 1 : NULL;
    }
    return NULL;
}

static char scen_plugin_dirs[8192];
static pthread_once_t scen_plugin_dirs_once = PTHREAD_ONCE_INIT;

static void scen_plugin_dirs_init(void)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    size_t root = strlen(DSIM_BUILD_ROOT), u = 0;
    size_t cap = sizeof scen_plugin_dirs;
    /* the build tree's plugins: only for a program of this build tree */
    if (n > 0 && strncmp(exe, DSIM_BUILD_ROOT, root) == 0 && exe[root] == '/')
        u += (size_t)snprintf(scen_plugin_dirs + u, cap - u, "%s:", DSIM_BUILD_PLUGIN_DIRS);
    /* the prefix the running program is installed in (PREFIX/bin/dsim) */
    char *bin = n > 0 ? strrchr(exe, '/') : NULL;
    if (bin && DSIM_PLUGIN_DIR_IN_PREFIX[0]) {
        *bin = '\0';
        char *up = strrchr(exe, '/');
        if (up && strcmp(up, "/bin") == 0) {
            *up = '\0';
            if (u < cap)
                u += (size_t)snprintf(scen_plugin_dirs + u, cap - u, "%s/%s:", exe[0] ? exe : "",
                                      DSIM_PLUGIN_DIR_IN_PREFIX);
        }
    }
    if (u < cap)
        snprintf(scen_plugin_dirs + u, cap - u, "%s", DSIM_INSTALLED_PLUGIN_DIR);
}

const char *dsim_scenario_plugin_dirs(void)
{
    pthread_once(&scen_plugin_dirs_once, scen_plugin_dirs_init);
    return scen_plugin_dirs;
}

char *scen_plugin_resolve(const char *scenario_path, const char *p, char *searched, size_t cap,
                          int *how)
{
    searched[0] = '\0';
    *how = p[0] == '/'      ? DSIM_PLUGIN_ABSOLUTE
           : strchr(p, '/') ? DSIM_PLUGIN_BY_PATH
                            : DSIM_PLUGIN_NEXT_TO_FILE;
    if (p[0] == '/') {
        snprintf(searched, cap, "%s", p);
        return scen_is_file(p) ? strdup(p) : NULL;
    }
    const char *slash = strrchr(scenario_path, '/');
    size_t dlen = slash ? (size_t)(slash - scenario_path) : 0;
    char *cand = scen_join(scenario_path, dlen, p);
    if (cand && scen_is_file(cand))
        return cand;
    snprintf(searched, cap, "%.*s", (int)(dlen ? dlen : 1), dlen ? scenario_path : ".");
    free(cand);
    if (strchr(p, '/'))
        return NULL;
    *how = DSIM_PLUGIN_SEARCHED;
    char *found = scen_search_dirs(getenv("DSIM_PLUGIN_PATH"), p, searched, cap);
    if (!found)
        found = scen_search_dirs(dsim_scenario_plugin_dirs(), p, searched, cap);
    return found;
}

dsim_err dsim_scenario_plugin_find(const char *file, char **out)
{
    char searched[1024];
    int how;
    *out = file && *file ? scen_plugin_resolve("./plugin", file, searched, sizeof searched, &how)
                         : NULL;
    if (*out)
        return DSIM_OK;
    return DSIM_ERR(DSIM_ENOENT, -1,
                    "strategy plugin '%s' not found (looked in: %s); build it, give its path, "
                    "or add its directory to DSIM_PLUGIN_PATH / --plugin-dir",
                    file ? file : "", file && *file ? searched : "nowhere: no file given");
}

/* What is wrong with the cluster's shape for built-in strategy b, written
 * to buf; false when nothing is. */
static bool scen_shape_problem(const dsim_train_cfg *t, const scen_builtin *b, char *buf,
                               size_t cap)
{
    char shape[128];
    snprintf(shape, sizeof shape, "%d host%s x %d device%s, %d parameter server%s", t->hosts,
             t->hosts == 1 ? "" : "s", t->devices_per_host, t->devices_per_host == 1 ? "" : "s",
             t->num_ps, t->num_ps == 1 ? "" : "s");
    if (b->needs_tpu && t->tpu.replicas == 0)
        snprintf(buf, cap,
                 "strategy.name: tpu (TPUStrategy) runs on a TPU slice, but the cluster is %s; "
                 "give one, e.g. cluster: {tpu: v3-8} (simulated: no TPU is used), or use "
                 "mirrored / multi_worker_mirrored",
                 shape);
    else if (b->one_device && (t->hosts != 1 || t->devices_per_host != 1 || t->num_ps != 0))
        snprintf(buf, cap,
                 "strategy.name: one_device runs on 1 host x 1 device without parameter "
                 "servers, but the cluster is %s; use mirrored (one host, several devices) or "
                 "multi_worker_mirrored (several hosts)",
                 shape);
    else if (b->one_host && (t->hosts != 1 || t->num_ps != 0))
        snprintf(buf, cap,
                 "strategy.name: %s runs on one host without parameter servers, but the cluster "
                 "is %s; use multi_worker_mirrored for several hosts",
                 t->strategy, shape);
    else if (b->no_ps && t->num_ps != 0)
        snprintf(buf, cap,
                 "strategy.name: %s runs without parameter servers, but the cluster is %s; use "
                 "parameter_server, or set cluster.ps: 0",
                 t->strategy, shape);
    else if (b->needs_ps && t->num_ps < 1)
        snprintf(buf, cap,
                 "strategy.name: parameter_server needs at least one parameter server, but the "
                 "cluster is %s; set cluster.ps: 1 or more",
                 shape);
    else
        return false;
    return true;
}

dsim_err dsim_scenario_check_shape(const dsim_scenario *s)
{
    const dsim_train_cfg *t = &s->train;
    const scen_builtin *b = t->strategy ? scen_builtin_find(t->strategy) : NULL;
    char why[512];
    if (!b || t->plugin_path || !scen_shape_problem(t, b, why, sizeof why))
        return DSIM_OK;
    return DSIM_ERR(DSIM_EINVAL, -1, "%s", why);
}

/* The cluster's shape, for the built-ins (a plugin checks its own when it
 * is loaded). */
static dsim_err scen_strategy_shape(const scen_ctx *c, const scen_state *st)
{
    const dsim_train_cfg *t = &c->s->train;
    const scen_map *m = &st->strategy;
    const scen_builtin *b = scen_builtin_find(t->strategy);
    if (!b || t->plugin_path)
        return DSIM_OK;
    const scen_node *at = st->strategy_at ? st->strategy_at : st->cluster.at;
    char why[512];
    if (b->needs_tpu && t->tpu.replicas == 0 && scen_shape_problem(t, b, why, sizeof why))
        return scen_fail(c, at, "%s", why);
    if (m->val[S_DYN] && !b->needs_tpu)
        return scen_fail(c, m->key[S_DYN],
                         "strategy.dynamic_batch_size: only tpu (TPUStrategy's "
                         "experimental_enable_dynamic_batch_size) has it; %s runs batches of "
                         "any size (remove dynamic_batch_size)",
                         t->strategy);
    if (scen_shape_problem(t, b, why, sizeof why))
        return scen_fail(c, at, "%s", why);
    if (!b->needs_ps && m->val[S_PSMODE])
        return scen_fail(c, m->key[S_PSMODE],
                         "strategy.ps_mode: only parameter_server has a mode; %s does not "
                         "use it (remove ps_mode)",
                         t->strategy);
    return DSIM_OK;
}

dsim_err scen_strategy(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    dsim_train_cfg *t = &s->train;
    scen_map *m = &st->strategy;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_STRATEGY], st->top.key[T_STRATEGY], "strategy",
                             scen_strategy_keys, S_N, m));
    char *name = NULL, *plugin = NULL;
    dsim_err e = DSIM_OK;
    if (m->val[S_NAME])
        e = scen_str_v(c, m->val[S_NAME], "strategy.name", "a strategy name", &name);
    else
        e = scen_set_str(c, &name, DSIM_SCENARIO_DEF_STRATEGY);
    if (e == DSIM_OK && m->val[S_PLUGIN])
        e = scen_str_v(c, m->val[S_PLUGIN], "strategy.plugin",
                       "the path of a strategy plugin (.so)", &plugin);
    if (e != DSIM_OK) {
        free(name);
        free(plugin);
        return e;
    }
    t->strategy = name;
    st->strategy_at = m->val[S_NAME] ? m->val[S_NAME] : NULL;
    char show[96], names[512];
    if (plugin) {
        const scen_node *pv = m->val[S_PLUGIN];
        if (!m->val[S_NAME]) {
            free(plugin);
            return scen_fail(c, m->key[S_PLUGIN],
                             "strategy.plugin: a plugin needs strategy.name: the name its "
                             "strategy registers under ([a-z0-9_], 1-31 characters)");
        }
        if (!scen_strategy_name_ok(name)) {
            free(plugin);
            return scen_fail(c, m->val[S_NAME],
                             "strategy.name: %s is not a strategy name; accepted: 1-31 "
                             "characters of a-z, 0-9 and _",
                             scen_show(m->val[S_NAME], show, sizeof show));
        }
        if (scen_builtin_find(name)) {
            free(plugin);
            return scen_fail(c, m->val[S_NAME],
                             "strategy.name: '%s' is a built-in strategy; a plugin registers "
                             "under a name of its own (or remove plugin: to run the built-in)",
                             name);
        }
        char searched[1024];
        int how = 0;
        char *resolved = scen_plugin_resolve(c->path, plugin, searched, sizeof searched, &how);
        if (!resolved) {
            dsim_err fe = scen_fail(c, pv,
                                    "strategy.plugin: '%s' not found; build the plugin, fix the "
                                    "path (relative to the scenario file), or add its directory "
                                    "to DSIM_PLUGIN_PATH / --plugin-dir (looked in: %s)",
                                    plugin, searched);
            free(plugin);
            return fe;
        }
        free(plugin);
        t->plugin_path = resolved;
        s->plugin_pos = scen_pos(pv);
        s->plugin_found = how;
    } else if (!dsim_strategy_exists(name)) {
        dsim_strategy_list(names, sizeof names);
        return scen_fail(c, scen_where(m, S_NAME),
                         "strategy.name: %s is not a registered strategy; accepted: %s (or "
                         "your own: add plugin: PATH/TO/strategy.so)",
                         scen_show(m->val[S_NAME], show, sizeof show), names);
    }

    scen_name algos[DSIM_ALGO_COUNT];
    for (int a = 0; a < DSIM_ALGO_COUNT; a++) {
        algos[a].name = dsim_algo_name((dsim_algo)a);
        algos[a].value = a;
    }
    int v = (int)t->communication;
    DSIM_CHECK(scen_enum(c, m, S_COMM, "an algorithm", algos, DSIM_ALGO_COUNT, &v));
    t->communication = (dsim_algo)v;
    v = (int)t->ps_mode;
    DSIM_CHECK(scen_enum(c, m, S_PSMODE, "a parameter-server mode", scen_ps_modes,
                         SCEN_N(scen_ps_modes), &v));
    t->ps_mode = (dsim_ps_mode)v;
    /* Horovod's Compression.fp16: gradients all-reduced in a narrow type. */
    v = (int)t->gradient_dtype;
    DSIM_CHECK(scen_enum(c, m, S_GDTYPE, "a gradient dtype", scen_grad_dtypes,
                         SCEN_N(scen_grad_dtypes), &v));
    t->gradient_dtype = (dsim_dtype)v;
    DSIM_CHECK(scen_builtin_fits(c, m->val[S_GDTYPE], "strategy.gradient_dtype"));
    /* 0: no deadline (TF's timeout_seconds=None): only the health check or
     * an abort ends a wait. */
    DSIM_CHECK(scen_duration(c, m, S_TIMEOUT, 0, &t->timeout_ns));

    scen_map *h = &st->health;
    DSIM_CHECK(scen_map_read(c, m->val[S_HEALTH], m->key[S_HEALTH], "strategy.health_check",
                             scen_health_keys, H_N, h));
    DSIM_CHECK(scen_duration(c, h, H_INTERVAL, 0, &s->health_interval_ns));
    DSIM_CHECK(scen_duration(c, h, H_TIMEOUT, 1, &s->health_timeout_ns));
    int64_t r = s->health_retries;
    DSIM_CHECK(scen_int(c, h, H_RETRIES, 0, DSIM_SCEN_MAX_RETRIES, &r));
    s->health_retries = (int)r;
    t->health_interval_ns = s->health_interval_ns;
    t->health_timeout_ns = s->health_timeout_ns;
    t->health_retries = s->health_retries;

    /* TF's RunOptions.experimental_enable_dynamic_batch_size (default on);
     * off, only static shapes run (checked once the data is read) */
    bool dyn = true;
    DSIM_CHECK(scen_bool(c, m, S_DYN, &dyn));
    t->static_shapes = !dyn;
    st->dyn_at = m->val[S_DYN];

    return scen_strategy_shape(c, st);
}
