/* The tcp backend's shared state and the functions its files call across
 * one another (tcp.c describes the backend: connections, wire, failures,
 * threads and locks). Files:
 *   tcp.c            the ops table: fabric open and close, endpoints, send,
 *                    cancel, abort
 *   tcp_wire.h       the frame and handshake encodings
 *   tcp_send.c       send queues and writing them (c->sq held)
 *   tcp_conn.c       connection state: connect, retry, up, kill
 *   tcp_handshake.c  the hello, its reply and the cluster secret's challenge
 *   tcp_read.c       the frame reader: header checks, bodies, hand-over
 *   tcp_loop.c       the I/O threads: accept, events, timers, reaping
 *   tcp_opts.c       the options and the address list */
#ifndef DSIM_TCP_INT_H
#define DSIM_TCP_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dsim/log.h"
#include "dsim/spi/auth.h"
#include "dsim/spi/transport.h"
#include "tcp_wire.h"

#define TCP_STAGE_IN    ((size_t)64 << 10)
#define TCP_STAGE_OUT   ((size_t)512)
#define TCP_READ_BUDGET ((size_t)4 << 20)
/* A large body is read in pieces of at most this size, each hashed right
 * after it arrives, while it is in cache. */
#define TCP_RECV_PIECE    ((size_t)256 << 10)
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

enum { TCP_POLL_LSN = 1, TCP_POLL_CONN };
enum { TCP_OUT, TCP_IN };
enum { TCP_IDLE, TCP_CONNECTING, TCP_HELLO, TCP_UP, TCP_DEAD };
enum { TCP_RD_HDR, TCP_RD_BODY };

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
    size_t rcrc_len; /* the body's first bytes the checksum covers (all, or the sideband) */
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
    int payload_crc; /* 0: data frames' checksums cover header and sideband only */
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

#define TCP_MAX_FDS 1024

typedef struct tcp_opts {
    char *addrs, *addrs_file, *secret_file;
    int fds[TCP_MAX_FDS];
    int n_fds;
    int have_local, lo, hi;
    int64_t connect_timeout;
    long io_threads;
    size_t max_frame;
    int payload_crc;
} tcp_opts;

/* ---- small helpers ---- */

static inline int64_t tcp_now(tcp_fabric *tf)
{
    return dsim_rt_now(tf->rt);
}

static inline int tcp_is_local(const tcp_fabric *tf, int rank)
{
    return rank >= tf->lo && rank <= tf->hi;
}

static inline tcp_local *tcp_local_of(tcp_fabric *tf, int rank)
{
    return &tf->locals[rank - tf->lo];
}

static inline long long tcp_ms(int64_t ns)
{
    return (long long)(ns / TCP_MS);
}

static inline int tcp_state(tcp_conn *c)
{
    return atomic_load_explicit(&c->state, memory_order_acquire);
}

static inline void tcp_set_state(tcp_conn *c, int st)
{
    atomic_store_explicit(&c->state, st, memory_order_release);
}

static inline void tcp_wake(tcp_loop *lp)
{
    uint64_t one = 1;
    /* A full counter (EAGAIN) already means "wake up". */
    while (write(lp->evfd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

/* tcp_send.c */
void tcp_q_push(tcp_conn *c, tcp_item *it);
void tcp_q_del(tcp_conn *c, tcp_item *it);
void tcp_q_replace(tcp_conn *c, tcp_item *old, tcp_item *it);
void tcp_after_run(tcp_loop *lp, tcp_after *a);
tcp_item *tcp_item_own(const uint8_t *head, size_t head_len, const void *body, size_t len);
tcp_item *tcp_ctl_item(const tcp_conn *c, uint32_t what, const void *body, size_t len);
void tcp_want_out_locked(tcp_conn *c, int on);
void tcp_sq_close_locked(tcp_conn *c, dsim_err code, const char *msg, tcp_after *a);
void tcp_flush_locked(tcp_conn *c, tcp_after *a);
void tcp_tell_abort_locked(tcp_conn *c, tcp_after *a);

/* tcp_conn.c */
void tcp_nodelay(int fd);
void tcp_sockaddr_txt(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap);
const char *tcp_errstr(int err);
void tcp_kill_locked(tcp_conn *c, dsim_err code, tcp_after *a, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void tcp_up_locked(tcp_loop *lp, tcp_conn *c, tcp_after *a);
void tcp_close_fd_locked(tcp_conn *c);
void tcp_give_up_locked(tcp_conn *c, const char *last, tcp_after *a);
void tcp_retry_locked(tcp_loop *lp, tcp_conn *c, int err, int64_t now, tcp_after *a);
void tcp_connected_locked(tcp_loop *lp, tcp_conn *c, int64_t now, tcp_after *a);
void tcp_connect_locked(tcp_loop *lp, tcp_conn *c, int64_t now, tcp_after *a);

/* tcp_read.c */
void tcp_read(tcp_loop *lp, tcp_conn *c);

/* tcp_handshake.c */
void tcp_hello_read(tcp_loop *lp, tcp_conn *c);

/* tcp_loop.c */
void tcp_conn_free(tcp_conn *c);
void tcp_list_add(tcp_loop *lp, tcp_conn *c);
void *tcp_loop_main(void *arg);

/* tcp_opts.c */
dsim_err tcp_parse_opts(tcp_fabric *tf, const char *options, tcp_opts *o);
dsim_err tcp_addr_parse(const char *what, const char *text, int local, tcp_addr *out);
int tcp_port_of(const tcp_addr *a);
dsim_err tcp_addrs_distinct(tcp_fabric *tf);
dsim_err tcp_addrs_list(tcp_fabric *tf, const char *list);
dsim_err tcp_addrs_file(tcp_fabric *tf, const char *path);

#endif
