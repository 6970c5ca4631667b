/* The libfiu points of libdsim (dsim/fiu.h): DSIM_FIU(name) is nonzero when
 * the point fires. Without libfiu (or FIU_ENABLE) it is the constant 0 and
 * the point is compiled away. */
#ifndef DSIM_CORE_FIU_INT_H
#define DSIM_CORE_FIU_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "dsim/fiu.h"
#include "dsim_config.h"

#if DSIM_HAVE_FIU && defined(FIU_ENABLE)
#include <fiu.h>

/* 1 armed, 0 not, -1 not yet looked up (dsim_fiu_armed reads the
 * environment then). */
extern atomic_int dsim_fiu_state_ __attribute__((visibility("hidden")));

static inline int dsim_fiu_fires(const char *name)
{
    int s = atomic_load_explicit(&dsim_fiu_state_, memory_order_relaxed);
    if (__builtin_expect(s == 0, 1))
        return 0;
    if (s < 0 && !dsim_fiu_armed())
        return 0;
    return fiu_fail(name) != 0;
}
#define DSIM_FIU(name) dsim_fiu_fires(name)
/* The failinfo of the point that just fired on this thread, as an int (an
 * errno or an error code), or dflt when it is 0. */
#define DSIM_FIU_INFO(dflt) (fiu_failinfo() ? (int)(intptr_t)fiu_failinfo() : (dflt))
#else
#define DSIM_FIU(name)      ((void)(name), 0)
#define DSIM_FIU_INFO(dflt) (dflt)
#endif

#endif
