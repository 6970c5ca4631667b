/* Scale of the sim engine (issue 10, item 4): a multi_worker_mirrored job
 * of W workers x S steps of a softmax model with about P parameters, run
 * through the harness under engine sim without a store, and the memory a
 * worker costs when idle.
 *
 *   bench_sim_scale [W S FEATURES CLASSES on|off]...   (default: the table below)
 *
 * on|off: the health check (TF's defaults) or none.
 *
 * The job is dsim_train itself (the driver, strategy, collectives and
 * transport; no store, no single-device reference). One line per job:
 * workers, steps, parameters, wall seconds, virtual seconds, worker
 * switches, clock jumps, peak RSS of the process so far. Exit 1 when a job
 * fails or its replicas do not hold bit-identical parameters after every
 * step. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "dsim/rt.h"
#include "engine/sim.h"
#include "dsim/strategy.h"
#include "scenario/scenario.h"

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

static long peak_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void idle_main(void *p)
{
    dsim_rt *rt = p;
    dsim_rt_sleep_until(rt, dsim_rt_now(rt) + 1000000000LL);
}

/* RSS of n workers that have started and sleep, per worker. */
static double idle_worker_bytes(int n)
{
    dsim_rt *rt = NULL;
    if (dsim_sim_engine_register() != DSIM_OK || dsim_rt_create("sim", &rt) != DSIM_OK)
        return -1;
    dsim_task **t = calloc((size_t)n, sizeof *t);
    long before = rss_kib();
    for (int i = 0; i < n; i++)
        if (dsim_rt_spawn(rt, i, idle_main, rt, &t[i]) != DSIM_OK)
            return -1;
    /* let every one of them run up to its sleep */
    dsim_rt_sleep_until(rt, dsim_rt_now(rt) + 1);
    long during = rss_kib();
    for (int i = 0; i < n; i++)
        dsim_rt_join(rt, t[i]);
    free(t);
    dsim_rt_destroy(rt);
    return (double)(during - before) * 1024.0 / n;
}

static int run_job(int workers, int steps, int features, int classes, int health)
{
    char yaml[1024];
    /* one example per replica per step: examples = workers x steps */
    snprintf(yaml, sizeof yaml,
             "name: sim_scale\nseed: 11\nengine: sim\n"
             "cluster: {hosts: %d, devices_per_host: 1}\n"
             "strategy: {name: multi_worker_mirrored, health_check: {interval: %s}}\n"
             "model: {kind: softmax}\n"
             "optimizer: {kind: sgd, learning_rate: 0.1}\n"
             "data: {task: classification, examples: %lld, features: %d, classes: %d, "
             "shard_policy: data, global_batch: %d, epochs: 1}\n",
             workers, health ? "30s" : "0s", (long long)workers * steps, features, classes,
             workers);
    dsim_scenario *sc = NULL;
    if (dsim_scenario_parse("sim_scale.yaml", yaml, strlen(yaml), &sc) != DSIM_OK) {
        printf("%7d %6d: %s\n", workers, steps, dsim_errmsg());
        return 1;
    }
    dsim_train_cfg cfg = sc->train;
    cfg.device_flops = 1e10; /* the harness's cost model */
    dsim_sim_stats s0, s1;
    dsim_sim_engine_totals(&s0);
    dsim_train_result r;
    double t0 = wall_s();
    dsim_err e = dsim_train(&cfg, &r);
    double t = wall_s() - t0;
    dsim_sim_engine_totals(&s1);
    int64_t virt = 0;
    for (int i = 0; e == DSIM_OK && r.replicas && i < r.num_replicas; i++)
        if (r.replicas[i].t_end - r.t_start > virt)
            virt = r.replicas[i].t_end - r.t_start;
    long params = (long)(features + 1) * classes;
    /* what gradient_consistency asks first: bit-identical replicas */
    int ok = e == DSIM_OK && r.replicas_agree && r.in_sync_every_step &&
             r.steps == (uint64_t)steps;
    printf("%7d %6d %8ld %6s %9.2f %11.6f %12" PRIu64 " %9" PRIu64 " %9.0f  %s\n", workers,
           steps, params, health ? "on" : "off", t, (double)virt / 1e9, s1.switches - s0.switches,
           s1.clock_jumps - s0.clock_jumps, (double)peak_kib() / 1024.0,
           e != DSIM_OK ? r.error.msg
           : ok         ? "replicas bit-identical after every step"
                        : "REPLICAS DIFFER");
    fflush(stdout);
    dsim_train_result_free(&r);
    dsim_scenario_free(sc);
    return !ok;
}

int main(int argc, char **argv)
{
    printf("# sim engine: memory per idle worker (stack %zu KiB mapped): %.0f bytes "
           "(4096 workers)\n",
           dsim_sim_stack_bytes() / 1024, idle_worker_bytes(4096));
    printf("# workers  steps   params health    wall_s   virtual_s     switches     jumps  "
           "peak_MiB  result\n");
    int bad = 0;
    if (argc > 1) {
        for (int i = 1; i + 4 < argc; i += 5)
            bad |= run_job(atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]),
                           atoi(argv[i + 3]), strcmp(argv[i + 4], "off") != 0);
        return bad;
    }
    /* the curve over workers at a fixed model (100 steps, 64 Ki parameters) */
    static const int jobs[][5] = {
        {64, 100, 1023, 64, 1},
        {256, 100, 1023, 64, 1},
        {1024, 100, 1023, 64, 1},
    };
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++)
        bad |= run_job(jobs[i][0], jobs[i][1], jobs[i][2], jobs[i][3], jobs[i][4]);
    return bad;
}
