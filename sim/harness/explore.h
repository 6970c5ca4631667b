/* Randomised fault search with shrinking (dsim explore).
 *
 * dsim_explore takes a scenario file and runs it again and again under the
 * sim engine, each run with a fault schedule of its own drawn from a seeded
 * stream: up to max_faults faults, each of a kind from opts.kinds (kill,
 * pause, partition, drop, delay, slow, corrupt), at a step of the job, on a
 * rank, worker or link of the scenario's cluster, with a duration or
 * factor where the kind takes one. The scenario's own `faults:` section is
 * replaced by the drawn one; everything else (strategy, recovery, expect)
 * is the file's.
 *
 * A run fails when the scenario's expectations are not met: a check of
 * `expect:` that does not meet its expectation, or a run that errs, hangs,
 * crashes or outlives its wall-clock bound. The expectations define
 * success, so a consequence of a fault that the scenario accepts (a
 * node_loss the job detects and recovers from under `recovery: restart`)
 * is no failure. A failure's signature is the name of its first failing
 * check, or hung / crashed / timeout / error.
 *
 * At the first failure the search stops and the schedule is shrunk (delta
 * debugging, to a fixed point): drop a fault, move one earlier (step 0,
 * half its step, one step earlier), narrow a worker to its first rank,
 * move it to a lower rank, worker or link (rank 0, half its rank),
 * halve a duration or a slow factor, take a host away (hosts > 2, when the
 * faults still fit). A change is kept only when the run still fails with
 * the same signature. The minimal schedule is written as a standalone
 * scenario (the file's text without its faults, engine and seed, then
 * `engine: sim`, the seed and the faults) and run once more from the
 * written file to verify that it reproduces.
 *
 * Every run goes in a child process (fork): a run that crashes the process
 * or outlives run_timeout_s (the child is killed) is a failure of the
 * search's, never the end of it. Runs are not stored. */
#ifndef DSIM_EXPLORE_H
#define DSIM_EXPLORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DSIM_EXPLORE_KILL = 1u << 0,
    DSIM_EXPLORE_PAUSE = 1u << 1,
    DSIM_EXPLORE_PARTITION = 1u << 2,
    DSIM_EXPLORE_DROP = 1u << 3,
    DSIM_EXPLORE_DELAY = 1u << 4,
    DSIM_EXPLORE_SLOW = 1u << 5,
    DSIM_EXPLORE_CORRUPT = 1u << 6,
    DSIM_EXPLORE_ALL_KINDS = (1u << 7) - 1,
};

/* The kind bit of a name ("kill"), 0 for none. */
unsigned dsim_explore_kind(const char *name);
/* The names, comma-separated, for messages. */
const char *dsim_explore_kind_names(void);

/* A line of progress (no newline); called on the caller's thread. */
typedef void (*dsim_explore_say_fn)(const char *line, void *user);

typedef struct dsim_explore_opts {
    size_t size;          /* sizeof(dsim_explore_opts) */
    const char *path;     /* the scenario file */
    uint64_t runs;        /* >= 1 */
    uint64_t seed;        /* of the schedule stream */
    int max_faults;       /* 1 .. DSIM_EXPLORE_MAX_FAULTS */
    unsigned kinds;       /* DSIM_EXPLORE_* bits, != 0 */
    double run_timeout_s; /* wall-clock bound of one run, > 0 */
    int max_shrink_runs;  /* bound on the runs shrinking may make, >= 1 */
    const char *out_path; /* the minimal scenario; NULL: NAME.explore.yaml */
    const char *run_args; /* appended to "dsim run FILE" in the written file's
                             header (" --plugin-dir DIR"), or NULL */
    dsim_explore_say_fn say;
    void *say_user;
} dsim_explore_opts;

#define DSIM_EXPLORE_MAX_FAULTS 8

typedef struct dsim_explore_result {
    uint64_t runs_done;   /* exploration runs made (the baseline not counted) */
    bool baseline_failed; /* the scenario fails without any fault */
    bool found;           /* a run failed */
    uint64_t failing_run; /* its index, from 1 */
    char signature[128];  /* how it failed: a check name (with "(not judged: the run failed)",
                             "(not judged: the run failed: <the error's kind>)" for another
                             error than a timeout, abort or lost peer, or "(passed, expected
                             to fail)"), hung, crashed, timeout, error */
    char message[512];    /* what the failing check or the run said */
    int faults_found;     /* faults of the failing schedule */
    int faults_final;     /* after shrinking */
    int shrink_steps;     /* changes kept */
    int shrink_runs;      /* runs shrinking made */
    int hosts_final;      /* hosts of the written scenario */
    char out_path[4096];  /* the written scenario */
    char schedule[2048];  /* the minimal faults, as YAML flow lines */
    bool reproduced;      /* the written file failed the same way once more */
    /* baseline_failed: the run without faults was written to out_path, as
     * it ran (the file without its faults), so that `dsim run` shows it */
    bool baseline_written;
    /* dsim_explore_shapes: the sizes of the first failing run (or of the
     * file, when it fails as it is) and of the written scenario, in words
     * ("1 host x 3 devices, 9 parameters (features 2, classes 3), global
     * batch 7, 15 examples, 1 epoch"). */
    char shape_found[256];
    char shape_final[256];
} dsim_explore_result;

/* DSIM_OK when the search ran (whatever it found: see *out); DSIM_EINVAL /
 * DSIM_ENOENT / DSIM_ENOTSUP with a message (dsim_errmsg) for bad input: a
 * file that does not load or cannot run, bad options. */
dsim_err dsim_explore(const dsim_explore_opts *opts, dsim_explore_result *out);

/* dsim explore --shapes: the same search over sizes instead of faults.
 * Each run takes the scenario (its faults, engine, seed, matrix and
 * liveness left out; engine sim and the scenario's seed put in) at sizes of
 * its own, drawn from a seeded stream (run i's depend only on opts.seed and
 * i):
 *   - a cluster shape: 1 replica, prime numbers of replicas on one host or
 *     one device per host (2, 3, 5, 7, 11, 13), hosts x devices pairs that
 *     differ (2x3, 3x2, 2x5, 5x2, 3x4, 4x3) and a few even ones (2x2, 2x4,
 *     4x2, 3x3); the scenario's parameter servers are kept, and a shape
 *     the strategy refuses (its check_shape) is drawn again;
 *   - a model width (data.features and data.classes, which size the model):
 *     mostly a parameter count the replica count does not divide, sometimes
 *     fewer parameters than replicas;
 *   - a global batch with a remainder over the replicas (sometimes smaller
 *     than the replica count, now and then none) and examples that end in
 *     a short last batch: one example, one less than the replicas, one less
 *     than the batch; files raised to the hosts where the file has fewer.
 * The file at its own sizes runs first and must pass. The first failing
 * run is shrunk (to a fixed point, within max_shrink_runs): fewer hosts,
 * devices, features, classes, epochs, a smaller global batch and fewer
 * examples (each to its least, half, one less), a change kept only when
 * the run still fails with the same signature. The smallest is written as
 * a scenario (out_path, default NAME.shapes.yaml), run once more from the
 * file to verify it, and described in out->shape_final. max_faults and
 * kinds are not used. Returns as dsim_explore. */
dsim_err dsim_explore_shapes(const dsim_explore_opts *opts, dsim_explore_result *out);

/* The run that must pass first and failed, written to out->out_path as it
 * ran (text: the scenario "what", e.g. "without its faults"), with the
 * `dsim run` command in its header; sets out->baseline_written. For
 * dsim_explore and dsim_explore_shapes. */
void dsim_explore_write_base(const dsim_explore_opts *o, dsim_explore_result *out, const char *what,
                             const char *signature, const char *text);

#ifdef __cplusplus
}
#endif
#endif
