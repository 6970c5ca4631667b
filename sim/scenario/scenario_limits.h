/* The limits of a scenario file, in one place.
 *
 * The parser checks every bounded key against these constants, and
 * dsim_scenario_limits_write prints them as the table that
 * scenarios/FORMAT.md holds (`dsim validate --limits`; the format_limits
 * test fails when the two differ, scripts/update-limits rewrites the
 * table), so that the documentation cannot drift from the code. The
 * engines' own bounds (replicas on an engine with a thread per replica)
 * come from the engine table (sim/engine/engine.h). */
#ifndef DSIM_SCENARIO_LIMITS_H
#define DSIM_SCENARIO_LIMITS_H

#include <stdint.h>
#include <stdio.h>

#include "dsim/cluster.h"
#include "dsim/dataset.h"
#include "dsim/model.h"
#include "dsim/strategy.h"
#include "fault/fault.h"
#include "scenario/yaml_tree.h"

/* the file */
#define DSIM_SCEN_MAX_FILE_BYTES   (1u << 20) /* a scenario file's size */
#define DSIM_SCEN_MAX_STR          4096       /* a text value's bytes */
#define DSIM_SCEN_MAX_COMBINATIONS 256        /* runs a matrix: makes */
/* cluster: (a run's replicas: DSIM_TRAIN_MAX_REPLICAS; runtime workers,
 * one per replica and one per server and replica: DSIM_TRAIN_MAX_WORKERS) */
#define DSIM_SCEN_MAX_HOSTS   DSIM_TRAIN_MAX_REPLICAS
#define DSIM_SCEN_MAX_DEVICES DSIM_CLUSTER_MAX_DEVICES
#define DSIM_SCEN_MAX_PS      DSIM_TRAIN_MAX_PS
/* strategy: */
#define DSIM_SCEN_MAX_RETRIES 1000 /* health_check.retries */
/* data: and model: */
#define DSIM_SCEN_MAX_EXAMPLES     ((int64_t)1 << 32)
#define DSIM_SCEN_MAX_DIM          DSIM_MODEL_MAX_DIM /* features, classes, hidden widths */
#define DSIM_SCEN_MAX_FILES        DSIM_DATASET_MAX_FILES
#define DSIM_SCEN_MAX_BATCH        INT32_MAX
#define DSIM_SCEN_MAX_EPOCHS       1000000
#define DSIM_SCEN_MAX_HIDDEN       DSIM_MODEL_MAX_HIDDEN /* model.hidden's layers */
#define DSIM_SCEN_MAX_SYNTH_PARAMS 1e12                  /* model.synthetic.parameters */
#define DSIM_SCEN_MAX_SYNTH_FLOPS  1e18                  /* model.synthetic.flops_per_example */
#define DSIM_SCEN_MAX_LR           1e6                   /* optimizer.learning_rate */
#define DSIM_SCEN_MAX_CLIP         1e30 /* optimizer.clipvalue, optimizer.global_clipnorm */
#define DSIM_SCEN_MAX_WD           1e6  /* optimizer.weight_decay */
#define DSIM_SCEN_MAX_IAV          1e6  /* optimizer.initial_accumulator_value */
#define DSIM_SCEN_MAX_TMUL         1e6  /* optimizer.schedule's t_mul, m_mul */
/* faults:, recovery: */
#define DSIM_SCEN_MAX_FAULT_RANKS DSIM_FAULT_MAX_RANKS /* a fault's ranks: list */
#define DSIM_SCEN_MAX_GRACE_STEPS 1000000              /* preempt's grace_steps */
#define DSIM_SCEN_MAX_SLOW_FACTOR 1e6                  /* slow's factor */
#define DSIM_SCEN_MAX_RESTARTS    100                  /* recovery.max_restarts */
/* a step or a count of messages (at_step, after_messages, reach_step,
 * checkpoint.every) */
#define DSIM_SCEN_MAX_STEP (INT64_MAX / 2)

/* What memory bounds (dsim_scenario_runnable): the health check's first
 * round costs per pair of workers, rounded up from
 * reports/bench-sim-scale.txt; a replica under sim (the same report:
 * 0.31-0.45 MiB with a small model, its store records included; 28 KiB
 * timing only), rounded up, before its model's parameters, gradient,
 * optimizer state and copies (about 20 bytes per float32 parameter). */
#define DSIM_SCEN_HEALTH_PAIR_BYTES    400
#define DSIM_SCEN_REPLICA_BYTES        (512.0 * 1024)
#define DSIM_SCEN_TIMING_REPLICA_BYTES (48.0 * 1024)
#define DSIM_SCEN_PARAM_BYTES          20.0

/* Writes the table of limits (Markdown: key, accepted, note), one row a
 * limit, as scenarios/FORMAT.md holds it between its "limits" markers. */
void dsim_scenario_limits_write(FILE *out);

#endif
