/* libdsim's per-worker state (dsim/spi/rt.h): the registry of thread-local
 * variables that an engine running many workers on one OS thread saves and
 * restores at each switch (the last error, the driver's replica, the
 * prefetch hints), and the prefetch hints themselves. It calls nothing else
 * in libdsim: err.c and the others register their state here from
 * constructors. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "dsim/spi/rt.h"

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
