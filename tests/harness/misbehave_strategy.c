/* Test fixtures: strategies whose code never returns or takes the process
 * down, one shared object per misbehaviour (chosen with -DMISBEHAVE_*):
 *
 *   hang_sleep   replica 1 sleeps for ever in apply_gradients at global step 2
 *   hang_spin    every replica spins for ever in create_variables, before
 *                any collective
 *   crash_segv   replica 1 writes to an unmapped address in apply_gradients
 *                at global step 2
 *   crash_abort  ... calls abort() there
 *   crash_exit   ... calls exit(3) there
 *   crash__exit  ... calls _exit(0) there: no exit handler runs, so only
 *                dsim run's supervisor process can say what happened
 *   crash_kill   ... is killed by SIGKILL there (as by the kernel's
 *                out-of-memory killer): likewise
 *   hang_on_abort a replica whose all-reduce fails (a peer died) waits for
 *                that peer for ever, as a barrier with no deadline does:
 *                it sleeps on the runtime's clock (so that the sim engine
 *                sees a waiting worker, not a stalled one) and never
 *                returns the error; without faults it is a plain mirrored
 *                strategy
 *   ignore_abort every replica ignores a failed all-reduce (a peer lost, a
 *                message dropped or corrupt, the job aborted) and keeps
 *                stepping with whatever the call left, as code that logs
 *                and swallows a collective's error would: a bug that shows
 *                only under a fault (tests/explore finds it with dsim
 *                explore)
 *
 * Otherwise they are a plain mirrored strategy (broadcast the chief's
 * variables, SUM-allreduce the gradients). "For ever" ends only when a test
 * calls misbehave_release(), so that a test process can let its stuck
 * threads go and check that they touch nothing freed on their way out
 * (misbehave_hold makes it misbehave again). */
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsim/spi/strategy.h"

#if defined(MISBEHAVE_HANG_SLEEP)
#define MB_NAME "hang_sleep"
#elif defined(MISBEHAVE_HANG_SPIN)
#define MB_NAME "hang_spin"
#elif defined(MISBEHAVE_CRASH_SEGV)
#define MB_NAME "crash_segv"
#elif defined(MISBEHAVE_CRASH_ABORT)
#define MB_NAME "crash_abort"
#elif defined(MISBEHAVE_CRASH_EXIT)
#define MB_NAME "crash_exit"
#elif defined(MISBEHAVE_CRASH__EXIT)
#define MB_NAME "crash__exit"
#elif defined(MISBEHAVE_CRASH_KILL)
#define MB_NAME "crash_kill"
#elif defined(MISBEHAVE_IGNORE_ABORT)
#define MB_NAME "ignore_abort"
#elif defined(MISBEHAVE_HANG_ON_ABORT)
#define MB_NAME "hang_on_abort"
#else
#error "define one MISBEHAVE_*"
#endif

#define MB_VICTIM 1
#define MB_STEP   2

static atomic_int mb_released;

__attribute__((visibility("default"))) void misbehave_release(void)
{
    atomic_store(&mb_released, 1);
}

/* Misbehave again (after a release). */
__attribute__((visibility("default"))) void misbehave_hold(void)
{
    atomic_store(&mb_released, 0);
}

typedef struct mb_replica {
    dsim_optim *opt;
} mb_replica;

static dsim_err mb_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1, MB_NAME " takes no parameter servers; got %d", s->num_ps);
    return DSIM_OK;
}

static dsim_err mb_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
#ifdef MISBEHAVE_HANG_SPIN
    while (!atomic_load_explicit(&mb_released, memory_order_relaxed))
        ;
#endif
    mb_replica *me = ctx->priv;
    dsim_err e = dsim_optim_create(ctx->optim, ctx->n_params, &me->opt);
    if (e != DSIM_OK)
        return e;
    if (ctx->replica == 0)
        memcpy(ctx->params, init->params, ctx->n_params * sizeof(float));
    return dsim_broadcast(ctx->world, ctx->params, ctx->n_params, DSIM_F32, 0);
}

static void mb_misbehave(const dsim_replica_ctx *ctx)
{
    if (ctx->replica != MB_VICTIM || ctx->global_step != MB_STEP)
        return;
#if defined(MISBEHAVE_HANG_SLEEP)
    while (!atomic_load(&mb_released)) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
#elif defined(MISBEHAVE_CRASH_SEGV)
    /* page 0 is never mapped: a real SIGSEGV, not a raise() */
    volatile uintptr_t addr = 16;
    *(volatile int *)addr = 1;
#elif defined(MISBEHAVE_CRASH_ABORT)
    abort();
#elif defined(MISBEHAVE_CRASH_EXIT)
    exit(3);
#elif defined(MISBEHAVE_CRASH__EXIT)
    _exit(0);
#elif defined(MISBEHAVE_CRASH_KILL)
    raise(SIGKILL);
#endif
}

static dsim_err mb_apply(dsim_replica_ctx *ctx, float *grad)
{
    mb_misbehave(ctx);
    mb_replica *me = ctx->priv;
    dsim_err e = dsim_allreduce(ctx->world, grad, grad, ctx->n_params, DSIM_F32, DSIM_SUM);
#ifdef MISBEHAVE_IGNORE_ABORT
    e = DSIM_OK; /* the bug */
#endif
#ifdef MISBEHAVE_HANG_ON_ABORT
    /* the bug: wait for the dead peer for ever instead of failing */
    while (e != DSIM_OK && !atomic_load(&mb_released))
        (void)dsim_rt_sleep_until(ctx->rt, dsim_rt_now(ctx->rt) + 10 * 1000 * 1000);
#endif
    if (e != DSIM_OK)
        return e;
    return dsim_optim_apply(me->opt, ctx->params, grad, ctx->n_params);
}

static dsim_err mb_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                          size_t n)
{
    memmove(out, in, n * sizeof(double));
    dsim_err e = dsim_allreduce(ctx->world, out, out, n, DSIM_F64, op);
#ifdef MISBEHAVE_IGNORE_ABORT
    e = DSIM_OK;
#endif
    return e;
}

static void mb_fini(dsim_replica_ctx *ctx)
{
    mb_replica *me = ctx->priv;
    dsim_optim_destroy(me->opt);
    me->opt = NULL;
}

static const struct dsim_strategy_ops mb_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = MB_NAME,
    .summary = "a test fixture that misbehaves on purpose (" MB_NAME ")",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(mb_replica),
    .check_shape = mb_check_shape,
    .create_variables = mb_create,
    .apply_gradients = mb_apply,
    .reduce = mb_reduce,
    .replica_fini = mb_fini,
};

__attribute__((visibility("default"))) const struct dsim_strategy_ops *
dsim_strategy_plugin(uint32_t *abi_version)
{
    *abi_version = DSIM_STRATEGY_ABI_VERSION;
    return &mb_ops;
}
