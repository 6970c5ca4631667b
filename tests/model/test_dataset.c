/* Synthetic datasets: determinism, teacher and noise, the file split, and
 * record files on disk (round trip, truncation, corruption). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/err.h"
#include "dsim/model.h"

static dsim_dataset_spec spec_of(dsim_data_kind task, size_t n, size_t in, size_t out, double noise,
                                 uint64_t seed, size_t files)
{
    dsim_dataset_spec s;
    memset(&s, 0, sizeof s);
    s.kind = task;
    s.n_examples = n;
    s.in_dim = in;
    s.out_dim = out;
    s.noise = noise;
    s.seed = seed;
    s.n_files = files;
    return s;
}

static dsim_dataset *make(const dsim_dataset_spec *s)
{
    dsim_dataset *ds = NULL;
    if (dsim_dataset_make(s, &ds) != DSIM_OK)
        fail_msg("dsim_dataset_make: %s", dsim_errmsg());
    return ds;
}

static void test_same_seed_same_bytes(void **state)
{
    (void)state;
    for (int task = 0; task < DSIM_DATA_KIND_COUNT; task++) {
        dsim_dataset_spec s = spec_of((dsim_data_kind)task, 300, 7, 3, 0.2, 99, 4);
        s.teacher_hidden = task ? 5 : 0;
        dsim_dataset *a = make(&s), *b = make(&s);
        assert_int_equal(a->y_dim, task ? 1 : 3);
        assert_memory_equal(a->x, b->x, 300 * 7 * sizeof(float));
        assert_memory_equal(a->y, b->y, 300 * a->y_dim * sizeof(float));
        size_t P = dsim_model_num_params(&a->teacher);
        assert_true(P > 0);
        assert_memory_equal(a->teacher_params, b->teacher_params, P * sizeof(float));

        s.seed = 100;
        dsim_dataset *c = make(&s);
        assert_memory_not_equal(a->x, c->x, 300 * 7 * sizeof(float));
        assert_memory_not_equal(a->y, c->y, 300 * a->y_dim * sizeof(float));
        assert_memory_not_equal(a->teacher_params, c->teacher_params, P * sizeof(float));

        /* A shorter dataset from the same seed is a prefix of the longer. */
        s.seed = 99;
        s.n_examples = 41;
        dsim_dataset *d = make(&s);
        assert_memory_equal(a->x, d->x, 41 * 7 * sizeof(float));
        assert_memory_equal(a->y, d->y, 41 * a->y_dim * sizeof(float));
        dsim_dataset_free(a);
        dsim_dataset_free(b);
        dsim_dataset_free(c);
        dsim_dataset_free(d);
    }
}

static void test_inputs_are_standard_normal(void **state)
{
    (void)state;
    dsim_dataset_spec s = spec_of(DSIM_DATA_REGRESSION, 2000, 5, 1, 0.0, 3, 1);
    dsim_dataset *ds = make(&s);
    double sum = 0, sum2 = 0;
    size_t m = 2000 * 5;
    for (size_t k = 0; k < m; k++) {
        sum += ds->x[k];
        sum2 += (double)ds->x[k] * ds->x[k];
    }
    /* 10000 draws: the mean's standard error is 0.01, the variance's 0.014. */
    assert_true(fabs(sum / m) < 0.05);
    assert_true(fabs(sum2 / m - 1.0) < 0.07);
    dsim_dataset_free(ds);
}

static void test_regression_targets(void **state)
{
    (void)state;
    /* Without noise the targets are the teacher's predictions, bit for bit. */
    dsim_dataset_spec s = spec_of(DSIM_DATA_REGRESSION, 2000, 6, 2, 0.0, 5, 3);
    dsim_dataset *ds = make(&s);
    float *pred = malloc(2000 * 2 * sizeof(float));
    assert_non_null(pred);
    assert_int_equal(dsim_model_predict(&ds->teacher, ds->teacher_params, ds->x, 2000, pred),
                     DSIM_OK);
    assert_memory_equal(pred, ds->y, 2000 * 2 * sizeof(float));
    /* The teacher's outputs are on the scale of the inputs (variance ~1). */
    double var = 0;
    for (size_t k = 0; k < 4000; k++)
        var += (double)pred[k] * pred[k];
    var /= 4000;
    assert_true(var > 0.3 && var < 3.0);
    dsim_dataset_free(ds);

    /* With noise 0.5 the residual's stddev is 0.5: 4000 draws estimate it
     * to about 1.1 %, so 10 % is a 9-sigma bound. The teacher is the same
     * (same seed), so pred still applies. */
    s.noise = 0.5;
    ds = make(&s);
    double r2 = 0, rs = 0;
    for (size_t k = 0; k < 4000; k++) {
        double r = (double)ds->y[k] - pred[k];
        rs += r;
        r2 += r * r;
    }
    double sd = sqrt(r2 / 4000);
    assert_true(fabs(sd - 0.5) < 0.05);
    assert_true(fabs(rs / 4000) < 0.05);
    free(pred);
    dsim_dataset_free(ds);
}

static void test_classification_labels(void **state)
{
    (void)state;
    const size_t n = 4000, C = 4;
    dsim_dataset_spec s = spec_of(DSIM_DATA_CLASSIFICATION, n, 8, C, 0.0, 6, 2);
    s.teacher_hidden = 0;
    dsim_dataset *ds = make(&s);
    dsim_model_spec ms;
    dsim_dataset_model_spec(ds, &ms);
    assert_int_equal(ms.kind, DSIM_MODEL_SOFTMAX);
    assert_int_equal(dsim_dataset_check_model(ds, &ms), DSIM_OK);
    float *logits = malloc(n * C * sizeof(float));
    assert_non_null(logits);
    assert_int_equal(dsim_model_predict(&ds->teacher, ds->teacher_params, ds->x, n, logits),
                     DSIM_OK);
    size_t count[4] = {0};
    size_t *teacher = malloc(n * sizeof(size_t));
    assert_non_null(teacher);
    for (size_t e = 0; e < n; e++) {
        float y = ds->y[e];
        assert_true(y >= 0 && y < (float)C && y == floorf(y));
        size_t best = 0;
        for (size_t j = 1; j < C; j++)
            if (logits[e * C + j] > logits[e * C + best])
                best = j;
        teacher[e] = best;
        assert_int_equal((size_t)y, best);
        count[best]++;
    }
    /* Every class is used; none takes nearly everything. */
    for (size_t j = 0; j < C; j++)
        assert_true(count[j] > n / 20 && count[j] < n * 3 / 4);
    dsim_dataset_free(ds);

    /* Label noise 0.3: a label is redrawn with probability 0.3 and then
     * differs from the teacher's with probability 3/4: expect 22.5 % changed,
     * standard error 0.66 %. */
    s.noise = 0.3;
    ds = make(&s);
    size_t changed = 0;
    for (size_t e = 0; e < n; e++)
        changed += (size_t)ds->y[e] != teacher[e];
    double frac = (double)changed / (double)n;
    assert_true(fabs(frac - 0.225) < 0.04);
    free(teacher);
    free(logits);
    dsim_dataset_free(ds);
}

static void test_file_split_covers_every_id_once(void **state)
{
    (void)state;
    const size_t cases[][2] = {{10, 3}, {10, 10}, {5, 8}, {1, 1}, {1000, 7}, {7, 1}, {64, 64}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = cases[c][0], F = cases[c][1];
        dsim_dataset_spec s = spec_of(DSIM_DATA_REGRESSION, n, 1, 1, 0.0, 1, F);
        dsim_dataset *ds = make(&s);
        unsigned *seen = calloc(n, sizeof(unsigned));
        assert_non_null(seen);
        uint64_t next = 0, lo = UINT64_MAX, hi = 0;
        for (size_t f = 0; f < F; f++) {
            uint64_t first, count;
            assert_int_equal(dsim_dataset_file_range(ds, f, &first, &count), DSIM_OK);
            /* Contiguous and in order: reading the files in turn yields
             * 0, 1, ..., n-1. */
            assert_int_equal(first, next);
            next = first + count;
            if (count < lo)
                lo = count;
            if (count > hi)
                hi = count;
            for (uint64_t id = first; id < first + count; id++) {
                assert_true(id < n);
                seen[id]++;
                size_t of = 99999;
                assert_int_equal(dsim_dataset_file_of(ds, id, &of), DSIM_OK);
                assert_int_equal(of, f);
            }
        }
        assert_int_equal(next, n);
        assert_true(hi - lo <= 1);
        for (size_t id = 0; id < n; id++)
            assert_int_equal(seen[id], 1);
        /* The input pipeline's description of a contiguous file layout has
         * the same offsets, so it reads these files as they are. */
        dsim_dataset_desc desc;
        memset(&desc, 0, sizeof desc);
        assert_int_equal(dsim_dataset_desc_init(&desc, n, (uint32_t)F, DSIM_FILES_CONTIGUOUS),
                         DSIM_OK);
        assert_memory_equal(desc.file_start, ds->file_start, (F + 1) * sizeof(uint64_t));
        for (size_t id = 0; id < n; id++)
            assert_int_equal(desc.file_ids[id], id);
        dsim_dataset_desc_release(&desc);
        uint64_t a, b;
        assert_int_equal(dsim_dataset_file_range(ds, F, &a, &b), DSIM_EINVAL);
        size_t of;
        assert_int_equal(dsim_dataset_file_of(ds, n, &of), DSIM_EINVAL);
        free(seen);
        dsim_dataset_free(ds);
    }
}

static void test_gather(void **state)
{
    (void)state;
    dsim_dataset_spec s = spec_of(DSIM_DATA_REGRESSION, 20, 3, 2, 0.1, 8, 2);
    dsim_dataset *ds = make(&s);
    uint64_t ids[3] = {17, 2, 17};
    float x[9], y[6];
    assert_int_equal(dsim_dataset_gather(ds, ids, 3, x, y), DSIM_OK);
    for (int k = 0; k < 3; k++) {
        assert_memory_equal(x + 3 * k, ds->x + 3 * ids[k], 3 * sizeof(float));
        assert_memory_equal(y + 2 * k, ds->y + 2 * ids[k], 2 * sizeof(float));
    }
    ids[1] = 20;
    dsim_clear_error();
    assert_int_equal(dsim_dataset_gather(ds, ids, 3, x, y), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "ids[1] = 20"));
    dsim_dataset_free(ds);
}

static void expect_bad(const dsim_dataset_spec *s, const char *word)
{
    static int sentinel;
    dsim_dataset *ds = (dsim_dataset *)(void *)&sentinel;
    dsim_clear_error();
    assert_int_equal(dsim_dataset_make(s, &ds), DSIM_EINVAL);
    assert_null(ds);
    if (!strstr(dsim_errmsg(), word))
        fail_msg("message '%s' does not mention '%s'", dsim_errmsg(), word);
}

static void test_bad_specs(void **state)
{
    (void)state;
    dsim_dataset_spec s = spec_of(DSIM_DATA_CLASSIFICATION, 10, 3, 3, 0.1, 1, 2);
    s.n_examples = 0;
    expect_bad(&s, "n_examples");
    s = spec_of(DSIM_DATA_CLASSIFICATION, 10, 0, 3, 0.1, 1, 2);
    expect_bad(&s, "in_dim");
    s = spec_of(DSIM_DATA_CLASSIFICATION, 10, 3, 1, 0.1, 1, 2);
    expect_bad(&s, "classes");
    s = spec_of(DSIM_DATA_REGRESSION, 10, 3, 0, 0.1, 1, 2);
    expect_bad(&s, "outputs");
    s = spec_of(DSIM_DATA_CLASSIFICATION, 10, 3, 3, 1.5, 1, 2);
    expect_bad(&s, "probability");
    s = spec_of(DSIM_DATA_REGRESSION, 10, 3, 3, -1.0, 1, 2);
    expect_bad(&s, "stddev");
    s = spec_of(DSIM_DATA_REGRESSION, 10, 3, 3, NAN, 1, 2);
    expect_bad(&s, "stddev");
    s = spec_of(DSIM_DATA_REGRESSION, 10, 3, 3, 0.0, 1, 0);
    expect_bad(&s, "n_files");
    s = spec_of(DSIM_DATA_REGRESSION, 10, 3, 3, 0.0, 1, DSIM_DATASET_MAX_FILES + 1);
    expect_bad(&s, "n_files");
    s = spec_of((dsim_data_kind)5, 10, 3, 3, 0.0, 1, 1);
    expect_bad(&s, "kind");
    s = spec_of(DSIM_DATA_REGRESSION, SIZE_MAX / 4, 3, 3, 0.0, 1, 1);
    expect_bad(&s, "memory");

    dsim_data_kind t;
    assert_int_equal(dsim_data_kind_parse("classification", &t), DSIM_OK);
    assert_int_equal(t, DSIM_DATA_CLASSIFICATION);
    assert_int_equal(dsim_data_kind_parse("ranking", &t), DSIM_EINVAL);

    /* A model that does not fit the data is refused with the reason. */
    s = spec_of(DSIM_DATA_CLASSIFICATION, 10, 3, 4, 0.0, 1, 1);
    dsim_dataset *ds = make(&s);
    dsim_model_spec ms;
    dsim_dataset_model_spec(ds, &ms);
    ms.in_dim = 5;
    assert_int_equal(dsim_dataset_check_model(ds, &ms), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "in_dim 5"));
    dsim_dataset_model_spec(ds, &ms);
    ms.out_dim = 3;
    assert_int_equal(dsim_dataset_check_model(ds, &ms), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "4 classes"));
    dsim_dataset_model_spec(ds, &ms);
    ms.kind = DSIM_MODEL_MLP;
    ms.loss = DSIM_LOSS_MSE;
    ms.n_hidden = 1;
    ms.hidden[0] = 4;
    assert_int_equal(dsim_dataset_check_model(ds, &ms), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "use loss xent"));
    ms.loss = DSIM_LOSS_AUTO;
    assert_int_equal(dsim_dataset_check_model(ds, &ms), DSIM_OK);
    dsim_dataset_free(ds);
}

/* --- record files ------------------------------------------------------ */

static char tmpdir[256];

static int setup_dir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dsim-dataset-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_write_read_round_trip(void **state)
{
    (void)state;
    const struct {
        dsim_data_kind kind;
        size_t n, files;
    } cases[] = {{DSIM_DATA_CLASSIFICATION, 103, 4},
                 {DSIM_DATA_REGRESSION, 50, 3},
                 {DSIM_DATA_REGRESSION, 3, 5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dsim_dataset_spec s = spec_of(cases[c].kind, cases[c].n, 5, 3, 0.1, 21 + c, cases[c].files);
        dsim_dataset *ds = make(&s);
        char dir[512];
        snprintf(dir, sizeof dir, "%s/rt%zu", tmpdir, c); /* created by the writer */
        if (dsim_dataset_write_files(ds, dir) != DSIM_OK)
            fail_msg("write_files: %s", dsim_errmsg());
        for (size_t f = 0; f < s.n_files; f++) {
            char path[600];
            assert_int_equal(dsim_dataset_file_path(dir, f, s.n_files, path, sizeof path), DSIM_OK);
            char want[600];
            snprintf(want, sizeof want, "%s/part-%05zu-of-%05zu.rec", dir, f, s.n_files);
            assert_string_equal(path, want);
            dsim_record_file *rf = NULL;
            if (dsim_dataset_read_file(path, &rf) != DSIM_OK)
                fail_msg("read_file: %s", dsim_errmsg());
            uint64_t first, count;
            assert_int_equal(dsim_dataset_file_range(ds, f, &first, &count), DSIM_OK);
            assert_int_equal(rf->kind, s.kind);
            assert_int_equal(rf->in_dim, 5);
            assert_int_equal(rf->out_dim, 3);
            assert_int_equal(rf->y_dim, ds->y_dim);
            assert_int_equal(rf->file_index, f);
            assert_int_equal(rf->n_files, s.n_files);
            assert_int_equal(rf->n_total, s.n_examples);
            assert_int_equal(rf->seed, s.seed);
            assert_int_equal(rf->count, count);
            for (size_t k = 0; k < rf->count; k++)
                assert_int_equal(rf->ids[k], first + k);
            if (count) {
                assert_memory_equal(rf->x, ds->x + first * 5, count * 5 * sizeof(float));
                assert_memory_equal(rf->y, ds->y + first * ds->y_dim,
                                    count * ds->y_dim * sizeof(float));
            }
            /* The size is what the format says. */
            struct stat st;
            assert_int_equal(stat(path, &st), 0);
            assert_int_equal((size_t)st.st_size,
                             DSIM_RECORD_HEADER + count * (8 + 4 * (5 + ds->y_dim)) + 8);
            dsim_record_file_free(rf);
        }
        /* No temporary file is left behind. */
        char tmp[700];
        snprintf(tmp, sizeof tmp, "%s/part-00000-of-%05zu.rec.tmp", dir, s.n_files);
        assert_int_not_equal(access(tmp, F_OK), 0);
        dsim_dataset_free(ds);
    }
}

/* The checksum of the format (FNV-1a 64), so that a test can forge files
 * whose checksums are right but whose content is not. */
static uint64_t fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void reseal(unsigned char *b, size_t len)
{
    put_u64(b + 64, fnv(b, 64));
    put_u64(b + len - 8, fnv(b + DSIM_RECORD_HEADER, len - DSIM_RECORD_HEADER - 8));
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    unsigned char *b = malloc((size_t)n + 16);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len)
        assert_int_equal(fwrite(b, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void expect_read_error(const char *path, dsim_err code, const char *word)
{
    static int sentinel;
    dsim_record_file *rf = (dsim_record_file *)(void *)&sentinel;
    dsim_clear_error();
    dsim_err e = dsim_dataset_read_file(path, &rf);
    if (e != code)
        fail_msg("%s: expected %s ('%s'), got %s: %s", path, dsim_strerror(code), word,
                 dsim_strerror(e), dsim_errmsg());
    assert_null(rf);
    if (!strstr(dsim_errmsg(), path) || !strstr(dsim_errmsg(), word))
        fail_msg("message '%s' does not name the file and '%s'", dsim_errmsg(), word);
}

static void test_corrupt_and_truncated_files(void **state)
{
    (void)state;
    /* 12 classification records of 8 + 4 * (4 + 1) = 28 bytes. */
    dsim_dataset_spec s = spec_of(DSIM_DATA_CLASSIFICATION, 24, 4, 3, 0.0, 77, 2);
    dsim_dataset *ds = make(&s);
    char dir[512], path[600], bad[620];
    snprintf(dir, sizeof dir, "%s/bad", tmpdir);
    assert_int_equal(dsim_dataset_write_files(ds, dir), DSIM_OK);
    assert_int_equal(dsim_dataset_file_path(dir, 0, 2, path, sizeof path), DSIM_OK);
    snprintf(bad, sizeof bad, "%s/broken.rec", dir);
    size_t len;
    unsigned char *good = slurp(path, &len);
    const size_t rec = 28;
    assert_int_equal(len, DSIM_RECORD_HEADER + 12 * rec + 8);
    unsigned char *b = malloc(len + 16);
    assert_non_null(b);

    /* Truncated anywhere: empty, inside the header, inside a record, the
     * trailer missing. */
    const size_t cuts[] = {
        0, 5, 40, DSIM_RECORD_HEADER, DSIM_RECORD_HEADER + 3 * rec + 11, len - 8, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(bad, good, cuts[i]);
        expect_read_error(bad, DSIM_EPROTO, "truncated");
    }
    /* Extra bytes at the end. */
    memcpy(b, good, len);
    b[len] = 0;
    spit(bad, b, len + 1);
    expect_read_error(bad, DSIM_EPROTO, "unexpected bytes");

    /* One flipped bit, in every byte of the records and the trailer in turn:
     * the record checksum catches each. */
    for (size_t at = DSIM_RECORD_HEADER; at < len; at += 7) {
        memcpy(b, good, len);
        b[at] ^= 0x10;
        spit(bad, b, len);
        expect_read_error(bad, DSIM_EPROTO, "checksum");
    }
    /* In the header: its own checksum catches it. */
    for (size_t at = 8; at < DSIM_RECORD_HEADER; at += 5) {
        memcpy(b, good, len);
        b[at] ^= 0x01;
        spit(bad, b, len);
        expect_read_error(bad, DSIM_EPROTO, "header checksum");
    }
    memcpy(b, good, len);
    memcpy(b, "PK\3\4", 4);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "bad magic");

    /* Forged files whose checksums are right but whose content is wrong. */
    memcpy(b, good, len);
    put_u32(b + 8, 2);
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "version 2");

    memcpy(b, good, len);
    put_u32(b + 24, 3); /* y_dim 3 for a classification file */
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "bad sizes");

    memcpy(b, good, len);
    put_u32(b + 28, 2); /* file 2 of 2 */
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "file index");

    memcpy(b, good, len);
    put_u64(b + 48, 13); /* one record more than there is */
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "truncated");

    memcpy(b, good, len);
    put_u64(b + 48, UINT64_MAX / 2); /* an absurd count must not be allocated */
    put_u64(b + 40, UINT64_MAX);
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "record count");

    memcpy(b, good, len);
    put_u64(b + DSIM_RECORD_HEADER + 5 * rec, 3); /* id 5 -> 3: not increasing */
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "ids must increase");

    memcpy(b, good, len);
    put_u64(b + DSIM_RECORD_HEADER + 11 * rec, 24); /* id past the dataset */
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "outside the dataset");

    memcpy(b, good, len);
    float label = 3.0f; /* 3 classes: 0..2 */
    uint32_t lv;
    memcpy(&lv, &label, 4);
    put_u32(b + DSIM_RECORD_HEADER + 2 * rec + 8 + 4 * 4, lv);
    reseal(b, len);
    spit(bad, b, len);
    expect_read_error(bad, DSIM_EPROTO, "label 3");

    /* The untouched file still reads. */
    spit(bad, good, len);
    dsim_record_file *rf = NULL;
    assert_int_equal(dsim_dataset_read_file(bad, &rf), DSIM_OK);
    assert_int_equal(rf->count, 12);
    dsim_record_file_free(rf);

    /* Missing files and directories. */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/part-00009-of-00010.rec", dir);
    expect_read_error(missing, DSIM_ENOENT, "no such record file");
    expect_read_error(dir, DSIM_EINVAL, "not a regular file");

    /* Writing where a file is in the way, or under a missing parent. */
    dsim_clear_error();
    assert_int_equal(dsim_dataset_write_files(ds, bad), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "not a directory"));
    snprintf(missing, sizeof missing, "%s/no/such/dir", tmpdir);
    assert_int_equal(dsim_dataset_write_files(ds, missing), DSIM_EIO);
    assert_non_null(strstr(dsim_errmsg(), missing));
    char small[16];
    assert_int_equal(dsim_dataset_file_path(dir, 0, 2, small, sizeof small), DSIM_EINVAL);

    free(b);
    free(good);
    dsim_dataset_free(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_bytes),
        cmocka_unit_test(test_inputs_are_standard_normal),
        cmocka_unit_test(test_regression_targets),
        cmocka_unit_test(test_classification_labels),
        cmocka_unit_test(test_file_split_covers_every_id_once),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_write_read_round_trip),
        cmocka_unit_test(test_corrupt_and_truncated_files),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
