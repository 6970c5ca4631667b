/* The CUDA device backend: NVIDIA GPUs through the CUDA runtime API.
 * Memory with cudaMalloc, copies with cudaMemcpyAsync (between GPUs
 * cudaMemcpyPeerAsync, direct over NVLink/PCIe when peer access is enabled,
 * staged by the driver otherwise), non-blocking streams, timing events, and
 * the reduction kernels of kernels.cu (elem.h's arithmetic).
 *
 * The CUDA runtime keeps the current device per thread, and a device here
 * may be used from any thread: every call selects its device first
 * (cudaSetDevice is cheap when it is current already).
 *
 * Without a GPU or a driver, cudaGetDeviceCount fails: count reports 0
 * devices and "no CUDA device: <the runtime's reason>", nothing else runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_int.h"
#include "dsim/spi/device.h"

typedef struct cuda_dev {
    int sms; /* multiprocessors, to size grids */
} cuda_dev;

typedef struct cuda_stream {
    cudaStream_t st;
} cuda_stream;

typedef struct cuda_event {
    cudaEvent_t ev;
} cuda_event;

static dsim_err cuda_code(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return DSIM_ENOMEM;
    case cudaErrorInvalidValue:
        return DSIM_EINVAL;
    case cudaErrorNotSupported:
        return DSIM_ENOTSUP;
    default:
        return DSIM_EIO;
    }
}

/* Records a CUDA failure of call on device index (-1: none) and returns
 * its dsim_err. Clears the runtime's last error, which is not sticky. */
static dsim_err cuda_fail(cudaError_t e, const char *call, int index)
{
    (void)cudaGetLastError();
    char where[32] = "";
    if (index >= 0)
        snprintf(where, sizeof where, " on cuda:%d", index);
    return DSIM_ERR(cuda_code(e), -1, "%s%s failed: %s (%s)", call, where, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

#define CUDA_TRY(call, index)                                                                      \
    do {                                                                                           \
        cudaError_t cuda_try_e_ = (call);                                                          \
        if (cuda_try_e_ != cudaSuccess)                                                            \
            return cuda_fail(cuda_try_e_, #call, (index));                                         \
    } while (0)

static dsim_err cuda_use(dsim_device *d)
{
    int index = dsim_device_index(d);
    CUDA_TRY(cudaSetDevice(index), index);
    return DSIM_OK;
}

static cudaStream_t cuda_st(dsim_stream *s)
{
    return ((cuda_stream *)dsim_stream_priv(s))->st;
}

/* ---- enumeration ---- */

static dsim_err cuda_count(int *count, char *why, size_t why_cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *count = 0;
        snprintf(why, why_cap, "no CUDA device: %s", cudaGetErrorString(e));
        return DSIM_OK;
    }
    *count = n;
    if (n == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(why, why_cap, "no CUDA device: the driver reports none%s%s%s",
                 vis ? " (CUDA_VISIBLE_DEVICES='" : "", vis ? vis : "", vis ? "')" : "");
    }
    return DSIM_OK;
}

static dsim_err cuda_query(int index, dsim_device_info *out)
{
    struct cudaDeviceProp p;
    CUDA_TRY(cudaGetDeviceProperties(&p, index), index);
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->total_bytes = (uint64_t)p.totalGlobalMem;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->multiprocessors = p.multiProcessorCount;
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, index) == cudaSuccess &&
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, index) == cudaSuccess)
        out->mem_bw_gbs =
            2.0 * (double)khz * 1e3 * ((double)bits / 8.0) / 1e9; /* double data rate */
    (void)cudaGetLastError();
    if (cudaDeviceGetPCIBusId(out->bus_id, (int)sizeof out->bus_id, index) != cudaSuccess) {
        (void)cudaGetLastError();
        out->bus_id[0] = '\0';
    }
    return DSIM_OK;
}

static dsim_err cuda_can_access_peer(int index, int peer, int *yes)
{
    CUDA_TRY(cudaDeviceCanAccessPeer(yes, index, peer), index);
    return DSIM_OK;
}

/* ---- devices and memory ---- */

static dsim_err cuda_open(dsim_device *d, int index, const char *options)
{
    if (options && *options)
        return DSIM_ERR(DSIM_EINVAL, -1, "cuda device: unknown option '%s' (it takes none)",
                        options);
    cuda_dev *cd = dsim_device_priv(d);
    DSIM_CHECK(cuda_use(d));
    /* Creates the context now, so that its failure is reported by open. */
    CUDA_TRY(cudaFree(NULL), index);
    CUDA_TRY(cudaDeviceGetAttribute(&cd->sms, cudaDevAttrMultiProcessorCount, index), index);
    return DSIM_OK;
}

static void cuda_close(dsim_device *d)
{
    (void)d; /* the primary context stays for other handles */
}

static dsim_err cuda_alloc(dsim_device *d, size_t bytes, void **ptr)
{
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaMalloc(ptr, bytes), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_free(dsim_device *d, void *ptr)
{
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaFree(ptr), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_host_alloc(dsim_device *d, size_t bytes, void **ptr)
{
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaMallocHost(ptr, bytes), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_host_free(dsim_device *d, void *ptr)
{
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaFreeHost(ptr), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_enable_peer(dsim_device *d, dsim_device *peer)
{
    int index = dsim_device_index(d), pi = dsim_device_index(peer), yes = 0;
    if (index == pi)
        return DSIM_OK;
    CUDA_TRY(cudaDeviceCanAccessPeer(&yes, index, pi), index);
    if (!yes)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "dsim_device_enable_peer: cuda:%d cannot access cuda:%d directly (no "
                        "NVLink or PCIe peer path); copies between them are staged by the driver",
                        index, pi);
    DSIM_CHECK(cuda_use(d));
    cudaError_t e = cudaDeviceEnablePeerAccess(pi, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        return DSIM_OK;
    }
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaDeviceEnablePeerAccess", index);
    return DSIM_OK;
}

/* ---- work ---- */

static dsim_err cuda_copy(dsim_stream *s, dsim_copy_kind kind, void *dst, const void *src,
                          size_t bytes)
{
    dsim_device *d = dsim_stream_device(s);
    static const enum cudaMemcpyKind kinds[] = {
        [DSIM_COPY_H2D] = cudaMemcpyHostToDevice,
        [DSIM_COPY_D2H] = cudaMemcpyDeviceToHost,
        [DSIM_COPY_D2D] = cudaMemcpyDeviceToDevice,
    };
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kinds[kind], cuda_st(s)), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_copy_peer(dsim_stream *s, dsim_device *dst_dev, void *dst,
                               dsim_device *src_dev, const void *src, size_t bytes)
{
    dsim_device *d = dsim_stream_device(s);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaMemcpyPeerAsync(dst, dsim_device_index(dst_dev), src, dsim_device_index(src_dev),
                                 bytes, cuda_st(s)),
             dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_memset(dsim_stream *s, void *dst, int byte, size_t bytes)
{
    dsim_device *d = dsim_stream_device(s);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaMemsetAsync(dst, byte, bytes, cuda_st(s)), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_reduce(dsim_stream *s, void *out, const void *const *ins, int n, size_t count,
                            dsim_dtype t, dsim_op op)
{
    dsim_device *d = dsim_stream_device(s);
    cuda_dev *cd = dsim_device_priv(d);
    DSIM_CHECK(cuda_use(d));
    cudaError_t e = (cudaError_t)dsim_cuda_launch_reduce(out, ins, n, count, (int)t, (int)op,
                                                         cuda_st(s), cd->sms);
    if (e != cudaSuccess)
        return cuda_fail(e, "the reduction kernel's launch", dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_reduce_div(dsim_stream *s, void *buf, size_t count, dsim_dtype t, int nranks)
{
    dsim_device *d = dsim_stream_device(s);
    cuda_dev *cd = dsim_device_priv(d);
    DSIM_CHECK(cuda_use(d));
    cudaError_t e =
        (cudaError_t)dsim_cuda_launch_div(buf, count, (int)t, nranks, cuda_st(s), cd->sms);
    if (e != cudaSuccess)
        return cuda_fail(e, "the division kernel's launch", dsim_device_index(d));
    return DSIM_OK;
}

/* ---- streams and events ---- */

static dsim_err cuda_stream_create(dsim_stream *s)
{
    dsim_device *d = dsim_stream_device(s);
    cuda_stream *cs = dsim_stream_priv(s);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaStreamCreateWithFlags(&cs->st, cudaStreamNonBlocking), dsim_device_index(d));
    return DSIM_OK;
}

static void cuda_stream_destroy(dsim_stream *s)
{
    dsim_device *d = dsim_stream_device(s);
    if (cuda_use(d) == DSIM_OK && cudaStreamDestroy(cuda_st(s)) != cudaSuccess)
        (void)cudaGetLastError();
}

static dsim_err cuda_stream_sync(dsim_stream *s)
{
    dsim_device *d = dsim_stream_device(s);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaStreamSynchronize(cuda_st(s)), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_stream_query(dsim_stream *s, int *idle)
{
    dsim_device *d = dsim_stream_device(s);
    DSIM_CHECK(cuda_use(d));
    cudaError_t e = cudaStreamQuery(cuda_st(s));
    *idle = e == cudaSuccess;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return DSIM_OK;
    }
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaStreamQuery", dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_stream_wait_event(dsim_stream *s, dsim_event *e)
{
    dsim_device *d = dsim_stream_device(s);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaStreamWaitEvent(cuda_st(s), ((cuda_event *)dsim_event_priv(e))->ev, 0),
             dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_event_create(dsim_event *e)
{
    dsim_device *d = dsim_event_device(e);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaEventCreate(&((cuda_event *)dsim_event_priv(e))->ev), dsim_device_index(d));
    return DSIM_OK;
}

static void cuda_event_destroy(dsim_event *e)
{
    dsim_device *d = dsim_event_device(e);
    if (cuda_use(d) == DSIM_OK &&
        cudaEventDestroy(((cuda_event *)dsim_event_priv(e))->ev) != cudaSuccess)
        (void)cudaGetLastError();
}

static dsim_err cuda_event_record(dsim_event *e, dsim_stream *s)
{
    dsim_device *d = dsim_event_device(e);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaEventRecord(((cuda_event *)dsim_event_priv(e))->ev, cuda_st(s)),
             dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_event_sync(dsim_event *e)
{
    dsim_device *d = dsim_event_device(e);
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaEventSynchronize(((cuda_event *)dsim_event_priv(e))->ev), dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_event_query(dsim_event *e, int *done)
{
    dsim_device *d = dsim_event_device(e);
    DSIM_CHECK(cuda_use(d));
    cudaError_t r = cudaEventQuery(((cuda_event *)dsim_event_priv(e))->ev);
    *done = r == cudaSuccess;
    if (r == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return DSIM_OK;
    }
    if (r != cudaSuccess)
        return cuda_fail(r, "cudaEventQuery", dsim_device_index(d));
    return DSIM_OK;
}

static dsim_err cuda_event_elapsed(dsim_event *start, dsim_event *end, double *ms)
{
    dsim_device *d = dsim_event_device(start);
    float f = 0;
    DSIM_CHECK(cuda_use(d));
    CUDA_TRY(cudaEventElapsedTime(&f, ((cuda_event *)dsim_event_priv(start))->ev,
                                  ((cuda_event *)dsim_event_priv(end))->ev),
             dsim_device_index(d));
    *ms = f;
    return DSIM_OK;
}

const struct dsim_device_ops dsim_device_cuda_ops = {
    .size = sizeof(struct dsim_device_ops),
    .name = "cuda",
    .device_priv_size = sizeof(cuda_dev),
    .stream_priv_size = sizeof(cuda_stream),
    .event_priv_size = sizeof(cuda_event),
    .count = cuda_count,
    .query = cuda_query,
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_sync = cuda_event_sync,
    .reduce = cuda_reduce,
    .reduce_div = cuda_reduce_div,
    .memset = cuda_memset,
    .stream_query = cuda_stream_query,
    .stream_wait_event = cuda_stream_wait_event,
    .event_query = cuda_event_query,
    .event_elapsed = cuda_event_elapsed,
    .can_access_peer = cuda_can_access_peer,
    .enable_peer = cuda_enable_peer,
    .copy_peer = cuda_copy_peer,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};
