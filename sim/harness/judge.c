/* The harness's judging beyond the checks themselves (harness_int.h): the
 * one-device baselines a timing-only run and a virtual clock need, the
 * detection bound the node-loss checks hold a run to, and the liveness
 * phase. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsim/health.h"
#include "harness_int.h"

/* What the settings guarantee after a node is lost (dsim/health.h); the
 * health check runs only in jobs of two or more workers without parameter
 * servers. 0 when nothing bounds it. */
int64_t h_detection_bound(const dsim_scenario *s, const dsim_train_result *broken, int lost)
{
    const dsim_train_cfg *t = &s->train;
    /* The health check starts once the job is up (TF starts it once the
     * cluster has formed): a node lost before then is found by the
     * collective timeout alone. */
    bool up = !broken || !broken->replicas || lost < 0 || lost >= broken->num_replicas ||
              broken->replicas[lost].phase > DSIM_PHASE_CREATE_VARIABLES;
    int64_t b = up && t->hosts >= 2 && t->num_ps == 0
                    ? dsim_detection_bound(t->timeout_ns, t->health_interval_ns,
                                           t->health_timeout_ns, t->health_retries)
                    : dsim_detection_bound_timeout(t->timeout_ns);
    return b == DSIM_NO_DEADLINE ? 0 : b;
}

/* The liveness phase (TigerBeetle's VOPR shape): every fault healed, every
 * worker restarted -- from the checkpoint the safety phase left, if any --
 * and the job must reach liveness.reach_step within liveness.within on the
 * engine's clock. Judged as one more outcome, "liveness", so that a job
 * that never recovers is told apart from a crash or a wrong result. */
uint64_t h_liveness(const dsim_scenario *s, const dsim_engine_ops *eng,
                    const dsim_train_cfg *run_cfg, dsim_harness_result *out)
{
    dsim_train_cfg c = *run_cfg;
    c.observer = NULL;
    c.observer_user = NULL;
    c.hooks = NULL;
    c.hooks_user = NULL;
    c.transport_filter = NULL;
    c.transport_filter_user = NULL;
    c.preempt_after = 0;
    c.preempt_notice = NULL;
    c.restore = c.checkpoint_path && access(c.checkpoint_path, F_OK) == 0;
    c.stop_after = s->liveness_step;
    /* one process, its ranks as workers of the engine's runtime */
    dsim_engine_attempt here = {.in_process = true};
    dsim_engine_outcome ignored;
    dsim_train_result r;
    dsim_err e = eng->train(&c, &here, &r, &ignored);
    dsim_engine_outcome_free(&ignored);
    int64_t took = 0;
    for (int i = 0; r.replicas && i < r.num_replicas; i++)
        if (r.replicas[i].t_end - r.t_start > took)
            took = r.replicas[i].t_end - r.t_start;
    uint64_t reached = e == DSIM_OK ? r.first_step + r.steps : 0;
    double within = (double)s->liveness_within_ns / 1e9, t = (double)took / 1e9;
    dsim_check_outcome *oc = realloc(out->checks, (out->n_checks + 1) * sizeof *oc);
    if (!oc) {
        dsim_train_result_free(&r);
        h_fail(out, "judging liveness");
        return 0;
    }
    out->checks = oc;
    oc = &out->checks[out->n_checks++];
    memset(oc, 0, sizeof *oc);
    oc->name = "liveness";
    oc->result.measured = e == DSIM_OK ? t : NAN;
    oc->result.expected = within;
    char from[96];
    if (c.restore)
        snprintf(from, sizeof from, "from the checkpoint at step %llu",
                 (unsigned long long)r.first_step);
    else
        snprintf(from, sizeof from, "from the start (no checkpoint)");
    if (e == DSIM_OK && reached < s->liveness_step)
        snprintf(oc->result.message, sizeof oc->result.message,
                 "LIVENESS: liveness.reach_step %llu is beyond the job's last step %llu: it can "
                 "never be reached; lower it",
                 (unsigned long long)s->liveness_step, (unsigned long long)reached);
    else if (e != DSIM_OK)
        snprintf(oc->result.message, sizeof oc->result.message,
                 "LIVENESS FAILURE: with every fault healed and every worker restarted %s, the "
                 "job did not reach step %llu: %.300s",
                 from, (unsigned long long)s->liveness_step, r.error.msg);
    else if (t > within)
        snprintf(oc->result.message, sizeof oc->result.message,
                 "LIVENESS FAILURE: with every fault healed and every worker restarted %s, the "
                 "job reached step %llu only after %.6g s, over the %.6g s allowed",
                 from, (unsigned long long)s->liveness_step, t, within);
    else {
        oc->check_passed = true;
        snprintf(oc->result.message, sizeof oc->result.message,
                 "with every fault healed and every worker restarted %s, the job reached step "
                 "%llu in %.6g s (within %.6g s)",
                 from, (unsigned long long)s->liveness_step, t, within);
    }
    oc->passed = oc->check_passed;
    oc->result.passed = oc->check_passed;
    if (!oc->passed)
        out->n_failed++;
    uint64_t h = r.trace_hash;
    dsim_train_result_free(&r);
    return h;
}

/* A timing-only run's one-device baseline: the compute model's time for
 * the whole global batch of each step on one device, no exchange (the
 * figure `dsim whatif` divides by for its speed-up). */
dsim_err h_synthetic_reference(const dsim_train_cfg *cfg, const dsim_train_result *run,
                               dsim_train_result *ref)
{
    memset(ref, 0, sizeof *ref);
    size_t S = (size_t)run->steps, N = (size_t)run->num_replicas;
    if (S == 0 || !run->examples || !(cfg->device_flops > 0))
        return DSIM_ERR(DSIM_EINVAL, -1, "no steps or no compute rate for the baseline");
    ref->step_ns = calloc(S, sizeof *ref->step_ns);
    ref->comm_ns = calloc(S, sizeof *ref->comm_ns);
    ref->examples = calloc(S, sizeof *ref->examples);
    if (!ref->step_ns || !ref->comm_ns || !ref->examples) {
        dsim_train_result_free(ref);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for the one-device baseline");
    }
    snprintf(ref->strategy, sizeof ref->strategy, "one_device");
    ref->num_workers = ref->devices_per_host = ref->num_replicas = ref->num_replicas_in_sync = 1;
    ref->steps = S;
    ref->initial_loss = ref->final_loss = NAN;
    for (size_t k = 0; k < S; k++) {
        uint64_t ex = 0;
        for (size_t i = 0; i < N; i++)
            ex += run->examples[k * N + i];
        ref->examples[k] = ex;
        ref->step_ns[k] =
            (int64_t)llround(3.0 * cfg->synthetic_flops * (double)ex / cfg->device_flops * 1e9);
    }
    return DSIM_OK;
}
