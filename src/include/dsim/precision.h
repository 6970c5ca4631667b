/* Mixed precision: Keras's dtype policies and its dynamic loss scaling
 * (tf.keras.mixed_precision).
 *
 * A policy says in which dtype a model computes while its variables stay
 * float32 (dsim_model_loss_grad_mixed in dsim/model.h says exactly where it
 * rounds):
 *   float32         everything in float32: dsim's plain numerics;
 *   mixed_float16   compute in IEEE half, with dynamic loss scaling (Keras
 *                   wraps the optimizer in a LossScaleOptimizer);
 *   mixed_bfloat16  compute in bfloat16, without loss scaling (bfloat16 has
 *                   float32's range).
 *
 * Dynamic loss scaling (Keras's LossScaleOptimizer with its defaults): the
 * loss is multiplied by the loss scale S before the backward pass, so that
 * small gradients do not underflow in float16, and each replica's gradient
 * is divided by S before the gradients are aggregated. After aggregation
 * (the all-reduce) the gradient is tested: all finite, the update is
 * applied and, on the 2000th finite step in a row, S doubles; any inf or
 * NaN, the update is skipped (the optimizer's iterations still advance) and
 * S halves, never below 1. S starts at 2^15. Keras aggregates before it
 * tests "so that any NaN or Inf gradients are propagated to each replica":
 * every replica tests the same bits and all skip together. A strategy that
 * tests its own local gradient instead lets replicas disagree, and
 * gradient_consistency says so.
 *
 * Each replica holds its loss scale in dsim_replica_ctx.loss_scale
 * (dsim/spi/strategy.h); the driver scales the loss with it and unscales
 * the gradient before apply_gradients, the strategy updates it there
 * (dsim_loss_scale_update, or its own rules), and the driver records every
 * replica's scale and skip decision after every step. */
#ifndef DSIM_PRECISION_H
#define DSIM_PRECISION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/dtype.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_precision_policy {
    DSIM_POLICY_DEFAULT = 0, /* not set: float32 */
    DSIM_POLICY_FLOAT32,
    DSIM_POLICY_MIXED_FLOAT16,
    DSIM_POLICY_MIXED_BFLOAT16,
    DSIM_POLICY_COUNT
} dsim_precision_policy;

/* "default", "float32", "mixed_float16", "mixed_bfloat16" ("?" otherwise). */
DSIM_API const char *dsim_precision_policy_name(dsim_precision_policy p);
/* Parses those names; DSIM_EINVAL listing them for anything else. */
DSIM_API dsim_err dsim_precision_policy_parse(const char *s, dsim_precision_policy *out);
/* The compute dtype: DSIM_F16, DSIM_BF16, else DSIM_F32. */
DSIM_API dsim_dtype dsim_precision_compute_dtype(dsim_precision_policy p);
/* A float dtype as the scenario names it: "float32", "float16",
 * "bfloat16", "float64" (dsim_dtype_name otherwise). */
DSIM_API const char *dsim_precision_dtype_name(dsim_dtype t);
/* 1 for mixed_float16, the policy Keras scales the loss for. */
DSIM_API int dsim_precision_scales_loss(dsim_precision_policy p);

/* Keras's defaults (LossScaleOptimizer(dynamic=True)). */
#define DSIM_LOSS_SCALE_INITIAL      32768.0f /* 2^15 */
#define DSIM_LOSS_SCALE_GROWTH_STEPS 2000u
#define DSIM_LOSS_SCALE_MULTIPLIER   2.0f

/* One replica's loss scale (Keras's _DynamicLossScaleState). */
typedef struct dsim_loss_scale {
    bool dynamic;          /* false: a fixed scale of 1 that never skips (float32,
                              mixed_bfloat16) */
    float scale;           /* S: this step's gradients were computed with it; after
                              the update, the next step's */
    uint32_t counter;      /* finite steps in a row since S last changed */
    uint32_t growth_steps; /* S doubles on this many finite steps in a row */
    float multiplier;      /* by which S grows and shrinks */
    bool skipped;          /* this step's update was skipped (the driver clears it
                              before apply_gradients; the strategy sets it) */
    uint64_t skips;        /* updates skipped so far in this run */
    bool recorded;         /* dsim_loss_scale_record was called this step (the driver
                              clears it before apply_gradients and, under a dynamic
                              scale, fails a step whose strategy never called it) */
} dsim_loss_scale;

/* Keras's initial state for the policy: dynamic from 2^15 for
 * mixed_float16, else fixed at 1. */
DSIM_API void dsim_loss_scale_init(dsim_loss_scale *ls, dsim_precision_policy p);

/* Keras's update after aggregation: `finite` says whether every value of
 * the aggregated gradient is finite. Finite: counter + 1, and when it
 * reaches growth_steps S *= multiplier (kept only if finite) and counter 0;
 * not finite: S = max(S / multiplier, 1), counter 0, skipped set and
 * skips + 1. Returns whether to apply the update (always true for a fixed
 * scale: Keras applies whatever a fixed scale gives). */
DSIM_API bool dsim_loss_scale_record(dsim_loss_scale *ls, bool finite);

/* 1 if every one of the n values is finite. */
DSIM_API bool dsim_all_finite(const float *v, size_t n);

#ifdef __cplusplus
}
#endif
#endif
