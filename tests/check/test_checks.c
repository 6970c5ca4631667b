/* The built-in checks and the expect-list runner on hand-made runs: each
 * check passes where it should, fails where it should, and its message
 * names the step, replica, parameter or example ids to look at. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "check/check.h"
#include "check/check_int.h"
#include "dsim/data.h"
#include "dsim/strategy.h"
#include "scenario/scenario.h"
#include "fake_run.h"

/* ---- registry ---- */

static void test_registry(void **state)
{
    (void)state;
    const char *avail[] = {
        "gradient_consistency", "shard_coverage", "convergence",         "node_loss",
        "cold_start",           "performance",    "checkpoint_roundtrip"};
    for (size_t i = 0; i < sizeof avail / sizeof avail[0]; i++) {
        const dsim_check_ops *c = dsim_check_find(avail[i]);
        assert_non_null(c);
        assert_true(c->available);
        assert_non_null(c->run);
        assert_int_equal(c->size, sizeof(dsim_check_ops));
    }
    assert_null(dsim_check_find("gradient"));
    assert_int_equal(dsim_check_count(), 7);
    for (size_t i = 0; i < dsim_check_count(); i++) {
        const dsim_check_ops *c = dsim_check_at(i);
        for (int k = 0; k < c->n_params; k++) {
            const dsim_check_param *p = &c->params[k];
            assert_true(p->min <= p->max);
            if (!isnan(p->def))
                assert_true(p->def >= p->min && p->def <= p->max);
        }
    }
}

/* ---- shard_coverage ---- */

/* A ledger of 2 workers x 1 device, 8 examples, 1 epoch: each step both
 * replicas read 2 ids. counts[id] reads of id; a replica's reads are dealt
 * in order. */
static dsim_ledger *ledger_of(const int *reader, size_t n_reads, int workers, uint32_t epochs)
{
    dsim_ledger *l = NULL;
    assert_int_equal(dsim_ledger_create(8, epochs, workers, 1, &l), DSIM_OK);
    for (uint32_t e = 0; e < epochs; e++) {
        uint64_t step[8] = {0};
        for (size_t i = 0; i < n_reads; i++) {
            if (reader[i] < 0)
                continue;
            uint64_t id = i % 8;
            assert_int_equal(dsim_ledger_record(l, reader[i], e, step[reader[i]]++, &id, 1),
                             DSIM_OK);
        }
    }
    return l;
}

static void test_sc_exact(void **state)
{
    (void)state;
    int reader[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    fake_run f;
    fake_init(&f, 2, 4);
    f.res.shard_applied = DSIM_SHARD_DATA;
    f.res.ledger = ledger_of(reader, 8, 2, 2);
    f.cfg.epochs = 2;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_true(r.passed);
    assert_true(r.measured == 0);
    assert_has(r.message, "every example read once");
    dsim_ledger_destroy(f.res.ledger);
}

static void test_sc_duplicates_and_misses(void **state)
{
    (void)state;
    /* ids 0..7 by reader; then id 0 and 1 again (i = 8, 9 wrap to 0, 1) */
    int reader[10] = {0, 1, 0, 1, 0, 1, 0, 1, 1, 0};
    fake_run f;
    fake_init(&f, 2, 5);
    f.res.shard_applied = DSIM_SHARD_FILE;
    f.res.ledger = ledger_of(reader, 10, 2, 1);
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 2);
    assert_true(r.expected == 0);
    assert_has(r.message, "2 of 8 examples read more than once");
    assert_has(r.message, "example 0 by replicas 0 and 1; example 1 by replicas 0 and 1. The same "
                          "replicas read each of these: their shards overlap");
    dsim_ledger_destroy(f.res.ledger);

    /* ids 3 and 6 never read */
    int missing[8] = {0, 1, 0, -1, 0, 1, -1, 1};
    f.res.ledger = ledger_of(missing, 8, 2, 1);
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 2);
    assert_has(r.message, "2 of 8 examples read less than once");
    assert_has(r.message, "ids 3, 6)");
    values_of(dsim_check_find("shard_coverage"), v, "max_misses", 2.0, NULL);
    r = judge("shard_coverage", &ctx, v);
    assert_true(r.passed);
    dsim_ledger_destroy(f.res.ledger);
}

/* Who read a duplicate, readably: replicas with their workers, a replica
 * that read the same example twice. */
static void test_sc_duplicate_readers(void **state)
{
    (void)state;
    dsim_ledger *l = NULL;
    /* 2 workers x 2 devices; example 5 read by replicas 1 and 2, example 6
     * by replica 3 twice, the rest once */
    assert_int_equal(dsim_ledger_create(8, 1, 2, 2, &l), DSIM_OK);
    uint64_t a[] = {0, 1, 5}, b[] = {2, 3}, c[] = {4, 5}, d[] = {6, 7, 6};
    assert_int_equal(dsim_ledger_record(l, 1, 0, 0, a, 3), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, b, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 2, 0, 0, c, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 3, 0, 0, d, 3), DSIM_OK);
    fake_run f;
    fake_init(&f, 4, 1);
    f.res.devices_per_host = 2;
    f.res.num_workers = 2;
    f.cfg.hosts = 2;
    f.cfg.devices_per_host = 2;
    f.res.shard_applied = DSIM_SHARD_DATA;
    f.res.ledger = l;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "2 of 8 examples read more than once");
    assert_has(r.message, "example 5 by replicas 1 and 2 (workers 0 and 1)");
    assert_has(r.message, "example 6 by replica 3 (worker 1) 2 times");
    dsim_ledger_destroy(l);
}

static void test_sc_policy_off(void **state)
{
    (void)state;
    /* both workers read every id once: once per worker */
    int reader[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    fake_run f;
    fake_init(&f, 2, 8);
    f.res.ledger = ledger_of(reader, 16, 2, 1);
    f.res.shard_applied = DSIM_SHARD_OFF;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "once per worker");

    /* the same reads under a sharding policy are all duplicates */
    f.res.shard_applied = DSIM_SHARD_DATA;
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 8);
    dsim_ledger_destroy(f.res.ledger);

    /* under OFF, one worker reading only half is a miss of half */
    int half[12] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
    f.res.ledger = ledger_of(half, 12, 2, 1);
    f.res.shard_applied = DSIM_SHARD_OFF;
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "read less than once per worker");
    assert_has(r.message, "ids 4, 5, 6, 7)");
    dsim_ledger_destroy(f.res.ledger);
}

static void test_sc_idle_and_imbalance(void **state)
{
    (void)state;
    dsim_ledger *l = NULL;
    assert_int_equal(dsim_ledger_create(8, 1, 2, 1, &l), DSIM_OK);
    /* replica 0 reads 3 ids a step for 2 steps, replica 1 reads 2 then none */
    uint64_t a[3] = {0, 1, 2}, b[3] = {3, 4, 5}, c[2] = {6, 7};
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, a, 3), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 0, 0, c, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 0, 1, b, 3), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 0, 1, NULL, 0), DSIM_OK);
    fake_run f;
    fake_init(&f, 2, 2);
    f.res.ledger = l;
    f.res.shard_applied = DSIM_SHARD_FILE;
    dsim_check_ctx ctx = fake_ctx(&f);
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(dsim_check_find("shard_coverage"), v, NULL);
    assert_true(judge("shard_coverage", &ctx, v).passed); /* no limits by default */

    values_of(dsim_check_find("shard_coverage"), v, "max_idle", 0.0, NULL);
    dsim_check_result r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 1);
    assert_has(r.message, "step 1 replica 1");

    values_of(dsim_check_find("shard_coverage"), v, "max_imbalance", 2.0, NULL);
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_true(r.measured == 3);
    assert_has(r.message, "replica 0 read 6 examples, replica 1 read 2");
    values_of(dsim_check_find("shard_coverage"), v, "max_imbalance", 3.0, NULL);
    assert_true(judge("shard_coverage", &ctx, v).passed);

    /* no ledger: nothing to judge */
    f.res.ledger = NULL;
    r = judge("shard_coverage", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "no coverage ledger");
    dsim_ledger_destroy(l);
}

/* ---- naming lost ranks ---- */

static void test_ranks_text(void **state)
{
    (void)state;
    char buf[160];
    bool lost[8] = {false};
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "no rank");
    lost[2] = lost[3] = true;
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "ranks 2-3 (worker 1)");
    lost[3] = false;
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "rank 2 (worker 1)");
    lost[1] = lost[3] = lost[5] = lost[6] = true;
    dsim_check_ranks_text(lost, 8, 6, 2, buf, sizeof buf);
    assert_string_equal(buf, "ranks 1 (worker 0), 2-3 (worker 1), 5 (worker 2) and parameter "
                             "server 0 (rank 6)");
}

/* ---- convergence ---- */

static void test_convergence(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    f.res.final_loss = 0.51;
    f.ref.final_loss = 0.5;
    dsim_check_ctx ctx = fake_ctx(&f);
    const dsim_check_ops *ops = dsim_check_find("convergence");
    double v[DSIM_CHECK_MAX_PARAMS];

    values_of(ops, v, NULL);
    dsim_check_result r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "max_final_loss");
    assert_has(r.message, "within_pct_of_reference");
    assert_false(ops->wants_reference(v));

    values_of(ops, v, "max_final_loss", 0.6, NULL);
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_true(r.measured == 0.51 && r.expected == 0.6);
    values_of(ops, v, "max_final_loss", 0.5, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "ABOVE max_final_loss 0.5");

    values_of(ops, v, "within_pct_of_reference", 5.0, NULL);
    assert_true(ops->wants_reference(v));
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_true(fabs(r.expected - 0.525) < 1e-12);
    values_of(ops, v, "within_pct_of_reference", 1.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "2% above");

    /* two-sided: 7 % below the reference is outside a 1 % band too */
    f.res.final_loss = 0.465;
    values_of(ops, v, "within_pct_of_reference", 1.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "7% below the one-device reference's 0.5 (OUTSIDE the 1% allowed either "
                          "side)");
    assert_has(r.message, "did not compute what they compute");
    assert_true(fabs(r.expected - 0.495) < 1e-12);
    values_of(ops, v, "within_pct_of_reference", 8.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "within the 8% allowed either side");
    /* asynchronous parameter servers: every replica's gradient an update
     * of its own, so no wrong reduction is suspected */
    f.cfg.num_ps = 1;
    f.cfg.ps_mode = DSIM_PS_ASYNC;
    f.cfg.optim.kind = DSIM_OPTIM_ADAM;
    values_of(ops, v, "within_pct_of_reference", 1.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "asynchronous parameter servers apply each replica's gradient as an "
                          "update of its own (2 a global step");
    assert_has(r.message, "an adaptive or momentum optimizer");
    assert_null(strstr(r.message, "did not compute what they compute"));
    f.cfg.num_ps = 0;
    f.cfg.ps_mode = DSIM_PS_SYNC;
    f.cfg.optim.kind = DSIM_OPTIM_SGD;
    f.res.final_loss = 0.51;

    /* both: the tighter bound is shown and both must hold */
    values_of(ops, v, "within_pct_of_reference", 5.0, "max_final_loss", 0.52, NULL);
    r = judge("convergence", &ctx, v);
    assert_true(r.passed);
    assert_true(r.expected == 0.52);
    values_of(ops, v, "within_pct_of_reference", 5.0, "max_final_loss", 0.505, NULL);
    assert_false(judge("convergence", &ctx, v).passed);

    ctx.reference = NULL;
    values_of(ops, v, "within_pct_of_reference", 5.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "no one-device reference");

    f.res.final_loss = NAN;
    values_of(ops, v, "max_final_loss", 10.0, NULL);
    r = judge("convergence", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "diverged");
}

/* ---- the expect-list runner ---- */

static dsim_expect expect_of(const char *name, int expect_fail, ...)
{
    dsim_expect e;
    memset(&e, 0, sizeof e);
    e.check = dsim_check_find(name);
    assert_non_null(e.check);
    for (int i = 0; i < e.check->n_params; i++)
        e.values[i] = e.check->params[i].def;
    va_list ap;
    va_start(ap, expect_fail);
    const char *key;
    while ((key = va_arg(ap, const char *)) != NULL) {
        int k = dsim_check_param_index(e.check, key);
        assert_true(k >= 0);
        e.values[k] = va_arg(ap, double);
    }
    va_end(ap);
    e.expect_fail = expect_fail != 0;
    return e;
}

static void test_run_all_expect_fail(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    f.params[0] = 2 * f.ref_params[0]; /* gradient_consistency fails for real */
    dsim_expect ex[3] = {
        expect_of("gradient_consistency", true, NULL),
        expect_of("convergence", false, "max_final_loss", 1.0, NULL),
        expect_of("convergence", true, "max_final_loss", 1.0, NULL),
    };
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    s.expect = ex;
    s.n_expect = 3;
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    assert_true(dsim_check_needs_reference(&s));
    assert_int_equal(dsim_check_outcome_count(&s), 3);
    dsim_check_outcome out[3];
    size_t n = 0, failed = 0;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 3);
    assert_int_equal(failed, 1);
    /* expected to fail and failed: met */
    assert_string_equal(out[0].name, "gradient_consistency");
    assert_true(out[0].expect_fail);
    assert_false(out[0].check_passed);
    assert_true(out[0].passed);
    assert_has(out[0].result.message, "failed as expected");
    assert_true(out[1].passed);
    /* expected to fail but passed: not met */
    assert_true(out[2].check_passed);
    assert_false(out[2].passed);
    assert_has(out[2].result.message, "expected to fail, but passed");

    /* a run that did not finish fails every row, expect_fail ones too */
    ctx.run_err = DSIM_ETIMEDOUT;
    snprintf(f.res.error.msg, sizeof f.res.error.msg, "replica 2 timed out in allreduce");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_false(out[i].passed);
        assert_has(out[i].result.message, "replica 2 timed out");
    }
}

static void test_run_all_expect_error(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 0);
    dsim_expect ex[1] = {expect_of("gradient_consistency", false, NULL)};
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    s.expect = ex;
    s.n_expect = 1;
    s.expect_error = "fewer than the";
    assert_false(dsim_check_needs_reference(&s));
    assert_int_equal(dsim_check_outcome_count(&s), 1);
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    dsim_check_outcome out[1];
    size_t n = 0, failed = 0;

    ctx.run_err = DSIM_EINVAL;
    snprintf(f.res.error.msg, sizeof f.res.error.msg,
             "the dataset has 2 file(s), fewer than the 4 workers");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(failed, 0);
    assert_string_equal(out[0].name, "error");
    assert_true(out[0].passed);
    assert_has(out[0].result.message, "2 file(s)");

    snprintf(f.res.error.msg, sizeof f.res.error.msg, "out of memory");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 1);
    assert_has(out[0].result.message, "does not contain \"fewer than the\"");

    ctx.run_err = DSIM_OK;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 1);
    assert_has(out[0].result.message, "the run succeeded");
}

/* No expect section: nothing is judged, but a run that failed is a failure. */
static void test_run_all_no_expectations(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 0);
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    assert_false(dsim_check_needs_reference(&s));
    assert_int_equal(dsim_check_outcome_count(&s), 1);
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    dsim_check_outcome out[1];
    size_t n = 9, failed = 9;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(failed, 0);

    ctx.run_err = DSIM_ENOMEM;
    snprintf(f.res.error.msg, sizeof f.res.error.msg, "cannot allocate 4294967296 examples");
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(failed, 1);
    assert_string_equal(out[0].name, "run");
    assert_false(out[0].passed);
    assert_has(out[0].result.message, "the run failed: cannot allocate");
}

static void test_run_all_unavailable_and_reference(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    /* every built-in check runs: a table declared for scenarios but not yet
     * runnable stands in for one */
    static const dsim_check_ops later = {
        .size = sizeof(dsim_check_ops), .name = "later", .summary = "not yet", .available = false};
    dsim_expect ex[2] = {
        expect_of("convergence", true, NULL),
        expect_of("convergence", false, "max_final_loss", 1.0, NULL),
    };
    ex[0].check = &later;
    dsim_scenario s;
    memset(&s, 0, sizeof s);
    s.expect = ex;
    s.n_expect = 2;
    /* convergence with only a bound does not need the reference */
    assert_false(dsim_check_needs_reference(&s));
    ex[1] = expect_of("convergence", false, "within_pct_of_reference", 10.0, NULL);
    assert_true(dsim_check_needs_reference(&s));

    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.scenario = &s;
    dsim_check_outcome out[2];
    size_t n = 0, failed = 0;
    assert_int_equal(dsim_check_run_all(&ctx, out, &n, &failed), DSIM_OK);
    assert_int_equal(failed, 1);
    /* an unavailable check cannot meet "expect: fail" */
    assert_false(out[0].passed);
    assert_has(out[0].result.message, "not available");
    assert_true(out[1].passed);

    assert_int_equal(dsim_check_run_all(NULL, out, &n, &failed), DSIM_EINVAL);
}

/* ---- performance ---- */

/* node_loss on a job whose broken attempt failed before any replica started
 * (a setup error, no node lost): it says so, rather than calling the
 * replicas stuck; a replica that is stuck stays reported as one. */
static void test_node_loss_setup_failure(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 4, 0);
    dsim_train_replica_end ends[4];
    memset(ends, 0, sizeof ends);
    dsim_train_result broken = f.res;
    broken.replicas = ends;
    snprintf(broken.error.msg, sizeof broken.error.msg,
             "mirrored runs on one worker without parameter servers");
    dsim_check_faults fx = {.broken = &broken,
                            .broken_err = DSIM_EINVAL,
                            .lost_rank = -1,
                            .t_loss = -1,
                            .bound_ns = 1000000000};
    dsim_check_ctx ctx = fake_ctx(&f);
    ctx.run = &broken;
    ctx.run_err = DSIM_EINVAL;
    ctx.faults = &fx;
    ctx.n_faults = 1;
    const dsim_check_ops *ops = dsim_check_find("node_loss");
    double v[DSIM_CHECK_MAX_PARAMS];
    values_of(ops, v, NULL);
    dsim_check_result r = judge("node_loss", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "failed before its replicas started: mirrored runs on one worker");
    if (strstr(r.message, "never returned") || strstr(r.message, "rank -1"))
        fail_msg("a setup failure read as a hang: %s", r.message);
    /* the same ends with a replica the watchdog found stuck: a hang */
    fx.broken_err = DSIM_EHUNG;
    ctx.run_err = DSIM_EHUNG;
    ends[2].status = DSIM_EHUNG;
    r = judge("node_loss", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "replica 0 never returned");
}

/* What a saved checkpoint's wrong optimizer slots look like: none copied,
 * one replica's shard of a sharded state (ZeRO) with the rest zero, or
 * other values. Adam: 2 slot arrays of 6 parameters. */
static void test_saved_slots(void **state)
{
    (void)state;
    float want[12], got[12];
    for (int i = 0; i < 12; i++)
        want[i] = 0.5f + (float)i;
    want[4] = want[10] = 0.0f; /* a parameter whose moments are legitimately 0 */
    dsim_train_result ref = {.optim_state = want, .optim_state_len = 12, .optim_step = 7};
    dsim_checkpoint ck = {.n_params = 6,
                          .optim_state = got,
                          .optim_state_len = 12,
                          .optim_step = 7,
                          .global_step = 7};
    char msg[1024];
    const char *which;
    double m;
    const ck_tol f32 = {.max_abs = 1e-6, .max_rel = 1e-4};
    dsim_optim_spec adam, mom, ada;
    dsim_optim_spec_default(&adam, DSIM_OPTIM_ADAM);
    dsim_optim_spec_default(&mom, DSIM_OPTIM_MOMENTUM);
    dsim_optim_spec_default(&ada, DSIM_OPTIM_ADAGRAD);

    memset(got, 0, sizeof got);
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &f32, msg, sizeof msg, &which, &m));
    assert_string_equal(which, "optimizer state");
    assert_has(msg, "restored without them, Adam's moments restart from zero");
    assert_has(msg, "worst: slot value 0 (Adam's m of parameter 0) is 0, it was 0.5");
    /* with the model's variables (a linear model of 1 feature, 3 outputs):
     * where the parameter lies */
    dsim_model_spec lin = {.kind = DSIM_MODEL_LINEAR, .in_dim = 1, .out_dim = 3};
    ref.n_vars = dsim_model_vars(&lin, ref.vars);
    got[0] = want[0];
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &f32, msg, sizeof msg, &which, &m));
    assert_has(msg, "worst: slot value 1 (Adam's m of parameter 1, layer 1's kernel [1 x 3] at "
                    "[0, 1]) is 0");
    ref.n_vars = 0;

    /* parameters 3..5 (shard 1 of 2, with the zero one inside it) */
    memset(got, 0, sizeof got);
    for (int s = 0; s < 2; s++)
        for (int p = 3; p < 6; p++)
            got[s * 6 + p] = want[s * 6 + p];
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &f32, msg, sizeof msg, &which, &m));
    assert_has(msg, "Only the slots of parameters 3..5 (3 of 6) were saved, the rest are zero");
    assert_null(strstr(msg, "restart from zero"));

    /* the same shard, but one value outside it is not zero: not a shard */
    got[1] = 9.0f;
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &mom, &f32, msg, sizeof msg, &which, &m));
    assert_null(strstr(msg, "Only the slots"));
    assert_has(msg, "restored from these, the momentum resumes from other values");

    /* all right: nothing to say */
    memcpy(got, want, sizeof got);
    assert_false(ck_judge_saved_optimizer(&ck, &ref, &adam, &f32, msg, sizeof msg, &which, &m));
    /* Adagrad's accumulators saved right but started at 0, not init's
     * 0.1: the replay's less 0.1 at every parameter (one slot of 12) */
    dsim_checkpoint ck1 = ck;
    ck1.n_params = 12;
    for (int i = 0; i < 12; i++)
        got[i] = want[i] - 0.1f;
    assert_true(ck_judge_saved_optimizer(&ck1, &ref, &ada, &f32, msg, sizeof msg, &which, &m));
    assert_has(msg, "less initial_accumulator_value (0.1) at every parameter: save() copied "
                    "them, but they started at 0");
    /* off by other amounts: save() is what differs */
    got[3] = want[3] - 0.3f;
    assert_true(ck_judge_saved_optimizer(&ck1, &ref, &ada, &f32, msg, sizeof msg, &which, &m));
    assert_null(strstr(msg, "started at 0"));
    assert_has(msg, "Adagrad's accumulators resume from other values");
}

/* A run that rounds its gradients to float16 (Horovod's compression) has
 * slots a few u of their size from one device's: a moment near zero (its
 * gradients cancel) is judged with its slot as a whole, so a correct save
 * passes; slots never copied, or a step old, still fail. */
static void test_saved_slots_narrow(void **state)
{
    (void)state;
    dsim_train_result run = {.precision = DSIM_POLICY_FLOAT32, .gradient_dtype = DSIM_F16};
    const double unset[2] = {NAN, NAN};
    ck_tol tol, f32;
    ck_tolerances(&run, unset, &tol);
    assert_true(tol.scaled);
    assert_true(fabs(tol.max_rel - 16.0 / 2048) < 1e-12);
    run.gradient_dtype = DSIM_F32;
    ck_tolerances(&run, unset, &f32);
    assert_false(f32.scaled);
    assert_true(f32.max_rel == 1e-4 && f32.max_abs == 1e-6);
    /* a scenario's own figures are kept */
    const double mine[2] = {0.01, 0.5};
    ck_tolerances(&run, mine, &f32);
    assert_true(f32.max_rel == 0.01 && f32.max_abs == 0.5);
    f32 = (ck_tol){.max_abs = 1e-6, .max_rel = 1e-4};

    /* a linear model of 2 features, 2 outputs (kernel 4, bias 2), Adam */
    dsim_model_spec lin = {.kind = DSIM_MODEL_LINEAR, .in_dim = 2, .out_dim = 2};
    dsim_train_result ref = {.optim_step = 5};
    ref.n_vars = dsim_model_vars(&lin, ref.vars);
    float want[12] = {0.02f, -0.03f, 0.025f, 2e-5f, 0.01f, -0.01f,
                      4e-4f, 9e-4f,  6e-4f,  5e-4f, 1e-4f, 1e-4f};
    float got[12];
    ref.optim_state = want;
    ref.optim_state_len = 12;
    dsim_checkpoint ck = {.n_params = 6,
                          .optim_state = got,
                          .optim_state_len = 12,
                          .optim_step = 5,
                          .global_step = 5};
    dsim_optim_spec adam;
    dsim_optim_spec_default(&adam, DSIM_OPTIM_ADAM);
    char msg[1024];
    const char *which;
    double m;
    /* every value 0.2 % off, and the kernel's m near zero 3e-5 off (1.5x
     * its own size, 0.13 % of the kernel's m) */
    for (int i = 0; i < 12; i++)
        got[i] = want[i] * 1.002f;
    got[3] = want[3] + 3e-5f;
    assert_false(ck_judge_saved_optimizer(&ck, &ref, &adam, &tol, msg, sizeof msg, &which, &m));
    /* judged as a whole: each slot 0.2 % of its norm off */
    assert_true(m > 1.9e-3 && m < 2.5e-3);
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &f32, msg, sizeof msg, &which, &m));
    assert_has(msg, "worst: slot value 3 (Adam's m of parameter 3, layer 1's kernel [2 x 2]");
    /* a slot off by 1 % as a whole, though each value is within 16 u of
     * its variable's size: beyond 16 u of float16 as a whole */
    for (int i = 0; i < 12; i++)
        got[i] = want[i] * (i < 6 ? 1.01f : 1.0f);
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &tol, msg, sizeof msg, &which, &m));
    assert_has(msg, "Under a narrow dtype each slot is judged as a whole: the worst is 0.01 of its "
                    "norm from the replay's (beyond 0.00781)");
    /* a NaN where the replay has one too (a run that blew up alike) is
     * no difference; one where it has a number is */
    memcpy(got, want, sizeof got);
    float keep = want[7];
    want[7] = got[7] = NAN;
    assert_false(ck_judge_saved_optimizer(&ck, &ref, &adam, &tol, msg, sizeof msg, &which, &m));
    want[7] = keep;
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &tol, msg, sizeof msg, &which, &m));
    assert_true(isinf(m));
    got[7] = want[7];
    /* a step old: m 10 % off */
    for (int i = 0; i < 12; i++)
        got[i] = want[i] * (i < 6 ? 0.9f : 1.0f);
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &tol, msg, sizeof msg, &which, &m));
    assert_string_equal(which, "optimizer state");
    /* never copied */
    memset(got, 0, sizeof got);
    assert_true(ck_judge_saved_optimizer(&ck, &ref, &adam, &tol, msg, sizeof msg, &which, &m));
    assert_has(msg, "restored without them, Adam's moments restart from zero");
}

static void test_performance(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 4, 5);
    /* steps 1..4 count (step 0 is warm-up): 10 ms each, 3 ms of it in the
     * exchange; replica 2 computes 28 ms against the others' 7 */
    int64_t step[20], comm[20], ref_step[5] = {0}, ref_comm[5] = {0};
    for (int k = 0; k < 5; k++)
        for (int r = 0; r < 4; r++) {
            step[k * 4 + r] = k == 0 ? 1000000000 : 10000000;
            comm[k * 4 + r] = k == 0 ? 0 : 3000000;
        }
    f.res.step_ns = step;
    f.res.comm_ns = comm;
    f.ref.step_ns = ref_step;
    f.ref.comm_ns = ref_comm;
    const dsim_check_ops *ops = dsim_check_find("performance");
    double v[DSIM_CHECK_MAX_PARAMS];
    dsim_check_ctx ctx = fake_ctx(&f);

    values_of(ops, v, NULL); /* max share 0.2 */
    ctx.host_cpus = 4;
    dsim_check_result r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 0.3) < 1e-12);
    assert_has(r.message, "all-reduce takes 30 %");
    assert_null(strstr(r.message, "took turns"));
    /* more replicas than CPUs on a wall-clock engine: the share measures
     * the host's time-sharing, so it is not judged (N/A), and said why */
    ctx.host_cpus = 2;
    r = judge("performance", &ctx, v);
    assert_true(r.not_judged);
    assert_has(r.message, "not judged: its 4 replicas took turns on this host's 2 CPUs (engine "
                          "threads), so each one's wait for the others' compute counted as "
                          "all-reduce (30 % of step time)");
    assert_has(r.message, "engine sim times the job");
    f.cfg.engine = "processes";
    assert_has(judge("performance", &ctx, v).message, "(engine processes)");
    f.cfg.engine = "sim"; /* virtual time: no turns to speak of, judged */
    r = judge("performance", &ctx, v);
    assert_false(r.not_judged);
    assert_false(r.passed);
    assert_null(strstr(r.message, "took turns"));
    f.cfg.engine = NULL;
    ctx.host_cpus = 4;
    assert_false(judge("performance", &ctx, v).not_judged);
    /* and through the expect list: N/A, neither passed nor failed, an
     * expectation to fail included */
    ctx.host_cpus = 2;
    for (int want_fail = 0; want_fail < 2; want_fail++) {
        dsim_expect ex = expect_of("performance", want_fail, NULL);
        dsim_scenario sc;
        memset(&sc, 0, sizeof sc);
        sc.expect = &ex;
        sc.n_expect = 1;
        dsim_check_ctx c2 = ctx;
        c2.scenario = &sc;
        dsim_check_outcome out;
        size_t n = 0, failed = 0;
        assert_int_equal(dsim_check_run_all(&c2, &out, &n, &failed), DSIM_OK);
        assert_int_equal(n, 1);
        assert_int_equal(failed, 0);
        assert_true(out.not_applicable);
        assert_true(out.passed);
        assert_has(out.result.message, "not judged: its 4 replicas took turns");
    }
    ctx.host_cpus = 4;

    values_of(ops, v, "max_allreduce_share", 0.5, NULL);
    r = judge("performance", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "all-reduce 30 %");

    /* a straggler: replica 2 computes 4x the others */
    for (int k = 1; k < 5; k++)
        step[k * 4 + 2] = 31000000; /* 28 ms compute + 3 ms exchange */
    values_of(ops, v, "max_allreduce_share", 0.5, "max_straggler_factor", 2.0, NULL);
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 4.0) < 1e-12);
    assert_has(r.message, "replica 2 is a straggler");
    assert_has(r.message, "4.00x");
    assert_null(strstr(r.message, "took turns"));
    /* taking turns (4 replicas on 2 CPUs), 4x is within the 2 x 2 that
     * waiting for a CPU explains: not judged, and said why */
    ctx.host_cpus = 2;
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(r.not_judged);
    assert_true(fabs(r.measured - 4.0) < 1e-12 && r.expected == 2.0);
    assert_has(r.message, "not judged: replica 2 computes 4.00x the other replicas' median "
                          "(max_straggler_factor 2), but its 4 replicas took turns on this "
                          "host's 2 CPUs (engine threads), so one that waited for a CPU "
                          "mid-compute looks slow, up to 4x here (2 x 2 replicas a CPU)");
    /* beyond it, the replica is slow of its own: it fails */
    values_of(ops, v, "max_allreduce_share", 0.5, "max_straggler_factor", 1.5, NULL);
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_false(r.not_judged);
    assert_has(r.message, "replica 2 is a straggler");
    assert_has(r.message, "took turns on this host's 2 CPUs (engine threads), so one that waited "
                          "for a CPU mid-compute looks slow, but by at most the 2 replicas a "
                          "CPU ran: this one is slower than that");
    ctx.host_cpus = 4;
    values_of(ops, v, "max_allreduce_share", 0.5, "max_straggler_factor", 5.0, NULL);
    assert_true(judge("performance", &ctx, v).passed);
    /* taking turns, the straggler alone is judged: no straggler passes */
    ctx.host_cpus = 2;
    r = judge("performance", &ctx, v);
    assert_true(r.passed);
    assert_false(r.not_judged);
    assert_true(fabs(r.measured - 4.0) < 1e-12 && r.expected == 5.0);
    assert_has(r.message, "no straggler: the slowest replica, 2, computes 4.00x");
    assert_has(r.message, "the all-reduce share and scaling efficiency not judged");
    ctx.host_cpus = 4;

    /* scaling: one device takes 62 ms a step; 4 replicas take 31 (the
     * slowest): 62 / (4 x 31) = 0.5 */
    for (int k = 0; k < 5; k++)
        ref_step[k] = 62000000;
    values_of(ops, v, "max_allreduce_share", 0.5, "min_scaling_efficiency", 0.6, NULL);
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_true(fabs(r.measured - 0.5) < 1e-12);
    assert_has(r.message, "scaling efficiency 0.50 with 4 replicas");
    values_of(ops, v, "max_allreduce_share", 0.5, "min_scaling_efficiency", 0.4, NULL);
    r = judge("performance", &ctx, v);
    assert_true(r.passed);
    assert_has(r.message, "scaling efficiency 0.50");
    assert_true(ops->wants_reference(v));

    /* no step times (a run that kept none): not judged as a pass */
    f.res.step_ns = NULL;
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "no step times");
    /* without the reference, efficiency cannot be judged */
    f.res.step_ns = step;
    ctx.reference = NULL;
    r = judge("performance", &ctx, v);
    assert_false(r.passed);
    assert_has(r.message, "one-device replay");
}

/* cold_start: the slowest replica of each phase and the total, against
 * the bounds; no bound set, or no replica that took a step, is a failure
 * that says what to do. */
static void test_cold_start(void **state)
{
    (void)state;
    fake_run f;
    fake_init(&f, 2, 2);
    dsim_train_replica_end ends[2];
    memset(ends, 0, sizeof ends);
    const int64_t S = 1000000000LL;
    f.res.t_start = 10 * S;
    for (int i = 0; i < 2; i++) {
        ends[i].t_first[DSIM_PHASE_START] = 10 * S + i * S;    /* 0 s, 1 s late */
        ends[i].t_first[DSIM_PHASE_RENDEZVOUS] = 12 * S;       /* waits */
        ends[i].t_first[DSIM_PHASE_CREATE_VARIABLES] = 13 * S; /* rendezvous 1 s */
        ends[i].t_first[DSIM_PHASE_COMPUTE] = 13 * S + S / 2;  /* broadcast 0.5 s */
        ends[i].t_first_step = 14 * S + i * (S / 4);           /* 4 s, 4.25 s */
    }
    f.res.replicas = ends;
    const dsim_check_ops *cs = dsim_check_find("cold_start");
    assert_non_null(cs);
    double v[DSIM_CHECK_MAX_PARAMS];
    for (int k = 0; k < DSIM_CHECK_MAX_PARAMS; k++)
        v[k] = NAN;
    dsim_check_ctx ctx = fake_ctx(&f);
    dsim_check_result res;
    /* no bound */
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_has(res.message, "max_first_step_s");
    /* max_first_step_s 5: the total is 4.25 s, replica 1 last */
    v[dsim_check_param_index(cs, "max_first_step_s")] = 5;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_true(res.passed);
    assert_true(fabs(res.measured - 4.25) < 1e-9);
    assert_has(res.message, "replica 1 last");
    assert_has(res.message, "start 1 s (replica 1)");
    /* growth: 2 + 1 x 2 workers = 4 s is tighter and missed */
    v[dsim_check_param_index(cs, "total_base_s")] = 2;
    v[dsim_check_param_index(cs, "total_per_worker_s")] = 1;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_true(fabs(res.expected - 4) < 1e-9);
    assert_has(res.message, "OVER the 4 s allowed");
    /* a phase bound alone: the broadcast took 0.5 s */
    for (int k = 0; k < DSIM_CHECK_MAX_PARAMS; k++)
        v[k] = NAN;
    v[dsim_check_param_index(cs, "max_broadcast_s")] = 0.25;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_has(res.message, "broadcast 0.5 s (replica 0) OVER its bound");
    /* nobody took a first step */
    ends[0].t_first_step = ends[1].t_first_step = 0;
    assert_int_equal(cs->run(&ctx, v, &res), DSIM_OK);
    assert_false(res.passed);
    assert_has(res.message, "never formed");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_cold_start),
        cmocka_unit_test(test_sc_exact),
        cmocka_unit_test(test_sc_duplicates_and_misses),
        cmocka_unit_test(test_sc_duplicate_readers),
        cmocka_unit_test(test_sc_policy_off),
        cmocka_unit_test(test_sc_idle_and_imbalance),
        cmocka_unit_test(test_convergence),
        cmocka_unit_test(test_ranks_text),
        cmocka_unit_test(test_node_loss_setup_failure),
        cmocka_unit_test(test_performance),
        cmocka_unit_test(test_saved_slots),
        cmocka_unit_test(test_saved_slots_narrow),
        cmocka_unit_test(test_run_all_expect_fail),
        cmocka_unit_test(test_run_all_expect_error),
        cmocka_unit_test(test_run_all_no_expectations),
        cmocka_unit_test(test_run_all_unavailable_and_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
