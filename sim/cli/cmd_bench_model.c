/* dsim bench model: the models' compute against a single-core peak. This
 * file parses the flags and prints; the benchmark is sim/bench/compute.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/compute.h"
#include "cmds.h"
#include "dsim/model.h"

#define BM_PROG "dsim bench model"

typedef struct bm_print {
    double peak;
} bm_print;

static int bm_row(const dsim_bench_compute_row *r, void *user)
{
    const bm_print *p = user;
    printf("%-22s %-20s %8zu %6zu  %-9s %11.2f %9.2f", r->scenario, r->model, r->params, r->batch,
           r->how, r->s_per_call * 1e6, r->gflops);
    if (p->peak > 0)
        printf(" %6.1f%%", 100.0 * r->gflops / p->peak);
    printf("\n");
    fflush(stdout);
    return 0;
}

static int bm_optim_row(const dsim_bench_optim_row *r, void *user)
{
    (void)user;
    printf("optimizer %-9s %zu params: %.3f ns a parameter, %.1f GB/s\n", r->kind, r->params,
           r->ns_per_param, r->gbytes_s);
    return 0;
}

static int bm_usage(void)
{
    fprintf(stderr,
            "%s: usage: dsim bench model [--kernels NAME|all] [--compare] "
            "[--min-time SECONDS] [--peak N]\n",
            BM_PROG);
    return 2;
}

int cmd_bench_model(int argc, char **argv)
{
    const char *kernels = "auto";
    int compare = 0;
    double min_s = 0.2;
    size_t peak_m = 2048;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = dsim_cli_flag(argc, argv, &i, "--kernels", &missing))) {
            kernels = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--min-time", &missing))) {
            char *end;
            min_s = strtod(v, &end);
            if (*end || !(min_s > 0 && min_s <= 60)) {
                fprintf(stderr, "%s: --min-time '%s': give seconds in (0, 60]\n", BM_PROG, v);
                return 2;
            }
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--peak", &missing))) {
            char *end;
            long m = strtol(v, &end, 10);
            if (*end || m < 0 || m > 8192) {
                fprintf(stderr, "%s: --peak '%s': give the sgemm's size, 0 (none) to 8192\n",
                        BM_PROG, v);
                return 2;
            }
            peak_m = (size_t)m;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cmd_bench_model_help(stdout);
            return 0;
        } else if (strcmp(argv[i], "--compare") == 0) {
            compare = 1;
        } else if (missing) {
            fprintf(stderr, "%s: %s needs a value\n", BM_PROG, argv[i]);
            return 2;
        } else {
            fprintf(stderr, "%s: unknown argument '%s'\n", BM_PROG, argv[i]);
            return bm_usage();
        }
    }
    const char *names[8];
    size_t nk = dsim_model_kernels_list(names, 8);
    if (strcmp(kernels, "all") != 0) {
        if (dsim_model_kernels_use(kernels) != DSIM_OK) {
            fprintf(stderr, "%s: --kernels: %s\n", BM_PROG, dsim_errmsg());
            return 2;
        }
        names[0] = dsim_model_kernels();
        nk = 1;
    }
    bm_print pr = {0};
    if (peak_m > 0) {
        const char *core = NULL;
        pr.peak = dsim_bench_compute_peak(peak_m, &core);
        if (pr.peak > 0)
            printf("single-core peak: %.1f GFLOP/s (OpenBLAS sgemm %zu x %zu x %zu, 1 thread, "
                   "kernels for %s)\n",
                   pr.peak, peak_m, peak_m, peak_m, core ? core : "?");
        else
            printf("single-core peak: not measured (this build has no OpenBLAS: Debian's "
                   "libopenblas-serial-dev, -Dblas=enabled)\n");
    }
    printf("times: CPU time of one thread, best of 3 runs of >= %.2f s; GFLOP: 2 in out n a "
           "layer for the outputs and the weight gradient, and for the deltas below the top\n\n",
           min_s);
    printf("%-22s %-20s %8s %6s  %-9s %11s %9s %7s\n", "scenario", "model", "params", "batch",
           "kernels", "us/call", "GFLOP/s", "%peak");
    dsim_bench_compute b = {
        .kernels = names,
        .n_kernels = nk,
        .compare = compare,
        .min_s = min_s,
        .on_row = bm_row,
        .on_optim = bm_optim_row,
        .user = &pr,
    };
    int rc = dsim_bench_compute_run(&b);
    if (rc != 0)
        fprintf(stderr, "%s: out of memory\n", BM_PROG);
    (void)dsim_model_kernels_use("auto");
    return rc ? 1 : 0;
}

void cmd_bench_model_help(FILE *out)
{
    fprintf(out,
            "usage: dsim bench model [--kernels NAME|all] [--compare] [--min-time S] [--peak N]\n"
            "\n"
            "Times the reference models' loss and gradient (dsim_model_loss_grad_set, the\n"
            "call a replica's step and the one-device reference make) on the shapes the\n"
            "scenario catalogue trains, at one replica's batch and at the global\n"
            "batch, and the optimizers' updates; prints GFLOP/s and the share of a\n"
            "single-core peak measured first: an OpenBLAS sgemm of N x N (--peak, 2048; 0\n"
            "skips it) on one thread. Times are the thread's CPU time.\n"
            "\n"
            "  --kernels NAME  the model kernels to time: auto (the fastest here), all (each\n"
            "                  this CPU runs: they give the same bits), or a name\n"
            "  --compare       also the per-example double loops dsim used before, and the\n"
            "                  layers as OpenBLAS dgemm calls (builds with OpenBLAS)\n"
            "  --min-time S    seconds each of the 3 runs of a case lasts at least (0.2)\n");
}
