/* `dsim plan`: what a scenario will do, before it runs, as JSON.
 *
 * The object holds the resolved cluster (hosts, devices, ps, chief, every
 * replica's worker and device), the strategy with the all-reduce algorithm
 * actually used (AUTO resolved by dsim_allreduce_decide for the model's
 * gradient bytes and the replica count), the model and its parameter count,
 * the optimizer, and the data plan of dsim_input_plan_make: the shard policy
 * asked for and the one applied (and why), per worker the files it reads and
 * the example ids it hands its replicas in the first epoch (as inclusive
 * [first, last] ranges of the sorted ids), the steps per epoch and per step
 * of the first epoch every replica's batch size. Long lists are cut at
 * DSIM_PLAN_MAX_ITEMS entries and say so ("truncated": true); a dataset of
 * more than 2^26 example reads per epoch is not followed example by example
 * (data.not_listed says so, and workers and batch sizes are left out).
 *
 * When the run is bound to fail (FILE sharding with fewer files than
 * workers, ...) or cannot run in this build, the object still holds all it
 * could resolve, "error" holds the message (of the data plan), "runnable" is
 * false with the reason in "not_runnable" (the build's refusal, else the
 * error), and the call returns the error (DSIM_EINVAL, or DSIM_ENOTSUP from
 * dsim_scenario_runnable). "runnable" is true exactly when the call returns
 * DSIM_OK (and `dsim plan` exits 0). */
#ifndef DSIM_SCENARIO_PLAN_H
#define DSIM_SCENARIO_PLAN_H

#include <jansson.h>

#include "scenario/scenario.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_PLAN_MAX_ITEMS 1000

/* The optimizer's learning-rate schedule as JSON (its kind and the keys that
 * kind uses, as the scenario names them), or NULL when it has none (a
 * constant rate) or out of memory: what the plan, the stored config and the
 * export manifest hold. */
json_t *dsim_schedule_json(const dsim_optim_spec *o);

/* *out is set (a new reference) whenever the return is not DSIM_ENOMEM. */
dsim_err dsim_scenario_plan(const dsim_scenario *s, json_t **out);

#ifdef __cplusplus
}
#endif
#endif
