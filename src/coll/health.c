/* The health check (dsim/health.h): one runtime worker per TF worker that
 * answers its peers' pings and pings them, over the worker's first replica's
 * endpoint.
 *
 * Nothing is kept per peer while nobody pings: the pings of every peer are
 * found with dsim_probe_any (one look through the endpoint's unexpected
 * messages) and received then, and the state for pinging the peers is made
 * when the check starts pinging (`ready`). So an idle check costs the same
 * whatever the number of workers; a pinging one a few words per peer, what
 * pinging all of them every interval (as TF does) needs anyway.
 *
 * The check looks at what arrived whenever it wakes: at the next thing due
 * (a ping to send, an answer's deadline) and at least every tick
 * (dsim_health_tick_ns). An answer to a ping therefore leaves within a tick
 * of the ping's arrival, which is why the tick is a tenth of the timeout.
 *
 *   worker A's check                       worker B's check
 *   ----------------                       ----------------
 *   ping(seq) --- comm PING, tag seq ----> (found by the probe, any tag)
 *                                          answer within a tick
 *   (posted receive, any tag) <-- comm PONG, the same seq -- pong(seq)
 *   answered before the deadline: next ping `interval` after this one left
 *   not answered by `timeout`: ping again at once (seq + 1); after
 *   `retries` such pings in a row, B is down: abort the fabric.
 *
 * Answers are received with any tag and matched on the sequence number they
 * carry, so an answer that comes after its ping was given up on is drained
 * and dropped rather than left unmatched in the endpoint for ever. A
 * receive for answers is posted only while a ping is out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"
#include "dsim/health.h"
#include "dsim/log.h"

#define HEALTH_MSG_WORDS 2 /* sequence number, sender's worker */

/* Pinging one peer (made for every peer once the check is ready). The
 * peer's worker and rank follow from its index (health_peer_worker). */
typedef struct health_peer {
    int gone;     /* its link broke (its process ended or closed): not pinged */
    int waiting;  /* a ping is out */
    int attempts; /* pings in a row that went unanswered */
    uint32_t seq;
    int64_t sent; /* when the ping out (or the last one) left */
    int64_t next_ping, deadline;
    dsim_req *ping_sq;
    uint32_t ping_out[HEALTH_MSG_WORDS];
    dsim_req *pong_rq;
    uint32_t pong_in[HEALTH_MSG_WORDS];
} health_peer;

/* Answering one peer (made at the first ping that arrives): the answer's
 * send and its buffer, which must stay put until the send is done. */
typedef struct health_answer {
    dsim_req *sq;
    uint32_t out[HEALTH_MSG_WORDS];
} health_answer;

struct dsim_health {
    dsim_health_cfg cfg;
    dsim_rt *rt;
    dsim_waitq *q; /* guards stop, poked and st */
    int stop, poked;
    dsim_health_stats st;   /* what get_stats sees: `mine` as of the last wake-up */
    dsim_health_stats mine; /* the check's own, touched only by its worker */
    dsim_task *task;
    health_peer *peers;     /* [npeers] once pinging, else NULL */
    health_answer *answers; /* [npeers] once pinged, else NULL */
    int npeers;
    int retries;
    int64_t tick;
    /* the peers retried in this wake-up, told in one warning after it */
    int n_retried, retried_one;
    char retried[160];
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

/* The bound, derived from the code above, in step.c and in the training
 * driver (src/strategy/job.c, watchdog.c).
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
 *  - It pings again an interval after that answered ping left, or at once
 *    if the answer took longer: by S + I. That ping and each retry wait T
 *    and are retried at once; the R-th unanswered one (R = max(retries, 1))
 *    is declared by S + I + R T, and dsim_ep_abort wakes every waiter of every
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
    for (int i = 0; h->peers && i < h->npeers; i++) {
        health_peer *p = &h->peers[i];
        health_reap(&p->ping_sq);
        health_reap(&p->pong_rq);
    }
    for (int i = 0; h->answers && i < h->npeers; i++)
        health_reap(&h->answers[i].sq);
}

/* Peer index i (0 .. npeers - 1) is worker i, or i + 1 from this worker on. */
static int health_peer_worker(const dsim_health *h, int i)
{
    return i < h->cfg.worker ? i : i + 1;
}

static int health_peer_rank(const dsim_health *h, int i)
{
    return health_peer_worker(h, i) * h->cfg.ranks_per_worker;
}

/* The peer index of the check at rank src, or -1 when src is no worker's
 * check (not a worker's first rank, or this worker itself). */
static int health_peer_of_rank(const dsim_health *h, int src)
{
    int rpw = h->cfg.ranks_per_worker;
    if (src < 0 || src % rpw != 0 || src / rpw >= h->cfg.num_workers || src / rpw == h->cfg.worker)
        return -1;
    int w = src / rpw;
    return w < h->cfg.worker ? w : w - 1;
}

/* Out of memory for per-peer state: a check that cannot ping or answer
 * would let a lost peer go unseen, so it fails the job in a way that says
 * so. */
static int health_no_memory(dsim_health *h, const char *what)
{
    char why[256];
    snprintf(why, sizeof why,
             "health check of worker %d: out of memory for %s %d peers; the job cannot be "
             "checked: give it more memory or turn the check off (health_check: {interval: 0})",
             h->cfg.worker, what, h->npeers);
    dsim_error_log("%s", why);
    dsim_ep_abort(h->cfg.ep, -1, why);
    return HEALTH_IDLE;
}

/* Answers every ping that has arrived, from whichever peer. HEALTH_IDLE when
 * the fabric is gone (aborted): there is nothing left to check. */
static int health_answer_all(dsim_health *h, uint64_t *answered)
{
    dsim_ep *ep = h->cfg.ep;
    int src;
    while (dsim_probe_any(ep, DSIM_HEALTH_COMM_PING, &src)) {
        uint32_t in[HEALTH_MSG_WORDS];
        dsim_req *rq = NULL;
        size_t len = 0;
        dsim_err e = dsim_irecv(ep, src, DSIM_HEALTH_COMM_PING, DSIM_ANY_TAG, in, sizeof in, &rq);
        if (e != DSIM_OK)
            return HEALTH_IDLE;
        if (!dsim_req_done(rq)) {
            /* Only this check receives on PING, so the message the probe
             * saw is there; should it not be, look again at the next wake. */
            dsim_req_cancel(rq);
            return HEALTH_GO;
        }
        e = dsim_wait(rq, DSIM_NO_DEADLINE, &len);
        if (e == DSIM_EABORTED)
            return HEALTH_IDLE;
        /* A damaged ping, a gap in the stream (a lost message) or a message
         * from a rank that is no worker's check is not an answer to give:
         * it is drained and the next one looked at. */
        int i = health_peer_of_rank(h, src);
        if (e != DSIM_OK || len != sizeof in || i < 0)
            continue;
        if (!h->answers && !(h->answers = calloc((size_t)h->npeers, sizeof *h->answers)))
            return health_no_memory(h, "answering");
        health_answer *a = &h->answers[i];
        health_reap(&a->sq);
        a->out[0] = in[0];
        a->out[1] = (uint32_t)h->cfg.worker;
        e = dsim_isend(ep, src, DSIM_HEALTH_COMM_PONG, in[0] & 0x7fffffffu, a->out, sizeof a->out,
                       &a->sq);
        if (e != DSIM_OK) {
            a->sq = NULL;
            if (e == DSIM_EABORTED)
                return HEALTH_IDLE;
        } else {
            (*answered)++;
            /* Sent already (inproc copies small messages): freed now, not
             * at this peer's next ping, so finished sends do not pile up
             * one per peer. */
            if (dsim_req_done(a->sq))
                health_reap(&a->sq);
        }
    }
    return HEALTH_GO;
}

/* The link to or from peer i broke for good (its process ended, closed its
 * connections, or they failed): nothing more can be asked of it, and a
 * collective that needs it fails on the same break, so it is not pinged
 * again (nor reported down: a worker that finished closes its links while
 * the others end their last step). The others are checked on. */
static int health_gone(dsim_health *h, int i, dsim_err e)
{
    health_peer *p = &h->peers[i];
    p->gone = 1;
    p->waiting = 0;
    health_reap(&p->ping_sq);
    health_reap(&p->pong_rq);
    dsim_debug("health check of worker %d: the link with peer %d (worker %d) is gone (%s); it is "
               "not pinged again",
               h->cfg.worker, health_peer_rank(h, i), health_peer_worker(h, i), dsim_strerror(e));
    return HEALTH_GO;
}

static int health_send_ping(dsim_health *h, int i, int64_t now)
{
    dsim_ep *ep = h->cfg.ep;
    health_peer *p = &h->peers[i];
    int rank = health_peer_rank(h, i);
    health_reap(&p->ping_sq);
    p->seq++;
    p->ping_out[0] = p->seq;
    p->ping_out[1] = (uint32_t)h->cfg.worker;
    p->waiting = 1;
    p->sent = now;
    p->deadline = health_add(now, h->cfg.timeout_ns);
    dsim_err e = dsim_isend(ep, rank, DSIM_HEALTH_COMM_PING, p->seq & 0x7fffffffu, p->ping_out,
                            sizeof p->ping_out, &p->ping_sq);
    if (e != DSIM_OK) {
        p->ping_sq = NULL;
        if (e == DSIM_EABORTED)
            return HEALTH_IDLE;
        return health_gone(h, i, e);
    }
    if (dsim_req_done(p->ping_sq))
        health_reap(&p->ping_sq); /* as an answer's send */
    h->mine.pings_sent++;
    if (!p->pong_rq) {
        e = dsim_irecv(ep, rank, DSIM_HEALTH_COMM_PONG, DSIM_ANY_TAG, p->pong_in, sizeof p->pong_in,
                       &p->pong_rq);
        if (e != DSIM_OK) {
            p->pong_rq = NULL;
            return HEALTH_IDLE;
        }
    }
    return HEALTH_GO;
}

static void health_down(dsim_health *h, int i, int64_t now)
{
    int rank = health_peer_rank(h, i), worker = health_peer_worker(h, i);
    char tmo[32], why[256];
    health_dur(h->cfg.timeout_ns, tmo, sizeof tmo);
    int rpw = h->cfg.ranks_per_worker;
    snprintf(why, sizeof why,
             "cluster check alive failed, peer %d is down: it did not answer %d health check%s of "
             "%s (worker %d, ranks %d..%d; checked by worker %d)",
             rank, h->retries, h->retries == 1 ? "" : "s", tmo, worker, rank, rank + rpw - 1,
             h->cfg.worker);
    dsim_error_log("%s; aborting collectives", why);
    h->mine.down_worker = worker;
    h->mine.down_at = now;
    dsim_ep_abort(h->cfg.ep, rank, why);
}

/* Collects p's answer, retries or gives up on p. */
static int health_ping(dsim_health *h, int i, int64_t now)
{
    dsim_ep *ep = h->cfg.ep;
    health_peer *p = &h->peers[i];
    if (p->gone)
        return HEALTH_GO;
    if (!p->waiting) {
        if (now >= p->next_ping)
            return health_send_ping(h, i, now);
        return HEALTH_GO;
    }
    /* A receive from a peer whose link broke fails as soon as it is posted:
     * that ends here rather than looping for ever (and never seeing the
     * stop). Anything else that fails at once is a damaged or stale answer,
     * a few of which are drained per wake. */
    for (int drained = 0; p->pong_rq && dsim_req_done(p->pong_rq); drained++) {
        size_t len = 0;
        dsim_err e = dsim_wait(p->pong_rq, DSIM_NO_DEADLINE, &len);
        p->pong_rq = NULL;
        if (e == DSIM_EABORTED)
            return HEALTH_IDLE;
        if (e == DSIM_EPEER || e == DSIM_EIO || (e != DSIM_OK && drained >= 64))
            return health_gone(h, i, e);
        if (e == DSIM_OK && len == sizeof p->pong_in && p->pong_in[0] == p->seq) {
            p->waiting = 0;
            p->attempts = 0;
            /* a ping every interval, from when the answered one left (at
             * once if its answer took longer): peers pinged in one wake-up
             * stay in step, so their deadlines pass in the same wake-up
             * whenever their answers came */
            p->next_ping = health_add(p->sent, h->cfg.interval_ns);
            if (p->next_ping < now)
                p->next_ping = now;
            h->mine.answers_received++;
            health_reap(&p->ping_sq);
            return HEALTH_GO;
        }
        /* An answer to an earlier ping, or a gap: keep listening. */
        e = dsim_irecv(ep, health_peer_rank(h, i), DSIM_HEALTH_COMM_PONG, DSIM_ANY_TAG, p->pong_in,
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
        health_down(h, i, now);
        return HEALTH_IDLE;
    }
    h->mine.retries++;
    /* told once a wake-up: with hundreds of workers on a few CPUs many
     * peers answer late at once */
    size_t at = strlen(h->retried);
    if (h->n_retried++ < 4 && at < sizeof h->retried)
        snprintf(h->retried + at, sizeof h->retried - at, "%speer %d (worker %d) %d/%d",
                 at ? ", " : "", health_peer_rank(h, i), health_peer_worker(h, i), p->attempts,
                 h->retries);
    if (h->n_retried == 1)
        h->retried_one = i;
    return health_send_ping(h, i, now);
}

static void health_main(void *arg)
{
    dsim_health *h = arg;
    int dead = 0, ready = 0, idle = 0;
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
                if ((h->peers = calloc((size_t)(h->npeers ? h->npeers : 1), sizeof *h->peers))) {
                    ready = 1;
                    for (int i = 0; i < h->npeers; i++)
                        h->peers[i].next_ping = now;
                } else {
                    idle = health_no_memory(h, "pinging") == HEALTH_IDLE;
                }
            }
            if (!idle)
                idle = health_answer_all(h, &h->mine.pings_answered) == HEALTH_IDLE;
            h->n_retried = 0;
            h->retried[0] = '\0';
            for (int i = 0; ready && i < h->npeers && !idle; i++)
                idle = health_ping(h, i, now) == HEALTH_IDLE;
            if (h->n_retried == 1) {
                const health_peer *q = &h->peers[h->retried_one];
                dsim_warn("health check of worker %d: peer %d (worker %d) seems down, retrying "
                          "%d/%d",
                          h->cfg.worker, health_peer_rank(h, h->retried_one),
                          health_peer_worker(h, h->retried_one), q->attempts, h->retries);
            } else if (h->n_retried > 1) {
                dsim_warn("health check of worker %d: %d peers seem down, retrying: %s%s",
                          h->cfg.worker, h->n_retried, h->retried, h->n_retried > 4 ? ", ..." : "");
            }
            if (idle) {
                health_cancel_all(h);
            } else {
                wake = health_add(now, h->tick);
                for (int i = 0; ready && i < h->npeers; i++) {
                    const health_peer *p = &h->peers[i];
                    if (p->gone)
                        continue;
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
    dsim_err e = DSIM_OK;
    if (e == DSIM_OK)
        e = dsim_waitq_create(h->rt, &h->q);
    if (e == DSIM_OK)
        e = dsim_rt_spawn(h->rt, cfg->task_id, health_main, h, &h->task);
    if (e != DSIM_OK) {
        if (h->q)
            dsim_waitq_destroy(h->q);
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
    free(h->answers);
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
