/* Cost models (ARCHITECTURE.md §8, what-if): how long a job's all-reduce and compute
 * would take on hardware this machine does not have.
 *
 * Network: the alpha-beta model per link. A message of n bytes over a link
 * takes alpha + n / bandwidth; concurrent messages that leave (or enter) one
 * host through its NIC share the NIC's bandwidth; devices of one host talk
 * over the intra-host link. A reduction costs gamma per byte (the device's
 * memory bandwidth: two reads and a write per element). An all-reduce is
 * evaluated step by step over the schedule of dsim's own algorithm (ring,
 * rhd, tree, reduce_to_one: the steps src/coll runs, written out in
 * algo_cost.c), each step as long as its slowest transfer plus the
 * reduction that follows it.
 *
 * Compute: a training step of one replica takes 3 x (forward FLOPs per
 * example) x (its examples) / (the device's peak FLOP/s x efficiency): the
 * backward pass costs about twice the forward one. A model can be given by
 * parameter count and forward FLOPs per example alone.
 *
 * Every preset's figures and where they come from are in the tables of
 * costmodel.c and printed by `dsim whatif --presets`. */
#ifndef DSIM_COSTMODEL_H
#define DSIM_COSTMODEL_H

#include <stdbool.h>
#include <stddef.h>

#include "dsim/err.h"
#include "dsim/comm.h"
#include "dsim/tpu.h"

typedef struct dsim_link_model {
    const char *name;     /* preset name, e.g. "10gbe" */
    const char *what;     /* one line */
    double latency_s;     /* alpha: one-way latency of a message */
    double bandwidth_Bps; /* 1 / beta: bytes per second, one direction */
    const char *source;   /* where the figures come from */
} dsim_link_model;

typedef struct dsim_device_model {
    const char *name;
    const char *what;
    double peak_flops; /* FP32 (non-tensor-core) peak, FLOP/s */
    double efficiency; /* the share of peak a training step reaches */
    double mem_Bps;    /* memory bandwidth, bytes/s (the reduction's gamma) */
    const char *source;
} dsim_device_model;

/* Presets by name (NULL if none); the tables for listing. */
const dsim_link_model *dsim_link_preset(const char *name);
const dsim_link_model *dsim_link_preset_at(size_t i);
const dsim_device_model *dsim_device_preset(const char *name);
const dsim_device_model *dsim_device_preset_at(size_t i);

/* "cpu" measured on this machine: the model kernels' FLOP/s on one thread
 * (a dense layer's forward and backward) and memcpy bandwidth. Cached after
 * the first call. */
const dsim_device_model *dsim_device_cpu_measured(void);

typedef struct dsim_topology {
    int hosts, devices_per_host;
    dsim_link_model intra; /* between devices of one host */
    dsim_link_model inter; /* a host's NIC: shared by its devices' flows */
    dsim_device_model device;
    /* For one machine's own engines (calibrated models): cores > 0 is how
     * many transfers can move at once (a step lasts at least its copies' and
     * reductions' CPU time over the cores, and transfers from or to one
     * device share no link: they take turns on the cores); fused_reduce: a
     * transfer that is combined on arrival costs its reduction alone (the
     * inproc transport combines straight from the sender's buffer). */
    int cores;
    bool fused_reduce;
    /* A TPU slice (dsim/tpu.h; NULL: none). Then the ranks are its replicas
     * (hosts and devices_per_host must be its hosts and replicas per host)
     * and a transfer between two chips crosses the ICI hop by hop, the
     * dimensions in turn (x, then y, then z), the short way round where a
     * dimension wraps: it takes hops x ici.latency_s plus its bytes over
     * ici.bandwidth_Bps shared with the step's other flows on the busiest
     * directed link of its path (each link carries each direction on its
     * own: a bidirectional ring uses both). A transfer between the replicas
     * of one chip (v2, v3) takes on_chip. No NIC is involved: intra and
     * inter are unused. dsim_tpu_link_models fills ici and on_chip. */
    const dsim_tpu_topology *tpu;
    dsim_link_model ici;
    dsim_link_model on_chip;
} dsim_topology;

/* A TPU generation's links and one replica's device as cost-model presets,
 * from dsim/tpu.h's figures (the sources go with them): ici is one link in
 * one direction; on_chip the transfer between the two TensorCores of a v2 or
 * v3 chip, which no public figure gives: dsim takes one core's share of the
 * chip's HBM bandwidth and the ICI's hop latency; the device is a replica
 * (a TensorCore on v2/v3, a chip on v4 and v5e) at the chip's bf16 peak
 * over its replicas. */
void dsim_tpu_link_models(dsim_tpu_gen gen, dsim_link_model *ici, dsim_link_model *on_chip);
const dsim_device_model *dsim_tpu_device_model(dsim_tpu_gen gen);

/* One all-reduce of `bytes` (elements of esize bytes) over every device of
 * the topology (rank = host * devices_per_host + device) with algorithm algo
 * (not AUTO). *steps gets the schedule's step count if not NULL. */
dsim_err dsim_cost_allreduce(const dsim_topology *t, dsim_algo algo, size_t bytes, size_t esize,
                             double *seconds, int *steps);

/* Who sends to whom in each step of an algorithm's schedule over p ranks
 * (the schedule costmodel.c evaluates, on one host): step k's transfers
 * are src[i] -> dst[i] for i in off[k] .. off[k + 1]. Calibration
 * (calibrate.h) replays it with messages of its own, so that a row is
 * fitted to the pattern its algorithm's steps make on this machine. */
typedef struct dsim_cost_pattern {
    int steps, n;
    int *off;       /* [steps + 1] */
    int *src, *dst; /* [n] */
} dsim_cost_pattern;

/* The pattern of algo (not AUTO) over p >= 2 ranks into *out, which
 * dsim_cost_pattern_free releases; DSIM_EINVAL or DSIM_ENOMEM with a
 * message. */
dsim_err dsim_cost_pattern_of(dsim_algo algo, int p, dsim_cost_pattern *out);
void dsim_cost_pattern_free(dsim_cost_pattern *pt);

/* What AUTO should run for an all-reduce of `bytes` (float32 elements of
 * esize bytes) on topology t: the algorithm dsim can run there whose
 * schedule the model finds fastest (reduce_to_one only on request); the
 * library's own decision (dsim_allreduce_decide_hosts) where it is within
 * 1 % of that. *seconds (if not
 * NULL) gets its time. decide.c. */
dsim_algo dsim_cost_decide(const dsim_topology *t, size_t bytes, size_t esize, double *seconds);

/* The same for a running job, as a dsim_decide_fn (dsim_train_cfg.decide,
 * dsim_comm_set_decide): the job's links and device from t, the shape of
 * the communicator that asks; answers kept per shape and size. A shape that
 * is not hosts x local of nranks, or part of a TPU slice, gets no opinion
 * (DSIM_ALGO_AUTO). */
typedef struct dsim_cost_decider dsim_cost_decider;
dsim_err dsim_cost_decider_create(const dsim_topology *t, dsim_cost_decider **out);
void dsim_cost_decider_destroy(dsim_cost_decider *d);
dsim_algo dsim_cost_decider_fn(void *user, size_t bytes, int nranks, int hosts, int local);

/* The textbook closed forms (Thakur, Rabenseifner & Gropp 2005) for p ranks
 * on identical links (alpha, beta = 1 / bandwidth) and reduction cost gamma
 * per byte, n bytes:
 *   ring:  2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
 *   rhd:   2 lg p' alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma, p' the
 *          largest power of two <= p, plus (2 alpha + 2 n beta + n gamma)
 *          for folding the other p - p' ranks in and out
 *   tree:  ceil(lg p) (2 alpha + 2 n beta + n gamma) (binomial reduce + broadcast)
 *   reduce_to_one: 2 alpha + 2 (p-1) n beta + (p-1) n gamma (every rank
 *          sends to rank 0 at once, sharing its link; rank 0 combines them
 *          one after the other, then sends p - 1 copies at once)
 *   torus: as a ring of p ranks: over hosts whose one NIC carries both
 *          directions' flows, the bidirectional rings move what one ring
 *          does; on a TPU slice (topology.tpu) each link direction is its
 *          own, which is where the torus gains (evaluated, not closed form)
 * For the tests: the schedule evaluation equals these when n divides into
 * the blocks evenly and every rank is on its own host. */
double dsim_cost_allreduce_formula(dsim_algo algo, int p, double n, double alpha, double beta,
                                   double gamma);

/* Seconds of compute for one replica's step: 3 x flops_per_example x
 * examples / (peak x efficiency). */
double dsim_cost_compute(const dsim_device_model *d, double flops_per_example, double examples);

/* Parses "25.6M", "4.1G", "1e9", "512K" (decimal SI suffixes K M G T) into
 * *out; DSIM_EINVAL with a message naming what on a bad value. */
dsim_err dsim_cost_parse_count(const char *what, const char *s, double *out);

#endif
