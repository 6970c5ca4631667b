/* shm: the rings of small messages, the bells, and the progress thread
 * (shm_int.h has the layout and the protocol). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/fiu_int.h"
#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "shm_int.h"

/* Records handed over per ring before the progress thread looks at the
 * others: fairness between peers. */
#define SHM_BUDGET 64

static long shm_futex(_Atomic uint32_t *word, int op, uint32_t val)
{
    return syscall(SYS_futex, (uint32_t *)word, op, val, NULL, NULL, 0);
}

/* The receiving process needs its progress thread woken: the thread sleeps
 * and no worker of the process reads the rings for it. */
static int shm_needs_wake(shm_rank *b)
{
    return atomic_load_explicit(&b->sleeping, memory_order_seq_cst) &&
           !atomic_load_explicit(&b->assisting, memory_order_seq_cst);
}

/* The host's bell (its leader's entry), NULL if nobody hosts rank yet: its
 * progress thread reads every ring when it starts. The bell moves after
 * whatever the caller published (a tail, a slot state). */
static shm_rank *shm_bell_move(shm_fabric *sf, int rank)
{
    atomic_thread_fence(memory_order_seq_cst);
    int leader = atomic_load_explicit(&sf->ranks[rank].leader, memory_order_relaxed);
    if (leader < 0 || leader >= sf->nranks)
        return NULL;
    shm_rank *b = &sf->ranks[leader];
    atomic_fetch_add_explicit(&b->bell, 1, memory_order_seq_cst);
    return b;
}

static void shm_wake(shm_fabric *sf, shm_rank *b)
{
    shm_count(sf, SHM_ST(wakes), 1);
    shm_futex(&b->bell, FUTEX_WAKE, INT_MAX);
}

void shm_bell_ring(shm_fabric *sf, int rank)
{
    shm_rank *b = shm_bell_move(sf, rank);
    if (b && shm_needs_wake(b))
        shm_wake(sf, b);
}

/* The writer stops half-way through a record, as a process descheduled
 * or stopped there would (a test then kills it). */
static void shm_fault_stop(const char *point)
{
    if (DSIM_FIU(point))
        raise(SIGSTOP);
}

int shm_ring_put(shm_fabric *sf, int from, int to, shm_out *o, const shm_rec *rec,
                 const void *payload, size_t len)
{
    (void)from;
    (void)to;
    size_t ring = sf->hdr->ring_bytes;
    size_t need = shm_align(SHM_REC_HDR + len);
    size_t pos = (size_t)(o->tail & (ring - 1));
    size_t pad = ring - pos < need ? ring - pos : 0;
    uint64_t head = atomic_load_explicit(&o->pair->head, memory_order_acquire);
    if (o->tail + pad + need - head > ring) {
        /* Ask the consumer to ring, then look again: it may have freed
         * room between the two loads and not seen the flag. */
        atomic_store_explicit(&o->pair->want_space, 1, memory_order_seq_cst);
        head = atomic_load_explicit(&o->pair->head, memory_order_seq_cst);
        if (o->tail + pad + need - head > ring)
            return 0;
        atomic_store_explicit(&o->pair->want_space, 0, memory_order_relaxed);
    }
    if (pad) {
        shm_rec *p = (shm_rec *)(o->ring + pos);
        p->kind = SHM_REC_PAD;
        p->size = (uint32_t)pad;
        o->tail += pad;
        pos = 0;
    }
    shm_rec *r = (shm_rec *)(o->ring + pos);
    memcpy(r, rec, sizeof *rec);
    r->size = (uint32_t)need;
    if (len) {
        uint8_t *dst = (uint8_t *)r + SHM_REC_HDR;
        size_t half = len / 2;
        memcpy(dst, payload, half);
        shm_fault_stop("dsim/shm/ring_write");
        memcpy(dst + half, (const uint8_t *)payload + half, len - half);
    }
    o->tail += need;
    atomic_store_explicit(&o->pair->tail, o->tail, memory_order_release);
    return 1;
}

int shm_flush_locked(shm_fabric *sf, int from, int to, shm_out *o)
{
    int moved = 0;
    while (o->qhead && !o->broken) {
        shm_item *it = o->qhead;
        int ok;
        if (it->kind == SHM_ITEM_RTS) {
            ok = shm_rndv_post(sf, from, to, o, &it->hdr, it->payload, it->len, it->req);
        } else {
            shm_rec rec = {.kind = it->kind == SHM_ITEM_DATA ? SHM_REC_DATA : SHM_REC_WITHDRAWN,
                           .len = it->len,
                           .hdr = it->hdr};
            ok = shm_ring_put(sf, from, to, o, &rec, it->payload, it->len);
        }
        if (!ok)
            break;
        o->qhead = it->next;
        if (!o->qhead)
            o->qtail = NULL;
        moved = 1;
        if (it->kind == SHM_ITEM_DATA && it->req)
            dsim_tp_complete(it->req, DSIM_OK);
        free(it);
    }
    if (moved)
        shm_bell_ring(sf, to);
    return moved;
}

/* ---- the consumer ---- */

/* The ring from src can no longer be read: its producer wrote nonsense or
 * another process took it over. Receives from src fail. */
static void shm_in_stuck(shm_fabric *sf, int src, int l, shm_in *in, const char *why)
{
    in->stuck = 1;
    dsim_ep *ep = dsim_tp_fabric_ep(sf->f, l);
    if (!ep)
        return;
    dsim_tp_count_corrupt(ep);
    dsim_tp_peer_lost(ep, src, DSIM_EPROTO,
                      "the shm ring from rank %d to rank %d is corrupt (%s); nothing more is read "
                      "from it",
                      src, l, why);
}

static void shm_deliver(shm_fabric *sf, int l, const shm_rec *r, int withdrawn)
{
    if (atomic_load_explicit(&shm_local_of(sf, l)->closed, memory_order_relaxed))
        return; /* dropped: the endpoint is closed */
    dsim_ep *ep = dsim_tp_fabric_ep(sf->f, l);
    if (!ep)
        return;
    dsim_tp_hdr h;
    memcpy(&h, &r->hdr, sizeof h);
    if (withdrawn) {
        dsim_tp_withdrawn(ep, &h);
        return;
    }
    dsim_tp_deliver(ep, &h, (const uint8_t *)r + SHM_REC_HDR, (size_t)r->len, NULL);
    shm_count(sf, SHM_ST(eager_msgs), 1);
    shm_count(sf, SHM_ST(eager_bytes), r->len);
}

/* Checks the record at in->head against what was published; NULL (and the
 * ring marked stuck) when it cannot be one. */
static const shm_rec *shm_rec_at(shm_fabric *sf, int src, int l, shm_in *in, uint64_t tail)
{
    size_t ring = sf->hdr->ring_bytes;
    size_t pos = (size_t)(in->head & (ring - 1));
    const shm_rec *r = (const shm_rec *)(in->ring + pos);
    uint32_t size = r->size, kind = r->kind;
    const char *bad = NULL;
    if (size < SHM_LINE || size % SHM_LINE || size > ring - pos || size > tail - in->head)
        bad = "a record's size does not fit the ring";
    else if (kind != SHM_REC_PAD && size < SHM_REC_HDR)
        bad = "a record is shorter than its header";
    else if (kind == SHM_REC_DATA && r->len > size - SHM_REC_HDR)
        bad = "a record's payload runs past its end";
    else if (kind < SHM_REC_PAD || kind > SHM_REC_WITHDRAWN)
        bad = "a record of unknown kind";
    if (bad) {
        char why[128];
        snprintf(why, sizeof why, "%s: kind %" PRIu32 ", %" PRIu32 " bytes at offset %zu", bad,
                 kind, size, pos);
        shm_in_stuck(sf, src, l, in, why);
        return NULL;
    }
    return r;
}

int shm_consume(shm_fabric *sf, int src, int l, shm_in *in, int budget)
{
    if (in->stuck)
        return 0;
    uint64_t tail = atomic_load_explicit(&in->pair->tail, memory_order_acquire);
    if (tail == in->head)
        return 0;
    uint32_t gen = atomic_load_explicit(&in->pair->gen, memory_order_acquire);
    if (!in->gen) {
        in->gen = gen;
    } else if (gen != in->gen) {
        char why[96];
        snprintf(why, sizeof why, "its generation went from %08" PRIx32 " to %08" PRIx32, in->gen,
                 gen);
        shm_in_stuck(sf, src, l, in, why);
        return 0;
    }
    int n = 0;
    while (in->head != tail && n < budget && !dsim_fabric_aborted(sf->f)) {
        const shm_rec *r = shm_rec_at(sf, src, l, in, tail);
        if (!r)
            break;
        int finished = 1;
        if (r->kind == SHM_REC_DATA || r->kind == SHM_REC_WITHDRAWN)
            shm_deliver(sf, l, r, r->kind == SHM_REC_WITHDRAWN);
        else if (r->kind == SHM_REC_RTS)
            finished = shm_rndv_recv(sf, src, l, in, r);
        if (!finished || in->stuck)
            break;
        in->head += r->size;
        atomic_store_explicit(&in->pair->head, in->head, memory_order_seq_cst);
        if (atomic_load_explicit(&in->pair->want_space, memory_order_seq_cst)) {
            atomic_store_explicit(&in->pair->want_space, 0, memory_order_relaxed);
            shm_bell_ring(sf, src);
        }
        n++;
    }
    return n;
}

/* ---- the progress thread ---- */

int shm_check_abort(shm_fabric *sf)
{
    if (atomic_load_explicit(&sf->hdr->abort_state, memory_order_acquire) != 2 ||
        dsim_fabric_aborted(sf->f))
        return 0;
    char why[SHM_WHY_MAX];
    memcpy(why, sf->hdr->abort_why, sizeof why);
    why[sizeof why - 1] = '\0';
    dsim_fabric_abort(sf->f, sf->hdr->abort_peer, why);
    return 1;
}

void shm_fail_send(shm_fabric *sf, dsim_req *req, int to, int blame, dsim_err code, const char *msg)
{
    shm_check_abort(sf);
    if (dsim_fabric_aborted(sf->f) &&
        atomic_load_explicit(&sf->hdr->abort_state, memory_order_acquire) == 2) {
        char why[SHM_WHY_MAX];
        memcpy(why, sf->hdr->abort_why, sizeof why);
        why[sizeof why - 1] = '\0';
        int peer = sf->hdr->abort_peer;
        DSIM_ERR(DSIM_EABORTED, peer,
                 "transport aborted (failed rank %d: %s) while sending a message to rank %d", peer,
                 why, to);
        dsim_tp_complete(req, DSIM_EABORTED);
        return;
    }
    DSIM_ERR(code, blame, "%s", msg);
    dsim_tp_complete(req, code);
}

static int shm_poll_sends(shm_fabric *sf, shm_local *L)
{
    if (!atomic_load_explicit(&L->busy, memory_order_acquire))
        return 0;
    int did = 0;
    dsim_waitq_lock(L->sq);
    for (int p = 0; p < sf->nranks; p++) {
        shm_out *o = &L->out[p];
        if (!o->active)
            continue;
        did |= shm_rndv_progress_locked(sf, L->rank, p, o);
        did |= shm_flush_locked(sf, L->rank, p, o);
        shm_out_update_locked(L, o);
    }
    dsim_waitq_unlock(L->sq);
    return did;
}

static int shm_poll(shm_fabric *sf)
{
    /* A poller held up (a test point): a peer's last read and its departure
     * can then both be news at the same look. */
    if (DSIM_FIU("dsim/shm/poll_late")) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int did = shm_check_abort(sf);
    did |= shm_handle_deaths(sf);
    /* Revoked, nothing more is delivered (the shared layer would refuse
     * it), and no large message goes on moving: every one still under way
     * fails as the revoke says, not a moment later as done. */
    int aborted = dsim_fabric_aborted(sf->f);
    for (int i = 0; i <= sf->hi - sf->lo; i++) {
        shm_local *L = &sf->locals[i];
        for (int p = 0; p < sf->nranks && !aborted; p++)
            did |= shm_consume(sf, p, L->rank, &L->in[p], SHM_BUDGET) > 0;
        did |= shm_poll_sends(sf, L);
    }
    return did;
}

static void shm_relax(void)
{
    sched_yield();
}

/* A worker's look at its process's rings, if no other thread holds them:
 * whether it moved anything. */
static int shm_try_poll(shm_fabric *sf)
{
    if (pthread_mutex_trylock(&sf->poll_mu) != 0)
        return 0;
    int did = shm_poll(sf);
    pthread_mutex_unlock(&sf->poll_mu);
    return did;
}

/* A worker stops reading the rings for its process (me: the leader's
 * entry). A sender that saw it assisting published its record before it
 * looked, and did not wake the progress thread: one more look reads it. If
 * the progress thread holds the rings, it is awake, and its bell moved after
 * it read it or its look reads the record. */
static void shm_assist_end(shm_fabric *sf, shm_rank *me)
{
    atomic_fetch_sub_explicit(&me->assisting, 1, memory_order_seq_cst);
    if (shm_try_poll(sf)) {
        /* it may have stopped at its budget with records left */
        atomic_fetch_add_explicit(&me->bell, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&me->sleeping, memory_order_seq_cst))
            shm_wake(sf, me);
    }
}

/* Whether a large send of this process's ranks is being read by its
 * receiver now (a slot CLAIMED, or BOUNCE: the copy has begun), is about to
 * be (POSTED: the receiving process has been rung for it, and its next look
 * claims it, or parks it if no receive waits for it), or has just been
 * (DONE or FAILED: the next look here completes the send; a wait that
 * yielded while the copy ran finds it so), so that the send ends within
 * the time of a copy. */
static int shm_sends_moving(shm_fabric *sf)
{
    for (int i = 0; i <= sf->hi - sf->lo; i++) {
        shm_local *L = &sf->locals[i];
        if (!atomic_load_explicit(&L->busy, memory_order_acquire))
            continue;
        for (int p = 0; p < sf->nranks; p++) {
            shm_pair *pr = shm_pair_of(sf, L->rank, p);
            for (int s = 0; s < SHM_RNDV_SLOTS; s++) {
                uint32_t st = atomic_load_explicit(&pr->rndv[s].state, memory_order_relaxed);
                if (st == SHM_RNDV_POSTED || st == SHM_RNDV_CLAIMED || st == SHM_RNDV_BOUNCE ||
                    st == SHM_RNDV_DONE || st == SHM_RNDV_FAILED)
                    return 1;
            }
        }
    }
    return 0;
}

void shm_wait_assist(dsim_ep *ep, dsim_req *req, int64_t deadline)
{
    shm_fabric *sf = dsim_tp_fabric_priv(dsim_tp_ep_fabric(ep));
    if (sf->assist_ns <= 0)
        return;
    shm_rank *me = &sf->ranks[sf->lo];
    /* the threads engine's clock (dsim_rt_mono_ns) */
    int64_t start = dsim_rt_mono_ns(), until = start + sf->assist_ns;
    int64_t longest =
        start + (sf->assist_ns > SHM_ASSIST_MOVING_NS ? sf->assist_ns : SHM_ASSIST_MOVING_NS);
    if (deadline != DSIM_NO_DEADLINE && deadline < until)
        until = deadline;
    if (deadline != DSIM_NO_DEADLINE && deadline < longest)
        longest = deadline;
    atomic_fetch_add_explicit(&me->assisting, 1, memory_order_seq_cst);
    for (int i = 1; !dsim_req_done(req); i++) {
        int did = shm_try_poll(sf);
        if (dsim_req_done(req)) {
            shm_count(sf, SHM_ST(assisted), 1);
            break;
        }
        /* pause while every rank has a CPU, else yield; sleep where a
         * yield lost the CPU */
        if (!did && !dsim_rt_spin_look(i, sf->nranks))
            break;
        if ((i & 7) != 0)
            continue;
        int64_t now = dsim_rt_mono_ns();
        /* past assist=, go on only while a receiver reads a send of ours:
         * its end is a copy away, and sleeping now would cost a wake-up on
         * each side when it comes */
        if (now >= until && (now >= longest || !shm_sends_moving(sf)))
            break;
    }
    shm_assist_end(sf, me);
}

void shm_bell_ring_send(shm_fabric *sf, int rank, shm_out *o, uint64_t tail)
{
    shm_rank *b = shm_bell_move(sf, rank);
    if (!b || !shm_needs_wake(b))
        return;
    /* a peer busy elsewhere: one send in SHM_GRACE_PROBE looks again */
    if (atomic_load_explicit(&o->grace_misses, memory_order_relaxed) >= SHM_GRACE_MISSES &&
        atomic_fetch_add_explicit(&o->grace_skipped, 1, memory_order_relaxed) % SHM_GRACE_PROBE !=
            SHM_GRACE_PROBE - 1) {
        shm_wake(sf, b);
        return;
    }
    shm_count(sf, SHM_ST(graces), 1);
    /* In an exchange both workers send and then wait: the peer is about to
     * read the rings itself (shm_wait_assist), or already has and took the
     * record. For up to SHM_WAKE_GRACE_NS this worker reads its own rings
     * as an assisting one does (so that the peer, in the same place, need
     * not wake this process either) and looks again: each look is the test
     * above, or the record gone (someone read it), so a skipped wake is as
     * sound as there. A wake costs both processes a system call and the
     * receiver a context switch: a 2-rank 8-byte exchange of processes on
     * 2 CPUs took several times as long with one per send. */
    shm_rank *me = &sf->ranks[sf->lo];
    atomic_fetch_add_explicit(&me->assisting, 1, memory_order_seq_cst);
    int64_t until = dsim_rt_mono_ns() + SHM_WAKE_GRACE_NS;
    int wake = 1;
    for (int i = 1;; i++) {
        if (!shm_needs_wake(b) ||
            atomic_load_explicit(&o->pair->head, memory_order_seq_cst) >= tail) {
            wake = 0;
            break;
        }
        if (i > 1 && dsim_rt_mono_ns() >= until)
            break;
        if (!shm_try_poll(sf) && !dsim_rt_spin_look(i, sf->nranks))
            break;
    }
    uint32_t m = atomic_load_explicit(&o->grace_misses, memory_order_relaxed);
    if (wake)
        shm_wake(sf, b);
    /* relaxed: two senders racing only blur the count */
    atomic_store_explicit(&o->grace_misses,
                          !wake                  ? 0
                          : m < SHM_GRACE_MISSES ? m + 1
                                                 : m,
                          memory_order_relaxed);
    shm_assist_end(sf, me);
}

void *shm_progress_main(void *arg)
{
    shm_fabric *sf = arg;
    shm_rank *me = &sf->ranks[sf->lo];
    int64_t idle_since = -1;
    unsigned placed = ~0u;
    dsim_rt_follow_workers(&placed);
    while (!atomic_load_explicit(&sf->stop, memory_order_acquire)) {
        uint32_t seen = atomic_load_explicit(&me->bell, memory_order_seq_cst);
        pthread_mutex_lock(&sf->poll_mu);
        int did = shm_poll(sf);
        pthread_mutex_unlock(&sf->poll_mu);
        if (did) {
            idle_since = -1;
            continue;
        }
        dsim_rt_follow_workers(&placed);
        if (sf->spin_ns > 0) {
            int64_t now = dsim_rt_mono_ns();
            if (idle_since < 0)
                idle_since = now;
            if (now - idle_since < sf->spin_ns) {
                shm_relax();
                continue;
            }
        }
        idle_since = -1;
        atomic_store_explicit(&me->sleeping, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&me->bell, memory_order_seq_cst) == seen &&
            !atomic_load_explicit(&sf->stop, memory_order_acquire)) {
            shm_count(sf, SHM_ST(sleeps), 1);
            shm_futex(&me->bell, FUTEX_WAIT, seen);
        }
        atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
    }
    return NULL;
}
