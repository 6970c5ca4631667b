/* Binomial trees: reduce to a root, broadcast from a root, and allreduce as
 * reduce to rank 0 followed by broadcast from rank 0.
 *
 * Ranks are renumbered relative to the root (v = rank - root mod n). In the
 * reduce, at step k (distance 2^k) every rank whose bit k is set sends its
 * partial result to v - 2^k and is done; the others combine what v + 2^k
 * sends (dsim_irecv_reduce), one child after the other, so the combination
 * order is fixed. The broadcast runs the same tree backwards. Allreduce on 4
 * ranks (root 0), whole buffers, "+" = combined on arrival, ">" = copied:
 *
 *            rank 0         rank 1        rank 2         rank 3
 *   step 1   (+ from 1)     -> 0          (+ from 3)     -> 2          reduce
 *   step 2   (+ from 2)                   -> 0
 *            final = (x0+x1)+(x2+x3); MEAN divides here, once
 *   step 3   -> 2                         (> from 0)                   broadcast
 *   step 4   -> 1           (> from 0)    -> 3           (> from 2)
 *
 * ceil(log2 n) steps each way, every one moving the whole buffer: the right
 * choice for small buffers, where the step count matters more than bytes. */
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

static int tree_log2_exact(int v)
{
    int k = 0;
    while ((1 << k) < v)
        k++;
    return k;
}

/* Binomial reduce of count elements toward root, steps step0+1 ..
 * step0+levels. acc is where this rank combines (recvbuf, or NULL: allocate
 * scratch if this rank has children). The root's result ends in acc, finished
 * (MEAN) when finish is set. */
static dsim_err tree_reduce(dsim_coll *x, const void *sendbuf, void *acc, size_t count, int root,
                            int step0, int finish)
{
    int n = x->size, levels = dsim_coll_ceil_log2(n);
    int v = (x->rank - root + n) % n;
    size_t all = count * x->esize;
    const void *cur = sendbuf;
    char *scratch = NULL;
    dsim_err e = DSIM_OK;

    for (int k = 0; k < levels && e == DSIM_OK; k++) {
        int mask = 1 << k;
        if (v & mask) {
            dsim_xfer out = {DSIM_XF_SEND, (v - mask + root) % n, step0 + k + 1, (void *)cur, all,
                             NULL};
            e = dsim_coll_run(x, &out, 1);
            break;
        }
        if (v + mask >= n)
            continue;
        if (cur == sendbuf) {
            if (!acc) {
                /* count 0: fingerprints only; virtual: nothing is written */
                acc = scratch = malloc(all && !x->c->virt ? all : 1);
                if (!scratch) {
                    DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for %zu bytes of scratch", all);
                    return dsim_coll_fail_local(x, step0 + k + 1, DSIM_ENOMEM, "allocating");
                }
            }
            dsim_coll_copy(x, acc, sendbuf, all);
            cur = acc;
        }
        dsim_xfer in = {DSIM_XF_RECV_REDUCE, (v + mask + root) % n, step0 + k + 1, acc, all, NULL};
        e = dsim_coll_run(x, &in, 1);
    }
    free(scratch);
    if (e == DSIM_OK && v == 0 && finish) {
        dsim_coll_copy(x, acc, cur, all);
        e = dsim_coll_finish(x, acc, count, n);
        if (e != DSIM_OK)
            return dsim_coll_fail_local(x, step0 + levels, e, "finishing the reduction");
    }
    return e;
}

/* Binomial broadcast of buf from root, steps step0+1 .. step0+levels. */
static dsim_err tree_bcast(dsim_coll *x, void *buf, size_t count, int root, int step0)
{
    int n = x->size, levels = dsim_coll_ceil_log2(n);
    int v = (x->rank - root + n) % n;
    size_t all = count * x->esize;
    int low = 1 << levels;
    if (v != 0) {
        low = v & -v;
        dsim_xfer in = {
            DSIM_XF_RECV, (v - low + root) % n, step0 + levels - tree_log2_exact(low), buf, all,
            NULL};
        DSIM_CHECK(dsim_coll_run(x, &in, 1));
    }
    /* At most 31 children; the largest subtree first. */
    dsim_xfer out[32];
    int m = 0;
    for (int mask = low >> 1; mask >= 1; mask >>= 1)
        if (v + mask < n)
            out[m++] = (dsim_xfer){DSIM_XF_SEND,
                                   (v + mask + root) % n,
                                   step0 + levels - tree_log2_exact(mask),
                                   buf,
                                   all,
                                   NULL};
    return m ? dsim_coll_run(x, out, m) : DSIM_OK;
}

int dsim_coll_tree_allreduce_steps(dsim_comm *c)
{
    return 2 * dsim_coll_ceil_log2(c->size);
}

dsim_err dsim_coll_tree_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count)
{
    int levels = dsim_coll_ceil_log2(x->size);
    DSIM_CHECK(tree_reduce(x, sendbuf, recvbuf, count, 0, 0, 1));
    return tree_bcast(x, recvbuf, count, 0, levels);
}

int dsim_coll_tree_reduce_steps(int size)
{
    return dsim_coll_ceil_log2(size);
}

dsim_err dsim_coll_tree_reduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count,
                               int root)
{
    /* recvbuf belongs to the caller only on the root; elsewhere it may not
     * be written, so inner ranks combine in scratch. */
    return tree_reduce(x, sendbuf, x->rank == root ? recvbuf : NULL, count, root, 0, 1);
}

int dsim_coll_tree_bcast_steps(int size)
{
    return dsim_coll_ceil_log2(size);
}

dsim_err dsim_coll_tree_bcast(dsim_coll *x, void *buf, size_t count, int root)
{
    return tree_bcast(x, buf, count, root, 0);
}
