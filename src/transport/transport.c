/* The transport dispatch file: every transport call goes through here.
 *
 * It owns the backend registry, fabric and endpoint lifecycle, requests,
 * headers and sequence numbers on the send side, deadlines, cancellation,
 * abort (revoke), counters and trace logging. Backends see only the
 * ops table in dsim/spi/transport.h; the receive path is in match.c. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fiu_int.h"
#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "dsim/spi/shm.h"
#include "tp_int.h"

#define TP_MAX_BACKENDS 16
#define TP_NAME_MAX     32
#define TP_MAX_RANKS    (1 << 20)
#define TP_MAX_BUCKETS  256

/* ---- registry ---- */

/* Registration is rare and has no runtime to lock with (no dsim_rt exists
 * yet), so a spin flag guards it; it is never contended in practice. */
static atomic_flag tp_reg_lock = ATOMIC_FLAG_INIT;
static struct dsim_tp_ops tp_reg[TP_MAX_BACKENDS];
static char tp_reg_names[TP_MAX_BACKENDS][TP_NAME_MAX];
static const char *tp_names[TP_MAX_BACKENDS + 1];
static int tp_nreg;
static int tp_builtins_done;

static void tp_reg_acquire(void)
{
    while (atomic_flag_test_and_set_explicit(&tp_reg_lock, memory_order_acquire))
        ;
}

static void tp_reg_release(void)
{
    atomic_flag_clear_explicit(&tp_reg_lock, memory_order_release);
}

static dsim_err tp_stub_cancel_send(dsim_ep *ep, dsim_req *req)
{
    (void)ep;
    (void)req;
    return DSIM_ENOTSUP; /* not supported: the shared layer waits for completion */
}

static void tp_stub_abort(dsim_fabric *f, int failed_peer, const char *why)
{
    /* not supported: every rank shares this address space, nobody to tell */
    (void)f;
    (void)failed_peer;
    (void)why;
}

static int tp_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= TP_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

#define TP_OPS_MIN_SIZE (offsetof(struct dsim_tp_ops, send) + sizeof(void *))

static dsim_err tp_register_locked(const struct dsim_tp_ops *ops)
{
    if (!ops)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_transport_register: ops is NULL");
    if (ops->size < TP_OPS_MIN_SIZE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: ops->size is %zu, less than the %zu bytes "
                        "every table has; set .size = sizeof(struct dsim_tp_ops)",
                        ops->size, (size_t)TP_OPS_MIN_SIZE);
    if (!ops->name || !tp_name_ok(ops->name))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: backend name '%s' is not valid; use 1 to %d "
                        "characters from [a-z0-9_]",
                        ops->name ? ops->name : "(null)", TP_NAME_MAX - 1);
    const char *missing = !ops->fabric_open    ? "fabric_open"
                          : !ops->fabric_close ? "fabric_close"
                          : !ops->ep_open      ? "ep_open"
                          : !ops->ep_close     ? "ep_close"
                          : !ops->send         ? "send"
                                               : NULL;
    if (missing)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: backend '%s' leaves the required member "
                        "'%s' NULL",
                        ops->name, missing);
    for (int i = 0; i < tp_nreg; i++)
        if (strcmp(tp_reg_names[i], ops->name) == 0)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "dsim_transport_register: a backend named '%s' is already "
                            "registered",
                            ops->name);
    if (tp_nreg == TP_MAX_BACKENDS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: already %d backends registered; cannot add "
                        "'%s'",
                        TP_MAX_BACKENDS, ops->name);
    struct dsim_tp_ops *c = &tp_reg[tp_nreg];
    memset(c, 0, sizeof *c);
    memcpy(c, ops, ops->size < sizeof *c ? ops->size : sizeof *c);
    c->size = sizeof *c;
    snprintf(tp_reg_names[tp_nreg], TP_NAME_MAX, "%s", ops->name);
    c->name = tp_reg_names[tp_nreg];
    if (!c->cancel_send)
        c->cancel_send = tp_stub_cancel_send;
    if (!c->abort)
        c->abort = tp_stub_abort;
    tp_names[tp_nreg] = c->name;
    tp_nreg++;
    tp_names[tp_nreg] = NULL;
    return DSIM_OK;
}

static void tp_builtins_locked(void)
{
    if (tp_builtins_done)
        return;
    tp_builtins_done = 1;
    static const struct dsim_tp_ops *const builtins[] = {&dsim_tp_inproc_ops, &dsim_tp_tcp_ops,
                                                         &dsim_tp_shm_ops};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (tp_register_locked(builtins[i]) != DSIM_OK)
            dsim_error_log("built-in transport '%s' failed to register: %s", builtins[i]->name,
                           dsim_errmsg());
}

dsim_err dsim_transport_register(const struct dsim_tp_ops *ops)
{
    tp_reg_acquire();
    tp_builtins_locked();
    dsim_err e = tp_register_locked(ops);
    tp_reg_release();
    return e;
}

const char *const *dsim_transport_names(void)
{
    tp_reg_acquire();
    tp_builtins_locked();
    tp_reg_release();
    return tp_names;
}

static const struct dsim_tp_ops *tp_lookup(const char *name)
{
    const struct dsim_tp_ops *found = NULL;
    tp_reg_acquire();
    tp_builtins_locked();
    for (int i = 0; i < tp_nreg && !found; i++)
        if (strcmp(tp_reg_names[i], name) == 0)
            found = &tp_reg[i];
    tp_reg_release();
    return found;
}

static void tp_names_list(char *buf, size_t cap)
{
    size_t off = 0;
    buf[0] = '\0';
    for (const char *const *n = dsim_transport_names(); *n && off < cap; n++) {
        int w = snprintf(buf + off, cap - off, "%s%s", off ? ", " : "", *n);
        if (w < 0)
            break;
        off += (size_t)w;
    }
}

/* ---- small helpers ---- */

void tp_tag_str(uint32_t tag, char *buf, size_t cap)
{
    if (tag == DSIM_ANY_TAG)
        snprintf(buf, cap, "any");
    else
        snprintf(buf, cap, "%" PRIu32, tag);
}

static size_t tp_align(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

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

static dsim_err tp_aborted_now(dsim_fabric *f, const char *what, int peer)
{
    return DSIM_ERR(DSIM_EABORTED, f->abort_peer >= 0 ? f->abort_peer : peer,
                    "transport aborted (failed rank %d: %s); %s rank %d is refused", f->abort_peer,
                    f->abort_why, what, peer);
}

/* ---- fabric and endpoints ---- */

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

dsim_err dsim_fabric_open(const dsim_fabric_cfg *cfg, dsim_fabric **out)
{
    if (out)
        *out = NULL;
    if (!cfg || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_fabric_open: cfg and out must not be NULL");
    char names[256];
    if (!cfg->backend) {
        tp_names_list(names, sizeof names);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: no backend given; set cfg.backend to one of: %s", names);
    }
    if (cfg->nranks < 1 || cfg->nranks > TP_MAX_RANKS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: nranks is %d; it must be between 1 and %d", cfg->nranks,
                        TP_MAX_RANKS);
    if (!cfg->rt)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: cfg.rt is NULL; create one with dsim_rt_create");
    const struct dsim_tp_ops *ops = tp_lookup(cfg->backend);
    if (!ops) {
        tp_names_list(names, sizeof names);
        return DSIM_ERR(DSIM_ENOENT, -1, "no transport backend named '%s'; registered backends: %s",
                        cfg->backend, names);
    }
    size_t psz = ops->fabric_priv_size;
    dsim_fabric *f = calloc(1, tp_align(sizeof *f) + psz);
    if (!f)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank fabric", cfg->nranks);
    f->ops = ops;
    f->rt = cfg->rt;
    f->nranks = cfg->nranks;
    if (cfg->filter &&
        (cfg->filter->size != sizeof(struct dsim_tp_filter) || !cfg->filter->on_deliver)) {
        free(f);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: the filter's size is %zu (expected %zu) or it has "
                        "no on_deliver",
                        cfg->filter->size, sizeof(struct dsim_tp_filter));
    }
    f->filter = cfg->filter;
    f->filter_user = cfg->filter_user;
    f->abort_peer = -1;
    atomic_init(&f->aborted, 0);
    atomic_flag_clear(&f->abort_claimed);
    f->priv = psz ? (char *)f + tp_align(sizeof *f) : NULL;
    unsigned nb = 1;
    while (nb < (unsigned)cfg->nranks && nb < TP_MAX_BUCKETS)
        nb *= 2;
    f->bucket_mask = nb - 1;
    f->eps = calloc((size_t)cfg->nranks, sizeof *f->eps);
    if (!f->eps) {
        free(f);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank fabric", cfg->nranks);
    }
    for (int r = 0; r < cfg->nranks; r++)
        atomic_init(&f->eps[r], NULL);
    /* The filter first: a backend with threads of its own (tcp) may hand
     * frames over as soon as it is open. */
    dsim_err e = DSIM_OK;
    if (f->filter && f->filter->attach && (e = f->filter->attach(f->filter_user, f)) != DSIM_OK) {
        free(f->eps);
        free(f);
        return e;
    }
    e = ops->fabric_open(f, cfg->options);
    if (e != DSIM_OK) {
        if (f->filter && f->filter->detach)
            f->filter->detach(f->filter_user, f);
        free(f->eps);
        free(f);
        return e;
    }
    dsim_debug("transport: opened a %d-rank '%s' fabric", f->nranks, ops->name);
    *out = f;
    return DSIM_OK;
}

void dsim_fabric_close(dsim_fabric *f)
{
    if (!f)
        return;
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

/* ---- requests ---- */

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

static dsim_req *tp_req_new(dsim_ep *ep, int kind, int peer, uint32_t comm_id, uint32_t tag)
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

static void tp_req_free(dsim_req *r)
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

/* Waits for req until deadline or abort; ep->lock held. */
static int tp_wait_locked(dsim_req *req, int64_t deadline, int64_t *started)
{
    dsim_ep *ep = req->ep;
    dsim_rt_hint(DSIM_RT_HINT_REQ, req); /* what this worker touches when it wakes */
    dsim_rt_hint(DSIM_RT_HINT_EP, ep);
    dsim_rt_hint(DSIM_RT_HINT_EP_LOCK, ep->lock);
    while (!atomic_load_explicit(&req->done, memory_order_acquire)) {
        if (tp_aborted(ep->f))
            return TP_WAIT_ABORTED;
        if (*started < 0)
            *started = dsim_rt_now(ep->f->rt);
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
         * not the first in index order. */
        dsim_waitq_lock(ep->lock);
        for (;;) {
            int pending = 0;
            for (int i = 0; i < n && bad < 0; i++) {
                if (!reqs[i])
                    continue;
                if (tp_req_failed(reqs[i]))
                    bad = i;
                else if (!atomic_load_explicit(&reqs[i]->done, memory_order_acquire))
                    pending = 1;
            }
            if (bad >= 0 || !pending || tp_aborted(ep->f))
                break;
            if (started < 0)
                started = dsim_rt_now(ep->f->rt);
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

/* ---- sending ---- */

static uint32_t tp_send_epoch_slocked(dsim_ep *ep, uint32_t comm_id)
{
    tp_map_ent *e = tp_map_find(&ep->send_epoch, -1, comm_id, 0);
    return e ? e->epoch : 0;
}

static void tp_hdr_fill(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, size_t len,
                        uint32_t epoch, uint64_t seq, dsim_tp_hdr *h)
{
    memset(h, 0, sizeof *h);
    h->magic = DSIM_TP_MAGIC;
    h->version = DSIM_TP_VERSION;
    h->src = ep->rank;
    h->dst = dst;
    h->comm_id = comm_id;
    h->epoch = epoch;
    h->tag = tag;
    h->seq = seq;
    h->len = len;
}

static dsim_err tp_send_args(const char *fn, dsim_ep *ep, int dst, uint32_t tag, dsim_req **out)
{
    if (out)
        *out = NULL;
    if (!ep || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: ep and req must not be NULL", fn);
    if (dst < 0 || dst >= ep->f->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: rank %d is out of range: the fabric has %d ranks (0..%d)", fn, dst,
                        ep->f->nranks, ep->f->nranks - 1);
    if (tag == DSIM_ANY_TAG)
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "%s: DSIM_ANY_TAG is only for receives; give the message a tag", fn);
    return DSIM_OK;
}

/* Links req into ep->live; fails if ep is not open. */
static dsim_err tp_req_link(dsim_req *req)
{
    dsim_ep *ep = req->ep;
    dsim_waitq_lock(ep->lock);
    int open = ep->state == TP_EP_OPEN;
    if (open)
        tp_list_push(&ep->live, &req->live);
    dsim_waitq_unlock(ep->lock);
    if (!open)
        return DSIM_ERR(DSIM_ESTATE, -1, "rank %d's endpoint is closed; cannot send", ep->rank);
    return DSIM_OK;
}

static void tp_req_unlink_free(dsim_req *req)
{
    dsim_waitq_lock(req->ep->lock);
    tp_list_del(&req->live);
    dsim_waitq_unlock(req->ep->lock);
    tp_req_free(req);
}

static dsim_err tp_isend(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                         size_t len, uint64_t vlen, const void *side, dsim_req **out);

dsim_err dsim_isend(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                    size_t len, dsim_req **out)
{
    return tp_isend(ep, dst, comm_id, tag, buf, len, 0, NULL, out);
}

dsim_err dsim_isend_virtual(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, uint64_t vlen,
                            const void *side, dsim_req **out)
{
    if (vlen == 0 || vlen > DSIM_TP_MAX_LEN) {
        if (out)
            *out = NULL;
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "dsim_isend_virtual: a virtual payload of %" PRIu64
                        " bytes; it must be 1..%" PRIu64,
                        vlen, (uint64_t)DSIM_TP_MAX_LEN);
    }
    return tp_isend(ep, dst, comm_id, tag, NULL, sizeof vlen, vlen, side, out);
}

dsim_err dsim_isend_side(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                         size_t len, const void *side, dsim_req **out)
{
    if (!side) {
        if (out)
            *out = NULL;
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "dsim_isend_side: side is NULL; pass %d bytes, or call dsim_isend",
                        DSIM_TP_SIDE_LEN);
    }
    return tp_isend(ep, dst, comm_id, tag, buf, len, 0, side, out);
}

/* vlen > 0: a virtual send; its 8-byte payload is vlen itself, kept in the
 * request so that it lives as long as the send. side: a sideband or NULL. */
static dsim_err tp_isend(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                         size_t len, uint64_t vlen, const void *side, dsim_req **out)
{
    DSIM_CHECK(tp_send_args("dsim_isend", ep, dst, tag, out));
    if (!buf && len && !vlen)
        return DSIM_ERR(DSIM_EINVAL, dst, "dsim_isend: buf is NULL but len is %zu", len);
    if ((uint64_t)len > DSIM_TP_MAX_LEN)
        return DSIM_ERR(DSIM_EINVAL, dst,
                        "dsim_isend: %zu bytes is over the %" PRIu64
                        "-byte message limit; split it",
                        len, (uint64_t)DSIM_TP_MAX_LEN);
    dsim_fabric *f = ep->f;
    if (tp_aborted(f))
        return tp_aborted_now(f, "sending to", dst);
    /* libfiu point (dsim/fiu.h): the send fails as on a connection that was
     * reset, before a request exists or a sequence number is taken, so the
     * stream to dst has no gap. */
    if (DSIM_FIU("dsim/tp/send")) {
        char tg[16];
        tp_tag_str(tag, tg, sizeof tg);
        return DSIM_ERR(DSIM_EPEER, dst,
                        "connection to peer %d reset while rank %d was sending to it (comm "
                        "%" PRIu32 ", tag %s): %s",
                        dst, ep->rank, comm_id, tg, strerror(DSIM_FIU_INFO(ECONNRESET)));
    }
    dsim_req *req = tp_req_new(ep, TP_REQ_SEND, dst, comm_id, tag);
    if (!req)
        return DSIM_ENOMEM;
    if (vlen) {
        req->vlen = vlen;
        buf = &req->vlen;
    }
    req->sbuf = buf;
    req->slen = len;
    dsim_err e = tp_req_link(req);
    if (e != DSIM_OK) {
        tp_req_free(req);
        return e;
    }
    dsim_tp_hdr h;
    dsim_waitq_lock(ep->slock);
    uint32_t epoch = tp_send_epoch_slocked(ep, comm_id);
    tp_map_ent *s = tp_map_get(&ep->send_seq, dst, comm_id, 0);
    if (!s) {
        dsim_waitq_unlock(ep->slock);
        tp_req_unlink_free(req);
        return DSIM_ERR(DSIM_ENOMEM, dst, "out of memory sending to rank %d", dst);
    }
    if (s->epoch != epoch) {
        s->epoch = epoch;
        s->seq = 0;
    }
    tp_hdr_fill(ep, dst, comm_id, tag, len, epoch, ++s->seq, &h);
    if (vlen)
        h.flags |= DSIM_TP_F_VIRTUAL;
    if (side) {
        h.flags |= DSIM_TP_F_SIDE;
        memcpy(h.side, side, DSIM_TP_SIDE_LEN);
    }
    e = f->ops->send(ep, dst, &h, buf, len, req);
    if (e == DSIM_OK) {
        ep->msgs_sent++;
        ep->bytes_sent += len;
    }
    dsim_waitq_unlock(ep->slock);
    dsim_rt_trace(f->rt, DSIM_TRACE_SEND, ((uint64_t)(uint32_t)ep->rank << 32) | (uint32_t)dst,
                  ((uint64_t)comm_id << 32) | tag,
                  (h.seq << 8) ^ ((uint64_t)len << 1) ^ (uint64_t)e);
    dsim_trace("tp: rank %d isend to %d comm %" PRIu32 " tag %" PRIu32 " seq %" PRIu64
               " len %zu: %s",
               ep->rank, dst, comm_id, tag, h.seq, len, dsim_strerror(e));
    if (e != DSIM_OK) {
        tp_req_unlink_free(req);
        return e;
    }
    *out = req;
    if (f->filter && f->filter->on_sent)
        f->filter->on_sent(f->filter_user, ep, &h);
    return DSIM_OK;
}

dsim_err dsim_tp_inject(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload,
                        size_t len, dsim_req **out)
{
    if (out)
        *out = NULL;
    if (!ep || !hdr || !out || (!payload && len))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_tp_inject: ep, hdr and req must be set, and payload when len > 0");
    if (to < 0 || to >= ep->f->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_tp_inject: rank %d is out of range: the fabric has %d ranks", to,
                        ep->f->nranks);
    if (tp_aborted(ep->f))
        return tp_aborted_now(ep->f, "injecting a frame to", to);
    dsim_req *req = tp_req_new(ep, TP_REQ_SEND, to, hdr->comm_id, hdr->tag);
    if (!req)
        return DSIM_ENOMEM;
    req->sbuf = payload;
    req->slen = len;
    dsim_err e = tp_req_link(req);
    if (e != DSIM_OK) {
        tp_req_free(req);
        return e;
    }
    dsim_waitq_lock(ep->slock);
    e = ep->f->ops->send(ep, to, hdr, payload, len, req);
    dsim_waitq_unlock(ep->slock);
    if (e != DSIM_OK) {
        tp_req_unlink_free(req);
        return e;
    }
    *out = req;
    return DSIM_OK;
}

dsim_err dsim_tp_hdr_next(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, size_t len,
                          dsim_tp_hdr *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tp_hdr_next: out is NULL");
    dsim_req *unused;
    DSIM_CHECK(tp_send_args("dsim_tp_hdr_next", ep, dst, tag, &unused));
    dsim_waitq_lock(ep->slock);
    uint32_t epoch = tp_send_epoch_slocked(ep, comm_id);
    tp_map_ent *s = tp_map_find(&ep->send_seq, dst, comm_id, 0);
    uint64_t seq = (s && s->epoch == epoch) ? s->seq + 1 : 1;
    dsim_waitq_unlock(ep->slock);
    tp_hdr_fill(ep, dst, comm_id, tag, len, epoch, seq, out);
    return DSIM_OK;
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

/* ---- receiving ---- */

static dsim_err tp_recv_args(const char *fn, dsim_ep *ep, int src, dsim_req **out)
{
    if (out)
        *out = NULL;
    if (!ep || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: ep and req must not be NULL", fn);
    if (src < 0 || src >= ep->f->nranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: rank %d is out of range: the fabric has %d ranks (0..%d)", fn, src,
                        ep->f->nranks, ep->f->nranks - 1);
    if (tp_aborted(ep->f))
        return tp_aborted_now(ep->f, "receiving from", src);
    return DSIM_OK;
}

static dsim_err tp_recv_post(dsim_req *req, dsim_req **out)
{
    dsim_err e = tp_recv_start(req);
    dsim_trace("tp: rank %d irecv from %d comm %" PRIu32 " tag %" PRIu32 " cap %zu: %s",
               req->ep->rank, req->peer, req->comm_id, req->tag, req->cap, dsim_strerror(e));
    if (e != DSIM_OK) {
        tp_req_free(req);
        return e;
    }
    *out = req;
    return DSIM_OK;
}

dsim_err dsim_irecv(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag, void *buf, size_t cap,
                    dsim_req **out)
{
    DSIM_CHECK(tp_recv_args("dsim_irecv", ep, src, out));
    if (!buf && cap)
        return DSIM_ERR(DSIM_EINVAL, src, "dsim_irecv: buf is NULL but cap is %zu", cap);
    dsim_req *req = tp_req_new(ep, TP_REQ_RECV, src, comm_id, tag);
    if (!req)
        return DSIM_ENOMEM;
    req->buf = buf;
    req->cap = cap;
    return tp_recv_post(req, out);
}

dsim_err dsim_irecv_reduce(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag, void *inout,
                           size_t count, dsim_dtype t, dsim_op op, dsim_req **out)
{
    DSIM_CHECK(tp_recv_args("dsim_irecv_reduce", ep, src, out));
    size_t esz = dsim_dtype_size(t);
    if (!esz)
        return DSIM_ERR(DSIM_EINVAL, src, "dsim_irecv_reduce: dtype %d is not a valid dsim_dtype",
                        (int)t);
    if ((int)op < 0 || op >= DSIM_OP_COUNT)
        return DSIM_ERR(DSIM_EINVAL, src, "dsim_irecv_reduce: op %d is not a valid dsim_op",
                        (int)op);
    if (count > (size_t)DSIM_TP_MAX_LEN / esz)
        return DSIM_ERR(DSIM_EINVAL, src,
                        "dsim_irecv_reduce: %zu elements is over the message size limit", count);
    if (!inout && count)
        return DSIM_ERR(DSIM_EINVAL, src, "dsim_irecv_reduce: inout is NULL but count is %zu",
                        count);
    dsim_req *req = tp_req_new(ep, TP_REQ_RECV_REDUCE, src, comm_id, tag);
    if (!req)
        return DSIM_ENOMEM;
    req->buf = inout;
    req->count = count;
    req->cap = count * esz;
    req->dt = t;
    req->op = op;
    return tp_recv_post(req, out);
}

/* ---- abort, epochs, counters ---- */

void dsim_fabric_abort(dsim_fabric *f, int failed_peer, const char *why)
{
    if (!f)
        return;
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
    tp_finish_dropped(&dropped);
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

/* ---- backend options ---- */

int dsim_tp_opt_next(const char *backend, const char **cursor, char *key, size_t kcap, char *val,
                     size_t vcap)
{
    const char *p = *cursor;
    if (!p)
        return 0;
    while (*p == ',' || *p == ' ')
        p++;
    if (!*p) {
        *cursor = p;
        return 0;
    }
    const char *end = strchr(p, ',');
    if (!end)
        end = p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    size_t klen = eq ? (size_t)(eq - p) : 0;
    size_t vlen = eq ? (size_t)(end - eq - 1) : 0;
    if (!eq || klen == 0 || klen >= kcap || vlen >= vcap) {
        DSIM_ERR(DSIM_EINVAL, -1,
                 "%s option '%.*s' is malformed: write key=value, items separated by commas",
                 backend, (int)(end - p), p);
        return -1;
    }
    memcpy(key, p, klen);
    key[klen] = '\0';
    memcpy(val, eq + 1, vlen);
    val[vlen] = '\0';
    *cursor = end;
    return 1;
}

dsim_err dsim_tp_opt_size(const char *backend, const char *key, const char *val, size_t *out)
{
    char *end = NULL;
    /* strtoull would skip leading blanks and negate a "-": "eager_max= -5"
     * must not become 2^64 - 5. */
    if (!val || *val < '0' || *val > '9')
        goto bad;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno == ERANGE || end == val)
        goto bad;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1ULL << 10;
    else if (*end == 'm' || *end == 'M')
        mul = 1ULL << 20;
    else if (*end == 'g' || *end == 'G')
        mul = 1ULL << 30;
    if (mul != 1)
        end++;
    if (end == val || *end || v > (unsigned long long)SIZE_MAX / mul)
        goto bad;
    *out = (size_t)(v * mul);
    return DSIM_OK;
bad:
    return DSIM_ERR(DSIM_EINVAL, -1, "%s option %s=%s: expected a byte count such as 65536 or 64k",
                    backend, key, val ? val : "");
}

/* ---- checksums: CRC32C (Castagnoli), SSE4.2 where the CPU has it ---- */

static uint64_t tp_load64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static uint32_t tp_crc_tab[8][256];
static int tp_crc_hw;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TP_CRC_LONG  8192
#define TP_CRC_SHORT 256
static void tp_crc_zeros(uint32_t zeros[4][256], size_t len);
static uint32_t tp_crc_long[4][256], tp_crc_short[4][256];
#endif
static pthread_once_t tp_crc_once = PTHREAD_ONCE_INIT;

static void tp_crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        tp_crc_tab[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            tp_crc_tab[t][i] =
                (tp_crc_tab[t - 1][i] >> 8) ^ tp_crc_tab[0][tp_crc_tab[t - 1][i] & 0xff];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    tp_crc_hw = __builtin_cpu_supports("sse4.2");
    if (tp_crc_hw) {
        tp_crc_zeros(tp_crc_long, TP_CRC_LONG);
        tp_crc_zeros(tp_crc_short, TP_CRC_SHORT);
    }
#endif
}

static uint32_t tp_crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = tp_crc_tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        n--;
    }
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w = tp_load64(p) ^ c;
        c = tp_crc_tab[7][w & 0xff] ^ tp_crc_tab[6][(w >> 8) & 0xff] ^
            tp_crc_tab[5][(w >> 16) & 0xff] ^ tp_crc_tab[4][(w >> 24) & 0xff] ^
            tp_crc_tab[3][(w >> 32) & 0xff] ^ tp_crc_tab[2][(w >> 40) & 0xff] ^
            tp_crc_tab[1][(w >> 48) & 0xff] ^ tp_crc_tab[0][w >> 56];
    }
    while (n--)
        c = tp_crc_tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The crc32 instruction has a latency of three cycles and a throughput of
 * one, so three independent streams run at once and are joined with
 * "append n zero bytes" operators (Mark Adler's crc32c.c). */
static uint32_t tp_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1)
            sum ^= *mat;
    return sum;
}

static void tp_gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = tp_gf2_times(mat, mat[n]);
}

/* The operator that appends len zero bytes (len a power of two). */
static void tp_crc_zeros(uint32_t zeros[4][256], size_t len)
{
    uint32_t even[32], odd[32];
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (uint32_t n = 1, row = 1; n < 32; n++, row <<= 1)
        odd[n] = row;
    tp_gf2_square(even, odd); /* two bits */
    tp_gf2_square(odd, even); /* four bits */
    uint32_t *op = odd;
    do {
        tp_gf2_square(even, odd); /* then one byte, two, four... */
        op = even;
        len >>= 1;
        if (!len)
            break;
        tp_gf2_square(odd, even);
        op = odd;
        len >>= 1;
    } while (len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = tp_gf2_times(op, n);
        zeros[1][n] = tp_gf2_times(op, n << 8);
        zeros[2][n] = tp_gf2_times(op, n << 16);
        zeros[3][n] = tp_gf2_times(op, n << 24);
    }
}

static uint32_t tp_crc_shift(uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t tp_crc_sse42(uint32_t c, const uint8_t *p,
                                                               size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi(c, *p++);
        n--;
    }
    uint64_t c0 = c;
    static const size_t spans[2] = {TP_CRC_LONG, TP_CRC_SHORT};
    for (int k = 0; k < 2; k++) {
        size_t span = spans[k];
        while (n >= 3 * span) {
            uint64_t c1 = 0, c2 = 0;
            for (const uint8_t *end = p + span; p < end; p += 8) {
                c0 = __builtin_ia32_crc32di(c0, tp_load64(p));
                c1 = __builtin_ia32_crc32di(c1, tp_load64(p + span));
                c2 = __builtin_ia32_crc32di(c2, tp_load64(p + 2 * span));
            }
            uint32_t(*zeros)[256] = k ? tp_crc_short : tp_crc_long;
            c0 = tp_crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;
            c0 = tp_crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c2;
            p += 2 * span;
            n -= 3 * span;
        }
    }
    for (; n >= 8; p += 8, n -= 8)
        c0 = __builtin_ia32_crc32di(c0, tp_load64(p));
    c = (uint32_t)c0;
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t dsim_tp_crc32c(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&tp_crc_once, tp_crc_init);
    uint32_t c = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (tp_crc_hw)
        return ~tp_crc_sse42(c, buf, n);
#endif
    return ~tp_crc_sw(c, buf, n);
}

uint32_t dsim_tp_checksum(const void *p, size_t n)
{
    return dsim_tp_crc32c(0, p, n);
}
