/* Checks: what a scenario's `expect:` can ask of a run (ARCHITECTURE.md §8).
 *
 * A check is a const table registered by name. It declares the thresholds
 * it accepts (so a scenario file is validated before anything runs, with
 * file:line:column on a bad key or value) and a function that judges a
 * finished run. Every check stores pass/fail, the measured value, the
 * expected value and a sentence a person can act on.
 *
 * Built in: gradient_consistency, shard_coverage, convergence, node_loss,
 * performance, cold_start, checkpoint_roundtrip (one file each in
 * sim/check/, see there for how each judges a run). */
#ifndef DSIM_CHECK_H
#define DSIM_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "dsim/err.h"
#include "dsim/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_CHECK_MAX_PARAMS 8

/* The most floats of a run's variables (and, under an adaptive optimizer,
 * its gradients and the optimizer's slots) the harness keeps step by step
 * for gradient_consistency (8 Mi: 32 MiB): every
 * step's where they fit, else every k-th step's, the least k for which they
 * do; none for a model whose one step's are more (sim/harness/run.c). */
#define DSIM_CHECK_TRACE_MAX ((uint64_t)8 << 20)

/* Rows of n_params floats a kept step holds at most: the variables, and
 * under an adaptive optimizer (dsim_optim_is_adaptive) the gradient and
 * the rule's slots (kept every k > 1 steps); 2 rows under one kept every
 * step. */
static inline size_t dsim_check_trace_rows(const dsim_optim_spec *os)
{
    return dsim_optim_is_adaptive(os) ? 2 + dsim_optim_rule_slots(os) : 1;
}

/* One threshold a check accepts: `key: number` under the check's name. */
typedef struct dsim_check_param {
    const char *key; /* e.g. "max_rel_error" */
    const char *doc; /* one line: what it means, its unit */
    double min, max; /* accepted range, inclusive */
    double def;      /* value when the scenario does not give one */
    bool integer;    /* only whole numbers accepted */
} dsim_check_param;

struct dsim_scenario;

/* What a run with faults adds for node_loss (filled by the harness). */
typedef struct dsim_check_faults {
    /* The attempt the faults broke (the first that failed), or NULL when
     * none failed; broken_err its error. */
    const dsim_train_result *broken;
    dsim_err broken_err;
    int lost_rank; /* the first rank lost (killed, paused for good), or -1 */
    /* Every rank the broken attempt lost for good: lost[r] for r < n_ranks
     * (replicas, then parameter servers); NULL when it lost none. Name them
     * with dsim_check_ranks_text. */
    const bool *lost;
    int n_ranks;
    int64_t t_loss;   /* when, on broken's runtime clock; -1 if no rank was lost */
    int64_t bound_ns; /* what the settings guarantee (timeout + health check); <= 0 unknown */
    int restarts;     /* recovery restarts made */
    bool recovery;    /* the scenario asked for recovery: restart */
    /* A run of the same job without faults, for the recovery comparison;
     * NULL when none was made. */
    const dsim_train_result *clean;
    const char *checkpoint_path; /* the job's, or NULL */
    /* The checkpoint the broken attempt left (what a restart resumes from):
     * 0 none written yet, 1 intact at global step ckpt_step, -1 unreadable
     * (ckpt_msg says why). */
    int ckpt_state;
    uint64_t ckpt_step;
    const char *ckpt_msg;
    /* Every attempt of the job in order (the first is `broken` when it
     * restarted, the last is the check context's run); resumed[k] is the
     * checkpoint attempt k resumed from (NULL: attempt 0, or a fresh
     * start). n_attempts 0: only the run. */
    const dsim_train_result *const *attempts;
    const dsim_checkpoint *const *resumed;
    size_t n_attempts;
    /* steps run more than once: rolled back by a restart and run again */
    uint64_t steps_rolled_back;
    /* The broken attempt failed before any of its faults fired (no fault
     * event: a fault's start, a frame one dropped, ...). */
    bool none_fired;
    /* The job ran through (no broken attempt) and none of its faults fired
     * or touched a frame: the run shows nothing of the faults (a kill at a
     * step the run never reaches, a probability that never drew). */
    bool none_touched;
} dsim_check_faults;

/* What a check sees of a finished run. */
typedef struct dsim_check_ctx {
    /* The scenario the run came from, for dsim_check_run_all
     * (scenario/scenario.h), which judges it against its expect list; the
     * checks read nothing of it but what the members below carry. */
    const struct dsim_scenario *scenario;
    const dsim_train_cfg *cfg;          /* as run */
    const dsim_train_result *run;       /* the distributed run */
    const dsim_train_result *reference; /* the one-device replay, or NULL */
    dsim_err run_err;                   /* DSIM_OK, or how dsim_train failed */
    const dsim_check_faults *faults;    /* runs with faults: what node_loss needs, or NULL */
    size_t n_faults; /* the faults the scenario injects (dsim_check_run_all sets it) */
    /* The CPUs the run's workers shared on this host; 0: this process's
     * (dsim_rt_cpus). Tests set it. */
    int host_cpus;
} dsim_check_ctx;

typedef struct dsim_check_result {
    bool passed;
    double measured; /* NaN when there is nothing to measure */
    double expected; /* the threshold, NaN when none */
    char message[1024];
    /* The run cannot show what the check judges (the message says why):
     * neither passed nor failed, shown as N/A. */
    bool not_judged;
} dsim_check_result;

typedef struct dsim_check_ops {
    size_t size;          /* sizeof(struct dsim_check_ops) */
    const char *name;     /* "gradient_consistency" */
    const char *summary;  /* one line, for `dsim list checks` */
    bool available;       /* false: declared for scenarios, not yet runnable */
    bool needs_reference; /* the driver must run dsim_train_reference */
    int n_params;
    dsim_check_param params[DSIM_CHECK_MAX_PARAMS];
    /* Judges the run; values[i] is params[i]'s value. Required when
     * available. Fills *out; returns DSIM_OK unless the check itself could
     * not run (then the check counts as failed with that message). */
    dsim_err (*run)(const dsim_check_ctx *ctx, const double *values, dsim_check_result *out);
    /* Optional: whether these values need the reference run; NULL means
     * needs_reference decides alone. Lets convergence ask for the reference
     * only when within_pct_of_reference is set. */
    bool (*wants_reference)(const double *values);
    /* The check judges failed runs too (node_loss: the faults are meant to
     * break the run); other checks fail outright when the run failed. */
    bool judges_failed_runs;
    /* The check judges timing-only runs (a synthetic model: step times, no
     * numbers, no data); the others are reported not applicable there. */
    bool judges_timing_only;
    /* When the check is judged without the scenario naming it, in words
     * for `dsim list checks` ("every run", "a scenario with faults"); NULL:
     * only when named (its limits are the user's). The rule itself is the
     * scenario's (dsim_scenario_check_applies). */
    const char *by_default;
} dsim_check_ops;

/* What the performance check measures of a run (sim/check/performance.c),
 * also stored as metrics of every run. NaN: not measurable. */
typedef struct dsim_perf {
    double allreduce_share;    /* time in the exchange / step time, all replicas */
    double step_s;             /* median step (slowest replica per step) */
    double compute_s;          /* the median replica's median compute time per step */
    double straggler_factor;   /* the slowest replica's compute / the others' median (>= 1) */
    int straggler;             /* that replica, or -1 */
    double straggler_s;        /* its median compute time per step */
    double reference_step_s;   /* the one-device replay's median step, 0 if none */
    double scaling_efficiency; /* reference_step_s / (replicas * step_s) */
} dsim_perf;

/* ref: the one-device replay, or NULL. */
dsim_err dsim_perf_measure(const dsim_train_result *run, const dsim_train_result *ref,
                           dsim_perf *out);

/* Names the ranks lost[0..n) that are set, as a range and by worker:
 * "rank 1 (worker 0)", "ranks 2-3 (worker 1)", "ranks 0-1 (worker 0) and 5
 * (worker 2)", "parameter server 0 (rank 4)" (ranks from `replicas` on are
 * the parameter servers). Writes "no rank" when none is set. */
void dsim_check_ranks_text(const bool *lost, int n, int replicas, int devices_per_host, char *buf,
                           size_t cap);

/* The registered checks, and lookup by name (NULL if none). */
const dsim_check_ops *dsim_check_find(const char *name);
size_t dsim_check_count(void);
const dsim_check_ops *dsim_check_at(size_t i);
/* The parameter of ops named key, or -1. */
int dsim_check_param_index(const dsim_check_ops *ops, const char *key);
/* v[0..DSIM_CHECK_MAX_PARAMS): ops's defaults, NaN past its parameters. */
void dsim_check_defaults(const dsim_check_ops *ops, double *v);

/* ---- a scenario's expect list: judged by dsim_check_run_all (scenario.h) ---- */

/* A threshold left unset (NaN default, not given by the scenario). */
#define DSIM_CHECK_UNSET(v) ((v) != (v))
/* A count or ratio threshold at or above this means "no limit". */
#define DSIM_CHECK_NO_LIMIT 1e15

/* One row of the table `dsim run` prints and stores. */
typedef struct dsim_check_outcome {
    const char *name;  /* the check's name, or "error" for expect.error */
    bool expect_fail;  /* the scenario expects the check to fail */
    bool check_passed; /* the check's own verdict on the run */
    bool passed;       /* the expectation is met: check_passed != expect_fail */
    /* Not judged: the run has nothing this check measures (a timing-only
     * run moves no numbers); passed is true, result.message says why. */
    bool not_applicable;
    /* Judged by default: the check applies to the run and the scenario did
     * not name it (nor turn it off). */
    bool by_default;
    /* The run failed before the check could judge it (result.message says
     * how); the check counts as failed. */
    bool run_failed;
    dsim_check_result result;
} dsim_check_outcome;

#ifdef __cplusplus
}
#endif
#endif
