/* Shard policy names, TF's batch_sizes_for_worker, and dataset descriptions. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dsim/data.h"

static const struct {
    const char *name;
    dsim_shard_policy policy;
} shard_policies[] = {
    {"off", DSIM_SHARD_OFF},   {"auto", DSIM_SHARD_AUTO}, {"file", DSIM_SHARD_FILE},
    {"data", DSIM_SHARD_DATA}, {"hint", DSIM_SHARD_HINT},
};

dsim_err dsim_shard_policy_parse(const char *name, dsim_shard_policy *out)
{
    if (name == NULL || out == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "shard policy: name and out must not be NULL");
    for (size_t i = 0; i < sizeof shard_policies / sizeof shard_policies[0]; i++) {
        if (strcasecmp(name, shard_policies[i].name) == 0) {
            *out = shard_policies[i].policy;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "unknown shard policy \"%s\": accepted are off, auto, file, data, hint", name);
}

const char *dsim_shard_policy_name(dsim_shard_policy p)
{
    for (size_t i = 0; i < sizeof shard_policies / sizeof shard_policies[0]; i++)
        if (shard_policies[i].policy == p)
            return shard_policies[i].name;
    return "unknown";
}

dsim_err dsim_shard_hint_parse(const char *name, dsim_shard_hint *out)
{
    if (name == NULL || out == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "shard hint: name and out must not be NULL");
    if (strcasecmp(name, "none") == 0) {
        *out = DSIM_HINT_NONE;
    } else if (strcasecmp(name, "files") == 0 || strcasecmp(name, "file") == 0) {
        *out = DSIM_HINT_FILES;
    } else if (strcasecmp(name, "elements") == 0 || strcasecmp(name, "data") == 0) {
        *out = DSIM_HINT_ELEMENTS;
    } else {
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "unknown shard hint place \"%s\": accepted are none, files, elements",
                        name);
    }
    return DSIM_OK;
}

const char *dsim_shard_hint_name(dsim_shard_hint h)
{
    switch (h) {
    case DSIM_HINT_NONE:
        return "none";
    case DSIM_HINT_FILES:
        return "files";
    case DSIM_HINT_ELEMENTS:
        return "elements";
    }
    return "unknown";
}

dsim_err dsim_batch_sizes_for_worker(int64_t global_batch, int num_workers, int replicas_per_worker,
                                     int worker, int64_t *sizes)
{
    if (global_batch < 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "global batch size %lld is negative: it must be >= 0",
                        (long long)global_batch);
    if (num_workers < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "number of workers %d: it must be >= 1", num_workers);
    if (replicas_per_worker < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "replicas per worker %d: it must be >= 1",
                        replicas_per_worker);
    if (worker < 0 || worker >= num_workers)
        return DSIM_ERR(DSIM_EINVAL, -1, "worker index %d is outside [0, %d) for %d workers",
                        worker, num_workers, num_workers);
    int64_t n = (int64_t)num_workers * replicas_per_worker;
    if (n > DSIM_MAX_REPLICAS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%d workers x %d replicas = %lld replicas: at most %d are supported",
                        num_workers, replicas_per_worker, (long long)n, DSIM_MAX_REPLICAS);
    if (sizes == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "batch sizes: output array must not be NULL");
    int64_t floor = global_batch / n;
    int64_t num_ceil = global_batch - n * floor;
    int64_t offset = (int64_t)worker * replicas_per_worker;
    /* Worker 0's list rotated left by offset: entry i is worker 0's entry
     * (i + offset) mod N, which is floor+1 for the first num_ceil entries. */
    for (int64_t i = 0; i < n; i++) {
        int64_t j = (i + offset) % n;
        sizes[i] = floor + (j < num_ceil ? 1 : 0);
    }
    return DSIM_OK;
}

dsim_err dsim_dataset_desc_init(dsim_dataset_desc *d, uint64_t n_examples, uint32_t n_files,
                                dsim_file_layout layout)
{
    if (d == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset: description must not be NULL");
    memset(d, 0, sizeof *d);
    d->n_examples = n_examples;
    d->n_files = n_files;
    if (n_files == 0)
        return DSIM_OK;
    if (layout != DSIM_FILES_CONTIGUOUS && layout != DSIM_FILES_STRIDED)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset: unknown file layout %d: accepted are contiguous, strided",
                        (int)layout);
    uint64_t *start = malloc(((size_t)n_files + 1) * sizeof *start);
    uint64_t *ids = malloc((n_examples ? (size_t)n_examples : 1) * sizeof *ids);
    if (start == NULL || ids == NULL) {
        free(start);
        free(ids);
        d->n_files = 0;
        return DSIM_ERR(DSIM_ENOMEM, -1, "dataset: no memory for %llu ids in %u files",
                        (unsigned long long)n_examples, n_files);
    }
    uint64_t per = n_examples / n_files, extra = n_examples % n_files;
    start[0] = 0;
    for (uint32_t f = 0; f < n_files; f++) {
        /* Strided file f holds ids f, f+F, ...: ceil((n-f)/F) of them, which
         * is also the contiguous layout's size (the first n%F files get one
         * more), so both layouts share the offsets. */
        uint64_t len = per + (f < extra ? 1 : 0);
        start[f + 1] = start[f] + len;
        for (uint64_t k = 0; k < len; k++)
            ids[start[f] + k] =
                layout == DSIM_FILES_CONTIGUOUS ? start[f] + k : f + k * (uint64_t)n_files;
    }
    d->file_start = start;
    d->file_ids = ids;
    return DSIM_OK;
}

void dsim_dataset_desc_release(dsim_dataset_desc *d)
{
    if (d == NULL)
        return;
    free((void *)d->file_start);
    free((void *)d->file_ids);
    d->file_start = NULL;
    d->file_ids = NULL;
}

dsim_err dsim_dataset_desc_check(const dsim_dataset_desc *d)
{
    if (d == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset: description must not be NULL");
    if (d->n_examples == 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset is empty (0 examples): give it at least one example");
    if ((int)d->hint < DSIM_HINT_NONE || (int)d->hint > DSIM_HINT_ELEMENTS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset: unknown shard hint place %d: accepted are none, files, elements",
                        (int)d->hint);
    if (d->n_files == 0) {
        if (d->hint == DSIM_HINT_FILES)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "dataset: the shard hint is on the file list but the dataset has no "
                            "files; put it on the elements or give the dataset files");
        return DSIM_OK;
    }
    if (d->file_start == NULL || d->file_ids == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset: %u files but no file table (file_start/file_ids are NULL)",
                        d->n_files);
    if (d->file_start[0] != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset: file_start[0] is %llu: it must be 0",
                        (unsigned long long)d->file_start[0]);
    for (uint32_t f = 0; f < d->n_files; f++)
        if (d->file_start[f + 1] < d->file_start[f])
            return DSIM_ERR(DSIM_EINVAL, -1, "dataset: file %u ends (%llu) before it starts (%llu)",
                            f, (unsigned long long)d->file_start[f + 1],
                            (unsigned long long)d->file_start[f]);
    if (d->file_start[d->n_files] != d->n_examples)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset: the %u files hold %llu ids but the dataset has %llu examples; "
                        "every example must be in exactly one file",
                        d->n_files, (unsigned long long)d->file_start[d->n_files],
                        (unsigned long long)d->n_examples);
    uint64_t words = (d->n_examples + 63) / 64;
    uint64_t *seen = calloc((size_t)words, sizeof *seen);
    if (seen == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dataset: no memory to check %llu ids",
                        (unsigned long long)d->n_examples);
    dsim_err e = DSIM_OK;
    for (uint32_t f = 0; f < d->n_files && e == DSIM_OK; f++) {
        for (uint64_t k = d->file_start[f]; k < d->file_start[f + 1]; k++) {
            uint64_t id = d->file_ids[k];
            if (id >= d->n_examples) {
                e = DSIM_ERR(DSIM_EINVAL, -1, "dataset: file %u holds id %llu, outside [0, %llu)",
                             f, (unsigned long long)id, (unsigned long long)d->n_examples);
                break;
            }
            if (seen[id / 64] & (1ull << (id % 64))) {
                e = DSIM_ERR(DSIM_EINVAL, -1,
                             "dataset: id %llu appears twice (again in file %u); every example "
                             "must be in exactly one file",
                             (unsigned long long)id, f);
                break;
            }
            seen[id / 64] |= 1ull << (id % 64);
        }
    }
    free(seen);
    return e;
}
