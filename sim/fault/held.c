/* Per-link state and the held frames: a link's state is made on first use
 * (a hash table by src * R + dst), held frames wait in a 4-ary heap by
 * (due, order of holding), and a runtime worker of the job delivers each
 * when it is due, and fires the restarts' revocations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "fault_int.h"

static size_t fs_link_slot(const fs_lslot *tab, size_t cap, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (cap - 1);
    while (tab[i].l && tab[i].key != key)
        i = (i + 1) & (cap - 1);
    return i;
}

fs_link *fs_link_get(dsim_faults *fs, int src, int dst)
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
double fs_draw(dsim_faults *fs, fs_link *l, int src, int dst, double corr)
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
fs_held *fs_heap_take(dsim_faults *fs, size_t i)
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
void fs_hold_insert_locked(dsim_faults *fs, fs_held *h)
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

bool fs_hold_locked(dsim_faults *fs, dsim_ep *ep, const dsim_tp_hdr *hdr, const void *payload,
                    size_t len, int64_t due, int why, fs_link *l)
{
    bool frame = why != FS_HELD_BREAK; /* a break is no frame: not counted */
    fs_held *h = fs_heap_room(fs) ? fs_held_alloc(fs, len) : NULL;
    if (!h) {
        fs->stats.dropped += frame;
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
    fs->stats.held += frame;
    fs_hold_insert_locked(fs, h);
    return true;
}

size_t fs_reordered_at(const dsim_faults *fs, const fs_link *l)
{
    for (size_t i = 0; fs->any_reorder && i < fs->nheld; i++) {
        const fs_held *h = fs->held[i].h;
        if (fs->held[i].due == FS_FOREVER && h->link == l && h->why >= 0 &&
            fs->list[h->why].what == DSIM_FAULT_REORDER)
            return i;
    }
    return fs->nheld;
}

bool fs_hold_break_locked(dsim_faults *fs, dsim_ep *ep, int peer, int blame, dsim_err code,
                          const char *msg, fs_link *l, int64_t now)
{
    /* A reordered frame waits for the link's next frame to pass it: none
     * will come now, so it goes as it is. */
    for (size_t i; (i = fs_reordered_at(fs, l)) < fs->nheld;) {
        fs_held *h = fs_heap_take(fs, i);
        h->due = now;
        h->why = -1;
        fs_hold_insert_locked(fs, h);
    }
    int64_t last = now;
    for (size_t i = 0; i < fs->nheld; i++)
        if (fs->held[i].h->link == l && fs->held[i].due > last)
            last = fs->held[i].due;
    /* Behind a link cut for good the break would wait for ever: it goes
     * now, as before the cut's frames (the receiver learns that its peer
     * closed, as the health check would tell it, and fails at once). */
    if (last == FS_FOREVER)
        return false;
    _Alignas(fs_break) unsigned char buf[sizeof(fs_break) + 512];
    fs_break *b = (fs_break *)(void *)buf;
    size_t n = strnlen(msg, 511);
    b->blame = blame;
    b->code = code;
    memcpy(b->msg, msg, n);
    b->msg[n] = '\0';
    dsim_tp_hdr hdr = {.src = peer, .dst = dsim_ep_rank(ep)};
    l->last_due = last;
    return fs_hold_locked(fs, ep, &hdr, buf, sizeof *b + n + 1, last, FS_HELD_BREAK, l);
}

/* Moves held frames that `pred` selects to `due` (a heal or a pause's end). */
static int fs_held_cmp(const void *a, const void *b)
{
    const fs_hent *x = a, *y = b;
    return fs_hent_before(x, y) ? -1 : fs_hent_before(y, x) ? 1 : 0;
}

void fs_release_locked(dsim_faults *fs, int64_t due, int rank, int why)
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

void fs_worker_main(void *arg)
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
            if (h->why == FS_HELD_BREAK) {
                const fs_break *b = (const fs_break *)(const void *)h->data;
                dsim_tp_peer_lost_held(h->ep, h->hdr.src, b->blame, b->code, b->msg);
            } else {
                /* a held frame arrives when it is handed over */
                dsim_msg_log_arrived(fs->msgs, dsim_ep_rank(h->ep), &h->hdr, now);
                dsim_tp_deliver_held(h->ep, &h->hdr, h->data, h->len);
            }
            dsim_waitq_lock(fs->q);
            h->link->held--;
            fs_held_free(fs, h);
            continue;
        }
        int64_t next = h ? h->due : FS_FOREVER;
        for (size_t t = 0; t < fs->n_timers; t++)
            if (fs->timers[t].pending && fs->timers[t].due < next)
                next = fs->timers[t].due;
        /* The stop may have come while the lock was let go for a restart's
         * abort: its wake found nobody waiting, so look before sleeping
         * (else fs_detach waits for ever on a worker asleep for good). */
        if (fs->stopping)
            break;
        dsim_waitq_wait(fs->q, next);
    }
    dsim_waitq_unlock(fs->q);
}

void fs_held_clear(dsim_faults *fs)
{
    for (size_t i = 0; i < fs->nheld; i++) {
        if (fs->held[i].h->why != FS_HELD_BREAK)
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
}
