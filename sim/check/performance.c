/* performance (ARCHITECTURE.md §8): where a run's time goes, from each replica's
 * step times (dsim_train_result.step_ns, comm_ns):
 *
 *   - all-reduce share: the time replicas spent in apply_gradients and the
 *     loss's reduction (the exchange, waits for slower replicas included)
 *     over their whole step time. A common production finding is a share
 *     above 20 %: the job then scales badly and a larger per-replica batch,
 *     fewer replicas or a faster network pays off.
 *   - stragglers: each replica's compute time (step minus exchange), as the
 *     median over steps; the slowest replica is named when its time exceeds
 *     the median of the other replicas' by more than the factor (in a
 *     synchronous job every step waits for it).
 *   - scaling efficiency: the one-device replay's median step time (the
 *     whole global batch on one device) over N times the run's median step
 *     time (slowest replica per step): 1 is perfect scaling.
 *
 * The first step of a run (warm-up: first touch of buffers, connection set-up)
 * is left out when there are more. Every figure is also stored as a metric of
 * the run (dsim_perf_measure), whether or not a scenario expects the check. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check/check_int.h"
#include "dsim/spi/rt.h"

enum { PF_MAX_SHARE, PF_MIN_EFF, PF_MAX_STRAGGLER };

static int pf_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v); 0 when n is 0. */
static double pf_median(int64_t *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, pf_cmp);
    return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

/* Steps [first, S) of r that every replica reported (a step time > 0). */
static size_t pf_first(const dsim_train_result *r)
{
    return r->steps > 1 ? 1 : 0;
}

/* Median over steps of the slowest replica's step time. */
static double pf_step_median(const dsim_train_result *r, int64_t *buf)
{
    size_t S = (size_t)r->steps, N = (size_t)r->num_replicas, n = 0;
    for (size_t k = pf_first(r); k < S; k++) {
        int64_t worst = 0;
        for (size_t i = 0; i < N; i++)
            if (r->step_ns[k * N + i] > worst)
                worst = r->step_ns[k * N + i];
        if (worst > 0)
            buf[n++] = worst;
    }
    return pf_median(buf, n);
}

dsim_err dsim_perf_measure(const dsim_train_result *r, const dsim_train_result *ref, dsim_perf *out)
{
    memset(out, 0, sizeof *out);
    out->allreduce_share = NAN;
    out->scaling_efficiency = NAN;
    out->straggler_factor = NAN;
    out->straggler = -1;
    if (!r || !r->step_ns || !r->comm_ns || r->steps == 0 || r->num_replicas <= 0)
        return DSIM_OK;
    size_t S = (size_t)r->steps, N = (size_t)r->num_replicas;
    int64_t *buf = malloc((S * N + S + 1) * sizeof *buf);
    if (!buf)
        return DSIM_ERR(DSIM_ENOMEM, -1, "performance: out of memory for %zu step times", S * N);
    double step = 0, comm = 0;
    for (size_t k = pf_first(r); k < S; k++)
        for (size_t i = 0; i < N; i++) {
            int64_t t = r->step_ns[k * N + i], c = r->comm_ns[k * N + i];
            if (t <= 0 || c < 0 || c > t)
                continue; /* not reported (a lost replica's steps) */
            step += (double)t;
            comm += (double)c;
        }
    if (step > 0)
        out->allreduce_share = comm / step;
    out->step_s = pf_step_median(r, buf) / 1e9;

    /* compute time per replica: the median over steps, then across replicas */
    int64_t *med = buf + S; /* N slots after the S a replica's steps use */
    double *rep = malloc(N * sizeof *rep);
    if (!rep) {
        free(buf);
        return DSIM_ERR(DSIM_ENOMEM, -1, "performance: out of memory for %zu replicas", N);
    }
    size_t have = 0;
    for (size_t i = 0; i < N; i++) {
        size_t n = 0;
        for (size_t k = pf_first(r); k < S; k++) {
            int64_t t = r->step_ns[k * N + i], c = r->comm_ns[k * N + i];
            if (t > 0 && c >= 0 && c <= t)
                buf[n++] = t - c;
        }
        rep[i] = n ? pf_median(buf, n) : -1;
        if (n)
            have++;
    }
    if (have > 0) {
        /* the median replica's compute, and the slowest against the median
         * of the others (with two replicas: against the other one) */
        size_t n = 0;
        int slow = -1;
        for (size_t i = 0; i < N; i++)
            if (rep[i] >= 0) {
                med[n++] = (int64_t)rep[i];
                if (slow < 0 || rep[i] > rep[slow])
                    slow = (int)i;
            }
        out->compute_s = pf_median(med, n) / 1e9;
        out->straggler_factor = 1;
        if (n > 1) {
            size_t m = 0;
            for (size_t i = 0; i < N; i++)
                if (rep[i] >= 0 && (int)i != slow)
                    med[m++] = (int64_t)rep[i];
            double others = pf_median(med, m);
            if (others > 0 && rep[slow] / others > 1) {
                out->straggler_factor = rep[slow] / others;
                out->straggler = slow;
                out->straggler_s = rep[slow] / 1e9;
            }
        }
    }
    free(rep);

    if (ref && ref->step_ns && ref->steps > 0 && ref->num_replicas == 1) {
        int64_t *rb = malloc(((size_t)ref->steps + 1) * sizeof *rb);
        if (rb) {
            double t1 = pf_step_median(ref, rb);
            free(rb);
            out->reference_step_s = t1 / 1e9;
            if (t1 > 0 && out->step_s > 0)
                out->scaling_efficiency = t1 / 1e9 / ((double)N * out->step_s);
        }
    }
    free(buf);
    return DSIM_OK;
}

/* A run on wall-clock time (threads, processes) whose replicas outnumber
 * the CPUs they ran on: they took turns, and each one's exchange waited
 * for the others' compute as well as for the others' data, so its share
 * of the step measures this host, not the strategy (8 replicas on 2 CPUs:
 * 85-90 % where engine sim says 29 %), and the one-device replay had a CPU
 * to itself. *cpus: the host's. */
static bool pf_took_turns(const dsim_check_ctx *ctx, int *cpus, const char **eng)
{
    *eng = ctx->cfg && ctx->cfg->engine ? ctx->cfg->engine : "threads";
    if (strcmp(*eng, "threads") != 0 && strcmp(*eng, "processes") != 0)
        return false;
    *cpus = ctx->host_cpus > 0 ? ctx->host_cpus : dsim_rt_cpus();
    return ctx->run->num_replicas > *cpus;
}

/* Said after a straggler that fails where the replicas took turns (slower
 * than taking turns explains). */
static void pf_turns_note(const dsim_check_ctx *ctx, char *msg, size_t cap)
{
    int cpus = 0;
    const char *eng;
    if (!pf_took_turns(ctx, &cpus, &eng))
        return;
    dsim_check_msg_append(msg, cap,
                          ". Its %d replicas took turns on this host's %d CPUs (engine %s), "
                          "so one that waited for a CPU mid-compute looks slow, but by at most "
                          "the %.2g replicas a CPU ran: this one is slower than that; engine sim "
                          "times the job as on devices of their own",
                          ctx->run->num_replicas, cpus, eng, (double)ctx->run->num_replicas / cpus);
}

/* Where the replicas took turns: the straggler alone is judged (a
 * replica's own compute, as the median over steps, stays mostly its own:
 * 1.05-1.43x for 8 correct replicas on 2 CPUs, the host busy; a straggler
 * within the replicas a CPU ran is not judged: pf_run), the share and the
 * efficiency are not. */
static void pf_judge_turns(const dsim_check_ctx *ctx, const double *v, const dsim_perf *p,
                           dsim_check_result *out)
{
    char *msg = out->message;
    size_t cap = sizeof out->message;
    int cpus = 0;
    const char *eng;
    pf_took_turns(ctx, &cpus, &eng);
    int N = ctx->run->num_replicas;
    char why[320];
    snprintf(why, sizeof why,
             "its %d replicas took turns on this host's %d CPUs (engine %s), so each one's wait "
             "for the others' compute counted as all-reduce (%.0f %% of step time) and the "
             "one-device replay had a CPU to itself: engine sim times the job as on devices of "
             "their own (and its links as cluster.network says)",
             N, cpus, eng, 100 * p->allreduce_share);
    if (DSIM_CHECK_UNSET(v[PF_MAX_STRAGGLER])) {
        out->not_judged = true;
        dsim_check_msg(msg, cap, "not judged: %s", why);
        return;
    }
    out->passed = true;
    out->measured = p->straggler >= 0 ? p->straggler_factor : 1;
    out->expected = v[PF_MAX_STRAGGLER];
    if (p->straggler >= 0)
        dsim_check_msg(msg, cap,
                       "no straggler: the slowest replica, %d, computes %.2fx the others' median "
                       "(max_straggler_factor %.2g)",
                       p->straggler, p->straggler_factor, v[PF_MAX_STRAGGLER]);
    else
        dsim_check_msg(msg, cap, "no straggler: every replica computes alike");
    dsim_check_msg_append(msg, cap, "; the all-reduce share and scaling efficiency not judged: %s",
                          why);
}

static dsim_err pf_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    char *msg = out->message;
    size_t cap = sizeof out->message;
    msg[0] = '\0';
    out->passed = false;
    out->measured = NAN;
    out->expected = v[PF_MAX_SHARE];
    dsim_perf p;
    DSIM_CHECK(dsim_perf_measure(ctx->run, ctx->reference, &p));
    if (isnan(p.allreduce_share)) {
        dsim_check_msg(msg, cap,
                       "the run reported no step times, so its performance cannot be "
                       "judged");
        return DSIM_OK;
    }
    int N = ctx->run->num_replicas;
    int cpus = 0;
    const char *eng;
    bool turns = pf_took_turns(ctx, &cpus, &eng);
    if (!turns && p.allreduce_share > v[PF_MAX_SHARE]) {
        dsim_check_msg(msg, cap,
                       "all-reduce takes %.0f %% of step time (max_allreduce_share %.0f %%; median "
                       "step %.3g ms, compute %.3g ms): communication dominates, so adding "
                       "replicas buys little; a larger batch per replica, fewer replicas, a "
                       "faster link or another algorithm reduces it",
                       100 * p.allreduce_share, 100 * v[PF_MAX_SHARE], 1e3 * p.step_s,
                       1e3 * p.compute_s);
        out->measured = p.allreduce_share;
        return DSIM_OK;
    }
    /* Taking turns, a replica that waited for a CPU mid-compute more often
     * than the others looks slower by up to the replicas a CPU ran (8
     * correct replicas on 2 CPUs, the host busy: up to 1.43x measured):
     * within that, the host cannot be told from the strategy. */
    double allow = turns ? (double)N / cpus : 1;
    if (!DSIM_CHECK_UNSET(v[PF_MAX_STRAGGLER]) && p.straggler >= 0 &&
        p.straggler_factor > v[PF_MAX_STRAGGLER] &&
        p.straggler_factor <= v[PF_MAX_STRAGGLER] * allow) {
        out->not_judged = true;
        out->measured = p.straggler_factor;
        out->expected = v[PF_MAX_STRAGGLER];
        dsim_check_msg(msg, cap,
                       "not judged: replica %d computes %.2fx the other replicas' median "
                       "(max_straggler_factor %.2g), but its %d replicas took turns on this "
                       "host's %d CPUs (engine %s), so one that waited for a CPU mid-compute "
                       "looks slow, up to %.2gx here (%.2g x %.2g replicas a CPU): engine sim "
                       "times the job as on devices of their own",
                       p.straggler, p.straggler_factor, v[PF_MAX_STRAGGLER], N, cpus, eng,
                       v[PF_MAX_STRAGGLER] * allow, v[PF_MAX_STRAGGLER], allow);
        return DSIM_OK;
    }
    if (!DSIM_CHECK_UNSET(v[PF_MAX_STRAGGLER]) && p.straggler >= 0 &&
        p.straggler_factor > v[PF_MAX_STRAGGLER]) {
        dsim_check_msg(msg, cap,
                       "replica %d is a straggler: its compute takes %.2fx the other replicas' "
                       "median (max_straggler_factor %.2g; %.3g ms against %.3g ms per step)%s",
                       p.straggler, p.straggler_factor, v[PF_MAX_STRAGGLER], 1e3 * p.straggler_s,
                       1e3 * p.straggler_s / p.straggler_factor,
                       ctx->run->num_replicas_in_sync > 1 ? "; every synchronous step waits for it"
                                                          : "");
        pf_turns_note(ctx, msg, cap);
        out->measured = p.straggler_factor;
        out->expected = v[PF_MAX_STRAGGLER];
        return DSIM_OK;
    }
    if (turns) {
        pf_judge_turns(ctx, v, &p, out);
        return DSIM_OK;
    }
    if (!DSIM_CHECK_UNSET(v[PF_MIN_EFF])) {
        if (isnan(p.scaling_efficiency)) {
            dsim_check_msg(msg, cap,
                           "min_scaling_efficiency needs the one-device replay's step times, "
                           "which this run does not have");
            out->expected = v[PF_MIN_EFF];
            return DSIM_OK;
        }
        if (p.scaling_efficiency < v[PF_MIN_EFF]) {
            dsim_check_msg(msg, cap,
                           "scaling efficiency %.2f with %d replicas against one device "
                           "(min_scaling_efficiency %.2f): a step takes %.3g ms where the "
                           "one-device replay's %.3g ms / %d = %.3g ms would be perfect scaling",
                           p.scaling_efficiency, N, v[PF_MIN_EFF], 1e3 * p.step_s,
                           1e3 * p.reference_step_s, N, 1e3 * p.reference_step_s / N);
            out->measured = p.scaling_efficiency;
            out->expected = v[PF_MIN_EFF];
            return DSIM_OK;
        }
    }
    out->passed = true;
    out->measured = p.allreduce_share;
    dsim_check_msg(msg, cap, "all-reduce %.0f %% of step time (median step %.3g ms)",
                   100 * p.allreduce_share, 1e3 * p.step_s);
    if (p.straggler >= 0)
        dsim_check_msg_append(msg, cap, "; slowest replica %d computes %.2fx the others' median",
                              p.straggler, p.straggler_factor);
    if (!isnan(p.scaling_efficiency))
        dsim_check_msg_append(msg, cap, "; scaling efficiency %.2f against one device",
                              p.scaling_efficiency);
    return DSIM_OK;
}

static bool pf_wants_reference(const double *v)
{
    return !DSIM_CHECK_UNSET(v[PF_MIN_EFF]);
}

const dsim_check_ops dsim_check_performance = {
    .size = sizeof(dsim_check_ops),
    .name = "performance",
    .summary = "all-reduce share of step time, scaling efficiency, stragglers",
    .available = true,
    .judges_timing_only = true,
    .n_params = 3,
    .params =
        {
            {"max_allreduce_share", "largest accepted fraction of step time in all-reduce", 0, 1,
             0.2, false},
            {"min_scaling_efficiency",
             "smallest accepted one-device step time / (replicas x step time)", 0, 1, NAN, false},
            {"max_straggler_factor",
             "largest accepted compute time of the slowest replica over the others' median", 1, 1e6,
             NAN, false},
        },
    .run = pf_run,
    .wants_reference = pf_wants_reference,
};
