/* The record ring of a forked child (proc_ring.h). */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "proc_ring.h"

/* Written by one side each: tail by the child, head by the parent; wake by
 * the child (set) and the parent (cleared). Apart, so that the two sides'
 * writes do not share a cache line. */
struct pr_ring {
    _Atomic uint64_t tail; /* bytes the child has published */
    char pad0[56];
    _Atomic uint64_t head; /* bytes the parent has taken */
    char pad1[56];
    _Atomic int wake; /* a wake-up byte is on its way through the pipe */
    char pad2[60];
    unsigned char data[PR_RING_BYTES];
};

pr_ring *pr_ring_map(void)
{
    void *p =
        mmap(NULL, sizeof(pr_ring), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void pr_ring_unmap(pr_ring *r)
{
    if (r)
        munmap(r, sizeof *r);
}

/* One wake-up at a time: the parent clears the flag once it has read the
 * pipe, before it looks at the ring again. */
static void ring_wake(pr_ring *r, int fd)
{
    if (atomic_exchange(&r->wake, 1))
        return;
    char b = 1;
    while (write(fd, &b, 1) < 0 && errno == EINTR)
        ;
}

void pr_ring_send(pr_ring *r, int fd, const struct iovec *iov, int cnt, bool urgent)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (int i = 0; i < cnt; i++) {
        const unsigned char *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
            size_t space = PR_RING_BYTES - (size_t)(tail - head);
            if (space == 0) {
                /* full: what is written goes (a part of a record larger
                 * than the ring among it) and the parent is asked to
                 * make room */
                atomic_store(&r->tail, tail);
                ring_wake(r, fd);
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
                continue;
            }
            size_t pos = (size_t)tail & (PR_RING_BYTES - 1), n = left;
            if (n > space)
                n = space;
            if (n > PR_RING_BYTES - pos)
                n = PR_RING_BYTES - pos;
            memcpy(r->data + pos, p, n);
            p += n;
            left -= n;
            tail += n;
        }
    }
    atomic_store(&r->tail, tail);
    if (urgent || tail - atomic_load_explicit(&r->head, memory_order_acquire) >= PR_RING_BYTES / 4)
        ring_wake(r, fd);
}

/* pr_reader's source: what the ring holds, up to n bytes; -1 where the
 * ring's counters are no ring's (more published than it holds). */
static ssize_t ring_src(void *ctx, void *buf, size_t n)
{
    pr_ring *r = ctx;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t avail = atomic_load(&r->tail) - head;
    if (avail > PR_RING_BYTES)
        return -1;
    if (n > avail)
        n = (size_t)avail;
    size_t pos = (size_t)head & (PR_RING_BYTES - 1), first = PR_RING_BYTES - pos;
    if (first > n)
        first = n;
    memcpy(buf, r->data + pos, first);
    memcpy((unsigned char *)buf + first, r->data, n - first);
    atomic_store_explicit(&r->head, head + n, memory_order_release);
    return (ssize_t)n;
}

int pr_ring_next(pr_ring *r, int fd, pr_reader *rd)
{
    if (!r)
        return pr_reader_next(fd, rd);
    int k = pr_reader_from(rd, ring_src, r);
    if (k != 0)
        return k;
    /* No whole record in the ring: take the pipe's wake-ups (or see its
     * end), then look again, so that a record published while the flag
     * was still set is not left for the next wake-up. */
    bool end = false;
    for (;;) {
        unsigned char b[64];
        ssize_t n = read(fd, b, sizeof b);
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        end = n == 0 || errno != EAGAIN;
        break;
    }
    atomic_store(&r->wake, 0);
    k = pr_reader_from(rd, ring_src, r);
    return k != 0 ? k : end ? -1 : 0;
}
