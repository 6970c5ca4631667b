/* The reduction kernels' arithmetic, one element at a time: static inline
 * functions that the C compiler (the host backend) and nvcc (the CUDA
 * kernels, cuda/kernels.cu) both compile, so that a CPU test exercises the
 * very expressions a GPU runs. Internal; not installed.
 *
 * The results equal dsim_reduce_local's (src/core/reduce.c) bit for bit,
 * except NaNs, which tests/device checks:
 *
 * - f32, f64: combined in their own type.
 * - f16, bf16: both operands widened to f32, combined there and rounded back
 *   to the storage type once per combination (round to nearest even, with
 *   dtype_conv.h's conversions). For + and * this is the correctly rounded
 *   half-precision result (binary32 holds the exact sum or product of two
 *   halves' values to within half an ulp of 2p+2 bits), i.e. exactly what
 *   NCCL's __hadd/__hmul and Eigen's (so TensorFlow's) half arithmetic give.
 *   An n-way reduction is a left fold, rounding after every step: out =
 *   (((in0 op in1) op in2) ...), as a ring or a chain of pairwise reductions
 *   computes it; it is never accumulated in f32 across the inputs.
 * - MEAN combines as SUM; the one division by the rank count happens in the
 *   finish step (dk_*_div), rounded once, as TensorFlow's all-reduce does
 *   (merge_op Add, final_op Div).
 * - MAX/MIN propagate NaN (tf.maximum/tf.minimum), unlike fmaxf/fminf: the
 *   NaN operand itself (for f16/bf16, made quiet, sign kept).
 * - A NaN that + * / produce is the canonical quiet NaN (0x7fc00000 for f32,
 *   0x7e00 f16, 0x7fc0 bf16, 0x7ff8... f64). CPUs and GPUs produce
 *   different NaNs (x86 keeps an operand's payload or gives 0xffc00000; a
 *   GPU gives 0x7fffffff), and a checksum must not depend on which ran.
 * - Integer SUM/PROD wrap modulo 2^bits through unsigned arithmetic; the
 *   integer MEAN truncates toward zero. */
#ifndef DSIM_DEVICE_ELEM_H
#define DSIM_DEVICE_ELEM_H

#include <stdint.h>
#include <string.h>

#include "core/dtype_conv.h"

static inline DSIM_HD double dk_f64_from_bits(uint64_t u)
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
#endif
}

#define DK_NAN_f32 dtype_f32_from_bits(0x7fc00000u)
#define DK_NAN_f64 dk_f64_from_bits(0x7ff8000000000000ull)

#define DK_FLOAT_OPS(TN, T)                                                                        \
    static inline DSIM_HD T dk_##TN##_canon(T r)                                                   \
    {                                                                                              \
        return r != r ? DK_NAN_##TN : r;                                                           \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_sum(T x, T y)                                                \
    {                                                                                              \
        return dk_##TN##_canon(x + y);                                                             \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_prod(T x, T y)                                               \
    {                                                                                              \
        return dk_##TN##_canon(x * y);                                                             \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_max(T x, T y)                                                \
    {                                                                                              \
        return ((x > y) | (x != x)) ? x : y;                                                       \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_min(T x, T y)                                                \
    {                                                                                              \
        return ((x < y) | (x != x)) ? x : y;                                                       \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_div(T x, int n)                                              \
    {                                                                                              \
        return dk_##TN##_canon(x / (T)n);                                                          \
    }

DK_FLOAT_OPS(f32, float)
DK_FLOAT_OPS(f64, double)

#define DK_INT_OPS(TN, T, U)                                                                       \
    static inline DSIM_HD T dk_##TN##_sum(T x, T y)                                                \
    {                                                                                              \
        return (T)((U)x + (U)y);                                                                   \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_prod(T x, T y)                                               \
    {                                                                                              \
        return (T)((U)x * (U)y);                                                                   \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_max(T x, T y)                                                \
    {                                                                                              \
        return x > y ? x : y;                                                                      \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_min(T x, T y)                                                \
    {                                                                                              \
        return x < y ? x : y;                                                                      \
    }                                                                                              \
    static inline DSIM_HD T dk_##TN##_div(T x, int n)                                              \
    {                                                                                              \
        return (T)(x / (T)n);                                                                      \
    }

DK_INT_OPS(i32, int32_t, uint32_t)
DK_INT_OPS(i64, int64_t, uint64_t)

/* f16/bf16: widen, combine with the f32 function, round back. */
#define DK_HALF_OP(TN, OPN, TO, FROM)                                                              \
    static inline DSIM_HD uint16_t dk_##TN##_##OPN(uint16_t x, uint16_t y)                         \
    {                                                                                              \
        return TO(dk_f32_##OPN(FROM(x), FROM(y)));                                                 \
    }
#define DK_HALF_OPS(TN, TO, FROM)                                                                  \
    DK_HALF_OP(TN, sum, TO, FROM)                                                                  \
    DK_HALF_OP(TN, prod, TO, FROM)                                                                 \
    DK_HALF_OP(TN, max, TO, FROM)                                                                  \
    DK_HALF_OP(TN, min, TO, FROM)                                                                  \
    static inline DSIM_HD uint16_t dk_##TN##_div(uint16_t x, int n)                                \
    {                                                                                              \
        return TO(dk_f32_div(FROM(x), n));                                                         \
    }

DK_HALF_OPS(f16, dtype_f32_to_f16, dtype_f16_to_f32)
DK_HALF_OPS(bf16, dtype_f32_to_bf16, dtype_bf16_to_f32)

/* Every (dtype, storage type, op) the kernels are generated for, in dsim_dtype
 * order; MEAN uses sum. X(TN, DTYPE, T, OPN, OP) with OP a dsim_op. */
#define DK_FOR_EACH_TYPE_OP(X, TN, DT, T)                                                          \
    X(TN, DT, T, sum, DSIM_SUM)                                                                    \
    X(TN, DT, T, max, DSIM_MAX)                                                                    \
    X(TN, DT, T, min, DSIM_MIN)                                                                    \
    X(TN, DT, T, prod, DSIM_PROD)
#define DK_FOR_EACH(X)                                                                             \
    DK_FOR_EACH_TYPE_OP(X, f32, DSIM_F32, float)                                                   \
    DK_FOR_EACH_TYPE_OP(X, f64, DSIM_F64, double)                                                  \
    DK_FOR_EACH_TYPE_OP(X, f16, DSIM_F16, uint16_t)                                                \
    DK_FOR_EACH_TYPE_OP(X, bf16, DSIM_BF16, uint16_t)                                              \
    DK_FOR_EACH_TYPE_OP(X, i32, DSIM_I32, int32_t)                                                 \
    DK_FOR_EACH_TYPE_OP(X, i64, DSIM_I64, int64_t)
/* X(TN, DTYPE, T) once per dtype. */
#define DK_FOR_EACH_TYPE(X)                                                                        \
    X(f32, DSIM_F32, float)                                                                        \
    X(f64, DSIM_F64, double)                                                                       \
    X(f16, DSIM_F16, uint16_t)                                                                     \
    X(bf16, DSIM_BF16, uint16_t)                                                                   \
    X(i32, DSIM_I32, int32_t)                                                                      \
    X(i64, DSIM_I64, int64_t)

#endif
