/* `dsim validate --defaults`: a scenario that states every default, made
 * from the same values the parser starts from, so the two cannot drift. */
#include <stdio.h>

#include "dsim/comm.h"
#include "dsim/optim.h"
#include "dsim/strategy.h"
#include "scenario/defaults.h"
#include "scenario/units.h"

dsim_err dsim_scenario_write_defaults(FILE *f)
{
    dsim_train_cfg t;
    dsim_train_cfg_init(&t);
    dsim_optim_spec mom, adam, rms, ada, lion;
    dsim_optim_spec_default(&mom, DSIM_OPTIM_MOMENTUM);
    dsim_optim_spec_default(&adam, DSIM_OPTIM_ADAM);
    dsim_optim_spec_default(&rms, DSIM_OPTIM_RMSPROP);
    dsim_optim_spec_default(&ada, DSIM_OPTIM_ADAGRAD);
    dsim_optim_spec_default(&lion, DSIM_OPTIM_LION);
    const dsim_network_preset *net = dsim_network_preset_find(DSIM_SCENARIO_DEF_PRESET);
    char lat[32], bw[32], tmo[32], hint[32], htmo[32], presets[256], algos[256];
    dsim_unit_format_duration(net->latency_ns, lat, sizeof lat);
    dsim_unit_format_bandwidth(net->bandwidth_Bps, bw, sizeof bw);
    dsim_unit_format_duration(t.timeout_ns, tmo, sizeof tmo);
    dsim_unit_format_duration(DSIM_SCENARIO_DEF_HEALTH_INT_NS, hint, sizeof hint);
    dsim_unit_format_duration(DSIM_SCENARIO_DEF_HEALTH_TMO_NS, htmo, sizeof htmo);
    size_t o = 0;
    presets[0] = '\0';
    for (int i = 0; dsim_network_preset_at(i) && o < sizeof presets; i++)
        o += (size_t)snprintf(presets + o, sizeof presets - o, "%s | ",
                              dsim_network_preset_at(i)->name);
    if (o < sizeof presets)
        snprintf(presets + o, sizeof presets - o, "custom");

    int w = fprintf(
        f,
        "# Every key of a scenario file with its default (dsim validate --defaults).\n"
        "# A commented key applies only with the choice named beside it.\n"
        "name: example                 # required: [A-Za-z0-9_.-]+\n"
        "# description: \"free text\"    # optional\n"
        "seed: %d\n"
        "engine: %s                # threads | processes | sim\n"
        "\n"
        "cluster:\n"
        "  hosts: %d\n"
        "  devices_per_host: %d\n"
        "  ps: %d\n"
        "  # tf_config: '{\"cluster\": {\"worker\": [\"a:1\", \"b:1\"]}, \"task\": {\"type\": "
        "\"worker\", \"index\": 0}}'   # instead of hosts\n"
        "  network:\n"
        "    preset: %s              # %s\n"
        "    latency: %s                 # the preset's; custom needs both\n"
        "    bandwidth: %s\n"
        "\n"
        "strategy:\n"
        "  name: %s\n"
        "  # plugin: path/to/strategy.so   # your own (relative to this file)\n"
        "  communication: %s            # %s\n"
        "  # ps_mode: %s                # parameter_server only: sync | async\n"
        "  timeout: %s                   # every collective; 0: no deadline\n"
        "  health_check:                  # multi-host jobs without parameter servers\n"
        "    interval: %s                # 0: off\n"
        "    timeout: %s\n"
        "    retries: %d\n"
        "\n"
        "model:\n"
        "  kind: softmax                # linear when data.task is regression\n"
        "  # hidden: [%d]               # mlp only: one or two widths\n"
        "  loss: auto                   # auto | mse | xent\n"
        "\n"
        "optimizer:\n"
        "  kind: %s                    # sgd | momentum | adam | adamax | rmsprop | adagrad | "
        "lion | lamb | nadam | adadelta\n"
        "  learning_rate: %g          # momentum: %g, the others: %g\n"
        "  # momentum: %g              # momentum; sgd (Keras's velocity), rmsprop: %g\n"
        "  # nesterov: false            # sgd, momentum\n"
        "  # beta1: %g                 # adam, adamax, nadam, lamb, lion\n"
        "  # beta2: %g               # adam, adamax, nadam, lamb (lion: %g)\n"
        "  # epsilon: %g             # adam, adamax, nadam, lamb, rmsprop, adagrad, adadelta\n"
        "  # amsgrad: false             # adam only\n"
        "  # rho: %g                   # rmsprop (adadelta: 0.95)\n"
        "  # centered: false            # rmsprop only\n"
        "  # initial_accumulator_value: %g   # adagrad only\n"
        "  # global_clipnorm: 1.0       # clip the all-reduced gradient to this norm\n"
        "  # clipvalue: 0.5             # or each element into [-0.5, 0.5]\n"
        "  # clipnorm: 1.0              # or each variable's gradient to this norm (one of the "
        "three)\n"
        "  # weight_decay: 0.004        # decoupled, as Keras's AdamW: w -= w * 0.004 * lr\n"
        "  # schedule: {kind: cosine_decay, decay_steps: 1000}   # Keras's schedules: "
        "scenarios/FORMAT.md\n"
        "  # gradient_accumulation_steps: 4   # update every 4th step with the average\n"
        "\n"
        "data:\n"
        "  task: classification         # classification | regression\n"
        "  examples: %d\n"
        "  features: %d\n"
        "  classes: %d                   # regression: outputs, default 1\n"
        "  noise: %g\n"
        "  files: %d                     # 0: an in-memory source without files\n"
        "  shard_policy: %s             # off | auto | file | data | hint\n"
        "  # shard_hint: %s             # shard_policy hint only: none | files | elements\n"
        "  global_batch: %lld\n"
        "  epochs: %u\n"
        "  shuffle: %s\n"
        "  drop_remainder: %s\n"
        "\n"
        "# checkpoint:                  # none by default\n"
        "#   path: ckpt/example.ckpt\n"
        "#   every: %d                   # global steps between checkpoints\n"
        "\n"
        "faults: []                     # kill, partition, drop, ...: scenarios/FORMAT.md\n"
        "recovery: %s                 # none | restart\n"
        "expect: {}                     # the checks: dsim list checks\n"
        "# liveness:                    # none by default: after the run, healed and\n"
        "#   reach_step: 16             # restarted, the job must reach this step\n"
        "#   within: 30s                # within this long\n",
        DSIM_SCENARIO_DEF_SEED, DSIM_SCENARIO_DEF_ENGINE, t.hosts, t.devices_per_host, t.num_ps,
        net->name, presets, lat, bw, DSIM_SCENARIO_DEF_STRATEGY, dsim_algo_name(t.communication),
        dsim_algo_list(algos, sizeof algos, 1, " | ", " | "), dsim_ps_mode_name(t.ps_mode), tmo,
        hint, htmo, DSIM_SCENARIO_DEF_HEALTH_RETRIES, DSIM_SCENARIO_DEF_HIDDEN,
        dsim_optim_kind_name(t.optim.kind), t.optim.lr, mom.lr, adam.lr, mom.momentum, rms.momentum,
        adam.beta1, adam.beta2, lion.beta2, adam.epsilon, rms.rho, ada.initial_accumulator_value,
        DSIM_SCENARIO_DEF_EXAMPLES, DSIM_SCENARIO_DEF_FEATURES, DSIM_SCENARIO_DEF_CLASSES,
        DSIM_SCENARIO_DEF_NOISE, DSIM_SCENARIO_DEF_FILES, dsim_shard_policy_name(t.shard),
        dsim_shard_hint_name(t.hint), (long long)t.global_batch, t.epochs,
        t.shuffle ? "true" : "false", t.drop_remainder ? "true" : "false",
        DSIM_SCENARIO_DEF_CKPT_EVERY, DSIM_SCENARIO_DEF_RECOVERY);
    if (w < 0)
        return DSIM_ERR(DSIM_EIO, -1, "writing the default scenario failed");
    return DSIM_OK;
}
