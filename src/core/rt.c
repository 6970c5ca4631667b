/* The runtime dispatch file: every engine call in libdsim passes through
 * here, so accounting and checks live in one place. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsim/log.h"
#include "dsim/spi/rt.h"

#define RT_MAX_ENGINES 8

struct dsim_waitq {
    dsim_rt *rt;
    void *priv;
};

struct dsim_task {
    void *handle;
};

static const struct dsim_rt_ops *rt_engines[RT_MAX_ENGINES];
static int rt_nengines;
static pthread_mutex_t rt_reg_lock = PTHREAD_MUTEX_INITIALIZER;

static dsim_err rt_register_locked(const struct dsim_rt_ops *ops)
{
    if (!ops || ops->size != sizeof(struct dsim_rt_ops))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "engine table has size %zu, expected %zu: rebuild the engine against "
                        "this version of dsim/spi/rt.h",
                        ops ? ops->size : 0, sizeof(struct dsim_rt_ops));
    const char *missing = !ops->name           ? "name"
                          : !ops->init         ? "init"
                          : !ops->fini         ? "fini"
                          : !ops->now          ? "now"
                          : !ops->charge       ? "charge"
                          : !ops->charged      ? "charged"
                          : !ops->sleep_until  ? "sleep_until"
                          : !ops->spawn        ? "spawn"
                          : !ops->join         ? "join"
                          : !ops->detach       ? "detach"
                          : !ops->self         ? "self"
                          : !ops->waitq_init   ? "waitq_init"
                          : !ops->waitq_fini   ? "waitq_fini"
                          : !ops->waitq_lock   ? "waitq_lock"
                          : !ops->waitq_unlock ? "waitq_unlock"
                          : !ops->waitq_wait   ? "waitq_wait"
                          : !ops->waitq_wake   ? "waitq_wake"
                                               : NULL;
    if (missing)
        return DSIM_ERR(DSIM_EINVAL, -1, "engine '%s' lacks the required member '%s'",
                        ops->name ? ops->name : "(unnamed)", missing);
    for (int i = 0; i < rt_nengines; i++) {
        if (rt_engines[i] == ops)
            return DSIM_OK;
        if (strcmp(rt_engines[i]->name, ops->name) == 0)
            return DSIM_ERR(DSIM_EINVAL, -1, "an engine named '%s' is already registered",
                            ops->name);
    }
    if (rt_nengines == RT_MAX_ENGINES)
        return DSIM_ERR(DSIM_ENOMEM, -1, "too many engines registered (at most %d)",
                        RT_MAX_ENGINES);
    rt_engines[rt_nengines++] = ops;
    return DSIM_OK;
}

static void rt_register_builtins_locked(void)
{
    if (rt_nengines == 0)
        (void)rt_register_locked(&dsim_rt_threads_ops);
}

dsim_err dsim_rt_register(const struct dsim_rt_ops *ops)
{
    pthread_mutex_lock(&rt_reg_lock);
    rt_register_builtins_locked();
    dsim_err e = rt_register_locked(ops);
    pthread_mutex_unlock(&rt_reg_lock);
    return e;
}

dsim_err dsim_rt_create(const char *engine, dsim_rt **out)
{
    return dsim_rt_create_seeded(engine, 0, out);
}

dsim_err dsim_rt_create_seeded(const char *engine, uint64_t seed, dsim_rt **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_rt_create: out is NULL");
    *out = NULL;
    if (!engine)
        engine = "threads";
    const struct dsim_rt_ops *ops = NULL;
    char names[256] = "";
    pthread_mutex_lock(&rt_reg_lock);
    rt_register_builtins_locked();
    for (int i = 0; i < rt_nengines; i++) {
        if (strcmp(rt_engines[i]->name, engine) == 0)
            ops = rt_engines[i];
        size_t l = strlen(names);
        snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "", rt_engines[i]->name);
    }
    pthread_mutex_unlock(&rt_reg_lock);
    if (!ops)
        return DSIM_ERR(DSIM_ENOENT, -1, "no engine named '%s' (available: %s)", engine, names);
    dsim_rt *rt = calloc(1, sizeof *rt + ops->priv_size + 16);
    if (!rt)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory creating the '%s' engine", engine);
    rt->ops = ops;
    rt->seed = seed;
    rt->priv = ops->priv_size ? (void *)(((uintptr_t)(rt + 1) + 15) & ~(uintptr_t)15) : NULL;
    dsim_err e = ops->init(rt);
    if (e != DSIM_OK) {
        free(rt);
        return e;
    }
    *out = rt;
    return DSIM_OK;
}

unsigned dsim_rt_engine_flags(const char *engine)
{
    unsigned flags = 0;
    if (!engine)
        engine = "threads";
    pthread_mutex_lock(&rt_reg_lock);
    rt_register_builtins_locked();
    for (int i = 0; i < rt_nengines; i++)
        if (strcmp(rt_engines[i]->name, engine) == 0)
            flags = rt_engines[i]->flags;
    pthread_mutex_unlock(&rt_reg_lock);
    return flags;
}

void dsim_rt_destroy(dsim_rt *rt)
{
    if (!rt)
        return;
    rt->ops->fini(rt);
    free(rt);
}

const char *dsim_rt_name(const dsim_rt *rt)
{
    return rt->ops->name;
}

int64_t dsim_rt_now(dsim_rt *rt)
{
    return rt->ops->now(rt);
}

int64_t dsim_rt_deadline(dsim_rt *rt, int64_t timeout_ns)
{
    if (timeout_ns < 0)
        return DSIM_NO_DEADLINE;
    int64_t now = rt->ops->now(rt);
    if (timeout_ns > DSIM_NO_DEADLINE - now)
        return DSIM_NO_DEADLINE;
    return now + timeout_ns;
}

void dsim_rt_charge(dsim_rt *rt, int64_t ns)
{
    if (ns > 0)
        rt->ops->charge(rt, ns);
}

int64_t dsim_rt_charged(dsim_rt *rt)
{
    return rt->ops->charged(rt);
}

dsim_err dsim_rt_sleep_until(dsim_rt *rt, int64_t deadline)
{
    return rt->ops->sleep_until(rt, deadline);
}

dsim_err dsim_rt_spawn(dsim_rt *rt, int id, void (*fn)(void *), void *arg, dsim_task **out)
{
    if (!fn || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_rt_spawn: fn and out must not be NULL");
    dsim_task *t = calloc(1, sizeof *t);
    if (!t)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory spawning worker %d", id);
    dsim_err e = rt->ops->spawn(rt, id, fn, arg, &t->handle);
    if (e != DSIM_OK) {
        free(t);
        return e;
    }
    *out = t;
    return DSIM_OK;
}

dsim_err dsim_rt_join(dsim_rt *rt, dsim_task *task)
{
    if (!task)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_rt_join: task is NULL");
    dsim_err e = rt->ops->join(rt, task->handle);
    free(task);
    return e;
}

dsim_err dsim_rt_detach(dsim_rt *rt, dsim_task *task)
{
    if (!task)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_rt_detach: task is NULL");
    dsim_err e = rt->ops->detach(rt, task->handle);
    if (e == DSIM_OK)
        free(task);
    return e;
}

int dsim_rt_self(dsim_rt *rt)
{
    return rt->ops->self(rt);
}

dsim_err dsim_waitq_create(dsim_rt *rt, dsim_waitq **out)
{
    if (!rt || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_waitq_create: rt and out must not be NULL");
    size_t psz = rt->ops->waitq_priv_size;
    dsim_waitq *q = calloc(1, sizeof *q + psz + 16);
    if (!q)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory creating a wait queue");
    q->rt = rt;
    q->priv = (void *)(((uintptr_t)(q + 1) + 15) & ~(uintptr_t)15);
    dsim_err e = rt->ops->waitq_init(rt, q->priv);
    if (e != DSIM_OK) {
        free(q);
        return e;
    }
    *out = q;
    return DSIM_OK;
}

void dsim_waitq_destroy(dsim_waitq *q)
{
    if (!q)
        return;
    q->rt->ops->waitq_fini(q->rt, q->priv);
    free(q);
}

void dsim_waitq_lock(dsim_waitq *q)
{
    q->rt->ops->waitq_lock(q->rt, q->priv);
}

void dsim_waitq_unlock(dsim_waitq *q)
{
    q->rt->ops->waitq_unlock(q->rt, q->priv);
}

dsim_err dsim_waitq_wait(dsim_waitq *q, int64_t deadline)
{
    return q->rt->ops->waitq_wait(q->rt, q->priv, deadline);
}

void dsim_waitq_wake(dsim_waitq *q)
{
    q->rt->ops->waitq_wake(q->rt, q->priv);
}

/* ---- the event trace ---- */

static uint64_t rt_mix(uint64_t h, uint64_t v)
{
    /* splitmix64's finaliser over the running hash: every bit of every
     * field moves the result, and the order of the fields matters. */
    uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void dsim_rt_trace(dsim_rt *rt, enum dsim_trace_kind kind, uint64_t a, uint64_t b, uint64_t c)
{
    if (!rt || !(rt->ops->flags & DSIM_RT_DETERMINISTIC))
        return;
    uint64_t h = rt_mix(rt->trace_hash, (uint64_t)kind);
    h = rt_mix(h, a);
    h = rt_mix(h, b);
    rt->trace_hash = rt_mix(h, c);
    rt->trace_count++;
}

uint64_t dsim_rt_trace_hash(const dsim_rt *rt, uint64_t *count)
{
    if (count)
        *count = rt ? rt->trace_count : 0;
    return rt ? rt->trace_hash : 0;
}

int dsim_rt_deterministic(const dsim_rt *rt)
{
    return rt && (rt->ops->flags & DSIM_RT_DETERMINISTIC) ? 1 : 0;
}

/* The CPUs this process may run on, read when libdsim loads, before any
 * worker binds itself (a bound thread's own mask is its one CPU). */
static cpu_set_t rt_mask;
static int rt_mask_n; /* CPUs in rt_mask; 0: unknown (more CPUs than a cpu_set_t holds) */
static pthread_once_t rt_mask_once = PTHREAD_ONCE_INIT;

static void rt_mask_read(void)
{
    CPU_ZERO(&rt_mask);
    if (sched_getaffinity(0, sizeof rt_mask, &rt_mask) == 0)
        rt_mask_n = CPU_COUNT(&rt_mask);
}

static void rt_bound_lock(void);
static void rt_bound_unlock(void);

__attribute__((constructor)) static void rt_mask_init(void)
{
    pthread_once(&rt_mask_once, rt_mask_read);
    pthread_atfork(rt_bound_lock, rt_bound_unlock, rt_bound_unlock);
}

int dsim_rt_cpus(void)
{
    pthread_once(&rt_mask_once, rt_mask_read);
    if (rt_mask_n > 0)
        return rt_mask_n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 && c < 1 << 20 ? (int)c : 1;
}

static inline void rt_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static int rt_host_workers;

/* The CPUs this process's bound workers are on, and a count bumped at each
 * change, read by the transports' own threads (dsim_rt_follow_workers). */
static pthread_mutex_t rt_bound_mu = PTHREAD_MUTEX_INITIALIZER;
static cpu_set_t rt_bound;
static unsigned rt_bound_gen;

/* A fork while another thread holds rt_bound_mu (a job starting beside
 * the fork) would leave the child's copy locked for ever: the fork waits
 * for it. */
static void rt_bound_lock(void)
{
    pthread_mutex_lock(&rt_bound_mu);
}

static void rt_bound_unlock(void)
{
    pthread_mutex_unlock(&rt_bound_mu);
}

static void rt_bound_reset(void)
{
    pthread_mutex_lock(&rt_bound_mu);
    CPU_ZERO(&rt_bound);
    __atomic_add_fetch(&rt_bound_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&rt_bound_mu);
}

void dsim_rt_set_host_workers(int n)
{
    __atomic_store_n(&rt_host_workers, n > 0 ? n : 0, __ATOMIC_RELAXED);
    rt_bound_reset(); /* a new job: its workers bind anew */
}

int dsim_rt_host_workers(void)
{
    return __atomic_load_n(&rt_host_workers, __ATOMIC_RELAXED);
}

/* Whether the environment's `name` is other than 0; read once into *cache
 * (-1 until then). */
static int rt_env_on(const char *name, int *cache)
{
    int v = __atomic_load_n(cache, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv(name);
        v = !(e && strcmp(e, "0") == 0);
        __atomic_store_n(cache, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* DSIM_BIND=0 turns binding off. */
static int rt_bind_on(void)
{
    static int on = -1;
    return rt_env_on("DSIM_BIND", &on);
}

/* DSIM_BIND_FOLLOW=0 leaves the transports' threads on the whole mask. */
static int rt_follow_on(void)
{
    static int on = -1;
    return rt_env_on("DSIM_BIND_FOLLOW", &on);
}

int dsim_rt_bind_worker(int id)
{
    int n = dsim_rt_host_workers();
    if (n < 2 || id < 0 || id >= n || rt_mask_n <= 0 || n < rt_mask_n || !rt_bind_on())
        return 0;
    int cpu = -1, want = id % rt_mask_n;
    for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &rt_mask) && k++ == want) {
            cpu = c;
            break;
        }
    if (cpu < 0)
        return 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0)
        return 0;
    pthread_mutex_lock(&rt_bound_mu);
    if (!CPU_ISSET(cpu, &rt_bound)) {
        CPU_SET(cpu, &rt_bound);
        __atomic_add_fetch(&rt_bound_gen, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&rt_bound_mu);
    return 1;
}

void dsim_rt_unbind_self(void)
{
    pthread_once(&rt_mask_once, rt_mask_read);
    cpu_set_t cur;
    if (rt_mask_n > 0 && pthread_getaffinity_np(pthread_self(), sizeof cur, &cur) == 0 &&
        !CPU_EQUAL(&cur, &rt_mask))
        (void)pthread_setaffinity_np(pthread_self(), sizeof rt_mask, &rt_mask);
}

/* The placement the calling transport thread last took: -1 none yet, 0 its
 * workers' CPUs, 1 the whole mask. */
static _Thread_local int rt_helper_loose = -1;

/* Whether the process's last send between processes was bulk. */
static int rt_bulk;

void dsim_rt_note_send(size_t len)
{
    int bulk = len >= DSIM_RT_BULK_BYTES;
    if (__atomic_load_n(&rt_bulk, __ATOMIC_RELAXED) != bulk) /* no store while it holds */
        __atomic_store_n(&rt_bulk, bulk, __ATOMIC_RELAXED);
}

void dsim_rt_follow_workers(unsigned *seen)
{
    int loose = __atomic_load_n(&rt_bulk, __ATOMIC_RELAXED) || !rt_follow_on();
    if (loose == rt_helper_loose && __atomic_load_n(&rt_bound_gen, __ATOMIC_ACQUIRE) == *seen)
        return;
    cpu_set_t set;
    pthread_mutex_lock(&rt_bound_mu);
    set = rt_bound;
    *seen = rt_bound_gen;
    pthread_mutex_unlock(&rt_bound_mu);
    rt_helper_loose = loose;
    if (loose || CPU_COUNT(&set) == 0 ||
        pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
        dsim_rt_unbind_self();
}

/* A yield that kept this thread off its CPU longer than RT_YIELD_LOST_NS
 * gave it to a thread that kept it (another program's, a worker's long
 * compute): until rt_calm_at, waiters sleep instead of yielding. An
 * isolated loss calls for a short window, RT_CALM_FIRST_NS; a loss within
 * RT_CALM_AGAIN_NS of a window's end says the load persists, and the next
 * window is at least RT_CALM_MIN_NS, doubling while that goes on, up to
 * RT_CALM_MAX_NS. (200 us was too little a threshold: 4 processes of the
 * quickstart on 2 CPUs, nothing else running, lost that much now and then
 * and slept their steps to 150-220 us from 55-80. A 10 ms window after
 * every loss was too much: the run's own driver process takes a CPU for
 * 1-4 ms every 20 ms or so to store its records, and 5 processes of one
 * replica each on 2 CPUs, nothing else running, slept their steps to
 * 110-300 us from 50-60. A 1 ms window that starts over at every loss let
 * two busy loops take 4 ms of a step again and again.) */
#define RT_YIELD_LOST_NS (1000LL * 1000)
#define RT_CALM_FIRST_NS (1000LL * 1000)
#define RT_CALM_AGAIN_NS (5LL * 1000 * 1000)
#define RT_CALM_MIN_NS   (10LL * 1000 * 1000)
#define RT_CALM_MAX_NS   (1000LL * 1000 * 1000)
static int64_t rt_calm_at, rt_calm_len;

int64_t dsim_rt_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void dsim_rt_spin_reset(void)
{
    __atomic_store_n(&rt_calm_len, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&rt_calm_at, 0, __ATOMIC_RELAXED);
}

int dsim_rt_spin_look(int i, int workers)
{
    int host = __atomic_load_n(&rt_host_workers, __ATOMIC_RELAXED);
    if (host > workers)
        workers = host;
    if (workers <= dsim_rt_cpus() && (i & 63) != 0) {
        rt_cpu_relax();
        return 1;
    }
    int64_t t0 = dsim_rt_mono_ns();
    int64_t end = __atomic_load_n(&rt_calm_at, __ATOMIC_RELAXED);
    if (t0 < end)
        return 0;
    sched_yield();
    int64_t t1 = dsim_rt_mono_ns();
    if (t1 - t0 <= RT_YIELD_LOST_NS)
        return 1;
    int64_t len = __atomic_load_n(&rt_calm_len, __ATOMIC_RELAXED);
    if (len && t0 - end < RT_CALM_AGAIN_NS)
        len = 2 * len < RT_CALM_MIN_NS   ? RT_CALM_MIN_NS
              : 2 * len > RT_CALM_MAX_NS ? RT_CALM_MAX_NS
                                         : 2 * len;
    else
        len = RT_CALM_FIRST_NS;
    __atomic_store_n(&rt_calm_len, len, __ATOMIC_RELAXED);
    __atomic_store_n(&rt_calm_at, t1 + len, __ATOMIC_RELAXED);
    return 0;
}
