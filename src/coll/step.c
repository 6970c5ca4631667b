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
 * the error then names the awaited peer. The communicator stays usable: the
 * check aborts nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

#define STEP_FC_STEP 0xFFFu
#define STEP_CALLS   0xFFFFFu /* call numbers one epoch's tags tell apart */
#define STEP_STACK   8

static uint32_t step_tag(uint64_t call, uint32_t step)
{
    return ((uint32_t)(call % STEP_CALLS) << 12) | (step == STEP_FC_STEP ? step : step % 0xFFFu);
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
    x->deadline = c->timeout_ns > 0 ? dsim_rt_deadline(c->rt, c->timeout_ns) : DSIM_NO_DEADLINE;
    if (algo)
        snprintf(x->what, sizeof x->what, "%s(%s)", what, algo);
    else
        snprintf(x->what, sizeof x->what, "%s", what);
    x->t = t;
    x->op = op;
    x->esize = dsim_dtype_size(t);
    x->nsteps = nsteps;
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

/* Returns the rank to blame for a timeout while waiting for `awaited`, or -1
 * when every rank on the chain answered (see the top of this file). */
static int step_failure_check(dsim_coll *x, int awaited)
{
    dsim_comm *c = x->c;
    int n = c->size, me = c->rank;
    if (n < 2 || awaited < 0 || awaited >= n)
        return awaited;

    int64_t dl = dsim_rt_deadline(c->rt, dsim_coll_grace_ns(c->timeout_ns));
    uint32_t tag = step_tag(x->call, STEP_FC_STEP);

    dsim_req **reqs = calloc(2 * (size_t)n, sizeof *reqs);
    if (!reqs)
        return awaited;
    for (int p = 0; p < n; p++) {
        c->fc_flags[p] = 0;
        c->fc_awaited[p] = -1;
    }
    c->fc_mine = awaited;
    for (int p = 0; p < n; p++)
        if (p != me && dsim_irecv(c->ep, p, c->comm_id, tag, &c->fc_awaited[p],
                                  sizeof c->fc_awaited[p], &reqs[p]) != DSIM_OK)
            reqs[p] = NULL;
    for (int p = 0; p < n; p++)
        if (p != me && dsim_isend(c->ep, p, c->comm_id, tag, &c->fc_mine, sizeof c->fc_mine,
                                  &reqs[n + p]) != DSIM_OK)
            reqs[n + p] = NULL;
    for (int p = 0; p < n; p++) {
        if (!reqs[p])
            continue;
        size_t len = 0;
        dsim_err e = dsim_wait(reqs[p], dsim_req_done(reqs[p]) ? DSIM_NO_DEADLINE : dl, &len);
        if (e == DSIM_OK && len == sizeof c->fc_awaited[p])
            c->fc_flags[p] = 1;
        else if (e == DSIM_EPROTO)
            /* Its answer came, behind a gap or a corrupt frame: what we
             * waited for from it was lost on the way. */
            c->fc_flags[p] = STEP_FC_LOST;
    }
    for (int p = 0; p < n; p++) {
        dsim_req *r = reqs[n + p];
        if (!r)
            continue;
        if (dsim_req_done(r))
            (void)dsim_wait(r, DSIM_NO_DEADLINE, NULL);
        else
            dsim_req_cancel(r);
    }
    free(reqs);

    c->fc_flags[me] = 1;
    c->fc_awaited[me] = awaited;
    int p = awaited;
    while (c->fc_flags[p] & 1) {
        if (c->fc_flags[p] & 2)
            return -1;
        c->fc_flags[p] |= 2;
        int q = c->fc_awaited[p];
        if (q < 0 || q >= n)
            return -1;
        p = q;
    }
    return p;
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

    if (e == DSIM_ETIMEDOUT && !posting) {
        int blame = step_failure_check(x, f->peer);
        long long ms = step_ms(c->timeout_ns);
        if (f->peer >= 0 && f->peer < c->size && c->fc_flags[f->peer] == STEP_FC_LOST) {
            e = DSIM_EPROTO;
            DSIM_ERR(e, f->peer,
                     "%s step %d/%d: timed out after %lld ms waiting for rank %d, whose later "
                     "message revealed a gap in the sequence numbers: a message from rank %d to "
                     "rank %d was lost; the link from rank %d drops messages",
                     x->what, f->step, x->nsteps, ms, f->peer, f->peer, c->rank, f->peer);
        } else if (blame < 0)
            DSIM_ERR(e, f->peer,
                     "%s step %d/%d: timed out after %lld ms waiting for rank %d (every rank "
                     "answered the failure check, so a message was lost or a rank is too slow; "
                     "look for dropped messages or raise the timeout)",
                     x->what, f->step, x->nsteps, ms, f->peer);
        else if (c->heard[blame] == x->call + 1)
            /* It sent us something in this call, so it joined: it is late
             * (entered the call after our grace ended) or stuck behind the
             * rank that really failed, further down its own chain. */
            DSIM_ERR(e, blame,
                     "%s step %d/%d: timed out after %lld ms waiting for rank %d; rank %d joined "
                     "this call but did not answer the failure check in time: it is late or "
                     "waiting for another rank (see its own error for the rank that failed)",
                     x->what, f->step, x->nsteps, ms, f->peer, blame);
        else if (blame == f->peer)
            DSIM_ERR(e, blame,
                     "%s step %d/%d: timed out after %lld ms waiting for rank %d, which did not "
                     "answer the failure check: it never joined this call or is down",
                     x->what, f->step, x->nsteps, ms, f->peer);
        else
            DSIM_ERR(e, blame,
                     "%s step %d/%d: timed out after %lld ms waiting for rank %d; rank %d did not "
                     "answer the failure check: it never joined this call or is down",
                     x->what, f->step, x->nsteps, ms, f->peer, blame);
    } else if (e == DSIM_EABORTED) {
        DSIM_ERR(e, lpeer >= 0 ? lpeer : f->peer, "%s step %d/%d: aborted: %s", x->what, f->step,
                 x->nsteps, detail);
    } else {
        DSIM_ERR(e, lpeer >= 0 ? lpeer : f->peer, "%s step %d/%d: %s rank %d failed: %s", x->what,
                 f->step, x->nsteps, verb, f->peer, detail);
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
    DSIM_ERR(e, -1, "%s step %d/%d: %s failed: %s", x->what, step, x->nsteps, what, detail);
    dsim_error_copy(&x->c->err);
    return e;
}

dsim_err dsim_coll_run(dsim_coll *x, const dsim_xfer *xf, int n)
{
    dsim_comm *c = x->c;
    dsim_req *reqs_stack[STEP_STACK], **reqs = reqs_stack;
    int idx_stack[STEP_STACK], *idx = idx_stack;
    if (n > STEP_STACK) {
        reqs = malloc((size_t)n * sizeof *reqs);
        idx = malloc((size_t)n * sizeof *idx);
        if (!reqs || !idx) {
            free(reqs);
            free(idx);
            DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for %d requests", n);
            return dsim_coll_fail_local(x, n > 0 ? xf[0].step : 0, DSIM_ENOMEM, "allocating");
        }
    }

    dsim_err e = DSIM_OK;
    int m = 0;
    /* Receives first: a receive that is already posted when the matching
     * send starts lets inproc copy or combine straight from the sender. */
    for (int pass = 0; pass < 2 && e == DSIM_OK; pass++) {
        for (int i = 0; i < n; i++) {
            const dsim_xfer *f = &xf[i];
            if (f->len == 0 || (f->kind == DSIM_XF_SEND) != (pass == 1))
                continue;
            uint32_t tag = step_tag(x->call, (uint32_t)f->step);
            switch (f->kind) {
            case DSIM_XF_SEND:
                e = dsim_isend(c->ep, f->peer, c->comm_id, tag, f->buf, f->len, &reqs[m]);
                break;
            case DSIM_XF_RECV:
                e = dsim_irecv(c->ep, f->peer, c->comm_id, tag, f->buf, f->len, &reqs[m]);
                break;
            case DSIM_XF_RECV_REDUCE:
                e = dsim_irecv_reduce(c->ep, f->peer, c->comm_id, tag, f->buf, f->len / x->esize,
                                      x->t, x->op, &reqs[m]);
                break;
            }
            if (e != DSIM_OK) {
                for (int j = 0; j < m; j++)
                    dsim_req_cancel(reqs[j]);
                m = 0;
                e = step_fail(x, f, e, 1);
                break;
            }
            idx[m++] = i;
        }
    }

    for (int j = 0; j < m && e == DSIM_OK; j++) {
        const dsim_xfer *f = &xf[idx[j]];
        size_t len = 0;
        e = dsim_wait(reqs[j], x->deadline, &len);
        if (e == DSIM_OK && f->kind != DSIM_XF_SEND)
            c->heard[f->peer] = x->call + 1;
        if (e == DSIM_OK && f->kind == DSIM_XF_RECV && len != f->len) {
            DSIM_ERR(DSIM_EPROTO, f->peer,
                     "message was %zu bytes where %zu were expected: the ranks disagree on the "
                     "count or dtype of this call",
                     len, f->len);
            e = DSIM_EPROTO;
        }
        if (e != DSIM_OK) {
            for (int k = j + 1; k < m; k++)
                dsim_req_cancel(reqs[k]);
            e = step_fail(x, f, e, 0);
        }
    }

    if (reqs != reqs_stack) {
        free(reqs);
        free(idx);
    }
    return e;
}
