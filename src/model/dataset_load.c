/* Datasets read from files (dsim_dataset_load, dsim/dataset.h): NumPy .npy
 * pairs here, CSV in dataset_csv.c. What both share: the label checks and
 * the record-file split. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset_int.h"
#include "dsim/npy.h"

void dataset_files_release(dsim_dataset *ds)
{
    struct dsim_dataset_files *f = ds->files;
    if (!f)
        return;
    for (int i = 0; i < 2; i++)
        if (f->map[i])
            munmap(f->map[i], f->map_len[i]);
    free(f->x_owned);
    free(f->y_owned);
    free(f);
    ds->files = NULL;
    ds->x = NULL;
    ds->y = NULL;
}

size_t dsim_dataset_mapped_bytes(const dsim_dataset *ds)
{
    return ds && ds->files ? ds->files->mapped : 0;
}

const char *dsim_dataset_origin(const dsim_dataset *ds)
{
    if (!ds)
        return "";
    return ds->files ? ds->files->origin : "synthetic";
}

dsim_err dataset_check_labels(dsim_dataset *ds, const dsim_data_source *src, const char *name)
{
    size_t n = ds->spec.n_examples;
    double top = -1;
    for (size_t e = 0; e < n; e++) {
        float v = ds->y[e];
        if (isnan(v))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: example %zu has label NaN: classification labels are class "
                            "indices",
                            name, e);
        if (!(v == floorf(v)) || !isfinite(v))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: example %zu has label %g, not a whole number: classification "
                            "labels are class indices (or set task: regression)",
                            name, e, (double)v);
        if (v < 0)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: example %zu has label %g: class indices start at 0", name, e,
                            (double)v);
        if (src->classes && v >= (float)src->classes)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: example %zu has label %g, outside the %zu classes given "
                            "(data.classes: labels must be in 0..%zu); raise classes or fix the "
                            "label",
                            name, e, (double)v, src->classes, src->classes - 1);
        if (v >= (float)DSIM_MODEL_MAX_DIM)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: example %zu has label %g, above the %u classes "
                            "a model may have",
                            name, e, (double)v, DSIM_MODEL_MAX_DIM);
        if (v > top)
            top = v;
    }
    size_t classes = src->classes ? src->classes : (size_t)top + 1;
    if (classes < 2)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: every label is %g, so the labels make %zu class: classification "
                        "needs at least 2 (set data.classes, or task: regression)",
                        name, top, classes);
    ds->spec.out_dim = classes;
    return DSIM_OK;
}

dsim_err dataset_files_finish(dsim_dataset *ds, const dsim_data_source *src)
{
    dsim_dataset_spec *s = &ds->spec;
    s->noise = 0;
    s->seed = 0;
    s->teacher_hidden = 0;
    s->n_files = src->n_files;
    ds->y_dim = s->kind == DSIM_DATA_CLASSIFICATION ? 1 : s->out_dim;
    DSIM_CHECK(dsim_dataset_validate(s));
    size_t n = s->n_examples, F = s->n_files;
    ds->file_start = malloc((F + 1) * sizeof *ds->file_start);
    if (!ds->file_start)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dataset: out of memory for %zu files", F);
    size_t q = n / F, r = n % F;
    for (size_t f = 0; f <= F; f++)
        ds->file_start[f] = (uint64_t)f * q + (f < r ? f : r);
    return DSIM_OK;
}

/* ---- .npy ---- */

typedef struct load_npy {
    const char *path;
    dsim_npy_header h;
    const unsigned char *data; /* in the mapping */
} load_npy;

/* Maps `path` read-only into slot i of ds->files and parses its header. */
static dsim_err load_npy_open(dsim_dataset *ds, int i, const char *path, load_npy *a)
{
    a->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int er = errno;
        if (er == ENOENT)
            return DSIM_ERR(DSIM_ENOENT, -1, "%s: no such file", path);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot open: %s", path, strerror(er));
    }
    struct stat st;
    dsim_err e = DSIM_OK;
    if (fstat(fd, &st) != 0)
        e = DSIM_ERR(DSIM_EIO, -1, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        e = DSIM_ERR(DSIM_EINVAL, -1, "%s: not a regular file", path);
    else if (st.st_size == 0)
        e = DSIM_ERR(DSIM_EPROTO, -1, "%s: the file is empty, not a .npy file", path);
    if (e != DSIM_OK) {
        close(fd);
        return e;
    }
    size_t len = (size_t)st.st_size;
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int er = errno;
    close(fd);
    if (m == MAP_FAILED)
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot map: %s", path, strerror(er));
    ds->files->map[i] = m;
    ds->files->map_len[i] = len;
    DSIM_CHECK(dsim_npy_parse_header(path, m, len, (uint64_t)len, &a->h));
    a->data = (const unsigned char *)m + a->h.data_offset;
    return DSIM_OK;
}

static int load_host_le(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Whether the rows x cols array can be used in place as float32. */
static int load_in_place(const load_npy *a, uint64_t cols)
{
    return a->h.type == DSIM_NPY_F32 && a->h.big_endian == !load_host_le() &&
           (!a->h.fortran_order || a->h.ndim < 2 || cols == 1 || a->h.shape[0] == 1) &&
           a->h.data_offset % sizeof(float) == 0;
}

/* Element (r, c) of a rows x cols array in the file's order. */
static double load_at(const load_npy *a, uint64_t r, uint64_t c, uint64_t rows, uint64_t cols)
{
    uint64_t i = a->h.fortran_order ? c * rows + r : r * cols + c;
    return dsim_npy_get(&a->h, a->data, i);
}

/* v as a message shows it ("NaN" whatever its sign bit). */
static const char *load_show(double v, char *buf, size_t cap)
{
    if (isnan(v))
        return "NaN";
    snprintf(buf, cap, "%g", v);
    return buf;
}

/* The array as float32 rows x cols, mapped or converted into *owned. With
 * finite, every value must be a finite float32 (`what` names them). */
static dsim_err load_floats(const load_npy *a, uint64_t rows, uint64_t cols, int finite,
                            const char *what, float **out, float **owned, size_t *mapped)
{
    if (load_in_place(a, cols)) {
        float *p = (float *)(uintptr_t)a->data;
        char sv[32];
        for (uint64_t k = 0; finite && k < rows * cols; k++)
            if (!isfinite(p[k]))
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "%s: example %llu has %s %llu = %s: every value must be finite "
                                "(remove or impute the example)",
                                a->path, (unsigned long long)(k / cols), what,
                                (unsigned long long)(k % cols), load_show(p[k], sv, sizeof sv));
        *out = p;
        *mapped += rows * cols * sizeof(float);
        return DSIM_OK;
    }
    uint64_t total = rows * cols;
    float *q = malloc((size_t)(total ? total : 1) * sizeof(float));
    if (!q)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory converting %llu x %llu values", a->path,
                        (unsigned long long)rows, (unsigned long long)cols);
    *owned = q;
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < cols; c++) {
            double v = load_at(a, r, c, rows, cols);
            float f = (float)v;
            char sv[32];
            if (finite && !isfinite(f))
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "%s: example %llu has %s %llu = %s: %s (remove or impute the "
                                "example)",
                                a->path, (unsigned long long)r, what, (unsigned long long)c,
                                load_show(v, sv, sizeof sv),
                                isfinite(v) ? "beyond float32's range"
                                            : "every value must be finite");
            q[r * cols + c] = f;
        }
    *out = q;
    return DSIM_OK;
}

static dsim_err load_npy_x(dsim_dataset *ds, const dsim_data_source *src, const load_npy *a)
{
    const dsim_npy_header *h = &a->h;
    if (h->ndim != 2)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: features must be a 2-D array (examples x features), not %zu-D; "
                        "reshape it (e.g. x.reshape(len(x), -1))",
                        a->path, h->ndim);
    if (!dsim_npy_type_is_float(h->type))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: features are %s; accepted: float32 or float64 (save "
                        "x.astype(np.float32))",
                        a->path, dsim_npy_type_name(h->type));
    if (h->shape[0] < 1 || h->shape[1] < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: shape (%llu, %llu) holds no data: it needs at least one example "
                        "and one feature",
                        a->path, (unsigned long long)h->shape[0], (unsigned long long)h->shape[1]);
    if (h->shape[1] > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %llu features; at most %u", a->path,
                        (unsigned long long)h->shape[1], DSIM_MODEL_MAX_DIM);
    if (src->features && src->features != h->shape[1])
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: the file has %llu features per example, but data.features says "
                        "%zu; remove features: (it is read from the file) or fix it",
                        a->path, (unsigned long long)h->shape[1], src->features);
    ds->spec.n_examples = (size_t)h->shape[0];
    ds->spec.in_dim = (size_t)h->shape[1];
    return load_floats(a, h->shape[0], h->shape[1], 1, "feature", &ds->x, &ds->files->x_owned,
                       &ds->files->mapped);
}

static dsim_err load_npy_y(dsim_dataset *ds, const dsim_data_source *src, const load_npy *a,
                           const char *xpath)
{
    const dsim_npy_header *h = &a->h;
    size_t n = ds->spec.n_examples;
    if (h->ndim < 1 || h->ndim > 2)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: labels must be 1-D (one per example) or 2-D (examples x regression "
                        "targets), not %zu-D",
                        a->path, h->ndim);
    if (h->shape[0] != n)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %llu labels, but %s has %zu examples: each example needs exactly "
                        "one label row",
                        a->path, (unsigned long long)h->shape[0], xpath, n);
    uint64_t cols = h->ndim == 2 ? h->shape[1] : 1;
    int kind = src->task >= 0                                ? src->task
               : dsim_npy_type_is_float(h->type) || cols > 1 ? DSIM_DATA_REGRESSION
                                                             : DSIM_DATA_CLASSIFICATION;
    ds->spec.kind = (dsim_data_kind)kind;
    if (kind == DSIM_DATA_CLASSIFICATION) {
        if (cols != 1)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: classification labels are one class index per example, but "
                            "the array is %llu x %llu (for several targets use task: "
                            "regression)",
                            a->path, (unsigned long long)n, (unsigned long long)cols);
        DSIM_CHECK(
            load_floats(a, n, 1, 0, "label", &ds->y, &ds->files->y_owned, &ds->files->mapped));
        return dataset_check_labels(ds, src, a->path);
    }
    if (cols < 1 || cols > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %llu regression targets per example; accepted 1..%u",
                        a->path, (unsigned long long)cols, DSIM_MODEL_MAX_DIM);
    if (src->classes && src->classes != cols)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %llu regression target(s) per example, but data.classes (the "
                        "outputs) says %zu; remove it or fix it",
                        a->path, (unsigned long long)cols, src->classes);
    ds->spec.out_dim = (size_t)cols;
    return load_floats(a, n, cols, 1, "target", &ds->y, &ds->files->y_owned, &ds->files->mapped);
}

static void load_describe(char *buf, size_t cap, const load_npy *a, const char *what, int mapped)
{
    size_t used = strlen(buf);
    int n = snprintf(buf + used, cap - used, "%s%s (", used ? ", " : "", a->path);
    for (size_t d = 0; n >= 0 && d < a->h.ndim; d++)
        n += snprintf(buf + used + n, cap - used - (size_t)n, "%s%llu", d ? " x " : "",
                      (unsigned long long)a->h.shape[d]);
    if (n >= 0 && (size_t)n < cap - used)
        snprintf(buf + used + n, cap - used - (size_t)n, " %s %s, %s)",
                 dsim_npy_type_name(a->h.type), what, mapped ? "mapped" : "converted");
}

static dsim_err load_npy_pair(const dsim_data_source *src, dsim_dataset *ds)
{
    load_npy ax = {0}, ay = {0};
    DSIM_CHECK(load_npy_open(ds, 0, src->x, &ax));
    DSIM_CHECK(load_npy_open(ds, 1, src->y, &ay));
    DSIM_CHECK(load_npy_x(ds, src, &ax));
    DSIM_CHECK(load_npy_y(ds, src, &ay, src->x));
    struct dsim_dataset_files *f = ds->files;
    load_describe(f->origin, sizeof f->origin, &ax, "features", !f->x_owned);
    load_describe(f->origin, sizeof f->origin, &ay,
                  ds->spec.kind == DSIM_DATA_CLASSIFICATION ? "labels" : "targets", !f->y_owned);
    return DSIM_OK;
}

dsim_err dsim_dataset_load(const dsim_data_source *src, dsim_dataset **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_load: out is NULL");
    *out = NULL;
    if (!src)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_load: no source");
    int npy = src->x || src->y, csv = src->csv != NULL;
    if (npy == csv || (npy && (!src->x || !src->y)))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset source: give either x and y (.npy files) or csv (with its label "
                        "column)");
    if (csv && src->n_label_columns < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: name the label column (label_column)", src->csv);
    if (src->task >= (int)DSIM_DATA_KIND_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset source: task %d is not a dsim_data_kind",
                        src->task);
    if (src->n_files < 1 || src->n_files > DSIM_DATASET_MAX_FILES)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset source: files %zu must be in 1..%zu",
                        src->n_files, DSIM_DATASET_MAX_FILES);
    dsim_dataset *ds = calloc(1, sizeof *ds);
    if (ds)
        ds->files = calloc(1, sizeof *ds->files);
    if (!ds || !ds->files) {
        free(ds);
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_dataset_load: out of memory");
    }
    dsim_err e = csv ? dataset_load_csv(src, ds) : load_npy_pair(src, ds);
    if (e == DSIM_OK)
        e = dataset_files_finish(ds, src);
    if (e != DSIM_OK) {
        dsim_dataset_free(ds);
        return e;
    }
    *out = ds;
    return DSIM_OK;
}
