/* Arming the libfiu points (dsim/fiu.h). */
#include <stdlib.h>

#include "core/fiu_int.h"

#if DSIM_HAVE_FIU && defined(FIU_ENABLE)
atomic_int dsim_fiu_state_ = -1;

int dsim_fiu_armed(void)
{
    int s = atomic_load_explicit(&dsim_fiu_state_, memory_order_relaxed);
    if (s >= 0)
        return s;
    /* fiu-run exports FIU_ENABLE (the points it enables at start) to the
     * program it runs; its remote control may enable more later. */
    int want = getenv("FIU_ENABLE") != NULL;
    atomic_compare_exchange_strong(&dsim_fiu_state_, &s, want);
    return atomic_load(&dsim_fiu_state_);
}

dsim_err dsim_fiu_arm(int on)
{
    atomic_store(&dsim_fiu_state_, on ? 1 : 0);
    return DSIM_OK;
}
#else
int dsim_fiu_armed(void)
{
    return 0;
}

dsim_err dsim_fiu_arm(int on)
{
    if (!on)
        return DSIM_OK;
    return DSIM_ERR(DSIM_ENOTSUP, -1,
                    "dsim_fiu_arm: this libdsim was built without libfiu, so it has no fault "
                    "points; install libfiu (libfiu-dev) and rebuild");
}
#endif
