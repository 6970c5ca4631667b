/* The CUDA backend's kernels: src/device/elem.h's element functions, the
 * ones the host backend runs on the CPU, applied by grid-stride loops.
 *
 * Each thread takes element i of every input before it writes out[i], so
 * out may be the same range as any input (the shared layer allows exactly
 * that or disjoint ranges). The input pointers travel by value in the
 * kernel's parameters (DSIM_DEVICE_REDUCE_BATCH of them, 256 bytes). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_int.h"
#include "device/elem.h"
#include "dsim/dtype.h"
#include "dsim/reduce.h"
#include "dsim/spi/device.h"

struct dk_ptrs {
    const void *p[DSIM_DEVICE_REDUCE_BATCH];
};

#define DK_OP_STRUCT(TN, DT, T, OPN, OP)                                                           \
    struct dk_op_##TN##_##OPN {                                                                    \
        typedef T type;                                                                            \
        static __device__ __forceinline__ T apply(T a, T b)                                        \
        {                                                                                          \
            return dk_##TN##_##OPN(a, b);                                                          \
        }                                                                                          \
    };
DK_FOR_EACH(DK_OP_STRUCT)

#define DK_DIV_STRUCT(TN, DT, T)                                                                   \
    struct dk_div_##TN {                                                                           \
        typedef T type;                                                                            \
        static __device__ __forceinline__ T apply(T a, int n)                                      \
        {                                                                                          \
            return dk_##TN##_div(a, n);                                                            \
        }                                                                                          \
    };
DK_FOR_EACH_TYPE(DK_DIV_STRUCT)

template <typename Op>
__global__ void dk_reduce_kernel(typename Op::type *out, dk_ptrs ins, int n, size_t count)
{
    typedef typename Op::type T;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        T acc = ((const T *)ins.p[0])[i];
        for (int k = 1; k < n; k++)
            acc = Op::apply(acc, ((const T *)ins.p[k])[i]);
        out[i] = acc;
    }
}

template <typename Div>
__global__ void dk_div_kernel(typename Div::type *buf, size_t count, int nranks)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        buf[i] = Div::apply(buf[i], nranks);
}

#define DK_THREADS 256

/* Enough blocks to fill the GPU a few times over; the loops stride past. */
static unsigned dk_blocks(size_t count, int sms)
{
    size_t want = (count + DK_THREADS - 1) / DK_THREADS;
    size_t cap = (size_t)(sms > 0 ? sms : 108) * 16;
    return (unsigned)(want < cap ? want : cap);
}

extern "C" int dsim_cuda_launch_reduce(void *out, const void *const *ins, int n, size_t count,
                                       int dtype, int op, cudaStream_t s, int sms)
{
    if (n < 1 || n > DSIM_DEVICE_REDUCE_BATCH || count == 0)
        return (int)cudaErrorInvalidValue;
    dk_ptrs p = {};
    for (int k = 0; k < n; k++)
        p.p[k] = ins[k];
    unsigned blocks = dk_blocks(count, sms);
#define DK_CASE(TN, DT, T, OPN, OP)                                                                \
    if (dtype == DT && op == OP) {                                                                 \
        dk_reduce_kernel<dk_op_##TN##_##OPN><<<blocks, DK_THREADS, 0, s>>>((T *)out, p, n, count); \
        return (int)cudaGetLastError();                                                            \
    }
    DK_FOR_EACH(DK_CASE)
#undef DK_CASE
    return (int)cudaErrorInvalidValue;
}

extern "C" int dsim_cuda_launch_div(void *buf, size_t count, int dtype, int nranks, cudaStream_t s,
                                    int sms)
{
    if (nranks < 1 || count == 0)
        return (int)cudaErrorInvalidValue;
    unsigned blocks = dk_blocks(count, sms);
#define DK_CASE(TN, DT, T)                                                                         \
    if (dtype == DT) {                                                                             \
        dk_div_kernel<dk_div_##TN><<<blocks, DK_THREADS, 0, s>>>((T *)buf, count, nranks);         \
        return (int)cudaGetLastError();                                                            \
    }
    DK_FOR_EACH_TYPE(DK_CASE)
#undef DK_CASE
    return (int)cudaErrorInvalidValue;
}
