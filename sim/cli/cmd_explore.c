/* dsim explore SCENARIO --runs N: randomised fault search under the sim
 * engine, with shrinking (sim/harness/explore.h does the work). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "dsim/err.h"
#include "harness/explore.h"

void cmd_explore_help(FILE *out)
{
    fprintf(out,
            "usage: dsim explore SCENARIO [--runs N] [--seed S] [--max-faults K]\n"
            "                    [--kinds LIST] [--timeout SECONDS] [--max-shrink-runs M]\n"
            "                    [-o FILE] [--plugin-dir DIR]\n"
            "       dsim explore --shapes SCENARIO [--runs N] [--seed S] [--timeout SECONDS]\n"
            "                    [--max-shrink-runs M] [-o FILE] [--plugin-dir DIR]\n"
            "\n"
            "Runs SCENARIO under engine sim again and again, each run with a fault schedule of\n"
            "its own: 1 to K faults, each of a kind from LIST, at a step of the job (drawn\n"
            "from the steps of a fault-free run), on a rank, a worker or a link of the\n"
            "scenario's cluster, with a drawn duration (pause, partition, delay) or factor\n"
            "(slow). Run i's schedule depends only on --seed and i. The scenario's own\n"
            "`faults:` section is replaced by the drawn one (and its engine by sim), and\n"
            "a `matrix:` left out (the file's own shape is explored); everything else,\n"
            "recovery and expect included, is the file's.\n"
            "\n"
            "A run fails when the scenario's expectations are not met: a check of `expect:`\n"
            "that does not meet its expectation, or a run that errs, hangs, crashes or\n"
            "outlives --timeout. A consequence of a fault the scenario accepts (a node loss\n"
            "detected and recovered from under `recovery: restart`, judged by node_loss and\n"
            "gradient_consistency) is no failure: state in `expect:` what must hold under\n"
            "any fault. The fault-free run must pass first (node_loss, which judges a\n"
            "fault that loses a node, is left out of it); when it fails, it is written to\n"
            "-o's file as it ran, for `dsim run`.\n"
            "\n"
            "At the first failure the search stops and shrinks the schedule (delta\n"
            "debugging, to a fixed point): drop a fault, move one earlier, narrow a worker to\n"
            "one rank, move it to a lower rank, halve a duration or slow factor, take a host\n"
            "away (hosts > 2, when the faults still fit and the smaller cluster passes\n"
            "without them). A\n"
            "change is kept only if the run still fails with the same check (or hung,\n"
            "crashed, timeout, error). The minimal schedule is written as a standalone\n"
            "scenario (the file with its faults, engine and seed replaced by `engine: sim`,\n"
            "the scenario's seed and the faults), run once more from the written file, and\n"
            "the `dsim run` command that reproduces it is printed.\n"
            "\n"
            "With --shapes, the runs vary sizes instead of faults (the scenario's faults,\n"
            "engine, seed, matrix and liveness are left out; engine sim): each run takes a\n"
            "cluster shape (1 replica, primes of replicas on one host or one device per\n"
            "host, hosts x devices pairs that differ; one the strategy refuses is drawn\n"
            "again), a model width (data.features, data.classes) whose parameter count the\n"
            "replicas mostly do not divide, or fewer parameters than replicas, and a global\n"
            "batch with a remainder, with examples that end in a short last batch (one\n"
            "example, one less than the replicas or the batch). The file at its own sizes\n"
            "must pass first. The first failure is shrunk (fewer hosts, devices, features,\n"
            "classes, epochs, a smaller batch, fewer examples, each change kept only if the\n"
            "run still fails the same way) and written (default NAME.shapes.yaml) with the\n"
            "`dsim run` command that reproduces it.\n"
            "\n"
            "  --shapes            search sizes, not faults (--max-faults, --kinds unused)\n"
            "  --runs N            runs to make (default 100; --shapes: 40)\n"
            "  --seed S            seed of the schedule stream (default 1)\n"
            "  --max-faults K      at most K faults a run, 1 to %d (default 3)\n"
            "  --kinds LIST        comma-separated, from: %s\n"
            "                      (default all of them)\n"
            "  --timeout SECONDS   wall-clock bound of one run (default 60); each run goes in\n"
            "                      a child process, so a crash or a hang ends only that run\n"
            "  --max-shrink-runs M bound on the runs shrinking makes (default 200)\n"
            "  -o, --output FILE   the minimal scenario (default NAME.explore.yaml here); a\n"
            "                      relative strategy.plugin is then looked up from there\n"
            "  --plugin-dir DIR    where to look for a strategy plugin first (as dsim run)\n"
            "\n"
            "Runs are not stored. Progress goes to stdout: runs done, failures, each shrink\n"
            "step.\n"
            "\n"
            "Exit status: 0 no run failed, 1 a run failed (the scenario is written), 2 bad\n"
            "input (no scenario, --runs 0, an unknown kind, a file that does not load).\n",
            DSIM_EXPLORE_MAX_FAULTS, dsim_explore_kind_names());
}

static void explore_say(const char *line, void *user)
{
    (void)user;
    printf("%s\n", line);
    fflush(stdout);
}

static int explore_num(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (!*v || *end || errno || v[0] == '-' || n < lo || n > hi) {
        fprintf(stderr,
                "dsim explore: %s is '%s' (accepted: a whole number from %" PRIu64 " to %" PRIu64
                ")\n",
                flag, v, lo, hi);
        return 2;
    }
    *out = n;
    return 0;
}

static int explore_kinds(const char *list, unsigned *out)
{
    *out = 0;
    char *copy = strdup(list);
    if (!copy)
        return 2;
    int rc = 0;
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        unsigned k = dsim_explore_kind(t);
        if (!k) {
            fprintf(stderr, "dsim explore: unknown fault kind '%s' in --kinds (accepted: %s)\n", t,
                    dsim_explore_kind_names());
            rc = 2;
            break;
        }
        *out |= k;
    }
    free(copy);
    if (rc == 0 && !*out) {
        fprintf(stderr, "dsim explore: --kinds is empty (accepted: %s)\n",
                dsim_explore_kind_names());
        rc = 2;
    }
    return rc;
}

/* What --shapes found: printed, exit 1. */
static int explore_shapes_found(const dsim_explore_opts *o, const dsim_explore_result *r)
{
    if (r->baseline_failed) {
        printf("FAILED at its own sizes (%s): %s: %s\n", r->shape_found, r->signature, r->message);
        if (r->baseline_written)
            printf("wrote %s (the scenario as it ran)\nreproduce with: dsim run %s%s\n",
                   r->out_path, r->out_path, o->run_args ? o->run_args : "");
        else
            printf("(run it with: dsim run %s --engine sim, its faults: section left out)\n",
                   o->path);
        return 1;
    }
    printf("FAILED: run %" PRIu64 " of %" PRIu64 " failed with %s at %s;\n"
           "shrunk to %s (%d kept changes, %d shrink runs):\n%s\n",
           r->failing_run, o->runs, r->signature, r->shape_found, r->shape_final, r->shrink_steps,
           r->shrink_runs, r->message);
    printf("wrote %s (%s)\nreproduce with: dsim run %s%s\n", r->out_path,
           r->reproduced ? "verified: it fails the same way"
                         : "NOT verified: it did not fail the same way when run again",
           r->out_path, o->run_args ? o->run_args : "");
    return 1;
}

int cmd_explore(int argc, char **argv)
{
    dsim_explore_opts o = {.size = sizeof o,
                           .runs = 100,
                           .seed = 1,
                           .max_faults = 3,
                           .kinds = DSIM_EXPLORE_ALL_KINDS,
                           .run_timeout_s = 60,
                           .max_shrink_runs = 200,
                           .say = explore_say};
    static char run_args[4200];
    bool shapes = false, runs_given = false;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        uint64_t n;
        if (strcmp(argv[i], "--shapes") == 0) {
            shapes = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--runs", &missing))) {
            if (explore_num("--runs", v, 1, UINT64_C(1) << 40, &n))
                return 2;
            o.runs = n;
            runs_given = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--seed", &missing))) {
            if (explore_num("--seed", v, 0, UINT64_MAX, &n))
                return 2;
            o.seed = n;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--max-faults", &missing))) {
            if (explore_num("--max-faults", v, 1, DSIM_EXPLORE_MAX_FAULTS, &n))
                return 2;
            o.max_faults = (int)n;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--kinds", &missing))) {
            if (explore_kinds(v, &o.kinds))
                return 2;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--timeout", &missing))) {
            if (explore_num("--timeout", v, 1, 86400, &n))
                return 2;
            o.run_timeout_s = (double)n;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--max-shrink-runs", &missing))) {
            if (explore_num("--max-shrink-runs", v, 1, 100000, &n))
                return 2;
            o.max_shrink_runs = (int)n;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--output", &missing)) ||
                   (!missing && (v = dsim_cli_flag(argc, argv, &i, "-o", &missing)))) {
            if (!*v) {
                fprintf(stderr, "dsim explore: -o needs a file name\n");
                return 2;
            }
            o.out_path = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--plugin-dir", &missing))) {
            if (dsim_cli_plugin_dir("explore", v))
                return 2;
            snprintf(run_args, sizeof run_args, " --plugin-dir %s", v);
            o.run_args = run_args;
        } else if (missing) {
            fprintf(stderr, "dsim explore: %s needs a value (dsim explore --help)\n", argv[i]);
            return 2;
        } else if (argv[i][0] == '-' || o.path) {
            fprintf(stderr,
                    "dsim explore: unexpected '%s' (usage: dsim explore SCENARIO --runs N; "
                    "dsim explore --help)\n",
                    argv[i]);
            return 2;
        } else {
            o.path = argv[i];
        }
    }
    if (!o.path) {
        fprintf(stderr, "dsim explore: which scenario? (usage: dsim explore SCENARIO --runs N; "
                        "dsim explore --help)\n");
        return 2;
    }
    if (shapes && !runs_given)
        o.runs = 40;
    dsim_explore_result r;
    if ((shapes ? dsim_explore_shapes(&o, &r) : dsim_explore(&o, &r)) != DSIM_OK) {
        fprintf(stderr, "dsim explore: %s\n", dsim_errmsg());
        return 2;
    }
    if (!r.found)
        return 0;
    if (shapes)
        return explore_shapes_found(&o, &r);
    if (r.baseline_failed) {
        if (r.baseline_written)
            printf("FAILED without faults: %s: %s\nwrote %s (the scenario without its faults)\n"
                   "reproduce with: dsim run %s%s\n",
                   r.signature, r.message, r.out_path, r.out_path, o.run_args ? o.run_args : "");
        else
            printf("FAILED without faults: %s: %s\n(run it with: dsim run %s --engine sim, "
                   "its faults: section left out)\n",
                   r.signature, r.message, o.path);
        return 1;
    }
    printf("FAILED: run %" PRIu64 " of %" PRIu64 " failed with %s; shrunk from %d faults to %d "
           "(%d kept changes, %d shrink runs, %d hosts):\n%s%s\n",
           r.failing_run, o.runs, r.signature, r.faults_found, r.faults_final, r.shrink_steps,
           r.shrink_runs, r.hosts_final, r.schedule, r.message);
    printf("wrote %s (%s)\nreproduce with: dsim run %s%s\n", r.out_path,
           r.reproduced ? "verified: it fails the same way"
                        : "NOT verified: it did not fail the "
                          "same way when run again",
           r.out_path, o.run_args ? o.run_args : "");
    return 1;
}
