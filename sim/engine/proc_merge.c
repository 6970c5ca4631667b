/* The processes engine's parent: what it makes of its children's records
 * (pr_record, as they come) and, once every task has ended, their parts
 * merged into one dsim_train_result as dsim_train fills it in one process
 * (pr_merge). */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsim/spi/strategy.h"
#include "fault/msglog.h"
#include "proc_int.h"

/* ---- the records ---- */

static void pr_rec_step(pr_job *j, const unsigned char *b, size_t n)
{
    if (n < sizeof(pr_step))
        return;
    if (j->n_steps == j->cap_steps) {
        size_t cap = j->cap_steps ? 2 * j->cap_steps : 256;
        pr_step *s = realloc(j->steps, cap * sizeof *s);
        uint64_t **ids = realloc(j->step_ids, cap * sizeof *ids);
        if (s)
            j->steps = s;
        if (ids)
            j->step_ids = ids;
        if (!s || !ids)
            return;
        j->cap_steps = cap;
    }
    pr_step *s = &j->steps[j->n_steps];
    memcpy(s, b, sizeof *s);
    size_t nid = (n - sizeof *s) / sizeof(uint64_t);
    uint64_t *ids = NULL;
    if (nid && (ids = malloc(nid * sizeof *ids)))
        memcpy(ids, b + sizeof *s, nid * sizeof *ids);
    s->info.ids = ids;
    j->step_ids[j->n_steps++] = ids;
    int r = s->info.replica;
    if (r >= 0 && r < j->N) {
        j->last_phase[r] = DSIM_PHASE_REDUCE_LOSS;
        j->last_step[r] = s->info.global_step;
    }
    if (j->cfg->observer)
        j->cfg->observer(&s->info, j->cfg->observer_user);
}

static void pr_rec_event(pr_job *j, const unsigned char *b, size_t n)
{
    if (n < sizeof(dsim_fault_event))
        return;
    /* several processes see the same kill fire: keep one */
    const dsim_fault_event *ne = (const dsim_fault_event *)(const void *)b;
    /* a loss a child saw (a partition or pause for good: kills come as
     * PR_KILL), on the same CLOCK_MONOTONIC */
    if (ne->lost >= 0 && ne->lost < j->R)
        pr_lost(j, ne->lost, ne->t_abs);
    for (size_t i = 0; i < j->out->n_events; i++)
        if (j->out->events[i].fault == ne->fault && j->out->events[i].rank == ne->rank &&
            strcmp(j->out->events[i].text, ne->text) == 0)
            return;
    dsim_fault_event *e = realloc(j->out->events, (j->out->n_events + 1) * sizeof *e);
    if (!e)
        return;
    j->out->events = e;
    memcpy(&e[j->out->n_events++], b, sizeof *e);
}

static void pr_rec_kill(pr_job *j, pr_task *t, const unsigned char *b, size_t n)
{
    int rank;
    if (n < sizeof rank)
        return;
    memcpy(&rank, b, sizeof rank);
    int k = pr_task_of_rank(j, rank);
    if (k >= 0) {
        pr_task *v = &j->tasks[k];
        v->fault_killed = true;
        pr_lost(j, rank, pr_now());
        if (!v->exited && v != t)
            pr_signal(v, SIGKILL);
    }
    pr_fail_now(j);
}

static void pr_rec_pause(pr_job *j, pr_task *t, const unsigned char *b, size_t n)
{
    pr_pause p;
    if (n < sizeof p)
        return;
    memcpy(&p, b, sizeof p);
    if (p.duration_ns > 0) {
        t->cont_at = pr_now() + p.duration_ns;
    } else {
        t->stopped_for_good = true;
        pr_lost(j, p.rank, pr_now());
    }
}

/* A copy of n bytes into *dst, once, when n is the model's size. */
static void pr_rec_vars(float **dst, const pr_job *j, const unsigned char *b, size_t n)
{
    if (!*dst && n == j->res->n_params * sizeof(float) && n) {
        *dst = malloc(n);
        if (*dst)
            memcpy(*dst, b, n);
    }
}

/* A whole array of floats (the trace): the last one sent. */
static void pr_rec_floats(float **dst, size_t *len, const unsigned char *b, size_t n)
{
    free(*dst);
    *dst = malloc(n ? n : 1);
    *len = 0;
    if (*dst) {
        memcpy(*dst, b, n);
        *len = n / sizeof(float);
    }
}

/* A part of a row of trace_grad or trace_slots (pr_grads; rows of W
 * floats) that a process's replicas applied: written into the job's rows
 * (*dst, *len floats) where not NaN, so that the parts of a sharded
 * optimizer's replicas, in processes of their own, make one row. A record
 * that does not fit the job's rows is dropped. */
static void pr_rec_rows(float **dst, size_t *len, size_t W, const unsigned char *b, size_t n)
{
    pr_grads g;
    if (n < sizeof g || !W)
        return;
    memcpy(&g, b, sizeof g);
    if (g.width != W || g.rows == 0 || g.rows > ((size_t)1 << 28) / W || g.row >= g.rows ||
        g.lo > W || g.n > W - g.lo || n - sizeof g != g.n * sizeof(float) ||
        (*dst && *len != g.rows * W))
        return;
    if (!*dst) {
        if (!(*dst = malloc(g.rows * W * sizeof(float))))
            return;
        *len = g.rows * W;
        for (size_t k = 0; k < *len; k++)
            (*dst)[k] = NAN;
    }
    float *row = *dst + g.row * W + g.lo;
    const unsigned char *v = b + sizeof g;
    for (size_t k = 0; k < g.n; k++) {
        float x;
        memcpy(&x, v + k * sizeof x, sizeof x);
        if (!isnan(x))
            row[k] = x;
    }
}

/* A sub-communicator's record: appended after the N replicas'. */
static void pr_rec_flight_sub(pr_job *j, const pr_flight *hd, const unsigned char *b, size_t n)
{
    size_t wl = (size_t)hd->size * sizeof(int);
    if (hd->size < 1 || hd->size > j->N || hd->rank < 0 || hd->rank >= hd->size ||
        hd->world_rank < 0 || hd->world_rank >= j->N || n < wl ||
        hd->n != (n - wl) / sizeof(dsim_fr_entry) || (n - wl) % sizeof(dsim_fr_entry))
        return;
    dsim_fr_dump *all = realloc(j->flight, ((size_t)j->n_flight + 1) * sizeof *all);
    if (!all)
        return;
    j->flight = all;
    dsim_fr_dump *d = &all[j->n_flight];
    *d = (dsim_fr_dump){.rank = hd->rank,
                        .size = hd->size,
                        .comm_id = hd->comm_id,
                        .calls = hd->calls,
                        .world_rank = hd->world_rank,
                        .origin = hd->origin,
                        .parent_id = hd->parent_id,
                        .color = hd->color};
    d->world_ranks = malloc(wl);
    d->entries = hd->n ? malloc((size_t)hd->n * sizeof *d->entries) : NULL;
    if (!d->world_ranks || (hd->n && !d->entries)) {
        dsim_fr_dump_free(d);
        return;
    }
    memcpy(d->world_ranks, b, wl);
    if (hd->n)
        memcpy(d->entries, b + wl, (size_t)hd->n * sizeof *d->entries);
    d->n = (size_t)hd->n;
    j->n_flight++;
}

static void pr_rec_flight(pr_job *j, const unsigned char *b, size_t n)
{
    pr_flight hd;
    if (n < sizeof hd)
        return;
    memcpy(&hd, b, sizeof hd);
    if (!j->flight) {
        if (!(j->flight = calloc((size_t)j->N, sizeof *j->flight)))
            return;
        j->n_flight = j->N;
    }
    if (hd.sub) {
        pr_rec_flight_sub(j, &hd, b + sizeof hd, n - sizeof hd);
        return;
    }
    if (hd.rank < 0 || hd.rank >= j->N || hd.n > (n - sizeof hd) / sizeof(dsim_fr_entry))
        return;
    dsim_fr_dump *d = &j->flight[hd.rank];
    if (d->entries)
        return;
    *d = (dsim_fr_dump){.rank = hd.rank,
                        .size = hd.size,
                        .comm_id = hd.comm_id,
                        .calls = hd.calls,
                        .world_rank = hd.rank,
                        .color = -1};
    if (hd.n && (d->entries = malloc((size_t)hd.n * sizeof *d->entries))) {
        memcpy(d->entries, b + sizeof hd, (size_t)hd.n * sizeof *d->entries);
        d->n = (size_t)hd.n;
    }
}

static void pr_rec_updates(pr_job *j, const unsigned char *b, size_t n)
{
    size_t k = n / sizeof(dsim_ps_update);
    dsim_ps_update *u = realloc(j->updates, (j->n_updates + k) * sizeof *u);
    if (!u)
        return;
    j->updates = u;
    memcpy(u + j->n_updates, b, k * sizeof *u);
    j->n_updates += k;
}

static struct {
    atomic_uint_fast64_t records, phase_records, phase_entries, step_phase_entries;
} pr_totals;

void dsim_proc_totals(dsim_proc_stats *out)
{
    out->records = atomic_load(&pr_totals.records);
    out->phase_records = atomic_load(&pr_totals.phase_records);
    out->phase_entries = atomic_load(&pr_totals.phase_entries);
    out->step_phase_entries = atomic_load(&pr_totals.step_phase_entries);
}

static void pr_rec_phase(pr_job *j, const unsigned char *b, size_t n)
{
    pr_phase ph;
    atomic_fetch_add(&pr_totals.phase_records, 1);
    if (!j->a || !j->a->on_phase)
        return;
    for (size_t at = 0; at + sizeof ph <= n; at += sizeof ph) {
        memcpy(&ph, b + at, sizeof ph);
        atomic_fetch_add(&pr_totals.phase_entries, 1);
        if (pr_step_phase(ph.phase))
            atomic_fetch_add(&pr_totals.step_phase_entries, 1);
        if (ph.replica >= 0 && ph.replica < j->R)
            j->a->on_phase(j->a->on_phase_user, ph.replica, ph.phase, ph.gs, ph.t);
    }
}

static void pr_rec_msgs(pr_job *j, const unsigned char *b, size_t n)
{
    uint64_t dropped;
    if (n < sizeof dropped || !j->a || !j->a->msgs)
        return;
    memcpy(&dropped, b, sizeof dropped);
    size_t k = (n - sizeof dropped) / sizeof(dsim_msg_rec);
    dsim_msg_rec *h = k ? malloc(k * sizeof *h) : NULL;
    if (h)
        memcpy(h, b + sizeof dropped, k * sizeof *h);
    dsim_msg_log_add(j->a->msgs, h, h ? k : 0, dropped);
    free(h);
}

static void pr_rec_exit(pr_job *j, pr_task *t, const unsigned char *b, size_t n)
{
    pr_exit x;
    if (!t->remote || n < sizeof x || t->exited)
        return;
    memcpy(&x, b, sizeof x);
    if (t->hung_pending) {
        t->hung = true;
        j->out->hung++;
    }
    pr_ended(j, t, x.sig, x.code);
}

static void pr_rec_read(pr_job *j, const unsigned char *b, size_t n)
{
    if (n < sizeof(pr_batch))
        return;
    if (j->n_reads == j->cap_reads) {
        size_t cap = j->cap_reads ? 2 * j->cap_reads : 256;
        pr_batch *r = realloc(j->reads, cap * sizeof *r);
        if (r)
            j->reads = r;
        uint64_t **ids = realloc(j->read_ids, cap * sizeof *ids);
        if (ids)
            j->read_ids = ids;
        uint64_t *cnt = realloc(j->read_n, cap * sizeof *cnt);
        if (cnt)
            j->read_n = cnt;
        if (!r || !ids || !cnt)
            return;
        j->cap_reads = cap;
    }
    size_t k = j->n_reads;
    memcpy(&j->reads[k], b, sizeof j->reads[k]);
    size_t nid = (n - sizeof(pr_batch)) / sizeof(uint64_t);
    uint64_t *ids = NULL;
    if (nid && (ids = malloc(nid * sizeof *ids)))
        memcpy(ids, b + sizeof(pr_batch), nid * sizeof *ids);
    if (nid && !ids)
        return;
    j->read_ids[k] = ids;
    j->read_n[k] = nid;
    j->n_reads++;
}

void pr_record(pr_job *j, pr_task *t, uint32_t type, const unsigned char *b, size_t n)
{
    j->t_last_record = pr_now();
    atomic_fetch_add(&pr_totals.records, 1);
    switch (type) {
    case PR_STEP:
        pr_rec_step(j, b, n);
        break;
    case PR_EVENT:
        pr_rec_event(j, b, n);
        break;
    case PR_KILL:
        pr_rec_kill(j, t, b, n);
        break;
    case PR_PAUSE:
        pr_rec_pause(j, t, b, n);
        break;
    case PR_RESULT:
        if (n >= sizeof t->result) {
            memcpy(&t->result, b, sizeof t->result);
            t->has_result = true;
            if (t->result.err != DSIM_OK)
                pr_fail_now(j);
        }
        break;
    case PR_END: {
        pr_end en;
        if (n < sizeof en)
            return;
        memcpy(&en, b, sizeof en);
        if (en.replica >= 0 && en.replica < j->N) {
            j->ends[en.replica] = en;
            j->has_end[en.replica] = true;
        }
        break;
    }
    case PR_PARAMS:
        pr_rec_vars(&j->params, j, b, n);
        break;
    case PR_TRACE:
        pr_rec_floats(&j->trace, &j->trace_len, b, n);
        break;
    case PR_GRADS:
        pr_rec_rows(&j->grads, &j->grads_len, j->res->n_params, b, n);
        break;
    case PR_SLOTS:
        pr_rec_rows(&j->slots, &j->slots_len,
                    dsim_optim_rule_slots(&j->cfg->optim) * j->res->n_params, b, n);
        break;
    case PR_INITIAL:
        pr_rec_vars(&j->initial, j, b, n);
        break;
    case PR_FLIGHT:
        pr_rec_flight(j, b, n);
        break;
    case PR_UPDATES:
        pr_rec_updates(j, b, n);
        break;
    case PR_STATS: {
        dsim_faults_stats st;
        if (n < sizeof st)
            return;
        memcpy(&st, b, sizeof st);
        dsim_faults_stats_add(&j->out->stats, &st);
        break;
    }
    case PR_PHASE:
        pr_rec_phase(j, b, n);
        break;
    case PR_MSGS:
        pr_rec_msgs(j, b, n);
        break;
    case PR_READ:
        pr_rec_read(j, b, n);
        break;
    case PR_DONE:
        t->done = true;
        break;
    case PR_EXIT:
        pr_rec_exit(j, t, b, n);
        break;
    case PR_INTERRUPT: {
        /* another task was interrupted: the job ends as if this one were
         * (`dsim worker` takes the signal on the chief: the run stored as
         * unfinished, every task told, exit 128 + signal) */
        int32_t sig = 0;
        if (n >= sizeof sig)
            memcpy(&sig, b, sizeof sig);
        kill(getpid(), sig == SIGTERM ? SIGTERM : SIGINT);
        break;
    }
    default:
        break;
    }
}

/* ---- the merge ---- */

/* The summary: from a task with replicas that reported, a successful one
 * first. */
static const pr_result *pr_summary(const pr_job *j)
{
    const pr_result *sum = NULL;
    for (int k = 0; k < j->T; k++)
        if (j->tasks[k].has_result && j->tasks[k].result.has_replica &&
            (!sum || (j->tasks[k].result.err == DSIM_OK && sum->err != DSIM_OK)))
            sum = &j->tasks[k].result;
    return sum;
}

/* The job's shape and the summary's figures into res. */
static void pr_merge_head(pr_job *j, const pr_result *sum, uint64_t first, uint64_t steps)
{
    dsim_train_result *res = j->res;
    const dsim_train_cfg *cfg = j->cfg;
    snprintf(res->strategy, sizeof res->strategy, "%s", cfg->strategy ? cfg->strategy : "");
    res->num_workers = cfg->hosts;
    res->devices_per_host = cfg->devices_per_host;
    res->num_replicas = j->N;
    res->num_ps = j->P;
    if (sum) {
        res->placement = sum->placement;
        res->num_replicas_in_sync = sum->num_replicas_in_sync;
        res->loss_scale = sum->loss_scale;
        res->shard_applied = (dsim_shard_policy)sum->shard_applied;
        res->input_from_strategy = sum->input_from_strategy != 0;
        res->steps_per_epoch = sum->steps_per_epoch;
        res->initial_loss = sum->initial_loss;
        res->initial_checksum = sum->initial_checksum;
        /* a child's word: bounded and terminated before any message reads it */
        res->n_vars = sum->n_vars < DSIM_MODEL_MAX_VARS ? sum->n_vars : DSIM_MODEL_MAX_VARS;
        memcpy(res->vars, sum->vars, sizeof res->vars);
        for (size_t k = 0; k < DSIM_MODEL_MAX_VARS; k++)
            res->vars[k].name[sizeof res->vars[k].name - 1] = '\0';
        /* The job started when its first task did: each task's own start
         * is later, and phases measured from a later one come out
         * negative for the tasks that started first. */
        res->t_start = sum->t_start;
        for (int k = 0; k < j->T; k++)
            if (j->tasks[k].has_result && j->tasks[k].result.t_start < res->t_start)
                res->t_start = j->tasks[k].result.t_start;
        res->preempted = sum->preempted;
        res->preempted_at = sum->preempted_at;
    }
    res->first_step = first;
    res->steps = steps;
}

/* The per-step arrays; false when out of memory. */
static bool pr_merge_alloc(pr_job *j, size_t S)
{
    dsim_train_result *res = j->res;
    const dsim_train_cfg *cfg = j->cfg;
    size_t P = res->n_params, NN = (size_t)j->N;
    res->params = calloc(P ? P : 1, sizeof(float));
    res->loss = calloc(S ? S : 1, sizeof(double));
    res->local_loss = calloc(S * NN + 1, sizeof(double));
    res->checksum = calloc(S * NN + 1, sizeof(uint64_t));
    res->examples = calloc(S * NN + 1, sizeof(uint64_t));
    res->padded = calloc(S * NN + 1, sizeof(uint64_t));
    res->step_ns = calloc(S * NN + 1, sizeof(int64_t));
    res->comm_ns = calloc(S * NN + 1, sizeof(int64_t));
    res->checkpoint_writes = calloc(NN, sizeof(uint64_t));
    res->replicas = calloc(NN, sizeof *res->replicas);
    res->mp_scale = calloc(S * NN + 1, sizeof(float));
    res->mp_skipped = calloc(S * NN + 1, 1);
    res->var_sig = calloc(S * NN * DSIM_MODEL_MAX_VARS + 1, sizeof(uint16_t));
    res->grad_norm = malloc((S * NN + 1) * sizeof(double));
    for (size_t k = 0; res->grad_norm && k < S * NN; k++)
        res->grad_norm[k] = NAN; /* the replica's step did not say */
    res->precision = cfg->precision == DSIM_POLICY_DEFAULT ? DSIM_POLICY_FLOAT32 : cfg->precision;
    res->gradient_dtype = cfg->gradient_dtype;
    uint64_t n_ex = cfg->dataset ? cfg->dataset->spec.n_examples : cfg->data.n_examples;
    dsim_ledger_create(n_ex, cfg->epochs, cfg->hosts, cfg->devices_per_host, &res->ledger);
    return res->params && res->loss && res->local_loss && res->checksum && res->examples &&
           res->padded && res->step_ns && res->comm_ns && res->checkpoint_writes && res->replicas &&
           res->mp_scale && res->mp_skipped && res->grad_norm && res->var_sig;
}

/* Every step row into the per-step arrays and the ledger. */
static void pr_merge_steps(pr_job *j, uint64_t first, size_t S)
{
    dsim_train_result *res = j->res;
    size_t NN = (size_t)j->N;
    for (size_t k = 0; k < S; k++)
        res->loss[k] = NAN;
    for (size_t i = 0; i < j->n_steps; i++) {
        const dsim_train_step_info *in = &j->steps[i].info;
        if (in->rerun) {
            /* a lost replica's step, re-run: coverage only */
            if (res->ledger && in->ids && in->replica >= 0 && in->replica < j->N)
                dsim_ledger_record_rerun(res->ledger, in->replica, in->rerun_of, in->epoch,
                                         in->step, in->ids, in->examples);
            continue;
        }
        if (in->global_step < first || in->global_step - first >= S || in->replica < 0 ||
            in->replica >= j->N)
            continue;
        size_t k = (size_t)(in->global_step - first), r = (size_t)in->replica;
        res->checksum[k * NN + r] = in->checksum;
        res->local_loss[k * NN + r] = in->local_loss;
        res->examples[k * NN + r] = in->examples;
        res->padded[k * NN + r] = in->padded;
        res->padded_total += in->padded;
        res->step_ns[k * NN + r] = in->t_end - in->t_start;
        res->comm_ns[k * NN + r] = in->t_end - in->t_comm;
        res->mp_scale[k * NN + r] = in->mp_scale;
        res->mp_skipped[k * NN + r] = in->mp_skipped;
        memcpy(res->var_sig + (k * NN + r) * DSIM_MODEL_MAX_VARS, in->var_sig, sizeof in->var_sig);
        res->grad_norm[k * NN + r] = in->grad_norm;
        if (r == 0) {
            res->loss[k] = in->loss;
            res->skipped_steps += in->mp_skipped;
        }
        /* the reads as they were read (PR_READ), if the children sent them */
        if (res->ledger && in->ids && !j->n_reads)
            dsim_ledger_record(res->ledger, in->replica, in->epoch, in->step, in->ids,
                               in->examples);
    }
    for (size_t i = 0; res->ledger && i < j->n_reads; i++) {
        const pr_batch *rd = &j->reads[i];
        if (rd->replica >= 0 && rd->replica < j->N)
            dsim_ledger_record(res->ledger, rd->replica, rd->epoch, rd->step, j->read_ids[i],
                               j->read_n[i]);
    }
}

/* The variables, the trace and the flight records, moved from the job. */
static void pr_merge_vars(pr_job *j, size_t S)
{
    dsim_train_result *res = j->res;
    size_t P = res->n_params;
    int N = j->N;
    if (j->params)
        memcpy(res->params, j->params, P * sizeof(float));
    uint32_t every = j->cfg->trace_every > 1 ? j->cfg->trace_every : 1;
    res->trace_every = every;
    if (j->trace && j->trace_len == S / every * P) {
        res->trace = j->trace;
        res->trace_rows = S / every;
        j->trace = NULL;
    }
    if (j->grads && j->grads_len == (S + every - 1) / every * P) {
        res->trace_grad = j->grads;
        res->trace_grad_rows = (S + every - 1) / every;
        j->grads = NULL;
        if (j->slots &&
            j->slots_len == res->trace_grad_rows * dsim_optim_rule_slots(&j->cfg->optim) * P) {
            res->trace_slots = j->slots;
            j->slots = NULL;
        }
    }
    res->initial_params = j->initial;
    j->initial = NULL;
    /* Replicas whose process sent none (killed, crashed, hung) keep their
     * rank and no calls. */
    if (j->flight) {
        for (int r = 0; r < N; r++)
            if (!j->flight[r].entries && !j->flight[r].calls)
                j->flight[r] = (dsim_fr_dump){.rank = r,
                                              .size = N,
                                              .comm_id = DSIM_STRATEGY_COMM_WORLD,
                                              .world_rank = r,
                                              .color = -1};
        res->flight = j->flight;
        res->n_flight = j->n_flight;
        j->flight = NULL;
        j->n_flight = 0;
    }
    if (j->n_updates) {
        res->updates = j->updates;
        res->n_updates = j->n_updates;
        j->updates = NULL;
        for (size_t i = 0; i < res->n_updates; i++)
            if (res->updates[i].staleness > res->max_staleness)
                res->max_staleness = res->updates[i].staleness;
    }
}

/* How each replica ended: its own report, else what its process came to. */
static void pr_merge_ends(pr_job *j)
{
    dsim_train_result *res = j->res;
    for (int r = 0; r < j->N; r++) {
        dsim_train_replica_end *e = &res->replicas[r];
        int k = pr_task_of_rank(j, r);
        const pr_task *t = k >= 0 ? &j->tasks[k] : NULL;
        if (j->has_end[r]) {
            *e = j->ends[r].end;
            res->checkpoint_writes[r] = j->ends[r].ckpt_writes;
            res->checkpoints_written += j->ends[r].ckpt_writes;
            continue;
        }
        e->phase = (dsim_phase)j->last_phase[r];
        e->global_step = j->last_step[r];
        if (!t)
            continue;
        if (t->fault_killed || t->stopped_for_good) {
            e->killed = true;
            e->t_end = t->t_exit ? t->t_exit : pr_now();
        } else if (t->hung) {
            e->t_end = 0; /* never returned */
            snprintf(e->msg, sizeof e->msg,
                     "did not end after the job failed; its process was killed");
        } else if (t->sig) {
            e->status = DSIM_EIO;
            e->t_end = t->t_exit;
            snprintf(e->msg, sizeof e->msg, "its process (worker %d) died of signal %d (%s)",
                     r / j->cfg->devices_per_host, t->sig, strsignal(t->sig));
        }
    }
}

/* Agreement among the survivors. */
static void pr_merge_agree(pr_job *j, size_t S)
{
    dsim_train_result *res = j->res;
    size_t NN = (size_t)j->N;
    res->replicas_agree = true;
    res->in_sync_every_step = true;
    int ref = -1;
    for (int r = 0; r < j->N; r++) {
        if (res->replicas[r].killed || res->replicas[r].status != DSIM_OK || !j->has_end[r])
            continue;
        if (ref < 0) {
            ref = r;
            continue;
        }
        if (res->replicas[r].end_checksum != res->replicas[ref].end_checksum)
            res->replicas_agree = false;
        for (size_t k = 0; k < S; k++)
            if (res->checksum[k * NN + (size_t)r] != res->checksum[k * NN + (size_t)ref])
                res->in_sync_every_step = false;
    }
}

static int pr_rank_err(dsim_err e)
{
    return e == DSIM_EABORTED ? 0 : e == DSIM_ETIMEDOUT ? 1 : 2;
}

/* The most direct error a task reported; of equals, a replica's (a server
 * that fails waiting for a client usually follows the client's own
 * failure), then the first to return. NULL: none failed. */
static const pr_result *pr_worst(const pr_job *j)
{
    const pr_result *worst = NULL;
    for (int k = 0; k < j->T; k++) {
        const pr_task *t = &j->tasks[k];
        if (!t->has_result || t->result.err == DSIM_OK)
            continue;
        int kr = pr_rank_err(t->result.err), wr = worst ? pr_rank_err(worst->err) : -1;
        if (!worst || kr > wr || (kr == wr && t->result.has_replica && !worst->has_replica) ||
            (kr == wr && t->result.has_replica == worst->has_replica &&
             t->result.t_return < worst->t_return))
            worst = &t->result;
    }
    return worst;
}

/* A task lost or dead of its own signal: that is the cause, whatever its
 * peers said about the connection it left. True when one was found. */
static bool pr_error_death(const pr_job *j, dsim_error *er)
{
    int N = j->N;
    for (int k = 0; k < j->T; k++) {
        const pr_task *t = &j->tasks[k];
        unsigned long long step = t->lo < N ? (unsigned long long)j->last_step[t->lo] : 0ULL;
        if (t->lost && !t->fault_killed) {
            er->code = DSIM_EPEER;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the dsim worker of ranks %d..%d was lost at step %llu: its results "
                     "connection to the chief closed or went silent (its machine or the "
                     "network to it went away?)",
                     t->lo, t->hi, step);
            return true;
        }
        if (t->sig && !t->killed_by_us && !t->fault_killed) {
            er->code = DSIM_EIO;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the process of %s %d (ranks %d..%d) died of signal %d (%s) at step %llu",
                     t->lo < N ? "worker" : "parameter server",
                     t->lo < N ? t->lo / j->cfg->devices_per_host : t->lo - N, t->lo, t->hi, t->sig,
                     strsignal(t->sig), step);
            return true;
        }
    }
    return false;
}

/* A task the watchdog killed, or one that ended without its result. */
static bool pr_error_end(const pr_job *j, dsim_error *er)
{
    for (int k = 0; k < j->T; k++) {
        const pr_task *t = &j->tasks[k];
        if (t->hung) {
            er->code = DSIM_EHUNG;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the process of ranks %d..%d did not end within the detection bound after "
                     "the job failed, and was killed: hung",
                     t->lo, t->hi);
            return true;
        }
        if (!t->done && !t->fault_killed && !t->stopped_for_good && !t->sig) {
            er->code = DSIM_EPEER;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the process of ranks %d..%d exited with status %d before it reported its "
                     "result (a strategy that calls exit()?)",
                     t->lo, t->hi, t->exit_code);
            return true;
        }
    }
    return false;
}

/* Every replica's process lost to the faults (a kill of the only worker):
 * nobody is left to fail or to finish, so the job ended unfinished. */
static bool pr_error_all_lost(const pr_job *j, dsim_error *er)
{
    int first = -1;
    for (int r = 0; r < j->N; r++) {
        int k = pr_task_of_rank(j, r);
        const pr_task *t = k >= 0 ? &j->tasks[k] : NULL;
        if (j->has_end[r] || !t || !(t->fault_killed || t->stopped_for_good))
            return false;
        if (first < 0)
            first = r;
    }
    if (first < 0)
        return false;
    er->code = DSIM_EPEER;
    er->peer = first;
    /* worded as the harness words it for every engine (sim/harness/recovery.c) */
    int W = j->cfg->hosts;
    char who[96];
    if (j->N == 1)
        snprintf(who, sizeof who, "rank 0 (worker 0)");
    else if (W == 1)
        snprintf(who, sizeof who, "ranks 0-%d (worker 0)", j->N - 1);
    else
        snprintf(who, sizeof who, "ranks 0-%d (workers 0-%d)", j->N - 1, W - 1);
    snprintf(er->msg, sizeof er->msg,
             "every replica was lost (%s): nobody was left to finish the job", who);
    return true;
}

/* The job's error: a death, else the most direct a task reported. */
static void pr_merge_error(const pr_job *j)
{
    dsim_error *er = &j->res->error;
    er->peer = -1;
    if (pr_error_death(j, er) || pr_error_end(j, er))
        return;
    const pr_result *worst = pr_worst(j);
    if (worst) {
        er->code = worst->err;
        er->peer = worst->peer;
        snprintf(er->msg, sizeof er->msg, "%s", worst->msg);
        return;
    }
    if (pr_error_all_lost(j, er))
        return;
    er->code = DSIM_OK;
}

void pr_merge(pr_job *j)
{
    const pr_result *sum = pr_summary(j);
    uint64_t first = sum ? sum->first_step : 0, steps = 0;
    for (size_t i = 0; i < j->n_steps; i++) {
        uint64_t gs = j->steps[i].info.global_step;
        if (gs >= first && gs - first + 1 > steps)
            steps = gs - first + 1;
    }
    if (sum && sum->err == DSIM_OK)
        steps = sum->steps;
    pr_merge_head(j, sum, first, steps);
    size_t S = (size_t)steps;
    if (!pr_merge_alloc(j, S))
        return;
    pr_merge_steps(j, first, S);
    pr_merge_vars(j, S);
    pr_merge_ends(j);
    pr_merge_agree(j, S);
    j->res->final_loss = sum && sum->err == DSIM_OK ? sum->final_loss : NAN;
    /* the exchange replica 0 made: its task's */
    for (int k = 0; k < j->T && !j->res->exchange[0]; k++)
        if (j->tasks[k].has_result)
            snprintf(j->res->exchange, sizeof j->res->exchange, "%s", j->tasks[k].result.exchange);
    pr_merge_error(j);
}
