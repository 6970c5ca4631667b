/* Devices: memory, copies, streams, events and reduction kernels on a CPU or
 * a GPU, behind one API.
 *
 * A device belongs to a backend, named like the transports:
 *
 *   host   plain memory and the kernels as C on the CPU; always there. It
 *          reports one device ("CPU"), or DSIM_HOST_DEVICES of them (1..64)
 *          for tests that want several; they share the machine's memory.
 *   cuda   NVIDIA GPUs through the CUDA runtime (cudaMalloc,
 *          cudaMemcpyAsync, streams, events, peer access, own kernels).
 *          Registered only in a build with CUDA (meson -Dcuda); with no
 *          GPU or no driver it reports 0 devices and says why ("no CUDA
 *          device: ..."). CUDA_VISIBLE_DEVICES is honoured by CUDA itself.
 *
 * Device memory is addressed by the pointers dsim_device_alloc returns
 * (device addresses on a GPU: never dereference them on the host). Every
 * call checks that the bytes it touches lie inside one live allocation of
 * the device it names (or of a peer it enabled, for reads), so a bad size,
 * a freed buffer or another device's pointer is an error naming the call,
 * the address and the fix, never a stray write.
 *
 * Streams order work as CUDA streams do: the calls that take a stream
 * enqueue and may return before the work is done; host buffers passed to
 * them must stay valid and unchanged (or unread, for d2h) until the stream
 * has passed that point (dsim_stream_sync, or an event recorded after it).
 * A NULL stream means "synchronous": the call returns when its work is
 * done, and it is not ordered with work queued on other streams. The host
 * backend runs streams synchronously by default; open it with the option
 * "streams=deferred" and work runs only when something waits for it, so
 * that a CPU test catches a missing synchronisation as a GPU would.
 *
 * Reductions and half precision (f16, bf16), decided to match TensorFlow
 * and NCCL: every combination of two values is computed in f32 and rounded
 * back to f16/bf16 at once (the correctly rounded half-precision result,
 * what NCCL's ring does per step with __hadd and what TensorFlow's Eigen
 * half arithmetic does per op), and an n-way reduction is a left fold that
 * rounds after every step: ((in0 op in1) op in2) ..., never an f32
 * accumulation across inputs. MEAN combines as SUM and is divided by the
 * rank count once, in dsim_device_reduce_finish (TensorFlow's collective
 * all-reduce: merge_op Add, final_op Div). Under Keras mixed precision
 * (mixed_float16 / mixed_bfloat16) variables and their gradients are f32,
 * so the gradient all-reduce itself runs in f32; f16/bf16 reductions are
 * for tensors that are f16/bf16. The kernels are one set of element
 * functions compiled by the C compiler and by nvcc, so every backend gives
 * the same bits, equal to dsim_reduce_local's except that a NaN an addition,
 * product or division produces is always the canonical quiet NaN (CPUs and
 * GPUs differ in which NaN they make). MAX/MIN propagate NaN.
 *
 * Threads: a device may be used from several threads at once; a stream or
 * an event is used by one thread at a time. Errors are dsim_err codes with
 * the calling thread's error context set (dsim_errmsg). */
#ifndef DSIM_DEVICE_H
#define DSIM_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsim_device dsim_device;
typedef struct dsim_stream dsim_stream;
typedef struct dsim_event dsim_event;

#define DSIM_DEVICE_NAME_MAX 256
/* How many host devices DSIM_HOST_DEVICES may ask for. */
#define DSIM_DEVICE_HOST_MAX 64

typedef struct dsim_device_info {
    char backend[32];                /* "host", "cuda" */
    int index;                       /* 0-based, within the backend */
    char name[DSIM_DEVICE_NAME_MAX]; /* "NVIDIA H200", "CPU: <model>" */
    uint64_t total_bytes;            /* device memory (host: physical memory) */
    int cc_major, cc_minor;          /* compute capability (cuda); 0.0 on host */
    int multiprocessors;             /* SMs (cuda); online CPUs (host) */
    double mem_bw_gbs;               /* peak memory bandwidth, GB/s (10^9 B/s); 0 unknown */
    char bus_id[32];                 /* PCI bus id "0000:3b:00.0" (cuda); "" on host */
} dsim_device_info;

/* The registered backends' names, NULL-terminated ("host" first; "cuda"
 * in a build with CUDA). */
DSIM_API const char *const *dsim_device_backends(void);

/* How many devices backend has. With none usable, *count is 0, DSIM_OK is
 * returned and why (if not NULL) holds the reason, e.g. "no CUDA device:
 * CUDA driver version is insufficient for CUDA runtime version". An unknown
 * backend (or cuda in a build without it) is DSIM_ENOENT. */
DSIM_API dsim_err dsim_device_count(const char *backend, int *count, char *why, size_t why_cap);
/* What device index of backend is, without opening it. */
DSIM_API dsim_err dsim_device_query(const char *backend, int index, dsim_device_info *out);
/* Whether device index can read and write peer's memory directly once
 * dsim_device_enable_peer allows it (*yes 0 or 1). Backends that cannot
 * tell answer 0. */
DSIM_API dsim_err dsim_device_can_access_peer(const char *backend, int index, int peer, int *yes);

/* Opens device index of backend. options: "key=value,..." or NULL; an
 * unknown key is DSIM_EINVAL naming the known ones (host: streams=sync|
 * deferred; cuda: none). Each open is a separate handle with its own
 * allocations, even for the same index. */
DSIM_API dsim_err dsim_device_open(const char *backend, int index, const char *options,
                                   dsim_device **out);
/* Waits for the device's work, destroys the streams and events still open
 * and frees what is still allocated; the handle is gone even on an error.
 * DSIM_ESTATE when something was left (allocations, streams, events: the
 * message counts them), so that a test catches the leak. NULL is a no-op. */
DSIM_API dsim_err dsim_device_close(dsim_device *d);
DSIM_API const dsim_device_info *dsim_device_get_info(const dsim_device *d);
/* Lets d's kernels read peer's allocations (reduction inputs) and d's
 * copies reach peer directly. Both of one backend; idempotent.
 * DSIM_ENOTSUP when the pair cannot (copies still work, staged). */
DSIM_API dsim_err dsim_device_enable_peer(dsim_device *d, dsim_device *peer);

/* ---- memory ---- */

/* bytes > 0. The contents are undefined (the host backend fills them with
 * 0xff bytes, NaN in every float type, so that a read of memory nobody
 * wrote shows). Aligned to at least 256 bytes. */
DSIM_API dsim_err dsim_device_alloc(dsim_device *d, size_t bytes, void **ptr);
/* ptr as dsim_device_alloc returned it. Waits for the device's work first
 * (as cudaFree does). A pointer that is not a live allocation of d (freed
 * already, inside an allocation, another device's) is DSIM_EINVAL and
 * nothing is freed. */
DSIM_API dsim_err dsim_device_free(dsim_device *d, void *ptr);
/* The live allocations of d and their bytes (either pointer may be NULL). */
DSIM_API void dsim_device_mem_live(dsim_device *d, size_t *allocs, size_t *bytes);
/* Host memory the device copies fastest from and to (page-locked on cuda;
 * plain aligned memory where the backend has no such thing, *pinned 0).
 * Free with dsim_device_host_free on the same device. */
DSIM_API dsim_err dsim_device_host_alloc(dsim_device *d, size_t bytes, void **ptr, int *pinned);
DSIM_API dsim_err dsim_device_host_free(dsim_device *d, void *ptr);

/* ---- copies (bytes may be 0: nothing happens) ---- */

DSIM_API dsim_err dsim_device_memset(dsim_device *d, void *dst, int byte, size_t bytes,
                                     dsim_stream *s);
/* Host to device: src is host memory, dst device memory of d. */
DSIM_API dsim_err dsim_device_copy_h2d(dsim_device *d, void *dst, const void *src, size_t bytes,
                                       dsim_stream *s);
/* Device to host. */
DSIM_API dsim_err dsim_device_copy_d2h(dsim_device *d, void *dst, const void *src, size_t bytes,
                                       dsim_stream *s);
/* Device to device: within one device, or between two devices of one
 * backend (a peer copy: direct where the hardware allows, staged through
 * host memory by the driver otherwise). s belongs to either device. The
 * ranges must not overlap unless they are the same. */
DSIM_API dsim_err dsim_device_copy_d2d(dsim_device *dst_dev, void *dst, dsim_device *src_dev,
                                       const void *src, size_t bytes, dsim_stream *s);

/* ---- streams and events ---- */

DSIM_API dsim_err dsim_stream_create(dsim_device *d, dsim_stream **out);
/* Waits for the stream's work, then destroys it. NULL is a no-op. */
DSIM_API dsim_err dsim_stream_destroy(dsim_stream *s);
/* Returns when everything enqueued on s so far is done; a failure of that
 * work is reported here. */
DSIM_API dsim_err dsim_stream_sync(dsim_stream *s);
/* *idle = 1 when everything enqueued on s is done (never blocks). */
DSIM_API dsim_err dsim_stream_query(dsim_stream *s, int *idle);
/* Work enqueued on s from now on starts after the work e captured (its
 * last dsim_event_record) is done. An event never recorded: nothing to wait
 * for. e may belong to another device of the same backend. */
DSIM_API dsim_err dsim_stream_wait_event(dsim_stream *s, dsim_event *e);

DSIM_API dsim_err dsim_event_create(dsim_device *d, dsim_event **out);
DSIM_API dsim_err dsim_event_destroy(dsim_event *e);
/* Captures the work enqueued on s so far (s on e's device). */
DSIM_API dsim_err dsim_event_record(dsim_event *e, dsim_stream *s);
/* Returns when the captured work is done (at once if never recorded). */
DSIM_API dsim_err dsim_event_sync(dsim_event *e);
/* *done = 1 when the captured work is done (never blocks). */
DSIM_API dsim_err dsim_event_query(dsim_event *e, int *done);
/* Milliseconds between two recorded, completed events of one device. */
DSIM_API dsim_err dsim_event_elapsed_ms(dsim_event *start, dsim_event *end, double *ms);

/* ---- reductions (count elements of type t) ---- */

/* inout[i] = inout[i] op in[i]. MEAN combines as SUM. inout on d; in on d
 * or on an enabled peer; the two are the same range or disjoint. */
DSIM_API dsim_err dsim_device_reduce(dsim_device *d, void *inout, const void *in, size_t count,
                                     dsim_dtype t, dsim_op op, dsim_stream *s);
/* out[i] = ((ins[0][i] op ins[1][i]) op ins[2][i]) ... over n >= 1 inputs
 * (n == 1 copies). MEAN combines as SUM. out on d; each input on d or an
 * enabled peer, the same range as out or disjoint from it. (When out is
 * one of the inputs after the 32nd, the call reduces into a temporary and
 * returns when it is done, whatever the stream.) */
DSIM_API dsim_err dsim_device_reduce_n(dsim_device *d, void *out, const void *const *ins, int n,
                                       size_t count, dsim_dtype t, dsim_op op, dsim_stream *s);
/* Finishes a reduction over nranks contributions: MEAN divides by nranks
 * (rounded once; integers truncate toward zero); other ops do nothing. */
DSIM_API dsim_err dsim_device_reduce_finish(dsim_device *d, void *buf, size_t count, dsim_dtype t,
                                            dsim_op op, int nranks, dsim_stream *s);

/* ---- checksums ---- */

/* The checksum of bytes of device memory, brought back to the host in
 * chunks (synchronous; waits for nothing else). For a float array of n
 * elements (bytes = 4n) it equals dsim_params_checksum(p, n) of the same
 * values in host memory, so replicas on devices and on the host compare. */
DSIM_API dsim_err dsim_device_checksum(dsim_device *d, const void *ptr, size_t bytes,
                                       uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
