/* tcp: the frame reader (loop thread, lp->lock not held): the header
 * checks, the body, the checksum, the hand-over to the receive path, and
 * control frames. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "tcp_int.h"

/* ---- reading (loop thread, lp->lock not held) ---- */

/* Kills c from the loop thread with a message. */
static void tcp_break(tcp_loop *lp, tcp_conn *c, dsim_err code, const char *msg)
{
    tcp_after a = {0};
    dsim_waitq_lock(lp->lock);
    tcp_kill_locked(c, code, &a, "%s", msg);
    dsim_waitq_unlock(lp->lock);
    tcp_after_run(lp, &a);
}

static void tcp_corrupt(tcp_loop *lp, tcp_conn *c, const char *what)
{
    char msg[400];
    if (c->ep)
        dsim_tp_count_corrupt(c->ep);
    if (c->kind == TCP_IN)
        snprintf(msg, sizeof msg,
                 "corrupt frame (%s) from peer %d on its connection to rank %d (%s); the "
                 "connection is closed (a byte stream cannot be resynchronised) and rank %d can "
                 "receive nothing more from peer %d",
                 what, c->peer, c->local, c->where, c->local, c->peer);
    else
        snprintf(msg, sizeof msg,
                 "corrupt frame (%s) from peer %d on rank %d's connection to it (%s); the "
                 "connection is closed (a byte stream cannot be resynchronised) and rank %d can "
                 "send nothing more to peer %d",
                 what, c->peer, c->local, c->where, c->local, c->peer);
    dsim_warn("tcp: %s", msg);
    tcp_break(lp, c, c->kind == TCP_IN ? DSIM_EPROTO : DSIM_EPEER, msg);
}

static void tcp_read_failed(tcp_loop *lp, tcp_conn *c, int err)
{
    char msg[400];
    int mid = c->rstate == TCP_RD_BODY || c->rhdr_got > 0 || c->spos < c->slen;
    const char *tail =
        c->kind == TCP_IN ? "can receive nothing more from it" : "can send nothing more to it";
    if (err == 0 && mid && c->rstate == TCP_RD_BODY)
        snprintf(msg, sizeof msg,
                 "peer %d closed the connection in the middle of a frame (%zu of %zu payload "
                 "bytes); rank %d %s",
                 c->peer, c->rgot, c->rlen, c->local, tail);
    else if (err == 0 && mid)
        snprintf(msg, sizeof msg,
                 "peer %d closed the connection in the middle of a frame header; rank %d %s",
                 c->peer, c->local, tail);
    else if (err == 0)
        snprintf(msg, sizeof msg, "peer %d closed the connection; rank %d %s", c->peer, c->local,
                 tail);
    else if (err == ECONNRESET || err == EPIPE)
        snprintf(msg, sizeof msg, "connection to peer %d reset; rank %d %s", c->peer, c->local,
                 tail);
    else
        snprintf(msg, sizeof msg, "connection to peer %d failed: %s; rank %d %s", c->peer,
                 strerror(err), c->local, tail);
    tcp_break(lp, c, DSIM_EPEER, msg);
}

/* Header complete in c->rhdr: checks it before any body is read. */
static int tcp_frame_begin(tcp_loop *lp, tcp_conn *c)
{
    tcp_fabric *tf = lp->tf;
    dsim_tp_hdr *h = &c->rh;
    tcp_hdr_get(c->rhdr, h);
    char what[128] = "";
    uint64_t limit = tf->max_frame;
    if (h->magic == DSIM_TP_MAGIC) {
        c->rkind = TCP_K_DATA;
    } else if (h->magic == TCP_MAGIC_RAW) {
        c->rkind = TCP_K_RAW;
        limit += TCP_HDR_LEN;
    } else if (h->magic == TCP_MAGIC_CTL) {
        c->rkind = TCP_K_CTL;
        limit = TCP_CTL_MAX;
    } else {
        snprintf(what, sizeof what, "bad magic %#" PRIx32, h->magic);
    }
    if (what[0])
        ;
    else if (h->version != DSIM_TP_VERSION)
        snprintf(what, sizeof what, "bad version %u", (unsigned)h->version);
    else if (!(h->flags & DSIM_TP_F_CHECKSUM))
        snprintf(what, sizeof what, "no checksum");
    else if (h->len > limit)
        snprintf(what, sizeof what, "absurd length %" PRIu64 ", over the %" PRIu64 "-byte limit",
                 h->len, limit);
    else if (c->rkind == TCP_K_RAW && h->len < TCP_HDR_LEN)
        snprintf(what, sizeof what, "a wrapped frame of %" PRIu64 " bytes", h->len);
    else if (c->rkind == TCP_K_DATA && (h->flags & ~TCP_DATA_FLAGS))
        snprintf(what, sizeof what, "unknown flags %#x in a data frame",
                 (unsigned)(h->flags & ~TCP_DATA_FLAGS));
    else if (c->rkind != TCP_K_DATA && (h->flags & DSIM_TP_F_SIDE))
        snprintf(what, sizeof what, "a sideband on a %s frame",
                 c->rkind == TCP_K_RAW ? "wrapped" : "control");
    else if (c->rkind == TCP_K_DATA && (h->flags & TCP_F_HEAD_ONLY) && tf->payload_crc)
        snprintf(what, sizeof what,
                 "a checksum that leaves out the payload, where this fabric's must cover it "
                 "(payload_checksum=1)");
    if (what[0]) {
        tcp_corrupt(lp, c, what);
        return -1;
    }
    if (c->kind == TCP_OUT && c->rkind != TCP_K_CTL) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "peer %d sent a data frame back on rank %d's connection to it (%s), which "
                 "carries only control frames that way; rank %d can send nothing more to it",
                 c->peer, c->local, c->where, c->local);
        dsim_warn("tcp: %s", msg);
        tcp_break(lp, c, DSIM_EPEER, msg);
        return -1;
    }
    c->rcrc = tcp_hdr_crc(c->rhdr);
    /* The sideband is read as the first bytes of the body. */
    size_t side = c->rkind == TCP_K_DATA && (h->flags & DSIM_TP_F_SIDE) ? TCP_SIDE_LEN : 0;
    c->rlen = (size_t)h->len + side;
    c->rcrc_len = c->rkind == TCP_K_DATA && (h->flags & TCP_F_HEAD_ONLY) ? side : c->rlen;
    c->rgot = 0;
    return 0;
}

/* Adds the body's bytes p[0 .. n), which start at body offset at, to the
 * running checksum, as far as it covers the body. */
static void tcp_body_crc(tcp_conn *c, size_t at, const uint8_t *p, size_t n)
{
    if (at >= c->rcrc_len)
        return;
    c->rcrc = tcp_crc32c(c->rcrc, p, n < c->rcrc_len - at ? n : c->rcrc_len - at);
}

static int tcp_hand_over(tcp_loop *lp, tcp_conn *c, const dsim_tp_hdr *h, const uint8_t *body,
                         size_t len)
{
    /* A data frame's checksum (header and payload) was verified on
     * arrival; a wrapped frame's header is hand-made and is judged by the
     * receive path as it stands. */
    dsim_tp_hdr hv = *h;
    if (c->rkind == TCP_K_DATA && (h->flags & TCP_F_HEAD_ONLY))
        /* its payload was not checked, and needs no check (payload_checksum=0) */
        hv.flags &= (uint16_t) ~(TCP_F_HEAD_ONLY | DSIM_TP_F_CHECKSUM);
    else if (c->rkind != TCP_K_RAW)
        hv.flags |= DSIM_TP_F_VERIFIED;
    if (c->rkind == TCP_K_DATA && h->src != c->peer) {
        /* A connection carries one peer's frames: one that claims another
         * source is spoofed. Not delivered as that rank's: the receive path
         * refuses it as malformed (and counts it); the link stays up. */
        dsim_warn("tcp: rank %d refused a frame on peer %d's connection (%s) claiming to come "
                  "from rank %" PRId32 " (comm %" PRIu32 ", tag %" PRIu32 ")",
                  c->local, c->peer, c->where, h->src, h->comm_id, h->tag);
        hv.src = -1;
    }
    dsim_err e = dsim_tp_deliver(c->ep, &hv, body, len, NULL);
    if (e == DSIM_OK || e == DSIM_EABORTED || e == DSIM_EPEER)
        return 0; /* taken, or nobody takes anything any more */
    /* It consumed a sequence number and went nowhere: the stream has a hole
     * the receive path cannot see, so the link is broken. */
    char msg[400];
    snprintf(msg, sizeof msg,
             "rank %d could not take a %zu-byte frame from peer %d (%s); the connection is "
             "closed and rank %d can receive nothing more from peer %d",
             c->local, len, c->peer, dsim_errmsg(), c->local, c->peer);
    dsim_warn("tcp: %s", msg);
    tcp_break(lp, c, DSIM_EPEER, msg);
    return -1;
}

static int tcp_control(tcp_loop *lp, tcp_conn *c, const uint8_t *body, size_t len)
{
    tcp_fabric *tf = lp->tf;
    if (c->rh.tag == TCP_CTL_ABORT) {
        if (len < 4) {
            tcp_corrupt(lp, c, "an abort notice without a failed rank");
            return -1;
        }
        int32_t failed = (int32_t)tcp_get32(body);
        if (failed < -1 || failed >= tf->nranks)
            failed = -1;
        char why[TCP_WHY_MAX + 1];
        size_t wl = len - 4 > TCP_WHY_MAX ? TCP_WHY_MAX : len - 4;
        memcpy(why, body + 4, wl);
        why[wl] = '\0';
        dsim_info("tcp: rank %d: peer %d's process revoked the fabric (failed rank %d: %s)",
                  c->local, c->peer, (int)failed, why);
        dsim_fabric_abort(tf->f, failed, why);
        return 0;
    }
    if (c->rh.tag == TCP_CTL_WITHDRAWN) {
        if (c->kind != TCP_IN || len != TCP_HDR_LEN) {
            tcp_corrupt(lp, c, "a malformed withdrawal notice");
            return -1;
        }
        dsim_tp_hdr h;
        tcp_hdr_get(body, &h);
        dsim_tp_withdrawn(c->ep, &h);
        return 0;
    }
    dsim_debug("tcp: rank %d ignored control frame %" PRIu32 " from peer %d", c->local, c->rh.tag,
               c->peer);
    return 0;
}

static int tcp_frame_end(tcp_loop *lp, tcp_conn *c, const uint8_t *body)
{
    c->rstate = TCP_RD_HDR;
    c->rhdr_got = 0;
    if (c->rcrc != c->rh.checksum) {
        tcp_corrupt(lp, c, "checksum mismatch");
        return -1;
    }
    if (c->rkind == TCP_K_DATA) {
        size_t side = 0;
        if (c->rh.flags & DSIM_TP_F_SIDE) {
            memcpy(c->rh.side, body, TCP_SIDE_LEN);
            side = TCP_SIDE_LEN;
        }
        return tcp_hand_over(lp, c, &c->rh, body + side, c->rlen - side);
    }
    if (c->rkind == TCP_K_RAW) {
        dsim_tp_hdr in;
        tcp_hdr_get(body, &in);
        size_t at = TCP_HDR_LEN;
        if (in.flags & DSIM_TP_F_SIDE) {
            /* A hand-made header's sideband travels after it. */
            if (c->rlen < TCP_HDR_LEN + TCP_SIDE_LEN) {
                tcp_corrupt(lp, c, "a wrapped frame whose sideband is cut short");
                return -1;
            }
            memcpy(in.side, body + at, TCP_SIDE_LEN);
            at += TCP_SIDE_LEN;
        }
        return tcp_hand_over(lp, c, &in, body + at, c->rlen - at);
    }
    return tcp_control(lp, c, body, c->rlen);
}

static int tcp_body_room(tcp_loop *lp, tcp_conn *c)
{
    if (c->rbody_cap >= c->rlen)
        return 0;
    free(c->rbody);
    c->rbody = malloc(c->rlen);
    c->rbody_cap = c->rbody ? c->rlen : 0;
    if (c->rbody)
        return 0;
    char msg[300];
    snprintf(msg, sizeof msg,
             "rank %d ran out of memory for a %zu-byte frame from peer %d; the connection is "
             "closed",
             c->local, c->rlen, c->peer);
    dsim_error_log("tcp: %s", msg);
    tcp_break(lp, c, DSIM_EPEER, msg);
    return -1;
}

/* Reads what the socket holds, up to a budget (the loop is level-triggered
 * and comes back), handing over each frame as it completes. */
void tcp_read(tcp_loop *lp, tcp_conn *c)
{
    size_t budget = TCP_READ_BUDGET;
    for (;;) {
        if (c->spos == c->slen) {
            if (!budget)
                return;
            /* A large body goes straight into its buffer. */
            int direct = c->rstate == TCP_RD_BODY && c->rlen - c->rgot >= c->scap;
            uint8_t *dst = direct ? c->rbody + c->rgot : c->stage;
            size_t want = direct ? c->rlen - c->rgot : c->scap;
            if (direct && want > TCP_RECV_PIECE)
                want = TCP_RECV_PIECE; /* hashed while still in cache */
            ssize_t n = recv(c->fd, dst, want, 0);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    tcp_read_failed(lp, c, errno);
                return;
            }
            if (n == 0) {
                tcp_read_failed(lp, c, 0);
                return;
            }
            budget = budget > (size_t)n ? budget - (size_t)n : 0;
            if (direct) {
                tcp_body_crc(c, c->rgot, dst, (size_t)n);
                c->rgot += (size_t)n;
                if (c->rgot == c->rlen && tcp_frame_end(lp, c, c->rbody) != 0)
                    return;
                continue;
            }
            c->spos = 0;
            c->slen = (size_t)n;
        }
        size_t avail = c->slen - c->spos;
        const uint8_t *p = c->stage + c->spos;
        if (c->rstate == TCP_RD_HDR) {
            size_t take = TCP_HDR_LEN - c->rhdr_got;
            take = take < avail ? take : avail;
            memcpy(c->rhdr + c->rhdr_got, p, take);
            c->rhdr_got += take;
            c->spos += take;
            if (c->rhdr_got < TCP_HDR_LEN)
                continue;
            if (tcp_frame_begin(lp, c) != 0)
                return;
            if (c->slen - c->spos >= c->rlen &&
                (c->rlen == 0 || ((uintptr_t)(c->stage + c->spos) & 15) == 0)) {
                /* The whole body is staged, aligned for the reducing
                 * receives that read it as elements: hand it over from
                 * there. Otherwise it is copied to the (aligned) body. An
                 * empty body is always handed over from here: the body
                 * buffer may not exist yet. */
                const uint8_t *b = c->stage + c->spos;
                tcp_body_crc(c, 0, b, c->rlen);
                c->spos += c->rlen;
                if (tcp_frame_end(lp, c, b) != 0)
                    return;
                continue;
            }
            if (tcp_body_room(lp, c) != 0)
                return;
            c->rstate = TCP_RD_BODY;
            continue;
        }
        size_t take = c->rlen - c->rgot;
        take = take < avail ? take : avail;
        memcpy(c->rbody + c->rgot, p, take);
        tcp_body_crc(c, c->rgot, p, take);
        c->rgot += take;
        c->spos += take;
        if (c->rgot == c->rlen && tcp_frame_end(lp, c, c->rbody) != 0)
            return;
    }
}
