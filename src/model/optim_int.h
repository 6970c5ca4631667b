/* What an optimizer's clip saw, for the training driver (internal to
 * libdsim; src/strategy reads it around a strategy's update).
 *
 * Every dsim_optim_apply / _apply_norm of an optimizer with global_clipnorm
 * notes the global norm it clipped by (the gradient's own, or the one the
 * caller gave) in its worker's state: a thread's, saved and restored with
 * a worker by the engines that run many on one thread (dsim/spi/rt.h). */
#ifndef DSIM_MODEL_OPTIM_INT_H
#define DSIM_MODEL_OPTIM_INT_H

/* The norm noted since the last take (NaN: none), and forgets it. */
double optim_seen_norm_take(void);

#endif
