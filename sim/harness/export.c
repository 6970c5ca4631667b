/* dsim_harness_export: what another framework needs to replay a stored
 * run, as NumPy .npy files and a JSON manifest.
 *
 * The store keeps a run's losses and parameter checksums, not its data or
 * parameters; the scenario text and seed it keeps are enough to make them
 * again. So the run is trained once more, in this process, on the engine it
 * ran on (without a store), with an observer that keeps every replica's
 * example ids per step; every parameter checksum the steps table holds is
 * compared with the new run's, so the files are known to be the stored
 * run's, bit for bit, or the differences are counted. The one-device
 * reference (dsim_train_reference) gives the optimizer's final slots.
 *
 * Written (every .npy little-endian, C order, version 1.0):
 *   x.npy                 float32 (examples, features)
 *   y.npy                 int64 (examples,): class indices, or
 *                         float32 (examples, outputs): regression targets
 *   initial_params.npy    float32 (n_params,)  the model's layout (manifest)
 *   final_params.npy      float32 (n_params,)  replica 0's, after the last step
 *   reference_final_params.npy  the one-device reference's
 *   final_optim_state.npy float32 (slots,) the reference's (dsim/optim.h)
 *   batches.npy           int64 (steps, replicas, max batch): example ids,
 *                         -1 past a replica's batch
 *   batch_sizes.npy       int64 (steps, replicas)
 *   params_per_step.npy   float32 (steps, n_params): replica 0's after each
 *                         step (per_step only)
 *   manifest.json         what the files mean (see export_manifest). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "dsim/dataset.h"
#include "dsim/npy.h"
#include "dsim/spi/model.h"
#include "harness_int.h"
#include "scenario/plan.h"

#define EX_TRY(x)                                                                                  \
    do {                                                                                           \
        if ((e = (x)) != DSIM_OK)                                                                  \
            goto out;                                                                              \
    } while (0)

/* What the observer keeps: each (global step, replica)'s ids. */
typedef struct ex_rec {
    uint64_t steps; /* slots for this many global steps */
    int replicas;
    uint64_t **ids; /* [steps * replicas], malloc'd copies */
    uint64_t *n;    /* [steps * replicas] */
    int oom;
} ex_rec;

static void ex_observe(const dsim_train_step_info *info, void *user)
{
    ex_rec *r = user;
    if (info->rerun || info->global_step >= r->steps || info->replica < 0 ||
        info->replica >= r->replicas)
        return;
    size_t k = (size_t)info->global_step * (size_t)r->replicas + (size_t)info->replica;
    uint64_t *c = malloc((info->examples ? info->examples : 1) * sizeof *c);
    if (!c) {
        r->oom = 1;
        return;
    }
    memcpy(c, info->ids, info->examples * sizeof *c);
    free(r->ids[k]);
    r->ids[k] = c;
    r->n[k] = info->examples;
}

static void ex_rec_free(ex_rec *r)
{
    for (size_t k = 0; r->ids && k < (size_t)r->steps * (size_t)r->replicas; k++)
        free(r->ids[k]);
    free(r->ids);
    free(r->n);
}

static dsim_err ex_npy(const char *dir, const char *name, dsim_npy_type t, const uint64_t *shape,
                       size_t nd, const void *data)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return dsim_npy_write(path, t, shape, nd, data);
}

/* x.npy, y.npy. */
static dsim_err ex_dataset(const char *dir, const dsim_dataset *ds)
{
    uint64_t n = ds->spec.n_examples, xs[2] = {n, ds->spec.in_dim};
    DSIM_CHECK(ex_npy(dir, "x.npy", DSIM_NPY_F32, xs, 2, ds->x));
    if (ds->spec.kind != DSIM_DATA_CLASSIFICATION) {
        uint64_t ys[2] = {n, ds->y_dim};
        return ex_npy(dir, "y.npy", DSIM_NPY_F32, ys, 2, ds->y);
    }
    int64_t *lab = malloc((n ? n : 1) * sizeof *lab);
    if (!lab)
        return DSIM_ERR(DSIM_ENOMEM, -1, "export: out of memory for %" PRIu64 " labels", n);
    for (uint64_t e = 0; e < n; e++)
        lab[e] = (int64_t)ds->y[e];
    dsim_err e = ex_npy(dir, "y.npy", DSIM_NPY_I64, &n, 1, lab);
    free(lab);
    return e;
}

/* batches.npy, batch_sizes.npy; *max_b the widest batch. */
static dsim_err ex_batches(const char *dir, const ex_rec *r, uint64_t steps, uint64_t *max_b)
{
    size_t R = (size_t)r->replicas, cells = (size_t)steps * R;
    uint64_t w = 0;
    for (size_t k = 0; k < cells; k++)
        if (r->n[k] > w)
            w = r->n[k];
    *max_b = w;
    size_t nb = cells * (size_t)w;
    int64_t *b = malloc((nb ? nb : 1) * sizeof *b);
    int64_t *sz = malloc((cells ? cells : 1) * sizeof *sz);
    dsim_err e = DSIM_OK;
    if (!b || !sz) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "export: out of memory for %zu batches", cells);
        goto out;
    }
    for (size_t k = 0; k < cells; k++) {
        sz[k] = (int64_t)r->n[k];
        for (uint64_t i = 0; i < w; i++)
            b[k * w + i] = i < r->n[k] ? (int64_t)r->ids[k][i] : -1;
    }
    uint64_t bs[3] = {steps, R, w};
    if ((e = ex_npy(dir, "batches.npy", DSIM_NPY_I64, bs, 3, b)) == DSIM_OK)
        e = ex_npy(dir, "batch_sizes.npy", DSIM_NPY_I64, bs, 2, sz);
out:
    free(b);
    free(sz);
    return e;
}

static json_t *ex_hex(uint64_t v)
{
    char h[24];
    snprintf(h, sizeof h, "%016" PRIx64, v);
    return json_string(h);
}

static const char *ex_optim_rule(const dsim_optim_spec *o)
{
    switch (o->kind) {
    case DSIM_OPTIM_SGD:
        if (o->momentum > 0.0)
            return "v = v * float32(momentum) - g * lr; w += v; nesterov: w += v * "
                   "float32(momentum) - g * lr (Keras's SGD with momentum, tf.keras's "
                   "ResourceApplyKerasMomentum and Keras 3's: the velocity holds each step's own "
                   "rate; float32). Slots: [velocity: n_params]";
        return "w -= lr * g (float32)";
    case DSIM_OPTIM_MOMENTUM:
        return "accum = momentum * accum + g; w -= lr * accum; nesterov: w -= lr * g + lr * "
               "momentum * accum (TF1's MomentumOptimizer, ApplyMomentum: this step's rate "
               "scales the whole sum; float32). Slots: [accum: n_params]";
    case DSIM_OPTIM_RMSPROP:
        return "v = float32(rho) * v + float32(1 - rho) * (g*g); centered: a = float32(rho) * a + "
               "float32(1 - rho) * g, d = (v - a*a) + epsilon, else d = v + epsilon; inc = (lr * "
               "g) / sqrt(d); momentum > 0: mom = float32(momentum) * mom + inc, w -= mom, else w "
               "-= inc: Keras 3's RMSprop, epsilon INSIDE the square root (float32). Slots: "
               "[velocity: n_params], then [momentum: n_params] when momentum > 0, then "
               "[average_gradient: n_params] when centered";
    case DSIM_OPTIM_LION:
        return "b1 = float32(beta1), b2 = float32(beta2); c = m * b1 + g * (1 - b1); w -= lr * "
               "sign(c) (sign -1, 0 or 1); m = m * b2 + g * (1 - b2): Keras 3's Lion "
               "(float32, 1 - b in float32). Slots: [momentum: n_params]";
    case DSIM_OPTIM_ADAMAX:
        return "t counts steps from 1; c = 1 - beta1^t in double, rounded to float32 once a "
               "step; m += (g - m) * float32(1 - beta1); u = max(float32(beta2) * u, |g|) (a NaN "
               "on either side is the result); w -= (lr * m) / (c * (u + epsilon)): Keras 3's "
               "Adamax (float32). Slots: [m: n_params][u: n_params]";
    case DSIM_OPTIM_LAMB:
        return "t counts steps from 1; c1 = 1 - float32(beta1)^float32(t), c2 = 1 - "
               "float32(beta2)^float32(t) in float32; m += (g - m) * float32(1 - beta1); v += "
               "(g*g - v) * float32(1 - beta2); u = (m / c1) / (sqrt(v / c2) + epsilon); per "
               "variable of the model (model.layers: each kernel, then its bias) r = |w| / |u| "
               "where both are > 0, else 1 (Euclidean norms, summed in double, rounded to "
               "float32); w -= (r * lr) * u: Keras 3's Lamb (float32). Slots: [m: n_params][v: "
               "n_params]";
    case DSIM_OPTIM_NADAM:
        return "t counts steps from 1, all in float32 with b1 = float32(beta1), b2 = "
               "float32(beta2): u(j) = b1 * (1 - 0.5 * 0.96^j); P = (P * b1) * (1 - 0.5 * "
               "0.96^t) at each update step (P starts at 1; every step, or the last of each "
               "gradient accumulation, a step skipped under a dynamic loss scale included); m += "
               "(g - m) * (1 - b1); v += (g*g - v) * (1 - b2); mh = (u(t+1) * m) / (1 - P * "
               "u(t+1)) + ((1 - u(t)) * g) / (1 - P); w -= (mh * lr) / (sqrt(v / (1 - b2^t)) + "
               "epsilon): Keras 3's Nadam. Slots: [m: n_params][v: n_params] (P follows from "
               "t)";
    case DSIM_OPTIM_ADADELTA:
        return "ag = float32(rho) * ag + float32(1 - rho) * (g*g); d = -((sqrt(ad + epsilon) * "
               "g) / sqrt(ag + epsilon)); ad = float32(rho) * ad + float32(1 - rho) * (d*d); w += "
               "lr * d: Keras 3's Adadelta (float32). Slots: [accumulated_grad: "
               "n_params][accumulated_delta_var: n_params]";
    case DSIM_OPTIM_ADAGRAD:
        return "acc = acc + g*g; w -= (lr * g) / sqrt(acc + epsilon): Keras 3's Adagrad "
               "(float32), acc starting at float32(initial_accumulator_value). Slots: "
               "[accumulator: n_params]";
    default:
        if (o->amsgrad)
            return "t counts steps from 1; alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) in "
                   "double, rounded to float32 once a step; m += (g - m) * (1 - beta1); v += "
                   "(g*g - v) * (1 - beta2); vhat = max(vhat, v) (a NaN on either side is the "
                   "result); w -= m * alpha / (sqrt(vhat) + epsilon): Keras's Adam with "
                   "amsgrad=True, epsilon OUTSIDE the square root. Slots: [m: n_params][v: "
                   "n_params][vhat: n_params]";
        return "t counts steps from 1; alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t) in double, "
               "rounded to float32 once a step; m += (g - m) * (1 - beta1); v += (g*g - v) * (1 - "
               "beta2); w -= m * alpha / (sqrt(v) + epsilon): Keras's Adam, epsilon OUTSIDE the "
               "square root and not bias-corrected (PyTorch's Adam adds eps to the bias-corrected "
               "sqrt(v_hat): set torch's eps = epsilon * sqrt(1 - beta2^t) to match, or replay the "
               "rule as written). Slots: [m: n_params][v: n_params]";
    }
}

/* The model's layers, as the parameter vector holds them. */
static json_t *ex_layout(const dsim_model_spec *ms)
{
    dsim_model_layout lay;
    json_t *a = json_array();
    if (dsim_model_layout_of(ms, &lay) != DSIM_OK)
        return a;
    for (size_t l = 0; l < lay.n_layers; l++) {
        const dsim_model_layer *L = &lay.layer[l];
        json_array_append_new(a, json_pack("{s:I, s:I, s:I, s:I, s:s}", "in", (json_int_t)L->in,
                                           "out", (json_int_t)L->out, "w_offset",
                                           (json_int_t)L->w_off, "b_offset", (json_int_t)L->b_off,
                                           "activation", l + 1 < lay.n_layers ? "relu" : "none"));
    }
    return a;
}

typedef struct ex_job {
    const dsim_scenario *s;
    const dsim_stored_run *sr;
    dsim_run_id id;
    const dsim_model_spec *ms;
    const dsim_dataset *ds;
    const dsim_train_result *res, *ref;
    const dsim_harness_export_info *info;
    uint64_t max_b;
    bool per_step;
} ex_job;

static json_t *ex_model_json(const ex_job *j)
{
    const dsim_model_spec *ms = j->ms;
    if (ms->kind == DSIM_MODEL_PLUGIN) {
        char lay[600];
        snprintf(lay, sizeof lay,
                 "model plugin %s (%s): the parameters are laid out as the plugin's init and "
                 "loss_grad use them; see its source",
                 ms->plugin->name, j->s->model_plugin ? j->s->model_plugin : "");
        return json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:s}", "kind", "plugin", "plugin",
                         ms->plugin->name, "loss", dsim_loss_name(dsim_model_loss(ms)), "in_dim",
                         (json_int_t)ms->in_dim, "out_dim", (json_int_t)ms->out_dim, "n_params",
                         (json_int_t)j->res->n_params, "layout", lay);
    }
    json_t *hidden = json_array();
    for (size_t i = 0; i < ms->n_hidden; i++)
        json_array_append_new(hidden, json_integer((json_int_t)ms->hidden[i]));
    bool xent = dsim_model_loss(ms) == DSIM_LOSS_XENT;
    return json_pack(
        "{s:s, s:s, s:I, s:I, s:o, s:I, s:o, s:s, s:s, s:s}", "kind",
        dsim_model_kind_name(ms->kind), "loss", dsim_loss_name(dsim_model_loss(ms)), "in_dim",
        (json_int_t)ms->in_dim, "out_dim", (json_int_t)ms->out_dim, "hidden", hidden, "n_params",
        (json_int_t)j->res->n_params, "layers", ex_layout(ms), "layout",
        "one float32 vector: for each layer W (out x in, row-major: W[j][i] at w_offset + j*in + "
        "i; torch.nn.Linear's weight as it is) then b (out values at b_offset)",
        "forward", "h = W x + b per layer, ReLU between layers, none after the last",
        "loss_per_example",
        xent ? "cross-entropy: logsumexp(logits) - logits[label]"
             : "mean squared error: mean over the outputs of (prediction - target)^2");
}

/* What the update does to the gradient first (dsim/optim.h). */
static const char *ex_clip_rule(const dsim_optim_spec *o)
{
    if (o->global_clipnorm > 0.0)
        return "before the update, the all-reduced gradient g is clipped by its global norm: "
               "n = sqrt(sum of g^2 over every parameter, in float64); where n > "
               "global_clipnorm, g = g * float32(global_clipnorm / n) (float32 product); else g "
               "is left as it is (Keras's global_clipnorm)";
    if (o->clipnorm > 0.0)
        return "before the update, the all-reduced gradient of each variable of the model "
               "(model.layers: each kernel, then its bias) is clipped by its own norm: n = "
               "float32(sqrt(sum of its g^2, in float64)); g = (g * float32(clipnorm)) / "
               "max(n, float32(clipnorm)) in float32 (Keras's clipnorm, TF's clip_by_norm)";
    if (o->clipvalue > 0.0)
        return "before the update, every element of the all-reduced gradient is clipped into "
               "[-clipvalue, clipvalue] (float32; Keras's clipvalue)";
    return "none";
}

static const char *ex_schedule_rule(dsim_lr_kind k)
{
    switch (k) {
    case DSIM_LR_EXPONENTIAL:
        return "p = s / decay_steps (floor(p) with staircase); lr = learning_rate * "
               "decay_rate^p";
    case DSIM_LR_PIECEWISE:
        return "values[0] while step <= boundaries[0], values[i] while boundaries[i-1] < step "
               "<= boundaries[i], the last value after the last boundary";
    case DSIM_LR_POLYNOMIAL:
        return "without cycle s = min(s, decay_steps), D = decay_steps; with cycle D = "
               "decay_steps * ceil(s / decay_steps) (1 at step 0); lr = (learning_rate - "
               "end_learning_rate) * (1 - s / D)^power + end_learning_rate";
    case DSIM_LR_INVERSE_TIME:
        return "p = s / decay_steps (floor(p) with staircase); lr = learning_rate / (1 + "
               "decay_rate * p)";
    case DSIM_LR_COSINE_RESTARTS:
        return "Keras's CosineDecayRestarts, alpha, t_mul and m_mul cast to float32 first: f = s "
               "/ first_decay_steps; t_mul == 1: i = floor(f), f = f - i; else i = floor(log(1 - "
               "f * (1 - t_mul)) / log(t_mul)), f = (f - (1 - t_mul^i) / (1 - t_mul)) / t_mul^i; "
               "lr = learning_rate * ((1 - alpha) * (0.5 * m_mul^i * (1 + cos(pi * f))) + alpha)";
    default:
        return "decay(x, from) = from * ((1 - alpha) * 0.5 * (1 + cos(pi * x / decay_steps)) + "
               "alpha); without warmup_target: decay(min(s, decay_steps), learning_rate); with "
               "it: x = min(s, decay_steps + warmup_steps), while x < warmup_steps lr = "
               "(warmup_target - learning_rate) * (x / warmup_steps) + learning_rate, then "
               "decay(x - warmup_steps, warmup_target)";
    }
}

static json_t *ex_optim_json(const dsim_optim_spec *o)
{
    json_t *sched = dsim_schedule_json(o);
    if (sched)
        json_object_update_new(
            sched, json_pack("{s:s, s:s}", "step",
                             "the optimizer's step counter before the update, counting from 0 "
                             "(Keras's iterations: skipped steps count); s = float32(step), every "
                             "operation in float32 (Keras's schedules); the rate replaces "
                             "learning_rate in the update and the weight decay",
                             "rule", ex_schedule_rule(o->schedule.kind)));
    json_t *j = json_pack(
        "{s:s, s:f, s:f, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:s, s:s}", "kind",
        dsim_optim_kind_name(o->kind), "learning_rate", o->lr, "momentum", o->momentum, "nesterov",
        o->nesterov != 0, "beta1", o->beta1, "beta2", o->beta2, "epsilon", o->epsilon, "clipvalue",
        o->clipvalue, "global_clipnorm", o->global_clipnorm, "weight_decay", o->weight_decay,
        "clip", ex_clip_rule(o), "decay",
        o->weight_decay > 0.0 ? "after the clip and before the update, every parameter w = w - (w "
                                "* float32(weight_decay)) * float32(learning_rate) in float32 "
                                "(Keras's weight_decay, decoupled as AdamW's)"
                              : "none",
        "rule", ex_optim_rule(o));
    if (j && sched)
        json_object_set_new(j, "schedule", sched);
    else
        json_decref(sched);
    if (j && o->kind == DSIM_OPTIM_RMSPROP)
        json_object_update_new(
            j, json_pack("{s:f, s:b}", "rho", o->rho, "centered", o->centered != 0));
    if (j && o->kind == DSIM_OPTIM_ADADELTA)
        json_object_set_new(j, "rho", json_real(o->rho));
    if (j && o->kind == DSIM_OPTIM_ADAGRAD)
        json_object_set_new(j, "initial_accumulator_value",
                            json_real(o->initial_accumulator_value));
    if (j && o->kind == DSIM_OPTIM_ADAM)
        json_object_set_new(j, "amsgrad", json_boolean(o->amsgrad != 0));
    if (j && o->clipnorm > 0.0)
        json_object_set_new(j, "clipnorm", json_real(o->clipnorm));
    if (j && o->gradient_accumulation_steps > 1)
        json_object_update_new(
            j, json_pack("{s:i, s:s}", "gradient_accumulation_steps",
                         o->gradient_accumulation_steps, "accumulation",
                         "Keras 3's: every step counts (the schedule's step and Adam's t "
                         "count them all); where (step + 1) % k != 0, acc = g + acc (float32) "
                         "and the variables stay; else g = (g + acc) / float32(k), then the "
                         "clip (its global norm this g's), the decay and the rule, and acc "
                         "= 0. The optimizer's state ends with one more slot: [acc: "
                         "n_params]"));
    return j;
}

static json_t *ex_checksum_json(const ex_job *j)
{
    json_t *per = json_array();
    const dsim_train_result *res = j->res;
    for (uint64_t g = 0; res->checksum && g < res->steps; g++)
        json_array_append_new(per, ex_hex(res->checksum[g * (uint64_t)res->num_replicas]));
    return json_pack(
        "{s:s, s:o, s:o, s:o}", "algorithm",
        "dsim_params_checksum over the float32 parameters' little-endian bytes (len = 4 * "
        "n_params). Eight 64-bit lanes, lane k starting at 0xcbf29ce484222325 + "
        "0x9e3779b97f4a7c15 * k; each whole 64-byte block is 8 little-endian u64 words, word k "
        "into lane k as h = (h ^ word) * 0x100000001b3 (mod 2^64). Then r = len; the bytes past "
        "the last whole block, in order: r = (r ^ byte) * 0x100000001b3. Then for k = 0..7: r = "
        "mix(r ^ mix(h[k] + k)), where mix(h): h ^= h >> 33; h *= 0xff51afd7ed558ccd; h ^= h >> "
        "33; h *= 0xc4ceb9fe1a85ec53; h ^= h >> 33. Printed as 16 hex digits. (The FNV-1a prime, "
        "in 8 lanes with a final mix: not FNV-1a 64 of the bytes.)",
        "initial", ex_hex(j->info->initial_checksum), "final", ex_hex(j->info->final_checksum),
        "after_step", per);
}

static dsim_err ex_manifest(const char *dir, const ex_job *j)
{
    const dsim_train_cfg *c = &j->s->train;
    const dsim_train_result *res = j->res;
    const dsim_harness_export_info *in = j->info;
    json_t *files = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "x", "x.npy", "y", "y.npy", "initial_params",
        "initial_params.npy", "final_params", "final_params.npy", "reference_final_params",
        "reference_final_params.npy", "final_optim_state", "final_optim_state.npy", "batches",
        "batches.npy", "batch_sizes", "batch_sizes.npy");
    if (j->per_step)
        json_object_set_new(files, "params_per_step", json_string("params_per_step.npy"));
    json_object_set_new(
        files, "notes",
        json_string("final_params: replica 0's after the last step (every replica holds the "
                    "same bits when replicas_agree); reference_final_params and "
                    "final_optim_state: the one-device reference's, which takes the same "
                    "batches (the replicas' optimizers belong to the strategy and are not "
                    "read out); batches: example ids = rows of x.npy, -1 past a replica's "
                    "batch_sizes entry"));
    char rule[700];
    snprintf(rule, sizeof rule,
             "each step, every replica computes its batch's gradient: the sum over its examples "
             "of the per-example loss's gradient times loss_scale (1 / global_batch = %.9g, the "
             "configured global batch, also for a short last batch); the strategy sums the "
             "replicas' gradients (all-reduce) and every replica applies the optimizer. So a "
             "step equals one device taking the replicas' batches concatenated in replica order, "
             "the summed gradient over global_batch, then the optimizer",
             (double)res->loss_scale);
    if (c->num_ps > 0 && c->ps_mode == DSIM_PS_ASYNC)
        snprintf(rule, sizeof rule,
                 "asynchronous parameter servers: each replica's gradient (its batch's sum of "
                 "per-example gradients times loss_scale %.9g) is applied on the servers as it "
                 "arrives, in an order the run's timing chose; batches.npy gives each replica's "
                 "examples per step, but the run is not one device's sequence of steps, and "
                 "another run of it may differ (verification.differing)",
                 (double)res->loss_scale);
    json_t *m = json_pack(
        "{s:s, s:I, s:s, s:I, s:s, s:s, s:s?, s:{s:i, s:i, s:i, s:i}, s:o, s:o, "
        "s:{s:I, s:I, s:I, s:b, s:b, s:I, s:f, s:s, s:s}, "
        "s:{s:I, s:I, s:I, s:s}, s:I, s:o, s:o, "
        "s:{s:I, s:I, s:b, s:f}}",
        "format", "dsim export 1", "run", (json_int_t)j->id, "scenario",
        j->sr->scenario ? j->sr->scenario : "", "seed", (json_int_t)j->s->seed, "engine",
        j->sr->engine ? j->sr->engine : "", "strategy", c->strategy, "data_origin",
        j->ds->files ? dsim_dataset_origin(j->ds) : NULL, "cluster", "hosts", c->hosts,
        "devices_per_host", c->devices_per_host, "replicas", res->num_replicas, "ps", c->num_ps,
        "model", ex_model_json(j), "optimizer", ex_optim_json(&c->optim), "batching",
        "global_batch", (json_int_t)c->global_batch, "steps", (json_int_t)res->steps,
        "steps_per_epoch", (json_int_t)res->steps_per_epoch, "shuffle", c->shuffle,
        "drop_remainder", c->drop_remainder, "max_replica_batch", (json_int_t)j->max_b,
        "loss_scale", (double)res->loss_scale, "shard_policy",
        dsim_shard_policy_name(res->shard_applied), "rule", rule, "dataset", "examples",
        (json_int_t)j->ds->spec.n_examples, "features", (json_int_t)j->ds->spec.in_dim, "outputs",
        (json_int_t)j->ds->spec.out_dim, "task", dsim_data_kind_name(j->ds->spec.kind),
        "optimizer_steps", (json_int_t)res->steps, "checksum", ex_checksum_json(j), "files", files,
        "verification", "stored_checksums", (json_int_t)in->checked, "differing",
        (json_int_t)in->differed, "replicas_agree", res->replicas_agree, "reference_max_abs_diff",
        in->ref_max_abs);
    if (!m)
        return DSIM_ERR(DSIM_ENOMEM, -1, "export: the manifest could not be built");
    char path[4200], tmp[4210];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(m, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(m);
    if (rc != 0 || rename(tmp, path) != 0)
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot write: %s", path, strerror(errno));
    return DSIM_OK;
}

/* Compares the new run's checksums with the stored ones. */
static dsim_err ex_verify(const char *db, dsim_run_id id, const dsim_train_result *res,
                          dsim_harness_export_info *info)
{
    uint64_t *cs = NULL, st = 0;
    int reps = 0;
    DSIM_CHECK(dsim_store_read_checksums(db, id, &cs, &st, &reps));
    for (uint64_t g = 0; g < st; g++)
        for (int r = 0; r < reps; r++) {
            uint64_t want = cs[g * (uint64_t)reps + (uint64_t)r];
            if (!want)
                continue;
            info->checked++;
            uint64_t local = g >= res->first_step ? g - res->first_step : UINT64_MAX;
            if (local >= res->steps || r >= res->num_replicas || !res->checksum ||
                res->checksum[local * (uint64_t)res->num_replicas + (uint64_t)r] != want)
                info->differed++;
        }
    free(cs);
    return DSIM_OK;
}

/* Trains the job and the reference and writes every file. */
static dsim_err ex_write(const char *db, dsim_run_id id, const dsim_stored_run *sr,
                         dsim_scenario *s, const dsim_dataset *ds, const char *dir, bool per_step,
                         dsim_harness_export_info *info)
{
    const dsim_engine_ops *eng = NULL;
    DSIM_CHECK(dsim_engine_find(s->engine, &eng));
    dsim_train_cfg cfg = s->train;
    cfg.dataset = ds;
    dsim_model_spec ms = cfg.model;
    if (ms.in_dim == 0)
        dsim_dataset_model_spec(ds, &ms);
    ex_rec rec = {.steps = dsim_train_cfg_steps(&cfg) + 1,
                  .replicas = cfg.hosts * cfg.devices_per_host};
    rec.ids = calloc((size_t)rec.steps * (size_t)rec.replicas, sizeof *rec.ids);
    rec.n = calloc((size_t)rec.steps * (size_t)rec.replicas, sizeof *rec.n);
    if (!rec.ids || !rec.n) {
        ex_rec_free(&rec);
        return DSIM_ERR(DSIM_ENOMEM, -1, "export: out of memory for the batches");
    }
    cfg.observer = ex_observe;
    cfg.observer_user = &rec;
    cfg.record_params = per_step;
    dsim_engine_attempt here = {.in_process = true, .seed = s->seed};
    dsim_engine_outcome oc;
    dsim_train_result res, ref;
    memset(&ref, 0, sizeof ref);
    dsim_err e = eng->train(&cfg, &here, &res, &oc);
    dsim_engine_outcome_free(&oc);
    float *init = NULL;
    if (e != DSIM_OK) {
        e = DSIM_ERR(e, -1, "run %lld (%s) did not train again: %s", (long long)id,
                     sr->scenario ? sr->scenario : "", res.error.msg);
        goto out;
    }
    if (rec.oom || res.steps >= rec.steps) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "export: the batches of %" PRIu64 " steps were not kept",
                     res.steps);
        goto out;
    }
    dsim_train_cfg rc = s->train;
    rc.dataset = ds;
    if ((e = dsim_train_reference(&rc, &ref)) != DSIM_OK) {
        e = DSIM_ERR(e, -1, "export: the one-device reference failed: %s", ref.error.msg);
        goto out;
    }
    /* the initial variables, drawn as the driver draws them */
    init = malloc((res.n_params ? res.n_params : 1) * sizeof *init);
    dsim_rng rng;
    dsim_rng_init(&rng, cfg.seed, "model.init", 0);
    if (!init || (e = dsim_model_init(&ms, init, &rng)) != DSIM_OK) {
        e = init ? e : DSIM_ERR(DSIM_ENOMEM, -1, "export: out of memory");
        goto out;
    }
    info->initial_checksum = dsim_params_checksum(init, res.n_params);
    info->final_checksum = dsim_params_checksum(res.params, res.n_params);
    if (info->initial_checksum != res.initial_checksum) {
        e = DSIM_ERR(DSIM_EPROTO, -1,
                     "export: the initial parameters drawn here (checksum %016" PRIx64
                     ") are not the job's (%016" PRIx64 ")",
                     info->initial_checksum, res.initial_checksum);
        goto out;
    }
    EX_TRY(ex_verify(db, id, &res, info));
    dsim_params_diff d;
    dsim_params_compare(res.params, ref.params, res.n_params, &d);
    info->ref_max_abs = d.max_abs;
    info->steps = res.steps;
    info->replicas = res.num_replicas;
    info->n_params = res.n_params;
    info->n_examples = ds->spec.n_examples;
    uint64_t np = res.n_params, sl = ref.optim_state_len, max_b = 0;
    EX_TRY(ex_dataset(dir, ds));
    EX_TRY(ex_npy(dir, "initial_params.npy", DSIM_NPY_F32, &np, 1, init));
    EX_TRY(ex_npy(dir, "final_params.npy", DSIM_NPY_F32, &np, 1, res.params));
    EX_TRY(ex_npy(dir, "reference_final_params.npy", DSIM_NPY_F32, &np, 1, ref.params));
    EX_TRY(ex_npy(dir, "final_optim_state.npy", DSIM_NPY_F32, &sl, 1, ref.optim_state));
    EX_TRY(ex_batches(dir, &rec, res.steps, &max_b));
    /* the variables the run kept, if it did: written from the store, and
     * held against the run trained again (initial and final rows) */
    float *kept = NULL;
    uint64_t nk = 0;
    EX_TRY(dsim_store_read_params(db, id, res.n_params, &kept, &nk));
    if (nk) {
        info->kept_steps = nk - 1;
        size_t bytes = res.n_params * sizeof(float);
        if (memcmp(kept, init, bytes) != 0)
            info->kept_differed++;
        if (nk == res.steps + 1 && memcmp(kept + (nk - 1) * res.n_params, res.params, bytes) != 0)
            info->kept_differed++;
        info->differed += info->kept_differed;
        uint64_t ps[2] = {nk - 1, np};
        e = ex_npy(dir, "params_per_step.npy", DSIM_NPY_F32, ps, 2, kept + res.n_params);
        free(kept);
        if (e != DSIM_OK)
            goto out;
        per_step = true;
    } else if (per_step && res.trace) {
        uint64_t ps[2] = {res.steps, np};
        EX_TRY(ex_npy(dir, "params_per_step.npy", DSIM_NPY_F32, ps, 2, res.trace));
    }
    ex_job j = {.s = s,
                .sr = sr,
                .id = id,
                .ms = &ms,
                .ds = ds,
                .res = &res,
                .ref = &ref,
                .info = info,
                .max_b = max_b,
                .per_step = per_step && (res.trace || info->kept_steps)};
    e = ex_manifest(dir, &j);
out:
    free(init);
    ex_rec_free(&rec);
    dsim_train_result_free(&res);
    dsim_train_result_free(&ref);
    return e;
}

dsim_err dsim_harness_export(const char *db_path, dsim_run_id id, const char *dir, bool per_step,
                             dsim_harness_export_info *info)
{
    if (!dir || !info)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_export: dir and info are needed");
    memset(info, 0, sizeof *info);
    const char *db = db_path ? db_path : DSIM_STORE_DEFAULT_PATH;
    dsim_stored_run sr;
    DSIM_CHECK(dsim_store_read_run(db, id, &sr));
    snprintf(info->scenario, sizeof info->scenario, "%s", sr.scenario ? sr.scenario : "");
    info->seed = sr.seed;
    dsim_scenario *s = NULL;
    dsim_dataset *owned = NULL;
    dsim_err e = DSIM_OK;
    if (!sr.scenario_text) {
        e = DSIM_ERR(DSIM_EINVAL, -1, "%s: run %lld has no scenario text stored", db,
                     (long long)id);
        goto out;
    }
    EX_TRY(h_stored_scenario(db, id, &sr, &s));
    if (s->n_faults) {
        e = DSIM_ERR(DSIM_ENOTSUP, -1,
                     "%s: run %lld (%s) injects faults: export replays a run as a clean job, "
                     "so it exports runs without a faults: section",
                     db, (long long)id, info->scenario);
        goto out;
    }
    dsim_harness_opts o = {
        .size = sizeof o, .engine_override = sr.engine, .has_seed = true, .seed = sr.seed};
    EX_TRY(dsim_harness_prepare(s, &o));
    const dsim_dataset *ds = s->dataset;
    if (!ds) {
        EX_TRY(dsim_dataset_make(&s->train.data, &owned));
        ds = owned;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        e = DSIM_ERR(DSIM_EIO, -1, "%s: cannot create the folder: %s", dir, strerror(errno));
        goto out;
    }
    e = ex_write(db, id, &sr, s, ds, dir, per_step, info);
out:
    dsim_dataset_free(owned);
    dsim_scenario_free(s);
    dsim_stored_run_free(&sr);
    return e;
}
