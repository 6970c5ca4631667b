/* What the cost model knows about each all-reduce algorithm: the schedule
 * src/coll runs, step by step, for the evaluator (costmodel.c); the
 * textbook closed form; and what calibration (calibrate.c) needs: the size
 * of the messages that dominate, whether every rank sends in every step,
 * and the local copies an out-of-place call makes.
 *
 * One entry per algorithm, found through dsim_algo_cost_of, whose switch
 * has no default: a dsim_algo added to dsim/comm.h without its cost here
 * does not compile (-Wswitch, -Werror). What runs is src/coll/algos.c's
 * table; what it costs is here, because the library does not carry the
 * cost model. */
#include <math.h>
#include <stdlib.h>

#include "model/cost_int.h"

/* ---- ring: reduce-scatter then all-gather ---- */

static void ring_schedule(cm_eval *ev, cm_xfer *x, size_t count, double es)
{
    /* Every step of a phase moves every block once, each rank to its right
     * neighbour, over the same links: the steps of a phase all take as long
     * as its first, so one is evaluated and counted p - 1 times (which lets
     * a ring of 65536 ranks be costed at once). */
    int p = ev->p;
    for (int phase = 0; phase < 2; phase++) {
        for (int r = 0; r < p; r++) {
            /* reduce-scatter step 0: rank r sends block r; all-gather step
             * 0: block r + 1 */
            int blk = (r + (phase ? 1 : 0)) % p;
            double b = cm_block(count, p, blk) * es;
            x[r] = (cm_xfer){r, (r + 1) % p, b, phase ? 0 : b};
        }
        dsim_cost_step_times(ev, x, p, p - 1);
    }
}

static double ring_formula(int p, double n, double a, double b, double g)
{
    double P = p;
    return 2 * (P - 1) * a + 2 * (P - 1) / P * n * b + (P - 1) / P * n * g;
}

static size_t ring_msg_elems(size_t elems, int ranks)
{
    return (elems + (size_t)ranks - 1) / (size_t)ranks; /* blocks of n / p */
}

static double ring_local_copy(int p, double n, int *serial)
{
    /* each block is copied just before it is combined into: (p-1)/p of the
     * buffer per rank */
    *serial = 0;
    return (double)(p - 1) * n;
}

static const dsim_algo_cost cost_ring = {
    .size = sizeof(dsim_algo_cost),
    .algo = DSIM_ALGO_RING,
    .schedule = ring_schedule,
    .formula = ring_formula,
    .msg_elems = ring_msg_elems,
    .walks_buffer = true,
    .local_copy = ring_local_copy,
};

/* ---- rhd: recursive halving, then doubling; other ranks folded in ---- */

/* The old rank of new rank v once the first 2 rem ranks folded in pairs
 * (rhd and recursive doubling: the odd rank of a pair stays). */
static int fold_real(int v, int rem)
{
    return v < rem ? 2 * v + 1 : v + rem;
}

/* The fold (each even rank of the first 2 rem sends its whole buffer to its
 * odd neighbour, which combines) or, back, the unfold (the result returns). */
static void fold_step(cm_eval *ev, cm_xfer *x, int rem, double all, int back)
{
    int n = 0;
    for (int r = 0; r < 2 * rem; r += 2)
        x[n++] = back ? (cm_xfer){r + 1, r, all, 0} : (cm_xfer){r, r + 1, all, all};
    dsim_cost_step(ev, x, n);
}

static void rhd_schedule(cm_eval *ev, cm_xfer *x, size_t count, double es)
{
    int p = ev->p, q = cm_pow2_floor(p), rem = p - q;
    double all = (double)count * es;
    int n = 0;
    fold_step(ev, x, rem, all, 0);
    /* the q ranks left: new rank v is old rank (v < rem ? 2v + 1 : v + rem) */
    int lg = 0;
    while ((1 << lg) < q)
        lg++;
    double seg = (double)count; /* elements each rank still owns, largest share */
    for (int k = 0; k < lg; k++) {
        int d = q >> (k + 1);
        double half = ceil(seg / 2);
        n = 0;
        for (int v = 0; v < q; v++) {
            int peer = v ^ d;
            int a = fold_real(v, rem), b = fold_real(peer, rem);
            x[n++] = (cm_xfer){a, b, half * es, half * es};
        }
        dsim_cost_step(ev, x, n);
        seg = half;
    }
    for (int k = lg - 1; k >= 0; k--) {
        int d = q >> (k + 1);
        n = 0;
        for (int v = 0; v < q; v++) {
            int peer = v ^ d;
            int a = fold_real(v, rem), b = fold_real(peer, rem);
            x[n++] = (cm_xfer){a, b, seg * es, 0};
        }
        dsim_cost_step(ev, x, n);
        seg = seg * 2 > (double)count ? (double)count : seg * 2;
    }
    fold_step(ev, x, rem, all, 1);
}

static double rhd_formula(int p, double n, double a, double b, double g)
{
    int q = cm_pow2_floor(p);
    double Q = q, lg = log2(Q);
    double t = 2 * lg * a + 2 * (Q - 1) / Q * n * b + (Q - 1) / Q * n * g;
    return q == p ? t : t + 2 * a + 2 * n * b + n * g;
}

static size_t rhd_msg_elems(size_t elems, int ranks)
{
    (void)ranks;
    return (elems + 1) / 2; /* halves, then quarters, ...: the first halving dominates */
}

static double rhd_local_copy(int p, double n, int *serial)
{
    /* the half it keeps at the first halving (a power of two of ranks); a
     * folded rank copies the whole */
    *serial = 0;
    int q = cm_pow2_floor(p);
    return (double)q * n / 2 + (double)(p - q) * n;
}

static const dsim_algo_cost cost_rhd = {
    .size = sizeof(dsim_algo_cost),
    .algo = DSIM_ALGO_RHD,
    .schedule = rhd_schedule,
    .formula = rhd_formula,
    .msg_elems = rhd_msg_elems,
    .local_copy = rhd_local_copy,
};

/* ---- tree: binomial reduce to rank 0, binomial broadcast ---- */

static void tree_schedule(cm_eval *ev, cm_xfer *x, size_t count, double es)
{
    int p = ev->p, L = 0;
    while ((1 << L) < p)
        L++;
    double all = (double)count * es;
    for (int k = 0; k < L; k++) { /* reduce toward rank 0 */
        int n = 0, d = 1 << k;
        for (int v = d; v < p; v += 2 * d)
            x[n++] = (cm_xfer){v, v - d, all, all};
        dsim_cost_step(ev, x, n);
    }
    for (int k = L - 1; k >= 0; k--) { /* broadcast from rank 0 */
        int n = 0, d = 1 << k;
        for (int v = d; v < p; v += 2 * d)
            x[n++] = (cm_xfer){v - d, v, all, 0};
        dsim_cost_step(ev, x, n);
    }
}

static double tree_formula(int p, double n, double a, double b, double g)
{
    return ceil(log2((double)p)) * (2 * a + 2 * n * b + n * g);
}

/* tree and reduce_to_one move the whole buffer every step */
static size_t whole_msg_elems(size_t elems, int ranks)
{
    (void)ranks;
    return elems;
}

static double tree_local_copy(int p, double n, int *serial)
{
    /* the whole into its accumulator on every rank that receives in the
     * reduce (ranks of even index), the root's on its path */
    *serial = 1;
    return (double)((p + 1) / 2) * n;
}

static const dsim_algo_cost cost_tree = {
    .size = sizeof(dsim_algo_cost),
    .algo = DSIM_ALGO_TREE,
    .schedule = tree_schedule,
    .formula = tree_formula,
    .msg_elems = whole_msg_elems,
    .local_copy = tree_local_copy,
};

/* ---- reduce_to_one: everything to rank 0, then back ---- */

static void r2o_schedule(cm_eval *ev, cm_xfer *x, size_t count, double es)
{
    int p = ev->p, n = 0;
    double all = (double)count * es;
    for (int r = 1; r < p; r++)
        x[n++] = (cm_xfer){r, 0, all, all};
    dsim_cost_step(ev, x, n);
    n = 0;
    for (int r = 1; r < p; r++)
        x[n++] = (cm_xfer){0, r, all, 0};
    dsim_cost_step(ev, x, n);
}

static double r2o_formula(int p, double n, double a, double b, double g)
{
    double P = p;
    return 2 * a + 2 * (P - 1) * n * b + (P - 1) * n * g;
}

static double r2o_local_copy(int p, double n, int *serial)
{
    (void)p;
    *serial = 1; /* rank 0 only */
    return n;
}

static const dsim_algo_cost cost_r2o = {
    .size = sizeof(dsim_algo_cost),
    .algo = DSIM_ALGO_REDUCE_TO_ONE,
    .schedule = r2o_schedule,
    .formula = r2o_formula,
    .msg_elems = whole_msg_elems,
    .local_copy = r2o_local_copy,
};

/* ---- hierarchical: reduce-scatter in each host, all-reduce of each shard
 * across the hosts, all-gather in each host (src/coll/hierarchical.c) ---- */

/* Elements of block k of count cut into m blocks, as a whole number. */
static size_t hier_blk(size_t count, int m, int k)
{
    return count / (size_t)m + ((size_t)k < count % (size_t)m ? 1 : 0);
}

/* One step of every host's ring of its L devices (phase 1 when reduce is
 * set, phase 3 otherwise), evaluated once and counted L - 1 times: every
 * step of a phase moves blocks of the same sizes over the same links. */
static void hier_intra(cm_eval *ev, cm_xfer *x, size_t count, double es, int reduce)
{
    int L = ev->t->devices_per_host, p = ev->p;
    for (int r = 0; r < p; r++) {
        int h = r / L, l = r % L;
        /* phase 1 sends block l - 1 first, phase 3 block l */
        int blk = reduce ? (l + L - 1) % L : l;
        double b = (double)hier_blk(count, L, blk) * es;
        x[r] = (cm_xfer){r, h * L + (l + 1) % L, b, reduce ? b : 0};
    }
    dsim_cost_step_times(ev, x, p, L - 1);
}

static void hier_schedule(cm_eval *ev, cm_xfer *x, size_t count, double es)
{
    int H = ev->t->hosts, L = ev->t->devices_per_host, p = ev->p;
    if (H < 2 || L < 2) {
        /* one host, or a device per host: the levels collapse into a ring */
        ring_schedule(ev, x, count, es);
        return;
    }
    hier_intra(ev, x, count, es, 1);
    /* the L rings of H, one per local index, all at once; local index l
     * all-reduces block l, cut in H (the L flows of a host share its NIC) */
    for (int phase = 0; phase < 2; phase++) {
        for (int r = 0; r < p; r++) {
            int h = r / L, l = r % L;
            size_t blk = hier_blk(count, L, l);
            int sub = (h + (phase ? 1 : 0)) % H;
            double b = (double)hier_blk(blk, H, sub) * es;
            x[r] = (cm_xfer){r, ((h + 1) % H) * L + l, b, phase ? 0 : b};
        }
        dsim_cost_step_times(ev, x, p, H - 1);
    }
    hier_intra(ev, x, count, es, 0);
}

static const dsim_algo_cost cost_hier = {
    .size = sizeof(dsim_algo_cost),
    .algo = DSIM_ALGO_HIERARCHICAL,
    .schedule = hier_schedule,
    /* The closed form assumes identical links and a rank per host, where
     * the levels collapse into the ring: the ring's. */
    .formula = ring_formula,
    /* Calibrated on one machine (one host): the ring's messages. */
    .msg_elems = ring_msg_elems,
    .walks_buffer = true,
    .local_copy = ring_local_copy,
};

/* ---- torus: reduce-scatter then all-gather along each dimension, both
 * directions of every ring at once (src/coll/torus.c) ---- */

/* Where the ranks sit: the slice's torus (topology.tpu), else one ring. */
typedef struct torus_cm {
    int nd, dims[DSIM_TPU_TORUS_DIMS], stride[DSIM_TPU_TORUS_DIMS];
    int *rank_at, *place_of; /* [p] each */
} torus_cm;

static int torus_cm_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Coordinate of place pl along dimension i. */
static int torus_cm_coord(const torus_cm *g, int pl, int i)
{
    return (pl / g->stride[i]) % g->dims[i];
}

/* Elements of half h (sign sg) that rank r's segment holds when it reaches
 * dimension i of the reduce-scatter. */
static size_t torus_cm_seg(const torus_cm *g, int pl, size_t half, int sg, int i)
{
    size_t cnt = half;
    for (int j = 0; j < i; j++) {
        int n = g->dims[j];
        int own = torus_cm_mod(torus_cm_coord(g, pl, j) + sg, n);
        cnt = (size_t)cm_block(cnt, n, own);
    }
    return cnt;
}

/* The first step of dimension i's phase, every rank's two halves; the
 * phase's other steps move the same over the same links. */
static void torus_cm_phase(cm_eval *ev, cm_xfer *x, const torus_cm *g, int i, size_t count,
                           double es, int gather)
{
    int p = ev->p, n = g->dims[i], m = 0;
    size_t halves[2] = {(count + 1) / 2, count - (count + 1) / 2};
    for (int r = 0; r < p; r++) {
        int pl = g->place_of[r], c = torus_cm_coord(g, pl, i);
        for (int h = 0; h < 2; h++) {
            int sg = h == 0 ? 1 : -1;
            size_t seg = torus_cm_seg(g, pl, halves[h], sg, i);
            int blk = gather ? torus_cm_mod(c + sg, n) : c;
            double b = cm_block(seg, n, blk) * es;
            int to = g->rank_at[pl + (torus_cm_mod(c + sg, n) - c) * g->stride[i]];
            x[m++] = (cm_xfer){r, to, b, gather ? 0 : b};
        }
    }
    dsim_cost_step_times(ev, x, m, n - 1);
}

static void torus_schedule(cm_eval *ev, cm_xfer *x, size_t count, double es)
{
    int p = ev->p;
    torus_cm g = {0};
    g.rank_at = malloc((size_t)p * sizeof *g.rank_at);
    g.place_of = malloc((size_t)p * sizeof *g.place_of);
    if (!g.rank_at || !g.place_of) {
        free(g.rank_at);
        free(g.place_of);
        ev->total = NAN;
        return;
    }
    if (ev->t->tpu) {
        dsim_tpu_torus(ev->t->tpu, g.dims, &g.nd, g.rank_at);
    } else {
        g.nd = 1;
        g.dims[0] = p;
        for (int r = 0; r < p; r++)
            g.rank_at[r] = r;
    }
    for (int i = 0, st = 1; i < g.nd; i++) {
        g.stride[i] = st;
        st *= g.dims[i];
    }
    for (int pl = 0; pl < p; pl++)
        g.place_of[g.rank_at[pl]] = pl;
    for (int i = 0; i < g.nd; i++)
        torus_cm_phase(ev, x, &g, i, count, es, 0);
    for (int i = g.nd - 1; i >= 0; i--)
        torus_cm_phase(ev, x, &g, i, count, es, 1);
    free(g.rank_at);
    free(g.place_of);
}

static size_t torus_msg_elems(size_t elems, int ranks)
{
    /* half the buffer, cut into blocks of the ring */
    return ((elems + 1) / 2 + (size_t)ranks - 1) / (size_t)ranks;
}

static double torus_local_copy(int p, double n, int *serial)
{
    /* out of place, the whole buffer into recvbuf on every rank */
    *serial = 0;
    return (double)p * n;
}

static const dsim_algo_cost cost_torus = {
    .size = sizeof(dsim_algo_cost),
    .algo = DSIM_ALGO_TORUS,
    .schedule = torus_schedule,
    .formula = ring_formula,
    .msg_elems = torus_msg_elems,
    .walks_buffer = true,
    .local_copy = torus_local_copy,
};

/* ---- recursive doubling: whole buffers at distance 1, 2, 4, ... ---- */

static void rd_schedule(cm_eval *ev, cm_xfer *x, size_t count, double es)
{
    int p = ev->p, q = cm_pow2_floor(p), rem = p - q;
    double all = (double)count * es;
    fold_step(ev, x, rem, all, 0); /* as rhd */
    for (int d = 1; d < q; d *= 2) {
        int n = 0;
        for (int v = 0; v < q; v++) {
            int peer = v ^ d;
            int a = fold_real(v, rem), b = fold_real(peer, rem);
            x[n++] = (cm_xfer){a, b, all, all};
        }
        dsim_cost_step(ev, x, n);
    }
    fold_step(ev, x, rem, all, 1);
}

static double rd_formula(int p, double n, double a, double b, double g)
{
    int q = cm_pow2_floor(p);
    double lg = log2((double)q);
    double t = lg * (a + n * b + n * g);
    return q == p ? t : t + 2 * a + 2 * n * b + n * g;
}

static double rd_local_copy(int p, double n, int *serial)
{
    /* what arrives lands in scratch and is combined from there: no copy
     * before the first combine, on any rank */
    (void)p;
    (void)n;
    *serial = 0;
    return 0;
}

static const dsim_algo_cost cost_rd = {
    .size = sizeof(dsim_algo_cost),
    .algo = DSIM_ALGO_RECURSIVE_DOUBLING,
    .schedule = rd_schedule,
    .formula = rd_formula,
    .msg_elems = whole_msg_elems,
    .local_copy = rd_local_copy,
};

const dsim_algo_cost *dsim_algo_cost_of(dsim_algo a)
{
    /* No default: every dsim_algo must be named here. */
    switch (a) {
    case DSIM_ALGO_AUTO:
        return NULL; /* the decision function picks one of the others */
    case DSIM_ALGO_RING:
        return &cost_ring;
    case DSIM_ALGO_RHD:
        return &cost_rhd;
    case DSIM_ALGO_TREE:
        return &cost_tree;
    case DSIM_ALGO_REDUCE_TO_ONE:
        return &cost_r2o;
    case DSIM_ALGO_HIERARCHICAL:
        return &cost_hier;
    case DSIM_ALGO_TORUS:
        return &cost_torus;
    case DSIM_ALGO_RECURSIVE_DOUBLING:
        return &cost_rd;
    case DSIM_ALGO_COUNT:
        break;
    }
    return NULL;
}
