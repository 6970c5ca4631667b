/* The threads engine: workers are pthreads, time is CLOCK_MONOTONIC. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsim/spi/rt.h"

typedef struct thr_waitq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint wakes; /* dsim_waitq_wake calls so far */
} thr_waitq;

/* A worker's state; state says who frees it: join, or, once detached, the
 * thread itself when fn returns (whichever of detach and return comes
 * second). */
enum { THR_RUNNING, THR_RETURNED, THR_DETACHED };
typedef struct thr_start {
    int id;
    void (*fn)(void *);
    void *arg;
    pthread_t tid;
    atomic_int state;
} thr_start;

static _Thread_local int thr_self_id = -1;
/* Workers of the threads engine running now, in this process (every
 * runtime's): whether a waiter pauses or yields (dsim_rt_spin_look). */
static atomic_int thr_live;
static _Thread_local int64_t thr_charged_ns;

static int64_t thr_now(dsim_rt *rt)
{
    (void)rt;
    return dsim_rt_mono_ns();
}

static struct timespec thr_ts(int64_t t)
{
    struct timespec ts = {.tv_sec = t / 1000000000, .tv_nsec = t % 1000000000};
    return ts;
}

static dsim_err thr_init(dsim_rt *rt)
{
    (void)rt;
    return DSIM_OK;
}

static void thr_fini(dsim_rt *rt)
{
    (void)rt;
}

static void thr_charge(dsim_rt *rt, int64_t ns)
{
    (void)rt;
    thr_charged_ns += ns;
}

static int64_t thr_charged(dsim_rt *rt)
{
    (void)rt;
    return thr_charged_ns;
}

static dsim_err thr_sleep_until(dsim_rt *rt, int64_t deadline)
{
    (void)rt;
    if (deadline == DSIM_NO_DEADLINE)
        return DSIM_ERR(DSIM_EINVAL, -1, "sleep_until: no deadline given: it would never return");
    struct timespec ts = thr_ts(deadline);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
    return DSIM_OK;
}

static void *thr_trampoline(void *p)
{
    thr_start *s = p;
    thr_self_id = s->id;
    thr_charged_ns = 0;
    if (!dsim_rt_bind_worker(s->id))
        dsim_rt_unbind_self();
    s->fn(s->arg);
    atomic_fetch_sub_explicit(&thr_live, 1, memory_order_relaxed);
    if (atomic_exchange(&s->state, THR_RETURNED) == THR_DETACHED)
        free(s);
    return NULL;
}

static dsim_err thr_spawn(dsim_rt *rt, int id, void (*fn)(void *), void *arg, void **handle)
{
    (void)rt;
    thr_start *s = calloc(1, sizeof *s);
    if (!s)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory starting worker %d", id);
    s->id = id;
    s->fn = fn;
    s->arg = arg;
    atomic_init(&s->state, THR_RUNNING);
    atomic_fetch_add_explicit(&thr_live, 1, memory_order_relaxed);
    int rc = pthread_create(&s->tid, NULL, thr_trampoline, s);
    if (rc != 0) {
        atomic_fetch_sub_explicit(&thr_live, 1, memory_order_relaxed);
        free(s);
        return DSIM_ERR(DSIM_ENOMEM, -1, "could not start a thread for worker %d: %s", id,
                        strerror(rc));
    }
    *handle = s;
    return DSIM_OK;
}

static dsim_err thr_join(dsim_rt *rt, void *handle)
{
    (void)rt;
    thr_start *s = handle;
    int rc = pthread_join(s->tid, NULL);
    int id = s->id;
    free(s);
    if (rc != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "could not join worker %d: %s", id, strerror(rc));
    return DSIM_OK;
}

static dsim_err thr_detach(dsim_rt *rt, void *handle)
{
    (void)rt;
    thr_start *s = handle;
    int rc = pthread_detach(s->tid);
    if (rc != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "could not detach worker %d: %s", s->id, strerror(rc));
    if (atomic_exchange(&s->state, THR_DETACHED) == THR_RETURNED)
        free(s);
    return DSIM_OK;
}

static int thr_self(dsim_rt *rt)
{
    (void)rt;
    return thr_self_id;
}

static dsim_err thr_waitq_init(dsim_rt *rt, void *p)
{
    (void)rt;
    thr_waitq *q = p;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        return DSIM_ERR(DSIM_ENOMEM, -1, "could not create a condition variable: %s", strerror(rc));
    /* Adaptive: a worker that finds the lock taken (its peer delivering a
     * message, or reading its own) spins a while before it sleeps in the
     * kernel; the holder keeps it for a few hundred nanoseconds, and a
     * sleep and its wake-up cost microseconds. */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&q->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    atomic_init(&q->wakes, 0);
    return DSIM_OK;
}

static void thr_waitq_fini(dsim_rt *rt, void *p)
{
    (void)rt;
    thr_waitq *q = p;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

static void thr_waitq_lock(dsim_rt *rt, void *p)
{
    (void)rt;
    pthread_mutex_lock(&((thr_waitq *)p)->mu);
}

static void thr_waitq_unlock(dsim_rt *rt, void *p)
{
    (void)rt;
    pthread_mutex_unlock(&((thr_waitq *)p)->mu);
}

/* How long a waiter yields and looks again before it sleeps on the
 * condition: 20 us, or DSIM_SPIN_US (0 sleeps at once; at most 1 s). */
#define THR_SPIN_DEF_NS (20LL * 1000)
#define THR_SPIN_MAX_US (1000LL * 1000)
static int64_t thr_spin_ns = -1;

static int64_t thr_spin_budget(void)
{
    int64_t v = __atomic_load_n(&thr_spin_ns, __ATOMIC_RELAXED);
    if (v >= 0)
        return v;
    const char *e = getenv("DSIM_SPIN_US");
    v = THR_SPIN_DEF_NS;
    if (e && *e) {
        char *end = NULL;
        long long us = strtoll(e, &end, 10);
        if (end != e && *end == '\0' && us >= 0)
            v = (us > THR_SPIN_MAX_US ? THR_SPIN_MAX_US : us) * 1000;
    }
    __atomic_store_n(&thr_spin_ns, v, __ATOMIC_RELAXED);
    return v;
}

static dsim_err thr_waitq_wait(dsim_rt *rt, void *p, int64_t deadline)
{
    thr_waitq *q = p;
    int64_t budget = thr_spin_budget();
    if (budget > 0) {
        /* Most waits of a collective end within microseconds: look again
         * and again, pausing between looks where every worker has a CPU and
         * yielding the CPU (to the peer that will wake us) where workers
         * outnumber them, before sleeping on the condition, whose wake-up
         * costs a futex call on each side and a reschedule. */
        unsigned seen = atomic_load_explicit(&q->wakes, memory_order_acquire);
        int64_t until = thr_now(rt) + budget;
        if (deadline != DSIM_NO_DEADLINE && deadline < until)
            until = deadline;
        pthread_mutex_unlock(&q->mu);
        int woke = 0;
        int workers = atomic_load_explicit(&thr_live, memory_order_relaxed);
        for (int i = 1;; i++) {
            int go_on = dsim_rt_spin_look(i, workers);
            if (atomic_load_explicit(&q->wakes, memory_order_acquire) != seen) {
                woke = 1;
                break;
            }
            if (!go_on || ((i & 7) == 0 && thr_now(rt) >= until))
                break;
        }
        pthread_mutex_lock(&q->mu);
        if (woke || atomic_load_explicit(&q->wakes, memory_order_acquire) != seen)
            return DSIM_OK;
    }
    if (deadline == DSIM_NO_DEADLINE) {
        pthread_cond_wait(&q->cv, &q->mu);
        return DSIM_OK;
    }
    if (thr_now(rt) >= deadline)
        return DSIM_ETIMEDOUT;
    struct timespec ts = thr_ts(deadline);
    int rc = pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    if (rc == ETIMEDOUT && thr_now(rt) >= deadline)
        return DSIM_ETIMEDOUT;
    return DSIM_OK;
}

static void thr_waitq_wake(dsim_rt *rt, void *p)
{
    (void)rt;
    atomic_fetch_add_explicit(&((thr_waitq *)p)->wakes, 1, memory_order_release);
    pthread_cond_broadcast(&((thr_waitq *)p)->cv);
}

const struct dsim_rt_ops dsim_rt_threads_ops = {
    .size = sizeof(struct dsim_rt_ops),
    .name = "threads",
    .priv_size = 0,
    .waitq_priv_size = sizeof(thr_waitq),
    .init = thr_init,
    .fini = thr_fini,
    .now = thr_now,
    .charge = thr_charge,
    .charged = thr_charged,
    .sleep_until = thr_sleep_until,
    .spawn = thr_spawn,
    .join = thr_join,
    .detach = thr_detach,
    .self = thr_self,
    .waitq_init = thr_waitq_init,
    .waitq_fini = thr_waitq_fini,
    .waitq_lock = thr_waitq_lock,
    .waitq_unlock = thr_waitq_unlock,
    .waitq_wait = thr_waitq_wait,
    .waitq_wake = thr_waitq_wake,
};
