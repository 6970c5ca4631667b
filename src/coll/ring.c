/* Ring algorithms: allreduce (reduce-scatter then all-gather), allgather and
 * reduce_scatter.
 *
 * The buffer is cut into `size` blocks (the first count % size one element
 * longer). Every rank sends to its right neighbour (rank + 1) and receives
 * from its left one (rank - 1); each step posts the receive before the send.
 * Allreduce on 4 ranks, blocks a b c d, "x+" = combined on arrival into the
 * receiver's own copy of the block (dsim_irecv_reduce), "x>" = plain copy
 * into its final place:
 *
 *            rank 0        rank 1        rank 2        rank 3
 *   step 1   a  -> 1       b  -> 2       c  -> 3       d  -> 0     reduce-
 *            (d+ from 3)   (a+ from 0)   (b+ from 1)   (c+ from 2)  scatter
 *   step 2   d  -> 1       a  -> 2       b  -> 3       c  -> 0
 *   step 3   c  -> 1       d  -> 2       a  -> 3       b  -> 0
 *            owns b        owns c        owns d        owns a      <- final,
 *                                                        MEAN divides here
 *   step 4   b  -> 1       c  -> 2       d  -> 3       a  -> 0     all-
 *            (a> from 3)   (b> from 0)   (c> from 1)   (d> from 2)  gather
 *   step 5   a  -> 1       b  -> 2       c  -> 3       d  -> 0
 *   step 6   d  -> 1       a  -> 2       b  -> 3       c  -> 0
 *
 * Block k starts at rank k and is combined in the fixed order k, k+1, ...
 * around the ring, then finished (MEAN) once, by rank k-1, its owner;
 * everyone else receives a copy of those bits, so all ranks agree bit for
 * bit and no order depends on timing. Out of place, a block is combined
 * from sendbuf into recvbuf as it arrives (dsim_irecv_reduce_from: the
 * same bits as a copy and then a combination in place), and step 1 sends
 * straight from sendbuf: no temporary buffer and no copy at all.
 *
 * Each rank sends and receives 2 (size-1)/size of the buffer, the bandwidth
 * optimum; the 2 (size-1) steps make it latency-bound for small buffers.
 *
 * reduce_scatter is the first half with a different block mapping (block k
 * must end at rank k): at step s rank r combines block r-s-2 into its own
 * contribution and sends on the partial block it finished the step before.
 * sendbuf is const, so partial blocks live in two alternating scratch blocks
 * (recvcount elements each) and the last step lands in recvbuf. allgather is
 * the second half: rank r's block travels around the ring, each copy received
 * straight into its place. */
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

static int ring_left(const dsim_coll *x)
{
    return (x->rank + x->size - 1) % x->size;
}
static int ring_right(const dsim_coll *x)
{
    return (x->rank + 1) % x->size;
}
static int ring_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

int dsim_coll_ring_allreduce_steps(dsim_comm *c)
{
    return 2 * (c->size - 1);
}

dsim_err dsim_coll_ring_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count)
{
    int n = x->size, r = x->rank;
    size_t es = x->esize;
    char *rb = recvbuf;
    const char *sb = sendbuf;
    int inplace = sendbuf == recvbuf;

    for (int s = 0; s < n - 1; s++) {
        int snd = ring_mod(r - s, n), rcv = ring_mod(r - s - 1, n);
        size_t roff = dsim_coll_block_off(count, n, rcv) * es;
        size_t rlen = dsim_coll_block_cnt(count, n, rcv) * es;
        size_t soff = dsim_coll_block_off(count, n, snd) * es;
        size_t slen = dsim_coll_block_cnt(count, n, snd) * es;
        /* out of place: the block is combined from sendbuf into recvbuf
         * as it arrives (no copy first) */
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV_REDUCE, ring_left(x), s + 1, rb + roff, rlen, inplace ? NULL : sb + roff},
            {DSIM_XF_SEND, ring_right(x), s + 1, (void *)((s == 0 ? sb : rb) + soff), slen, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }

    int own = ring_mod(r + 1, n);
    size_t ocnt = dsim_coll_block_cnt(count, n, own);
    if (ocnt) {
        dsim_err e = dsim_coll_finish(x, rb + dsim_coll_block_off(count, n, own) * es, ocnt, n);
        if (e != DSIM_OK)
            return dsim_coll_fail_local(x, n - 1, e, "finishing the reduction");
    }

    for (int s = 0; s < n - 1; s++) {
        int snd = ring_mod(r + 1 - s, n), rcv = ring_mod(r - s, n);
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV, ring_left(x), n + s, rb + dsim_coll_block_off(count, n, rcv) * es,
             dsim_coll_block_cnt(count, n, rcv) * es, NULL},
            {DSIM_XF_SEND, ring_right(x), n + s, rb + dsim_coll_block_off(count, n, snd) * es,
             dsim_coll_block_cnt(count, n, snd) * es, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }
    return DSIM_OK;
}

int dsim_coll_ring_allgather_steps(int size)
{
    return size - 1;
}

dsim_err dsim_coll_ring_allgather(dsim_coll *x, const void *sendbuf, void *recvbuf,
                                  size_t sendcount)
{
    int n = x->size, r = x->rank;
    size_t blen = sendcount * x->esize;
    char *rb = recvbuf;
    dsim_coll_copy(x, rb + (size_t)r * blen, sendbuf, blen);
    for (int s = 0; s < n - 1; s++) {
        int snd = ring_mod(r - s, n), rcv = ring_mod(r - s - 1, n);
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV, ring_left(x), s + 1, rb + (size_t)rcv * blen, blen, NULL},
            {DSIM_XF_SEND, ring_right(x), s + 1, rb + (size_t)snd * blen, blen, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }
    return DSIM_OK;
}

int dsim_coll_ring_reduce_scatter_steps(int size)
{
    return size - 1;
}

dsim_err dsim_coll_ring_reduce_scatter(dsim_coll *x, const void *sendbuf, void *recvbuf,
                                       size_t recvcount)
{
    int n = x->size, r = x->rank;
    size_t blen = recvcount * x->esize;
    const char *sb = sendbuf;
    char *scratch = NULL;
    if (n > 2) {
        /* count 0: fingerprints only; virtual: nothing is written there */
        scratch = malloc(blen && !x->c->virt ? 2 * blen : 1);
        if (!scratch) {
            DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for 2 x %zu bytes of scratch", blen);
            return dsim_coll_fail_local(x, 1, DSIM_ENOMEM, "allocating");
        }
    }
    const char *partial = NULL; /* what this rank finished the step before */
    dsim_err e = DSIM_OK;
    for (int s = 0; s < n - 1 && e == DSIM_OK; s++) {
        int rcv = ring_mod(r - s - 2, n);
        char *into = s == n - 2   ? (char *)recvbuf
                     : x->c->virt ? scratch
                                  : scratch + (size_t)(s % 2) * blen;
        dsim_coll_copy(x, into, sb + (size_t)rcv * blen, blen);
        const char *out = s == 0 ? sb + (size_t)ring_mod(r - 1, n) * blen : partial;
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV_REDUCE, ring_left(x), s + 1, into, blen, NULL},
            {DSIM_XF_SEND, ring_right(x), s + 1, (void *)out, blen, NULL},
        };
        e = dsim_coll_run(x, xf, 2);
        partial = into;
    }
    free(scratch);
    if (e != DSIM_OK)
        return e;
    e = dsim_coll_finish(x, recvbuf, recvcount, n);
    if (e != DSIM_OK)
        return dsim_coll_fail_local(x, n - 1, e, "finishing the reduction");
    return DSIM_OK;
}
