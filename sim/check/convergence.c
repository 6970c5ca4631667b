/* convergence (ARCHITECTURE.md §8): the run's final loss (mean per-example loss over
 * the whole dataset with replica 0's final variables) is under a bound,
 * and/or within a percentage of the one-device reference's final loss, on
 * either side: a run that ends far *below* the same steps on one device did
 * not compute what they compute (a gradient scaled up, steps run twice) as
 * surely as one that ends above. With both thresholds set both must hold,
 * and the expected value shown is the bound the final loss is judged
 * against (the lower one when it ends below the reference's band, else the
 * tighter upper bound). With neither set there is nothing to judge: the
 * check fails and says which key to set. */
#include <math.h>
#include <stdio.h>

#include "check/check_int.h"

enum { CV_MAX_FINAL, CV_WITHIN_PCT };

static bool cv_wants_reference(const double *v)
{
    return !DSIM_CHECK_UNSET(v[CV_WITHIN_PCT]);
}

static dsim_err cv_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    const dsim_train_result *r = ctx->run;
    char *msg = out->message;
    size_t cap = sizeof out->message;
    double bound = v[CV_MAX_FINAL], pct = v[CV_WITHIN_PCT];
    bool has_bound = !DSIM_CHECK_UNSET(bound), has_pct = !DSIM_CHECK_UNSET(pct);
    double final = r->final_loss;

    out->passed = false;
    out->measured = final;
    out->expected = NAN;

    if (!has_bound && !has_pct) {
        dsim_check_msg(
            msg, cap,
            "no threshold to judge the final loss %.6g against (it started at %.6g): set "
            "convergence.max_final_loss and/or convergence.within_pct_of_reference",
            final, r->initial_loss);
        return DSIM_OK;
    }
    double ref_final = NAN, ref_bound = NAN, ref_low = NAN;
    if (has_pct) {
        if (!ctx->reference) {
            dsim_check_msg(msg, cap,
                           "within_pct_of_reference is set but no one-device reference was run");
            return DSIM_OK;
        }
        ref_final = ctx->reference->final_loss;
        ref_bound = ref_final + fabs(ref_final) * pct / 100;
        ref_low = ref_final - fabs(ref_final) * pct / 100;
    }
    out->expected = has_bound && has_pct ? fmin(bound, ref_bound) : has_bound ? bound : ref_bound;
    if (has_pct && isfinite(final) && final < ref_low)
        out->expected = ref_low;

    if (!isfinite(final)) {
        dsim_check_msg(msg, cap,
                       "the final loss is %g: training diverged (lower optimizer.learning_rate, or "
                       "check the strategy's gradient reduction)",
                       final);
        return DSIM_OK;
    }
    bool ok_bound = !has_bound || final <= bound;
    bool ok_pct = !has_pct || (isfinite(ref_bound) && isfinite(ref_low) && final <= ref_bound &&
                               final >= ref_low);
    out->passed = ok_bound && ok_pct;

    dsim_check_msg(msg, cap, "final loss %.6g (from %.6g at the start)", final, r->initial_loss);
    if (has_bound)
        dsim_check_msg_append(msg, cap, "; %s max_final_loss %.6g", ok_bound ? "within" : "ABOVE",
                              bound);
    if (has_pct) {
        double above = ref_final != 0 ? 100 * (final - ref_final) / fabs(ref_final) : 0;
        dsim_check_msg_append(msg, cap,
                              "; %.3g%% %s the one-device reference's %.6g (%s the %.3g%% "
                              "allowed either side)",
                              fabs(above), above >= 0 ? "above" : "below", ref_final,
                              ok_pct ? "within" : "OUTSIDE", pct);
    }
    bool async_ps = ctx->cfg && ctx->cfg->num_ps > 0 && ctx->cfg->ps_mode == DSIM_PS_ASYNC;
    char steps[256];
    if (!out->passed && has_pct && !ok_pct && ok_bound && !async_ps &&
        gc_steps_right(ctx, steps, sizeof steps)) {
        /* A model with kinks (ReLU) or a large learning rate amplifies
         * float rounding until the run's and the reference's trajectories
         * part: their final losses then differ though no step is wrong. */
        out->passed = true;
        dsim_check_msg_append(msg, cap,
                              "; but %s: float rounding, amplified, parted the two "
                              "trajectories; not an error of the strategy",
                              steps);
        return DSIM_OK;
    }
    if (!out->passed && has_pct && !ok_pct && async_ps)
        /* Not a wrong reduction: every replica's gradient is an update of
         * its own, where the replay applies one per global step. */
        dsim_check_msg_append(
            msg, cap,
            "; asynchronous parameter servers apply each replica's gradient as an update of its "
            "own (%d a global step where the one-device replay applies one)%s, so their "
            "result is not the replay's: judge it with max_final_loss",
            r->num_replicas,
            ctx->cfg->optim.kind == DSIM_OPTIM_SGD
                ? ""
                : " and an adaptive or momentum optimizer moves about as far on each as on a "
                  "whole batch's");
    else if (!out->passed && has_pct && !ok_pct && final < ref_low)
        dsim_check_msg_append(msg, cap,
                              "; a run that ends this far below the same steps on one device "
                              "did not compute what they compute: check the strategy's gradient "
                              "reduction (a SUM where a MEAN belongs scales the step up) and "
                              "that no step ran twice");
    else if (!out->passed)
        dsim_check_msg_append(msg, cap,
                              "; train longer (data.epochs), tune optimizer.learning_rate, or "
                              "relax the threshold");
    return DSIM_OK;
}

const dsim_check_ops dsim_check_convergence = {
    .size = sizeof(dsim_check_ops),
    .name = "convergence",
    .summary = "final loss under a bound, and/or within a percentage of the reference's (either "
               "side)",
    .available = true,
    .needs_reference = false,
    .n_params = 2,
    .params =
        {
            {"max_final_loss", "mean per-example loss at the end must be at most this", 0, 1e30,
             NAN, false},
            {"within_pct_of_reference",
             "final loss within this % of the reference's, above or below (two-sided)", 0, 1e6, NAN,
             false},
        },
    .run = cv_run,
    .wants_reference = cv_wants_reference,
};
