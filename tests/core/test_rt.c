/* The runtime API on the threads engine, errors and logging. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/log.h"
#include "dsim/rt.h"
#include "dsim/spi/rt.h"

#define MS       1000000LL
#define BIND_MAX 64

static void test_strerror_covers_every_code(void **state)
{
    (void)state;
    for (int i = 0; i < DSIM_ERR_COUNT; i++) {
        const char *s = dsim_strerror((dsim_err)i);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown error code");
        for (int j = 0; j < i; j++)
            assert_string_not_equal(s, dsim_strerror((dsim_err)j));
    }
    assert_string_equal(dsim_strerror(DSIM_ERR_COUNT), "unknown error code");
    assert_string_equal(dsim_strerror((dsim_err)-3), "unknown error code");
}

static void test_set_error_records_context(void **state)
{
    (void)state;
    dsim_clear_error();
    assert_int_equal(dsim_last_error()->code, DSIM_OK);
    assert_string_equal(dsim_errmsg(), "");
    dsim_err e = DSIM_ERR(DSIM_ETIMEDOUT, 3, "waited %d ms for rank %d", 200, 3);
    assert_int_equal(e, DSIM_ETIMEDOUT);
    const dsim_error *le = dsim_last_error();
    assert_int_equal(le->code, DSIM_ETIMEDOUT);
    assert_int_equal(le->peer, 3);
    assert_string_equal(le->msg, "waited 200 ms for rank 3");
    assert_non_null(strstr(le->file, "test_rt.c"));
    assert_true(le->line > 0);
    /* Re-raising with the old message as an argument must not garble it. */
    DSIM_ERR(DSIM_EPEER, 3, "allreduce: %s", dsim_errmsg());
    assert_string_equal(dsim_errmsg(), "allreduce: waited 200 ms for rank 3");
    dsim_error copy;
    dsim_error_copy(&copy);
    assert_int_equal(copy.code, DSIM_EPEER);
    assert_string_equal(copy.msg, dsim_errmsg());
    /* A later error is undone by restoring the copy, message and place. */
    DSIM_ERR(DSIM_EINVAL, -1, "something else");
    dsim_error_restore(&copy);
    assert_int_equal(dsim_last_error()->code, DSIM_EPEER);
    assert_int_equal(dsim_last_error()->peer, 3);
    assert_int_equal(dsim_last_error()->line, copy.line);
    assert_string_equal(dsim_errmsg(), "allreduce: waited 200 ms for rank 3");
}

static dsim_err check_helper(dsim_err in)
{
    DSIM_CHECK(in);
    return DSIM_OK;
}

static void test_check_macro_gives_a_message(void **state)
{
    (void)state;
    dsim_clear_error();
    assert_int_equal(check_helper(DSIM_OK), DSIM_OK);
    assert_int_equal(check_helper(DSIM_ENOMEM), DSIM_ENOMEM);
    /* No message was set: the propagation supplies one. */
    assert_string_equal(dsim_errmsg(), dsim_strerror(DSIM_ENOMEM));
}

static void err_thread_fn(void *arg)
{
    int *seen = arg;
    *seen = dsim_last_error()->code;
    DSIM_ERR(DSIM_EIO, -1, "thread-local");
}

static void test_error_context_is_per_thread(void **state)
{
    (void)state;
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    DSIM_ERR(DSIM_EINVAL, -1, "main thread");
    int seen = -1;
    dsim_task *t;
    assert_int_equal(dsim_rt_spawn(rt, 0, err_thread_fn, &seen, &t), DSIM_OK);
    assert_int_equal(dsim_rt_join(rt, t), DSIM_OK);
    assert_int_equal(seen, DSIM_OK);
    assert_string_equal(dsim_errmsg(), "main thread");
    dsim_rt_destroy(rt);
}

typedef struct log_capture {
    int count;
    dsim_log_level last_level;
    char last[256];
} log_capture;

static void capture_fn(dsim_log_level level, const char *file, int line, const char *msg,
                       void *user)
{
    (void)file;
    (void)line;
    log_capture *c = user;
    c->count++;
    c->last_level = level;
    snprintf(c->last, sizeof c->last, "%s", msg);
}

static void test_log_levels_and_handler(void **state)
{
    (void)state;
    log_capture cap = {0};
    dsim_log_set_handler(capture_fn, &cap);
    dsim_log_set_level(DSIM_LOG_INFO);
    dsim_info("hello %d", 42);
    dsim_debug("hidden");
    dsim_warn("careful");
    assert_int_equal(cap.count, 2);
    assert_int_equal(cap.last_level, DSIM_LOG_WARN);
    assert_string_equal(cap.last, "careful");
    dsim_log_set_level(DSIM_LOG_TRACE);
    dsim_trace("now visible");
    assert_int_equal(cap.count, 3);
    dsim_log_set_handler(NULL, NULL);
    dsim_log_set_level(DSIM_LOG_WARN);
}

static void test_unknown_engine(void **state)
{
    (void)state;
    dsim_rt *rt = (dsim_rt *)0x1;
    assert_int_equal(dsim_rt_create("warp-drive", &rt), DSIM_ENOENT);
    assert_null(rt);
    assert_non_null(strstr(dsim_errmsg(), "warp-drive"));
    assert_non_null(strstr(dsim_errmsg(), "threads"));
}

static void test_register_rejects_bad_tables(void **state)
{
    (void)state;
    struct dsim_rt_ops bad = dsim_rt_threads_ops;
    bad.size = sizeof bad - 8;
    assert_int_equal(dsim_rt_register(&bad), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "size"));
    bad = dsim_rt_threads_ops;
    bad.name = "broken";
    bad.waitq_wait = NULL;
    assert_int_equal(dsim_rt_register(&bad), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "waitq_wait"));
    bad = dsim_rt_threads_ops; /* same name as the built-in, another table */
    assert_int_equal(dsim_rt_register(&bad), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "already registered"));
    assert_int_equal(dsim_rt_register(&dsim_rt_threads_ops), DSIM_OK);
}

static void test_clock_and_deadlines(void **state)
{
    (void)state;
    dsim_rt *rt;
    assert_int_equal(dsim_rt_create(NULL, &rt), DSIM_OK);
    assert_string_equal(dsim_rt_name(rt), "threads");
    int64_t a = dsim_rt_now(rt);
    int64_t b = dsim_rt_now(rt);
    assert_true(a > 0 && b >= a);
    assert_int_equal(dsim_rt_deadline(rt, -1), DSIM_NO_DEADLINE);
    assert_int_equal(dsim_rt_deadline(rt, INT64_MAX - 5), DSIM_NO_DEADLINE);
    int64_t d = dsim_rt_deadline(rt, 5 * MS);
    assert_true(d >= b + 5 * MS);
    assert_int_equal(dsim_rt_sleep_until(rt, d), DSIM_OK);
    assert_true(dsim_rt_now(rt) >= d);
    assert_int_equal(dsim_rt_sleep_until(rt, DSIM_NO_DEADLINE), DSIM_EINVAL);
    assert_int_equal(dsim_rt_self(rt), -1);
    int64_t c0 = dsim_rt_charged(rt);
    dsim_rt_charge(rt, 1000);
    dsim_rt_charge(rt, -5); /* ignored */
    assert_int_equal(dsim_rt_charged(rt) - c0, 1000);
    dsim_rt_destroy(rt);
}

static void test_wait_times_out_at_deadline(void **state)
{
    (void)state;
    dsim_rt *rt;
    dsim_waitq *q;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    assert_int_equal(dsim_waitq_create(rt, &q), DSIM_OK);
    int64_t start = dsim_rt_now(rt);
    int64_t deadline = start + 30 * MS;
    dsim_err e = DSIM_OK;
    dsim_waitq_lock(q);
    while ((e = dsim_waitq_wait(q, deadline)) == DSIM_OK)
        ; /* nobody wakes us: only the deadline ends this */
    dsim_waitq_unlock(q);
    int64_t end = dsim_rt_now(rt);
    assert_int_equal(e, DSIM_ETIMEDOUT);
    assert_true(end >= deadline);
    /* A deadline already passed returns at once. */
    dsim_waitq_lock(q);
    assert_int_equal(dsim_waitq_wait(q, start), DSIM_ETIMEDOUT);
    dsim_waitq_unlock(q);
    dsim_waitq_destroy(q);
    dsim_rt_destroy(rt);
}

typedef struct wake_ctx {
    dsim_rt *rt;
    dsim_waitq *q;
    int flag;
    int self_seen[4];
    int64_t charged[4];
} wake_ctx;

static void waker_fn(void *arg)
{
    wake_ctx *w = arg;
    dsim_rt_sleep_until(w->rt, dsim_rt_deadline(w->rt, 10 * MS));
    dsim_waitq_lock(w->q);
    w->flag = 1;
    dsim_waitq_unlock(w->q);
    dsim_waitq_wake(w->q);
}

static void test_wake_ends_a_wait(void **state)
{
    (void)state;
    wake_ctx w = {0};
    assert_int_equal(dsim_rt_create("threads", &w.rt), DSIM_OK);
    assert_int_equal(dsim_waitq_create(w.rt, &w.q), DSIM_OK);
    dsim_task *t;
    assert_int_equal(dsim_rt_spawn(w.rt, 7, waker_fn, &w, &t), DSIM_OK);
    int64_t deadline = dsim_rt_deadline(w.rt, 5000 * MS);
    dsim_err e = DSIM_OK;
    dsim_waitq_lock(w.q);
    while (!w.flag && (e = dsim_waitq_wait(w.q, deadline)) == DSIM_OK)
        ;
    dsim_waitq_unlock(w.q);
    assert_int_equal(e, DSIM_OK);
    assert_int_equal(w.flag, 1);
    assert_true(dsim_rt_now(w.rt) < deadline);
    assert_int_equal(dsim_rt_join(w.rt, t), DSIM_OK);
    dsim_waitq_destroy(w.q);
    dsim_rt_destroy(w.rt);
}

static wake_ctx *ids_ctx;

static void ids_fn(void *arg)
{
    int slot = (int)(intptr_t)arg;
    ids_ctx->self_seen[slot] = dsim_rt_self(ids_ctx->rt);
    dsim_rt_charge(ids_ctx->rt, 100 * (slot + 1));
    ids_ctx->charged[slot] = dsim_rt_charged(ids_ctx->rt);
}

static void test_spawn_ids_and_charge_per_worker(void **state)
{
    (void)state;
    wake_ctx w = {0};
    ids_ctx = &w;
    assert_int_equal(dsim_rt_create("threads", &w.rt), DSIM_OK);
    dsim_task *t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(dsim_rt_spawn(w.rt, 10 + i, ids_fn, (void *)(intptr_t)i, &t[i]), DSIM_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(dsim_rt_join(w.rt, t[i]), DSIM_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(w.self_seen[i], 10 + i);
        assert_int_equal(w.charged[i], 100 * (i + 1));
    }
    assert_int_equal(dsim_rt_spawn(w.rt, 0, NULL, NULL, &t[0]), DSIM_EINVAL);
    dsim_rt_destroy(w.rt);
}

/* Binding: where the job's workers fill the CPUs (as many or more), each
 * binds to one, round robin over the process's mask (dsim_rt_bind_worker);
 * fewer workers than CPUs, or a task outside the job, keep the process's
 * mask; DSIM_BIND=0 (this test runs once with it) binds nothing. */
typedef struct bind_seen {
    int ncpu; /* CPUs in the worker's mask */
    int cpu;  /* its lowest CPU */
} bind_seen;

static void bind_fn(void *arg)
{
    bind_seen *b = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof set, &set), 0);
    b->ncpu = CPU_COUNT(&set);
    b->cpu = -1;
    for (int c = 0; c < CPU_SETSIZE && b->cpu < 0; c++)
        if (CPU_ISSET(c, &set))
            b->cpu = c;
}

static void bind_run(dsim_rt *rt, int workers, int spawn, bind_seen *seen)
{
    dsim_rt_set_host_workers(workers);
    dsim_task *t[BIND_MAX];
    for (int i = 0; i < spawn; i++)
        assert_int_equal(dsim_rt_spawn(rt, i, bind_fn, &seen[i], &t[i]), DSIM_OK);
    for (int i = 0; i < spawn; i++)
        assert_int_equal(dsim_rt_join(rt, t[i]), DSIM_OK);
    dsim_rt_set_host_workers(0);
}

static void test_workers_bind_to_a_cpu_each(void **state)
{
    (void)state;
    int cpus = dsim_rt_cpus();
    if (cpus < 2 || cpus + 2 > BIND_MAX)
        skip(); /* one CPU: nothing to spread over; many: the arrays below */
    cpu_set_t mask;
    CPU_ZERO(&mask);
    assert_int_equal(sched_getaffinity(0, sizeof mask, &mask), 0);
    assert_int_equal(CPU_COUNT(&mask), cpus);
    int nth[BIND_MAX]; /* the k-th CPU of the mask */
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < cpus; c++)
        if (CPU_ISSET(c, &mask))
            nth[k++] = c;
    const char *env = getenv("DSIM_BIND");
    int on = !(env && strcmp(env, "0") == 0);
    dsim_rt *rt = NULL;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);

    /* as many workers as CPUs, and one more: round robin; a task beyond the
     * job's workers is left alone */
    bind_seen seen[BIND_MAX];
    for (int n = cpus; n <= cpus + 1; n++) {
        bind_run(rt, n, n + 1, seen);
        for (int i = 0; i < n; i++) {
            assert_int_equal(seen[i].ncpu, on ? 1 : cpus);
            if (on)
                assert_int_equal(seen[i].cpu, nth[i % cpus]);
        }
        assert_int_equal(seen[n].ncpu, cpus);
    }
    /* fewer workers than CPUs (where there are more than 2): the scheduler
     * places them */
    if (cpus > 2) {
        bind_run(rt, 2, 2, seen);
        assert_int_equal(seen[0].ncpu, cpus);
        assert_int_equal(seen[1].ncpu, cpus);
    }
    /* a thread started by a bound one gets the whole mask back */
    if (on) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(nth[1], &one);
        assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
        bind_run(rt, 0, 1, seen);
        assert_int_equal(seen[0].ncpu, cpus);
        dsim_rt_unbind_self();
        bind_fn(&seen[0]);
        assert_int_equal(seen[0].ncpu, cpus);
    }
    /* out of range, or a job of one */
    dsim_rt_set_host_workers(cpus);
    assert_int_equal(dsim_rt_bind_worker(-1), 0);
    assert_int_equal(dsim_rt_bind_worker(cpus), 0);
    dsim_rt_set_host_workers(1);
    assert_int_equal(dsim_rt_bind_worker(0), 0);
    dsim_rt_set_host_workers(0);
    dsim_rt_destroy(rt);
}

/* A transport's own thread follows the process's bound workers
 * (dsim_rt_follow_workers): their CPUs, the whole mask while the traffic
 * is bulk (dsim_rt_note_send), when the job ends (dsim_rt_set_host_workers starts the
 * next), and always with DSIM_BIND=0 or DSIM_BIND_FOLLOW=0 (runs of this
 * test with each). */
typedef struct follow_seen {
    bind_seen tight, loose, tight_again, after_job, first;
} follow_seen;

static void *follow_fn(void *arg)
{
    follow_seen *f = arg;
    unsigned placed = ~0u;
    dsim_rt_follow_workers(&placed);
    bind_fn(&f->tight);
    dsim_rt_follow_workers(&placed); /* nothing changed: no call */
    dsim_rt_note_send(DSIM_RT_BULK_BYTES);
    dsim_rt_follow_workers(&placed);
    bind_fn(&f->loose);
    dsim_rt_note_send(DSIM_RT_BULK_BYTES - 1);
    dsim_rt_follow_workers(&placed);
    bind_fn(&f->tight_again);
    dsim_rt_set_host_workers(0); /* the job ends */
    dsim_rt_follow_workers(&placed);
    bind_fn(&f->after_job);
    return NULL;
}

static void *follow_first_fn(void *arg)
{
    follow_seen *f = arg;
    unsigned placed = ~0u;
    dsim_rt_follow_workers(&placed);
    bind_fn(&f->first);
    return NULL;
}

static void test_transport_threads_follow_workers(void **state)
{
    (void)state;
    int cpus = dsim_rt_cpus();
    if (cpus < 2 || cpus + 2 > BIND_MAX)
        skip(); /* one CPU: the whole mask is the workers' */
    cpu_set_t mask;
    CPU_ZERO(&mask);
    assert_int_equal(sched_getaffinity(0, sizeof mask, &mask), 0);
    int second = -1; /* the mask's second CPU: worker 1's */
    for (int c = 0, k = 0; c < CPU_SETSIZE && second < 0; c++)
        if (CPU_ISSET(c, &mask) && k++ == 1)
            second = c;
    const char *e1 = getenv("DSIM_BIND"), *e2 = getenv("DSIM_BIND_FOLLOW");
    int on = !(e1 && strcmp(e1, "0") == 0) && !(e2 && strcmp(e2, "0") == 0);
    follow_seen f;
    memset(&f, 0, sizeof f);
    /* before any worker binds: the whole mask */
    dsim_rt_set_host_workers(cpus);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, follow_first_fn, &f), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(f.first.ncpu, cpus);
    /* worker 1 of a job that fills the CPUs binds to the second CPU */
    dsim_rt *rt = NULL;
    assert_int_equal(dsim_rt_create("threads", &rt), DSIM_OK);
    bind_seen w;
    dsim_task *t = NULL;
    assert_int_equal(dsim_rt_spawn(rt, 1, bind_fn, &w, &t), DSIM_OK);
    assert_int_equal(dsim_rt_join(rt, t), DSIM_OK);
    assert_int_equal(pthread_create(&th, NULL, follow_fn, &f), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(f.tight.ncpu, on ? 1 : cpus);
    assert_int_equal(f.tight_again.ncpu, on ? 1 : cpus);
    if (on) {
        assert_int_equal(f.tight.cpu, second);
        assert_int_equal(f.tight_again.cpu, second);
    }
    assert_int_equal(f.loose.ncpu, cpus);
    assert_int_equal(f.after_job.ncpu, cpus);
    dsim_rt_destroy(rt);
}

/* A fork while another thread starts a job (dsim_rt_set_host_workers
 * takes the lock of the bound CPUs) leaves the child able to start its
 * own: no child may hang. */
static atomic_int hammer_stop;

static void *hammer_fn(void *arg)
{
    (void)arg;
    while (!atomic_load(&hammer_stop))
        dsim_rt_set_host_workers(2);
    return NULL;
}

static void test_fork_beside_a_job_start(void **state)
{
    (void)state;
    pthread_t th;
    atomic_store(&hammer_stop, 0);
    assert_int_equal(pthread_create(&th, NULL, hammer_fn, NULL), 0);
    int hung = 0;
    for (int i = 0; i < 400 && !hung; i++) {
        pid_t p = fork();
        assert_true(p >= 0);
        if (p == 0) {
            dsim_rt_set_host_workers(1);
            _exit(0);
        }
        int st = 0, done = 0;
        for (int t = 0; t < 2000 && !done; t++) { /* 2 s */
            pid_t w = waitpid(p, &st, WNOHANG);
            if (w == p)
                done = 1;
            else
                usleep(1000);
        }
        if (!done) {
            hung = 1;
            kill(p, SIGKILL);
            waitpid(p, &st, 0);
        } else {
            assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
    }
    atomic_store(&hammer_stop, 1);
    assert_int_equal(pthread_join(th, NULL), 0);
    dsim_rt_set_host_workers(0);
    assert_false(hung);
}

/* A look that yields to a thread that keeps the CPU (another program's)
 * tells the waiter to sleep (dsim_rt_spin_look returns 0), and so do the
 * looks after it for a while, without yielding; once the CPU is free again
 * a look yields and goes on. */
static atomic_int hog_stop;

static void *hog_fn(void *arg)
{
    (void)arg;
    volatile unsigned long n = 0;
    while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
        n++;
    return NULL;
}

/* Whether a look goes on (its yield quick) within 5 s: another test's
 * thread busy on the same CPU makes a yield lose it, so a look is tried
 * again past each window (1 ms .. 1 s) until one finds the CPU free. */
static int look_goes_on_soon(void)
{
    int64_t end = dsim_rt_mono_ns() + 5000LL * 1000 * 1000;
    for (int i = 1;; i++) {
        if (dsim_rt_spin_look(i, 1 << 20))
            return 1;
        if (dsim_rt_mono_ns() >= end)
            return 0;
        usleep(20 * 1000);
    }
}

/* Pins the calling thread to its first allowed CPU and makes *at start
 * threads there (the hog's). */
static void pin_with_hog_attr(pthread_attr_t *at)
{
    cpu_set_t mask, one;
    assert_int_equal(sched_getaffinity(0, sizeof mask, &mask), 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mask))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    assert_int_equal(pthread_attr_init(at), 0);
    assert_int_equal(pthread_attr_setaffinity_np(at, sizeof one, &one), 0);
    assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
}

static void test_look_sleeps_where_a_yield_loses_the_cpu(void **state)
{
    (void)state;
    pthread_attr_t at;
    pin_with_hog_attr(&at);
    /* nothing else on the CPU: a look yields and goes on */
    assert_true(look_goes_on_soon());
    atomic_store(&hog_stop, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, &at, hog_fn, NULL), 0);
    int told = 0;
    for (int i = 1; i <= 200 && !told; i++)
        told = !dsim_rt_spin_look(i, 1 << 20);
    assert_true(told);
    /* within the window: no yield, at once */
    int64_t t0 = dsim_rt_mono_ns();
    for (int i = 1; i <= 100; i++)
        assert_int_equal(dsim_rt_spin_look(i, 1 << 20), 0);
    assert_true(dsim_rt_mono_ns() - t0 < 100LL * 1000 * 1000);
    /* a reset ends the window: the next look yields again, where within
     * it a look says sleep at once (the hog still busy: the yield either
     * comes back quickly and the look goes on, or loses the CPU for 1 ms or
     * more; never 0 in under 1 ms as in the window) */
    int64_t t1 = dsim_rt_mono_ns();
    int in_window = dsim_rt_spin_look(1, 1 << 20);
    int64_t t2 = dsim_rt_mono_ns();
    dsim_rt_spin_reset();
    int after = dsim_rt_spin_look(1, 1 << 20);
    int64_t t3 = dsim_rt_mono_ns();
    if (in_window == 0 && t2 - t1 < 1000LL * 1000) /* the window still open here */
        assert_true(after == 1 || t3 - t2 >= 1000LL * 1000);
    atomic_store(&hog_stop, 1);
    assert_int_equal(pthread_join(th, NULL), 0);
    pthread_attr_destroy(&at);
    /* past the window (at most a second), the CPU free: a look goes on,
     * and so does the next (the window ended) */
    usleep(1100 * 1000);
    assert_true(look_goes_on_soon());
    assert_true(look_goes_on_soon());
    dsim_rt_unbind_self();
}

/* One try of the test below: a lost yield with nothing lost just before
 * it, then the CPU free: 3 ms on, a look goes on. */
static int short_window_once(const pthread_attr_t *at)
{
    usleep(20 * 1000); /* well past the end of any window before */
    atomic_store(&hog_stop, 0);
    pthread_t th;
    if (pthread_create(&th, at, hog_fn, NULL) != 0)
        return 0;
    int told = 0;
    for (int i = 1; i <= 200 && !told; i++)
        told = !dsim_rt_spin_look(i, 1 << 20);
    atomic_store(&hog_stop, 1);
    pthread_join(th, NULL);
    if (!told)
        return 0;
    int64_t t0 = dsim_rt_mono_ns();
    usleep(3 * 1000);
    return dsim_rt_spin_look(1, 1 << 20) && dsim_rt_mono_ns() - t0 < 9LL * 1000 * 1000;
}

/* A burst of another thread on the CPU (the run's own driver storing its
 * records takes 1-4 ms) costs one lost yield and a short window, 1 ms,
 * not the 10 ms that a loss right after a window opens: with 10 ms after
 * every loss, 5 processes on 2 CPUs slept their steps to 2-5x their time.
 * Tried up to 10 times (the machine's own bursts can make a loss follow
 * a window); a window of 10 ms after every loss fails every try. */
static void test_an_isolated_loss_opens_a_short_window(void **state)
{
    (void)state;
    pthread_attr_t at;
    pin_with_hog_attr(&at);
    assert_true(look_goes_on_soon());
    int ok = 0;
    for (int t = 0; t < 10 && !ok; t++)
        ok = short_window_once(&at);
    pthread_attr_destroy(&at);
    dsim_rt_unbind_self();
    assert_true(ok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_covers_every_code),
        cmocka_unit_test(test_set_error_records_context),
        cmocka_unit_test(test_check_macro_gives_a_message),
        cmocka_unit_test(test_error_context_is_per_thread),
        cmocka_unit_test(test_log_levels_and_handler),
        cmocka_unit_test(test_unknown_engine),
        cmocka_unit_test(test_register_rejects_bad_tables),
        cmocka_unit_test(test_clock_and_deadlines),
        cmocka_unit_test(test_wait_times_out_at_deadline),
        cmocka_unit_test(test_wake_ends_a_wait),
        cmocka_unit_test(test_spawn_ids_and_charge_per_worker),
        cmocka_unit_test(test_workers_bind_to_a_cpu_each),
        cmocka_unit_test(test_transport_threads_follow_workers),
        cmocka_unit_test(test_fork_beside_a_job_start),
        cmocka_unit_test(test_look_sleeps_where_a_yield_loses_the_cpu),
        cmocka_unit_test(test_an_isolated_loss_opens_a_short_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
