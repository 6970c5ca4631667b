/* node_loss (ARCHITECTURE.md §7, §8): what a job does when one of its nodes is lost
 * (killed, paused for good, cut off). Judged from the attempt the faults
 * broke and, with recovery, from the attempt that finished:
 *
 *   1. every survivor returned an error, none hung (a survivor that never
 *      returned is named with the phase and step it was stuck in);
 *   2. each did so within the bound: the smaller of max_detect_s and what
 *      the settings guarantee (collective timeout + grace, health check),
 *      plus 2 % and 50 ms for returning from the wait; measured from the
 *      moment the node was lost, or from when the replica entered the phase
 *      it failed in if that was later (it could not have waited before);
 *   3. no survivor applied a partial update: its variables when it returned
 *      are those its last successful create_variables / apply_gradients left
 *      (synchronous strategies; parameter servers keep the variables
 *      elsewhere);
 *   4. the chief's last checkpoint, if one was due, is intact and loadable;
 *   5. with recovery (require_recovery 1 and recovery: restart), the resumed
 *      job ends with the same bits as a clean run of the same job: every
 *      parameter and the step count. When it does not, the message says
 *      which of what a resume replays differs: the variables (not broadcast
 *      after the restore, or not restored), the optimizer state, its step,
 *      or the data position (ckpt_probe.c judges each on its own).
 *
 * And in every attempt, broken or not: no replica returned success from a
 * strategy call in which a collective failed (a strategy that logs and
 * swallows the error trains on with whatever the call left, and may even
 * finish "normally"); the first such call is named with its replica, step
 * and the collective's error.
 *
 * A fault that never broke the job (a pause or partition that healed in
 * time, a kill after the last collective) passes with a message saying the
 * job rode it out. Measured: the slowest survivor's detection time in
 * seconds. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check/check_int.h"
#include "dsim/spi/strategy.h"

enum { NL_MAX_DETECT, NL_REQUIRE_RECOVERY };

/* The settings bound the wait itself; returning from it (the failure check's
 * messages, unwinding, a loaded machine's scheduling) takes a little more.
 * A bound of 3 s that a replica meets in 3.0004 s is met. */
#define NL_SLACK_S    0.05
#define NL_SLACK_FRAC 0.02

/* The ranks lost, as "ranks 2-3 (worker 1)"; "rank R" from the first loss
 * alone when the set is unknown. */
static void nl_lost(const dsim_check_ctx *ctx, const dsim_check_faults *fx, char *buf, size_t cap)
{
    const dsim_train_result *r = fx->broken ? fx->broken : ctx->run;
    int R = r && r->num_replicas > 0 ? r->num_replicas : fx->n_ranks;
    int D = r && r->devices_per_host > 0 ? r->devices_per_host : 1;
    if (fx->lost && fx->n_ranks > 0)
        dsim_check_ranks_text(fx->lost, fx->n_ranks, R, D, buf, cap);
    else if (fx->lost_rank >= 0 && fx->lost_rank < R)
        dsim_check_msg(buf, cap, "rank %d (worker %d)", fx->lost_rank, fx->lost_rank / D);
    else
        dsim_check_msg(buf, cap, "rank %d", fx->lost_rank);
}

static const char *nl_call_of(dsim_phase p)
{
    switch (p) {
    case DSIM_PHASE_CREATE_VARIABLES:
        return "create_variables";
    case DSIM_PHASE_REDUCE_LOSS:
        return "reduce";
    default:
        return "apply_gradients";
    }
}

/* A replica of some attempt returned success from a call in which a
 * collective failed: true, with the sentence in msg. */
static bool nl_swallowed(const dsim_check_ctx *ctx, const dsim_check_faults *fx, char *msg,
                         size_t cap)
{
    const dsim_train_result *only[2] = {fx->broken, ctx->run};
    const dsim_train_result *const *at = fx->n_attempts ? fx->attempts : only;
    size_t na = fx->n_attempts ? fx->n_attempts : 2;
    const dsim_train_replica_end *first = NULL;
    int first_r = -1;
    size_t first_k = 0;
    uint64_t calls = 0;
    for (size_t k = 0; k < na; k++) {
        const dsim_train_result *a = at[k];
        if (!a || !a->replicas || (k + 1 < na && a == at[k + 1]))
            continue;
        for (int r = 0; r < a->num_replicas; r++) {
            const dsim_train_replica_end *e = &a->replicas[r];
            if (!e->swallowed || e->killed)
                continue;
            calls += e->swallowed;
            if (!first) {
                first = e;
                first_r = r;
                first_k = k;
            }
        }
    }
    if (!first)
        return false;
    dsim_check_msg(msg, cap,
                   "replica %d returned success from %s at step %" PRIu64
                   "%s although a collective in it failed: %s (%s); a strategy must return "
                   "a collective's error, not train on with what the call left",
                   first_r, nl_call_of(first->swallowed_phase), first->swallowed_step,
                   na > 1 && fx->n_attempts ? (first_k == 0 ? " of attempt 0" : " of a restart")
                                            : "",
                   first->swallowed_msg[0] ? first->swallowed_msg : "no message",
                   dsim_strerror(first->swallowed_err));
    if (calls > 1)
        dsim_check_msg_append(msg, cap, " (%" PRIu64 " such calls in all)", calls);
    return true;
}

/* The faults never broke the job: why not, in a sentence. */
static void nl_rode_out(const dsim_check_ctx *ctx, const dsim_check_faults *fx, char *msg,
                        size_t cap)
{
    char lost[200];
    nl_lost(ctx, fx, lost, sizeof lost);
    if (fx->lost_rank >= 0 && ctx->run && ctx->run->placement == DSIM_PLACE_SHARDED) {
        const dsim_train_result *r = ctx->run;
        uint64_t reruns = 0;
        int by = -1, takers = 0;
        for (int i = 0; r->replicas && i < r->num_replicas; i++)
            if (r->replicas[i].reruns) {
                reruns += r->replicas[i].reruns;
                takers++;
                if (by < 0)
                    by = i;
            }
        if (reruns)
            dsim_check_msg(msg, cap,
                           "%s lost and the job went on without it, as "
                           "parameter-server training does: %s %d re-ran the %" PRIu64
                           " step(s) it had left (closures re-run, at least once)",
                           lost, takers > 1 ? "replicas from" : "replica", by, reruns);
        else
            dsim_check_msg(msg, cap,
                           "%s lost and the job finished without it, as "
                           "parameter-server training does; the steps it had left were not "
                           "run by anyone (the strategy re-runs no lost work)",
                           lost);
    } else if (fx->lost_rank >= 0)
        dsim_check_msg(msg, cap,
                       "%s lost, but after its last collective: every other replica "
                       "finished normally",
                       lost);
    else
        dsim_check_msg(msg, cap,
                       "the job rode out its faults: no node was lost for good and no "
                       "survivor had to fail");
}

/* How the survivors of the broken attempt ended (1, 2 and 3): the first
 * replica of each kind of trouble, -1 for none. */
typedef struct nl_ends {
    double worst; /* the slowest survivor's detection time, seconds */
    int worst_r, hung, ok_too_late, silent, partial;
} nl_ends;

static void nl_survivors(const dsim_check_faults *fx, const dsim_train_result *b, double bound_s,
                         nl_ends *o)
{
    *o = (nl_ends){0, -1, -1, -1, -1, -1};
    for (int r = 0; r < b->num_replicas; r++) {
        const dsim_train_replica_end *e = &b->replicas[r];
        if (e->killed)
            continue;
        if (e->t_end == 0) {
            if (o->hung < 0)
                o->hung = r;
            continue;
        }
        if (e->status == DSIM_OK) {
            /* It finished: fine if it was done before the loss. */
            if (fx->t_loss >= 0 && e->t_end > fx->t_loss && o->silent < 0)
                o->silent = r;
            continue;
        }
        if (fx->t_loss >= 0) {
            /* From when it could first notice: the loss, or its entering the
             * phase it failed in (a replica computing when the peer died
             * starts waiting for it only then). */
            int64_t from = e->t_phase > fx->t_loss ? e->t_phase : fx->t_loss;
            double d = (double)(e->t_end - from) / 1e9;
            if (d > o->worst) {
                o->worst = d;
                o->worst_r = r;
            }
            if (d > bound_s * (1 + NL_SLACK_FRAC) + NL_SLACK_S && o->ok_too_late < 0)
                o->ok_too_late = r;
        }
        /* 3: no partial update */
        if (b->placement != DSIM_PLACE_SHARDED && e->end_checksum != 0 && e->good_checksum != 0 &&
            e->end_checksum != e->good_checksum && o->partial < 0)
            o->partial = r;
    }
}

/* The checksum of replica r's variables after global step g in a run
 * that completed it: the clean run's, a later attempt's, or else a probe's
 * (the job without faults up to that step, in this process, as
 * ckpt_probe.c runs its own: every engine gives the same bits). False when
 * none could be had. */
static bool nl_completed(const dsim_check_ctx *ctx, const dsim_check_faults *fx, int r, uint64_t g,
                         uint64_t *out)
{
    const dsim_train_result *have[16];
    size_t n = 0;
    if (fx->clean)
        have[n++] = fx->clean;
    for (size_t k = 0; k < fx->n_attempts && n < 16; k++)
        if (fx->attempts[k] && fx->attempts[k] != fx->broken)
            have[n++] = fx->attempts[k];
    for (size_t k = 0; k < n; k++) {
        const dsim_train_result *a = have[k];
        if (a->checksum && r < a->num_replicas && g >= a->first_step &&
            g < a->first_step + a->steps) {
            *out = a->checksum[(g - a->first_step) * (uint64_t)a->num_replicas + (uint64_t)r];
            if (*out)
                return true;
        }
    }
    if (!ctx->cfg)
        return false;
    dsim_train_cfg c;
    ck_probe_cfg(ctx->cfg, g + 1, &c);
    dsim_train_result p;
    bool ok = dsim_train(&c, &p) == DSIM_OK && p.checksum && r < p.num_replicas &&
              g >= p.first_step && g < p.first_step + p.steps;
    if (ok)
        *out = p.checksum[(g - p.first_step) * (uint64_t)p.num_replicas + (uint64_t)r];
    else
        dsim_clear_error();
    dsim_train_result_free(&p);
    return ok && *out;
}

/* 3, for a survivor whose variables changed in the step it failed in: a
 * partial update, or the step's complete update whose distribution failed
 * (a chief that applies the reduced gradient and then broadcasts the
 * variables, as central_storage does: TensorFlow's central variables are
 * updated once the reduction is done, whatever the replicas' next reads
 * do). The latter holds the bits a run that completed the step holds after
 * it. Leaves o->partial at the first survivor whose variables are neither;
 * *complete counts those that held a complete update. */
static void nl_partial(const dsim_check_ctx *ctx, const dsim_check_faults *fx,
                       const dsim_train_result *b, nl_ends *o, int *complete)
{
    *complete = 0;
    int first = o->partial;
    o->partial = -1;
    for (int r = first; r >= 0 && r < b->num_replicas; r++) {
        const dsim_train_replica_end *e = &b->replicas[r];
        if (e->killed || e->t_end == 0 || e->status == DSIM_OK || e->end_checksum == 0 ||
            e->good_checksum == 0 || e->end_checksum == e->good_checksum)
            continue;
        uint64_t want = 0;
        if (nl_completed(ctx, fx, r, e->global_step, &want) && want == e->end_checksum) {
            (*complete)++;
            continue;
        }
        o->partial = r;
        return;
    }
}

/* The data each worker read, over the committed steps, against a clean
 * run's: true when some worker read other examples in some epoch. */
static bool nl_data_differs(const dsim_check_ctx *ctx, const dsim_train_result *fin,
                            const dsim_train_result *clean, char *msg, size_t cap)
{
    if (!fin->ledger || !clean->ledger || !ctx->cfg)
        return false;
    uint64_t n = ctx->cfg->dataset ? ctx->cfg->dataset->spec.n_examples : ctx->cfg->data.n_examples;
    uint32_t *a = calloc(2 * (n ? n : 1), sizeof *a);
    bool differs = false;
    for (uint32_t ep = 0; a && !differs && ep < ctx->cfg->epochs; ep++)
        for (int w = 0; !differs && w < fin->num_workers; w++) {
            if (dsim_ledger_counts(fin->ledger, ep, w, a) != DSIM_OK ||
                dsim_ledger_counts(clean->ledger, ep, w, a + n) != DSIM_OK) {
                dsim_clear_error();
                continue;
            }
            if (memcmp(a, a + n, n * sizeof *a) != 0) {
                differs = true;
                dsim_check_msg(msg, cap,
                               "over the committed steps worker %d read other examples in epoch "
                               "%u than a clean run: the restart resumed the input elsewhere than "
                               "the checkpoint's position",
                               w, ep);
            }
        }
    free(a);
    return differs;
}

/* Why the recovered job ends elsewhere than a clean run: which of what a
 * resume replays differs (the variables, the optimizer state, its step, the
 * data position), each judged on its own; *which names it. */
static void nl_why(const dsim_check_ctx *ctx, const dsim_check_faults *fx, char *why, size_t cap,
                   const char **which)
{
    const dsim_train_result *fin = ctx->run, *clean = fx->clean;
    size_t na = fx->n_attempts;
    const dsim_checkpoint *ck = fx->resumed && na ? fx->resumed[na - 1] : NULL;
    *which = NULL;
    why[0] = '\0';
    if (!ck || ck->n_params != fin->n_params) {
        *which = "data position, optimizer state or step";
        dsim_check_msg(why, cap, "the last restart began afresh, with no checkpoint to compare");
        return;
    }
    uint64_t g = ck->global_step;
    size_t N = (size_t)clean->num_replicas;
    if (clean->checksum && g > clean->first_step && g <= clean->first_step + clean->steps &&
        clean->checksum[(g - clean->first_step - 1) * N] !=
            dsim_params_checksum(ck->params, ck->n_params)) {
        *which = "variables";
        dsim_check_msg(why, cap,
                       "save: the checkpoint of global step %" PRIu64
                       " does not hold the variables a clean run has after that step",
                       g);
        return;
    }
    if (ck_judge_broadcast(fin, ck, why, cap)) {
        *which = "variables not broadcast after the restore";
        return;
    }
    /* checkpoint_roundtrip's default tolerances for this run */
    const double unset[2] = {NAN, NAN};
    ck_tol tol;
    ck_tolerances(ctx->run, unset, &tol);
    dsim_train_result probe;
    if (ck_probe_restore(ctx->cfg, ck, &probe) == DSIM_OK &&
        ck_judge_restore(&probe, ck, tol.max_abs, tol.max_rel, why, cap, which)) {
        dsim_train_result_free(&probe);
        return;
    }
    dsim_train_result_free(&probe);
    dsim_clear_error();
    dsim_train_result ref;
    double measured = 0;
    if (ck_replay_to(ctx->cfg, g, &ref) == DSIM_OK &&
        ck_judge_saved_optimizer(ck, &ref, &ctx->cfg->optim, &tol, why, cap, which, &measured)) {
        dsim_train_result_free(&ref);
        return;
    }
    dsim_train_result_free(&ref);
    dsim_clear_error();
    if (nl_data_differs(ctx, fin, clean, why, cap)) {
        *which = "data position";
        return;
    }
    *which = "data position, optimizer state or step";
    dsim_check_msg(why, cap,
                   "the checkpoint, its restore, the broadcast after it and the data each worker "
                   "read all match a clean run's; the strategy's own state beyond its save() "
                   "must differ");
}

/* 5: the recovered job ends where a clean run does. False with the reason
 * in msg when it does not; else true with the sentence for the verdict in
 * note. */
static bool nl_recovered(const dsim_check_ctx *ctx, const dsim_check_faults *fx, char *msg,
                         size_t cap, char *note, size_t ncap)
{
    const dsim_train_result *fin = ctx->run;
    if (ctx->run_err != DSIM_OK) {
        /* every attempt's error, not the last one's alone: the first is
         * usually the cause, the later ones what it left behind */
        char all[1200] = "";
        size_t u = 0;
        bool ckpt = false;
        for (size_t k = 0; fx->attempts && k < fx->n_attempts && u < sizeof all - 64; k++) {
            const dsim_train_result *a = fx->attempts[k];
            if (!a || !a->error.msg[0])
                continue;
            ckpt = ckpt || strstr(a->error.msg, "checkpoint") != NULL;
            u += (size_t)snprintf(all + u, sizeof all - u, "%sattempt %zu: %s", u ? "; " : "", k,
                                  a->error.msg);
        }
        if (!u)
            snprintf(all, sizeof all, "%s",
                     fin && fin->error.msg[0] ? fin->error.msg : "no message");
        const char *path = ctx->cfg ? ctx->cfg->checkpoint_path : NULL;
        dsim_check_msg(
            msg, cap, "recovery did not finish the job after %d restart(s)%s%s%s: %s", fx->restarts,
            ckpt && path ? " (the checkpoint " : "", ckpt && path ? path : "",
            ckpt && path ? " is involved: every task must read it at that path)" : "", all);
        return false;
    }
    if (ctx->cfg && ctx->cfg->num_ps > 0 && ctx->cfg->ps_mode == DSIM_PS_ASYNC) {
        /* Asynchronous servers apply each push as it comes: the variables
         * depend on the order the pushes arrived, in a clean run as in a
         * resumed one, so bit-identity is not asked of them (as
         * gradient_consistency does not ask it of the run). */
        bool finite = fin && fin->params;
        for (size_t i = 0; finite && i < fin->n_params; i++)
            finite = isfinite(fin->params[i]);
        if (!finite) {
            dsim_check_msg(msg, cap,
                           "the recovered job ended with variables that are not finite after "
                           "%d restart(s)",
                           fx->restarts);
            return false;
        }
        snprintf(note, ncap,
                 "; after %d restart(s) the job finished (asynchronous parameter servers: its "
                 "variables depend on the order of the pushes, so they are not compared with a "
                 "clean run's bit for bit)",
                 fx->restarts);
        return true;
    }
    if (!fx->clean) {
        dsim_check_msg(msg, cap, "no clean run to compare the recovered job with");
        return false;
    }
    if (fin->n_params != fx->clean->n_params ||
        fin->first_step + fin->steps != fx->clean->first_step + fx->clean->steps) {
        dsim_check_msg(msg, cap,
                       "the recovered job ended at global step %llu, the clean run at %llu",
                       (unsigned long long)(fin->first_step + fin->steps),
                       (unsigned long long)(fx->clean->first_step + fx->clean->steps));
        return false;
    }
    dsim_params_diff d;
    dsim_params_compare(fin->params, fx->clean->params, fin->n_params, &d);
    if (d.n_diff > 0) {
        char why[400];
        const char *which = NULL;
        nl_why(ctx, fx, why, sizeof why, &which);
        bool bcast = which && strcmp(which, "variables not broadcast after the restore") == 0;
        dsim_check_msg(msg, cap,
                       "the recovered job ends %zu of %zu parameters away from a clean run "
                       "(max abs %.3g): resuming from the checkpoint did not replay the same "
                       "steps: ",
                       d.n_diff, fin->n_params, d.max_abs);
        if (bcast)
            dsim_check_msg_append(msg, cap, "%s", why);
        else
            dsim_check_msg_append(msg, cap, "the %s differs. %s", which, why);
        return false;
    }
    snprintf(note, ncap,
             "; after %d restart(s) from the checkpoint the job ends bit-identical to a clean "
             "run",
             fx->restarts);
    return true;
}

/* 1 to 3 said: the first trouble among the survivors, or false when there
 * was none. */
static bool nl_trouble(const dsim_check_faults *fx, const dsim_train_result *b, const nl_ends *o,
                       double bound_s, const double *v, const char *lost, char *msg, size_t cap)
{
    if (o->hung >= 0) {
        const dsim_train_replica_end *e = &b->replicas[o->hung];
        dsim_check_msg(msg, cap,
                       "replica %d never returned after %s %s lost (stuck in %s of step "
                       "%llu): a survivor must fail, not wait; set strategy.timeout or the "
                       "health check",
                       o->hung, lost, strstr(lost, "ranks ") == lost ? "were" : "was",
                       dsim_phase_name(e->phase), (unsigned long long)e->global_step);
        return true;
    }
    if (o->ok_too_late >= 0) {
        dsim_check_msg(msg, cap,
                       "replica %d took %.3f s to fail after %s %s lost; the bound is %.3f "
                       "s (%s): lower strategy.timeout or the health check's interval",
                       o->ok_too_late, o->worst, lost,
                       strstr(lost, "ranks ") == lost ? "were" : "was", bound_s,
                       fx->bound_ns > 0 && (double)fx->bound_ns / 1e9 <= v[NL_MAX_DETECT]
                           ? "from the timeout and health-check settings"
                           : "node_loss.max_detect_s");
        return true;
    }
    if (o->partial >= 0) {
        const dsim_train_replica_end *e = &b->replicas[o->partial];
        dsim_check_msg(msg, cap,
                       "replica %d applied a partial update: when it failed (in %s of step "
                       "%llu) its variables were not those its last successful update left; "
                       "the strategy must update only after the whole reduction succeeded",
                       o->partial, dsim_phase_name(e->phase), (unsigned long long)e->global_step);
        return true;
    }
    return false;
}

/* The broken attempt failed before any replica started (a setup error, no
 * hang and no loss): its replicas' ends are as they were made, not stuck. */
static bool nl_none_started(const dsim_check_faults *fx, const dsim_train_result *b)
{
    if (fx->broken_err == DSIM_EHUNG || fx->t_loss >= 0)
        return false;
    for (int r = 0; r < b->num_replicas; r++) {
        const dsim_train_replica_end *e = &b->replicas[r];
        if (e->t_end != 0 || e->t_phase != 0 || e->phase != DSIM_PHASE_START ||
            e->status != DSIM_OK || e->killed)
            return false;
    }
    return true;
}

static dsim_err nl_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    const dsim_check_faults *fx = ctx->faults;
    char *msg = out->message;
    size_t cap = sizeof out->message;
    out->passed = false;
    out->measured = NAN;
    out->expected = v[NL_MAX_DETECT];
    if (!fx || ctx->n_faults == 0) {
        dsim_check_msg(msg, cap,
                       "node_loss needs a fault that loses a node: add to faults: a kill, "
                       "restart, pause or partition");
        return DSIM_OK;
    }
    double bound_s = v[NL_MAX_DETECT];
    if (fx->bound_ns > 0 && (double)fx->bound_ns / 1e9 < bound_s)
        bound_s = (double)fx->bound_ns / 1e9;
    out->expected = bound_s;
    const dsim_train_result *b = fx->broken;
    /* no attempt may have trained on past a failed collective */
    if (nl_swallowed(ctx, fx, msg, cap)) {
        out->measured = NAN;
        return DSIM_OK;
    }
    if (!b && fx->none_touched) {
        out->not_judged = true;
        dsim_check_msg(msg, cap,
                       "not judged: none of the %zu fault(s) fired (the run of %" PRIu64
                       " steps ended before a fault's step or time, or its probability never "
                       "drew), so it shows nothing of node loss: move the faults into the run",
                       ctx->n_faults, ctx->run ? ctx->run->first_step + ctx->run->steps : 0);
        return DSIM_OK;
    }
    if (!b) {
        out->passed = true;
        out->measured = 0;
        nl_rode_out(ctx, fx, msg, cap);
        return DSIM_OK;
    }
    if (fx->none_fired) {
        dsim_check_msg(msg, cap,
                       "the job failed before any of its faults fired, so not because of them: "
                       "%s",
                       b->error.msg[0] ? b->error.msg : dsim_strerror(fx->broken_err));
        return DSIM_OK;
    }
    if (!b->replicas || b->num_replicas <= 0 || nl_none_started(fx, b)) {
        dsim_check_msg(msg, cap, "the broken attempt failed before its replicas started: %s",
                       b->error.msg[0] ? b->error.msg : dsim_strerror(fx->broken_err));
        return DSIM_OK;
    }
    /* 1 and 2: every survivor failed, in time; 3: none applied a partial update */
    nl_ends o;
    nl_survivors(fx, b, bound_s, &o);
    int complete = 0;
    if (o.partial >= 0)
        nl_partial(ctx, fx, b, &o, &complete);
    out->measured = o.worst;
    char lost[200];
    nl_lost(ctx, fx, lost, sizeof lost);
    if (nl_trouble(fx, b, &o, bound_s, v, lost, msg, cap))
        return DSIM_OK;
    /* 4: the checkpoint the loss left behind */
    char ck_note[160] = "";
    if (fx->checkpoint_path) {
        if (fx->ckpt_state < 0) {
            dsim_check_msg(msg, cap, "the chief's last checkpoint is not usable after the loss: %s",
                           fx->ckpt_msg ? fx->ckpt_msg : "unreadable");
            return DSIM_OK;
        }
        if (fx->ckpt_state > 0)
            snprintf(ck_note, sizeof ck_note,
                     "; the checkpoint it left (global step %llu) is intact",
                     (unsigned long long)fx->ckpt_step);
        else
            snprintf(ck_note, sizeof ck_note, "; no checkpoint had been written yet");
    }
    /* 5: recovery */
    char rec_note[200] = "";
    if (v[NL_REQUIRE_RECOVERY] >= 1 && fx->recovery &&
        !nl_recovered(ctx, fx, msg, cap, rec_note, sizeof rec_note))
        return DSIM_OK;
    out->passed = true;
    if (fx->t_loss >= 0 && o.worst_r >= 0)
        dsim_check_msg(msg, cap,
                       "%s lost: every survivor failed within %.3f s (slowest replica %d; "
                       "bound %.3f s), none applied a partial update%s%s%s",
                       lost, o.worst, o.worst_r, bound_s,
                       complete ? " (one held the complete update of the step it failed in, "
                                  "as a run that completed that step holds it: its "
                                  "distribution failed)"
                                : "",
                       ck_note, rec_note);
    else
        dsim_check_msg(msg, cap,
                       "the faults broke the job and every survivor failed cleanly: %s%s%s%s",
                       b->error.msg,
                       complete ? "; a survivor held the complete update of the step it failed "
                                  "in, as a run that completed that step holds it (its "
                                  "distribution failed), not a partial one"
                                : "",
                       ck_note, rec_note);
    return DSIM_OK;
}

const dsim_check_ops dsim_check_node_loss = {
    .size = sizeof(dsim_check_ops),
    .name = "node_loss",
    .summary = "every survivor of a lost node fails fast, nobody hangs, recovery ends equal",
    .available = true,
    .n_params = 2,
    .params =
        {
            {"max_detect_s", "seconds within which every survivor must return an error", 0, 86400,
             40, false},
            {"require_recovery", "1: the resumed run must end equal to a clean run", 0, 1, 1, true},
        },
    .run = nl_run,
    .by_default = "every run of a scenario with faults",
    .judges_failed_runs = true,
};
