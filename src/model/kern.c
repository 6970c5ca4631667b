/* The model kernels' tables (kern.h): kern_body.h compiled for each
 * instruction set, and the choice of one.
 *
 * Why kernels of our own rather than a BLAS: the sums must be the same
 * bits on every machine and for every batch size, and a BLAS picks its
 * blocking (and so its summation order, and whether it fuses) by the CPU it
 * finds; the replicas' batches are a few examples, where a BLAS call costs
 * more than the work; and the parameters are float while the sums are
 * double, which a BLAS can only take after a conversion per call. The
 * figures that decided it: docs/performance.md and `dsim bench model`. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/model.h"
#include "model/kern.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KERN_X86 1
#include <immintrin.h>
#else
#define KERN_X86 0
#endif

/* The loops over a tile's rows, examples and vectors run a constant number
 * of times where they are inlined: unrolled, their sums stay in registers
 * (clang needs its own spelling to unroll them fully). */
#if defined(__clang__)
#define KB_UNROLL _Pragma("clang loop unroll(full)")
#else
#define KB_UNROLL _Pragma("GCC unroll 8")
#endif

/* ---- generic: 2-double vectors, what every target has --------------------- */
typedef double kv_d2 __attribute__((vector_size(2 * sizeof(double))));
typedef int64_t kv_l2 __attribute__((vector_size(2 * sizeof(int64_t))));
typedef float kv_s4 __attribute__((vector_size(4 * sizeof(float))));
#define KB(x) x##_generic
#define KB_ATTR
#define KB_NAME      "generic"
#define KV           kv_d2
#define KVL          kv_l2
#define KVS          kv_s4
#define KB_W         2
#define KB_LDF(p)    ((kv_d2){(double)(p)[0], (double)(p)[1]})
#define KB_STF(p, v) ((p)[0] = (float)(v)[0], (p)[1] = (float)(v)[1])
#define KB_SQRTS(v)  sqrts_generic(v)
#define KB_FJ        2
#define KB_FE        2
#define KB_BE        2
#define KB_BI        1
#define KB_WJ        2
#define KB_WI        1
static inline kv_s4 sqrts_generic(kv_s4 x)
{
    for (int k = 0; k < 4; k++)
        x[k] = sqrtf(x[k]);
    return x;
}
#include "model/kern_body.h"
#include "model/kern_undef.h"

#if KERN_X86
/* ---- avx2: 16 registers of 4 doubles ------------------------------------- */
typedef double kv_d4 __attribute__((vector_size(4 * sizeof(double))));
typedef int64_t kv_l4 __attribute__((vector_size(4 * sizeof(int64_t))));
typedef float kv_s8 __attribute__((vector_size(8 * sizeof(float))));
#define KB(x)        x##_avx2
#define KB_ATTR      __attribute__((target("avx2")))
#define KB_NAME      "avx2"
#define KV           kv_d4
#define KVL          kv_l4
#define KVS          kv_s8
#define KB_W         4
#define KB_LDF(p)    ((kv_d4)_mm256_cvtps_pd(_mm_loadu_ps(p)))
#define KB_STF(p, v) _mm_storeu_ps((p), _mm256_cvtpd_ps((__m256d)(v)))
#define KB_SQRTS(v)  ((kv_s8)_mm256_sqrt_ps((__m256)(v)))
#define KB_FJ        2
#define KB_FE        2
#define KB_BE        4
#define KB_BI        1
#define KB_WJ        4
#define KB_WI        1
#include "model/kern_body.h"
#include "model/kern_undef.h"

/* ---- avx512: 32 registers of 8 doubles ----------------------------------- */
typedef double kv_d8 __attribute__((vector_size(8 * sizeof(double))));
typedef int64_t kv_l8 __attribute__((vector_size(8 * sizeof(int64_t))));
typedef float kv_s16 __attribute__((vector_size(16 * sizeof(float))));
#define KB(x)        x##_avx512
#define KB_ATTR      __attribute__((target("avx512f")))
#define KB_NAME      "avx512"
#define KV           kv_d8
#define KVL          kv_l8
#define KVS          kv_s16
#define KB_W         8
#define KB_LDF(p)    ((kv_d8)_mm512_cvtps_pd(_mm256_loadu_ps(p)))
#define KB_STF(p, v) _mm256_storeu_ps((p), _mm512_cvtpd_ps((__m512d)(v)))
#define KB_SQRTS(v)  ((kv_s16)_mm512_sqrt_ps((__m512)(v)))
#define KB_FJ        4
#define KB_FE        4
#define KB_BE        4
#define KB_BI        4
#define KB_WJ        4
#define KB_WI        4
#define KB_HSUM8     hsum8_avx512
/* The sums of 8 chunks a[0..7], each by kern.h's tree, in one vector:
 * lane k is ((a[k]0 + a[k]4) + (a[k]2 + a[k]6)) + ((a[k]1 + a[k]5) + (a[k]3 +
 * a[k]7)), the bits of hsum's scalar adds (each add of the tree is the
 * same two operands, a pair of chunks at a time in the lanes). */
__attribute__((target("avx512f"))) static inline kv_d8 hsum8_avx512(const kv_d8 a[8])
{
    __m512d s[4], t[2];
    for (int k = 0; k < 4; k++) {
        __m512d p = (__m512d)a[2 * k], q = (__m512d)a[2 * k + 1];
        /* lanes 0-3 of p and q beside their lanes 4-7: l + l+4 */
        s[k] = _mm512_add_pd(_mm512_shuffle_f64x2(p, q, 0x44), _mm512_shuffle_f64x2(p, q, 0xEE));
    }
    for (int k = 0; k < 2; k++) /* (l0+l4) + (l2+l6), (l1+l5) + (l3+l7) */
        t[k] = _mm512_add_pd(_mm512_shuffle_f64x2(s[2 * k], s[2 * k + 1], 0x88),
                             _mm512_shuffle_f64x2(s[2 * k], s[2 * k + 1], 0xDD));
    const __m512i ev = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    return (kv_d8)_mm512_add_pd(_mm512_permutex2var_pd(t[0], ev, t[1]),
                                _mm512_permutex2var_pd(t[0], od, t[1]));
}
#include "model/kern_body.h"
#include "model/kern_undef.h"
#endif

/* Every table this build has, the fastest last. */
static const kern_ops *const kern_tables[] = {
    &ops_generic,
#if KERN_X86
    &ops_avx2,
    &ops_avx512,
#endif
};
#define KERN_N_TABLES (sizeof kern_tables / sizeof kern_tables[0])

static bool kern_runs(const kern_ops *k)
{
#if KERN_X86
    __builtin_cpu_init();
    if (k == &ops_avx2)
        return __builtin_cpu_supports("avx2");
    if (k == &ops_avx512)
        return __builtin_cpu_supports("avx512f");
#endif
    return k == &ops_generic;
}

static _Atomic(const kern_ops *) kern_current;

const kern_ops *kern_get(void)
{
    const kern_ops *k = atomic_load_explicit(&kern_current, memory_order_acquire);
    if (k)
        return k;
    for (size_t i = KERN_N_TABLES; i-- > 0;) {
        if (kern_runs(kern_tables[i])) {
            k = kern_tables[i];
            break;
        }
    }
    atomic_store_explicit(&kern_current, k, memory_order_release);
    return k;
}

const char *dsim_model_kernels(void)
{
    return kern_get()->name;
}

size_t dsim_model_kernels_list(const char **names, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < KERN_N_TABLES; i++) {
        if (!kern_runs(kern_tables[i]))
            continue;
        if (names && n < cap)
            names[n] = kern_tables[i]->name;
        n++;
    }
    return n;
}

dsim_err dsim_model_kernels_use(const char *name)
{
    if (!name || !*name || strcmp(name, "auto") == 0) {
        atomic_store_explicit(&kern_current, NULL, memory_order_release);
        (void)kern_get();
        return DSIM_OK;
    }
    char avail[64] = "";
    for (size_t i = 0; i < KERN_N_TABLES; i++) {
        const kern_ops *k = kern_tables[i];
        if (!kern_runs(k))
            continue;
        if (strcmp(k->name, name) == 0) {
            atomic_store_explicit(&kern_current, k, memory_order_release);
            return DSIM_OK;
        }
        size_t len = strlen(avail);
        snprintf(avail + len, sizeof avail - len, "%s%s", len ? ", " : "", k->name);
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "model kernels '%s' are not available here: use auto or one of %s", name,
                    avail);
}
