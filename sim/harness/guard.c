/* The harness's guards (harness_int.h): the store guard, through which
 * every store call of a run goes, so that an interrupt closes the stores
 * only between calls (dsim_harness_shutdown); and the crash guard, which
 * stores a run whose replica crashes or calls exit() as 'crashed' before
 * the process dies (harness.h, "Crashes"). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

#include "dsim_cov.h"
#include "harness_int.h"

/* ---- the store guard ---- */

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
pthread_rwlock_t hg_lock;
bool hg_down; /* under hg_lock: no store call any more */
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

void hg_init_once(void)
{
    pthread_once(&hg_once, hg_init);
}

int hg_run_add(dsim_store *st)
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

void hg_run_set_id(int slot, dsim_run_id id)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&hg_runs_mu);
    hg_runs[slot].id = id;
    pthread_mutex_unlock(&hg_runs_mu);
}

void hg_run_remove(int slot)
{
    atomic_fetch_sub(&hg_active, 1);
    if (slot < 0)
        return;
    pthread_mutex_lock(&hg_runs_mu);
    hg_runs[slot] = (hg_run){0};
    pthread_mutex_unlock(&hg_runs_mu);
}

/* Closes each distinct store of the runs in progress, and extra; the runs
 * each left unsettled (begun, end not committed: stored 'unfinished' by the
 * close) go to ids[cap]. Called with hg_lock held for writing; sets
 * hg_down. Returns how many runs were unsettled. */
static size_t hg_close_all(dsim_store *extra, dsim_run_id *ids, size_t cap)
{
    hg_down = true;
    dsim_store *closed[HG_MAX_RUNS + 1];
    int n = 0;
    size_t nu = 0;
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
        nu += dsim_store_unsettled(st, nu < cap ? ids + nu : NULL, nu < cap ? cap - nu : 0);
        (void)dsim_store_close(st);
    }
    pthread_mutex_unlock(&hg_runs_mu);
    return nu;
}

size_t dsim_harness_shutdown(dsim_store *extra, dsim_run_id *unfinished, size_t cap)
{
    hg_init_once();
    pthread_rwlock_wrlock(&hg_lock);
    size_t n = 0;
    if (!hg_down)
        n = hg_close_all(extra, unfinished, cap);
    /* The lock stays held: nothing may touch the closed stores. */
    return n;
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
    hg_init_once();
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
    hg_close_all(NULL, NULL, 0);
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
    /* (a coverage build only: not async-signal-safe, but the process is
     * dying of a crash a test made on purpose) */
    DSIM_COV_DUMP();
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
    DSIM_COV_DUMP();
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
    int rc = dsim_thread_start(&t, &at, hg_watcher, NULL);
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
void hg_guard_install_once(void)
{
    pthread_once(&hg_guard_once, hg_guard_install);
}
