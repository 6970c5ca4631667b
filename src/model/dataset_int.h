/* Internal to src/model: datasets read from files (dataset_load.c,
 * dataset_csv.c) and what dataset.c needs to free them. */
#ifndef DSIM_MODEL_DATASET_INT_H
#define DSIM_MODEL_DATASET_INT_H

#include <stddef.h>

#include "dsim/dataset.h"

/* How a loaded dataset holds its arrays. */
struct dsim_dataset_files {
    void *map[2]; /* read-only mappings of the files (NULL: none) */
    size_t map_len[2];
    float *x_owned, *y_owned; /* converted copies (NULL: x / y point into a mapping) */
    size_t mapped;            /* bytes of x and y used in place */
    char origin[600];
};

/* Frees what ds->files holds (the arrays x and y point into included). */
void dataset_files_release(dsim_dataset *ds);

/* After x, y, spec.kind, in_dim, out_dim, n_examples are set: the spec's
 * other fields, y_dim, the file split; validates the sizes. */
dsim_err dataset_files_finish(dsim_dataset *ds, const dsim_data_source *src);

/* Checks classification labels y[0..n) (floats) against src's classes,
 * and sets ds->spec.out_dim; `name` names the file for messages. */
dsim_err dataset_check_labels(dsim_dataset *ds, const dsim_data_source *src, const char *name);

/* dsim_dataset_load for a CSV source (dataset_csv.c). */
dsim_err dataset_load_csv(const dsim_data_source *src, dsim_dataset *ds);

#endif
