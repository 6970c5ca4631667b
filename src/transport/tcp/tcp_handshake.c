/* tcp: the handshake of a new connection: the hello and its reply, and
 * the cluster secret's challenge and response (tcp_auth_step). */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "tcp_int.h"

static const char *const tcp_refusal_text[TCP_REFUSE_COUNT] = {
    "accepted",
    "it speaks another version of the tcp protocol",
    "it does not host the rank it was asked for",
    "its fabric has another number of ranks",
    "the connecting rank is out of range",
    "that rank has closed its endpoint",
    "that rank already has a live connection from this rank",
    "that rank's link from this rank already broke (a broken link is not reopened)",
    "it did not prove that it knows the cluster secret",
};

/* The MAC after the 24-byte message at m is that of (label, nonce, m). */
static int tcp_auth_ok(const tcp_fabric *tf, const char *label, const uint8_t *nonce,
                       const uint8_t *m)
{
    uint8_t mac[DSIM_AUTH_MAC];
    dsim_auth_mac(&tf->secret, label, nonce, m, TCP_HELLO_LEN, mac);
    return dsim_auth_equal(mac, m + TCP_HELLO_LEN, DSIM_AUTH_MAC);
}

/* The connecting side's view of the reply to its hello. */
static void tcp_ack_check(tcp_loop *lp, tcp_conn *c, tcp_after *a)
{
    tcp_fabric *tf = lp->tf;
    tcp_hello h;
    tcp_hello_get(c->hello, &h);
    if (h.magic != TCP_MAGIC_ACK || !h.crc_ok)
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "the process at %s did not answer rank %d's handshake as a dsim tcp "
                        "endpoint would; is peer %d listening there?",
                        c->where, c->local, c->peer);
    else if (h.version != DSIM_TP_VERSION || h.status == TCP_REFUSE_VERSION)
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "peer %d at %s speaks tcp protocol version %u; this build speaks %u",
                        c->peer, c->where, (unsigned)h.version, (unsigned)DSIM_TP_VERSION);
    else if (h.status != TCP_ACCEPTED)
        tcp_kill_locked(c, DSIM_EPEER, a, "peer %d at %s refused rank %d's connection: %s", c->peer,
                        c->where, c->local,
                        h.status < TCP_REFUSE_COUNT ? tcp_refusal_text[h.status]
                                                    : "for a reason this build does not know");
    else if (h.from != c->peer || h.to != c->local || h.nranks != tf->nranks)
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "the process at %s answered as rank %d of %d, not as rank %d of %d; "
                        "check the addresses",
                        c->where, (int)h.from, (int)h.nranks, c->peer, tf->nranks);
    else if (tf->secret.len && !tcp_auth_ok(tf, "dsim-tcp-ack", c->nonce, c->hello))
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "peer %d at %s accepted rank %d's connection without proof that it knows "
                        "the cluster secret; refusing to talk to it",
                        c->peer, c->where, c->local);
    else
        tcp_up_locked(lp, c, a);
}

/* The listening side's view of a connecting peer's hello. */
static void tcp_hello_check(tcp_loop *lp, tcp_conn *c, tcp_after *a)
{
    tcp_fabric *tf = lp->tf;
    tcp_hello h;
    tcp_hello_get(c->hello, &h);
    if (h.magic != TCP_MAGIC_HELLO || !h.crc_ok) {
        dsim_warn("tcp: rank %d refused a connection from %s: its first bytes are not a dsim tcp "
                  "handshake",
                  c->local, c->where);
        tcp_kill_locked(c, DSIM_EPEER, a, "rank %d refused a connection from %s (no handshake)",
                        c->local, c->where);
        return;
    }
    int st = TCP_ACCEPTED;
    tcp_local *lc = tcp_local_of(tf, c->local);
    if (tf->secret.len && (!(h.status & TCP_HELLO_AUTH) || c->hello_got < TCP_AUTH_HELLO ||
                           !tcp_auth_ok(tf, "dsim-tcp-hello", c->nonce, c->hello)))
        st = TCP_REFUSE_AUTH;
    else if (h.version != DSIM_TP_VERSION)
        st = TCP_REFUSE_VERSION;
    else if (h.to != c->local)
        st = TCP_REFUSE_RANK;
    else if (h.nranks != tf->nranks)
        st = TCP_REFUSE_NRANKS;
    else if (h.from < 0 || h.from >= tf->nranks)
        st = TCP_REFUSE_SOURCE;
    else if (lc->close_req)
        st = TCP_REFUSE_CLOSED;
    else if (lc->lost[h.from])
        st = TCP_REFUSE_LOST;
    else if (lc->in[h.from])
        st = TCP_REFUSE_DUP;
    uint8_t ack[TCP_AUTH_ACK] = {0};
    size_t ack_len = tf->secret.len ? TCP_AUTH_ACK : TCP_HELLO_LEN;
    tcp_hello_put(ack, TCP_MAGIC_ACK, (uint16_t)st, c->local, h.from, tf->nranks);
    if (tf->secret.len && st == TCP_ACCEPTED)
        dsim_auth_mac(&tf->secret, "dsim-tcp-ack", c->hello + TCP_HELLO_LEN + DSIM_AUTH_MAC, ack,
                      TCP_HELLO_LEN, ack + TCP_HELLO_LEN);
    ssize_t n = send(c->fd, ack, ack_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (st != TCP_ACCEPTED) {
        dsim_warn("tcp: rank %d refused a connection from %s claiming to be rank %d of %d "
                  "(asking for rank %d): %s",
                  c->local, c->where, (int)h.from, (int)h.nranks, (int)h.to, tcp_refusal_text[st]);
        tcp_kill_locked(c, DSIM_EPEER, a, "rank %d refused a connection from %s: %s", c->local,
                        c->where, tcp_refusal_text[st]);
        return;
    }
    if (n != (ssize_t)ack_len) {
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "rank %d could not answer the handshake of rank %d at %s: %s", c->local,
                        (int)h.from, c->where, n < 0 ? strerror(errno) : "short write");
        return;
    }
    c->peer = h.from;
    lc->in[h.from] = c;
    tcp_up_locked(lp, c, a);
}

/* The cluster secret's part of the handshake (dsim/spi/auth.h), between
 * reads of c->hello_need bytes:
 *   listener: on accept sends "DSTN" + nonce_s (24 bytes); reads the hello;
 *     one without the TCP_HELLO_AUTH flag is refused at once, else it reads
 *     the MAC and nonce_c that follow and tcp_hello_check judges them;
 *     its ACK carries HMAC("dsim-tcp-ack", nonce_c, ack).
 *   connector: waits for the challenge, then sends the hello with the flag,
 *     HMAC("dsim-tcp-hello", nonce_s, hello) and nonce_c; reads ACK + MAC.
 * A connector without the secret that meets a challenge, or a listener's
 * plain ACK where a challenge was due, fails with the reason.
 * Returns 1 when it handled this step (more to read, or c killed), 0 when
 * the usual checks take over. */
static int tcp_auth_step(tcp_loop *lp, tcp_conn *c, tcp_after *a)
{
    tcp_fabric *tf = lp->tf;
    uint32_t magic = tcp_get32(c->hello);
    if (c->kind == TCP_OUT && !tf->secret.len) {
        if (magic != TCP_MAGIC_CHAL)
            return 0;
        tcp_kill_locked(c, DSIM_EPEER, a,
                        "peer %d at %s demands the cluster secret and rank %d has none; give every "
                        "process of the job the same secret (%s, or the tcp option secret_file=)",
                        c->peer, c->where, c->local, DSIM_SECRET_ENV);
        return 1;
    }
    if (!tf->secret.len)
        return 0;
    if (c->kind == TCP_OUT && c->auth_stage == 1) {
        if (magic != TCP_MAGIC_CHAL) {
            tcp_kill_locked(c, DSIM_EPEER, a,
                            "peer %d at %s did not challenge rank %d for the cluster secret; does "
                            "it have the same secret (%s)?",
                            c->peer, c->where, c->local, DSIM_SECRET_ENV);
            return 1;
        }
        uint8_t m[TCP_AUTH_HELLO];
        tcp_hello_put(m, TCP_MAGIC_HELLO, TCP_HELLO_AUTH, c->local, c->peer, tf->nranks);
        dsim_auth_mac(&tf->secret, "dsim-tcp-hello", c->hello + 8, m, TCP_HELLO_LEN,
                      m + TCP_HELLO_LEN);
        if (dsim_auth_nonce(c->nonce) != DSIM_OK) {
            tcp_kill_locked(c, DSIM_EIO, a, "rank %d: %s", c->local, dsim_errmsg());
            return 1;
        }
        memcpy(m + TCP_HELLO_LEN + DSIM_AUTH_MAC, c->nonce, DSIM_AUTH_NONCE);
        ssize_t n = send(c->fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n != (ssize_t)sizeof m) {
            tcp_kill_locked(c, DSIM_EPEER, a,
                            "rank %d could not send its hello to peer %d at %s: %s", c->local,
                            c->peer, c->where, n < 0 ? strerror(errno) : "short write");
            return 1;
        }
        c->auth_stage = 2;
        c->hello_got = 0;
        c->hello_need = TCP_AUTH_ACK;
        return 1;
    }
    if (c->kind == TCP_IN && c->hello_need == TCP_HELLO_LEN && magic == TCP_MAGIC_HELLO &&
        (tcp_get16(c->hello + 6) & TCP_HELLO_AUTH)) {
        c->hello_need = TCP_AUTH_HELLO; /* the proof follows */
        return 1;
    }
    return 0;
}

void tcp_hello_read(tcp_loop *lp, tcp_conn *c)
{
    tcp_after a = {0};
again:
    while (c->hello_got < c->hello_need) {
        /* Exactly the hello: what follows it belongs to the frame reader. */
        ssize_t n = recv(c->fd, c->hello + c->hello_got, c->hello_need - c->hello_got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            int err = n < 0 ? errno : -1;
            dsim_waitq_lock(lp->lock);
            if (c->kind == TCP_OUT) {
                tcp_close_fd_locked(c);
                tcp_retry_locked(lp, c, err, tcp_now(lp->tf), &a);
            } else {
                dsim_debug("tcp: rank %d: a connection from %s closed during its handshake "
                           "(%zu of %d bytes)",
                           c->local, c->where, c->hello_got, (int)c->hello_need);
                tcp_kill_locked(c, DSIM_EPEER, &a,
                                "a connection from %s to rank %d closed during its handshake",
                                c->where, c->local);
            }
            dsim_waitq_unlock(lp->lock);
            tcp_after_run(lp, &a);
            return;
        }
        c->hello_got += (size_t)n;
    }
    dsim_waitq_lock(lp->lock);
    if (tcp_state(c) == TCP_HELLO && tcp_auth_step(lp, c, &a)) {
        dsim_waitq_unlock(lp->lock);
        tcp_after_run(lp, &a);
        if (tcp_state(c) == TCP_HELLO)
            goto again;
        return;
    }
    if (tcp_state(c) == TCP_HELLO) {
        if (c->kind == TCP_OUT)
            tcp_ack_check(lp, c, &a);
        else
            tcp_hello_check(lp, c, &a);
    }
    dsim_waitq_unlock(lp->lock);
    tcp_after_run(lp, &a);
}
