/* Internal to sim/store: the record queue, the store object, and what the
 * store's files share:
 *   store.c      the callers' side: records queued for the writer, flush
 *   writer.c     the writer thread: each record's SQL, batches, failures
 *   open.c       opening (checks, migrations, crashed runs) and closing
 *   read.c       reading a run back, marking a dead process's runs
 *   schema.c     the schema's migrations
 *   fork_gate.c  the writers' fork gate: no fork() while a writer works */
#ifndef DSIM_STORE_INT_H
#define DSIM_STORE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <sqlite3.h>

#include "store.h"

/* store_migrations[k] is the SQL that takes user_version k to k + 1. */
extern const char *const store_migrations[DSIM_STORE_SCHEMA_VERSION];

/* Most records one transaction holds; bounds the writer's scratch buffer and
 * how long a flush can wait behind one commit. */
#define STORE_BATCH_MAX 4096
/* An idle writer is woken once this many records wait, or a caller waits
 * for one (a flush, a run's begin or end); else it looks every
 * STORE_IDLE_MS. */
#define STORE_WAKE_AT 256
#define STORE_IDLE_MS 20
enum { STORE_W_BUSY, STORE_W_ASLEEP, STORE_W_GATHERING };
/* How long a write waits for another program's lock before failing. */
#define STORE_BUSY_TIMEOUT_MS 10000

enum store_kind {
    REC_BEGIN,
    REC_END,
    REC_REPLICA,
    REC_STEP,
    REC_COLL,
    REC_EVENT,
    REC_CHECK,
    REC_METRIC,
    REC_FLIGHT,
    REC_REFLOSS,
    REC_MSG,
    REC_PARAMS,
    REC_NKINDS
};

typedef struct store_rec {
    int kind;
    uint64_t seq;
    dsim_run_id run;
    union {
        struct {
            char *scenario, *text, *engine, *strategy, *version, *config;
            uint64_t seed;
            int64_t started;
            dsim_run_id *reply; /* the caller waits for this record */
        } begin;
        struct {
            int status;
            char *trace_hash;
            int64_t ended;
        } end;
        struct {
            int replica, worker;
            char *device, *host;
        } replica;
        dsim_step_rec step;
        struct {
            int replica;
            char *op, *algorithm;
            uint64_t bytes;
            int64_t t0, t1;
            int status;
        } coll;
        struct {
            int replica, kind;
            int64_t t;
            char *detail;
        } event;
        struct {
            char *name, *message;
            int passed, by_default;
            double measured, expected;
        } check;
        struct {
            char *name, *unit;
            double value;
            int replica;
        } metric;
        struct {
            dsim_flight_rec f; /* its strings owned by the record */
        } flight;
        struct {
            uint64_t step;
            double loss;
        } refloss;
        dsim_msg_row msg;
        struct {
            uint64_t step;
            float *data; /* n floats, owned by the record */
            size_t n;
        } params;
    } u;
} store_rec;

struct dsim_store {
    char *path;
    sqlite3 *db;
    sqlite3_stmt *stmt[REC_NKINDS];
    char host[256];
    long pid;
    int64_t pid_start; /* -1 where /proc is not available */

    pthread_t writer;
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full, done;
    store_rec *ring;
    size_t head, count;
    store_rec *batch; /* the writer's; filled with the lock dropped */
    uint64_t enq_seq, done_seq;
    uint64_t ok_seq; /* the last record of the last batch committed */
    bool stop;
    /* The writer's state: STORE_W_BUSY, or waiting on not_empty, asleep
     * on an empty queue (the first record wakes it) or gathering more for
     * up to STORE_IDLE_MS (a batch's worth of records or one that is waited
     * on, flush_to, wakes it): a step's records cost no system call each. */
    int writer_state;
    uint64_t flush_to; /* the highest sequence number a store_wait wants */
    uint64_t batches;  /* batches the writer has taken (dsim_store_batches) */
    /* The first write failure; sticky. */
    dsim_err fail_code;
    char fail_msg[400];
    uint64_t lost; /* records discarded because of it */
    /* Runs begun on this store and not ended: the only ones it records. */
    dsim_run_id *active;
    size_t nactive, active_cap, reserved;
    /* Runs whose row this store committed and whose end it has not seen
     * committed (active ones and ends that failed): close marks those still
     * 'running' unfinished. Same capacity as active. */
    dsim_run_id *unsettled;
    size_t nunsettled;
    /* The SQLite code a libfiu point injected on the connection's owner
     * (writer, or open/close), for the message in place of sqlite3_errmsg. */
    int fiu_rc;
};

/* store.c */
int64_t store_wall_ns(void);
dsim_err store_report_locked(dsim_store *st);

/* fork_gate.c: a writer's work happens inside the gate, which a fork()
 * anywhere in the process closes (and waits for) first, so that no child
 * starts with a lock a writer held. store_gate_install registers the
 * pthread_atfork handlers, once per process. */
void store_gate_install(void);
void store_gate_enter(void);
void store_gate_leave(void);

/* writer.c */
int store_exec(sqlite3 *db, const char *sql);
int store_exec_at(dsim_store *st, const char *point, const char *sql);
int store_step_at(dsim_store *st, const char *point, sqlite3_stmt *s);
const char *store_errmsg(const dsim_store *st);
void store_rec_free(store_rec *r);
void *store_writer(void *arg);

#endif
