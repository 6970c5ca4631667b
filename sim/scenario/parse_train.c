/* What the scenario's job trains on and with (parse_int.h): data: (the
 * synthetic dataset, its sharding and batches), model: (a kind, its hidden
 * widths and loss, or a synthetic size for timing only), optimizer: and
 * checkpoint:. The model is read after the data, and checked against it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/dataset.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/precision.h"
#include "model/costmodel.h"
#include "scenario/defaults.h"
#include "scenario/parse_int.h"

static const scen_name scen_model_kinds[] = {
    {"linear", DSIM_MODEL_LINEAR}, {"softmax", DSIM_MODEL_SOFTMAX}, {"mlp", DSIM_MODEL_MLP}};
static const scen_name scen_losses[] = {
    {"auto", DSIM_LOSS_AUTO}, {"mse", DSIM_LOSS_MSE}, {"xent", DSIM_LOSS_XENT}};
static const scen_name scen_optims[] = {
    {"sgd", DSIM_OPTIM_SGD},         {"momentum", DSIM_OPTIM_MOMENTUM},
    {"adam", DSIM_OPTIM_ADAM},       {"adamax", DSIM_OPTIM_ADAMAX},
    {"rmsprop", DSIM_OPTIM_RMSPROP}, {"adagrad", DSIM_OPTIM_ADAGRAD},
    {"lion", DSIM_OPTIM_LION},       {"lamb", DSIM_OPTIM_LAMB},
    {"nadam", DSIM_OPTIM_NADAM},     {"adadelta", DSIM_OPTIM_ADADELTA}};
static const scen_name scen_tasks[] = {{"classification", DSIM_DATA_CLASSIFICATION},
                                       {"regression", DSIM_DATA_REGRESSION}};
static const scen_name scen_policies[] = {{"off", DSIM_SHARD_OFF},
                                          {"auto", DSIM_SHARD_AUTO},
                                          {"file", DSIM_SHARD_FILE},
                                          {"data", DSIM_SHARD_DATA},
                                          {"hint", DSIM_SHARD_HINT}};
static const scen_name scen_hints[] = {
    {"none", DSIM_HINT_NONE}, {"files", DSIM_HINT_FILES}, {"elements", DSIM_HINT_ELEMENTS}};

enum { M_KIND, M_HIDDEN, M_LOSS, M_SYNTH, M_PLUGIN, M_N };
static const char *const scen_model_keys[M_N] = {"kind", "hidden", "loss", "synthetic", "plugin"};
enum { MS_PARAMS, MS_FLOPS, MS_N };
static const char *const scen_synth_keys[MS_N] = {"parameters", "flops_per_example"};

enum {
    O_KIND,
    O_LR,
    O_MOMENTUM,
    O_NESTEROV,
    O_BETA1,
    O_BETA2,
    O_EPSILON,
    O_CLIPVALUE,
    O_GCLIPNORM,
    O_WDECAY,
    O_CLIPNORM,
    O_SCHED,
    O_ACCUM,
    O_RHO,
    O_CENTERED,
    O_IAV,
    O_AMSGRAD,
    O_N
};
static const char *const scen_optim_keys[O_N] = {"kind",
                                                 "learning_rate",
                                                 "momentum",
                                                 "nesterov",
                                                 "beta1",
                                                 "beta2",
                                                 "epsilon",
                                                 "clipvalue",
                                                 "global_clipnorm",
                                                 "weight_decay",
                                                 "clipnorm",
                                                 "schedule",
                                                 "gradient_accumulation_steps",
                                                 "rho",
                                                 "centered",
                                                 "initial_accumulator_value",
                                                 "amsgrad"};

/* optimizer.schedule: Keras's learning-rate schedules (dsim/optim.h) */
enum {
    LS_KIND,
    LS_DSTEPS,
    LS_RATE,
    LS_STAIR,
    LS_END,
    LS_POWER,
    LS_CYCLE,
    LS_ALPHA,
    LS_WTARGET,
    LS_WSTEPS,
    LS_BOUNDS,
    LS_VALUES,
    LS_FDSTEPS,
    LS_TMUL,
    LS_MMUL,
    LS_N
};
static const char *const scen_sched_keys[LS_N] = {"kind",
                                                  "decay_steps",
                                                  "decay_rate",
                                                  "staircase",
                                                  "end_learning_rate",
                                                  "power",
                                                  "cycle",
                                                  "alpha",
                                                  "warmup_target",
                                                  "warmup_steps",
                                                  "boundaries",
                                                  "values",
                                                  "first_decay_steps",
                                                  "t_mul",
                                                  "m_mul"};
static const scen_name scen_sched_kinds[] = {{"constant", DSIM_LR_CONSTANT},
                                             {"exponential_decay", DSIM_LR_EXPONENTIAL},
                                             {"piecewise_constant", DSIM_LR_PIECEWISE},
                                             {"polynomial_decay", DSIM_LR_POLYNOMIAL},
                                             {"inverse_time_decay", DSIM_LR_INVERSE_TIME},
                                             {"cosine_decay", DSIM_LR_COSINE},
                                             {"cosine_decay_restarts", DSIM_LR_COSINE_RESTARTS}};
/* the kinds each key belongs to (a bit per dsim_lr_kind) */
#define LSK(k) (1u << (k))
static const unsigned scen_sched_owner[LS_N] = {
    [LS_DSTEPS] = LSK(DSIM_LR_EXPONENTIAL) | LSK(DSIM_LR_POLYNOMIAL) | LSK(DSIM_LR_INVERSE_TIME) |
                  LSK(DSIM_LR_COSINE),
    [LS_RATE] = LSK(DSIM_LR_EXPONENTIAL) | LSK(DSIM_LR_INVERSE_TIME),
    [LS_STAIR] = LSK(DSIM_LR_EXPONENTIAL) | LSK(DSIM_LR_INVERSE_TIME),
    [LS_END] = LSK(DSIM_LR_POLYNOMIAL),
    [LS_POWER] = LSK(DSIM_LR_POLYNOMIAL),
    [LS_CYCLE] = LSK(DSIM_LR_POLYNOMIAL),
    [LS_ALPHA] = LSK(DSIM_LR_COSINE) | LSK(DSIM_LR_COSINE_RESTARTS),
    [LS_WTARGET] = LSK(DSIM_LR_COSINE),
    [LS_WSTEPS] = LSK(DSIM_LR_COSINE),
    [LS_BOUNDS] = LSK(DSIM_LR_PIECEWISE),
    [LS_VALUES] = LSK(DSIM_LR_PIECEWISE),
    [LS_FDSTEPS] = LSK(DSIM_LR_COSINE_RESTARTS),
    [LS_TMUL] = LSK(DSIM_LR_COSINE_RESTARTS),
    [LS_MMUL] = LSK(DSIM_LR_COSINE_RESTARTS),
};

enum {
    D_TASK,
    D_EXAMPLES,
    D_FEATURES,
    D_CLASSES,
    D_NOISE,
    D_FILES,
    D_POLICY,
    D_HINT,
    D_BATCH,
    D_EPOCHS,
    D_SHUFFLE,
    D_DROP,
    D_SOURCE,
    D_N
};
static const char *const scen_data_keys[D_N] = {
    "task",       "examples",     "features", "classes", "noise",          "files", "shard_policy",
    "shard_hint", "global_batch", "epochs",   "shuffle", "drop_remainder", "source"};
enum { DS_X, DS_Y, DS_CSV, DS_LABEL, DS_N };
static const char *const scen_source_keys[DS_N] = {"x", "y", "csv", "label_column"};

enum { K_PATH, K_EVERY, K_N };
static const char *const scen_ckpt_keys[K_N] = {"path", "every"};

/* A file named by data.source, relative to the scenario file's folder
 * (or as is, when absolute): *load is the path to open, *keep the same
 * made absolute for the store (realpath; the path to open when that
 * fails). */
static dsim_err scen_source_path(const scen_ctx *c, const scen_node *v, const char *kp, char **load,
                                 char **keep)
{
    char *p = NULL;
    DSIM_CHECK(scen_str_v(c, v, kp, "a file path", &p));
    const char *slash = strrchr(c->path, '/');
    int n = 0;
    if (p[0] == '/' || !slash)
        *load = p;
    else if ((n = asprintf(load, "%.*s/%s", (int)(slash - c->path), c->path, p)) < 0)
        *load = NULL;
    if (*load != p)
        free(p);
    if (!*load)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    *keep = realpath(*load, NULL);
    if (!*keep && !(*keep = strdup(*load)))
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    return DSIM_OK;
}

/* label_column: a name, or a list of names (regression targets). */
static dsim_err scen_source_labels(const scen_ctx *c, const scen_node *v)
{
    dsim_scenario *s = c->s;
    size_t n = v->kind == DSIM_YAML_SEQ ? v->n : 1;
    if (v->kind == DSIM_YAML_SEQ && n == 0)
        return scen_fail(c, v, "data.source.label_column: an empty list; name one column or more");
    s->data_labels = calloc(n, sizeof *s->data_labels);
    if (!s->data_labels)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    for (size_t i = 0; i < n; i++) {
        const scen_node *item = v->kind == DSIM_YAML_SEQ ? v->kid[i] : v;
        DSIM_CHECK(
            scen_str_v(c, item, "data.source.label_column", "a column name", &s->data_labels[i]));
        s->n_data_labels = i + 1;
    }
    return DSIM_OK;
}

/* data.source: {x: X.npy, y: Y.npy} or {csv: FILE, label_column: NAME}:
 * the files read now (a malformed one is refused here, naming it), the
 * data's sizes taken from them and checked against what the section says. */
static dsim_err scen_data_source(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    dsim_train_cfg *t = &s->train;
    scen_map *m = &st->data, sm;
    DSIM_CHECK(scen_map_read(c, m->val[D_SOURCE], m->key[D_SOURCE], "data.source", scen_source_keys,
                             DS_N, &sm));
    if (m->val[D_NOISE])
        return scen_fail(c, m->key[D_NOISE],
                         "data.noise: noise draws synthetic labels; data read from files has its "
                         "own (remove noise or source)");
    bool npy = sm.val[DS_X] || sm.val[DS_Y], csv = sm.val[DS_CSV] != NULL;
    if (npy == csv)
        return scen_fail(c, sm.at,
                         "data.source: give either x and y (.npy files: {x: features.npy, y: "
                         "labels.npy}) or csv with label_column ({csv: train.csv, label_column: "
                         "label})");
    if (npy && (!sm.val[DS_X] || !sm.val[DS_Y]))
        return scen_fail(c, sm.at,
                         "data.source: %s is missing: .npy data needs both x "
                         "(features) and y (labels)",
                         sm.val[DS_X] ? "y" : "x");
    if (npy && sm.val[DS_LABEL])
        return scen_fail(c, sm.key[DS_LABEL],
                         "data.source.label_column: only a csv source has columns; y names the "
                         "labels of .npy data (remove label_column)");
    if (csv && !sm.val[DS_LABEL])
        return scen_fail(c, sm.at,
                         "data.source.label_column is missing: name the CSV column that holds "
                         "the labels (e.g. label_column: label)");
    char *lx = NULL, *ly = NULL, *lc = NULL;
    dsim_err e = DSIM_OK;
    if (npy && (e = scen_source_path(c, sm.val[DS_X], "data.source.x", &lx, &s->data_x)) == DSIM_OK)
        e = scen_source_path(c, sm.val[DS_Y], "data.source.y", &ly, &s->data_y);
    if (csv &&
        (e = scen_source_path(c, sm.val[DS_CSV], "data.source.csv", &lc, &s->data_csv)) == DSIM_OK)
        e = scen_source_labels(c, sm.val[DS_LABEL]);
    dsim_data_source src = {
        .x = lx,
        .y = ly,
        .csv = lc,
        .label_columns = (const char *const *)s->data_labels,
        .n_label_columns = s->n_data_labels,
        .task = m->val[D_TASK] ? (int)t->data.kind : -1,
        .classes = m->val[D_CLASSES] ? t->data.out_dim : 0,
        .features = m->val[D_FEATURES] ? t->data.in_dim : 0,
        .n_files = t->data.n_files,
    };
    if (e == DSIM_OK && dsim_dataset_load(&src, &s->dataset) != DSIM_OK) {
        char why[480];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        e = scen_fail(c, m->val[D_SOURCE], "data.source: %s", why);
    }
    free(lx);
    free(ly);
    free(lc);
    if (e != DSIM_OK)
        return e;
    dsim_dataset_spec *d = &t->data;
    if (m->val[D_EXAMPLES] && d->n_examples != s->dataset->spec.n_examples)
        return scen_fail(c, m->val[D_EXAMPLES],
                         "data.examples: %zu, but the files hold %zu examples; remove examples "
                         "(it is read from the files) or fix it",
                         d->n_examples, s->dataset->spec.n_examples);
    uint64_t seed = d->seed;
    *d = s->dataset->spec;
    d->seed = seed;
    t->dataset = s->dataset;
    return DSIM_OK;
}

dsim_err scen_data(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    dsim_dataset_spec *d = &t->data;
    scen_map *m = &st->data;
    DSIM_CHECK(
        scen_map_read(c, st->top.val[T_DATA], st->top.key[T_DATA], "data", scen_data_keys, D_N, m));
    c->s->data_pos = scen_pos(m->val[D_POLICY]  ? m->val[D_POLICY]
                              : m->val[D_FILES] ? m->val[D_FILES]
                                                : st->top.key[T_DATA]);
    int v = DSIM_DATA_CLASSIFICATION;
    DSIM_CHECK(scen_enum(c, m, D_TASK, "a task", scen_tasks, SCEN_N(scen_tasks), &v));
    d->kind = (dsim_data_kind)v;
    bool cls = d->kind == DSIM_DATA_CLASSIFICATION;
    int64_t x = DSIM_SCENARIO_DEF_EXAMPLES;
    DSIM_CHECK(scen_int(c, m, D_EXAMPLES, 1, DSIM_SCEN_MAX_EXAMPLES, &x));
    d->n_examples = (size_t)x;
    x = DSIM_SCENARIO_DEF_FEATURES;
    DSIM_CHECK(scen_int(c, m, D_FEATURES, 1, DSIM_SCEN_MAX_DIM, &x));
    d->in_dim = (size_t)x;
    x = cls ? DSIM_SCENARIO_DEF_CLASSES : 1;
    if (m->val[D_CLASSES]) {
        char kp[96];
        scen_kp(kp, sizeof kp, m, D_CLASSES);
        if (cls) {
            DSIM_CHECK(scen_int_v(c, m->val[D_CLASSES], "data.classes (classification: classes)", 2,
                                  DSIM_SCEN_MAX_DIM, &x));
        } else {
            DSIM_CHECK(scen_int_v(c, m->val[D_CLASSES], "data.classes (regression: outputs)", 1,
                                  DSIM_SCEN_MAX_DIM, &x));
        }
    }
    d->out_dim = (size_t)x;
    d->noise = DSIM_SCENARIO_DEF_NOISE;
    if (cls)
        DSIM_CHECK(scen_real(c, m, D_NOISE, 0, 1, false, false, &d->noise));
    else
        DSIM_CHECK(scen_real(c, m, D_NOISE, 0, 1e6, false, false, &d->noise));
    x = DSIM_SCENARIO_DEF_FILES;
    DSIM_CHECK(scen_int(c, m, D_FILES, 0, (int64_t)DSIM_SCEN_MAX_FILES, &x));
    /* files: 0 is a source without files; the generator still makes one
     * (dsim_train ignores the split when in_memory is set). */
    t->in_memory = x == 0;
    d->n_files = x == 0 ? 1 : (size_t)x;
    d->seed = c->s->seed;
    d->teacher_hidden = 0;
    v = (int)t->shard;
    DSIM_CHECK(
        scen_enum(c, m, D_POLICY, "a shard policy", scen_policies, SCEN_N(scen_policies), &v));
    t->shard = (dsim_shard_policy)v;
    v = (int)t->hint;
    DSIM_CHECK(scen_enum(c, m, D_HINT, "a shard hint", scen_hints, SCEN_N(scen_hints), &v));
    t->hint = (dsim_shard_hint)v;
    if (m->val[D_HINT] && t->shard != DSIM_SHARD_HINT)
        return scen_fail(c, m->key[D_HINT],
                         "data.shard_hint: only used with shard_policy: hint (the policy is %s); "
                         "remove shard_hint or set shard_policy: hint",
                         dsim_shard_policy_name(t->shard));
    x = t->global_batch;
    DSIM_CHECK(scen_int(c, m, D_BATCH, 1, DSIM_SCEN_MAX_BATCH, &x));
    t->global_batch = x;
    x = t->epochs;
    DSIM_CHECK(scen_int(c, m, D_EPOCHS, 1, DSIM_SCEN_MAX_EPOCHS, &x));
    t->epochs = (uint32_t)x;
    DSIM_CHECK(scen_bool(c, m, D_SHUFFLE, &t->shuffle));
    DSIM_CHECK(scen_bool(c, m, D_DROP, &t->drop_remainder));
    if (m->val[D_SOURCE])
        return scen_data_source(c, st);
    if (dsim_dataset_validate(d) != DSIM_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        return scen_fail(c, m->at, "data: %s", why);
    }
    return DSIM_OK;
}

/* model.synthetic: {parameters: 25.6M, flops_per_example: 4.1G}: a model
 * given by its size alone, run timing only (dsim_train_cfg.synthetic_params). */
static dsim_err scen_synthetic(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    scen_map *m = &st->model;
    for (int k = M_KIND; k <= M_LOSS; k++)
        if (m->val[k])
            return scen_fail(c, m->key[k],
                             "model.%s: a synthetic model has no layers or loss, only a size "
                             "(model.synthetic); remove %s or synthetic",
                             scen_model_keys[k], scen_model_keys[k]);
    scen_map sm;
    c->s->synthetic_pos = scen_pos(m->key[M_SYNTH]);
    DSIM_CHECK(scen_map_read(c, m->val[M_SYNTH], m->key[M_SYNTH], "model.synthetic",
                             scen_synth_keys, MS_N, &sm));
    double val[MS_N] = {0, 0};
    static const double lo[MS_N] = {1, 0},
                        hi[MS_N] = {DSIM_SCEN_MAX_SYNTH_PARAMS, DSIM_SCEN_MAX_SYNTH_FLOPS};
    for (int k = 0; k < MS_N; k++) {
        const scen_node *v = sm.val[k];
        char kp[64], show[96];
        snprintf(kp, sizeof kp, "model.synthetic.%s", scen_synth_keys[k]);
        if (!v)
            return scen_fail(c, sm.at,
                             "%s is missing: a synthetic model needs parameters and "
                             "flops_per_example, e.g. {parameters: 25.6M, flops_per_example: "
                             "4.1G}",
                             kp);
        if (!scen_is_scalar(v) || strlen(v->s) != v->len)
            return scen_fail(c, v, "%s: %s is not a number; accepted: e.g. 25.6M, 4.1G, 1e9", kp,
                             scen_show(v, show, sizeof show));
        if (dsim_cost_parse_count(kp, v->s, &val[k]) != DSIM_OK) {
            char why[300];
            snprintf(why, sizeof why, "%s", dsim_errmsg());
            return scen_fail(c, v, "%s", why);
        }
        if (val[k] < lo[k] || val[k] > hi[k])
            return scen_fail(c, v, "%s: %s is out of range; accepted: %g..%g", kp,
                             scen_show(v, show, sizeof show), lo[k], hi[k]);
    }
    t->synthetic_params = val[MS_PARAMS];
    t->synthetic_flops = val[MS_FLOPS];
    return DSIM_OK;
}

/* model.plugin: a user's model in a shared object (dsim/spi/model.h),
 * found here and loaded by dsim_harness_prepare, as a strategy plugin is. */
static dsim_err scen_model_plugin(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    scen_map *m = &st->model;
    for (int k = M_KIND; k <= M_SYNTH; k++)
        if (m->val[k] && k != M_LOSS)
            return scen_fail(c, m->key[k],
                             "model.%s: a plugin model is what its shared object computes; "
                             "remove %s or plugin",
                             scen_model_keys[k], scen_model_keys[k]);
    char *file = NULL;
    DSIM_CHECK(
        scen_str_v(c, m->val[M_PLUGIN], "model.plugin", "the path of a model plugin (.so)", &file));
    char searched[1024];
    int how = 0;
    char *found = scen_plugin_resolve(c->path, file, searched, sizeof searched, &how);
    if (!found) {
        dsim_err e = scen_fail(c, m->val[M_PLUGIN],
                               "model.plugin: '%s' not found; build the plugin, fix the path "
                               "(relative to the scenario file), or add its directory to "
                               "DSIM_PLUGIN_PATH / --plugin-dir (looked in: %s)",
                               file, searched);
        free(file);
        return e;
    }
    free(file);
    s->model_plugin = found;
    s->model_plugin_pos = scen_pos(m->val[M_PLUGIN]);
    s->train.model.kind = DSIM_MODEL_PLUGIN;
    s->train.model.plugin = NULL;
    return DSIM_OK;
}

dsim_err scen_model(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    dsim_model_spec *ms = &t->model;
    scen_map *m = &st->model;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_MODEL], st->top.key[T_MODEL], "model",
                             scen_model_keys, M_N, m));
    bool cls = t->data.kind == DSIM_DATA_CLASSIFICATION;
    memset(ms, 0, sizeof *ms);
    int v = cls ? DSIM_MODEL_SOFTMAX : DSIM_MODEL_LINEAR;
    DSIM_CHECK(
        scen_enum(c, m, M_KIND, "a model kind", scen_model_kinds, SCEN_N(scen_model_kinds), &v));
    ms->kind = (dsim_model_kind)v;
    v = DSIM_LOSS_AUTO;
    DSIM_CHECK(scen_enum(c, m, M_LOSS, "a loss", scen_losses, SCEN_N(scen_losses), &v));
    ms->loss = (dsim_loss)v;
    ms->in_dim = t->data.in_dim;
    ms->out_dim = t->data.out_dim;
    if (m->val[M_SYNTH])
        return scen_synthetic(c, st);
    if (m->val[M_PLUGIN])
        return scen_model_plugin(c, st);
    const scen_node *hv = m->val[M_HIDDEN];
    if (ms->kind == DSIM_MODEL_MLP) {
        ms->n_hidden = 1;
        ms->hidden[0] = DSIM_SCENARIO_DEF_HIDDEN;
        if (hv && hv->kind == DSIM_YAML_SEQ) {
            if (hv->n < 1 || hv->n > DSIM_SCEN_MAX_HIDDEN)
                return scen_fail(c, hv,
                                 "model.hidden: a list of %zu widths; accepted: one or two "
                                 "widths, e.g. [16] or [32, 16]",
                                 hv->n);
            for (size_t i = 0; i < hv->n; i++) {
                int64_t w;
                char kp[40];
                snprintf(kp, sizeof kp, "model.hidden[%zu]", i);
                DSIM_CHECK(scen_int_v(c, hv->kid[i], kp, 1, DSIM_SCEN_MAX_DIM, &w));
                ms->hidden[i] = (size_t)w;
            }
            ms->n_hidden = hv->n;
        } else if (hv) {
            int64_t w;
            DSIM_CHECK(
                scen_int_v(c, hv, "model.hidden (one or two widths)", 1, DSIM_SCEN_MAX_DIM, &w));
            ms->hidden[0] = (size_t)w;
        }
    } else if (hv) {
        return scen_fail(c, m->key[M_HIDDEN],
                         "model.hidden: only an mlp has hidden layers (model.kind is %s); remove "
                         "hidden or set kind: mlp",
                         dsim_model_kind_name(ms->kind));
    }
    /* the model's loss must fit the data's targets */
    dsim_loss loss = ms->loss;
    if (loss == DSIM_LOSS_AUTO)
        loss = ms->kind == DSIM_MODEL_LINEAR ? DSIM_LOSS_MSE : DSIM_LOSS_XENT;
    if (cls && loss != DSIM_LOSS_XENT)
        return scen_fail(c, m->val[M_LOSS] ? m->val[M_LOSS] : scen_where(m, M_KIND),
                         "model: %s with loss mse cannot learn class labels (data.task is "
                         "classification); use kind: softmax, or an mlp with loss xent",
                         dsim_model_kind_name(ms->kind));
    if (!cls && loss != DSIM_LOSS_MSE)
        return scen_fail(c, m->val[M_LOSS] ? m->val[M_LOSS] : scen_where(m, M_KIND),
                         "model: %s with loss xent needs class labels, but data.task is "
                         "regression; use kind: linear, or an mlp with loss: mse",
                         dsim_model_kind_name(ms->kind));
    if (dsim_model_validate(ms) != DSIM_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        return scen_fail(c, m->at, "model: %s", why);
    }
    return DSIM_OK;
}

/* A list of piecewise_constant's boundaries or values into out[0..*n). */
static dsim_err scen_sched_list(const scen_ctx *c, const scen_map *m, int i, int max,
                                uint64_t *steps, double *rates, int *n)
{
    const scen_node *v = m->val[i];
    char kp[64];
    scen_kp(kp, sizeof kp, m, i);
    if (!v || v->kind != DSIM_YAML_SEQ || v->n < 1 || v->n > (size_t)max)
        return scen_fail(c, v ? v : m->at,
                         "%s: a list of 1 to %d %s is needed, e.g. boundaries: [100, 200] and "
                         "values: [0.1, 0.01, 0.001] (one value more than boundaries)",
                         kp, max, steps ? "steps" : "learning rates");
    for (size_t k = 0; k < v->n; k++) {
        char ik[96];
        snprintf(ik, sizeof ik, "%.64s[%u]", kp, (unsigned)k);
        if (steps) {
            int64_t b;
            DSIM_CHECK(scen_int_v(c, v->kid[k], ik, 0, DSIM_SCEN_MAX_STEP, &b));
            steps[k] = (uint64_t)b;
        } else if (!scen_parse_real(v->kid[k], &rates[k]) || !(rates[k] > 0.0) ||
                   !(rates[k] <= DSIM_SCEN_MAX_LR)) {
            return scen_fail(c, v->kid[k], "%s: a learning rate more than 0, at most %.0f", ik,
                             DSIM_SCEN_MAX_LR);
        }
    }
    *n = (int)v->n;
    return DSIM_OK;
}

static dsim_err scen_schedule(const scen_ctx *c, const scen_map *om, dsim_optim_spec *o)
{
    scen_map mm, *m = &mm;
    DSIM_CHECK(scen_map_read(c, om->val[O_SCHED], om->key[O_SCHED], "optimizer.schedule",
                             scen_sched_keys, LS_N, m));
    if (!m->node)
        return DSIM_OK;
    dsim_lr_schedule *ls = &o->schedule;
    int v = DSIM_LR_CONSTANT;
    if (!m->val[LS_KIND])
        return scen_fail(c, m->at,
                         "optimizer.schedule: kind is needed: constant, exponential_decay, "
                         "piecewise_constant, polynomial_decay, inverse_time_decay, "
                         "cosine_decay or cosine_decay_restarts");
    DSIM_CHECK(scen_enum(c, m, LS_KIND, "a learning-rate schedule", scen_sched_kinds,
                         SCEN_N(scen_sched_kinds), &v));
    ls->kind = (dsim_lr_kind)v;
    for (int i = LS_KIND + 1; i < LS_N; i++)
        if (m->val[i] && !(scen_sched_owner[i] & LSK(v)))
            return scen_fail(c, m->key[i],
                             "optimizer.schedule.%s: schedule kind %s does not use %s; remove it "
                             "or use a kind that does%s",
                             scen_sched_keys[i], dsim_lr_kind_name(ls->kind), scen_sched_keys[i],
                             i == LS_DSTEPS && v == DSIM_LR_COSINE_RESTARTS
                                 ? " (cosine_decay_restarts takes first_decay_steps, as Keras)"
                                 : "");
    if (ls->kind == DSIM_LR_PIECEWISE) {
        int nb = 0, nv = 0;
        DSIM_CHECK(
            scen_sched_list(c, m, LS_BOUNDS, DSIM_LR_MAX_VALUES - 1, ls->boundaries, NULL, &nb));
        for (int i = 1; i < nb; i++)
            if (ls->boundaries[i] <= ls->boundaries[i - 1])
                return scen_fail(c, m->val[LS_BOUNDS]->kid[i],
                                 "optimizer.schedule.boundaries[%d]: %" PRIu64
                                 " is not above the one before (%" PRIu64
                                 "); boundaries are steps in increasing order",
                                 i, ls->boundaries[i], ls->boundaries[i - 1]);
        DSIM_CHECK(scen_sched_list(c, m, LS_VALUES, DSIM_LR_MAX_VALUES, NULL, ls->values, &nv));
        if (nv != nb + 1)
            return scen_fail(c, m->val[LS_VALUES],
                             "optimizer.schedule.values: %d values for %d boundaries; give one "
                             "value more than boundaries (values[0] up to boundaries[0], the "
                             "last after the last boundary)",
                             nv, nb);
        ls->n_values = nv;
        if (om->val[O_LR] && o->lr != ls->values[0])
            return scen_fail(c, om->val[O_LR],
                             "optimizer.learning_rate: %g, but a piecewise_constant schedule "
                             "starts at its values[0] (%g); remove learning_rate",
                             o->lr, ls->values[0]);
        o->lr = ls->values[0];
    } else if (ls->kind != DSIM_LR_CONSTANT) {
        /* Keras's CosineDecayRestarts names its first period's length so */
        const int key = ls->kind == DSIM_LR_COSINE_RESTARTS ? LS_FDSTEPS : LS_DSTEPS;
        int64_t ds = 0;
        if (!m->val[key])
            return scen_fail(c, m->at, "optimizer.schedule: %s needs %s (a step count)",
                             dsim_lr_kind_name(ls->kind), scen_sched_keys[key]);
        DSIM_CHECK(scen_int(c, m, key, 1, DSIM_SCEN_MAX_STEP, &ds));
        ls->decay_steps = (uint64_t)ds;
    }
    if ((scen_sched_owner[LS_RATE] & LSK(v)) && !m->val[LS_RATE])
        return scen_fail(c, m->at, "optimizer.schedule: %s needs decay_rate (e.g. %s)",
                         dsim_lr_kind_name(ls->kind),
                         ls->kind == DSIM_LR_EXPONENTIAL ? "0.96" : "0.5");
    DSIM_CHECK(scen_real(c, m, LS_RATE, 0, DSIM_SCEN_MAX_LR, ls->kind == DSIM_LR_EXPONENTIAL, false,
                         &ls->decay_rate));
    bool b = false;
    DSIM_CHECK(scen_bool(c, m, LS_STAIR, &b));
    ls->staircase = b;
    /* Keras's defaults: end_learning_rate 0.0001, power 1 */
    ls->end_lr = ls->kind == DSIM_LR_POLYNOMIAL ? 0.0001 : 0.0;
    ls->power = ls->kind == DSIM_LR_POLYNOMIAL ? 1.0 : 0.0;
    DSIM_CHECK(scen_real(c, m, LS_END, 0, DSIM_SCEN_MAX_LR, false, false, &ls->end_lr));
    DSIM_CHECK(scen_real(c, m, LS_POWER, 0, 1e6, true, false, &ls->power));
    b = false;
    DSIM_CHECK(scen_bool(c, m, LS_CYCLE, &b));
    ls->cycle = b;
    DSIM_CHECK(scen_real(c, m, LS_ALPHA, 0, 1, false, false, &ls->alpha));
    /* Keras's defaults: t_mul 2, m_mul 1 */
    ls->t_mul = ls->kind == DSIM_LR_COSINE_RESTARTS ? 2.0 : 0.0;
    ls->m_mul = ls->kind == DSIM_LR_COSINE_RESTARTS ? 1.0 : 0.0;
    DSIM_CHECK(scen_real(c, m, LS_TMUL, 1, DSIM_SCEN_MAX_TMUL, false, false, &ls->t_mul));
    DSIM_CHECK(scen_real(c, m, LS_MMUL, 0, DSIM_SCEN_MAX_TMUL, true, false, &ls->m_mul));
    if (m->val[LS_WSTEPS] && !m->val[LS_WTARGET])
        return scen_fail(c, m->key[LS_WSTEPS],
                         "optimizer.schedule.warmup_steps: a warmup needs warmup_target, the "
                         "rate it climbs to from learning_rate");
    ls->warmup = m->val[LS_WTARGET] != NULL;
    DSIM_CHECK(scen_real(c, m, LS_WTARGET, 0, DSIM_SCEN_MAX_LR, true, false, &ls->warmup_target));
    int64_t ws = 0;
    DSIM_CHECK(scen_int(c, m, LS_WSTEPS, 0, DSIM_SCEN_MAX_STEP, &ws));
    ls->warmup_steps = (uint64_t)ws;
    return DSIM_OK;
}

dsim_err scen_optim(const scen_ctx *c, scen_state *st)
{
    dsim_optim_spec *o = &c->s->train.optim;
    scen_map *m = &st->optim;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_OPTIM], st->top.key[T_OPTIM], "optimizer",
                             scen_optim_keys, O_N, m));
    int v = DSIM_OPTIM_SGD;
    DSIM_CHECK(scen_enum(c, m, O_KIND, "an optimizer", scen_optims, SCEN_N(scen_optims), &v));
    dsim_optim_spec_default(o, (dsim_optim_kind)v);
    if (v == DSIM_OPTIM_LAMB && c->s->model_plugin)
        return scen_fail(c, m->val[O_KIND],
                         "optimizer.kind: lamb's trust ratio is a ratio of norms per variable, "
                         "and a plugin model (model.plugin) does not say its variables; use adam "
                         "or a built-in model");
        /* the keys of some kinds only: the kinds that use each */
#define OK_(k) (1u << (k))
    static const struct {
        int key;
        unsigned kinds;
        const char *who;
    } own[] = {{O_MOMENTUM,
                OK_(DSIM_OPTIM_SGD) | OK_(DSIM_OPTIM_MOMENTUM) | OK_(DSIM_OPTIM_RMSPROP),
                "sgd, momentum and rmsprop"},
               {O_NESTEROV, OK_(DSIM_OPTIM_SGD) | OK_(DSIM_OPTIM_MOMENTUM), "sgd and momentum"},
               {O_BETA1,
                OK_(DSIM_OPTIM_ADAM) | OK_(DSIM_OPTIM_ADAMAX) | OK_(DSIM_OPTIM_LION) |
                    OK_(DSIM_OPTIM_LAMB) | OK_(DSIM_OPTIM_NADAM),
                "adam, adamax, nadam, lamb and lion"},
               {O_BETA2,
                OK_(DSIM_OPTIM_ADAM) | OK_(DSIM_OPTIM_ADAMAX) | OK_(DSIM_OPTIM_LION) |
                    OK_(DSIM_OPTIM_LAMB) | OK_(DSIM_OPTIM_NADAM),
                "adam, adamax, nadam, lamb and lion"},
               {O_EPSILON,
                OK_(DSIM_OPTIM_ADAM) | OK_(DSIM_OPTIM_ADAMAX) | OK_(DSIM_OPTIM_LAMB) |
                    OK_(DSIM_OPTIM_NADAM) | OK_(DSIM_OPTIM_RMSPROP) | OK_(DSIM_OPTIM_ADAGRAD) |
                    OK_(DSIM_OPTIM_ADADELTA),
                "adam, adamax, nadam, lamb, rmsprop, adagrad and adadelta"},
               {O_AMSGRAD, OK_(DSIM_OPTIM_ADAM), "adam"},
               {O_RHO, OK_(DSIM_OPTIM_RMSPROP) | OK_(DSIM_OPTIM_ADADELTA), "rmsprop and adadelta"},
               {O_CENTERED, OK_(DSIM_OPTIM_RMSPROP), "rmsprop"},
               {O_IAV, OK_(DSIM_OPTIM_ADAGRAD), "adagrad"}};
#undef OK_
    for (size_t i = 0; i < SCEN_N(own); i++)
        if (m->val[own[i].key] && !(own[i].kinds & (1u << o->kind)))
            return scen_fail(c, m->key[own[i].key],
                             "optimizer.%s: only %s use%s it, but optimizer.kind is %s; remove "
                             "it or change kind",
                             scen_optim_keys[own[i].key], own[i].who,
                             strchr(own[i].who, ' ') ? "" : "s", dsim_optim_kind_name(o->kind));
    /* 0 only where a cosine_decay warmup starts (checked with the schedule) */
    DSIM_CHECK(scen_real(c, m, O_LR, 0, DSIM_SCEN_MAX_LR, false, false, &o->lr));
    DSIM_CHECK(scen_real(c, m, O_MOMENTUM, 0, 1, false, true, &o->momentum));
    bool nest = o->nesterov != 0;
    DSIM_CHECK(scen_bool(c, m, O_NESTEROV, &nest));
    o->nesterov = nest;
    DSIM_CHECK(scen_real(c, m, O_BETA1, 0, 1, false, true, &o->beta1));
    if (o->kind == DSIM_OPTIM_LION && !(o->beta1 > 0.0))
        return scen_fail(c, m->val[O_BETA1],
                         "optimizer.beta1: lion needs it in (0, 1) (Keras uses 0.9; 0 would make "
                         "it SignSGD)");
    DSIM_CHECK(scen_real(c, m, O_BETA2, 0, 1, false, true, &o->beta2));
    DSIM_CHECK(scen_real(c, m, O_EPSILON, 0, 1, true, false, &o->epsilon));
    DSIM_CHECK(scen_real(c, m, O_RHO, 0, 1, false, true, &o->rho));
    bool centered = o->centered != 0;
    DSIM_CHECK(scen_bool(c, m, O_CENTERED, &centered));
    o->centered = centered;
    bool amsgrad = o->amsgrad != 0;
    DSIM_CHECK(scen_bool(c, m, O_AMSGRAD, &amsgrad));
    o->amsgrad = amsgrad;
    DSIM_CHECK(
        scen_real(c, m, O_IAV, 0, DSIM_SCEN_MAX_IAV, false, false, &o->initial_accumulator_value));
    /* Keras's clipping arguments (dsim/optim.h): one at most */
    DSIM_CHECK(scen_real(c, m, O_CLIPVALUE, 0, DSIM_SCEN_MAX_CLIP, true, false, &o->clipvalue));
    DSIM_CHECK(
        scen_real(c, m, O_GCLIPNORM, 0, DSIM_SCEN_MAX_CLIP, true, false, &o->global_clipnorm));
    DSIM_CHECK(scen_real(c, m, O_CLIPNORM, 0, DSIM_SCEN_MAX_CLIP, true, false, &o->clipnorm));
    if (m->val[O_CLIPNORM] && c->s->model_plugin)
        return scen_fail(c, m->key[O_CLIPNORM],
                         "optimizer.clipnorm: Keras's clip of each variable's gradient by its own "
                         "norm needs the model's variables, and a plugin model (model.plugin) "
                         "does not say them; use global_clipnorm (the whole gradient's norm) or "
                         "clipvalue");
    /* Keras's weight_decay (AdamW's, decoupled): 0 is off */
    DSIM_CHECK(scen_real(c, m, O_WDECAY, 0, DSIM_SCEN_MAX_WD, false, false, &o->weight_decay));
    if ((m->val[O_CLIPVALUE] != NULL) + (m->val[O_GCLIPNORM] != NULL) +
            (m->val[O_CLIPNORM] != NULL) >
        1)
        return scen_fail(c, m->key[O_GCLIPNORM] ? m->key[O_GCLIPNORM] : m->key[O_CLIPNORM],
                         "optimizer.%s: only one of clipvalue, global_clipnorm and clipnorm can "
                         "be set (as in Keras); remove the others",
                         m->key[O_GCLIPNORM] ? "global_clipnorm" : "clipnorm");
    DSIM_CHECK(scen_builtin_fits(c, m->key[O_GCLIPNORM], "optimizer.global_clipnorm"));
    DSIM_CHECK(scen_builtin_fits(c, m->key[O_CLIPNORM], "optimizer.clipnorm"));
    if (o->kind == DSIM_OPTIM_LAMB)
        DSIM_CHECK(scen_builtin_fits(c, m->val[O_KIND], "optimizer.kind"));
    DSIM_CHECK(scen_schedule(c, m, o));
    /* Keras 3's gradient_accumulation_steps: 0 or 1 off */
    int64_t acc = 0;
    DSIM_CHECK(scen_int(c, m, O_ACCUM, 0, DSIM_OPTIM_MAX_ACCUMULATION, &acc));
    o->gradient_accumulation_steps = (int)acc;
    if (o->lr == 0.0 && !(o->schedule.kind == DSIM_LR_COSINE && o->schedule.warmup))
        return scen_fail(c, m->val[O_LR],
                         "optimizer.learning_rate: '0' is out of range; accepted: a number in "
                         "(0, %g] (0 only where a cosine_decay schedule's warmup starts)",
                         DSIM_SCEN_MAX_LR);
    if (dsim_optim_validate(o) != DSIM_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        return scen_fail(c, m->at, "optimizer: %s", why);
    }
    return DSIM_OK;
}

dsim_err scen_builtin_fits(const scen_ctx *c, const scen_node *at, const char *key)
{
    if (!at || dsim_train_check_builtin(&c->s->train) == DSIM_OK)
        return DSIM_OK;
    char why[400];
    snprintf(why, sizeof why, "%s", dsim_errmsg());
    return scen_fail(c, at, "%s: %s", key, why);
}

dsim_err scen_checkpoint(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    scen_map *m = &st->ckpt;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_CKPT], st->top.key[T_CKPT], "checkpoint",
                             scen_ckpt_keys, K_N, m));
    if (m->val[K_EVERY] && !m->val[K_PATH])
        return scen_fail(c, m->key[K_EVERY],
                         "checkpoint.every: there is no checkpoint.path to write to; add path: "
                         "(e.g. ckpt/%s.ckpt)",
                         c->s->name ? c->s->name : "run");
    if (!m->val[K_PATH])
        return DSIM_OK;
    char *p = NULL;
    DSIM_CHECK(scen_str_v(c, m->val[K_PATH], "checkpoint.path", "a file path", &p));
    t->checkpoint_path = p;
    c->s->checkpoint_pos = scen_pos(m->val[K_PATH]);
    int64_t every = DSIM_SCENARIO_DEF_CKPT_EVERY;
    DSIM_CHECK(scen_int(c, m, K_EVERY, 0, DSIM_SCEN_MAX_STEP, &every));
    t->checkpoint_every = (uint64_t)every;
    return DSIM_OK;
}

/* mixed_precision: {policy: mixed_float16} (Keras's
 * tf.keras.mixed_precision.set_global_policy), after the model: a
 * synthetic model computes no numbers to round. */
dsim_err scen_mixed_precision(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    enum { P_POLICY, P_N };
    static const char *const keys[P_N] = {"policy"};
    static const scen_name policies[] = {{"float32", DSIM_POLICY_FLOAT32},
                                         {"mixed_float16", DSIM_POLICY_MIXED_FLOAT16},
                                         {"mixed_bfloat16", DSIM_POLICY_MIXED_BFLOAT16}};
    const scen_node *v = st->top.val[T_MIXED];
    if (!v)
        return DSIM_OK;
    scen_map m;
    DSIM_CHECK(scen_map_read(c, v, st->top.key[T_MIXED], "mixed_precision", keys, P_N, &m));
    if (!m.val[P_POLICY])
        return scen_fail(c, st->top.key[T_MIXED],
                         "mixed_precision: needs policy: float32, mixed_float16 or "
                         "mixed_bfloat16 (Keras's dtype policies)");
    int p = DSIM_POLICY_FLOAT32;
    DSIM_CHECK(
        scen_enum(c, &m, P_POLICY, "a mixed-precision policy", policies, SCEN_N(policies), &p));
    t->precision = (dsim_precision_policy)p;
    DSIM_CHECK(scen_builtin_fits(c, m.val[P_POLICY], "mixed_precision.policy"));
    if (t->synthetic_params > 0 && t->precision != DSIM_POLICY_FLOAT32)
        return scen_fail(c, m.val[P_POLICY],
                         "mixed_precision.policy: %s needs a model that computes; a synthetic "
                         "model (model.synthetic) is timing only: remove one of them",
                         dsim_precision_policy_name(t->precision));
    /* dsim's loss scale counts a skipped step as tf.keras's does; Keras 3,
     * the only Keras that accumulates, does not count it */
    if (t->precision == DSIM_POLICY_MIXED_FLOAT16 && t->optim.gradient_accumulation_steps > 1)
        return scen_fail(c, m.val[P_POLICY],
                         "mixed_precision.policy: mixed_float16's loss scale skips steps as "
                         "tf.keras does (a skipped step counts), which Keras 3's "
                         "gradient_accumulation_steps does not; use mixed_bfloat16 (no loss "
                         "scale) or remove optimizer.gradient_accumulation_steps");
    return DSIM_OK;
}
