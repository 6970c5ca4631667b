/* A pipeline of the caller's own (dsim_input_config.input_fn, TF's
 * distribute_datasets_from_function): the context it is given, how its
 * elements reach the replicas, the job's steps per epoch, and what it may
 * not list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/data.h"
#include "dsim/err.h"

/* What the function under test lists: pipeline p's elements are `per`
 * batches of size `b` of ids p*1000 + k (mod the dataset), pipeline 1 one
 * element fewer; the knobs plant a mistake. */
typedef struct fn_user {
    int calls;
    dsim_input_context last;
    uint64_t bad_id; /* nonzero: list this id */
    uint64_t big;    /* nonzero: a batch of this many */
    int grow_epoch;  /* > 0: from this epoch on, list twice as many */
    int empty;       /* list nothing */
    dsim_err fail;   /* return this without a message */
} fn_user;

static dsim_err fn(void *user, const dsim_input_context *ic, uint32_t epoch,
                   dsim_input_batches *out)
{
    fn_user *u = user;
    u->calls++;
    u->last = *ic;
    if (u->fail)
        return u->fail;
    if (u->empty)
        return DSIM_OK;
    int64_t b = 0;
    DSIM_CHECK(dsim_input_context_per_replica_batch(ic, ic->global_batch, &b));
    int per = ic->input_pipeline_id == 1 ? 4 : 5;
    if (u->grow_epoch && (int)epoch >= u->grow_epoch)
        per *= 2;
    uint64_t ids[64];
    for (int k = 0; k < per; k++) {
        uint64_t n = u->big ? u->big : (uint64_t)b;
        for (uint64_t i = 0; i < n; i++)
            ids[i] = ((uint64_t)ic->input_pipeline_id * 100 + (uint64_t)k * (uint64_t)b + i) %
                     ic->dataset->n_examples;
        if (u->bad_id)
            ids[0] = u->bad_id;
        DSIM_CHECK(dsim_input_batches_add(out, ids, n));
    }
    return DSIM_OK;
}

static dsim_input_config cfg_of(const dsim_dataset_desc *d, fn_user *u, int worker)
{
    dsim_input_config c;
    memset(&c, 0, sizeof c);
    c.dataset = d;
    c.policy = DSIM_SHARD_AUTO;
    c.global_batch = 12;
    c.num_workers = 3;
    c.replicas_per_worker = 2;
    c.worker = worker;
    c.seed = 5;
    c.shuffle = true;
    c.epochs = 2;
    c.input_fn = fn;
    c.input_fn_user = u;
    return c;
}

/* TF's InputContext, element k to local replica k % R at step k / R, the
 * steps of the pipeline with most elements, empty batches past the end. */
static void test_elements_to_replicas(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 300, 4, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    fn_user u = {0};
    dsim_input_config c = cfg_of(&d, &u, 1);
    dsim_input *in = NULL;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    assert_true(dsim_input_from_fn(in));
    assert_int_equal(dsim_input_policy_applied(in), DSIM_SHARD_OFF);
    assert_non_null(strstr(dsim_input_policy_reason(in), "input_fn"));
    /* 5 elements on 2 replicas: 3 steps */
    assert_int_equal(dsim_input_steps_per_epoch(in), 3);
    assert_int_equal(u.last.num_input_pipelines, 3);
    assert_int_equal(u.last.num_replicas_in_sync, 6);
    assert_int_equal(u.last.replicas_per_pipeline, 2);
    assert_int_equal(u.last.global_batch, 12);
    assert_true(u.last.shuffle);
    assert_true(u.last.seed == 5);
    dsim_input_step st;
    /* pipeline 1 lists 4 elements of 2 ids: replica 0 gets 0 and 2, replica 1 gets 1 and 3 */
    for (int s = 0; s < 3; s++) {
        memset(&st, 0, sizeof st);
        assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
        assert_int_equal(st.step, s);
        assert_int_equal(st.epoch, 0);
        for (int r = 0; r < 2; r++) {
            int k = s * 2 + r;
            if (k < 4) {
                assert_true(st.batch[r].has_value);
                assert_int_equal(st.batch[r].n, 2);
                assert_int_equal(st.batch[r].ids[0], 100 + (uint64_t)k * 2);
                assert_int_equal(st.batch[r].ids[1], 101 + (uint64_t)k * 2);
            } else {
                assert_false(st.batch[r].has_value);
                assert_int_equal(st.batch[r].n, 0);
            }
        }
        assert_int_equal(st.end_of_epoch, s == 2);
    }
    memset(&st, 0, sizeof st);
    assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
    assert_int_equal(st.epoch, 1);
    assert_int_equal(st.batch[0].ids[0], 100);
    dsim_input_destroy(in);
    dsim_dataset_desc_release(&d);
}

static void expect_create_fails(fn_user *u, int worker, dsim_err want, const char *word)
{
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 300, 4, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    dsim_input_config c = cfg_of(&d, u, worker);
    dsim_input *in = NULL;
    dsim_err e = dsim_input_create(&c, &in);
    if (e == DSIM_OK) {
        /* a later epoch's problem shows when it is reached */
        dsim_input_step st;
        for (int i = 0; i < 12 && e == DSIM_OK; i++)
            e = dsim_input_next(in, &st);
        dsim_input_destroy(in);
    }
    assert_int_equal(e, want);
    if (!strstr(dsim_errmsg(), word))
        fail_msg("'%s' does not say '%s'", dsim_errmsg(), word);
    dsim_dataset_desc_release(&d);
}

/* Each mistake a function can make is refused with a message naming the
 * pipeline, the epoch and what is wrong. */
static void test_refusals(void **state)
{
    (void)state;
    fn_user u = {.bad_id = 300};
    expect_create_fails(&u, 0, DSIM_EINVAL, "example id 300, outside the dataset's 300");
    fn_user big = {.big = 13};
    expect_create_fails(&big, 0, DSIM_EINVAL, "more than the global batch 12");
    fn_user grow = {.grow_epoch = 1};
    expect_create_fails(&grow, 0, DSIM_EINVAL, "every epoch must fit in epoch 0's steps");
    fn_user empty = {.empty = 1};
    expect_create_fails(&empty, 0, DSIM_EINVAL, "no pipeline lists any example");
    fn_user fail = {.fail = DSIM_EIO};
    expect_create_fails(&fail, 0, DSIM_EIO, "input_fn failed for pipeline 0, epoch 0");
}

static void test_per_replica_batch(void **state)
{
    (void)state;
    dsim_input_context ic = {.num_replicas_in_sync = 4};
    int64_t b = 0;
    assert_int_equal(dsim_input_context_per_replica_batch(&ic, 32, &b), DSIM_OK);
    assert_int_equal(b, 8);
    assert_int_equal(dsim_input_context_per_replica_batch(&ic, 30, &b), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "not divisible by num_replicas_in_sync 4"));
}

/* The plan (dsim plan) shows what the function lists. */
static void test_plan(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 300, 4, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    fn_user u = {0};
    dsim_input_config c = cfg_of(&d, &u, 0);
    dsim_input_plan *p = NULL;
    assert_int_equal(dsim_input_plan_make(&c, &p), DSIM_OK);
    assert_true(p->from_fn);
    assert_int_equal(p->steps, 3);
    assert_int_equal(p->reads[1], 8); /* pipeline 1: 4 elements of 2 */
    dsim_input_plan_free(p);
    dsim_dataset_desc_release(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elements_to_replicas),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_per_replica_batch),
        cmocka_unit_test(test_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
