/* Fault injection: the life of a scenario's fault list in a run (see
 * fault.h for what each fault does, fault_int.h for how the files share
 * the work): making it, wiring it into a job as the transport's filter
 * (filter.c) and the driver's hooks (hooks.c), carrying it over restarts,
 * and what it recorded; its events, and which ranks each fault acts on. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "fault_int.h"

/* ---- events ---- */

void fs_event_locked(dsim_faults *fs, int fault, int rank, int64_t now, const char *fmt, ...)
{
    char text[sizeof fs->ev[0].text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    uint64_t th = 0xcbf29ce484222325ULL; /* FNV-1a of the text, for the trace */
    for (const char *c = text; *c; c++)
        th = (th ^ (unsigned char)*c) * 0x100000001b3ULL;
    dsim_rt_trace(fs->rt, DSIM_TRACE_FAULT, ((uint64_t)(uint32_t)fault << 32) | (uint32_t)rank,
                  (uint64_t)(now - fs->t0), th);
    if (fs->n_ev == fs->cap_ev) {
        size_t cap = fs->cap_ev ? 2 * fs->cap_ev : 32;
        if (cap > 100000)
            return; /* bounded: a probabilistic fault on a long run */
        dsim_fault_event *e = realloc(fs->ev, cap * sizeof *e);
        if (!e)
            return;
        fs->ev = e;
        fs->cap_ev = cap;
    }
    dsim_fault_event *e = &fs->ev[fs->n_ev++];
    e->t_ns = now - fs->t0;
    e->t_abs = now;
    e->fault = fault;
    e->rank = rank;
    e->lost = -1;
    if (fs->loss_unreported) {
        e->lost = fs->lost_rank;
        fs->loss_unreported = false;
    }
    memcpy(e->text, text, sizeof text);
    dsim_info("fault: %s", e->text);
}

/* ---- scopes ---- */

static int fs_rank_of_worker(const dsim_faults *fs, int w, int d)
{
    return w * fs->D + d;
}

/* Fills st->victim from the fault's where. */
static dsim_err fs_resolve(dsim_faults *fs, size_t i)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    st->victim = calloc((size_t)fs->R, sizeof *st->victim);
    if (!st->victim)
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
    st->armed = -1;
    st->armed_rank = -1;
    if (f->rank >= 0 && f->rank < fs->R)
        st->victim[f->rank] = true;
    if (f->worker >= 0 && f->worker < fs->hosts)
        for (int d = 0; d < fs->D; d++)
            st->victim[fs_rank_of_worker(fs, f->worker, d)] = true;
    if (f->ps >= 0 && f->ps < fs->P)
        st->victim[fs->N + f->ps] = true;
    for (int k = 0; k < f->n_ranks; k++)
        if (f->ranks[k] >= 0 && f->ranks[k] < fs->R)
            st->victim[f->ranks[k]] = true;
    if (f->link_from >= 0) {
        st->victim[f->link_from] = true;
        st->victim[f->link_to] = true;
    }
    if (f->scope == DSIM_SCOPE_ALL) {
        for (int r = 0; r < fs->N; r++)
            st->victim[r] = true;
    } else if (f->scope == DSIM_SCOPE_ONE || f->scope == DSIM_SCOPE_MAJORITY) {
        int want = f->scope == DSIM_SCOPE_ONE ? 1 : fs->N / 2 + 1;
        uint64_t *ids = malloc((size_t)fs->N * sizeof *ids);
        if (!ids)
            return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
        for (int r = 0; r < fs->N; r++)
            ids[r] = (uint64_t)r;
        dsim_rng g;
        dsim_rng_init(&g, fs->seed, "fault.scope", i);
        dsim_rng_shuffle_u64(&g, ids, (uint64_t)fs->N);
        for (int k = 0; k < want && k < fs->N; k++)
            st->victim[ids[k]] = true;
        free(ids);
    }
    return DSIM_OK;
}

int fs_first_victim(const dsim_faults *fs, size_t i)
{
    for (int r = 0; r < fs->R; r++)
        if (fs->st[i].victim[r])
            return r;
    return -1;
}

/* ---- life ---- */

dsim_err dsim_faults_create(const dsim_fault *faults, size_t n, uint64_t seed, int hosts,
                            int devices_per_host, int num_ps, dsim_faults **out)
{
    *out = NULL;
    if (hosts < 1 || devices_per_host < 1 || num_ps < 0 || (n && !faults))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_faults_create: bad cluster %d x %d + %d", hosts,
                        devices_per_host, num_ps);
    for (size_t i = 0; i < n; i++)
        if (!fs_kind_get(faults[i].what)) {
            char kinds[256];
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "dsim_faults_create: faults[%zu].what is %d, not a fault kind (%s)", i,
                            (int)faults[i].what, dsim_fault_kind_list(kinds, sizeof kinds));
        }
    dsim_faults *fs = calloc(1, sizeof *fs);
    if (!fs)
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
    fs->seed = seed;
    fs->t_loss = -1;
    fs->lost_rank = -1;
    fs->hosts = hosts;
    fs->D = devices_per_host;
    fs->N = hosts * devices_per_host;
    fs->P = num_ps;
    fs->R = fs->N + num_ps;
    fs->n = n;
    size_t R = (size_t)fs->R;
    fs->list = calloc(n ? n : 1, sizeof *fs->list);
    fs->st = calloc(n ? n : 1, sizeof *fs->st);
    fs->dead = calloc(R, sizeof *fs->dead);
    fs->pause_end = calloc(R, sizeof *fs->pause_end);
    fs->phase = calloc(R, sizeof *fs->phase);
    fs->step = calloc(R, sizeof *fs->step);
    fs->t_compute = calloc(R, sizeof *fs->t_compute);
    fs->lcap = 1024;
    fs->links = calloc(fs->lcap, sizeof *fs->links);
    if (!fs->list || !fs->st || !fs->dead || !fs->pause_end || !fs->phase || !fs->step ||
        !fs->t_compute || !fs->links) {
        dsim_faults_destroy(fs);
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory for %d ranks", fs->R);
    }
    for (size_t i = 0; i < n; i++) {
        fs->list[i] = faults[i];
        fs->list[i].phase = NULL;
        if (faults[i].what == DSIM_FAULT_REORDER)
            fs->any_reorder = true;
        if (faults[i].phase && !(fs->list[i].phase = strdup(faults[i].phase))) {
            dsim_faults_destroy(fs);
            return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory");
        }
        fs->st[i].kind = fs_kind_get(faults[i].what);
        dsim_err e = fs_resolve(fs, i);
        if (e != DSIM_OK) {
            dsim_faults_destroy(fs);
            return e;
        }
    }
    fs->hooks = (dsim_train_hooks){.size = sizeof(dsim_train_hooks),
                                   .phase = fs_phase,
                                   .killed = fs_killed,
                                   .batch = fs_batch};
    fs->filter = (struct dsim_tp_filter){.size = sizeof(struct dsim_tp_filter),
                                         .attach = fs_attach,
                                         .detach = fs_detach,
                                         .on_deliver = fs_on_deliver,
                                         .on_sent = fs_on_sent,
                                         .on_peer_lost = fs_on_peer_lost,
                                         .conn_stats = fs_conn_stats};
    *out = fs;
    return DSIM_OK;
}

void dsim_faults_destroy(dsim_faults *fs)
{
    if (!fs)
        return;
    for (size_t i = 0; fs->list && i < fs->n; i++)
        free(fs->list[i].phase);
    for (size_t i = 0; fs->st && i < fs->n; i++)
        free(fs->st[i].victim);
    for (fs_lchunk *c = fs->lchunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(fs->links);
    free(fs->held);
    for (fs_held *h = fs->free_held, *next; h; h = next) {
        next = h->next_free;
        free(h);
    }
    free(fs->list);
    free(fs->st);
    free(fs->dead);
    free(fs->pause_end);
    free(fs->phase);
    free(fs->step);
    free(fs->t_compute);
    free(fs->nic_out_free);
    free(fs->nic_in_free);
    free(fs->ici_free);
    free(fs->tpu_chip);
    free(fs->tpu_coords);
    free(fs->conn_n);
    free(fs->conn_slowest);
    free(fs->conn_total);
    free(fs->conn_max);
    free(fs->timers);
    free(fs->ev);
    free(fs);
}

void dsim_faults_set_msg_log(dsim_faults *fs, dsim_msg_log *log)
{
    fs->msgs = log;
}

void dsim_faults_attach(dsim_faults *fs, dsim_train_cfg *cfg)
{
    /* A preemption notice the job has not had yet is the driver's to carry
     * out (dsim_train_cfg.preempt_after). */
    cfg->preempt_after = 0;
    cfg->preempt_grace_steps = 0;
    for (size_t i = 0; i < fs->n; i++) {
        const dsim_fault *f = &fs->list[i];
        if (f->what != DSIM_FAULT_PREEMPT || fs->st[i].done || f->when != DSIM_WHEN_STEP)
            continue;
        if (!cfg->preempt_after || (uint64_t)f->step < cfg->preempt_after) {
            cfg->preempt_after = (uint64_t)(f->step > 0 ? f->step : 1);
            cfg->preempt_grace_steps = (uint64_t)f->grace_steps;
        }
    }
    cfg->transport_filter = &fs->filter;
    cfg->transport_filter_user = fs;
    if (cfg->hooks && cfg->hooks != &fs->hooks) {
        fs->next_hooks = cfg->hooks;
        fs->next_user = cfg->hooks_user;
    }
    cfg->hooks = &fs->hooks;
    cfg->hooks_user = fs;
}

void dsim_faults_rearm_for_restart(dsim_faults *fs)
{
    for (size_t i = 0; i < fs->n; i++) {
        fs_state *st = &fs->st[i];
        /* What fired stays fired (and done); the rest can still fire. */
        if (st->fired)
            st->done = true;
        st->armed = -1;
    }
    for (int r = 0; r < fs->R; r++) {
        fs->dead[r] = false;
        fs->pause_end[r] = 0;
        fs->phase[r] = 0;
        fs->step[r] = 0;
        fs->t_compute[r] = 0;
    }
    free(fs->timers);
    fs->timers = NULL;
    fs->n_timers = 0;
    fs->t_loss = -1;
    fs->loss_unreported = false;
    fs->lost_rank = -1;
}

void dsim_faults_preempted(dsim_faults *fs, uint64_t at_step)
{
    for (size_t i = 0; i < fs->n; i++) {
        const dsim_fault *f = &fs->list[i];
        if (f->what == DSIM_FAULT_PREEMPT && !fs->st[i].done && f->when == DSIM_WHEN_STEP &&
            (uint64_t)f->step <= at_step) {
            fs->st[i].fired = true;
            fs->stats.fired++;
            fs_event_locked(fs, (int)i, -1, fs->t0,
                            "fault %zu: preemption notice after step %lld; the job saved at step "
                            "%llu and stopped to be restarted",
                            i, (long long)f->step, (unsigned long long)at_step);
        }
    }
}

void dsim_faults_set_process_hooks(dsim_faults *fs, const dsim_faults_process_hooks *h)
{
    if (h)
        fs->proc = *h;
    else
        memset(&fs->proc, 0, sizeof fs->proc);
}

void dsim_faults_mark_done(dsim_faults *fs, const bool *done, size_t n)
{
    for (size_t i = 0; i < n && i < fs->n; i++)
        if (done[i]) {
            fs->st[i].fired = true;
            fs->st[i].done = true;
        }
}

void dsim_faults_fired(dsim_faults *fs, bool *done, size_t n)
{
    for (size_t i = 0; i < n && i < fs->n; i++)
        done[i] = fs->st[i].fired || fs->st[i].done;
}

int dsim_faults_first_loss(dsim_faults *fs, int64_t *t_abs)
{
    *t_abs = fs->t_loss;
    return fs->t_loss >= 0 ? fs->lost_rank : -1;
}

size_t dsim_faults_events(dsim_faults *fs, const dsim_fault_event **out)
{
    *out = fs->ev;
    return fs->n_ev;
}

int dsim_faults_rank_lost(dsim_faults *fs, int rank)
{
    if (rank < 0 || rank >= fs->R)
        return 0;
    return fs->dead[rank] || fs->pause_end[rank] == FS_FOREVER;
}

void dsim_faults_get_stats(dsim_faults *fs, dsim_faults_stats *out)
{
    *out = fs->stats;
}

void dsim_faults_stats_add(dsim_faults_stats *sum, const dsim_faults_stats *add)
{
    sum->fired += add->fired;
    sum->frames_seen += add->frames_seen;
    sum->dropped += add->dropped;
    sum->delayed += add->delayed;
    sum->duplicated += add->duplicated;
    sum->corrupted += add->corrupted;
    sum->reordered += add->reordered;
    sum->held += add->held;
    sum->retransmitted += add->retransmitted;
}

bool dsim_faults_stats_touched(const dsim_faults_stats *s)
{
    return s->fired || s->dropped || s->delayed || s->duplicated || s->corrupted || s->reordered ||
           s->held || s->retransmitted;
}
