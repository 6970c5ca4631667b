/* Running a scenario: store it, train, replay the reference, judge, record.
 *
 * Every store call of a run goes through HG_STORE, which holds the guard
 * lock for reading; a thread that is about to end the process (an
 * interrupt) takes it for writing in dsim_harness_shutdown, so it closes
 * the stores only between calls, and no call starts afterwards. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "dsim/comm.h"
#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/health.h"
#include "diag/flight.h"
#include "engine/sim.h"
#include "fault/fault.h"
#include "phase_rec.h"
#include "fault/msglog.h"
#include "report/report.h"
#include "recovery.h"
#include "harness.h"
#include "model/costmodel.h"

static int64_t h_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- the guard: runs in a process that may go down ---- */

/* Runs in progress that a shutdown or a crash ends. */
#define HG_MAX_RUNS 64
/* How long a crashing thread waits for its run to be stored, and the store
 * lock may take, before the process dies anyway. */
#define HG_CRASH_WAIT_MS  10000
#define HG_CRASH_LOCK_SEC 5

typedef struct hg_run {
    bool used;
    dsim_store *st; /* NULL: a run without a store */
    dsim_run_id id; /* 0 until the run row is begun */
} hg_run;

static pthread_once_t hg_once = PTHREAD_ONCE_INIT;
static pthread_rwlock_t hg_lock;
static bool hg_down; /* under hg_lock: no store call any more */
static hg_run hg_runs[HG_MAX_RUNS];
static pthread_mutex_t hg_runs_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int hg_active; /* runs in progress, for the signal handler */

static void hg_init(void)
{
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* a shutdown must not starve behind a stream of step rows */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&hg_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
}

/* A store call of a run, refused once the process is going down. */
#define HG_STORE(call)                                                                             \
    ({                                                                                             \
        pthread_rwlock_rdlock(&hg_lock);                                                           \
        dsim_err hg_e_ =                                                                           \
            hg_down ? DSIM_ERR(DSIM_ESTATE, -1, "the process is shutting down") : (call);          \
        pthread_rwlock_unlock(&hg_lock);                                                           \
        hg_e_;                                                                                     \
    })

/* Registers a run in progress; the slot, or -1 when the table is full (the
 * run then goes on unguarded: a crash or an interrupt leaves it 'running'
 * until the store is next opened, which marks it 'unfinished'). */
static int hg_run_add(dsim_store *st)
{
    int slot = -1;
    pthread_mutex_lock(&hg_runs_mu);
    for (int i = 0; i < HG_MAX_RUNS && slot < 0; i++) {
        if (!hg_runs[i].used) {
            hg_runs[i] = (hg_run){.used = true, .st = st};
            slot = i;
        }
    }
    pthread_mutex_unlock(&hg_runs_mu);
    atomic_fetch_add(&hg_active, 1);
    return slot;
}

static void hg_run_set_id(int slot, dsim_run_id id)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&hg_runs_mu);
    hg_runs[slot].id = id;
    pthread_mutex_unlock(&hg_runs_mu);
}

static void hg_run_remove(int slot)
{
    atomic_fetch_sub(&hg_active, 1);
    if (slot < 0)
        return;
    pthread_mutex_lock(&hg_runs_mu);
    hg_runs[slot] = (hg_run){0};
    pthread_mutex_unlock(&hg_runs_mu);
}

/* Closes each distinct store of the runs in progress, and extra. Called
 * with hg_lock held for writing; sets hg_down. */
static void hg_close_all(dsim_store *extra)
{
    hg_down = true;
    dsim_store *closed[HG_MAX_RUNS + 1];
    int n = 0;
    pthread_mutex_lock(&hg_runs_mu);
    for (int i = 0; i <= HG_MAX_RUNS; i++) {
        dsim_store *st = i < HG_MAX_RUNS ? (hg_runs[i].used ? hg_runs[i].st : NULL) : extra;
        if (!st)
            continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++)
            seen = closed[k] == st;
        if (seen)
            continue;
        closed[n++] = st;
        (void)dsim_store_close(st);
    }
    pthread_mutex_unlock(&hg_runs_mu);
}

void dsim_harness_shutdown(dsim_store *extra)
{
    pthread_once(&hg_once, hg_init);
    pthread_rwlock_wrlock(&hg_lock);
    if (!hg_down)
        hg_close_all(extra);
    /* The lock stays held: nothing may touch the closed stores. */
}

/* ---- crashes: signals and exit() inside a run ---- */

static const int hg_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define HG_NSIG (sizeof hg_signals / sizeof hg_signals[0])
static struct sigaction hg_old[HG_NSIG];
/* The process that installed the guard: a child forked by the processes
 * engine inherits the handlers but not the watcher, and is not the run's
 * process; it dies of its signal like any process, and its parent reports
 * it. */
static pid_t hg_pid;
static pthread_once_t hg_guard_once = PTHREAD_ONCE_INIT;
static int hg_crash_pipe[2] = {-1, -1}; /* crashing thread -> watcher */
static int hg_done_pipe[2] = {-1, -1};  /* watcher -> crashing thread */
static atomic_int hg_crashing;          /* the first crash wins; later ones wait to die */

/* What the crashing thread hands the watcher (a pipe write of this size is
 * atomic). */
typedef struct hg_crash {
    int sig;         /* 0: exit() */
    int exit_status; /* exit(): its status */
    bool in_worker;
    dsim_train_where where;
} hg_crash;

static const char *hg_signame(int sig)
{
    switch (sig) {
    case SIGSEGV:
        return "SIGSEGV";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    case SIGILL:
        return "SIGILL";
    case SIGABRT:
        return "SIGABRT";
    default:
        return "a signal";
    }
}

/* Async-signal-safe text building: no stdio in a signal handler. */
typedef struct hg_buf {
    char b[320];
    size_t n;
} hg_buf;

static void hg_put(hg_buf *b, const char *s)
{
    while (*s && b->n < sizeof b->b - 1)
        b->b[b->n++] = *s++;
    b->b[b->n] = '\0';
}

static void hg_put_u(hg_buf *b, uint64_t v)
{
    char d[24];
    int k = 0;
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && k < (int)sizeof d);
    while (k > 0 && b->n < sizeof b->b - 1)
        b->b[b->n++] = d[--k];
    b->b[b->n] = '\0';
}

static void hg_put_i(hg_buf *b, int v)
{
    if (v < 0) {
        hg_put(b, "-");
        hg_put_u(b, (uint64_t)(-(int64_t)v));
    } else {
        hg_put_u(b, (uint64_t)v);
    }
}

/* "replica 1" or "parameter server 0's handler for replica 2", then what
 * happened and where: the sentence shown and stored. */
static void hg_describe(hg_buf *b, const hg_crash *c)
{
    if (!c->in_worker) {
        hg_put(b, "a thread that is not a replica");
    } else if (c->where.server >= 0) {
        hg_put(b, "parameter server ");
        hg_put_i(b, c->where.server);
        hg_put(b, "'s handler for replica ");
        hg_put_i(b, c->where.replica);
    } else {
        hg_put(b, "replica ");
        hg_put_i(b, c->where.replica);
    }
    if (c->sig) {
        hg_put(b, " crashed with signal ");
        hg_put_i(b, c->sig);
        hg_put(b, " (");
        hg_put(b, hg_signame(c->sig));
        hg_put(b, ")");
    } else {
        hg_put(b, " called exit(");
        hg_put_i(b, c->exit_status);
        hg_put(b, ")");
    }
    if (c->in_worker) {
        hg_put(b, " in phase ");
        hg_put(b, dsim_phase_name(c->where.phase));
        hg_put(b, " at global step ");
        hg_put_u(b, c->where.global_step);
    } else {
        hg_put(b, " during a run");
    }
}

static void hg_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        c += k;
        n -= (size_t)k;
    }
}

/* From a normal thread: marks every run in progress crashed, with an event
 * saying what happened, closes their stores so that the rows commit, and
 * says so on stderr. */
static void hg_store_crash(const hg_crash *c)
{
    hg_buf what = {.n = 0};
    hg_describe(&what, c);
    pthread_once(&hg_once, hg_init);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += HG_CRASH_LOCK_SEC;
    if (pthread_rwlock_timedwrlock(&hg_lock, &until) != 0) {
        dprintf(STDERR_FILENO, "dsim: the results store is busy; the run stays 'running' and is "
                               "marked 'unfinished' when the store is next opened\n");
        return;
    }
    if (hg_down)
        return;
    json_t *ev = json_pack("{s:s, s:i, s:i, s:s, s:I, s:s}", "error", "crashed", "replica",
                           c->in_worker ? c->where.replica : -1, "server",
                           c->in_worker ? c->where.server : -1, "phase",
                           c->in_worker ? dsim_phase_name(c->where.phase) : "none", "global_step",
                           (json_int_t)c->where.global_step, "message", what.b);
    if (ev && c->sig) {
        json_object_set_new(ev, "signal", json_integer(c->sig));
        json_object_set_new(ev, "signal_name", json_string(hg_signame(c->sig)));
    } else if (ev) {
        json_object_set_new(ev, "exit_status", json_integer(c->exit_status));
    }
    char *detail = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(ev);
    pthread_mutex_lock(&hg_runs_mu);
    for (int i = 0; i < HG_MAX_RUNS; i++) {
        hg_run *r = &hg_runs[i];
        if (!r->used || !r->st || r->id <= 0)
            continue;
        int replica = c->in_worker && c->where.server < 0 ? c->where.replica : -1;
        (void)dsim_store_event(r->st, r->id, replica, h_now_ns(), DSIM_EVENT_ERROR,
                               detail ? detail : what.b);
        if (dsim_store_end_run(r->st, r->id, DSIM_RUN_CRASHED, NULL, 0) == DSIM_OK)
            dprintf(STDERR_FILENO, "dsim: run %" PRId64 " stored as crashed in %s\n",
                    (int64_t)r->id, dsim_store_path(r->st));
    }
    pthread_mutex_unlock(&hg_runs_mu);
    free(detail);
    hg_close_all(NULL);
    /* The lock stays held: the process is about to die. */
}

static void *hg_watcher(void *arg)
{
    (void)arg;
    for (;;) {
        hg_crash c;
        ssize_t k = read(hg_crash_pipe[0], &c, sizeof c);
        if (k < 0 && errno == EINTR)
            continue;
        if (k != (ssize_t)sizeof c)
            return NULL;
        hg_store_crash(&c);
        hg_write_all(hg_done_pipe[1], "x", 1);
    }
}

/* Dies of sig as the process would have without us. */
static void hg_die(int sig, const siginfo_t *si)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* A fault happens again when the handler returns; a signal that was
     * sent (kill, raise, abort) must be sent again. It stays pending while
     * the handler runs, and kills on return. */
    if (!si || si->si_code <= 0 || sig == SIGABRT)
        raise(sig);
}

static void hg_on_signal(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    size_t idx = 0;
    while (idx < HG_NSIG && hg_signals[idx] != sig)
        idx++;
    if (atomic_load(&hg_active) == 0 || idx == HG_NSIG || getpid() != hg_pid) {
        /* Not ours: whatever was there before. */
        struct sigaction *old = idx < HG_NSIG ? &hg_old[idx] : NULL;
        if (old && (old->sa_flags & SA_SIGINFO) && old->sa_sigaction)
            old->sa_sigaction(sig, si, uc);
        else if (old && old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN &&
                 !(old->sa_flags & SA_SIGINFO))
            old->sa_handler(sig);
        else
            hg_die(sig, si);
        errno = saved;
        return;
    }
    if (atomic_exchange(&hg_crashing, 1)) {
        /* Another thread is reporting its crash: wait for the end. */
        for (;;)
            pause();
    }
    hg_crash c = {.sig = sig};
    c.in_worker = dsim_train_where_am_i(&c.where);
    hg_buf msg = {.n = 0};
    hg_put(&msg, "\ndsim: ");
    hg_describe(&msg, &c);
    hg_put(&msg, "; storing the run as crashed\n");
    hg_write_all(STDERR_FILENO, msg.b, msg.n);
    hg_write_all(hg_crash_pipe[1], &c, sizeof c);
    struct pollfd p = {.fd = hg_done_pipe[0], .events = POLLIN};
    while (poll(&p, 1, HG_CRASH_WAIT_MS) < 0 && errno == EINTR)
        ;
    hg_die(sig, si);
    errno = saved;
}

/* A replica that calls exit(): stored as crashed, and the process ends with
 * status 1 (a run that did not pass) instead of the replica's. */
static void hg_on_exit(int status, void *arg)
{
    (void)arg;
    hg_crash c = {.exit_status = status};
    if (getpid() != hg_pid || atomic_load(&hg_active) == 0 || !dsim_train_where_am_i(&c.where) ||
        atomic_exchange(&hg_crashing, 1))
        return;
    c.in_worker = true;
    hg_buf msg = {.n = 0};
    hg_put(&msg, "\ndsim: ");
    hg_describe(&msg, &c);
    hg_put(&msg, "; storing the run as crashed\n");
    hg_write_all(STDERR_FILENO, msg.b, msg.n);
    hg_store_crash(&c);
    _exit(1);
}

static void hg_guard_install(void)
{
    hg_pid = getpid();
    if (pipe2(hg_crash_pipe, O_CLOEXEC) != 0)
        return;
    if (pipe2(hg_done_pipe, O_CLOEXEC) != 0)
        return;
    /* The watcher takes no signal: an interrupt goes to whoever waits for
     * it, a crash to the thread that crashed. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &at, hg_watcher, NULL);
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = hg_on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < HG_NSIG; i++)
        sigaction(hg_signals[i], &sa, &hg_old[i]);
    on_exit(hg_on_exit, NULL);
}

/* A CPU core's rate for the model's kernels: 10 GFLOP/s. */
#define H_DEVICE_FLOPS 1e10

/* ---- preparing a scenario ---- */

typedef struct h_opts {
    dsim_store *store;
    const char *db_path;
    const char *engine;
    bool has_seed;
    uint64_t seed;
    dsim_harness_progress_fn progress;
    void *progress_user;
    int64_t grace_ns, progress_timeout_ns;
    bool no_crash_guard;
    const struct dsim_proc_hosts *hosts;
} h_opts;

static dsim_err h_opts_get(const dsim_harness_opts *o, h_opts *out)
{
    memset(out, 0, sizeof *out);
    if (!o)
        return DSIM_OK;
    if (o->size != sizeof(dsim_harness_opts))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "harness: opts.size is %zu; set it to sizeof(dsim_harness_opts) (%zu)",
                        o->size, sizeof(dsim_harness_opts));
    out->store = o->store;
    out->db_path = o->db_path;
    out->engine = o->engine_override;
    out->has_seed = o->has_seed;
    out->seed = o->seed;
    out->progress = o->progress;
    out->progress_user = o->progress_user;
    out->grace_ns = o->grace_ns;
    out->progress_timeout_ns = o->progress_timeout_ns;
    out->no_crash_guard = o->no_crash_guard;
    out->hosts = o->hosts;
    return DSIM_OK;
}

static const char *h_engine(const dsim_scenario *s)
{
    if (s->train.engine)
        return s->train.engine;
    return s->engine ? s->engine : "threads";
}

/* The checks every run needs, on a scenario with the overrides applied. */
static dsim_err h_check(const dsim_scenario *s)
{
    const char *eng = h_engine(s);
    if (strcmp(eng, "threads") != 0 && strcmp(eng, "processes") != 0 && strcmp(eng, "sim") != 0)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "%s: engine %s is not supported by this build (accepted: threads, "
                        "processes, sim)",
                        s->path ? s->path : "(scenario)", eng);
    if (strcmp(eng, "sim") == 0) {
        if (s->train.transport && strcmp(s->train.transport, "inproc") != 0)
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "%s: transport %s needs real threads and sockets; engine sim runs "
                            "every worker on one thread with the inproc transport (use engine "
                            "threads or processes for %s)",
                            s->path ? s->path : "(scenario)", s->train.transport,
                            s->train.transport);
        DSIM_CHECK(dsim_sim_engine_register());
    }
    DSIM_CHECK(dsim_scenario_runnable(s));
    if (s->train.plugin_path &&
        dsim_strategy_load(s->train.strategy, s->train.plugin_path) != DSIM_OK) {
        dsim_error er;
        dsim_error_copy(&er);
        return DSIM_ERR(er.code, -1, "%s: strategy.plugin: %s", s->path ? s->path : "(scenario)",
                        er.msg);
    }
    return DSIM_OK;
}

dsim_err dsim_harness_prepare(dsim_scenario *s, const dsim_harness_opts *opts)
{
    if (!s)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_prepare: the scenario is NULL");
    h_opts o;
    DSIM_CHECK(h_opts_get(opts, &o));
    if (o.engine) {
        /* the scenario frees s->engine; train.engine points at it */
        char *eng = strdup(o.engine);
        if (!eng)
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
        free(s->engine);
        s->engine = eng;
        s->train.engine = eng;
    }
    if (o.has_seed) {
        s->seed = o.seed;
        s->train.seed = o.seed;
        s->train.data.seed = o.seed;
    }
    return h_check(s);
}

/* ---- what is stored with a run ---- */

/* The resolved configuration, as stored with the run. */
static json_t *h_config_json(const dsim_scenario *s)
{
    const dsim_train_cfg *c = &s->train;
    json_t *hidden = json_array();
    for (size_t i = 0; i < c->model.n_hidden && i < DSIM_MODEL_MAX_HIDDEN; i++)
        json_array_append_new(hidden, json_integer((json_int_t)c->model.hidden[i]));
    json_t *expect = json_array();
    for (size_t i = 0; i < s->n_expect; i++) {
        const dsim_expect *e = &s->expect[i];
        if (!e->check)
            continue;
        json_t *vals = json_object();
        for (int k = 0; k < e->check->n_params; k++) {
            double v = e->values[k];
            json_object_set_new(vals, e->check->params[k].key,
                                isnan(v) ? json_null() : json_real(v));
        }
        json_array_append_new(expect, json_pack("{s:s, s:o, s:b}", "check", e->check->name,
                                                "values", vals, "expect_fail", e->expect_fail));
    }
    return json_pack(
        "{s:s, s:s?, s:s?, s:I, s:{s:i, s:i, s:i}, "
        "s:{s:s?, s:s?, s:s, s:s, s:I}, "
        "s:{s:s, s:s, s:I, s:I, s:o}, "
        "s:{s:s, s:f, s:f, s:b, s:f, s:f, s:f}, "
        "s:{s:s, s:I, s:I, s:I, s:f, s:I, s:b, s:s, s:s, s:I, s:I, s:b, s:b}, "
        "s:{s:s?, s:I}, s:o, s:s?}",
        "name", s->name, "description", s->description, "engine", s->engine, "seed",
        (json_int_t)s->seed, "cluster", "hosts", c->hosts, "devices_per_host", c->devices_per_host,
        "ps", c->num_ps, "strategy", "name", c->strategy, "plugin", c->plugin_path, "communication",
        dsim_algo_name(c->communication), "ps_mode", dsim_ps_mode_name(c->ps_mode), "timeout_ns",
        (json_int_t)c->timeout_ns, "model", "kind", dsim_model_kind_name(c->model.kind), "loss",
        dsim_loss_name(c->model.loss), "in_dim", (json_int_t)c->model.in_dim, "out_dim",
        (json_int_t)c->model.out_dim, "hidden", hidden, "optimizer", "kind",
        dsim_optim_kind_name(c->optim.kind), "learning_rate", c->optim.lr, "momentum",
        c->optim.momentum, "nesterov", c->optim.nesterov != 0, "beta1", c->optim.beta1, "beta2",
        c->optim.beta2, "epsilon", c->optim.epsilon, "data", "task",
        dsim_data_kind_name(c->data.kind), "examples", (json_int_t)c->data.n_examples, "features",
        (json_int_t)c->data.in_dim, "outputs", (json_int_t)c->data.out_dim, "noise", c->data.noise,
        "files", (json_int_t)(c->in_memory ? 0 : c->data.n_files), "in_memory", c->in_memory,
        "shard_policy", dsim_shard_policy_name(c->shard), "shard_hint",
        dsim_shard_hint_name(c->hint), "global_batch", (json_int_t)c->global_batch, "epochs",
        (json_int_t)c->epochs, "shuffle", c->shuffle, "drop_remainder", c->drop_remainder,
        "checkpoint", "path", c->checkpoint_path, "every", (json_int_t)c->checkpoint_every,
        "expect", expect, "expect_error", s->expect_error);
}

/* Steps the run will take, from worker 0's input (every worker takes the
 * same number); 0 when the input cannot be made (the run will say why). */
static uint64_t h_total_steps(const dsim_train_cfg *cfg)
{
    dsim_dataset_desc d;
    memset(&d, 0, sizeof d);
    uint32_t nf = cfg->in_memory ? 0 : (uint32_t)cfg->data.n_files;
    if (dsim_dataset_desc_init(&d, cfg->data.n_examples, nf, DSIM_FILES_CONTIGUOUS) != DSIM_OK)
        return 0;
    d.hint = cfg->hint;
    dsim_input_config ic = {
        .dataset = &d,
        .policy = cfg->shard,
        .global_batch = cfg->global_batch,
        .num_workers = cfg->hosts,
        .replicas_per_worker = cfg->devices_per_host,
        .worker = 0,
        .seed = cfg->seed,
        .shuffle = cfg->shuffle,
        .drop_remainder = cfg->drop_remainder,
        .epochs = cfg->epochs,
    };
    dsim_input *in = NULL;
    uint64_t total = 0;
    if (dsim_input_create(&ic, &in) == DSIM_OK) {
        total = dsim_input_steps_per_epoch(in) * cfg->epochs;
        dsim_input_destroy(in);
    }
    dsim_dataset_desc_release(&d);
    dsim_clear_error();
    return total;
}

/* ---- one run ---- */

/* What the observer shares with the run (heap: the workers reach it). */
typedef struct h_run {
    dsim_store *store; /* NULL: no store */
    dsim_run_id id;
    dsim_harness_progress_fn progress;
    void *progress_user;
    uint64_t total;
    int64_t t0_ns;
    atomic_uint_fast64_t examples;
    atomic_uint_fast64_t steps_seen; /* highest global step reported, + 1 */
    atomic_int store_failed;
    char store_err[400]; /* written once, by whoever sets store_failed */
    /* forming the group: which replicas have taken their first step */
    int replicas, devices_per_host;
    atomic_uchar *formed;
    atomic_int n_formed;
    atomic_bool forming_stop;
} h_run;

static void h_observer(const dsim_train_step_info *info, void *user)
{
    h_run *r = user;
    if (r->formed && info->replica >= 0 && info->replica < r->replicas &&
        !atomic_exchange(&r->formed[info->replica], 1))
        atomic_fetch_add(&r->n_formed, 1);
    if (info->rerun) {
        /* A lost replica's step run again: the steps table keeps each
         * replica's own steps; the re-runs show in coverage and in node_loss. */
        atomic_fetch_add(&r->examples, info->examples);
        return;
    }
    if (r->store && !atomic_load(&r->store_failed)) {
        dsim_step_rec rec = {
            .replica = info->replica,
            .epoch = (int)info->epoch,
            .step = (int64_t)info->global_step,
            .loss = info->local_loss,
            .reduced_loss = info->loss,
            .checksum = info->checksum,
            .examples = (int64_t)info->examples,
            .t_start_ns = info->t_start,
            .t_end_ns = info->t_end,
        };
        dsim_err e = HG_STORE(dsim_store_step(r->store, r->id, &rec));
        if (e != DSIM_OK && atomic_exchange(&r->store_failed, 1) == 0)
            snprintf(r->store_err, sizeof r->store_err, "%s", dsim_errmsg());
    }
    uint64_t ex = atomic_fetch_add(&r->examples, info->examples) + info->examples;
    uint64_t seen = atomic_load(&r->steps_seen);
    while (info->global_step + 1 > seen &&
           !atomic_compare_exchange_weak(&r->steps_seen, &seen, info->global_step + 1))
        ;
    if (info->replica != 0 || !r->progress)
        return;
    dsim_harness_progress p = {
        .step = info->global_step + 1,
        .total = r->total,
        .loss = info->loss,
        .examples = ex,
        .elapsed_s = (double)(h_now_ns() - r->t0_ns) / 1e9,
    };
    r->progress(&p, r->progress_user);
}

/* While the job forms: about once a second (on wall time), until every
 * replica has taken a step, say who is there and who is awaited -- never
 * silence while a late worker is waited for. */
static void *h_forming_main(void *arg)
{
    h_run *r = arg;
    for (int tick = 1; !atomic_load(&r->forming_stop); tick++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        int n = atomic_load(&r->n_formed);
        if (n >= r->replicas)
            break;
        if (tick % 10 != 0)
            continue;
        dsim_harness_progress p = {.total = r->total,
                                   .loss = NAN,
                                   .elapsed_s = (double)(h_now_ns() - r->t0_ns) / 1e9,
                                   .forming = true,
                                   .formed = n,
                                   .replicas = r->replicas};
        size_t o = 0;
        int listed = 0, left = 0;
        for (int i = 0; i < r->replicas; i++) {
            if (atomic_load(&r->formed[i]))
                continue;
            if (listed < 4 && o < sizeof p.awaiting) {
                o += (size_t)snprintf(p.awaiting + o, sizeof p.awaiting - o,
                                      "%sreplica %d (worker %d)", listed ? ", " : "", i,
                                      i / r->devices_per_host);
                listed++;
            } else {
                left++;
            }
        }
        if (left && o < sizeof p.awaiting)
            snprintf(p.awaiting + o, sizeof p.awaiting - o, " and %d more", left);
        if (!atomic_load(&r->forming_stop))
            r->progress(&p, r->progress_user);
    }
    return NULL;
}

static void h_fail(dsim_harness_result *out, const char *what)
{
    if (out->harness_error)
        return;
    out->harness_error = true;
    snprintf(out->harness_msg, sizeof out->harness_msg, "%s: %s", what, dsim_errmsg());
}

/* The run proper: the store (if any) is open and guarded. */
static bool h_expects(const dsim_scenario *s, const char *check)
{
    for (size_t i = 0; i < s->n_expect; i++)
        if (s->expect[i].check && strcmp(s->expect[i].check->name, check) == 0)
            return true;
    return false;
}

/* What the settings guarantee after a node is lost (dsim/health.h); the
 * health check runs only in jobs of two or more workers without parameter
 * servers. 0 when nothing bounds it. */
static int64_t h_detection_bound(const dsim_scenario *s, const dsim_train_result *broken, int lost)
{
    const dsim_train_cfg *t = &s->train;
    /* The health check starts once the job is up (TF starts it once the
     * cluster has formed): a node lost before then is found by the
     * collective timeout alone. */
    bool up = !broken || !broken->replicas || lost < 0 || lost >= broken->num_replicas ||
              broken->replicas[lost].phase > DSIM_PHASE_CREATE_VARIABLES;
    int64_t b = up && t->hosts >= 2 && t->num_ps == 0
                    ? dsim_detection_bound(t->timeout_ns, t->health_interval_ns,
                                           t->health_timeout_ns, t->health_retries)
                    : dsim_detection_bound_timeout(t->timeout_ns);
    return b == DSIM_NO_DEADLINE ? 0 : b;
}

/* Whether to keep every step's variables of the run and of the reference:
 * gradient_consistency explains a difference from them (how the updates
 * compare), when they fit in H_TRACE_MAX floats each. */
#define H_TRACE_MAX ((uint64_t)4 << 20)
static bool h_wants_trace(const dsim_scenario *s, const dsim_train_cfg *cfg)
{
    if (!h_expects(s, "gradient_consistency"))
        return false;
    dsim_model_spec m = cfg->model;
    if (m.in_dim == 0) {
        m.in_dim = cfg->data.in_dim;
        m.out_dim = cfg->data.out_dim;
    }
    uint64_t steps = h_total_steps(cfg), n = dsim_model_num_params(&m);
    return steps && n && steps <= H_TRACE_MAX / n;
}

/* Stores every replica's flight recorder, one flight_records row per call
 * it kept. */
static dsim_err h_store_flight(dsim_store *st, dsim_run_id run, const dsim_train_result *res)
{
    for (int r = 0; res->flight && r < res->n_flight; r++) {
        const dsim_fr_dump *d = &res->flight[r];
        for (size_t i = 0; i < d->n; i++) {
            const dsim_fr_entry *e = &d->entries[i];
            const dsim_coll_fp *fp = &e->fp;
            bool has_root = fp->coll == DSIM_COLL_BROADCAST || fp->coll == DSIM_COLL_REDUCE;
            bool has_op = fp->coll == DSIM_COLL_ALLREDUCE || fp->coll == DSIM_COLL_REDUCE ||
                          fp->coll == DSIM_COLL_REDUCE_SCATTER;
            dsim_flight_rec fr = {
                .replica = d->rank,
                .record_id = d->calls - d->n + i,
                .pg_id = d->comm_id,
                .collective_seq_id = fp->seq,
                .profiling_name = dsim_flight_profiling_name(fp->coll),
                .input_count = fp->coll == DSIM_COLL_BARRIER ? -1 : (int64_t)fp->count,
                .input_dtype =
                    fp->coll == DSIM_COLL_BARRIER ? NULL : dsim_flight_dtype_name(fp->dtype),
                .reduce_op =
                    has_op && fp->op < DSIM_OP_COUNT ? dsim_op_name((dsim_op)fp->op) : NULL,
                .root = has_root ? fp->root : -1,
                .algorithm = dsim_algo_name((dsim_algo)fp->algo),
                .state = dsim_fr_state_name((dsim_fr_state)e->state),
                .waiting_for = e->waiting_for,
                .error = e->error ? dsim_strerror((dsim_err)e->error) : NULL,
                .time_created_ns = e->t_created,
                .time_started_ns = e->t_started,
                .time_completed_ns = e->t_completed,
            };
            DSIM_CHECK(HG_STORE(dsim_store_flight(st, run, &fr)));
        }
    }
    return DSIM_OK;
}

/* Stores where each worker left running was, one error event each. */
static void h_store_stuck(dsim_store *st, const dsim_harness_result *out, int64_t t)
{
    for (size_t i = 0; i < out->n_stuck; i++) {
        const dsim_train_stuck *k = &out->stuck[i];
        char where[256];
        dsim_train_stuck_describe(k, where, sizeof where);
        json_t *ev = json_pack("{s:s, s:i, s:i, s:s, s:I, s:s?, s:I, s:s?, s:s}", "error", "hung",
                               "replica", k->where.replica, "server", k->where.server, "phase",
                               dsim_phase_name(k->where.phase), "global_step",
                               (json_int_t)k->where.global_step, "collective", k->collective,
                               "collective_calls", (json_int_t)k->collective_calls, "callback",
                               k->callback, "message", where);
        char *detail = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(ev);
        (void)HG_STORE(dsim_store_event(st, out->run_id,
                                        k->where.server < 0 ? k->where.replica : -1, t,
                                        DSIM_EVENT_ERROR, detail ? detail : where));
        free(detail);
    }
}

/* The liveness phase (TigerBeetle's VOPR shape): every fault healed, every
 * worker restarted -- from the checkpoint the safety phase left, if any --
 * and the job must reach liveness.reach_step within liveness.within on the
 * engine's clock. Judged as one more outcome, "liveness", so that a job
 * that never recovers is told apart from a crash or a wrong result. */
static uint64_t h_liveness(const dsim_scenario *s, const dsim_train_cfg *run_cfg,
                           dsim_harness_result *out)
{
    dsim_train_cfg c = *run_cfg;
    c.observer = NULL;
    c.observer_user = NULL;
    c.hooks = NULL;
    c.hooks_user = NULL;
    c.transport_filter = NULL;
    c.transport_filter_user = NULL;
    c.preempt_after = 0;
    c.preempt_notice = NULL;
    /* one process, its ranks as workers of the scenario's engine */
    if (c.engine && strcmp(c.engine, "processes") == 0)
        c.engine = NULL;
    c.restore = c.checkpoint_path && access(c.checkpoint_path, F_OK) == 0;
    c.stop_after = s->liveness_step;
    dsim_train_result r;
    dsim_err e = dsim_train(&c, &r);
    int64_t took = 0;
    for (int i = 0; r.replicas && i < r.num_replicas; i++)
        if (r.replicas[i].t_end - r.t_start > took)
            took = r.replicas[i].t_end - r.t_start;
    uint64_t reached = e == DSIM_OK ? r.first_step + r.steps : 0;
    double within = (double)s->liveness_within_ns / 1e9, t = (double)took / 1e9;
    dsim_check_outcome *oc = realloc(out->checks, (out->n_checks + 1) * sizeof *oc);
    if (!oc) {
        dsim_train_result_free(&r);
        h_fail(out, "judging liveness");
        return 0;
    }
    out->checks = oc;
    oc = &out->checks[out->n_checks++];
    memset(oc, 0, sizeof *oc);
    oc->name = "liveness";
    oc->result.measured = e == DSIM_OK ? t : NAN;
    oc->result.expected = within;
    char from[96];
    if (c.restore)
        snprintf(from, sizeof from, "from the checkpoint at step %llu",
                 (unsigned long long)r.first_step);
    else
        snprintf(from, sizeof from, "from the start (no checkpoint)");
    if (e == DSIM_OK && reached < s->liveness_step)
        snprintf(oc->result.message, sizeof oc->result.message,
                 "LIVENESS: liveness.reach_step %llu is beyond the job's last step %llu: it can "
                 "never be reached; lower it",
                 (unsigned long long)s->liveness_step, (unsigned long long)reached);
    else if (e != DSIM_OK)
        snprintf(oc->result.message, sizeof oc->result.message,
                 "LIVENESS FAILURE: with every fault healed and every worker restarted %s, the "
                 "job did not reach step %llu: %.300s",
                 from, (unsigned long long)s->liveness_step, r.error.msg);
    else if (t > within)
        snprintf(oc->result.message, sizeof oc->result.message,
                 "LIVENESS FAILURE: with every fault healed and every worker restarted %s, the "
                 "job reached step %llu only after %.6g s, over the %.6g s allowed",
                 from, (unsigned long long)s->liveness_step, t, within);
    else {
        oc->check_passed = true;
        snprintf(oc->result.message, sizeof oc->result.message,
                 "with every fault healed and every worker restarted %s, the job reached step "
                 "%llu in %.6g s (within %.6g s)",
                 from, (unsigned long long)s->liveness_step, t, within);
    }
    oc->passed = oc->check_passed;
    oc->result.passed = oc->check_passed;
    if (!oc->passed)
        out->n_failed++;
    uint64_t h = r.trace_hash;
    dsim_train_result_free(&r);
    return h;
}

/* Cold start: one phase event per replica that started, at the time it
 * entered rendezvous, with the times (s from the job's start) it first
 * entered each start-up phase and finished its first step. */
static void h_store_phases(dsim_store *st, dsim_harness_result *out, const dsim_train_result *r)
{
    static const dsim_phase ph[] = {DSIM_PHASE_START, DSIM_PHASE_RENDEZVOUS, DSIM_PHASE_RESTORE,
                                    DSIM_PHASE_CREATE_VARIABLES, DSIM_PHASE_COMPUTE};
    for (int i = 0; r->replicas && i < r->num_replicas; i++) {
        const dsim_train_replica_end *e = &r->replicas[i];
        if (!e->t_first[DSIM_PHASE_START])
            continue;
        json_t *j = json_object();
        for (size_t k = 0; j && k < sizeof ph / sizeof ph[0]; k++)
            if (e->t_first[ph[k]])
                json_object_set_new(j, dsim_phase_name(ph[k]),
                                    json_real((double)(e->t_first[ph[k]] - r->t_start) / 1e9));
        if (j && e->t_first_step)
            json_object_set_new(j, "first_step_done",
                                json_real((double)(e->t_first_step - r->t_start) / 1e9));
        json_t *ev = j ? json_pack("{s:s, s:o}", "cold_start", "phases", "t_s", j) : NULL;
        if (ev && e->conn_count > 0)
            /* connection set-up per peer, by the end of its first step */
            json_object_set_new(ev, "connect",
                                json_pack("{s:i, s:f, s:f, s:i, s:b}", "connections", e->conn_count,
                                          "slowest_s", (double)e->conn_max_ns / 1e9, "total_s",
                                          (double)e->conn_total_ns / 1e9, "slowest_peer",
                                          e->conn_slowest_peer, "modelled", e->conn_modelled));
        char *detail = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(ev);
        dsim_err e2 = HG_STORE(dsim_store_event(st, out->run_id, i, e->t_first[DSIM_PHASE_START],
                                                DSIM_EVENT_PHASE, detail ? detail : "cold start"));
        free(detail);
        if (e2 != DSIM_OK) {
            h_fail(out, "recording the start-up phases");
            return;
        }
    }
}

_Static_assert(DSIM_TRACE_MSG_MAX_RANKS == DSIM_MSG_LOG_MAX_RANKS &&
                   DSIM_TRACE_MSG_PER_LINK == DSIM_MSG_LOG_PER_LINK,
               "dsim trace states the message log's rule: keep report.h and msglog.h alike");

/* The frames the log joined, and how many it left out (metric
 * messages_not_logged, when there were any). */
/* Message logs that a worker left running may still write to: kept for the
 * life of the process, and known to be (a leak checker sees them here). */
static dsim_msg_log *h_kept_logs[64];
static atomic_int h_n_kept_logs;

static void h_keep_log(dsim_msg_log *log)
{
    int i = atomic_fetch_add(&h_n_kept_logs, 1);
    if (i < (int)(sizeof h_kept_logs / sizeof h_kept_logs[0]))
        h_kept_logs[i] = log;
}

static dsim_err h_store_messages(dsim_msg_log *log, dsim_store *st, dsim_run_id run)
{
    dsim_msg_rec *m = NULL;
    size_t n = 0;
    uint64_t dropped = 0;
    DSIM_CHECK(dsim_msg_log_join(log, &m, &n, &dropped));
    dsim_err e = DSIM_OK;
    for (size_t i = 0; i < n && e == DSIM_OK; i++) {
        dsim_msg_row row = {.attempt = m[i].attempt,
                            .src = m[i].src,
                            .dst = m[i].dst,
                            .comm_id = m[i].comm_id,
                            .tag = m[i].tag,
                            .seq = m[i].seq,
                            .bytes = m[i].bytes,
                            .t_sent_ns = m[i].t_sent_ns,
                            .t_recv_ns = m[i].t_recv_ns};
        e = dsim_store_message(st, run, &row);
    }
    free(m);
    if (e == DSIM_OK && dropped)
        e = dsim_store_metric(st, run, "messages_not_logged", (double)dropped, "frames", -1);
    return e;
}

/* The bytes of gradients a replica all-reduces each step. */
static size_t h_grad_bytes(const dsim_train_cfg *cfg, const dsim_train_result *res)
{
    if (cfg->synthetic_params > 0)
        return (size_t)llround(cfg->synthetic_params) * sizeof(float);
    return res->n_params * sizeof(float);
}

/* A timing-only run's one-device baseline: the compute model's time for
 * the whole global batch of each step on one device, no exchange (the
 * figure `dsim whatif` divides by for its speed-up). */
static dsim_err h_synthetic_reference(const dsim_train_cfg *cfg, const dsim_train_result *run,
                                      dsim_train_result *ref)
{
    memset(ref, 0, sizeof *ref);
    size_t S = (size_t)run->steps, N = (size_t)run->num_replicas;
    if (S == 0 || !run->examples || !(cfg->device_flops > 0))
        return DSIM_ERR(DSIM_EINVAL, -1, "no steps or no compute rate for the baseline");
    ref->step_ns = calloc(S, sizeof *ref->step_ns);
    ref->comm_ns = calloc(S, sizeof *ref->comm_ns);
    ref->examples = calloc(S, sizeof *ref->examples);
    if (!ref->step_ns || !ref->comm_ns || !ref->examples) {
        dsim_train_result_free(ref);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for the one-device baseline");
    }
    snprintf(ref->strategy, sizeof ref->strategy, "one_device");
    ref->num_workers = ref->devices_per_host = ref->num_replicas = ref->num_replicas_in_sync = 1;
    ref->steps = S;
    ref->initial_loss = ref->final_loss = NAN;
    for (size_t k = 0; k < S; k++) {
        uint64_t ex = 0;
        for (size_t i = 0; i < N; i++)
            ex += run->examples[k * N + i];
        ref->examples[k] = ex;
        ref->step_ns[k] =
            (int64_t)llround(3.0 * cfg->synthetic_flops * (double)ex / cfg->device_flops * 1e9);
    }
    return DSIM_OK;
}

/* out->whatif: what the modelled cluster would take, and the sources. */
static void h_whatif_summary(const dsim_scenario *s, const dsim_train_cfg *cfg,
                             const dsim_perf *perf, dsim_algo algo, dsim_harness_result *out)
{
    char *w = out->whatif;
    size_t cap = sizeof out->whatif, n = 0;
    double speed = perf->reference_step_s > 0 && perf->step_s > 0
                       ? perf->reference_step_s / perf->step_s
                       : NAN;
    const char *dev = s->device_preset ? s->device_preset : "device";
    n += (size_t)snprintf(w + n, cap - n,
                          "what-if: step %.2f ms (compute %.2f ms), all-reduce %.0f %% of the "
                          "step; speed-up %.2fx over one %s (scaling efficiency %.2f); "
                          "all-reduce algorithm %s%s\n",
                          perf->step_s * 1e3, perf->compute_s * 1e3, 100 * perf->allreduce_share,
                          speed, dev, perf->scaling_efficiency, dsim_algo_name(algo),
                          cfg->communication == DSIM_ALGO_AUTO ? " (dsim's decision function)"
                                                               : " (the scenario's)");
    if (n >= cap)
        return;
    n += (size_t)snprintf(w + n, cap - n,
                          "figures: alpha-beta links and the compute model of "
                          "sim/model/costmodel.c (dsim whatif --presets)");
    const dsim_link_model *l = s->network_given ? dsim_link_preset(s->network_preset) : NULL;
    if (l && n < cap)
        n += (size_t)snprintf(w + n, cap - n, "; %s: %s", l->name, l->source);
    const dsim_link_model *il = s->intra_preset ? dsim_link_preset(s->intra_preset) : NULL;
    if (il && n < cap)
        n += (size_t)snprintf(w + n, cap - n, "; %s: %s", il->name, il->source);
    const dsim_device_model *d = s->device_preset ? dsim_device_preset(s->device_preset) : NULL;
    if (d && n < cap)
        n += (size_t)snprintf(w + n, cap - n, "; %s: %s", d->name, d->source);
    if (n < cap && cfg->synthetic_params > 0)
        snprintf(w + n, cap - n,
                 "; timing only: %.4g parameters, %.3g FLOPs per example forward, "
                 "forward + backward = 3x",
                 cfg->synthetic_params, cfg->synthetic_flops);
}

static void h_run_one(const dsim_scenario *s, const h_opts *o, dsim_store *st, int slot,
                      dsim_harness_result *out)
{
    dsim_train_cfg cfg = s->train;
    if (o->grace_ns)
        cfg.watchdog_grace_ns = o->grace_ns;
    if (o->progress_timeout_ns)
        cfg.progress_timeout_ns = o->progress_timeout_ns;
    cfg.record_params = cfg.record_params || h_wants_trace(s, &cfg);
    /* The cost model: a replica's step computes at this rate. It moves the
     * virtual clock under sim (elsewhere it is only counted), so that steps
     * take time and a timeout counts from work done, not from time 0. */
    if (cfg.device_flops == 0)
        cfg.device_flops = H_DEVICE_FLOPS;

    h_run *run = calloc(1, sizeof *run);
    if (!run) {
        dsim_set_error(DSIM_ENOMEM, -1, __FILE__, __LINE__, "out of memory");
        h_fail(out, "starting the run");
        out->status = DSIM_RUN_ERROR;
        return;
    }
    if (st) {
        char *config = NULL;
        json_t *cj = h_config_json(s);
        if (cj) {
            config = json_dumps(cj, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(cj);
        }
        dsim_run_info info = {
            .scenario = s->name,
            .scenario_text = s->text,
            .seed = s->seed,
            .engine = h_engine(s),
            .strategy = cfg.strategy,
            .config_json = config,
        };
        dsim_err e = HG_STORE(dsim_store_begin_run(st, &info, &out->run_id));
        free(config);
        if (e != DSIM_OK) {
            h_fail(out, "beginning the run in the results store");
            out->status = DSIM_RUN_ERROR;
            free(run);
            return;
        }
        hg_run_set_id(slot, out->run_id);
    }
    int R = cfg.hosts * cfg.devices_per_host;
    for (int r = 0; st && r < R && !out->harness_error; r++) {
        int w = r / cfg.devices_per_host, d = r % cfg.devices_per_host;
        char dev[96], host[64];
        snprintf(dev, sizeof dev, "/job:worker/replica:0/task:%d/device:CPU:%d", w, d);
        snprintf(host, sizeof host, "worker-%d", w);
        if (HG_STORE(dsim_store_replica(st, out->run_id, r, w, dev, host)) != DSIM_OK)
            h_fail(out, "recording the replicas");
    }

    run->store = st;
    run->id = out->run_id;
    run->progress = o->progress;
    run->progress_user = o->progress_user;
    run->total = o->progress ? h_total_steps(&cfg) : 0;
    run->t0_ns = h_now_ns();
    run->replicas = R;
    run->devices_per_host = cfg.devices_per_host;
    /* Not where the engine forks (processes, dsim worker): a thread of
     * ours must not be running when a child is forked from this process. */
    bool processes = (cfg.engine && strcmp(cfg.engine, "processes") == 0) || o->hosts;
    if (o->progress && R > 1 && !processes) {
        run->formed = calloc((size_t)R, sizeof *run->formed);
        for (int i = 0; run->formed && i < R; i++)
            atomic_init(&run->formed[i], 0);
    }
    atomic_init(&run->n_formed, 0);
    atomic_init(&run->forming_stop, false);
    pthread_t forming;
    bool forming_on = run->formed && pthread_create(&forming, NULL, h_forming_main, run) == 0;
    cfg.observer = h_observer;
    cfg.observer_user = run;
    /* The phases' times for reports, where the steps' clock is
     * CLOCK_MONOTONIC (phase_rec.h): the hooks run in this process
     * (threads), or each child times them and sends them here (processes). */
    bool threads = !cfg.engine || strcmp(cfg.engine, "threads") == 0;
    bool forked_here = processes && !o->hosts; /* every child's records come here */
    h_phase_rec *phases = st && (threads || forked_here) && !cfg.hooks
                              ? h_phase_rec_create(R, run->total ? run->total : h_total_steps(&cfg))
                              : NULL;
    if (phases && threads)
        h_phase_rec_attach(phases, &cfg);
    /* The frames between ranks, for the trace's arrows: small jobs only
     * (msglog.h says which frames of them). */
    dsim_msg_log *msgs = NULL;
    if (st && R + cfg.num_ps <= DSIM_MSG_LOG_MAX_RANKS && (!processes || forked_here) &&
        !cfg.transport_filter && dsim_msg_log_create(&msgs) != DSIM_OK)
        msgs = NULL;

    dsim_train_result res, ref;
    memset(&res, 0, sizeof res);
    memset(&ref, 0, sizeof ref);
    bool have_ref = false;
    /* Faults or recovery: the job runs under sim/fault, restarts included. */
    bool faulty = processes || s->n_faults > 0 || s->network_given ||
                  (s->recovery && strcmp(s->recovery, "restart") == 0);
    /* the network model: the scenario's links, held to their alpha-beta
     * times in the fault layer (threads and sim; processes runs real tcp) */
    dsim_net_links net = {
        .inter_latency_ns = s->link_latency_ns,
        .inter_Bps = s->link_bandwidth_Bps,
        .intra_latency_ns = s->intra_latency_ns,
        .intra_Bps = s->intra_Bps,
    };
    dsim_recovery_run rr;
    memset(&rr, 0, sizeof rr);
    dsim_check_faults cf;
    memset(&cf, 0, sizeof cf);
    int64_t t_start = h_now_ns();
    if (faulty) {
        bool restart = s->recovery && strcmp(s->recovery, "restart") == 0;
        dsim_recovery_opts ro = {
            .faults = s->faults,
            .n_faults = s->n_faults,
            .seed = cfg.seed,
            .restart = restart,
            .max_restarts = s->max_restarts,
            .want_clean = restart && h_expects(s, "node_loss"),
            .processes = processes,
            .hosts = o->hosts,
            .net = s->network_given && !processes ? &net : NULL,
            .msgs = msgs,
            .on_phase = phases && !threads ? h_phase_rec_note : NULL,
            .on_phase_user = phases && !threads ? phases : NULL,
        };
        dsim_err fe = dsim_recovery_run_job(&cfg, &ro, &rr);
        if (fe != DSIM_OK) {
            out->train_err = fe;
            dsim_error_copy(&res.error);
        } else {
            out->train_err = rr.err;
            res = rr.final; /* moved: rr no longer owns it */
            memset(&rr.final, 0, sizeof rr.final);
            const dsim_train_result *b = rr.has_broken       ? &rr.broken
                                         : rr.err != DSIM_OK ? &res
                                                             : NULL;
            cf = (dsim_check_faults){
                .broken = b,
                .broken_err = rr.has_broken ? rr.broken_err : rr.err,
                .lost_rank = rr.lost_rank,
                .t_loss = rr.t_loss,
                .bound_ns = h_detection_bound(s, b, rr.lost_rank),
                .restarts = rr.restarts,
                .recovery = restart,
                .clean = rr.has_clean && rr.clean_err == DSIM_OK ? &rr.clean : NULL,
                .checkpoint_path = cfg.checkpoint_path,
                .ckpt_state = rr.ckpt_state,
                .ckpt_step = rr.ckpt_step,
                .ckpt_msg = rr.ckpt_msg,
            };
        }
    } else {
        if (msgs)
            dsim_msg_log_attach(msgs, &cfg);
        out->train_err = dsim_train(&cfg, &res);
    }
    if (forming_on) {
        atomic_store(&run->forming_stop, true);
        pthread_join(forming, NULL);
    }
    int64_t t_end = h_now_ns();
    out->restarts = rr.restarts;
    if (faulty && s->n_faults) {
        const dsim_faults_stats *fst = &rr.stats;
        snprintf(out->fault_summary, sizeof out->fault_summary,
                 "faults: %llu fired; of %llu messages %llu lost, %llu retransmitted, %llu held "
                 "back (delayed, paused, partitioned, or queued behind one), %llu duplicated, "
                 "%llu corrupted, %llu reordered",
                 (unsigned long long)fst->fired, (unsigned long long)fst->frames_seen,
                 (unsigned long long)fst->dropped, (unsigned long long)fst->retransmitted,
                 (unsigned long long)fst->held, (unsigned long long)fst->duplicated,
                 (unsigned long long)fst->corrupted, (unsigned long long)fst->reordered);
    }
    for (size_t i = 0; st && i < rr.n_events; i++) {
        const dsim_fault_event *ev = &rr.events[i];
        if (HG_STORE(dsim_store_event(st, out->run_id, ev->rank, ev->t_abs, DSIM_EVENT_FAULT,
                                      ev->text)) != DSIM_OK) {
            h_fail(out, "recording the fault events");
            break;
        }
    }
    /* A worker left stuck inside the phase hooks (a fault's pause) may still
     * call the recorder: then it is neither read nor freed. */
    bool in_hook = false;
    for (size_t i = 0; phases && i < res.n_stuck; i++)
        in_hook |= res.stuck[i].callback && strcmp(res.stuck[i].callback, "the phase hook") == 0;
    if (phases && in_hook) {
        phases = NULL;
        cfg.hooks = NULL;
        cfg.hooks_user = NULL;
    }
    if (phases) {
        dsim_algo pa = cfg.communication;
        if (pa == DSIM_ALGO_AUTO && res.n_params)
            pa = dsim_allreduce_decide(res.n_params * sizeof(float), R);
        if (HG_STORE(h_phase_rec_store(
                phases, st, out->run_id,
                R > 1 && cfg.num_ps == 0 && pa != DSIM_ALGO_AUTO ? dsim_algo_name(pa) : NULL,
                (uint64_t)res.n_params * sizeof(float))) != DSIM_OK)
            h_fail(out, "recording the phases");
        h_phase_rec_destroy(phases);
        phases = NULL;
        cfg.hooks = NULL;
        cfg.hooks_user = NULL;
    }
    if (msgs) {
        if (HG_STORE(h_store_messages(msgs, st, out->run_id)) != DSIM_OK)
            h_fail(out, "recording the messages");
        /* a worker the watchdog left running may still send: the filter
         * keeps the log (dsim_train: transport_filter_user outlives it) */
        if (!res.n_stuck && !(rr.has_broken && rr.broken.n_stuck))
            dsim_msg_log_destroy(msgs);
        else
            h_keep_log(msgs);
        msgs = NULL;
        if (!faulty)
            cfg.transport_filter = NULL;
    }
    if (faulty && rr.restarts && st &&
        HG_STORE(dsim_store_event(st, out->run_id, -1, t_end, DSIM_EVENT_RESTART,
                                  rr.err == DSIM_OK ? "recovered after restarting every worker"
                                                    : "recovery gave up")) != DSIM_OK)
        h_fail(out, "recording the restarts");
    if (faulty && (rr.err != DSIM_OK || rr.restarts || rr.lost_rank >= 0)) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *mf = open_memstream(&buf, &blen);
        if (mf) {
            dsim_recovery_print_timeline(&rr, mf);
            fclose(mf);
            out->timeline = buf;
        }
    }
    if (out->train_err != DSIM_OK && res.error.code == DSIM_OK) {
        /* failed before the driver filled the result: keep the thread's message */
        dsim_error_copy(&res.error);
    }
    out->wall_s = (double)(t_end - t_start) / 1e9;
    out->examples = atomic_load(&run->examples);
    out->examples_per_s = out->wall_s > 0 ? (double)out->examples / out->wall_s : 0;
    /* A failed run's result still holds the steps it was to take: count
     * the steps that were reported instead. */
    out->steps = out->train_err == DSIM_OK ? res.steps : atomic_load(&run->steps_seen);
    out->final_loss = out->train_err == DSIM_OK ? res.final_loss : NAN;
    if (o->progress) {
        dsim_harness_progress p = {
            .step = out->steps,
            .total = run->total,
            .loss = NAN,
            .examples = out->examples,
            .elapsed_s = (double)(t_end - run->t0_ns) / 1e9,
            .finished = true,
        };
        o->progress(&p, o->progress_user);
    }
    if (atomic_load(&run->store_failed) && !out->harness_error) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "storing step rows: %s",
                 run->store_err);
    }

    bool hung = out->train_err == DSIM_EHUNG;
    bool in_observer = false;
    if (hung && res.n_stuck) {
        out->stuck = malloc(res.n_stuck * sizeof *out->stuck);
        if (out->stuck) {
            memcpy(out->stuck, res.stuck, res.n_stuck * sizeof *out->stuck);
            out->n_stuck = res.n_stuck;
        }
        for (size_t i = 0; i < res.n_stuck; i++)
            in_observer |=
                res.stuck[i].callback && strcmp(res.stuck[i].callback, "the observer") == 0;
    }
    if (out->train_err != DSIM_OK) {
        snprintf(out->train_msg, sizeof out->train_msg, "%s", res.error.msg);
        if (st) {
            char *detail = NULL;
            json_t *ej = json_pack("{s:s, s:s, s:i}", "error", dsim_strerror(out->train_err),
                                   "message", res.error.msg, "peer", res.error.peer);
            if (ej) {
                detail = json_dumps(ej, JSON_COMPACT | JSON_PRESERVE_ORDER);
                json_decref(ej);
            }
            /* events share the steps' clock: the threads engine's is CLOCK_MONOTONIC */
            if (HG_STORE(dsim_store_event(st, out->run_id, -1, t_end, DSIM_EVENT_ERROR,
                                          detail ? detail : res.error.msg)) != DSIM_OK)
                h_fail(out, "recording the run's error");
            free(detail);
            if (hung)
                h_store_stuck(st, out, t_end);
        }
    } else if (cfg.synthetic_params > 0) {
        /* timing only: no replay to make, the baseline is the compute model's */
        have_ref = h_synthetic_reference(&cfg, &res, &ref) == DSIM_OK;
    } else if (dsim_check_needs_reference(s)) {
        dsim_train_cfg rc = cfg;
        rc.observer = NULL;
        rc.observer_user = NULL;
        rc.record_params = cfg.record_params;
        if (dsim_train_reference(&rc, &ref) == DSIM_OK) {
            have_ref = true;
            /* its loss per step, for the report's loss plot */
            for (uint64_t k = 0; st && ref.loss && k < ref.steps; k++)
                if (HG_STORE(dsim_store_reference_loss(st, out->run_id, k, ref.loss[k])) !=
                    DSIM_OK) {
                    h_fail(out, "storing the reference's losses");
                    break;
                }
            /* Under sim the run's times are the compute model's: so are the
             * one-device baseline's, or scaling would compare two clocks. */
            if (cfg.engine && strcmp(cfg.engine, "sim") == 0 && cfg.device_flops > 0 && ref.step_ns)
                for (uint64_t k = 0; k < ref.steps; k++)
                    ref.step_ns[k] = (int64_t)(6.0 * (double)ref.n_params *
                                               (double)ref.examples[k] / cfg.device_flops * 1e9);
        } else {
            snprintf(out->note, sizeof out->note, "the one-device reference failed: %s",
                     dsim_errmsg());
            if (st)
                (void)HG_STORE(
                    dsim_store_event(st, out->run_id, -1, h_now_ns(), DSIM_EVENT_ERROR, out->note));
        }
    }

    if (st)
        h_store_phases(st, out, &res);
    size_t n = dsim_check_outcome_count(s);
    out->checks = calloc(n ? n : 1, sizeof *out->checks);
    dsim_check_ctx ctx = {
        .scenario = s,
        .cfg = &s->train,
        .run = &res,
        .reference = have_ref ? &ref : NULL,
        .run_err = out->train_err,
        .faults = faulty ? &cf : NULL,
    };
    if (!out->checks ||
        dsim_check_run_all(&ctx, out->checks, &out->n_checks, &out->n_failed) != DSIM_OK) {
        h_fail(out, "judging the run");
        out->n_checks = 0;
    }
    uint64_t live_hash = 0;
    if (s->has_liveness && out->checks && !out->harness_error)
        live_hash = h_liveness(s, &cfg, out);
    for (size_t i = 0; st && i < out->n_checks; i++) {
        const dsim_check_outcome *c = &out->checks[i];
        if (HG_STORE(dsim_store_check(st, out->run_id, c->name, c->passed, c->result.measured,
                                      c->result.expected, c->result.message)) != DSIM_OK)
            h_fail(out, "storing the checks");
    }

    /* where the time went (the performance check's figures), every run */
    dsim_perf perf;
    if (dsim_perf_measure(&res, have_ref ? &ref : NULL, &perf) != DSIM_OK)
        dsim_perf_measure(NULL, NULL, &perf); /* all NaN */
    struct {
        const char *name;
        double value;
        const char *unit;
    } m[] = {
        {"wall_time", out->wall_s, "s"},
        {"examples_per_s", out->examples_per_s, "examples/s"},
        {"steps", (double)out->steps, "steps"},
        {"examples", (double)out->examples, "examples"},
        {"replicas", (double)R, "replicas"},
        {"initial_loss", out->train_err == DSIM_OK ? res.initial_loss : NAN, "loss"},
        {"final_loss", out->final_loss, "loss"},
        {"reference_final_loss", have_ref ? ref.final_loss : NAN, "loss"},
        {"allreduce_share", perf.allreduce_share, "fraction"},
        {"step_time_median", perf.step_s, "s"},
        {"compute_time_median", perf.compute_s, "s"},
        {"straggler_factor", perf.straggler_factor, "ratio"},
        {"scaling_efficiency", perf.scaling_efficiency, "fraction"},
    };
    for (size_t i = 0; st && i < sizeof m / sizeof m[0]; i++) {
        if (isnan(m[i].value))
            continue;
        if (HG_STORE(dsim_store_metric(st, out->run_id, m[i].name, m[i].value, m[i].unit, -1)) !=
            DSIM_OK)
            h_fail(out, "storing the metrics");
    }
    if (st && cfg.num_ps > 0 && out->train_err == DSIM_OK &&
        HG_STORE(dsim_store_metric(st, out->run_id, "max_staleness", (double)res.max_staleness,
                                   "updates", -1)) != DSIM_OK)
        h_fail(out, "storing the metrics");
    if (st && R > 1 && cfg.num_ps == 0 && out->train_err == DSIM_OK) {
        /* the algorithm's name goes in the unit column: a metric is a number */
        dsim_algo a = cfg.communication;
        if (a == DSIM_ALGO_AUTO)
            a = dsim_allreduce_decide(h_grad_bytes(&cfg, &res), R);
        if (HG_STORE(dsim_store_metric(st, out->run_id, "allreduce_algorithm", (double)a,
                                       dsim_algo_name(a), -1)) != DSIM_OK)
            h_fail(out, "storing the metrics");
    }

    bool sim = cfg.engine && strcmp(cfg.engine, "sim") == 0;
    if (sim && out->train_err == DSIM_OK && (s->network_given || cfg.synthetic_params > 0) &&
        R > 1 && cfg.num_ps == 0) {
        dsim_algo a = cfg.communication;
        if (a == DSIM_ALGO_AUTO)
            a = dsim_allreduce_decide(h_grad_bytes(&cfg, &res), R);
        h_whatif_summary(s, &cfg, &perf, a, out);
    }

    /* A run that failed, or failed a check, leaves its flight records
     * (what every rank's collectives came to) in the store's flight_records
     * table and as one JSON file next to the store, which `dsim trace
     * desync` reads. */
    if (st && out->run_id && (out->train_err != DSIM_OK || out->n_failed)) {
        const dsim_train_result *fr = faulty && rr.has_broken ? &rr.broken : &res;
        const char *why =
            fr == &res ? (out->train_err != DSIM_OK ? res.error.msg : NULL) : rr.broken.error.msg;
        if (h_store_flight(st, out->run_id, fr) != DSIM_OK)
            h_fail(out, "storing the flight records");
        dsim_flight_path(dsim_store_path(st), (uint64_t)out->run_id, out->flight_path,
                         sizeof out->flight_path);
        if (dsim_flight_write(out->flight_path, (uint64_t)out->run_id, s->name, fr, why,
                              cfg.timeout_ns) != DSIM_OK)
            out->flight_path[0] = '\0';
    }

    /* A hang is never what a scenario expects, whatever its checks say. */
    /* A worker process that died of its own signal crashed, as a replica
     * that crashes on the threads engine does (there the guard stores it). */
    bool crashed = faulty && rr.crashed && out->train_err != DSIM_OK;
    out->status = out->harness_error ? DSIM_RUN_ERROR
                  : hung             ? DSIM_RUN_HUNG
                  : crashed          ? DSIM_RUN_CRASHED
                  : out->n_failed    ? DSIM_RUN_FAILED
                                     : DSIM_RUN_PASSED;
    out->deterministic = strcmp(h_engine(s), "sim") == 0;
    out->trace_hash = faulty ? rr.trace_hash : res.trace_hash;
    /* the liveness phase is part of the run's trace */
    out->trace_hash ^= live_hash * 0x9e3779b97f4a7c15ULL;
    out->trace_events = res.trace_events;
    for (int r = 0; res.replicas && r < res.num_replicas; r++)
        if (res.replicas[r].t_end - res.t_start > out->engine_ns)
            out->engine_ns = res.replicas[r].t_end - res.t_start;
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, out->trace_hash);
    if (st && HG_STORE(dsim_store_end_run(st, out->run_id, out->status,
                                          out->deterministic ? hash : NULL, 0)) != DSIM_OK) {
        h_fail(out, "ending the run in the results store");
        out->status = DSIM_RUN_ERROR;
    }
    dsim_train_result_free(&res);
    if (have_ref)
        dsim_train_result_free(&ref);
    dsim_recovery_run_free(&rr);
    /* A worker stuck inside the observer may still read it. */
    if (!in_observer) {
        free(run->formed);
        free(run);
    }
}

dsim_err dsim_harness_run(const dsim_scenario *s, const dsim_harness_opts *opts,
                          dsim_harness_result *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run: out is NULL");
    memset(out, 0, sizeof *out);
    out->final_loss = NAN;
    out->status = DSIM_RUN_ERROR;
    pthread_once(&hg_once, hg_init);
    (void)dsim_sim_engine_register();
    h_opts o;
    memset(&o, 0, sizeof o);
    dsim_err e = s ? h_opts_get(opts, &o)
                   : DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run: the scenario is NULL");
    /* The overrides go on a private copy: the scenario stays the caller's. */
    dsim_scenario sc;
    if (e == DSIM_OK) {
        sc = *s;
        if (o.engine) {
            sc.engine = (char *)o.engine;
            sc.train.engine = o.engine;
        }
        if (o.has_seed) {
            sc.seed = o.seed;
            sc.train.seed = o.seed;
            sc.train.data.seed = o.seed;
        }
        e = h_check(&sc);
    }
    dsim_store *st = o.store, *owned = NULL;
    if (e == DSIM_OK && !st && o.db_path) {
        e = dsim_store_open(o.db_path, &owned);
        st = owned;
    }
    if (e != DSIM_OK) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
        return e;
    }
    if (!o.no_crash_guard)
        pthread_once(&hg_guard_once, hg_guard_install);
    int slot = hg_run_add(st);
    h_run_one(&sc, &o, st, slot, out);
    hg_run_remove(slot);
    e = out->harness_error ? DSIM_EIO : DSIM_OK;
    if (owned) {
        /* Unless a shutdown closed it already; it cannot start while we hold
         * the lock, and the store is no longer in its table. */
        pthread_rwlock_rdlock(&hg_lock);
        if (!hg_down && dsim_store_close(owned) != DSIM_OK && !out->harness_error) {
            h_fail(out, "closing the results store");
            e = DSIM_EIO;
        }
        pthread_rwlock_unlock(&hg_lock);
    }
    if (e != DSIM_OK)
        dsim_set_error(e, -1, __FILE__, __LINE__, "%s", out->harness_msg);
    return e;
}

dsim_err dsim_harness_run_text(const char *path, const char *text, size_t len,
                               const dsim_harness_opts *opts, dsim_harness_result *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run_text: out is NULL");
    memset(out, 0, sizeof *out);
    out->final_loss = NAN;
    out->status = DSIM_RUN_ERROR;
    dsim_scenario *s = NULL;
    dsim_err e = text ? dsim_scenario_parse(path ? path : "(text)", text, len, &s)
                      : DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_run_text: text is NULL");
    if (e != DSIM_OK) {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
        return e;
    }
    e = dsim_harness_run(s, opts, out);
    dsim_scenario_free(s);
    return e;
}

void dsim_harness_result_free(dsim_harness_result *r)
{
    if (!r)
        return;
    free(r->checks);
    free(r->stuck);
    r->checks = NULL;
    r->stuck = NULL;
    r->n_checks = r->n_failed = r->n_stuck = 0;
    free(r->timeline);
    r->timeline = NULL;
}

/* ---- replay ---- */

dsim_err dsim_harness_replay(const char *db_path, dsim_run_id id, const dsim_harness_opts *opts,
                             dsim_harness_result *out, dsim_harness_replay_info *info)
{
    if (!out || !info)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_harness_replay: out and info are needed");
    memset(out, 0, sizeof *out);
    memset(info, 0, sizeof *info);
    out->status = DSIM_RUN_ERROR;
    out->final_loss = NAN;
    dsim_stored_run sr;
    DSIM_CHECK(dsim_store_read_run(db_path, id, &sr));
    dsim_err e = DSIM_OK;
    const char *db = db_path ? db_path : DSIM_STORE_DEFAULT_PATH;
    if (!sr.engine || strcmp(sr.engine, "sim") != 0)
        e = DSIM_ERR(DSIM_ENOTSUP, -1,
                     "%s: run %lld ran on engine %s: only runs under engine sim are "
                     "deterministic and replay event for event (dsim run --engine sim)",
                     db, (long long)id, sr.engine ? sr.engine : "(none)");
    else if (!sr.scenario_text)
        e = DSIM_ERR(DSIM_EINVAL, -1, "%s: run %lld has no scenario text stored", db,
                     (long long)id);
    else if (!sr.trace_hash)
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "%s: run %lld has no trace hash (status %s): it never ended, so there is "
                     "nothing to compare with",
                     db, (long long)id, sr.status ? sr.status : "unknown");
    if (e != DSIM_OK) {
        dsim_stored_run_free(&sr);
        return e;
    }
    snprintf(info->scenario, sizeof info->scenario, "%s", sr.scenario ? sr.scenario : "");
    snprintf(info->stored_hash, sizeof info->stored_hash, "%s", sr.trace_hash);
    info->seed = sr.seed;
    dsim_harness_opts o;
    if (opts && opts->size == sizeof o)
        o = *opts;
    else
        o = (dsim_harness_opts){.size = sizeof o};
    o.engine_override = "sim";
    o.has_seed = true;
    o.seed = sr.seed;
    char path[192];
    snprintf(path, sizeof path, "%s (run %lld)", info->scenario, (long long)id);
    dsim_scenario *s = NULL;
    e = dsim_scenario_parse(path, sr.scenario_text, strlen(sr.scenario_text), &s);
    /* A file with a matrix: section stored one run per combination, under
     * the combination's name: run that one again. */
    size_t nc = e == DSIM_OK && s->n_combinations ? dsim_scenario_combinations(s) : 0;
    dsim_scenario *pick = NULL;
    for (size_t k = 0; k < nc && !pick && e == DSIM_OK; k++) {
        dsim_scenario *c = NULL;
        e = dsim_scenario_combination(s, k, &c);
        if (e == DSIM_OK && strcmp(c->name, info->scenario) == 0)
            pick = c;
        else
            dsim_scenario_free(c);
    }
    if (e == DSIM_OK && nc && !pick)
        e = DSIM_ERR(DSIM_ENOENT, -1,
                     "%s: run %lld (%s): its scenario file makes %zu runs and none of them is "
                     "named so",
                     db, (long long)id, info->scenario, nc);
    if (pick) {
        dsim_scenario_free(s);
        s = pick;
    }
    if (e == DSIM_OK) {
        e = dsim_harness_run(s, &o, out);
    } else {
        out->harness_error = true;
        snprintf(out->harness_msg, sizeof out->harness_msg, "%s", dsim_errmsg());
    }
    dsim_scenario_free(s);
    if (e == DSIM_OK) {
        snprintf(info->replay_hash, sizeof info->replay_hash, "%016" PRIx64, out->trace_hash);
        info->matched = strcmp(info->replay_hash, info->stored_hash) == 0;
    }
    dsim_stored_run_free(&sr);
    return e;
}
