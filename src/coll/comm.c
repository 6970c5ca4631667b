/* Communicators and the collective entry points: argument checks, the call
 * counter and deadline (dsim_coll_begin), the choice of algorithm, and the
 * trivial cases (count 0, one rank) that need no messages. The algorithms
 * are in ring.c, rhd.c, tree.c, reduce_to_one.c and barrier.c, the
 * allreduce ones listed in algos.c; the choice for AUTO in decide.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

dsim_err dsim_comm_create(const dsim_comm_cfg *cfg, dsim_comm **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_create: out is NULL");
    *out = NULL;
    if (!cfg)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_create: cfg is NULL");
    if (!cfg->ep)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_comm_create: cfg.ep is NULL; open the rank's endpoint with "
                        "dsim_ep_open first");
    if (cfg->size < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_create: cfg.size is %d; it must be >= 1",
                        cfg->size);
    int rank = dsim_ep_rank(cfg->ep);
    if (rank < 0 || rank >= cfg->size)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_comm_create: the endpoint is rank %d, outside a communicator of "
                        "%d ranks (0..%d)",
                        rank, cfg->size, cfg->size - 1);
    if ((int)cfg->algo < 0 || cfg->algo >= DSIM_ALGO_COUNT) {
        char last[48];
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_comm_create: cfg.algo %d is not a dsim_algo (DSIM_ALGO_AUTO .. %s)",
                        (int)cfg->algo,
                        dsim_coll_algo_enum_name(DSIM_ALGO_COUNT - 1, last, sizeof last));
    }
    if (cfg->local_size < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_comm_create: cfg.local_size is %d; give the ranks per host (>= 1) "
                        "or 0 when the hosts are not known",
                        cfg->local_size);
    if (cfg->comm_id & 0x80000000u)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_comm_create: cfg.comm_id %u has the top bit set, which marks the "
                        "ids derived for sub-communicators (dsim_comm_split); choose an id below "
                        "2^31",
                        (unsigned)cfg->comm_id);
    dsim_rt *rt = dsim_ep_rt(cfg->ep);
    if (!rt)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_create: the endpoint has no runtime");

    /* Per-peer state comes as the calls name peers (peers.c): nothing here
     * grows with the rank count. */
    dsim_comm *c = calloc(1, sizeof *c);
    if (!c)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_comm_create: out of memory");
    c->ep = cfg->ep;
    c->rt = rt;
    c->rank = rank;
    c->ep_rank = rank;
    c->size = cfg->size;
    c->comm_id = cfg->comm_id;
    c->local_size = cfg->local_size;
    c->origin = DSIM_COMM_ORIGIN_CREATE;
    c->color = -1;
    c->root = c;
    c->timeout_ns = cfg->timeout_ns >= 0 ? cfg->timeout_ns : DSIM_COMM_DEFAULT_TIMEOUT_NS;
    c->algo = cfg->algo;
    c->fp_off = cfg->no_fingerprint != 0;
    c->virt = cfg->virtual_payload != 0;
    c->fr_max = cfg->flight_recorder < 0    ? 0
                : cfg->flight_recorder == 0 ? DSIM_FR_DEFAULT_SIZE
                                            : (size_t)cfg->flight_recorder;
    c->fp_out.magic = DSIM_COLL_FP_MAGIC;
    c->fp_out.comm_id = c->comm_id;
    c->fp_out.root = -1;
    c->fp_out.op = c->fp_out.dtype = DSIM_COLL_FP_NONE;
    c->err.code = DSIM_OK;
    c->err.peer = -1;
    dsim_err e = dsim_coll_torus_init(c, cfg);
    if (e != DSIM_OK) {
        free(c);
        return e;
    }
    *out = c;
    return DSIM_OK;
}

void dsim_comm_destroy(dsim_comm *c)
{
    if (!c)
        return;
    if (c->origin != DSIM_COMM_ORIGIN_CREATE) {
        dsim_comm_free(c);
        return;
    }
    dsim_coll_subs_detach(c);
    dsim_coll_comm_release(c);
}

void dsim_coll_comm_release(dsim_comm *c)
{
    dsim_coll_peers_free(c);
    dsim_coll_hier_free(c);
    free(c->fp_pend);
    free(c->vin);
    free(c->fr);
    free(c->ep_of);
    free(c->groups);
    free(c->xlog);
    free(c);
}

int dsim_comm_rank(const dsim_comm *c)
{
    return c ? c->rank : -1;
}

int dsim_comm_size(const dsim_comm *c)
{
    return c ? c->size : 0;
}

void dsim_comm_set_timeout(dsim_comm *c, int64_t timeout_ns)
{
    if (c)
        c->timeout_ns = timeout_ns >= 0 ? timeout_ns : DSIM_COMM_DEFAULT_TIMEOUT_NS;
}

void dsim_comm_set_algo(dsim_comm *c, dsim_algo a)
{
    /* An out-of-range value is kept and refused, with a message, by the
     * next allreduce: a setter without a return value cannot report it. */
    if (c)
        c->algo = a;
}

void dsim_comm_set_decide(dsim_comm *c, dsim_decide_fn fn, void *user)
{
    if (c) {
        c->decide = fn;
        c->decide_user = fn ? user : NULL;
    }
}

void dsim_comm_last_call(const dsim_comm *c, const char **op, uint64_t *calls)
{
    const char *o = c ? atomic_load_explicit(&c->last_op, memory_order_relaxed) : NULL;
    uint64_t n = c ? atomic_load_explicit(&c->calls_seen, memory_order_relaxed) : 0;
    if (op)
        *op = o;
    if (calls)
        *calls = n;
}

const dsim_error *dsim_comm_error(const dsim_comm *c)
{
    static const dsim_error comm_no_comm = {DSIM_EINVAL, -1, __FILE__, __LINE__,
                                            "no communicator (NULL)"};
    return c ? &c->err : &comm_no_comm;
}

uint64_t dsim_comm_failed_calls(const dsim_comm *c)
{
    return c ? c->failed_calls : 0;
}

/* Records a bad-argument error on the thread and the communicator. */
#define COMM_BAD(c, ...)                                                                           \
    (DSIM_ERR(DSIM_EINVAL, -1, __VA_ARGS__), dsim_error_copy(&(c)->err), DSIM_EINVAL)

/* What the algorithms get for a count-0 call that still exchanges
 * fingerprints: a buffer nothing is read from or written to, so that no
 * algorithm does arithmetic on a NULL pointer. */
static char comm_nothing[16];

/* 1 when a call of count 0 can return at once: nothing is checked (one rank,
 * or fingerprints off). Otherwise it runs its algorithm, whose transfers are
 * then all empty: only the fingerprints move, and a rank that calls with 0
 * elements where the others pass more is named. */
static int comm_skip_empty(const dsim_comm *c)
{
    return c->size == 1 || c->fp_off;
}

static int comm_overlap(const void *a, const void *b, size_t len)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return len && x != y && x < y + len && y < x + len;
}

/* Checks what every collective shares: dtype, op (if has_op), the byte
 * count, and that the buffers exist. */
static dsim_err comm_check(dsim_comm *c, const char *fn, size_t count, size_t nblocks, dsim_dtype t,
                           int has_op, int op, const void *a, const char *aname, const void *b,
                           const char *bname)
{
    if ((int)t < 0 || t >= DSIM_DTYPE_COUNT)
        return COMM_BAD(c, "%s: dtype %d is not a dsim_dtype (DSIM_F32 .. DSIM_I64)", fn, (int)t);
    if (has_op && (op < 0 || op >= DSIM_OP_COUNT))
        return COMM_BAD(c, "%s: op %d is not a dsim_op (DSIM_SUM .. DSIM_PROD)", fn, op);
    size_t es = dsim_dtype_size(t);
    if (count > SIZE_MAX / es / nblocks)
        return COMM_BAD(c, "%s: count %zu of %s is too large for memory", fn, count,
                        dsim_dtype_name(t));
    if (count && aname && !a)
        return COMM_BAD(c, "%s: %s is NULL but count is %zu", fn, aname, count);
    if (count && bname && !b)
        return COMM_BAD(c, "%s: %s is NULL but count is %zu", fn, bname, count);
    return DSIM_OK;
}

dsim_err dsim_allreduce(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                        dsim_dtype t, dsim_op op)
{
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_allreduce: the communicator is NULL");
    return dsim_allreduce_with(c, sendbuf, recvbuf, count, t, op, c->algo);
}

static dsim_err comm_allreduce(dsim_comm *c, dsim_coll *xp, const void *sendbuf, void *recvbuf,
                               size_t count, dsim_dtype t, dsim_op op, dsim_algo algo)
{
    static const char fn[] = "dsim_allreduce";
    DSIM_CHECK(comm_check(c, fn, count, 1, t, 1, (int)op, sendbuf, "sendbuf", recvbuf, "recvbuf"));
    if ((int)algo < 0 || algo >= DSIM_ALGO_COUNT) {
        char names[256];
        return COMM_BAD(c, "%s: algorithm %d is not a dsim_algo; use %s", fn, (int)algo,
                        dsim_algo_list(names, sizeof names, 1, ", ", " or "));
    }
    size_t all = count * xp->esize;
    if (comm_overlap(sendbuf, recvbuf, all))
        return COMM_BAD(c,
                        "%s: sendbuf and recvbuf overlap without being the same buffer; pass "
                        "the same pointer twice for an in-place allreduce",
                        fn);
    if (algo == DSIM_ALGO_AUTO)
        algo = dsim_coll_decide(c, all);
    xp->what = "allreduce";
    xp->what_algo = dsim_algo_name(algo);
    dsim_coll_fp_set(xp, DSIM_COLL_ALLREDUCE, (unsigned)op, (unsigned)t, count, -1, algo);
    if (count == 0) {
        if (comm_skip_empty(c))
            return DSIM_OK;
        xp->fp_every = 1;
        sendbuf = recvbuf = comm_nothing;
    }
    if (c->size == 1) {
        dsim_coll_copy(xp, recvbuf, sendbuf, all);
        dsim_err e = dsim_coll_finish(xp, recvbuf, count, 1);
        return e == DSIM_OK ? e : dsim_coll_fail_local(xp, 0, e, "finishing the reduction");
    }
    /* algo is a dsim_algo other than AUTO here: its entry has both */
    const dsim_coll_algo *al = dsim_coll_algo_get(algo);
    xp->nsteps = al->steps(c);
    return al->allreduce(xp, sendbuf, recvbuf, count);
}

dsim_err dsim_allreduce_with(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             dsim_dtype t, dsim_op op, dsim_algo algo)
{
    static const char fn[] = "dsim_allreduce";
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the communicator is NULL", fn);
    dsim_coll x;
    dsim_coll_begin(c, &x, "allreduce", NULL, t, op, 0);
    return dsim_coll_end(&x, comm_allreduce(c, &x, sendbuf, recvbuf, count, t, op, algo));
}

static dsim_err comm_check_root(dsim_comm *c, const char *fn, int root)
{
    if (root < 0 || root >= c->size)
        return COMM_BAD(c, "%s: root %d is not a rank of this communicator (0..%d)", fn, root,
                        c->size - 1);
    return DSIM_OK;
}

static dsim_err comm_reduce(dsim_comm *c, dsim_coll *xp, const void *sendbuf, void *recvbuf,
                            size_t count, dsim_dtype t, dsim_op op, int root)
{
    static const char fn[] = "dsim_reduce";
    DSIM_CHECK(comm_check_root(c, fn, root));
    int is_root = c->rank == root;
    DSIM_CHECK(comm_check(c, fn, count, 1, t, 1, (int)op, sendbuf, "sendbuf", recvbuf,
                          is_root ? "recvbuf (on the root)" : NULL));
    if (is_root && comm_overlap(sendbuf, recvbuf, count * xp->esize))
        return COMM_BAD(c,
                        "%s: sendbuf and recvbuf overlap without being the same buffer; pass "
                        "the same pointer twice for an in-place reduce",
                        fn);
    dsim_coll_fp_set(xp, DSIM_COLL_REDUCE, (unsigned)op, (unsigned)t, count, root, DSIM_ALGO_TREE);
    xp->fp_both = 1;
    if (count == 0) {
        if (comm_skip_empty(c))
            return DSIM_OK;
        xp->fp_every = 1;
        sendbuf = recvbuf = comm_nothing;
    }
    if (c->size == 1) {
        dsim_coll_copy(xp, recvbuf, sendbuf, count * xp->esize);
        dsim_err e = dsim_coll_finish(xp, recvbuf, count, 1);
        return e == DSIM_OK ? e : dsim_coll_fail_local(xp, 0, e, "finishing the reduction");
    }
    return dsim_coll_tree_reduce(xp, sendbuf, recvbuf, count, root);
}

dsim_err dsim_reduce(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count, dsim_dtype t,
                     dsim_op op, int root)
{
    static const char fn[] = "dsim_reduce";
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the communicator is NULL", fn);
    dsim_coll x;
    dsim_coll_begin(c, &x, "reduce", "tree", t, op, dsim_coll_tree_reduce_steps(c->size));
    return dsim_coll_end(&x, comm_reduce(c, &x, sendbuf, recvbuf, count, t, op, root));
}

static dsim_err comm_broadcast(dsim_comm *c, dsim_coll *xp, void *buf, size_t count, dsim_dtype t,
                               int root)
{
    static const char fn[] = "dsim_broadcast";
    DSIM_CHECK(comm_check_root(c, fn, root));
    DSIM_CHECK(comm_check(c, fn, count, 1, t, 0, 0, buf, "buf", NULL, NULL));
    dsim_coll_fp_set(xp, DSIM_COLL_BROADCAST, DSIM_COLL_FP_NONE, (unsigned)t, count, root,
                     DSIM_ALGO_TREE);
    xp->fp_both = 1;
    if (c->size == 1)
        return DSIM_OK;
    if (count == 0) {
        if (comm_skip_empty(c))
            return DSIM_OK;
        xp->fp_every = 1;
        buf = comm_nothing;
    }
    return dsim_coll_tree_bcast(xp, buf, count, root);
}

dsim_err dsim_broadcast(dsim_comm *c, void *buf, size_t count, dsim_dtype t, int root)
{
    static const char fn[] = "dsim_broadcast";
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the communicator is NULL", fn);
    dsim_coll x;
    dsim_coll_begin(c, &x, "broadcast", "tree", t, DSIM_SUM, dsim_coll_tree_bcast_steps(c->size));
    return dsim_coll_end(&x, comm_broadcast(c, &x, buf, count, t, root));
}

static dsim_err comm_allgather(dsim_comm *c, dsim_coll *xp, const void *sendbuf, void *recvbuf,
                               size_t sendcount, dsim_dtype t)
{
    static const char fn[] = "dsim_allgather";
    DSIM_CHECK(comm_check(c, fn, sendcount, (size_t)c->size, t, 0, 0, sendbuf, "sendbuf", recvbuf,
                          "recvbuf"));
    dsim_coll_fp_set(xp, DSIM_COLL_ALLGATHER, DSIM_COLL_FP_NONE, (unsigned)t, sendcount, -1,
                     DSIM_ALGO_RING);
    if (sendcount == 0) {
        if (comm_skip_empty(c))
            return DSIM_OK;
        xp->fp_every = 1;
        sendbuf = recvbuf = comm_nothing;
    }
    /* Any overlap is fine: this rank's block is moved into place before
     * anything is received, and sendbuf is not read again. */
    if (c->size == 1) {
        dsim_coll_copy(xp, recvbuf, sendbuf, sendcount * xp->esize);
        return DSIM_OK;
    }
    return dsim_coll_ring_allgather(xp, sendbuf, recvbuf, sendcount);
}

dsim_err dsim_allgather(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount,
                        dsim_dtype t)
{
    static const char fn[] = "dsim_allgather";
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the communicator is NULL", fn);
    dsim_coll x;
    dsim_coll_begin(c, &x, "allgather", "ring", t, DSIM_SUM,
                    dsim_coll_ring_allgather_steps(c->size));
    return dsim_coll_end(&x, comm_allgather(c, &x, sendbuf, recvbuf, sendcount, t));
}

static dsim_err comm_reduce_scatter(dsim_comm *c, dsim_coll *xp, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, dsim_dtype t, dsim_op op)
{
    static const char fn[] = "dsim_reduce_scatter";
    DSIM_CHECK(comm_check(c, fn, recvcount, (size_t)c->size, t, 1, (int)op, sendbuf, "sendbuf",
                          recvbuf, "recvbuf"));
    size_t blen = recvcount * xp->esize;
    if (recvcount && (uintptr_t)recvbuf < (uintptr_t)sendbuf + blen * (size_t)c->size &&
        (uintptr_t)sendbuf < (uintptr_t)recvbuf + blen)
        return COMM_BAD(c,
                        "%s: recvbuf overlaps sendbuf; reduce_scatter has no in-place form, so "
                        "pass a separate recvbuf of recvcount elements",
                        fn);
    dsim_coll_fp_set(xp, DSIM_COLL_REDUCE_SCATTER, (unsigned)op, (unsigned)t, recvcount, -1,
                     DSIM_ALGO_RING);
    if (recvcount == 0) {
        if (comm_skip_empty(c))
            return DSIM_OK;
        xp->fp_every = 1;
        sendbuf = comm_nothing;
        recvbuf = comm_nothing + 8;
    }
    if (c->size == 1) {
        dsim_coll_copy(xp, recvbuf, sendbuf, blen);
        dsim_err e = dsim_coll_finish(xp, recvbuf, recvcount, 1);
        return e == DSIM_OK ? e : dsim_coll_fail_local(xp, 0, e, "finishing the reduction");
    }
    return dsim_coll_ring_reduce_scatter(xp, sendbuf, recvbuf, recvcount);
}

dsim_err dsim_reduce_scatter(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                             dsim_dtype t, dsim_op op)
{
    static const char fn[] = "dsim_reduce_scatter";
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the communicator is NULL", fn);
    dsim_coll x;
    dsim_coll_begin(c, &x, "reduce_scatter", "ring", t, op,
                    dsim_coll_ring_reduce_scatter_steps(c->size));
    return dsim_coll_end(&x, comm_reduce_scatter(c, &x, sendbuf, recvbuf, recvcount, t, op));
}

static dsim_err comm_barrier(dsim_comm *c, dsim_coll *xp)
{
    dsim_coll_fp_set(xp, DSIM_COLL_BARRIER, DSIM_COLL_FP_NONE, DSIM_COLL_FP_NONE, 0, -1,
                     DSIM_ALGO_AUTO);
    if (c->size == 1)
        return DSIM_OK;
    return dsim_coll_dissemination_barrier(xp);
}

dsim_err dsim_barrier(dsim_comm *c)
{
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_barrier: the communicator is NULL");
    dsim_coll x;
    dsim_coll_begin(c, &x, "barrier", "dissemination", DSIM_I32, DSIM_SUM,
                    dsim_coll_barrier_steps(c->size));
    return dsim_coll_end(&x, comm_barrier(c, &x));
}
