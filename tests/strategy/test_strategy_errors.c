/* Bad input gets a clear error, never a crash or a hang: cluster shapes a
 * strategy refuses, unknown names, broken plugins, incomplete tables, bad
 * configuration values, and a replica that fails mid-step (every other
 * replica and server must return promptly, not wait for its timeout). */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/log.h"
#include "dsim/spi/strategy.h"
#include "dsim/strategy.h"
#include "strat_common.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* dsim_train fails with `code` and a message holding every needle. */
static void expect_fail(dsim_train_cfg *cfg, dsim_err code, const char *const *needles)
{
    dsim_train_result res;
    dsim_err e = dsim_train(cfg, &res);
    const char *msg = dsim_errmsg();
    printf("# %s\n", msg);
    if (e != code)
        fail_msg("expected %s, got %s: %s", dsim_strerror(code), dsim_strerror(e), msg);
    assert_int_equal(res.error.code, code);
    for (; needles && *needles; needles++)
        if (!strstr(msg, *needles))
            fail_msg("message \"%s\" lacks \"%s\"", msg, *needles);
    dsim_train_result_free(&res);
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_bad_shapes(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "one_device", 1, 2);
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("one_device", "exactly 1 replica", "1 host(s) x 2"));
    sc_cfg(&cfg, "one_device", 1, 1);
    cfg.num_ps = 1;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("one_device", "1 ps"));
    sc_cfg(&cfg, "mirrored", 2, 2);
    expect_fail(&cfg, DSIM_EINVAL,
                NEEDLES("mirrored runs on one worker", "2 host(s) x 2", "multi_worker_mirrored"));
    sc_cfg(&cfg, "central_storage", 3, 1);
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("central_storage", "3 host(s) x 1"));
    sc_cfg(&cfg, "multi_worker_mirrored", 2, 1);
    cfg.num_ps = 2;
    expect_fail(&cfg, DSIM_EINVAL,
                NEEDLES("multi_worker_mirrored", "no parameter servers", "2 ps"));
    sc_cfg(&cfg, "parameter_server", 2, 1);
    cfg.num_ps = 0;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("parameter_server", "at least 1 parameter server"));
}

static void test_unknown_strategy(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "no_such_strategy", 1, 1);
    expect_fail(&cfg, DSIM_ENOENT,
                NEEDLES("no_such_strategy", "one_device", "mirrored", "multi_worker_mirrored",
                        "central_storage", "parameter_server"));
    sc_cfg(&cfg, NULL, 1, 1);
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("no strategy given", "mirrored"));
    char names[512];
    assert_true(dsim_strategy_list(names, sizeof names) >= 5);
    assert_non_null(strstr(names, "parameter_server"));
    assert_false(dsim_strategy_exists("no_such_strategy"));
    assert_true(dsim_strategy_exists("central_storage"));
    assert_non_null(dsim_strategy_summary("mirrored"));
}

static void test_bad_config(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "mirrored", 1, 0);
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("0 device(s)"));
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.global_batch = 0;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("global_batch"));
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.communication = (dsim_algo)42;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("communication", "ring"));
    sc_cfg(&cfg, "parameter_server", 1, 2);
    cfg.num_ps = 1;
    cfg.ps_mode = (dsim_ps_mode)9;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("ps_mode"));
    sc_cfg(&cfg, "parameter_server", 512, 16);
    cfg.num_ps = 8; /* 8192 replicas + 8 x 8192 serving workers */
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("73728 runtime workers", "at most 65536"));
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.checkpoint_every = 3;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("checkpoint_path"));
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.optim.lr = -1;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("lr"));
    /* What the built-in parameter servers and central storage cannot do is
     * refused before the job, not left to fail at the first step as a
     * strategy's bug would. */
    sc_cfg(&cfg, "parameter_server", 2, 1);
    cfg.num_ps = 1;
    cfg.optim.global_clipnorm = 1.0;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("parameter_server does not clip by the global norm"));
    sc_cfg(&cfg, "parameter_server", 2, 1);
    cfg.num_ps = 1;
    cfg.precision = DSIM_POLICY_MIXED_FLOAT16;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("parameter_server does not run mixed_float16"));
    sc_cfg(&cfg, "central_storage", 1, 2);
    cfg.gradient_dtype = DSIM_F16;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("central_storage sends the gradients to the host"));
    /* FILE sharding with fewer files than workers is the input's error,
     * naming both counts. */
    dsim_dataset_spec ds;
    memset(&ds, 0, sizeof ds);
    ds.kind = DSIM_DATA_CLASSIFICATION;
    ds.n_examples = 64;
    ds.in_dim = 4;
    ds.out_dim = 3;
    ds.seed = 3;
    ds.n_files = 2;
    sc_cfg(&cfg, "multi_worker_mirrored", 4, 1);
    cfg.dataset = NULL;
    cfg.data = ds;
    cfg.shard = DSIM_SHARD_FILE;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("2", "4"));
    assert_int_equal(dsim_ps_mode_parse("async", &cfg.ps_mode), DSIM_OK);
    assert_int_equal(cfg.ps_mode, DSIM_PS_ASYNC);
    assert_int_equal(dsim_ps_mode_parse("sometimes", &cfg.ps_mode), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "sync or async"));
}

static void test_plugin_errors(void **state)
{
    (void)state;
    const char *missing = "/nonexistent/dir/libno_such_strategy.so";
    assert_int_equal(dsim_strategy_load("x", missing), DSIM_ENOENT);
    printf("# %s\n", dsim_errmsg());
    assert_non_null(strstr(dsim_errmsg(), missing));
    assert_non_null(strstr(dsim_errmsg(), "cannot load strategy plugin"));

    const char *nosym = sc_plugin("DSIM_BAD_PLUGIN_NOSYM");
    const char *abi = sc_plugin("DSIM_BAD_PLUGIN_ABI");
    const char *incomplete = sc_plugin("DSIM_BAD_PLUGIN_MISSING");
    if (!nosym || !abi || !incomplete)
        skip();
    assert_int_equal(dsim_strategy_load("nosym", nosym), DSIM_EINVAL);
    printf("# %s\n", dsim_errmsg());
    assert_non_null(strstr(dsim_errmsg(), nosym));
    assert_non_null(strstr(dsim_errmsg(), "dsim_strategy_plugin"));
    assert_non_null(strstr(dsim_errmsg(), "examples/custom_strategy"));

    assert_int_equal(dsim_strategy_load("abi", abi), DSIM_EINVAL);
    printf("# %s\n", dsim_errmsg());
    assert_non_null(strstr(dsim_errmsg(), abi));
    assert_non_null(strstr(dsim_errmsg(), "ABI version"));
    assert_non_null(strstr(dsim_errmsg(), "a newer dsim"));

    /* A plugin built against version 1 (before sub-communicators): which
     * version it has, which this is, and what to rebuild against what. */
    const char *v1 = sc_plugin("DSIM_BAD_PLUGIN_ABI_V1");
    if (v1) {
        assert_int_equal(dsim_strategy_load("bad_plugin", v1), DSIM_EINVAL);
        printf("# %s\n", dsim_errmsg());
        assert_non_null(strstr(dsim_errmsg(), v1));
        assert_non_null(strstr(dsim_errmsg(), "built against strategy ABI version 1 (an older"));
        assert_non_null(strstr(dsim_errmsg(), "this libdsim speaks version 2"));
        assert_non_null(strstr(dsim_errmsg(), "rebuild the plugin from its source"));
        assert_false(dsim_strategy_exists("bad_plugin"));
    }

    assert_int_equal(dsim_strategy_load("incomplete", incomplete), DSIM_EINVAL);
    printf("# %s\n", dsim_errmsg());
    assert_non_null(strstr(dsim_errmsg(), incomplete));
    assert_non_null(strstr(dsim_errmsg(), "'apply_gradients'"));
    assert_false(dsim_strategy_exists("incomplete"));

    /* Through dsim_train: the plugin's error comes back unchanged. */
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "whatever", 1, 1);
    cfg.plugin_path = missing;
    expect_fail(&cfg, DSIM_ENOENT, NEEDLES(missing));
    /* A plugin registers under its table's name only: asked for another (a
     * built-in's included), it is refused naming both. */
    const char *example = sc_plugin("DSIM_CUSTOM_PLUGIN");
    if (example) {
        assert_int_equal(dsim_strategy_load("mirrored", example), DSIM_EINVAL);
        assert_non_null(strstr(dsim_errmsg(), "names its strategy 'custom_mirrored'"));
        assert_non_null(strstr(dsim_errmsg(), "not 'mirrored'"));
        assert_int_equal(dsim_strategy_load("my_mirrored", example), DSIM_EINVAL);
        assert_non_null(strstr(dsim_errmsg(), example));
        assert_false(dsim_strategy_exists("my_mirrored"));
        assert_int_equal(dsim_strategy_load("custom_mirrored", example), DSIM_OK);
        assert_int_equal(dsim_strategy_load(NULL, example), DSIM_OK);
        assert_int_equal(dsim_strategy_load(NULL, example), DSIM_OK); /* again: a no-op */
        assert_true(dsim_strategy_exists("custom_mirrored"));
    }
    /* A strategy without a save member: the "not supported" stub answers. */
    const char *wrong = sc_plugin("DSIM_WRONG_PLUGIN");
    if (wrong) {
        sc_cfg(&cfg, "wrong_mean", 1, 2);
        cfg.plugin_path = wrong;
        cfg.checkpoint_path = "/tmp/dsim-strategy-never-written.ckpt";
        cfg.checkpoint_every = 2;
        expect_fail(&cfg, DSIM_ENOTSUP, NEEDLES("wrong_mean", "does not support checkpoints"));
        assert_int_not_equal(access(cfg.checkpoint_path, F_OK), 0);
    }
}

static dsim_err reg_check_shape(const dsim_strategy_shape *s)
{
    (void)s;
    return DSIM_OK;
}
static dsim_err reg_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    (void)ctx;
    (void)init;
    return DSIM_OK;
}
static dsim_err reg_apply(dsim_replica_ctx *ctx, float *grad)
{
    (void)ctx;
    (void)grad;
    return DSIM_OK;
}

static dsim_err reg_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                           size_t n)
{
    (void)ctx;
    (void)op;
    memmove(out, in, n * sizeof(double));
    return DSIM_OK;
}

static void test_register_checks(void **state)
{
    (void)state;
    struct dsim_strategy_ops t = {
        .size = sizeof(struct dsim_strategy_ops),
        .name = "reg_test",
        .check_shape = reg_check_shape,
        .create_variables = reg_create,
        .apply_gradients = reg_apply,
    };
    assert_int_equal(dsim_strategy_register(&t), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "'reduce'"));
    t.size = sizeof(struct dsim_strategy_ops) - 8;
    assert_int_equal(dsim_strategy_register(&t), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "size"));
    t.size = sizeof(struct dsim_strategy_ops);
    t.reduce = NULL;
    t.check_shape = NULL;
    assert_int_equal(dsim_strategy_register(&t), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "'check_shape'"));
    t.check_shape = reg_check_shape;
    t.name = "Bad Name";
    assert_int_equal(dsim_strategy_register(&t), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "Bad Name"));
    assert_int_equal(dsim_strategy_register(NULL), DSIM_EINVAL);
    /* The shard helper: as even as possible, first ones larger. */
    size_t first, count, total = 0;
    for (int s = 0; s < 3; s++) {
        dsim_strategy_shard_range(10, 3, s, &first, &count);
        assert_int_equal(first, total);
        assert_int_equal(count, s == 0 ? 4 : 3);
        total += count;
    }
    assert_int_equal(total, 10);
}

/* Frames nobody receives. Replica 1 of "stray_sender" sends replica 0 one
 * message on a communicator nothing in the job uses (a huge id, as a peer
 * with a bug or a forged frame would): the job still ends well, and the
 * message is logged, with its source, communicator and tag, as it is
 * dropped. A job that sends nothing stray logs nothing of the kind. */
#define STRAY_COMM 0x7FFFFFF0u
static atomic_int stray_on;
static pthread_mutex_t stray_mu = PTHREAD_MUTEX_INITIALIZER;
static char stray_log[8192];

static void stray_capture(dsim_log_level level, const char *file, int line, const char *msg,
                          void *user)
{
    (void)file;
    (void)line;
    (void)user;
    if (level > DSIM_LOG_WARN)
        return;
    pthread_mutex_lock(&stray_mu);
    size_t at = strlen(stray_log);
    snprintf(stray_log + at, sizeof stray_log - at, "%s\n", msg);
    pthread_mutex_unlock(&stray_mu);
}

static dsim_err stray_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    (void)init;
    if (ctx->replica != 1 || !atomic_load(&stray_on))
        return DSIM_OK;
    uint32_t v = 7;
    dsim_req *q;
    DSIM_CHECK(dsim_isend(ctx->ep, 0, STRAY_COMM, 77, &v, sizeof v, &q));
    return dsim_wait(q, dsim_rt_deadline(ctx->rt, 5 * 1000000000LL), NULL);
}

static void test_unreceived_reported(void **state)
{
    (void)state;
    static struct dsim_strategy_ops t;
    t = (struct dsim_strategy_ops){
        .size = sizeof(struct dsim_strategy_ops),
        .name = "stray_sender",
        .check_shape = reg_check_shape,
        .create_variables = stray_create,
        .apply_gradients = reg_apply,
        .reduce = reg_reduce,
    };
    assert_int_equal(dsim_strategy_register(&t), DSIM_OK);
    dsim_log_set_handler(stray_capture, NULL);
    for (int on = 0; on <= 1; on++) {
        atomic_store(&stray_on, on);
        stray_log[0] = '\0';
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "stray_sender", 1, 2);
        dsim_train_result res;
        dsim_err e = dsim_train(&cfg, &res);
        if (e != DSIM_OK)
            fail_msg("the job failed: %s", dsim_errmsg());
        dsim_train_result_free(&res);
        printf("# stray %d: %s\n", on, stray_log[0] ? stray_log : "(no warning)\n");
        const char *w = strstr(stray_log, "that nothing received");
        if (!on) {
            assert_null(w);
            continue;
        }
        assert_non_null(w);
        assert_non_null(strstr(stray_log, "rank 0 ended with 1 message(s)"));
        assert_non_null(strstr(stray_log, "1 from rank 1 on communicator 2147483632"));
        assert_non_null(strstr(stray_log, "first tag 77, 4 bytes"));
    }
    dsim_log_set_handler(NULL, NULL);
}

/* A strategy that accepts servers without serving them is caught before
 * anything starts. */
static void test_shape_needs_serve(void **state)
{
    (void)state;
    static struct dsim_strategy_ops t;
    t = (struct dsim_strategy_ops){
        .size = sizeof(struct dsim_strategy_ops),
        .name = "serverless",
        .check_shape = reg_check_shape,
        .create_variables = reg_create,
        .apply_gradients = reg_apply,
        .reduce = reg_reduce,
    };
    assert_int_equal(dsim_strategy_register(&t), DSIM_OK);
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "serverless", 1, 1);
    cfg.num_ps = 1;
    expect_fail(&cfg, DSIM_EINVAL, NEEDLES("serverless", "no serve member"));
}

/* Replica 1 fails at step 2 while the others wait for it in an all-reduce:
 * dsim_train returns its error, not the others' aborts, and long before the
 * 20 s collective timeout. */
static void test_replica_failure_aborts(void **state)
{
    (void)state;
    const char *path = sc_plugin("DSIM_BAD_PLUGIN_FAIL");
    if (!path)
        skip();
    for (int hosts = 1; hosts <= 2; hosts++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, "fails_at_step_2", hosts, 4);
        assert_int_equal(dsim_strategy_load("fails_at_step_2", path), DSIM_OK);
        double t0 = now_s();
        expect_fail(&cfg, DSIM_EIO, NEEDLES("replica 1", "injected failure"));
        double dt = now_s() - t0;
        printf("# %d replicas returned %.3f s after start\n", hosts * 4, dt);
        assert_true(dt < 5.0);
    }
}

/* A parameter server's waiter that has just tested the abort flag and not
 * yet gone to sleep when a replica fails must still be woken by the abort,
 * not sleep until its deadline: the server below is held between its test
 * and its wait until replica 0 has failed. */
static atomic_int lw_tested;

static dsim_err lw_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    (void)init;
    while (!atomic_load(&lw_tested))
        usleep(1000);
    return DSIM_ERR(DSIM_EIO, -1, "injected failure of replica %d", ctx->replica);
}

static dsim_err lw_serve(dsim_server_ctx *srv, int client)
{
    (void)client;
    int64_t deadline = dsim_rt_deadline(srv->rt, srv->timeout_ns);
    dsim_waitq_lock(srv->lock);
    for (;;) {
        if (dsim_fabric_aborted(srv->fabric)) {
            dsim_waitq_unlock(srv->lock);
            return DSIM_ERR(DSIM_EABORTED, -1, "server: the job was aborted");
        }
        if (!atomic_exchange(&lw_tested, 1))
            usleep(300 * 1000); /* descheduled between the test and the wait */
        if (dsim_waitq_wait(srv->lock, deadline) == DSIM_ETIMEDOUT) {
            dsim_waitq_unlock(srv->lock);
            return DSIM_ERR(DSIM_ETIMEDOUT, -1, "server: timed out");
        }
    }
}

static void test_abort_wakes_server_waiter(void **state)
{
    (void)state;
    static const struct dsim_strategy_ops t = {
        .size = sizeof(struct dsim_strategy_ops),
        .name = "late_waiter",
        .check_shape = reg_check_shape,
        .create_variables = lw_create,
        .apply_gradients = reg_apply,
        .reduce = reg_reduce,
        .serve = lw_serve,
    };
    assert_int_equal(dsim_strategy_register(&t), DSIM_OK);
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "late_waiter", 1, 1);
    cfg.num_ps = 1;
    cfg.timeout_ns = 4LL * 1000 * 1000 * 1000;
    double t0 = now_s();
    expect_fail(&cfg, DSIM_EIO, NEEDLES("replica 0", "injected failure"));
    double dt = now_s() - t0;
    printf("# returned %.3f s after start (timeout 4 s)\n", dt);
    assert_true(dt < 2.0);
}

/* The chief cannot write its checkpoint (the directory does not exist): the
 * failure stops every replica and every parameter server promptly. */
static void test_checkpoint_write_failure_aborts(void **state)
{
    (void)state;
    static const struct {
        const char *strategy;
        int hosts, devices, ps;
        dsim_ps_mode mode;
    } cases[] = {
        {"mirrored", 1, 4, 0, DSIM_PS_SYNC},
        {"central_storage", 1, 2, 0, DSIM_PS_SYNC},
        {"parameter_server", 3, 1, 2, DSIM_PS_SYNC},
        {"parameter_server", 4, 1, 1, DSIM_PS_ASYNC},
    };
    /* The directory exists, but the path is a directory: the first write
     * (its rename) fails in the middle of the job. */
    char dir[] = "/tmp/dsim-ckpt-fail-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ckpt", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_train_cfg cfg;
        sc_cfg(&cfg, cases[i].strategy, cases[i].hosts, cases[i].devices);
        cfg.num_ps = cases[i].ps;
        cfg.ps_mode = cases[i].mode;
        cfg.checkpoint_path = path;
        cfg.checkpoint_every = 3;
        double t0 = now_s();
        expect_fail(&cfg, DSIM_EIO, NEEDLES("replica 0", path));
        assert_true(now_s() - t0 < 5.0);
    }
    rmdir(path);
    rmdir(dir);

    /* A directory that does not exist is refused before any step runs. */
    dsim_train_cfg cfg;
    sc_cfg(&cfg, "mirrored", 1, 2);
    cfg.checkpoint_path = "/nonexistent/dsim-strategy-test/ckpt";
    cfg.checkpoint_every = 3;
    expect_fail(&cfg, DSIM_ENOENT,
                NEEDLES("checkpoint directory /nonexistent/dsim-strategy-test", "does not exist"));
}

int main(void)
{
    if (!sc_dataset()) {
        fprintf(stderr, "cannot make the dataset: %s\n", dsim_errmsg());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_unknown_strategy),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_plugin_errors),
        cmocka_unit_test(test_register_checks),
        cmocka_unit_test(test_shape_needs_serve),
        cmocka_unit_test(test_unreceived_reported),
        cmocka_unit_test(test_replica_failure_aborts),
        cmocka_unit_test(test_checkpoint_write_failure_aborts),
        cmocka_unit_test(test_abort_wakes_server_waiter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
