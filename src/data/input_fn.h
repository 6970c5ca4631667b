/* Internal to src/data: the elements a dsim_input_fn lists (input_fn.c),
 * which input.c hands to the replicas. */
#ifndef DSIM_DATA_INPUT_FN_H
#define DSIM_DATA_INPUT_FN_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/data.h"

struct dsim_input_batches {
    uint64_t *ids;   /* every element's ids, one after the other */
    uint64_t *start; /* element k is ids[start[k] .. start[k+1]) */
    uint64_t n;      /* elements */
    uint64_t n_ids, cap_ids, cap;
    /* for the checks and messages of dsim_input_batches_add */
    uint64_t n_examples;
    int64_t global_batch;
    int pipeline;
    uint32_t epoch;
};

void input_batches_free(dsim_input_batches *b);
/* Pipeline `pipeline`'s elements of `epoch` from cfg->input_fn into b
 * (emptied first). An error of the function's is passed on with a message
 * that names the pipeline and epoch when the function gave none. */
dsim_err input_fn_list(const dsim_input_config *cfg, int pipeline, uint32_t epoch,
                       dsim_input_batches *b);

#endif
