/* Internal to src/coll: the communicator object, the per-call context every
 * collective algorithm runs in, and the algorithms themselves.
 *
 * An algorithm is a plain function written against the transport API only
 * (dsim_isend / dsim_irecv / dsim_irecv_reduce / dsim_wait), in the style of
 * Open MPI's coll/base. It describes each step as a short list of transfers
 * and hands it to dsim_coll_run, which posts the receives before the sends,
 * waits with the call's deadline and, on failure, records an error that names
 * the collective, the algorithm, the step and the peer. */
#ifndef DSIM_COLL_INT_H
#define DSIM_COLL_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include "dsim/comm.h"
#include "dsim/reduce.h"
#include "dsim/rt.h"

/* A rank's answer in the failure check after a timeout (step.c): the rank it
 * was waiting for and its fingerprint of the call, so that a rank that is in
 * another call than it should be is named as such. */
typedef struct dsim_coll_fc {
    int32_t awaited;
    uint32_t pad;
    dsim_coll_fp fp;
} dsim_coll_fc;

/* What a rank keeps about one peer it exchanges with (dsim_coll_peer_get):
 * only the peers its calls' transfers name, and every rank once a failure
 * check ran, so that a job of W ranks holds O(peers used) per rank, not
 * O(W). A peer never created reads as all zero. Receives are posted into
 * fp_in and fc_in, so a peer never moves once created (chunks, below). */
typedef struct dsim_coll_peer {
    int rank;
    /* Failure check (step.c): answered (1), visited (2), or its answer
     * revealed lost frames (4). */
    uint8_t fc_flags;
    /* Its answer in the failure check after a timeout: under this call's tag
     * [0] and the previous call's [1]. Owned by the communicator because a
     * cancelled receive must never point at a dead stack frame. */
    dsim_coll_fc fc_in[2];
    /* call + 1 when a message of that call arrived from it: a rank that sent
     * in this call joined it, so a silent failure check from it means "late
     * or stuck", not "never joined". */
    uint64_t heard;
    /* Fingerprints (see step.c). fp_in is what it sent; fp_sent and fp_seen
     * are call + 1 once this call's fingerprint went to it / its was
     * checked, so nothing needs clearing between calls. fp_req: its
     * fingerprint receive still to check (listed in dsim_comm.fp_pend). */
    dsim_coll_fp fp_in;
    uint64_t fp_sent, fp_seen;
    dsim_req *fp_req;
} dsim_coll_peer;

/* Peers are allocated in chunks that are never moved or freed before the
 * communicator: the first holds 8, each later one as many as all before
 * (up to DSIM_COLL_PEER_CHUNK_MAX), so a rank that talks to few peers
 * allocates little and one that talks to all makes few allocations. */
typedef struct dsim_coll_peer_chunk {
    struct dsim_coll_peer_chunk *next;
    int cap, used;
    dsim_coll_peer p[];
} dsim_coll_peer_chunk;

/* What the hierarchical all-reduce knows of a communicator's hosts
 * (hierarchical.c), worked out at its first call: uniform is 1 when every
 * host the communicator spans holds the same number of its ranks (L of
 * them on each of H hosts, H >= 2 and L >= 2); then this rank is local
 * index me_l on host me_h, and rank_at[h * L + l] is the rank at (h, l)
 * (NULL when that is h * L + l: a communicator whose ranks are its
 * endpoints', host by host). */
typedef struct dsim_coll_hier {
    int uniform;
    int H, L, me_h, me_l;
    int *rank_at;
} dsim_coll_hier;

/* How a communicator was made (dsim_comm_origin, dsim/comm.h), what a
 * sub-communicator keeps of it for messages and flight records, and the
 * create_group calls its members made from it (to number the next one). */
typedef struct dsim_coll_group_count {
    uint64_t hash; /* of the ranks' endpoint numbers, in the group's order */
    uint32_t made;
} dsim_coll_group_count;

struct dsim_comm {
    dsim_ep *ep;
    dsim_rt *rt;
    int rank, size;
    uint32_t comm_id;
    /* The endpoints behind the ranks. A communicator made by
     * dsim_comm_create has the endpoints' own ranks (ep_of NULL: rank r is
     * endpoint r); a sub-communicator's rank r is endpoint ep_of[r], and
     * every transfer is addressed through it (dsim_coll_ep). ep_rank: this
     * rank's endpoint. */
    int ep_rank;
    int *ep_of;
    /* Ranks per host in the endpoints' numbering (endpoint e is on host
     * e / local_size); 0: not known. Sub-communicators inherit it. */
    int local_size;
    dsim_coll_hier *hier;
    /* Origin (dsim_comm_origin), the parent's id and the split's color (-1
     * for a group), for messages and flight records. */
    int origin;
    uint32_t parent_id;
    int color;
    /* The communicator made by dsim_comm_create that this one descends
     * from (itself for that one; NULL once it is destroyed before this one
     * is freed). It lists its live sub-communicators (subs, linked through
     * sub_next/sub_prev), keeps the flight records of the last freed ones
     * (retired, the last 16), numbers them (made_seq), and holds
     * the exchange log (comm.c, dsim_comm_exchange_begin). A rank's
     * communicators are used by that rank's thread, so none of it is
     * locked. */
    struct dsim_comm *root;
    struct dsim_comm *subs, *sub_next, *sub_prev;
    uint64_t made_seq, nmade;
    dsim_fr_dump *retired;
    int nretired;
    dsim_coll_group_count *groups;
    int ngroups;
    struct dsim_coll_xlog *xlog;
    int64_t timeout_ns; /* > 0 the bound of each call; 0 none */
    dsim_algo algo;
    /* dsim_comm_set_decide's: what AUTO runs (NULL: decide.c alone) */
    dsim_decide_fn decide;
    void *decide_user;
    /* Collective calls started on this communicator. Every rank calls the
     * collectives in the same order, so the counter agrees across ranks and
     * is folded into every tag: a late message from a failed call cannot
     * match a receive of a later one. The tag keeps it mod 0xFFFFF; each
     * time that wraps, the communicator's epoch goes up (step.c), which
     * drops what is left of the calls before. 64 bits: never wraps itself. */
    uint64_t calls;
    uint64_t failed_calls; /* calls that returned an error (dsim_comm_failed_calls) */
    /* The same count and the last collective's name, for a watchdog on
     * another thread (dsim_comm_last_call). */
    _Atomic uint64_t calls_seen;
    _Atomic(const char *) last_op;
    dsim_error err;
    /* Per-peer state, only for the peers this rank exchanges with (see
     * dsim_coll_peer above): peer_map is an open-addressing table of
     * peer_mask + 1 slots (a power of two, at most half full) from rank to
     * peer, rehashed into a larger one as peers come; the peers themselves
     * live in peer_chunks and never move. peer_last is the peer found last:
     * a step's transfers mostly name the same peer again. */
    dsim_coll_peer **peer_map;
    uint32_t peer_mask;
    int npeers;
    dsim_coll_peer_chunk *peer_chunks;
    dsim_coll_peer *peer_last;
    /* This rank's own answer in the failure check after a timeout. */
    dsim_coll_fc fc_mine;
    /* Fingerprints (see step.c). fp_out is this call's, as sent to every
     * peer: owned here, not by the call's stack frame, for the same reason
     * as fc_mine. */
    int fp_off;
    dsim_coll_fp fp_out;
    /* Fingerprint receives still to check: peer fp_pend[i]'s fp_req for i
     * in [0 .. fp_npend) (fp_pend_cap slots, grown before a step posts).
     * A receive from p is checked before the first receive of a payload
     * from p; rooted collectives (x->fp_both) also await the fingerprint of
     * each peer they only send to, at the end of the call. */
    int *fp_pend;
    int fp_npend, fp_pend_cap;
    /* The flight recorder: fr[call % fr_max] once fr_cap entries exist
     * (grown by doubling as calls come, up to fr_max; fr_max 0: none). */
    dsim_fr_entry *fr;
    size_t fr_cap, fr_max;
    dsim_fr_entry *fr_cur; /* the call in progress, or NULL */
    /* dsim_comm_cfg.virtual_payload; vin[i]: where transfer i of a step
     * receives the length a virtual frame stands for (vin_cap slots). */
    int virt;
    uint64_t *vin;
    int vin_cap;
    /* dsim_comm_cfg.torus_*: the torus algorithm's dimensions (dims of one
     * place dropped), this rank's coordinates and place, and the borrowed
     * place -> rank table (NULL: rank = place). torus_ndims 0: no torus. */
    int torus_ndims;
    int torus_dims[DSIM_TORUS_MAX_DIMS];
    int torus_coord[DSIM_TORUS_MAX_DIMS];
    int torus_place;
    const int *torus_rank;
};

/* One collective call in progress. */
typedef struct dsim_coll {
    dsim_comm *c;
    int rank, size;
    /* "allreduce" and "ring": the message prefix "allreduce(ring)", put
     * together only when a message is written (step.c, step_what) */
    const char *what, *what_algo;
    int nsteps;    /* this algorithm's step count, for messages */
    uint64_t call; /* the call counter value of this call */
    int64_t t0;    /* dsim_rt_now when it began */
    int64_t deadline;
    dsim_dtype t;
    dsim_op op;
    size_t esize;
    /* 1: fingerprints go both ways on every edge, not only along the data
     * (see step.c): set for rooted collectives, where ranks that disagree
     * on the root could otherwise all finish without noticing. */
    int fp_both;
    /* 1: every receiver checks every sender, not only the first message of
     * each pair: set for count-0 calls, which wait for no payload that
     * would otherwise hold them until a mismatch is found. */
    int fp_every;
    /* 1: the payloads move for real even on a virtual communicator (a
     * split's colors and keys, which decide what is made). */
    int real;
} dsim_coll;

/* The endpoint rank behind rank r of c (0 <= r < size). */
static inline int dsim_coll_ep(const dsim_comm *c, int r)
{
    return c->ep_of ? c->ep_of[r] : r;
}

/* "communicator 1", "sub-communicator 2913746501 (split of 1, color 0)",
 * "sub-communicator 2913746501 (group of 1)": the communicator as messages
 * name it; returns buf. */
const char *dsim_coll_comm_name(const dsim_comm *c, char *buf, size_t cap);
/* "rank 5" on a communicator of the endpoints' own ranks, "rank 1 (world
 * rank 5)" on a sub-communicator: rank r of c in both numberings. */
const char *dsim_coll_rank_name(const dsim_comm *c, int r, char *buf, size_t cap);

/* Local copies and the reduction's finish, which a virtual communicator
 * (timing only: its buffers are never read or written) skips. */
static inline void dsim_coll_copy(const dsim_coll *x, void *dst, const void *src, size_t len)
{
    if (len && dst != src && (!x->c->virt || x->real))
        memmove(dst, src, len);
}
static inline dsim_err dsim_coll_finish(const dsim_coll *x, void *buf, size_t count, int n)
{
    return x->c->virt && !x->real ? DSIM_OK : dsim_reduce_finish(buf, count, x->t, x->op, n);
}

/* The exchange log of a root communicator (dsim_comm_exchange_begin): the
 * distinct (communicator, collective, algorithm) of the calls made while it
 * is on, in the order first made. */
#define DSIM_COLL_XLOG_MAX 8
typedef struct dsim_coll_xlog {
    int on;
    int n, more; /* entries; calls of other kinds beyond the table */
    struct {
        uint32_t comm_id;
        int size;
        uint8_t coll, algo;
        uint32_t calls;
        char name[96]; /* the communicator as dsim_coll_comm_name says it */
    } e[DSIM_COLL_XLOG_MAX];
} dsim_coll_xlog;
/* Notes call x in its root's exchange log when that is on (step.c, at the
 * end of every call). */
void dsim_coll_xlog_note(const dsim_coll *x);

typedef enum dsim_xfer_kind {
    DSIM_XF_SEND,
    DSIM_XF_RECV,
    DSIM_XF_RECV_REDUCE, /* combine into buf with the call's dtype and op */
} dsim_xfer_kind;

/* One transfer of a step. len is in bytes; a transfer of 0 bytes is skipped
 * (both sides compute the same lengths, so both skip it). step (1-based) is
 * the step the transfer belongs to: it goes into the tag and into the error
 * message. from: a RECV_REDUCE's own operand when it is not buf (buf =
 * from (op) message, dsim_irecv_reduce_from: out of place without a copy
 * first); NULL, buf. */
typedef struct dsim_xfer {
    dsim_xfer_kind kind;
    int peer;
    int step;
    void *buf;
    size_t len;
    const void *from;
} dsim_xfer;

/* Frees what a communicator holds and the communicator (comm.c), after its
 * sub-communicator links are undone (subcomm.c). */
void dsim_coll_comm_release(dsim_comm *c);
/* A root communicator's destruction: its live sub-communicators forget it,
 * its retired flight records go (subcomm.c). */
void dsim_coll_subs_detach(dsim_comm *c);
/* What AUTO runs for an allreduce of bytes on c (decide.c). */
dsim_algo dsim_coll_decide(dsim_comm *c, size_t bytes);

/* Starts a call: takes the next call number, sets the deadline to now +
 * the communicator's timeout (none when it is 0) and starts the call's
 * fingerprint (collective, call number, communicator; the rest is filled in
 * with dsim_coll_fp_set once the arguments are checked). what is
 * "allreduce", algo NULL or "ring". */
void dsim_coll_begin(dsim_comm *c, dsim_coll *x, const char *what, const char *algo, dsim_dtype t,
                     dsim_op op, int nsteps);
/* Completes the fingerprint of the call: op and dtype (DSIM_COLL_FP_NONE
 * where the collective has none), count, root (-1 none), algorithm. */
void dsim_coll_fp_set(dsim_coll *x, dsim_coll_kind kind, unsigned op, unsigned dtype,
                      uint64_t count, int root, dsim_algo algo);
/* Posts every receive of xf, then every send, then waits for all of them
 * (receives first, in order). On failure the others are cancelled and the
 * error is recorded on the thread and on the communicator. */
dsim_err dsim_coll_run(dsim_coll *x, const dsim_xfer *xf, int n);
/* Ends a call that returned e: on success checks the fingerprints still
 * awaited (rooted collectives), on failure drops them. Every collective
 * returns through it once dsim_coll_begin was called. */
dsim_err dsim_coll_end(dsim_coll *x, dsim_err e);
/* Records a local failure (a reduction kernel, an allocation) of step. */
dsim_err dsim_coll_fail_local(dsim_coll *x, int step, dsim_err e, const char *what);

/* How long the failure check after a timeout listens for the other ranks'
 * answers: half the timeout, within [50 ms, 2 s] (see step.c). The
 * detection bound (dsim/health.h) adds it to the timeout. */
int64_t dsim_coll_grace_ns(int64_t timeout_ns);

/* The state of peer p (0 <= p < size), or NULL if this rank never
 * exchanged with it (read that as all zero). Cheap: the last peer found is
 * remembered, and otherwise it is one probe of a hash table at most half
 * full. */
static inline dsim_coll_peer *dsim_coll_peer_get(dsim_comm *c, int p)
{
    dsim_coll_peer *q = c->peer_last;
    if (q && q->rank == p)
        return q;
    if (!c->peer_map)
        return NULL;
    for (uint32_t h = ((uint32_t)p * 0x9E3779B1u) & c->peer_mask;; h = (h + 1) & c->peer_mask) {
        q = c->peer_map[h];
        if (!q || q->rank == p)
            break;
    }
    if (q)
        c->peer_last = q;
    return q;
}
/* The state of peer p, created (zeroed) if it does not exist yet; NULL when
 * out of memory (nothing changed then). */
dsim_coll_peer *dsim_coll_peer_make(dsim_comm *c, int p);
/* Frees every peer (dsim_comm_destroy). */
void dsim_coll_peers_free(dsim_comm *c);
/* For tests and the curious: how many peers the communicator keeps state
 * for, and the bytes that state takes (peers, their chunks, the table and
 * the list of pending fingerprint receives). */
int dsim_coll_peer_count(const dsim_comm *c);
size_t dsim_coll_peer_bytes(const dsim_comm *c);

/* Element offset and length of block b when count elements are split into
 * nb blocks: the first count % nb blocks hold one element more. */
static inline size_t dsim_coll_block_off(size_t count, int nb, int b)
{
    size_t q = count / (size_t)nb, r = count % (size_t)nb;
    return (size_t)b * q + ((size_t)b < r ? (size_t)b : r);
}
static inline size_t dsim_coll_block_cnt(size_t count, int nb, int b)
{
    return count / (size_t)nb + ((size_t)b < count % (size_t)nb ? 1 : 0);
}
/* ceil(log2(n)) for n >= 1. */
static inline int dsim_coll_ceil_log2(int n)
{
    int l = 0;
    while ((1 << l) < n)
        l++;
    return l;
}
/* The largest power of two p <= n (n >= 1), and log2(p) in *levels. */
static inline int dsim_coll_pow2_floor(int n, int *levels)
{
    int p = 1, l = 0;
    while (p <= n / 2) {
        p *= 2;
        l++;
    }
    *levels = l;
    return p;
}
/* The fold of rhd and recursive doubling (n ranks, p = the power of two
 * below, rem = n - p): the even rank of each of the first rem pairs hands
 * its buffer to the odd one; the real rank of new rank q (0 .. p-1). */
static inline int dsim_coll_fold_real(int q, int rem)
{
    return q < rem ? 2 * q + 1 : q + rem;
}

/* One allreduce algorithm: its entry in the table of algos.c, one per
 * dsim_algo. */
typedef struct dsim_coll_algo {
    size_t size;         /* sizeof(dsim_coll_algo) */
    dsim_algo algo;      /* its index in the table */
    const char *name;    /* "ring": what dsim_algo_parse accepts and scenarios name */
    const char *summary; /* one line, for `dsim list algorithms` */
    /* The steps of one call on c (for messages). NULL only for auto,
     * which runs what dsim_allreduce_decide picks. */
    int (*steps)(dsim_comm *c);
    /* Runs it: size >= 2, count >= 1, sendbuf may equal recvbuf; the
     * caller has begun x. NULL only for auto. */
    dsim_err (*allreduce)(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
} dsim_coll_algo;

/* The entry of algorithm a; NULL when a is not a dsim_algo. */
const dsim_coll_algo *dsim_coll_algo_get(dsim_algo a);
/* "DSIM_ALGO_REDUCE_TO_ONE" for DSIM_ALGO_REDUCE_TO_ONE (messages). */
const char *dsim_coll_algo_enum_name(dsim_algo a, char *buf, size_t cap);

/* Allreduce algorithms. Called with size >= 2 and count >= 1; sendbuf may
 * equal recvbuf. The caller has begun x with the algorithm's step count. */
int dsim_coll_ring_allreduce_steps(dsim_comm *c);
dsim_err dsim_coll_ring_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
int dsim_coll_rd_allreduce_steps(dsim_comm *c);
dsim_err dsim_coll_rd_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
int dsim_coll_rhd_allreduce_steps(dsim_comm *c);
dsim_err dsim_coll_rhd_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
int dsim_coll_tree_allreduce_steps(dsim_comm *c);
dsim_err dsim_coll_tree_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
int dsim_coll_r2o_allreduce_steps(dsim_comm *c);
dsim_err dsim_coll_r2o_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
/* hierarchical.c: two levels over the communicator's hosts. */
int dsim_coll_hier_allreduce_steps(dsim_comm *c);
dsim_err dsim_coll_hier_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
/* The communicator's hosts as the hierarchical all-reduce sees them
 * (c->hier, worked out at the first call); NULL when out of memory. */
const dsim_coll_hier *dsim_coll_hier_of(dsim_comm *c);
void dsim_coll_hier_free(dsim_comm *c);
int dsim_coll_torus_allreduce_steps(int size);
dsim_err dsim_coll_torus_allreduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count);
/* The torus of c (comm.c): checks cfg's torus_* and keeps it in c. */
dsim_err dsim_coll_torus_init(dsim_comm *c, const dsim_comm_cfg *cfg);

/* The other collectives (size >= 2, count >= 1). */
int dsim_coll_tree_reduce_steps(int size);
dsim_err dsim_coll_tree_reduce(dsim_coll *x, const void *sendbuf, void *recvbuf, size_t count,
                               int root);
int dsim_coll_tree_bcast_steps(int size);
dsim_err dsim_coll_tree_bcast(dsim_coll *x, void *buf, size_t count, int root);
int dsim_coll_ring_allgather_steps(int size);
dsim_err dsim_coll_ring_allgather(dsim_coll *x, const void *sendbuf, void *recvbuf,
                                  size_t sendcount);
int dsim_coll_ring_reduce_scatter_steps(int size);
dsim_err dsim_coll_ring_reduce_scatter(dsim_coll *x, const void *sendbuf, void *recvbuf,
                                       size_t recvcount);
int dsim_coll_barrier_steps(int size);
dsim_err dsim_coll_dissemination_barrier(dsim_coll *x);

#endif
