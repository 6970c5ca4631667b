/* Scenario files: one YAML file is one experiment (scenarios/FORMAT.md).
 *
 * dsim_scenario_load parses a file with libyaml into a validated plan. Every
 * rejection (unknown key, wrong type, value out of range, a combination that
 * cannot run) returns DSIM_EINVAL with a message of the form
 *   FILE:LINE:COLUMN: KEY.PATH: the value 'X' ...; accepted: ...
 * Things a later part of dsim will run (faults, engines other than threads,
 * node_loss/cold_start/performance checks) are parsed and validated, then
 * refused with a message that says they are not supported yet — never
 * silently ignored.
 *
 * The scenario owns every string it points to (including those inside
 * `train`, which is ready to hand to dsim_train). */
#ifndef DSIM_SCENARIO_H
#define DSIM_SCENARIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/err.h"
#include "dsim/strategy.h"
#include "check/check.h"
#include "fault/fault.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a value was in the file (1-based), for messages after parsing. */
typedef struct dsim_src_pos {
    int line, column;
} dsim_src_pos;

/* One `expect:` entry. */
typedef struct dsim_expect {
    const dsim_check_ops *check;
    double values[DSIM_CHECK_MAX_PARAMS]; /* every param, defaults filled in */
    bool expect_fail;                     /* the scenario passes only if this check fails */
    /* Judged because it applies to the run, not because the scenario names
     * it (dsim_scenario_default_checks); pos is then 0:0. */
    bool by_default;
    dsim_src_pos pos;
} dsim_expect;

/* Checks a scenario can turn off (`shard_coverage: off`): at most this many. */
#define DSIM_SCENARIO_MAX_OFF 16

typedef struct dsim_scenario {
    char *path; /* the file, as given */
    char *text; /* the file's full text (stored with the run) */
    char *name;
    char *description; /* or NULL */
    uint64_t seed;
    char *engine;    /* "threads" | "processes" | "sim" */
    char *transport; /* the processes engine's: "shm" | "tcp", or NULL (its default) */
    dsim_src_pos transport_pos;
    dsim_src_pos engine_pos, recovery_pos; /* where they were given (0:0 when defaulted) */
    bool engine_overridden;                /* engine set by the caller (dsim run --engine) */

    /* network: preset name and link parameters (used by the sim engine) */
    char *network_preset; /* or NULL */
    char *device_preset;  /* cluster.device (v100, a100, h100, cpu), or NULL */
    char *intra_preset;   /* cluster.network.intra's link preset, or NULL */
    bool network_given;   /* cluster.network was in the file: the job's links are modelled
                             (threads and sim engines; see FORMAT.md) */
    int64_t link_latency_ns;
    double link_bandwidth_Bps;
    int64_t intra_latency_ns; /* cluster.network.intra: between a host's devices */
    double intra_Bps;         /* (0 and 0: none, at once) */

    /* cluster.tpu: a simulated TPU slice (train.tpu holds it; no TPU is
     * used). Its ICI and on-chip links for the sim engine's network model
     * (network_preset, intra_preset and device_preset name its presets),
     * and what dsim says about the job, a line each ("TPU v3-32 is
     * simulated: ...", the precision, "warning: ..."); NULL otherwise. */
    int64_t tpu_ici_latency_ns;
    double tpu_ici_Bps;
    int64_t tpu_chip_latency_ns;
    double tpu_chip_Bps;
    char *tpu_notes;

    /* health check (ARCHITECTURE.md §7 defaults: 30 s, 10 s, 3) */
    int64_t health_interval_ns, health_timeout_ns;
    int health_retries;

    dsim_train_cfg train; /* strategy, cluster, model, optimizer, data, checkpoint */
    /* data.source: the dataset read from files when the scenario was
     * parsed (train.dataset borrows it), and its files as resolved
     * (absolute when realpath could resolve them); NULL for synthetic data. */
    dsim_dataset *dataset;
    char *data_x, *data_y, *data_csv;
    char **data_labels; /* csv: the label column(s) */
    size_t n_data_labels;
    dsim_src_pos checkpoint_pos; /* where checkpoint.path was given (0:0 when not) */
    dsim_src_pos plugin_pos;     /* where strategy.plugin was given (0:0 when not) */
    int plugin_found;            /* how train.plugin_path was found: DSIM_PLUGIN_* */
    /* Where what dsim_scenario_runnable may refuse was given (0:0 when not):
     * the cluster's size (cluster.hosts, else devices_per_host, tf_config or
     * the cluster: key), cluster.network, model.synthetic. */
    dsim_src_pos cluster_pos, network_pos, synthetic_pos;
    /* Where the data's layout is given (data.shard_policy, else
     * data.files, else the data: key; 0:0 when none is), for a plan that
     * cannot shard it. */
    dsim_src_pos data_pos;
    /* model.plugin: the shared object as found (never loaded by the parser;
     * dsim_harness_prepare loads it), and where it was given; NULL: none. */
    char *model_plugin;
    dsim_src_pos model_plugin_pos;

    dsim_fault *faults;
    size_t n_faults;
    char *recovery;   /* "none" | "restart" (BackupAndRestore), or NULL */
    int max_restarts; /* restarts recovery may make (recovery: {max_restarts: N}) */

    /* liveness: {reach_step: N, within: DURATION}: after the run (the
     * safety phase, faults on, its checks judged) every fault is healed and
     * the job restarted (from checkpoint.path when one was written); it
     * must reach global step N within DURATION of the engine's clock. */
    bool has_liveness;
    uint64_t liveness_step;
    int64_t liveness_within_ns;

    dsim_expect *expect; /* the checks named, then the ones judged by default */
    size_t n_expect;
    /* checks the scenario turned off (`NAME: off` under expect:) */
    const dsim_check_ops *off[DSIM_SCENARIO_MAX_OFF];
    size_t n_off;
    /* expect.error: the run must fail with an error whose message contains
     * this text (e.g. FILE sharding with fewer files than workers); then no
     * check runs. NULL when the run must succeed. */
    char *expect_error;

    /* matrix: (see scenarios/FORMAT.md): how many combinations the file
     * makes (0: no matrix), which one this is (-1: the file as written),
     * and what it sets ("hosts=1,devices_per_host=3,seed=2"; NULL when
     * none). A combination's name is the file's with the label in
     * brackets. */
    size_t n_combinations;
    long combination;
    char *label;
} dsim_scenario;

/* How a scenario's strategy plugin was found. */
enum {
    DSIM_PLUGIN_NEXT_TO_FILE = 1, /* a bare file name, in the scenario file's folder */
    DSIM_PLUGIN_BY_PATH,          /* a path with a '/', relative to that folder */
    DSIM_PLUGIN_ABSOLUTE,         /* an absolute path */
    DSIM_PLUGIN_SEARCHED,         /* a bare file name, in --plugin-dir, $DSIM_PLUGIN_PATH or
                                     the build's and the installed plugin folders */
};

/* What `dsim validate` and `dsim plan` say about a strategy plugin, which
 * only `dsim run` loads: the file it will load (its real path), whether
 * that lies outside the scenario file's folder although the file named it
 * by a path (absolute, or climbing out with ../), and a sentence saying so
 * and that loading runs its code. False when s names no plugin. */
typedef struct dsim_plugin_notice {
    char file[4096];
    bool outside;
    char text[4608];
} dsim_plugin_notice;
bool dsim_scenario_plugin_notice(const dsim_scenario *s, dsim_plugin_notice *out);

/* Loads and validates a scenario file. On error *out is NULL and the
 * message has FILE:LINE:COLUMN. Only a regular file is read: a named pipe,
 * a device, a socket or a directory is refused (DSIM_EINVAL) without
 * waiting on it. */
dsim_err dsim_scenario_load(const char *path, dsim_scenario **out);
/* The same from text in memory; `path` is used in messages. */
dsim_err dsim_scenario_parse(const char *path, const char *text, size_t len, dsim_scenario **out);
/* How many runs the file makes: the product of its matrix's lists, 1
 * without a matrix. */
size_t dsim_scenario_combinations(const dsim_scenario *s);
/* Combination k (0-based) of s's matrix, parsed and validated as a
 * scenario of its own (s itself without a matrix, for k = 0). */
dsim_err dsim_scenario_combination(const dsim_scenario *s, size_t k, dsim_scenario **out);
/* Finds a strategy plugin as a scenario file in the working directory
 * would name it in strategy.plugin: a path with a '/' as it is, a bare
 * file name in the working directory, then $DSIM_PLUGIN_PATH, this build's
 * and the installed plugin directories. *out (the caller frees it) is the
 * file found; DSIM_ENOENT naming the places searched when there is none. */
dsim_err dsim_scenario_plugin_find(const char *file, char **out);

/* The directories searched after DSIM_PLUGIN_PATH, ':'-separated: this
 * build tree's plugins for a program that runs from the build tree, then
 * the installed plugin directory of the prefix the running program is in
 * (PREFIX/bin/PROGRAM) and of the configured prefix. */
const char *dsim_scenario_plugin_dirs(void);

/* DSIM_OK if this build can run the scenario; else DSIM_ENOTSUP saying what
 * is not supported yet (faults, engines, checks) and where in the file, or
 * DSIM_ENOENT when the directory of checkpoint.path (relative to the working
 * directory) does not exist, with where the path is given. */
dsim_err dsim_scenario_runnable(const dsim_scenario *s);
/* Whether a built-in strategy runs on the scenario's cluster shape as it is
 * now (dsim worker --reshape changes it after the load checked it): the
 * load's message when not (DSIM_EINVAL). */
dsim_err dsim_scenario_check_shape(const dsim_scenario *s);

/* The engine s runs on: strategy.engine, else the top-level engine, else
 * "threads". */
const char *dsim_scenario_engine(const dsim_scenario *s);
void dsim_scenario_free(dsim_scenario *s);

/* Whether a correctness check applies to the scenario's run, so that it is
 * judged by default unless the scenario names it or turns it off
 * (parse_expect.c says which and when). */
bool dsim_scenario_check_applies(const dsim_scenario *s, const dsim_check_ops *ops);

/* ---- judging a run against the scenario's expect list (judge.c) ----
 *
 * Above both the checks (sim/check, which know nothing of scenarios) and
 * the parser; the functions keep the dsim_check_ names they have always
 * had. */

/* Whether running the scenario's expect list needs dsim_train_reference
 * (false when the scenario expects an error). */
bool dsim_check_needs_reference(const dsim_scenario *s);

/* Judges a finished run against ctx->scenario's expect list.
 *
 * out must hold dsim_check_outcome_count(ctx->scenario) rows; *n_out gets how
 * many were written, *n_failed how many did not meet their expectation.
 *
 * - expect.error: one row named "error" that passes iff the run failed with
 *   an error whose message contains the text (run_err != DSIM_OK, message in
 *   ctx->run->error.msg); no check runs.
 * - otherwise one row per expect entry: the checks named, in file order,
 *   then the ones judged by default (by_default). A run that failed
 *   (run_err != DSIM_OK) fails every named row, expect_fail ones included:
 *   a check expected to fail must fail on its own judgement of a finished
 *   run, not because the run never finished. A run that hung says so in a
 *   short row ("not judged: the run hung"); its report is the run's. A
 *   check judged by default that judges finished runs only is left out of
 *   a failed run, or, when the scenario has faults and node_loss judges
 *   them, shown as not applicable (passed): the faults were meant to break
 *   the run. With no row left, one row named "run" fails with the run's
 *   error.
 * - a check that is unavailable, or whose run function returns an error,
 *   fails with a message saying so.
 *
 * Returns DSIM_EINVAL only for bad arguments. */
size_t dsim_check_outcome_count(const dsim_scenario *s);
dsim_err dsim_check_run_all(const dsim_check_ctx *ctx, dsim_check_outcome *out, size_t *n_out,
                            size_t *n_failed);

/* What the scenario's timeout and health check promise about one fault. */
typedef enum dsim_detect_kind {
    DSIM_DETECT_NONE,    /* nothing is lost (delay, duplicate, reorder, slow, stagger) */
    DSIM_DETECT_LOSS,    /* a peer is lost (kill, restart, partition) */
    DSIM_DETECT_MESSAGE, /* a message is lost (drop, corrupt): only the timeout helps */
} dsim_detect_kind;

typedef struct dsim_fault_detection {
    dsim_detect_kind kind;
    int64_t bound_ns; /* every survivor has its error by then; DSIM_NO_DEADLINE: never */
    bool warn;        /* a loss that is never detected: the job would wait for ever */
    char text[512];   /* "faults[0] (kill rank 3 at step 5): a lost peer is detected
                         within 210ms: ..." */
} dsim_fault_detection;

/* For faults[i]: the bound dsim_train_detection_bound gives the scenario's
 * job (dsim/health.h derives it), and the sentence `dsim validate` prints. */
void dsim_scenario_fault_detection(const dsim_scenario *s, size_t i, dsim_fault_detection *out);

/* The workers' health check on engine processes with more worker
 * processes than it can answer for on this machine's CPUs (more than
 * DSIM_SCEN_HEALTH_WORKERS_PER_CPU a CPU): a warning (text, "warning: ...")
 * that a worker starved of CPU can be reported down though alive; false
 * when there is none to give. scenario.c. */
#define DSIM_SCEN_HEALTH_WORKERS_PER_CPU 128
bool dsim_scenario_cpu_warning(const dsim_scenario *s, char *text, size_t cap);

/* Steps a job of cfg takes, from worker 0's input under dsim's own
 * pipeline (every worker takes the same number); 0 when the input cannot
 * be made (the run will say why). detect.c. */
uint64_t dsim_train_cfg_steps(const dsim_train_cfg *cfg);

/* The steps of the scenario's job where dsim's own pipeline makes the
 * batches (dsim_train_cfg_steps); 0 where they are not known here: a
 * plugin's strategy (its code is not loaded), a strategy's input_fn. */
uint64_t dsim_scenario_own_steps(const dsim_scenario *s);

/* faults[i] can never fire: it names a step (at_step, or at_phase with
 * at_step) at or past `steps` (dsim_scenario_own_steps; 0: unknown, never
 * said); text says so and how to fix it. */
bool dsim_scenario_fault_unreachable(const dsim_scenario *s, size_t i, uint64_t steps, char *text,
                                     size_t cap);

/* The cost model's topology of the scenario's job on `engine` (NULL: the
 * scenario's own): its links (cluster.network and its intra link, a TPU
 * slice's ICI), its device (cluster.device) and shape; t->tpu points into
 * s. False where that engine does not model the links (no cluster.network,
 * or the processes engine's real ones): then `communication: auto` is the
 * library's decision, else the model's (dsim_cost_decide). topology.c. */
struct dsim_topology; /* model/costmodel.h */
bool dsim_scenario_topology(const dsim_scenario *s, const char *engine, struct dsim_topology *t);

#ifdef __cplusplus
}
#endif
#endif
