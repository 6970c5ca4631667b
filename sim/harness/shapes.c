/* dsim explore --shapes: a search over awkward sizes with shrinking
 * (explore.h, dsim_explore_shapes). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dsim/rng.h"
#include "dsim/spi/strategy.h"
#include "engine/engine.h"
#include "explore.h"
#include "harness.h"
#include "isolate.h"
#include "scenario/plan.h"
#include "scenario/scenario.h"
#include "scenario/yaml_tree.h"

/* The cluster shapes drawn: 1 replica, primes of replicas on one host and
 * on one device per host, hosts x devices pairs that differ, and a few
 * even ones beside them. */
static const int sh_shapes[][2] = {{1, 1}, {1, 2}, {1, 3}, {1, 5}, {1, 7}, {2, 1},  {3, 1},
                                   {5, 1}, {7, 1}, {2, 3}, {3, 2}, {2, 5}, {5, 2},  {3, 4},
                                   {4, 3}, {2, 2}, {2, 4}, {4, 2}, {3, 3}, {1, 11}, {13, 1}};
#define SH_NSHAPES   (sizeof sh_shapes / sizeof sh_shapes[0])
#define SH_MAX_DRAWS 256
/* A TPU job's shapes are its generation's slices (cluster.tpu), up to
 * this many replicas or the file's own, whichever is more. */
#define SH_TPU_MAX_SLICES   24
#define SH_TPU_MAX_REPLICAS 32

/* One candidate: everything the search varies. */
typedef struct sh_point {
    int hosts, dph;
    int slice;             /* a TPU job: its slice, an index of sh_ctx.slices; -1 none */
    int features, classes; /* classes: outputs for a regression */
    int64_t batch, examples;
    int files, epochs;
    int ckpt_every; /* checkpoint.every, 0 without checkpoints */
} sh_point;

/* Sizes the strategy's own input_fn refuses (dsim plan fails on them: a
 * global batch get_per_replica_batch_size cannot split, say): not drawn,
 * counted, the first refusal kept to say. */
typedef struct sh_refusals {
    uint64_t n;
    char first[384];
} sh_refusals;

typedef struct sh_ctx {
    const dsim_explore_opts *o;
    bool input_fn;        /* the strategy distributes its own input */
    sh_refusals *ref;     /* mutable: sizes its input_fn refused */
    dsim_yaml_node *base; /* the file's tree without faults, engine, seed, matrix, liveness */
    char *strategy;
    int num_ps;
    dsim_ps_mode ps_mode;
    dsim_model_spec model; /* the file's; in_dim and out_dim follow the point */
    bool regression, drop_remainder;
    uint64_t seed;
    sh_point orig; /* the file's own sizes */
    /* A TPU job (cluster.tpu): its generation's slices, fewest replicas
     * first; the file's own is among them unless it gives a chip shape
     * (tpu_topology), which is then kept as it is (orig.slice -1). */
    bool tpu;
    dsim_tpu_topology own; /* the file's slice */
    int n_slices;
    dsim_tpu_topology slices[SH_TPU_MAX_SLICES];
} sh_ctx;

static void sh_say(const sh_ctx *c, const char *fmt, ...)
{
    if (!c->o->say)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->o->say(line, c->o->say_user);
}

static size_t sh_params(const sh_ctx *c, const sh_point *p)
{
    dsim_model_spec m = c->model;
    m.in_dim = (size_t)p->features;
    m.out_dim = (size_t)p->classes;
    return dsim_model_num_params(&m);
}

/* "1 host x 3 devices, 9 parameters (features 2, classes 3), global batch
 * 7, 15 examples, 1 epoch" */
static void sh_describe(const sh_ctx *c, const sh_point *p, char *out, size_t cap)
{
    char slice[64] = "";
    if (c->tpu)
        snprintf(slice, sizeof slice,
                 "%s: ", p->slice >= 0 ? c->slices[p->slice].name : "the file's TPU slice");
    snprintf(out, cap,
             "%s%d host%s x %d device%s, %zu parameters (features %d, %s %d), global batch %" PRId64
             ", %" PRId64 " example%s, %d epoch%s",
             slice, p->hosts, p->hosts == 1 ? "" : "s", p->dph, p->dph == 1 ? "" : "s",
             sh_params(c, p), p->features, c->regression ? "outputs" : "classes", p->classes,
             p->batch, p->examples, p->examples == 1 ? "" : "s", p->epochs,
             p->epochs == 1 ? "" : "s");
}

/* ---- the scenario text of a point ---------------------------------------- */

static dsim_yaml_node *sh_section(dsim_yaml_node *root, const char *key)
{
    dsim_yaml_node *m = dsim_yaml_map_get(root, key);
    if (m && m->kind == DSIM_YAML_MAP)
        return m;
    m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->kind = DSIM_YAML_MAP;
    return dsim_yaml_map_set(root, key, m) == DSIM_OK ? m : NULL;
}

static bool sh_set(dsim_yaml_node *map, const char *key, int64_t v)
{
    char num[32];
    snprintf(num, sizeof num, "%" PRId64, v);
    dsim_yaml_node *n = dsim_yaml_scalar(num);
    return n && dsim_yaml_map_set(map, key, n) == DSIM_OK;
}

/* The whole text of point p (header first when given); NULL when out of
 * memory. */
static char *sh_text(const sh_ctx *c, const sh_point *p, const char *header)
{
    dsim_yaml_node *t = dsim_yaml_copy(c->base);
    dsim_yaml_node *cl = t ? sh_section(t, "cluster") : NULL;
    dsim_yaml_node *d = t ? sh_section(t, "data") : NULL;
    bool ok = cl && d;
    if (ok) {
        dsim_yaml_map_del(cl, "tf_config");
        if (c->tpu && p->slice >= 0) { /* the slice gives the cluster */
            dsim_yaml_map_del(cl, "tpu_topology");
            dsim_yaml_node *v = dsim_yaml_scalar(c->slices[p->slice].name);
            ok = v && dsim_yaml_map_set(cl, "tpu", v) == DSIM_OK;
        } else if (!c->tpu) {
            ok = sh_set(cl, "hosts", p->hosts) && sh_set(cl, "devices_per_host", p->dph);
        }
        ok = ok && sh_set(d, "features", p->features) && sh_set(d, "classes", p->classes) &&
             sh_set(d, "global_batch", p->batch) && sh_set(d, "examples", p->examples) &&
             sh_set(d, "files", p->files) && sh_set(d, "epochs", p->epochs);
    }
    dsim_yaml_node *ck = dsim_yaml_map_get(t, "checkpoint");
    if (ok && p->ckpt_every > 0 && ck && ck->kind == DSIM_YAML_MAP)
        ok = sh_set(ck, "every", p->ckpt_every);
    /* Limits set for the file's sizes say nothing at others: the checks
     * that judge against the user's own limits are left out, and node_loss
     * with the faults it judges. */
    dsim_yaml_node *ex = dsim_yaml_map_get(t, "expect");
    if (ok && ex && ex->kind == DSIM_YAML_MAP) {
        dsim_yaml_map_del(ex, "node_loss");
        dsim_yaml_map_del(ex, "convergence");
        dsim_yaml_map_del(ex, "performance");
        dsim_yaml_map_del(ex, "cold_start");
    }
    const dsim_engine_ops *e = dsim_engine_with(DSIM_ENGINE_DETERMINISTIC);
    dsim_yaml_node *eng = ok ? dsim_yaml_scalar(e ? e->name : "sim") : NULL;
    ok = eng && dsim_yaml_map_set(t, "engine", eng) == DSIM_OK;
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64, c->seed);
    dsim_yaml_node *sd = ok ? dsim_yaml_scalar(num) : NULL;
    ok = sd && dsim_yaml_map_set(t, "seed", sd) == DSIM_OK;
    char *body = ok ? dsim_yaml_emit(t) : NULL;
    dsim_yaml_free(t);
    if (!body)
        return NULL;
    char *text = NULL;
    if (asprintf(&text, "%s%s", header ? header : "", body) < 0)
        text = NULL;
    free(body);
    return text;
}

/* Whether the strategy takes p's cluster and the parser p's text; *text
 * gets the text when so. */
static bool sh_usable(const sh_ctx *c, const sh_point *p, char **text)
{
    *text = NULL;
    dsim_strategy_shape shape = {.hosts = p->hosts,
                                 .devices_per_host = p->dph,
                                 .num_replicas = p->hosts * p->dph,
                                 .num_ps = c->num_ps,
                                 .ps_mode = c->ps_mode,
                                 .global_batch = p->batch,
                                 .tpu = !c->tpu         ? NULL
                                        : p->slice >= 0 ? &c->slices[p->slice]
                                                        : &c->own};
    dsim_strategy_traits tr;
    if (dsim_strategy_probe(c->strategy, &shape, &tr) != DSIM_OK) {
        dsim_clear_error();
        return false;
    }
    char *t = sh_text(c, p, NULL);
    dsim_scenario *s = NULL;
    if (!t || dsim_scenario_parse(c->o->path, t, strlen(t), &s) != DSIM_OK) {
        free(t);
        return false;
    }
    /* A strategy's input_fn may refuse a size, as TF's
     * get_per_replica_batch_size refuses a global batch the replicas do
     * not divide: the job would fail before it starts, by design, not for
     * a bug. The plan runs the input_fn without training. */
    json_t *plan = NULL;
    bool refused = c->input_fn && dsim_scenario_plan(s, &plan) != DSIM_OK;
    json_decref(plan);
    if (refused && c->ref->n++ == 0) {
        const char *m = dsim_errmsg(), *d = strstr(m, "data: ");
        snprintf(c->ref->first, sizeof c->ref->first, "%s", d ? d + 6 : m);
    }
    dsim_clear_error();
    dsim_scenario_free(s);
    if (refused) {
        free(t);
        return false;
    }
    *text = t;
    return true;
}

/* Data that fits the point: no more files than examples, and a file for
 * every worker when there are files (more examples where needed); a full
 * batch under drop_remainder; checkpoints often enough that one is
 * written (every half of the steps at most). */
static void sh_fit_data(const sh_ctx *c, sh_point *p)
{
    p->files = c->orig.files;
    if (p->files > p->examples)
        p->files = (int)p->examples;
    if (p->files > 0 && p->files < p->hosts)
        p->files = p->hosts;
    if (p->examples < p->files)
        p->examples = p->files;
    if (c->drop_remainder && p->examples < p->batch)
        p->examples = p->batch;
    p->ckpt_every = c->orig.ckpt_every;
    if (p->ckpt_every > 0) {
        int64_t per =
            c->drop_remainder ? p->examples / p->batch : (p->examples + p->batch - 1) / p->batch;
        int64_t half = per * p->epochs / 2;
        if (p->ckpt_every > half)
            p->ckpt_every = half > 1 ? (int)half : 1;
    }
}

/* ---- drawing a point ----------------------------------------------------- */

static int sh_between(dsim_rng *r, int lo, int hi)
{
    return lo + (int)dsim_rng_below(r, (uint64_t)(hi - lo + 1));
}

/* Features and classes for R replicas: usually a parameter count that R
 * does not divide, sometimes fewer parameters than replicas. */
static void sh_draw_model(const sh_ctx *c, dsim_rng *r, int R, sh_point *p)
{
    int cmin = c->regression ? 1 : 2, cmax = c->regression ? 5 : 9;
    uint64_t aim = dsim_rng_below(r, 8); /* 0-1: fewer than R; 2-6: R divides not; 7: any */
    for (int tries = 0; tries < 40; tries++) {
        p->features = aim < 2 ? 1 : sh_between(r, 1, 16);
        p->classes = aim < 2 ? cmin : sh_between(r, cmin, cmax);
        size_t n = sh_params(c, p);
        if (aim < 2 && n < (size_t)R)
            return;
        if (aim >= 2 && aim < 7 && R > 1 && n % (size_t)R != 0)
            return;
        if (aim == 7 || R == 1)
            return;
        if (aim < 2 && tries >= 2)
            aim = 2; /* the smallest model is not smaller than R */
    }
}

/* A global batch with a remainder over R (sometimes smaller than R, now
 * and then none) and examples that end in a short tail (one example, R-1,
 * a batch less one). */
static void sh_draw_data(const sh_ctx *c, dsim_rng *r, int R, sh_point *p)
{
    uint64_t kind = dsim_rng_below(r, 6);
    if (kind == 0)
        p->batch = (int64_t)R * sh_between(r, 1, 4); /* no remainder */
    else if (kind == 1 && R > 1)
        p->batch = sh_between(r, 1, R - 1); /* fewer than the replicas */
    else
        p->batch = (int64_t)R * sh_between(r, 0, 4) + (R > 1 ? sh_between(r, 1, R - 1) : 1);
    if (p->batch < 1)
        p->batch = 1;
    int64_t tails[4] = {1, R > 1 ? R - 1 : 1, p->batch > 1 ? p->batch - 1 : 1, 0};
    int64_t tail = tails[dsim_rng_below(r, 4)];
    p->examples = p->batch * sh_between(r, 1, 4) + tail;
    p->epochs = c->orig.epochs < 2 ? c->orig.epochs : 2;
    sh_fit_data(c, p);
}

/* Point p on TPU slice k: its hosts and replicas per host. */
static void sh_slice(const sh_ctx *c, sh_point *p, int k)
{
    p->slice = k;
    p->hosts = c->slices[k].hosts;
    p->dph = c->slices[k].replicas_per_host;
}

/* Run `run`'s point; false when none of the draws is usable. */
static bool sh_draw(const sh_ctx *c, uint64_t run, sh_point *p, char **text)
{
    dsim_rng r;
    dsim_rng_init(&r, c->o->seed, "shapes", run);
    for (int d = 0; d < SH_MAX_DRAWS; d++) {
        if (c->tpu) {
            *p = c->orig;
            if (c->n_slices > 0)
                sh_slice(c, p, (int)dsim_rng_below(&r, (uint64_t)c->n_slices));
        } else {
            const int *sh = sh_shapes[dsim_rng_below(&r, SH_NSHAPES)];
            *p = (sh_point){.hosts = sh[0], .dph = sh[1], .slice = -1};
        }
        int R = p->hosts * p->dph;
        sh_draw_model(c, &r, R, p);
        sh_draw_data(c, &r, R, p);
        if (sh_usable(c, p, text))
            return true;
    }
    return false;
}

/* ---- running a point --------------------------------------------------- */

typedef struct sh_outcome {
    bool failed;
    char signature[128];
    char message[512];
} sh_outcome;

static void sh_run(const sh_ctx *c, const char *path, const char *text, sh_outcome *out)
{
    memset(out, 0, sizeof *out);
    const dsim_engine_ops *e = dsim_engine_with(DSIM_ENGINE_DETERMINISTIC);
    dsim_harness_opts ho = {.size = sizeof ho, .engine_override = e ? e->name : "sim"};
    dsim_isolated iso;
    if (dsim_isolated_run(path, text, &ho, c->o->run_timeout_s, NULL, &iso) != DSIM_OK) {
        out->failed = true;
        snprintf(out->signature, sizeof out->signature, "error");
        snprintf(out->message, sizeof out->message, "%.500s", dsim_errmsg());
        return;
    }
    dsim_isolated_signature(&iso, out->signature, sizeof out->signature, out->message,
                            sizeof out->message);
    out->failed = out->signature[0] != '\0';
    dsim_isolated_free(&iso);
}

/* ---- shrinking ----------------------------------------------------------- */

typedef struct sh_shrink {
    const sh_ctx *c;
    sh_point cur;
    const char *sig;
    sh_outcome last;
    int tries, kept;
} sh_shrink;

/* Runs candidate `cand`; keeps it when it fails with the same signature. */
static bool sh_try(sh_shrink *sh, sh_point cand, const char *what)
{
    if (sh->tries >= sh->c->o->max_shrink_runs)
        return false;
    sh_fit_data(sh->c, &cand);
    if (memcmp(&cand, &sh->cur, sizeof cand) == 0)
        return false;
    char *text;
    if (!sh_usable(sh->c, &cand, &text))
        return false;
    sh->tries++;
    sh_outcome o;
    sh_run(sh->c, sh->c->o->path, text, &o);
    free(text);
    bool keep = o.failed && strcmp(o.signature, sh->sig) == 0;
    char d[256];
    sh_describe(sh->c, &cand, d, sizeof d);
    sh_say(sh->c, "shrink %d: %s (%s): %s", sh->tries, what, d,
           keep ? "still fails the same way, kept"
                : (o.failed ? "fails otherwise, undone" : "passes, undone"));
    if (keep) {
        sh->cur = cand;
        sh->last = o;
        sh->kept++;
    }
    return keep;
}

/* Smaller values of one field, smallest first: lo, half, one less. */
static bool sh_smaller_int(sh_shrink *sh, int *field_in_cur, int lo, const char *name)
{
    int v = *field_in_cur;
    int to[3] = {lo, v / 2, v - 1};
    char what[96];
    for (int k = 0; k < 3; k++) {
        if (to[k] < lo || to[k] >= *field_in_cur || (k && to[k] == to[k - 1]))
            continue;
        sh_point cand = sh->cur;
        int *f = (int *)((char *)&cand + ((char *)field_in_cur - (char *)&sh->cur));
        *f = to[k];
        snprintf(what, sizeof what, "%s %d instead of %d", name, to[k], v);
        if (sh_try(sh, cand, what))
            return true;
    }
    return false;
}

static bool sh_smaller_i64(sh_shrink *sh, int64_t *field_in_cur, int64_t lo, const char *name)
{
    int64_t v = *field_in_cur;
    int64_t to[3] = {lo, v / 2, v - 1};
    char what[96];
    for (int k = 0; k < 3; k++) {
        if (to[k] < lo || to[k] >= *field_in_cur || (k && to[k] == to[k - 1]))
            continue;
        sh_point cand = sh->cur;
        int64_t *f = (int64_t *)((char *)&cand + ((char *)field_in_cur - (char *)&sh->cur));
        *f = to[k];
        snprintf(what, sizeof what, "%s %" PRId64 " instead of %" PRId64, name, to[k], v);
        if (sh_try(sh, cand, what))
            return true;
    }
    return false;
}

/* A smaller TPU slice: the smallest, half the way down, the next one. */
static bool sh_smaller_slice(sh_shrink *sh)
{
    int v = sh->cur.slice;
    int to[3] = {0, v / 2, v - 1};
    char what[128];
    for (int k = 0; k < 3; k++) {
        if (v <= 0 || to[k] < 0 || to[k] >= v || (k && to[k] == to[k - 1]))
            continue;
        sh_point cand = sh->cur;
        sh_slice(sh->c, &cand, to[k]);
        snprintf(what, sizeof what, "slice %s instead of %s", sh->c->slices[to[k]].name,
                 sh->c->slices[v].name);
        if (sh_try(sh, cand, what))
            return true;
    }
    return false;
}

/* To a fixed point, the largest things first: replicas, then the model,
 * then the data. */
static void sh_shrink_run(sh_shrink *sh)
{
    int cmin = sh->c->regression ? 1 : 2;
    bool changed = true;
    while (changed && sh->tries < sh->c->o->max_shrink_runs) {
        changed = false;
        if (sh->c->tpu) {
            changed |= sh_smaller_slice(sh);
        } else {
            changed |= sh_smaller_int(sh, &sh->cur.hosts, 1, "hosts");
            changed |= sh_smaller_int(sh, &sh->cur.dph, 1, "devices per host");
        }
        changed |= sh_smaller_int(sh, &sh->cur.features, 1, "features");
        changed |= sh_smaller_int(sh, &sh->cur.classes, cmin, "classes");
        changed |= sh_smaller_int(sh, &sh->cur.epochs, 1, "epochs");
        changed |= sh_smaller_i64(sh, &sh->cur.batch, 1, "global batch");
        changed |= sh_smaller_i64(sh, &sh->cur.examples, 1, "examples");
    }
}

/* ---- the search ------------------------------------------------------------ */

/* A TPU job's slices: its generation's, fewest replicas first, up to
 * SH_TPU_MAX_REPLICAS or the file's own; orig.slice is the file's. */
static void sh_tpu_slices(sh_ctx *c, const dsim_tpu_topology *own)
{
    c->tpu = true;
    c->own = *own;
    char names[DSIM_TPU_NAMES_MAX];
    dsim_tpu_names(own->gen, names, sizeof names);
    int most = own->replicas > SH_TPU_MAX_REPLICAS ? own->replicas : SH_TPU_MAX_REPLICAS;
    for (char *save = NULL, *n = strtok_r(names, ", ", &save); n && c->n_slices < SH_TPU_MAX_SLICES;
         n = strtok_r(NULL, ", ", &save)) {
        dsim_tpu_topology t;
        if (dsim_tpu_topology_parse(n, &t) != DSIM_OK) {
            dsim_clear_error();
            continue;
        }
        if (t.replicas > most || t.replicas > DSIM_TRAIN_MAX_REPLICAS)
            continue;
        int k = c->n_slices++;
        while (k > 0 && c->slices[k - 1].replicas > t.replicas) {
            c->slices[k] = c->slices[k - 1];
            k--;
        }
        c->slices[k] = t;
    }
    for (int k = 0; k < c->n_slices; k++)
        if (strcmp(c->slices[k].name, own->name) == 0)
            sh_slice(c, &c->orig, k);
}

static dsim_err sh_load(const dsim_explore_opts *o, sh_ctx *c, char **name)
{
    dsim_scenario *s = NULL;
    DSIM_CHECK(dsim_scenario_load(o->path, &s));
    const dsim_engine_ops *e = dsim_engine_with(DSIM_ENGINE_DETERMINISTIC);
    dsim_harness_opts ho = {.size = sizeof ho, .engine_override = e ? e->name : "sim"};
    dsim_err err = dsim_harness_prepare(s, &ho);
    const dsim_train_cfg *t = &s->train;
    if (err == DSIM_OK && s->expect_error)
        err = DSIM_ERR(DSIM_EINVAL, -1,
                       "%s expects an error (expect.error): a run that must fail has no "
                       "shapes to explore",
                       o->path);
    if (err == DSIM_OK && t->synthetic_params > 0)
        err = DSIM_ERR(DSIM_EINVAL, -1,
                       "%s has a timing-only model (model.synthetic): it moves no numbers, so "
                       "no size can make a check fail; give it model.kind",
                       o->path);
    dsim_yaml_node *root = NULL;
    if (err == DSIM_OK)
        err = dsim_yaml_parse(o->path, s->text, strlen(s->text), &root);
    if (err == DSIM_OK) {
        static const char *const drop[] = {"faults", "engine", "seed", "matrix", "liveness"};
        for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
            dsim_yaml_map_del(root, drop[i]);
        *c = (sh_ctx){.o = o,
                      .base = root,
                      .strategy = strdup(t->strategy),
                      .num_ps = t->num_ps,
                      .ps_mode = t->ps_mode,
                      .model = t->model,
                      .regression = t->data.kind == DSIM_DATA_REGRESSION,
                      .drop_remainder = t->drop_remainder,
                      .seed = s->seed};
        c->orig = (sh_point){.hosts = t->hosts,
                             .dph = t->devices_per_host,
                             .slice = -1,
                             .features = (int)t->data.in_dim,
                             .classes = (int)t->data.out_dim,
                             .batch = t->global_batch,
                             .examples = (int64_t)t->data.n_examples,
                             .files = t->in_memory ? 0 : (int)t->data.n_files,
                             .epochs = (int)t->epochs,
                             .ckpt_every = (int)t->checkpoint_every};
        if (t->tpu.replicas > 0)
            sh_tpu_slices(c, &t->tpu);
        *name = strdup(s->name ? s->name : "scenario");
        if (!c->strategy || !*name)
            err = DSIM_ERR(DSIM_ENOMEM, -1, "dsim explore: out of memory");
    }
    dsim_scenario_free(s);
    return err;
}

/* The file at its own sizes (without its faults): it must pass. */
static bool sh_baseline(const sh_ctx *c, const char *name, dsim_explore_result *out, dsim_err *rc)
{
    char *text = sh_text(c, &c->orig, NULL);
    dsim_scenario *s = NULL;
    if (!text || dsim_scenario_parse(c->o->path, text, strlen(text), &s) != DSIM_OK) {
        *rc = DSIM_ERR(DSIM_EINVAL, -1, "%s without its faults does not load: %s", c->o->path,
                       text ? dsim_errmsg() : "out of memory");
        free(text);
        return false;
    }
    dsim_scenario_free(s);
    sh_outcome base;
    sh_run(c, c->o->path, text, &base);
    if (base.failed)
        dsim_explore_write_base(c->o, out, "at its own sizes (without its faults)", base.signature,
                                text);
    free(text);
    char d[256];
    sh_describe(c, &c->orig, d, sizeof d);
    snprintf(out->shape_found, sizeof out->shape_found, "%s", d);
    if (base.failed) {
        out->baseline_failed = out->found = true;
        snprintf(out->signature, sizeof out->signature, "%s", base.signature);
        snprintf(out->message, sizeof out->message, "%s", base.message);
        sh_say(c, "the scenario fails at its own sizes (%s: %s): nothing to explore",
               base.signature, base.message);
        return false;
    }
    sh_say(c, "%s: %s passes; exploring %" PRIu64 " other sizes (seed %" PRIu64 ")", name, d,
           c->o->runs, c->o->seed);
    return true;
}

static dsim_err sh_search(const sh_ctx *c, dsim_explore_result *out, sh_point *found,
                          sh_outcome *fo)
{
    for (uint64_t i = 1; i <= c->o->runs; i++) {
        char *text;
        sh_point p;
        if (!sh_draw(c, i, &p, &text))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "strategy '%s' accepts none of the shapes --shapes draws (%d ps); "
                            "it has nothing to explore",
                            c->strategy, c->num_ps);
        sh_outcome r;
        sh_run(c, c->o->path, text, &r);
        free(text);
        out->runs_done = i;
        char d[256];
        sh_describe(c, &p, d, sizeof d);
        if (r.failed) {
            *found = p;
            *fo = r;
            out->found = true;
            out->failing_run = i;
            snprintf(out->shape_found, sizeof out->shape_found, "%s", d);
            sh_say(c, "run %" PRIu64 "/%" PRIu64 ": FAILED (%s) at %s: %s", i, c->o->runs,
                   r.signature, d, r.message);
            return DSIM_OK;
        }
        sh_say(c, "run %" PRIu64 "/%" PRIu64 ": passed at %s", i, c->o->runs, d);
    }
    sh_say(c, "%" PRIu64 " runs, no failure", out->runs_done);
    return DSIM_OK;
}

/* Says how many drawn sizes the strategy's input_fn refused. */
static void sh_say_refusals(const sh_ctx *c)
{
    if (c->ref->n)
        sh_say(c,
               "%" PRIu64 " drawn size%s not run: the strategy's input_fn refuses %s (dsim plan "
               "says so before a run starts; the first: %s)",
               c->ref->n, c->ref->n == 1 ? "" : "s", c->ref->n == 1 ? "it" : "them", c->ref->first);
}

/* Shrinks the failing point, writes it to outp and runs that file once
 * more, as `dsim run` will. */
static dsim_err sh_shrink_write(const sh_ctx *c, const char *outp, const sh_point *found,
                                const sh_outcome *fo, dsim_explore_result *out)
{
    const dsim_explore_opts *o = c->o;
    snprintf(out->signature, sizeof out->signature, "%s", fo->signature);
    sh_shrink sh = {.c = c, .cur = *found, .sig = out->signature, .last = *fo};
    sh_say(c, "shrinking (keeping a change only if the run still fails with %s)", out->signature);
    sh_shrink_run(&sh);
    out->shrink_steps = sh.kept;
    out->shrink_runs = sh.tries;
    out->hosts_final = sh.cur.hosts;
    snprintf(out->message, sizeof out->message, "%s", sh.last.message);
    sh_describe(c, &sh.cur, out->shape_final, sizeof out->shape_final);
    sh_say(c, "shrunk to %s in %d kept change%s of %d runs", out->shape_final, sh.kept,
           sh.kept == 1 ? "" : "s", sh.tries);
    char header[1536];
    snprintf(header, sizeof header,
             "# Written by dsim explore --shapes %s --seed %" PRIu64 " (run %" PRIu64
             " failed with %s at\n# %s;\n# shrunk to %s).\n"
             "# Reproduce: dsim run %s%s\n",
             o->path, o->seed, out->failing_run, out->signature, out->shape_found, out->shape_final,
             outp, o->run_args ? o->run_args : "");
    char *text = sh_text(c, &sh.cur, header);
    FILE *f = text ? fopen(outp, "w") : NULL;
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) {
        free(text);
        return DSIM_ERR(DSIM_EIO, -1, "cannot write %s: %s", outp, strerror(errno));
    }
    sh_outcome v;
    sh_run(c, outp, text, &v);
    free(text);
    out->reproduced = v.failed && strcmp(v.signature, out->signature) == 0;
    sh_say(c, "verify: %s %s", outp,
           out->reproduced ? "fails the same way again" : "did NOT fail the same way again");
    return DSIM_OK;
}

dsim_err dsim_explore_shapes(const dsim_explore_opts *o, dsim_explore_result *out)
{
    memset(out, 0, sizeof *out);
    if (!o || o->size < sizeof *o || !o->path)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_explore_shapes: no scenario");
    if (o->runs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "--runs is 0 (accepted: a whole number >= 1)");
    if (!(o->run_timeout_s > 0) || o->max_shrink_runs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "a run's timeout and the shrink runs must be > 0");
    sh_ctx c;
    sh_refusals refusals = {0};
    char *name = NULL;
    memset(&c, 0, sizeof c);
    dsim_err rc = sh_load(o, &c, &name);
    c.ref = &refusals;
    void *fn_user = NULL;
    c.input_fn = rc == DSIM_OK && dsim_strategy_input_fn(c.strategy, &fn_user) != NULL;
    char *outp = NULL;
    if (rc == DSIM_OK) {
        if (o->out_path)
            outp = strdup(o->out_path);
        else if (asprintf(&outp, "%s.shapes.yaml", name) < 0)
            outp = NULL;
        if (!outp)
            rc = DSIM_ERR(DSIM_ENOMEM, -1, "dsim explore: out of memory");
    }
    if (rc == DSIM_OK) {
        snprintf(out->out_path, sizeof out->out_path, "%s", outp);
        sh_point found = {0};
        sh_outcome fo = {0};
        if (sh_baseline(&c, name, out, &rc) && (rc = sh_search(&c, out, &found, &fo)) == DSIM_OK &&
            out->found)
            rc = sh_shrink_write(&c, outp, &found, &fo, out);
        sh_say_refusals(&c);
    }
    dsim_yaml_free(c.base);
    free(c.strategy);
    free(name);
    free(outp);
    return rc;
}
