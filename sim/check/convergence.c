/* convergence (ARCHITECTURE.md §8): the run's final loss (mean per-example loss over
 * the whole dataset with replica 0's final variables) is under a bound,
 * and/or at most a percentage above the one-device reference's final loss.
 * With both thresholds set both must hold, and the expected value shown is
 * the tighter of the two bounds. With neither set there is nothing to judge:
 * the check fails and says which key to set. */
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
    double ref_final = NAN, ref_bound = NAN;
    if (has_pct) {
        if (!ctx->reference) {
            dsim_check_msg(msg, cap,
                           "within_pct_of_reference is set but no one-device reference was run");
            return DSIM_OK;
        }
        ref_final = ctx->reference->final_loss;
        ref_bound = ref_final * (1 + pct / 100);
    }
    out->expected = has_bound && has_pct ? fmin(bound, ref_bound) : has_bound ? bound : ref_bound;

    if (!isfinite(final)) {
        dsim_check_msg(msg, cap,
                       "the final loss is %g: training diverged (lower optimizer.learning_rate, or "
                       "check the strategy's gradient reduction)",
                       final);
        return DSIM_OK;
    }
    bool ok_bound = !has_bound || final <= bound;
    bool ok_pct = !has_pct || (isfinite(ref_bound) && final <= ref_bound);
    out->passed = ok_bound && ok_pct;

    dsim_check_msg(msg, cap, "final loss %.6g (from %.6g at the start)", final, r->initial_loss);
    if (has_bound)
        dsim_check_msg_append(msg, cap, "; %s max_final_loss %.6g", ok_bound ? "within" : "ABOVE",
                              bound);
    if (has_pct) {
        double above = ref_final != 0 ? 100 * (final - ref_final) / fabs(ref_final) : 0;
        dsim_check_msg_append(msg, cap,
                              "; %.3g%% %s the one-device reference's %.6g (%s the %.3g%% "
                              "allowed)",
                              fabs(above), above >= 0 ? "above" : "below", ref_final,
                              ok_pct ? "within" : "OUTSIDE", pct);
    }
    if (!out->passed)
        dsim_check_msg_append(msg, cap,
                              "; train longer (data.epochs), tune optimizer.learning_rate, or "
                              "relax the threshold");
    return DSIM_OK;
}

const dsim_check_ops dsim_check_convergence = {
    .size = sizeof(dsim_check_ops),
    .name = "convergence",
    .summary = "final loss under a bound, or within a percentage of the reference's",
    .available = true,
    .needs_reference = false,
    .n_params = 2,
    .params =
        {
            {"max_final_loss", "mean per-example loss at the end must be at most this", 0, 1e30,
             NAN, false},
            {"within_pct_of_reference", "final loss at most this % above the reference's", 0, 1e6,
             NAN, false},
        },
    .run = cv_run,
    .wants_reference = cv_wants_reference,
};
