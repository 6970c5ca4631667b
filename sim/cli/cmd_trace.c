/* dsim trace: what a run left behind. `desync` analyses the flight
 * records of a failed run (sim/diag/flight.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "diag/flight.h"
#include "store.h"

void cmd_trace_help(FILE *out)
{
    dsim_cmd_trace_export_help(out);
    fprintf(out,
            "\n"
            "usage: dsim trace desync RUN_ID [--db PATH]\n"
            "       dsim trace desync FILE.json\n"
            "\n"
            "Why did it hang? A run that fails (a timeout, an abort, a crash) or fails a\n"
            "check leaves the flight records of its collectives next to the results\n"
            "store, in dsim-flight/run-RUN_ID.json: every rank's last calls (default\n"
            "2000) with their fingerprints, state (scheduled, started, completed), times\n"
            "and the peer each was waiting for, under the field names of PyTorch's NCCL\n"
            "flight recorder (the store's flight_records table holds the same rows).\n"
            "'desync' reads them and says:\n"
            "  - the first collective not every rank completed (#N, what it was);\n"
            "  - which ranks never called it, and the last call each of them made;\n"
            "  - which ranks called something else under that number (and what differs);\n"
            "  - which ranks were in it, and whom each was waiting for;\n"
            "  - the last call each rank completed;\n"
            "and a verdict.\n"
            "\n"
            "options:\n"
            "  --db PATH   the results store the run is in (default %s)\n"
            "\n"
            "Exit status: 0 analysed, 2 bad input or no records for that run.\n",
            DSIM_STORE_DEFAULT_PATH);
}

/* dsim trace desync RUN_ID|FILE [--db PATH] */
static int trace_desync(int argc, char **argv)
{
    const char *what = NULL, *db = NULL;
    for (int i = 2; i < argc; i++) {
        int missing = 0;
        const char *v = dsim_cli_flag(argc, argv, &i, "--db", &missing);
        if (missing) {
            fprintf(stderr, "dsim trace desync: --db needs a path\n");
            return 2;
        }
        if (v) {
            db = v;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dsim trace desync: unknown option '%s' (accepted: --db PATH)\n",
                    argv[i]);
            return 2;
        } else if (what) {
            fprintf(stderr, "dsim trace desync: one run at a time ('%s' and '%s')\n", what,
                    argv[i]);
            return 2;
        } else {
            what = argv[i];
        }
    }
    if (!what) {
        fprintf(stderr, "dsim trace desync: name a run id (see 'dsim list runs') or a file\n");
        return 2;
    }
    char path[1024];
    size_t wl = strlen(what);
    if (wl > 5 && strcmp(what + wl - 5, ".json") == 0) {
        snprintf(path, sizeof path, "%s", what);
    } else {
        char *end = NULL;
        unsigned long long id = strtoull(what, &end, 10);
        if (!*what || *end || id == 0) {
            fprintf(stderr,
                    "dsim trace desync: '%s' is not a run id (a number >= 1, see 'dsim list "
                    "runs') or a .json file\n",
                    what);
            return 2;
        }
        dsim_flight_path(db ? db : DSIM_STORE_DEFAULT_PATH, (uint64_t)id, path, sizeof path);
    }
    dsim_err e = dsim_flight_desync(path, stdout, NULL);
    if (e != DSIM_OK) {
        fprintf(stderr, "dsim trace desync: %s\n", dsim_errmsg());
        return 2;
    }
    return 0;
}

/* 'dsim trace desync ...' reads the flight records; 'dsim trace RUN_ID'
 * writes the run as Chrome trace-event JSON (cmd_trace_export.c). */
int cmd_trace(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "desync") == 0)
        return trace_desync(argc, argv);
    return dsim_cmd_trace_export(argc, argv);
}
