/* Calibrating the cost model (costmodel.h) to this machine, so that its
 * predictions for the threads and processes engines can be compared with
 * what they measure (reports/fidelity.md).
 *
 * Everything is measured in the calling run, just before what it predicts,
 * so that the load of a shared machine weighs on both alike, over the
 * engine's own transport (threads: ranks as threads over inproc;
 * processes: ranks as processes over tcp on loopback):
 *   - a ping-pong between two ranks at 64 B .. 4 MiB, fitted by least
 *     squares to alpha (the receiver's wake-up, the lock and match work of
 *     one message) and beta: the figures one would quote;
 *   - what the model is fitted with: a ring exchange over the all-reduce's
 *     own rank count (every rank receives from its left, sends to its right,
 *     at once: one step of a schedule), with plain and with combining
 *     receives, at the size of the messages the algorithm sends. It holds
 *     what a ping-pong does not: p ranks on c < p cores taking turns
 *     (oversubscription serialises wake-ups and copies), data moving between
 *     cores' caches, a reduction's cost beside a copy's, and the size's
 *     level of the memory hierarchy (a 1 KiB block stays in L1, a 4 MiB one
 *     does not);
 *   - the memcpy rate per core with every core busy, at the collective's
 *     working set, for the local copies an algorithm makes (sendbuf into
 *     recvbuf), which are not transfers and so not in the schedules;
 *   - the cores, for the evaluator's "a step lasts at least its CPU time
 *     over the cores". */
#ifndef DSIM_CALIBRATE_H
#define DSIM_CALIBRATE_H

#include <stddef.h>

#include "dsim/err.h"
#include "model/costmodel.h"

typedef struct dsim_calib {
    const char *engine;    /* the engine's name (sim/engine/engine.h), e.g. "threads" */
    const char *transport; /* "inproc" or "tcp" */
    int cores;             /* online CPUs */
    double alpha_s;        /* per message, one way (fitted intercept) */
    double link_Bps;       /* 1 / beta (fitted slope); 0 for inproc (copy rate) */
    double pp_small_s;     /* measured half round trip of the smallest size */
    int ranks;             /* of the all-reduces calibrated for */
    double alpha_x_s;      /* one ring exchange of 64 B over the ranks: a step's floor */
} dsim_calib;

/* Least-squares fit of t = alpha + n * beta to n points (bytes[i], secs[i]),
 * weighting every point by 1 / secs[i]^2 so that a 4 KiB point counts as
 * much as a 16 MiB one. alpha is clamped at >= 0 (refitting beta alone
 * then). DSIM_EINVAL when fewer than two distinct sizes or a time <= 0. */
dsim_err dsim_calib_fit_ab(const double *bytes, const double *secs, int n, double *alpha,
                           double *beta);

/* Half the round trip of a ping-pong of each size in sizes[0..n), median of
 * `reps` batches of `iters` round trips, into secs[]. engine "threads" (two
 * threads, inproc) or "processes" (two forked processes, tcp on
 * 127.0.0.1). Every engine of sim/engine/engine.h with a rank program is
 * calibrated the same way, over dsim_calib_transport's transport. */
dsim_err dsim_calib_pingpong(const char *engine, const size_t *sizes, int n, int iters, int reps,
                             double *secs);

/* A ring exchange of `ranks` ranks: every rank receives from its left and
 * sends to its right at once (reduce: the receive combines, a float32 sum,
 * as a reduce-scatter step does), each size in sizes[0..n) (whole float32
 * elements); the time of one exchange, median of `reps` batches of `iters`,
 * into secs[]. The oversubscription of ranks over cores, the wake-ups and the
 * movement of data between cores' caches are all in it. */
dsim_err dsim_calib_exchange(const char *engine, int ranks, int reduce, const size_t *sizes, int n,
                             int iters, int reps, double *secs);

/* The same over a pattern (dsim_cost_pattern_of: an algorithm's schedule)
 * instead of a ring: one replay of all its steps, each transfer a message
 * of the size at hand, a rank waiting for a step's messages before it
 * begins the next (as the algorithm does); the time of one replay. NULL: a
 * ring exchange. Step after step the messages move through span (1 to
 * 1024) times their size of memory, as an algorithm's blocks do through its
 * buffer. */
dsim_err dsim_calib_exchange_pattern(const char *engine, int ranks, int reduce,
                                     const dsim_cost_pattern *pat, int span, const size_t *sizes,
                                     int n, int iters, int reps, double *secs);

/* The library's own all-reduce (dsim_allreduce_with, algorithm algo, float32
 * sum) of `bytes` over `ranks` ranks of the engine, with everything a call
 * does around its steps: the time of one call, median of `reps` batches of
 * `iters`, into *secs. */
dsim_err dsim_calib_call(const char *engine, int ranks, dsim_algo algo, size_t bytes, int iters,
                         int reps, double *secs);

/* Per-core copy and float32-sum rates, bytes of output per second, with
 * `cores` threads each on buffers of `bytes` of their own (median of runs
 * long enough to time). */
dsim_err dsim_calib_rates(int cores, size_t bytes, double *copy_Bps, double *reduce_Bps);

/* Calibrates an engine for all-reduces over `ranks` ranks: alpha and beta
 * from a ping-pong (64 B .. 4 MiB, fitted), and alpha_x_s, a ring exchange
 * of 64 B over the ranks (dsim_calib_exchange). */
dsim_err dsim_calib_measure(const char *engine, int ranks, dsim_calib *out);

/* The size of the messages that dominate an all-reduce of `bytes` (float32)
 * over `ranks` ranks: ring's blocks (bytes / ranks), rhd's first halves,
 * the whole buffer for tree and reduce_to_one. The model is calibrated at
 * that size: a 4 KiB block and a 16 MiB one do not move at one rate. */
size_t dsim_calib_msg_bytes(dsim_algo algo, int ranks, size_t bytes);

/* How many transfers' times a replay of pattern pt with messages of one
 * size lasts beyond its latency, in the schedule evaluator (costmodel.c) on
 * `cores` cores: plain (a step of n transfers: max(1, n / cores)) and
 * combining (the rank that receives most combines one after another:
 * max(that many, n / cores)), summed over the steps. */
void dsim_calib_pattern_turns(const dsim_cost_pattern *pt, int cores, double *kcopy, double *kred);

/* One transfer's copy and combine times (move_s, red_s) that make the
 * evaluator's replay of pt, with latency alpha a step, last t_copy plain
 * and t_reduce combining (a replay's measured times). Arithmetic only. */
void dsim_calib_fit_pattern(const dsim_cost_pattern *pt, int cores, double alpha, double t_copy,
                            double t_reduce, double *move_s, double *red_s);

/* The topology that models c->ranks ranks of this machine for messages of
 * `msg` bytes: latency alpha a step, a link that moves msg in move_s, a
 * device that combines msg in red_s (dsim_calib_fit_pattern). */
void dsim_calib_topology(const dsim_calib *c, double alpha, size_t msg, double move_s, double red_s,
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

/* One all-reduce to predict: algo and bytes in; the rest out. */
typedef struct dsim_calib_row {
    dsim_algo algo;                    /* ring, rhd, tree, reduce_to_one, recursive_doubling */
    size_t bytes;                      /* float32 elements */
    size_t msg;                        /* dsim_calib_msg_bytes */
    int steps;                         /* its algorithm's pattern's steps over the ranks */
    double alpha_s;                    /* a step of the pattern replayed at 64 B (0: alpha_x_s) */
    double step_copy_s, step_reduce_s; /* a step of the pattern replayed at msg (mean) */
    double move_s, red_s;              /* one transfer of msg: dsim_calib_fit_pattern */
    double call_measured_s;            /* the library's all-reduce of min(bytes, 64 B) (at least a
                                          float a rank), measured: the least the row can take, and
                                          the row itself below 64 B */
    double call_s;                     /* what a call takes beyond the replay of its steps at 64 B:
                                          call_measured_s less that replay, >= 0 (0 below 64 B) */
    double copy_Bps;                   /* local copy rate at the working set */
    double seconds;                    /* predicted */
} dsim_calib_row;

/* The prediction from a row's calibration (alpha_s, move_s, red_s at msg,
 * call_s, call_measured_s, copy_Bps): dsim_calib_topology, dsim_cost_allreduce
 * over the algorithm's schedule, plus call_s, plus the local copies
 * (dsim_calib_local_copy) at the copy rate, over the cores unless on one
 * rank's path; never less than call_measured_s, and call_measured_s
 * itself below 64 B (a float a rank), where the call was measured at the
 * row's size.
 * Arithmetic only. */
dsim_err dsim_calib_predict_at(const dsim_calib *c, dsim_algo algo, size_t bytes,
                               const dsim_calib_row *at, double *seconds);

/* Measures what each row needs now (its algorithm's pattern replayed at
 * 64 B and at every distinct message size of its rows, plain and
 * combining; the copy rates), then predicts every row. */
dsim_err dsim_calib_predict(const dsim_calib *c, dsim_calib_row *rows, int n);

/* The transport an engine's calibration measures (and so the one its
 * predictions are for): inproc where the engine runs it, else tcp. */
struct dsim_engine_ops;
const char *dsim_calib_transport(const struct dsim_engine_ops *eng);

#endif
