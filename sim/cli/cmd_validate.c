/* dsim validate: check scenario files without running them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "scenario/defaults.h"
#include "scenario/scenario_limits.h"
#include "scenario/scenario.h"

void cmd_validate_help(FILE *out)
{
    fprintf(out, "usage: dsim validate [--quiet] [--plugin-dir DIR] FILE...\n"
                 "       dsim validate --defaults | --limits\n"
                 "\n"
                 "Checks each scenario file without running it: the YAML, every key, type and\n"
                 "range, the combinations (cluster shape and strategy, model and data, faults\n"
                 "and cluster), and that this build can run it (some checks are parsed but\n"
                 "not run yet).\n"
                 "Prints 'FILE: ok' or the reason as FILE:LINE:COLUMN: KEY: ... for each file.\n"
                 "For each fault it prints the time within which the timeout and health check\n"
                 "guarantee that every survivor has returned an error, and a warning when a\n"
                 "loss would never be detected (the survivors would wait for ever).\n"
                 "\n"
                 "  --quiet           print only the files that are not ok, and warnings\n"
                 "  --plugin-dir DIR  look for strategy plugins named by a bare file name in\n"
                 "                    DIR first (then $DSIM_PLUGIN_PATH, then this build's\n"
                 "                    and the installed plugins), as 'dsim run' does\n"
                 "  --defaults        print a scenario that states every default, and exit\n"
                 "  --limits          print every limit of a scenario file (Markdown: the table\n"
                 "                    of scenarios/FORMAT.md), and exit\n"
                 "\n"
                 "A plugin's file is only looked for, never loaded: validate runs no code\n"
                 "of the scenario's. It prints which file 'dsim run' will load and that\n"
                 "loading it runs its code (a warning, printed with --quiet too, when the\n"
                 "scenario names it by an absolute path or one that climbs out of its\n"
                 "folder); 'dsim run --no-plugins' refuses such a scenario.\n"
                 "\n"
                 "Exit status: 0 every file is valid and runnable, 2 otherwise.\n");
}

int cmd_validate(int argc, char **argv)
{
    bool quiet = false, defaults = false, limits = false, files = false, opts_done = false;
    /* argv[i] is a file to check */
    bool *is_file = calloc((size_t)argc + 1, sizeof *is_file);
    if (!is_file) {
        fprintf(stderr, "dsim validate: out of memory\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int missing = 0;
        const char *v;
        if (opts_done || a[0] != '-' || strcmp(a, "-") == 0) {
            files = true;
            is_file[i] = true;
        } else if (strcmp(a, "--") == 0) {
            opts_done = true;
        } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
            quiet = true;
        } else if (strcmp(a, "--defaults") == 0) {
            defaults = true;
        } else if (strcmp(a, "--limits") == 0) {
            limits = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--plugin-dir", &missing))) {
            if (dsim_cli_plugin_dir("validate", v) != 0) {
                free(is_file);
                return 2;
            }
        } else if (missing) {
            fprintf(stderr, "dsim validate: %s needs a value; see 'dsim validate --help'\n", a);
            free(is_file);
            return 2;
        } else {
            fprintf(stderr,
                    "dsim validate: unknown option '%s' (accepted: --quiet, --plugin-dir DIR, "
                    "--defaults, --limits); see 'dsim validate --help'\n",
                    a);
            free(is_file);
            return 2;
        }
    }
    if (defaults || limits) {
        free(is_file);
        if (files || (defaults && limits)) {
            fprintf(stderr, "dsim validate: %s takes no files and no other listing\n",
                    defaults ? "--defaults" : "--limits");
            return 2;
        }
        if (limits)
            dsim_scenario_limits_write(stdout);
        if ((defaults && dsim_scenario_write_defaults(stdout) != DSIM_OK) || fflush(stdout) != 0) {
            fprintf(stderr, "dsim validate: could not write to standard output\n");
            return 2;
        }
        return 0;
    }
    if (!files) {
        free(is_file);
        fprintf(stderr, "dsim validate: no scenario file given; usage: dsim validate [--quiet] "
                        "[--plugin-dir DIR] FILE...\n");
        return 2;
    }
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!is_file[i])
            continue;
        dsim_scenario *s = NULL;
        dsim_err e = dsim_scenario_load(a, &s);
        uint64_t steps = e == DSIM_OK && s->n_faults ? dsim_scenario_own_steps(s) : 0;
        for (size_t f = 0; e == DSIM_OK && f < s->n_faults; f++) {
            dsim_fault_detection d;
            dsim_scenario_fault_detection(s, f, &d);
            if (d.warn || !quiet)
                printf("%s:%d:%d: %s%s\n", a, s->faults[f].line, s->faults[f].column,
                       d.warn ? "warning: " : "", d.text);
            char never[512];
            if (dsim_scenario_fault_unreachable(s, f, steps, never, sizeof never))
                printf("%s:%d:%d: warning: %s\n", a, s->faults[f].line, s->faults[f].column, never);
        }
        char cpu_note[640];
        if (e == DSIM_OK && dsim_scenario_cpu_warning(s, cpu_note, sizeof cpu_note))
            printf("%s: %s", a, cpu_note);
        /* a TPU job: what dsim says about it (warnings even with --quiet) */
        for (const char *l = e == DSIM_OK ? s->tpu_notes : NULL; l && *l;) {
            const char *end = strchr(l, '\n');
            int len = end ? (int)(end - l) : (int)strlen(l);
            if (!quiet || strncmp(l, "warning:", 8) == 0)
                printf("%s: %.*s\n", a, len, l);
            l = end ? end + 1 : NULL;
        }
        /* A plugin: which file dsim run will load, and that loading it runs
         * its code (a warning when the file leads out of its folder). */
        dsim_plugin_notice pn;
        if (e == DSIM_OK && dsim_scenario_plugin_notice(s, &pn) && (pn.outside || !quiet))
            printf("%s:%d:%d: %s%s\n", a, s->plugin_pos.line, s->plugin_pos.column,
                   pn.outside ? "warning: " : "", pn.text);
        if (e == DSIM_OK)
            e = dsim_scenario_runnable(s);
        /* a matrix: every combination must parse and be runnable too */
        size_t nc = e == DSIM_OK ? dsim_scenario_combinations(s) : 1;
        for (size_t k = 0; e == DSIM_OK && s->n_combinations && k < nc; k++) {
            dsim_scenario *one = NULL;
            e = dsim_scenario_combination(s, k, &one);
            if (e == DSIM_OK)
                e = dsim_scenario_runnable(one);
            dsim_scenario_free(one);
        }
        if (e != DSIM_OK) {
            bad++;
            /* A parse error already starts with FILE:LINE:COL. */
            const char *msg = dsim_errmsg();
            if (strncmp(msg, a, strlen(a)) == 0)
                printf("%s\n", msg);
            else
                printf("%s: %s\n", a, msg);
        } else if (!quiet) {
            /* the checks judged though the file does not name them */
            char byd[256] = "";
            for (size_t i = 0; i < s->n_expect; i++)
                if (s->expect[i].by_default && strlen(byd) + 40 < sizeof byd)
                    snprintf(byd + strlen(byd), sizeof byd - strlen(byd), "%s%s",
                             byd[0] ? ", " : "", s->expect[i].check->name);
            if (byd[0])
                printf("%s: judged by default: %s (NAME: off under expect: leaves one out)\n", a,
                       byd);
            if (s->n_combinations)
                printf("%s: ok (a matrix of %zu runs)\n", a, nc);
            else
                printf("%s: ok\n", a);
        }
        dsim_scenario_free(s);
    }
    free(is_file);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "dsim validate: could not write to standard output\n");
        return 2;
    }
    return bad ? 2 : 0;
}
