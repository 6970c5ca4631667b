/* Scenario files' optimizers beyond SGD, momentum and Adam: Keras 3's
 * RMSprop, Adagrad, Lion and Adamax keys (rho, momentum, centered, epsilon,
 * initial_accumulator_value, beta1, beta2) and Adam's amsgrad, with their
 * defaults, what `dsim plan` shows
 * of them, and every refusal with its FILE:LINE:COL and fix (a key of
 * another kind, a value out of range). */
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

static void test_keys(void **state)
{
    (void)state;
    /* Keras's defaults where the file says nothing */
    dsim_scenario *s = scen_parse_ok("name: a\noptimizer: {kind: rmsprop}\n");
    const dsim_optim_spec *o = &s->train.optim;
    assert_int_equal(o->kind, DSIM_OPTIM_RMSPROP);
    assert_true(o->lr == 0.001 && o->rho == 0.9 && o->momentum == 0.0 && o->epsilon == 1e-7 &&
                !o->centered);
    dsim_scenario_free(s);
    s = scen_parse_ok("name: a\noptimizer: {kind: rmsprop, learning_rate: 0.01, rho: 0.95, "
                      "momentum: 0.5, centered: true, epsilon: 1e-6}\n");
    o = &s->train.optim;
    assert_true(o->lr == 0.01 && o->rho == 0.95 && o->momentum == 0.5 && o->centered &&
                o->epsilon == 1e-6);
    assert_int_equal(dsim_optim_rule_slots(o), 3);
    json_t *j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    json_t *oj = json_object_get(j, "optimizer");
    assert_string_equal(json_string_value(json_object_get(oj, "kind")), "rmsprop");
    assert_true(json_real_value(json_object_get(oj, "rho")) == 0.95);
    assert_true(json_is_true(json_object_get(oj, "centered")));
    json_decref(j);
    dsim_scenario_free(s);

    s = scen_parse_ok("name: a\noptimizer: {kind: lion, beta1: 0.95}\n");
    o = &s->train.optim;
    assert_true(o->lr == 0.001 && o->beta1 == 0.95 && o->beta2 == 0.99);
    dsim_scenario_free(s);

    /* Adamax: Adam's keys but amsgrad; Adam(amsgrad=True): a third slot */
    s = scen_parse_ok("name: a\noptimizer: {kind: adamax, beta2: 0.99, epsilon: 1e-6}\n");
    o = &s->train.optim;
    assert_true(o->kind == DSIM_OPTIM_ADAMAX && o->lr == 0.001 && o->beta1 == 0.9 &&
                o->beta2 == 0.99 && o->epsilon == 1e-6);
    assert_int_equal(dsim_optim_rule_slots(o), 2);
    dsim_scenario_free(s);
    s = scen_parse_ok("name: a\noptimizer: {kind: adam, amsgrad: true}\n");
    o = &s->train.optim;
    assert_true(o->kind == DSIM_OPTIM_ADAM && o->amsgrad);
    assert_int_equal(dsim_optim_rule_slots(o), 3);
    j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    assert_true(json_is_true(json_object_get(json_object_get(j, "optimizer"), "amsgrad")));
    json_decref(j);
    dsim_scenario_free(s);

    /* Keras's CosineDecayRestarts under its own names, with its defaults */
    s = scen_parse_ok("name: a\noptimizer: {schedule: {kind: cosine_decay_restarts, "
                      "first_decay_steps: 100, m_mul: 0.5}}\n");
    const dsim_lr_schedule *ls = &s->train.optim.schedule;
    assert_true(ls->kind == DSIM_LR_COSINE_RESTARTS && ls->decay_steps == 100 && ls->t_mul == 2.0 &&
                ls->m_mul == 0.5 && ls->alpha == 0.0);
    j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    json_t *sj = json_object_get(json_object_get(j, "optimizer"), "schedule");
    assert_string_equal(json_string_value(json_object_get(sj, "kind")), "cosine_decay_restarts");
    assert_int_equal(json_integer_value(json_object_get(sj, "first_decay_steps")), 100);
    assert_true(json_real_value(json_object_get(sj, "t_mul")) == 2.0);
    json_decref(j);
    dsim_scenario_free(s);

    /* Keras 3's Lamb: Adam's betas and epsilon, two slots; its variables
     * are the model's, filled when the job is set up */
    s = scen_parse_ok("name: a\noptimizer: {kind: lamb, beta1: 0.8, weight_decay: 0.01}\n");
    o = &s->train.optim;
    assert_true(o->kind == DSIM_OPTIM_LAMB && o->beta1 == 0.8 && o->beta2 == 0.999 &&
                o->epsilon == 1e-7 && o->n_vars == 0);
    assert_int_equal(dsim_optim_rule_slots(o), 2);
    j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    assert_true(json_real_value(json_object_get(json_object_get(j, "optimizer"), "beta1")) == 0.8);
    json_decref(j);
    dsim_scenario_free(s);

    /* Keras 3's Nadam: Adam's betas and epsilon, two slots (its momentum
     * schedule's product follows from the step count) */
    s = scen_parse_ok("name: a\noptimizer: {kind: nadam, beta2: 0.99, epsilon: 1e-6}\n");
    o = &s->train.optim;
    assert_true(o->kind == DSIM_OPTIM_NADAM && o->beta1 == 0.9 && o->beta2 == 0.99 &&
                o->epsilon == 1e-6);
    assert_int_equal(dsim_optim_rule_slots(o), 2);
    j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    assert_true(json_real_value(json_object_get(json_object_get(j, "optimizer"), "beta2")) == 0.99);
    json_decref(j);
    dsim_scenario_free(s);

    /* Keras 3's Adadelta: rho (its own default, 0.95) and epsilon */
    s = scen_parse_ok("name: a\noptimizer: {kind: adadelta, learning_rate: 1.0}\n");
    o = &s->train.optim;
    assert_true(o->kind == DSIM_OPTIM_ADADELTA && o->rho == 0.95 && o->epsilon == 1e-7);
    j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    assert_true(json_real_value(json_object_get(json_object_get(j, "optimizer"), "rho")) == 0.95);
    json_decref(j);
    dsim_scenario_free(s);

    /* Keras's SGD(momentum=0.9, nesterov=True): a velocity slot */
    s = scen_parse_ok("name: a\noptimizer: {kind: sgd, momentum: 0.9, nesterov: true}\n");
    o = &s->train.optim;
    assert_true(o->kind == DSIM_OPTIM_SGD && o->momentum == 0.9 && o->nesterov);
    assert_int_equal(dsim_optim_rule_slots(o), 1);
    dsim_scenario_free(s);

    s = scen_parse_ok("name: a\noptimizer: {kind: adagrad}\n");
    o = &s->train.optim;
    assert_true(o->lr == 0.001 && o->initial_accumulator_value == 0.1 && o->epsilon == 1e-7);
    dsim_scenario_free(s);
    s = scen_parse_ok("name: a\noptimizer: {kind: adagrad, learning_rate: 0.1, "
                      "initial_accumulator_value: 0, gradient_accumulation_steps: 2}\n");
    o = &s->train.optim;
    assert_true(o->initial_accumulator_value == 0.0);
    assert_int_equal(dsim_optim_slots_per_param(o), 2);
    j = NULL;
    assert_int_equal(dsim_scenario_plan(s, &j), DSIM_OK);
    oj = json_object_get(j, "optimizer");
    assert_string_equal(json_string_value(json_object_get(oj, "kind")), "adagrad");
    assert_true(json_real_value(json_object_get(oj, "initial_accumulator_value")) == 0.0);
    json_decref(j);
    dsim_scenario_free(s);
}

/* clang-format off */
static const scen_err_case optim_errs[] = {
    {"name: a\noptimizer: {kind: sophia}\n", 2, 19,
     {"optimizer.kind", "sgd, momentum, adam, adamax, rmsprop, adagrad, lion, lamb, nadam, adadelta"}},
    {"name: a\noptimizer: {kind: lion, epsilon: 1e-7}\n", 2, 25,
     {"optimizer.epsilon: only adam, adamax, nadam, lamb, rmsprop, adagrad and adadelta use it", "kind is lion"}},
    {"name: a\noptimizer: {kind: rmsprop, beta1: 0.9}\n", 2, 28,
     {"optimizer.beta1: only adam, adamax, nadam, lamb and lion use it"}},
    {"name: a\noptimizer: {kind: adamax, amsgrad: true}\n", 2, 27,
     {"optimizer.amsgrad: only adam uses it", "kind is adamax"}},
    {"name: a\noptimizer: {kind: adam, amsgrad: 1.5}\n", 2, 34, {"optimizer.amsgrad"}},
    {"name: a\noptimizer: {kind: lamb, amsgrad: true}\n", 2, 25,
     {"optimizer.amsgrad: only adam uses it", "kind is lamb"}},
    {"name: a\noptimizer: {kind: adamax, beta2: 1}\n", 2, 34,
     {"optimizer.beta2: '1' is out of range", "[0, 1)"}},
    {"name: a\noptimizer: {schedule: {kind: cosine_decay_restarts, decay_steps: 5}}\n", 2, 53,
     {"schedule.decay_steps: schedule kind cosine_decay_restarts does not use decay_steps",
      "takes first_decay_steps, as Keras"}},
    {"name: a\noptimizer: {schedule: {kind: cosine_decay_restarts}}\n", 2, 13,
     {"cosine_decay_restarts needs first_decay_steps"}},
    {"name: a\noptimizer: {schedule: {kind: cosine_decay_restarts, first_decay_steps: 5, "
     "t_mul: 0.5}}\n", 2, 82, {"schedule.t_mul: '0.5' is out of range"}},
    {"name: a\noptimizer: {schedule: {kind: cosine_decay, decay_steps: 5, m_mul: 2}}\n", 2, 60,
     {"schedule kind cosine_decay does not use m_mul"}},
    {"name: a\noptimizer: {kind: lion, beta1: 0}\n", 2, 32,
     {"optimizer.beta1: lion needs it in (0, 1)", "SignSGD"}},
    {"name: a\noptimizer: {kind: adam, rho: 0.9}\n", 2, 25,
     {"optimizer.rho: only rmsprop and adadelta use it", "kind is adam", "remove it or change kind"}},
    {"name: a\noptimizer: {kind: rmsprop, nesterov: true}\n", 2, 28,
     {"optimizer.nesterov: only sgd and momentum use it", "kind is rmsprop"}},
    {"name: a\noptimizer: {kind: adagrad, momentum: 0.9}\n", 2, 28,
     {"optimizer.momentum: only sgd, momentum and rmsprop use it", "kind is adagrad"}},
    {"name: a\noptimizer: {kind: sgd, epsilon: 1e-7}\n", 2, 24,
     {"optimizer.epsilon: only adam, adamax, nadam, lamb, rmsprop, adagrad and adadelta use it", "kind is sgd"}},
    {"name: a\noptimizer: {kind: rmsprop, initial_accumulator_value: 0.1}\n", 2, 28,
     {"optimizer.initial_accumulator_value: only adagrad uses it"}},
    {"name: a\noptimizer: {kind: rmsprop, rho: 1}\n", 2, 33,
     {"optimizer.rho: '1' is out of range", "[0, 1)"}},
    {"name: a\noptimizer: {kind: rmsprop, centered: maybe}\n", 2, 38, {"optimizer.centered"}},
    {"name: a\noptimizer: {kind: rmsprop, momentum: -0.5}\n", 2, 38,
     {"optimizer.momentum: '-0.5' is out of range"}},
    {"name: a\noptimizer: {kind: adagrad, initial_accumulator_value: -1}\n", 2, 55,
     {"optimizer.initial_accumulator_value: '-1' is out of range"}},
    {"name: a\noptimizer: {kind: adagrad, epsilon: 0}\n", 2, 37,
     {"optimizer.epsilon: '0' is out of range"}},
};
/* clang-format on */

static void test_errors(void **state)
{
    (void)state;
    scen_expect_errors(optim_errs, sizeof optim_errs / sizeof optim_errs[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
