/* Every fault kind through dsim_train on the threads engine: what heals
 * within the timeout leaves the run bit-identical to a clean one; what does
 * not fails every survivor with an error that names the lost rank or link;
 * the same seed gives the same fault events. */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/log.h"
#include "dsim/strategy.h"
#include "fault/fault.h"
#include "harness/recovery.h"
#include "strat_common.h"

#define MS (1000LL * 1000)

static dsim_train_result clean;
static const char *fl_transport; /* argv[1]: the backend under the faults */

static void fl_cfg(dsim_train_cfg *cfg)
{
    sc_cfg(cfg, "multi_worker_mirrored", 2, 2);
    cfg->timeout_ns = 1500 * MS;
    cfg->transport = fl_transport;
}

static int fl_setup(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    fl_cfg(&cfg);
    return dsim_train(&cfg, &clean) == DSIM_OK ? 0 : -1;
}

static int fl_teardown(void **state)
{
    (void)state;
    dsim_train_result_free(&clean);
    return 0;
}

static dsim_fault fl_fault(dsim_fault_what what)
{
    dsim_fault f;
    memset(&f, 0, sizeof f);
    f.what = what;
    f.rank = f.worker = f.ps = f.link_from = f.link_to = -1;
    f.step = -1;
    return f;
}

typedef struct fl_run {
    dsim_err e;
    dsim_train_result res;
    dsim_faults *fs;
    dsim_faults_stats stats;
} fl_run;

static void fl_go(fl_run *r, const dsim_fault *faults, size_t n, uint64_t seed)
{
    dsim_train_cfg cfg;
    fl_cfg(&cfg);
    assert_int_equal(
        dsim_faults_create(faults, n, seed, cfg.hosts, cfg.devices_per_host, 0, &r->fs), DSIM_OK);
    dsim_faults_attach(r->fs, &cfg);
    r->e = dsim_train(&cfg, &r->res);
    dsim_faults_get_stats(r->fs, &r->stats);
}

/* What each replica ended with, for a failure to explain itself. */
static void fl_explain(const fl_run *r)
{
    for (int q = 0; r->res.replicas && q < r->res.num_replicas; q++)
        print_message("replica %d: %s: %s\n", q, dsim_strerror(r->res.replicas[q].status),
                      r->res.replicas[q].msg[0] ? r->res.replicas[q].msg : "");
}

static void fl_done(fl_run *r)
{
    dsim_train_result_free(&r->res);
    dsim_faults_destroy(r->fs);
}

static void fl_assert_clean(const fl_run *r)
{
    if (r->e != DSIM_OK)
        fail_msg("the run failed: %s", r->res.error.msg);
    assert_int_equal(r->res.steps, clean.steps);
    assert_memory_equal(r->res.params, clean.params, clean.n_params * sizeof(float));
    assert_true(r->res.in_sync_every_step);
}

/* Every survivor failed, naming `who` in its message, and none of them
 * took longer than bound_ns after `since`. */
static void fl_assert_detected(const fl_run *r, int lost, const char *word, int64_t bound_ns)
{
    assert_int_not_equal(r->e, DSIM_OK);
    if (word && !strstr(r->res.error.msg, word))
        fail_msg("expected '%s' in the job's error: %s", word, r->res.error.msg);
    int64_t t_lost = -1;
    if (lost >= 0) {
        t_lost = r->res.replicas[lost].t_end;
        assert_true(r->res.replicas[lost].killed);
    }
    for (int q = 0; q < r->res.num_replicas; q++) {
        if (q == lost || r->res.replicas[q].killed)
            continue;
        assert_int_not_equal(r->res.replicas[q].status, DSIM_OK);
        if (t_lost >= 0 && r->res.replicas[q].t_end - t_lost > bound_ns)
            fail_msg("replica %d returned %.3f s after the loss (bound %.3f s)", q,
                     (double)(r->res.replicas[q].t_end - t_lost) / 1e9, (double)bound_ns / 1e9);
    }
}

static void test_no_faults_is_pass_through(void **state)
{
    (void)state;
    fl_run r;
    fl_go(&r, NULL, 0, 1);
    fl_assert_clean(&r);
    assert_true(r.stats.frames_seen > 0);
    assert_int_equal(r.stats.dropped + r.stats.held, 0);
    fl_done(&r);
}

static void test_kill_between_collectives(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_KILL);
    f.when = DSIM_WHEN_STEP;
    f.step = 5;
    f.rank = 3;
    fl_run r;
    fl_go(&r, &f, 1, 1);
    fl_assert_detected(&r, 3, "rank 3", 1500 * MS + 2500 * MS);
    assert_int_equal(r.res.error.peer, 3);
    assert_int_equal(r.res.replicas[3].global_step, 5);
    assert_int_equal(r.res.replicas[3].phase, DSIM_PHASE_COMPUTE);
    assert_int_equal(dsim_faults_rank_lost(r.fs, 3), 1);
    const dsim_fault_event *ev;
    assert_true(dsim_faults_events(r.fs, &ev) >= 1);
    assert_non_null(strstr(ev[0].text, "rank 3 killed"));
    fl_done(&r);
}

static void test_kill_during_variable_creation(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_KILL);
    f.when = DSIM_WHEN_PHASE;
    f.phase = "create_variables";
    f.worker = 1; /* ranks 2 and 3: one process */
    fl_run r;
    fl_go(&r, &f, 1, 1);
    assert_int_not_equal(r.e, DSIM_OK);
    assert_true(r.res.replicas[2].killed && r.res.replicas[3].killed);
    /* the process died as a whole: its other replica wherever it was */
    assert_true(r.res.replicas[2].phase <= DSIM_PHASE_CREATE_VARIABLES);
    assert_true(r.res.replicas[3].phase <= DSIM_PHASE_CREATE_VARIABLES);
    assert_true(r.res.error.peer == 2 || r.res.error.peer == 3);
    fl_done(&r);
}

static void test_kill_mid_allreduce(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_KILL);
    f.when = DSIM_WHEN_PHASE;
    f.phase = "allreduce";
    f.step = 2;
    f.rank = 1;
    f.after_messages = 1; /* it sent one frame of the all-reduce, then died */
    fl_run r;
    fl_go(&r, &f, 1, 1);
    fl_assert_detected(&r, 1, "rank 1", 1500 * MS + 2500 * MS);
    assert_int_equal(r.res.replicas[1].global_step, 2);
    fl_done(&r);
}

static void test_pause_that_heals_changes_nothing(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_PAUSE);
    f.when = DSIM_WHEN_STEP;
    f.step = 3;
    f.rank = 2;
    f.duration_ns = 300 * MS; /* well inside the 1.5 s timeout */
    fl_run r;
    fl_go(&r, &f, 1, 1);
    fl_assert_clean(&r);
    const dsim_fault_event *ev;
    size_t n = dsim_faults_events(r.fs, &ev);
    int paused = 0, resumed = 0;
    for (size_t i = 0; i < n; i++) {
        paused += strstr(ev[i].text, "rank 2 paused") != NULL;
        resumed += strstr(ev[i].text, "rank 2 resumed") != NULL;
    }
    assert_int_equal(paused, 1);
    assert_int_equal(resumed, 1);
    fl_done(&r);
}

static void test_pause_for_good_is_detected(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_PAUSE);
    f.when = DSIM_WHEN_STEP;
    f.step = 3;
    f.rank = 2;
    fl_run r;
    fl_go(&r, &f, 1, 1);
    fl_assert_detected(&r, 2, "rank 2", 1500 * MS + 2500 * MS);
    fl_done(&r);
}

static void test_partition_that_heals_changes_nothing(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_PARTITION);
    f.when = DSIM_WHEN_STEP;
    f.step = 4;
    f.worker = 0; /* worker 0 against worker 1 */
    f.duration_ns = 400 * MS;
    fl_run r;
    fl_go(&r, &f, 1, 1);
    fl_assert_clean(&r);
    assert_true(r.stats.held > 0);
    fl_done(&r);
}

static void test_partition_for_good_fails(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_PARTITION);
    f.when = DSIM_WHEN_STEP;
    f.step = 4;
    f.link_from = 0;
    f.link_to = 2;
    f.one_way = true;
    fl_run r;
    fl_go(&r, &f, 1, 1);
    assert_int_not_equal(r.e, DSIM_OK);
    assert_non_null(strstr(r.res.error.msg, "timed out"));
    fl_done(&r);
}

static void test_drop_is_seen_as_a_gap_or_retransmitted(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_DROP);
    f.when = DSIM_WHEN_STEP;
    f.step = 2;
    f.link_from = 1;
    f.link_to = 0;
    f.one_way = true;
    fl_run r;
    fl_go(&r, &f, 1, 1);
    assert_int_not_equal(r.e, DSIM_OK);
    if (!strstr(r.res.error.msg, "lost") && !strstr(r.res.error.msg, "timed out"))
        fail_msg("a lost frame should show as a sequence gap or a timeout: %s", r.res.error.msg);
    assert_int_equal(r.stats.dropped, 1);
    fl_done(&r);

    f.retransmit = true;
    f.rto_ns = 50 * MS;
    fl_go(&r, &f, 1, 1);
    fl_assert_clean(&r);
    fl_done(&r);
}

static void test_corrupt_is_detected_not_used(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_CORRUPT);
    f.when = DSIM_WHEN_STEP;
    f.step = 3;
    f.link_from = 2;
    f.link_to = 0;
    f.one_way = true;
    fl_run r;
    fl_go(&r, &f, 1, 1);
    if (r.e == DSIM_OK || !strstr(r.res.error.msg, "corrupt") || r.stats.corrupted != 1) {
        fl_explain(&r);
        fail_msg("%" PRIu64 " frame(s) corrupted; the run %s: %s", r.stats.corrupted,
                 r.e == DSIM_OK ? "passed" : "failed", r.res.error.msg);
    }
    fl_done(&r);
}

static void test_duplicate_and_delay_change_nothing(void **state)
{
    (void)state;
    dsim_fault f[2] = {fl_fault(DSIM_FAULT_DUPLICATE), fl_fault(DSIM_FAULT_DELAY)};
    f[0].when = DSIM_WHEN_PROBABILITY;
    f[0].probability = 0.2;
    f[1].when = DSIM_WHEN_PROBABILITY;
    f[1].probability = 0.3;
    f[1].duration_ns = 2 * MS;
    f[1].jitter_ns = 3 * MS;
    fl_run r;
    fl_go(&r, f, 2, 5);
    fl_assert_clean(&r);
    assert_true(r.stats.duplicated > 0);
    assert_true(r.stats.delayed > 0);
    fl_done(&r);
}

static void test_reorder_is_detected(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_REORDER);
    f.when = DSIM_WHEN_STEP;
    f.step = 1;
    f.link_from = 0;
    f.link_to = 1;
    f.one_way = true;
    fl_run r;
    fl_go(&r, &f, 1, 1);
    /* Either the link carried another frame behind it (a gap: EPROTO), or
     * it stayed held (a timeout): it is never silently used out of order. */
    if (r.e == DSIM_OK)
        fl_assert_clean(&r);
    else if (!strstr(r.res.error.msg, "lost") && !strstr(r.res.error.msg, "timed out"))
        fail_msg("unexpected error: %s", r.res.error.msg);
    assert_int_equal(r.stats.reordered, 1);
    fl_done(&r);
}

static void test_straggler_and_stagger_change_nothing(void **state)
{
    (void)state;
    dsim_fault f[2] = {fl_fault(DSIM_FAULT_SLOW), fl_fault(DSIM_FAULT_STAGGER)};
    f[0].when = DSIM_WHEN_STEP;
    f[0].step = 0;
    f[0].rank = 1;
    f[0].factor = 5;
    f[1].when = DSIM_WHEN_PHASE;
    f[1].phase = "start";
    f[1].scope = DSIM_SCOPE_ALL;
    f[1].duration_ns = 200 * MS;
    fl_run r;
    fl_go(&r, f, 2, 3);
    fl_assert_clean(&r);
    fl_done(&r);
}

/* A slowed rank's pause lasts as long as the pause: the slow fault
 * stretches the compute that follows it, not the wait (a pause of 600 ms
 * on a rank slowed 5x lasted 3 s, past the 1.5 s timeout). */
static void test_slowed_and_paused(void **state)
{
    (void)state;
    dsim_fault f[2] = {fl_fault(DSIM_FAULT_SLOW), fl_fault(DSIM_FAULT_PAUSE)};
    for (int i = 0; i < 2; i++) {
        f[i].when = DSIM_WHEN_STEP;
        f[i].step = 3;
        f[i].rank = 2;
    }
    f[0].factor = 5;
    f[1].duration_ns = 600 * MS;
    fl_run r;
    fl_go(&r, f, 2, 4);
    if (r.e != DSIM_OK)
        fl_explain(&r);
    fl_assert_clean(&r);
    fl_done(&r);
}

static void test_restart_revokes_the_group(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_RESTART);
    f.when = DSIM_WHEN_STEP;
    f.step = 2;
    f.rank = 3;
    f.duration_ns = 50 * MS; /* back long before the 1.5 s timeout */
    fl_run r;
    fl_go(&r, &f, 1, 1);
    fl_assert_detected(&r, 3, "restarted", 500 * MS);
    fl_done(&r);
}

/* The restart's abort is logged by the fault layer's worker with the
 * fault layer unlocked: held up there, it lets the job fail and close its
 * fabric, whose stop request must not be lost on a worker that goes to
 * sleep afterwards (it was: 2 hangs in about 8,000 runs of
 * worker_restarts_quickly). */
static void fl_slow_abort_log(dsim_log_level level, const char *file, int line, const char *msg,
                              void *user)
{
    (void)level;
    (void)file;
    (void)line;
    (void)user;
    if (strstr(msg, "a new incarnation joined"))
        usleep(500 * 1000);
}

typedef struct {
    const dsim_fault *f;
    fl_run r;
    atomic_int done;
} fl_bg;

static void *fl_bg_main(void *p)
{
    fl_bg *b = p;
    fl_go(&b->r, b->f, 1, 1);
    atomic_store(&b->done, 1);
    return NULL;
}

static void test_restart_stop_while_aborting(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_RESTART);
    f.when = DSIM_WHEN_STEP;
    f.step = 2;
    f.rank = 3;
    f.duration_ns = 50 * MS;
    dsim_log_set_handler(fl_slow_abort_log, NULL);
    fl_bg b = {.f = &f};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fl_bg_main, &b), 0);
    for (int i = 0; i < 200 && !atomic_load(&b.done); i++)
        usleep(50 * 1000);
    if (!atomic_load(&b.done))
        fail_msg("the job did not return within 10 s: closing its fabric waits on the fault "
                 "layer's worker");
    pthread_join(t, NULL);
    dsim_log_set_handler(NULL, NULL);
    fl_assert_detected(&b.r, 3, "restarted", 500 * MS);
    fl_done(&b.r);
}

static void test_same_seed_same_events(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_DROP);
    f.when = DSIM_WHEN_PROBABILITY;
    f.probability = 0.01;
    f.link_from = 0;
    f.link_to = 1;
    f.one_way = true;
    char first[4][160];
    size_t nfirst = 0;
    dsim_err efirst = DSIM_OK;
    for (int k = 0; k < 2; k++) {
        fl_run r;
        fl_go(&r, &f, 1, 99);
        const dsim_fault_event *ev;
        size_t n = dsim_faults_events(r.fs, &ev);
        if (k == 0) {
            efirst = r.e;
            nfirst = n;
            for (size_t i = 0; i < n && i < 4; i++)
                snprintf(first[i], sizeof first[i], "%s", ev[i].text);
        } else {
            /* which survivor reports first is the threads' race; what the
             * faults did is not */
            assert_int_equal(r.e != DSIM_OK, efirst != DSIM_OK);
            assert_int_equal(n, nfirst);
            for (size_t i = 0; i < n && i < 4; i++)
                assert_string_equal(ev[i].text, first[i]);
        }
        fl_done(&r);
    }
}

/* BackupAndRestore: the chief checkpoints every 2 steps, rank 3 dies at
 * step 5, every worker restarts from the checkpoint of step 4 and the job
 * ends with the same bits as a clean run; the timeline says what happened. */
static void test_recovery_ends_equal_to_a_clean_run(void **state)
{
    (void)state;
    char path[] = "/tmp/dsim-test-recovery-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    dsim_train_cfg cfg;
    fl_cfg(&cfg);
    cfg.checkpoint_path = path;
    cfg.checkpoint_every = 2;
    dsim_fault f[2] = {fl_fault(DSIM_FAULT_KILL), fl_fault(DSIM_FAULT_PAUSE)};
    f[0].when = DSIM_WHEN_STEP;
    f[0].step = 5;
    f[0].rank = 3;
    f[1].when = DSIM_WHEN_STEP;
    f[1].step = 11; /* the second attempt loses rank 1 for good too */
    f[1].rank = 1;
    dsim_recovery_opts o = {.faults = f,
                            .n_faults = 2,
                            .seed = 1,
                            .restart = true,
                            .max_restarts = 3,
                            .want_clean = true};
    dsim_recovery_run r;
    assert_int_equal(dsim_recovery_run_job(&cfg, &o, &r), DSIM_OK);
    assert_true(r.has_clean);
    assert_int_equal(r.clean_err, DSIM_OK);
    if (r.err != DSIM_OK)
        fail_msg("recovery did not finish: %s", r.final.error.msg);
    assert_int_equal(r.restarts, 2);
    assert_true(r.has_broken);
    assert_int_equal(r.lost_rank, 3);
    assert_true(r.t_loss > 0);
    assert_int_equal(r.broken.replicas[3].global_step, 5);
    /* resumed at the last checkpoint before the second loss */
    assert_int_equal(r.final.first_step, 10);
    assert_int_equal(r.final.first_step + r.final.steps, clean.steps);
    assert_memory_equal(r.final.params, clean.params, clean.n_params * sizeof(float));
    assert_memory_equal(r.clean.params, clean.params, clean.n_params * sizeof(float));
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    dsim_recovery_print_timeline(&r, mf);
    fclose(mf);
    /* one kill, named once, at the place it happened */
    assert_non_null(strstr(buf, "rank 3 killed at compute of step 5 (at its trigger)"));
    assert_non_null(strstr(buf, "rank 3 (worker 1) lost by fault 0"));
    /* the attempt in the middle is kept: the job's coverage spans all three */
    assert_int_equal(dsim_recovery_attempt_count(&r), 3);
    assert_int_equal(r.n_mid, 1);
    assert_true(r.lost && r.n_ranks == 4 && r.lost[3] && !r.lost[0] && !r.lost[1] && !r.lost[2]);
    assert_true(r.resumed && r.n_resumed == 3 && r.resumed[2] &&
                r.resumed[2]->global_step == r.final.first_step);
    assert_non_null(strstr(buf, "after the loss"));
    assert_non_null(strstr(buf, "2 restart(s); the last attempt finished"));
    free(buf);
    dsim_recovery_run_free(&r);
    unlink(path);
}

/* A job that keeps failing stops after max_restarts. */
static void test_recovery_gives_up(void **state)
{
    (void)state;
    dsim_train_cfg cfg;
    fl_cfg(&cfg);
    cfg.timeout_ns = 300 * MS;
    dsim_fault f = fl_fault(DSIM_FAULT_CORRUPT);
    f.when = DSIM_WHEN_PROBABILITY;
    f.probability = 1.0; /* every frame: nothing ever gets through */
    dsim_recovery_opts o = {
        .faults = &f, .n_faults = 1, .seed = 1, .restart = true, .max_restarts = 2};
    dsim_recovery_run r;
    assert_int_equal(dsim_recovery_run_job(&cfg, &o, &r), DSIM_OK);
    assert_int_not_equal(r.err, DSIM_OK);
    assert_int_equal(r.restarts, 2);
    assert_non_null(strstr(r.final.error.msg, "corrupt"));
    dsim_recovery_run_free(&r);
}

/* Where a fault acts when the file does not name a rank: scope one (a rank
 * drawn with the seed: the same for the same seed), majority (N/2 + 1 of
 * the N replicas), and a list of ranks; when: at a time, or with a
 * probability at each step. */
static void test_scopes_lists_and_triggers(void **state)
{
    (void)state;
    int killed[2] = {0, 0}, victim[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        dsim_fault f = fl_fault(DSIM_FAULT_KILL);
        f.when = DSIM_WHEN_STEP;
        f.step = 3;
        f.scope = DSIM_SCOPE_ONE;
        fl_run r;
        fl_go(&r, &f, 1, 7);
        assert_int_not_equal(r.e, DSIM_OK);
        for (int q = 0; q < 4; q++)
            if (dsim_faults_rank_lost(r.fs, q)) {
                killed[k]++;
                victim[k] = q;
            }
        fl_done(&r);
    }
    assert_int_equal(killed[0], 1);
    assert_int_equal(killed[1], 1);
    assert_int_equal(victim[0], victim[1]); /* the seed decides */

    /* a pause acts on every rank it names: majority pauses N/2 + 1 of the
     * N replicas, a list the ranks listed; healed, the run ends as a clean
     * one */
    dsim_fault m = fl_fault(DSIM_FAULT_PAUSE);
    m.when = DSIM_WHEN_STEP;
    m.step = 3;
    m.duration_ns = 50 * MS;
    m.scope = DSIM_SCOPE_MAJORITY;
    dsim_fault l = m;
    l.scope = DSIM_SCOPE_GIVEN;
    l.step = 5;
    l.ranks[0] = 0;
    l.ranks[1] = 3;
    l.n_ranks = 2;
    dsim_fault both[2] = {m, l};
    fl_run r;
    fl_go(&r, both, 2, 7);
    fl_assert_clean(&r);
    const dsim_fault_event *ev;
    size_t nev = dsim_faults_events(r.fs, &ev);
    int paused[2] = {0, 0};
    bool listed[4] = {false, false, false, false};
    for (size_t k = 0; k < nev; k++) {
        if (!strstr(ev[k].text, " paused at ") || ev[k].fault < 0 || ev[k].fault > 1)
            continue;
        paused[ev[k].fault]++;
        if (ev[k].fault == 1 && ev[k].rank >= 0 && ev[k].rank < 4)
            listed[ev[k].rank] = true;
    }
    assert_int_equal(paused[0], 3); /* 4/2 + 1 */
    assert_int_equal(paused[1], 2);
    assert_true(listed[0] && listed[3] && !listed[1] && !listed[2]);
    fl_done(&r);

    /* at a time: it fires once the job has run that long */
    dsim_fault t = fl_fault(DSIM_FAULT_KILL);
    t.when = DSIM_WHEN_TIME;
    t.time_ns = 1;
    t.rank = 2;
    fl_go(&r, &t, 1, 1);
    fl_assert_detected(&r, 2, "rank 2", 1500 * MS + 2500 * MS);
    fl_done(&r);

    /* with probability 1 at each step: at the first computing step */
    dsim_fault p = fl_fault(DSIM_FAULT_KILL);
    p.when = DSIM_WHEN_PROBABILITY;
    p.probability = 1.0;
    p.rank = 1;
    fl_go(&r, &p, 1, 1);
    fl_assert_detected(&r, 1, "rank 1", 1500 * MS + 2500 * MS);
    assert_int_equal(r.res.replicas[1].phase, DSIM_PHASE_COMPUTE);
    fl_done(&r);
}

/* What fired in an earlier attempt is marked done and does not fire again;
 * dsim_faults_fired reports it. A cluster that cannot be is refused. */
static void test_done_and_fired(void **state)
{
    (void)state;
    dsim_fault f = fl_fault(DSIM_FAULT_KILL);
    f.when = DSIM_WHEN_STEP;
    f.step = 3;
    f.rank = 1;
    dsim_train_cfg cfg;
    fl_cfg(&cfg);
    dsim_faults *fs = NULL;
    assert_int_equal(dsim_faults_create(&f, 1, 1, cfg.hosts, cfg.devices_per_host, 0, &fs),
                     DSIM_OK);
    bool done = true, fired = false;
    dsim_faults_mark_done(fs, &done, 1);
    dsim_faults_fired(fs, &fired, 1);
    assert_true(fired);
    dsim_faults_attach(fs, &cfg);
    dsim_train_result res;
    assert_int_equal(dsim_train(&cfg, &res), DSIM_OK); /* the kill does not fire again */
    assert_int_equal(dsim_faults_rank_lost(fs, 1), 0);
    assert_memory_equal(res.params, clean.params, clean.n_params * sizeof(float));
    dsim_train_result_free(&res);
    dsim_faults_destroy(fs);
    assert_int_equal(dsim_faults_create(&f, 1, 1, 0, 2, 0, &fs), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "dsim_faults_create: bad cluster 0 x 2 + 0"));
}

/* The table of fault kinds (sim/fault/kinds.c): every kind has a name, a
 * summary and what it loses; the list for messages names every kind, in
 * order; a fault that is no kind is refused, naming the kinds. */
static void test_kind_table(void **state)
{
    (void)state;
    char all[512];
    dsim_fault_kind_list(all, sizeof all);
    size_t off = 0;
    for (int w = 0; w < DSIM_FAULT_WHAT_COUNT; w++) {
        const dsim_fault_kind *k = dsim_fault_kind_of((dsim_fault_what)w);
        assert_non_null(k);
        assert_int_equal(k->what, w);
        assert_true(k->size == sizeof *k);
        assert_string_equal(k->name, dsim_fault_what_name((dsim_fault_what)w));
        assert_true(strlen(k->summary) > 10);
        const char *at = strstr(all + off, k->name);
        assert_non_null(at);
        off = (size_t)(at - all) + strlen(k->name);
    }
    assert_int_equal(off, strlen(all));
    assert_non_null(strstr(all, "preempt"));
    assert_null(dsim_fault_kind_of(DSIM_FAULT_WHAT_COUNT));
    assert_string_equal(dsim_fault_what_name(DSIM_FAULT_WHAT_COUNT), "unknown");
    assert_int_equal(dsim_fault_kind_of(DSIM_FAULT_KILL)->loses, DSIM_FAULT_LOSES_PEER);
    assert_int_equal(dsim_fault_kind_of(DSIM_FAULT_CORRUPT)->loses, DSIM_FAULT_LOSES_MESSAGE);
    assert_int_equal(dsim_fault_kind_of(DSIM_FAULT_DELAY)->loses, DSIM_FAULT_LOSES_NOTHING);

    dsim_fault f[2] = {fl_fault(DSIM_FAULT_KILL), fl_fault(DSIM_FAULT_KILL)};
    f[1].what = (dsim_fault_what)99;
    dsim_faults *fs = NULL;
    assert_int_equal(dsim_faults_create(f, 2, 1, 2, 2, 0, &fs), DSIM_EINVAL);
    assert_null(fs);
    assert_non_null(strstr(dsim_errmsg(), "faults[1].what is 99"));
    assert_non_null(strstr(dsim_errmsg(), "preempt"));
    assert_int_equal(dsim_faults_create(f, 1, 1, 2, 2, 0, &fs), DSIM_OK);
    dsim_faults_destroy(fs);
}

int main(int argc, char **argv)
{
    fl_transport = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_faults_is_pass_through),
        cmocka_unit_test(test_kill_between_collectives),
        cmocka_unit_test(test_kill_during_variable_creation),
        cmocka_unit_test(test_kill_mid_allreduce),
        cmocka_unit_test(test_pause_that_heals_changes_nothing),
        cmocka_unit_test(test_pause_for_good_is_detected),
        cmocka_unit_test(test_partition_that_heals_changes_nothing),
        cmocka_unit_test(test_partition_for_good_fails),
        cmocka_unit_test(test_drop_is_seen_as_a_gap_or_retransmitted),
        cmocka_unit_test(test_corrupt_is_detected_not_used),
        cmocka_unit_test(test_duplicate_and_delay_change_nothing),
        cmocka_unit_test(test_reorder_is_detected),
        cmocka_unit_test(test_straggler_and_stagger_change_nothing),
        cmocka_unit_test(test_slowed_and_paused),
        cmocka_unit_test(test_restart_revokes_the_group),
        cmocka_unit_test(test_restart_stop_while_aborting),
        cmocka_unit_test(test_same_seed_same_events),
        cmocka_unit_test(test_recovery_ends_equal_to_a_clean_run),
        cmocka_unit_test(test_recovery_gives_up),
        cmocka_unit_test(test_kind_table),
        cmocka_unit_test(test_scopes_lists_and_triggers),
        cmocka_unit_test(test_done_and_fired),
    };
    return cmocka_run_group_tests(tests, fl_setup, fl_teardown);
}
