/* checkpoint_roundtrip: what the chief saved is what a restart needs, and
 * a restart gets it back. Each of the three ops around a checkpoint is
 * judged on its own and the one that differs is named (ckpt_probe.c):
 *
 * The chief's last checkpoint (cfg->checkpoint_path, at global step G) is
 * the last one of the whole run: written by the last attempt that ran step
 * G (a preemption's, when the attempt after it wrote none). When that
 * attempt had itself resumed from a checkpoint, its restore and the
 * broadcast after it are judged first (a wrong restore makes every later
 * save look wrong). Then the file against the state at save time (save):
 *
 *   - the parameters, bit for bit, with the chief's own variables after
 *     step G (the per-step checksum the driver kept);
 *   - the optimizer's slots and step count with a one-device replay of the
 *     same G global batches (dsim_train_reference, stop_after = G): the
 *     strategy's optimizers are its own, and a synchronous strategy's slots
 *     follow the replay's as its parameters do, within the same tolerance
 *     as gradient_consistency (max_rel_error beyond max_abs_error);
 *
 * then the restored state against the file: a job of no steps restores
 * the file, and what the strategy holds then (its own save()) must be the
 * file's, on every replica (restore, broadcast).
 *
 * A strategy that saves its parameters but not its optimizer's slots (or
 * step) passes every other check: its runs never restore. A restart from
 * such a checkpoint would begin with momentum zero (Adam: bias correction
 * of step 0) and end elsewhere than the uninterrupted run.
 *
 * Synchronous strategies only: asynchronous parameter servers keep no
 * single state at a global step to compare with. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check/check_int.h"

enum { CR_MAX_REL, CR_MAX_ABS };

/* The replica that wrote the checkpoints (the chief): the one that counts
 * writes, else replica 0 (a killed process reports none). */
static int cr_chief(const dsim_train_result *r)
{
    for (int k = 0; r->checkpoint_writes && k < r->num_replicas; k++)
        if (r->checkpoint_writes[k])
            return k;
    return 0;
}

/* The attempt that wrote the checkpoint of global step g: the last that ran
 * step g (its chief's variables after it are recorded), or -1. */
static int cr_writer(const dsim_train_result *const *at, size_t n, uint64_t g)
{
    for (size_t k = n; k-- > 0;) {
        const dsim_train_result *a = at[k];
        if (!a || !a->checksum || g <= a->first_step || g > a->first_step + a->steps)
            continue;
        size_t nr = (size_t)a->num_replicas;
        if (a->checksum[(g - a->first_step - 1) * nr + (size_t)cr_chief(a)])
            return (int)k;
    }
    return -1;
}

/* The restore of ck and the broadcast after it, from a probe job: false,
 * with the sentence in msg, when one of them is wrong. */
static bool cr_restores(const dsim_train_cfg *cfg, const dsim_checkpoint *ck, const ck_tol *tol,
                        const char *which_ck, char *msg, size_t cap)
{
    dsim_train_result probe;
    dsim_err e = ck_probe_restore(cfg, ck, &probe);
    bool ok = true;
    const char *which = NULL;
    if (e != DSIM_OK) {
        dsim_check_msg(msg, cap, "restoring %s failed: %s", which_ck,
                       probe.error.msg[0] ? probe.error.msg : dsim_errmsg());
        ok = false;
    } else if (ck_judge_broadcast(&probe, ck, msg, cap) ||
               ck_judge_restore(&probe, ck, tol->max_abs, tol->max_rel, msg, cap, &which)) {
        ok = false;
    }
    dsim_train_result_free(&probe);
    return ok;
}

/* save: the file ck against the state the job had at its global step G,
 * from the attempt at[k] that wrote it: the chief's parameters bit for bit,
 * then the optimizer against a one-device replay of the same G global
 * batches. True, with the sentence in msg, when save() is wrong. */
static bool cr_save_wrong(const dsim_train_cfg *cfg, const dsim_train_result *w,
                          const dsim_train_result *clean, const dsim_checkpoint *ck,
                          const ck_tol *tol, char *msg, size_t cap, double *measured,
                          bool *followed)
{
    *followed = false;
    uint64_t g = ck->global_step;
    int chief = cr_chief(w);
    uint64_t have = dsim_params_checksum(ck->params, ck->n_params);
    uint64_t live = w->checksum[(g - w->first_step - 1) * (size_t)w->num_replicas + (size_t)chief];
    if (have != live) {
        dsim_check_msg(msg, cap,
                       "save: the parameters saved at global step %" PRIu64
                       " are not those the chief (replica %d) held after that step (checksum "
                       "%016" PRIx64 ", the chief's %016" PRIx64
                       "): save() must copy the variables as of the end of the step",
                       g, chief, have, live);
        return true;
    }
    dsim_train_result ref;
    if (ck_replay_to(cfg, g, &ref) != DSIM_OK) {
        dsim_check_msg(msg, cap, "the one-device replay to step %" PRIu64 " failed: %s", g,
                       ref.error.msg);
        dsim_train_result_free(&ref);
        return true;
    }
    const char *which = NULL;
    bool bad = ck_judge_saved_optimizer(ck, &ref, &cfg->optim, tol, msg, cap, &which, measured);
    dsim_train_result_free(&ref);
    /* The replay's optimizer moved along its own trajectory. Over many
     * steps float rounding, amplified (a model with kinks, a large
     * learning rate), parts it from the run's, and then its slots are not
     * the run's to compare with. Where the writer kept its variables, the
     * replay that follows them (dsim_train_reference_follow: each step's
     * gradient at the run's own variables) decides. A writer that resumed
     * from a checkpoint kept its variables from there only, and one that
     * stopped early (preempted, in a process of its own) may have kept
     * none: the run of the same job without faults stands in for it when
     * it held the same variables after step g. */
    bool clean_same =
        clean && clean->first_step == 0 && clean->checksum && g >= 1 && g <= clean->steps &&
        clean->checksum[(g - 1) * (size_t)clean->num_replicas + (size_t)cr_chief(clean)] == have;
    bool can = bad && ck_follow_to(cfg, w, g, &ref);
    if (bad && !can && clean_same) {
        dsim_train_result_free(&ref);
        can = ck_follow_to(cfg, clean, g, &ref);
    }
    if (can) {
        char m2[1024];
        double meas2 = 0;
        if (!ck_judge_saved_optimizer(ck, &ref, &cfg->optim, tol, m2, sizeof m2, &which, &meas2)) {
            bad = false;
            msg[0] = '\0';
            *measured = meas2;
            *followed = true;
        } else if (ck_slots_started0(ck, &ref, &cfg->optim, tol->max_abs)) {
            /* the replay that follows the run's variables tells slots that
             * started wrong (Adagrad's from 0) from a save that is wrong */
            dsim_check_msg(msg, cap, "%s", m2);
            *measured = meas2;
        }
    }
    dsim_train_result_free(&ref);
    return bad;
}

static dsim_err cr_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    const dsim_train_result *r = ctx->run;
    const dsim_train_cfg *cfg = ctx->cfg;
    const dsim_check_faults *fx = ctx->faults;
    char *msg = out->message;
    size_t cap = sizeof out->message;
    out->passed = false;
    ck_tol tol;
    ck_tolerances(r, v, &tol);
    out->expected = tol.max_rel;
    out->measured = NAN;

    if (!cfg || !cfg->checkpoint_path ||
        (!cfg->checkpoint_every && !cfg->preempt_after && !(fx && fx->n_attempts > 1))) {
        dsim_check_msg(msg, cap,
                       "the scenario writes no checkpoints: give it checkpoint: {path: ..., "
                       "every: N} so that there is something to restore");
        return DSIM_OK;
    }
    if (cfg->num_ps > 0 && cfg->ps_mode == DSIM_PS_ASYNC) {
        dsim_check_msg(msg, cap,
                       "asynchronous parameter servers keep no single state at a global step "
                       "to compare a checkpoint with; checkpoint_roundtrip judges synchronous "
                       "strategies");
        return DSIM_OK;
    }
    /* every attempt of the run: a checkpoint may be an earlier one's */
    const dsim_train_result *only[1] = {r};
    const dsim_train_result *const *at = fx && fx->n_attempts ? fx->attempts : only;
    size_t na = fx && fx->n_attempts ? fx->n_attempts : 1;
    uint64_t written = 0;
    for (size_t k = 0; k < na; k++)
        written += at[k]->checkpoints_written;
    /* No checkpoint was due: every attempt ended before the first one
     * (checkpoint.every past the run's steps) and no preemption asked for
     * one. Nothing to judge, which is no failure of the strategy's. */
    uint64_t reached = 0;
    for (size_t k = 0; k < na; k++)
        if (at[k]->first_step + at[k]->steps > reached)
            reached = at[k]->first_step + at[k]->steps;
    if (!written && cfg->checkpoint_every && reached < cfg->checkpoint_every &&
        !cfg->preempt_after && !cfg->preempt_notice) {
        out->not_judged = true;
        dsim_check_msg(msg, cap,
                       "not judged: no checkpoint was due in this run (%" PRIu64
                       " steps, every %" PRIu64 "); a run of %" PRIu64
                       " steps or more writes one to restore",
                       reached, cfg->checkpoint_every, cfg->checkpoint_every);
        return DSIM_OK;
    }
    dsim_checkpoint *ck = NULL;
    dsim_err e = dsim_checkpoint_read(cfg->checkpoint_path, &ck);
    if (e == DSIM_ENOENT || (!written && na == 1)) {
        dsim_clear_error();
        dsim_check_msg(msg, cap,
                       "no checkpoint was written in this run (%" PRIu64 " steps, every %" PRIu64
                       "): nothing to restore",
                       r->first_step + r->steps, cfg->checkpoint_every);
        dsim_checkpoint_free(ck);
        return DSIM_OK;
    }
    if (e != DSIM_OK) {
        dsim_check_msg(msg, cap, "the chief's checkpoint cannot be restored: %s", dsim_errmsg());
        return DSIM_OK;
    }
    uint64_t g = ck->global_step;
    if (ck->n_params != r->n_params) {
        dsim_check_msg(msg, cap,
                       "the checkpoint holds %zu parameters, the model has %zu: save() filled "
                       "another layout",
                       ck->n_params, r->n_params);
        goto done;
    }
    int k = cr_writer(at, na, g);
    if (k < 0) {
        dsim_check_msg(msg, cap,
                       "the checkpoint at %s is from global step %" PRIu64
                       ", which this run (steps %" PRIu64 "..%" PRIu64
                       ") did not save; was it left by an earlier run?",
                       cfg->checkpoint_path, g, r->first_step + 1, r->first_step + r->steps);
        goto done;
    }
    const dsim_train_result *w = at[k];
    const dsim_train_result *clean = fx ? fx->clean : NULL;
    char where[64] = "";
    if (na > 1)
        snprintf(where, sizeof where, " (written by attempt %d of %zu)", k, na);
    out->measured = INFINITY;
    /* the restore the writer resumed with, and its broadcast: judged first */
    const dsim_checkpoint *from = fx && fx->resumed && w->first_step > 0 ? fx->resumed[k] : NULL;
    if (from) {
        /* the file it resumed from first: a save() that left a part out
         * makes the restore of it look wrong */
        int kf = cr_writer(at, na, from->global_step);
        double ignored = 0;
        bool fol = false;
        if (kf >= 0 && from->n_params == r->n_params &&
            cr_save_wrong(cfg, at[kf], clean, from, &tol, msg, cap, &ignored, &fol))
            goto done;
    }
    if (from && ck_judge_broadcast(w, from, msg, cap))
        goto done;
    if (from && !cr_restores(cfg, from, &tol, "the checkpoint the restart resumed from", msg, cap))
        goto done;

    bool followed = false;
    if (cr_save_wrong(cfg, w, clean, ck, &tol, msg, cap, &out->measured, &followed))
        goto done;
    double rel = out->measured;
    out->measured = INFINITY;
    /* restore and broadcast: what restoring the file gives back */
    if (!cr_restores(cfg, ck, &tol, "the checkpoint", msg, cap))
        goto done;
    out->measured = rel;
    out->passed = true;
    dsim_check_msg(msg, cap,
                   "the chief's checkpoint at global step %" PRIu64
                   "%s holds its parameters bit for bit, the optimizer's step (%" PRIu64
                   ") and its %zu slot values (within tolerance of a one-device replay to that "
                   "step%s%s); restoring it gives them back, on every replica",
                   g, where, ck->optim_step, ck->optim_state_len,
                   followed ? " from the run's own variables: float rounding parted the run "
                              "from the plain replay"
                            : "",
                   tol.scaled ? "; the run rounds to a narrow dtype, so each slot is judged as a "
                                "whole, against its norm"
                              : "");
done:
    dsim_checkpoint_free(ck);
    return DSIM_OK;
}

const dsim_check_ops dsim_check_checkpoint_roundtrip = {
    .size = sizeof(dsim_check_ops),
    .name = "checkpoint_roundtrip",
    .summary = "the chief's last checkpoint holds the state at its step (save), and restoring "
               "it gives that state back (restore) on every replica (broadcast)",
    .available = true,
    .n_params = 2,
    .params =
        {
            {"max_rel_error",
             "largest accepted relative difference of a saved optimizer slot (beyond "
             "max_abs_error); unset: 1e-4, or 16 u of the narrowest dtype under mixed precision, "
             "where each slot (Adam's m, v) is judged as a whole: its distance from the replay's "
             "against its norm",
             0, 1, NAN, false},
            {"max_abs_error",
             "slot differences up to this are accepted whatever their relative size; unset: 1e-6",
             0, 1e30, NAN, false},
        },
    .run = cr_run,
    .by_default = "every run that writes a checkpoint (checkpoint.path with every, or a "
                  "preemption), synchronous strategies",
};
