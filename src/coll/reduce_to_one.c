/* TensorFlow's ReductionToOneDevice as an allreduce: every rank sends its
 * whole buffer to rank 0, which combines them in rank order and then copies
 * the result to every rank. 4 ranks, whole buffers:
 *
 *            rank 0              rank 1        rank 2        rank 3
 *   step 1   (+ from 1)          -> 0
 *   step 2   (+ from 2)                        -> 0
 *   step 3   (+ from 3)                                      -> 0
 *            final = ((x0+x1)+x2)+x3; MEAN divides here, once
 *   step 4   -> 1, -> 2, -> 3    (> from 0)    (> from 0)    (> from 0)
 *
 * Rank 0 combines one sender at a time, in rank order, whatever order the
 * messages arrive in, so the result does not depend on timing. Rank 0 moves
 * (n-1) whole buffers in and out: the baseline the other algorithms are
 * measured against, and what TF's MirroredStrategy falls back to. */
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

int dsim_coll_r2o_allreduce_steps(dsim_comm *c)
{
    return c->size;
}

dsim_err dsim_coll_r2o_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count)
{
    int n = x->size, r = x->rank;
    size_t all = count * x->esize;

    if (r != 0) {
        dsim_xfer out = {DSIM_XF_SEND, 0, r, (void *)sendbuf, all, NULL};
        DSIM_CHECK(dsim_coll_run(x, &out, 1));
        dsim_xfer in = {DSIM_XF_RECV, 0, n, recvbuf, all, NULL};
        return dsim_coll_run(x, &in, 1);
    }

    dsim_coll_copy(x, recvbuf, sendbuf, all);
    for (int k = 1; k < n; k++) {
        dsim_xfer in = {DSIM_XF_RECV_REDUCE, k, k, recvbuf, all, NULL};
        DSIM_CHECK(dsim_coll_run(x, &in, 1));
    }
    dsim_err e = dsim_coll_finish(x, recvbuf, count, n);
    if (e != DSIM_OK)
        return dsim_coll_fail_local(x, n - 1, e, "finishing the reduction");

    dsim_xfer *out = malloc((size_t)(n - 1) * sizeof *out);
    if (!out) {
        DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for %d transfers", n - 1);
        return dsim_coll_fail_local(x, n, DSIM_ENOMEM, "allocating");
    }
    for (int k = 1; k < n; k++)
        out[k - 1] = (dsim_xfer){DSIM_XF_SEND, k, n, recvbuf, all, NULL};
    e = dsim_coll_run(x, out, n - 1);
    free(out);
    return e;
}
