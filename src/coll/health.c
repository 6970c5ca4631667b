/* The health check (dsim/health.h): one runtime worker per TF worker that
 * answers its peers' pings and pings them, over the worker's first replica's
 * endpoint.
 *
 * The transport has no "receive from any source" and no "wait for any of
 * these requests", so the check keeps one receive posted per peer for its
 * pings and one per pinged peer for the answers, and looks at them all
 * whenever it wakes: at the next thing due (a ping to send, an answer's
 * deadline) and at least every tick (dsim_health_tick_ns). An answer to a
 * ping therefore leaves within a tick of the ping's arrival, which is why the
 * tick is a tenth of the timeout.
 *
 *   worker A's check                       worker B's check
 *   ----------------                       ----------------
 *   ping(seq) --- comm PING, tag seq ----> (posted receive, any tag)
 *                                          answer within a tick
 *   (posted receive, any tag) <-- comm PONG, the same seq -- pong(seq)
 *   answered before the deadline: next ping `interval` later
 *   not answered by `timeout`: ping again at once (seq + 1); after
 *   `retries` such pings in a row, B is down: abort the fabric.
 *
 * Answers are received with any tag and matched on the sequence number they
 * carry, so an answer that comes after its ping was given up on is drained
 * and dropped rather than left unmatched in the endpoint for ever. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"
#include "dsim/health.h"
#include "dsim/log.h"

#define HEALTH_MSG_WORDS 2 /* sequence number, sender's worker */

typedef struct health_peer {
    int worker, rank;
    /* answering this peer's pings */
    dsim_req *ping_rq;
    uint32_t ping_in[HEALTH_MSG_WORDS];
    dsim_req *pong_sq;
    uint32_t pong_out[HEALTH_MSG_WORDS];
    /* pinging it */
    int waiting;  /* a ping is out */
    int attempts; /* pings in a row that went unanswered */
    uint32_t seq;
    int64_t next_ping, deadline;
    dsim_req *ping_sq;
    uint32_t ping_out[HEALTH_MSG_WORDS];
    dsim_req *pong_rq;
    uint32_t pong_in[HEALTH_MSG_WORDS];
} health_peer;

struct dsim_health {
    dsim_health_cfg cfg;
    dsim_rt *rt;
    dsim_waitq *q; /* guards stop, poked and st */
    int stop, poked;
    dsim_health_stats st;   /* what get_stats sees: `mine` as of the last wake-up */
    dsim_health_stats mine; /* the check's own, touched only by its worker */
    dsim_task *task;
    health_peer *peers;
    int npeers;
    int retries;
    int64_t tick;
};

enum { HEALTH_GO, HEALTH_IDLE };

int64_t dsim_health_tick_ns(int64_t interval_ns, int64_t timeout_ns)
{
    int64_t m = interval_ns < timeout_ns ? interval_ns : timeout_ns;
    int64_t t = m / 10;
    if (t < 1000000)
        t = 1000000;
    if (t > 1000000000)
        t = 1000000000;
    return t;
}

static int64_t health_add(int64_t a, int64_t b)
{
    return a > DSIM_NO_DEADLINE - b ? DSIM_NO_DEADLINE : a + b;
}

static int64_t health_mul(int64_t a, int64_t k)
{
    return k > 0 && a > DSIM_NO_DEADLINE / k ? DSIM_NO_DEADLINE : a * k;
}

/* The bound, derived from the code above and in step.c and train.c.
 *
 * Collective timeout. A survivor waiting in the call the lost peer never
 * joins (directly or behind another waiting rank) times out `timeout` after
 * it entered the call, then runs the failure check, which listens for at
 * most the grace (dsim_coll_grace_ns: timeout / 2 within [50 ms, 2 s]), then
 * returns its error; the driver then aborts the fabric (train_fail), which
 * fails every other survivor at once. So every survivor has its error by
 *     timeout + grace
 * after the later of the death and the first survivor's entry into that
 * call. With no timeout this term is infinite.
 *
 * Health check. Let D be the death, tick = dsim_health_tick_ns(I, T).
 *  - The dead worker's check sees `dead` within a tick (it is also poked at
 *    once when a phase hook kills a replica), so it answers no ping that
 *    arrives after D + tick.
 *  - A survivor's check sees that last answer at its next wake-up, at most a
 *    tick later: the last success is at S <= D + 2 tick.
 *  - It pings again at S + I; that ping and each retry wait T and are
 *    retried at once; the R-th unanswered one (R = max(retries, 1)) is
 *    declared at S + I + R T, and dsim_ep_abort wakes every waiter of every
 *    rank at once (one address space: inproc revokes the fabric itself).
 * So every survivor has its error by
 *     I + R T + 2 tick
 * after the death (after the cluster is up: pinging starts then). Off when
 * the interval is 0.
 *
 * The job takes whichever comes first. Both assume, as every deadline in
 * dsim does, that a thread woken at a time runs then; a survivor busy
 * computing rather than waiting gets its error from its next collective. */
int64_t dsim_detection_bound_timeout(int64_t timeout_ns)
{
    if (timeout_ns < 0)
        timeout_ns = DSIM_COMM_DEFAULT_TIMEOUT_NS;
    if (timeout_ns == 0)
        return DSIM_NO_DEADLINE;
    return health_add(timeout_ns, dsim_coll_grace_ns(timeout_ns));
}

int64_t dsim_detection_bound_health(int64_t interval_ns, int64_t hc_timeout_ns, int retries)
{
    if (interval_ns <= 0 || hc_timeout_ns <= 0)
        return DSIM_NO_DEADLINE;
    int r = retries < 1 ? 1 : retries;
    int64_t b = health_add(interval_ns, health_mul(hc_timeout_ns, r));
    return health_add(b, 2 * dsim_health_tick_ns(interval_ns, hc_timeout_ns));
}

int64_t dsim_detection_bound(int64_t timeout_ns, int64_t interval_ns, int64_t hc_timeout_ns,
                             int retries)
{
    int64_t a = dsim_detection_bound_timeout(timeout_ns);
    int64_t b = dsim_detection_bound_health(interval_ns, hc_timeout_ns, retries);
    return a < b ? a : b;
}

/* "10 s", "50 ms", "1.5 s", "250 us" */
static void health_dur(int64_t ns, char *buf, size_t cap)
{
    static const struct {
        int64_t scale;
        const char *unit;
    } u[] = {{1000000000, "s"}, {1000000, "ms"}, {1000, "us"}, {1, "ns"}};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        if (ns >= u[i].scale || u[i].scale == 1) {
            if (ns % u[i].scale == 0)
                snprintf(buf, cap, "%lld %s", (long long)(ns / u[i].scale), u[i].unit);
            else
                snprintf(buf, cap, "%.3g %s", (double)ns / (double)u[i].scale, u[i].unit);
            return;
        }
    }
}

static void health_reap(dsim_req **r)
{
    if (!*r)
        return;
    if (dsim_req_done(*r))
        (void)dsim_wait(*r, DSIM_NO_DEADLINE, NULL);
    else
        dsim_req_cancel(*r);
    *r = NULL;
}

static void health_cancel_all(dsim_health *h)
{
    for (int i = 0; i < h->npeers; i++) {
        health_peer *p = &h->peers[i];
        health_reap(&p->ping_rq);
        health_reap(&p->pong_sq);
        health_reap(&p->ping_sq);
        health_reap(&p->pong_rq);
    }
}

/* Answers every ping of p that has arrived. HEALTH_IDLE when the fabric is
 * gone (aborted): there is nothing left to check. */
static int health_answer(dsim_health *h, health_peer *p, uint64_t *answered)
{
    dsim_ep *ep = h->cfg.ep;
    while (p->ping_rq && dsim_req_done(p->ping_rq)) {
        size_t len = 0;
        dsim_err e = dsim_wait(p->ping_rq, DSIM_NO_DEADLINE, &len);
        p->ping_rq = NULL;
        if (e == DSIM_EABORTED)
            return HEALTH_IDLE;
        if (e == DSIM_OK && len == sizeof p->ping_in) {
            health_reap(&p->pong_sq);
            p->pong_out[0] = p->ping_in[0];
            p->pong_out[1] = (uint32_t)h->cfg.worker;
            e = dsim_isend(ep, p->rank, DSIM_HEALTH_COMM_PONG, p->ping_in[0] & 0x7fffffffu,
                           p->pong_out, sizeof p->pong_out, &p->pong_sq);
            if (e != DSIM_OK) {
                p->pong_sq = NULL;
                if (e == DSIM_EABORTED)
                    return HEALTH_IDLE;
            } else {
                (*answered)++;
            }
        }
        /* A damaged ping or a gap in the stream (a lost message) is not an
         * answer to give: listen for the next one. */
        e = dsim_irecv(ep, p->rank, DSIM_HEALTH_COMM_PING, DSIM_ANY_TAG, p->ping_in,
                       sizeof p->ping_in, &p->ping_rq);
        if (e != DSIM_OK) {
            p->ping_rq = NULL;
            return HEALTH_IDLE;
        }
    }
    return HEALTH_GO;
}

static int health_send_ping(dsim_health *h, health_peer *p, int64_t now)
{
    dsim_ep *ep = h->cfg.ep;
    health_reap(&p->ping_sq);
    p->seq++;
    p->ping_out[0] = p->seq;
    p->ping_out[1] = (uint32_t)h->cfg.worker;
    p->waiting = 1;
    p->deadline = health_add(now, h->cfg.timeout_ns);
    dsim_err e = dsim_isend(ep, p->rank, DSIM_HEALTH_COMM_PING, p->seq & 0x7fffffffu, p->ping_out,
                            sizeof p->ping_out, &p->ping_sq);
    if (e != DSIM_OK) {
        p->ping_sq = NULL;
        return HEALTH_IDLE;
    }
    h->mine.pings_sent++;
    if (!p->pong_rq) {
        e = dsim_irecv(ep, p->rank, DSIM_HEALTH_COMM_PONG, DSIM_ANY_TAG, p->pong_in,
                       sizeof p->pong_in, &p->pong_rq);
        if (e != DSIM_OK) {
            p->pong_rq = NULL;
            return HEALTH_IDLE;
        }
    }
    return HEALTH_GO;
}

static void health_down(dsim_health *h, health_peer *p, int64_t now)
{
    char tmo[32], why[256];
    health_dur(h->cfg.timeout_ns, tmo, sizeof tmo);
    int rpw = h->cfg.ranks_per_worker;
    snprintf(why, sizeof why,
             "cluster check alive failed, peer %d is down: it did not answer %d health check%s of "
             "%s (worker %d, ranks %d..%d; checked by worker %d)",
             p->rank, h->retries, h->retries == 1 ? "" : "s", tmo, p->worker, p->rank,
             p->rank + rpw - 1, h->cfg.worker);
    dsim_error_log("%s; aborting collectives", why);
    h->mine.down_worker = p->worker;
    h->mine.down_at = now;
    dsim_ep_abort(h->cfg.ep, p->rank, why);
}

/* Collects p's answer, retries or gives up on p. */
static int health_ping(dsim_health *h, health_peer *p, int64_t now)
{
    dsim_ep *ep = h->cfg.ep;
    if (!p->waiting) {
        if (now >= p->next_ping)
            return health_send_ping(h, p, now);
        return HEALTH_GO;
    }
    while (p->pong_rq && dsim_req_done(p->pong_rq)) {
        size_t len = 0;
        dsim_err e = dsim_wait(p->pong_rq, DSIM_NO_DEADLINE, &len);
        p->pong_rq = NULL;
        if (e == DSIM_EABORTED)
            return HEALTH_IDLE;
        if (e == DSIM_OK && len == sizeof p->pong_in && p->pong_in[0] == p->seq) {
            p->waiting = 0;
            p->attempts = 0;
            p->next_ping = health_add(now, h->cfg.interval_ns);
            h->mine.answers_received++;
            health_reap(&p->ping_sq);
            return HEALTH_GO;
        }
        /* An answer to an earlier ping, or a gap: keep listening. */
        e = dsim_irecv(ep, p->rank, DSIM_HEALTH_COMM_PONG, DSIM_ANY_TAG, p->pong_in,
                       sizeof p->pong_in, &p->pong_rq);
        if (e != DSIM_OK) {
            p->pong_rq = NULL;
            return HEALTH_IDLE;
        }
    }
    if (now < p->deadline)
        return HEALTH_GO;
    p->attempts++;
    if (p->attempts >= h->retries) {
        health_down(h, p, now);
        return HEALTH_IDLE;
    }
    h->mine.retries++;
    dsim_warn("health check of worker %d: peer %d (worker %d) seems down, retrying %d/%d",
              h->cfg.worker, p->rank, p->worker, p->attempts, h->retries);
    return health_send_ping(h, p, now);
}

static void health_main(void *arg)
{
    dsim_health *h = arg;
    dsim_ep *ep = h->cfg.ep;
    int dead = 0, ready = 0, idle = 0;
    for (int i = 0; i < h->npeers && !idle; i++) {
        health_peer *p = &h->peers[i];
        if (dsim_irecv(ep, p->rank, DSIM_HEALTH_COMM_PING, DSIM_ANY_TAG, p->ping_in,
                       sizeof p->ping_in, &p->ping_rq) != DSIM_OK) {
            p->ping_rq = NULL;
            idle = 1;
        }
    }
    for (;;) {
        dsim_waitq_lock(h->q);
        int stop = h->stop;
        h->poked = 0;
        dsim_waitq_unlock(h->q);
        if (stop)
            break;
        if (!dead && h->cfg.dead && h->cfg.dead(h->cfg.user)) {
            /* A dead process neither answers nor pings. */
            dead = 1;
            health_cancel_all(h);
        }
        int64_t now = dsim_rt_now(h->rt);
        int64_t wake = DSIM_NO_DEADLINE;
        if (!dead && !idle) {
            if (!ready && (!h->cfg.ready || h->cfg.ready(h->cfg.user))) {
                ready = 1;
                for (int i = 0; i < h->npeers; i++)
                    h->peers[i].next_ping = now;
            }
            for (int i = 0; i < h->npeers && !idle; i++)
                idle = health_answer(h, &h->peers[i], &h->mine.pings_answered) == HEALTH_IDLE;
            for (int i = 0; ready && i < h->npeers && !idle; i++)
                idle = health_ping(h, &h->peers[i], now) == HEALTH_IDLE;
            if (idle) {
                health_cancel_all(h);
            } else {
                wake = health_add(now, h->tick);
                for (int i = 0; ready && i < h->npeers; i++) {
                    const health_peer *p = &h->peers[i];
                    int64_t due = p->waiting ? p->deadline : p->next_ping;
                    if (due < wake)
                        wake = due;
                }
            }
        }
        dsim_waitq_lock(h->q);
        h->st = h->mine;
        while (!h->stop && !h->poked)
            if (dsim_waitq_wait(h->q, wake) == DSIM_ETIMEDOUT)
                break;
        dsim_waitq_unlock(h->q);
    }
    health_cancel_all(h);
    dsim_waitq_lock(h->q);
    h->st = h->mine;
    dsim_waitq_unlock(h->q);
}

dsim_err dsim_health_start(const dsim_health_cfg *cfg, dsim_health **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_health_start: out is NULL");
    *out = NULL;
    if (!cfg || !cfg->ep)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_health_start: %s is NULL", !cfg ? "cfg" : "cfg.ep");
    if (cfg->num_workers < 1 || cfg->worker < 0 || cfg->worker >= cfg->num_workers ||
        cfg->ranks_per_worker < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_health_start: worker %d of %d with %d rank(s) each does not make "
                        "a cluster",
                        cfg->worker, cfg->num_workers, cfg->ranks_per_worker);
    if (cfg->interval_ns <= 0 || cfg->timeout_ns <= 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_health_start: interval %lld ns and timeout %lld ns must both be > 0 "
                        "(an interval of 0 turns the check off: do not start it)",
                        (long long)cfg->interval_ns, (long long)cfg->timeout_ns);
    dsim_health *h = calloc(1, sizeof *h);
    if (!h)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_health_start: out of memory");
    h->cfg = *cfg;
    h->rt = dsim_ep_rt(cfg->ep);
    h->retries = cfg->retries < 1 ? 1 : cfg->retries;
    h->tick = dsim_health_tick_ns(cfg->interval_ns, cfg->timeout_ns);
    h->st.down_worker = h->mine.down_worker = -1;
    h->npeers = cfg->num_workers - 1;
    h->peers = calloc((size_t)(h->npeers ? h->npeers : 1), sizeof *h->peers);
    dsim_err e = DSIM_OK;
    if (!h->peers)
        e = DSIM_ERR(DSIM_ENOMEM, -1, "dsim_health_start: out of memory for %d peers", h->npeers);
    for (int w = 0, i = 0; e == DSIM_OK && w < cfg->num_workers; w++) {
        if (w == cfg->worker)
            continue;
        h->peers[i].worker = w;
        h->peers[i].rank = w * cfg->ranks_per_worker;
        i++;
    }
    if (e == DSIM_OK)
        e = dsim_waitq_create(h->rt, &h->q);
    if (e == DSIM_OK)
        e = dsim_rt_spawn(h->rt, cfg->task_id, health_main, h, &h->task);
    if (e != DSIM_OK) {
        if (h->q)
            dsim_waitq_destroy(h->q);
        free(h->peers);
        free(h);
        return e;
    }
    *out = h;
    return DSIM_OK;
}

void dsim_health_poke(dsim_health *h)
{
    if (!h)
        return;
    dsim_waitq_lock(h->q);
    h->poked = 1;
    dsim_waitq_wake(h->q);
    dsim_waitq_unlock(h->q);
}

void dsim_health_stop(dsim_health *h)
{
    if (!h)
        return;
    dsim_waitq_lock(h->q);
    h->stop = 1;
    dsim_waitq_wake(h->q);
    dsim_waitq_unlock(h->q);
    dsim_rt_join(h->rt, h->task);
    dsim_waitq_destroy(h->q);
    free(h->peers);
    free(h);
}

void dsim_health_get_stats(dsim_health *h, dsim_health_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    out->down_worker = -1;
    if (!h)
        return;
    dsim_waitq_lock(h->q);
    *out = h->st;
    dsim_waitq_unlock(h->q);
}
