/* Running a scenario: store it, train, replay the reference, judge, record.
 *
 * Every store call of a run goes through HG_STORE, which holds the guard
 * lock for reading; a thread that is about to end the process (an
 * interrupt) takes it for writing in dsim_harness_shutdown, so it closes
 * the stores only between calls, and no call starts afterwards. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "dsim/comm.h"
#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/health.h"
#include "diag/flight.h"
#include "fault/fault.h"
#include "harness.h"

/* ---- the guard: store calls against a process that is going down ---- */

/* Runs in progress whose stores a shutdown closes. */
#define HG_MAX_RUNS 64

static pthread_once_t hg_once = PTHREAD_ONCE_INIT;
static pthread_rwlock_t hg_lock;
static bool hg_down;                     /* under hg_lock: no store call any more */
static dsim_store *hg_runs[HG_MAX_RUNS]; /* under hg_lock (write) / hg_runs_mu */
static pthread_mutex_t hg_runs_mu = PTHREAD_MUTEX_INITIALIZER;

static void hg_init(void)
{
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* a shutdown must not starve behind a stream of step rows */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&hg_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
}

/* A store call of a run, refused once the process is going down. */
#define HG_STORE(call)                                                                             \
    ({                                                                                             \
        pthread_rwlock_rdlock(&hg_lock);                                                           \
        dsim_err hg_e_ =                                                                           \
            hg_down ? DSIM_ERR(DSIM_ESTATE, -1, "the process is shutting down") : (call);          \
        pthread_rwlock_unlock(&hg_lock);                                                           \
        hg_e_;                                                                                     \
    })

/* Registers the store of a run in progress; the slot, or -1 when the table
 * is full (the run then goes on unguarded: an interrupt leaves it 'running'
 * until the store is next opened, which marks it 'unfinished'). */
static int hg_run_add(dsim_store *st)
{
    int slot = -1;
    pthread_mutex_lock(&hg_runs_mu);
    for (int i = 0; i < HG_MAX_RUNS && slot < 0; i++) {
        if (!hg_runs[i]) {
            hg_runs[i] = st;
            slot = i;
        }
    }
    pthread_mutex_unlock(&hg_runs_mu);
    return slot;
}

static void hg_run_remove(int slot)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&hg_runs_mu);
    hg_runs[slot] = NULL;
    pthread_mutex_unlock(&hg_runs_mu);
}

void dsim_harness_shutdown(dsim_store *extra)
{
    pthread_once(&hg_once, hg_init);
    pthread_rwlock_wrlock(&hg_lock);
    if (hg_down)
        return;
    hg_down = true;
    dsim_store *closed[HG_MAX_RUNS + 1];
    int n = 0;
    pthread_mutex_lock(&hg_runs_mu);
    for (int i = 0; i <= HG_MAX_RUNS; i++) {
        dsim_store *st = i < HG_MAX_RUNS ? hg_runs[i] : extra;
        if (!st)
            continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++)
            seen = closed[k] == st;
        if (seen)
            continue;
        closed[n++] = st;
        (void)dsim_store_close(st);
    }
    pthread_mutex_unlock(&hg_runs_mu);
    /* The lock stays held: nothing may touch the closed stores. */
}

/* ---- preparing a scenario ---- */

typedef struct h_opts {
    dsim_store *store;
    const char *db_path;
    const char *engine;
    bool has_seed;
    uint64_t seed;
    dsim_harness_progress_fn progress;
    void *progress_user;
} h_opts;

static dsim_err h_opts_get(const dsim_harness_opts *o, h_opts *out)
{
    memset(out, 0, sizeof *out);
    if (!o)
        return DSIM_OK;
    if (o->size != sizeof(dsim_harness_opts))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "harness: opts.size is %zu; set it to sizeof(dsim_harness_opts) (%zu)",
                        o->size, sizeof(dsim_harness_opts));
    out->store = o->store;
    out->db_path = o->db_path;
    out->engine = o->engine_override;
    out->has_seed = o->has_seed;
    out->seed = o->seed;
    out->progress = o->progress;
    out->progress_user = o->progress_user;
    return DSIM_OK;
}

static const char *h_engine(const dsim_scenario *s)
{
    if (s->train.engine)
        return s->train.engine;
    return s->engine ? s->engine : "threads";
}

/* The checks every run needs, on a scenario with the overrides applied. */
static dsim_err h_check(const dsim_scenario *s)
{
    const char *eng = h_engine(s);
    if (strcmp(eng, "threads") != 0)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "%s: engine %s is not supported by this build yet (accepted: threads)",
                        s->path ? s->path : "(scenario)", eng);
    DSIM_CHECK(dsim_scenario_runnable(s));
    if (s->train.plugin_path &&
        dsim_strategy_load(s->train.strategy, s->train.plugin_path) != DSIM_OK) {
        dsim_error er;
        dsim_error_copy(&er);
        return DSIM_ERR(er.code, -1, "%s: strategy.plugin: %s", s->path ? s->path : "(scenario)",
                        er.msg);
    }
    return DSIM_OK;
}

dsim_err dsim_harness_prepare(dsim_scenario *s, const dsim_harness_opts *opts)
{
    if (!s)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_prepare: the scenario is NULL");
    h_opts o;
    DSIM_CHECK(h_opts_get(opts, &o));
    if (o.engine) {
        /* the scenario frees s->engine; train.engine points at it */
        char *eng = strdup(o.engine);
        if (!eng)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
        free(s->engine);
        s->engine = eng;
        s->train.engine = eng;
    }
    if (o.has_seed) {
        s->seed = o.seed;
        s->train.seed = o.seed;
        s->train.data.seed = o.seed;
    }
    return h_check(s);
}

/* ---- what is stored with a run ---- */

/* The resolved configuration, as stored with the run. */
static json_t *h_config_json(const dsim_scenario *s)
{
    const dsim_train_cfg *c = &s->train;
    json_t *hidden = json_array();
    for (size_t i = 0; i < c->model.n_hidden && i < DSIM_MODEL_MAX_HIDDEN; i++)
        json_array_append_new(hidden, json_integer((json_int_t)c->model.hidden[i]));
    json_t *expect = json_array();
    for (size_t i = 0; i < s->n_expect; i++) {
        const dsim_expect *e = &s->expect[i];
        if (!e->check)
            continue;
        json_t *vals = json_object();
        for (int k = 0; k < e->check->n_params; k++) {
            double v = e->values[k];
            json_object_set_new(vals, e->check->params[k].key,
                                isnan(v) ? json_null() : json_real(v));
        }
        json_array_append_new(expect, json_pack("{s:s, s:o, s:b}", "check", e->check->name,
                                                "values", vals, "expect_fail", e->expect_fail));
    }
    return json_pack(
        "{s:s, s:s?, s:s?, s:I, s:{s:i, s:i, s:i}, "
        "s:{s:s?, s:s?, s:s, s:s, s:I}, "
        "s:{s:s, s:s, s:I, s:I, s:o}, "
        "s:{s:s, s:f, s:f, s:b, s:f, s:f, s:f}, "
        "s:{s:s, s:I, s:I, s:I, s:f, s:I, s:b, s:s, s:s, s:I, s:I, s:b, s:b}, "
        "s:{s:s?, s:I}, s:o, s:s?}",
        "name", s->name, "description", s->description, "engine", s->engine, "seed",
        (json_int_t)s->seed, "cluster", "hosts", c->hosts, "devices_per_host", c->devices_per_host,
        "ps", c->num_ps, "strategy", "name", c->strategy, "plugin", c->plugin_path, "communication",
        dsim_algo_name(c->communication), "ps_mode", dsim_ps_mode_name(c->ps_mode), "timeout_ns",
        (json_int_t)c->timeout_ns, "model", "kind", dsim_model_kind_name(c->model.kind), "loss",
        dsim_loss_name(c->model.loss), "in_dim", (json_int_t)c->model.in_dim, "out_dim",
        (json_int_t)c->model.out_dim, "hidden", hidden, "optimizer", "kind",
        dsim_optim_kind_name(c->optim.kind), "learning_rate", c->optim.lr, "momentum",
        c->optim.momentum, "nesterov", c->optim.nesterov != 0, "beta1", c->optim.beta1, "beta2",
        c->optim.beta2, "epsilon", c->optim.epsilon, "data", "task",
        dsim_data_kind_name(c->data.kind), "examples", (json_int_t)c->data.n_examples, "features",
        (json_int_t)c->data.in_dim, "outputs", (json_int_t)c->data.out_dim, "noise", c->data.noise,
        "files", (json_int_t)(c->in_memory ? 0 : c->data.n_files), "in_memory", c->in_memory,
        "shard_policy", dsim_shard_policy_name(c->shard), "shard_hint",
        dsim_shard_hint_name(c->hint), "global_batch", (json_int_t)c->global_batch, "epochs",
        (json_int_t)c->epochs, "shuffle", c->shuffle, "drop_remainder", c->drop_remainder,
        "checkpoint", "path", c->checkpoint_path, "every", (json_int_t)c->checkpoint_every,
        "expect", expect, "expect_error", s->expect_error);
}

/* Steps the run will take, from worker 0's input (every worker takes the
 * same number); 0 when the input cannot be made (the run will say why). */
static uint64_t h_total_steps(const dsim_train_cfg *cfg)
{
    dsim_dataset_desc d;
    memset(&d, 0, sizeof d);
    uint32_t nf = cfg->in_memory ? 0 : (uint32_t)cfg->data.n_files;
    if (dsim_dataset_desc_init(&d, cfg->data.n_examples, nf, DSIM_FILES_CONTIGUOUS) != DSIM_OK)
        return 0;
    d.hint = cfg->hint;
    dsim_input_config ic = {
        .dataset = &d,
        .policy = cfg->shard,
        .global_batch = cfg->global_batch,
        .num_workers = cfg->hosts,
        .replicas_per_worker = cfg->devices_per_host,
        .worker = 0,
        .seed = cfg->seed,
        .shuffle = cfg->shuffle,
        .drop_remainder = cfg->drop_remainder,
        .epochs = cfg->epochs,
    };
    dsim_input *in = NULL;
    uint64_t total = 0;
    if (dsim_input_create(&ic, &in) == DSIM_OK) {
        total = dsim_input_steps_per_epoch(in) * cfg->epochs;
        dsim_input_destroy(in);
    }
    dsim_dataset_desc_release(&d);
    dsim_clear_error();
    return total;
}

static int64_t h_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- one run ---- */

/* What the observer shares with the run (heap: the workers reach it). */
typedef struct h_run {
    dsim_store *store; /* NULL: no store */
    dsim_run_id id;
    dsim_harness_progress_fn progress;
    void *progress_user;
    uint64_t total;
    int64_t t0_ns;
    atomic_uint_fast64_t examples;
    atomic_uint_fast64_t steps_seen; /* highest global step reported, + 1 */
    atomic_int store_failed;
    char store_err[400]; /* written once, by whoever sets store_failed */
} h_run;

static void h_observer(const dsim_train_step_info *info, void *user)
{
    h_run *r = user;
    if (r->store && !atomic_load(&r->store_failed)) {
        dsim_step_rec rec = {
            .replica = info->replica,
            .epoch = (int)info->epoch,
            .step = (int64_t)info->global_step,
            .loss = info->local_loss,
            .reduced_loss = info->loss,
            .checksum = info->checksum,
            .examples = (int64_t)info->examples,
            .t_start_ns = info->t_start,
            .t_end_ns = info->t_end,
        };
        dsim_err e = HG_STORE(dsim_store_step(r->store, r->id, &rec));
        if (e != DSIM_OK && atomic_exchange(&r->store_failed, 1) == 0)
            snprintf(r->store_err, sizeof r->store_err, "%s", dsim_errmsg());
    }
    uint64_t ex = atomic_fetch_add(&r->examples, info->examples) + info->examples;
    uint64_t seen = atomic_load(&r->steps_seen);
    while (info->global_step + 1 > seen &&
           !atomic_compare_exchange_weak(&r->steps_seen, &seen, info->global_step + 1))
        ;
    if (info->replica != 0 || !r->progress)
        return;
    dsim_harness_progress p = {
        .step = info->global_step + 1,
        .total = r->total,
        .loss = info->loss,
        .examples = ex,
        .elapsed_s = (double)(h_now_ns() - r->t0_ns) / 1e9,
    };
    r->progress(&p, r->progress_user);
}

static void h_fail(dsim_harness_result *out, const char *what)
{
    if (out->harness_error)
        return;
    out->harness_error = true;
    snprintf(out->harness_msg, sizeof out->harness_msg, "%s: %s", what, dsim_errmsg());
}

/* The run proper: the store (if any) is open and guarded. */
static bool h_expects(const dsim_scenario *s, const char *check)
{
    for (size_t i = 0; i < s->n_expect; i++)
        if (s->expect[i].check && strcmp(s->expect[i].check->name, check) == 0)
            return true;
    return false;
}

/* What the settings guarantee after a node is lost (dsim/health.h); the
 * health check runs only in jobs of two or more workers without parameter
 * servers. 0 when nothing bounds it. */
static int64_t h_detection_bound(const dsim_scenario *s)
{
    const dsim_train_cfg *t = &s->train;
    int64_t b = t->hosts >= 2 && t->num_ps == 0
                    ? dsim_detection_bound(t->timeout_ns, t->health_interval_ns,
                                           t->health_timeout_ns, t->health_retries)
                    : dsim_detection_bound_timeout(t->timeout_ns);
    return b == DSIM_NO_DEADLINE ? 0 : b;
}

/* Whether to keep every step's variables of the run and of the reference:
 * gradient_consistency explains a difference from them (how the updates
 * compare), when they fit in H_TRACE_MAX floats each. */
#define H_TRACE_MAX ((uint64_t)4 << 20)
static bool h_wants_trace(const dsim_scenario *s, const dsim_train_cfg *cfg)
{
    if (!h_expects(s, "gradient_consistency"))
        return false;
    dsim_model_spec m = cfg->model;
    if (m.in_dim == 0) {
        m.in_dim = cfg->data.in_dim;
        m.out_dim = cfg->data.out_dim;
    }
    uint64_t steps = h_total_steps(cfg), n = dsim_model_num_params(&m);
    return steps && n && steps <= H_TRACE_MAX / n;
}

static void h_run_one(const dsim_scenario *s, const h_opts *o, dsim_store *st,
                      dsim_harness_result *out)
{
    dsim_train_cfg cfg = s->train;
    cfg.record_params = cfg.record_params || h_wants_trace(s, &cfg);

    h_run *run = calloc(1, sizeof *run);
    if (!run) {
        dsim_set_error(DSIM_ENOMEM, -1, __FILE__, __LINE__, "out of memory");
        h_fail(out, "starting the run");
        out->status = DSIM_RUN_ERROR;
        return;
    }
    if (st) {
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
            .engine = h_engine(s),
            .strategy = cfg.strategy,
            .config_json = config,
        };
        dsim_err e = HG_STORE(dsim_store_begin_run(st, &info, &out->run_id));
        free(config);
        if (e != DSIM_OK) {
            h_fail(out, "beginning the run in the results store");
            out->status = DSIM_RUN_ERROR;
            free(run);
            return;
        }
    }
    int R = cfg.hosts * cfg.devices_per_host;
    for (int r = 0; st && r < R && !out->harness_error; r++) {
        int w = r / cfg.devices_per_host, d = r % cfg.devices_per_host;
        char dev[96], host[64];
        snprintf(dev, sizeof dev, "/job:worker/replica:0/task:%d/device:CPU:%d", w, d);
        snprintf(host, sizeof host, "worker-%d", w);
        if (HG_STORE(dsim_store_replica(st, out->run_id, r, w, dev, host)) != DSIM_OK)
            h_fail(out, "recording the replicas");
    }

    run->store = st;
    run->id = out->run_id;
    run->progress = o->progress;
    run->progress_user = o->progress_user;
    run->total = o->progress ? h_total_steps(&cfg) : 0;
    run->t0_ns = h_now_ns();
    cfg.observer = h_observer;
    cfg.observer_user = run;

    dsim_train_result res, ref;
    memset(&res, 0, sizeof res);
    memset(&ref, 0, sizeof ref);
    bool have_ref = false;
    /* Faults or recovery: the job runs under sim/fault, restarts included. */
    bool faulty = s->n_faults > 0 || (s->recovery && strcmp(s->recovery, "restart") == 0);
    dsim_recovery_run rr;
    memset(&rr, 0, sizeof rr);
    dsim_check_faults cf;
    memset(&cf, 0, sizeof cf);
    int64_t t_start = h_now_ns();
    if (faulty) {
        bool restart = s->recovery && strcmp(s->recovery, "restart") == 0;
        dsim_recovery_opts ro = {
            .faults = s->faults,
            .n_faults = s->n_faults,
            .seed = cfg.seed,
            .restart = restart,
            .max_restarts = s->max_restarts,
            .want_clean = restart && h_expects(s, "node_loss"),
        };
        dsim_err fe = dsim_recovery_run_job(&cfg, &ro, &rr);
        if (fe != DSIM_OK) {
            out->train_err = fe;
            dsim_error_copy(&res.error);
        } else {
            out->train_err = rr.err;
            res = rr.final; /* moved: rr no longer owns it */
            memset(&rr.final, 0, sizeof rr.final);
            const dsim_train_result *b = rr.has_broken ? &rr.broken
                                         : rr.err != DSIM_OK ? &res
                                                             : NULL;
            cf = (dsim_check_faults){
                .broken = b,
                .broken_err = rr.has_broken ? rr.broken_err : rr.err,
                .lost_rank = rr.lost_rank,
                .t_loss = rr.t_loss,
                .bound_ns = h_detection_bound(s),
                .restarts = rr.restarts,
                .recovery = restart,
                .clean = rr.has_clean && rr.clean_err == DSIM_OK ? &rr.clean : NULL,
                .checkpoint_path = cfg.checkpoint_path,
                .ckpt_state = rr.ckpt_state,
                .ckpt_step = rr.ckpt_step,
                .ckpt_msg = rr.ckpt_msg,
            };
        }
    } else {
        out->train_err = dsim_train(&cfg, &res);
    }
    int64_t t_end = h_now_ns();
    out->restarts = rr.restarts;
    if (faulty) {
        const dsim_faults_stats *fst = &rr.stats;
        snprintf(out->fault_summary, sizeof out->fault_summary,
                 "faults: %llu fired; of %llu messages %llu lost, %llu retransmitted, %llu held "
                 "back (delayed, paused, partitioned, or queued behind one), %llu duplicated, "
                 "%llu corrupted, %llu reordered",
                 (unsigned long long)fst->fired, (unsigned long long)fst->frames_seen,
                 (unsigned long long)fst->dropped, (unsigned long long)fst->retransmitted,
                 (unsigned long long)fst->held,
                 (unsigned long long)fst->duplicated, (unsigned long long)fst->corrupted,
                 (unsigned long long)fst->reordered);
    }
    for (size_t i = 0; st && i < rr.n_events; i++) {
        const dsim_fault_event *ev = &rr.events[i];
        if (HG_STORE(dsim_store_event(st, out->run_id, ev->rank, ev->t_abs, DSIM_EVENT_FAULT,
                                      ev->text)) != DSIM_OK) {
            h_fail(out, "recording the fault events");
            break;
        }
    }
    if (faulty && rr.restarts && st &&
        HG_STORE(dsim_store_event(st, out->run_id, -1, t_end, DSIM_EVENT_RESTART,
                                  rr.err == DSIM_OK ? "recovered after restarting every worker"
                                                    : "recovery gave up")) != DSIM_OK)
        h_fail(out, "recording the restarts");
    if (faulty && (rr.err != DSIM_OK || rr.restarts || rr.lost_rank >= 0)) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *mf = open_memstream(&buf, &blen);
        if (mf) {
            dsim_recovery_print_timeline(&rr, mf);
            fclose(mf);
            out->timeline = buf;
        }
    }
    if (out->train_err != DSIM_OK && res.error.code == DSIM_OK) {
        /* failed before the driver filled the result: keep the thread's message */
        dsim_error_copy(&res.error);
    }
    out->wall_s = (double)(t_end - t_start) / 1e9;
    out->examples = atomic_load(&run->examples);
    out->examples_per_s = out->wall_s > 0 ? (double)out->examples / out->wall_s : 0;
    /* A failed run's result still holds the steps it was to take: count
     * the steps that were reported instead. */
    out->steps = out->train_err == DSIM_OK ? res.steps : atomic_load(&run->steps_seen);
    out->final_loss = out->train_err == DSIM_OK ? res.final_loss : NAN;
    if (o->progress) {
        dsim_harness_progress p = {
            .step = out->steps,
            .total = run->total,
            .loss = NAN,
            .examples = out->examples,
            .elapsed_s = (double)(t_end - run->t0_ns) / 1e9,
            .finished = true,
        };
        o->progress(&p, o->progress_user);
    }
    if (atomic_load(&run->store_failed) && !out->harness_error) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "storing step rows: %s",
                 run->store_err);
    }

    if (out->train_err != DSIM_OK) {
        snprintf(out->train_msg, sizeof out->train_msg, "%s", res.error.msg);
        if (st) {
            char *detail = NULL;
            json_t *ej = json_pack("{s:s, s:s, s:i}", "error", dsim_strerror(out->train_err),
                                   "message", res.error.msg, "peer", res.error.peer);
            if (ej) {
                detail = json_dumps(ej, JSON_COMPACT | JSON_PRESERVE_ORDER);
                json_decref(ej);
            }
            /* events share the steps' clock: the threads engine's is CLOCK_MONOTONIC */
            if (HG_STORE(dsim_store_event(st, out->run_id, -1, t_end, DSIM_EVENT_ERROR,
                                          detail ? detail : res.error.msg)) != DSIM_OK)
                h_fail(out, "recording the run's error");
            free(detail);
        }
    } else if (dsim_check_needs_reference(s)) {
        dsim_train_cfg rc = cfg;
        rc.observer = NULL;
        rc.observer_user = NULL;
        rc.record_params = cfg.record_params;
        if (dsim_train_reference(&rc, &ref) == DSIM_OK) {
            have_ref = true;
        } else {
            snprintf(out->note, sizeof out->note, "the one-device reference failed: %s",
                     dsim_errmsg());
            if (st)
                (void)HG_STORE(
                    dsim_store_event(st, out->run_id, -1, h_now_ns(), DSIM_EVENT_ERROR, out->note));
        }
    }

    size_t n = dsim_check_outcome_count(s);
    out->checks = calloc(n ? n : 1, sizeof *out->checks);
    dsim_check_ctx ctx = {
        .scenario = s,
        .cfg = &s->train,
        .run = &res,
        .reference = have_ref ? &ref : NULL,
        .run_err = out->train_err,
        .faults = faulty ? &cf : NULL,
    };
    if (!out->checks ||
        dsim_check_run_all(&ctx, out->checks, &out->n_checks, &out->n_failed) != DSIM_OK) {
        h_fail(out, "judging the run");
        out->n_checks = 0;
    }
    for (size_t i = 0; st && i < out->n_checks; i++) {
        const dsim_check_outcome *c = &out->checks[i];
        if (HG_STORE(dsim_store_check(st, out->run_id, c->name, c->passed, c->result.measured,
                                      c->result.expected, c->result.message)) != DSIM_OK)
            h_fail(out, "storing the checks");
    }

    struct {
        const char *name;
        double value;
        const char *unit;
    } m[] = {
        {"wall_time", out->wall_s, "s"},
        {"examples_per_s", out->examples_per_s, "examples/s"},
        {"steps", (double)out->steps, "steps"},
        {"examples", (double)out->examples, "examples"},
        {"replicas", (double)R, "replicas"},
        {"initial_loss", out->train_err == DSIM_OK ? res.initial_loss : NAN, "loss"},
        {"final_loss", out->final_loss, "loss"},
        {"reference_final_loss", have_ref ? ref.final_loss : NAN, "loss"},
    };
    for (size_t i = 0; st && i < sizeof m / sizeof m[0]; i++) {
        if (isnan(m[i].value))
            continue;
        if (HG_STORE(dsim_store_metric(st, out->run_id, m[i].name, m[i].value, m[i].unit, -1)) !=
            DSIM_OK)
            h_fail(out, "storing the metrics");
    }
    if (st && cfg.num_ps > 0 && out->train_err == DSIM_OK &&
        HG_STORE(dsim_store_metric(st, out->run_id, "max_staleness", (double)res.max_staleness,
                                   "updates", -1)) != DSIM_OK)
        h_fail(out, "storing the metrics");
    if (st && R > 1 && cfg.num_ps == 0 && out->train_err == DSIM_OK) {
        /* the algorithm's name goes in the unit column: a metric is a number */
        dsim_algo a = cfg.communication;
        if (a == DSIM_ALGO_AUTO)
            a = dsim_allreduce_decide(res.n_params * sizeof(float), R);
        if (HG_STORE(dsim_store_metric(st, out->run_id, "allreduce_algorithm", (double)a,
                                       dsim_algo_name(a), -1)) != DSIM_OK)
            h_fail(out, "storing the metrics");
    }

    /* A run that failed, or failed a check, leaves its flight records
     * (what every rank's collectives came to) next to the store, for
     * `dsim trace desync`; the store has no table for them yet. */
    if (st && out->run_id && (out->train_err != DSIM_OK || out->n_failed)) {
        const dsim_train_result *fr = faulty && rr.has_broken ? &rr.broken : &res;
        const char *why = fr == &res ? (out->train_err != DSIM_OK ? res.error.msg : NULL)
                                     : rr.broken.error.msg;
        dsim_flight_path(dsim_store_path(st), (uint64_t)out->run_id, out->flight_path,
                         sizeof out->flight_path);
        if (dsim_flight_write(out->flight_path, (uint64_t)out->run_id, s->name, fr, why,
                              cfg.timeout_ns) != DSIM_OK)
            out->flight_path[0] = '\0';
    }

    out->status = out->harness_error ? DSIM_RUN_ERROR
                  : out->n_failed    ? DSIM_RUN_FAILED
                                     : DSIM_RUN_PASSED;
    if (st && HG_STORE(dsim_store_end_run(st, out->run_id, out->status, NULL, 0)) != DSIM_OK) {
        h_fail(out, "ending the run in the results store");
        out->status = DSIM_RUN_ERROR;
    }
    dsim_train_result_free(&res);
    if (have_ref)
        dsim_train_result_free(&ref);
    dsim_recovery_run_free(&rr);
    free(run);
}

dsim_err dsim_harness_run(const dsim_scenario *s, const dsim_harness_opts *opts,
                          dsim_harness_result *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run: out is NULL");
    memset(out, 0, sizeof *out);
    out->final_loss = NAN;
    out->status = DSIM_RUN_ERROR;
    pthread_once(&hg_once, hg_init);
    h_opts o;
    memset(&o, 0, sizeof o);
    dsim_err e = s ? h_opts_get(opts, &o)
                   : DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run: the scenario is NULL");
    /* The overrides go on a private copy: the scenario stays the caller's. */
    dsim_scenario sc;
    if (e == DSIM_OK) {
        sc = *s;
        if (o.engine) {
            sc.engine = (char *)o.engine;
            sc.train.engine = o.engine;
        }
        if (o.has_seed) {
            sc.seed = o.seed;
            sc.train.seed = o.seed;
            sc.train.data.seed = o.seed;
        }
        e = h_check(&sc);
    }
    dsim_store *st = o.store, *owned = NULL;
    if (e == DSIM_OK && !st && o.db_path) {
        e = dsim_store_open(o.db_path, &owned);
        st = owned;
    }
    if (e != DSIM_OK) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
        return e;
    }
    int slot = st ? hg_run_add(st) : -1;
    h_run_one(&sc, &o, st, out);
    hg_run_remove(slot);
    e = out->harness_error ? DSIM_EIO : DSIM_OK;
    if (owned) {
        /* Unless a shutdown closed it already; it cannot start while we hold
         * the lock, and the store is no longer in its table. */
        pthread_rwlock_rdlock(&hg_lock);
        if (!hg_down && dsim_store_close(owned) != DSIM_OK && !out->harness_error) {
            h_fail(out, "closing the results store");
            e = DSIM_EIO;
        }
        pthread_rwlock_unlock(&hg_lock);
    }
    if (e != DSIM_OK)
        dsim_set_error(e, -1, __FILE__, __LINE__, "%s", out->harness_msg);
    return e;
}

dsim_err dsim_harness_run_text(const char *path, const char *text, size_t len,
                               const dsim_harness_opts *opts, dsim_harness_result *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run_text: out is NULL");
    memset(out, 0, sizeof *out);
    out->final_loss = NAN;
    out->status = DSIM_RUN_ERROR;
    dsim_scenario *s = NULL;
    dsim_err e = text ? dsim_scenario_parse(path ? path : "(text)", text, len, &s)
                      : DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run_text: text is NULL");
    if (e != DSIM_OK) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
        return e;
    }
    e = dsim_harness_run(s, opts, out);
    dsim_scenario_free(s);
    return e;
}

void dsim_harness_result_free(dsim_harness_result *r)
{
    if (!r)
        return;
    free(r->checks);
    r->checks = NULL;
    r->n_checks = r->n_failed = 0;
    free(r->timeline);
    r->timeline = NULL;
}
