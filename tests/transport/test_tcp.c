/* The tcp backend beyond the conformance suite: options, the wire format
 * seen from a raw socket (a frame built here is accepted, so both sides
 * agree on the header encoding and the CRC32C), corrupt and garbage input,
 * peers that close, reset, start late, stop reading or never answer, abort
 * notices between fabrics, and two processes that share a job.
 *
 * Ranks played by the test itself are "remote" ranks of a fabric opened with
 * local=; their raw sockets speak the protocol by hand. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/log.h"
#include "dsim/rt.h"
#include "dsim/spi/auth.h"
#include "dsim/spi/transport.h"
#include "dsim/transport.h"

#define MS      1000000LL
#define LONG_NS (20000 * MS)
#define MAXL    8

/* ---- captured log lines (the I/O threads log too) ---- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_len;

static void log_capture(dsim_log_level level, const char *file, int line, const char *msg,
                        void *user)
{
    (void)level;
    (void)file;
    (void)line;
    (void)user;
    pthread_mutex_lock(&log_mu);
    int n = snprintf(log_buf + log_len, sizeof log_buf - log_len, "%s\n", msg);
    if (n > 0 && log_len + (size_t)n < sizeof log_buf)
        log_len += (size_t)n;
    pthread_mutex_unlock(&log_mu);
}

static void log_reset(void)
{
    pthread_mutex_lock(&log_mu);
    log_len = 0;
    log_buf[0] = '\0';
    pthread_mutex_unlock(&log_mu);
}

/* Waits up to 2 s for a log line containing s. */
static int log_has(const char *s)
{
    for (int i = 0; i < 400; i++) {
        pthread_mutex_lock(&log_mu);
        int found = strstr(log_buf, s) != NULL;
        pthread_mutex_unlock(&log_mu);
        if (found)
            return 1;
        usleep(5000);
    }
    return 0;
}

/* ---- the wire, by hand ---- */

static uint32_t crc32c(uint32_t crc, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A data frame as the tcp backend writes it: the header little-endian, the
 * checksum over it (checksum field zero) and the payload. Returns its size. */
static size_t wire_frame(uint8_t *out, int src, int dst, uint32_t comm, uint32_t tag, uint64_t seq,
                         const void *payload, size_t len)
{
    memset(out, 0, 48);
    put32(out, DSIM_TP_MAGIC);
    out[4] = DSIM_TP_VERSION;
    out[6] = DSIM_TP_F_CHECKSUM;
    put32(out + 8, (uint32_t)src);
    put32(out + 12, (uint32_t)dst);
    put32(out + 16, comm);
    put32(out + 20, 0);
    put32(out + 24, tag);
    put64(out + 32, seq);
    put64(out + 40, len);
    memcpy(out + 48, payload, len);
    put32(out + 28, crc32c(crc32c(0, out, 48), payload, len));
    return 48 + len;
}

static void wire_hello(uint8_t *p, uint32_t magic, int from, int to, int nranks)
{
    put32(p, magic);
    p[4] = DSIM_TP_VERSION;
    p[5] = p[6] = p[7] = 0;
    put32(p + 8, (uint32_t)from);
    put32(p + 12, (uint32_t)to);
    put32(p + 16, (uint32_t)nranks);
    put32(p + 20, crc32c(0, p, 20));
}

#define HELLO_MAGIC 0x48545344u /* "DSTH" */
#define ACK_MAGIC   0x41545344u /* "DSTA" */

static void xwrite(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        b += w;
        n -= (size_t)w;
    }
}

/* Reads exactly n bytes within ms; returns bytes read (short on EOF/timeout). */
static size_t xread(int fd, void *p, size_t n, int ms)
{
    uint8_t *b = p;
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, ms) <= 0)
            break;
        ssize_t r = recv(fd, b + got, n - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* 1 if the peer closed or reset fd within ms (after any pending bytes). */
static int raw_closed(int fd, int ms)
{
    uint8_t junk[256];
    for (int64_t left = ms; left > 0; left -= 10) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 10) <= 0)
            continue;
        ssize_t r = recv(fd, junk, sizeof junk, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return 1;
    }
    return 0;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* Connects to `to`'s listener as rank `from`; returns the socket and the
 * reply's status (-1 if no well-formed reply came). */
static int raw_join(int port, int from, int to, int nranks, int *status)
{
    int fd = raw_connect(port);
    uint8_t h[24], ack[24];
    wire_hello(h, HELLO_MAGIC, from, to, nranks);
    xwrite(fd, h, sizeof h);
    *status = -1;
    if (xread(fd, ack, sizeof ack, 2000) == sizeof ack && get32(ack) == ACK_MAGIC &&
        get32(ack + 20) == crc32c(0, ack, 20))
        *status = ack[6] | ack[7] << 8;
    return fd;
}

static int raw_listen(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 8), 0);
    return fd;
}

static int raw_accept(int lfd, int ms)
{
    struct pollfd pf = {.fd = lfd, .events = POLLIN};
    if (poll(&pf, 1, ms) <= 0)
        return -1;
    return accept(lfd, NULL, NULL);
}

/* Plays the listening side of rank `me` for one connection: accepts, reads
 * the hello, accepts it. Returns the socket. */
static int raw_serve(int lfd, int me, int nranks)
{
    int fd = raw_accept(lfd, 5000);
    assert_true(fd >= 0);
    uint8_t h[24], ack[24];
    assert_int_equal(xread(fd, h, sizeof h, 5000), sizeof h);
    assert_int_equal(get32(h), HELLO_MAGIC);
    assert_int_equal((int)get32(h + 12), me);
    wire_hello(ack, ACK_MAGIC, me, (int)get32(h + 8), nranks);
    xwrite(fd, ack, sizeof ack);
    return fd;
}

/* Distinct free ports on 127.0.0.1 (held open until all are chosen). */
static void pick_ports(int n, int *ports)
{
    int fds[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        assert_int_equal(bind(fds[i], (struct sockaddr *)&sa, sizeof sa), 0);
        socklen_t sl = sizeof sa;
        getsockname(fds[i], (struct sockaddr *)&sa, &sl);
        ports[i] = ntohs(sa.sin_port);
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* ---- fabrics with local= ---- */

typedef struct tjob {
    dsim_rt *rt;
    dsim_fabric *f;
    dsim_ep *ep[MAXL];
    int n, lo, hi;
} tjob;

static dsim_err tjob_try(tjob *j, int n, int lo, int hi, const int *ports, const char *extra)
{
    memset(j, 0, sizeof *j);
    char opts[1024];
    int off = snprintf(opts, sizeof opts, "addrs=");
    for (int r = 0; r < n; r++)
        off += snprintf(opts + off, sizeof opts - (size_t)off, "%s127.0.0.1:%d", r ? ";" : "",
                        ports[r]);
    snprintf(opts + off, sizeof opts - (size_t)off, ",local=%d-%d%s%s", lo, hi, extra ? "," : "",
             extra ? extra : "");
    if (dsim_rt_create("threads", &j->rt) != DSIM_OK)
        return DSIM_ENOMEM;
    dsim_fabric_cfg cfg = {.backend = "tcp", .nranks = n, .rt = j->rt, .options = opts};
    dsim_err e = dsim_fabric_open(&cfg, &j->f);
    if (e != DSIM_OK) {
        dsim_rt_destroy(j->rt);
        j->rt = NULL;
        return e;
    }
    j->n = n;
    j->lo = lo;
    j->hi = hi;
    for (int r = lo; r <= hi && e == DSIM_OK; r++)
        e = dsim_ep_open(j->f, r, &j->ep[r]);
    return e;
}

static void tjob_open(tjob *j, int n, int lo, int hi, const int *ports, const char *extra)
{
    dsim_err e = tjob_try(j, n, lo, hi, ports, extra);
    if (e != DSIM_OK)
        fail_msg("opening the tcp fabric: %s", dsim_errmsg());
}

static void tjob_close(tjob *j)
{
    for (int r = j->lo; r <= j->hi; r++)
        dsim_ep_close(j->ep[r]);
    if (j->f)
        dsim_fabric_close(j->f);
    if (j->rt)
        dsim_rt_destroy(j->rt);
    memset(j, 0, sizeof *j);
}

static int64_t dl(tjob *j, int64_t ns)
{
    return dsim_rt_deadline(j->rt, ns);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 16);
    }
}

/* ---- options ---- */

static dsim_err open_opts(const char *opts, int n)
{
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_fabric *f = NULL;
    dsim_fabric_cfg cfg = {.backend = "tcp", .nranks = n, .rt = rt, .options = opts};
    dsim_err e = dsim_fabric_open(&cfg, &f);
    if (f)
        dsim_fabric_close(f);
    dsim_rt_destroy(rt);
    return e;
}

static void expect_bad(const char *opts, int n, const char *say1, const char *say2)
{
    dsim_err e = open_opts(opts, n);
    if (e != DSIM_EINVAL)
        fail_msg("options '%s' gave %s, not EINVAL", opts, dsim_strerror(e));
    if (!strstr(dsim_errmsg(), say1) || (say2 && !strstr(dsim_errmsg(), say2)))
        fail_msg("options '%s': message '%s' does not say '%s'/'%s'", opts, dsim_errmsg(), say1,
                 say2 ? say2 : "");
}

static void test_options(void **state)
{
    (void)state;
    expect_bad("colour=blue", 2, "colour", "addrs_file=");
    expect_bad("addrs=127.0.0.1:1", 2, "1 address", "2 ranks");
    expect_bad("addrs=127.0.0.1:5000;127.0.0.1", 2, "rank 1", "HOST:PORT");
    expect_bad("addrs=127.0.0.1:5000;127.0.0.1:99999", 2, "rank 1", "99999");
    expect_bad("addrs=127.0.0.1:5000;127.0.0.1:x1", 2, "'x1'", NULL);
    expect_bad("addrs=127.0.0.1:5000;::1:5001", 2, "rank 1", "brackets");
    expect_bad("addrs=127.0.0.1:5000;[::1:5001", 2, "rank 1", "[ADDRESS]:PORT");
    expect_bad("addrs=127.0.0.1:5000;:5001", 2, "rank 1", "host is empty");
    expect_bad("addrs=127.0.0.1:5000;;127.0.0.1:5002", 3, "rank 1", "empty");
    expect_bad("addrs=127.0.0.1:5000;127.0.0.1:0,local=0", 2, "rank 1", "port 0");
    expect_bad("addrs=127.0.0.1:5000;127.0.0.1:5000", 2, "ranks 0 and 1", "127.0.0.1:5000");
    expect_bad("local=0", 2, "local=0-0", "addrs=");
    expect_bad("local=1-3", 2, "local=1-3", "0..1");
    expect_bad("local=1-0", 2, "local=1-0", NULL);
    expect_bad("local=-1", 2, "local=-1", NULL);
    expect_bad("connect_timeout=soon", 2, "connect_timeout=soon", "30s");
    expect_bad("connect_timeout=0", 2, "connect_timeout=0", NULL);
    expect_bad("connect_timeout=5h", 2, "connect_timeout=5h", NULL);
    expect_bad("io_threads=0", 2, "io_threads=0", "1 to 64");
    expect_bad("max_frame=0", 2, "max_frame=0", NULL);
    expect_bad("max_frame=-1", 2, "max_frame=-1", NULL);
    expect_bad("addrs=127.0.0.1:1;127.0.0.1:2,addrs_file=/nonexistent", 2, "both", NULL);
    expect_bad("addrs_file=/nonexistent/addrs", 2, "/nonexistent/addrs", "cannot open");

    /* A file with comments and blank lines; a short one names the count. */
    int ports[2];
    pick_ports(2, ports);
    char path[] = "/tmp/dsim_tcp_addrsXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    fprintf(fp, "# the job's ranks\n\n127.0.0.1:%d   # rank 0\n  127.0.0.1:%d\n", ports[0],
            ports[1]);
    fclose(fp);
    char opts[256];
    snprintf(opts, sizeof opts, "addrs_file=%s,connect_timeout=2s,io_threads=2,max_frame=1m", path);
    assert_int_equal(open_opts(opts, 2), DSIM_OK);
    snprintf(opts, sizeof opts, "addrs_file=%s", path);
    expect_bad(opts, 3, "lists 2 addresses", "3 ranks");
    fp = fopen(path, "w");
    fprintf(fp, "127.0.0.1:%d\nlocalhost\n", ports[0]);
    fclose(fp);
    expect_bad(opts, 2, "line 2 (rank 1", "HOST:PORT");
    unlink(path);

    /* A rank this process does not host cannot be opened here. */
    tjob j;
    tjob_open(&j, 2, 0, 0, ports, NULL);
    dsim_ep *other;
    assert_int_equal(dsim_ep_open(j.f, 1, &other), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "not hosted"));
    tjob_close(&j);
    /* A port already taken is a clear error. */
    int lfd = raw_listen(ports[1]);
    dsim_err e = tjob_try(&j, 2, 1, 1, ports, NULL);
    assert_int_equal(e, DSIM_EIO);
    assert_non_null(strstr(dsim_errmsg(), "cannot listen"));
    tjob_close(&j);
    close(lfd);
    /* Messages over max_frame are refused by the sender. */
    tjob_open(&j, 2, 0, 1, ports, "max_frame=1k");
    uint8_t big[2048] = {0};
    dsim_req *r;
    assert_int_equal(dsim_isend(j.ep[0], 1, 0, 0, big, sizeof big, &r), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "max_frame"));
    tjob_close(&j);
}

/* ---- corrupt and garbage input ---- */

/* Ranks 0-1 here, rank 2 played by a raw socket. */
static void test_corrupt_frame(void **state)
{
    (void)state;
    int ports[3];
    pick_ports(3, ports);
    tjob j;
    tjob_open(&j, 3, 0, 1, ports, NULL);
    int st;
    int fd = raw_join(ports[1], 2, 1, 3, &st);
    assert_int_equal(st, 0);
    /* A frame built by hand is taken: same encoding, same CRC32C. */
    uint8_t frame[48 + 64], payload[64], got[64];
    fill(payload, sizeof payload, 1);
    xwrite(fd, frame, wire_frame(frame, 2, 1, 5, 7, 1, payload, sizeof payload));
    dsim_req *r;
    size_t len = 0;
    assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 7, got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), &len), DSIM_OK);
    assert_int_equal(len, sizeof payload);
    assert_memory_equal(got, payload, sizeof payload);
    /* Large, odd-sized ones too: the checksum runs in pieces as bytes
     * arrive, and in wide steps where the CPU allows. */
    for (uint64_t k = 0; k < 3; k++) {
        size_t blen = (size_t)100003 + k * 77777;
        uint8_t *pl = malloc(blen), *fr = malloc(48 + blen), *in = malloc(blen);
        fill(pl, blen, (uint32_t)k);
        xwrite(fd, fr, wire_frame(fr, 2, 1, 5, 7, 2 + k, pl, blen));
        assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 7, in, blen, &r), DSIM_OK);
        assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), &len), DSIM_OK);
        assert_int_equal(len, blen);
        assert_memory_equal(in, pl, blen);
        free(pl);
        free(fr);
        free(in);
    }
    /* One flipped payload bit: never delivered, counted, the link is gone. */
    assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 8, got, sizeof got, &r), DSIM_OK);
    size_t n = wire_frame(frame, 2, 1, 5, 8, 5, payload, sizeof payload);
    frame[48 + 10] ^= 0x04;
    xwrite(fd, frame, n);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
    assert_int_equal(dsim_last_error()->peer, 2);
    assert_non_null(strstr(dsim_errmsg(), "corrupt frame (checksum mismatch)"));
    assert_non_null(strstr(dsim_errmsg(), "peer 2"));
    dsim_ep_stats s;
    dsim_ep_get_stats(j.ep[1], &s);
    assert_int_equal(s.rejected_corrupt, 1);
    assert_int_equal(s.msgs_recv, 4);
    assert_true(raw_closed(fd, 2000));
    close(fd);
    /* Later receives from rank 2 fail at once; a new connection claiming
     * to be rank 2 is refused; the other links are untouched. */
    assert_int_equal(dsim_irecv(j.ep[1], 2, 9, 9, got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
    fd = raw_join(ports[1], 2, 1, 3, &st);
    assert_int_equal(st, 7); /* the link already broke */
    close(fd);
    dsim_req *q[2];
    uint32_t v = 42, w = 0;
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 1, &w, sizeof w, &q[0]), DSIM_OK);
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 1, &v, sizeof v, &q[1]), DSIM_OK);
    assert_int_equal(dsim_waitall(q, 2, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(w, 42);
    tjob_close(&j);
}

/* A frame with a sideband as the tcp backend writes it: the header with
 * DSIM_TP_F_SIDE, the 32 sideband bytes, the payload, one checksum over
 * all three. Returns its size. */
static size_t wire_side_frame(uint8_t *out, int src, int dst, uint32_t comm, uint32_t tag,
                              uint64_t seq, const uint8_t *side, const void *payload, size_t len)
{
    wire_frame(out, src, dst, comm, tag, seq, payload, len);
    out[6] = DSIM_TP_F_CHECKSUM | DSIM_TP_F_SIDE;
    memmove(out + 48 + DSIM_TP_SIDE_LEN, out + 48, len);
    memcpy(out + 48, side, DSIM_TP_SIDE_LEN);
    put32(out + 28, 0);
    put32(out + 28, crc32c(crc32c(0, out, 48), out + 48, DSIM_TP_SIDE_LEN + len));
    return 48 + DSIM_TP_SIDE_LEN + len;
}

/* The sideband on the wire: a hand-made frame that carries one hands it to
 * the receive; a data frame with a flag this version does not know is
 * refused as corrupt, naming the flag, and the link closes. */
static void test_sideband_frame(void **state)
{
    (void)state;
    dsim_log_set_handler(log_capture, NULL);
    log_reset();
    int ports[3];
    pick_ports(3, ports);
    tjob j;
    tjob_open(&j, 3, 0, 1, ports, NULL);
    int st;
    int fd = raw_join(ports[1], 2, 1, 3, &st);
    assert_int_equal(st, 0);
    uint8_t frame[48 + DSIM_TP_SIDE_LEN + 64], payload[64], got[64], side[DSIM_TP_SIDE_LEN],
        got_side[DSIM_TP_SIDE_LEN];
    fill(payload, sizeof payload, 3);
    fill(side, sizeof side, 4);
    xwrite(fd, frame, wire_side_frame(frame, 2, 1, 5, 7, 1, side, payload, sizeof payload));
    dsim_req *r;
    size_t len = 0;
    int has = -1;
    assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 7, got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait_side(r, dl(&j, LONG_NS), &len, got_side, &has), DSIM_OK);
    assert_int_equal(len, sizeof payload);
    assert_int_equal(has, 1);
    assert_memory_equal(got, payload, sizeof payload);
    assert_memory_equal(got_side, side, sizeof side);
    /* An unknown flag: never delivered, whatever its checksum. */
    assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 8, got, sizeof got, &r), DSIM_OK);
    size_t n = wire_frame(frame, 2, 1, 5, 8, 2, payload, sizeof payload);
    frame[6] |= 0x40;
    put32(frame + 28, 0);
    put32(frame + 28, crc32c(crc32c(0, frame, 48), payload, sizeof payload));
    xwrite(fd, frame, n);
    assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
    assert_non_null(strstr(dsim_errmsg(), "unknown flags 0x40"));
    assert_true(raw_closed(fd, 2000));
    close(fd);
    dsim_ep_stats s;
    dsim_ep_get_stats(j.ep[1], &s);
    assert_int_equal(s.rejected_corrupt, 1);
    /* Between backends of this build the sideband goes both ways. */
    dsim_req *q[2];
    uint32_t v = 42, w = 0;
    assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 1, &w, sizeof w, &q[0]), DSIM_OK);
    assert_int_equal(dsim_isend_side(j.ep[0], 1, 1, 1, &v, sizeof v, side, &q[1]), DSIM_OK);
    memset(got_side, 0, sizeof got_side);
    assert_int_equal(dsim_wait_side(q[0], dl(&j, LONG_NS), NULL, got_side, &has), DSIM_OK);
    assert_int_equal(dsim_wait(q[1], dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(has, 1);
    assert_int_equal(w, 42);
    assert_memory_equal(got_side, side, sizeof side);
    tjob_close(&j);
    dsim_log_set_handler(NULL, NULL);
}

/* A frame whose checksum covers its header and sideband only (flag 0x10,
 * as payload_checksum=0 writes it). Returns its size. */
static size_t wire_head_only(uint8_t *out, int src, int dst, uint32_t tag, uint64_t seq,
                             const uint8_t *side, const void *payload, size_t len)
{
    size_t n = side ? wire_side_frame(out, src, dst, 5, tag, seq, side, payload, len)
                    : wire_frame(out, src, dst, 5, tag, seq, payload, len);
    out[6] |= 0x10;
    put32(out + 28, 0);
    put32(out + 28, crc32c(crc32c(0, out, 48), out + 48, side ? DSIM_TP_SIDE_LEN : 0));
    return n;
}

/* payload_checksum: a fabric that wants its payloads checked refuses a
 * frame whose checksum leaves the payload out; one with payload_checksum=0
 * takes it, still refuses a damaged header or sideband, and still checks a
 * frame whose checksum covers its payload. */
static void test_head_only_frames(void **state)
{
    (void)state;
    expect_bad("payload_checksum=yes", 2, "payload_checksum=yes", "expected 1");
    int ports[3];
    uint8_t frame[48 + DSIM_TP_SIDE_LEN + 64], payload[64], got[64], side[DSIM_TP_SIDE_LEN],
        got_side[DSIM_TP_SIDE_LEN];
    fill(payload, sizeof payload, 5);
    fill(side, sizeof side, 6);
    dsim_req *r;
    size_t len = 0;
    int st, has = 0;
    for (int checked = 1; checked >= 0; checked--) {
        pick_ports(3, ports);
        tjob j;
        tjob_open(&j, 3, 0, 1, ports, checked ? NULL : "payload_checksum=0");
        int fd = raw_join(ports[1], 2, 1, 3, &st);
        assert_int_equal(st, 0);
        assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 7, got, sizeof got, &r), DSIM_OK);
        xwrite(fd, frame, wire_head_only(frame, 2, 1, 7, 1, NULL, payload, sizeof payload));
        if (checked) {
            assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
            assert_non_null(strstr(dsim_errmsg(), "leaves out the payload"));
            assert_non_null(strstr(dsim_errmsg(), "payload_checksum=1"));
            assert_true(raw_closed(fd, 2000));
            close(fd);
            tjob_close(&j);
            continue;
        }
        assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), &len), DSIM_OK);
        assert_int_equal(len, sizeof payload);
        assert_memory_equal(got, payload, sizeof payload);
        /* with a sideband, which the checksum covers */
        assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 7, got, sizeof got, &r), DSIM_OK);
        xwrite(fd, frame, wire_head_only(frame, 2, 1, 7, 2, side, payload, sizeof payload));
        assert_int_equal(dsim_wait_side(r, dl(&j, LONG_NS), &len, got_side, &has), DSIM_OK);
        assert_int_equal(has, 1);
        assert_memory_equal(got_side, side, sizeof side);
        assert_memory_equal(got, payload, sizeof payload);
        /* a full checksum is still checked: one flipped payload bit */
        assert_int_equal(dsim_irecv(j.ep[1], 2, 5, 7, got, sizeof got, &r), DSIM_OK);
        size_t n = wire_frame(frame, 2, 1, 5, 7, 3, payload, sizeof payload);
        frame[48 + 3] ^= 0x01;
        xwrite(fd, frame, n);
        assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
        assert_non_null(strstr(dsim_errmsg(), "checksum mismatch"));
        close(fd);
        /* a damaged sideband, then a damaged header (the tag) */
        for (int k = 0; k < 2; k++) {
            tjob_close(&j);
            pick_ports(3, ports);
            tjob_open(&j, 3, 0, 1, ports, "payload_checksum=0");
            fd = raw_join(ports[1], 2, 1, 3, &st);
            assert_int_equal(st, 0);
            assert_int_equal(dsim_irecv(j.ep[1], 2, 5, DSIM_ANY_TAG, got, sizeof got, &r), DSIM_OK);
            n = wire_head_only(frame, 2, 1, 7, 1, side, payload, sizeof payload);
            frame[k ? 24 : 48 + 5] ^= 0x02;
            xwrite(fd, frame, n);
            assert_int_equal(dsim_wait(r, dl(&j, LONG_NS), NULL), DSIM_EPROTO);
            assert_non_null(strstr(dsim_errmsg(), "checksum mismatch"));
            close(fd);
        }
        tjob_close(&j);
    }
}

/* One bad connection per case, each on a fresh fabric; the fabric stays
 * usable and closes without leaks. */
static void test_garbage_refused(void **state)
{
    (void)state;
    dsim_log_set_handler(log_capture, NULL);
    for (int kase = 0; kase < 11; kase++) {
        int ports[3];
        pick_ports(3, ports);
        tjob j;
        tjob_open(&j, 3, 0, 1, ports, "connect_timeout=1s");
        log_reset();
        int st = 0, fd;
        uint8_t buf[256];
        dsim_req *r;
        uint8_t got[16];
        assert_int_equal(dsim_irecv(j.ep[0], 2, 1, 1, got, sizeof got, &r), DSIM_OK);
        dsim_err want = DSIM_ETIMEDOUT;
        const char *says = NULL;
        switch (kase) {
        case 0: /* not the protocol at all */
            fd = raw_connect(ports[0]);
            xwrite(fd, "GET / HTTP/1.0\r\nHost: x\r\n\r\n", 27);
            assert_true(raw_closed(fd, 2000));
            assert_true(log_has("not a dsim tcp handshake"));
            break;
        case 1: /* the wrong rank */
            fd = raw_join(ports[0], 2, 1, 3, &st);
            assert_int_equal(st, 2);
            assert_true(raw_closed(fd, 2000));
            assert_true(log_has("refused a connection"));
            break;
        case 2: /* another job size */
            fd = raw_join(ports[0], 2, 0, 4, &st);
            assert_int_equal(st, 3);
            assert_true(raw_closed(fd, 2000));
            break;
        case 3: /* half a handshake, then gone */
            fd = raw_connect(ports[0]);
            wire_hello(buf, HELLO_MAGIC, 2, 0, 3);
            xwrite(fd, buf, 10);
            close(fd);
            fd = -1;
            break;
        case 4: /* half a handshake, then silence: dropped after connect_timeout */
            fd = raw_connect(ports[0]);
            wire_hello(buf, HELLO_MAGIC, 2, 0, 3);
            xwrite(fd, buf, 10);
            assert_true(raw_closed(fd, 4000));
            assert_true(log_has("sent no handshake"));
            break;
        case 5: /* a header claiming a huge payload */
            fd = raw_join(ports[0], 2, 0, 3, &st);
            assert_int_equal(st, 0);
            wire_frame(buf, 2, 0, 1, 1, 1, "", 0);
            put64(buf + 40, (uint64_t)1 << 39);
            xwrite(fd, buf, 48);
            assert_true(raw_closed(fd, 2000));
            want = DSIM_EPROTO;
            says = "absurd length";
            break;
        case 6: /* garbage after a good handshake */
            fd = raw_join(ports[0], 2, 0, 3, &st);
            assert_int_equal(st, 0);
            for (int i = 0; i < 64; i++)
                buf[i] = (uint8_t)(i * 37 + 11);
            xwrite(fd, buf, 64);
            assert_true(raw_closed(fd, 2000));
            want = DSIM_EPROTO;
            says = "bad magic";
            break;
        case 7: /* half a frame, then gone */
            fd = raw_join(ports[0], 2, 0, 3, &st);
            assert_int_equal(st, 0);
            {
                uint8_t pl[100];
                memset(pl, 1, sizeof pl);
                wire_frame(buf, 2, 0, 1, 1, 1, pl, sizeof pl);
            }
            xwrite(fd, buf, 48 + 40);
            close(fd);
            fd = -1;
            want = DSIM_EPEER;
            says = "closed the connection in the middle of a frame";
            break;
        case 8: /* a frame on rank 2's connection claiming to come from rank 1: refused
                 * and logged, not delivered as rank 1's; the link stays up */
            fd = raw_join(ports[0], 2, 0, 3, &st);
            assert_int_equal(st, 0);
            {
                uint32_t one = 1;
                xwrite(fd, buf, wire_frame(buf, 1, 0, 1, 1, 1, &one, sizeof one));
                for (int i = 0; i < 200 && !log_has("claiming to come from rank 1"); i++)
                    usleep(10000);
                assert_true(log_has("refused a frame on peer 2's connection"));
                assert_true(log_has("claiming to come from rank 1"));
            }
            break;
        case 9: /* a frame on a communicator and tag nothing uses (the largest ids):
                 * held, not delivered to anything else, and listed as unreceived,
                 * which the training driver logs when its job ends */
            fd = raw_join(ports[0], 2, 0, 3, &st);
            assert_int_equal(st, 0);
            {
                uint32_t one = 1;
                dsim_unreceived u[2];
                xwrite(fd, buf, wire_frame(buf, 2, 0, UINT32_MAX, UINT32_MAX - 1, 1, &one, 4));
                for (int i = 0; i < 200 && !dsim_ep_unreceived(j.ep[0], NULL, 0, u, 2); i++)
                    usleep(10000);
                assert_int_equal(dsim_ep_unreceived(j.ep[0], NULL, 0, u, 2), 1);
                assert_int_equal(u[0].src, 2);
                assert_int_equal(u[0].comm_id, UINT32_MAX);
                assert_int_equal(u[0].tag, UINT32_MAX - 1);
            }
            break;
        default: /* a second connection claiming a rank already connected */
            fd = raw_join(ports[0], 2, 0, 3, &st);
            assert_int_equal(st, 0);
            {
                int fd2 = raw_join(ports[0], 2, 0, 3, &st);
                assert_int_equal(st, 6);
                assert_true(raw_closed(fd2, 2000));
                close(fd2);
            }
            break;
        }
        dsim_err e = dsim_wait(r, dl(&j, want == DSIM_ETIMEDOUT ? 50 * MS : LONG_NS), NULL);
        if (e != want)
            fail_msg("case %d: the receive gave %s (%s), expected %s", kase, dsim_strerror(e),
                     dsim_errmsg(), dsim_strerror(want));
        if (says && !strstr(dsim_errmsg(), says))
            fail_msg("case %d: '%s' does not say '%s'", kase, dsim_errmsg(), says);
        dsim_ep_stats s;
        dsim_ep_get_stats(j.ep[0], &s);
        /* the spoofed frame (case 8) is counted too */
        assert_int_equal(s.rejected_corrupt, want == DSIM_EPROTO || kase == 8 ? 1 : 0);
        if (fd >= 0)
            close(fd);
        /* Still a working fabric. */
        uint32_t v = 7, w = 0;
        dsim_req *q[2];
        assert_int_equal(dsim_irecv(j.ep[0], 1, 1, 2, &w, sizeof w, &q[0]), DSIM_OK);
        assert_int_equal(dsim_isend(j.ep[1], 0, 1, 2, &v, sizeof v, &q[1]), DSIM_OK);
        assert_int_equal(dsim_waitall(q, 2, dl(&j, LONG_NS), NULL), DSIM_OK);
        assert_int_equal(w, 7);
        tjob_close(&j);
    }
    dsim_log_set_handler(NULL, NULL);
}

/* ---- peers that go away ---- */

typedef struct waiter {
    tjob *j;
    int rank, peer;
    dsim_err rc;
    int64_t woke;
    char msg[512];
} waiter;

static void recv_waiter(void *p)
{
    waiter *w = p;
    uint8_t b[16];
    dsim_req *r;
    w->rc = dsim_irecv(w->j->ep[w->rank], w->peer, 3, 3, b, sizeof b, &r);
    if (w->rc == DSIM_OK)
        w->rc = dsim_wait(r, dsim_rt_deadline(w->j->rt, 10000 * MS), NULL);
    w->woke = dsim_rt_now(w->j->rt);
    snprintf(w->msg, sizeof w->msg, "%s", dsim_errmsg());
}

static void peer_goes(int reset)
{
    int ports[2];
    pick_ports(2, ports);
    tjob j;
    tjob_open(&j, 2, 0, 0, ports, NULL);
    int st;
    int fd = raw_join(ports[0], 1, 0, 2, &st);
    assert_int_equal(st, 0);
    waiter w = {.j = &j, .rank = 0, .peer = 1};
    dsim_task *t;
    assert_int_equal(dsim_rt_spawn(j.rt, 0, recv_waiter, &w, &t), DSIM_OK);
    dsim_rt_sleep_until(j.rt, dl(&j, 50 * MS));
    int64_t t0 = dsim_rt_now(j.rt);
    if (reset) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
    assert_int_equal(dsim_rt_join(j.rt, t), DSIM_OK);
    assert_int_equal(w.rc, DSIM_EPEER);
    if (w.woke - t0 > 1000 * MS)
        fail_msg("the receive failed %lld ms after the close", (long long)((w.woke - t0) / MS));
    assert_non_null(
        strstr(w.msg, reset ? "connection to peer 1 reset" : "peer 1 closed the connection"));
    tjob_close(&j);
}

static void test_peer_closes(void **state)
{
    (void)state;
    peer_goes(0);
}

static void test_peer_resets(void **state)
{
    (void)state;
    peer_goes(1);
}

/* The sending side: rank 1 (raw) takes one frame and hangs up; later sends
 * to it fail with EPEER, promptly. */
static void test_send_after_peer_closed(void **state)
{
    (void)state;
    int ports[2];
    pick_ports(2, ports);
    int lfd = raw_listen(ports[1]);
    tjob j;
    tjob_open(&j, 2, 0, 0, ports, NULL);
    uint32_t v = 1;
    dsim_req *s;
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 1, &v, sizeof v, &s), DSIM_OK);
    int fd = raw_serve(lfd, 1, 2);
    uint8_t frame[52];
    assert_int_equal(xread(fd, frame, sizeof frame, 5000), sizeof frame);
    assert_int_equal(get32(frame), DSIM_TP_MAGIC);
    uint8_t z[52];
    memcpy(z, frame, sizeof z);
    memset(z + 28, 0, 4);
    assert_int_equal(get32(frame + 28), crc32c(crc32c(0, z, 48), z + 48, 4));
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    size_t blen = 300001;
    uint8_t *big = malloc(blen), *wire = malloc(48 + blen);
    fill(big, blen, 5);
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 2, big + 1, blen - 1, &s), DSIM_OK);
    assert_int_equal(xread(fd, wire, 48 + blen - 1, 5000), 48 + blen - 1);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    assert_memory_equal(wire + 48, big + 1, blen - 1);
    uint32_t sent = get32(wire + 28);
    memset(wire + 28, 0, 4);
    assert_int_equal(sent, crc32c(crc32c(0, wire, 48), wire + 48, blen - 1));
    free(big);
    free(wire);
    int64_t t0 = dsim_rt_now(j.rt);
    close(fd);
    dsim_err e = DSIM_OK;
    while (e == DSIM_OK && dsim_rt_now(j.rt) - t0 < 3000 * MS) {
        e = dsim_isend(j.ep[0], 1, 1, 1, &v, sizeof v, &s);
        if (e == DSIM_OK)
            e = dsim_wait(s, dl(&j, 200 * MS), NULL);
        if (e == DSIM_OK)
            dsim_rt_sleep_until(j.rt, dl(&j, 5 * MS));
    }
    assert_int_equal(e, DSIM_EPEER);
    assert_int_equal(dsim_last_error()->peer, 1);
    assert_non_null(strstr(dsim_errmsg(), "peer 1"));
    assert_true(dsim_rt_now(j.rt) - t0 < 2000 * MS);
    /* And it stays that way. */
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 1, &v, sizeof v, &s), DSIM_EPEER);
    close(lfd);
    tjob_close(&j);
}

/* ---- connecting ---- */

/* Rank 1's process starts 300 ms after rank 0's first send to it. */
static void test_late_listener(void **state)
{
    (void)state;
    int ports[2];
    pick_ports(2, ports);
    tjob a, b;
    tjob_open(&a, 2, 0, 0, ports, NULL);
    uint8_t s[100000], d[100000];
    fill(s, sizeof s, 9);
    dsim_req *sr, *rr;
    int64_t t0 = dsim_rt_now(a.rt);
    assert_int_equal(dsim_isend(a.ep[0], 1, 2, 2, s, sizeof s, &sr), DSIM_OK);
    dsim_rt_sleep_until(a.rt, dsim_rt_deadline(a.rt, 300 * MS));
    tjob_open(&b, 2, 1, 1, ports, NULL);
    assert_int_equal(dsim_irecv(b.ep[1], 0, 2, 2, d, sizeof d, &rr), DSIM_OK);
    assert_int_equal(dsim_wait(rr, dl(&b, 10000 * MS), NULL), DSIM_OK);
    assert_int_equal(dsim_wait(sr, dl(&a, 10000 * MS), NULL), DSIM_OK);
    assert_memory_equal(s, d, sizeof d);
    int64_t took = dsim_rt_now(a.rt) - t0;
    print_message("late listener reached after %lld ms\n", (long long)(took / MS));
    assert_true(took < 3000 * MS);
    tjob_close(&b);
    tjob_close(&a);
}

/* A send withdrawn before its connection came up leaves no gap: the next
 * message is delivered, not failed as "lost". */
static void test_withdrawn_leaves_no_gap(void **state)
{
    (void)state;
    int ports[2];
    pick_ports(2, ports);
    tjob a, b;
    tjob_open(&a, 2, 0, 0, ports, NULL);
    uint32_t v1 = 1, v2 = 2, got = 0;
    dsim_req *s, *r;
    assert_int_equal(dsim_isend(a.ep[0], 1, 4, 1, &v1, sizeof v1, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&a, 30 * MS), NULL), DSIM_ETIMEDOUT);
    tjob_open(&b, 2, 1, 1, ports, NULL);
    assert_int_equal(dsim_isend(a.ep[0], 1, 4, 2, &v2, sizeof v2, &s), DSIM_OK);
    assert_int_equal(dsim_irecv(b.ep[1], 0, 4, 2, &got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&b, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(got, 2);
    assert_int_equal(dsim_wait(s, dl(&a, LONG_NS), NULL), DSIM_OK);
    assert_int_equal(dsim_irecv(b.ep[1], 0, 4, 1, &got, sizeof got, &r), DSIM_OK);
    assert_int_equal(dsim_wait(r, dl(&b, 50 * MS), NULL), DSIM_ETIMEDOUT);
    dsim_ep_stats st;
    dsim_ep_get_stats(b.ep[1], &st);
    assert_int_equal(st.msgs_recv, 1);
    assert_int_equal(st.rejected_stale + st.rejected_corrupt, 0);
    tjob_close(&b);
    tjob_close(&a);
}

/* Frames of odd sizes back to back, each read with others in one go: a
 * reducing receive still gets its elements at an aligned address (UBSan
 * checks the loads). */
static void test_reduce_after_odd_frames(void **state)
{
    (void)state;
    int ports[2];
    pick_ports(2, ports);
    tjob j;
    tjob_open(&j, 2, 0, 1, ports, NULL);
    for (int round = 0; round < 20; round++) {
        uint8_t odd[7] = {1, 2, 3, 4, 5, 6, 7}, odd_in[7];
        double x[5] = {1, 2, 3, 4, 5}, y[5] = {10, 20, 30, 40, 50};
        dsim_req *q[4];
        assert_int_equal(dsim_isend(j.ep[0], 1, 1, 1, odd, (size_t)(round % 7) + 1, &q[0]),
                         DSIM_OK);
        assert_int_equal(dsim_isend(j.ep[0], 1, 1, 2, y, sizeof y, &q[1]), DSIM_OK);
        assert_int_equal(dsim_irecv(j.ep[1], 0, 1, 1, odd_in, sizeof odd_in, &q[2]), DSIM_OK);
        assert_int_equal(dsim_irecv_reduce(j.ep[1], 0, 1, 2, x, 5, DSIM_F64, DSIM_SUM, &q[3]),
                         DSIM_OK);
        assert_int_equal(dsim_waitall(q, 4, dl(&j, LONG_NS), NULL), DSIM_OK);
        for (int i = 0; i < 5; i++)
            assert_true(x[i] == (i + 1) * 11.0);
    }
    tjob_close(&j);
}

/* Sends to a peer that never answers fail by their deadline, not later. */
static void test_never_accepted(void **state)
{
    (void)state;
    int ports[3];
    pick_ports(3, ports);
    /* Rank 1: a listener nobody accepts on (the kernel completes connects
     * into its backlog, but no hello reply ever comes). Rank 2: nothing. */
    int lfd = raw_listen(ports[1]);
    tjob j;
    tjob_open(&j, 3, 0, 0, ports, "connect_timeout=1500ms");
    uint8_t *big = calloc(1, 4u << 20);
    for (int to = 1; to <= 2; to++) {
        dsim_req *s;
        int64_t t0 = dsim_rt_now(j.rt);
        assert_int_equal(dsim_isend(j.ep[0], to, 1, 1, big, 4u << 20, &s), DSIM_OK);
        assert_int_equal(dsim_wait(s, dl(&j, 200 * MS), NULL), DSIM_ETIMEDOUT);
        int64_t took = dsim_rt_now(j.rt) - t0;
        assert_true(took >= 190 * MS && took < 1000 * MS);
        assert_int_equal(dsim_last_error()->peer, to);
    }
    /* After connect_timeout the link is given up: sends fail at once. */
    dsim_rt_sleep_until(j.rt, dl(&j, 1800 * MS));
    for (int to = 1; to <= 2; to++) {
        dsim_req *s;
        assert_int_equal(dsim_isend(j.ep[0], to, 1, 1, big, 16, &s), DSIM_EPEER);
        assert_int_equal(dsim_last_error()->peer, to);
        const char *says = to == 1 ? "sent no reply to the handshake" : "could not connect";
        if (!strstr(dsim_errmsg(), says))
            fail_msg("rank %d: '%s' does not say '%s'", to, dsim_errmsg(), says);
    }
    free(big);
    close(lfd);
    tjob_close(&j);
}

/* A peer that accepts and then stops reading: the sender is back by its
 * deadline, and what it queued behind the stuck frame is withdrawn. */
static void test_paused_peer(void **state)
{
    (void)state;
    int ports[2];
    pick_ports(2, ports);
    int lfd = raw_listen(ports[1]);
    tjob j;
    tjob_open(&j, 2, 0, 0, ports, NULL);
    size_t len = (size_t)64 << 20;
    uint8_t *big = malloc(len);
    memset(big, 0x5A, len);
    dsim_req *s;
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 1, &len, 1, &s), DSIM_OK);
    int fd = raw_serve(lfd, 1, 2);
    assert_int_equal(dsim_wait(s, dl(&j, LONG_NS), NULL), DSIM_OK);
    int64_t t0 = dsim_rt_now(j.rt);
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 2, big, len, &s), DSIM_OK);
    dsim_err e = dsim_wait(s, dl(&j, 300 * MS), NULL);
    int64_t took = dsim_rt_now(j.rt) - t0;
    /* Partly written, so finished from a copy (OK), or never started. */
    assert_true(e == DSIM_OK || e == DSIM_ETIMEDOUT);
    assert_true(took < 1500 * MS);
    memset(big, 0, len); /* the caller's buffer is free again */
    free(big);
    uint32_t v = 3;
    t0 = dsim_rt_now(j.rt);
    assert_int_equal(dsim_isend(j.ep[0], 1, 1, 3, &v, sizeof v, &s), DSIM_OK);
    assert_int_equal(dsim_wait(s, dl(&j, 100 * MS), NULL), DSIM_ETIMEDOUT);
    assert_true(dsim_rt_now(j.rt) - t0 < 1000 * MS);
    /* Closing with the stuck frame still queued does not hang or leak. */
    tjob_close(&j);
    close(fd);
    close(lfd);
}

/* ---- abort between fabrics ---- */

static void test_abort_between_fabrics(void **state)
{
    (void)state;
    int ports[3];
    pick_ports(3, ports);
    tjob a, b;
    tjob_open(&a, 3, 0, 1, ports, NULL);
    tjob_open(&b, 3, 2, 2, ports, NULL);
    /* Both directions, so connections exist each way. */
    for (int src = 0; src < 3; src++)
        for (int dst = 0; dst < 3; dst++) {
            if ((src == 2) == (dst == 2))
                continue;
            tjob *js = src == 2 ? &b : &a, *jd = dst == 2 ? &b : &a;
            uint32_t v = (uint32_t)(src * 10 + dst), w = 0;
            dsim_req *s, *r;
            assert_int_equal(dsim_isend(js->ep[src], dst, 1, 1, &v, sizeof v, &s), DSIM_OK);
            assert_int_equal(dsim_irecv(jd->ep[dst], src, 1, 1, &w, sizeof w, &r), DSIM_OK);
            assert_int_equal(dsim_wait(r, dl(jd, LONG_NS), NULL), DSIM_OK);
            assert_int_equal(dsim_wait(s, dl(js, LONG_NS), NULL), DSIM_OK);
            assert_int_equal(w, v);
        }
    waiter w = {.j = &b, .rank = 2, .peer = 0};
    dsim_task *t;
    assert_int_equal(dsim_rt_spawn(b.rt, 2, recv_waiter, &w, &t), DSIM_OK);
    dsim_rt_sleep_until(a.rt, dl(&a, 50 * MS));
    int64_t t0 = dsim_rt_now(a.rt);
    dsim_ep_abort(a.ep[1], 0, "rank 0 lost power");
    assert_int_equal(dsim_rt_join(b.rt, t), DSIM_OK);
    assert_int_equal(w.rc, DSIM_EABORTED);
    assert_non_null(strstr(w.msg, "rank 0 lost power"));
    assert_non_null(strstr(w.msg, "failed rank 0"));
    assert_true(w.woke - t0 < 2000 * MS);
    assert_true(dsim_fabric_aborted(b.f));
    tjob_close(&b);
    tjob_close(&a);
}

/* ---- two processes ---- */

/* One side of a 4-rank job: side 0 hosts ranks 0-1, side 1 ranks 2-3.
 * `aborter` revokes after the exchange and the other side must see it.
 * Returns 0, or the line that failed (the child cannot use cmocka). */
#define SIDE_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "side %d: %s failed at line %d: %s\n", side, #cond, __LINE__,          \
                    dsim_errmsg());                                                                \
            rc = __LINE__;                                                                         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static int pipe_get(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    char c = 0;
    if (poll(&pf, 1, 20000) <= 0 || read(fd, &c, 1) != 1)
        return -1;
    return c;
}

static int side_run(int side, const int *ports, int aborter, int rfd, int wfd)
{
    tjob j;
    int rc = 0;
    int lo = side ? 2 : 0, hi = lo + 1;
    static const size_t lens[] = {8, 70000, 3u << 20};
    uint8_t *sb[2][2][3], *rb[2][2][3];
    memset(sb, 0, sizeof sb);
    memset(rb, 0, sizeof rb);
    SIDE_CHECK(tjob_try(&j, 4, lo, hi, ports, NULL) == DSIM_OK);
    dsim_req *reqs[2 * 2 * 2 * 3];
    int k = 0;
    for (int r = lo; r <= hi; r++)
        for (int qi = 0; qi < 2; qi++) {
            int q = (side ? 0 : 2) + qi;
            for (int m = 0; m < 3; m++) {
                sb[r - lo][qi][m] = malloc(lens[m]);
                rb[r - lo][qi][m] = malloc(lens[m]);
                fill(sb[r - lo][qi][m], lens[m], (uint32_t)(r * 100 + q * 10 + m));
                SIDE_CHECK(dsim_irecv(j.ep[r], q, 7, (uint32_t)m, rb[r - lo][qi][m], lens[m],
                                      &reqs[k++]) == DSIM_OK);
                SIDE_CHECK(dsim_isend(j.ep[r], q, 7, (uint32_t)m, sb[r - lo][qi][m], lens[m],
                                      &reqs[k++]) == DSIM_OK);
            }
        }
    SIDE_CHECK(dsim_waitall(reqs, k, dsim_rt_deadline(j.rt, LONG_NS), NULL) == DSIM_OK);
    for (int r = lo; r <= hi; r++)
        for (int qi = 0; qi < 2; qi++) {
            int q = (side ? 0 : 2) + qi;
            for (int m = 0; m < 3; m++) {
                uint8_t *want = malloc(lens[m]);
                fill(want, lens[m], (uint32_t)(q * 100 + r * 10 + m));
                int same = memcmp(want, rb[r - lo][qi][m], lens[m]) == 0;
                free(want);
                SIDE_CHECK(same);
            }
        }
    int other = side ? 0 : 2;
    if (side == aborter) {
        SIDE_CHECK(pipe_get(rfd) == 'r'); /* the other side waits on a receive */
        dsim_ep_abort(j.ep[lo], lo + 1, side ? "side 1 saw rank 3 fail" : "side 0 saw rank 1 fail");
        SIDE_CHECK(pipe_get(rfd) == 's'); /* and saw the abort */
    } else {
        uint8_t b[8];
        dsim_req *r;
        SIDE_CHECK(dsim_irecv(j.ep[lo], other, 9, 9, b, sizeof b, &r) == DSIM_OK);
        SIDE_CHECK(write(wfd, "r", 1) == 1);
        dsim_err e = dsim_wait(r, dsim_rt_deadline(j.rt, 15000 * MS), NULL);
        SIDE_CHECK(e == DSIM_EABORTED);
        SIDE_CHECK(strstr(dsim_errmsg(),
                          aborter ? "side 1 saw rank 3 fail" : "side 0 saw rank 1 fail") != NULL);
        SIDE_CHECK(dsim_last_error()->peer == (aborter ? 3 : 1));
        SIDE_CHECK(dsim_fabric_aborted(j.f));
        SIDE_CHECK(write(wfd, "s", 1) == 1);
    }
out:
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int m = 0; m < 3; m++) {
                free(sb[a][b][m]);
                free(rb[a][b][m]);
            }
    tjob_close(&j);
    return rc;
}

static void test_two_processes(void **state)
{
    (void)state;
    for (int aborter = 1; aborter >= 0; aborter--) {
        int ports[4];
        pick_ports(4, ports);
        int to_child[2], to_parent[2];
        assert_int_equal(pipe(to_child), 0);
        assert_int_equal(pipe(to_parent), 0);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(to_child[1]);
            close(to_parent[0]);
            int rc = side_run(1, ports, aborter, to_child[0], to_parent[1]);
            _exit(rc ? 1 : 0);
        }
        close(to_child[0]);
        close(to_parent[1]);
        int rc = side_run(0, ports, aborter, to_parent[0], to_child[1]);
        close(to_child[1]);
        close(to_parent[0]);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (rc)
            fail_msg("side 0 failed at line %d (aborter: side %d)", rc, aborter);
        assert_true(WIFEXITED(status));
        if (WEXITSTATUS(status) != 0)
            fail_msg("side 1 (the child) failed (aborter: side %d); see its stderr", aborter);
    }
}

/* ---- the cluster secret ---- */

static void secret_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* One exchange from rank 2 (in b) to rank 0 (in a); the send's status. */
static dsim_err secret_send(tjob *a, tjob *b, char *msg, size_t cap)
{
    uint32_t v = 42, w = 0;
    dsim_req *s, *r;
    assert_int_equal(dsim_irecv(a->ep[0], 2, 1, 1, &w, sizeof w, &r), DSIM_OK);
    assert_int_equal(dsim_isend(b->ep[2], 0, 1, 1, &v, sizeof v, &s), DSIM_OK);
    dsim_err e = dsim_wait(s, dl(b, 5000 * MS), NULL);
    snprintf(msg, cap, "%s", dsim_errmsg());
    if (e == DSIM_OK) {
        assert_int_equal(dsim_wait(r, dl(a, 5000 * MS), NULL), DSIM_OK);
        assert_int_equal(w, 42);
    } else {
        dsim_req_cancel(r);
    }
    return e;
}

/* Known answers: FIPS 180-4's "abc" and RFC 4231's test case 2. */
static void test_sha256_hmac(void **state)
{
    (void)state;
    static const uint8_t abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                                    0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                    0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                                    0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    static const uint8_t rfc2[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e,
                                     0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
                                     0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83,
                                     0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
    uint8_t out[32];
    dsim_sha256("abc", 3, out);
    assert_memory_equal(out, abc, 32);
    const char *msg = "what do ya want for nothing?";
    const void *parts[2] = {msg, msg + 10};
    size_t lens[2] = {10, strlen(msg) - 10};
    dsim_hmac_sha256((const uint8_t *)"Jefe", 4, parts, lens, 2, out);
    assert_memory_equal(out, rfc2, 32);
    assert_true(dsim_auth_equal(out, rfc2, 32));
    out[31] ^= 1;
    assert_false(dsim_auth_equal(out, rfc2, 32));
}

static void test_secret(void **state)
{
    (void)state;
    dsim_log_set_handler(log_capture, NULL);
    char f1[] = "/tmp/dsim-secret-1-XXXXXX", f2[] = "/tmp/dsim-secret-2-XXXXXX";
    int fd1 = mkstemp(f1), fd2 = mkstemp(f2);
    assert_true(fd1 >= 0 && fd2 >= 0);
    close(fd1);
    close(fd2);
    secret_file(f1, "correct horse battery staple\n");
    secret_file(f2, "a stray peer's guess\n");
    char o1[256], o2[256], msg[600];
    snprintf(o1, sizeof o1, "connect_timeout=2s,secret_file=%s", f1);
    snprintf(o2, sizeof o2, "connect_timeout=2s,secret_file=%s", f2);
    for (int kase = 0; kase < 4; kase++) {
        int ports[3];
        pick_ports(3, ports);
        tjob a, b;
        log_reset();
        tjob_open(&a, 3, 0, 1, ports, o1);
        const char *bo = kase == 0 ? o1 : kase == 1 ? o2 : "connect_timeout=2s";
        if (kase == 3) {
            /* a raw peer that skips the challenge: refused with the reason */
            int fd = raw_connect(ports[0]);
            uint8_t ch[24], h[24], ack[56];
            assert_int_equal(xread(fd, ch, sizeof ch, 2000), sizeof ch);
            assert_int_equal(get32(ch), 0x4e545344u); /* "DSTN" */
            wire_hello(h, HELLO_MAGIC, 2, 0, 3);
            xwrite(fd, h, sizeof h);
            assert_int_equal(xread(fd, ack, sizeof ack, 2000), sizeof ack);
            assert_int_equal(ack[6], 8); /* TCP_REFUSE_AUTH */
            assert_true(raw_closed(fd, 2000));
            assert_true(log_has("did not prove that it knows the cluster secret"));
            close(fd);
            tjob_close(&a);
            continue;
        }
        tjob_open(&b, 3, 2, 2, ports, bo);
        dsim_err e = secret_send(&a, &b, msg, sizeof msg);
        if (kase == 0) {
            assert_int_equal(e, DSIM_OK);
        } else if (kase == 1) {
            assert_int_equal(e, DSIM_EPEER);
            assert_non_null(strstr(msg, "did not prove that it knows the cluster secret"));
            assert_true(log_has("refused a connection"));
        } else {
            assert_int_equal(e, DSIM_EPEER);
            assert_non_null(strstr(msg, "demands the cluster secret"));
        }
        tjob_close(&b);
        tjob_close(&a);
    }
    /* a bad secret file is a clear error naming it */
    char bad[600];
    snprintf(bad, sizeof bad, "secret_file=%s.missing", f1);
    int ports[3];
    pick_ports(3, ports);
    tjob c;
    assert_int_not_equal(tjob_try(&c, 3, 0, 1, ports, bad), DSIM_OK);
    assert_non_null(strstr(dsim_errmsg(), ".missing"));
    unlink(f1);
    unlink(f2);
    dsim_log_set_handler(NULL, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_corrupt_frame),
        cmocka_unit_test(test_sideband_frame),
        cmocka_unit_test(test_head_only_frames),
        cmocka_unit_test(test_garbage_refused),
        cmocka_unit_test(test_peer_closes),
        cmocka_unit_test(test_peer_resets),
        cmocka_unit_test(test_send_after_peer_closed),
        cmocka_unit_test(test_late_listener),
        cmocka_unit_test(test_withdrawn_leaves_no_gap),
        cmocka_unit_test(test_reduce_after_odd_frames),
        cmocka_unit_test(test_never_accepted),
        cmocka_unit_test(test_paused_peer),
        cmocka_unit_test(test_abort_between_fabrics),
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_sha256_hmac),
        cmocka_unit_test(test_secret),
    };
    return cmocka_run_group_tests_name("tcp", tests, NULL, NULL);
}
