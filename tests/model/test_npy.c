/* The .npy header parser (dsim/npy.h): the headers numpy writes, each
 * refusal with its message, and a fuzz-style loop over malformed headers:
 * every truncation, every single-byte change of a valid file and
 * thousands of seeded random edits must each parse to a header that fits
 * the file, or be refused with a message naming the file; never crash or
 * read past the buffer (run it under ASan). The writer reads back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/npy.h"
#include "dsim/rng.h"

/* A .npy image: preamble of `version`, the dict text padded to 64, then
 * `data_bytes` bytes of data. Returns its length; *out is malloc'ed. */
static size_t np_make(unsigned version, const char *dict, size_t data_bytes, unsigned char **out)
{
    size_t lw = version == 1 ? 2 : 4, pre = 8 + lw, dl = strlen(dict);
    size_t total = (pre + dl + 1 + 63) / 64 * 64, hlen = total - pre;
    unsigned char *b = calloc(total + data_bytes + 1, 1);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)version;
    b[7] = 0;
    for (size_t i = 0; i < lw; i++)
        b[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + pre, dict, dl);
    memset(b + pre + dl, ' ', hlen - dl - 1);
    b[total - 1] = '\n';
    for (size_t i = 0; i < data_bytes; i++)
        b[total + i] = (unsigned char)(i * 7);
    *out = b;
    return total + data_bytes;
}

static dsim_err np_parse(const unsigned char *b, size_t n, dsim_npy_header *h)
{
    /* an exact-size copy, so that ASan sees any read past the end */
    unsigned char *c = malloc(n ? n : 1);
    assert_non_null(c);
    memcpy(c, b, n);
    dsim_err e = dsim_npy_parse_header("t.npy", c, n, n, h);
    free(c);
    return e;
}

static void np_refused(const char *dict, size_t data_bytes, const char *needle)
{
    unsigned char *b;
    size_t n = np_make(1, dict, data_bytes, &b);
    dsim_npy_header h;
    dsim_err e = np_parse(b, n, &h);
    free(b);
    if (e == DSIM_OK)
        fail_msg("accepted: %s", dict);
    assert_int_equal(e, DSIM_EPROTO);
    if (!strstr(dsim_errmsg(), "t.npy") || !strstr(dsim_errmsg(), needle))
        fail_msg("for %s: message \"%s\" lacks \"%s\"", dict, dsim_errmsg(), needle);
}

static void test_valid_headers(void **state)
{
    (void)state;
    static const struct {
        unsigned version;
        const char *dict;
        size_t bytes;
        dsim_npy_type type;
        int be, fortran;
        size_t ndim;
        uint64_t d0, d1;
    } ok[] = {
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 48, DSIM_NPY_F32, 0, 0,
         2, 3, 4},
        {2, "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 5), }", 80, DSIM_NPY_F64, 1, 1, 2,
         2, 5},
        {3, "{\"shape\": (7,), \"descr\": \"|u1\", \"fortran_order\": False}", 7, DSIM_NPY_U8, 0, 0,
         1, 7, 0},
        {1, "{'descr': '<i8', 'fortran_order': False, 'shape': ()}", 8, DSIM_NPY_I64, 0, 0, 0, 0,
         0},
        {1, "{'descr':'<i4','fortran_order':False,'shape':(0, 3)}", 0, DSIM_NPY_I32, 0, 0, 2, 0, 3},
        {1, "{'descr': '>u2', 'fortran_order': False, 'shape': (2 , 1 ,) , }", 4, DSIM_NPY_U16, 1,
         0, 2, 2, 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        unsigned char *b;
        size_t n = np_make(ok[i].version, ok[i].dict, ok[i].bytes, &b);
        dsim_npy_header h;
        if (np_parse(b, n, &h) != DSIM_OK)
            fail_msg("refused %s: %s", ok[i].dict, dsim_errmsg());
        assert_int_equal(h.major, ok[i].version);
        assert_int_equal(h.type, ok[i].type);
        assert_int_equal(h.big_endian, ok[i].be);
        assert_int_equal(h.fortran_order, ok[i].fortran);
        assert_int_equal(h.ndim, ok[i].ndim);
        if (h.ndim > 0)
            assert_int_equal(h.shape[0], ok[i].d0);
        if (h.ndim > 1)
            assert_int_equal(h.shape[1], ok[i].d1);
        assert_int_equal(h.data_offset + h.data_bytes, n);
        assert_int_equal(h.data_offset % 64, 0);
        free(b);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    dsim_npy_header h;
    /* bad magic; a file shorter than the magic; a truncated preamble */
    assert_int_equal(np_parse((const unsigned char *)"PK\x03\x04xxxxxxxx", 12, &h), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "not a .npy file (bad magic"));
    assert_int_equal(np_parse((const unsigned char *)"\x93NUM", 4, &h), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "truncated .npy file"));
    assert_int_equal(np_parse((const unsigned char *)"\x93NUMPY\x01\x00\x76", 9, &h), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "truncated .npy header"));
    /* a header length past the end of the file */
    unsigned char *b;
    size_t n = np_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4, &b);
    assert_int_equal(np_parse(b, 40, &h), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "truncated .npy header: it announces"));
    b[6] = 4;
    assert_int_equal(np_parse(b, n, &h), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "format version 4.0"));
    free(b);

    np_refused("{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", 2,
               "unknown .npy descr '<f2' (half floats");
    np_refused("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }", 1, "(bool");
    np_refused("{'descr': '<U5', 'fortran_order': False, 'shape': (1,), }", 20, "(strings");
    np_refused("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", 8, "unknown .npy descr");
    np_refused("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4,
               "structured array");
    np_refused("{'descr': '|f4', 'fortran_order': False, 'shape': (1,), }", 4,
               "byte order '|' does not fit");
    np_refused("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", 4,
               "fortran_order is not True or False");
    np_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", 12, "write (N,)");
    np_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 4,
               "not a whole number");
    np_refused("{'descr': '<f4', 'fortran_order': False}", 4, "key 'shape' is missing");
    np_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4,
               "unknown key 'x'");
    np_refused("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4,
               "appears twice");
    np_refused("['descr', '<f4']", 4, "must begin with '{'");
    np_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", 4,
               "text after the dict");
    /* shape against the file's size */
    np_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 20,
               "truncated .npy file: shape (3, 2) of float32 needs 24 bytes");
    np_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 28,
               "4 bytes after its data");
    np_refused("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 8,
               "overflows");
    /* a header without its newline */
    n = np_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4, &b);
    b[n - 5] = ' '; /* the header's last byte: 4 bytes of data follow */
    assert_int_equal(np_parse(b, n, &h), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "does not end with a newline"));
    b[n - 5] = '\n';
    b[30] = (unsigned char)0xe9;
    assert_int_equal(np_parse(b, n, &h), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "not printable ASCII"));
    free(b);
}

/* A parse of a mangled file either fits the file or is refused naming it. */
static void np_check_one(const unsigned char *b, size_t n, size_t *accepted)
{
    dsim_npy_header h;
    dsim_err e = np_parse(b, n, &h);
    if (e == DSIM_OK) {
        assert_int_equal(h.data_offset + h.data_bytes, n);
        assert_true(h.ndim <= DSIM_NPY_MAX_DIMS);
        assert_true((unsigned)h.type < DSIM_NPY_TYPE_COUNT);
        (*accepted)++;
        return;
    }
    assert_int_equal(e, DSIM_EPROTO);
    if (!strstr(dsim_errmsg(), "t.npy"))
        fail_msg("message does not name the file: %s", dsim_errmsg());
}

static void test_fuzz_headers(void **state)
{
    (void)state;
    static const char *const bases[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
        "{'descr': '>i8', 'fortran_order': True, 'shape': (2,), }",
        "{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (5, 1)}",
    };
    static const size_t bytes[] = {48, 16, 5};
    static const unsigned char repl[] = {0,   '\n', ' ', '\'', '"', ',', ':', '(', ')',  '{',
                                         '}', '0',  '9', '<',  '>', '|', 'f', 'T', 0x80, 0xff};
    size_t tried = 0, accepted = 0;
    dsim_rng r;
    dsim_rng_init(&r, 7, "test.npy.fuzz", 0);
    for (size_t k = 0; k < sizeof bases / sizeof bases[0]; k++) {
        for (unsigned v = 1; v <= 3; v++) {
            unsigned char *b;
            size_t n = np_make(v, bases[k], bytes[k], &b);
            size_t hdr = n - bytes[k];
            for (size_t cut = 0; cut < n; cut++, tried++)
                np_check_one(b, cut, &accepted); /* every truncation */
            for (size_t i = 0; i < hdr; i++) {   /* every byte of the header, changed */
                unsigned char keep = b[i];
                for (size_t j = 0; j < sizeof repl; j++, tried++) {
                    b[i] = repl[j];
                    np_check_one(b, n, &accepted);
                }
                b[i] = keep;
            }
            for (int t = 0; t < 2000; t++, tried++) { /* seeded random edits */
                unsigned char *c = malloc(n);
                assert_non_null(c);
                memcpy(c, b, n);
                int edits = 1 + (int)dsim_rng_below(&r, 4);
                for (int m = 0; m < edits; m++)
                    c[dsim_rng_below(&r, hdr)] = (unsigned char)dsim_rng_below(&r, 256);
                size_t len = dsim_rng_below(&r, 4) == 0 ? (size_t)dsim_rng_below(&r, n + 1) : n;
                np_check_one(c, len, &accepted);
                free(c);
            }
            free(b);
        }
    }
    /* the untouched files are among those accepted; most edits are not */
    assert_true(accepted >= 9);
    assert_true(accepted < tried / 2);
    print_message("%zu malformed or edited headers tried, %zu accepted (each fits its file)\n",
                  tried, accepted);
}

static void test_write_read(void **state)
{
    (void)state;
    char dir[] = "/tmp/dsim-npy-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/a.npy", dir);
    float v[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
    uint64_t shape[2] = {3, 2};
    assert_int_equal(dsim_npy_write(path, DSIM_NPY_F32, shape, 2, v), DSIM_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    dsim_npy_header h;
    assert_int_equal(dsim_npy_parse_header(path, buf, n, n, &h), DSIM_OK);
    assert_int_equal(h.data_offset % 64, 0);
    assert_int_equal(h.ndim, 2);
    assert_int_equal(h.shape[0], 3);
    assert_int_equal(h.shape[1], 2);
    for (int i = 0; i < 6; i++)
        assert_true(dsim_npy_get(&h, buf + h.data_offset, (uint64_t)i) == v[i]);
    int64_t ids[3] = {5, -1, 1LL << 40};
    uint64_t s1 = 3;
    assert_int_equal(dsim_npy_write(path, DSIM_NPY_I64, &s1, 1, ids), DSIM_OK);
    f = fopen(path, "rb");
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(dsim_npy_parse_header(path, buf, n, n, &h), DSIM_OK);
    assert_int_equal(h.type, DSIM_NPY_I64);
    for (int i = 0; i < 3; i++)
        assert_true(dsim_npy_get(&h, buf + h.data_offset, (uint64_t)i) == (double)ids[i]);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_headers),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_fuzz_headers),
        cmocka_unit_test(test_write_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
