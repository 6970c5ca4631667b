/* The device layer's handles, shared by the dispatch files (device.c: the
 * registry, devices and memory; device_work.c: copies, streams, events,
 * reductions, checksums). Backends see them only through the SPI. */
#ifndef DSIM_DEVICE_INT_H
#define DSIM_DEVICE_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/device.h"
#include "dsim/spi/device.h"

/* How many freed base addresses a device remembers, to say "freed already"
 * rather than "not an allocation" for a double free. */
#define DEV_FREED_RING 32

typedef struct dev_range {
    uintptr_t base;
    size_t size;
} dev_range;

/* Live allocations, sorted by base. */
typedef struct dev_table {
    dev_range *v;
    size_t n, cap;
    size_t bytes;
} dev_table;

struct dsim_stream {
    dsim_device *dev;
    dsim_stream *prev, *next; /* the device's streams (not its own) */
    void *priv;
};

struct dsim_event {
    dsim_device *dev;
    dsim_event *prev, *next;
    int recorded;
    void *priv;
};

struct dsim_device {
    const struct dsim_device_ops *ops;
    int index;
    dsim_device_info info;
    char label[48];       /* "cuda:0", for messages */
    pthread_mutex_t lock; /* everything below */
    dev_table mem;        /* device allocations */
    dev_table host;       /* dsim_device_host_alloc's */
    uintptr_t freed[DEV_FREED_RING];
    unsigned freed_next;
    dsim_device **peers; /* enabled with dsim_device_enable_peer */
    int n_peers, cap_peers;
    dsim_stream *streams;
    dsim_event *events;
    dsim_stream *own; /* where NULL-stream work goes */
    dsim_device *open_next, *open_prev;
    void *priv;
};

/* Allocates a zeroed handle of hsize bytes followed by priv_size bytes of
 * backend state (aligned for any type); *priv points at the latter. */
void *dev_handle_alloc(size_t hsize, size_t priv_size, void **priv);

/* DSIM_OK when [p, p + bytes) lies inside one live allocation of d, or, with
 * peers set, of a device d enabled as a peer; otherwise DSIM_EINVAL naming
 * fn, what ("the source", "input 2") and the fix. */
dsim_err dev_check_range(dsim_device *d, const char *fn, const char *what, const void *p,
                         size_t bytes, int peers);
/* Non-zero when [p, p + bytes) (bytes > 0) overlaps an allocation of d. */
int dev_overlaps_mem(dsim_device *d, const void *p, size_t bytes);
/* The stream work for d goes on: s itself (which must be d's, or for a
 * copy between devices, other's), or d's own stream for NULL. */
dsim_err dev_pick_stream(dsim_device *d, dsim_device *other, dsim_stream *s, const char *fn,
                         dsim_stream **use);
/* After enqueueing on `use` for a caller's stream s: a NULL s waits. */
dsim_err dev_done(dsim_stream *use, dsim_stream *s, dsim_err e);
/* Waits for every stream of d (its own included); the first failure. */
dsim_err dev_sync_all(dsim_device *d);

#endif
