/* Communicators and collectives.
 *
 * A communicator is `size` ranks over one fabric; every rank creates its own
 * dsim_comm with the same comm_id. Every collective must be called by every
 * rank in the same order. Each call has a deadline (now + the comm's
 * timeout, TF's CommunicationOptions.timeout_seconds); on timeout, peer loss
 * or abort every rank returns an error and dsim_comm_error() names the failed
 * peer. A communicator without a timeout (0) waits until the call completes
 * or the fabric is aborted (dsim_fabric_abort, which is what the health
 * check of dsim/health.h does when a peer stops answering): with neither, a
 * lost peer is waited for for ever.
 *
 * After an abort every later call fails at once with DSIM_EABORTED, and its
 * message carries the abort's reason (the peer and why), until the group is
 * formed again on a new fabric.
 *
 * Every rank ends an allreduce with identical bits, and the same inputs,
 * algorithm and rank count give the same bits on every run.
 *
 * Every call carries a fingerprint (dsim_coll_fp: communicator, call number,
 * collective, reduce op, dtype, count, root, algorithm). Each pair of ranks
 * that exchange data in a call also exchanges one fingerprint, ahead of the
 * first payload, and the receiver compares it with its own before it sends
 * anything on or returns. The rank that finds a mismatch fails with
 * DSIM_EPROTO and a message naming both ranks, both fingerprints and the
 * fields that differ ("collective mismatch on communicator 0: rank 1 called
 * allreduce #17 with 2 float32 (sum, tree); rank 0 called allreduce #17 with
 * 1 float64 (sum, tree): dtype and count differ"), and aborts the fabric
 * with that text, so every other rank still in the call fails at once with
 * it (DSIM_EABORTED) instead of waiting for its timeout; a rank that already
 * finished its part (a rooted collective) fails with it at its next call. A
 * desynchronised job cannot go on: the abort is permanent, as for a lost
 * peer. Ranks that run different algorithms (counts on both sides of a
 * decision threshold) find it within about 20 ms; ranks that disagree on a
 * root, at the timeout, whose message then names the mismatch. A count-0
 * call exchanges fingerprints too, so a rank that passes 0 elements where
 * the others pass more is caught. The fingerprint rides on the first
 * payload frame to each peer (the transport's sideband, dsim_isend_side):
 * no message of its own, except a rooted collective's answers (see
 * docs/performance.md for what it costs). */
#ifndef DSIM_COMM_H
#define DSIM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/reduce.h"
#include "dsim/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_algo {
    DSIM_ALGO_AUTO = 0,
    DSIM_ALGO_RING,          /* reduce-scatter + all-gather around a ring */
    DSIM_ALGO_RHD,           /* Rabenseifner recursive halving/doubling */
    DSIM_ALGO_TREE,          /* binomial reduce + binomial broadcast */
    DSIM_ALGO_REDUCE_TO_ONE, /* TF's ReductionToOneDevice: gather to rank 0, broadcast */
    DSIM_ALGO_HIERARCHICAL,  /* reduce-scatter in a host, all-reduce across hosts, all-gather */
    DSIM_ALGO_TORUS,         /* reduce-scatter, then all-gather, along each dimension of a
                                torus in turn, over bidirectional rings (a TPU's ICI) */
    DSIM_ALGO_RECURSIVE_DOUBLING, /* whole buffers exchanged at distance 1, 2, 4, ...:
                                     log2(n) steps (small messages) */
    DSIM_ALGO_COUNT
} dsim_algo;

/* "auto", "ring", "rhd", "tree", "reduce_to_one", "hierarchical", "torus",
 * "recursive_doubling";
 * "unknown" when a is not a dsim_algo. */
DSIM_API const char *dsim_algo_name(dsim_algo a);
DSIM_API dsim_err dsim_algo_parse(const char *s, dsim_algo *out);
/* One line on what algorithm a does ("" when a is not a dsim_algo). */
DSIM_API const char *dsim_algo_summary(dsim_algo a);
/* The algorithms' names for a message, in the enum's order, written into
 * buf[cap] and returned: with_auto puts "auto" first; sep goes between
 * names and last before the last one (NULL: ", "). E.g. (0, ", ", " or ")
 * gives "ring, rhd, tree or reduce_to_one". */
DSIM_API const char *dsim_algo_list(char *buf, size_t cap, int with_auto, const char *sep,
                                    const char *last);

/* The decision function: which algorithm AUTO uses for an allreduce of
 * `bytes` bytes over `nranks` ranks whose hosts are not known. */
DSIM_API dsim_algo dsim_allreduce_decide(size_t bytes, int nranks);
/* The same over `hosts` hosts of `local` ranks each (nranks = hosts *
 * local); hosts or local 0: not known (as dsim_allreduce_decide). What AUTO
 * runs on a communicator whose topology is known (dsim_comm_cfg.local_size):
 * see src/coll/decide.c for when that is the hierarchical algorithm. */
DSIM_API dsim_algo dsim_allreduce_decide_hosts(size_t bytes, int hosts, int local);

typedef struct dsim_comm dsim_comm;

/* A collective timeout that asks for the default, DSIM_COMM_DEFAULT_TIMEOUT_NS
 * (any negative value does). */
#define DSIM_TIMEOUT_DEFAULT         (-1)
#define DSIM_COMM_DEFAULT_TIMEOUT_NS (30LL * 1000 * 1000 * 1000)

/* The most dimensions of a communicator's torus (dsim_comm_cfg.torus_*): a
 * TPU slice's cores of a chip, x, y and z. */
#define DSIM_TORUS_MAX_DIMS 4

typedef struct dsim_comm_cfg {
    dsim_ep *ep;        /* this rank's endpoint; its rank is the comm rank */
    int size;           /* ranks in the communicator */
    uint32_t comm_id;   /* same on every rank; distinct per communicator */
    int64_t timeout_ns; /* per collective call: > 0 the bound; 0 none (only an abort
                           ends a wait); < 0 (DSIM_TIMEOUT_DEFAULT) 30 s */
    dsim_algo algo;     /* allreduce algorithm; AUTO lets the decision pick */
    /* 1: calls carry no fingerprint and nothing is checked. Only for
     * measuring what the check costs (dsim bench allreduce --fingerprint 0);
     * every rank must agree, or the ranks that check wait for fingerprints
     * that never come until their timeout. 0 (the zeroed default): on. */
    int no_fingerprint;
    /* Calls the flight recorder keeps (the last ones): 0 the default,
     * DSIM_FR_DEFAULT_SIZE; < 0 none. */
    int flight_recorder;
    /* 1: timing only. Every payload is virtual (dsim_isend_virtual): a
     * transfer carries its length, not its bytes; a receive checks the
     * length and neither copies nor combines. The algorithms still run
     * every step with its real peers and message sizes, so a cost model on
     * the transport (the sim engine's network model) times them. Only an
     * in-place DSIM_SUM allreduce is allowed; its buffer is an address
     * range that is never read or written (it may be mapped PROT_NONE).
     * Every rank must agree. 0: real payloads. */
    int virtual_payload;
    /* Ranks per host: rank r is on host r / local_size (the driver's hosts
     * x devices_per_host: local_size = devices_per_host). 0: not known.
     * The hierarchical algorithm and the decision function read it;
     * sub-communicators inherit it (by their ranks' endpoints). */
    int local_size;
    /* Where the ranks sit on a torus, for the torus algorithm (a TPU slice's
     * ICI: dsim_tpu_torus in dsim/tpu.h gives all three for a slice).
     * torus_ndims (0 .. DSIM_TORUS_MAX_DIMS) dimensions of torus_dims[i] >= 1
     * places each; a place's index is c0 + d0 (c1 + d1 (c2 + ...)), and
     * torus_rank[place] is the rank there (NULL: rank = place). The product
     * of the dimensions must be size and torus_rank a permutation of the
     * ranks: dsim_comm_create refuses anything else, naming both (it reads
     * the whole table once: O(size)). torus_rank is borrowed: it must
     * outlive the communicator. 0 dimensions (the zeroed default): no torus,
     * and the torus algorithm runs as one bidirectional ring of every rank
     * in rank order. Every rank must give the same torus. */
    int torus_ndims;
    int torus_dims[DSIM_TORUS_MAX_DIMS];
    const int *torus_rank;
} dsim_comm_cfg;

DSIM_API dsim_err dsim_comm_create(const dsim_comm_cfg *cfg, dsim_comm **out);
/* Destroys a communicator made by dsim_comm_create (a sub-communicator:
 * the same as dsim_comm_free). Free its sub-communicators first, or after:
 * either order is safe, and the flight records of the ones freed before go
 * with it. */
DSIM_API void dsim_comm_destroy(dsim_comm *c);
DSIM_API int dsim_comm_rank(const dsim_comm *c);
DSIM_API int dsim_comm_size(const dsim_comm *c);
/* As dsim_comm_cfg.timeout_ns: > 0 the bound, 0 none, < 0 the default. */
DSIM_API void dsim_comm_set_timeout(dsim_comm *c, int64_t timeout_ns);
DSIM_API void dsim_comm_set_algo(dsim_comm *c, dsim_algo a);
/* What DSIM_ALGO_AUTO runs, decided outside the library: a cost model of the
 * job's own network (dsim's harness sets one when a scenario names its
 * network) picks the algorithm for an allreduce of `bytes` over `nranks`
 * ranks that sit `local` to a host on `hosts` hosts (both 0 when the
 * communicator's ranks are not spread evenly over hosts, or it does not
 * know). DSIM_ALGO_AUTO: no opinion, the built-in decision
 * (dsim_allreduce_decide_hosts) stands, as it does for an algorithm the
 * communicator cannot run (hierarchical without hosts >= 2 of local >= 2).
 * It must be a function of its arguments alone, so that every rank picks
 * the same, and may be called from every rank's thread at once.
 * Sub-communicators made afterwards inherit it; NULL removes it. */
typedef dsim_algo (*dsim_decide_fn)(void *user, size_t bytes, int nranks, int hosts, int local);
DSIM_API void dsim_comm_set_decide(dsim_comm *c, dsim_decide_fn fn, void *user);
/* The last collective begun on this communicator ("allreduce", a static
 * string; NULL before the first) and how many were begun. Safe from any
 * thread while the communicator is in use: a watchdog's view of a rank. */
DSIM_API void dsim_comm_last_call(const dsim_comm *c, const char **op, uint64_t *calls);
/* The last error on this communicator (code DSIM_OK if none); peer is the
 * failed rank when one is to blame. */
DSIM_API const dsim_error *dsim_comm_error(const dsim_comm *c);
/* Collective calls on c that returned an error so far (0 for NULL); the
 * last one's error is dsim_comm_error(c). A caller that sees the count
 * grow across a call that returned success knows that the call swallowed a
 * collective's error. */
DSIM_API uint64_t dsim_comm_failed_calls(const dsim_comm *c);

/* sendbuf == recvbuf is allowed (in place) for allreduce. */
DSIM_API dsim_err dsim_allreduce(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                 dsim_dtype t, dsim_op op);
/* The same with a forced algorithm (AUTO = decide). */
DSIM_API dsim_err dsim_allreduce_with(dsim_comm *c, const void *sendbuf, void *recvbuf,
                                      size_t count, dsim_dtype t, dsim_op op, dsim_algo algo);
/* recvbuf is only written on root. */
DSIM_API dsim_err dsim_reduce(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                              dsim_dtype t, dsim_op op, int root);
DSIM_API dsim_err dsim_broadcast(dsim_comm *c, void *buf, size_t count, dsim_dtype t, int root);
/* recvbuf holds size * sendcount elements, rank r's block at r * sendcount. */
DSIM_API dsim_err dsim_allgather(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount,
                                 dsim_dtype t);
/* sendbuf holds size * recvcount elements; rank r receives the reduction of
 * block r. */
DSIM_API dsim_err dsim_reduce_scatter(dsim_comm *c, const void *sendbuf, void *recvbuf,
                                      size_t recvcount, dsim_dtype t, dsim_op op);
DSIM_API dsim_err dsim_barrier(dsim_comm *c);

/* Memory for a collective's buffers (a gradient, a variable), as dsim
 * allocates its own: 64-byte aligned, and from 2 MiB up aligned to 2 MiB and
 * advised to the kernel as transparent huge pages (MADV_HUGEPAGE), which
 * Linux honours unless they are off (/sys/kernel/mm/transparent_hugepage).
 * Over the shm transport a peer reads a large message straight from the
 * sender's buffer (process_vm_readv), and the kernel pins every page it
 * reads: one huge page where there were 512 small ones (the 16 MiB
 * all-reduce of 4 processes takes about a third less time here); copies
 * miss the TLB less on every transport. Any buffer works with every
 * collective: this one is only faster. NULL when out of memory; bytes 0
 * gives a pointer that free() takes. Release it with free(). */
DSIM_API void *dsim_buf_alloc(size_t bytes);

/* ---- sub-communicators (MPI_Comm_split, MPI_Comm_create_group) ----
 *
 * A sub-communicator is a subset of a communicator's ranks, renumbered
 * 0 .. n-1, over the same endpoints with a communicator id of its own: its
 * traffic goes through the same transport, fault layer, health check and
 * network model as the parent's, and every collective, algorithm, timeout,
 * abort, fingerprint and flight record works on it exactly as on the
 * parent. Its rank r is endpoint (world) rank dsim_comm_world_rank(c, r);
 * messages name a sub-communicator's ranks in both numberings ("rank 1
 * (world rank 5)"), and dsim_comm_error(c)->peer is the failed rank's world
 * rank. A collective's deadline, algorithm, fingerprints (on or off),
 * flight recorder size, virtual payloads (timing only) and topology
 * (local_size) are the parent's; dsim_comm_set_timeout and
 * dsim_comm_set_algo change them on the sub-communicator alone.
 *
 * Ids are derived, never chosen, so that every member computes the same one
 * without a message and a replay under the sim engine makes the same ones:
 * a split's from (the parent's id, the split's call number on the parent,
 * the color), a group's from (the parent's id, its members' world ranks in
 * order, how many times this rank made that group from that parent
 * before). Derived ids have the top bit set; ids a program chooses for
 * dsim_comm_create or its own messages stay below 2^31, so the two never
 * meet. A rank's communicators belong to its thread (nothing here is
 * locked). */
#define DSIM_COMM_UNDEFINED (-1)

typedef enum dsim_comm_origin {
    DSIM_COMM_ORIGIN_CREATE = 0, /* dsim_comm_create */
    DSIM_COMM_ORIGIN_SPLIT,      /* dsim_comm_split */
    DSIM_COMM_ORIGIN_GROUP,      /* dsim_comm_create_group */
} dsim_comm_origin;

/* MPI_Comm_split. Collective over parent: every rank of parent calls it,
 * in the same order relative to parent's other collectives (it is one of
 * them: it exchanges every rank's color and key, fingerprinted as
 * "comm_split"). The ranks that pass the same color >= 0 form one new
 * communicator, ordered by key, then by rank in parent; a rank that passes
 * a negative color (DSIM_COMM_UNDEFINED) takes part and gets *out = NULL.
 * On failure (a timeout, a lost peer, a desync) *out is NULL on every rank
 * that failed. Costs one allgather of 8 bytes per rank. */
DSIM_API dsim_err dsim_comm_split(dsim_comm *parent, int color, int key, dsim_comm **out);
/* MPI_Comm_create_group: a communicator of parent's ranks ranks[0 .. n-1]
 * (in that order: ranks[i] becomes rank i). Collective over the members
 * only, as MPI_Comm_create_group (not over the whole parent, as
 * MPI_Comm_create): only ranks in the list call it, and the other ranks of
 * parent go on undisturbed. It sends nothing: every member must pass the
 * same list in the same order, and members that make several groups from
 * one parent make them in the same order (a member whose list differs gets
 * a communicator of another id, and the others' first collective on theirs
 * times out naming it). DSIM_EINVAL for a rank out of range, a rank listed
 * twice, or a caller not in the list. */
DSIM_API dsim_err dsim_comm_create_group(dsim_comm *parent, int n, const int *ranks,
                                         dsim_comm **out);
/* Frees a sub-communicator (a communicator made by dsim_comm_create: as
 * dsim_comm_destroy). Local: no message. Its flight records stay with the
 * communicator it descends from (the last 16 freed ones), for
 * dsim_comm_flight_dump_subs. NULL is ignored. */
DSIM_API void dsim_comm_free(dsim_comm *c);
/* The communicator's id (0 for NULL). */
DSIM_API uint32_t dsim_comm_id(const dsim_comm *c);
/* 1 when c carries virtual payloads (dsim_comm_cfg.virtual_payload: timing
 * only; its sub-communicators inherit it), else 0. A strategy run timing
 * only sees it on ctx->world: its buffers' values mean nothing, and it may
 * skip its own arithmetic as long as it makes the same collective calls. */
DSIM_API int dsim_comm_virtual(const dsim_comm *c);
/* The endpoint (world) rank of rank r of c; -1 when r is not a rank of c. */
DSIM_API int dsim_comm_world_rank(const dsim_comm *c, int r);
/* The host of rank r of c, by the topology (local_size); -1 when unknown or
 * r is not a rank of c. */
DSIM_API int dsim_comm_host(const dsim_comm *c, int r);
/* How c was made (a dsim_comm_origin), its parent's id (0 for
 * DSIM_COMM_ORIGIN_CREATE) and its split's color (-1 otherwise); any
 * pointer may be NULL. */
DSIM_API dsim_comm_origin dsim_comm_origin_of(const dsim_comm *c, uint32_t *parent_id, int *color);
/* "communicator 1 (4 ranks)", "sub-communicator 2913746501 (split of 1,
 * color 0; 4 ranks)", "sub-communicator 3174620194 (group of 1; 2 ranks)";
 * returns buf. */
DSIM_API const char *dsim_comm_describe(const dsim_comm *c, char *buf, size_t cap);

/* The exchange a rank made, as a label for reports: begin on a
 * communicator made by dsim_comm_create, run the code to describe (a
 * strategy's apply_gradients), end. Every collective on c and on every
 * sub-communicator descended from it, on this rank, in between, is noted,
 * and end writes what was called, merged in the order first made: "ring"
 * when that was one allreduce on c itself (the algorithm's name), else
 * e.g. "reduce on sub-communicator 2913746501 (4 ranks) + allreduce(ring)
 * on sub-communicator 811942093 (2 ranks) + broadcast on sub-communicator
 * 2913746501 (4 ranks)"; "" when nothing was called. Returns buf. */
DSIM_API void dsim_comm_exchange_begin(dsim_comm *c);
DSIM_API const char *dsim_comm_exchange_end(dsim_comm *c, char *buf, size_t cap);

/* ---- fingerprints ---- */

typedef enum dsim_coll_kind {
    DSIM_COLL_NONE = 0,
    DSIM_COLL_ALLREDUCE,
    DSIM_COLL_REDUCE,
    DSIM_COLL_BROADCAST,
    DSIM_COLL_ALLGATHER,
    DSIM_COLL_REDUCE_SCATTER,
    DSIM_COLL_BARRIER,
    DSIM_COLL_SPLIT, /* dsim_comm_split's exchange of colors and keys */
    DSIM_COLL_KIND_COUNT
} dsim_coll_kind;

/* "allreduce", "reduce", "broadcast", "allgather", "reduce_scatter",
 * "barrier", "comm_split" ("none", "unknown"). */
DSIM_API const char *dsim_coll_kind_name(dsim_coll_kind k);

#define DSIM_COLL_FP_MAGIC 0x50464344u /* "DCFP" */
#define DSIM_COLL_FP_NONE  0xFFu       /* op or dtype: not part of this collective */

/* What every rank of one collective call must agree on; 32 bytes, sent as is
 * (host byte order, like the transport header). */
typedef struct dsim_coll_fp {
    uint32_t magic;   /* DSIM_COLL_FP_MAGIC */
    uint32_t comm_id; /* the communicator */
    uint64_t seq;     /* 1-based: the seq-th collective call on the communicator */
    uint64_t count;   /* elements: the buffer (allreduce, reduce, broadcast), one
                         rank's block (allgather's send, reduce_scatter's receive),
                         0 (barrier) */
    int32_t root;     /* reduce, broadcast; -1 for the others */
    uint8_t coll;     /* dsim_coll_kind */
    uint8_t op;       /* dsim_op, or DSIM_COLL_FP_NONE (broadcast, allgather, barrier) */
    uint8_t dtype;    /* dsim_dtype, or DSIM_COLL_FP_NONE (barrier) */
    uint8_t algo;     /* the dsim_algo this rank runs (never AUTO once decided) */
} dsim_coll_fp;

/* Writes "allreduce #17 with 36 float32 (sum, tree)" ("broadcast #3 with 10
 * int64 from root 1", "barrier #5"); returns buf. */
DSIM_API const char *dsim_coll_fp_str(const dsim_coll_fp *fp, char *buf, size_t cap);
/* Writes the fields in which a and b differ ("dtype and count", "collective,
 * dtype and count") and returns how many there are (0: they agree). */
DSIM_API int dsim_coll_fp_diff(const dsim_coll_fp *a, const dsim_coll_fp *b, char *buf, size_t cap);
/* The fingerprint of the call in progress on c, or of its last call (seq 0:
 * none yet). */
DSIM_API const dsim_coll_fp *dsim_comm_fingerprint(const dsim_comm *c);

/* ---- the flight recorder ----
 *
 * Each communicator keeps its last calls (PyTorch's NCCL flight recorder):
 * what was called, how far it got, when, and which peer it was waiting for
 * last. A harness reads it after a timeout, an abort or a failed check to
 * say which rank did not join which call (sim/diag). The recorder costs two
 * clock reads per call; its entries are allocated as calls come, up to the
 * size asked for. */
#define DSIM_FR_DEFAULT_SIZE 2000

typedef enum dsim_fr_state {
    DSIM_FR_SCHEDULED = 0, /* called; nothing posted yet (arguments checked) */
    DSIM_FR_STARTED,       /* its first transfer was posted */
    DSIM_FR_COMPLETED,     /* returned DSIM_OK */
    DSIM_FR_STATE_COUNT
} dsim_fr_state;

/* "scheduled", "started", "completed" (PyTorch's names). */
DSIM_API const char *dsim_fr_state_name(dsim_fr_state s);

typedef struct dsim_fr_entry {
    dsim_coll_fp fp; /* the call */
    uint8_t state;   /* dsim_fr_state */
    uint8_t pad[3];
    int32_t waiting_for; /* the peer of the transfer waited for last; -1 none */
    int32_t error;       /* the dsim_err it returned (0: none, or not returned yet) */
    int32_t pad2;
    int64_t t_created;   /* dsim_rt_now at the call */
    int64_t t_started;   /* at its first transfer; -1 not started */
    int64_t t_completed; /* when it returned; -1 not returned */
} dsim_fr_entry;

typedef struct dsim_fr_dump {
    int rank, size;
    uint32_t comm_id;
    uint64_t calls;         /* calls made on the communicator */
    size_t n;               /* entries kept, oldest first: the last n calls */
    dsim_fr_entry *entries; /* owned: dsim_fr_dump_free */
    /* Which communicator: this rank's world (endpoint) rank, how it was
     * made (dsim_comm_origin), the parent's id (0 for one made by
     * dsim_comm_create), the split's color (-1 otherwise), and every rank's
     * world rank (size entries, owned; NULL: rank r is world rank r). */
    int world_rank;
    int origin;
    uint32_t parent_id;
    int color;
    int *world_ranks;
} dsim_fr_dump;

/* Copies c's recorder into out (allocating). Call it when c's rank is not
 * inside a collective (after its thread returned), or accept that the last
 * entry may be torn. */
DSIM_API dsim_err dsim_comm_flight_dump(const dsim_comm *c, dsim_fr_dump *out);
/* The recorders of the sub-communicators descended from c (a communicator
 * made by dsim_comm_create) on this rank that made at least one call: the
 * last 16 freed, in the order freed, then the live ones, in the order
 * made.
 * *out (*n entries) is allocated (NULL when *n is 0); free each with
 * dsim_fr_dump_free, then free(*out). */
DSIM_API dsim_err dsim_comm_flight_dump_subs(const dsim_comm *c, dsim_fr_dump **out, size_t *n);
DSIM_API void dsim_fr_dump_free(dsim_fr_dump *d);

#ifdef __cplusplus
}
#endif
#endif
