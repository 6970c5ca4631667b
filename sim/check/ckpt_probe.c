/* What checkpoint_roundtrip and node_loss share about a checkpoint: which
 * of the three ops around it changed the state, each judged on its own.
 *
 *   save       the file against the state the job had when it was written
 *              (the chief's variables after that step, the optimizer's
 *              slots and step of a one-device replay to it);
 *   restore    what the strategy holds right after it restored the file
 *              (its own save() then, dsim_train_cfg.probe_restore) against
 *              the file: the parameters, the slots, the step;
 *   broadcast  every replica's variables when create_variables returned
 *              against the file's: the chief restores, the others must be
 *              sent what it restored.
 *
 * The restore is probed by a job of no steps that restores the checkpoint
 * (written to a file of its own, so that the job's own backup is never
 * touched), in this process, on threads (or, for many ranks, under the sim
 * runtime): what a strategy does with a checkpoint does not depend on the
 * engine. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check/check_int.h"

/* Above this many ranks the probe runs under the sim runtime. */
#define CK_PROBE_MAX_THREADS 64

/* ck_worst with a floor under each value's size: floor[i] (NULL: none). */
static size_t ck_worst_floor(const float *got, const float *want, size_t n, double max_abs,
                             double max_rel, const float *floor, size_t *n_out, double *rel_out)
{
    size_t worst = SIZE_MAX;
    double wrel = 0;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        double a = got[i], b = want[i];
        double d = fabs(a - b), mag = fmax(fabs(a), fabs(b));
        if (floor)
            mag = fmax(mag, (double)floor[i]);
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

size_t ck_worst(const float *got, const float *want, size_t n, double max_abs, double max_rel,
                size_t *n_out, double *rel_out)
{
    return ck_worst_floor(got, want, n, max_abs, max_rel, NULL, n_out, rel_out);
}

void ck_tolerances(const dsim_train_result *run, const double *v, ck_tol *t)
{
    double u = run ? dsim_check_narrow_u(run) : 0;
    t->max_rel = !DSIM_CHECK_UNSET(v[0]) ? v[0] : u > 0 ? 16 * u : 1e-4;
    t->max_abs = !DSIM_CHECK_UNSET(v[1]) ? v[1] : 1e-6;
    t->scaled = u > 0;
}

/* The floor of each of ref's n_slots * P slot values under tol (NULL when
 * not scaled, or out of memory: then each value is held to its own size):
 * the root mean square of its slot over its variable (ref->vars; the whole
 * model where it has none). */
static float *ck_slot_floor(const dsim_train_result *ref, size_t P, const ck_tol *tol)
{
    size_t len = ref->optim_state_len, nslots = P ? len / P : 0;
    if (!tol->scaled || !nslots || nslots * P != len)
        return NULL;
    float *f = malloc(len * sizeof *f);
    if (!f)
        return NULL;
    size_t nv = ref->n_vars ? ref->n_vars : 1;
    for (size_t s = 0; s < nslots; s++)
        for (size_t k = 0; k < nv; k++) {
            size_t lo = ref->n_vars ? ref->vars[k].off : 0;
            size_t n = ref->n_vars ? ref->vars[k].len : P;
            if (lo > P || n > P - lo)
                continue;
            const float *x = ref->optim_state + s * P + lo;
            double ss = 0;
            for (size_t i = 0; i < n; i++)
                ss += (double)x[i] * (double)x[i];
            float rms = n ? (float)sqrt(ss / (double)n) : 0.0f;
            for (size_t i = 0; i < n; i++)
                f[s * P + lo + i] = rms;
        }
    return f;
}

void ck_probe_cfg(const dsim_train_cfg *cfg, uint64_t steps, dsim_train_cfg *c)
{
    *c = *cfg;
    /* in this process, on one thread per replica; a job of more replicas
     * than threads are cheap for, under the virtual clock */
    int ranks = cfg->hosts * cfg->devices_per_host + cfg->num_ps;
    c->engine = ranks > CK_PROBE_MAX_THREADS ? "sim" : NULL;
    c->transport = NULL;
    c->transport_options = NULL;
    c->checkpoint_path = NULL;
    c->checkpoint_every = 0;
    c->restore = false;
    c->stop_after = steps;
    c->probe_restore = false;
    c->preempt_after = 0;
    c->preempt_notice = NULL;
    c->record_params = false;
    c->observer = NULL;
    c->observer_user = NULL;
    c->hooks = NULL;
    c->hooks_user = NULL;
    c->transport_filter = NULL;
    c->transport_filter_user = NULL;
    c->local_first = 0;
    c->local_count = 0;
}

dsim_err ck_probe_restore(const dsim_train_cfg *cfg, const dsim_checkpoint *ck,
                          dsim_train_result *out)
{
    memset(out, 0, sizeof *out);
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/dsim-restore-probe.XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return DSIM_ERR(DSIM_EIO, -1, "the restore probe could not make a file in %s",
                        dir && *dir ? dir : "/tmp");
    close(fd);
    dsim_err e = dsim_checkpoint_write(path, ck);
    if (e == DSIM_OK) {
        dsim_train_cfg c;
        ck_probe_cfg(cfg, ck->global_step, &c);
        c.checkpoint_path = path;
        c.restore = true;
        c.probe_restore = true;
        e = dsim_train(&c, out);
        if (e == DSIM_OK && !out->has_restored)
            e = DSIM_ERR(DSIM_ESTATE, -1, "the restore probe did not restore %s", path);
    }
    unlink(path);
    return e;
}

/* The replicas whose variables after create_variables are not want. */
static int ck_not_sent(const dsim_train_result *r, uint64_t want, bool *who)
{
    int n = 0;
    for (int q = 0; r->replicas && q < r->num_replicas; q++) {
        who[q] = r->replicas[q].created_checksum != want;
        n += who[q];
    }
    return n;
}

bool ck_judge_broadcast(const dsim_train_result *r, const dsim_checkpoint *ck, char *msg,
                        size_t cap)
{
    if (!r->replicas || r->num_replicas < 2 || ck->n_params != r->n_params)
        return false;
    uint64_t want = dsim_params_checksum(ck->params, ck->n_params);
    bool *who = calloc((size_t)r->num_replicas, sizeof *who);
    if (!who)
        return false;
    int n = ck_not_sent(r, want, who);
    char ranks[160];
    dsim_check_ranks_text(who, r->num_replicas, r->num_replicas, r->devices_per_host, ranks,
                          sizeof ranks);
    free(who);
    if (n == 0 || n == r->num_replicas)
        return false; /* all agree with it, or none restored it (the restore's fault) */
    dsim_check_msg(msg, cap,
                   "variables not broadcast after the restore: after create_variables restored "
                   "the checkpoint of global step %" PRIu64
                   ", %s held other variables than the checkpoint's, which the chief holds: the "
                   "strategy must send the restored variables to every replica (as it does on a "
                   "fresh start)",
                   ck->global_step, ranks);
    return true;
}

bool ck_judge_restore(const dsim_train_result *probe, const dsim_checkpoint *ck, double max_abs,
                      double max_rel, char *msg, size_t cap, const char **which)
{
    *which = NULL;
    if (!probe->has_restored || !probe->restored_params)
        return false;
    uint64_t g = ck->global_step;
    if (dsim_params_checksum(probe->restored_params, ck->n_params) !=
        dsim_params_checksum(ck->params, ck->n_params)) {
        dsim_params_diff d;
        dsim_params_compare(probe->restored_params, ck->params, ck->n_params, &d);
        *which = "parameters";
        dsim_check_msg(msg, cap,
                       "restore: right after restoring the checkpoint of global step %" PRIu64
                       " the chief's variables are not the file's (%zu of %zu differ, max abs "
                       "%.3g): create_variables must take init->params",
                       g, d.n_diff, ck->n_params, d.max_abs);
        return true;
    }
    if (probe->restored_optim_state_len == ck->optim_state_len && ck->optim_state_len) {
        size_t n_out = 0;
        double rel = 0;
        size_t w = ck_worst(probe->restored_optim_state, ck->optim_state, ck->optim_state_len,
                            max_abs, max_rel, &n_out, &rel);
        if (w != SIZE_MAX) {
            *which = "optimizer state";
            dsim_check_msg(msg, cap,
                           "restore: right after restoring the checkpoint of global step %" PRIu64
                           " the optimizer's slots are not the file's (%zu of %zu differ; slot "
                           "value %zu is %.9g, the file's %.9g): create_variables must take "
                           "init->optim_state (the file is right: save() wrote it)",
                           g, n_out, ck->optim_state_len, w, (double)probe->restored_optim_state[w],
                           (double)ck->optim_state[w]);
            return true;
        }
    }
    if (probe->restored_optim_step != ck->optim_step) {
        *which = "step";
        dsim_check_msg(msg, cap,
                       "restore: right after restoring the checkpoint of global step %" PRIu64
                       " the optimizer says it applied %" PRIu64 " updates, the file %" PRIu64
                       ": create_variables must take init->optim_step (the file is right: save() "
                       "wrote it)",
                       g, probe->restored_optim_step, ck->optim_step);
        return true;
    }
    return false;
}

/* Parameter p's nslots slot values in ck against ref: all within
 * tolerance (*ok), all saved as zero (*zero). */
static void ck_slots_of(const dsim_checkpoint *ck, const dsim_train_result *ref, size_t nslots,
                        size_t p, const ck_tol *tol, const float *floor, bool *ok, bool *zero)
{
    size_t n = ck->n_params;
    *ok = *zero = true;
    for (size_t s = 0; s < nslots; s++) {
        size_t n_out = 0, i = s * n + p;
        double rel = 0;
        *ok =
            *ok && ck_worst_floor(ck->optim_state + i, ref->optim_state + i, 1, tol->max_abs,
                                  tol->max_rel, floor ? floor + i : NULL, &n_out, &rel) == SIZE_MAX;
        *zero = *zero && ck->optim_state[i] == 0.0f;
    }
}

bool ck_slots_started0(const dsim_checkpoint *ck, const dsim_train_result *ref,
                       const dsim_optim_spec *os, double max_abs)
{
    const float iav = (float)os->initial_accumulator_value;
    size_t n = ck->n_params;
    bool from0 = os->kind == DSIM_OPTIM_ADAGRAD && iav > 0.0f && n && ck->optim_state_len >= n &&
                 ref->optim_state_len >= n;
    for (size_t p = 0; from0 && p < n; p++) {
        double d = (double)ref->optim_state[p] - (double)ck->optim_state[p] - (double)iav;
        from0 = fabs(d) <= max_abs + 1e-5 * fabs((double)ref->optim_state[p]);
    }
    return from0;
}

/* What the wrong slots of a saved checkpoint look like, appended to msg:
 * all zero (never copied), right for one range of parameters only and zero
 * elsewhere (one replica's shard of a sharded optimizer state), or other
 * values. The slots are nslots arrays of n_params (dsim/optim.h). */
static void ck_saved_slots_why(const dsim_checkpoint *ck, const dsim_train_result *ref,
                               const dsim_optim_spec *os, const ck_tol *tol, const float *floor,
                               char *msg, size_t cap)
{
    const dsim_optim_kind kind = os->kind;
    size_t n = ck->n_params, len = ck->optim_state_len;
    size_t nslots = n ? len / n : 0;
    bool zero = true;
    for (size_t i = 0; i < len; i++)
        zero = zero && ck->optim_state[i] == 0.0f;
    /* per parameter: its slots right, and all saved as zero; the right
     * ones with a value span [lo, hi] */
    bool layout = nslots && nslots * n == len;
    size_t lo = SIZE_MAX, hi = 0;
    for (size_t p = 0; layout && p < n; p++) {
        bool ok, z;
        ck_slots_of(ck, ref, nslots, p, tol, floor, &ok, &z);
        if (ok && !z) {
            lo = lo == SIZE_MAX ? p : lo;
            hi = p;
        }
    }
    /* one shard: right within [lo, hi], zero outside with some of them
     * wrong */
    bool shard = layout && lo != SIZE_MAX && !zero;
    size_t missing = 0;
    for (size_t p = 0; shard && p < n; p++) {
        bool ok, z;
        ck_slots_of(ck, ref, nslots, p, tol, floor, &ok, &z);
        if (p >= lo && p <= hi)
            shard = ok;
        else {
            shard = z;
            missing += !ok;
        }
    }
    shard = shard && missing > 0;
    const char *what = kind == DSIM_OPTIM_ADAM       ? "Adam's moments"
                       : kind == DSIM_OPTIM_ADAMAX   ? "Adamax's moment and norm"
                       : kind == DSIM_OPTIM_LAMB     ? "LAMB's moments"
                       : kind == DSIM_OPTIM_NADAM    ? "Nadam's moments"
                       : kind == DSIM_OPTIM_ADADELTA ? "Adadelta's accumulators"
                       : kind == DSIM_OPTIM_RMSPROP  ? "RMSprop's averages"
                       : kind == DSIM_OPTIM_ADAGRAD  ? "Adagrad's accumulators"
                       : kind == DSIM_OPTIM_LION     ? "Lion's momentum"
                                                     : "the momentum";
    const char *verb_s = kind == DSIM_OPTIM_MOMENTUM || kind == DSIM_OPTIM_SGD ? "s" : "";
    const float iav = (float)os->initial_accumulator_value;
    if (!zero && ck_slots_started0(ck, ref, os, tol->max_abs)) {
        dsim_check_msg_append(msg, cap,
                              "The saved accumulators are the one-device replay's less "
                              "initial_accumulator_value (%g) at every parameter: save() copied "
                              "them, but they started at 0: create_variables must start the "
                              "optimizer from init->optim_state (Adagrad's accumulators start "
                              "at %g)",
                              (double)iav, (double)iav);
    } else if (zero) {
        dsim_check_msg_append(msg, cap,
                              "save() must copy the optimizer's slots (out->optim_state): "
                              "restored without them, %s restart%s from zero",
                              what, verb_s);
    } else if (shard) {
        dsim_check_msg_append(msg, cap,
                              "Only the slots of parameters %zu..%zu (%zu of %zu) were saved, "
                              "the rest are zero: a sharded optimizer state (ZeRO) whose chief "
                              "wrote its own shard. save() runs on every replica: gather every "
                              "shard into the chief's out->optim_state",
                              lo, hi, hi - lo + 1, n);
    } else {
        dsim_check_msg_append(msg, cap,
                              "save() must copy the optimizer's slots as they stand after the "
                              "step (out->optim_state, in the layout of dsim/optim.h): restored "
                              "from these, %s resume%s from other values",
                              what, verb_s);
    }
}

bool ck_judge_saved_optimizer(const dsim_checkpoint *ck, const dsim_train_result *ref,
                              const dsim_optim_spec *os, const ck_tol *tol, char *msg, size_t cap,
                              const char **which, double *measured)
{
    *which = NULL;
    uint64_t g = ck->global_step;
    if (ck->optim_state_len != ref->optim_state_len) {
        *which = "optimizer state";
        *measured = INFINITY;
        dsim_check_msg(msg, cap,
                       "save: the checkpoint holds %zu optimizer slot values, the optimizer has "
                       "%zu",
                       ck->optim_state_len, ref->optim_state_len);
        return true;
    }
    size_t n_out = 0;
    double rel = 0;
    float *floor = ck_slot_floor(ref, ck->n_params, tol);
    size_t w = ck->optim_state_len
                   ? ck_worst_floor(ck->optim_state, ref->optim_state, ck->optim_state_len,
                                    tol->max_abs, tol->max_rel, floor, &n_out, &rel)
                   : SIZE_MAX;
    /* a narrow dtype: each slot judged as a whole, its distance from the
     * replay's against max_rel of its norm (an element of a gradient that
     * cancels between replicas rounds at the replicas' parts' size, not
     * its own or its neighbours') */
    size_t P = ck->n_params, ns = P && ck->optim_state_len % P == 0 ? ck->optim_state_len / P : 1;
    size_t span = ns > 1 ? P : ck->optim_state_len, ws = 0;
    double nrel = 0;
    for (size_t k = 0; tol->scaled && k < ns && span; k++) {
        double dd = 0, rr = 0;
        for (size_t i = k * span; i < (k + 1) * span; i++) {
            double a = ck->optim_state[i], b = ref->optim_state[i];
            /* equal values (infinities, NaN where both are) add nothing;
             * NaN where one is, an infinite distance */
            double d = a == b || (isnan(a) && isnan(b)) ? 0 : a - b;
            dd += isnan(d) || isinf(d) ? INFINITY : d * d;
            rr += isfinite(b) ? b * b : 0;
        }
        double kr = rr > 0 ? sqrt(dd / rr) : dd > 0 ? INFINITY : 0;
        if (isnan(kr))
            kr = INFINITY;
        if (kr > nrel) {
            nrel = kr;
            ws = k;
        }
    }
    if (tol->scaled) {
        rel = nrel;
        if (nrel <= tol->max_rel) {
            w = SIZE_MAX;
            n_out = 0;
        } else if (w == SIZE_MAX) {
            /* beyond it as a whole though no value is beyond its floor:
             * the value of that slot farthest from the replay's */
            double far = -1;
            for (size_t i = ws * span; i < (ws + 1) * span; i++) {
                double d = fabs((double)ck->optim_state[i] - (double)ref->optim_state[i]);
                if (!(d <= far)) {
                    far = d;
                    w = i;
                }
            }
            n_out = 1;
        }
    }
    bool step_ok = ck->optim_step == ref->optim_step;
    *measured = step_ok ? rel : INFINITY;
    msg[0] = '\0';
    if (w != SIZE_MAX) {
        *which = "optimizer state";
        /* the slot and the parameter it belongs to, where the layout says */
        char slot[240] = "", where[200] = "";
        if (P && ck->optim_state_len == dsim_optim_slots_per_param(os) * P) {
            dsim_model_var_where(ref->vars, ref->n_vars, w % P, where, sizeof where);
            snprintf(slot, sizeof slot, " (%s's %s of parameter %zu%s%s)", ck_optim_title(os),
                     dsim_optim_slot_name(os, w / P), w % P, where[0] ? ", " : "", where);
        }
        dsim_check_msg(msg, cap,
                       "save: %zu of %zu optimizer slot values saved at global step %" PRIu64
                       " differ from the state the optimizer had then; worst: slot value %zu%s "
                       "is %.9g, it was %.9g. ",
                       n_out, ck->optim_state_len, g, w, slot, (double)ck->optim_state[w],
                       (double)ref->optim_state[w]);
        if (tol->scaled)
            dsim_check_msg_append(msg, cap,
                                  "Under a narrow dtype each slot is judged as a whole: the "
                                  "worst is %.3g of its norm from the replay's (beyond %.3g). ",
                                  nrel, tol->max_rel);
        ck_saved_slots_why(ck, ref, os, tol, floor, msg, cap);
    }
    free(floor);
    if (!step_ok) {
        if (!*which)
            *which = "step";
        dsim_check_msg_append(msg, cap,
                              "%ssave: the checkpoint at global step %" PRIu64
                              " says the optimizer applied %" PRIu64 " updates, but %" PRIu64
                              " were applied by then: save() must store the optimizer's step "
                              "(out->optim_step), or a restored Adam restarts its bias "
                              "correction",
                              msg[0] ? "; " : "", g, ck->optim_step, ref->optim_step);
    }
    return *which != NULL;
}

/* A one-device replay's configuration: cfg's first g global steps. */
static void ck_replay_cfg(const dsim_train_cfg *cfg, uint64_t g, dsim_train_cfg *rc)
{
    *rc = *cfg;
    rc->stop_after = g;
    rc->observer = NULL;
    rc->record_params = false;
    rc->checkpoint_path = NULL;
}

dsim_err ck_replay_to(const dsim_train_cfg *cfg, uint64_t g, dsim_train_result *ref)
{
    dsim_train_cfg rc;
    ck_replay_cfg(cfg, g, &rc);
    return dsim_train_reference(&rc, ref);
}

bool ck_follow_to(const dsim_train_cfg *cfg, const dsim_train_result *w, uint64_t g,
                  dsim_train_result *ref)
{
    memset(ref, 0, sizeof *ref);
    uint32_t every = w->trace_every > 1 ? w->trace_every : 1;
    uint64_t rows = w->trace_rows ? w->trace_rows : w->steps / every;
    if (!w->trace || rows == 0 || w->first_step != 0)
        return false;
    dsim_train_cfg rc;
    ck_replay_cfg(cfg, g, &rc);
    rc.trace_every = every;
    if (dsim_train_reference_follow(&rc, w->trace, rows, ref) != DSIM_OK) {
        dsim_clear_error();
        return false;
    }
    return ref->steps == g;
}
