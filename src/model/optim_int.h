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

/* What optim_seen_take returns in *n for a clip's global norm. */
#define OPTIM_SEEN_GLOBAL ((size_t)-1)

/* Forgets what was noted; want: also note the norm of an update that does
 * not clip (a pass over its gradient). */
void optim_seen_begin(int want);

/* After optim_seen_begin: the gradient of the next update (as given, before
 * any clip) is also copied into dst[n] if it is n long (a whole model's,
 * not a sharded optimizer's part); optim_seen_copied says whether it was.
 * The follow replay of gradient_consistency compares it with one device's
 * (dsim_train_result.trace_grad). */
void optim_seen_copy(float *dst, size_t n);
int optim_seen_copied(void);

/* The norm noted since optim_seen_begin (NaN: none) and *n the length of
 * the gradient it is the norm of (OPTIM_SEEN_GLOBAL: a clip's global norm,
 * the whole gradient's whatever part the update applied); ends the
 * noting. */
double optim_seen_take(size_t *n);

#endif
