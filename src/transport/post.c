/* Starting transfers: dsim_isend and its variants (the header, the send
 * sequence number, the hand-over to the backend), dsim_tp_inject and
 * dsim_tp_hdr_next for hand-made frames, and posting receives (the match
 * against queued messages is in match.c). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fiu_int.h"
#include "core/overlap_int.h"
#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "tp_int.h"

static uint32_t tp_send_epoch_slocked(dsim_ep *ep, uint32_t comm_id)
{
    tp_map_ent *e = tp_map_find(&ep->send_epoch, -1, comm_id, 0);
    return e ? e->epoch : 0;
}

static void tp_hdr_fill(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, size_t len,
                        uint32_t epoch, uint64_t seq, dsim_tp_hdr *h)
{
    memset(h, 0, sizeof *h);
    h->magic = DSIM_TP_MAGIC;
    h->version = DSIM_TP_VERSION;
    h->src = ep->rank;
    h->dst = dst;
    h->comm_id = comm_id;
    h->epoch = epoch;
    h->tag = tag;
    h->seq = seq;
    h->len = len;
}

static dsim_err tp_send_args(const char *fn, dsim_ep *ep, int dst, uint32_t tag, dsim_req **out)
{
    if (out)
        *out = NULL;
    if (!ep || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: ep and req must not be NULL", fn);
    if (dst < 0 || dst >= ep->f->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: rank %d is out of range: the fabric has %d ranks (0..%d)", fn, dst,
                        ep->f->nranks, ep->f->nranks - 1);
    if (tag == DSIM_ANY_TAG)
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "%s: DSIM_ANY_TAG is only for receives; give the message a tag", fn);
    return DSIM_OK;
}

/* Links req into ep->live; fails if ep is not open. */
static dsim_err tp_req_link(dsim_req *req)
{
    dsim_ep *ep = req->ep;
    dsim_waitq_lock(ep->lock);
    int open = ep->state == TP_EP_OPEN;
    if (open)
        tp_list_push(&ep->live, &req->live);
    dsim_waitq_unlock(ep->lock);
    if (!open)
        return DSIM_ERR(DSIM_ESTATE, -1, "rank %d's endpoint is closed; cannot send", ep->rank);
    return DSIM_OK;
}

static void tp_req_unlink_free(dsim_req *req)
{
    dsim_waitq_lock(req->ep->lock);
    tp_list_del(&req->live);
    dsim_waitq_unlock(req->ep->lock);
    tp_req_free(req);
}

static dsim_err tp_isend(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                         size_t len, uint64_t vlen, const void *side, dsim_req **out);

dsim_err dsim_isend(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                    size_t len, dsim_req **out)
{
    return tp_isend(ep, dst, comm_id, tag, buf, len, 0, NULL, out);
}

dsim_err dsim_isend_virtual(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, uint64_t vlen,
                            const void *side, dsim_req **out)
{
    if (vlen == 0 || vlen > DSIM_TP_MAX_LEN) {
        if (out)
            *out = NULL;
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "dsim_isend_virtual: a virtual payload of %" PRIu64
                        " bytes; it must be 1..%" PRIu64,
                        vlen, (uint64_t)DSIM_TP_MAX_LEN);
    }
    return tp_isend(ep, dst, comm_id, tag, NULL, sizeof vlen, vlen, side, out);
}

dsim_err dsim_isend_side(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                         size_t len, const void *side, dsim_req **out)
{
    if (!side) {
        if (out)
            *out = NULL;
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "dsim_isend_side: side is NULL; pass %d bytes, or call dsim_isend",
                        DSIM_TP_SIDE_LEN);
    }
    return tp_isend(ep, dst, comm_id, tag, buf, len, 0, side, out);
}

/* vlen > 0: a virtual send; its 8-byte payload is vlen itself, kept in the
 * request so that it lives as long as the send. side: a sideband or NULL. */
static dsim_err tp_isend(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                         size_t len, uint64_t vlen, const void *side, dsim_req **out)
{
    DSIM_CHECK(tp_send_args("dsim_isend", ep, dst, tag, out));
    if (!buf && len && !vlen)
        return DSIM_ERR(DSIM_EINVAL, dst, "dsim_isend: buf is NULL but len is %zu", len);
    if ((uint64_t)len > DSIM_TP_MAX_LEN)
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "dsim_isend: %zu bytes is over the %" PRIu64
                        "-byte message limit; split it",
                        len, (uint64_t)DSIM_TP_MAX_LEN);
    dsim_fabric *f = ep->f;
    if (tp_aborted(f))
        return tp_aborted_now(f, "sending to", dst);
    /* libfiu point (dsim/fiu.h): the send fails as on a connection that was
     * reset, before a request exists or a sequence number is taken, so the
     * stream to dst has no gap. */
    if (DSIM_FIU("dsim/tp/send")) {
        char tg[16];
        tp_tag_str(tag, tg, sizeof tg);
        return DSIM_ERR(DSIM_EPEER, dst,
                        "connection to peer %d reset while rank %d was sending to it (comm "
                        "%" PRIu32 ", tag %s): %s",
                        dst, ep->rank, comm_id, tg, strerror(DSIM_FIU_INFO(ECONNRESET)));
    }
    dsim_req *req = tp_req_new(ep, TP_REQ_SEND, dst, comm_id, tag);
    if (!req)
        return DSIM_ENOMEM;
    if (vlen) {
        req->vlen = vlen;
        buf = &req->vlen;
    }
    req->sbuf = buf;
    req->slen = len;
    dsim_err e = tp_req_link(req);
    if (e != DSIM_OK) {
        tp_req_free(req);
        return e;
    }
    dsim_tp_hdr h;
    dsim_waitq_lock(ep->slock);
    uint32_t epoch = tp_send_epoch_slocked(ep, comm_id);
    tp_map_ent *s = tp_map_get(&ep->send_seq, dst, comm_id, 0);
    if (!s) {
        dsim_waitq_unlock(ep->slock);
        tp_req_unlink_free(req);
        return DSIM_ERR(DSIM_ENOMEM, dst, "out of memory sending to rank %d", dst);
    }
    if (s->epoch != epoch) {
        s->epoch = epoch;
        s->seq = 0;
    }
    tp_hdr_fill(ep, dst, comm_id, tag, len, epoch, ++s->seq, &h);
    if (vlen)
        h.flags |= DSIM_TP_F_VIRTUAL;
    if (side) {
        h.flags |= DSIM_TP_F_SIDE;
        memcpy(h.side, side, DSIM_TP_SIDE_LEN);
    }
    e = f->ops->send(ep, dst, &h, buf, len, req);
    if (e == DSIM_OK) {
        ep->msgs_sent++;
        ep->bytes_sent += len;
    }
    dsim_waitq_unlock(ep->slock);
    dsim_rt_trace(f->rt, DSIM_TRACE_SEND, ((uint64_t)(uint32_t)ep->rank << 32) | (uint32_t)dst,
                  ((uint64_t)comm_id << 32) | tag,
                  (h.seq << 8) ^ ((uint64_t)len << 1) ^ (uint64_t)e);
    dsim_trace("tp: rank %d isend to %d comm %" PRIu32 " tag %" PRIu32 " seq %" PRIu64
               " len %zu: %s",
               ep->rank, dst, comm_id, tag, h.seq, len, dsim_strerror(e));
    if (e != DSIM_OK) {
        tp_req_unlink_free(req);
        return e;
    }
    *out = req;
    if (f->filter && f->filter->on_sent)
        f->filter->on_sent(f->filter_user, ep, &h);
    return DSIM_OK;
}

dsim_err dsim_tp_inject(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload,
                        size_t len, dsim_req **out)
{
    if (out)
        *out = NULL;
    if (!ep || !hdr || !out || (!payload && len))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_tp_inject: ep, hdr and req must be set, and payload when len > 0");
    if (to < 0 || to >= ep->f->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_tp_inject: rank %d is out of range: the fabric has %d ranks", to,
                        ep->f->nranks);
    if (tp_aborted(ep->f))
        return tp_aborted_now(ep->f, "injecting a frame to", to);
    dsim_req *req = tp_req_new(ep, TP_REQ_SEND, to, hdr->comm_id, hdr->tag);
    if (!req)
        return DSIM_ENOMEM;
    req->sbuf = payload;
    req->slen = len;
    dsim_err e = tp_req_link(req);
    if (e != DSIM_OK) {
        tp_req_free(req);
        return e;
    }
    dsim_waitq_lock(ep->slock);
    e = ep->f->ops->send(ep, to, hdr, payload, len, req);
    dsim_waitq_unlock(ep->slock);
    if (e != DSIM_OK) {
        tp_req_unlink_free(req);
        return e;
    }
    *out = req;
    return DSIM_OK;
}

dsim_err dsim_tp_hdr_next(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, size_t len,
                          dsim_tp_hdr *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tp_hdr_next: out is NULL");
    dsim_req *unused;
    DSIM_CHECK(tp_send_args("dsim_tp_hdr_next", ep, dst, tag, &unused));
    dsim_waitq_lock(ep->slock);
    uint32_t epoch = tp_send_epoch_slocked(ep, comm_id);
    tp_map_ent *s = tp_map_find(&ep->send_seq, dst, comm_id, 0);
    uint64_t seq = (s && s->epoch == epoch) ? s->seq + 1 : 1;
    dsim_waitq_unlock(ep->slock);
    tp_hdr_fill(ep, dst, comm_id, tag, len, epoch, seq, out);
    return DSIM_OK;
}

static dsim_err tp_recv_args(const char *fn, dsim_ep *ep, int src, dsim_req **out)
{
    if (out)
        *out = NULL;
    if (!ep || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: ep and req must not be NULL", fn);
    if (src < 0 || src >= ep->f->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: rank %d is out of range: the fabric has %d ranks (0..%d)", fn, src,
                        ep->f->nranks, ep->f->nranks - 1);
    if (tp_aborted(ep->f))
        return tp_aborted_now(ep->f, "receiving from", src);
    return DSIM_OK;
}

static dsim_err tp_recv_post(dsim_req *req, dsim_req **out)
{
    dsim_err e = tp_recv_start(req);
    dsim_trace("tp: rank %d irecv from %d comm %" PRIu32 " tag %" PRIu32 " cap %zu: %s",
               req->ep->rank, req->peer, req->comm_id, req->tag, req->cap, dsim_strerror(e));
    if (e != DSIM_OK) {
        tp_req_free(req);
        return e;
    }
    *out = req;
    return DSIM_OK;
}

dsim_err dsim_irecv(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag, void *buf, size_t cap,
                    dsim_req **out)
{
    DSIM_CHECK(tp_recv_args("dsim_irecv", ep, src, out));
    if (!buf && cap)
        return DSIM_ERR(DSIM_EINVAL, src, "dsim_irecv: buf is NULL but cap is %zu", cap);
    dsim_req *req = tp_req_new(ep, TP_REQ_RECV, src, comm_id, tag);
    if (!req)
        return DSIM_ENOMEM;
    req->buf = buf;
    req->cap = cap;
    return tp_recv_post(req, out);
}

static dsim_err tp_recv_reduce(const char *fn, dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag,
                               const void *in, void *inout, size_t count, dsim_dtype t, dsim_op op,
                               dsim_req **out)
{
    DSIM_CHECK(tp_recv_args(fn, ep, src, out));
    size_t esz = dsim_dtype_size(t);
    if (!esz)
        return DSIM_ERR(DSIM_EINVAL, src, "%s: dtype %d is not a valid dsim_dtype", fn, (int)t);
    if ((int)op < 0 || op >= DSIM_OP_COUNT)
        return DSIM_ERR(DSIM_EINVAL, src, "%s: op %d is not a valid dsim_op", fn, (int)op);
    if (count > (size_t)DSIM_TP_MAX_LEN / esz)
        return DSIM_ERR(DSIM_EINVAL, src, "%s: %zu elements is over the message size limit", fn,
                        count);
    if ((!inout || !in) && count)
        return DSIM_ERR(DSIM_EINVAL, src, "%s: %s is NULL but count is %zu", fn, !in ? "in" : "out",
                        count);
    if (dsim_overlap_part(in, inout, count * esz))
        return DSIM_ERR(DSIM_EINVAL, src,
                        "%s: in and out overlap in part; pass the same buffer or disjoint ones",
                        fn);
    dsim_req *req = tp_req_new(ep, TP_REQ_RECV_REDUCE, src, comm_id, tag);
    if (!req)
        return DSIM_ENOMEM;
    req->buf = inout;
    req->rin = in != inout ? in : NULL;
    req->count = count;
    req->cap = count * esz;
    req->dt = t;
    req->op = op;
    return tp_recv_post(req, out);
}

dsim_err dsim_irecv_reduce(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag, void *inout,
                           size_t count, dsim_dtype t, dsim_op op, dsim_req **out)
{
    return tp_recv_reduce("dsim_irecv_reduce", ep, src, comm_id, tag, inout, inout, count, t, op,
                          out);
}

dsim_err dsim_irecv_reduce_from(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag,
                                const void *in, void *out, size_t count, dsim_dtype t, dsim_op op,
                                dsim_req **req)
{
    return tp_recv_reduce("dsim_irecv_reduce_from", ep, src, comm_id, tag, in, out, count, t, op,
                          req);
}
