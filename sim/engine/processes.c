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
 *   poll the pipes <──── STEP / EVENT ─────  observer, fault events
 *     observer(step) as they come      <──── KILL(rank) / PAUSE ── a kill seen
 *     SIGKILL / SIGSTOP / SIGCONT              here for a rank elsewhere, or
 *                                              its own pause (then SIGSTOP)
 *     on_phase(replica, phase, t)  <──── PHASE  the driver's phase hook (with
 *                                              a->on_phase: each replica's
 *                                              phases, timed in the child)
 *                                      <──── END per replica, RESULT, PARAMS,
 *                                              TRACE, INITIAL, FLIGHT per replica,
 *                                              UPDATES, STATS, MSGS (with a->msgs:
 *                                              its message log's halves), DONE
 *   waitpid: exit 0, or a signal (kill, crash)
 *   watchdog: after the first failure, bound + grace, then SIGKILL = hung
 *   merge into one dsim_train_result
 *
 * Records on a pipe are [u32 type][u32 length][payload]; a child writes them
 * under one mutex, so its threads' records never interleave. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsim/dataset.h"
#include "dsim/log.h"
#include "dsim/model.h"
#include "dsim/spi/strategy.h"
#include "fault/msglog.h"
#include "processes.h"

enum {
    PR_STEP = 1,
    PR_EVENT,
    PR_KILL,
    PR_PAUSE,
    PR_END,
    PR_RESULT,
    PR_PARAMS,
    PR_TRACE,
    PR_UPDATES,
    PR_STATS,
    PR_DONE,
    PR_INITIAL,     /* the variables before the first step (record_params) */
    PR_FLIGHT,      /* a pr_flight, then its n dsim_fr_entry */
    PR_PHASE,       /* a pr_phase: a replica entered a phase of the driver */
    PR_MSGS,        /* u64 frames not logged, then the child's dsim_msg_rec halves */
    PR_EXIT = 50,   /* agent -> chief: how the task's child ended (pr_exit) */
    PC_START = 100, /* chief -> agent: begin an attempt (restore, done[]) */
    PC_SIGNAL,      /* chief -> agent: signal the child (i32) */
    PC_BYE,         /* chief -> agent: the job is over */
};

typedef struct pr_exit {
    int32_t sig;  /* the signal that ended it, or 0 */
    int32_t code; /* its exit status otherwise */
} pr_exit;

typedef struct pr_step {
    dsim_train_step_info info; /* ids not valid: they follow */
} pr_step;

typedef struct pr_end {
    int replica;
    uint64_t ckpt_writes;
    dsim_train_replica_end end;
} pr_end;

typedef struct pr_result {
    dsim_err err;
    int peer;
    char msg[512];
    int placement, num_replicas_in_sync;
    float loss_scale;
    int shard_applied;
    uint64_t steps_per_epoch, first_step, steps;
    double initial_loss, final_loss;
    bool preempted;
    uint64_t preempted_at;
    uint64_t initial_checksum;
    int64_t t_start;
    int64_t t_return; /* when its dsim_train returned (CLOCK_MONOTONIC) */
    bool has_replica;
} pr_result;

/* A replica's flight recorder (dsim/comm.h), its entries after it. */
typedef struct pr_flight {
    int rank, size;
    uint32_t comm_id;
    uint64_t calls, n;
} pr_flight;

typedef struct pr_phase {
    int replica, phase;
    uint64_t gs;
    int64_t t; /* CLOCK_MONOTONIC, the steps' clock */
} pr_phase;

typedef struct pr_pause {
    int rank;
    int64_t duration_ns;
} pr_pause;

static int64_t pr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- the child ---- */

typedef struct pr_child {
    int fd;
    pthread_mutex_t mu;
    dsim_faults *fs;
    int lo, hi; /* its ranks */
    size_t events_sent;
} pr_child;

static void pr_write_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* the parent is gone: nothing to tell */
        b += w;
        n -= (size_t)w;
    }
}

static void pr_send2(pr_child *c, uint32_t type, const void *a, size_t na, const void *b, size_t nb)
{
    uint32_t h[2] = {type, (uint32_t)(na + nb)};
    pthread_mutex_lock(&c->mu);
    pr_write_all(c->fd, h, sizeof h);
    if (na)
        pr_write_all(c->fd, a, na);
    if (nb)
        pr_write_all(c->fd, b, nb);
    pthread_mutex_unlock(&c->mu);
}

static void pr_send(pr_child *c, uint32_t type, const void *p, size_t n)
{
    pr_send2(c, type, p, n, NULL, 0);
}

static void pr_send_events(pr_child *c)
{
    if (!c->fs)
        return;
    const dsim_fault_event *ev = NULL;
    size_t n = dsim_faults_events(c->fs, &ev);
    for (; c->events_sent < n; c->events_sent++)
        pr_send(c, PR_EVENT, &ev[c->events_sent], sizeof ev[0]);
}

static void pr_child_observer(const dsim_train_step_info *info, void *user)
{
    pr_child *c = user;
    pr_step s = {.info = *info};
    s.info.ids = NULL;
    pr_send2(c, PR_STEP, &s, sizeof s, info->ids,
             info->ids ? info->examples * sizeof(uint64_t) : 0);
}

/* The driver's phase hook in a child whose parent records the phases
 * (a->on_phase): the entry goes to the parent with the child's time. */
static dsim_hook_action pr_child_phase(void *user, int replica, dsim_phase p, uint64_t gs)
{
    pr_child *c = user;
    pr_phase ph = {.replica = replica, .phase = (int)p, .gs = gs, .t = pr_now()};
    pr_send(c, PR_PHASE, &ph, sizeof ph);
    return DSIM_HOOK_GO;
}

static const dsim_train_hooks pr_child_hooks = {.size = sizeof(dsim_train_hooks),
                                                .phase = pr_child_phase};

static void pr_on_kill(void *user, int rank, const char *why)
{
    pr_child *c = user;
    (void)why;
    pr_send_events(c);
    if (rank >= c->lo && rank <= c->hi) {
        /* A kill is a kill: the process goes, all its replicas with it. */
        pr_send(c, PR_KILL, &rank, sizeof rank);
        raise(SIGKILL);
    }
    pr_send(c, PR_KILL, &rank, sizeof rank);
}

static void pr_on_pause(void *user, int rank, int64_t duration_ns)
{
    pr_child *c = user;
    pr_send_events(c);
    pr_pause p = {.rank = rank, .duration_ns = duration_ns};
    pr_send(c, PR_PAUSE, &p, sizeof p);
    raise(SIGSTOP); /* the parent sends SIGCONT when the pause ends */
}

static void pr_child_main(const dsim_train_cfg *cfg, const dsim_proc_attempt *a, int fd, int lo,
                          int hi, const char *options)
{
    pr_child c = {.fd = fd, .lo = lo, .hi = hi};
    pthread_mutex_init(&c.mu, NULL);
    dsim_train_cfg cc = *cfg;
    cc.engine = "threads"; /* within a process, its devices are threads */
    cc.transport = "tcp";
    cc.transport_options = options;
    cc.local_first = lo;
    cc.local_count = hi - lo + 1;
    cc.observer = pr_child_observer;
    cc.observer_user = &c;
    cc.record_params = cfg->record_params && lo == 0;
    cc.hooks = NULL;
    cc.transport_filter = NULL;
    if (a && a->on_phase) {
        cc.hooks = &pr_child_hooks; /* the faults' hooks call it after their own */
        cc.hooks_user = &c;
    }
    /* its own log (the parent's copy here is not the parent's): its ranks'
     * sends and arrivals, shipped at the end */
    dsim_msg_log *ml = NULL;
    if (a && a->msgs && dsim_msg_log_create(&ml) != DSIM_OK)
        ml = NULL;
    if (a && a->n_faults) {
        if (dsim_faults_create(a->faults, a->n_faults, a->seed, cfg->hosts, cfg->devices_per_host,
                               cfg->num_ps, &c.fs) == DSIM_OK) {
            if (a->fault_done)
                dsim_faults_mark_done(c.fs, a->fault_done, a->n_faults);
            dsim_faults_process_hooks ph = {
                .on_kill = pr_on_kill, .on_pause = pr_on_pause, .user = &c};
            dsim_faults_set_process_hooks(c.fs, &ph);
            dsim_faults_set_msg_log(c.fs, ml);
            dsim_faults_attach(c.fs, &cc);
        }
    }
    if (ml && !cc.transport_filter)
        dsim_msg_log_attach(ml, &cc);
    dsim_train_result res;
    dsim_err e = dsim_train(&cc, &res);
    int64_t t_return = pr_now();
    pr_send_events(&c);
    int N = cfg->hosts * cfg->devices_per_host;
    pr_result r = {
        .err = e,
        .peer = res.error.peer,
        .placement = res.placement,
        .num_replicas_in_sync = res.num_replicas_in_sync,
        .loss_scale = res.loss_scale,
        .shard_applied = (int)res.shard_applied,
        .steps_per_epoch = res.steps_per_epoch,
        .first_step = res.first_step,
        .steps = res.steps,
        .initial_loss = res.initial_loss,
        .final_loss = res.final_loss,
        .preempted = res.preempted,
        .preempted_at = res.preempted_at,
        .initial_checksum = res.initial_checksum,
        .t_start = res.t_start,
        .t_return = t_return,
        .has_replica = lo < N,
    };
    snprintf(r.msg, sizeof r.msg, "%s", res.error.msg);
    pr_send(&c, PR_RESULT, &r, sizeof r);
    for (int q = lo; q <= hi && q < N && res.replicas; q++) {
        pr_end en = {.replica = q, .end = res.replicas[q]};
        if (res.checkpoint_writes)
            en.ckpt_writes = res.checkpoint_writes[q];
        pr_send(&c, PR_END, &en, sizeof en);
    }
    if (e == DSIM_OK && lo < N && res.params)
        pr_send(&c, PR_PARAMS, res.params, res.n_params * sizeof(float));
    if (res.trace && e == DSIM_OK)
        pr_send(&c, PR_TRACE, res.trace, res.steps * res.n_params * sizeof(float));
    if (res.initial_params && e == DSIM_OK)
        pr_send(&c, PR_INITIAL, res.initial_params, res.n_params * sizeof(float));
    /* Its replicas' flight recorders, for the parent's flight records of a
     * failed run; a record holds up to the recorder's 2000 calls (~100 KB). */
    for (int q = lo; q <= hi && q < N && q < res.n_flight; q++) {
        const dsim_fr_dump *d = &res.flight[q];
        pr_flight hd = {
            .rank = q, .size = d->size, .comm_id = d->comm_id, .calls = d->calls, .n = d->n};
        pr_send2(&c, PR_FLIGHT, &hd, sizeof hd, d->entries, d->n * sizeof *d->entries);
    }
    if (res.n_updates)
        pr_send(&c, PR_UPDATES, res.updates, res.n_updates * sizeof *res.updates);
    if (c.fs) {
        dsim_faults_stats st;
        dsim_faults_get_stats(c.fs, &st);
        pr_send(&c, PR_STATS, &st, sizeof st);
    }
    if (ml) {
        dsim_msg_rec *h = NULL;
        uint64_t dropped = 0;
        size_t nh = dsim_msg_log_halves(ml, &h, &dropped);
        pr_send2(&c, PR_MSGS, &dropped, sizeof dropped, h, nh * sizeof *h);
    }
    pr_send(&c, PR_DONE, NULL, 0);
    /* No cleanup: the process ends here, and its state is the parent's
     * copy-on-write image. */
    _exit(0);
}

/* A forked child's first steps: it dies with its parent, takes signals as
 * a fresh process does, and drops the pipe's read end. */
static void pr_child_prep(int read_end)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    close(read_end);
}

/* ---- the parent ---- */

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
    /* the record being read */
    uint32_t hdr[2];
    size_t hdr_got;
    unsigned char *body;
    size_t body_got;
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
    pr_end *ends;    /* [N] */
    bool *has_end;   /* [N] */
    int *last_phase; /* [N]: from steps and events, for hung/crashed reports */
    uint64_t *last_step;
    float *params;   /* first surviving replica's */
    int params_from; /* its worker's task, or -1 */
    float *trace;
    size_t trace_len;
    float *initial;       /* [n_params], the first replica's process's */
    dsim_fr_dump *flight; /* [N], each replica's from its process */
    dsim_ps_update *updates;
    size_t n_updates;
    int64_t t_first_failure; /* when the job started failing, or 0 */
    int64_t t_last_record;
} pr_job;

/* Writes all of a record to a socket (never SIGPIPE); false when it broke. */
static bool pr_sock_send(int fd, uint32_t type, const void *p, size_t n)
{
    uint32_t h[2] = {type, (uint32_t)n};
    const void *part[2] = {h, p};
    size_t len[2] = {sizeof h, n};
    for (int i = 0; i < 2; i++) {
        const char *b = part[i];
        size_t left = len[i];
        while (left) {
            ssize_t w = send(fd, b, left, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return false;
            b += w;
            left -= (size_t)w;
        }
    }
    return true;
}

/* Signals a task's process: here, or through its agent (which ends the
 * pauses itself). */
static void pr_signal(pr_task *t, int sig)
{
    if (!t->remote) {
        kill(t->pid, sig);
        return;
    }
    if (sig == SIGCONT || t->fd < 0)
        return;
    int32_t s32 = sig;
    pr_sock_send(t->fd, PC_SIGNAL, &s32, sizeof s32);
    if (sig == SIGKILL && !t->kill_sent)
        t->kill_sent = pr_now();
}

static void pr_lost(pr_job *j, int rank, int64_t t);
static void pr_fail_now(pr_job *j);

/* A task's process ended: by signal sig, or with exit status code. */
static void pr_ended(pr_job *j, pr_task *t, int sig, int code)
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

static int pr_task_of_rank(const pr_job *j, int rank)
{
    for (int t = 0; t < j->T; t++)
        if (rank >= j->tasks[t].lo && rank <= j->tasks[t].hi)
            return t;
    return -1;
}

/* The first rank lost for good, and when. */
static void pr_lost(pr_job *j, int rank, int64_t t)
{
    if (j->out->t_loss < 0) {
        j->out->t_loss = t;
        j->out->lost_rank = rank;
    }
}

static void pr_fail_now(pr_job *j)
{
    if (!j->t_first_failure)
        j->t_first_failure = pr_now();
}

static void pr_record(pr_job *j, pr_task *t, uint32_t type, const unsigned char *b, size_t n)
{
    j->t_last_record = pr_now();
    switch (type) {
    case PR_STEP: {
        if (n < sizeof(pr_step))
            return;
        if (j->n_steps == j->cap_steps) {
            size_t cap = j->cap_steps ? 2 * j->cap_steps : 256;
            pr_step *s = realloc(j->steps, cap * sizeof *s);
            uint64_t **ids = realloc(j->step_ids, cap * sizeof *ids);
            if (s)
                j->steps = s;
            if (ids)
                j->step_ids = ids;
            if (!s || !ids)
                return;
            j->cap_steps = cap;
        }
        pr_step *s = &j->steps[j->n_steps];
        memcpy(s, b, sizeof *s);
        size_t nid = (n - sizeof *s) / sizeof(uint64_t);
        uint64_t *ids = NULL;
        if (nid && (ids = malloc(nid * sizeof *ids)))
            memcpy(ids, b + sizeof *s, nid * sizeof *ids);
        s->info.ids = ids;
        j->step_ids[j->n_steps++] = ids;
        int r = s->info.replica;
        if (r >= 0 && r < j->N) {
            j->last_phase[r] = DSIM_PHASE_REDUCE_LOSS;
            j->last_step[r] = s->info.global_step;
        }
        if (j->cfg->observer)
            j->cfg->observer(&s->info, j->cfg->observer_user);
        break;
    }
    case PR_EVENT: {
        if (n < sizeof(dsim_fault_event))
            return;
        /* several processes see the same kill fire: keep one */
        const dsim_fault_event *ne = (const dsim_fault_event *)(const void *)b;
        /* a loss a child saw (a partition or pause for good: kills come as
         * PR_KILL), on the same CLOCK_MONOTONIC */
        if (ne->lost >= 0 && ne->lost < j->R)
            pr_lost(j, ne->lost, ne->t_abs);
        for (size_t i = 0; i < j->out->n_events; i++)
            if (j->out->events[i].fault == ne->fault && j->out->events[i].rank == ne->rank &&
                strcmp(j->out->events[i].text, ne->text) == 0)
                return;
        dsim_fault_event *e = realloc(j->out->events, (j->out->n_events + 1) * sizeof *e);
        if (!e)
            return;
        j->out->events = e;
        memcpy(&e[j->out->n_events++], b, sizeof *e);
        break;
    }
    case PR_KILL: {
        int rank;
        if (n < sizeof rank)
            return;
        memcpy(&rank, b, sizeof rank);
        int k = pr_task_of_rank(j, rank);
        if (k >= 0) {
            pr_task *v = &j->tasks[k];
            v->fault_killed = true;
            pr_lost(j, rank, pr_now());
            if (!v->exited && v != t)
                pr_signal(v, SIGKILL);
        }
        pr_fail_now(j);
        break;
    }
    case PR_PAUSE: {
        pr_pause p;
        if (n < sizeof p)
            return;
        memcpy(&p, b, sizeof p);
        if (p.duration_ns > 0) {
            t->cont_at = pr_now() + p.duration_ns;
        } else {
            t->stopped_for_good = true;
            pr_lost(j, p.rank, pr_now());
        }
        break;
    }
    case PR_RESULT:
        if (n >= sizeof t->result) {
            memcpy(&t->result, b, sizeof t->result);
            t->has_result = true;
            if (t->result.err != DSIM_OK)
                pr_fail_now(j);
        }
        break;
    case PR_END: {
        pr_end en;
        if (n < sizeof en)
            return;
        memcpy(&en, b, sizeof en);
        if (en.replica >= 0 && en.replica < j->N) {
            j->ends[en.replica] = en;
            j->has_end[en.replica] = true;
        }
        break;
    }
    case PR_PARAMS:
        if (!j->params && n == j->res->n_params * sizeof(float) && n) {
            j->params = malloc(n);
            if (j->params)
                memcpy(j->params, b, n);
        }
        break;
    case PR_TRACE:
        free(j->trace);
        j->trace = malloc(n ? n : 1);
        if (j->trace) {
            memcpy(j->trace, b, n);
            j->trace_len = n / sizeof(float);
        }
        break;
    case PR_INITIAL:
        if (!j->initial && n == j->res->n_params * sizeof(float) && n) {
            j->initial = malloc(n);
            if (j->initial)
                memcpy(j->initial, b, n);
        }
        break;
    case PR_FLIGHT: {
        pr_flight hd;
        if (n < sizeof hd)
            return;
        memcpy(&hd, b, sizeof hd);
        if (hd.rank < 0 || hd.rank >= j->N || hd.n > (n - sizeof hd) / sizeof(dsim_fr_entry))
            return;
        if (!j->flight && !(j->flight = calloc((size_t)j->N, sizeof *j->flight)))
            return;
        dsim_fr_dump *d = &j->flight[hd.rank];
        if (d->entries)
            return;
        *d = (dsim_fr_dump){
            .rank = hd.rank, .size = hd.size, .comm_id = hd.comm_id, .calls = hd.calls};
        if (hd.n && (d->entries = malloc((size_t)hd.n * sizeof *d->entries))) {
            memcpy(d->entries, b + sizeof hd, (size_t)hd.n * sizeof *d->entries);
            d->n = (size_t)hd.n;
        }
        break;
    }
    case PR_UPDATES: {
        size_t k = n / sizeof(dsim_ps_update);
        dsim_ps_update *u = realloc(j->updates, (j->n_updates + k) * sizeof *u);
        if (!u)
            return;
        j->updates = u;
        memcpy(u + j->n_updates, b, k * sizeof *u);
        j->n_updates += k;
        break;
    }
    case PR_STATS: {
        dsim_faults_stats st;
        if (n < sizeof st)
            return;
        memcpy(&st, b, sizeof st);
        dsim_faults_stats_add(&j->out->stats, &st);
        break;
    }
    case PR_PHASE: {
        pr_phase ph;
        if (n < sizeof ph || !j->a || !j->a->on_phase)
            return;
        memcpy(&ph, b, sizeof ph);
        if (ph.replica >= 0 && ph.replica < j->R)
            j->a->on_phase(j->a->on_phase_user, ph.replica, ph.phase, ph.gs, ph.t);
        break;
    }
    case PR_MSGS: {
        uint64_t dropped;
        if (n < sizeof dropped || !j->a || !j->a->msgs)
            return;
        memcpy(&dropped, b, sizeof dropped);
        size_t k = (n - sizeof dropped) / sizeof(dsim_msg_rec);
        dsim_msg_rec *h = k ? malloc(k * sizeof *h) : NULL;
        if (h)
            memcpy(h, b + sizeof dropped, k * sizeof *h);
        dsim_msg_log_add(j->a->msgs, h, h ? k : 0, dropped);
        free(h);
        break;
    }
    case PR_DONE:
        t->done = true;
        break;
    case PR_EXIT: {
        pr_exit x;
        if (!t->remote || n < sizeof x || t->exited)
            return;
        memcpy(&x, b, sizeof x);
        if (t->hung_pending) {
            t->hung = true;
            j->out->hung++;
        }
        pr_ended(j, t, x.sig, x.code);
        break;
    }
    default:
        break;
    }
}

/* Reads what is there; 0 at EOF. */
static int pr_read(pr_job *j, pr_task *t)
{
    for (;;) {
        if (t->hdr_got < sizeof t->hdr) {
            ssize_t r = read(t->fd, (char *)t->hdr + t->hdr_got, sizeof t->hdr - t->hdr_got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && errno == EAGAIN)
                return 1;
            if (r <= 0)
                return 0;
            t->hdr_got += (size_t)r;
            if (t->hdr_got < sizeof t->hdr)
                continue;
            if (t->hdr[1] > (1u << 30))
                return 0; /* not a record: stop reading this child */
            free(t->body);
            t->body = malloc(t->hdr[1] ? t->hdr[1] : 1);
            t->body_got = 0;
            if (!t->body)
                return 0;
        }
        if (t->body_got < t->hdr[1]) {
            ssize_t r = read(t->fd, t->body + t->body_got, t->hdr[1] - t->body_got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && errno == EAGAIN)
                return 1;
            if (r <= 0)
                return 0;
            t->body_got += (size_t)r;
            if (t->body_got < t->hdr[1])
                continue;
        }
        pr_record(j, t, t->hdr[0], t->body, t->hdr[1]);
        t->hdr_got = 0;
    }
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

static int pr_rank_err(dsim_err e)
{
    return e == DSIM_EABORTED ? 0 : e == DSIM_ETIMEDOUT ? 1 : 2;
}

static void pr_merge(pr_job *j)
{
    dsim_train_result *res = j->res;
    const dsim_train_cfg *cfg = j->cfg;
    int N = j->N;
    /* the summary: from a task with replicas that reported */
    const pr_result *sum = NULL;
    for (int k = 0; k < j->T; k++)
        if (j->tasks[k].has_result && j->tasks[k].result.has_replica &&
            (!sum || (j->tasks[k].result.err == DSIM_OK && sum->err != DSIM_OK)))
            sum = &j->tasks[k].result;
    uint64_t first = sum ? sum->first_step : 0, steps = 0;
    for (size_t i = 0; i < j->n_steps; i++) {
        uint64_t gs = j->steps[i].info.global_step;
        if (gs >= first && gs - first + 1 > steps)
            steps = gs - first + 1;
    }
    if (sum && sum->err == DSIM_OK)
        steps = sum->steps;
    snprintf(res->strategy, sizeof res->strategy, "%s", cfg->strategy ? cfg->strategy : "");
    res->num_workers = cfg->hosts;
    res->devices_per_host = cfg->devices_per_host;
    res->num_replicas = N;
    res->num_ps = j->P;
    if (sum) {
        res->placement = sum->placement;
        res->num_replicas_in_sync = sum->num_replicas_in_sync;
        res->loss_scale = sum->loss_scale;
        res->shard_applied = (dsim_shard_policy)sum->shard_applied;
        res->steps_per_epoch = sum->steps_per_epoch;
        res->initial_loss = sum->initial_loss;
        res->initial_checksum = sum->initial_checksum;
        /* The job started when its first task did: each task's own start
         * is later, and phases measured from a later one come out
         * negative for the tasks that started first. */
        res->t_start = sum->t_start;
        for (int k = 0; k < j->T; k++)
            if (j->tasks[k].has_result && j->tasks[k].result.t_start < res->t_start)
                res->t_start = j->tasks[k].result.t_start;
        res->preempted = sum->preempted;
        res->preempted_at = sum->preempted_at;
    }
    res->first_step = first;
    res->steps = steps;
    size_t P = res->n_params;
    size_t S = (size_t)steps, NN = (size_t)N;
    res->params = calloc(P ? P : 1, sizeof(float));
    res->loss = calloc(S ? S : 1, sizeof(double));
    res->local_loss = calloc(S * NN + 1, sizeof(double));
    res->checksum = calloc(S * NN + 1, sizeof(uint64_t));
    res->examples = calloc(S * NN + 1, sizeof(uint64_t));
    res->step_ns = calloc(S * NN + 1, sizeof(int64_t));
    res->comm_ns = calloc(S * NN + 1, sizeof(int64_t));
    res->checkpoint_writes = calloc(NN, sizeof(uint64_t));
    res->replicas = calloc(NN, sizeof *res->replicas);
    uint64_t n_ex = cfg->dataset ? cfg->dataset->spec.n_examples : cfg->data.n_examples;
    dsim_ledger_create(n_ex, cfg->epochs, cfg->hosts, cfg->devices_per_host, &res->ledger);
    if (!res->params || !res->loss || !res->local_loss || !res->checksum || !res->examples ||
        !res->step_ns || !res->comm_ns || !res->checkpoint_writes || !res->replicas)
        return;
    for (size_t k = 0; k < S; k++)
        res->loss[k] = NAN;
    for (size_t i = 0; i < j->n_steps; i++) {
        const dsim_train_step_info *in = &j->steps[i].info;
        if (in->rerun) {
            /* a lost replica's step, re-run: coverage only */
            if (res->ledger && in->ids && in->replica >= 0 && in->replica < N)
                dsim_ledger_record_rerun(res->ledger, in->replica, in->rerun_of, in->epoch,
                                         in->step, in->ids, in->examples);
            continue;
        }
        if (in->global_step < first || in->global_step - first >= steps || in->replica < 0 ||
            in->replica >= N)
            continue;
        size_t k = (size_t)(in->global_step - first), r = (size_t)in->replica;
        res->checksum[k * NN + r] = in->checksum;
        res->local_loss[k * NN + r] = in->local_loss;
        res->examples[k * NN + r] = in->examples;
        res->step_ns[k * NN + r] = in->t_end - in->t_start;
        res->comm_ns[k * NN + r] = in->t_end - in->t_comm;
        if (r == 0)
            res->loss[k] = in->loss;
        if (res->ledger && in->ids)
            dsim_ledger_record(res->ledger, in->replica, in->epoch, in->step, in->ids,
                               in->examples);
    }
    if (j->params)
        memcpy(res->params, j->params, P * sizeof(float));
    if (j->trace && j->trace_len == S * P) {
        res->trace = j->trace;
        j->trace = NULL;
    }
    res->initial_params = j->initial;
    j->initial = NULL;
    /* Replicas whose process sent none (killed, crashed, hung) keep their
     * rank and no calls. */
    if (j->flight) {
        for (int r = 0; r < N; r++)
            if (!j->flight[r].entries && !j->flight[r].calls)
                j->flight[r] =
                    (dsim_fr_dump){.rank = r, .size = N, .comm_id = DSIM_STRATEGY_COMM_WORLD};
        res->flight = j->flight;
        res->n_flight = N;
        j->flight = NULL;
    }
    /* how each replica ended */
    for (int r = 0; r < N; r++) {
        dsim_train_replica_end *e = &res->replicas[r];
        int k = pr_task_of_rank(j, r);
        const pr_task *t = k >= 0 ? &j->tasks[k] : NULL;
        if (j->has_end[r]) {
            *e = j->ends[r].end;
            res->checkpoint_writes[r] = j->ends[r].ckpt_writes;
            res->checkpoints_written += j->ends[r].ckpt_writes;
            continue;
        }
        e->phase = (dsim_phase)j->last_phase[r];
        e->global_step = j->last_step[r];
        if (!t)
            continue;
        if (t->fault_killed || t->stopped_for_good) {
            e->killed = true;
            e->t_end = t->t_exit ? t->t_exit : pr_now();
        } else if (t->hung) {
            e->t_end = 0; /* never returned */
            snprintf(e->msg, sizeof e->msg,
                     "did not end after the job failed; its process was killed");
        } else if (t->sig) {
            e->status = DSIM_EIO;
            e->t_end = t->t_exit;
            snprintf(e->msg, sizeof e->msg, "its process (worker %d) died of signal %d (%s)",
                     r / cfg->devices_per_host, t->sig, strsignal(t->sig));
        }
    }
    /* agreement among survivors */
    res->replicas_agree = true;
    res->in_sync_every_step = true;
    int ref = -1;
    for (int r = 0; r < N; r++) {
        if (res->replicas[r].killed || res->replicas[r].status != DSIM_OK || !j->has_end[r])
            continue;
        if (ref < 0) {
            ref = r;
            continue;
        }
        if (res->replicas[r].end_checksum != res->replicas[ref].end_checksum)
            res->replicas_agree = false;
        for (size_t k = 0; k < S; k++)
            if (res->checksum[k * NN + (size_t)r] != res->checksum[k * NN + (size_t)ref])
                res->in_sync_every_step = false;
    }
    res->final_loss = sum && sum->err == DSIM_OK ? sum->final_loss : NAN;
    if (j->n_updates) {
        res->updates = j->updates;
        res->n_updates = j->n_updates;
        j->updates = NULL;
        for (size_t i = 0; i < res->n_updates; i++)
            if (res->updates[i].staleness > res->max_staleness)
                res->max_staleness = res->updates[i].staleness;
    }
    /* the job's error: the most direct a task reported, else a death */
    const pr_result *worst = NULL;
    for (int k = 0; k < j->T; k++) {
        const pr_task *t = &j->tasks[k];
        if (!t->has_result || t->result.err == DSIM_OK)
            continue;
        /* The most direct error; of equals, a replica's (a server that
         * fails waiting for a client usually follows the client's own
         * failure), then the first to return. */
        int kr = pr_rank_err(t->result.err), wr = worst ? pr_rank_err(worst->err) : -1;
        if (!worst || kr > wr || (kr == wr && t->result.has_replica && !worst->has_replica) ||
            (kr == wr && t->result.has_replica == worst->has_replica &&
             t->result.t_return < worst->t_return))
            worst = &t->result;
    }
    dsim_error *er = &res->error;
    er->peer = -1;
    /* A process that died of a signal nobody sent crashed: that is the
     * cause, whatever its peers said about the connection it left. */
    for (int k = 0; k < j->T; k++) {
        const pr_task *t = &j->tasks[k];
        if (t->lost && !t->fault_killed) {
            er->code = DSIM_EPEER;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the dsim worker of ranks %d..%d was lost at step %llu: its results "
                     "connection to the chief closed or went silent (its machine or the "
                     "network to it went away?)",
                     t->lo, t->hi, t->lo < N ? (unsigned long long)j->last_step[t->lo] : 0ULL);
            return;
        }
        if (t->sig && !t->killed_by_us && !t->fault_killed) {
            er->code = DSIM_EIO;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the process of %s %d (ranks %d..%d) died of signal %d (%s) at step %llu",
                     t->lo < N ? "worker" : "parameter server",
                     t->lo < N ? t->lo / cfg->devices_per_host : t->lo - N, t->lo, t->hi, t->sig,
                     strsignal(t->sig), t->lo < N ? (unsigned long long)j->last_step[t->lo] : 0ULL);
            return;
        }
    }
    for (int k = 0; k < j->T; k++) {
        const pr_task *t = &j->tasks[k];
        if (t->hung) {
            er->code = DSIM_EHUNG;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the process of ranks %d..%d did not end within the detection bound after "
                     "the job failed, and was killed: hung",
                     t->lo, t->hi);
            return;
        }
        if (!t->done && !t->fault_killed && !t->stopped_for_good && !t->sig) {
            er->code = DSIM_EPEER;
            er->peer = t->lo;
            snprintf(er->msg, sizeof er->msg,
                     "the process of ranks %d..%d exited with status %d before it reported its "
                     "result (a strategy that calls exit()?)",
                     t->lo, t->hi, t->exit_code);
            return;
        }
    }
    if (worst) {
        er->code = worst->err;
        er->peer = worst->peer;
        snprintf(er->msg, sizeof er->msg, "%s", worst->msg);
        return;
    }
    er->code = DSIM_OK;
}

dsim_err dsim_processes_train(const dsim_train_cfg *cfg, const dsim_proc_attempt *a,
                              dsim_train_result *res, dsim_proc_outcome *out)
{
    memset(res, 0, sizeof *res);
    memset(out, 0, sizeof *out);
    res->error.peer = -1;
    out->lost_rank = -1;
    out->t_loss = -1;
    if (!cfg || cfg->hosts < 1 || cfg->devices_per_host < 1 || cfg->num_ps < 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "processes: a bad cluster");
    pr_job j;
    memset(&j, 0, sizeof j);
    j.cfg = cfg;
    j.a = a;
    j.res = res;
    j.out = out;
    j.N = cfg->hosts * cfg->devices_per_host;
    j.P = cfg->num_ps;
    j.R = j.N + j.P;
    j.T = cfg->hosts + cfg->num_ps;
    j.params_from = -1;
    if (a && a->n_faults) {
        out->fault_fired = calloc(a->n_faults, sizeof *out->fault_fired);
        if (!out->fault_fired)
            return DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory");
    }
    /* The model's size, for the merge: what dsim_train would compute. */
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
    res->n_params = dsim_model_num_params(&ms);

    int *lfd = calloc((size_t)j.R, sizeof *lfd);
    int *port = calloc((size_t)j.R, sizeof *port);
    j.tasks = calloc((size_t)j.T, sizeof *j.tasks);
    j.ends = calloc((size_t)j.N, sizeof *j.ends);
    j.has_end = calloc((size_t)j.N, sizeof *j.has_end);
    j.last_phase = calloc((size_t)j.N, sizeof *j.last_phase);
    j.last_step = calloc((size_t)j.N, sizeof *j.last_step);
    const dsim_proc_hosts *hosts = a ? a->hosts : NULL;
    size_t ocap = 256 + (size_t)j.R * 24 + (hosts ? strlen(hosts->addrs) : 0) +
                  (hosts && hosts->tcp_extra ? strlen(hosts->tcp_extra) : 0);
    char *addrs = calloc(ocap, 1);
    dsim_err e = DSIM_OK;
    if (!lfd || !port || !j.tasks || !j.ends || !j.has_end || !j.last_phase || !j.last_step ||
        !addrs) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory for %d ranks", j.R);
        goto out;
    }
    for (int r = 0; r < j.R; r++)
        lfd[r] = -1;
    /* Every rank's listener, bound before any child exists (across machines,
     * each dsim worker bound its own). */
    for (int r = 0; r < j.R && !hosts; r++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof sa;
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
            listen(fd, SOMAXCONN) != 0 || getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
            e = DSIM_ERR(DSIM_EIO, r, "processes: cannot listen on 127.0.0.1 for rank %d: %s", r,
                         strerror(errno));
            if (fd >= 0)
                close(fd);
            goto out;
        }
        lfd[r] = fd;
        port[r] = ntohs(sa.sin_port);
    }
    size_t used = 0;
    for (int r = 0; r < j.R && !hosts; r++)
        used +=
            (size_t)snprintf(addrs + used, ocap - used, "%s127.0.0.1:%d", r ? ";" : "", port[r]);
    if (hosts)
        snprintf(addrs, ocap, "%s", hosts->addrs);
    /* tasks: workers, then servers */
    for (int k = 0; k < j.T; k++) {
        pr_task *t = &j.tasks[k];
        t->fd = -1;
        t->pid = -1;
        dsim_proc_task_ranks(cfg, k, &t->lo, &t->hi);
    }
    fflush(stdout);
    fflush(stderr);
    j.t_last_record = pr_now();
    for (int k = 0; k < j.T && e == DSIM_OK; k++) {
        pr_task *t = &j.tasks[k];
        if (hosts && k != hosts->task) {
            /* Its agent forks it there: start this attempt. */
            size_t nf = a->n_faults;
            unsigned char *st = calloc(1 + nf, 1);
            if (!st) {
                e = DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory");
                break;
            }
            st[0] = cfg->restore;
            for (size_t i = 0; i < nf && a->fault_done; i++)
                st[1 + i] = a->fault_done[i];
            t->remote = true;
            t->fd = hosts->conn[k];
            bool sent = t->fd >= 0 && pr_sock_send(t->fd, PC_START, st, 1 + nf);
            free(st);
            if (!sent) {
                t->fd = -1;
                t->lost = true;
                pr_ended(&j, t, SIGKILL, 0);
            }
            continue;
        }
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0) {
            e = DSIM_ERR(DSIM_EIO, -1, "processes: pipe: %s", strerror(errno));
            break;
        }
        char *opts = malloc(ocap + 256);
        if (!opts) {
            close(pfd[0]);
            close(pfd[1]);
            e = DSIM_ERR(DSIM_ENOMEM, -1, "processes: out of memory");
            break;
        }
        size_t o = (size_t)snprintf(opts, ocap + 256, "addrs=%s,local=%d-%d,listen_fds=", addrs,
                                    t->lo, t->hi);
        for (int r = t->lo; r <= t->hi; r++)
            o += (size_t)snprintf(opts + o, ocap + 256 - o, "%s%d", r > t->lo ? ";" : "",
                                  hosts ? hosts->listen_fds[r - t->lo] : lfd[r]);
        if (hosts && hosts->tcp_extra && *hosts->tcp_extra)
            snprintf(opts + o, ocap + 256 - o, ",%s", hosts->tcp_extra);
        pid_t pid = fork();
        if (pid < 0) {
            free(opts);
            close(pfd[0]);
            close(pfd[1]);
            e = DSIM_ERR(DSIM_EIO, -1, "processes: fork: %s", strerror(errno));
            break;
        }
        if (pid == 0) {
            /* The child: dies with its parent, keeps only its own sockets. */
            pr_child_prep(pfd[0]);
            for (int q = 0; q < k; q++)
                if (j.tasks[q].fd >= 0 && !j.tasks[q].remote)
                    close(j.tasks[q].fd);
            for (int q = 0; hosts && q < j.T; q++)
                if (hosts->conn[q] >= 0)
                    close(hosts->conn[q]);
            for (int r = 0; r < j.R; r++) {
                if (r >= t->lo && r <= t->hi) {
                    /* the listeners it keeps must survive exec-less use */
                    continue;
                }
                if (lfd[r] >= 0)
                    close(lfd[r]);
            }
            pr_child_main(cfg, a, pfd[1], t->lo, t->hi, opts);
            _exit(99);
        }
        free(opts);
        close(pfd[1]);
        t->pid = pid;
        t->fd = pfd[0];
        fcntl(t->fd, F_SETFL, fcntl(t->fd, F_GETFL) | O_NONBLOCK);
        dsim_debug("processes: task %d (ranks %d..%d) is pid %d", k, t->lo, t->hi, (int)pid);
    }
    for (int r = 0; r < j.R; r++)
        if (lfd[r] >= 0) {
            close(lfd[r]);
            lfd[r] = -1;
        }
    if (e != DSIM_OK) {
        for (int k = 0; k < j.T; k++)
            if (j.tasks[k].pid > 0 || j.tasks[k].remote) {
                pr_signal(&j.tasks[k], SIGKILL);
                j.tasks[k].killed_by_us = true;
            }
    }

    /* The watchdog's bounds. */
    int64_t bound = dsim_train_detection_bound(cfg);
    if (bound <= 0 || bound == DSIM_NO_DEADLINE)
        bound = 60LL * 1000000000LL;
    int64_t grace = a && a->grace_ns > 0 ? a->grace_ns : 5LL * 1000000000LL;
    int64_t idle = 3 * bound + grace;

    for (;;) {
        struct pollfd pf[1024];
        int map[1024], n = 0;
        for (int k = 0; k < j.T && n < 1024; k++)
            if (j.tasks[k].fd >= 0 && !(j.tasks[k].remote && j.tasks[k].exited)) {
                pf[n].fd = j.tasks[k].fd;
                pf[n].events = POLLIN;
                map[n++] = k;
            }
        pr_reap(&j);
        bool all_gone = true;
        for (int k = 0; k < j.T; k++)
            if (!j.tasks[k].exited)
                all_gone = false;
        if (all_gone && n == 0)
            break;
        int64_t now = pr_now();
        /* pauses that end */
        for (int k = 0; k < j.T; k++) {
            pr_task *t = &j.tasks[k];
            if (t->cont_at && now >= t->cont_at) {
                t->cont_at = 0;
                pr_signal(t, SIGCONT);
            }
            /* a remote task that a kill did not end: its machine is gone */
            if (t->remote && !t->exited && t->kill_sent && now > t->kill_sent + 3000000000LL) {
                t->lost = true;
                pr_ended(&j, t, SIGKILL, 0);
            }
        }
        /* a task paused for good stays stopped until the others are done */
        bool others_done = true;
        for (int k = 0; k < j.T; k++)
            if (!j.tasks[k].exited && !j.tasks[k].stopped_for_good)
                others_done = false;
        for (int k = 0; k < j.T && others_done; k++)
            if (!j.tasks[k].exited && j.tasks[k].stopped_for_good) {
                j.tasks[k].killed_by_us = true;
                pr_signal(&j.tasks[k], SIGKILL);
            }
        bool overdue = (j.t_first_failure && now > j.t_first_failure + bound + grace) ||
                       now > j.t_last_record + idle;
        if (overdue) {
            for (int k = 0; k < j.T; k++) {
                pr_task *t = &j.tasks[k];
                if (t->exited || t->killed_by_us)
                    continue;
                t->killed_by_us = true;
                if (!t->stopped_for_good && !t->fault_killed && t->remote) {
                    /* hung if its agent answers the kill; lost if not */
                    t->hung_pending = true;
                } else if (!t->stopped_for_good && !t->fault_killed) {
                    t->hung = true;
                    out->hung++;
                }
                pr_signal(t, SIGKILL);
            }
        }
        int rc = poll(pf, (nfds_t)n, 20);
        if (rc < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n && rc > 0; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            pr_task *t = &j.tasks[map[i]];
            if (pr_read(&j, t) == 0) {
                if (!t->remote)
                    close(t->fd);
                t->fd = -1;
                if (t->remote && !t->exited) {
                    t->lost = true;
                    pr_ended(&j, t, SIGKILL, 0);
                }
            }
        }
        if (n == 0)
            usleep(2000);
    }
    pr_reap(&j);
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
out:
    for (int r = 0; lfd && r < j.R; r++)
        if (lfd[r] >= 0)
            close(lfd[r]);
    for (int k = 0; j.tasks && k < j.T; k++) {
        if (j.tasks[k].fd >= 0 && !j.tasks[k].remote)
            close(j.tasks[k].fd);
        free(j.tasks[k].body);
    }
    for (size_t i = 0; i < j.n_steps; i++)
        free(j.step_ids[i]);
    free(j.steps);
    free(j.step_ids);
    free(j.ends);
    free(j.has_end);
    free(j.last_phase);
    free(j.last_step);
    free(j.params);
    free(j.trace);
    free(j.initial);
    for (int r = 0; j.flight && r < j.N; r++)
        dsim_fr_dump_free(&j.flight[r]);
    free(j.flight);
    free(j.updates);
    free(j.tasks);
    free(lfd);
    free(port);
    free(addrs);
    return e;
}

void dsim_proc_outcome_free(dsim_proc_outcome *o)
{
    if (!o)
        return;
    free(o->events);
    free(o->fault_fired);
    memset(o, 0, sizeof *o);
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

/* ---- the agent (a task under a chief elsewhere) ---- */

/* Reads exactly n bytes; false at EOF or error. */
static bool pr_read_full(int fd, void *p, size_t n)
{
    char *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

/* One command from the chief; false when its connection closed. *body is
 * malloc'd (free()). */
static bool pr_command(int fd, uint32_t *type, unsigned char **body, uint32_t *len)
{
    uint32_t h[2];
    *body = NULL;
    if (!pr_read_full(fd, h, sizeof h) || h[1] > (1u << 20))
        return false;
    *type = h[0];
    *len = h[1];
    *body = malloc(h[1] ? h[1] : 1);
    if (!*body || !pr_read_full(fd, *body, h[1])) {
        free(*body);
        *body = NULL;
        return false;
    }
    return true;
}

/* Relays one attempt's child to the chief until it ends. Returns 1 when the
 * attempt ended, 0 when the chief said goodbye, -1 when its connection
 * broke. */
static int pr_agent_attempt(pid_t pid, int pfd, int chief_fd)
{
    uint32_t hdr[2];
    size_t hdr_got = 0, body_got = 0;
    unsigned char *body = NULL;
    int64_t cont_at = 0;
    bool pipe_open = true, exited = false;
    int st = 0, rc = 1;
    while (pipe_open || !exited) {
        struct pollfd pf[2] = {{.fd = pipe_open ? pfd : -1, .events = POLLIN},
                               {.fd = chief_fd, .events = POLLIN}};
        int n = poll(pf, 2, 20);
        if (n < 0 && errno != EINTR)
            break;
        if (cont_at && pr_now() >= cont_at) {
            cont_at = 0;
            kill(pid, SIGCONT);
        }
        if (pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            uint32_t type, len;
            unsigned char *cb;
            if (!pr_command(chief_fd, &type, &cb, &len)) {
                kill(pid, SIGKILL);
                rc = -1;
                chief_fd = -1;
            } else if (type == PC_SIGNAL && len >= sizeof(int32_t)) {
                int32_t sig;
                memcpy(&sig, cb, sizeof sig);
                if (!exited)
                    kill(pid, sig);
            } else if (type == PC_BYE) {
                kill(pid, SIGKILL);
                rc = 0;
            }
            free(cb);
            if (rc != 1)
                break;
        }
        if (pipe_open && (pf[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            /* whole records, so a PAUSE is seen and the chief's reader
             * never meets half of one */
            for (;;) {
                ssize_t r;
                if (hdr_got < sizeof hdr) {
                    r = read(pfd, (char *)hdr + hdr_got, sizeof hdr - hdr_got);
                } else {
                    r = read(pfd, body + body_got, hdr[1] - body_got);
                }
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0 && errno == EAGAIN)
                    break;
                if (r <= 0) {
                    pipe_open = false;
                    break;
                }
                if (hdr_got < sizeof hdr) {
                    hdr_got += (size_t)r;
                    if (hdr_got < sizeof hdr)
                        continue;
                    if (hdr[1] > (1u << 30)) {
                        pipe_open = false;
                        break;
                    }
                    free(body);
                    body = malloc(hdr[1] ? hdr[1] : 1);
                    body_got = 0;
                    if (!body) {
                        pipe_open = false;
                        break;
                    }
                } else {
                    body_got += (size_t)r;
                }
                if (hdr_got == sizeof hdr && body_got == hdr[1]) {
                    if (hdr[0] == PR_PAUSE && hdr[1] >= sizeof(pr_pause)) {
                        pr_pause p;
                        memcpy(&p, body, sizeof p);
                        if (p.duration_ns > 0)
                            cont_at = pr_now() + p.duration_ns;
                    }
                    if (!pr_sock_send(chief_fd, hdr[0], body, hdr[1])) {
                        kill(pid, SIGKILL);
                        rc = -1;
                    }
                    hdr_got = 0;
                    body_got = 0;
                }
            }
            if (rc != 1)
                break;
        }
        if (!exited && waitpid(pid, &st, WNOHANG) == pid)
            exited = true;
    }
    free(body);
    if (!exited)
        waitpid(pid, &st, 0);
    close(pfd);
    if (rc == 1) {
        pr_exit x = {.sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0,
                     .code = WIFEXITED(st) ? WEXITSTATUS(st) : -1};
        if (!pr_sock_send(chief_fd, PR_EXIT, &x, sizeof x))
            rc = -1;
    }
    return rc;
}

dsim_err dsim_proc_agent(const dsim_train_cfg *cfg, const dsim_fault *faults, size_t n_faults,
                         uint64_t seed, const dsim_proc_hosts *h, int chief_fd)
{
    int lo, hi;
    dsim_proc_task_ranks(cfg, h->task, &lo, &hi);
    size_t cap = strlen(h->addrs) + (h->tcp_extra ? strlen(h->tcp_extra) : 0) + 64 +
                 (size_t)(hi - lo + 1) * 12;
    char *opts = malloc(cap);
    if (!opts)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
    size_t o = (size_t)snprintf(opts, cap, "addrs=%s,local=%d-%d,listen_fds=", h->addrs, lo, hi);
    for (int r = lo; r <= hi; r++)
        o += (size_t)snprintf(opts + o, cap - o, "%s%d", r > lo ? ";" : "", h->listen_fds[r - lo]);
    if (h->tcp_extra && *h->tcp_extra)
        snprintf(opts + o, cap - o, ",%s", h->tcp_extra);
    dsim_err e = DSIM_OK;
    for (;;) {
        uint32_t type, len;
        unsigned char *body;
        if (!pr_command(chief_fd, &type, &body, &len)) {
            e = DSIM_ERR(DSIM_EPEER, 0, "the chief closed its connection before the job ended");
            break;
        }
        if (type == PC_BYE) {
            free(body);
            break;
        }
        if (type != PC_START || len < 1 + n_faults) {
            free(body);
            continue; /* a signal between attempts: nothing runs */
        }
        bool *done = calloc(n_faults ? n_faults : 1, sizeof *done);
        if (!done) {
            free(body);
            e = DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
            break;
        }
        for (size_t i = 0; i < n_faults; i++)
            done[i] = body[1 + i] != 0;
        dsim_train_cfg cc = *cfg;
        cc.restore = body[0] != 0;
        free(body);
        dsim_proc_attempt pa = {
            .faults = faults, .n_faults = n_faults, .seed = seed, .fault_done = done};
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0) {
            free(done);
            e = DSIM_ERR(DSIM_EIO, -1, "pipe: %s", strerror(errno));
            break;
        }
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            close(pfd[0]);
            close(pfd[1]);
            free(done);
            e = DSIM_ERR(DSIM_EIO, -1, "fork: %s", strerror(errno));
            break;
        }
        if (pid == 0) {
            pr_child_prep(pfd[0]);
            close(chief_fd);
            pr_child_main(&cc, &pa, pfd[1], lo, hi, opts);
            _exit(99);
        }
        free(done);
        close(pfd[1]);
        fcntl(pfd[0], F_SETFL, fcntl(pfd[0], F_GETFL) | O_NONBLOCK);
        dsim_debug("dsim worker: task %d (ranks %d..%d) is pid %d", h->task, lo, hi, (int)pid);
        int rc = pr_agent_attempt(pid, pfd[0], chief_fd);
        if (rc == 0)
            break;
        if (rc < 0) {
            e = DSIM_ERR(DSIM_EPEER, 0, "the connection to the chief broke during the job");
            break;
        }
    }
    free(opts);
    return e;
}
