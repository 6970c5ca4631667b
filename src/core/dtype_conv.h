/* The f16/bf16 <-> f32 conversions, as static inline functions that the C
 * compiler and nvcc both compile (DSIM_HD marks them __host__ __device__
 * under nvcc), so that dtype.c, the host device backend and the CUDA kernels
 * round every value the same way, bit for bit. Internal; not installed.
 *
 * They are written without branches (selects only) so that dtype.c's bulk
 * loops vectorise, and without any floating-point operation whose rounding
 * could differ between a CPU and a GPU: integer arithmetic, plus two float
 * additions in round-to-nearest-even, which both perform the same way (and
 * nvcc is given -fmad=false so nothing is fused). */
#ifndef DSIM_CORE_DTYPE_CONV_H
#define DSIM_CORE_DTYPE_CONV_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DSIM_HD __host__ __device__
#else
#define DSIM_HD
#endif

static inline DSIM_HD uint32_t dtype_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

static inline DSIM_HD float dtype_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline DSIM_HD uint16_t dtype_f32_to_f16(float f)
{
    uint32_t w = dtype_f32_bits(f);
    uint32_t sign = (w >> 16) & 0x8000u;
    uint32_t a = w & 0x7fffffffu;
    /* |f| >= 2^-14: rebias the exponent (127 -> 15) and round the 13 dropped
     * mantissa bits to nearest even in integer arithmetic; a carry out of the
     * mantissa bumps the exponent, and out of the top exponent gives 0x7c00
     * (inf), which is exactly IEEE overflow for 65520 <= |f| < 65536. */
    uint32_t nrm = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* |f| < 2^-14 (f16 subnormal or zero): adding 0.5 puts the value on a grid
     * of 2^-24, the f16 subnormal step, so the hardware's round-to-nearest-even
     * does the rounding. The cast strips any excess precision (C11), and
     * rounding twice on addition is harmless with >= 50 intermediate bits. */
    float af = dtype_f32_from_bits(a);
    uint32_t sub = dtype_f32_bits((float)(af + 0.5f)) - 0x3f000000u;
    uint32_t h = a < 0x38800000u ? sub : nrm;
    h = a >= 0x47800000u ? 0x7c00u : h; /* >= 65536 and inf */
    h = a > 0x7f800000u ? 0x7e00u : h;  /* NaN stays (quiet) NaN */
    return (uint16_t)(sign | h);
}

static inline DSIM_HD float dtype_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t a = h & 0x7fffu;
    /* Normal: move the fields up and rebias by 112 (= 127 - 15); inf/NaN
     * need another 112 to reach exponent 255, keeping the mantissa. */
    uint32_t nrm = (a << 13) + 0x38000000u;
    nrm = a >= 0x7c00u ? nrm + 0x38000000u : nrm;
    /* Subnormal and zero: a * 2^-24, exactly, as (0.5 + a * 2^-24) - 0.5. */
    uint32_t sub = dtype_f32_bits(dtype_f32_from_bits(0x3f000000u | a) - 0.5f);
    return dtype_f32_from_bits(sign | (a < 0x400u ? sub : nrm));
}

/* bfloat16 is the top half of a binary32, so only the rounding is work. */
static inline DSIM_HD uint16_t dtype_f32_to_bf16(float f)
{
    uint32_t u = dtype_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    /* A NaN must not round into inf (or wrap): keep it, forced quiet. */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

static inline DSIM_HD float dtype_bf16_to_f32(uint16_t b)
{
    return dtype_f32_from_bits((uint32_t)b << 16);
}

#endif
