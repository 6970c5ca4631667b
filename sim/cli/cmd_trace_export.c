/* dsim trace RUN_ID: one run as Chrome trace-event JSON for Perfetto's UI
 * (ui.perfetto.dev, "Open trace file") or chrome://tracing; what the trace
 * holds is described in sim/report/trace_events.c. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "report.h"
#include "store.h"

void dsim_cmd_trace_export_help(FILE *out)
{
    fprintf(out,
            "usage: dsim trace RUN_ID [-o FILE.json] [--db PATH]\n"
            "\n"
            "Writes the run as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and\n"
            "chrome://tracing open: a track per replica with its steps (loss, checksum and\n"
            "examples as arguments) inside one span per attempt (a restart starts the next),\n"
            "cold-start phases as slices, faults, errors, restarts and checkpoint writes as\n"
            "instant events, each replica's collectives on a track of their own (dsim's\n"
            "driver stores its allreduce and reduce_loss phases; threads and processes\n"
            "engines), for runs of up to %d replicas arrows to each waiting call from the\n"
            "last replica to enter, and arrows from each transport frame's send to its\n"
            "arrival (stored for jobs of up to %d ranks: the first %d frames of each link\n"
            "per attempt; otherData.messages says how many).\n"
            "A replica with more than %d steps keeps every k-th step's slice (the trace's\n"
            "otherData.sampling says which).\n"
            "\n"
            "  RUN_ID       a run id as 'dsim list runs' shows it, or 'last'\n"
            "  -o FILE      where to write (default dsim-trace-ID.json in the working\n"
            "               directory; '-' for standard output)\n"
            "  --db PATH    the results store (default %s)\n"
            "\n"
            "Exit status: 0 written, 2 bad input (an unknown run id, a store that cannot\n"
            "be read, a file that cannot be written).\n",
            DSIM_TRACE_FLOW_MAX_REPLICAS, DSIM_TRACE_MSG_MAX_RANKS, DSIM_TRACE_MSG_PER_LINK,
            DSIM_TRACE_MAX_STEPS_PER_REPLICA, DSIM_STORE_DEFAULT_PATH);
}

int dsim_cmd_trace_export(int argc, char **argv)
{
    const char *db = DSIM_STORE_DEFAULT_PATH, *outp = NULL, *id_arg = NULL;
    for (int i = 1; i < argc; i++) {
        int f = dsim_cli_output_flags("trace", argc, argv, &i, &db, &outp);
        if (f == 2) {
            return 2;
        } else if (f == 1) {
            continue;
        } else if (argv[i][0] == '-') {
            fprintf(stderr,
                    "dsim trace: unknown option '%s' (accepted: -o FILE, --db PATH; see 'dsim "
                    "trace --help')\n",
                    argv[i]);
            return 2;
        } else if (id_arg) {
            fprintf(stderr, "dsim trace: one run at a time: '%s' and '%s'\n", id_arg, argv[i]);
            return 2;
        } else {
            id_arg = argv[i];
        }
    }
    if (!id_arg) {
        fprintf(stderr,
                "dsim trace: which run? name a run id ('dsim list runs --db %s' lists them, "
                "'last' is the newest)\n",
                db);
        return 2;
    }
    int64_t id = 0;
    if (dsim_report_parse_run_id(db, id_arg, &id) != DSIM_OK) {
        fprintf(stderr, "dsim trace: %s\n", dsim_errmsg());
        return 2;
    }
    char def[64];
    if (!outp) {
        snprintf(def, sizeof def, "dsim-trace-%" PRId64 ".json", id);
        outp = def;
    }
    dsim_err e = strcmp(outp, "-") == 0 ? dsim_report_trace(db, id, stdout)
                                        : dsim_report_trace_write(db, id, outp);
    if (e != DSIM_OK) {
        fprintf(stderr, "dsim trace: %s\n", dsim_errmsg());
        return 2;
    }
    if (strcmp(outp, "-") != 0)
        printf("%s\n", outp);
    return 0;
}
