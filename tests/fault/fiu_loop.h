/* SQLite-style fault loops (ARCHITECTURE.md §6): fail the 1st, 2nd, 3rd ... call of
 * a libfiu point in turn, until a run completes with no failure injected.
 *
 *     for (int k = 1;; k++) {
 *         fl_arm("dsim/tp/send", k, NULL);
 *         ... run ...
 *         fl_disarm();
 *         if (!fl_fired()) break;   // the run made k - 1 calls: the count
 *         ... assert a clean error, nothing committed lost ...
 *     }
 *
 * The point fires through libfiu's external method (a callback that counts
 * calls), never its random modes. A name ending in '*' counts every point
 * under it as one sequence ("dsim/ckpt/" followed by a star). Include only
 * where DSIM_HAVE_FIU. */
#ifndef DSIM_TESTS_FIU_LOOP_H
#define DSIM_TESTS_FIU_LOOP_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Without it fiu.h turns fiu_init into a no-op. */
#ifndef FIU_ENABLE
#define FIU_ENABLE 1
#endif
#include <fiu-control.h>
#include <fiu.h>

#include "dsim/fiu.h"

/* A loop that has not ended by then has lost count. */
#define FL_MAX_K 100000

static atomic_int fl_calls_;
static atomic_int fl_fired_;
static int fl_k_;
static char fl_name_[128];

static int fl_cb_(const char *name, int *failnum, void **failinfo, unsigned int *flags)
{
    (void)name;
    (void)failnum;
    (void)failinfo;
    (void)flags;
    if (atomic_fetch_add(&fl_calls_, 1) + 1 != fl_k_)
        return 0;
    atomic_store(&fl_fired_, 1);
    return 1;
}

/* Once per process, before any fl_arm. */
static inline void fl_init(void)
{
    if (fiu_init(0) != 0 || dsim_fiu_arm(1) != DSIM_OK) {
        fprintf(stderr, "libfiu could not be initialised\n");
        exit(1);
    }
}

/* The k-th call of `name` (1-based) from now on fails with failinfo. */
static inline void fl_arm(const char *name, int k, void *failinfo)
{
    if (k < 1 || k > FL_MAX_K) {
        fprintf(stderr, "fault loop on %s: k = %d; the loop does not end\n", name, k);
        abort();
    }
    snprintf(fl_name_, sizeof fl_name_, "%s", name);
    atomic_store(&fl_calls_, 0);
    atomic_store(&fl_fired_, 0);
    fl_k_ = k;
    if (fiu_enable_external(fl_name_, 1, failinfo, 0, fl_cb_) != 0) {
        fprintf(stderr, "fiu_enable_external(%s) failed\n", name);
        abort();
    }
}

static inline void fl_disarm(void)
{
    fiu_disable(fl_name_);
}

/* Whether the armed call came, and how many calls there were. */
static inline int fl_fired(void)
{
    return atomic_load(&fl_fired_);
}

static inline int fl_calls(void)
{
    return atomic_load(&fl_calls_);
}

#endif
