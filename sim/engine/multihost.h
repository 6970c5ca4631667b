/* A job over machines: the rendezvous of `dsim worker` processes.
 *
 * Every task of a TF_CONFIG cluster (chief and workers in worker-id order,
 * then the parameter servers) runs one `dsim worker` with the same scenario.
 * Where its ranks listen: a worker task at HOST:PORT with D devices hosts
 * ranks on HOST:PORT .. HOST:PORT+D-1 (a parameter server, its one rank at
 * HOST:PORT); the chief (worker id 0) also listens for the others' results
 * connections on HOST:PORT+D. Ports must therefore be spaced by at least
 * D+1 between tasks that share a host.
 *
 * dsim_mh_open binds this task's listeners (so a port already taken is an
 * error before anything waits); dsim_mh_rendezvous then has the chief accept
 * one results connection from every other task, and every other task
 * connect to the chief with retry and backoff until the deadline. Each
 * connection opens with a challenge and response on the cluster secret
 * (dsim/spi/auth.h) and carries the task's index, the job's size, the
 * SHA-256 of the scenario text and a build tag: a stray peer, a task of
 * another job, a different scenario file or another dsim build is refused
 * with the reason, and the refusal is logged on both sides. The same
 * secret is handed to the tcp transport (secret_file=, or the environment).
 *
 * Then the chief runs the harness with engine processes and these hosts
 * (sim/engine/processes.h): its own task's child is forked here, the
 * others' by their agents (dsim_proc_agent). */
#ifndef DSIM_SIM_MULTIHOST_H
#define DSIM_SIM_MULTIHOST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dsim/cluster.h"
#include "dsim/spi/auth.h"
#include "processes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsim_mh_opts {
    const char *scenario_text; /* hashed: every task must run the same file */
    size_t scenario_len;
    const char *secret_file; /* NULL: $DSIM_CLUSTER_SECRET, when set */
    int64_t timeout_ns;      /* how long the group may take to form (<= 0: 120 s) */
    FILE *progress;          /* where to say what it waits for, or NULL */
} dsim_mh_opts;

typedef struct dsim_mh {
    dsim_proc_hosts hosts; /* for dsim_proc_attempt.hosts / dsim_proc_agent */
    int n_tasks;
    bool is_chief;
    int chief_fd;  /* not the chief: its results connection */
    int collector; /* the chief: its results listener */
    int *conn;     /* [n_tasks] */
    int *listen_fds;
    int n_listen;
    char *addrs;
    char *tcp_extra;
    char chief_addr[300];
    char **task_addr; /* [n_tasks] "HOST:PORT" of each task's first rank */
    dsim_secret secret;
    uint8_t scenario_hash[32];
    dsim_mh_opts o;
    int64_t t_open, t_formed; /* CLOCK_MONOTONIC ns */
} dsim_mh;

/* Resolves the tasks and addresses of cluster c for a job of cfg's shape
 * (hosts = chiefs + workers, num_ps = ps tasks, or an error naming both),
 * and binds this task's listeners. */
dsim_err dsim_mh_open(const dsim_cluster *c, const dsim_train_cfg *cfg, const dsim_mh_opts *o,
                      dsim_mh *mh);
dsim_err dsim_mh_rendezvous(dsim_mh *mh);
/* The chief, after the rendezvous: that every task sees the file at
 * `path` (the checkpoint's, relative to each task's working directory) on
 * the same storage. Writes a token beside it, has every other task read it
 * back, and removes it; an error names the task, the path and what that
 * task saw. */
dsim_err dsim_mh_check_shared(dsim_mh *mh, const char *path);
/* The chief: tells every agent that the job is over. */
void dsim_mh_bye(dsim_mh *mh);
void dsim_mh_close(dsim_mh *mh);

#ifdef __cplusplus
}
#endif
#endif
