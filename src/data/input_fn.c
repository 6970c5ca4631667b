/* A pipeline of the caller's own (dsim/data.h, TF's
 * distribute_datasets_from_function): the context a dsim_input_fn gets, and
 * the list of elements it fills. input.c turns the list into the replicas'
 * batches. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/data.h"
#include "input_fn.h"

dsim_err dsim_input_context_per_replica_batch(const dsim_input_context *ic, int64_t global_batch,
                                              int64_t *out)
{
    if (!ic || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "get_per_replica_batch_size: NULL argument");
    int n = ic->num_replicas_in_sync;
    if (n < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "get_per_replica_batch_size: num_replicas_in_sync is %d; it must be >= 1",
                        n);
    if (global_batch < 0 || global_batch % n != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "get_per_replica_batch_size: the global batch size %lld is not divisible "
                        "by num_replicas_in_sync %d; use a global batch that is a multiple of %d",
                        (long long)global_batch, n, n);
    *out = global_batch / n;
    return DSIM_OK;
}

void input_batches_free(dsim_input_batches *b)
{
    free(b->ids);
    free(b->start);
    memset(b, 0, sizeof *b);
}

static dsim_err input_batches_grow(dsim_input_batches *b, uint64_t more)
{
    if (b->n + 2 > b->cap) {
        uint64_t cap = b->cap ? b->cap * 2 : 64;
        uint64_t *s = realloc(b->start, (size_t)cap * sizeof *s);
        if (!s)
            return DSIM_ERR(DSIM_ENOMEM, -1, "input_fn: no memory for %" PRIu64 " batches", cap);
        b->start = s;
        b->cap = cap;
    }
    if (b->n_ids + more > b->cap_ids) {
        uint64_t cap = b->cap_ids ? b->cap_ids * 2 : 256;
        while (cap < b->n_ids + more)
            cap *= 2;
        uint64_t *v = realloc(b->ids, (size_t)cap * sizeof *v);
        if (!v)
            return DSIM_ERR(DSIM_ENOMEM, -1, "input_fn: no memory for %" PRIu64 " example ids",
                            cap);
        b->ids = v;
        b->cap_ids = cap;
    }
    return DSIM_OK;
}

dsim_err dsim_input_batches_add(dsim_input_batches *b, const uint64_t *ids, uint64_t n)
{
    if (!b || (n && !ids))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_input_batches_add: NULL argument");
    if ((int64_t)n > b->global_batch)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "input_fn: pipeline %d's element %" PRIu64 " of epoch %" PRIu32
                        " is a batch of %" PRIu64 " examples, more than the global batch %lld; "
                        "an element is one replica's batch (get_per_replica_batch_size)",
                        b->pipeline, b->n, b->epoch, n, (long long)b->global_batch);
    for (uint64_t i = 0; i < n; i++)
        if (ids[i] >= b->n_examples)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "input_fn: pipeline %d's element %" PRIu64 " of epoch %" PRIu32
                            " holds example id %" PRIu64 ", outside the dataset's %" PRIu64
                            " examples (ids 0..%" PRIu64 ")",
                            b->pipeline, b->n, b->epoch, ids[i], b->n_examples,
                            b->n_examples ? b->n_examples - 1 : 0);
    DSIM_CHECK(input_batches_grow(b, n));
    if (b->n == 0)
        b->start[0] = 0;
    if (n)
        memcpy(b->ids + b->n_ids, ids, (size_t)n * sizeof *ids);
    b->n_ids += n;
    b->start[++b->n] = b->n_ids;
    return DSIM_OK;
}

dsim_err input_fn_list(const dsim_input_config *cfg, int pipeline, uint32_t epoch,
                       dsim_input_batches *b)
{
    b->n = 0;
    b->n_ids = 0;
    b->n_examples = cfg->dataset->n_examples;
    b->global_batch = cfg->global_batch;
    b->pipeline = pipeline;
    b->epoch = epoch;
    DSIM_CHECK(input_batches_grow(b, 0));
    b->start[0] = 0;
    int nris = cfg->num_replicas_in_sync > 0 ? cfg->num_replicas_in_sync
                                             : cfg->num_workers * cfg->replicas_per_worker;
    dsim_input_context ic = {
        .num_input_pipelines = cfg->num_workers,
        .input_pipeline_id = pipeline,
        .num_replicas_in_sync = nris,
        .replicas_per_pipeline = cfg->replicas_per_worker,
        .global_batch = cfg->global_batch,
        .dataset = cfg->dataset,
        .seed = cfg->seed,
        .shuffle = cfg->shuffle,
        .drop_remainder = cfg->drop_remainder,
        .epochs = cfg->epochs,
    };
    dsim_clear_error();
    dsim_err e = cfg->input_fn(cfg->input_fn_user, &ic, epoch, b);
    if (e != DSIM_OK && (dsim_last_error()->code != e || dsim_errmsg()[0] == '\0'))
        return DSIM_ERR(e, -1, "input_fn failed for pipeline %d, epoch %" PRIu32 ": %s", pipeline,
                        epoch, dsim_strerror(e));
    return e;
}
