/* The shm transport maps in, when a process's fabric opens, the rings its
 * ranks send into and read from (src/transport/shm/shm.c, shm_prefault):
 * checked with mincore on the job's mapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/spi/shm.h"
#include "dsim/transport.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rings_mapped_in),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
