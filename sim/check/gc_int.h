/* gradient_consistency's replay of a run from its own variables (one
 * device, step by step or span by span: gc_follow.c), shared with the
 * check itself (gradient_consistency.c). Internal to sim/check. */
#ifndef DSIM_CHECK_GC_INT_H
#define DSIM_CHECK_GC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "check/check.h"

typedef struct gc_followed {
    double worst;          /* the largest relative excess of a step */
    uint64_t at;           /* its row (of the run's trace) */
    uint64_t n_bad;        /* rows beyond max_rel */
    uint64_t first;        /* the first of them */
    uint64_t rows;         /* rows replayed */
    uint32_t every;        /* steps a row */
    uint64_t skips_differ; /* steps the replay skipped (mixed precision) and the run not, or
                              the other way round */
    bool grads;            /* judged by the gradients at the spans' first steps: the rows
                              are those (trace_grad), `rows` of them compared */
    /* with grads: the spans (of `every` steps) whose update is off by more
     * than span_bound of their path, of `spans` */
    uint64_t span_bad, span_first, span_at, spans;
    double span_worst, span_bound;
    /* where half a step was not enough: the widest parting of two right
     * replays within a span, of its path (the bound is twice it); NaN when
     * not measured */
    double span_part;
    /* with grads, at the first row beyond max_rel: the elements off by
     * more than 1 % (how many, the first and the last) */
    uint64_t off, off_lo, off_hi;
    /* with grads, every step kept: of the steps after the first beyond
     * max_rel (stale_of), those whose gradient is one device's of the step
     * before within max_rel (stale) */
    uint64_t stale, stale_of;
    /* with grads: the parameters the first compared row holds (all of
     * them, but where the optimizers of parts cover only some) */
    uint64_t grad_params;
    /* with grads, at the first row beyond max_rel: the factor the run's
     * gradient is of one device's, where it is one (NaN otherwise) */
    double grad_factor;
    /* without grads, under adam, kept every k > 1 steps: the spans judged
     * by the bound of span_bound alone (an optimizer of a part that did
     * not say which part: dsim_optim_set_part) */
    bool spans_only;
    /* with grads, every step kept: the steps whose update is off one
     * device's beyond max_rel though their gradient is one device's within
     * it, and whose update is the one the run's own gradient gives (an
     * optimizer of the same spec fed the run's gradients in turn): not
     * counted in span_bad */
    uint64_t own_excused;
} gc_followed;

/* gradient_consistency.c: whether the run is of asynchronous parameter
 * servers; the tolerances (the scenario's, else by the run's dtypes); how
 * often its trace was kept and its rows; what a ratio k of the run's
 * update (or gradient) to the reference's means with n replicas, or NULL. */
bool gc_is_async_ps(const dsim_check_ctx *ctx);
void gc_tolerances(const dsim_train_result *r, const double *v, double *max_rel, double *max_abs);
uint32_t gc_every(const dsim_train_result *r);
uint64_t gc_rows(const dsim_train_result *r);
const char *gc_ratio_meaning(double k, int n);
/* " (layer 2's bias [4] at [1])": where parameter i lies in the run's
 * model (dsim_model_var_where), "" where the run does not say. */
const char *gc_param_where(const dsim_train_result *r, size_t i, char *b, size_t cap);

/* gc_follow.c: the replay of run r from its own variables, judged against
 * max_rel (fills *fo; false, why said, when it could not run); the run
 * that can be replayed so for the check's run, or NULL; what applied the
 * gradients compared, and what a span's update was held to, in words. */
bool gc_follow(const dsim_check_ctx *ctx, const dsim_train_result *r, double max_rel,
               gc_followed *fo, char *why, size_t cap);
const dsim_train_result *gc_followable(const dsim_check_ctx *ctx);
const char *gc_grad_who(const gc_followed *fo, size_t P, char *b, size_t cap);
const char *gc_span_bound_words(const gc_followed *fo, char *b, size_t cap);

#endif
