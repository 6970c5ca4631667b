/* The engine table (engine.h): registration and lookup, and the engines
 * whose workers all live in this process (threads, sim). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dsim/rt.h"
#include "dsim/spi/rt.h"
#include "engine_int.h"
#include "sim.h"

#define ENG_MAX 8

static const dsim_engine_ops *eng_tab[ENG_MAX];
static int eng_n;
static pthread_mutex_t eng_mu = PTHREAD_MUTEX_INITIALIZER;

static dsim_err eng_register_locked(const dsim_engine_ops *ops)
{
    if (!ops || ops->size != sizeof(dsim_engine_ops))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "engine table has size %zu, expected %zu: rebuild the engine against "
                        "this version of sim/engine/engine.h",
                        ops ? ops->size : 0, sizeof(dsim_engine_ops));
    const char *missing = !ops->name      ? "name"
                          : !ops->summary ? "summary"
                          : !ops->runtime ? "runtime"
                          : !ops->prepare ? "prepare"
                          : !ops->train   ? "train"
                                          : NULL;
    if (missing)
        return DSIM_ERR(DSIM_EINVAL, -1, "engine '%s' lacks the required member '%s'",
                        ops->name ? ops->name : "(unnamed)", missing);
    for (int i = 0; i < eng_n; i++) {
        if (eng_tab[i] == ops)
            return DSIM_OK;
        if (strcmp(eng_tab[i]->name, ops->name) == 0)
            return DSIM_ERR(DSIM_EINVAL, -1, "an engine named '%s' is already registered",
                            ops->name);
    }
    if (eng_n == ENG_MAX)
        return DSIM_ERR(DSIM_ENOMEM, -1, "too many engines registered (at most %d)", ENG_MAX);
    eng_tab[eng_n++] = ops;
    return DSIM_OK;
}

static void eng_builtins_locked(void)
{
    if (eng_n > 0)
        return;
    (void)eng_register_locked(&dsim_engine_threads);
    (void)eng_register_locked(&dsim_engine_processes);
    (void)eng_register_locked(&dsim_engine_sim);
}

dsim_err dsim_engine_register(const dsim_engine_ops *ops)
{
    pthread_mutex_lock(&eng_mu);
    eng_builtins_locked();
    dsim_err e = eng_register_locked(ops);
    pthread_mutex_unlock(&eng_mu);
    return e;
}

const dsim_engine_ops *dsim_engine_at(int i)
{
    pthread_mutex_lock(&eng_mu);
    eng_builtins_locked();
    const dsim_engine_ops *ops = i >= 0 && i < eng_n ? eng_tab[i] : NULL;
    pthread_mutex_unlock(&eng_mu);
    return ops;
}

const char *dsim_engine_names(unsigned flags, bool ranks, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap)
        buf[0] = '\0';
    const dsim_engine_ops *ops;
    for (int i = 0; (ops = dsim_engine_at(i)) && n < cap; i++)
        if ((ops->flags & flags) == flags && (!ranks || ops->ranks))
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", ops->name);
    return buf;
}

dsim_err dsim_engine_find(const char *name, const dsim_engine_ops **out)
{
    if (!name)
        name = "threads";
    *out = NULL;
    const dsim_engine_ops *ops;
    for (int i = 0; (ops = dsim_engine_at(i)); i++)
        if (strcmp(ops->name, name) == 0) {
            *out = ops;
            return DSIM_OK;
        }
    char names[160];
    return DSIM_ERR(DSIM_ENOTSUP, -1, "engine %s is not supported by this build (accepted: %s)",
                    name, dsim_engine_names(0, false, names, sizeof names));
}

const dsim_engine_ops *dsim_engine_with(unsigned flags)
{
    const dsim_engine_ops *ops;
    for (int i = 0; (ops = dsim_engine_at(i)); i++)
        if ((ops->flags & flags) == flags)
            return ops;
    return NULL;
}

void dsim_engine_outcome_init(dsim_engine_outcome *o)
{
    memset(o, 0, sizeof *o);
    o->lost_rank = -1;
    o->t_loss = -1;
}

void dsim_engine_outcome_free(dsim_engine_outcome *o)
{
    if (!o)
        return;
    free(o->events);
    free(o->fault_fired);
    memset(o, 0, sizeof *o);
}

int dsim_engine_listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        errno = err;
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* ---- engines whose workers all live here ---- */

dsim_err dsim_engine_error(dsim_err e, int peer, const char *what)
{
    dsim_error er;
    dsim_error_copy(&er);
    return dsim_set_error(e, peer, __FILE__, __LINE__, "%s: %s", what, er.msg);
}

/* The job on `runtime` in this process, under the attempt's fault layer. */
dsim_err dsim_engine_train_here(const char *runtime, const dsim_train_cfg *cfg,
                                const dsim_engine_attempt *a, dsim_train_result *res,
                                dsim_engine_outcome *out)
{
    dsim_engine_outcome_init(out);
    dsim_train_cfg cc = *cfg;
    cc.engine = runtime;
    if (a && a->fs)
        dsim_faults_attach(a->fs, &cc);
    dsim_err e = dsim_train(&cc, res);
    if (a && a->fs && res->preempted)
        dsim_faults_preempted(a->fs, res->preempted_at);
    return e;
}

/* One rank's part of one round, as a worker of the runtime. */
typedef struct eng_rank_arg {
    const dsim_engine_ranks *job;
    dsim_ep *ep;
    int rank, round;
    void *result;
} eng_rank_arg;

static void eng_rank_main(void *p)
{
    eng_rank_arg *a = p;
    a->job->rank_main(a->ep, a->rank, a->round, a->result, a->job->user);
}

/* Every rank a worker of `runtime` in this process, one fabric for every
 * round. */
dsim_err dsim_engine_ranks_here(const char *runtime, const dsim_engine_ranks *job)
{
    int n = job->nranks;
    if (n < 1 || !job->rank_main || !job->on_round || job->rounds < 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "a rank program needs >= 1 rank, rank_main and on_round");
    dsim_rt *rt = NULL;
    dsim_fabric *fab = NULL;
    dsim_ep **eps = calloc((size_t)n, sizeof *eps);
    eng_rank_arg *args = calloc((size_t)n, sizeof *args);
    dsim_task **tasks = calloc((size_t)n, sizeof *tasks);
    unsigned char *results = calloc((size_t)n, job->result_size ? job->result_size : 1);
    dsim_err e = eps && args && tasks && results
                     ? dsim_rt_create(runtime, &rt)
                     : DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for %d ranks", n);
    if (e == DSIM_OK) {
        dsim_fabric_cfg fcfg = {
            .backend = job->transport ? job->transport : "inproc", .nranks = n, .rt = rt};
        e = dsim_fabric_open(&fcfg, &fab);
        if (e != DSIM_OK)
            e = dsim_engine_error(e, -1, "could not open the fabric");
    }
    for (int r = 0; r < n && e == DSIM_OK; r++)
        if ((e = dsim_ep_open(fab, r, &eps[r])) != DSIM_OK)
            e = dsim_engine_error(e, r, "could not open the endpoint of a rank");
    int host_prev = dsim_rt_host_workers();
    dsim_rt_set_host_workers(n); /* ranks that fill the CPUs bind to one each */
    for (int round = 0; round < job->rounds && e == DSIM_OK; round++) {
        memset(results, 0, (size_t)n * job->result_size);
        int spawned = 0;
        for (int r = 0; r < n; r++) {
            args[r] = (eng_rank_arg){.job = job,
                                     .ep = eps[r],
                                     .rank = r,
                                     .round = round,
                                     .result = results + (size_t)r * job->result_size};
            if ((e = dsim_rt_spawn(rt, r, eng_rank_main, &args[r], &tasks[r])) != DSIM_OK) {
                e = dsim_engine_error(e, r, "could not start the worker of a rank");
                dsim_fabric_abort(fab, r, "the rank program could not start every worker");
                break;
            }
            spawned++;
        }
        for (int r = 0; r < spawned; r++)
            dsim_rt_join(rt, tasks[r]);
        if (e == DSIM_OK && job->on_round(round, results, job->user) != 0)
            break;
    }
    for (int r = 0; eps && r < n; r++)
        if (eps[r])
            dsim_ep_close(eps[r]);
    dsim_rt_set_host_workers(host_prev);
    if (fab)
        dsim_fabric_close(fab);
    if (rt)
        dsim_rt_destroy(rt);
    free(eps);
    free(args);
    free(tasks);
    free(results);
    return e;
}

static dsim_err threads_prepare(void)
{
    return DSIM_OK; /* libdsim's own runtime */
}

static dsim_err threads_train(const dsim_train_cfg *cfg, const dsim_engine_attempt *a,
                              dsim_train_result *res, dsim_engine_outcome *out)
{
    return dsim_engine_train_here("threads", cfg, a, res, out);
}

static dsim_err threads_ranks(const dsim_engine_ranks *job)
{
    return dsim_engine_ranks_here("threads", job);
}

const dsim_engine_ops dsim_engine_threads = {
    .size = sizeof(dsim_engine_ops),
    .name = "threads",
    .summary = "every worker a thread of this process, on wall-clock time",
    .flags = DSIM_ENGINE_ONE_SPACE | DSIM_ENGINE_INPROC | DSIM_ENGINE_TCP |
             DSIM_ENGINE_THREAD_PER_REPLICA,
    .runtime = "threads",
    .prepare = threads_prepare,
    .train = threads_train,
    .ranks = threads_ranks,
};

static dsim_err sim_prepare(void)
{
    return dsim_sim_engine_register();
}

static dsim_err sim_train(const dsim_train_cfg *cfg, const dsim_engine_attempt *a,
                          dsim_train_result *res, dsim_engine_outcome *out)
{
    dsim_err e = sim_prepare();
    if (e != DSIM_OK) {
        dsim_engine_outcome_init(out);
        memset(res, 0, sizeof *res);
        return e;
    }
    return dsim_engine_train_here("sim", cfg, a, res, out);
}

const dsim_engine_ops dsim_engine_sim = {
    .size = sizeof(dsim_engine_ops),
    .name = "sim",
    .summary = "every worker a coroutine on one thread under a virtual clock; deterministic "
               "(dsim replay, dsim explore)",
    .flags = DSIM_ENGINE_VIRTUAL_TIME | DSIM_ENGINE_DETERMINISTIC | DSIM_ENGINE_ONE_SPACE |
             DSIM_ENGINE_INPROC,
    .runtime = "sim",
    .prepare = sim_prepare,
    .train = sim_train,
    /* no ranks: timing a rank program on a virtual clock measures the
     * model, not this machine */
};
