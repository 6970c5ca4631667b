/* The sim engine: every worker a coroutine on the calling OS thread, time a
 * virtual clock (ARCHITECTURE.md §1). Registered under the name "sim" with the
 * runtime (dsim/spi/rt.h); libdsim reaches it only through dsim_rt. */
#ifndef DSIM_SIM_ENGINE_H
#define DSIM_SIM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/err.h"
#include "dsim/rt.h"

/* Where the virtual clock starts (ns): not 0, which records use for "not
 * yet". */
#define DSIM_SIM_EPOCH_NS 1000000000LL

/* Registers the engine (idempotent, thread-safe). */
dsim_err dsim_sim_engine_register(void);

/* What the sim engines of this process did, summed over every instance
 * (for reports and benchmarks). */
typedef struct dsim_sim_stats {
    uint64_t switches;    /* worker switches */
    uint64_t clock_jumps; /* times the clock moved to the next event */
    uint64_t spawned;     /* workers started */
    uint64_t live_max;    /* most workers alive at once in one instance */
    size_t stack_bytes;   /* one worker's stack (mapped, not all touched) */
} dsim_sim_stats;

void dsim_sim_engine_totals(dsim_sim_stats *out);

/* The stack each new worker gets, in bytes: DSIM_SIM_STACK_KIB from the
 * environment when set (16..65536), else 256 KiB (1 MiB under
 * AddressSanitizer, whose frames are larger). */
size_t dsim_sim_stack_bytes(void);

#endif
