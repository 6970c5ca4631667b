/* Synthetic datasets drawn from a seed, split into record files.
 *
 * A dataset is n examples (x, y) in the layout the models read (dsim/model.h:
 * example-major floats; a classification target is the class index stored
 * as one float). Example e has the global id e; the input pipeline and the
 * shard-coverage ledger count examples by this id.
 *
 * Generation, from three streams of (seed, purpose, worker 0):
 *   - "data.teacher": a random teacher model, linear (regression) or softmax
 *     (classification), or with teacher_hidden > 0 an MLP with one ReLU
 *     hidden layer of that width. Weights are
 *     N(0, gain/fan_in) (gain 2 below a ReLU, else 1), biases N(0, 0.1^2);
 *   - "data.x": inputs, every feature N(0, 1), example by example;
 *   - "data.noise": regression: y = teacher(x) + noise * N(0, 1) per
 *     output; classification: y = argmax of the teacher's logits, replaced
 *     with probability noise by a class drawn uniformly (possibly the same).
 * Each example takes the same number of draws from each stream, so the
 * first k examples are the same whatever n_examples is.
 *
 * Files: the examples are split into n_files record files of contiguous id
 * ranges, as even as possible: with q = n / F and r = n % F, file f holds
 * ids [f*q + min(f, r), (f+1)*q + min(f+1, r)) (the first r files get one
 * more). Reading the files in order yields the ids in order. A file may be
 * empty when n_files > n_examples.
 *
 * On disk (dsim_dataset_write_files) file f is DIR/part-FFFFF-of-NNNNN.rec,
 * little-endian:
 *   header, 72 bytes:
 *     0  magic "DSIMREC\0"         8  u32 version (1)
 *     12 u32 kind (0 regression, 1 classification)
 *     16 u32 in_dim   20 u32 out_dim (outputs or classes)   24 u32 y_dim
 *     28 u32 file_index   32 u32 n_files   36 u32 reserved (0)
 *     40 u64 n_total (examples in the whole dataset)
 *     48 u64 count (records in this file)   56 u64 seed
 *     64 u64 FNV-1a 64 of bytes 0..63
 *   count records: u64 id, f32 x[in_dim], f32 y[y_dim]
 *   trailer: u64 FNV-1a 64 of all record bytes.
 * FNV-1a detects every change of a single byte for certain. */
#ifndef DSIM_DATASET_H
#define DSIM_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"
#include "dsim/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_data_kind {
    DSIM_DATA_REGRESSION = 0, /* MSE targets: out_dim floats per example */
    DSIM_DATA_CLASSIFICATION, /* one class index per example, as float */
    DSIM_DATA_KIND_COUNT
} dsim_data_kind;

#define DSIM_DATASET_MAX_FILES ((size_t)1 << 20)
#define DSIM_RECORD_VERSION    1u
#define DSIM_RECORD_HEADER     72u

typedef struct dsim_dataset_spec {
    dsim_data_kind kind;
    size_t n_examples; /* >= 1 */
    size_t in_dim;     /* features per example, >= 1 */
    size_t out_dim;    /* regression outputs (>= 1) or classes (>= 2) */
    double noise;      /* regression: target noise stddev >= 0;
                          classification: label-noise probability in [0, 1] */
    uint64_t seed;
    size_t n_files;        /* 1..DSIM_DATASET_MAX_FILES */
    size_t teacher_hidden; /* 0: linear/softmax teacher; else an MLP hidden width */
} dsim_dataset_spec;

typedef struct dsim_dataset {
    dsim_dataset_spec spec;
    size_t y_dim; /* floats per target: out_dim or 1 */
    float *x;     /* n_examples x in_dim */
    float *y;     /* n_examples x y_dim */
    /* n_files + 1 offsets: file f holds ids [file_start[f], file_start[f+1]).
     * The same offsets as dsim_dataset_desc_init(..., DSIM_FILES_CONTIGUOUS) of
     * dsim/data.h, so an input pipeline over these files can use them. */
    uint64_t *file_start;
    dsim_model_spec teacher;
    float *teacher_params; /* the model that made the targets (before noise) */
    /* A dataset read from files (dsim_dataset_load): how its arrays are
     * held (mapped or converted); NULL for a synthetic one (teacher and
     * teacher_params are then zero and NULL instead). */
    struct dsim_dataset_files *files;
} dsim_dataset;

/* A record file read back from disk. */
typedef struct dsim_record_file {
    dsim_data_kind kind;
    size_t in_dim, out_dim, y_dim;
    size_t file_index, n_files;
    uint64_t n_total, seed;
    size_t count;
    uint64_t *ids; /* count ids, strictly increasing, each < n_total */
    float *x;      /* count x in_dim */
    float *y;      /* count x y_dim */
} dsim_record_file;

/* A dataset read from files instead of drawn (dsim_dataset_load): NumPy
 * .npy arrays (dsim/npy.h) or a CSV file.
 *
 * .npy: x is 2-D, examples x features, float32 or float64; y has one entry
 * per example: 1-D (class indices, or one regression target), or 2-D
 * (examples x outputs, regression). The task is the one asked for, else
 * classification for integer labels and regression for float ones.
 * Classification labels are whole numbers in [0, classes): classes is the
 * one asked for (every label must be below it), else the largest label +
 * 1 (at least 2). float32 little-endian C-order arrays are mapped read-only
 * (mmap) and used in place, however many replicas read them; float64,
 * big-endian, Fortran-order or integer arrays are converted once into
 * float32 (float64 rounded to nearest; a value beyond float32's range is
 * refused), as are classification labels that are not float32 already.
 * Every feature and regression target must be finite (a NaN or Inf is
 * refused naming the example and the feature).
 *
 * CSV: a header row of column names, then one row per example of numbers
 * (surrounding spaces and double quotes are stripped, blank lines and a
 * '\r' before the newline are ignored). label_columns name the label
 * column(s); every other column is a feature, in file order. The task is
 * the one asked for, else classification when there is one label column
 * and every label is a whole number >= 0, else regression. A cell that is
 * empty or not a number is refused with its line and column.
 *
 * Examples keep the files' order: example e is row e. The record files
 * (n_files) split them as dsim_dataset_make does. Every error names the
 * file and what is wrong (DSIM_ENOENT: missing; DSIM_EIO: unreadable;
 * DSIM_EPROTO: malformed; DSIM_EINVAL: it does not fit the source's
 * task, classes or features). */
typedef struct dsim_data_source {
    const char *x;   /* .npy features, with y */
    const char *y;   /* .npy labels */
    const char *csv; /* or a CSV file, with label_columns */
    const char *const *label_columns;
    size_t n_label_columns;
    int task;        /* a dsim_data_kind, or -1: from the labels */
    size_t classes;  /* classification: classes (0: from the labels); regression: outputs
                        (0: from the labels) */
    size_t features; /* 0: from the file; else the file must have this many */
    size_t n_files;  /* record files, 1..DSIM_DATASET_MAX_FILES */
} dsim_data_source;

DSIM_API dsim_err dsim_dataset_load(const dsim_data_source *src, dsim_dataset **out);
/* Bytes of the dataset's arrays used in place from read-only mappings of
 * its files (0 for a synthetic dataset, or when everything was converted). */
DSIM_API size_t dsim_dataset_mapped_bytes(const dsim_dataset *ds);
/* One line saying where the data came from: "x.npy (1000 x 8 float32,
 * mapped), y.npy (1000 int64 labels, 10 classes, converted)"; "synthetic"
 * for a drawn one. */
DSIM_API const char *dsim_dataset_origin(const dsim_dataset *ds);

/* "regression", "classification". */
DSIM_API const char *dsim_data_kind_name(dsim_data_kind t);
DSIM_API dsim_err dsim_data_kind_parse(const char *s, dsim_data_kind *out);

DSIM_API dsim_err dsim_dataset_validate(const dsim_dataset_spec *spec);
DSIM_API dsim_err dsim_dataset_make(const dsim_dataset_spec *spec, dsim_dataset **out);
DSIM_API void dsim_dataset_free(dsim_dataset *ds);

/* A model spec fitting the dataset's kind and sizes (linear for regression,
 * softmax for classification); change kind/hidden to train an MLP. */
DSIM_API void dsim_dataset_model_spec(const dsim_dataset *ds, dsim_model_spec *out);
/* DSIM_OK if a model with spec can train on ds, else DSIM_EINVAL saying
 * which size or loss does not match. */
DSIM_API dsim_err dsim_dataset_check_model(const dsim_dataset *ds, const dsim_model_spec *spec);

/* The id range of file f: ids [*first, *first + *count). */
DSIM_API dsim_err dsim_dataset_file_range(const dsim_dataset *ds, size_t f, uint64_t *first,
                                          uint64_t *count);
/* The file that holds id. */
DSIM_API dsim_err dsim_dataset_file_of(const dsim_dataset *ds, uint64_t id, size_t *f);
/* Copies the examples with the given ids, in that order, into x_out
 * (n x in_dim) and y_out (n x y_dim). */
DSIM_API dsim_err dsim_dataset_gather(const dsim_dataset *ds, const uint64_t *ids, size_t n,
                                      float *x_out, float *y_out);

/* DIR/part-FFFFF-of-NNNNN.rec into buf; DSIM_EINVAL if it does not fit. */
DSIM_API dsim_err dsim_dataset_file_path(const char *dir, size_t f, size_t n_files, char *buf,
                                         size_t cap);
/* Writes every file of ds under dir (created if missing, one level). Each
 * file is written to a temporary name and renamed, so a reader never sees
 * half a file. */
DSIM_API dsim_err dsim_dataset_write_files(const dsim_dataset *ds, const char *dir);
/* Reads and validates one record file: DSIM_ENOENT if missing, DSIM_EIO on
 * a read error, DSIM_EPROTO if it is truncated or corrupt (bad magic,
 * version, sizes, checksum, ids or labels); the message names the file and
 * the problem. */
DSIM_API dsim_err dsim_dataset_read_file(const char *path, dsim_record_file **out);
DSIM_API void dsim_record_file_free(dsim_record_file *rf);

#ifdef __cplusplus
}
#endif
#endif
