/* The fault layer as the driver's hooks (dsim_train_hooks): every replica
 * entering every phase goes through the faults not done yet, each kind's
 * phase handler (kinds.c) deciding whether it fires there (a step, a phase
 * [after N frames], a time, a probability) and what it does: kill,
 * restart (its revocation comes later, from held.c's worker), pause
 * (sleep), slow, stagger; link faults start here too. Then the replica
 * sleeps what they decided, or dies. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_int.h"

void fs_fire_locked(dsim_faults *fs, size_t i, int64_t now)
{
    fs_state *st = &fs->st[i];
    st->fired = true;
    st->t_fire = now;
    fs->stats.fired++;
}

void fs_lost_locked(dsim_faults *fs, int rank, int64_t now)
{
    if (fs->t_loss < 0) {
        fs->t_loss = now;
        fs->lost_rank = rank;
        fs->loss_unreported = true; /* the event that follows carries it */
    }
}

void fs_kill_locked(dsim_faults *fs, size_t i, int rank, int64_t now, const char *how)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    fs_lost_locked(fs, rank, now);
    if (!st->fired)
        fs_fire_locked(fs, i, now);
    /* A worker is one process: all its devices go with it (a worker: kill,
     * or any kill where each worker is a process of its own). */
    int w = rank < fs->N ? rank / fs->D : -1;
    bool whole = w >= 0 && (f->worker >= 0 || fs->proc.on_kill);
    int lo = whole ? w * fs->D : rank;
    int hi = whole ? lo + fs->D : rank + 1;
    /* One event for the kill, at the one place it happened: where the
     * rank that triggered it was (its peers in the process were elsewhere,
     * but they went at the same instant). */
    char who[96], where[96];
    if (rank >= fs->N)
        snprintf(who, sizeof who, "parameter server %d (rank %d)", rank - fs->N, rank);
    else if (hi - lo > 1)
        snprintf(who, sizeof who, "worker %d (ranks %d-%d)", w, lo, hi - 1);
    else
        snprintf(who, sizeof who, "rank %d", rank);
    if (rank >= fs->N)
        snprintf(where, sizeof where, "while serving");
    else
        snprintf(where, sizeof where, "%s %s of step %" PRIu64,
                 strcmp(how, "at its trigger") == 0 ? "at" : "in",
                 dsim_phase_name((dsim_phase)fs->phase[rank]), fs->step[rank]);
    bool any = false;
    for (int r = lo; r < hi; r++)
        any |= !fs->dead[r];
    char trig[48] = "";
    if (hi - lo > 1)
        snprintf(trig, sizeof trig, ", on rank %d", rank);
    if (any)
        fs_event_locked(fs, (int)i, rank, now, "fault %zu: %s %s %s (%s%s)", i, who,
                        f->what == DSIM_FAULT_RESTART ? "killed, to restart," : "killed", where,
                        how, trig);
    for (int r = lo; r < hi; r++) {
        if (fs->dead[r])
            continue;
        fs->dead[r] = true;
        if (fs->proc.on_kill && fs->n_pending_kill < 8)
            fs->pending_kill[fs->n_pending_kill++] = r;
        if (f->what == DSIM_FAULT_RESTART) {
            fs_timer *t = realloc(fs->timers, (fs->n_timers + 1) * sizeof *t);
            if (t) {
                fs->timers = t;
                fs->timers[fs->n_timers++] =
                    (fs_timer){.due = now + f->duration_ns, .rank = r, .pending = true};
                dsim_waitq_wake(fs->q);
            }
        }
    }
}

/* Does replica-level fault i trigger for replica r entering phase p at gs? */
bool fs_triggers_locked(dsim_faults *fs, size_t i, int r, dsim_phase p, uint64_t gs, int64_t now)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    if (!st->victim[r])
        return false;
    switch (f->when) {
    case DSIM_WHEN_STEP:
        return p == DSIM_PHASE_COMPUTE && gs == (uint64_t)f->step;
    case DSIM_WHEN_PHASE: {
        dsim_phase want;
        if (dsim_phase_parse(f->phase, &want) != DSIM_OK) {
            dsim_clear_error();
            return false;
        }
        return p == want && (f->step < 0 || gs == (uint64_t)f->step);
    }
    case DSIM_WHEN_TIME:
        return now - fs->t0 >= f->time_ns;
    case DSIM_WHEN_PROBABILITY: {
        if (p != DSIM_PHASE_COMPUTE)
            return false;
        fs_link *l = fs_link_get(fs, r, r);
        return l && fs_draw(fs, l, r, r, f->correlation) < f->probability;
    }
    }
    return false;
}

/* Sleeps the calling replica until `until` or until the job is revoked.
 * Returns true if it woke because the job was revoked. Unlocked. */
static bool fs_sleep(dsim_faults *fs, int64_t until)
{
    while (dsim_rt_now(fs->rt) < until) {
        if (fs->fab && dsim_fabric_aborted(fs->fab))
            return true;
        int64_t t = dsim_rt_now(fs->rt) + FS_POLL_NS;
        dsim_rt_sleep_until(fs->rt, t < until ? t : until);
    }
    return false;
}

static const char *const fs_fiu_phase[DSIM_PHASE_COUNT] = {
    [DSIM_PHASE_START] = "dsim/phase/start",
    [DSIM_PHASE_RENDEZVOUS] = "dsim/phase/rendezvous",
    [DSIM_PHASE_RESTORE] = "dsim/phase/restore",
    [DSIM_PHASE_CREATE_VARIABLES] = "dsim/phase/create_variables",
    [DSIM_PHASE_COMPUTE] = "dsim/phase/compute",
    [DSIM_PHASE_ALLREDUCE] = "dsim/coll/allreduce",
    [DSIM_PHASE_REDUCE_LOSS] = "dsim/phase/reduce_loss",
    [DSIM_PHASE_CHECKPOINT] = "dsim/phase/checkpoint",
    [DSIM_PHASE_FINISH] = "dsim/phase/finish",
    [DSIM_PHASE_DONE] = "dsim/phase/done",
};

/* A replica that waited at the start of its compute (a pause) computes
 * from when it went on: a slow fault stretches the compute, not the pause
 * (a pause of 1.4 s on a rank slowed 4x lasted 5.6 s). Unlocked. */
static void fs_compute_from(dsim_faults *fs, const fs_enter *e, int64_t t)
{
    if (e->p != DSIM_PHASE_COMPUTE)
        return;
    dsim_waitq_lock(fs->q);
    fs->t_compute[e->r] = t;
    dsim_waitq_unlock(fs->q);
}

/* After the faults decided (unlocked): a paused replica waits for its pause
 * to end (a process is stopped by the process hooks), a slowed one for its
 * extra compute time, a staggered one for its start. */
static dsim_hook_action fs_phase_wait(dsim_faults *fs, const fs_enter *e, bool pause)
{
    int r = e->r;
    int64_t now = e->now, sleep_until = e->sleep_until;
    if (pause && fs->proc.on_pause) {
        /* a process pauses as a whole (SIGSTOP), its peers see silence */
        fs->proc.on_pause(fs->proc.user, r,
                          fs->pause_end[r] == FS_FOREVER ? 0 : fs->pause_end[r] - now);
        dsim_waitq_lock(fs->q);
        fs->pause_end[r] = 0;
        dsim_waitq_unlock(fs->q);
        pause = false;
        sleep_until = e->slow_ns > 0 ? now + e->slow_ns : 0;
        now = dsim_rt_now(fs->rt);
        fs_compute_from(fs, e, now);
    }
    if (e->slow_ns > 0)
        sleep_until = sleep_until > now + e->slow_ns ? sleep_until : now + e->slow_ns;
    if (sleep_until <= now)
        return DSIM_HOOK_GO;
    bool revoked = fs_sleep(fs, sleep_until);
    if (!revoked)
        fs_compute_from(fs, e, dsim_rt_now(fs->rt));
    if (!pause)
        return DSIM_HOOK_GO;
    dsim_waitq_lock(fs->q);
    int64_t t = dsim_rt_now(fs->rt);
    if (revoked) {
        /* The job gave up on it while it was stuck: as good as dead. */
        fs->dead[r] = true;
        fs_event_locked(fs, -1, r, t, "rank %d was still paused when the job was revoked", r);
        dsim_waitq_unlock(fs->q);
        return DSIM_HOOK_DIE;
    }
    fs->pause_end[r] = 0;
    fs_release_locked(fs, t, r, -1);
    fs_event_locked(fs, -1, r, t, "rank %d resumed", r);
    dsim_waitq_unlock(fs->q);
    return DSIM_HOOK_GO;
}

static dsim_hook_action fs_phase_own(dsim_faults *fs, int r, dsim_phase p, uint64_t gs)
{
    if (r < 0 || r >= fs->N || !fs->q)
        return DSIM_HOOK_GO;
    (void)fs_fiu_phase;
    if ((int)p >= 0 && p < DSIM_PHASE_COUNT && FS_FIU(fs_fiu_phase[p])) {
        dsim_waitq_lock(fs->q);
        fs->dead[r] = true;
        fs_event_locked(fs, -1, r, dsim_rt_now(fs->rt), "libfiu point %s killed rank %d",
                        fs_fiu_phase[p], r);
        dsim_waitq_unlock(fs->q);
        return DSIM_HOOK_DIE;
    }
    dsim_waitq_lock(fs->q);
    fs_enter e = {.r = r, .p = p, .gs = gs, .now = dsim_rt_now(fs->rt), .prev = fs->phase[r]};
    fs->phase[r] = (int)p;
    fs->step[r] = gs;
    if (fs->dead[r]) {
        dsim_waitq_unlock(fs->q);
        return DSIM_HOOK_DIE;
    }
    for (size_t i = 0; i < fs->n; i++) {
        const fs_kind *k = fs->st[i].kind;
        if (!fs->st[i].done && k->on_phase)
            k->on_phase(fs, i, &e);
    }
    if (p == DSIM_PHASE_COMPUTE)
        fs->t_compute[r] = e.now;
    bool pause = false;
    if (!e.die && fs->pause_end[r] > e.now) {
        pause = true;
        if (fs->pause_end[r] > e.sleep_until)
            e.sleep_until = fs->pause_end[r];
    }
    dsim_waitq_unlock(fs->q);
    if (fs->n_pending_kill)
        fs_flush_kills(fs);
    if (e.die)
        return DSIM_HOOK_DIE;
    return fs_phase_wait(fs, &e, pause);
}

/* The faults' own hook, then the hooks the configuration had before
 * dsim_faults_attach (the harness's phase recorder) for a replica that
 * goes on. */
dsim_hook_action fs_phase(void *user, int r, dsim_phase p, uint64_t gs)
{
    dsim_faults *fs = user;
    dsim_hook_action a = fs_phase_own(fs, r, p, gs);
    if (a == DSIM_HOOK_GO && fs->next_hooks && fs->next_hooks->phase)
        a = fs->next_hooks->phase(fs->next_user, r, p, gs);
    return a;
}

/* Reads go on to the hooks the configuration had before (nothing of the
 * faults' own acts on them). */
void fs_batch(void *user, int r, uint32_t epoch, uint64_t step, const uint64_t *ids, uint64_t n)
{
    dsim_faults *fs = user;
    const dsim_train_hooks *nx = fs->next_hooks;
    if (nx && nx->size >= sizeof *nx && nx->batch)
        nx->batch(fs->next_user, r, epoch, step, ids, n);
}

int fs_killed(void *user, int r)
{
    dsim_faults *fs = user;
    if (r < 0 || r >= fs->R || !fs->q)
        return 0;
    dsim_waitq_lock(fs->q);
    int k = fs->dead[r] || fs->pause_end[r] == FS_FOREVER;
    dsim_waitq_unlock(fs->q);
    return k;
}
