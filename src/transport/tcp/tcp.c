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
 *   payload_checksum=1|0  1 (the default): every data frame's checksum
 *                      covers its payload. 0: a data frame's checksum covers
 *                      its header and sideband only, flagged TCP_F_HEAD_ONLY
 *                      (the payload costs no checksum pass on either side);
 *                      for ranks on one host, where the bytes go from memory
 *                      to memory through the kernel, as over shm (the
 *                      processes engine sets it there). A receiver with 1
 *                      refuses such a frame as corrupt. The fault layer's
 *                      own checksums (corrupt faults) travel either way.
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
 * as a damaged payload (with payload_checksum=0: of the header and the
 * sideband, and the frame carries TCP_F_HEAD_ONLY). A data frame with
 * another flag than those (and the sideband's and virtual flags) is
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
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "dsim/spi/rt.h"
#include "tcp_int.h"

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
    tf->payload_crc = o.payload_crc;
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
static void tcp_item_frame(const tcp_fabric *tf, tcp_item *it, int me, int to,
                           const dsim_tp_hdr *hdr, const void *payload, size_t len)
{
    memset(it, 0, sizeof *it);
    it->faithful = hdr->magic == DSIM_TP_MAGIC && hdr->version == DSIM_TP_VERSION &&
                   hdr->len == (uint64_t)len && !(hdr->flags & DSIM_TP_F_CHECKSUM);
    size_t side = hdr->flags & DSIM_TP_F_SIDE ? TCP_SIDE_LEN : 0;
    if (it->faithful) {
        dsim_tp_hdr h = *hdr;
        h.flags |= DSIM_TP_F_CHECKSUM | (tf->payload_crc ? 0 : TCP_F_HEAD_ONLY);
        h.checksum = 0;
        tcp_hdr_put(it->head, &h);
        memcpy(it->head + TCP_HDR_LEN, hdr->side, side);
        it->head_len = TCP_HDR_LEN + side;
        uint32_t crc = tcp_crc32c(tcp_hdr_crc(it->head), it->head + TCP_HDR_LEN, side);
        tcp_put32(it->head + 28, tf->payload_crc ? tcp_crc32c(crc, payload, len) : crc);
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
    tcp_item_frame(tf, it, me, to, hdr, payload, len);
    it->req = req;
    tcp_local *lc = tcp_local_of(tf, me);
    tcp_loop *lp = lc->lp;
    dsim_rt_note_send(len);
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
