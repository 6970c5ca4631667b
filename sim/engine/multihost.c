/* The rendezvous of dsim worker processes (multihost.h).
 *
 *   chief (worker id 0)                      another task
 *   -------------------                      ------------
 *   bind its ranks + the results port        bind its ranks
 *   accept ──────────────────────────────── connect (retry, backoff)
 *   "DSWN" version nonce_c ───────────────>
 *                      <──────────────────── "DSWH" hello (task, size, flags,
 *                                              build, scenario hash)
 *                                              HMAC("dsim-worker-hello",
 *                                              nonce_c, hello), nonce_a
 *   judge it; "DSWA" status ──────────────>  judge the MAC of the answer
 *     HMAC("dsim-worker-ack", nonce_a, ack)
 *
 * Without a secret the MACs are zeros and not judged; a side with a secret
 * refuses a side without one (flags say which it was, for the message). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dsim/log.h"
#include "multihost.h"
#include "proc_wire.h"

#define MH_CHAL      0x4e575344u /* "DSWN" */
#define MH_HELLO     0x48575344u /* "DSWH" */
#define MH_ACK       0x41575344u /* "DSWA" */
#define MH_VERSION   1u
#define MH_HELLO_LEN 56
#define MH_MS        1000000LL

enum {
    MH_OK = 0,
    MH_NO_SECRET,
    MH_BAD_MAC,
    MH_SCENARIO,
    MH_TASK,
    MH_DUP,
    MH_BUILD,
    MH_VERSIONS,
    MH_NREASONS
};
static const char *const mh_reason[MH_NREASONS] = {
    "accepted",
    "it did not prove that it knows the cluster secret",
    "its proof of the cluster secret is wrong (another secret?)",
    "it runs another scenario (the SHA-256 of the scenario files differ)",
    "it names a task this job does not have (another TF_CONFIG?)",
    "that task has already joined",
    "it is another dsim build (the record layouts differ)",
    "it speaks another version of the rendezvous",
};

/* The layouts that cross the wire as they are. */
#define MH_BUILD_TAG                                                                               \
    ((uint32_t)(sizeof(dsim_train_step_info) * 131u + sizeof(dsim_fault_event) * 7u +              \
                sizeof(dsim_train_replica_end) * 3u + sizeof(dsim_faults_stats)))

static int64_t mh_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void mh_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t mh_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Exactly n bytes before the deadline; 0, or -1 on EOF/error/timeout. */
static int mh_recv(int fd, void *p, size_t n, int64_t deadline)
{
    char *b = p;
    while (n) {
        int64_t left = deadline - mh_now();
        if (left <= 0)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int rc = poll(&pf, 1, (int)(left / MH_MS) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return -1;
        ssize_t r = recv(fd, b, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static int mh_send(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* "HOST:PORT" (IPv6 in brackets) into host and port. */
static dsim_err mh_split(const char *what, const char *addr, char *host, size_t cap, int *port)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: address '%s' is not HOST:PORT", what, addr);
    size_t hl = (size_t)(colon - addr);
    const char *h = addr;
    if (*h == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= cap)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: host name in '%s' is too long", what, addr);
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end = NULL;
    long p = strtol(colon + 1, &end, 10);
    if (!end || *end || p < 1 || p > 65535)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: port in '%s' is not 1..65535", what, addr);
    *port = (int)p;
    return DSIM_OK;
}

static void mh_fmt(char *out, size_t cap, const char *host, int port)
{
    if (strchr(host, ':'))
        snprintf(out, cap, "[%s]:%d", host, port);
    else
        snprintf(out, cap, "%s:%d", host, port);
}

/* A listener on host:port; the wildcard address of the family when host is
 * not an address of this machine (a name that resolves to a service IP). */
static dsim_err mh_listen(const char *what, const char *host, int port, int *fd_out)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &res);
    if (gai != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: cannot resolve host '%s': %s", what, host,
                        gai_strerror(gai));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    int err = 0;
    if (fd < 0) {
        err = errno;
    } else {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
            err = errno;
            if (err == EADDRNOTAVAIL) {
                struct sockaddr_storage any;
                memset(&any, 0, sizeof any);
                socklen_t al;
                if (res->ai_family == AF_INET6) {
                    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&any;
                    s6->sin6_family = AF_INET6;
                    s6->sin6_port = htons((uint16_t)port);
                    al = sizeof *s6;
                } else {
                    struct sockaddr_in *s4 = (struct sockaddr_in *)&any;
                    s4->sin_family = AF_INET;
                    s4->sin_port = htons((uint16_t)port);
                    al = sizeof *s4;
                }
                err = bind(fd, (struct sockaddr *)&any, al) == 0 ? 0 : errno;
            }
        }
        if (!err && listen(fd, SOMAXCONN) != 0)
            err = errno;
    }
    freeaddrinfo(res);
    if (err) {
        if (fd >= 0)
            close(fd);
        return DSIM_ERR(DSIM_EIO, -1,
                        "%s: cannot listen on %s:%d: %s (another process there? give this task "
                        "a free port in TF_CONFIG, spaced by devices_per_host + 1)",
                        what, host, port, strerror(err));
    }
    *fd_out = fd;
    return DSIM_OK;
}

dsim_err dsim_mh_open(const dsim_cluster *c, const dsim_train_cfg *cfg, const dsim_mh_opts *o,
                      dsim_mh *mh)
{
    memset(mh, 0, sizeof *mh);
    mh->chief_fd = -1;
    mh->collector = -1;
    mh->t_open = mh_now();
    if (o)
        mh->o = *o;
    if (mh->o.timeout_ns <= 0)
        mh->o.timeout_ns = 120000 * MH_MS;
    int nps = c->jobs[DSIM_TASK_PS].ntasks;
    if (c->task_type == DSIM_TASK_EVALUATOR)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "TF_CONFIG: task.type is \"evaluator\": dsim worker runs the training "
                        "tasks (chief, worker, ps); start no dsim worker for the evaluator");
    if (c->num_workers != cfg->hosts || nps != cfg->num_ps)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG has %d chief+worker task(s) and %d ps task(s) but the "
                        "scenario asks for cluster.hosts %d and %d parameter server(s); make "
                        "them agree (one dsim worker per host)",
                        c->num_workers, nps, cfg->hosts, cfg->num_ps);
    DSIM_CHECK(dsim_secret_load(mh->o.secret_file, &mh->secret));
    int D = cfg->devices_per_host, T = cfg->hosts + cfg->num_ps;
    int R = cfg->hosts * D + cfg->num_ps;
    mh->n_tasks = T;
    mh->hosts.task = c->task_type == DSIM_TASK_PS ? cfg->hosts + c->task_index : c->worker_id;
    mh->is_chief = mh->hosts.task == 0;
    mh->conn = malloc((size_t)T * sizeof *mh->conn);
    mh->task_addr = calloc((size_t)T, sizeof *mh->task_addr);
    mh->addrs = calloc((size_t)R, 300);
    mh->listen_fds = malloc((size_t)D * sizeof *mh->listen_fds);
    if (!mh->conn || !mh->task_addr || !mh->addrs || !mh->listen_fds)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
    for (int k = 0; k < T; k++)
        mh->conn[k] = -1;
    size_t used = 0;
    for (int k = 0; k < T; k++) {
        const char *a = k < cfg->hosts ? dsim_cluster_worker_address(c, k)
                                       : c->jobs[DSIM_TASK_PS].addrs[k - cfg->hosts];
        char host[256], what[64];
        int port;
        snprintf(what, sizeof what, "TF_CONFIG task %d", k);
        DSIM_CHECK(mh_split(what, a, host, sizeof host, &port));
        mh->task_addr[k] = strdup(a);
        if (!mh->task_addr[k])
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
        int lo, hi;
        dsim_proc_task_ranks(cfg, k, &lo, &hi);
        if (port + (hi - lo) + (k == 0) > 65535)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s (%s): its ranks need ports %d..%d, past 65535; choose a lower "
                            "port",
                            what, a, port, port + (hi - lo) + (k == 0));
        for (int r = lo; r <= hi; r++) {
            char one[300];
            mh_fmt(one, sizeof one, host, port + (r - lo));
            used += (size_t)snprintf(mh->addrs + used, (size_t)R * 300 - used, "%s%s", r ? ";" : "",
                                     one);
        }
        if (k == 0)
            mh_fmt(mh->chief_addr, sizeof mh->chief_addr, host, port + (hi - lo) + 1);
        if (k == mh->hosts.task) {
            for (int r = lo; r <= hi; r++) {
                snprintf(what, sizeof what, "rank %d (task %d)", r, k);
                DSIM_CHECK(mh_listen(what, host, port + (r - lo), &mh->listen_fds[mh->n_listen]));
                mh->n_listen++;
            }
            if (k == 0)
                DSIM_CHECK(mh_listen("the chief's results port", host, port + (hi - lo) + 1,
                                     &mh->collector));
        }
    }
    mh->hosts.addrs = mh->addrs;
    mh->hosts.listen_fds = mh->listen_fds;
    mh->hosts.conn = mh->conn;
    if (mh->o.secret_file) {
        size_t n = strlen(mh->o.secret_file) + 16;
        mh->tcp_extra = malloc(n);
        if (!mh->tcp_extra)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
        snprintf(mh->tcp_extra, n, "secret_file=%s", mh->o.secret_file);
        mh->hosts.tcp_extra = mh->tcp_extra;
    }
    if (mh->o.scenario_text)
        dsim_sha256(mh->o.scenario_text, mh->o.scenario_len, mh->scenario_hash);
    return DSIM_OK;
}

static void mh_hello(const dsim_mh *mh, uint8_t *h)
{
    memset(h, 0, MH_HELLO_LEN);
    mh_put32(h, MH_HELLO);
    mh_put32(h + 4, MH_VERSION);
    mh_put32(h + 8, (uint32_t)mh->hosts.task);
    mh_put32(h + 12, (uint32_t)mh->n_tasks);
    mh_put32(h + 16, mh->secret.len ? 1u : 0u);
    mh_put32(h + 20, MH_BUILD_TAG);
    memcpy(h + 24, mh->scenario_hash, 32);
}

/* A connection the chief accepted and has not admitted yet: its challenge,
 * the hello and proof read so far, and its own deadline. Many are pending
 * at once, so an idle, slow or hostile connection never delays a real
 * task. */
#define MH_HELLO_FULL   (MH_HELLO_LEN + DSIM_AUTH_MAC + DSIM_AUTH_NONCE)
#define MH_MAX_PENDING  256
#define MH_ADMIT_WAIT_S 5
typedef struct mh_pending {
    int fd;
    char where[96];
    uint8_t ch[24];
    uint8_t m[MH_HELLO_FULL];
    size_t got;
    int64_t deadline;
} mh_pending;

/* The chief's challenge on a new connection; -1 when it cannot be sent. */
static int mh_challenge(mh_pending *p)
{
    memset(p->ch, 0, sizeof p->ch);
    mh_put32(p->ch, MH_CHAL);
    mh_put32(p->ch + 4, MH_VERSION);
    if (dsim_auth_nonce(p->ch + 8) != DSIM_OK || mh_send(p->fd, p->ch, sizeof p->ch) != 0)
        return -1;
    p->got = 0;
    p->deadline = mh_now() + MH_ADMIT_WAIT_S * 1000 * MH_MS;
    return 0;
}

/* The chief's judgement of a whole hello: returns the task it is, or -1
 * (the refusal logged, and sent). */
static int mh_admit(dsim_mh *mh, const mh_pending *p)
{
    const uint8_t *ch = p->ch, *m = p->m;
    int fd = p->fd;
    const char *where = p->where;
    int st = MH_OK, task = (int)mh_get32(m + 8);
    uint8_t mac[DSIM_AUTH_MAC];
    if (mh->secret.len)
        dsim_auth_mac(&mh->secret, "dsim-worker-hello", ch + 8, m, MH_HELLO_LEN, mac);
    if (mh_get32(m + 4) != MH_VERSION)
        st = MH_VERSIONS;
    else if (mh->secret.len && !(mh_get32(m + 16) & 1))
        st = MH_NO_SECRET;
    else if (mh->secret.len && !dsim_auth_equal(mac, m + MH_HELLO_LEN, DSIM_AUTH_MAC))
        st = MH_BAD_MAC;
    else if (mh_get32(m + 20) != MH_BUILD_TAG)
        st = MH_BUILD;
    else if ((int)mh_get32(m + 12) != mh->n_tasks || task <= 0 || task >= mh->n_tasks)
        st = MH_TASK;
    else if (memcmp(m + 24, mh->scenario_hash, 32) != 0)
        st = MH_SCENARIO;
    else if (mh->conn[task] >= 0)
        st = MH_DUP;
    uint8_t ack[8 + DSIM_AUTH_MAC] = {0};
    mh_put32(ack, MH_ACK);
    mh_put32(ack + 4, (uint32_t)st);
    if (mh->secret.len && st == MH_OK)
        dsim_auth_mac(&mh->secret, "dsim-worker-ack", m + MH_HELLO_LEN + DSIM_AUTH_MAC, ack, 8,
                      ack + 8);
    mh_send(fd, ack, sizeof ack);
    if (st != MH_OK) {
        dsim_warn("dsim worker: the chief refused a connection from %s (claiming task %d): %s",
                  where, task, mh_reason[st]);
        return -1;
    }
    return task;
}

/* Reads what a pending connection sent: 1 its hello is whole, 0 not yet,
 * -1 it is refused (logged) or gone. */
static int mh_pending_read(mh_pending *p)
{
    for (;;) {
        ssize_t r = recv(p->fd, p->m + p->got, sizeof p->m - p->got, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r <= 0) {
            dsim_warn("dsim worker: the chief refused a connection from %s: it closed before "
                      "sending a dsim worker hello",
                      p->where);
            return -1;
        }
        p->got += (size_t)r;
        if (p->got >= 4 && mh_get32(p->m) != MH_HELLO) {
            dsim_warn("dsim worker: the chief refused a connection from %s: its first bytes "
                      "are not a dsim worker hello",
                      p->where);
            return -1;
        }
        if (p->got == sizeof p->m)
            return 1;
    }
}

/* A results connection whose peer vanishes (its machine dies, the network
 * is cut) must not leave either side waiting for ever: keepalive probes
 * after 2 s of silence, and unacknowledged data, end it within ~10 s. */
static void mh_keepalive(int fd)
{
    int one = 1, idle = 2, intvl = 1, cnt = 5;
    unsigned int user_ms = 10000;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

static void mh_peer_txt(const struct sockaddr_storage *ss, socklen_t sl, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN + 1], port[8];
    if (getnameinfo((const struct sockaddr *)ss, sl, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        snprintf(out, cap, "(unknown)");
    else
        snprintf(out, cap, "%s:%s", host, port);
}

/* One round of the chief's gathering: waits up to 200 ms for a new
 * connection or bytes on a pending one; admits whole hellos, refuses what
 * is not one, ends connections past their own deadline. 0, or -1 when out
 * of memory (set). */
static int mh_gather_some(dsim_mh *mh, mh_pending *pend, int *npend, int *joined)
{
    struct pollfd pf[1 + MH_MAX_PENDING];
    pf[0] = (struct pollfd){.fd = mh->collector, .events = POLLIN};
    for (int i = 0; i < *npend; i++)
        pf[1 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
    int n = *npend;
    int rc = poll(pf, (nfds_t)(1 + n), 200);
    if (rc < 0 && errno != EINTR)
        return 0;
    int64_t now = mh_now();
    /* the pending ones, from the last so that removing one moves none unseen */
    for (int i = n - 1; i >= 0; i--) {
        int r = 0;
        if (rc > 0 && (pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
            r = mh_pending_read(&pend[i]);
        if (r == 0 && now >= pend[i].deadline) {
            dsim_warn("dsim worker: the chief refused a connection from %s: it sent no dsim "
                      "worker hello within %d s",
                      pend[i].where, MH_ADMIT_WAIT_S);
            r = -1;
        }
        if (r == 0)
            continue;
        int task = r == 1 ? mh_admit(mh, &pend[i]) : -1;
        if (task < 0) {
            close(pend[i].fd);
        } else {
            int fd = pend[i].fd;
            mh_keepalive(fd);
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            mh->conn[task] = fd;
            (*joined)++;
            if (mh->o.progress) {
                fprintf(mh->o.progress, "dsim worker: task %d joined from %s (%d of %d)\n", task,
                        pend[i].where, *joined, mh->n_tasks);
                fflush(mh->o.progress);
            }
        }
        pend[i] = pend[--(*npend)];
    }
    if (rc <= 0 || !(pf[0].revents & POLLIN))
        return 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(mh->collector, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return 0;
    if (*npend == MH_MAX_PENDING) {
        /* the oldest pending one goes: a flood cannot keep a task out */
        dsim_warn("dsim worker: the chief dropped a connection from %s: %d connections were "
                  "waiting to say hello",
                  pend[0].where, MH_MAX_PENDING);
        close(pend[0].fd);
        pend[0] = pend[--(*npend)];
    }
    mh_pending *p = &pend[*npend];
    p->fd = fd;
    mh_peer_txt(&ss, sl, p->where, sizeof p->where);
    if (mh_challenge(p) != 0) {
        close(fd);
        return 0;
    }
    (*npend)++;
    return 0;
}

static dsim_err mh_gather(dsim_mh *mh)
{
    int64_t deadline = mh->t_open + mh->o.timeout_ns, next_say = mh_now();
    int joined = 1, npend = 0;
    mh_pending *pend = malloc(MH_MAX_PENDING * sizeof *pend);
    if (!pend)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
    while (joined < mh->n_tasks) {
        int64_t now = mh_now();
        if (mh->o.progress && now >= next_say) {
            fprintf(mh->o.progress,
                    "dsim worker: chief at %s waiting for %d of %d task(s):", mh->chief_addr,
                    mh->n_tasks - joined, mh->n_tasks);
            for (int k = 1, shown = 0; k < mh->n_tasks && shown < 8; k++)
                if (mh->conn[k] < 0) {
                    fprintf(mh->o.progress, " %d (%s)", k, mh->task_addr[k]);
                    shown++;
                }
            fprintf(mh->o.progress, "\n");
            fflush(mh->o.progress);
            next_say = now + 2000 * MH_MS;
        }
        if (now >= deadline) {
            char missing[256] = "";
            size_t u = 0;
            for (int k = 1; k < mh->n_tasks && u < sizeof missing - 40; k++)
                if (mh->conn[k] < 0)
                    u += (size_t)snprintf(missing + u, sizeof missing - u, "%s%d (%s)",
                                          u ? ", " : "", k, mh->task_addr[k]);
            DSIM_ERR(DSIM_ETIMEDOUT, -1,
                     "the group did not form within %.0f s: task(s) %s never "
                     "joined the chief at %s (started? same TF_CONFIG, scenario and "
                     "secret? --timeout to wait longer)",
                     (double)mh->o.timeout_ns / 1e9, missing, mh->chief_addr);
            break;
        }
        if (mh_gather_some(mh, pend, &npend, &joined) != 0)
            break;
    }
    if (npend > 0)
        dsim_warn("dsim worker: the chief closed %d connection(s) that had not said a dsim worker "
                  "hello when the group %s (the first from %s)",
                  npend, joined < mh->n_tasks ? "failed to form" : "formed", pend[0].where);
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    free(pend);
    return joined < mh->n_tasks ? dsim_last_error()->code : DSIM_OK;
}

static dsim_err mh_join(dsim_mh *mh)
{
    char host[256];
    int port;
    DSIM_CHECK(mh_split("the chief's results address", mh->chief_addr, host, sizeof host, &port));
    int64_t deadline = mh->t_open + mh->o.timeout_ns, next_say = mh_now(), backoff = 10 * MH_MS;
    int last_err = 0;
    for (;;) {
        int64_t now = mh_now();
        if (now >= deadline)
            return DSIM_ERR(DSIM_ETIMEDOUT, 0,
                            "task %d could not reach the chief at %s within %.0f s "
                            "(last error: %s); is the chief's dsim worker running there?",
                            mh->hosts.task, mh->chief_addr, (double)mh->o.timeout_ns / 1e9,
                            last_err ? strerror(last_err) : "none");
        if (mh->o.progress && now >= next_say) {
            fprintf(mh->o.progress, "dsim worker: task %d waiting for the chief at %s\n",
                    mh->hosts.task, mh->chief_addr);
            fflush(mh->o.progress);
            next_say = now + 2000 * MH_MS;
        }
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
        struct addrinfo *res = NULL;
        char ps[8];
        snprintf(ps, sizeof ps, "%d", port);
        int fd = -1;
        if (getaddrinfo(host, ps, &hints, &res) == 0) {
            fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
                last_err = errno;
                close(fd);
                fd = -1;
            }
            freeaddrinfo(res);
        } else {
            last_err = EHOSTUNREACH;
        }
        if (fd < 0) {
            struct timespec ts = {.tv_sec = backoff / 1000000000LL,
                                  .tv_nsec = backoff % 1000000000LL};
            nanosleep(&ts, NULL);
            backoff = backoff * 2 > 1000 * MH_MS ? 1000 * MH_MS : backoff * 2;
            continue;
        }
        uint8_t ch[24], m[MH_HELLO_LEN + DSIM_AUTH_MAC + DSIM_AUTH_NONCE] = {0};
        uint8_t ack[8 + DSIM_AUTH_MAC];
        if (mh_recv(fd, ch, sizeof ch, now + 10000 * MH_MS) != 0 || mh_get32(ch) != MH_CHAL) {
            close(fd);
            return DSIM_ERR(DSIM_EPEER, 0,
                            "the process at %s is not a dsim worker chief (no "
                            "challenge); check TF_CONFIG's chief address",
                            mh->chief_addr);
        }
        mh_hello(mh, m);
        if (mh->secret.len)
            dsim_auth_mac(&mh->secret, "dsim-worker-hello", ch + 8, m, MH_HELLO_LEN,
                          m + MH_HELLO_LEN);
        uint8_t *nonce = m + MH_HELLO_LEN + DSIM_AUTH_MAC;
        dsim_err e = dsim_auth_nonce(nonce);
        if (e == DSIM_OK && (mh_send(fd, m, sizeof m) != 0 ||
                             mh_recv(fd, ack, sizeof ack, mh_now() + 10000 * MH_MS) != 0 ||
                             mh_get32(ack) != MH_ACK))
            e = DSIM_ERR(DSIM_EPEER, 0, "the chief at %s did not answer the hello", mh->chief_addr);
        uint32_t st = e == DSIM_OK ? mh_get32(ack + 4) : 0;
        if (e == DSIM_OK && st != MH_OK)
            e = DSIM_ERR(DSIM_EPEER, 0, "the chief at %s refused task %d: %s", mh->chief_addr,
                         mh->hosts.task,
                         st < MH_NREASONS ? mh_reason[st]
                                          : "for a reason this build does not know");
        if (e == DSIM_OK && mh->secret.len) {
            uint8_t mac[DSIM_AUTH_MAC];
            dsim_auth_mac(&mh->secret, "dsim-worker-ack", nonce, ack, 8, mac);
            if (!dsim_auth_equal(mac, ack + 8, DSIM_AUTH_MAC))
                e = DSIM_ERR(DSIM_EPEER, 0,
                             "the process at %s accepted task %d without proof that "
                             "it knows the cluster secret; refusing to send it anything",
                             mh->chief_addr, mh->hosts.task);
        }
        if (e != DSIM_OK) {
            dsim_warn("%s", dsim_errmsg());
            close(fd);
            return e;
        }
        mh_keepalive(fd);
        mh->chief_fd = fd;
        return DSIM_OK;
    }
}

dsim_err dsim_mh_rendezvous(dsim_mh *mh)
{
    dsim_err e = mh->is_chief ? mh_gather(mh) : mh_join(mh);
    mh->t_formed = mh_now();
    if (e == DSIM_OK && mh->o.progress) {
        fprintf(mh->o.progress, "dsim worker: task %d: group of %d task(s) formed in %.3f s\n",
                mh->hosts.task, mh->n_tasks, (double)(mh->t_formed - mh->t_open) / 1e9);
        fflush(mh->o.progress);
    }
    return e;
}

dsim_err dsim_mh_check_shared(dsim_mh *mh, const char *path)
{
    if (!mh->is_chief || mh->n_tasks < 2)
        return DSIM_OK;
    char token[4200], nonce[40];
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path) : 0;
    unsigned long long r = ((unsigned long long)getpid() << 32) ^ (unsigned long long)pr_now();
    snprintf(nonce, sizeof nonce, "dsim %016llx", r);
    snprintf(token, sizeof token, "%.*s%s.dsim-shared-%016llx", dlen, path, slash ? "/" : "", r);
    FILE *f = fopen(token, "w");
    if (!f || fputs(nonce, f) < 0 || fclose(f) != 0) {
        int err = errno;
        return DSIM_ERR(DSIM_EIO, -1,
                        "the checkpoint's folder cannot be written on the chief: %s: %s (the "
                        "checkpoint path is %s)",
                        token, strerror(err), path);
    }
    dsim_err e = DSIM_OK;
    for (int k = 0; k < mh->n_tasks && e == DSIM_OK; k++) {
        if (mh->conn[k] < 0)
            continue;
        size_t tl = strlen(token);
        if (!pr_sock_send(mh->conn[k], PC_PROBE, token, tl + 1)) {
            e = DSIM_ERR(DSIM_EPEER, -1, "task %d left before the checkpoint check", k);
            break;
        }
        /* the results connection may be non-blocking: whole records */
        pr_reader rd = {0};
        int got_rec = 0;
        int64_t until = pr_now() + 10 * 1000000000LL;
        while (got_rec == 0 && pr_now() < until) {
            struct pollfd pf = {.fd = mh->conn[k], .events = POLLIN};
            if (poll(&pf, 1, 100) < 0 && errno != EINTR)
                break;
            got_rec = pr_reader_next(mh->conn[k], &rd);
            if (got_rec == 1 && rd.hdr[0] != PR_PROBED)
                got_rec = 0; /* not the answer (nothing else is sent now) */
        }
        char got[300] = "";
        if (got_rec == 1)
            snprintf(got, sizeof got, "%.*s", (int)rd.hdr[1], (const char *)rd.body);
        pr_reader_free(&rd);
        if (got_rec != 1) {
            e = DSIM_ERR(DSIM_EPEER, -1, "task %d did not answer the checkpoint check in 10 s", k);
            break;
        }
        if (strcmp(got, nonce) != 0)
            e = DSIM_ERR(DSIM_EINVAL, -1,
                         "task %d (%s) does not see the chief's checkpoint folder: the chief "
                         "wrote %s, and task %d %s%s. The checkpoint (%s) must be on storage "
                         "every task reads at the same path (a shared file system), or a "
                         "restart cannot resume from it; give checkpoint.path such a place",
                         k, mh->task_addr ? mh->task_addr[k] : "?", token, k,
                         got[0] == '!' ? "cannot read it: " : "reads other contents there",
                         got[0] == '!' ? got + 1 : "", path);
    }
    unlink(token);
    return e;
}

void dsim_mh_bye(dsim_mh *mh)
{
    for (int k = 0; mh->conn && k < mh->n_tasks; k++)
        if (mh->conn[k] >= 0)
            dsim_proc_bye(mh->conn[k]);
}

void dsim_mh_close(dsim_mh *mh)
{
    for (int k = 0; mh->conn && k < mh->n_tasks; k++)
        if (mh->conn[k] >= 0)
            close(mh->conn[k]);
    for (int i = 0; i < mh->n_listen; i++)
        close(mh->listen_fds[i]);
    if (mh->collector >= 0)
        close(mh->collector);
    if (mh->chief_fd >= 0)
        close(mh->chief_fd);
    for (int k = 0; mh->task_addr && k < mh->n_tasks; k++)
        free(mh->task_addr[k]);
    free(mh->task_addr);
    free(mh->conn);
    free(mh->listen_fds);
    free(mh->addrs);
    free(mh->tcp_extra);
    memset(mh->secret.key, 0, sizeof mh->secret.key);
    memset(mh, 0, sizeof *mh);
    mh->chief_fd = mh->collector = -1;
}
