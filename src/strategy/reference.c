/* The single-device reference a distributed run is compared with, and the
 * comparison itself.
 *
 * The reference replays exactly the global batches the replicas read: at
 * step s it asks every worker's input for its step s (as the replicas do),
 * concatenates the batches of all replicas in replica order, and makes ONE
 * dsim_model_loss_grad call over them with scale 1/global_batch, then one
 * optimizer update. A correct synchronous strategy differs from it only by
 * floating-point summation order: per-replica gradient sums rounded to float
 * and combined by the all-reduce, against one sum over the whole batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strategy_int.h"

/* The replay's own step times (the performance check's one-device
 * baseline): it runs on the caller's thread, outside any engine. */
static int64_t ref_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

dsim_err dsim_train_reference(const dsim_train_cfg *cfg, dsim_train_result *res)
{
    if (!res)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_train_reference: res is NULL");
    memset(res, 0, sizeof *res);
    res->error.peer = -1;
    if (!cfg) {
        dsim_err e = DSIM_ERR(DSIM_EINVAL, -1, "dsim_train_reference: cfg is NULL");
        dsim_error_copy(&res->error);
        return e;
    }
    dsim_train_setup su;
    dsim_err se = dsim_train_setup_open(cfg, &su);
    if (se != DSIM_OK) {
        dsim_error_copy(&res->error);
        return se;
    }
    int W = cfg->hosts, R = cfg->devices_per_host;
    size_t P = su.n_params, G = (size_t)cfg->global_batch;
    size_t in_dim = su.model.in_dim, y_dim = su.ds->y_dim;
    uint64_t steps = su.steps_per_epoch * cfg->epochs;
    if (cfg->stop_after && cfg->stop_after < steps)
        steps = cfg->stop_after;
    dsim_input **ins = calloc((size_t)W, sizeof *ins);
    /* Under OFF every worker reads the whole stream: a step's union holds up
     * to W*G examples. */
    size_t cap = (G < su.ds->spec.n_examples ? G : su.ds->spec.n_examples) * (size_t)W;
    uint64_t *ids = malloc(cap * sizeof *ids);
    float *x = malloc(cap * in_dim * sizeof(float));
    float *y = malloc(cap * y_dim * sizeof(float));
    float *grad = malloc(P * sizeof(float));
    dsim_optim *opt = NULL;
    dsim_err e = DSIM_OK;
    snprintf(res->strategy, sizeof res->strategy, "reference");
    res->placement = DSIM_PLACE_ONE_DEVICE;
    res->num_workers = 1;
    res->devices_per_host = 1;
    res->num_replicas = 1;
    res->num_replicas_in_sync = 1;
    res->loss_scale = 1.0f / (float)G;
    res->shard_applied = su.applied;
    res->steps_per_epoch = su.steps_per_epoch;
    res->steps = steps;
    res->n_params = P;
    res->replicas_agree = true;
    res->in_sync_every_step = true;
    res->params = calloc(P, sizeof(float));
    res->loss = calloc(steps + 1, sizeof(double));
    res->local_loss = calloc(steps + 1, sizeof(double));
    res->checksum = calloc(steps + 1, sizeof(uint64_t));
    res->examples = calloc(steps + 1, sizeof(uint64_t));
    res->step_ns = calloc(steps + 1, sizeof(int64_t));
    res->comm_ns = calloc(steps + 1, sizeof(int64_t)); /* one device: no exchange */
    res->checkpoint_writes = calloc(1, sizeof(uint64_t));
    if (cfg->record_params)
        res->trace = calloc(steps * P + 1, sizeof(float));
    if (!ins || !ids || !x || !y || !grad || !res->params || !res->loss || !res->local_loss ||
        !res->checksum || !res->examples || !res->step_ns || !res->comm_ns ||
        !res->checkpoint_writes || (cfg->record_params && !res->trace)) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
        goto out;
    }
    for (int w = 0; w < W && e == DSIM_OK; w++)
        e = dsim_train_input(cfg, &su, w, &ins[w]);
    if (e == DSIM_OK)
        e = dsim_ledger_create(su.ds->spec.n_examples, cfg->epochs, 1, 1, &res->ledger);
    if (e == DSIM_OK)
        e = dsim_train_init_params(cfg, &su, res->params);
    if (e == DSIM_OK)
        e = dsim_optim_create(&su.optim, P, &opt);
    if (e != DSIM_OK)
        goto out;
    res->initial_loss = dsim_train_mean_loss(&su, res->params);
    if (cfg->record_params) {
        res->initial_params = malloc(P * sizeof(float) + 1);
        if (!res->initial_params) {
            e = DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
            goto out;
        }
        memcpy(res->initial_params, res->params, P * sizeof(float));
    }
    float scale = 1.0f / (float)G;
    for (uint64_t s = 0; s < steps; s++) {
        size_t n = 0;
        uint32_t epoch = 0;
        uint64_t step = 0;
        for (int w = 0; w < W; w++) {
            dsim_input_step st;
            if ((e = dsim_input_next(ins[w], &st)) != DSIM_OK)
                goto out;
            if (st.done) {
                e = DSIM_ERR(DSIM_ESTATE, -1, "reference: worker %d's input ended at step %llu", w,
                             (unsigned long long)s);
                goto out;
            }
            epoch = st.epoch;
            step = st.step;
            for (int d = 0; d < R; d++) {
                const dsim_replica_batch *b = &st.batch[d];
                if (n + b->n > cap) {
                    e = DSIM_ERR(DSIM_ESTATE, -1, "reference: step %llu holds over %zu examples",
                                 (unsigned long long)s, cap);
                    goto out;
                }
                memcpy(ids + n, b->ids, (size_t)b->n * sizeof *ids);
                n += (size_t)b->n;
            }
        }
        int64_t t0 = ref_now();
        if (n && (e = dsim_dataset_gather(su.ds, ids, n, x, y)) != DSIM_OK)
            goto out;
        if ((e = dsim_ledger_record(res->ledger, 0, epoch, step, ids, n)) != DSIM_OK)
            goto out;
        memset(grad, 0, P * sizeof(float));
        double loss_sum = 0;
        if ((e = dsim_model_loss_grad(&su.model, res->params, n ? x : NULL, n ? y : NULL, n, scale,
                                      grad, &loss_sum)) != DSIM_OK)
            goto out;
        if ((e = dsim_optim_apply(opt, res->params, grad, P)) != DSIM_OK)
            goto out;
        res->loss[s] = res->local_loss[s] = loss_sum * (double)scale;
        res->examples[s] = n;
        res->step_ns[s] = ref_now() - t0;
        res->checksum[s] = dsim_params_checksum(res->params, P);
        if (res->trace)
            memcpy(res->trace + s * P, res->params, P * sizeof(float));
    }
    res->final_loss = dsim_train_mean_loss(&su, res->params);
    res->optim_state_len = dsim_optim_state_len(opt);
    res->optim_step = dsim_optim_step(opt);
    if (res->optim_state_len) {
        res->optim_state = malloc(res->optim_state_len * sizeof(float));
        if (!res->optim_state) {
            e = DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
            goto out;
        }
        memcpy(res->optim_state, dsim_optim_state(opt), res->optim_state_len * sizeof(float));
    }
out:
    for (int w = 0; ins && w < W; w++)
        dsim_input_destroy(ins[w]);
    free(ins);
    free(ids);
    free(x);
    free(y);
    free(grad);
    dsim_optim_destroy(opt);
    dsim_train_setup_close(&su);
    if (e != DSIM_OK)
        dsim_error_copy(&res->error);
    return e;
}
