/* What a scenario's failure settings promise about each of its faults (see
 * scenario.h): the detection bound of dsim_train_detection_bound, said in a
 * sentence for `dsim validate`. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/health.h"
#include "dsim/spi/strategy.h"
#include "scenario/scenario.h"
#include "scenario/units.h"

/* "kill rank 3 at step 5", "partition link [0, 2] at 2s for 500ms" */
static void detect_describe(const dsim_fault *f, char *buf, size_t cap)
{
    char where[48] = "", when[64] = "", d[32];
    if (f->rank >= 0)
        snprintf(where, sizeof where, " rank %d", f->rank);
    else if (f->worker >= 0)
        snprintf(where, sizeof where, " worker %d", f->worker);
    else if (f->link_from >= 0)
        snprintf(where, sizeof where, " link [%d, %d]", f->link_from, f->link_to);
    switch (f->when) {
    case DSIM_WHEN_STEP:
        snprintf(when, sizeof when, " at step %" PRId64, f->step);
        break;
    case DSIM_WHEN_PHASE:
        if (f->step >= 0)
            snprintf(when, sizeof when, " at phase %s of step %" PRId64, f->phase ? f->phase : "?",
                     f->step);
        else
            snprintf(when, sizeof when, " at phase %s", f->phase ? f->phase : "?");
        break;
    case DSIM_WHEN_TIME:
        dsim_unit_format_duration(f->time_ns, d, sizeof d);
        snprintf(when, sizeof when, " at %s", d);
        break;
    case DSIM_WHEN_PROBABILITY:
        snprintf(when, sizeof when, " with probability %g", f->probability);
        break;
    }
    snprintf(buf, cap, "%s%s%s", dsim_fault_what_name(f->what), where, when);
}

void dsim_scenario_fault_detection(const dsim_scenario *s, size_t i, dsim_fault_detection *out)
{
    memset(out, 0, sizeof *out);
    out->bound_ns = DSIM_NO_DEADLINE;
    if (!s || i >= s->n_faults)
        return;
    const dsim_fault *f = &s->faults[i];
    const dsim_train_cfg *t = &s->train;
    char what[128], b[32], tmo[32], iv[32], ht[32], tick[32], grace[32];
    detect_describe(f, what, sizeof what);
    int64_t timeout = t->timeout_ns < 0 ? DSIM_COMM_DEFAULT_TIMEOUT_NS : t->timeout_ns;
    dsim_unit_format_duration(timeout, tmo, sizeof tmo);
    bool hc = dsim_train_runs_health_check(t);
    int64_t bt = dsim_detection_bound_timeout(t->timeout_ns);
    int64_t bh = hc ? dsim_detection_bound_health(t->health_interval_ns, t->health_timeout_ns,
                                                  t->health_retries)
                    : DSIM_NO_DEADLINE;
    /* Why the health check does not help here, when it does not. */
    const char *no_hc = t->health_interval_ns <= 0 ? "the health check is off (interval 0)"
                        : t->num_ps > 0 ? "the health check does not run with parameter servers"
                                        : "the health check does not run on one host";

    const dsim_fault_kind *k = dsim_fault_kind_of(f->what);
    switch (k ? k->loses : DSIM_FAULT_LOSES_NOTHING) {
    case DSIM_FAULT_LOSES_PEER:
        out->kind = DSIM_DETECT_LOSS;
        out->bound_ns = bt < bh ? bt : bh;
        break;
    case DSIM_FAULT_LOSES_MESSAGE:
        /* The peer is alive and answers its health checks: only the
         * collective timeout ends a wait for a message that never comes. */
        out->kind = DSIM_DETECT_MESSAGE;
        out->bound_ns = bt;
        bh = DSIM_NO_DEADLINE;
        no_hc = "the health check sees the peer alive";
        break;
    case DSIM_FAULT_LOSES_NOTHING:
        out->kind = DSIM_DETECT_NONE;
        snprintf(out->text, sizeof out->text,
                 "faults[%zu] (%s): no peer or message is lost, so nothing needs detecting", i,
                 what);
        return;
    }
    const char *lost = out->kind == DSIM_DETECT_LOSS ? "a lost peer" : "a lost message";
    if (out->bound_ns == DSIM_NO_DEADLINE) {
        out->warn = true;
        snprintf(out->text, sizeof out->text,
                 "faults[%zu] (%s): %s is never detected: strategy.timeout is 0 (no deadline) and "
                 "%s, so the survivors would wait for ever; set strategy.timeout%s",
                 i, what, lost, no_hc,
                 out->kind == DSIM_DETECT_LOSS && !hc && t->hosts >= 2 && t->num_ps == 0
                     ? " or strategy.health_check.interval"
                     : "");
        return;
    }
    dsim_unit_format_duration(out->bound_ns, b, sizeof b);
    char how[160];
    if (out->bound_ns == bh) {
        int r = t->health_retries < 1 ? 1 : t->health_retries;
        dsim_unit_format_duration(t->health_interval_ns, iv, sizeof iv);
        dsim_unit_format_duration(t->health_timeout_ns, ht, sizeof ht);
        dsim_unit_format_duration(dsim_health_tick_ns(t->health_interval_ns, t->health_timeout_ns),
                                  tick, sizeof tick);
        snprintf(how, sizeof how, "health check: interval %s + %d x timeout %s + 2 x tick %s", iv,
                 r, ht, tick);
    } else {
        dsim_unit_format_duration(bt - timeout, grace, sizeof grace);
        snprintf(how, sizeof how, "collective timeout: %s + grace %s", tmo, grace);
    }
    snprintf(out->text, sizeof out->text,
             "faults[%zu] (%s): %s is detected within %s: every survivor has returned an error "
             "by then (%s)",
             i, what, lost, b, how);
    if (out->kind == DSIM_DETECT_LOSS &&
        (f->what == DSIM_FAULT_PARTITION || f->what == DSIM_FAULT_PAUSE) && f->duration_ns > 0 &&
        f->duration_ns < out->bound_ns) {
        char d[32];
        dsim_unit_format_duration(f->duration_ns, d, sizeof d);
        size_t n = strlen(out->text);
        snprintf(out->text + n, sizeof out->text - n,
                 "; the %s ends after %s, so it may go unnoticed", dsim_fault_what_name(f->what),
                 d);
    }
}

uint64_t dsim_train_cfg_steps(const dsim_train_cfg *cfg)
{
    dsim_dataset_desc d;
    memset(&d, 0, sizeof d);
    uint32_t nf = cfg->in_memory ? 0 : (uint32_t)cfg->data.n_files;
    if (dsim_dataset_desc_init(&d, cfg->data.n_examples, nf, DSIM_FILES_CONTIGUOUS) != DSIM_OK) {
        dsim_clear_error();
        return 0;
    }
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

uint64_t dsim_scenario_own_steps(const dsim_scenario *s)
{
    const dsim_train_cfg *t = s ? &s->train : NULL;
    /* a plugin's code is not loaded here; a strategy's input_fn makes its
     * own batches */
    if (!t || t->plugin_path || (t->strategy && dsim_strategy_input_fn(t->strategy, NULL)))
        return 0;
    return dsim_train_cfg_steps(t);
}

bool dsim_scenario_fault_unreachable(const dsim_scenario *s, size_t i, uint64_t steps, char *text,
                                     size_t cap)
{
    if (!s || i >= s->n_faults || steps == 0)
        return false;
    const dsim_fault *f = &s->faults[i];
    bool stepped = f->when == DSIM_WHEN_STEP || (f->when == DSIM_WHEN_PHASE && f->step >= 0);
    if (!stepped || (uint64_t)f->step < steps)
        return false;
    char what[128];
    detect_describe(f, what, sizeof what);
    snprintf(
        text, cap,
        "faults[%zu] (%s) never fires: the job has %" PRIu64 " steps (0 to %" PRIu64
        "), so the run shows nothing of it (node_loss is not judged); set at_step below %" PRIu64
        " or make the run longer (data.epochs)",
        i, what, steps, steps - 1, steps);
    return true;
}
