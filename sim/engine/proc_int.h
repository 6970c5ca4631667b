/* Inside the processes engine: the parent's state of a job (processes.c),
 * what it makes of the children's records (proc_merge.c), and the child's
 * and the agent's entry points (proc_child.c, proc_agent.c). */
#ifndef DSIM_SIM_PROC_INT_H
#define DSIM_SIM_PROC_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "proc_ring.h"
#include "proc_wire.h"
#include "processes.h"

/* One task of the job: a child forked here, or a task under an agent. */
typedef struct pr_task {
    pid_t pid;
    int fd; /* read end, -1 once closed */
    int lo, hi;
    bool exited, done, killed_by_us, fault_killed, stopped_for_good, hung;
    bool remote;       /* under a dsim worker elsewhere: fd is its results connection */
    bool lost;         /* remote: its connection closed or it stopped answering */
    bool hung_pending; /* remote: killed by the watchdog, not yet confirmed */
    int64_t kill_sent; /* remote: when a SIGKILL was asked for */
    int sig;
    int exit_code; /* when it exited without a signal */
    int64_t t_exit;
    int64_t cont_at; /* SIGCONT due, or 0 */
    pr_result result;
    bool has_result;
    pr_reader rd;  /* the record being read */
    pr_ring *ring; /* a child forked here: its records (proc_ring.h) */
} pr_task;

typedef struct pr_job {
    const dsim_train_cfg *cfg;
    const dsim_proc_attempt *a;
    int N, P, R, T; /* replicas, servers, ranks, tasks */
    pr_task *tasks;
    dsim_train_result *res;
    dsim_proc_outcome *out;
    /* what the steps said, per (step, replica), until the size is known */
    pr_step *steps;
    uint64_t **step_ids;
    size_t n_steps, cap_steps;
    /* what the replicas read, as they read it (PR_READ): the ledger's */
    pr_batch *reads;
    uint64_t **read_ids, *read_n;
    size_t n_reads, cap_reads;
    pr_end *ends;    /* [N] */
    bool *has_end;   /* [N] */
    int *last_phase; /* [N]: from steps and events, for hung/crashed reports */
    uint64_t *last_step;
    float *params; /* first surviving replica's */
    float *trace;
    size_t trace_len;
    float *grads; /* trace_grad */
    size_t grads_len;
    float *slots; /* trace_slots */
    size_t slots_len;
    float *initial;       /* [n_params], the first replica's process's */
    dsim_fr_dump *flight; /* [n_flight]: each replica's from its process, then the
                             sub-communicators' */
    int n_flight;
    dsim_ps_update *updates;
    size_t n_updates;
    int64_t t_first_failure; /* when the job started failing, or 0 */
    int64_t t_last_record;
} pr_job;

/* processes.c: the job's state as the records and exits come. */
void pr_signal(pr_task *t, int sig);
void pr_ended(pr_job *j, pr_task *t, int sig, int code);
int pr_task_of_rank(const pr_job *j, int rank);
void pr_lost(pr_job *j, int rank, int64_t t);
void pr_fail_now(pr_job *j);

/* proc_merge.c: one record of task t; the children's parts merged into
 * j->res once every task has ended. */
void pr_record(pr_job *j, pr_task *t, uint32_t type, const unsigned char *b, size_t n);
void pr_merge(pr_job *j);

/* proc_child.c: a forked child's first steps (it dies with its parent,
 * takes signals as a fresh process does, drops the pipe's read end), and
 * its life: dsim_train of ranks lo..hi over tcp with `options`, every
 * record into its ring (down fd where ring is NULL), fd its wake-ups.
 * Never returns. */
void pr_child_prep(int read_end);
void pr_child_main(const dsim_train_cfg *cfg, const dsim_proc_attempt *a, int fd, pr_ring *ring,
                   int lo, int hi, const char *transport, const char *options);

#endif
