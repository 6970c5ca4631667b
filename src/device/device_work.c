/* The device layer's dispatch, continued: copies, streams, events,
 * reductions and checksums. Each call checks its arguments (device.c's
 * range checks), picks the stream (NULL: the device's own, then a sync) and
 * hands the work to the backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

/* ---- streams the work goes on ---- */

dsim_err dev_pick_stream(dsim_device *d, dsim_device *other, dsim_stream *s, const char *fn,
                         dsim_stream **use)
{
    if (!s) {
        *use = d->own;
        return DSIM_OK;
    }
    if (s->dev == d || (other && s->dev == other)) {
        *use = s;
        return DSIM_OK;
    }
    *use = NULL;
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "%s: the stream belongs to %s, not to %s%s%s; use a stream of that device "
                    "(or NULL for a synchronous call)",
                    fn, s->dev->label, d->label, other ? " or " : "", other ? other->label : "");
}

dsim_err dev_done(dsim_stream *use, dsim_stream *s, dsim_err e)
{
    if (e == DSIM_OK && !s)
        e = use->dev->ops->stream_sync(use);
    return e;
}

static dsim_err dev_null(const char *fn, const char *what)
{
    return DSIM_ERR(DSIM_EINVAL, -1, "%s: %s is NULL", fn, what);
}

/* Non-zero when [a, a+n) and [b, b+n) overlap without being the same. */
static int dev_partial_overlap(const void *a, const void *b, size_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x != y && (x < y ? y - x : x - y) < n;
}

/* A host-side argument that is device memory of d works on the host
 * backend by accident and fails on a GPU: refuse it everywhere. */
static dsim_err dev_check_host(dsim_device *d, const char *fn, const char *what, const void *p,
                               size_t bytes)
{
    int hit = dev_overlaps_mem(d, p, bytes);
    if (hit)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %s %p should be host memory but is device memory of %s; use "
                        "dsim_device_copy_d2d between device buffers",
                        fn, what, p, d->label);
    return DSIM_OK;
}

/* ---- copies ---- */

dsim_err dsim_device_memset(dsim_device *d, void *dst, int byte, size_t bytes, dsim_stream *s)
{
    static const char fn[] = "dsim_device_memset";
    if (!d)
        return dev_null(fn, "the device");
    if (bytes == 0)
        return DSIM_OK;
    dsim_stream *use;
    DSIM_CHECK(dev_check_range(d, fn, "the destination", dst, bytes, 0));
    DSIM_CHECK(dev_pick_stream(d, NULL, s, fn, &use));
    return dev_done(use, s, d->ops->memset(use, dst, byte & 0xff, bytes));
}

dsim_err dsim_device_copy_h2d(dsim_device *d, void *dst, const void *src, size_t bytes,
                              dsim_stream *s)
{
    static const char fn[] = "dsim_device_copy_h2d";
    if (!d)
        return dev_null(fn, "the device");
    if (bytes == 0)
        return DSIM_OK;
    if (!src)
        return dev_null(fn, "the source (host memory)");
    DSIM_CHECK(dev_check_host(d, fn, "the source", src, bytes));
    dsim_stream *use;
    DSIM_CHECK(dev_check_range(d, fn, "the destination", dst, bytes, 0));
    DSIM_CHECK(dev_pick_stream(d, NULL, s, fn, &use));
    return dev_done(use, s, d->ops->copy(use, DSIM_COPY_H2D, dst, src, bytes));
}

dsim_err dsim_device_copy_d2h(dsim_device *d, void *dst, const void *src, size_t bytes,
                              dsim_stream *s)
{
    static const char fn[] = "dsim_device_copy_d2h";
    if (!d)
        return dev_null(fn, "the device");
    if (bytes == 0)
        return DSIM_OK;
    if (!dst)
        return dev_null(fn, "the destination (host memory)");
    DSIM_CHECK(dev_check_host(d, fn, "the destination", dst, bytes));
    dsim_stream *use;
    DSIM_CHECK(dev_check_range(d, fn, "the source", src, bytes, 0));
    DSIM_CHECK(dev_pick_stream(d, NULL, s, fn, &use));
    return dev_done(use, s, d->ops->copy(use, DSIM_COPY_D2H, dst, src, bytes));
}

/* A copy between two devices of a backend without copy_peer: through a
 * host buffer, synchronously, after the work already on `use`. */
static dsim_err dev_copy_staged(dsim_stream *use, dsim_device *dd, void *dst, dsim_device *sd,
                                const void *src, size_t bytes)
{
    DSIM_CHECK(use->dev->ops->stream_sync(use));
    size_t chunk = bytes < ((size_t)1 << 20) ? bytes : ((size_t)1 << 20);
    unsigned char *buf = malloc(chunk);
    if (!buf)
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "dsim_device_copy_d2d: out of host memory to stage %s -> %s", sd->label,
                        dd->label);
    dsim_err e = DSIM_OK;
    for (size_t off = 0; off < bytes && e == DSIM_OK; off += chunk) {
        size_t m = bytes - off < chunk ? bytes - off : chunk;
        e = sd->ops->copy(sd->own, DSIM_COPY_D2H, buf, (const unsigned char *)src + off, m);
        if (e == DSIM_OK)
            e = sd->ops->stream_sync(sd->own);
        if (e == DSIM_OK)
            e = dd->ops->copy(dd->own, DSIM_COPY_H2D, (unsigned char *)dst + off, buf, m);
        if (e == DSIM_OK)
            e = dd->ops->stream_sync(dd->own);
    }
    free(buf);
    return e;
}

dsim_err dsim_device_copy_d2d(dsim_device *dst_dev, void *dst, dsim_device *src_dev,
                              const void *src, size_t bytes, dsim_stream *s)
{
    static const char fn[] = "dsim_device_copy_d2d";
    if (!dst_dev || !src_dev)
        return dev_null(fn, dst_dev ? "the source device" : "the destination device");
    if (dst_dev->ops != src_dev->ops)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %s and %s belong to different backends; copy through host memory "
                        "(dsim_device_copy_d2h, then dsim_device_copy_h2d)",
                        fn, src_dev->label, dst_dev->label);
    if (bytes == 0)
        return DSIM_OK;
    dsim_stream *use;
    DSIM_CHECK(dev_check_range(dst_dev, fn, "the destination", dst, bytes, 0));
    DSIM_CHECK(dev_check_range(src_dev, fn, "the source", src, bytes, 0));
    DSIM_CHECK(dev_pick_stream(dst_dev, src_dev, s, fn, &use));
    if (dev_partial_overlap(dst, src, bytes))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: the source and the destination overlap in part; copy through a "
                        "separate buffer",
                        fn);
    if (dst == src)
        return dev_done(use, s, DSIM_OK);
    const struct dsim_device_ops *ops = dst_dev->ops;
    dsim_err e;
    if (dst_dev == src_dev)
        e = ops->copy(use, DSIM_COPY_D2D, dst, src, bytes);
    else if (ops->copy_peer)
        e = ops->copy_peer(use, dst_dev, dst, src_dev, src, bytes);
    else
        e = dev_copy_staged(use, dst_dev, dst, src_dev, src, bytes);
    return dev_done(use, s, e);
}

/* ---- streams ---- */

dsim_err dsim_stream_create(dsim_device *d, dsim_stream **out)
{
    static const char fn[] = "dsim_stream_create";
    if (!d || !out)
        return dev_null(fn, d ? "out" : "the device");
    *out = NULL;
    void *priv = NULL;
    dsim_stream *s = dev_handle_alloc(sizeof *s, d->ops->stream_priv_size, &priv);
    if (!s)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", fn);
    s->dev = d;
    s->priv = priv;
    dsim_err e = d->ops->stream_create(s);
    if (e != DSIM_OK) {
        free(s);
        return e;
    }
    pthread_mutex_lock(&d->lock);
    s->next = d->streams;
    if (d->streams)
        d->streams->prev = s;
    d->streams = s;
    pthread_mutex_unlock(&d->lock);
    *out = s;
    return DSIM_OK;
}

dsim_err dsim_stream_destroy(dsim_stream *s)
{
    if (!s)
        return DSIM_OK;
    dsim_device *d = s->dev;
    dsim_err e = d->ops->stream_sync(s);
    dsim_error saved;
    if (e != DSIM_OK)
        dsim_error_copy(&saved);
    pthread_mutex_lock(&d->lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        d->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    pthread_mutex_unlock(&d->lock);
    d->ops->stream_destroy(s);
    free(s);
    if (e != DSIM_OK)
        dsim_error_restore(&saved);
    return e;
}

dsim_err dsim_stream_sync(dsim_stream *s)
{
    return s ? s->dev->ops->stream_sync(s) : DSIM_OK;
}

dsim_err dsim_stream_query(dsim_stream *s, int *idle)
{
    if (!idle)
        return dev_null("dsim_stream_query", "idle");
    *idle = 1;
    return s ? s->dev->ops->stream_query(s, idle) : DSIM_OK;
}

dsim_err dsim_stream_wait_event(dsim_stream *s, dsim_event *e)
{
    static const char fn[] = "dsim_stream_wait_event";
    if (!s || !e)
        return dev_null(fn, s ? "the event" : "the stream");
    if (s->dev->ops != e->dev->ops)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: the stream is on %s and the event on %s, of another backend; sync "
                        "the event instead (dsim_event_sync)",
                        fn, s->dev->label, e->dev->label);
    if (!e->recorded)
        return DSIM_OK; /* nothing captured: nothing to wait for */
    return s->dev->ops->stream_wait_event(s, e);
}

/* ---- events ---- */

dsim_err dsim_event_create(dsim_device *d, dsim_event **out)
{
    static const char fn[] = "dsim_event_create";
    if (!d || !out)
        return dev_null(fn, d ? "out" : "the device");
    *out = NULL;
    void *priv = NULL;
    dsim_event *e = dev_handle_alloc(sizeof *e, d->ops->event_priv_size, &priv);
    if (!e)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", fn);
    e->dev = d;
    e->priv = priv;
    dsim_err err = d->ops->event_create(e);
    if (err != DSIM_OK) {
        free(e);
        return err;
    }
    pthread_mutex_lock(&d->lock);
    e->next = d->events;
    if (d->events)
        d->events->prev = e;
    d->events = e;
    pthread_mutex_unlock(&d->lock);
    *out = e;
    return DSIM_OK;
}

dsim_err dsim_event_destroy(dsim_event *e)
{
    if (!e)
        return DSIM_OK;
    dsim_device *d = e->dev;
    pthread_mutex_lock(&d->lock);
    if (e->prev)
        e->prev->next = e->next;
    else
        d->events = e->next;
    if (e->next)
        e->next->prev = e->prev;
    pthread_mutex_unlock(&d->lock);
    d->ops->event_destroy(e);
    free(e);
    return DSIM_OK;
}

dsim_err dsim_event_record(dsim_event *e, dsim_stream *s)
{
    static const char fn[] = "dsim_event_record";
    if (!e)
        return dev_null(fn, "the event");
    dsim_stream *use;
    DSIM_CHECK(dev_pick_stream(e->dev, NULL, s, fn, &use));
    DSIM_CHECK(e->dev->ops->event_record(e, use));
    e->recorded = 1;
    return dev_done(use, s, DSIM_OK);
}

dsim_err dsim_event_sync(dsim_event *e)
{
    if (!e)
        return dev_null("dsim_event_sync", "the event");
    return e->recorded ? e->dev->ops->event_sync(e) : DSIM_OK;
}

dsim_err dsim_event_query(dsim_event *e, int *done)
{
    static const char fn[] = "dsim_event_query";
    if (!e || !done)
        return dev_null(fn, e ? "done" : "the event");
    *done = 1;
    return e->recorded ? e->dev->ops->event_query(e, done) : DSIM_OK;
}

dsim_err dsim_event_elapsed_ms(dsim_event *start, dsim_event *end, double *ms)
{
    static const char fn[] = "dsim_event_elapsed_ms";
    if (!start || !end || !ms)
        return dev_null(fn, !start ? "start" : !end ? "end" : "ms");
    *ms = 0;
    if (start->dev != end->dev)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: the events are on %s and %s; time events of one device", fn,
                        start->dev->label, end->dev->label);
    if (!start->recorded || !end->recorded)
        return DSIM_ERR(DSIM_ESTATE, -1, "%s: the %s event was never recorded; record both first",
                        fn, start->recorded ? "end" : "start");
    return start->dev->ops->event_elapsed(start, end, ms);
}

/* ---- reductions ---- */

static dsim_err dev_check_type(const char *fn, dsim_dtype t, dsim_op op, size_t count,
                               size_t *bytes)
{
    if ((unsigned)t >= DSIM_DTYPE_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: invalid dtype %d: use a dsim_dtype (0..%d)", fn,
                        (int)t, DSIM_DTYPE_COUNT - 1);
    if ((unsigned)op >= DSIM_OP_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: invalid op %d: use a dsim_op (0..%d)", fn, (int)op,
                        DSIM_OP_COUNT - 1);
    size_t es = dsim_dtype_size(t);
    if (count > SIZE_MAX / es)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: count %zu of %s overflows the address space", fn,
                        count, dsim_dtype_name(t));
    *bytes = count * es;
    return DSIM_OK;
}

/* out aliases an input that a later batch reads, after out was written. */
static int dev_late_alias(void *out, const void *const *ins, int n)
{
    for (int i = DSIM_DEVICE_REDUCE_BATCH; i < n; i++)
        if (ins[i] == out)
            return 1;
    return 0;
}

/* The left fold over n inputs in batches: the first batch writes out, each
 * later one starts from out, so the order (and the bits) stay the same. */
static dsim_err dev_reduce_batches(dsim_stream *use, void *out, const void *const *ins, int n,
                                   size_t count, dsim_dtype t, dsim_op op)
{
    const struct dsim_device_ops *ops = use->dev->ops;
    int first = n < DSIM_DEVICE_REDUCE_BATCH ? n : DSIM_DEVICE_REDUCE_BATCH;
    DSIM_CHECK(ops->reduce(use, out, ins, first, count, t, op));
    const void *batch[DSIM_DEVICE_REDUCE_BATCH];
    for (int i = first; i < n; i += DSIM_DEVICE_REDUCE_BATCH - 1) {
        int m = n - i < DSIM_DEVICE_REDUCE_BATCH - 1 ? n - i : DSIM_DEVICE_REDUCE_BATCH - 1;
        batch[0] = out;
        memcpy(&batch[1], &ins[i], (size_t)m * sizeof *batch);
        DSIM_CHECK(ops->reduce(use, out, batch, m + 1, count, t, op));
    }
    return DSIM_OK;
}

/* As dev_reduce_batches into a temporary, then copied to out (out is an
 * input of a later batch). Synchronous. */
static dsim_err dev_reduce_via_temp(dsim_stream *use, void *out, const void *const *ins, int n,
                                    size_t count, dsim_dtype t, dsim_op op, size_t bytes)
{
    dsim_device *d = use->dev;
    void *tmp = NULL;
    DSIM_CHECK(d->ops->alloc(d, bytes, &tmp));
    dsim_err e = dev_reduce_batches(use, tmp, ins, n, count, t, op);
    if (e == DSIM_OK)
        e = d->ops->copy(use, DSIM_COPY_D2D, out, tmp, bytes);
    dsim_err se = d->ops->stream_sync(use);
    (void)d->ops->free(d, tmp);
    return e != DSIM_OK ? e : se;
}

static dsim_err dev_reduce(const char *fn, dsim_device *d, void *out, const void *const *ins, int n,
                           size_t count, dsim_dtype t, dsim_op op, dsim_stream *s)
{
    size_t bytes = 0;
    DSIM_CHECK(dev_check_type(fn, t, op, count, &bytes));
    if (count == 0)
        return DSIM_OK;
    DSIM_CHECK(dev_check_range(d, fn, "the output", out, bytes, 0));
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, n == 2 && i == 1 ? "the input" : "input %d", i);
        DSIM_CHECK(dev_check_range(d, fn, what, ins[i], bytes, 1));
        if (dev_partial_overlap(out, ins[i], bytes))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s: %s overlaps the output in part; pass the same range or a "
                            "disjoint one",
                            fn, what);
    }
    dsim_stream *use;
    DSIM_CHECK(dev_pick_stream(d, NULL, s, fn, &use));
    dsim_op kop = op == DSIM_MEAN ? DSIM_SUM : op;
    if (dev_late_alias(out, ins, n))
        return dev_reduce_via_temp(use, out, ins, n, count, t, kop, bytes);
    return dev_done(use, s, dev_reduce_batches(use, out, ins, n, count, t, kop));
}

dsim_err dsim_device_reduce(dsim_device *d, void *inout, const void *in, size_t count, dsim_dtype t,
                            dsim_op op, dsim_stream *s)
{
    if (!d)
        return dev_null("dsim_device_reduce", "the device");
    const void *ins[2] = {inout, in};
    return dev_reduce("dsim_device_reduce", d, inout, ins, 2, count, t, op, s);
}

dsim_err dsim_device_reduce_n(dsim_device *d, void *out, const void *const *ins, int n,
                              size_t count, dsim_dtype t, dsim_op op, dsim_stream *s)
{
    static const char fn[] = "dsim_device_reduce_n";
    if (!d || !ins)
        return dev_null(fn, d ? "ins" : "the device");
    if (n < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: n is %d; reduce at least one input", fn, n);
    return dev_reduce(fn, d, out, ins, n, count, t, op, s);
}

dsim_err dsim_device_reduce_finish(dsim_device *d, void *buf, size_t count, dsim_dtype t,
                                   dsim_op op, int nranks, dsim_stream *s)
{
    static const char fn[] = "dsim_device_reduce_finish";
    if (!d)
        return dev_null(fn, "the device");
    size_t bytes = 0;
    DSIM_CHECK(dev_check_type(fn, t, op, count, &bytes));
    if (nranks < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: nranks is %d; it must be the number of ranks (>= 1)",
                        fn, nranks);
    if (count == 0 || op != DSIM_MEAN || nranks == 1)
        return DSIM_OK;
    dsim_stream *use;
    DSIM_CHECK(dev_check_range(d, fn, "the buffer", buf, bytes, 0));
    DSIM_CHECK(dev_pick_stream(d, NULL, s, fn, &use));
    return dev_done(use, s, d->ops->reduce_div(use, buf, count, t, nranks));
}

/* ---- checksums ----
 *
 * dsim_params_checksum (src/strategy/reference.c), streamed: eight lanes of
 * FNV-style xor-multiply over 8-byte little-endian words of each full
 * 64-byte block, the tail bytes folded into a ninth value seeded with the
 * length, all mixed at the end. The chunks are multiples of 64 bytes, so
 * only the last one has a tail; tests/device checks the two agree. */

#define DEV_FNV_PRIME 0x100000001b3ull

static uint64_t dev_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static void dev_hash_blocks(uint64_t h[8], const unsigned char *b, size_t len)
{
    for (size_t i = 0; i + 64 <= len; i += 64) {
        for (int k = 0; k < 8; k++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * (size_t)k, sizeof w);
            h[k] = (h[k] ^ w) * DEV_FNV_PRIME;
        }
    }
}

dsim_err dsim_device_checksum(dsim_device *d, const void *ptr, size_t bytes, uint64_t *out)
{
    static const char fn[] = "dsim_device_checksum";
    if (!d || !out)
        return dev_null(fn, d ? "out" : "the device");
    if (bytes)
        DSIM_CHECK(dev_check_range(d, fn, "the buffer", ptr, bytes, 0));
    uint64_t h[8], r = (uint64_t)bytes;
    for (int k = 0; k < 8; k++)
        h[k] = 0xcbf29ce484222325ull + 0x9e3779b97f4a7c15ull * (uint64_t)k;
    size_t chunk = bytes < ((size_t)1 << 20) ? bytes : ((size_t)1 << 20);
    unsigned char *buf = chunk ? malloc(chunk) : NULL;
    if (chunk && !buf)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of host memory (%zu bytes)", fn, chunk);
    dsim_err e = DSIM_OK;
    for (size_t off = 0; off < bytes && e == DSIM_OK; off += chunk) {
        size_t m = bytes - off < chunk ? bytes - off : chunk;
        e = d->ops->copy(d->own, DSIM_COPY_D2H, buf, (const unsigned char *)ptr + off, m);
        if (e == DSIM_OK)
            e = d->ops->stream_sync(d->own);
        if (e != DSIM_OK)
            break;
        dev_hash_blocks(h, buf, m);
        for (size_t i = m / 64 * 64; i < m; i++)
            r = (r ^ buf[i]) * DEV_FNV_PRIME;
    }
    free(buf);
    if (e != DSIM_OK)
        return e;
    for (int k = 0; k < 8; k++)
        r = dev_mix(r ^ dev_mix(h[k] + (uint64_t)k));
    *out = r;
    return DSIM_OK;
}
