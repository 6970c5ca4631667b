/* The message log (msglog.h). One mutex guards the halves: a frame's
 * record is a few words copied under it, and nothing else is done there. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/rt.h"
#include "msglog.h"

struct dsim_msg_log {
    pthread_mutex_t mu;
    dsim_msg_rec *h;
    size_t n, cap;
    uint64_t dropped;
    int attempt;
    dsim_rt *rt; /* the running fabric's, while the log is its filter */
    struct dsim_tp_filter filter;
};

/* Frames of a link beyond the first DSIM_MSG_LOG_PER_LINK (numbered from
 * 1 per link, communicator and epoch) are not logged. */
static bool ml_kept(const dsim_tp_hdr *hdr)
{
    return hdr->seq >= 1 && hdr->seq <= DSIM_MSG_LOG_PER_LINK;
}

static void ml_push_locked(dsim_msg_log *log, const dsim_msg_rec *r, bool count_drop)
{
    if (log->n == log->cap) {
        size_t cap = log->cap ? 2 * log->cap : 1024;
        if (cap > DSIM_MSG_LOG_CAP)
            cap = DSIM_MSG_LOG_CAP;
        dsim_msg_rec *h = cap > log->cap ? realloc(log->h, cap * sizeof *h) : NULL;
        if (!h) {
            if (count_drop)
                log->dropped++;
            return;
        }
        log->h = h;
        log->cap = cap;
    }
    log->h[log->n++] = *r;
}

static void ml_log(dsim_msg_log *log, int src, int dst, const dsim_tp_hdr *hdr, int64_t t,
                   bool sent)
{
    if (!log)
        return;
    pthread_mutex_lock(&log->mu);
    if (!ml_kept(hdr)) {
        if (sent)
            log->dropped++;
    } else {
        dsim_msg_rec r = {.attempt = log->attempt,
                          .src = src,
                          .dst = dst,
                          .comm_id = hdr->comm_id,
                          .epoch = hdr->epoch,
                          .tag = hdr->tag,
                          .seq = hdr->seq,
                          .bytes = hdr->len,
                          .t_sent_ns = sent ? t : -1,
                          .t_recv_ns = sent ? -1 : t};
        ml_push_locked(log, &r, sent);
    }
    pthread_mutex_unlock(&log->mu);
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
    free(log->h);
    free(log);
}

void dsim_msg_log_next_attempt(dsim_msg_log *log)
{
    pthread_mutex_lock(&log->mu);
    log->attempt++;
    pthread_mutex_unlock(&log->mu);
}

int dsim_msg_log_attempt(dsim_msg_log *log)
{
    pthread_mutex_lock(&log->mu);
    int a = log->attempt;
    pthread_mutex_unlock(&log->mu);
    return a;
}

void dsim_msg_log_add(dsim_msg_log *log, const dsim_msg_rec *halves, size_t n, uint64_t dropped)
{
    pthread_mutex_lock(&log->mu);
    log->dropped += dropped;
    for (size_t i = 0; i < n; i++) {
        dsim_msg_rec r = halves[i];
        r.attempt = log->attempt;
        ml_push_locked(log, &r, r.t_sent_ns >= 0);
    }
    pthread_mutex_unlock(&log->mu);
}

size_t dsim_msg_log_halves(dsim_msg_log *log, dsim_msg_rec **out, uint64_t *dropped)
{
    pthread_mutex_lock(&log->mu);
    size_t n = log->n;
    *out = n ? malloc(n * sizeof **out) : NULL;
    if (*out)
        memcpy(*out, log->h, n * sizeof **out);
    else
        n = 0;
    if (dropped)
        *dropped = log->dropped;
    pthread_mutex_unlock(&log->mu);
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
    size_t n = dsim_msg_log_halves(log, &h, dropped);
    *out = NULL;
    *n_out = 0;
    if (!h) {
        pthread_mutex_lock(&log->mu);
        bool oom = log->n > 0;
        pthread_mutex_unlock(&log->mu);
        return oom ? DSIM_ERR(DSIM_ENOMEM, -1, "message log: out of memory joining the frames")
                   : DSIM_OK;
    }
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
    pthread_mutex_lock(&log->mu);
    log->rt = dsim_tp_fabric_rt(f);
    pthread_mutex_unlock(&log->mu);
    return DSIM_OK;
}

static void ml_detach(void *user, dsim_fabric *f)
{
    dsim_msg_log *log = user;
    (void)f;
    pthread_mutex_lock(&log->mu);
    log->rt = NULL;
    pthread_mutex_unlock(&log->mu);
}

static int64_t ml_now(dsim_msg_log *log)
{
    pthread_mutex_lock(&log->mu);
    dsim_rt *rt = log->rt;
    pthread_mutex_unlock(&log->mu);
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
