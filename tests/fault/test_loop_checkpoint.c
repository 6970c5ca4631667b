/* Fault loop over checkpoint writes (ARCHITECTURE.md §6): a job that saves after
 * every step has its 1st, 2nd, 3rd ... checkpoint operation (create the
 * temporary file, write, fsync, rename: the points under dsim/ckpt/) fail with
 * ENOSPC, until a run makes no more. Each time: dsim_train returns DSIM_EIO
 * naming the file and the cause, every replica returns, no temporary file is
 * left, the checkpoint before (if any) is intact and holds that step's
 * variables, and resuming from it ends with the bits of a run never
 * interrupted. Leaks are LeakSanitizer's to find (the sanitizer build). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/strategy.h"
#include "dsim_config.h"
#include "strat_common.h"

#if DSIM_HAVE_FIU
#include "fiu_loop.h"

/* Steps the looped job runs (a checkpoint after each), of 8 per epoch. */
#define CK_STEPS 4

static char ck_dir[64];

static void ck_job(dsim_train_cfg *cfg, const char *strategy, int hosts, int devices, int ps,
                   const char *path)
{
    sc_cfg(cfg, strategy, hosts, devices);
    cfg->num_ps = ps;
    cfg->epochs = 1;
    cfg->timeout_ns = 5LL * 1000 * 1000 * 1000;
    cfg->checkpoint_path = path;
    cfg->checkpoint_every = 1;
    cfg->stop_after = CK_STEPS;
}

static void ck_loop(const char *strategy, int hosts, int devices, int ps)
{
    char path[128], tmp[140];
    snprintf(path, sizeof path, "%s/%s.ckpt", ck_dir, strategy);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const char *enospc = strerror(ENOSPC);

    /* The reference: the whole epoch without checkpoints, every step's
     * variables recorded (replica 0's). */
    dsim_train_cfg cfg;
    dsim_train_result clean;
    ck_job(&cfg, strategy, hosts, devices, ps, NULL);
    cfg.checkpoint_every = 0;
    cfg.stop_after = 0;
    if (dsim_train(&cfg, &clean) != DSIM_OK)
        fail_msg("%s clean: %s", strategy, dsim_errmsg());
    size_t P = clean.n_params;
    assert_true(clean.steps > CK_STEPS);

    int k;
    for (k = 1;; k++) {
        unlink(path);
        unlink(tmp);
        ck_job(&cfg, strategy, hosts, devices, ps, path);
        dsim_train_result r;
        fl_arm("dsim/ckpt/*", k, (void *)(intptr_t)ENOSPC);
        dsim_err e = dsim_train(&cfg, &r);
        fl_disarm();
        int N = r.num_replicas;
        if (!fl_fired()) {
            /* No k-th operation: the run is whole, and its count is k - 1. */
            if (e != DSIM_OK)
                fail_msg("%s, nothing injected: %s", strategy, r.error.msg);
            assert_int_equal(r.checkpoints_written, CK_STEPS);
            assert_int_equal(fl_calls(), k - 1);
            dsim_train_result_free(&r);
            break;
        }
        /* A clear error: EIO, the file, the cause. */
        if (e != DSIM_EIO)
            fail_msg("%s, operation %d failed: dsim_train returned %s: %s", strategy, k,
                     dsim_strerror(e), r.error.msg);
        assert_int_equal(r.error.code, DSIM_EIO);
        if (!strstr(r.error.msg, path) || !strstr(r.error.msg, enospc))
            fail_msg("%s, operation %d: the error does not name %s and \"%s\": %s", strategy, k,
                     path, enospc, r.error.msg);
        /* Every replica returned (a chief that failed aborts the rest). */
        assert_int_equal(r.replicas[0].status, DSIM_EIO);
        for (int i = 1; i < N; i++)
            assert_true(r.replicas[i].status == DSIM_OK || r.replicas[i].status == DSIM_EABORTED);
        /* No temporary file left behind. */
        if (access(tmp, F_OK) == 0)
            fail_msg("%s, operation %d failed: %s was left behind", strategy, k, tmp);
        /* The checkpoint before is intact: the variables after its step. */
        uint64_t saved = r.checkpoints_written;
        assert_true(saved < CK_STEPS);
        dsim_checkpoint *ck = NULL;
        if (saved == 0) {
            assert_int_equal(dsim_checkpoint_read(path, &ck), DSIM_ENOENT);
        } else {
            if (dsim_checkpoint_read(path, &ck) != DSIM_OK)
                fail_msg("%s, operation %d failed: the checkpoint of step %llu is lost: %s",
                         strategy, k, (unsigned long long)saved, dsim_errmsg());
            assert_int_equal(ck->global_step, saved);
            assert_int_equal(ck->n_params, P);
            assert_memory_equal(ck->params, clean.trace + (saved - 1) * P, P * sizeof(float));
            dsim_checkpoint_free(ck);
        }
        if (k <= 4) /* one of each operation */
            printf("# %s, operation %d: %s\n", strategy, k, r.error.msg);
        dsim_train_result_free(&r);

        /* Nothing committed is lost: resumed from it, the job ends as the
         * uninterrupted one does. */
        cfg.stop_after = 0;
        cfg.restore = true;
        cfg.checkpoint_every = 0;
        if (dsim_train(&cfg, &r) != DSIM_OK)
            fail_msg("%s, operation %d failed, then resumed: %s", strategy, k, r.error.msg);
        assert_int_equal(r.first_step, saved);
        assert_memory_equal(r.params, clean.params, P * sizeof(float));
        dsim_train_result_free(&r);
    }
    printf("# %s %dx%d ps %d: %d checkpoint operations over %d checkpoints, each failed in turn "
           "(%d runs)\n",
           strategy, hosts, devices, ps, k - 1, CK_STEPS, k);
    dsim_train_result_free(&clean);
    unlink(path);
}

static void test_loop_multi_worker_mirrored(void **state)
{
    (void)state;
    ck_loop("multi_worker_mirrored", 2, 1, 0);
}

static void test_loop_mirrored(void **state)
{
    (void)state;
    ck_loop("mirrored", 1, 2, 0);
}

static void test_loop_parameter_server(void **state)
{
    (void)state;
    ck_loop("parameter_server", 2, 1, 1);
}

/* One write the chief cannot finish, outside the driver: the same. */
static void test_loop_file(void **state)
{
    (void)state;
    char path[128], tmp[140];
    snprintf(path, sizeof path, "%s/unit.ckpt", ck_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
    dsim_checkpoint ck = {.global_step = 1, .n_params = 3, .params = a};
    assert_int_equal(dsim_checkpoint_write(path, &ck), DSIM_OK);
    ck.global_step = 2;
    ck.params = b;
    int k;
    for (k = 1;; k++) {
        fl_arm("dsim/ckpt/*", k, NULL); /* failinfo 0: EIO */
        dsim_err e = dsim_checkpoint_write(path, &ck);
        fl_disarm();
        if (!fl_fired()) {
            assert_int_equal(e, DSIM_OK);
            break;
        }
        assert_int_equal(e, DSIM_EIO);
        assert_non_null(strstr(dsim_errmsg(), path));
        assert_non_null(strstr(dsim_errmsg(), strerror(EIO)));
        assert_int_not_equal(access(tmp, F_OK), 0);
        dsim_checkpoint *back = NULL;
        assert_int_equal(dsim_checkpoint_read(path, &back), DSIM_OK);
        assert_int_equal(back->global_step, 1);
        assert_memory_equal(back->params, a, sizeof a);
        dsim_checkpoint_free(back);
    }
    /* create, one write, fsync, rename */
    assert_int_equal(k - 1, 4);
    dsim_checkpoint *back = NULL;
    assert_int_equal(dsim_checkpoint_read(path, &back), DSIM_OK);
    assert_int_equal(back->global_step, 2);
    dsim_checkpoint_free(back);
    unlink(path);
}

int main(void)
{
    fl_init();
    snprintf(ck_dir, sizeof ck_dir, "/tmp/dsim-ckloop-XXXXXX");
    if (!mkdtemp(ck_dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loop_file),
        cmocka_unit_test(test_loop_multi_worker_mirrored),
        cmocka_unit_test(test_loop_mirrored),
        cmocka_unit_test(test_loop_parameter_server),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    /* A failed test leaves its files behind. */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ck_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", ck_dir);
    return rc;
}
#else
int main(void)
{
    printf("# built without libfiu: no fault points to loop over\n");
    return 77;
}
#endif
