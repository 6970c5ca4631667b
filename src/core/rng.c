/* Seeded random streams keyed by (run seed, purpose, worker).
 *
 * The key is hashed with 64-bit FNV-1a over a fixed byte encoding, so that a
 * stream is the same on every platform and every run:
 *   seed (8 bytes, little-endian) | purpose bytes | 0x00 | worker (8 bytes LE)
 * The hash seeds splitmix64, whose first four outputs are the xoshiro256**
 * state (the seeding its authors recommend). Nothing here has static state,
 * so streams are independent of thread scheduling. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/rng.h"

#define RNG_FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define RNG_FNV_PRIME  UINT64_C(0x100000001b3)

static uint64_t rng_fnv_byte(uint64_t h, unsigned char b)
{
    return (h ^ b) * RNG_FNV_PRIME;
}

static uint64_t rng_fnv_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        h = rng_fnv_byte(h, (unsigned char)(v >> (8 * i)));
    return h;
}

static uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static inline uint64_t rng_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void dsim_rng_init(dsim_rng *r, uint64_t seed, const char *purpose, uint64_t worker)
{
    if (!r)
        return;
    uint64_t h = rng_fnv_u64(RNG_FNV_OFFSET, seed);
    for (const char *p = purpose ? purpose : ""; *p; p++)
        h = rng_fnv_byte(h, (unsigned char)*p);
    h = rng_fnv_byte(h, 0);
    h = rng_fnv_u64(h, worker);
    uint64_t x = h;
    for (int i = 0; i < 4; i++)
        r->s[i] = rng_splitmix64(&x);
    /* xoshiro's one forbidden state; splitmix64 cannot produce four zero
     * outputs in a row, but the guard costs nothing. */
    if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
        r->s[0] = 1;
}

uint64_t dsim_rng_next(dsim_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return result;
}

double dsim_rng_uniform(dsim_rng *r)
{
    return (double)(dsim_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Lemire's multiply-and-reject ("Fast random integer generation in an
 * interval", 2019): the high word of x * n is uniform on [0, n) once the
 * low words below 2^64 mod n are rejected. */
uint64_t dsim_rng_below(dsim_rng *r, uint64_t n)
{
    if (n == 0)
        return 0;
#ifdef __SIZEOF_INT128__
    __extension__ typedef unsigned __int128 rng_u128;
    rng_u128 m = (rng_u128)dsim_rng_next(r) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t threshold = (0 - n) % n; /* 2^64 mod n */
        while (lo < threshold) {
            m = (rng_u128)dsim_rng_next(r) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
#else
    /* Plain rejection: accept x only below the largest multiple of n. */
    uint64_t threshold = (0 - n) % n;
    uint64_t x;
    do
        x = dsim_rng_next(r);
    while (x < threshold);
    return x % n;
#endif
}

/* Marsaglia's polar method. It yields two normals per accepted pair; the
 * second is dropped, as keeping it would need state beyond the generator's. */
double dsim_rng_normal(dsim_rng *r)
{
    double u, v, s;
    do {
        u = 2.0 * dsim_rng_uniform(r) - 1.0;
        v = 2.0 * dsim_rng_uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    return u * sqrt(-2.0 * log(s) / s);
}

void dsim_rng_shuffle_u64(dsim_rng *r, uint64_t *v, uint64_t n)
{
    if (!v)
        return;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = dsim_rng_below(r, i);
        uint64_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}
