/* dsim_buf_alloc (dsim/comm.h): collectives' buffers, large ones on
 * transparent huge pages. */
#include <stdlib.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "dsim/comm.h"

/* A huge page on x86-64 and arm64 with 4 KiB pages; where the kernel's
 * differs, the advice covers fewer of them and nothing else changes. */
#define BUF_HUGE ((size_t)2 << 20)

void *dsim_buf_alloc(size_t bytes)
{
    size_t align = bytes >= BUF_HUGE ? BUF_HUGE : 64;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes ? bytes : 1) != 0)
        return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* Advice only: a kernel without huge pages refuses it, and the buffer
     * is as good as any. Whole huge pages, from p (aligned) on. */
    if (align == BUF_HUGE)
        (void)madvise(p, bytes / BUF_HUGE * BUF_HUGE, MADV_HUGEPAGE);
#endif
    return p;
}
