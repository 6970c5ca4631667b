/* Internal to sim/model: the schedule evaluator the all-reduce costs run on
 * (costmodel.c) and the table of what the cost model knows about each
 * algorithm (algo_cost.c). */
#ifndef DSIM_COST_INT_H
#define DSIM_COST_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "dsim/comm.h"
#include "model/costmodel.h"

/* One transfer of a step. */
typedef struct cm_xfer {
    int src, dst;
    double bytes;  /* moved */
    double reduce; /* bytes dst combines after it arrives (0: a copy) */
} cm_xfer;

/* A schedule being evaluated over a topology of p ranks. */
typedef struct cm_eval {
    const dsim_topology *t;
    int p;
    int *out_n, *in_n;     /* [p]: a device's flows in this step */
    int *nic_out, *nic_in; /* [hosts]: inter-host flows */
    /* A TPU slice (t->tpu): every rank's chip, its coordinates, and the
     * flows of this step on every directed ICI link (chip x dimension x
     * direction); out_n then counts a rank's flows to its chip's other
     * replicas. */
    int *chip;               /* [p] */
    int *coords;             /* [p * DSIM_TPU_DIMS] */
    int *link_n;             /* [chips * DSIM_TPU_DIMS * 2] */
    double *arrive, *reduce; /* [p]: when the last transfer into a rank lands; its reductions */
    double total;
    int steps;
    /* Set: dsim_cost_step records each step's transfers here instead of
     * timing them (dsim_cost_pattern_of). */
    dsim_cost_pattern *capture;
} cm_eval;

/* One step: every transfer x[0..n) starts together; a rank's step ends when
 * its last incoming transfer has arrived and it has combined what it
 * received. Adds the step's time to ev->total and counts it. */
void dsim_cost_step(cm_eval *ev, const cm_xfer *x, int n);

/* The same step `times` times over (>= 1), evaluated once: a schedule whose
 * steps move the same sizes over the same links (a ring's) counts its first
 * so, which lets a ring of 65536 ranks be costed at once. A capture
 * (dsim_cost_pattern_of) records it `times` times. */
void dsim_cost_step_times(cm_eval *ev, const cm_xfer *x, int n, int times);

/* Elements of block k of count cut into m blocks (the first count % m one
 * longer), as src/coll cuts them. */
static inline double cm_block(size_t count, int m, int k)
{
    size_t b = count / (size_t)m;
    return (double)(b + ((size_t)k < count % (size_t)m ? 1 : 0));
}

/* The largest power of two <= p (p >= 1). */
static inline int cm_pow2_floor(int p)
{
    int q = 1;
    while (q * 2 <= p)
        q *= 2;
    return q;
}

/* What the cost model knows about one all-reduce algorithm of src/coll
 * (whose own table, src/coll/algos.c, says what runs). */
typedef struct dsim_algo_cost {
    size_t size; /* sizeof(dsim_algo_cost) */
    dsim_algo algo;
    /* The steps src/coll runs, as transfers handed to dsim_cost_step, for
     * ev->p >= 2 ranks and count elements of es bytes; x has room for 2p. */
    void (*schedule)(cm_eval *ev, cm_xfer *x, size_t count, double es);
    /* The textbook closed form (dsim_cost_allreduce_formula, costmodel.h)
     * for p >= 2 ranks, n bytes. */
    double (*formula)(int P, double n, double alpha, double beta, double gamma);
    /* Calibration (calibrate.h): the elements of the message that
     * dominates an all-reduce of elems elements over ranks ranks. */
    size_t (*msg_elems)(size_t elems, int ranks);
    /* Calibration: each of its steps moves its messages (of msg_elems) to
     * another block of the buffer (a ring's), so that a replay of its
     * pattern walks them through the whole buffer; else (rhd's halving
     * steps stay within the half the first kept) through one message's
     * worth. */
    bool walks_buffer;
    /* Calibration: bytes copied locally (sendbuf into recvbuf or scratch)
     * over all p >= 2 ranks for an out-of-place all-reduce of n bytes;
     * *serial set when the copy lies on one rank's path alone. */
    double (*local_copy)(int p, double n, int *serial);
} dsim_algo_cost;

/* The cost of algorithm a; NULL for DSIM_ALGO_AUTO (not an algorithm of its
 * own) and for a value that is not a dsim_algo. */
const dsim_algo_cost *dsim_algo_cost_of(dsim_algo a);

#endif
