/* The device layer's dispatch: the backend registry, opening and closing
 * devices, peers, and memory with its table of live allocations. Every
 * device call goes through here or device_work.c, so that arguments are
 * checked once, for every backend, before a backend sees them. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"
#include "dsim/log.h"
#include "dsim_config.h"

#define DEV_MAX_BACKENDS 8
#define DEV_NAME_MAX     32

#if DSIM_HAVE_CUDA
extern const struct dsim_device_ops dsim_device_cuda_ops;
#endif

/* ---- registry ---- */

/* Registration is rare and happens before any device exists; a spin flag
 * guards it, as the transports' registry does. */
static atomic_flag dev_reg_lock = ATOMIC_FLAG_INIT;
static struct dsim_device_ops dev_reg[DEV_MAX_BACKENDS];
static char dev_reg_names[DEV_MAX_BACKENDS][DEV_NAME_MAX];
static const char *dev_names[DEV_MAX_BACKENDS + 1];
static int dev_nreg;
static int dev_builtins_done;

/* Open devices, so that closing one removes it from its peers' lists. */
static pthread_mutex_t dev_open_lock = PTHREAD_MUTEX_INITIALIZER;
static dsim_device *dev_open_list;

static void dev_reg_acquire(void)
{
    while (atomic_flag_test_and_set_explicit(&dev_reg_lock, memory_order_acquire))
        ;
}

static void dev_reg_release(void)
{
    atomic_flag_clear_explicit(&dev_reg_lock, memory_order_release);
}

/* ---- "not supported" stubs for the optional members ---- */

static dsim_err dev_stub_memset(dsim_stream *s, void *dst, int byte, size_t bytes)
{
    (void)dst;
    (void)byte;
    (void)bytes;
    return DSIM_ERR(DSIM_ENOTSUP, -1, "dsim_device_memset: device backend '%s' has no memset",
                    s->dev->ops->name);
}

static dsim_err dev_stub_stream_query(dsim_stream *s, int *idle)
{
    *idle = 0;
    return DSIM_ERR(DSIM_ENOTSUP, -1,
                    "dsim_stream_query: device backend '%s' cannot query a stream; use "
                    "dsim_stream_sync",
                    s->dev->ops->name);
}

static dsim_err dev_stub_stream_wait_event(dsim_stream *s, dsim_event *e)
{
    (void)e;
    return DSIM_ERR(DSIM_ENOTSUP, -1,
                    "dsim_stream_wait_event: device backend '%s' cannot order a stream after an "
                    "event; use dsim_event_sync before enqueueing",
                    s->dev->ops->name);
}

static dsim_err dev_stub_event_query(dsim_event *e, int *done)
{
    *done = 0;
    return DSIM_ERR(DSIM_ENOTSUP, -1,
                    "dsim_event_query: device backend '%s' cannot query an event; use "
                    "dsim_event_sync",
                    e->dev->ops->name);
}

static dsim_err dev_stub_event_elapsed(dsim_event *a, dsim_event *b, double *ms)
{
    (void)b;
    *ms = 0;
    return DSIM_ERR(DSIM_ENOTSUP, -1,
                    "dsim_event_elapsed_ms: device backend '%s' does not time events",
                    a->dev->ops->name);
}

static dsim_err dev_stub_can_access_peer(int index, int peer, int *yes)
{
    (void)index;
    (void)peer;
    *yes = 0; /* not supported: never directly */
    return DSIM_OK;
}

static dsim_err dev_stub_enable_peer(dsim_device *d, dsim_device *peer)
{
    (void)peer;
    return DSIM_ERR(DSIM_ENOTSUP, -1,
                    "dsim_device_enable_peer: device backend '%s' has no peer access; copies "
                    "between its devices are staged through host memory",
                    d->ops->name);
}

static dsim_err dev_stub_host_alloc(dsim_device *d, size_t bytes, void **ptr)
{
    size_t rounded = (bytes + 255) / 256 * 256;
    *ptr = rounded >= bytes ? aligned_alloc(256, rounded) : NULL;
    if (!*ptr)
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "dsim_device_host_alloc: out of host memory for %zu bytes (%s)", bytes,
                        d->label);
    return DSIM_OK;
}

static dsim_err dev_stub_host_free(dsim_device *d, void *ptr)
{
    (void)d;
    free(ptr);
    return DSIM_OK;
}

static int dev_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= DEV_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

#define DEV_OPS_MIN_SIZE (offsetof(struct dsim_device_ops, reduce_div) + sizeof(void *))

static const char *dev_missing_member(const struct dsim_device_ops *o)
{
    return !o->count            ? "count"
           : !o->query          ? "query"
           : !o->open           ? "open"
           : !o->close          ? "close"
           : !o->alloc          ? "alloc"
           : !o->free           ? "free"
           : !o->copy           ? "copy"
           : !o->stream_create  ? "stream_create"
           : !o->stream_destroy ? "stream_destroy"
           : !o->stream_sync    ? "stream_sync"
           : !o->event_create   ? "event_create"
           : !o->event_destroy  ? "event_destroy"
           : !o->event_record   ? "event_record"
           : !o->event_sync     ? "event_sync"
           : !o->reduce         ? "reduce"
           : !o->reduce_div     ? "reduce_div"
                                : NULL;
}

static dsim_err dev_register_locked(const struct dsim_device_ops *ops)
{
    static const char fn[] = "dsim_device_register";
    if (!ops)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: ops is NULL", fn);
    if (ops->size < DEV_OPS_MIN_SIZE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: ops->size is %zu, less than the %zu bytes every table has; set "
                        ".size = sizeof(struct dsim_device_ops)",
                        fn, ops->size, (size_t)DEV_OPS_MIN_SIZE);
    if (!ops->name || !dev_name_ok(ops->name))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: backend name '%s' is not valid; use 1 to %d characters from "
                        "[a-z0-9_]",
                        fn, ops->name ? ops->name : "(null)", DEV_NAME_MAX - 1);
    struct dsim_device_ops c;
    memset(&c, 0, sizeof c);
    memcpy(&c, ops, ops->size < sizeof c ? ops->size : sizeof c);
    const char *missing = dev_missing_member(&c);
    if (missing)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: backend '%s' leaves the required member '%s' NULL",
                        fn, ops->name, missing);
    if (!c.host_alloc != !c.host_free)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: backend '%s' sets %s without %s; set both or neither",
                        fn, ops->name, c.host_alloc ? "host_alloc" : "host_free",
                        c.host_alloc ? "host_free" : "host_alloc");
    for (int i = 0; i < dev_nreg; i++)
        if (strcmp(dev_reg_names[i], ops->name) == 0)
            return DSIM_ERR(DSIM_EINVAL, -1, "%s: a backend named '%s' is already registered", fn,
                            ops->name);
    if (dev_nreg == DEV_MAX_BACKENDS)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: already %d backends registered; cannot add '%s'", fn,
                        DEV_MAX_BACKENDS, ops->name);
    c.size = sizeof c;
    snprintf(dev_reg_names[dev_nreg], DEV_NAME_MAX, "%s", ops->name);
    c.name = dev_reg_names[dev_nreg];
    c.memset = c.memset ? c.memset : dev_stub_memset;
    c.stream_query = c.stream_query ? c.stream_query : dev_stub_stream_query;
    c.stream_wait_event = c.stream_wait_event ? c.stream_wait_event : dev_stub_stream_wait_event;
    c.event_query = c.event_query ? c.event_query : dev_stub_event_query;
    c.event_elapsed = c.event_elapsed ? c.event_elapsed : dev_stub_event_elapsed;
    c.can_access_peer = c.can_access_peer ? c.can_access_peer : dev_stub_can_access_peer;
    c.enable_peer = c.enable_peer ? c.enable_peer : dev_stub_enable_peer;
    /* copy_peer stays NULL when absent: device_work.c stages through host. */
    if (!c.host_alloc) {
        c.host_alloc = dev_stub_host_alloc;
        c.host_free = dev_stub_host_free;
    }
    dev_reg[dev_nreg] = c;
    dev_names[dev_nreg] = dev_reg[dev_nreg].name;
    dev_nreg++;
    dev_names[dev_nreg] = NULL;
    return DSIM_OK;
}

static void dev_builtins_locked(void)
{
    if (dev_builtins_done)
        return;
    dev_builtins_done = 1;
    static const struct dsim_device_ops *const builtins[] = {
        &dsim_device_host_ops,
#if DSIM_HAVE_CUDA
        &dsim_device_cuda_ops,
#endif
    };
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (dev_register_locked(builtins[i]) != DSIM_OK)
            dsim_error_log("built-in device backend '%s' failed to register: %s", builtins[i]->name,
                           dsim_errmsg());
}

dsim_err dsim_device_register(const struct dsim_device_ops *ops)
{
    dev_reg_acquire();
    dev_builtins_locked();
    dsim_err e = dev_register_locked(ops);
    dev_reg_release();
    return e;
}

const char *const *dsim_device_backends(void)
{
    dev_reg_acquire();
    dev_builtins_locked();
    dev_reg_release();
    return dev_names;
}

static dsim_err dev_lookup(const char *fn, const char *name, const struct dsim_device_ops **out)
{
    *out = NULL;
    if (!name)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the backend name is NULL (use \"host\" or \"cuda\")",
                        fn);
    dev_reg_acquire();
    dev_builtins_locked();
    for (int i = 0; i < dev_nreg && !*out; i++)
        if (strcmp(dev_reg_names[i], name) == 0)
            *out = &dev_reg[i];
    char list[DEV_MAX_BACKENDS * (DEV_NAME_MAX + 2)] = "";
    for (int i = 0; i < dev_nreg; i++) {
        if (i)
            strcat(list, ", ");
        strcat(list, dev_reg_names[i]); /* each name < DEV_NAME_MAX: it fits */
    }
    dev_reg_release();
    if (*out)
        return DSIM_OK;
    if (strcmp(name, "cuda") == 0)
        return DSIM_ERR(DSIM_ENOENT, -1,
                        "%s: device backend 'cuda' is not in this build (dsim was configured "
                        "without CUDA: install the CUDA toolkit and run meson setup with "
                        "-Dcuda=enabled); registered: %s",
                        fn, list);
    return DSIM_ERR(DSIM_ENOENT, -1, "%s: no device backend named '%s'; registered: %s", fn, name,
                    list);
}

/* ---- enumeration ---- */

static dsim_err dev_count(const char *fn, const struct dsim_device_ops *ops, int *count, char *why,
                          size_t why_cap)
{
    char buf[256] = "";
    int n = 0;
    DSIM_CHECK(ops->count(&n, buf, sizeof buf));
    if (n < 0)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: device backend '%s' reported %d devices", fn,
                        ops->name, n);
    if (n == 0 && !buf[0])
        snprintf(buf, sizeof buf, "device backend '%s' found no device", ops->name);
    *count = n;
    if (why && why_cap)
        snprintf(why, why_cap, "%s", n ? "" : buf);
    return DSIM_OK;
}

dsim_err dsim_device_count(const char *backend, int *count, char *why, size_t why_cap)
{
    static const char fn[] = "dsim_device_count";
    if (why && why_cap)
        why[0] = '\0';
    if (!count)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: count is NULL", fn);
    *count = 0;
    const struct dsim_device_ops *ops;
    DSIM_CHECK(dev_lookup(fn, backend, &ops));
    return dev_count(fn, ops, count, why, why_cap);
}

static dsim_err dev_check_index(const char *fn, const struct dsim_device_ops *ops, int index)
{
    int n = 0;
    char why[256];
    DSIM_CHECK(dev_count(fn, ops, &n, why, sizeof why));
    if (index < 0 || index >= n) {
        if (n == 0)
            return DSIM_ERR(DSIM_ENOENT, -1, "%s: no device %s:%d: %s", fn, ops->name, index, why);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: device index %d is out of range: backend '%s' has %d device%s "
                        "(0..%d)",
                        fn, index, ops->name, n, n == 1 ? "" : "s", n - 1);
    }
    return DSIM_OK;
}

static dsim_err dev_query(const char *fn, const struct dsim_device_ops *ops, int index,
                          dsim_device_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "%s", ops->name);
    out->index = index;
    DSIM_CHECK(dev_check_index(fn, ops, index));
    DSIM_CHECK(ops->query(index, out));
    snprintf(out->backend, sizeof out->backend, "%s", ops->name);
    out->index = index;
    return DSIM_OK;
}

dsim_err dsim_device_query(const char *backend, int index, dsim_device_info *out)
{
    static const char fn[] = "dsim_device_query";
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: out is NULL", fn);
    const struct dsim_device_ops *ops;
    DSIM_CHECK(dev_lookup(fn, backend, &ops));
    return dev_query(fn, ops, index, out);
}

dsim_err dsim_device_can_access_peer(const char *backend, int index, int peer, int *yes)
{
    static const char fn[] = "dsim_device_can_access_peer";
    if (!yes)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: yes is NULL", fn);
    *yes = 0;
    const struct dsim_device_ops *ops;
    DSIM_CHECK(dev_lookup(fn, backend, &ops));
    DSIM_CHECK(dev_check_index(fn, ops, index));
    DSIM_CHECK(dev_check_index(fn, ops, peer));
    if (index == peer) {
        *yes = 1;
        return DSIM_OK;
    }
    return ops->can_access_peer(index, peer, yes);
}

/* ---- handles ---- */

void *dev_handle_alloc(size_t hsize, size_t priv_size, void **priv)
{
    size_t align = _Alignof(max_align_t);
    size_t off = (hsize + align - 1) / align * align;
    unsigned char *p = calloc(1, off + priv_size);
    if (p)
        *priv = priv_size ? p + off : NULL;
    return p;
}

void *dsim_device_priv(dsim_device *d)
{
    return d->priv;
}

void *dsim_stream_priv(dsim_stream *s)
{
    return s->priv;
}

void *dsim_event_priv(dsim_event *e)
{
    return e->priv;
}

int dsim_device_index(const dsim_device *d)
{
    return d->index;
}

dsim_device *dsim_stream_device(dsim_stream *s)
{
    return s->dev;
}

dsim_device *dsim_event_device(dsim_event *e)
{
    return e->dev;
}

const dsim_device_info *dsim_device_get_info(const dsim_device *d)
{
    return d ? &d->info : NULL;
}

/* ---- open and close ---- */

dsim_err dsim_device_open(const char *backend, int index, const char *options, dsim_device **out)
{
    static const char fn[] = "dsim_device_open";
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: out is NULL", fn);
    *out = NULL;
    const struct dsim_device_ops *ops;
    DSIM_CHECK(dev_lookup(fn, backend, &ops));
    void *priv = NULL;
    dsim_device *d = dev_handle_alloc(sizeof *d, ops->device_priv_size, &priv);
    if (!d)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", fn);
    d->ops = ops;
    d->index = index;
    d->priv = priv;
    snprintf(d->label, sizeof d->label, "%s:%d", ops->name, index);
    dsim_err e = dev_query(fn, ops, index, &d->info);
    if (e != DSIM_OK) {
        free(d);
        return e;
    }
    e = ops->open(d, index, options);
    if (e != DSIM_OK) {
        free(d);
        return e;
    }
    void *spriv = NULL;
    d->own = dev_handle_alloc(sizeof *d->own, ops->stream_priv_size, &spriv);
    if (!d->own) {
        ops->close(d);
        free(d);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", fn);
    }
    d->own->dev = d;
    d->own->priv = spriv;
    e = ops->stream_create(d->own);
    if (e != DSIM_OK) {
        free(d->own);
        ops->close(d);
        free(d);
        return e;
    }
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_lock(&dev_open_lock);
    d->open_next = dev_open_list;
    if (dev_open_list)
        dev_open_list->open_prev = d;
    dev_open_list = d;
    pthread_mutex_unlock(&dev_open_lock);
    *out = d;
    return DSIM_OK;
}

/* Forgets d everywhere: the open list and every device's peers. */
static void dev_unlink(dsim_device *d)
{
    pthread_mutex_lock(&dev_open_lock);
    if (d->open_prev)
        d->open_prev->open_next = d->open_next;
    else
        dev_open_list = d->open_next;
    if (d->open_next)
        d->open_next->open_prev = d->open_prev;
    for (dsim_device *o = dev_open_list; o; o = o->open_next) {
        pthread_mutex_lock(&o->lock);
        for (int i = 0; i < o->n_peers; i++)
            if (o->peers[i] == d)
                o->peers[i--] = o->peers[--o->n_peers];
        pthread_mutex_unlock(&o->lock);
    }
    pthread_mutex_unlock(&dev_open_lock);
}

dsim_err dev_sync_all(dsim_device *d)
{
    dsim_err first = d->ops->stream_sync(d->own);
    dsim_error saved;
    if (first != DSIM_OK)
        dsim_error_copy(&saved);
    pthread_mutex_lock(&d->lock);
    for (dsim_stream *s = d->streams; s; s = s->next) {
        dsim_err e = d->ops->stream_sync(s);
        if (e != DSIM_OK && first == DSIM_OK) {
            first = e;
            dsim_error_copy(&saved);
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (first != DSIM_OK)
        dsim_error_restore(&saved);
    return first;
}

/* Releases what the user left on d: events, streams, allocations. */
static void dev_release_leftovers(dsim_device *d, size_t *n_mem, size_t *b_mem, size_t *n_host,
                                  int *n_streams, int *n_events)
{
    *n_events = 0;
    while (d->events) {
        dsim_event *e = d->events;
        d->events = e->next;
        d->ops->event_destroy(e);
        free(e);
        ++*n_events;
    }
    *n_streams = 0;
    while (d->streams) {
        dsim_stream *s = d->streams;
        d->streams = s->next;
        (void)d->ops->stream_sync(s);
        d->ops->stream_destroy(s);
        free(s);
        ++*n_streams;
    }
    *n_mem = d->mem.n;
    *b_mem = d->mem.bytes;
    for (size_t i = 0; i < d->mem.n; i++)
        (void)d->ops->free(d, (void *)d->mem.v[i].base);
    *n_host = d->host.n;
    for (size_t i = 0; i < d->host.n; i++)
        (void)d->ops->host_free(d, (void *)d->host.v[i].base);
}

dsim_err dsim_device_close(dsim_device *d)
{
    if (!d)
        return DSIM_OK;
    dev_unlink(d);
    dsim_err e = dev_sync_all(d);
    dsim_error saved;
    if (e != DSIM_OK)
        dsim_error_copy(&saved);
    size_t n_mem, b_mem, n_host;
    int n_streams, n_events;
    dev_release_leftovers(d, &n_mem, &b_mem, &n_host, &n_streams, &n_events);
    d->ops->stream_destroy(d->own);
    free(d->own);
    d->ops->close(d);
    char label[sizeof d->label];
    memcpy(label, d->label, sizeof label);
    free(d->mem.v);
    free(d->host.v);
    free(d->peers);
    pthread_mutex_destroy(&d->lock);
    free(d);
    if (e != DSIM_OK) {
        dsim_error_restore(&saved);
        return e;
    }
    if (n_mem || n_host || n_streams || n_events)
        return DSIM_ERR(DSIM_ESTATE, -1,
                        "dsim_device_close: %s still had %zu allocation%s (%zu bytes), %zu host "
                        "buffer%s, %d stream%s and %d event%s; they are released now. Free and "
                        "destroy what you create before closing the device",
                        label, n_mem, n_mem == 1 ? "" : "s", b_mem, n_host, n_host == 1 ? "" : "s",
                        n_streams, n_streams == 1 ? "" : "s", n_events, n_events == 1 ? "" : "s");
    return DSIM_OK;
}

dsim_err dsim_device_enable_peer(dsim_device *d, dsim_device *peer)
{
    static const char fn[] = "dsim_device_enable_peer";
    if (!d || !peer)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %s is NULL", fn, d ? "peer" : "the device");
    if (d->ops != peer->ops)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %s and %s belong to different backends; only devices of one "
                        "backend can be peers (stage through host memory instead)",
                        fn, d->label, peer->label);
    if (d == peer)
        return DSIM_OK;
    pthread_mutex_lock(&d->lock);
    int have = 0;
    for (int i = 0; i < d->n_peers; i++)
        have |= d->peers[i] == peer;
    pthread_mutex_unlock(&d->lock);
    if (have)
        return DSIM_OK;
    DSIM_CHECK(d->ops->enable_peer(d, peer));
    pthread_mutex_lock(&d->lock);
    if (d->n_peers == d->cap_peers) {
        int cap = d->cap_peers ? 2 * d->cap_peers : 4;
        dsim_device **v = realloc(d->peers, (size_t)cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&d->lock);
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", fn);
        }
        d->peers = v;
        d->cap_peers = cap;
    }
    d->peers[d->n_peers++] = peer;
    pthread_mutex_unlock(&d->lock);
    return DSIM_OK;
}

/* ---- the table of live allocations ---- */

/* The index of the last range whose base is <= p, or -1. */
static long dev_table_floor(const dev_table *t, uintptr_t p)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (long)lo - 1;
}

static int dev_table_add(dev_table *t, uintptr_t base, size_t size)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        dev_range *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return -1;
        t->v = v;
        t->cap = cap;
    }
    size_t at = (size_t)(dev_table_floor(t, base) + 1);
    memmove(&t->v[at + 1], &t->v[at], (t->n - at) * sizeof *t->v);
    t->v[at] = (dev_range){base, size};
    t->n++;
    t->bytes += size;
    return 0;
}

/* The allocation starting exactly at p, or -1. */
static long dev_table_find(const dev_table *t, uintptr_t p)
{
    long i = dev_table_floor(t, p);
    return i >= 0 && t->v[i].base == p ? i : -1;
}

static void dev_table_remove(dev_table *t, long i)
{
    t->bytes -= t->v[i].size;
    memmove(&t->v[i], &t->v[i + 1], (t->n - (size_t)i - 1) * sizeof *t->v);
    t->n--;
}

static int dev_in_table(const dev_table *t, uintptr_t p, size_t bytes)
{
    long i = dev_table_floor(t, p);
    return i >= 0 && p - t->v[i].base <= t->v[i].size && bytes <= t->v[i].size - (p - t->v[i].base);
}

int dev_overlaps_mem(dsim_device *d, const void *p, size_t bytes)
{
    /* The allocations are disjoint and sorted: if any overlaps the range,
     * the last one starting inside or before its end does. */
    uintptr_t u = (uintptr_t)p;
    pthread_mutex_lock(&d->lock);
    long i = dev_table_floor(&d->mem, u + bytes - 1);
    int hit = i >= 0 && d->mem.v[i].base + d->mem.v[i].size > u;
    pthread_mutex_unlock(&d->lock);
    return hit;
}

static int dev_was_freed(const dsim_device *d, uintptr_t p)
{
    for (int i = 0; i < DEV_FREED_RING; i++)
        if (d->freed[i] == p && p)
            return 1;
    return 0;
}

/* Why [p, p + bytes) is not inside d's allocations, into msg. d locked. */
static void dev_range_why(const dsim_device *d, uintptr_t p, size_t bytes, char *msg, size_t cap)
{
    long i = dev_table_floor(&d->mem, p);
    if (i >= 0 && p - d->mem.v[i].base < d->mem.v[i].size) {
        const dev_range *r = &d->mem.v[i];
        snprintf(msg, cap,
                 "at offset %zu runs %zu bytes past the end of its allocation (%zu bytes at "
                 "%p); check the count and the element size",
                 (size_t)(p - r->base), bytes - (r->size - (size_t)(p - r->base)), r->size,
                 (void *)r->base);
    } else if (dev_was_freed(d, p)) {
        snprintf(msg, cap, "was freed already; allocate it again or keep it until its last use");
    } else {
        snprintf(msg, cap,
                 "is not inside any live allocation of %s (it holds %zu); pass memory from "
                 "dsim_device_alloc on this device (or on a peer enabled with "
                 "dsim_device_enable_peer)",
                 d->label, d->mem.n);
    }
}

dsim_err dev_check_range(dsim_device *d, const char *fn, const char *what, const void *p,
                         size_t bytes, int peers)
{
    uintptr_t u = (uintptr_t)p;
    if (!p)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %s is NULL (%zu bytes)", fn, what, bytes);
    pthread_mutex_lock(&d->lock);
    int ok = dev_in_table(&d->mem, u, bytes);
    int n_peers = d->n_peers;
    pthread_mutex_unlock(&d->lock);
    if (!ok && peers && n_peers) {
        pthread_mutex_lock(&dev_open_lock);
        pthread_mutex_lock(&d->lock);
        for (int i = 0; i < d->n_peers && !ok; i++) {
            dsim_device *o = d->peers[i];
            pthread_mutex_lock(&o->lock);
            ok = dev_in_table(&o->mem, u, bytes);
            pthread_mutex_unlock(&o->lock);
        }
        pthread_mutex_unlock(&d->lock);
        pthread_mutex_unlock(&dev_open_lock);
    }
    if (ok)
        return DSIM_OK;
    char why[320];
    pthread_mutex_lock(&d->lock);
    dev_range_why(d, u, bytes, why, sizeof why);
    pthread_mutex_unlock(&d->lock);
    return DSIM_ERR(DSIM_EINVAL, -1, "%s: %s %p (%zu bytes) on %s %s", fn, what, p, bytes, d->label,
                    why);
}

/* ---- memory ---- */

dsim_err dsim_device_alloc(dsim_device *d, size_t bytes, void **ptr)
{
    static const char fn[] = "dsim_device_alloc";
    if (!d || !ptr)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %s is NULL", fn, d ? "ptr" : "the device");
    *ptr = NULL;
    if (bytes == 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: 0 bytes on %s; allocate at least one byte", fn,
                        d->label);
    if (bytes > ((size_t)1 << 56))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %zu bytes on %s is more than any device holds; check the count and "
                        "the element size",
                        fn, bytes, d->label);
    void *p = NULL;
    DSIM_CHECK(d->ops->alloc(d, bytes, &p));
    pthread_mutex_lock(&d->lock);
    int bad = dev_table_add(&d->mem, (uintptr_t)p, bytes);
    for (int i = 0; i < DEV_FREED_RING; i++)
        if (d->freed[i] == (uintptr_t)p)
            d->freed[i] = 0;
    pthread_mutex_unlock(&d->lock);
    if (bad) {
        (void)d->ops->free(d, p);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of host memory for the allocation table", fn);
    }
    *ptr = p;
    return DSIM_OK;
}

dsim_err dsim_device_free(dsim_device *d, void *ptr)
{
    static const char fn[] = "dsim_device_free";
    if (!d)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the device is NULL", fn);
    if (!ptr)
        return DSIM_OK;
    pthread_mutex_lock(&d->lock);
    int live = dev_table_find(&d->mem, (uintptr_t)ptr) >= 0;
    char why[320] = "";
    if (!live)
        dev_range_why(d, (uintptr_t)ptr, 1, why, sizeof why);
    long inside = dev_table_floor(&d->mem, (uintptr_t)ptr);
    int interior =
        !live && inside >= 0 && (uintptr_t)ptr - d->mem.v[inside].base < d->mem.v[inside].size;
    pthread_mutex_unlock(&d->lock);
    if (interior)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %p on %s points inside an allocation, not at its start; pass the "
                        "pointer dsim_device_alloc returned",
                        fn, ptr, d->label);
    if (!live)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %p on %s %s", fn, ptr, d->label, why);
    DSIM_CHECK(dev_sync_all(d));
    pthread_mutex_lock(&d->lock);
    long i = dev_table_find(&d->mem, (uintptr_t)ptr);
    if (i >= 0) {
        dev_table_remove(&d->mem, i);
        d->freed[d->freed_next++ % DEV_FREED_RING] = (uintptr_t)ptr;
    }
    pthread_mutex_unlock(&d->lock);
    if (i < 0) /* another thread freed it meanwhile */
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %p on %s was freed already", fn, ptr, d->label);
    return d->ops->free(d, ptr);
}

void dsim_device_mem_live(dsim_device *d, size_t *allocs, size_t *bytes)
{
    size_t n = 0, b = 0;
    if (d) {
        pthread_mutex_lock(&d->lock);
        n = d->mem.n;
        b = d->mem.bytes;
        pthread_mutex_unlock(&d->lock);
    }
    if (allocs)
        *allocs = n;
    if (bytes)
        *bytes = b;
}

dsim_err dsim_device_host_alloc(dsim_device *d, size_t bytes, void **ptr, int *pinned)
{
    static const char fn[] = "dsim_device_host_alloc";
    if (!d || !ptr)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: %s is NULL", fn, d ? "ptr" : "the device");
    *ptr = NULL;
    if (bytes == 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: 0 bytes; allocate at least one byte", fn);
    void *p = NULL;
    DSIM_CHECK(d->ops->host_alloc(d, bytes, &p));
    pthread_mutex_lock(&d->lock);
    int bad = dev_table_add(&d->host, (uintptr_t)p, bytes);
    pthread_mutex_unlock(&d->lock);
    if (bad) {
        (void)d->ops->host_free(d, p);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of host memory for the allocation table", fn);
    }
    if (pinned)
        *pinned = d->ops->host_alloc != dev_stub_host_alloc;
    *ptr = p;
    return DSIM_OK;
}

dsim_err dsim_device_host_free(dsim_device *d, void *ptr)
{
    static const char fn[] = "dsim_device_host_free";
    if (!d)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the device is NULL", fn);
    if (!ptr)
        return DSIM_OK;
    pthread_mutex_lock(&d->lock);
    long i = dev_table_find(&d->host, (uintptr_t)ptr);
    if (i >= 0)
        dev_table_remove(&d->host, i);
    pthread_mutex_unlock(&d->lock);
    if (i < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %p is not a live host buffer of %s (freed already, or from "
                        "another device or allocator)",
                        fn, ptr, d->label);
    return d->ops->host_free(d, ptr);
}
