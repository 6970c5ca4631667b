/* Rabenseifner's allreduce: reduce-scatter by recursive halving, then
 * all-gather by recursive doubling (MPICH's reduce_scatter_allgather).
 *
 * Power-of-two case, 4 ranks, buffer cut into blocks a b c d; "x+" = combined
 * on arrival into the receiver's copy (dsim_irecv_reduce), "x>" = copied into
 * place:
 *
 *            rank 0          rank 1          rank 2          rank 3
 *   step 1   cd -> 2         cd -> 3         ab -> 0         ab -> 1    halving,
 *            (ab+ from 2)    (ab+ from 3)    (cd+ from 0)    (cd+ from 1) distance 2
 *   step 2   b  -> 1         a  -> 0         d  -> 3         c  -> 2    distance 1
 *            (a+ from 1)     (b+ from 0)     (c+ from 3)     (d+ from 2)
 *            owns a          owns b          owns c          owns d   <- final,
 *                                                            MEAN divides here
 *   step 3   a  -> 1         b  -> 0         c  -> 3         d  -> 2    doubling,
 *            (b> from 1)     (a> from 0)     (d> from 3)     (c> from 2) distance 1
 *   step 4   ab -> 2         ab -> 3         cd -> 0         cd -> 1    distance 2
 *            (cd> from 2)    (cd> from 3)    (ab> from 0)    (ab> from 1)
 *
 * Any other rank count n: p = the largest power of two <= n, rem = n - p.
 * Before the halving, each even rank among the first 2*rem folds into its
 * odd neighbour (sends the whole buffer, which the odd rank combines) and
 * then waits; the p remaining ranks run the algorithm above under new ranks
 * 0..p-1; afterwards each odd rank sends the whole result back to its even
 * neighbour. 6 ranks (p = 4, rem = 2):
 *
 *   step 1      0 -> 1 (1 combines)     2 -> 3 (3 combines)     4, 5 idle
 *   steps 2-5   ranks 1 3 4 5 run the 4-rank algorithm as new ranks 0 1 2 3
 *   step 6      1 -> 0                  3 -> 2                  4, 5 done
 *
 * Each element's final value is computed once, by the rank that owns its
 * block after the halving, along a fixed tree; everyone else gets a copy, so
 * all ranks agree bit for bit. Out of place, step 1 of the halving sends
 * straight from sendbuf and the half that is kept is combined from
 * sendbuf into recvbuf as the peer's half arrives (dsim_irecv_reduce_from:
 * no copy first). log2(p) exchanges each way with halving sizes: fewer steps than
 * the ring (latency) at the same 2 (p-1)/p of the buffer on the wire per rank
 * (for p = n). */
#include <string.h>

#include "coll_int.h"

int dsim_coll_rhd_allreduce_steps(dsim_comm *c)
{
    int levels, p = dsim_coll_pow2_floor(c->size, &levels);
    return 2 * levels + (c->size > p ? 2 : 0);
}

dsim_err dsim_coll_rhd_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count)
{
    int n = x->size, r = x->rank;
    size_t es = x->esize, all = count * es;
    char *rb = recvbuf;
    const char *sb = sendbuf;
    int levels, p = dsim_coll_pow2_floor(n, &levels);
    int rem = n - p, pre = rem > 0 ? 1 : 0;
    int last = x->nsteps;
    const char *cur = sb; /* where this rank's partial result lives now */
    int nr;

    if (r < 2 * rem) {
        if (r % 2 == 0) {
            dsim_xfer out = {DSIM_XF_SEND, r + 1, 1, (void *)sb, all, NULL};
            DSIM_CHECK(dsim_coll_run(x, &out, 1));
            dsim_xfer in = {DSIM_XF_RECV, r + 1, last, rb, all, NULL};
            return dsim_coll_run(x, &in, 1);
        }
        dsim_xfer in = {DSIM_XF_RECV_REDUCE, r - 1, 1, rb, all, sb};
        DSIM_CHECK(dsim_coll_run(x, &in, 1));
        cur = rb;
        nr = r / 2;
    } else {
        nr = r - rem;
    }

    int lo = 0, hi = p;
    for (int k = 0; k < levels; k++) {
        int d = p >> (k + 1), mid = lo + (hi - lo) / 2;
        int peer = dsim_coll_fold_real(nr ^ d, rem);
        int klo = (nr & d) ? mid : lo, khi = (nr & d) ? hi : mid;
        int slo = (nr & d) ? lo : mid, shi = (nr & d) ? mid : hi;
        size_t ko = dsim_coll_block_off(count, p, klo) * es;
        size_t kl = dsim_coll_block_off(count, p, khi) * es - ko;
        size_t so = dsim_coll_block_off(count, p, slo) * es;
        size_t sl = dsim_coll_block_off(count, p, shi) * es - so;
        /* the kept half is combined from cur as it arrives: no copy */
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV_REDUCE, peer, pre + 1 + k, rb + ko, kl, cur + ko},
            {DSIM_XF_SEND, peer, pre + 1 + k, (void *)(cur + so), sl, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
        cur = rb;
        lo = klo;
        hi = khi;
    }

    size_t ocnt = dsim_coll_block_cnt(count, p, nr);
    if (ocnt) {
        dsim_err e = dsim_coll_finish(x, rb + dsim_coll_block_off(count, p, nr) * es, ocnt, n);
        if (e != DSIM_OK)
            return dsim_coll_fail_local(x, pre + levels, e, "finishing the reduction");
    }

    lo = nr;
    hi = nr + 1;
    for (int k = 0; k < levels; k++) {
        int d = 1 << k;
        int peer = dsim_coll_fold_real(nr ^ d, rem);
        int plo = (nr & d) ? lo - d : hi, phi = (nr & d) ? lo : hi + d;
        size_t po = dsim_coll_block_off(count, p, plo) * es;
        size_t pl = dsim_coll_block_off(count, p, phi) * es - po;
        size_t mo = dsim_coll_block_off(count, p, lo) * es;
        size_t ml = dsim_coll_block_off(count, p, hi) * es - mo;
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV, peer, pre + levels + 1 + k, rb + po, pl, NULL},
            {DSIM_XF_SEND, peer, pre + levels + 1 + k, rb + mo, ml, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
        if (plo < lo)
            lo = plo;
        if (phi > hi)
            hi = phi;
    }

    if (r < 2 * rem) {
        dsim_xfer out = {DSIM_XF_SEND, r - 1, last, rb, all, NULL};
        DSIM_CHECK(dsim_coll_run(x, &out, 1));
    }
    return DSIM_OK;
}
