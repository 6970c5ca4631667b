/* Calibrating the cost model (costmodel.h) to this machine, so that its
 * predictions for the threads and processes engines can be compared with
 * what they measure (reports/fidelity.md).
 *
 * Everything is measured in the calling run, just before what it predicts,
 * so that the load of a shared machine weighs on both alike:
 *   - per-message cost (alpha) and link rate (1 / beta): a ping-pong of
 *     dsim messages between two ranks over the engine's own transport --
 *     two threads over inproc (threads), two processes over tcp on loopback
 *     (processes) -- at several sizes, fitted by least squares on relative
 *     error; alpha holds the wake-up of the receiver and the lock and match
 *     work of one message;
 *   - copy and reduction rates (float32 sum) per core with every core busy,
 *     at the size being predicted (a 4 KiB block lives in L1, a 16 MiB one
 *     in memory: one rate for all sizes is wrong by 2x either way);
 *   - the cores: p ranks on c < p cores wait for each other's turn, so a
 *     step's message costs alpha x p / c (oversubscription serialises
 *     wake-ups), and a step's copies and reductions take at least their CPU
 *     time over c cores (costmodel's `cores`). */
#ifndef DSIM_CALIBRATE_H
#define DSIM_CALIBRATE_H

#include <stddef.h>

#include "dsim/err.h"
#include "model/costmodel.h"

typedef struct dsim_calib {
    const char *engine;    /* "threads" or "processes" */
    const char *transport; /* "inproc" or "tcp" */
    int cores;             /* online CPUs */
    double alpha_s;        /* per message, one way (fitted intercept) */
    double link_Bps;       /* 1 / beta (fitted slope); 0 for inproc (copy rate) */
    double pp_small_s;     /* measured half round trip of the smallest size */
} dsim_calib;

/* Least-squares fit of t = alpha + n * beta to n points (bytes[i], secs[i]),
 * weighting every point by 1 / secs[i]^2 so that a 4 KiB point counts as
 * much as a 16 MiB one. alpha is clamped at >= 0 (refitting beta alone
 * then). DSIM_EINVAL when fewer than two distinct sizes or a time <= 0. */
dsim_err dsim_calib_fit_ab(const double *bytes, const double *secs, int n, double *alpha,
                           double *beta);

/* Half the round trip of a ping-pong of each size in sizes[0..n), median of
 * `reps` batches of `iters` round trips, into secs[]. engine "threads" (two
 * threads, inproc) or "processes" (this process and a forked child, tcp on
 * 127.0.0.1). */
dsim_err dsim_calib_pingpong(const char *engine, const size_t *sizes, int n, int iters, int reps,
                             double *secs);

/* Per-core copy and float32-sum rates, bytes of output per second, with
 * `cores` threads each on buffers of `bytes` of their own (median of runs
 * long enough to time). */
dsim_err dsim_calib_rates(int cores, size_t bytes, double *copy_Bps, double *reduce_Bps);

/* Calibrates alpha and beta for an engine (ping-pong at 64 B .. 4 MiB, fit). */
dsim_err dsim_calib_measure(const char *engine, dsim_calib *out);

/* The topology that models an all-reduce of `bytes` over `ranks` ranks of
 * this machine under calibration c, with copy and reduction rates measured
 * at that size (copy_Bps, reduce_Bps from dsim_calib_rates). */
void dsim_calib_topology(const dsim_calib *c, int ranks, double copy_Bps, double reduce_Bps,
                         dsim_topology *t);

/* Bytes algo copies locally over all ranks for an out-of-place all-reduce
 * of n bytes (not transfers, so not in costmodel's schedules); *serial set
 * when the copy lies on the root's path alone. */
double dsim_calib_local_copy(dsim_algo algo, int p, double n, int *serial);

/* The rates' buffer size per core for an all-reduce of `bytes` over `ranks`
 * ranks on `cores` cores: every rank's input and output together are as
 * large as every core's source and destination, so the rates come from the
 * same level of the memory hierarchy the collective works in. */
size_t dsim_calib_rate_bytes(int ranks, int cores, size_t bytes);

/* The predicted all-reduce time: dsim_calib_topology, then
 * dsim_cost_allreduce, plus the local copies (dsim_calib_local_copy) at the
 * copy rate, over the cores unless on one rank's path. */
dsim_err dsim_calib_predict(const dsim_calib *c, int ranks, dsim_algo algo, size_t bytes,
                            size_t esize, double copy_Bps, double reduce_Bps, double *seconds);

#endif
