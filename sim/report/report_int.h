/* Inside sim/report: one run as read from the store, shared by the HTML
 * report and the trace exporter. */
#ifndef DSIM_REPORT_INT_H
#define DSIM_REPORT_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <sqlite3.h>

#include "dsim/err.h"

typedef struct rp_step {
    int replica, epoch;
    int attempt; /* 0, then +1 each time the replica's step count goes back (a restart) */
    int64_t step;
    bool has_loss, has_reduced, has_checksum;
    double loss, reduced;
    uint64_t checksum;
    int64_t examples, t0, t1;
} rp_step;

typedef struct rp_event {
    int replica; /* -1: the whole run */
    int64_t t;
    char *kind, *detail;
} rp_event;

typedef struct rp_check {
    char *name, *message;
    bool passed, has_measured, has_expected;
    double measured, expected;
} rp_check;

typedef struct rp_coll {
    int replica, status;
    char *op, *algorithm, *error;
    int64_t bytes, t0, t1;
} rp_coll;

/* A flight record (failed runs): one collective call of a replica, with its
 * fingerprint. */
typedef struct rp_flight {
    int replica, waiting_for;   /* -1: none */
    int64_t seq, count, t0, t1; /* count -1: none; t1 -1: never completed */
    char *name, *dtype, *op, *state, *error;
} rp_flight;

/* A transport frame between two ranks (the store's messages); t0/t1 -1
 * where not known. */
typedef struct rp_msg {
    int attempt, src, dst;
    int64_t comm, tag, seq, bytes, t0, t1;
} rp_msg;

typedef struct rp_metric {
    char *name, *unit;
    double value;
    bool has_value;
    int replica; /* -1: the whole run */
} rp_metric;

typedef struct rp_replica {
    int replica, worker;
    char *device, *host;
} rp_replica;

typedef struct rp_run {
    int64_t id;
    char flight_path[4200]; /* where a failed run's flight records are (may not exist) */
    char *scenario, *engine, *strategy, *status, *started, *version, *config, *text;
    uint64_t seed;
    bool has_duration;
    double duration_s;
    rp_step *steps; /* in the order they were stored */
    size_t n_steps;
    rp_event *events; /* by time */
    size_t n_events;
    rp_check *checks;
    size_t n_checks;
    rp_coll *colls; /* by start */
    size_t n_colls;
    rp_metric *metrics;
    size_t n_metrics;
    double *ref_step, *ref_loss; /* the one-device reference's loss per step */
    size_t n_ref;
    rp_flight *flights; /* by replica, then the order recorded */
    size_t n_flights;
    rp_replica *replicas;
    size_t n_replicas_rows;
    rp_msg *msgs; /* by send time */
    size_t n_msgs;
    int n_replicas;           /* 1 + the highest replica seen anywhere */
    int64_t t_origin, t_last; /* engine clock: earliest and latest time stored */
    bool has_times;
} rp_run;

/* Opens db_path read-only after letting the store migrate it. `cmd` starts
 * the messages ("dsim report"). */
dsim_err rp_db_open(const char *db_path, sqlite3 **out);
/* Reads run id; an id the database does not hold is DSIM_ENOENT naming the
 * runs it does hold. */
dsim_err rp_run_load(sqlite3 *h, const char *db_path, int64_t id, rp_run *out);
void rp_run_free(rp_run *r);

const rp_metric *rp_metric_find(const rp_run *r, const char *name);
/* The first step at which the replicas' checksums differ (first attempt
 * that disagrees), or -1. */
int64_t rp_first_divergent_step(const rp_run *r);

/* Writes to tmp then renames onto path; fn writes the content. */
dsim_err rp_write_file(const char *path, dsim_err (*fn)(FILE *out, void *arg), void *arg);

#endif
