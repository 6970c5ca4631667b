/* tcp: the send queues and writing them (c->sq held), and the frames the
 * backend writes of its own (control frames). */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>

#include "tcp_int.h"

/* ---- send queues (c->sq held) ---- */

static void tcp_q_link(tcp_conn *c, tcp_item *prev, tcp_item *it)
{
    it->prev = prev;
    it->next = prev ? prev->next : c->qhead;
    if (it->next)
        it->next->prev = it;
    else
        c->qtail = it;
    if (prev)
        prev->next = it;
    else
        c->qhead = it;
    it->conn = c;
    it->queued = 1;
}

void tcp_q_push(tcp_conn *c, tcp_item *it)
{
    tcp_q_link(c, c->qtail, it);
}

/* At the front, but behind a frame already partly written. */
static void tcp_q_push_urgent(tcp_conn *c, tcp_item *it)
{
    tcp_item *h = c->qhead;
    tcp_q_link(c, h && h->head_done ? h : NULL, it);
}

void tcp_q_del(tcp_conn *c, tcp_item *it)
{
    if (it->prev)
        it->prev->next = it->next;
    else
        c->qhead = it->next;
    if (it->next)
        it->next->prev = it->prev;
    else
        c->qtail = it->prev;
    it->next = it->prev = NULL;
    it->queued = 0;
}

void tcp_q_replace(tcp_conn *c, tcp_item *old, tcp_item *it)
{
    tcp_item *prev = old->prev;
    tcp_q_del(c, old);
    tcp_q_link(c, prev, it);
}

static void tcp_after_add(tcp_after *a, tcp_item *it)
{
    it->dnext = NULL;
    if (a->tail)
        a->tail->dnext = it;
    else
        a->head = it;
    a->tail = it;
}

static int tcp_on_loop(const tcp_loop *lp)
{
    return lp->started && pthread_equal(pthread_self(), lp->thr);
}

/* Completes the requests collected in a (lp->lock not held). */
void tcp_after_run(tcp_loop *lp, tcp_after *a)
{
    if (a->wake && !tcp_on_loop(lp))
        tcp_wake(lp);
    for (tcp_item *it = a->head, *next; it; it = next) {
        next = it->dnext;
        dsim_req *req = it->req;
        dsim_err st = it->status;
        if (st != DSIM_OK)
            DSIM_ERR(st, it->conn->peer, "%s", it->conn->dead_msg);
        dsim_tp_complete(req, st); /* it may be freed from here on */
    }
    a->head = a->tail = NULL;
    a->wake = 0;
}

/* A backend-owned frame: a 48-byte header and a copy of body. */
tcp_item *tcp_item_own(const uint8_t *head, size_t head_len, const void *body, size_t len)
{
    tcp_item *it = calloc(1, sizeof *it + len);
    if (!it)
        return NULL;
    memcpy(it->head, head, head_len);
    it->head_len = head_len;
    it->body = (const uint8_t *)(it + 1);
    it->body_len = len;
    if (len)
        memcpy(it + 1, body, len);
    return it;
}

tcp_item *tcp_ctl_item(const tcp_conn *c, uint32_t what, const void *body, size_t len)
{
    dsim_tp_hdr h = {.magic = TCP_MAGIC_CTL,
                     .version = DSIM_TP_VERSION,
                     .flags = DSIM_TP_F_CHECKSUM,
                     .src = c->local,
                     .dst = c->peer,
                     .tag = what,
                     .len = len};
    uint8_t head[TCP_HDR_LEN];
    tcp_hdr_put(head, &h);
    tcp_put32(head + 28, tcp_crc32c(tcp_hdr_crc(head), body, len));
    return tcp_item_own(head, sizeof head, body, len);
}

/* ---- the send side (c->sq held) ---- */

void tcp_want_out_locked(tcp_conn *c, int on)
{
    if (c->want_out == on || c->fd < 0)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(c->lp->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->want_out = on;
}

/* Closes c's queue for good (the first reason stands): queued requests fail
 * with code once the locks are dropped, the backend's own frames are freed,
 * and later sends fail with the same message. */
void tcp_sq_close_locked(tcp_conn *c, dsim_err code, const char *msg, tcp_after *a)
{
    if (c->sq_dead)
        return;
    c->sq_dead = 1;
    c->dead_code = code;
    snprintf(c->dead_msg, sizeof c->dead_msg, "%s", msg);
    while (c->qhead) {
        tcp_item *it = c->qhead;
        tcp_q_del(c, it);
        if (it->req) {
            it->status = code;
            tcp_after_add(a, it);
        } else {
            free(it);
        }
    }
}

/* A write failed (c->sq held): the queue closes now, the loop does the rest
 * (its lock cannot be taken from here). */
static void tcp_write_failed_locked(tcp_conn *c, int err, tcp_after *a)
{
    char msg[400];
    if (c->kind == TCP_OUT)
        snprintf(msg, sizeof msg,
                 "connection to peer %d %s while rank %d was sending to it (%s); rank %d can send "
                 "nothing more to peer %d",
                 c->peer, err == EPIPE || err == ECONNRESET ? "reset" : "failed", c->local,
                 strerror(err), c->local, c->peer);
    else
        snprintf(msg, sizeof msg,
                 "connection to peer %d reset (rank %d could not write to it: %s); rank %d can "
                 "receive nothing more from it",
                 c->peer, c->local, strerror(err), c->local);
    tcp_sq_close_locked(c, DSIM_EPEER, msg, a);
    atomic_store(&c->broken, 1);
    atomic_store(&c->lp->dirty, 1);
    a->wake = 1;
}

/* Writes queued frames until the queue is empty or the socket is full. */
void tcp_flush_locked(tcp_conn *c, tcp_after *a)
{
    while (!c->sq_dead && tcp_state(c) == TCP_UP && c->qhead) {
        struct iovec iov[TCP_IOV];
        int n = 0;
        size_t want = 0;
        for (tcp_item *it = c->qhead; it && n + 2 <= TCP_IOV; it = it->next) {
            if (it->head_done < it->head_len) {
                iov[n].iov_base = it->head + it->head_done;
                iov[n].iov_len = it->head_len - it->head_done;
                want += iov[n++].iov_len;
            }
            if (it->body_done < it->body_len) {
                iov[n].iov_base = (void *)(it->body + it->body_done);
                iov[n].iov_len = it->body_len - it->body_done;
                want += iov[n++].iov_len;
            }
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                tcp_want_out_locked(c, 1);
                return;
            }
            tcp_write_failed_locked(c, errno, a);
            return;
        }
        size_t left = (size_t)w;
        while (c->qhead) {
            tcp_item *it = c->qhead;
            size_t h = it->head_len - it->head_done;
            size_t take = left < h ? left : h;
            it->head_done += take;
            left -= take;
            size_t b = it->body_len - it->body_done;
            take = left < b ? left : b;
            it->body_done += take;
            left -= take;
            if (it->head_done < it->head_len || it->body_done < it->body_len)
                break;
            tcp_q_del(c, it);
            if (it->req) {
                it->status = DSIM_OK;
                tcp_after_add(a, it);
            } else {
                free(it);
            }
        }
        if ((size_t)w < want) {
            tcp_want_out_locked(c, 1);
            return;
        }
    }
    if (!c->qhead && !c->sq_dead)
        tcp_want_out_locked(c, 0);
}

/* lp->lock held; takes c->sq. */
void tcp_tell_abort_locked(tcp_conn *c, tcp_after *a)
{
    tcp_fabric *tf = c->lp->tf;
    if (c->abort_told || tcp_state(c) != TCP_UP || tcp_is_local(tf, c->peer))
        return;
    c->abort_told = 1;
    uint8_t body[4 + TCP_WHY_MAX];
    size_t wl = strlen(tf->abort_why);
    tcp_put32(body, (uint32_t)tf->abort_peer);
    memcpy(body + 4, tf->abort_why, wl);
    tcp_item *it = tcp_ctl_item(c, TCP_CTL_ABORT, body, 4 + wl);
    if (!it) {
        dsim_error_log("tcp: rank %d: out of memory telling peer %d about the abort", c->local,
                       c->peer);
        return;
    }
    dsim_waitq_lock(c->sq);
    if (c->sq_dead) {
        free(it);
    } else {
        tcp_q_push_urgent(c, it);
        tcp_flush_locked(c, a);
    }
    dsim_waitq_unlock(c->sq);
}
