/* `dsim plan`: the resolved scenario and the first epoch's data plan as
 * JSON (see plan.h). Everything comes from the functions the run itself
 * uses (dsim_input_plan_make, dsim_allreduce_decide), so the plan cannot
 * say something the run will not do. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/comm.h"
#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/spi/strategy.h"
#include "dsim/tpu.h"
#include "model/costmodel.h"
#include "scenario/defaults.h"
#include "scenario/plan.h"
#include "scenario/units.h"

/* The most batch sizes (steps x replicas) the plan lists. */
#define PLAN_MAX_SIZES 100000
/* The most example reads per epoch the plan follows one by one. */
#define PLAN_MAX_READS ((uint64_t)1 << 26)

/* jansson's setters return -1 on allocation failure; one flag collects them. */
typedef struct plan_b {
    int bad;
} plan_b;

static json_t *plan_set(plan_b *b, json_t *obj, const char *key, json_t *v)
{
    if (!v || json_object_set_new(obj, key, v) != 0)
        b->bad = 1;
    return v;
}

static void plan_push(plan_b *b, json_t *arr, json_t *v)
{
    if (!v || json_array_append_new(arr, v) != 0)
        b->bad = 1;
}

static json_t *plan_str(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *plan_u64(uint64_t v)
{
    if (v <= (uint64_t)INT64_MAX)
        return json_integer((json_int_t)v);
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return json_string(buf);
}

static json_t *plan_dur(plan_b *b, int64_t ns)
{
    char buf[32];
    dsim_unit_format_duration(ns, buf, sizeof buf);
    json_t *o = json_object();
    if (!o)
        return NULL;
    plan_set(b, o, "text", json_string(buf));
    plan_set(b, o, "ns", json_integer(ns));
    return o;
}

static int plan_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ids as sorted [first, last] ranges. */
static json_t *plan_ranges(plan_b *b, const uint64_t *ids, uint64_t n)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    plan_set(b, o, "count", plan_u64(n));
    json_t *arr = plan_set(b, o, "ranges", json_array());
    uint64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v || !arr) {
        free(v);
        b->bad = 1;
        return o;
    }
    memcpy(v, ids, n * sizeof *v);
    qsort(v, n, sizeof *v, plan_cmp_u64);
    size_t shown = 0;
    bool cut = false;
    for (uint64_t i = 0; i < n;) {
        uint64_t j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1)
            j++;
        if (shown == DSIM_PLAN_MAX_ITEMS) {
            cut = true;
            break;
        }
        json_t *r = json_array();
        if (r) {
            plan_push(b, r, plan_u64(v[i]));
            plan_push(b, r, plan_u64(v[j]));
        }
        plan_push(b, arr, r);
        shown++;
        i = j + 1;
    }
    free(v);
    plan_set(b, o, "truncated", json_boolean(cut));
    return o;
}

/* A TPU slice: its shape, where each replica is, and what dsim says about
 * the job (simulated; precision; warnings). */
static void plan_tpu(plan_b *b, json_t *c, const dsim_scenario *s)
{
    const dsim_tpu_topology *t = &s->train.tpu;
    json_t *o = plan_set(b, c, "tpu", json_object());
    if (!o)
        return;
    plan_set(b, o, "name", json_string(t->name));
    plan_set(b, o, "generation", json_string(dsim_tpu_gen_get(t->gen)->name));
    plan_set(b, o, "simulated", json_string("no TPU is used"));
    plan_set(b, o, "chips", json_pack("[i, i, i]", t->dims[0], t->dims[1], t->dims[2]));
    plan_set(b, o, "wrap", json_pack("[b, b, b]", t->wrap[0], t->wrap[1], t->wrap[2]));
    plan_set(b, o, "replicas_per_chip", json_integer(t->replicas_per_chip));
    plan_set(b, o, "tensorcores_per_replica", json_integer(t->cores_per_replica));
    json_t *notes = plan_set(b, o, "notes", json_array());
    for (const char *l = s->tpu_notes; notes && l && *l;) {
        const char *end = strchr(l, '\n');
        size_t len = end ? (size_t)(end - l) : strlen(l);
        plan_push(b, notes, json_stringn(l, len));
        l = end ? end + 1 : NULL;
    }
    json_t *reps = json_object_get(c, "replicas");
    for (int r = 0; reps && r < t->replicas && (size_t)r < json_array_size(reps); r++) {
        dsim_tpu_place pl;
        json_t *e = json_array_get(reps, (size_t)r);
        if (dsim_tpu_place_of(t, r, &pl) != DSIM_OK)
            continue;
        plan_set(b, e, "chip", json_integer(pl.chip));
        plan_set(b, e, "core", json_integer(pl.core));
        plan_set(b, e, "coords", json_pack("[i, i, i]", pl.coords[0], pl.coords[1], pl.coords[2]));
    }
}

static json_t *plan_cluster(plan_b *b, const dsim_scenario *s)
{
    const dsim_train_cfg *t = &s->train;
    json_t *c = json_object();
    if (!c)
        return NULL;
    int R = t->hosts * t->devices_per_host;
    plan_set(b, c, "hosts", json_integer(t->hosts));
    plan_set(b, c, "devices_per_host", json_integer(t->devices_per_host));
    plan_set(b, c, "ps", json_integer(t->num_ps));
    plan_set(b, c, "num_replicas", json_integer(R));
    /* The scenario's cluster is the chief-less worker job, so worker 0 is
     * the chief (as TF's multi_worker_util.is_chief). */
    plan_set(b, c, "chief", json_pack("{s:i, s:i}", "worker", 0, "replica", 0));
    json_t *reps = plan_set(b, c, "replicas", json_array());
    int shown = R < DSIM_PLAN_MAX_ITEMS ? R : DSIM_PLAN_MAX_ITEMS;
    for (int r = 0; reps && r < shown; r++)
        plan_push(b, reps,
                  json_pack("{s:i, s:i, s:i}", "replica", r, "worker", r / t->devices_per_host,
                            "device", r % t->devices_per_host));
    plan_set(b, c, "replicas_truncated", json_boolean(shown < R));
    json_t *net = plan_set(b, c, "network", json_object());
    if (net) {
        char bw[32];
        dsim_unit_format_bandwidth(s->link_bandwidth_Bps, bw, sizeof bw);
        plan_set(b, net, "preset", plan_str(s->network_preset));
        plan_set(b, net, "latency", plan_dur(b, s->link_latency_ns));
        plan_set(b, net, "bandwidth",
                 json_pack("{s:s, s:f}", "text", bw, "bytes_per_s", s->link_bandwidth_Bps));
        if (t->tpu.replicas > 0) {
            dsim_unit_format_bandwidth(s->tpu_ici_Bps, bw, sizeof bw);
            plan_set(b, net, "preset", plan_str(s->network_preset));
            plan_set(b, net, "latency", plan_dur(b, s->tpu_ici_latency_ns));
            plan_set(b, net, "bandwidth",
                     json_pack("{s:s, s:f}", "text", bw, "bytes_per_s", s->tpu_ici_Bps));
            plan_set(b, net, "modelled",
                     json_string("under engine sim: hop by hop over the slice's ICI, each link "
                                 "direction its own"));
        }
    }
    if (t->tpu.replicas > 0)
        plan_tpu(b, c, s);
    return c;
}

static json_t *plan_strategy(plan_b *b, const dsim_scenario *s, size_t n_params)
{
    const dsim_train_cfg *t = &s->train;
    json_t *o = json_object();
    if (!o)
        return NULL;
    plan_set(b, o, "name", plan_str(t->strategy));
    plan_set(b, o, "plugin", plan_str(t->plugin_path));
    const char *summary = t->strategy ? dsim_strategy_summary(t->strategy) : NULL;
    plan_set(b, o, "summary", plan_str(summary));
    plan_set(b, o, "ps_mode",
             t->num_ps > 0 ? json_string(dsim_ps_mode_name(t->ps_mode)) : json_null());
    plan_set(b, o, "timeout", plan_dur(b, t->timeout_ns));
    json_t *h = plan_set(b, o, "health_check", json_object());
    if (h) {
        plan_set(b, h, "interval", plan_dur(b, s->health_interval_ns));
        plan_set(b, h, "timeout", plan_dur(b, s->health_timeout_ns));
        plan_set(b, h, "retries", json_integer(s->health_retries));
    }
    int R = t->hosts * t->devices_per_host;
    /* a synthetic model's gradients are its parameter count, as the run's */
    size_t bytes = t->synthetic_params > 0 ? (size_t)llround(t->synthetic_params) * sizeof(float)
                                           : n_params * sizeof(float);
    dsim_algo applied = t->communication;
    char why[256];
    dsim_topology topo;
    double model_s = 0;
    if (applied == DSIM_ALGO_AUTO && dsim_scenario_topology(s, NULL, &topo)) {
        /* modelled links: the model's pick, as the harness's runs make it */
        applied = dsim_cost_decide(&topo, bytes, 4, &model_s);
        snprintf(why, sizeof why,
                 "auto: the cost model of the scenario's links picks %s (%.3f ms) for %zu "
                 "gradient bytes over %d replicas (%d host(s) x %d)",
                 dsim_algo_name(applied), model_s * 1e3, bytes, R, t->hosts, t->devices_per_host);
    } else if (applied == DSIM_ALGO_AUTO) {
        /* the world knows its hosts, as the training driver tells it */
        applied = dsim_allreduce_decide_hosts(bytes, t->hosts, t->devices_per_host);
        snprintf(why, sizeof why,
                 "auto: the decision function picks %s for %zu gradient bytes over %d replicas "
                 "(%d host(s) x %d)",
                 dsim_algo_name(applied), bytes, R, t->hosts, t->devices_per_host);
    } else {
        snprintf(why, sizeof why, "set by strategy.communication");
    }
    json_t *cm = plan_set(b, o, "communication", json_object());
    if (cm) {
        plan_set(b, cm, "requested", json_string(dsim_algo_name(t->communication)));
        plan_set(b, cm, "applied", json_string(dsim_algo_name(applied)));
        plan_set(b, cm, "gradient_bytes", plan_u64(bytes));
        plan_set(b, cm, "ranks", json_integer(R));
        plan_set(b, cm, "why", json_string(why));
    }
    return o;
}

static json_t *plan_model(plan_b *b, const dsim_scenario *s, size_t n_params)
{
    const dsim_model_spec *m = &s->train.model;
    json_t *o = json_object();
    if (!o)
        return NULL;
    plan_set(b, o, "kind", json_string(dsim_model_kind_name(m->kind)));
    if (m->kind == DSIM_MODEL_PLUGIN && !m->plugin) {
        /* plan never loads a plugin: what it computes is known once run does */
        plan_set(b, o, "plugin", json_string(s->model_plugin ? s->model_plugin : ""));
        plan_set(b, o, "in_dim", plan_u64(m->in_dim));
        plan_set(b, o, "out_dim", plan_u64(m->out_dim));
        plan_set(b, o, "n_params", json_null());
        plan_set(b, o, "note",
                 json_string("a model plugin: its loss and parameter count are known once "
                             "dsim run loads it (dsim plan runs no plugin code)"));
        return o;
    }
    plan_set(b, o, "loss", json_string(dsim_loss_name(dsim_model_loss(m))));
    plan_set(b, o, "in_dim", plan_u64(m->in_dim));
    plan_set(b, o, "out_dim", plan_u64(m->out_dim));
    json_t *h = plan_set(b, o, "hidden", json_array());
    for (size_t i = 0; h && i < m->n_hidden; i++)
        plan_push(b, h, plan_u64(m->hidden[i]));
    plan_set(b, o, "n_params", plan_u64(n_params));
    return o;
}

json_t *dsim_schedule_json(const dsim_optim_spec *o)
{
    const dsim_lr_schedule *ls = &o->schedule;
    if (ls->kind == DSIM_LR_CONSTANT || (unsigned)ls->kind >= DSIM_LR_KIND_COUNT)
        return NULL;
    json_t *j = json_pack("{s:s}", "kind", dsim_lr_kind_name(ls->kind));
    int bad = !j;
    switch (ls->kind) {
    case DSIM_LR_PIECEWISE: {
        json_t *bs = json_array(), *vs = json_array();
        for (int i = 0; bs && vs && i < ls->n_values; i++) {
            if (i + 1 < ls->n_values)
                bad |= json_array_append_new(bs, json_integer((json_int_t)ls->boundaries[i]));
            bad |= json_array_append_new(vs, json_real(ls->values[i]));
        }
        bad |= !j || json_object_set_new(j, "boundaries", bs) != 0;
        bad |= !j || json_object_set_new(j, "values", vs) != 0;
        break;
    }
    case DSIM_LR_EXPONENTIAL:
    case DSIM_LR_INVERSE_TIME:
        bad |= !j || json_object_update_new(j, json_pack("{s:I, s:f, s:b}", "decay_steps",
                                                         (json_int_t)ls->decay_steps, "decay_rate",
                                                         ls->decay_rate, "staircase",
                                                         ls->staircase != 0)) != 0;
        break;
    case DSIM_LR_POLYNOMIAL:
        bad |= !j || json_object_update_new(j, json_pack("{s:I, s:f, s:f, s:b}", "decay_steps",
                                                         (json_int_t)ls->decay_steps,
                                                         "end_learning_rate", ls->end_lr, "power",
                                                         ls->power, "cycle", ls->cycle != 0)) != 0;
        break;
    case DSIM_LR_COSINE_RESTARTS: /* Keras's names */
        bad |= !j ||
               json_object_update_new(j, json_pack("{s:I, s:f, s:f, s:f}", "first_decay_steps",
                                                   (json_int_t)ls->decay_steps, "t_mul", ls->t_mul,
                                                   "m_mul", ls->m_mul, "alpha", ls->alpha)) != 0;
        break;
    default: /* cosine */
        bad |= !j || json_object_update_new(j, json_pack("{s:I, s:f}", "decay_steps",
                                                         (json_int_t)ls->decay_steps, "alpha",
                                                         ls->alpha)) != 0;
        if (ls->warmup)
            bad |= !j || json_object_update_new(j, json_pack("{s:f, s:I}", "warmup_target",
                                                             ls->warmup_target, "warmup_steps",
                                                             (json_int_t)ls->warmup_steps)) != 0;
        break;
    }
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static json_t *plan_optim(plan_b *b, const dsim_scenario *s)
{
    const dsim_optim_spec *p = &s->train.optim;
    json_t *o = json_object();
    if (!o)
        return NULL;
    plan_set(b, o, "kind", json_string(dsim_optim_kind_name(p->kind)));
    plan_set(b, o, "learning_rate", json_real(p->lr));
    if (p->kind == DSIM_OPTIM_MOMENTUM || (p->kind == DSIM_OPTIM_SGD && p->momentum > 0.0)) {
        plan_set(b, o, "momentum", json_real(p->momentum));
        plan_set(b, o, "nesterov", json_boolean(p->nesterov));
    } else if (p->kind == DSIM_OPTIM_ADAM || p->kind == DSIM_OPTIM_ADAMAX ||
               p->kind == DSIM_OPTIM_LAMB || p->kind == DSIM_OPTIM_NADAM) {
        plan_set(b, o, "beta1", json_real(p->beta1));
        plan_set(b, o, "beta2", json_real(p->beta2));
        plan_set(b, o, "epsilon", json_real(p->epsilon));
        if (p->kind == DSIM_OPTIM_ADAM)
            plan_set(b, o, "amsgrad", json_boolean(p->amsgrad));
    } else if (p->kind == DSIM_OPTIM_RMSPROP) {
        plan_set(b, o, "rho", json_real(p->rho));
        plan_set(b, o, "momentum", json_real(p->momentum));
        plan_set(b, o, "epsilon", json_real(p->epsilon));
        plan_set(b, o, "centered", json_boolean(p->centered));
    } else if (p->kind == DSIM_OPTIM_LION) {
        plan_set(b, o, "beta1", json_real(p->beta1));
        plan_set(b, o, "beta2", json_real(p->beta2));
    } else if (p->kind == DSIM_OPTIM_ADADELTA) {
        plan_set(b, o, "rho", json_real(p->rho));
        plan_set(b, o, "epsilon", json_real(p->epsilon));
    } else if (p->kind == DSIM_OPTIM_ADAGRAD) {
        plan_set(b, o, "initial_accumulator_value", json_real(p->initial_accumulator_value));
        plan_set(b, o, "epsilon", json_real(p->epsilon));
    }
    if (p->clipvalue > 0.0)
        plan_set(b, o, "clipvalue", json_real(p->clipvalue));
    if (p->global_clipnorm > 0.0)
        plan_set(b, o, "global_clipnorm", json_real(p->global_clipnorm));
    if (p->clipnorm > 0.0)
        plan_set(b, o, "clipnorm", json_real(p->clipnorm));
    if (p->weight_decay > 0.0)
        plan_set(b, o, "weight_decay", json_real(p->weight_decay));
    if (p->schedule.kind != DSIM_LR_CONSTANT)
        plan_set(b, o, "schedule", dsim_schedule_json(p));
    if (p->gradient_accumulation_steps > 1)
        plan_set(b, o, "gradient_accumulation_steps", json_integer(p->gradient_accumulation_steps));
    return o;
}

/* A strategy that distributes its own input (its input_fn): the plan
 * shows what that function lists, as the job will read it. */
static void plan_input_fn(const dsim_scenario *s, dsim_input_config *ic)
{
    const dsim_train_cfg *t = &s->train;
    if (!t->strategy || t->synthetic_params > 0)
        return;
    if (t->plugin_path && dsim_strategy_load(t->strategy, t->plugin_path) != DSIM_OK) {
        dsim_clear_error(); /* the run says why; the plan shows dsim's own pipeline */
        return;
    }
    ic->input_fn = dsim_strategy_input_fn(t->strategy, &ic->input_fn_user);
    dsim_strategy_shape shape = {
        .hosts = t->hosts,
        .devices_per_host = t->devices_per_host,
        .num_replicas = t->hosts * t->devices_per_host,
        .num_ps = t->num_ps,
        .ps_mode = t->ps_mode,
    };
    dsim_strategy_traits tr;
    if (ic->input_fn && dsim_strategy_probe(t->strategy, &shape, &tr) == DSIM_OK)
        ic->num_replicas_in_sync = tr.replicas_in_sync;
    dsim_clear_error();
}

/* The input pipelines: one per worker (a TPU host), each feeding its own
 * replicas, as TF's InputContext.num_input_pipelines; and for the tpu
 * strategy the static batch every replica pads to, and the padding rows of
 * the first epoch (masked, never counted as read). */
static void plan_pipelines(plan_b *b, const dsim_scenario *s, json_t *o, const dsim_input_plan *p)
{
    const dsim_train_cfg *t = &s->train;
    int W = p->num_workers, R = p->replicas_per_worker, N = W * R;
    json_t *ip = plan_set(b, o, "input_pipelines", json_object());
    if (!ip)
        return;
    plan_set(b, ip, "count", json_integer(W));
    plan_set(b, ip, "why",
             json_string(t->tpu.replicas > 0
                             ? "one per TPU host, each splitting its batch over the host's cores "
                               "(TF's InputContext.num_input_pipelines = hosts)"
                             : "one per worker, each splitting its batch over the worker's "
                               "replicas"));
    json_t *arr = plan_set(b, ip, "pipelines", json_array());
    for (int w = 0; arr && w < W && w < DSIM_PLAN_MAX_ITEMS; w++)
        plan_push(b, arr,
                  json_pack("{s:i, s:[i, i], s:I}", t->tpu.replicas > 0 ? "host" : "worker", w,
                            "replicas", w * R, w * R + R - 1, "reads", (json_int_t)p->reads[w]));
    bool pads = t->strategy && strcmp(t->strategy, "tpu") == 0 && !t->plugin_path;
    if (!pads)
        return;
    uint64_t stat = (uint64_t)((t->global_batch + N - 1) / N), pad = 0;
    for (uint64_t st = 0; st < p->steps; st++)
        for (int i = 0; i < N; i++) {
            uint64_t n = p->batch[st * (uint64_t)N + (uint64_t)i];
            pad += n < stat ? stat - n : 0;
        }
    plan_set(b, ip, "static_batch", plan_u64(stat));
    plan_set(b, ip, "padding_first_epoch", plan_u64(pad));
    plan_set(b, ip, "dynamic_batch_size", json_boolean(!t->static_shapes));
    plan_set(b, ip, "padding",
             json_string(t->static_shapes
                             ? "static shapes: every batch is full (refused otherwise)"
                             : "short batches padded to static_batch rows; the padding is "
                               "masked out of the loss and the gradient and not counted as read"));
}

/* The calling thread's error as "FILE:LINE:COLUMN: data: ..." (where the
 * data's layout is given) into err. */
static void plan_err_at(const dsim_scenario *s, char *err, size_t cap)
{
    if (s->data_pos.line > 0)
        snprintf(err, cap, "%s:%d:%d: data: %s", s->path, s->data_pos.line, s->data_pos.column,
                 dsim_errmsg());
    else
        snprintf(err, cap, "%s: data: %s", s->path, dsim_errmsg());
}

/* Whether the per-worker part of the data plan stays within PLAN_MAX_READS
 * entries: its batch sizes (steps x replicas) and its file lists (every
 * file for every worker unless the files are sharded). When it does not,
 * the section says so ("not_listed") and the plan stops there; a policy
 * the job would refuse sets *e and err. One input (worker 0's) answers
 * both: O(workers + examples). */
static bool plan_fits(plan_b *b, const dsim_scenario *s, const dsim_dataset_desc *desc, json_t *o,
                      char *err, size_t cap, dsim_err *e)
{
    const dsim_train_cfg *t = &s->train;
    dsim_input_config ic = {
        .dataset = desc,
        .policy = t->shard,
        .global_batch = t->global_batch,
        .num_workers = t->hosts,
        .replicas_per_worker = t->devices_per_host,
        .seed = t->seed,
        .shuffle = t->shuffle,
        .drop_remainder = t->drop_remainder,
        .epochs = 1,
    };
    plan_input_fn(s, &ic);
    dsim_input *in = NULL;
    *e = dsim_input_create(&ic, &in);
    if (*e != DSIM_OK) {
        plan_err_at(s, err, cap);
        return false;
    }
    uint64_t steps = dsim_input_steps_per_epoch(in);
    bool files_sharded = dsim_input_policy_applied(in) == DSIM_SHARD_FILE && t->hosts > 1;
    dsim_input_destroy(in);
    uint64_t N = (uint64_t)t->hosts * (uint64_t)t->devices_per_host;
    uint64_t lists = (uint64_t)desc->n_files * (files_sharded ? 1 : (uint64_t)t->hosts);
    char note[200] = "";
    if (steps > PLAN_MAX_READS / N)
        snprintf(note, sizeof note,
                 "%" PRIu64 " steps x %" PRIu64
                 " replicas of batch sizes are more than the %" PRIu64
                 " the plan lists; workers and batch sizes are not listed",
                 steps, N, (uint64_t)PLAN_MAX_READS);
    else if (lists > PLAN_MAX_READS)
        snprintf(note, sizeof note,
                 "%u files for each of %d workers are more than the %" PRIu64
                 " entries the plan lists; workers and batch sizes are not listed",
                 desc->n_files, t->hosts, (uint64_t)PLAN_MAX_READS);
    if (!note[0])
        return true;
    plan_set(b, o, "steps_per_epoch", plan_u64(steps));
    plan_set(b, o, "not_listed", json_string(note));
    *e = DSIM_OK;
    return false;
}

/* The data section; returns the plan's error (message in *err). */
static dsim_err plan_data(plan_b *b, const dsim_scenario *s, json_t *o, char *err, size_t cap)
{
    const dsim_train_cfg *t = &s->train;
    const dsim_dataset_spec *d = &t->data;
    bool cls = d->kind == DSIM_DATA_CLASSIFICATION;
    plan_set(b, o, "task", json_string(dsim_data_kind_name(d->kind)));
    plan_set(b, o, "examples", plan_u64(d->n_examples));
    plan_set(b, o, "features", plan_u64(d->in_dim));
    plan_set(b, o, cls ? "classes" : "outputs", plan_u64(d->out_dim));
    plan_set(b, o, "noise", json_real(d->noise));
    plan_set(b, o, "files", plan_u64(t->in_memory ? 0 : d->n_files));
    plan_set(b, o, "in_memory", json_boolean(t->in_memory));
    plan_set(b, o, "global_batch", json_integer(t->global_batch));
    plan_set(b, o, "epochs", json_integer(t->epochs));
    plan_set(b, o, "shuffle", json_boolean(t->shuffle));
    plan_set(b, o, "drop_remainder", json_boolean(t->drop_remainder));
    json_t *pol = plan_set(b, o, "shard_policy", json_object());
    if (pol) {
        plan_set(b, pol, "requested", json_string(dsim_shard_policy_name(t->shard)));
        if (t->shard == DSIM_SHARD_HINT)
            plan_set(b, pol, "hint", json_string(dsim_shard_hint_name(t->hint)));
    }

    /* The plan follows every example; past a size it would take gigabytes
     * and minutes, so the per-example part is left out, and says so. Each
     * worker goes through the whole dataset where it reads all of it (OFF,
     * HINT without a placeholder), shuffles its own copy (DATA with a
     * shuffle) or deals the examples out (HINT on the examples); else
     * every example is followed once. */
    bool to_data = t->shard == DSIM_SHARD_DATA ||
                   (t->shard == DSIM_SHARD_AUTO && (t->in_memory || d->n_files == 0));
    bool all_read = t->shard == DSIM_SHARD_OFF ||
                    (t->shard == DSIM_SHARD_HINT && t->hint != DSIM_HINT_FILES) ||
                    (t->shuffle && to_data);
    uint64_t reads = (uint64_t)d->n_examples * (all_read ? (uint64_t)t->hosts : 1);
    if (reads > PLAN_MAX_READS) {
        char note[200];
        snprintf(note, sizeof note,
                 "%" PRIu64 " example reads per epoch are more than the %" PRIu64
                 " the plan follows one by one; workers and batch sizes are not listed",
                 reads, (uint64_t)PLAN_MAX_READS);
        plan_set(b, o, "not_listed", json_string(note));
        return DSIM_OK;
    }
    dsim_dataset_desc desc;
    dsim_err e = dsim_dataset_desc_init(
        &desc, d->n_examples, t->in_memory ? 0 : (uint32_t)d->n_files, DSIM_FILES_CONTIGUOUS);
    if (e != DSIM_OK) {
        plan_err_at(s, err, cap);
        return e;
    }
    desc.hint = t->hint;
    if (!plan_fits(b, s, &desc, o, err, cap, &e)) {
        dsim_dataset_desc_release(&desc);
        return e;
    }
    dsim_input_config ic = {
        .dataset = &desc,
        .policy = t->shard,
        .global_batch = t->global_batch,
        .num_workers = t->hosts,
        .replicas_per_worker = t->devices_per_host,
        .worker = 0,
        .seed = t->seed,
        .shuffle = t->shuffle,
        .drop_remainder = t->drop_remainder,
        .epochs = t->epochs,
    };
    plan_input_fn(s, &ic);
    dsim_input_plan *p = NULL;
    e = dsim_input_plan_make(&ic, &p);
    if (e != DSIM_OK) {
        plan_err_at(s, err, cap);
        dsim_dataset_desc_release(&desc);
        return e;
    }
    if (pol) {
        plan_set(b, pol, "applied", json_string(dsim_shard_policy_name(p->applied)));
        plan_set(b, pol, "reason", json_string(p->reason));
    }
    plan_set(b, o, "steps_per_epoch", plan_u64(p->steps));
    int W = p->num_workers, R = p->replicas_per_worker, N = W * R;
    json_t *ws = plan_set(b, o, "workers", json_array());
    for (int w = 0; ws && w < W && w < DSIM_PLAN_MAX_ITEMS; w++) {
        json_t *wo = json_object();
        plan_push(b, ws, wo);
        if (!wo)
            break;
        plan_set(b, wo, "worker", json_integer(w));
        json_t *fl = plan_set(b, wo, "files", json_array());
        uint64_t f0 = p->files_start[w], f1 = p->files_start[w + 1];
        for (uint64_t i = f0; fl && i < f1 && i - f0 < DSIM_PLAN_MAX_ITEMS; i++)
            plan_push(b, fl, json_integer(p->files[i]));
        plan_set(b, wo, "files_truncated", json_boolean(f1 - f0 > DSIM_PLAN_MAX_ITEMS));
        plan_set(b, wo, "reads", plan_u64(p->reads[w]));
        plan_set(
            b, wo, "elements",
            plan_ranges(b, p->kept + p->kept_start[w], p->kept_start[w + 1] - p->kept_start[w]));
    }
    plan_set(b, o, "workers_truncated", json_boolean(W > DSIM_PLAN_MAX_ITEMS));
    plan_pipelines(b, s, o, p);
    uint64_t shown = p->steps;
    if (shown > DSIM_PLAN_MAX_ITEMS)
        shown = DSIM_PLAN_MAX_ITEMS;
    if (shown * (uint64_t)N > PLAN_MAX_SIZES)
        shown = PLAN_MAX_SIZES / (uint64_t)N;
    json_t *fe = plan_set(b, o, "first_epoch", json_object());
    if (fe) {
        json_t *steps = plan_set(b, fe, "batch_sizes", json_array());
        for (uint64_t st = 0; steps && st < shown; st++) {
            json_t *row = json_array();
            for (int i = 0; row && i < N; i++)
                plan_push(b, row, plan_u64(p->batch[st * (uint64_t)N + (uint64_t)i]));
            plan_push(b, steps, row);
        }
        plan_set(b, fe, "steps_shown", plan_u64(shown));
        plan_set(b, fe, "truncated", json_boolean(shown < p->steps));
    }
    dsim_input_plan_free(p);
    dsim_dataset_desc_release(&desc);
    return DSIM_OK;
}

static json_t *plan_faults(plan_b *b, const dsim_scenario *s)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < s->n_faults; i++) {
        const dsim_fault *f = &s->faults[i];
        json_t *o = json_object();
        plan_push(b, arr, o);
        if (!o)
            break;
        plan_set(b, o, "what", json_string(dsim_fault_what_name(f->what)));
        switch (f->when) {
        case DSIM_WHEN_STEP:
            plan_set(b, o, "at_step", json_integer(f->step));
            break;
        case DSIM_WHEN_PHASE:
            plan_set(b, o, "at_phase", plan_str(f->phase));
            if (f->step >= 0)
                plan_set(b, o, "at_step", json_integer(f->step));
            break;
        case DSIM_WHEN_TIME:
            plan_set(b, o, "at_time", plan_dur(b, f->time_ns));
            break;
        case DSIM_WHEN_PROBABILITY:
            plan_set(b, o, "probability", json_real(f->probability));
            break;
        }
        if (f->rank >= 0)
            plan_set(b, o, "rank", json_integer(f->rank));
        if (f->worker >= 0)
            plan_set(b, o, "worker", json_integer(f->worker));
        if (f->link_from >= 0)
            plan_set(b, o, "link", json_pack("[i, i]", f->link_from, f->link_to));
        if (f->duration_ns > 0)
            plan_set(b, o, "duration", plan_dur(b, f->duration_ns));
        if (f->what == DSIM_FAULT_SLOW)
            plan_set(b, o, "factor", json_real(f->factor));
        if (f->what == DSIM_FAULT_PARTITION)
            plan_set(b, o, "one_way", json_boolean(f->one_way));
        if (f->ps >= 0)
            plan_set(b, o, "ps", json_integer(f->ps));
        if (f->scope != DSIM_SCOPE_GIVEN)
            plan_set(b, o, "scope",
                     json_string(f->scope == DSIM_SCOPE_ONE   ? "one"
                                 : f->scope == DSIM_SCOPE_ALL ? "all"
                                                              : "majority"));
        if (f->n_ranks > 0) {
            json_t *rk = json_array();
            for (int k = 0; rk && k < f->n_ranks; k++)
                json_array_append_new(rk, json_integer(f->ranks[k]));
            plan_set(b, o, "ranks", rk);
        }
        if (f->after_messages > 0)
            plan_set(b, o, "after_messages", json_integer(f->after_messages));
        if (f->what == DSIM_FAULT_DROP && f->retransmit)
            plan_set(b, o, "retransmit", json_true());
        plan_set(b, o, "line", json_integer(f->line));
    }
    return arr;
}

static json_t *plan_expect(plan_b *b, const dsim_scenario *s)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_t *arr = plan_set(b, o, "checks", json_array());
    for (size_t i = 0; arr && i < s->n_expect; i++) {
        const dsim_expect *x = &s->expect[i];
        json_t *c = json_object();
        plan_push(b, arr, c);
        if (!c)
            break;
        plan_set(b, c, "name", json_string(x->check->name));
        plan_set(b, c, "available", json_boolean(x->check->available));
        plan_set(b, c, "expect", json_string(x->expect_fail ? "fail" : "pass"));
        json_t *th = plan_set(b, c, "thresholds", json_object());
        for (int k = 0; th && k < x->check->n_params; k++)
            plan_set(b, th, x->check->params[k].key,
                     isnan(x->values[k]) ? json_null() : json_real(x->values[k]));
    }
    plan_set(b, o, "error", plan_str(s->expect_error));
    return o;
}

dsim_err dsim_scenario_plan(const dsim_scenario *s, json_t **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_plan: out is NULL");
    *out = NULL;
    if (!s)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_plan: the scenario is NULL");
    plan_b b = {0};
    json_t *root = json_object();
    if (!root)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim plan: out of memory");
    const dsim_train_cfg *t = &s->train;
    size_t n_params = dsim_model_num_params(&t->model);
    plan_set(&b, root, "scenario", plan_str(s->path));
    plan_set(&b, root, "name", plan_str(s->name));
    plan_set(&b, root, "description", plan_str(s->description));
    plan_set(&b, root, "seed", plan_u64(s->seed));
    plan_set(&b, root, "engine", plan_str(s->engine));
    plan_set(&b, root, "cluster", plan_cluster(&b, s));
    plan_set(&b, root, "strategy", plan_strategy(&b, s, n_params));
    plan_set(&b, root, "model", plan_model(&b, s, n_params));
    plan_set(&b, root, "optimizer", plan_optim(&b, s));
    json_t *data = plan_set(&b, root, "data", json_object());
    char err[512] = "";
    dsim_err e = data ? plan_data(&b, s, data, err, sizeof err) : DSIM_ENOMEM;
    plan_set(&b, root, "checkpoint",
             t->checkpoint_path ? json_pack("{s:s, s:I}", "path", t->checkpoint_path, "every",
                                            (json_int_t)t->checkpoint_every)
                                : json_null());
    plan_set(&b, root, "faults", plan_faults(&b, s));
    plan_set(&b, root, "recovery", plan_str(s->recovery));
    plan_set(&b, root, "expect", plan_expect(&b, s));
    dsim_err r = dsim_scenario_runnable(s);
    char why_not[512] = "";
    if (r != DSIM_OK)
        snprintf(why_not, sizeof why_not, "%s", dsim_errmsg());
    /* "runnable" answers the exit status's question: false whenever a run
     * would be refused or fail (the data plan's error included), with the
     * reason in "not_runnable". */
    plan_set(&b, root, "runnable", json_boolean(r == DSIM_OK && e == DSIM_OK));
    plan_set(&b, root, "not_runnable",
             r != DSIM_OK   ? json_string(why_not)
             : e != DSIM_OK ? json_string(err)
                            : json_null());
    plan_set(&b, root, "error", e == DSIM_OK ? json_null() : json_string(err));
    if (b.bad || e == DSIM_ENOMEM) {
        json_decref(root);
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim plan: out of memory building the plan");
    }
    *out = root;
    if (e != DSIM_OK)
        return DSIM_ERR(e, -1, "%s", err);
    if (r != DSIM_OK)
        return DSIM_ERR(r, -1, "%s", why_not);
    return DSIM_OK;
}
