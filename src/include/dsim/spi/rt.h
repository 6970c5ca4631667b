/* For people who write an engine: the runtime ops table.
 *
 * An engine is a const table registered by name. Every member is required.
 * The dispatch file (src/core/rt.c) is the only caller. */
#ifndef DSIM_SPI_RT_H
#define DSIM_SPI_RT_H

#include <stddef.h>

#include "dsim/api.h"
#include "dsim/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dsim_rt_ops {
    size_t size;            /* sizeof(struct dsim_rt_ops), checked at registration */
    const char *name;       /* "threads", "sim", ... */
    size_t priv_size;       /* bytes of engine state placed after struct dsim_rt */
    size_t waitq_priv_size; /* bytes of state per wait queue */
    unsigned flags;         /* DSIM_RT_* below */

    /* Sets up engine state in rt->priv; DSIM_OK or an error with a message. */
    dsim_err (*init)(dsim_rt *rt);
    /* Releases engine state; every task has been joined. */
    void (*fini)(dsim_rt *rt);
    /* Current time on the engine's clock, in ns. */
    int64_t (*now)(dsim_rt *rt);
    /* Accounts ns of compute to the calling worker. */
    void (*charge)(dsim_rt *rt, int64_t ns);
    /* Compute charged so far by the calling worker. */
    int64_t (*charged)(dsim_rt *rt);
    /* Blocks the caller until deadline. */
    dsim_err (*sleep_until)(dsim_rt *rt, int64_t deadline);
    /* Starts a worker; *task_priv receives the engine's handle. */
    dsim_err (*spawn)(dsim_rt *rt, int id, void (*fn)(void *), void *arg, void **handle);
    /* Waits for the worker started with handle to return; frees the handle. */
    dsim_err (*join)(dsim_rt *rt, void *handle);
    /* Lets the worker run on unwaited; the handle is freed now or when the
     * worker returns. DSIM_ENOTSUP when the engine cannot (handle kept). */
    dsim_err (*detach)(dsim_rt *rt, void *handle);
    /* The calling worker's id, or -1. */
    int (*self)(dsim_rt *rt);
    /* Wait-queue primitives on the waitq's private area, as in dsim/rt.h. */
    dsim_err (*waitq_init)(dsim_rt *rt, void *q);
    void (*waitq_fini)(dsim_rt *rt, void *q);
    void (*waitq_lock)(dsim_rt *rt, void *q);
    void (*waitq_unlock)(dsim_rt *rt, void *q);
    dsim_err (*waitq_wait)(dsim_rt *rt, void *q, int64_t deadline);
    void (*waitq_wake)(dsim_rt *rt, void *q);
};

/* The engine orders every event the same way for the same inputs and
 * seed (one OS thread, virtual time): the dispatch then keeps the trace hash
 * (dsim_rt_trace); other engines' hashes stay 0. */
#define DSIM_RT_DETERMINISTIC 1u
/* Time is the engine's own clock, moved by the charges and the waits of its
 * workers, not the wall's: what waits on the OS (sockets, epoll, a real
 * sleep) cannot run under it. */
#define DSIM_RT_VIRTUAL_TIME 2u

/* The flags of the engine registered as `engine` (NULL: "threads"); 0 when
 * no engine has that name. For code that must refuse an engine before it
 * creates one. */
DSIM_API unsigned dsim_rt_engine_flags(const char *engine);

struct dsim_rt {
    const struct dsim_rt_ops *ops;
    void *priv;           /* ops->priv_size bytes, zeroed */
    uint64_t seed;        /* given to dsim_rt_create_seeded; set before init */
    uint64_t trace_hash;  /* the dispatch's; DSIM_RT_DETERMINISTIC engines only */
    uint64_t trace_count; /* events folded into trace_hash */
};

/* Per-worker state of libdsim itself (the last error, which replica the
 * driver runs on this worker): thread-local, so an engine that runs several
 * workers on one OS thread must save it when it switches a worker out and
 * restore it when it switches the worker back in. A new worker starts from
 * a buffer that dsim_rt_worker_state_init filled. Buffers hold
 * DSIM_RT_WORKER_STATE_MAX bytes; dsim_rt_worker_state_size says how many
 * are used. */
#define DSIM_RT_WORKER_STATE_MAX 1024
DSIM_API size_t dsim_rt_worker_state_size(void);
DSIM_API void dsim_rt_worker_state_init(void *buf);
DSIM_API void dsim_rt_worker_state_save(void *buf);
DSIM_API void dsim_rt_worker_state_restore(const void *buf);

/* For libdsim's modules: registers thread-local state (addr() returns the
 * calling thread's copy, init its value in a new worker, may be NULL for
 * zeroes). Called from constructors, before any engine runs. */
DSIM_API void dsim_rt_worker_state_add(void *(*addr)(void), const void *init, size_t size);
/* The same, for state whose meaningful part is often a short prefix:
 * used(p) says how many of its size bytes at p a switch must carry (a
 * message buffer up to its terminator). */
DSIM_API void dsim_rt_worker_state_add_used(void *(*addr)(void), const void *init, size_t size,
                                            size_t (*used)(const void *p));

/* Prefetch hints: what a worker touches first when it runs again (the
 * request and endpoint it waits on, its communicator). libdsim's modules
 * name them before a worker waits (dsim_rt_hint, slot < DSIM_RT_HINTS, NULL
 * to clear); they travel in the worker state. An engine that runs many
 * workers on one thread may call dsim_rt_worker_prefetch on the saved state
 * of the worker it will run next, so that those lines are on their way while
 * another runs. Only a hint: a stale pointer costs a wasted prefetch, never
 * a fault. */
#define DSIM_RT_HINTS 6
enum {
    DSIM_RT_HINT_REQ,
    DSIM_RT_HINT_EP,
    DSIM_RT_HINT_EP_LOCK,
    DSIM_RT_HINT_COMM,
    DSIM_RT_HINT_PEER,
    DSIM_RT_HINT_PEER_MAP
};
DSIM_API void dsim_rt_hint(int slot, const void *p);
DSIM_API void dsim_rt_worker_prefetch(const void *buf);
/* The byte offset and length of the hints in a worker state buffer (for an
 * engine that prefetches the buffer itself one turn earlier). */
DSIM_API size_t dsim_rt_worker_hints_offset(void);

/* Waiting without sleeping. A waiter that looks again and again for a
 * peer's word either gives its CPU away between looks (sched_yield: right
 * when runnable workers outnumber the CPUs, since the peer it waits for may
 * need that CPU) or stays on it and pauses (the CPU's pause: right when every
 * worker has a CPU of its own, where a yield is a system call and a trip
 * through the scheduler for nothing, about 1 us here, against a peer's
 * message that lands in tens of nanoseconds). dsim_rt_cpus is the number of
 * CPUs this process may run on (its affinity mask, read once).
 * dsim_rt_spin_look is the wait between looks number i (from 1) for a
 * waiter among `workers` runnable workers of this host: pauses while each
 * has a CPU, with a yield every 64 looks (another program's thread may want
 * the CPU), and a yield every time otherwise. It returns 0 where the waiter
 * should stop looking and sleep: a yield kept it off its CPU for more than
 * 1 ms, or one did within the last 10 ms .. 1 s (the window doubles while
 * it keeps happening; a quick yield ends it). A yield hands the CPU to
 * whatever else is runnable there for the rest of its slice: with another
 * program busy on each CPU, every look cost about 4 ms, and a step of the
 * quickstart took 8-16 ms where it takes 25-55 us (waits that sleep are
 * woken by their peer at once). */
DSIM_API int dsim_rt_cpus(void);
DSIM_API int dsim_rt_spin_look(int i, int workers);
/* Ends the window in which dsim_rt_spin_look says sleep: the next waits
 * look again, as a fresh process's do. For a measurement that must not
 * inherit the one before it: `dsim calibrate` after a benchmark of
 * megabytes, whose steps kept a waiter's yield away for milliseconds, found
 * the window open and timed every wait as a wake-up (a ping-pong of 64 B at
 * 23 us instead of 1). */
DSIM_API void dsim_rt_spin_reset(void);
/* CLOCK_MONOTONIC in nanoseconds: the threads engine's clock (dsim_rt_now),
 * for code that times the wall outside an engine. */
DSIM_API int64_t dsim_rt_mono_ns(void);
/* The job's workers on this host in all its processes, where a process
 * holds only some of them (a processes-engine child says so before its
 * ranks start; 0 forgets it): dsim_rt_spin_look counts at least this many,
 * so that four one-worker processes on two CPUs yield, not pause. */
DSIM_API void dsim_rt_set_host_workers(int n);
DSIM_API int dsim_rt_host_workers(void);

/* Binding workers to CPUs, as Open MPI binds its ranks to cores. Where the
 * job's workers on this host (dsim_rt_set_host_workers, n >= 2) fill the
 * process's CPUs (n >= CPUs: the job has the machine to itself, or shares
 * it evenly), worker `id` (0 <= id < n, unique on the host) binds the
 * calling thread to CPU id % CPUs of the process's affinity mask and
 * returns 1; otherwise (fewer workers than CPUs: several small jobs side by
 * side, which the scheduler spreads better than a fixed choice; or
 * DSIM_BIND=0 in the environment) it leaves the thread alone and returns 0.
 * Left to the scheduler, two workers on 2 CPUs were often both placed on
 * one, each wait then costing a context switch (a 2-rank 4 KiB all-reduce
 * took 2-3 us or 9-15 us from run to run), and 4 on 2 CPUs ran 3 to 1.
 * dsim_rt_unbind_self gives the calling thread the
 * process's whole mask again (a thread started by a bound one inherits its
 * CPU): the threads engine's other tasks and the transports' own threads
 * call it first. */
DSIM_API int dsim_rt_bind_worker(int id);
DSIM_API void dsim_rt_unbind_self(void);
/* A transport's own thread (a progress loop) follows the process's
 * workers: while some of them are bound (dsim_rt_bind_worker) it runs on
 * their CPUs only, else, or while the process's last send between
 * processes was bulk (dsim_rt_note_send), on the process's whole mask.
 * Call it at the thread's start and in its loop, before it sleeps (one
 * atomic load while nothing changed); *seen starts at ~0u. Left to the
 * scheduler, a progress thread woke on either CPU and preempted a worker
 * there: 4 processes on 2 CPUs over shm ran a 256 KiB all-reduce in
 * 96-110 us or in 157-191 us from one window of 400 to the next, as the
 * four progress threads happened to land. Bulk traffic is messages of
 * DSIM_RT_BULK_BYTES or more (where the progress thread's own
 * copies and wake-ups are better placed wherever a CPU is free: a 64 MiB
 * all-reduce of 4 processes took 7-9 % longer with it bound). The
 * environment's DSIM_BIND_FOLLOW=0 keeps every such thread on the whole
 * mask. */
DSIM_API void dsim_rt_follow_workers(unsigned *seen);
DSIM_API void dsim_rt_note_send(size_t len);
#define DSIM_RT_BULK_BYTES ((size_t)16 << 20)

/* Registers an engine; required members are checked. Built-ins register
 * themselves on first use. */
DSIM_API dsim_err dsim_rt_register(const struct dsim_rt_ops *ops);

/* The built-in engine tables. */
DSIM_API extern const struct dsim_rt_ops dsim_rt_threads_ops;

#ifdef __cplusplus
}
#endif
#endif
