/* Running a scenario (harness.h): the public calls. A run's steps are
 * run.c; the guards guard.c; what the other files do harness_int.h says. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/spi/model.h"
#include "harness_int.h"

static dsim_err h_opts_get(const dsim_harness_opts *o, h_opts *out)
{
    memset(out, 0, sizeof *out);
    if (!o)
        return DSIM_OK;
    if (o->size != sizeof(dsim_harness_opts))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "harness: opts.size is %zu; set it to sizeof(dsim_harness_opts) (%zu)",
                        o->size, sizeof(dsim_harness_opts));
    out->store = o->store;
    out->db_path = o->db_path;
    out->engine = o->engine_override;
    out->has_seed = o->has_seed;
    out->seed = o->seed;
    out->progress = o->progress;
    out->progress_user = o->progress_user;
    out->grace_ns = o->grace_ns;
    out->progress_timeout_ns = o->progress_timeout_ns;
    out->no_crash_guard = o->no_crash_guard;
    out->hosts = o->hosts;
    out->reference_after = o->reference_after;
    out->transport = o->transport_override;
    out->keep_params = o->keep_params;
    if (out->transport && strcmp(out->transport, "shm") != 0 &&
        strcmp(out->transport, "tcp") != 0 && strcmp(out->transport, "inproc") != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "the transport override is '%s'; accepted: inproc, shm, tcp",
                        out->transport);
    return DSIM_OK;
}

dsim_err h_engine_of(const dsim_scenario *s, const h_opts *o, const dsim_engine_ops **out)
{
    if (o && o->hosts) {
        /* a job over machines runs on the engine that runs those */
        *out = dsim_engine_with(DSIM_ENGINE_HOSTS);
        if (!*out)
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "%s: no engine of this build runs a job over machines",
                            s->path ? s->path : "(scenario)");
        return DSIM_OK;
    }
    const char *name = dsim_scenario_engine(s);
    if (dsim_engine_find(name, out) != DSIM_OK) {
        char names[160], at[32] = "";
        if (!s->engine_overridden && s->engine_pos.line > 0)
            snprintf(at, sizeof at, ":%d:%d", s->engine_pos.line, s->engine_pos.column);
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "%s%s: engine %s is not supported by this build (accepted: %s)",
                        s->path ? s->path : "(scenario)", at, name,
                        dsim_engine_names(0, false, names, sizeof names));
    }
    return DSIM_OK;
}

/* The checks every run needs, on a scenario with the overrides applied. */
/* model.plugin: loaded, and checked against the data it will train on. */
static dsim_err h_model_plugin(dsim_scenario *s)
{
    const char *path = s->path ? s->path : "(scenario)";
    int line = s->model_plugin_pos.line, col = s->model_plugin_pos.column;
    dsim_model_spec *ms = &s->train.model;
    const dsim_model_ops *ops = NULL;
    dsim_error er;
    if (dsim_model_load(s->model_plugin, &ops) != DSIM_OK) {
        dsim_error_copy(&er);
        return DSIM_ERR(er.code, -1, "%s:%d:%d: model.plugin: %s", path, line, col, er.msg);
    }
    ms->kind = DSIM_MODEL_PLUGIN;
    ms->plugin = ops;
    bool cls = s->train.data.kind == DSIM_DATA_CLASSIFICATION;
    if (cls != (ops->loss == DSIM_LOSS_XENT))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s:%d:%d: model.plugin: %s trains with loss %s, which needs %s, but "
                        "data.task is %s",
                        path, line, col, ops->name, dsim_loss_name(ops->loss),
                        cls ? "regression targets" : "class labels",
                        dsim_data_kind_name(s->train.data.kind));
    if (dsim_model_validate(ms) != DSIM_OK) {
        dsim_error_copy(&er);
        return DSIM_ERR(er.code, -1, "%s:%d:%d: model.plugin: %s", path, line, col, er.msg);
    }
    return DSIM_OK;
}

static dsim_err h_check(dsim_scenario *s)
{
    const dsim_engine_ops *eng;
    DSIM_CHECK(h_engine_of(s, NULL, &eng));
    DSIM_CHECK(eng->prepare());
    DSIM_CHECK(dsim_scenario_runnable(s));
    if (s->train.plugin_path &&
        dsim_strategy_load(s->train.strategy, s->train.plugin_path) != DSIM_OK) {
        dsim_error er;
        dsim_error_copy(&er);
        char at[32] = "";
        if (s->plugin_pos.line > 0)
            snprintf(at, sizeof at, ":%d:%d", s->plugin_pos.line, s->plugin_pos.column);
        return DSIM_ERR(er.code, -1, "%s%s: strategy.plugin: %s", s->path ? s->path : "(scenario)",
                        at, er.msg);
    }
    if (s->model_plugin)
        return h_model_plugin(s);
    return DSIM_OK;
}

dsim_err dsim_harness_prepare(dsim_scenario *s, const dsim_harness_opts *opts)
{
    if (!s)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_prepare: the scenario is NULL");
    h_opts o;
    DSIM_CHECK(h_opts_get(opts, &o));
    if (o.engine) {
        /* the scenario frees s->engine; train.engine points at it */
        char *eng = strdup(o.engine);
        if (!eng)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
        free(s->engine);
        s->engine = eng;
        s->train.engine = eng;
        s->engine_overridden = true;
    }
    if (o.transport) {
        char *tp = strdup(o.transport);
        if (!tp)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
        free(s->transport);
        s->transport = tp;
        s->train.transport = tp;
        s->transport_pos = (dsim_src_pos){0, 0};
    }
    if (o.has_seed) {
        s->seed = o.seed;
        s->train.seed = o.seed;
        s->train.data.seed = o.seed;
    }
    return h_check(s);
}

void h_fail(dsim_harness_result *out, const char *what)
{
    if (out->harness_error)
        return;
    out->harness_error = true;
    snprintf(out->harness_msg, sizeof out->harness_msg, "%s: %s", what, dsim_errmsg());
}

dsim_err dsim_harness_run(const dsim_scenario *s, const dsim_harness_opts *opts,
                          dsim_harness_result *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run: out is NULL");
    memset(out, 0, sizeof *out);
    out->final_loss = NAN;
    out->step_s = out->exchange_s = NAN;
    out->status = DSIM_RUN_ERROR;
    hg_init_once();
    h_opts o;
    memset(&o, 0, sizeof o);
    dsim_err e = s ? h_opts_get(opts, &o)
                   : DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run: the scenario is NULL");
    /* The overrides go on a private copy: the scenario stays the caller's. */
    dsim_scenario sc;
    if (e == DSIM_OK) {
        sc = *s;
        if (o.engine) {
            sc.engine = (char *)o.engine;
            sc.train.engine = o.engine;
            sc.engine_overridden = true;
        }
        if (o.transport) {
            sc.transport = (char *)o.transport;
            sc.train.transport = o.transport;
            sc.transport_pos = (dsim_src_pos){0, 0};
        }
        if (o.has_seed) {
            sc.seed = o.seed;
            sc.train.seed = o.seed;
            sc.train.data.seed = o.seed;
        }
        e = h_check(&sc);
    }
    dsim_store *st = o.store, *owned = NULL;
    if (e == DSIM_OK && !st && o.db_path) {
        e = dsim_store_open(o.db_path, &owned);
        st = owned;
    }
    if (e != DSIM_OK) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
        return e;
    }
    if (!o.no_crash_guard)
        hg_guard_install_once();
    const dsim_engine_ops *eng = NULL;
    (void)h_engine_of(&sc, &o, &eng); /* found by h_check */
    int slot = hg_run_add(st);
    h_run_one(&sc, &o, eng, st, slot, out);
    hg_run_remove(slot);
    e = out->harness_error ? DSIM_EIO : DSIM_OK;
    if (owned) {
        /* Unless a shutdown closed it already; it cannot start while we hold
         * the lock, and the store is no longer in its table. */
        pthread_rwlock_rdlock(&hg_lock);
        if (!hg_down && dsim_store_close(owned) != DSIM_OK && !out->harness_error) {
            h_fail(out, "closing the results store");
            e = DSIM_EIO;
        }
        pthread_rwlock_unlock(&hg_lock);
    }
    if (e != DSIM_OK)
        dsim_set_error(e, -1, __FILE__, __LINE__, "%s", out->harness_msg);
    return e;
}

dsim_err dsim_harness_run_text(const char *path, const char *text, size_t len,
                               const dsim_harness_opts *opts, dsim_harness_result *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run_text: out is NULL");
    memset(out, 0, sizeof *out);
    out->final_loss = NAN;
    out->step_s = out->exchange_s = NAN;
    out->status = DSIM_RUN_ERROR;
    dsim_scenario *s = NULL;
    dsim_err e = text ? dsim_scenario_parse(path ? path : "(text)", text, len, &s)
                      : DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run_text: text is NULL");
    if (e != DSIM_OK) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
        return e;
    }
    e = dsim_harness_run(s, opts, out);
    dsim_scenario_free(s);
    return e;
}

void dsim_harness_result_free(dsim_harness_result *r)
{
    if (!r)
        return;
    free(r->checks);
    free(r->stuck);
    r->checks = NULL;
    r->stuck = NULL;
    r->n_checks = r->n_failed = r->n_stuck = 0;
    free(r->timeline);
    r->timeline = NULL;
}

/* ---- replay ---- */

/* The scenario of stored run `id` (sr read from db), parsed from its text
 * under the scenario file's own path when the run stored it (so data.source
 * paths resolve as they did), else under "NAME (run ID)"; a file with a
 * matrix: section gives the combination the run was named after. */
dsim_err h_stored_scenario(const char *db, dsim_run_id id, const dsim_stored_run *sr,
                           dsim_scenario **out)
{
    *out = NULL;
    const char *name = sr->scenario ? sr->scenario : "";
    char path[4200];
    snprintf(path, sizeof path, "%s (run %lld)", name, (long long)id);
    json_t *cfg = sr->config ? json_loads(sr->config, 0, NULL) : NULL;
    const char *file = cfg ? json_string_value(json_object_get(cfg, "scenario_file")) : NULL;
    if (file && strlen(file) < sizeof path)
        snprintf(path, sizeof path, "%s", file);
    json_decref(cfg);
    dsim_scenario *s = NULL;
    dsim_err e = dsim_scenario_parse(path, sr->scenario_text, strlen(sr->scenario_text), &s);
    /* A file with a matrix: section stored one run per combination, under
     * the combination's name: that one. */
    size_t nc = e == DSIM_OK && s->n_combinations ? dsim_scenario_combinations(s) : 0;
    dsim_scenario *pick = NULL;
    for (size_t k = 0; k < nc && !pick && e == DSIM_OK; k++) {
        dsim_scenario *c = NULL;
        e = dsim_scenario_combination(s, k, &c);
        if (e == DSIM_OK && strcmp(c->name, name) == 0)
            pick = c;
        else
            dsim_scenario_free(c);
    }
    if (e == DSIM_OK && nc && !pick)
        e = DSIM_ERR(DSIM_ENOENT, -1,
                     "%s: run %lld (%s): its scenario file makes %zu runs and none of them is "
                     "named so",
                     db, (long long)id, name, nc);
    if (pick) {
        dsim_scenario_free(s);
        s = pick;
    }
    if (e != DSIM_OK) {
        dsim_scenario_free(s);
        return e;
    }
    *out = s;
    return DSIM_OK;
}

dsim_err dsim_harness_replay(const char *db_path, dsim_run_id id, const dsim_harness_opts *opts,
                             dsim_harness_result *out, dsim_harness_replay_info *info)
{
    if (!out || !info)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_replay: out and info are needed");
    memset(out, 0, sizeof *out);
    memset(info, 0, sizeof *info);
    out->status = DSIM_RUN_ERROR;
    out->final_loss = NAN;
    out->step_s = out->exchange_s = NAN;
    dsim_stored_run sr;
    DSIM_CHECK(dsim_store_read_run(db_path, id, &sr));
    dsim_err e = DSIM_OK;
    const char *db = db_path ? db_path : DSIM_STORE_DEFAULT_PATH;
    const dsim_engine_ops *ran = NULL, *det = dsim_engine_with(DSIM_ENGINE_DETERMINISTIC);
    if (!sr.engine || dsim_engine_find(sr.engine, &ran) != DSIM_OK || !det ||
        !(ran->flags & DSIM_ENGINE_DETERMINISTIC))
        e = DSIM_ERR(DSIM_ENOTSUP, -1,
                     "%s: run %lld ran on engine %s: only runs under engine %s are "
                     "deterministic and replay event for event (dsim run --engine %s)",
                     db, (long long)id, sr.engine ? sr.engine : "(none)", det ? det->name : "sim",
                     det ? det->name : "sim");
    else if (!sr.scenario_text)
        e = DSIM_ERR(DSIM_EINVAL, -1, "%s: run %lld has no scenario text stored", db,
                     (long long)id);
    else if (!sr.trace_hash)
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "%s: run %lld has no trace hash (status %s): it never ended, so there is "
                     "nothing to compare with",
                     db, (long long)id, sr.status ? sr.status : "unknown");
    if (e != DSIM_OK) {
        dsim_stored_run_free(&sr);
        return e;
    }
    snprintf(info->scenario, sizeof info->scenario, "%s", sr.scenario ? sr.scenario : "");
    snprintf(info->stored_hash, sizeof info->stored_hash, "%s", sr.trace_hash);
    info->seed = sr.seed;
    dsim_harness_opts o;
    if (opts && opts->size == sizeof o)
        o = *opts;
    else
        o = (dsim_harness_opts){.size = sizeof o};
    o.engine_override = ran->name;
    o.has_seed = true;
    o.seed = sr.seed;
    dsim_scenario *s = NULL;
    e = h_stored_scenario(db, id, &sr, &s);
    if (e == DSIM_OK) {
        e = dsim_harness_run(s, &o, out);
    } else {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
    }
    dsim_scenario_free(s);
    if (e == DSIM_OK) {
        snprintf(info->replay_hash, sizeof info->replay_hash, "%016" PRIx64, out->trace_hash);
        info->matched = strcmp(info->replay_hash, info->stored_hash) == 0;
    }
    dsim_stored_run_free(&sr);
    return e;
}
