/* Scale of the sim engine (issue 10, item 4): a multi_worker_mirrored job
 * of W workers x S steps of a softmax model with about P parameters, run
 * through the harness under engine sim without a store, and the memory a
 * worker costs when idle.
 *
 *   bench_sim_scale                              the default table, below
 *   bench_sim_scale [W S FEATURES CLASSES on|off]...   those jobs, once each
 *
 * on|off: the health check (TF's defaults) or none.
 *
 * The job is dsim_train itself (the driver, strategy, collectives and
 * transport; no store, no single-device reference). One line per job:
 * workers, steps, parameters, wall and CPU seconds, virtual seconds, worker
 * switches, clock jumps, peak RSS. Each job runs in a child process of its
 * own, so that its peak is its own: freed memory that the allocator keeps
 * from a bigger job before it would count otherwise.
 *
 * The default table runs series over W = 64, 256, 1024, ... at fixed steps
 * and model, each job REPEATS times, and prints per series the medians and
 * their ratio per x4 in workers. Where a series is marked linear, that
 * ratio must stay within 4 x 1.25 (the work is workers x steps; the 25 %
 * covers the log W messages of an all-reduce and the caches). It is taken
 * on CPU seconds: on a machine shared with other work wall time also
 * counts the time the process waited for a CPU. Jobs under half a second
 * are too short to compare and are left out of the check.
 *
 * Exit 1 when a job fails, its replicas do not hold bit-identical
 * parameters after every step, or a linear series grows faster. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* The process's peak RSS. */
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

typedef struct job_time {
    double wall, cpu;
} job_time;

static int job_body(int workers, int steps, int features, int classes, int health, job_time *jt)
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
    double t0 = wall_s(), c0 = cpu_s();
    dsim_err e = dsim_train(&cfg, &r);
    double t = wall_s() - t0, c = cpu_s() - c0;
    dsim_sim_engine_totals(&s1);
    int64_t virt = 0;
    for (int i = 0; e == DSIM_OK && r.replicas && i < r.num_replicas; i++)
        if (r.replicas[i].t_end - r.t_start > virt)
            virt = r.replicas[i].t_end - r.t_start;
    long params = (long)(features + 1) * classes;
    /* what gradient_consistency asks first: bit-identical replicas */
    int ok = e == DSIM_OK && r.replicas_agree && r.in_sync_every_step && r.steps == (uint64_t)steps;
    printf("%7d %6d %8ld %6s %9.2f %8.2f %11.6f %12" PRIu64 " %9" PRIu64 " %9.0f  %s\n", workers,
           steps, params, health ? "on" : "off", t, c, (double)virt / 1e9,
           s1.switches - s0.switches, s1.clock_jumps - s0.clock_jumps, (double)peak_kib() / 1024.0,
           e != DSIM_OK ? r.error.msg
           : ok         ? "replicas bit-identical after every step"
                        : "REPLICAS DIFFER");
    fflush(stdout);
    dsim_train_result_free(&r);
    dsim_scenario_free(sc);
    if (jt) {
        jt->wall = t;
        jt->cpu = c;
    }
    return !ok;
}

/* job_body in a child process; its times come back through a pipe. */
static int run_job(int workers, int steps, int features, int classes, int health, job_time *jt)
{
    int fd[2];
    fflush(stdout);
    if (pipe(fd) != 0)
        return job_body(workers, steps, features, classes, health, jt);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return job_body(workers, steps, features, classes, health, jt);
    }
    if (pid == 0) {
        close(fd[0]);
        job_time t = {0, 0};
        int bad = job_body(workers, steps, features, classes, health, &t);
        fflush(stdout);
        ssize_t n = write(fd[1], &t, sizeof t);
        _exit(n == (ssize_t)sizeof t ? bad : 1);
    }
    close(fd[1]);
    job_time t = {0, 0};
    ssize_t n = read(fd[0], &t, sizeof t);
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (jt)
        *jt = t;
    if (n != (ssize_t)sizeof t || !WIFEXITED(status)) {
        printf("%7d %6d: the job's process ended without a result (%s %d)\n", workers, steps,
               WIFSIGNALED(status) ? "signal" : "status",
               WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return 1;
    }
    return WEXITSTATUS(status) != 0;
}

#define REPEATS    3
#define MAX_POINTS 8

typedef struct series {
    const char *what;
    int steps, features, classes, health;
    int linear;              /* the ratio per x4 is checked */
    int workers[MAX_POINTS]; /* 0-terminated, each 4 x the one before */
    int repeats;
} series;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int run_series(const series *sr)
{
    int bad = 0, n = 0;
    double wall[MAX_POINTS], cpu[MAX_POINTS];
    for (; n < MAX_POINTS && sr->workers[n]; n++) {
        double w[REPEATS], c[REPEATS];
        for (int k = 0; k < sr->repeats; k++) {
            job_time jt = {0, 0};
            bad |= run_job(sr->workers[n], sr->steps, sr->features, sr->classes, sr->health, &jt);
            w[k] = jt.wall;
            c[k] = jt.cpu;
        }
        wall[n] = median(w, sr->repeats);
        cpu[n] = median(c, sr->repeats);
    }
    printf("# %s: medians of %d run%s; ratio per x4 in workers\n", sr->what, sr->repeats,
           sr->repeats == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        printf("#   %5d workers: wall %7.2f s  cpu %7.2f s", sr->workers[i], wall[i], cpu[i]);
        if (i > 0) {
            double rw = wall[i] / wall[i - 1], rc = cpu[i] / cpu[i - 1];
            int checked = sr->linear && cpu[i - 1] >= 0.5;
            printf("  x%.2f wall  x%.2f cpu%s", rw, rc,
                   !checked           ? ""
                   : rc <= 4.0 * 1.25 ? "  (<= x5.00: linear)"
                                      : "  FASTER THAN LINEAR (> x5.00)");
            if (checked && rc > 4.0 * 1.25)
                bad = 1;
        }
        printf("\n");
    }
    fflush(stdout);
    return bad;
}

int main(int argc, char **argv)
{
    printf("# sim engine: memory per idle worker (stack %zu KiB mapped): %.0f bytes "
           "(4096 workers)\n",
           dsim_sim_stack_bytes() / 1024, idle_worker_bytes(4096));
    printf("# workers  steps   params health    wall_s    cpu_s   virtual_s     switches     "
           "jumps  peak_MiB  result\n");
    int bad = 0;
    if (argc > 1) {
        for (int i = 1; i + 4 < argc; i += 5)
            bad |= run_job(atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3]),
                           strcmp(argv[i + 4], "off") != 0, NULL);
        return bad;
    }
    static const series table[] = {
        /* the job: 64 Ki parameters, 100 steps, TF's health check */
        {"64 Ki parameters x 100 steps, health check on",
         100,
         1023,
         64,
         1,
         1,
         {64, 256, 1024, 0},
         REPEATS},
        /* many workers, short: the engine and the per-replica state */
        {"8 Ki parameters x 10 steps, health check off",
         10,
         1023,
         8,
         0,
         1,
         {64, 256, 1024, 4096, 8192, 0},
         REPEATS},
        /* the same with the check: its first round pings every pair of
         * workers (as TF's does), W^2 messages, so not linear in W */
        {"8 Ki parameters x 10 steps, health check on", 10, 1023, 8, 1, 0, {64, 256, 1024, 0}, 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        bad |= run_series(&table[i]);
    return bad;
}
