/* The processes engine's wire: the records a task's child sends its parent
 * over a pipe (and an agent relays to the chief over its results
 * connection), and the chief's commands to an agent.
 *
 * A record is [u32 type][u32 length][payload]; a child writes each whole
 * under one mutex, so its threads' records never interleave. Payloads are
 * the structs below, as the same build lays them out (every task of a job
 * runs the same build: multihost.h checks it). */
#ifndef DSIM_SIM_PROC_WIRE_H
#define DSIM_SIM_PROC_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dsim/strategy.h"

enum {
    PR_STEP = 1,    /* a pr_step, then the step's example ids */
    PR_EVENT,       /* a dsim_fault_event */
    PR_KILL,        /* int rank: a kill fired (the sender dies next if it is its own) */
    PR_PAUSE,       /* a pr_pause: the sender stops itself next */
    PR_END,         /* a pr_end per replica */
    PR_RESULT,      /* a pr_result */
    PR_PARAMS,      /* the final variables */
    PR_TRACE,       /* every step's variables (record_params) */
    PR_UPDATES,     /* dsim_ps_update records */
    PR_STATS,       /* dsim_faults_stats */
    PR_DONE,        /* nothing more: the child ends */
    PR_INITIAL,     /* the variables before the first step (record_params) */
    PR_FLIGHT,      /* a pr_flight, then its n dsim_fr_entry */
    PR_PHASE,       /* pr_phase[]: replicas entered phases of the driver */
    PR_MSGS,        /* u64 frames not logged, then the child's dsim_msg_rec halves */
    PR_READ,        /* a pr_batch, then the example ids a replica read (at its compute) */
    PR_GRADS,       /* a pr_grads, then the gradient its replicas applied at a span's first
                       step (record_grads): records for each row where they applied one */
    PR_SLOTS,       /* the same of adam's slots before those updates (trace_slots) */
    PR_EXIT = 50,   /* agent -> chief: how the task's child ended (pr_exit) */
    PR_INTERRUPT,   /* agent -> chief: the task was interrupted (i32 signal) */
    PR_PROBED,      /* agent -> chief: what it read of the probe's file (text) */
    PC_START = 100, /* chief -> agent: begin an attempt (restore, done[]) */
    PC_SIGNAL,      /* chief -> agent: signal the child (i32) */
    PC_BYE,         /* chief -> agent: the job is over */
    PC_PROBE,       /* chief -> agent: read this file (path NUL token) */
};

/* Records longer than this are not records: the reader stops. */
#define PR_MAX_RECORD (1u << 30)

typedef struct pr_exit {
    int32_t sig;  /* the signal that ended it, or 0 */
    int32_t code; /* its exit status otherwise */
} pr_exit;

typedef struct pr_step {
    dsim_train_step_info info; /* ids not valid: they follow */
} pr_step;

typedef struct pr_batch {
    int32_t replica;
    uint32_t epoch;
    uint64_t step;
} pr_batch;

typedef struct pr_end {
    int replica;
    uint64_t ckpt_writes;
    dsim_train_replica_end end;
} pr_end;

typedef struct pr_result {
    dsim_err err;
    int peer;
    char msg[512];
    char exchange[256]; /* dsim_train_result.exchange (its replica 0's) */
    int placement, num_replicas_in_sync;
    float loss_scale;
    int shard_applied;
    int input_from_strategy; /* dsim_train_result.input_from_strategy */
    uint64_t steps_per_epoch, first_step, steps;
    double initial_loss, final_loss;
    bool preempted;
    uint64_t preempted_at;
    uint64_t initial_checksum;
    int64_t t_start;
    int64_t t_return; /* when its dsim_train returned (CLOCK_MONOTONIC) */
    bool has_replica;
    size_t n_vars; /* dsim_train_result.vars */
    dsim_model_var vars[DSIM_MODEL_MAX_VARS];
} pr_result;

/* The part [lo, lo + n) of row `row` of dsim_train_result.trace_grad
 * (PR_GRADS) or trace_slots (PR_SLOTS), rows of `width` floats, where a
 * process's replicas applied a gradient (NaN where they did not, in
 * between). */
typedef struct pr_grads {
    uint64_t rows, width, row, lo, n;
} pr_grads;

/* A replica's flight recorder (dsim/comm.h), its entries after it. sub: one
 * of a sub-communicator (rank is then its rank there, world_rank the
 * replica), whose size world ranks come first. */
typedef struct pr_flight {
    int rank, size;
    uint32_t comm_id;
    uint64_t calls, n;
    int sub, world_rank, origin, color;
    uint32_t parent_id;
} pr_flight;

/* A child holds up to this many step phases before it sends them. */
#define PR_PHASES_HELD 64

/* One of a step's phases, which a child holds (proc_child.c). */
static inline bool pr_step_phase(int p)
{
    return p == DSIM_PHASE_COMPUTE || p == DSIM_PHASE_ALLREDUCE || p == DSIM_PHASE_REDUCE_LOSS;
}

typedef struct pr_phase {
    int replica, phase;
    uint64_t gs;
    int64_t t; /* CLOCK_MONOTONIC, the steps' clock */
} pr_phase;

typedef struct pr_pause {
    int rank;
    int64_t duration_ns;
} pr_pause;

/* CLOCK_MONOTONIC in ns. */
int64_t pr_now(void);

/* Writes all of p to a pipe (EINTR retried; a reader gone: given up). */
void pr_write_all(int fd, const void *p, size_t n);
/* The same for iov[cnt], in as few writes as the pipe takes (iov is used
 * up); empty parts may be among them. */
struct iovec;
void pr_writev_all(int fd, struct iovec *iov, int cnt);

/* Writes a whole record to a socket (never SIGPIPE); false when it broke. */
bool pr_sock_send(int fd, uint32_t type, const void *p, size_t n);

/* Reads exactly n bytes; false at EOF or error. */
bool pr_read_full(int fd, void *p, size_t n);

/* One command from the chief (blocking); false when its connection closed.
 * *body is malloc'd (free()). */
bool pr_command(int fd, uint32_t *type, unsigned char **body, uint32_t *len);

/* A record being read from a non-blocking descriptor. */
typedef struct pr_reader {
    uint32_t hdr[2]; /* type, length */
    size_t hdr_got;
    unsigned char *body;
    size_t body_got;
} pr_reader;

/* Reads on from fd: 1 when a whole record is in rd (hdr, body; the next
 * call starts the next record), 0 when nothing more is there now, -1 at
 * EOF, an error or a length that is no record's. */
int pr_reader_next(int fd, pr_reader *rd);

/* The same from another source: src(ctx, buf, n) gives up to n bytes (> 0),
 * 0 when none are there now, -1 at its end or an error. */
typedef ssize_t (*pr_src)(void *ctx, void *buf, size_t n);
int pr_reader_from(pr_reader *rd, pr_src src, void *ctx);

void pr_reader_free(pr_reader *rd);

#endif
