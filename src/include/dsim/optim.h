/* Optimizers: SGD, momentum and Adam, with TensorFlow's update rules.
 *
 * Each replica owns one dsim_optim for its own copy of the parameters; after
 * the gradients are all-reduced every replica applies the same update and so
 * keeps the same bits. The per-parameter state (TF's "slots") is one
 * contiguous float buffer, so that a checkpoint saves it with one write.
 *
 * Update rules (g the gradient, t the step counting from 1), in float as
 * TF's kernels compute them:
 *   sgd:       w -= lr * g
 *   momentum:  accum = momentum * accum + g                 (ApplyMomentum)
 *              w -= lr * accum
 *              nesterov: w -= lr * g + lr * momentum * accum
 *   adam:      alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)   (Keras Adam)
 *              m += (g - m) * (1 - beta1)
 *              v += (g^2 - v) * (1 - beta2)
 *              w -= m * alpha / (sqrt(v) + epsilon)
 * alpha is computed in double and rounded to float once per step.
 *
 * Slot layout: sgd none; momentum [accum: n]; adam [m: n][v: n]. */
#ifndef DSIM_OPTIM_H
#define DSIM_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_optim_kind {
    DSIM_OPTIM_SGD = 0,
    DSIM_OPTIM_MOMENTUM,
    DSIM_OPTIM_ADAM,
    DSIM_OPTIM_KIND_COUNT
} dsim_optim_kind;

typedef struct dsim_optim_spec {
    dsim_optim_kind kind;
    double lr;       /* > 0 */
    double momentum; /* momentum: in [0, 1) */
    int nesterov;    /* momentum: 0 or 1 */
    double beta1;    /* adam: in [0, 1) */
    double beta2;    /* adam: in [0, 1) */
    double epsilon;  /* adam: > 0 */
} dsim_optim_spec;

typedef struct dsim_optim dsim_optim;

/* "sgd", "momentum", "adam". */
DSIM_API const char *dsim_optim_kind_name(dsim_optim_kind k);
DSIM_API dsim_err dsim_optim_kind_parse(const char *s, dsim_optim_kind *out);

/* Keras' defaults for kind: sgd lr 0.01; momentum lr 0.01, momentum 0.9,
 * no nesterov; adam lr 0.001, beta1 0.9, beta2 0.999, epsilon 1e-7. */
DSIM_API void dsim_optim_spec_default(dsim_optim_spec *spec, dsim_optim_kind kind);
/* DSIM_OK, or DSIM_EINVAL naming the field and the accepted range. Fields a
 * kind does not use are not checked. */
DSIM_API dsim_err dsim_optim_validate(const dsim_optim_spec *spec);

/* An optimizer for n_params parameters, slots zero, step 0. */
DSIM_API dsim_err dsim_optim_create(const dsim_optim_spec *spec, size_t n_params, dsim_optim **out);
DSIM_API void dsim_optim_destroy(dsim_optim *opt);

/* One update of params[0..n) with grad[0..n); n must be the n_params the
 * optimizer was created with. Advances the step counter by one. */
DSIM_API dsim_err dsim_optim_apply(dsim_optim *opt, float *params, const float *grad, size_t n);

/* A step without an update: the step counter advances, slots and
 * parameters stay. What Keras's LossScaleOptimizer does when it skips a
 * step whose gradient is not finite (its iterations still count it, so
 * Adam's bias correction moves on). */
DSIM_API void dsim_optim_skip(dsim_optim *opt);

DSIM_API const dsim_optim_spec *dsim_optim_spec_of(const dsim_optim *opt);
DSIM_API size_t dsim_optim_num_params(const dsim_optim *opt);
/* Updates applied so far (TF's `iterations`). */
DSIM_API uint64_t dsim_optim_step(const dsim_optim *opt);

/* The slot buffer (see the layout above) and its length in floats; NULL and
 * 0 for sgd. For checkpoints: save step + slots; restore with set_state. */
DSIM_API size_t dsim_optim_state_len(const dsim_optim *opt);
DSIM_API const float *dsim_optim_state(const dsim_optim *opt);
/* Replaces the slots and the step counter; len must be
 * dsim_optim_state_len (state may be NULL when len is 0). */
DSIM_API dsim_err dsim_optim_set_state(dsim_optim *opt, const float *state, size_t len,
                                       uint64_t step);
/* Slots to zero, step to 0. */
DSIM_API void dsim_optim_reset(dsim_optim *opt);

#ifdef __cplusplus
}
#endif
#endif
