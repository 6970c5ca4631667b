/* libFuzzer target: the tcp backend's handshake and frame decoder
 * (src/transport/tcp/tcp_handshake.c, tcp_read.c), through a real
 * socket. Each input opens a fabric of two ranks whose rank 1 is local and
 * rank 0 is played here, and speaks to it over loopback:
 *
 *   in  (flag bit 0 clear): connects to rank 1 as rank 0, sends a hello,
 *       then the input's frames, and ends its side of the connection;
 *   out (bit 0 set): has rank 1 send to rank 0, accepts its connection,
 *       answers its hello, then sends the input's frames back (the way
 *       only control frames may travel).
 *
 * Input: byte 0 holds the flags; bit 1 keeps the input's checksums as they
 * are (else each frame's CRC32C is set right, so that the fuzzer reaches
 * what lies behind the checksum: wrapped frames, control frames, the
 * receive path's header checks); bit 2 takes the hello (or the answer to
 * one) from the next 24 bytes instead of writing a valid one. The rest is
 * frames: a 48-byte header as the backend encodes it (little-endian), then
 * (a data frame whose flags have DSIM_TP_F_SIDE) the 32-byte sideband, then
 * as many payload bytes as its len field says, or what is left.
 *
 * When the fabric has read everything (it closes the connection once it
 * sees the end), every message it took from rank 0 is received, with
 * whatever tag, on every communicator the frames named. The fabric must
 * never crash, leak, stop reading, or keep a connection whose peer ended;
 * the sanitizers and the aborts below say so.
 *
 * Seeds: tests/fuzz/seeds/tcp_frames (tests/fuzz/seeds.py writes them). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "dsim/log.h"
#include "dsim/rt.h"
#include "dsim/spi/transport.h"
#include "dsim/transport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_HDR          48
#define FZ_HELLO        24
#define FZ_MAGIC_HELLO  0x48545344u /* "DSTH" */
#define FZ_MAGIC_ACK    0x41545344u /* "DSTA" */
#define FZ_MAX_FRAME    65536
#define FZ_MAX_COMMS    8
#define FZ_MS           1000000LL
#define FZ_IO_TIMEOUT_S 5

static void fz_die(const char *what)
{
    fprintf(stderr, "fuzz_tcp_frames: %s (%s)\n", what, strerror(errno));
    abort();
}

static void fz_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t fz_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t fz_get64(const uint8_t *p)
{
    return (uint64_t)fz_get32(p) | (uint64_t)fz_get32(p + 4) << 32;
}

static void fz_hello(uint8_t *p, uint32_t magic, int from, int to, int nranks)
{
    memset(p, 0, FZ_HELLO);
    fz_put32(p, magic);
    p[4] = DSIM_TP_VERSION;
    fz_put32(p + 8, (uint32_t)from);
    fz_put32(p + 12, (uint32_t)to);
    fz_put32(p + 16, (uint32_t)nranks);
    fz_put32(p + 20, dsim_tp_crc32c(0, p, 20));
}

/* A listening socket on 127.0.0.1, any port. */
static int fz_listen(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fz_die("socket");
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
        fz_die("listen");
    *port = ntohs(sa.sin_port);
    return fd;
}

/* poll for FZ_IO_TIMEOUT_S, across signals */
static int fz_poll(struct pollfd *pf)
{
    for (int left = FZ_IO_TIMEOUT_S * 1000; left > 0; left -= 10) {
        int r = poll(pf, 1, 10);
        if (r != 0 && !(r < 0 && errno == EINTR))
            return r;
    }
    return 0;
}

static void fz_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = FZ_IO_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* Sends all of p unless the fabric closed the connection; a fabric that
 * stops reading for FZ_IO_TIMEOUT_S is a finding. */
static int fz_send(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            fz_die("the fabric stopped reading a live connection");
        if (w <= 0)
            return -1; /* closed or reset by the fabric: fine */
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads and drops what the fabric sends until it closes the connection. */
static void fz_until_closed(int fd)
{
    uint8_t junk[4096];
    for (;;) {
        ssize_t r = recv(fd, junk, sizeof junk, 0);
        if (r > 0 || (r < 0 && errno == EINTR))
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            fz_die("the fabric kept a connection open after its peer ended it");
        return;
    }
}

/* The frames of the input, checksums set right unless raw; remembers the
 * communicators of data and wrapped frames. */
static uint8_t *fz_frames(const uint8_t *in, size_t n, int raw, uint32_t *comms, int *n_comms)
{
    uint8_t *out = malloc(n ? n : 1);
    if (!out)
        return NULL;
    memcpy(out, in, n);
    size_t off = 0;
    while (n - off >= FZ_HDR) {
        uint8_t *h = out + off;
        uint32_t magic = fz_get32(h);
        uint64_t len = fz_get64(h + 40);
        /* A data frame's sideband travels between its header and payload. */
        if (magic == DSIM_TP_MAGIC && ((uint32_t)h[6] | (uint32_t)h[7] << 8) & DSIM_TP_F_SIDE &&
            len <= UINT64_MAX - DSIM_TP_SIDE_LEN)
            len += DSIM_TP_SIDE_LEN;
        size_t body = len <= n - off - FZ_HDR ? (size_t)len : n - off - FZ_HDR;
        uint32_t comm = magic == DSIM_TP_MAGIC ? fz_get32(h + 16)
                        : body >= FZ_HDR       ? fz_get32(h + FZ_HDR + 16)
                                               : 0;
        int known = 0;
        for (int i = 0; i < *n_comms; i++)
            known |= comms[i] == comm;
        if (!known && *n_comms < FZ_MAX_COMMS)
            comms[(*n_comms)++] = comm;
        if (!raw && body == len) {
            memset(h + 28, 0, 4);
            uint32_t crc = dsim_tp_crc32c(dsim_tp_crc32c(0, h, FZ_HDR), h + FZ_HDR, body);
            fz_put32(h + 28, crc);
        }
        off += FZ_HDR + body;
    }
    return out;
}

static dsim_rt *fz_rt;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fz_rt) {
        dsim_log_set_level(DSIM_LOG_ERROR);
        if (dsim_rt_create("threads", &fz_rt) != DSIM_OK)
            fz_die("dsim_rt_create");
    }
    if (size < 1)
        return 0;
    int out_mode = data[0] & 1, raw = data[0] & 2, given_hello = data[0] & 4;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    uint8_t hello[FZ_HELLO];
    size_t hello_len = FZ_HELLO;
    if (given_hello) {
        hello_len = n < FZ_HELLO ? n : FZ_HELLO;
        memcpy(hello, p, hello_len);
        if (!raw && hello_len == FZ_HELLO)
            fz_put32(hello + 20, dsim_tp_crc32c(0, hello, 20));
        p += hello_len;
        n -= hello_len;
    } else if (out_mode) {
        fz_hello(hello, FZ_MAGIC_ACK, 0, 1, 2);
    } else {
        fz_hello(hello, FZ_MAGIC_HELLO, 0, 1, 2);
    }
    uint32_t comms[FZ_MAX_COMMS] = {1}; /* the driver's world communicator */
    int n_comms = 1;
    uint8_t *frames = fz_frames(p, n, raw, comms, &n_comms);
    if (!frames)
        return 0;

    /* rank 1: ours to fuzz, on a listener made here; rank 0: played here */
    int port1, port0 = 9;
    int lfd1 = fz_listen(&port1), lfd0 = -1;
    if (out_mode)
        lfd0 = fz_listen(&port0);
    char opts[256];
    snprintf(opts, sizeof opts,
             "addrs=127.0.0.1:%d;127.0.0.1:%d,local=1,listen_fds=%d,connect_timeout=50ms,"
             "max_frame=%d",
             port0, port1, lfd1, FZ_MAX_FRAME);
    dsim_fabric_cfg cfg = {.backend = "tcp", .nranks = 2, .rt = fz_rt, .options = opts};
    dsim_fabric *f = NULL;
    dsim_ep *ep = NULL;
    if (dsim_fabric_open(&cfg, &f) != DSIM_OK || dsim_ep_open(f, 1, &ep) != DSIM_OK) {
        fprintf(stderr, "fuzz_tcp_frames: %s\n", dsim_errmsg());
        abort();
    }

    int fd = -1;
    dsim_req *sreq = NULL;
    static const uint8_t ping[8] = "dsim-fz";
    if (!out_mode) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port1)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0)
            fz_die("socket");
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            /* libFuzzer's timer signal may cut the call short; the
             * connection then completes on its own */
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t el = sizeof err;
            if (errno != EINTR || fz_poll(&pf) != 1 ||
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)
                fz_die("connect");
        }
        fz_timeouts(fd);
        if (fz_send(fd, hello, hello_len) == 0)
            (void)fz_send(fd, frames, n);
    } else {
        if (dsim_isend(ep, 0, 1, 1, ping, sizeof ping, &sreq) != DSIM_OK)
            sreq = NULL;
        struct pollfd pf = {.fd = lfd0, .events = POLLIN};
        if (fz_poll(&pf) != 1)
            fz_die("rank 1 never connected to rank 0");
        do
            fd = accept(lfd0, NULL, NULL);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
            fz_die("accept");
        fz_timeouts(fd);
        uint8_t theirs[FZ_HELLO];
        size_t got = 0;
        while (got < FZ_HELLO) {
            ssize_t r = recv(fd, theirs + got, FZ_HELLO - got, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                fz_die("rank 1's hello did not come");
            got += (size_t)r;
        }
        if (fz_get32(theirs) != FZ_MAGIC_HELLO ||
            fz_get32(theirs + 20) != dsim_tp_crc32c(0, theirs, 20))
            fz_die("rank 1's hello is not one");
        if (fz_send(fd, hello, hello_len) == 0)
            (void)fz_send(fd, frames, n);
    }
    shutdown(fd, SHUT_WR);
    fz_until_closed(fd);

    /* Everything the fabric took is queued now: receive it. */
    static uint8_t buf[FZ_MAX_FRAME + FZ_HDR];
    int received = 0;
    for (int c = 0; c < n_comms; c++) {
        for (int k = 0; k < 64; k++) {
            dsim_req *r = NULL;
            if (dsim_irecv(ep, 0, comms[c], DSIM_ANY_TAG, buf, sizeof buf, &r) != DSIM_OK)
                break;
            /* queued messages match at once: no need to wait for more */
            if (dsim_wait(r, dsim_rt_deadline(fz_rt, 0), NULL) != DSIM_OK)
                break;
            received++;
        }
    }
    dsim_err se = DSIM_OK;
    if (sreq)
        se = dsim_wait(sreq, dsim_rt_deadline(fz_rt, 1000 * FZ_MS), NULL);
    if (getenv("DSIM_FUZZ_VERBOSE")) {
        dsim_ep_stats st;
        dsim_ep_get_stats(ep, &st);
        fprintf(stderr,
                "fuzz_tcp_frames: %s, %zu frame bytes: %d received; stats recv %llu, "
                "misrouted %llu, stale %llu, corrupt %llu; aborted %d%s%s\n",
                out_mode ? "out" : "in", n, received, (unsigned long long)st.msgs_recv,
                (unsigned long long)st.rejected_misrouted, (unsigned long long)st.rejected_stale,
                (unsigned long long)st.rejected_corrupt, dsim_fabric_aborted(f),
                sreq ? "; send: " : "", sreq ? dsim_strerror(se) : "");
    }
    close(fd);
    dsim_ep_close(ep);
    dsim_fabric_close(f);
    if (lfd0 >= 0)
        close(lfd0);
    free(frames);
    return 0;
}
