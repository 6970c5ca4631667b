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

/* Eight independent lanes of FNV-style xor-multiply over 8-byte words,
 * each folded through a strong mix at the end: any change to one
 * parameter changes the result, and the lanes run in parallel (a
 * byte-at-a-time hash was half the cost of a step at 1024 replicas). */
static uint64_t params_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* The lanes over whole 64-byte blocks: 8 words a block, word k to lane k.
 * A vector of 8 lanes where the CPU multiplies 64-bit lanes (AVX-512DQ),
 * else 8 scalars the compiler keeps in registers; the same integers. */
typedef uint64_t params_v8 __attribute__((vector_size(64)));

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f,avx512dq"))) static void params_lanes_v8(const unsigned char *b,
                                                                        size_t blocks, uint64_t *h)
{
    params_v8 v;
    memcpy(&v, h, sizeof v);
    for (size_t i = 0; i < blocks; i++) {
        params_v8 w;
        memcpy(&w, b + 64 * i, sizeof w);
        v = (v ^ w) * 0x100000001b3ull;
    }
    memcpy(h, &v, sizeof v);
}
#endif

static void params_lanes(const unsigned char *b, size_t blocks, uint64_t *h)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512dq")) {
        params_lanes_v8(b, blocks, h);
        return;
    }
#endif
    uint64_t h0 = h[0], h1 = h[1], h2 = h[2], h3 = h[3], h4 = h[4], h5 = h[5], h6 = h[6], h7 = h[7];
    for (size_t i = 0; i < blocks; i++) {
        uint64_t w[8];
        memcpy(w, b + 64 * i, sizeof w);
        h0 = (h0 ^ w[0]) * 0x100000001b3ull;
        h1 = (h1 ^ w[1]) * 0x100000001b3ull;
        h2 = (h2 ^ w[2]) * 0x100000001b3ull;
        h3 = (h3 ^ w[3]) * 0x100000001b3ull;
        h4 = (h4 ^ w[4]) * 0x100000001b3ull;
        h5 = (h5 ^ w[5]) * 0x100000001b3ull;
        h6 = (h6 ^ w[6]) * 0x100000001b3ull;
        h7 = (h7 ^ w[7]) * 0x100000001b3ull;
    }
    h[0] = h0, h[1] = h1, h[2] = h2, h[3] = h3, h[4] = h4, h[5] = h5, h[6] = h6, h[7] = h7;
}

uint64_t dsim_params_checksum(const float *p, size_t n)
{
    if (!p)
        n = 0;
    const unsigned char *b = (const unsigned char *)p;
    size_t len = n * sizeof(float), i = len / 64 * 64;
    uint64_t h[8];
    for (int k = 0; k < 8; k++)
        h[k] = 0xcbf29ce484222325ull + 0x9e3779b97f4a7c15ull * (uint64_t)k;
    params_lanes(b, len / 64, h);
    uint64_t r = (uint64_t)len;
    for (; i < len; i++)
        r = (r ^ b[i]) * 0x100000001b3ull;
    for (int k = 0; k < 8; k++)
        r = params_mix(r ^ params_mix(h[k] + (uint64_t)k));
    return r;
}

/* Floats mapped to a monotonic integer line, so that the distance between
 * two of them is their distance in ulps (+0 and -0 are the same point). */
static int64_t reference_ordered(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? (int64_t)INT32_MIN - (int64_t)i : (int64_t)i;
}

void dsim_params_compare(const float *a, const float *b, size_t n, dsim_params_diff *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            out->n_diff++;
        if (isnan(a[i]) || isnan(b[i])) {
            if (isnan(a[i]) != isnan(b[i])) {
                out->max_ulps = UINT64_MAX;
                out->max_abs = INFINITY;
                out->max_rel = INFINITY;
                out->worst = i;
            }
            continue;
        }
        double d = fabs((double)a[i] - (double)b[i]);
        double m = fmax(fabs((double)a[i]), fabs((double)b[i]));
        double rel = m > 0 ? d / m : 0;
        int64_t u = reference_ordered(a[i]) - reference_ordered(b[i]);
        uint64_t ulps = (uint64_t)(u < 0 ? -u : u);
        if (d > out->max_abs) {
            out->max_abs = d;
            out->worst = i;
        }
        if (rel > out->max_rel)
            out->max_rel = rel;
        if (ulps > out->max_ulps && out->max_ulps != UINT64_MAX)
            out->max_ulps = ulps;
    }
}

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
        double loss_sum = 0;
        if ((e = dsim_model_loss_grad_set(&su.model, res->params, n ? x : NULL, n ? y : NULL, n,
                                          scale, grad, &loss_sum)) != DSIM_OK)
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
