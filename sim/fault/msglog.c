/* The message log (msglog.h). A frame's half takes a slot by one atomic
 * add and is copied there: no lock on the frames' path. Every frame of the
 * run's first steps is logged from the ranks' own threads, and a mutex
 * taken twice a half (the clock, then the record) by 4 ranks on 2 CPUs
 * made those steps take twice as long as the later ones (the quickstart's
 * first ~100 steps on the threads engine), which a run of 48 steps never
 * left. The slots are in chunks, allocated as the first slot of one is
 * taken; the mutex guards that, the attempt's change and the readers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/rt.h"
#include "msglog.h"

#define ML_CHUNK  4096u
#define ML_CHUNKS (DSIM_MSG_LOG_CAP / ML_CHUNK)

struct dsim_msg_log {
    pthread_mutex_t mu;
    _Atomic(dsim_msg_rec *) chunk[ML_CHUNKS]; /* calloc'd: a slot never written has seq 0 */
    atomic_size_t n;                          /* slots taken (may pass the cap) */
    atomic_uint_fast64_t dropped;
    atomic_int attempt;
    _Atomic(dsim_rt *) rt; /* the running fabric's, while the log is its filter */
    struct dsim_tp_filter filter;
};

/* Frames of a link beyond the first DSIM_MSG_LOG_PER_LINK (numbered from
 * 1 per link, communicator and epoch) are not logged. */
static bool ml_kept(const dsim_tp_hdr *hdr)
{
    return hdr->seq >= 1 && hdr->seq <= DSIM_MSG_LOG_PER_LINK;
}

/* Chunk c of the slots, allocated by the first to need it; NULL out of
 * memory. */
static dsim_msg_rec *ml_chunk(dsim_msg_log *log, size_t c)
{
    dsim_msg_rec *h = atomic_load_explicit(&log->chunk[c], memory_order_acquire);
    if (h)
        return h;
    pthread_mutex_lock(&log->mu);
    h = atomic_load_explicit(&log->chunk[c], memory_order_relaxed);
    if (!h && (h = calloc(ML_CHUNK, sizeof *h)) != NULL)
        atomic_store_explicit(&log->chunk[c], h, memory_order_release);
    pthread_mutex_unlock(&log->mu);
    return h;
}

/* r into a slot of its own (r->seq >= 1); a half that finds none is
 * counted as dropped where it is a send. */
static void ml_push(dsim_msg_log *log, const dsim_msg_rec *r, bool count_drop)
{
    size_t i = atomic_fetch_add_explicit(&log->n, 1, memory_order_relaxed);
    dsim_msg_rec *h = i < DSIM_MSG_LOG_CAP ? ml_chunk(log, i / ML_CHUNK) : NULL;
    if (h)
        h[i % ML_CHUNK] = *r;
    else if (count_drop)
        atomic_fetch_add_explicit(&log->dropped, 1, memory_order_relaxed);
}

static void ml_log(dsim_msg_log *log, int src, int dst, const dsim_tp_hdr *hdr, int64_t t,
                   bool sent)
{
    if (!log)
        return;
    if (!ml_kept(hdr)) {
        if (sent)
            atomic_fetch_add_explicit(&log->dropped, 1, memory_order_relaxed);
        return;
    }
    dsim_msg_rec r = {.attempt = atomic_load_explicit(&log->attempt, memory_order_relaxed),
                      .src = src,
                      .dst = dst,
                      .comm_id = hdr->comm_id,
                      .epoch = hdr->epoch,
                      .tag = hdr->tag,
                      .seq = hdr->seq,
                      .bytes = hdr->len,
                      .t_sent_ns = sent ? t : -1,
                      .t_recv_ns = sent ? -1 : t};
    ml_push(log, &r, sent);
}

void dsim_msg_log_sent(dsim_msg_log *log, int src, const dsim_tp_hdr *hdr, int64_t t)
{
    ml_log(log, src, hdr->dst, hdr, t, true);
}

void dsim_msg_log_arrived(dsim_msg_log *log, int dst, const dsim_tp_hdr *hdr, int64_t t)
{
    ml_log(log, hdr->src, dst, hdr, t, false);
}

dsim_err dsim_msg_log_create(dsim_msg_log **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return DSIM_ERR(DSIM_ENOMEM, -1, "message log: out of memory");
    pthread_mutex_init(&(*out)->mu, NULL);
    return DSIM_OK;
}

void dsim_msg_log_destroy(dsim_msg_log *log)
{
    if (!log)
        return;
    pthread_mutex_destroy(&log->mu);
    for (size_t c = 0; c < ML_CHUNKS; c++)
        free(atomic_load(&log->chunk[c]));
    free(log);
}

void dsim_msg_log_next_attempt(dsim_msg_log *log)
{
    atomic_fetch_add(&log->attempt, 1);
}

int dsim_msg_log_attempt(dsim_msg_log *log)
{
    return atomic_load(&log->attempt);
}

void dsim_msg_log_add(dsim_msg_log *log, const dsim_msg_rec *halves, size_t n, uint64_t dropped)
{
    atomic_fetch_add(&log->dropped, dropped);
    int attempt = atomic_load(&log->attempt);
    for (size_t i = 0; i < n; i++) {
        dsim_msg_rec r = halves[i];
        if (r.seq < 1)
            continue; /* no frame's */
        r.attempt = attempt;
        ml_push(log, &r, r.t_sent_ns >= 0);
    }
}

/* The halves logged (slots never written, of a chunk that could not be
 * had, left out), in a malloc'd array; *oom where it could not be made. */
static size_t ml_gather(dsim_msg_log *log, dsim_msg_rec **out, bool *oom)
{
    size_t n = atomic_load(&log->n);
    if (n > DSIM_MSG_LOG_CAP)
        n = DSIM_MSG_LOG_CAP;
    *oom = false;
    *out = n ? malloc(n * sizeof **out) : NULL;
    if (!*out) {
        *oom = n > 0;
        return 0;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const dsim_msg_rec *h =
            atomic_load_explicit(&log->chunk[i / ML_CHUNK], memory_order_acquire);
        if (h && h[i % ML_CHUNK].seq >= 1)
            (*out)[m++] = h[i % ML_CHUNK];
    }
    if (!m) {
        free(*out);
        *out = NULL;
    }
    return m;
}

size_t dsim_msg_log_halves(dsim_msg_log *log, dsim_msg_rec **out, uint64_t *dropped)
{
    bool oom;
    size_t n = ml_gather(log, out, &oom);
    if (dropped)
        *dropped = atomic_load(&log->dropped);
    return n;
}

static int ml_cmp_key(const void *a, const void *b)
{
    const dsim_msg_rec *x = a, *y = b;
#define ML_CMP(f)                                                                                  \
    if (x->f != y->f)                                                                              \
        return x->f < y->f ? -1 : 1;
    ML_CMP(attempt)
    ML_CMP(src)
    ML_CMP(dst)
    ML_CMP(comm_id)
    ML_CMP(epoch)
    ML_CMP(seq)
#undef ML_CMP
    return 0;
}

/* Unknown times (< 0) sort last. */
static int ml_cmp_time(int64_t a, int64_t b)
{
    if (a == b)
        return 0;
    if (a < 0 || b < 0)
        return a < 0 ? 1 : -1;
    return a < b ? -1 : 1;
}

static int ml_cmp_sent(const void *a, const void *b)
{
    const dsim_msg_rec *x = a, *y = b;
    int c = ml_cmp_time(x->t_sent_ns, y->t_sent_ns);
    if (!c)
        c = ml_cmp_time(x->t_recv_ns, y->t_recv_ns);
    return c ? c : ml_cmp_key(a, b);
}

dsim_err dsim_msg_log_join(dsim_msg_log *log, dsim_msg_rec **out, size_t *n_out, uint64_t *dropped)
{
    dsim_msg_rec *h = NULL;
    bool oom;
    size_t n = ml_gather(log, &h, &oom);
    if (dropped)
        *dropped = atomic_load(&log->dropped);
    *out = NULL;
    *n_out = 0;
    if (!h)
        return oom ? DSIM_ERR(DSIM_ENOMEM, -1, "message log: out of memory joining the frames")
                   : DSIM_OK;
    qsort(h, n, sizeof *h, ml_cmp_key);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && ml_cmp_key(&h[m - 1], &h[i]) == 0) {
            /* the other half, or a duplicate's arrival: the first counts */
            dsim_msg_rec *d = &h[m - 1];
            if (d->t_sent_ns < 0 || (h[i].t_sent_ns >= 0 && h[i].t_sent_ns < d->t_sent_ns))
                d->t_sent_ns = h[i].t_sent_ns;
            if (d->t_recv_ns < 0 || (h[i].t_recv_ns >= 0 && h[i].t_recv_ns < d->t_recv_ns))
                d->t_recv_ns = h[i].t_recv_ns;
            continue;
        }
        h[m++] = h[i];
    }
    /* On inproc a frame is delivered inside the backend's send, before the
     * sender's on_sent is called: it was sent no later than it arrived. */
    for (size_t i = 0; i < m; i++)
        if (h[i].t_sent_ns >= 0 && h[i].t_recv_ns >= 0 && h[i].t_recv_ns < h[i].t_sent_ns)
            h[i].t_sent_ns = h[i].t_recv_ns;
    qsort(h, m, sizeof *h, ml_cmp_sent);
    *out = h;
    *n_out = m;
    return DSIM_OK;
}

/* ---- the log as a run's only filter ---- */

static dsim_err ml_attach(void *user, dsim_fabric *f)
{
    dsim_msg_log *log = user;
    atomic_store_explicit(&log->rt, dsim_tp_fabric_rt(f), memory_order_release);
    return DSIM_OK;
}

static void ml_detach(void *user, dsim_fabric *f)
{
    dsim_msg_log *log = user;
    (void)f;
    atomic_store_explicit(&log->rt, NULL, memory_order_release);
}

static int64_t ml_now(dsim_msg_log *log)
{
    dsim_rt *rt = atomic_load_explicit(&log->rt, memory_order_acquire);
    return rt ? dsim_rt_now(rt) : -1;
}

static dsim_tp_filter_verdict ml_on_deliver(void *user, dsim_ep *ep, dsim_tp_hdr *hdr,
                                            const void *payload, size_t len)
{
    dsim_msg_log *log = user;
    (void)payload;
    (void)len;
    int64_t t = ml_now(log);
    if (t >= 0)
        dsim_msg_log_arrived(log, dsim_ep_rank(ep), hdr, t);
    return DSIM_TP_FILTER_PASS;
}

static void ml_on_sent(void *user, dsim_ep *ep, const dsim_tp_hdr *hdr)
{
    dsim_msg_log *log = user;
    int64_t t = ml_now(log);
    if (t >= 0)
        dsim_msg_log_sent(log, dsim_ep_rank(ep), hdr, t);
}

void dsim_msg_log_attach(dsim_msg_log *log, dsim_train_cfg *cfg)
{
    log->filter = (struct dsim_tp_filter){.size = sizeof(struct dsim_tp_filter),
                                          .attach = ml_attach,
                                          .detach = ml_detach,
                                          .on_deliver = ml_on_deliver,
                                          .on_sent = ml_on_sent};
    cfg->transport_filter = &log->filter;
    cfg->transport_filter_user = log;
}
