/* Element-wise reduction kernels. */
#ifndef DSIM_REDUCE_H
#define DSIM_REDUCE_H

#include <stddef.h>

#include "dsim/api.h"
#include "dsim/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_op {
    DSIM_SUM = 0,
    DSIM_MEAN, /* combined as SUM, then divided by the rank count once */
    DSIM_MAX,
    DSIM_MIN,
    DSIM_PROD,
    DSIM_OP_COUNT
} dsim_op;

/* "sum", "mean"/"avg", "max", "min", "prod". */
DSIM_API const char *dsim_op_name(dsim_op op);
DSIM_API dsim_err dsim_op_parse(const char *s, dsim_op *out);

/* inout[i] = inout[i] (op) in[i], for count elements. MEAN combines as SUM.
 * f16/bf16 combine in float and round once per call. */
DSIM_API dsim_err dsim_reduce_local(void *inout, const void *in, size_t count, dsim_dtype t,
                                    dsim_op op);

/* out[i] = a[i] (op) b[i]; out may alias a or b. */
DSIM_API dsim_err dsim_reduce_local3(void *out, const void *a, const void *b, size_t count,
                                     dsim_dtype t, dsim_op op);

/* Finishes a reduction over nranks contributions: MEAN divides by nranks
 * (integers truncate toward zero, as TensorFlow does); other ops do nothing. */
DSIM_API dsim_err dsim_reduce_finish(void *buf, size_t count, dsim_dtype t, dsim_op op, int nranks);

#ifdef __cplusplus
}
#endif
#endif
