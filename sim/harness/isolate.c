/* A scenario run in a child process of its own (isolate.h). */
#include "isolate.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What goes through the pipe: the result with its pointers cleared, then
 * each check with its name, then the timeline's bytes. */
typedef struct iso_head {
    dsim_harness_result r;
    dsim_err err;
    size_t n_checks;
    size_t timeline_len;
} iso_head;

typedef struct iso_check {
    char name[64];
    dsim_check_outcome o;
} iso_check;

#define ISO_MAX_CHECKS   64
#define ISO_MAX_TIMELINE (1u << 20)

static double iso_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool iso_write(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        len -= (size_t)w;
    }
    return true;
}

static void iso_child(int fd, const char *path, const char *text, const dsim_harness_opts *ho,
                      const char *cwd)
{
    FILE *devnull = freopen("/dev/null", "w", stdout);
    (void)devnull;
    devnull = freopen("/dev/null", "w", stderr);
    (void)devnull;
    iso_head h;
    memset(&h, 0, sizeof h);
    if (cwd && chdir(cwd) != 0) {
        h.err = DSIM_EIO;
        h.r.harness_error = true;
        snprintf(h.r.harness_msg, sizeof h.r.harness_msg, "cannot enter %s: %s", cwd,
                 strerror(errno));
        iso_write(fd, &h, sizeof h);
        _exit(0);
    }
    dsim_harness_opts o = {.size = sizeof o};
    if (ho) {
        o.engine_override = ho->engine_override;
        o.has_seed = ho->has_seed;
        o.seed = ho->seed;
        o.grace_ns = ho->grace_ns;
        o.progress_timeout_ns = ho->progress_timeout_ns;
    }
    o.no_crash_guard = true;
    dsim_harness_result r;
    memset(&r, 0, sizeof r);
    h.err = dsim_harness_run_text(path, text, strlen(text), &o, &r);
    if (h.err != DSIM_OK && !r.harness_msg[0])
        snprintf(r.harness_msg, sizeof r.harness_msg, "%s", dsim_errmsg());
    h.r = r;
    h.r.checks = NULL;
    h.r.timeline = NULL;
    h.r.stuck = NULL;
    h.r.n_stuck = 0;
    h.n_checks = r.n_checks < ISO_MAX_CHECKS ? r.n_checks : ISO_MAX_CHECKS;
    h.r.n_checks = h.n_checks;
    size_t tl = r.timeline ? strlen(r.timeline) : 0;
    h.timeline_len = tl < ISO_MAX_TIMELINE ? tl : ISO_MAX_TIMELINE;
    bool ok = iso_write(fd, &h, sizeof h);
    for (size_t i = 0; ok && i < h.n_checks; i++) {
        iso_check c;
        memset(&c, 0, sizeof c);
        snprintf(c.name, sizeof c.name, "%s", r.checks[i].name ? r.checks[i].name : "");
        c.o = r.checks[i];
        c.o.name = NULL;
        ok = iso_write(fd, &c, sizeof c);
    }
    if (ok && h.timeline_len)
        iso_write(fd, r.timeline, h.timeline_len);
    _exit(0);
}

/* Reads len bytes by the deadline; false on the end of the pipe or the
 * deadline (*late). */
static bool iso_read(int fd, void *buf, size_t len, double deadline, bool *late)
{
    char *p = buf;
    while (len) {
        double left = deadline - iso_now();
        if (left <= 0) {
            *late = true;
            return false;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (pr <= 0)
            continue;
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* The check's name as a static string of this process (the registry's). */
static const char *iso_name(const char *name)
{
    const dsim_check_ops *ops = dsim_check_find(name);
    if (ops)
        return ops->name;
    return strcmp(name, "error") == 0 ? "error" : "unknown";
}

static bool iso_collect(int fd, double deadline, dsim_isolated *out, bool *late)
{
    iso_head h;
    if (!iso_read(fd, &h, sizeof h, deadline, late) || h.n_checks > ISO_MAX_CHECKS ||
        h.timeline_len > ISO_MAX_TIMELINE)
        return false;
    out->r = h.r;
    out->r.checks = NULL;
    out->r.n_checks = 0;
    out->r.timeline = NULL;
    out->err = h.err;
    if (h.n_checks) {
        out->r.checks = calloc(h.n_checks, sizeof *out->r.checks);
        if (!out->r.checks)
            return false;
        for (size_t i = 0; i < h.n_checks; i++) {
            iso_check c;
            if (!iso_read(fd, &c, sizeof c, deadline, late))
                return false;
            c.name[sizeof c.name - 1] = '\0';
            out->r.checks[i] = c.o;
            out->r.checks[i].name = iso_name(c.name);
            out->r.n_checks = i + 1;
        }
    }
    if (h.timeline_len) {
        out->r.timeline = malloc(h.timeline_len + 1);
        if (!out->r.timeline || !iso_read(fd, out->r.timeline, h.timeline_len, deadline, late))
            return false;
        out->r.timeline[h.timeline_len] = '\0';
    }
    return true;
}

dsim_err dsim_isolated_run(const char *path, const char *text, const dsim_harness_opts *ho,
                           double timeout_s, const char *cwd, dsim_isolated *out)
{
    memset(out, 0, sizeof *out);
    out->exit_status = -1;
    int fd[2];
    if (pipe(fd) != 0)
        return DSIM_ERR(DSIM_EIO, errno, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fd[0]);
        close(fd[1]);
        return DSIM_ERR(DSIM_EIO, e, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        close(fd[0]);
        iso_child(fd[1], path, text, ho, cwd);
    }
    close(fd[1]);
    bool late = false;
    out->ended = iso_collect(fd[0], iso_now() + timeout_s, out, &late);
    close(fd[0]);
    if (late)
        kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (out->ended)
        return DSIM_OK;
    dsim_harness_result_free(&out->r);
    memset(&out->r, 0, sizeof out->r);
    out->timed_out = late;
    if (late) {
        snprintf(out->why, sizeof out->why, "the run took longer than %.0f s of wall time",
                 timeout_s);
    } else if (WIFSIGNALED(st)) {
        out->term_signal = WTERMSIG(st);
        snprintf(out->why, sizeof out->why, "the run died of signal %d (%s)", WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
    } else {
        out->exit_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        snprintf(out->why, sizeof out->why, "the run ended the process with status %d",
                 out->exit_status);
    }
    out->r.status = late ? DSIM_RUN_HUNG : DSIM_RUN_CRASHED;
    out->r.train_err = late ? DSIM_ETIMEDOUT : DSIM_EIO;
    snprintf(out->r.train_msg, sizeof out->r.train_msg, "%s", out->why);
    return DSIM_OK;
}

void dsim_isolated_free(dsim_isolated *o)
{
    if (o)
        dsim_harness_result_free(&o->r);
}

/* A job that stopped on a timeout, an abort or a lost peer: which of these
 * a run ends with depends on which replica noticed first, so they are one
 * way to fail; a refused shape or corrupt data is another. */
static bool iso_lost_job(dsim_err e)
{
    return e == DSIM_ETIMEDOUT || e == DSIM_EABORTED || e == DSIM_EPEER || e == DSIM_EHUNG ||
           e == DSIM_EPREEMPTED;
}

void dsim_isolated_signature(const dsim_isolated *o, char *sig, size_t sig_cap, char *msg,
                             size_t msg_cap)
{
    const dsim_harness_result *r = &o->r;
    sig[0] = msg[0] = '\0';
    if (!o->ended) {
        snprintf(sig, sig_cap, "%s", o->timed_out ? "timeout" : "crashed");
        snprintf(msg, msg_cap, "%s", o->why);
        return;
    }
    if (o->err != DSIM_OK || r->harness_error) {
        snprintf(sig, sig_cap, "error");
        snprintf(msg, msg_cap, "%s", r->harness_msg);
        return;
    }
    if (r->status == DSIM_RUN_PASSED && r->n_failed == 0)
        return;
    if (r->status == DSIM_RUN_HUNG || r->status == DSIM_RUN_CRASHED) {
        snprintf(sig, sig_cap, "%s", dsim_run_status_name(r->status));
        snprintf(msg, msg_cap, "%s", r->train_msg);
        return;
    }
    /* "the same way": the check, and whether it judged the run and failed
     * it, passed where it was expected to fail, or had no run to judge (and
     * then, but for a lost job, why: a refused batch is not a timeout) */
    for (size_t i = 0; i < r->n_checks; i++) {
        const dsim_check_outcome *c = &r->checks[i];
        if (!c->passed) {
            if (c->run_failed && iso_lost_job(r->train_err))
                snprintf(sig, sig_cap, "%s (not judged: the run failed)", c->name);
            else if (c->run_failed)
                snprintf(sig, sig_cap, "%s (not judged: the run failed: %s)", c->name,
                         dsim_strerror(r->train_err));
            else
                snprintf(sig, sig_cap, "%s%s", c->name,
                         c->expect_fail && c->check_passed ? " (passed, expected to fail)" : "");
            snprintf(msg, msg_cap, "%s", c->result.message);
            return;
        }
    }
    snprintf(sig, sig_cap, "%s", dsim_run_status_name(r->status));
    snprintf(msg, msg_cap, "%s", r->train_msg);
}
