/* The CUDA backend's kernel launchers (kernels.cu, compiled by nvcc), called
 * from its C half (cuda.c). Each enqueues on stream s and returns the
 * launch's cudaError_t as an int (0: cudaSuccess); sms sizes the grid. */
#ifndef DSIM_DEVICE_CUDA_INT_H
#define DSIM_DEVICE_CUDA_INT_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = ins[0][i] op ins[1][i] op ... (1 <= n <= DSIM_DEVICE_REDUCE_BATCH),
 * dtype a dsim_dtype, op a dsim_op other than DSIM_MEAN. */
int dsim_cuda_launch_reduce(void *out, const void *const *ins, int n, size_t count, int dtype,
                            int op, cudaStream_t s, int sms);
/* buf[i] = buf[i] / nranks. */
int dsim_cuda_launch_div(void *buf, size_t count, int dtype, int nranks, cudaStream_t s, int sms);

#ifdef __cplusplus
}
#endif
#endif
