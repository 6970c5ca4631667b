#include "coll_data.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define DATA_OFF 128
static uint64_t data_enc[DSIM_DTYPE_COUNT][2 * DATA_OFF + 1];

void coll_data_init(void)
{
    for (int t = 0; t < DSIM_DTYPE_COUNT; t++)
        for (int v = -DATA_OFF; v <= DATA_OFF; v++) {
            uint64_t bits = 0;
            dsim_dtype_set((dsim_dtype)t, &bits, 0, (double)v);
            data_enc[t][v + DATA_OFF] = bits;
        }
}

int coll_val(dsim_op op, int r, size_t i)
{
    if (op == DSIM_PROD) {
        if ((3 * i + (size_t)r) % 5 == 0)
            return 2;
        return (i + 2 * (size_t)r) % 3 == 0 ? -1 : 1;
    }
    return (int)((i * 7 + (size_t)r * 13) % 11) - 5;
}

static void data_put(size_t es, void *buf, size_t j, uint64_t bits)
{
    switch (es) {
    case 2:
        ((uint16_t *)buf)[j] = (uint16_t)bits;
        break;
    case 4:
        ((uint32_t *)buf)[j] = (uint32_t)bits;
        break;
    default:
        ((uint64_t *)buf)[j] = bits;
        break;
    }
}

static uint64_t data_get(size_t es, const void *buf, size_t j)
{
    switch (es) {
    case 2:
        return ((const uint16_t *)buf)[j];
    case 4:
        return ((const uint32_t *)buf)[j];
    default:
        return ((const uint64_t *)buf)[j];
    }
}

void coll_fill(dsim_dtype t, dsim_op op, int r, void *buf, size_t first, size_t count)
{
    size_t es = dsim_dtype_size(t);
    for (size_t j = 0; j < count; j++)
        data_put(es, buf, j, data_enc[t][coll_val(op, r, first + j) + DATA_OFF]);
}

static int data_precision(dsim_dtype t)
{
    switch (t) {
    case DSIM_F32:
        return 24;
    case DSIM_F64:
        return 53;
    case DSIM_F16:
        return 11;
    default:
        return 8;
    }
}

long coll_check(dsim_dtype t, dsim_op op, int n, const void *got, size_t first, size_t count,
                char *msg, size_t msgsz)
{
    size_t es = dsim_dtype_size(t);
    int is_float = dsim_dtype_is_float(t);
    double tol = ldexp(1.0, 1 - data_precision(t));
    for (size_t j = 0; j < count; j++) {
        size_t i = first + j;
        long acc = coll_val(op, 0, i);
        for (int r = 1; r < n; r++) {
            int v = coll_val(op, r, i);
            switch (op) {
            case DSIM_MAX:
                acc = v > acc ? v : acc;
                break;
            case DSIM_MIN:
                acc = v < acc ? v : acc;
                break;
            case DSIM_PROD:
                acc *= v;
                break;
            default:
                acc += v;
                break;
            }
        }
        if (op == DSIM_MEAN && is_float) {
            double want = (double)acc / n;
            double have = dsim_dtype_get(t, got, j);
            if (!(fabs(have - want) <= fabs(want) * tol)) {
                snprintf(msg, msgsz,
                         "%s mean over %d ranks, element %zu: got %.17g, want %.17g within "
                         "1 ulp",
                         dsim_dtype_name(t), n, i, have, want);
                return (long)j;
            }
            continue;
        }
        if (op == DSIM_MEAN)
            acc /= n; /* C truncates toward zero, as TensorFlow does */
        uint64_t want = data_enc[t][acc + DATA_OFF];
        uint64_t have = data_get(es, got, j);
        if (have != want) {
            snprintf(msg, msgsz,
                     "%s %s over %d ranks, element %zu: got %.17g (bits 0x%llx), want %ld "
                     "(bits 0x%llx)",
                     dsim_dtype_name(t), dsim_op_name(op), n, i, dsim_dtype_get(t, got, j),
                     (unsigned long long)have, acc, (unsigned long long)want);
            return (long)j;
        }
    }
    return -1;
}

long coll_check_vals(dsim_dtype t, dsim_op op, int r, const void *buf, size_t first, size_t count,
                     char *msg, size_t msgsz)
{
    size_t es = dsim_dtype_size(t);
    for (size_t j = 0; j < count; j++) {
        uint64_t want = data_enc[t][coll_val(op, r, first + j) + DATA_OFF];
        uint64_t have = data_get(es, buf, j);
        if (have != want) {
            snprintf(msg, msgsz, "%s element %zu of rank %d's data: got bits 0x%llx, want %d",
                     dsim_dtype_name(t), first + j, r, (unsigned long long)have,
                     coll_val(op, r, first + j));
            return (long)j;
        }
    }
    return -1;
}
