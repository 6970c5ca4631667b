/* Spins up N ranks of one job inside a test or benchmark process: a runtime,
 * a fabric, one endpoint and one communicator per rank, and a worker per rank
 * (dsim_rt_spawn) that runs a caller's function with its rank's communicator.
 *
 *     coll_harness h;
 *     coll_harness_cfg cfg = {.nranks = 4};            // threads + inproc
 *     if (coll_harness_open(&h, &cfg) != DSIM_OK) ...  // dsim_errmsg() says why
 *     coll_harness_run(&h, my_rank_fn, my_arg);        // my_rank_fn(&h, rank, my_arg)
 *     coll_harness_close(&h);
 *
 * Every rank of a run must make the same sequence of collective calls (the
 * rules of dsim/comm.h); coll_harness_sync lines the workers up between
 * phases (for instance so that one rank may read another's result) without
 * going through the code under test. */
#ifndef DSIM_TESTS_COLL_HARNESS_H
#define DSIM_TESTS_COLL_HARNESS_H

#include <pthread.h>
#include <stdint.h>

#include "dsim/comm.h"
#include "dsim/rt.h"
#include "dsim/transport.h"

typedef struct coll_harness_cfg {
    int nranks;
    const char *engine;  /* NULL: "threads" (coll_harness_sync needs threads) */
    const char *backend; /* NULL: "inproc" */
    const char *options; /* backend options, or NULL */
    uint32_t comm_id;    /* 0 is fine */
    int64_t timeout_ns;  /* <= 0: the communicator's default (these tests always want one) */
    dsim_algo algo;      /* cfg.algo of every communicator */
    int no_fingerprint;  /* cfg.no_fingerprint of every communicator */
    int plain_rank;      /* > 0: rank plain_rank - 1 alone runs without fingerprints */
    int flight_recorder; /* cfg.flight_recorder of every communicator */
    int local_size;      /* cfg.local_size (ranks per host) of every communicator */
    /* cfg.torus_* of every communicator (the torus algorithm's shape) */
    int torus_ndims;
    int torus_dims[DSIM_TORUS_MAX_DIMS];
    const int *torus_rank;
} coll_harness_cfg;

typedef struct coll_harness {
    int n;
    dsim_rt *rt;
    dsim_fabric *fab;
    dsim_ep **eps;
    dsim_comm **comms;
    pthread_barrier_t bar;
    int bar_ready;
} coll_harness;

typedef void (*coll_rank_fn)(coll_harness *h, int rank, void *arg);

/* Opens everything; on failure closes what was opened and returns the error
 * (the thread's error context says why). */
dsim_err coll_harness_open(coll_harness *h, const coll_harness_cfg *cfg);
/* Runs fn(h, rank, arg) on one worker per rank and waits for all of them. */
dsim_err coll_harness_run(coll_harness *h, coll_rank_fn fn, void *arg);
/* Waits until every worker of the current run has called it. */
void coll_harness_sync(coll_harness *h);
void coll_harness_close(coll_harness *h);

/* The failures ranks record while they run: how many, and the first one's
 * message (ranks run concurrently, so the record is locked). */
typedef struct coll_failures {
    pthread_mutex_t mu;
    int failures;
    char first[800];
} coll_failures;

void coll_fail(coll_failures *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
