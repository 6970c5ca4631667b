/* Fault loop over transport sends (ARCHITECTURE.md §1, §6): 4 ranks on the
 * threads engine over inproc run two allreduces (one, where the timeout
 * ends them) and a barrier; the 1st, 2nd,
 * 3rd ... dsim_isend of the job (the point dsim/tp/send) fails in turn, as
 * on a reset connection, until a job makes no more. Each time every rank
 * returns within the bound (none hangs), the rank whose send failed says
 * DSIM_EPEER naming the peer, every error names a peer, every rank that
 * finished holds the exact sum, and the job that ends the loop sent exactly
 * as many messages as the loop counted. Two ways to end the others: only
 * the communicator's timeout (nobody tells them), or the failing rank
 * aborts the fabric (as the training driver does). Leaks are
 * LeakSanitizer's to find (the sanitizer build).
 *
 * Also: a failed send takes no sequence number, so the next send to that
 * peer is received as if nothing had happened. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "coll_harness.h"
#include "dsim/err.h"
#include "dsim_config.h"

#if DSIM_HAVE_FIU
#include "fiu_loop.h"

#define MS     (1000LL * 1000)
#define NRANKS 4
#define COUNT  1000 /* floats: several chunks on every algorithm */

typedef struct send_job {
    bool abort_on_error;
    int allreduces;
    dsim_err code[NRANKS];
    dsim_error err[NRANKS];
    bool exact[NRANKS];
    uint64_t sent[NRANKS];
} send_job;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void send_rank(coll_harness *h, int rank, void *arg)
{
    send_job *j = arg;
    dsim_comm *c = h->comms[rank];
    float *buf = malloc(COUNT * sizeof(float));
    assert_non_null(buf);
    for (int i = 0; i < COUNT; i++)
        buf[i] = (float)(rank + i % 64);
    dsim_err e = DSIM_OK;
    for (int it = 0; it < j->allreduces && e == DSIM_OK; it++)
        e = dsim_allreduce(c, buf, buf, COUNT, DSIM_F32, DSIM_SUM);
    if (e == DSIM_OK)
        e = dsim_barrier(c);
    j->code[rank] = e;
    if (e == DSIM_OK) {
        /* (sum over ranks of rank + v) = 6 + 4v, then times 4: exact. */
        float times = j->allreduces == 2 ? 4.0f : 1.0f;
        bool exact = true;
        for (int i = 0; i < COUNT; i++)
            exact = exact && buf[i] == times * (6.0f + 4.0f * (float)(i % 64));
        j->exact[rank] = exact;
    } else {
        dsim_error_copy(&j->err[rank]);
        if (j->abort_on_error)
            dsim_ep_abort(h->eps[rank], j->err[rank].peer >= 0 ? j->err[rank].peer : rank,
                          j->err[rank].msg);
    }
    dsim_ep_stats s;
    dsim_ep_get_stats(h->eps[rank], &s);
    j->sent[rank] = s.msgs_sent;
    free(buf);
}

/* "rank N" or "peer N" in msg. */
static bool names_peer(const char *msg, int peer)
{
    char a[32], b[32];
    snprintf(a, sizeof a, "rank %d", peer);
    snprintf(b, sizeof b, "peer %d", peer);
    return strstr(msg, a) || strstr(msg, b);
}

static void send_loop(dsim_algo algo, bool abort_on_error, int allreduces, int64_t timeout_ns)
{
    const char *how = abort_on_error ? "abort" : "timeout";
    /* Without an abort the others wait out their deadline; with one they
     * must not (the bound is well under the timeout). */
    int64_t bound = abort_on_error ? timeout_ns / 2 : timeout_ns + 3000 * MS;
    int k, shown = 0, partial = 0;
    int64_t slowest = 0;
    for (k = 1;; k++) {
        coll_harness h;
        coll_harness_cfg hc = {.nranks = NRANKS, .timeout_ns = timeout_ns, .algo = algo};
        if (coll_harness_open(&h, &hc) != DSIM_OK)
            fail_msg("harness: %s", dsim_errmsg());
        send_job j = {.abort_on_error = abort_on_error, .allreduces = allreduces};
        fl_arm("dsim/tp/send", k, NULL);
        int64_t t0 = now_ns();
        assert_int_equal(coll_harness_run(&h, send_rank, &j), DSIM_OK);
        int64_t took = now_ns() - t0;
        fl_disarm();
        coll_harness_close(&h);
        if (took > slowest)
            slowest = took;
        if (took > bound)
            fail_msg("%s/%s, send %d failed: the ranks took %lld ms to return (bound %lld ms)",
                     dsim_algo_name(algo), how, k, (long long)(took / MS), (long long)(bound / MS));
        if (!fl_fired()) {
            /* No k-th send: the job is whole, and sent k - 1 messages. */
            uint64_t sent = 0;
            for (int r = 0; r < NRANKS; r++) {
                if (j.code[r] != DSIM_OK)
                    fail_msg("%s, nothing injected: rank %d: %s", dsim_algo_name(algo), r,
                             j.err[r].msg);
                assert_true(j.exact[r]);
                sent += j.sent[r];
            }
            assert_int_equal(fl_calls(), k - 1);
            assert_int_equal(sent, (uint64_t)(k - 1));
            break;
        }
        int injected = -1, failed = 0;
        for (int r = 0; r < NRANKS; r++) {
            if (j.code[r] == DSIM_OK) {
                /* Finished before the failure could reach it: exact. */
                if (!j.exact[r])
                    fail_msg("%s/%s, send %d failed: rank %d returned OK with a wrong sum",
                             dsim_algo_name(algo), how, k, r);
                continue;
            }
            failed++;
            const dsim_error *er = &j.err[r];
            if (er->code == DSIM_EPEER && strstr(er->msg, "connection to peer")) {
                if (injected >= 0)
                    fail_msg("%s/%s, send %d: two ranks lost a send", dsim_algo_name(algo), how, k);
                injected = r;
            }
            /* An abort names the rank the aborter blamed (the driver blames
             * the peer of its failed call), which may be this one. */
            if (er->peer < 0 || er->peer >= NRANKS ||
                (er->peer == r && er->code != DSIM_EABORTED) || !names_peer(er->msg, er->peer))
                fail_msg("%s/%s, send %d failed: rank %d's error does not name its peer "
                         "(peer %d): %s",
                         dsim_algo_name(algo), how, k, r, er->peer, er->msg);
            if (shown < 3) {
                printf("#   %s/%s send %d: rank %d: %s: %s\n", dsim_algo_name(algo), how, k, r,
                       dsim_strerror(er->code), er->msg);
                shown++;
            }
        }
        if (injected < 0)
            fail_msg("%s/%s, send %d failed but no rank said so", dsim_algo_name(algo), how, k);
        /* The peer that lost the message cannot have finished; others may
         * have, when the lost message was not on their way. */
        assert_true(failed >= 2);
        if (failed < NRANKS)
            partial++;
    }
    printf("# %s, others ended by %s: %d sends, each failed in turn (%d jobs, slowest %lld ms; "
           "in %d some rank had finished, exact)\n",
           dsim_algo_name(algo), how, k - 1, k, (long long)(slowest / MS), partial);
}

static void test_loop_ring_abort(void **state)
{
    (void)state;
    send_loop(DSIM_ALGO_RING, true, 2, 10000 * MS);
}

static void test_loop_rhd_abort(void **state)
{
    (void)state;
    send_loop(DSIM_ALGO_RHD, true, 2, 10000 * MS);
}

static void test_loop_tree_abort(void **state)
{
    (void)state;
    send_loop(DSIM_ALGO_TREE, true, 2, 10000 * MS);
}

static void test_loop_reduce_to_one_abort(void **state)
{
    (void)state;
    send_loop(DSIM_ALGO_REDUCE_TO_ONE, true, 2, 10000 * MS);
}

/* Nobody aborts: the timeout alone ends every rank (one allreduce and the
 * barrier, to keep the waits few). */
static void test_loop_ring_timeout(void **state)
{
    (void)state;
    send_loop(DSIM_ALGO_RING, false, 1, 150 * MS);
}

/* A send that failed took no sequence number: the next one to the same peer
 * arrives, in order, with no gap for the receiver to refuse. */
static void test_failed_send_takes_no_sequence_number(void **state)
{
    (void)state;
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    dsim_fabric_cfg fc = {.backend = "inproc", .nranks = 2, .rt = rt};
    dsim_fabric *f;
    assert_int_equal(dsim_fabric_open(&fc, &f), DSIM_OK);
    dsim_ep *a, *b;
    assert_int_equal(dsim_ep_open(f, 0, &a), DSIM_OK);
    assert_int_equal(dsim_ep_open(f, 1, &b), DSIM_OK);
    int v[3] = {1, 2, 3}, got[2] = {0, 0};
    dsim_req *r0, *r1, *s0, *s1, *bad = (dsim_req *)0x1;
    assert_int_equal(dsim_irecv(b, 0, 0, 7, &got[0], sizeof(int), &r0), DSIM_OK);
    assert_int_equal(dsim_irecv(b, 0, 0, 7, &got[1], sizeof(int), &r1), DSIM_OK);
    assert_int_equal(dsim_isend(a, 1, 0, 7, &v[0], sizeof(int), &s0), DSIM_OK);
    fl_arm("dsim/tp/send", 1, NULL);
    assert_int_equal(dsim_isend(a, 1, 0, 7, &v[1], sizeof(int), &bad), DSIM_EPEER);
    fl_disarm();
    assert_null(bad);
    assert_int_equal(dsim_last_error()->peer, 1);
    assert_non_null(strstr(dsim_errmsg(), "connection to peer 1 reset"));
    printf("# %s\n", dsim_errmsg());
    assert_int_equal(dsim_isend(a, 1, 0, 7, &v[2], sizeof(int), &s1), DSIM_OK);
    int64_t dl = dsim_rt_deadline(rt, 5000 * MS);
    assert_int_equal(dsim_wait(s0, dl, NULL), DSIM_OK);
    assert_int_equal(dsim_wait(s1, dl, NULL), DSIM_OK);
    assert_int_equal(dsim_wait(r0, dl, NULL), DSIM_OK);
    assert_int_equal(dsim_wait(r1, dl, NULL), DSIM_OK);
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], 3);
    dsim_ep_stats st;
    dsim_ep_get_stats(a, &st);
    assert_int_equal(st.msgs_sent, 2);
    dsim_ep_get_stats(b, &st);
    assert_int_equal(st.msgs_recv, 2);
    assert_int_equal(st.rejected_stale, 0);
    dsim_ep_close(a);
    dsim_ep_close(b);
    dsim_fabric_close(f);
    dsim_rt_destroy(rt);
}

int main(void)
{
    fl_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_send_takes_no_sequence_number),
        cmocka_unit_test(test_loop_ring_abort),
        cmocka_unit_test(test_loop_rhd_abort),
        cmocka_unit_test(test_loop_tree_abort),
        cmocka_unit_test(test_loop_reduce_to_one_abort),
        cmocka_unit_test(test_loop_ring_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("# built without libfiu: no fault points to loop over\n");
    return 77;
}
#endif
