/* The runtime dispatch file: every engine call in libdsim passes through
 * here, so accounting and checks live in one place. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- libdsim's per-worker state ---- */

/* Prefetch hints (spi/rt.h): initial-exec, so that setting one is a store,
 * not a call to find the thread's block (libdsim is linked, not opened). */
static _Thread_local __attribute__((tls_model("initial-exec"))) const void *rt_hints[DSIM_RT_HINTS];
static size_t rt_hints_off = (size_t)-1;

#define RT_MAX_WSTATE 8

static struct {
    void *(*addr)(void);
    const void *init;
    size_t size, off;
    size_t (*used)(const void *p);
} rt_wstate[RT_MAX_WSTATE];
static int rt_n_wstate;
static size_t rt_wstate_bytes;

void dsim_rt_worker_state_add(void *(*addr)(void), const void *init, size_t size)
{
    dsim_rt_worker_state_add_used(addr, init, size, NULL);
}

static void *rt_hints_addr(void)
{
    return (void *)rt_hints;
}

__attribute__((constructor)) static void rt_hints_register(void)
{
    size_t off = (rt_wstate_bytes + 15) & ~(size_t)15;
    dsim_rt_worker_state_add(rt_hints_addr, NULL, sizeof rt_hints);
    if (rt_n_wstate > 0 && rt_wstate[rt_n_wstate - 1].addr == rt_hints_addr)
        rt_hints_off = off;
}

void dsim_rt_hint(int slot, const void *p)
{
    if (slot >= 0 && slot < DSIM_RT_HINTS)
        rt_hints[slot] = p;
}

size_t dsim_rt_worker_hints_offset(void)
{
    return rt_hints_off;
}

void dsim_rt_worker_prefetch(const void *buf)
{
    if (rt_hints_off == (size_t)-1 || !buf)
        return;
    const void *const *h = (const void *const *)(const void *)((const char *)buf + rt_hints_off);
    for (int i = 0; i < DSIM_RT_HINTS; i++)
        if (h[i]) {
            __builtin_prefetch(h[i], 0, 1);
            __builtin_prefetch((const char *)h[i] + 64, 0, 1);
        }
}

void dsim_rt_worker_state_add_used(void *(*addr)(void), const void *init, size_t size,
                                   size_t (*used)(const void *p))
{
    /* Constructors run one at a time before main: no lock. Too much state
     * is a build error in practice, caught by the first test that runs. */
    size_t off = (rt_wstate_bytes + 15) & ~(size_t)15;
    if (rt_n_wstate == RT_MAX_WSTATE || off + size > DSIM_RT_WORKER_STATE_MAX) {
        fprintf(stderr, "dsim: per-worker state over its limit (%d slots, %d bytes)\n",
                RT_MAX_WSTATE, DSIM_RT_WORKER_STATE_MAX);
        return;
    }
    rt_wstate[rt_n_wstate].addr = addr;
    rt_wstate[rt_n_wstate].init = init;
    rt_wstate[rt_n_wstate].size = size;
    rt_wstate[rt_n_wstate].off = off;
    rt_wstate[rt_n_wstate].used = used;
    rt_n_wstate++;
    rt_wstate_bytes = off + size;
}

size_t dsim_rt_worker_state_size(void)
{
    return rt_wstate_bytes;
}

void dsim_rt_worker_state_init(void *buf)
{
    for (int i = 0; i < rt_n_wstate; i++) {
        char *p = (char *)buf + rt_wstate[i].off;
        if (rt_wstate[i].init)
            memcpy(p, rt_wstate[i].init, rt_wstate[i].size);
        else
            memset(p, 0, rt_wstate[i].size);
    }
}

/* Bytes of slot i at p that a switch carries. */
static size_t rt_wstate_used(int i, const void *p)
{
    if (!rt_wstate[i].used)
        return rt_wstate[i].size;
    size_t n = rt_wstate[i].used(p);
    return n < rt_wstate[i].size ? n : rt_wstate[i].size;
}

void dsim_rt_worker_state_save(void *buf)
{
    for (int i = 0; i < rt_n_wstate; i++) {
        const void *p = rt_wstate[i].addr();
        memcpy((char *)buf + rt_wstate[i].off, p, rt_wstate_used(i, p));
    }
}

void dsim_rt_worker_state_restore(const void *buf)
{
    for (int i = 0; i < rt_n_wstate; i++) {
        const char *p = (const char *)buf + rt_wstate[i].off;
        memcpy(rt_wstate[i].addr(), p, rt_wstate_used(i, p));
    }
}
