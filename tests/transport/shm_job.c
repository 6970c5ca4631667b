/* The process harness of test_shm.c (shm_job.h): children that each open
 * one rank of a shared mapping, report through a pipe, and are stopped,
 * killed and collected by the test. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "dsim/err.h"
#include "dsim/fiu.h"
#include "dsim/rt.h"
#include "dsim/transport.h"
#include "dsim_config.h"
#include "shm_job.h"

#if DSIM_HAVE_FIU
#define FIU_ENABLE 1
#include <fiu-control.h>
#include <fiu.h>
#endif

int64_t mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* The payload of message (src, dst, k): its bytes say who sent it when,
 * so a torn or misplaced message shows. */
void fill(uint8_t *p, size_t n, int src, int dst, uint64_t k)
{
    uint64_t s = mix(((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ k);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mix(s + i);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

int intact(const uint8_t *p, size_t n, int src, int dst, uint64_t k)
{
    uint64_t s = mix(((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ k);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mix(s + i);
        if (memcmp(p + i, &v, n - i < 8 ? n - i : 8) != 0)
            return 0;
    }
    return 1;
}

void fail_child(child_res *res, const char *what)
{
    res->err = dsim_last_error()->code ? dsim_last_error()->code : DSIM_EIO;
    res->peer = dsim_last_error()->peer;
    res->t_fail = mono();
    snprintf(res->msg, sizeof res->msg, "%s: %s", what, dsim_errmsg());
}

int world_open(world *w, const job *j, int rank, child_res *res)
{
    char opts[256];
    snprintf(opts, sizeof opts, "fd=%d,local=%d%s%s", j->fd, rank, j->opts ? "," : "",
             j->opts ? j->opts : "");
    w->rank = rank;
    w->n = j->n;
    if (dsim_rt_create("threads", &w->rt) != DSIM_OK) {
        fail_child(res, "rt");
        return -1;
    }
    dsim_fabric_cfg cfg = {.backend = "shm", .nranks = j->n, .rt = w->rt, .options = opts};
    if (dsim_fabric_open(&cfg, &w->f) != DSIM_OK) {
        fail_child(res, "fabric");
        return -1;
    }
    if (dsim_ep_open(w->f, rank, &w->ep) != DSIM_OK) {
        fail_child(res, "endpoint");
        return -1;
    }
    return 0;
}

void world_close(world *w, child_res *res)
{
    if (w->f)
        dsim_shm_get_stats(w->f, &res->st);
    if (w->ep)
        dsim_ep_close(w->ep);
    if (w->f)
        dsim_fabric_close(w->f);
    if (w->rt)
        dsim_rt_destroy(w->rt);
}

void ready(int wfd)
{
    char b = 'R';
    if (write(wfd, &b, 1) != 1)
        _exit(3);
}

void start_child(job *j, int rank, child_fn fn, void *arg)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        for (int r = 0; r < rank; r++)
            close(j->c[r].rfd);
        child_res res;
        memset(&res, 0, sizeof res);
        world w;
        memset(&w, 0, sizeof w);
        if (j->pre)
            j->pre(rank);
        if (world_open(&w, j, rank, &res) == 0)
            fn(&w, arg, &res, p[1]);
        else
            ready(p[1]);
        world_close(&w, &res);
        ssize_t n = write(p[1], &res, sizeof res);
        _exit(n == (ssize_t)sizeof res ? 0 : 3);
    }
    close(p[1]);
    j->c[rank] = (child){.pid = pid, .rfd = p[0]};
}

void job_init(job *j, int n, const char *opts)
{
    memset(j, 0, sizeof *j);
    j->n = n;
    j->opts = opts;
    assert_int_equal(dsim_shm_create(n, NULL, &j->fd), DSIM_OK);
}

/* Reads exactly n bytes within the deadline: 1, or 0 on EOF or timeout. */
int read_full(int fd, void *buf, size_t n, int64_t deadline)
{
    size_t got = 0;
    while (got < n) {
        int64_t left = (deadline - mono()) / MS;
        if (left <= 0)
            return 0;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, (int)left) <= 0)
            continue;
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k <= 0)
            return 0;
        got += (size_t)k;
    }
    return 1;
}

void wait_ready(job *j, int rank)
{
    char b = 0;
    assert_true(read_full(j->c[rank].rfd, &b, 1, mono() + LONG_NS));
    assert_int_equal(b, 'R');
}

/* A job of n processes, each running fn(arg), all ready. */
void job_start(job *j, int n, const char *opts, child_fn fn, void *arg)
{
    job_init(j, n, opts);
    for (int r = 0; r < n; r++)
        start_child(j, r, fn, arg);
    for (int r = 0; r < n; r++)
        wait_ready(j, r);
}

/* The child's result; 0 if it died before giving one. */
int collect(job *j, int rank, child_res *res)
{
    memset(res, 0, sizeof *res);
    int ok = read_full(j->c[rank].rfd, res, sizeof *res, mono() + LONG_NS);
    if (!j->c[rank].reaped) {
        waitpid(j->c[rank].pid, &j->c[rank].status, 0);
        j->c[rank].reaped = 1;
    }
    return ok;
}

void job_end(job *j)
{
    for (int r = 0; r < j->n; r++) {
        if (j->c[r].pid > 0 && !j->c[r].reaped) {
            kill(j->c[r].pid, SIGKILL);
            waitpid(j->c[r].pid, &j->c[r].status, 0);
        }
        if (j->c[r].rfd > 0)
            close(j->c[r].rfd);
    }
    close(j->fd);
}

/* Kills a child and notes when. */
int64_t kill_now(job *j, int rank)
{
    int64_t t = mono();
    assert_int_equal(kill(j->c[rank].pid, SIGKILL), 0);
    waitpid(j->c[rank].pid, &j->c[rank].status, 0);
    j->c[rank].reaped = 1;
    return t;
}

/* Waits until the child has stopped itself (a libfiu point's SIGSTOP): 1.
 * If it ended instead, the test fails saying how and what the child said,
 * unless the child did all it had to without a failure (its point never
 * fired): 0 then, and the caller may try once more. */
int wait_stopped_or_done(job *j, int rank)
{
    int st = 0;
    assert_int_equal(waitpid(j->c[rank].pid, &st, WUNTRACED), j->c[rank].pid);
    if (WIFSTOPPED(st))
        return 1;
    j->c[rank].reaped = 1;
    j->c[rank].status = st;
    child_res res;
    memset(&res, 0, sizeof res);
    int said = read_full(j->c[rank].rfd, &res, sizeof res, mono() + 1000 * MS);
    const char *how = WIFEXITED(st) ? "exited with" : "was killed by signal";
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st);
    if (said && !res.err && WIFEXITED(st) && code == 0) {
        print_message("rank %d did not stop at its libfiu point: it did its part without a "
                      "failure (%" PRIu64 " messages, %" PRIu64 " large by cross-memory attach, "
                      "%" PRIu64 " through the bounce buffer)\n",
                      rank, res.msgs, res.st.cma_msgs, res.st.bounce_msgs);
        return 0;
    }
    fail_msg("rank %d did not stop at its libfiu point: it %s %d; %s (%" PRIu64 " messages, "
             "%" PRIu64 " large by cross-memory attach, %" PRIu64 " through the bounce buffer, "
             "%" PRIu64 " refusals)",
             rank, how, code,
             !said     ? "no result"
             : res.err ? res.msg
                       : "no failure",
             res.msgs, res.st.cma_msgs, res.st.bounce_msgs, res.st.cma_refused);
    return 0;
}

void wait_stopped(job *j, int rank)
{
    if (!wait_stopped_or_done(j, rank))
        fail_msg("rank %d was to stop at its libfiu point", rank);
}

int fiu_usable(void)
{
#if DSIM_HAVE_FIU
    return 1;
#else
    return 0;
#endif
}

void child_fiu(const char *point, int after)
{
#if DSIM_HAVE_FIU
    fiu_init(0);
    dsim_fiu_arm(1);
    if (after == 0)
        fiu_enable(point, 1, NULL, FIU_ONETIME);
#else
    (void)point;
    (void)after;
#endif
}

int send_msg(world *w, int to, uint32_t tag, size_t len, uint64_t k, child_res *res)
{
    uint8_t *b = malloc(len ? len : 1);
    fill(b, len, w->rank, to, k);
    dsim_req *r;
    dsim_err e = dsim_isend(w->ep, to, 1, tag, b, len, &r);
    if (e == DSIM_OK)
        e = dsim_wait(r, dsim_rt_deadline(w->rt, LONG_NS), NULL);
    free(b);
    if (e != DSIM_OK) {
        fail_child(res, "send");
        return -1;
    }
    res->msgs++;
    return 0;
}

int recv_msg(world *w, int from, uint32_t tag, size_t len, uint64_t k, child_res *res)
{
    uint8_t *b = malloc(len ? len : 1);
    dsim_req *r;
    size_t got = 0;
    dsim_err e = dsim_irecv(w->ep, from, 1, tag, b, len, &r);
    if (e == DSIM_OK)
        e = dsim_wait(r, dsim_rt_deadline(w->rt, LONG_NS), &got);
    if (e != DSIM_OK) {
        fail_child(res, "recv");
        free(b);
        return -1;
    }
    if (got != len || !intact(b, len, from, w->rank, k))
        res->corrupt++;
    res->msgs++;
    res->bytes += got;
    free(b);
    return 0;
}
