/* What dsim_train (train.c) and dsim_train_reference (reference.c) share:
 * the checks of the data, model and optimizer, the dataset and its file
 * list, each worker's input, the initial variables and the mean loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/rng.h"
#include "strategy_int.h"

void dsim_train_setup_close(dsim_train_setup *su)
{
    dsim_dataset_free(su->ds_owned);
    free(su->file_start);
    free(su->file_ids);
    memset(su, 0, sizeof *su);
}

/* The strategy's op as the input layer's dsim_input_fn. */
static dsim_err setup_input_fn(void *user, const dsim_input_context *ic, uint32_t epoch,
                               dsim_input_batches *out)
{
    const struct dsim_strategy_ops *ops = user;
    return ops->input_fn(ic, epoch, out);
}

dsim_input_fn dsim_strategy_input_fn(const char *name, void **user)
{
    const dsim_strategy *s = NULL;
    if (!name || dsim_strategy_lookup(name, &s) != DSIM_OK) {
        dsim_clear_error();
        return NULL;
    }
    if (!s->ops->input_fn)
        return NULL;
    if (user)
        *user = (void *)s->ops;
    return setup_input_fn;
}

/* The job's strategy's input_fn, when it has one. The reference and `dsim
 * plan` find it as the job does: a plugin is loaded first. A strategy
 * that is not there (yet) is the driver's to report: none here. */
static dsim_err setup_find_input_fn(const dsim_train_cfg *cfg, dsim_train_setup *su)
{
    if (!cfg->strategy || cfg->synthetic_params > 0)
        return DSIM_OK;
    if (cfg->plugin_path)
        DSIM_CHECK(dsim_strategy_load(cfg->strategy, cfg->plugin_path));
    const dsim_strategy *s = NULL;
    if (dsim_strategy_lookup(cfg->strategy, &s) != DSIM_OK) {
        dsim_clear_error();
        return DSIM_OK;
    }
    if (!s->ops->input_fn)
        return DSIM_OK;
    su->input_ops = s->ops;
    dsim_strategy_shape shape = {
        .hosts = cfg->hosts,
        .devices_per_host = cfg->devices_per_host,
        .num_replicas = cfg->hosts * cfg->devices_per_host,
        .num_ps = cfg->num_ps,
        .ps_mode = cfg->ps_mode,
    };
    su->input_nris = dsim_strategy_replicas_in_sync(s, &shape);
    return DSIM_OK;
}

dsim_err dsim_train_input(const dsim_train_cfg *cfg, const dsim_train_setup *su, int worker,
                          dsim_input **out)
{
    dsim_input_config ic = {
        .dataset = &su->desc,
        .policy = cfg->shard,
        .global_batch = cfg->global_batch,
        .num_workers = cfg->hosts,
        .replicas_per_worker = cfg->devices_per_host,
        .worker = worker,
        .seed = cfg->seed,
        .shuffle = cfg->shuffle,
        .drop_remainder = cfg->drop_remainder,
        .epochs = cfg->epochs,
        /* 0 while the setup makes the first input; then every worker's
         * input skips what that one already did for the whole job */
        .steps_per_epoch = su->steps_per_epoch,
        .input_fn = su->input_ops ? setup_input_fn : NULL,
        .input_fn_user = (void *)su->input_ops,
        .num_replicas_in_sync = su->input_nris,
    };
    return dsim_input_create(&ic, out);
}

dsim_err dsim_train_setup_open(const dsim_train_cfg *cfg, dsim_train_setup *su)
{
    memset(su, 0, sizeof *su);
    if (cfg->hosts < 1 || cfg->devices_per_host < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: the cluster is %d host(s) x %d device(s); both must be >= 1",
                        cfg->hosts, cfg->devices_per_host);
    if (cfg->global_batch < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "train: global_batch is %lld; it must be >= 1",
                        (long long)cfg->global_batch);
    if (cfg->epochs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "train: epochs is %u; it must be >= 1", cfg->epochs);
    if (cfg->dataset) {
        su->ds = cfg->dataset;
    } else {
        DSIM_CHECK(dsim_dataset_make(&cfg->data, &su->ds_owned));
        su->ds = su->ds_owned;
    }
    const dsim_dataset *ds = su->ds;
    dsim_err e = DSIM_OK;
    if (cfg->model.in_dim == 0)
        dsim_dataset_model_spec(ds, &su->model);
    else
        su->model = cfg->model;
    if ((e = dsim_model_validate(&su->model)) != DSIM_OK ||
        (e = dsim_dataset_check_model(ds, &su->model)) != DSIM_OK ||
        (e = dsim_optim_validate(&cfg->optim)) != DSIM_OK)
        goto fail;
    su->optim = cfg->optim;
    su->n_params = dsim_model_num_params(&su->model);
    su->n_vars = dsim_model_vars(&su->model, su->vars);
    /* The model's variables, for the optimizers the strategy creates from
     * su->optim (LAMB's trust ratio is per variable); a plugin model's
     * spans are dsim's naming, not its variables. */
    if ((su->optim.kind == DSIM_OPTIM_LAMB || su->optim.clipnorm > 0.0) &&
        su->model.kind == DSIM_MODEL_PLUGIN) {
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "train: %s needs the model's variables (a norm per variable), which a "
                     "plugin model does not give; use %s, or a built-in model",
                     su->optim.clipnorm > 0.0 ? "clipnorm" : "optimizer lamb",
                     su->optim.clipnorm > 0.0 ? "global_clipnorm" : "adam");
        goto fail;
    }
    if (su->optim.n_vars == 0 && su->model.kind != DSIM_MODEL_PLUGIN &&
        su->n_vars <= DSIM_OPTIM_MAX_VARS) {
        su->optim.n_vars = su->n_vars;
        for (size_t k = 0; k < su->n_vars; k++)
            su->optim.var_len[k] = su->vars[k].len;
    }
    {
        dsim_optim *probe = NULL;
        if ((e = dsim_optim_create(&su->optim, su->n_params, &probe)) != DSIM_OK)
            goto fail;
        su->optim_state_len = dsim_optim_state_len(probe);
        dsim_optim_destroy(probe);
    }
    /* The dataset's record files become the input's file list. */
    uint64_t n = ds->spec.n_examples;
    su->desc.n_examples = n;
    su->desc.hint = cfg->hint;
    if (!cfg->in_memory) {
        size_t nf = ds->spec.n_files;
        su->file_start = malloc((nf + 1) * sizeof *su->file_start);
        su->file_ids = malloc((n ? n : 1) * sizeof *su->file_ids);
        if (!su->file_start || !su->file_ids) {
            e = DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the file list");
            goto fail;
        }
        for (size_t f = 0; f <= nf; f++)
            su->file_start[f] = ds->file_start[f];
        for (uint64_t i = 0; i < n; i++)
            su->file_ids[i] = i;
        su->desc.n_files = (uint32_t)nf;
        su->desc.file_start = su->file_start;
        su->desc.file_ids = su->file_ids;
    }
    if ((e = setup_find_input_fn(cfg, su)) != DSIM_OK)
        goto fail;
    {
        dsim_input *in = NULL;
        if ((e = dsim_train_input(cfg, su, 0, &in)) != DSIM_OK)
            goto fail;
        su->steps_per_epoch = dsim_input_steps_per_epoch(in);
        su->applied = dsim_input_policy_applied(in);
        dsim_input_destroy(in);
    }
    return DSIM_OK;
fail:
    dsim_train_setup_close(su);
    return e;
}

dsim_err dsim_train_init_params(const dsim_train_cfg *cfg, const dsim_train_setup *su,
                                float *params)
{
    dsim_rng r;
    dsim_rng_init(&r, cfg->seed, "model.init", 0);
    return dsim_model_init(&su->model, params, &r);
}

double dsim_train_mean_loss(const dsim_train_setup *su, const float *params)
{
    double sum = NAN;
    size_t n = su->ds->spec.n_examples;
    if (dsim_model_eval(&su->model, params, su->ds->x, su->ds->y, n, &sum, NULL) != DSIM_OK)
        return NAN;
    return sum / (double)n;
}

dsim_err dsim_train_check_tpu(const dsim_train_cfg *cfg)
{
    const dsim_tpu_topology *t = &cfg->tpu;
    if (t->replicas == 0)
        return DSIM_OK;
    if (t->hosts != cfg->hosts || t->replicas_per_host != cfg->devices_per_host ||
        t->replicas != t->hosts * t->replicas_per_host)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: TPU %s is %d host(s) x %d replica(s) but the job is %d host(s) "
                        "x %d device(s); give the slice's shape (or no slice)",
                        t->name, t->hosts, t->replicas_per_host, cfg->hosts, cfg->devices_per_host);
    return DSIM_OK;
}

dsim_err dsim_train_torus(const dsim_train_cfg *cfg, dsim_comm_cfg *cc, int **rank_at)
{
    *rank_at = NULL;
    if (cfg->tpu.replicas == 0)
        return DSIM_OK;
    DSIM_CHECK(dsim_train_check_tpu(cfg));
    int *at = malloc((size_t)cfg->tpu.replicas * sizeof *at);
    if (!at)
        return DSIM_ERR(DSIM_ENOMEM, -1, "train: out of memory for the torus of %s", cfg->tpu.name);
    int dims[DSIM_TPU_TORUS_DIMS], nd = 0;
    dsim_tpu_torus(&cfg->tpu, dims, &nd, at);
    cc->torus_ndims = nd;
    for (int i = 0; i < nd && i < DSIM_TORUS_MAX_DIMS; i++)
        cc->torus_dims[i] = dims[i];
    cc->torus_rank = at;
    *rank_at = at;
    return DSIM_OK;
}

/* The first step and replica whose batch is not b (static shapes), from the
 * plan of the first epoch (batch sizes are the same every epoch). */
static dsim_err train_static_plan(const dsim_train_cfg *cfg, int64_t b)
{
    int N = cfg->hosts * cfg->devices_per_host;
    uint64_t n = cfg->dataset ? cfg->dataset->spec.n_examples : cfg->data.n_examples;
    size_t nf = cfg->dataset ? cfg->dataset->spec.n_files : cfg->data.n_files;
    dsim_dataset_desc desc;
    DSIM_CHECK(
        dsim_dataset_desc_init(&desc, n, cfg->in_memory ? 0 : (uint32_t)nf, DSIM_FILES_CONTIGUOUS));
    desc.hint = cfg->hint;
    dsim_input_config ic = {
        .dataset = &desc,
        .policy = cfg->shard,
        .global_batch = cfg->global_batch,
        .num_workers = cfg->hosts,
        .replicas_per_worker = cfg->devices_per_host,
        .seed = cfg->seed,
        .shuffle = cfg->shuffle,
        .drop_remainder = cfg->drop_remainder,
        .epochs = cfg->epochs,
    };
    dsim_input_plan *p = NULL;
    dsim_err e = dsim_input_plan_make(&ic, &p);
    for (uint64_t s = 0; e == DSIM_OK && s < p->steps; s++) {
        for (int i = 0; i < N; i++) {
            uint64_t got = p->batch[s * (uint64_t)N + (uint64_t)i];
            if (got == (uint64_t)b)
                continue;
            e = DSIM_ERR(DSIM_EINVAL, -1,
                         "static shapes (dynamic batch size off): step %llu of every epoch "
                         "gives replica %d (host %d) %llu example%s, not %lld: the last "
                         "global batch of %lld is partial (%llu examples an epoch, %s "
                         "sharding); set drop_remainder: true to drop it, use a number of "
                         "examples the global batch divides, or turn dynamic batch sizes on "
                         "(TPUStrategy then pads the short batch and masks the padding)",
                         (unsigned long long)s, i, i / cfg->devices_per_host,
                         (unsigned long long)got, got == 1 ? "" : "s", (long long)b,
                         (long long)cfg->global_batch, (unsigned long long)n,
                         dsim_shard_policy_name(p->applied));
            break;
        }
    }
    dsim_input_plan_free(p);
    dsim_dataset_desc_release(&desc);
    return e;
}

dsim_err dsim_train_check_static_shapes(const dsim_train_cfg *cfg)
{
    if (!cfg)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_train_check_static_shapes: cfg is NULL");
    if (!cfg->static_shapes)
        return DSIM_OK;
    long long N = (long long)cfg->hosts * cfg->devices_per_host;
    long long G = cfg->global_batch;
    if (N < 1 || G < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "train: %lld replicas and a global batch of %lld; both must be >= 1", N, G);
    if (G % N != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "static shapes (dynamic batch size off): the global batch %lld does not "
                        "split evenly over the %lld replicas (%lld each, %lld left over); make "
                        "it a multiple of %lld (e.g. %lld), or turn dynamic batch sizes on "
                        "(TPUStrategy then pads the short batches and masks the padding)",
                        G, N, G / N, G % N, N, (G / N + 1) * N);
    return train_static_plan(cfg, G / N);
}
