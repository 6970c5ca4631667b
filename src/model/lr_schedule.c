/* Learning-rate schedules (dsim/optim.h): Keras's
 * keras.optimizers.schedules, computed in float32 as Keras computes them
 * for a float32 initial learning rate (the step cast to float32, every
 * operation in float32), so that an independent implementation lands on
 * the same rates to the last bit or within one rounding of pow and cos. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dsim/optim.h"
#include "model/optim_int.h"

static const char *const lr_kind_names[DSIM_LR_KIND_COUNT] = {
    "constant",           "exponential_decay", "piecewise_constant",   "polynomial_decay",
    "inverse_time_decay", "cosine_decay",      "cosine_decay_restarts"};

const char *dsim_lr_kind_name(dsim_lr_kind k)
{
    if ((unsigned)k >= DSIM_LR_KIND_COUNT)
        return "?";
    return lr_kind_names[k];
}

dsim_err dsim_lr_kind_parse(const char *s, dsim_lr_kind *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_lr_kind_parse: NULL argument");
    for (int k = 0; k < DSIM_LR_KIND_COUNT; k++)
        if (strcmp(s, lr_kind_names[k]) == 0) {
            *out = (dsim_lr_kind)k;
            return DSIM_OK;
        }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "unknown learning-rate schedule '%s': use constant, exponential_decay, "
                    "piecewise_constant, polynomial_decay, inverse_time_decay, cosine_decay or "
                    "cosine_decay_restarts",
                    s);
}

/* A rate the update can use: positive and finite in float. */
static int lr_usable(double v)
{
    return v > 0.0 && isfinite((float)v) && (float)v != 0.0f;
}

dsim_err optim_schedule_validate(const dsim_optim_spec *spec)
{
    const dsim_lr_schedule *s = &spec->schedule;
    if ((unsigned)s->kind >= DSIM_LR_KIND_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "schedule kind %d is not one of %s .. %s", (int)s->kind,
                        lr_kind_names[0], lr_kind_names[DSIM_LR_KIND_COUNT - 1]);
    const char *kind = lr_kind_names[s->kind];
    switch (s->kind) {
    case DSIM_LR_CONSTANT:
        return DSIM_OK;
    case DSIM_LR_PIECEWISE:
        if (s->n_values < 2 || s->n_values > DSIM_LR_MAX_VALUES)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule piecewise_constant: %d values; give 2 to %d, and one "
                            "boundary fewer",
                            s->n_values, DSIM_LR_MAX_VALUES);
        for (int i = 0; i < s->n_values; i++)
            if (!lr_usable(s->values[i]))
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "schedule piecewise_constant: values[%d] %g must be a positive "
                                "number representable in float",
                                i, s->values[i]);
        for (int i = 1; i + 1 < s->n_values; i++)
            if (s->boundaries[i] <= s->boundaries[i - 1])
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "schedule piecewise_constant: boundaries[%d] %" PRIu64
                                " must be above boundaries[%d] %" PRIu64 " (strictly increasing)",
                                i, s->boundaries[i], i - 1, s->boundaries[i - 1]);
        return DSIM_OK;
    default:
        break;
    }
    if (s->decay_steps == 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "schedule %s: decay_steps must be > 0 (Keras's check)",
                        kind);
    switch (s->kind) {
    case DSIM_LR_EXPONENTIAL:
        if (!lr_usable(s->decay_rate))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule exponential_decay: decay_rate %g must be a positive number "
                            "representable in float (0.96 decays by 4 %% every decay_steps)",
                            s->decay_rate);
        break;
    case DSIM_LR_INVERSE_TIME:
        if (!(s->decay_rate >= 0.0) || !isfinite((float)s->decay_rate))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule inverse_time_decay: decay_rate %g must be 0 or more",
                            s->decay_rate);
        break;
    case DSIM_LR_POLYNOMIAL:
        if (!(s->end_lr >= 0.0) || !isfinite((float)s->end_lr))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule polynomial_decay: end_learning_rate %g must be 0 or more",
                            s->end_lr);
        if (!lr_usable(s->power))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule polynomial_decay: power %g must be positive (1 is linear)",
                            s->power);
        break;
    case DSIM_LR_COSINE:
        if (!(s->alpha >= 0.0 && s->alpha <= 1.0))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule cosine_decay: alpha %g must be in [0, 1] (the floor as a "
                            "fraction of the rate decayed from)",
                            s->alpha);
        if (s->warmup && !lr_usable(s->warmup_target))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule cosine_decay: warmup_target %g must be a positive number "
                            "representable in float",
                            s->warmup_target);
        break;
    case DSIM_LR_COSINE_RESTARTS:
        if (!(s->alpha >= 0.0 && s->alpha <= 1.0))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule cosine_decay_restarts: alpha %g must be in [0, 1] (the "
                            "floor as a fraction of each period's rate)",
                            s->alpha);
        /* Keras does not check; periods that shrink run out, and its rate
         * is NaN after the last */
        if (!(s->t_mul >= 1.0) || !isfinite((float)s->t_mul))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule cosine_decay_restarts: t_mul %g must be 1 or more (each "
                            "period that many times the last one's steps; Keras uses 2; below 1 "
                            "the periods run out and Keras's rate is NaN after them)",
                            s->t_mul);
        if (!lr_usable(s->m_mul))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule cosine_decay_restarts: m_mul %g must be a positive number "
                            "representable in float (each period's rate that many times the "
                            "last one's; Keras uses 1)",
                            s->m_mul);
        if (s->warmup)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "schedule cosine_decay_restarts: Keras's restarts have no warmup; "
                            "use cosine_decay for one");
        break;
    default:
        break;
    }
    for (int f = 0; f < 3; f++) {
        int v = f == 0 ? s->staircase : f == 1 ? s->cycle : s->warmup;
        if (v != 0 && v != 1)
            return DSIM_ERR(DSIM_EINVAL, -1, "schedule %s: %s %d must be 0 or 1", kind,
                            f == 0   ? "staircase"
                            : f == 1 ? "cycle"
                                     : "warmup",
                            v);
    }
    return DSIM_OK;
}

/* cosine_decay's decay of float step s over d steps from rate `from` */
static float lr_cosine(float s, float d, float from, double alpha)
{
    const float pi = (float)M_PI;
    float frac = s / d;
    float cosine = 0.5f * (1.0f + cosf(pi * frac));
    float decayed = (float)(1.0 - alpha) * cosine + (float)alpha;
    return from * decayed;
}

float dsim_optim_lr_at(const dsim_optim_spec *spec, uint64_t step)
{
    if (!spec)
        return NAN;
    const dsim_lr_schedule *s = &spec->schedule;
    const float lr0 = (float)spec->lr, st = (float)step, ds = (float)s->decay_steps;
    switch (s->kind) {
    case DSIM_LR_EXPONENTIAL: {
        float p = st / ds;
        if (s->staircase)
            p = floorf(p);
        return lr0 * powf((float)s->decay_rate, p);
    }
    case DSIM_LR_PIECEWISE: {
        int i = 0;
        while (i + 1 < s->n_values && step > s->boundaries[i])
            i++;
        return (float)s->values[i];
    }
    case DSIM_LR_POLYNOMIAL: {
        const float end = (float)s->end_lr;
        float x = st, d = ds;
        if (s->cycle)
            d = ds * (step == 0 ? 1.0f : ceilf(st / ds));
        else
            x = fminf(st, ds);
        float p = x / d;
        return (lr0 - end) * powf(1.0f - p, (float)s->power) + end;
    }
    case DSIM_LR_INVERSE_TIME: {
        float p = st / ds;
        if (s->staircase)
            p = floorf(p);
        return lr0 / (1.0f + (float)s->decay_rate * p);
    }
    case DSIM_LR_COSINE_RESTARTS: {
        /* Keras's CosineDecayRestarts: alpha, t_mul and m_mul cast first */
        const float pi = (float)M_PI, a = (float)s->alpha, t = (float)s->t_mul, m = (float)s->m_mul;
        float f = st / ds, i;
        if (t == 1.0f) {
            i = floorf(f);
            f -= i;
        } else {
            i = floorf(logf(1.0f - f * (1.0f - t)) / logf(t));
            float sum_r = (1.0f - powf(t, i)) / (1.0f - t);
            f = (f - sum_r) / powf(t, i);
        }
        float cosine = 0.5f * powf(m, i) * (1.0f + cosf(pi * f));
        return lr0 * ((1.0f - a) * cosine + a);
    }
    case DSIM_LR_COSINE: {
        if (!s->warmup)
            return lr_cosine(fminf(st, ds), ds, lr0, s->alpha);
        const float target = (float)s->warmup_target, ws = (float)s->warmup_steps;
        float x = fminf(st, ds + ws);
        if (x < ws)
            return (target - lr0) * (x / ws) + lr0;
        return lr_cosine(x - ws, ds, target, s->alpha);
    }
    default:
        return lr0;
    }
}
