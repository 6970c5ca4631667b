/* The input pipeline: sharding, global-batch splitting, epochs, shuffling,
 * and a coverage ledger of which replica read which example.
 *
 * It reproduces what tf.distribute does to a dataset given to
 * experimental_distribute_dataset (input_lib.DistributedDataset):
 *
 *   every worker: dataset [-> shuffle(seed, reshuffle each epoch)]
 *                 -> batch(G, drop_remainder)
 *                 -> rebatch(batch_sizes_for_worker(G, W, R, w))
 *                 -> auto_shard(W, w, policy)
 *                 -> one element per local replica per step (round-robin)
 *
 * and what the auto-shard rewrite (grappler auto_shard.cc) makes of it:
 *
 *   OFF   nothing is sharded: every worker reads every example; its batches
 *         are cut by batch_sizes_for_worker, so an epoch lasts W times as
 *         many steps and each example is read once per worker.
 *   FILE  the file list is sharded: worker w reads files f with f % W == w,
 *         in file order (then shuffled on the worker when shuffle is on).
 *         Fewer files than workers is an error naming both counts. A dataset
 *         without files is an error (TF: "did not find a shardable source").
 *         With one worker TF skips the rewrite, so nothing is checked.
 *   DATA  every worker processes the whole dataset (same order: the shuffle
 *         seed is the same on every worker) and keeps its share. TF inserts
 *         the shard at the end of the pipeline and, because sharding by data
 *         is incompatible with rebatch-by-sizes, rewrites the rebatch to the
 *         legacy one: each global batch of b examples is cut into N = W*R
 *         minibatches of ceil(b/N) examples (the last ones shorter or empty),
 *         and minibatch k goes to worker k % W, replica k / W. So "element i
 *         goes to worker i mod W" holds at the granularity TF shards at: the
 *         rebatched minibatches. Each step consumes one global batch.
 *         Example G=7, W=2, R=2: minibatches [2,2,2,1]; w0 gets k=0,2 and w1
 *         gets k=1,3. G=6, N=4 gives [2,2,2,0]: the last replica never gets
 *         data (a TF quirk the ledger reports as an idle replica).
 *   AUTO  FILE when the dataset has files, else DATA (TF tries FILE and falls
 *         back to DATA only when no reader is found; a file-based dataset
 *         with fewer files than workers is the FILE error, not a fallback).
 *         Which one was applied, and why, is logged (worker 0, info) and
 *         returned by dsim_input_policy_applied()/dsim_input_policy_reason().
 *   HINT  TF replaces shard(SHARD_HINT, SHARD_HINT) placeholders with
 *         shard(W, w) and leaves the rebatch alone. Where the placeholder sits
 *         is a property of the dataset (dsim_dataset_desc.hint):
 *           NONE      no placeholder: nothing is sharded (as OFF);
 *           FILES     on the file list: as FILE (fewer files than workers is
 *                     the same error; no one-worker exception);
 *           ELEMENTS  on the examples before batching: example at position i
 *                     (after the shuffle) goes to worker i % W; fewer
 *                     examples than workers is an error.
 *
 * Global batch split (FILE, OFF, HINT): a worker batches its own stream to G
 * and cuts it with rebatch sizes S = batch_sizes_for_worker(G, W, R, w),
 * taken in turn; per step its R replicas take the next R sub-batches. TF's
 * RebatchDatasetV2 treats its input as one stream, so only the very end
 * differs from full cycles. At the end of a worker's stream (M examples):
 *   - a sub-batch that wants more than is left gets what is left, and the
 *     worker's stream ends there;
 *   - when the examples run out exactly, sub-batches of size 0 (G < N) that
 *     come next are still produced (empty, but "with a value") until the
 *     next non-zero size, where the stream ends;
 *   - replicas after the end of their worker's stream get an empty batch
 *     with has_value false (TF's dummy batch with batch dimension 0).
 * Replicas are filled in order, so earlier replicas get data first.
 * Example G=7, W=2, R=2, FILE with two files of 7: w0 sizes [2,2,2,1]
 * gives steps [A0 A1 | A2 A3], [A4 A5 | A6]; w1 sizes [2,1,2,2] gives
 * [B0 B1 | B2], [B3 B4 | B5 B6].
 *
 * End of epoch: TF all-reduces "worker has data" (its replica 0 has a
 * value) across workers and ends the epoch when no worker has any. Every
 * worker's stream length is known from the description, so each input
 * computes the number of steps per epoch locally and no collective is
 * needed; worker_has_value is still reported for strategies that want to
 * reduce it. Every worker therefore runs the same number of steps, with
 * empty batches after its own data ran out.
 *
 * drop_remainder is the user's batch(G, drop_remainder): it drops the
 * partial last batch of G of each worker's own stream (FILE, OFF, HINT) or
 * of the whole dataset (DATA). An epoch that would read no example is an
 * error.
 *
 * Shuffle: a uniform permutation per epoch drawn from the stream keyed by
 * (seed, "data.shuffle", epoch), the same stream on every worker, as TF's
 * shuffle(seed=S, reshuffle_each_iteration=True) with the same S on every
 * worker. Under OFF, DATA and HINT(ELEMENTS) it permutes the whole dataset
 * before sharding, so every worker agrees on the order (which DATA needs to
 * partition the data). Under FILE and HINT(FILES) it permutes each worker's
 * own stream after the file shard, where TF's auto-shard puts the shuffle.
 */
#ifndef DSIM_DATA_H
#define DSIM_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The values are TF's AutoShardPolicy values. */
typedef enum dsim_shard_policy {
    DSIM_SHARD_OFF = -1,
    DSIM_SHARD_AUTO = 0,
    DSIM_SHARD_FILE = 1,
    DSIM_SHARD_DATA = 2,
    DSIM_SHARD_HINT = 3,
} dsim_shard_policy;

/* Parses "off", "auto", "file", "data", "hint" (any case). Anything else is
 * DSIM_EINVAL with a message listing the accepted names. */
DSIM_API dsim_err dsim_shard_policy_parse(const char *name, dsim_shard_policy *out);
/* "off", "auto", "file", "data", "hint"; "unknown" for anything else. */
DSIM_API const char *dsim_shard_policy_name(dsim_shard_policy p);

/* Where a SHARD_HINT placeholder sits in the dataset (used by HINT only). */
typedef enum dsim_shard_hint {
    DSIM_HINT_NONE = 0, /* no placeholder */
    DSIM_HINT_FILES,    /* shard(SHARD_HINT, SHARD_HINT) on the file list */
    DSIM_HINT_ELEMENTS, /* on the examples, before batch() */
} dsim_shard_hint;

/* Parses "none", "files", "elements" (any case; "file", "data" also). */
DSIM_API dsim_err dsim_shard_hint_parse(const char *name, dsim_shard_hint *out);
DSIM_API const char *dsim_shard_hint_name(dsim_shard_hint h);

/* TF's batch_sizes_for_worker: with N = W*R, floor = G / N and
 * num_ceil = G - N*floor, worker 0 gets [floor+1]*num_ceil +
 * [floor]*(N-num_ceil) and worker w that list rotated left by w*R.
 * Writes N sizes (G >= 0; G = 0 gives zeros). DSIM_EINVAL for G < 0,
 * W < 1, R < 1, worker outside [0, W), or N over DSIM_MAX_REPLICAS. */
#define DSIM_MAX_REPLICAS (1 << 24)
DSIM_API dsim_err dsim_batch_sizes_for_worker(int64_t global_batch, int num_workers,
                                              int replicas_per_worker, int worker, int64_t *sizes);

/* A dataset: examples with global ids 0..n_examples-1, optionally stored in
 * n_files files. File f holds file_ids[file_start[f] .. file_start[f+1]),
 * read in that order; the files together hold every id exactly once
 * (file_start has n_files + 1 entries, file_start[n_files] == n_examples).
 * Files may be empty. Without files (n_files == 0, arrays NULL) the order is
 * 0, 1, ..., n-1; with files it is file 0's ids, then file 1's, ... The
 * arrays are borrowed: they must outlive every input made from the
 * description. */
typedef struct dsim_dataset_desc {
    uint64_t n_examples;
    uint32_t n_files;
    const uint64_t *file_start;
    const uint64_t *file_ids;
    dsim_shard_hint hint;
} dsim_dataset_desc;

typedef enum dsim_file_layout {
    DSIM_FILES_CONTIGUOUS, /* file f holds a contiguous range; sizes differ by at most 1 */
    DSIM_FILES_STRIDED,    /* file f holds the ids with id % n_files == f */
} dsim_file_layout;

/* Fills d with n examples in n_files files (0: no files) laid out as
 * `layout`, allocating the arrays; release them with dsim_dataset_desc_release. */
DSIM_API dsim_err dsim_dataset_desc_init(dsim_dataset_desc *d, uint64_t n_examples,
                                         uint32_t n_files, dsim_file_layout layout);
/* Frees arrays allocated by dsim_dataset_desc_init (only those). */
DSIM_API void dsim_dataset_desc_release(dsim_dataset_desc *d);
/* Checks a description (ids in range, each exactly once, offsets sane);
 * DSIM_EINVAL naming the first problem. */
DSIM_API dsim_err dsim_dataset_desc_check(const dsim_dataset_desc *d);

/* ---- a pipeline of the caller's own: TF's distribute_datasets_from_function
 *
 * tf.distribute.Strategy.distribute_datasets_from_function(input_fn) calls
 * input_fn(input_context) once per input pipeline (one per worker) and
 * hands the elements of the dataset it returns, each a per-replica batch,
 * to the worker's replicas in turn: element k to local replica k % R at
 * step k / R. Nothing is sharded or rebatched for it: input_fn does that
 * with what the context says. dsim's form is a function that, for a
 * pipeline and an epoch, lists that dataset's elements as example ids
 * (dsim_input_batches_add), from the dataset's description (ids, files,
 * the job's seed and shuffle): it never touches the examples themselves.
 * The job's steps per epoch are those of the pipeline with most elements
 * in epoch 0 (TF ends the epoch when no worker has data); replicas past
 * their pipeline's last element get an empty batch (has_value false). A
 * later epoch with more elements than fit in those steps is an error. */

/* TF's tf.distribute.InputContext, and what dsim adds so that the function
 * can describe its dataset. */
typedef struct dsim_input_context {
    int num_input_pipelines;   /* TF's: the workers, one pipeline each */
    int input_pipeline_id;     /* TF's: this pipeline, 0 .. num_input_pipelines - 1 */
    int num_replicas_in_sync;  /* TF's: the replicas whose batches make one global batch */
    int replicas_per_pipeline; /* the local replicas that share this pipeline's elements */
    int64_t global_batch;      /* the job's global batch */
    const dsim_dataset_desc *dataset;
    uint64_t seed;       /* the job's data settings, for the function to honour */
    bool shuffle;        /* (shuffle keyed by seed and epoch, e.g. dsim_rng "data.shuffle") */
    bool drop_remainder; /* per-replica batches of fewer examples dropped */
    uint32_t epochs;
} dsim_input_context;

/* TF's InputContext.get_per_replica_batch_size: global_batch /
 * num_replicas_in_sync, or DSIM_EINVAL when it does not divide (TF's
 * ValueError), naming both. */
DSIM_API dsim_err dsim_input_context_per_replica_batch(const dsim_input_context *ic,
                                                       int64_t global_batch, int64_t *out);

/* The elements the function lists (opaque; the input owns it). */
typedef struct dsim_input_batches dsim_input_batches;
/* Appends one element: a per-replica batch of n example ids (n may be 0:
 * an empty batch). DSIM_EINVAL for an id outside the dataset or a batch
 * larger than the global batch, naming the pipeline, epoch and element. */
DSIM_API dsim_err dsim_input_batches_add(dsim_input_batches *b, const uint64_t *ids, uint64_t n);

/* The function: pipeline ic->input_pipeline_id's elements of `epoch`, in
 * order, appended to out. Called once per pipeline and epoch on every
 * replica's input, and for every pipeline when the job's steps per epoch
 * are computed, so it must give the same answer each time. */
typedef dsim_err (*dsim_input_fn)(void *user, const dsim_input_context *ic, uint32_t epoch,
                                  dsim_input_batches *out);

typedef struct dsim_input_config {
    const dsim_dataset_desc *dataset; /* borrowed: must outlive the input */
    dsim_shard_policy policy;
    int64_t global_batch;    /* G >= 1 */
    int num_workers;         /* W >= 1 */
    int replicas_per_worker; /* R >= 1 */
    int worker;              /* this worker, 0 <= worker < W */
    uint64_t seed;
    bool shuffle;        /* reshuffle every epoch */
    bool drop_remainder; /* batch(G, drop_remainder) */
    uint32_t epochs;     /* >= 1 */
    /* Optional (0: compute it). For the other inputs of one job: what
     * dsim_input_steps_per_epoch said for its first input, made with the
     * same dataset and shape. The input then neither checks the dataset
     * again (O(examples)) nor computes the epoch from every worker's stream
     * (O(workers)), so a job's W inputs cost O(W) to make, not O(W^2). */
    uint64_t steps_per_epoch;
    /* Optional: the pipeline is input_fn's (distribute_datasets_from_function,
     * above) instead of the shard policy's; policy is then not applied
     * (dsim_input_policy_applied says OFF: TF does not auto-shard such a
     * dataset) and dsim_input_from_fn says so. num_replicas_in_sync for its
     * context: 0 takes num_workers * replicas_per_worker. */
    dsim_input_fn input_fn;
    void *input_fn_user;
    int num_replicas_in_sync;
} dsim_input_config;

/* One worker's input. It holds no shared state: each worker (thread) makes
 * its own, and one input is used by one thread at a time. */
typedef struct dsim_input dsim_input;

/* One replica's batch in one step. ids stay valid until the next call on
 * the input. has_value is false when the worker's stream had already ended
 * (TF hands such a replica a dummy batch of size 0). */
typedef struct dsim_replica_batch {
    const uint64_t *ids;
    uint64_t n;
    bool has_value;
} dsim_replica_batch;

typedef struct dsim_input_step {
    bool done;         /* every epoch has been read; nothing else is set */
    uint32_t epoch;    /* 0-based */
    uint64_t step;     /* 0-based within the epoch */
    bool end_of_epoch; /* the epoch's last step */
    /* TF's per-worker "has data" (its replica 0 has a value): what
     * multi-worker strategies all-reduce to find the end of an epoch. */
    bool worker_has_value;
    int replicas;                    /* R */
    const dsim_replica_batch *batch; /* batch[r] for local replica r */
    uint64_t examples;               /* sum of batch[r].n */
} dsim_input_step;

/* Resolves the policy and checks every value; DSIM_EINVAL names the value,
 * what was expected, and the fix. */
DSIM_API dsim_err dsim_input_create(const dsim_input_config *cfg, dsim_input **out);
DSIM_API void dsim_input_destroy(dsim_input *in);
/* The next step of this worker; step->done after the last epoch. */
DSIM_API dsim_err dsim_input_next(dsim_input *in, dsim_input_step *step);
/* Positions the input so the next call returns (epoch, step): to redo an
 * interrupted epoch after a restore. step may equal the steps per epoch
 * (the epoch's end). */
DSIM_API dsim_err dsim_input_seek(dsim_input *in, uint32_t epoch, uint64_t step);
/* Steps in every epoch: the same for every worker. */
DSIM_API uint64_t dsim_input_steps_per_epoch(const dsim_input *in);
/* Examples this worker hands its replicas per epoch. */
DSIM_API uint64_t dsim_input_worker_examples(const dsim_input *in);
/* The policy actually applied (FILE or DATA for AUTO; never AUTO). */
DSIM_API dsim_shard_policy dsim_input_policy_applied(const dsim_input *in);
/* A sentence saying what was applied and why. */
DSIM_API const char *dsim_input_policy_reason(const dsim_input *in);
/* true when the input's batches come from a dsim_input_fn. */
DSIM_API bool dsim_input_from_fn(const dsim_input *in);

/* The first epoch of every worker, for `dsim plan`. Replica index is
 * worker * R + r. */
typedef struct dsim_input_plan {
    dsim_shard_policy requested, applied;
    char reason[256];
    int64_t global_batch;
    int num_workers, replicas_per_worker;
    bool drop_remainder, shuffle;
    uint64_t n_examples;
    uint32_t n_files;
    uint64_t steps; /* per epoch */
    /* Files worker w reads: files[files_start[w] .. files_start[w+1]). */
    uint64_t *files_start;
    uint32_t *files;
    uint64_t *reads; /* examples worker w reads per epoch (DATA, OFF: all) */
    /* Examples worker w hands its replicas in epoch 0, in the order it
     * does: kept[kept_start[w] .. kept_start[w+1]). */
    uint64_t *kept_start;
    uint64_t *kept;
    /* batch[s * N + i]: examples replica i gets in step s of epoch 0. */
    uint64_t *batch;
    bool from_fn; /* the batches are an input_fn's (no shard policy applied) */
} dsim_input_plan;

/* cfg->worker is ignored. */
DSIM_API dsim_err dsim_input_plan_make(const dsim_input_config *cfg, dsim_input_plan **out);
DSIM_API void dsim_input_plan_free(dsim_input_plan *p);
/* Writes the plan as a table a person reads. */
DSIM_API dsim_err dsim_input_plan_print(const dsim_input_plan *p, FILE *f);

/* The coverage ledger: which replica read which example in which epoch.
 *
 * Each replica appends to its own buffers, so replicas may record at the
 * same time from different threads without locks; one replica's calls must
 * not overlap (a replica is one thread in every engine). Queries merge the
 * buffers: run them once recording has stopped. Replica index is
 * worker * R + r. */
typedef struct dsim_ledger dsim_ledger;

DSIM_API dsim_err dsim_ledger_create(uint64_t n_examples, uint32_t epochs, int num_workers,
                                     int replicas_per_worker, dsim_ledger **out);
DSIM_API void dsim_ledger_destroy(dsim_ledger *l);
/* Records that `replica` read ids[0..n) in (epoch, step). Record empty
 * batches too (n = 0): they are how idle replicas are found. Ids outside
 * the dataset are kept and counted as out of range. */
DSIM_API dsim_err dsim_ledger_record(dsim_ledger *l, int replica, uint32_t epoch, uint64_t step,
                                     const uint64_t *ids, uint64_t n);
/* Records that `replica` re-ran lost replica `lost`'s (epoch, step), reading
 * ids[0..n) (dsim_strategy_ops.lost_work): the reads count for `lost`, and
 * an example read by both the lost replica's own attempt and the re-run is
 * read at least once (dsim_coverage.reruns), not a duplicate. */
DSIM_API dsim_err dsim_ledger_record_rerun(dsim_ledger *l, int replica, int lost, uint32_t epoch,
                                           uint64_t step, const uint64_t *ids, uint64_t n);
/* Records every local replica's batch of one input step of `worker`. */
DSIM_API dsim_err dsim_ledger_record_step(dsim_ledger *l, int worker, const dsim_input_step *st);
/* Copies into dst (of the same shape) src's records of the global steps
 * [from, to), where a record's global step is epoch * steps_per_epoch +
 * step: as they are, or with rolled_back as reads of steps a restart rolled
 * back (Keras BackupAndRestore: the steps after the checkpoint it resumes
 * from are run again, and only that second run counts). Rolled-back reads
 * are kept apart: dsim_coverage.rolled_back counts them, and no other
 * query sees them. How a job that restarted is judged: each attempt's
 * steps up to the checkpoint the next one resumed from, then the next
 * attempt's. */
DSIM_API dsim_err dsim_ledger_copy_steps(dsim_ledger *dst, const dsim_ledger *src,
                                         uint64_t steps_per_epoch, uint64_t from, uint64_t to,
                                         bool rolled_back);

typedef struct dsim_coverage {
    uint32_t epoch;
    int worker;        /* -1: all workers */
    uint32_t expected; /* reads expected per example */
    uint64_t n_examples;
    uint64_t reads;        /* example reads recorded */
    uint64_t exact;        /* examples read exactly `expected` times */
    uint64_t duplicates;   /* examples read more than expected */
    uint64_t misses;       /* examples read fewer times than expected */
    uint64_t reruns;       /* examples read more than expected only because a lost
                              replica's step they were in ran again (at least once) */
    uint64_t out_of_range; /* recorded ids >= n_examples */
    /* example reads of steps a restart rolled back (dsim_ledger_copy_steps),
     * and those steps: read again after the restart, counted nowhere else */
    uint64_t rolled_back, rolled_back_steps;
    uint64_t steps; /* highest recorded step + 1 */
    /* (step, replica) pairs where the replica got no example while another
     * replica (of the same filter) got some. */
    uint64_t idle;
    uint64_t min_examples, max_examples; /* per replica over the epoch */
    int min_replica, max_replica;
    double imbalance; /* max/min; INFINITY when min is 0 < max; 1 when both 0 */
} dsim_coverage;

/* worker -1: every replica; else only that worker's replicas. */
DSIM_API dsim_err dsim_ledger_coverage(const dsim_ledger *l, uint32_t epoch, int worker,
                                       uint32_t expected, dsim_coverage *out);
/* counts[id] = reads of id in epoch (n_examples entries), re-runs included. */
DSIM_API dsim_err dsim_ledger_counts(const dsim_ledger *l, uint32_t epoch, int worker,
                                     uint32_t *counts);

typedef enum dsim_ledger_list_kind {
    DSIM_LEDGER_DUPLICATES, /* read more than expected by the replicas' own steps */
    DSIM_LEDGER_MISSES,     /* read fewer times than expected, re-runs included */
} dsim_ledger_list_kind;

/* Writes up to cap ids of that kind, lowest first; *total gets how many
 * there are. */
DSIM_API dsim_err dsim_ledger_list(const dsim_ledger *l, uint32_t epoch, int worker,
                                   uint32_t expected, dsim_ledger_list_kind kind, uint64_t *ids,
                                   size_t cap, size_t *total);

typedef struct dsim_idle {
    uint64_t step;
    int replica;
} dsim_idle;

/* Writes up to cap idle (step, replica) pairs, by step then replica. */
DSIM_API dsim_err dsim_ledger_idle(const dsim_ledger *l, uint32_t epoch, int worker, dsim_idle *out,
                                   size_t cap, size_t *total);
/* The replicas that read id in epoch, one entry per read, by replica. */
DSIM_API dsim_err dsim_ledger_readers(const dsim_ledger *l, uint32_t epoch, uint64_t id,
                                      int *replicas, size_t cap, size_t *total);

#ifdef __cplusplus
}
#endif
#endif
