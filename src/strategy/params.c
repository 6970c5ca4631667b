/* Parameter vectors: their checksum (dsim_params_checksum, which every
 * step's consistency check and the run's trace compare) and the distance
 * between two of them (dsim_params_compare: differing elements, ulps,
 * absolute and relative). Used by dsim_train, the reference and the
 * harness; it calls nothing else in libdsim. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dsim/strategy.h"

/* Eight independent lanes of FNV-style xor-multiply over 8-byte words,
 * each folded through a strong mix at the end: any change to one
 * parameter changes the result, and the lanes run in parallel (a
 * byte-at-a-time hash was half the cost of a step at 1024 replicas). */
static uint64_t params_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

/* The lanes over whole 64-byte blocks: 8 words a block, word k to lane k.
 * A vector of 8 lanes where the CPU has AVX-512, else 8 scalars the
 * compiler keeps in registers; the same integers. */
typedef uint64_t params_v8 __attribute__((vector_size(64)));

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) static void params_lanes_v8(const unsigned char *b,
                                                               size_t blocks, uint64_t *h)
{
    params_v8 v;
    memcpy(&v, h, sizeof v);
    for (size_t i = 0; i < blocks; i++) {
        params_v8 w;
        memcpy(&w, b + 64 * i, sizeof w);
        /* x * 0x100000001b3 as shifts and adds, the same integers: the
         * lanes' chain waits on each product, and a 64-bit vector multiply
         * takes 15 cycles on some CPUs where this tree takes 5; the empty
         * asm keeps the compiler from folding it back into a multiply. */
        params_v8 x = v ^ w, a1 = x << 1, a4 = x << 4, a5 = x << 5, a7 = x << 7, a8 = x << 8,
                  a40 = x << 40;
        __asm__("" : "+v"(a1), "+v"(a4), "+v"(a5), "+v"(a7), "+v"(a8), "+v"(a40));
        v = ((x + a1) + (a4 + a5)) + ((a7 + a8) + a40);
    }
    memcpy(h, &v, sizeof v);
}
#endif

static void params_lanes(const unsigned char *b, size_t blocks, uint64_t *h)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        params_lanes_v8(b, blocks, h);
        return;
    }
#endif
    uint64_t h0 = h[0], h1 = h[1], h2 = h[2], h3 = h[3], h4 = h[4], h5 = h[5], h6 = h[6], h7 = h[7];
    for (size_t i = 0; i < blocks; i++) {
        uint64_t w[8];
        memcpy(w, b + 64 * i, sizeof w);
        h0 = (h0 ^ w[0]) * 0x100000001b3ull;
        h1 = (h1 ^ w[1]) * 0x100000001b3ull;
        h2 = (h2 ^ w[2]) * 0x100000001b3ull;
        h3 = (h3 ^ w[3]) * 0x100000001b3ull;
        h4 = (h4 ^ w[4]) * 0x100000001b3ull;
        h5 = (h5 ^ w[5]) * 0x100000001b3ull;
        h6 = (h6 ^ w[6]) * 0x100000001b3ull;
        h7 = (h7 ^ w[7]) * 0x100000001b3ull;
    }
    h[0] = h0, h[1] = h1, h[2] = h2, h[3] = h3, h[4] = h4, h[5] = h5, h[6] = h6, h[7] = h7;
}

uint64_t dsim_params_checksum(const float *p, size_t n)
{
    if (!p)
        n = 0;
    const unsigned char *b = (const unsigned char *)p;
    size_t len = n * sizeof(float), i = len / 64 * 64;
    uint64_t h[8];
    for (int k = 0; k < 8; k++)
        h[k] = 0xcbf29ce484222325ull + 0x9e3779b97f4a7c15ull * (uint64_t)k;
    params_lanes(b, len / 64, h);
    uint64_t r = (uint64_t)len;
    for (; i < len; i++)
        r = (r ^ b[i]) * 0x100000001b3ull;
    for (int k = 0; k < 8; k++)
        r = params_mix(r ^ params_mix(h[k] + (uint64_t)k));
    return r;
}

/* A variable's 16-bit signature: sixteen lanes of sums of its 32-bit words
 * (a change to any one word changes its lane's sum), four vector adds per
 * 64 bytes, mixed with the length at the end; never 0, which says "not kept".
 * The same integers on every CPU. Only compared between replicas of one
 * run, to name the variables in which they parted. */
typedef uint32_t params_u32x4 __attribute__((vector_size(16)));

static uint16_t params_var_sig(const float *p, size_t n)
{
    /* four vectors of four lanes, each its own register on any x86-64 */
    params_u32x4 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, w0, w1, w2, w3;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        memcpy(&w0, p + i, sizeof w0);
        memcpy(&w1, p + i + 4, sizeof w1);
        memcpy(&w2, p + i + 8, sizeof w2);
        memcpy(&w3, p + i + 12, sizeof w3);
        a0 += w0, a1 += w1, a2 += w2, a3 += w3;
    }
    uint32_t lane[16];
    memcpy(lane, &a0, sizeof a0);
    memcpy(lane + 4, &a1, sizeof a1);
    memcpy(lane + 8, &a2, sizeof a2);
    memcpy(lane + 12, &a3, sizeof a3);
    for (; i < n; i++) {
        uint32_t w;
        memcpy(&w, p + i, sizeof w);
        lane[i % 16] += w;
    }
    uint64_t h = params_mix((uint64_t)n);
    for (int k = 0; k < 16; k++)
        h = params_mix(h ^ ((uint64_t)lane[k] << 8 | (uint64_t)k));
    return (uint16_t)(h % 65535u + 1u);
}

void dsim_params_var_sig(const float *p, const dsim_model_var *v, size_t nv, uint16_t *sig)
{
    for (size_t k = 0; k < DSIM_MODEL_MAX_VARS; k++)
        sig[k] = k < nv && p ? params_var_sig(p + v[k].off, v[k].len) : 0;
}

/* Floats mapped to a monotonic integer line, so that the distance between
 * two of them is their distance in ulps (+0 and -0 are the same point). */
static int64_t reference_ordered(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? (int64_t)INT32_MIN - (int64_t)i : (int64_t)i;
}

void dsim_params_compare(const float *a, const float *b, size_t n, dsim_params_diff *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            out->n_diff++;
        if (isnan(a[i]) || isnan(b[i])) {
            if (isnan(a[i]) != isnan(b[i])) {
                out->max_ulps = UINT64_MAX;
                out->max_abs = INFINITY;
                out->max_rel = INFINITY;
                out->worst = i;
            }
            continue;
        }
        double d = fabs((double)a[i] - (double)b[i]);
        double m = fmax(fabs((double)a[i]), fabs((double)b[i]));
        double rel = m > 0 ? d / m : 0;
        int64_t u = reference_ordered(a[i]) - reference_ordered(b[i]);
        uint64_t ulps = (uint64_t)(u < 0 ? -u : u);
        if (d > out->max_abs) {
            out->max_abs = d;
            out->worst = i;
        }
        if (rel > out->max_rel)
            out->max_rel = rel;
        if (ulps > out->max_ulps && out->max_ulps != UINT64_MAX)
            out->max_ulps = ulps;
    }
}
