/* The host device backend: device memory is plain host memory and the
 * kernels are elem.h's functions in C loops, the arithmetic the CUDA kernels
 * run. Every CPU test of code above the device layer runs on it.
 *
 * Streams, option streams=:
 *   sync      (default) work runs in the calling thread when it is
 *             enqueued; events are complete when recorded.
 *   deferred  work is queued per stream and runs only when something waits
 *             for it (stream sync or query, event sync or query, a stream
 *             that waits on an event reaching that wait, a free, a close),
 *             in stream order. A caller that reads a copy's destination
 *             before synchronising sees the old bytes, as on a GPU.
 *
 * The deferred queues share one recursive lock: running one stream's work
 * may run another's first (an event wait), and the lock must allow that. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/elem.h"
#include "dsim/spi/device.h"
#include "dsim/spi/rt.h"

/* ---- the kernels ---- */

typedef void (*host_reduce_fn)(void *out, const void *const *ins, int n, size_t count);
typedef void (*host_div_fn)(void *buf, size_t count, int nranks);

/* Element i of every input is read before out[i] is written, so out may be
 * the same range as any input. */
#define HOST_REDUCE_FN(TN, DT, T, OPN, OP)                                                         \
    static void host_reduce_##TN##_##OPN(void *out, const void *const *ins, int n, size_t count)   \
    {                                                                                              \
        T *o = (T *)out;                                                                           \
        const T *first = (const T *)ins[0];                                                        \
        for (size_t i = 0; i < count; i++) {                                                       \
            T acc = first[i];                                                                      \
            for (int k = 1; k < n; k++)                                                            \
                acc = dk_##TN##_##OPN(acc, ((const T *)ins[k])[i]);                                \
            o[i] = acc;                                                                            \
        }                                                                                          \
    }
DK_FOR_EACH(HOST_REDUCE_FN)

#define HOST_DIV_FN(TN, DT, T)                                                                     \
    static void host_div_##TN(void *buf, size_t count, int nranks)                                 \
    {                                                                                              \
        T *p = (T *)buf;                                                                           \
        for (size_t i = 0; i < count; i++)                                                         \
            p[i] = dk_##TN##_div(p[i], nranks);                                                    \
    }
DK_FOR_EACH_TYPE(HOST_DIV_FN)

#define HOST_REDUCE_ENTRY(TN, DT, T, OPN, OP) [DT][OP] = host_reduce_##TN##_##OPN,
static const host_reduce_fn host_reduce_tab[DSIM_DTYPE_COUNT][DSIM_OP_COUNT] = {
    DK_FOR_EACH(HOST_REDUCE_ENTRY)};
#define HOST_DIV_ENTRY(TN, DT, T) [DT] = host_div_##TN,
static const host_div_fn host_div_tab[DSIM_DTYPE_COUNT] = {DK_FOR_EACH_TYPE(HOST_DIV_ENTRY)};

/* ---- state ---- */

typedef enum host_kind {
    HOST_COPY,
    HOST_MEMSET,
    HOST_REDUCE,
    HOST_DIV,
    HOST_RECORD,
    HOST_WAIT
} host_kind;

typedef struct host_op {
    struct host_op *next;
    uint64_t seq;
    host_kind kind;
    void *dst;
    const void *src;
    size_t bytes; /* COPY, MEMSET; the element count for REDUCE, DIV */
    int byte;     /* MEMSET; n for REDUCE; nranks for DIV */
    dsim_dtype t;
    dsim_op op;
    uint64_t id, gen; /* RECORD: the event; WAIT: the stream */
    uint64_t upto;    /* WAIT: the position to reach */
    const void *ins[DSIM_DEVICE_REDUCE_BATCH];
} host_op;

typedef struct host_dev {
    int deferred;
} host_dev;

typedef struct host_stream {
    uint64_t id;
    uint64_t enq, done; /* ops enqueued / run, counted from 1 */
    host_op *head, *tail;
    struct host_stream *next_live;
} host_stream;

typedef struct host_event {
    uint64_t id, gen;  /* gen counts records */
    uint64_t done_gen; /* the last record whose point was reached */
    uint64_t where;    /* the id of the deferred stream of the last record, or 0 */
    uint64_t seq;      /* its position there */
    int64_t t_ns;      /* CLOCK_MONOTONIC when done_gen's point was reached */
    struct host_event *next_live;
} host_event;

static pthread_mutex_t host_lock;
static pthread_once_t host_lock_once = PTHREAD_ONCE_INIT;
static host_stream *host_streams; /* live deferred streams */
static host_event *host_events;   /* live events of deferred devices */
static atomic_uint_fast64_t host_next_id = 1;

static void host_lock_init(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&host_lock, &a);
    pthread_mutexattr_destroy(&a);
}

static void host_acquire(void)
{
    pthread_once(&host_lock_once, host_lock_init);
    pthread_mutex_lock(&host_lock);
}

static void host_release(void)
{
    pthread_mutex_unlock(&host_lock);
}

static int host_deferred(dsim_stream *s)
{
    return ((host_dev *)dsim_device_priv(dsim_stream_device(s)))->deferred;
}

/* ---- running work ---- */

static void host_drain(host_stream *hs, uint64_t upto);

static host_stream *host_stream_by_id(uint64_t id)
{
    for (host_stream *p = host_streams; p; p = p->next_live)
        if (p->id == id)
            return p;
    return NULL;
}

static host_event *host_event_by_id(uint64_t id)
{
    for (host_event *p = host_events; p; p = p->next_live)
        if (p->id == id)
            return p;
    return NULL;
}

static void host_run(const host_op *o)
{
    switch (o->kind) {
    case HOST_COPY:
        memmove(o->dst, o->src, o->bytes);
        break;
    case HOST_MEMSET:
        memset(o->dst, o->byte, o->bytes);
        break;
    case HOST_REDUCE:
        host_reduce_tab[o->t][o->op](o->dst, o->ins, o->byte, o->bytes);
        break;
    case HOST_DIV:
        host_div_tab[o->t](o->dst, o->bytes, o->byte);
        break;
    case HOST_RECORD: {
        /* An event destroyed or recorded again since: nothing to mark. */
        host_event *he = host_event_by_id(o->id);
        if (he && he->gen == o->gen) {
            he->done_gen = o->gen;
            he->t_ns = dsim_rt_mono_ns();
        }
        break;
    }
    case HOST_WAIT: {
        /* A stream destroyed since was drained when it was destroyed. */
        host_stream *target = host_stream_by_id(o->id);
        if (target)
            host_drain(target, o->upto);
        break;
    }
    }
}

/* Runs hs's queued work up to position upto (host_lock held). */
static void host_drain(host_stream *hs, uint64_t upto)
{
    while (hs->head && hs->done < upto) {
        host_op *o = hs->head;
        hs->head = o->next;
        if (!hs->head)
            hs->tail = NULL;
        host_run(o);
        hs->done = o->seq;
        free(o);
    }
}

/* Runs o now (sync streams) or queues a copy of it (deferred). */
static dsim_err host_submit(dsim_stream *s, const host_op *o)
{
    if (!host_deferred(s)) {
        host_run(o);
        return DSIM_OK;
    }
    host_op *c = malloc(sizeof *c);
    if (!c)
        return DSIM_ERR(DSIM_ENOMEM, -1, "host device: out of memory queueing work");
    *c = *o;
    c->next = NULL;
    host_stream *hs = dsim_stream_priv(s);
    host_acquire();
    c->seq = ++hs->enq;
    if (hs->tail)
        hs->tail->next = c;
    else
        hs->head = c;
    hs->tail = c;
    host_release();
    return DSIM_OK;
}

/* Reaches an event's recorded point (host_lock held). A stream that is
 * gone was drained when it was destroyed. */
static void host_event_reach(host_event *he)
{
    if (he->done_gen == he->gen || !he->where)
        return;
    host_stream *hs = host_stream_by_id(he->where);
    if (hs)
        host_drain(hs, he->seq);
}

/* ---- enumeration ---- */

static dsim_err host_count(int *count, char *why, size_t why_cap)
{
    (void)why;
    (void)why_cap;
    const char *env = getenv("DSIM_HOST_DEVICES");
    *count = 1;
    if (env && *env) {
        char *end = NULL;
        long n = strtol(env, &end, 10);
        if (*end || n < 1 || n > DSIM_DEVICE_HOST_MAX)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "DSIM_HOST_DEVICES='%s' is not a number of host devices from 1 to %d; "
                            "unset it for one",
                            env, DSIM_DEVICE_HOST_MAX);
        *count = (int)n;
    }
    return DSIM_OK;
}

/* The CPU's model name from /proc/cpuinfo, or "" where there is none. */
static void host_cpu_model(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (!v)
            continue;
        for (v++; *v == ' ' || *v == '\t'; v++)
            ;
        snprintf(out, cap, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

static dsim_err host_query(int index, dsim_device_info *out)
{
    (void)index;
    char model[96];
    host_cpu_model(model, sizeof model);
    snprintf(out->name, sizeof out->name, "CPU%s%s (host memory)", model[0] ? ": " : "", model);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    out->total_bytes = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    out->multiprocessors = cpus > 0 ? (int)cpus : 1;
    return DSIM_OK;
}

/* ---- devices and memory ---- */

static dsim_err host_open(dsim_device *d, int index, const char *options)
{
    (void)index;
    host_dev *hd = dsim_device_priv(d);
    const char *p = options ? options : "";
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 16 && strncmp(p, "streams=deferred", 16) == 0)
            hd->deferred = 1;
        else if (len == 12 && strncmp(p, "streams=sync", 12) == 0)
            hd->deferred = 0;
        else if (len)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "host device: unknown option '%.*s' (known: streams=sync, "
                            "streams=deferred)",
                            (int)len, p);
        p += len;
        if (*p == ',')
            p++;
    }
    return DSIM_OK;
}

static void host_close(dsim_device *d)
{
    (void)d;
}

static dsim_err host_alloc(dsim_device *d, size_t bytes, void **ptr)
{
    (void)d;
    size_t rounded = (bytes + 255) / 256 * 256;
    void *p = rounded >= bytes ? aligned_alloc(256, rounded) : NULL;
    if (!p)
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "dsim_device_alloc: host device out of memory for %zu bytes", bytes);
    /* NaN in every float type: a read of memory nobody wrote shows. */
    memset(p, 0xff, bytes);
    *ptr = p;
    return DSIM_OK;
}

static dsim_err host_free(dsim_device *d, void *ptr)
{
    (void)d;
    free(ptr);
    return DSIM_OK;
}

/* ---- work ---- */

static dsim_err host_copy(dsim_stream *s, dsim_copy_kind kind, void *dst, const void *src,
                          size_t bytes)
{
    (void)kind; /* one address space */
    host_op o = {.kind = HOST_COPY, .dst = dst, .src = src, .bytes = bytes};
    return host_submit(s, &o);
}

static dsim_err host_copy_peer(dsim_stream *s, dsim_device *dst_dev, void *dst,
                               dsim_device *src_dev, const void *src, size_t bytes)
{
    (void)dst_dev;
    (void)src_dev;
    return host_copy(s, DSIM_COPY_D2D, dst, src, bytes);
}

static dsim_err host_memset(dsim_stream *s, void *dst, int byte, size_t bytes)
{
    host_op o = {.kind = HOST_MEMSET, .dst = dst, .byte = byte, .bytes = bytes};
    return host_submit(s, &o);
}

static dsim_err host_reduce(dsim_stream *s, void *out, const void *const *ins, int n, size_t count,
                            dsim_dtype t, dsim_op op)
{
    host_op o = {.kind = HOST_REDUCE, .dst = out, .bytes = count, .byte = n, .t = t, .op = op};
    memcpy(o.ins, ins, (size_t)n * sizeof *ins);
    return host_submit(s, &o);
}

static dsim_err host_reduce_div(dsim_stream *s, void *buf, size_t count, dsim_dtype t, int nranks)
{
    host_op o = {.kind = HOST_DIV, .dst = buf, .bytes = count, .byte = nranks, .t = t};
    return host_submit(s, &o);
}

/* ---- streams ---- */

static dsim_err host_stream_create(dsim_stream *s)
{
    host_stream *hs = dsim_stream_priv(s);
    hs->id = atomic_fetch_add(&host_next_id, 1);
    if (!host_deferred(s))
        return DSIM_OK;
    host_acquire();
    hs->next_live = host_streams;
    host_streams = hs;
    host_release();
    return DSIM_OK;
}

static dsim_err host_stream_sync(dsim_stream *s)
{
    if (!host_deferred(s))
        return DSIM_OK;
    host_stream *hs = dsim_stream_priv(s);
    host_acquire();
    host_drain(hs, UINT64_MAX);
    host_release();
    return DSIM_OK;
}

static void host_stream_destroy(dsim_stream *s)
{
    if (!host_deferred(s))
        return;
    host_stream *hs = dsim_stream_priv(s);
    host_acquire();
    host_drain(hs, UINT64_MAX);
    for (host_stream **pp = &host_streams; *pp; pp = &(*pp)->next_live) {
        if (*pp == hs) {
            *pp = hs->next_live;
            break;
        }
    }
    host_release();
}

static dsim_err host_stream_query(dsim_stream *s, int *idle)
{
    /* Deferred work makes progress when asked about, as a GPU's would on
     * its own: a polling loop ends. */
    *idle = 1;
    return host_stream_sync(s);
}

static dsim_err host_stream_wait_event(dsim_stream *s, dsim_event *e)
{
    host_event *he = dsim_event_priv(e);
    host_acquire();
    dsim_err err = DSIM_OK;
    if (!host_deferred(s)) {
        /* Work on s runs at once, so whatever it must follow runs now. */
        host_event_reach(he);
    } else if (he->where && he->done_gen != he->gen) {
        host_op o = {.kind = HOST_WAIT, .id = he->where, .upto = he->seq};
        err = host_submit(s, &o); /* the lock is recursive */
    }
    host_release();
    return err;
}

/* ---- events ---- */

static dsim_err host_event_create(dsim_event *e)
{
    host_event *he = dsim_event_priv(e);
    he->id = atomic_fetch_add(&host_next_id, 1);
    host_acquire();
    he->next_live = host_events;
    host_events = he;
    host_release();
    return DSIM_OK;
}

static void host_event_destroy(dsim_event *e)
{
    host_event *he = dsim_event_priv(e);
    host_acquire();
    for (host_event **pp = &host_events; *pp; pp = &(*pp)->next_live) {
        if (*pp == he) {
            *pp = he->next_live;
            break;
        }
    }
    host_release();
}

static dsim_err host_event_record(dsim_event *e, dsim_stream *s)
{
    host_event *he = dsim_event_priv(e);
    host_acquire();
    he->gen++;
    if (!host_deferred(s)) {
        he->where = 0;
        he->done_gen = he->gen;
        he->t_ns = dsim_rt_mono_ns();
        host_release();
        return DSIM_OK;
    }
    host_stream *hs = dsim_stream_priv(s);
    he->where = hs->id;
    host_op o = {.kind = HOST_RECORD, .id = he->id, .gen = he->gen};
    dsim_err err = host_submit(s, &o); /* the lock is recursive */
    he->seq = hs->enq;
    host_release();
    return err;
}

static dsim_err host_event_sync(dsim_event *e)
{
    host_acquire();
    host_event_reach(dsim_event_priv(e));
    host_release();
    return DSIM_OK;
}

static dsim_err host_event_query(dsim_event *e, int *done)
{
    host_acquire();
    host_event *he = dsim_event_priv(e);
    host_event_reach(he);
    *done = he->done_gen == he->gen;
    host_release();
    return DSIM_OK;
}

static dsim_err host_event_elapsed(dsim_event *start, dsim_event *end, double *ms)
{
    host_acquire();
    host_event *a = dsim_event_priv(start), *b = dsim_event_priv(end);
    host_event_reach(a);
    host_event_reach(b);
    *ms = (double)(b->t_ns - a->t_ns) / 1e6;
    host_release();
    return DSIM_OK;
}

static dsim_err host_can_access_peer(int index, int peer, int *yes)
{
    (void)index;
    (void)peer;
    *yes = 1; /* one address space */
    return DSIM_OK;
}

static dsim_err host_enable_peer(dsim_device *d, dsim_device *peer)
{
    (void)d;
    (void)peer;
    return DSIM_OK;
}

const struct dsim_device_ops dsim_device_host_ops = {
    .size = sizeof(struct dsim_device_ops),
    .name = "host",
    .device_priv_size = sizeof(host_dev),
    .stream_priv_size = sizeof(host_stream),
    .event_priv_size = sizeof(host_event),
    .count = host_count,
    .query = host_query,
    .open = host_open,
    .close = host_close,
    .alloc = host_alloc,
    .free = host_free,
    .copy = host_copy,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_sync = host_stream_sync,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_sync = host_event_sync,
    .reduce = host_reduce,
    .reduce_div = host_reduce_div,
    .memset = host_memset,
    .stream_query = host_stream_query,
    .stream_wait_event = host_stream_wait_event,
    .event_query = host_event_query,
    .event_elapsed = host_event_elapsed,
    .can_access_peer = host_can_access_peer,
    .enable_peer = host_enable_peer,
    .copy_peer = host_copy_peer,
};
