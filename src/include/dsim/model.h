/* Reference models: linear regression, softmax regression and a small MLP.
 *
 * These are the models that strategies train, so that the numerics of a
 * distributed run can be compared with a single-device run. They compute
 * in double with results fixed to the bit (see Numerics), on blocked,
 * vectorised kernels.
 *
 * Parameters. All parameters of a model live in ONE contiguous float (f32)
 * buffer, so that one all-reduce covers every gradient (TensorFlow's
 * gradient packing). Layer l (0 = closest to the input) holds its weight
 * matrix W_l, out_l x in_l, row-major (W_l[j][i] at w_off + j*in_l + i),
 * followed by its bias b_l (out_l values at b_off = w_off + out_l*in_l).
 * Layers follow each other: W1 b1 W2 b2 ... (see dsim_model_layout).
 *
 * Examples. x holds n examples, example-major: example e is
 * x[e*in_dim .. e*in_dim + in_dim). Targets y are example-major too, with
 * dsim_model_y_dim(spec) floats per example:
 *   - MSE (regression): out_dim target values;
 *   - cross-entropy (classification): ONE float holding the class index,
 *     an integer in [0, out_dim) (exact in float up to 2^24, the class
 *     limit). Keeping labels as floats lets a batch (x, y) travel as float
 *     buffers like everything else; a non-integer or out-of-range label is
 *     an error naming the example.
 *
 * Losses, per example (as Keras defines them):
 *   - MSE: mean over the outputs of (prediction - target)^2;
 *   - cross-entropy: -log softmax(logits)[label], computed as
 *     logsumexp(logits) - logits[label] with the maximum subtracted first.
 *
 * Numerics: parameters, inputs and gradients are float; everything in
 * between (activations, losses, the gradient sum over a batch) is double,
 * and the gradient is rounded to float once per call. A layer's output is
 * its bias plus a dot product taken as 8 partial sums (input i goes to sum
 * i mod 8, in input order) combined by the fixed tree
 * ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)); the gradient sums run
 * over the examples in example order, and a delta's sum over the outputs in
 * output order. Nothing is fused into a multiply-add. So the same call on
 * the same inputs gives the same bits on every machine, with every
 * compiler and build type, whichever kernels run (dsim_model_kernels) and
 * wherever the buffers lie, and an example's terms do not depend on the
 * others in its batch. */
#ifndef DSIM_MODEL_H
#define DSIM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_model_kind {
    DSIM_MODEL_LINEAR = 0, /* y = W x + b, MSE */
    DSIM_MODEL_SOFTMAX,    /* logits = W x + b, cross-entropy */
    DSIM_MODEL_MLP,        /* 1 or 2 ReLU hidden layers, then a linear output layer */
    DSIM_MODEL_PLUGIN,     /* a user's own model: spec.plugin (dsim/spi/model.h) */
    DSIM_MODEL_KIND_COUNT
} dsim_model_kind;

typedef enum dsim_loss {
    DSIM_LOSS_AUTO = 0, /* the kind's own loss: linear MSE, softmax and mlp cross-entropy */
    DSIM_LOSS_MSE,
    DSIM_LOSS_XENT, /* softmax cross-entropy with integer labels */
    DSIM_LOSS_COUNT
} dsim_loss;

#define DSIM_MODEL_MAX_HIDDEN 2
/* Upper bounds that keep every size computation far from overflow and class
 * indices exact in float. */
#define DSIM_MODEL_MAX_DIM    (1u << 24)
#define DSIM_MODEL_MAX_PARAMS ((size_t)1 << 30)

typedef struct dsim_model_spec {
    dsim_model_kind kind;
    dsim_loss loss;                       /* AUTO, or the kind's loss; an mlp may use either */
    size_t in_dim;                        /* features per example, >= 1 */
    size_t out_dim;                       /* outputs (MSE, >= 1) or classes (cross-entropy, >= 2) */
    size_t n_hidden;                      /* mlp: 1 or 2; linear and softmax: 0 */
    size_t hidden[DSIM_MODEL_MAX_HIDDEN]; /* widths of the hidden layers, >= 1 */
    /* kind DSIM_MODEL_PLUGIN: the model's ops table (dsim_model_load,
     * dsim/spi/model.h); loss must then be AUTO or the table's loss, and
     * n_hidden 0. NULL for the built-in kinds. */
    const struct dsim_model_ops *plugin;
} dsim_model_spec;

typedef struct dsim_model_layer {
    size_t in, out;      /* W is out x in, row-major */
    size_t w_off, b_off; /* offsets into the parameter buffer, in floats */
} dsim_model_layer;

typedef struct dsim_model_layout {
    size_t n_layers; /* n_hidden + 1 */
    size_t n_params; /* floats in the parameter (and gradient) buffer */
    dsim_model_layer layer[DSIM_MODEL_MAX_HIDDEN + 1];
} dsim_model_layout;

/* "linear", "softmax", "mlp", "plugin"; "mse", "xent" ("auto" for AUTO).
 * dsim_model_kind_parse accepts the three built-in kinds. */
DSIM_API const char *dsim_model_kind_name(dsim_model_kind k);
DSIM_API dsim_err dsim_model_kind_parse(const char *s, dsim_model_kind *out);
DSIM_API const char *dsim_loss_name(dsim_loss l);
/* Also accepts "cross_entropy" and "crossentropy" for XENT. */
DSIM_API dsim_err dsim_loss_parse(const char *s, dsim_loss *out);

/* DSIM_OK, or DSIM_EINVAL naming the field, its value and what is accepted. */
DSIM_API dsim_err dsim_model_validate(const dsim_model_spec *spec);
/* The loss the spec trains with (AUTO resolved); the spec must be valid. */
DSIM_API dsim_loss dsim_model_loss(const dsim_model_spec *spec);
/* Floats per example in a target buffer: out_dim for MSE, 1 for
 * cross-entropy; 0 for an invalid spec. */
DSIM_API size_t dsim_model_y_dim(const dsim_model_spec *spec);
/* Number of parameters; 0 for an invalid spec. */
DSIM_API size_t dsim_model_num_params(const dsim_model_spec *spec);
DSIM_API dsim_err dsim_model_layout_of(const dsim_model_spec *spec, dsim_model_layout *out);

/* The model's variables, in the parameter buffer's order, as messages name
 * them: each layer's kernel ("layer 2's kernel [64 x 10]", inputs x units as
 * Keras shapes it) then its bias ("layer 2's bias [10]"); a plugin lays its
 * parameters out itself, so its are up to DSIM_MODEL_MAX_VARS equal spans
 * ("parameters 0..8191"). dsim_train keeps a signature of each after every
 * step (dsim_train_result.var_sig), so that replicas that part are told
 * which variables part. Returns their number, 0 for a spec
 * dsim_model_validate refuses or a model without parameters. */
#define DSIM_MODEL_MAX_VARS 8
typedef struct dsim_model_var {
    size_t off, len; /* floats of the parameter buffer */
    /* Keras's shape: a kernel {inputs, units} (held units x inputs, row-major:
     * [i, u] at off + u * inputs + i), a bias {units, 0}; {0, 0} for a
     * plugin's span */
    size_t shape[2];
    char name[64];
} dsim_model_var;
/* Where parameter i (of the model whose variables are v[0..nv)) lies, for a
 * message: "layer 1's kernel [8 x 16] at [3, 5]", "layer 2's bias [4] at
 * [1]", "parameters 0..8191" for a plugin's span; "" when no variable holds
 * it. Returns buf. */
DSIM_API const char *dsim_model_var_where(const dsim_model_var *v, size_t nv, size_t i, char *buf,
                                          size_t cap);
DSIM_API size_t dsim_model_vars(const dsim_model_spec *spec,
                                dsim_model_var out[DSIM_MODEL_MAX_VARS]);

/* Fills params (dsim_model_num_params floats) as Keras' Dense does by
 * default: weights Glorot-uniform, U(-l, l) with l = sqrt(6/(in+out)),
 * drawn layer by layer in row-major order; biases zero. */
DSIM_API dsim_err dsim_model_init(const dsim_model_spec *spec, float *params, dsim_rng *rng);

/* For the n examples in (x, y): grad_accum[k] += scale * sum_e d loss_e / d
 * params[k], summed in double in example order, rounded to float once, and
 * *loss_sum = sum_e loss_e (unscaled, double; set, not added). For TF's loss
 * scaling a replica passes scale = 1/global_batch and the strategy
 * SUM-reduces grad_accum.
 *
 * n may be 0 (an empty batch: nothing is added, *loss_sum = 0; x and y may
 * then be NULL). grad_accum NULL computes the loss only; loss_sum may be
 * NULL. On error nothing is written to grad_accum. */
DSIM_API dsim_err dsim_model_loss_grad(const dsim_model_spec *spec, const float *params,
                                       const float *x, const float *y, size_t n, float scale,
                                       float *grad_accum, double *loss_sum);

/* dsim_model_loss_grad into a gradient of zeros, without reading it first:
 * grad[k] = (float)(+0.0 + scale * sum_e d loss_e / d params[k]), the bits
 * that setting grad to +0 and calling dsim_model_loss_grad gives, with one
 * pass less over grad. n = 0 sets grad to +0. grad must not be NULL. */
DSIM_API dsim_err dsim_model_loss_grad_set(const dsim_model_spec *spec, const float *params,
                                           const float *x, const float *y, size_t n, float scale,
                                           float *grad, double *loss_sum);

/* Mixed precision (Keras's mixed_float16 / mixed_bfloat16 policies,
 * dsim/precision.h): dsim_model_loss_grad_set with the forward and backward
 * passes rounded to `compute` (DSIM_F16 or DSIM_BF16; DSIM_F32 is exactly
 * dsim_model_loss_grad_set). The variables stay float; as a Keras layer
 * under a mixed policy does, the model rounds to the compute dtype
 *   - each layer's input x (autocast), once per call;
 *   - the variables as they are read: every weight and bias cast once per
 *     call, the forward and the backward pass both use the cast values;
 *   - each layer's output, once from its sum in double (a tensor core
 *     accumulates wide and writes the compute dtype); the ReLU after it is
 *     exact;
 *   - the gradient entering the backward pass: d loss_e / d outputs (the
 *     loss itself is computed wide from the rounded outputs, as Keras's
 *     float32 output layer and loss do) times `scale`, rounded;
 *   - each layer's gradient with respect to its input (the delta passed
 *     down), once from its sum;
 *   - each weight's and bias's gradient, once from its sum over the batch;
 *     then widened to float, exactly (the cast's gradient).
 * So grad[k] is a value of the compute dtype: scale carries the loss scale
 * (loss_scale / global_batch) into the backward pass, and the caller
 * unscales. Overflow gives inf and NaN, never an error: dynamic loss
 * scaling (dsim/precision.h) finds it in the gradient. */
DSIM_API dsim_err dsim_model_loss_grad_mixed(const dsim_model_spec *spec, dsim_dtype compute,
                                             const float *params, const float *x, const float *y,
                                             size_t n, float scale, float *grad, double *loss_sum);

/* out[e*out_dim + j]: the model's outputs for n examples (predictions for
 * MSE, logits for cross-entropy). */
DSIM_API dsim_err dsim_model_predict(const dsim_model_spec *spec, const float *params,
                                     const float *x, size_t n, float *out);

/* Loss sum over n examples (as dsim_model_loss_grad) and, for
 * cross-entropy, how many examples the argmax of the logits gets right
 * (ties go to the lower class); *n_correct is 0 for MSE. Either output
 * may be NULL. */
DSIM_API dsim_err dsim_model_eval(const dsim_model_spec *spec, const float *params, const float *x,
                                  const float *y, size_t n, double *loss_sum, size_t *n_correct);

/* The compute kernels the models run on: "avx512", "avx2" or "generic"
 * (portable C), the fastest this CPU has unless dsim_model_kernels_use
 * chose. All of them give the same bits (see Numerics above); they differ
 * only in speed. */
DSIM_API const char *dsim_model_kernels(void);
/* The kernels this CPU can run, slowest first: fills up to cap names and
 * returns how many there are. */
DSIM_API size_t dsim_model_kernels_list(const char **names, size_t cap);
/* Chooses the kernels by name for the whole process ("auto" or NULL: the
 * fastest); DSIM_EINVAL naming those available for a name this CPU cannot
 * run. Meant for benchmarks and tests: not to be called while a model
 * computes on another thread. */
DSIM_API dsim_err dsim_model_kernels_use(const char *name);

#ifdef __cplusplus
}
#endif
#endif
