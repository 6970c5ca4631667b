/* dsim replay RUN_ID: runs a stored sim run again from its scenario text
 * and seed, and says whether the event trace came out the same. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "dsim/err.h"
#include "harness/harness.h"
#include "store.h"

void cmd_replay_help(FILE *out)
{
    fprintf(out, "usage: dsim replay RUN_ID [--db PATH]\n"
                 "\n"
                 "Runs stored run RUN_ID again under engine sim, from the scenario text and seed\n"
                 "stored with it, stores the replay as a new run, and compares the hashes of the\n"
                 "two event traces (every send, delivery, receive, fault, clock jump and worker\n"
                 "switch, in order, and the final parameters). Only runs made under engine sim\n"
                 "replay; `dsim run` prints this command for a sim run that failed a check.\n"
                 "\n"
                 "  --db PATH   the results store (default dsim.db)\n"
                 "\n"
                 "Exit status: 0 the trace matched, 1 it differed, 2 bad input (no such run,\n"
                 "a run of another engine, an unreadable store).\n");
}

int cmd_replay(int argc, char **argv)
{
    const char *db = NULL, *idtxt = NULL;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cmd_replay_help(stdout);
            return 0;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--db", &missing))) {
            db = v;
        } else if (missing) {
            fprintf(stderr, "dsim replay: --db needs a path\n");
            return 2;
        } else if (argv[i][0] == '-' || idtxt) {
            fprintf(stderr,
                    "dsim replay: unexpected '%s' (usage: dsim replay RUN_ID [--db PATH])\n",
                    argv[i]);
            return 2;
        } else {
            idtxt = argv[i];
        }
    }
    if (!idtxt) {
        fprintf(stderr, "dsim replay: which run? (usage: dsim replay RUN_ID [--db PATH]; "
                        "dsim list runs shows the ids)\n");
        return 2;
    }
    char *end = NULL;
    errno = 0;
    long long id = strtoll(idtxt, &end, 10);
    if (!*idtxt || *end || errno || id < 1) {
        fprintf(stderr, "dsim replay: RUN_ID is '%s' (accepted: a run id, a whole number >= 1)\n",
                idtxt);
        return 2;
    }
    const char *path = db ? db : DSIM_STORE_DEFAULT_PATH;
    dsim_store *st = NULL;
    if (dsim_store_open(path, &st) != DSIM_OK) {
        fprintf(stderr, "dsim replay: %s\n", dsim_errmsg());
        return 2;
    }
    dsim_harness_opts ho = {.size = sizeof ho, .store = st};
    dsim_harness_result rep;
    dsim_harness_replay_info info;
    dsim_err e = dsim_harness_replay(path, (dsim_run_id)id, &ho, &rep, &info);
    int rc;
    if (e != DSIM_OK && !info.stored_hash[0]) {
        fprintf(stderr, "dsim replay: %s\n", dsim_errmsg());
        rc = 2;
    } else if (e != DSIM_OK) {
        fprintf(stderr, "dsim replay: run %lld (%s, seed %" PRIu64 ") could not run again: %s\n",
                id, info.scenario, info.seed, rep.harness_msg[0] ? rep.harness_msg : dsim_errmsg());
        rc = 2;
    } else {
        printf("run %lld (%s, seed %" PRIu64 ") replayed as run %" PRId64 ": %s\n", id,
               info.scenario, info.seed, (int64_t)rep.run_id, dsim_run_status_name(rep.status));
        printf("  stored trace %s\n  replay trace %s (%" PRIu64 " events in the last attempt)\n",
               info.stored_hash, info.replay_hash, rep.trace_events);
        printf("%s\n", info.matched ? "trace matches: the run is reproduced event for event"
                                    : "TRACE DIFFERS: the same scenario and seed took another "
                                      "course; something in the run is not deterministic");
        rc = info.matched ? 0 : 1;
    }
    dsim_harness_result_free(&rep);
    if (dsim_store_close(st) != DSIM_OK && rc == 0) {
        fprintf(stderr, "dsim replay: %s\n", dsim_errmsg());
        rc = 2;
    }
    return rc;
}
