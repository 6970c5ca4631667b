/* The sim engine: deterministic simulation on one OS thread.
 *
 * Every worker is a coroutine with its own mmap'd stack: a guard page below
 * each of the first SIM_GUARDED_MAX stacks, and past those (two mappings per
 * guarded stack would exhaust Linux's vm.max_map_count near 32,000 workers)
 * stacks carved from slabs of SIM_SLAB_STACKS with no guard. Every stack has
 * a canary at its low end, checked whenever its worker gives up the thread,
 * so an overflow of an unguarded stack ends the run with the worker's name
 * instead of corrupting a neighbour unseen. On x86-64 the switch is a few
 * instructions of our own (callee-saved registers, the stack pointer, MXCSR
 * and the x87 control word); elsewhere it is ucontext's swapcontext, which
 * also saves the signal mask with a system call per switch. The thread that
 * created the engine ("main": the driver) is a participant too.
 *
 *     a participant blocks (wait, join, sleep, lock) or returns
 *               |
 *               v
 *     pop the earliest event: (due, tie, seq)  -- the heaps
 *               |  due > now: the clock jumps to due     (trace: CLOCK)
 *               |  a timed wait whose deadline came: it timed out
 *               v
 *     it is the one blocking? -- yes --> its call returns
 *               | no
 *               v
 *     switch straight to it                    (trace: SWITCH)
 *        ... it runs until it blocks, sleeps, charges or returns, and
 *        then does the same
 *
 * Time is virtual: it moves only when every participant waits, and then
 * straight to the next deadline. charge(ns) is a sleep of ns. Workers due
 * at the same time run in the order of a tie-break drawn from a stream
 * seeded with the run's seed, so a run is a function of its scenario and
 * seed alone.
 *
 * A wait queue's lock is a cooperative lock (an owner and a FIFO of
 * waiters), not a no-op: a worker may hold one lock while it waits on
 * another queue, as on threads. Everything runs on the creating thread; a
 * call from another OS thread, a lock taken twice, a wait without the lock
 * and a deadlock (every participant waiting with no deadline) are bugs that
 * would hang the run, so they end the process with a message instead.
 *
 * One thing no cooperative scheduler can interrupt is a worker that never
 * comes back to it: a loop that never waits, or a real OS-level block
 * (sleep, a pthread condition) in strategy code. A monitor thread (wall
 * clock, one per engine) watches the switch count; when a worker has held
 * the thread for DSIM_SIM_STALL_S seconds (default 60) it says which, and
 * raises SIGABRT on the simulation's thread, whose handler (the harness's
 * crash guard) then stores where that worker was. */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "dsim_cov.h"
#include "engine/sim.h"

#if defined(__SANITIZE_ADDRESS__)
#define SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_ASAN 1
#endif
#endif
#ifdef SIM_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#define SIM_STACK_POOL 256
/* stacks with a guard page (two mappings each) before slabs take over;
 * DSIM_SIM_GUARDED_STACKS (0..30000) changes it */
#define SIM_GUARDED_MAX 8192
/* stacks per slab mapping past SIM_GUARDED_MAX */
#define SIM_SLAB_STACKS 64
#define SIM_CANARY      0x53494d2d53544b21ULL /* "SIM-STK!" */

#if defined(__SANITIZE_THREAD__)
#define SIM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SIM_TSAN 1
#endif
#endif
/* (ThreadSanitizer follows swapcontext, not a switch it cannot see) */
#if defined(__x86_64__) && !defined(DSIM_SIM_UCONTEXT) && !defined(SIM_TSAN)
#define SIM_FAST_SWITCH 1
/* Saves the callee-saved registers, MXCSR and the x87 control word on the
 * current stack, stores the stack pointer in *from_sp and resumes to_sp. */
void dsim_sim_ctx_swap(void **from_sp, void *to_sp) __attribute__((visibility("hidden")));
/* Where a new coroutine starts: calls r13(r12) on its fresh stack. */
void dsim_sim_ctx_start(void) __attribute__((visibility("hidden")));
__asm__(".text\n"
        ".p2align 4\n"
        ".globl dsim_sim_ctx_swap\n"
        ".hidden dsim_sim_ctx_swap\n"
        ".type dsim_sim_ctx_swap,@function\n"
        "dsim_sim_ctx_swap:\n"
        "\t.cfi_startproc\n"
        "\tpushq %rbp\n"
        "\tpushq %rbx\n"
        "\tpushq %r12\n"
        "\tpushq %r13\n"
        "\tpushq %r14\n"
        "\tpushq %r15\n"
        "\tsubq $8, %rsp\n"
        "\tstmxcsr (%rsp)\n"
        "\tfnstcw 4(%rsp)\n"
        "\tmovq %rsp, (%rdi)\n"
        "\tmovq %rsi, %rsp\n"
        "\tldmxcsr (%rsp)\n"
        "\tfldcw 4(%rsp)\n"
        "\taddq $8, %rsp\n"
        "\tpopq %r15\n"
        "\tpopq %r14\n"
        "\tpopq %r13\n"
        "\tpopq %r12\n"
        "\tpopq %rbx\n"
        "\tpopq %rbp\n"
        "\tret\n"
        "\t.cfi_endproc\n"
        ".size dsim_sim_ctx_swap, .-dsim_sim_ctx_swap\n"
        ".p2align 4\n"
        ".globl dsim_sim_ctx_start\n"
        ".hidden dsim_sim_ctx_start\n"
        ".type dsim_sim_ctx_start,@function\n"
        "dsim_sim_ctx_start:\n"
        "\t.cfi_startproc\n"
        "\t.cfi_undefined rip\n" /* the bottom of a coroutine's stack for unwinders */
        "\tmovq %r12, %rdi\n"
        "\tcallq *%r13\n"
        "\tud2\n"
        "\t.cfi_endproc\n"
        ".size dsim_sim_ctx_start, .-dsim_sim_ctx_start\n");
typedef struct sim_ctx {
    void *sp;
} sim_ctx;
#else
typedef struct sim_ctx {
    ucontext_t uc;
} sim_ctx;
#endif

enum { SIM_READY, SIM_RUNNING, SIM_BLOCKED, SIM_DONE };
enum { SIM_W_NONE, SIM_W_QUEUE, SIM_W_LOCK, SIM_W_JOIN, SIM_W_SLEEP };

typedef struct sim_fiber sim_fiber;
typedef struct sim_q sim_q;
typedef struct sim_eng sim_eng;

/* an entry of an event heap: its key, whose it is, and (deadlines) the
 * generation of the wait it ends */
typedef struct sim_hent {
    int64_t due;
    uint64_t tie, seq;
    sim_fiber *f;
    uint64_t gen;
} sim_hent;

typedef struct sim_heap {
    sim_hent *v;
    size_t n, cap;
} sim_heap;

typedef struct sim_list {
    sim_fiber *head, *tail;
} sim_list;

struct sim_fiber {
    /* What a block, a wake and a switch touch, first: with tens of
     * thousands of workers each record is out of cache when its worker runs
     * again, so these share as few cache lines as they can. */
    int state;   /* SIM_* */
    int waiting; /* SIM_W_* while blocked */
    int id;
    bool timed_out, in_heap, has_deadline, detached; /* in_heap: in the run heap */
    int64_t due;
    uint64_t tie, seq;
    uint64_t dgen;            /* generation of its deadline entries: older ones are stale */
    sim_q *q;                 /* the queue waited on (SIM_W_QUEUE, SIM_W_LOCK) */
    uint64_t *canary;         /* at stack_lo; NULL for main */
    sim_fiber *qprev, *qnext; /* in that queue's list */
#ifdef SIM_FAST_SWITCH
    sim_ctx ctx;
#endif
    int64_t charged;
    sim_fiber *joiner;
    sim_fiber *aprev, *anext; /* in the engine's list of live workers */
    sim_eng *eng;
    /* the rest: at start and end */
    void (*fn)(void *);
    void *arg;
    void *map; /* the mapping (guarded) or NULL (a slab's stack) */
    size_t map_len;
    char *stack_lo; /* the usable stack: [stack_lo, stack_lo + stack_bytes) */
    void *asan_fake;
#ifndef SIM_FAST_SWITCH
    sim_ctx ctx;
#endif
    _Alignas(16) unsigned char wstate[]; /* libdsim's per-worker state */
};

struct sim_q {
    sim_eng *eng;
    sim_fiber *owner;
    sim_list waiters, lockers;
};

struct sim_eng {
    dsim_rt *rt;
    /* the stall monitor: reads these two, nothing else */
    atomic_uint_fast64_t progress; /* switches so far */
    atomic_int running_id;         /* the worker running now; INT_MIN: the driver */
    pthread_t monitor;
    bool monitor_on;
    pthread_mutex_t mon_mu;
    pthread_cond_t mon_cv;
    bool mon_stop;
    int64_t stall_ns;
    pthread_t owner;
    int64_t now;
    uint64_t rng, seq;
    sim_heap run;     /* workers ready now or sleeping until a time */
    sim_heap dl;      /* deadlines of timed waits, stale ones left in */
    size_t dl_stale;  /* stale entries in dl (about) */
    sim_fiber *spare; /* freed workers' records, kept: dl may still name them */
    sim_fiber *main, *cur;
    sim_fiber *alive; /* workers not yet freed */
    uint64_t live, live_max;
    size_t stack_bytes, page;
    void *pool[SIM_STACK_POOL]; /* stacks (with guard) of returned workers */
    int npool;
    size_t nguarded;    /* guarded mappings alive (pool included) */
    size_t guarded_max; /* SIM_GUARDED_MAX or DSIM_SIM_GUARDED_STACKS */
    char **slab_free;   /* unguarded stacks free for reuse */
    size_t nslab_free, capslab_free;
    void **slabs; /* the slab mappings, unmapped at the end */
    size_t nslabs, capslabs;
    void *main_bottom;
    size_t main_size;
    sim_fiber *switch_src; /* who switched last (AddressSanitizer's stack bounds) */
    sim_fiber *zombie;     /* a detached worker that returned, to free */
};

static atomic_uint_fast64_t sim_tot_switches, sim_tot_jumps, sim_tot_spawned, sim_tot_live_max;

/* ---- failing loudly ---- */

static const char *sim_waiting_name(int w)
{
    switch (w) {
    case SIM_W_QUEUE:
        return "waiting on a queue with no deadline";
    case SIM_W_LOCK:
        return "waiting for a lock";
    case SIM_W_JOIN:
        return "joining a worker";
    case SIM_W_SLEEP:
        return "sleeping";
    default:
        return "runnable";
    }
}

__attribute__((format(printf, 2, 3))) static _Noreturn void sim_die(sim_eng *e, const char *fmt,
                                                                    ...)
{
    fprintf(stderr, "dsim: sim engine: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    if (e) {
        fprintf(stderr, "dsim: sim engine: virtual time %.9f s; the driver is %s\n",
                (double)e->now / 1e9, sim_waiting_name(e->main->waiting));
        int shown = 0;
        for (sim_fiber *f = e->alive; f && shown < 32; f = f->anext, shown++)
            fprintf(stderr, "dsim: sim engine:   worker %d: %s\n", f->id,
                    f->state == SIM_DONE ? "returned" : sim_waiting_name(f->waiting));
    }
    DSIM_COV_DUMP();
    abort();
}

static sim_eng *sim_of(dsim_rt *rt, const char *op)
{
    sim_eng *e = rt->priv;
    if (!pthread_equal(pthread_self(), e->owner))
        sim_die(e,
                "%s called from an OS thread other than the one running the simulation: "
                "everything under engine sim runs on one thread (a backend with threads of its "
                "own, such as tcp, needs engine threads or processes)",
                op);
    return e;
}

/* ---- the event heaps: (due, tie, seq), smallest first ----
 *
 * Two heaps, one order. `run` holds the workers that are ready (due now)
 * or sleeping until a time; `dl` holds the deadlines of timed waits, which
 * almost always end by a wake long before: a wake only marks its deadline
 * stale (the worker's generation moves on), and stale entries are dropped
 * when they surface or when they are more than half of `dl`. The next event
 * is the smaller of the two tops. Keys live in the heaps' own arrays (four
 * children per node): with tens of thousands of workers, every comparison
 * through a worker's record would be a cache miss. The keys are all
 * distinct (seq), so neither the split nor the arity changes the order. */

#define SIM_HEAP_ARITY 4

static bool sim_before(const sim_hent *a, const sim_hent *b)
{
    if (a->due != b->due)
        return a->due < b->due;
    if (a->tie != b->tie)
        return a->tie < b->tie;
    return a->seq < b->seq;
}

static void sim_heap_up(sim_heap *h, size_t i)
{
    sim_hent x = h->v[i];
    while (i > 0) {
        size_t p = (i - 1) / SIM_HEAP_ARITY;
        if (!sim_before(&x, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = x;
}

static void sim_heap_down(sim_heap *h, size_t i)
{
    sim_hent x = h->v[i];
    size_t n = h->n;
    for (;;) {
        size_t c = SIM_HEAP_ARITY * i + 1, m = i;
        const sim_hent *best = &x;
        for (size_t k = c; k < c + SIM_HEAP_ARITY && k < n; k++)
            if (sim_before(&h->v[k], best)) {
                m = k;
                best = &h->v[k];
            }
        if (m == i)
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    h->v[i] = x;
}

static sim_hent sim_heap_take(sim_heap *h, size_t i)
{
    sim_hent x = h->v[i];
    sim_hent last = h->v[--h->n];
    if (i < h->n) {
        h->v[i] = last;
        if (i > 0 && sim_before(&last, &h->v[(i - 1) / SIM_HEAP_ARITY]))
            sim_heap_up(h, i);
        else
            sim_heap_down(h, i);
    }
    return x;
}

static uint64_t sim_rand(sim_eng *e)
{
    uint64_t z = (e->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void sim_heap_add(sim_eng *e, sim_heap *h, sim_hent x)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        sim_hent *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            sim_die(e, "out of memory for the event heap");
        h->v = v;
        h->cap = cap;
    }
    h->v[h->n++] = x;
    sim_heap_up(h, h->n - 1);
}

/* The next key in the order every event shares. */
static sim_hent sim_key(sim_eng *e, sim_fiber *f, int64_t due)
{
    f->due = due;
    f->tie = sim_rand(e);
    f->seq = e->seq++;
    return (sim_hent){.due = due, .tie = f->tie, .seq = f->seq, .f = f, .gen = 0};
}

/* f runs at `due` (now: ready); it is in `run` until popped. */
static void sim_heap_push(sim_eng *e, sim_fiber *f, int64_t due)
{
    if (f->in_heap)
        sim_die(e, "worker %d was scheduled twice", f->id);
    f->in_heap = true;
    sim_heap_add(e, &e->run, sim_key(e, f, due));
}

/* f's timed wait ends at `deadline` unless it is woken first. */
static void sim_deadline_push(sim_eng *e, sim_fiber *f, int64_t deadline)
{
    sim_hent x = sim_key(e, f, deadline);
    x.gen = f->dgen;
    f->has_deadline = true;
    sim_heap_add(e, &e->dl, x);
}

/* f's deadline, if any, no longer counts. */
static void sim_deadline_drop(sim_eng *e, sim_fiber *f)
{
    if (!f->has_deadline)
        return;
    f->has_deadline = false;
    f->dgen++;
    e->dl_stale++;
}

static bool sim_dl_live(const sim_hent *x)
{
    return x->gen == x->f->dgen && x->f->has_deadline;
}

/* Drops the stale deadlines on top of dl, and all of them once they are
 * most of it. */
static void sim_dl_clean(sim_eng *e)
{
    sim_heap *h = &e->dl;
    if (e->dl_stale > 4096 && 2 * e->dl_stale > h->n) {
        size_t k = 0;
        for (size_t i = 0; i < h->n; i++)
            if (sim_dl_live(&h->v[i]))
                h->v[k++] = h->v[i];
        h->n = k;
        for (size_t i = k / SIM_HEAP_ARITY + 1; i-- > 0;)
            if (i < k)
                sim_heap_down(h, i);
        e->dl_stale = 0;
    }
    while (h->n > 0 && !sim_dl_live(&h->v[0])) {
        (void)sim_heap_take(h, 0);
        if (e->dl_stale > 0)
            e->dl_stale--;
    }
}

/* The next worker due: the earlier of run's top and dl's live top. NULL if
 * both are empty. */
static sim_fiber *sim_heap_pop(sim_eng *e)
{
    sim_dl_clean(e);
    bool from_run = e->run.n > 0 && (e->dl.n == 0 || sim_before(&e->run.v[0], &e->dl.v[0]));
    if (from_run) {
        sim_fiber *f = sim_heap_take(&e->run, 0).f;
        f->in_heap = false;
        return f;
    }
    if (e->dl.n == 0)
        return NULL;
    sim_hent x = sim_heap_take(&e->dl, 0);
    x.f->has_deadline = false;
    x.f->dgen++;
    x.f->due = x.due;
    return x.f;
}

/* ---- lists ---- */

static void sim_list_push(sim_list *l, sim_fiber *f)
{
    f->qnext = NULL;
    f->qprev = l->tail;
    if (l->tail)
        l->tail->qnext = f;
    else
        l->head = f;
    l->tail = f;
}

static void sim_list_del(sim_list *l, sim_fiber *f)
{
    if (f->qprev)
        f->qprev->qnext = f->qnext;
    else
        l->head = f->qnext;
    if (f->qnext)
        f->qnext->qprev = f->qprev;
    else
        l->tail = f->qprev;
    f->qprev = f->qnext = NULL;
}

/* ---- switching ---- */

/* f can run again now (woken, handed a lock, its worker returned). */
static void sim_ready(sim_eng *e, sim_fiber *f)
{
    sim_deadline_drop(e, f);
    f->state = SIM_READY;
    f->waiting = SIM_W_NONE;
    f->timed_out = false;
    sim_heap_push(e, f, e->now);
}

static void sim_ctx_swap(sim_ctx *from, sim_ctx *to)
{
#ifdef SIM_FAST_SWITCH
    dsim_sim_ctx_swap(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
}

/* A worker that ran past the low end of its stack wrote over its canary. */
static void sim_check_canary(sim_eng *e, const sim_fiber *f)
{
    if (f->canary && *f->canary != SIM_CANARY)
        sim_die(e,
                "worker %d overflowed its %zu KiB stack (the canary at its low end was "
                "overwritten): raise DSIM_SIM_STACK_KIB, or move large arrays off the stack",
                f->id, e->stack_bytes / 1024);
}

static void sim_switch(sim_eng *e, sim_fiber *from, sim_fiber *to)
{
    dsim_rt_worker_state_save(from->wstate);
    dsim_rt_worker_state_restore(to->wstate);
#ifdef SIM_ASAN
    void *bottom = to == e->main ? e->main_bottom : to->stack_lo;
    size_t size = to == e->main ? e->main_size : e->stack_bytes;
    e->switch_src = from;
    /* a returned worker's stack is done with: no fake stack to keep */
    __sanitizer_start_switch_fiber(from->state == SIM_DONE ? NULL : &from->asan_fake, bottom, size);
#endif
    sim_ctx_swap(&from->ctx, &to->ctx);
#ifdef SIM_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake, NULL, NULL);
#endif
    (void)e;
}

/* Gives f's stack back: to the pool or the slab's free list, or unmaps it. */
static void sim_stack_release(sim_eng *e, sim_fiber *f)
{
    if (!f->stack_lo)
        return;
    if (!f->map) {
        /* a slab's stack: the free list has room for every stack carved */
        e->slab_free[e->nslab_free++] = f->stack_lo;
        f->stack_lo = NULL;
        return;
    }
#ifndef SIM_ASAN
    /* ASan keeps its own record of a stack's frames: a fresh one each time */
    if (e->npool < SIM_STACK_POOL) {
        e->pool[e->npool++] = f->map;
        f->map = NULL;
        f->stack_lo = NULL;
        return;
    }
#endif
    munmap(f->map, f->map_len);
    e->nguarded--;
    f->map = NULL;
    f->stack_lo = NULL;
}

static void sim_free_fiber(sim_eng *e, sim_fiber *f)
{
    if (f->aprev)
        f->aprev->anext = f->anext;
    else
        e->alive = f->anext;
    if (f->anext)
        f->anext->aprev = f->aprev;
    if (f->in_heap) { /* given up on while ready or asleep (rare: a linear search) */
        for (size_t i = 0; i < e->run.n; i++)
            if (e->run.v[i].f == f) {
                (void)sim_heap_take(&e->run, i);
                break;
            }
        f->in_heap = false;
    }
    sim_deadline_drop(e, f);
    sim_stack_release(e, f);
    /* Kept for reuse, not freed: stale deadlines may still name it. */
    f->anext = e->spare;
    e->spare = f;
}

/* Runs the others until main is due again. Called on main only. */
/* Bytes of a stack above its saved pointer that a resumed worker touches
 * first (its frames back up to the collective it waits in), prefetched. */
#define SIM_PREFETCH_STACK 512

static void sim_prefetch(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch((const char *)p + o, 0, 1);
}

/* With tens of thousands of workers, the next one's record and stack are
 * far out of cache: fetch them while the current one runs. The next to run
 * is most likely run's top now (a worker pushed meanwhile may come first;
 * then this was wasted, not wrong), its record prefetched one turn earlier
 * (the smallest of the top's children). */
static void sim_prefetch_next(sim_eng *e)
{
    if (e->run.n == 0)
        return;
    const sim_fiber *n = e->run.v[0].f;
#ifdef SIM_FAST_SWITCH
    if (n != e->main && n->ctx.sp)
        sim_prefetch(n->ctx.sp, SIM_PREFETCH_STACK);
#endif
    if (n->canary)
        __builtin_prefetch(n->canary, 0, 1); /* checked when it switches back */
    sim_prefetch(n->wstate, 64);
    dsim_rt_worker_prefetch(n->wstate); /* what it named before it waited */
    size_t best = 0;
    for (size_t k = 1; k <= SIM_HEAP_ARITY && k < e->run.n; k++)
        if (!best || sim_before(&e->run.v[k], &e->run.v[best]))
            best = k;
    if (best) {
        const sim_fiber *b = e->run.v[best].f;
        sim_prefetch(b, offsetof(sim_fiber, fn));
        size_t ho = dsim_rt_worker_hints_offset();
        if (ho != (size_t)-1)
            sim_prefetch(b->wstate + ho, DSIM_RT_HINTS * sizeof(void *));
    }
}

/* Frees the detached worker that returned and switched away for good
 * (never on its own stack: whoever runs next does it). */
static void sim_reap(sim_eng *e)
{
    sim_fiber *z = e->zombie;
    if (z) {
        e->zombie = NULL;
        sim_free_fiber(e, z);
    }
}

/* self (e->cur: blocked, or returned) gives the thread to the next
 * participant due: pops it (the clock moves; a timed wait whose deadline
 * came first is marked timed out) and switches to it directly, worker to
 * worker, without passing through the driver. Returns when self is chosen
 * again (at once if it is the next itself); a returned self never is. */
static void sim_run_next(sim_eng *e, sim_fiber *self)
{
    if (self != e->main)
        sim_check_canary(e, self);
    sim_fiber *f = sim_heap_pop(e);
    if (!f)
        sim_die(e, "deadlock: every worker and the driver wait with no deadline, so nothing "
                   "can ever happen again");
    sim_prefetch_next(e);
    if (f->due > e->now) {
        e->now = f->due;
        dsim_rt_trace(e->rt, DSIM_TRACE_CLOCK, (uint64_t)e->now, 0, 0);
        atomic_fetch_add_explicit(&sim_tot_jumps, 1, memory_order_relaxed);
    }
    if (f->state == SIM_BLOCKED) {
        /* its deadline came first */
        if (f->waiting == SIM_W_QUEUE && f->q)
            sim_list_del(&f->q->waiters, f);
        f->timed_out = true;
        f->waiting = SIM_W_NONE;
    }
    f->state = SIM_RUNNING;
    e->cur = f;
    dsim_rt_trace(e->rt, DSIM_TRACE_SWITCH, (uint64_t)(int64_t)f->id, 0, 0);
    atomic_fetch_add_explicit(&sim_tot_switches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->progress, 1, memory_order_relaxed);
    if (f == self)
        return;
    atomic_store_explicit(&e->running_id, f == e->main ? INT_MIN : f->id, memory_order_relaxed);
    if (self->state == SIM_DONE && self->detached)
        e->zombie = self;
    sim_switch(e, self, f);
    sim_reap(e);
}

/* The caller has recorded why it waits (and pushed its deadline, if any):
 * others run until it is due again. */
static void sim_block(sim_eng *e)
{
    sim_fiber *self = e->cur;
    self->state = SIM_BLOCKED;
    sim_run_next(e, self);
}

static void sim_entry(sim_fiber *f)
{
    sim_eng *e = f->eng;
#ifdef SIM_ASAN
    const void *bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
    if (e->switch_src == e->main) { /* the driver's stack, for switches back to it */
        e->main_bottom = (void *)bottom;
        e->main_size = size;
    }
#endif
    sim_reap(e);
    f->fn(f->arg);
    f->state = SIM_DONE;
    e->live--;
    if (f->joiner)
        sim_ready(e, f->joiner);
    /* Never resumed: join frees it, or (detached) whoever runs next. */
    sim_run_next(e, f);
    sim_die(e, "a returned worker was resumed");
}

#ifndef SIM_FAST_SWITCH
static void sim_entry_uc(unsigned lo, unsigned hi)
{
    sim_entry((sim_fiber *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

/* f starts at sim_entry(f) on [f->stack_lo, + e->stack_bytes) when first
 * switched to. */
static void sim_ctx_make(sim_eng *e, sim_fiber *f)
{
#ifdef SIM_FAST_SWITCH
    /* What dsim_sim_ctx_swap pops, lowest first: MXCSR and x87 control word,
     * r15, r14, r13 (the function), r12 (its argument), rbx, rbp, and the
     * return address: dsim_sim_ctx_start, entered with rsp 16-aligned. */
    uintptr_t top = ((uintptr_t)f->stack_lo + e->stack_bytes) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 80);
    memset(sp, 0, 80);
    uint32_t csr = 0x1F80; /* MXCSR: every exception masked, round to nearest */
    uint16_t cw = 0x037F;  /* x87: the same, extended precision */
    memcpy(&sp[0], &csr, sizeof csr);
    memcpy((char *)&sp[0] + 4, &cw, sizeof cw);
    sp[3] = (uint64_t)(uintptr_t)sim_entry;
    sp[4] = (uint64_t)(uintptr_t)f;
    sp[7] = (uint64_t)(uintptr_t)dsim_sim_ctx_start;
    f->ctx.sp = sp;
#else
    getcontext(&f->ctx.uc);
    f->ctx.uc.uc_stack.ss_sp = f->stack_lo;
    f->ctx.uc.uc_stack.ss_size = e->stack_bytes;
    f->ctx.uc.uc_link = NULL;
    uintptr_t p = (uintptr_t)f;
    makecontext(&f->ctx.uc, (void (*)(void))sim_entry_uc, 2, (unsigned)(p & 0xffffffffu),
                (unsigned)(p >> 32));
#endif
}

/* ---- the stall monitor ---- */

static int64_t sim_stall_ns(void)
{
    const char *v = getenv("DSIM_SIM_STALL_S");
    if (v && *v) {
        char *end;
        double s = strtod(v, &end);
        if (*end == '\0' && s > 0 && s < 1e6)
            return (int64_t)(s * 1e9);
        dsim_warn("DSIM_SIM_STALL_S is '%s': not a number of seconds > 0; using 60", v);
    }
    return 60 * 1000000000LL;
}

static void sim_mono(struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
}

static void *sim_monitor_main(void *p)
{
    sim_eng *e = p;
    uint64_t seen = atomic_load(&e->progress);
    int64_t still = 0; /* wall ns with no switch while a worker ran */
    const int64_t tick = e->stall_ns < 1000000000LL ? e->stall_ns / 4 + 1 : 250000000LL;
    pthread_mutex_lock(&e->mon_mu);
    while (!e->mon_stop) {
        struct timespec ts;
        sim_mono(&ts);
        int64_t t = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + tick;
        ts.tv_sec = t / 1000000000LL;
        ts.tv_nsec = t % 1000000000LL;
        pthread_cond_timedwait(&e->mon_cv, &e->mon_mu, &ts);
        if (e->mon_stop)
            break;
        uint64_t now = atomic_load(&e->progress);
        int id = atomic_load(&e->running_id);
        if (now != seen || id == INT_MIN) {
            seen = now;
            still = 0;
            continue;
        }
        still += tick;
        if (still < e->stall_ns)
            continue;
        fprintf(stderr,
                "dsim: sim engine: worker %d has run for %.0f s of wall time without waiting "
                "through dsim_rt (a loop that never waits, or a sleep or lock of the OS in its "
                "code); every worker shares this thread, so the run cannot go on: stopping it "
                "(DSIM_SIM_STALL_S sets the bound)\n",
                id, (double)still / 1e9);
        pthread_kill(e->owner, SIGABRT);
        still = 0;
    }
    pthread_mutex_unlock(&e->mon_mu);
    return NULL;
}

/* Started with the first worker: a job without workers never stalls. */
static void sim_monitor_start(sim_eng *e)
{
    if (e->monitor_on)
        return;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->mon_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&e->mon_mu, NULL);
    /* it takes no signals: SIGABRT is for the simulation's thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&e->monitor, NULL, sim_monitor_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        dsim_warn("sim engine: no stall monitor (%s): a worker that never yields would hang "
                  "the run",
                  strerror(rc));
        pthread_cond_destroy(&e->mon_cv);
        pthread_mutex_destroy(&e->mon_mu);
        return;
    }
    e->monitor_on = true;
}

static void sim_monitor_stop(sim_eng *e)
{
    if (!e->monitor_on)
        return;
    pthread_mutex_lock(&e->mon_mu);
    e->mon_stop = true;
    pthread_cond_signal(&e->mon_cv);
    pthread_mutex_unlock(&e->mon_mu);
    pthread_join(e->monitor, NULL);
    pthread_cond_destroy(&e->mon_cv);
    pthread_mutex_destroy(&e->mon_mu);
    e->monitor_on = false;
}

/* ---- the ops ---- */

size_t dsim_sim_stack_bytes(void)
{
#ifdef SIM_ASAN
    size_t kib = 1024;
#else
    size_t kib = 256;
#endif
    const char *v = getenv("DSIM_SIM_STACK_KIB");
    if (v && *v) {
        char *end;
        unsigned long k = strtoul(v, &end, 10);
        if (*end == '\0' && k >= 16 && k <= 65536)
            kib = k;
        else
            dsim_warn("DSIM_SIM_STACK_KIB is '%s': not a number of KiB in 16..65536; using %zu", v,
                      kib);
    }
    return kib * 1024;
}

static sim_fiber *sim_fiber_new(sim_eng *e, int id)
{
    sim_fiber *f = e->spare;
    if (f) {
        /* a freed worker's record: its deadline generation goes on, so
         * that entries still naming it stay stale */
        e->spare = f->anext;
        uint64_t gen = f->dgen + 1;
        memset(f, 0, sizeof *f + DSIM_RT_WORKER_STATE_MAX);
        f->dgen = gen;
    } else if (!(f = calloc(1, sizeof *f + DSIM_RT_WORKER_STATE_MAX))) {
        return NULL;
    }
    f->eng = e;
    f->id = id;
    dsim_rt_worker_state_init(f->wstate);
    return f;
}

static dsim_err sim_init(dsim_rt *rt)
{
    sim_eng *e = rt->priv;
    e->rt = rt;
    e->owner = pthread_self();
    e->rng = rt->seed ^ 0x73696d2d656e6731ULL; /* "sim-eng1" */
    long pg = sysconf(_SC_PAGESIZE);
    e->page = pg > 0 ? (size_t)pg : 4096;
    e->stack_bytes = (dsim_sim_stack_bytes() + e->page - 1) / e->page * e->page;
    e->guarded_max = SIM_GUARDED_MAX;
    const char *g = getenv("DSIM_SIM_GUARDED_STACKS");
    if (g && *g) {
        char *end;
        unsigned long v = strtoul(g, &end, 10);
        if (*end == '\0' && v <= 30000)
            e->guarded_max = v;
        else
            dsim_warn("DSIM_SIM_GUARDED_STACKS is '%s': not a count in 0..30000; using %d", g,
                      SIM_GUARDED_MAX);
    }
    e->main = sim_fiber_new(e, -1);
    if (!e->main)
        return DSIM_ERR(DSIM_ENOMEM, -1, "sim engine: out of memory");
    e->main->state = SIM_RUNNING;
    e->cur = e->main;
    atomic_init(&e->progress, 0);
    atomic_init(&e->running_id, INT_MIN);
    e->stall_ns = sim_stall_ns();
    /* 0 stays "not yet" in the records that keep times */
    e->now = DSIM_SIM_EPOCH_NS;
    return DSIM_OK;
}

static void sim_fini(dsim_rt *rt)
{
    sim_eng *e = sim_of(rt, "dsim_rt_destroy");
    if (e->cur != e->main)
        sim_die(e, "the engine was destroyed from inside a worker");
    sim_monitor_stop(e);
    /* Workers still here were given up on (detached while blocked): they
     * never run again. */
    sim_reap(e);
    for (size_t i = 0; i < e->run.n; i++)
        e->run.v[i].f->in_heap = false;
    e->run.n = 0;
    while (e->alive) {
        sim_fiber *f = e->alive;
        if (f->state != SIM_DONE)
            dsim_debug("sim engine: worker %d never returned (%s); its stack is freed", f->id,
                       sim_waiting_name(f->waiting));
        if (f->q && f->waiting == SIM_W_QUEUE)
            sim_list_del(&f->q->waiters, f);
        else if (f->q && f->waiting == SIM_W_LOCK)
            sim_list_del(&f->q->lockers, f);
        sim_free_fiber(e, f);
    }
    for (int i = 0; i < e->npool; i++)
        munmap(e->pool[i], e->stack_bytes + e->page);
    for (size_t i = 0; i < e->nslabs; i++)
        munmap(e->slabs[i], SIM_SLAB_STACKS * e->stack_bytes);
    free(e->slabs);
    free(e->slab_free);
    uint64_t m = atomic_load(&sim_tot_live_max);
    while (e->live_max > m && !atomic_compare_exchange_weak(&sim_tot_live_max, &m, e->live_max))
        ;
    while (e->spare) {
        sim_fiber *f = e->spare;
        e->spare = f->anext;
        free(f);
    }
    free(e->run.v);
    free(e->dl.v);
    free(e->main);
}

static int64_t sim_now(dsim_rt *rt)
{
    return sim_of(rt, "dsim_rt_now")->now;
}

static dsim_err sim_sleep_until(dsim_rt *rt, int64_t deadline)
{
    sim_eng *e = sim_of(rt, "dsim_rt_sleep_until");
    if (deadline == DSIM_NO_DEADLINE)
        return DSIM_ERR(DSIM_EINVAL, -1, "sleep_until: no deadline given: it would never return");
    /* Always yields, even for a deadline that passed: a loop that polls by
     * sleeping lets the others run. */
    sim_fiber *self = e->cur;
    self->waiting = SIM_W_SLEEP;
    sim_heap_push(e, self, deadline > e->now ? deadline : e->now);
    sim_block(e);
    return DSIM_OK;
}

static void sim_charge(dsim_rt *rt, int64_t ns)
{
    sim_eng *e = sim_of(rt, "dsim_rt_charge");
    e->cur->charged += ns;
    int64_t until = ns > DSIM_NO_DEADLINE - 1 - e->now ? DSIM_NO_DEADLINE - 1 : e->now + ns;
    (void)sim_sleep_until(rt, until);
}

static int64_t sim_charged(dsim_rt *rt)
{
    return sim_of(rt, "dsim_rt_charged")->cur->charged;
}

/* A stack for f: a returned worker's, a fresh guarded mapping, or (past
 * SIM_GUARDED_MAX guarded ones) one carved from a slab. */
static dsim_err sim_stack_get(sim_eng *e, sim_fiber *f)
{
    f->map_len = e->stack_bytes + e->page;
    if (e->npool > 0) {
        f->map = e->pool[--e->npool];
        f->stack_lo = (char *)f->map + e->page;
        return DSIM_OK;
    }
    if (e->nguarded < e->guarded_max) {
        f->map = mmap(NULL, f->map_len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            return DSIM_ERR(DSIM_ENOMEM, -1,
                            "sim engine: cannot map a %zu KiB stack for worker %d (%llu alive): "
                            "lower DSIM_SIM_STACK_KIB or raise vm.max_map_count",
                            e->stack_bytes / 1024, f->id, (unsigned long long)e->live);
        }
        /* the guard page: an overflow faults instead of writing over a
         * neighbour */
        if (mprotect(f->map, e->page, PROT_NONE) != 0) {
            munmap(f->map, f->map_len);
            f->map = NULL;
            return DSIM_ERR(DSIM_ENOMEM, -1, "sim engine: cannot protect worker %d's guard page",
                            f->id);
        }
        e->nguarded++;
        f->stack_lo = (char *)f->map + e->page;
        return DSIM_OK;
    }
    if (e->nslab_free == 0) {
        if (e->nslabs == e->capslabs) {
            size_t cap = e->capslabs ? 2 * e->capslabs : 16;
            void **v = realloc(e->slabs, cap * sizeof *v);
            if (!v)
                return DSIM_ERR(DSIM_ENOMEM, -1, "sim engine: out of memory for stacks");
            e->slabs = v;
            e->capslabs = cap;
        }
        size_t carved = (e->nslabs + 1) * SIM_SLAB_STACKS;
        if (carved > e->capslab_free) {
            char **v = realloc(e->slab_free, 2 * carved * sizeof *v);
            if (!v)
                return DSIM_ERR(DSIM_ENOMEM, -1, "sim engine: out of memory for stacks");
            e->slab_free = v;
            e->capslab_free = 2 * carved;
        }
        void *m = mmap(NULL, SIM_SLAB_STACKS * e->stack_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (m == MAP_FAILED)
            return DSIM_ERR(DSIM_ENOMEM, -1,
                            "sim engine: cannot map %d stacks of %zu KiB for worker %d (%llu "
                            "alive): lower DSIM_SIM_STACK_KIB",
                            SIM_SLAB_STACKS, e->stack_bytes / 1024, f->id,
                            (unsigned long long)e->live);
        e->slabs[e->nslabs++] = m;
        for (size_t i = SIM_SLAB_STACKS; i-- > 0;) /* the lowest first out */
            e->slab_free[e->nslab_free++] = (char *)m + i * e->stack_bytes;
    }
    f->map = NULL;
    f->stack_lo = e->slab_free[--e->nslab_free];
    return DSIM_OK;
}

static dsim_err sim_spawn(dsim_rt *rt, int id, void (*fn)(void *), void *arg, void **handle)
{
    sim_eng *e = sim_of(rt, "dsim_rt_spawn");
    sim_monitor_start(e);
    sim_fiber *f = sim_fiber_new(e, id);
    if (!f)
        return DSIM_ERR(DSIM_ENOMEM, -1, "sim engine: out of memory starting worker %d", id);
    f->fn = fn;
    f->arg = arg;
    dsim_err se = sim_stack_get(e, f);
    if (se != DSIM_OK) {
        free(f);
        return se;
    }
    f->canary = (uint64_t *)(void *)f->stack_lo;
    *f->canary = SIM_CANARY;
    sim_ctx_make(e, f);
    f->anext = e->alive;
    if (e->alive)
        e->alive->aprev = f;
    e->alive = f;
    if (++e->live > e->live_max)
        e->live_max = e->live;
    atomic_fetch_add_explicit(&sim_tot_spawned, 1, memory_order_relaxed);
    dsim_rt_trace(rt, DSIM_TRACE_SPAWN, (uint64_t)(int64_t)id, (uint64_t)e->now, 0);
    f->state = SIM_READY;
    sim_heap_push(e, f, e->now);
    *handle = f;
    return DSIM_OK;
}

static dsim_err sim_join(dsim_rt *rt, void *handle)
{
    sim_eng *e = sim_of(rt, "dsim_rt_join");
    sim_fiber *f = handle;
    if (f == e->cur)
        sim_die(e, "a worker joined itself");
    if (f->state != SIM_DONE) {
        if (f->joiner)
            return DSIM_ERR(DSIM_EINVAL, -1, "worker %d is already being joined", f->id);
        f->joiner = e->cur;
        e->cur->waiting = SIM_W_JOIN;
        sim_block(e);
    }
    sim_free_fiber(e, f);
    return DSIM_OK;
}

static dsim_err sim_detach(dsim_rt *rt, void *handle)
{
    sim_eng *e = sim_of(rt, "dsim_rt_detach");
    sim_fiber *f = handle;
    if (f->state == SIM_DONE)
        sim_free_fiber(e, f);
    else
        f->detached = true;
    return DSIM_OK;
}

static int sim_self(dsim_rt *rt)
{
    return sim_of(rt, "dsim_rt_self")->cur->id;
}

static dsim_err sim_waitq_init(dsim_rt *rt, void *p)
{
    sim_q *q = p;
    q->eng = sim_of(rt, "dsim_waitq_create");
    return DSIM_OK;
}

static void sim_waitq_fini(dsim_rt *rt, void *p)
{
    sim_eng *e = sim_of(rt, "dsim_waitq_destroy");
    sim_q *q = p;
    /* Left by workers that were given up on: they never run again. */
    for (sim_fiber *f; (f = q->waiters.head);) {
        sim_list_del(&q->waiters, f);
        f->q = NULL;
    }
    for (sim_fiber *f; (f = q->lockers.head);) {
        sim_list_del(&q->lockers, f);
        f->q = NULL;
    }
    (void)e;
}

static void sim_waitq_lock(dsim_rt *rt, void *p)
{
    sim_eng *e = sim_of(rt, "dsim_waitq_lock");
    sim_q *q = p;
    sim_fiber *self = e->cur;
    if (!q->owner) {
        q->owner = self;
        return;
    }
    if (q->owner == self)
        sim_die(e, "a wait queue's lock was taken twice by the same worker");
    self->q = q;
    self->waiting = SIM_W_LOCK;
    sim_list_push(&q->lockers, self);
    sim_block(e); /* handed the lock by unlock */
}

static void sim_unlock(sim_eng *e, sim_q *q)
{
    sim_fiber *next = q->lockers.head;
    if (!next) {
        q->owner = NULL;
        return;
    }
    sim_list_del(&q->lockers, next);
    q->owner = next;
    sim_ready(e, next);
}

static void sim_waitq_unlock(dsim_rt *rt, void *p)
{
    sim_eng *e = sim_of(rt, "dsim_waitq_unlock");
    sim_q *q = p;
    if (q->owner != e->cur)
        sim_die(e, "a wait queue was unlocked by a worker that does not hold its lock");
    sim_unlock(e, q);
}

static dsim_err sim_waitq_wait(dsim_rt *rt, void *p, int64_t deadline)
{
    sim_eng *e = sim_of(rt, "dsim_waitq_wait");
    sim_q *q = p;
    sim_fiber *self = e->cur;
    if (q->owner != self)
        sim_die(e, "dsim_waitq_wait called without the queue's lock");
    if (deadline != DSIM_NO_DEADLINE && e->now >= deadline)
        return DSIM_ETIMEDOUT;
    sim_unlock(e, q);
    self->q = q;
    self->waiting = SIM_W_QUEUE;
    sim_list_push(&q->waiters, self);
    if (deadline != DSIM_NO_DEADLINE)
        sim_deadline_push(e, self, deadline);
    sim_block(e);
    bool timed_out = self->timed_out;
    self->timed_out = false;
    sim_waitq_lock(rt, q);
    return timed_out && e->now >= deadline ? DSIM_ETIMEDOUT : DSIM_OK;
}

static void sim_waitq_wake(dsim_rt *rt, void *p)
{
    sim_eng *e = sim_of(rt, "dsim_waitq_wake");
    sim_q *q = p;
    for (sim_fiber *f; (f = q->waiters.head);) {
        sim_list_del(&q->waiters, f);
        sim_ready(e, f);
    }
}

const struct dsim_rt_ops dsim_rt_sim_ops = {
    .size = sizeof(struct dsim_rt_ops),
    .name = "sim",
    .priv_size = sizeof(sim_eng),
    .waitq_priv_size = sizeof(sim_q),
    .flags = DSIM_RT_DETERMINISTIC | DSIM_RT_VIRTUAL_TIME,
    .init = sim_init,
    .fini = sim_fini,
    .now = sim_now,
    .charge = sim_charge,
    .charged = sim_charged,
    .sleep_until = sim_sleep_until,
    .spawn = sim_spawn,
    .join = sim_join,
    .detach = sim_detach,
    .self = sim_self,
    .waitq_init = sim_waitq_init,
    .waitq_fini = sim_waitq_fini,
    .waitq_lock = sim_waitq_lock,
    .waitq_unlock = sim_waitq_unlock,
    .waitq_wait = sim_waitq_wait,
    .waitq_wake = sim_waitq_wake,
};

dsim_err dsim_sim_engine_register(void)
{
    return dsim_rt_register(&dsim_rt_sim_ops);
}

void dsim_sim_engine_totals(dsim_sim_stats *out)
{
    if (!out)
        return;
    out->switches = atomic_load(&sim_tot_switches);
    out->clock_jumps = atomic_load(&sim_tot_jumps);
    out->spawned = atomic_load(&sim_tot_spawned);
    out->live_max = atomic_load(&sim_tot_live_max);
    out->stack_bytes = dsim_sim_stack_bytes();
}
