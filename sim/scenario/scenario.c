/* Scenario files: YAML -> a validated dsim_scenario (see scenario.h and
 * scenarios/FORMAT.md).
 *
 * The file is read into a tree (yaml_tree.c) that keeps every node's line
 * and column; each section is then read against its list of accepted keys,
 * every value is typed and range-checked where it stands, and the
 * combinations are checked last (cluster shape against the strategy, model
 * against the data, faults against the cluster), pointing at the value that
 * decides. Nothing is run and no plugin is loaded (a plugin's file is only
 * checked to exist); a data.source's files are read, so that a malformed
 * one is refused where the scenario names it.
 *
 * This file holds the public entry points (load, parse, a matrix's
 * combinations, runnable, free) and the order the sections are read in;
 * the typed readers and one file per section are listed in parse_int.h. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsim/spi/rt.h"
#include "engine/engine.h"
#include "scenario/defaults.h"
#include "scenario/units.h"
#include "scenario/scenario_limits.h"
#include "scenario/parse_int.h"

#define SCEN_MAX_FILE             DSIM_SCEN_MAX_FILE_BYTES
#define SCEN_HEALTH_PAIR_BYTES    DSIM_SCEN_HEALTH_PAIR_BYTES
#define SCEN_REPLICA_BYTES        DSIM_SCEN_REPLICA_BYTES
#define SCEN_TIMING_REPLICA_BYTES DSIM_SCEN_TIMING_REPLICA_BYTES
#define SCEN_PARAM_BYTES          DSIM_SCEN_PARAM_BYTES

/* ---- public ---- */

void dsim_scenario_free(dsim_scenario *s)
{
    if (!s)
        return;
    free(s->path);
    free(s->text);
    free(s->name);
    free(s->description);
    free(s->engine);
    free(s->transport);
    free(s->network_preset);
    free(s->device_preset);
    free(s->intra_preset);
    free(s->tpu_notes);
    free((void *)s->train.strategy);
    free((void *)s->train.plugin_path);
    free(s->model_plugin);
    free((void *)s->train.checkpoint_path);
    for (size_t i = 0; i < s->n_faults; i++)
        free(s->faults[i].phase);
    free(s->faults);
    free(s->recovery);
    free(s->expect);
    free(s->expect_error);
    free(s->label);
    dsim_dataset_free(s->dataset);
    free(s->data_x);
    free(s->data_y);
    free(s->data_csv);
    for (size_t i = 0; i < s->n_data_labels; i++)
        free(s->data_labels[i]);
    free(s->data_labels);
    free(s);
}

static dsim_err scen_parse(const char *path, const char *text, size_t len, long k,
                           dsim_scenario **out);

dsim_err dsim_scenario_parse(const char *path, const char *text, size_t len, dsim_scenario **out)
{
    return scen_parse(path, text, len, -1, out);
}

size_t dsim_scenario_combinations(const dsim_scenario *s)
{
    return s && s->n_combinations ? s->n_combinations : 1;
}

dsim_err dsim_scenario_combination(const dsim_scenario *s, size_t k, dsim_scenario **out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_combination: no scenario or out");
    *out = NULL;
    size_t n = dsim_scenario_combinations(s);
    if (k >= n)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: combination %zu does not exist; the matrix has %zu (0..%zu)", s->path,
                        k, n, n - 1);
    return scen_parse(s->path, s->text, strlen(s->text), s->n_combinations ? (long)k : -1, out);
}

static dsim_err scen_parse(const char *path, const char *text, size_t len, long k,
                           dsim_scenario **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_parse: out is NULL");
    *out = NULL;
    if (!path)
        path = "<scenario>";
    if (!text && len > 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_parse: %s: the text is NULL", path);
    if (len > SCEN_MAX_FILE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s:1:1: the file is %zu bytes; a scenario file is at most %u bytes", path,
                        len, SCEN_MAX_FILE);
    dsim_scenario *s = calloc(1, sizeof *s);
    if (!s)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    s->path = strdup(path);
    s->text = malloc(len + 1);
    if (!s->path || !s->text) {
        dsim_scenario_free(s);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    }
    if (len)
        memcpy(s->text, text, len);
    s->text[len] = '\0';
    s->seed = DSIM_SCENARIO_DEF_SEED;
    s->combination = -1;
    s->health_interval_ns = DSIM_SCENARIO_DEF_HEALTH_INT_NS;
    s->health_timeout_ns = DSIM_SCENARIO_DEF_HEALTH_TMO_NS;
    s->health_retries = DSIM_SCENARIO_DEF_HEALTH_RETRIES;
    dsim_train_cfg_init(&s->train);

    scen_node *root = NULL;
    dsim_err e = dsim_yaml_parse(path, s->text, len, &root);
    char label[256] = "";
    if (e == DSIM_OK && root && root->kind == DSIM_YAML_MAP) {
        scen_node *mx = dsim_yaml_map_get(root, "matrix");
        scen_ctx mc = {.path = path, .s = s, .root = root};
        if (mx)
            e = scen_matrix(&mc, root, mx, k, &s->n_combinations, label, sizeof label);
        s->combination = mx ? k : -1;
    }
    if (e == DSIM_OK) {
        scen_ctx c = {.path = path, .s = s, .root = root};
        scen_state *st = calloc(1, sizeof *st);
        if (!st)
            e = DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
        if (e == DSIM_OK)
            e = scen_top(&c, st);
        if (e == DSIM_OK)
            e = scen_cluster(&c, st);
        if (e == DSIM_OK)
            e = scen_strategy(&c, st);
        if (e == DSIM_OK)
            e = scen_data(&c, st);
        if (e == DSIM_OK)
            e = scen_model(&c, st);
        if (e == DSIM_OK)
            e = scen_optim(&c, st);
        if (e == DSIM_OK)
            e = scen_mixed_precision(&c, st);
        if (e == DSIM_OK)
            e = scen_checkpoint(&c, st);
        if (e == DSIM_OK)
            e = scen_faults(&c, st);
        if (e == DSIM_OK)
            e = scen_expect(&c, st);
        if (e == DSIM_OK)
            e = scen_tpu_finish(&c, st);
        free(st);
    }
    if (e == DSIM_OK && label[0]) {
        /* the combination's name: "name[hosts=1,devices_per_host=3,seed=2]" */
        char *name = NULL;
        if (asprintf(&name, "%s[%s]", s->name, label) < 0 || !(s->label = strdup(label))) {
            free(name);
            e = DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
        } else {
            free(s->name);
            s->name = name;
        }
    }
    dsim_yaml_free(root);
    if (e != DSIM_OK) {
        dsim_scenario_free(s);
        return e;
    }
    *out = s;
    return DSIM_OK;
}

static const char *scen_file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a named pipe";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "a special file";
}

dsim_err dsim_scenario_load(const char *path, dsim_scenario **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_load: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_load: no file given");
    /* O_NONBLOCK: opening a named pipe for reading would otherwise wait for
     * a writer for ever; anything but a regular file is refused before a
     * byte is read (a pipe, a terminal or a device could block the read,
     * and a directory is no scenario). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return DSIM_ERR(errno == ENOENT ? DSIM_ENOENT : DSIM_EIO, -1, "%s: cannot open: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot open: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: is %s, not a regular file (accepted: a scenario file; dsim does "
                        "not read scenarios from pipes, devices or directories)",
                        path, scen_file_kind(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot open: %s", path, strerror(err));
    }
    char *buf = malloc(SCEN_MAX_FILE + 1);
    if (!buf) {
        fclose(f);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, SCEN_MAX_FILE + 1, f);
    int bad = ferror(f);
    int err = errno;
    fclose(f);
    if (bad) {
        free(buf);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot read: %s", path, strerror(err));
    }
    if (n > SCEN_MAX_FILE) {
        free(buf);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s:1:1: the file is larger than %u bytes; a scenario file is at most "
                        "that",
                        path, SCEN_MAX_FILE);
    }
    dsim_err e = dsim_scenario_parse(path, buf, n, out);
    free(buf);
    return e;
}

const char *dsim_scenario_engine(const dsim_scenario *s)
{
    return s->train.engine ? s->train.engine : s->engine ? s->engine : "threads";
}

/* DSIM_ENOTSUP with "FILE:LINE:COLUMN: " (at's position; "FILE: " when
 * the thing was not given in the file). */
static dsim_err scen_refuse(const dsim_scenario *s, dsim_src_pos at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static dsim_err scen_refuse(const dsim_scenario *s, dsim_src_pos at, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at.line > 0)
        return DSIM_ERR(DSIM_ENOTSUP, -1, "%s:%d:%d: %s", s->path, at.line, at.column, msg);
    return DSIM_ERR(DSIM_ENOTSUP, -1, "%s: %s", s->path, msg);
}

/* "engine threads (line 3)", "engine threads (overridden)", "engine
 * threads (the default)": where the engine a refusal is about was chosen. */
static const char *scen_engine_said(const dsim_scenario *s, char *buf, size_t cap)
{
    const char *eng = dsim_scenario_engine(s);
    if (s->engine_overridden)
        snprintf(buf, cap, "engine %s (overridden)", eng);
    else if (s->engine_pos.line > 0)
        snprintf(buf, cap, "engine %s (line %d)", eng, s->engine_pos.line);
    else
        snprintf(buf, cap, "engine %s (the default)", eng);
    return buf;
}

bool dsim_scenario_cpu_warning(const dsim_scenario *s, char *text, size_t cap)
{
    const dsim_engine_ops *ops;
    if (!s || dsim_engine_find(dsim_scenario_engine(s), &ops) != DSIM_OK) {
        dsim_clear_error();
        return false;
    }
    int cpus = dsim_rt_cpus(), w = s->train.hosts;
    if (!(ops->flags & DSIM_ENGINE_FORKS) || !dsim_train_runs_health_check(&s->train) || cpus < 1 ||
        w <= DSIM_SCEN_HEALTH_WORKERS_PER_CPU * cpus)
        return false;
    const dsim_train_cfg *t = &s->train;
    char iv[32], tm[32];
    dsim_unit_format_duration(t->health_interval_ns, iv, sizeof iv);
    dsim_unit_format_duration(t->health_timeout_ns, tm, sizeof tm);
    snprintf(text, cap,
             "warning: %d worker processes with the health check on share %d CPU%s: every %s "
             "its rounds ping every pair of workers (%lld pings), and a worker starved of CPU "
             "can miss %d ping(s) of %s in a row and be reported down though alive, as "
             "TensorFlow's check would on such a machine (at most %d workers a CPU answer in "
             "time here); for this many workers use engine sim or threads, or raise "
             "strategy.health_check.timeout\n",
             w, cpus, cpus == 1 ? "" : "s", iv, (long long)w * (long long)(w - 1),
             t->health_retries < 1 ? 1 : t->health_retries, tm, DSIM_SCEN_HEALTH_WORKERS_PER_CPU);
    return true;
}

dsim_err dsim_scenario_runnable(const dsim_scenario *s)
{
    if (!s)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_runnable: the scenario is NULL");
    const char *eng = dsim_scenario_engine(s);
    const dsim_engine_ops *ops;
    char said[96];
    if (dsim_engine_find(eng, &ops) != DSIM_OK) {
        dsim_error er;
        dsim_error_copy(&er);
        return scen_refuse(s, s->engine_overridden ? (dsim_src_pos){0, 0} : s->engine_pos, "%s",
                           er.msg);
    }
    int64_t replicas = (int64_t)s->train.hosts * s->train.devices_per_host;
    if ((ops->flags & DSIM_ENGINE_THREAD_PER_REPLICA) && replicas > DSIM_TRAIN_MAX_THREAD_REPLICAS)
        return scen_refuse(s, s->cluster_pos,
                           "cluster: %d host(s) x %d device(s) is %lld replicas on %s, which "
                           "runs a thread per replica: accepted at most %d there; engine sim "
                           "runs up to %d (a coroutine each)",
                           s->train.hosts, s->train.devices_per_host, (long long)replicas,
                           scen_engine_said(s, said, sizeof said), DSIM_TRAIN_MAX_THREAD_REPLICAS,
                           DSIM_TRAIN_MAX_REPLICAS);
    /* Under sim nothing but memory bounds a job below the parse limit, and
     * with the health check on its first round does: it pings every pair
     * of workers at once, as TF's check does (measured on this engine,
     * reports/bench-sim-scale.txt: some 300-400 bytes per pair in the
     * transport's sequence streams, the queued pings and the checks'
     * state, and about 2.5 us of CPU). Said before the run rather than
     * found by the kernel's out-of-memory killer midway. */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    if (!(ops->flags & DSIM_ENGINE_THREAD_PER_REPLICA) && have > 0) {
        /* A job of many replicas: each costs its share of the engine,
         * transport and store, and its model's copies, unless timing only. */
        bool timing = s->train.synthetic_params > 0;
        /* a model fitted to the data (in_dim 0) is about its linear one */
        double params = s->train.model.in_dim > 0
                            ? (double)dsim_model_num_params(&s->train.model)
                            : (double)(s->train.data.in_dim + 1) * (double)s->train.data.out_dim;
        double each = timing ? SCEN_TIMING_REPLICA_BYTES
                             : SCEN_REPLICA_BYTES + (params > 0 ? params : 0) * SCEN_PARAM_BYTES;
        double need = (double)replicas * each;
        if (need > have)
            return scen_refuse(s, s->cluster_pos,
                               "cluster: %lld replicas under %s take about %.1f GiB (some %.0f "
                               "KiB each%s), more than this machine's %.1f GiB; run at most %lld "
                               "replicas here%s",
                               (long long)replicas, scen_engine_said(s, said, sizeof said),
                               need / 1073741824.0, each / 1024.0,
                               timing ? ", timing only" : " with the model's copies",
                               have / 1073741824.0, (long long)(have / each),
                               timing ? ""
                                      : ", or cost the job without payloads (model.synthetic: "
                                        "timing only)");
    }
    if (dsim_train_runs_health_check(&s->train)) {
        double need = (double)s->train.hosts * (double)s->train.hosts * SCEN_HEALTH_PAIR_BYTES;
        if (have > 0 && need > have) {
            int fit = (int)sqrt(have / SCEN_HEALTH_PAIR_BYTES);
            return scen_refuse(s, s->cluster_pos,
                               "cluster: %d workers with the health check on: its first round "
                               "pings every pair of workers, which takes about %.1f GiB (%d^2 "
                               "pairs x %d bytes), more than this machine's %.1f GiB; turn the "
                               "check off (strategy.health_check: {interval: 0}) or run at most "
                               "%d workers here",
                               s->train.hosts, need / 1073741824.0, s->train.hosts,
                               SCEN_HEALTH_PAIR_BYTES, have / 1073741824.0, fit);
        }
    }
    if (s->network_given && (ops->flags & DSIM_ENGINE_REAL_LINKS))
        return scen_refuse(s, s->network_pos,
                           "cluster.network models the links of the threads and sim engines; "
                           "on %s the links are real (tcp over loopback): remove "
                           "cluster.network, or use engine sim",
                           scen_engine_said(s, said, sizeof said));
    const char *tp = s->train.transport;
    if (tp && strcmp(tp, "inproc") != 0 && !(ops->flags & DSIM_ENGINE_TCP))
        return scen_refuse(s, s->transport_pos,
                           "transport %s needs real threads and wall-clock time; %s runs its "
                           "workers on the inproc transport only: leave the transport out, or "
                           "use engine threads or processes",
                           tp, scen_engine_said(s, said, sizeof said));
    if (tp && strcmp(tp, "inproc") == 0 && !(ops->flags & DSIM_ENGINE_INPROC))
        return scen_refuse(s, s->transport_pos,
                           "transport inproc joins ranks of one address space; %s runs every "
                           "worker in a process of its own: use shm (its default on one host) "
                           "or tcp",
                           scen_engine_said(s, said, sizeof said));
    if (s->train.synthetic_params > 0 && !(ops->flags & DSIM_ENGINE_VIRTUAL_TIME))
        return scen_refuse(s, s->synthetic_pos,
                           "model.synthetic runs timing only, under engine sim (its virtual "
                           "clock charges the compute, its network model the messages); this "
                           "is %s: use engine sim",
                           scen_engine_said(s, said, sizeof said));
    for (size_t i = 0; i < s->n_expect; i++) {
        const dsim_expect *x = &s->expect[i];
        if (!x->check->available)
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "%s:%d:%d: expect.%s: the %s check is not supported yet; remove it "
                            "to run the rest",
                            s->path, x->pos.line, x->pos.column, x->check->name, x->check->name);
    }
    /* A run would write its first checkpoint only after some steps: say now
     * that it cannot. */
    const char *ck = s->train.checkpoint_path;
    if (ck && s->train.checkpoint_every) {
        char *copy = strdup(ck);
        if (!copy)
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", s->path);
        const char *dir = dirname(copy);
        struct stat sb;
        dsim_err e = DSIM_OK;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            char cwd[512];
            if (!getcwd(cwd, sizeof cwd))
                snprintf(cwd, sizeof cwd, ".");
            e = DSIM_ERR(DSIM_ENOENT, -1,
                         "%s:%d:%d: checkpoint.path: the directory '%s' of '%s' does not exist "
                         "(a relative path is taken from the working directory, %s); create it "
                         "or change the path",
                         s->path, s->checkpoint_pos.line, s->checkpoint_pos.column, dir, ck, cwd);
        }
        free(copy);
        return e;
    }
    return DSIM_OK;
}

bool dsim_scenario_plugin_notice(const dsim_scenario *s, dsim_plugin_notice *out)
{
    memset(out, 0, sizeof *out);
    if (!s || !s->train.plugin_path)
        return false;
    const char *given = s->train.plugin_path;
    char real[PATH_MAX], dir[PATH_MAX];
    snprintf(out->file, sizeof out->file, "%s", realpath(given, real) ? real : given);
    /* the scenario file's folder, as the kernel sees it */
    char *copy = strdup(s->path ? s->path : ".");
    bool have_dir = copy && realpath(dirname(copy), dir);
    free(copy);
    size_t dl = have_dir ? strlen(dir) : 0;
    bool inside = have_dir && strncmp(out->file, dir, dl) == 0 &&
                  (out->file[dl] == '/' || (dl == 1 && dir[0] == '/'));
    bool by_path =
        s->plugin_found == DSIM_PLUGIN_BY_PATH || s->plugin_found == DSIM_PLUGIN_ABSOLUTE;
    out->outside = by_path && !inside;
    const char *where = "";
    if (out->outside && s->plugin_found == DSIM_PLUGIN_ABSOLUTE)
        where = ", outside the scenario file's folder (an absolute path)";
    else if (out->outside)
        where = ", outside the scenario file's folder (the path climbs out of it)";
    else if (s->plugin_found == DSIM_PLUGIN_SEARCHED)
        where = ", found in the plugin search path (--plugin-dir, $DSIM_PLUGIN_PATH, the plugin "
                "folders)";
    snprintf(out->text, sizeof out->text,
             "strategy.plugin: 'dsim run' will load %s%s; loading a plugin runs its code in the "
             "dsim process with your rights, as running a program would ('dsim run "
             "--no-plugins' refuses a scenario that names one)",
             out->file, where);
    return true;
}
