/* The tpu strategy (TPUStrategy on a simulated slice; no TPU is used):
 * short batches padded and the padding masked (equal to the one-device
 * reference on the real examples, padding never counted as read), static
 * shapes refused before the run with the fix, the slice's shape required,
 * multi-host slices over the torus all-reduce, and the planted bugs of
 * tpu_bug_strategy.c caught. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/strategy.h"
#include "dsim/tpu.h"
#include "strat_common.h"

static void tpu_cfg(dsim_train_cfg *cfg, const char *strategy, const char *slice)
{
    dsim_tpu_topology t;
    if (dsim_tpu_topology_parse(slice, &t) != DSIM_OK)
        fail_msg("%s: %s", slice, dsim_errmsg());
    sc_cfg(cfg, strategy, t.hosts, t.replicas_per_host);
    cfg->tpu = t;
}

/* Trains cfg and its reference; the run equals the reference within the
 * bound of strat_common.c, and every example is read once per epoch. */
static void tpu_run_checked(const dsim_train_cfg *cfg, dsim_train_result *r)
{
    dsim_train_result ref;
    if (dsim_train(cfg, r) != DSIM_OK)
        fail_msg("%s on %s: %s", cfg->strategy, cfg->tpu.name, dsim_errmsg());
    assert_int_equal(dsim_train_reference(cfg, &ref), DSIM_OK);
    assert_true(r->in_sync_every_step);
    double ratio, abs_diff;
    sc_distance(cfg, &ref, r, &ratio, &abs_diff);
    printf("# %s on %s, G=%lld: %llu padding rows masked; max |run - reference| %.3g (%.3g of "
           "the bound)\n",
           cfg->strategy, cfg->tpu.name, (long long)cfg->global_batch,
           (unsigned long long)r->padded_total, abs_diff, ratio);
    assert_true(ratio <= 1.0);
    /* the per-step losses agree too */
    for (uint64_t s = 0; s < r->steps; s++)
        assert_true(fabs(r->loss[s] - ref.loss[s]) <= 1e-5 * (1 + fabs(ref.loss[s])));
    uint64_t n = cfg->dataset->spec.n_examples;
    for (uint32_t e = 0; e < cfg->epochs; e++) {
        dsim_coverage cov;
        assert_int_equal(dsim_ledger_coverage(r->ledger, e, -1, 1, &cov), DSIM_OK);
        assert_int_equal(cov.exact, n);
        assert_int_equal(cov.reads, n);
        assert_int_equal(cov.duplicates, 0);
    }
    dsim_train_result_free(&ref);
}

/* Partial last batches and a global batch the cores do not divide: padded
 * to ceil(G / replicas) rows, masked, equal to the reference. */
static void test_padding_masked(void **state)
{
    (void)state;
    static const struct {
        int64_t g;
        uint64_t padded; /* over 2 epochs of 256 examples on 8 replicas */
    } cases[] = {
        {32, 0},   /* 8 full steps of 4 per core */
        {24, 16},  /* 256 = 10 x 24 + 16: the last step gives 3 to five cores, 1 to the
                      sixth and none to the last two, all padded to 3 */
        {20, 112}, /* 20 = 4 x 3 + 4 x 2 every step (4 rows of padding), last 16 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_train_cfg cfg;
        tpu_cfg(&cfg, "tpu", "v3-8");
        cfg.global_batch = cases[i].g;
        dsim_train_result r;
        tpu_run_checked(&cfg, &r);
        assert_int_equal(r.padded_total, cases[i].padded);
        uint64_t real = 0, pad = 0;
        for (size_t k = 0; k < r.steps * (size_t)r.num_replicas; k++) {
            real += r.examples[k];
            pad += r.padded[k];
            /* every core computed the static batch: real rows + padding */
            assert_int_equal(r.examples[k] + r.padded[k], (uint64_t)((cfg.global_batch + 7) / 8));
        }
        assert_int_equal(real, 2 * 256);
        assert_int_equal(pad, cases[i].padded);
        dsim_train_result_free(&r);
    }
}

/* Several hosts, one pipeline each, over the torus all-reduce of the slice. */
static void test_slices(void **state)
{
    (void)state;
    static const char *const slices[] = {"v2-8", "v3-32", "v4-16", "v5e-16"};
    for (size_t i = 0; i < sizeof slices / sizeof slices[0]; i++) {
        dsim_train_cfg cfg;
        tpu_cfg(&cfg, "tpu", slices[i]);
        cfg.communication = DSIM_ALGO_TORUS;
        cfg.global_batch = 64; /* 256 = 4 x 64: no partial batch */
        dsim_train_result r;
        tpu_run_checked(&cfg, &r);
        assert_int_equal(r.num_workers, cfg.tpu.hosts);
        assert_int_equal(r.num_replicas, cfg.tpu.replicas);
        /* one pipeline per host: a host's cores share its files */
        for (int w = 0; w < r.num_workers; w++) {
            dsim_coverage cov;
            assert_int_equal(dsim_ledger_coverage(r.ledger, 0, w, 1, &cov), DSIM_OK);
            assert_true(cov.reads > 0);
        }
        dsim_train_result_free(&r);
    }
}

static void expect_refused(const dsim_train_cfg *cfg, const char *text)
{
    dsim_train_result r;
    dsim_err e = dsim_train(cfg, &r);
    if (e != DSIM_EINVAL || !strstr(r.error.msg, text))
        fail_msg("expected a refusal with \"%s\", got %s: %s", text, dsim_strerror(e), r.error.msg);
    assert_int_equal(r.steps, 0);
    dsim_train_result_free(&r);
}

/* dynamic batch size off: static shapes only, refused before the run. */
static void test_static_shapes(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    tpu_cfg(&cfg, "tpu", "v3-8");
    cfg.static_shapes = true;
    cfg.global_batch = 20;
    expect_refused(&cfg, "the global batch 20 does not split evenly over the 8 replicas (2 "
                         "each, 4 left over); make it a multiple of 8 (e.g. 24)");
    assert_int_equal(dsim_train_check_static_shapes(&cfg), DSIM_EINVAL);
    cfg.global_batch = 24;
    expect_refused(&cfg, "step 10 of every epoch gives replica 5 (host 0) 1 example, not 3: "
                         "the last global batch of 24 is partial");
    assert_non_null(strstr(dsim_errmsg(), "set drop_remainder: true"));
    cfg.drop_remainder = true;
    assert_int_equal(dsim_train_check_static_shapes(&cfg), DSIM_OK);
    dsim_train_result r;
    if (dsim_train(&cfg, &r) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    assert_int_equal(r.padded_total, 0);
    dsim_train_result_free(&r);
    /* the same with dynamic batch sizes pads instead */
    cfg.static_shapes = false;
    cfg.drop_remainder = false;
    assert_int_equal(dsim_train_check_static_shapes(&cfg), DSIM_OK);
}

/* The strategy needs a slice, and the job the slice's shape. */
static void test_needs_slice(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "tpu", 1, 8);
    expect_refused(&cfg, "tpu runs on a TPU slice");
    tpu_cfg(&cfg, "tpu", "v3-32");
    cfg.devices_per_host = 4;
    expect_refused(&cfg, "TPU v3-32 is 4 host(s) x 8 replica(s) but the job is 4 host(s) x 4");
    tpu_cfg(&cfg, "mirrored", "v3-8");
    cfg.communication = DSIM_ALGO_TORUS; /* any strategy may run over a slice's torus */
    dsim_train_result r;
    if (dsim_train(&cfg, &r) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    assert_true(r.in_sync_every_step);
    assert_int_equal(r.padded_total, 0); /* mirrored does not pad */
    dsim_train_result_free(&r);
}

/* Every core fed the host's whole batch: each example read once per core. */
static void test_bug_one_pipeline(void **state)
{
    (void)state;
    const char *path = sc_plugin("DSIM_TPU_ONE_PIPELINE_PLUGIN");
    if (!path)
        skip();
    dsim_train_cfg cfg;
    tpu_cfg(&cfg, "tpu_one_pipeline", "v3-8");
    cfg.plugin_path = path;
    dsim_train_result r;
    if (dsim_train(&cfg, &r) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    dsim_coverage cov;
    assert_int_equal(dsim_ledger_coverage(r.ledger, 0, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.duplicates, 256);
    assert_int_equal(cov.reads, 256 * 8);
    int who[16];
    size_t nw = 0;
    assert_int_equal(dsim_ledger_readers(r.ledger, 0, 5, who, 16, &nw), DSIM_OK);
    assert_int_equal(nw, 8);
    for (int k = 0; k < 8; k++)
        assert_int_equal(who[k], k);
    dsim_train_result_free(&r);
}

/* Padding that weighs: the run leaves the reference. */
static void test_bug_unmasked(void **state)
{
    (void)state;
    const char *path = sc_plugin("DSIM_TPU_UNMASKED_PLUGIN");
    if (!path)
        skip();
    dsim_train_cfg cfg;
    tpu_cfg(&cfg, "tpu_unmasked", "v3-8");
    cfg.plugin_path = path;
    cfg.global_batch = 20;
    dsim_train_result r, ref;
    if (dsim_train(&cfg, &r) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    assert_int_equal(dsim_train_reference(&cfg, &ref), DSIM_OK);
    double ratio, abs_diff;
    sc_distance(&cfg, &ref, &r, &ratio, &abs_diff);
    printf("# unmasked padding: max |run - reference| %.3g, %.3g times the bound\n", abs_diff,
           ratio);
    assert_true(ratio > 100);
    /* the padding is still not counted as read */
    dsim_coverage cov;
    assert_int_equal(dsim_ledger_coverage(r.ledger, 0, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.reads, 256);
    dsim_train_result_free(&r);
    dsim_train_result_free(&ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_padding_masked),   cmocka_unit_test(test_slices),
        cmocka_unit_test(test_static_shapes),    cmocka_unit_test(test_needs_slice),
        cmocka_unit_test(test_bug_one_pipeline), cmocka_unit_test(test_bug_unmasked),
    };
    return cmocka_run_group_tests_name("strategy_tpu", tests, NULL, NULL);
}
