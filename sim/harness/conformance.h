/* A conformance battery for a strategy (dsim conformance).
 *
 * dsim_conformance runs a standard battery of cases against one strategy,
 * a built-in or a plugin: the catalogue's shapes and awkward ones (1
 * replica, primes, hosts x devices pairs that differ, parameter counts the
 * replicas do not divide, fewer parameters than replicas, global batches
 * with remainders, one-example tails, fewer examples a step than
 * replicas), sgd, momentum, adam (and amsgrad), adamax, rmsprop, adagrad,
 * lion and lamb, gradients all-reduced in bfloat16 with a restart, every engine, checkpoints with a
 * restart, a kill with recovery, a partition and a straggler. The cases are rows of a table
 * (battery.c; dsim_conf_case_at): adding a case is adding a row.
 *
 * Each case is a scenario made from its row with the strategy put in,
 * run through the harness (harness.h) in a child process of its own
 * (isolate.h) on each of its engines, so its expect list is judged
 * exactly as `dsim run` judges a file. The runs go in a working directory
 * of their own (their checkpoints), removed afterwards; nothing is stored.
 *
 * Fitting a case to the strategy. A row asks for a cluster shape; the
 * strategy's check_shape (dsim_strategy_probe) decides which is run, the
 * first it accepts of: the shape as asked; with 2, then 1, parameter
 * servers; the same replicas on one host; one replica. Then the row's
 * needs are checked against the shape and the strategy's traits: a case
 * that needs peers (a kill, a straggler) needs 2 or more replicas, a
 * partition 2 or more workers and a synchronous strategy, a checkpoint
 * case a save member and a synchronous strategy (its replicas_in_sync
 * equal to its replicas: an asynchronous one cannot replay the same
 * updates after a restart, so it cannot end where a clean run ends). A case
 * whose needs are not met is not applicable, with the reason; it neither
 * passes nor fails. A row may ask for checkpoints only where the strategy
 * can write them (the kill and partition cases restart from scratch
 * otherwise). */
#ifndef DSIM_SIM_HARNESS_CONFORMANCE_H
#define DSIM_SIM_HARNESS_CONFORMANCE_H

#include <stdbool.h>
#include <stddef.h>

#include "dsim/err.h"
#include "isolate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a case needs of the strategy and the shape it runs. */
enum {
    DSIM_CONF_PEERS = 1u << 0,   /* 2 or more replicas (a fault on rank 1) */
    DSIM_CONF_WORKERS = 1u << 1, /* 2 or more workers (a partition of worker 1) */
    DSIM_CONF_SYNC = 1u << 2,    /* a synchronous strategy */
    DSIM_CONF_SAVE = 1u << 3,    /* checkpoints: the strategy has save */
    /* strategy.gradient_dtype: a strategy that all-reduces its gradients
     * (not parameter_server or central_storage, which send them in
     * float32); a plugin that does not all-reduce through
     * dsim_strategy_allreduce_grad is found when its runs say so */
    DSIM_CONF_NARROW = 1u << 4,
    /* the whole gradient on a replica (global_clipnorm): not the built-in
     * parameter_server, whose servers each apply their own shard */
    DSIM_CONF_WHOLE_GRAD = 1u << 5,
    /* optimizers that hold whole variables (LAMB's norms per variable): not
     * the built-in parameter_server; a plugin whose optimizers of parts cut
     * variables is found when its runs say so */
    DSIM_CONF_WHOLE_VARS = 1u << 6,
};

/* One row of the battery. The strings are YAML (flow style) put into the
 * scenario as they are, under their keys; NULL leaves the key out. */
typedef struct dsim_conf_case {
    const char *name;  /* [a-z0-9_]+, unique */
    const char *about; /* one line: what it exercises */
    int hosts, devices_per_host;
    const char *engines;        /* "all" (every registered engine) or a comma list */
    unsigned needs;             /* DSIM_CONF_* */
    bool quick;                 /* in the reduced battery (--quick) */
    const char *strategy_extra; /* more strategy: keys, e.g. "timeout: 2s"; NULL:
                                   "timeout: 10s" (a hang is stopped in 20 s) */
    const char *model, *optimizer, *data;
    /* checkpoint: its `every` and the like; the path (CASE.ckpt in the
     * working directory) is added. With DSIM_CONF_SAVE the case is not
     * applicable to a strategy without save; without it, checkpoint is left
     * out for such a strategy. */
    const char *checkpoint;
    const char *faults; /* a flow list */
    const char *recovery;
    const char *expect;
} dsim_conf_case;

size_t dsim_conf_case_count(void);
const dsim_conf_case *dsim_conf_case_at(size_t i);

typedef enum dsim_conf_verdict {
    DSIM_CONF_PASS,  /* every run met every expectation */
    DSIM_CONF_FAIL,  /* a run did not (a check, a hang, a crash, a timeout) */
    DSIM_CONF_NA,    /* not applicable to this strategy: message says why */
    DSIM_CONF_ERROR, /* the case could not be run (its scenario was refused) */
} dsim_conf_verdict;

/* "pass", "FAIL", "n/a", "ERROR". */
const char *dsim_conf_verdict_name(dsim_conf_verdict v);

/* One engine's run of a case. */
typedef struct dsim_conf_run {
    char engine[32];
    char *text; /* the scenario run */
    dsim_isolated iso;
    char signature[128]; /* "" when it passed (dsim_isolated_signature) */
    char message[512];
    double wall_s;
} dsim_conf_run;

typedef struct dsim_conf_outcome {
    const dsim_conf_case *c;
    dsim_conf_verdict verdict;
    int hosts, devices_per_host, ps; /* the shape run (0 x 0 when none) */
    char tpu[40];                    /* the TPU slice run ("v3-8"), or "" */
    char engines[128];               /* the engines it ran on, comma-separated */
    char message[1024];              /* one line: why it failed, why n/a, or what passed */
    dsim_conf_run *runs;
    size_t n_runs;
    double wall_s;
} dsim_conf_outcome;

/* Called after each case (on the caller's thread). */
typedef void (*dsim_conf_case_fn)(const dsim_conf_outcome *o, void *user);

typedef struct dsim_conf_opts {
    size_t size;          /* sizeof(dsim_conf_opts) */
    const char *strategy; /* a registered name (built-in, or a plugin loaded before) */
    const char *plugin;   /* the plugin's file, put into each scenario; NULL: built-in */
    const char *ps_mode;  /* "sync" | "async"; NULL: the strategy's default */
    bool quick;           /* only the rows marked quick */
    const char *cases;    /* comma list of case names to run; NULL: all (of --quick) */
    const char *engines;  /* comma list: run only on these; NULL: each row's */
    double run_timeout_s; /* wall-clock bound of one run, > 0 */
    const char *workdir;  /* NULL: a temporary directory, removed afterwards */
    dsim_conf_case_fn on_case;
    void *user;
} dsim_conf_opts;

typedef struct dsim_conf_result {
    dsim_conf_outcome *cases;
    size_t n_cases;
    size_t passed, failed, not_applicable, errors;
    double wall_s;
} dsim_conf_result;

/* Runs the battery. DSIM_OK when it ran (whatever it found: see out);
 * DSIM_EINVAL / DSIM_ENOENT with a message for bad input: no such
 * strategy, an unknown case or engine, bad options. Free out with
 * dsim_conf_result_free either way. */
dsim_err dsim_conformance(const dsim_conf_opts *opts, dsim_conf_result *out);

void dsim_conf_result_free(dsim_conf_result *r);

#ifdef __cplusplus
}
#endif
#endif
