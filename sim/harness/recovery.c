/* A job under faults, with BackupAndRestore recovery (ARCHITECTURE.md §7):
 *
 *   [clean run, no faults, no checkpoints]      (when node_loss compares)
 *   attempt 0: faults from the start, no restore
 *   fails and recovery: restart?
 *     attempt k: every worker restarted, restore the chief's last
 *                checkpoint (fresh start if none), redo from there, with
 *                the faults that have not fired yet
 *   until an attempt finishes or max_restarts is spent, or one hangs
 *   (a worker the watchdog left running still holds the old fabric: the
 *   job cannot be restarted, and the run is hung).
 *
 * Checkpoints do not change the numbers a job computes, so the clean run
 * writes none (it must not overwrite the faulty job's backup). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsim/log.h"
#include "engine/engine.h"
#include "fault/msglog.h"
#include "recovery.h"

/* Appends the events fs recorded since the last call (*seen of them were
 * taken already). */
static void rc_events(dsim_recovery_run *r, dsim_faults *fs, int attempt, size_t *seen)
{
    const dsim_fault_event *all = NULL;
    size_t total = dsim_faults_events(fs, &all);
    if (total <= *seen)
        return;
    const dsim_fault_event *ev = all + *seen;
    size_t n = total - *seen;
    *seen = total;
    dsim_fault_event *e = realloc(r->events, (r->n_events + n) * sizeof *e);
    int *a = realloc(r->event_attempt, (r->n_events + n) * sizeof *a);
    if (e)
        r->events = e;
    if (a)
        r->event_attempt = a;
    if (!e || !a)
        return;
    for (size_t i = 0; i < n; i++) {
        r->events[r->n_events] = ev[i];
        r->event_attempt[r->n_events] = attempt;
        r->n_events++;
    }
}

static void rc_stats_delta(dsim_faults_stats *sum, const dsim_faults_stats *now,
                           dsim_faults_stats *prev)
{
    dsim_faults_stats d = {
        .fired = now->fired - prev->fired,
        .frames_seen = now->frames_seen - prev->frames_seen,
        .dropped = now->dropped - prev->dropped,
        .delayed = now->delayed - prev->delayed,
        .duplicated = now->duplicated - prev->duplicated,
        .corrupted = now->corrupted - prev->corrupted,
        .reordered = now->reordered - prev->reordered,
        .held = now->held - prev->held,
        .retransmitted = now->retransmitted - prev->retransmitted,
    };
    dsim_faults_stats_add(sum, &d);
    *prev = *now;
}

/* One attempt of the job on the engine: under the job's fault layer fs
 * (engines in one address space), or with each task's own and done[]
 * saying which faults already fired (updated here). */
typedef struct rc_state {
    const dsim_recovery_opts *o;
    const dsim_engine_ops *eng;
    dsim_faults *fs; /* one address space */
    bool *done;      /* forks: [n_faults] */
    size_t seen;     /* fs: events taken */
    dsim_faults_stats prev;
} rc_state;

/* What fs saw during the attempt. */
static void rc_from_faults(rc_state *st, int attempt, dsim_recovery_run *out)
{
    dsim_faults_stats now;
    dsim_faults_get_stats(st->fs, &now);
    rc_stats_delta(&out->stats, &now, &st->prev);
    rc_events(out, st->fs, attempt, &st->seen);
    if (attempt == 0)
        out->lost_rank = dsim_faults_first_loss(st->fs, &out->t_loss);
}

/* What the tasks reported. */
static void rc_from_tasks(rc_state *st, int attempt, dsim_engine_outcome *po,
                          const dsim_train_result *res, dsim_recovery_run *out)
{
    const dsim_recovery_opts *o = st->o;
    for (size_t i = 0; i < po->n_events; i++) {
        dsim_fault_event *ev = realloc(out->events, (out->n_events + 1) * sizeof *ev);
        int *at = realloc(out->event_attempt, (out->n_events + 1) * sizeof *at);
        if (ev)
            out->events = ev;
        if (at)
            out->event_attempt = at;
        if (!ev || !at)
            break;
        out->events[out->n_events] = po->events[i];
        /* the children's clocks start apart: times from the job's start */
        if (res->t_start)
            out->events[out->n_events].t_ns = po->events[i].t_abs - res->t_start;
        out->event_attempt[out->n_events++] = attempt;
    }
    /* what fired: from the events (a killed process sends no counters) */
    po->stats.fired = 0;
    for (size_t i = 0; st->done && po->fault_fired && i < o->n_faults; i++)
        if (po->fault_fired[i] && !st->done[i]) {
            st->done[i] = true;
            po->stats.fired++;
        }
    if (res->preempted)
        for (size_t i = 0; i < o->n_faults; i++)
            if (o->faults[i].what == DSIM_FAULT_PREEMPT &&
                (uint64_t)o->faults[i].step <= res->preempted_at)
                st->done[i] = true;
    dsim_faults_stats_add(&out->stats, &po->stats);
    if (attempt == 0) {
        out->lost_rank = po->lost_rank;
        out->t_loss = po->t_loss;
    }
    if (po->note[0])
        dsim_warn("%s: %s", st->eng->name, po->note);
    out->crashed = po->crashed;
}

/* An attempt whose every replica was lost did not finish, whatever the
 * engine says: nobody was left to fail (a killed replica reports nothing),
 * so the job must restart, not count as done. */
static dsim_err rc_all_lost(const dsim_train_cfg *c, dsim_train_result *res, dsim_err e)
{
    if (e != DSIM_OK || !res->replicas || res->num_replicas <= 0)
        return e;
    for (int q = 0; q < res->num_replicas; q++)
        if (!res->replicas[q].killed)
            return e;
    /* worded as the processes engine words it (sim/engine/proc_merge.c) */
    int R = res->num_replicas, W = c->hosts;
    char who[96];
    if (R == 1)
        snprintf(who, sizeof who, "rank 0 (worker 0)");
    else if (W <= 1)
        snprintf(who, sizeof who, "ranks 0-%d (worker 0)", R - 1);
    else
        snprintf(who, sizeof who, "ranks 0-%d (workers 0-%d)", R - 1, W - 1);
    res->error = (dsim_error){.code = DSIM_EPEER, .peer = 0, .file = __FILE__, .line = __LINE__};
    snprintf(res->error.msg, sizeof res->error.msg,
             "every replica was lost (%s): nobody was left to finish the job", who);
    return DSIM_EPEER;
}

static dsim_err rc_attempt(rc_state *st, const dsim_train_cfg *c, int attempt,
                           dsim_recovery_run *out, dsim_train_result *res)
{
    const dsim_recovery_opts *o = st->o;
    if (attempt > 0 && o->msgs)
        dsim_msg_log_next_attempt(o->msgs);
    dsim_engine_attempt pa = {.fs = st->fs,
                              .faults = o->faults,
                              .n_faults = o->n_faults,
                              .seed = o->seed,
                              .fault_done = st->done,
                              .hosts = o->hosts,
                              .on_phase = o->on_phase,
                              .on_phase_user = o->on_phase_user,
                              .msgs = o->msgs};
    dsim_engine_outcome po;
    dsim_err e = st->eng->train(c, &pa, res, &po);
    e = rc_all_lost(c, res, e);
    if (st->fs)
        rc_from_faults(st, attempt, out);
    else
        rc_from_tasks(st, attempt, &po, res, out);
    dsim_engine_outcome_free(&po);
    return e;
}

/* The ranks attempt 0 lost for good, however the engine learnt it: the
 * fault layer's (engines in one address space), the replicas that ended
 * killed (a worker's process takes all its replicas), the first loss. */
static void rc_note_lost(dsim_recovery_run *out, const rc_state *st, const dsim_train_cfg *cfg,
                         const dsim_train_result *res)
{
    int n = cfg->hosts * cfg->devices_per_host + cfg->num_ps;
    bool *lost = calloc((size_t)(n > 0 ? n : 1), sizeof *lost);
    if (!lost)
        return;
    int any = 0;
    for (int r = 0; r < n; r++) {
        lost[r] = (st->fs && dsim_faults_rank_lost(st->fs, r)) || r == out->lost_rank ||
                  (res->replicas && r < res->num_replicas && res->replicas[r].killed);
        any += lost[r];
    }
    if (!any) {
        free(lost);
        return;
    }
    out->lost = lost;
    out->n_ranks = n;
}

size_t dsim_recovery_attempt_count(const dsim_recovery_run *r)
{
    return r->has_broken ? r->n_mid + 2 : 1;
}

const dsim_train_result *dsim_recovery_attempt(const dsim_recovery_run *r, size_t k)
{
    size_t n = dsim_recovery_attempt_count(r);
    if (k + 1 == n)
        return &r->final;
    if (k == 0)
        return &r->broken;
    return k - 1 < r->n_mid ? &r->mid[k - 1] : NULL;
}

/* After restarts, the job as BackupAndRestore defines it: each attempt's
 * steps up to the checkpoint the next one resumed from are committed (the
 * next resumed from the state they left), the ones after it are rolled back
 * (the next runs them again); the final attempt's steps are all committed.
 * The final result's ledger becomes the job's, and its initial loss the
 * job's at its very start. */
static void rc_compose(dsim_recovery_run *out, const dsim_train_cfg *cfg)
{
    size_t n = dsim_recovery_attempt_count(out);
    if (n < 2)
        return;
    if (isfinite(out->broken.initial_loss))
        out->final.initial_loss = out->broken.initial_loss;
    /* c[k]: where attempt k's committed steps end (the lowest resume point after it) */
    uint64_t *c = malloc(n * sizeof *c);
    if (!c)
        return;
    c[n - 1] = UINT64_MAX;
    for (size_t k = n - 1; k-- > 0;) {
        uint64_t next = dsim_recovery_attempt(out, k + 1)->first_step;
        c[k] = next < c[k + 1] ? next : c[k + 1];
    }
    uint64_t spe = out->final.steps_per_epoch;
    uint64_t n_ex = cfg->dataset ? cfg->dataset->spec.n_examples : cfg->data.n_examples;
    dsim_ledger *l = NULL;
    dsim_err e = out->final.ledger && spe
                     ? dsim_ledger_create(n_ex, cfg->epochs, cfg->hosts, cfg->devices_per_host, &l)
                     : DSIM_EINVAL;
    for (size_t k = 0; e == DSIM_OK && k < n; k++) {
        const dsim_train_result *a = dsim_recovery_attempt(out, k);
        if (!a->ledger)
            continue;
        uint64_t from = a->first_step, to = c[k] > from ? c[k] : from;
        e = dsim_ledger_copy_steps(l, a->ledger, spe, from, to, false);
        if (e == DSIM_OK && k + 1 < n)
            e = dsim_ledger_copy_steps(l, a->ledger, spe, to, UINT64_MAX, true);
    }
    free(c);
    if (e != DSIM_OK) {
        if (out->final.ledger)
            dsim_warn("recovery: the job's coverage over its attempts could not be put "
                      "together (%s); shard_coverage judges the last attempt alone",
                      dsim_errmsg());
        dsim_clear_error();
        dsim_ledger_destroy(l);
        return;
    }
    dsim_ledger_destroy(out->final.ledger);
    out->final.ledger = l;
    /* the steps run again, as the ledger (and the store's step rows) hold
     * them: a step is run once its batches were read */
    for (uint32_t ep = 0; ep < cfg->epochs; ep++) {
        dsim_coverage cv;
        if (dsim_ledger_coverage(l, ep, -1, 1, &cv) == DSIM_OK)
            out->steps_rolled_back += cv.rolled_back_steps;
        dsim_clear_error();
    }
}

/* Before restart k: the checkpoint it will resume from, as it is now. */
static void rc_note_resume(dsim_recovery_run *out, const dsim_train_cfg *cfg, int k)
{
    dsim_checkpoint **rs = realloc(out->resumed, (size_t)(k + 1) * sizeof *rs);
    if (!rs)
        return;
    out->resumed = rs;
    for (int i = out->n_resumed; i <= k; i++)
        rs[i] = NULL;
    out->n_resumed = k + 1;
    if (cfg->checkpoint_path && dsim_checkpoint_read(cfg->checkpoint_path, &rs[k]) != DSIM_OK) {
        rs[k] = NULL;
        dsim_clear_error();
    }
}

/* Attempts in order: the run's trace is theirs, one after the other. */
static uint64_t rc_fold(uint64_t h, uint64_t attempt)
{
    uint64_t z = (h ^ attempt) + 0x9e3779b97f4a7c15ULL + (h << 6);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

dsim_err dsim_recovery_run_job(const dsim_train_cfg *cfg, const dsim_recovery_opts *o,
                               dsim_recovery_run *out)
{
    memset(out, 0, sizeof *out);
    out->lost_rank = -1;
    out->t_loss = -1;
    if (!cfg || !o)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_recovery_run_job: cfg and options are needed");
    rc_state st = {.o = o, .eng = o->engine};
    if (!st.eng)
        DSIM_CHECK(dsim_engine_find(cfg->engine, &st.eng));
    if (o->want_clean) {
        /* The same job without faults, in this process: the numbers do not
         * depend on the engine. */
        dsim_train_cfg c = *cfg;
        c.checkpoint_path = NULL;
        c.checkpoint_every = 0;
        c.restore = false;
        c.observer = NULL;
        c.hooks = NULL;
        c.transport_filter = NULL;
        /* in this process: a process of its own per worker adds nothing to
         * a clean run; under sim it stays there, deterministic like the rest */
        dsim_engine_attempt here = {.in_process = true};
        dsim_engine_outcome ignored;
        out->clean_err = st.eng->train(&c, &here, &out->clean, &ignored);
        dsim_engine_outcome_free(&ignored);
        out->trace_hash = rc_fold(out->trace_hash, out->clean.trace_hash);
        out->has_clean = true;
    }
    if (!(st.eng->flags & DSIM_ENGINE_ONE_SPACE)) {
        st.done = calloc(o->n_faults ? o->n_faults : 1, sizeof *st.done);
        if (!st.done)
            return DSIM_ERR(DSIM_ENOMEM, -1, "recovery: out of memory");
    } else {
        DSIM_CHECK(dsim_faults_create(o->faults, o->n_faults, o->seed, cfg->hosts,
                                      cfg->devices_per_host, cfg->num_ps, &st.fs));
        dsim_faults_set_msg_log(st.fs, o->msgs);
        if (o->net && dsim_faults_set_network(st.fs, o->net) != DSIM_OK) {
            dsim_error saved;
            dsim_error_copy(&saved);
            dsim_faults_destroy(st.fs);
            return dsim_set_error(saved.code, saved.peer, saved.file, saved.line, "%s", saved.msg);
        }
    }
    if (o->restart && cfg->checkpoint_path && unlink(cfg->checkpoint_path) == 0)
        dsim_info("recovery: removed the old backup %s before the first attempt",
                  cfg->checkpoint_path);
    dsim_train_cfg c = *cfg;
    c.restore = false;
    out->err = rc_attempt(&st, &c, 0, out, &out->final);
    out->trace_hash = rc_fold(out->trace_hash, out->final.trace_hash);
    rc_note_lost(out, &st, cfg, &out->final);
    /* What the broken attempt left: the backup a restart would resume from. */
    out->ckpt_state = 0;
    if (out->err != DSIM_OK && cfg->checkpoint_path) {
        dsim_checkpoint *ck = NULL;
        dsim_err ce = dsim_checkpoint_read(cfg->checkpoint_path, &ck);
        if (ce == DSIM_OK) {
            out->ckpt_state = 1;
            out->ckpt_step = ck->global_step;
            dsim_checkpoint_free(ck);
        } else if (ce != DSIM_ENOENT) {
            out->ckpt_state = -1;
            snprintf(out->ckpt_msg, sizeof out->ckpt_msg, "%s", dsim_errmsg());
        }
        dsim_clear_error();
    }
    /* A hung attempt ends the job: a worker of it is still running (the
     * watchdog left it), holding the fault layer and its fabric, so no
     * worker can be restarted from the checkpoint; the run is `hung`. */
    while (out->err != DSIM_OK && out->err != DSIM_EHUNG && o->restart &&
           out->restarts < o->max_restarts) {
        if (!out->has_broken) {
            out->broken = out->final;
            out->broken_err = out->err;
            out->has_broken = true;
        } else {
            dsim_train_result *m = realloc(out->mid, (out->n_mid + 1) * sizeof *m);
            if (m) {
                out->mid = m;
                out->mid[out->n_mid++] = out->final;
            } else {
                dsim_train_result_free(&out->final);
            }
        }
        memset(&out->final, 0, sizeof out->final);
        out->restarts++;
        rc_note_resume(out, cfg, out->restarts);
        dsim_info("recovery: restart %d of %d: every worker restarts from %s", out->restarts,
                  o->max_restarts, cfg->checkpoint_path ? cfg->checkpoint_path : "the start");
        if (st.fs)
            dsim_faults_rearm_for_restart(st.fs);
        c = *cfg;
        c.restore = cfg->checkpoint_path != NULL;
        out->err = rc_attempt(&st, &c, out->restarts, out, &out->final);
        out->trace_hash = rc_fold(out->trace_hash, out->final.trace_hash);
    }
    rc_compose(out, cfg);
    /* A hung job's workers still run, and its fabric and health thread
     * still call into the fault layer (dsim_train: the transport filter's
     * user data must outlive a hung job): left alive, as the job is. */
    if (out->err != DSIM_EHUNG)
        dsim_faults_destroy(st.fs);
    free(st.done);
    return DSIM_OK;
}

void dsim_recovery_run_free(dsim_recovery_run *r)
{
    if (!r)
        return;
    dsim_train_result_free(&r->final);
    if (r->has_broken)
        dsim_train_result_free(&r->broken);
    if (r->has_clean)
        dsim_train_result_free(&r->clean);
    for (size_t i = 0; i < r->n_mid; i++)
        dsim_train_result_free(&r->mid[i]);
    free(r->mid);
    free(r->lost);
    for (int i = 0; i < r->n_resumed; i++)
        dsim_checkpoint_free(r->resumed[i]);
    free(r->resumed);
    free(r->events);
    free(r->event_attempt);
    memset(r, 0, sizeof *r);
}

void dsim_recovery_print_timeline(const dsim_recovery_run *r, FILE *out)
{
    const dsim_train_result *b = r->has_broken ? &r->broken : &r->final;
    fprintf(out, "\n  TIMELINE (seconds from each attempt's start)\n");
    int attempt = -1;
    for (size_t i = 0; i < r->n_events; i++) {
        if (r->event_attempt[i] != attempt) {
            attempt = r->event_attempt[i];
            fprintf(out, "  attempt %d%s\n", attempt, attempt == 0 ? "" : " (restarted)");
        }
        fprintf(out, "    %9.3f  %s\n", (double)r->events[i].t_ns / 1e9, r->events[i].text);
    }
    if (b->replicas && b->num_replicas > 0) {
        fprintf(out, "  how each replica of attempt 0 ended:\n");
        int D = b->devices_per_host > 0 ? b->devices_per_host : 1;
        for (int q = 0; q < b->num_replicas; q++) {
            const dsim_train_replica_end *e = &b->replicas[q];
            double t = e->t_end ? (double)(e->t_end - b->t_start) / 1e9 : -1;
            if (e->killed) {
                /* the replicas of one worker that went together, once, at the
                 * kill's own place (the event above): not where each was */
                int hi = q;
                while (hi + 1 < b->num_replicas && b->replicas[hi + 1].killed &&
                       (hi + 1) / D == q / D)
                    hi++;
                int fault = -1;
                for (size_t i = 0; i < r->n_events && fault < 0; i++)
                    if (r->event_attempt[i] == 0 && r->events[i].rank >= q &&
                        r->events[i].rank <= hi && strstr(r->events[i].text, " killed"))
                        fault = r->events[i].fault;
                char by[32] = "";
                if (fault >= 0)
                    snprintf(by, sizeof by, " by fault %d", fault);
                if (hi > q)
                    fprintf(out, "    %9.3f  ranks %d-%d (worker %d) lost%s\n", t, q, hi, q / D,
                            by);
                else
                    fprintf(out, "    %9.3f  rank %d (worker %d) lost%s\n", t, q, q / D, by);
                q = hi;
            } else if (!e->t_end)
                fprintf(out, "          ---  replica %d never returned (%s, step %llu)\n", q,
                        dsim_phase_name(e->phase), (unsigned long long)e->global_step);
            else if (e->status != DSIM_OK && r->t_loss >= 0)
                fprintf(out,
                        "    %9.3f  replica %d failed in %s of step %llu, %.3f s after the "
                        "loss: %s\n",
                        t, q, dsim_phase_name(e->phase), (unsigned long long)e->global_step,
                        (double)(e->t_end - r->t_loss) / 1e9, e->msg);
            else if (e->status != DSIM_OK)
                fprintf(out, "    %9.3f  replica %d failed in %s of step %llu: %s\n", t, q,
                        dsim_phase_name(e->phase), (unsigned long long)e->global_step, e->msg);
            else
                fprintf(out, "    %9.3f  replica %d finished\n", t, q);
        }
    }
    if (r->restarts)
        fprintf(out, "  %d restart(s); the last attempt %s\n", r->restarts,
                r->err == DSIM_OK ? "finished" : "failed too");
}
