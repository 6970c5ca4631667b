/* Fault injection: the transport filter and the driver's hooks that carry
 * out a scenario's fault list (see fault.h for what each fault does).
 *
 *   frames ──> on_deliver (receiving side, any backend)
 *                 dead end?          drop
 *                 paused end?        hold until the pause ends
 *                 link faults        drop / hold / duplicate / corrupt / reorder
 *                 link already holds frames?  hold behind them (order per link)
 *              held frames ──> fs_worker (a runtime worker) ──> dsim_tp_deliver_held
 *   replicas ──> fs_phase (every phase of every replica)
 *                 triggers: step / phase [/ after N frames] / time / probability
 *                 kill, restart (revoke later), pause (sleep), slow, stagger
 *
 * One lock (the wait queue fs->q, a leaf lock) guards all state. Nothing is
 * delivered while it is held: a held frame is unlinked, delivered unlocked,
 * and only then does its link stop counting it, so a frame arriving
 * meanwhile is held behind it and the link's order is kept. */
#include <inttypes.h>
#include <math.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "dsim/rng.h"
#include "dsim/rt.h"
#include "dsim/spi/transport.h"
#include "dsim_config.h"
#include "fault.h"
#include "msglog.h"

#if DSIM_HAVE_FIU && defined(FIU_ENABLE)
#include <fiu.h>
#define FS_FIU(name) fiu_fail(name)
#else
#define FS_FIU(name) 0
#endif

#define FS_WORKER_ID   (1 << 24)
#define FS_POLL_NS     (10LL * 1000 * 1000) /* a paused replica re-checks the job this often */
#define FS_DEFAULT_RTO (200LL * 1000 * 1000)
#define FS_FOREVER     INT64_MAX

static const char *const fs_what_names[DSIM_FAULT_WHAT_COUNT] = {
    [DSIM_FAULT_KILL] = "kill",           [DSIM_FAULT_RESTART] = "restart",
    [DSIM_FAULT_PARTITION] = "partition", [DSIM_FAULT_DROP] = "drop",
    [DSIM_FAULT_DELAY] = "delay",         [DSIM_FAULT_DUPLICATE] = "duplicate",
    [DSIM_FAULT_CORRUPT] = "corrupt",     [DSIM_FAULT_REORDER] = "reorder",
    [DSIM_FAULT_SLOW] = "slow",           [DSIM_FAULT_STAGGER] = "stagger",
    [DSIM_FAULT_PAUSE] = "pause",         [DSIM_FAULT_PREEMPT] = "preempt",
};

const char *dsim_fault_what_name(dsim_fault_what w)
{
    return (int)w >= 0 && w < DSIM_FAULT_WHAT_COUNT ? fs_what_names[w] : "unknown";
}

typedef struct fs_link fs_link;

typedef struct fs_held {
    dsim_ep *ep;
    dsim_tp_hdr hdr;
    int64_t due;  /* FS_FOREVER: until released */
    uint64_t seq; /* order of holding: frames due together leave in it */
    union {
        fs_link *link;
        struct fs_held *next_free; /* on the free list of small frames */
    };
    int why; /* the fault index that held it, or -1 (queued behind others) */
    size_t len;
    unsigned char data[];
} fs_held;

/* Frames of up to FS_SMALL bytes (a timing-only frame carries 8) are held
 * in blocks of one size that are kept on a free list for the next one,
 * not given back to malloc each time. */
#define FS_SMALL 64

/* A heap entry: the key is kept beside the frame, so that ordering the
 * heap reads the heap's array only. */
typedef struct fs_hent {
    int64_t due;
    uint64_t seq;
    fs_held *h;
} fs_hent;

/* A slot of the link table: the key beside the link, so that probing reads
 * the table only. An empty slot has l == NULL. */
typedef struct fs_lslot {
    uint64_t key;
    fs_link *l;
} fs_lslot;

struct fs_link {
    uint64_t key; /* src * R + dst */
    dsim_rng rng;
    bool rng_ready;
    double last; /* the last uniform draw, for correlation */
    int held;    /* frames of this link in the held list or being delivered */
    int64_t last_due;
    int64_t net_free; /* the network model: when the link's last frame has left */
    bool net_up;      /* the network model: the link's connection is set up */
};

/* Links are made in chunks and never move (held frames point at them). */
#define FS_LCHUNK 4096
typedef struct fs_lchunk {
    struct fs_lchunk *next;
    size_t used;
    fs_link v[FS_LCHUNK];
} fs_lchunk;

/* A fault's life in the current run. */
typedef struct fs_state {
    bool fired, done;
    int64_t t_fire;
    bool *victim;   /* [R] ranks it acts on */
    int64_t armed;  /* after_messages countdown once its phase is entered; -1 not armed */
    int armed_rank; /* the rank being counted */
    bool fired_before_restart;
} fs_state;

/* A revocation scheduled by a restart. */
typedef struct fs_timer {
    int64_t due;
    int rank;
    bool pending;
} fs_timer;

struct dsim_faults {
    /* hooks that were in the configuration before attach: called after
     * the faults' own phase hook (fs_phase) */
    const dsim_train_hooks *next_hooks;
    void *next_user;
    dsim_fault *list;
    size_t n;
    bool any_reorder; /* some fault reorders: a held frame may wait to be overtaken */
    uint64_t seed;
    int hosts, D, N, P, R;
    fs_state *st;
    /* per rank */
    bool *dead;
    int64_t *pause_end; /* 0 none; FS_FOREVER for good */
    int *phase;
    uint64_t *step;
    int64_t *t_compute;
    /* per link, made on first use: a hash table by src * R + dst (open
     * addressing, lcap a power of two), so that a job of 65,536 ranks pays
     * for the links it uses, not for R x R of them */
    fs_lslot *links;
    size_t lcap, lcount;
    fs_lchunk *lchunks;
    /* the run */
    dsim_rt *rt;
    dsim_fabric *fab;
    dsim_waitq *q;
    dsim_task *worker;
    bool stopping;
    int64_t t0;
    /* held frames: a 4-ary heap by (due, seq), so that a step in which
     * every one of thousands of ranks sends costs log n per frame */
    fs_hent *held;
    size_t nheld, capheld;
    fs_held *free_held; /* blocks for frames of up to FS_SMALL bytes */
    uint64_t hseq;
    fs_timer *timers;
    size_t n_timers;
    dsim_faults_stats stats;
    int64_t t_loss; /* absolute runtime time the first node was lost, or -1 */
    int lost_rank;
    bool loss_unreported; /* the next event says lost_rank was lost */
    dsim_fault_event *ev;
    size_t n_ev, cap_ev;
    dsim_train_hooks hooks;
    struct dsim_tp_filter filter;
    dsim_faults_process_hooks proc;
    /* the network model (dsim_faults_set_network); NULL arrays: none */
    dsim_net_links net;
    int64_t *nic_out_free, *nic_in_free; /* [hosts + P]: when each NIC is free */
    /* [R]: the modelled connections each rank set up in this run */
    int *conn_n, *conn_slowest;
    int64_t *conn_total, *conn_max;
    int pending_kill[8]; /* kills to report to proc.on_kill once unlocked */
    int n_pending_kill;
    dsim_msg_log *msgs; /* frames for the trace's arrows (msglog.h), or NULL */
};

/* ---- events ---- */

static void fs_event_locked(dsim_faults *fs, int fault, int rank, int64_t now, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void fs_event_locked(dsim_faults *fs, int fault, int rank, int64_t now, const char *fmt, ...)
{
    char text[sizeof fs->ev[0].text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    uint64_t th = 0xcbf29ce484222325ULL; /* FNV-1a of the text, for the trace */
    for (const char *c = text; *c; c++)
        th = (th ^ (unsigned char)*c) * 0x100000001b3ULL;
    dsim_rt_trace(fs->rt, DSIM_TRACE_FAULT, ((uint64_t)(uint32_t)fault << 32) | (uint32_t)rank,
                  (uint64_t)(now - fs->t0), th);
    if (fs->n_ev == fs->cap_ev) {
        size_t cap = fs->cap_ev ? 2 * fs->cap_ev : 32;
        if (cap > 100000)
            return; /* bounded: a probabilistic fault on a long run */
        dsim_fault_event *e = realloc(fs->ev, cap * sizeof *e);
        if (!e)
            return;
        fs->ev = e;
        fs->cap_ev = cap;
    }
    dsim_fault_event *e = &fs->ev[fs->n_ev++];
    e->t_ns = now - fs->t0;
    e->t_abs = now;
    e->fault = fault;
    e->rank = rank;
    e->lost = -1;
    if (fs->loss_unreported) {
        e->lost = fs->lost_rank;
        fs->loss_unreported = false;
    }
    memcpy(e->text, text, sizeof text);
    dsim_info("fault: %s", e->text);
}

/* ---- scopes ---- */

static int fs_rank_of_worker(const dsim_faults *fs, int w, int d)
{
    return w * fs->D + d;
}

/* Fills st->victim from the fault's where. */
static dsim_err fs_resolve(dsim_faults *fs, size_t i)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    st->victim = calloc((size_t)fs->R, sizeof *st->victim);
    if (!st->victim)
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
    st->armed = -1;
    st->armed_rank = -1;
    if (f->rank >= 0 && f->rank < fs->R)
        st->victim[f->rank] = true;
    if (f->worker >= 0 && f->worker < fs->hosts)
        for (int d = 0; d < fs->D; d++)
            st->victim[fs_rank_of_worker(fs, f->worker, d)] = true;
    if (f->ps >= 0 && f->ps < fs->P)
        st->victim[fs->N + f->ps] = true;
    for (int k = 0; k < f->n_ranks; k++)
        if (f->ranks[k] >= 0 && f->ranks[k] < fs->R)
            st->victim[f->ranks[k]] = true;
    if (f->link_from >= 0) {
        st->victim[f->link_from] = true;
        st->victim[f->link_to] = true;
    }
    if (f->scope == DSIM_SCOPE_ALL) {
        for (int r = 0; r < fs->N; r++)
            st->victim[r] = true;
    } else if (f->scope == DSIM_SCOPE_ONE || f->scope == DSIM_SCOPE_MAJORITY) {
        int want = f->scope == DSIM_SCOPE_ONE ? 1 : fs->N / 2 + 1;
        uint64_t *ids = malloc((size_t)fs->N * sizeof *ids);
        if (!ids)
            return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
        for (int r = 0; r < fs->N; r++)
            ids[r] = (uint64_t)r;
        dsim_rng g;
        dsim_rng_init(&g, fs->seed, "fault.scope", i);
        dsim_rng_shuffle_u64(&g, ids, (uint64_t)fs->N);
        for (int k = 0; k < want && k < fs->N; k++)
            st->victim[ids[k]] = true;
        free(ids);
    }
    return DSIM_OK;
}

static bool fs_any_victim(const dsim_faults *fs, size_t i)
{
    for (int r = 0; r < fs->R; r++)
        if (fs->st[i].victim[r])
            return true;
    return false;
}

static int fs_first_victim(const dsim_faults *fs, size_t i)
{
    for (int r = 0; r < fs->R; r++)
        if (fs->st[i].victim[r])
            return r;
    return -1;
}

static void fs_lost_locked(dsim_faults *fs, int rank, int64_t now);

/* Does a link fault touch the frame src -> dst? */
static bool fs_link_matches(const dsim_faults *fs, size_t i, int src, int dst)
{
    const dsim_fault *f = &fs->list[i];
    const bool *v = fs->st[i].victim;
    if (f->link_from >= 0) {
        if (src == f->link_from && dst == f->link_to)
            return true;
        return !f->one_way && src == f->link_to && dst == f->link_from;
    }
    if (!fs_any_victim(fs, i))
        return true; /* no where: every link */
    if (f->what == DSIM_FAULT_PARTITION)
        return v[src] != v[dst]; /* the cut: one end on each side */
    return v[src] || v[dst];
}

/* ---- triggers ---- */

static bool fs_is_link_fault(dsim_fault_what w)
{
    return w == DSIM_FAULT_PARTITION || w == DSIM_FAULT_DROP || w == DSIM_FAULT_DELAY ||
           w == DSIM_FAULT_DUPLICATE || w == DSIM_FAULT_CORRUPT || w == DSIM_FAULT_REORDER;
}

static bool fs_one_shot(const dsim_fault *f)
{
    return (f->what == DSIM_FAULT_DROP || f->what == DSIM_FAULT_DUPLICATE ||
            f->what == DSIM_FAULT_CORRUPT || f->what == DSIM_FAULT_REORDER) &&
           f->when != DSIM_WHEN_PROBABILITY && f->duration_ns == 0;
}

/* Is link fault i in force at `now`? (Probability faults always are.) */
static bool fs_active_locked(dsim_faults *fs, size_t i, int64_t now)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    if (st->done)
        return false;
    if (f->when == DSIM_WHEN_PROBABILITY)
        return true;
    if (!st->fired && f->when == DSIM_WHEN_TIME && now - fs->t0 >= f->time_ns) {
        st->fired = true;
        st->t_fire = now;
        fs->stats.fired++;
        if (f->what == DSIM_FAULT_PARTITION && f->duration_ns == 0)
            fs_lost_locked(fs, f->link_from >= 0 ? f->link_to : fs_first_victim(fs, i), now);
        fs_event_locked(fs, (int)i, -1, now, "fault %zu (%s) fired at %.3f s", i,
                        fs_what_names[f->what], (double)(now - fs->t0) / 1e9);
    }
    if (!st->fired)
        return false;
    if (f->duration_ns > 0 && now >= st->t_fire + f->duration_ns && f->what != DSIM_FAULT_DELAY) {
        st->done = true;
        fs_event_locked(fs, (int)i, -1, now, "fault %zu (%s) healed after %.3f s", i,
                        fs_what_names[f->what], (double)f->duration_ns / 1e9);
        return false;
    }
    return true;
}

static size_t fs_link_slot(const fs_lslot *tab, size_t cap, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (cap - 1);
    while (tab[i].l && tab[i].key != key)
        i = (i + 1) & (cap - 1);
    return i;
}

static fs_link *fs_link_get(dsim_faults *fs, int src, int dst)
{
    uint64_t key = (uint64_t)src * (uint64_t)fs->R + (uint64_t)dst;
    size_t i = fs_link_slot(fs->links, fs->lcap, key);
    if (fs->links[i].l)
        return fs->links[i].l;
    if (2 * (fs->lcount + 1) > fs->lcap) {
        size_t ncap = fs->lcap * 2;
        fs_lslot *nt = calloc(ncap, sizeof *nt);
        if (!nt)
            return NULL;
        for (size_t k = 0; k < fs->lcap; k++)
            if (fs->links[k].l)
                nt[fs_link_slot(nt, ncap, fs->links[k].key)] = fs->links[k];
        free(fs->links);
        fs->links = nt;
        fs->lcap = ncap;
        i = fs_link_slot(fs->links, fs->lcap, key);
    }
    if (!fs->lchunks || fs->lchunks->used == FS_LCHUNK) {
        fs_lchunk *c = calloc(1, sizeof *c);
        if (!c)
            return NULL;
        c->next = fs->lchunks;
        fs->lchunks = c;
    }
    fs_link *l = &fs->lchunks->v[fs->lchunks->used++];
    l->key = key;
    fs->links[i].key = key;
    fs->links[i].l = l;
    fs->lcount++;
    return l;
}

/* netem's correlated draw: next = c * last + (1 - c) * uniform. */
static double fs_draw(dsim_faults *fs, fs_link *l, int src, int dst, double corr)
{
    if (!l->rng_ready) {
        dsim_rng_init(&l->rng, fs->seed, "fault.link", (uint64_t)src * 1000003u + (uint64_t)dst);
        l->rng_ready = true;
        l->last = dsim_rng_uniform(&l->rng);
    }
    double u = dsim_rng_uniform(&l->rng);
    l->last = corr * l->last + (1.0 - corr) * u;
    return l->last;
}

/* ---- held frames ---- */

static inline bool fs_hent_before(const fs_hent *a, const fs_hent *b)
{
    return a->due != b->due ? a->due < b->due : a->seq < b->seq;
}

static void fs_heap_up(dsim_faults *fs, size_t i)
{
    fs_hent *v = fs->held, e = v[i];
    while (i > 0 && fs_hent_before(&e, &v[(i - 1) / 4])) {
        v[i] = v[(i - 1) / 4];
        i = (i - 1) / 4;
    }
    v[i] = e;
}

static void fs_heap_down(dsim_faults *fs, size_t i)
{
    fs_hent *v = fs->held, e = v[i];
    size_t n = fs->nheld;
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n)
            break;
        size_t end = c + 4 < n ? c + 4 : n;
        for (size_t k = c + 1; k < end; k++)
            if (fs_hent_before(&v[k], &v[c]))
                c = k;
        if (!fs_hent_before(&v[c], &e))
            break;
        v[i] = v[c];
        i = c;
    }
    v[i] = e;
}

/* Takes held frame i out of the heap. */
static fs_held *fs_heap_take(dsim_faults *fs, size_t i)
{
    fs_held *h = fs->held[i].h;
    fs->held[i] = fs->held[--fs->nheld];
    if (i < fs->nheld) {
        fs_heap_down(fs, i);
        fs_heap_up(fs, i);
    }
    return h;
}

/* Room for one more held frame. */
static bool fs_heap_room(dsim_faults *fs)
{
    if (fs->nheld < fs->capheld)
        return true;
    size_t ncap = fs->capheld ? 2 * fs->capheld : 64;
    fs_hent *v = realloc(fs->held, ncap * sizeof *v);
    if (!v)
        return false;
    fs->held = v;
    fs->capheld = ncap;
    return true;
}

/* Holds h (room made by the caller), after every frame due no later. */
static void fs_hold_insert_locked(dsim_faults *fs, fs_held *h)
{
    h->seq = ++fs->hseq;
    fs->held[fs->nheld] = (fs_hent){.due = h->due, .seq = h->seq, .h = h};
    fs_heap_up(fs, fs->nheld++);
    dsim_waitq_wake(fs->q);
}

static fs_held *fs_held_alloc(dsim_faults *fs, size_t len)
{
    if (len > FS_SMALL)
        return malloc(sizeof(fs_held) + len);
    fs_held *h = fs->free_held;
    if (h) {
        fs->free_held = h->next_free;
        return h;
    }
    return malloc(sizeof(fs_held) + FS_SMALL);
}

static void fs_held_free(dsim_faults *fs, fs_held *h)
{
    if (h->len > FS_SMALL) {
        free(h);
        return;
    }
    h->next_free = fs->free_held;
    fs->free_held = h;
}

static bool fs_hold_locked(dsim_faults *fs, dsim_ep *ep, const dsim_tp_hdr *hdr,
                           const void *payload, size_t len, int64_t due, int why, fs_link *l)
{
    fs_held *h = fs_heap_room(fs) ? fs_held_alloc(fs, len) : NULL;
    if (!h) {
        fs->stats.dropped++;
        return false;
    }
    h->ep = ep;
    h->hdr = *hdr;
    h->len = len;
    if (len)
        memcpy(h->data, payload, len);
    if (due < l->last_due)
        due = l->last_due; /* never overtake a frame of the same link */
    h->due = due;
    h->link = l;
    h->why = why;
    l->last_due = due;
    l->held++;
    fs->stats.held++;
    fs_hold_insert_locked(fs, h);
    return true;
}

/* Moves held frames that `pred` selects to `due` (a heal or a pause's end). */
static int fs_held_cmp(const void *a, const void *b)
{
    const fs_hent *x = a, *y = b;
    return fs_hent_before(x, y) ? -1 : fs_hent_before(y, x) ? 1 : 0;
}

static void fs_release_locked(dsim_faults *fs, int64_t due, int rank, int why)
{
    /* The moved frames keep their order among themselves and follow the
     * frames already due then, as they would in a list sorted by due. */
    size_t n = fs->nheld, m = 0;
    fs_hent *moved = n ? malloc(n * sizeof *moved) : NULL;
    if (n && !moved) {
        dsim_error_log("faults: out of memory releasing held frames; they stay held until "
                       "their own time");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        fs_hent e = fs->held[i];
        const fs_held *h = e.h;
        bool sel = (why >= 0 && h->why == why) ||
                   (rank >= 0 && (h->hdr.src == rank || h->hdr.dst == rank));
        if (sel && e.due > due)
            moved[m++] = e;
        else
            fs->held[k++] = e;
    }
    fs->nheld = k;
    for (size_t i = (k + 2) / 4; i-- > 0;) /* the rest is a heap again */
        fs_heap_down(fs, i);
    if (m > 1)
        qsort(moved, m, sizeof *moved, fs_held_cmp);
    for (size_t i = 0; i < m; i++) {
        fs_held *h = moved[i].h;
        h->due = due;
        h->link->last_due = due;
        fs_hold_insert_locked(fs, h);
    }
    free(moved);
}

/* With tens of thousands of ranks the next frame and its receiver's
 * endpoint are far out of cache: fetch them while this one is delivered.
 * The next frame was itself prefetched one turn earlier, as the smallest of
 * the top's children. */
static void fs_prefetch_next(dsim_faults *fs)
{
    if (fs->nheld == 0)
        return;
    const fs_held *n = fs->held[0].h;
    for (int o = 0; o < 256; o += 64)
        __builtin_prefetch((const char *)n->ep + o, 0, 1);
    size_t best = 0;
    for (size_t k = 1; k <= 4 && k < fs->nheld; k++) /* the root's children */
        if (!best || fs_hent_before(&fs->held[k], &fs->held[best]))
            best = k;
    if (best)
        __builtin_prefetch(fs->held[best].h, 0, 1);
}

static void fs_worker_main(void *arg)
{
    dsim_faults *fs = arg;
    dsim_waitq_lock(fs->q);
    while (!fs->stopping) {
        int64_t now = dsim_rt_now(fs->rt);
        for (size_t t = 0; t < fs->n_timers; t++) {
            fs_timer *tm = &fs->timers[t];
            if (tm->pending && tm->due <= now) {
                tm->pending = false;
                char why[160];
                snprintf(why, sizeof why,
                         "peer %d restarted: a new incarnation joined and the group must be "
                         "re-formed",
                         tm->rank);
                fs_event_locked(fs, -1, tm->rank, now, "rank %d came back (new incarnation)",
                                tm->rank);
                dsim_waitq_unlock(fs->q);
                dsim_fabric_abort(fs->fab, tm->rank, why);
                dsim_waitq_lock(fs->q);
            }
        }
        fs_held *h = fs->nheld ? fs->held[0].h : NULL;
        if (h && fs->held[0].due <= now) {
            fs_heap_take(fs, 0);
            fs_prefetch_next(fs);
            dsim_waitq_unlock(fs->q);
            /* a held frame arrives when it is handed over */
            dsim_msg_log_arrived(fs->msgs, dsim_ep_rank(h->ep), &h->hdr, now);
            dsim_tp_deliver_held(h->ep, &h->hdr, h->data, h->len);
            dsim_waitq_lock(fs->q);
            h->link->held--;
            fs_held_free(fs, h);
            continue;
        }
        int64_t next = h ? h->due : FS_FOREVER;
        for (size_t t = 0; t < fs->n_timers; t++)
            if (fs->timers[t].pending && fs->timers[t].due < next)
                next = fs->timers[t].due;
        dsim_waitq_wait(fs->q, next);
    }
    dsim_waitq_unlock(fs->q);
}

/* ---- the filter ---- */

static bool fs_dead_or_paused_locked(dsim_faults *fs, int r, int64_t now, int64_t *until)
{
    if (r < 0 || r >= fs->R)
        return false;
    if (fs->dead[r]) {
        *until = -1;
        return true;
    }
    if (fs->pause_end[r] > now) {
        if (fs->pause_end[r] > *until)
            *until = fs->pause_end[r];
        return true;
    }
    return false;
}

static void fs_kill_locked(dsim_faults *fs, size_t i, int rank, int64_t now, const char *how);

/* Reports the kills fired under the lock to the process hooks: called right
 * after unlocking. */
static void fs_flush_kills(dsim_faults *fs)
{
    if (!fs->proc.on_kill)
        return;
    int ranks[8], n;
    dsim_waitq_lock(fs->q);
    n = fs->n_pending_kill;
    memcpy(ranks, fs->pending_kill, (size_t)n * sizeof ranks[0]);
    fs->n_pending_kill = 0;
    dsim_waitq_unlock(fs->q);
    for (int k = 0; k < n; k++)
        fs->proc.on_kill(fs->proc.user, ranks[k], "a kill fault");
}

/* A kill armed to fire after N frames of its phase counts the victim's
 * frames where they are sent: in its own process, whoever receives them. */
static void fs_on_sent(void *user, dsim_ep *ep, const dsim_tp_hdr *hdr)
{
    dsim_faults *fs = user;
    int src = dsim_ep_rank(ep);
    if (src < 0 || src >= fs->R)
        return;
    bool fired = false;
    dsim_waitq_lock(fs->q);
    int64_t now = dsim_rt_now(fs->rt);
    dsim_msg_log_sent(fs->msgs, src, hdr, now);
    for (size_t i = 0; i < fs->n; i++) {
        fs_state *st = &fs->st[i];
        if (st->armed > 0 && st->armed_rank == src && --st->armed == 0) {
            st->armed = -1;
            fs_kill_locked(fs, i, src, now, "after its frames in the phase");
            fired = true;
        }
    }
    dsim_waitq_unlock(fs->q);
    if (fired)
        fs_flush_kills(fs);
}

/* The host a rank is on for the network model: a replica's worker, or a
 * parameter server's own host after the workers'. */
static int fs_net_host(const dsim_faults *fs, int r)
{
    return r < fs->N ? r / fs->D : fs->hosts + (r - fs->N);
}

dsim_err dsim_faults_set_network(dsim_faults *fs, const dsim_net_links *net)
{
    if (!fs || !net || net->inter_Bps < 0 || net->intra_Bps < 0 || net->inter_latency_ns < 0 ||
        net->intra_latency_ns < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "faults: the network model needs non-negative latencies and bandwidths");
    size_t n = (size_t)fs->hosts + (size_t)fs->P;
    free(fs->nic_out_free);
    free(fs->nic_in_free);
    free(fs->conn_n);
    free(fs->conn_slowest);
    free(fs->conn_total);
    free(fs->conn_max);
    fs->nic_out_free = calloc(n, sizeof *fs->nic_out_free);
    fs->nic_in_free = calloc(n, sizeof *fs->nic_in_free);
    fs->conn_n = calloc((size_t)fs->R, sizeof *fs->conn_n);
    fs->conn_slowest = calloc((size_t)fs->R, sizeof *fs->conn_slowest);
    fs->conn_total = calloc((size_t)fs->R, sizeof *fs->conn_total);
    fs->conn_max = calloc((size_t)fs->R, sizeof *fs->conn_max);
    if (!fs->nic_out_free || !fs->nic_in_free || !fs->conn_n || !fs->conn_slowest ||
        !fs->conn_total || !fs->conn_max) {
        free(fs->nic_out_free);
        free(fs->nic_in_free);
        free(fs->conn_n);
        free(fs->conn_slowest);
        free(fs->conn_total);
        free(fs->conn_max);
        fs->nic_out_free = fs->nic_in_free = NULL;
        fs->conn_n = fs->conn_slowest = NULL;
        fs->conn_total = fs->conn_max = NULL;
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory for the network model");
    }
    fs->net = *net;
    return DSIM_OK;
}

static dsim_tp_filter_verdict fs_on_deliver(void *user, dsim_ep *ep, dsim_tp_hdr *hdr,
                                            const void *payload, size_t len)
{
    dsim_faults *fs = user;
    int src = hdr->src, dst = dsim_ep_rank(ep);
    if (src < 0 || src >= fs->R || dst < 0 || dst >= fs->R)
        return DSIM_TP_FILTER_PASS; /* the shared layer rejects it */
    dsim_waitq_lock(fs->q);
    int64_t now = dsim_rt_now(fs->rt);
    fs->stats.frames_seen++;
    fs_link *l = fs_link_get(fs, src, dst);
    dsim_tp_filter_verdict v = DSIM_TP_FILTER_PASS;
    int64_t until = 0;
    if (!l) {
        fs->stats.dropped++;
        v = DSIM_TP_FILTER_TAKEN;
        goto out;
    }
    if (FS_FIU("dsim/tp/deliver")) {
        fs->stats.dropped++;
        v = DSIM_TP_FILTER_TAKEN;
        goto out;
    }
    bool a = fs_dead_or_paused_locked(fs, src, now, &until);
    bool b = fs_dead_or_paused_locked(fs, dst, now, &until);
    if ((a || b) && until < 0) {
        fs->stats.dropped++; /* a dead process neither sends nor receives */
        v = DSIM_TP_FILTER_TAKEN;
        goto out;
    }
    if (a || b) {
        fs_hold_locked(fs, ep, hdr, payload, len, until, -2, l);
        v = DSIM_TP_FILTER_TAKEN;
        goto out;
    }
    int64_t hold_until = 0;
    int hold_why = -1;
    bool duplicate = false, corrupt = FS_FIU("dsim/tp/corrupt") != 0;
    for (size_t i = 0; i < fs->n; i++) {
        const dsim_fault *f = &fs->list[i];
        if (!fs_is_link_fault(f->what) || !fs_link_matches(fs, i, src, dst) ||
            !fs_active_locked(fs, i, now))
            continue;
        if (f->when == DSIM_WHEN_PROBABILITY &&
            fs_draw(fs, l, src, dst, f->correlation) >= f->probability)
            continue;
        if (fs_one_shot(f))
            fs->st[i].done = true;
        switch (f->what) {
        case DSIM_FAULT_PARTITION: {
            int64_t heal = f->duration_ns > 0 ? fs->st[i].t_fire + f->duration_ns : FS_FOREVER;
            if (heal > hold_until) {
                hold_until = heal;
                hold_why = (int)i;
            }
            break;
        }
        case DSIM_FAULT_DROP:
            if (f->retransmit) {
                fs->stats.retransmitted++;
                int64_t t = now + (f->rto_ns > 0 ? f->rto_ns : FS_DEFAULT_RTO);
                if (t > hold_until) {
                    hold_until = t;
                    hold_why = (int)i;
                }
            } else {
                fs->stats.dropped++;
                if (f->when != DSIM_WHEN_PROBABILITY || fs->stats.dropped <= 16)
                    fs_event_locked(fs, (int)i, src, now,
                                    "fault %zu dropped a frame %d -> %d (comm %" PRIu32
                                    ", tag %" PRIu32 ", %zu bytes)",
                                    i, src, dst, hdr->comm_id, hdr->tag, len);
                v = DSIM_TP_FILTER_TAKEN;
                goto out;
            }
            break;
        case DSIM_FAULT_DELAY: {
            int64_t d = f->duration_ns;
            if (f->jitter_ns > 0)
                d += (int64_t)(fs_draw(fs, l, src, dst, 0) * (double)f->jitter_ns);
            if (now + d > hold_until) {
                hold_until = now + d;
                hold_why = (int)i;
            }
            fs->stats.delayed++;
            break;
        }
        case DSIM_FAULT_DUPLICATE:
            duplicate = true;
            break;
        case DSIM_FAULT_CORRUPT:
            corrupt = true;
            fs_event_locked(fs, (int)i, src, now,
                            "fault %zu corrupted a frame %d -> %d (comm %" PRIu32 ", tag %" PRIu32
                            ", %zu bytes)",
                            i, src, dst, hdr->comm_id, hdr->tag, len);
            break;
        case DSIM_FAULT_REORDER:
            /* Held until the link's next frame has passed it. */
            if (hold_until < FS_FOREVER) {
                hold_until = FS_FOREVER;
                hold_why = (int)i;
            }
            fs->stats.reordered++;
            break;
        default:
            break;
        }
    }
    if (corrupt) {
        /* The payload no longer matches what the header says was sent. */
        hdr->flags = (uint16_t)((hdr->flags | DSIM_TP_F_CHECKSUM) & ~DSIM_TP_F_VERIFIED);
        hdr->checksum = dsim_tp_checksum(payload, len) ^ 0x5A5A5A5Au;
        fs->stats.corrupted++;
    }
    /* A reordered frame waiting alone on this link is overtaken by this
     * one: both go through the worker, this one first. */
    if (fs->any_reorder && l->held == 1 && hold_until == 0) {
        fs_held *r = NULL;
        for (size_t i = 0; i < fs->nheld; i++) {
            const fs_held *h = fs->held[i].h;
            if (fs->held[i].due == FS_FOREVER && h->link == l && h->why >= 0 &&
                fs->list[h->why].what == DSIM_FAULT_REORDER) {
                r = fs_heap_take(fs, i);
                break;
            }
        }
        if (r) {
            l->held--;
            l->last_due = now;
            fs_hold_locked(fs, ep, hdr, payload, len, now, -1, l);
            r->due = now;
            r->why = -1;
            l->held++;
            fs_hold_insert_locked(fs, r);
            fs_event_locked(fs, -1, src, now,
                            "a frame %d -> %d was overtaken by the next one on its link", src, dst);
            v = DSIM_TP_FILTER_TAKEN;
            goto out;
        }
    }
    if (fs->nic_out_free) {
        /* The network: latency plus the frame's time on the wire, behind
         * the link's earlier frames and, between hosts, behind the other
         * flows through the two hosts' NICs. */
        int hs = fs_net_host(fs, src), hd = fs_net_host(fs, dst);
        bool cross = hs != hd;
        int64_t lat = cross ? fs->net.inter_latency_ns : fs->net.intra_latency_ns;
        double bw = cross ? fs->net.inter_Bps : fs->net.intra_Bps;
        int64_t start = now > l->net_free ? now : l->net_free;
        if (!l->net_up && cross) {
            /* The link's first frame waits for its connection, as on tcp:
             * the handshake (SYN, SYN-ACK) and dsim's hello and its reply,
             * two round trips, charged to the sending rank's set-up.
             * Devices of one host share its memory and connect nothing. */
            int64_t conn = 4 * lat;
            l->net_up = true;
            start += conn;
            fs->conn_n[src]++;
            fs->conn_total[src] += conn;
            if (fs->conn_n[src] == 1 || conn > fs->conn_max[src]) {
                fs->conn_max[src] = conn;
                fs->conn_slowest[src] = dst;
            }
        }
        if (cross) {
            if (fs->nic_out_free[hs] > start)
                start = fs->nic_out_free[hs];
            if (fs->nic_in_free[hd] > start)
                start = fs->nic_in_free[hd];
        }
        /* a virtual frame (timing only) stands for the length it carries */
        uint64_t bytes = len;
        if ((hdr->flags & DSIM_TP_F_VIRTUAL) && len == sizeof bytes && payload)
            memcpy(&bytes, payload, sizeof bytes);
        int64_t wire = bw > 0 ? (int64_t)llround((double)(bytes + sizeof *hdr) / bw * 1e9) : 0;
        int64_t end = start + wire;
        l->net_free = end;
        if (cross)
            fs->nic_out_free[hs] = fs->nic_in_free[hd] = end;
        if (end + lat > now && end + lat > hold_until)
            hold_until = end + lat;
    }
    if (hold_until > 0 || l->held > 0) {
        if (hold_until < now)
            hold_until = now;
        fs_hold_locked(fs, ep, hdr, payload, len, hold_until, hold_why, l);
        v = DSIM_TP_FILTER_TAKEN;
        goto out;
    }
    if (duplicate) {
        /* The original goes now; the copy follows it on the same link. */
        fs->stats.duplicated++;
        fs_hold_locked(fs, ep, hdr, payload, len, now, -1, l);
    }
out:
    dsim_waitq_unlock(fs->q);
    if (v == DSIM_TP_FILTER_PASS)
        dsim_msg_log_arrived(fs->msgs, dst, hdr, now);
    if (fs->n_pending_kill)
        fs_flush_kills(fs);
    return v;
}

static void fs_conn_stats(void *user, dsim_ep *ep, dsim_ep_conn_stats *out)
{
    dsim_faults *fs = user;
    int r = dsim_ep_rank(ep);
    if (!fs->conn_n || !fs->q || r < 0 || r >= fs->R)
        return;
    dsim_waitq_lock(fs->q);
    out->connections = fs->conn_n[r];
    out->total_ns = fs->conn_total[r];
    out->max_ns = fs->conn_max[r];
    out->slowest_peer = fs->conn_n[r] ? fs->conn_slowest[r] : -1;
    out->modelled = 1;
    dsim_waitq_unlock(fs->q);
}

static dsim_err fs_attach(void *user, dsim_fabric *f)
{
    dsim_faults *fs = user;
    if (fs->fab)
        return DSIM_ERR(DSIM_ESTATE, -1, "faults: already attached to a running fabric");
    fs->fab = f;
    fs->rt = dsim_tp_fabric_rt(f);
    DSIM_CHECK(dsim_waitq_create(fs->rt, &fs->q));
    fs->stopping = false;
    fs->t0 = dsim_rt_now(fs->rt);
    dsim_err e = dsim_rt_spawn(fs->rt, FS_WORKER_ID, fs_worker_main, fs, &fs->worker);
    if (e != DSIM_OK) {
        dsim_waitq_destroy(fs->q);
        fs->q = NULL;
        fs->fab = NULL;
    }
    return e;
}

static void fs_detach(void *user, dsim_fabric *f)
{
    dsim_faults *fs = user;
    (void)f;
    if (!fs->q)
        return;
    dsim_waitq_lock(fs->q);
    fs->stopping = true;
    dsim_waitq_wake(fs->q);
    dsim_waitq_unlock(fs->q);
    dsim_rt_join(fs->rt, fs->worker);
    fs->worker = NULL;
    for (size_t i = 0; i < fs->nheld; i++) {
        fs->stats.dropped++;
        fs_held_free(fs, fs->held[i].h);
    }
    fs->nheld = 0;
    for (size_t k = 0; k < fs->lcap; k++)
        if (fs->links[k].l) {
            fs_link *l = fs->links[k].l;
            l->held = 0;
            l->last_due = 0;
            l->net_free = 0;
            l->net_up = false; /* the next fabric connects anew */
        }
    for (int h = 0; fs->nic_out_free && h < fs->hosts + fs->P; h++)
        fs->nic_out_free[h] = fs->nic_in_free[h] = 0;
    for (int r = 0; fs->conn_n && r < fs->R; r++) {
        fs->conn_n[r] = 0;
        fs->conn_total[r] = fs->conn_max[r] = 0;
    }
    dsim_waitq_destroy(fs->q);
    fs->q = NULL;
    fs->fab = NULL;
    fs->rt = NULL; /* the job's, gone with it: later events are not traced */
}

/* ---- the hooks ---- */

static void fs_lost_locked(dsim_faults *fs, int rank, int64_t now)
{
    if (fs->t_loss < 0) {
        fs->t_loss = now;
        fs->lost_rank = rank;
        fs->loss_unreported = true; /* the event that follows carries it */
    }
}

static void fs_kill_locked(dsim_faults *fs, size_t i, int rank, int64_t now, const char *how)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    fs_lost_locked(fs, rank, now);
    if (!st->fired) {
        st->fired = true;
        st->t_fire = now;
        fs->stats.fired++;
    }
    /* A worker is one process: all its devices go with it. */
    int w = rank < fs->N ? rank / fs->D : -1;
    int lo = w >= 0 && f->worker >= 0 ? w * fs->D : rank;
    int hi = w >= 0 && f->worker >= 0 ? lo + fs->D : rank + 1;
    for (int r = lo; r < hi; r++) {
        if (fs->dead[r])
            continue;
        fs->dead[r] = true;
        if (fs->proc.on_kill && fs->n_pending_kill < 8)
            fs->pending_kill[fs->n_pending_kill++] = r;
        fs_event_locked(fs, (int)i, r, now, "fault %zu: rank %d %s (%s, %s step %" PRIu64 ")", i, r,
                        f->what == DSIM_FAULT_RESTART ? "killed, to restart" : "killed", how,
                        r < fs->N ? dsim_phase_name((dsim_phase)fs->phase[r]) : "serving",
                        r < fs->N ? fs->step[r] : 0);
        if (f->what == DSIM_FAULT_RESTART) {
            fs_timer *t = realloc(fs->timers, (fs->n_timers + 1) * sizeof *t);
            if (t) {
                fs->timers = t;
                fs->timers[fs->n_timers++] =
                    (fs_timer){.due = now + f->duration_ns, .rank = r, .pending = true};
                dsim_waitq_wake(fs->q);
            }
        }
    }
}

/* Does replica-level fault i trigger for replica r entering phase p at gs? */
static bool fs_triggers_locked(dsim_faults *fs, size_t i, int r, dsim_phase p, uint64_t gs,
                               int64_t now)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    if (!st->victim[r])
        return false;
    switch (f->when) {
    case DSIM_WHEN_STEP:
        return p == DSIM_PHASE_COMPUTE && gs == (uint64_t)f->step;
    case DSIM_WHEN_PHASE: {
        dsim_phase want;
        if (dsim_phase_parse(f->phase, &want) != DSIM_OK) {
            dsim_clear_error();
            return false;
        }
        return p == want && (f->step < 0 || gs == (uint64_t)f->step);
    }
    case DSIM_WHEN_TIME:
        return now - fs->t0 >= f->time_ns;
    case DSIM_WHEN_PROBABILITY: {
        if (p != DSIM_PHASE_COMPUTE)
            return false;
        fs_link *l = fs_link_get(fs, r, r);
        return l && fs_draw(fs, l, r, r, f->correlation) < f->probability;
    }
    }
    return false;
}

/* Sleeps the calling replica until `until` or until the job is revoked.
 * Returns true if it woke because the job was revoked. Unlocked. */
static bool fs_sleep(dsim_faults *fs, int64_t until)
{
    while (dsim_rt_now(fs->rt) < until) {
        if (fs->fab && dsim_fabric_aborted(fs->fab))
            return true;
        int64_t t = dsim_rt_now(fs->rt) + FS_POLL_NS;
        dsim_rt_sleep_until(fs->rt, t < until ? t : until);
    }
    return false;
}

static const char *const fs_fiu_phase[DSIM_PHASE_COUNT] = {
    [DSIM_PHASE_START] = "dsim/phase/start",
    [DSIM_PHASE_RENDEZVOUS] = "dsim/phase/rendezvous",
    [DSIM_PHASE_RESTORE] = "dsim/phase/restore",
    [DSIM_PHASE_CREATE_VARIABLES] = "dsim/phase/create_variables",
    [DSIM_PHASE_COMPUTE] = "dsim/phase/compute",
    [DSIM_PHASE_ALLREDUCE] = "dsim/coll/allreduce",
    [DSIM_PHASE_REDUCE_LOSS] = "dsim/phase/reduce_loss",
    [DSIM_PHASE_CHECKPOINT] = "dsim/phase/checkpoint",
    [DSIM_PHASE_FINISH] = "dsim/phase/finish",
    [DSIM_PHASE_DONE] = "dsim/phase/done",
};

static dsim_hook_action fs_phase(void *user, int r, dsim_phase p, uint64_t gs);

static dsim_hook_action fs_phase_own(dsim_faults *fs, int r, dsim_phase p, uint64_t gs)
{
    if (r < 0 || r >= fs->N || !fs->q)
        return DSIM_HOOK_GO;
    (void)fs_fiu_phase;
    if ((int)p >= 0 && p < DSIM_PHASE_COUNT && FS_FIU(fs_fiu_phase[p])) {
        dsim_waitq_lock(fs->q);
        fs->dead[r] = true;
        fs_event_locked(fs, -1, r, dsim_rt_now(fs->rt), "libfiu point %s killed rank %d",
                        fs_fiu_phase[p], r);
        dsim_waitq_unlock(fs->q);
        return DSIM_HOOK_DIE;
    }
    int64_t sleep_until = 0, slow_ns = 0;
    bool die = false, pause = false;
    dsim_waitq_lock(fs->q);
    int64_t now = dsim_rt_now(fs->rt);
    int prev = fs->phase[r];
    fs->phase[r] = (int)p;
    fs->step[r] = gs;
    if (fs->dead[r]) {
        dsim_waitq_unlock(fs->q);
        return DSIM_HOOK_DIE;
    }
    for (size_t i = 0; i < fs->n; i++) {
        const dsim_fault *f = &fs->list[i];
        fs_state *st = &fs->st[i];
        if (st->done)
            continue;
        if (fs_is_link_fault(f->what)) {
            /* Link faults with a step or phase trigger start when the first
             * replica gets there. */
            if (!st->fired && (f->when == DSIM_WHEN_STEP || f->when == DSIM_WHEN_PHASE)) {
                /* Whichever replica gets there first starts it. */
                bool save = st->victim[r];
                st->victim[r] = true;
                bool hit = fs_triggers_locked(fs, i, r, p, gs, now);
                st->victim[r] = save;
                if (hit) {
                    st->fired = true;
                    st->t_fire = now;
                    fs->stats.fired++;
                    if (f->what == DSIM_FAULT_PARTITION && f->duration_ns == 0)
                        fs_lost_locked(fs, f->link_from >= 0 ? f->link_to : fs_first_victim(fs, i),
                                       now);
                    fs_event_locked(fs, (int)i, -1, now,
                                    "fault %zu (%s) starts at %s of step %" PRIu64, i,
                                    fs_what_names[f->what], dsim_phase_name(p), gs);
                }
            }
            continue;
        }
        switch (f->what) {
        case DSIM_FAULT_KILL:
        case DSIM_FAULT_RESTART:
            if (st->fired && f->when != DSIM_WHEN_PROBABILITY)
                break;
            if (f->ps >= 0) {
                /* a server has no phases: the first replica to get there
                 * triggers it */
                bool save = st->victim[r];
                st->victim[r] = true;
                bool hit = fs_triggers_locked(fs, i, r, p, gs, now);
                st->victim[r] = save;
                if (hit)
                    fs_kill_locked(fs, i, fs->N + f->ps, now, "at its trigger");
                break;
            }
            if (!fs_triggers_locked(fs, i, r, p, gs, now))
                break;
            if (f->after_messages > 0) {
                if (st->armed < 0) {
                    st->armed = f->after_messages;
                    st->armed_rank = r;
                }
                break;
            }
            fs_kill_locked(fs, i, r, now, "at its trigger");
            die = true;
            break;
        case DSIM_FAULT_PAUSE:
            if (st->fired || !fs_triggers_locked(fs, i, r, p, gs, now))
                break;
            st->fired = true;
            st->t_fire = now;
            fs->stats.fired++;
            for (int k = 0; k < fs->R; k++) {
                if (!st->victim[k])
                    continue;
                fs->pause_end[k] = f->duration_ns > 0 ? now + f->duration_ns : FS_FOREVER;
                if (f->duration_ns == 0)
                    fs_lost_locked(fs, k, now);
                fs_event_locked(
                    fs, (int)i, k, now, "fault %zu: rank %d paused at %s of step %" PRIu64 " (%s)",
                    i, k, dsim_phase_name(p), gs, f->duration_ns > 0 ? "for a while" : "for good");
            }
            break;
        case DSIM_FAULT_SLOW:
            if (!st->victim[r])
                break;
            if (!st->fired && fs_triggers_locked(fs, i, r, p, gs, now)) {
                st->fired = true;
                st->t_fire = now;
                fs->stats.fired++;
                fs_event_locked(fs, (int)i, r, now, "fault %zu: rank %d slowed %.1fx", i, r,
                                f->factor);
            }
            if (st->fired && (f->duration_ns == 0 || now < st->t_fire + f->duration_ns) &&
                p == DSIM_PHASE_ALLREDUCE && prev == DSIM_PHASE_COMPUTE && fs->t_compute[r] > 0)
                slow_ns += (int64_t)((f->factor - 1.0) * (double)(now - fs->t_compute[r]));
            break;
        case DSIM_FAULT_STAGGER:
            if (p == DSIM_PHASE_START && st->victim[r]) {
                int w = r / fs->D;
                dsim_rng g;
                dsim_rng_init(&g, fs->seed, "fault.stagger", (uint64_t)w);
                int64_t d = (int64_t)(dsim_rng_uniform(&g) * (double)f->duration_ns);
                if (now + d > sleep_until)
                    sleep_until = now + d;
                if (r % fs->D == 0)
                    fs_event_locked(fs, (int)i, r, now, "fault %zu: worker %d starts %.3f s late",
                                    i, w, (double)d / 1e9);
            }
            break;
        default:
            break;
        }
    }
    if (p == DSIM_PHASE_COMPUTE)
        fs->t_compute[r] = now;
    if (!die && fs->pause_end[r] > now) {
        pause = true;
        if (fs->pause_end[r] > sleep_until)
            sleep_until = fs->pause_end[r];
    }
    dsim_waitq_unlock(fs->q);
    if (fs->n_pending_kill)
        fs_flush_kills(fs);
    if (die)
        return DSIM_HOOK_DIE;
    if (pause && fs->proc.on_pause) {
        /* a process pauses as a whole (SIGSTOP), its peers see silence */
        fs->proc.on_pause(fs->proc.user, r,
                          fs->pause_end[r] == FS_FOREVER ? 0 : fs->pause_end[r] - now);
        dsim_waitq_lock(fs->q);
        fs->pause_end[r] = 0;
        dsim_waitq_unlock(fs->q);
        pause = false;
        sleep_until = slow_ns > 0 ? now + slow_ns : 0;
        now = dsim_rt_now(fs->rt);
    }
    if (slow_ns > 0)
        sleep_until = sleep_until > now + slow_ns ? sleep_until : now + slow_ns;
    if (sleep_until > now) {
        bool revoked = fs_sleep(fs, sleep_until);
        if (pause) {
            dsim_waitq_lock(fs->q);
            int64_t t = dsim_rt_now(fs->rt);
            if (revoked) {
                /* The job gave up on it while it was stuck: as good as dead. */
                fs->dead[r] = true;
                fs_event_locked(fs, -1, r, t, "rank %d was still paused when the job was revoked",
                                r);
                dsim_waitq_unlock(fs->q);
                return DSIM_HOOK_DIE;
            }
            fs->pause_end[r] = 0;
            fs_release_locked(fs, t, r, -1);
            fs_event_locked(fs, -1, r, t, "rank %d resumed", r);
            dsim_waitq_unlock(fs->q);
        }
    }
    return DSIM_HOOK_GO;
}

static int fs_killed(void *user, int r)
{
    dsim_faults *fs = user;
    if (r < 0 || r >= fs->R || !fs->q)
        return 0;
    dsim_waitq_lock(fs->q);
    int k = fs->dead[r] || fs->pause_end[r] == FS_FOREVER;
    dsim_waitq_unlock(fs->q);
    return k;
}

/* ---- life ---- */

dsim_err dsim_faults_create(const dsim_fault *faults, size_t n, uint64_t seed, int hosts,
                            int devices_per_host, int num_ps, dsim_faults **out)
{
    *out = NULL;
    if (hosts < 1 || devices_per_host < 1 || num_ps < 0 || (n && !faults))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_faults_create: bad cluster %d x %d + %d", hosts,
                        devices_per_host, num_ps);
    dsim_faults *fs = calloc(1, sizeof *fs);
    if (!fs)
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
    fs->seed = seed;
    fs->t_loss = -1;
    fs->lost_rank = -1;
    fs->hosts = hosts;
    fs->D = devices_per_host;
    fs->N = hosts * devices_per_host;
    fs->P = num_ps;
    fs->R = fs->N + num_ps;
    fs->n = n;
    size_t R = (size_t)fs->R;
    fs->list = calloc(n ? n : 1, sizeof *fs->list);
    fs->st = calloc(n ? n : 1, sizeof *fs->st);
    fs->dead = calloc(R, sizeof *fs->dead);
    fs->pause_end = calloc(R, sizeof *fs->pause_end);
    fs->phase = calloc(R, sizeof *fs->phase);
    fs->step = calloc(R, sizeof *fs->step);
    fs->t_compute = calloc(R, sizeof *fs->t_compute);
    fs->lcap = 1024;
    fs->links = calloc(fs->lcap, sizeof *fs->links);
    if (!fs->list || !fs->st || !fs->dead || !fs->pause_end || !fs->phase || !fs->step ||
        !fs->t_compute || !fs->links) {
        dsim_faults_destroy(fs);
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory for %d ranks", fs->R);
    }
    for (size_t i = 0; i < n; i++) {
        fs->list[i] = faults[i];
        fs->list[i].phase = NULL;
        if (faults[i].what == DSIM_FAULT_REORDER)
            fs->any_reorder = true;
        if (faults[i].phase && !(fs->list[i].phase = strdup(faults[i].phase))) {
            dsim_faults_destroy(fs);
            return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
        }
        dsim_err e = fs_resolve(fs, i);
        if (e != DSIM_OK) {
            dsim_faults_destroy(fs);
            return e;
        }
    }
    fs->hooks = (dsim_train_hooks){
        .size = sizeof(dsim_train_hooks), .phase = fs_phase, .killed = fs_killed};
    fs->filter = (struct dsim_tp_filter){.size = sizeof(struct dsim_tp_filter),
                                         .attach = fs_attach,
                                         .detach = fs_detach,
                                         .on_deliver = fs_on_deliver,
                                         .on_sent = fs_on_sent,
                                         .conn_stats = fs_conn_stats};
    *out = fs;
    return DSIM_OK;
}

/* The faults' own hook, then the hooks the configuration had before
 * dsim_faults_attach (the harness's phase recorder) for a replica that
 * goes on. */
static dsim_hook_action fs_phase(void *user, int r, dsim_phase p, uint64_t gs)
{
    dsim_faults *fs = user;
    dsim_hook_action a = fs_phase_own(fs, r, p, gs);
    if (a == DSIM_HOOK_GO && fs->next_hooks && fs->next_hooks->phase)
        a = fs->next_hooks->phase(fs->next_user, r, p, gs);
    return a;
}

void dsim_faults_destroy(dsim_faults *fs)
{
    if (!fs)
        return;
    for (size_t i = 0; fs->list && i < fs->n; i++)
        free(fs->list[i].phase);
    for (size_t i = 0; fs->st && i < fs->n; i++)
        free(fs->st[i].victim);
    for (fs_lchunk *c = fs->lchunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(fs->links);
    free(fs->held);
    for (fs_held *h = fs->free_held, *next; h; h = next) {
        next = h->next_free;
        free(h);
    }
    free(fs->list);
    free(fs->st);
    free(fs->dead);
    free(fs->pause_end);
    free(fs->phase);
    free(fs->step);
    free(fs->t_compute);
    free(fs->nic_out_free);
    free(fs->nic_in_free);
    free(fs->conn_n);
    free(fs->conn_slowest);
    free(fs->conn_total);
    free(fs->conn_max);
    free(fs->timers);
    free(fs->ev);
    free(fs);
}

void dsim_faults_set_msg_log(dsim_faults *fs, dsim_msg_log *log)
{
    fs->msgs = log;
}

void dsim_faults_attach(dsim_faults *fs, dsim_train_cfg *cfg)
{
    /* A preemption notice the job has not had yet is the driver's to carry
     * out (dsim_train_cfg.preempt_after). */
    cfg->preempt_after = 0;
    cfg->preempt_grace_steps = 0;
    for (size_t i = 0; i < fs->n; i++) {
        const dsim_fault *f = &fs->list[i];
        if (f->what != DSIM_FAULT_PREEMPT || fs->st[i].done || f->when != DSIM_WHEN_STEP)
            continue;
        if (!cfg->preempt_after || (uint64_t)f->step < cfg->preempt_after) {
            cfg->preempt_after = (uint64_t)(f->step > 0 ? f->step : 1);
            cfg->preempt_grace_steps = (uint64_t)f->grace_steps;
        }
    }
    cfg->transport_filter = &fs->filter;
    cfg->transport_filter_user = fs;
    if (cfg->hooks && cfg->hooks != &fs->hooks) {
        fs->next_hooks = cfg->hooks;
        fs->next_user = cfg->hooks_user;
    }
    cfg->hooks = &fs->hooks;
    cfg->hooks_user = fs;
}

void dsim_faults_rearm_for_restart(dsim_faults *fs)
{
    for (size_t i = 0; i < fs->n; i++) {
        fs_state *st = &fs->st[i];
        /* What fired stays fired (and done); the rest can still fire. */
        if (st->fired)
            st->done = true;
        st->armed = -1;
    }
    for (int r = 0; r < fs->R; r++) {
        fs->dead[r] = false;
        fs->pause_end[r] = 0;
        fs->phase[r] = 0;
        fs->step[r] = 0;
        fs->t_compute[r] = 0;
    }
    free(fs->timers);
    fs->timers = NULL;
    fs->n_timers = 0;
    fs->t_loss = -1;
    fs->loss_unreported = false;
    fs->lost_rank = -1;
}

void dsim_faults_preempted(dsim_faults *fs, uint64_t at_step)
{
    for (size_t i = 0; i < fs->n; i++) {
        const dsim_fault *f = &fs->list[i];
        if (f->what == DSIM_FAULT_PREEMPT && !fs->st[i].done && f->when == DSIM_WHEN_STEP &&
            (uint64_t)f->step <= at_step) {
            fs->st[i].fired = true;
            fs->stats.fired++;
            fs_event_locked(fs, (int)i, -1, fs->t0,
                            "fault %zu: preemption notice after step %lld; the job saved at step "
                            "%llu and stopped to be restarted",
                            i, (long long)f->step, (unsigned long long)at_step);
        }
    }
}

void dsim_faults_set_process_hooks(dsim_faults *fs, const dsim_faults_process_hooks *h)
{
    if (h)
        fs->proc = *h;
    else
        memset(&fs->proc, 0, sizeof fs->proc);
}

void dsim_faults_mark_done(dsim_faults *fs, const bool *done, size_t n)
{
    for (size_t i = 0; i < n && i < fs->n; i++)
        if (done[i]) {
            fs->st[i].fired = true;
            fs->st[i].done = true;
        }
}

void dsim_faults_fired(dsim_faults *fs, bool *done, size_t n)
{
    for (size_t i = 0; i < n && i < fs->n; i++)
        done[i] = fs->st[i].fired || fs->st[i].done;
}

int dsim_faults_first_loss(dsim_faults *fs, int64_t *t_abs)
{
    *t_abs = fs->t_loss;
    return fs->t_loss >= 0 ? fs->lost_rank : -1;
}

size_t dsim_faults_events(dsim_faults *fs, const dsim_fault_event **out)
{
    *out = fs->ev;
    return fs->n_ev;
}

int dsim_faults_rank_lost(dsim_faults *fs, int rank)
{
    if (rank < 0 || rank >= fs->R)
        return 0;
    return fs->dead[rank] || fs->pause_end[rank] == FS_FOREVER;
}

void dsim_faults_get_stats(dsim_faults *fs, dsim_faults_stats *out)
{
    *out = fs->stats;
}

void dsim_faults_stats_add(dsim_faults_stats *sum, const dsim_faults_stats *add)
{
    sum->fired += add->fired;
    sum->frames_seen += add->frames_seen;
    sum->dropped += add->dropped;
    sum->delayed += add->delayed;
    sum->duplicated += add->duplicated;
    sum->corrupted += add->corrupted;
    sum->reordered += add->reordered;
    sum->held += add->held;
    sum->retransmitted += add->retransmitted;
}
