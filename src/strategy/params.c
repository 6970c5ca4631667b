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

uint64_t dsim_params_checksum(const float *p, size_t n)
{
    if (!p)
        n = 0;
    const unsigned char *b = (const unsigned char *)p;
    size_t len = n * sizeof(float), i = 0;
    uint64_t h[8];
    for (int k = 0; k < 8; k++)
        h[k] = 0xcbf29ce484222325ull + 0x9e3779b97f4a7c15ull * (uint64_t)k;
    for (; i + 64 <= len; i += 64) {
        for (int k = 0; k < 8; k++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * (size_t)k, sizeof w);
            h[k] = (h[k] ^ w) * 0x100000001b3ull;
        }
    }
    uint64_t r = (uint64_t)len;
    for (; i < len; i++)
        r = (r ^ b[i]) * 0x100000001b3ull;
    for (int k = 0; k < 8; k++)
        r = params_mix(r ^ params_mix(h[k] + (uint64_t)k));
    return r;
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
