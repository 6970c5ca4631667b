/* The dsim command's subcommands. Each returns the process exit status:
 * 0 success, 1 a failed check or a wrong result, 2 bad input. */
#ifndef DSIM_CLI_CMDS_H
#define DSIM_CLI_CMDS_H

#include <stdbool.h>
#include <stdio.h>

typedef struct dsim_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
    void (*help)(FILE *out);
} dsim_cmd;

int cmd_bench(int argc, char **argv);
void cmd_bench_help(FILE *out);
/* dsim bench model: the models' compute against a single-core peak (cmd_bench_model.c) */
int cmd_bench_model(int argc, char **argv);
void cmd_bench_model_help(FILE *out);
int cmd_cluster(int argc, char **argv);
void cmd_cluster_help(FILE *out);
int cmd_list(int argc, char **argv);
void cmd_list_help(FILE *out);
/* dsim list devices (cmd_list_devices.c); as_json: JSON instead of a table */
int cmd_list_devices(bool as_json);
int cmd_run(int argc, char **argv);
void cmd_run_help(FILE *out);
int cmd_validate(int argc, char **argv);
void cmd_validate_help(FILE *out);
int cmd_export(int argc, char **argv);
void cmd_export_help(FILE *out);
int cmd_replay(int argc, char **argv);
void cmd_replay_help(FILE *out);
int cmd_explore(int argc, char **argv);
void cmd_explore_help(FILE *out);
int cmd_conformance(int argc, char **argv);
void cmd_conformance_help(FILE *out);
int cmd_plan(int argc, char **argv);
int cmd_worker(int argc, char **argv);
void cmd_worker_help(FILE *out);
void cmd_plan_help(FILE *out);
int cmd_trace(int argc, char **argv);
void cmd_trace_help(FILE *out);
int cmd_calibrate(int argc, char **argv);
void cmd_calibrate_help(FILE *out);
int cmd_whatif(int argc, char **argv);
void cmd_whatif_help(FILE *out);
int cmd_report(int argc, char **argv);
void cmd_report_help(FILE *out);
/* dsim trace RUN_ID: the run as Chrome trace-event JSON (cmd_trace_export.c) */
int dsim_cmd_trace_export(int argc, char **argv);
void dsim_cmd_trace_export_help(FILE *out);

/* The value of `--name VALUE` or `--name=VALUE` at argv[*i] (advancing *i
 * past a separate value); NULL if argv[*i] is another flag. Sets *missing
 * when the flag is there without a value. */
const char *dsim_cli_flag(int argc, char **argv, int *i, const char *name, int *missing);

/* --db PATH, -o FILE and --output FILE of report and trace at argv[*i]:
 * 1 taken (into *db or *out, advancing *i past a separate value), 0 not one
 * of them, 2 after a message (no value, or an empty one). */
int dsim_cli_output_flags(const char *cmd, int argc, char **argv, int *i, const char **db,
                          const char **out);

/* --plugin-dir DIR of run, validate and plan: DIR is searched first for a
 * strategy plugin named by a bare file name (before $DSIM_PLUGIN_PATH and
 * the build's and installed plugin directories). 0, or 2 after a message. */
int dsim_cli_plugin_dir(const char *cmd, const char *dir);

/* The table `dsim run` prints after a run (cmd_run.c), for dsim worker. */
struct dsim_scenario;
struct dsim_harness_result;
void dsim_cli_print_run(const char *file, const struct dsim_scenario *s,
                        const struct dsim_harness_result *rep, const char *db);

#endif
