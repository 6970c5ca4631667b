/* tcp: the options string (tcp.c lists the options) and the addresses of
 * the ranks (addrs=, addrs_file=). */

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_int.h"

#define TCP_KNOWN                                                                                  \
    "addrs=HOST:PORT;..., addrs_file=PATH, local=A-B, connect_timeout=30s, io_threads=N, "         \
    "max_frame=BYTES, listen_fds=FD;FD;..., secret_file=PATH, payload_checksum=1|0"

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

dsim_err tcp_parse_opts(tcp_fabric *tf, const char *options, tcp_opts *o)
{
    memset(o, 0, sizeof *o);
    o->connect_timeout = TCP_TIMEOUT_DEF;
    o->io_threads = 1;
    o->max_frame = TCP_MAX_FRAME_DEF;
    o->payload_crc = 1;
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
        } else if (strcmp(key, "payload_checksum") == 0) {
            if (strcmp(val, "0") != 0 && strcmp(val, "1") != 0)
                e = DSIM_ERR(DSIM_EINVAL, -1,
                             "tcp option payload_checksum=%s: expected 1 (every frame's checksum "
                             "covers its payload, the default) or 0 (header and sideband only, "
                             "for ranks on one host)",
                             val);
            o->payload_crc = val[0] == '1';
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
dsim_err tcp_addr_parse(const char *what, const char *text, int local, tcp_addr *out)
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

int tcp_port_of(const tcp_addr *a)
{
    if (a->ss.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)&a->ss)->sin_port);
    return ntohs(((const struct sockaddr_in6 *)&a->ss)->sin6_port);
}

/* Two ranks at one address would each reach the other's listener. */
dsim_err tcp_addrs_distinct(tcp_fabric *tf)
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

dsim_err tcp_addrs_list(tcp_fabric *tf, const char *list)
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

dsim_err tcp_addrs_file(tcp_fabric *tf, const char *path)
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
