/* The processes engine's table (engine.h): a job through
 * dsim_processes_train, and a rank program with every rank a forked
 * process, joined by tcp on loopback. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsim/rt.h"
#include "dsim/spi/rt.h"
#include "dsim/spi/shm.h"
#include "dsim_cov.h"
#include "engine_int.h"
#include "proc_wire.h"
#include "processes.h"

static dsim_err pe_prepare(void)
{
    return DSIM_OK;
}

static dsim_err pe_train(const dsim_train_cfg *cfg, const dsim_engine_attempt *a,
                         dsim_train_result *res, dsim_engine_outcome *out)
{
    /* within a process, its devices are threads */
    if (a && a->in_process) {
        /* one address space: the transport of processes does not apply */
        dsim_train_cfg here = *cfg;
        here.transport = NULL;
        return dsim_engine_train_here("threads", &here, a, res, out);
    }
    return dsim_processes_train(cfg, a, res, out);
}

/* ---- a rank program over processes ---- */

/* What a rank's process sends its parent each round, before its result. */
typedef struct pe_head {
    int32_t err; /* DSIM_OK, or why the rank could not run the round */
    char msg[400];
} pe_head;

typedef struct pe_arg {
    const dsim_engine_ranks *job;
    dsim_ep *ep;
    int rank, round;
    void *result;
} pe_arg;

static void pe_worker(void *p)
{
    pe_arg *a = p;
    a->job->rank_main(a->ep, a->rank, a->round, a->result, a->job->user);
}

/* Rank r's process: its endpoint of the tcp fabric, every round down the
 * pipe. Never returns. */
static void pe_child(const dsim_engine_ranks *job, int r, const char *addrs, int lfd, int shm_fd,
                     int wfd)
{
    size_t cap = strlen(addrs) + 128;
    char *opts = malloc(cap);
    unsigned char *result = calloc(1, job->result_size ? job->result_size : 1);
    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    dsim_ep *ep = NULL;
    dsim_rt_set_host_workers(job->nranks); /* one rank a process, all on this host */
    dsim_err e = opts && result ? dsim_rt_create("threads", &rt)
                                : DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
    if (e == DSIM_OK) {
        if (shm_fd >= 0)
            snprintf(opts, cap, "fd=%d,local=%d", shm_fd, r);
        else
            snprintf(opts, cap, "addrs=%s,local=%d,listen_fds=%d,payload_checksum=0", addrs, r,
                     lfd);
        dsim_fabric_cfg fcfg = {.backend = shm_fd >= 0 ? "shm" : "tcp",
                                .nranks = job->nranks,
                                .rt = rt,
                                .options = opts};
        e = dsim_fabric_open(&fcfg, &fab);
    }
    if (e == DSIM_OK)
        e = dsim_ep_open(fab, r, &ep);
    pe_head head = {.err = e};
    if (e != DSIM_OK)
        snprintf(head.msg, sizeof head.msg, "rank %d could not join the %s fabric: %s", r,
                 shm_fd >= 0 ? "shm" : "tcp", dsim_errmsg());
    for (int round = 0; round < job->rounds; round++) {
        memset(result, 0, job->result_size);
        if (e == DSIM_OK) {
            pe_arg arg = {.job = job, .ep = ep, .rank = r, .round = round, .result = result};
            dsim_task *task = NULL;
            dsim_err se = dsim_rt_spawn(rt, r, pe_worker, &arg, &task);
            if (se == DSIM_OK) {
                dsim_rt_join(rt, task);
            } else {
                head.err = se;
                snprintf(head.msg, sizeof head.msg, "rank %d could not start its worker: %s", r,
                         dsim_errmsg());
            }
        }
        pr_write_all(wfd, &head, sizeof head);
        pr_write_all(wfd, result, job->result_size);
    }
    if (ep)
        dsim_ep_close(ep);
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    DSIM_COV_DUMP();
    _exit(0);
}

/* The forked ranks and their pipes. */
typedef struct pe_set {
    int n;
    int *lfd, *rfd;
    pid_t *pid;
    char *addrs;
    int shm_fd; /* the job's shm mapping, or -1 (tcp) */
} pe_set;

static dsim_err pe_fork(const dsim_engine_ranks *job, pe_set *s)
{
    int n = s->n;
    size_t len = 0;
    s->addrs[0] = '\0';
    if (job->transport && strcmp(job->transport, "shm") == 0)
        DSIM_CHECK(dsim_shm_create(n, NULL, &s->shm_fd));
    for (int r = 0; r < n && s->shm_fd < 0; r++) {
        int port = 0;
        s->lfd[r] = dsim_engine_listen_loopback(&port);
        if (s->lfd[r] < 0)
            return DSIM_ERR(DSIM_EIO, r, "processes: cannot listen on 127.0.0.1 for rank %d: %s", r,
                            strerror(errno));
        len += (size_t)sprintf(s->addrs + len, "%s127.0.0.1:%d", r ? ";" : "", port);
    }
    fflush(NULL);
    pid_t parent = getpid();
    for (int r = 0; r < n; r++) {
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0 || (s->pid[r] = fork()) < 0)
            return DSIM_ERR(DSIM_EIO, r, "processes: cannot start rank %d: %s", r, strerror(errno));
        if (s->pid[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1);
            close(pfd[0]);
            for (int k = 0; k < n; k++)
                if (k != r && s->lfd[k] >= 0)
                    close(s->lfd[k]);
            pe_child(job, r, s->addrs, s->lfd[r], s->shm_fd, pfd[1]);
        }
        close(pfd[1]);
        s->rfd[r] = pfd[0];
    }
    return DSIM_OK;
}

/* Round by round, every rank's result in rank order, to on_round. */
static dsim_err pe_collect(const dsim_engine_ranks *job, pe_set *s, bool *stopped)
{
    size_t rs = job->result_size;
    unsigned char *results = calloc((size_t)s->n, rs ? rs : 1);
    if (!results)
        return DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory for %d ranks", s->n);
    dsim_err e = DSIM_OK;
    for (int round = 0; round < job->rounds && e == DSIM_OK && !*stopped; round++) {
        for (int r = 0; r < s->n && e == DSIM_OK; r++) {
            pe_head head;
            if (!pr_read_full(s->rfd[r], &head, sizeof head) ||
                !pr_read_full(s->rfd[r], results + (size_t)r * rs, rs))
                e = DSIM_ERR(DSIM_EIO, r, "the process of rank %d ended early", r);
            else if (head.err != DSIM_OK)
                e = DSIM_ERR((dsim_err)head.err, r, "%s", head.msg);
        }
        if (e == DSIM_OK && job->on_round(round, results, job->user) != 0)
            *stopped = true;
    }
    free(results);
    return e;
}

static dsim_err pe_ranks(const dsim_engine_ranks *job)
{
    int n = job->nranks;
    if (n < 1 || !job->rank_main || !job->on_round || job->rounds < 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "a rank program needs >= 1 rank, rank_main and on_round");
    pe_set s = {.n = n, .shm_fd = -1};
    s.lfd = calloc((size_t)n, sizeof *s.lfd);
    s.rfd = calloc((size_t)n, sizeof *s.rfd);
    s.pid = calloc((size_t)n, sizeof *s.pid);
    s.addrs = malloc((size_t)n * 24 + 1);
    dsim_err e = s.lfd && s.rfd && s.pid && s.addrs
                     ? DSIM_OK
                     : DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory for %d ranks", n);
    for (int r = 0; e == DSIM_OK && r < n; r++)
        s.lfd[r] = s.rfd[r] = -1;
    if (e == DSIM_OK)
        e = pe_fork(job, &s);
    for (int r = 0; s.lfd && r < n; r++)
        if (s.lfd[r] >= 0)
            close(s.lfd[r]);
    bool stopped = false;
    if (e == DSIM_OK)
        e = pe_collect(job, &s, &stopped);
    for (int r = 0; s.pid && r < n; r++) {
        if (s.pid[r] <= 0)
            continue;
        if (e != DSIM_OK || stopped)
            kill(s.pid[r], SIGKILL);
        int st;
        while (waitpid(s.pid[r], &st, 0) < 0 && errno == EINTR)
            ;
    }
    for (int r = 0; s.rfd && r < n; r++)
        if (s.rfd[r] >= 0)
            close(s.rfd[r]);
    free(s.lfd);
    free(s.rfd);
    free(s.pid);
    free(s.addrs);
    if (s.shm_fd >= 0)
        close(s.shm_fd);
    return e;
}

const dsim_engine_ops dsim_engine_processes = {
    .size = sizeof(dsim_engine_ops),
    .name = "processes",
    .summary = "every worker and parameter server a forked process, joined by shm on one host "
               "(transport: tcp for loopback sockets; tcp over machines: dsim worker)",
    .flags = DSIM_ENGINE_FORKS | DSIM_ENGINE_TCP | DSIM_ENGINE_REAL_LINKS |
             DSIM_ENGINE_THREAD_PER_REPLICA | DSIM_ENGINE_HOSTS,
    .runtime = "threads",
    .prepare = pe_prepare,
    .train = pe_train,
    .ranks = pe_ranks,
};
