/* For people who write a device backend: the ops table and the calls a
 * backend makes into the shared device layer.
 *
 * Division of work. The shared layer (src/device/device.c) owns the handles,
 * checks every argument (sizes, dtypes, ops, that each device range lies in
 * one live allocation of the right device, overlap rules), keeps the table
 * of live allocations (double and foreign frees are caught there, before the
 * backend sees them), turns a NULL stream into the device's own stream plus
 * a sync, splits n-way reductions into batches of at most
 * DSIM_DEVICE_REDUCE_BATCH inputs, and computes checksums from copies. A
 * backend only does the work, with valid arguments:
 *
 *   - stream arguments are never NULL and belong to the device the call is
 *     about (for copy_peer: to one of the two devices);
 *   - sizes are > 0 and every range lies inside a live allocation;
 *   - a failure records a message with DSIM_ERR naming the call and the
 *     backend's own error text.
 *
 * Threading: ops on one device may be called from several threads at once;
 * ops on one stream or event come from one thread at a time. */
#ifndef DSIM_SPI_DEVICE_H
#define DSIM_SPI_DEVICE_H

#include <stddef.h>

#include "dsim/api.h"
#include "dsim/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most inputs one ops->reduce call is given. */
#define DSIM_DEVICE_REDUCE_BATCH 32

typedef enum dsim_copy_kind {
    DSIM_COPY_H2D = 0, /* src host memory, dst device memory */
    DSIM_COPY_D2H,     /* src device memory, dst host memory */
    DSIM_COPY_D2D      /* both on the stream's device */
} dsim_copy_kind;

struct dsim_device_ops {
    /* sizeof(struct dsim_device_ops) as the backend was compiled;
     * registration accepts shorter (older) tables and treats missing
     * members as NULL. */
    size_t size;
    /* The backend's name: [a-z0-9_]+, unique. */
    const char *name;
    /* Bytes of backend state per device / stream / event, zeroed, found with
     * dsim_device_priv / dsim_stream_priv / dsim_event_priv. */
    size_t device_priv_size;
    size_t stream_priv_size;
    size_t event_priv_size;

    /* Required. How many devices there are. None usable (no driver, no GPU):
     * *count = 0, DSIM_OK, and a sentence in why (why_cap > 0). */
    dsim_err (*count)(int *count, char *why, size_t why_cap);
    /* Required. Fills out (zeroed, backend and index already set) for index
     * (0 <= index < count). */
    dsim_err (*query)(int index, dsim_device_info *out);
    /* Required. Sets up d's backend state for device index (checked against
     * count). options: "key=value,..." or NULL; unknown keys are DSIM_EINVAL
     * naming the known ones. On failure close is not called. */
    dsim_err (*open)(dsim_device *d, int index, const char *options);
    /* Required. Releases d's state; every stream and event is destroyed and
     * every allocation freed already. */
    void (*close)(dsim_device *d);
    /* Required. bytes > 0; the result aligned to 256 bytes at least. */
    dsim_err (*alloc)(dsim_device *d, size_t bytes, void **ptr);
    /* Required. ptr is a live allocation of d; the device's work is done
     * (the shared layer synchronised every stream of d first). */
    dsim_err (*free)(dsim_device *d, void *ptr);
    /* Required. Enqueues a copy of bytes on s. */
    dsim_err (*copy)(dsim_stream *s, dsim_copy_kind kind, void *dst, const void *src, size_t bytes);
    /* Required. Sets up a stream of dsim_stream_device(s). */
    dsim_err (*stream_create)(dsim_stream *s);
    /* Required. Called after stream_sync; releases s's state. */
    void (*stream_destroy)(dsim_stream *s);
    /* Required. Returns when s's work is done; reports its failure. */
    dsim_err (*stream_sync)(dsim_stream *s);
    /* Required. */
    dsim_err (*event_create)(dsim_event *e);
    void (*event_destroy)(dsim_event *e);
    /* Required. Captures s's work so far (s on e's device). */
    dsim_err (*event_record)(dsim_event *e, dsim_stream *s);
    /* Required. Returns when the captured work is done. */
    dsim_err (*event_sync)(dsim_event *e);
    /* Required. Enqueues out[i] = ins[0][i] op ins[1][i] op ... (left fold,
     * 1 <= n <= DSIM_DEVICE_REDUCE_BATCH; n == 1 copies); op is never
     * DSIM_MEAN (the shared layer passes DSIM_SUM). out may be the same
     * range as any input; otherwise they are disjoint. Inputs may be on an
     * enabled peer. The arithmetic must be src/device/elem.h's. */
    dsim_err (*reduce)(dsim_stream *s, void *out, const void *const *ins, int n, size_t count,
                       dsim_dtype t, dsim_op op);
    /* Required. Enqueues buf[i] = buf[i] / nranks (nranks >= 2), elem.h's
     * dk_*_div. */
    dsim_err (*reduce_div)(dsim_stream *s, void *buf, size_t count, dsim_dtype t, int nranks);

    /* Optional. Enqueues a byte fill. Not supported: DSIM_ENOTSUP. */
    dsim_err (*memset)(dsim_stream *s, void *dst, int byte, size_t bytes);
    /* Optional. *idle = 1 when s's work is done, without blocking. Not
     * supported: DSIM_ENOTSUP. */
    dsim_err (*stream_query)(dsim_stream *s, int *idle);
    /* Optional. Orders s after e's captured work (e on a device of this
     * backend, recorded at least once). Not supported: DSIM_ENOTSUP. */
    dsim_err (*stream_wait_event)(dsim_stream *s, dsim_event *e);
    /* Optional. *done = 1 when e's captured work is done, without blocking
     * (e recorded). Not supported: DSIM_ENOTSUP. */
    dsim_err (*event_query)(dsim_event *e, int *done);
    /* Optional. Milliseconds from start to end (both recorded and done).
     * Not supported: DSIM_ENOTSUP. */
    dsim_err (*event_elapsed)(dsim_event *start, dsim_event *end, double *ms);
    /* Optional. Whether index can reach peer's memory directly. Not
     * supported: never (*yes = 0). */
    dsim_err (*can_access_peer)(int index, int peer, int *yes);
    /* Optional. Lets d reach peer's memory (idempotent). Not supported:
     * DSIM_ENOTSUP. */
    dsim_err (*enable_peer)(dsim_device *d, dsim_device *peer);
    /* Optional. Enqueues a copy between two devices of this backend on s (s
     * on one of them). Not supported: the shared layer stages it through
     * host memory with copy (synchronously). */
    dsim_err (*copy_peer)(dsim_stream *s, dsim_device *dst_dev, void *dst, dsim_device *src_dev,
                          const void *src, size_t bytes);
    /* Optional, both or neither. Host memory the device copies fastest.
     * Not supported: plain aligned host memory. */
    dsim_err (*host_alloc)(dsim_device *d, size_t bytes, void **ptr);
    dsim_err (*host_free)(dsim_device *d, void *ptr);
};

/* Registers a backend by name. The table is checked (size, name, required
 * members, host_alloc/host_free paired: DSIM_EINVAL with a message naming
 * what is wrong; a taken name: DSIM_EINVAL) and copied, missing optional
 * members replaced by "not supported" stubs. The built-in backends (host,
 * and cuda in a build with CUDA) register themselves on first use. */
DSIM_API dsim_err dsim_device_register(const struct dsim_device_ops *ops);

/* The host backend (always built). */
DSIM_API extern const struct dsim_device_ops dsim_device_host_ops;

/* Backend state and context. */
DSIM_API void *dsim_device_priv(dsim_device *d);
DSIM_API void *dsim_stream_priv(dsim_stream *s);
DSIM_API void *dsim_event_priv(dsim_event *e);
DSIM_API int dsim_device_index(const dsim_device *d);
DSIM_API dsim_device *dsim_stream_device(dsim_stream *s);
DSIM_API dsim_device *dsim_event_device(dsim_event *e);

#ifdef __cplusplus
}
#endif
#endif
