/* Fabrics and endpoints: the accessors backends use, creating, opening and
 * closing endpoints, closing a fabric, abort (revoke), epochs and counters.
 * The transport layer's files:
 *   registry.c   the backends by name; dsim_fabric_open chooses one
 *   transport.c  fabric and endpoint lifecycle, abort, epochs, counters
 *   post.c       starting sends (headers, sequence numbers) and receives
 *   request.c    requests: waiting with deadlines, cancelling, completing
 *   match.c      the receive path: header checks, sequences, matching
 *   options.c    the backends' "key=value,..." option strings
 * Backends see only the ops table in dsim/spi/transport.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fiu_int.h"
#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "tp_int.h"

void *dsim_tp_fabric_priv(dsim_fabric *f)
{
    return f->priv;
}

void *dsim_tp_ep_priv(dsim_ep *ep)
{
    return ep->priv;
}

void *dsim_tp_req_priv(dsim_req *req)
{
    return req->priv;
}

dsim_rt *dsim_tp_fabric_rt(dsim_fabric *f)
{
    return f->rt;
}

dsim_fabric *dsim_tp_ep_fabric(dsim_ep *ep)
{
    return ep->f;
}

int dsim_fabric_nranks(const dsim_fabric *f)
{
    return f ? f->nranks : 0;
}

const char *dsim_fabric_backend(const dsim_fabric *f)
{
    return f ? f->ops->name : NULL;
}

int dsim_fabric_aborted(const dsim_fabric *f)
{
    return f ? tp_aborted(f) : 0;
}

int dsim_ep_rank(const dsim_ep *ep)
{
    return ep ? ep->rank : -1;
}

dsim_rt *dsim_ep_rt(const dsim_ep *ep)
{
    return ep ? ep->f->rt : NULL;
}

static void tp_ep_free(dsim_ep *ep)
{
    if (!ep)
        return;
    tp_map_free(&ep->recv_seq);
    tp_map_free(&ep->recv_epoch);
    tp_map_free(&ep->send_seq);
    tp_map_free(&ep->send_epoch);
    tp_lost_free(ep);
    if (ep->lock)
        dsim_waitq_destroy(ep->lock);
    if (ep->slock)
        dsim_waitq_destroy(ep->slock);
    free(ep->buckets);
    free(ep);
}

static dsim_ep *tp_ep_new(dsim_fabric *f, int rank)
{
    size_t psz = f->ops->ep_priv_size;
    dsim_ep *ep = calloc(1, tp_align(sizeof *ep) + psz);
    if (!ep)
        goto oom;
    ep->f = f;
    ep->rank = rank;
    ep->state = TP_EP_NEW;
    ep->priv = psz ? (char *)ep + tp_align(sizeof *ep) : NULL;
    tp_list_init(&ep->live);
    tp_map_init(&ep->recv_seq);
    tp_map_init(&ep->recv_epoch);
    tp_map_init(&ep->send_seq);
    tp_map_init(&ep->send_epoch);
    tp_list_init(&ep->arrivals);
    ep->buckets = calloc((size_t)f->bucket_mask + 1, sizeof *ep->buckets);
    if (!ep->buckets)
        goto oom;
    for (unsigned b = 0; b <= f->bucket_mask; b++) {
        tp_list_init(&ep->buckets[b].posted);
        tp_list_init(&ep->buckets[b].unexpected);
    }
    if (dsim_waitq_create(f->rt, &ep->lock) != DSIM_OK ||
        dsim_waitq_create(f->rt, &ep->slock) != DSIM_OK) {
        tp_ep_free(ep);
        return NULL;
    }
    return ep;
oom:
    tp_ep_free(ep);
    DSIM_ERR(DSIM_ENOMEM, rank, "out of memory creating rank %d's endpoint", rank);
    return NULL;
}

dsim_ep *dsim_tp_fabric_ep(dsim_fabric *f, int rank)
{
    if (!f || rank < 0 || rank >= f->nranks) {
        DSIM_ERR(DSIM_EINVAL, -1, "rank %d is out of range: the fabric has %d ranks", rank,
                 f ? f->nranks : 0);
        return NULL;
    }
    dsim_ep *ep = atomic_load_explicit(&f->eps[rank], memory_order_acquire);
    if (ep)
        return ep;
    dsim_ep *n = tp_ep_new(f, rank);
    if (!n)
        return NULL;
    if (atomic_compare_exchange_strong_explicit(&f->eps[rank], &ep, n, memory_order_acq_rel,
                                                memory_order_acquire))
        return n;
    tp_ep_free(n); /* another thread created it first */
    return ep;
}

void dsim_fabric_close(dsim_fabric *f)
{
    if (!f)
        return;
    /* An abort from another thread (the fault layer's restart timer, a
     * backend's) may be under way: it calls into the backend, which must
     * still be open. Later ones see closing and do nothing. */
    atomic_store(&f->closing, 1);
    while (atomic_load(&f->abort_busy) > 0)
        (void)dsim_rt_sleep_until(f->rt, dsim_rt_deadline(f->rt, 100000));
    for (int r = 0; r < f->nranks; r++) {
        dsim_ep *ep = atomic_load_explicit(&f->eps[r], memory_order_acquire);
        if (!ep)
            continue;
        dsim_waitq_lock(ep->lock);
        int open = ep->state == TP_EP_OPEN;
        dsim_waitq_unlock(ep->lock);
        if (open) {
            dsim_warn("dsim_fabric_close: rank %d's endpoint was still open; closing it", r);
            dsim_ep_close(ep);
        }
    }
    /* Endpoints never opened may hold messages sent to them. */
    for (int r = 0; r < f->nranks; r++) {
        dsim_ep *ep = atomic_load_explicit(&f->eps[r], memory_order_acquire);
        if (ep) {
            dsim_waitq_lock(ep->lock);
            ep->state = TP_EP_CLOSED;
            dsim_waitq_unlock(ep->lock);
            tp_drain_unexpected(ep);
        }
    }
    f->ops->fabric_close(f);
    /* The filter last: the backend's threads (tcp) hand frames to it until
     * they stop; its held frames go to closed endpoints, which refuse them. */
    if (f->filter && f->filter->detach)
        f->filter->detach(f->filter_user, f);
    for (int r = 0; r < f->nranks; r++)
        tp_ep_free(atomic_load_explicit(&f->eps[r], memory_order_acquire));
    tp_msg_spares_free(f);
    free(f->eps);
    free(f);
}

dsim_err dsim_ep_open(dsim_fabric *f, int rank, dsim_ep **out)
{
    if (out)
        *out = NULL;
    if (!f || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_ep_open: fabric and out must not be NULL");
    if (rank < 0 || rank >= f->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_ep_open: rank %d is out of range: the fabric has %d ranks "
                        "(0..%d)",
                        rank, f->nranks, f->nranks - 1);
    if (tp_aborted(f))
        return tp_aborted_now(f, "opening the endpoint of", rank);
    dsim_ep *ep = dsim_tp_fabric_ep(f, rank);
    if (!ep)
        return dsim_last_error()->code;
    dsim_waitq_lock(ep->lock);
    int state = ep->state;
    if (state == TP_EP_NEW)
        ep->state = TP_EP_OPEN;
    dsim_waitq_unlock(ep->lock);
    if (state != TP_EP_NEW)
        return DSIM_ERR(DSIM_ESTATE, -1,
                        "dsim_ep_open: rank %d's endpoint %s; each rank opens its endpoint "
                        "once per fabric",
                        rank, state == TP_EP_OPEN ? "is already open" : "was closed");
    dsim_err e = f->ops->ep_open(ep);
    if (e != DSIM_OK) {
        dsim_waitq_lock(ep->lock);
        ep->state = TP_EP_NEW;
        dsim_waitq_unlock(ep->lock);
        return e;
    }
    *out = ep;
    return DSIM_OK;
}

/* ---- abort, epochs, counters ---- */

static void tp_fabric_abort(dsim_fabric *f, int failed_peer, const char *why);

void dsim_fabric_abort(dsim_fabric *f, int failed_peer, const char *why)
{
    if (!f)
        return;
    atomic_fetch_add(&f->abort_busy, 1);
    if (!atomic_load(&f->closing))
        tp_fabric_abort(f, failed_peer, why);
    atomic_fetch_sub(&f->abort_busy, 1);
}

static void tp_fabric_abort(dsim_fabric *f, int failed_peer, const char *why)
{
    if (atomic_flag_test_and_set(&f->abort_claimed)) {
        /* The first abort's peer and reason stand. Do not return before it
         * has revoked the fabric: from here on every operation of this
         * caller must fail. The claimer neither blocks nor yields between
         * its claim and its store, so this wait is short. */
        while (!tp_aborted(f))
            ;
        return;
    }
    f->abort_peer = failed_peer;
    snprintf(f->abort_why, sizeof f->abort_why, "%s", why && *why ? why : "no reason given");
    atomic_store_explicit(&f->aborted, 1, memory_order_release);
    /* Wake under each lock so no waiter can miss it between its check and
     * its sleep. */
    for (int r = 0; r < f->nranks; r++) {
        dsim_ep *ep = atomic_load_explicit(&f->eps[r], memory_order_acquire);
        if (!ep)
            continue;
        dsim_waitq_lock(ep->lock);
        dsim_waitq_wake(ep->lock);
        dsim_waitq_unlock(ep->lock);
    }
    dsim_warn("transport '%s' aborted: failed rank %d: %s", f->ops->name, f->abort_peer,
              f->abort_why);
    f->ops->abort(f, failed_peer, f->abort_why);
}

void dsim_ep_abort(dsim_ep *ep, int failed_peer, const char *why)
{
    if (ep)
        dsim_fabric_abort(ep->f, failed_peer, why);
}

void dsim_ep_set_epoch(dsim_ep *ep, uint32_t comm_id, uint32_t epoch)
{
    if (!ep)
        return;
    dsim_waitq_lock(ep->slock);
    tp_map_ent *s = tp_map_get(&ep->send_epoch, -1, comm_id, 0);
    uint32_t old = s ? s->epoch : 0;
    if (s && epoch > s->epoch)
        s->epoch = epoch;
    dsim_waitq_unlock(ep->slock);
    if (!s) {
        DSIM_ERR(DSIM_ENOMEM, -1, "out of memory setting comm %" PRIu32 "'s epoch", comm_id);
        return;
    }
    if (epoch < old) {
        dsim_warn("rank %d: comm %" PRIu32 "'s epoch stays %" PRIu32 "; epochs only go up "
                  "(asked for %" PRIu32 ")",
                  ep->rank, comm_id, old, epoch);
        return;
    }
    tp_list dropped;
    tp_list_init(&dropped);
    dsim_waitq_lock(ep->lock);
    tp_map_ent *r = tp_map_get(&ep->recv_epoch, -1, comm_id, 0);
    if (r && epoch > r->epoch) {
        r->epoch = epoch;
        tp_purge_epoch_locked(ep, comm_id, epoch, &dropped);
    }
    dsim_waitq_unlock(ep->lock);
    tp_finish_dropped(ep->f, &dropped);
    if (!r)
        DSIM_ERR(DSIM_ENOMEM, -1, "out of memory setting comm %" PRIu32 "'s epoch", comm_id);
}

void dsim_ep_get_stats(const dsim_ep *cep, dsim_ep_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!cep)
        return;
    dsim_ep *ep = (dsim_ep *)cep; /* locking is not a logical change */
    dsim_waitq_lock(ep->slock);
    out->msgs_sent = ep->msgs_sent;
    out->bytes_sent = ep->bytes_sent;
    out->seq_streams = ep->send_seq.used;
    dsim_waitq_unlock(ep->slock);
    dsim_waitq_lock(ep->lock);
    out->msgs_recv = ep->msgs_recv;
    out->seq_streams += ep->recv_seq.used;
    out->bytes_recv = ep->bytes_recv;
    out->rejected_misrouted = ep->rejected_misrouted;
    out->rejected_stale = ep->rejected_stale;
    out->rejected_corrupt = ep->rejected_corrupt;
    dsim_waitq_unlock(ep->lock);
}

void dsim_ep_get_conn_stats(dsim_ep *ep, dsim_ep_conn_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    out->slowest_peer = -1;
    if (!ep)
        return;
    dsim_fabric *f = ep->f;
    /* The filter's model stands for links the backend does not have. */
    if (f->filter && f->filter->conn_stats) {
        f->filter->conn_stats(f->filter_user, ep, out);
        if (out->connections)
            return;
        memset(out, 0, sizeof *out);
        out->slowest_peer = -1;
    }
    if (f->ops->conn_stats)
        f->ops->conn_stats(ep, out);
}

dsim_err tp_aborted_now(dsim_fabric *f, const char *what, int peer)
{
    return DSIM_ERR(DSIM_EABORTED, f->abort_peer >= 0 ? f->abort_peer : peer,
                    "transport aborted (failed rank %d: %s); %s rank %d is refused", f->abort_peer,
                    f->abort_why, what, peer);
}
