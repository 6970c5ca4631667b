/* The receive path shared by every backend: header checks, sequence and
 * epoch tracking, and matching of frames against receives.
 *
 * Each endpoint keeps, per bucket of source ranks, a queue of posted
 * receives and a queue of unexpected messages, both oldest first. A frame
 * that passes the checks goes to the oldest posted receive with the same
 * (src, comm_id, tag) (or tag DSIM_ANY_TAG), else to the unexpected queue; a
 * new receive takes the oldest matching unexpected message, else is posted.
 * Since no receive names "any source", one bucket per source class keeps
 * every search short and keeps per-source order.
 *
 * Whoever claims the pair (message, receive) under ep->lock does the copy or
 * reduction after dropping the lock: the sender's thread when the receive was
 * posted first, the receiver's thread when the message was there first. A
 * large message from the same address space is queued by reference
 * (rendezvous), so either way its bytes are copied exactly once. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "tp_int.h"

#define TP_MAP_EMPTY INT32_MIN

/* ---- (peer, comm_id, tag) map ---- */

static size_t tp_map_hash(int32_t peer, uint32_t comm_id, uint32_t tag)
{
    uint64_t k = ((uint64_t)(uint32_t)peer << 32) | comm_id;
    k ^= (uint64_t)tag * 0xC2B2AE3D27D4EB4FULL;
    k *= 0x9E3779B97F4A7C15ULL;
    k ^= k >> 29;
    return (size_t)k;
}

void tp_map_init(tp_map *m)
{
    m->ents = NULL;
    m->cap = m->used = 0;
}

void tp_map_free(tp_map *m)
{
    free(m->ents);
    tp_map_init(m);
}

tp_map_ent *tp_map_find(const tp_map *m, int32_t peer, uint32_t comm_id, uint32_t tag)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = tp_map_hash(peer, comm_id, tag) & mask;; i = (i + 1) & mask) {
        tp_map_ent *e = &m->ents[i];
        if (e->peer == TP_MAP_EMPTY)
            return NULL;
        if (e->peer == peer && e->comm_id == comm_id && e->tag == tag)
            return e;
    }
}

static int tp_map_grow(tp_map *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    tp_map_ent *n = malloc(ncap * sizeof *n);
    if (!n)
        return -1;
    for (size_t i = 0; i < ncap; i++)
        n[i].peer = TP_MAP_EMPTY;
    for (size_t j = 0; j < m->cap; j++) {
        tp_map_ent *o = &m->ents[j];
        if (o->peer == TP_MAP_EMPTY)
            continue;
        size_t i = tp_map_hash(o->peer, o->comm_id, o->tag) & (ncap - 1);
        while (n[i].peer != TP_MAP_EMPTY)
            i = (i + 1) & (ncap - 1);
        n[i] = *o;
    }
    free(m->ents);
    m->ents = n;
    m->cap = ncap;
    return 0;
}

tp_map_ent *tp_map_get(tp_map *m, int32_t peer, uint32_t comm_id, uint32_t tag)
{
    tp_map_ent *e = tp_map_find(m, peer, comm_id, tag);
    if (e)
        return e;
    if ((m->used + 1) * 10 > m->cap * 7 && tp_map_grow(m) != 0)
        return NULL;
    size_t mask = m->cap - 1;
    size_t i = tp_map_hash(peer, comm_id, tag) & mask;
    while (m->ents[i].peer != TP_MAP_EMPTY)
        i = (i + 1) & mask;
    e = &m->ents[i];
    e->peer = peer;
    e->comm_id = comm_id;
    e->tag = tag;
    e->epoch = 0;
    e->seq = 0;
    m->used++;
    return e;
}

/* ---- requests ---- */

void tp_req_failf(dsim_req *req, int peer, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    free(req->errmsg);
    req->errmsg = strdup(buf); /* NULL on OOM: dsim_wait falls back to a generic text */
    req->errpeer = peer;
}

/* Failures in the order they happen, process-wide: a waiter that finds
 * several of its requests failed (woken late) reports the first. */
static atomic_uint_fast64_t tp_fail_seq;

static void tp_req_stamp(dsim_req *req)
{
    if (req->status != DSIM_OK)
        req->fail_seq = atomic_fetch_add_explicit(&tp_fail_seq, 1, memory_order_relaxed) + 1;
}

void tp_req_finish_locked(dsim_req *req, dsim_err status, size_t len)
{
    dsim_rt_trace(req->ep->f->rt, DSIM_TRACE_RECV,
                  ((uint64_t)(uint32_t)req->ep->rank << 32) | (uint32_t)req->peer,
                  ((uint64_t)req->comm_id << 32) | req->tag,
                  ((uint64_t)(uint32_t)req->kind << 40) ^ ((uint64_t)status << 32) ^ (uint64_t)len);
    req->status = status;
    req->len = len;
    tp_req_stamp(req);
    atomic_store_explicit(&req->done, 1, memory_order_release);
    dsim_waitq_wake(req->ep->lock);
}

void tp_req_finish(dsim_req *req, dsim_err status, size_t len)
{
    dsim_waitq *q = req->ep->lock;
    dsim_waitq_lock(q);
    tp_req_finish_locked(req, status, len);
    dsim_waitq_unlock(q);
}

/* Whether a message of len bytes fits receive r (else r is failed). */
static dsim_err tp_consume_check(dsim_req *r, int src, uint32_t tag, size_t len)
{
    if (r->kind == TP_REQ_RECV) {
        if (len > r->cap) {
            tp_req_failf(r, src,
                         "message from rank %d (comm %" PRIu32 ", tag %" PRIu32
                         ") is %zu bytes but the receive buffer holds %zu; post a buffer "
                         "of at least %zu bytes",
                         src, r->comm_id, tag, len, r->cap, len);
            return DSIM_ETRUNC;
        }
        return DSIM_OK;
    }
    if (len != r->cap) {
        tp_req_failf(r, src,
                     "message from rank %d (comm %" PRIu32 ", tag %" PRIu32
                     ") is %zu bytes but the reducing receive expects exactly %zu %s "
                     "elements (%zu bytes); both sides must use the same count and dtype",
                     src, r->comm_id, tag, len, r->count, dsim_dtype_name(r->dt), r->cap);
        return len > r->cap ? DSIM_ETRUNC : DSIM_EPROTO;
    }
    return DSIM_OK;
}

/* Reduces count elements of data into r's buffer from element at. */
static dsim_err tp_reduce_part(dsim_req *r, int src, size_t at, const void *data, size_t count)
{
    size_t esize = r->cap / r->count;
    uint8_t *out = (uint8_t *)r->buf + at * esize;
    dsim_err e = r->rin ? dsim_reduce_local3(out, (const uint8_t *)r->rin + at * esize, data, count,
                                             r->dt, r->op)
                        : dsim_reduce_local(out, data, count, r->dt, r->op);
    if (e != DSIM_OK)
        tp_req_failf(r, src, "reducing the message from rank %d failed: %s", src, dsim_errmsg());
    return e;
}

/* Copies or reduces a message into a receive; the caller owns both. */
static dsim_err tp_consume(dsim_req *r, int src, uint32_t tag, const void *data, size_t len)
{
    dsim_err e = tp_consume_check(r, src, tag, len);
    if (e != DSIM_OK)
        return e;
    if (r->kind == TP_REQ_RECV) {
        if (len)
            memcpy(r->buf, data, len);
        return DSIM_OK;
    }
    return r->count ? tp_reduce_part(r, src, 0, data, r->count) : DSIM_OK;
}

/* Sequence numbers run per (src, comm_id), so the tags of the lost frames
 * are unknown: g->tag is that of the frame that revealed the gap. */
static void tp_fail_gap(dsim_req *r, const tp_msg *g)
{
    if (g->kind == TP_MSG_CORRUPT) {
        tp_req_failf(r, g->src,
                     "corrupt message from rank %d (comm %" PRIu32 ", tag %" PRIu32
                     "): its payload checksum is %08" PRIx64 " but the payload hashes to %08" PRIx64
                     "; the message was discarded, not used; the link from rank %d corrupts data",
                     g->src, g->comm_id, g->tag, g->seq_expected, g->seq_got, g->src);
        return;
    }
    tp_req_failf(r, g->src,
                 "lost %" PRIu64 " message(s) from rank %d (comm %" PRIu32
                 ") sent before its message with tag %" PRIu32 ": expected sequence number %" PRIu64
                 ", got %" PRIu64 "; the link from rank %d drops messages",
                 g->seq_got - g->seq_expected, g->src, g->comm_id, g->tag, g->seq_expected,
                 g->seq_got, g->src);
}

/* ---- matching ---- */

/* tag DSIM_ANY_TAG takes the oldest receive of (src, comm_id) whatever its
 * tag: what a sequence gap fails, since the lost frames' tags are unknown. */
static dsim_req *tp_match_posted_locked(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag)
{
    tp_list *l = &tp_bucket_of(ep, src)->posted;
    for (tp_link *n = l->head.next; n != &l->head; n = n->next) {
        dsim_req *r = TP_CONTAINER(n, dsim_req, qlink);
        if (r->peer == src && r->comm_id == comm_id &&
            (r->tag == tag || r->tag == DSIM_ANY_TAG || tag == DSIM_ANY_TAG)) {
            tp_list_del(n);
            r->queued = 0;
            return r;
        }
    }
    return NULL;
}

static tp_msg *tp_match_unexpected_locked(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag)
{
    tp_list *l = &tp_bucket_of(ep, src)->unexpected;
    for (tp_link *n = l->head.next; n != &l->head; n = n->next) {
        tp_msg *m = TP_CONTAINER(n, tp_msg, link);
        /* A gap stands for frames of any tag: the next receive sees it. */
        if (m->src == src && m->comm_id == comm_id &&
            (tag == DSIM_ANY_TAG || m->tag == tag || m->kind == TP_MSG_GAP ||
             m->kind == TP_MSG_CORRUPT)) {
            tp_unexp_del(m);
            if (m->kind == TP_MSG_RNDV)
                TP_CONTAINER(m, dsim_req, m)->queued = 0;
            return m;
        }
    }
    return NULL;
}

static uint32_t tp_recv_epoch_locked(dsim_ep *ep, uint32_t comm_id)
{
    tp_map_ent *e = tp_map_find(&ep->recv_epoch, -1, comm_id, 0);
    return e ? e->epoch : 0;
}

enum { TP_ACCEPT, TP_REJECT };

/* Checks a frame against ep; counts and explains rejections. On a sequence
 * gap fills *gap (seq_expected < seq_got). */
static int tp_check_locked(dsim_ep *ep, const dsim_tp_hdr *h, size_t len, tp_msg *gap)
{
    dsim_fabric *f = ep->f;
    if (h->magic != DSIM_TP_MAGIC || h->version != DSIM_TP_VERSION || h->len != (uint64_t)len ||
        h->len > DSIM_TP_MAX_LEN || h->src < 0 || h->src >= f->nranks || h->tag == DSIM_ANY_TAG) {
        ep->rejected_corrupt++;
        dsim_warn("rank %d refused a malformed frame (magic %#" PRIx32 ", version %u, src %" PRId32
                  ", comm %" PRIu32 ", tag %" PRIu32 ", len %" PRIu64 " with %zu payload bytes)",
                  ep->rank, h->magic, (unsigned)h->version, h->src, h->comm_id, h->tag, h->len,
                  len);
        return TP_REJECT;
    }
    if (h->dst != ep->rank) {
        ep->rejected_misrouted++;
        dsim_warn("rank %d refused a frame from rank %" PRId32 " addressed to rank %" PRId32,
                  ep->rank, h->src, h->dst);
        return TP_REJECT;
    }
    uint32_t cur = tp_recv_epoch_locked(ep, h->comm_id);
    if (h->epoch < cur) {
        ep->rejected_stale++;
        dsim_debug("rank %d dropped a frame from rank %" PRId32 " of comm %" PRIu32
                   " epoch %" PRIu32 " (now %" PRIu32 ")",
                   ep->rank, h->src, h->comm_id, h->epoch, cur);
        return TP_REJECT;
    }
    tp_map_ent *s = tp_map_get(&ep->recv_seq, h->src, h->comm_id, 0);
    if (!s) {
        dsim_error_log("rank %d dropped a frame from rank %" PRId32 ": out of memory", ep->rank,
                       h->src);
        return TP_REJECT;
    }
    if (h->epoch > s->epoch) {
        s->epoch = h->epoch;
        s->seq = 0;
    } else if (h->epoch < s->epoch) {
        ep->rejected_stale++;
        return TP_REJECT;
    }
    if (h->seq <= s->seq) {
        ep->rejected_stale++;
        dsim_debug("rank %d dropped a duplicate frame from rank %" PRId32 " (comm %" PRIu32
                   ", tag %" PRIu32 ", seq %" PRIu64 ", last %" PRIu64 ")",
                   ep->rank, h->src, h->comm_id, h->tag, h->seq, s->seq);
        return TP_REJECT;
    }
    if (h->seq > s->seq + 1) {
        gap->seq_expected = s->seq + 1;
        gap->seq_got = h->seq;
        dsim_warn("rank %d: %" PRIu64 " message(s) from rank %" PRId32 " (comm %" PRIu32
                  ", tag %" PRIu32 ") were lost",
                  ep->rank, h->seq - s->seq - 1, h->src, h->comm_id, h->tag);
    }
    s->seq = h->seq;
    return TP_ACCEPT;
}

static dsim_err tp_refuse_locked(dsim_ep *ep, const dsim_tp_hdr *h)
{
    dsim_fabric *f = ep->f;
    if (tp_aborted(f))
        return DSIM_ERR(DSIM_EABORTED, f->abort_peer,
                        "transport aborted (failed rank %d: %s); no more messages are delivered",
                        f->abort_peer, f->abort_why);
    if (ep->state == TP_EP_CLOSED)
        return DSIM_ERR(DSIM_EPEER, ep->rank,
                        "rank %d has closed its endpoint; the message from rank %" PRId32
                        " (comm %" PRIu32 ", tag %" PRIu32 ") cannot be delivered",
                        ep->rank, h->src, h->comm_id, h->tag);
    return DSIM_OK;
}

/* Hands a message to a claimed posted receive, with no lock held. */
static void tp_fill(dsim_req *r, const dsim_tp_hdr *h, const void *payload, size_t len)
{
    if (h->flags & DSIM_TP_F_SIDE) {
        r->has_side = 1;
        memcpy(r->side, h->side, DSIM_TP_SIDE_LEN);
    }
    dsim_err st = tp_consume(r, h->src, h->tag, payload, len);
    tp_req_finish(r, st, len);
}

/* Queues or fails with a marker that stands for a frame that cannot be
 * used (lost frames, a corrupt one): the oldest receive from that peer and
 * communicator fails, whatever its tag. Under ep->lock. */
static void tp_mark_locked(dsim_ep *ep, const tp_msg *mark)
{
    dsim_req *r = tp_match_posted_locked(ep, mark->src, mark->comm_id, DSIM_ANY_TAG);
    if (r) {
        tp_fail_gap(r, mark);
        tp_req_finish_locked(r, DSIM_EPROTO, 0);
        return;
    }
    tp_msg *g = malloc(sizeof *g);
    if (g) {
        *g = *mark;
        tp_unexp_push(ep, g);
    } else {
        dsim_error_log("rank %d: out of memory recording an unusable message", ep->rank);
    }
}

static dsim_err tp_deliver_checked(dsim_ep *ep, const dsim_tp_hdr *h, const void *payload,
                                   size_t len, dsim_req *zc);
static tp_msg *tp_unexpected_new(dsim_ep *ep, const dsim_tp_hdr *h, size_t len);
static dsim_err tp_unexpected_take(dsim_ep *ep, const dsim_tp_hdr *h, tp_msg *m);
static void tp_repost(dsim_ep *ep, dsim_req *r);
static int tp_pull_parked(dsim_req *r, const tp_msg *m, dsim_err *st);
static void tp_pull_failed(dsim_ep *ep, dsim_req *r, const tp_msg *m, int how);
static void tp_peer_lost_now(dsim_ep *ep, int peer, int blame, dsim_err code, const char *msg);

/* The checks every delivered frame passes first, traced: -1 refused
 * (closed or revoked: *rc says why), 1 rejected (a duplicate, stale or
 * misrouted frame: counted, dropped), both unlocked; 0 admitted, ep->lock
 * held, with any gap before it marked. */
static int tp_admit(dsim_ep *ep, const dsim_tp_hdr *h, size_t len, dsim_err *rc)
{
    dsim_rt_trace(ep->f->rt, DSIM_TRACE_DELIVER,
                  ((uint64_t)(uint32_t)h->src << 32) | (uint32_t)h->dst,
                  ((uint64_t)h->comm_id << 32) | h->tag, (h->seq << 20) ^ (uint64_t)len);
    dsim_waitq_lock(ep->lock);
    *rc = tp_refuse_locked(ep, h);
    if (*rc != DSIM_OK) {
        dsim_waitq_unlock(ep->lock);
        return -1;
    }
    tp_msg gap = {.seq_expected = 0, .seq_got = 0};
    if (tp_check_locked(ep, h, len, &gap) == TP_REJECT) {
        dsim_waitq_unlock(ep->lock);
        return 1;
    }
    if (gap.seq_got) {
        gap.kind = TP_MSG_GAP;
        gap.src = h->src;
        gap.comm_id = h->comm_id;
        gap.tag = h->tag;
        gap.epoch = h->epoch;
        tp_mark_locked(ep, &gap);
    }
    return 0;
}

dsim_err dsim_tp_deliver(dsim_ep *ep, const dsim_tp_hdr *h, const void *payload, size_t len,
                         dsim_req *zc)
{
    if (!ep || !h || (!payload && len))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_tp_deliver: ep and hdr must be set, and payload when len > 0");
    const struct dsim_tp_filter *flt = ep->f->filter;
    if (!flt)
        return tp_deliver_checked(ep, h, payload, len, zc);
    dsim_tp_hdr hc = *h;
    if (flt->on_deliver(ep->f->filter_user, ep, &hc, payload, len) == DSIM_TP_FILTER_TAKEN) {
        if (zc)
            tp_req_finish(zc, DSIM_OK, len);
        return DSIM_OK;
    }
    return tp_deliver_checked(ep, &hc, payload, len, zc);
}

dsim_err dsim_tp_deliver_held(dsim_ep *ep, const dsim_tp_hdr *h, const void *payload, size_t len)
{
    if (!ep || !h || (!payload && len))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_tp_deliver_held: ep and hdr must be set, and payload when len > 0");
    return tp_deliver_checked(ep, h, payload, len, NULL);
}

static dsim_err tp_deliver_checked(dsim_ep *ep, const dsim_tp_hdr *h, const void *payload,
                                   size_t len, dsim_req *zc)
{
    /* Hashed before taking the lock: it reads the whole payload. */
    uint32_t sum = 0;
    bool check = (h->flags & DSIM_TP_F_CHECKSUM) && !(h->flags & DSIM_TP_F_VERIFIED) &&
                 h->len == (uint64_t)len;
    if (check)
        sum = dsim_tp_checksum(payload, len);
    dsim_err rc;
    int admit = tp_admit(ep, h, len, &rc);
    if (admit < 0)
        return rc;
    if (admit > 0) {
        if (zc)
            tp_req_finish(zc, DSIM_OK, len);
        return DSIM_OK;
    }
    if (check && sum != h->checksum) {
        /* Its sequence number is used up: it stands in the stream as a
         * frame that fails its receive, so nothing after it looks lost. */
        ep->rejected_corrupt++;
        dsim_warn("rank %d: a corrupt message from rank %" PRId32 " (comm %" PRIu32 ", tag %" PRIu32
                  ") was discarded: checksum %08" PRIx32 ", payload hashes to "
                  "%08" PRIx32,
                  ep->rank, h->src, h->comm_id, h->tag, h->checksum, sum);
        tp_msg bad = {.kind = TP_MSG_CORRUPT,
                      .src = h->src,
                      .comm_id = h->comm_id,
                      .tag = h->tag,
                      .epoch = h->epoch,
                      .seq_expected = h->checksum,
                      .seq_got = sum};
        tp_mark_locked(ep, &bad);
        dsim_waitq_unlock(ep->lock);
        if (zc)
            tp_req_finish(zc, DSIM_OK, len);
        return DSIM_OK;
    }
    ep->msgs_recv++;
    ep->bytes_recv += len;
    dsim_req *r = tp_match_posted_locked(ep, h->src, h->comm_id, h->tag);
    if (r) {
        dsim_waitq_unlock(ep->lock);
        tp_fill(r, h, payload, len);
        if (zc)
            tp_req_finish(zc, DSIM_OK, len);
        return DSIM_OK;
    }
    if (zc) {
        tp_msg *m = &zc->m;
        m->kind = TP_MSG_RNDV;
        m->src = h->src;
        m->comm_id = h->comm_id;
        m->tag = h->tag;
        m->epoch = h->epoch;
        m->len = len;
        m->data = payload;
        m->has_side = (h->flags & DSIM_TP_F_SIDE) != 0;
        if (m->has_side)
            memcpy(m->side, h->side, DSIM_TP_SIDE_LEN);
        zc->queue_ep = ep;
        zc->queued = 1;
        tp_unexp_push(ep, m);
        dsim_waitq_unlock(ep->lock);
        return DSIM_OK;
    }
    /* Copy outside the lock: the receiver may be posting receives meanwhile.
     * Frames from one source are delivered one at a time (the sender's
     * slock), so nothing from this source can overtake this one. */
    dsim_waitq_unlock(ep->lock);
    tp_msg *m = tp_unexpected_new(ep, h, len);
    if (!m)
        return DSIM_ENOMEM;
    if (len)
        memcpy(m + 1, payload, len);
    return tp_unexpected_take(ep, h, m);
}

/* A buffered message of len bytes with h's fields (the payload goes at
 * m + 1), or NULL with the error set. */
static void tp_spare_class(size_t len, int *lo, int *hi)
{
    *lo = len >= TP_SPARE_BIG ? 0 : TP_SPARES_BIG;
    *hi = len >= TP_SPARE_BIG ? TP_SPARES_BIG : len >= TP_SPARE_MIN ? TP_SPARES : TP_SPARES_BIG;
}

tp_msg *tp_msg_alloc(dsim_fabric *f, size_t len)
{
    int lo, hi;
    tp_spare_class(len, &lo, &hi);
    for (int i = lo; i < hi; i++) {
        /* a kept buffer is read only once taken: another thread may take
         * and free the one a look saw */
        if (!atomic_load_explicit(&f->spare[i], memory_order_relaxed))
            continue;
        tp_msg *m = atomic_exchange(&f->spare[i], NULL);
        if (m && m->cap >= len)
            return m;
        tp_msg_free(f, m); /* too small: kept again (or freed) */
    }
    tp_msg *m = malloc(sizeof *m + len);
    if (m)
        m->cap = len;
    return m;
}

void tp_msg_free(dsim_fabric *f, tp_msg *m)
{
    if (!m)
        return;
    int lo, hi;
    tp_spare_class(m->cap, &lo, &hi);
    if (m->kind == TP_MSG_EAGER)
        for (int i = lo; i < hi; i++) {
            tp_msg *none = NULL;
            if (atomic_compare_exchange_strong(&f->spare[i], &none, m))
                return;
        }
    free(m);
}

void tp_msg_spares_free(dsim_fabric *f)
{
    for (int i = 0; i < TP_SPARES; i++)
        free(atomic_exchange(&f->spare[i], NULL));
}

static tp_msg *tp_unexpected_new(dsim_ep *ep, const dsim_tp_hdr *h, size_t len)
{
    tp_msg *m = tp_msg_alloc(ep->f, len);
    if (!m) {
        DSIM_ERR(DSIM_ENOMEM, ep->rank, "out of memory buffering a %zu-byte message for rank %d",
                 len, ep->rank);
        return NULL;
    }
    m->kind = TP_MSG_EAGER;
    m->src = h->src;
    m->comm_id = h->comm_id;
    m->tag = h->tag;
    m->epoch = h->epoch;
    m->len = len;
    m->data = m + 1;
    m->has_side = (h->flags & DSIM_TP_F_SIDE) != 0;
    if (m->has_side)
        memcpy(m->side, h->side, DSIM_TP_SIDE_LEN);
    return m;
}

/* Hands the buffered message m (checked and counted under the lock before)
 * to a receive posted meanwhile, or queues it. */
static dsim_err tp_unexpected_take(dsim_ep *ep, const dsim_tp_hdr *h, tp_msg *m)
{
    size_t len = (size_t)m->len;
    dsim_waitq_lock(ep->lock);
    if (tp_aborted(ep->f) || ep->state == TP_EP_CLOSED ||
        h->epoch < tp_recv_epoch_locked(ep, h->comm_id)) {
        /* Revoked, closed or made stale while unlocked: dropped like any
         * frame that arrives too late. */
        int stale = !tp_aborted(ep->f) && ep->state != TP_EP_CLOSED;
        if (stale)
            ep->rejected_stale++;
        dsim_waitq_unlock(ep->lock);
        if (m->kind == TP_MSG_PULL)
            m->prelease(m->pctx, stale ? DSIM_TP_PULL_DROPPED : DSIM_TP_PULL_REFUSED);
        tp_msg_free(ep->f, m);
        return DSIM_OK;
    }
    dsim_req *r = tp_match_posted_locked(ep, h->src, h->comm_id, h->tag);
    if (r && m->kind == TP_MSG_PULL) {
        /* posted while it was being parked: read it here after all */
        dsim_waitq_unlock(ep->lock);
        if (h->flags & DSIM_TP_F_SIDE) {
            r->has_side = 1;
            memcpy(r->side, h->side, DSIM_TP_SIDE_LEN);
        }
        dsim_err st;
        int how = tp_pull_parked(r, m, &st);
        if (how == ECANCELED)
            tp_repost(ep, r);
        else if (how)
            tp_pull_failed(ep, r, m, how);
        else
            tp_req_finish(r, st, len);
        free(m);
        return DSIM_OK;
    }
    if (r) {
        dsim_waitq_unlock(ep->lock);
        tp_fill(r, h, m + 1, len);
        tp_msg_free(ep->f, m);
        return DSIM_OK;
    }
    tp_unexp_push(ep, m);
    dsim_waitq_unlock(ep->lock);
    return DSIM_OK;
}

/* Reads len payload bytes with read(ctx, ...) into receive r (whose size
 * was checked): a plain receive in one read, a reducing one in pieces of
 * scratch's size, each reduced while it is in cache. *err: the errno of a
 * read that failed (r's buffer may hold part of it), else 0. Returns r's
 * status. */
static dsim_err tp_read_into(dsim_req *r, int src, size_t len,
                             int (*read)(void *, void *, size_t, size_t), void *ctx, void *scratch,
                             size_t scratch_len, int *err)
{
    *err = 0;
    if (r->kind == TP_REQ_RECV) {
        *err = len ? read(ctx, r->buf, 0, len) : 0;
        return DSIM_OK;
    }
    if (!r->count)
        return DSIM_OK;
    size_t esize = r->cap / r->count, per = scratch_len / esize;
    for (size_t at = 0; at < r->count; at += per) {
        size_t n = r->count - at < per ? r->count - at : per;
        if ((*err = read(ctx, scratch, at * esize, n * esize)) != 0)
            return DSIM_OK;
        dsim_err e = tp_reduce_part(r, src, at, scratch, n);
        if (e != DSIM_OK)
            return e;
    }
    return DSIM_OK;
}

/* A receive whose message could not be read goes back where it was, first
 * of its source's, for the news of the sender's loss to fail. */
static void tp_repost(dsim_ep *ep, dsim_req *r)
{
    dsim_waitq_lock(ep->lock);
    if (!atomic_load_explicit(&r->done, memory_order_acquire) && !tp_lost_fail_locked(r)) {
        tp_list_push_front(&tp_bucket_of(ep, r->peer)->posted, &r->qlink);
        r->queued = 1;
    }
    dsim_waitq_unlock(ep->lock);
}

/* Reads parked message m into receive r (the caller owns both) and
 * releases it: 0 (r's status in *st), ECANCELED (withdrawn by its sender:
 * r untouched) or the errno of a read that failed (r's buffer may hold part
 * of it). */
static int tp_pull_parked(dsim_req *r, const tp_msg *m, dsim_err *st)
{
    *st = tp_consume_check(r, m->src, m->tag, m->len);
    if (*st != DSIM_OK) {
        m->prelease(m->pctx, DSIM_TP_PULL_DROPPED); /* never read */
        return 0;
    }
    /* a reducing receive's pieces: small enough to stay in cache, the size
     * the backend reads them in when it reads them at once */
    uint8_t small[4096];
    size_t cap = r->kind == TP_REQ_RECV ? 0 : m->ppiece;
    uint8_t *buf = cap ? malloc(cap) : NULL;
    if (!buf) {
        buf = small;
        cap = sizeof small;
    }
    int how;
    *st = tp_read_into(r, m->src, m->len, m->pread, m->pctx, buf, cap, &how);
    if (buf != small)
        free(buf);
    m->prelease(m->pctx, how);
    return how;
}

/* The parked message's read failed (how, an errno): r goes back to the
 * posted receives and fails with the sender's loss, as must every receive
 * from it after (nothing more from it can be trusted to be whole). */
static void tp_pull_failed(dsim_ep *ep, dsim_req *r, const tp_msg *m, int how)
{
    tp_repost(ep, r);
    /* Not through the filter: this message passed it already, so the break
     * comes now, before anything the filter holds from the sender. */
    char msg[512];
    snprintf(msg, sizeof msg,
             how == ESRCH ? "peer %d died: its process ended while rank %d read its "
                            "%zu-byte message (comm %" PRIu32 ", tag %" PRIu32 ")"
                          : "peer %d: rank %d could not read its %zu-byte message "
                            "(comm %" PRIu32 ", tag %" PRIu32 "): %s",
             m->src, ep->rank, m->len, m->comm_id, m->tag, strerror(how));
    tp_peer_lost_now(ep, m->src, m->src, how == ESRCH ? DSIM_EPEER : DSIM_EIO, msg);
}

dsim_err dsim_tp_deliver_pull(dsim_ep *ep, const dsim_tp_hdr *h, size_t len, dsim_tp_pull *p)
{
    if (!ep || !h || !p || !p->read || !p->scratch || p->scratch_len < 64)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_tp_deliver_pull: ep, hdr, a read function and a scratch buffer of "
                        "at least 64 bytes must be set");
    p->err = 0;
    if (ep->f->filter || ((h->flags & DSIM_TP_F_CHECKSUM) && !(h->flags & DSIM_TP_F_VERIFIED)))
        return DSIM_ENOTSUP;
    dsim_err rc;
    int admit = tp_admit(ep, h, len, &rc);
    if (admit != 0)
        return admit < 0 ? rc : DSIM_OK;
    ep->msgs_recv++;
    ep->bytes_recv += len;
    dsim_req *r = tp_match_posted_locked(ep, h->src, h->comm_id, h->tag);
    dsim_waitq_unlock(ep->lock);
    if (r) {
        if (h->flags & DSIM_TP_F_SIDE) {
            r->has_side = 1;
            memcpy(r->side, h->side, DSIM_TP_SIDE_LEN);
        }
        dsim_err st = tp_consume_check(r, h->src, h->tag, len);
        if (st == DSIM_OK)
            st = tp_read_into(r, h->src, len, p->read, p->ctx, p->scratch, p->scratch_len, &p->err);
        if (p->err) {
            tp_repost(ep, r);
            return DSIM_EIO;
        }
        tp_req_finish(r, st, len);
        return DSIM_OK;
    }
    void *pctx = p->park && p->release ? p->park(p->ctx) : NULL;
    tp_msg *m = tp_unexpected_new(ep, h, pctx ? 0 : len);
    if (!m) {
        if (pctx)
            p->release(pctx, DSIM_TP_PULL_DROPPED);
        return DSIM_ENOMEM;
    }
    if (pctx) {
        m->kind = TP_MSG_PULL;
        m->len = len;
        m->data = NULL;
        m->pread = p->read;
        m->prelease = p->release;
        m->pctx = pctx;
        m->ppiece = p->scratch_len;
        p->parked = 1;
        return tp_unexpected_take(ep, h, m);
    }
    p->err = len ? p->read(p->ctx, m + 1, 0, len) : 0;
    if (p->err) {
        tp_msg_free(ep->f, m);
        return DSIM_EIO;
    }
    return tp_unexpected_take(ep, h, m);
}

dsim_err tp_recv_start(dsim_req *req)
{
    dsim_ep *ep = req->ep;
    dsim_fabric *f = ep->f;
    dsim_waitq_lock(ep->lock);
    if (tp_aborted(f)) {
        dsim_waitq_unlock(ep->lock);
        return DSIM_ERR(DSIM_EABORTED, f->abort_peer,
                        "transport aborted (failed rank %d: %s); cannot receive from rank %d",
                        f->abort_peer, f->abort_why, req->peer);
    }
    if (ep->state != TP_EP_OPEN) {
        dsim_waitq_unlock(ep->lock);
        return DSIM_ERR(DSIM_ESTATE, -1, "rank %d's endpoint is closed; cannot receive", ep->rank);
    }
    tp_list_push(&ep->live, &req->live);
    tp_msg *m;
again:
    m = tp_match_unexpected_locked(ep, req->peer, req->comm_id, req->tag);
    if (!m && tp_lost_fail_locked(req)) {
        dsim_waitq_unlock(ep->lock);
        return DSIM_OK;
    }
    if (!m) {
        tp_list_push(&tp_bucket_of(ep, req->peer)->posted, &req->qlink);
        req->queued = 1;
        dsim_waitq_unlock(ep->lock);
        return DSIM_OK;
    }
    dsim_waitq_unlock(ep->lock);
    dsim_err st;
    if (m->kind == TP_MSG_PULL) {
        int how = tp_pull_parked(req, m, &st);
        if (how) {
            if (how != ECANCELED)
                tp_pull_failed(ep, req, m, how);
            free(m);
            if (how != ECANCELED)
                return DSIM_OK;
            /* withdrawn: as if it had never come */
            dsim_waitq_lock(ep->lock);
            goto again;
        }
    }
    if ((m->kind == TP_MSG_EAGER || m->kind == TP_MSG_RNDV || m->kind == TP_MSG_PULL) &&
        m->has_side) {
        req->has_side = 1;
        memcpy(req->side, m->side, DSIM_TP_SIDE_LEN);
    }
    /* Nobody else knows req yet: it can be finished without the lock. */
    switch (m->kind) {
    case TP_MSG_GAP:
    case TP_MSG_CORRUPT:
        tp_fail_gap(req, m);
        req->status = DSIM_EPROTO;
        free(m);
        break;
    case TP_MSG_EAGER:
        st = tp_consume(req, m->src, m->tag, m->data, m->len);
        req->status = st;
        req->len = m->len;
        tp_msg_free(ep->f, m);
        break;
    case TP_MSG_PULL: /* read above */
        req->status = st;
        req->len = m->len;
        free(m);
        break;
    default: {
        dsim_req *sreq = TP_CONTAINER(m, dsim_req, m);
        st = tp_consume(req, m->src, m->tag, m->data, m->len);
        req->status = st;
        req->len = m->len;
        tp_req_finish(sreq, DSIM_OK, m->len);
        break;
    }
    }
    tp_req_stamp(req);
    atomic_store_explicit(&req->done, 1, memory_order_release);
    return DSIM_OK;
}

int dsim_ep_peek_side(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag, uint32_t mask,
                      void *side)
{
    if (!ep || !side || src < 0 || src >= ep->f->nranks)
        return 0;
    int found = 0;
    dsim_waitq_lock(ep->lock);
    if (ep->state == TP_EP_OPEN) {
        tp_list *l = &tp_bucket_of(ep, src)->unexpected;
        for (tp_link *n = l->head.next; n != &l->head && !found; n = n->next) {
            const tp_msg *m = TP_CONTAINER(n, tp_msg, link);
            if (m->src == src && m->comm_id == comm_id && (m->tag & mask) == (tag & mask) &&
                (m->kind == TP_MSG_EAGER || m->kind == TP_MSG_RNDV || m->kind == TP_MSG_PULL) &&
                m->has_side) {
                memcpy(side, m->side, DSIM_TP_SIDE_LEN);
                found = 1;
            }
        }
    }
    dsim_waitq_unlock(ep->lock);
    return found;
}

int dsim_probe_any(dsim_ep *ep, uint32_t comm_id, int *src)
{
    if (!ep)
        return 0;
    int found = 0;
    dsim_waitq_lock(ep->lock);
    if (!tp_aborted(ep->f) && ep->state == TP_EP_OPEN) {
        for (tp_link *n = ep->arrivals.head.next; n != &ep->arrivals.head; n = n->next) {
            const tp_msg *m = TP_CONTAINER(n, tp_msg, arrival);
            if (m->comm_id == comm_id) {
                if (src)
                    *src = m->src;
                found = 1;
                break;
            }
        }
    }
    dsim_waitq_unlock(ep->lock);
    return found;
}

uint64_t dsim_ep_unreceived(dsim_ep *ep, const uint32_t *skip, size_t n_skip, dsim_unreceived *out,
                            size_t cap)
{
    if (out && cap)
        memset(out, 0, cap * sizeof *out);
    if (!ep)
        return 0;
    uint64_t total = 0;
    size_t n = 0;
    dsim_waitq_lock(ep->lock);
    for (tp_link *it = ep->arrivals.head.next; it != &ep->arrivals.head; it = it->next) {
        const tp_msg *m = TP_CONTAINER(it, tp_msg, arrival);
        if (m->kind != TP_MSG_EAGER && m->kind != TP_MSG_RNDV && m->kind != TP_MSG_PULL)
            continue;
        size_t k = 0;
        while (k < n_skip && skip[k] != m->comm_id)
            k++;
        if (k < n_skip)
            continue;
        total++;
        size_t i = 0;
        while (i < n && (out[i].src != m->src || out[i].comm_id != m->comm_id))
            i++;
        if (i == n) {
            if (n == cap)
                continue;
            out[n++] = (dsim_unreceived){.src = m->src, .comm_id = m->comm_id, .tag = m->tag};
        }
        out[i].count++;
        out[i].bytes += m->len;
    }
    dsim_waitq_unlock(ep->lock);
    return total;
}

static void tp_drop_msg(dsim_fabric *f, tp_msg *m, dsim_err st, int closer)
{
    if (m->kind == TP_MSG_PULL)
        m->prelease(m->pctx, st == DSIM_OK ? DSIM_TP_PULL_DROPPED : DSIM_TP_PULL_REFUSED);
    if (m->kind != TP_MSG_RNDV) {
        tp_msg_free(f, m);
        return;
    }
    dsim_req *sreq = TP_CONTAINER(m, dsim_req, m);
    if (st != DSIM_OK)
        tp_req_failf(sreq, closer,
                     "rank %d closed its endpoint before receiving the %zu-byte message "
                     "(comm %" PRIu32 ", tag %" PRIu32 ")",
                     closer, m->len, m->comm_id, m->tag);
    tp_req_finish(sreq, st, m->len);
}

void tp_drain_unexpected(dsim_ep *ep)
{
    tp_list all;
    tp_list_init(&all);
    dsim_waitq_lock(ep->lock);
    for (unsigned b = 0; b <= ep->f->bucket_mask; b++) {
        tp_list *l = &ep->buckets[b].unexpected;
        while (!tp_list_empty(l)) {
            tp_link *n = l->head.next;
            tp_msg *m = TP_CONTAINER(n, tp_msg, link);
            tp_unexp_del(m);
            if (m->kind == TP_MSG_RNDV)
                TP_CONTAINER(m, dsim_req, m)->queued = 0;
            tp_list_push(&all, n);
        }
    }
    dsim_waitq_unlock(ep->lock);
    while (!tp_list_empty(&all)) {
        tp_link *n = all.head.next;
        tp_list_del(n);
        tp_drop_msg(ep->f, TP_CONTAINER(n, tp_msg, link), DSIM_EPEER, ep->rank);
    }
}

uint64_t tp_purge_epoch_locked(dsim_ep *ep, uint32_t comm_id, uint32_t epoch, tp_list *done_sends)
{
    uint64_t n = 0;
    for (unsigned b = 0; b <= ep->f->bucket_mask; b++) {
        tp_list *l = &ep->buckets[b].unexpected;
        for (tp_link *it = l->head.next; it != &l->head;) {
            tp_link *next = it->next;
            tp_msg *m = TP_CONTAINER(it, tp_msg, link);
            if (m->comm_id == comm_id && m->epoch < epoch) {
                tp_unexp_del(m);
                n++;
                if (m->kind == TP_MSG_RNDV || m->kind == TP_MSG_PULL) {
                    if (m->kind == TP_MSG_RNDV)
                        TP_CONTAINER(m, dsim_req, m)->queued = 0;
                    tp_list_push(done_sends, it);
                } else {
                    tp_msg_free(ep->f, m);
                }
            }
            it = next;
        }
    }
    ep->rejected_stale += n;
    return n;
}

/* Finishes rendezvous sends (and releases parked messages) collected by
 * tp_purge_epoch_locked: the receiver dropped them, which to the sender
 * looks like delivery. */
void tp_finish_dropped(dsim_fabric *f, tp_list *sends)
{
    while (!tp_list_empty(sends)) {
        tp_link *n = sends->head.next;
        tp_list_del(n);
        tp_drop_msg(f, TP_CONTAINER(n, tp_msg, link), DSIM_OK, -1);
    }
}

/* ---- links that break (backends with connections) ---- */

typedef struct tp_lost {
    struct tp_lost *next;
    int peer;
    int blame; /* the rank the failures name */
    dsim_err code;
    char msg[];
} tp_lost;

static tp_lost *tp_lost_find_locked(dsim_ep *ep, int peer)
{
    for (tp_lost *l = ep->lost; l; l = l->next)
        if (l->peer == peer)
            return l;
    return NULL;
}

int tp_lost_fail_locked(dsim_req *req)
{
    tp_lost *l = tp_lost_find_locked(req->ep, req->peer);
    if (!l)
        return 0;
    tp_req_failf(req, l->blame, "%s", l->msg);
    tp_req_finish_locked(req, l->code, 0);
    return 1;
}

void tp_lost_free(dsim_ep *ep)
{
    while (ep->lost) {
        tp_lost *l = ep->lost;
        ep->lost = l->next;
        free(l);
    }
}

static void tp_peer_lost(dsim_ep *ep, int peer, int blame, dsim_err code, const char *msg)
{
    /* Frames the fault filter holds from peer arrived before the break: it
     * may take the break to hand it over after them. */
    const struct dsim_tp_filter *fl = ep->f->filter;
    if (fl && fl->on_peer_lost &&
        fl->on_peer_lost(ep->f->filter_user, ep, peer, blame, code, msg) == DSIM_TP_FILTER_TAKEN)
        return;
    tp_peer_lost_now(ep, peer, blame, code, msg);
}

static void tp_peer_lost_now(dsim_ep *ep, int peer, int blame, dsim_err code, const char *msg)
{
    size_t n = strlen(msg) + 1;
    tp_lost *l = malloc(sizeof *l + n);
    dsim_waitq_lock(ep->lock);
    if (tp_lost_find_locked(ep, peer)) {
        dsim_waitq_unlock(ep->lock);
        free(l); /* the first break stands */
        return;
    }
    if (l) {
        l->peer = peer;
        l->blame = blame;
        l->code = code;
        memcpy(l->msg, msg, n);
        l->next = NULL;
        tp_lost **tail = &ep->lost;
        while (*tail)
            tail = &(*tail)->next;
        *tail = l;
    } else {
        /* Later receives then wait for their deadline instead of failing at
         * once; the ones posted now still fail below. */
        dsim_error_log("rank %d: out of memory recording that the link from rank %d broke",
                       ep->rank, peer);
    }
    /* Every comm and tag: nothing more arrives from this peer. */
    tp_list *pl = &tp_bucket_of(ep, peer)->posted;
    for (tp_link *it = pl->head.next; it != &pl->head;) {
        tp_link *next = it->next;
        dsim_req *r = TP_CONTAINER(it, dsim_req, qlink);
        if (r->peer == peer) {
            tp_list_del(it);
            r->queued = 0;
            tp_req_failf(r, blame, "%s", msg);
            tp_req_finish_locked(r, code, 0);
        }
        it = next;
    }
    dsim_waitq_unlock(ep->lock);
    dsim_debug("rank %d: link from rank %d lost: %s", ep->rank, peer, msg);
}

void dsim_tp_peer_lost(dsim_ep *ep, int peer, dsim_err code, const char *fmt, ...)
{
    if (!ep || peer < 0 || peer >= ep->f->nranks || code == DSIM_OK)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tp_peer_lost(ep, peer, peer, code, msg);
}

void dsim_tp_peer_lost_blaming(dsim_ep *ep, int peer, int blame, dsim_err code, const char *fmt,
                               ...)
{
    if (!ep || peer < 0 || peer >= ep->f->nranks || code == DSIM_OK)
        return;
    if (blame < 0 || blame >= ep->f->nranks)
        blame = peer;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tp_peer_lost(ep, peer, blame, code, msg);
}

void dsim_tp_peer_lost_held(dsim_ep *ep, int peer, int blame, dsim_err code, const char *msg)
{
    if (!ep || peer < 0 || peer >= ep->f->nranks || code == DSIM_OK || !msg)
        return;
    if (blame < 0 || blame >= ep->f->nranks)
        blame = peer;
    tp_peer_lost_now(ep, peer, blame, code, msg);
}

void dsim_tp_count_corrupt(dsim_ep *ep)
{
    if (!ep)
        return;
    dsim_waitq_lock(ep->lock);
    ep->rejected_corrupt++;
    dsim_waitq_unlock(ep->lock);
}

/* The gap handling of dsim_tp_deliver, for a frame that is not delivered. */
static void tp_gap_locked(dsim_ep *ep, const dsim_tp_hdr *h, tp_msg *gap)
{
    gap->kind = TP_MSG_GAP;
    gap->src = h->src;
    gap->comm_id = h->comm_id;
    gap->tag = h->tag;
    gap->epoch = h->epoch;
    dsim_req *r = tp_match_posted_locked(ep, h->src, h->comm_id, DSIM_ANY_TAG);
    if (r) {
        tp_fail_gap(r, gap);
        tp_req_finish_locked(r, DSIM_EPROTO, 0);
        return;
    }
    tp_msg *g = malloc(sizeof *g);
    if (!g) {
        dsim_error_log("rank %d: out of memory recording lost messages", ep->rank);
        return;
    }
    *g = *gap;
    tp_unexp_push(ep, g);
}

dsim_err dsim_tp_withdrawn(dsim_ep *ep, const dsim_tp_hdr *h)
{
    if (!ep || !h)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tp_withdrawn: ep and hdr must be set");
    dsim_rt_trace(
        ep->f->rt, DSIM_TRACE_DELIVER, ((uint64_t)(uint32_t)h->src << 32) | (uint32_t)h->dst,
        ((uint64_t)h->comm_id << 32) | h->tag, (h->seq << 20) ^ 0xfffffULL); /* withdrawn */
    dsim_waitq_lock(ep->lock);
    dsim_err rc = tp_refuse_locked(ep, h);
    if (rc != DSIM_OK) {
        dsim_waitq_unlock(ep->lock);
        return rc;
    }
    tp_msg gap = {.seq_expected = 0, .seq_got = 0};
    if (h->len <= DSIM_TP_MAX_LEN && tp_check_locked(ep, h, (size_t)h->len, &gap) == TP_ACCEPT &&
        gap.seq_got)
        tp_gap_locked(ep, h, &gap);
    dsim_waitq_unlock(ep->lock);
    return DSIM_OK;
}

void tp_tag_str(uint32_t tag, char *buf, size_t cap)
{
    if (tag == DSIM_ANY_TAG)
        snprintf(buf, cap, "any");
    else
        snprintf(buf, cap, "%" PRIu32, tag);
}
