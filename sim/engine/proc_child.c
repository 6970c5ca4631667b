/* The processes engine's child: one task's ranks under dsim_train, with
 * tcp between the tasks, and everything it sees sent to its parent as
 * records (proc_wire.h): every step of every replica, its fault events, its
 * phases when the parent records them, and at the end its part of the
 * result. Kills and pauses of its own faults are real: a SIGKILL or SIGSTOP
 * of the process itself. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fault/msglog.h"
#include "dsim/spi/rt.h"
#include "dsim_cov.h"
#include "proc_int.h"

typedef struct pr_child {
    int fd;
    pr_ring *ring; /* the records' way to the parent (NULL: the pipe) */
    pthread_mutex_t mu;
    dsim_faults *fs;
    int lo, hi; /* its ranks */
    size_t events_sent;
    /* step phases not sent yet (under mu): they go with the next record a
     * replica sends outside its timed compute and exchange */
    pr_phase held[PR_PHASES_HELD];
    size_t n_held;
} pr_child;

/* Whether the parent must see a record of this type at once: all but a
 * step's, a batch's read and the step phases held (type 0), which it takes
 * from the ring when it next looks (proc_ring.h). */
static bool pr_urgent(uint32_t type)
{
    return type != 0 && type != PR_STEP && type != PR_READ;
}

/* A record (type, then a[na] and b[nb]) after the held phases' record,
 * when there are any, in one write (under c->mu; type 0: the phases only,
 * urgent where a phase other than a step's is among them). */
static void pr_send_locked(pr_child *c, uint32_t type, const void *a, size_t na, const void *b,
                           size_t nb, bool urgent)
{
    uint32_t hp[2] = {PR_PHASE, (uint32_t)(c->n_held * sizeof c->held[0])};
    uint32_t h[2] = {type, (uint32_t)(na + nb)};
    struct iovec iov[5];
    int n = 0;
    if (c->n_held) {
        iov[n++] = (struct iovec){hp, sizeof hp};
        iov[n++] = (struct iovec){c->held, c->n_held * sizeof c->held[0]};
        c->n_held = 0;
    }
    if (type) {
        iov[n++] = (struct iovec){h, sizeof h};
        iov[n++] = (struct iovec){(void *)a, na};
        iov[n++] = (struct iovec){(void *)b, nb};
    }
    if (n && c->ring)
        pr_ring_send(c->ring, c->fd, iov, n, urgent || pr_urgent(type));
    else if (n)
        pr_writev_all(c->fd, iov, n);
}

static void pr_send2(pr_child *c, uint32_t type, const void *a, size_t na, const void *b, size_t nb)
{
    pthread_mutex_lock(&c->mu);
    pr_send_locked(c, type, a, na, b, nb, false);
    pthread_mutex_unlock(&c->mu);
}

static void pr_send(pr_child *c, uint32_t type, const void *p, size_t n)
{
    pr_send2(c, type, p, n, NULL, 0);
}

/* The rows of a (trace_grad or trace_slots: rows of `width` floats,
 * n_params a part) where this process's replicas applied a gradient: of
 * each part, from its first to its last element that is not NaN. */
static void pr_send_rows(pr_child *c, uint32_t type, const float *a, uint64_t rows, size_t width,
                         size_t P)
{
    for (uint64_t j = 0; a && P && j < rows; j++) {
        for (size_t at = 0; at < width; at += P) {
            const float *part = a + j * width + at;
            size_t lo = 0, hi = P;
            while (lo < P && isnan(part[lo]))
                lo++;
            while (hi > lo && isnan(part[hi - 1]))
                hi--;
            if (lo == hi)
                continue;
            pr_grads g = {.rows = rows, .width = width, .row = j, .lo = at + lo, .n = hi - lo};
            pr_send2(c, type, &g, sizeof g, part + lo, (hi - lo) * sizeof(float));
        }
    }
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
 * (a->on_phase): the entry goes to the parent with the child's time. A
 * step's phases (compute, all-reduce, the loss's reduction) are held and go
 * with the replica's next record (its step's, its next batch's, a kill's),
 * which goes after the step: a record sent from inside the step used to be
 * a pipe write that woke the parent, which then took a CPU from the
 * replicas mid-step (one of the quickstart's 4 replicas on 2 CPUs measured
 * 4x the others' compute in most runs, a straggler of dsim's own making),
 * and a record is still a copy and a lock taken inside the timed step.
 * Held entries of a process killed mid-step are lost with it; the spans
 * the recorder stores need the entry after them, which such a step lacks
 * anyway (but for a loss reduction's start). */
static dsim_hook_action pr_child_phase(void *user, int replica, dsim_phase p, uint64_t gs)
{
    pr_child *c = user;
    pr_phase ph = {.replica = replica, .phase = (int)p, .gs = gs, .t = pr_now()};
    pthread_mutex_lock(&c->mu);
    if (c->n_held == PR_PHASES_HELD)
        pr_send_locked(c, 0, NULL, 0, NULL, 0, false);
    c->held[c->n_held++] = ph;
    if (!pr_step_phase((int)p))
        pr_send_locked(c, 0, NULL, 0, NULL, 0, true);
    pthread_mutex_unlock(&c->mu);
    return DSIM_HOOK_GO;
}

/* A replica read its batch: it is recorded at once (in the ring, which
 * the parent reads after this process's death too), so that a read the
 * job relied on is not lost when this process is killed before the step's
 * end (its other replicas may be mid-step when one of them dies). */
static void pr_child_batch(void *user, int replica, uint32_t epoch, uint64_t step,
                           const uint64_t *ids, uint64_t n)
{
    pr_child *c = user;
    pr_batch rd = {.replica = replica, .epoch = epoch, .step = step};
    pr_send2(c, PR_READ, &rd, sizeof rd, ids, ids ? n * sizeof(uint64_t) : 0);
}

static const dsim_train_hooks pr_child_hooks = {
    .size = sizeof(dsim_train_hooks), .phase = pr_child_phase, .batch = pr_child_batch};
static const dsim_train_hooks pr_child_reads = {.size = sizeof(dsim_train_hooks),
                                                .batch = pr_child_batch};

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

void pr_child_main(const dsim_train_cfg *cfg, const dsim_proc_attempt *a, int fd, pr_ring *ring,
                   int lo, int hi, const char *transport, const char *options)
{
    pr_child c = {.fd = fd, .ring = ring, .lo = lo, .hi = hi};
    pthread_mutex_init(&c.mu, NULL);
    /* every replica of the job runs on this host, in this process or a
     * sibling: waits yield where they outnumber the CPUs */
    dsim_rt_set_host_workers(cfg->hosts * cfg->devices_per_host);
    dsim_train_cfg cc = *cfg;
    cc.engine = "threads";    /* within a process, its devices are threads */
    cc.transport = transport; /* "shm" on one host, "tcp" */
    cc.transport_options = options;
    cc.local_first = lo;
    cc.local_count = hi - lo + 1;
    cc.observer = pr_child_observer;
    cc.observer_user = &c;
    cc.record_params = cfg->record_params && lo == 0;
    /* every process: its replicas' parts (a sharded optimizer's) */
    cc.record_grads = cfg->record_grads;
    /* the faults' hooks call these after their own */
    cc.hooks = a && a->on_phase ? &pr_child_hooks : &pr_child_reads;
    cc.hooks_user = &c;
    cc.transport_filter = NULL;
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
        .input_from_strategy = res.input_from_strategy,
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
        .n_vars = res.n_vars,
    };
    memcpy(r.vars, res.vars, sizeof r.vars);
    snprintf(r.msg, sizeof r.msg, "%s", res.error.msg);
    snprintf(r.exchange, sizeof r.exchange, "%s", res.exchange);
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
        pr_send(&c, PR_TRACE, res.trace, res.trace_rows * res.n_params * sizeof(float));
    if (res.trace_grad && e == DSIM_OK) {
        size_t P = res.n_params;
        pr_send_rows(&c, PR_GRADS, res.trace_grad, res.trace_grad_rows, P, P);
        /* a row of the optimizer's rule slots (adam's m and v) */
        pr_send_rows(&c, PR_SLOTS, res.trace_slots, res.trace_grad_rows,
                     dsim_optim_rule_slots(&cfg->optim) * P, P);
    }
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
    /* and its replicas' sub-communicators' (all of them are local here) */
    for (int q = N; q < res.n_flight; q++) {
        const dsim_fr_dump *d = &res.flight[q];
        size_t wl = d->world_ranks ? (size_t)d->size * sizeof(int) : 0;
        size_t el = d->n * sizeof *d->entries;
        unsigned char *body = wl ? malloc(wl + el) : NULL;
        if (!body)
            continue;
        memcpy(body, d->world_ranks, wl);
        if (el)
            memcpy(body + wl, d->entries, el);
        pr_flight hd = {.rank = d->rank,
                        .size = d->size,
                        .comm_id = d->comm_id,
                        .calls = d->calls,
                        .n = d->n,
                        .sub = 1,
                        .world_rank = d->world_rank,
                        .origin = d->origin,
                        .color = d->color,
                        .parent_id = d->parent_id};
        pr_send2(&c, PR_FLIGHT, &hd, sizeof hd, body, wl + el);
        free(body);
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
    DSIM_COV_DUMP();
    _exit(0);
}

/* A forked child's first steps: it dies with its parent, takes signals as
 * a fresh process does, and drops the pipe's read end. */
void pr_child_prep(int read_end)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    /* An interrupt is the parent's (dsim run's, dsim worker's) to take: it
     * stores the run as unfinished and exits, and this child dies with it
     * (PDEATHSIG). A terminal's Ctrl-C reaches the whole process group:
     * were the child to die of it first, the run would read as crashed. */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGPIPE, SIG_DFL);
    close(read_end);
}
