/* The runtime seam: all blocking, waiting and time in libdsim goes through
 * this API, so one code base runs on threads, processes or a virtual clock.
 *
 * Times are nanoseconds on the engine's clock (CLOCK_MONOTONIC for threads).
 * A deadline is an absolute time on that clock; DSIM_NO_DEADLINE never
 * passes. A wait queue is a lock plus a condition: lock it, test your
 * condition, wait (which drops the lock while blocked), unlock. */
#ifndef DSIM_RT_H
#define DSIM_RT_H

#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_NO_DEADLINE INT64_MAX

typedef struct dsim_rt dsim_rt;
typedef struct dsim_waitq dsim_waitq;
typedef struct dsim_task dsim_task;

/* engine: "threads" (others register through spi/rt.h). */
DSIM_API dsim_err dsim_rt_create(const char *engine, dsim_rt **out);
/* The same with a seed for the engine's own choices (the sim engine's
 * tie-break between workers due at the same virtual time). */
DSIM_API dsim_err dsim_rt_create_seeded(const char *engine, uint64_t seed, dsim_rt **out);
DSIM_API void dsim_rt_destroy(dsim_rt *rt);
DSIM_API const char *dsim_rt_name(const dsim_rt *rt);

DSIM_API int64_t dsim_rt_now(dsim_rt *rt);
/* now + timeout_ns, saturating; a negative timeout means no deadline. */
DSIM_API int64_t dsim_rt_deadline(dsim_rt *rt, int64_t timeout_ns);
/* Accounts ns of compute to the calling worker (advances virtual time under
 * the sim engine; only counted under threads). */
DSIM_API void dsim_rt_charge(dsim_rt *rt, int64_t ns);
/* Total compute charged by the calling worker. */
DSIM_API int64_t dsim_rt_charged(dsim_rt *rt);
/* Sleeps until the deadline; DSIM_OK when it passed. */
DSIM_API dsim_err dsim_rt_sleep_until(dsim_rt *rt, int64_t deadline);

/* Starts fn(arg) as worker `id`. join waits for it and frees the task. */
DSIM_API dsim_err dsim_rt_spawn(dsim_rt *rt, int id, void (*fn)(void *), void *arg,
                                dsim_task **out);
DSIM_API dsim_err dsim_rt_join(dsim_rt *rt, dsim_task *task);
/* Gives up on a worker: it runs on with nobody waiting for it (its engine
 * state is freed when fn returns, if ever) and the task is freed. For a
 * watchdog that must not wait for a worker stuck in user code; whatever fn
 * uses must then outlive it. DSIM_ENOTSUP when the engine cannot leave a
 * worker behind (the task is then still the caller's, to join). */
DSIM_API dsim_err dsim_rt_detach(dsim_rt *rt, dsim_task *task);
/* The id given at spawn for the calling worker; -1 outside any worker. */
DSIM_API int dsim_rt_self(dsim_rt *rt);

DSIM_API dsim_err dsim_waitq_create(dsim_rt *rt, dsim_waitq **out);
DSIM_API void dsim_waitq_destroy(dsim_waitq *q);
DSIM_API void dsim_waitq_lock(dsim_waitq *q);
DSIM_API void dsim_waitq_unlock(dsim_waitq *q);
/* Called with the lock held; drops it while blocked and holds it again on
 * return. DSIM_OK on a wake-up (possibly spurious: re-test the condition),
 * DSIM_ETIMEDOUT once the deadline has passed. */
DSIM_API dsim_err dsim_waitq_wait(dsim_waitq *q, int64_t deadline);
/* Wakes every waiter. May be called with or without the lock held. */
DSIM_API void dsim_waitq_wake(dsim_waitq *q);

/* The event trace. Under a deterministic engine (sim) every send, delivery,
 * completed receive, fault, clock jump and worker switch is folded, in
 * order, into one 64-bit hash: equal runs have equal hashes. Elsewhere the
 * order is the OS's and the hash stays 0. a..c are the event's fields. */
enum dsim_trace_kind {
    DSIM_TRACE_SEND = 1,
    DSIM_TRACE_DELIVER,
    DSIM_TRACE_RECV,
    DSIM_TRACE_FAULT,
    DSIM_TRACE_CLOCK,
    DSIM_TRACE_SWITCH,
    DSIM_TRACE_RESULT,
    DSIM_TRACE_SPAWN,
};
DSIM_API void dsim_rt_trace(dsim_rt *rt, enum dsim_trace_kind kind, uint64_t a, uint64_t b,
                            uint64_t c);
/* The hash so far, and the number of events in it (both 0 unless the
 * engine is deterministic). */
DSIM_API uint64_t dsim_rt_trace_hash(const dsim_rt *rt, uint64_t *count);
/* Whether the engine orders events deterministically (the sim engine). */
DSIM_API int dsim_rt_deterministic(const dsim_rt *rt);

#ifdef __cplusplus
}
#endif
#endif
