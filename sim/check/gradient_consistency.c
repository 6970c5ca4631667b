/* gradient_consistency (ARCHITECTURE.md §8): the replicas of a synchronous strategy
 * hold bit-identical parameters after every step, and the run ends where a
 * one-device replay of the same global batches ends, within a tolerance.
 *
 * Tolerance: a parameter is out of tolerance when it differs from the
 * reference by more than max_abs_error AND by more than max_rel_error
 * relative to the larger magnitude of the two. The absolute floor keeps
 * parameters near zero (where any rounding is a large relative error) from
 * failing the check; the relative bound judges the rest. The measured value
 * is the largest relative error among parameters beyond the absolute floor
 * (0 when none is), so measured <= expected is exactly "passed".
 *
 * The loss the strategy reports is judged too, before the parameters: at
 * every step it must be the sum of the replicas' local losses (the driver
 * asks the strategy's reduce() for SUM), within max_loss_rel_error. A
 * strategy whose reduce() ignores the op it is given trains correctly and
 * reports every loss off by the replica count; nothing else would notice.
 *
 * Rounding built up: a long correct run ends beyond tolerance of the
 * reference (summation order, step after step). When no step's update is
 * more than 0.1 % off (gc_diagnose) and the run kept every step's
 * variables, gc_follow (gc_follow.c) replays it step by step from its own variables and
 * the check passes when each step is right within max_rel_error.
 *
 * Mixed precision: when the scenario leaves max_rel_error and max_abs_error
 * unset, a run under mixed_float16 or mixed_bfloat16, or with gradients
 * all-reduced in float16 or bfloat16, is judged with max_rel_error = 16 u
 * and max_abs_error = u, u the unit roundoff of the narrowest of its
 * compute and gradient dtypes (float16 2^-11, bfloat16 2^-8); float32 runs
 * keep 1e-4 and 1e-6. docs/checks.md says why. Before anything else every
 * replica must have made the same skip decision and held the same loss
 * scale at every step (Keras's LossScaleOptimizer tests the aggregated
 * gradient so that they do).
 *
 * Asynchronous parameter servers: each replica computes with whatever
 * version of the variables it pulled, so neither per-step bit-identity nor
 * equality with a synchronous replay is expected of them. The check then
 * judges what does apply — every replica ends holding the servers' final
 * variables, and they are finite — and reports the distance from the
 * reference for information only (expected = NaN). Convergence is the check
 * that judges such a run's result. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check/check_int.h"
#include "check/gc_int.h"
#include "dsim/dtype.h"
#include "dsim/precision.h"

enum { GC_MAX_REL, GC_MAX_ABS, GC_BIT_IDENTICAL, GC_MAX_LOSS_REL };

bool gc_is_async_ps(const dsim_check_ctx *ctx)
{
    const dsim_train_result *r = ctx->run;
    bool ps = r->num_ps > 0 || strcmp(r->strategy, "parameter_server") == 0;
    return ps && ctx->cfg && ctx->cfg->ps_mode == DSIM_PS_ASYNC;
}

/* The first (step, replica) whose checksum differs from replica 0's after
 * that step; false if none does. *n_differ counts that step's replicas that
 * differ. */
static bool gc_first_divergence(const dsim_train_result *r, uint64_t *step, int *replica,
                                int *n_differ)
{
    if (!r->checksum || r->num_replicas < 2)
        return false;
    size_t nr = (size_t)r->num_replicas;
    for (uint64_t s = 0; s < r->steps; s++) {
        const uint64_t *row = r->checksum + s * nr;
        int first = -1, n = 0;
        for (size_t k = 1; k < nr; k++) {
            if (row[k] != row[0]) {
                if (first < 0)
                    first = (int)k;
                n++;
            }
        }
        if (first >= 0) {
            *step = s;
            *replica = first;
            *n_differ = n;
            return true;
        }
    }
    return false;
}

const char *gc_param_where(const dsim_train_result *r, size_t i, char *b, size_t cap)
{
    char w[160];
    dsim_model_var_where(r->vars, r->n_vars, i, w, sizeof w);
    if (w[0])
        snprintf(b, cap, " (%s)", w);
    else if (cap)
        b[0] = '\0';
    return b;
}

/* "; in layer 3's bias [10]" where parameters lo..hi lie in one variable,
 * "; layer 3's kernel [256 x 10] at [247, 9] to layer 3's bias [10] at
 * [9]" where they span several, "" where the run does not say. */
static const char *gc_range_where(const dsim_train_result *r, size_t lo, size_t hi, char *b,
                                  size_t cap)
{
    char a[160], z[160];
    dsim_model_var_where(r->vars, r->n_vars, lo, a, sizeof a);
    dsim_model_var_where(r->vars, r->n_vars, hi, z, sizeof z);
    b[0] = '\0';
    if (!a[0] || !z[0])
        return b;
    for (size_t k = 0; k < r->n_vars && k < DSIM_MODEL_MAX_VARS; k++)
        if (lo >= r->vars[k].off && hi - r->vars[k].off < r->vars[k].len) {
            snprintf(b, cap, "; in %s", r->vars[k].name);
            return b;
        }
    snprintf(b, cap, "; %s to %s", a, z);
    return b;
}

/* Which of the model's variables replica rep parted from replica 0 in
 * after the run's step s (their signatures, dsim_train_result.var_sig),
 * as "; they parted in ..." into msg (empty where the run kept none). */
static void gc_parted_vars(const dsim_check_ctx *ctx, uint64_t s, int rep, char *msg, size_t cap)
{
    const dsim_train_result *r = ctx->run;
    msg[0] = '\0';
    if (!r->var_sig)
        return;
    const dsim_model_var *vars = r->vars;
    size_t nv = r->n_vars < DSIM_MODEL_MAX_VARS ? r->n_vars : DSIM_MODEL_MAX_VARS;
    size_t nr = (size_t)r->num_replicas;
    const uint16_t *a = r->var_sig + (s * nr) * DSIM_MODEL_MAX_VARS;
    const uint16_t *b = r->var_sig + (s * nr + (size_t)rep) * DSIM_MODEL_MAX_VARS;
    size_t parted[DSIM_MODEL_MAX_VARS], np = 0;
    for (size_t k = 0; k < nv; k++) {
        if (!a[k] || !b[k])
            return; /* a step not kept, or another layout */
        if (a[k] != b[k])
            parted[np++] = k;
    }
    if (np == 0)
        return;
    if (np == nv && nv > 1) {
        dsim_check_msg(msg, cap, "; every one of the model's %zu variables differs", nv);
        return;
    }
    size_t at = (size_t)snprintf(msg, cap, "; of the model's %zu variables, only ", nv);
    for (size_t i = 0; i < np && at < cap; i++) {
        const dsim_model_var *v = &vars[parted[i]];
        const char *sep = i == 0 ? "" : i + 1 < np ? ", " : " and ";
        if (v->shape[0] == 0) /* a plugin's span, named by its parameters */
            at += (size_t)snprintf(msg + at, cap - at, "%s%s", sep, v->name);
        else
            at += (size_t)snprintf(msg + at, cap - at, "%s%s (parameters %zu..%zu)", sep, v->name,
                                   v->off, v->off + v->len - 1);
    }
    if (at < cap)
        snprintf(msg + at, cap - at, " %s", np == 1 ? "differs" : "differ");
}

/* The tolerances: the scenario's, else the float32 defaults or, for a run
 * that rounds to a narrow dtype, 16 u and u of the narrowest. */
void gc_tolerances(const dsim_train_result *r, const double *v, double *max_rel, double *max_abs)
{
    double u = dsim_check_narrow_u(r);
    *max_rel = !DSIM_CHECK_UNSET(v[GC_MAX_REL]) ? v[GC_MAX_REL] : u > 0 ? 16 * u : 1e-4;
    *max_abs = !DSIM_CHECK_UNSET(v[GC_MAX_ABS]) ? v[GC_MAX_ABS] : u > 0 ? u : 1e-6;
}

/* Appends to buf the replicas (up to 8) of row whose value is (==) or is
 * not (!=) that of `of`. */
static void gc_list(char *buf, size_t cap, const dsim_train_result *r, uint64_t s, bool same,
                    int of)
{
    size_t nr = (size_t)r->num_replicas, shown = 0, more = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < nr; k++) {
        size_t a = s * nr + k, b = s * nr + (size_t)of;
        bool eq = r->mp_skipped[a] == r->mp_skipped[b] &&
                  memcmp(&r->mp_scale[a], &r->mp_scale[b], sizeof(float)) == 0;
        if (eq != same)
            continue;
        if (shown < 8)
            dsim_check_msg_append(buf, cap, "%s%zu", shown ? ", " : "", k);
        else
            more++;
        shown++;
    }
    if (more)
        dsim_check_msg_append(buf, cap, " and %zu more", more);
}

/* Every replica made the same skip decision and held the same loss scale at
 * every step (replicas that did not run the step are not judged). */
static bool gc_skips_agree(const dsim_train_result *r, char *msg, size_t cap)
{
    if (!r->mp_scale || !r->mp_skipped || r->num_replicas < 2)
        return true;
    size_t nr = (size_t)r->num_replicas;
    for (uint64_t s = 0; s < r->steps; s++) {
        int diff = -1;
        for (size_t k = 1; k < nr && diff < 0; k++) {
            if (r->replicas && (r->replicas[k].steps_done <= s || r->replicas[0].steps_done <= s))
                continue;
            size_t a = s * nr + k, b = s * nr;
            if (r->mp_skipped[a] != r->mp_skipped[b] ||
                memcmp(&r->mp_scale[a], &r->mp_scale[b], sizeof(float)) != 0)
                diff = (int)k;
        }
        if (diff < 0)
            continue;
        char same[96], other[96];
        gc_list(same, sizeof same, r, s, true, 0);
        gc_list(other, sizeof other, r, s, false, 0);
        size_t a = s * nr + (size_t)diff;
        uint64_t g = r->first_step + s;
        if (r->mp_skipped[a] != r->mp_skipped[s * nr])
            dsim_check_msg(
                msg, cap,
                "replicas disagree on skipping the update at global step %" PRIu64
                ": replica(s) %s %s it and replica(s) %s %s it (loss scale %g): the strategy "
                "decides from a gradient that differs between replicas, e.g. each replica's "
                "local gradient before the all-reduce; test the aggregated gradient for inf "
                "and NaN, as Keras's LossScaleOptimizer does, so that every replica skips "
                "together",
                g, same, r->mp_skipped[s * nr] ? "skipped" : "applied", other,
                r->mp_skipped[a] ? "skipped" : "applied", (double)r->mp_scale[s * nr]);
        else
            dsim_check_msg(msg, cap,
                           "replicas hold different loss scales at global step %" PRIu64
                           ": replica(s) %s computed with %g, replica(s) %s with %g: their "
                           "dynamic loss scales moved apart (a skip or a growth one replica "
                           "made alone); every replica must update its scale from the same "
                           "aggregated gradient",
                           g, same, (double)r->mp_scale[s * nr], other, (double)r->mp_scale[a]);
        return false;
    }
    return true;
}

/* The first step the run and the reference skipped differently, prefixed
 * to d; false when they agree. */
static bool gc_skips_vs_reference(const dsim_train_result *r, const dsim_train_result *ref, char *d,
                                  size_t cap)
{
    if (!r->mp_skipped || !ref->mp_skipped || r->num_replicas < 1)
        return false;
    size_t nr = (size_t)r->num_replicas;
    for (uint64_t s = 0; s < r->steps; s++) {
        uint64_t g = r->first_step + s;
        if (g < ref->first_step || g - ref->first_step >= ref->steps)
            continue;
        bool a = r->mp_skipped[s * nr] != 0, b = ref->mp_skipped[g - ref->first_step] != 0;
        if (a == b)
            continue;
        dsim_check_msg(d, cap,
                       "At global step %" PRIu64 " the run %s the update and the reference, "
                       "replaying the same policy and loss scale (%g), %s it: the aggregated "
                       "gradient was %s in the run but not in the replay. ",
                       g, a ? "skipped" : "applied", (double)r->mp_scale[s * nr],
                       b ? "skipped" : "applied", a ? "not finite" : "finite");
        return true;
    }
    return false;
}

/* Largest relative error among parameters beyond the absolute floor, how
 * many are out of tolerance, and the worst one's index. A NaN on either
 * side that is not NaN on both counts as out of tolerance (error INFINITY). */
static double gc_rel_beyond_floor(const float *a, const float *b, size_t n, double max_abs,
                                  double max_rel, size_t *n_out, size_t *worst)
{
    double m = 0;
    *n_out = 0;
    *worst = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        double rel, d;
        if (isnan(x) || isnan(y) || isinf(x) || isinf(y)) {
            if ((isnan(x) && isnan(y)) || x == y)
                continue;
            d = INFINITY;
            rel = INFINITY;
        } else {
            d = fabs(x - y);
            double mag = fmax(fabs(x), fabs(y));
            rel = mag > 0 ? d / mag : 0;
        }
        if (d <= max_abs)
            continue;
        if (rel > max_rel)
            (*n_out)++;
        if (rel > m || *worst == SIZE_MAX) {
            m = rel;
            *worst = i;
        }
    }
    return m;
}

/* The loss a strategy reports is its reduce(SUM) of the replicas' local
 * losses (dsim_train_step_info.loss): it must be their sum. Returns false,
 * with the message and the measured relative difference, at the first step
 * where it is not (within max_rel of the local losses' magnitude; both are
 * doubles summed in another order). Steps whose loss the strategy did not
 * reduce (NaN) are not judged. */
static bool gc_loss_reduced(const dsim_train_result *r, double max_rel, char *msg, size_t cap,
                            double *measured)
{
    if (!r->loss || !r->local_loss || r->num_replicas < 1)
        return true;
    size_t nr = (size_t)r->num_replicas;
    for (uint64_t s = 0; s < r->steps; s++) {
        double got = r->loss[s];
        if (isnan(got))
            continue;
        const double *row = r->local_loss + s * nr;
        double sum = 0, mag = 0;
        for (size_t k = 0; k < nr; k++) {
            sum += row[k];
            mag += fabs(row[k]);
        }
        double d = fabs(got - sum);
        if (d <= max_rel * mag || (!isfinite(sum) && got == sum))
            continue;
        *measured = mag > 0 ? d / mag : INFINITY;
        double ratio = sum != 0 ? got / sum : NAN;
        double n = (double)nr;
        const char *why;
        if (nr > 1 && fabs(ratio * n - 1) < 1e-6)
            why = "1/num_replicas of it: its reduce() averaged (MEAN) where the driver asked "
                  "for SUM; a reduce must apply the op it is given";
        else if (nr > 1 && fabs(ratio / n - 1) < 1e-6)
            why = "num_replicas times it: its reduce() combined the values once too often";
        else if (nr > 1 && got == row[0])
            why = "replica 0's own local loss: its reduce() did not combine the replicas' "
                  "values";
        else
            why = "neither their sum nor a simple multiple of it: look at the strategy's "
                  "reduce()";
        dsim_check_msg(msg, cap,
                       "the loss the strategy reports at global step %" PRIu64
                       " is %.9g, but the %zu replicas' local losses sum to %.9g (ratio "
                       "%.6g): it reports %s. The parameters are not judged until the reported "
                       "loss is right",
                       r->first_step + s, got, nr, sum, ratio, why);
        return false;
    }
    return true;
}

/* ---- how a run differs from the reference (from both traces) ---- */

/* 1 if x is within 1 % of y. */
static bool gc_near(double x, double y)
{
    return fabs(x - y) <= 0.01 * fabs(y);
}

/* What a ratio k of the run's update to the reference's means, with n
 * replicas in sync; NULL when it means nothing in particular. */

const char *gc_ratio_meaning(double k, int n)
{
    if (n > 1 && gc_near(k, 1.0 / n))
        return "gradients already averaged over the global batch were averaged again over "
               "the replicas (MEAN where SUM is right: the learning rate divided by the replica "
               "count)";
    if (n > 1 && gc_near(k, n))
        return "the replicas' gradients were summed where each already stood for the whole "
               "batch (SUM of averages, or a scale by the replica count: the learning rate "
               "times the replica count)";
    if (gc_near(k, 0.5) || gc_near(k, 2))
        return "the update is scaled by a constant factor: look for a reduction or a learning "
               "rate applied twice or not at all";
    return NULL;
}

/* The reference's grad_norm at the global step of the run's step k; NaN
 * where the reference did not take that step. */
static double gc_ref_grad_norm(const dsim_train_result *r, const dsim_train_result *ref, uint64_t k)
{
    uint64_t g = r->first_step + k;
    return g >= ref->first_step && g - ref->first_step < ref->steps
               ? ref->grad_norm[g - ref->first_step]
               : NAN;
}

/* A wrong aggregation the clip hid. Where the one-device reference's
 * gradient was longer than global_clipnorm, the clip scales its update to
 * global_clipnorm whatever the norm was; a strategy that applies a
 * gradient of another norm above it (a fourth of it: MEAN where SUM is
 * right) then moves the variables as the reference does, and goes wrong
 * only once the gradient's norm falls under the clip. So at such steps the
 * norm each replica's update clipped by (dsim_optim_apply's, or the one
 * given dsim_optim_apply_norm) must be the reference's, within max_rel and
 * no tighter than 1e-3 (at a clipped step the norm is at least
 * global_clipnorm: the all-reduce's float rounding moves it by far less).
 * Replicas that applied no clipping update at a step are not judged there.
 * True, with the message, where one differs. */
static bool gc_clip_masked(const dsim_check_ctx *ctx, const dsim_train_result *r,
                           const dsim_train_result *ref, double max_rel, char *msg, size_t cap,
                           double *measured)
{
    double C = ctx->cfg ? ctx->cfg->optim.global_clipnorm : 0.0;
    if (!(C > 0.0) || !r->grad_norm || !ref->grad_norm || r->num_replicas < 1)
        return false;
    double tol = fmax(max_rel, 1e-3), worst = 0.0, got0 = 0.0, want0 = 0.0;
    size_t nr = (size_t)r->num_replicas;
    uint64_t clipped = 0, bad = 0, g0 = 0;
    int rep0 = -1;
    for (uint64_t k = 0; k < r->steps; k++) {
        double want = gc_ref_grad_norm(r, ref, k);
        if (!(isfinite(want) && want > C))
            continue;
        clipped++;
        bool step_bad = false;
        for (size_t rep = 0; rep < nr; rep++) {
            double got = r->grad_norm[k * nr + rep];
            if (isnan(got))
                continue;
            double rel = isfinite(got) ? fabs(got - want) / want : INFINITY;
            if (rel <= tol)
                continue;
            step_bad = true;
            worst = fmax(worst, rel);
            if (rep0 < 0) {
                rep0 = (int)rep;
                g0 = r->first_step + k;
                got0 = got;
                want0 = want;
            }
        }
        bad += step_bad;
    }
    if (!bad)
        return false;
    *measured = worst;
    double k = got0 / want0;
    const char *meaning = gc_ratio_meaning(k, r->num_replicas);
    dsim_check_msg(msg, cap,
                   "the variables agree with the one-device reference, but only because the "
                   "optimizer clips (global_clipnorm %g): at global step %" PRIu64
                   " replica %d's update was clipped by a gradient norm of %.6g where the "
                   "reference's was %.6g (%.3g times it%s%s), both above the clip, which scales "
                   "either to %g; %" PRIu64 " of the %" PRIu64
                   " steps the reference clipped differ so. The gradient the strategy applies "
                   "is not the global batch's: the error shows in the variables once the "
                   "gradient's norm falls under the clip",
                   C, g0, rep0, got0, want0, k, meaning ? ": " : "", meaning ? meaning : "", C, bad,
                   clipped);
    return true;
}

/* The gradient replica 0's updates applied against the reference's, by
 * their norms: k where every step compared has the ratio k (within 1 % of
 * one another) and k is off 1 by more than max(1 %, 2 max_rel), which float
 * rounding, a gradient all-reduced in 16 bits included, does not do. A
 * constant factor is what an optimizer that normalises the gradient (Adam,
 * whose update hardly depends on its scale) or a clip hides from the
 * variables. *n: the steps compared. */
static bool gc_grad_scale(const dsim_train_result *r, const dsim_train_result *ref, double max_rel,
                          double *k_out, uint64_t *n)
{
    *n = 0;
    if (!r->grad_norm || !ref->grad_norm || r->num_replicas < 1)
        return false;
    size_t nr = (size_t)r->num_replicas;
    double lo = INFINITY, hi = -INFINITY;
    for (uint64_t k = 0; k < r->steps; k++) {
        double want = gc_ref_grad_norm(r, ref, k), got = r->grad_norm[k * nr];
        if (!(isfinite(want) && isfinite(got) && want > 0.0 && got > 0.0))
            continue;
        double q = got / want;
        lo = fmin(lo, q);
        hi = fmax(hi, q);
        (*n)++;
    }
    if (*n < 2 || hi > lo * 1.01)
        return false;
    double k = 0.5 * (lo + hi);
    *k_out = k;
    return fabs(k - 1.0) > fmax(0.01, 2.0 * max_rel);
}

/* The norms of the first gradient the run's replica 0 and the reference
 * applied, at global step *g, where a fresh run and the reference still
 * stand at the same variables (no update before it in either); false where
 * that cannot be said (a restored run, another start, a first update one
 * of them skipped or applied in parts). */
static bool gc_first_grad(const dsim_train_result *r, const dsim_train_result *ref, uint64_t *g,
                          double *got, double *want)
{
    if (!r->grad_norm || !ref->grad_norm || r->num_replicas < 1 || !r->replicas ||
        r->first_step != 0 || ref->first_step != 0 || r->initial_checksum == 0 ||
        r->initial_checksum != ref->initial_checksum ||
        r->replicas[0].created_checksum != r->initial_checksum)
        return false;
    size_t nr = (size_t)r->num_replicas;
    for (uint64_t k = 0; k < r->steps && k < ref->steps; k++) {
        double a = r->grad_norm[k * nr], b = ref->grad_norm[k];
        bool ua = r->mp_skipped ? !r->mp_skipped[k * nr] : true;
        bool ub = ref->mp_skipped ? !ref->mp_skipped[k] : true;
        if (isnan(a) && isnan(b) && !ua && !ub)
            continue; /* a step both skipped: the variables stay */
        /* a zero gradient where one device's is not is judged too */
        if (!(isfinite(a) && isfinite(b) && a >= 0.0 && b > 0.0))
            return false;
        *g = k;
        *got = a;
        *want = b;
        return true;
    }
    return false;
}

/* The message of a run whose variables differ from the reference's: how
 * many, the worst, and why (its first letter raised). */
static void gc_msg_differ(char *msg, size_t cap, const dsim_train_result *r,
                          const dsim_train_result *ref, size_t n_out, size_t worst, double m,
                          char *why)
{
    why[0] = (char)toupper((unsigned char)why[0]);
    char where[200];
    dsim_check_msg(msg, cap,
                   "%zu of %zu parameters differ from the one-device reference beyond "
                   "tolerance; worst: parameter %zu%s is %.6g, the reference %.6g (relative "
                   "error %.3g). %s",
                   n_out, r->n_params, worst, gc_param_where(r, worst, where, sizeof where),
                   (double)r->params[worst], (double)ref->params[worst], m, why);
}

/* A run that ends beyond tolerance of the reference, of a model too large
 * for the harness to keep one step's variables (and under adam gradients:
 * DSIM_CHECK_TRACE_MAX), so that no step can be replayed from the run's
 * own variables: a difference this large may be rounding amplified over
 * the steps as well as an error. What can still be judged is global step
 * 0, where the run and the reference stand at the same variables: the
 * norm of the gradient replica 0 applied must be one device's within
 * max_rel (fails, the factor named, where it is not); the rest is not
 * judged (N/A, the message says why and what would have it judged). */
static void gc_untraced(const dsim_train_result *r, const dsim_train_result *ref, double max_rel,
                        double m, size_t worst, const dsim_optim_spec *os, dsim_check_result *out)
{
    const bool adaptive = dsim_optim_is_adaptive(os);
    const size_t slots = dsim_optim_rule_slots(os);
    char also[120] = "";
    static const char *const count[] = {"no", "one", "two", "three", "four"};
    if (adaptive && slots < sizeof count / sizeof count[0])
        snprintf(also, sizeof also, " (and under %s its gradient and %s slot%s)",
                 dsim_optim_kind_name(os->kind), count[slots], slots == 1 ? "" : "s");
    char *msg = out->message;
    size_t cap = sizeof out->message, P = r->n_params;
    double g = r->grad_norm ? r->grad_norm[0] : NAN, g1 = ref->grad_norm ? ref->grad_norm[0] : NAN;
    char step0[400] = "";
    if (isfinite(g) && isfinite(g1) && g1 > 0) {
        double k = g / g1;
        if (fabs(k - 1.0) > max_rel) {
            const char *why = gc_ratio_meaning(k, r->num_replicas);
            out->passed = false;
            out->measured = fmax(m, fabs(k - 1.0));
            dsim_check_msg(msg, cap,
                           "at global step 0, where the run and the one-device reference stand "
                           "at the same variables, the gradient replica 0 applied has norm "
                           "%.6g and one device's %.6g (%.4g times it, beyond max_rel_error "
                           "%.3g)%s%s: the strategy computes its gradients wrong. The run ends "
                           "%.3g (relative) from the reference, parameter %zu; this model's "
                           "%zu parameters are too many to keep its later steps (%" PRIu64
                           " floats a step), so those are not compared",
                           g, g1, k, max_rel, why ? ": " : "", why ? why : "", m, worst, P,
                           DSIM_CHECK_TRACE_MAX);
            return;
        }
        dsim_check_msg(step0, sizeof step0,
                       " The gradient replica 0 applied at global step 0, where both stand at "
                       "the same variables, has one device's norm (%.3g relative apart).",
                       fabs(k - 1.0));
    }
    out->passed = false;
    out->not_judged = true;
    dsim_check_msg(msg, cap,
                   "not judged: the run ends %.3g (relative) from the one-device reference, "
                   "parameter %zu, beyond max_rel_error, and this model's %zu parameters%s are "
                   "more than the %" PRIu64
                   " floats dsim keeps of a step, so no step can be replayed from the run's own "
                   "variables: a difference this large can be float rounding amplified over the "
                   "steps (a model with kinks, an adaptive optimizer, a large learning rate) as "
                   "well as an error of the strategy.%s The same job on a model of at most "
                   "%" PRIu64 " parameters has its steps judged",
                   m, worst, P, also, DSIM_CHECK_TRACE_MAX, step0,
                   DSIM_CHECK_TRACE_MAX / dsim_check_trace_rows(os));
}

/* Row k's update of a trace: after[k] - before[k] (a trace kept every k
 * steps: the update of those k steps). */
typedef struct gc_trace {
    const float *initial, *rows;
    size_t n;
} gc_trace;

/* How often a result's trace was kept, and its rows (a result that does
 * not say: every step). */
uint32_t gc_every(const dsim_train_result *r)
{
    return r->trace_every > 1 ? r->trace_every : 1;
}
uint64_t gc_rows(const dsim_train_result *r)
{
    if (!r->trace)
        return 0;
    return r->trace_rows ? r->trace_rows : r->steps / gc_every(r);
}

/* "global step g" or, for a trace kept every `every` steps, "global steps
 * a..b": the steps of the run's row k (a run resumed at off). */
static const char *gc_steps(char *b, size_t cap, uint64_t off, uint64_t k, uint32_t every)
{
    if (every <= 1)
        snprintf(b, cap, "global step %" PRIu64, off + k);
    else
        snprintf(b, cap, "global steps %" PRIu64 "..%" PRIu64, off + k * every,
                 off + (k + 1) * every - 1);
    return b;
}

static const float *gc_after(const gc_trace *t, uint64_t k)
{
    return t->rows + k * t->n;
}
static const float *gc_before(const gc_trace *t, uint64_t k)
{
    return k == 0 ? t->initial : t->rows + (k - 1) * t->n;
}

/* dot products of the updates u (run, step ku) and v (reference, step kv). */
static void gc_dots(const gc_trace *a, uint64_t ku, const gc_trace *b, uint64_t kv, double *uu,
                    double *uv, double *vv, double *dd)
{
    const float *a1 = gc_after(a, ku), *a0 = gc_before(a, ku);
    const float *b1 = gc_after(b, kv), *b0 = gc_before(b, kv);
    *uu = *uv = *vv = *dd = 0;
    for (size_t i = 0; i < a->n; i++) {
        double u = (double)a1[i] - a0[i], v = (double)b1[i] - b0[i];
        *uu += u * u;
        *uv += u * v;
        *vv += v * v;
        *dd += (u - v) * (u - v);
    }
}

/* Appends to d how the run's update at run step k (global step g) differs
 * from the reference's, parameter by parameter: which ranges differ and by
 * what ratio. Returns false when every parameter differs alike (no ranges to
 * tell apart). */
static bool gc_ranges(const gc_trace *run, const gc_trace *ref, uint64_t k, uint64_t kr, int n,
                      const char *where, char *d, size_t cap)
{
    const float *a1 = gc_after(run, k), *a0 = gc_before(run, k);
    const float *b1 = gc_after(ref, kr), *b0 = gc_before(ref, kr);
    size_t P = run->n, n_diff = 0;
    double vmax = 0;
    for (size_t i = 0; i < P; i++)
        vmax = fmax(vmax, fabs((double)b1[i] - b0[i]));
    size_t lo[4], hi[4], nr = 0, more = 0;
    double uv = 0, vv = 0;
    bool in = false;
    for (size_t i = 0; i <= P; i++) {
        bool differs = false;
        if (i < P) {
            double u = (double)a1[i] - a0[i], v = (double)b1[i] - b0[i];
            differs = fabs(u - v) > 1e-3 * fmax(fabs(v), 1e-3 * vmax);
            if (differs) {
                n_diff++;
                uv += u * v;
                vv += v * v;
            }
        }
        if (differs && !in) {
            if (nr < 4)
                lo[nr] = i;
            in = true;
        } else if (!differs && in) {
            if (nr < 4)
                hi[nr] = i - 1;
            else
                more++;
            nr++;
            in = false;
        }
    }
    if (n_diff == 0 || n_diff == P)
        return false;
    dsim_check_msg_append(d, cap,
                          "at %s, %zu of %zu parameters are updated "
                          "differently from the reference (the others alike): parameters ",
                          where, n_diff, P);
    for (size_t j = 0; j < nr && j < 4; j++)
        dsim_check_msg_append(d, cap, "%s%zu..%zu", j ? ", " : "", lo[j], hi[j]);
    if (nr > 4)
        dsim_check_msg_append(d, cap, " and %zu more ranges", more);
    double kf = vv > 0 ? uv / vv : NAN;
    dsim_check_msg_append(
        d, cap,
        ", whose update is %.3g times the reference's%s. Only part of the "
        "buffer was reduced like the rest: a count, offset or bucket that "
        "treats those parameters apart",
        kf, n > 1 && gc_near(kf, 1.0 / n) ? " (1/replicas: averaged, not summed)" : "");
    return true;
}

/* Says how the run's updates differ from the reference's, from the first
 * step where they do (for traces kept every k steps, the first k steps
 * where they do). True when none does by more than 0.1 %: the difference
 * may be rounding built up over the steps (gc_follow judges). */
static bool gc_diagnose(const dsim_train_result *r, const dsim_train_result *ref, char *d,
                        size_t cap, bool *at_restore, bool *other_cause)
{
    d[0] = '\0';
    *at_restore = false;
    *other_cause = true; /* cleared where the updates differ in size or direction */
    size_t P = r->n_params;
    uint64_t off = r->first_step, T = r->steps;
    uint32_t every = gc_every(r);
    uint64_t rows = gc_rows(r), r0 = off / every;
    if (!r->trace || !r->initial_params || !ref->trace || !ref->initial_params ||
        off + T > ref->steps || T == 0 || rows == 0 || gc_every(ref) != every || off % every != 0 ||
        r0 + rows > gc_rows(ref)) {
        dsim_check_msg(d, cap,
                       "(the variables were not kept step by step alike in the run and the "
                       "reference, so how the updates differ is not measured)");
        *other_cause = false; /* none named */
        return false;
    }
    gc_trace run = {r->initial_params, r->trace, P};
    gc_trace rt = {ref->initial_params, ref->trace, P};
    if (off == 0) {
        for (size_t i = 0; i < P; i++) {
            if (memcmp(&r->initial_params[i], &ref->initial_params[i], sizeof(float)) != 0) {
                char where[200];
                dsim_check_msg(d, cap,
                               "the run started from other variables than the reference "
                               "(parameter %zu%s: %.9g, the reference %.9g): create_variables "
                               "did not give every replica the chief's initial values",
                               i, gc_param_where(r, i, where, sizeof where),
                               (double)r->initial_params[i], (double)ref->initial_params[i]);
                return false;
            }
        }
    }
    int n = r->num_replicas_in_sync > 0 ? r->num_replicas_in_sync : r->num_replicas;
    char at[64];
    for (uint64_t k = 0; k < rows; k++) {
        /* reference row of the same global steps; before a restored run's
         * first step its variables are the restored ones */
        uint64_t kr = r0 + k;
        gc_trace rr = rt;
        if (k == 0 && off > 0) {
            rr.initial = rt.rows + (r0 - 1) * P;
        }
        double uu, uv, vv, dd;
        const gc_trace *rp = k == 0 && off > 0 ? &rr : &rt;
        gc_dots(&run, k, rp, kr, &uu, &uv, &vv, &dd);
        if (vv == 0 && uu == 0)
            continue;
        if (dd <= 1e-6 * vv)
            continue; /* within 0.1 % of the reference's update */
        *at_restore = k == 0 && off > 0;
        uint64_t g = off + k * every;
        gc_steps(at, sizeof at, off, k, every);
        if (uu <= 1e-12 * vv) {
            double uu2, uv2, vv2, dd2;
            if (k + 1 < rows && every == 1) {
                gc_dots(&run, k + 1, rp, kr, &uu2, &uv2, &vv2, &dd2);
                if (dd2 <= 1e-6 * vv) {
                    dsim_check_msg(d, cap,
                                   "the run is stale by one step: it applied no update at "
                                   "global step %" PRIu64 " and at step %" PRIu64
                                   " the reference's update of step %" PRIu64
                                   "; the strategy applies each step's gradient one step late",
                                   g, g + 1, g);
                    return false;
                }
            }
            dsim_check_msg(d, cap,
                           "the run applied no update at %s (the reference moved by %.3g): "
                           "the strategy's apply_gradients left the variables as they were",
                           at, sqrt(vv));
            return false;
        }
        double kf = uv / vv;
        double resid = sqrt(fmax(uu - 2 * kf * uv + kf * kf * vv, 0)) / sqrt(uu);
        *other_cause = false; /* from here on: the update's size or direction, but padding */
        if (resid < 1e-3) {
            const char *why = gc_ratio_meaning(kf, n);
            dsim_check_msg(d, cap,
                           "from %s the run's updates are %.4g times the "
                           "reference's (%d replicas in sync)%s%s",
                           at, kf, n, why ? ": " : "", why ? why : "");
            return false;
        }
        uint64_t pad = 0;
        for (uint64_t st = k * every; r->padded && st < (k + 1) * every && st < T; st++)
            for (int i = 0; i < r->num_replicas; i++)
                pad += r->padded[st * (uint64_t)r->num_replicas + (uint64_t)i];
        if (pad) {
            dsim_check_msg(d, cap,
                           "at %s the run padded %" PRIu64 " rows to "
                           "static batches and its update differs from the reference's on "
                           "the real examples: the padding is not masked out of the loss and "
                           "the gradient (its weight must be 0, as TF's padded examples' "
                           "sample weights are)",
                           at, pad);
            *other_cause = true;
            return false;
        }
        if (gc_ranges(&run, rp, k, kr, n, at, d, cap))
            return false;
        if (n > 1 && fabs(kf - (double)(n - 1) / n) < 0.15 / n)
            dsim_check_msg(d, cap,
                           "at %s the run's update is about %.3g times the "
                           "reference's but not in its direction (%.0f%% off): one of the %d "
                           "replicas' gradients is probably missing from the sum",
                           at, kf, 100 * resid, n);
        else
            dsim_check_msg(d, cap,
                           "at %s the run's update is not a multiple of the "
                           "reference's (best fit %.3g times, %.0f%% off): the reduction "
                           "combines other values than the replicas' gradients",
                           at, kf, 100 * resid);
        return false;
    }
    if (every == 1)
        dsim_check_msg(d, cap,
                       "every step's update is within 0.1%% of the reference's; the difference "
                       "builds up over %" PRIu64 " steps (raise max_rel_error if that is "
                       "expected)",
                       T);
    else
        dsim_check_msg(d, cap,
                       "every %" PRIu32 " steps' update is within 0.1%% of the reference's (the "
                       "variables kept every %" PRIu32 " steps); the difference builds up over "
                       "%" PRIu64 " steps (raise max_rel_error if that is expected)",
                       every, every, T);
    return true;
}

/* Asynchronous parameter servers: what applies to them (see the top). */
static void gc_judge_async(const dsim_train_result *r, const dsim_train_result *ref, double max_rel,
                           double max_abs, dsim_check_result *out)
{
    char *msg = out->message;
    size_t cap = sizeof out->message;
    out->expected = NAN;
    bool finite = true;
    for (size_t i = 0; i < r->n_params && finite; i++)
        finite = isfinite(r->params[i]);
    double info = NAN;
    if (ref && ref->params && ref->n_params == r->n_params) {
        size_t n_out, worst;
        info = gc_rel_beyond_floor(r->params, ref->params, r->n_params, max_abs, max_rel, &n_out,
                                   &worst);
    }
    out->measured = info;
    out->passed = r->replicas_agree && finite;
    dsim_check_msg(msg, cap,
                   "asynchronous parameter servers: replicas compute with the variable versions "
                   "they pulled (max staleness %" PRIu64 "), so per-step bit-identity and equality "
                   "with the one-device reference do not apply; judged: every replica ended with "
                   "the servers' variables (%s) and they are finite (%s); relative distance from "
                   "the reference, for information: %.3g; judge the result with convergence",
                   r->max_staleness, r->replicas_agree ? "yes" : "NO", finite ? "yes" : "NO", info);
}

static dsim_err gc_judge(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    const dsim_train_result *r = ctx->run;
    const dsim_train_result *ref = ctx->reference;
    double max_rel, max_abs;
    gc_tolerances(r, v, &max_rel, &max_abs);
    bool want_bits = v[GC_BIT_IDENTICAL] >= 0.5;
    char *msg = out->message;
    size_t cap = sizeof out->message;

    out->expected = max_rel;
    out->measured = NAN;
    out->passed = false;

    if (!r->params || r->n_params == 0) {
        dsim_check_msg(msg, cap, "the run ended without parameters to compare");
        return DSIM_OK;
    }

    if (gc_is_async_ps(ctx)) {
        gc_judge_async(r, ref, max_rel, max_abs, out);
        return DSIM_OK;
    }

    /* one skip decision and one loss scale per step: a disagreement is
     * what makes the replicas diverge, so it is named first */
    if (!gc_skips_agree(r, msg, cap)) {
        out->measured = INFINITY;
        return DSIM_OK;
    }

    /* bit-identity after every step */
    if (want_bits && !r->in_sync_every_step) {
        uint64_t step = 0;
        int rep = -1, n = 0;
        size_t nr = (size_t)r->num_replicas;
        if (gc_first_divergence(r, &step, &rep, &n)) {
            int d = r->devices_per_host > 0 ? r->devices_per_host : 1;
            char parted[512];
            gc_parted_vars(ctx, step, rep, parted, sizeof parted);
            dsim_check_msg(
                msg, cap,
                "replicas diverged: after global step %" PRIu64 " replica %d (worker %d, "
                "device %d) holds parameters with checksum %016" PRIx64 " but replica 0 "
                "holds %016" PRIx64 " (%d of %d replicas differ)%s; the strategy must apply "
                "the same reduced gradient on every replica",
                r->first_step + step, rep, rep / d, rep % d, r->checksum[step * nr + rep],
                r->checksum[step * nr], n, r->num_replicas, parted);
        } else {
            dsim_check_msg(
                msg, cap,
                "replicas diverged (the run reports a step where their parameters differed, "
                "but it kept no per-step checksums to name it)");
        }
        out->measured = INFINITY;
        return DSIM_OK;
    }
    if (want_bits && !r->replicas_agree) {
        dsim_check_msg(
            msg, cap,
            "replicas were in sync after every step but ended with different parameters: "
            "the strategy's finish() leaves replicas with different variables");
        out->measured = INFINITY;
        return DSIM_OK;
    }

    /* What the strategy reports must be what it was asked to reduce. */
    if (!gc_loss_reduced(r, v[GC_MAX_LOSS_REL], msg, cap, &out->measured))
        return DSIM_OK;

    /* A NaN or infinity compares equal to the reference's when both blew
     * up; consistent garbage is not consistency. */
    for (size_t i = 0; i < r->n_params; i++) {
        if (!isfinite(r->params[i])) {
            char where[200];
            dsim_check_msg(msg, cap,
                           "parameter %zu%s is %g at the end of the run: training diverged "
                           "(lower the learning rate); equality with the reference is not "
                           "judged on non-finite values",
                           i, gc_param_where(r, i, where, sizeof where), (double)r->params[i]);
            out->measured = INFINITY;
            return DSIM_OK;
        }
    }

    /* equality with the one-device reference */
    if (!ref || !ref->params) {
        dsim_check_msg(msg, cap, "no one-device reference run to compare with");
        return DSIM_OK;
    }
    if (ref->n_params != r->n_params) {
        dsim_check_msg(msg, cap, "the run has %zu parameters but the reference has %zu",
                       r->n_params, ref->n_params);
        return DSIM_OK;
    }
    /* A recovered run resumed at first_step: it ends where the reference does. */
    if (ref->first_step + ref->steps != r->first_step + r->steps) {
        dsim_check_msg(msg, cap,
                       "the run took %" PRIu64 " steps but the one-device reference took %" PRIu64
                       " on the same data; the strategy ran a different number of global batches",
                       r->first_step + r->steps, ref->first_step + ref->steps);
        return DSIM_OK;
    }
    dsim_params_diff diff;
    dsim_params_compare(r->params, ref->params, r->n_params, &diff);
    size_t n_out, worst;
    double m =
        gc_rel_beyond_floor(r->params, ref->params, r->n_params, max_abs, max_rel, &n_out, &worst);
    out->measured = m;
    out->passed = n_out == 0;
    const char *bits =
        want_bits ? "replicas bit-identical after every step; " : "bit-identity not required; ";
    char mp[160] = "";
    if (r->precision > DSIM_POLICY_FLOAT32 || r->gradient_dtype != DSIM_F32)
        dsim_check_msg(mp, sizeof mp,
                       "; %s, gradients all-reduced in %s: tolerance %.3g relative beyond %.3g "
                       "absolute; %" PRIu64 " step(s) skipped alike on every replica",
                       dsim_precision_policy_name(r->precision),
                       dsim_precision_dtype_name(r->gradient_dtype), max_rel, max_abs,
                       r->skipped_steps);
    if (out->passed && gc_clip_masked(ctx, r, ref, max_rel, msg, cap, &out->measured)) {
        out->passed = false;
        return DSIM_OK;
    }
    /* a gradient off by a constant factor that the optimizer hid (an
     * adaptive one), or, where the variables differ a little, the cause of
     * that */
    double scale_k = 1.0;
    uint64_t scale_n = 0;
    const dsim_optim_spec *os = &ctx->cfg->optim;
    bool scaled = (out->passed || dsim_optim_is_adaptive(os)) &&
                  gc_grad_scale(r, ref, max_rel, &scale_k, &scale_n);
    if (scaled) {
        const char *meaning = gc_ratio_meaning(scale_k, r->num_replicas);
        char hid[200];
        if (os->kind == DSIM_OPTIM_LION)
            snprintf(hid, sizeof hid,
                     "Lion's update takes only the sign of the gradient (with its momentum), so "
                     "the variables hardly show its scale");
        else if (dsim_optim_is_adaptive(os))
            snprintf(hid, sizeof hid,
                     "%s's update hardly depends on the gradient's scale, so the variables "
                     "show it only where its epsilon counts",
                     ck_optim_title(os));
        else
            snprintf(hid, sizeof hid, "the optimizer's update hid it from the variables");
        char s[600];
        dsim_check_msg(s, sizeof s,
                       "the gradient the strategy applies is %.3g times the one-device "
                       "reference's at every one of the %" PRIu64
                       " steps compared (the norms of replica 0's updates' gradients and the "
                       "reference's)%s%s: %s",
                       scale_k, scale_n, meaning ? ": " : "", meaning ? meaning : "", hid);
        if (out->passed) {
            out->passed = false;
            out->measured = fabs(scale_k - 1.0);
            dsim_check_msg(msg, cap,
                           "the variables agree with the one-device reference within tolerance, "
                           "but %s",
                           s);
            return DSIM_OK;
        }
        gc_msg_differ(msg, cap, r, ref, n_out, worst, m, s);
        return DSIM_OK;
    }
    /* an adaptive optimizer hides more than a constant factor: a part of
     * the gradient scaled apart from the rest moves the variables as the
     * reference's do. Where the run and the reference still stand at the
     * same variables, the gradient's norm must be one device's. */
    uint64_t g0;
    double got0, want0;
    if (out->passed && dsim_optim_is_adaptive(os) && gc_first_grad(r, ref, &g0, &got0, &want0) &&
        fabs(got0 / want0 - 1.0) > max_rel) {
        double k0 = got0 / want0;
        const char *meaning = gc_ratio_meaning(k0, r->num_replicas);
        out->passed = false;
        out->measured = fabs(k0 - 1.0);
        dsim_check_msg(msg, cap,
                       "the variables agree with the one-device reference within tolerance, "
                       "but only because %s's update hardly depends on the gradient's size: at "
                       "global step %" PRIu64 ", where the run and the reference stand at the "
                       "same variables, the gradient replica 0 applied has norm %.6g and one "
                       "device's %.6g (%.4g times it, beyond max_rel_error %.3g)%s%s: the "
                       "strategy computes its gradients wrong (a part of the gradient reduced "
                       "otherwise than the rest, a count or a scale off); under SGD the "
                       "variables would show it",
                       ck_optim_title(os), g0, got0, want0, k0, max_rel, meaning ? ": " : "",
                       meaning ? meaning : "");
        return DSIM_OK;
    }
    if (out->passed) {
        dsim_check_msg(
            msg, cap,
            "%sequal to the one-device reference within tolerance (%zu of %zu parameters "
            "differ in bits; max abs %.3g, max %" PRIu64 " ulps)%s",
            bits, diff.n_diff, r->n_params, diff.max_abs, diff.max_ulps, mp);
    } else {
        char why[900], where[340];
        size_t at = 0;
        why[0] = '\0';
        if (gc_skips_vs_reference(r, ref, why, sizeof why))
            at = strlen(why);
        bool at_restore, other;
        bool drift = gc_diagnose(r, ref, why + at, sizeof why - at, &at_restore, &other) && at == 0;
        /* where the updates differ in size or direction, not where the
         * diagnosis names another cause (a late or missing update, padding,
         * another start) */
        if (!drift && !other && (os->global_clipnorm > 0.0 || os->clipvalue > 0.0))
            dsim_check_msg_append(why, sizeof why,
                                  " (the optimizer clips, %s %g: Keras clips the aggregated "
                                  "gradient in apply_gradients; a clip of each replica's own "
                                  "gradient before the all-reduce, or of a part of it by that "
                                  "part's norm, gives other updates)",
                                  os->global_clipnorm > 0.0 ? "global_clipnorm" : "clipvalue",
                                  os->global_clipnorm > 0.0 ? os->global_clipnorm : os->clipvalue);
        if (at_restore)
            dsim_check_msg_append(why, sizeof why,
                                  " (the first step the run took after restoring the checkpoint "
                                  "of global step %" PRIu64
                                  ": if the steps before the restart were right, the restore "
                                  "is wrong; checkpoint_roundtrip judges it)",
                                  r->first_step);
        /* a model whose one step's variables (and gradients) the harness
         * could not keep */
        if (!r->trace && r->first_step == 0 && at == 0 && !drift &&
            r->n_params > DSIM_CHECK_TRACE_MAX / dsim_check_trace_rows(os)) {
            gc_untraced(r, ref, max_rel, m, worst, os, out);
            return DSIM_OK;
        }
        /* One device replays the run step by step from the run's own
         * variables whether or not its updates drifted from the
         * reference's alike: over many steps a model with kinks (ReLU) or
         * a large learning rate amplifies float rounding until the two
         * trajectories part, and then the reference's updates are not the
         * run's to compare with, though every step is right. */
        gc_followed fo;
        char fwhy[300] = "";
        /* also where the reference skipped other steps than the run (a
         * dynamic loss scale): once the trajectories part, overflow comes
         * at other steps; the replay's decisions, taken at the run's own
         * variables, must be the run's */
        const dsim_train_result *fr = gc_followable(ctx);
        bool followed = fr && gc_follow(ctx, fr, max_rel, &fo, fwhy, sizeof fwhy);
        if (followed && fo.n_bad == 0 && fo.span_bad == 0 && fo.skips_differ == 0) {
            /* rounding built up: every step is right */
            out->passed = true;
            out->measured = fo.worst;
            char where[64], kept[600] = "", judged[1000], who[160], bound[300];
            const char *okind = dsim_optim_kind_name(os->kind);
            gc_grad_who(&fo, r->n_params, who, sizeof who);
            gc_span_bound_words(&fo, bound, sizeof bound);
            if (fo.grads && fo.every > 1)
                dsim_check_msg(judged, sizeof judged,
                               "the gradient %s applied equal to one device's at the "
                               "run's own variables at each of the %" PRIu64
                               " steps compared, the first of every span of %" PRIu32
                               " (worst %.3g relative beyond 2 ulps, at global step %" PRIu64
                               "), and each span's update within %s of one device's "
                               "(worst %.3g of its path; under %s two right replays part "
                               "within a span, as %s turns the rounding of near-zero "
                               "gradients into whole steps",
                               who, fo.rows, fo.every, fo.worst, fo.at * fo.every, bound,
                               fo.span_worst, okind, okind);
            else if (fo.spans_only)
                dsim_check_msg(judged, sizeof judged,
                               "each span's update within %s of one device's from the "
                               "run's own variables (worst %.3g of its path, %" PRIu64
                               " spans of %" PRIu32 " steps replayed; under %s two right "
                               "replays part within a span, as %s turns the rounding of "
                               "near-zero gradients into whole steps, and the run's gradients "
                               "were not kept: its optimizer updates a part of the model without "
                               "saying which, dsim_optim_set_part, so an error of less than half "
                               "a step inside a span is not judged",
                               bound, fo.span_worst, fo.spans, fo.every, okind, okind);
            else if (fo.grads)
                dsim_check_msg(judged, sizeof judged,
                               "the gradient %s applied and its update equal to one "
                               "device's at the run's own variables within tolerance at each "
                               "of the %" PRIu64 " steps compared (worst %.3g and %.3g "
                               "relative beyond 2 ulps, at global step %" PRIu64,
                               who, fo.rows, fo.worst, fo.span_worst, fo.at);
            else
                dsim_check_msg(judged, sizeof judged,
                               "every step's update equal to one device's from the run's own "
                               "variables within tolerance (worst %.3g relative, beyond 2 ulps "
                               "of the variables, at %s; %" PRIu64 " steps replayed",
                               fo.worst, gc_steps(where, sizeof where, 0, fo.at, fo.every),
                               fr->steps);
            if (fo.every > 1 && !fo.grads && !fo.spans_only)
                dsim_check_msg(kept, sizeof kept,
                               "; the variables kept every %" PRIu32 " steps, judged %" PRIu32
                               " steps at a time",
                               fo.every, fo.every);
            if (fo.own_excused)
                dsim_check_msg_append(
                    kept, sizeof kept,
                    "; at %" PRIu64 " of those steps the update is further off one device's, "
                    "but is the one the run's own gradient gives (an optimizer of the same "
                    "kind fed the run's gradients in turn): %s's update turns a gradient's "
                    "rounding into another step where an element's is near zero",
                    fo.own_excused, ck_optim_title(os));
            if (fr != r)
                dsim_check_msg_append(kept, sizeof kept,
                                      "; of the run without faults, which ends bit-identical "
                                      "to this restarted one");
            if (at)
                dsim_check_msg_append(kept, sizeof kept,
                                      "; its loss scale's skips the run's, where the reference's "
                                      "are not");
            dsim_check_msg(
                msg, cap,
                "%s%s%s). The variables end "
                "%.3g (relative) from the one-device reference's, parameter %zu, beyond "
                "max_rel_error: float rounding built up over %" PRIu64 " steps%s, not an error "
                "of the strategy%s",
                bits, judged, kept, m, worst, r->first_step + r->steps,
                drift ? ""
                      : " and amplified until the run's and the reference's trajectories parted "
                        "(their updates differ by more than 0.1 % from some step on, as a "
                        "model with kinks or a large learning rate makes them)",
                mp);
            return DSIM_OK;
        }
        if (followed && (fo.grads || fo.spans_only) && fo.n_bad == 0 && fo.span_bad > 0) {
            char first[64], sat[64], who[160];
            gc_steps(first, sizeof first, 0, fo.span_first, fo.every);
            gc_steps(sat, sizeof sat, 0, fo.span_at, fo.every);
            int n = fo.grads ? snprintf(why + at, sizeof why - at,
                                        "at the run's own variables one device's gradient is the "
                                        "one %s applied at each of the %" PRIu64
                                        " steps compared, but replayed from the run's own "
                                        "variables, ",
                                        gc_grad_who(&fo, r->n_params, who, sizeof who), fo.rows)
                             : snprintf(why + at, sizeof why - at,
                                        "replayed from the run's own variables (its gradients "
                                        "not kept: its optimizer updates a part of the model "
                                        "without saying which, dsim_optim_set_part), ");
            size_t had = at + (n > 0 ? (size_t)n : 0);
            if (had >= sizeof why)
                had = sizeof why - 1;
            /* every step off from the first: the optimizer's state, not its
             * gradient, may be what differs from the start (Adagrad's
             * accumulators, which start at initial_accumulator_value) */
            char slots[300] = "";
            if (fo.span_first == 0 && fo.span_bad == fo.spans && dsim_optim_rule_slots(os) > 0)
                snprintf(slots, sizeof slots,
                         "; or, every step being off from the run's first, the optimizer's "
                         "slots not where the run started them: create_variables must start "
                         "the optimizer from init->optim_state%s",
                         os->kind == DSIM_OPTIM_ADAGRAD
                             ? " (Adagrad's accumulators start at initial_accumulator_value, "
                               "not at 0)"
                             : "");
            if (fo.every == 1)
                dsim_check_msg(why + had, sizeof why - had,
                               "%" PRIu64 " of %" PRIu64 " steps' updates differ from the run's "
                               "beyond max_rel_error %.3g (and 2 ulps of the variables), from "
                               "%s (worst %.3g of the update, at %s): an update that does not "
                               "follow from its gradient (applied twice, or not at all, or "
                               "changed after it)%s",
                               fo.span_bad, fo.spans, max_rel, first, fo.span_worst, sat, slots);
            else
                dsim_check_msg(why + had, sizeof why - had,
                               "%" PRIu64 " of %" PRIu64 " spans of %" PRIu32
                               " steps differ from the run's by more than %s (%.3g of "
                               "their path), from %s (worst %.3g, at %s): a step applied twice "
                               "or not at all, or an update that does not follow from its "
                               "gradient",
                               fo.span_bad, fo.spans, fo.every,
                               isnan(fo.span_part) || !(fo.span_bound > 0.5 / fo.every)
                                   ? "half a step"
                                   : "twice how far two right replays part within a span",
                               fo.span_bound, first, fo.span_worst, sat);
            out->measured = fmax(m, fo.span_worst);
        } else if (followed && fo.grads && fo.n_bad > 0) {
            char who[160];
            /* judged directly by the gradients: under an adaptive optimizer the updates'
             * diagnosis (from the reference's trajectory) is not to be
             * trusted, only what the skips said */
            dsim_check_msg(why + at, sizeof why - at,
                           "at the run's own variables, one device's gradient differs from the "
                           "one %s applied beyond max_rel_error %.3g (and 2 ulps) at %" PRIu64
                           " of the %" PRIu64 " steps compared, from global step %" PRIu64
                           " (worst %.3g of the gradient, at global step %" PRIu64
                           "): the strategy computes its gradients wrong",
                           gc_grad_who(&fo, r->n_params, who, sizeof who), max_rel, fo.n_bad,
                           fo.rows, fo.first * fo.every, fo.worst, fo.at * fo.every);
            size_t P = r->n_params;
            const char *why_k = gc_ratio_meaning(fo.grad_factor, r->num_replicas);
            if (!isnan(fo.grad_factor))
                dsim_check_msg_append(why, sizeof why,
                                      ". At global step %" PRIu64 " it is %.4g times one "
                                      "device's%s%s",
                                      fo.first * fo.every, fo.grad_factor, why_k ? ": " : "",
                                      why_k ? why_k : "");
            else if (fo.off == 0)
                dsim_check_msg_append(why, sizeof why,
                                      ". At global step %" PRIu64 " every element is within 1 %% "
                                      "of one device's: a small error in each (a gradient "
                                      "reduced in a narrower dtype than it is declared in, or "
                                      "a count or scale off by a little)",
                                      fo.first * fo.every);
            else if (fo.off == 1)
                dsim_check_msg_append(why, sizeof why,
                                      ". At global step %" PRIu64 " parameter %" PRIu64
                                      "%s alone is off by more than 1 %%",
                                      fo.first * fo.every, fo.off_lo,
                                      gc_param_where(r, fo.off_lo, where, sizeof where));
            else if (fo.off <= P / 2 && fo.off_hi - fo.off_lo + 1 <= 2 * fo.off)
                /* most of one range: a bucket */
                dsim_check_msg_append(why, sizeof why,
                                      ". At global step %" PRIu64 " %" PRIu64 " of %zu "
                                      "parameters are off by more than 1 %% (from parameter "
                                      "%" PRIu64 " to %" PRIu64 "%s), the others within it: "
                                      "only part of the buffer is reduced like the rest, a "
                                      "count, offset or bucket that treats those parameters "
                                      "apart",
                                      fo.first * fo.every, fo.off, P, fo.off_lo, fo.off_hi,
                                      gc_range_where(r, fo.off_lo, fo.off_hi, where, sizeof where));
            else if (fo.off <= P / 2)
                dsim_check_msg_append(why, sizeof why,
                                      ". At global step %" PRIu64 " %" PRIu64 " of %zu "
                                      "parameters are off by more than 1 %%, scattered from "
                                      "parameter %" PRIu64 " to %" PRIu64 ", the others within it",
                                      fo.first * fo.every, fo.off, P, fo.off_lo, fo.off_hi);
            else
                dsim_check_msg_append(why, sizeof why,
                                      ". At global step %" PRIu64 " %" PRIu64 " of %zu "
                                      "parameters are off by more than 1 %%",
                                      fo.first * fo.every, fo.off, P);
            if (fo.stale_of >= 2 && fo.stale * 10 >= fo.stale_of * 9)
                dsim_check_msg_append(why, sizeof why,
                                      ". At %" PRIu64 " of the %" PRIu64 " later steps beyond "
                                      "tolerance the gradient applied is one device's of the "
                                      "step before (at the run's variables then): each update "
                                      "is applied a step late, stale by one step",
                                      fo.stale, fo.stale_of);
            out->measured = fmax(m, fo.worst);
        } else if (followed && drift) {
            /* (otherwise the diagnosis names what is wrong) */
            char first[64], at[64];
            gc_steps(first, sizeof first, 0, fo.first, fo.every);
            gc_steps(at, sizeof at, 0, fo.at, fo.every);
            if (fo.every == 1)
                dsim_check_msg(why, sizeof why,
                               "replayed on one device from the run's own variables before each "
                               "step, %" PRIu64 " of %" PRIu64 " steps' updates differ from the "
                               "run's beyond max_rel_error %.3g (and 2 ulps of the variables), "
                               "from %s (worst %.3g of the update, at %s): the strategy computes "
                               "its updates wrong, by less than 0.1 %% a step",
                               fo.n_bad, fo.rows, max_rel, first, fo.worst, at);
            else
                dsim_check_msg(why, sizeof why,
                               "replayed on one device from the run's own variables (kept every "
                               "%" PRIu32 " steps), %" PRIu64 " of %" PRIu64 " spans of %" PRIu32
                               " steps differ from the run's beyond max_rel_error %.3g of their "
                               "updates (and 2 ulps of the variables), from %s (worst %.3g, at "
                               "%s): the strategy computes its updates wrong, by less than 0.1 "
                               "%% a step",
                               fo.every, fo.n_bad, fo.rows, fo.every, max_rel, first, fo.worst, at);
            out->measured = fmax(m, fo.worst);
        } else if (!followed && fwhy[0]) {
            dsim_check_msg_append(why, sizeof why, "; %s", fwhy);
        }
        gc_msg_differ(msg, cap, r, ref, n_out, worst, m, why);
    }
    return DSIM_OK;
}

/* gc_judge, and where a run that rounds to a narrow dtype failed under a
 * max_rel_error the scenario set below 16 u of it: that the threshold
 * judges the dtype's own rounding (a float16 all-reduce is a few u off one
 * device's on a right strategy). */
static dsim_err gc_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    dsim_err e = gc_judge(ctx, v, out);
    double u = ctx->run ? dsim_check_narrow_u(ctx->run) : 0;
    if (e == DSIM_OK && !out->passed && u > 0 && !DSIM_CHECK_UNSET(v[GC_MAX_REL]) &&
        v[GC_MAX_REL] < 16 * u && isfinite(out->measured) && out->measured < 16 * u)
        dsim_check_msg_append(out->message, sizeof out->message,
                              " (note: the run rounds to %s, u = %.3g, and the scenario's "
                              "max_rel_error %.3g is below 16 u: a right strategy is that "
                              "rounding off one device's; leave it unset to judge with 16 u)",
                              u == dsim_dtype_unit_roundoff(DSIM_F16) ? "float16" : "bfloat16", u,
                              v[GC_MAX_REL]);
    return e;
}

const dsim_check_ops dsim_check_gradient_consistency = {
    .size = sizeof(dsim_check_ops),
    .name = "gradient_consistency",
    .summary = "replicas bit-identical after every step and equal to a one-device reference",
    .available = true,
    .needs_reference = true,
    .n_params = 4,
    .params =
        {
            {"max_rel_error",
             "largest accepted relative difference from the reference (beyond max_abs_error); "
             "unset: 1e-4, or 16 u of the narrowest dtype under mixed precision",
             0, 1, NAN, false},
            {"max_abs_error",
             "differences from the reference up to this are accepted whatever their relative "
             "size; unset: 1e-6, or u of the narrowest dtype under mixed precision",
             0, 1e30, NAN, false},
            {"bit_identical", "1: every replica must hold the same bits after every step", 0, 1, 1,
             true},
            {"max_loss_rel_error",
             "largest accepted relative difference between the loss the strategy reports (its "
             "SUM-reduce of the local losses) and their sum",
             0, 1, 1e-9, false},
        },
    .run = gc_run,
    .by_default = "every run of a synchronous strategy (all but asynchronous parameter servers)",
};
