/* tcp: connection state under the loop's lock: connect with retry and
 * backoff, a connection coming up, a connection killed for good. */

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "tcp_int.h"

void tcp_nodelay(int fd)
{
    int one = 1;
    /* Frames are written whole; Nagle would only delay small ones. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void tcp_sockaddr_txt(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap)
{
    char host[INET6_ADDRSTRLEN + 1], port[8];
    if (getnameinfo(sa, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(buf, cap, "(unknown address)");
        return;
    }
    if (sa->sa_family == AF_INET6)
        snprintf(buf, cap, "[%s]:%s", host, port);
    else
        snprintf(buf, cap, "%s:%s", host, port);
}

const char *tcp_errstr(int err)
{
    if (err == -1)
        return "the peer closed the connection during the handshake";
    return err ? strerror(err) : "no error";
}

/* ---- connection state (lp->lock held) ---- */

/* Marks c broken for good and closes its queue (the first reason stands);
 * the loop closes the socket. */
void tcp_kill_locked(tcp_conn *c, dsim_err code, tcp_after *a, const char *fmt, ...)
{
    int st = tcp_state(c);
    if (st == TCP_DEAD)
        return;
    tcp_loop *lp = c->lp;
    tcp_fabric *tf = lp->tf;
    tcp_set_state(c, TCP_DEAD);
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dsim_waitq_lock(c->sq);
    tcp_sq_close_locked(c, code, msg, a);
    dsim_waitq_unlock(c->sq);
    int closing = 0;
    if (c->kind == TCP_IN && c->peer >= 0) {
        tcp_local *lc = tcp_local_of(tf, c->local);
        closing = lc->close_req;
        if (st == TCP_UP) {
            if (lc->in[c->peer] == c)
                lc->in[c->peer] = NULL;
            lc->lost[c->peer] = 1;
            c->notify = !closing && !atomic_load(&lp->stop);
        }
    } else if (c->kind == TCP_OUT) {
        closing = tcp_local_of(tf, c->local)->close_req;
    }
    /* dead_msg is final once sq_dead is set, and sq_dead never clears. */
    if (closing || atomic_load(&lp->stop))
        dsim_debug("tcp: %s", c->dead_msg);
    else
        dsim_info("tcp: %s", c->dead_msg);
    atomic_store(&lp->dirty, 1);
    a->wake = 1;
}
void tcp_up_locked(tcp_loop *lp, tcp_conn *c, tcp_after *a)
{
    tcp_fabric *tf = lp->tf;
    c->scap = c->kind == TCP_IN ? TCP_STAGE_IN : TCP_STAGE_OUT;
    c->stage = malloc(c->scap);
    c->ep = dsim_tp_fabric_ep(tf->f, c->local);
    if (!c->stage || !c->ep) {
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "rank %d ran out of memory setting up its connection %s peer %d", c->local,
                        c->kind == TCP_IN ? "from" : "to", c->peer);
        return;
    }
    c->rstate = TCP_RD_HDR;
    c->rhdr_got = 0;
    c->spos = c->slen = 0;
    tcp_set_state(c, TCP_UP);
    if (c->kind == TCP_OUT) {
        tcp_local *lc = tcp_local_of(tf, c->local);
        int64_t took = tcp_now(tf) - c->t_start;
        if (took < 0)
            took = 0;
        lc->conn_n++;
        lc->conn_total_ns += took;
        if (lc->conn_n == 1 || took > lc->conn_max_ns) {
            lc->conn_max_ns = took;
            lc->conn_slowest = c->peer;
        }
    }
    dsim_debug("tcp: rank %d %s peer %d (%s) is up", c->local,
               c->kind == TCP_IN ? "accepted a connection from" : "connected to", c->peer,
               c->where);
    if (atomic_load_explicit(&tf->aborted, memory_order_acquire))
        tcp_tell_abort_locked(c, a);
    /* Sends queued while it came up; later ones see TCP_UP and write. */
    dsim_waitq_lock(c->sq);
    tcp_flush_locked(c, a);
    dsim_waitq_unlock(c->sq);
}
void tcp_close_fd_locked(tcp_conn *c)
{
    if (c->fd < 0)
        return;
    close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
}

void tcp_give_up_locked(tcp_conn *c, const char *last, tcp_after *a)
{
    tcp_kill_locked(c, DSIM_EPEER, a,
                    "could not connect rank %d to peer %d at %s within %lld ms (%d attempts; last "
                    "error: %s); is it running and listening there?",
                    c->local, c->peer, c->where, tcp_ms(c->lp->tf->connect_timeout), c->attempts,
                    last);
}

/* The attempt failed: another after the backoff, none from connect_timeout
 * on (the service gives up then). */
void tcp_retry_locked(tcp_loop *lp, tcp_conn *c, int err, int64_t now, tcp_after *a)
{
    tcp_fabric *tf = lp->tf;
    c->last_errno = err;
    tcp_set_state(c, TCP_IDLE);
    if (tcp_is_local(tf, c->peer) && atomic_load(&tcp_local_of(tf, c->peer)->gone)) {
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "rank %d has closed its endpoint; rank %d can send nothing more to it",
                        c->peer, c->local);
        return;
    }
    int64_t end = c->t_start + tf->connect_timeout;
    if (now >= end) {
        tcp_give_up_locked(c, tcp_errstr(err), a);
        return;
    }
    c->t_next = now + c->backoff < end ? now + c->backoff : end;
    c->backoff = c->backoff * 2 > TCP_BACKOFF_MAX ? TCP_BACKOFF_MAX : c->backoff * 2;
    atomic_store(&lp->dirty, 1);
}

/* The connect finished (or failed): send the hello. */
void tcp_connected_locked(tcp_loop *lp, tcp_conn *c, int64_t now, tcp_after *a)
{
    tcp_fabric *tf = lp->tf;
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
        err = errno;
    if (err == 0 && tf->secret.len) {
        /* The listener speaks first: its challenge, then our hello. */
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(lp->epfd, EPOLL_CTL_MOD, c->fd, &ev);
        c->hello_got = 0;
        c->hello_need = TCP_HELLO_LEN;
        c->auth_stage = 1;
        tcp_set_state(c, TCP_HELLO);
        return;
    }
    if (err == 0) {
        uint8_t h[TCP_HELLO_LEN];
        tcp_hello_put(h, TCP_MAGIC_HELLO, 0, c->local, c->peer, tf->nranks);
        ssize_t n = send(c->fd, h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == (ssize_t)sizeof h) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
            epoll_ctl(lp->epfd, EPOLL_CTL_MOD, c->fd, &ev);
            c->hello_got = 0;
            c->hello_need = TCP_HELLO_LEN;
            c->auth_stage = 0;
            tcp_set_state(c, TCP_HELLO);
            return;
        }
        err = n < 0 ? errno : EIO;
    }
    tcp_close_fd_locked(c);
    tcp_retry_locked(lp, c, err, now, a);
}

void tcp_connect_locked(tcp_loop *lp, tcp_conn *c, int64_t now, tcp_after *a)
{
    const tcp_addr *ad = &lp->tf->addrs[c->peer];
    /* connect_timeout counts from the first try, however late the loop
     * gets to it after the send that asked for the connection. */
    if (c->attempts++ == 0)
        c->t_start = now;
    int fd = socket(ad->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        tcp_retry_locked(lp, c, errno, now, a);
        return;
    }
    tcp_nodelay(fd);
    int rc = connect(fd, (const struct sockaddr *)&ad->ss, ad->len);
    if (rc != 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        tcp_retry_locked(lp, c, err, now, a);
        return;
    }
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(lp->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        int err = errno;
        close(fd);
        tcp_retry_locked(lp, c, err, now, a);
        return;
    }
    c->fd = fd;
    c->deadline = c->t_start + lp->tf->connect_timeout;
    tcp_set_state(c, TCP_CONNECTING);
    if (rc == 0)
        tcp_connected_locked(lp, c, now, a);
}
