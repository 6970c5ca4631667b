/* Requests: allocation (a per-thread cache), waiting with a deadline,
 * polling, cancelling and withdrawing, dsim_waitall, completion by a
 * backend (dsim_tp_complete), and closing an endpoint with requests live. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fiu_int.h"
#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "tp_int.h"

static dsim_err tp_aborted_err(dsim_fabric *f, const dsim_req *r, const char *doing)
{
    char tag[16];
    tp_tag_str(r->tag, tag, sizeof tag);
    int blame = f->abort_peer >= 0 ? f->abort_peer : r->peer;
    if (r->kind == TP_REQ_SEND)
        return DSIM_ERR(DSIM_EABORTED, blame,
                        "transport aborted (failed rank %d: %s) while %s a message to rank %d "
                        "(comm %" PRIu32 ", tag %s)",
                        f->abort_peer, f->abort_why, doing, r->peer, r->comm_id, tag);
    return DSIM_ERR(DSIM_EABORTED, blame,
                    "transport aborted (failed rank %d: %s) while %s a message from rank %d "
                    "(comm %" PRIu32 ", tag %s)",
                    f->abort_peer, f->abort_why, doing, r->peer, r->comm_id, tag);
}

/* Requests freed on a thread, kept for the next ones it starts: a
 * collective starts and frees a request per transfer, and under the sim
 * engine tens of thousands of workers share one thread, whose allocator
 * would otherwise take most of them back into its general bins. A handful
 * per thread, all of one size (one backend's); a thread's are freed when it
 * ends. */
#define TP_REQ_CACHE 64
static _Thread_local struct {
    dsim_req *head;
    int n;
    int keyed; /* 1: the destructor that empties it is registered; -1: it cannot be */
} tp_cache;
static pthread_key_t tp_cache_key;
static pthread_once_t tp_cache_once = PTHREAD_ONCE_INIT;

static void tp_cache_drain(void *unused)
{
    (void)unused;
    while (tp_cache.head) {
        dsim_req *r = tp_cache.head;
        tp_cache.head = r->cnext;
        free(r);
    }
    tp_cache.n = 0;
}

static void tp_cache_key_make(void)
{
    if (pthread_key_create(&tp_cache_key, tp_cache_drain) != 0)
        tp_cache_key = (pthread_key_t)-1;
}

dsim_req *tp_req_new(dsim_ep *ep, int kind, int peer, uint32_t comm_id, uint32_t tag)
{
    size_t psz = ep->f->ops->req_priv_size;
    size_t sz = tp_align(sizeof(dsim_req)) + psz;
    dsim_req *r = tp_cache.head;
    if (r && r->alloc_size == sz) {
        tp_cache.head = r->cnext;
        tp_cache.n--;
        memset(r, 0, sz);
    } else {
        r = calloc(1, sz);
    }
    if (!r) {
        DSIM_ERR(DSIM_ENOMEM, peer, "out of memory starting a transfer with rank %d", peer);
        return NULL;
    }
    r->ep = ep;
    r->kind = kind;
    r->peer = peer;
    r->comm_id = comm_id;
    r->tag = tag;
    r->errpeer = peer;
    r->live.next = r->live.prev = &r->live;
    r->qlink.next = r->qlink.prev = &r->qlink;
    atomic_init(&r->done, 0);
    r->priv = psz ? (char *)r + tp_align(sizeof *r) : NULL;
    r->alloc_size = sz;
    return r;
}

void tp_req_free(dsim_req *r)
{
    free(r->errmsg);
    r->errmsg = NULL;
    if (tp_cache.n < TP_REQ_CACHE &&
        (!tp_cache.head || tp_cache.head->alloc_size == r->alloc_size)) {
        if (tp_cache.keyed == 0) {
            pthread_once(&tp_cache_once, tp_cache_key_make);
            tp_cache.keyed = tp_cache_key != (pthread_key_t)-1 &&
                                     pthread_setspecific(tp_cache_key, &tp_cache) == 0
                                 ? 1
                                 : -1;
        }
        if (tp_cache.keyed < 0) { /* no way to empty it at the thread's end: no cache */
            free(r);
            return;
        }
        r->cnext = tp_cache.head;
        tp_cache.head = r;
        tp_cache.n++;
        return;
    }
    free(r);
}

/* Withdraws an unfinished request so nothing touches it or its buffer
 * again, or waits until whoever claimed it finishes. Called and returns
 * with ep->lock held. Returns 1 if withdrawn, 0 if it finished. */
static int tp_withdraw_locked(dsim_req *req)
{
    dsim_ep *ep = req->ep;
    if (atomic_load_explicit(&req->done, memory_order_acquire))
        return 0;
    if (req->kind != TP_REQ_SEND) {
        if (req->queued) {
            tp_list_del(&req->qlink);
            req->queued = 0;
            return 1;
        }
    } else if (req->queue_ep) {
        dsim_ep *q = req->queue_ep;
        int withdrawn = 0;
        dsim_waitq_unlock(ep->lock);
        dsim_waitq_lock(q->lock);
        if (req->queued) {
            tp_unexp_del(&req->m);
            req->queued = 0;
            withdrawn = 1;
        }
        dsim_waitq_unlock(q->lock);
        dsim_waitq_lock(ep->lock);
        if (withdrawn)
            return 1;
    } else {
        dsim_waitq_unlock(ep->lock);
        dsim_err e = ep->f->ops->cancel_send(ep, req);
        dsim_waitq_lock(ep->lock);
        if (e == DSIM_OK)
            return 1;
    }
    /* Claimed: a copy into or out of req's buffer is running; it is short
     * and always finishes, so wait with no deadline. */
    while (!atomic_load_explicit(&req->done, memory_order_acquire))
        dsim_waitq_wait(ep->lock, DSIM_NO_DEADLINE);
    return 0;
}

enum { TP_WAIT_DONE, TP_WAIT_TIMEDOUT, TP_WAIT_ABORTED };

/* Lets the backend move frames from this thread for a while before it
 * sleeps (ep->lock held on entry and on return): 1 if req finished. */
static int tp_assist_locked(dsim_ep *ep, dsim_req *req, int64_t deadline)
{
    dsim_waitq_unlock(ep->lock);
    ep->f->ops->wait_assist(ep, req, deadline);
    dsim_waitq_lock(ep->lock);
    return atomic_load_explicit(&req->done, memory_order_acquire);
}

/* Waits for req until deadline or abort; ep->lock held. */
static int tp_wait_locked(dsim_req *req, int64_t deadline, int64_t *started)
{
    dsim_ep *ep = req->ep;
    dsim_rt_hint(DSIM_RT_HINT_REQ, req); /* what this worker touches when it wakes */
    dsim_rt_hint(DSIM_RT_HINT_EP, ep);
    dsim_rt_hint(DSIM_RT_HINT_EP_LOCK, ep->lock);
    int assisted = 0;
    while (!atomic_load_explicit(&req->done, memory_order_acquire)) {
        if (tp_aborted(ep->f))
            return TP_WAIT_ABORTED;
        if (*started < 0)
            *started = dsim_rt_now(ep->f->rt);
        if (!assisted && ep->f->ops->wait_assist) {
            assisted = !tp_assist_locked(ep, req, deadline);
            continue;
        }
        if (dsim_waitq_wait(ep->lock, deadline) == DSIM_ETIMEDOUT &&
            !atomic_load_explicit(&req->done, memory_order_acquire))
            return TP_WAIT_TIMEDOUT;
    }
    return TP_WAIT_DONE;
}

/* Finishes req after a wait: withdraws it if unfinished, unlinks it, sets
 * the error context, frees it. ep->lock held on entry, released on return. */
static dsim_err tp_req_settle_side_locked(dsim_req *req, int how, int64_t started, size_t *len,
                                          void *side, int *has_side, int quiet)
{
    dsim_ep *ep = req->ep;
    dsim_fabric *f = ep->f;
    if (how != TP_WAIT_DONE && !tp_withdraw_locked(req))
        how = TP_WAIT_DONE; /* it finished while being withdrawn */
    /* Whoever finished req wrote its sideband before done (under ep->lock). */
    if (how == TP_WAIT_DONE && req->kind != TP_REQ_SEND && req->has_side) {
        if (has_side)
            *has_side = 1;
        if (side)
            memcpy(side, req->side, DSIM_TP_SIDE_LEN);
    }
    tp_list_del(&req->live);
    int64_t now = how == TP_WAIT_TIMEDOUT ? dsim_rt_now(f->rt) : 0;
    dsim_waitq_unlock(ep->lock);

    dsim_err st;
    /* Formatted only where a message needs it: this runs for every request. */
    char tag[16] = "";
    if ((how != TP_WAIT_DONE && !(quiet && how == TP_WAIT_TIMEDOUT)) ||
        (how == TP_WAIT_DONE && req->status != DSIM_OK) || dsim_log_enabled(DSIM_LOG_TRACE))
        tp_tag_str(req->tag, tag, sizeof tag);
    if (how == TP_WAIT_TIMEDOUT && quiet) {
        st = DSIM_ETIMEDOUT; /* a poll that found nothing yet: no message */
    } else if (how == TP_WAIT_DONE) {
        st = req->status;
        if (st == DSIM_OK) {
            if (len)
                *len = req->len;
        } else if (req->errmsg) {
            DSIM_ERR(st, req->errpeer, "%s", req->errmsg);
        } else {
            DSIM_ERR(st, req->peer, "%s with rank %d failed (comm %" PRIu32 ", tag %s): %s",
                     req->kind == TP_REQ_SEND ? "a send" : "a receive", req->peer, req->comm_id,
                     tag, dsim_strerror(st));
        }
    } else if (how == TP_WAIT_TIMEDOUT) {
        long long ms = started >= 0 ? (long long)((now - started) / 1000000) : 0;
        if (req->kind == TP_REQ_SEND)
            st = DSIM_ERR(DSIM_ETIMEDOUT, req->peer,
                          "timed out after %lld ms waiting for rank %d to receive a %zu-byte "
                          "message (comm %" PRIu32 ", tag %s)",
                          ms, req->peer, req->slen, req->comm_id, tag);
        else
            st = DSIM_ERR(DSIM_ETIMEDOUT, req->peer,
                          "timed out after %lld ms waiting for a message from rank %d "
                          "(comm %" PRIu32 ", tag %s)",
                          ms, req->peer, req->comm_id, tag);
    } else {
        st = tp_aborted_err(f, req, req->kind == TP_REQ_SEND ? "sending" : "waiting for");
    }
    dsim_trace("tp: rank %d %s rank %d comm %" PRIu32 " tag %s: %s", ep->rank,
               req->kind == TP_REQ_SEND ? "send to" : "recv from", req->peer, req->comm_id, tag,
               dsim_strerror(st));
    tp_req_free(req);
    return st;
}

static dsim_err tp_req_settle_locked(dsim_req *req, int how, int64_t started, size_t *len)
{
    return tp_req_settle_side_locked(req, how, started, len, NULL, NULL, 0);
}

dsim_err dsim_wait(dsim_req *req, int64_t deadline, size_t *len)
{
    if (!req)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_wait: req is NULL");
    int64_t started = -1;
    dsim_waitq_lock(req->ep->lock);
    int how = tp_wait_locked(req, deadline, &started);
    return tp_req_settle_locked(req, how, started, len);
}

/* dsim_wait_side and dsim_wait_flags; `who` names the call in its error. */
static dsim_err tp_wait_side(const char *who, dsim_req *req, int64_t deadline, unsigned flags,
                             size_t *len, void *side, int *has_side)
{
    if (has_side)
        *has_side = 0;
    if (!req)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: req is NULL", who);
    int64_t started = -1;
    dsim_waitq_lock(req->ep->lock);
    int how = tp_wait_locked(req, deadline, &started);
    return tp_req_settle_side_locked(req, how, started, len, side, has_side,
                                     (flags & DSIM_WAIT_QUIET) != 0);
}

dsim_err dsim_wait_side(dsim_req *req, int64_t deadline, size_t *len, void *side, int *has_side)
{
    return tp_wait_side("dsim_wait_side", req, deadline, 0, len, side, has_side);
}

dsim_err dsim_wait_flags(dsim_req *req, int64_t deadline, unsigned flags, size_t *len, void *side,
                         int *has_side)
{
    return tp_wait_side("dsim_wait_flags", req, deadline, flags, len, side, has_side);
}

dsim_err dsim_poll(dsim_req *req, size_t *len)
{
    if (!req)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_poll: req is NULL");
    return dsim_wait_flags(req, 0, DSIM_WAIT_QUIET, len, NULL, NULL);
}

void dsim_req_cancel(dsim_req *req)
{
    if (!req)
        return;
    dsim_ep *ep = req->ep;
    dsim_waitq_lock(ep->lock);
    tp_withdraw_locked(req);
    tp_list_del(&req->live);
    dsim_waitq_unlock(ep->lock);
    tp_req_free(req);
}

static int tp_req_failed(const dsim_req *r)
{
    return atomic_load_explicit(&r->done, memory_order_acquire) && r->status != DSIM_OK;
}

dsim_err dsim_waitall(dsim_req **reqs, int n, int64_t deadline, int *failed)
{
    if (failed)
        *failed = -1;
    if (n < 0 || (n > 0 && !reqs))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_waitall: %d requests at %p", n, (void *)reqs);
    dsim_ep *ep = NULL;
    int same = 1;
    for (int i = 0; i < n; i++) {
        if (!reqs[i])
            continue;
        if (!ep)
            ep = reqs[i]->ep;
        else if (reqs[i]->ep != ep)
            same = 0;
    }
    if (!ep)
        return DSIM_OK;
    int bad = -1;
    int64_t started = -1;
    if (same) {
        /* Watch all at once so the failure reported is the first to happen,
         * not the first in index order: of those found failed at one look
         * (a waiter woken late finds several), the one that failed first. */
        int assisted = !ep->f->ops->wait_assist;
        dsim_waitq_lock(ep->lock);
        for (;;) {
            int pending = -1;
            for (int i = 0; i < n; i++) {
                if (!reqs[i])
                    continue;
                if (tp_req_failed(reqs[i])) {
                    /* fail_seq: the order failures happened (match.c) */
                    if (bad < 0 || reqs[i]->fail_seq < reqs[bad]->fail_seq)
                        bad = i;
                } else if (pending < 0 &&
                           !atomic_load_explicit(&reqs[i]->done, memory_order_acquire))
                    pending = i;
            }
            if (bad >= 0 || pending < 0 || tp_aborted(ep->f))
                break;
            if (started < 0)
                started = dsim_rt_now(ep->f->rt);
            if (!assisted) {
                /* while each pending request finishes within the backend's
                 * budget, the next is waited for the same way */
                assisted = !tp_assist_locked(ep, reqs[pending], deadline);
                continue;
            }
            if (dsim_waitq_wait(ep->lock, deadline) == DSIM_ETIMEDOUT)
                break;
        }
        dsim_waitq_unlock(ep->lock);
    }
    dsim_err first = DSIM_OK;
    if (bad >= 0) {
        dsim_req *r = reqs[bad];
        reqs[bad] = NULL;
        dsim_waitq_lock(r->ep->lock);
        first = tp_req_settle_locked(r, TP_WAIT_DONE, -1, NULL);
    }
    for (int i = 0; i < n; i++) {
        dsim_req *r = reqs[i];
        if (!r)
            continue;
        reqs[i] = NULL;
        if (first != DSIM_OK) {
            dsim_req_cancel(r);
            continue;
        }
        int64_t s = started;
        dsim_waitq_lock(r->ep->lock);
        int how = tp_wait_locked(r, deadline, &s);
        first = tp_req_settle_locked(r, how, s, NULL);
        if (first != DSIM_OK)
            bad = i;
    }
    if (failed && first != DSIM_OK)
        *failed = bad;
    return first;
}

int dsim_req_done(const dsim_req *req)
{
    if (!req)
        return 1;
    /* After an abort every wait returns at once, so report "finished" to
     * keep polling loops from spinning forever. */
    return atomic_load_explicit(&req->done, memory_order_acquire) || tp_aborted(req->ep->f);
}

int dsim_req_peer(const dsim_req *req)
{
    return req ? req->peer : -1;
}

void dsim_ep_close(dsim_ep *ep)
{
    if (!ep)
        return;
    dsim_waitq_lock(ep->lock);
    if (ep->state != TP_EP_OPEN) {
        dsim_waitq_unlock(ep->lock);
        return;
    }
    ep->state = TP_EP_CLOSED;
    for (;;) {
        if (tp_list_empty(&ep->live))
            break;
        dsim_req *r = TP_CONTAINER(ep->live.head.next, dsim_req, live);
        tp_withdraw_locked(r);
        tp_list_del(&r->live);
        tp_req_free(r);
    }
    dsim_waitq_unlock(ep->lock);
    tp_drain_unexpected(ep);
    ep->f->ops->ep_close(ep);
}

void dsim_tp_complete(dsim_req *req, dsim_err status)
{
    if (!req)
        return;
    if (status != DSIM_OK) {
        const dsim_error *le = dsim_last_error();
        if (le->code == status && le->msg[0])
            tp_req_failf(req, le->peer, "%s", le->msg);
    }
    tp_req_finish(req, status, req->slen);
}
