/* The processes engine: one child process per worker and per parameter
 * server, tcp between them, results merged in the parent (processes.h).
 *
 *   parent                                   child (worker w / server s)
 *   ------                                   ---------------------------
 *   bind a listener per rank (port 0)
 *   fork per task ─────────────────────────> close the others' fds
 *                                            dsim_train(local ranks, tcp with
 *                                              addrs + its listen_fds, filter
 *                                              and hooks of its own faults)
 *   read the rings <──── STEP / EVENT ─────  observer, fault events (each
 *     (each time round;                      record into its ring, shared
 *     a pipe's byte: now)                    memory: proc_ring.h; a byte
 *                                            down its pipe when it is urgent)
 *     observer(step) as they come      <──── KILL(rank) / PAUSE ── a kill seen
 *     SIGKILL / SIGSTOP / SIGCONT              here for a rank elsewhere, or
 *                                              its own pause (then SIGSTOP)
 *     on_phase(replica, phase, t)  <──── PHASE  the driver's phase hook (with
 *                                              a->on_phase: each replica's
 *                                              phases, timed in the child; a
 *                                              step's are held and go with
 *                                              its next READ or STEP)
 *                                      <──── END per replica, RESULT, PARAMS,
 *                                              TRACE, INITIAL, FLIGHT per replica,
 *                                              UPDATES, STATS, MSGS (with a->msgs:
 *                                              its message log's halves), DONE
 *   waitpid: exit 0, or a signal (kill, crash)
 *   watchdog: after the first failure, bound + grace, then SIGKILL = hung
 *   merge into one dsim_train_result
 *
 * This file is the parent: the job's set-up, the forks, the watch loop.
 * The records are proc_wire.h; what the parent makes of them, and the
 * merge, proc_merge.c; the child proc_child.c; the agent of a task under
 * a chief elsewhere proc_agent.c. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsim/dataset.h"
#include "dsim/log.h"
#include "dsim/model.h"
#include "engine.h"
#include "dsim/spi/shm.h"
#include "proc_int.h"

/* ---- the job's state ---- */

void pr_signal(pr_task *t, int sig)
{
    if (!t->remote) {
        kill(t->pid, sig);
        return;
    }
    /* through its agent, which ends the pauses itself */
    if (sig == SIGCONT || t->fd < 0)
        return;
    int32_t s32 = sig;
    pr_sock_send(t->fd, PC_SIGNAL, &s32, sizeof s32);
    if (sig == SIGKILL && !t->kill_sent)
        t->kill_sent = pr_now();
}

void pr_ended(pr_job *j, pr_task *t, int sig, int code)
{
    t->exited = true;
    t->t_exit = pr_now();
    if (sig) {
        t->sig = sig;
        if (!t->killed_by_us && !t->fault_killed) {
            j->out->crashed++;
            pr_lost(j, t->lo, t->t_exit);
        }
        pr_fail_now(j);
    } else if (!t->done) {
        t->exit_code = code;
        pr_fail_now(j);
    }
}

int pr_task_of_rank(const pr_job *j, int rank)
{
    for (int t = 0; t < j->T; t++)
        if (rank >= j->tasks[t].lo && rank <= j->tasks[t].hi)
            return t;
    return -1;
}

void pr_lost(pr_job *j, int rank, int64_t t)
{
    if (j->out->t_loss < 0) {
        j->out->t_loss = t;
        j->out->lost_rank = rank;
    }
}

void pr_fail_now(pr_job *j)
{
    if (!j->t_first_failure)
        j->t_first_failure = pr_now();
}

/* Reads what is there; 0 at EOF. */
static int pr_read(pr_job *j, pr_task *t)
{
    int r;
    while ((r = pr_ring_next(t->ring, t->fd, &t->rd)) == 1)
        pr_record(j, t, t->rd.hdr[0], t->rd.body, t->rd.hdr[1]);
    return r == 0;
}

static void pr_reap(pr_job *j)
{
    for (int k = 0; k < j->T; k++) {
        pr_task *t = &j->tasks[k];
        if (t->exited || t->remote || t->pid <= 0)
            continue;
        int st = 0;
        pid_t p = waitpid(t->pid, &st, WNOHANG);
        if (p != t->pid)
            continue;
        pr_ended(j, t, WIFSIGNALED(st) ? WTERMSIG(st) : 0, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

/* ---- set-up ---- */

/* What the parent needs besides the job: every rank's listener here, and
 * the addrs= option of the tcp transport. */
typedef struct pr_net {
    int *lfd; /* [R], -1 once closed */
    char *addrs;
    size_t cap;
    /* shm: the job's mapping (dsim_shm_create), inherited by every child;
     * -1 with tcp */
    const char *transport;
    int shm_fd;
} pr_net;

/* The model's size, for the merge: what dsim_train would compute. */
static dsim_err pr_model_size(const dsim_train_cfg *cfg, size_t *n)
{
    dsim_model_spec ms = cfg->model;
    if (ms.in_dim == 0 && cfg->dataset)
        dsim_dataset_model_spec(cfg->dataset, &ms);
    else if (ms.in_dim == 0) {
        dsim_dataset *ds = NULL;
        if (dsim_dataset_make(&cfg->data, &ds) != DSIM_OK)
            return dsim_last_error()->code;
        dsim_dataset_model_spec(ds, &ms);
        dsim_dataset_free(ds);
    }
    *n = dsim_model_num_params(&ms);
    return DSIM_OK;
}

static dsim_err pr_job_alloc(pr_job *j, pr_net *net)
{
    const dsim_proc_hosts *hosts = j->a ? j->a->hosts : NULL;
    j->tasks = calloc((size_t)j->T, sizeof *j->tasks);
    j->ends = calloc((size_t)j->N, sizeof *j->ends);
    j->has_end = calloc((size_t)j->N, sizeof *j->has_end);
    j->last_phase = calloc((size_t)j->N, sizeof *j->last_phase);
    j->last_step = calloc((size_t)j->N, sizeof *j->last_step);
    net->lfd = calloc((size_t)j->R, sizeof *net->lfd);
    net->cap = 256 + (size_t)j->R * 24 + (hosts ? strlen(hosts->addrs) : 0) +
               (hosts && hosts->tcp_extra ? strlen(hosts->tcp_extra) : 0);
    net->addrs = calloc(net->cap, 1);
    if (!net->lfd || !j->tasks || !j->ends || !j->has_end || !j->last_phase || !j->last_step ||
        !net->addrs)
        return DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory for %d ranks", j->R);
    for (int r = 0; r < j->R; r++)
        net->lfd[r] = -1;
    /* tasks: workers, then servers */
    for (int k = 0; k < j->T; k++) {
        pr_task *t = &j->tasks[k];
        t->fd = -1;
        t->pid = -1;
        dsim_proc_task_ranks(j->cfg, k, &t->lo, &t->hi);
    }
    return DSIM_OK;
}

/* Every rank's listener, bound before any child exists (across machines,
 * each dsim worker bound its own), and the addresses. */
static dsim_err pr_listen(pr_job *j, pr_net *net)
{
    const dsim_proc_hosts *hosts = j->a ? j->a->hosts : NULL;
    if (hosts) {
        snprintf(net->addrs, net->cap, "%s", hosts->addrs);
        return DSIM_OK;
    }
    if (strcmp(net->transport, "shm") == 0) {
        /* one mapping for the job, made before any child: each inherits it */
        dsim_err e = dsim_shm_create(j->R, NULL, &net->shm_fd);
        if (e != DSIM_OK)
            return DSIM_ERR(e, -1,
                            "processes: the shm transport's mapping for %d ranks: %s "
                            "(transport: tcp joins the processes over loopback instead)",
                            j->R, dsim_errmsg());
        return DSIM_OK;
    }
    size_t used = 0;
    for (int r = 0; r < j->R; r++) {
        int port = 0;
        net->lfd[r] = dsim_engine_listen_loopback(&port);
        if (net->lfd[r] < 0)
            return DSIM_ERR(DSIM_EIO, r, "processes: cannot listen on 127.0.0.1 for rank %d: %s", r,
                            strerror(errno));
        used += (size_t)snprintf(net->addrs + used, net->cap - used, "%s127.0.0.1:%d", r ? ";" : "",
                                 port);
    }
    return DSIM_OK;
}

/* A task under its agent elsewhere: start this attempt there. */
static dsim_err pr_start_remote(pr_job *j, int k)
{
    const dsim_proc_attempt *a = j->a;
    pr_task *t = &j->tasks[k];
    size_t nf = a->n_faults;
    unsigned char *st = calloc(1 + nf, 1);
    if (!st)
        return DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory");
    st[0] = j->cfg->restore;
    for (size_t i = 0; i < nf && a->fault_done; i++)
        st[1 + i] = a->fault_done[i];
    t->remote = true;
    t->fd = a->hosts->conn[k];
    bool sent = t->fd >= 0 && pr_sock_send(t->fd, PC_START, st, 1 + nf);
    free(st);
    if (!sent) {
        t->fd = -1;
        t->lost = true;
        pr_ended(j, t, SIGKILL, 0);
    }
    return DSIM_OK;
}

/* The tcp options of task t: every rank's address, its own ranks and their
 * listeners; on one host, frames whose checksums leave out the payload
 * (the tcp option payload_checksum=0). */
static char *pr_task_options(const pr_job *j, const pr_net *net, const pr_task *t)
{
    const dsim_proc_hosts *hosts = j->a ? j->a->hosts : NULL;
    size_t cap = net->cap + 256;
    char *opts = malloc(cap);
    if (!opts)
        return NULL;
    if (net->shm_fd >= 0) {
        snprintf(opts, cap, "fd=%d,local=%d-%d", net->shm_fd, t->lo, t->hi);
        return opts;
    }
    size_t o =
        (size_t)snprintf(opts, cap, "addrs=%s,local=%d-%d,listen_fds=", net->addrs, t->lo, t->hi);
    for (int r = t->lo; r <= t->hi; r++)
        o += (size_t)snprintf(opts + o, cap - o, "%s%d", r > t->lo ? ";" : "",
                              hosts ? hosts->listen_fds[r - t->lo] : net->lfd[r]);
    if (hosts && hosts->tcp_extra && *hosts->tcp_extra)
        snprintf(opts + o, cap - o, ",%s", hosts->tcp_extra);
    else if (!hosts) /* one host: memory to memory, as over shm */
        snprintf(opts + o, cap - o, ",payload_checksum=0");
    return opts;
}

/* Forks task k's child here. */
static dsim_err pr_fork_task(pr_job *j, const pr_net *net, int k)
{
    const dsim_proc_hosts *hosts = j->a ? j->a->hosts : NULL;
    pr_task *t = &j->tasks[k];
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return DSIM_ERR(DSIM_EIO, -1, "processes: pipe: %s", strerror(errno));
    pr_ring_unmap(t->ring); /* a fresh ring for each child (NULL: the pipe) */
    t->ring = pr_ring_map();
    char *opts = pr_task_options(j, net, t);
    pid_t pid = opts ? fork() : -1;
    if (pid < 0) {
        int err = errno;
        free(opts);
        close(pfd[0]);
        close(pfd[1]);
        return opts ? DSIM_ERR(DSIM_EIO, -1, "processes: fork: %s", strerror(err))
                    : DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory");
    }
    if (pid == 0) {
        /* The child: dies with its parent, keeps only its own sockets. */
        pr_child_prep(pfd[0]);
        for (int q = 0; q < k; q++)
            if (j->tasks[q].fd >= 0 && !j->tasks[q].remote)
                close(j->tasks[q].fd);
        for (int q = 0; hosts && q < j->T; q++)
            if (hosts->conn[q] >= 0)
                close(hosts->conn[q]);
        for (int r = 0; r < j->R; r++)
            if ((r < t->lo || r > t->hi) && net->lfd[r] >= 0)
                close(net->lfd[r]);
        pr_child_main(j->cfg, j->a, pfd[1], t->ring, t->lo, t->hi, net->transport, opts);
        _exit(99);
    }
    free(opts);
    close(pfd[1]);
    t->pid = pid;
    t->fd = pfd[0];
    fcntl(t->fd, F_SETFL, fcntl(t->fd, F_GETFL) | O_NONBLOCK);
    dsim_debug("processes: task %d (ranks %d..%d) is pid %d", k, t->lo, t->hi, (int)pid);
    return DSIM_OK;
}

/* Every task started: forked here, or begun by its agent. On failure the
 * tasks started are killed. */
static dsim_err pr_start_tasks(pr_job *j, pr_net *net)
{
    const dsim_proc_hosts *hosts = j->a ? j->a->hosts : NULL;
    fflush(stdout);
    fflush(stderr);
    j->t_last_record = pr_now();
    dsim_err e = DSIM_OK;
    for (int k = 0; k < j->T && e == DSIM_OK; k++)
        e = hosts && k != hosts->task ? pr_start_remote(j, k) : pr_fork_task(j, net, k);
    for (int r = 0; r < j->R; r++)
        if (net->lfd[r] >= 0) {
            close(net->lfd[r]);
            net->lfd[r] = -1;
        }
    if (e != DSIM_OK)
        for (int k = 0; k < j->T; k++)
            if (j->tasks[k].pid > 0 || j->tasks[k].remote) {
                pr_signal(&j->tasks[k], SIGKILL);
                j->tasks[k].killed_by_us = true;
            }
    return e;
}

/* ---- the watch loop ---- */

/* Pauses that end, remote tasks that a kill did not end, and tasks paused
 * for good once the others are done. */
static void pr_tend(pr_job *j, int64_t now)
{
    for (int k = 0; k < j->T; k++) {
        pr_task *t = &j->tasks[k];
        if (t->cont_at && now >= t->cont_at) {
            t->cont_at = 0;
            pr_signal(t, SIGCONT);
        }
        /* a remote task that a kill did not end: its machine is gone */
        if (t->remote && !t->exited && t->kill_sent && now > t->kill_sent + 3000000000LL) {
            t->lost = true;
            pr_ended(j, t, SIGKILL, 0);
        }
    }
    /* a task paused for good stays stopped until the others are done */
    for (int k = 0; k < j->T; k++)
        if (!j->tasks[k].exited && !j->tasks[k].stopped_for_good)
            return;
    for (int k = 0; k < j->T; k++)
        if (!j->tasks[k].exited && j->tasks[k].stopped_for_good) {
            j->tasks[k].killed_by_us = true;
            pr_signal(&j->tasks[k], SIGKILL);
        }
}

/* The watchdog: every task still there is killed, and counted hung unless
 * a fault stopped it. */
static void pr_kill_overdue(pr_job *j)
{
    for (int k = 0; k < j->T; k++) {
        pr_task *t = &j->tasks[k];
        if (t->exited || t->killed_by_us)
            continue;
        t->killed_by_us = true;
        if (!t->stopped_for_good && !t->fault_killed && t->remote) {
            /* hung if its agent answers the kill; lost if not */
            t->hung_pending = true;
        } else if (!t->stopped_for_good && !t->fault_killed) {
            t->hung = true;
            j->out->hung++;
        }
        pr_signal(t, SIGKILL);
    }
}

/* Until every task has ended and every pipe is read: records, exits,
 * pauses, the watchdog (after the first failure, bound + grace; with no
 * record at all for idle). */
static void pr_watch(pr_job *j, int64_t bound, int64_t grace)
{
    int64_t idle = 3 * bound + grace;
    for (;;) {
        struct pollfd pf[1024];
        int map[1024], n = 0;
        for (int k = 0; k < j->T && n < 1024; k++)
            if (j->tasks[k].fd >= 0 && !(j->tasks[k].remote && j->tasks[k].exited)) {
                pf[n].fd = j->tasks[k].fd;
                pf[n].events = POLLIN;
                map[n++] = k;
            }
        pr_reap(j);
        bool all_gone = true;
        for (int k = 0; k < j->T; k++)
            if (!j->tasks[k].exited)
                all_gone = false;
        if (all_gone && n == 0)
            break;
        int64_t now = pr_now();
        pr_tend(j, now);
        if ((j->t_first_failure && now > j->t_first_failure + bound + grace) ||
            now > j->t_last_record + idle)
            pr_kill_overdue(j);
        int rc = poll(pf, (nfds_t)n, 20);
        if (rc < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            pr_task *t = &j->tasks[map[i]];
            /* a ring is read each time round (its child wakes the parent
             * only for what must be seen at once) */
            if (!(rc > 0 && (pf[i].revents & (POLLIN | POLLHUP | POLLERR))) && !t->ring)
                continue;
            if (pr_read(j, t) == 0) {
                if (!t->remote)
                    close(t->fd);
                t->fd = -1;
                if (t->remote && !t->exited) {
                    t->lost = true;
                    pr_ended(j, t, SIGKILL, 0);
                }
            }
        }
        if (n == 0)
            usleep(2000);
    }
    pr_reap(j);
}

static void pr_job_free(pr_job *j, pr_net *net)
{
    for (int r = 0; net->lfd && r < j->R; r++)
        if (net->lfd[r] >= 0)
            close(net->lfd[r]);
    for (int k = 0; j->tasks && k < j->T; k++) {
        if (j->tasks[k].fd >= 0 && !j->tasks[k].remote)
            close(j->tasks[k].fd);
        pr_reader_free(&j->tasks[k].rd);
        pr_ring_unmap(j->tasks[k].ring);
    }
    for (size_t i = 0; i < j->n_steps; i++)
        free(j->step_ids[i]);
    free(j->steps);
    free(j->step_ids);
    for (size_t i = 0; i < j->n_reads; i++)
        free(j->read_ids[i]);
    free(j->reads);
    free(j->read_ids);
    free(j->read_n);
    free(j->ends);
    free(j->has_end);
    free(j->last_phase);
    free(j->last_step);
    free(j->params);
    free(j->trace);
    free(j->grads);
    free(j->slots);
    free(j->initial);
    for (int r = 0; j->flight && r < j->n_flight; r++)
        dsim_fr_dump_free(&j->flight[r]);
    free(j->flight);
    free(j->updates);
    free(j->tasks);
    free(net->lfd);
    free(net->addrs);
    if (net->shm_fd >= 0)
        close(net->shm_fd);
}

dsim_err dsim_processes_train(const dsim_train_cfg *cfg, const dsim_proc_attempt *a,
                              dsim_train_result *res, dsim_proc_outcome *out)
{
    memset(res, 0, sizeof *res);
    dsim_engine_outcome_init(out);
    res->error.peer = -1;
    if (!cfg || cfg->hosts < 1 || cfg->devices_per_host < 1 || cfg->num_ps < 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "processes: a bad cluster");
    pr_job j = {.cfg = cfg, .a = a, .res = res, .out = out};
    j.N = cfg->hosts * cfg->devices_per_host;
    j.P = cfg->num_ps;
    j.R = j.N + j.P;
    j.T = cfg->hosts + cfg->num_ps;
    if (a && a->n_faults) {
        out->fault_fired = calloc(a->n_faults, sizeof *out->fault_fired);
        if (!out->fault_fired)
            return DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory");
    }
    DSIM_CHECK(pr_model_size(cfg, &res->n_params));
    /* one host: shm unless the scenario says tcp; over machines: tcp */
    pr_net net = {.shm_fd = -1,
                  .transport = a && a->hosts                                      ? "tcp"
                               : cfg->transport && !strcmp(cfg->transport, "tcp") ? "tcp"
                                                                                  : "shm"};
    dsim_err e = pr_job_alloc(&j, &net);
    if (e == DSIM_OK)
        e = pr_listen(&j, &net);
    if (e != DSIM_OK) {
        pr_job_free(&j, &net);
        return e;
    }
    e = pr_start_tasks(&j, &net);
    /* The watchdog's bounds. */
    int64_t bound = dsim_train_detection_bound(cfg);
    if (bound <= 0 || bound == DSIM_NO_DEADLINE)
        bound = 60LL * 1000000000LL;
    int64_t grace = a && a->grace_ns > 0 ? a->grace_ns : 5LL * 1000000000LL;
    pr_watch(&j, bound, grace);
    for (size_t i = 0; i < out->n_events && a && out->fault_fired; i++)
        if (out->events[i].fault >= 0 && (size_t)out->events[i].fault < a->n_faults)
            out->fault_fired[out->events[i].fault] = true;
    if (out->hung)
        snprintf(out->note, sizeof out->note,
                 "%d process(es) did not end within %.3f s of the job's failure and were killed",
                 out->hung, (double)(bound + grace) / 1e9);
    if (e == DSIM_OK) {
        pr_merge(&j);
        e = res->error.code;
        if (e != DSIM_OK)
            dsim_set_error(e, res->error.peer, __FILE__, __LINE__, "%s", res->error.msg);
    } else {
        dsim_error_copy(&res->error);
    }
    pr_job_free(&j, &net);
    return e;
}

void dsim_proc_outcome_free(dsim_proc_outcome *o)
{
    dsim_engine_outcome_free(o);
}

void dsim_proc_bye(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    pr_sock_send(fd, PC_BYE, NULL, 0);
}

void dsim_proc_task_ranks(const dsim_train_cfg *cfg, int task, int *lo, int *hi)
{
    int N = cfg->hosts * cfg->devices_per_host;
    if (task < cfg->hosts) {
        *lo = task * cfg->devices_per_host;
        *hi = *lo + cfg->devices_per_host - 1;
    } else {
        *lo = *hi = N + (task - cfg->hosts);
    }
}
