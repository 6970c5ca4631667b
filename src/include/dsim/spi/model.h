/* The model SPI: a user's own model, in a shared object, trained by every
 * strategy on every engine and checked like the built-in ones.
 *
 * A scenario names it with `model: {plugin: libmymodel.so}`; in C, load it
 * with dsim_model_load and set dsim_model_spec.kind = DSIM_MODEL_PLUGIN and
 * .plugin to the table. in_dim and out_dim come from the data as for the
 * built-ins (features; classes for cross-entropy, outputs for MSE).
 *
 * Rules of the table (as for the strategy SPI):
 *   - `size` first, set to sizeof(struct dsim_model_ops); the library
 *     refuses a table of another size, and a plugin built against another
 *     DSIM_MODEL_ABI_VERSION;
 *   - designated initializers; the members marked "required" are checked
 *     when the plugin is loaded (DSIM_EINVAL naming the member); an optional
 *     member left NULL gets the behaviour its comment states;
 *   - src/model/model.c (the dsim_model_* calls of dsim/model.h) is the only
 *     caller of these members; every strategy, the reference replay and the
 *     checks reach the model through those calls.
 *
 * Numerics. Parameters, inputs and the gradient dsim sees are float32. The
 * plugin returns the gradient's SUM over the batch in double, and dsim
 * scales it and rounds it to float once (grad[k] += (float)(scale * g[k]),
 * as dsim_model_loss_grad states). To keep dsim's guarantees (every replica
 * holds the same bits; the same run gives the same bits) the plugin must be
 * deterministic: the same inputs give the same bits, whatever thread calls
 * it, with sums in a fixed order (example order, for instance). It is
 * called concurrently from several threads: keep no mutable global state.
 *
 * A plugin exports one function named DSIM_MODEL_PLUGIN_SYMBOL (see
 * dsim_model_plugin_fn). examples/model_plugin is a worked example (a
 * one-dimensional convolution). */
#ifndef DSIM_SPI_MODEL_H
#define DSIM_SPI_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"
#include "dsim/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever struct dsim_model_ops or the meaning of a member changes;
 * a plugin built against another version is refused. */
#define DSIM_MODEL_ABI_VERSION 1u

/* The function every model plugin exports: it stores the ABI version it was
 * compiled with (DSIM_MODEL_ABI_VERSION) in *abi_version and returns the
 * plugin's ops table (static storage; never freed). */
#define DSIM_MODEL_PLUGIN_SYMBOL "dsim_model_plugin"
typedef const struct dsim_model_ops *dsim_model_plugin_fn(uint32_t *abi_version);

typedef struct dsim_model_ops {
    size_t size;      /* required: sizeof(struct dsim_model_ops) */
    const char *name; /* required: shown in messages, stored with the run */
    /* Required: DSIM_LOSS_MSE (targets: out_dim floats per example) or
     * DSIM_LOSS_XENT (one float per example, a class index in [0, out_dim)).
     * dsim checks the targets against it before calling loss_grad. */
    dsim_loss loss;

    /* Required. The number of float parameters for spec->in_dim features and
     * spec->out_dim outputs; 0 when the model cannot take those sizes (then
     * `why`, of `cap` bytes, says so and how to fix it). */
    size_t (*num_params)(const dsim_model_spec *spec, char *why, size_t cap);

    /* Required. The initial parameters (num_params floats) from `seed`: the
     * same seed must give the same values. dsim passes a seed drawn from the
     * run's seed. */
    dsim_err (*init)(const dsim_model_spec *spec, float *params, uint64_t seed);

    /* Required. For the n >= 1 examples x (n x in_dim, example-major) and y
     * (n x y_dim): *loss_sum = the sum over the examples of each one's loss,
     * and, when grad is not NULL, grad[k] = the sum over the examples of
     * d loss_e / d params[k] (num_params doubles, to be overwritten; dsim
     * scales and rounds). grad NULL: the loss only. Returns DSIM_OK, or an
     * error with a message (DSIM_ERR). */
    dsim_err (*loss_grad)(const dsim_model_spec *spec, const float *params, const float *x,
                          const float *y, size_t n, double *loss_sum, double *grad);

    /* Optional: the model's outputs for n examples into out (n x out_dim:
     * predictions, or logits for cross-entropy), for dsim_model_predict and
     * the accuracy of evaluations. NULL: dsim_model_predict is refused and
     * evaluations count no correct examples. */
    dsim_err (*forward)(const dsim_model_spec *spec, const float *params, const float *x, size_t n,
                        float *out);
} dsim_model_ops;

/* Loads the model plugin at `path` (dlopen; never closed once loaded) and
 * checks its table: DSIM_ENOENT when it cannot be loaded, DSIM_EINVAL for a
 * shared object that is not a model plugin, another ABI version or size, or
 * a required member missing, each with a message naming the file and the
 * fix. */
DSIM_API dsim_err dsim_model_load(const char *path, const dsim_model_ops **out);

/* The same checks on a table in memory (a model linked into the program). */
DSIM_API dsim_err dsim_model_check_ops(const dsim_model_ops *ops, const char *where);

#ifdef __cplusplus
}
#endif
#endif
