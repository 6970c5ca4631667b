/* One run, in the steps it takes (harness.h):
 *
 *   store      the run row and a row per replica
 *   form       the observer, the formation-progress thread, the phase
 *              recorder and the message log
 *   train      the job on its engine (engine.h), under sim/fault and
 *              recovery when it has faults, and what it left: fault
 *              events, phases, frames, restarts, the timeline, the figures
 *   reference  the one-device replay the checks compare with (started
 *              before the job and run beside it where that costs the job
 *              nothing: h_ref_start)
 *   judge      the checks and the liveness phase
 *   record     the checks, metrics, what-if lines and flight records
 *              stored, the status, the run row ended
 *
 * The store (if any) is open and guarded (guard.c) for the whole run. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "diag/flight.h"
#include "dsim/log.h"
#include "harness_int.h"

/* A CPU core's rate for the model's kernels: 10 GFLOP/s. */
#define H_DEVICE_FLOPS 1e10

/* Whether to keep the variables of the run and of the reference step by
 * step: gradient_consistency explains a difference from them (how the
 * updates compare). Every step's when they fit in H_TRACE_MAX floats each,
 * else every k-th step's, the least k for which they fit (under an
 * adaptive optimizer a row of gradients too, and where k > 1 the rule's
 * slots: h_trace_grads).
 * 8 Mi floats (32 MiB): the 1024 x 100 MLP of scenarios/scale is kept
 * every step. */
#define H_TRACE_MAX DSIM_CHECK_TRACE_MAX

/* The one-device replay on a thread of its own (h_ref_start). */
typedef struct h_ref_thread {
    pthread_t tid;
    dsim_train_cfg cfg;
    dsim_train_result res;
    dsim_err err;
} h_ref_thread;

/* One run's state from step to step. */
typedef struct h_ctx {
    const dsim_scenario *s;
    const h_opts *o;
    const dsim_engine_ops *eng;
    dsim_store *st; /* NULL: no store */
    int slot;
    dsim_harness_result *out;
    dsim_train_cfg cfg;
    int R;
    h_run *run;
    bool forks;       /* the engine's tasks are processes */
    bool phases_here; /* the phase hooks run here, on the steps' clock */
    h_phase_rec *phases;
    dsim_msg_log *msgs;
    bool faulty; /* under sim/fault and recovery */
    dsim_net_links net;
    dsim_cost_decider *decider; /* communication: auto on modelled links, or NULL */
    dsim_recovery_run rr;
    dsim_check_faults cf;
    dsim_train_result res, ref;
    bool have_ref;
    const dsim_train_result **attempts; /* every attempt, the last being &res */
    h_ref_thread *ref_thread;           /* the replay running beside the job, or NULL */
    int64_t t_start, t_end;
    uint64_t live_hash;
    bool hung, in_observer;
} h_ctx;

/* Whether the trace also keeps replica 0's gradient at each span's first
 * step (cfg.record_grads): under an adaptive optimizer (adam, rmsprop,
 * adagrad), whose updates gradient_consistency judges by their gradients
 * (docs/checks.md). */
static bool h_trace_grads(const dsim_train_cfg *cfg)
{
    return dsim_optim_is_adaptive(&cfg->optim) != 0;
}

/* 0: no trace; else keep it every that many steps. */
static uint32_t h_trace_every(const dsim_scenario *s, const dsim_train_cfg *cfg)
{
    if (!h_expects(s, "gradient_consistency"))
        return 0;
    dsim_model_spec m = cfg->model;
    if (m.in_dim == 0) {
        m.in_dim = cfg->data.in_dim;
        m.out_dim = cfg->data.out_dim;
    }
    uint64_t steps = dsim_train_cfg_steps(cfg), n1 = dsim_model_num_params(&m), n = n1;
    /* under an adaptive optimizer a row of variables and one of gradients;
     * where they are not kept every step, the rule's slots too (adam's
     * two), so that the replay starts each span from the run's optimizer
     * state */
    if (h_trace_grads(cfg) && (n = 2 * n1) * steps > H_TRACE_MAX)
        n = dsim_check_trace_rows(&cfg->optim) * n1;
    if (!steps || !n || n > H_TRACE_MAX)
        return 0;
    uint64_t every = (steps + H_TRACE_MAX / n - 1) / (H_TRACE_MAX / n);
    return every > UINT32_MAX ? 0 : (uint32_t)every;
}

/* ---- store ---- */

static bool h_step_store(h_ctx *c)
{
    const dsim_scenario *s = c->s;
    dsim_harness_result *out = c->out;
    char *config = NULL;
    json_t *cj = h_config_json(s);
    if (cj) {
        config = json_dumps(cj, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(cj);
    }
    dsim_run_info info = {
        .scenario = s->name,
        .scenario_text = s->text,
        .seed = s->seed,
        .engine = dsim_scenario_engine(s),
        .strategy = c->cfg.strategy,
        .config_json = config,
    };
    dsim_err e = HG_STORE(dsim_store_begin_run(c->st, &info, &out->run_id));
    free(config);
    if (e != DSIM_OK) {
        h_fail(out, "beginning the run in the results store");
        out->status = DSIM_RUN_ERROR;
        return false;
    }
    hg_run_set_id(c->slot, out->run_id);
    for (int r = 0; r < c->R && !out->harness_error; r++) {
        int w = r / c->cfg.devices_per_host, d = r % c->cfg.devices_per_host;
        char dev[96], host[64];
        snprintf(dev, sizeof dev, "/job:worker/replica:0/task:%d/device:CPU:%d", w, d);
        snprintf(host, sizeof host, "worker-%d", w);
        if (HG_STORE(dsim_store_replica(c->st, out->run_id, r, w, dev, host)) != DSIM_OK)
            h_fail(out, "recording the replicas");
    }
    return true;
}

/* ---- the variables of every step (dsim run --keep-params) ---- */

/* Rows of the params table: step 0 the initial variables, step k those
 * after global step k (a restored run's first step counted from the
 * checkpoint). A row that cannot be queued is said once. */
static void h_keep_params(dsim_store *st, dsim_run_id id, const dsim_train_result *res)
{
    size_t n = res->n_params;
    dsim_err e = DSIM_OK;
    if (res->initial_params && n)
        e = dsim_store_params(st, id, res->first_step, res->initial_params, n);
    for (uint64_t k = 0; e == DSIM_OK && res->trace && res->trace_every <= 1 && n && k < res->steps;
         k++)
        e = dsim_store_params(st, id, res->first_step + k + 1, res->trace + k * n, n);
    if (e != DSIM_OK)
        dsim_warn("keep-params: the variables were not all stored: %s", dsim_errmsg());
}

/* ---- form ---- */

static void h_step_form(h_ctx *c)
{
    const h_opts *o = c->o;
    h_run *run = c->run;
    dsim_train_cfg *cfg = &c->cfg;
    if (o->keep_params && c->st) {
        cfg->record_params = true; /* the variables after every step: kept below */
        cfg->trace_every = 1;
    }
    run->store = c->st;
    run->id = c->out->run_id;
    run->progress = o->progress;
    run->progress_user = o->progress_user;
    run->total = o->progress ? dsim_train_cfg_steps(cfg) : 0;
    run->t0_ns = h_now_ns();
    run->replicas = c->R;
    run->devices_per_host = cfg->devices_per_host;
    /* Not where the engine forks: a thread of ours must not be running
     * when a child is forked from this process. */
    if (o->progress && c->R > 1 && !c->forks) {
        run->formed = calloc((size_t)c->R, sizeof *run->formed);
        for (int i = 0; run->formed && i < c->R; i++)
            atomic_init(&run->formed[i], 0);
    }
    atomic_init(&run->n_formed, 0);
    if (run->formed)
        (void)h_forming_start(run);
    cfg->observer = h_observer;
    cfg->observer_user = run;
    /* The phases' times for reports, where the steps' clock is
     * CLOCK_MONOTONIC (phase_rec.h): the hooks run in this process (an
     * engine in this address space on wall-clock time), or each child times
     * them and sends them here (an engine that forks, every task here). */
    bool forked_here = c->forks && !o->hosts; /* every child's records come here */
    if (c->st && (c->phases_here || forked_here) && !cfg->hooks)
        c->phases = h_phase_rec_create(c->R, run->total ? run->total : dsim_train_cfg_steps(cfg));
    if (c->phases && c->phases_here)
        h_phase_rec_attach(c->phases, cfg);
    /* The frames between ranks, for the trace's arrows: small jobs only
     * (msglog.h says which frames of them). */
    if (c->st && c->R + cfg->num_ps <= DSIM_MSG_LOG_MAX_RANKS && (!c->forks || forked_here) &&
        !cfg->transport_filter && dsim_msg_log_create(&c->msgs) != DSIM_OK)
        c->msgs = NULL;
}

/* ---- train ---- */

/* A job on a TPU slice under virtual time: its ICI is modelled. */
static bool h_tpu_modelled(const dsim_scenario *s, const dsim_engine_ops *eng)
{
    return s->train.tpu.replicas > 0 && (eng->flags & DSIM_ENGINE_VIRTUAL_TIME);
}

/* The job under sim/fault, restarts included. */
static void h_train_faulty(h_ctx *c)
{
    const dsim_scenario *s = c->s;
    dsim_harness_result *out = c->out;
    bool restart = s->recovery && strcmp(s->recovery, "restart") == 0;
    /* A TPU slice's ICI is modelled under virtual time only: on threads it
     * would only slow real frames down by microseconds, and the processes
     * engine's links are real. */
    bool modelled = (s->network_given && !(c->eng->flags & DSIM_ENGINE_REAL_LINKS)) ||
                    h_tpu_modelled(s, c->eng);
    dsim_recovery_opts ro = {
        .faults = s->faults,
        .n_faults = s->n_faults,
        .seed = c->cfg.seed,
        .restart = restart,
        .max_restarts = s->max_restarts,
        /* node_loss compares the recovered job with it; gradient_consistency
         * replays its steps when a restarted run parted from the reference */
        .want_clean = restart && (h_expects(s, "node_loss") ||
                                  (c->cfg.record_params && h_expects(s, "gradient_consistency"))),
        .engine = c->eng,
        .hosts = c->o->hosts,
        .net = modelled ? &c->net : NULL,
        .msgs = c->msgs,
        .on_phase = c->phases && !c->phases_here ? h_phase_rec_note : NULL,
        .on_phase_user = c->phases && !c->phases_here ? c->phases : NULL,
    };
    dsim_err fe = dsim_recovery_run_job(&c->cfg, &ro, &c->rr);
    if (fe != DSIM_OK) {
        out->train_err = fe;
        dsim_error_copy(&c->res.error);
        return;
    }
    dsim_recovery_run *rr = &c->rr;
    out->train_err = rr->err;
    c->res = rr->final; /* moved: rr no longer owns it */
    memset(&rr->final, 0, sizeof rr->final);
    const dsim_train_result *b = rr->has_broken ? &rr->broken : rr->err != DSIM_OK ? &c->res : NULL;
    size_t na = dsim_recovery_attempt_count(rr);
    c->attempts = calloc(na, sizeof *c->attempts);
    for (size_t k = 0; c->attempts && k < na; k++)
        c->attempts[k] = k + 1 == na ? &c->res : dsim_recovery_attempt(rr, k);
    c->cf = (dsim_check_faults){
        .broken = b,
        .broken_err = rr->has_broken ? rr->broken_err : rr->err,
        .lost_rank = rr->lost_rank,
        .t_loss = rr->t_loss,
        .bound_ns = h_detection_bound(s, b, rr->lost_rank),
        .restarts = rr->restarts,
        .recovery = restart,
        .clean = rr->has_clean && rr->clean_err == DSIM_OK ? &rr->clean : NULL,
        .checkpoint_path = c->cfg.checkpoint_path,
        .ckpt_state = rr->ckpt_state,
        .ckpt_step = rr->ckpt_step,
        .ckpt_msg = rr->ckpt_msg,
        .lost = rr->lost,
        .n_ranks = rr->n_ranks,
        .attempts = c->attempts,
        .resumed = (size_t)rr->n_resumed == na ? (const dsim_checkpoint *const *)rr->resumed : NULL,
        .n_attempts = c->attempts ? na : 0,
        .steps_rolled_back = rr->steps_rolled_back,
    };
    /* the broken attempt is the first (attempt 0) */
    size_t fired = 0;
    for (size_t i = 0; b && rr->event_attempt && i < rr->n_events; i++)
        fired += rr->event_attempt[i] == 0 && rr->events[i].fault >= 0;
    /* and no fault touched a frame in any attempt (a probability's drops
     * and delays are counted, not each told as an event); said only where
     * every replica returned, none killed (a process killed after a hang
     * takes its events with it) and the job was not preempted (the notice
     * is the fault) */
    dsim_err be = c->cf.broken_err;
    bool all_returned = b && b->replicas && b->num_replicas > 0;
    for (int q = 0; all_returned && q < b->num_replicas; q++)
        all_returned = b->replicas[q].t_end != 0 && !b->replicas[q].killed;
    c->cf.none_fired = all_returned && be != DSIM_EPREEMPTED && be != DSIM_EHUNG && fired == 0 &&
                       !dsim_faults_stats_touched(&rr->stats);
    /* the job ran through: did any fault fire, in any attempt? */
    size_t any = 0;
    for (size_t i = 0; !b && i < rr->n_events; i++)
        any += rr->events[i].fault >= 0;
    c->cf.none_touched = !b && any == 0 && rr->lost_rank < 0 && rr->restarts == 0 &&
                         !dsim_faults_stats_touched(&rr->stats);
}

static void h_step_train(h_ctx *c)
{
    const dsim_scenario *s = c->s;
    dsim_harness_result *out = c->out;
    c->net = (dsim_net_links){
        .inter_latency_ns = s->link_latency_ns,
        .inter_Bps = s->link_bandwidth_Bps,
        .intra_latency_ns = s->intra_latency_ns,
        .intra_Bps = s->intra_Bps,
    };
    if (s->train.tpu.replicas > 0) {
        c->net.tpu = &c->cfg.tpu;
        c->net.ici_latency_ns = s->tpu_ici_latency_ns;
        c->net.ici_Bps = s->tpu_ici_Bps;
        c->net.chip_latency_ns = s->tpu_chip_latency_ns;
        c->net.chip_Bps = s->tpu_chip_Bps;
    }
    /* auto on links the model times: the model's pick (sim/model/decide.c) */
    dsim_topology topo;
    if (c->cfg.communication == DSIM_ALGO_AUTO && dsim_scenario_topology(s, c->eng->name, &topo) &&
        dsim_cost_decider_create(&topo, &c->decider) == DSIM_OK) {
        c->cfg.decide = dsim_cost_decider_fn;
        c->cfg.decide_user = c->decider;
    }
    c->t_start = h_now_ns();
    if (c->faulty) {
        h_train_faulty(c);
    } else {
        if (c->msgs)
            dsim_msg_log_attach(c->msgs, &c->cfg);
        dsim_engine_attempt a = {0};
        dsim_engine_outcome eo;
        out->train_err = c->eng->train(&c->cfg, &a, &c->res, &eo);
        dsim_engine_outcome_free(&eo);
    }
    h_forming_stop(c->run);
    c->t_end = h_now_ns();
    out->restarts = c->rr.restarts;
    if (c->faulty && s->n_faults) {
        const dsim_faults_stats *fst = &c->rr.stats;
        snprintf(out->fault_summary, sizeof out->fault_summary,
                 "faults: %llu fired; of %llu messages %llu lost, %llu retransmitted, %llu held "
                 "back (delayed, paused, partitioned, or queued behind one), %llu duplicated, "
                 "%llu corrupted, %llu reordered",
                 (unsigned long long)fst->fired, (unsigned long long)fst->frames_seen,
                 (unsigned long long)fst->dropped, (unsigned long long)fst->retransmitted,
                 (unsigned long long)fst->held, (unsigned long long)fst->duplicated,
                 (unsigned long long)fst->corrupted, (unsigned long long)fst->reordered);
    }
    for (size_t i = 0; c->st && i < c->rr.n_events; i++) {
        const dsim_fault_event *ev = &c->rr.events[i];
        if (HG_STORE(dsim_store_event(c->st, out->run_id, ev->rank, ev->t_abs, DSIM_EVENT_FAULT,
                                      ev->text)) != DSIM_OK) {
            h_fail(out, "recording the fault events");
            break;
        }
    }
}

/* The phases and the frames the run recorded, stored and released. */
static void h_train_records(h_ctx *c)
{
    dsim_harness_result *out = c->out;
    /* A worker left stuck inside the phase hooks (a fault's pause) may still
     * call the recorder: then it is neither read nor freed. */
    bool in_hook = false;
    for (size_t i = 0; c->phases && i < c->res.n_stuck; i++)
        in_hook |=
            c->res.stuck[i].callback && strcmp(c->res.stuck[i].callback, "the phase hook") == 0;
    if (c->phases && !in_hook) {
        char xb[256];
        if (HG_STORE(h_phase_rec_store(c->phases, c->st, out->run_id,
                                       h_exchange(&c->cfg, &c->res, c->R, xb, sizeof xb),
                                       (uint64_t)c->res.n_params * sizeof(float))) != DSIM_OK)
            h_fail(out, "recording the phases");
        h_phase_rec_destroy(c->phases);
    }
    if (c->phases) {
        c->phases = NULL;
        c->cfg.hooks = NULL;
        c->cfg.hooks_user = NULL;
    }
    if (c->msgs) {
        if (HG_STORE(h_store_messages(c->msgs, c->st, out->run_id)) != DSIM_OK)
            h_fail(out, "recording the messages");
        /* a worker the watchdog left running may still send: the filter
         * keeps the log (dsim_train: transport_filter_user outlives it) */
        if (!c->res.n_stuck && !(c->rr.has_broken && c->rr.broken.n_stuck))
            dsim_msg_log_destroy(c->msgs);
        else
            h_keep_log(c->msgs);
        c->msgs = NULL;
        if (!c->faulty)
            c->cfg.transport_filter = NULL;
    }
}

/* What training came to: restarts and timeline, the figures, the last
 * progress call, where hung workers were. */
static void h_train_outcome(h_ctx *c)
{
    dsim_harness_result *out = c->out;
    dsim_recovery_run *rr = &c->rr;
    h_run *run = c->run;
    if (c->faulty && rr->restarts && c->st &&
        HG_STORE(dsim_store_event(c->st, out->run_id, -1, c->t_end, DSIM_EVENT_RESTART,
                                  rr->err == DSIM_OK ? "recovered after restarting every worker"
                                                     : "recovery gave up")) != DSIM_OK)
        h_fail(out, "recording the restarts");
    if (c->faulty && (rr->err != DSIM_OK || rr->restarts || rr->lost_rank >= 0)) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *mf = open_memstream(&buf, &blen);
        if (mf) {
            dsim_recovery_print_timeline(rr, mf);
            fclose(mf);
            out->timeline = buf;
        }
    }
    if (out->train_err != DSIM_OK && c->res.error.code == DSIM_OK) {
        /* failed before the driver filled the result: keep the thread's message */
        dsim_error_copy(&c->res.error);
    }
    out->wall_s = (double)(c->t_end - c->t_start) / 1e9;
    out->examples = atomic_load(&run->examples);
    out->examples_per_s = out->wall_s > 0 ? (double)out->examples / out->wall_s : 0;
    /* A failed run's result still holds the steps it was to take: count
     * the steps that were reported instead. */
    out->steps = out->train_err == DSIM_OK ? c->res.first_step + c->res.steps
                                           : atomic_load(&run->steps_seen);
    out->steps_rerun = c->rr.steps_rolled_back;
    out->final_loss = out->train_err == DSIM_OK ? c->res.final_loss : NAN;
    if (c->o->progress) {
        dsim_harness_progress p = {
            .step = out->steps,
            .total = run->total,
            .loss = NAN,
            .examples = out->examples,
            .elapsed_s = (double)(c->t_end - run->t0_ns) / 1e9,
            .finished = true,
        };
        c->o->progress(&p, c->o->progress_user);
    }
    if (atomic_load(&run->store_failed) && !out->harness_error) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "storing step rows: %s",
                 run->store_err);
    }
    c->hung = out->train_err == DSIM_EHUNG;
    if (c->hung && c->res.n_stuck) {
        out->stuck = malloc(c->res.n_stuck * sizeof *out->stuck);
        if (out->stuck) {
            memcpy(out->stuck, c->res.stuck, c->res.n_stuck * sizeof *out->stuck);
            out->n_stuck = c->res.n_stuck;
        }
        for (size_t i = 0; i < c->res.n_stuck; i++)
            c->in_observer |=
                c->res.stuck[i].callback && strcmp(c->res.stuck[i].callback, "the observer") == 0;
    }
}

/* ---- reference ---- */

/* Whether the checks need the one-device replay (a timing-only run's
 * baseline is the compute model's, not a replay). */
static bool h_needs_replay(const h_ctx *c)
{
    return c->cfg.synthetic_params == 0 && dsim_check_needs_reference(c->s);
}

/* What the replay runs: the job's configuration without the harness's
 * observer (it replays; it reports no steps). */
static void h_ref_cfg(const h_ctx *c, dsim_train_cfg *rc)
{
    *rc = c->cfg;
    rc->observer = NULL;
    rc->observer_user = NULL;
}

static void *h_ref_main(void *p)
{
    h_ref_thread *t = p;
    t->err = dsim_train_reference(&t->cfg, &t->res);
    return NULL;
}

/* The replay depends only on the configuration (the data, the seed, the
 * global batches), never on what the job computes, so it can run while the
 * job trains. It does where that costs the job nothing: on an engine with
 * virtual time every worker runs on this one OS thread and the run's times
 * are the compute model's, so a second CPU is idle and the replay cannot
 * disturb the times the checks judge. Elsewhere (threads, processes) the
 * workers' wall-clock times would be its victims: it runs after the job.
 * If the thread cannot start, it runs after the job too. */
static void h_ref_start(h_ctx *c)
{
    if (c->o->reference_after || !(c->eng->flags & DSIM_ENGINE_VIRTUAL_TIME) ||
        sysconf(_SC_NPROCESSORS_ONLN) < 2 || !h_needs_replay(c))
        return;
    h_ref_thread *t = calloc(1, sizeof *t);
    if (!t)
        return;
    h_ref_cfg(c, &t->cfg);
    if (pthread_create(&t->tid, NULL, h_ref_main, t) != 0) {
        free(t);
        return;
    }
    c->ref_thread = t;
}

/* The replay's result: the thread's, once it has finished, or made now. */
static dsim_err h_ref_finish(h_ctx *c, dsim_train_result *ref)
{
    h_ref_thread *t = c->ref_thread;
    if (!t) {
        dsim_train_cfg rc;
        h_ref_cfg(c, &rc);
        return dsim_train_reference(&rc, ref);
    }
    pthread_join(t->tid, NULL);
    c->ref_thread = NULL;
    *ref = t->res;
    dsim_err e = t->err;
    free(t);
    return e;
}

/* The run's error stored; or the one-device reference made (replayed, or
 * the compute model's for a timing-only run) when the checks need it. */
static void h_step_reference(h_ctx *c)
{
    dsim_harness_result *out = c->out;
    dsim_store *st = c->st;
    if (out->train_err != DSIM_OK) {
        if (c->ref_thread) {
            /* a replay started beside the job: the checks will not use it */
            dsim_train_result unused;
            (void)h_ref_finish(c, &unused);
            dsim_train_result_free(&unused);
        }
        snprintf(out->train_msg, sizeof out->train_msg, "%s", c->res.error.msg);
        if (!st)
            return;
        char *detail = NULL;
        json_t *ej = json_pack("{s:s, s:s, s:i}", "error", dsim_strerror(out->train_err), "message",
                               c->res.error.msg, "peer", c->res.error.peer);
        if (ej) {
            detail = json_dumps(ej, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(ej);
        }
        /* events share the steps' clock: the threads engine's is CLOCK_MONOTONIC */
        if (HG_STORE(dsim_store_event(st, out->run_id, -1, c->t_end, DSIM_EVENT_ERROR,
                                      detail ? detail : c->res.error.msg)) != DSIM_OK)
            h_fail(out, "recording the run's error");
        free(detail);
        if (c->hung)
            h_store_stuck(st, out, c->t_end);
        return;
    }
    if (c->cfg.synthetic_params > 0) {
        /* timing only: no replay to make, the baseline is the compute model's */
        c->have_ref = h_synthetic_reference(&c->cfg, &c->res, &c->ref) == DSIM_OK;
        return;
    }
    if (!h_needs_replay(c))
        return;
    out->reference_beside = c->ref_thread != NULL;
    if (h_ref_finish(c, &c->ref) != DSIM_OK) {
        snprintf(out->note, sizeof out->note, "the one-device reference failed: %s",
                 c->ref.error.msg);
        dsim_train_result_free(&c->ref);
        if (st)
            (void)HG_STORE(
                dsim_store_event(st, out->run_id, -1, h_now_ns(), DSIM_EVENT_ERROR, out->note));
        return;
    }
    c->have_ref = true;
    /* its loss per step, for the report's loss plot */
    for (uint64_t k = 0; st && c->ref.loss && k < c->ref.steps; k++)
        if (HG_STORE(dsim_store_reference_loss(st, out->run_id, k, c->ref.loss[k])) != DSIM_OK) {
            h_fail(out, "storing the reference's losses");
            break;
        }
    /* On a virtual clock the run's times are the compute model's: so are
     * the one-device baseline's, or scaling would compare two clocks. */
    if ((c->eng->flags & DSIM_ENGINE_VIRTUAL_TIME) && c->cfg.device_flops > 0 && c->ref.step_ns)
        for (uint64_t k = 0; k < c->ref.steps; k++)
            c->ref.step_ns[k] = (int64_t)(6.0 * (double)c->ref.n_params *
                                          (double)c->ref.examples[k] / c->cfg.device_flops * 1e9);
}

/* ---- judge ---- */

static void h_step_judge(h_ctx *c)
{
    const dsim_scenario *s = c->s;
    dsim_harness_result *out = c->out;
    if (c->st)
        h_store_phases(c->st, out, &c->res);
    size_t n = dsim_check_outcome_count(s);
    out->checks = calloc(n ? n : 1, sizeof *out->checks);
    dsim_check_ctx ctx = {
        .scenario = s,
        .cfg = &s->train,
        .run = &c->res,
        .reference = c->have_ref ? &c->ref : NULL,
        .run_err = out->train_err,
        .faults = c->faulty ? &c->cf : NULL,
    };
    if (!out->checks ||
        dsim_check_run_all(&ctx, out->checks, &out->n_checks, &out->n_failed) != DSIM_OK) {
        h_fail(out, "judging the run");
        out->n_checks = 0;
    }
    if (s->has_liveness && out->checks && !out->harness_error)
        c->live_hash = h_liveness(s, c->eng, &c->cfg, out);
}

/* ---- record ---- */

/* A run that failed, or failed a check, leaves its flight records (what
 * every rank's collectives came to) in the store's flight_records table and
 * as one JSON file next to the store, which `dsim trace desync` reads. */
static void h_record_flight(h_ctx *c)
{
    dsim_harness_result *out = c->out;
    const dsim_train_result *fr = c->faulty && c->rr.has_broken ? &c->rr.broken : &c->res;
    const char *why = fr == &c->res ? (out->train_err != DSIM_OK ? c->res.error.msg : NULL)
                                    : c->rr.broken.error.msg;
    if (h_store_flight(c->st, out->run_id, fr) != DSIM_OK)
        h_fail(out, "storing the flight records");
    dsim_flight_path(dsim_store_path(c->st), (uint64_t)out->run_id, out->flight_path,
                     sizeof out->flight_path);
    if (dsim_flight_write(out->flight_path, (uint64_t)out->run_id, c->s->name, fr, why,
                          c->cfg.timeout_ns) != DSIM_OK)
        out->flight_path[0] = '\0';
}

static void h_step_record(h_ctx *c)
{
    const dsim_scenario *s = c->s;
    dsim_harness_result *out = c->out;
    dsim_store *st = c->st;
    for (size_t i = 0; st && i < out->n_checks; i++) {
        const dsim_check_outcome *k = &out->checks[i];
        if (HG_STORE(dsim_store_check_row(st, out->run_id, k->name, k->passed, k->result.measured,
                                          k->result.expected, k->result.message, k->by_default)) !=
            DSIM_OK)
            h_fail(out, "storing the checks");
    }
    /* where the time went (the performance check's figures), every run */
    dsim_perf perf;
    if (dsim_perf_measure(&c->res, c->have_ref ? &c->ref : NULL, &perf) != DSIM_OK)
        dsim_perf_measure(NULL, NULL, &perf); /* all NaN */
    out->step_s = perf.step_s;
    out->exchange_s = perf.allreduce_share * perf.step_s;
    if (st)
        h_store_metrics(st, &c->cfg, &c->res, c->have_ref ? &c->ref : NULL, &perf, c->R, out);
    if (st && out->run_id && c->o->keep_params)
        h_keep_params(st, out->run_id, &c->res);
    if ((c->eng->flags & DSIM_ENGINE_VIRTUAL_TIME) && out->train_err == DSIM_OK &&
        (s->network_given || c->cfg.synthetic_params > 0 || h_tpu_modelled(s, c->eng)) &&
        c->R > 1 && c->cfg.num_ps == 0) {
        char xb[256];
        h_whatif_summary(s, &c->cfg, &perf, h_exchange(&c->cfg, &c->res, c->R, xb, sizeof xb), out);
    }
    if (st && out->run_id && (out->train_err != DSIM_OK || out->n_failed))
        h_record_flight(c);
    /* A hang is never what a scenario expects, whatever its checks say. A
     * task's process that died of its own signal crashed, as a replica
     * that crashes in this process does (there the crash guard stores it). */
    bool crashed = c->faulty && c->rr.crashed && out->train_err != DSIM_OK;
    out->status = out->harness_error ? DSIM_RUN_ERROR
                  : c->hung          ? DSIM_RUN_HUNG
                  : crashed          ? DSIM_RUN_CRASHED
                  : out->n_failed    ? DSIM_RUN_FAILED
                                     : DSIM_RUN_PASSED;
    out->deterministic = (c->eng->flags & DSIM_ENGINE_DETERMINISTIC) != 0;
    out->trace_hash = c->faulty ? c->rr.trace_hash : c->res.trace_hash;
    /* the liveness phase is part of the run's trace */
    out->trace_hash ^= c->live_hash * 0x9e3779b97f4a7c15ULL;
    out->trace_events = c->res.trace_events;
    for (int r = 0; c->res.replicas && r < c->res.num_replicas; r++)
        if (c->res.replicas[r].t_end - c->res.t_start > out->engine_ns)
            out->engine_ns = c->res.replicas[r].t_end - c->res.t_start;
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, out->trace_hash);
    if (st && HG_STORE(dsim_store_end_run(st, out->run_id, out->status,
                                          out->deterministic ? hash : NULL, 0)) != DSIM_OK) {
        h_fail(out, "ending the run in the results store");
        out->status = DSIM_RUN_ERROR;
    }
}

static void h_ctx_free(h_ctx *c)
{
    dsim_train_result_free(&c->res);
    if (c->have_ref)
        dsim_train_result_free(&c->ref);
    dsim_recovery_run_free(&c->rr);
    free(c->attempts);
    /* A worker stuck inside the observer, or left running, may still read
     * them. */
    if (!c->in_observer && !c->hung)
        dsim_cost_decider_destroy(c->decider);
    if (!c->in_observer) {
        h_forming_destroy(c->run);
        free(c->run->formed);
        free(c->run);
    }
}

void h_run_one(const dsim_scenario *s, const h_opts *o, const dsim_engine_ops *eng, dsim_store *st,
               int slot, dsim_harness_result *out)
{
    h_ctx c = {.s = s, .o = o, .eng = eng, .st = st, .slot = slot, .out = out, .cfg = s->train};
    if (o->grace_ns)
        c.cfg.watchdog_grace_ns = o->grace_ns;
    if (o->progress_timeout_ns)
        c.cfg.progress_timeout_ns = o->progress_timeout_ns;
    uint32_t every = h_trace_every(s, &c.cfg);
    if (every && !c.cfg.record_params) {
        c.cfg.record_params = true;
        c.cfg.trace_every = every;
    }
    c.cfg.record_grads = every && h_trace_grads(&c.cfg);
    /* The cost model: a replica's step computes at this rate. It moves the
     * virtual clock under sim (elsewhere it is only counted), so that steps
     * take time and a timeout counts from work done, not from time 0. */
    if (c.cfg.device_flops == 0)
        c.cfg.device_flops = H_DEVICE_FLOPS;
    c.R = c.cfg.hosts * c.cfg.devices_per_host;
    c.forks = (eng->flags & DSIM_ENGINE_FORKS) != 0;
    c.phases_here =
        (eng->flags & DSIM_ENGINE_ONE_SPACE) && !(eng->flags & DSIM_ENGINE_VIRTUAL_TIME);
    /* Faults or recovery, or tasks in processes (whose crashes and hangs
     * the recovery driver reads): the job runs under sim/fault. */
    c.faulty = c.forks || s->n_faults > 0 || s->network_given || h_tpu_modelled(s, eng) ||
               (s->recovery && strcmp(s->recovery, "restart") == 0);
    c.run = calloc(1, sizeof *c.run);
    if (!c.run) {
        dsim_set_error(DSIM_ENOMEM, -1, __FILE__, __LINE__, "out of memory");
        h_fail(out, "starting the run");
        out->status = DSIM_RUN_ERROR;
        return;
    }
    if (st && !h_step_store(&c)) {
        free(c.run);
        return;
    }
    h_step_form(&c);
    h_ref_start(&c);
    h_step_train(&c);
    h_train_records(&c);
    h_train_outcome(&c);
    h_step_reference(&c);
    h_step_judge(&c);
    h_step_record(&c);
    h_ctx_free(&c);
}
