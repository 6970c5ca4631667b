/* What a program that runs scenarios starts with (harness.h): the
 * supervising parent process, and the re-exec with huge pages for jobs of
 * tens of thousands of workers. `dsim run` calls both; so can an embedding
 * program. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "harness_int.h"
#include "dsim_cov.h"

/* ---- the supervisor ----
 *
 * What the crash guard cannot see kills the process with no word: SIGKILL
 * (the kernel's out-of-memory killer, kill -9), or a strategy that calls
 * _exit(). So `dsim run` forks before anything else: the child runs the
 * scenarios, the parent only waits. When the child ends, runs it left
 * 'running' are stored as 'crashed' with how it ended and its peak memory,
 * and the parent ends as it did (same status or signal). Signals sent to
 * the parent (an interrupt, a terminate) are passed on; if the parent is
 * killed, the child is sent SIGTERM and stores its run as 'unfinished'.
 * DSIM_NO_SUPERVISOR=1 runs without it (e.g. under a debugger). */
static volatile sig_atomic_t hs_child_pid;

static void hs_forward(int sig)
{
    int saved = errno; /* the handler may interrupt wait4, which reads it */
    if (hs_child_pid > 0)
        kill((pid_t)hs_child_pid, sig);
    errno = saved;
}

static const char *hs_sig_text(int sig)
{
    switch (sig) {
    case SIGKILL:
        return "SIGKILL), sent by the kernel's out-of-memory killer (see dmesg) or by a kill -9";
    case SIGTERM:
        return "SIGTERM)";
    case SIGSEGV:
        return "SIGSEGV)";
    case SIGABRT:
        return "SIGABRT)";
    case SIGBUS:
        return "SIGBUS)";
    case SIGINT:
        return "SIGINT)";
    case SIGHUP:
        return "SIGHUP)";
    default:
        return "a signal)";
    }
}

void dsim_harness_supervise(const char *db, const char *prog)
{
    const char *off = getenv("DSIM_NO_SUPERVISOR");
    if (off && *off && strcmp(off, "0") != 0)
        return;
    struct timespec t0;
    clock_gettime(CLOCK_REALTIME, &t0);
    int64_t since = (int64_t)t0.tv_sec * 1000000000 + t0.tv_nsec - 1000000000;
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0)
        return; /* no supervisor: the crash guard alone */
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            raise(SIGTERM); /* the parent died before the line above */
        return;
    }
    hs_child_pid = child;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = hs_forward;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    pid_t w;
    while ((w = wait4(child, &status, 0, &ru)) < 0 && errno == EINTR)
        ;
    if (w < 0)
        _exit(2);
    char how[200];
    if (WIFSIGNALED(status))
        snprintf(how, sizeof how, "was killed by signal %d (%s", WTERMSIG(status),
                 hs_sig_text(WTERMSIG(status)));
    else
        snprintf(how, sizeof how,
                 "exited with status %d in the middle of the run (a strategy or a library "
                 "called _exit() or exit_group)",
                 WEXITSTATUS(status));
    json_t *ev = json_pack("{s:s, s:s, s:I, s:I}", "error", "crashed", "message", how, "pid",
                           (json_int_t)child, "peak_rss_kib", (json_int_t)ru.ru_maxrss);
    if (ev && WIFSIGNALED(status))
        json_object_set_new(ev, "signal", json_integer(WTERMSIG(status)));
    else if (ev)
        json_object_set_new(ev, "exit_status", json_integer(WEXITSTATUS(status)));
    char *detail = ev ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(ev);
    dsim_run_id ids[8];
    size_t n = 0;
    /* A child that exited on its own with a store it could not open (bad
     * input: status 2) said so already: only a death by signal is worth a
     * word more about the store. */
    if (access(db, F_OK) == 0 &&
        dsim_store_mark_dead_process(db, (long)child, since, detail ? detail : how, ids, 8, &n) !=
            DSIM_OK &&
        WIFSIGNALED(status))
        fprintf(stderr, "%s: %s\n", prog, dsim_errmsg());
    free(detail);
    for (size_t i = 0; i < n && i < 8; i++)
        fprintf(stderr,
                "\ndsim: run %" PRId64 ": the process running it %s; its peak memory was %.1f "
                "MiB; stored as crashed in %s\n",
                (int64_t)ids[i], how, (double)ru.ru_maxrss / 1024.0, db);
    /* the parent ends with _exit() or the child's signal: its coverage
     * counters are written just before (dsim_cov.h) */
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core); /* the child's was the one to keep */
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        DSIM_COV_DUMP();
        raise(sig);
        _exit(128 + sig);
    }
    DSIM_COV_DUMP();
    _exit(n > 0 && WEXITSTATUS(status) == 0 ? 1 : WEXITSTATUS(status));
}

/* ---- huge pages ---- */

bool dsim_harness_wants_hugepages(const dsim_scenario *s)
{
    const dsim_engine_ops *eng;
    if (!s || dsim_engine_find(dsim_scenario_engine(s), &eng) != DSIM_OK)
        return false;
    /* tens of thousands of workers in this process, each a coroutine */
    return (eng->flags & DSIM_ENGINE_ONE_SPACE) && !(eng->flags & DSIM_ENGINE_THREAD_PER_REPLICA) &&
           (int64_t)s->train.hosts * s->train.devices_per_host >= DSIM_HARNESS_HUGEPAGES_REPLICAS;
}

void dsim_harness_reexec_hugepages(char **main_argv)
{
    const char *off = getenv("DSIM_HUGEPAGES");
    if (off && strcmp(off, "0") == 0)
        return;
    const char *tun = getenv("GLIBC_TUNABLES");
    if (tun && strstr(tun, "glibc.malloc.hugetlb"))
        return; /* done already, or the user's own choice */
    const char *pre = getenv("LD_PRELOAD");
    if (pre && strstr(pre, "vgpreload"))
        return; /* valgrind would not follow the exec */
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return;
    size_t n = fread(mode, 1, sizeof mode - 1, f);
    fclose(f);
    mode[n] = '\0';
    if (!strstr(mode, "[madvise]"))
        return; /* always: huge pages already; never: none to have */
    char val[1024];
    int len = snprintf(val, sizeof val, "%s%sglibc.malloc.hugetlb=1", tun ? tun : "",
                       tun && *tun ? ":" : "");
    if (len < 0 || (size_t)len >= sizeof val)
        return;
    fflush(NULL);
    if (setenv("GLIBC_TUNABLES", val, 1) != 0)
        return;
    execv("/proc/self/exe", main_argv);
    /* still here: go on without */
    if (tun)
        setenv("GLIBC_TUNABLES", tun, 1);
    else
        unsetenv("GLIBC_TUNABLES");
}
