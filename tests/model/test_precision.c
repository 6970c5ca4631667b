/* Mixed precision: the policies, Keras's dynamic loss scaling rules, the
 * rounding hooks, the model's forward and backward pass in float16 and
 * bfloat16, and the optimizer's skipped step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/precision.h"
#include "dsim/rng.h"
#include "dsim/strategy.h"

static void test_policy_names(void **state)
{
    (void)state;
    for (int p = 0; p < DSIM_POLICY_COUNT; p++) {
        dsim_precision_policy got = DSIM_POLICY_COUNT;
        assert_int_equal(dsim_precision_policy_parse(dsim_precision_policy_name(p), &got), DSIM_OK);
        assert_int_equal(got, p);
    }
    dsim_precision_policy got;
    assert_int_equal(dsim_precision_policy_parse("float16", &got), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "mixed_float16"));
    assert_int_equal(dsim_precision_compute_dtype(DSIM_POLICY_MIXED_FLOAT16), DSIM_F16);
    assert_int_equal(dsim_precision_compute_dtype(DSIM_POLICY_MIXED_BFLOAT16), DSIM_BF16);
    assert_int_equal(dsim_precision_compute_dtype(DSIM_POLICY_FLOAT32), DSIM_F32);
    assert_true(dsim_precision_scales_loss(DSIM_POLICY_MIXED_FLOAT16));
    assert_false(dsim_precision_scales_loss(DSIM_POLICY_MIXED_BFLOAT16));
}

/* Keras's LossScaleOptimizer(dynamic=True): 2^15, x2 after 2000 finite
 * steps in a row, /2 and skip on a non-finite one, never below 1. */
static void test_dynamic_loss_scale(void **state)
{
    (void)state;
    dsim_loss_scale ls;
    dsim_loss_scale_init(&ls, DSIM_POLICY_MIXED_FLOAT16);
    assert_true(ls.dynamic);
    assert_true(ls.scale == 32768.0f);
    for (int i = 0; i < 1999; i++)
        assert_true(dsim_loss_scale_record(&ls, true));
    assert_true(ls.scale == 32768.0f);
    assert_int_equal(ls.counter, 1999);
    assert_true(dsim_loss_scale_record(&ls, true));
    assert_true(ls.scale == 65536.0f);
    assert_int_equal(ls.counter, 0);
    /* a non-finite step resets the count of finite ones */
    for (int i = 0; i < 1500; i++)
        dsim_loss_scale_record(&ls, true);
    assert_false(dsim_loss_scale_record(&ls, false));
    assert_true(ls.skipped);
    assert_int_equal(ls.skips, 1);
    assert_true(ls.scale == 32768.0f);
    assert_int_equal(ls.counter, 0);
    for (int i = 0; i < 1999; i++)
        dsim_loss_scale_record(&ls, true);
    assert_true(ls.scale == 32768.0f);
    for (int i = 0; i < 40; i++)
        dsim_loss_scale_record(&ls, false);
    assert_true(ls.scale == 1.0f);
    assert_int_equal(ls.skips, 41);
    /* bfloat16 and float32: a fixed scale of 1 that applies everything */
    dsim_loss_scale_init(&ls, DSIM_POLICY_MIXED_BFLOAT16);
    assert_false(ls.dynamic);
    assert_true(ls.scale == 1.0f);
    assert_true(dsim_loss_scale_record(&ls, false));
    assert_false(ls.skipped);
    assert_true(ls.recorded);
}

static void test_all_finite(void **state)
{
    (void)state;
    float v[5] = {1, -2, 0, 65504, 1e-30f};
    assert_true(dsim_all_finite(v, 5));
    v[3] = INFINITY;
    assert_false(dsim_all_finite(v, 5));
    v[3] = NAN;
    assert_false(dsim_all_finite(v, 5));
    v[3] = -INFINITY;
    assert_false(dsim_all_finite(v, 5));
    assert_true(dsim_all_finite(v, 0));
}

static void test_round(void **state)
{
    (void)state;
    /* half: 11 significant bits, max 65504, ties to even */
    assert_true(dsim_dtype_round(DSIM_F16, 1.0 + 0x1p-11) == 1.0);
    assert_true(dsim_dtype_round(DSIM_F16, 1.0 + 0x1p-11 + 0x1p-40) == 1.0 + 0x1p-10);
    assert_true(dsim_dtype_round(DSIM_F16, 65504.0) == 65504.0);
    assert_true(isinf(dsim_dtype_round(DSIM_F16, 65520.0)));
    assert_true(dsim_dtype_round(DSIM_F16, 0x1p-24) == 0x1p-24); /* smallest subnormal */
    assert_true(dsim_dtype_round(DSIM_F16, 0x1p-26) == 0.0);
    /* bfloat16: 8 bits, float32's range */
    assert_true(dsim_dtype_round(DSIM_BF16, 1.0 + 0x1p-8) == 1.0);
    assert_true(dsim_dtype_round(DSIM_BF16, 1.0 + 0x1p-7) == 1.0 + 0x1p-7);
    assert_true(dsim_dtype_round(DSIM_BF16, 1e30) != INFINITY);
    assert_true(isnan(dsim_dtype_round(DSIM_BF16, NAN)));
    double v[2] = {1.0 + 0x1p-12, 3.0};
    dsim_dtype_round_n(DSIM_F16, v, 2);
    assert_true(v[0] == 1.0 && v[1] == 3.0);
    assert_true(dsim_dtype_unit_roundoff(DSIM_F16) == 0x1p-11);
    assert_true(dsim_dtype_unit_roundoff(DSIM_BF16) == 0x1p-8);
}

static dsim_model_spec mlp(void)
{
    dsim_model_spec s;
    memset(&s, 0, sizeof s);
    s.kind = DSIM_MODEL_MLP;
    s.loss = DSIM_LOSS_AUTO;
    s.in_dim = 6;
    s.out_dim = 3;
    s.n_hidden = 2;
    s.hidden[0] = 8;
    s.hidden[1] = 5;
    return s;
}

typedef struct batch {
    dsim_model_spec s;
    size_t P, n;
    float *w, *x, *y, *g32, *g;
} batch;

static void batch_make(batch *b, size_t n)
{
    b->s = mlp();
    b->P = dsim_model_num_params(&b->s);
    b->n = n;
    b->w = malloc(b->P * sizeof(float));
    b->g32 = malloc(b->P * sizeof(float));
    b->g = malloc(b->P * sizeof(float));
    b->x = malloc(n * b->s.in_dim * sizeof(float));
    b->y = malloc(n * sizeof(float));
    dsim_rng r;
    dsim_rng_init(&r, 7, "test.precision", 0);
    assert_int_equal(dsim_model_init(&b->s, b->w, &r), DSIM_OK);
    for (size_t i = 0; i < n * b->s.in_dim; i++)
        b->x[i] = (float)dsim_rng_normal(&r);
    for (size_t e = 0; e < n; e++)
        b->y[e] = (float)dsim_rng_below(&r, b->s.out_dim);
}

static void batch_free(batch *b)
{
    free(b->w);
    free(b->g32);
    free(b->g);
    free(b->x);
    free(b->y);
}

/* float32 "compute" is dsim_model_loss_grad_set to the bit. */
static void test_mixed_float32_is_plain(void **state)
{
    (void)state;
    batch b;
    batch_make(&b, 37);
    double l32 = 0, l = 0;
    assert_int_equal(dsim_model_loss_grad_set(&b.s, b.w, b.x, b.y, b.n, 1.0f / 37, b.g32, &l32),
                     DSIM_OK);
    assert_int_equal(
        dsim_model_loss_grad_mixed(&b.s, DSIM_F32, b.w, b.x, b.y, b.n, 1.0f / 37, b.g, &l),
        DSIM_OK);
    assert_memory_equal(b.g, b.g32, b.P * sizeof(float));
    assert_true(l == l32);
    batch_free(&b);
}

/* In float16 and bfloat16 every gradient is a value of the compute dtype
 * (its rounding is the last thing that happens to it), and the gradient is
 * the float32 one up to the compute dtype's rounding: the norm-wise error
 * stays below 16 u (a handful of roundings per layer, each at most u,
 * through a three-layer network). A pass that skipped a rounding would be
 * bit-identical to float32, one that rounded wrongly (truncation, the wrong
 * dtype) is off by far more than 16 u in bfloat16 or not a value of it. */
static void check_mixed(dsim_dtype cd, float scale)
{
    batch b;
    batch_make(&b, 64);
    double l32 = 0, l = 0;
    assert_int_equal(dsim_model_loss_grad_set(&b.s, b.w, b.x, b.y, b.n, scale, b.g32, &l32),
                     DSIM_OK);
    assert_int_equal(dsim_model_loss_grad_mixed(&b.s, cd, b.w, b.x, b.y, b.n, scale, b.g, &l),
                     DSIM_OK);
    double num = 0, den = 0;
    size_t differ = 0;
    for (size_t k = 0; k < b.P; k++) {
        assert_true((double)b.g[k] == dsim_dtype_round(cd, b.g[k]));
        double d = (double)b.g[k] - b.g32[k];
        num += d * d;
        den += (double)b.g32[k] * b.g32[k];
        differ += b.g[k] != b.g32[k];
    }
    double u = dsim_dtype_unit_roundoff(cd), rel = sqrt(num / den);
    printf("%s scale %g: gradient norm-wise error %.3g = %.2f u; %zu of %zu differ; loss %.6g vs "
           "%.6g\n",
           dsim_dtype_name(cd), (double)scale, rel, rel / u, differ, b.P, l, l32);
    assert_true(differ > 0);
    assert_true(rel < 16 * u);
    assert_true(fabs(l - l32) <= 16 * u * fabs(l32));
    batch_free(&b);
}

static void test_mixed_float16(void **state)
{
    (void)state;
    check_mixed(DSIM_F16, 1.0f / 64);
    check_mixed(DSIM_F16, 32768.0f / 64); /* with Keras's initial loss scale */
}

static void test_mixed_bfloat16(void **state)
{
    (void)state;
    check_mixed(DSIM_BF16, 1.0f / 64);
}

/* A loss scale too large for half overflows: inf or NaN in the gradient,
 * never an error. bfloat16 has float32's range and does not. */
static void test_mixed_overflow(void **state)
{
    (void)state;
    batch b;
    batch_make(&b, 16);
    assert_int_equal(
        dsim_model_loss_grad_mixed(&b.s, DSIM_F16, b.w, b.x, b.y, b.n, 1e6f, b.g, NULL), DSIM_OK);
    assert_false(dsim_all_finite(b.g, b.P));
    assert_int_equal(
        dsim_model_loss_grad_mixed(&b.s, DSIM_BF16, b.w, b.x, b.y, b.n, 1e6f, b.g, NULL), DSIM_OK);
    assert_true(dsim_all_finite(b.g, b.P));
    assert_int_equal(
        dsim_model_loss_grad_mixed(&b.s, DSIM_I32, b.w, b.x, b.y, b.n, 1.0f, b.g, NULL),
        DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "compute dtype"));
    batch_free(&b);
}

/* A skipped step counts (Keras's iterations advance) and changes nothing. */
static void test_optim_skip(void **state)
{
    (void)state;
    dsim_optim_spec spec;
    dsim_optim_spec_default(&spec, DSIM_OPTIM_ADAM);
    dsim_optim *opt = NULL;
    assert_int_equal(dsim_optim_create(&spec, 2, &opt), DSIM_OK);
    float w[2] = {1, 2}, g[2] = {0.5f, -0.5f};
    assert_int_equal(dsim_optim_apply(opt, w, g, 2), DSIM_OK);
    float w1[2] = {w[0], w[1]};
    size_t len = dsim_optim_state_len(opt);
    float *slots = malloc(len * sizeof(float));
    memcpy(slots, dsim_optim_state(opt), len * sizeof(float));
    dsim_optim_skip(opt);
    assert_int_equal(dsim_optim_step(opt), 2);
    assert_memory_equal(w, w1, sizeof w);
    assert_memory_equal(dsim_optim_state(opt), slots, len * sizeof(float));
    free(slots);
    dsim_optim_destroy(opt);
}

/* A job whose first steps overflow float16 at 2^15: a regression with
 * large targets (as scenarios/mixed_precision.yaml). */
static void job(dsim_train_cfg *cfg, const char *strategy, int hosts, int dev)
{
    dsim_train_cfg_init(cfg);
    cfg->strategy = strategy;
    cfg->hosts = hosts;
    cfg->devices_per_host = dev;
    cfg->data.kind = DSIM_DATA_REGRESSION;
    cfg->data.n_examples = 256;
    cfg->data.in_dim = 8;
    cfg->data.out_dim = 1;
    cfg->data.noise = 20;
    cfg->data.n_files = 4;
    cfg->data.seed = 7;
    cfg->model.kind = DSIM_MODEL_LINEAR;
    cfg->optim.lr = 0.01;
    cfg->global_batch = 32;
    cfg->epochs = 2;
    cfg->seed = 7;
    cfg->precision = DSIM_POLICY_MIXED_FLOAT16;
}

/* Every replica holds the same scale and skips alike, the scale comes
 * down from 2^15 only by the skips, and the reference replays the same
 * steps. */
static void check_skips(const char *strategy, int hosts, int dev)
{
    dsim_train_cfg cfg;
    job(&cfg, strategy, hosts, dev);
    dsim_train_result res, ref;
    if (dsim_train(&cfg, &res) != DSIM_OK)
        fail_msg("%s: %s", strategy, res.error.msg);
    assert_int_equal(dsim_train_reference(&cfg, &ref), DSIM_OK);
    size_t N = (size_t)res.num_replicas;
    assert_int_equal(res.precision, DSIM_POLICY_MIXED_FLOAT16);
    assert_true(res.skipped_steps > 0);
    assert_int_equal(res.skipped_steps, ref.skipped_steps);
    assert_true(res.final_loss_scale == 32768.0f / (float)(1u << res.skipped_steps));
    for (uint64_t k = 0; k < res.steps; k++) {
        for (size_t r = 1; r < N; r++) {
            assert_int_equal(res.mp_skipped[k * N + r], res.mp_skipped[k * N]);
            assert_true(res.mp_scale[k * N + r] == res.mp_scale[k * N]);
        }
        assert_int_equal(res.mp_skipped[k * N], ref.mp_skipped[k]);
        assert_true(res.mp_scale[k * N] == ref.mp_scale[k]);
    }
    assert_true(res.mp_skipped[0]); /* 2^15 overflows */
    assert_true(res.mp_scale[0] == 32768.0f);
    dsim_train_result_free(&res);
    dsim_train_result_free(&ref);
}

static void test_train_skips_alike(void **state)
{
    (void)state;
    check_skips("mirrored", 1, 4);
    check_skips("central_storage", 1, 3);
    check_skips("one_device", 1, 1);
}

/* bfloat16 has float32's range: no scaling, no skip. */
static void test_train_bfloat16(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    job(&cfg, "mirrored", 1, 2);
    cfg.precision = DSIM_POLICY_MIXED_BFLOAT16;
    cfg.gradient_dtype = DSIM_BF16;
    dsim_train_result res;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_OK);
    assert_int_equal(res.skipped_steps, 0);
    assert_true(res.final_loss_scale == 1.0f);
    assert_true(res.mp_scale[0] == 1.0f);
    dsim_train_result_free(&res);
}

/* What the driver refuses, each with a message naming the fix. */
static void test_train_refusals(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    dsim_train_result res;
    /* parameter servers apply the gradient on the servers, shard by shard:
     * no loss scaling, refused before the job (not at its first step, as a
     * strategy's own bug would be) */
    job(&cfg, "parameter_server", 2, 1);
    cfg.num_ps = 1;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EINVAL);
    assert_non_null(strstr(res.error.msg, "parameter_server does not run mixed_float16"));
    assert_non_null(strstr(res.error.msg, "mixed_bfloat16"));
    dsim_train_result_free(&res);
    job(&cfg, "central_storage", 1, 2);
    cfg.gradient_dtype = DSIM_F16;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EINVAL);
    assert_non_null(strstr(res.error.msg, "gradient_dtype float16 does not apply"));
    dsim_train_result_free(&res);
    job(&cfg, "mirrored", 1, 2);
    cfg.gradient_dtype = DSIM_I32;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EINVAL);
    assert_non_null(strstr(res.error.msg, "float32, float16 or bfloat16"));
    dsim_train_result_free(&res);
    job(&cfg, "mirrored", 1, 2);
    cfg.precision = (dsim_precision_policy)9;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_EINVAL);
    assert_non_null(strstr(res.error.msg, "mixed_bfloat16"));
    dsim_train_result_free(&res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_names),
        cmocka_unit_test(test_dynamic_loss_scale),
        cmocka_unit_test(test_all_finite),
        cmocka_unit_test(test_round),
        cmocka_unit_test(test_mixed_float32_is_plain),
        cmocka_unit_test(test_mixed_float16),
        cmocka_unit_test(test_mixed_bfloat16),
        cmocka_unit_test(test_mixed_overflow),
        cmocka_unit_test(test_optim_skip),
        cmocka_unit_test(test_train_skips_alike),
        cmocka_unit_test(test_train_bfloat16),
        cmocka_unit_test(test_train_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
