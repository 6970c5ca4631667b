/* Inside the strategy layer: the registry entry, the dispatch calls that
 * train.c makes (strategy.c is the only caller of an ops table), the built-in
 * tables, and helpers shared by the strategies that keep a copy of the
 * variables on every replica. */
#ifndef DSIM_STRATEGY_INT_H
#define DSIM_STRATEGY_INT_H

#include <stdbool.h>

#include "dsim/spi/strategy.h"
#include "dsim/strategy.h"

#define STRATEGY_NAME_MAX 32

typedef struct dsim_strategy {
    char name[STRATEGY_NAME_MAX];
    const struct dsim_strategy_ops *ops;
    char path[256]; /* the shared object it came from, or "" for a built-in */
    bool builtin;   /* one of libdsim's own tables (not a plugin's, nor one
                       registered through dsim_strategy_register) */
} dsim_strategy;

/* Finds a registered strategy (registering the built-ins first). ENOENT
 * names the registered ones. */
dsim_err dsim_strategy_lookup(const char *name, const dsim_strategy **out);
/* Checks a table's size and required members; DSIM_EINVAL naming what is
 * wrong (`where` says whose table it is, e.g. a plugin's path). */
dsim_err dsim_strategy_check_ops(const struct dsim_strategy_ops *ops, const char *where);

/* dsim_train of a synthetic model: timing only (timing.c). Fills res as
 * dsim_train does, without numbers; res is zeroed by the caller. */
dsim_err dsim_train_timing(const dsim_train_cfg *cfg, dsim_train_result *res);
/* dsim_train_result.grad_norm: n entries, NaN each; NULL when out of
 * memory. */
double *train_grad_norms_alloc(size_t n);
/* The norm of the gradient the update applied (optim_int.h's take), or NaN
 * where it is not of the whole gradient of P parameters. */
double train_grad_norm_take(size_t P);

/* ---- dispatch (strategy.c) ---- */
dsim_err dsim_strategy_check_shape(const dsim_strategy *s, const dsim_strategy_shape *shape);
int dsim_strategy_replicas_in_sync(const dsim_strategy *s, const dsim_strategy_shape *shape);
dsim_err dsim_strategy_replica_init(const dsim_strategy *s, dsim_replica_ctx *ctx);
void dsim_strategy_replica_fini(const dsim_strategy *s, dsim_replica_ctx *ctx);
dsim_err dsim_strategy_create_variables(const dsim_strategy *s, dsim_replica_ctx *ctx,
                                        const dsim_strategy_vars *init);
dsim_err dsim_strategy_apply_gradients(const dsim_strategy *s, dsim_replica_ctx *ctx, float *grad);
dsim_err dsim_strategy_reduce(const dsim_strategy *s, dsim_replica_ctx *ctx, dsim_op op,
                              const double *in, double *out, size_t n);
/* What replica ctx computes on in step st (the feed member, or its own
 * sub-batch as it is), checked: ids for every example, static_batch (0
 * read as n) from n to max_rows, a finite padding weight. */
dsim_err dsim_strategy_feed(const dsim_strategy *s, dsim_replica_ctx *ctx,
                            const dsim_input_step *st, uint64_t max_rows, dsim_replica_feed *out);
/* DSIM_OK if the strategy can save checkpoints, else the "not supported"
 * error (checked before a job that asks for checkpoints starts). */
dsim_err dsim_strategy_check_save(const dsim_strategy *s);
dsim_err dsim_strategy_save(const dsim_strategy *s, dsim_replica_ctx *ctx, dsim_strategy_vars *out);
int dsim_strategy_is_chief(const dsim_strategy *s, const dsim_replica_ctx *ctx);
dsim_err dsim_strategy_finish(const dsim_strategy *s, dsim_replica_ctx *ctx);
dsim_err dsim_strategy_lost_work(const dsim_strategy *s, dsim_replica_ctx *ctx, int *replica,
                                 uint64_t *from_step);
dsim_err dsim_strategy_server_init(const dsim_strategy *s, dsim_server_ctx *srv);
dsim_err dsim_strategy_serve(const dsim_strategy *s, dsim_server_ctx *srv, int client);
void dsim_strategy_server_fini(const dsim_strategy *s, dsim_server_ctx *srv);

/* ---- built-in tables ---- */
extern const struct dsim_strategy_ops dsim_strategy_one_device_ops;
extern const struct dsim_strategy_ops dsim_strategy_mirrored_ops;
extern const struct dsim_strategy_ops dsim_strategy_multi_worker_mirrored_ops;
extern const struct dsim_strategy_ops dsim_strategy_central_storage_ops;
extern const struct dsim_strategy_ops dsim_strategy_parameter_server_ops;
extern const struct dsim_strategy_ops dsim_strategy_tpu_ops;

/* ---- replicated variables (replicated.c): one_device, mirrored,
 * multi_worker_mirrored keep a copy and an optimizer on every replica ---- */
typedef struct dsim_replicated {
    dsim_optim *opt;
} dsim_replicated;

/* These have the shape of the ops members, so a strategy whose ctx->priv is a
 * dsim_replicated points its table at them. */
/* Creates the optimizer and makes every replica's variables and slots the
 * chief's (broadcast over ctx->world from replica 0). */
dsim_err dsim_replicated_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init);
/* SUM-all-reduces grad over ctx->world with the job's algorithm, then
 * updates ctx->params on every replica. */
dsim_err dsim_replicated_apply(dsim_replica_ctx *ctx, float *grad);
/* ctx->params and the optimizer's slots into out. */
dsim_err dsim_replicated_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out);
void dsim_replicated_fini(dsim_replica_ctx *ctx);
/* All-reduces n doubles over ctx->world (SUM or MEAN). */
dsim_err dsim_replicated_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                                size_t n);
/* Copies the optimizer's slots and step into out (for save). */
dsim_err dsim_strategy_optim_to_vars(const dsim_optim *opt, dsim_strategy_vars *out);
/* Creates an optimizer for n parameters with init's slots and step (init
 * may be NULL: fresh). */
dsim_err dsim_strategy_optim_from_vars(const dsim_optim_spec *spec, size_t n,
                                       const dsim_strategy_vars *init, dsim_optim **out);

/* The signatures of the nv variables v of the parameters p into
 * sig[DSIM_MODEL_MAX_VARS] (0 past nv): dsim_train_result.var_sig. */
void dsim_params_var_sig(const float *p, const dsim_model_var *v, size_t nv, uint16_t *sig);

/* ---- what dsim_train and dsim_train_reference share (setup.c) ---- */
typedef struct dsim_train_setup {
    const dsim_dataset *ds;
    dsim_dataset *ds_owned;
    dsim_dataset_desc desc;
    uint64_t *file_start, *file_ids;
    dsim_model_spec model;
    dsim_optim_spec optim;
    size_t n_params;
    /* the model's variables (dsim_model_vars), whose signatures every step
     * keeps */
    dsim_model_var vars[DSIM_MODEL_MAX_VARS];
    size_t n_vars;
    size_t optim_state_len;
    uint64_t steps_per_epoch;
    dsim_shard_policy applied;
    /* the strategy's input_fn (distribute_datasets_from_function), if any */
    const struct dsim_strategy_ops *input_ops;
    int input_nris; /* its InputContext's num_replicas_in_sync */
} dsim_train_setup;

/* Checks the data, model and optimizer parts of cfg, makes the dataset and
 * its description, and learns the steps per epoch. */
dsim_err dsim_train_setup_open(const dsim_train_cfg *cfg, dsim_train_setup *su);
void dsim_train_setup_close(dsim_train_setup *su);
/* The input of `worker` (cfg's shape). */
dsim_err dsim_train_input(const dsim_train_cfg *cfg, const dsim_train_setup *su, int worker,
                          dsim_input **out);
/* The initial variables drawn from cfg->seed (stream "model.init"). */
dsim_err dsim_train_init_params(const dsim_train_cfg *cfg, const dsim_train_setup *su,
                                float *params);
/* Mean per-example loss over the whole dataset. */
double dsim_train_mean_loss(const dsim_train_setup *su, const float *params);
/* The torus of cfg's TPU slice for a communicator of its replicas: fills
 * cc's torus_* with *rank_at, allocated here (free it after the
 * communicators that borrow it). Nothing (and *rank_at NULL) without a
 * slice. */
dsim_err dsim_train_torus(const dsim_train_cfg *cfg, dsim_comm_cfg *cc, int **rank_at);
/* A job on a TPU slice must have the slice's shape (DSIM_EINVAL naming both
 * otherwise); DSIM_OK without a slice. */
dsim_err dsim_train_check_tpu(const dsim_train_cfg *cfg);

/* ---- mixed precision (mixed.c) ---- */
/* cfg's precision and gradient_dtype are ones dsim runs (DSIM_EINVAL). */
dsim_err train_check_precision(const dsim_train_cfg *cfg);
/* A replica's gradient under cfg's policy: dsim_model_loss_grad_set, or its
 * mixed form with the loss scaled by ls->scale (NULL: 1) and the gradient
 * unscaled, as Keras's LossScaleOptimizer has it. */
dsim_err train_mixed_grad(const dsim_train_cfg *cfg, const dsim_train_setup *su,
                          dsim_loss_scale *ls, const float *params, const float *x, const float *y,
                          size_t n, float scale, float *grad, double *loss_sum);
/* After apply_gradients: DSIM_ESTATE when the strategy ignored the dynamic
 * loss scale or the gradients' dtype. */
dsim_err train_mixed_after(const char *strategy, dsim_replica_ctx *ctx, uint64_t gs);

#endif
