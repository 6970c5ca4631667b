/* checkpoint_roundtrip: what the chief saved is what a restart needs.
 *
 * After the run, the chief's checkpoint (cfg->checkpoint_path, the last one
 * it wrote, at global step G) is read back the way a restore reads it and
 * compared with the state the job had at G:
 *
 *   - the parameters, bit for bit, with the chief's own variables after
 *     step G (the per-step checksum the driver kept);
 *   - the optimizer's slots and step count with a one-device replay of the
 *     same G global batches (dsim_train_reference, stop_after = G): the
 *     strategy's optimizers are its own, and a synchronous strategy's slots
 *     follow the replay's as its parameters do, within the same tolerance
 *     as gradient_consistency (max_rel_error beyond max_abs_error);
 *   - the step the file says to resume at, against G.
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

/* The replica that wrote the checkpoints (the chief), or -1. */
static int cr_chief(const dsim_train_result *r)
{
    for (int k = 0; r->checkpoint_writes && k < r->num_replicas; k++)
        if (r->checkpoint_writes[k])
            return k;
    return -1;
}

/* The worst slot beyond tolerance: its index, or SIZE_MAX when every slot
 * is within it; *n_out counts them. */
static size_t cr_worst(const float *got, const float *want, size_t n, double max_abs,
                       double max_rel, size_t *n_out, double *rel_out)
{
    size_t worst = SIZE_MAX;
    double wrel = 0;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        double a = got[i], b = want[i];
        double d = fabs(a - b), mag = fmax(fabs(a), fabs(b));
        double rel = mag > 0 ? d / mag : 0;
        if (isnan(a) != isnan(b))
            d = rel = INFINITY;
        if (d <= max_abs || rel <= max_rel)
            continue;
        (*n_out)++;
        if (worst == SIZE_MAX || rel > wrel) {
            worst = i;
            wrel = rel;
        }
    }
    *rel_out = wrel;
    return worst;
}

static dsim_err cr_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    const dsim_train_result *r = ctx->run;
    const dsim_train_cfg *cfg = ctx->cfg;
    double max_rel = v[CR_MAX_REL], max_abs = v[CR_MAX_ABS];
    char *msg = out->message;
    size_t cap = sizeof out->message;
    out->passed = false;
    out->expected = max_rel;
    out->measured = NAN;

    if (!cfg || !cfg->checkpoint_path || !cfg->checkpoint_every) {
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
    int chief = cr_chief(r);
    if (chief < 0 || !r->checkpoints_written) {
        dsim_check_msg(msg, cap,
                       "no checkpoint was written in this run (%" PRIu64 " steps, every %" PRIu64
                       "): nothing to restore",
                       r->steps, cfg->checkpoint_every);
        return DSIM_OK;
    }
    dsim_checkpoint *ck = NULL;
    dsim_err e = dsim_checkpoint_read(cfg->checkpoint_path, &ck);
    if (e != DSIM_OK) {
        dsim_check_msg(msg, cap, "the chief's checkpoint cannot be restored: %s", dsim_errmsg());
        return DSIM_OK;
    }
    uint64_t g = ck->global_step;
    size_t nr = (size_t)r->num_replicas;
    if (ck->n_params != r->n_params) {
        dsim_check_msg(msg, cap,
                       "the checkpoint holds %zu parameters, the model has %zu: save() filled "
                       "another layout",
                       ck->n_params, r->n_params);
        goto done;
    }
    if (g <= r->first_step || g > r->first_step + r->steps || !r->checksum) {
        dsim_check_msg(msg, cap,
                       "the checkpoint at %s is from global step %" PRIu64
                       ", which this run (steps %" PRIu64 "..%" PRIu64
                       ") did not save; was it left by an earlier run?",
                       cfg->checkpoint_path, g, r->first_step + 1, r->first_step + r->steps);
        goto done;
    }

    /* the parameters: the chief's own, bit for bit */
    uint64_t have = dsim_params_checksum(ck->params, ck->n_params);
    uint64_t live = r->checksum[(g - r->first_step - 1) * nr + (size_t)chief];
    if (have != live) {
        dsim_check_msg(msg, cap,
                       "the parameters saved at global step %" PRIu64
                       " are not those the chief (replica %d) held after that step (checksum "
                       "%016" PRIx64 ", the chief's %016" PRIx64
                       "): save() must copy the variables as of the end of the step",
                       g, chief, have, live);
        out->measured = INFINITY;
        goto done;
    }

    /* the optimizer: a one-device replay of the same g global batches */
    dsim_train_cfg rc = *cfg;
    rc.stop_after = g;
    rc.observer = NULL;
    rc.record_params = false;
    rc.checkpoint_path = NULL;
    dsim_train_result ref;
    e = dsim_train_reference(&rc, &ref);
    if (e != DSIM_OK) {
        dsim_check_msg(msg, cap, "the one-device replay to step %" PRIu64 " failed: %s", g,
                       ref.error.msg);
        dsim_train_result_free(&ref);
        goto done;
    }
    if (ck->optim_state_len != ref.optim_state_len) {
        dsim_check_msg(msg, cap,
                       "the checkpoint holds %zu optimizer slot values, the optimizer has %zu",
                       ck->optim_state_len, ref.optim_state_len);
        out->measured = INFINITY;
        dsim_train_result_free(&ref);
        goto done;
    }
    size_t n_out = 0;
    double rel = 0;
    size_t w = ck->optim_state_len ? cr_worst(ck->optim_state, ref.optim_state, ck->optim_state_len,
                                              max_abs, max_rel, &n_out, &rel)
                                   : SIZE_MAX;
    bool step_ok = ck->optim_step == ref.optim_step;
    out->measured = step_ok ? rel : INFINITY;
    out->passed = w == SIZE_MAX && step_ok;
    msg[0] = '\0';
    if (w != SIZE_MAX)
        dsim_check_msg(msg, cap,
                       "%zu of %zu optimizer slot values saved at global step %" PRIu64
                       " differ from the state the optimizer had then; worst: slot value %zu is "
                       "%.9g, it was %.9g. save() must copy the optimizer's slots "
                       "(out->optim_state): restored without them, %s restarts from zero",
                       n_out, ck->optim_state_len, g, w, (double)ck->optim_state[w],
                       (double)ref.optim_state[w],
                       cfg->optim.kind == DSIM_OPTIM_ADAM ? "Adam's moments" : "the momentum");
    if (!step_ok)
        dsim_check_msg_append(msg, cap,
                              "%sthe checkpoint at global step %" PRIu64
                              " says the optimizer applied %" PRIu64 " updates, but %" PRIu64
                              " were applied by then: save() must store the optimizer's step "
                              "(out->optim_step), or a restored Adam restarts its bias "
                              "correction",
                              msg[0] ? "; " : "", g, ck->optim_step, ref.optim_step);
    if (out->passed)
        dsim_check_msg(msg, cap,
                       "the chief's checkpoint at global step %" PRIu64
                       " restores its parameters bit for bit, the optimizer's step (%" PRIu64
                       ") and its %zu slot values (within tolerance of a one-device replay to "
                       "that step)",
                       g, ck->optim_step, ck->optim_state_len);
    dsim_train_result_free(&ref);
done:
    dsim_checkpoint_free(ck);
    return DSIM_OK;
}

const dsim_check_ops dsim_check_checkpoint_roundtrip = {
    .size = sizeof(dsim_check_ops),
    .name = "checkpoint_roundtrip",
    .summary = "the chief's last checkpoint restores the parameters, optimizer slots and step",
    .available = true,
    .n_params = 2,
    .params =
        {
            {"max_rel_error",
             "largest accepted relative difference of a saved optimizer slot (beyond "
             "max_abs_error)",
             0, 1, 1e-4, false},
            {"max_abs_error",
             "slot differences up to this are accepted whatever their relative size", 0, 1e30, 1e-6,
             false},
        },
    .run = cr_run,
};
