/* What the engine tables share (engine.c, proc_engine.c): the job and the
 * rank program of an engine whose workers all live in this process. */
#ifndef DSIM_SIM_ENGINE_INT_H
#define DSIM_SIM_ENGINE_INT_H

#include "engine.h"

/* cfg's job on runtime `runtime` in this process, under a->fs (if any). */
dsim_err dsim_engine_train_here(const char *runtime, const dsim_train_cfg *cfg,
                                const dsim_engine_attempt *a, dsim_train_result *res,
                                dsim_engine_outcome *out);

/* Every rank a worker of `runtime` in this process, one fabric of
 * job->transport for every round. */
dsim_err dsim_engine_ranks_here(const char *runtime, const dsim_engine_ranks *job);

/* The calling thread's error again, with `what` in front ("what: msg"). */
dsim_err dsim_engine_error(dsim_err e, int peer, const char *what);

#endif
