/* The processes engine's record ring (sim/engine/proc_ring.h): records in
 * order and intact across the ring's end, records larger than the ring, the
 * wake-up of the parent for an urgent record and none for the others, a
 * child killed in the middle of a record, and counters that are no ring's. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/proc_ring.h"

typedef struct chan {
    pr_ring *ring;
    int rfd, wfd;
} chan;

static void chan_open(chan *c)
{
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    c->rfd = p[0];
    c->wfd = p[1];
    fcntl(c->rfd, F_SETFL, fcntl(c->rfd, F_GETFL) | O_NONBLOCK);
    c->ring = pr_ring_map();
    assert_non_null(c->ring);
}

static void chan_close(chan *c)
{
    if (c->rfd >= 0)
        close(c->rfd);
    if (c->wfd >= 0)
        close(c->wfd);
    pr_ring_unmap(c->ring);
}

/* Record k: type k % 7 + 1, k * 37 % 5000 bytes of a pattern of k. */
static size_t rec_len(unsigned k)
{
    return (size_t)k * 37u % 5000u;
}

static void rec_fill(unsigned char *b, unsigned k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(k * 131u + i);
}

static void send_rec(chan *c, uint32_t type, const void *p, size_t n, bool urgent)
{
    uint32_t h[2] = {type, (uint32_t)n};
    struct iovec iov[2] = {{h, sizeof h}, {(void *)p, n}};
    pr_ring_send(c->ring, c->wfd, iov, 2, urgent);
}

static void check_rec(const pr_reader *rd, unsigned k)
{
    size_t n = rec_len(k);
    assert_int_equal(rd->hdr[0], k % 7 + 1);
    assert_int_equal(rd->hdr[1], n);
    unsigned char *want = malloc(n ? n : 1);
    assert_non_null(want);
    rec_fill(want, k, n);
    assert_memory_equal(rd->body, want, n);
    free(want);
}

/* Five times round the ring in one process: every record whole and in
 * order, read as they are sent and in batches. */
static void test_order_across_the_end(void **state)
{
    (void)state;
    chan c;
    chan_open(&c);
    pr_reader rd = {0};
    unsigned char *buf = malloc(5000);
    assert_non_null(buf);
    size_t total = 0;
    unsigned sent = 0, got = 0;
    while (total < 5u * PR_RING_BYTES) {
        /* a batch that fits what the ring has free (the reader is this
         * thread), then all of it read */
        size_t batch = 0;
        while (batch + 8 + rec_len(sent) < PR_RING_BYTES / 2) {
            size_t n = rec_len(sent);
            rec_fill(buf, sent, n);
            send_rec(&c, sent % 7 + 1, buf, n, false);
            batch += 8 + n;
            sent++;
        }
        total += batch;
        int k;
        while ((k = pr_ring_next(c.ring, c.rfd, &rd)) == 1)
            check_rec(&rd, got++);
        assert_int_equal(k, 0); /* nothing more now; the pipe is open */
        assert_int_equal(got, sent);
    }
    close(c.wfd);
    c.wfd = -1;
    assert_int_equal(pr_ring_next(c.ring, c.rfd, &rd), -1); /* its end */
    pr_reader_free(&rd);
    free(buf);
    chan_close(&c);
}

/* A child sends a record three times the ring's size between small ones:
 * it goes in parts as the parent reads, and arrives whole. */
static void test_record_larger_than_the_ring(void **state)
{
    (void)state;
    chan c;
    chan_open(&c);
    size_t big = 3u * PR_RING_BYTES + 12345u;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(c.rfd);
        unsigned char *b = malloc(big);
        if (!b)
            _exit(2);
        for (size_t i = 0; i < big; i++)
            b[i] = (unsigned char)(i * 7u);
        send_rec(&c, 1, "before", 6, false);
        send_rec(&c, 2, b, big, false);
        send_rec(&c, 3, "after", 5, true);
        _exit(0);
    }
    close(c.wfd);
    c.wfd = -1;
    pr_reader rd = {0};
    int n = 0, k;
    while ((k = pr_ring_next(c.ring, c.rfd, &rd)) >= 0) {
        if (k == 0) {
            struct pollfd pf = {.fd = c.rfd, .events = POLLIN};
            assert_true(poll(&pf, 1, 10000) >= 0);
            continue;
        }
        n++;
        if (n == 1)
            assert_true(rd.hdr[0] == 1 && rd.hdr[1] == 6 && !memcmp(rd.body, "before", 6));
        else if (n == 2) {
            assert_int_equal(rd.hdr[0], 2);
            assert_int_equal(rd.hdr[1], big);
            for (size_t i = 0; i < big; i += 4093)
                assert_int_equal(rd.body[i], (unsigned char)(i * 7u));
            assert_int_equal(rd.body[big - 1], (unsigned char)((big - 1) * 7u));
        } else
            assert_true(rd.hdr[0] == 3 && rd.hdr[1] == 5 && !memcmp(rd.body, "after", 5));
    }
    assert_int_equal(n, 3);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pr_reader_free(&rd);
    chan_close(&c);
}

/* A step's record does not wake the parent; an urgent one does, and the
 * one before it is read first. */
static void test_wakes_only_when_urgent(void **state)
{
    (void)state;
    chan c;
    chan_open(&c);
    pr_reader rd = {0};
    struct pollfd pf = {.fd = c.rfd, .events = POLLIN};
    send_rec(&c, 1, "step", 4, false);
    assert_int_equal(poll(&pf, 1, 50), 0); /* no wake-up */
    send_rec(&c, 2, "kill", 4, true);
    assert_int_equal(poll(&pf, 1, 1000), 1);
    assert_int_equal(pr_ring_next(c.ring, c.rfd, &rd), 1);
    assert_int_equal(rd.hdr[0], 1);
    assert_int_equal(pr_ring_next(c.ring, c.rfd, &rd), 1);
    assert_int_equal(rd.hdr[0], 2);
    assert_int_equal(pr_ring_next(c.ring, c.rfd, &rd), 0);
    /* the wake-up was taken: the next urgent record sends another */
    assert_int_equal(poll(&pf, 1, 0), 0);
    send_rec(&c, 3, "end", 3, true);
    assert_int_equal(poll(&pf, 1, 1000), 1);
    assert_int_equal(pr_ring_next(c.ring, c.rfd, &rd), 1);
    assert_int_equal(rd.hdr[0], 3);
    pr_reader_free(&rd);
    chan_close(&c);
}

/* A child killed in the middle of a record larger than the ring: the
 * records before it arrive, the part of it that was published does not,
 * and the reader ends (-1) rather than waiting or handing out half. */
static void test_killed_mid_record(void **state)
{
    (void)state;
    chan c;
    chan_open(&c);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(c.rfd);
        size_t big = 2u * PR_RING_BYTES;
        unsigned char *b = calloc(1, big);
        if (!b)
            _exit(2);
        send_rec(&c, 1, "whole", 5, false);
        send_rec(&c, 2, b, big, false); /* the ring fills: it waits */
        _exit(3);
    }
    close(c.wfd);
    c.wfd = -1;
    /* the wake-up of a full ring, without reading any of it */
    struct pollfd pf = {.fd = c.rfd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 10000), 1);
    kill(pid, SIGKILL);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    pr_reader rd = {0};
    assert_int_equal(pr_ring_next(c.ring, c.rfd, &rd), 1);
    assert_int_equal(rd.hdr[0], 1);
    assert_memory_equal(rd.body, "whole", 5);
    int k;
    while ((k = pr_ring_next(c.ring, c.rfd, &rd)) == 0)
        ;
    assert_int_equal(k, -1);
    pr_reader_free(&rd);
    chan_close(&c);
}

/* Counters that say more is published than the ring holds (memory of a
 * child gone wrong): the reader stops, it does not read past the ring. */
static void test_counters_no_ring_has(void **state)
{
    (void)state;
    chan c;
    chan_open(&c);
    send_rec(&c, 1, "x", 1, false);
    *(volatile uint64_t *)(void *)c.ring = 3u * PR_RING_BYTES; /* the tail, first */
    pr_reader rd = {0};
    assert_int_equal(pr_ring_next(c.ring, c.rfd, &rd), -1);
    pr_reader_free(&rd);
    chan_close(&c);
}

/* No ring (it could not be mapped): the records go over the pipe. */
static void test_without_a_ring(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    uint32_t h[2] = {4, 3};
    assert_int_equal(write(p[1], h, sizeof h), (ssize_t)sizeof h);
    assert_int_equal(write(p[1], "abc", 3), 3);
    pr_reader rd = {0};
    assert_int_equal(pr_ring_next(NULL, p[0], &rd), 1);
    assert_true(rd.hdr[0] == 4 && !memcmp(rd.body, "abc", 3));
    assert_int_equal(pr_ring_next(NULL, p[0], &rd), 0);
    close(p[1]);
    assert_int_equal(pr_ring_next(NULL, p[0], &rd), -1);
    close(p[0]);
    pr_reader_free(&rd);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_across_the_end),
        cmocka_unit_test(test_record_larger_than_the_ring),
        cmocka_unit_test(test_wakes_only_when_urgent),
        cmocka_unit_test(test_killed_mid_record),
        cmocka_unit_test(test_counters_no_ring_has),
        cmocka_unit_test(test_without_a_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
