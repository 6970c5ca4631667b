/* Inside dsim_train: the job, its replicas, servers, handlers and health
 * checks, shared by the driver's files:
 *   train.c     dsim_train: checks, initial values, the result
 *   world.c     runtime, fabric, endpoints, communicators, health checks
 *   replica.c   the workers: a replica's steps, a server's handler
 *   watchdog.c  spawning the workers and waiting for them with a bound
 *   job.c       the job's references and failure, phase names
 *   setup.c     what dsim_train and dsim_train_reference share
 * train.c's comment describes the driver as a whole. */
#ifndef DSIM_TRAIN_INT_H
#define DSIM_TRAIN_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/health.h"
#include "strategy_int.h"

typedef struct train_job train_job;

typedef struct train_replica {
    train_job *job;
    int index;
    dsim_replica_ctx ctx;
    void *priv;
    float *final;
    dsim_task *task;
    uint64_t ckpt_writes;
    uint64_t preempted_at;   /* global steps done when a preemption stopped it; 0: none */
    _Atomic int phase;       /* dsim_phase: where the replica is now */
    _Atomic uint64_t step;   /* the global step it is on */
    _Atomic int64_t t_phase; /* when it entered the phase */
    uint64_t good_checksum;  /* its variables after the last update that succeeded */
    uint16_t good_sig[DSIM_MODEL_MAX_VARS]; /* ... their signatures (libdsim's strategies) */
    uint64_t coll_failed; /* its world communicator's failed calls, as last seen */
    bool killed;          /* stopped by the hooks, as a killed process */
    _Atomic int dead;     /* killed by a phase hook: its worker's health check stops */
    _Atomic int in_cb;    /* TRAIN_CB_*: inside the caller's code */
    bool returned;        /* under job->lock */
    bool abandoned;       /* the driver's: left running by the watchdog */
} train_replica;

typedef struct train_server {
    train_job *job;
    dsim_server_ctx ctx;
    void *priv;
    int inited;
    dsim_ps_update *updates;
    size_t n_updates, cap_updates;
} train_server;

typedef struct train_handler {
    train_job *job;
    int server, client;
    dsim_task *task;
    bool returned;  /* under job->lock */
    bool abandoned; /* the driver's */
} train_handler;

/* One worker's health check (dsim/health.h). */
typedef struct train_health {
    train_job *job;
    int worker;
    dsim_health *h;
} train_health;

/* Where a replica is inside the caller's code. */
enum { TRAIN_CB_NONE, TRAIN_CB_HOOK, TRAIN_CB_OBSERVER };

struct train_job {
    const dsim_train_cfg *cfg;
    const dsim_strategy *strat;
    dsim_strategy_shape shape;
    dsim_train_setup su;
    int N, P;
    int host_workers_prev; /* dsim_rt_host_workers before this job set its own */
    int host_workers_set;
    int chief;          /* the replica that writes checkpoints */
    int64_t timeout_ns; /* collectives': > 0 the bound, 0 none */
    float loss_scale;
    uint64_t total_steps, first_step, end_step;
    uint32_t start_epoch;
    uint64_t start_step;
    dsim_strategy_vars init;
    /* the checkpoint's dynamic loss scale, for every replica's to resume
     * from (has_ls false: the policy's initial one) */
    bool has_ls;
    float ls_scale;
    uint32_t ls_counter;
    dsim_rt *rt;
    dsim_fabric *fab;
    dsim_ep **eps;     /* N + P */
    dsim_comm **world; /* N */
    dsim_comm **ctl;   /* N, comm id DSIM_STRATEGY_COMM_CONTROL: preemption's agreement */
    int *torus_rank;   /* [N] on a TPU slice: the replica at each place of its torus (the
                          world communicators borrow it), else NULL */
    bool preempt_armed;
    train_replica *reps;
    train_server *srvs;
    train_handler *handlers; /* P * N */
    train_health *health;    /* [hosts] when the job runs the health check, else NULL */
    dsim_waitq *lock;
    int failed;
    dsim_error err;
    dsim_train_result *res; /* &resv */
    /* [res->trace_grad_rows]: whether row j of res->trace_grad was set to
     * NaN and written to (optim_seen_copy, under its lock); the rows are
     * zero, not yet committed memory, until then */
    unsigned char *grad_filled;

    /* What the workers may use after a hung dsim_train has returned: the
     * caller's configuration copied, and the result they write. */
    dsim_train_cfg cfgv;
    char *checkpoint_path;
    dsim_train_result resv;
    atomic_int refs; /* the driver and each worker not yet returned */

    /* the watchdog; under lock unless atomic */
    int spawned_r, spawned_h;
    int n_running;                 /* spawned and not returned */
    int64_t failed_at;             /* dsim_rt_now when failed was set */
    _Atomic int64_t last_progress; /* a phase entered or a worker returned */
    dsim_train_stuck *stuck;
    size_t n_stuck;
    /* the gate to the caller's observer and hooks */
    atomic_int gate_in;
    atomic_bool gate_closed;
    train_job *abandoned_next; /* under train_abandoned_mu */
};

/* Does this process host rank r? */
static inline bool train_local(const train_job *job, int r)
{
    const dsim_train_cfg *cfg = job->cfg;
    return cfg->local_count <= 0 ||
           (r >= cfg->local_first && r < cfg->local_first + cfg->local_count);
}

/* Why a replica stopped without an error of its own. */
#define TRAIN_DIED ((dsim_err)-1)

/* job.c */
void train_wake_servers(train_job *job);
void train_fail(train_job *job, const char *who, int index, int rank);
void train_abandon(train_job *job);
void train_job_unref(train_job *job);
/* At the run's end: the rows of res->trace_grad no update wrote to, NaN;
 * no trace_grad at all (NULL, 0 rows) when none did (no whole-model
 * update on replica 0 here, no optimizer of a part: a process of the
 * processes engine whose replicas kept nothing). */
void train_grads_close(train_job *job);

/* replica.c */
const char *train_checkpoint_mismatch(const train_job *job, const dsim_checkpoint *ck, char *buf,
                                      size_t cap);
void train_replica_main(void *arg);
void train_handler_main(void *arg);

/* watchdog.c */
dsim_err train_run_workers(train_job *job);

/* world.c */
dsim_err train_open_world(train_job *job);
void train_close_world(train_job *job);

#endif
