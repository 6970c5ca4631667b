/* One scenario as `dsim run` runs it (the harness: the store, the job, the
 * one-device reference, the checks), timed: by default
 * scenarios/scale/mlp_1024x100.yaml, 1024 replicas x 100 steps of a 64 Ki-
 * parameter MLP with its reference.
 *
 *   bench_sim_job [SCENARIO] [--repeat N] [--after-only]
 *
 * Runs the scenario N times (3) with the reference beside the job (the
 * default on the sim engine) and N times with it after the job
 * (dsim_harness_opts.reference_after), alternating, each run in a child
 * process of its own so that its peak RSS is its own. One line per run:
 * the mode, wall and CPU seconds (user + system) of the whole run, the
 * training's wall seconds, peak RSS; then the medians of each mode and what
 * replaying beside the job saved. The load average before and after is
 * printed: on a machine shared with other work, wall seconds count the time
 * the process waited for a CPU.
 *
 * Exit 1 when a run fails or does not pass its checks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness/harness.h"

typedef struct job_run {
    double wall, cpu, train_wall, peak_mib;
    int beside; /* the reference ran beside the job */
    int passed;
} job_run;

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void print_load(const char *when)
{
    char buf[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            snprintf(buf, sizeof buf, "?\n");
        fclose(f);
    }
    printf("# load average %s: %s", when, buf);
}

/* The run in this (child) process; what it came to in *jr. */
static void job_body(const char *path, int after, job_run *jr)
{
    char db[64];
    snprintf(db, sizeof db, "/tmp/bench_sim_job_%ld.db", (long)getpid());
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(path, &s) != DSIM_OK) {
        fprintf(stderr, "bench_sim_job: %s\n", dsim_errmsg());
        return;
    }
    dsim_harness_opts o = {.size = sizeof o, .db_path = db, .reference_after = after};
    dsim_harness_result r;
    if (dsim_harness_run(s, &o, &r) == DSIM_OK) {
        jr->passed = r.status == DSIM_RUN_PASSED;
        jr->beside = r.reference_beside;
        jr->train_wall = r.wall_s;
        if (!jr->passed)
            fprintf(stderr, "bench_sim_job: %s: %s%s\n", path, dsim_run_status_name(r.status),
                    r.train_msg[0] ? r.train_msg : "");
        dsim_harness_result_free(&r);
    } else {
        fprintf(stderr, "bench_sim_job: %s\n", dsim_errmsg());
    }
    dsim_scenario_free(s);
    unlink(db);
    char side[80];
    snprintf(side, sizeof side, "%s-wal", db);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", db);
    unlink(side);
}

static int run_job(const char *path, int after, job_run *jr)
{
    int fd[2];
    memset(jr, 0, sizeof *jr);
    fflush(stdout);
    if (pipe(fd) != 0)
        return 1;
    double t0 = wall_s();
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return 1;
    }
    if (pid == 0) {
        close(fd[0]);
        job_run r = {0};
        job_body(path, after, &r);
        ssize_t n = write(fd[1], &r, sizeof r);
        _exit(n == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    ssize_t n = read(fd[0], jr, sizeof *jr);
    close(fd[0]);
    int status = 0;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR)
        ;
    jr->wall = wall_s() - t0;
    jr->cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
              (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    jr->peak_mib = (double)ru.ru_maxrss / 1024.0;
    if (n != (ssize_t)sizeof *jr || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    return !jr->passed;
}

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

#define MAX_REPEAT 16

int main(int argc, char **argv)
{
    const char *path = NULL;
    int repeat = 3, after_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            repeat = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--after-only") == 0) {
            after_only = 1;
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            fprintf(stderr, "usage: bench_sim_job [SCENARIO] [--repeat N] [--after-only]\n");
            return 2;
        }
    }
    if (!path)
        path = DSIM_SCALE_SCENARIO;
    if (repeat < 1 || repeat > MAX_REPEAT) {
        fprintf(stderr, "bench_sim_job: --repeat %d: give 1 to %d\n", repeat, MAX_REPEAT);
        return 2;
    }
    printf("# %s through the harness (dsim run), each run in a process of its own\n", path);
    print_load("before");
    printf("# reference   wall_s    cpu_s  train_wall_s  peak_MiB\n");
    double w[2][MAX_REPEAT], c[2][MAX_REPEAT], tw[2][MAX_REPEAT], m[2][MAX_REPEAT];
    int bad = 0, beside_ran = 0;
    for (int k = 0; k < repeat; k++) {
        for (int after = after_only ? 1 : 0; after < 2; after++) {
            job_run jr;
            int e = run_job(path, after, &jr);
            bad |= e;
            if (!after)
                beside_ran |= jr.beside;
            printf("  %-9s %8.2f %8.2f %13.2f %9.0f%s\n",
                   after       ? "after"
                   : jr.beside ? "beside"
                               : "after(1cpu)",
                   jr.wall, jr.cpu, jr.train_wall, jr.peak_mib, e ? "  FAILED" : "");
            fflush(stdout);
            w[after][k] = jr.wall;
            c[after][k] = jr.cpu;
            tw[after][k] = jr.train_wall;
            m[after][k] = jr.peak_mib;
        }
    }
    print_load("after");
    for (int after = after_only ? 1 : 0; after < 2; after++)
        printf("# reference %s the job, medians of %d: wall %.2f s, cpu %.2f s, training %.2f s "
               "wall, peak %.0f MiB\n",
               after ? "after" : "beside", repeat, median(w[after], repeat),
               median(c[after], repeat), median(tw[after], repeat), median(m[after], repeat));
    if (!after_only && beside_ran) {
        double wb = median(w[0], repeat), wa = median(w[1], repeat);
        printf("# beside the job saved %.2f s of wall time (%.0f %%)\n", wa - wb,
               100.0 * (wa - wb) / wa);
    }
    return bad;
}
