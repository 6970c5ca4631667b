/* libdsim's public calls, misused: a NULL where an object or an out
 * pointer belongs, or a value no call accepts. Each returns DSIM_EINVAL (no
 * crash, nothing written through the NULL) with a message that starts with
 * the call's name, so that a program that gets one knows which call it
 * passed what to. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dsim/cluster.h"
#include "dsim/comm.h"
#include "dsim/dataset.h"
#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/health.h"
#include "dsim/model.h"
#include "dsim/optim.h"
#include "dsim/reduce.h"
#include "dsim/rng.h"
#include "dsim/rt.h"
#include "dsim/strategy.h"

/* call must fail with DSIM_EINVAL and a message starting with `who`. */
#define REFUSED(call, who)                                                                         \
    do {                                                                                           \
        dsim_err e_ = (call);                                                                      \
        if (e_ != DSIM_EINVAL || strncmp(dsim_errmsg(), who, strlen(who)) != 0)                    \
            fail_msg("%s: returned %d, message '%s' (expected EINVAL from %s)", #call, (int)e_,    \
                     dsim_errmsg(), who);                                                          \
    } while (0)

static void test_parsers(void **state)
{
    (void)state;
    dsim_model_kind mk;
    dsim_loss lo;
    dsim_data_kind dk;
    dsim_algo al;
    dsim_ps_mode pm;
    dsim_dtype dt;
    dsim_op op;
    REFUSED(dsim_model_kind_parse(NULL, &mk), "dsim_model_kind_parse:");
    REFUSED(dsim_model_kind_parse("mlp", NULL), "dsim_model_kind_parse:");
    REFUSED(dsim_loss_parse(NULL, &lo), "dsim_loss_parse:");
    REFUSED(dsim_data_kind_parse(NULL, &dk), "dsim_data_kind_parse:");
    {
        REFUSED(dsim_optim_kind_parse("sgd", NULL), "dsim_optim_kind_parse:");
    }
    REFUSED(dsim_algo_parse(NULL, &al), "dsim_algo_parse: the name is NULL");
    REFUSED(dsim_algo_parse("ring", NULL), "dsim_algo_parse: out is NULL");
    REFUSED(dsim_ps_mode_parse(NULL, &pm), "dsim_ps_mode_parse:");
    REFUSED(dsim_dtype_parse(NULL, &dt), "dsim_dtype_parse: the name is NULL");
    REFUSED(dsim_dtype_parse("f32", NULL), "dsim_dtype_parse: out is NULL");
    REFUSED(dsim_op_parse(NULL, &op), "dsim_op_parse: the name is NULL");
    REFUSED(dsim_op_parse("sum", NULL), "dsim_op_parse: out is NULL");
    /* what the parsers accept still parses */
    assert_int_equal(dsim_algo_parse("ring", &al), DSIM_OK);
    assert_int_equal(dsim_dtype_parse("f32", &dt), DSIM_OK);
    assert_int_equal(dt, DSIM_F32);
}

static void test_convert(void **state)
{
    (void)state;
    float f[2] = {1, 2};
    double d[2];
    REFUSED(dsim_convert(d, (dsim_dtype)99, f, DSIM_F32, 2), "dsim_convert: invalid");
    REFUSED(dsim_convert(NULL, DSIM_F64, f, DSIM_F32, 2), "dsim_convert:");
    REFUSED(dsim_convert(d, DSIM_F64, NULL, DSIM_F32, 2), "dsim_convert:");
    REFUSED(dsim_convert(d, DSIM_F64, f, DSIM_F32, SIZE_MAX), "dsim_convert: element count");
    assert_int_equal(dsim_convert(d, DSIM_F64, f, DSIM_F32, 2), DSIM_OK);
    assert_true(d[0] == 1.0 && d[1] == 2.0);
    /* nothing to convert: NULL buffers are fine */
    assert_int_equal(dsim_convert(NULL, DSIM_F64, NULL, DSIM_F32, 0), DSIM_OK);
}

static void test_model_and_optim(void **state)
{
    (void)state;
    dsim_model_spec ms = {.kind = DSIM_MODEL_LINEAR, .in_dim = 2, .out_dim = 1};
    float params[8], x[2] = {1, 2}, y[1];
    REFUSED(dsim_model_layout_of(&ms, NULL), "dsim_model_layout_of: out is NULL");
    REFUSED(dsim_model_init(&ms, NULL, NULL), "dsim_model_init:");
    REFUSED(dsim_model_predict(&ms, NULL, x, 1, y), "dsim_model_predict:");
    REFUSED(dsim_model_predict(&ms, params, x, 1, NULL), "dsim_model_predict:");
    dsim_optim_spec os;
    dsim_optim_spec_default(&os, DSIM_OPTIM_MOMENTUM);
    REFUSED(dsim_optim_create(&os, 4, NULL), "dsim_optim_create: out is NULL");
    dsim_optim *opt = NULL;
    assert_int_equal(dsim_optim_create(&os, 4, &opt), DSIM_OK);
    REFUSED(dsim_optim_apply(NULL, params, params, 4), "dsim_optim_apply:");
    REFUSED(dsim_optim_apply(opt, NULL, params, 4), "dsim_optim_apply:");
    REFUSED(dsim_optim_set_state(NULL, params, 0, 0), "dsim_optim_set_state: opt is NULL");
    REFUSED(dsim_optim_set_state(opt, NULL, 4, 0), "dsim_optim_set_state: state is NULL");
    dsim_optim_destroy(opt);
}

static void test_dataset(void **state)
{
    (void)state;
    dsim_dataset_spec spec = {.kind = DSIM_DATA_CLASSIFICATION,
                              .n_examples = 16,
                              .in_dim = 3,
                              .out_dim = 2,
                              .n_files = 2,
                              .seed = 1};
    REFUSED(dsim_dataset_make(&spec, NULL), "dsim_dataset_make: out is NULL");
    dsim_dataset *ds = NULL;
    assert_int_equal(dsim_dataset_make(&spec, &ds), DSIM_OK);
    dsim_model_spec ms = {.kind = DSIM_MODEL_LINEAR, .in_dim = 3, .out_dim = 2};
    uint64_t first, count, id = 0;
    size_t f;
    float xb[3], yb[2];
    char buf[64];
    REFUSED(dsim_dataset_check_model(NULL, &ms), "dsim_dataset_check_model: dataset is NULL");
    REFUSED(dsim_dataset_file_range(NULL, 0, &first, &count), "dsim_dataset_file_range:");
    REFUSED(dsim_dataset_file_range(ds, 0, NULL, &count), "dsim_dataset_file_range:");
    REFUSED(dsim_dataset_file_of(NULL, 0, &f), "dsim_dataset_file_of:");
    REFUSED(dsim_dataset_gather(NULL, &id, 1, xb, yb), "dsim_dataset_gather:");
    REFUSED(dsim_dataset_file_path(NULL, 0, 2, buf, sizeof buf), "dsim_dataset_file_path:");
    REFUSED(dsim_dataset_write_files(ds, NULL), "dsim_dataset_write_files:");
    REFUSED(dsim_dataset_read_file(NULL, NULL), "dsim_dataset_read_file:");
    /* and right */
    assert_int_equal(dsim_dataset_file_range(ds, 1, &first, &count), DSIM_OK);
    assert_int_equal(first + count, 16);
    assert_int_equal(dsim_dataset_gather(ds, &id, 1, xb, yb), DSIM_OK);
    dsim_dataset_free(ds);
}

static void test_cluster(void **state)
{
    (void)state;
    dsim_cluster c;
    int r, w, d;
    char *json = NULL;
    REFUSED(dsim_cluster_local(2, 1, 0, NULL), "dsim_cluster_local: out is NULL");
    REFUSED(dsim_cluster_from_tf_config("{}", 1, NULL), "dsim_cluster_from_tf_config:");
    assert_int_equal(dsim_cluster_local(2, 2, 0, &c), DSIM_OK);
    REFUSED(dsim_cluster_to_tf_config(NULL, DSIM_TASK_WORKER, 0, &json),
            "dsim_cluster_to_tf_config:");
    REFUSED(dsim_cluster_to_tf_config(&c, DSIM_TASK_WORKER, 0, NULL), "dsim_cluster_to_tf_config:");
    REFUSED(dsim_cluster_replica(NULL, 0, 0, &r), "dsim_cluster_replica:");
    REFUSED(dsim_cluster_replica(&c, 0, 0, NULL), "dsim_cluster_replica:");
    REFUSED(dsim_cluster_replica_place(NULL, 0, &w, &d), "dsim_cluster_replica_place:");
    REFUSED(dsim_cluster_replica_place(&c, 0, NULL, &d), "dsim_cluster_replica_place:");
    assert_int_equal(dsim_cluster_replica(&c, 1, 1, &r), DSIM_OK);
    assert_int_equal(r, 3);
    assert_int_equal(dsim_cluster_replica_place(&c, 3, &w, &d), DSIM_OK);
    assert_true(w == 1 && d == 1);
    dsim_cluster_free(&c);
}

static void noop(void *arg)
{
    (void)arg;
}

static void test_runtime_and_comm(void **state)
{
    (void)state;
    REFUSED(dsim_rt_create("threads", NULL), "dsim_rt_create: out is NULL");
    dsim_rt *rt = NULL;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_task *t = NULL;
    REFUSED(dsim_rt_spawn(rt, 0, NULL, NULL, &t), "dsim_rt_spawn:");
    REFUSED(dsim_rt_spawn(rt, 0, noop, NULL, NULL), "dsim_rt_spawn:");
    REFUSED(dsim_rt_join(rt, NULL), "dsim_rt_join: task is NULL");
    REFUSED(dsim_rt_detach(rt, NULL), "dsim_rt_detach: task is NULL");
    REFUSED(dsim_waitq_create(rt, NULL), "dsim_waitq_create:");
    REFUSED(dsim_waitq_create(NULL, NULL), "dsim_waitq_create:");
    dsim_rt_destroy(rt);
    dsim_comm *c = NULL;
    REFUSED(dsim_comm_create(NULL, &c), "dsim_comm_create: cfg is NULL");
    REFUSED(dsim_comm_create(NULL, NULL), "dsim_comm_create: out is NULL");
    dsim_comm_cfg cc = {.size = 0};
    REFUSED(dsim_comm_create(&cc, &c), "dsim_comm_create:");
    float v = 1;
    REFUSED(dsim_allreduce(NULL, &v, &v, 1, DSIM_F32, DSIM_SUM),
            "dsim_allreduce: the communicator is NULL");
    REFUSED(dsim_barrier(NULL), "dsim_barrier: the communicator is NULL");
    dsim_fr_dump dump;
    REFUSED(dsim_comm_flight_dump(NULL, &dump), "dsim_comm_flight_dump: the communicator is NULL");
    dsim_health *h = NULL;
    REFUSED(dsim_health_start(NULL, &h), "dsim_health_start: cfg is NULL");
    dsim_health_cfg hc = {0};
    REFUSED(dsim_health_start(&hc, NULL), "dsim_health_start: out is NULL");
    REFUSED(dsim_health_start(&hc, &h), "dsim_health_start: cfg.ep is NULL");
}

static void test_checkpoint_and_reference(void **state)
{
    (void)state;
    dsim_checkpoint *ck = NULL;
    REFUSED(dsim_checkpoint_write(NULL, ck), "dsim_checkpoint_write:");
    REFUSED(dsim_checkpoint_write("/tmp/x.ckpt", NULL), "dsim_checkpoint_write:");
    REFUSED(dsim_checkpoint_read("/tmp/x.ckpt", NULL), "dsim_checkpoint_read: out is NULL");
    REFUSED(dsim_checkpoint_read(NULL, &ck), "dsim_checkpoint_read: no path given");
    dsim_train_result res;
    dsim_train_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    REFUSED(dsim_train_reference(NULL, &res), "dsim_train_reference: cfg is NULL");
    REFUSED(dsim_train_reference(&cfg, NULL), "dsim_train_reference: res is NULL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parsers),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_model_and_optim),
        cmocka_unit_test(test_dataset),
        cmocka_unit_test(test_cluster),
        cmocka_unit_test(test_runtime_and_comm),
        cmocka_unit_test(test_checkpoint_and_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
