/* tcp: the I/O threads: each runs an epoll loop over its ranks' listeners
 * and connections, accepts, dispatches events, connects and times out,
 * and reaps dead connections. */

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "dsim/spi/rt.h"
#include "tcp_int.h"

/* ---- the I/O loop ---- */

void tcp_conn_free(tcp_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    while (c->qhead) {
        tcp_item *it = c->qhead;
        tcp_q_del(c, it);
        if (!it->req)
            free(it);
    }
    free(c->stage);
    free(c->rbody);
    if (c->sq)
        dsim_waitq_destroy(c->sq);
    free(c);
}

void tcp_list_add(tcp_loop *lp, tcp_conn *c)
{
    c->link.prev = lp->conns.prev;
    c->link.next = &lp->conns;
    lp->conns.prev->next = &c->link;
    lp->conns.prev = &c->link;
    c->listed = 1;
}

static void tcp_list_del(tcp_conn *c)
{
    c->link.prev->next = c->link.next;
    c->link.next->prev = c->link.prev;
    c->link.next = c->link.prev = &c->link;
    c->listed = 0;
}

static void tcp_accept(tcp_loop *lp, tcp_local *lc)
{
    tcp_fabric *tf = lp->tf;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lc->lsn_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* Out of descriptors or memory: the listener would stay ready
             * and spin the loop, so rest it a while. */
            dsim_warn("tcp: rank %d could not accept a connection: %s; retrying in %lld ms",
                      lc->rank, strerror(errno), tcp_ms(TCP_LISTEN_PAUSE));
            dsim_waitq_lock(lp->lock);
            epoll_ctl(lp->epfd, EPOLL_CTL_DEL, lc->lsn_fd, NULL);
            lc->lsn_paused = 1;
            lc->lsn_resume = tcp_now(tf) + TCP_LISTEN_PAUSE;
            atomic_store(&lp->dirty, 1);
            dsim_waitq_unlock(lp->lock);
            return;
        }
        tcp_conn *c = calloc(1, sizeof *c);
        if (!c) {
            dsim_error_log("tcp: rank %d: out of memory accepting a connection", lc->rank);
            close(fd);
            continue;
        }
        c->type = TCP_POLL_CONN;
        c->lp = lp;
        c->kind = TCP_IN;
        c->local = lc->rank;
        c->peer = -1;
        c->fd = fd;
        atomic_init(&c->state, TCP_HELLO);
        atomic_init(&c->broken, 0);
        tcp_sockaddr_txt((struct sockaddr *)&ss, sl, c->where, sizeof c->where);
        tcp_nodelay(fd);
        if (dsim_waitq_create(tf->rt, &c->sq) != DSIM_OK) {
            dsim_error_log("tcp: rank %d: could not accept a connection: %s", lc->rank,
                           dsim_errmsg());
            tcp_conn_free(c);
            continue;
        }
        c->hello_need = TCP_HELLO_LEN;
        if (tf->secret.len) {
            uint8_t ch[TCP_HELLO_LEN] = {0};
            tcp_put32(ch, TCP_MAGIC_CHAL);
            tcp_put16(ch + 4, DSIM_TP_VERSION);
            ssize_t n = -1;
            if (dsim_auth_nonce(c->nonce) == DSIM_OK) {
                memcpy(ch + 8, c->nonce, DSIM_AUTH_NONCE);
                n = send(fd, ch, sizeof ch, MSG_NOSIGNAL | MSG_DONTWAIT);
            }
            if (n != (ssize_t)sizeof ch) {
                dsim_warn("tcp: rank %d could not challenge a connection from %s", lc->rank,
                          c->where);
                tcp_conn_free(c);
                continue;
            }
        }
        dsim_waitq_lock(lp->lock);
        c->deadline = tcp_now(tf) + tf->connect_timeout;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (lc->close_req || epoll_ctl(lp->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            dsim_waitq_unlock(lp->lock);
            tcp_conn_free(c);
            continue;
        }
        tcp_list_add(lp, c);
        atomic_store(&lp->dirty, 1);
        dsim_waitq_unlock(lp->lock);
    }
}

static void tcp_conn_event(tcp_loop *lp, tcp_conn *c, uint32_t events)
{
    tcp_after a = {0};
    /* Only this thread moves a connection out of IDLE, CONNECTING or HELLO;
     * another may only kill it, which the handlers below cope with. */
    int st = tcp_state(c);
    if (st == TCP_DEAD || st == TCP_IDLE || c->fd < 0)
        return;
    if (st == TCP_CONNECTING) {
        dsim_waitq_lock(lp->lock);
        if (tcp_state(c) == TCP_CONNECTING)
            tcp_connected_locked(lp, c, tcp_now(lp->tf), &a);
        dsim_waitq_unlock(lp->lock);
        tcp_after_run(lp, &a);
        return;
    }
    if ((events & EPOLLOUT) && st == TCP_UP) {
        dsim_waitq_lock(c->sq);
        tcp_flush_locked(c, &a);
        dsim_waitq_unlock(c->sq);
        tcp_after_run(lp, &a);
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    if (st == TCP_HELLO)
        tcp_hello_read(lp, c);
    else if (st == TCP_UP)
        tcp_read(lp, c);
}
static int64_t tcp_min(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* Connects, times out, closes and reaps; handles endpoint closes. Returns 1
 * when the loop must stop. */
static int tcp_service(tcp_loop *lp)
{
    tcp_fabric *tf = lp->tf;
    tcp_after a = {0};
    tcp_conn *grave = NULL;
    if (atomic_load(&lp->stop))
        return 1;
    int64_t now = tcp_now(tf);
    if (!atomic_exchange(&lp->dirty, 0) && now < lp->next_timer)
        return 0;
    dsim_waitq_lock(lp->lock);
    int64_t next = INT64_MAX;
    int closed_any = 0;
    for (int r = tf->lo; r <= tf->hi; r++) {
        tcp_local *lc = tcp_local_of(tf, r);
        if (lc->lp != lp)
            continue;
        if (lc->close_req && !lc->closed) {
            if (lc->lsn_fd >= 0)
                close(lc->lsn_fd);
            lc->lsn_fd = -1;
            for (tcp_link *l = lp->conns.next; l != &lp->conns; l = l->next) {
                tcp_conn *c = TCP_OF(l, tcp_conn, link);
                if (c->local == r)
                    tcp_kill_locked(c, DSIM_EPEER, &a, "rank %d has closed its endpoint", r);
            }
            lc->closed = 1;
            closed_any = 1;
        } else if (lc->lsn_paused && lc->lsn_fd >= 0) {
            if (now >= lc->lsn_resume) {
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = lc};
                epoll_ctl(lp->epfd, EPOLL_CTL_ADD, lc->lsn_fd, &ev);
                lc->lsn_paused = 0;
            } else {
                next = tcp_min(next, lc->lsn_resume);
            }
        }
    }
    for (tcp_link *l = lp->conns.next, *ln; l != &lp->conns; l = ln) {
        ln = l->next;
        tcp_conn *c = TCP_OF(l, tcp_conn, link);
        if (atomic_load(&c->broken)) /* dead_msg is set before broken */
            tcp_kill_locked(c, c->dead_code, &a, "%s", c->dead_msg);
        int st = tcp_state(c);
        if (st == TCP_IDLE && c->attempts && now >= c->t_start + tf->connect_timeout)
            tcp_give_up_locked(c, tcp_errstr(c->last_errno), &a);
        else if (st == TCP_IDLE && c->t_next <= now)
            tcp_connect_locked(lp, c, now, &a);
        st = tcp_state(c);
        if (st == TCP_IDLE) {
            next = tcp_min(next, c->t_next);
        } else if (st == TCP_CONNECTING || st == TCP_HELLO) {
            if (now < c->deadline) {
                next = tcp_min(next, c->deadline);
            } else if (c->kind == TCP_OUT && st == TCP_CONNECTING) {
                tcp_give_up_locked(c, "the connect did not finish", &a);
            } else if (c->kind == TCP_OUT) {
                tcp_kill_locked(c, DSIM_EPEER, &a,
                                "peer %d at %s took rank %d's connection but sent no reply to the "
                                "handshake within %lld ms; is a dsim tcp endpoint listening "
                                "there?",
                                c->peer, c->where, c->local, tcp_ms(tf->connect_timeout));
            } else {
                dsim_warn("tcp: rank %d dropped a connection from %s that sent no handshake "
                          "within %lld ms",
                          c->local, c->where, tcp_ms(tf->connect_timeout));
                tcp_kill_locked(c, DSIM_EPEER, &a, "no handshake from %s within %lld ms", c->where,
                                tcp_ms(tf->connect_timeout));
            }
        }
        if (tcp_state(c) == TCP_DEAD) {
            tcp_close_fd_locked(c);
            tcp_list_del(c);
            free(c->stage);
            c->stage = NULL;
            free(c->rbody);
            c->rbody = NULL;
            c->rbody_cap = 0;
            if (c->kind == TCP_IN) {
                c->gnext = grave;
                grave = c;
            }
            /* An outgoing connection stays in its rank's table: later sends
             * to that peer fail with its message. */
        }
    }
    lp->next_timer = next;
    if (closed_any)
        dsim_waitq_wake(lp->lock);
    dsim_waitq_unlock(lp->lock);
    tcp_after_run(lp, &a);
    while (grave) {
        tcp_conn *c = grave;
        grave = c->gnext;
        if (c->notify)
            dsim_tp_peer_lost(c->ep, c->peer, c->dead_code, "%s", c->dead_msg);
        tcp_conn_free(c);
    }
    return 0;
}

static int tcp_wait_ms(tcp_loop *lp)
{
    if (atomic_load(&lp->dirty))
        return 0;
    if (lp->next_timer == INT64_MAX)
        return -1;
    int64_t d = lp->next_timer - tcp_now(lp->tf);
    if (d <= 0)
        return 0;
    d = (d + TCP_MS - 1) / TCP_MS;
    return d > 60000 ? 60000 : (int)d;
}
void *tcp_loop_main(void *arg)
{
    tcp_loop *lp = arg;
    struct epoll_event evs[TCP_EVENTS];
    unsigned placed = ~0u;
    for (;;) {
        dsim_rt_follow_workers(&placed);
        int n = epoll_wait(lp->epfd, evs, TCP_EVENTS, tcp_wait_ms(lp));
        if (n < 0) {
            if (errno != EINTR)
                dsim_error_log("tcp: epoll_wait failed: %s", strerror(errno));
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (!p) {
                uint64_t v;
                while (read(lp->evfd, &v, sizeof v) < 0 && errno == EINTR)
                    ;
            } else if (*(int *)p == TCP_POLL_LSN) {
                tcp_accept(lp, p);
            } else {
                tcp_conn_event(lp, p, evs[i].events);
            }
        }
        if (tcp_service(lp))
            return NULL;
    }
}
