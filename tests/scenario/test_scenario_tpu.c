/* Scenario files on a TPU slice (cluster.tpu): the slice resolved into the
 * job (hosts, replicas, torus, ICI and chip presets), what dsim says about
 * it (simulated: no TPU is used; mixed_bfloat16 by default; a
 * global batch that leaves cores part-empty), every refusal with its
 * FILE:LINE:COL and fix (bad slice names with the accepted list, keys the
 * slice gives, the tpu strategy without a slice, dynamic_batch_size where
 * it means nothing, static shapes that do not hold), and the plan's per-host
 * input pipelines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>

#include "scenario/plan.h"
#include "scenario/scenario.h"
#include "scen_cases.h"

#define TPU_DATA                                                                                   \
    "model: {kind: softmax}\n"                                                                     \
    "data: {task: classification, examples: 256, features: 8, classes: 4, files: 4, "              \
    "global_batch: 32}\n"

static void test_slice(void **state)
{
    (void)state;
    dsim_scenario *s = scen_parse_ok("name: a\ncluster: {tpu: v3-32}\nstrategy: {name: tpu, "
                                     "communication: torus}\n" TPU_DATA);
    const dsim_train_cfg *t = &s->train;
    assert_int_equal(t->hosts, 4);
    assert_int_equal(t->devices_per_host, 8);
    assert_int_equal(t->tpu.replicas, 32);
    assert_string_equal(t->tpu.name, "v3-32");
    assert_int_equal(t->communication, DSIM_ALGO_TORUS);
    assert_false(t->static_shapes);
    assert_string_equal(s->network_preset, "ici-v3");
    assert_string_equal(s->device_preset, "tpu-v3");
    assert_true(s->tpu_ici_Bps == 1.0e11);
    assert_true(t->device_flops > 1e13);
    assert_false(s->network_given); /* so it runs on the processes engine too */
    assert_non_null(s->tpu_notes);
    assert_non_null(strstr(s->tpu_notes, "TPU v3-32 is simulated: no TPU is used"));
    assert_non_null(strstr(s->tpu_notes, "mixed_bfloat16"));
    /* Keras' TPU default, since the scenario names no policy */
    assert_non_null(strstr(s->tpu_notes, "TPU jobs' default"));
    assert_int_equal(t->precision, DSIM_POLICY_MIXED_BFLOAT16);
    assert_null(strstr(s->tpu_notes, "warning")); /* 32 fills the 32 cores */
    assert_int_equal(dsim_scenario_runnable(s), DSIM_OK);
    dsim_scenario_free(s);

    s = scen_parse_ok("name: a\ncluster: {tpu: v4, tpu_topology: 4x4x2}\nstrategy: {name: tpu}\n"
                      "model: {kind: softmax}\ndata: {task: classification, examples: 256, "
                      "features: 8, classes: 4, files: 8, global_batch: 40}\n");
    assert_int_equal(s->train.tpu.replicas, 32);
    assert_int_equal(s->train.hosts, 8);
    assert_non_null(strstr(s->tpu_notes, "warning: the global batch 40 is not a multiple of the "
                                         "64 TensorCores of v4-64: the cores run part-empty"));
    dsim_scenario_free(s);

    /* not a TPU job: no notes */
    s = scen_parse_ok("name: a\ncluster: {hosts: 2}\n" TPU_DATA);
    assert_null(s->tpu_notes);
    assert_int_equal(s->train.tpu.replicas, 0);
    dsim_scenario_free(s);
}

/* clang-format off */
static const scen_err_case tpu_errs[] = {
    {"name: a\ncluster: {tpu: v3-16}\n", 2, 16,
     {"cluster.tpu: TPU \"v3-16\": no v3 slice has 16 TensorCores",
      "accepted: v3-8, v3-32, v3-64, v3-128"}},
    {"name: a\ncluster: {tpu: v7-8}\n", 2, 16,
     {"is not a TPU generation dsim knows", "accepted generations: v2, v3, v4, v5e"}},
    {"name: a\ncluster: {tpu: v3-8, hosts: 2}\n", 2, 22,
     {"cluster.hosts: the TPU slice (cluster.tpu, line 2) gives the cluster", "remove cluster.hosts"}},
    {"name: a\ncluster:\n  tpu: v3-8\n  network: {preset: ib100}\n", 4, 3,
     {"cluster.network: the TPU slice", "its ICI network"}},
    {"name: a\ncluster: {tpu_topology: 4x4}\n", 2, 11,
     {"cluster.tpu_topology: a chip shape needs its generation", "tpu: v4"}},
    {"name: a\ncluster: {tpu: v4, tpu_topology: 4x4}\n", 2, 34,
     {"cluster.tpu_topology:", "is not 3 chip dimensions such as 4x4x2"}},
    {"name: a\ncluster: {tpu: v3-32, tpu_topology: 4x4}\n", 2, 16,
     {"cluster.tpu: with tpu_topology, tpu is the generation"}},
    {"name: a\ncluster: {tpu: v4, tpu_topology: 3x4x4}\n", 2, 34,
     {"dimension x (3) is not a multiple of 2"}},
    {"name: a\ncluster: {hosts: 1, devices_per_host: 8}\nstrategy: {name: tpu}\n", 3, 18,
     {"strategy.name: tpu (TPUStrategy) runs on a TPU slice", "cluster: {tpu: v3-8}",
      "no TPU is used"}},
    {"name: a\ncluster: {hosts: 2}\nstrategy: {name: multi_worker_mirrored, "
     "dynamic_batch_size: false}\n", 3, 41,
     {"strategy.dynamic_batch_size: only tpu"}},
    {"name: a\ncluster: {tpu: v3-8}\nstrategy: {name: tpu, dynamic_batch_size: false}\n"
     "model: {kind: softmax}\ndata: {task: classification, examples: 256, features: 8, "
     "classes: 4, global_batch: 20}\n", 3, 43,
     {"strategy.dynamic_batch_size: false", "the global batch 20 does not split evenly over the "
      "8 replicas", "make it a multiple of 8 (e.g. 24)"}},
    {"name: a\ncluster: {tpu: v3-8}\nstrategy: {name: tpu, dynamic_batch_size: false}\n"
     "model: {kind: softmax}\ndata: {task: classification, examples: 250, features: 8, "
     "classes: 4, files: 1, global_batch: 32}\n", 3, 43,
     {"the last global batch of 32 is partial", "set drop_remainder: true"}},
};
/* clang-format on */

static void test_errors(void **state)
{
    (void)state;
    scen_expect_errors(tpu_errs, sizeof tpu_errs / sizeof tpu_errs[0]);
    /* with drop_remainder the same static-shape job parses */
    dsim_scenario *s = scen_parse_ok(
        "name: a\ncluster: {tpu: v3-8}\nstrategy: {name: tpu, dynamic_batch_size: false}\n"
        "model: {kind: softmax}\ndata: {task: classification, examples: 250, features: 8, "
        "classes: 4, files: 1, global_batch: 32, drop_remainder: true}\n");
    assert_true(s->train.static_shapes);
    dsim_scenario_free(s);
}

/* dsim plan: one input pipeline per host, the replicas' places, padding. */
static void test_plan(void **state)
{
    (void)state;
    dsim_scenario *s =
        scen_parse_ok("name: a\ncluster: {tpu: v3-32}\nstrategy: {name: tpu}\n"
                      "model: {kind: softmax}\ndata: {task: classification, examples: "
                      "1000, features: 8, classes: 4, files: 8, global_batch: 100}\n");
    json_t *j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    dsim_scenario_free(s);
    json_t *ip = json_object_get(json_object_get(j, "data"), "input_pipelines");
    assert_int_equal(json_integer_value(json_object_get(ip, "count")), 4);
    json_t *p1 = json_array_get(json_object_get(ip, "pipelines"), 1);
    assert_int_equal(json_integer_value(json_object_get(p1, "host")), 1);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(p1, "replicas"), 0)), 8);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(p1, "replicas"), 1)), 15);
    /* 100 over 32 cores: every core computes 4 rows a step; what is not an
     * example is padding (the hosts' streams end at different steps: 11) */
    json_int_t steps =
        json_integer_value(json_object_get(json_object_get(j, "data"), "steps_per_epoch"));
    assert_int_equal(steps, 11);
    assert_int_equal(json_integer_value(json_object_get(ip, "static_batch")), 4);
    assert_int_equal(json_integer_value(json_object_get(ip, "padding_first_epoch")),
                     4 * 32 * steps - 1000);
    json_t *tpu = json_object_get(json_object_get(j, "cluster"), "tpu");
    assert_string_equal(json_string_value(json_object_get(tpu, "simulated")), "no TPU is used");
    assert_true(json_array_size(json_object_get(tpu, "notes")) == 3);
    json_t *r9 = json_array_get(json_object_get(json_object_get(j, "cluster"), "replicas"), 9);
    assert_int_equal(json_integer_value(json_object_get(r9, "core")), 1);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(r9, "coords"), 0)), 2);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_plan),
    };
    return cmocka_run_group_tests_name("scenario_tpu", tests, NULL, NULL);
}
