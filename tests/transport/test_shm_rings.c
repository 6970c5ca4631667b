/* The shm transport's rings between ranks of one process: a fabric maps in,
 * when it opens, the rings its ranks send into and read from
 * (src/transport/shm/shm.c, shm_prefault), checked with mincore on the
 * job's mapping; and two ranks of one process reach each other without them
 * (direct=on, the default) or through them (direct=off). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/spi/shm.h"
#include "dsim/transport.h"

#define LONG_NS (30LL * 1000 * 1000 * 1000)

/* Pages of fd's mapping that are in memory (mincore). */
static size_t resident_pages(int fd)
{
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    size_t len = (size_t)st.st_size, pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    unsigned char *v = malloc(n);
    assert_non_null(v);
    assert_int_equal(mincore(p, len, v), 0);
    size_t in = 0;
    for (size_t i = 0; i < n; i++)
        in += v[i] & 1;
    free(v);
    munmap(p, len);
    return in;
}

/* A process's fabric maps in the rings its ranks send into and read from
 * when it opens (a first pass of small messages through a ring took a page
 * fault a page on both sides), and leaves the bounce buffers alone. Ranks
 * 0 and 1 of 3 in this process: with direct=off 8 of the 9 rings (2 to 2 is
 * the only one neither sends into nor reads from); by default (direct=on),
 * where 0 and 1 reach each other without rings, the 4 to and from rank 2. */
static void rings_mapped_in(const char *extra, size_t rings)
{
    int fd;
    assert_int_equal(dsim_shm_create(3, "ring=64k,bounce=1m", &fd), DSIM_OK);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), ring_pages = (64 << 10) / pg;
    size_t before = resident_pages(fd);
    assert_true(before < ring_pages);
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    char o[64];
    snprintf(o, sizeof o, "fd=%d,local=0-1%s", fd, extra);
    dsim_fabric_cfg cfg = {.backend = "shm", .nranks = 3, .rt = rt, .options = o};
    dsim_fabric *f = NULL;
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_OK);
    size_t after = resident_pages(fd);
    if (after < before + rings * ring_pages || after > before + rings * ring_pages + 64)
        fail_msg("%zu pages resident after the open, %zu before: the %zu rings are %zu", after,
                 before, rings, rings * ring_pages);
    dsim_fabric_close(f);
    dsim_rt_destroy(rt);
    close(fd);
}

static void test_rings_mapped_in(void **state)
{
    (void)state;
    rings_mapped_in(",direct=off", 8);
    rings_mapped_in("", 4);
}

/* Ranks of one process: by default (direct=on) a send is handed straight
 * to the receiving endpoint, as inproc does: no ring (eager_msgs stays 0),
 * in the order sent, a large one held until the receive reads it out of
 * the sender's buffer; with direct=off the same through the rings. */
static void direct_in_process(const char *opts, int direct)
{
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_fabric_cfg cfg = {.backend = "shm", .nranks = 2, .rt = rt, .options = opts};
    dsim_fabric *f = NULL;
    if (dsim_fabric_open(&cfg, &f) != DSIM_OK)
        fail_msg("%s: %s", opts ? opts : "(defaults)", dsim_errmsg());
    dsim_ep *a, *b;
    assert_int_equal(dsim_ep_open(f, 0, &a), DSIM_OK);
    assert_int_equal(dsim_ep_open(f, 1, &b), DSIM_OK);
    int64_t dl = dsim_rt_deadline(rt, LONG_NS);
    /* three small messages of one tag, sent before any receive */
    dsim_req *sr[3], *rr;
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(dsim_isend(a, 1, 1, 5, &i, sizeof i, &sr[i]), DSIM_OK);
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t v = 99;
        assert_int_equal(dsim_irecv(b, 0, 1, 5, &v, sizeof v, &rr), DSIM_OK);
        assert_int_equal(dsim_wait(rr, dl, NULL), DSIM_OK);
        assert_int_equal(dsim_wait(sr[i], dl, NULL), DSIM_OK);
        assert_int_equal(v, i);
    }
    /* a large one before its receive: not done until the receive took it */
    size_t len = 1 << 20;
    uint8_t *out = malloc(len), *in = calloc(1, len);
    assert_non_null(out);
    assert_non_null(in);
    for (size_t i = 0; i < len; i++)
        out[i] = (uint8_t)(i * 13 + 1);
    dsim_req *ls;
    assert_int_equal(dsim_isend(a, 1, 1, 6, out, len, &ls), DSIM_OK);
    if (direct)
        assert_false(dsim_req_done(ls));
    assert_int_equal(dsim_irecv(b, 0, 1, 6, in, len, &rr), DSIM_OK);
    size_t got = 0;
    assert_int_equal(dsim_wait(rr, dl, &got), DSIM_OK);
    assert_int_equal(dsim_wait(ls, dl, NULL), DSIM_OK);
    assert_int_equal(got, len);
    assert_memory_equal(in, out, len);
    /* a large send cancelled before any receive: withdrawn, and the next
     * message of the pair still arrives */
    assert_int_equal(dsim_isend(a, 1, 1, 7, out, len, &ls), DSIM_OK);
    dsim_req_cancel(ls);
    uint32_t k = 42, v = 0;
    assert_int_equal(dsim_isend(a, 1, 1, 8, &k, sizeof k, &sr[0]), DSIM_OK);
    assert_int_equal(dsim_irecv(b, 0, 1, 8, &v, sizeof v, &rr), DSIM_OK);
    assert_int_equal(dsim_wait(rr, dl, NULL), DSIM_OK);
    assert_int_equal(dsim_wait(sr[0], dl, NULL), DSIM_OK);
    assert_int_equal(v, 42);
    dsim_shm_stats st;
    assert_int_equal(dsim_shm_get_stats(f, &st), DSIM_OK);
    if (direct) {
        assert_int_equal(st.eager_msgs, 0);
        assert_int_equal(st.local_msgs, 6); /* 3 + 1 + the withdrawn one + 1 */
    } else {
        assert_int_equal(st.eager_msgs, 4);
        /* the cancelled one too where the progress thread handed it over
         * before the cancel came */
        assert_true(st.local_msgs == 1 || st.local_msgs == 2);
    }
    free(out);
    free(in);
    dsim_ep_close(a);
    dsim_ep_close(b);
    dsim_fabric_close(f);
    dsim_rt_destroy(rt);
}

static void test_direct_in_process(void **state)
{
    (void)state;
    direct_in_process(NULL, 1);
    direct_in_process("direct=off", 0);
    /* a bad value names the option and what it takes */
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_fabric_cfg cfg = {.backend = "shm", .nranks = 2, .rt = rt, .options = "direct=yes"};
    dsim_fabric *f = NULL;
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "direct=yes"));
    assert_non_null(strstr(dsim_errmsg(), "on or off"));
    dsim_rt_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rings_mapped_in),
        cmocka_unit_test(test_direct_in_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
