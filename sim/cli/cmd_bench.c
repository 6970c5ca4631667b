/* placeholder: being written */
#include "cmds.h"
int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "dsim bench: not built yet\n");
    return 2;
}
void cmd_bench_help(FILE *out)
{
    fprintf(out, "usage: dsim bench\n");
}
