/* What an optimizer's update saw, for the training driver (internal to
 * libdsim; src/strategy reads it around a strategy's update).
 *
 * Every dsim_optim_apply / _apply_norm of an optimizer with global_clipnorm
 * notes the global norm it clipped by (the gradient's own, or the one the
 * caller gave); one without, the norm of the gradient it applied, where
 * the worker asked for it (optim_seen_begin). In the worker's state: a
 * thread's, saved and restored with a worker by the engines that run many
 * on one thread (dsim/spi/rt.h). */
#ifndef DSIM_MODEL_OPTIM_INT_H
#define DSIM_MODEL_OPTIM_INT_H

#include <stddef.h>

#include "dsim/optim.h"

/* What optim_seen_take returns in *n for a clip's global norm. */
#define OPTIM_SEEN_GLOBAL ((size_t)-1)

/* Forgets what was noted; want: also note the norm of an update that does
 * not clip (a pass over its gradient). */
void optim_seen_begin(int want);

/* After optim_seen_begin: the gradient of the next update (as given, before
 * any clip) is also copied into the row dst[n]: where whole, the gradient
 * of an optimizer of n parameters (a whole model's) to dst[0..n); the
 * gradient of an optimizer of a part of a model of n (dsim_optim_set_part)
 * to its part of dst, whatever whole. The replicas of a job copy their
 * parts into one row, under a lock (parts may overlap); the first copy
 * sets the row to NaN first where *filled is 0, and sets it. With slots
 * (a row of n floats a slot of the optimizer: adam's m, then v), the
 * optimizer's slots before the update too, each at its place. The follow
 * replay of gradient_consistency compares the row with one device's
 * gradient (dsim_train_result.trace_grad). */
void optim_seen_copy(float *dst, float *slots, size_t n, int whole, unsigned char *filled);

/* The norm noted since optim_seen_begin (NaN: none) and *n the length of
 * the gradient it is the norm of (OPTIM_SEEN_GLOBAL: a clip's global norm,
 * the whole gradient's whatever part the update applied); ends the
 * noting. */
double optim_seen_take(size_t *n);

/* DSIM_OK or DSIM_EINVAL naming what in spec->schedule is wrong
 * (lr_schedule.c; dsim_optim_validate calls it). */
dsim_err optim_schedule_validate(const dsim_optim_spec *spec);

#endif
