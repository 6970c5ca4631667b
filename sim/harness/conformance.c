/* dsim conformance: the battery run against one strategy (conformance.h). */
#include "conformance.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsim/spi/strategy.h"
#include "engine/engine.h"
#include "scenario/scenario.h"

static const char *const conf_verdicts[] = {"pass", "FAIL", "n/a", "ERROR"};

const char *dsim_conf_verdict_name(dsim_conf_verdict v)
{
    return (unsigned)v < 4 ? conf_verdicts[v] : "?";
}

static double conf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether `name` is an item of the comma list. */
static bool conf_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && *p == ' ')
            p++, len--;
        while (len && p[len - 1] == ' ')
            len--;
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

/* Every item of the comma list passes ok(); else DSIM_EINVAL naming the
 * first that does not and the accepted ones. */
static dsim_err conf_check_list(const char *list, const char *what, bool (*ok)(const char *),
                                const char *accepted)
{
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        char item[64];
        snprintf(item, sizeof item, "%.*s", (int)(end ? (size_t)(end - p) : strlen(p)), p);
        char *t = item;
        while (*t == ' ')
            t++;
        size_t len = strlen(t);
        while (len && t[len - 1] == ' ')
            t[--len] = '\0';
        if (!*t || !ok(t))
            return DSIM_ERR(DSIM_EINVAL, -1, "%s '%s' is not one (accepted: %s)", what, t,
                            accepted);
        p = end ? end + 1 : NULL;
    }
    return DSIM_OK;
}

static bool conf_case_known(const char *name)
{
    for (size_t i = 0; i < dsim_conf_case_count(); i++)
        if (strcmp(dsim_conf_case_at(i)->name, name) == 0)
            return true;
    return false;
}

static bool conf_engine_known(const char *name)
{
    for (int i = 0; dsim_engine_at(i); i++)
        if (strcmp(dsim_engine_at(i)->name, name) == 0)
            return true;
    return false;
}

/* ---- fitting a case to the strategy ------------------------------------ */

typedef struct conf_fit {
    dsim_strategy_shape shape;
    dsim_tpu_topology tpu; /* a strategy that runs on TPU slices only: the slice */
    bool on_tpu;
    dsim_strategy_traits traits;
    bool ok;
    char why[700];     /* not applicable: the reason */
    long global_batch; /* > 0: run with this global batch instead of the case's */
    char note[200];    /* what was fitted beyond the shape, for the case's message */
} conf_fit;

static void conf_fit_case(const dsim_conf_opts *o, const dsim_conf_case *c, conf_fit *f)
{
    memset(f, 0, sizeof *f);
    dsim_ps_mode mode = DSIM_PS_SYNC;
    if (o->ps_mode)
        dsim_ps_mode_parse(o->ps_mode, &mode);
    const int R = c->hosts * c->devices_per_host;
    const int cand[][3] = {{c->hosts, c->devices_per_host, 0},
                           {c->hosts, c->devices_per_host, 2},
                           {c->hosts, c->devices_per_host, 1},
                           {1, R, 0},
                           {1, R, 2},
                           {1, 1, 0},
                           {1, 1, 1}};
    char first[512] = "";
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        dsim_strategy_shape sh = {.hosts = cand[i][0],
                                  .devices_per_host = cand[i][1],
                                  .num_replicas = cand[i][0] * cand[i][1],
                                  .num_ps = cand[i][2],
                                  .ps_mode = mode};
        dsim_err e = dsim_strategy_probe(o->strategy, &sh, &f->traits);
        if (e == DSIM_OK) {
            f->shape = sh;
            f->ok = true;
            break;
        }
        if (!first[0])
            snprintf(first, sizeof first, "%s", dsim_errmsg());
    }
    /* A TPUStrategy of one's own runs on a slice only: the smallest slice
     * of the case's kind (one replica, one host, several hosts). */
    const char *slice = R == 1 ? "v5e-1" : c->hosts == 1 ? "v3-8" : "v4-16";
    if (!f->ok && dsim_tpu_topology_parse(slice, &f->tpu) == DSIM_OK) {
        dsim_strategy_shape sh = {.hosts = f->tpu.hosts,
                                  .devices_per_host = f->tpu.replicas_per_host,
                                  .num_replicas = f->tpu.replicas,
                                  .ps_mode = mode,
                                  .tpu = &f->tpu};
        if (dsim_strategy_probe(o->strategy, &sh, &f->traits) == DSIM_OK) {
            sh.tpu = NULL; /* f may move: conf_text names the slice */
            f->shape = sh;
            f->ok = f->on_tpu = true;
            first[0] = '\0';
        }
    }
    dsim_clear_error();
    if (!f->ok) {
        snprintf(f->why, sizeof f->why, "%s accepts none of the shapes tried for %d x %d: %s",
                 o->strategy, c->hosts, c->devices_per_host, first);
        return;
    }
    const dsim_strategy_shape *s = &f->shape;
    f->ok = false;
    char runs[600];
    if (first[0])
        snprintf(runs, sizeof runs, "%s", first);
    else
        snprintf(runs, sizeof runs, "%s runs %d host(s) x %d device(s) here", o->strategy, s->hosts,
                 s->devices_per_host);
    if ((c->needs & DSIM_CONF_PEERS) && s->num_replicas < 2)
        snprintf(f->why, sizeof f->why, "needs 2 or more replicas (a fault on rank 1): %s", runs);
    else if ((c->needs & DSIM_CONF_WORKERS) && s->hosts < 2)
        snprintf(f->why, sizeof f->why,
                 "needs 2 or more workers (a partition cuts workers apart): %s", runs);
    else if ((c->needs & DSIM_CONF_SAVE) && !f->traits.can_save)
        snprintf(f->why, sizeof f->why,
                 "needs checkpoints; %s has no save member (strategy %s does not support "
                 "checkpoints)",
                 o->strategy, o->strategy);
    else if ((c->needs & DSIM_CONF_NARROW) && (strcmp(o->strategy, "parameter_server") == 0 ||
                                               strcmp(o->strategy, "central_storage") == 0))
        snprintf(f->why, sizeof f->why,
                 "needs a strategy that all-reduces its gradients (strategy.gradient_dtype); %s "
                 "sends them to %s in float32",
                 o->strategy,
                 o->strategy[0] == 'p' ? "the parameter servers" : "its host's variables");
    else if ((c->needs & DSIM_CONF_WHOLE_GRAD) && strcmp(o->strategy, "parameter_server") == 0)
        snprintf(f->why, sizeof f->why,
                 "needs the whole gradient on a replica (global_clipnorm clips by its norm); "
                 "parameter_server's servers each apply their own shard of it");
    else if ((c->needs & DSIM_CONF_WHOLE_VARS) && strcmp(o->strategy, "parameter_server") == 0)
        snprintf(f->why, sizeof f->why,
                 "needs optimizers that hold whole variables (LAMB's trust ratio is per "
                 "variable); parameter_server's servers each apply their own shard of them");
    else if ((c->needs & DSIM_CONF_SYNC) && f->traits.replicas_in_sync < s->num_replicas)
        snprintf(f->why, sizeof f->why,
                 "needs a synchronous strategy (a restarted job must replay the same updates to "
                 "end where a clean run ends); %s is asynchronous here (%d of %d replicas in "
                 "sync)",
                 o->strategy, f->traits.replicas_in_sync, s->num_replicas);
    else
        f->ok = true;
}

/* ---- the scenario of a case ---------------------------------------------- */

static void conf_yaml_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Where the number of the case's global batch starts in its data (NULL:
 * it has none), and the number, into *gb (0: none). */
static const char *conf_batch_at(const dsim_conf_case *c, long *gb)
{
    const char *at = c->data ? strstr(c->data, "global_batch: ") : NULL;
    if (at)
        at += strlen("global_batch: ");
    *gb = at ? strtol(at, NULL, 10) : 0;
    return at;
}

static char *conf_text(const dsim_conf_opts *o, const dsim_conf_case *c, const conf_fit *fit,
                       const char *engine)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "# dsim conformance: case %s for strategy %s (%s)\n", c->name, o->strategy,
            c->about);
    fprintf(f, "name: %s.%s\nseed: 1\nengine: %s\n", c->name, engine, engine);
    if (fit->on_tpu)
        fprintf(f, "cluster: {tpu: %s}\n", fit->tpu.name);
    else
        fprintf(f, "cluster: {hosts: %d, devices_per_host: %d, ps: %d}\n", fit->shape.hosts,
                fit->shape.devices_per_host, fit->shape.num_ps);
    fprintf(f, "strategy: {name: %s", o->strategy);
    if (o->plugin) {
        fputs(", plugin: ", f);
        conf_yaml_str(f, o->plugin);
    }
    if (o->ps_mode)
        fprintf(f, ", ps_mode: %s", o->ps_mode);
    /* A bound on every wait, so that a strategy that hangs is stopped by
     * the watchdog (twice the timeout) well before the run's own bound. */
    fprintf(f, ", %s", c->strategy_extra ? c->strategy_extra : "timeout: 10s");
    fputs("}\n", f);
    if (c->model)
        fprintf(f, "model: %s\n", c->model);
    if (c->optimizer)
        fprintf(f, "optimizer: %s\n", c->optimizer);
    long gb;
    const char *at = conf_batch_at(c, &gb);
    if (at && fit->global_batch > 0) {
        fprintf(f, "data: %.*s%ld%s\n", (int)(at - c->data), c->data, fit->global_batch,
                at + strspn(at, "0123456789"));
    } else if (c->data) {
        fprintf(f, "data: %s\n", c->data);
    }
    if (c->checkpoint && fit->traits.can_save)
        fprintf(f, "checkpoint: {path: %s.ckpt, %s}\n", c->name, c->checkpoint);
    if (c->faults)
        fprintf(f, "faults: %s\n", c->faults);
    if (c->recovery)
        fprintf(f, "recovery: %s\n", c->recovery);
    if (c->expect)
        fprintf(f, "expect: %s\n", c->expect);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- running a case ---------------------------------------------------- */

/* The first line of s, at most cap - 1 bytes. */
static void conf_first_line(char *out, size_t cap, const char *s)
{
    size_t n = strcspn(s, "\n");
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), s);
}

static void conf_run_one(const dsim_conf_opts *o, const char *dir, dsim_conf_run *run)
{
    double t0 = conf_now();
    if (dsim_isolated_run("conformance.yaml", run->text, NULL, o->run_timeout_s, dir, &run->iso) !=
        DSIM_OK) {
        run->iso.ended = false;
        snprintf(run->iso.why, sizeof run->iso.why, "%s", dsim_errmsg());
        run->iso.r.status = DSIM_RUN_ERROR;
        snprintf(run->iso.r.train_msg, sizeof run->iso.r.train_msg, "%s", dsim_errmsg());
        snprintf(run->signature, sizeof run->signature, "error");
        snprintf(run->message, sizeof run->message, "%s", dsim_errmsg());
    } else {
        dsim_isolated_signature(&run->iso, run->signature, sizeof run->signature, run->message,
                                sizeof run->message);
    }
    run->wall_s = conf_now() - t0;
}

/* The engines a case runs on: --engine's, else the row's ("all": every
 * registered engine), comma-separated into out. */
static void conf_engines(const dsim_conf_opts *o, const dsim_conf_case *c, char *out, size_t cap)
{
    out[0] = '\0';
    const char *want = o->engines ? o->engines : c->engines;
    bool all = !o->engines && strcmp(c->engines, "all") == 0;
    for (int i = 0; dsim_engine_at(i); i++) {
        const char *name = dsim_engine_at(i)->name;
        if (all || conf_in_list(want, name))
            snprintf(out + strlen(out), cap - strlen(out), "%s%s", out[0] ? "," : "", name);
    }
}

/* What the runs came to, in one line. */
static void conf_judge(dsim_conf_outcome *oc)
{
    const dsim_conf_run *bad = NULL;
    char others[128] = "";
    for (size_t i = 0; i < oc->n_runs; i++) {
        if (!oc->runs[i].signature[0])
            continue;
        if (!bad)
            bad = &oc->runs[i];
        else
            snprintf(others + strlen(others), sizeof others - strlen(others), "%s%s",
                     others[0] ? ", " : "", oc->runs[i].engine);
    }
    char line[700];
    if (bad) {
        oc->verdict = DSIM_CONF_FAIL;
        conf_first_line(line, sizeof line, bad->message);
        /* the run's other checks that did not meet their expectation */
        char more[160] = "";
        const dsim_harness_result *br = &bad->iso.r;
        bool first = true; /* the first is the signature's (dsim_isolated_signature) */
        for (size_t i = 0; i < br->n_checks; i++) {
            if (br->checks[i].passed)
                continue;
            if (!first ||
                strncmp(br->checks[i].name, bad->signature, strlen(br->checks[i].name)) != 0)
                snprintf(more + strlen(more), sizeof more - strlen(more), "%s%s",
                         more[0] ? ", " : "", br->checks[i].name);
            first = false;
        }
        snprintf(oc->message, sizeof oc->message, "%.40s: %.127s: %.540s%s%.150s%s%s%.127s%s",
                 bad->engine, bad->signature, line, more[0] ? " [also failed: " : "", more,
                 more[0] ? "]" : "", others[0] ? " (also on " : "", others, others[0] ? ")" : "");
        return;
    }
    oc->verdict = DSIM_CONF_PASS;
    const dsim_harness_result *r = oc->n_runs ? &oc->runs[0].iso.r : NULL;
    char names[400] = "";
    for (size_t i = 0; r && i < r->n_checks; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 r->checks[i].name);
    snprintf(oc->message, sizeof oc->message, "%s met on %zu engine%s", names[0] ? names : "run",
             oc->n_runs, oc->n_runs == 1 ? "" : "s");
}

/* Forgets the case's runs (their array stays). */
static void conf_runs_drop(dsim_conf_outcome *oc)
{
    for (size_t k = 0; k < oc->n_runs; k++) {
        free(oc->runs[k].text);
        dsim_isolated_free(&oc->runs[k].iso);
        memset(&oc->runs[k], 0, sizeof oc->runs[k]);
    }
    oc->n_runs = 0;
}

/* The runs of the case as fitted, one an engine (those already there are
 * dropped first); false when its scenario was refused (oc says so). */
static bool conf_run_engines(const dsim_conf_opts *o, const dsim_conf_case *c, const conf_fit *fit,
                             const char *dir, dsim_conf_outcome *oc)
{
    conf_runs_drop(oc);
    char engines[128];
    snprintf(engines, sizeof engines, "%s", oc->engines);
    char *save = NULL;
    for (char *e = strtok_r(engines, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        dsim_conf_run *run = &oc->runs[oc->n_runs++];
        snprintf(run->engine, sizeof run->engine, "%s", e);
        run->text = conf_text(o, c, fit, e);
        dsim_scenario *s = NULL;
        if (!run->text ||
            dsim_scenario_parse("conformance.yaml", run->text, strlen(run->text), &s) != DSIM_OK) {
            oc->verdict = DSIM_CONF_ERROR;
            snprintf(oc->message, sizeof oc->message, "%s: the case's scenario is refused: %s", e,
                     run->text ? dsim_errmsg() : "out of memory");
            return false;
        }
        dsim_scenario_free(s);
        conf_run_one(o, dir, run);
    }
    return true;
}

/* A strategy that distributes its own input may refuse the case's global
 * batch, as TF's get_per_replica_batch_size refuses one the replicas do not
 * divide: by design, not a bug. Such a run ends before it is judged, with
 * an invalid-argument error (in its child process, as every run: an
 * input_fn that crashes is a failed case); its message into why. */
static bool conf_refused(const dsim_conf_opts *o, const dsim_conf_outcome *oc, char *why,
                         size_t cap)
{
    void *user = NULL;
    if (!dsim_strategy_input_fn(o->strategy, &user))
        return false;
    for (size_t k = 0; k < oc->n_runs; k++) {
        const dsim_isolated *iso = &oc->runs[k].iso;
        if (iso->ended && iso->err == DSIM_OK && !iso->r.harness_error &&
            iso->r.status != DSIM_RUN_PASSED && iso->r.train_err == DSIM_EINVAL) {
            snprintf(why, cap, "%s", iso->r.train_msg);
            return true;
        }
    }
    return false;
}

/* A refused global batch: the case again with the next multiple of the
 * replicas (said in its message), n/a when that is refused too or there is
 * none. False when a scenario was refused (oc says so). */
static bool conf_refit_batch(const dsim_conf_opts *o, const dsim_conf_case *c, conf_fit *fit,
                             const char *dir, dsim_conf_outcome *oc)
{
    char why[520], again[520];
    if (!conf_refused(o, oc, why, sizeof why))
        return true;
    long gb;
    conf_batch_at(c, &gb);
    long R = fit->shape.num_replicas > 0 ? fit->shape.num_replicas : 1;
    long to = (gb + R - 1) / R * R;
    if (gb > 0 && to != gb) {
        fit->global_batch = to;
        if (!conf_run_engines(o, c, fit, dir, oc))
            return false;
        if (!conf_refused(o, oc, again, sizeof again)) {
            snprintf(fit->note, sizeof fit->note,
                     "global batch %ld, not the case's %ld: the strategy's input_fn refuses a "
                     "batch its %ld replicas do not divide",
                     to, gb, R);
            return true;
        }
    }
    conf_runs_drop(oc);
    free(oc->runs);
    oc->runs = NULL;
    oc->verdict = DSIM_CONF_NA;
    snprintf(oc->message, sizeof oc->message, "the strategy's input_fn refuses the case's data: %s",
             why);
    return false;
}

/* A case that a plugin cannot take, as its runs say (their error names
 * it): strategy.gradient_dtype where it does not all-reduce through
 * dsim_strategy_allreduce_grad or refuses the key, LAMB where its
 * optimizers of parts cut variables. Not applicable, with that
 * reason; true then. */
static bool conf_declined(const dsim_conf_case *c, dsim_conf_outcome *oc)
{
    static const struct {
        unsigned need;
        const char *mark, *why;
    } dec[] = {{DSIM_CONF_NARROW, "gradient_dtype",
                "needs a strategy that all-reduces its gradients through "
                "dsim_strategy_allreduce_grad (strategy.gradient_dtype)"},
               {DSIM_CONF_WHOLE_VARS, "LAMB's trust ratio needs",
                "needs optimizers that hold whole variables (LAMB's trust ratio is per "
                "variable)"}};
    const char *said = NULL, *need = NULL;
    for (size_t d = 0; d < sizeof dec / sizeof dec[0] && !said; d++)
        for (size_t k = 0; (c->needs & dec[d].need) && !said && k < oc->n_runs; k++) {
            const dsim_isolated *iso = &oc->runs[k].iso;
            if (iso->ended && iso->err == DSIM_OK && !iso->r.harness_error &&
                strstr(iso->r.train_msg, dec[d].mark)) {
                said = iso->r.train_msg;
                need = dec[d].why;
            }
        }
    if (!said)
        return false;
    char why[400];
    snprintf(why, sizeof why, "%.399s", said);
    conf_runs_drop(oc);
    free(oc->runs);
    oc->runs = NULL;
    oc->verdict = DSIM_CONF_NA;
    snprintf(oc->message, sizeof oc->message, "%s: %.400s", need, why);
    return true;
}

static void conf_case_run(const dsim_conf_opts *o, const dsim_conf_case *c, const char *dir,
                          dsim_conf_outcome *oc)
{
    double t0 = conf_now();
    memset(oc, 0, sizeof *oc);
    oc->c = c;
    conf_fit fit;
    conf_fit_case(o, c, &fit);
    oc->hosts = fit.shape.hosts;
    oc->devices_per_host = fit.shape.devices_per_host;
    oc->ps = fit.shape.num_ps;
    if (fit.on_tpu)
        snprintf(oc->tpu, sizeof oc->tpu, "%s", fit.tpu.name);
    conf_engines(o, c, oc->engines, sizeof oc->engines);
    if (!fit.ok || !oc->engines[0]) {
        oc->verdict = DSIM_CONF_NA;
        snprintf(oc->message, sizeof oc->message, "%s",
                 fit.ok ? "none of its engines is among those asked for (--engine)" : fit.why);
        oc->wall_s = conf_now() - t0;
        return;
    }
    size_t n = 1;
    for (const char *p = oc->engines; *p; p++)
        n += *p == ',';
    oc->runs = calloc(n, sizeof *oc->runs);
    if (!oc->runs) {
        oc->verdict = DSIM_CONF_ERROR;
        snprintf(oc->message, sizeof oc->message, "out of memory");
        return;
    }
    if (conf_run_engines(o, c, &fit, dir, oc) && conf_refit_batch(o, c, &fit, dir, oc) &&
        !conf_declined(c, oc)) {
        conf_judge(oc);
        if (fit.note[0])
            snprintf(oc->message + strlen(oc->message), sizeof oc->message - strlen(oc->message),
                     "; %s", fit.note);
    }
    oc->wall_s = conf_now() - t0;
}

/* ---- the battery ---------------------------------------------------------- */

static int conf_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static dsim_err conf_opts_check(const dsim_conf_opts *o)
{
    if (!o || o->size < sizeof *o || !o->strategy)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_conformance: no strategy");
    if (!(o->run_timeout_s > 0))
        return DSIM_ERR(DSIM_EINVAL, -1, "a run's timeout must be > 0 seconds");
    dsim_ps_mode m;
    if (o->ps_mode && dsim_ps_mode_parse(o->ps_mode, &m) != DSIM_OK)
        return DSIM_ERR(DSIM_EINVAL, -1, "--ps-mode is '%s' (accepted: sync, async)", o->ps_mode);
    if (!dsim_strategy_exists(o->strategy)) {
        char names[512];
        dsim_strategy_list(names, sizeof names);
        return DSIM_ERR(DSIM_ENOENT, -1,
                        "no strategy named '%s' (accepted: %s, or a plugin's file: "
                        "path/to/libmy_strategy.so)",
                        o->strategy, names);
    }
    char names[1024] = "";
    for (size_t i = 0; i < dsim_conf_case_count(); i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 dsim_conf_case_at(i)->name);
    DSIM_CHECK(conf_check_list(o->cases, "--case", conf_case_known, names));
    char engines[256];
    DSIM_CHECK(conf_check_list(o->engines, "--engine", conf_engine_known,
                               dsim_engine_names(0, false, engines, sizeof engines)));
    return DSIM_OK;
}

dsim_err dsim_conformance(const dsim_conf_opts *o, dsim_conf_result *out)
{
    memset(out, 0, sizeof *out);
    DSIM_CHECK(conf_opts_check(o));
    double t0 = conf_now();
    char tmp[4096];
    const char *dir = o->workdir;
    if (!dir) {
        const char *base = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/dsim-conformance-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmp))
            return DSIM_ERR(DSIM_EIO, errno, "cannot make a working directory %s: %s", tmp,
                            strerror(errno));
        dir = tmp;
    }
    out->cases = calloc(dsim_conf_case_count(), sizeof *out->cases);
    if (!out->cases)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim conformance: out of memory");
    for (size_t i = 0; i < dsim_conf_case_count(); i++) {
        const dsim_conf_case *c = dsim_conf_case_at(i);
        if ((o->quick && !c->quick) || (o->cases && !conf_in_list(o->cases, c->name)))
            continue;
        dsim_conf_outcome *oc = &out->cases[out->n_cases++];
        conf_case_run(o, c, dir, oc);
        out->passed += oc->verdict == DSIM_CONF_PASS;
        out->failed += oc->verdict == DSIM_CONF_FAIL;
        out->not_applicable += oc->verdict == DSIM_CONF_NA;
        out->errors += oc->verdict == DSIM_CONF_ERROR;
        if (o->on_case)
            o->on_case(oc, o->user);
    }
    if (!o->workdir)
        nftw(dir, conf_rm, 16, FTW_DEPTH | FTW_PHYS);
    out->wall_s = conf_now() - t0;
    return DSIM_OK;
}

void dsim_conf_result_free(dsim_conf_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_cases; i++) {
        for (size_t k = 0; k < r->cases[i].n_runs; k++) {
            free(r->cases[i].runs[k].text);
            dsim_isolated_free(&r->cases[i].runs[k].iso);
        }
        free(r->cases[i].runs);
    }
    free(r->cases);
    memset(r, 0, sizeof *r);
}
