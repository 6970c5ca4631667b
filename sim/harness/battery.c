/* The battery of dsim conformance (conformance.h): one row per case.
 *
 * To add a case, add a row: a shape, the engines, what it needs of the
 * strategy, and the scenario's sections as YAML. Rows marked quick make
 * the reduced battery (--quick) that a project's default test suite runs.
 *
 * Sizes are chosen so that the strategy cannot get them right by accident:
 * the parameter count (a softmax has (features + 1) x classes, an mlp
 * (features + 1) x hidden + (hidden + 1) x outputs) and the global batch
 * are not multiples of the replica count unless the row says otherwise,
 * and the examples end in a short last batch. */
#include "conformance.h"

#define CONF_SGD       "{kind: sgd, learning_rate: 0.5}"
#define CONF_CHECKS    "{gradient_consistency: {}, shard_coverage: {}}"
#define CONF_FAULT_CHK "{gradient_consistency: {}, node_loss: {}}"
/* failure detection within about a second (the catalogue's fault
 * scenarios): a lost peer costs the threads engine that much wall time */
#define CONF_DETECT "timeout: 2s, health_check: {interval: 500ms, timeout: 500ms, retries: 2}"
#define CONF_DATA_2X2                                                                              \
    "{task: classification, examples: 256, features: 8, classes: 4, files: 4, global_batch: 32, "  \
    "epochs: 2}"

static const dsim_conf_case conf_battery[] = {
    /* ---- shapes: the catalogue's, then awkward ones ---- */
    {.name = "catalogue_2x2",
     .about = "2 hosts x 2 devices, 36 parameters, 32 a step: the catalogue's shape",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "all",
     .quick = true,
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = CONF_DATA_2X2,
     .expect = CONF_CHECKS},
    {.name = "one_replica",
     .about = "1 host x 1 device: nothing to exchange",
     .hosts = 1,
     .devices_per_host = 1,
     .engines = "sim",
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = "{task: classification, examples: 100, features: 8, classes: 4, files: 2, "
             "global_batch: 16, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "one_host_3",
     .about = "1 x 3 (prime), 14 parameters, 31 a step, a last batch of 2 (fewer than replicas)",
     .hosts = 1,
     .devices_per_host = 3,
     .engines = "threads",
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = "{task: classification, examples: 250, features: 6, classes: 2, files: 4, "
             "global_batch: 31, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "hosts_5",
     .about = "5 x 1 (prime), 33 parameters, 32 a step, a one-example last batch",
     .hosts = 5,
     .devices_per_host = 1,
     .engines = "sim",
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = "{task: classification, examples: 161, features: 10, classes: 3, files: 5, "
             "global_batch: 32, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "uneven_2x3",
     .about = "2 x 3, 15 parameters, 20 a step, a one-example last batch",
     .hosts = 2,
     .devices_per_host = 3,
     .engines = "all",
     .quick = true,
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = "{task: classification, examples: 201, features: 4, classes: 3, files: 4, "
             "global_batch: 20, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "uneven_3x2",
     .about = "3 x 2, 9 parameters, 9 a step, a one-example last batch",
     .hosts = 3,
     .devices_per_host = 2,
     .engines = "sim",
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = "{task: classification, examples: 100, features: 2, classes: 3, files: 3, "
             "global_batch: 9, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "fewer_params",
     .about = "2 x 4, 4 parameters for 8 replicas, 12 a step",
     .hosts = 2,
     .devices_per_host = 4,
     .engines = "sim",
     .quick = true,
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = "{task: classification, examples: 100, features: 1, classes: 2, files: 4, "
             "global_batch: 12, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "small_batch",
     .about = "1 x 7, 8 parameters, 5 a step (fewer than replicas: some idle every step)",
     .hosts = 1,
     .devices_per_host = 7,
     .engines = "sim",
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = "{task: classification, examples: 23, features: 3, classes: 2, files: 2, "
             "global_batch: 5, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "mlp_hosts_7",
     .about = "7 x 1 (prime), an mlp regression of 32 parameters, 17 a step",
     .hosts = 7,
     .devices_per_host = 1,
     .engines = "sim",
     .model = "{kind: mlp, hidden: [5], loss: mse}",
     .optimizer = "{kind: sgd, learning_rate: 0.05}",
     .data = "{task: regression, examples: 69, features: 3, classes: 2, files: 7, "
             "global_batch: 17, epochs: 2}",
     .expect = CONF_CHECKS},
    /* ---- optimizers: their slots and step travel with the variables ---- */
    {.name = "momentum",
     .about = "Nesterov momentum on 2 x 3, 14 parameters",
     .hosts = 2,
     .devices_per_host = 3,
     .engines = "threads",
     .model = "{kind: softmax}",
     .optimizer = "{kind: momentum, learning_rate: 0.2, momentum: 0.9, nesterov: true}",
     .data = "{task: classification, examples: 200, features: 6, classes: 2, files: 4, "
             "global_batch: 24, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "adam",
     .about = "Adam on 3 x 1, an mlp of 59 parameters, 16 a step",
     .hosts = 3,
     .devices_per_host = 1,
     .engines = "threads",
     .model = "{kind: mlp, hidden: [7]}",
     .optimizer = "{kind: adam, learning_rate: 0.01}",
     .data = "{task: classification, examples: 150, features: 4, classes: 3, files: 3, "
             "global_batch: 16, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "rmsprop",
     .about = "RMSprop, centered and with momentum (three slots) on 2 x 2, an mlp of 63 "
              "parameters",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "threads",
     .model = "{kind: mlp, hidden: [6]}",
     .optimizer = "{kind: rmsprop, learning_rate: 0.01, momentum: 0.5, centered: true}",
     .data = "{task: classification, examples: 150, features: 6, classes: 3, files: 3, "
             "global_batch: 18, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "lion",
     .about = "Lion (the sign of an interpolated momentum, each step a whole learning rate) "
              "on 3 x 1, 14 parameters",
     .hosts = 3,
     .devices_per_host = 1,
     .engines = "threads",
     .model = "{kind: softmax}",
     .optimizer = "{kind: lion, learning_rate: 0.005}",
     .data = "{task: classification, examples: 200, features: 6, classes: 2, files: 4, "
             "global_batch: 24, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "adamax",
     .about = "Adamax (a running maximum of the gradient's size in the denominator) on 2 x 2, "
              "an mlp of 63 parameters",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "threads",
     .model = "{kind: mlp, hidden: [6]}",
     .optimizer = "{kind: adamax, learning_rate: 0.01}",
     .data = "{task: classification, examples: 150, features: 6, classes: 3, files: 3, "
             "global_batch: 18, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "lamb",
     .about = "LAMB (Adam's update scaled per variable by its norm's ratio to the update's) on "
              "2 x 3, an mlp of 55 parameters in 4 variables",
     .hosts = 2,
     .devices_per_host = 3,
     .engines = "threads",
     .model = "{kind: mlp, hidden: [5]}",
     .needs = DSIM_CONF_WHOLE_VARS,
     .optimizer = "{kind: lamb, learning_rate: 0.02, weight_decay: 0.01}",
     .data = "{task: classification, examples: 150, features: 6, classes: 3, files: 3, "
             "global_batch: 20, epochs: 2}",
     .expect = CONF_CHECKS},
    {.name = "amsgrad_restart",
     .about = "Adam with amsgrad (a third slot, the running maximum of v), a checkpoint every "
              "3 steps, preempted after step 7: a restore must take all three slots",
     .hosts = 3,
     .devices_per_host = 1,
     .engines = "threads",
     .needs = DSIM_CONF_SYNC | DSIM_CONF_SAVE,
     .model = "{kind: softmax}",
     .optimizer = "{kind: adam, learning_rate: 0.05, amsgrad: true}",
     .data = "{task: classification, examples: 200, features: 5, classes: 3, files: 4, "
             "global_batch: 18, epochs: 2}",
     .checkpoint = "every: 3",
     .faults = "[{what: preempt, at_step: 7, grace_steps: 1}]",
     .recovery = "restart",
     .expect = "{checkpoint_roundtrip: {}, gradient_consistency: {}, node_loss: {}}"},
    {.name = "adagrad_restart",
     .about = "Adagrad (accumulators start at 0.1, not 0), a checkpoint every 3 steps, "
              "preempted after step 7: a restore must take the saved accumulators",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "threads",
     .needs = DSIM_CONF_SYNC | DSIM_CONF_SAVE,
     .model = "{kind: softmax}",
     .optimizer = "{kind: adagrad, learning_rate: 0.1}",
     .data = "{task: classification, examples: 200, features: 5, classes: 3, files: 4, "
             "global_batch: 16, epochs: 2}",
     .checkpoint = "every: 3",
     .faults = "[{what: preempt, at_step: 7, grace_steps: 1}]",
     .recovery = "restart",
     .expect = "{checkpoint_roundtrip: {}, gradient_consistency: {}, node_loss: {}}"},
    {.name = "bfloat16_allreduce",
     .about = "Lion with its gradients all-reduced in bfloat16 (Horovod's compression), a "
              "checkpoint every 3 steps, preempted after step 7: judged with bfloat16's tolerances",
     .hosts = 2,
     .devices_per_host = 3,
     .engines = "threads",
     .needs = DSIM_CONF_SYNC | DSIM_CONF_SAVE | DSIM_CONF_NARROW,
     .strategy_extra = "timeout: 10s, gradient_dtype: bfloat16",
     .model = "{kind: mlp, hidden: [7]}",
     .optimizer = "{kind: lion, learning_rate: 0.002}",
     .data = "{task: classification, examples: 200, features: 6, classes: 3, files: 4, "
             "global_batch: 25, epochs: 2}",
     .checkpoint = "every: 3",
     .faults = "[{what: preempt, at_step: 7, grace_steps: 1}]",
     .recovery = "restart",
     .expect = "{checkpoint_roundtrip: {}, gradient_consistency: {}, node_loss: {}}"},
    {.name = "global_clipnorm",
     .about = "momentum with Keras's global_clipnorm on 2 x 3, acting on every step",
     .hosts = 2,
     .devices_per_host = 3,
     .engines = "threads",
     .needs = DSIM_CONF_WHOLE_GRAD,
     .model = "{kind: mlp, hidden: [5]}",
     .optimizer = "{kind: momentum, learning_rate: 0.2, momentum: 0.9, global_clipnorm: 0.02}",
     .data = "{task: classification, examples: 200, features: 6, classes: 3, files: 4, "
             "global_batch: 24, epochs: 2}",
     .expect = CONF_CHECKS},
    /* ---- faults ---- */
    {.name = "checkpoint_restart",
     .about = "Adam, a checkpoint every 3 steps, preempted after step 7: save, restart, resume",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "all",
     .needs = DSIM_CONF_SYNC | DSIM_CONF_SAVE,
     .quick = true,
     .model = "{kind: softmax}",
     .optimizer = "{kind: adam, learning_rate: 0.01}",
     .data = "{task: classification, examples: 200, features: 5, classes: 3, files: 4, "
             "global_batch: 16, epochs: 2}",
     .checkpoint = "every: 3",
     .faults = "[{what: preempt, at_step: 7, grace_steps: 1}]",
     .recovery = "restart",
     .expect = "{checkpoint_roundtrip: {}, gradient_consistency: {}, node_loss: {}}"},
    {.name = "kill_recovery",
     .about = "rank 1 killed inside the all-reduce of step 6; restart from the checkpoint",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "all",
     .needs = DSIM_CONF_PEERS,
     .quick = true,
     .strategy_extra = CONF_DETECT,
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = CONF_DATA_2X2,
     .checkpoint = "every: 2",
     .faults = "[{what: kill, at_phase: allreduce, at_step: 6, rank: 1, after_messages: 1}]",
     .recovery = "restart",
     .expect = CONF_FAULT_CHK},
    {.name = "partition",
     .about = "worker 1 cut off for good at step 3; restart",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "threads,sim",
     .needs = DSIM_CONF_WORKERS | DSIM_CONF_SYNC,
     .strategy_extra = CONF_DETECT,
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = CONF_DATA_2X2,
     .checkpoint = "every: 2",
     .faults = "[{what: partition, at_step: 3, worker: 1}]",
     .recovery = "restart",
     .expect = CONF_FAULT_CHK},
    {.name = "straggler",
     .about = "rank 1 computes 5 times slower from step 0: nothing else may change",
     .hosts = 2,
     .devices_per_host = 2,
     .engines = "threads,sim",
     .needs = DSIM_CONF_PEERS,
     .strategy_extra = CONF_DETECT,
     .model = "{kind: softmax}",
     .optimizer = CONF_SGD,
     .data = CONF_DATA_2X2,
     .faults = "[{what: slow, at_step: 0, rank: 1, factor: 5}]",
     .expect = CONF_CHECKS},
};

size_t dsim_conf_case_count(void)
{
    return sizeof conf_battery / sizeof conf_battery[0];
}

const dsim_conf_case *dsim_conf_case_at(size_t i)
{
    return i < dsim_conf_case_count() ? &conf_battery[i] : NULL;
}
