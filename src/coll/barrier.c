/* Dissemination barrier (Hensgen, Finkel, Manber): at step k every rank
 * sends a token to rank + 2^k and waits for one from rank - 2^k. After
 * ceil(log2 n) steps every rank has heard, directly or through others, from
 * every rank, so none leaves before all have arrived. 4 ranks:
 *
 *            rank 0     rank 1     rank 2     rank 3
 *   step 1   -> 1       -> 2       -> 3       -> 0       (each waits for rank - 1)
 *   step 2   -> 2       -> 3       -> 0       -> 1       (each waits for rank - 2)
 *
 * No root and no second phase: half the steps of a reduce + broadcast. */
#include "coll_int.h"

static const char barrier_token = 1;

int dsim_coll_barrier_steps(int size)
{
    return dsim_coll_ceil_log2(size);
}

dsim_err dsim_coll_dissemination_barrier(dsim_coll *x)
{
    int n = x->size, r = x->rank;
    char in = 0;
    for (int k = 0; (1 << k) < n; k++) {
        int d = 1 << k;
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV, (r - d + n) % n, k + 1, &in, 1, NULL},
            {DSIM_XF_SEND, (r + d) % n, k + 1, (void *)&barrier_token, 1, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }
    return DSIM_OK;
}
