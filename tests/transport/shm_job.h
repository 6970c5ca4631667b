/* The process harness of test_shm.c: a job of up to MAXP child processes,
 * each opening one rank of one shared mapping (fd=N,local=R) and running a
 * child_fn. Children report through a pipe: a byte when they are ready,
 * then a child_res when they are done. shm_job.c. */
#ifndef DSIM_TESTS_SHM_JOB_H
#define DSIM_TESTS_SHM_JOB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dsim/rt.h"
#include "dsim/spi/shm.h"
#include "dsim/transport.h"

#define MS       1000000LL
#define MAXP     4
#define LONG_NS  (30000 * MS)
#define BOUND_NS (5000 * MS) /* a survivor fails this soon after the kill */

typedef struct child_res {
    int err; /* the first failure, or DSIM_OK */
    int peer;
    int64_t t_fail; /* CLOCK_MONOTONIC, when it failed */
    uint64_t rounds, msgs, corrupt, bytes;
    char msg[384];
    dsim_shm_stats st;
} child_res;

typedef struct child {
    pid_t pid;
    int rfd;
    int reaped;
    int status;
} child;

typedef struct job {
    int n;
    int fd;
    const char *opts; /* extra options for every process */
    /* called in each child before its fabric (and its threads) exist */
    void (*pre)(int rank);
    child c[MAXP];
} job;

typedef struct world {
    dsim_rt *rt;
    dsim_fabric *f;
    dsim_ep *ep;
    int rank, n;
} world;

typedef void (*child_fn)(world *w, void *arg, child_res *res, int wfd);

/* CLOCK_MONOTONIC in ns; a 64-bit mixer. */
int64_t mono(void);
uint64_t mix(uint64_t x);
/* The payload of message (src, dst, k): its bytes say who sent it when,
 * so a torn or misplaced message shows. */
void fill(uint8_t *p, size_t n, int src, int dst, uint64_t k);
int intact(const uint8_t *p, size_t n, int src, int dst, uint64_t k);

/* In a child: notes the first failure (dsim's last error); opens and
 * closes its rank (world_close takes the fabric's counters first); says it
 * is ready. */
void fail_child(child_res *res, const char *what);
int world_open(world *w, const job *j, int rank, child_res *res);
void world_close(world *w, child_res *res);
void ready(int wfd);
/* One message to or from a peer (tag, comm 1), filled and checked by
 * fill/intact: 0, or -1 with the failure noted. */
int send_msg(world *w, int to, uint32_t tag, size_t len, uint64_t k, child_res *res);
int recv_msg(world *w, int from, uint32_t tag, size_t len, uint64_t k, child_res *res);

/* In the test: a new mapping for n ranks; a child per rank; all of it. */
void job_init(job *j, int n, const char *opts);
void start_child(job *j, int rank, child_fn fn, void *arg);
void job_start(job *j, int n, const char *opts, child_fn fn, void *arg);
void job_end(job *j);
/* Reads exactly n bytes within the deadline: 1, or 0 on EOF or timeout. */
int read_full(int fd, void *buf, size_t n, int64_t deadline);
void wait_ready(job *j, int rank);
/* The child's result; 0 if it died before giving one. */
int collect(job *j, int rank, child_res *res);
/* Kills a child and notes when. */
int64_t kill_now(job *j, int rank);
/* Waits until the child has stopped itself (a libfiu point's SIGSTOP): 1.
 * If it ended instead, the test fails saying how and what the child said,
 * unless the child did all it had to without a failure (its point never
 * fired): 0 then, and the caller may try once more. */
int wait_stopped_or_done(job *j, int rank);
void wait_stopped(job *j, int rank);
/* Whether libfiu is here; arms a point in a child (after 0: now). */
int fiu_usable(void);
void child_fiu(const char *point, int after);

#endif
