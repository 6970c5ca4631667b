/* Helpers shared by the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmds.h"

const char *dsim_cli_flag(int argc, char **argv, int *i, const char *name, int *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int dsim_cli_plugin_dir(const char *cmd, const char *dir)
{
    /* The scenario loader searches $DSIM_PLUGIN_PATH for a plugin named by
     * a bare file name: the directory goes in front. */
    const char *old = getenv("DSIM_PLUGIN_PATH");
    char *path = NULL;
    if (!*dir || asprintf(&path, "%s%s%s", dir, old && *old ? ":" : "", old ? old : "") < 0 ||
        setenv("DSIM_PLUGIN_PATH", path, 1) != 0) {
        free(path);
        fprintf(stderr, "dsim %s: --plugin-dir is '%s' (accepted: a directory)\n", cmd, dir);
        return 2;
    }
    free(path);
    return 0;
}

int dsim_cli_output_flags(const char *cmd, int argc, char **argv, int *i, const char **db,
                          const char **out)
{
    int missing = 0;
    const char *v;
    if ((v = dsim_cli_flag(argc, argv, i, "--db", &missing)))
        *db = v;
    else if (!missing && (v = dsim_cli_flag(argc, argv, i, "-o", &missing)))
        *out = v;
    else if (!missing && (v = dsim_cli_flag(argc, argv, i, "--output", &missing)))
        *out = v;
    else if (!missing)
        return 0;
    if (missing || !*v) {
        fprintf(stderr, "dsim %s: %s needs a value (a file path); see 'dsim %s --help'\n", cmd,
                argv[*i], cmd);
        return 2;
    }
    return 1;
}
