/* The processes engine's agent: a task of a job over machines, under a
 * chief elsewhere (processes.h, dsim_proc_agent). For each attempt the
 * chief starts, it forks the task's child, relays the child's records to
 * the chief whole, applies the signals the chief sends and ends the pauses
 * its child begins. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsim/log.h"
#include "proc_int.h"

/* One attempt's relay. */
typedef struct pr_relay {
    pid_t pid;
    int pfd, chief_fd;
    pr_ring *ring; /* the child's records (NULL: over the pipe) */
    pr_reader rd;
    int64_t cont_at; /* SIGCONT due, or 0 */
    bool pipe_open, exited;
    int st; /* the child's wait status once exited */
    int rc; /* 1 going on, 0 the chief said goodbye, -1 its connection broke */
} pr_relay;

/* A command from the chief. */
static void pr_relay_command(pr_relay *r)
{
    uint32_t type, len;
    unsigned char *cb;
    if (!pr_command(r->chief_fd, &type, &cb, &len)) {
        kill(r->pid, SIGKILL);
        r->rc = -1;
        r->chief_fd = -1;
    } else if (type == PC_SIGNAL && len >= sizeof(int32_t)) {
        int32_t sig;
        memcpy(&sig, cb, sizeof sig);
        if (!r->exited)
            kill(r->pid, sig);
    } else if (type == PC_BYE) {
        kill(r->pid, SIGKILL);
        r->rc = 0;
    }
    free(cb);
}

/* Whole records from the child to the chief, so that a PAUSE is seen here
 * and the chief's reader never meets half of one. */
static void pr_relay_records(pr_relay *r)
{
    int k;
    while ((k = pr_ring_next(r->ring, r->pfd, &r->rd)) == 1) {
        const pr_reader *rd = &r->rd;
        if (rd->hdr[0] == PR_PAUSE && rd->hdr[1] >= sizeof(pr_pause)) {
            pr_pause p;
            memcpy(&p, rd->body, sizeof p);
            if (p.duration_ns > 0)
                r->cont_at = pr_now() + p.duration_ns;
        }
        if (!pr_sock_send(r->chief_fd, rd->hdr[0], rd->body, rd->hdr[1])) {
            kill(r->pid, SIGKILL);
            r->rc = -1;
            return;
        }
    }
    if (k < 0)
        r->pipe_open = false;
}

/* The interrupt (dsim_proc_agent_interrupt): the signal, and whether an
 * attempt is being relayed (the chief is then told; otherwise the handler
 * exits). */
static volatile sig_atomic_t pr_agent_sig;
static volatile sig_atomic_t pr_agent_relaying;

void dsim_proc_agent_interrupt(int sig)
{
    if (!pr_agent_relaying) {
        static const char msg[] = "\ndsim worker: interrupted; this task was not in a job\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + sig);
    }
    pr_agent_sig = sig;
}

int dsim_proc_agent_signal(void)
{
    return pr_agent_sig;
}

/* Relays one attempt's child to the chief until it ends. Returns 1 when the
 * attempt ended, 0 when the chief said goodbye, -1 when its connection
 * broke. */
static int pr_agent_attempt(pid_t pid, int pfd, pr_ring *ring, int chief_fd)
{
    pr_relay r = {
        .pid = pid, .pfd = pfd, .ring = ring, .chief_fd = chief_fd, .pipe_open = true, .rc = 1};
    bool told = false;
    while (r.pipe_open || !r.exited) {
        if (pr_agent_sig && !told) {
            int32_t sig = pr_agent_sig;
            told = true;
            dsim_warn("dsim worker: interrupted (%s); telling the chief",
                      sig == SIGTERM ? "SIGTERM" : "SIGINT");
            if (!pr_sock_send(r.chief_fd, PR_INTERRUPT, &sig, sizeof sig)) {
                kill(pid, SIGKILL);
                r.rc = -1;
                break;
            }
        }
        struct pollfd pf[2] = {{.fd = r.pipe_open ? pfd : -1, .events = POLLIN},
                               {.fd = r.chief_fd, .events = POLLIN}};
        int n = poll(pf, 2, 20);
        if (n < 0 && errno != EINTR)
            break;
        if (r.cont_at && pr_now() >= r.cont_at) {
            r.cont_at = 0;
            kill(pid, SIGCONT);
        }
        if (pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            pr_relay_command(&r);
            if (r.rc != 1)
                break;
        }
        /* a ring is read each time round (proc_ring.h) */
        if (r.pipe_open && (r.ring || (pf[0].revents & (POLLIN | POLLHUP | POLLERR)))) {
            pr_relay_records(&r);
            if (r.rc != 1)
                break;
        }
        if (!r.exited && waitpid(pid, &r.st, WNOHANG) == pid)
            r.exited = true;
    }
    pr_reader_free(&r.rd);
    if (!r.exited)
        waitpid(pid, &r.st, 0);
    close(pfd);
    if (r.rc == 1) {
        pr_exit x = {.sig = WIFSIGNALED(r.st) ? WTERMSIG(r.st) : 0,
                     .code = WIFEXITED(r.st) ? WEXITSTATUS(r.st) : -1};
        if (!pr_sock_send(r.chief_fd, PR_EXIT, &x, sizeof x))
            r.rc = -1;
    }
    return r.rc;
}

/* The tcp options of this task: every rank's address, its own ranks and
 * their listeners. */
static char *pr_agent_options(const dsim_proc_hosts *h, int lo, int hi)
{
    size_t cap = strlen(h->addrs) + (h->tcp_extra ? strlen(h->tcp_extra) : 0) + 64 +
                 (size_t)(hi - lo + 1) * 12;
    char *opts = malloc(cap);
    if (!opts)
        return NULL;
    size_t o = (size_t)snprintf(opts, cap, "addrs=%s,local=%d-%d,listen_fds=", h->addrs, lo, hi);
    for (int r = lo; r <= hi; r++)
        o += (size_t)snprintf(opts + o, cap - o, "%s%d", r > lo ? ";" : "", h->listen_fds[r - lo]);
    if (h->tcp_extra && *h->tcp_extra)
        snprintf(opts + o, cap - o, ",%s", h->tcp_extra);
    return opts;
}

/* One attempt the chief started (body: restore, then done[] per fault):
 * forks the task's child and relays it. 1 the attempt ended, 0 the chief
 * said goodbye, -1 an error (set). */
static int pr_agent_start(const dsim_train_cfg *cfg, const dsim_proc_attempt *tmpl,
                          const unsigned char *body, const dsim_proc_hosts *h, int chief_fd,
                          const char *opts)
{
    size_t n_faults = tmpl->n_faults;
    int lo, hi;
    dsim_proc_task_ranks(cfg, h->task, &lo, &hi);
    bool *done = calloc(n_faults ? n_faults : 1, sizeof *done);
    if (!done) {
        DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n_faults; i++)
        done[i] = body[1 + i] != 0;
    dsim_train_cfg cc = *cfg;
    cc.restore = body[0] != 0;
    dsim_proc_attempt pa = *tmpl;
    pa.fault_done = done;
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        free(done);
        DSIM_ERR(DSIM_EIO, -1, "pipe: %s", strerror(errno));
        return -1;
    }
    pr_ring *ring = pr_ring_map(); /* NULL: the records go over the pipe */
    fflush(stdout);
    fflush(stderr);
    pr_agent_relaying = 1;
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        pr_agent_relaying = 0;
        close(pfd[0]);
        close(pfd[1]);
        pr_ring_unmap(ring);
        free(done);
        DSIM_ERR(DSIM_EIO, -1, "fork: %s", strerror(err));
        return -1;
    }
    if (pid == 0) {
        pr_child_prep(pfd[0]);
        close(chief_fd);
        pr_child_main(&cc, &pa, pfd[1], ring, lo, hi, "tcp", opts);
        _exit(99);
    }
    free(done);
    close(pfd[1]);
    fcntl(pfd[0], F_SETFL, fcntl(pfd[0], F_GETFL) | O_NONBLOCK);
    dsim_debug("dsim worker: task %d (ranks %d..%d) is pid %d", h->task, lo, hi, (int)pid);
    int rc = pr_agent_attempt(pid, pfd[0], ring, chief_fd);
    pr_ring_unmap(ring);
    if (!pr_agent_sig)
        pr_agent_relaying = 0;
    if (rc < 0)
        DSIM_ERR(DSIM_EPEER, 0, "the connection to the chief broke during the job");
    return rc;
}

/* The chief's probe of shared storage (dsim_mh_check_shared): reads the
 * file it names and sends back what it holds, or why it cannot be read. */
static void pr_agent_probe(int chief_fd, const unsigned char *body, uint32_t len)
{
    char path[4096], got[256] = "";
    size_t n = strnlen((const char *)body, len);
    if (n >= sizeof path || n == len) {
        pr_sock_send(chief_fd, PR_PROBED, "!malformed probe", 16);
        return;
    }
    memcpy(path, body, n + 1);
    FILE *f = fopen(path, "r");
    if (!f) {
        char cwd[160];
        snprintf(got, sizeof got, "!%.60s (working directory %.160s)", strerror(errno),
                 getcwd(cwd, sizeof cwd) ? cwd : "(longer than 160 bytes)");
    } else {
        size_t r = fread(got, 1, sizeof got - 1, f);
        got[r] = '\0';
        fclose(f);
    }
    if (got[0] == '!')
        fprintf(stderr,
                "dsim worker: the chief's checkpoint folder is not here: cannot read %s: %s; the "
                "checkpoint must be on storage every task reads at the same path\n",
                path, got + 1);
    pr_sock_send(chief_fd, PR_PROBED, got, strlen(got));
}

dsim_err dsim_proc_agent(const dsim_train_cfg *cfg, const dsim_fault *faults, size_t n_faults,
                         uint64_t seed, const dsim_proc_hosts *h, int chief_fd)
{
    int lo, hi;
    dsim_proc_task_ranks(cfg, h->task, &lo, &hi);
    char *opts = pr_agent_options(h, lo, hi);
    if (!opts)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory");
    dsim_proc_attempt tmpl = {.faults = faults, .n_faults = n_faults, .seed = seed};
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
        if (type == PC_PROBE) {
            pr_agent_probe(chief_fd, body, len);
            free(body);
            continue;
        }
        if (type != PC_START || len < 1 + n_faults) {
            free(body);
            continue; /* a signal between attempts: nothing runs */
        }
        int rc = pr_agent_start(cfg, &tmpl, body, h, chief_fd, opts);
        free(body);
        if (rc < 0)
            e = dsim_last_error()->code;
        if (rc <= 0)
            break;
    }
    free(opts);
    return e;
}
