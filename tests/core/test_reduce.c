/* reduce: every (dtype, op) kernel against a double-precision reference,
 * f16/bf16 rounding, NaN propagation, integer wrap-around (meant to run under
 * UBSan too), the MEAN finish, aliasing of dsim_reduce_local3 and bad
 * arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/reduce.h"

/* A small deterministic generator, separate from dsim's own rng. */
static uint64_t lcg_state = 88172645463325252u;
static uint64_t lcg(void)
{
    lcg_state ^= lcg_state << 13;
    lcg_state ^= lcg_state >> 7;
    lcg_state ^= lcg_state << 17;
    return lcg_state;
}

static int randint(int lo, int hi)
{
    return lo + (int)(lcg() % (uint64_t)(hi - lo + 1));
}

static double ref_op(dsim_op op, double x, double y)
{
    switch (op) {
    case DSIM_SUM:
    case DSIM_MEAN:
        return x + y;
    case DSIM_MAX:
        return x > y ? x : y;
    case DSIM_MIN:
        return x < y ? x : y;
    case DSIM_PROD:
        return x * y;
    default:
        return NAN;
    }
}

/* Values whose sums and products are exact in every dtype, bf16 included
 * (8 significant bits): eighths up to +-12.5 for SUM and friends, and
 * eighths up to +-1.5 for PROD; integers for the integer types. */
static double rand_exact(dsim_dtype t, dsim_op op)
{
    int k = op == DSIM_PROD ? 12 : 100;
    if (dsim_dtype_is_float(t))
        return randint(-k, k) / 8.0;
    return randint(-k, k);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static void test_kernels_vs_reference(void **state)
{
    (void)state;
    static const size_t counts[] = {1, 3, 17, 1000, 4099};
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++) {
        size_t es = dsim_dtype_size((dsim_dtype)t);
        for (int op = 0; op < DSIM_OP_COUNT; op++) {
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                for (size_t off = 0; off < 2; off++) { /* misaligned by one element too */
                    size_t n = counts[c];
                    char *a = xmalloc((n + 1) * es), *b = xmalloc((n + 1) * es);
                    char *o = xmalloc((n + 1) * es), *io = xmalloc((n + 1) * es);
                    char *pa = a + off * es, *pb = b + off * es, *po = o + off * es,
                         *pio = io + off * es;
                    for (size_t i = 0; i < n; i++) {
                        dsim_dtype_set((dsim_dtype)t, pa, i, rand_exact((dsim_dtype)t, op));
                        dsim_dtype_set((dsim_dtype)t, pb, i, rand_exact((dsim_dtype)t, op));
                    }
                    memcpy(pio, pa, n * es);
                    assert_int_equal(dsim_reduce_local3(po, pa, pb, n, (dsim_dtype)t, (dsim_op)op),
                                     DSIM_OK);
                    assert_int_equal(dsim_reduce_local(pio, pb, n, (dsim_dtype)t, (dsim_op)op),
                                     DSIM_OK);
                    for (size_t i = 0; i < n; i++) {
                        double x = dsim_dtype_get((dsim_dtype)t, pa, i);
                        double y = dsim_dtype_get((dsim_dtype)t, pb, i);
                        double want = ref_op((dsim_op)op, x, y);
                        double got = dsim_dtype_get((dsim_dtype)t, po, i);
                        if (got != want || dsim_dtype_get((dsim_dtype)t, pio, i) != want)
                            fail_msg("%s %s n=%zu i=%zu: %g op %g = %g (in place %g), expected %g",
                                     dsim_dtype_name((dsim_dtype)t), dsim_op_name((dsim_op)op), n,
                                     i, x, y, got, dsim_dtype_get((dsim_dtype)t, pio, i), want);
                    }
                    free(a);
                    free(b);
                    free(o);
                    free(io);
                }
            }
        }
    }
}

static int f16ish_is_nan(dsim_dtype t, uint16_t v)
{
    return isnan(dsim_dtype_get(t, &v, 0));
}

/* f16/bf16 on arbitrary bit patterns: the kernel combines in float and
 * rounds once, which for + and * is the correctly rounded result: the same
 * as rounding the exact double result once. */
static void test_half_rounding(void **state)
{
    (void)state;
    enum { N = 20000 };
    uint16_t *a = xmalloc(N * 2), *b = xmalloc(N * 2), *o = xmalloc(N * 2);
    dsim_dtype types[2] = {DSIM_F16, DSIM_BF16};
    for (int k = 0; k < 2; k++) {
        dsim_dtype t = types[k];
        for (int op = 0; op < DSIM_OP_COUNT; op++) {
            for (int i = 0; i < N; i++) {
                a[i] = (uint16_t)lcg();
                /* keep b near a's magnitude half of the time, so sums
                 * actually round instead of just returning the larger */
                b[i] = (i & 1) ? (uint16_t)(a[i] ^ (lcg() & 0x83ff)) : (uint16_t)lcg();
            }
            assert_int_equal(dsim_reduce_local3(o, a, b, N, t, (dsim_op)op), DSIM_OK);
            for (int i = 0; i < N; i++) {
                double x = dsim_dtype_get(t, a, (size_t)i), y = dsim_dtype_get(t, b, (size_t)i);
                float fx = (float)x, fy = (float)y, fr;
                switch (op) {
                case DSIM_MAX:
                    fr = (fx > fy || fx != fx) ? fx : fy;
                    break;
                case DSIM_MIN:
                    fr = (fx < fy || fx != fx) ? fx : fy;
                    break;
                case DSIM_PROD:
                    fr = fx * fy;
                    break;
                default:
                    fr = fx + fy;
                    break;
                }
                uint16_t want = t == DSIM_F16 ? dsim_f32_to_f16(fr) : dsim_f32_to_bf16(fr);
                if (isnan(fr)) {
                    if (!f16ish_is_nan(t, o[i]))
                        fail_msg("%s %s: 0x%04x op 0x%04x gave 0x%04x, expected NaN",
                                 dsim_dtype_name(t), dsim_op_name((dsim_op)op), a[i], b[i], o[i]);
                    continue;
                }
                if (o[i] != want)
                    fail_msg("%s %s: 0x%04x op 0x%04x gave 0x%04x, expected 0x%04x",
                             dsim_dtype_name(t), dsim_op_name((dsim_op)op), a[i], b[i], o[i], want);
                if (op == DSIM_SUM || op == DSIM_PROD) {
                    uint16_t once;
                    dsim_dtype_set(t, &once, 0, op == DSIM_SUM ? x + y : x * y);
                    if (!isnan(x + y) && !isnan(x * y) && once != o[i])
                        fail_msg("%s %s: 0x%04x op 0x%04x gave 0x%04x, correctly rounded 0x%04x",
                                 dsim_dtype_name(t), dsim_op_name((dsim_op)op), a[i], b[i], o[i],
                                 once);
                }
            }
        }
    }
    /* a tie: 1 + 2^-11 in f16 and 1 + 2^-8 in bf16 round to even (1) */
    uint16_t one = 0x3c00, tiny, res;
    dsim_dtype_set(DSIM_F16, &tiny, 0, 0x1p-11);
    assert_int_equal(dsim_reduce_local3(&res, &one, &tiny, 1, DSIM_F16, DSIM_SUM), DSIM_OK);
    assert_int_equal(res, 0x3c00);
    one = 0x3c01; /* 1 + 2^-10: the tie now rounds up to 0x3c02 */
    assert_int_equal(dsim_reduce_local3(&res, &one, &tiny, 1, DSIM_F16, DSIM_SUM), DSIM_OK);
    assert_int_equal(res, 0x3c02);
    one = 0x3f80;
    dsim_dtype_set(DSIM_BF16, &tiny, 0, 0x1p-8);
    assert_int_equal(dsim_reduce_local3(&res, &one, &tiny, 1, DSIM_BF16, DSIM_SUM), DSIM_OK);
    assert_int_equal(res, 0x3f80);
    /* f16 overflow goes to inf */
    uint16_t big = 0x7bff; /* 65504 */
    assert_int_equal(dsim_reduce_local3(&res, &big, &big, 1, DSIM_F16, DSIM_SUM), DSIM_OK);
    assert_int_equal(res, 0x7c00);
    free(a);
    free(b);
    free(o);
}

/* MAX and MIN propagate NaN from either side (tf.maximum semantics). */
static void test_nan_propagation(void **state)
{
    (void)state;
    dsim_dtype types[4] = {DSIM_F32, DSIM_F64, DSIM_F16, DSIM_BF16};
    double xa[6] = {NAN, 1.0, NAN, -INFINITY, 2.0, INFINITY};
    double xb[6] = {1.0, NAN, NAN, 1.0, -INFINITY, NAN};
    for (int k = 0; k < 4; k++) {
        dsim_dtype t = types[k];
        double a[6], b[6], o[6]; /* big enough for any float dtype */
        for (int i = 0; i < 6; i++) {
            dsim_dtype_set(t, a, (size_t)i, xa[i]);
            dsim_dtype_set(t, b, (size_t)i, xb[i]);
        }
        for (int op = DSIM_MAX; op <= DSIM_MIN; op++) {
            assert_int_equal(dsim_reduce_local3(o, a, b, 6, t, (dsim_op)op), DSIM_OK);
            for (int i = 0; i < 6; i++) {
                double got = dsim_dtype_get(t, o, (size_t)i);
                if (isnan(xa[i]) || isnan(xb[i])) {
                    if (!isnan(got))
                        fail_msg("%s %s element %d: %g, expected NaN", dsim_dtype_name(t),
                                 dsim_op_name((dsim_op)op), i, got);
                } else {
                    assert_true(got == ref_op((dsim_op)op, xa[i], xb[i]));
                }
            }
        }
        /* SUM and PROD carry NaN by IEEE arithmetic; check it survives the
         * conversions too */
        assert_int_equal(dsim_reduce_local3(o, a, b, 6, t, DSIM_SUM), DSIM_OK);
        assert_true(isnan(dsim_dtype_get(t, o, 0)) && isnan(dsim_dtype_get(t, o, 2)));
    }
}

/* Integer SUM and PROD wrap modulo 2^bits; computed without signed overflow
 * (UBSan would report it). Every operand form is exercised: distinct,
 * out == a, out == b, out == a == b. */
static void test_integer_wrap(void **state)
{
    (void)state;
    int32_t a32[6] = {INT32_MAX, INT32_MIN, 65536, INT32_MIN, INT32_MAX, -7};
    int32_t b32[6] = {1, -1, 65536, -1, INT32_MAX, 3};
    int32_t s32[6] = {INT32_MIN, INT32_MAX, 131072, INT32_MAX, -2, -4};
    int32_t p32[6] = {INT32_MAX, INT32_MIN, 0, INT32_MIN, 1, -21};
    int32_t o32[6], t32[6];
    for (int form = 0; form < 3; form++) {
        for (int op = 0; op < 2; op++) {
            dsim_op o = op ? DSIM_PROD : DSIM_SUM;
            const int32_t *want = op ? p32 : s32;
            if (form == 0) {
                assert_int_equal(dsim_reduce_local3(o32, a32, b32, 6, DSIM_I32, o), DSIM_OK);
            } else if (form == 1) {
                memcpy(o32, a32, sizeof o32);
                assert_int_equal(dsim_reduce_local3(o32, o32, b32, 6, DSIM_I32, o), DSIM_OK);
            } else {
                memcpy(o32, b32, sizeof o32);
                assert_int_equal(dsim_reduce_local3(o32, a32, o32, 6, DSIM_I32, o), DSIM_OK);
            }
            assert_memory_equal(o32, want, sizeof o32);
        }
    }
    memcpy(t32, a32, sizeof t32);
    assert_int_equal(dsim_reduce_local3(t32, t32, t32, 6, DSIM_I32, DSIM_SUM), DSIM_OK);
    assert_int_equal(t32[0], -2);
    assert_int_equal(t32[1], 0);

    int64_t a64[4] = {INT64_MAX, INT64_MIN, INT64_C(1) << 32, INT64_MIN};
    int64_t b64[4] = {1, -1, INT64_C(1) << 32, -1};
    int64_t s64[4] = {INT64_MIN, INT64_MAX, INT64_C(1) << 33, INT64_MAX};
    int64_t p64[4] = {INT64_MAX, INT64_MIN, 0, INT64_MIN};
    int64_t o64[4];
    for (int form = 0; form < 3; form++) {
        for (int op = 0; op < 2; op++) {
            dsim_op o = op ? DSIM_PROD : DSIM_SUM;
            if (form == 0) {
                assert_int_equal(dsim_reduce_local3(o64, a64, b64, 4, DSIM_I64, o), DSIM_OK);
            } else if (form == 1) {
                memcpy(o64, a64, sizeof o64);
                assert_int_equal(dsim_reduce_local(o64, b64, 4, DSIM_I64, o), DSIM_OK);
            } else {
                memcpy(o64, b64, sizeof o64);
                assert_int_equal(dsim_reduce_local3(o64, a64, o64, 4, DSIM_I64, o), DSIM_OK);
            }
            assert_memory_equal(o64, op ? p64 : s64, sizeof o64);
        }
    }
    memcpy(o64, a64, sizeof o64);
    assert_int_equal(dsim_reduce_local(o64, o64, 4, DSIM_I64, DSIM_PROD), DSIM_OK);
    assert_true(o64[0] == 1 && o64[1] == 0 && o64[2] == 0);
}

static void test_mean_finish(void **state)
{
    (void)state;
    int32_t i32[8] = {-7, -6, -1, 0, 1, 6, 7, INT32_MIN};
    int32_t w32[8] = {-3, -3, 0, 0, 0, 3, 3, INT32_MIN / 2};
    assert_int_equal(dsim_reduce_finish(i32, 8, DSIM_I32, DSIM_MEAN, 2), DSIM_OK);
    assert_memory_equal(i32, w32, sizeof i32);

    int64_t i64[4] = {-8, 8, 2, INT64_MIN};
    int64_t w64[4] = {-2, 2, 0, INT64_MIN / 3};
    assert_int_equal(dsim_reduce_finish(i64, 4, DSIM_I64, DSIM_MEAN, 3), DSIM_OK);
    assert_memory_equal(i64, w64, sizeof i64);

    float f32[3] = {3.0f, -3.0f, 1.0f};
    assert_int_equal(dsim_reduce_finish(f32, 3, DSIM_F32, DSIM_MEAN, 2), DSIM_OK);
    assert_true(f32[0] == 1.5f && f32[1] == -1.5f && f32[2] == 0.5f);

    enum { N = 2500 }; /* more than one f16 block */
    double *f64 = xmalloc(N * sizeof *f64);
    uint16_t *h = xmalloc(N * 2), *bh = xmalloc(N * 2);
    for (int i = 0; i < N; i++) {
        f64[i] = i * 0.7 - 400;
        dsim_dtype_set(DSIM_F16, h, (size_t)i, i - 1000);
        dsim_dtype_set(DSIM_BF16, bh, (size_t)i, i * 3 - 100);
    }
    assert_int_equal(dsim_reduce_finish(f64, N, DSIM_F64, DSIM_MEAN, 3), DSIM_OK);
    assert_int_equal(dsim_reduce_finish(h, N, DSIM_F16, DSIM_MEAN, 3), DSIM_OK);
    assert_int_equal(dsim_reduce_finish(bh, N, DSIM_BF16, DSIM_MEAN, 3), DSIM_OK);
    for (int i = 0; i < N; i++) {
        assert_true(f64[i] == (i * 0.7 - 400) / 3.0);
        assert_int_equal(h[i], dsim_f32_to_f16((float)(i - 1000) / 3.0f));
        assert_int_equal(
            bh[i],
            dsim_f32_to_bf16(dsim_bf16_to_f32(dsim_f32_to_bf16((float)(i * 3 - 100))) / 3.0f));
    }
    /* 7/3 in f16 is 2.333984375 (0x40ab), not 7 and not 2 */
    uint16_t seven = dsim_f32_to_f16(7.0f);
    assert_int_equal(dsim_reduce_finish(&seven, 1, DSIM_F16, DSIM_MEAN, 3), DSIM_OK);
    assert_int_equal(seven, 0x40ab);

    /* other ops, and one rank, leave the buffer alone */
    int32_t keep[2] = {5, -5};
    for (int op = 0; op < DSIM_OP_COUNT; op++) {
        if (op == DSIM_MEAN)
            continue;
        assert_int_equal(dsim_reduce_finish(keep, 2, DSIM_I32, (dsim_op)op, 4), DSIM_OK);
    }
    assert_int_equal(dsim_reduce_finish(keep, 2, DSIM_I32, DSIM_MEAN, 1), DSIM_OK);
    assert_true(keep[0] == 5 && keep[1] == -5);

    assert_int_equal(dsim_reduce_finish(keep, 2, DSIM_I32, DSIM_MEAN, 0), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "nranks"));
    assert_int_equal(dsim_reduce_finish(keep, 2, DSIM_I32, DSIM_MEAN, -2), DSIM_EINVAL);
    assert_true(keep[0] == 5 && keep[1] == -5);
    free(f64);
    free(h);
    free(bh);
}

/* Fills n elements of type t with a mix of values that make operand order
 * visible: signed zeros and NaNs with different signs for float types. */
static void fill_tricky(dsim_dtype t, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double v;
        switch (lcg() % 8) {
        case 0:
            v = 0.0;
            break;
        case 1:
            v = -0.0;
            break;
        case 2:
            v = (lcg() & 1) ? NAN : -NAN;
            break;
        default:
            v = randint(-1000, 1000) / 4.0;
            break;
        }
        if (!dsim_dtype_is_float(t))
            v = randint(-100000, 100000);
        dsim_dtype_set(t, p, i, v);
    }
}

/* dsim_reduce_local3 gives the same bits whichever operands alias. */
/* Bit for bit, except that two NaNs count as equal: which operand's NaN
 * payload an addition returns is not something C promises, and gcc may swap
 * the operands of a commutative operation in one kernel form and not in
 * another (it does under --coverage). Signed zeros and every other value must
 * match exactly. */
static int same_or_both_nan(dsim_dtype dt, const void *x, const void *y, size_t n)
{
    size_t es = dsim_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)x + i * es, (const char *)y + i * es, es) == 0)
            continue;
        if (!(dsim_dtype_is_float(dt) && isnan(dsim_dtype_get(dt, x, i)) &&
              isnan(dsim_dtype_get(dt, y, i))))
            return 0;
    }
    return 1;
}

static void test_aliasing(void **state)
{
    (void)state;
    enum { N = 3001 }; /* crosses the internal block size for every dtype */
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++) {
        size_t es = dsim_dtype_size((dsim_dtype)t), len = N * es;
        char *a = xmalloc(len), *b = xmalloc(len), *ref = xmalloc(len), *x = xmalloc(len),
             *aa = xmalloc(len);
        for (int op = 0; op < DSIM_OP_COUNT; op++) {
            dsim_dtype dt = (dsim_dtype)t;
            dsim_op o = (dsim_op)op;
            fill_tricky(dt, a, N);
            fill_tricky(dt, b, N);

            assert_int_equal(dsim_reduce_local3(ref, a, b, N, dt, o), DSIM_OK);

            memcpy(x, a, len); /* out == a */
            assert_int_equal(dsim_reduce_local3(x, x, b, N, dt, o), DSIM_OK);
            if (!same_or_both_nan(dt, x, ref, N))
                fail_msg("%s %s: out == a differs", dsim_dtype_name(dt), dsim_op_name(o));

            memcpy(x, b, len); /* out == b */
            assert_int_equal(dsim_reduce_local3(x, a, x, N, dt, o), DSIM_OK);
            if (!same_or_both_nan(dt, x, ref, N))
                fail_msg("%s %s: out == b differs", dsim_dtype_name(dt), dsim_op_name(o));

            memcpy(x, a, len); /* the 2-operand call */
            assert_int_equal(dsim_reduce_local(x, b, N, dt, o), DSIM_OK);
            if (!same_or_both_nan(dt, x, ref, N))
                fail_msg("%s %s: dsim_reduce_local differs", dsim_dtype_name(dt), dsim_op_name(o));

            /* a == b (out distinct) against a separate copy of a */
            memcpy(aa, a, len);
            assert_int_equal(dsim_reduce_local3(ref, a, aa, N, dt, o), DSIM_OK);
            assert_int_equal(dsim_reduce_local3(x, a, a, N, dt, o), DSIM_OK);
            if (!same_or_both_nan(dt, x, ref, N))
                fail_msg("%s %s: a == b differs", dsim_dtype_name(dt), dsim_op_name(o));

            memcpy(x, a, len); /* out == a == b */
            assert_int_equal(dsim_reduce_local3(x, x, x, N, dt, o), DSIM_OK);
            if (!same_or_both_nan(dt, x, ref, N))
                fail_msg("%s %s: out == a == b differs", dsim_dtype_name(dt), dsim_op_name(o));

            memcpy(x, a, len);
            assert_int_equal(dsim_reduce_local(x, x, N, dt, o), DSIM_OK);
            if (!same_or_both_nan(dt, x, ref, N))
                fail_msg("%s %s: inout == in differs", dsim_dtype_name(dt), dsim_op_name(o));
        }
        free(a);
        free(b);
        free(ref);
        free(x);
        free(aa);
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    float buf[16] = {0};
    float other[8] = {0};
    assert_int_equal(dsim_reduce_local3(buf, buf, other, 4, (dsim_dtype)6, DSIM_SUM), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "dtype"));
    assert_int_equal(dsim_reduce_local3(buf, buf, other, 4, (dsim_dtype)-1, DSIM_SUM), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_local3(buf, buf, other, 4, DSIM_F32, (dsim_op)5), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "op"));
    assert_int_equal(dsim_reduce_local3(buf, buf, other, 4, DSIM_F32, (dsim_op)-1), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_local(buf, other, 4, (dsim_dtype)99, DSIM_MAX), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_local(buf, other, 4, DSIM_I32, (dsim_op)99), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_finish(buf, 4, (dsim_dtype)99, DSIM_MEAN, 2), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_finish(buf, 4, DSIM_F32, (dsim_op)99, 2), DSIM_EINVAL);

    /* NULL with elements is an error; nothing to do is not */
    assert_int_equal(dsim_reduce_local3(NULL, buf, other, 4, DSIM_F32, DSIM_SUM), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_local3(buf, buf, NULL, 4, DSIM_F32, DSIM_SUM), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_local(buf, NULL, 4, DSIM_F32, DSIM_SUM), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_finish(NULL, 4, DSIM_F32, DSIM_MEAN, 2), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_local3(NULL, NULL, NULL, 0, DSIM_F32, DSIM_SUM), DSIM_OK);
    assert_int_equal(dsim_reduce_local(NULL, NULL, 0, DSIM_F64, DSIM_PROD), DSIM_OK);

    /* partial overlap has no meaningful answer */
    assert_int_equal(dsim_reduce_local3(buf + 1, buf, other, 8, DSIM_F32, DSIM_SUM), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "overlap"));
    assert_int_equal(dsim_reduce_local3(buf, other, buf + 7, 8, DSIM_F32, DSIM_SUM), DSIM_EINVAL);
    assert_int_equal(dsim_reduce_local(buf, buf + 3, 8, DSIM_F32, DSIM_SUM), DSIM_EINVAL);
    /* adjacent is not overlapping */
    assert_int_equal(dsim_reduce_local3(buf, buf + 8, other, 8, DSIM_F32, DSIM_SUM), DSIM_OK);
}

static void test_op_names(void **state)
{
    (void)state;
    static const char *names[] = {"sum", "mean", "max", "min", "prod"};
    for (int op = 0; op < DSIM_OP_COUNT; op++) {
        dsim_op got = DSIM_OP_COUNT;
        assert_string_equal(dsim_op_name((dsim_op)op), names[op]);
        assert_int_equal(dsim_op_parse(names[op], &got), DSIM_OK);
        assert_int_equal(got, op);
    }
    dsim_op got = DSIM_SUM;
    assert_int_equal(dsim_op_parse("avg", &got), DSIM_OK);
    assert_int_equal(got, DSIM_MEAN);
    assert_int_equal(dsim_op_parse("average", &got), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "average"));
    assert_int_equal(dsim_op_parse(NULL, &got), DSIM_EINVAL);
    assert_non_null(dsim_op_name((dsim_op)17));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_vs_reference), cmocka_unit_test(test_half_rounding),
        cmocka_unit_test(test_nan_propagation),      cmocka_unit_test(test_integer_wrap),
        cmocka_unit_test(test_mean_finish),          cmocka_unit_test(test_aliasing),
        cmocka_unit_test(test_bad_arguments),        cmocka_unit_test(test_op_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
