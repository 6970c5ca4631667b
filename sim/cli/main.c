/* dsim: the command-line front end. One table of subcommands; each lives in
 * its own cmd_*.c file. */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "dsim_config.h"

static const dsim_cmd main_cmds[] = {
    {"bench", "time a collective (nccl-tests' flags and columns)", cmd_bench, cmd_bench_help},
    {"calibrate", "calibrate the cost model to this machine; predicted all-reduce times",
     cmd_calibrate, cmd_calibrate_help},
    {"cluster", "resolve TF_CONFIG (or hosts x devices) and print the cluster as JSON", cmd_cluster,
     cmd_cluster_help},
    {"validate", "check scenario files without running them", cmd_validate, cmd_validate_help},
    {"plan", "print what a scenario will do (cluster, sharding, batches) as JSON", cmd_plan,
     cmd_plan_help},
    {"list", "list strategies, algorithms, checks, or the runs in the results store", cmd_list,
     cmd_list_help},
    {"run", "run scenarios, judge them with their checks, store the results", cmd_run,
     cmd_run_help},
    {"whatif", "predict step and all-reduce time on other hardware (cost models)", cmd_whatif,
     cmd_whatif_help},
    {"worker", "run one task of a multi-machine job (TF_CONFIG, mpirun, srun)", cmd_worker,
     cmd_worker_help},
    {"report", "write runs of the results store as one HTML page with plots", cmd_report,
     cmd_report_help},
    {"trace", "a run as Chrome trace-event JSON; 'desync RUN_ID': why a failed run hung", cmd_trace,
     cmd_trace_help},
    {"replay", "run a stored sim run again and compare its event trace", cmd_replay,
     cmd_replay_help},
    {"export", "write a stored run's data, parameters and batches for another framework",
     cmd_export, cmd_export_help},
    {"explore",
     "search random fault schedules (or sizes: --shapes) under sim; shrink a failing one",
     cmd_explore, cmd_explore_help},
    {"conformance", "run the standard battery of cases against a strategy (a plugin or a name)",
     cmd_conformance, cmd_conformance_help},
};
#define MAIN_NCMDS (sizeof main_cmds / sizeof main_cmds[0])

static void main_usage(FILE *out)
{
    fprintf(out, "usage: dsim <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < MAIN_NCMDS; i++)
        fprintf(out, "  %-12s %s\n", main_cmds[i].name, main_cmds[i].summary);
    fprintf(out, "\n'dsim help <command>' or 'dsim <command> --help' shows a command's options.\n"
                 "'dsim --version' prints the version.\n");
}

static const dsim_cmd *main_find(const char *name)
{
    for (size_t i = 0; i < MAIN_NCMDS; i++)
        if (strcmp(main_cmds[i].name, name) == 0)
            return &main_cmds[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        main_usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        main_usage(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        printf("dsim %s\n", DSIM_VERSION);
        return 0;
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            main_usage(stdout);
            return 0;
        }
        const dsim_cmd *c = main_find(argv[2]);
        if (!c) {
            fprintf(stderr, "dsim: unknown command '%s'; run 'dsim --help' for the list\n",
                    argv[2]);
            return 2;
        }
        c->help(stdout);
        return 0;
    }
    const dsim_cmd *c = main_find(name);
    if (!c) {
        fprintf(stderr, "dsim: unknown command '%s'; run 'dsim --help' for the list\n", name);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            c->help(stdout);
            return 0;
        }
    }
    return c->run(argc - 1, argv + 1);
}
