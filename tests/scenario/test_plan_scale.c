/* `dsim plan` grows linearly with the job: the plan of a sim job of W
 * workers over a dataset with files, sharded by DATA (every worker goes
 * through the files' list), costs O(W + examples). It was O(W x examples):
 * each worker's input checked the whole dataset again (0.56 s at 4,096
 * workers, over 100 s at 65,536).
 *
 * Bounded without a wall-clock limit: the CPU time of the plan of 16,384
 * workers over that of 4,096 (4 x the workers, 4 x the examples) must stay
 * under 8 (linear: about 4; the quadratic plan: 16), the best of 3 each;
 * and the plan of 65,536 workers must complete and list what it should. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "scenario/plan.h"
#include "scenario/scenario.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A timing-only sim job (as scenarios/whatif/allreduce_65536_timing.yaml)
 * of W workers x 1 device, 16 W examples in 64 files, sharded by DATA, 4
 * steps of 4 W. */
static dsim_scenario *job(int W)
{
    char text[512];
    snprintf(text, sizeof text,
             "name: plan_scale\nengine: sim\n"
             "cluster: {hosts: %d, devices_per_host: 1}\n"
             "strategy: {name: multi_worker_mirrored, health_check: {interval: 0}}\n"
             "model: {synthetic: {parameters: 1M, flops_per_example: 4.1G}}\n"
             "data: {examples: %d, files: 64, shard_policy: data, global_batch: %d}\n",
             W, 16 * W, 4 * W);
    dsim_scenario *s = NULL;
    if (dsim_scenario_parse("plan_scale.yaml", text, strlen(text), &s) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    return s;
}

/* The plan of s; its CPU seconds in *t. */
static json_t *plan(const dsim_scenario *s, double *t)
{
    json_t *j = NULL;
    double t0 = cpu_s();
    dsim_err e = dsim_scenario_plan(s, &j);
    *t = cpu_s() - t0;
    if (e != DSIM_OK)
        fail_msg("plan: %s", dsim_errmsg());
    return j;
}

static double best_plan_s(int W)
{
    dsim_scenario *s = job(W);
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        double t;
        json_decref(plan(s, &t));
        best = t < best ? t : best;
    }
    dsim_scenario_free(s);
    return best;
}

static void test_linear(void **state)
{
    (void)state;
    double small = best_plan_s(4096), large = best_plan_s(16384);
    print_message("plan CPU time: 4096 workers %.4f s, 16384 workers %.4f s, x%.2f\n", small, large,
                  large / small);
    if (!(large <= 8 * small))
        fail_msg("the plan of 16384 workers took %.3f s, %.1f x the %.3f s of 4096 workers: it "
                 "grows faster than linearly",
                 large, large / small, small);
}

static void test_65536_workers(void **state)
{
    (void)state;
    dsim_scenario *s = job(65536);
    double t;
    json_t *j = plan(s, &t);
    print_message("plan of 65536 workers: %.3f s of CPU\n", t);
    json_t *d = json_object_get(j, "data");
    assert_int_equal(json_integer_value(json_object_get(d, "steps_per_epoch")), 4);
    assert_true(json_is_true(json_object_get(d, "workers_truncated")));
    /* worker 1 reads every file and keeps one example of each minibatch */
    json_t *w1 = json_array_get(json_object_get(d, "workers"), 1);
    assert_int_equal(json_array_size(json_object_get(w1, "files")), 64);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(w1, "elements"), "count")),
                     16);
    assert_true(json_is_true(json_object_get(j, "runnable")));
    json_decref(j);
    dsim_scenario_free(s);
}

/* Past PLAN_MAX_READS entries the per-worker part is left out, and the
 * section says why: batch sizes (steps x replicas), and a file list per
 * worker when the files are not sharded. */
static void test_not_listed(void **state)
{
    (void)state;
    const char *texts[2] = {
        "name: steps\nengine: sim\ncluster: {hosts: 8192, devices_per_host: 8}\n"
        "strategy: {name: multi_worker_mirrored, health_check: {interval: 0}}\n"
        "data: {examples: 65536, files: 0, shard_policy: data, global_batch: 32}\n",
        "name: files\nengine: sim\ncluster: {hosts: 16384, devices_per_host: 1}\n"
        "strategy: {name: multi_worker_mirrored, health_check: {interval: 0}}\n"
        "data: {examples: 65536, files: 8192, shard_policy: data, global_batch: 65536}\n",
    };
    const char *words[2] = {"steps x", "files for each of 16384 workers"};
    for (int k = 0; k < 2; k++) {
        dsim_scenario *s = NULL;
        if (dsim_scenario_parse("big.yaml", texts[k], strlen(texts[k]), &s) != DSIM_OK)
            fail_msg("%s", dsim_errmsg());
        /* (whether such a job could run here is not the question) */
        json_t *j = NULL;
        (void)dsim_scenario_plan(s, &j);
        assert_non_null(j);
        json_t *d = json_object_get(j, "data");
        const char *note = json_string_value(json_object_get(d, "not_listed"));
        if (!note || !strstr(note, words[k]))
            fail_msg("case %d: not_listed is '%s', expected it to say '%s'", k,
                     note ? note : "(none)", words[k]);
        assert_null(json_object_get(d, "workers"));
        assert_non_null(json_object_get(d, "steps_per_epoch"));
        json_decref(j);
        dsim_scenario_free(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_65536_workers),
        cmocka_unit_test(test_not_listed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
