/* Scenario files: a full file parses to the expected dsim_train_cfg, the
 * defaults, every class of error with its file:line:column and words, the
 * units, the refusals of what this build cannot run yet, --defaults read
 * back, and the plan's data section. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/comm.h"
#include "scenario/defaults.h"
#include "scenario/plan.h"
#include "scenario/scenario.h"
#include "scenario/units.h"

static dsim_scenario *parse_ok(const char *text)
{
    dsim_scenario *s = NULL;
    dsim_err e = dsim_scenario_parse("t.yaml", text, strlen(text), &s);
    if (e != DSIM_OK)
        fail_msg("unexpected error: %s\n--- in:\n%s", dsim_errmsg(), text);
    assert_non_null(s);
    return s;
}

/* The names of the checks a scenario judges, in order, '*' after one judged
 * by default: "gradient_consistency* shard_coverage*". */
static void expect_names(const dsim_scenario *s, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (size_t i = 0; i < s->n_expect; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s%s", i ? " " : "",
                 s->expect[i].check->name, s->expect[i].by_default ? "*" : "");
}

static void test_checks_by_default(void **state)
{
    (void)state;
    static const struct {
        const char *body, *want;
    } cases[] = {
        /* no expect: section at all: what applies */
        {"", "gradient_consistency* shard_coverage*"},
        /* named ones first, with their thresholds; the rest after */
        {"expect: {shard_coverage: {max_idle: 3}, convergence: {max_final_loss: 1}}\n",
         "shard_coverage convergence gradient_consistency*"},
        /* turned off */
        {"expect: {shard_coverage: off, gradient_consistency: false}\n", ""},
        /* a checkpoint written: checkpoint_roundtrip */
        {"checkpoint: {path: x.ckpt, every: 2}\n",
         "gradient_consistency* shard_coverage* checkpoint_roundtrip*"},
        /* faults: node_loss; a preemption writes a checkpoint too */
        {"checkpoint: {path: x.ckpt}\nfaults: [{what: preempt, at_step: 2}]\nrecovery: "
         "restart\n",
         "gradient_consistency* shard_coverage* node_loss* checkpoint_roundtrip*"},
        {"faults: [{what: kill, at_step: 2, rank: 1}]\nexpect: {node_loss: off}\n",
         "gradient_consistency* shard_coverage*"},
        /* asynchronous parameter servers: no step-wise state to compare */
        {"cluster: {hosts: 2, ps: 1}\nstrategy: {name: parameter_server, ps_mode: async}\n"
         "checkpoint: {path: x.ckpt, every: 2}\n",
         "shard_coverage*"},
        /* a run that must be refused judges nothing else */
        {"expect: {error: \"fewer input files\"}\n", ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char text[1024], got[256];
        snprintf(text, sizeof text, "name: d\ncluster: {hosts: 2}\n%s", cases[k].body);
        if (strstr(cases[k].body, "cluster:"))
            snprintf(text, sizeof text, "name: d\n%s", cases[k].body);
        dsim_scenario *s = parse_ok(text);
        expect_names(s, got, sizeof got);
        if (strcmp(got, cases[k].want) != 0)
            fail_msg("case %zu: judges \"%s\", expected \"%s\"\n%s", k, got, cases[k].want, text);
        dsim_scenario_free(s);
    }
    /* what `dsim list checks` says is judged by default is what is: on a
     * run where everything applies, exactly the checks that say so */
    dsim_scenario *all = parse_ok("name: all\ncluster: {hosts: 2}\ncheckpoint: {path: x.ckpt, "
                                  "every: 2}\nfaults: [{what: kill, at_step: 2, rank: 1}]\n");
    for (size_t i = 0; i < dsim_check_count(); i++) {
        const dsim_check_ops *ops = dsim_check_at(i);
        if ((ops->by_default != NULL) != dsim_scenario_check_applies(all, ops))
            fail_msg("%s: by_default says %s, the scenario's rule %s", ops->name,
                     ops->by_default ? ops->by_default : "(none)",
                     dsim_scenario_check_applies(all, ops) ? "applies it" : "does not");
    }
    dsim_scenario_free(all);
    /* `off` beside thresholds for the same check, or with expect.error */
    dsim_scenario *s = NULL;
    const char *twice = "name: d\nexpect: {shard_coverage: off, shard_coverage: {}}\n";
    assert_int_equal(dsim_scenario_parse("t.yaml", twice, strlen(twice), &s), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "expect.shard_coverage"));
    const char *err = "name: d\nexpect: {error: x, node_loss: off}\n";
    assert_int_equal(dsim_scenario_parse("t.yaml", err, strlen(err), &s), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "turning node_loss off means nothing"));
}

static const char full_yaml[] = "name: full-1.x\n"                                      /*  1 */
                                "description: \"every key\"\n"                          /*  2 */
                                "seed: 18446744073709551615\n"                          /*  3 */
                                "engine: threads\n"                                     /*  4 */
                                "cluster:\n"                                            /*  5 */
                                "  hosts: 3\n"                                          /*  6 */
                                "  devices_per_host: 2\n"                               /*  7 */
                                "  ps: 1\n"                                             /*  8 */
                                "  network:\n"                                          /*  9 */
                                "    preset: datacenter\n"                              /* 10 */
                                "    latency: 7us\n"                                    /* 11 */
                                "    bandwidth: 1.5GiB/s\n"                             /* 12 */
                                "strategy:\n"                                           /* 13 */
                                "  name: parameter_server\n"                            /* 14 */
                                "  communication: rhd\n"                                /* 15 */
                                "  ps_mode: async\n"                                    /* 16 */
                                "  timeout: 1500ms\n"                                   /* 17 */
                                "  health_check:\n"                                     /* 18 */
                                "    interval: 2m\n"                                    /* 19 */
                                "    timeout: 250us\n"                                  /* 20 */
                                "    retries: 5\n"                                      /* 21 */
                                "model:\n"                                              /* 22 */
                                "  kind: mlp\n"                                         /* 23 */
                                "  hidden: [32, 16]\n"                                  /* 24 */
                                "  loss: xent\n"                                        /* 25 */
                                "optimizer:\n"                                          /* 26 */
                                "  kind: adam\n"                                        /* 27 */
                                "  learning_rate: 0.002\n"                              /* 28 */
                                "  beta1: 0.8\n"                                        /* 29 */
                                "  beta2: 0.99\n"                                       /* 30 */
                                "  epsilon: 1e-8\n"                                     /* 31 */
                                "data:\n"                                               /* 32 */
                                "  task: classification\n"                              /* 33 */
                                "  examples: 1000\n"                                    /* 34 */
                                "  features: 5\n"                                       /* 35 */
                                "  classes: 3\n"                                        /* 36 */
                                "  noise: 0.1\n"                                        /* 37 */
                                "  files: 6\n"                                          /* 38 */
                                "  shard_policy: hint\n"                                /* 39 */
                                "  shard_hint: elements\n"                              /* 40 */
                                "  global_batch: 24\n"                                  /* 41 */
                                "  epochs: 3\n"                                         /* 42 */
                                "  shuffle: true\n"                                     /* 43 */
                                "  drop_remainder: true\n"                              /* 44 */
                                "checkpoint:\n"                                         /* 45 */
                                "  path: ckpt/full.ckpt\n"                              /* 46 */
                                "  every: 7\n"                                          /* 47 */
                                "faults:\n"                                             /* 48 */
                                "  - what: partition\n"                                 /* 49 */
                                "    at_time: 2s\n"                                     /* 50 */
                                "    link: [0, 5]\n"                                    /* 51 */
                                "    duration: 1h\n"                                    /* 52 */
                                "    one_way: true\n"                                   /* 53 */
                                "  - what: slow\n"                                      /* 54 */
                                "    probability: 0.25\n"                               /* 55 */
                                "    worker: 2\n"                                       /* 56 */
                                "    factor: 4\n"                                       /* 57 */
                                "  - {what: kill, at_phase: allreduce, rank: 3}\n"      /* 58 */
                                "recovery: restart\n"                                   /* 59 */
                                "expect:\n"                                             /* 60 */
                                "  gradient_consistency:\n"                             /* 61 */
                                "    max_rel_error: 1e-3\n"                             /* 62 */
                                "    bit_identical: false\n"                            /* 63 */
                                "  convergence: {max_final_loss: 0.8, expect: fail}\n"; /* 64 */

static void test_full(void **state)
{
    (void)state;
    dsim_scenario *s = parse_ok(full_yaml);
    const dsim_train_cfg *t = &s->train;
    assert_string_equal(s->path, "t.yaml");
    assert_string_equal(s->text, full_yaml);
    assert_string_equal(s->name, "full-1.x");
    assert_string_equal(s->description, "every key");
    assert_true(s->seed == UINT64_MAX);
    assert_true(t->seed == UINT64_MAX && t->data.seed == UINT64_MAX);
    assert_string_equal(s->engine, "threads");
    assert_ptr_equal(t->engine, s->engine);
    assert_int_equal(s->engine_pos.line, 4);
    assert_int_equal(s->engine_pos.column, 9);

    assert_int_equal(t->hosts, 3);
    assert_int_equal(t->devices_per_host, 2);
    assert_int_equal(t->num_ps, 1);
    assert_string_equal(s->network_preset, "datacenter");
    assert_int_equal(s->link_latency_ns, 7000);
    assert_true(s->link_bandwidth_Bps == 1.5 * 1024 * 1024 * 1024);

    assert_string_equal(t->strategy, "parameter_server");
    assert_null(t->plugin_path);
    assert_int_equal(t->communication, DSIM_ALGO_RHD);
    assert_int_equal(t->ps_mode, DSIM_PS_ASYNC);
    assert_int_equal(t->timeout_ns, 1500000000ll);
    assert_int_equal(s->health_interval_ns, 120000000000ll);
    assert_int_equal(s->health_timeout_ns, 250000);
    assert_int_equal(s->health_retries, 5);

    assert_int_equal(t->model.kind, DSIM_MODEL_MLP);
    assert_int_equal(t->model.loss, DSIM_LOSS_XENT);
    assert_int_equal(t->model.in_dim, 5);
    assert_int_equal(t->model.out_dim, 3);
    assert_int_equal(t->model.n_hidden, 2);
    assert_int_equal(t->model.hidden[0], 32);
    assert_int_equal(t->model.hidden[1], 16);

    assert_int_equal(t->optim.kind, DSIM_OPTIM_ADAM);
    assert_true(t->optim.lr == 0.002);
    assert_true(t->optim.beta1 == 0.8);
    assert_true(t->optim.beta2 == 0.99);
    assert_true(t->optim.epsilon == 1e-8);

    assert_int_equal(t->data.kind, DSIM_DATA_CLASSIFICATION);
    assert_int_equal(t->data.n_examples, 1000);
    assert_int_equal(t->data.in_dim, 5);
    assert_int_equal(t->data.out_dim, 3);
    assert_true(t->data.noise == 0.1);
    assert_int_equal(t->data.n_files, 6);
    assert_int_equal(t->data.teacher_hidden, 0);
    assert_false(t->in_memory);
    assert_null(t->dataset);
    assert_int_equal(t->shard, DSIM_SHARD_HINT);
    assert_int_equal(t->hint, DSIM_HINT_ELEMENTS);
    assert_int_equal(t->global_batch, 24);
    assert_int_equal(t->epochs, 3);
    assert_true(t->shuffle);
    assert_true(t->drop_remainder);
    assert_string_equal(t->checkpoint_path, "ckpt/full.ckpt");
    assert_int_equal(t->checkpoint_every, 7);
    assert_false(t->restore);
    assert_int_equal(t->stop_after, 0);

    assert_int_equal(s->n_faults, 3);
    const dsim_fault *f = s->faults;
    assert_int_equal(f[0].what, DSIM_FAULT_PARTITION);
    assert_int_equal(f[0].when, DSIM_WHEN_TIME);
    assert_int_equal(f[0].time_ns, 2000000000ll);
    assert_int_equal(f[0].link_from, 0);
    assert_int_equal(f[0].link_to, 5);
    assert_int_equal(f[0].rank, -1);
    assert_int_equal(f[0].worker, -1);
    assert_int_equal(f[0].duration_ns, 3600000000000ll);
    assert_true(f[0].one_way);
    assert_int_equal(f[0].line, 49);
    assert_int_equal(f[0].column, 5);
    assert_int_equal(f[1].what, DSIM_FAULT_SLOW);
    assert_int_equal(f[1].when, DSIM_WHEN_PROBABILITY);
    assert_true(f[1].probability == 0.25);
    assert_int_equal(f[1].worker, 2);
    assert_int_equal(f[1].rank, -1);
    assert_true(f[1].factor == 4);
    assert_int_equal(f[1].duration_ns, 0);
    assert_int_equal(f[2].what, DSIM_FAULT_KILL);
    assert_int_equal(f[2].when, DSIM_WHEN_PHASE);
    assert_string_equal(f[2].phase, "allreduce");
    assert_int_equal(f[2].rank, 3);
    assert_int_equal(f[2].link_from, -1);
    assert_int_equal(f[2].line, 58);

    assert_string_equal(s->recovery, "restart");
    assert_int_equal(s->recovery_pos.line, 59);
    assert_null(s->expect_error);
    /* the two it names, then what applies by default: shard_coverage and,
     * with faults, node_loss (asynchronous servers: no gradient_consistency
     * by default, no checkpoint_roundtrip) */
    assert_int_equal(s->n_expect, 4);
    assert_false(s->expect[0].by_default || s->expect[1].by_default);
    assert_string_equal(s->expect[2].check->name, "shard_coverage");
    assert_true(s->expect[2].by_default);
    assert_string_equal(s->expect[3].check->name, "node_loss");
    assert_true(s->expect[3].by_default);
    assert_int_equal(s->expect[3].pos.line, 0);
    const dsim_expect *x = &s->expect[0];
    assert_string_equal(x->check->name, "gradient_consistency");
    assert_false(x->expect_fail);
    assert_int_equal(x->pos.line, 61);
    int i = dsim_check_param_index(x->check, "max_rel_error");
    assert_true(i >= 0 && x->values[i] == 1e-3);
    i = dsim_check_param_index(x->check, "bit_identical");
    assert_true(i >= 0 && x->values[i] == 0);
    i = dsim_check_param_index(x->check, "max_abs_error");
    assert_true(i >= 0 && isnan(x->values[i])); /* unset: chosen by the run's dtypes */
    x = &s->expect[1];
    assert_string_equal(x->check->name, "convergence");
    assert_true(x->expect_fail);
    i = dsim_check_param_index(x->check, "max_final_loss");
    assert_true(i >= 0 && x->values[i] == 0.8);
    /* an optional threshold the file does not give stays unset */
    i = dsim_check_param_index(x->check, "within_pct_of_reference");
    assert_true(i >= 0 && isnan(x->values[i]));

    /* faults and recovery run now; what stops this one is its checkpoint
     * directory, which does not exist here */
    assert_int_equal(dsim_scenario_runnable(s), DSIM_ENOENT);
    assert_non_null(strstr(dsim_errmsg(), "t.yaml:46:9: checkpoint.path"));
    assert_string_equal(s->recovery, "restart");
    assert_int_equal(s->max_restarts, 3);
    dsim_scenario_free(s);
}

static void test_defaults(void **state)
{
    (void)state;
    dsim_scenario *s = parse_ok("name: x\n");
    dsim_train_cfg d;
    dsim_train_cfg_init(&d);
    const dsim_train_cfg *t = &s->train;
    assert_string_equal(s->name, "x");
    assert_null(s->description);
    assert_int_equal(s->seed, 1);
    assert_string_equal(s->engine, "threads");
    assert_int_equal(s->engine_pos.line, 0);
    assert_string_equal(s->network_preset, "loopback");
    assert_int_equal(s->health_interval_ns, 30000000000ll);
    assert_int_equal(s->health_timeout_ns, 10000000000ll);
    assert_int_equal(s->health_retries, 3);
    assert_int_equal(t->health_interval_ns, d.health_interval_ns);
    assert_int_equal(t->health_timeout_ns, d.health_timeout_ns);
    assert_int_equal(t->health_retries, d.health_retries);
    assert_string_equal(t->strategy, "multi_worker_mirrored");
    assert_null(t->plugin_path);
    assert_int_equal(t->hosts, d.hosts);
    assert_int_equal(t->devices_per_host, d.devices_per_host);
    assert_int_equal(t->num_ps, 0);
    assert_int_equal(t->ps_mode, d.ps_mode);
    assert_int_equal(t->communication, DSIM_ALGO_AUTO);
    assert_int_equal(t->timeout_ns, d.timeout_ns);
    assert_int_equal(t->model.kind, DSIM_MODEL_SOFTMAX);
    assert_int_equal(t->model.loss, DSIM_LOSS_AUTO);
    assert_int_equal(t->model.in_dim, 8);
    assert_int_equal(t->model.out_dim, 4);
    assert_int_equal(t->model.n_hidden, 0);
    assert_int_equal(t->optim.kind, DSIM_OPTIM_SGD);
    assert_true(t->optim.lr == d.optim.lr);
    assert_int_equal(t->data.kind, DSIM_DATA_CLASSIFICATION);
    assert_int_equal(t->data.n_examples, 512);
    assert_int_equal(t->data.n_files, 4);
    assert_false(t->in_memory);
    assert_true(t->data.noise == 0.05);
    assert_int_equal(t->shard, DSIM_SHARD_AUTO);
    assert_int_equal(t->hint, DSIM_HINT_NONE);
    assert_int_equal(t->global_batch, d.global_batch);
    assert_int_equal(t->epochs, d.epochs);
    assert_int_equal(t->shuffle, d.shuffle);
    assert_int_equal(t->drop_remainder, d.drop_remainder);
    assert_int_equal(t->seed, 1);
    assert_null(t->checkpoint_path);
    assert_int_equal(t->checkpoint_every, 0);
    assert_int_equal(s->n_faults, 0);
    /* by default: gradient_consistency and shard_coverage */
    assert_int_equal(s->n_expect, 2);
    assert_true(s->expect[0].by_default && s->expect[1].by_default);
    assert_string_equal(s->recovery, "none");
    assert_null(s->expect_error);
    assert_int_equal(dsim_scenario_runnable(s), DSIM_OK);
    dsim_scenario_free(s);

    /* regression takes a linear model with one output; files 0 is a source
     * without files; an mlp without widths takes one of 16; a checkpoint
     * path alone saves every 10 steps */
    s = parse_ok("name: r\ndata: {task: regression, files: 0}\n"
                 "checkpoint: {path: c.ckpt}\n");
    assert_int_equal(s->train.model.kind, DSIM_MODEL_LINEAR);
    assert_int_equal(s->train.model.out_dim, 1);
    assert_int_equal(s->train.data.kind, DSIM_DATA_REGRESSION);
    assert_true(s->train.in_memory);
    assert_int_equal(s->train.data.n_files, 1);
    assert_int_equal(s->train.checkpoint_every, 10);
    dsim_scenario_free(s);
    s = parse_ok("name: m\nmodel: {kind: mlp}\noptimizer: {kind: momentum, nesterov: true}\n");
    assert_int_equal(s->train.model.n_hidden, 1);
    assert_int_equal(s->train.model.hidden[0], 16);
    assert_int_equal(s->train.optim.kind, DSIM_OPTIM_MOMENTUM);
    assert_true(s->train.optim.momentum == 0.9);
    assert_int_equal(s->train.optim.nesterov, 1);
    assert_true(s->train.optim.clipvalue == 0 && s->train.optim.global_clipnorm == 0);
    dsim_scenario_free(s);
    s = parse_ok("name: m\noptimizer: {kind: adam, global_clipnorm: 1.5, weight_decay: 0.004}\n");
    assert_true(s->train.optim.global_clipnorm == 1.5 && s->train.optim.clipvalue == 0);
    assert_true(s->train.optim.weight_decay == 0.004);
    dsim_scenario_free(s);
    /* Keras's clipnorm: each variable's gradient by its own norm */
    s = parse_ok("name: m\noptimizer: {kind: adam, clipnorm: 0.5}\n");
    assert_true(s->train.optim.clipnorm == 0.5 && s->train.optim.global_clipnorm == 0);
    dsim_scenario_free(s);
    /* Keras's learning-rate schedules, with Keras's defaults where unsaid */
    s = parse_ok("name: m\noptimizer: {kind: adam, learning_rate: 0.01, schedule: {kind: "
                 "polynomial_decay, decay_steps: 100}}\n");
    const dsim_lr_schedule *ls = &s->train.optim.schedule;
    assert_int_equal(ls->kind, DSIM_LR_POLYNOMIAL);
    assert_true(ls->decay_steps == 100 && ls->end_lr == 0.0001 && ls->power == 1.0);
    assert_int_equal(ls->cycle, 0);
    dsim_scenario_free(s);
    s = parse_ok("name: m\noptimizer: {schedule: {kind: piecewise_constant, boundaries: [10, 20], "
                 "values: [0.4, 0.2, 0.1]}}\n");
    ls = &s->train.optim.schedule;
    assert_int_equal(ls->n_values, 3);
    assert_true(ls->boundaries[1] == 20 && ls->values[2] == 0.1);
    assert_true(s->train.optim.lr == 0.4); /* the first value is the rate it starts with */
    dsim_scenario_free(s);
    s = parse_ok("name: m\noptimizer: {learning_rate: 0, schedule: {kind: cosine_decay, "
                 "decay_steps: 50, warmup_target: 0.1, warmup_steps: 5}}\n");
    ls = &s->train.optim.schedule;
    assert_true(ls->warmup == 1 && ls->warmup_target == 0.1 && ls->warmup_steps == 5);
    assert_true(s->train.optim.lr == 0.0 && ls->alpha == 0.0);
    dsim_scenario_free(s);
    s = parse_ok("name: m\noptimizer: {kind: adam, gradient_accumulation_steps: 8}\n");
    assert_int_equal(s->train.optim.gradient_accumulation_steps, 8);
    dsim_scenario_free(s);
    s = parse_ok("name: m\noptimizer: {schedule: {kind: exponential_decay, decay_steps: 3, "
                 "decay_rate: 0.5, staircase: true}}\n");
    assert_true(s->train.optim.schedule.staircase == 1 &&
                s->train.optim.schedule.decay_rate == 0.5);
    dsim_scenario_free(s);
    s = parse_ok("name: m\ncluster: {hosts: 2, ps: 1}\nstrategy: {name: parameter_server}\n"
                 "optimizer: {clipvalue: 0.5}\n");
    assert_true(s->train.optim.clipvalue == 0.5);
    dsim_scenario_free(s);

    /* timeout 0 is no deadline and interval 0 turns the health check off;
     * both reach the job's configuration */
    s = parse_ok("name: z\nstrategy: {timeout: 0s, health_check: {interval: 0, timeout: 20ms, "
                 "retries: 2}}\n");
    assert_int_equal(s->train.timeout_ns, 0);
    assert_int_equal(s->train.health_interval_ns, 0);
    assert_int_equal(s->train.health_timeout_ns, 20000000);
    assert_int_equal(s->train.health_retries, 2);
    dsim_scenario_free(s);
    s = parse_ok("name: z\nstrategy: {timeout: 0, health_check: {interval: 100ms}}\n");
    assert_int_equal(s->train.timeout_ns, 0);
    assert_int_equal(s->train.health_interval_ns, 100000000);
    assert_int_equal(s->train.health_timeout_ns, 10000000000ll);
    dsim_scenario_free(s);

    /* empty sections and an empty expect entry are allowed */
    s = parse_ok("name: e\ncluster:\nstrategy: {}\nfaults: []\nexpect:\n  shard_coverage:\n");
    assert_int_equal(s->n_expect, 2); /* and gradient_consistency by default */
    assert_false(s->expect[0].by_default);
    assert_true(s->expect[1].by_default);
    assert_int_equal(s->n_faults, 0);
    dsim_scenario_free(s);
}

/* `dsim validate --defaults` reads back as the defaults. */
static void test_defaults_text(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(dsim_scenario_write_defaults(f), DSIM_OK);
    assert_int_equal(fclose(f), 0);
    dsim_scenario *a = NULL, *b = parse_ok("name: example\n");
    dsim_err e = dsim_scenario_parse("defaults.yaml", buf, len, &a);
    if (e != DSIM_OK)
        fail_msg("the defaults do not parse: %s", dsim_errmsg());
    const dsim_train_cfg *x = &a->train, *y = &b->train;
    assert_string_equal(a->name, b->name);
    assert_true(a->seed == b->seed);
    assert_string_equal(a->engine, b->engine);
    assert_string_equal(a->network_preset, b->network_preset);
    assert_int_equal(a->link_latency_ns, b->link_latency_ns);
    assert_true(a->link_bandwidth_Bps == b->link_bandwidth_Bps);
    assert_int_equal(a->health_interval_ns, b->health_interval_ns);
    assert_int_equal(a->health_timeout_ns, b->health_timeout_ns);
    assert_int_equal(a->health_retries, b->health_retries);
    assert_string_equal(a->recovery, b->recovery);
    assert_int_equal(a->n_faults, 0);
    assert_int_equal(a->n_expect, b->n_expect);
    assert_string_equal(x->strategy, y->strategy);
    assert_int_equal(x->hosts, y->hosts);
    assert_int_equal(x->devices_per_host, y->devices_per_host);
    assert_int_equal(x->num_ps, y->num_ps);
    assert_int_equal(x->communication, y->communication);
    assert_int_equal(x->timeout_ns, y->timeout_ns);
    assert_memory_equal(&x->model, &y->model, sizeof x->model);
    assert_memory_equal(&x->optim, &y->optim, sizeof x->optim);
    assert_memory_equal(&x->data, &y->data, sizeof x->data);
    assert_int_equal(x->in_memory, y->in_memory);
    assert_int_equal(x->shard, y->shard);
    assert_int_equal(x->hint, y->hint);
    assert_int_equal(x->global_batch, y->global_batch);
    assert_int_equal(x->epochs, y->epochs);
    assert_int_equal(x->shuffle, y->shuffle);
    assert_int_equal(x->drop_remainder, y->drop_remainder);
    assert_null(x->checkpoint_path);
    /* every top-level key is stated (as a key or a commented example) */
    static const char *const keys[] = {
        "name:",         "description:", "seed:",   "engine:",     "cluster:",    "strategy:",
        "model:",        "optimizer:",   "data:",   "checkpoint:", "faults:",     "recovery:",
        "expect:",       "tf_config:",   "plugin:", "ps_mode:",    "hidden:",     "momentum:",
        "nesterov:",     "beta1:",       "beta2:",  "epsilon:",    "shard_hint:", "every:",
        "health_check:", "retries:"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strstr(buf, keys[i]))
            fail_msg("--defaults lacks %s", keys[i]);
    dsim_scenario_free(a);
    dsim_scenario_free(b);
    free(buf);
}

/* ---- errors: a table of snippets ---- */

typedef struct err_case {
    const char *yaml;
    int line, col;
    const char *words[4];
} err_case;

/* clang-format off */
static const err_case err_cases[] = {
    /* bad values */
    {"name: a\nstrategy:\n  communication: fastest\n", 3, 18,
     {"strategy.communication: 'fastest' is not an algorithm",
      "accepted: auto, ring, rhd, tree, reduce_to_one"}},
    {"name: a\ncluster:\n  hosts: two\n", 3, 10,
     {"cluster.hosts: 'two' is not a whole number", "accepted: 1..65536"}},
    {"name: a\ncluster:\n  hosts: 0\n", 3, 10, {"cluster.hosts: '0' is out of range", "1..65536"}},
    {"name: a\ncluster: {hosts: \"2\"}\n", 2, 18, {"cluster.hosts", "quoted", "1..65536"}},
    {"name: a\ncluster: {hosts: 2.5}\n", 2, 18, {"'2.5' is not a whole number"}},
    {"name: a\ncluster: {hosts: 256, devices_per_host: 512}\n", 2, 41,
     {"256 host(s) x 512 device(s) is 131072 replicas", "at most 65536"}},
    {"name: a\ncluster: {hosts: 512, devices_per_host: 16, ps: 8}\nstrategy: {name: "
     "parameter_server}\n",
     2, 49, {"8192 replica(s) with 8 parameter server(s) need 73728 runtime workers"}},
    {"name: a\ncluster: {hosts: {x: 1}}\n", 2, 18, {"a mapping is not a whole number"}},
    {"name: a\ncluster: {devices_per_host: 5000}\n", 2, 29,
     {"cluster.devices_per_host", "1..4096"}},
    {"name: a\ncluster: {ps: -1}\n", 2, 15, {"cluster.ps", "0..64"}},
    /* dsim_train runs at most 64 servers: more must not pass validation */
    {"name: a\ncluster: {ps: 65}\nstrategy: {name: parameter_server}\n", 2, 15,
     {"cluster.ps: '65' is out of range", "0..64"}},
    {"name: a\nseed: -1\n", 2, 7, {"seed: '-1' is not a whole number"}},
    {"name: a\nseed: 18446744073709551616\n", 2, 7,
     {"seed", "out of range", "18446744073709551615"}},
    {"name: a\nengine: gpu\n", 2, 9, {"engine: 'gpu' is not an engine", "threads, processes, sim"}},
    {"name: a\nrecovery: sometimes\n", 2, 11, {"recovery", "none, restart"}},
    {"name: a\nrecovery: {policy: none, max_restarts: 2}\n", 2, 26,
     {"recovery.max_restarts", "policy is none"}},
    {"name: a\nrecovery: {policy: restart, max_restarts: 101}\n", 2, 43, {"max_restarts"}},
    {"name: a\nrecovery: {policy: restart, tries: 1}\n", 2, 29, {"tries", "max_restarts"}},
    {"name: a b\n", 1, 7, {"name: 'a b' is not a name", "A-Z"}},
    {"name:\n", 1, 6, {"name: an empty value"}},
    {"name: \"a\\0b\"\n", 1, 7, {"name", "NUL byte"}},
    {"seed: 3\n", 1, 1, {"name: missing"}},
    {"name: a\ncluster: 3\n", 2, 10, {"cluster: '3' is not a mapping", "hosts, devices_per_host"}},
    {"name: a\nfaults: {what: kill}\n", 2, 9, {"faults: a mapping is not a list"}},
    /* keys */
    {"name: a\nseed: 1\nseed: 2\n", 3, 1, {"seed: the key appears twice", "line 2, column 1"}},
    {"name: a\ndata:\n  epochs: 1\n  epochs: 2\n", 4, 3, {"data.epochs: the key appears twice"}},
    {"name: a\nstrategy:\n  tiemout: 30s\n", 3, 3,
     {"strategy: unknown key 'tiemout'", "did you mean 'timeout'", "accepted: name, plugin"}},
    {"name: a\nclustr: {}\n", 2, 1, {"unknown key 'clustr'", "accepted: name, description"}},
    {"? {a: 1}\n: 2\n", 1, 3, {"a key must be", "not a mapping"}},
    /* YAML itself */
    {"name: a\ncluster: {hosts: [1\n", 3, 1, {"YAML syntax", "flow sequence"}},
    {"name: a\n  bad: indent\n", 2, 3,
     {"the indentation: 'bad' is 2 spaces in, deeper than the key above it (line 1, 0 in)",
      "YAML syntax at line 2, column 6: mapping values are not allowed"}},
    /* a key one space in is reported where it is, not on the line after */
    {"name: t5\nseed: 1\nengine: threads\nstrategy:\n  name: mirrored\ncluster:\n hosts: 2\n"
     "  devices_per_host: 2\n",
     7, 2,
     {"the indentation: 'hosts' is 1 space in, where the other keys of 'cluster' (line 6) are 2 "
      "in; indent it like them",
      "YAML syntax at line 8, column 19: mapping values are not allowed"}},
    {"name: a\ncluster:\n  devices_per_host: 1\n hosts: 2\n", 4, 2,
     {"the indentation: 'hosts' is 1 space in, between the levels around it (0 and 2)",
      "did not find expected key"}},
    {"name: a\nfaults:\n- what: kill\n  rank: 1\n at_step: 2\n", 5, 2,
     {"the indentation: 'at_step' is 1 space in"}},
    {"name: a\ncluster:\n\thosts: 2\n", 3, 1,
     {"the indentation holds a tab; YAML indents with spaces only"}},
    {"name: \"open\n", 2, 1, {"YAML syntax", "quoted scalar"}},
    {"name: a\nx: \xff\n", 2, 4, {"YAML syntax", "UTF-8", "0xff"}},
    {"", 1, 1, {"the file is empty"}},
    {"# nothing\n\n", 1, 1, {"the file is empty"}},
    {"- a\n- b\n", 1, 1, {"the top level is a list, not a mapping"}},
    {"just text\n", 1, 1, {"the top level is 'just text', not a mapping"}},
    {"name: &n a\n", 1, 7, {"anchors (&n)", "not supported"}},
    {"name: a\nseed: *s\n", 2, 7, {"aliases (*s)", "not supported"}},
    {"name: !!str a\n", 1, 7, {"tags", "not supported"}},
    {"name: a\n---\nname: b\n", 2, 1, {"a second YAML document"}},
    {"name: a\nx: "
     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n", 2, 35,
     {"nested deeper than 32 levels"}},
    /* units */
    {"name: a\nstrategy: {timeout: 30}\n", 2, 21,
     {"strategy.timeout: '30' has no unit", "e.g. 30s or 500ms", "ns, us, ms, s, m, h"}},
    {"name: a\nstrategy: {timeout: 30 parsecs}\n", 2, 21, {"unit 'parsecs'", "ns, us, ms"}},
    {"name: a\nstrategy: {health_check: {timeout: 0s}}\n", 2, 36,
     {"strategy.health_check.timeout: '0s' is too short"}},
    {"name: a\nstrategy: {timeout: 0.5}\n", 2, 21, {"strategy.timeout: '0.5' has no unit"}},
    {"name: a\nstrategy: {timeout: 0.0000000001ns}\n", 2, 21,
     {"strategy.timeout: '0.0000000001ns' is more than 0 but less than 1ns, the smallest "
      "duration there is, so it would be 0"}},
    {"name: a\nstrategy: {timeout: 9999999999999h}\n", 2, 21, {"too large for a duration"}},
    {"name: a\nstrategy: {health_check: {interval: -5s}}\n", 2, 37,
     {"strategy.health_check.interval", "negative"}},
    {"name: a\nstrategy: {health_check: {retries: many}}\n", 2, 36, {"retries", "0..1000"}},
    {"name: a\ncluster: {network: {bandwidth: 10GB}}\n", 2, 32,
     {"cluster.network.bandwidth: '10GB' is not a bandwidth", "10GB/s"}},
    {"name: a\ncluster: {network: {bandwidth: 0GB/s}}\n", 2, 32, {"is zero"}},
    {"name: a\ncluster: {network: {preset: custom, latency: 5us}}\n", 2, 29,
     {"custom needs both latency and bandwidth", "missing: bandwidth"}},
    {"name: a\ncluster: {network: {preset: wifi}}\n", 2, 29,
     {"loopback, datacenter, ethernet_10g, 1gbe, 10gbe, 25gbe, ib100, pcie4, nvlink, custom"}},
    /* cluster and strategy */
    {"name: a\nstrategy: {name: foo}\n", 2, 18,
     {"strategy.name: 'foo' is not a registered strategy", "multi_worker_mirrored",
      "parameter_server", "plugin:"}},
    {"name: a\ncluster: {hosts: 2}\nstrategy: {name: mirrored}\n", 3, 18,
     {"mirrored runs on one host", "2 hosts x 1 device", "multi_worker_mirrored"}},
    {"name: a\ncluster: {devices_per_host: 2}\nstrategy: {name: one_device}\n", 3, 18,
     {"one_device runs on 1 host x 1 device", "2 devices"}},
    {"name: a\nstrategy: {name: parameter_server}\n", 2, 18,
     {"parameter_server needs at least one parameter server", "cluster.ps"}},
    {"name: a\ncluster: {ps: 1}\n", 2, 1,
     {"multi_worker_mirrored runs without parameter servers", "1 parameter server"}},
    {"name: a\nstrategy: {name: central_storage, ps_mode: async}\n", 2, 35,
     {"strategy.ps_mode: only parameter_server has a mode"}},
    {"name: a\nstrategy: {ps_mode: later}\n", 2, 21, {"sync, async"}},
    {"name: a\nstrategy: {name: mine, plugin: nope/libnope.so}\n", 2, 32,
     {"strategy.plugin: 'nope/libnope.so' not found", "relative to the scenario file"}},
    {"name: a\nstrategy: {name: mirrored, plugin: x.so}\n", 2, 18,
     {"'mirrored' is a built-in strategy"}},
    {"name: a\nstrategy: {name: My-Strategy, plugin: x.so}\n", 2, 18,
     {"is not a strategy name", "a-z, 0-9 and _"}},
    {"name: a\nstrategy: {plugin: x.so}\n", 2, 12, {"a plugin needs strategy.name"}},
    {"name: a\ncluster: {hosts: 2, tf_config: '{}'}\n", 2, 21,
     {"hosts (line 2) and tf_config both give the workers"}},
    {"name: a\ncluster:\n  tf_config: '{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": "
     "{\"type\": \"worker\", \"index\": 3}}'\n", 3, 14,
     {"cluster.tf_config", "task.index", "accepted: 0..0"}},
    {"name: a\ncluster:\n  ps: 2\n  tf_config: {cluster: {worker: [\"a:1\"], ps: [\"b:1\"]}, "
     "task: {type: worker, index: 0}}\nstrategy: {name: parameter_server}\n", 3, 7,
     {"cluster.ps: 2, but tf_config's ps job has 1 task"}},
    {"name: a\ncluster:\n  tf_config: {cluster: {worker: [\"a:1\"]}, cluster: {}}\n", 3, 43,
     {"cluster.tf_config: the key 'cluster' appears twice"}},
    /* model, optimizer, data */
    {"name: a\nmodel: {kind: linear}\n", 2, 15,
     {"linear with loss mse cannot learn class labels", "softmax"}},
    {"name: a\ndata: {task: regression}\nmodel: {kind: softmax}\n", 3, 15,
     {"softmax with loss xent needs class labels", "regression"}},
    {"name: a\ndata: {task: regression}\nmodel: {kind: mlp}\n", 3, 15, {"loss: mse"}},
    {"name: a\nmodel: {hidden: [8]}\n", 2, 9, {"model.hidden: only an mlp has hidden layers"}},
    {"name: a\nmodel: {kind: mlp, hidden: [8, 8, 8]}\n", 2, 28, {"one or two widths"}},
    {"name: a\nmodel: {kind: mlp, hidden: [8, 0]}\n", 2, 32,
     {"model.hidden[1]: '0' is out of range"}},
    {"name: a\nmodel: {loss: hinge}\n", 2, 15,
     {"model.loss: 'hinge' is not a loss", "auto, mse, xent"}},
    {"name: a\noptimizer: {kind: momentum, momentum: 1}\n", 2, 39,
     {"optimizer.momentum: '1' is out of range", "[0, 1)"}},
    {"name: a\noptimizer: {beta1: 0.5}\n", 2, 13,
     {"optimizer.beta1: only adam, adamax, nadam, lamb and lion use it", "kind is sgd"}},
    {"name: a\noptimizer: {learning_rate: 0}\n", 2, 28, {"learning_rate", "out of range", "(0, "}},
    {"name: a\noptimizer: {learning_rate: fast}\n", 2, 28, {"'fast' is not a number"}},
    {"name: a\noptimizer: {kind: rmsprop9}\n", 2, 19, {"sgd, momentum, adam, adamax, rmsprop"}},
    {"name: a\noptimizer: {clipvalue: 1, global_clipnorm: 1}\n", 2, 27,
     {"only one of clipvalue, global_clipnorm and clipnorm", "remove the others"}},
    {"name: a\noptimizer: {clipvalue: -1}\n", 2, 24,
     {"optimizer.clipvalue: '-1' is out of range"}},
    {"name: a\noptimizer: {clipnorm: 1, clipvalue: 2}\n", 2, 13,
     {"optimizer.clipnorm: only one of clipvalue, global_clipnorm and clipnorm"}},
    {"name: a\noptimizer: {clipnorm: 0}\n", 2, 23, {"optimizer.clipnorm: '0' is out of range"}},
    {"name: a\noptimizer: {weight_decay: -1}\n", 2, 27,
     {"optimizer.weight_decay: '-1' is out of range"}},
    {"name: a\noptimizer: {schedule: {kind: exponential_decay, decay_rate: 0.9}}\n", 2, 13,
     {"optimizer.schedule: exponential_decay needs decay_steps"}},
    {"name: a\noptimizer: {gradient_accumulation_steps: 2}\nmixed_precision: {policy: "
     "mixed_float16}\n",
     3, 27, {"mixed_float16's loss scale skips steps as tf.keras does", "mixed_bfloat16"}},
    {"name: a\noptimizer: {gradient_accumulation_steps: -2}\n", 2, 42,
     {"optimizer.gradient_accumulation_steps: '-2' is out of range", "0..1000000"}},
    {"name: a\noptimizer: {schedule: {kind: step}}\n", 2, 30,
     {"'step' is not a learning-rate schedule", "cosine_decay"}},
    {"name: a\noptimizer: {schedule: {kind: cosine_decay, decay_steps: 5, staircase: true}}\n", 2,
     60, {"schedule.staircase: schedule kind cosine_decay does not use staircase"}},
    {"name: a\noptimizer: {schedule: {kind: piecewise_constant, boundaries: [10], values: "
     "[0.1]}}\n",
     2, 76, {"1 values for 1 boundaries", "one value more than boundaries"}},
    {"name: a\noptimizer: {schedule: {kind: piecewise_constant, boundaries: [10, 5], values: "
     "[0.1, 0.01, 0.001]}}\n",
     2, 67, {"boundaries[1]: 5 is not above the one before (10)"}},
    {"name: a\noptimizer: {schedule: {kind: cosine_decay, decay_steps: 5, warmup_steps: 3}}\n", 2,
     60, {"warmup_steps: a warmup needs warmup_target"}},
    {"name: a\noptimizer: {learning_rate: 0.2, schedule: {kind: piecewise_constant, boundaries: "
     "[10], values: [0.1, 0.01]}}\n",
     2, 28, {"starts at its values[0] (0.1); remove learning_rate"}},
    {"name: a\noptimizer: {learning_rate: 0, schedule: {kind: cosine_decay, decay_steps: 5}}\n", 2,
     28, {"'0' is out of range", "warmup starts"}},
    {"name: a\ncluster: {hosts: 2, ps: 1}\nstrategy: {name: parameter_server}\n"
     "optimizer: {global_clipnorm: 1}\n",
     4, 13, {"parameter_server does not clip by the global norm", "use clipvalue"}},
    {"name: a\ncluster: {hosts: 2, ps: 1}\nstrategy: {name: parameter_server}\n"
     "mixed_precision: {policy: mixed_float16}\n",
     4, 27, {"parameter_server does not run mixed_float16", "mixed_bfloat16"}},
    {"name: a\nstrategy: {name: central_storage, gradient_dtype: float16}\n", 2, 51,
     {"strategy.gradient_dtype: central_storage sends the gradients to the host", "remove it"}},
    {"name: a\ndata: {examples: 0}\n", 2, 18,
     {"data.examples: '0' is out of range", "1..4294967296"}},
    {"name: a\ndata: {examples: 4294967297}\n", 2, 18, {"out of range"}},
    {"name: a\ndata: {classes: 1}\n", 2, 17, {"data.classes", "2..16777216"}},
    {"name: a\ndata: {noise: 1.5}\n", 2, 15, {"data.noise: '1.5' is out of range", "[0, 1]"}},
    {"name: a\ndata: {shard_policy: random}\n", 2, 22,
     {"data.shard_policy: 'random' is not a shard policy", "off, auto, file, data, hint"}},
    {"name: a\ndata: {shard_hint: files}\n", 2, 8,
     {"data.shard_hint: only used with shard_policy: hint"}},
    {"name: a\ndata: {global_batch: 0}\n", 2, 22,
     {"data.global_batch: '0' is out of range", "1.."}},
    {"name: a\ndata: {epochs: 0}\n", 2, 16, {"data.epochs"}},
    {"name: a\ndata: {shuffle: yes}\n", 2, 17,
     {"data.shuffle: 'yes' is not a boolean", "true, false"}},
    {"name: a\ndata: {files: 2000000}\n", 2, 15, {"data.files", "0..1048576"}},
    {"name: a\ncheckpoint: {every: 5}\n", 2, 14, {"checkpoint.every: there is no checkpoint.path"}},
    /* faults */
    {"name: a\nfaults:\n  - at_step: 1\n", 3, 5, {"faults[0].what: missing", "kill, restart"}},
    {"name: a\nfaults:\n  - what: explode\n    at_step: 1\n", 3, 11, {"'explode' is not a fault"}},
    /* every kind is named, the preemption notice too (fault/kinds.c's table) */
    {"name: a\nfaults:\n  - {at_step: 1, rank: 0}\n", 3, 5,
     {"faults[0].what: missing", "pause, preempt"}},
    {"name: a\nfaults:\n  - {what: bogus, at_step: 1}\n", 3, 12, {"stagger, pause, preempt"}},
    {"name: a\nfaults:\n  - {what: drop, at_step: 1, probability: 0.5}\n", 3, 30,
     {"faults[0].probability: a fault has one 'when'", "at_step is already given"}},
    {"name: a\nfaults:\n  - {what: drop}\n", 3, 6, {"faults[0]: the drop fault has no 'when'"}},
    {"name: a\nfaults:\n  - {what: kill, at_step: 1}\n", 3, 6,
     {"a kill fault needs a rank:, worker:"}},
    {"name: a\ncluster: {hosts: 2}\nfaults:\n  - {what: drop, at_step: 1, link: [1, 1]}\n", 4, 36,
     {"faults[0].link: [1, 1] joins a rank to itself"}},
    {"name: a\nfaults:\n  - {what: drop, at_step: 1, link: [0, 1]}\n", 3, 40,
     {"faults[0].link[1]", "0..0"}},
    {"name: a\nfaults:\n  - {what: kill, at_step: 1, rank: 0, duration: 1s}\n", 3, 39,
     {"faults[0].duration: a kill is for good"}},
    {"name: a\nfaults:\n  - {what: drop, at_step: 1, factor: 2}\n", 3, 30,
     {"only a slow fault has a factor"}},
    {"name: a\nfaults:\n  - {what: delay, at_step: 1}\n", 3, 6, {"a delay fault needs latency:"}},
    {"name: a\nfaults:\n  - {what: kill, at_step: 1, worker: 1}\n", 3, 38,
     {"faults[0].worker", "0..0"}},
    {"name: a\nfaults:\n  - {what: kill, at_step: 1, rank: 0, worker: 0}\n", 3, 39,
     {"faults[0].worker: a fault has one 'where'"}},
    {"name: a\nfaults:\n  - {what: drop, probability: 1.5}\n", 3, 31, {"(0, 1]"}},
    {"name: a\nfaults:\n  - {what: drop, at_phase: lunch}\n", 3, 28, {"rendezvous", "allreduce"}},
    {"name: a\nfaults:\n  -\n", 3, 4, {"faults[0]: an empty fault"}},
    /* expect */
    {"name: a\nexpect: {gradient: {}}\n", 2, 10,
     {"expect: unknown check 'gradient'", "gradient_consistency, shard_coverage", "error"}},
    {"name: a\nexpect: {gradient_consistncy: {}}\n", 2, 10,
     {"did you mean 'gradient_consistency'"}},
    {"name: a\nexpect:\n  gradient_consistency: {max_err: 1}\n", 3, 26,
     {"expect.gradient_consistency: unknown threshold 'max_err'",
      "accepted: max_rel_error, max_abs_error, bit_identical, max_loss_rel_error, expect"}},
    {"name: a\nexpect:\n  gradient_consistency: {max_rel_error: 2}\n", 3, 41,
     {"expect.gradient_consistency.max_rel_error: '2' is out of range", "0..1"}},
    {"name: a\nexpect:\n  shard_coverage: {max_misses: 1.5}\n", 3, 32,
     {"expect.shard_coverage.max_misses", "whole number"}},
    {"name: a\nexpect:\n  shard_coverage: {expect: maybe}\n", 3, 28,
     {"'maybe' is not an outcome", "pass, fail"}},
    {"name: a\nexpect:\n  shard_coverage: 3\n", 3, 19,
     {"expect.shard_coverage: '3' is not a mapping"}},
    {"name: a\nexpect:\n  shard_coverage: {}\n  shard_coverage: {}\n", 4, 3, {"appears twice"}},
    {"name: a\nexpect:\n  error: fewer input files\n  shard_coverage: {}\n", 3, 3,
     {"expect.error: a run that must fail runs no checks"}},
    {"name: a\nexpect: [shard_coverage]\n", 2, 9, {"expect: a list is not a mapping"}},
};
/* clang-format on */

static void check_err(const char *yaml, int line, int col, const char *const *words, size_t nw)
{
    dsim_scenario *s = (dsim_scenario *)0x1;
    dsim_err e = dsim_scenario_parse("t.yaml", yaml, strlen(yaml), &s);
    if (e != DSIM_EINVAL)
        fail_msg("expected DSIM_EINVAL, got %d (%s) for:\n%s", (int)e, dsim_errmsg(), yaml);
    assert_null(s);
    char where[64];
    snprintf(where, sizeof where, "t.yaml:%d:%d: ", line, col);
    const char *msg = dsim_errmsg();
    if (strncmp(msg, where, strlen(where)) != 0)
        fail_msg("expected the message to start with '%s', got:\n  %s\nfor:\n%s", where, msg, yaml);
    for (size_t i = 0; i < nw && words[i]; i++)
        if (!strstr(msg, words[i]))
            fail_msg("expected '%s' in:\n  %s\nfor:\n%s", words[i], msg, yaml);
}

static void test_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof err_cases / sizeof err_cases[0]; i++)
        check_err(err_cases[i].yaml, err_cases[i].line, err_cases[i].col, err_cases[i].words, 4);
}

/* A plugin's path is relative to the scenario file, or a file name found on
 * DSIM_PLUGIN_PATH, and must exist. */
/* matrix: a cross product of runs from one file */
static void test_matrix(void **state)
{
    (void)state;
    const char *text = "name: m\n"
                       "cluster: {hosts: 2, devices_per_host: 2}\n"
                       "data: {examples: 64, features: 4}\n"
                       "matrix:\n"
                       "  cluster: [{hosts: 1, devices_per_host: 3}, {hosts: 5}]\n"
                       "  data.features: [1, 6, 9]\n"
                       "  seed: [7, 8]\n";
    dsim_scenario *s = parse_ok(text);
    assert_int_equal(dsim_scenario_combinations(s), 12);
    assert_int_equal(s->combination, -1);
    assert_string_equal(s->name, "m");
    /* combination 5: cluster 0, features index 2, seed index 1 */
    dsim_scenario *c = NULL;
    assert_int_equal(dsim_scenario_combination(s, 5, &c), DSIM_OK);
    assert_string_equal(c->name, "m[hosts=1,devices_per_host=3,data.features=9,seed=8]");
    assert_string_equal(c->label, "hosts=1,devices_per_host=3,data.features=9,seed=8");
    assert_int_equal(c->combination, 5);
    assert_int_equal(c->train.hosts, 1);
    assert_int_equal(c->train.devices_per_host, 3);
    assert_int_equal(c->train.data.in_dim, 9);
    assert_int_equal(c->seed, 8);
    assert_int_equal(c->train.seed, 8);
    assert_int_equal(c->train.data.n_examples, 64); /* the rest as the file says */
    dsim_scenario_free(c);
    /* a mapping merges into the section: {hosts: 5} keeps devices_per_host */
    assert_int_equal(dsim_scenario_combination(s, 6, &c), DSIM_OK);
    assert_int_equal(c->train.hosts, 5);
    assert_int_equal(c->train.devices_per_host, 2);
    dsim_scenario_free(c);
    assert_int_equal(dsim_scenario_combination(s, 12, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "the matrix has 12 (0..11)"));
    dsim_scenario_free(s);

    /* without a matrix: one run, the file itself */
    s = parse_ok("name: plain\n");
    assert_int_equal(dsim_scenario_combinations(s), 1);
    assert_int_equal(dsim_scenario_combination(s, 0, &c), DSIM_OK);
    assert_string_equal(c->name, "plain");
    dsim_scenario_free(c);
    dsim_scenario_free(s);

    /* errors, where the matrix says it */
    check_err("name: a\nmatrix: [1, 2]\n", 2, 9, (const char *const[]){"is not a mapping"}, 1);
    check_err("name: a\nmatrix:\n  expect: [{}]\n", 3, 3,
              (const char *const[]){"matrix.expect: not a setting a matrix can vary"}, 1);
    check_err("name: a\nmatrix:\n  data.features.x: [1]\n", 3, 3,
              (const char *const[]){"not a setting"}, 1);
    check_err("name: a\nmatrix:\n  seed: 3\n", 3, 9,
              (const char *const[]){"matrix.seed: '3' is not a list"}, 1);
    check_err("name: a\nmatrix:\n  seed: []\n", 3, 9, (const char *const[]){"not a list"}, 1);
    check_err("name: a\nmatrix:\n  seed: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]\n"
              "  data.features: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]\n",
              4, 18, (const char *const[]){"more than 256 combinations"}, 1);
    /* a bad value shows where the matrix gives it */
    s = parse_ok("name: a\nmatrix:\n  cluster.hosts: [2, 0]\n");
    c = (dsim_scenario *)0x1;
    assert_int_equal(dsim_scenario_combination(s, 1, &c), DSIM_EINVAL);
    assert_null(c);
    if (!strstr(dsim_errmsg(), "t.yaml:3:22: cluster.hosts"))
        fail_msg("got: %s", dsim_errmsg());
    dsim_scenario_free(s);
}

static void test_plugin_path(void **state)
{
    (void)state;
    char dir[] = "/tmp/dsim-scen-plugin-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char so[128], yaml[128], text[256];
    snprintf(so, sizeof so, "%s/libmine.so", dir);
    snprintf(yaml, sizeof yaml, "%s/s.yaml", dir);
    FILE *f = fopen(so, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(text, sizeof text,
             "name: p\ncluster: {hosts: 2}\nstrategy: {name: mine, plugin: libmine.so}\n");
    f = fopen(yaml, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(yaml, &s) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    assert_string_equal(s->train.strategy, "mine");
    assert_string_equal(s->train.plugin_path, so);
    dsim_scenario_free(s);
    /* the same text read from another directory does not find it */
    s = (dsim_scenario *)0x1;
    assert_int_equal(dsim_scenario_parse("elsewhere/s.yaml", text, strlen(text), &s), DSIM_EINVAL);
    assert_null(s);
    assert_non_null(strstr(dsim_errmsg(), "'libmine.so' not found; build the plugin"));
    assert_non_null(strstr(dsim_errmsg(), "(looked in: elsewhere"));
    /* ... unless its directory is on DSIM_PLUGIN_PATH (--plugin-dir) */
    setenv("DSIM_PLUGIN_PATH", dir, 1);
    s = NULL;
    if (dsim_scenario_parse("elsewhere/s.yaml", text, strlen(text), &s) != DSIM_OK)
        fail_msg("%s", dsim_errmsg());
    assert_string_equal(s->train.plugin_path, so);
    dsim_scenario_free(s);
    unsetenv("DSIM_PLUGIN_PATH");
    unlink(so);
    unlink(yaml);
    rmdir(dir);
    /* a missing file */
    assert_int_equal(dsim_scenario_load("/nonexistent/dir/x.yaml", &s), DSIM_ENOENT);
    assert_null(s);
    assert_non_null(strstr(dsim_errmsg(), "/nonexistent/dir/x.yaml"));
}

static void test_tf_config(void **state)
{
    (void)state;
    dsim_scenario *s = parse_ok(
        "name: t\ncluster:\n  devices_per_host: 2\n  tf_config:\n"
        "    cluster: {chief: [\"c:1\"], worker: [\"a:1\", \"b:1\"], ps: [\"p:1\", \"q:1\"]}\n"
        "    task: {type: worker, index: 1}\n"
        "strategy: {name: parameter_server}\n");
    assert_int_equal(s->train.hosts, 3);
    assert_int_equal(s->train.num_ps, 2);
    assert_int_equal(s->train.devices_per_host, 2);
    dsim_scenario_free(s);
    s = parse_ok("name: t\ncluster:\n  tf_config: '{\"cluster\": {\"worker\": [\"a:1\", "
                 "\"b:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}'\n");
    assert_int_equal(s->train.hosts, 2);
    assert_int_equal(s->train.num_ps, 0);
    dsim_scenario_free(s);
}

/* ---- runnable ---- */

static void test_runnable(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *where, *words;
    } cases[] = {
        {"name: a\ncluster: {hosts: 2048}\n",
         "t.yaml:2:18: cluster: 2048 host(s) x 1 device(s) is 2048 replicas on engine threads "
         "(the default), which runs a thread per replica: accepted at most 1024",
         "engine sim runs up to 65536"},
        /* the engine named, the place where the size is given */
        {"name: a\nengine: processes\ncluster:\n  devices_per_host: 2\n  hosts: 4097\n",
         "t.yaml:5:10: cluster: 4097 host(s) x 2 device(s) is 8194 replicas on engine processes "
         "(line 2)",
         "accepted at most 1024 there"},
        {"name: a\nengine: processes\ncluster:\n  hosts: 2\n  network: {preset: 10gbe}\n",
         "t.yaml:5:3: cluster.network models the links",
         "on engine processes (line 2) the links are real"},
        {"name: a\ncluster: {hosts: 1}\nstrategy: {name: mirrored}\n"
         "model:\n  synthetic: {parameters: 1M, flops_per_example: 1G}\n",
         "t.yaml:5:3: model.synthetic runs timing only", "this is engine threads (the default)"},
    };
    dsim_scenario *ps = parse_ok("name: a\nengine: processes\n");
    assert_int_equal(dsim_scenario_runnable(ps), DSIM_OK);
    dsim_scenario_free(ps);
    ps = parse_ok("name: a\nengine: sim\n");
    assert_int_equal(dsim_scenario_runnable(ps), DSIM_OK);
    dsim_scenario_free(ps);
    ps = parse_ok("name: a\nengine: sim\ncluster: {hosts: 2048}\n");
    assert_int_equal(dsim_scenario_runnable(ps), DSIM_OK);
    assert_string_equal(ps->train.engine, "sim");
    dsim_scenario_free(ps);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsim_scenario *s = parse_ok(cases[i].yaml);
        assert_int_equal(dsim_scenario_runnable(s), DSIM_ENOTSUP);
        if (!strstr(dsim_errmsg(), cases[i].where) || !strstr(dsim_errmsg(), cases[i].words))
            fail_msg("expected '%s' and '%s' in: %s", cases[i].where, cases[i].words,
                     dsim_errmsg());
        dsim_scenario_free(s);
    }
    /* Under sim with the health check on, its first round pings every pair
     * of workers: 16384 workers need 16384^2 x 400 bytes (100 GiB), refused
     * on a machine with less, with the fix; with the check off it runs. */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double have = (double)pages * (double)psz;
    ps = parse_ok("name: a\nengine: sim\ncluster: {hosts: 16384}\n");
    if (have < 16384.0 * 16384.0 * 400) {
        assert_int_equal(dsim_scenario_runnable(ps), DSIM_ENOTSUP);
        if (!strstr(dsim_errmsg(),
                    "t.yaml:3:18: cluster: 16384 workers with the health check on: its "
                    "first round pings every pair of workers, which takes about "
                    "100.0 GiB") ||
            !strstr(dsim_errmsg(), "strategy.health_check: {interval: 0}"))
            fail_msg("got: %s", dsim_errmsg());
    } else {
        assert_int_equal(dsim_scenario_runnable(ps), DSIM_OK);
    }
    dsim_scenario_free(ps);
    ps = parse_ok("name: a\nengine: sim\ncluster: {hosts: 16384}\n"
                  "strategy: {name: multi_worker_mirrored, health_check: {interval: 0}}\n");
    assert_int_equal(dsim_scenario_runnable(ps), DSIM_OK);
    dsim_scenario_free(ps);
    /* 65,536 replicas with payloads take about 0.5 MiB each (32 GiB), more
     * than a machine with less; timing only they take some 48 KiB each */
    ps = parse_ok("name: a\nengine: sim\ncluster: {hosts: 8192, devices_per_host: 8}\n"
                  "strategy: {name: multi_worker_mirrored, health_check: {interval: 0}}\n");
    if (have < 65536.0 * 512 * 1024) {
        assert_int_equal(dsim_scenario_runnable(ps), DSIM_ENOTSUP);
        if (!strstr(dsim_errmsg(), "t.yaml:3:18: cluster: 65536 replicas under engine sim (line "
                                   "2) take about") ||
            !strstr(dsim_errmsg(), "model.synthetic"))
            fail_msg("got: %s", dsim_errmsg());
    }
    dsim_scenario_free(ps);
    ps = parse_ok("name: a\nengine: sim\ncluster: {hosts: 8192, devices_per_host: 8}\n"
                  "strategy: {name: multi_worker_mirrored, health_check: {interval: 0}}\n"
                  "model: {synthetic: {parameters: 1M, flops_per_example: 1G}}\n");
    assert_int_equal(dsim_scenario_runnable(ps),
                     have >= 65536.0 * 48 * 1024 ? DSIM_OK : DSIM_ENOTSUP);
    dsim_scenario_free(ps);
    /* every check the registry declares unavailable is refused, with its place */
    size_t refused = 0;
    for (size_t i = 0; i < dsim_check_count(); i++) {
        const dsim_check_ops *c = dsim_check_at(i);
        char yaml[160], where[128];
        snprintf(yaml, sizeof yaml, "name: a\nexpect:\n  %s: {}\n", c->name);
        dsim_scenario *s = parse_ok(yaml);
        dsim_err e = dsim_scenario_runnable(s);
        if (c->available) {
            assert_int_equal(e, DSIM_OK);
        } else {
            refused++;
            assert_int_equal(e, DSIM_ENOTSUP);
            snprintf(where, sizeof where,
                     "t.yaml:3:3: expect.%s: the %s check is not supported yet", c->name, c->name);
            if (!strstr(dsim_errmsg(), where))
                fail_msg("expected '%s' in: %s", where, dsim_errmsg());
        }
        dsim_scenario_free(s);
    }
    /* every built-in check runs in this build */
    assert_int_equal(refused, 0);
    /* a checkpoint directory that is not there: where the path is given */
    dsim_scenario *s = parse_ok("name: a\ncheckpoint:\n  every: 2\n  path: no-such-dir-x/c.ckpt\n");
    assert_int_equal(dsim_scenario_runnable(s), DSIM_ENOENT);
    if (!strstr(dsim_errmsg(), "t.yaml:4:9: checkpoint.path: the directory 'no-such-dir-x' of "
                               "'no-such-dir-x/c.ckpt' does not exist"))
        fail_msg("got: %s", dsim_errmsg());
    dsim_scenario_free(s);
    s = parse_ok("name: a\ncheckpoint: {path: /tmp/c.ckpt, every: 2}\n");
    assert_int_equal(dsim_scenario_runnable(s), DSIM_OK);
    dsim_scenario_free(s);
    /* an engine set by the caller (dsim run --engine): said to be so */
    s = parse_ok("name: a\ncluster:\n  hosts: 1025\n");
    free(s->engine);
    s->engine = strdup("processes");
    s->train.engine = s->engine;
    s->engine_overridden = true;
    assert_int_equal(dsim_scenario_runnable(s), DSIM_ENOTSUP);
    if (!strstr(dsim_errmsg(), "t.yaml:3:10: cluster: 1025 host(s) x 1 device(s) is 1025 replicas "
                               "on engine processes (overridden)"))
        fail_msg("got: %s", dsim_errmsg());
    dsim_scenario_free(s);
    assert_int_equal(dsim_scenario_runnable(NULL), DSIM_EINVAL);
}

/* ---- units ---- */

/* Each rule of a fault entry refused with its place and what to do; the
 * entries around those rules accepted as written. */
static void test_fault_refusals(void **state)
{
    (void)state;
    static const char pre[] = "name: a\ncluster: {hosts: 2, devices_per_host: 2}\nfaults:\n  ";
    static const struct {
        const char *entry;
        int line, col;
        const char *says;
    } bad[] = {
        {"- {what: delay, loss: 5, latency: 1ms, rank: 1}", 4, 19,
         "faults[0].loss: loss is the drop fault's rate; use probability: for a delay fault"},
        {"- {what: drop, at_step: 1, correlation: 5, rank: 1}", 4, 30,
         "faults[0].correlation: only a fault drawn per frame (probability: or loss:) has a "
         "correlation; "},
        {"- {what: kill, at_step: 1, ps: 0}", 4, 30,
         "faults[0].ps: this job has no parameter servers (cluster.ps is 0); name a rank or worker "
         "instea"},
        {"- {what: pause, at_step: 1, ranks: [], duration: 1s}", 4, 38,
         "faults[0].ranks: a list is not a list of ranks; accepted: [R, R, ...], 1 to 64 ranks in "
         "0..3"},
        {"- {what: pause, at_step: 1, ranks: [0, 9], duration: 1s}", 4, 42,
         "faults[0].ranks[1]: '9' is out of range; accepted: 0..3"},
        {"- {what: kill, at_step: 1, link: [0, 1]}", 4, 30,
         "faults[0]: a kill fault acts on a process, not a link; use rank:, worker:, ps:, ranks: "
         "or scope"},
        {"- {what: kill, at_step: 1}", 4, 6,
         "faults[0]: a kill fault needs a rank:, worker:, ps:, ranks: or scope: to act on"},
        {"- {what: slow, at_step: 1, factor: 2}", 4, 6,
         "faults[0]: a slow fault needs a rank: (a straggler) or a link: (a slow link)"},
        {"- {what: partition, at_step: 1}", 4, 6,
         "faults[0]: a partition needs a link: [FROM, TO], a rank:, worker:, ranks: or scope: to "
         "cut off"},
        {"- {what: preempt, at_time: 1s}", 4, 6,
         "faults[0]: a preemption notice comes at_step: N (after N steps); other triggers are not "
         "support"},
        {"- {what: preempt, at_step: 1, rank: 1}", 4, 33,
         "faults[0].rank: a preemption notice goes to the whole job; remove it"},
        {"- {what: preempt, at_step: 1}", 4, 6,
         "faults[0]: a preempted job saves a checkpoint to resume from; add checkpoint: {path: "
         "...}"},
        {"- {what: kill, at_step: 1, rank: 1, grace_steps: 2}", 4, 39,
         "faults[0].grace_steps: only a preemption has a grace"},
        {"- {what: delay, at_step: 1, rank: 1, latency: 1ms, duration: 1s}", 4, 40,
         "faults[0].latency: latency and duration say the same for a delay; keep one"},
        {"- {what: pause, at_step: 1, rank: 1, latency: 1ms}", 4, 40,
         "faults[0].latency: only a delay has a latency"},
        {"- {what: delay, at_step: 1, rank: 1}", 4, 6,
         "faults[0]: a delay fault needs latency: (e.g. 50ms)"},
        {"- {what: kill, at_step: 1, rank: 1, duration: 1s}", 4, 39,
         "faults[0].duration: a kill is for good; use restart with a duration for a process that "
         "comes ba"},
        {"- {what: stagger}", 4, 6, "faults[0]: a stagger fault needs duration: (e.g. 2s)"},
        {"- {what: pause, at_step: 1, rank: 1, jitter: 1ms}", 4, 40,
         "faults[0].jitter: only a delay has jitter"},
        {"- {what: pause, at_step: 1, rank: 1, factor: 2}", 4, 40,
         "faults[0].factor: only a slow fault has a factor; remove it"},
        {"- {what: slow, at_step: 1, rank: 1}", 4, 6,
         "faults[0]: a slow fault needs factor: how many times slower (more than 1)"},
        {"- {what: partition, at_step: 1, rank: 1, direction: to}", 4, 44,
         "faults[0]: a direction is one of a link's two; add link: [FROM, TO] (to: FROM -> TO "
         "only, from:"},
        {"- {what: partition, at_step: 1, link: [0, 1], direction: to, one_way: true}", 4, 49,
         "faults[0].direction: one_way and direction say the same; keep direction"},
        {"- {what: kill, at_step: 1, rank: 1, after_messages: 3}", 4, 39,
         "faults[0].after_messages: only a kill, restart or pause at_phase: fires after the frames "
         "it sen"},
        {"- {what: delay, at_step: 1, rank: 1, latency: 1ms, retransmit: true}", 4, 54,
         "faults[0]: only a drop is retransmitted"},
        {"- {what: drop, loss: 5, link: [0, 1], rto: 1ms}", 4, 41,
         "faults[0].rto: set retransmit: true for a retransmission timeout to apply"},
        /* with a parameter server: what a server may suffer */
    };
    char yaml[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(yaml, sizeof yaml, "%s%s\n", pre, bad[i].entry);
        dsim_scenario *s = NULL;
        assert_int_equal(dsim_scenario_parse("t.yaml", yaml, strlen(yaml), &s), DSIM_EINVAL);
        assert_null(s);
        char want[300];
        snprintf(want, sizeof want, "t.yaml:%d:%d: %s", bad[i].line, bad[i].col, bad[i].says);
        if (!strstr(dsim_errmsg(), want))
            fail_msg("%s: expected '%s' in: %s", bad[i].entry, want, dsim_errmsg());
    }
    const char *srv = "name: a\ncluster: {hosts: 2, ps: 1}\nstrategy: {name: parameter_server}\n"
                      "faults:\n  - {what: slow, at_step: 1, ps: 0, factor: 2}\n";
    dsim_scenario *s = NULL;
    assert_int_equal(dsim_scenario_parse("t.yaml", srv, strlen(srv), &s), DSIM_EINVAL);
    if (!strstr(dsim_errmsg(), "t.yaml:5:30: faults[0].ps: a parameter server can be killed, cut "
                               "off, delayed or lose frames; a slow fault acts on replicas"))
        fail_msg("got: %s", dsim_errmsg());
    /* accepted: a correlated loss, a list of ranks, a direction that turns
     * the link around */
    snprintf(yaml, sizeof yaml, "%s%s\n  %s\n  %s\n", pre,
             "- {what: drop, loss: 5, correlation: 25, link: [0, 1]}",
             "- {what: pause, at_step: 1, ranks: [0, 3], duration: 1s}",
             "- {what: partition, at_step: 1, link: [0, 1], direction: from}");
    s = parse_ok(yaml);
    assert_int_equal(s->n_faults, 3);
    assert_true(fabs(s->faults[0].probability - 0.05) < 1e-12);
    assert_true(fabs(s->faults[0].correlation - 0.25) < 1e-12);
    assert_int_equal(s->faults[1].n_ranks, 2);
    assert_int_equal(s->faults[1].ranks[1], 3);
    assert_int_equal(s->faults[2].link_from, 1);
    assert_int_equal(s->faults[2].link_to, 0);
    assert_true(s->faults[2].one_way);
    dsim_scenario_free(s);
}

/* What validate says about each fault: the bound of the job's settings, and
 * a warning when a loss is never detected. */
static void test_fault_detection(void **state)
{
    (void)state;
    const long long MS = 1000000;
    dsim_scenario *s = parse_ok("name: d\ncluster: {hosts: 4}\n"
                                "strategy: {timeout: 0, health_check: {interval: 100ms, "
                                "timeout: 50ms, retries: 2}}\n"
                                "faults:\n"
                                "  - {what: kill, at_step: 5, rank: 3}\n"
                                "  - {what: drop, probability: 0.01}\n"
                                "  - {what: slow, at_step: 1, rank: 1, factor: 3}\n"
                                "  - {what: partition, at_time: 1s, worker: 2, duration: 50ms}\n");
    dsim_fault_detection d;
    dsim_scenario_fault_detection(s, 0, &d);
    assert_int_equal(d.kind, DSIM_DETECT_LOSS);
    assert_int_equal(d.bound_ns, 210 * MS);
    assert_false(d.warn);
    assert_non_null(strstr(d.text, "faults[0] (kill rank 3 at step 5): a lost peer is detected "
                                   "within 210ms"));
    assert_non_null(strstr(d.text, "interval 100ms + 2 x timeout 50ms + 2 x tick 5ms"));
    printf("# %s\n", d.text);
    /* a lost message: the peer still answers its health checks */
    dsim_scenario_fault_detection(s, 1, &d);
    assert_int_equal(d.kind, DSIM_DETECT_MESSAGE);
    assert_int_equal(d.bound_ns, DSIM_NO_DEADLINE);
    assert_true(d.warn);
    assert_non_null(strstr(d.text, "never detected"));
    printf("# %s\n", d.text);
    dsim_scenario_fault_detection(s, 2, &d);
    assert_int_equal(d.kind, DSIM_DETECT_NONE);
    assert_false(d.warn);
    dsim_scenario_fault_detection(s, 3, &d);
    assert_int_equal(d.bound_ns, 210 * MS);
    assert_non_null(strstr(d.text, "the partition ends after 50ms"));
    dsim_scenario_free(s);

    /* the collective timeout when it comes first */
    s = parse_ok("name: d\ncluster: {hosts: 2}\nstrategy: {timeout: 300ms}\n"
                 "faults: [{what: kill, at_phase: allreduce, worker: 1}]\n");
    dsim_scenario_fault_detection(s, 0, &d);
    assert_int_equal(d.bound_ns, 450 * MS);
    assert_non_null(strstr(d.text, "collective timeout: 300ms + grace 150ms"));
    dsim_scenario_free(s);

    /* no timeout and no health check: never, with a warning that says what
     * to set; one host never runs the check whatever its interval */
    s = parse_ok("name: d\ncluster: {hosts: 2}\n"
                 "strategy: {timeout: 0s, health_check: {interval: 0}}\n"
                 "faults: [{what: kill, at_step: 1, rank: 0}]\n");
    dsim_scenario_fault_detection(s, 0, &d);
    assert_true(d.warn);
    assert_int_equal(d.bound_ns, DSIM_NO_DEADLINE);
    assert_non_null(strstr(d.text, "never detected"));
    assert_non_null(strstr(d.text, "strategy.health_check.interval"));
    dsim_scenario_free(s);
    s = parse_ok("name: d\ncluster: {devices_per_host: 4}\nstrategy: {name: mirrored, timeout: 0}\n"
                 "faults: [{what: kill, at_step: 1, rank: 2}]\n");
    dsim_scenario_fault_detection(s, 0, &d);
    assert_true(d.warn);
    assert_non_null(strstr(d.text, "does not run on one host"));
    dsim_scenario_free(s);
}

static void test_units(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int64_t ns;
    } dur[] = {
        {"100ns", 100},
        {"250us", 250000},
        {"500ms", 500000000},
        {"30s", 30000000000ll},
        {"2m", 120000000000ll},
        {"1h", 3600000000000ll},
        {"1.5s", 1500000000},
        {"0.5ms", 500000},
        {"0s", 0},
        {"1.0000000005s", 1000000001}, /* rounds to the nearest ns */
        {"10 ms", 10000000},
        {".5s", 500000000},
        {"9223372036854775807ns", INT64_MAX},
        {"2562047h", 2562047ll * 3600000000000ll},
    };
    char why[200];
    for (size_t i = 0; i < sizeof dur / sizeof dur[0]; i++) {
        int64_t ns = -1;
        if (!dsim_unit_duration(dur[i].s, &ns, why, sizeof why))
            fail_msg("%s: %s", dur[i].s, why);
        if (ns != dur[i].ns)
            fail_msg("%s gave %lld, expected %lld", dur[i].s, (long long)ns, (long long)dur[i].ns);
    }
    static const struct {
        const char *s, *why;
    } bad_dur[] = {
        {"30", "has no unit"},
        {"0", "has no unit"},
        {"", "is empty"},
        {"-5s", "negative"},
        {"5 sec", "unit 'sec'"},
        {"5S", "unit 'S'"},
        {"1e3ms", "exponent"},
        {"s", "not a duration"},
        {"1.s", "'.' without digits"},
        {"9223372036854775808ns", "too large"},
        {"2562048h", "too large"},
        {"99999999999999999999999s", "too large"},
        {"106751d", "unit 'd'"},
        /* more than 0 written, 0 after rounding: refused, never "no deadline" */
        {"0.0000000001ns", "more than 0 but less than 1ns"},
        {"0.4ns", "so it would be 0; write 0 if that is what you mean"},
        {"0.0000000001s", "at least 1ns"},
    };
    for (size_t i = 0; i < sizeof bad_dur / sizeof bad_dur[0]; i++) {
        int64_t ns = 77;
        why[0] = '\0';
        if (dsim_unit_duration(bad_dur[i].s, &ns, why, sizeof why))
            fail_msg("'%s' was accepted as %lld ns", bad_dur[i].s, (long long)ns);
        assert_int_equal(ns, 77);
        if (!strstr(why, bad_dur[i].why))
            fail_msg("'%s': expected '%s' in '%s'", bad_dur[i].s, bad_dur[i].why, why);
    }
    static const struct {
        const char *s;
        uint64_t b;
    } sz[] = {
        {"512B", 512},
        {"64KiB", 65536},
        {"16MiB", 16777216},
        {"1GiB", 1073741824},
        {"2TiB", 2199023255552ull},
        {"1KB", 1000},
        {"3MB", 3000000},
        {"10GB", 10000000000ull},
        {"1.5KiB", 1536},
        {"0B", 0},
        {"18446744073709551615B", UINT64_MAX},
        {"16777215TiB", 16777215ull << 40},
    };
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
        uint64_t b = 1;
        if (!dsim_unit_size(sz[i].s, &b, why, sizeof why))
            fail_msg("%s: %s", sz[i].s, why);
        if (b != sz[i].b)
            fail_msg("%s gave %llu", sz[i].s, (unsigned long long)b);
    }
    static const struct {
        const char *s, *why;
    } bad_sz[] = {
        {"512", "has no unit"},       {"16mib", "unit 'mib'"},
        {"16 MiBs", "unit 'MiBs'"},   {"18446744073709551616B", "too large"},
        {"16777216TiB", "too large"}, {"-1B", "negative"},
        {"MiB", "not a size"},
    };
    for (size_t i = 0; i < sizeof bad_sz / sizeof bad_sz[0]; i++) {
        uint64_t b = 5;
        if (dsim_unit_size(bad_sz[i].s, &b, why, sizeof why))
            fail_msg("'%s' was accepted as %llu", bad_sz[i].s, (unsigned long long)b);
        if (!strstr(why, bad_sz[i].why))
            fail_msg("'%s': expected '%s' in '%s'", bad_sz[i].s, bad_sz[i].why, why);
    }
    double bw = 0;
    assert_true(dsim_unit_bandwidth("10GB/s", &bw, why, sizeof why));
    assert_true(bw == 1e10);
    assert_true(dsim_unit_bandwidth("1GiB/s", &bw, why, sizeof why));
    assert_true(bw == 1073741824.0);
    assert_true(dsim_unit_bandwidth("1.25GB/s", &bw, why, sizeof why));
    assert_true(bw == 1.25e9);
    static const struct {
        const char *s, *why;
    } bad_bw[] = {
        {"10GB", "not a bandwidth"},
        {"10/s", "has no unit"},
        {"10Gb/s", "unit 'Gb'"},
        {"/s", "not a bandwidth"},
        {"99999999999999999999TB/s", "too large"},
    };
    for (size_t i = 0; i < sizeof bad_bw / sizeof bad_bw[0]; i++) {
        if (dsim_unit_bandwidth(bad_bw[i].s, &bw, why, sizeof why))
            fail_msg("'%s' was accepted", bad_bw[i].s);
        if (!strstr(why, bad_bw[i].why))
            fail_msg("'%s': expected '%s' in '%s'", bad_bw[i].s, bad_bw[i].why, why);
    }
    /* the formatters give back what the parsers read */
    static const int64_t back[] = {0,
                                   1,
                                   999,
                                   1000,
                                   2000,
                                   1500000000,
                                   30000000000ll,
                                   120000000000ll,
                                   3600000000000ll,
                                   5400000000000ll,
                                   INT64_MAX};
    for (size_t i = 0; i < sizeof back / sizeof back[0]; i++) {
        char buf[40];
        int64_t ns;
        dsim_unit_format_duration(back[i], buf, sizeof buf);
        assert_true(dsim_unit_duration(buf, &ns, why, sizeof why));
        assert_int_equal(ns, back[i]);
    }
    char buf[40];
    dsim_unit_format_duration(30000000000ll, buf, sizeof buf);
    assert_string_equal(buf, "30s");
    dsim_unit_format_duration(5400000000000ll, buf, sizeof buf);
    assert_string_equal(buf, "90m");
    dsim_unit_format_bandwidth(1.25e9, buf, sizeof buf);
    assert_string_equal(buf, "1250MB/s");
    assert_true(dsim_unit_bandwidth(buf, &bw, why, sizeof why) && bw == 1.25e9);
}

/* ---- the plan's data section, in process ---- */

static json_t *plan_of(const char *yaml, dsim_err want)
{
    dsim_scenario *s = parse_ok(yaml);
    json_t *j = NULL;
    dsim_err e = dsim_scenario_plan(s, &j);
    if (e != want)
        fail_msg("plan returned %d (%s), expected %d", (int)e, dsim_errmsg(), (int)want);
    assert_non_null(j);
    dsim_scenario_free(s);
    return j;
}

static void assert_sizes(json_t *j, const int64_t *want, size_t steps, size_t n)
{
    json_t *bs =
        json_object_get(json_object_get(json_object_get(j, "data"), "first_epoch"), "batch_sizes");
    assert_int_equal(json_array_size(bs), steps);
    for (size_t s = 0; s < steps; s++) {
        json_t *row = json_array_get(bs, s);
        assert_int_equal(json_array_size(row), n);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(json_integer_value(json_array_get(row, i)), want[s * n + i]);
    }
}

static void test_plan(void **state)
{
    (void)state;
    /* data.h's example: G=7, W=2, R=2, FILE over two files of 7 */
    json_t *j = plan_of("name: g7\ncluster: {hosts: 2, devices_per_host: 2}\n"
                        "data: {examples: 14, files: 2, shard_policy: file, global_batch: 7}\n",
                        DSIM_OK);
    static const int64_t file7[] = {2, 2, 2, 1, 2, 1, 2, 2};
    assert_sizes(j, file7, 2, 4);
    json_t *d = json_object_get(j, "data");
    assert_int_equal(json_integer_value(json_object_get(d, "steps_per_epoch")), 2);
    json_t *w1 = json_array_get(json_object_get(d, "workers"), 1);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(w1, "files"), 0)), 1);
    json_t *r = json_array_get(json_object_get(json_object_get(w1, "elements"), "ranges"), 0);
    assert_int_equal(json_integer_value(json_array_get(r, 0)), 7);
    assert_int_equal(json_integer_value(json_array_get(r, 1)), 13);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(d, "shard_policy"), "applied")), "file");
    json_decref(j);

    /* DATA: each global batch of 7 cut into minibatches [2,2,2,1], minibatch
     * k to worker k % 2, replica k / 2 */
    j = plan_of("name: d7\ncluster: {hosts: 2, devices_per_host: 2}\n"
                "data: {examples: 14, files: 0, shard_policy: data, global_batch: 7}\n",
                DSIM_OK);
    static const int64_t data7[] = {2, 2, 2, 1, 2, 2, 2, 1};
    assert_sizes(j, data7, 2, 4);
    json_decref(j);

    /* AUTO without files applies DATA and says so; the communication AUTO
     * resolves as the decision function does for the model's gradient */
    j = plan_of("name: a\ncluster: {hosts: 2}\ndata: {files: 0}\n", DSIM_OK);
    json_t *pol = json_object_get(json_object_get(j, "data"), "shard_policy");
    assert_string_equal(json_string_value(json_object_get(pol, "requested")), "auto");
    assert_string_equal(json_string_value(json_object_get(pol, "applied")), "data");
    assert_non_null(strstr(json_string_value(json_object_get(pol, "reason")), "DATA"));
    json_t *m = json_object_get(j, "model");
    json_int_t np = json_integer_value(json_object_get(m, "n_params"));
    assert_int_equal(np, 8 * 4 + 4);
    json_t *cm = json_object_get(json_object_get(j, "strategy"), "communication");
    assert_string_equal(json_string_value(json_object_get(cm, "applied")),
                        dsim_algo_name(dsim_allreduce_decide((size_t)np * 4, 2)));
    json_decref(j);

    /* FILE with fewer files than workers: the plan says why the run fails */
    j = plan_of("name: f\ncluster: {hosts: 3}\ndata: {files: 2, shard_policy: file}\n",
                DSIM_EINVAL);
    const char *err = json_string_value(json_object_get(j, "error"));
    assert_non_null(err);
    assert_non_null(strstr(err, "2 file"));
    assert_non_null(strstr(err, "3 workers"));
    json_decref(j);

    /* a dataset too large to follow example by example says so */
    j = plan_of("name: big\ndata: {examples: 4294967296}\n", DSIM_OK);
    d = json_object_get(j, "data");
    assert_non_null(strstr(json_string_value(json_object_get(d, "not_listed")), "4294967296"));
    assert_null(json_object_get(d, "workers"));
    json_decref(j);

    /* a scenario this build cannot run yet still has a plan */
    j = plan_of("name: s\ncluster: {hosts: 2048}\ndata: {shard_policy: data, global_batch: 4096}\n",
                DSIM_ENOTSUP);
    assert_true(json_is_false(json_object_get(j, "runnable")));
    assert_non_null(strstr(json_string_value(json_object_get(j, "not_runnable")), "engine sim"));
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_defaults_text),
        cmocka_unit_test(test_checks_by_default),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_matrix),
        cmocka_unit_test(test_plugin_path),
        cmocka_unit_test(test_tf_config),
        cmocka_unit_test(test_runnable),
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_fault_refusals),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_fault_detection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
