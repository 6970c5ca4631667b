/* shm: large messages (longer than eager_max), by rendezvous.
 *
 *   sender                                  receiver's progress thread
 *   ------                                  --------------------------
 *   slot = {addr, len, id}; POSTED
 *   RTS(slot, id, hdr) into the ring ─────> CAS POSTED -> CLAIMED (or it
 *                                             was WITHDRAWN: the header only)
 *                                           same process: hand over straight
 *                                             from addr
 *                                           else process_vm_readv(pid, addr)
 *                                             into the staging buffer, hand
 *                                             over; DONE
 *                                           EPERM (or cma=off): BOUNCE
 *   progress thread: copies the message  ─> copies it out as it comes, hands
 *     into the pair's bounce buffer            over once whole; DONE
 *     as room frees
 *   DONE: the send completes; FREE   <───── bell
 *
 * One copy: once a read of a peer's memory has worked (the first large
 * message from it goes through a staging buffer, so that a refusal is
 * found before any message depends on it) and no fault filter or checksum
 * needs the payload whole first, the message is read straight into the
 * receive that takes it (dsim_tp_deliver_pull): a plain receive in one
 * read, a reducing one in pieces (piece=) reduced while in cache, one that
 * is not posted yet into the buffer it waits in. Otherwise it lands in the
 * staging buffer and is copied (or reduced) from there. A read cut short
 * by the sender's death delivers nothing: the staging path hands nothing
 * over, the direct path posts the receive again, stops reading that ring,
 * and lets the news of the death fail it. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "core/fiu_int.h"
#include "dsim/log.h"
#include "shm_int.h"

/* The sender publishes bounce bytes in chunks of this share of the buffer,
 * so that the receiver copies one out while the next goes in. */
#define SHM_BOUNCE_CHUNKS 4

static void shm_fault_stop(const char *point)
{
    if (DSIM_FIU(point))
        raise(SIGSTOP);
}

/* ---- sender ---- */

int shm_rndv_post(shm_fabric *sf, int from, int to, shm_out *o, const dsim_tp_hdr *hdr,
                  const void *payload, size_t len, dsim_req *req)
{
    int s = -1;
    for (int i = 0; i < SHM_RNDV_SLOTS && s < 0; i++)
        if (!o->slot[i].req &&
            atomic_load_explicit(&o->pair->rndv[i].state, memory_order_acquire) == SHM_RNDV_FREE)
            s = i;
    if (s < 0)
        return 0; /* every slot in use: DONE or a freed withdrawal rings */
    shm_rndv *d = &o->pair->rndv[s];
    d->addr = (uint64_t)(uintptr_t)payload;
    d->len = len;
    d->id = ++o->next_id;
    d->err = 0;
    atomic_store_explicit(&d->state, SHM_RNDV_POSTED, memory_order_release);
    shm_rec rec = {.kind = SHM_REC_RTS, .len = len, .slot = (uint32_t)s, .id = d->id, .hdr = *hdr};
    if (!shm_ring_put(sf, from, to, o, &rec, NULL, 0)) {
        /* Nobody can have seen it: the RTS is what names the slot. */
        atomic_store_explicit(&d->state, SHM_RNDV_FREE, memory_order_relaxed);
        return 0;
    }
    o->slot[s] = (shm_slot){.req = req, .buf = payload, .len = len, .pushed = 0};
    o->outstanding++;
    return 1;
}

int shm_rndv_cancel_locked(shm_out *o, dsim_req *req)
{
    for (int i = 0; i < SHM_RNDV_SLOTS; i++) {
        if (o->slot[i].req != req)
            continue;
        /* Posted, parked unread, or coming through the bounce buffer,
         * which only this process reads from the buffer: it can be taken
         * back. Claimed, the receiver is reading it and finishes soon. */
        uint32_t exp = SHM_RNDV_POSTED;
        if (!atomic_compare_exchange_strong(&o->pair->rndv[i].state, &exp, SHM_RNDV_WITHDRAWN) &&
            ((exp != SHM_RNDV_BOUNCE && exp != SHM_RNDV_PARKED) ||
             !atomic_compare_exchange_strong(&o->pair->rndv[i].state, &exp, SHM_RNDV_WITHDRAWN)))
            return 0;
        o->slot[i].req = NULL;
        o->outstanding--;
        return 1;
    }
    return 0;
}

/* Copies what fits of slot s's message into the pair's bounce buffer. */
static int shm_push(shm_fabric *sf, int to, shm_out *o, shm_slot *sl)
{
    size_t B = sf->hdr->bounce_bytes, chunk = B / SHM_BOUNCE_CHUNKS;
    uint64_t w = atomic_load_explicit(&o->pair->b_written, memory_order_relaxed);
    uint64_t r = atomic_load_explicit(&o->pair->b_read, memory_order_acquire);
    int moved = 0;
    while (sl->pushed < sl->len && w - r < B) {
        size_t pos = (size_t)(w % B);
        size_t n = B - (size_t)(w - r);
        if (n > B - pos)
            n = B - pos;
        if (n > chunk)
            n = chunk;
        if (n > sl->len - sl->pushed)
            n = sl->len - sl->pushed;
        memcpy(o->bounce + pos, (const uint8_t *)sl->buf + sl->pushed, n);
        sl->pushed += n;
        w += n;
        atomic_store_explicit(&o->pair->b_written, w, memory_order_release);
        shm_bell_ring(sf, to);
        moved = 1;
        if (sl->pushed * 2 >= sl->len && sl->pushed < sl->len)
            shm_fault_stop("dsim/shm/push");
    }
    return moved;
}

int shm_rndv_progress_locked(shm_fabric *sf, int from, int to, shm_out *o)
{
    (void)from;
    int did = 0;
    for (int i = 0; i < SHM_RNDV_SLOTS && o->outstanding > 0; i++) {
        shm_slot *sl = &o->slot[i];
        if (!sl->req)
            continue;
        shm_rndv *d = &o->pair->rndv[i];
        uint32_t st = atomic_load_explicit(&d->state, memory_order_acquire);
        if (st == SHM_RNDV_BOUNCE) {
            if (!dsim_fabric_aborted(sf->f))
                did |= shm_push(sf, to, o, sl);
            continue;
        }
        if (st != SHM_RNDV_DONE && st != SHM_RNDV_FAILED)
            continue;
        dsim_req *req = sl->req;
        sl->req = NULL;
        o->outstanding--;
        dsim_err err = st == SHM_RNDV_DONE ? DSIM_OK : (dsim_err)d->err;
        atomic_store_explicit(&d->state, SHM_RNDV_FREE, memory_order_release);
        did = 1;
        if (err == DSIM_OK) {
            dsim_tp_complete(req, DSIM_OK);
            continue;
        }
        char msg[160];
        snprintf(msg, sizeof msg,
                 err == DSIM_EPEER
                     ? "rank %d closed its endpoint before taking the %zu-byte message"
                     : "rank %d could not read the %zu-byte message",
                 to, sl->len);
        shm_fail_send(sf, req, to, to, err, msg);
    }
    return did;
}

/* ---- receiver ---- */

void shm_stage_free(shm_fabric *sf)
{
    free(sf->stage);
    sf->stage = NULL;
    sf->stage_cap = 0;
    free(sf->piece);
    sf->piece = NULL;
}

/* Makes *buf hold at least len bytes (kept between messages: a fresh
 * buffer of megabytes costs its page faults every time). */
static int shm_stage_grow(uint8_t **buf, size_t *cap, size_t len)
{
    if (len <= *cap)
        return 1;
    free(*buf);
    *cap = 0;
    *buf = malloc(len);
    if (!*buf)
        return 0;
    *cap = len;
    return 1;
}

static int shm_stage(shm_fabric *sf, size_t len)
{
    return shm_stage_grow(&sf->stage, &sf->stage_cap, len);
}

/* Reads n bytes at offset off of the sender's len-byte message at addr:
 * 0, or the errno. The read stops at the message's middle, so that a test
 * can stop the reader there (dsim/shm/pull). */
static int shm_cma_read(pid_t pid, uint8_t *dst, uint64_t addr, size_t off, size_t n, size_t len)
{
    size_t half = len / 2, done = 0;
    while (done < n) {
        size_t at = off + done, want = n - done;
        if (at < half && at + want > half)
            want = half - at;
        struct iovec l = {.iov_base = dst + done, .iov_len = want};
        struct iovec r = {.iov_base = (void *)(uintptr_t)(addr + at), .iov_len = want};
        ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return errno;
        if (got == 0)
            return ESRCH;
        done += (size_t)got;
        if (off + done == half && half > 0)
            shm_fault_stop("dsim/shm/pull");
    }
    return 0;
}

static void shm_cma_counted(shm_fabric *sf, int src, int l, size_t len, pid_t pid)
{
    shm_count(sf, SHM_ST(cma_msgs), 1);
    shm_count(sf, SHM_ST(cma_bytes), len);
    if (!atomic_exchange(&sf->logged_cma, 1))
        dsim_info("shm: rank %d read a %zu-byte message from rank %d (process %d) by "
                  "cross-memory attach (process_vm_readv)",
                  l, len, src, (int)pid);
}

/* A parked message's first read takes the slot back from PARKED, unless
 * its sender withdrew it meanwhile (ECANCELED). */
static int shm_pull_read(void *ctx, void *dst, size_t off, size_t n)
{
    const shm_pull_ctx *c = ctx;
    if (c->parked && off == 0) {
        uint32_t exp = SHM_RNDV_PARKED;
        if (!atomic_compare_exchange_strong(&c->in->pair->rndv[c->slot].state, &exp,
                                            SHM_RNDV_CLAIMED))
            return ECANCELED;
    }
    int err = shm_cma_read(c->pid, dst, c->addr, off, n, c->len);
    shm_count(c->sf, SHM_ST(cma_reads), 1);
    if (err == 0 && off + n == c->len) {
        /* Counted before the receive completes, so that whoever it wakes
         * finds it counted. */
        shm_cma_counted(c->sf, c->src, c->l, c->len, c->pid);
        shm_count(c->sf, SHM_ST(cma_direct), 1);
    }
    return err;
}

/* Finishes the slot and tells the sender. */
static void shm_slot_end(shm_fabric *sf, int src, shm_rndv *d, uint32_t state, dsim_err err)
{
    d->err = (uint32_t)err;
    atomic_store_explicit(&d->state, state, memory_order_release);
    shm_bell_ring(sf, src);
}

static void shm_hand_over(shm_fabric *sf, int l, const shm_rec *rec, const void *data, size_t len)
{
    dsim_ep *ep = dsim_tp_fabric_ep(sf->f, l);
    if (!ep)
        return;
    dsim_tp_hdr h;
    memcpy(&h, &rec->hdr, sizeof h);
    dsim_tp_deliver(ep, &h, data, len, NULL);
}

/* The message cannot be handed over: its header keeps the sequence. */
static void shm_drop(shm_fabric *sf, int l, const shm_rec *rec)
{
    dsim_ep *ep = dsim_tp_fabric_ep(sf->f, l);
    if (!ep)
        return;
    dsim_tp_hdr h;
    memcpy(&h, &rec->hdr, sizeof h);
    dsim_tp_withdrawn(ep, &h);
}

/* Parks the message (dsim_tp_pull.park): its slot waits PARKED until a
 * receive reads it or it is dropped. */
static void *shm_park_msg(void *ctx)
{
    const shm_pull_ctx *c = ctx;
    shm_in *in = c->in;
    if (atomic_load_explicit(&in->parked, memory_order_relaxed) >= SHM_PARK_MAX)
        return NULL;
    shm_pull_ctx *pk = &in->park[c->slot];
    *pk = *c;
    pk->parked = 1;
    atomic_fetch_add_explicit(&in->parked, 1, memory_order_relaxed);
    atomic_store_explicit(&in->pair->rndv[c->slot].state, SHM_RNDV_PARKED, memory_order_release);
    return pk;
}

/* The parked message is over (dsim_tp_pull.release): tells the sender. Its
 * entry may be reused as soon as the slot is free again, so everything is
 * read out of it first. */
static void shm_parked_release(void *ctx, int how)
{
    shm_pull_ctx c = *(const shm_pull_ctx *)ctx;
    shm_fabric *sf = c.sf;
    shm_rndv *d = &c.in->pair->rndv[c.slot];
    atomic_fetch_sub_explicit(&c.in->parked, 1, memory_order_relaxed);
    if (how == 0) {
        shm_slot_end(sf, c.src, d, SHM_RNDV_DONE, DSIM_OK); /* counted as it was read */
        return;
    }
    if (how == DSIM_TP_PULL_DROPPED || how == DSIM_TP_PULL_REFUSED) {
        /* unread: the sender may be withdrawing it just now */
        uint32_t exp = SHM_RNDV_PARKED;
        d->err = how == DSIM_TP_PULL_REFUSED ? (uint32_t)DSIM_EPEER : 0;
        if (atomic_compare_exchange_strong(
                &d->state, &exp, how == DSIM_TP_PULL_REFUSED ? SHM_RNDV_FAILED : SHM_RNDV_DONE)) {
            shm_bell_ring(sf, c.src);
            return;
        }
        how = ECANCELED; /* it was withdrawn */
    }
    if (how == ECANCELED) {
        atomic_store_explicit(&d->state, SHM_RNDV_FREE, memory_order_release);
        shm_bell_ring(sf, c.src); /* a send may be waiting for a slot */
        return;
    }
    if (how == ESRCH) {
        shm_mark_dead(sf, c.src);
        return;
    }
    shm_slot_end(sf, c.src, d, SHM_RNDV_FAILED, DSIM_EIO);
}

/* Reads the claimed message by CMA straight into the receive that takes it
 * (dsim_tp_deliver_pull): 1 done with, 0 not possible here (no fault
 * filter may look at it first, no checksum is to be verified, and a read
 * of the sender's memory has worked before, so that a refusal never comes
 * after the message took its sequence number). */
static int shm_pull_direct(shm_fabric *sf, int src, int l, shm_in *in, const shm_rec *rec,
                           shm_rndv *d, pid_t pid)
{
    if (!in->cma_ok || sf->cma_staged || (!sf->piece && !(sf->piece = malloc(sf->piece_len))))
        return 0;
    dsim_ep *ep = dsim_tp_fabric_ep(sf->f, l);
    if (!ep)
        return 0;
    size_t len = (size_t)d->len;
    shm_pull_ctx c = {.sf = sf,
                      .in = in,
                      .src = src,
                      .l = l,
                      .pid = pid,
                      .addr = d->addr,
                      .len = len,
                      .slot = rec->slot};
    dsim_tp_pull p = {.read = shm_pull_read,
                      .ctx = &c,
                      .scratch = sf->piece,
                      .scratch_len = sf->piece_len,
                      .park = sf->park_off ? NULL : shm_park_msg,
                      .release = shm_parked_release};
    dsim_tp_hdr h;
    memcpy(&h, &rec->hdr, sizeof h);
    dsim_err e = dsim_tp_deliver_pull(ep, &h, len, &p);
    if (e == DSIM_ENOTSUP)
        return 0;
    if (p.parked)
        return 1; /* its release tells the sender */
    if (e != DSIM_EIO) {
        shm_slot_end(sf, src, d, SHM_RNDV_DONE, DSIM_OK); /* counted as it was read */
        return 1;
    }
    /* Its sequence number is used up and its receive posted again: nothing
     * more is read from this ring, and the loss of the sender fails it. */
    in->stuck = 1;
    if (p.err == ESRCH) {
        shm_mark_dead(sf, src);
        return 1;
    }
    shm_slot_end(sf, src, d, SHM_RNDV_FAILED, DSIM_EIO);
    dsim_tp_peer_lost(ep, src, DSIM_EIO,
                      "shm: rank %d cannot read a %zu-byte message from rank %d (process_vm_readv: "
                      "%s); nothing more is read from it",
                      l, len, src, strerror(p.err));
    return 1;
}

/* Reads the claimed message by CMA: 1 handed over (or its sender gone), 0
 * refused (bounce instead). */
static int shm_pull_cma(shm_fabric *sf, int src, int l, shm_in *in, const shm_rec *rec, shm_rndv *d)
{
    size_t len = (size_t)d->len;
    pid_t pid = (pid_t)atomic_load(&sf->ranks[src].pid);
    if (shm_pull_direct(sf, src, l, in, rec, d, pid))
        return 1;
    if (!shm_stage(sf, len)) {
        dsim_error_log("shm: rank %d: out of memory for a %zu-byte message from rank %d", l, len,
                       src);
        shm_drop(sf, l, rec);
        shm_slot_end(sf, src, d, SHM_RNDV_FAILED, DSIM_ENOMEM);
        return 1;
    }
    int err = shm_cma_read(pid, sf->stage, d->addr, 0, len, len);
    if (err == 0) {
        /* All of it is here: the sender's buffer is its own again before
         * the hand-over, not after. */
        in->cma_ok = 1;
        shm_slot_end(sf, src, d, SHM_RNDV_DONE, DSIM_OK);
        shm_cma_counted(sf, src, l, len, pid);
        shm_hand_over(sf, l, rec, sf->stage, len);
        return 1;
    }
    if (err == ESRCH) {
        /* Its process is gone: nothing is handed over, and the watcher's
         * news may not have come yet. */
        shm_mark_dead(sf, src);
        return 1;
    }
    if (err == EPERM || err == ENOSYS || err == EACCES) {
        atomic_store(&in->pair->no_cma, 1);
        shm_count(sf, SHM_ST(cma_refused), 1);
        dsim_warn("shm: rank %d may not read rank %d's memory (process_vm_readv: %s; Yama's "
                  "ptrace_scope or a seccomp filter); its large messages come through the bounce "
                  "buffer",
                  l, src, strerror(err));
        return 0;
    }
    dsim_error_log("shm: rank %d cannot read a %zu-byte message from rank %d: %s", l, len, src,
                   strerror(err));
    shm_drop(sf, l, rec);
    shm_slot_end(sf, src, d, SHM_RNDV_FAILED, DSIM_EIO);
    return 1;
}

/* Copies what the sender has put into the bounce buffer. */
static void shm_bounce_pull(shm_fabric *sf, int src, shm_in *in, size_t len)
{
    size_t B = sf->hdr->bounce_bytes;
    uint64_t w = atomic_load_explicit(&in->pair->b_written, memory_order_acquire);
    uint64_t r = atomic_load_explicit(&in->pair->b_read, memory_order_relaxed);
    int moved = 0;
    while (r < w && in->got < len) {
        size_t pos = (size_t)(r % B);
        size_t n = (size_t)(w - r);
        if (n > B - pos)
            n = B - pos;
        if (n > len - in->got)
            n = len - in->got;
        memcpy(in->stage + in->got, in->bounce + pos, n);
        in->got += n;
        r += n;
        moved = 1;
        if (in->got * 2 >= len && in->got < len)
            shm_fault_stop("dsim/shm/pull");
    }
    if (moved) {
        atomic_store_explicit(&in->pair->b_read, r, memory_order_release);
        shm_bell_ring(sf, src);
    }
}

/* Claims the slot the RTS names: 1 claimed, 0 finished with otherwise. */
static int shm_claim_slot(shm_fabric *sf, int src, int l, shm_in *in, const shm_rec *rec,
                          shm_rndv *d)
{
    uint32_t exp = SHM_RNDV_POSTED;
    if (atomic_compare_exchange_strong(&d->state, &exp, SHM_RNDV_CLAIMED)) {
        if (d->id == rec->id && d->len == rec->len)
            return 1;
        in->stuck = 1;
        shm_drop(sf, l, rec);
        shm_slot_end(sf, src, d, SHM_RNDV_FAILED, DSIM_EPROTO);
        dsim_error_log("shm: rank %d: rank %d's rendezvous slot %" PRIu32 " does not match its "
                       "RTS (id %" PRIu64 "/%" PRIu64 ", %" PRIu64 "/%" PRIu64 " bytes)",
                       l, src, rec->slot, d->id, rec->id, d->len, rec->len);
        return 0;
    }
    if (exp == SHM_RNDV_WITHDRAWN) {
        shm_drop(sf, l, rec);
        atomic_store_explicit(&d->state, SHM_RNDV_FREE, memory_order_release);
        shm_bell_ring(sf, src); /* a send may be waiting for a slot */
        return 0;
    }
    in->stuck = 1;
    dsim_error_log("shm: rank %d: rank %d's rendezvous slot %" PRIu32 " is in state %" PRIu32
                   ", not posted",
                   l, src, rec->slot, exp);
    return 0;
}

/* The sender withdrew a message it was sending through the bounce buffer
 * (its wait ran out, or the job was revoked): what it put there is skipped,
 * so that the next message starts where the sender starts it, and only
 * the header is handed over. */
static int shm_bounce_withdrawn(shm_fabric *sf, int src, int l, shm_in *in, const shm_rec *rec,
                                shm_rndv *d)
{
    uint64_t w = atomic_load_explicit(&in->pair->b_written, memory_order_acquire);
    atomic_store_explicit(&in->pair->b_read, w, memory_order_release);
    in->bouncing = 0;
    shm_drop(sf, l, rec);
    atomic_store_explicit(&d->state, SHM_RNDV_FREE, memory_order_release);
    shm_bell_ring(sf, src);
    return 1;
}

static int shm_bounce_recv(shm_fabric *sf, int src, int l, shm_in *in, const shm_rec *rec,
                           shm_rndv *d)
{
    size_t len = (size_t)rec->len;
    if (atomic_load_explicit(&d->state, memory_order_acquire) == SHM_RNDV_WITHDRAWN)
        return shm_bounce_withdrawn(sf, src, l, in, rec, d);
    shm_bounce_pull(sf, src, in, len);
    if (in->got < len || dsim_fabric_aborted(sf->f))
        return 0; /* revoked meanwhile: it stays the sender's, to withdraw */
    /* Whole: it is the sender's until this CAS, which a withdrawal may
     * win; after it the sender's buffer is its own again. */
    uint32_t exp = SHM_RNDV_BOUNCE;
    if (!atomic_compare_exchange_strong(&d->state, &exp, SHM_RNDV_DONE))
        return shm_bounce_withdrawn(sf, src, l, in, rec, d);
    if (shm_is_local(sf, src)) {
        /* This thread is the sender's progress too: its send is done now,
         * not after the hand-over. */
        shm_local *L = shm_local_of(sf, src);
        dsim_waitq_lock(L->sq);
        shm_rndv_progress_locked(sf, src, l, &L->out[l]);
        shm_out_update_locked(L, &L->out[l]);
        dsim_waitq_unlock(L->sq);
    } else {
        shm_bell_ring(sf, src);
    }
    in->bouncing = 0;
    shm_count(sf, SHM_ST(bounce_msgs), 1);
    shm_count(sf, SHM_ST(bounce_bytes), len);
    shm_hand_over(sf, l, rec, in->stage, len);
    if (!atomic_exchange(&sf->logged_bounce, 1))
        dsim_info("shm: rank %d received a %zu-byte message from rank %d through the bounce "
                  "buffer",
                  l, len, src);
    return 1;
}

int shm_rndv_recv(shm_fabric *sf, int src, int l, shm_in *in, const shm_rec *rec)
{
    if (rec->slot >= SHM_RNDV_SLOTS) {
        in->stuck = 1;
        dsim_error_log("shm: rank %d: an RTS from rank %d names slot %" PRIu32, l, src, rec->slot);
        return 0;
    }
    shm_rndv *d = &in->pair->rndv[rec->slot];
    size_t len = (size_t)rec->len;
    if (!in->bouncing) {
        if (!shm_claim_slot(sf, src, l, in, rec, d))
            return !in->stuck;
        if (atomic_load_explicit(&shm_local_of(sf, l)->closed, memory_order_relaxed)) {
            shm_slot_end(sf, src, d, SHM_RNDV_FAILED, DSIM_EPEER);
            return 1;
        }
        if (shm_is_local(sf, src) && !sf->cma_off) {
            /* One address space: straight from the sender's buffer (cma=off
             * sends these through the bounce buffer too, which tests it). */
            shm_count(sf, SHM_ST(local_msgs), 1);
            shm_count(sf, SHM_ST(local_bytes), len);
            shm_hand_over(sf, l, rec, (const void *)(uintptr_t)d->addr, len);
            shm_slot_end(sf, src, d, SHM_RNDV_DONE, DSIM_OK);
            return 1;
        }
        if (!sf->cma_off && !atomic_load(&in->pair->no_cma) && shm_pull_cma(sf, src, l, in, rec, d))
            return 1;
        if (!shm_stage_grow(&in->stage, &in->stage_cap, len)) {
            dsim_error_log("shm: rank %d: out of memory for a %zu-byte message from rank %d", l,
                           len, src);
            shm_drop(sf, l, rec);
            shm_slot_end(sf, src, d, SHM_RNDV_FAILED, DSIM_ENOMEM);
            return 1;
        }
        in->bouncing = 1;
        in->got = 0;
        shm_slot_end(sf, src, d, SHM_RNDV_BOUNCE, DSIM_OK);
    }
    return shm_bounce_recv(sf, src, l, in, rec, d);
}
