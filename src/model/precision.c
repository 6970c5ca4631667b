/* Mixed precision: the policies' names and dtypes, and Keras's dynamic loss
 * scaling (dsim/precision.h says what each does). */
#include <math.h>
#include <string.h>

#include "dsim/precision.h"

static const char *const precision_names[DSIM_POLICY_COUNT] = {
    [DSIM_POLICY_DEFAULT] = "default",
    [DSIM_POLICY_FLOAT32] = "float32",
    [DSIM_POLICY_MIXED_FLOAT16] = "mixed_float16",
    [DSIM_POLICY_MIXED_BFLOAT16] = "mixed_bfloat16",
};

const char *dsim_precision_policy_name(dsim_precision_policy p)
{
    return (int)p >= 0 && p < DSIM_POLICY_COUNT ? precision_names[p] : "?";
}

dsim_err dsim_precision_policy_parse(const char *s, dsim_precision_policy *out)
{
    for (int p = 0; s && p < DSIM_POLICY_COUNT; p++) {
        if (strcmp(s, precision_names[p]) == 0) {
            *out = (dsim_precision_policy)p;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "'%s' is not a mixed-precision policy; accepted: float32, mixed_float16, "
                    "mixed_bfloat16 (Keras's names)",
                    s ? s : "(null)");
}

dsim_dtype dsim_precision_compute_dtype(dsim_precision_policy p)
{
    switch (p) {
    case DSIM_POLICY_MIXED_FLOAT16:
        return DSIM_F16;
    case DSIM_POLICY_MIXED_BFLOAT16:
        return DSIM_BF16;
    case DSIM_POLICY_DEFAULT:
    case DSIM_POLICY_FLOAT32:
    case DSIM_POLICY_COUNT:
        break;
    }
    return DSIM_F32;
}

const char *dsim_precision_dtype_name(dsim_dtype t)
{
    switch (t) {
    case DSIM_F32:
        return "float32";
    case DSIM_F16:
        return "float16";
    case DSIM_BF16:
        return "bfloat16";
    case DSIM_F64:
        return "float64";
    case DSIM_I32:
    case DSIM_I64:
    case DSIM_DTYPE_COUNT:
        break;
    }
    return dsim_dtype_name(t);
}

int dsim_precision_scales_loss(dsim_precision_policy p)
{
    return p == DSIM_POLICY_MIXED_FLOAT16;
}

void dsim_loss_scale_init(dsim_loss_scale *ls, dsim_precision_policy p)
{
    memset(ls, 0, sizeof *ls);
    ls->dynamic = dsim_precision_scales_loss(p) != 0;
    ls->scale = ls->dynamic ? DSIM_LOSS_SCALE_INITIAL : 1.0f;
    ls->growth_steps = DSIM_LOSS_SCALE_GROWTH_STEPS;
    ls->multiplier = DSIM_LOSS_SCALE_MULTIPLIER;
}

bool dsim_loss_scale_record(dsim_loss_scale *ls, bool finite)
{
    ls->recorded = true;
    if (!ls->dynamic)
        return true;
    if (finite) {
        if (++ls->counter >= ls->growth_steps) {
            float grown = ls->scale * ls->multiplier;
            /* Keras keeps the old scale when the new one is not finite. */
            if (isfinite(grown))
                ls->scale = grown;
            ls->counter = 0;
        }
        return true;
    }
    float shrunk = ls->scale / ls->multiplier;
    ls->scale = shrunk < 1.0f ? 1.0f : shrunk;
    ls->counter = 0;
    ls->skipped = true;
    ls->skips++;
    return false;
}

bool dsim_all_finite(const float *v, size_t n)
{
    /* x - x is 0 for a finite x and NaN for inf or NaN: one pass, no branch. */
    float acc = 0.0f;
    for (size_t i = 0; i < n; i++)
        acc += v[i] - v[i];
    return acc == 0.0f;
}
