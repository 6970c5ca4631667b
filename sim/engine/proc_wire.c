/* The processes engine's wire (proc_wire.h). */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "proc_wire.h"

int64_t pr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void pr_write_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* the parent is gone: nothing to tell */
        b += w;
        n -= (size_t)w;
    }
}

void pr_writev_all(int fd, struct iovec *iov, int cnt)
{
    while (cnt > 0) {
        ssize_t w = writev(fd, iov, cnt);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* the parent is gone: nothing to tell */
        size_t left = (size_t)w;
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
}

bool pr_sock_send(int fd, uint32_t type, const void *p, size_t n)
{
    uint32_t h[2] = {type, (uint32_t)n};
    const void *part[2] = {h, p};
    size_t len[2] = {sizeof h, n};
    for (int i = 0; i < 2; i++) {
        const char *b = part[i];
        size_t left = len[i];
        while (left) {
            ssize_t w = send(fd, b, left, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return false;
            b += w;
            left -= (size_t)w;
        }
    }
    return true;
}

bool pr_read_full(int fd, void *p, size_t n)
{
    char *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

bool pr_command(int fd, uint32_t *type, unsigned char **body, uint32_t *len)
{
    uint32_t h[2];
    *body = NULL;
    if (!pr_read_full(fd, h, sizeof h) || h[1] > (1u << 20))
        return false;
    *type = h[0];
    *len = h[1];
    *body = malloc(h[1] ? h[1] : 1);
    if (!*body || !pr_read_full(fd, *body, h[1])) {
        free(*body);
        *body = NULL;
        return false;
    }
    return true;
}

/* pr_reader's source for a descriptor: read(2), EINTR retried, EAGAIN as
 * nothing now, its end and its errors as -1. */
static ssize_t fd_src(void *ctx, void *buf, size_t n)
{
    for (;;) {
        ssize_t r = read(*(int *)ctx, buf, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return 0;
        return r > 0 ? r : -1;
    }
}

int pr_reader_next(int fd, pr_reader *rd)
{
    return pr_reader_from(rd, fd_src, &fd);
}

int pr_reader_from(pr_reader *rd, pr_src src, void *ctx)
{
    if (rd->hdr_got == sizeof rd->hdr && rd->body_got == rd->hdr[1]) {
        /* the last call handed a record out: start the next */
        rd->hdr_got = 0;
        rd->body_got = 0;
    }
    for (;;) {
        if (rd->hdr_got < sizeof rd->hdr) {
            ssize_t r = src(ctx, (char *)rd->hdr + rd->hdr_got, sizeof rd->hdr - rd->hdr_got);
            if (r <= 0)
                return r == 0 ? 0 : -1;
            rd->hdr_got += (size_t)r;
            if (rd->hdr_got < sizeof rd->hdr)
                continue;
            if (rd->hdr[1] > PR_MAX_RECORD)
                return -1; /* not a record: stop reading */
            free(rd->body);
            rd->body = malloc(rd->hdr[1] ? rd->hdr[1] : 1);
            rd->body_got = 0;
            if (!rd->body)
                return -1;
        }
        if (rd->body_got < rd->hdr[1]) {
            ssize_t r = src(ctx, rd->body + rd->body_got, rd->hdr[1] - rd->body_got);
            if (r <= 0)
                return r == 0 ? 0 : -1;
            rd->body_got += (size_t)r;
            if (rd->body_got < rd->hdr[1])
                continue;
        }
        return 1;
    }
}

void pr_reader_free(pr_reader *rd)
{
    free(rd->body);
    rd->body = NULL;
}
