/* Flight records and desync analysis (ARCHITECTURE.md §8): what each rank's
 * collectives came to, written after a failed run, and the question people
 * ask of it: "why did it hang?"
 *
 * The file is JSON, one per run, holding every replica's flight recorder
 * (dsim/comm.h) with the field names of PyTorch's NCCL flight recorder, so
 * people who read those dumps read these at once:
 *
 *   { "version": "2.4", "run_id": 7, "scenario": "...", "error": "...",
 *     "pg_config": {"1": {"name": "world", "desc": ..., "ranks": "[0, 1, 2, 3]"}},
 *     "ranks": [ { "rank": 0, "pg_id": 1, "calls": 17,
 *                  "entries": [ { "record_id", "pg_id", "process_group",
 *                                 "collective_seq_id", "p2p_seq_id", "op_id",
 *                                 "profiling_name": "dsim:all_reduce",
 *                                 "time_created_ns", "time_discovered_started_ns",
 *                                 "time_discovered_completed_ns", "duration_ms",
 *                                 "input_sizes": [[36]], "input_dtypes": ["Float"],
 *                                 "output_sizes", "output_dtypes",
 *                                 "state": "scheduled" | "started" | "completed",
 *                                 "is_p2p": false, "retired", "timeout_ms", "frames": [],
 *                                 "dsim": { "reduce_op", "root", "algorithm",
 *                                           "waiting_for", "error", "fingerprint" } } ] } ] }
 *
 * The file lies next to the store, in dsim-flight/run-ID.json; the store
 * keeps the same entries in its flight_records table (sim/store/SCHEMA.md),
 * one row per call per replica. */
#ifndef DSIM_DIAG_FLIGHT_H
#define DSIM_DIAG_FLIGHT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsim/err.h"
#include "dsim/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's names: "dsim:all_reduce", ... for a dsim_coll_kind; "Float",
 * "Double", ... for a dsim_dtype (NULL for none). */
const char *dsim_flight_profiling_name(unsigned coll);
const char *dsim_flight_dtype_name(unsigned dtype);

/* "<directory of db_path>/dsim-flight/run-<run_id>.json" into buf. */
void dsim_flight_path(const char *db_path, uint64_t run_id, char *buf, size_t cap);

/* Writes res's flight recorders (res->flight) to path, creating its
 * directory; error is the run's error message (or NULL), timeout_ns the
 * collectives' bound. DSIM_ENOENT when res holds none. */
dsim_err dsim_flight_write(const char *path, uint64_t run_id, const char *scenario,
                           const dsim_train_result *res, const char *error, int64_t timeout_ns);

/* What dsim_flight_desync found. */
typedef struct dsim_desync {
    int ranks;
    uint64_t seq;    /* the first call not every rank completed; 0: none */
    int n_missing;   /* ranks that never made that call */
    int n_waiting;   /* ranks in it, not done */
    int n_different; /* ranks whose call of that number is another one */
    int n_failed;    /* ranks whose call of that number returned an error */
} dsim_desync;

/* Reads a flight file and writes to out what it says: the first collective
 * not every rank completed, which ranks are missing from it, which are in a
 * different call, who waited for whom, and the last call each rank
 * completed. DSIM_ENOENT / DSIM_EPROTO naming the file when it cannot be
 * read. sum may be NULL. */
dsim_err dsim_flight_desync(const char *path, FILE *out, dsim_desync *sum);

#ifdef __cplusplus
}
#endif
#endif
