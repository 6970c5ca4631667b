/* The results store: every run's results in one SQLite database.
 *
 * One store is one open database (default "dsim.db" in the working
 * directory). A single writer thread owns the SQLite connection; the record
 * calls below only copy their arguments into a bounded in-memory queue, so a
 * worker never waits on the disk. The writer commits what it finds in the
 * queue in one transaction per batch; under load a batch holds thousands of
 * rows. A caller waits only when the writer is a whole queue behind
 * (DSIM_STORE_QUEUE_CAP records); records are never dropped.
 *
 * Every call is thread-safe except close, which must be the last call on the
 * store. A process that forked after opening a store must not use it in the
 * child. A fork() anywhere in the process waits until no writer is inside
 * SQLite or the allocator (pthread_atfork; at most one batch), so that a
 * child that goes on without exec never starts with a lock a writer held.
 *
 * A write failure in the writer thread (disk full, permissions, a lock held
 * too long by another program) is remembered: that call and every later call
 * on the store return it, with the database path and SQLite's message. What
 * was committed before stays committed; rows still queued are not written.
 * Close still tries to mark the runs it leaves open 'unfinished'.
 *
 * Fault points (libfiu, dsim/fiu.h): dsim/store/open before each write that
 * opening makes, dsim/store/write before each statement the writer or close
 * runs (BEGIN, each row, COMMIT); one that fires stands for SQLite failing
 * with the point's failinfo as its result code (default SQLITE_IOERR_WRITE).
 *
 * The schema is described in sim/store/SCHEMA.md. */
#ifndef DSIM_STORE_H
#define DSIM_STORE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The schema version this build writes (PRAGMA user_version). Older
 * databases are migrated forward at open; newer ones are refused. */
#define DSIM_STORE_SCHEMA_VERSION 8
/* PRAGMA application_id of a dsim database: "dsim" in ASCII. */
#define DSIM_STORE_APPLICATION_ID 0x6473696d
#define DSIM_STORE_DEFAULT_PATH   "dsim.db"
/* Records the queue holds before a caller waits for the writer. */
#define DSIM_STORE_QUEUE_CAP 16384

typedef struct dsim_store dsim_store;
typedef int64_t dsim_run_id;

/* Opens (creating it if absent) the database at path, or at
 * DSIM_STORE_DEFAULT_PATH when path is NULL. A database written by an older
 * dsim is migrated forward in one transaction. Refused, and left byte for
 * byte unchanged: a file that is not SQLite, an SQLite file of another
 * application, a database from a newer dsim. Runs that a process on this host
 * left 'running' and that process is gone are marked 'unfinished'. */
dsim_err dsim_store_open(const char *path, dsim_store **out);

/* Commits everything queued, marks runs begun here and not ended (or whose
 * end a write failure kept from being committed) as 'unfinished', and
 * closes. Returns the first write failure, if any; the store is freed
 * either way. NULL is a no-op. */
dsim_err dsim_store_close(dsim_store *st);

/* The runs begun on this store whose end has not been committed: those that
 * dsim_store_close marks 'unfinished'. Up to cap ids into ids (may be NULL
 * with cap 0); returns how many there are. */
size_t dsim_store_unsettled(dsim_store *st, dsim_run_id *ids, size_t cap);

/* Waits until every record queued before the call is committed. */
dsim_err dsim_store_flush(dsim_store *st);

/* Batches the writer has taken from the queue so far, each one commit: the
 * writer waits for a batch's worth of records, a flush, or STORE_IDLE_MS
 * (20 ms) after the first, so a burst of step records costs a commit, not
 * one each. For tests and benchmarks. */
uint64_t dsim_store_batches(dsim_store *st);

/* The path the store was opened with. */
const char *dsim_store_path(const dsim_store *st);

/* What a run was: all strings are copied. */
typedef struct dsim_run_info {
    const char *scenario;      /* the scenario's name (required) */
    const char *scenario_text; /* the scenario file's full text, or NULL */
    uint64_t seed;
    const char *engine;       /* threads, processes, sim (required) */
    const char *strategy;     /* or NULL */
    const char *dsim_version; /* NULL: this build's version */
    const char *config_json;  /* resolved configuration as JSON, or NULL */
    int64_t started_ns;       /* wall clock, ns since the Unix epoch; 0: now */
} dsim_run_info;

/* Inserts the run with status 'running' and commits it before returning, so
 * that the run is visible (and later marked unfinished) even if the process
 * dies at once. The id orders runs by start. */
dsim_err dsim_store_begin_run(dsim_store *st, const dsim_run_info *info, dsim_run_id *out);

typedef enum dsim_run_status {
    DSIM_RUN_PASSED,  /* every check passed */
    DSIM_RUN_FAILED,  /* a check failed */
    DSIM_RUN_ERROR,   /* the run could not complete (bad input, harness error) */
    DSIM_RUN_HUNG,    /* a worker never returned; the watchdog left it running (version 3) */
    DSIM_RUN_CRASHED, /* the process died inside the run: a signal, or exit() (version 3) */
} dsim_run_status;

/* "passed", "failed", "error", "hung", "crashed" ("unknown" otherwise). */
const char *dsim_run_status_name(dsim_run_status s);

/* A stored run as `dsim replay` needs it; strings are the caller's to free
 * with dsim_stored_run_free. */
typedef struct dsim_stored_run {
    char *scenario, *scenario_text, *engine, *status;
    char *trace_hash; /* NULL when none was stored */
    char *config;     /* the resolved configuration (JSON), NULL when none */
    uint64_t seed;
} dsim_stored_run;

/* Reads run `id` of the database at path (read-only; the writer of a store
 * open in this process commits first with dsim_store_flush). DSIM_ENOENT
 * when there is no such run or no such file, with a message naming both. */
dsim_err dsim_store_read_run(const char *path, dsim_run_id id, dsim_stored_run *out);
void dsim_stored_run_free(dsim_stored_run *r);

/* The variables a run kept (dsim run --keep-params): rows of n floats for
 * steps 0..*steps-1 (step 0: the initial variables) into *out (malloc'd,
 * the caller frees it; NULL with *steps 0 when the run kept none). A row
 * missing or of another size is DSIM_EPROTO naming the step. */
dsim_err dsim_store_read_params(const char *path, dsim_run_id id, size_t n, float **out,
                                uint64_t *steps);

/* The parameter checksums the steps table holds for run `id`: *out gets
 * steps x replicas values (global step-major; 0 where no row was stored),
 * *steps one more than the last global step stored, *replicas one more
 * than the highest replica. Free *out. DSIM_ENOENT as dsim_store_read_run. */
dsim_err dsim_store_read_checksums(const char *path, dsim_run_id id, uint64_t **out,
                                   uint64_t *steps, int *replicas);

/* For a process that watched another one run (dsim run's supervisor): the
 * runs that process `pid` of this host began at or after since_ns (wall
 * clock) and left 'running' (an interrupted run it stored as 'unfinished'
 * stays so) are marked 'crashed' with an 'error' event whose detail is `detail`
 * (JSON), in one transaction of their own connection. Their ids go to ids
 * (up to cap), their number to *n. DSIM_OK with *n 0 when there are none. */
dsim_err dsim_store_mark_dead_process(const char *path, long pid, int64_t since_ns,
                                      const char *detail, dsim_run_id *ids, size_t cap, size_t *n);

/* Sets the run's status, trace hash (hex text, or NULL) and end time (wall
 * clock ns; 0: now), and waits until that and everything queued before it is
 * committed. Records for the run after this are refused. */
dsim_err dsim_store_end_run(dsim_store *st, dsim_run_id run, dsim_run_status status,
                            const char *trace_hash, int64_t ended_ns);

/* The record calls below queue one row and return; the row is committed by
 * the writer (flush to wait for it). A run id not begun on this store, or
 * already ended, is DSIM_EINVAL. */

/* Where a replica ran. Recording a replica again (after a restart) replaces
 * the row. */
dsim_err dsim_store_replica(dsim_store *st, dsim_run_id run, int replica, int worker,
                            const char *device, const char *host);

/* One replica's view of one training step. step counts from the start of the
 * run (global step); times are on the engine's clock. */
typedef struct dsim_step_rec {
    int replica;
    int epoch;
    int64_t step;
    double loss;         /* this replica's local loss; NaN is stored as NULL */
    double reduced_loss; /* after the cross-replica reduction */
    uint64_t checksum;   /* of the parameters after the update */
    int64_t examples;    /* examples this replica consumed in the step */
    int64_t t_start_ns;
    int64_t t_end_ns;
} dsim_step_rec;
dsim_err dsim_store_step(dsim_store *st, dsim_run_id run, const dsim_step_rec *rec);

/* One collective call on one replica. */
typedef struct dsim_coll_rec {
    int replica;
    const char *op;        /* allreduce, broadcast, ... (required) */
    const char *algorithm; /* ring, rhd, tree, ... or NULL */
    uint64_t bytes;
    int64_t t_start_ns;
    int64_t t_end_ns;
    dsim_err status; /* DSIM_OK or how the call failed */
} dsim_coll_rec;
dsim_err dsim_store_collective(dsim_store *st, dsim_run_id run, const dsim_coll_rec *rec);

typedef enum dsim_event_kind {
    DSIM_EVENT_FAULT,      /* a fault was injected */
    DSIM_EVENT_ERROR,      /* a replica or the harness saw an error */
    DSIM_EVENT_RESTART,    /* a worker or the job restarted */
    DSIM_EVENT_CHECKPOINT, /* a checkpoint was written or restored */
    DSIM_EVENT_PHASE,      /* a cold-start or run phase began or ended */
} dsim_event_kind;

/* replica -1: the event concerns the whole run. detail is free text or JSON
 * (or NULL). */
dsim_err dsim_store_event(dsim_store *st, dsim_run_id run, int replica, int64_t t_ns,
                          dsim_event_kind kind, const char *detail);

/* A check's outcome (ARCHITECTURE.md §8). measured/expected NaN are stored as NULL.
 * message is the sentence a person can act on. */
dsim_err dsim_store_check(dsim_store *st, dsim_run_id run, const char *name, bool passed,
                          double measured, double expected, const char *message);
/* The same, saying whether the check was judged by default (it applies to
 * the run and the scenario did not name it; checks.by_default). */
dsim_err dsim_store_check_row(dsim_store *st, dsim_run_id run, const char *name, bool passed,
                              double measured, double expected, const char *message,
                              bool by_default);

/* The one-device reference replay's loss at a global step (NaN: NULL);
 * a second row for the same step replaces the first. */
dsim_err dsim_store_reference_loss(dsim_store *st, dsim_run_id run, uint64_t step, double loss);

/* The variables (n float32) after global step `step` (0: the initial ones),
 * kept when `dsim run --keep-params` asks; a second row for the same step
 * replaces the first. */
dsim_err dsim_store_params(dsim_store *st, dsim_run_id run, uint64_t step, const float *p,
                           size_t n);

/* A named measurement (replica -1: of the whole run). */
dsim_err dsim_store_metric(dsim_store *st, dsim_run_id run, const char *name, double value,
                           const char *unit, int replica);

/* One collective call from a replica's flight recorder (version 4), in
 * PyTorch's flight-recorder terms. Strings may be NULL except
 * profiling_name and state; times < 0 (not reached) are stored as NULL, as
 * is waiting_for < 0. */
typedef struct dsim_flight_rec {
    int replica;
    uint64_t record_id;         /* its place among the rank's calls, from 0 */
    uint32_t pg_id;             /* the communicator */
    uint64_t collective_seq_id; /* the call's number on it, from 1 */
    const char *profiling_name; /* "dsim:all_reduce", ... */
    int64_t input_count;        /* elements; < 0: none (a barrier) */
    const char *input_dtype;    /* "Float", "Double", ... */
    const char *reduce_op;      /* sum, mean, ... */
    int root;                   /* < 0: none */
    const char *algorithm;
    const char *state; /* scheduled, started, completed */
    int waiting_for;
    const char *error; /* how it ended, if it failed */
    int64_t time_created_ns, time_started_ns, time_completed_ns;
} dsim_flight_rec;
dsim_err dsim_store_flight(dsim_store *st, dsim_run_id run, const dsim_flight_rec *rec);

/* One transport frame from rank src to rank dst (version 6), as the fault
 * layer's message log saw it (sim/fault/msglog.h). Times < 0 (not seen: a
 * frame that never arrived, or whose sender's process sent no record) are
 * stored as NULL. */
typedef struct dsim_msg_row {
    int attempt; /* the job's attempt, from 0 (a restart starts the next) */
    int src, dst;
    uint32_t comm_id, tag;
    uint64_t seq;   /* the frame's number on its link (src, dst) in the attempt */
    uint64_t bytes; /* payload */
    int64_t t_sent_ns, t_recv_ns;
} dsim_msg_row;
dsim_err dsim_store_message(dsim_store *st, dsim_run_id run, const dsim_msg_row *m);

/* pthread_create for a thread that lives while this process forks (the
 * store's writer, the crash guard's watcher, the interrupt threads): it
 * returns once the new thread runs its function. A thread still starting
 * is inside the allocator (AddressSanitizer sets up its stack and caches
 * before the function runs, and GCC 12's takes no lock around fork()), so
 * a fork right after pthread_create could leave the child an allocator
 * lock held for ever: every thread the child starts then hangs. fork_gate.c. */
int dsim_thread_start(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

#ifdef __cplusplus
}
#endif
#endif
