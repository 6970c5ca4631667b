/* The torus all-reduce: reduce-scatter along each dimension of a torus in
 * turn, then all-gather along them in the reverse order, each dimension's
 * rings run in both directions at once. This is the multi-dimensional
 * ("bucket") all-reduce of TPU pods as published for TensorFlow/XLA on TPU
 * v3 (Ying et al., "Image Classification at Supercomputer Scale", 2018, §3:
 * a 2-D gradient summation on the torus; Kumar et al., "Scale MLPerf-0.6
 * models on Google TPU-v3 Pods", 2019, §4: reduce-scatter along one
 * dimension, then the other, bidirectional rings, then the all-gathers in
 * reverse). Variant, precisely: dimension-ordered, bidirectional-ring,
 * reduce-scatter/all-gather; each rank's buffer is cut in two halves, the
 * first travelling the "+1" way round every ring and the second the "-1"
 * way, so both directions of every link carry half the data; no pipelining
 * of one dimension's phase into the next (each step waits for its
 * transfers, as every dsim algorithm does).
 *
 * Where the ranks are (dsim_comm_cfg.torus_*): dims d0 x d1 x ...; a rank's
 * coordinate c_i along dimension i; its ring along i is the d_i ranks that
 * share its other coordinates. Without a torus the ranks form one ring in
 * rank order (a 1-D torus): the bidirectional ring all-reduce.
 *
 * A 2 x 3 torus (dimension 0 first), one rank's half A (+1 way) shown; half
 * B does the mirror image (-1 way) in the same steps:
 *
 *   reduce-scatter dim 0 (rings of 2):   A = [a0 a1]            1 step
 *       rank (0,y) sends a0 to (1,y), gets a1 from it: owns a1 summed over dim 0
 *   reduce-scatter dim 1 (rings of 3):   a1 = [b0 b1 b2]        2 steps
 *       ring step s: send b(c1-s) to c1+1, combine b(c1-s-1) from c1-1
 *       -> owns b(c1+1): its 1/6 of A summed over all 6 ranks  (MEAN: / 6 here)
 *   all-gather dim 1:  b(c1+1) around the ring of 3            2 steps
 *   all-gather dim 0:  a1 to the partner, a0 from it          1 step
 *
 * Each finished block is computed by exactly one rank (its owner) in a fixed
 * order and copied to everyone else, so every rank ends with the same bits
 * and every run with the same bits. Per rank, dimension i moves
 * 2 (d_i - 1) / d_i of what reaches it, split over two links: on a torus of
 * D dimensions the bytes on each link are those of a ring of the same
 * total, with D times fewer steps' worth of latency per dimension's size.
 *
 * Steps: every logical step posts the two halves' transfers with two tags
 * (2k - 1 for half A, 2k for half B), so a ring of two, whose +1 and -1
 * neighbours are the same rank, still matches each half with its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

dsim_err dsim_coll_torus_init(dsim_comm *c, const dsim_comm_cfg *cfg)
{
    int nd = cfg->torus_ndims;
    c->torus_ndims = 0;
    c->torus_place = c->rank;
    if (nd == 0)
        return DSIM_OK;
    if (nd < 0 || nd > DSIM_TORUS_MAX_DIMS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_comm_create: cfg.torus_ndims is %d (accepted: 0 .. %d)", nd,
                        DSIM_TORUS_MAX_DIMS);
    long long prod = 1;
    char shape[64] = "";
    size_t o = 0;
    for (int i = 0; i < nd; i++) {
        int d = cfg->torus_dims[i];
        if (d < 1)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "dsim_comm_create: cfg.torus_dims[%d] is %d (accepted: >= 1)", i, d);
        prod *= d;
        if (prod > (1LL << 30))
            break;
        int w = snprintf(shape + o, sizeof shape - o, "%s%d", i ? "x" : "", d);
        if (w > 0 && (size_t)w < sizeof shape - o)
            o += (size_t)w;
    }
    if (prod != c->size)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_comm_create: the torus %s has %lld places but the communicator "
                        "has %d ranks; give a torus of exactly the communicator's ranks (or "
                        "none: the torus algorithm then runs one ring of every rank)",
                        shape, prod, c->size);
    int place = c->rank;
    if (cfg->torus_rank) {
        unsigned char *seen = calloc((size_t)c->size / 8 + 1, 1);
        if (!seen)
            return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_comm_create: out of memory");
        place = -1;
        for (int p = 0; p < c->size; p++) {
            int r = cfg->torus_rank[p];
            if (r < 0 || r >= c->size || (seen[r / 8] & (1u << (r % 8)))) {
                free(seen);
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "dsim_comm_create: cfg.torus_rank[%d] is %d, %s (accepted: a "
                                "permutation of the ranks 0..%d)",
                                p, r, r < 0 || r >= c->size ? "not a rank" : "a rank given twice",
                                c->size - 1);
            }
            seen[r / 8] |= (unsigned char)(1u << (r % 8));
            if (r == c->rank)
                place = p;
        }
        free(seen);
    }
    /* dimensions of one place change no coordinate: leave them out */
    int k = 0, rest = place;
    for (int i = 0; i < nd; i++) {
        int d = cfg->torus_dims[i];
        int coord = rest % d;
        rest /= d;
        if (d == 1)
            continue;
        c->torus_dims[k] = d;
        c->torus_coord[k] = coord;
        k++;
    }
    c->torus_ndims = k;
    c->torus_place = place;
    c->torus_rank = cfg->torus_rank;
    return DSIM_OK;
}

/* The torus as the algorithm sees it: the communicator's, or one ring of
 * every rank. */
typedef struct torus_geom {
    int nd;
    int dims[DSIM_TORUS_MAX_DIMS];
    int coord[DSIM_TORUS_MAX_DIMS];
    int stride[DSIM_TORUS_MAX_DIMS]; /* a place's step along each dimension */
    int place;
    const int *rank_at;
} torus_geom;

static void torus_geom_of(const dsim_comm *c, torus_geom *g)
{
    memset(g, 0, sizeof *g);
    if (c->torus_ndims == 0) {
        g->nd = 1;
        g->dims[0] = c->size;
        g->coord[0] = c->rank;
        g->stride[0] = 1;
        g->place = c->rank;
        return;
    }
    g->nd = c->torus_ndims;
    g->place = c->torus_place;
    g->rank_at = c->torus_rank;
    /* strides over the dimensions kept: a dropped dimension had size 1 */
    int stride = 1;
    for (int i = 0; i < g->nd; i++) {
        g->dims[i] = c->torus_dims[i];
        g->coord[i] = c->torus_coord[i];
        g->stride[i] = stride;
        stride *= g->dims[i];
    }
}

static int torus_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* The rank `delta` places along dimension i from this rank. */
static int torus_peer(const torus_geom *g, int i, int delta)
{
    int n = g->dims[i], c = g->coord[i];
    int to = g->place + (torus_mod(c + delta, n) - c) * g->stride[i];
    return g->rank_at ? g->rank_at[to] : to;
}

int dsim_coll_torus_allreduce_steps(int size)
{
    /* one ring of every rank; a torus's own count is set by the call */
    return 4 * (size - 1);
}

static int torus_steps(const torus_geom *g)
{
    int s = 0;
    for (int i = 0; i < g->nd; i++)
        s += 2 * (g->dims[i] - 1);
    return 2 * s;
}

/* One half's segment at each dimension, as its reduce-scatter found it. */
typedef struct torus_half {
    int sign; /* +1: sends to c + 1; -1: sends to c - 1 */
    size_t off[DSIM_TORUS_MAX_DIMS], cnt[DSIM_TORUS_MAX_DIMS];
    size_t cur_off, cur_cnt;
} torus_half;

/* The byte range of block b of the half's segment at dimension i. */
static void torus_block(const torus_half *h, int i, int n, int b, size_t es, size_t *off,
                        size_t *len)
{
    *off = (h->off[i] + dsim_coll_block_off(h->cnt[i], n, b)) * es;
    *len = dsim_coll_block_cnt(h->cnt[i], n, b) * es;
}

dsim_err dsim_coll_torus_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count)
{
    torus_geom g;
    torus_geom_of(x->c, &g);
    x->nsteps = torus_steps(&g);
    size_t es = x->esize;
    char *rb = recvbuf;
    dsim_coll_copy(x, rb, sendbuf, count * es);
    size_t first = (count + 1) / 2;
    torus_half hv[2] = {{.sign = 1, .cur_off = 0, .cur_cnt = first},
                        {.sign = -1, .cur_off = first, .cur_cnt = count - first}};
    int k = 0; /* logical steps so far */

    for (int i = 0; i < g.nd; i++) {
        int n = g.dims[i], c = g.coord[i];
        for (int h = 0; h < 2; h++) {
            hv[h].off[i] = hv[h].cur_off;
            hv[h].cnt[i] = hv[h].cur_cnt;
        }
        for (int s = 0; s < n - 1; s++, k++) {
            dsim_xfer xf[4];
            for (int h = 0; h < 2; h++) {
                int sg = hv[h].sign;
                size_t ro, rl, so, sl;
                torus_block(&hv[h], i, n, torus_mod(c - sg * (s + 1), n), es, &ro, &rl);
                torus_block(&hv[h], i, n, torus_mod(c - sg * s, n), es, &so, &sl);
                int tag = 2 * k + 1 + h;
                xf[2 * h] = (dsim_xfer){
                    DSIM_XF_RECV_REDUCE, torus_peer(&g, i, -sg), tag, rb + ro, rl, NULL};
                xf[2 * h + 1] =
                    (dsim_xfer){DSIM_XF_SEND, torus_peer(&g, i, sg), tag, rb + so, sl, NULL};
            }
            DSIM_CHECK(dsim_coll_run(x, xf, 4));
        }
        for (int h = 0; h < 2; h++) {
            int own = torus_mod(c + hv[h].sign, n);
            hv[h].cur_off = hv[h].off[i] + dsim_coll_block_off(hv[h].cnt[i], n, own);
            hv[h].cur_cnt = dsim_coll_block_cnt(hv[h].cnt[i], n, own);
        }
    }

    /* Each rank owns its final block of each half: finished once, here. */
    for (int h = 0; h < 2; h++) {
        if (!hv[h].cur_cnt)
            continue;
        dsim_err e = dsim_coll_finish(x, rb + hv[h].cur_off * es, hv[h].cur_cnt, x->size);
        if (e != DSIM_OK)
            return dsim_coll_fail_local(x, 2 * k, e, "finishing the reduction");
    }

    for (int i = g.nd - 1; i >= 0; i--) {
        int n = g.dims[i], c = g.coord[i];
        for (int s = 0; s < n - 1; s++, k++) {
            dsim_xfer xf[4];
            for (int h = 0; h < 2; h++) {
                int sg = hv[h].sign;
                size_t ro, rl, so, sl;
                torus_block(&hv[h], i, n, torus_mod(c - sg * s, n), es, &ro, &rl);
                torus_block(&hv[h], i, n, torus_mod(c + sg * (1 - s), n), es, &so, &sl);
                int tag = 2 * k + 1 + h;
                xf[2 * h] =
                    (dsim_xfer){DSIM_XF_RECV, torus_peer(&g, i, -sg), tag, rb + ro, rl, NULL};
                xf[2 * h + 1] =
                    (dsim_xfer){DSIM_XF_SEND, torus_peer(&g, i, sg), tag, rb + so, sl, NULL};
            }
            DSIM_CHECK(dsim_coll_run(x, xf, 4));
        }
    }
    return DSIM_OK;
}
