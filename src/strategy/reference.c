/* The single-device reference a distributed run is compared with, and the
 * comparison itself.
 *
 * The reference replays exactly the global batches the replicas read: at
 * step s it asks every worker's input for its step s (as the replicas do),
 * concatenates the batches of all replicas in replica order, and makes ONE
 * dsim_model_loss_grad call over them with scale 1/global_batch, then one
 * optimizer update. A correct synchronous strategy differs from it only by
 * floating-point summation order: per-replica gradient sums rounded to float
 * and combined by the all-reduce, against one sum over the whole batch.
 *
 * Mixed precision replays the same policy: the gradient in the compute
 * dtype with the reference's own dynamic loss scale (which moves as every
 * replica's does when the strategy is right), rounded once to the
 * gradients' all-reduce dtype, the update skipped on a non-finite one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/spi/rt.h"
#include "model/optim_int.h"
#include "strategy_int.h"

/* The replay's own step times (the performance check's one-device
 * baseline): it runs on the caller's thread, outside any engine. */
/* What the replay works in. */
typedef struct ref_job {
    const dsim_train_cfg *cfg;
    dsim_train_setup su;
    int W, R;         /* workers, replicas per worker */
    size_t P, G, cap; /* parameters, global batch, the most examples a step holds */
    uint64_t steps;
    dsim_input **ins; /* [W] */
    uint64_t *ids;    /* [cap] */
    size_t *seg;      /* [W * R + 1]: replica i's examples are ids[seg[i] .. seg[i+1]) */
    float *part;      /* [P]: one replica's gradient (mixed precision) */
    float *x, *y, *grad;
    dsim_optim *opt;
    dsim_loss_scale ls; /* the policy's loss scale, as one replica holds it */
    const float *params_now;
    float *before; /* [P]: the variables before the step (update_norm), or NULL */
    /* following a run (dsim_train_reference_follow): its rows, its
     * gradients at the spans' first steps, and the path of the span so
     * far */
    const float *follow;
    const float *grads; /* the run's trace_grad, grad_rows of them, or NULL */
    const float *slots; /* the run's trace_slots (as many rows), or NULL */
    uint64_t grad_rows;
    float *prev_grad; /* [P], every step kept: one device's gradient of the step before */
    double span_path;
    /* cfg.follow_parting: a second replay in lockstep, from the same rows
     * (and slots), with its own optimizer, whose gradient sums the
     * replicas' batches' gradients in float (ref_step_b) */
    float *b_params, *b_grad;
    dsim_optim *b_opt;
} ref_job;

/* The result's description of a one-device run, and its arrays. */
static dsim_err ref_alloc_result(ref_job *r, dsim_train_result *res)
{
    size_t P = r->P;
    uint64_t steps = r->steps;
    snprintf(res->strategy, sizeof res->strategy, "reference");
    res->placement = DSIM_PLACE_ONE_DEVICE;
    res->num_workers = 1;
    res->devices_per_host = 1;
    res->num_replicas = 1;
    res->num_replicas_in_sync = 1;
    res->loss_scale = 1.0f / (float)r->G;
    res->shard_applied = r->su.applied;
    res->input_from_strategy = r->su.input_ops != NULL;
    res->steps_per_epoch = r->su.steps_per_epoch;
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
    res->trace_every = r->cfg->trace_every > 1 ? r->cfg->trace_every : 1;
    if (r->cfg->record_params) {
        res->trace = calloc(steps / res->trace_every * P + 1, sizeof(float));
        res->update_norm = calloc(steps + 1, sizeof(double));
        r->before = malloc(P * sizeof(float) + 1);
        if (!res->trace || !res->update_norm || !r->before)
            return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory for the trace");
    }
    res->precision =
        r->cfg->precision == DSIM_POLICY_DEFAULT ? DSIM_POLICY_FLOAT32 : r->cfg->precision;
    res->gradient_dtype = r->cfg->gradient_dtype;
    res->mp_scale = calloc(steps + 1, sizeof(float));
    res->mp_skipped = calloc(steps + 1, 1);
    if (!res->mp_scale || !res->mp_skipped || !(res->grad_norm = train_grad_norms_alloc(steps)))
        return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
    if (r->follow) {
        uint64_t rows = steps / res->trace_every + 1;
        res->follow_dist = calloc(rows, sizeof(double));
        res->follow_ulps = calloc(rows, sizeof(double));
        res->follow_path = calloc(rows, sizeof(double));
        if (!r->before)
            r->before = malloc(P * sizeof(float) + 1);
        if (!res->follow_dist || !res->follow_ulps || !res->follow_path || !r->before)
            return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory to follow the run");
        if (r->cfg->follow_parting) {
            if (!(res->follow_part = calloc(rows, sizeof(double))))
                return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory to follow the run");
            for (uint64_t j = 0; j < rows; j++)
                res->follow_part[j] = NAN;
        }
    }
    if (r->grads) {
        res->follow_grad_dist = calloc(r->grad_rows + 1, sizeof(double));
        res->follow_grad_ulps = calloc(r->grad_rows + 1, sizeof(double));
        res->follow_grad_norm = calloc(r->grad_rows + 1, sizeof(double));
        res->follow_grad_off = calloc(r->grad_rows + 1, sizeof(uint64_t));
        res->follow_grad_lo = calloc(r->grad_rows + 1, sizeof(uint64_t));
        res->follow_grad_hi = calloc(r->grad_rows + 1, sizeof(uint64_t));
        res->follow_grad_prev = calloc(r->grad_rows + 1, sizeof(double));
        if (res->trace_every == 1)
            r->prev_grad = malloc(P * sizeof(float) + 1);
        if (!res->follow_grad_dist || !res->follow_grad_ulps || !res->follow_grad_norm ||
            !res->follow_grad_off || !res->follow_grad_lo || !res->follow_grad_hi ||
            !res->follow_grad_prev || (res->trace_every == 1 && !r->prev_grad))
            return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory to follow the run");
        for (uint64_t j = 0; j <= r->grad_rows; j++)
            res->follow_grad_dist[j] = res->follow_grad_prev[j] = NAN;
    }
    if (!res->params || !res->loss || !res->local_loss || !res->checksum || !res->examples ||
        !res->step_ns || !res->comm_ns || !res->checkpoint_writes ||
        (r->cfg->record_params && !res->trace))
        return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
    return DSIM_OK;
}

/* The buffers, every worker's input, the ledger, the initial variables and
 * the optimizer. */
static dsim_err ref_open(ref_job *r, dsim_train_result *res)
{
    const dsim_train_cfg *cfg = r->cfg;
    const dsim_train_setup *su = &r->su;
    r->W = cfg->hosts;
    r->R = cfg->devices_per_host;
    r->P = su->n_params;
    r->G = (size_t)cfg->global_batch;
    r->steps = su->steps_per_epoch * cfg->epochs;
    if (cfg->stop_after && cfg->stop_after < r->steps)
        r->steps = cfg->stop_after;
    r->ins = calloc((size_t)r->W, sizeof *r->ins);
    /* Under OFF every worker reads the whole stream: a step's union holds up
     * to W*G examples. */
    r->cap = (r->G < su->ds->spec.n_examples ? r->G : su->ds->spec.n_examples) * (size_t)r->W;
    r->ids = malloc(r->cap * sizeof *r->ids);
    r->x = malloc(r->cap * su->model.in_dim * sizeof(float));
    r->y = malloc(r->cap * su->ds->y_dim * sizeof(float));
    r->grad = malloc(r->P * sizeof(float));
    r->part = malloc(r->P * sizeof(float));
    r->seg = malloc(((size_t)r->W * (size_t)r->R + 1) * sizeof *r->seg);
    dsim_err e = ref_alloc_result(r, res);
    if (e == DSIM_OK && (!r->ins || !r->ids || !r->x || !r->y || !r->grad || !r->part || !r->seg))
        e = DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
    for (int w = 0; w < r->W && e == DSIM_OK; w++)
        e = dsim_train_input(cfg, su, w, &r->ins[w]);
    if (e == DSIM_OK)
        e = dsim_ledger_create(su->ds->spec.n_examples, cfg->epochs, 1, 1, &res->ledger);
    if (e == DSIM_OK)
        e = dsim_train_init_params(cfg, su, res->params);
    if (e == DSIM_OK) {
        res->initial_checksum = dsim_params_checksum(res->params, r->P);
        res->n_vars = su->n_vars; /* the variables messages name */
        memcpy(res->vars, su->vars, sizeof res->vars);
    }
    if (e == DSIM_OK)
        e = dsim_optim_create(&su->optim, r->P, &r->opt);
    if (e != DSIM_OK)
        return e;
    /* the second replay: float32 only (a mixed policy's skips would part
     * the two otherwise) */
    if (r->follow && cfg->follow_parting && cfg->precision <= DSIM_POLICY_FLOAT32 &&
        cfg->gradient_dtype == DSIM_F32) {
        r->b_params = malloc(r->P * sizeof(float) + 1);
        r->b_grad = malloc(r->P * sizeof(float) + 1);
        if (!r->b_params || !r->b_grad)
            return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory for the second replay");
        if ((e = dsim_optim_create(&su->optim, r->P, &r->b_opt)) != DSIM_OK)
            return e;
        memcpy(r->b_params, res->params, r->P * sizeof(float));
    }
    res->initial_loss = dsim_train_mean_loss(su, res->params);
    if (cfg->record_params) {
        res->initial_params = malloc(r->P * sizeof(float) + 1);
        if (!res->initial_params)
            return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
        memcpy(res->initial_params, res->params, r->P * sizeof(float));
    }
    return DSIM_OK;
}

static void ref_close(ref_job *r)
{
    for (int w = 0; r->ins && w < r->W; w++)
        dsim_input_destroy(r->ins[w]);
    free(r->ins);
    free(r->ids);
    free(r->x);
    free(r->y);
    free(r->grad);
    free(r->part);
    free(r->seg);
    free(r->before);
    free(r->prev_grad);
    free(r->b_params);
    free(r->b_grad);
    dsim_optim_destroy(r->b_opt);
    dsim_optim_destroy(r->opt);
    dsim_train_setup_close(&r->su);
}

/* Step s's global batch: every worker's step s, its replicas' batches in
 * replica order, into r->ids (*n of them). */
static dsim_err ref_batch(ref_job *r, uint64_t s, size_t *n, uint32_t *epoch, uint64_t *step)
{
    *n = 0;
    r->seg[0] = 0;
    for (int w = 0; w < r->W; w++) {
        dsim_input_step st;
        dsim_err e = dsim_input_next(r->ins[w], &st);
        if (e != DSIM_OK)
            return e;
        if (st.done)
            return DSIM_ERR(DSIM_ESTATE, -1, "reference: worker %d's input ended at step %llu", w,
                            (unsigned long long)s);
        *epoch = st.epoch;
        *step = st.step;
        for (int d = 0; d < r->R; d++) {
            const dsim_replica_batch *b = &st.batch[d];
            if (*n + b->n > r->cap)
                return DSIM_ERR(DSIM_ESTATE, -1, "reference: step %llu holds over %zu examples",
                                (unsigned long long)s, r->cap);
            memcpy(r->ids + *n, b->ids, (size_t)b->n * sizeof *r->ids);
            *n += (size_t)b->n;
            r->seg[w * r->R + d + 1] = *n;
        }
    }
    return DSIM_OK;
}

/* Under a mixed policy: each replica's gradient apart, as the replicas
 * compute them (their rounding to the compute dtype, and so where they
 * overflow, depends on the batch each holds), summed in replica order in
 * the all-reduce's dtype. A whole-batch gradient would round the sum over
 * the batch once and overflow elsewhere: the run would skip other steps
 * than its reference, right strategy or not. */
static dsim_err ref_grad_mixed(ref_job *r, float scale, double *loss_sum)
{
    size_t P = r->P, in = r->su.model.in_dim, yd = r->su.ds->y_dim;
    dsim_dtype gd = r->cfg->gradient_dtype;
    memset(r->grad, 0, P * sizeof(float));
    *loss_sum = 0;
    for (size_t i = 0; i < (size_t)r->W * (size_t)r->R; i++) {
        size_t a = r->seg[i], nb = r->seg[i + 1] - a;
        double ls = 0;
        DSIM_CHECK(train_mixed_grad(r->cfg, &r->su, &r->ls, r->params_now,
                                    nb ? r->x + a * in : NULL, nb ? r->y + a * yd : NULL, nb, scale,
                                    r->part, &ls));
        *loss_sum += ls;
        for (size_t k = 0; k < P; k++) {
            float v = i == 0 ? r->part[k] : r->grad[k] + r->part[k];
            r->grad[k] = gd == DSIM_F32 ? v : (float)dsim_dtype_round(gd, v);
        }
    }
    return DSIM_OK;
}

/* The Euclidean distance of a[n] from b[n] (*dist) and the norm of the
 * ulps of max(|a_k|, |b_k|) (*ulps): the size of a float rounding of
 * each. With skip_nan, over the elements where a is not NaN only (a run's
 * row of gradients holds the parts its optimizers applied), else over all
 * (a NaN there makes *dist NaN); *norm, when not NULL, the norm of b over
 * the same elements. Returns how many were taken. */
static size_t ref_distance_of(const float *a, const float *b, size_t n, bool skip_nan, double *dist,
                              double *ulps, double *norm)
{
    double dd = 0, uu = 0, bb = 0;
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        if (skip_nan && isnan(a[k]))
            continue;
        double d = (double)a[k] - (double)b[k];
        float x = fmaxf(fabsf(a[k]), fabsf(b[k]));
        double u = (double)nextafterf(x, INFINITY) - (double)x;
        dd += d * d;
        uu += u * u;
        bb += (double)b[k] * (double)b[k];
        m++;
    }
    *dist = sqrt(dd);
    *ulps = sqrt(uu);
    if (norm)
        *norm = sqrt(bb);
    return m;
}

/* Following a run with its gradients: at step j * every the replay stands
 * where the run stood (its variables); how far the run's gradient there
 * is from one device's, over the elements the run's row holds (all of them
 * where replica 0 applied the whole model's; the parts where the replicas'
 * optimizers applied parts), and the norm of one device's there (of all of
 * it where the row holds none: NaN distances, nothing to compare). */
static void ref_follow_grad(ref_job *r, dsim_train_result *res, uint64_t j)
{
    size_t P = r->P;
    const float *run = r->grads + j * P;
    double norm, dist, ulps, prev_ulps;
    size_t m = ref_distance_of(run, r->grad, P, true, &dist, &ulps, &norm);
    if (m == 0)
        norm = sqrt(dsim_optim_grad_sqsum(r->grad, P));
    res->follow_grad_norm[j] = norm;
    if (m && r->prev_grad && j > 0)
        (void)ref_distance_of(run, r->prev_grad, P, true, &res->follow_grad_prev[j], &prev_ulps,
                              NULL);
    if (r->prev_grad)
        memcpy(r->prev_grad, r->grad, P * sizeof(float));
    if (m == 0)
        return;
    res->follow_grad_dist[j] = dist;
    res->follow_grad_ulps[j] = ulps;
    /* the elements off by more than 1 % (a part of the buffer treated
     * apart), above a floor far over any rounding of a near-zero sum */
    double floor = 1e-4 * norm / sqrt((double)m);
    uint64_t off = 0, lo = 0, hi = 0;
    for (size_t k = 0; k < P; k++) {
        double a = run[k], b = r->grad[k];
        if (isnan(a))
            continue;
        if (!(fabs(a - b) <= 0.01 * fmax(fabs(a), fabs(b)) + floor)) {
            if (off++ == 0)
                lo = k;
            hi = k;
        }
    }
    res->follow_grad_off[j] = off;
    res->follow_grad_lo[j] = lo;
    res->follow_grad_hi[j] = hi;
}

/* Following a run: how far row j of the replay (its variables after step
 * s) is from the run's row j, and the path of the span that led there. */
static void ref_follow_row(ref_job *r, dsim_train_result *res, uint64_t j)
{
    size_t P = r->P;
    const float *run = r->follow + j * P, *one = res->params;
    (void)ref_distance_of(run, one, P, false, &res->follow_dist[j], &res->follow_ulps[j], NULL);
    res->follow_path[j] = r->span_path;
    r->span_path = 0;
    double ulps;
    if (r->b_params)
        (void)ref_distance_of(r->b_params, one, P, false, &res->follow_part[j], &ulps, NULL);
}

/* The second replay's step over the same examples (in r->x, r->y): each
 * replica's batch's gradient apart, summed in replica order in float, as
 * a strategy's replicas and their all-reduce do: other float rounding
 * than one gradient over the whole batch, of the size the run's has. */
static dsim_err ref_step_b(ref_job *r, float scale)
{
    size_t P = r->P, in = r->su.model.in_dim, yd = r->su.ds->y_dim;
    for (size_t i = 0; i < (size_t)r->W * (size_t)r->R; i++) {
        size_t a = r->seg[i], nb = r->seg[i + 1] - a;
        double loss = 0;
        dsim_err e = dsim_model_loss_grad_set(&r->su.model, r->b_params, nb ? r->x + a * in : NULL,
                                              nb ? r->y + a * yd : NULL, nb, scale, r->part, &loss);
        if (e != DSIM_OK)
            return e;
        for (size_t k = 0; k < P; k++)
            r->b_grad[k] = i == 0 ? r->part[k] : r->b_grad[k] + r->part[k];
    }
    return dsim_optim_apply(r->b_opt, r->b_params, r->b_grad, P);
}

/* Step s: one gradient over the whole global batch, one update. */
static dsim_err ref_step(ref_job *r, dsim_train_result *res, uint64_t s)
{
    size_t n = 0, P = r->P;
    uint32_t epoch = 0;
    uint64_t step = 0;
    float scale = 1.0f / (float)r->G;
    dsim_err e = ref_batch(r, s, &n, &epoch, &step);
    if (e != DSIM_OK)
        return e;
    int64_t t0 = dsim_rt_mono_ns();
    if (n && (e = dsim_dataset_gather(r->su.ds, r->ids, n, r->x, r->y)) != DSIM_OK)
        return e;
    if ((e = dsim_ledger_record(res->ledger, 0, epoch, step, r->ids, n)) != DSIM_OK)
        return e;
    double loss_sum = 0;
    res->mp_scale[s] = r->ls.scale;
    r->params_now = res->params;
    if (r->cfg->precision > DSIM_POLICY_FLOAT32 || r->cfg->gradient_dtype != DSIM_F32)
        e = ref_grad_mixed(r, scale, &loss_sum);
    else
        e = dsim_model_loss_grad_set(&r->su.model, res->params, n ? r->x : NULL, n ? r->y : NULL, n,
                                     scale, r->grad, &loss_sum);
    if (e != DSIM_OK)
        return e;
    uint64_t every = res->trace_every;
    if (r->grads && s % every == 0 && s / every < r->grad_rows)
        ref_follow_grad(r, res, s / every);
    bool applied = dsim_loss_scale_record(&r->ls, !r->ls.dynamic || dsim_all_finite(r->grad, P));
    res->mp_skipped[s] = !applied;
    if (r->before)
        memcpy(r->before, res->params, P * sizeof(float));
    optim_seen_begin(1);
    if (!applied)
        dsim_optim_skip(r->opt);
    else if ((e = dsim_optim_apply(r->opt, res->params, r->grad, P)) != DSIM_OK)
        return e;
    res->grad_norm[s] = train_grad_norm_take(P);
    if (r->b_params && (e = ref_step_b(r, scale)) != DSIM_OK)
        return e;
    if (r->before && (res->update_norm || r->follow)) {
        double uu = 0;
        for (size_t k = 0; k < P; k++) {
            double u = (double)res->params[k] - (double)r->before[k];
            uu += u * u;
        }
        if (res->update_norm)
            res->update_norm[s] = sqrt(uu);
        if (r->follow)
            r->span_path += sqrt(uu);
    }
    res->loss[s] = res->local_loss[s] = loss_sum * (double)scale;
    res->examples[s] = n;
    res->step_ns[s] = dsim_rt_mono_ns() - t0;
    res->checksum[s] = dsim_params_checksum(res->params, P);
    if (res->trace && (s + 1) % every == 0)
        memcpy(res->trace + ((s + 1) / every - 1) * P, res->params, P * sizeof(float));
    return DSIM_OK;
}

/* The final loss and the optimizer's state. */
static dsim_err ref_finish(ref_job *r, dsim_train_result *res)
{
    res->final_loss = dsim_train_mean_loss(&r->su, res->params);
    res->skipped_steps = r->ls.skips;
    res->final_loss_scale = r->ls.scale;
    res->optim_state_len = dsim_optim_state_len(r->opt);
    res->optim_step = dsim_optim_step(r->opt);
    if (!res->optim_state_len)
        return DSIM_OK;
    res->optim_state = malloc(res->optim_state_len * sizeof(float));
    if (!res->optim_state)
        return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
    memcpy(res->optim_state, dsim_optim_state(r->opt), res->optim_state_len * sizeof(float));
    return DSIM_OK;
}

/* opt's state from a row of the rule's slots (n floats: adam's m and v,
 * rmsprop's, adagrad's) at step s */
static dsim_err ref_set_slots(dsim_optim *opt, const float *row, size_t n, uint64_t s)
{
    size_t len = dsim_optim_state_len(opt);
    if (len == n)
        return dsim_optim_set_state(opt, row, n, s);
    /* with gradient accumulation: the rule's slots from the row, the
     * accumulator (the last slot) the replay's own */
    float *st = malloc(len * sizeof(float));
    if (!st)
        return DSIM_ERR(DSIM_ENOMEM, -1, "reference: out of memory");
    memcpy(st, row, n * sizeof(float));
    memcpy(st + n, dsim_optim_state(opt) + n, (len - n) * sizeof(float));
    dsim_err e = dsim_optim_set_state(opt, st, len, s);
    free(st);
    return e;
}

/* Following a run that kept its optimizer's slots: at step s = j * every
 * the replay's optimizer (and the second replay's) takes the run's slots
 * of row j, where the row holds them all (a whole model's optimizer, or
 * parts that cover it), so that its update starts from where the run's
 * did; else it keeps its own. */
static dsim_err ref_follow_slots(ref_job *r, uint64_t s)
{
    uint64_t every = r->cfg->trace_every > 1 ? r->cfg->trace_every : 1, j = s / every;
    const dsim_optim_spec *os = dsim_optim_spec_of(r->opt);
    size_t n = dsim_optim_rule_slots(os) * r->P, len = dsim_optim_state_len(r->opt);
    if (!r->slots || s % every != 0 || j >= r->grad_rows || n == 0 ||
        (len != n && len != n + r->P) || !dsim_optim_is_adaptive(os))
        return DSIM_OK;
    const float *row = r->slots + j * n;
    for (size_t k = 0; k < n; k++)
        if (isnan(row[k]))
            return DSIM_OK;
    dsim_err e = ref_set_slots(r->opt, row, n, s);
    if (e == DSIM_OK && r->b_opt)
        e = ref_set_slots(r->b_opt, row, n, s);
    return e;
}

/* The replay; with follow, each step s = (j + 1) * every starts from
 * follow's row j (every = cfg->trace_every, at least 1). */
static dsim_err ref_replay(const dsim_train_cfg *cfg, const float *follow, uint64_t follow_rows,
                           const float *grads, const float *slots, uint64_t grad_rows,
                           dsim_train_result *res)
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
    ref_job r = {
        .cfg = cfg, .follow = follow, .grads = grads, .slots = slots, .grad_rows = grad_rows};
    dsim_err e = train_check_precision(cfg);
    if (e != DSIM_OK) {
        dsim_error_copy(&res->error);
        return e;
    }
    dsim_loss_scale_init(&r.ls, cfg->precision);
    e = dsim_train_setup_open(cfg, &r.su);
    if (e != DSIM_OK) {
        dsim_error_copy(&res->error);
        return e;
    }
    e = ref_open(&r, res);
    uint64_t every = cfg->trace_every > 1 ? cfg->trace_every : 1;
    if (e == DSIM_OK && follow && (follow_rows + 1) * every < r.steps)
        r.steps = (follow_rows + 1) * every; /* no row to start the rest from */
    for (uint64_t s = 0; s < r.steps && e == DSIM_OK; s++) {
        if (follow && s > 0 && s % every == 0) {
            memcpy(res->params, follow + (s / every - 1) * r.P, r.P * sizeof(float));
            if (r.b_params)
                memcpy(r.b_params, res->params, r.P * sizeof(float));
        }
        if (follow && (e = ref_follow_slots(&r, s)) != DSIM_OK)
            break;
        e = ref_step(&r, res, s);
        if (e == DSIM_OK && follow && (s + 1) % every == 0 && (s + 1) / every <= follow_rows)
            ref_follow_row(&r, res, (s + 1) / every - 1);
    }
    if (e == DSIM_OK) {
        res->steps = r.steps;
        res->trace_rows = res->trace ? r.steps / every : 0;
        e = ref_finish(&r, res);
    }
    ref_close(&r);
    if (e != DSIM_OK)
        dsim_error_copy(&res->error);
    return e;
}

dsim_err dsim_train_reference(const dsim_train_cfg *cfg, dsim_train_result *res)
{
    return ref_replay(cfg, NULL, 0, NULL, NULL, 0, res);
}

dsim_err dsim_train_reference_follow(const dsim_train_cfg *cfg, const float *rows, uint64_t n_rows,
                                     dsim_train_result *res)
{
    if (!rows)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_train_reference_follow: rows is NULL");
    return ref_replay(cfg, rows, n_rows, NULL, NULL, 0, res);
}

dsim_err dsim_train_reference_follow_run(const dsim_train_cfg *cfg, const dsim_train_result *run,
                                         dsim_train_result *res)
{
    const char *bad = !run || !run->trace ? "the run kept no trace (record_params)"
                      : cfg && run->trace_every != (cfg->trace_every > 1 ? cfg->trace_every : 1)
                          ? "cfg's trace_every is not the run's"
                          : NULL;
    if (bad && res) {
        memset(res, 0, sizeof *res);
        res->error.peer = -1;
    }
    if (bad) {
        dsim_err e = DSIM_ERR(DSIM_EINVAL, -1, "dsim_train_reference_follow_run: %s", bad);
        if (res)
            dsim_error_copy(&res->error);
        return e;
    }
    return ref_replay(cfg, run->trace, run->trace_rows, run->trace_grad,
                      run->trace_grad ? run->trace_slots : NULL, run->trace_grad_rows, res);
}
