/* Running one step of a collective: posting, waiting, and saying what went
 * wrong.
 *
 * Tags: (call number mod 0xFFFFF) << 12 | (step mod 0xFFF). Every message of
 * a call carries the call number, so a late message from a failed call stays
 * unmatched instead of feeding a later call; the step in the low bits turns a
 * disagreement between ranks about the algorithm into a timeout with a clear
 * message instead of silently combining the wrong chunks. Step 0xFFF is the
 * failure check's own. The call field never reaches 0xFFFFF, so no tag is
 * DSIM_ANY_TAG.
 *
 * The call field repeats every 0xFFFFF calls, and a message of a failed call
 * can sit unmatched for ever (its receiver gave up on it). So each time the
 * field wraps, dsim_coll_begin raises the communicator's transport epoch to
 * call / 0xFFFFF, which drops every message of the calls before: every rank
 * does so at the same call, and no call that succeeded leaves a message
 * unreceived, so only stale ones go.
 *
 * Failure check. A timeout only tells a rank which peer it was waiting for,
 * and that peer is often alive but itself stuck behind the rank that really
 * failed (in a ring, rank 1 waits for rank 0, which waits for the absent
 * rank 3). So after a timeout every rank that timed out sends each peer the
 * rank it was waiting for, and listens for the same from every peer for a
 * short grace period. Following "waits for" from this rank's own awaited peer
 * through the ranks that answered ends at a rank that did not answer: the
 * one that never joined the call or is down, and the one the error names.
 * If the chain loops, everyone is alive and a message was lost or delayed;
 * the error then names the awaited peer. Answers also go out under the
 * previous call's tag, so that a rank still finishing that call (a rooted
 * collective waiting for its answers, below) answers and the chain runs on
 * through it. Each answer carries the fingerprint of the rank's call: one
 * of the same call that differs names a mismatch. The communicator stays
 * usable: the check aborts nothing (a mismatch does, below).
 *
 * Fingerprints (ARCHITECTURE.md §8). The first time a rank sends to a peer in
 * a call, its fingerprint (32 bytes) rides on that payload frame as the
 * transport's sideband (dsim_isend_side): no message, lock or wake-up of
 * its own. The peer reads it from the receive that took the payload
 * (dsim_wait_side) and checks it at once, before the step ends, so nothing
 * that came from a rank that disagrees is ever sent on or returned. A pair
 * exchanges one fingerprint per call, along its first data; every
 * collective's data connects all its ranks, so when the ranks run the same
 * algorithm any disagreement is found on the first pair that disagrees.
 * Empty transfers count: one that carries a fingerprint goes as an empty
 * frame (only then; both sides plan alike, step_fp_plan), so which pairs
 * exchange fingerprints depends on the algorithm, the rank count and the
 * root, never on the count or the dtype. A payload that came without one
 * where one was due is from a rank without fingerprints: an error.
 *
 * Ranks that disagree so much that they run different algorithms wait for
 * messages that never come. A first receive from a peer that takes longer
 * than STEP_PROBE_NS looks whether that peer's fingerprint arrived anyway,
 * on a frame of this call under another step's tag (dsim_ep_peek_side), and
 * differs (step_wait_probing); a payload of the wrong size is judged by the
 * fingerprint it carried, at once. A look that fails because the peer has
 * gone (or a frame of it was lost) is no verdict on the payload: a peer
 * that sent its part and ended at once is seen to end at the same look at
 * the rings as its part arrives, so the payload is looked for again
 * (step_payload_came). Ranks that disagree on a root would all
 * finish without ever meeting, so rooted collectives (x->fp_both) send
 * their fingerprint as a message of its own (step 0xFFE of the call's tag)
 * to every new peer, and wait for the answers; while waiting they look for
 * a sideband too (a peer in an unrooted collective of the same number sends
 * no such message). What is left shows at the timeout: the failure check's
 * answers carry fingerprints, and a rank in another call is named.
 *
 * The rank that finds a mismatch fails with both fingerprints and aborts
 * the fabric with the same text, which ends every other rank's wait at once:
 * a desynchronised job cannot go on. Cost: 32 bytes more on the first
 * frame to each peer (tcp: on the wire, under the checksum), and a rooted
 * collective's answers (tests/coll/bench_allreduce --fingerprint-cost
 * measures it against communicators without fingerprints). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_int.h"
#include "core/fiu_int.h"
#include "dsim/spi/rt.h"

/* A fingerprint is exactly what a frame's sideband carries. */
_Static_assert(sizeof(dsim_coll_fp) == DSIM_TP_SIDE_LEN, "a fingerprint fills the sideband");

#define STEP_FC_STEP 0xFFFu
#define STEP_FP_STEP 0xFFEu
#define STEP_CALLS   0xFFFFFu /* call numbers one epoch's tags tell apart */
#define STEP_STACK   8
/* How long a first receive from a peer waits before looking whether that
 * peer's fingerprint arrived and differs (step_wait_probing). */
#define STEP_PROBE_NS (20 * 1000000LL)

static uint32_t step_tag(uint64_t call, uint32_t step)
{
    /* Algorithm steps wrap below the two reserved ones. */
    return ((uint32_t)(call % STEP_CALLS) << 12) |
           (step >= STEP_FP_STEP && step <= STEP_FC_STEP ? step : step % STEP_FP_STEP);
}

/* The recorder's slot for call number `call`, growing the ring while it
 * is smaller than its size; NULL when there is none (or no memory). */
static dsim_fr_entry *step_fr_slot(dsim_comm *c, uint64_t call)
{
    if (!c->fr_max)
        return NULL;
    if (call < c->fr_max && call >= c->fr_cap) {
        size_t ncap = c->fr_cap ? 2 * c->fr_cap : 16;
        if (ncap > c->fr_max)
            ncap = c->fr_max;
        dsim_fr_entry *n = realloc(c->fr, ncap * sizeof *n);
        if (!n)
            return NULL;
        c->fr = n;
        c->fr_cap = ncap;
    }
    return &c->fr[call % c->fr_max];
}

/* Marks the call started in the recorder (its first transfer is posted). */
static void step_fr_start(dsim_coll *x)
{
    dsim_fr_entry *fe = x->c->fr_cur;
    if (fe && fe->state == DSIM_FR_SCHEDULED) {
        /* The time is the call's start: what lies between is argument
         * checks, and a clock read per call is what the recorder costs. */
        fe->state = DSIM_FR_STARTED;
        fe->fp = x->c->fp_out;
        fe->t_started = fe->t_created;
    }
}

static void step_fr_wait(dsim_comm *c, int peer)
{
    if (c->fr_cur)
        c->fr_cur->waiting_for = peer;
}

void dsim_coll_begin(dsim_comm *c, dsim_coll *x, const char *what, const char *algo, dsim_dtype t,
                     dsim_op op, int nsteps)
{
    x->c = c;
    x->rank = c->rank;
    x->size = c->size;
    x->call = c->calls++;
    atomic_store_explicit(&c->last_op, what, memory_order_relaxed);
    atomic_store_explicit(&c->calls_seen, c->calls, memory_order_relaxed);
    if (x->call && x->call % STEP_CALLS == 0)
        dsim_ep_set_epoch(c->ep, c->comm_id, (uint32_t)(x->call / STEP_CALLS));
    /* One clock read per call start: the deadline, the recorder's time and
     * the first look for a fingerprint (step_wait_probing) all use it. */
    x->t0 = dsim_rt_now(c->rt);
    x->deadline = c->timeout_ns > 0 && c->timeout_ns <= DSIM_NO_DEADLINE - x->t0
                      ? x->t0 + c->timeout_ns
                      : DSIM_NO_DEADLINE;
    x->what = what;
    x->what_algo = algo;
    x->t = t;
    x->op = op;
    x->esize = dsim_dtype_size(t);
    x->nsteps = nsteps;
    x->fp_both = 0;
    x->fp_every = 0;
    x->real = 0;
    dsim_coll_fp *fp = &c->fp_out;
    memset(fp, 0, sizeof *fp);
    fp->magic = DSIM_COLL_FP_MAGIC;
    fp->comm_id = c->comm_id;
    fp->seq = x->call + 1;
    fp->root = -1;
    fp->coll = DSIM_COLL_NONE;
    fp->op = fp->dtype = DSIM_COLL_FP_NONE;
    dsim_fr_entry *fe = c->fr_cur = step_fr_slot(c, x->call);
    if (fe) {
        memset(fe, 0, sizeof *fe);
        fe->fp = *fp;
        fe->state = DSIM_FR_SCHEDULED;
        fe->waiting_for = -1;
        fe->t_created = x->t0;
        fe->t_started = fe->t_completed = -1;
    }
}

void dsim_coll_fp_set(dsim_coll *x, dsim_coll_kind kind, unsigned op, unsigned dtype,
                      uint64_t count, int root, dsim_algo algo)
{
    dsim_coll_fp *fp = &x->c->fp_out;
    fp->coll = (uint8_t)kind;
    fp->op = (uint8_t)op;
    fp->dtype = (uint8_t)dtype;
    fp->count = count;
    fp->root = root;
    fp->algo = (uint8_t)algo;
}

int64_t dsim_coll_grace_ns(int64_t timeout_ns)
{
    /* Long enough for ranks whose deadlines fall a little later (they
     * entered the call later) to reach their own check; short next to the
     * timeout so the error still comes promptly. */
    int64_t grace = timeout_ns / 2;
    if (grace < 50 * 1000000LL)
        grace = 50 * 1000000LL;
    if (grace > 2000 * 1000000LL)
        grace = 2000 * 1000000LL;
    return grace;
}

/* fc_flags: answered (1), visited (2), or its answer revealed lost frames. */
#define STEP_FC_LOST 4

static long long step_ms(int64_t ns)
{
    return (long long)((ns + 500000) / 1000000);
}

/* Records "collective mismatch ..." for peer, whose fingerprint is theirs,
 * after `before` (a sentence ending in "; " or ""), on the thread and the
 * communicator. Returns DSIM_EPROTO. */
static dsim_err step_fp_mismatch(dsim_coll *x, int peer, const dsim_coll_fp *theirs,
                                 const char *before)
{
    dsim_comm *c = x->c;
    char a[128], b[128], diff[96], cn[96], rp[48], rm[48];
    int ndiff = dsim_coll_fp_diff(theirs, &c->fp_out, diff, sizeof diff);
    DSIM_ERR(DSIM_EPROTO, dsim_coll_ep(c, peer),
             "%scollective mismatch on %s: %s called %s; %s called %s: %s %s", before,
             dsim_coll_comm_name(c, cn, sizeof cn), dsim_coll_rank_name(c, peer, rp, sizeof rp),
             dsim_coll_fp_str(theirs, a, sizeof a), dsim_coll_rank_name(c, c->rank, rm, sizeof rm),
             dsim_coll_fp_str(&c->fp_out, b, sizeof b), diff, ndiff > 1 ? "differ" : "differs");
    dsim_error_copy(&c->err);
    return DSIM_EPROTO;
}

/* After a fingerprint mismatch: every other rank of the call learns it at
 * once (their waits end with the same text) instead of at its timeout. */
static void step_fp_abort(dsim_coll *x, int peer, size_t skip)
{
    dsim_comm *c = x->c;
    dsim_error err = c->err;
    /* The abort's reason is short (the transport keeps 256 bytes): the
     * mismatch itself, without what led to it. */
    dsim_ep_abort(c->ep, dsim_coll_ep(c, peer), err.msg + (skip < strlen(err.msg) ? skip : 0));
    /* The abort may record errors of its own; the mismatch is this call's. */
    DSIM_ERR(err.code, err.peer, "%s", err.msg);
    c->err = err;
}

/* Returns the rank to blame for a timeout while waiting for `awaited`, or -1
 * when every rank on the chain answered (see the top of this file).
 * *desync is a rank whose answer carried another fingerprint than this
 * rank's (it is in another call, or the same call with other arguments), or
 * -1. */
static int step_failure_check(dsim_coll *x, int awaited, int *desync, dsim_error *abort)
{
    dsim_comm *c = x->c;
    int n = c->size, me = c->rank;
    *desync = -1;
    abort->code = DSIM_OK;
    if (n < 2 || awaited < 0 || awaited >= n)
        return awaited;

    int64_t dl = dsim_rt_deadline(c->rt, dsim_coll_grace_ns(c->timeout_ns));
    /* Answers go out and are listened for under this call's tag and the
     * previous call's: a rank still stuck at the end of the previous call
     * (a rooted collective waiting for an answer, a send waiting for its
     * receiver) answers too, so the chain runs through it to the rank that
     * really failed instead of stopping at it. */
    int ntags = x->call > 0 ? 2 : 1;
    uint32_t tags[2] = {step_tag(x->call, STEP_FC_STEP),
                        step_tag(x->call > 0 ? x->call - 1 : 0, STEP_FC_STEP)};

    /* The check talks to every rank: each gets its state here (what it
     * answered is read again after the check, step_fail). Out of memory,
     * the awaited peer is named, as when nothing answered. */
    dsim_req **reqs = calloc(4 * (size_t)n, sizeof *reqs);
    dsim_coll_peer **pp = calloc((size_t)n, sizeof *pp);
    for (dsim_coll_peer_chunk *k = c->peer_chunks; k; k = k->next)
        for (int i = 0; i < k->used; i++)
            k->p[i].fc_flags = 0;
    for (int p = 0; p < n && reqs && pp; p++)
        if (!(pp[p] = dsim_coll_peer_make(c, p))) {
            free(pp);
            pp = NULL;
        }
    if (!reqs || !pp) {
        free(reqs);
        free(pp);
        return awaited;
    }
    for (int p = 0; p < n; p++)
        pp[p]->fc_in[0].awaited = pp[p]->fc_in[1].awaited = -1;
    c->fc_mine.awaited = awaited;
    c->fc_mine.fp = c->fp_out;
    for (int t = 0; t < ntags; t++)
        for (int p = 0; p < n; p++)
            if (p != me &&
                dsim_irecv(c->ep, dsim_coll_ep(c, p), c->comm_id, tags[t], &pp[p]->fc_in[t],
                           sizeof pp[p]->fc_in[t], &reqs[t * n + p]) != DSIM_OK)
                reqs[t * n + p] = NULL;
    for (int t = 0; t < ntags; t++)
        for (int p = 0; p < n; p++)
            if (p != me && dsim_isend(c->ep, dsim_coll_ep(c, p), c->comm_id, tags[t], &c->fc_mine,
                                      sizeof c->fc_mine, &reqs[(2 + t) * n + p]) != DSIM_OK)
                reqs[(2 + t) * n + p] = NULL;
    for (int p = 0; p < n; p++) {
        dsim_coll_peer *q = pp[p];
        for (int t = 0; t < ntags; t++) {
            dsim_req *r = reqs[t * n + p];
            if (!r)
                continue;
            reqs[t * n + p] = NULL;
            /* Only this call's answer is waited for; one from the previous
             * call counts if it is here, and is dropped if the peer
             * answered already. */
            size_t len = 0;
            dsim_err e = dsim_req_done(r)        ? dsim_wait(r, DSIM_NO_DEADLINE, &len)
                         : t == 1 || q->fc_flags ? dsim_poll(r, &len)
                                                 : dsim_wait(r, dl, &len);
            if (q->fc_flags || (t == 1 && e == DSIM_ETIMEDOUT))
                continue;
            if (e == DSIM_OK && len == sizeof q->fc_in[0]) {
                q->fc_flags = 1;
                if (t == 1)
                    q->fc_in[0] = q->fc_in[1];
                const dsim_coll_fp *fp = &q->fc_in[0].fp;
                if (*desync < 0 && !c->fp_off && fp->magic == DSIM_COLL_FP_MAGIC &&
                    fp->seq == c->fp_out.seq && dsim_coll_fp_diff(fp, &c->fp_out, NULL, 0) != 0)
                    *desync = p;
            } else if (e == DSIM_EPROTO) {
                /* Its answer came, behind a gap or a corrupt frame: what we
                 * waited for from it was lost on the way. */
                q->fc_flags = STEP_FC_LOST;
            } else if (e == DSIM_EABORTED && abort->code == DSIM_OK) {
                /* Another rank found the cause meanwhile (a mismatch, a lost
                 * peer) and revoked the fabric: its reason is the answer. */
                dsim_error_copy(abort);
            }
        }
    }
    for (int k = 2 * n; k < 4 * n; k++) {
        dsim_req *r = reqs[k];
        if (!r)
            continue;
        if (dsim_req_done(r))
            (void)dsim_wait(r, DSIM_NO_DEADLINE, NULL);
        else
            dsim_req_cancel(r);
    }
    free(reqs);

    pp[me]->fc_flags = 1;
    pp[me]->fc_in[0].awaited = awaited;
    int p = awaited;
    while (pp[p]->fc_flags & 1) {
        if (pp[p]->fc_flags & 2) {
            p = -1;
            break;
        }
        pp[p]->fc_flags |= 2;
        int q = pp[p]->fc_in[0].awaited;
        if (q < 0 || q >= n) {
            p = -1;
            break;
        }
        p = q;
    }
    free(pp);
    return p;
}

/* Peer p's state for reading: all zero when this rank never exchanged with
 * it. */
static const dsim_coll_peer *step_peer_read(dsim_comm *c, int p)
{
    static const dsim_coll_peer none = {.rank = -1};
    const dsim_coll_peer *q = p >= 0 && p < c->size ? dsim_coll_peer_get(c, p) : NULL;
    return q ? q : &none;
}

/* Peer p's state, for a peer this call exchanges with: dsim_coll_run made
 * every peer of a step before posting anything, the failure check every
 * rank, and a pending fingerprint receive's peer exists since it was
 * posted. */
static dsim_coll_peer *step_peer(dsim_comm *c, int p)
{
    return dsim_coll_peer_get(c, p);
}

/* The call's name, "allreduce(ring)", naming the communicator when it is a
 * sub-communicator ("allreduce(ring) on sub-communicator 2913746501 (split
 * of 1, color 0)"). Put together here, for a message, not at every call. */
static const char *step_what(const dsim_coll *x, char *buf, size_t cap)
{
    int w = x->what_algo ? snprintf(buf, cap, "%s(%s)", x->what, x->what_algo)
                         : snprintf(buf, cap, "%s", x->what);
    if (x->c->origin == DSIM_COMM_ORIGIN_CREATE || w < 0 || (size_t)w >= cap)
        return buf;
    char cn[96];
    snprintf(buf + w, cap - (size_t)w, " on %s", dsim_coll_comm_name(x->c, cn, sizeof cn));
    return buf;
}

/* After a timeout waiting for f->peer: the failure check, and the error
 * that names whom to blame. */
static dsim_err step_fail_timeout(dsim_coll *x, const dsim_xfer *f, dsim_err e, const char *w)
{
    dsim_comm *c = x->c;
    int desync;
    dsim_error abort;
    int blame = step_failure_check(x, f->peer, &desync, &abort);
    long long ms = step_ms(c->timeout_ns);
    const dsim_coll_peer *awaited = step_peer_read(c, f->peer);
    int lost = awaited->fc_flags == STEP_FC_LOST;
    int pe = dsim_coll_ep(c, f->peer), be = blame >= 0 ? dsim_coll_ep(c, blame) : -1;
    char rp[48], rb[48], rm[48], ra[48];
    dsim_coll_rank_name(c, f->peer, rp, sizeof rp);
    if (desync < 0 && !lost && abort.code != DSIM_OK) {
        e = DSIM_ERR(DSIM_EABORTED, abort.peer >= 0 ? abort.peer : pe, "%s step %d/%d: aborted: %s",
                     w, f->step, x->nsteps, abort.msg);
        dsim_error_copy(&c->err);
        return e;
    }
    if (desync >= 0) {
        char before[400];
        snprintf(before, sizeof before, "%s step %d/%d: timed out after %lld ms waiting for %s; ",
                 w, f->step, x->nsteps, ms, rp);
        e = step_fp_mismatch(x, desync, &step_peer_read(c, desync)->fc_in[0].fp, before);
        step_fp_abort(x, desync, strlen(before));
        return e;
    }
    /* Where the awaited rank answered from an earlier call: it has not
     * finished that one yet. */
    char note[200] = "";
    if ((awaited->fc_flags & 1) && awaited->fc_in[0].fp.magic == DSIM_COLL_FP_MAGIC &&
        awaited->fc_in[0].fp.seq < c->fp_out.seq) {
        char a[128];
        int aw = (int)awaited->fc_in[0].awaited;
        snprintf(note, sizeof note, " (%s is still in %s, waiting for %s)", rp,
                 dsim_coll_fp_str(&awaited->fc_in[0].fp, a, sizeof a),
                 aw >= 0 && aw < c->size ? dsim_coll_rank_name(c, aw, ra, sizeof ra) : "nobody");
    }
    /* A member whose list differs makes a group of another id: it never
     * joins this one's calls. */
    const char *grp = c->origin == DSIM_COMM_ORIGIN_GROUP
                          ? " (or, on a communicator made by dsim_comm_create_group, it passed "
                            "another list of ranks)"
                          : "";
    if (blame >= 0)
        dsim_coll_rank_name(c, blame, rb, sizeof rb);
    if (lost) {
        e = DSIM_EPROTO;
        DSIM_ERR(e, pe,
                 "%s step %d/%d: timed out after %lld ms waiting for %s, whose later message "
                 "revealed a gap in the sequence numbers: a message from %s to %s was lost; the "
                 "link from %s drops messages",
                 w, f->step, x->nsteps, ms, rp, rp, dsim_coll_rank_name(c, c->rank, rm, sizeof rm),
                 rp);
    } else if (blame < 0)
        DSIM_ERR(e, pe,
                 "%s step %d/%d: timed out after %lld ms waiting for %s (every rank answered the "
                 "failure check, so a message was lost or a rank is too slow; look for dropped "
                 "messages or raise the timeout)",
                 w, f->step, x->nsteps, ms, rp);
    else if (step_peer_read(c, blame)->heard == x->call + 1)
        /* It sent us something in this call, so it joined: it is late
         * (entered the call after our grace ended) or stuck behind the
         * rank that really failed, further down its own chain. */
        DSIM_ERR(e, be,
                 "%s step %d/%d: timed out after %lld ms waiting for %s; %s joined this call but "
                 "did not answer the failure check in time: it is late or waiting for another "
                 "rank (see its own error for the rank that failed)",
                 w, f->step, x->nsteps, ms, rp, rb);
    else if (blame == f->peer)
        DSIM_ERR(e, be,
                 "%s step %d/%d: timed out after %lld ms waiting for %s, which did not answer the "
                 "failure check: it never joined this call or is down%s",
                 w, f->step, x->nsteps, ms, rp, grp);
    else
        DSIM_ERR(e, be,
                 "%s step %d/%d: timed out after %lld ms waiting for %s%s; %s did not answer the "
                 "failure check: it never joined this call or is down%s",
                 w, f->step, x->nsteps, ms, rp, note, rb, grp);
    dsim_error_copy(&c->err);
    return e;
}

static dsim_err step_fail(dsim_coll *x, const dsim_xfer *f, dsim_err e, int posting)
{
    dsim_comm *c = x->c;
    const dsim_error *le = dsim_last_error();
    char detail[sizeof le->msg];
    int lpeer = le->code != DSIM_OK ? le->peer : -1;
    snprintf(detail, sizeof detail, "%s",
             le->code != DSIM_OK && le->msg[0] ? le->msg : dsim_strerror(e));
    const char *verb = f->kind == DSIM_XF_SEND ? "send to" : "receive from";
    char wb[200], rp[48];
    const char *w = step_what(x, wb, sizeof wb);
    int pe = dsim_coll_ep(c, f->peer);

    if (e == DSIM_ETIMEDOUT && !posting)
        return step_fail_timeout(x, f, e, w);
    if (e == DSIM_EABORTED) {
        DSIM_ERR(e, lpeer >= 0 ? lpeer : pe, "%s step %d/%d: aborted: %s", w, f->step, x->nsteps,
                 detail);
    } else {
        DSIM_ERR(e, lpeer >= 0 ? lpeer : pe, "%s step %d/%d: %s %s failed: %s", w, f->step,
                 x->nsteps, verb, dsim_coll_rank_name(c, f->peer, rp, sizeof rp), detail);
    }
    dsim_error_copy(&c->err);
    return e;
}

dsim_err dsim_coll_fail_local(dsim_coll *x, int step, dsim_err e, const char *what)
{
    const dsim_error *le = dsim_last_error();
    char detail[sizeof le->msg];
    snprintf(detail, sizeof detail, "%s",
             le->code != DSIM_OK && le->msg[0] ? le->msg : dsim_strerror(e));
    char wb[200];
    DSIM_ERR(e, -1, "%s step %d/%d: %s failed: %s", step_what(x, wb, sizeof wb), step, x->nsteps,
             what, detail);
    dsim_error_copy(&x->c->err);
    return e;
}

/* Drops every fingerprint receive still pending (a failed call). */
static void step_fp_drop(dsim_comm *c)
{
    for (int i = 0; i < c->fp_npend; i++) {
        dsim_coll_peer *q = dsim_coll_peer_get(c, c->fp_pend[i]);
        dsim_req_cancel(q->fp_req);
        q->fp_req = NULL;
    }
    c->fp_npend = 0;
}

/* The fingerprints of the calls of x, carried as a sideband on any payload
 * frame of that call (the call number is in the tag's high bits). */
#define STEP_CALL_MASK (~0xFFFu)

/* Looks, without waiting, for a fingerprint that peer p sent in this call
 * on a payload frame this rank has not received (it runs another algorithm
 * or another collective): 1 with it in *theirs, else 0. */
static int step_fp_peek(dsim_coll *x, int p, dsim_coll_fp *theirs)
{
    dsim_comm *c = x->c;
    return dsim_ep_peek_side(c->ep, dsim_coll_ep(c, p), c->comm_id, step_tag(x->call, 0),
                             STEP_CALL_MASK, theirs) &&
           theirs->magic == DSIM_COLL_FP_MAGIC;
}

/* Checks peer p's fingerprint *theirs, which came as len bytes (f is the
 * transfer it guards, for the message): a mismatch is recorded and the
 * fabric aborted. */
static dsim_err step_fp_check(dsim_coll *x, const dsim_xfer *f, const dsim_coll_fp *theirs,
                              size_t len)
{
    dsim_comm *c = x->c;
    int p = f->peer;
    dsim_coll_peer *q = step_peer(c, p);
    q->heard = x->call + 1;
    if (len != sizeof *theirs || theirs->magic != DSIM_COLL_FP_MAGIC) {
        char a[128], got[96];
        step_fp_drop(c);
        /* len 0: its payload came without the sideband. */
        if (len)
            snprintf(got, sizeof got,
                     "sent %zu bytes where a %zu-byte collective fingerprint was due", len,
                     sizeof *theirs);
        else
            snprintf(got, sizeof got,
                     "sent its data without the collective fingerprint due with it");
        char wb[200], rp[48], rm[48];
        DSIM_ERR(DSIM_EPROTO, dsim_coll_ep(c, p),
                 "%s step %d/%d: %s %s: it runs without fingerprints "
                 "(dsim_comm_cfg.no_fingerprint must be the same on every rank); %s called %s",
                 step_what(x, wb, sizeof wb), f->step, x->nsteps,
                 dsim_coll_rank_name(c, p, rp, sizeof rp), got,
                 dsim_coll_rank_name(c, c->rank, rm, sizeof rm),
                 dsim_coll_fp_str(&c->fp_out, a, sizeof a));
        dsim_error_copy(&c->err);
        /* As for a mismatch: the other ranks learn it now, not at their
         * timeout. */
        step_fp_abort(x, p, 0);
        return DSIM_EPROTO;
    }
    q->fp_seen = x->call + 1;
    if (dsim_coll_fp_diff(theirs, &c->fp_out, NULL, 0) == 0)
        return DSIM_OK;
    step_fp_drop(c);
    dsim_err e = step_fp_mismatch(x, p, theirs, "");
    step_fp_abort(x, p, 0);
    return e;
}

/* Waits for peer p's fingerprint message (a rooted collective's: the
 * receive is pending) and checks it. f is the transfer it guards, for the
 * message. A peer in another, unrooted collective of the same number sends
 * none: its fingerprint rides on its payload, which this rank looks for
 * after STEP_PROBE_NS and then at that interval. */
static dsim_err step_fp_await(dsim_coll *x, const dsim_xfer *f)
{
    dsim_comm *c = x->c;
    int p = f->peer;
    dsim_coll_peer *q = step_peer(c, p);
    dsim_req *r = q->fp_req;
    q->fp_req = NULL;
    for (int i = 0; i < c->fp_npend; i++)
        if (c->fp_pend[i] == p) {
            c->fp_pend[i] = c->fp_pend[--c->fp_npend];
            break;
        }
    size_t len = 0;
    int64_t soon = x->t0 + STEP_PROBE_NS;
    dsim_err e;
    for (;;) {
        int interim = soon < x->deadline;
        e = dsim_wait(r, interim ? soon : x->deadline, &len);
        if (e != DSIM_ETIMEDOUT || !interim)
            break;
        dsim_coll_fp theirs;
        if (step_fp_peek(x, p, &theirs) && dsim_coll_fp_diff(&theirs, &c->fp_out, NULL, 0) != 0)
            return step_fp_check(x, f, &theirs, sizeof theirs);
        e = dsim_irecv(c->ep, dsim_coll_ep(c, p), c->comm_id, step_tag(x->call, STEP_FP_STEP),
                       &q->fp_in, sizeof q->fp_in, &r);
        if (e != DSIM_OK)
            break;
        soon = dsim_rt_deadline(c->rt, STEP_PROBE_NS);
    }
    if (e != DSIM_OK) {
        step_fp_drop(c);
        return step_fail(x, f, e, 0);
    }
    return step_fp_check(x, f, &q->fp_in, len);
}

/* Which fingerprints a step moves (plan[i] for xf[i]): STEP_FP_SEND, this
 * rank's to the peer, ahead of the payload; STEP_FP_EXPECT, the peer's,
 * checked once its payload is here. One per pair and call, the way the
 * first data goes: not to or from a peer this rank already exchanged one
 * with (where a pair's first step goes both ways, both go). Any connected
 * set of pairs would find a disagreement; these are the pairs the data
 * uses, so no check waits for a message the step does not wait for anyway,
 * and a rank that waits in vain for a peer's payload (the peer runs another
 * algorithm) mostly finds that peer's fingerprint instead. Count-0 calls
 * (x->fp_every) check every sender, as they wait for no payload. Rooted
 * collectives (x->fp_both) are planned in step_fp_post. */
#define STEP_FP_SEND   1
#define STEP_FP_EXPECT 2

static void step_fp_plan(dsim_coll *x, const dsim_xfer *xf, dsim_coll_peer *const *pp, int n,
                         int *plan)
{
    uint64_t mark = x->call + 1;
    for (int i = 0; i < n; i++) {
        int send = xf[i].kind == DSIM_XF_SEND;
        plan[i] = 0;
        if (x->fp_both || x->c->fp_off)
            continue;
        int sent = pp[i]->fp_sent == mark, seen = pp[i]->fp_seen == mark;
        if (send && !sent && (x->fp_every || !seen))
            plan[i] = STEP_FP_SEND;
        if (!send && !seen && (x->fp_every || !sent))
            plan[i] = STEP_FP_EXPECT;
    }
}

/* Posts a rooted collective's fingerprint messages of one step (the sends
 * go into reqs for the step to wait on; other collectives carry theirs on
 * their payload frames). A rooted collective sends its fingerprint to every
 * new peer and posts a receive of every new peer's, kept pending on the
 * communicator: its senders wait for their receivers' answers. */
static dsim_err step_fp_post(dsim_coll *x, const dsim_xfer *xf, dsim_coll_peer *const *pp, int n,
                             dsim_req **reqs, int *idx, int *m)
{
    dsim_comm *c = x->c;
    uint64_t mark = x->call + 1;
    uint32_t tag = step_tag(x->call, STEP_FP_STEP);
    for (int i = 0; i < n; i++) {
        const dsim_xfer *f = &xf[i];
        int p = f->peer;
        dsim_coll_peer *q = pp[i];
        dsim_err e = DSIM_OK;
        if (q->fp_sent != mark && x->fp_both) {
            q->fp_sent = mark;
            e = dsim_isend(c->ep, dsim_coll_ep(c, p), c->comm_id, tag, &c->fp_out, sizeof c->fp_out,
                           &reqs[*m]);
            if (e == DSIM_OK)
                idx[(*m)++] = i;
        }
        if (e == DSIM_OK && x->fp_both && q->fp_seen != mark) {
            q->fp_seen = mark;
            e = dsim_irecv(c->ep, dsim_coll_ep(c, p), c->comm_id, tag, &q->fp_in, sizeof q->fp_in,
                           &q->fp_req);
            if (e == DSIM_OK)
                c->fp_pend[c->fp_npend++] = p;
        }
        if (e != DSIM_OK) {
            for (int j = 0; j < *m; j++)
                dsim_req_cancel(reqs[j]);
            *m = 0;
            step_fp_drop(c);
            return step_fail(x, f, e, 1);
        }
    }
    return DSIM_OK;
}

/* The fabric was revoked while this rank looked for a fingerprint, most
 * often by a peer that found the same mismatch first: its reason (the
 * thread's error) is the answer. */
static dsim_err step_fp_aborted(dsim_coll *x, const dsim_xfer *f)
{
    step_fp_drop(x->c);
    char wb[200];
    dsim_err e = DSIM_ERR(DSIM_EABORTED, dsim_last_error()->peer, "%s step %d/%d: aborted: %s",
                          step_what(x, wb, sizeof wb), f->step, x->nsteps, dsim_errmsg());
    dsim_error_copy(&x->c->err);
    return e;
}

/* Looks, without waiting, for the fingerprint of f->peer (a receive from
 * it failed, or is taking long): if it is here and differs, that is the
 * error to report (the peer's message was the wrong size, or does not come,
 * because it is in another call). Returns DSIM_EPROTO after recording the
 * mismatch and aborting, DSIM_EABORTED (recorded) if the fabric was revoked
 * meanwhile, else DSIM_OK with the thread's error as it was, and the
 * fingerprint marked as checked if it was here and agrees. *final is 0 when
 * the error returned is the transport's (a lost frame from the peer failed
 * the receive) and still to be reported as the receive's failure. */
static dsim_err step_fp_probe(dsim_coll *x, const dsim_xfer *f, int *final)
{
    dsim_comm *c = x->c;
    int p = f->peer;
    uint64_t mark = x->call + 1;
    *final = 1;
    if (c->fp_off || f->kind == DSIM_XF_SEND || p < 0 || p >= c->size)
        return DSIM_OK;
    dsim_coll_peer *q = step_peer(c, p);
    dsim_req *r = q->fp_req;
    if (!r && q->fp_seen == mark)
        return DSIM_OK;
    dsim_error saved;
    dsim_error_copy(&saved);
    if (!r && step_fp_peek(x, p, &q->fp_in)) {
        /* It rode on a payload frame this rank did not take. */
        q->fp_seen = mark;
        q->heard = mark;
        if (dsim_coll_fp_diff(&q->fp_in, &c->fp_out, NULL, 0) == 0)
            return DSIM_OK;
        step_fp_drop(c);
        dsim_err e = step_fp_mismatch(x, p, &q->fp_in, "");
        step_fp_abort(x, p, 0);
        return e;
    }
    if (!r) {
        if (DSIM_FIU("dsim/coll/probe_late")) {
            /* a test point: what the peer does next happens here */
            struct timespec ts = {0, 300 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        dsim_err e = dsim_irecv(c->ep, dsim_coll_ep(c, p), c->comm_id,
                                step_tag(x->call, STEP_FP_STEP), &q->fp_in, sizeof q->fp_in, &r);
        if (e != DSIM_OK)
            r = NULL;
        if (e == DSIM_EABORTED)
            return step_fp_aborted(x, f);
    } else {
        q->fp_req = NULL;
        for (int i = 0; i < c->fp_npend; i++)
            if (c->fp_pend[i] == p) {
                c->fp_pend[i] = c->fp_pend[--c->fp_npend];
                break;
            }
    }
    size_t len = 0;
    int mismatch = 0;
    if (r) {
        /* A deadline already past: the receive is withdrawn if nothing came,
         * and kept if it completes while being withdrawn (a cancel then
         * would lose the fingerprint it took). */
        dsim_err e = dsim_poll(r, &len);
        if (e == DSIM_OK && len == sizeof q->fp_in && q->fp_in.magic == DSIM_COLL_FP_MAGIC) {
            q->fp_seen = mark;
            q->heard = mark;
            mismatch = dsim_coll_fp_diff(&q->fp_in, &c->fp_out, NULL, 0) != 0;
        } else if (e == DSIM_EABORTED) {
            return step_fp_aborted(x, f);
        } else if (e != DSIM_OK && e != DSIM_ETIMEDOUT) {
            /* A gap or a corrupt frame from p failed this receive, the
             * oldest one posted from p, or p has gone: that is what became
             * of the payload, unless it came meanwhile (the caller looks),
             * and the caller reports it as such (the call's end drops the
             * fingerprint receives still pending). */
            *final = 0;
            return e;
        }
    }
    if (!mismatch) {
        dsim_error_restore(&saved);
        return DSIM_OK;
    }
    step_fp_drop(c);
    dsim_err e = step_fp_mismatch(x, p, &q->fp_in, "");
    step_fp_abort(x, p, 0);
    return e;
}

/* Posts one payload transfer (xf[slot]); a send carries side (this rank's
 * fingerprint) unless it is NULL. */
static dsim_err step_post(dsim_coll *x, const dsim_xfer *f, int slot, const dsim_coll_fp *side,
                          dsim_req **req)
{
    dsim_comm *c = x->c;
    uint32_t tag = step_tag(x->call, (uint32_t)f->step);
    int ep = dsim_coll_ep(c, f->peer);
    if (c->virt && !x->real && f->len > 0) /* timing only: the length goes, not the bytes */
        return f->kind == DSIM_XF_SEND
                   ? dsim_isend_virtual(c->ep, ep, c->comm_id, tag, f->len, side, req)
                   : dsim_irecv(c->ep, ep, c->comm_id, tag, &c->vin[slot], sizeof *c->vin, req);
    switch (f->kind) {
    case DSIM_XF_SEND:
        if (side)
            return dsim_isend_side(c->ep, ep, c->comm_id, tag, f->buf, f->len, side, req);
        return dsim_isend(c->ep, ep, c->comm_id, tag, f->buf, f->len, req);
    case DSIM_XF_RECV:
        return dsim_irecv(c->ep, ep, c->comm_id, tag, f->buf, f->len, req);
    case DSIM_XF_RECV_REDUCE:
        if (f->from && f->from != f->buf)
            return dsim_irecv_reduce_from(c->ep, ep, c->comm_id, tag, f->from, f->buf,
                                          f->len / x->esize, x->t, x->op, req);
        return dsim_irecv_reduce(c->ep, ep, c->comm_id, tag, f->buf, f->len / x->esize, x->t, x->op,
                                 req);
    }
    return DSIM_ERR(DSIM_EINVAL, f->peer, "transfer kind %d", (int)f->kind);
}

/* After the look at a peer's fingerprint failed as a receive from that
 * peer fails (it has gone, or a frame of it was lost): whether f's payload
 * came all the same, while the look went on. A peer that sends its part
 * and ends at once is seen to end at the same look at the rings as its
 * part arrives, which is often the fingerprint receive's own look (its
 * wait reads the rings): the part then waits unreceived, and is the
 * call's, not a loss. 1 with it taken (*len, *side, *has); 0 with the
 * look's error kept. */
static int step_payload_came(dsim_coll *x, const dsim_xfer *f, int slot, size_t *len,
                             dsim_coll_fp *side, int *has)
{
    dsim_error lost;
    dsim_error_copy(&lost);
    dsim_req *r = NULL;
    if (step_post(x, f, slot, NULL, &r) == DSIM_OK &&
        dsim_wait_flags(r, 0, DSIM_WAIT_QUIET, len, side, has) == DSIM_OK)
        return 1;
    dsim_error_restore(&lost);
    return 0;
}

/* Waits for the payload receive *req of f (posted), which comes from a peer
 * whose fingerprint is not checked yet. If it takes longer than a short
 * while, looks whether that peer's fingerprint arrived and differs: then the
 * payload will never come (or not as this rank expects it), and the mismatch
 * is reported at once instead of at the timeout. Otherwise posts the receive
 * again (nothing of it arrived) and goes on waiting. *probed: 2 when the
 * error returned is recorded in full (a mismatch, an abort), 1 when it is
 * the transport's, found by the look (still to report as the receive's).
 * *has: 1 with the fingerprint the payload carried in *side, else 0. */
static dsim_err step_wait_probing(dsim_coll *x, const dsim_xfer *f, int slot, dsim_req **req,
                                  size_t *len, int *probed, dsim_coll_fp *side, int *has)
{
    dsim_comm *c = x->c;
    int64_t soon = x->t0 + STEP_PROBE_NS; /* the first look: no clock read */
    for (;;) {
        int interim = soon < x->deadline;
        dsim_err e = dsim_wait_flags(*req, interim ? soon : x->deadline,
                                     interim ? DSIM_WAIT_QUIET : 0, len, side, has);
        *req = NULL;
        if (e != DSIM_ETIMEDOUT || !interim)
            return e;
        int final;
        dsim_error before;
        dsim_error_copy(&before);
        e = step_fp_probe(x, f, &final);
        if (e != DSIM_OK && !final && step_payload_came(x, f, slot, len, side, has)) {
            dsim_error_restore(&before);
            return DSIM_OK;
        }
        if (e != DSIM_OK) {
            *probed = final ? 2 : 1;
            return e;
        }
        if (step_post(x, f, slot, NULL, req) != DSIM_OK)
            return dsim_last_error()->code;
        soon = dsim_rt_deadline(c->rt, STEP_PROBE_NS);
        if (step_peer(c, f->peer)->fp_seen == x->call + 1) {
            /* Checked and agrees: an ordinary wait from here on. */
            e = dsim_wait_side(*req, x->deadline, len, side, has);
            *req = NULL;
            return e;
        }
    }
}

dsim_err dsim_coll_end(dsim_coll *x, dsim_err e)
{
    dsim_comm *c = x->c;
    if (e != DSIM_OK)
        step_fp_drop(c);
    while (e == DSIM_OK && c->fp_npend > 0) {
        dsim_xfer f = {DSIM_XF_RECV, c->fp_pend[0], x->nsteps, NULL, 0, NULL};
        step_fr_wait(c, f.peer);
        e = step_fp_await(x, &f);
    }
    dsim_fr_entry *fe = c->fr_cur;
    if (fe) {
        fe->fp = c->fp_out;
        fe->error = (int32_t)e;
        fe->t_completed = dsim_rt_now(c->rt);
        if (e == DSIM_OK) {
            if (fe->state == DSIM_FR_SCHEDULED)
                fe->t_started = fe->t_created; /* nothing to move: done at once */
            fe->state = DSIM_FR_COMPLETED;
            fe->waiting_for = -1;
        }
        c->fr_cur = NULL;
    }
    if (e != DSIM_OK) {
        /* the call's own error (the thread's), kept for whoever asks later */
        c->failed_calls++;
        if (dsim_last_error()->code == e)
            dsim_error_copy(&c->err);
    }
    if (c->root && c->root->xlog && c->root->xlog->on)
        dsim_coll_xlog_note(x);
    return e;
}

/* What a step needs before it posts anything: the state of every peer it
 * names (pp[i] for xf[i]; found once here, so the step itself does no
 * lookups), room to list a rooted collective's fingerprint receives, and
 * the slots of virtual receives. Out of memory, it says what for and
 * returns DSIM_ENOMEM: then nothing was posted. */
static dsim_err step_prepare(dsim_coll *x, const dsim_xfer *xf, int n, dsim_coll_peer **pp)
{
    dsim_comm *c = x->c;
    for (int i = 0; i < n; i++)
        if (!(pp[i] = dsim_coll_peer_make(c, xf[i].peer)))
            return DSIM_ERR(DSIM_ENOMEM, dsim_coll_ep(c, xf[i].peer),
                            "out of memory for the state of peer %d", xf[i].peer);
    /* Each transfer lists at most one new fingerprint receive. */
    if (x->fp_both && !c->fp_off && c->fp_npend + n > c->fp_pend_cap) {
        int cap = c->fp_pend_cap ? 2 * c->fp_pend_cap : 8;
        if (cap < c->fp_npend + n)
            cap = c->fp_npend + n;
        int *l = realloc(c->fp_pend, (size_t)cap * sizeof *l);
        if (!l)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for %d fingerprint receives", cap);
        c->fp_pend = l;
        c->fp_pend_cap = cap;
    }
    if (c->virt && !x->real && n > c->vin_cap) {
        uint64_t *v = realloc(c->vin, (size_t)n * sizeof *v);
        if (!v)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for %d virtual receives", n);
        c->vin = v;
        c->vin_cap = n;
    }
    return DSIM_OK;
}

/* A step's fingerprint sends, posted before anything else: reqs[0 .. *m).
 * A rooted collective then checks a peer's fingerprint before it posts the
 * receive of its payload. This step's sends are not posted yet, but a peer
 * posts its fingerprint at the start of the step in which it first sends to
 * us, so no wait here depends on them. On failure nothing stays posted. */
static dsim_err step_fp_first(dsim_coll *x, const dsim_xfer *xf, dsim_coll_peer **pp, int n,
                              dsim_req **reqs, int *idx, int *m)
{
    dsim_comm *c = x->c;
    dsim_err e = step_fp_post(x, xf, pp, n, reqs, idx, m);
    for (int i = 0; i < n && e == DSIM_OK && x->fp_both; i++)
        if (xf[i].kind != DSIM_XF_SEND && pp[i]->fp_req) {
            step_fr_wait(c, xf[i].peer);
            e = step_fp_await(x, &xf[i]);
        }
    if (e != DSIM_OK) {
        for (int j = 0; j < *m; j++)
            dsim_req_cancel(reqs[j]);
        *m = 0;
    }
    return e;
}

/* Posts the step's payload transfers after reqs[0 .. *m), receives first:
 * a receive that is already posted when the matching send starts lets
 * inproc copy or combine straight from the sender. An empty transfer that
 * carries a fingerprint goes as an empty frame; both sides plan it alike
 * (step_fp_plan). On failure nothing stays posted. */
static dsim_err step_post_all(dsim_coll *x, const dsim_xfer *xf, dsim_coll_peer **pp, int n,
                              const int *plan, dsim_req **reqs, int *idx, int *m)
{
    dsim_comm *c = x->c;
    uint64_t mark = x->call + 1;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            const dsim_xfer *f = &xf[i];
            int send = f->kind == DSIM_XF_SEND;
            if (send != (pass == 1) ||
                (f->len == 0 && !(plan[i] & (send ? STEP_FP_SEND : STEP_FP_EXPECT))))
                continue;
            const dsim_coll_fp *side = NULL;
            if (send && (plan[i] & STEP_FP_SEND) && pp[i]->fp_sent != mark) {
                pp[i]->fp_sent = mark;
                side = &c->fp_out;
            }
            dsim_err e = step_post(x, f, i, side, &reqs[*m]);
            if (e != DSIM_OK) {
                for (int j = 0; j < *m; j++)
                    dsim_req_cancel(reqs[j]);
                *m = 0;
                return step_fail(x, f, e, 1);
            }
            idx[(*m)++] = i;
        }
    }
    return DSIM_OK;
}

/* Waits for reqs[j] of the m posted (the first mfp are fingerprint sends)
 * and checks what came. On failure the later ones are cancelled and the
 * error is recorded in full: a fingerprint mismatch, else the transfer's
 * failure (after a look at the peer's fingerprint, which may explain it). */
static dsim_err step_wait_one(dsim_coll *x, const dsim_xfer *xf, dsim_coll_peer **pp,
                              const int *idx, dsim_req **reqs, int j, int m, int mfp)
{
    dsim_comm *c = x->c;
    uint64_t mark = x->call + 1;
    const dsim_xfer *f = &xf[idx[j]];
    dsim_coll_peer *q = pp[idx[j]];
    dsim_xfer fps;
    if (j < mfp) {
        /* A fingerprint send, possibly a rooted collective's answer to a
         * receive. */
        fps = *f;
        fps.kind = DSIM_XF_SEND;
        f = &fps;
    }
    size_t len = 0;
    int probed = 0, has = 0;
    dsim_coll_fp side;
    dsim_err e;
    step_fr_wait(c, f->peer);
    dsim_rt_hint(DSIM_RT_HINT_COMM, c); /* what this worker touches when it wakes */
    dsim_rt_hint(DSIM_RT_HINT_PEER, q);
    dsim_rt_hint(DSIM_RT_HINT_PEER_MAP, c->peer_map);
    if (f->kind != DSIM_XF_SEND && !c->fp_off && q->fp_seen != mark)
        e = step_wait_probing(x, f, idx[j], &reqs[j], &len, &probed, &side, &has);
    else
        e = dsim_wait(reqs[j], x->deadline, &len);
    if (e == DSIM_OK && f->kind != DSIM_XF_SEND)
        q->heard = mark;
    if (has && q->fp_seen != mark) {
        /* The peer's fingerprint came with this payload (whether or not the
         * payload fitted): checked before anything of it is sent on or
         * returned. A mismatch is the error, whatever else failed. */
        dsim_err ce = step_fp_check(x, f, &side, sizeof side);
        if (ce != DSIM_OK) {
            for (int k = j + 1; k < m; k++)
                dsim_req_cancel(reqs[k]);
            return ce;
        }
    }
    /* A virtual payload's 8 bytes are the length it stands for. */
    int virt_in = c->virt && !x->real && j >= mfp && f->kind != DSIM_XF_SEND && f->len > 0;
    if (e == DSIM_OK && virt_in)
        len = len == sizeof *c->vin ? (size_t)c->vin[idx[j]] : 0;
    if (e == DSIM_OK && (f->kind == DSIM_XF_RECV || virt_in) && len != f->len) {
        DSIM_ERR(DSIM_EPROTO, dsim_coll_ep(c, f->peer),
                 "message was %zu bytes where %zu were expected: the ranks disagree on the "
                 "count or dtype of this call",
                 len, f->len);
        e = DSIM_EPROTO;
    }
    if (e == DSIM_OK)
        return DSIM_OK;
    for (int k = j + 1; k < m; k++)
        dsim_req_cancel(reqs[k]);
    if (!probed) {
        int final;
        dsim_err pe = step_fp_probe(x, f, &final);
        if (pe == DSIM_OK)
            e = step_fail(x, f, e, 0);
        else
            e = final ? pe : step_fail(x, f, pe, 0);
    } else if (probed == 1) {
        e = step_fail(x, f, e, 0);
    }
    return e;
}

dsim_err dsim_coll_run(dsim_coll *x, const dsim_xfer *xf, int n)
{
    dsim_comm *c = x->c;
    /* Up to n payload transfers and n fingerprint sends. */
    dsim_req *reqs_stack[2 * STEP_STACK], **reqs = reqs_stack;
    int idx_stack[3 * STEP_STACK], *idx = idx_stack;
    dsim_coll_peer *pp_stack[STEP_STACK], **pp = pp_stack;
    if (n > STEP_STACK) {
        reqs = malloc(2 * (size_t)n * sizeof *reqs);
        idx = malloc(3 * (size_t)n * sizeof *idx);
        pp = malloc((size_t)n * sizeof *pp);
        if (!reqs || !idx || !pp) {
            free(reqs);
            free(idx);
            free(pp);
            DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for %d requests", n);
            return dsim_coll_fail_local(x, n > 0 ? xf[0].step : 0, DSIM_ENOMEM, "allocating");
        }
    }
    if (step_prepare(x, xf, n, pp) != DSIM_OK) {
        if (reqs != reqs_stack) {
            free(reqs);
            free(idx);
            free(pp);
        }
        return dsim_coll_fail_local(x, n > 0 ? xf[0].step : 0, DSIM_ENOMEM, "allocating");
    }
    step_fr_start(x);
    dsim_err e = DSIM_OK;
    int m = 0, mfp = 0; /* reqs[0 .. mfp) are fingerprint sends */
    int *plan = idx + 2 * n;
    step_fp_plan(x, xf, pp, n, plan);
    if (!c->fp_off) {
        e = step_fp_first(x, xf, pp, n, reqs, idx, &m);
        mfp = m;
    }
    if (e == DSIM_OK)
        e = step_post_all(x, xf, pp, n, plan, reqs, idx, &m);
    for (int j = 0; j < m && e == DSIM_OK; j++)
        e = step_wait_one(x, xf, pp, idx, reqs, j, m, mfp);

    /* Each peer this step first received from sent its fingerprint with
     * one of its payloads (checked above, as it arrived). One that sent
     * none runs without fingerprints. */
    uint64_t mark = x->call + 1;
    for (int i = 0; i < n && e == DSIM_OK; i++) {
        const dsim_xfer *f = &xf[i];
        if ((plan[i] & STEP_FP_EXPECT) && pp[i]->fp_seen != mark)
            e = step_fp_check(x, f, &pp[i]->fp_in, 0);
    }

    if (reqs != reqs_stack) {
        free(reqs);
        free(idx);
        free(pp);
    }
    return e;
}
