/* The health check: TF MultiWorkerMirroredStrategy's _check_health.
 *
 * Each worker (a TF task) runs one health check on its own runtime worker,
 * over the endpoint of its first replica. It answers every peer's pings
 * (so a worker whose training thread is busy, or slow, still answers) and
 * pings every other worker: a ping `interval` after the last one to that
 * peer left, once it is answered (at once if the answer took longer), so the
 * peers pinged together stay in step;
 * an unanswered ping is retried at once, `timeout` after the previous one;
 * after `retries` unanswered pings in a row the peer is down and the check
 * aborts the fabric (dsim_ep_abort) with
 *     "cluster check alive failed, peer R is down: it did not answer 3 health
 *      checks of 10 s (worker W, ranks R..R'; checked by worker V)"
 * so every pending and later collective of every rank fails at once with
 * that reason (DSIM_EABORTED). The abort is permanent until the group is
 * formed again (TF: "It's required to restart in order to recover").
 *
 * Pings go on communicator DSIM_HEALTH_COMM_PING, answers on
 * DSIM_HEALTH_COMM_PONG (ids below DSIM_STRATEGY_COMM_USER, reserved for the
 * driver). Everything blocks through dsim_rt, so the check runs under any
 * engine, the virtual clock included.
 *
 * The check answers from the start but pings only once `ready` says so (TF
 * starts its thread once the cluster is up), and a worker that `dead` says
 * is dead (its process killed) neither answers nor pings again: a dead
 * process does not ping. */
#ifndef DSIM_HEALTH_H
#define DSIM_HEALTH_H

#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_HEALTH_COMM_PING 2u
#define DSIM_HEALTH_COMM_PONG 3u

/* TF's defaults (CollectiveAllReduceExtended._check_health_interval,
 * _check_health_timeout, _check_health_retry_limit). */
#define DSIM_HEALTH_DEFAULT_INTERVAL_NS (30LL * 1000 * 1000 * 1000)
#define DSIM_HEALTH_DEFAULT_TIMEOUT_NS  (10LL * 1000 * 1000 * 1000)
#define DSIM_HEALTH_DEFAULT_RETRIES     3

typedef struct dsim_health dsim_health;

typedef struct dsim_health_cfg {
    dsim_ep *ep;          /* this worker's endpoint (its first replica's) */
    int worker;           /* this worker, 0 .. num_workers - 1 */
    int num_workers;      /* >= 1; with 1 there is nobody to ping */
    int ranks_per_worker; /* worker w's endpoint is rank w * ranks_per_worker and
                             its replicas are the ranks_per_worker ranks from there */
    int64_t interval_ns;  /* > 0: from a peer's answered ping to its next */
    int64_t timeout_ns;   /* > 0: how long one ping waits for its answer */
    int retries;          /* unanswered pings in a row that make a peer down;
                             0 counts as 1 (as in TF, the first failure already
                             reaches a limit of 0 or 1) */
    /* Optional (NULL: never). 1 once this worker is dead: it stops answering
     * and pinging. Asked at least every tick (dsim_health_tick_ns) and at
     * every dsim_health_poke; must be thread-safe. */
    int (*dead)(void *user);
    /* Optional (NULL: at once). 1 once this worker may start pinging (the
     * cluster is up). Asked at every tick until it says yes. */
    int (*ready)(void *user);
    void *user;
    int task_id; /* the runtime worker id to spawn the check as */
} dsim_health_cfg;

/* Starts the health check of one worker on its own runtime worker. Stop it
 * with dsim_health_stop (which joins it) before closing the endpoint. */
DSIM_API dsim_err dsim_health_start(const dsim_health_cfg *cfg, dsim_health **out);
/* Makes the check look at `dead` and `ready` now instead of at its next
 * tick. Any thread. */
DSIM_API void dsim_health_poke(dsim_health *h);
/* Stops the check, waits for its runtime worker to return and frees it.
 * NULL is fine. */
DSIM_API void dsim_health_stop(dsim_health *h);

/* What one check has done so far. */
typedef struct dsim_health_stats {
    uint64_t pings_sent, answers_received, pings_answered, retries;
    int down_worker; /* the worker it found down, or -1 */
    int64_t down_at; /* dsim_rt_now when it did (0 if never) */
} dsim_health_stats;
/* A snapshot as of the check's last wake-up, from any thread (before
 * dsim_health_stop). */
DSIM_API void dsim_health_get_stats(dsim_health *h, dsim_health_stats *out);

/* How often a check wakes when nothing is due: it answers pings and looks
 * at `dead` at least this often. min(interval, timeout) / 10, within
 * [1 ms, 1 s]. */
DSIM_API int64_t dsim_health_tick_ns(int64_t interval_ns, int64_t timeout_ns);

/* The detection bound: the longest time, after a peer dies, until every
 * survivor of a dsim_train job has returned an error (or is failed at once
 * by its next collective, if it was computing rather than waiting). Its
 * arguments are dsim_train_cfg's: timeout_ns (> 0, 0 none, < 0 the 30 s
 * default), the health check's interval (0: off), timeout and retries.
 * DSIM_NO_DEADLINE when the loss is never detected (no timeout and no health
 * check): the survivors wait for ever. The derivation is in health.c. */
DSIM_API int64_t dsim_detection_bound(int64_t timeout_ns, int64_t interval_ns,
                                      int64_t hc_timeout_ns, int retries);
/* Its two terms: the collective timeout's (timeout + the failure check's
 * grace; DSIM_NO_DEADLINE with no timeout) and the health check's
 * (DSIM_NO_DEADLINE when it is off). */
DSIM_API int64_t dsim_detection_bound_timeout(int64_t timeout_ns);
DSIM_API int64_t dsim_detection_bound_health(int64_t interval_ns, int64_t hc_timeout_ns,
                                             int retries);

#ifdef __cplusplus
}
#endif
#endif
