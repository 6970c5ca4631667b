/* Synthetic datasets and their record files (see dsim/dataset.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset_int.h"
#include "dsim/dataset.h"
#include "dsim/rng.h"

static const char dataset_magic[8] = {'D', 'S', 'I', 'M', 'R', 'E', 'C', '\0'};
static const char *const dataset_kind_names[DSIM_DATA_KIND_COUNT] = {"regression",
                                                                     "classification"};

const char *dsim_data_kind_name(dsim_data_kind t)
{
    if ((unsigned)t >= DSIM_DATA_KIND_COUNT)
        return "?";
    return dataset_kind_names[t];
}

dsim_err dsim_data_kind_parse(const char *s, dsim_data_kind *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_data_kind_parse: NULL argument");
    for (int t = 0; t < DSIM_DATA_KIND_COUNT; t++) {
        if (strcmp(s, dataset_kind_names[t]) == 0) {
            *out = (dsim_data_kind)t;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1, "unknown dataset kind '%s': use regression or classification",
                    s);
}

dsim_err dsim_dataset_validate(const dsim_dataset_spec *spec)
{
    if (!spec)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset spec is NULL");
    if ((unsigned)spec->kind >= DSIM_DATA_KIND_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset kind %d is not regression or classification",
                        (int)spec->kind);
    int cls = spec->kind == DSIM_DATA_CLASSIFICATION;
    if (spec->n_examples < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset n_examples is 0: ask for at least 1 example");
    if (spec->in_dim < 1 || spec->in_dim > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset in_dim %zu must be in 1..%u", spec->in_dim,
                        DSIM_MODEL_MAX_DIM);
    if (spec->out_dim < (cls ? 2u : 1u) || spec->out_dim > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset out_dim %zu (%s) must be in %u..%u",
                        spec->out_dim, cls ? "classes" : "outputs", cls ? 2u : 1u,
                        DSIM_MODEL_MAX_DIM);
    if (cls && !(spec->noise >= 0.0 && spec->noise <= 1.0))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset noise %g: for classification it is the probability of a "
                        "random label, in [0, 1]",
                        spec->noise);
    if (!cls && !(spec->noise >= 0.0 && isfinite(spec->noise)))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset noise %g: for regression it is the target noise stddev, a "
                        "finite number >= 0",
                        spec->noise);
    if (spec->n_files < 1 || spec->n_files > DSIM_DATASET_MAX_FILES)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset n_files %zu must be in 1..%zu", spec->n_files,
                        DSIM_DATASET_MAX_FILES);
    if (spec->teacher_hidden > DSIM_MODEL_MAX_DIM)
        return DSIM_ERR(DSIM_EINVAL, -1, "dataset teacher_hidden %zu must be at most %u",
                        spec->teacher_hidden, DSIM_MODEL_MAX_DIM);
    size_t y_dim = cls ? 1 : spec->out_dim;
    size_t row = (spec->in_dim + y_dim) * sizeof(float);
    if (spec->n_examples > SIZE_MAX / row / 2)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dataset of %zu examples x %zu floats does not fit in memory",
                        spec->n_examples, spec->in_dim + y_dim);
    return DSIM_OK;
}

static void dataset_teacher_spec(const dsim_dataset_spec *spec, dsim_model_spec *t)
{
    memset(t, 0, sizeof *t);
    int cls = spec->kind == DSIM_DATA_CLASSIFICATION;
    t->loss = cls ? DSIM_LOSS_XENT : DSIM_LOSS_MSE;
    t->in_dim = spec->in_dim;
    t->out_dim = spec->out_dim;
    if (spec->teacher_hidden) {
        t->kind = DSIM_MODEL_MLP;
        t->n_hidden = 1;
        t->hidden[0] = spec->teacher_hidden;
    } else {
        t->kind = cls ? DSIM_MODEL_SOFTMAX : DSIM_MODEL_LINEAR;
    }
}

/* Scale the teacher so that its outputs have a variance of about 1 for N(0,1)
 * inputs: logits spread enough for argmax labels to be learnable, targets
 * on the same scale as the noise a scenario asks for. */
static void dataset_teacher_init(const dsim_model_layout *lay, float *p, dsim_rng *r)
{
    for (size_t l = 0; l < lay->n_layers; l++) {
        const dsim_model_layer *L = &lay->layer[l];
        double gain = l + 1 < lay->n_layers ? 2.0 : 1.0;
        double sd = sqrt(gain / (double)L->in);
        for (size_t k = 0; k < L->in * L->out; k++)
            p[L->w_off + k] = (float)(dsim_rng_normal(r) * sd);
        for (size_t j = 0; j < L->out; j++)
            p[L->b_off + j] = (float)(dsim_rng_normal(r) * 0.1);
    }
}

void dsim_dataset_free(dsim_dataset *ds)
{
    if (!ds)
        return;
    if (ds->files) {
        dataset_files_release(ds); /* mapped or converted arrays */
    } else {
        free(ds->x);
        free(ds->y);
    }
    free(ds->file_start);
    free(ds->teacher_params);
    free(ds);
}

/* Targets for examples [e0, e0 + n) from their inputs. */
static dsim_err dataset_targets(dsim_dataset *ds, size_t e0, size_t n, float *logits, dsim_rng *rn)
{
    const dsim_dataset_spec *s = &ds->spec;
    const float *x = ds->x + e0 * s->in_dim;
    if (s->kind == DSIM_DATA_REGRESSION) {
        float *y = ds->y + e0 * s->out_dim;
        DSIM_CHECK(dsim_model_predict(&ds->teacher, ds->teacher_params, x, n, y));
        for (size_t k = 0; k < n * s->out_dim; k++)
            y[k] = (float)((double)y[k] + s->noise * dsim_rng_normal(rn));
        return DSIM_OK;
    }
    DSIM_CHECK(dsim_model_predict(&ds->teacher, ds->teacher_params, x, n, logits));
    for (size_t e = 0; e < n; e++) {
        const float *z = logits + e * s->out_dim;
        size_t best = 0;
        for (size_t j = 1; j < s->out_dim; j++)
            if (z[j] > z[best])
                best = j;
        double u = dsim_rng_uniform(rn);
        size_t other = (size_t)dsim_rng_below(rn, s->out_dim);
        ds->y[e0 + e] = (float)(u < s->noise ? other : best);
    }
    return DSIM_OK;
}

#define DATASET_CHUNK 1024

dsim_err dsim_dataset_make(const dsim_dataset_spec *spec, dsim_dataset **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_make: out is NULL");
    *out = NULL;
    DSIM_CHECK(dsim_dataset_validate(spec));
    dsim_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_dataset_make: out of memory");
    ds->spec = *spec;
    size_t n = spec->n_examples, F = spec->n_files;
    int cls = spec->kind == DSIM_DATA_CLASSIFICATION;
    ds->y_dim = cls ? 1 : spec->out_dim;
    dataset_teacher_spec(spec, &ds->teacher);
    dsim_model_layout lay;
    dsim_err e = dsim_model_layout_of(&ds->teacher, &lay);
    if (e != DSIM_OK) {
        dsim_dataset_free(ds);
        return e;
    }
    float *logits = NULL;
    ds->x = malloc(n * spec->in_dim * sizeof(float));
    ds->y = malloc(n * ds->y_dim * sizeof(float));
    ds->file_start = malloc((F + 1) * sizeof(uint64_t));
    ds->teacher_params = malloc(lay.n_params * sizeof(float));
    if (cls)
        logits = malloc(DATASET_CHUNK * spec->out_dim * sizeof(float));
    if (!ds->x || !ds->y || !ds->file_start || !ds->teacher_params || (cls && !logits)) {
        size_t yd = ds->y_dim;
        free(logits);
        dsim_dataset_free(ds);
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "dsim_dataset_make: cannot allocate %zu examples of %zu + %zu floats", n,
                        spec->in_dim, yd);
    }

    dsim_rng rt, rx, rn;
    dsim_rng_init(&rt, spec->seed, "data.teacher", 0);
    dsim_rng_init(&rx, spec->seed, "data.x", 0);
    dsim_rng_init(&rn, spec->seed, "data.noise", 0);
    dataset_teacher_init(&lay, ds->teacher_params, &rt);
    for (size_t k = 0; k < n * spec->in_dim; k++)
        ds->x[k] = (float)dsim_rng_normal(&rx);
    for (size_t e0 = 0; e0 < n; e0 += DATASET_CHUNK) {
        size_t m = n - e0 < DATASET_CHUNK ? n - e0 : DATASET_CHUNK;
        e = dataset_targets(ds, e0, m, logits, &rn);
        if (e != DSIM_OK) {
            free(logits);
            dsim_dataset_free(ds);
            return e;
        }
    }
    free(logits);

    size_t q = n / F, r = n % F;
    for (size_t f = 0; f <= F; f++)
        ds->file_start[f] = (uint64_t)f * q + (f < r ? f : r);
    *out = ds;
    return DSIM_OK;
}

void dsim_dataset_model_spec(const dsim_dataset *ds, dsim_model_spec *out)
{
    if (!ds || !out)
        return;
    memset(out, 0, sizeof *out);
    int cls = ds->spec.kind == DSIM_DATA_CLASSIFICATION;
    out->kind = cls ? DSIM_MODEL_SOFTMAX : DSIM_MODEL_LINEAR;
    out->loss = cls ? DSIM_LOSS_XENT : DSIM_LOSS_MSE;
    out->in_dim = ds->spec.in_dim;
    out->out_dim = ds->spec.out_dim;
}

dsim_err dsim_dataset_check_model(const dsim_dataset *ds, const dsim_model_spec *spec)
{
    if (!ds)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_check_model: dataset is NULL");
    DSIM_CHECK(dsim_model_validate(spec));
    const dsim_dataset_spec *s = &ds->spec;
    if (spec->in_dim != s->in_dim)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "model in_dim %zu does not match the dataset's %zu features per example",
                        spec->in_dim, s->in_dim);
    int cls = s->kind == DSIM_DATA_CLASSIFICATION;
    dsim_loss want = cls ? DSIM_LOSS_XENT : DSIM_LOSS_MSE;
    if (dsim_model_loss(spec) != want)
        return DSIM_ERR(DSIM_EINVAL, -1, "model loss %s does not fit a %s dataset: use loss %s",
                        dsim_loss_name(dsim_model_loss(spec)), dataset_kind_names[s->kind],
                        dsim_loss_name(want));
    if (spec->out_dim != s->out_dim)
        return DSIM_ERR(DSIM_EINVAL, -1, "model out_dim %zu does not match the dataset's %zu %s",
                        spec->out_dim, s->out_dim, cls ? "classes" : "outputs");
    return DSIM_OK;
}

dsim_err dsim_dataset_file_range(const dsim_dataset *ds, size_t f, uint64_t *first, uint64_t *count)
{
    if (!ds || !first || !count)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_file_range: NULL argument");
    if (f >= ds->spec.n_files)
        return DSIM_ERR(DSIM_EINVAL, -1, "file %zu does not exist: the dataset has %zu files", f,
                        ds->spec.n_files);
    *first = ds->file_start[f];
    *count = ds->file_start[f + 1] - ds->file_start[f];
    return DSIM_OK;
}

dsim_err dsim_dataset_file_of(const dsim_dataset *ds, uint64_t id, size_t *f)
{
    if (!ds || !f)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_file_of: NULL argument");
    size_t n = ds->spec.n_examples, F = ds->spec.n_files;
    if (id >= n)
        return DSIM_ERR(DSIM_EINVAL, -1, "example id %llu is out of range: the dataset has %zu",
                        (unsigned long long)id, n);
    size_t q = n / F, r = n % F;
    /* The first r files hold q + 1 ids each, the rest q (q > 0 there, since
     * otherwise every id lies in the first r files). */
    uint64_t big = (uint64_t)r * (q + 1);
    *f = id < big ? (size_t)(id / (q + 1)) : (size_t)(r + (id - big) / q);
    return DSIM_OK;
}

dsim_err dsim_dataset_gather(const dsim_dataset *ds, const uint64_t *ids, size_t n, float *x_out,
                             float *y_out)
{
    if (!ds || (n > 0 && (!ids || !x_out || !y_out)))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_gather: NULL argument");
    size_t in = ds->spec.in_dim, yd = ds->y_dim;
    for (size_t k = 0; k < n; k++) {
        if (ids[k] >= ds->spec.n_examples)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "dsim_dataset_gather: ids[%zu] = %llu is out of range: the dataset "
                            "has %zu examples",
                            k, (unsigned long long)ids[k], ds->spec.n_examples);
    }
    for (size_t k = 0; k < n; k++) {
        memcpy(x_out + k * in, ds->x + ids[k] * in, in * sizeof(float));
        memcpy(y_out + k * yd, ds->y + ids[k] * yd, yd * sizeof(float));
    }
    return DSIM_OK;
}

dsim_err dsim_dataset_file_path(const char *dir, size_t f, size_t n_files, char *buf, size_t cap)
{
    if (!dir || !buf)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_file_path: NULL argument");
    int len = snprintf(buf, cap, "%s/part-%05zu-of-%05zu.rec", dir, f, n_files);
    if (len < 0 || (size_t)len >= cap)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "record file path under '%s' is longer than %zu bytes: use a shorter "
                        "directory",
                        dir, cap);
    return DSIM_OK;
}

/* Little-endian encoding, whatever the host. */
static void dataset_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void dataset_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t dataset_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t dataset_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void dataset_put_f32(unsigned char *p, float f)
{
    uint32_t v;
    memcpy(&v, &f, sizeof v);
    dataset_put_u32(p, v);
}

static float dataset_get_f32(const unsigned char *p)
{
    uint32_t v = dataset_get_u32(p);
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
}

#define DATASET_FNV_OFFSET 0xcbf29ce484222325ull
#define DATASET_FNV_PRIME  0x100000001b3ull

static uint64_t dataset_fnv(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= DATASET_FNV_PRIME;
    }
    return h;
}

static dsim_err dataset_write_one(const dsim_dataset *ds, const char *dir, size_t f)
{
    const dsim_dataset_spec *s = &ds->spec;
    char path[4096], tmp[4096 + 8];
    DSIM_CHECK(dsim_dataset_file_path(dir, f, s->n_files, path, sizeof path));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    size_t first = (size_t)ds->file_start[f];
    size_t count = (size_t)(ds->file_start[f + 1] - first);
    size_t in = s->in_dim, yd = ds->y_dim;
    size_t rec = 8 + 4 * (in + yd);
    unsigned char hdr[DSIM_RECORD_HEADER];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, dataset_magic, 8);
    dataset_put_u32(hdr + 8, DSIM_RECORD_VERSION);
    dataset_put_u32(hdr + 12, (uint32_t)s->kind);
    dataset_put_u32(hdr + 16, (uint32_t)in);
    dataset_put_u32(hdr + 20, (uint32_t)s->out_dim);
    dataset_put_u32(hdr + 24, (uint32_t)yd);
    dataset_put_u32(hdr + 28, (uint32_t)f);
    dataset_put_u32(hdr + 32, (uint32_t)s->n_files);
    dataset_put_u32(hdr + 36, 0);
    dataset_put_u64(hdr + 40, s->n_examples);
    dataset_put_u64(hdr + 48, count);
    dataset_put_u64(hdr + 56, s->seed);
    dataset_put_u64(hdr + 64, dataset_fnv(DATASET_FNV_OFFSET, hdr, 64));

    unsigned char *buf = malloc(rec);
    if (!buf)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        int er = errno;
        free(buf);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot create: %s", tmp, strerror(er));
    }
    int ok = fwrite(hdr, 1, sizeof hdr, fp) == sizeof hdr;
    uint64_t h = DATASET_FNV_OFFSET;
    for (size_t k = 0; ok && k < count; k++) {
        size_t id = first + k;
        dataset_put_u64(buf, id);
        for (size_t i = 0; i < in; i++)
            dataset_put_f32(buf + 8 + 4 * i, ds->x[id * in + i]);
        for (size_t j = 0; j < yd; j++)
            dataset_put_f32(buf + 8 + 4 * (in + j), ds->y[id * yd + j]);
        h = dataset_fnv(h, buf, rec);
        ok = fwrite(buf, 1, rec, fp) == rec;
    }
    unsigned char tr[8];
    dataset_put_u64(tr, h);
    ok = ok && fwrite(tr, 1, sizeof tr, fp) == sizeof tr;
    int er = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        er = errno;
    }
    free(buf);
    if (!ok) {
        unlink(tmp);
        return DSIM_ERR(DSIM_EIO, -1, "%s: write failed: %s", tmp, strerror(er));
    }
    if (rename(tmp, path) != 0) {
        er = errno;
        unlink(tmp);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot rename into place: %s", path, strerror(er));
    }
    return DSIM_OK;
}

dsim_err dsim_dataset_write_files(const dsim_dataset *ds, const char *dir)
{
    if (!ds || !dir || !*dir)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_write_files: dataset and dir are required");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot create the directory: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: exists and is not a directory", dir);
    for (size_t f = 0; f < ds->spec.n_files; f++)
        DSIM_CHECK(dataset_write_one(ds, dir, f));
    return DSIM_OK;
}

void dsim_record_file_free(dsim_record_file *rf)
{
    if (!rf)
        return;
    free(rf->ids);
    free(rf->x);
    free(rf->y);
    free(rf);
}

/* Checks a header; fills rf's sizes. */
static dsim_err dataset_parse_header(const char *path, const unsigned char *hdr,
                                     dsim_record_file *rf)
{
    if (dataset_get_u64(hdr + 64) != dataset_fnv(DATASET_FNV_OFFSET, hdr, 64))
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: header checksum mismatch: the header is corrupt",
                        path);
    uint32_t version = dataset_get_u32(hdr + 8);
    if (version != DSIM_RECORD_VERSION)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: record file version %u, this build reads version %u: rewrite the "
                        "files with this build",
                        path, version, DSIM_RECORD_VERSION);
    uint32_t task = dataset_get_u32(hdr + 12);
    uint32_t in = dataset_get_u32(hdr + 16), out = dataset_get_u32(hdr + 20);
    uint32_t yd = dataset_get_u32(hdr + 24);
    uint32_t fi = dataset_get_u32(hdr + 28), nf = dataset_get_u32(hdr + 32);
    if (task >= DSIM_DATA_KIND_COUNT)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: bad kind %u in the header", path, task);
    int cls = task == DSIM_DATA_CLASSIFICATION;
    if (in < 1 || in > DSIM_MODEL_MAX_DIM || out < (cls ? 2u : 1u) || out > DSIM_MODEL_MAX_DIM ||
        yd != (cls ? 1u : out))
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: bad sizes in the header (in_dim %u, out_dim %u, y_dim %u for %s)",
                        path, in, out, yd, dataset_kind_names[task]);
    if (nf < 1 || fi >= nf || dataset_get_u32(hdr + 36) != 0)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: bad file index %u of %u in the header", path, fi, nf);
    rf->kind = (dsim_data_kind)task;
    rf->in_dim = in;
    rf->out_dim = out;
    rf->y_dim = yd;
    rf->file_index = fi;
    rf->n_files = nf;
    rf->n_total = dataset_get_u64(hdr + 40);
    rf->seed = dataset_get_u64(hdr + 56);
    uint64_t count = dataset_get_u64(hdr + 48);
    if (count > rf->n_total)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: header says %llu records, more than the dataset's %llu examples", path,
                        (unsigned long long)count, (unsigned long long)rf->n_total);
    rf->count = (size_t)count;
    return DSIM_OK;
}

/* Decodes and checks the records; the payload checksum has been verified. */
static dsim_err dataset_parse_records(const char *path, const unsigned char *p,
                                      dsim_record_file *rf)
{
    size_t in = rf->in_dim, yd = rf->y_dim, rec = 8 + 4 * (in + yd);
    for (size_t k = 0; k < rf->count; k++, p += rec) {
        uint64_t id = dataset_get_u64(p);
        if (id >= rf->n_total)
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s: record %zu has id %llu, outside the dataset's %llu examples", path,
                            k, (unsigned long long)id, (unsigned long long)rf->n_total);
        if (k > 0 && id <= rf->ids[k - 1])
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s: record %zu has id %llu after id %llu: ids must increase", path, k,
                            (unsigned long long)id, (unsigned long long)rf->ids[k - 1]);
        rf->ids[k] = id;
        for (size_t i = 0; i < in; i++)
            rf->x[k * in + i] = dataset_get_f32(p + 8 + 4 * i);
        for (size_t j = 0; j < yd; j++)
            rf->y[k * yd + j] = dataset_get_f32(p + 8 + 4 * (in + j));
        if (rf->kind == DSIM_DATA_CLASSIFICATION) {
            float c = rf->y[k];
            if (!(c >= 0.0f && c < (float)rf->out_dim && c == floorf(c)))
                return DSIM_ERR(DSIM_EPROTO, -1,
                                "%s: record %zu (id %llu) has label %g, not a class in [0, %zu)",
                                path, k, (unsigned long long)id, (double)c, rf->out_dim);
        }
    }
    return DSIM_OK;
}

static dsim_err dataset_read(const char *path, FILE *fp, dsim_record_file *rf)
{
    struct stat st;
    if (fstat(fileno(fp), &st) != 0)
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: not a regular file", path);
    uint64_t size = (uint64_t)st.st_size;
    unsigned char hdr[DSIM_RECORD_HEADER];
    size_t want = size < sizeof hdr ? (size_t)size : sizeof hdr;
    if (fread(hdr, 1, want, fp) != want)
        return DSIM_ERR(DSIM_EIO, -1, "%s: read error in the header", path);
    if (want < sizeof dataset_magic || memcmp(hdr, dataset_magic, sizeof dataset_magic) != 0) {
        if (want < sizeof dataset_magic && memcmp(hdr, dataset_magic, want) == 0)
            return DSIM_ERR(DSIM_EPROTO, -1, "%s: truncated: %llu bytes, the header needs %u", path,
                            (unsigned long long)size, DSIM_RECORD_HEADER);
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: not a dsim record file (bad magic; expected \"DSIMREC\")", path);
    }
    if (want < sizeof hdr)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: truncated: %llu bytes, the header needs %u", path,
                        (unsigned long long)size, DSIM_RECORD_HEADER);
    DSIM_CHECK(dataset_parse_header(path, hdr, rf));

    uint64_t rec = 8 + 4 * ((uint64_t)rf->in_dim + rf->y_dim);
    /* count <= n_total was checked, but n_total is a u64: guard the product. */
    if (rf->count > (UINT64_MAX - DSIM_RECORD_HEADER - 8) / rec)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: header record count %zu is impossible", path,
                        rf->count);
    uint64_t payload = rf->count * rec, expect = DSIM_RECORD_HEADER + payload + 8;
    if (size < expect)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: truncated: the header announces %zu records (%llu bytes) but the "
                        "file has %llu bytes",
                        path, rf->count, (unsigned long long)expect, (unsigned long long)size);
    if (size > expect)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: %llu unexpected bytes after the last of %zu records",
                        path, (unsigned long long)(size - expect), rf->count);

    unsigned char *buf = malloc((size_t)payload + 8);
    size_t cnt = rf->count ? rf->count : 1;
    rf->ids = malloc(cnt * sizeof(uint64_t));
    rf->x = malloc(cnt * rf->in_dim * sizeof(float));
    rf->y = malloc(cnt * rf->y_dim * sizeof(float));
    if (!buf || !rf->ids || !rf->x || !rf->y) {
        free(buf);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: cannot allocate %zu records", path, rf->count);
    }
    if (fread(buf, 1, (size_t)payload + 8, fp) != (size_t)payload + 8) {
        free(buf);
        return DSIM_ERR(DSIM_EIO, -1, "%s: read error (the file shrank while being read?)", path);
    }
    if (dataset_fnv(DATASET_FNV_OFFSET, buf, (size_t)payload) != dataset_get_u64(buf + payload)) {
        free(buf);
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: record checksum mismatch: the records are corrupt",
                        path);
    }
    dsim_err e = dataset_parse_records(path, buf, rf);
    free(buf);
    return e;
}

dsim_err dsim_dataset_read_file(const char *path, dsim_record_file **out)
{
    if (!path || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dataset_read_file: NULL argument");
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int er = errno;
        if (er == ENOENT)
            return DSIM_ERR(DSIM_ENOENT, -1,
                            "%s: no such record file (write it with dsim_dataset_write_files)",
                            path);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot open: %s", path, strerror(er));
    }
    dsim_record_file *rf = calloc(1, sizeof *rf);
    if (!rf) {
        fclose(fp);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    }
    dsim_err e = dataset_read(path, fp, rf);
    fclose(fp);
    if (e != DSIM_OK) {
        dsim_record_file_free(rf);
        return e;
    }
    *out = rf;
    return DSIM_OK;
}
