/* gradient_consistency's follow replay (docs/checks.md): when a run ends
 * beyond tolerance of the one-device reference, one device replays it from
 * the run's own variables, step by step or span by span, and each step or
 * span is judged on its own, so that float rounding amplified over many
 * steps is told from an error. Under an adaptive optimizer (adam, adamax,
 * rmsprop, adagrad, lion: dsim_optim_is_adaptive) the gradients the run
 * applied (and, in spans, the optimizer's slots) are judged too. The check's other
 * judgements are in gradient_consistency.c. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/check_int.h"
#include "check/gc_int.h"

/* The factor c of a run's gradient row (NaN where nothing was applied)
 * of one device's, when the row is c times it (off its direction by less
 * than 1e-3, and more than 1 % from it); NaN otherwise. From the norms
 * alone: one device's norm |g| over the same elements and the distance d,
 * the angle's cosine (|r|^2 + |g|^2 - d^2) / (2 |r| |g|). */
static double gc_grad_factor(const float *row, size_t P, double one, double d)
{
    double rr = 0;
    for (size_t q = 0; q < P; q++)
        if (!isnan(row[q]))
            rr += (double)row[q] * (double)row[q];
    double run = sqrt(rr);
    if (!(one > 0) || !(run > 0) || !(d > 0.01 * one))
        return NAN;
    double c = (rr + one * one - d * d) / (2 * run * one);
    if (!(fabs(c) <= 1.0 + 1e-9) || sqrt(fmax(1.0 - c * c, 0.0)) >= 1e-3)
        return NAN;
    return c > 0 ? run / one : -run / one;
}

/* What applied the gradients compared (gc_followed.grads): "the run", and
 * the parameters the rows held where they hold only some. */
const char *gc_grad_who(const gc_followed *fo, size_t P, char *b, size_t cap)
{
    if (fo->grad_params >= P)
        snprintf(b, cap, "the run");
    else
        snprintf(b, cap,
                 "the run (to %" PRIu64 " of %zu parameters: the parts its optimizers said "
                 "they update, dsim_optim_set_part)",
                 fo->grad_params, P);
    return b;
}

/* Judges rows of a follow replay: |run - replay| - 2 ulps against max_rel
 * of their size, per row (dist, ulps, size); a NaN dist is not judged. */
static void gc_follow_rows(gc_followed *fo, const double *dist, const double *ulps,
                           const double *size, uint64_t rows, double max_rel)
{
    fo->worst = 0;
    fo->at = fo->n_bad = fo->first = fo->rows = 0;
    for (uint64_t j = 0; j < rows; j++) {
        if (isnan(dist[j]))
            continue;
        fo->rows++;
        double excess = dist[j] - 2 * ulps[j];
        if (excess <= 0)
            continue;
        double rel = size[j] > 0 ? excess / size[j] : INFINITY;
        if (rel > fo->worst) {
            fo->worst = rel;
            fo->at = j;
        }
        if (rel > max_rel && fo->n_bad++ == 0)
            fo->first = j;
    }
}

/* What a span's update was held to (gc_followed.span_bound): half a step,
 * or, where right replays part by more within a span, twice that parting. */
const char *gc_span_bound_words(const gc_followed *fo, char *b, size_t cap)
{
    if (isnan(fo->span_part) || !(fo->span_bound > 0.5 / fo->every))
        snprintf(b, cap, "half a step");
    else
        snprintf(b, cap,
                 "twice the parting of two right replays (%.3g of the path, measured by one "
                 "summing the replicas' gradients: over half a step, so a step applied twice or "
                 "skipped in a span of %" PRIu32 " is not told from rounding)",
                 fo->span_part, fo->every);
    return b;
}

/* The spans of a follow replay f judged against fo->span_bound of their
 * path (fo's span_* and spans). */
static void gc_follow_spans(gc_followed *fo, const dsim_train_result *f, uint64_t rows)
{
    gc_followed sp;
    gc_follow_rows(&sp, f->follow_dist, f->follow_ulps, f->follow_path, rows, fo->span_bound);
    fo->span_bad = sp.n_bad;
    fo->span_first = sp.first;
    fo->span_worst = sp.worst;
    fo->span_at = sp.at;
    fo->spans = sp.rows;
}

/* Every step kept: the steps of follow replay f whose update is off one
 * device's beyond max_rel though their gradient is one device's within
 * it. An adaptive update can turn a gradient's rounding into another step
 * (Lion's sign of an element near zero; Adamax's first step, where an
 * element's update is g / (|g| + epsilon)), and a run that rounds its
 * gradients otherwise than one device (a narrow dtype) then parts from one
 * device's update while computing every step right. The run's own
 * gradients, applied in turn by an optimizer of the same spec to the run's
 * variables before each step, give each step's update as it follows from
 * the gradient the run applied: where that is the run's within max_rel of
 * the step's size, the step is right (its gradient one device's, its
 * update its gradient's). Returns f's follow_dist with those rows NaN
 * (counted in fo->own_excused), or NULL when none is. Steps that applied
 * no gradient are skipped as the run's optimizer skipped them; a row the
 * optimizers of parts filled in part ends the walk. */
static double *gc_own_updates(const dsim_check_ctx *ctx, const dsim_train_result *r,
                              const dsim_train_result *f, uint64_t rows, double max_rel,
                              gc_followed *fo)
{
    size_t P = r->n_params;
    fo->own_excused = 0;
    if (fo->every != 1 || !r->trace_grad || !r->trace || !r->initial_params ||
        !f->follow_grad_dist || r->trace_grad_rows < rows)
        return NULL;
    dsim_optim *opt = NULL;
    float *p = malloc(P * sizeof *p + 1);
    double *dist = malloc(rows * sizeof *dist + 1);
    /* the model's variables, as dsim_train gives them to the strategy's
     * optimizers (LAMB's norms are per variable) */
    dsim_optim_spec os = ctx->cfg->optim;
    if (os.n_vars == 0 && r->n_vars <= DSIM_OPTIM_MAX_VARS) {
        size_t held = 0;
        for (size_t k = 0; k < r->n_vars; k++)
            held += r->vars[k].len;
        for (size_t k = 0; held == P && k < r->n_vars; k++)
            os.var_len[k] = r->vars[k].len;
        os.n_vars = held == P ? r->n_vars : 0;
    }
    if (!p || !dist || dsim_optim_create(&os, P, &opt) != DSIM_OK) {
        dsim_clear_error();
        free(p);
        free(dist);
        return NULL;
    }
    memcpy(dist, f->follow_dist, rows * sizeof *dist);
    for (uint64_t j = 0; j < rows; j++) {
        const float *g = r->trace_grad + j * P, *after = r->trace + j * P;
        size_t nan = 0;
        for (size_t q = 0; q < P; q++)
            nan += isnan(g[q]) != 0;
        if (nan == P) {
            dsim_optim_skip(opt);
            continue;
        }
        memcpy(p, j ? r->trace + (j - 1) * P : r->initial_params, P * sizeof *p);
        if (nan || dsim_optim_apply(opt, p, g, P) != DSIM_OK)
            break;
        double lim = max_rel * f->follow_path[j];
        bool upd_off = f->follow_dist[j] - 2 * f->follow_ulps[j] > lim;
        bool grad_ok =
            !isnan(f->follow_grad_dist[j]) &&
            f->follow_grad_dist[j] - 2 * f->follow_grad_ulps[j] <= max_rel * f->follow_grad_norm[j];
        if (!upd_off || !grad_ok)
            continue;
        double dd = 0;
        for (size_t q = 0; q < P; q++) {
            double d = (double)p[q] - (double)after[q];
            dd += d * d;
        }
        if (sqrt(dd) - 2 * f->follow_ulps[j] <= lim) {
            dist[j] = NAN;
            fo->own_excused++;
        }
    }
    dsim_clear_error();
    dsim_optim_destroy(opt);
    free(p);
    if (!fo->own_excused) {
        free(dist);
        return NULL;
    }
    return dist;
}

/* The run's variables end beyond tolerance of the reference's though no
 * step's update is more than 0.1 % off (gc_diagnose): float rounding
 * builds up over many steps as well as a small error does. One device
 * replays the run step by step from the run's own variables
 * (dsim_train_reference_follow): at step s both start from the run's
 * variables after step s - 1, so their updates differ by the rounding of
 * that one step, summation order, unless the step is computed wrong.
 * Judged for every step: |run - replay| <= max_rel * |replay's update| +
 * 2 ulps of the variables (Euclidean norms over the parameters). A trace
 * kept every k steps is judged k steps at a time: both start from the
 * run's variables k steps back, and the bound is max_rel times the sum of
 * the replay's k updates' norms (what k steps' rounding, each within
 * max_rel of its update, adds up to). Fills *fo; false when the replay
 * could not run (why says so). */
bool gc_follow(const dsim_check_ctx *ctx, const dsim_train_result *r, double max_rel,
               gc_followed *fo, char *why, size_t cap)
{
    size_t P = r->n_params;
    uint64_t T = r->steps, rows = gc_rows(r);
    uint32_t every = gc_every(r);
    dsim_train_cfg rc;
    ck_probe_cfg(ctx->cfg, 0, &rc);
    rc.record_params = false;
    rc.trace_every = every;
    dsim_train_result f;
    dsim_err e = dsim_train_reference_follow_run(&rc, r, &f);
    if (e != DSIM_OK || !f.follow_dist || !f.follow_ulps || !f.follow_path || f.steps != T ||
        f.n_params != P || f.steps / every != rows) {
        dsim_check_msg(why, cap, "replaying it step by step on one device failed: %s",
                       e != DSIM_OK ? f.error.msg : "the replay took other steps");
        dsim_train_result_free(&f);
        return false;
    }
    memset(fo, 0, sizeof *fo);
    fo->every = every;
    /* the first steps of the spans, where the replay stands where the run
     * stood, by their gradients (a run under an adaptive optimizer keeps
     * them) */
    if (r->trace_grad && f.follow_grad_dist) {
        gc_follow_rows(fo, f.follow_grad_dist, f.follow_grad_ulps, f.follow_grad_norm,
                       r->trace_grad_rows, max_rel);
        fo->grads = fo->rows > 0;
        for (uint64_t j = 1;
             fo->n_bad && every == 1 && f.follow_grad_prev && j < r->trace_grad_rows; j++) {
            double n = f.follow_grad_norm[j], n0 = f.follow_grad_norm[j - 1];
            if (isnan(f.follow_grad_dist[j]) || !(n > 0) ||
                f.follow_grad_dist[j] - 2 * f.follow_grad_ulps[j] <= max_rel * n)
                continue;
            fo->stale_of++;
            if (f.follow_grad_prev[j] - 2 * f.follow_grad_ulps[j] <= max_rel * n0)
                fo->stale++;
        }
        if (fo->n_bad && f.follow_grad_off) {
            fo->off = f.follow_grad_off[fo->first];
            fo->off_lo = f.follow_grad_lo[fo->first];
            fo->off_hi = f.follow_grad_hi[fo->first];
        }
        for (uint64_t j = 0; fo->grads && j < r->trace_grad_rows && !fo->grad_params; j++)
            for (size_t q = 0; q < P; q++)
                fo->grad_params += !isnan(r->trace_grad[j * P + q]);
        fo->grad_factor =
            fo->n_bad ? gc_grad_factor(r->trace_grad + fo->first * P, P,
                                       f.follow_grad_norm[fo->first], f.follow_grad_dist[fo->first])
                      : NAN;
    }
    /* Under an adaptive optimizer without gradients, kept every k > 1
     * steps: two right replays part inside a span (adam turns the rounding of a near-zero
     * gradient into a whole step), so the spans' updates are judged by the
     * bound below alone, not within max_rel */
    fo->spans_only = !fo->grads && every > 1 && dsim_optim_is_adaptive(&ctx->cfg->optim);
    if (!fo->grads && !fo->spans_only)
        gc_follow_rows(fo, f.follow_dist, f.follow_ulps, f.follow_path, rows, max_rel);
    /* and the updates: step by step within max_rel (the replay's slots
     * are the run's to rounding when every step starts from the run's
     * variables); spans of k > 1 steps by a bound that rounding amplified
     * by adam stays under and a step applied twice or not at all is over,
     * half a step's share of the span's path */
    fo->span_part = NAN;
    if (fo->grads || fo->spans_only) {
        fo->span_bound = every > 1 ? 0.5 / every : max_rel;
        gc_follow_spans(fo, &f, rows);
        double *own = fo->grads && fo->span_bad && every == 1
                          ? gc_own_updates(ctx, r, &f, rows, max_rel, fo)
                          : NULL;
        if (own) {
            gc_followed sp;
            gc_follow_rows(&sp, own, f.follow_ulps, f.follow_path, rows, fo->span_bound);
            fo->span_bad = sp.n_bad;
            fo->span_first = sp.first;
            fo->span_worst = sp.worst;
            fo->span_at = sp.at;
            free(own);
        }
        /* Long spans: two right replays may part by more than half a step
         * within one (adam's whole steps from rounding add up over a span).
         * Where the run's spans are beyond it, a second replay, summing the
         * replicas' batches' gradients as an all-reduce does, measures how
         * far right replays part here; the bound is twice the widest */
        if (fo->span_bad && every > 1 && dsim_optim_is_adaptive(&ctx->cfg->optim)) {
            dsim_train_cfg rc2 = rc;
            rc2.follow_parting = true;
            dsim_train_result f2;
            if (dsim_train_reference_follow_run(&rc2, r, &f2) == DSIM_OK && f2.follow_part &&
                f2.follow_path && f2.steps / every == rows) {
                double part = 0;
                for (uint64_t j = 0; j < rows; j++)
                    if (f2.follow_path[j] > 0 && isfinite(f2.follow_part[j]))
                        part = fmax(part, f2.follow_part[j] / f2.follow_path[j]);
                fo->span_part = part;
                if (2 * part > fo->span_bound) {
                    fo->span_bound = 2 * part;
                    gc_follow_spans(fo, &f, rows);
                }
            }
            dsim_train_result_free(&f2);
        }
    }
    /* a dynamic loss scale's decisions, taken at the run's variables */
    size_t nr = r->num_replicas > 0 ? (size_t)r->num_replicas : 1;
    for (uint64_t st = 0; r->mp_skipped && f.mp_skipped && st < T; st++)
        fo->skips_differ += (r->mp_skipped[st * nr] != 0) != (f.mp_skipped[st] != 0);
    dsim_train_result_free(&f);
    return true;
}

/* The run whose steps gc_follow replays for the check's run: the run
 * itself when it kept its variables from its first step; for a run that
 * resumed from a checkpoint (a restart under faults), the run of the same
 * job without faults that the harness made (dsim_check_faults.clean) when
 * the two end bit-identical (the same numbers all along: the job is
 * deterministic and a restore gives back what was saved). NULL when there
 * is none. */
const dsim_train_result *gc_followable(const dsim_check_ctx *ctx)
{
    const dsim_train_result *r = ctx->run, *c = ctx->faults ? ctx->faults->clean : NULL;
    if (r->first_step > 0 && c && c->params && r->params && c->n_params == r->n_params &&
        c->first_step + c->steps == r->first_step + r->steps &&
        memcmp(c->params, r->params, r->n_params * sizeof(float)) == 0)
        r = c;
    if (r->first_step != 0 || !r->trace || gc_rows(r) == 0 || !r->initial_params || !ctx->cfg)
        return NULL;
    return r;
}

bool gc_steps_right(const dsim_check_ctx *ctx, char *msg, size_t cap)
{
    const dsim_train_result *r = ctx->run;
    msg[0] = '\0';
    if (!r || gc_is_async_ps(ctx) || !r->replicas_agree || !r->in_sync_every_step)
        return false;
    const dsim_train_result *fr = gc_followable(ctx);
    if (!fr)
        return false;
    double v[DSIM_CHECK_MAX_PARAMS];
    dsim_check_defaults(&dsim_check_gradient_consistency, v);
    double max_rel, max_abs;
    gc_tolerances(r, v, &max_rel, &max_abs);
    gc_followed fo;
    char why[300];
    if (!gc_follow(ctx, fr, max_rel, &fo, why, sizeof why) || fo.n_bad != 0 || fo.span_bad ||
        fo.skips_differ)
        return false;
    char bound[300];
    gc_span_bound_words(&fo, bound, sizeof bound);
    if (fo.grads && fo.every > 1)
        dsim_check_msg(msg, cap,
                       "the gradient the first step of every span of %" PRIu32
                       " applied equals one device's at the run's own variables (%" PRIu64
                       " steps compared, within %.3g), and each span's update is within %s of "
                       "one device's",
                       fo.every, fo.rows, max_rel, bound);
    else if (fo.spans_only)
        dsim_check_msg(msg, cap,
                       "each span of %" PRIu32 " steps' update is within %s of one "
                       "device's from the run's own variables (%" PRIu64
                       " spans; under %s, its gradients not kept: dsim_optim_set_part)",
                       fo.every, bound, fo.spans, dsim_optim_kind_name(ctx->cfg->optim.kind));
    else if (fo.grads)
        dsim_check_msg(msg, cap,
                       "the gradient every step applied and its update equal one device's at "
                       "the run's own variables (%" PRIu64 " steps compared, within %.3g)",
                       fo.rows, max_rel);
    else
        dsim_check_msg(msg, cap,
                       "every step's update equals one device's from the run's own variables "
                       "(%" PRIu64 " steps replayed, within %.3g)",
                       fr->steps, max_rel);
    if (fr != r)
        dsim_check_msg_append(msg, cap,
                              " in a run without faults that ends bit-identical to this one");
    return true;
}
