/* shm transport internals: the layout of the shared mapping and the state
 * each process keeps beside it (dsim/spi/shm.h says what the backend does).
 *
 * The mapping (every offset fixed by its header, so every process that maps
 * it agrees):
 *
 *   +--------------------+ 0
 *   | shm_hdr            |  magic, version, sizes, offsets, abort notice
 *   +--------------------+ off_ranks
 *   | shm_rank[nranks]   |  host pid and start time, state, leader; the
 *   |                    |  leader rank's entry holds its process's bell
 *   +--------------------+ off_pairs
 *   | shm_pair[n*n]      |  per ordered pair (src, dst): ring indices,
 *   |                    |  generation, rendezvous slots, bounce counters
 *   +--------------------+ off_rings
 *   | ring[n*n]          |  ring_bytes each: records, 64-byte aligned
 *   +--------------------+ off_bounce
 *   | bounce[n*n]        |  bounce_bytes each: large messages without CMA
 *   +--------------------+ total
 *
 * A ring has one producer (the sending rank, whose sends the shared layer
 * serialises, and its process's progress thread, under the rank's sq) and
 * one consumer (the progress thread of the receiving rank's process). The
 * producer writes a record past tail and then publishes tail (release); the
 * consumer reads records up to tail (acquire), hands them over, then
 * publishes head. A record is never visible until it is whole, so a
 * producer killed while writing leaves nothing torn behind.
 *
 *   record: [shm_rec 128 B: kind, size, len, slot, id, dsim_tp_hdr][payload]
 *   kinds:  DATA (payload inline), RTS (a large message: slot names the
 *           rendezvous slot that holds the sender's address), WITHDRAWN (the
 *           header of a send withdrawn after it took its sequence number),
 *           PAD (fills the ring's end when a record does not fit there).
 *
 * Rendezvous slot states (shm_rndv.state), each change by one side:
 *
 *   sender:   FREE -> POSTED (RTS written)
 *   receiver: POSTED -> CLAIMED (CAS), then CLAIMED -> DONE / FAILED, or
 *             CLAIMED -> BOUNCE (no CMA) and, once all has come,
 *             BOUNCE -> DONE (CAS); DONE as soon as the sender's buffer is
 *             no longer read, before the message is handed over
 *   sender:   POSTED or BOUNCE -> WITHDRAWN (CAS, a cancel; in BOUNCE only
 *             the sender reads its buffer, so it may stop at any point)
 *   receiver: CLAIMED -> PARKED (no receive posted: the message waits in
 *             the receiver's queue unread, dsim_tp_deliver_pull), later
 *             PARKED -> CLAIMED (CAS) by the receive that takes it, or
 *             PARKED -> DONE / FAILED (CAS) if it is dropped unread
 *   sender:   PARKED -> WITHDRAWN (CAS, a cancel)
 *   receiver: WITHDRAWN -> FREE (the header alone is handed over, or the
 *             parked message is dropped)
 *   sender:   DONE / FAILED -> FREE
 *
 * Wake-ups. Each process has a bell (a futex word in its leader rank's
 * entry) and a sleeping flag. Whoever makes work for a process bumps its
 * bell and, only if the flag is set, calls FUTEX_WAKE; the progress thread
 * reads the bell, polls, sets the flag, and sleeps only if the bell has not
 * moved (both sides fence, so one of them sees the other). While a worker
 * of the process reads the rings itself (shm_wait_assist: its assisting
 * count is nonzero), FUTEX_WAKE is left out too; the worker, once done,
 * wakes the progress thread itself if the bell moved after its last look
 * began, or its last look left records unread. A worker's own send
 * (shm_bell_ring_send) that finds the receiver's process asleep looks
 * again for up to SHM_WAKE_GRACE_NS, counted as assisting and reading its
 * own rings meanwhile, and leaves the wake out if a worker there began to
 * assist or the record was read: the two sides of an exchange then wake
 * nobody. */
#ifndef DSIM_SHM_INT_H
#define DSIM_SHM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dsim/spi/shm.h"

#define SHM_MAGIC      0x4d485344u /* "DSHM" */
#define SHM_VERSION    1u
#define SHM_LINE       64
#define SHM_REC_HDR    128
#define SHM_RNDV_SLOTS 16
#define SHM_PARK_MAX   (SHM_RNDV_SLOTS / 2)
#define SHM_WHY_MAX    256

typedef struct shm_hdr {
    uint32_t magic, version;
    uint32_t nranks, rndv_slots;
    uint64_t ring_bytes, bounce_bytes;
    uint64_t off_ranks, off_pairs, off_rings, off_bounce, total;
    /* The abort notice: 0 none, 1 being written, 2 set. */
    _Atomic uint32_t abort_state;
    int32_t abort_peer;
    char abort_why[SHM_WHY_MAX];
} shm_hdr;

enum { SHM_RANK_FREE = 0, SHM_RANK_OPEN, SHM_RANK_CLOSED, SHM_RANK_GONE };

typedef struct shm_rank {
    _Atomic int32_t pid;    /* the host process; 0 until a process hosts it */
    _Atomic uint32_t state; /* SHM_RANK_* */
    _Atomic int32_t leader; /* the rank whose bell wakes the host; -1 until set */
    uint32_t gen;           /* the host's generation (nonzero) */
    uint64_t start;         /* the host's start time (/proc/PID/stat), its identity with pid */
    char pad0[SHM_LINE - 24];
    /* Only in a leader's entry: its process's bell. */
    _Atomic uint32_t bell;
    _Atomic uint32_t sleeping;
    _Atomic uint32_t assisting; /* workers in shm_wait_assist */
    char pad1[SHM_LINE - 12];
} shm_rank;

enum {
    SHM_RNDV_FREE = 0,
    SHM_RNDV_POSTED,
    SHM_RNDV_CLAIMED,
    SHM_RNDV_BOUNCE,
    SHM_RNDV_DONE,
    SHM_RNDV_FAILED,
    SHM_RNDV_WITHDRAWN,
    SHM_RNDV_PARKED, /* taken from the ring, not read yet: no receive was posted */
};

typedef struct shm_rndv {
    _Atomic uint32_t state;
    uint32_t err;  /* FAILED: the dsim_err the send fails with */
    uint64_t addr; /* the sender's buffer, in its address space */
    uint64_t len;
    uint64_t id; /* the RTS record's id */
} shm_rndv;

typedef struct shm_pair {
    /* the producer's line */
    _Atomic uint64_t tail;
    _Atomic uint32_t gen;        /* the producer's generation */
    _Atomic uint32_t want_space; /* the producer waits for the consumer */
    char pad0[SHM_LINE - 16];
    /* the consumer's line */
    _Atomic uint64_t head;
    _Atomic uint32_t no_cma; /* the consumer found CMA refused: bounce from now on */
    uint32_t unused;
    char pad1[SHM_LINE - 16];
    /* the bounce stream, bytes ever written and read */
    _Atomic uint64_t b_written;
    char pad2[SHM_LINE - 8];
    _Atomic uint64_t b_read;
    char pad3[SHM_LINE - 8];
    shm_rndv rndv[SHM_RNDV_SLOTS];
} shm_pair;

enum { SHM_REC_PAD = 1, SHM_REC_DATA, SHM_REC_RTS, SHM_REC_WITHDRAWN };

typedef struct shm_rec {
    uint32_t kind;
    uint32_t size; /* the record's bytes, this header included; a multiple of 64 */
    uint64_t len;  /* DATA: payload bytes here; RTS: the message's length */
    uint32_t slot; /* RTS */
    uint32_t pad;
    uint64_t id; /* RTS: the slot's id */
    dsim_tp_hdr hdr;
} shm_rec;

_Static_assert(sizeof(shm_rank) == 2 * SHM_LINE, "shm_rank is two cache lines");
_Static_assert(sizeof(shm_rec) <= SHM_REC_HDR, "a record header fits its 128 bytes");
_Static_assert(sizeof(shm_pair) % SHM_LINE == 0, "pairs are whole cache lines");

/* ---- process-local state ---- */

enum { SHM_ITEM_DATA, SHM_ITEM_RTS, SHM_ITEM_WITHDRAWN };

/* A send waiting for room in its ring (or for a free rendezvous slot). */
typedef struct shm_item {
    struct shm_item *next;
    int kind;
    dsim_req *req; /* NULL for WITHDRAWN */
    dsim_tp_hdr hdr;
    const void *payload;
    size_t len;
} shm_item;

/* A rendezvous send the receiver has been told about. */
typedef struct shm_slot {
    dsim_req *req; /* NULL when the slot is not this side's */
    const void *buf;
    size_t len;
    size_t pushed; /* bytes put into the bounce buffer */
} shm_slot;

/* Local rank -> peer: the producer's side. Under the local rank's sq. */
typedef struct shm_out {
    shm_pair *pair;
    uint8_t *ring;
    uint8_t *bounce;
    uint64_t tail;
    uint64_t next_id;
    shm_item *qhead, *qtail;
    shm_slot slot[SHM_RNDV_SLOTS];
    int outstanding;
    int active;       /* counted in its shm_local's busy */
    int broken;       /* the peer is gone: sends fail with broken_msg */
    int broken_blame; /* the rank those failures name */
    char broken_msg[400];
    /* shm_bell_ring_send's graces to this peer that ended in a wake, in a
     * row, and the sends since it gave up waiting on this peer (both read
     * and written outside sq) */
    _Atomic uint32_t grace_misses;
    _Atomic uint32_t grace_skipped;
} shm_out;

/* Peer -> local rank: the consumer's side. Progress thread only. */
/* A large message parked unread (dsim_tp_pull's context): what a read
 * needs, and where to say it is over. */
typedef struct shm_pull_ctx {
    struct shm_fabric *sf;
    struct shm_in *in;
    int src, l;
    pid_t pid;
    uint64_t addr;
    size_t len;
    uint32_t slot;
    int parked;
} shm_pull_ctx;

typedef struct shm_in {
    shm_pair *pair;
    uint8_t *ring;
    uint8_t *bounce;
    uint64_t head;
    uint32_t gen; /* the producer's generation seen first, 0 before */
    int bouncing; /* a large message is coming through the bounce buffer */
    size_t got;
    /* where it is put together: its own, since the progress thread goes on
     * with other rings meanwhile */
    uint8_t *stage;
    size_t stage_cap;
    int stuck;  /* the ring is corrupt or its producer changed: read no more */
    int cma_ok; /* a read of the producer's memory worked once */
    /* messages parked unread, at most SHM_PARK_MAX (the rest are read at
     * once, so that a sender always gets slots back) */
    atomic_int parked;
    shm_pull_ctx park[SHM_RNDV_SLOTS];
} shm_in;

typedef struct shm_local {
    int rank;
    dsim_waitq *sq;
    atomic_int closed;
    /* outs with queued or outstanding sends: the progress thread looks at
     * this rank's sends only when nonzero */
    atomic_int busy;
    shm_out *out; /* [nranks] */
    shm_in *in;   /* [nranks] */
} shm_local;

typedef struct shm_fabric {
    dsim_fabric *f;
    dsim_rt *rt;
    int nranks, lo, hi;
    int own_fd; /* the descriptor of a mapping this fabric made, else -1 */
    uint8_t *base;
    size_t map_len;
    shm_hdr *hdr;
    shm_rank *ranks;
    shm_pair *pairs;
    size_t eager_max;
    int cma_off;
    int cma_staged;    /* never read straight into the receive */
    int park_off;      /* read a message no receive waits for at once */
    int rings_local;   /* direct=off: to a rank of this process through the rings */
    int64_t spin_ns;   /* the progress thread's, before it sleeps */
    int64_t assist_ns; /* a waiting worker's (shm_wait_assist) */
    pid_t pid;
    uint64_t start;
    uint32_t gen;
    shm_local *locals; /* [hi - lo + 1] */
    /* threads; poll_mu: whoever reads the rings (the progress thread, or a
     * waiting worker in shm_wait_assist) */
    pthread_mutex_t poll_mu;
    pthread_t prog, watch;
    int prog_started, watch_started;
    atomic_int stop;
    int watch_evfd;
    /* per rank: 1 once the watcher saw its process end; 2 once handled */
    atomic_int *dead;
    /* the progress thread's staging buffer for messages read by CMA (each
     * is read and handed over in one go) */
    uint8_t *stage;
    size_t stage_cap;
    /* and its buffer for a reducing receive read straight from the sender
     * (dsim_tp_deliver_pull), piece_len bytes: small enough to stay in cache */
    uint8_t *piece;
    size_t piece_len;
    int any_remote;
    /* 1 + the first peer seen to die (end without closing), 0 if none; and
     * its message, written once by the progress thread before died_first
     * is set (release): senders read both after an acquire. */
    atomic_int died_first;
    char died_msg[160];
    atomic_int logged_cma, logged_bounce;
    /* counters (dsim_shm_stats) */
    atomic_ullong st[sizeof(dsim_shm_stats) / sizeof(uint64_t)];
} shm_fabric;

#define SHM_ST(name) (offsetof(dsim_shm_stats, name) / sizeof(uint64_t))

static inline void shm_count(shm_fabric *sf, size_t idx, uint64_t n)
{
    atomic_fetch_add_explicit(&sf->st[idx], n, memory_order_relaxed);
}

static inline shm_pair *shm_pair_of(shm_fabric *sf, int src, int dst)
{
    return &sf->pairs[(size_t)src * (size_t)sf->nranks + (size_t)dst];
}

static inline uint8_t *shm_ring_of(shm_fabric *sf, int src, int dst)
{
    return sf->base + sf->hdr->off_rings +
           ((size_t)src * (size_t)sf->nranks + (size_t)dst) * sf->hdr->ring_bytes;
}

static inline uint8_t *shm_bounce_of(shm_fabric *sf, int src, int dst)
{
    return sf->base + sf->hdr->off_bounce +
           ((size_t)src * (size_t)sf->nranks + (size_t)dst) * sf->hdr->bounce_bytes;
}

static inline int shm_is_local(const shm_fabric *sf, int rank)
{
    return rank >= sf->lo && rank <= sf->hi;
}

static inline shm_local *shm_local_of(shm_fabric *sf, int rank)
{
    return &sf->locals[rank - sf->lo];
}

static inline size_t shm_align(size_t n)
{
    return (n + SHM_LINE - 1) & ~(size_t)(SHM_LINE - 1);
}

/* shm.c */
/* Recounts o in L->busy after its queue or outstanding sends changed. */
void shm_out_update_locked(shm_local *L, shm_out *o);

/* shm_ring.c: rings, bells and the progress thread */
void shm_bell_ring(shm_fabric *sf, int rank);
/* A worker's own send: as shm_bell_ring, but gives the receiver up to
 * SHM_WAKE_GRACE_NS to start reading the rings itself before waking its
 * progress thread; tail: the ring's tail after the send's record. After
 * SHM_GRACE_MISSES graces in a row to a peer ended in a wake (a receiver
 * busy elsewhere, not about to wait), only every SHM_GRACE_PROBE-th send
 * to it waits, so a stream of sends to such a peer costs what it did
 * before. o: the sender's side of the pair (its counts), tail: the ring's
 * tail after the send's record (read under sq). */
#define SHM_WAKE_GRACE_NS 2000
#define SHM_GRACE_MISSES  4
#define SHM_GRACE_PROBE   16
void shm_bell_ring_send(shm_fabric *sf, int rank, shm_out *o, uint64_t tail);
/* Flags remote rank r's process as ended (whoever sees it first: the
 * watcher, or a reader of its memory told ESRCH) and rings this process's
 * bell, so that a progress thread about to sleep polls once more and
 * handles the death (shm_handle_deaths). */
void shm_mark_dead(shm_fabric *sf, int r);
/* Writes one record into o's ring: 1 if written, 0 if there is no room yet
 * (the consumer is then asked to ring when it frees some). */
int shm_ring_put(shm_fabric *sf, int from, int to, shm_out *o, const shm_rec *rec,
                 const void *payload, size_t len);
/* Moves o's queued sends into its ring while they fit (under the sq).
 * Returns 1 if it moved any. Requests are completed under the sq: the order
 * is slock, sq, then an endpoint's lock, never the other way. */
int shm_flush_locked(shm_fabric *sf, int from, int to, shm_out *o);
void *shm_progress_main(void *arg);
/* The ops table's wait_assist: reads the rings from the waiting thread (when
 * the progress thread is not reading them) until req finishes, for up to
 * sf->assist_ns, yielding the CPU between looks that found nothing; past
 * that, on while a large send of this process is being read by its
 * receiver (up to SHM_ASSIST_MOVING_NS from the start). */
#define SHM_ASSIST_MOVING_NS (5LL * 1000 * 1000)
void shm_wait_assist(dsim_ep *ep, dsim_req *req, int64_t deadline);
/* Takes another process's abort notice: 1 if it revoked the fabric now. */
int shm_check_abort(shm_fabric *sf);
/* Fails a send with code and msg (naming to), or with the revoke's reason
 * where the job has been revoked: a waiter then sees why it all stopped,
 * not a peer that went away because of it. */
void shm_fail_send(shm_fabric *sf, dsim_req *req, int to, int blame, dsim_err code,
                   const char *msg);

/* shm_rndv.c: large messages */
/* Starts a rendezvous send: 1 if its RTS went into the ring, 0 if it must
 * wait (no free slot or no room). */
int shm_rndv_post(shm_fabric *sf, int from, int to, shm_out *o, const dsim_tp_hdr *hdr,
                  const void *payload, size_t len, dsim_req *req);
/* Receiver: handles the RTS record rec from src at local rank l. Returns 1
 * when the record is finished with (head may advance), 0 while the message
 * is still coming through the bounce buffer. */
int shm_rndv_recv(shm_fabric *sf, int src, int l, shm_in *in, const shm_rec *rec);
/* Sender: finishes the rendezvous sends of o whose receiver is done with
 * them and pushes bounce bytes. Returns 1 if it did anything. */
int shm_rndv_progress_locked(shm_fabric *sf, int from, int to, shm_out *o);
/* Withdraws req if the receiver has not claimed it: 1 withdrawn. */
int shm_rndv_cancel_locked(shm_out *o, dsim_req *req);
void shm_stage_free(shm_fabric *sf);

/* shm_live.c: who is alive */
uint64_t shm_start_time(pid_t pid);
dsim_err shm_watch_start(shm_fabric *sf);
void shm_watch_stop(shm_fabric *sf);
/* Progress thread: delivers what the dead peers left complete, then fails
 * every receive from and send to them. Returns 1 if it handled one. */
int shm_handle_deaths(shm_fabric *sf);
/* Fails o's queued and outstanding sends to peer (shm_fail_send) and marks
 * it broken (under the local rank's sq). */
void shm_break_out_locked(shm_fabric *sf, shm_out *o, int peer, int blame, const char *msg);

/* shm_ring.c: the consumer of one ring (the progress thread, and the
 * death handler draining a dead peer's rings). Returns records handled. */
int shm_consume(shm_fabric *sf, int src, int l, shm_in *in, int budget);

#endif
