/* The models' compute benchmark behind `dsim bench model`: the reference
 * models' loss and gradient (dsim_model_loss_grad) on the shapes the
 * scenario catalogue trains, at one replica's batch and at the global batch
 * (what the one-device reference computes in one call), each kernel set
 * asked for, and the optimizers' updates; beside them a single-core peak, a
 * BLAS sgemm of a large square matrix on one thread (OpenBLAS, in builds
 * that have it). The command (sim/cli/cmd_bench_model.c) parses the flags
 * and prints.
 *
 * Every time is the CPU time of the measuring thread, the best of 3 runs of
 * at least min_s seconds each, so that a machine shared with other work
 * does not count the time this process waited for a CPU.
 *
 * compare adds, for each shape, the ways the same numbers could be
 * computed that dsim does not use: "loops", the per-example double loops
 * the models ran on before the kernels, and "openblas", the layers as
 * OpenBLAS dgemm calls on the parameters converted to double per call
 * (builds with OpenBLAS). Their results agree with the kernels' within
 * rounding, not bit for bit (their sums run in other orders). */
#ifndef DSIM_SIM_BENCH_COMPUTE_H
#define DSIM_SIM_BENCH_COMPUTE_H

#include <stddef.h>

typedef struct dsim_bench_compute_row {
    const char *scenario; /* where the catalogue trains this model */
    char model[48];       /* "mlp 120-256-128-16" */
    size_t params, batch;
    const char *how;   /* the kernels' name (dsim_model_kernels), "loops" or "openblas" */
    double s_per_call; /* CPU seconds */
    double gflops;     /* 2 in out n a layer for its outputs and its weight gradient, and for
                          the deltas of every layer but the first (biases, activations and the
                          loss not counted) */
} dsim_bench_compute_row;

typedef struct dsim_bench_optim_row {
    const char *kind; /* sgd, momentum, adam, rmsprop, adagrad, lion, adamax */
    size_t params;
    double ns_per_param;
    double gbytes_s; /* parameters, gradient and slots read and written */
} dsim_bench_optim_row;

typedef struct dsim_bench_compute {
    const char *const *kernels; /* the kernel sets to time, by name */
    size_t n_kernels;
    int compare;
    double min_s;
    /* Each row as it is measured; non-zero stops the benchmark. */
    int (*on_row)(const dsim_bench_compute_row *row, void *user);
    int (*on_optim)(const dsim_bench_optim_row *row, void *user);
    void *user;
} dsim_bench_compute;

/* Times every shape, then the optimizers (with the kernels that were in use
 * when called, which are in use again after). 0, 1 when memory ran out, or
 * what a callback returned. */
int dsim_bench_compute_run(const dsim_bench_compute *b);

/* GFLOP/s of an m x m x m sgemm on one thread (the best of 3 after one to
 * warm up), and the BLAS's name for the CPU's kernels in *core; 0 in a
 * build without a BLAS. */
double dsim_bench_compute_peak(size_t m, const char **core);

#endif
