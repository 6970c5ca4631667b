/* The record ring of a forked child: the records (proc_wire.h) it sends its
 * parent go through memory the two share, not through the pipe.
 *
 * A pipe write per record woke the parent for every step of every replica
 * (a step's record and its batch's read): with the replicas outnumbering
 * the CPUs, each wake-up took a CPU from them mid-step, and the quickstart
 * under the processes engine ran 110 us a step where its two collectives
 * take 36 back to back. Now the child appends a record to the ring (no
 * system call) and wakes the parent only for a record it must see at once
 * (a kill, a pause, a fault event, the result at the end) or when the ring
 * is a quarter full; the parent reads the rings each time round its watch
 * loop as well (every 20 ms at most). The pipe stays: its wake-up bytes,
 * and its end, which tells the parent that the child is gone.
 *
 * A record is published whole (the ring's tail moves past it after it is
 * copied), so a child killed while it writes one leaves none of it; a record
 * larger than the free space goes in parts as the parent makes room, and
 * one cut short by a kill is dropped at the pipe's end, as a pipe's is.
 * What a killed child published stays in the shared memory: its parent
 * reads it after the death (a batch the job relied on is not lost). */
#ifndef DSIM_SIM_PROC_RING_H
#define DSIM_SIM_PROC_RING_H

#include <stdbool.h>
#include <stddef.h>

#include "proc_wire.h"

typedef struct pr_ring pr_ring;

/* The ring's data size (a power of two). */
#define PR_RING_BYTES (1u << 20)

/* A ring in memory shared with children forked after it; NULL where it
 * cannot be mapped (the records then go over the pipe, as before). */
pr_ring *pr_ring_map(void);
void pr_ring_unmap(pr_ring *r);

/* The child: appends the parts iov[cnt] as one record's bytes (a record's
 * whole, under the sender's own lock: one writer a ring) and wakes the
 * parent over fd where `urgent` or the ring fills. Waits while the ring
 * is full. */
struct iovec;
void pr_ring_send(pr_ring *r, int fd, const struct iovec *iov, int cnt, bool urgent);

/* The parent: the next record from the child whose pipe's read end is fd
 * (non-blocking) and ring r, as pr_reader_next: 1 a whole record in rd, 0
 * none now, -1 the pipe ended and the ring holds no whole record more (or
 * a length that is no record's). r NULL: the records come over fd. */
int pr_ring_next(pr_ring *r, int fd, pr_reader *rd);

#endif
