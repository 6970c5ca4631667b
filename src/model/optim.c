/* Optimizers with TensorFlow's update rules (see dsim/optim.h).
 *
 * The element-wise updates are written in float, in the order of TF's
 * training kernels (ApplyGradientDescent, ApplyMomentum, Keras Adam), so a
 * run here moves the weights as TF's f32 kernels would, up to the rounding
 * of the scalar coefficients. The loops are the model kernels' (kern.h):
 * vectorised, with each element's operations those of the scalar rule. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/optim.h"
#include "dsim/spi/rt.h"
#include "model/kern.h"
#include "model/optim_int.h"

struct dsim_optim {
    dsim_optim_spec spec;
    size_t n;
    uint64_t step;
    size_t state_len;
    float *state;    /* momentum: accum; adam: m then v */
    float *clipped;  /* n floats: the clipped gradient (allocated at the first clip) */
    float *upd;      /* n floats: LAMB's update before its ratio (at its first step) */
    float *averaged; /* n floats: (g + acc) / k on an accumulation's update step */
    float nadam_u;   /* Nadam's u_product over the update steps before nadam_at */
    uint64_t nadam_at;
    size_t part_off, part_of; /* dsim_optim_set_part: parameters [part_off, part_off + n) of a
                                 model of part_of; part_of 0: the whole model's */
};

/* What this worker's updates saw (optim_int.h). */
typedef struct optim_seen {
    double norm; /* NaN: nothing noted */
    size_t n;
    int want;
    float *copy;           /* optim_seen_copy's destination, copy_n floats, or NULL */
    float *slots;          /* its slots' row: copy_n floats a slot, or NULL */
    int copy_whole;        /* a whole model's gradient is copied too, not only a part's */
    unsigned char *filled; /* whether copy was set to NaN (under optim_seen_lock) */
    size_t copy_n;
    int copied;
} optim_seen;
static _Thread_local optim_seen optim_seen_now = {.norm = NAN};
static const optim_seen optim_seen_init = {.norm = NAN};

static void *optim_seen_addr(void)
{
    return &optim_seen_now;
}

__attribute__((constructor)) static void optim_register_state(void)
{
    dsim_rt_worker_state_add(optim_seen_addr, &optim_seen_init, sizeof optim_seen_now);
}

void optim_seen_begin(int want)
{
    optim_seen_now = (optim_seen){.norm = NAN, .want = want};
}

void optim_seen_copy(float *dst, float *slots, size_t n, int whole, unsigned char *filled)
{
    optim_seen_now.copy = dst;
    optim_seen_now.slots = slots;
    optim_seen_now.copy_n = n;
    optim_seen_now.copy_whole = whole;
    optim_seen_now.filled = filled;
    optim_seen_now.copied = 0;
}

/* The replicas of a job write their parts of one row (on threads of their
 * own under the threads engine); a part's bounds are the plugin's to say,
 * so two may overlap. Taken only where a copy is asked for: at the kept
 * steps of a run under adam. */
static pthread_mutex_t optim_seen_lock = PTHREAD_MUTEX_INITIALIZER;

/* Where the worker asked: grad[0..n) into its row, whole or at its part. */
static void optim_seen_note(optim_seen *seen, const dsim_optim *opt, const float *grad, size_t n)
{
    size_t at;
    if (!seen->copy || seen->copied)
        return;
    if (opt->part_of == 0 && seen->copy_whole && n == seen->copy_n)
        at = 0;
    else if (opt->part_of != 0 && opt->part_of == seen->copy_n)
        at = opt->part_off; /* set_part checked that the part lies inside */
    else
        return;
    /* the slots' row holds the rule's slots of an adaptive optimizer */
    size_t P = seen->copy_n,
           S = dsim_optim_is_adaptive(&opt->spec) ? dsim_optim_rule_slots(&opt->spec) : 0;
    pthread_mutex_lock(&optim_seen_lock);
    if (!*seen->filled) {
        for (size_t k = 0; n < P && k < P; k++)
            seen->copy[k] = NAN; /* a part: NaN where no part comes */
        for (size_t k = 0; n < P && seen->slots && k < S * P; k++)
            seen->slots[k] = NAN;
        *seen->filled = 1;
    }
    memcpy(seen->copy + at, grad, n * sizeof(float));
    /* the slots before the update: slot i of the part at row i's place
     * (adam's m and v, rmsprop's, adagrad's or lion's; an accumulator of gradient
     * accumulation after them is not kept) */
    for (size_t i = 0; seen->slots && i < S && opt->state_len >= S * n; i++)
        memcpy(seen->slots + i * P + at, opt->state + i * n, n * sizeof(float));
    pthread_mutex_unlock(&optim_seen_lock);
    seen->copied = 1;
}

double optim_seen_take(size_t *n)
{
    double v = optim_seen_now.norm;
    *n = optim_seen_now.n;
    optim_seen_now = optim_seen_init;
    return v;
}

static const char *const optim_kind_names[DSIM_OPTIM_KIND_COUNT] = {
    "sgd", "momentum", "adam", "rmsprop", "adagrad", "lion", "adamax", "lamb", "nadam", "adadelta"};

const char *dsim_optim_kind_name(dsim_optim_kind k)
{
    if ((unsigned)k >= DSIM_OPTIM_KIND_COUNT)
        return "?";
    return optim_kind_names[k];
}

dsim_err dsim_optim_kind_parse(const char *s, dsim_optim_kind *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_optim_kind_parse: NULL argument");
    for (int k = 0; k < DSIM_OPTIM_KIND_COUNT; k++) {
        if (strcmp(s, optim_kind_names[k]) == 0) {
            *out = (dsim_optim_kind)k;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "unknown optimizer '%s': use sgd, momentum, adam, adamax, nadam, rmsprop, "
                    "adagrad, adadelta, lion or lamb",
                    s);
}

void dsim_optim_spec_default(dsim_optim_spec *spec, dsim_optim_kind kind)
{
    if (!spec)
        return;
    memset(spec, 0, sizeof *spec);
    spec->kind = kind;
    spec->lr = kind == DSIM_OPTIM_SGD || kind == DSIM_OPTIM_MOMENTUM ? 0.01 : 0.001;
    spec->momentum = kind == DSIM_OPTIM_MOMENTUM ? 0.9 : 0.0;
    spec->nesterov = 0;
    spec->beta1 = 0.9;
    spec->beta2 = kind == DSIM_OPTIM_LION ? 0.99 : 0.999;
    spec->epsilon = 1e-7;
    spec->rho = kind == DSIM_OPTIM_ADADELTA ? 0.95 : 0.9;
    spec->centered = 0;
    spec->initial_accumulator_value = 0.1;
}

static int optim_unit(double v)
{
    return v >= 0.0 && v < 1.0;
}

dsim_err dsim_optim_validate(const dsim_optim_spec *spec)
{
    if (!spec)
        return DSIM_ERR(DSIM_EINVAL, -1, "optimizer spec is NULL");
    if ((unsigned)spec->kind >= DSIM_OPTIM_KIND_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer kind %d is not one of sgd, momentum, adam, rmsprop, "
                        "adagrad, lion, adamax, lamb, nadam, adadelta",
                        (int)spec->kind);
    const char *kind = optim_kind_names[spec->kind];
    /* lr is rounded to float for the update; one that rounds to 0 or inf
     * would silently not train or blow up. */
    /* a cosine warmup may start from 0, as Keras's examples do */
    const int from0 = spec->schedule.kind == DSIM_LR_COSINE && spec->schedule.warmup;
    if (!(from0 && spec->lr == 0.0) &&
        (!(spec->lr > 0.0) || !isfinite((float)spec->lr) || (float)spec->lr == 0.0f))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: lr %g must be a positive number representable in float%s",
                        kind, spec->lr, from0 ? " (or 0, where a warmup starts)" : "");
    /* Keras refuses more than one of its clipping arguments. */
    if (!(spec->clipvalue >= 0.0) || !isfinite((float)spec->clipvalue) ||
        (spec->clipvalue > 0.0 && (float)spec->clipvalue == 0.0f))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: clipvalue %g must be 0 (off) or a positive number "
                        "representable in float",
                        kind, spec->clipvalue);
    if (!(spec->global_clipnorm >= 0.0) || !isfinite(spec->global_clipnorm))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: global_clipnorm %g must be 0 (off) or a positive number",
                        kind, spec->global_clipnorm);
    if (!(spec->weight_decay >= 0.0) || !isfinite((float)spec->weight_decay))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: weight_decay %g must be 0 (off) or a positive number "
                        "representable in float (Keras's AdamW uses 0.004)",
                        kind, spec->weight_decay);
    if (!(spec->clipnorm >= 0.0) || !isfinite((float)spec->clipnorm) ||
        (spec->clipnorm > 0.0 && (float)spec->clipnorm == 0.0f))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: clipnorm %g must be 0 (off) or a positive number "
                        "representable in float",
                        kind, spec->clipnorm);
    if ((spec->clipvalue > 0.0) + (spec->global_clipnorm > 0.0) + (spec->clipnorm > 0.0) > 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: only one of clipvalue (%g), global_clipnorm (%g) and "
                        "clipnorm (%g) can be set, as in Keras; remove the others",
                        kind, spec->clipvalue, spec->global_clipnorm, spec->clipnorm);
    switch (spec->kind) {
    case DSIM_OPTIM_SGD: /* Keras's SGD(momentum=, nesterov=): 0 is plain SGD */
    case DSIM_OPTIM_MOMENTUM:
        if (!optim_unit(spec->momentum))
            return DSIM_ERR(DSIM_EINVAL, -1, "optimizer %s: momentum %g must be in [0, 1)%s", kind,
                            spec->momentum, spec->kind == DSIM_OPTIM_SGD ? " (0: plain SGD)" : "");
        if (spec->nesterov != 0 && spec->nesterov != 1)
            return DSIM_ERR(DSIM_EINVAL, -1, "optimizer %s: nesterov %d must be 0 or 1", kind,
                            spec->nesterov);
        break;
    case DSIM_OPTIM_ADAM:
    case DSIM_OPTIM_ADAMAX:
    case DSIM_OPTIM_LAMB:
    case DSIM_OPTIM_NADAM:
        if (!optim_unit(spec->beta1))
            return DSIM_ERR(DSIM_EINVAL, -1, "optimizer %s: beta1 %g must be in [0, 1)", kind,
                            spec->beta1);
        if (!optim_unit(spec->beta2))
            return DSIM_ERR(DSIM_EINVAL, -1, "optimizer %s: beta2 %g must be in [0, 1)", kind,
                            spec->beta2);
        if (spec->kind == DSIM_OPTIM_ADAM && spec->amsgrad != 0 && spec->amsgrad != 1)
            return DSIM_ERR(DSIM_EINVAL, -1, "optimizer adam: amsgrad %d must be 0 or 1",
                            spec->amsgrad);
        break;
    case DSIM_OPTIM_ADADELTA:
        if (!optim_unit(spec->rho))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "optimizer adadelta: rho %g must be in [0, 1) (Keras uses 0.95)",
                            spec->rho);
        break;
    case DSIM_OPTIM_RMSPROP:
        if (!optim_unit(spec->rho))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "optimizer rmsprop: rho %g must be in [0, 1) (Keras uses 0.9)",
                            spec->rho);
        if (!optim_unit(spec->momentum))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "optimizer rmsprop: momentum %g must be in [0, 1) (0: none)",
                            spec->momentum);
        if (spec->centered != 0 && spec->centered != 1)
            return DSIM_ERR(DSIM_EINVAL, -1, "optimizer rmsprop: centered %d must be 0 or 1",
                            spec->centered);
        break;
    case DSIM_OPTIM_LION:
        /* Keras: beta_1 in (0, 1], else it degenerates to SignSGD */
        if (!(spec->beta1 > 0.0 && spec->beta1 <= 1.0))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "optimizer lion: beta1 %g must be in (0, 1] (Keras uses 0.9; 0 "
                            "would make it SignSGD)",
                            spec->beta1);
        if (!optim_unit(spec->beta2))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "optimizer lion: beta2 %g must be in [0, 1) (Keras uses 0.99)",
                            spec->beta2);
        break;
    case DSIM_OPTIM_ADAGRAD:
        if (!(spec->initial_accumulator_value >= 0.0) ||
            !isfinite((float)spec->initial_accumulator_value))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "optimizer adagrad: initial_accumulator_value %g must be 0 or a "
                            "positive number representable in float (Keras uses 0.1)",
                            spec->initial_accumulator_value);
        break;
    default:
        break;
    }
    /* the adaptive rules divide by a root with epsilon under it or beside it */
    if ((spec->kind == DSIM_OPTIM_ADAM || spec->kind == DSIM_OPTIM_ADAMAX ||
         spec->kind == DSIM_OPTIM_LAMB || spec->kind == DSIM_OPTIM_NADAM ||
         spec->kind == DSIM_OPTIM_RMSPROP || spec->kind == DSIM_OPTIM_ADAGRAD ||
         spec->kind == DSIM_OPTIM_ADADELTA) &&
        (!(spec->epsilon > 0.0) || !isfinite((float)spec->epsilon) || (float)spec->epsilon == 0.0f))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: epsilon %g must be positive and representable in "
                        "float (Keras uses 1e-7)",
                        kind, spec->epsilon);
    if (spec->n_vars > DSIM_OPTIM_MAX_VARS)
        return DSIM_ERR(DSIM_EINVAL, -1, "optimizer %s: %zu variables, at most %d", kind,
                        spec->n_vars, DSIM_OPTIM_MAX_VARS);
    for (size_t k = 0; k < spec->n_vars; k++)
        if (spec->var_len[k] == 0)
            return DSIM_ERR(DSIM_EINVAL, -1, "optimizer %s: variable %zu has no parameters", kind,
                            k);
    if (spec->gradient_accumulation_steps < 0 ||
        spec->gradient_accumulation_steps > DSIM_OPTIM_MAX_ACCUMULATION)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: gradient_accumulation_steps %d must be 0 or 1 (off) or up "
                        "to %d",
                        kind, spec->gradient_accumulation_steps, DSIM_OPTIM_MAX_ACCUMULATION);
    if (optim_schedule_validate(spec) != DSIM_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        return DSIM_ERR(DSIM_EINVAL, -1, "optimizer %s: %s", kind, why);
    }
    return DSIM_OK;
}

static size_t optim_slots(const dsim_optim_spec *s)
{
    switch (s->kind) {
    case DSIM_OPTIM_SGD:
        return s->momentum > 0.0 ? 1 : 0; /* Keras's velocity */
    case DSIM_OPTIM_MOMENTUM:
    case DSIM_OPTIM_ADAGRAD:
    case DSIM_OPTIM_LION:
        return 1;
    case DSIM_OPTIM_ADAM:
        return s->amsgrad ? 3 : 2;
    case DSIM_OPTIM_ADAMAX:
    case DSIM_OPTIM_LAMB:
    case DSIM_OPTIM_NADAM:
    case DSIM_OPTIM_ADADELTA:
        return 2;
    case DSIM_OPTIM_RMSPROP:
        return 1 + (s->momentum > 0.0) + (s->centered != 0);
    default:
        return 0;
    }
}

/* k > 1 when the spec accumulates gradients over k steps, else 0 */
static int optim_accum(const dsim_optim_spec *s)
{
    return s->gradient_accumulation_steps > 1 ? s->gradient_accumulation_steps : 0;
}

size_t dsim_optim_slots_per_param(const dsim_optim_spec *spec)
{
    if (!spec || (unsigned)spec->kind >= DSIM_OPTIM_KIND_COUNT)
        return 0;
    return optim_slots(spec) + (optim_accum(spec) ? 1 : 0);
}

size_t dsim_optim_rule_slots(const dsim_optim_spec *spec)
{
    if (!spec || (unsigned)spec->kind >= DSIM_OPTIM_KIND_COUNT)
        return 0;
    return optim_slots(spec);
}

const char *dsim_optim_slot_name(const dsim_optim_spec *spec, size_t slot)
{
    if (!spec || (unsigned)spec->kind >= DSIM_OPTIM_KIND_COUNT)
        return "?";
    if (slot >= optim_slots(spec))
        return "gradient accumulator";
    switch (spec->kind) {
    case DSIM_OPTIM_ADAM:
    case DSIM_OPTIM_LAMB:
    case DSIM_OPTIM_NADAM:
        return slot == 0 ? "m" : slot == 1 ? "v" : "vhat";
    case DSIM_OPTIM_ADAMAX:
        return slot == 0 ? "m" : "u";
    case DSIM_OPTIM_RMSPROP: /* velocity, then momentum when > 0, then the average */
        return slot == 0                           ? "velocity"
               : slot == 1 && spec->momentum > 0.0 ? "momentum"
                                                   : "average gradient";
    case DSIM_OPTIM_LION:
        return "momentum";
    case DSIM_OPTIM_ADADELTA:
        return slot == 0 ? "accumulated_grad" : "accumulated_delta_var";
    case DSIM_OPTIM_SGD:
        return "velocity";
    default: /* momentum (TF1's accum), adagrad */
        return "accumulator";
    }
}

int dsim_optim_is_adaptive(const dsim_optim_spec *spec)
{
    return spec && (spec->kind == DSIM_OPTIM_ADAM || spec->kind == DSIM_OPTIM_ADAMAX ||
                    spec->kind == DSIM_OPTIM_RMSPROP || spec->kind == DSIM_OPTIM_ADAGRAD ||
                    spec->kind == DSIM_OPTIM_LION || spec->kind == DSIM_OPTIM_LAMB ||
                    spec->kind == DSIM_OPTIM_NADAM || spec->kind == DSIM_OPTIM_ADADELTA);
}

void dsim_optim_init_state(const dsim_optim_spec *spec, size_t n_params, float *state)
{
    size_t len = dsim_optim_slots_per_param(spec) * n_params;
    if (!state || !len)
        return;
    memset(state, 0, len * sizeof(float));
    if (spec->kind == DSIM_OPTIM_ADAGRAD) {
        const float a = (float)spec->initial_accumulator_value;
        for (size_t k = 0; k < n_params; k++)
            state[k] = a;
    }
}

dsim_err dsim_optim_create(const dsim_optim_spec *spec, size_t n_params, dsim_optim **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_optim_create: out is NULL");
    *out = NULL;
    DSIM_CHECK(dsim_optim_validate(spec));
    if (n_params == 0 || n_params > SIZE_MAX / (2 * sizeof(float)))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_optim_create: n_params %zu must be positive and "
                        "fit in memory",
                        n_params);
    dsim_optim *opt = calloc(1, sizeof *opt);
    if (!opt)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_optim_create: out of memory");
    opt->spec = *spec;
    opt->n = n_params;
    opt->nadam_u = 1.0f;
    opt->state_len = dsim_optim_slots_per_param(spec) * n_params;
    if (opt->state_len) {
        opt->state = calloc(opt->state_len, sizeof(float));
        if (!opt->state) {
            free(opt);
            return DSIM_ERR(DSIM_ENOMEM, -1,
                            "optimizer %s: cannot allocate slots for %zu parameters",
                            optim_kind_names[spec->kind], n_params);
        }
        dsim_optim_init_state(spec, n_params, opt->state);
    }
    *out = opt;
    return DSIM_OK;
}

void dsim_optim_destroy(dsim_optim *opt)
{
    if (!opt)
        return;
    free(opt->state);
    free(opt->clipped);
    free(opt->upd);
    free(opt->averaged);
    free(opt);
}

double dsim_optim_grad_sqsum(const float *grad, size_t n)
{
    double l[8] = {0};
    size_t k = 0;
    if (!grad)
        return 0.0;
    for (; k + 8 <= n; k += 8)
        for (int i = 0; i < 8; i++)
            l[i] += (double)grad[k + i] * (double)grad[k + i];
    for (; k < n; k++)
        l[k % 8] += (double)grad[k] * (double)grad[k];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

int dsim_optim_needs_global_norm(const dsim_optim_spec *spec)
{
    return spec && spec->global_clipnorm > 0.0;
}

static dsim_err optim_var_spans(const dsim_optim *opt, size_t n, const char *what, size_t *at,
                                size_t *len, size_t *nv);

/* Keras's clipnorm: each variable's gradient by its own norm, into c. */
static dsim_err optim_clip_each(const dsim_optim *opt, const float *grad, size_t n, float *c)
{
    size_t at[DSIM_OPTIM_MAX_VARS], len[DSIM_OPTIM_MAX_VARS], nv;
    DSIM_CHECK(optim_var_spans(opt, n, "clipnorm", at, len, &nv));
    const float cn = (float)opt->spec.clipnorm;
    for (size_t v = 0; v < nv; v++) {
        const float *g = grad + at[v];
        double ss = 0;
        for (size_t k = 0; k < len[v]; k++)
            ss += (double)g[k] * (double)g[k];
        float l2 = ss > 0 ? (float)sqrt(ss) : (float)ss; /* TF: 0, or NaN, as summed */
        float den = l2 != l2 ? l2 : l2 > cn ? l2 : cn;
        for (size_t k = 0; k < len[v]; k++)
            c[at[v] + k] = (g[k] * cn) / den;
    }
    return DSIM_OK;
}

/* The gradient the update takes: grad itself, or its clipped copy. */
static dsim_err optim_clip(dsim_optim *opt, const float *grad, size_t n, double global_norm,
                           const float **out)
{
    const dsim_optim_spec *s = &opt->spec;
    *out = grad;
    if (!(s->clipvalue > 0.0) && !(s->global_clipnorm > 0.0) && !(s->clipnorm > 0.0))
        return DSIM_OK;
    float scale = 1.0f;
    if (s->global_clipnorm > 0.0) {
        /* Keras: clip_norm * min(1 / norm, 1 / clip_norm); NaN when the norm
         * is not finite */
        if (!isfinite(global_norm))
            scale = NAN;
        else if (global_norm > s->global_clipnorm)
            scale = (float)(s->global_clipnorm / global_norm);
        else
            return DSIM_OK;
    }
    if (!opt->clipped && !(opt->clipped = malloc(opt->n * sizeof(float))))
        return DSIM_ERR(DSIM_ENOMEM, -1, "optimizer: cannot allocate the clipped gradient (%zu)",
                        opt->n);
    float *c = opt->clipped;
    if (s->clipnorm > 0.0) {
        DSIM_CHECK(optim_clip_each(opt, grad, n, c));
    } else if (s->global_clipnorm > 0.0) {
        for (size_t k = 0; k < n; k++)
            c[k] = grad[k] * scale;
    } else {
        const float hi = (float)s->clipvalue, lo = -hi;
        for (size_t k = 0; k < n; k++) /* NaN stays NaN, as tf.clip_by_value */
            c[k] = grad[k] > hi ? hi : grad[k] < lo ? lo : grad[k];
    }
    *out = c;
    return DSIM_OK;
}

/* TF's maximum (from TF 2.4): a NaN on either side is the result. */
static float optim_max(float a, float b)
{
    return a != a ? a : b != b ? b : a > b ? a : b;
}

/* Keras 3's Adam with amsgrad, operand for operand as the kernels' Adam
 * (adam's m and v updates, then the running maximum of v in the
 * denominator). */
static void optim_amsgrad(float *p, float *m, float *v, float *vh, const float *g, size_t n,
                          float alpha, float omb1, float omb2, float eps)
{
    for (size_t k = 0; k < n; k++) {
        float gk = g[k];
        m[k] += (gk - m[k]) * omb1;
        v[k] += (gk * gk - v[k]) * omb2;
        vh[k] = optim_max(vh[k], v[k]);
        p[k] -= m[k] * alpha / (sqrtf(vh[k]) + eps);
    }
}

/* Keras 3's Adamax: m += (g - m) * (1 - beta1); u = max(beta2 * u, |g|);
 * p -= (lr * m) / ((1 - beta1^t) * (u + epsilon)), in float. */
static void optim_adamax(float *p, float *m, float *u, const float *g, size_t n, float lr,
                         float omb1, float b2, float omb1p, float eps)
{
    for (size_t k = 0; k < n; k++) {
        m[k] += (g[k] - m[k]) * omb1;
        u[k] = optim_max(b2 * u[k], fabsf(g[k]));
        p[k] -= (lr * m[k]) / (omb1p * (u[k] + eps));
    }
}

static dsim_err optim_apply(dsim_optim *opt, float *params, const float *grad, size_t n,
                            double global_norm, int whole);

dsim_err dsim_optim_apply(dsim_optim *opt, float *params, const float *grad, size_t n)
{
    double norm = 0.0;
    /* only once the arguments are right: n is checked against the optimizer
     * before grad[0..n) is read */
    if (opt && params && grad && n == opt->n && opt->spec.global_clipnorm > 0.0)
        norm = sqrt(dsim_optim_grad_sqsum(grad, n));
    return optim_apply(opt, params, grad, n, norm, 1);
}

dsim_err dsim_optim_apply_norm(dsim_optim *opt, float *params, const float *grad, size_t n,
                               double global_norm)
{
    return optim_apply(opt, params, grad, n, global_norm, 0);
}

/* Keras 3's gradient accumulation: on a step that does not update, the
 * gradient is added to the accumulator (*grad set to NULL); on one that
 * does, *grad becomes (g + acc) / k and the accumulator is zeroed, and a
 * global clip's norm is that gradient's (*norm, where the call holds the
 * whole model's). */
static dsim_err optim_accumulate(dsim_optim *opt, const float **grad, size_t n, double *norm,
                                 int whole)
{
    const dsim_optim_spec *s = &opt->spec;
    const int k = optim_accum(s);
    float *acc = opt->state + optim_slots(s) * n;
    const float *g = *grad;
    if ((opt->step + 1) % (uint64_t)k != 0) {
        for (size_t i = 0; i < n; i++)
            acc[i] = g[i] + acc[i];
        *grad = NULL;
        return DSIM_OK;
    }
    if (s->global_clipnorm > 0.0 && !whole)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "dsim_optim_apply_norm: with gradient_accumulation_steps %d the "
                        "global_clipnorm clip takes the norm of the accumulated gradient, which "
                        "an optimizer of a part does not see; clip with clipvalue, or apply the "
                        "whole model's gradient with dsim_optim_apply",
                        k);
    if (!opt->averaged && !(opt->averaged = malloc(opt->n * sizeof(float))))
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "optimizer: cannot allocate the accumulated gradient (%zu)", opt->n);
    const float steps = (float)k;
    for (size_t i = 0; i < n; i++)
        opt->averaged[i] = (g[i] + acc[i]) / steps;
    memset(acc, 0, n * sizeof(float));
    *grad = opt->averaged;
    if (s->global_clipnorm > 0.0)
        *norm = sqrt(dsim_optim_grad_sqsum(opt->averaged, n));
    return DSIM_OK;
}

/* Keras 3's Lion, one element at a time (its sign takes no vector): the
 * betas cast to float, 1 - beta in float, TF's sign (NaN stays NaN). */
static void optim_lion(float *p, float *m, const float *g, size_t n, float lr, float b1, float b2)
{
    const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
    for (size_t k = 0; k < n; k++) {
        float c = m[k] * b1 + g[k] * omb1;
        float sign = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c; /* +-0 or NaN as is */
        p[k] -= lr * sign;
        m[k] = m[k] * b2 + g[k] * omb2;
    }
}

/* Keras 3's Lamb on the variables [a, a + len) of this optimizer's
 * parameters: the moments and the update u (into u[0..len): element-wise
 * float, the kernels' lamb_u), the norms of the variable and of u (double
 * sums in index order), then w -= (r * lr) * u. */
static void optim_lamb_var(float *p, float *m, float *v, const float *g, float *u, size_t len,
                           float lr, float omb1, float omb2, float c1, float c2, float eps)
{
    kern_get()->lamb_u(m, v, g, u, len, omb1, omb2, c1, c2, eps);
    double ww = 0, uu = 0;
    for (size_t k = 0; k < len; k++) {
        ww += (double)p[k] * (double)p[k];
        uu += (double)u[k] * (double)u[k];
    }
    float wn = sqrtf((float)ww), un = sqrtf((float)uu);
    float r = wn > 0.0f ? (un > 0.0f ? wn / un : 1.0f) : 1.0f;
    float rl = r * lr;
    for (size_t k = 0; k < len; k++)
        p[k] -= rl * u[k];
}

/* The spec's variables that this optimizer's parameters hold, as offsets
 * into them (at[k], len[k], *nv of them): placed at the part's offset
 * (dsim_optim_set_part); the whole buffer where the spec names none.
 * DSIM_EINVAL where the variables do not add up to the model, DSIM_ENOTSUP
 * where the part cuts one (`what` needs whole variables). */
static dsim_err optim_var_spans(const dsim_optim *opt, size_t n, const char *what, size_t *at,
                                size_t *len, size_t *nv)
{
    const dsim_optim_spec *s = &opt->spec;
    size_t lo = opt->part_of ? opt->part_off : 0, model = opt->part_of ? opt->part_of : n;
    size_t vars = s->n_vars ? s->n_vars : 1, sum = 0, off = 0;
    for (size_t k = 0; k < vars; k++)
        sum += s->n_vars ? s->var_len[k] : model;
    if (sum != model)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: the spec's %zu variables hold %zu parameters, the model "
                        "%zu: var_len must be the model's variables (dsim_model_vars)",
                        optim_kind_names[s->kind], vars, sum, model);
    *nv = 0;
    for (size_t k = 0; k < vars; off += s->n_vars ? s->var_len[k] : model, k++) {
        size_t l = s->n_vars ? s->var_len[k] : model;
        if (off + l <= lo || off >= lo + n)
            continue; /* not this part's */
        if (off < lo || off + l > lo + n)
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "optimizer %s: the part of parameters %zu..%zu cuts variable %zu "
                            "(parameters %zu..%zu): %s needs the variable's whole norm; give "
                            "each optimizer of a part whole variables",
                            optim_kind_names[s->kind], lo, lo + n - 1, k, off, off + l - 1, what);
        at[*nv] = off - lo;
        len[(*nv)++] = l;
    }
    return DSIM_OK;
}

/* LAMB over the optimizer's parameters, variable by variable. */
static dsim_err optim_lamb(dsim_optim *opt, float *p, const float *g, size_t n, float lr)
{
    const dsim_optim_spec *s = &opt->spec;
    size_t at[DSIM_OPTIM_MAX_VARS], len[DSIM_OPTIM_MAX_VARS], nv;
    DSIM_CHECK(optim_var_spans(opt, n, "LAMB's trust ratio", at, len, &nv));
    if (!opt->upd && !(opt->upd = malloc(opt->n * sizeof(float) + 1)))
        return DSIM_ERR(DSIM_ENOMEM, -1, "optimizer lamb: cannot allocate its update (%zu)",
                        opt->n);
    const float t = (float)(opt->step + 1);
    const float c1 = 1.0f - powf((float)s->beta1, t), c2 = 1.0f - powf((float)s->beta2, t);
    const float omb1 = (float)(1.0 - s->beta1), omb2 = (float)(1.0 - s->beta2);
    for (size_t k = 0; k < nv; k++)
        optim_lamb_var(p + at[k], opt->state + at[k], opt->state + n + at[k], g + at[k],
                       opt->upd + at[k], len[k], lr, omb1, omb2, c1, c2, (float)s->epsilon);
    return DSIM_OK;
}

/* Keras 3's Nadam: u_product, the running product of its momentum schedule
 * u(j) = beta1 * (1 - 0.5 * 0.96^j) over the update steps before step s
 * (0-based; j = s' + 1 for each update step s' < s: every step, or the last
 * of each accumulation), in float as Keras multiplies it: (u * beta1) * (1 -
 * 0.5 * 0.96^j). A function of the step count alone, so that a restored or
 * replayed optimizer (dsim_optim_set_state) has it without a slot of its
 * own: kept where it was, advanced from there, made anew from step 0 where
 * the step went back. */
static float optim_nadam_uprod(dsim_optim *opt, uint64_t s)
{
    const float b1 = (float)opt->spec.beta1;
    const int k = optim_accum(&opt->spec);
    if (opt->nadam_at > s) {
        opt->nadam_u = 1.0f;
        opt->nadam_at = 0;
    }
    for (uint64_t j = opt->nadam_at; j < s; j++)
        if (!k || (j + 1) % (uint64_t)k == 0)
            opt->nadam_u = (opt->nadam_u * b1) * (1.0f - 0.5f * powf(0.96f, (float)(j + 1)));
    opt->nadam_at = s;
    return opt->nadam_u;
}

/* Keras 3's Nadam update at step t = s + 1 (update_step, in float32 as its
 * ops compute it, operand for operand). */
static void optim_nadam(dsim_optim *opt, float *p, const float *g, size_t n, float lr)
{
    const dsim_optim_spec *s = &opt->spec;
    const float b1 = (float)s->beta1, b2 = (float)s->beta2, eps = (float)s->epsilon;
    const float t = (float)(opt->step + 1), t1 = (float)(opt->step + 2);
    const float ut = b1 * (1.0f - 0.5f * powf(0.96f, t));
    const float ut1 = b1 * (1.0f - 0.5f * powf(0.96f, t1));
    /* Keras multiplies this step's u into u_product before the update */
    const float upt = optim_nadam_uprod(opt, opt->step + 1);
    const float upt1 = upt * ut1;
    const kern_nadam_k c = {.lr = lr,
                            .omb1 = 1.0f - b1,
                            .omb2 = 1.0f - b2,
                            .ut1 = ut1,
                            .c1 = 1.0f - upt1,
                            .omut = 1.0f - ut,
                            .c0 = 1.0f - upt,
                            .c2 = 1.0f - powf(b2, t),
                            .eps = eps};
    kern_get()->nadam(p, opt->state, opt->state + n, g, n, &c);
}

static dsim_err optim_apply(dsim_optim *opt, float *params, const float *grad, size_t n,
                            double global_norm, int whole)
{
    if (!opt || !params || !grad)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_optim_apply: NULL argument");
    if (n != opt->n)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_optim_apply: %zu parameters given to an optimizer created for %zu", n,
                        opt->n);
    const dsim_optim_spec *s = &opt->spec;
    optim_seen *seen = &optim_seen_now;
    if (s->global_clipnorm > 0.0) {
        seen->norm = global_norm;
        seen->n = OPTIM_SEEN_GLOBAL;
        seen->want = 1;
    } else if (seen->want) {
        seen->norm = sqrt(dsim_optim_grad_sqsum(grad, n));
        seen->n = n;
    }
    optim_seen_note(seen, opt, grad, n);
    if (optim_accum(s)) {
        DSIM_CHECK(optim_accumulate(opt, &grad, n, &global_norm, whole));
        if (!grad) {
            opt->step++; /* accumulated: the parameters stay */
            return DSIM_OK;
        }
        if (s->global_clipnorm > 0.0)
            seen->norm = global_norm; /* the clip's: the accumulated gradient's */
    }
    DSIM_CHECK(optim_clip(opt, grad, n, global_norm, &grad));
    /* a schedule's rate at this step (Keras: the schedule of iterations
     * before this update), or the spec's */
    const int sched = s->schedule.kind != DSIM_LR_CONSTANT;
    const float lr = sched ? dsim_optim_lr_at(s, opt->step) : (float)s->lr;
    if (s->weight_decay > 0.0) {
        /* Keras's _apply_weight_decay: variable - variable * wd * lr */
        const float wd = (float)s->weight_decay;
        for (size_t k = 0; k < n; k++)
            params[k] = params[k] - params[k] * wd * lr;
    }
    const kern_ops *kk = kern_get();
    switch (s->kind) {
    case DSIM_OPTIM_SGD:
        if (s->momentum > 0.0)
            kk->keras_momentum(params, opt->state, grad, n, lr, (float)s->momentum, s->nesterov);
        else
            kk->sgd(params, grad, n, lr);
        break;
    case DSIM_OPTIM_MOMENTUM:
        kk->momentum(params, opt->state, grad, n, lr, (float)s->momentum, s->nesterov);
        break;
    case DSIM_OPTIM_ADAM: {
        double t = (double)(opt->step + 1);
        double b1p = pow(s->beta1, t), b2p = pow(s->beta2, t);
        const float alpha = (float)((sched ? (double)lr : s->lr) * sqrt(1.0 - b2p) / (1.0 - b1p));
        if (s->amsgrad)
            optim_amsgrad(params, opt->state, opt->state + n, opt->state + 2 * n, grad, n, alpha,
                          (float)(1.0 - s->beta1), (float)(1.0 - s->beta2), (float)s->epsilon);
        else
            kk->adam(params, opt->state, opt->state + n, grad, n, alpha, (float)(1.0 - s->beta1),
                     (float)(1.0 - s->beta2), (float)s->epsilon);
        break;
    }
    case DSIM_OPTIM_ADAMAX: {
        const float omb1p = (float)(1.0 - pow(s->beta1, (double)(opt->step + 1)));
        optim_adamax(params, opt->state, opt->state + n, grad, n, lr, (float)(1.0 - s->beta1),
                     (float)s->beta2, omb1p, (float)s->epsilon);
        break;
    }
    case DSIM_OPTIM_RMSPROP: {
        /* Keras: rho and 1 - rho Python floats, cast to float32 */
        float *mom = s->momentum > 0.0 ? opt->state + n : NULL;
        float *avg = s->centered ? opt->state + (mom ? 2 : 1) * n : NULL;
        kk->rmsprop(params, opt->state, mom, avg, grad, n, lr, (float)s->rho, (float)(1.0 - s->rho),
                    (float)s->momentum, (float)s->epsilon);
        break;
    }
    case DSIM_OPTIM_ADAGRAD:
        kk->adagrad(params, opt->state, grad, n, lr, (float)s->epsilon);
        break;
    case DSIM_OPTIM_LION:
        optim_lion(params, opt->state, grad, n, lr, (float)s->beta1, (float)s->beta2);
        break;
    case DSIM_OPTIM_LAMB:
        DSIM_CHECK(optim_lamb(opt, params, grad, n, lr));
        break;
    case DSIM_OPTIM_NADAM:
        optim_nadam(opt, params, grad, n, lr);
        break;
    case DSIM_OPTIM_ADADELTA: /* Keras: rho and 1 - rho Python floats, cast to float32 */
        kk->adadelta(params, opt->state, opt->state + n, grad, n, lr, (float)s->rho,
                     (float)(1.0 - s->rho), (float)s->epsilon);
        break;
    default:
        return DSIM_ERR(DSIM_EINVAL, -1, "optimizer kind %d is not valid", (int)s->kind);
    }
    opt->step++;
    return DSIM_OK;
}

const dsim_optim_spec *dsim_optim_spec_of(const dsim_optim *opt)
{
    return opt ? &opt->spec : NULL;
}

size_t dsim_optim_num_params(const dsim_optim *opt)
{
    return opt ? opt->n : 0;
}

void dsim_optim_skip(dsim_optim *opt)
{
    if (opt)
        opt->step++;
}

uint64_t dsim_optim_step(const dsim_optim *opt)
{
    return opt ? opt->step : 0;
}

size_t dsim_optim_state_len(const dsim_optim *opt)
{
    return opt ? opt->state_len : 0;
}

const float *dsim_optim_state(const dsim_optim *opt)
{
    return opt ? opt->state : NULL;
}

dsim_err dsim_optim_set_state(dsim_optim *opt, const float *state, size_t len, uint64_t step)
{
    if (!opt)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_optim_set_state: opt is NULL");
    if (len != opt->state_len)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "optimizer %s: state of %zu floats given, %zu expected (%zu parameters)",
                        optim_kind_names[opt->spec.kind], len, opt->state_len, opt->n);
    if (len && !state)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_optim_set_state: state is NULL");
    if (len)
        memcpy(opt->state, state, len * sizeof(float));
    opt->step = step;
    return DSIM_OK;
}

dsim_err dsim_optim_set_part(dsim_optim *opt, size_t offset, size_t model_params)
{
    if (!opt)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_optim_set_part: NULL optimizer");
    if (model_params == 0 || offset > model_params || opt->n > model_params - offset)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_optim_set_part: parameters [%zu, %zu) are not a part of a model "
                        "of %zu (the optimizer updates %zu; give its first parameter's index "
                        "in the model and the model's dsim_replica_ctx.n_params)",
                        offset, offset + opt->n, model_params, opt->n);
    opt->part_off = offset;
    opt->part_of = model_params;
    return DSIM_OK;
}

void dsim_optim_reset(dsim_optim *opt)
{
    if (!opt)
        return;
    dsim_optim_init_state(&opt->spec, opt->n, opt->state);
    opt->step = 0;
}
