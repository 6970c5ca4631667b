/* What is stored with a run (harness_int.h): its resolved configuration,
 * the flight records, where stuck workers were, the start-up phases, the
 * frames between ranks, the metrics and the what-if lines. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "diag/flight.h"
#include "dsim/comm.h"
#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/spi/model.h"
#include "harness_int.h"
#include "report/report.h"
#include "scenario/plan.h"

/* ---- what is stored with a run ---- */

/* data.source (the files as resolved, absolute where realpath could) and
 * the scenario file's own absolute path, so that `dsim export` and `dsim
 * replay` resolve the relative paths of the stored text as the run did. */
static void h_config_source(const dsim_scenario *s, json_t *cfg)
{
    if (!cfg)
        return;
    char *file = s->path ? realpath(s->path, NULL) : NULL;
    if (file)
        json_object_set_new(cfg, "scenario_file", json_string(file));
    free(file);
    json_t *model = json_object_get(cfg, "model");
    if (model && s->model_plugin) {
        char *mp = realpath(s->model_plugin, NULL);
        json_object_set_new(model, "plugin", json_string(mp ? mp : s->model_plugin));
        if (s->train.model.plugin)
            json_object_set_new(model, "plugin_name", json_string(s->train.model.plugin->name));
        free(mp);
    }
    json_t *data = json_object_get(cfg, "data");
    if (!data || (!s->data_x && !s->data_csv))
        return;
    json_t *labels = json_array();
    for (size_t i = 0; i < s->n_data_labels; i++)
        json_array_append_new(labels, json_string(s->data_labels[i]));
    json_object_set_new(data, "source",
                        json_pack("{s:s?, s:s?, s:s?, s:o}", "x", s->data_x, "y", s->data_y, "csv",
                                  s->data_csv, "label_columns", labels));
}

/* The resolved configuration, as stored with the run. */
json_t *h_config_json(const dsim_scenario *s)
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
    json_t *cfg = json_pack(
        "{s:s, s:s?, s:s?, s:I, s:{s:i, s:i, s:i}, "
        "s:{s:s?, s:s?, s:s, s:s, s:I}, "
        "s:{s:s, s:s, s:I, s:I, s:o}, "
        "s:{s:s, s:f, s:f, s:b, s:f, s:f, s:f, s:f, s:f, s:f}, "
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
        c->optim.beta2, "epsilon", c->optim.epsilon, "clipvalue", c->optim.clipvalue,
        "global_clipnorm", c->optim.global_clipnorm, "weight_decay", c->optim.weight_decay, "data",
        "task", dsim_data_kind_name(c->data.kind), "examples", (json_int_t)c->data.n_examples,
        "features", (json_int_t)c->data.in_dim, "outputs", (json_int_t)c->data.out_dim, "noise",
        c->data.noise, "files", (json_int_t)(c->in_memory ? 0 : c->data.n_files), "in_memory",
        c->in_memory, "shard_policy", dsim_shard_policy_name(c->shard), "shard_hint",
        dsim_shard_hint_name(c->hint), "global_batch", (json_int_t)c->global_batch, "epochs",
        (json_int_t)c->epochs, "shuffle", c->shuffle, "drop_remainder", c->drop_remainder,
        "checkpoint", "path", c->checkpoint_path, "every", (json_int_t)c->checkpoint_every,
        "expect", expect, "expect_error", s->expect_error);
    if (cfg && (c->precision > DSIM_POLICY_FLOAT32 || c->gradient_dtype != DSIM_F32))
        json_object_set_new(cfg, "mixed_precision",
                            json_pack("{s:s, s:s}", "policy",
                                      dsim_precision_policy_name(c->precision), "gradient_dtype",
                                      dsim_precision_dtype_name(c->gradient_dtype)));
    json_t *sched = cfg ? dsim_schedule_json(&c->optim) : NULL;
    if (sched)
        json_object_set_new(json_object_get(cfg, "optimizer"), "schedule", sched);
    if (cfg && c->optim.gradient_accumulation_steps > 1)
        json_object_set_new(json_object_get(cfg, "optimizer"), "gradient_accumulation_steps",
                            json_integer(c->optim.gradient_accumulation_steps));
    if (cfg && c->optim.kind == DSIM_OPTIM_RMSPROP)
        json_object_update_new(
            json_object_get(cfg, "optimizer"),
            json_pack("{s:f, s:b}", "rho", c->optim.rho, "centered", c->optim.centered != 0));
    if (cfg && c->optim.kind == DSIM_OPTIM_ADAGRAD)
        json_object_set_new(json_object_get(cfg, "optimizer"), "initial_accumulator_value",
                            json_real(c->optim.initial_accumulator_value));
    if (cfg && c->optim.kind == DSIM_OPTIM_ADAM && c->optim.amsgrad)
        json_object_set_new(json_object_get(cfg, "optimizer"), "amsgrad", json_true());
    h_config_source(s, cfg);
    return cfg;
}

/* The run proper: the store (if any) is open and guarded. */
bool h_expects(const dsim_scenario *s, const char *check)
{
    for (size_t i = 0; i < s->n_expect; i++)
        if (s->expect[i].check && strcmp(s->expect[i].check->name, check) == 0)
            return true;
    return false;
}

/* Stores every replica's flight recorder, one flight_records row per call
 * it kept. */
dsim_err h_store_flight(dsim_store *st, dsim_run_id run, const dsim_train_result *res)
{
    for (int r = 0; res->flight && r < res->n_flight; r++) {
        const dsim_fr_dump *d = &res->flight[r];
        for (size_t i = 0; i < d->n; i++) {
            const dsim_fr_entry *e = &d->entries[i];
            const dsim_coll_fp *fp = &e->fp;
            bool has_root = fp->coll == DSIM_COLL_BROADCAST || fp->coll == DSIM_COLL_REDUCE;
            bool has_op = fp->coll == DSIM_COLL_ALLREDUCE || fp->coll == DSIM_COLL_REDUCE ||
                          fp->coll == DSIM_COLL_REDUCE_SCATTER;
            dsim_flight_rec fr = {
                /* the replica: a sub-communicator's rank is its world rank */
                .replica = d->origin != DSIM_COMM_ORIGIN_CREATE ? d->world_rank : d->rank,
                .record_id = d->calls - d->n + i,
                .pg_id = d->comm_id,
                .collective_seq_id = fp->seq,
                .profiling_name = dsim_flight_profiling_name(fp->coll),
                .input_count = fp->coll == DSIM_COLL_BARRIER ? -1 : (int64_t)fp->count,
                .input_dtype =
                    fp->coll == DSIM_COLL_BARRIER ? NULL : dsim_flight_dtype_name(fp->dtype),
                .reduce_op =
                    has_op && fp->op < DSIM_OP_COUNT ? dsim_op_name((dsim_op)fp->op) : NULL,
                .root = has_root ? fp->root : -1,
                .algorithm = dsim_algo_name((dsim_algo)fp->algo),
                .state = dsim_fr_state_name((dsim_fr_state)e->state),
                .waiting_for = e->waiting_for,
                .error = e->error ? dsim_strerror((dsim_err)e->error) : NULL,
                .time_created_ns = e->t_created,
                .time_started_ns = e->t_started,
                .time_completed_ns = e->t_completed,
            };
            DSIM_CHECK(HG_STORE(dsim_store_flight(st, run, &fr)));
        }
    }
    return DSIM_OK;
}

/* Stores where each worker left running was, one error event each. */
void h_store_stuck(dsim_store *st, const dsim_harness_result *out, int64_t t)
{
    for (size_t i = 0; i < out->n_stuck; i++) {
        const dsim_train_stuck *k = &out->stuck[i];
        char where[256];
        dsim_train_stuck_describe(k, where, sizeof where);
        json_t *ev = json_pack("{s:s, s:i, s:i, s:s, s:I, s:s?, s:I, s:s?, s:s}", "error", "hung",
                               "replica", k->where.replica, "server", k->where.server, "phase",
                               dsim_phase_name(k->where.phase), "global_step",
                               (json_int_t)k->where.global_step, "collective", k->collective,
                               "collective_calls", (json_int_t)k->collective_calls, "callback",
                               k->callback, "message", where);
        char *detail = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(ev);
        (void)HG_STORE(dsim_store_event(st, out->run_id,
                                        k->where.server < 0 ? k->where.replica : -1, t,
                                        DSIM_EVENT_ERROR, detail ? detail : where));
        free(detail);
    }
}

/* Cold start: one phase event per replica that started, at the time it
 * entered rendezvous, with the times (s from the job's start) it first
 * entered each start-up phase and finished its first step. */
void h_store_phases(dsim_store *st, dsim_harness_result *out, const dsim_train_result *r)
{
    static const dsim_phase ph[] = {DSIM_PHASE_START, DSIM_PHASE_RENDEZVOUS, DSIM_PHASE_RESTORE,
                                    DSIM_PHASE_CREATE_VARIABLES, DSIM_PHASE_COMPUTE};
    for (int i = 0; r->replicas && i < r->num_replicas; i++) {
        const dsim_train_replica_end *e = &r->replicas[i];
        if (!e->t_first[DSIM_PHASE_START])
            continue;
        json_t *j = json_object();
        for (size_t k = 0; j && k < sizeof ph / sizeof ph[0]; k++)
            if (e->t_first[ph[k]])
                json_object_set_new(j, dsim_phase_name(ph[k]),
                                    json_real((double)(e->t_first[ph[k]] - r->t_start) / 1e9));
        if (j && e->t_first_step)
            json_object_set_new(j, "first_step_done",
                                json_real((double)(e->t_first_step - r->t_start) / 1e9));
        json_t *ev = j ? json_pack("{s:s, s:o}", "cold_start", "phases", "t_s", j) : NULL;
        if (ev && e->conn_count > 0)
            /* connection set-up per peer, by the end of its first step */
            json_object_set_new(ev, "connect",
                                json_pack("{s:i, s:f, s:f, s:i, s:b}", "connections", e->conn_count,
                                          "slowest_s", (double)e->conn_max_ns / 1e9, "total_s",
                                          (double)e->conn_total_ns / 1e9, "slowest_peer",
                                          e->conn_slowest_peer, "modelled", e->conn_modelled));
        char *detail = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(ev);
        dsim_err e2 = HG_STORE(dsim_store_event(st, out->run_id, i, e->t_first[DSIM_PHASE_START],
                                                DSIM_EVENT_PHASE, detail ? detail : "cold start"));
        free(detail);
        if (e2 != DSIM_OK) {
            h_fail(out, "recording the start-up phases");
            return;
        }
    }
}

_Static_assert(DSIM_TRACE_MSG_MAX_RANKS == DSIM_MSG_LOG_MAX_RANKS &&
                   DSIM_TRACE_MSG_PER_LINK == DSIM_MSG_LOG_PER_LINK,
               "dsim trace states the message log's rule: keep report.h and msglog.h alike");

/* The frames the log joined, and how many it left out (metric
 * messages_not_logged, when there were any). */
/* Message logs that a worker left running may still write to: kept for the
 * life of the process, and known to be (a leak checker sees them here). */
static dsim_msg_log *h_kept_logs[64];
static atomic_int h_n_kept_logs;

void h_keep_log(dsim_msg_log *log)
{
    int i = atomic_fetch_add(&h_n_kept_logs, 1);
    if (i < (int)(sizeof h_kept_logs / sizeof h_kept_logs[0]))
        h_kept_logs[i] = log;
}

dsim_err h_store_messages(dsim_msg_log *log, dsim_store *st, dsim_run_id run)
{
    dsim_msg_rec *m = NULL;
    size_t n = 0;
    uint64_t dropped = 0;
    DSIM_CHECK(dsim_msg_log_join(log, &m, &n, &dropped));
    dsim_err e = DSIM_OK;
    for (size_t i = 0; i < n && e == DSIM_OK; i++) {
        dsim_msg_row row = {.attempt = m[i].attempt,
                            .src = m[i].src,
                            .dst = m[i].dst,
                            .comm_id = m[i].comm_id,
                            .tag = m[i].tag,
                            .seq = m[i].seq,
                            .bytes = m[i].bytes,
                            .t_sent_ns = m[i].t_sent_ns,
                            .t_recv_ns = m[i].t_recv_ns};
        e = dsim_store_message(st, run, &row);
    }
    free(m);
    if (e == DSIM_OK && dropped)
        e = dsim_store_metric(st, run, "messages_not_logged", (double)dropped, "frames", -1);
    return e;
}

/* The bytes of gradients a replica all-reduces each step. */
size_t h_grad_bytes(const dsim_train_cfg *cfg, const dsim_train_result *res)
{
    if (cfg->synthetic_params > 0)
        return (size_t)llround(cfg->synthetic_params) * sizeof(float);
    return res->n_params * sizeof(float);
}

const char *h_exchange(const dsim_train_cfg *cfg, const dsim_train_result *res, int R, char *buf,
                       size_t cap)
{
    if (res->exchange[0]) {
        snprintf(buf, cap, "%s", res->exchange);
        return buf;
    }
    if (R < 2 || cfg->num_ps > 0)
        return NULL;
    dsim_algo a = cfg->communication;
    size_t bytes = h_grad_bytes(cfg, res);
    if (a == DSIM_ALGO_AUTO && bytes && cfg->decide) /* as the world decided */
        a = cfg->decide(cfg->decide_user, bytes, R, cfg->hosts, cfg->devices_per_host);
    if (a == DSIM_ALGO_AUTO && bytes)
        a = dsim_allreduce_decide_hosts(bytes, cfg->hosts, cfg->devices_per_host);
    if (a == DSIM_ALGO_AUTO)
        return NULL;
    snprintf(buf, cap, "%s", dsim_algo_name(a));
    return buf;
}

/* out->whatif: what the modelled cluster would take, and the sources. */
void h_whatif_summary(const dsim_scenario *s, const dsim_train_cfg *cfg, const dsim_perf *perf,
                      const char *exchange, dsim_harness_result *out)
{
    char *w = out->whatif;
    size_t cap = sizeof out->whatif, n = 0;
    double speed = perf->reference_step_s > 0 && perf->step_s > 0
                       ? perf->reference_step_s / perf->step_s
                       : NAN;
    const char *dev = s->device_preset ? s->device_preset : "device";
    /* a bare algorithm's name: the world all-reduce the scenario asked for
     * (or auto picked); anything else: the strategy's own exchange */
    dsim_algo a;
    dsim_error saved;
    dsim_error_copy(&saved);
    bool bare = exchange && dsim_algo_parse(exchange, &a) == DSIM_OK;
    dsim_error_restore(&saved);
    n += (size_t)snprintf(w + n, cap - n,
                          "what-if: step %.2f ms (compute %.2f ms), all-reduce %.0f %% of the "
                          "step; speed-up %.2fx over one %s (scaling efficiency %.2f); %s %s%s\n",
                          perf->step_s * 1e3, perf->compute_s * 1e3, 100 * perf->allreduce_share,
                          speed, dev, perf->scaling_efficiency,
                          bare ? "all-reduce algorithm" : "exchange", exchange ? exchange : "none",
                          !bare ? " (the strategy's own)"
                          : cfg->communication == DSIM_ALGO_AUTO && cfg->decide
                              ? " (auto: the cost model's pick for these links)"
                          : cfg->communication == DSIM_ALGO_AUTO ? " (dsim's decision function)"
                                                                 : " (the scenario's)");
    if (n >= cap)
        return;
    n += (size_t)snprintf(w + n, cap - n,
                          "figures: alpha-beta links and the compute model of "
                          "sim/model/costmodel.c (dsim whatif --presets)");
    const dsim_link_model *l =
        s->network_given || s->train.tpu.replicas > 0 ? dsim_link_preset(s->network_preset) : NULL;
    if (l && n < cap)
        n += (size_t)snprintf(w + n, cap - n, "; %s: %s", l->name, l->source);
    const dsim_link_model *il = s->intra_preset ? dsim_link_preset(s->intra_preset) : NULL;
    if (il && n < cap)
        n += (size_t)snprintf(w + n, cap - n, "; %s: %s", il->name, il->source);
    const dsim_device_model *d = s->device_preset ? dsim_device_preset(s->device_preset) : NULL;
    if (d && n < cap)
        n += (size_t)snprintf(w + n, cap - n, "; %s: %s", d->name, d->source);
    if (n < cap && cfg->tpu.replicas > 0)
        n += (size_t)snprintf(w + n, cap - n,
                              "; TPU %s simulated, no TPU used: the ICI and the chip are modelled "
                              "from published figures",
                              cfg->tpu.name);
    if (n < cap && cfg->synthetic_params > 0)
        snprintf(w + n, cap - n,
                 "; timing only: %.4g parameters, %.3g FLOPs per example forward, "
                 "forward + backward = 3x",
                 cfg->synthetic_params, cfg->synthetic_flops);
}

void h_store_metrics(dsim_store *st, const dsim_train_cfg *cfg, const dsim_train_result *res,
                     const dsim_train_result *ref, const dsim_perf *perf, int R,
                     dsim_harness_result *out)
{
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
        {"initial_loss", out->train_err == DSIM_OK ? res->initial_loss : NAN, "loss"},
        {"final_loss", out->final_loss, "loss"},
        {"reference_final_loss", ref ? ref->final_loss : NAN, "loss"},
        {"allreduce_share", perf->allreduce_share, "fraction"},
        {"step_time_median", perf->step_s, "s"},
        {"compute_time_median", perf->compute_s, "s"},
        {"straggler_factor", perf->straggler_factor, "ratio"},
        {"scaling_efficiency", perf->scaling_efficiency, "fraction"},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        if (isnan(m[i].value))
            continue;
        if (HG_STORE(dsim_store_metric(st, out->run_id, m[i].name, m[i].value, m[i].unit, -1)) !=
            DSIM_OK)
            h_fail(out, "storing the metrics");
    }
    if ((cfg->precision > DSIM_POLICY_FLOAT32 || cfg->gradient_dtype != DSIM_F32) && res &&
        res->mp_scale) {
        /* the policy's and the dtype's names go in the unit column */
        double ls = res->final_loss_scale > 0 ? res->final_loss_scale : NAN;
        if (HG_STORE(dsim_store_metric(st, out->run_id, "mixed_precision", (double)cfg->precision,
                                       dsim_precision_policy_name(cfg->precision), -1)) !=
                DSIM_OK ||
            HG_STORE(
                dsim_store_metric(st, out->run_id, "gradient_dtype", (double)cfg->gradient_dtype,
                                  dsim_precision_dtype_name(cfg->gradient_dtype), -1)) != DSIM_OK ||
            HG_STORE(dsim_store_metric(st, out->run_id, "skipped_steps", (double)res->skipped_steps,
                                       "steps", -1)) != DSIM_OK ||
            (!isnan(ls) && HG_STORE(dsim_store_metric(st, out->run_id, "final_loss_scale", ls,
                                                      "scale", -1)) != DSIM_OK))
            h_fail(out, "storing the metrics");
    }
    if (cfg->num_ps > 0 && out->train_err == DSIM_OK &&
        HG_STORE(dsim_store_metric(st, out->run_id, "max_staleness", (double)res->max_staleness,
                                   "updates", -1)) != DSIM_OK)
        h_fail(out, "storing the metrics");
    char xb[256];
    const char *x = out->train_err == DSIM_OK ? h_exchange(cfg, res, R, xb, sizeof xb) : NULL;
    if (x) {
        /* the names go in the unit column: a metric is a number. One
         * all-reduce on the world: its algorithm; the strategy's own
         * exchange: the collectives it called, with how many kinds */
        dsim_algo a;
        dsim_error saved;
        dsim_error_copy(&saved);
        bool bare = dsim_algo_parse(x, &a) == DSIM_OK;
        dsim_error_restore(&saved);
        double parts = 1;
        for (const char *p = strstr(x, " + "); p; p = strstr(p + 3, " + "))
            parts++;
        if (HG_STORE(bare
                         ? dsim_store_metric(st, out->run_id, "allreduce_algorithm", (double)a,
                                             dsim_algo_name(a), -1)
                         : dsim_store_metric(st, out->run_id, "exchange", parts, x, -1)) != DSIM_OK)
            h_fail(out, "storing the metrics");
    }
}
