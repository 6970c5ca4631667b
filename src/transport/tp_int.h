/* Shared transport layer internals: the structures the layer's files
 * (transport.c lists them) share.
 *
 * Locks. Each endpoint has two runtime wait queues used as locks:
 *   ep->lock  guards the endpoint's receive side (posted and unexpected
 *             queues, receive sequence/epoch tables, receive counters,
 *             state) and the completion of every request the endpoint owns
 *             (waiters sleep on it);
 *   ep->slock serialises sends from the endpoint (sequence numbers leave in
 *             order) and guards the send tables and send counters.
 * Order: slock may be held while taking any ep->lock; no two ep->locks are
 * ever held at once, and no slock is taken while holding an ep->lock. Large
 * copies and reductions run with no lock held: the side that claims a
 * message or a posted receive (by unlinking it under the queue's lock) owns
 * the copy, and the other side, if it wants to cancel, waits for the claimer
 * to complete the request. */
#ifndef DSIM_TP_INT_H
#define DSIM_TP_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/spi/transport.h"

typedef struct tp_link {
    struct tp_link *next, *prev;
} tp_link;

/* A circular list with a sentinel. */
typedef struct tp_list {
    tp_link head;
} tp_list;

static inline void tp_list_init(tp_list *l)
{
    l->head.next = l->head.prev = &l->head;
}
static inline int tp_list_empty(const tp_list *l)
{
    return l->head.next == &l->head;
}
static inline void tp_list_push(tp_list *l, tp_link *n)
{
    n->prev = l->head.prev;
    n->next = &l->head;
    l->head.prev->next = n;
    l->head.prev = n;
}
static inline void tp_list_push_front(tp_list *l, tp_link *n)
{
    n->next = l->head.next;
    n->prev = &l->head;
    l->head.next->prev = n;
    l->head.next = n;
}
static inline void tp_list_del(tp_link *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n->prev = n;
}

#define TP_CONTAINER(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* (peer, comm_id, tag) -> (epoch, seq); open addressing, grows. */
typedef struct tp_map_ent {
    int32_t peer; /* -1 marks an empty slot */
    uint32_t comm_id, tag, epoch;
    uint64_t seq;
} tp_map_ent;

typedef struct tp_map {
    tp_map_ent *ents;
    size_t cap, used;
} tp_map;

void tp_map_init(tp_map *m);
void tp_map_free(tp_map *m);
tp_map_ent *tp_map_find(const tp_map *m, int32_t peer, uint32_t comm_id, uint32_t tag);
/* NULL when memory ran out. New entries have epoch 0, seq 0. */
tp_map_ent *tp_map_get(tp_map *m, int32_t peer, uint32_t comm_id, uint32_t tag);

/* An entry of an endpoint's unexpected queue. */
enum tp_msg_kind {
    TP_MSG_EAGER,   /* payload copied into data[] after this struct */
    TP_MSG_RNDV,    /* the sender's request; data is the sender's buffer */
    TP_MSG_GAP,     /* stands for lost frames: fails one receive with EPROTO */
    TP_MSG_CORRUPT, /* stands for a frame whose checksum failed: likewise */
    TP_MSG_PULL,    /* parked by dsim_tp_deliver_pull: read by the receive that takes it */
};

typedef struct tp_msg {
    tp_link link;    /* in its bucket's unexpected queue */
    tp_link arrival; /* in the endpoint's arrivals (dsim_probe_any) */
    int kind;
    int src;
    uint32_t comm_id, tag, epoch;
    size_t len;
    const void *data;
    uint64_t seq_expected, seq_got; /* GAP */
    int has_side;                   /* EAGER, RNDV, PULL: the frame's sideband (DSIM_TP_F_SIDE) */
    uint8_t side[DSIM_TP_SIDE_LEN];
    size_t cap; /* EAGER: the bytes allocated for data[] */
    /* PULL: the backend's reader and its parked context */
    int (*pread)(void *ctx, void *dst, size_t off, size_t n);
    void (*prelease)(void *ctx, int how);
    void *pctx;
    size_t ppiece; /* the pieces a reducing receive reads it in (the pull's scratch_len) */
} tp_msg;

/* Buffers of unexpected messages kept per fabric for the next ones, in two
 * classes: TP_SPARES_BIG of at least TP_SPARE_BIG bytes (any size above) and
 * TP_SPARES - TP_SPARES_BIG of TP_SPARE_MIN up to TP_SPARE_BIG (a ring's
 * eager blocks: freed to malloc, a non-main arena gives such a buffer back
 * to the kernel and faults it in again for the next message, which made a
 * 256 KiB ring all-reduce of 4 threads 4x slower than 1 MiB a byte).
 * Smaller ones come from malloc's own free lists. At most
 * (TP_SPARES - TP_SPARES_BIG) x TP_SPARE_BIG bytes more than the big class. */
#define TP_SPARES     8
#define TP_SPARES_BIG 2
#define TP_SPARE_MIN  ((size_t)16 << 10)
#define TP_SPARE_BIG  ((size_t)128 << 10)

/* An unexpected message with room for len payload bytes after it (a kept
 * buffer where one fits), or NULL; and its release. */
tp_msg *tp_msg_alloc(dsim_fabric *f, size_t len);
void tp_msg_free(dsim_fabric *f, tp_msg *m);
void tp_msg_spares_free(dsim_fabric *f);

enum tp_req_kind { TP_REQ_SEND, TP_REQ_RECV, TP_REQ_RECV_REDUCE };

struct dsim_req {
    dsim_ep *ep;   /* owner */
    tp_link live;  /* in ep->live, under ep->lock */
    tp_link qlink; /* receives: ep's posted queue */
    int kind;
    int peer;
    uint32_t comm_id, tag;
    /* Receives. */
    void *buf;
    const void *rin; /* reductions: the local operand when not buf (NULL: buf) */
    size_t cap;      /* bytes; for reductions count * element size */
    size_t count;
    dsim_dtype dt;
    dsim_op op;
    /* Sends. */
    const void *sbuf;
    size_t slen;
    uint64_t vlen; /* a virtual send's payload: the length it stands for */
    /* The endpoint whose unexpected queue holds m (zero-copy sends; set
     * within ops->send, so stable once dsim_isend returns). */
    dsim_ep *queue_ep;
    tp_msg m; /* a rendezvous send's queue entry */
    /* Set under the lock of the endpoint whose queue holds the request
     * (ep->lock for receives, queue_ep->lock for rendezvous sends). */
    int queued;
    /* Results, written before done is set (under ep->lock). */
    dsim_err status;
    int errpeer;
    uint64_t fail_seq; /* failed: when, among the process's failures (tp_fail_seq) */
    size_t len;
    int has_side; /* receives: the sideband of the message taken */
    uint8_t side[DSIM_TP_SIDE_LEN];
    char *errmsg;
    atomic_int done;
    void *priv;
    size_t alloc_size; /* its allocation, for the cache of freed requests */
    dsim_req *cnext;   /* in that cache */
};

typedef struct tp_bucket {
    tp_list posted;     /* receives waiting for a message, oldest first */
    tp_list unexpected; /* messages waiting for a receive, oldest first */
} tp_bucket;

enum tp_ep_state { TP_EP_NEW, TP_EP_OPEN, TP_EP_CLOSED };

struct dsim_ep {
    dsim_fabric *f;
    int rank;
    int state; /* under lock */
    dsim_waitq *lock;
    dsim_waitq *slock;
    tp_list live; /* requests owned by this endpoint, not yet freed */
    tp_bucket *buckets;
    /* Every message of every bucket's unexpected queue, oldest first: what
     * dsim_probe_any looks through instead of every bucket. */
    tp_list arrivals;
    tp_map recv_seq, recv_epoch;
    tp_map send_seq, send_epoch;
    /* Receive-side counters under lock, send-side under slock. */
    uint64_t msgs_sent, bytes_sent;
    uint64_t msgs_recv, bytes_recv;
    uint64_t rejected_misrouted, rejected_stale, rejected_corrupt;
    void *priv;
    /* Under lock: peers whose link to this endpoint broke for good
     * (dsim_tp_peer_lost), oldest first. */
    struct tp_lost *lost;
};

struct dsim_fabric {
    const struct dsim_tp_ops *ops;
    dsim_rt *rt;
    int nranks;
    unsigned bucket_mask;
    _Atomic(dsim_ep *) *eps;
    atomic_int aborted;
    atomic_flag abort_claimed;
    /* dsim_fabric_abort calls in progress, and whether the fabric is
     * closing: a close waits for those in progress (they call into the
     * backend), and an abort that comes later does nothing. */
    atomic_int abort_busy;
    atomic_int closing;
    int abort_peer;
    char abort_why[256];
    void *priv;
    const struct dsim_tp_filter *filter; /* or NULL */
    void *filter_user;
    /* Buffers of large unexpected messages, kept for the next ones (a fresh
     * one of megabytes costs its page faults each time): tp_msg_alloc,
     * tp_msg_free. */
    _Atomic(tp_msg *) spare[TP_SPARES];
};

/* Private areas start 16-byte aligned after their structure. */
static inline size_t tp_align(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static inline int tp_aborted(const dsim_fabric *f)
{
    return atomic_load_explicit(&f->aborted, memory_order_acquire);
}

static inline tp_bucket *tp_bucket_of(dsim_ep *ep, int src)
{
    return &ep->buckets[(unsigned)src & ep->f->bucket_mask];
}

/* Queues m as unexpected (under ep->lock): in its source's bucket and in the
 * endpoint's arrivals. */
static inline void tp_unexp_push(dsim_ep *ep, tp_msg *m)
{
    tp_list_push(&tp_bucket_of(ep, m->src)->unexpected, &m->link);
    tp_list_push(&ep->arrivals, &m->arrival);
}

/* Takes a queued m off both lists (under the lock of its endpoint). */
static inline void tp_unexp_del(tp_msg *m)
{
    tp_list_del(&m->link);
    tp_list_del(&m->arrival);
}

/* match.c */
/* Links a new receive into ep->live and matches it against ep's unexpected
 * queue: finishes req (the copy done in the caller's thread) or posts it.
 * Fails (req not linked) if the fabric is aborted or ep is not open. */
dsim_err tp_recv_start(dsim_req *req);
/* Frees every queued message of ep (ep is closing: no more deliveries). */
void tp_drain_unexpected(dsim_ep *ep);
/* Drops ep's queued messages of comm_id older than epoch (under ep->lock);
 * returns how many. */
uint64_t tp_purge_epoch_locked(dsim_ep *ep, uint32_t comm_id, uint32_t epoch, tp_list *done_sends);
/* Finishes rendezvous sends collected by tp_purge_epoch_locked. */
void tp_finish_dropped(dsim_fabric *f, tp_list *sends);
/* Completes a request (takes its owner's lock). */
void tp_req_finish(dsim_req *req, dsim_err status, size_t len);
/* The same with ep->lock already held. */
void tp_req_finish_locked(dsim_req *req, dsim_err status, size_t len);
/* Records a failure message on req (before finishing it). */
void tp_req_failf(dsim_req *req, int peer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* match.c: a tag as text ("any" for DSIM_ANY_TAG). */
void tp_tag_str(uint32_t tag, char *buf, size_t cap);

/* transport.c: the error of an operation the aborted fabric refuses. */
dsim_err tp_aborted_now(dsim_fabric *f, const char *what, int peer);

/* request.c: a request of ep's fabric's size (from the thread's cache of
 * freed ones when it can), and its release. */
dsim_req *tp_req_new(dsim_ep *ep, int kind, int peer, uint32_t comm_id, uint32_t tag);
void tp_req_free(dsim_req *r);

/* match.c, lost peers (dsim_tp_peer_lost). With ep->lock held: if req's
 * peer is lost, finishes req with that failure and returns 1. */
int tp_lost_fail_locked(dsim_req *req);
/* Frees ep's lost-peer records (the endpoint is being freed). */
void tp_lost_free(dsim_ep *ep);

#endif
