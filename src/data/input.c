/* The per-worker input iterator and the whole-job plan.
 *
 * Nothing here materialises batches: a worker's examples for the epoch sit
 * in one array (its stream `ws`, in the order it hands them out) and every
 * replica batch is a slice of it whose bounds are computed from the rebatch
 * arithmetic. The semantics are described in dsim/data.h.
 *
 * Where the stream is the whole dataset in its own order (nothing sharded
 * before batching, no shuffle: DATA, OFF), it is not copied per worker: each
 * step's slices are written into a window of a step's size (`win`). A copy
 * of the whole dataset per worker would make a job's memory grow as
 * workers x examples, and examples grow with the workers (W^2). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/data.h"
#include "dsim/log.h"
#include "dsim/rng.h"
#include "input_fn.h"

/* What a worker keeps before batching. */
enum input_shard {
    INPUT_SHARD_NONE,     /* the whole dataset (OFF, HINT without placeholder, DATA) */
    INPUT_SHARD_FILES,    /* files f with f % W == w */
    INPUT_SHARD_ELEMENTS, /* positions i % W == w (HINT on the examples) */
};

struct dsim_input {
    dsim_input_config cfg;
    const dsim_dataset_desc *ds;
    dsim_shard_policy applied;
    char reason[256];
    enum input_shard shard;
    /* DATA: TF rewrites the rebatch to the legacy one (ceil(b/N) slices) and
     * shards the minibatches; otherwise rebatch by batch_sizes_for_worker. */
    bool legacy;
    uint64_t g, n_rep;      /* G and N = W*R */
    uint64_t floor, n_ceil; /* batch_sizes_for_worker's floor and num_ceil */
    uint64_t off;           /* this worker's rotation w*R */
    uint64_t m;             /* examples in this worker's stream */
    uint64_t mm;            /* after drop_remainder */
    uint64_t outputs;       /* sub-batches this worker produces per epoch */
    uint64_t steps;         /* steps per epoch, the same on every worker */
    uint64_t kept;          /* examples handed to this worker's replicas per epoch */
    uint64_t *ws;           /* the stream of the epoch ws_epoch; NULL with win */
    uint64_t ws_len;
    uint64_t *win; /* the dataset's order unshuffled: this step's slices */
    uint64_t win_cap;
    uint64_t *scratch; /* the whole dataset's order (HINT on the examples) */
    int64_t ws_epoch;
    uint32_t epoch; /* position of the next step */
    uint64_t step;
    dsim_replica_batch *batch;
    /* cfg.input_fn: this pipeline's elements of epoch fb_epoch */
    dsim_input_batches fb;
    int64_t fb_epoch;
};

/* ---- rebatch arithmetic -------------------------------------------------- */

/* Worker 0's batch_sizes_for_worker list: entry j. */
static uint64_t input_base(const dsim_input *in, uint64_t j)
{
    return in->floor + (j < in->n_ceil ? 1 : 0);
}

/* Sum of worker 0's entries [0, j). */
static uint64_t input_base_prefix(const dsim_input *in, uint64_t j)
{
    return j * in->floor + (j < in->n_ceil ? j : in->n_ceil);
}

/* Sum of the first t entries of the list rotated by off (t <= N). */
static uint64_t input_rot_prefix(const dsim_input *in, uint64_t off, uint64_t t)
{
    uint64_t n = in->n_rep;
    if (off + t <= n)
        return input_base_prefix(in, off + t) - input_base_prefix(in, off);
    return input_base_prefix(in, n) - input_base_prefix(in, off) +
           input_base_prefix(in, off + t - n);
}

/* Sub-batches RebatchDatasetV2 produces from a stream of mm examples with
 * the sizes rotated by off. Full cycles of N consume G each; in the last,
 * partial cycle a sub-batch wanting more than is left gets the rest and ends
 * the stream, while after an exact end the zero-size sub-batches (G < N)
 * that follow are still produced until a non-zero size asks for more. */
static uint64_t input_v2_outputs(const dsim_input *in, uint64_t off, uint64_t mm)
{
    uint64_t n = in->n_rep, c = mm / in->g, q = mm % in->g, tail;
    if (in->floor > 0) {
        if (q == 0) {
            tail = 0;
        } else {
            /* No zero sizes: the smallest t whose prefix covers q. */
            uint64_t lo = 1, hi = n;
            while (lo < hi) {
                uint64_t mid = lo + (hi - lo) / 2;
                if (input_rot_prefix(in, off, mid) >= q)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            tail = lo;
        }
    } else {
        /* Sizes are 0 or 1, every take is exact, and the stream ends at the
         * (q+1)-th size 1: its position in the rotated list. */
        uint64_t nc = in->n_ceil;
        if (off < nc)
            tail = q < nc - off ? q : n - off + (q - (nc - off));
        else
            tail = n - off + q;
    }
    return c * n + tail;
}

/* Start (in ws) and length of this worker's sub-batch number j < outputs. */
static void input_output_slice(const dsim_input *in, uint64_t j, uint64_t *start, uint64_t *len)
{
    if (in->legacy) {
        uint64_t r_per = (uint64_t)in->cfg.replicas_per_worker;
        uint64_t s = j / r_per, r = j % r_per;
        uint64_t k = (uint64_t)in->cfg.worker + r * (uint64_t)in->cfg.num_workers;
        uint64_t b = in->mm - s * in->g;
        if (b > in->g)
            b = in->g;
        uint64_t iv = (b + in->n_rep - 1) / in->n_rep;
        uint64_t st = k * iv < b ? k * iv : b;
        uint64_t en = st + iv < b ? st + iv : b;
        *start = s * in->g + st;
        *len = en - st;
        return;
    }
    uint64_t cyc = j / in->n_rep, i = j % in->n_rep;
    uint64_t size = input_base(in, (i + in->off) % in->n_rep);
    uint64_t st = cyc * in->g + input_rot_prefix(in, in->off, i);
    *start = st;
    if (size == 0 || st >= in->mm)
        *len = 0;
    else
        *len = size < in->mm - st ? size : in->mm - st;
}

/* Examples the legacy rebatch hands worker w's replicas from a batch of b. */
static uint64_t input_legacy_kept(const dsim_input *in, uint64_t b)
{
    uint64_t iv = (b + in->n_rep - 1) / in->n_rep, sum = 0;
    for (int r = 0; r < in->cfg.replicas_per_worker; r++) {
        uint64_t k = (uint64_t)in->cfg.worker + (uint64_t)r * (uint64_t)in->cfg.num_workers;
        uint64_t st = k * iv < b ? k * iv : b;
        uint64_t en = st + iv < b ? st + iv : b;
        sum += en - st;
    }
    return sum;
}

/* Examples in worker w's stream before batching. */
static uint64_t input_stream_len(const dsim_input *in, int w)
{
    const dsim_dataset_desc *d = in->ds;
    uint64_t nw = (uint64_t)in->cfg.num_workers;
    switch (in->shard) {
    case INPUT_SHARD_FILES: {
        uint64_t m = 0;
        for (uint64_t f = (uint64_t)w; f < d->n_files; f += nw)
            m += d->file_start[f + 1] - d->file_start[f];
        return m;
    }
    case INPUT_SHARD_ELEMENTS:
        return d->n_examples > (uint64_t)w ? (d->n_examples - (uint64_t)w - 1) / nw + 1 : 0;
    case INPUT_SHARD_NONE:
        break;
    }
    return d->n_examples;
}

static uint64_t input_drop(const dsim_input *in, uint64_t m)
{
    return in->cfg.drop_remainder ? m / in->g * in->g : m;
}

/* ---- policy resolution --------------------------------------------------- */

static dsim_err input_resolve(dsim_input *in)
{
    const dsim_dataset_desc *d = in->ds;
    int nw = in->cfg.num_workers;
    dsim_shard_policy p = in->cfg.policy;
    bool from_auto = false;
    in->legacy = false;
    in->shard = INPUT_SHARD_NONE;
    if (p == DSIM_SHARD_AUTO) {
        /* TF tries FILE and falls back to DATA only when it finds no reader;
         * a reader with too few files is FILE's error. */
        from_auto = true;
        p = d->n_files > 0 ? DSIM_SHARD_FILE : DSIM_SHARD_DATA;
    }
    in->applied = p;
    switch (p) {
    case DSIM_SHARD_OFF:
        snprintf(in->reason, sizeof in->reason,
                 "OFF: nothing is sharded; every worker reads all %" PRIu64 " examples",
                 d->n_examples);
        return DSIM_OK;
    case DSIM_SHARD_FILE:
        if (!from_auto && nw == 1) {
            /* TF leaves the pipeline alone for FILE with one worker. */
            snprintf(in->reason, sizeof in->reason,
                     "FILE with one worker: nothing to shard; worker 0 reads all %" PRIu64
                     " examples",
                     d->n_examples);
            return DSIM_OK;
        }
        if (d->n_files == 0)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "shard policy file needs a file-based dataset, but this one has no "
                            "files (0 files for %d workers); use shard policy data or auto, or "
                            "give the dataset files",
                            nw);
        if (d->n_files < (uint32_t)nw)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%scould not apply FILE sharding: the dataset has %u file(s), fewer "
                            "than the %d workers; give it at least %d files, or use shard policy "
                            "data or off",
                            from_auto ? "shard policy auto chose FILE (the dataset has files) but "
                                      : "",
                            d->n_files, nw, nw);
        in->shard = INPUT_SHARD_FILES;
        snprintf(in->reason, sizeof in->reason,
                 "%sFILE: worker w reads the files f with f %% %d == w (%u files)",
                 from_auto ? "AUTO applied " : "", nw, d->n_files);
        return DSIM_OK;
    case DSIM_SHARD_DATA:
        in->legacy = true;
        snprintf(in->reason, sizeof in->reason,
                 "%sDATA: %severy worker reads all %" PRIu64
                 " examples and keeps minibatch k of each global batch when k %% %d is its index",
                 from_auto ? "AUTO applied " : "",
                 from_auto ? "the dataset has no files to shard; " : "", d->n_examples, nw);
        return DSIM_OK;
    case DSIM_SHARD_HINT:
        switch (d->hint) {
        case DSIM_HINT_NONE:
            snprintf(in->reason, sizeof in->reason,
                     "HINT: the dataset has no SHARD_HINT placeholder; nothing is sharded and "
                     "every worker reads all %" PRIu64 " examples",
                     d->n_examples);
            return DSIM_OK;
        case DSIM_HINT_FILES:
            if (d->n_files < (uint32_t)nw)
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "shard policy hint: the placeholder on the file list cannot "
                                "shard %u file(s) over %d workers (fewer files than workers); "
                                "give the dataset at least %d files",
                                d->n_files, nw, nw);
            in->shard = INPUT_SHARD_FILES;
            snprintf(in->reason, sizeof in->reason,
                     "HINT: the placeholder on the file list became shard(%d, w) over %u files", nw,
                     d->n_files);
            return DSIM_OK;
        case DSIM_HINT_ELEMENTS:
            if (d->n_examples < (uint64_t)nw)
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "shard policy hint: the placeholder on the examples cannot "
                                "shard %" PRIu64 " example(s) over %d workers (fewer examples "
                                "than workers); use fewer workers or more examples",
                                d->n_examples, nw);
            in->shard = INPUT_SHARD_ELEMENTS;
            snprintf(in->reason, sizeof in->reason,
                     "HINT: the placeholder on the examples became shard(%d, w): example "
                     "position i goes to worker i %% %d",
                     nw, nw);
            return DSIM_OK;
        }
        break;
    case DSIM_SHARD_AUTO:
        break;
    }
    return DSIM_ERR(DSIM_EINVAL, -1, "internal: unresolved shard policy %d", (int)p);
}

static dsim_err input_check_config(const dsim_input_config *c)
{
    if (c == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input: config must not be NULL");
    if (c->dataset == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input: config.dataset must not be NULL");
    if (c->policy < DSIM_SHARD_OFF || c->policy > DSIM_SHARD_HINT)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "input: shard policy %d is not one of off (-1), auto (0), file (1), "
                        "data (2), hint (3)",
                        (int)c->policy);
    if (c->global_batch < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "input: global batch size %lld: it must be >= 1 (batch() needs a "
                        "positive size)",
                        (long long)c->global_batch);
    if (c->num_workers < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "input: number of workers %d: it must be >= 1",
                        c->num_workers);
    if (c->replicas_per_worker < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "input: replicas per worker %d: it must be >= 1",
                        c->replicas_per_worker);
    if ((int64_t)c->num_workers * c->replicas_per_worker > DSIM_MAX_REPLICAS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "input: %d workers x %d replicas is more than the %d replicas supported",
                        c->num_workers, c->replicas_per_worker, DSIM_MAX_REPLICAS);
    if (c->worker < 0 || c->worker >= c->num_workers)
        return DSIM_ERR(DSIM_EINVAL, -1, "input: worker index %d is outside [0, %d) for %d workers",
                        c->worker, c->num_workers, c->num_workers);
    if (c->epochs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "input: epochs is 0: it must be >= 1");
    if (c->steps_per_epoch && c->dataset && c->dataset->n_examples > 0)
        return DSIM_OK; /* checked when the job's first input was made */
    return dsim_dataset_desc_check(c->dataset);
}

/* ---- a pipeline of the caller's own (cfg.input_fn) ----------------------- */

/* Loads this pipeline's elements of `epoch` and checks they fit in the
 * job's steps. */
static dsim_err input_fn_load(dsim_input *in, uint32_t epoch)
{
    if (in->fb_epoch == (int64_t)epoch)
        return DSIM_OK;
    in->fb_epoch = -1;
    DSIM_CHECK(input_fn_list(&in->cfg, in->cfg.worker, epoch, &in->fb));
    uint64_t rp = (uint64_t)in->cfg.replicas_per_worker;
    if (in->fb.n > in->steps * rp)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "input_fn: pipeline %d lists %" PRIu64 " batches in epoch %" PRIu32
                        ", more than its %" PRIu64 " replica(s) take in the job's %" PRIu64
                        " steps per epoch (set by epoch 0); every epoch must fit in epoch 0's "
                        "steps",
                        in->cfg.worker, in->fb.n, epoch, rp, in->steps);
    in->fb_epoch = epoch;
    return DSIM_OK;
}

/* Steps per epoch: the most any pipeline needs in epoch 0. */
static dsim_err input_fn_steps(dsim_input *in)
{
    uint64_t rp = (uint64_t)in->cfg.replicas_per_worker, steps = 0, ids = 0;
    for (int w = 0; w < in->cfg.num_workers; w++) {
        DSIM_CHECK(input_fn_list(&in->cfg, w, 0, &in->fb));
        uint64_t s = (in->fb.n + rp - 1) / rp;
        if (s > steps)
            steps = s;
        ids += in->fb.n_ids;
    }
    if (ids == 0)
        return DSIM_ERR(
            DSIM_EINVAL, -1,
            "input_fn: no pipeline lists any example in epoch 0 (%d pipeline(s), %" PRIu64
            " examples), so an epoch would read nothing",
            in->cfg.num_workers, in->ds->n_examples);
    in->steps = steps;
    return DSIM_OK;
}

static dsim_err input_fn_create(dsim_input *in, dsim_input **out)
{
    const dsim_input_config *cfg = &in->cfg;
    in->fb_epoch = -1;
    in->applied = DSIM_SHARD_OFF;
    snprintf(in->reason, sizeof in->reason,
             "input_fn (distribute_datasets_from_function): %d pipeline(s) list each "
             "replica's examples themselves; no shard policy is applied",
             cfg->num_workers);
    in->g = (uint64_t)cfg->global_batch;
    in->n_rep = (uint64_t)cfg->num_workers * (uint64_t)cfg->replicas_per_worker;
    in->batch = calloc((size_t)cfg->replicas_per_worker, sizeof *in->batch);
    dsim_err e = in->batch ? DSIM_OK : DSIM_ERR(DSIM_ENOMEM, -1, "input: no memory");
    if (e == DSIM_OK && cfg->steps_per_epoch)
        in->steps = cfg->steps_per_epoch;
    else if (e == DSIM_OK)
        e = input_fn_steps(in);
    if (e == DSIM_OK)
        e = input_fn_load(in, 0);
    if (e != DSIM_OK) {
        dsim_input_destroy(in);
        return e;
    }
    in->outputs = in->fb.n;
    in->kept = in->fb.n_ids;
    in->m = in->mm = in->kept;
    if (cfg->worker == 0)
        dsim_info("input: %s", in->reason);
    *out = in;
    return DSIM_OK;
}

static dsim_err input_fn_next(dsim_input *in, dsim_input_step *st)
{
    DSIM_CHECK(input_fn_load(in, in->epoch));
    int rp = in->cfg.replicas_per_worker;
    st->epoch = in->epoch;
    st->step = in->step;
    st->end_of_epoch = in->step + 1 == in->steps;
    st->worker_has_value = in->step * (uint64_t)rp < in->fb.n;
    st->replicas = rp;
    st->batch = in->batch;
    for (int r = 0; r < rp; r++) {
        uint64_t j = in->step * (uint64_t)rp + (uint64_t)r;
        dsim_replica_batch *b = &in->batch[r];
        b->has_value = j < in->fb.n;
        b->ids = in->fb.ids ? in->fb.ids + (b->has_value ? in->fb.start[j] : 0) : NULL;
        b->n = b->has_value ? in->fb.start[j + 1] - in->fb.start[j] : 0;
        st->examples += b->n;
    }
    if (++in->step == in->steps) {
        in->step = 0;
        in->epoch++;
    }
    return DSIM_OK;
}

dsim_err dsim_input_create(const dsim_input_config *cfg, dsim_input **out)
{
    if (out == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input: out must not be NULL");
    *out = NULL;
    DSIM_CHECK(input_check_config(cfg));
    dsim_input *in = calloc(1, sizeof *in);
    if (in == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "input: no memory");
    in->cfg = *cfg;
    in->ds = cfg->dataset;
    in->ws_epoch = -1;
    if (cfg->input_fn)
        return input_fn_create(in, out);
    dsim_err e = input_resolve(in);
    if (e != DSIM_OK) {
        free(in);
        return e;
    }
    const dsim_dataset_desc *d = in->ds;
    int nw = cfg->num_workers, rp = cfg->replicas_per_worker;
    in->g = (uint64_t)cfg->global_batch;
    in->n_rep = (uint64_t)nw * (uint64_t)rp;
    in->floor = in->g / in->n_rep;
    in->n_ceil = in->g - in->n_rep * in->floor;
    in->off = (uint64_t)cfg->worker * (uint64_t)rp;

    /* Every worker's stream length is known here, so the epoch's length
     * (TF: until no worker has data) needs no collective. */
    uint64_t total = 0, steps = 0;
    int w_end = nw;
    if (cfg->steps_per_epoch && !in->legacy) /* given: only this worker's stream */
        w_end = cfg->worker + 1;
    for (int w = cfg->steps_per_epoch && !in->legacy ? cfg->worker : 0; w < w_end; w++) {
        uint64_t mm = input_drop(in, input_stream_len(in, w)), outs;
        if (in->legacy) {
            outs = (mm + in->g - 1) / in->g * (uint64_t)rp;
            total = mm;
        } else {
            outs = input_v2_outputs(in, (uint64_t)w * (uint64_t)rp, mm);
            total += mm;
        }
        uint64_t s = (outs + (uint64_t)rp - 1) / (uint64_t)rp;
        if (s > steps)
            steps = s;
        if (w == cfg->worker) {
            in->m = input_stream_len(in, w);
            in->mm = mm;
            in->outputs = outs;
        }
        if (in->legacy)
            break; /* every worker sees the same batches */
    }
    if (in->legacy) {
        in->m = d->n_examples;
        in->mm = input_drop(in, in->m);
        in->outputs = (in->mm + in->g - 1) / in->g * (uint64_t)rp;
        in->kept = in->mm / in->g * input_legacy_kept(in, in->g) +
                   (in->mm % in->g ? input_legacy_kept(in, in->mm % in->g) : 0);
    } else {
        in->kept = in->mm;
    }
    if (cfg->steps_per_epoch) {
        steps = cfg->steps_per_epoch;
    } else if (total == 0 || steps == 0) {
        dsim_shard_policy applied = in->applied;
        free(in);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "input: with drop_remainder every worker's share is smaller than the "
                        "global batch %lld (%" PRIu64 " examples, %d workers, policy %s), so an "
                        "epoch would read nothing; lower the global batch or set "
                        "drop_remainder to false",
                        (long long)cfg->global_batch, d->n_examples, nw,
                        dsim_shard_policy_name(applied));
    }
    in->steps = steps;
    in->ws_len = in->shard == INPUT_SHARD_NONE ? d->n_examples : in->m;
    if (in->shard == INPUT_SHARD_NONE && !cfg->shuffle) {
        /* A sub-batch is at most ceil(G / N) examples (both rebatches) and
         * never more than the dataset. */
        uint64_t per = in->g / in->n_rep + 1;
        if (per > d->n_examples)
            per = d->n_examples;
        in->win_cap = per * (uint64_t)rp;
        in->win = malloc((in->win_cap ? (size_t)in->win_cap : 1) * sizeof *in->win);
    } else {
        in->ws = malloc((in->ws_len ? (size_t)in->ws_len : 1) * sizeof *in->ws);
    }
    if (in->shard == INPUT_SHARD_ELEMENTS)
        in->scratch = malloc((size_t)d->n_examples * sizeof *in->scratch);
    in->batch = calloc((size_t)rp, sizeof *in->batch);
    if ((in->ws == NULL && in->win == NULL) || in->batch == NULL ||
        (in->shard == INPUT_SHARD_ELEMENTS && in->scratch == NULL)) {
        dsim_input_destroy(in);
        return DSIM_ERR(DSIM_ENOMEM, -1, "input: no memory for a stream of %" PRIu64 " examples",
                        d->n_examples);
    }
    if (cfg->worker == 0)
        dsim_info("input: %s", in->reason);
    *out = in;
    return DSIM_OK;
}

void dsim_input_destroy(dsim_input *in)
{
    if (in == NULL)
        return;
    free(in->ws);
    free(in->win);
    free(in->scratch);
    free(in->batch);
    input_batches_free(&in->fb);
    free(in);
}

/* The dataset's order before any shuffle, written into dst. */
static void input_base_order(const dsim_input *in, uint64_t *dst)
{
    const dsim_dataset_desc *d = in->ds;
    if (d->n_files > 0) {
        memcpy(dst, d->file_ids, (size_t)d->n_examples * sizeof *dst);
    } else {
        for (uint64_t i = 0; i < d->n_examples; i++)
            dst[i] = i;
    }
}

static void input_shuffle(const dsim_input *in, uint32_t epoch, uint64_t *v, uint64_t n)
{
    /* Keyed by epoch, not worker: every worker draws the same stream, as
     * TF's shuffle does with the same seed on every worker. */
    dsim_rng rng;
    dsim_rng_init(&rng, in->cfg.seed, "data.shuffle", epoch);
    dsim_rng_shuffle_u64(&rng, v, n);
}

static void input_build_stream(dsim_input *in, uint32_t epoch)
{
    if (in->win)
        return; /* the dataset's own order: input_window */
    if (in->ws_epoch >= 0 && (!in->cfg.shuffle || in->ws_epoch == (int64_t)epoch))
        return;
    const dsim_dataset_desc *d = in->ds;
    uint64_t nw = (uint64_t)in->cfg.num_workers, w = (uint64_t)in->cfg.worker;
    switch (in->shard) {
    case INPUT_SHARD_NONE:
        input_base_order(in, in->ws);
        if (in->cfg.shuffle)
            input_shuffle(in, epoch, in->ws, in->ws_len);
        break;
    case INPUT_SHARD_ELEMENTS: {
        input_base_order(in, in->scratch);
        if (in->cfg.shuffle)
            input_shuffle(in, epoch, in->scratch, d->n_examples);
        uint64_t k = 0;
        for (uint64_t i = w; i < d->n_examples; i += nw)
            in->ws[k++] = in->scratch[i];
        break;
    }
    case INPUT_SHARD_FILES: {
        uint64_t k = 0;
        for (uint64_t f = w; f < d->n_files; f += nw) {
            uint64_t len = d->file_start[f + 1] - d->file_start[f];
            memcpy(in->ws + k, d->file_ids + d->file_start[f], (size_t)len * sizeof *in->ws);
            k += len;
        }
        if (in->cfg.shuffle)
            input_shuffle(in, epoch, in->ws, in->ws_len);
        break;
    }
    }
    in->ws_epoch = epoch;
}

/* Writes the stream's slice [start, start + len) (the dataset's order) at
 * win[k] and returns where it starts. */
static const uint64_t *input_window(dsim_input *in, uint64_t k, uint64_t start, uint64_t len)
{
    const dsim_dataset_desc *d = in->ds;
    uint64_t *w = in->win + k;
    if (d->n_files > 0)
        memcpy(w, d->file_ids + start, (size_t)len * sizeof *w);
    else
        for (uint64_t i = 0; i < len; i++)
            w[i] = start + i;
    return w;
}

dsim_err dsim_input_next(dsim_input *in, dsim_input_step *st)
{
    if (in == NULL || st == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input next: input and step must not be NULL");
    memset(st, 0, sizeof *st);
    if (in->epoch >= in->cfg.epochs) {
        st->done = true;
        return DSIM_OK;
    }
    if (in->cfg.input_fn)
        return input_fn_next(in, st);
    input_build_stream(in, in->epoch);
    int rp = in->cfg.replicas_per_worker;
    st->epoch = in->epoch;
    st->step = in->step;
    st->end_of_epoch = in->step + 1 == in->steps;
    st->worker_has_value = in->step * (uint64_t)rp < in->outputs;
    st->replicas = rp;
    st->batch = in->batch;
    uint64_t k = 0;
    for (int r = 0; r < rp; r++) {
        uint64_t j = in->step * (uint64_t)rp + (uint64_t)r, start = 0, len = 0;
        dsim_replica_batch *b = &in->batch[r];
        b->has_value = j < in->outputs;
        if (b->has_value)
            input_output_slice(in, j, &start, &len);
        if (in->win && k + len <= in->win_cap) {
            b->ids = input_window(in, k, start, len);
            k += len;
        } else if (in->win) {
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "input next: step %" PRIu64 " wants %" PRIu64 " examples for its "
                            "replicas, over the %" PRIu64 " the rebatch allows; this is a bug "
                            "in src/data/input.c",
                            in->step, k + len, in->win_cap);
        } else {
            b->ids = in->ws + (start < in->ws_len ? start : 0);
        }
        b->n = len;
        st->examples += len;
    }
    if (++in->step == in->steps) {
        in->step = 0;
        in->epoch++;
    }
    return DSIM_OK;
}

dsim_err dsim_input_seek(dsim_input *in, uint32_t epoch, uint64_t step)
{
    if (in == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input seek: input must not be NULL");
    if (epoch >= in->cfg.epochs || step > in->steps)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "input seek: (epoch %u, step %" PRIu64 ") is outside %u epochs of %" PRIu64
                        " steps",
                        epoch, step, in->cfg.epochs, in->steps);
    if (step == in->steps) {
        epoch++;
        step = 0;
    }
    in->epoch = epoch;
    in->step = step;
    return DSIM_OK;
}

uint64_t dsim_input_steps_per_epoch(const dsim_input *in)
{
    return in ? in->steps : 0;
}

uint64_t dsim_input_worker_examples(const dsim_input *in)
{
    return in ? in->kept : 0;
}

dsim_shard_policy dsim_input_policy_applied(const dsim_input *in)
{
    return in ? in->applied : DSIM_SHARD_OFF;
}

const char *dsim_input_policy_reason(const dsim_input *in)
{
    return in ? in->reason : "";
}

bool dsim_input_from_fn(const dsim_input *in)
{
    return in && in->cfg.input_fn;
}

/* ---- plan ---------------------------------------------------------------- */

void dsim_input_plan_free(dsim_input_plan *p)
{
    if (p == NULL)
        return;
    free(p->files_start);
    free(p->files);
    free(p->reads);
    free(p->kept_start);
    free(p->kept);
    free(p->batch);
    free(p);
}

dsim_err dsim_input_plan_make(const dsim_input_config *cfg, dsim_input_plan **out)
{
    if (out == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input plan: out must not be NULL");
    *out = NULL;
    if (cfg == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input plan: config must not be NULL");
    dsim_input_config c = *cfg;
    c.worker = 0;
    c.epochs = 1;
    dsim_input *in0;
    DSIM_CHECK(dsim_input_create(&c, &in0));
    const dsim_dataset_desc *d = c.dataset;
    int nw = c.num_workers, rp = c.replicas_per_worker;
    uint64_t n_rep = (uint64_t)nw * (uint64_t)rp;
    dsim_input_plan *p = calloc(1, sizeof *p);
    if (p == NULL) {
        dsim_input_destroy(in0);
        return DSIM_ERR(DSIM_ENOMEM, -1, "input plan: no memory");
    }
    p->requested = c.policy;
    p->applied = in0->applied;
    snprintf(p->reason, sizeof p->reason, "%s", in0->reason);
    p->global_batch = c.global_batch;
    p->num_workers = nw;
    p->replicas_per_worker = rp;
    p->drop_remainder = c.drop_remainder;
    p->shuffle = c.shuffle;
    p->n_examples = d->n_examples;
    p->n_files = d->n_files;
    p->steps = in0->steps;
    p->from_fn = c.input_fn != NULL;
    /* The other workers' inputs as a job makes them: the dataset checked
     * and the epoch computed once (in0), so that the plan costs O(workers
     * + examples), not O(workers x examples). */
    c.steps_per_epoch = in0->steps;
    bool file_shard = in0->shard == INPUT_SHARD_FILES;
    uint64_t total_kept = 0;
    dsim_err e = DSIM_OK;
    p->files_start = calloc((size_t)nw + 1, sizeof *p->files_start);
    p->files = malloc(((size_t)d->n_files * (file_shard ? 1 : (size_t)nw) + 1) * sizeof *p->files);
    p->reads = calloc((size_t)nw, sizeof *p->reads);
    p->kept_start = calloc((size_t)nw + 1, sizeof *p->kept_start);
    p->batch = calloc((size_t)(p->steps * n_rep) + 1, sizeof *p->batch);
    if (!p->files_start || !p->files || !p->reads || !p->kept_start || !p->batch) {
        e = DSIM_ERR(DSIM_ENOMEM, -1,
                     "input plan: no memory for %" PRIu64 " steps x %" PRIu64 " replicas", p->steps,
                     n_rep);
        goto fail;
    }
    /* Sizes first, so the kept lists can be laid out in one array. */
    for (int w = 0; w < nw; w++) {
        dsim_input *in;
        c.worker = w;
        if ((e = dsim_input_create(&c, &in)) != DSIM_OK)
            goto fail;
        p->kept_start[w + 1] = p->kept_start[w] + in->kept;
        total_kept += in->kept;
        p->files_start[w + 1] = p->files_start[w];
        for (uint32_t f = 0; f < d->n_files && !c.input_fn; f++) {
            if (!file_shard || f % (uint32_t)nw == (uint32_t)w)
                p->files[p->files_start[w + 1]++] = f;
        }
        /* input_fn: the pipeline reads what it lists */
        p->reads[w] = file_shard || c.input_fn ? in->m : d->n_examples;
        dsim_input_destroy(in);
    }
    p->kept = malloc(((size_t)total_kept + 1) * sizeof *p->kept);
    if (p->kept == NULL) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "input plan: no memory for %" PRIu64 " example ids",
                     total_kept);
        goto fail;
    }
    for (int w = 0; w < nw; w++) {
        dsim_input *in;
        c.worker = w;
        if ((e = dsim_input_create(&c, &in)) != DSIM_OK)
            goto fail;
        uint64_t k = p->kept_start[w];
        for (;;) {
            dsim_input_step st;
            if ((e = dsim_input_next(in, &st)) != DSIM_OK || st.done)
                break;
            for (int r = 0; r < rp; r++) {
                p->batch[st.step * n_rep + (uint64_t)w * (uint64_t)rp + (uint64_t)r] =
                    st.batch[r].n;
                memcpy(p->kept + k, st.batch[r].ids, (size_t)st.batch[r].n * sizeof *p->kept);
                k += st.batch[r].n;
            }
        }
        dsim_input_destroy(in);
        if (e != DSIM_OK)
            goto fail;
    }
    dsim_input_destroy(in0);
    *out = p;
    return DSIM_OK;
fail:
    dsim_input_destroy(in0);
    dsim_input_plan_free(p);
    return e;
}

dsim_err dsim_input_plan_print(const dsim_input_plan *p, FILE *f)
{
    if (p == NULL || f == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "input plan print: plan and stream must not be NULL");
    int nw = p->num_workers, rp = p->replicas_per_worker;
    uint64_t n_rep = (uint64_t)nw * (uint64_t)rp;
    if (p->from_fn) {
        fprintf(f, "%s\n", p->reason);
    } else {
        fprintf(f, "shard policy %s", dsim_shard_policy_name(p->applied));
        if (p->requested != p->applied)
            fprintf(f, " (requested %s)", dsim_shard_policy_name(p->requested));
        fprintf(f, ": %s\n", p->reason);
    }
    fprintf(f,
            "%" PRIu64 " examples in %u files, global batch %lld, %d workers x %d replicas, "
            "drop_remainder %s, shuffle %s\n",
            p->n_examples, p->n_files, (long long)p->global_batch, nw, rp,
            p->drop_remainder ? "yes" : "no", p->shuffle ? "yes" : "no");
    fprintf(f, "%" PRIu64 " steps per epoch\n\n", p->steps);
    fprintf(f, "%-7s %12s %12s  %s\n", "worker", "reads", "keeps", "files");
    for (int w = 0; w < nw; w++) {
        fprintf(f, "%-7d %12" PRIu64 " %12" PRIu64 "  ", w, p->reads[w],
                p->kept_start[w + 1] - p->kept_start[w]);
        uint64_t nf = p->files_start[w + 1] - p->files_start[w];
        if (nf == 0)
            fprintf(f, "-");
        for (uint64_t i = 0; i < nf && i < 8; i++)
            fprintf(f, "%s%u", i ? "," : "", p->files[p->files_start[w] + i]);
        if (nf > 8)
            fprintf(f, ",... (%" PRIu64 " files)", nf);
        fprintf(f, "\n");
    }
    fprintf(f, "\n%-7s", "step");
    for (int w = 0; w < nw; w++)
        for (int r = 0; r < rp; r++)
            fprintf(f, " w%dr%d", w, r);
    fprintf(f, " %7s\n", "total");
    for (uint64_t s = 0; s < p->steps; s++) {
        uint64_t tot = 0;
        fprintf(f, "%-7" PRIu64, s);
        for (uint64_t i = 0; i < n_rep; i++) {
            int w = (int)(i / (uint64_t)rp), r = (int)(i % (uint64_t)rp);
            int width = snprintf(NULL, 0, " w%dr%d", w, r) - 1;
            fprintf(f, " %*" PRIu64, width, p->batch[s * n_rep + i]);
            tot += p->batch[s * n_rep + i];
        }
        fprintf(f, " %7" PRIu64 "\n", tot);
    }
    return ferror(f) ? DSIM_ERR(DSIM_EIO, -1, "input plan print: write failed") : DSIM_OK;
}
