/* Helpers shared by the subcommands. */
#include <string.h>

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
