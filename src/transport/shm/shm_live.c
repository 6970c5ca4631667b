/* shm: who is alive. A process that hosts ranks watches the processes that
 * host the others, through a pidfd each (Linux 5.3), in a thread of its
 * own; where pidfds are not to be had it looks every 100 ms instead. A
 * process is known by its pid and its start time (both in the mapping), so
 * a pid that the kernel has given to another process since is not taken
 * for the peer.
 *
 * When a peer's process ends, the progress thread hands over what that
 * peer left whole in the rings, then fails every receive from it and every
 * send to it with DSIM_EPEER, naming it: a survivor never waits for a dead
 * peer, and never sees half of one of its frames. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dsim/log.h"
#include "dsim/spi/rt.h"
#include "core/fiu_int.h"
#include "shm_int.h"

#define SHM_LOOK_MS 100

/* Reads /proc/PID/stat into buf and returns what follows the process's
 * name (" S ppid ...": the name in parentheses may hold anything, so from
 * the last ')'), or NULL. */
static const char *shm_proc_stat(pid_t pid, char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p ? p + 1 : NULL;
}

uint64_t shm_start_time(pid_t pid)
{
    char buf[1024];
    const char *p = shm_proc_stat(pid, buf, sizeof buf);
    if (!p)
        return 0;
    /* starttime is field 22; the state, field 3, follows the ')'. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (!p)
            return 0;
    }
    return strtoull(p + 1, NULL, 10);
}

static int shm_pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* A peer's process as the watcher knows it. */
typedef struct shm_peer {
    pid_t pid;
    int fd;      /* pidfd; -1 none yet; -2 none to be had (looked at instead) */
    int primary; /* the first rank of its process: the one whose fd is polled */
} shm_peer;

void shm_mark_dead(shm_fabric *sf, int r)
{
    int exp = 0;
    if (atomic_compare_exchange_strong(&sf->dead[r], &exp, 1))
        shm_bell_ring(sf, sf->lo);
}

static int shm_gone(shm_fabric *sf, int r, pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    uint64_t st = shm_start_time(pid);
    return st && st != sf->ranks[r].start;
}

/* Learns the process of rank r once it has one: 1 if known now. */
static int shm_learn(shm_fabric *sf, shm_peer *pe, int r)
{
    if (pe[r].pid)
        return 1;
    pid_t pid = (pid_t)atomic_load_explicit(&sf->ranks[r].pid, memory_order_acquire);
    if (!pid || atomic_load_explicit(&sf->ranks[r].state, memory_order_acquire) == SHM_RANK_FREE)
        return 0;
    pe[r].pid = pid;
    pe[r].primary = 1;
    for (int q = 0; q < r; q++)
        if (pe[q].pid == pid && pe[q].fd != -1) {
            pe[r].fd = pe[q].fd == -2 ? -2 : -3; /* -3: shares pe[q]'s pidfd */
            pe[r].primary = 0;
            return 1;
        }
    int fd = shm_pidfd_open(pid);
    if (fd < 0 && errno == ESRCH) {
        shm_mark_dead(sf, r);
        pe[r].fd = -2;
        return 1;
    }
    pe[r].fd = fd >= 0 ? fd : -2;
    /* The pidfd holds this very process: if it is the peer now, it was the
     * peer when the fd was opened. */
    if (shm_gone(sf, r, pid))
        shm_mark_dead(sf, r);
    return 1;
}

static void *shm_watch_main(void *arg)
{
    shm_fabric *sf = arg;
    int n = sf->nranks;
    dsim_rt_unbind_self(); /* not a worker: the scheduler places it */
    shm_peer *pe = calloc((size_t)n, sizeof *pe);
    struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
    int *who = calloc((size_t)n + 1, sizeof *who);
    if (!pe || !pf || !who) {
        dsim_error_log("shm: out of memory starting the watch on peer processes");
        free(pe);
        free(pf);
        free(who);
        return NULL;
    }
    for (int r = 0; r < n; r++)
        pe[r].fd = -1;
    for (;;) {
        int np = 0, look = 0;
        pf[np].fd = sf->watch_evfd;
        pf[np].events = POLLIN;
        who[np++] = -1;
        for (int r = 0; r < n; r++) {
            if (shm_is_local(sf, r) || atomic_load(&sf->dead[r]))
                continue;
            if (!shm_learn(sf, pe, r)) {
                look = 1;
                continue;
            }
            if (pe[r].fd == -2) {
                look = 1; /* no pidfd: looked at every SHM_LOOK_MS */
                continue;
            }
            if (pe[r].fd == -3)
                continue; /* its process's first rank's pidfd stands for it */
            pf[np].fd = pe[r].fd;
            pf[np].events = POLLIN;
            who[np++] = r;
        }
        int rc = poll(pf, (nfds_t)np, look ? SHM_LOOK_MS : -1);
        if (atomic_load(&sf->stop))
            break;
        if (rc < 0 && errno != EINTR) {
            dsim_error_log("shm: poll on peer processes failed: %s", strerror(errno));
            break;
        }
        if (pf[0].revents) {
            uint64_t v;
            if (read(sf->watch_evfd, &v, sizeof v) < 0 && errno != EAGAIN)
                break;
        }
        for (int i = 1; i < np; i++) {
            if (!pf[i].revents)
                continue;
            if (DSIM_FIU("dsim/shm/watch_late")) {
                struct timespec ts = {0, 300 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            for (int r = 0; r < n; r++)
                if (pe[r].pid == pe[who[i]].pid)
                    shm_mark_dead(sf, r);
        }
        for (int r = 0; r < n; r++)
            if (pe[r].pid && pe[r].fd == -2 && !atomic_load(&sf->dead[r]) &&
                shm_gone(sf, r, pe[r].pid))
                shm_mark_dead(sf, r);
    }
    for (int r = 0; r < n; r++)
        if (pe[r].fd >= 0)
            close(pe[r].fd);
    free(pe);
    free(pf);
    free(who);
    return NULL;
}

dsim_err shm_watch_start(shm_fabric *sf)
{
    sf->watch_evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (sf->watch_evfd < 0)
        return DSIM_ERR(DSIM_EIO, -1, "shm: cannot make an eventfd: %s", strerror(errno));
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&sf->watch, NULL, shm_watch_main, sf);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return DSIM_ERR(DSIM_ENOMEM, -1, "shm: cannot start the watch on peer processes: %s",
                        strerror(rc));
    sf->watch_started = 1;
    return DSIM_OK;
}

void shm_watch_stop(shm_fabric *sf)
{
    if (sf->watch_started) {
        atomic_store(&sf->stop, 1);
        uint64_t one = 1;
        if (write(sf->watch_evfd, &one, sizeof one) < 0)
            dsim_error_log("shm: cannot wake the watch thread: %s", strerror(errno));
        pthread_join(sf->watch, NULL);
        sf->watch_started = 0;
    }
    if (sf->watch_evfd >= 0)
        close(sf->watch_evfd);
    sf->watch_evfd = -1;
}

void shm_break_out_locked(shm_fabric *sf, shm_out *o, int peer, int blame, const char *msg)
{
    o->broken = 1;
    o->broken_blame = blame;
    snprintf(o->broken_msg, sizeof o->broken_msg, "%s", msg);
    while (o->qhead) {
        shm_item *it = o->qhead;
        o->qhead = it->next;
        if (it->req)
            shm_fail_send(sf, it->req, peer, blame, DSIM_EPEER, msg);
        free(it);
    }
    o->qtail = NULL;
    for (int i = 0; i < SHM_RNDV_SLOTS; i++)
        if (o->slot[i].req) {
            /* Its reader is gone: nobody touches the buffer again. A message
             * it read whole before it went (DONE, the sender not yet told)
             * was delivered: a peer that takes its last message and closes
             * at once must not fail the send of it. */
            shm_rndv *d = &o->pair->rndv[i];
            if (atomic_load_explicit(&d->state, memory_order_acquire) == SHM_RNDV_DONE) {
                atomic_store_explicit(&d->state, SHM_RNDV_FREE, memory_order_release);
                dsim_tp_complete(o->slot[i].req, DSIM_OK);
            } else {
                shm_fail_send(sf, o->slot[i].req, peer, blame, DSIM_EPEER, msg);
            }
            o->slot[i].req = NULL;
        }
    o->outstanding = 0;
}

static void shm_peer_gone(shm_fabric *sf, int r)
{
    pid_t pid = (pid_t)atomic_load(&sf->ranks[r].pid);
    uint32_t st = atomic_load(&sf->ranks[r].state);
    char msg[400];
    int blame = r;
    if (st == SHM_RANK_OPEN) {
        shm_count(sf, SHM_ST(peers_died), 1);
        snprintf(msg, sizeof msg,
                 "peer %d died: its process %d ended without closing its endpoint (killed or "
                 "crashed)",
                 r, (int)pid);
        if (!atomic_load_explicit(&sf->died_first, memory_order_relaxed)) {
            snprintf(sf->died_msg, sizeof sf->died_msg, "%.159s", msg);
            atomic_store_explicit(&sf->died_first, r + 1, memory_order_release);
        }
    } else if (atomic_load_explicit(&sf->died_first, memory_order_relaxed)) {
        /* It most likely ended because it saw that death: the failures
         * name the peer that died, the cause. */
        blame = atomic_load_explicit(&sf->died_first, memory_order_relaxed) - 1;
        snprintf(msg, sizeof msg,
                 "peer %d has gone: its process %d closed its endpoint and ended, after %s", r,
                 (int)pid, sf->died_msg);
    } else {
        snprintf(msg, sizeof msg, "peer %d has gone: its process %d closed its endpoint and ended",
                 r, (int)pid);
    }
    dsim_debug("shm: %s", msg);
    /* Sends first: a worker that wakes from a failed receive and sends to
     * the dead peer at once must fail too, not write into its ring. */
    for (int l = sf->lo; l <= sf->hi; l++) {
        shm_local *L = shm_local_of(sf, l);
        dsim_waitq_lock(L->sq);
        shm_break_out_locked(sf, &L->out[r], r, blame, msg);
        shm_out_update_locked(L, &L->out[r]);
        dsim_waitq_unlock(L->sq);
    }
    /* After a revoke every receive fails with the revoke's reason; news of
     * a death that followed it must not reach a waiter first. */
    int aborted = dsim_fabric_aborted(sf->f);
    for (int l = sf->lo; l <= sf->hi && !aborted; l++) {
        shm_in *in = &shm_local_of(sf, l)->in[r];
        /* What it left whole is delivered, as bytes on a wire before a
         * reset would be. */
        while (shm_consume(sf, r, l, in, 1 << 20) > 0)
            ;
        in->stuck = 1;
        in->bouncing = 0;
        dsim_ep *ep = dsim_tp_fabric_ep(sf->f, l);
        if (ep)
            dsim_tp_peer_lost_blaming(ep, r, blame, DSIM_EPEER, "%s", msg);
    }
}

/* Whether the process of remote rank r has ended (a zombie counts), though
 * its watcher may not have said so yet. */
static int shm_ended(shm_fabric *sf, int r)
{
    pid_t pid = (pid_t)atomic_load(&sf->ranks[r].pid);
    if (!pid || atomic_load(&sf->ranks[r].state) != SHM_RANK_OPEN)
        return 0;
    if (shm_gone(sf, r, pid))
        return 1;
    char buf[512];
    const char *p = shm_proc_stat(pid, buf, sizeof buf);
    return p && p[0] == ' ' && (p[1] == 'Z' || p[1] == 'X');
}

int shm_handle_deaths(shm_fabric *sf)
{
    if (!sf->any_remote)
        return 0;
    /* A peer that closed its endpoint and ended usually did so because
     * another died: if one such is flagged, every peer whose process has
     * ended unannounced is flagged now, and the deaths are handled before
     * the departures, so that the survivors' failures name the cause. */
    int clean = 0;
    for (int r = 0; r < sf->nranks && !clean; r++)
        clean = atomic_load_explicit(&sf->dead[r], memory_order_relaxed) == 1 &&
                atomic_load(&sf->ranks[r].state) != SHM_RANK_OPEN;
    if (clean)
        for (int r = 0; r < sf->nranks; r++)
            if (!shm_is_local(sf, r) && !atomic_load(&sf->dead[r]) && shm_ended(sf, r))
                shm_mark_dead(sf, r);
    int did = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < sf->nranks; r++) {
            int exp = 1;
            if (atomic_load_explicit(&sf->dead[r], memory_order_relaxed) != 1 ||
                (pass == 0) != (atomic_load(&sf->ranks[r].state) == SHM_RANK_OPEN) ||
                !atomic_compare_exchange_strong(&sf->dead[r], &exp, 2))
                continue;
            /* A process that revoked the fabric wrote its notice before it
             * ended: the notice, which names the peer that failed first, goes
             * before the news of its end. */
            shm_check_abort(sf);
            shm_peer_gone(sf, r);
            did = 1;
        }
    return did;
}
