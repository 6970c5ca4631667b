/* dsim calibrate: the cost model calibrated to this machine for one engine
 * (sim/model/calibrate.h), and what it then predicts for all-reduces of
 * given sizes and algorithms. `dsim bench allreduce --model 1` puts the same
 * prediction beside a measurement; scripts/fidelity-table tabulates both. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "cmds.h"
#include "dsim/comm.h"
#include "engine/engine.h"
#include "model/calibrate.h"

#define CAL_PROG "dsim calibrate"
#define CAL_MAX  64

void cmd_calibrate_help(FILE *out)
{
    fprintf(out, "usage: dsim calibrate [--engine threads|processes] [--ranks P] [--algo LIST]\n"
                 "                      [--sizes LIST] [--waits hot|cold] [--json]\n"
                 "\n"
                 "Calibrates the alpha-beta cost model to this machine, now, for one engine\n"
                 "(threads: ranks as threads over inproc; processes: ranks as forked processes\n"
                 "over shm), then predicts an all-reduce of each size with each\n"
                 "algorithm over P ranks:\n"
                 "  ping-pong     two ranks, 64 B to 4 MiB, fitted by least squares on relative\n"
                 "                error to alpha (per message) and beta (per byte)\n"
                 "  ring          every one of the P ranks receives from its left and sends\n"
                 "                to its right at once, 64 B: the calibration's latency\n"
                 "  pattern       per algorithm, its own steps replayed over the P ranks (who\n"
                 "                sends to whom in each, as its schedule says; a rank waits\n"
                 "                for a step's messages before the next), plain and combining\n"
                 "                receives: at 64 B for the latency of one of its steps, at the\n"
                 "                size of the messages it sends for the link and reduction\n"
                 "                rates: what P ranks on this machine's cores, its caches and\n"
                 "                wake-ups make of those steps\n"
                 "  call          per algorithm, the library's own all-reduce of 64 B (and of\n"
                 "                a row's size where smaller): what a call takes beyond the\n"
                 "                replay of its steps at 64 B (communicator, fingerprint,\n"
                 "                local copy; less where it skips a ring's empty blocks),\n"
                 "                added to the row's prediction, which is never below it\n"
                 "  copy          memcpy rate per core with every core busy, for the local\n"
                 "                copies an algorithm makes (sendbuf into recvbuf)\n"
                 "The prediction evaluates the algorithm's schedule (costmodel.h) with them.\n"
                 "Columns: model_us (predicted), msg (bytes calibrated at), xchg_us and\n"
                 "xchg_red_us (a step of the pattern at msg, plain and combining), copy_GB/s,\n"
                 "steps (the pattern's), step_64B_us (a step of it at 64 B: the row's latency),\n"
                 "call_us (what a call takes beyond its steps' replay).\n"
                 "\n"
                 "  --engine E     threads (default) or processes\n"
                 "  --ranks P      ranks of the predicted all-reduces (default 4)\n"
                 "  --algo LIST    comma-separated: ring, rhd, tree, reduce_to_one,\n"
                 "                 recursive_doubling, auto\n"
                 "                 (default ring,rhd,tree,reduce_to_one)\n"
                 "  --sizes LIST   comma-separated bytes, K M G suffixes powers of 1024\n"
                 "                 (default 4K,16K,64K,256K,1M,4M,16M)\n"
                 "  --waits W      hot (default): a rank that waits yields and looks again for a\n"
                 "                 while before it sleeps, as back-to-back collectives find\n"
                 "                 their peers; cold: it sleeps at once (DSIM_SPIN_US=0,\n"
                 "                 DSIM_SHM_ASSIST=0), as the collectives of a training step,\n"
                 "                 which wait for peers that compute, pay a wake-up\n"
                 "  --json         one JSON object instead of the text\n"
                 "\n"
                 "`dsim bench allreduce --model 1 [--engine processes]` calibrates the same way\n"
                 "and puts the prediction beside the measured time.\n"
                 "\n"
                 "Exit status: 0, 1 when a measurement failed, 2 on bad input.\n");
}

static int cal_flag(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return 0;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        *val = NULL;
        return 1;
    }
    *val = argv[++*i];
    return 1;
}

int cmd_calibrate(int argc, char **argv)
{
    const char *engine = "threads", *algos = "ring,rhd,tree,reduce_to_one",
               *sizes = "4K,16K,64K,256K,1M,4M,16M", *ranks_s = "4", *waits = "hot";
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *flag = argv[i];
        const char **slot = NULL;
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
            continue;
        }
        if (cal_flag(argc, argv, &i, "--engine", &v))
            slot = &engine;
        else if (cal_flag(argc, argv, &i, "--ranks", &v))
            slot = &ranks_s;
        else if (cal_flag(argc, argv, &i, "--algo", &v))
            slot = &algos;
        else if (cal_flag(argc, argv, &i, "--sizes", &v))
            slot = &sizes;
        else if (cal_flag(argc, argv, &i, "--waits", &v))
            slot = &waits;
        else {
            fprintf(stderr,
                    "%s: '%s' is not an option; accepted: --engine, --ranks, --algo, --sizes, "
                    "--waits, --json (see dsim calibrate --help)\n",
                    CAL_PROG, argv[i]);
            return 2;
        }
        if (!v || !*v) {
            /* the flag as given ("--algo" or "--algo="), not its value */
            fprintf(stderr, "%s: %.*s needs a value\n", CAL_PROG, (int)strcspn(flag, "="), flag);
            return 2;
        }
        *slot = v;
    }
    if (strcmp(waits, "cold") == 0) {
        /* read once, at the first wait of this process and of its children */
        setenv("DSIM_SPIN_US", "0", 1);
        setenv("DSIM_SHM_ASSIST", "0", 1);
    } else if (strcmp(waits, "hot") != 0) {
        fprintf(stderr, "%s: --waits '%s': expected hot or cold\n", CAL_PROG, waits);
        return 2;
    }
    const dsim_engine_ops *eng;
    if (dsim_engine_find(engine, &eng) != DSIM_OK || !eng->ranks) {
        char names[160];
        fprintf(stderr, "%s: --engine '%s' is not calibrated; accepted: %s\n", CAL_PROG, engine,
                dsim_engine_names(0, true, names, sizeof names));
        return 2;
    }
    char *end = NULL;
    long ranks = strtol(ranks_s, &end, 10);
    if (*end || ranks < 2 || ranks > BENCH_MAX_RANKS) {
        fprintf(stderr, "%s: --ranks '%s' is not a rank count; accepted: 2 to %d\n", CAL_PROG,
                ranks_s, BENCH_MAX_RANKS);
        return 2;
    }
    dsim_algo algo[8];
    int na = 0;
    size_t sz[CAL_MAX];
    int ns = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", algos);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (na == 8 || dsim_algo_parse(t, &algo[na]) != DSIM_OK) {
            char names[256];
            fprintf(stderr,
                    "%s: --algo '%s': '%s' is not an algorithm (or more than 8); accepted: "
                    "%s, auto\n",
                    CAL_PROG, algos, t, dsim_algo_list(names, sizeof names, 0, ", ", ", "));
            return 2;
        }
        na++;
    }
    snprintf(buf, sizeof buf, "%s", sizes);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (ns == CAL_MAX || bench_parse_size(t, &sz[ns]) != 0 || sz[ns] < 4 || sz[ns] % 4) {
            fprintf(stderr,
                    "%s: --sizes '%s': '%s' is not a size of whole float32 elements (or more "
                    "than %d sizes); e.g. 4K,1M,16M\n",
                    CAL_PROG, sizes, t, CAL_MAX);
            return 2;
        }
        ns++;
    }
    if (na == 0 || ns == 0) {
        fprintf(stderr, "%s: --algo and --sizes need at least one entry each\n", CAL_PROG);
        return 2;
    }

    dsim_calib cal;
    if (dsim_calib_measure(engine, (int)ranks, &cal) != DSIM_OK) {
        fprintf(stderr, "%s: calibrating the %s engine failed: %s\n", CAL_PROG, engine,
                dsim_errmsg());
        return 1;
    }
    dsim_calib_row rows[CAL_MAX * 8];
    int nr = 0;
    for (int s = 0; s < ns; s++)
        for (int a = 0; a < na; a++)
            rows[nr++] = (dsim_calib_row){.algo = algo[a] == DSIM_ALGO_AUTO
                                                      ? dsim_allreduce_decide(sz[s], (int)ranks)
                                                      : algo[a],
                                          .bytes = sz[s]};
    if (dsim_calib_predict(&cal, rows, nr) != DSIM_OK) {
        fprintf(stderr, "%s: calibrating the %s engine failed: %s\n", CAL_PROG, engine,
                dsim_errmsg());
        return 1;
    }
    if (json) {
        printf("{\"engine\": \"%s\", \"transport\": \"%s\", \"waits\": \"%s\", \"cores\": %d, "
               "\"ranks\": %ld, "
               "\"alpha_s\": %.9g, \"link_Bps\": %.6g, \"pingpong_64B_s\": %.9g, "
               "\"exchange_64B_s\": %.9g, \"predictions\": [",
               cal.engine, cal.transport, waits, cal.cores, ranks, cal.alpha_s, cal.link_Bps,
               cal.pp_small_s, cal.alpha_x_s);
        for (int i = 0; i < nr; i++)
            printf("%s\n  {\"bytes\": %zu, \"algo\": \"%s\", \"seconds\": %.9g, \"msg\": %zu, "
                   "\"exchange_s\": %.9g, \"exchange_reduce_s\": %.9g, \"copy_Bps\": %.6g, "
                   "\"pattern\": \"%s\", \"pattern_steps\": %d, \"pattern_64B_s\": %.9g, "
                   "\"call_s\": %.9g, \"call_measured_s\": %.9g}",
                   i ? "," : "", rows[i].bytes, dsim_algo_name(rows[i].algo), rows[i].seconds,
                   rows[i].msg, rows[i].step_copy_s, rows[i].step_reduce_s, rows[i].copy_Bps,
                   dsim_algo_name(rows[i].algo), rows[i].steps, rows[i].alpha_s, rows[i].call_s,
                   rows[i].call_measured_s);
        printf("\n]}\n");
        return 0;
    }
    printf("# dsim calibrate: engine %s (transport %s, %s waits), %d cores, %ld ranks\n",
           cal.engine, cal.transport, waits, cal.cores, ranks);
    printf("# ping-pong: alpha %.2f us per message, link %.2f GB/s (least-squares fit, 64 B to 4 "
           "MiB; %.2f us measured at 64 B)\n",
           cal.alpha_s * 1e6, cal.link_Bps / 1e9, cal.pp_small_s * 1e6);
    printf("# ring exchange of 64 B over the %ld ranks: %.2f us; each row is fitted to its "
           "algorithm's own steps replayed over the ranks (steps, step_64B_us: its latency), "
           "plus call_us, what the library's all-reduce at 64 B takes beyond that replay "
           "(at the row's size where smaller)\n",
           ranks, cal.alpha_x_s * 1e6);
    printf("# %10s %-14s %12s %10s %12s %12s %10s %6s %12s %8s\n", "size", "algo", "model_us",
           "msg", "xchg_us", "xchg_red_us", "copy_GB/s", "steps", "step_64B_us", "call_us");
    for (int i = 0; i < nr; i++)
        printf("  %10zu %-14s %12.1f %10zu %12.1f %12.1f %10.2f %6d %12.2f %8.2f\n", rows[i].bytes,
               dsim_algo_name(rows[i].algo), rows[i].seconds * 1e6, rows[i].msg,
               rows[i].step_copy_s * 1e6, rows[i].step_reduce_s * 1e6, rows[i].copy_Bps / 1e9,
               rows[i].steps, rows[i].alpha_s * 1e6, rows[i].call_s * 1e6);
    return 0;
}
