/* Shard coverage from the ledger the replicas fill while training: every
 * example read exactly once per epoch under DATA, FILE and AUTO, and once per
 * worker under OFF, with partial last batches and shuffling on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/strategy.h"
#include "strat_common.h"

static void check_coverage(const char *strategy, int hosts, int devices, int ps,
                           dsim_shard_policy policy, bool in_memory, dsim_shard_policy applied)
{
    dsim_train_cfg cfg;
    sc_cfg(&cfg, strategy, hosts, devices);
    cfg.num_ps = ps;
    cfg.shard = policy;
    cfg.in_memory = in_memory;
    cfg.global_batch = 24; /* 256 = 10 x 24 + 16: a partial last batch */
    cfg.epochs = 2;
    dsim_train_result r;
    if (dsim_train(&cfg, &r) != DSIM_OK)
        fail_msg("%s %dx%d %s: %s", strategy, hosts, devices, dsim_shard_policy_name(policy),
                 dsim_errmsg());
    assert_int_equal(r.shard_applied, applied);
    uint32_t expected = policy == DSIM_SHARD_OFF ? (uint32_t)hosts : 1;
    uint64_t n = cfg.dataset->spec.n_examples;
    for (uint32_t e = 0; e < cfg.epochs; e++) {
        dsim_coverage cov;
        assert_int_equal(dsim_ledger_coverage(r.ledger, e, -1, expected, &cov), DSIM_OK);
        printf("# %-22s %dx%d %-4s%s -> %-4s epoch %u: %llu reads, %llu exact, %llu dup, %llu "
               "missed, %llu steps, imbalance %.2f\n",
               strategy, hosts, devices, dsim_shard_policy_name(policy),
               in_memory ? " (in memory)" : "", dsim_shard_policy_name(r.shard_applied), e,
               (unsigned long long)cov.reads, (unsigned long long)cov.exact,
               (unsigned long long)cov.duplicates, (unsigned long long)cov.misses,
               (unsigned long long)cov.steps, cov.imbalance);
        assert_int_equal(cov.exact, n);
        assert_int_equal(cov.duplicates, 0);
        assert_int_equal(cov.misses, 0);
        assert_int_equal(cov.out_of_range, 0);
        assert_int_equal(cov.reads, n * expected);
        assert_int_equal(cov.steps, r.steps_per_epoch);
        /* What the ledger saw is what the replicas reported per step. */
        uint64_t sum = 0;
        for (uint64_t s = 0; s < r.steps_per_epoch; s++)
            for (int i = 0; i < r.num_replicas; i++)
                sum += r.examples[(e * r.steps_per_epoch + s) * (uint64_t)r.num_replicas +
                                  (uint64_t)i];
        assert_int_equal(sum, n * expected);
        if (policy == DSIM_SHARD_OFF)
            for (int w = 0; w < hosts; w++) {
                assert_int_equal(dsim_ledger_coverage(r.ledger, e, w, 1, &cov), DSIM_OK);
                assert_int_equal(cov.exact, n);
            }
    }
    dsim_train_result_free(&r);
}

static void test_multi_worker(void **state)
{
    (void)state;
    check_coverage("multi_worker_mirrored", 2, 2, 0, DSIM_SHARD_DATA, false, DSIM_SHARD_DATA);
    check_coverage("multi_worker_mirrored", 2, 2, 0, DSIM_SHARD_FILE, false, DSIM_SHARD_FILE);
    check_coverage("multi_worker_mirrored", 2, 2, 0, DSIM_SHARD_AUTO, false, DSIM_SHARD_FILE);
    check_coverage("multi_worker_mirrored", 4, 2, 0, DSIM_SHARD_AUTO, true, DSIM_SHARD_DATA);
    check_coverage("multi_worker_mirrored", 2, 2, 0, DSIM_SHARD_OFF, false, DSIM_SHARD_OFF);
    check_coverage("multi_worker_mirrored", 4, 1, 0, DSIM_SHARD_OFF, true, DSIM_SHARD_OFF);
}

static void test_other_strategies(void **state)
{
    (void)state;
    check_coverage("mirrored", 1, 4, 0, DSIM_SHARD_AUTO, false, DSIM_SHARD_FILE);
    check_coverage("central_storage", 1, 8, 0, DSIM_SHARD_DATA, false, DSIM_SHARD_DATA);
    check_coverage("parameter_server", 4, 1, 2, DSIM_SHARD_FILE, false, DSIM_SHARD_FILE);
    check_coverage("parameter_server", 2, 2, 1, DSIM_SHARD_OFF, false, DSIM_SHARD_OFF);
}

int main(void)
{
    if (!sc_dataset()) {
        fprintf(stderr, "cannot make the dataset: %s\n", dsim_errmsg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_worker),
        cmocka_unit_test(test_other_strategies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
