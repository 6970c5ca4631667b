/* Element types and conversions between them. */
#ifndef DSIM_DTYPE_H
#define DSIM_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_dtype {
    DSIM_F32 = 0,
    DSIM_F64,
    DSIM_F16,  /* IEEE 754 binary16, stored as uint16_t */
    DSIM_BF16, /* bfloat16, stored as uint16_t */
    DSIM_I32,
    DSIM_I64,
    DSIM_DTYPE_COUNT
} dsim_dtype;

/* Bytes per element; 0 for an invalid dtype. */
DSIM_API size_t dsim_dtype_size(dsim_dtype t);
/* nccl-tests' names: "float", "double", "half", "bfloat16", "int32", "int64". */
DSIM_API const char *dsim_dtype_name(dsim_dtype t);
/* Accepts the names above and the short forms f32 f64 f16 bf16 i32 i64. */
DSIM_API dsim_err dsim_dtype_parse(const char *s, dsim_dtype *out);
DSIM_API int dsim_dtype_is_float(dsim_dtype t);

/* Round-to-nearest-even conversions; NaN stays NaN, overflow goes to inf. */
DSIM_API uint16_t dsim_f32_to_f16(float f);
DSIM_API float dsim_f16_to_f32(uint16_t h);
DSIM_API uint16_t dsim_f32_to_bf16(float f);
DSIM_API float dsim_bf16_to_f32(uint16_t b);

/* Element i of buf as a double, and the reverse (rounded / truncated toward
 * zero for integers, saturating at the type's range). For tests and checks,
 * not for hot loops. */
DSIM_API double dsim_dtype_get(dsim_dtype t, const void *buf, size_t i);
DSIM_API void dsim_dtype_set(dsim_dtype t, void *buf, size_t i, double v);

/* Converts n elements of type st at src into type dt at dst (no overlap). */
DSIM_API dsim_err dsim_convert(void *dst, dsim_dtype dt, const void *src, dsim_dtype st, size_t n);

/* Mixed precision's rounding hooks (dsim/precision.h): v rounded once, to
 * nearest even, to a value of type t, and given back as a double. F16 and
 * BF16 round as the conversions above (overflow to inf, NaN stays NaN), F32
 * as a cast to float; F64 and the integer types return v unchanged. A value
 * held in a double is rounded to odd at float's 24 bits first, so that the
 * two steps round as one would (see dtype.c). */
DSIM_API double dsim_dtype_round(dsim_dtype t, double v);
/* The same on n doubles in place. */
DSIM_API void dsim_dtype_round_n(dsim_dtype t, double *v, size_t n);
/* The unit roundoff u of a float type, the largest relative error of one
 * rounding to nearest: 2^-11 (F16: 11 significant bits), 2^-8 (BF16: 8),
 * 2^-24 (F32), 2^-53 (F64); 0 for the integer types. */
DSIM_API double dsim_dtype_unit_roundoff(dsim_dtype t);

#ifdef __cplusplus
}
#endif
#endif
