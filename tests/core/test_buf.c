/* dsim_buf_alloc (dsim/comm.h): the alignment it promises, memory that can
 * be written whole and freed, and the huge-page advice on large buffers
 * (read back from /proc/self/smaps where the kernel has transparent huge
 * pages). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dsim/comm.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* The VmFlags line of the mapping that holds p: 1 when it has `flag`, 0
 * when not, -1 when smaps cannot tell. */
static int vma_has_flag(const void *p, const char *flag)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int in = 0, found = -1;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && strncmp(line, "VmFlags:", 8) == 0) {
            char want[8];
            snprintf(want, sizeof want, " %s", flag);
            found = strstr(line, want) != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

static void small_buffers(void **state)
{
    (void)state;
    size_t sizes[] = {0, 1, 100, 4096, 65536, HUGE_PAGE - 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = dsim_buf_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, 0xa5, sizes[i]);
        if (sizes[i])
            assert_int_equal(p[sizes[i] - 1], 0xa5);
        free(p);
    }
}

static void large_buffers(void **state)
{
    (void)state;
    size_t sizes[] = {HUGE_PAGE, 5 * HUGE_PAGE + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = dsim_buf_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % HUGE_PAGE, 0);
        memset(p, 0x5a, sizes[i]);
        assert_int_equal(p[sizes[i] - 1], 0x5a);
        if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) {
            /* madvise(MADV_HUGEPAGE) marks the mapping "hg" */
            int hg = vma_has_flag(p, "hg");
            if (hg >= 0)
                assert_int_equal(hg, 1);
        }
        free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_buffers),
        cmocka_unit_test(large_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
