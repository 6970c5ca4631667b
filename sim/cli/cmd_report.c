/* dsim report: runs of the results store as one self-contained HTML page
 * (sim/report/report.h draws it). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "report.h"
#include "store.h"

void cmd_report_help(FILE *out)
{
    fprintf(out,
            "usage: dsim report RUN_ID... [-o FILE.html] [--db PATH]\n"
            "\n"
            "Writes one HTML file that needs nothing else (no network, no scripts): the\n"
            "scenario and its seed, the checks with their messages, the first step at which\n"
            "the replicas' parameters differ, loss per replica over steps (and the reduced\n"
            "loss, and the one-device reference's final loss), examples/s over time, step\n"
            "time per replica (stragglers marked), the all-reduce share of step time, the\n"
            "cold-start phases, and the faults, errors, restarts and checkpoint writes on a\n"
            "timeline.\n"
            "Several run ids are compared side by side.\n"
            "\n"
            "  RUN_ID       a run id as 'dsim list runs' shows it, or 'last'\n"
            "  -o FILE      where to write (default dsim-report-ID[-ID...].html in the\n"
            "               working directory; '-' for standard output)\n"
            "  --db PATH    the results store (default %s)\n"
            "\n"
            "Exit status: 0 written, 2 bad input (an unknown run id, a store that cannot\n"
            "be read, a file that cannot be written).\n",
            DSIM_STORE_DEFAULT_PATH);
}

int cmd_report(int argc, char **argv)
{
    const char *db = DSIM_STORE_DEFAULT_PATH, *outp = NULL;
    const char **ids_arg = calloc((size_t)argc, sizeof *ids_arg);
    int64_t *ids = calloc((size_t)argc, sizeof *ids);
    size_t n = 0;
    int rc = 0;
    if (!ids_arg || !ids) {
        fprintf(stderr, "dsim report: out of memory\n");
        rc = 2;
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        int f = dsim_cli_output_flags("report", argc, argv, &i, &db, &outp);
        if (f == 2) {
            rc = 2;
            goto out;
        } else if (f == 1) {
            continue;
        } else if (argv[i][0] == '-') {
            fprintf(stderr,
                    "dsim report: unknown option '%s' (accepted: -o FILE, --db PATH; see 'dsim "
                    "report --help')\n",
                    argv[i]);
            rc = 2;
            goto out;
        } else {
            ids_arg[n++] = argv[i];
        }
    }
    if (n == 0) {
        fprintf(stderr,
                "dsim report: which run? name one or more run ids ('dsim list runs --db "
                "%s' lists them, 'last' is the newest)\n",
                db);
        rc = 2;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (dsim_report_parse_run_id(db, ids_arg[i], &ids[i]) != DSIM_OK) {
            fprintf(stderr, "dsim report: %s\n", dsim_errmsg());
            rc = 2;
            goto out;
        }
    }
    char def[256];
    if (!outp) {
        int len = snprintf(def, sizeof def, "dsim-report");
        for (size_t i = 0; i < n && len < (int)sizeof def - 32; i++)
            len += snprintf(def + len, sizeof def - (size_t)len, "-%" PRId64, ids[i]);
        snprintf(def + len, sizeof def - (size_t)len, ".html");
        outp = def;
    }
    dsim_err e = strcmp(outp, "-") == 0 ? dsim_report_html(db, ids, n, stdout)
                                        : dsim_report_html_write(db, ids, n, outp);
    if (e != DSIM_OK) {
        fprintf(stderr, "dsim report: %s\n", dsim_errmsg());
        rc = 2;
    } else if (strcmp(outp, "-") != 0) {
        printf("%s\n", outp);
    }
out:
    free(ids_arg);
    free(ids);
    return rc;
}
