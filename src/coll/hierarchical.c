/* The hierarchical all-reduce: reduce-scatter within each host, all-reduce of
 * each shard across the hosts, all-gather within each host.
 *
 * Which variant, and why. Two two-level schemes are in use:
 *   - reduce / all-reduce / broadcast (a leader per host: reduce to it,
 *     all-reduce among the leaders, broadcast back; what Horovod does with
 *     the part of a buffer that does not divide by the local size, and
 *     what examples/hierarchical_strategy writes by hand on
 *     dsim_comm_split);
 *   - reduce-scatter / all-reduce / all-gather (Horovod's
 *     HOROVOD_HIERARCHICAL_ALLREDUCE: NCCL ReduceScatter in the node, MPI
 *     Allreduce across nodes on each shard, NCCL Allgather in the node; the
 *     2D-torus all-reduce of Mikami et al. has the same shape).
 * This is the second. With S bytes, H hosts of L ranks each, the leader
 * variant moves the whole S into and out of one rank per host (the reduce
 * and the broadcast are whole-buffer trees inside the host) and leaves the
 * host's other L - 1 ranks idle while the leaders talk; here every rank
 * works on its own S / L shard in every phase: the host's links carry
 * 2 (L-1)/L S per rank (the bandwidth optimum), and the L shards cross the
 * NIC as L concurrent flows of S / L, which is all a host's NIC has to
 * carry in either variant (2 (H-1)/H S) but is not serialised behind one
 * rank's reduction. Against a flat ring over all N = H L ranks, whose every
 * step is paced by a slow inter-host link, it has 2 (L-1) steps on the
 * fast intra-host links and only 2 (H-1) on the slow ones, instead of
 * 2 (N-1) (sim/model/algo_cost.c prices both; reports/hierarchical.md).
 *
 * 2 hosts x 2 ranks (ranks 0, 1 on host 0; 2, 3 on host 1), the buffer in
 * halves a | b, each half in quarters for the hosts (a = a1 a2), "x+" =
 * combined on arrival, "x>" = copied into place:
 *
 *               host 0                        host 1
 *            rank 0        rank 1          rank 2        rank 3
 *   step 1   b  -> 1       a  -> 0         b  -> 3       a  -> 2     reduce-scatter
 *            (a+ from 1)   (b+ from 0)     (a+ from 3)   (b+ from 2) in the host
 *            owns a        owns b          owns a        owns b
 *   step 2   a1 -> 2       b1 -> 3         a2 -> 0       b2 -> 1     all-reduce of
 *            (a2+ from 2)  (b2+ from 3)    (a1+ from 0)  (b1+ from 1) each shard
 *            owns a2       owns b2         owns a1       owns b1     across hosts
 *                          MEAN divides here, once, by N            (a ring of H)
 *   step 3   a2 -> 2       b2 -> 3         a1 -> 0       b1 -> 1
 *            (a1> from 2)  (b1> from 3)    (a2> from 0)  (b2> from 1)
 *   step 4   a  -> 1       b  -> 0         a  -> 3       b  -> 2     all-gather in
 *            (b> from 1)   (a> from 0)     (b> from 3)   (a> from 2) the host
 *
 * In general the host's ranks run the first half of a ring over L blocks
 * (L - 1 steps; rank l ends owning block l), the L rings of H ranks (one
 * per local index, across the hosts) all-reduce their block with a ring
 * (2 (H - 1) steps), and the host's ring passes the L finished blocks round
 * (L - 1 steps). Every block is combined in a fixed order and finished
 * once, by its owner in the cross-host ring; everyone else copies those
 * bits, so every rank ends with the same bits and the same inputs give the
 * same bits every run.
 *
 * It is one call of the communicator, not calls on sub-communicators: the
 * three phases share the call's deadline, fingerprints and flight-recorder
 * entry, and a rank still stuck in phase 1 (its host lost a rank) answers
 * the failure check of a rank waiting for it in phase 2, so every survivor
 * names the rank that failed. The hosts come from the communicator's
 * topology (dsim_comm_cfg.local_size; a sub-communicator's ranks by their
 * endpoints). Where the levels collapse it is the ring: no topology, one
 * host, one rank per host, or hosts that hold unequal numbers of the
 * communicator's ranks (a split that took 3 ranks of one host and 1 of
 * another); every rank knows the same topology, so all take the same
 * path. */
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

static int hier_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

void dsim_coll_hier_free(dsim_comm *c)
{
    if (c->hier)
        free(c->hier->rank_at);
    free(c->hier);
    c->hier = NULL;
}

/* The hosts of a sub-communicator: its ranks grouped by host, hosts in
 * increasing order, a host's ranks in rank order. */
static void hier_of_sub(const dsim_comm *c, dsim_coll_hier *h)
{
    int n = c->size, ls = c->local_size;
    int *host = malloc((size_t)n * sizeof *host);
    int *order = malloc((size_t)n * sizeof *order);
    if (!host || !order)
        goto out;
    for (int r = 0; r < n; r++)
        host[r] = c->ep_of[r] / ls;
    /* insertion by host, stable: n is a communicator's size, and this runs
     * once per communicator */
    for (int r = 0; r < n; r++) {
        int k = r;
        while (k > 0 && host[order[k - 1]] > host[r]) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = r;
    }
    /* runs of one host: all as long as the first, and at least two */
    int H = 0, L = 0;
    for (int k = 0; k < n;) {
        int e = k;
        while (e < n && host[order[e]] == host[order[k]])
            e++;
        if (L == 0)
            L = e - k;
        else if (e - k != L)
            goto out; /* unequal hosts: not uniform */
        H++;
        k = e;
    }
    if (H < 2 || L < 2 || H * L != n)
        goto out;
    h->rank_at = order;
    order = NULL;
    h->H = H;
    h->L = L;
    for (int k = 0; k < n; k++)
        if (h->rank_at[k] == c->rank) {
            h->me_h = k / L;
            h->me_l = k % L;
        }
    h->uniform = 1;
out:
    free(host);
    free(order);
}

const dsim_coll_hier *dsim_coll_hier_of(dsim_comm *c)
{
    if (c->hier)
        return c->hier;
    dsim_coll_hier *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    int L = c->local_size;
    if (L >= 2 && !c->ep_of) {
        /* ranks are endpoints: host by host */
        if (c->size % L == 0 && c->size / L >= 2) {
            h->uniform = 1;
            h->L = L;
            h->H = c->size / L;
            h->me_h = c->rank / L;
            h->me_l = c->rank % L;
        }
    } else if (L >= 1 && c->ep_of) {
        hier_of_sub(c, h);
    }
    c->hier = h;
    return h;
}

/* The rank at local index l of host k. */
static int hier_at(const dsim_coll_hier *h, int k, int l)
{
    return h->rank_at ? h->rank_at[k * h->L + l] : k * h->L + l;
}

int dsim_coll_hier_allreduce_steps(dsim_comm *c)
{
    const dsim_coll_hier *h = dsim_coll_hier_of(c);
    if (!h || !h->uniform)
        return dsim_coll_ring_allreduce_steps(c);
    return 2 * (h->L - 1) + 2 * (h->H - 1);
}

/* Phase 1: the host's ranks reduce-scatter the L blocks of the buffer
 * around their ring; local rank l ends owning block l in rb. */
static dsim_err hier_reduce_scatter(dsim_coll *x, const dsim_coll_hier *h, const char *sb, char *rb,
                                    size_t count)
{
    int L = h->L, l = h->me_l, k = h->me_h;
    int left = hier_at(h, k, hier_mod(l - 1, L)), right = hier_at(h, k, hier_mod(l + 1, L));
    size_t es = x->esize;
    for (int s = 0; s < L - 1; s++) {
        int snd = hier_mod(l - s - 1, L), rcv = hier_mod(l - s - 2, L);
        size_t roff = dsim_coll_block_off(count, L, rcv) * es;
        size_t rlen = dsim_coll_block_cnt(count, L, rcv) * es;
        size_t soff = dsim_coll_block_off(count, L, snd) * es;
        size_t slen = dsim_coll_block_cnt(count, L, snd) * es;
        /* out of place: combined from sendbuf as it arrives */
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV_REDUCE, left, s + 1, rb + roff, rlen, sb != rb ? sb + roff : NULL},
            {DSIM_XF_SEND, right, s + 1, (void *)((s == 0 ? sb : rb) + soff), slen, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }
    return DSIM_OK;
}

/* Phase 2: the ring of the hosts' ranks of local index l all-reduces
 * block l (cnt elements at blk), finished (MEAN) by each sub-block's
 * owner; steps step0 + 1 .. step0 + 2 (H - 1). */
static dsim_err hier_across(dsim_coll *x, const dsim_coll_hier *h, char *blk, size_t cnt, int step0)
{
    int H = h->H, k = h->me_h, l = h->me_l;
    int left = hier_at(h, hier_mod(k - 1, H), l), right = hier_at(h, hier_mod(k + 1, H), l);
    size_t es = x->esize;
    for (int s = 0; s < H - 1; s++) {
        int snd = hier_mod(k - s, H), rcv = hier_mod(k - s - 1, H);
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV_REDUCE, left, step0 + s + 1, blk + dsim_coll_block_off(cnt, H, rcv) * es,
             dsim_coll_block_cnt(cnt, H, rcv) * es, NULL},
            {DSIM_XF_SEND, right, step0 + s + 1, blk + dsim_coll_block_off(cnt, H, snd) * es,
             dsim_coll_block_cnt(cnt, H, snd) * es, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }
    int own = hier_mod(k + 1, H);
    size_t ocnt = dsim_coll_block_cnt(cnt, H, own);
    if (ocnt) {
        dsim_err e =
            dsim_coll_finish(x, blk + dsim_coll_block_off(cnt, H, own) * es, ocnt, x->size);
        if (e != DSIM_OK)
            return dsim_coll_fail_local(x, step0 + H - 1, e, "finishing the reduction");
    }
    for (int s = 0; s < H - 1; s++) {
        int snd = hier_mod(k + 1 - s, H), rcv = hier_mod(k - s, H);
        int step = step0 + H + s;
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV, left, step, blk + dsim_coll_block_off(cnt, H, rcv) * es,
             dsim_coll_block_cnt(cnt, H, rcv) * es, NULL},
            {DSIM_XF_SEND, right, step, blk + dsim_coll_block_off(cnt, H, snd) * es,
             dsim_coll_block_cnt(cnt, H, snd) * es, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }
    return DSIM_OK;
}

/* Phase 3: the host's ranks pass the L finished blocks round their ring. */
static dsim_err hier_gather(dsim_coll *x, const dsim_coll_hier *h, char *rb, size_t count,
                            int step0)
{
    int L = h->L, l = h->me_l, k = h->me_h;
    int left = hier_at(h, k, hier_mod(l - 1, L)), right = hier_at(h, k, hier_mod(l + 1, L));
    size_t es = x->esize;
    for (int s = 0; s < L - 1; s++) {
        int snd = hier_mod(l - s, L), rcv = hier_mod(l - s - 1, L);
        dsim_xfer xf[2] = {
            {DSIM_XF_RECV, left, step0 + s + 1, rb + dsim_coll_block_off(count, L, rcv) * es,
             dsim_coll_block_cnt(count, L, rcv) * es, NULL},
            {DSIM_XF_SEND, right, step0 + s + 1, rb + dsim_coll_block_off(count, L, snd) * es,
             dsim_coll_block_cnt(count, L, snd) * es, NULL},
        };
        DSIM_CHECK(dsim_coll_run(x, xf, 2));
    }
    return DSIM_OK;
}

dsim_err dsim_coll_hier_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count)
{
    const dsim_coll_hier *h = dsim_coll_hier_of(x->c);
    if (!h) {
        DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for the communicator's hosts");
        return dsim_coll_fail_local(x, 0, DSIM_ENOMEM, "allocating");
    }
    if (!h->uniform)
        return dsim_coll_ring_allreduce(x, sendbuf, recvbuf, count);
    char *rb = recvbuf;
    int L = h->L, H = h->H;
    DSIM_CHECK(hier_reduce_scatter(x, h, sendbuf, rb, count));
    size_t es = x->esize;
    char *blk = rb + dsim_coll_block_off(count, L, h->me_l) * es;
    DSIM_CHECK(hier_across(x, h, blk, dsim_coll_block_cnt(count, L, h->me_l), L - 1));
    return hier_gather(x, h, rb, count, L - 1 + 2 * (H - 1));
}
