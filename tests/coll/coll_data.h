/* Verifiable collective inputs (nccl-tests style): every rank's element i is
 * a small integer given by a formula, chosen so that every partial and final
 * result is exactly representable in every dtype (bf16 has 8 significant
 * bits: sums stay within +-80, products within +-16). The exact result of
 * any reduction is therefore known, whatever the combination order. */
#ifndef DSIM_TESTS_COLL_DATA_H
#define DSIM_TESTS_COLL_DATA_H

#include <stddef.h>

#include "dsim/dtype.h"
#include "dsim/reduce.h"

/* Builds the encoding tables; call once from the main thread first. */
void coll_data_init(void);
/* Rank r's value at element i (prod: -1, 1 or 2, at most 4 twos over 16
 * ranks; the others: -5 .. 5). */
int coll_val(dsim_op op, int r, size_t i);
/* buf[j] = coll_val(op, r, first + j) for j < count. */
void coll_fill(dsim_dtype t, dsim_op op, int r, void *buf, size_t first, size_t count);
/* Checks got[j] against the reduction over ranks 0..n-1 of element first + j:
 * bit for bit, except MEAN on floats, which must be within 1 ulp of the exact
 * mean (|got - sum/n| <= |sum/n| * 2^(1-p), p the dtype's precision; integer
 * MEAN truncates toward zero and is exact). Returns the first bad j, or -1;
 * msg says what was wrong. */
long coll_check(dsim_dtype t, dsim_op op, int n, const void *got, size_t first, size_t count,
                char *msg, size_t msgsz);
/* Checks buf[j] == coll_val(op, r, first + j) bit for bit. */
long coll_check_vals(dsim_dtype t, dsim_op op, int r, const void *buf, size_t first, size_t count,
                     char *msg, size_t msgsz);

#endif
