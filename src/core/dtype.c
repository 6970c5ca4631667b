/* Element types and the conversions between them.
 *
 * The f16/bf16 conversions live in dtype_conv.h, shared with the device
 * kernels (the C compiler and nvcc compile the same functions); they are
 * branch-free so that the bulk loops in dsim_convert vectorise, and the
 * reduction kernels for f16/bf16 go through those loops block by block. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "dsim/dtype.h"
#include "dsim/err.h"

/* gcc 12 vectorises at -O2 only with the "very cheap" cost model, which
 * gives up on any loop whose trip count is unknown; the conversion loops
 * below are worth the full vectoriser. Without no-trapping-math gcc will not
 * if-convert a select whose arm holds a float add (the add might trap), and
 * a loop with control flow does not vectorise. dsim never unmasks floating
 * point traps, and the option changes no result. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")
#endif

#include "dtype_conv.h"

/* Round to odd (truncate, then set the last bit if anything was dropped).
 * Rounding a wider value to odd at p+2 or more bits and then to nearest even
 * at p bits gives the same result as rounding to nearest even at p bits at
 * once; plain nearest-even twice does not (it can round a near-tie the wrong
 * way). binary32 has 24 bits, enough for f16 (11) and bf16 (8), including
 * their subnormal ranges. */
static float dtype_f64_to_f32_odd(double d)
{
    float f = (float)d;
    double back = f;
    if (back == d || d != d)
        return f;
    uint32_t u = dtype_f32_bits(f);
    if (fabs(back) > fabs(d))
        u -= 1; /* it rounded away from zero: step back toward zero */
    return dtype_f32_from_bits(u | 1u);
}

/* int64 to double, rounded to odd at 53 bits (see above). */
static double dtype_i64_to_f64_odd(int64_t v)
{
    uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    if (m < (UINT64_C(1) << 53))
        return (double)v;
    int shift = 64 - __builtin_clzll(m) - 53;
    uint64_t sticky = (m & ((UINT64_C(1) << shift) - 1u)) != 0;
    double d = ldexp((double)((m >> shift) | sticky), shift);
    return v < 0 ? -d : d;
}

uint16_t dsim_f32_to_f16(float f)
{
    return dtype_f32_to_f16(f);
}

float dsim_f16_to_f32(uint16_t h)
{
    return dtype_f16_to_f32(h);
}

uint16_t dsim_f32_to_bf16(float f)
{
    return dtype_f32_to_bf16(f);
}

float dsim_bf16_to_f32(uint16_t b)
{
    return dtype_bf16_to_f32(b);
}

double dsim_dtype_round(dsim_dtype t, double v)
{
    switch (t) {
    case DSIM_F16:
        return dtype_f16_to_f32(dtype_f32_to_f16(dtype_f64_to_f32_odd(v)));
    case DSIM_BF16:
        return dtype_bf16_to_f32(dtype_f32_to_bf16(dtype_f64_to_f32_odd(v)));
    case DSIM_F32:
        return (double)(float)v;
    case DSIM_F64:
    case DSIM_I32:
    case DSIM_I64:
    case DSIM_DTYPE_COUNT:
        break;
    }
    return v;
}

void dsim_dtype_round_n(dsim_dtype t, double *v, size_t n)
{
    switch (t) {
    case DSIM_F16:
        for (size_t i = 0; i < n; i++)
            v[i] = dtype_f16_to_f32(dtype_f32_to_f16(dtype_f64_to_f32_odd(v[i])));
        return;
    case DSIM_BF16:
        for (size_t i = 0; i < n; i++)
            v[i] = dtype_bf16_to_f32(dtype_f32_to_bf16(dtype_f64_to_f32_odd(v[i])));
        return;
    case DSIM_F32:
        for (size_t i = 0; i < n; i++)
            v[i] = (double)(float)v[i];
        return;
    case DSIM_F64:
    case DSIM_I32:
    case DSIM_I64:
    case DSIM_DTYPE_COUNT:
        break;
    }
}

double dsim_dtype_unit_roundoff(dsim_dtype t)
{
    switch (t) {
    case DSIM_F16:
        return 0x1p-11;
    case DSIM_BF16:
        return 0x1p-8;
    case DSIM_F32:
        return 0x1p-24;
    case DSIM_F64:
        return 0x1p-53;
    case DSIM_I32:
    case DSIM_I64:
    case DSIM_DTYPE_COUNT:
        break;
    }
    return 0.0;
}

static const struct {
    const char *name;
    const char *short_name;
    size_t size;
    int is_float;
} dtype_info[DSIM_DTYPE_COUNT] = {
    [DSIM_F32] = {"float", "f32", 4, 1}, [DSIM_F64] = {"double", "f64", 8, 1},
    [DSIM_F16] = {"half", "f16", 2, 1},  [DSIM_BF16] = {"bfloat16", "bf16", 2, 1},
    [DSIM_I32] = {"int32", "i32", 4, 0}, [DSIM_I64] = {"int64", "i64", 8, 0},
};

static int dtype_valid(dsim_dtype t)
{
    return (unsigned)t < DSIM_DTYPE_COUNT;
}

size_t dsim_dtype_size(dsim_dtype t)
{
    return dtype_valid(t) ? dtype_info[t].size : 0;
}

const char *dsim_dtype_name(dsim_dtype t)
{
    return dtype_valid(t) ? dtype_info[t].name : "invalid";
}

int dsim_dtype_is_float(dsim_dtype t)
{
    return dtype_valid(t) ? dtype_info[t].is_float : 0;
}

dsim_err dsim_dtype_parse(const char *s, dsim_dtype *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_dtype_parse: %s is NULL", s ? "out" : "the name");
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++) {
        if (!strcasecmp(s, dtype_info[t].name) || !strcasecmp(s, dtype_info[t].short_name)) {
            *out = (dsim_dtype)t;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "unknown dtype '%s': use one of float, double, half, bfloat16, int32, int64 "
                    "(or f32, f64, f16, bf16, i32, i64)",
                    s);
}

static int32_t dtype_sat_i32(double v)
{
    if (v != v)
        return 0;
    if (v >= 2147483648.0)
        return INT32_MAX;
    if (v <= -2147483649.0)
        return INT32_MIN;
    return (int32_t)v; /* truncates toward zero */
}

static int64_t dtype_sat_i64(double v)
{
    if (v != v)
        return 0;
    if (v >= 9223372036854775808.0)
        return INT64_MAX;
    if (v < -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

double dsim_dtype_get(dsim_dtype t, const void *buf, size_t i)
{
    if (!buf)
        return NAN;
    switch (t) {
    case DSIM_F32:
        return ((const float *)buf)[i];
    case DSIM_F64:
        return ((const double *)buf)[i];
    case DSIM_F16:
        return dtype_f16_to_f32(((const uint16_t *)buf)[i]);
    case DSIM_BF16:
        return dtype_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DSIM_I32:
        return ((const int32_t *)buf)[i];
    case DSIM_I64:
        return (double)((const int64_t *)buf)[i];
    default:
        return NAN;
    }
}

/* NaN stored into an integer type becomes 0 (there is no integer NaN). */
void dsim_dtype_set(dsim_dtype t, void *buf, size_t i, double v)
{
    if (!buf)
        return;
    switch (t) {
    case DSIM_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case DSIM_F64:
        ((double *)buf)[i] = v;
        break;
    case DSIM_F16:
        ((uint16_t *)buf)[i] = dtype_f32_to_f16(dtype_f64_to_f32_odd(v));
        break;
    case DSIM_BF16:
        ((uint16_t *)buf)[i] = dtype_f32_to_bf16(dtype_f64_to_f32_odd(v));
        break;
    case DSIM_I32:
        ((int32_t *)buf)[i] = dtype_sat_i32(v);
        break;
    case DSIM_I64:
        ((int64_t *)buf)[i] = dtype_sat_i64(v);
        break;
    default:
        break;
    }
}

static void dtype_f16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dtype_f16_to_f32(src[i]);
}

static void dtype_f32_to_f16_n(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dtype_f32_to_f16(src[i]);
}

static void dtype_bf16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dtype_bf16_to_f32(src[i]);
}

static void dtype_f32_to_bf16_n(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dtype_f32_to_bf16(src[i]);
}

static void dtype_f32_to_f64_n(double *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i];
}

static void dtype_f64_to_f32_n(float *restrict dst, const double *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (float)src[i];
}

/* The general path goes element by element through a double, which holds
 * every f16, bf16, f32 and i32 value exactly. An int64 may not fit, so a
 * narrower float target takes it rounded to odd (or converts directly to
 * f32), to round only once in effect. */
static void dtype_convert_slow(void *dst, dsim_dtype dt, const void *src, dsim_dtype st, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (st == DSIM_I64 && dt == DSIM_F32) {
            ((float *)dst)[i] = (float)((const int64_t *)src)[i];
        } else if (st == DSIM_I64 && (dt == DSIM_F16 || dt == DSIM_BF16)) {
            dsim_dtype_set(dt, dst, i, dtype_i64_to_f64_odd(((const int64_t *)src)[i]));
        } else {
            dsim_dtype_set(dt, dst, i, dsim_dtype_get(st, src, i));
        }
    }
}

dsim_err dsim_convert(void *dst, dsim_dtype dt, const void *src, dsim_dtype st, size_t n)
{
    if (!dtype_valid(dt) || !dtype_valid(st))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_convert: invalid %s dtype %d (valid: 0..%d)",
                        dtype_valid(dt) ? "source" : "destination",
                        (int)(dtype_valid(dt) ? st : dt), DSIM_DTYPE_COUNT - 1);
    if (n == 0)
        return DSIM_OK;
    if (!dst || !src)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_convert: %s buffer is NULL with %zu elements",
                        dst ? "source" : "destination", n);
    if (n > SIZE_MAX / 8)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_convert: element count %zu is too large", n);

    if (dt == st) {
        memcpy(dst, src, n * dtype_info[dt].size);
    } else if (st == DSIM_F16 && dt == DSIM_F32) {
        dtype_f16_to_f32_n(dst, src, n);
    } else if (st == DSIM_F32 && dt == DSIM_F16) {
        dtype_f32_to_f16_n(dst, src, n);
    } else if (st == DSIM_BF16 && dt == DSIM_F32) {
        dtype_bf16_to_f32_n(dst, src, n);
    } else if (st == DSIM_F32 && dt == DSIM_BF16) {
        dtype_f32_to_bf16_n(dst, src, n);
    } else if (st == DSIM_F32 && dt == DSIM_F64) {
        dtype_f32_to_f64_n(dst, src, n);
    } else if (st == DSIM_F64 && dt == DSIM_F32) {
        dtype_f64_to_f32_n(dst, src, n);
    } else {
        dtype_convert_slow(dst, dt, src, st, n);
    }
    return DSIM_OK;
}
