/* Helpers shared by the device tests: a deterministic generator, random
 * inputs per dtype (with the special values that make reductions differ),
 * the reference fold through dsim_reduce_local, and error-message checks. */
#ifndef DSIM_TEST_DEV_COMMON_H
#define DSIM_TEST_DEV_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/device.h"
#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/reduce.h"

static uint64_t dev_lcg_state = 0x9e3779b97f4a7c15ull;

static inline uint64_t dev_rand(void)
{
    dev_lcg_state ^= dev_lcg_state << 13;
    dev_lcg_state ^= dev_lcg_state >> 7;
    dev_lcg_state ^= dev_lcg_state << 17;
    return dev_lcg_state;
}

/* A float in [-lim, lim] with all its bits random below that. */
static inline double dev_rand_real(double lim)
{
    return ((double)(dev_rand() >> 11) / 9007199254740992.0 * 2.0 - 1.0) * lim;
}

/* n random elements of t into buf. Floats: mostly in [-4, 4] ([0.25, 2] in
 * magnitude for PROD, so that products of many stay finite), 1 in 32 a
 * special value: NaN, +-inf, -0, or a value near the bottom of the range
 * (f16 subnormals). Integers: any bits, so that SUM and PROD wrap. */
static inline void dev_fill(dsim_dtype t, void *buf, size_t n, dsim_op op)
{
    static const double specials[] = {NAN, INFINITY, -INFINITY, -0.0, 5.96e-8, -6.1e-5, 1e-39};
    for (size_t i = 0; i < n; i++) {
        if (t == DSIM_I32) {
            ((int32_t *)buf)[i] = (int32_t)(uint32_t)dev_rand();
        } else if (t == DSIM_I64) {
            ((int64_t *)buf)[i] = (int64_t)dev_rand();
        } else if (dev_rand() % 32 == 0) {
            dsim_dtype_set(t, buf, i, specials[dev_rand() % 7]);
        } else if (op == DSIM_PROD) {
            double m = 0.25 + (dev_rand_real(1.0) + 1.0) * 0.875;
            dsim_dtype_set(t, buf, i, dev_rand() & 1 ? m : -m);
        } else {
            dsim_dtype_set(t, buf, i, dev_rand_real(4.0));
        }
    }
}

/* out = ((ins[0] op ins[1]) op ins[2]) ... with the host library's kernels:
 * what every device backend must produce, bit for bit. */
static inline void dev_ref_fold(void *out, void *const *ins, int n, size_t count, dsim_dtype t,
                                dsim_op op)
{
    memcpy(out, ins[0], count * dsim_dtype_size(t));
    for (int k = 1; k < n; k++)
        if (dsim_reduce_local(out, ins[k], count, t, op) != DSIM_OK)
            abort();
}

/* The first element where a and b differ in bits (two NaNs count as equal:
 * which NaN an operation makes is not specified), or -1. */
static inline long dev_diff(dsim_dtype t, const void *a, const void *b, size_t count)
{
    size_t es = dsim_dtype_size(t);
    for (size_t i = 0; i < count; i++) {
        if (memcmp((const char *)a + i * es, (const char *)b + i * es, es) == 0)
            continue;
        if (dsim_dtype_is_float(t) && isnan(dsim_dtype_get(t, a, i)) &&
            isnan(dsim_dtype_get(t, b, i)))
            continue;
        fprintf(stderr, "%s element %zu: %.9g != %.9g\n", dsim_dtype_name(t), i,
                dsim_dtype_get(t, a, i), dsim_dtype_get(t, b, i));
        return (long)i;
    }
    return -1;
}

/* Non-zero when the calling thread's last error message holds s. */
static inline int dev_msg_has(const char *s)
{
    if (strstr(dsim_errmsg(), s))
        return 1;
    fprintf(stderr, "expected '%s' in the error message, got: %s\n", s, dsim_errmsg());
    return 0;
}

static const dsim_dtype dev_all_types[] = {DSIM_F32,  DSIM_F64, DSIM_F16,
                                           DSIM_BF16, DSIM_I32, DSIM_I64};
static const dsim_op dev_all_ops[] = {DSIM_SUM, DSIM_MEAN, DSIM_MAX, DSIM_MIN, DSIM_PROD};

#endif
