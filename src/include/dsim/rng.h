/* Seeded random streams keyed by (run seed, purpose, worker).
 *
 * Every random decision in dsim draws from its own stream, so results do not
 * depend on thread scheduling. The generator is xoshiro256**, seeded through
 * splitmix64 from a hash of the key. */
#ifndef DSIM_RNG_H
#define DSIM_RNG_H

#include <stdint.h>

#include "dsim/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsim_rng {
    uint64_t s[4];
} dsim_rng;

/* purpose: a short static name such as "data.shuffle" or "fault.drop". */
DSIM_API void dsim_rng_init(dsim_rng *r, uint64_t seed, const char *purpose, uint64_t worker);
DSIM_API uint64_t dsim_rng_next(dsim_rng *r);
/* Uniform in [0, 1), 53 random bits. */
DSIM_API double dsim_rng_uniform(dsim_rng *r);
/* Uniform in [0, n), without modulo bias; n == 0 returns 0. */
DSIM_API uint64_t dsim_rng_below(dsim_rng *r, uint64_t n);
/* Standard normal (mean 0, variance 1). */
DSIM_API double dsim_rng_normal(dsim_rng *r);
/* Fisher-Yates shuffle of n uint64 values. */
DSIM_API void dsim_rng_shuffle_u64(dsim_rng *r, uint64_t *v, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
