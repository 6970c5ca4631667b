/* Whether two buffers of len bytes overlap without being the same range:
 * what the reductions refuse (dsim_reduce_local, dsim_reduce_local3,
 * dsim_irecv_reduce_from), since element i of the result would be read
 * after another element had been written over it. */
#ifndef DSIM_CORE_OVERLAP_INT_H
#define DSIM_CORE_OVERLAP_INT_H

#include <stddef.h>
#include <stdint.h>

static inline int dsim_overlap_part(const void *p, const void *q, size_t len)
{
    uintptr_t x = (uintptr_t)p, y = (uintptr_t)q;
    return x != y && (x < y ? y - x : x - y) < len;
}

#endif
