/* The coverage ledger: exactly-once coverage under every policy over whole
 * epochs, idle replicas, imbalance, duplicates and misses, and concurrent
 * recording from one thread per replica. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/data.h"
#include "dsim/err.h"

static void assert_msg_has(const char *needle)
{
    if (strstr(dsim_errmsg(), needle) == NULL)
        fail_msg("error message \"%s\" lacks \"%s\"", dsim_errmsg(), needle);
}

/* Runs every worker of the job through every epoch into a new ledger. */
static dsim_ledger *run_job(const dsim_input_config *base)
{
    dsim_ledger *l;
    assert_int_equal(dsim_ledger_create(base->dataset->n_examples, base->epochs, base->num_workers,
                                        base->replicas_per_worker, &l),
                     DSIM_OK);
    for (int w = 0; w < base->num_workers; w++) {
        dsim_input_config c = *base;
        c.worker = w;
        dsim_input *in;
        assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
        for (;;) {
            dsim_input_step st;
            assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
            if (st.done)
                break;
            assert_int_equal(dsim_ledger_record_step(l, w, &st), DSIM_OK);
        }
        dsim_input_destroy(in);
    }
    return l;
}

static void expect_exact(const dsim_ledger *l, uint32_t epoch, int worker, uint32_t expected,
                         uint64_t n, const char *what)
{
    dsim_coverage cov;
    assert_int_equal(dsim_ledger_coverage(l, epoch, worker, expected, &cov), DSIM_OK);
    if (cov.exact != n || cov.duplicates || cov.misses || cov.out_of_range)
        fail_msg("%s epoch %u worker %d: %llu exact, %llu duplicates, %llu misses of %llu", what,
                 epoch, worker, (unsigned long long)cov.exact, (unsigned long long)cov.duplicates,
                 (unsigned long long)cov.misses, (unsigned long long)n);
    assert_int_equal(cov.reads, n * expected);
}

static void test_coverage_every_policy(void **state)
{
    (void)state;
    static const struct {
        uint64_t n;
        uint32_t files;
        int64_t g;
        int w, r;
    } jobs[] = {
        {1000, 8, 64, 4, 2}, {997, 5, 30, 3, 3}, {50, 7, 7, 2, 2},
        {33, 4, 5, 4, 1},    {200, 3, 9, 1, 4},  {17, 6, 40, 3, 2},
    };
    static const dsim_shard_policy ps[] = {DSIM_SHARD_DATA, DSIM_SHARD_FILE, DSIM_SHARD_AUTO,
                                           DSIM_SHARD_HINT, DSIM_SHARD_OFF};
    for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++) {
        for (int with_files = 0; with_files < 2; with_files++) {
            dsim_dataset_desc d;
            assert_int_equal(
                dsim_dataset_desc_init(&d, jobs[j].n, with_files ? jobs[j].files : 0,
                                       j % 2 ? DSIM_FILES_STRIDED : DSIM_FILES_CONTIGUOUS),
                DSIM_OK);
            for (size_t p = 0; p < sizeof ps / sizeof *ps; p++) {
                if (ps[p] == DSIM_SHARD_FILE && !with_files && jobs[j].w > 1)
                    continue; /* the FILE error, tested elsewhere */
                for (int hint = 0; hint < 3; hint++) {
                    if (ps[p] != DSIM_SHARD_HINT && hint > 0)
                        break;
                    d.hint = (dsim_shard_hint)hint;
                    if (d.hint == DSIM_HINT_FILES && !with_files)
                        continue;
                    dsim_input_config c = {.dataset = &d,
                                           .policy = ps[p],
                                           .global_batch = jobs[j].g,
                                           .num_workers = jobs[j].w,
                                           .replicas_per_worker = jobs[j].r,
                                           .seed = 99 + j,
                                           .shuffle = (j + p) % 2 == 0,
                                           .epochs = 3};
                    dsim_ledger *l = run_job(&c);
                    bool off = ps[p] == DSIM_SHARD_OFF ||
                               (ps[p] == DSIM_SHARD_HINT && d.hint == DSIM_HINT_NONE);
                    for (uint32_t e = 0; e < 3; e++) {
                        if (off) {
                            /* once per worker: W times in all */
                            expect_exact(l, e, -1, (uint32_t)jobs[j].w, jobs[j].n, "off");
                            for (int w = 0; w < jobs[j].w; w++)
                                expect_exact(l, e, w, 1, jobs[j].n, "off, one worker");
                        } else {
                            expect_exact(l, e, -1, 1, jobs[j].n, dsim_shard_policy_name(ps[p]));
                        }
                    }
                    dsim_ledger_destroy(l);
                }
            }
            dsim_dataset_desc_release(&d);
        }
    }
}

static void test_idle_and_imbalance(void **state)
{
    (void)state;
    /* DATA with G=6 over N=4 replicas cuts [2,2,2,0]: replica 3 never gets
     * data, which the ledger reports every step. */
    dsim_dataset_desc d = {.n_examples = 24};
    dsim_input_config c = {.dataset = &d,
                           .policy = DSIM_SHARD_DATA,
                           .global_batch = 6,
                           .num_workers = 2,
                           .replicas_per_worker = 2,
                           .epochs = 1};
    dsim_ledger *l = run_job(&c);
    dsim_coverage cov;
    assert_int_equal(dsim_ledger_coverage(l, 0, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.exact, 24);
    assert_int_equal(cov.steps, 4);
    assert_int_equal(cov.idle, 4);
    assert_int_equal(cov.min_examples, 0);
    assert_int_equal(cov.min_replica, 3);
    assert_int_equal(cov.max_examples, 8);
    assert_true(isinf(cov.imbalance));
    dsim_idle idle[8];
    size_t total;
    assert_int_equal(dsim_ledger_idle(l, 0, -1, idle, 8, &total), DSIM_OK);
    assert_int_equal(total, 4);
    for (int s = 0; s < 4; s++) {
        assert_int_equal(idle[s].step, s);
        assert_int_equal(idle[s].replica, 3);
    }
    /* Worker 0 alone is balanced and never idle. */
    assert_int_equal(dsim_ledger_coverage(l, 0, 0, 1, &cov), DSIM_OK);
    assert_int_equal(cov.idle, 0);
    assert_true(cov.imbalance == 1.0);
    assert_int_equal(cov.misses, 24 - 16);
    dsim_ledger_destroy(l);

    /* The FILE partial batch: files of 5 and 2, G=4, W=2, R=2. Step 0 feeds
     * all four replicas, step 1 only worker 0's two, step 2 only w0 r0. */
    uint64_t fs[] = {0, 5, 7}, ids[] = {0, 1, 2, 3, 4, 5, 6};
    dsim_dataset_desc fd = {.n_examples = 7, .n_files = 2, .file_start = fs, .file_ids = ids};
    c.dataset = &fd;
    c.policy = DSIM_SHARD_FILE;
    c.global_batch = 4;
    l = run_job(&c);
    assert_int_equal(dsim_ledger_coverage(l, 0, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.exact, 7);
    assert_int_equal(cov.steps, 3);
    /* step 1: w1 has nothing (2 idle); step 2: only w0 r0 (3 idle) */
    assert_int_equal(cov.idle, 5);
    assert_int_equal(cov.max_examples, 3);
    assert_int_equal(cov.max_replica, 0);
    assert_int_equal(cov.min_examples, 1);
    assert_true(cov.imbalance == 3.0);
    assert_int_equal(dsim_ledger_idle(l, 0, -1, idle, 2, &total), DSIM_OK);
    assert_int_equal(total, 5);
    assert_int_equal(idle[0].step, 1);
    assert_int_equal(idle[0].replica, 2);
    assert_int_equal(idle[1].replica, 3);
    dsim_ledger_destroy(l);
}

static void test_duplicates_misses_readers(void **state)
{
    (void)state;
    dsim_ledger *l;
    assert_int_equal(dsim_ledger_create(10, 2, 2, 2, &l), DSIM_OK);
    const uint64_t a[] = {0, 1, 2}, b[] = {2, 3}, c[] = {4, 12}, e[] = {5};
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, a, 3), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 0, 0, b, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 2, 0, 0, c, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 3, 0, 0, NULL, 0), DSIM_OK);
    /* a second record for the same step adds to it */
    assert_int_equal(dsim_ledger_record(l, 0, 0, 1, e, 1), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 0, 1, b, 1), DSIM_OK);
    /* another epoch stays apart */
    assert_int_equal(dsim_ledger_record(l, 3, 1, 0, a, 3), DSIM_OK);

    dsim_coverage cov;
    assert_int_equal(dsim_ledger_coverage(l, 0, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.reads, 9);
    assert_int_equal(cov.out_of_range, 1);
    assert_int_equal(cov.duplicates, 1); /* id 2, three times */
    assert_int_equal(cov.misses, 4);     /* 6..9 */
    assert_int_equal(cov.exact, 5);      /* 0,1,3,4,5 */
    assert_int_equal(cov.steps, 2);
    /* step 0: replica 3 empty; step 1: replicas 1..3 not recorded */
    assert_int_equal(cov.idle, 4);
    assert_int_equal(cov.max_examples, 5);
    assert_int_equal(cov.max_replica, 0);
    assert_int_equal(cov.min_replica, 3);

    uint64_t ids[8];
    size_t total;
    assert_int_equal(dsim_ledger_list(l, 0, -1, 1, DSIM_LEDGER_DUPLICATES, ids, 8, &total),
                     DSIM_OK);
    assert_int_equal(total, 1);
    assert_int_equal(ids[0], 2);
    assert_int_equal(dsim_ledger_list(l, 0, -1, 1, DSIM_LEDGER_MISSES, ids, 2, &total), DSIM_OK);
    assert_int_equal(total, 4);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 7);
    int who[4];
    assert_int_equal(dsim_ledger_readers(l, 0, 2, who, 4, &total), DSIM_OK);
    assert_int_equal(total, 3);
    assert_int_equal(who[0], 0);
    assert_int_equal(who[1], 0);
    assert_int_equal(who[2], 1);
    uint32_t counts[10];
    assert_int_equal(dsim_ledger_counts(l, 1, -1, counts), DSIM_OK);
    assert_int_equal(counts[0] + counts[1] + counts[2], 3);
    assert_int_equal(counts[3], 0);
    assert_int_equal(dsim_ledger_counts(l, 1, 0, counts), DSIM_OK);
    assert_int_equal(counts[0], 0);

    /* bad input */
    assert_int_equal(dsim_ledger_record(l, 4, 0, 0, a, 1), DSIM_EINVAL);
    assert_msg_has("replica 4");
    assert_int_equal(dsim_ledger_record(l, 0, 2, 0, a, 1), DSIM_EINVAL);
    assert_msg_has("epoch 2");
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, NULL, 1), DSIM_EINVAL);
    assert_int_equal(dsim_ledger_coverage(l, 0, 2, 1, &cov), DSIM_EINVAL);
    assert_msg_has("worker 2");
    assert_int_equal(dsim_ledger_coverage(l, 5, -1, 1, &cov), DSIM_EINVAL);
    assert_int_equal(dsim_ledger_list(l, 0, -1, 1, (dsim_ledger_list_kind)5, ids, 8, &total),
                     DSIM_EINVAL);
    dsim_ledger_destroy(l);
    dsim_ledger_destroy(NULL);
    assert_int_equal(dsim_ledger_create(0, 1, 1, 1, &l), DSIM_EINVAL);
    assert_int_equal(dsim_ledger_create(5, 0, 1, 1, &l), DSIM_EINVAL);
    assert_int_equal(dsim_ledger_create(5, 1, 0, 1, &l), DSIM_EINVAL);
    assert_msg_has("0 workers");
}

/* A lost replica's steps re-run by another (parameter-server closures, at
 * least once): the re-run counts for the lost replica, an example both the
 * lost replica's own attempt and the re-run read is a re-run, not a
 * duplicate, and one the re-run skipped is still missed. */
static void test_reruns(void **state)
{
    (void)state;
    dsim_ledger *l;
    assert_int_equal(dsim_ledger_create(8, 1, 2, 1, &l), DSIM_OK);
    const uint64_t s0a[] = {0, 1}, s0b[] = {2, 3}, s1a[] = {4, 5}, s1b[] = {6, 7};
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, s0a, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 0, 0, s0b, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 0, 1, s1a, 2), DSIM_OK);
    /* replica 1 began step 1 (read 6, 7) and died; replica 0 re-ran it but
     * the re-run read only 6 */
    assert_int_equal(dsim_ledger_record(l, 1, 0, 1, s1b, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record_rerun(l, 0, 1, 0, 1, s1b, 1), DSIM_OK);
    dsim_coverage cov;
    assert_int_equal(dsim_ledger_coverage(l, 0, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.duplicates, 0);
    assert_int_equal(cov.reruns, 1); /* id 6 */
    assert_int_equal(cov.misses, 0);
    assert_int_equal(cov.exact, 7);
    /* the re-run counts for replica 1 (worker 1), not replica 0 */
    assert_int_equal(dsim_ledger_coverage(l, 0, 1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.reads, 5);
    assert_int_equal(cov.reruns, 1);
    assert_int_equal(dsim_ledger_coverage(l, 0, 0, 1, &cov), DSIM_OK);
    assert_int_equal(cov.reads, 4);
    assert_int_equal(cov.reruns, 0);
    assert_int_equal(cov.misses, 4); /* worker 0 alone: 2, 3, 6, 7 are worker 1's */

    /* a re-run that stands alone (the lost replica never began the step) */
    dsim_ledger *m;
    assert_int_equal(dsim_ledger_create(4, 1, 2, 1, &m), DSIM_OK);
    assert_int_equal(dsim_ledger_record(m, 0, 0, 0, s0a, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record_rerun(m, 0, 1, 0, 0, s0b, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_coverage(m, 0, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.exact, 4);
    assert_int_equal(cov.reruns, 0);
    assert_int_equal(cov.idle, 0); /* the re-run stands for replica 1 */
    /* a replica's own duplicate stays a duplicate, re-runs or not */
    assert_int_equal(dsim_ledger_record(m, 0, 0, 1, s0a, 2), DSIM_OK);
    uint64_t ids[4];
    size_t total;
    assert_int_equal(dsim_ledger_list(m, 0, -1, 1, DSIM_LEDGER_DUPLICATES, ids, 4, &total),
                     DSIM_OK);
    assert_int_equal(total, 2);
    assert_int_equal(ids[0], 0);

    /* bad input */
    assert_int_equal(dsim_ledger_record_rerun(l, 0, 0, 0, 1, s1b, 1), DSIM_EINVAL);
    assert_msg_has("re-ran replica 0");
    assert_int_equal(dsim_ledger_record_rerun(l, 0, 2, 0, 1, s1b, 1), DSIM_EINVAL);
    assert_int_equal(dsim_ledger_record_rerun(l, 0, -1, 0, 1, s1b, 1), DSIM_EINVAL);
    dsim_ledger_destroy(m);
    dsim_ledger_destroy(l);
}

/* One thread per replica: each runs its worker's input and records only its
 * own replica's batches, all at the same time. */
typedef struct rep_arg {
    dsim_input_config cfg;
    dsim_ledger *l;
    int replica;
    dsim_err err;
} rep_arg;

static void *replica_thread(void *p)
{
    rep_arg *a = p;
    dsim_input *in;
    a->err = dsim_input_create(&a->cfg, &in);
    if (a->err != DSIM_OK)
        return NULL;
    int r = a->replica % a->cfg.replicas_per_worker;
    for (;;) {
        dsim_input_step st;
        if ((a->err = dsim_input_next(in, &st)) != DSIM_OK || st.done)
            break;
        a->err =
            dsim_ledger_record(a->l, a->replica, st.epoch, st.step, st.batch[r].ids, st.batch[r].n);
        if (a->err != DSIM_OK)
            break;
    }
    dsim_input_destroy(in);
    return NULL;
}

/* A job restarted from a checkpoint (Keras BackupAndRestore): the first
 * attempt's steps before the checkpoint and the second attempt's count;
 * the first attempt's steps after the checkpoint were rolled back and run
 * again, so their reads are kept apart, not counted twice. */
static void test_restart_committed_steps(void **state)
{
    (void)state;
    /* 16 examples, 2 replicas, batches of 2 each: 4 steps per epoch */
    enum { N = 16, SPE = 4 };
    dsim_ledger *a0, *a1, *job;
    assert_int_equal(dsim_ledger_create(N, 1, 1, 2, &a0), DSIM_OK);
    assert_int_equal(dsim_ledger_create(N, 1, 1, 2, &a1), DSIM_OK);
    assert_int_equal(dsim_ledger_create(N, 1, 1, 2, &job), DSIM_OK);
    for (uint64_t s = 0; s < SPE; s++)
        for (int r = 0; r < 2; r++) {
            uint64_t ids[2] = {s * 4 + (uint64_t)r * 2, s * 4 + (uint64_t)r * 2 + 1};
            /* attempt 0 ran steps 0..2, step 2 only on replica 0 (then died) */
            if (s < 2 || (s == 2 && r == 0))
                assert_int_equal(dsim_ledger_record(a0, r, 0, s, ids, 2), DSIM_OK);
            /* attempt 1 resumed from the checkpoint of global step 1 */
            if (s >= 1)
                assert_int_equal(dsim_ledger_record(a1, r, 0, s, ids, 2), DSIM_OK);
        }
    /* attempt 0 alone would read steps 1 and 2 twice with attempt 1 */
    assert_int_equal(dsim_ledger_copy_steps(job, a0, SPE, 0, 1, false), DSIM_OK);
    assert_int_equal(dsim_ledger_copy_steps(job, a0, SPE, 1, UINT64_MAX, true), DSIM_OK);
    assert_int_equal(dsim_ledger_copy_steps(job, a1, SPE, 1, UINT64_MAX, false), DSIM_OK);
    dsim_coverage c;
    assert_int_equal(dsim_ledger_coverage(job, 0, -1, 1, &c), DSIM_OK);
    assert_int_equal(c.exact, N);
    assert_int_equal(c.duplicates, 0);
    assert_int_equal(c.misses, 0);
    assert_int_equal(c.rolled_back, 6); /* step 1 on both replicas, step 2 on one */
    assert_int_equal(c.rolled_back_steps, 2);
    assert_int_equal(c.idle, 0);
    assert_true(c.imbalance == 1);
    /* who read example 4 (step 1, replica 0): once, not with the rolled-back read */
    int who[4];
    size_t nw = 0;
    assert_int_equal(dsim_ledger_readers(job, 0, 4, who, 4, &nw), DSIM_OK);
    assert_int_equal(nw, 1);
    /* the same reads, counted as the first attempt's own: duplicates */
    dsim_ledger *naive;
    assert_int_equal(dsim_ledger_create(N, 1, 1, 2, &naive), DSIM_OK);
    assert_int_equal(dsim_ledger_copy_steps(naive, a0, SPE, 0, UINT64_MAX, false), DSIM_OK);
    assert_int_equal(dsim_ledger_copy_steps(naive, a1, SPE, 0, UINT64_MAX, false), DSIM_OK);
    assert_int_equal(dsim_ledger_coverage(naive, 0, -1, 1, &c), DSIM_OK);
    assert_int_equal(c.duplicates, 6);
    /* and the last attempt alone misses what the first committed */
    assert_int_equal(dsim_ledger_coverage(a1, 0, -1, 1, &c), DSIM_OK);
    assert_int_equal(c.misses, 4);
    /* ledgers of another shape are refused, naming both */
    dsim_ledger *other;
    assert_int_equal(dsim_ledger_create(N + 1, 1, 1, 2, &other), DSIM_OK);
    assert_int_equal(dsim_ledger_copy_steps(other, a0, SPE, 0, 1, false), DSIM_EINVAL);
    assert_msg_has("differ in shape");
    dsim_ledger_destroy(other);
    dsim_ledger_destroy(naive);
    dsim_ledger_destroy(job);
    dsim_ledger_destroy(a1);
    dsim_ledger_destroy(a0);
}

static void test_concurrent_recording(void **state)
{
    (void)state;
    enum { W = 4, R = 2, EPOCHS = 3 };
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 5003, 9, DSIM_FILES_STRIDED), DSIM_OK);
    static const dsim_shard_policy ps[] = {DSIM_SHARD_DATA, DSIM_SHARD_FILE};
    for (int p = 0; p < 2; p++) {
        dsim_ledger *l;
        assert_int_equal(dsim_ledger_create(d.n_examples, EPOCHS, W, R, &l), DSIM_OK);
        pthread_t th[W * R];
        rep_arg args[W * R];
        for (int i = 0; i < W * R; i++) {
            args[i] = (rep_arg){.cfg = {.dataset = &d,
                                        .policy = ps[p],
                                        .global_batch = 48,
                                        .num_workers = W,
                                        .replicas_per_worker = R,
                                        .worker = i / R,
                                        .seed = 5,
                                        .shuffle = true,
                                        .epochs = EPOCHS},
                                .l = l,
                                .replica = i};
            assert_int_equal(pthread_create(&th[i], NULL, replica_thread, &args[i]), 0);
        }
        for (int i = 0; i < W * R; i++) {
            assert_int_equal(pthread_join(th[i], NULL), 0);
            assert_int_equal(args[i].err, DSIM_OK);
        }
        for (uint32_t e = 0; e < EPOCHS; e++)
            expect_exact(l, e, -1, 1, d.n_examples, dsim_shard_policy_name(ps[p]));
        dsim_ledger_destroy(l);
    }
    dsim_dataset_desc_release(&d);
}

/* Queries per epoch over logs in epoch order (found by binary search) and a
 * log a re-run of an earlier epoch left out of order (walked whole): the
 * same answers either way, an epoch a replica has no record of included. */
static void test_epochs_in_and_out_of_order(void **state)
{
    (void)state;
    dsim_ledger *l;
    assert_int_equal(dsim_ledger_create(4, 4, 1, 2, &l), DSIM_OK);
    const uint64_t a01[] = {0, 1}, a23[] = {2, 3}, a2[] = {2}, a3[] = {3}, a0[] = {0},
                   all[] = {0, 1, 2, 3};
    /* replica 0, in order, nothing in epoch 2 */
    assert_int_equal(dsim_ledger_record(l, 0, 0, 0, a01, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 1, 0, a01, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 1, 1, a2, 1), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 3, 0, a01, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 0, 3, 1, a0, 1), DSIM_OK); /* 0 again */
    /* replica 1: epochs 0, 2, 3, then re-runs replica 0's step 1 of epoch 1 */
    assert_int_equal(dsim_ledger_record(l, 1, 0, 0, a23, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 2, 0, all, 4), DSIM_OK);
    assert_int_equal(dsim_ledger_record(l, 1, 3, 0, a23, 2), DSIM_OK);
    assert_int_equal(dsim_ledger_record_rerun(l, 1, 0, 1, 1, a3, 1), DSIM_OK);
    static const struct {
        uint64_t exact, dup, reads, idle, steps;
    } want[4] = {{4, 0, 4, 0, 1}, {4, 0, 4, 2, 2}, {4, 0, 4, 1, 1}, {3, 1, 5, 1, 2}};
    for (uint32_t e = 0; e < 4; e++) {
        dsim_coverage cov;
        assert_int_equal(dsim_ledger_coverage(l, e, -1, 1, &cov), DSIM_OK);
        if (cov.exact != want[e].exact || cov.duplicates != want[e].dup ||
            cov.reads != want[e].reads || cov.idle != want[e].idle || cov.steps != want[e].steps ||
            cov.misses || cov.reruns)
            fail_msg("epoch %u: exact %llu dup %llu reads %llu idle %llu steps %llu misses %llu "
                     "reruns %llu",
                     e, (unsigned long long)cov.exact, (unsigned long long)cov.duplicates,
                     (unsigned long long)cov.reads, (unsigned long long)cov.idle,
                     (unsigned long long)cov.steps, (unsigned long long)cov.misses,
                     (unsigned long long)cov.reruns);
    }
    /* epoch 1: the re-run is replica 0's step, so replica 1 read nothing */
    dsim_coverage cov;
    assert_int_equal(dsim_ledger_coverage(l, 1, -1, 1, &cov), DSIM_OK);
    assert_int_equal(cov.min_examples, 0);
    assert_int_equal(cov.min_replica, 1);
    assert_true(isinf(cov.imbalance));
    int who[4];
    size_t total;
    assert_int_equal(dsim_ledger_readers(l, 1, 3, who, 4, &total), DSIM_OK);
    assert_int_equal(total, 1);
    assert_int_equal(who[0], 1); /* the log that read it */
    assert_int_equal(dsim_ledger_readers(l, 2, 0, who, 4, &total), DSIM_OK);
    assert_int_equal(total, 1);
    assert_int_equal(who[0], 1);
    assert_int_equal(dsim_ledger_readers(l, 3, 0, who, 4, &total), DSIM_OK);
    assert_int_equal(total, 2);
    uint64_t ids[4];
    assert_int_equal(dsim_ledger_list(l, 3, -1, 1, DSIM_LEDGER_DUPLICATES, ids, 4, &total),
                     DSIM_OK);
    assert_int_equal(total, 1);
    assert_int_equal(ids[0], 0);
    dsim_idle idle[4];
    assert_int_equal(dsim_ledger_idle(l, 2, -1, idle, 4, &total), DSIM_OK);
    assert_int_equal(total, 1);
    assert_int_equal(idle[0].replica, 0);
    assert_int_equal(idle[0].step, 0);
    dsim_ledger_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coverage_every_policy),
        cmocka_unit_test(test_idle_and_imbalance),
        cmocka_unit_test(test_duplicates_misses_readers),
        cmocka_unit_test(test_reruns),
        cmocka_unit_test(test_concurrent_recording),
        cmocka_unit_test(test_restart_committed_steps),
        cmocka_unit_test(test_epochs_in_and_out_of_order),
    };
    return cmocka_run_group_tests_name("ledger", tests, NULL, NULL);
}
