/* The collective benchmark behind `dsim bench`: one collective over N
 * ranks of an engine (sim/engine/engine.h: the engine's rank program, so
 * threads and processes run it through the same table), a sweep of sizes,
 * every rank's output checked, and the calibrated cost model beside the
 * measured times. The command (sim/cli/cmd_bench.c) parses the flags and
 * prints; the flags, inputs, check and columns are bench_common.h, shared
 * with the MPI comparison program. */
#ifndef DSIM_SIM_BENCH_H
#define DSIM_SIM_BENCH_H

#include <stdio.h>

#include "bench_common.h"
#include "dsim/comm.h"
#include "engine/engine.h"
#include "model/calibrate.h"

/* What the sweep hands back, step by step: the row (NULL for a step too
 * small for whole elements on every rank, which is skipped), the algorithm
 * an allreduce used, the step's size column. 0 goes on, non-zero stops. */
typedef int (*dsim_bench_row_fn)(const bench_row *row, dsim_algo used, size_t step_bytes,
                                 void *user);

typedef struct dsim_bench_sweep {
    const bench_opts *o;
    const dsim_engine_ops *engine; /* with a ranks op */
    dsim_algo algo;                /* allreduce's, or DSIM_ALGO_AUTO */
    int corrupt_rank;              /* -1, or the rank whose output gets one wrong element */
    double copy_bw;                /* for the rows' %bound (bench_copy_bandwidth) */
    dsim_bench_row_fn on_row;
    void *user;
    FILE *err; /* where a failed step says which rank failed and why */
} dsim_bench_sweep;

/* Runs every size step of the sweep on the engine's ranks. 0, or 1 after
 * writing to sw->err why a step failed. */
int dsim_bench_run(const dsim_bench_sweep *sw);

/* Bytes all ranks' buffers take at the sweep's largest step (to refuse, up
 * front, a sweep that cannot fit). */
double dsim_bench_mem_needed(const bench_opts *o);

/* The transport an engine's ranks use for the benchmark: the one asked
 * where the engine runs inproc (one address space), else tcp. */
const char *dsim_bench_transport(const dsim_engine_ops *eng, const char *asked);

/* --model 1: the cost model calibrated on this machine now, for the
 * engine, and its prediction of each kept row (cr[i] for rows[i], whose
 * algorithm used[i]). DSIM_OK, or the calibration's error. */
dsim_err dsim_bench_model(const bench_opts *o, const char *engine, const bench_row *rows,
                          const dsim_algo *used, int nrows, dsim_calib *cal, dsim_calib_row *cr);

#endif
