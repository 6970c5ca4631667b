/* Datasets read from files (dsim_dataset_load): .npy pairs of every
 * accepted type, layout and byte order give the same floats; float32 is
 * used in place from a read-only mapping; CSV files; the record-file split;
 * and every refusal, each naming the file and what is wrong (the messages
 * are printed, so the log shows them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/dataset.h"
#include "dsim/npy.h"

#define N_EX 10
#define N_F  3

static char dl_dir[] = "/tmp/dsim-dsload-XXXXXX";
static float dl_x[N_EX * N_F];
static int64_t dl_lab[N_EX];

static const char *dl_path(const char *name)
{
    static char buf[4][512];
    static int slot;
    slot = (slot + 1) % 4;
    snprintf(buf[slot], sizeof buf[slot], "%s/%s", dl_dir, name);
    return buf[slot];
}

static void dl_write_text(const char *name, const char *text, size_t n)
{
    FILE *f = fopen(dl_path(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A .npy file with a dict written by hand and raw data bytes. */
static void dl_write_raw(const char *name, const char *dict, const void *data, size_t bytes)
{
    size_t dl = strlen(dict), total = (10 + dl + 1 + 63) / 64 * 64, hlen = total - 10;
    unsigned char *b = calloc(total + bytes + 1, 1);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)hlen;
    b[9] = (unsigned char)(hlen >> 8);
    memcpy(b + 10, dict, dl);
    memset(b + 10 + dl, ' ', hlen - dl - 1);
    b[total - 1] = '\n';
    if (bytes)
        memcpy(b + total, data, bytes);
    dl_write_text(name, (const char *)b, total + bytes);
    free(b);
}

static int dl_setup(void **state)
{
    (void)state;
    if (!mkdtemp(dl_dir))
        return -1;
    for (int e = 0; e < N_EX; e++) {
        for (int i = 0; i < N_F; i++)
            dl_x[e * N_F + i] = (float)(e * 0.5 - i * 1.25 + 0.125);
        dl_lab[e] = e % 3;
    }
    uint64_t xs[2] = {N_EX, N_F}, ys = N_EX;
    if (dsim_npy_write(dl_path("x.npy"), DSIM_NPY_F32, xs, 2, dl_x) != DSIM_OK ||
        dsim_npy_write(dl_path("y.npy"), DSIM_NPY_I64, &ys, 1, dl_lab) != DSIM_OK)
        return -1;
    return 0;
}

static int dl_teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dl_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static dsim_data_source dl_npy(const char *x, const char *y)
{
    return (dsim_data_source){.x = dl_path(x), .y = dl_path(y), .task = -1, .n_files = 1};
}

static void dl_same_x(const dsim_dataset *ds)
{
    assert_int_equal(ds->spec.n_examples, N_EX);
    assert_int_equal(ds->spec.in_dim, N_F);
    assert_memory_equal(ds->x, dl_x, sizeof dl_x);
}

static void test_npy_float32_mapped(void **state)
{
    (void)state;
    dsim_data_source src = dl_npy("x.npy", "y.npy");
    src.n_files = 4;
    dsim_dataset *ds = NULL;
    assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
    dl_same_x(ds);
    assert_int_equal(ds->spec.kind, DSIM_DATA_CLASSIFICATION);
    assert_int_equal(ds->spec.out_dim, 3);
    assert_int_equal(ds->y_dim, 1);
    for (int e = 0; e < N_EX; e++)
        assert_true(ds->y[e] == (float)dl_lab[e]);
    /* the features are used in place; the int64 labels were converted */
    assert_int_equal(dsim_dataset_mapped_bytes(ds), sizeof dl_x);
    assert_non_null(strstr(dsim_dataset_origin(ds), "float32 features, mapped"));
    assert_non_null(strstr(dsim_dataset_origin(ds), "int64 labels, converted"));
    /* files split as a synthetic dataset's: 3, 3, 2, 2 */
    uint64_t first, count;
    assert_int_equal(dsim_dataset_file_range(ds, 1, &first, &count), DSIM_OK);
    assert_int_equal(first, 3);
    assert_int_equal(count, 3);
    assert_int_equal(dsim_dataset_file_range(ds, 3, &first, &count), DSIM_OK);
    assert_int_equal(first, 8);
    assert_int_equal(count, 2);
    /* a model fits it as one fits a synthetic dataset */
    dsim_model_spec ms;
    dsim_dataset_model_spec(ds, &ms);
    assert_int_equal(dsim_dataset_check_model(ds, &ms), DSIM_OK);
    dsim_dataset_free(ds);
}

static void test_npy_conversions(void **state)
{
    (void)state;
    /* float64, big-endian float32, Fortran order: the same floats, converted */
    double x64[N_EX * N_F];
    unsigned char be[sizeof dl_x];
    float xf[N_EX * N_F];
    for (int k = 0; k < N_EX * N_F; k++) {
        x64[k] = dl_x[k];
        uint32_t u;
        memcpy(&u, &dl_x[k], 4);
        for (int b = 0; b < 4; b++)
            be[4 * k + b] = (unsigned char)(u >> (8 * (3 - b)));
    }
    for (int e = 0; e < N_EX; e++)
        for (int i = 0; i < N_F; i++)
            xf[i * N_EX + e] = dl_x[e * N_F + i];
    dl_write_raw("x64.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (10, 3), }", x64,
                 sizeof x64);
    dl_write_raw("xbe.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (10, 3), }", be,
                 sizeof be);
    dl_write_raw("xf.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (10, 3), }", xf,
                 sizeof xf);
    const char *names[] = {"x64.npy", "xbe.npy", "xf.npy"};
    for (int i = 0; i < 3; i++) {
        dsim_data_source src = dl_npy(names[i], "y.npy");
        dsim_dataset *ds = NULL;
        if (dsim_dataset_load(&src, &ds) != DSIM_OK)
            fail_msg("%s: %s", names[i], dsim_errmsg());
        dl_same_x(ds);
        assert_int_equal(dsim_dataset_mapped_bytes(ds), 0);
        dsim_dataset_free(ds);
    }
    /* uint8 and int32 labels, float32 regression targets (1-D and 2-D) */
    uint8_t u8[N_EX];
    int32_t i32[N_EX];
    float t2[N_EX * 2];
    for (int e = 0; e < N_EX; e++) {
        u8[e] = (uint8_t)dl_lab[e];
        i32[e] = (int32_t)dl_lab[e];
        t2[2 * e] = (float)e * 0.1f;
        t2[2 * e + 1] = -(float)e;
    }
    dl_write_raw("yu8.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (10,), }", u8, 10);
    dl_write_raw("yi32.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }", i32, 40);
    dl_write_raw("yt2.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 2), }", t2,
                 sizeof t2);
    dl_write_raw("yt1.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }", t2, 40);
    const char *ys[] = {"yu8.npy", "yi32.npy"};
    for (int i = 0; i < 2; i++) {
        dsim_data_source src = dl_npy("x.npy", ys[i]);
        dsim_dataset *ds = NULL;
        assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
        assert_int_equal(ds->spec.kind, DSIM_DATA_CLASSIFICATION);
        assert_int_equal(ds->spec.out_dim, 3);
        dsim_dataset_free(ds);
    }
    dsim_data_source src = dl_npy("x.npy", "yt2.npy");
    dsim_dataset *ds = NULL;
    assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
    assert_int_equal(ds->spec.kind, DSIM_DATA_REGRESSION);
    assert_int_equal(ds->spec.out_dim, 2);
    assert_int_equal(ds->y_dim, 2);
    assert_memory_equal(ds->y, t2, sizeof t2);
    assert_int_equal(dsim_dataset_mapped_bytes(ds), sizeof dl_x + sizeof t2);
    dsim_dataset_free(ds);
    src = dl_npy("x.npy", "yt1.npy");
    assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
    assert_int_equal(ds->spec.kind, DSIM_DATA_REGRESSION);
    assert_int_equal(ds->spec.out_dim, 1);
    dsim_dataset_free(ds);
    /* the task asked for wins: integer labels as regression targets */
    src = dl_npy("x.npy", "y.npy");
    src.task = DSIM_DATA_REGRESSION;
    assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
    assert_int_equal(ds->spec.kind, DSIM_DATA_REGRESSION);
    dsim_dataset_free(ds);
    /* classes given above the largest label */
    src = dl_npy("x.npy", "y.npy");
    src.classes = 10;
    assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
    assert_int_equal(ds->spec.out_dim, 10);
    dsim_dataset_free(ds);
}

/* Loads src and expects refusal `code` with every needle in the message. */
static void dl_refused(const dsim_data_source *src, dsim_err code, const char *n1, const char *n2)
{
    dsim_dataset *ds = NULL;
    dsim_err e = dsim_dataset_load(src, &ds);
    if (e == DSIM_OK)
        fail_msg("accepted (expected \"%s\")", n1);
    assert_null(ds);
    const char *m = dsim_errmsg();
    print_message("  refused: %s\n", m);
    assert_int_equal(e, code);
    if (!strstr(m, n1) || (n2 && !strstr(m, n2)))
        fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", m, n1, n2 ? n2 : "");
}

static void dl_refused_x(const char *name, const char *dict, const void *data, size_t bytes,
                         dsim_err code, const char *needle)
{
    dl_write_raw(name, dict, data, bytes);
    dsim_data_source src = dl_npy(name, "y.npy");
    dl_refused(&src, code, name, needle);
}

static void test_npy_refusals(void **state)
{
    (void)state;
    float bad[N_EX * N_F];
    memcpy(bad, dl_x, sizeof bad);
    dsim_data_source src = dl_npy("missing.npy", "y.npy");
    dl_refused(&src, DSIM_ENOENT, "missing.npy", "no such file");
    dl_write_text("magic.npy", "PK\003\004 this is a zip", 18);
    src = dl_npy("magic.npy", "y.npy");
    dl_refused(&src, DSIM_EPROTO, "magic.npy", "bad magic");
    dl_write_text("trunc.npy", "\x93NUMPY\x01\x00\x76\x00{'descr'", 17);
    src = dl_npy("trunc.npy", "y.npy");
    dl_refused(&src, DSIM_EPROTO, "trunc.npy", "truncated .npy header");
    dl_refused_x("descr.npy", "{'descr': '<c8', 'fortran_order': False, 'shape': (10, 3), }", bad,
                 sizeof bad, DSIM_EPROTO, "unknown .npy descr '<c8' (complex)");
    dl_refused_x("short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }", bad,
                 sizeof bad - 4, DSIM_EPROTO, "truncated .npy file: shape (10, 3) of float32");
    dl_refused_x("long.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (9, 3), }", bad,
                 sizeof bad, DSIM_EPROTO, "does not describe");
    dl_refused_x("x1d.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (30,), }", bad,
                 sizeof bad, DSIM_EINVAL, "must be a 2-D array");
    dl_refused_x("xint.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (10, 3), }", bad,
                 sizeof bad, DSIM_EINVAL, "features are int32");
    bad[7] = 0.0f / 0.0f;
    dl_refused_x("xnan.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }", bad,
                 sizeof bad, DSIM_EINVAL, "example 2 has feature 1 = NaN");
    bad[7] = 1.0f / 0.0f;
    dl_refused_x("xinf.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }", bad,
                 sizeof bad, DSIM_EINVAL, "= inf: every value must be finite");
    double big[N_EX * N_F] = {0};
    big[4] = 1e300;
    dl_refused_x("xbig.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (10, 3), }", big,
                 sizeof big, DSIM_EINVAL, "beyond float32's range");

    /* labels */
    int64_t lab[N_EX + 1];
    memcpy(lab, dl_lab, sizeof dl_lab);
    dl_write_raw("y9.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (9,), }", lab, 72);
    src = dl_npy("x.npy", "y9.npy");
    dl_refused(&src, DSIM_EINVAL, "9 labels, but", "has 10 examples");
    src = dl_npy("x.npy", "y.npy");
    src.classes = 2;
    dl_refused(&src, DSIM_EINVAL, "has label 2, outside the 2 classes", "data.classes");
    lab[4] = -1;
    dl_write_raw("yneg.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (10,), }", lab, 80);
    src = dl_npy("x.npy", "yneg.npy");
    dl_refused(&src, DSIM_EINVAL, "example 4 has label -1", "start at 0");
    float fl[N_EX] = {0, 1, 2, 0.5f, 1, 2, 0, 1, 2, 0};
    dl_write_raw("yfrac.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }", fl, 40);
    src = dl_npy("x.npy", "yfrac.npy");
    src.task = DSIM_DATA_CLASSIFICATION;
    dl_refused(&src, DSIM_EINVAL, "example 3 has label 0.5", "not a whole number");
    int64_t zeros[N_EX] = {0};
    dl_write_raw("yone.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (10,), }", zeros,
                 80);
    src = dl_npy("x.npy", "yone.npy");
    dl_refused(&src, DSIM_EINVAL, "every label is 0", "at least 2");
    fl[3] = 0.0f / 0.0f;
    dl_write_raw("ynan.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }", fl, 40);
    src = dl_npy("x.npy", "ynan.npy");
    dl_refused(&src, DSIM_EINVAL, "example 3 has target 0 = NaN", NULL);
    src = dl_npy("x.npy", "y.npy");
    src.features = 4;
    dl_refused(&src, DSIM_EINVAL, "has 3 features per example, but data.features says 4", NULL);
    src = dl_npy("x.npy", "y.npy");
    src.y = NULL;
    dl_refused(&src, DSIM_EINVAL, "give either x and y", NULL);
}

static const char dl_csv_ok[] = "f0, f1 ,\"f2\",label\r\n"
                                "0.125,-1.125,-2.375,0\r\n"
                                "\n"
                                "0.625,-0.625,-1.875,1\n"
                                "1.125,-0.125,-1.375,2\n";

static dsim_data_source dl_csv(const char *name, const char *const *labels, size_t n)
{
    return (dsim_data_source){.csv = dl_path(name),
                              .label_columns = labels,
                              .n_label_columns = n,
                              .task = -1,
                              .n_files = 2};
}

static void test_csv(void **state)
{
    (void)state;
    static const char *const label[] = {"label"};
    dl_write_text("ok.csv", dl_csv_ok, sizeof dl_csv_ok - 1);
    dsim_data_source src = dl_csv("ok.csv", label, 1);
    dsim_dataset *ds = NULL;
    assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
    assert_int_equal(ds->spec.n_examples, 3);
    assert_int_equal(ds->spec.in_dim, 3);
    assert_int_equal(ds->spec.kind, DSIM_DATA_CLASSIFICATION);
    assert_int_equal(ds->spec.out_dim, 3);
    assert_memory_equal(ds->x, dl_x, 9 * sizeof(float)); /* the first three .npy rows */
    assert_true(ds->y[2] == 2.0f);
    assert_int_equal(ds->spec.n_files, 2);
    dsim_dataset_free(ds);
    /* two label columns: regression targets; the label column in the middle */
    static const char *const two[] = {"f1", "label"};
    src = dl_csv("ok.csv", two, 2);
    assert_int_equal(dsim_dataset_load(&src, &ds), DSIM_OK);
    assert_int_equal(ds->spec.kind, DSIM_DATA_REGRESSION);
    assert_int_equal(ds->spec.out_dim, 2);
    assert_int_equal(ds->spec.in_dim, 2);
    assert_true(ds->x[1] == -2.375f && ds->y[0] == -1.125f && ds->y[1] == 0.0f);
    dsim_dataset_free(ds);

    static const struct {
        const char *text, *n1, *n2;
        dsim_err code;
    } bad[] = {
        {"a,label\n1,0\nx1,1\n", ":3: column 'a' (column 1) holds 'x1', not a number", NULL,
         DSIM_EPROTO},
        {"a,label\n1,0\n2\n", ":3: 1 cells, but the header names 2 columns", NULL, DSIM_EPROTO},
        {"a,label\n1,0\n,1\n", ":3: column 'a' (column 1) is empty", NULL, DSIM_EPROTO},
        {"a,b\n1,0\n", "there is no column 'label'", "the header names: a, b", DSIM_EINVAL},
        {"a,a,label\n1,2,0\n", "columns 1 and 2 are both named 'a'", NULL, DSIM_EPROTO},
        {"a,label\n", "a header and no data rows", NULL, DSIM_EPROTO},
        {"", "the file is empty", NULL, DSIM_EPROTO},
        {"a,label\nnan,1\n", "holds nan, which is not finite", NULL, DSIM_EINVAL},
        {"a,label\n1e300,1\n", "beyond float32's range", NULL, DSIM_EINVAL},
        {"a,label\n1,-1\n2,1\n", "has label -1", NULL, DSIM_EINVAL},
        {"label\n1\n", "every column is a label", NULL, DSIM_EINVAL},
        {"a,,label\n1,2,3\n", "column 2 of the header has no name", NULL, DSIM_EPROTO},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.csv", i);
        dl_write_text(name, bad[i].text, strlen(bad[i].text));
        src = dl_csv(name, label, 1);
        if (i == 9)
            src.task = DSIM_DATA_CLASSIFICATION;
        dl_refused(&src, bad[i].code, bad[i].n1, bad[i].n2);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_float32_mapped),
        cmocka_unit_test(test_npy_conversions),
        cmocka_unit_test(test_npy_refusals),
        cmocka_unit_test(test_csv),
    };
    return cmocka_run_group_tests(tests, dl_setup, dl_teardown);
}
