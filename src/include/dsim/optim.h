/* Optimizers: SGD, momentum, Adam (and AMSGrad), Adamax, Nadam, RMSprop,
 * Adagrad, Adadelta, Lion and LAMB, with TensorFlow's
 * (Keras's) update rules.
 *
 * Each replica owns one dsim_optim for its own copy of the parameters; after
 * the gradients are all-reduced every replica applies the same update and so
 * keeps the same bits. The per-parameter state (TF's "slots") is one
 * contiguous float buffer, so that a checkpoint saves it with one write.
 *
 * Update rules (g the gradient, t the step counting from 1), in float as
 * TF's kernels compute them:
 *   sgd:       w -= lr * g                                  (Keras's SGD)
 *              momentum > 0: v = v * momentum - g * lr, w += v; nesterov:
 *              w += v * momentum - g * lr (tf.keras's and Keras 3's
 *              SGD(momentum=): the velocity holds each step's own rate)
 *   momentum:  accum = momentum * accum + g   (TF1's MomentumOptimizer,
 *              w -= lr * accum                 ApplyMomentum: the rate of
 *              nesterov: w -= lr * g + lr * momentum * accum    this step
 *              scales the whole accumulated sum; under a constant rate
 *              the two agree to float rounding, under a schedule not)
 *   adam:      alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)   (Keras Adam)
 *              m += (g - m) * (1 - beta1)
 *              v += (g^2 - v) * (1 - beta2)
 *              w -= m * alpha / (sqrt(v) + epsilon)
 *              amsgrad: vhat = max(vhat, v), w -= m * alpha / (sqrt(vhat) +
 *              epsilon) (Keras Adam(amsgrad=True); max keeps a NaN)
 *   adamax:    m += (g - m) * (1 - beta1)                     (Keras 3 Adamax)
 *              u = max(beta2 * u, |g|)
 *              w -= (lr * m) / ((1 - beta1^t) * (u + epsilon))
 *   rmsprop:   v = rho * v + (1 - rho) * g^2                  (Keras 3 RMSprop)
 *              centered: a = rho * a + (1 - rho) * g, d = v - a^2 + epsilon;
 *              else d = v + epsilon
 *              inc = lr * g / sqrt(d)
 *              momentum > 0: mom = momentum * mom + inc, w -= mom; else w -= inc
 *   adagrad:   acc += g^2                                     (Keras 3 Adagrad)
 *              w -= lr * g / sqrt(acc + epsilon)
 *              (acc starts at initial_accumulator_value, not 0)
 *   lion:      c = m * beta1 + g * (1 - beta1)               (Keras 3 Lion)
 *              w -= lr * sign(c)          (sign: -1, 0 or 1; NaN stays NaN)
 *              m = m * beta2 + g * (1 - beta2)
 *              (beta1, beta2 cast to float first, 1 - beta in float)
 *   lamb:      m += (g - m) * (1 - beta1)                     (Keras 3 Lamb)
 *              v += (g^2 - v) * (1 - beta2)
 *              u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
 *              per variable (dsim_optim_spec.var_len): r = |w| / |u| where
 *              both norms are > 0, else 1 (|.| the Euclidean norm over the
 *              variable, summed in double and rounded to float);
 *              w -= r * lr * u
 *              (beta^t in float, as Keras's ops.power of float32 values)
 *              An optimizer of a part (dsim_optim_set_part) must hold whole
 *              variables: one that cuts a variable cannot compute its norm,
 *              and its update fails (DSIM_ENOTSUP, naming the variable).
 *   nadam:     u(j) = beta1 * (1 - 0.5 * 0.96^j)             (Keras 3 Nadam)
 *              P = u_product: (P * beta1) * (1 - 0.5 * 0.96^j) over the
 *              update steps j = 1 .. t (this one's included)
 *              m += (g - m) * (1 - beta1)
 *              v += (g^2 - v) * (1 - beta2)
 *              mh = (u(t+1) * m) / (1 - P * u(t+1)) + ((1 - u(t)) * g) / (1 - P)
 *              w -= (mh * lr) / (sqrt(v / (1 - beta2^t)) + epsilon)
 *              (all in float, the betas cast first, as Keras's ops; P is a
 *              function of the step count, so it needs no slot: a step
 *              skipped under a dynamic loss scale counts in it, as in t)
 *   adadelta:  ag = rho * ag + (1 - rho) * g^2              (Keras 3 Adadelta)
 *              d = -((sqrt(ad + epsilon) * g) / sqrt(ag + epsilon))
 *              ad = rho * ad + (1 - rho) * d^2
 *              w += lr * d
 * alpha and Adamax's 1 - beta1^t are computed in double and rounded to float
 * once per step; rho,
 * 1 - rho, momentum and epsilon are rounded to float once, as Keras casts
 * its Python floats to the variable's dtype.
 *
 * Gradient clipping (Keras's optimizer arguments clipvalue, global_clipnorm
 * and clipnorm; at most one set, 0 = off) changes the gradient before
 * the update, as Keras 3 (and tf.keras from 2.11) do in apply_gradients:
 * under a distribution strategy after the gradients are aggregated, so a
 * synchronous job clips the all-reduced gradient, what one device computes
 * on the global batch:
 *   clipvalue c:        g = min(max(g, -c), c), element by element (float)
 *   global_clipnorm c:  n = sqrt(sum of g^2 over EVERY parameter of the
 *                       model); where n > c, g = g * scale with scale = c / n
 *                       (Keras's c * min(1/n, 1/c)) computed in double and
 *                       rounded to float once; n <= c leaves g as it is; a
 *                       norm that is not finite makes g NaN, as in Keras.
 *                       The sum is in double, as 8 interleaved partial sums
 *                       (index i to sum i mod 8) combined by the model
 *                       kernels' fixed tree (dsim_optim_grad_sqsum).
 *   clipnorm c:         per variable (dsim_optim_spec.var_len, as LAMB's):
 *                       n = sqrt(sum of g^2 over the variable), summed in
 *                       double and rounded to float (0 where the sum is 0,
 *                       NaN where it is NaN); g = (g * c) / max(n, c) in
 *                       float, as TF's clip_by_norm. An optimizer of a part
 *                       that cuts a variable fails (DSIM_ENOTSUP).
 * Weight decay (Keras's weight_decay, decoupled as in AdamW; 0 = off), after
 * the clip and before the update, on every parameter (biases included, as
 * Keras without exclude_from_weight_decay): w = w - (w * weight_decay) * lr,
 * in float. Element-wise, so a part of the parameters takes it alike; a
 * step skipped under a dynamic loss scale skips it too.
 *
 * A strategy that applies the optimizer to a part of the parameters (a
 * sharded optimizer, a parameter server's shard) must clip by the norm of
 * the whole gradient: dsim_optim_apply_norm, with the norm summed over the
 * parts; dsim_optim_apply clips by the norm of what it is given.
 *
 * Slot layout: sgd none, with momentum > 0 [velocity: n]; momentum
 * [accum: n]; adam [m: n][v: n], with amsgrad then [vhat: n]; adamax
 * [m: n][u: n]; rmsprop [velocity: n], then [momentum: n]
 * when momentum > 0, then [average gradient: n] when centered (Keras's
 * order); adagrad [accumulator: n]; lion [momentum: n]; lamb and nadam
 * [m: n][v: n]; adadelta [accumulated_grad: n][accumulated_delta_var: n]; with
 * gradient_accumulation_steps > 1, one more slot at the end: [acc: n].
 * Every slot starts at 0 but Adagrad's accumulator, which starts at
 * initial_accumulator_value (dsim_optim_init_state). */
#ifndef DSIM_OPTIM_H
#define DSIM_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most variables a spec names (dsim_optim_spec.var_len; the model's
 * DSIM_MODEL_MAX_VARS). */
#define DSIM_OPTIM_MAX_VARS 8

typedef enum dsim_optim_kind {
    DSIM_OPTIM_SGD = 0,
    DSIM_OPTIM_MOMENTUM,
    DSIM_OPTIM_ADAM,
    DSIM_OPTIM_RMSPROP,
    DSIM_OPTIM_ADAGRAD,
    DSIM_OPTIM_LION,
    DSIM_OPTIM_ADAMAX,
    DSIM_OPTIM_LAMB,
    DSIM_OPTIM_NADAM,    /* appended (soname 9, after its first release) */
    DSIM_OPTIM_ADADELTA, /* appended (soname 9, after its first release) */
    DSIM_OPTIM_KIND_COUNT
} dsim_optim_kind;

/* Learning-rate schedules: Keras's keras.optimizers.schedules, the rate an
 * update uses as a function of the optimizer's step counter (the updates
 * and skipped steps before it, counting from 0: Keras's iterations), in
 * float32 as Keras computes them (s = step as float, lr0 = the spec's lr):
 *   constant:           lr0
 *   exponential_decay:  p = s / decay_steps (floor with staircase);
 *                       lr0 * decay_rate^p
 *   piecewise_constant: values[0] while step <= boundaries[0], values[i]
 *                       while boundaries[i-1] < step <= boundaries[i],
 *                       values[last] after the last boundary (lr0 unused)
 *   polynomial_decay:   s = min(s, decay_steps), or with cycle D =
 *                       decay_steps * ceil(s / decay_steps) (1 at step 0);
 *                       (lr0 - end_lr) * (1 - s / D)^power + end_lr
 *   inverse_time_decay: p = s / decay_steps (floor with staircase);
 *                       lr0 / (1 + decay_rate * p)
 *   cosine_decay:       without warmup: s = min(s, decay_steps),
 *                       lr0 * ((1 - alpha) * 0.5 * (1 + cos(pi * s /
 *                       decay_steps)) + alpha); with warmup (warmup = 1):
 *                       s = min(s, decay_steps + warmup_steps), while s <
 *                       warmup_steps (warmup_target - lr0) * (s /
 *                       warmup_steps) + lr0, then the decay of s -
 *                       warmup_steps from warmup_target instead of lr0.
 *   cosine_decay_restarts (SGDR; decay_steps is Keras's first_decay_steps,
 *                       T = t_mul, M = m_mul, a = float32(alpha)):
 *                       f = s / decay_steps; T == 1: i = floor(f), f -= i;
 *                       else i = floor(log(1 - f * (1 - T)) / log(T)),
 *                       f = (f - (1 - T^i) / (1 - T)) / T^i;
 *                       lr0 * ((1 - a) * (0.5 * M^i * (1 + cos(pi * f))) + a)
 * The rate scales weight decay as it scales the update (Keras). */
typedef enum dsim_lr_kind {
    DSIM_LR_CONSTANT = 0,
    DSIM_LR_EXPONENTIAL,
    DSIM_LR_PIECEWISE,
    DSIM_LR_POLYNOMIAL,
    DSIM_LR_INVERSE_TIME,
    DSIM_LR_COSINE,
    DSIM_LR_COSINE_RESTARTS,
    DSIM_LR_KIND_COUNT
} dsim_lr_kind;

#define DSIM_LR_MAX_VALUES 16 /* piecewise_constant: values, boundaries one fewer */

typedef struct dsim_lr_schedule {
    dsim_lr_kind kind;    /* DSIM_LR_CONSTANT (all zero): the spec's lr at every step */
    uint64_t decay_steps; /* > 0: exponential, polynomial, inverse_time, cosine; the first
                             period's (Keras's first_decay_steps) for cosine_restarts */
    double decay_rate;    /* exponential (> 0), inverse_time (>= 0) */
    int staircase;        /* exponential, inverse_time: 0 or 1 */
    double end_lr;        /* polynomial (Keras's default 0.0001), >= 0 */
    double power;         /* polynomial (Keras's default 1), > 0 */
    int cycle;            /* polynomial: 0 or 1 */
    double alpha;         /* cosine, cosine_restarts: the floor as a fraction, in [0, 1] */
    int warmup;           /* cosine: 1 warms up to warmup_target over warmup_steps */
    double warmup_target; /* cosine with warmup: > 0 */
    uint64_t warmup_steps;
    int n_values;                                /* piecewise: 2 .. DSIM_LR_MAX_VALUES */
    uint64_t boundaries[DSIM_LR_MAX_VALUES - 1]; /* strictly increasing */
    double values[DSIM_LR_MAX_VALUES];           /* each > 0 */
    /* cosine_decay_restarts (Keras's defaults 2 and 1; alpha above): each
     * period t_mul times the last one's steps (>= 1), its rate m_mul times
     * the last one's (> 0) */
    double t_mul, m_mul;
} dsim_lr_schedule;

typedef struct dsim_optim_spec {
    dsim_optim_kind kind;
    double lr;       /* > 0; a schedule's initial rate (unused by piecewise_constant) */
    double momentum; /* sgd, momentum, rmsprop: in [0, 1) (sgd, rmsprop: 0 = none) */
    int nesterov;    /* sgd, momentum: 0 or 1 */
    double beta1;    /* adam, adamax: in [0, 1); lion: in (0, 1] */
    double beta2;    /* adam, adamax, lion: in [0, 1) */
    double epsilon;  /* adam, adamax, rmsprop, adagrad: > 0 */
    /* Clipping (above): at most one of the two > 0; 0 = off. */
    double clipvalue;          /* > 0: every gradient element into [-clipvalue, clipvalue] */
    double global_clipnorm;    /* > 0: the whole gradient scaled to this norm at most */
    double weight_decay;       /* >= 0: w -= (w * weight_decay) * lr before the update */
    dsim_lr_schedule schedule; /* above; all zero: lr at every step */
    /* Keras 3's gradient_accumulation_steps (0 or 1: off; k > 1 up to
     * DSIM_OPTIM_MAX_ACCUMULATION): every apply counts a step; on steps
     * whose count (from 1) is not a multiple of k the gradient is added to
     * an accumulator (acc = g + acc, float) and the parameters stay; on the
     * k-th the update (clip, decay, rule) takes (g + acc) / k and the
     * accumulator is zeroed. The schedule and Adam's t count every step,
     * as Keras's iterations do. */
    int gradient_accumulation_steps;
    /* Appended (soname 7), so that the fields above keep their places. */
    double rho;                       /* rmsprop: in [0, 1) */
    int centered;                     /* rmsprop: 0 or 1 */
    double initial_accumulator_value; /* adagrad: >= 0 */
    /* Appended (soname 8). */
    int amsgrad; /* adam: 0 or 1 */
    /* Appended (soname 9): the model's variables as its parameter buffer
     * holds them, in order (a Dense layer's kernel, then its bias), their
     * lengths adding up to the model's parameters; n_vars 0: the buffer is
     * one variable. LAMB's trust ratio is a ratio of norms per variable;
     * the other kinds do not use them. dsim_train fills them from the
     * model (dsim_model_vars) for the strategies' optimizers. */
    size_t n_vars;
    size_t var_len[DSIM_OPTIM_MAX_VARS];
    /* > 0: Keras's clipnorm, each variable's gradient clipped by its own
     * norm (above); one of clipvalue, global_clipnorm and clipnorm at most */
    double clipnorm;
} dsim_optim_spec;

#define DSIM_OPTIM_MAX_ACCUMULATION 1000000

typedef struct dsim_optim dsim_optim;

/* "sgd", "momentum", "adam", "rmsprop", "adagrad", "lion", "adamax", "lamb",
 * "nadam", "adadelta". */
DSIM_API const char *dsim_optim_kind_name(dsim_optim_kind k);
DSIM_API dsim_err dsim_optim_kind_parse(const char *s, dsim_optim_kind *out);

/* "constant", "exponential_decay", "piecewise_constant", "polynomial_decay",
 * "inverse_time_decay", "cosine_decay", "cosine_decay_restarts" (Keras's
 * class names in snake case). */
DSIM_API const char *dsim_lr_kind_name(dsim_lr_kind k);
DSIM_API dsim_err dsim_lr_kind_parse(const char *s, dsim_lr_kind *out);

/* The learning rate an update at optimizer step `step` (counting from 0)
 * uses under spec: its schedule's value, rounded to float as the update
 * takes it; spec->lr without a schedule. The spec must be valid. */
DSIM_API float dsim_optim_lr_at(const dsim_optim_spec *spec, uint64_t step);

/* Keras' defaults for kind: sgd lr 0.01; momentum lr 0.01, momentum 0.9,
 * no nesterov; adam lr 0.001, beta1 0.9, beta2 0.999, epsilon 1e-7;
 * rmsprop lr 0.001, rho 0.9, momentum 0, epsilon 1e-7, not centered;
 * adagrad lr 0.001, initial_accumulator_value 0.1, epsilon 1e-7; lion lr
 * 0.001, beta1 0.9, beta2 0.99; adamax, lamb and nadam lr 0.001, beta1
 * 0.9, beta2 0.999, epsilon 1e-7; adadelta lr 0.001, rho 0.95, epsilon
 * 1e-7. */
DSIM_API void dsim_optim_spec_default(dsim_optim_spec *spec, dsim_optim_kind kind);
/* DSIM_OK, or DSIM_EINVAL naming the field and the accepted range. Fields a
 * kind does not use are not checked. */
DSIM_API dsim_err dsim_optim_validate(const dsim_optim_spec *spec);

/* An optimizer for n_params parameters, slots at their initial values
 * (dsim_optim_init_state), step 0. */
DSIM_API dsim_err dsim_optim_create(const dsim_optim_spec *spec, size_t n_params, dsim_optim **out);
DSIM_API void dsim_optim_destroy(dsim_optim *opt);

/* One update of params[0..n) with grad[0..n); n must be the n_params the
 * optimizer was created with. Advances the step counter by one. */
DSIM_API dsim_err dsim_optim_apply(dsim_optim *opt, float *params, const float *grad, size_t n);

/* dsim_optim_apply for an optimizer of a part of the model's parameters:
 * global_clipnorm clips by global_norm, the norm of the whole model's
 * gradient (sqrt of the sum of every part's dsim_optim_grad_sqsum), not by
 * the norm of grad[0..n). Without global_clipnorm, global_norm is not used
 * and this is dsim_optim_apply. With gradient_accumulation_steps > 1 the
 * clip's norm is the accumulated gradient's, which a part does not see:
 * the update step then fails (DSIM_ENOTSUP, naming the fix). */
DSIM_API dsim_err dsim_optim_apply_norm(dsim_optim *opt, float *params, const float *grad, size_t n,
                                        double global_norm);

/* The sum of grad[k]^2 over k < n in double, in a fixed order
 * (8 interleaved partial sums, the fixed tree): what global_clipnorm takes
 * the square root of. */
DSIM_API double dsim_optim_grad_sqsum(const float *grad, size_t n);

/* Says that opt (created for n parameters) updates parameters
 * [offset, offset + n) of a model of model_params: a strategy that shards
 * the optimizer's work (each replica updating its shard, as ZeRO does)
 * calls it once per optimizer. The updates are unchanged; what it gives is
 * the place of each dsim_optim_apply's gradient in the model's, so that
 * gradient_consistency can put the parts the replicas applied together and
 * compare them with one device's gradient (under adam, whose updates hide
 * a gradient's errors: docs/checks.md). DSIM_EINVAL when the part does
 * not lie inside the model. */
DSIM_API dsim_err dsim_optim_set_part(dsim_optim *opt, size_t offset, size_t model_params);

/* Whether the spec clips by the global norm (global_clipnorm > 0): a
 * strategy that applies the optimizer shard by shard must then compute the
 * global norm (dsim_optim_apply_norm). */
DSIM_API int dsim_optim_needs_global_norm(const dsim_optim_spec *spec);

/* A step without an update: the step counter advances, slots and
 * parameters stay. What Keras's LossScaleOptimizer does when it skips a
 * step whose gradient is not finite (its iterations still count it, so
 * Adam's bias correction moves on). */
DSIM_API void dsim_optim_skip(dsim_optim *opt);

DSIM_API const dsim_optim_spec *dsim_optim_spec_of(const dsim_optim *opt);
DSIM_API size_t dsim_optim_num_params(const dsim_optim *opt);
/* Updates applied so far (TF's `iterations`). */
DSIM_API uint64_t dsim_optim_step(const dsim_optim *opt);

/* Slot floats per parameter under spec (the layout above): 0 to 3, one
 * more with gradient accumulation. dsim_optim_state_len is this times the
 * optimizer's parameters. */
DSIM_API size_t dsim_optim_slots_per_param(const dsim_optim_spec *spec);
/* The slots of the update rule alone (the layout above, without gradient
 * accumulation's): 0 sgd (1 with momentum), 1 momentum, adagrad and lion,
 * 2 adam (3 with amsgrad) and adamax, 1 to 3 rmsprop. */
DSIM_API size_t dsim_optim_rule_slots(const dsim_optim_spec *spec);
/* Slot `slot` of the layout above under spec, as Keras names it: "m", "v",
 * "vhat" (adam), "m", "u" (adamax), "velocity", "momentum", "average
 * gradient" (rmsprop), "velocity" (sgd with momentum), "momentum" (lion),
 * "accumulator" (momentum, adagrad); "gradient accumulator" past the rule's
 * slots (gradient_accumulation_steps > 1). */
DSIM_API const char *dsim_optim_slot_name(const dsim_optim_spec *spec, size_t slot);
/* 1 where the update divides each gradient by the root of a running sum of
 * its squares (adam, rmsprop, adagrad), by a running maximum of its size
 * (adamax) or takes its sign (lion): a
 * near-zero gradient, whose last bits depend on summation order, moves its
 * variable by a sizeable step either way, so gradient_consistency judges
 * such updates by the gradients they applied (docs/checks.md); else 0. */
DSIM_API int dsim_optim_is_adaptive(const dsim_optim_spec *spec);
/* The initial slots of n_params parameters under spec, in the layout above,
 * into state[0 .. slots_per_param * n_params): 0, but Adagrad's accumulator
 * (initial_accumulator_value). What a fresh job's variables start with. */
DSIM_API void dsim_optim_init_state(const dsim_optim_spec *spec, size_t n_params, float *state);

/* The slot buffer (see the layout above) and its length in floats; NULL and
 * 0 for sgd without momentum. For checkpoints: save step + slots; restore
 * with set_state. */
DSIM_API size_t dsim_optim_state_len(const dsim_optim *opt);
DSIM_API const float *dsim_optim_state(const dsim_optim *opt);
/* Replaces the slots and the step counter; len must be
 * dsim_optim_state_len (state may be NULL when len is 0). */
DSIM_API dsim_err dsim_optim_set_state(dsim_optim *opt, const float *state, size_t len,
                                       uint64_t step);
/* Slots to their initial values (dsim_optim_init_state), step to 0. */
DSIM_API void dsim_optim_reset(dsim_optim *opt);

#ifdef __cplusplus
}
#endif
#endif
