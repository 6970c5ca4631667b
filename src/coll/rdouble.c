/* Recursive doubling: every rank exchanges its whole partial result with
 * the rank at distance 1, 2, 4, ... and combines, so after log2(p) steps
 * every rank holds the whole reduction (MPICH's and Open MPI's allreduce for
 * small messages). Half the steps of the tree, whose reduce and broadcast
 * each take log2(p), with no rank idle: the latency algorithm, for buffers
 * small enough that moving the whole buffer every step costs little.
 *
 * 4 ranks; "x|y" = the pair's two partial results combined as (the lower
 * ranks' half) op (the higher ranks' half):
 *
 *            rank 0          rank 1          rank 2          rank 3
 *   step 1   <-> 1           <-> 0           <-> 3           <-> 2
 *            x0|x1           x0|x1           x2|x3           x2|x3
 *   step 2   <-> 2           <-> 3           <-> 0           <-> 1
 *            (x0|x1)|(x2|x3) on every rank; MEAN divides here, on each
 *
 * Every rank computes every element, so every rank must compute it the same
 * way: both ranks of a pair combine in one order, the lower rank's operand
 * on the left, which makes the two results the same bits for every op and
 * dtype (NaN payloads and max(+0, -0) included), not only where the op
 * commutes. The partner's result arrives in scratch and is combined locally
 * once both transfers are done (a combining receive would combine in this
 * rank's order, and would write the buffer the send is reading): three
 * buffers of the message's size a call, which small messages, what it is
 * for, do not notice.
 *
 * Any other rank count n: p = the largest power of two <= n, rem = n - p;
 * as in rhd.c, the even rank of each of the first rem pairs sends its
 * buffer to its odd neighbour (step 1), which combines (even | odd) and
 * joins the p ranks under new rank r / 2 (the others under r - rem); at the
 * end each odd rank sends the result back (the last step). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

int dsim_coll_rd_allreduce_steps(dsim_comm *c)
{
    int levels, p = dsim_coll_pow2_floor(c->size, &levels);
    return levels + (c->size > p ? 2 : 0);
}

/* out = lo (op) hi, on a communicator that moves payloads. */
static dsim_err rd_combine(dsim_coll *x, void *out, const void *lo, const void *hi, size_t count,
                           int step)
{
    dsim_err e = dsim_reduce_local3(out, lo, hi, count, x->t, x->op);
    return e == DSIM_OK ? e : dsim_coll_fail_local(x, step, e, "combining");
}

dsim_err dsim_coll_rd_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count)
{
    int n = x->size, r = x->rank, levels;
    int p = dsim_coll_pow2_floor(n, &levels);
    int rem = n - p, pre = rem > 0 ? 1 : 0, last = x->nsteps;
    size_t all = count * x->esize;
    dsim_err e = DSIM_OK;

    if (r < 2 * rem && r % 2 == 0) {
        dsim_xfer out = {DSIM_XF_SEND, r + 1, 1, (void *)sendbuf, all, NULL};
        DSIM_CHECK(dsim_coll_run(x, &out, 1));
        dsim_xfer in = {DSIM_XF_RECV, r + 1, last, recvbuf, all, NULL};
        return dsim_coll_run(x, &in, 1);
    }
    /* Three buffers of the same alignment: this rank's partial result (A),
     * the partner's (R) and the combination (B), which becomes A. Every
     * combine is the same call on both ranks of a pair, out = lower (op)
     * higher into a third buffer, so that the two compute the same bits even
     * where the compiler may swap the operands of a + (NaN payloads). A
     * virtual communicator writes nothing: recvbuf stands for all three. */
    int real = all && !(x->c->virt && !x->real);
    size_t al = (all + 63) / 64 * 64;
    char *mem = NULL, *A = recvbuf, *R = recvbuf, *B = recvbuf;
    if (real) {
        mem = al >= all && al <= SIZE_MAX / 3 ? aligned_alloc(64, 3 * al) : NULL;
        if (!mem) {
            DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for 3 x %zu bytes of scratch", all);
            return dsim_coll_fail_local(x, 1, DSIM_ENOMEM, "allocating");
        }
        A = mem;
        R = mem + al;
        B = mem + 2 * al;
        memcpy(A, sendbuf, all);
    }
    int nr = r - rem;
    if (r < 2 * rem) {
        dsim_xfer in = {DSIM_XF_RECV, r - 1, 1, R, all, NULL};
        e = dsim_coll_run(x, &in, 1);
        if (e == DSIM_OK && real)
            e = rd_combine(x, B, R, A, count, 1);
        char *t = A;
        A = B;
        B = t;
        nr = r / 2;
    }
    for (int k = 0; k < levels && e == DSIM_OK; k++) {
        int d = 1 << k, peer = dsim_coll_fold_real(nr ^ d, rem);
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV, peer, pre + 1 + k, R, all, NULL},
            {DSIM_XF_SEND, peer, pre + 1 + k, A, all, NULL},
        };
        e = dsim_coll_run(x, xf, 2);
        if (e == DSIM_OK && real)
            e = (nr & d) ? rd_combine(x, B, R, A, count, pre + 1 + k)
                         : rd_combine(x, B, A, R, count, pre + 1 + k);
        char *t = A;
        A = B;
        B = t;
    }
    if (e == DSIM_OK && real)
        memcpy(recvbuf, A, all);
    free(mem);
    if (e != DSIM_OK)
        return e;
    e = dsim_coll_finish(x, recvbuf, count, n);
    if (e != DSIM_OK)
        return dsim_coll_fail_local(x, pre + levels, e, "finishing the reduction");
    if (r < 2 * rem) {
        dsim_xfer out = {DSIM_XF_SEND, r - 1, last, recvbuf, all, NULL};
        DSIM_CHECK(dsim_coll_run(x, &out, 1));
    }
    return DSIM_OK;
}
