/* The sim engine (sim/engine/sim.c) through the runtime API: virtual time
 * moves only to the next deadline, waits time out at exactly their
 * deadline, locks are held across waits on other queues, the run order is
 * a function of the seed, libdsim's per-worker error survives switches,
 * thousands of workers fit (more than Linux's mappings per process would
 * allow with a guard page each), each worker keeps its own floating-point
 * rounding mode, and misuse (a stack overflow included) ends the process
 * with a message instead of hanging it. */
#include <fcntl.h>
#include <fenv.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>

#include "dsim/rt.h"
#include "dsim/transport.h"
#include "engine/sim.h"

#define SEC 1000000000LL

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * SEC + ts.tv_nsec;
}

static dsim_rt *new_sim(uint64_t seed)
{
    assert_int_equal(dsim_sim_engine_register(), DSIM_OK);
    dsim_rt *rt = NULL;
    assert_int_equal(dsim_rt_create_seeded("sim", seed, &rt), DSIM_OK);
    assert_string_equal(dsim_rt_name(rt), "sim");
    assert_true(dsim_rt_deterministic(rt));
    return rt;
}

/* ---- sleeping: the clock jumps, no wall time passes ---- */

typedef struct sleeper {
    dsim_rt *rt;
    int64_t ns;
    int64_t woke_at;
    int *order, *n;
    int id;
} sleeper;

static void sleeper_main(void *p)
{
    sleeper *s = p;
    assert_int_equal(dsim_rt_self(s->rt), s->id);
    dsim_rt_sleep_until(s->rt, dsim_rt_now(s->rt) + s->ns);
    s->woke_at = dsim_rt_now(s->rt);
    s->order[(*s->n)++] = s->id;
}

static void test_sleep_jumps(void **state)
{
    (void)state;
    dsim_rt *rt = new_sim(1);
    int64_t t0 = dsim_rt_now(rt), w0 = wall_ns();
    assert_true(t0 > 0); /* 0 means "not yet" in the records */
    int order[3], n = 0;
    sleeper s[3] = {{rt, 30 * SEC, 0, order, &n, 0},
                    {rt, 10 * SEC, 0, order, &n, 1},
                    {rt, 20 * SEC, 0, order, &n, 2}};
    dsim_task *t[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(dsim_rt_spawn(rt, i, sleeper_main, &s[i], &t[i]), DSIM_OK);
    assert_int_equal(dsim_rt_self(rt), -1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    assert_int_equal(n, 3);
    assert_int_equal(order[0], 1);
    assert_int_equal(order[1], 2);
    assert_int_equal(order[2], 0);
    for (int i = 0; i < 3; i++)
        assert_true(s[i].woke_at == t0 + s[i].ns);
    assert_true(dsim_rt_now(rt) == t0 + 30 * SEC);
    /* a minute of virtual time in well under a second of wall time */
    assert_true(wall_ns() - w0 < SEC);
    /* charge moves the caller's clock and is counted */
    dsim_rt_charge(rt, 5 * SEC);
    assert_true(dsim_rt_now(rt) == t0 + 35 * SEC);
    assert_true(dsim_rt_charged(rt) == 5 * SEC);
    assert_int_equal(dsim_rt_sleep_until(rt, DSIM_NO_DEADLINE), DSIM_EINVAL);
    uint64_t events = 0;
    assert_true(dsim_rt_trace_hash(rt, &events) != 0);
    assert_true(events > 0);
    dsim_rt_destroy(rt);
}

/* ---- wait queues: deadlines, wake-ups, locks held across waits ---- */

typedef struct pc {
    dsim_rt *rt;
    dsim_waitq *q, *q2;
    int items;
    dsim_err timed;
    int64_t timed_at, deadline;
    int b_got_lock_while_a_waits;
    int a_waiting;
} pc;

static void consumer_main(void *p)
{
    pc *c = p;
    dsim_waitq_lock(c->q);
    while (c->items == 0)
        assert_int_equal(dsim_waitq_wait(c->q, DSIM_NO_DEADLINE), DSIM_OK);
    c->items--;
    /* nobody produces again: this wait times out at its deadline exactly */
    c->deadline = dsim_rt_deadline(c->rt, 10 * SEC);
    dsim_err e = DSIM_OK;
    while (c->items == 0 && e == DSIM_OK)
        e = dsim_waitq_wait(c->q, c->deadline);
    c->timed = e;
    c->timed_at = dsim_rt_now(c->rt);
    dsim_waitq_unlock(c->q);
}

static void producer_main(void *p)
{
    pc *c = p;
    dsim_rt_sleep_until(c->rt, dsim_rt_now(c->rt) + SEC);
    dsim_waitq_lock(c->q);
    c->items++;
    dsim_waitq_wake(c->q);
    dsim_waitq_unlock(c->q);
}

/* A holds q while it waits on q2; B must not get q until A lets it go. */
static void holder_main(void *p)
{
    pc *c = p;
    dsim_waitq_lock(c->q);
    dsim_waitq_lock(c->q2);
    c->a_waiting = 1;
    (void)dsim_waitq_wait(c->q2, dsim_rt_deadline(c->rt, 2 * SEC));
    c->a_waiting = 0;
    dsim_waitq_unlock(c->q2);
    dsim_waitq_unlock(c->q);
}

static void taker_main(void *p)
{
    pc *c = p;
    dsim_waitq_lock(c->q);
    if (c->a_waiting)
        c->b_got_lock_while_a_waits = 1;
    dsim_waitq_unlock(c->q);
}

static void test_waitq(void **state)
{
    (void)state;
    dsim_rt *rt = new_sim(2);
    pc c = {.rt = rt};
    assert_int_equal(dsim_waitq_create(rt, &c.q), DSIM_OK);
    assert_int_equal(dsim_waitq_create(rt, &c.q2), DSIM_OK);
    dsim_task *a, *b;
    assert_int_equal(dsim_rt_spawn(rt, 0, consumer_main, &c, &a), DSIM_OK);
    assert_int_equal(dsim_rt_spawn(rt, 1, producer_main, &c, &b), DSIM_OK);
    assert_int_equal(dsim_rt_join(rt, a), DSIM_OK);
    assert_int_equal(dsim_rt_join(rt, b), DSIM_OK);
    assert_int_equal(c.timed, DSIM_ETIMEDOUT);
    assert_true(c.timed_at == c.deadline);
    /* a deadline already passed: no wait at all */
    dsim_waitq_lock(c.q);
    assert_int_equal(dsim_waitq_wait(c.q, dsim_rt_now(rt) - 1), DSIM_ETIMEDOUT);
    dsim_waitq_unlock(c.q);

    assert_int_equal(dsim_rt_spawn(rt, 0, holder_main, &c, &a), DSIM_OK);
    assert_int_equal(dsim_rt_spawn(rt, 1, taker_main, &c, &b), DSIM_OK);
    assert_int_equal(dsim_rt_join(rt, a), DSIM_OK);
    assert_int_equal(dsim_rt_join(rt, b), DSIM_OK);
    assert_int_equal(c.b_got_lock_while_a_waits, 0);
    dsim_waitq_destroy(c.q);
    dsim_waitq_destroy(c.q2);
    dsim_rt_destroy(rt);
}

/* ---- the order of equally due workers is the seed's ---- */

typedef struct rec {
    int *order, *n, id;
} rec;

static void rec_main(void *p)
{
    rec *r = p;
    r->order[(*r->n)++] = r->id;
}

static void run_order(uint64_t seed, int *order, uint64_t *hash)
{
    dsim_rt *rt = new_sim(seed);
    enum { N = 64 };
    rec r[N];
    dsim_task *t[N];
    int n = 0;
    for (int i = 0; i < N; i++) {
        r[i] = (rec){order, &n, i};
        assert_int_equal(dsim_rt_spawn(rt, i, rec_main, &r[i], &t[i]), DSIM_OK);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    assert_int_equal(n, N);
    *hash = dsim_rt_trace_hash(rt, NULL);
    dsim_rt_destroy(rt);
}

static void test_seeded_order(void **state)
{
    (void)state;
    int a[64], b[64], c[64];
    uint64_t ha, hb, hc;
    run_order(7, a, &ha);
    run_order(7, b, &hb);
    run_order(8, c, &hc);
    assert_memory_equal(a, b, sizeof a);
    assert_true(ha == hb);
    assert_true(memcmp(a, c, sizeof a) != 0);
    assert_true(ha != hc);
}

/* ---- each worker keeps its own last error ---- */

typedef struct errw {
    dsim_rt *rt;
    int code_ok;
    dsim_err mine;
} errw;

static void err_main(void *p)
{
    errw *w = p;
    DSIM_ERR(w->mine, -1, "worker error %d", (int)w->mine);
    dsim_rt_sleep_until(w->rt, dsim_rt_now(w->rt) + SEC); /* the other one runs */
    w->code_ok = dsim_last_error()->code == w->mine;
}

static void test_worker_error_state(void **state)
{
    (void)state;
    dsim_rt *rt = new_sim(3);
    errw w[2] = {{rt, 0, DSIM_ETIMEDOUT}, {rt, 0, DSIM_EPEER}};
    dsim_task *t[2];
    dsim_clear_error();
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsim_rt_spawn(rt, i, err_main, &w[i], &t[i]), DSIM_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    assert_int_equal(w[0].code_ok, 1);
    assert_int_equal(w[1].code_ok, 1);
    assert_int_equal(dsim_last_error()->code, DSIM_OK); /* the driver's own */
    dsim_rt_destroy(rt);
}

/* ---- many workers: small stacks, detached ones freed ---- */

static void nop_main(void *p)
{
    dsim_rt *rt = p;
    dsim_rt_sleep_until(rt, dsim_rt_now(rt) + 1000);
}

static void test_many_workers(void **state)
{
    (void)state;
    setenv("DSIM_SIM_STACK_KIB", "64", 1);
    dsim_rt *rt = new_sim(4);
    enum { N = 4096 };
    dsim_task **t = calloc(N, sizeof *t);
    assert_non_null(t);
    for (int i = 0; i < N; i++)
        assert_int_equal(dsim_rt_spawn(rt, i, nop_main, rt, &t[i]), DSIM_OK);
    for (int i = 0; i < N; i += 2)
        assert_int_equal(dsim_rt_detach(rt, t[i]), DSIM_OK);
    for (int i = 1; i < N; i += 2)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    dsim_sim_stats st;
    dsim_sim_engine_totals(&st);
    assert_true(st.spawned >= N);
    dsim_rt_destroy(rt);
    dsim_sim_engine_totals(&st);
    assert_true(st.live_max >= N);
    assert_true(st.stack_bytes == 64 * 1024);
    unsetenv("DSIM_SIM_STACK_KIB");
    free(t);
}

/* Lines of /proc/self/maps: the process's memory mappings. */
static int count_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    int n = 0, c;
    while ((c = getc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* 40,000 workers alive at once: with a guard page each (two mappings per
 * stack) they would need 80,000 mappings, past vm.max_map_count's default
 * 65,530; past the first 8,192 the stacks come from shared slabs. */
#if defined(__SANITIZE_THREAD__)
#define TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_TSAN 1
#endif
#endif

static void test_beyond_map_limit(void **state)
{
    (void)state;
#ifdef TEST_TSAN
    /* ThreadSanitizer maps shadow and state of its own for each stack and
     * runs out of the process's mappings first: its runtime, not the
     * engine, then crashes (SIGSEGV in its mutex bookkeeping) */
    skip();
#endif
    setenv("DSIM_SIM_STACK_KIB", "16", 1);
    dsim_rt *rt = new_sim(5);
    enum { N = 40000 };
    dsim_task **t = calloc(N, sizeof *t);
    assert_non_null(t);
    int before = count_mappings();
    for (int i = 0; i < N; i++)
        assert_int_equal(dsim_rt_spawn(rt, i, nop_main, rt, &t[i]), DSIM_OK);
    int during = count_mappings();
    assert_true(before > 0);
    /* 8,192 guarded stacks: 16,384 mappings; the other 31,808 in slabs of
     * 64 stacks: 497 at most */
    assert_true(during - before <= 2 * 8192 + (N - 8192) / 64 + 16);
    for (int i = 0; i < N; i++)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    dsim_rt_destroy(rt);
    unsetenv("DSIM_SIM_STACK_KIB");
    free(t);
}

/* ---- each worker keeps its own floating-point environment ---- */

typedef struct fpw {
    dsim_rt *rt;
    int mode, seen_after;
} fpw;

static void fp_main(void *p)
{
    fpw *w = p;
    fesetround(w->mode);
    dsim_rt_sleep_until(w->rt, dsim_rt_now(w->rt) + 10);
    w->seen_after = fegetround();
}

static void test_fp_mode_per_worker(void **state)
{
    (void)state;
    dsim_rt *rt = new_sim(6);
    fpw w[2] = {{rt, FE_UPWARD, -1}, {rt, FE_TOWARDZERO, -1}};
    dsim_task *t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsim_rt_spawn(rt, i, fp_main, &w[i], &t[i]), DSIM_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    assert_int_equal(w[0].seen_after, FE_UPWARD);
    assert_int_equal(w[1].seen_after, FE_TOWARDZERO);
    assert_int_equal(fegetround(), FE_TONEAREST); /* the driver's own is untouched */
    dsim_rt_destroy(rt);
}

/* ---- misuse ends the process with a message, never a hang ---- */

/* Recurses about depth x 512 bytes down the stack, writing every frame. */
__attribute__((noinline)) static int deep(int depth)
{
    volatile char buf[480];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (char)(depth + (int)i);
    int r = depth > 0 ? deep(depth - 1) : 0;
    return r + buf[depth % (int)sizeof buf];
}

static void overflow_main(void *p)
{
    dsim_rt *rt = p;
    /* 16 KiB stack, about 20 KiB of frames: over the canary and into the
     * next stack of the slab, which is not running */
    (void)deep(40);
    dsim_rt_sleep_until(rt, dsim_rt_now(rt) + 10);
}

static void *foreign_main(void *p)
{
    (void)dsim_rt_now(p);
    return NULL;
}

static void forever_main(void *p)
{
    dsim_waitq *q = p;
    dsim_waitq_lock(q);
    for (;;)
        (void)dsim_waitq_wait(q, DSIM_NO_DEADLINE);
}

/* Runs what in a child; it must die of SIGABRT, saying `says` on stderr. */
static void expect_abort(int what, const char *says)
{
    fflush(NULL);
    char path[] = "/tmp/dsim-sim-abort-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd, 2);
        if (what == 2) {
            /* every stack from a slab: the worker's neighbour is another
             * stack, not a guard page */
            setenv("DSIM_SIM_GUARDED_STACKS", "0", 1);
            setenv("DSIM_SIM_STACK_KIB", "16", 1);
        }
        dsim_rt *rt = NULL;
        if (dsim_sim_engine_register() != DSIM_OK || dsim_rt_create("sim", &rt) != DSIM_OK)
            _exit(3);
        if (what == 0) {
            pthread_t th;
            pthread_create(&th, NULL, foreign_main, rt);
            pthread_join(th, NULL);
        } else if (what == 1) {
            dsim_waitq *q;
            dsim_task *t;
            if (dsim_waitq_create(rt, &q) != DSIM_OK ||
                dsim_rt_spawn(rt, 0, forever_main, q, &t) != DSIM_OK)
                _exit(3);
            dsim_rt_join(rt, t); /* nobody will ever wake it */
        } else {
            dsim_task *t[2];
            if (dsim_rt_spawn(rt, 0, nop_main, rt, &t[0]) != DSIM_OK ||
                dsim_rt_spawn(rt, 1, overflow_main, rt, &t[1]) != DSIM_OK)
                _exit(3);
            dsim_rt_join(rt, t[1]);
            dsim_rt_join(rt, t[0]);
        }
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char err[4096] = {0};
    ssize_t n = pread(fd, err, sizeof err - 1, 0);
    close(fd);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT || n <= 0 || !strstr(err, says))
        fail_msg("case %d: status %#x, stderr: %s", what, st, n > 0 ? err : "(nothing)");
}

static void test_misuse_aborts(void **state)
{
    (void)state;
    expect_abort(0, "called from an OS thread other than");
    expect_abort(1, "deadlock");
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifndef TEST_ASAN
    /* (under AddressSanitizer, whose frames and checks are its own, an
     * overflow is its to report) */
    expect_abort(2, "worker 1 overflowed its 16 KiB stack");
#endif
}

/* ---- the transport's eager limit is the same as on threads ---- */

typedef struct h2h {
    dsim_ep *ep;
    int rank;
    size_t len;
    dsim_err err;
    int got_ok;
} h2h;

/* Each of two ranks sends to the other, waits for its send, and only then
 * receives (unsafe by MPI's rules, but what a strategy's exchange may do):
 * a message up to inproc's eager limit (64 KiB) is done without its
 * receive, on the sim engine as on threads, or the engines would disagree
 * on a strategy's exchange. */
static void h2h_main(void *p)
{
    h2h *w = p;
    unsigned char *out = malloc(w->len), *in = malloc(w->len);
    memset(out, 0x40 + w->rank, w->len);
    memset(in, 0, w->len);
    dsim_req *q = NULL;
    int64_t dl = dsim_rt_deadline(dsim_ep_rt(w->ep), 10 * SEC);
    w->err = dsim_isend(w->ep, 1 - w->rank, 3, 0, out, w->len, &q);
    if (w->err == DSIM_OK)
        w->err = dsim_wait(q, dl, NULL);
    if (w->err == DSIM_OK)
        w->err = dsim_irecv(w->ep, 1 - w->rank, 3, 0, in, w->len, &q);
    if (w->err == DSIM_OK)
        w->err = dsim_wait(q, dl, NULL);
    w->got_ok = in[0] == 0x40 + (1 - w->rank) && in[w->len - 1] == 0x40 + (1 - w->rank);
    free(out);
    free(in);
}

static void h2h_on(dsim_rt *rt, size_t len)
{
    dsim_fabric_cfg cfg = {.backend = "inproc", .nranks = 2, .rt = rt};
    dsim_fabric *f;
    assert_int_equal(dsim_fabric_open(&cfg, &f), DSIM_OK);
    h2h w[2];
    dsim_task *t[2];
    for (int i = 0; i < 2; i++) {
        w[i] = (h2h){.rank = i, .len = len};
        assert_int_equal(dsim_ep_open(f, i, &w[i].ep), DSIM_OK);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsim_rt_spawn(rt, i, h2h_main, &w[i], &t[i]), DSIM_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    for (int i = 0; i < 2; i++) {
        if (w[i].err != DSIM_OK || !w[i].got_ok)
            fail_msg("%s, %zu bytes: rank %d's exchange ended with %d (%s)", dsim_rt_name(rt), len,
                     i, (int)w[i].err, w[i].got_ok ? "its data came" : "no data");
        dsim_ep_close(w[i].ep);
    }
    dsim_fabric_close(f);
}

static void test_eager_as_on_threads(void **state)
{
    (void)state;
    size_t lens[] = {8, 4096, 4097, 32 << 10, 64 << 10};
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        dsim_rt *rt = new_sim(3);
        h2h_on(rt, lens[k]);
        dsim_rt_destroy(rt);
        assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
        h2h_on(rt, lens[k]);
        dsim_rt_destroy(rt);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sleep_jumps),         cmocka_unit_test(test_waitq),
        cmocka_unit_test(test_seeded_order),        cmocka_unit_test(test_worker_error_state),
        cmocka_unit_test(test_many_workers),        cmocka_unit_test(test_beyond_map_limit),
        cmocka_unit_test(test_fp_mode_per_worker),  cmocka_unit_test(test_misuse_aborts),
        cmocka_unit_test(test_eager_as_on_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
