/* tcp: the ranks of a job connected by TCP sockets, within one process
 * (every rank local, over 127.0.0.1) or across processes and machines.
 * Linux (epoll, eventfd); it needs a wall-clock engine (threads, processes).
 *
 * Options ("key=value,key=value"):
 *   addrs=HOST:PORT;HOST:PORT;...  one address per rank, in rank order,
 *                      separated by ';'. HOST is an IPv4 address, an IPv6
 *                      address in brackets ([::1]:5000) or a name, resolved
 *                      once when the fabric opens. PORT is 1-65535, or 0 for
 *                      a rank this process hosts (any free port).
 *   addrs_file=PATH    the same list in a file, one HOST:PORT per line in
 *                      rank order; '#' starts a comment, blank lines are
 *                      skipped. For lists too long for an options string.
 *   local=A-B | A      the ranks this process hosts (default: all). Their
 *                      endpoints listen on their addresses; every other rank
 *                      is remote and must have an address.
 *   connect_timeout=T  how long a rank keeps trying to reach a peer, and how
 *                      long a connecting peer has to send its handshake:
 *                      30s by default; T is a number with ms, s or m (a bare
 *                      number is seconds).
 *   io_threads=N       I/O threads (default 1, at most 64); the local ranks
 *                      are dealt to them round robin.
 *   max_frame=BYTES    the largest message (default 1g; k/m/g suffixes); a
 *                      frame that claims more is corrupt, a larger send fails.
 *   listen_fds=FD;FD   sockets already bound and listening, one per local
 *                      rank in rank order, to use instead of binding (a
 *                      parent that forks the processes of a job binds every
 *                      rank's port first, so no port is ever raced for);
 *                      their addresses in addrs= are the bound ones.
 *   secret_file=PATH   the cluster secret (dsim/spi/auth.h); without it the
 *                      environment variable DSIM_CLUSTER_SECRET, when set.
 *                      With a secret every connection starts with an
 *                      HMAC-SHA256 challenge and response (see
 *                      tcp_auth_step): a peer without it is refused and
 *                      logged before it can send a frame.
 * Without addrs every rank is local and listens on 127.0.0.1, any free port.
 *
 * Connections. One per ordered pair (src, dst), opened by src at its first
 * send to dst (lazily: a job connects only the pairs its algorithms use, and
 * peers may start in any order) and carrying src's frames to dst in send
 * order; dst writes back only its handshake reply and control frames. A
 * connect that fails is retried with exponential backoff (1 ms doubling to
 * 128 ms) until connect_timeout has passed since the first try; the sends
 * queued meanwhile wait, and those whose wait runs out first are withdrawn.
 * The connecting side sends a 24-byte hello (magic "DSTH", version, from
 * rank, to rank, nranks, CRC32C of the rest) and waits for the same-sized
 * reply ("DSTA" with a status) before its first frame; a hello that is not
 * one, or names a rank the listener does not host, another job size, a rank
 * already connected or one whose link already broke, is refused (a reply
 * with the reason where possible) and logged.
 *
 * Wire. A frame is the 48-byte dsim_tp_hdr, each field little-endian in
 * declaration order, then (only with DSIM_TP_F_SIDE in its flags) the
 * 32-byte sideband, then len payload bytes; len counts the payload alone. The backend sets
 * DSIM_TP_F_CHECKSUM and puts in hdr.checksum the CRC32C (Castagnoli,
 * reflected 0x82F63B78, as iSCSI and ext4 use; SSE4.2 where the CPU has it)
 * of the 48 header bytes with the checksum field zero followed by the
 * sideband (if any) and the payload, so a damaged header is caught as well
 * as a damaged payload. A data frame with another flag than those two is
 * refused as corrupt ("unknown flags"), as is a sideband on any other frame:
 * peers of protocol version 1, which had no sideband, are refused at the
 * hello.
 * Besides data frames ("DSTP") there are control frames ("DSTC": an abort
 * notice, or the header of a withdrawn frame) and wrapped frames ("DSTX": a
 * hand-made header from dsim_tp_inject that does not describe its own
 * payload, carried as-is so that the receive path judges it as on any
 * backend). A frame with a bad magic, version, checksum flag or checksum, or
 * longer than max_frame, is never handed over: it is counted in
 * rejected_corrupt and the connection is closed, since a byte stream cannot
 * be resynchronised; receives from that peer fail with DSIM_EPROTO
 * ("corrupt frame (checksum mismatch) from peer 3 ...").
 *
 * Failures. EOF or a reset on a connection fails the receives posted from
 * that peer and every later one that finds nothing queued with DSIM_EPEER
 * ("peer 3 closed the connection", "connection to peer 3 reset"); queued and
 * later sends to a peer whose connection broke fail with DSIM_EPEER at once.
 * Writes use MSG_NOSIGNAL: never SIGPIPE.
 *
 * The rule for a send that fails after dsim_isend took its sequence number:
 * a frame withdrawn (deadline, cancel, close) before any of its bytes was
 * written is replaced by a control frame holding only its header, so the
 * receiver's sequence stays in step and nothing is delivered; a frame partly
 * written is finished from a copy of the rest and its send completes
 * DSIM_OK (its bytes cannot be taken back, and a half frame would break the
 * stream); a frame whose write fails breaks that connection for good: it,
 * every queued send and every later send to that peer fail with DSIM_EPEER,
 * and the receiver sees EOF or a reset and fails its receives from the
 * sender with DSIM_EPEER. A sequence gap is therefore never skipped silently
 * on a live connection.
 *
 * Abort. After a local revoke the backend sends an abort notice (failed rank
 * and reason) on every live connection to a rank of another process, and on
 * every connection that comes up afterwards; a fabric that receives one
 * revokes itself with the same failed rank and reason, and passes it on.
 *
 * Threads. Each I/O thread runs an epoll loop over its ranks' listeners and
 * connections plus an eventfd to wake it. It accepts, connects, reads and
 * checks frames and hands them over in order, and writes what the socket
 * could not take at once. ops->send encodes the frame and computes its
 * checksum in the caller's thread, queues it, and writes it straight away
 * when the connection is idle; it never waits for the network. Locks are
 * runtime wait queues: each connection's sq guards its send queue and is
 * held across its (non-blocking) writes, so ranks send in parallel; each
 * loop's lock guards connection state, tables and lists and is taken before
 * an sq, never after. Reading, handing over and completing requests happen
 * with neither held. Only the loop closes sockets, after closing the queue. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dsim/log.h"
#include "dsim/spi/auth.h"
#include "dsim/spi/rt.h"
#include "dsim/spi/transport.h"

#define TCP_HDR_LEN       48
#define TCP_HELLO_LEN     24
#define TCP_MAGIC_RAW     0x58545344u /* "DSTX" */
#define TCP_MAGIC_CTL     0x43545344u /* "DSTC" */
#define TCP_MAGIC_HELLO   0x48545344u /* "DSTH" */
#define TCP_MAGIC_ACK     0x41545344u /* "DSTA" */
#define TCP_MAGIC_CHAL    0x4e545344u /* "DSTN": a listener's challenge */
#define TCP_HELLO_AUTH    1u          /* hello status: a proof of the secret follows */
#define TCP_AUTH_HELLO    (TCP_HELLO_LEN + DSIM_AUTH_MAC + DSIM_AUTH_NONCE)
#define TCP_AUTH_ACK      (TCP_HELLO_LEN + DSIM_AUTH_MAC)
#define TCP_CTL_ABORT     1u /* body: failed rank (i32), reason */
#define TCP_CTL_WITHDRAWN 2u /* body: the 48 header bytes of a withdrawn frame */
#define TCP_CTL_MAX       4096u
#define TCP_WHY_MAX       255
#define TCP_STAGE_IN      ((size_t)64 << 10)
#define TCP_STAGE_OUT     ((size_t)512)
#define TCP_READ_BUDGET   ((size_t)4 << 20)
#define TCP_IOV           64
#define TCP_EVENTS        64
#define TCP_MS            1000000LL
#define TCP_BACKOFF_MIN   (1 * TCP_MS)
#define TCP_BACKOFF_MAX   (128 * TCP_MS)
#define TCP_TIMEOUT_DEF   (30000 * TCP_MS)
#define TCP_MAX_FRAME_DEF ((size_t)1 << 30)
#define TCP_MAX_LOOPS     64
#define TCP_ADDR_TXT      96
#define TCP_LISTEN_PAUSE  (100 * TCP_MS)

#define TCP_SIDE_LEN DSIM_TP_SIDE_LEN
/* The flags a data frame may carry on the wire. */
#define TCP_DATA_FLAGS (DSIM_TP_F_CHECKSUM | DSIM_TP_F_SIDE | DSIM_TP_F_VIRTUAL)

_Static_assert(offsetof(dsim_tp_hdr, side) == TCP_HDR_LEN,
               "dsim_tp_hdr is 48 bytes on the wire, then the sideband");

enum { TCP_POLL_LSN = 1, TCP_POLL_CONN };
enum { TCP_OUT, TCP_IN };
enum { TCP_IDLE, TCP_CONNECTING, TCP_HELLO, TCP_UP, TCP_DEAD };
enum { TCP_RD_HDR, TCP_RD_BODY };
enum { TCP_K_DATA, TCP_K_RAW, TCP_K_CTL };

/* Handshake reply statuses. */
enum {
    TCP_ACCEPTED = 0,
    TCP_REFUSE_VERSION,
    TCP_REFUSE_RANK,
    TCP_REFUSE_NRANKS,
    TCP_REFUSE_SOURCE,
    TCP_REFUSE_CLOSED,
    TCP_REFUSE_DUP,
    TCP_REFUSE_LOST,
    TCP_REFUSE_AUTH,
    TCP_REFUSE_COUNT
};

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

typedef struct tcp_link {
    struct tcp_link *next, *prev;
} tcp_link;

#define TCP_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

struct tcp_conn;
struct tcp_loop;
struct tcp_fabric;

/* One frame to write. A send's item lives in its request's private area;
 * the backend's own frames (control frames, the rest of a frame cancelled
 * half-way) are allocated with their body after them. */
typedef struct tcp_item {
    struct tcp_item *next, *prev; /* in conn's queue, under its sq */
    struct tcp_item *dnext;       /* on a list of finished requests */
    struct tcp_conn *conn;
    dsim_req *req; /* NULL for the backend's own frames */
    dsim_err status;
    int queued;
    int faithful; /* a header dsim_isend built: a withdrawal leaves a marker */
    uint8_t head[2 * TCP_HDR_LEN + TCP_SIDE_LEN];
    size_t head_len, head_done;
    const uint8_t *body;
    size_t body_len, body_done;
} tcp_item;

typedef struct tcp_addr {
    struct sockaddr_storage ss;
    socklen_t len;
    char txt[TCP_ADDR_TXT];
} tcp_addr;

typedef struct tcp_conn {
    int type; /* TCP_POLL_CONN; first, for epoll dispatch */
    tcp_link link;
    struct tcp_loop *lp;
    struct tcp_conn *gnext; /* reaped, waiting to be freed */
    int kind, local, peer;  /* peer -1 until an incoming hello names it */
    int fd;
    atomic_int state;  /* changed under lp->lock */
    atomic_int broken; /* a write failed under sq: the loop kills it */
    /* The send side, under sq: the queue, the socket's write half, and why
     * the queue was closed (the first reason stands). */
    dsim_waitq *sq;
    tcp_item *qhead, *qtail;
    int want_out;
    int sq_dead;
    dsim_err dead_code;
    char dead_msg[400];
    /* Under lp->lock. */
    int listed;
    int notify; /* an incoming link that broke: tell the receive path */
    int abort_told;
    int64_t t_start, t_next, backoff, deadline;
    int attempts, last_errno;
    /* The loop thread only. */
    dsim_ep *ep;
    uint8_t hello[TCP_AUTH_HELLO];
    size_t hello_got, hello_need;
    int auth_stage;                 /* see tcp_auth_step */
    uint8_t nonce[DSIM_AUTH_NONCE]; /* the one this side sent */
    int rstate, rkind;
    uint8_t rhdr[TCP_HDR_LEN];
    size_t rhdr_got;
    dsim_tp_hdr rh;
    size_t rlen, rgot;
    uint32_t rcrc;
    uint8_t *rbody;
    size_t rbody_cap;
    uint8_t *stage;
    size_t scap, spos, slen;
    char where[TCP_ADDR_TXT];
} tcp_conn;

typedef struct tcp_local {
    int type; /* TCP_POLL_LSN; first, for epoll dispatch */
    int rank;
    int lsn_fd;
    struct tcp_loop *lp;
    /* Under lp->lock. */
    int lsn_paused;
    int64_t lsn_resume;
    _Atomic(tcp_conn *) *out; /* [nranks]: this rank's connection to each rank (set once) */
    tcp_conn **in;            /* [nranks]: the live connection from each rank */
    uint8_t *lost;            /* [nranks]: the link from that rank broke */
    int close_req, closed;
    atomic_int gone; /* its endpoint closed: sends to it fail at once */
    /* Under lp->lock: its outgoing connections that came up, how long they
     * took from the first attempt to the accepted hello (cold start). */
    int conn_n, conn_slowest;
    int64_t conn_total_ns, conn_max_ns;
} tcp_local;

typedef struct tcp_loop {
    struct tcp_fabric *tf;
    pthread_t thr;
    int started;
    int epfd, evfd;
    dsim_waitq *lock;
    tcp_link conns; /* under lock; the loop thread frees from it */
    atomic_int stop, dirty;
    int64_t next_timer; /* the loop thread only */
} tcp_loop;

typedef struct tcp_fabric {
    dsim_fabric *f;
    dsim_rt *rt;
    int nranks, lo, hi;
    int all_local;
    tcp_addr *addrs;
    int64_t connect_timeout;
    size_t max_frame;
    int nloops;
    tcp_loop *loops;
    tcp_local *locals;
    atomic_int aborted;
    int abort_peer;     /* written once, before aborted is set */
    dsim_secret secret; /* len 0: connections are not authenticated */
    char abort_why[TCP_WHY_MAX + 1];
} tcp_fabric;

/* Requests finished under a loop's lock, completed once it is dropped. */
typedef struct tcp_after {
    tcp_item *head, *tail;
    int wake;
} tcp_after;

/* CRC32C, as every backend computes it (dsim_tp_crc32c). */
#define tcp_crc32c dsim_tp_crc32c

static uint64_t tcp_load64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

/* ---- little-endian encoding ---- */

static void tcp_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void tcp_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void tcp_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t tcp_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t tcp_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void tcp_hdr_put(uint8_t *p, const dsim_tp_hdr *h)
{
    tcp_put32(p, h->magic);
    tcp_put16(p + 4, h->version);
    tcp_put16(p + 6, h->flags);
    tcp_put32(p + 8, (uint32_t)h->src);
    tcp_put32(p + 12, (uint32_t)h->dst);
    tcp_put32(p + 16, h->comm_id);
    tcp_put32(p + 20, h->epoch);
    tcp_put32(p + 24, h->tag);
    tcp_put32(p + 28, h->checksum);
    tcp_put64(p + 32, h->seq);
    tcp_put64(p + 40, h->len);
}

static void tcp_hdr_get(const uint8_t *p, dsim_tp_hdr *h)
{
    h->magic = tcp_get32(p);
    h->version = tcp_get16(p + 4);
    h->flags = tcp_get16(p + 6);
    h->src = (int32_t)tcp_get32(p + 8);
    h->dst = (int32_t)tcp_get32(p + 12);
    h->comm_id = tcp_get32(p + 16);
    h->epoch = tcp_get32(p + 20);
    h->tag = tcp_get32(p + 24);
    h->checksum = tcp_get32(p + 28);
    h->seq = tcp_load64(p + 32);
    h->len = tcp_load64(p + 40);
}

/* The checksum of a frame: its header with the checksum field zero, then
 * its body (for a wrapped frame, the inner header and the payload). */
static uint32_t tcp_hdr_crc(const uint8_t *hdr)
{
    uint8_t z[TCP_HDR_LEN];
    memcpy(z, hdr, sizeof z);
    memset(z + 28, 0, 4);
    return tcp_crc32c(0, z, sizeof z);
}

typedef struct tcp_hello {
    uint32_t magic;
    uint16_t version, status;
    int32_t from, to, nranks;
    int crc_ok;
} tcp_hello;

static void tcp_hello_put(uint8_t *p, uint32_t magic, uint16_t status, int from, int to, int nranks)
{
    tcp_put32(p, magic);
    tcp_put16(p + 4, DSIM_TP_VERSION);
    tcp_put16(p + 6, status);
    tcp_put32(p + 8, (uint32_t)from);
    tcp_put32(p + 12, (uint32_t)to);
    tcp_put32(p + 16, (uint32_t)nranks);
    tcp_put32(p + 20, tcp_crc32c(0, p, 20));
}

static void tcp_hello_get(const uint8_t *p, tcp_hello *h)
{
    h->magic = tcp_get32(p);
    h->version = tcp_get16(p + 4);
    h->status = tcp_get16(p + 6);
    h->from = (int32_t)tcp_get32(p + 8);
    h->to = (int32_t)tcp_get32(p + 12);
    h->nranks = (int32_t)tcp_get32(p + 16);
    h->crc_ok = tcp_get32(p + 20) == tcp_crc32c(0, p, 20);
}

/* ---- small helpers ---- */

static int64_t tcp_now(tcp_fabric *tf)
{
    return dsim_rt_now(tf->rt);
}

static int tcp_is_local(const tcp_fabric *tf, int rank)
{
    return rank >= tf->lo && rank <= tf->hi;
}

static tcp_local *tcp_local_of(tcp_fabric *tf, int rank)
{
    return &tf->locals[rank - tf->lo];
}

static long long tcp_ms(int64_t ns)
{
    return (long long)(ns / TCP_MS);
}

static int tcp_state(tcp_conn *c)
{
    return atomic_load_explicit(&c->state, memory_order_acquire);
}

static void tcp_set_state(tcp_conn *c, int st)
{
    atomic_store_explicit(&c->state, st, memory_order_release);
}

static void tcp_wake(tcp_loop *lp)
{
    uint64_t one = 1;
    /* A full counter (EAGAIN) already means "wake up". */
    while (write(lp->evfd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

static void tcp_nodelay(int fd)
{
    int one = 1;
    /* Frames are written whole; Nagle would only delay small ones. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void tcp_sockaddr_txt(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap)
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

static const char *tcp_errstr(int err)
{
    if (err == -1)
        return "the peer closed the connection during the handshake";
    return err ? strerror(err) : "no error";
}

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

static void tcp_q_push(tcp_conn *c, tcp_item *it)
{
    tcp_q_link(c, c->qtail, it);
}

/* At the front, but behind a frame already partly written. */
static void tcp_q_push_urgent(tcp_conn *c, tcp_item *it)
{
    tcp_item *h = c->qhead;
    tcp_q_link(c, h && h->head_done ? h : NULL, it);
}

static void tcp_q_del(tcp_conn *c, tcp_item *it)
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

static void tcp_q_replace(tcp_conn *c, tcp_item *old, tcp_item *it)
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
static void tcp_after_run(tcp_loop *lp, tcp_after *a)
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
static tcp_item *tcp_item_own(const uint8_t *head, size_t head_len, const void *body, size_t len)
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

static tcp_item *tcp_ctl_item(const tcp_conn *c, uint32_t what, const void *body, size_t len)
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

static void tcp_want_out_locked(tcp_conn *c, int on)
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
static void tcp_sq_close_locked(tcp_conn *c, dsim_err code, const char *msg, tcp_after *a)
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
static void tcp_flush_locked(tcp_conn *c, tcp_after *a)
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
static void tcp_tell_abort_locked(tcp_conn *c, tcp_after *a)
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

/* ---- connection state (lp->lock held) ---- */

/* Marks c broken for good and closes its queue (the first reason stands);
 * the loop closes the socket. */
static void tcp_kill_locked(tcp_conn *c, dsim_err code, tcp_after *a, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void tcp_kill_locked(tcp_conn *c, dsim_err code, tcp_after *a, const char *fmt, ...)
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
static void tcp_up_locked(tcp_loop *lp, tcp_conn *c, tcp_after *a)
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
static void tcp_close_fd_locked(tcp_conn *c)
{
    if (c->fd < 0)
        return;
    close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
}

static void tcp_give_up_locked(tcp_conn *c, const char *last, tcp_after *a)
{
    tcp_kill_locked(c, DSIM_EPEER, a,
                    "could not connect rank %d to peer %d at %s within %lld ms (%d attempts; last "
                    "error: %s); is it running and listening there?",
                    c->local, c->peer, c->where, tcp_ms(c->lp->tf->connect_timeout), c->attempts,
                    last);
}

/* The attempt failed: another after the backoff, none from connect_timeout
 * on (the service gives up then). */
static void tcp_retry_locked(tcp_loop *lp, tcp_conn *c, int err, int64_t now, tcp_after *a)
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
static void tcp_connected_locked(tcp_loop *lp, tcp_conn *c, int64_t now, tcp_after *a)
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

static void tcp_connect_locked(tcp_loop *lp, tcp_conn *c, int64_t now, tcp_after *a)
{
    const tcp_addr *ad = &lp->tf->addrs[c->peer];
    c->attempts++;
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
    c->rlen =
        (size_t)h->len + (c->rkind == TCP_K_DATA && (h->flags & DSIM_TP_F_SIDE) ? TCP_SIDE_LEN : 0);
    c->rgot = 0;
    return 0;
}

static int tcp_hand_over(tcp_loop *lp, tcp_conn *c, const dsim_tp_hdr *h, const uint8_t *body,
                         size_t len)
{
    /* A data frame's checksum (header and payload) was verified on
     * arrival; a wrapped frame's header is hand-made and is judged by the
     * receive path as it stands. */
    dsim_tp_hdr hv = *h;
    if (c->rkind != TCP_K_RAW)
        hv.flags |= DSIM_TP_F_VERIFIED;
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
static void tcp_read(tcp_loop *lp, tcp_conn *c)
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
                c->rcrc = tcp_crc32c(c->rcrc, dst, (size_t)n);
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
            if (c->slen - c->spos >= c->rlen && ((uintptr_t)(c->stage + c->spos) & 15) == 0) {
                /* The whole body is staged, aligned for the reducing
                 * receives that read it as elements: hand it over from
                 * there. Otherwise it is copied to the (aligned) body. */
                const uint8_t *b = c->stage + c->spos;
                c->rcrc = tcp_crc32c(c->rcrc, b, c->rlen);
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
        c->rcrc = tcp_crc32c(c->rcrc, p, take);
        c->rgot += take;
        c->spos += take;
        if (c->rgot == c->rlen && tcp_frame_end(lp, c, c->rbody) != 0)
            return;
    }
}

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

static void tcp_hello_read(tcp_loop *lp, tcp_conn *c)
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

/* ---- the I/O loop ---- */

static void tcp_conn_free(tcp_conn *c)
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

static void tcp_list_add(tcp_loop *lp, tcp_conn *c)
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
        if (st == TCP_IDLE && now >= c->t_start + tf->connect_timeout)
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
static void *tcp_loop_main(void *arg)
{
    tcp_loop *lp = arg;
    struct epoll_event evs[TCP_EVENTS];
    for (;;) {
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

/* ---- options ---- */

#define TCP_MAX_FDS 1024

typedef struct tcp_opts {
    char *addrs, *addrs_file, *secret_file;
    int fds[TCP_MAX_FDS];
    int n_fds;
    int have_local, lo, hi;
    int64_t connect_timeout;
    long io_threads;
    size_t max_frame;
} tcp_opts;

#define TCP_KNOWN                                                                                  \
    "addrs=HOST:PORT;..., addrs_file=PATH, local=A-B, connect_timeout=30s, io_threads=N, "         \
    "max_frame=BYTES, listen_fds=FD;FD;..., secret_file=PATH"

static dsim_err tcp_opt_duration(const char *key, const char *val, int64_t *out)
{
    char *end = NULL;
    if (*val < '0' || *val > '9')
        goto bad;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (errno == ERANGE || end == val)
        goto bad;
    int64_t unit;
    if (strcmp(end, "ms") == 0)
        unit = TCP_MS;
    else if (strcmp(end, "s") == 0 || *end == '\0')
        unit = 1000 * TCP_MS;
    else if (strcmp(end, "m") == 0)
        unit = 60000 * TCP_MS;
    else
        goto bad;
    if (v <= 0 || v > 86400000LL * TCP_MS / unit)
        goto bad;
    *out = (int64_t)v * unit;
    return DSIM_OK;
bad:
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "tcp option %s=%s: expected a duration from 1 ms to 1 day such as 30s, 500ms "
                    "or 2m (a bare number is seconds)",
                    key, val);
}

static int tcp_parse_rank(const char *s, const char **end, int *out)
{
    if (*s < '0' || *s > '9')
        return -1;
    long v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > INT32_MAX)
            return -1;
    }
    *out = (int)v;
    *end = s;
    return 0;
}

static dsim_err tcp_opt_local(tcp_fabric *tf, const char *val, tcp_opts *o)
{
    const char *p = val;
    int a, b;
    if (tcp_parse_rank(p, &p, &a) != 0)
        goto bad;
    b = a;
    if (*p == '-' && tcp_parse_rank(p + 1, &p, &b) != 0)
        goto bad;
    if (*p || a > b || b >= tf->nranks)
        goto bad;
    o->have_local = 1;
    o->lo = a;
    o->hi = b;
    return DSIM_OK;
bad:
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "tcp option local=%s: expected the ranks this process hosts, as a rank or a "
                    "range A-B with A <= B, within 0..%d",
                    val, tf->nranks - 1);
}

static dsim_err tcp_parse_opts(tcp_fabric *tf, const char *options, tcp_opts *o)
{
    memset(o, 0, sizeof *o);
    o->connect_timeout = TCP_TIMEOUT_DEF;
    o->io_threads = 1;
    o->max_frame = TCP_MAX_FRAME_DEF;
    if (!options)
        return DSIM_OK;
    size_t cap = strlen(options) + 1;
    char key[64];
    char *val = malloc(cap);
    if (!val)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading the tcp options");
    const char *cur = options;
    dsim_err e = DSIM_OK;
    int rc = 0;
    while (e == DSIM_OK && (rc = dsim_tp_opt_next("tcp", &cur, key, sizeof key, val, cap)) > 0) {
        if (strcmp(key, "addrs") == 0 || strcmp(key, "addrs_file") == 0) {
            char **slot = key[5] ? &o->addrs_file : &o->addrs;
            free(*slot);
            *slot = strdup(val);
            if (!*slot)
                e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading the tcp options");
        } else if (strcmp(key, "local") == 0) {
            e = tcp_opt_local(tf, val, o);
        } else if (strcmp(key, "secret_file") == 0) {
            free(o->secret_file);
            o->secret_file = strdup(val);
            if (!o->secret_file)
                e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory reading the tcp options");
        } else if (strcmp(key, "listen_fds") == 0) {
            o->n_fds = 0;
            for (const char *p = val; e == DSIM_OK && *p;) {
                int fd = -1;
                if (o->n_fds == TCP_MAX_FDS || tcp_parse_rank(p, &p, &fd) != 0 || (*p && *p != ';'))
                    e = DSIM_ERR(DSIM_EINVAL, -1,
                                 "tcp option listen_fds=%s: expected file descriptors separated "
                                 "by ';', one per local rank",
                                 val);
                else
                    o->fds[o->n_fds++] = fd;
                if (*p == ';')
                    p++;
            }
        } else if (strcmp(key, "connect_timeout") == 0) {
            e = tcp_opt_duration(key, val, &o->connect_timeout);
        } else if (strcmp(key, "io_threads") == 0) {
            char *end = NULL;
            o->io_threads = strtol(val, &end, 10);
            if (*val < '0' || *val > '9' || *end || o->io_threads < 1 ||
                o->io_threads > TCP_MAX_LOOPS)
                e = DSIM_ERR(DSIM_EINVAL, -1,
                             "tcp option io_threads=%s: expected a number from 1 to %d", val,
                             TCP_MAX_LOOPS);
        } else if (strcmp(key, "max_frame") == 0) {
            e = dsim_tp_opt_size("tcp", key, val, &o->max_frame);
            if (e == DSIM_OK && (o->max_frame == 0 || o->max_frame > DSIM_TP_MAX_LEN))
                e = DSIM_ERR(DSIM_EINVAL, -1,
                             "tcp option max_frame=%s: expected 1 byte to %" PRIu64 " bytes", val,
                             (uint64_t)DSIM_TP_MAX_LEN);
        } else {
            e = DSIM_ERR(DSIM_EINVAL, -1, "unknown tcp option '%s'; the known options are %s", key,
                         TCP_KNOWN);
        }
    }
    free(val);
    if (e == DSIM_OK && rc < 0)
        e = DSIM_EINVAL;
    if (e == DSIM_OK && o->addrs && o->addrs_file)
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "tcp options addrs= and addrs_file= both given; give the addresses once");
    return e;
}

/* One HOST:PORT; `what` names the item in messages. */
static dsim_err tcp_addr_parse(const char *what, const char *text, int local, tcp_addr *out)
{
    char buf[TCP_ADDR_TXT];
    while (*text == ' ' || *text == '\t')
        text++;
    size_t n = strlen(text);
    while (n && (text[n - 1] == ' ' || text[n - 1] == '\t' || text[n - 1] == '\r'))
        n--;
    if (n == 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s is empty; expected HOST:PORT", what);
    if (n >= sizeof buf)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s ('%.40s...') is too long for an address", what, text);
    memcpy(buf, text, n);
    buf[n] = '\0';
    snprintf(out->txt, sizeof out->txt, "%s", buf);
    char *host, *port;
    if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (!close || close[1] != ':')
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s ('%s'): an IPv6 host is written [ADDRESS]:PORT, e.g. [::1]:5000",
                            what, out->txt);
        *close = '\0';
        host = buf + 1;
        port = close + 2;
    } else {
        char *colon = strrchr(buf, ':');
        if (!colon)
            return DSIM_ERR(DSIM_EINVAL, -1, "%s ('%s'): expected HOST:PORT, e.g. 10.0.0.5:5000",
                            what, out->txt);
        if (memchr(buf, ':', (size_t)(colon - buf)))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s ('%s'): an IPv6 host goes in brackets, e.g. [::1]:5000", what,
                            out->txt);
        *colon = '\0';
        host = buf;
        port = colon + 1;
    }
    if (!*host)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s ('%s'): the host is empty", what, out->txt);
    size_t pl = strlen(port);
    long pv = 0;
    for (size_t i = 0; i < pl; i++)
        pv = (port[i] >= '0' && port[i] <= '9' && pv <= 65535) ? pv * 10 + (port[i] - '0') : -1;
    if (pl == 0 || pl > 5 || pv < 0 || pv > 65535)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s ('%s'): the port '%s' is not a number from 1 to 65535",
                        what, out->txt, port);
    if (pv == 0 && !local)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s ('%s'): port 0 (any free port) is only for ranks this process hosts; "
                        "a remote rank needs its real port",
                        what, out->txt);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc == EAI_NONAME) {
        hints.ai_flags = AI_NUMERICSERV;
        rc = getaddrinfo(host, port, &hints, &res);
    }
    if (rc != 0 || !res)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s ('%s'): cannot resolve host '%s': %s", what, out->txt,
                        host, rc ? gai_strerror(rc) : "no address");
    memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
    out->len = res->ai_addrlen;
    freeaddrinfo(res);
    return DSIM_OK;
}

static int tcp_addr_cmp(const tcp_addr *a, const tcp_addr *b)
{
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return memcmp(&a->ss, &b->ss, a->len);
}

static int tcp_addr_idx_cmp(const void *x, const void *y, void *base)
{
    const tcp_addr *addrs = base;
    int i = *(const int *)x, j = *(const int *)y;
    int c = tcp_addr_cmp(&addrs[i], &addrs[j]);
    return c ? c : (i < j ? -1 : i > j);
}

static int tcp_port_of(const tcp_addr *a)
{
    if (a->ss.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)&a->ss)->sin_port);
    return ntohs(((const struct sockaddr_in6 *)&a->ss)->sin6_port);
}

/* Two ranks at one address would each reach the other's listener. */
static dsim_err tcp_addrs_distinct(tcp_fabric *tf)
{
    int *idx = malloc((size_t)tf->nranks * sizeof *idx);
    if (!idx)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory checking the tcp addresses");
    for (int i = 0; i < tf->nranks; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)tf->nranks, sizeof *idx, tcp_addr_idx_cmp, tf->addrs);
    dsim_err e = DSIM_OK;
    for (int k = 1; k < tf->nranks && e == DSIM_OK; k++) {
        const tcp_addr *a = &tf->addrs[idx[k - 1]], *b = &tf->addrs[idx[k]];
        if (tcp_port_of(a) != 0 && tcp_addr_cmp(a, b) == 0)
            e = DSIM_ERR(DSIM_EINVAL, -1,
                         "tcp addresses: ranks %d and %d are both at %s; every rank needs its own "
                         "HOST:PORT",
                         idx[k - 1], idx[k], b->txt);
    }
    free(idx);
    return e;
}

static dsim_err tcp_addrs_list(tcp_fabric *tf, const char *list)
{
    int count = 0;
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ';');
        count++;
        if (!end)
            break;
        p = end + 1; /* a trailing ';' ends the list */
    }
    if (count != tf->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "tcp option addrs has %d %s but the fabric has %d ranks; give one "
                        "HOST:PORT per rank, in rank order, separated by ';'",
                        count, count == 1 ? "address" : "addresses", tf->nranks);
    const char *p = list;
    for (int r = 0; r < tf->nranks; r++) {
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char what[64], item[TCP_ADDR_TXT + 8];
        snprintf(what, sizeof what, "tcp option addrs: the address of rank %d", r);
        if (n >= sizeof item)
            return DSIM_ERR(DSIM_EINVAL, -1, "%s ('%.40s...') is too long for an address", what, p);
        memcpy(item, p, n);
        item[n] = '\0';
        DSIM_CHECK(tcp_addr_parse(what, item, tcp_is_local(tf, r), &tf->addrs[r]));
        p = end ? end + 1 : p + n;
    }
    return DSIM_OK;
}

static dsim_err tcp_addrs_file(tcp_fabric *tf, const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return DSIM_ERR(DSIM_EINVAL, -1, "tcp option addrs_file=%s: cannot open it: %s", path,
                        strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, r = 0;
    dsim_err e = DSIM_OK;
    while (e == DSIM_OK && getline(&line, &cap, fp) >= 0) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        line[strcspn(line, "\n")] = '\0';
        if (!line[strspn(line, " \t\r")])
            continue;
        if (r < tf->nranks) {
            char what[TCP_ADDR_TXT + 96];
            snprintf(what, sizeof what, "tcp option addrs_file=%.60s, line %d (rank %d)", path,
                     lineno, r);
            e = tcp_addr_parse(what, line, tcp_is_local(tf, r), &tf->addrs[r]);
        }
        r++;
    }
    free(line);
    int rerr = ferror(fp);
    fclose(fp);
    if (e != DSIM_OK)
        return e;
    if (rerr)
        return DSIM_ERR(DSIM_EINVAL, -1, "tcp option addrs_file=%s: read error", path);
    if (r != tf->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "tcp option addrs_file=%s lists %d %s but the fabric has %d ranks; give "
                        "one HOST:PORT per line, in rank order",
                        path, r, r == 1 ? "address" : "addresses", tf->nranks);
    return DSIM_OK;
}

/* ---- fabric ---- */

static void tcp_teardown(tcp_fabric *tf)
{
    for (int i = 0; i < tf->nloops && tf->loops; i++) {
        tcp_loop *lp = &tf->loops[i];
        if (!lp->started)
            continue;
        atomic_store(&lp->stop, 1);
        tcp_wake(lp);
        pthread_join(lp->thr, NULL);
        lp->started = 0;
    }
    for (int i = 0; i < tf->nloops && tf->loops; i++) {
        tcp_loop *lp = &tf->loops[i];
        if (lp->conns.next) {
            for (tcp_link *l = lp->conns.next, *ln; l != &lp->conns; l = ln) {
                ln = l->next;
                tcp_conn *c = TCP_OF(l, tcp_conn, link);
                if (c->kind == TCP_IN)
                    tcp_conn_free(c);
            }
        }
    }
    for (int r = tf->lo; tf->locals && r <= tf->hi; r++) {
        tcp_local *lc = tcp_local_of(tf, r);
        if (lc->out)
            for (int p = 0; p < tf->nranks; p++)
                if (atomic_load(&lc->out[p]))
                    tcp_conn_free(atomic_load(&lc->out[p]));
        if (lc->lsn_fd >= 0)
            close(lc->lsn_fd);
        free(lc->out);
        free(lc->in);
        free(lc->lost);
    }
    for (int i = 0; i < tf->nloops && tf->loops; i++) {
        tcp_loop *lp = &tf->loops[i];
        if (lp->epfd >= 0)
            close(lp->epfd);
        if (lp->evfd >= 0)
            close(lp->evfd);
        if (lp->lock)
            dsim_waitq_destroy(lp->lock);
    }
    free(tf->loops);
    free(tf->locals);
    free(tf->addrs);
    tf->loops = NULL;
    tf->locals = NULL;
    tf->addrs = NULL;
}

static dsim_err tcp_listen(tcp_fabric *tf, tcp_local *lc, int given)
{
    tcp_addr *a = &tf->addrs[lc->rank];
    if (given >= 0) {
        int acc = 0;
        socklen_t al = sizeof acc;
        if (getsockopt(given, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) != 0 || !acc)
            return DSIM_ERR(DSIM_EINVAL, lc->rank,
                            "tcp: listen_fds gives rank %d the descriptor %d, which is not a "
                            "listening socket",
                            lc->rank, given);
        int fl = fcntl(given, F_GETFL);
        if (fl < 0 || fcntl(given, F_SETFL, fl | O_NONBLOCK) != 0 ||
            fcntl(given, F_SETFD, FD_CLOEXEC) != 0)
            return DSIM_ERR(DSIM_EIO, lc->rank, "tcp: rank %d: descriptor %d: %s", lc->rank, given,
                            strerror(errno));
        socklen_t sl = sizeof a->ss;
        if (getsockname(given, (struct sockaddr *)&a->ss, &sl) != 0)
            return DSIM_ERR(DSIM_EIO, lc->rank, "tcp: rank %d: getsockname failed: %s", lc->rank,
                            strerror(errno));
        a->len = sl;
        tcp_sockaddr_txt((struct sockaddr *)&a->ss, sl, a->txt, sizeof a->txt);
        lc->lsn_fd = given;
        return DSIM_OK;
    }
    int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return DSIM_ERR(DSIM_EIO, lc->rank, "tcp: rank %d cannot create a socket: %s", lc->rank,
                        strerror(errno));
    int one = 1;
    /* A restarted job must not wait out TIME_WAIT of its predecessor. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a->ss, a->len) != 0 || listen(fd, SOMAXCONN) != 0) {
        int err = errno;
        close(fd);
        return DSIM_ERR(DSIM_EIO, lc->rank, "tcp: rank %d cannot listen on %s: %s", lc->rank,
                        a->txt, strerror(err));
    }
    if (tcp_port_of(a) == 0) {
        socklen_t sl = sizeof a->ss;
        if (getsockname(fd, (struct sockaddr *)&a->ss, &sl) != 0) {
            int err = errno;
            close(fd);
            return DSIM_ERR(DSIM_EIO, lc->rank, "tcp: rank %d: getsockname failed: %s", lc->rank,
                            strerror(err));
        }
        a->len = sl;
        tcp_sockaddr_txt((struct sockaddr *)&a->ss, sl, a->txt, sizeof a->txt);
    }
    lc->lsn_fd = fd;
    return DSIM_OK;
}

static dsim_err tcp_fabric_open(dsim_fabric *f, const char *options)
{
    tcp_fabric *tf = dsim_tp_fabric_priv(f);
    memset(tf, 0, sizeof *tf);
    tf->f = f;
    tf->rt = dsim_tp_fabric_rt(f);
    tf->nranks = dsim_fabric_nranks(f);
    tf->abort_peer = -1;
    atomic_init(&tf->aborted, 0);
    if (dsim_rt_engine_flags(dsim_rt_name(tf->rt)) & DSIM_RT_VIRTUAL_TIME)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "the tcp transport needs a wall-clock engine (threads or processes); "
                        "the sim engine runs on virtual time: use inproc there");
    tcp_opts o;
    dsim_err e = tcp_parse_opts(tf, options, &o);
    if (e != DSIM_OK)
        goto out;
    tf->lo = o.have_local ? o.lo : 0;
    tf->hi = o.have_local ? o.hi : tf->nranks - 1;
    tf->all_local = tf->lo == 0 && tf->hi == tf->nranks - 1;
    tf->connect_timeout = o.connect_timeout;
    tf->max_frame = o.max_frame;
    e = dsim_secret_load(o.secret_file, &tf->secret);
    if (e != DSIM_OK)
        goto out;
    if (!tf->all_local && !o.addrs && !o.addrs_file) {
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "tcp option local=%d-%d leaves ranks of the %d-rank fabric in other "
                     "processes, and they need addresses: give addrs= or addrs_file=",
                     tf->lo, tf->hi, tf->nranks);
        goto out;
    }
    int nlocal = tf->hi - tf->lo + 1;
    if (o.n_fds && o.n_fds != nlocal) {
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "tcp option listen_fds gives %d descriptor(s) for %d local rank(s) (%d-%d); "
                     "give one per local rank",
                     o.n_fds, nlocal, tf->lo, tf->hi);
        goto out;
    }
    int nloops = o.io_threads < nlocal ? (int)o.io_threads : nlocal;
    tf->addrs = calloc((size_t)tf->nranks, sizeof *tf->addrs);
    tf->locals = calloc((size_t)nlocal, sizeof *tf->locals);
    tf->loops = calloc((size_t)nloops, sizeof *tf->loops);
    if (!tf->addrs || !tf->locals || !tf->loops) {
        free(tf->addrs);
        free(tf->locals);
        free(tf->loops);
        tf->addrs = NULL;
        tf->locals = NULL;
        tf->loops = NULL;
        e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank tcp fabric", tf->nranks);
        goto out;
    }
    /* From here on tcp_teardown undoes whatever was done. */
    tf->nloops = nloops;
    for (int i = 0; i < tf->nloops; i++) {
        tcp_loop *lp = &tf->loops[i];
        lp->tf = tf;
        lp->epfd = lp->evfd = -1;
        lp->conns.next = lp->conns.prev = &lp->conns;
        lp->next_timer = INT64_MAX;
        atomic_init(&lp->stop, 0);
        atomic_init(&lp->dirty, 0);
    }
    for (int r = tf->lo; r <= tf->hi; r++) {
        tcp_local *lc = tcp_local_of(tf, r);
        lc->type = TCP_POLL_LSN;
        lc->rank = r;
        lc->lsn_fd = -1;
        lc->lp = &tf->loops[(r - tf->lo) % tf->nloops];
        atomic_init(&lc->gone, 0);
    }
    if (o.addrs)
        e = tcp_addrs_list(tf, o.addrs);
    else if (o.addrs_file)
        e = tcp_addrs_file(tf, o.addrs_file);
    else
        for (int r = 0; r < tf->nranks && e == DSIM_OK; r++)
            e = tcp_addr_parse("the default address", "127.0.0.1:0", 1, &tf->addrs[r]);
    if (e == DSIM_OK)
        e = tcp_addrs_distinct(tf);
    for (int r = tf->lo; r <= tf->hi && e == DSIM_OK; r++) {
        tcp_local *lc = tcp_local_of(tf, r);
        lc->out = calloc((size_t)tf->nranks, sizeof *lc->out);
        lc->in = calloc((size_t)tf->nranks, sizeof *lc->in);
        lc->lost = calloc((size_t)tf->nranks, 1);
        if (!lc->out || !lc->in || !lc->lost) {
            e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank tcp fabric", tf->nranks);
            break;
        }
        for (int p = 0; p < tf->nranks; p++)
            atomic_init(&lc->out[p], NULL);
        e = tcp_listen(tf, lc, o.n_fds ? o.fds[r - tf->lo] : -1);
    }
    for (int i = 0; i < tf->nloops && e == DSIM_OK; i++) {
        tcp_loop *lp = &tf->loops[i];
        e = dsim_waitq_create(tf->rt, &lp->lock);
        if (e != DSIM_OK)
            break;
        lp->epfd = epoll_create1(EPOLL_CLOEXEC);
        lp->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        if (lp->epfd < 0 || lp->evfd < 0 || epoll_ctl(lp->epfd, EPOLL_CTL_ADD, lp->evfd, &ev) != 0)
            e = DSIM_ERR(DSIM_EIO, -1, "tcp: cannot set up an I/O thread's epoll: %s",
                         strerror(errno));
    }
    for (int r = tf->lo; r <= tf->hi && e == DSIM_OK; r++) {
        tcp_local *lc = tcp_local_of(tf, r);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = lc};
        if (epoll_ctl(lc->lp->epfd, EPOLL_CTL_ADD, lc->lsn_fd, &ev) != 0)
            e = DSIM_ERR(DSIM_EIO, -1, "tcp: cannot watch rank %d's listener: %s", r,
                         strerror(errno));
    }
    if (e == DSIM_OK) {
        /* Signals are for the workers: the I/O threads never take one. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (int i = 0; i < tf->nloops && e == DSIM_OK; i++) {
            tcp_loop *lp = &tf->loops[i];
            int rc = pthread_create(&lp->thr, NULL, tcp_loop_main, lp);
            if (rc != 0)
                e = DSIM_ERR(DSIM_ENOMEM, -1, "tcp: cannot start an I/O thread: %s", strerror(rc));
            else
                lp->started = 1;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (e == DSIM_OK)
        dsim_debug("tcp: fabric of %d ranks, ranks %d-%d here, %d I/O thread(s), connect "
                   "timeout %lld ms",
                   tf->nranks, tf->lo, tf->hi, tf->nloops, tcp_ms(tf->connect_timeout));
out:
    free(o.addrs);
    free(o.addrs_file);
    free(o.secret_file);
    if (e != DSIM_OK) {
        /* Keep the message: teardown makes no calls that set errors. */
        tcp_teardown(tf);
    }
    return e;
}

static void tcp_fabric_close(dsim_fabric *f)
{
    tcp_teardown(dsim_tp_fabric_priv(f));
}

static dsim_err tcp_ep_open(dsim_ep *ep)
{
    tcp_fabric *tf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    int r = dsim_ep_rank(ep);
    if (!tcp_is_local(tf, r))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "rank %d is not hosted by this process (tcp option local=%d-%d); open "
                        "it in the process that hosts it",
                        r, tf->lo, tf->hi);
    return DSIM_OK; /* it has listened since the fabric opened */
}

static void tcp_conn_stats(dsim_ep *ep, dsim_ep_conn_stats *out)
{
    tcp_fabric *tf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    int r = dsim_ep_rank(ep);
    if (!tcp_is_local(tf, r))
        return;
    tcp_local *lc = tcp_local_of(tf, r);
    dsim_waitq_lock(lc->lp->lock);
    out->connections = lc->conn_n;
    out->total_ns = lc->conn_total_ns;
    out->max_ns = lc->conn_max_ns;
    out->slowest_peer = lc->conn_n ? lc->conn_slowest : -1;
    dsim_waitq_unlock(lc->lp->lock);
}

static void tcp_ep_close(dsim_ep *ep)
{
    tcp_fabric *tf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    int r = dsim_ep_rank(ep);
    if (!tcp_is_local(tf, r))
        return;
    tcp_local *lc = tcp_local_of(tf, r);
    tcp_loop *lp = lc->lp;
    atomic_store(&lc->gone, 1);
    dsim_waitq_lock(lp->lock);
    lc->close_req = 1;
    dsim_waitq_unlock(lp->lock);
    atomic_store(&lp->dirty, 1);
    tcp_wake(lp);
    /* Only the loop closes sockets; it answers at once. */
    dsim_waitq_lock(lp->lock);
    while (!lc->closed)
        dsim_waitq_wait(lp->lock, DSIM_NO_DEADLINE);
    dsim_waitq_unlock(lp->lock);
}

/* Encodes the frame into it: a data frame, or a wrapped one when the header
 * does not describe this payload (a hand-made frame, or one that carries a
 * payload checksum of its own for the receive path to judge). */
static void tcp_item_frame(tcp_item *it, int me, int to, const dsim_tp_hdr *hdr,
                           const void *payload, size_t len)
{
    memset(it, 0, sizeof *it);
    it->faithful = hdr->magic == DSIM_TP_MAGIC && hdr->version == DSIM_TP_VERSION &&
                   hdr->len == (uint64_t)len && !(hdr->flags & DSIM_TP_F_CHECKSUM);
    size_t side = hdr->flags & DSIM_TP_F_SIDE ? TCP_SIDE_LEN : 0;
    if (it->faithful) {
        dsim_tp_hdr h = *hdr;
        h.flags |= DSIM_TP_F_CHECKSUM;
        h.checksum = 0;
        tcp_hdr_put(it->head, &h);
        memcpy(it->head + TCP_HDR_LEN, hdr->side, side);
        it->head_len = TCP_HDR_LEN + side;
        uint32_t crc = tcp_crc32c(tcp_hdr_crc(it->head), it->head + TCP_HDR_LEN, side);
        tcp_put32(it->head + 28, tcp_crc32c(crc, payload, len));
    } else {
        dsim_tp_hdr env = {.magic = TCP_MAGIC_RAW,
                           .version = DSIM_TP_VERSION,
                           .flags = DSIM_TP_F_CHECKSUM,
                           .src = me,
                           .dst = to,
                           .len = TCP_HDR_LEN + side + (uint64_t)len};
        tcp_hdr_put(it->head, &env);
        tcp_hdr_put(it->head + TCP_HDR_LEN, hdr);
        memcpy(it->head + 2 * TCP_HDR_LEN, hdr->side, side);
        it->head_len = 2 * TCP_HDR_LEN + side;
        uint32_t crc =
            tcp_crc32c(tcp_hdr_crc(it->head), it->head + TCP_HDR_LEN, TCP_HDR_LEN + side);
        tcp_put32(it->head + 28, tcp_crc32c(crc, payload, len));
    }
    it->body = payload;
    it->body_len = len;
}

static tcp_conn *tcp_conn_new_out(tcp_loop *lp, int me, int to)
{
    tcp_fabric *tf = lp->tf;
    tcp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (dsim_waitq_create(tf->rt, &c->sq) != DSIM_OK) {
        free(c);
        return NULL;
    }
    c->type = TCP_POLL_CONN;
    c->lp = lp;
    c->kind = TCP_OUT;
    c->local = me;
    c->peer = to;
    c->fd = -1;
    atomic_init(&c->state, TCP_IDLE);
    atomic_init(&c->broken, 0);
    c->t_start = c->t_next = tcp_now(tf);
    c->backoff = TCP_BACKOFF_MIN;
    snprintf(c->where, sizeof c->where, "%s", tf->addrs[to].txt);
    tcp_list_add(lp, c);
    atomic_store(&lp->dirty, 1);
    return c;
}
static dsim_err tcp_send(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload,
                         size_t len, dsim_req *req)
{
    tcp_fabric *tf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    int me = dsim_ep_rank(ep);
    if (len > tf->max_frame)
        return DSIM_ERR(DSIM_EINVAL, to,
                        "a %zu-byte message from rank %d to rank %d is over the tcp transport's "
                        "max_frame of %zu bytes; raise the option max_frame or split the "
                        "message",
                        len, me, to, tf->max_frame);
    if (tcp_is_local(tf, to) && atomic_load(&tcp_local_of(tf, to)->gone))
        return DSIM_ERR(DSIM_EPEER, to,
                        "rank %d has closed its endpoint; rank %d cannot send to it", to, me);
    tcp_item *it = dsim_tp_req_priv(req);
    tcp_item_frame(it, me, to, hdr, payload, len);
    it->req = req;
    tcp_local *lc = tcp_local_of(tf, me);
    tcp_loop *lp = lc->lp;
    tcp_after a = {0};
    tcp_conn *c = atomic_load_explicit(&lc->out[to], memory_order_acquire);
    if (!c) {
        dsim_waitq_lock(lp->lock);
        c = atomic_load(&lc->out[to]);
        if (!c) {
            c = tcp_conn_new_out(lp, me, to);
            atomic_store_explicit(&lc->out[to], c, memory_order_release);
            a.wake = 1;
        }
        dsim_waitq_unlock(lp->lock);
        if (!c)
            return DSIM_ERR(DSIM_ENOMEM, to, "out of memory connecting rank %d to rank %d", me, to);
    }
    dsim_waitq_lock(c->sq);
    if (c->sq_dead) {
        dsim_err code = c->dead_code;
        dsim_waitq_unlock(c->sq);
        return DSIM_ERR(code, to, "%s", c->dead_msg);
    }
    tcp_q_push(c, it);
    /* Not up yet: the loop writes the queue when it comes up. */
    if (c->qhead == it && tcp_state(c) == TCP_UP)
        tcp_flush_locked(c, &a);
    dsim_waitq_unlock(c->sq);
    tcp_after_run(lp, &a);
    return DSIM_OK;
}

/* The queue cannot be kept whole (out of memory): it closes for good, as if
 * a write had failed. c->sq held. */
static void tcp_sq_break_locked(tcp_conn *c, const char *why, tcp_after *a)
{
    char msg[400];
    snprintf(msg, sizeof msg,
             "rank %d ran out of memory %s to peer %d; the connection is closed (the peer would "
             "see a gap or half a frame)",
             c->local, why, c->peer);
    dsim_error_log("tcp: %s", msg);
    tcp_sq_close_locked(c, DSIM_EPEER, msg, a);
    atomic_store(&c->broken, 1);
    atomic_store(&c->lp->dirty, 1);
    a->wake = 1;
}

static dsim_err tcp_cancel_send(dsim_ep *ep, dsim_req *req)
{
    tcp_fabric *tf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    tcp_item *it = dsim_tp_req_priv(req);
    tcp_loop *lp = tcp_local_of(tf, dsim_ep_rank(ep))->lp;
    tcp_after a = {0};
    tcp_conn *c = it->conn; /* set by tcp_send, before the request was returned */
    dsim_waitq_lock(c->sq);
    if (!it->queued) {
        /* Written or failed, and being completed right now. */
        dsim_waitq_unlock(c->sq);
        return DSIM_ESTATE;
    }
    if (it->head_done == 0) {
        if (!it->faithful) {
            tcp_q_del(c, it);
        } else {
            /* Its sequence number is taken: send the header alone so the
             * receiver's sequence stays in step. */
            tcp_item *m = tcp_ctl_item(c, TCP_CTL_WITHDRAWN, it->head, TCP_HDR_LEN);
            if (m) {
                tcp_q_replace(c, it, m);
            } else {
                tcp_q_del(c, it);
                tcp_sq_break_locked(c, "withdrawing a frame", &a);
            }
        }
        if (!c->qhead && !c->sq_dead)
            tcp_want_out_locked(c, 0);
        dsim_waitq_unlock(c->sq);
        tcp_after_run(lp, &a);
        return DSIM_OK;
    }
    /* Part of it is on the wire and cannot be taken back: finish it from a
     * copy, so the caller's buffer is free now and the stream stays whole. */
    size_t rest = it->body_len - it->body_done;
    tcp_item *k = tcp_item_own(it->head, it->head_len, it->body + it->body_done, rest);
    if (!k) {
        tcp_q_del(c, it);
        tcp_sq_break_locked(c, "keeping the rest of a cancelled frame", &a);
        dsim_waitq_unlock(c->sq);
        tcp_after_run(lp, &a);
        return DSIM_OK;
    }
    k->head_done = it->head_done;
    tcp_q_replace(c, it, k);
    dsim_waitq_unlock(c->sq);
    dsim_tp_complete(req, DSIM_OK);
    return DSIM_ESTATE; /* finished rather than withdrawn: the shared layer sees it done */
}

static void tcp_abort(dsim_fabric *f, int failed_peer, const char *why)
{
    tcp_fabric *tf = dsim_tp_fabric_priv(f);
    tf->abort_peer = failed_peer;
    snprintf(tf->abort_why, sizeof tf->abort_why, "%s", why ? why : "");
    atomic_store_explicit(&tf->aborted, 1, memory_order_release);
    if (tf->all_local)
        return; /* every rank shares this address space: already revoked */
    for (int i = 0; i < tf->nloops; i++) {
        tcp_loop *lp = &tf->loops[i];
        tcp_after a = {0};
        dsim_waitq_lock(lp->lock);
        for (tcp_link *l = lp->conns.next; l != &lp->conns; l = l->next)
            tcp_tell_abort_locked(TCP_OF(l, tcp_conn, link), &a);
        dsim_waitq_unlock(lp->lock);
        tcp_after_run(lp, &a);
    }
}

const struct dsim_tp_ops dsim_tp_tcp_ops = {
    .size = sizeof(struct dsim_tp_ops),
    .name = "tcp",
    .fabric_priv_size = sizeof(tcp_fabric),
    .ep_priv_size = 0,
    .req_priv_size = sizeof(tcp_item),
    .fabric_open = tcp_fabric_open,
    .fabric_close = tcp_fabric_close,
    .ep_open = tcp_ep_open,
    .ep_close = tcp_ep_close,
    .send = tcp_send,
    .cancel_send = tcp_cancel_send,
    .abort = tcp_abort,
    .conn_stats = tcp_conn_stats,
};
