/* dsim export RUN --to DIR: what another framework needs to replay a
 * stored run (sim/harness/export.c writes it). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "dsim/err.h"
#include "harness/harness.h"
#include "store.h"

void cmd_export_help(FILE *out)
{
    fprintf(out,
            "usage: dsim export RUN_ID --to DIR [--db PATH] [--per-step]\n"
            "\n"
            "Writes what another framework (PyTorch, JAX, NumPy) needs to replay stored run\n"
            "RUN_ID into folder DIR, as NumPy .npy files and a JSON manifest:\n"
            "  x.npy, y.npy            the dataset (float32 features; int64 class indices or\n"
            "                          float32 regression targets); example id = row\n"
            "  initial_params.npy      the model's parameters before the first step\n"
            "  final_params.npy        replica 0's parameters after the last step\n"
            "  reference_final_params.npy  the one-device reference's\n"
            "  final_optim_state.npy   the optimizer's slots at the end of the one-device\n"
            "                          reference (momentum: accum; adam: m then v; sgd: empty)\n"
            "  batches.npy             int64 (steps, replicas, max batch): each replica's\n"
            "                          example ids per step, -1 past its batch\n"
            "  batch_sizes.npy         int64 (steps, replicas)\n"
            "  params_per_step.npy     with --per-step: (steps, n_params), after each step\n"
            "  manifest.json           the model and its parameter layout, the optimizer with\n"
            "                          every hyper-parameter and its update rule, the batch rule\n"
            "                          and loss scale, the parameter checksum's algorithm and\n"
            "                          its value after every step\n"
            "\n"
            "The store keeps losses and checksums, not parameters: the run is trained again\n"
            "here from its stored scenario text and seed, on its engine, and every checksum\n"
            "the store holds is compared with the new run's. A run whose data came from\n"
            "files (data.source) needs those files where the run found them.\n"
            "\n"
            "  --to DIR      the folder to write (created if missing)\n"
            "  --db PATH     the results store (default dsim.db)\n"
            "  --per-step    also replica 0's parameters after every step\n"
            "\n"
            "Exit status: 0 written and every stored checksum matched, 1 written but the\n"
            "new run differed from the stored one, 2 bad input (no such run, a run with\n"
            "faults, data files gone, an unwritable folder).\n");
}

int cmd_export(int argc, char **argv)
{
    const char *db = NULL, *idtxt = NULL, *dir = NULL;
    bool per_step = false;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cmd_export_help(stdout);
            return 0;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--db", &missing))) {
            db = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--to", &missing))) {
            dir = v;
        } else if (missing) {
            fprintf(stderr, "dsim export: %s needs a path\n", argv[i]);
            return 2;
        } else if (strcmp(argv[i], "--per-step") == 0) {
            per_step = true;
        } else if (argv[i][0] == '-' || idtxt) {
            fprintf(stderr,
                    "dsim export: unexpected '%s' (usage: dsim export RUN_ID --to DIR [--db "
                    "PATH] [--per-step])\n",
                    argv[i]);
            return 2;
        } else {
            idtxt = argv[i];
        }
    }
    if (!idtxt || !dir) {
        fprintf(stderr,
                "dsim export: %s (usage: dsim export RUN_ID --to DIR [--db PATH] "
                "[--per-step]; dsim list runs shows the ids)\n",
                idtxt ? "where to? give --to DIR" : "which run?");
        return 2;
    }
    char *end = NULL;
    errno = 0;
    long long id = strtoll(idtxt, &end, 10);
    if (!*idtxt || *end || errno || id < 1) {
        fprintf(stderr, "dsim export: RUN_ID is '%s' (accepted: a run id, a whole number >= 1)\n",
                idtxt);
        return 2;
    }
    dsim_harness_export_info info;
    if (dsim_harness_export(db, (dsim_run_id)id, dir, per_step, &info) != DSIM_OK) {
        fprintf(stderr, "dsim export: %s\n", dsim_errmsg());
        return 2;
    }
    printf("run %lld (%s, seed %" PRIu64 ") exported to %s: %zu examples, %zu parameters, "
           "%" PRIu64 " steps x %d replicas\n",
           id, info.scenario, info.seed, dir, info.n_examples, info.n_params, info.steps,
           info.replicas);
    printf("  parameter checksums: initial %016" PRIx64 ", final %016" PRIx64 "\n",
           info.initial_checksum, info.final_checksum);
    printf("  final parameters vs the one-device reference: largest difference %.3g\n",
           info.ref_max_abs);
    if (info.ref_max_abs > 1e-3 && !per_step && !info.kept_steps)
        printf("  (float rounding, amplified over many steps, can part a correct run from any "
               "replay, this one's and another framework's: export with --per-step, and a "
               "replay can take each step from the run's own variables, as "
               "examples/compare/replay.py does)\n");
    if (info.differed) {
        printf("STORED RUN DIFFERS: %" PRIu64 " of the %" PRIu64
               " stored checksums are not the new run's: the files are of the run trained "
               "again, not bit for bit the stored one\n",
               info.differed, info.checked);
        return 1;
    }
    printf("  the %" PRIu64 " stored checksums match: the files are the stored run's, bit for "
           "bit\n",
           info.checked);
    if (info.kept_steps)
        printf("  params_per_step.npy: the %" PRIu64
               " steps' variables the run kept (dsim run --keep-params), from the store\n",
               info.kept_steps);
    return 0;
}
