/* dsim worker: one task of a job over machines (sim/engine/multihost.h).
 *
 * Where the task comes from, first found wins:
 *   1. TF_CONFIG (as `dsim cluster` resolves it): by hand, Kubernetes
 *      (TFJob sets it), any launcher that sets it;
 *   2. a launcher's rank and size: Open MPI's mpirun (OMPI_COMM_WORLD_RANK/
 *      SIZE), MPICH/Hydra and others (PMI_RANK/SIZE), Slurm's srun
 *      (SLURM_PROCID/NTASKS). The addresses are then built the same way on
 *      every task from --hosts (one host per task in rank order, a single
 *      host for all, or @FILE with one host a line, e.g. `scontrol show
 *      hostnames` output; default 127.0.0.1 when the launcher says every
 *      task is on one node) and --port: task i listens from port + i x
 *      (devices_per_host + 1). Rank 0 is the chief (worker 0), the next
 *      hosts-1 ranks the workers, the rest the parameter servers. That is
 *      the TF_CONFIG the task would have had; --print-tf-config shows it.
 * The chief writes the store and prints the table; the others print what
 * they wait for and end when the chief says the job is over. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmds.h"
#include "dsim_cov.h"
#include "dsim/cluster.h"
#include "dsim/log.h"
#include "engine/multihost.h"
#include "harness.h"
#include "scenario/scenario.h"

void cmd_worker_help(FILE *out)
{
    fprintf(out, "usage: dsim worker SCENARIO [--db PATH] [--secret-file PATH] [--hosts LIST]\n"
                 "                   [--port N] [--timeout SECONDS] [--plugin-dir DIR]\n"
                 "                   [--print-tf-config] [--reshape]\n"
                 "\n"
                 "Runs one task of a multi-machine job: start one per host (TF_CONFIG), or all\n"
                 "at once under a launcher (mpirun -np N dsim worker ..., srun dsim worker ...).\n"
                 "Every task needs the same scenario file and the same secret. The chief (worker\n"
                 "0) gathers every task's results, judges the checks and stores one run;\n"
                 "its exit status is dsim run's (0 passed, 1 a check failed, 2 bad input);\n"
                 "the others exit 0 when the job ran to its end.\n"
                 "\n"
                 "  --db PATH          results store, on the chief (default dsim.db)\n"
                 "  --secret-file PATH the cluster secret (default: $DSIM_CLUSTER_SECRET; none:\n"
                 "                     connections are not authenticated)\n"
                 "  --hosts LIST       under a launcher: host of each task in rank order\n"
                 "                     (h0,h1,...), one host for all, or @FILE (a host a line)\n"
                 "  --port N           under a launcher: first port (default 2222); task i uses\n"
                 "                     N + i*(devices_per_host+1) and up\n"
                 "  --timeout SECONDS  how long the group may take to form (default 120)\n"
                 "  --plugin-dir DIR   look for the scenario's strategy plugin (a bare file\n"
                 "                     name) in DIR first, then $DSIM_PLUGIN_PATH and the\n"
                 "                     installed plugins, as dsim run does; every task loads\n"
                 "                     the same plugin\n"
                 "  --print-tf-config  print the TF_CONFIG this task resolves to, and exit\n"
                 "  --reshape          run on another number of worker tasks than the\n"
                 "                     scenario's hosts (dividing its replicas): another job,\n"
                 "                     whose data distribution and result differ\n"
                 "\n"
                 "Each task is one TF worker: one host of the scenario, its devices and its own\n"
                 "input pipeline; a scenario of H hosts (and P parameter servers) takes H + P\n"
                 "tasks, and then ends bit-identical to dsim run.\n"
                 "\n"
                 "A task with D devices at HOST:PORT listens on PORT..PORT+D-1 (one port a\n"
                 "rank) and the chief also on PORT+D for the results: space the ports of tasks\n"
                 "that share a host by at least D+1.\n");
}

typedef struct wk_opts {
    const char *file, *db, *secret, *hosts, *tf_out;
    int port;
    double timeout_s;
    bool print_tf;
    bool reshape; /* --reshape: run another number of worker tasks as another job */
} wk_opts;

/* The launcher's rank and size, or -1 when none set them. */
static int wk_launcher(int *rank, int *size, const char **who, int *one_node)
{
    static const char *const names[][4] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"PMI_RANK", "PMI_SIZE", "a PMI launcher (MPICH, Intel MPI)", "MPI_LOCALNRANKS"},
        {"SLURM_PROCID", "SLURM_NTASKS", "srun (Slurm)", "SLURM_NNODES"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *r = getenv(names[i][0]), *s = getenv(names[i][1]);
        if (!r || !s)
            continue;
        char *e1 = NULL, *e2 = NULL;
        long rv = strtol(r, &e1, 10), sv = strtol(s, &e2, 10);
        if (!*r || !*s || *e1 || *e2 || sv < 1 || rv < 0 || rv >= sv) {
            fprintf(stderr, "dsim worker: %s=%s and %s=%s are not a rank below a size\n",
                    names[i][0], r, names[i][1], s);
            return -2;
        }
        *rank = (int)rv;
        *size = (int)sv;
        *who = names[i][2];
        const char *ln = getenv(names[i][3]);
        /* SLURM_NNODES counts nodes; the others count this node's tasks */
        *one_node = ln && (i == 2 ? atol(ln) == 1 : atol(ln) == sv);
        return 0;
    }
    return -1;
}

/* The i-th host of --hosts (a list, one host, or @FILE). */
static int wk_host(const wk_opts *o, int i, int n, char *out, size_t cap)
{
    char *list = NULL;
    if (o->hosts[0] == '@') {
        FILE *f = fopen(o->hosts + 1, "r");
        if (!f) {
            fprintf(stderr, "dsim worker: --hosts %s: cannot open it: %s\n", o->hosts,
                    strerror(errno));
            return -1;
        }
        size_t cap2 = 0, len = 0;
        char line[512];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, " \t\r\n#")] = '\0';
            if (!*line)
                continue;
            size_t l = strlen(line);
            char *nl = realloc(list, cap2 = len + l + 2);
            if (!nl) {
                free(list);
                fclose(f);
                return -1;
            }
            list = nl;
            snprintf(list + len, cap2 - len, "%s%s", len ? "," : "", line);
            len += l + (len ? 1 : 0);
        }
        fclose(f);
        if (!list) {
            fprintf(stderr, "dsim worker: --hosts %s lists no host\n", o->hosts);
            return -1;
        }
    } else {
        list = strdup(o->hosts);
        if (!list)
            return -1;
    }
    int count = 1;
    for (const char *p = list; *p; p++)
        count += *p == ',';
    if (count != 1 && count != n) {
        fprintf(stderr,
                "dsim worker: --hosts names %d hosts but the job has %d tasks; give one host per "
                "task in rank order, or a single host for all\n",
                count, n);
        free(list);
        return -1;
    }
    char *save = NULL, *tok = strtok_r(list, ",", &save);
    for (int k = 0; k < (count == 1 ? 0 : i) && tok; k++)
        tok = strtok_r(NULL, ",", &save);
    if (!tok || !*tok) {
        fprintf(stderr, "dsim worker: --hosts '%s' has an empty entry\n", o->hosts);
        free(list);
        return -1;
    }
    snprintf(out, cap, "%s", tok);
    free(list);
    return 0;
}

/* TF_CONFIG text for a launcher's rank, or NULL after a message. */
static char *wk_tf_from_launcher(const wk_opts *o, const dsim_train_cfg *cfg, int rank, int size,
                                 const char *who, int one_node)
{
    int T = cfg->hosts + cfg->num_ps;
    if (size != T) {
        const char *how = strstr(who, "srun")  ? "srun -n"
                          : strstr(who, "PMI") ? "mpiexec -n"
                                               : "mpirun -np";
        fprintf(stderr,
                "dsim worker: %s started %d task(s) but the scenario needs %d (cluster.hosts %d "
                "+ %d parameter server(s)); start it with %s %d\n",
                who, size, T, cfg->hosts, cfg->num_ps, how, T);
        return NULL;
    }
    if (!o->hosts && !one_node) {
        fprintf(stderr,
                "dsim worker: %s placed the tasks on more than one node and dsim cannot learn "
                "their addresses from it; give --hosts h0,h1,... (or @FILE) in rank order\n",
                who);
        return NULL;
    }
    size_t cap = 64 + (size_t)T * 300;
    char *w = calloc(1, cap), *p = calloc(1, cap), *json = malloc(2 * cap + 128);
    if (!w || !p || !json) {
        free(w);
        free(p);
        free(json);
        return NULL;
    }
    size_t wu = 0, pu = 0;
    for (int k = 0; k < T; k++) {
        char host[256] = "127.0.0.1";
        if (o->hosts && wk_host(o, k, T, host, sizeof host) != 0) {
            free(w);
            free(p);
            free(json);
            return NULL;
        }
        long port = (long)o->port + (long)k * (cfg->devices_per_host + 1);
        if (port > 65535 - cfg->devices_per_host) {
            fprintf(stderr, "dsim worker: --port %d leaves task %d past port 65535\n", o->port, k);
            free(w);
            free(p);
            free(json);
            return NULL;
        }
        const char *br = strchr(host, ':') ? "[" : "", *bc = strchr(host, ':') ? "]" : "";
        if (k < cfg->hosts)
            wu += (size_t)snprintf(w + wu, cap - wu, "%s\"%s%s%s:%ld\"", wu ? "," : "", br, host,
                                   bc, port);
        else
            pu += (size_t)snprintf(p + pu, cap - pu, "%s\"%s%s%s:%ld\"", pu ? "," : "", br, host,
                                   bc, port);
    }
    snprintf(json, 2 * cap + 128,
             "{\"cluster\":{\"worker\":[%s]%s%s%s},\"task\":{\"type\":\"%s\",\"index\":%d}}", w,
             pu ? ",\"ps\":[" : "", p, pu ? "]" : "", rank < cfg->hosts ? "worker" : "ps",
             rank < cfg->hosts ? rank : rank - cfg->hosts);
    free(w);
    free(p);
    return json;
}

static int wk_parse(int argc, char **argv, wk_opts *o)
{
    o->port = 2222;
    o->timeout_s = 120;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if ((v = dsim_cli_flag(argc, argv, &i, "--db", &missing))) {
            o->db = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--secret-file", &missing))) {
            o->secret = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--hosts", &missing))) {
            o->hosts = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--port", &missing))) {
            char *end = NULL;
            long p = strtol(v, &end, 10);
            if (!*v || *end || p < 1 || p > 65535) {
                fprintf(stderr, "dsim worker: --port is '%s' (accepted: 1..65535)\n", v);
                return 2;
            }
            o->port = (int)p;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--plugin-dir", &missing))) {
            /* searched before $DSIM_PLUGIN_PATH when the scenario is loaded */
            struct stat sb;
            if (stat(v, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
                fprintf(stderr, "dsim worker: --plugin-dir is '%s' (accepted: a directory)\n", v);
                return 2;
            }
            if (dsim_cli_plugin_dir("worker", v))
                return 2;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--timeout", &missing))) {
            char *end = NULL;
            double t = strtod(v, &end);
            if (!*v || *end || !(t > 0) || t > 86400) {
                fprintf(stderr,
                        "dsim worker: --timeout is '%s' (accepted: seconds, 0 < T <= "
                        "86400)\n",
                        v);
                return 2;
            }
            o->timeout_s = t;
        } else if (missing) {
            fprintf(stderr, "dsim worker: %s needs a value; see 'dsim worker --help'\n", a);
            return 2;
        } else if (strcmp(a, "--print-tf-config") == 0) {
            o->print_tf = true;
        } else if (strcmp(a, "--reshape") == 0) {
            o->reshape = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dsim worker: unknown option '%s'; see 'dsim worker --help'\n", a);
            return 2;
        } else if (o->file) {
            fprintf(stderr, "dsim worker: one scenario per job ('%s' and '%s' given)\n", o->file,
                    a);
            return 2;
        } else {
            o->file = a;
        }
    }
    if (!o->file) {
        fprintf(stderr, "dsim worker: give the scenario file, the same on every task\n");
        return 2;
    }
    return 0;
}

/* The worker tasks against the scenario's hosts. A task is a TF worker,
 * one host of the scenario with its devices: each worker has its own input
 * pipeline (the dataset's files and examples are dealt out per worker), so
 * a 2 x 2 scenario run as four single-device tasks would be another job,
 * reading other examples on each replica, with another answer than
 * `dsim run`. So w != hosts is refused with the launch line that gives the
 * scenario's job; --reshape runs the other shape (w tasks of R/w devices,
 * w dividing the R replicas), saying before the run that it is another
 * job. Every task decides alike (same scenario, same cluster). */
static int wk_reshape(dsim_scenario *s, int w, const char *whence, bool reshape, const char *file)
{
    dsim_train_cfg *cfg = &s->train;
    if (w == cfg->hosts)
        return 0;
    int R = cfg->hosts * cfg->devices_per_host;
    if (!reshape) {
        int n = cfg->hosts + cfg->num_ps;
        /* the launch line of the launcher in use first */
        bool srun = strstr(whence, "srun") != NULL;
        fprintf(stderr,
                "dsim worker: %s has %d worker task(s), the scenario %d host(s) x %d device(s): "
                "each task is one TF worker (one host, its devices and its own input pipeline), "
                "so start %d task(s)%s: %s %d dsim worker %s (%s %d ..., or a "
                "TF_CONFIG of %d worker(s)); --reshape runs %d task(s) as another job, whose "
                "data is dealt over %d input pipelines and whose result is not dsim run's\n",
                whence, w, cfg->hosts, cfg->devices_per_host, n,
                cfg->num_ps ? " (the parameter servers included)" : "",
                srun ? "srun -n" : "mpirun -np", n, file, srun ? "mpirun -np" : "srun -n", n,
                cfg->hosts, w, w);
        return 2;
    }
    if (w < 1 || R % w != 0) {
        fprintf(stderr,
                "dsim worker: %s has %d worker task(s) but the scenario's %d replicas (%d hosts x "
                "%d devices) cannot be split evenly over them; use a divisor of %d, or change "
                "cluster: in the scenario\n",
                whence, w, R, cfg->hosts, cfg->devices_per_host, R);
        return 2;
    }
    int hosts = cfg->hosts, dph = cfg->devices_per_host;
    cfg->hosts = w;
    cfg->devices_per_host = R / w;
    /* the other shape must suit the strategy too (mirrored: one host) */
    if (dsim_scenario_check_shape(s) != DSIM_OK) {
        fprintf(stderr,
                "dsim worker: --reshape: %s has %d worker task(s), and the scenario's %d hosts x "
                "%d devices run as %d x %d cannot run: %s; start %d task(s) instead\n",
                whence, w, hosts, dph, w, R / w, dsim_errmsg(), hosts + cfg->num_ps);
        return 2;
    }
    fprintf(stderr,
            "dsim worker: --reshape: %s has %d worker task(s); the scenario's %d hosts x %d "
            "devices run as %d x %d: the same %d replicas but ANOTHER JOB (%d input pipelines "
            "instead of %d, other examples on each replica), whose losses and parameters differ "
            "from dsim run %s\n",
            whence, w, hosts, dph, w, R / w, R, w, hosts, file);
    return 0;
}

/* ---- interrupts ----
 *
 * On the chief, SIGINT and SIGTERM are taken by a thread of their own, as
 * in dsim run: every other task is told the job is over (its agent kills
 * its child and exits), the run in progress is stored as unfinished, and
 * the chief exits 130 (SIGINT) or 143 (SIGTERM). Another task that is
 * interrupted tells the chief (dsim_proc_agent_interrupt), which then ends
 * the job the same way, and exits 128 + its signal itself. */
static dsim_mh *wk_mh; /* the chief's group, once formed */
static pthread_mutex_t wk_mh_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *wk_db;

static void *wk_sig_main(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    if (sigwait(set, &sig) != 0)
        return NULL;
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
    pthread_mutex_lock(&wk_mh_lock);
    if (wk_mh)
        dsim_mh_bye(wk_mh);
    dsim_run_id ids[8];
    size_t n = dsim_harness_shutdown(NULL, ids, 8);
    if (n > 0)
        fprintf(stderr,
                "\ndsim worker: interrupted (%s); every task told to stop; run %" PRId64
                " stored as unfinished in %s\n",
                name, (int64_t)ids[0], wk_db ? wk_db : "the results store");
    else
        fprintf(stderr, "\ndsim worker: interrupted (%s)%s; no run was in progress\n", name,
                wk_mh ? "; every task told to stop" : "");
    DSIM_COV_DUMP();
    _exit(128 + sig);
    return NULL;
}

/* The chief: before any thread exists, so that every thread (and the
 * children, until they ignore them) inherits the mask. */
static void wk_signals_chief(void)
{
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_t t;
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0 ||
        dsim_thread_start(&t, NULL, wk_sig_main, &set) != 0) {
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        fprintf(stderr, "dsim worker: cannot watch for interrupts; an interrupted run stays "
                        "'running' until the store is next opened\n");
        return;
    }
    pthread_detach(t);
}

static void wk_agent_handler(int sig)
{
    dsim_proc_agent_interrupt(sig);
}

static void wk_signals_agent(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = wk_agent_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int cmd_worker(int argc, char **argv)
{
    wk_opts o = {0};
    int rc = wk_parse(argc, argv, &o);
    if (rc)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(o.file, &s) != DSIM_OK) {
        fprintf(stderr, "dsim worker: %s\n", dsim_errmsg());
        return 2;
    }
    const dsim_engine_ops *over = dsim_engine_with(DSIM_ENGINE_HOSTS);
    dsim_harness_opts ho = {.size = sizeof ho, .engine_override = over ? over->name : NULL};
    if (dsim_harness_prepare(s, &ho) != DSIM_OK) {
        fprintf(stderr, "dsim worker: %s\n", dsim_errmsg());
        dsim_scenario_free(s);
        return 2;
    }
    const dsim_train_cfg *cfg = &s->train;
    /* The task: TF_CONFIG, else the launcher's rank. */
    char *tf = NULL;
    const char *env = getenv("TF_CONFIG");
    int rank = 0, size = 0, one_node = 0;
    const char *who = NULL;
    if (env && *env) {
        tf = strdup(env);
    } else {
        int l = wk_launcher(&rank, &size, &who, &one_node);
        if (l == -1) {
            fprintf(stderr,
                    "dsim worker: TF_CONFIG is not set and no launcher's rank is (mpirun, srun); "
                    "set TF_CONFIG for each task (see 'dsim cluster') or start the tasks "
                    "under a launcher\n");
            dsim_scenario_free(s);
            return 2;
        }
        if (l == 0 && size > cfg->num_ps &&
            wk_reshape(s, size - cfg->num_ps, who, o.reshape, o.file) != 0) {
            dsim_scenario_free(s);
            return 2;
        }
        if (l == 0)
            tf = wk_tf_from_launcher(&o, cfg, rank, size, who, one_node);
        if (!tf) {
            dsim_scenario_free(s);
            return 2;
        }
    }
    dsim_cluster c;
    if (tf && dsim_cluster_from_tf_config(tf, cfg->devices_per_host, &c) == DSIM_OK) {
        rc = c.task_type == DSIM_TASK_EVALUATOR
                 ? 0
                 : wk_reshape(s, c.num_workers, "TF_CONFIG", o.reshape, o.file);
        dsim_cluster_free(&c);
        if (rc) {
            free(tf);
            dsim_scenario_free(s);
            return rc;
        }
    }
    if (!tf || dsim_cluster_from_tf_config(tf, cfg->devices_per_host, &c) != DSIM_OK) {
        fprintf(stderr, "dsim worker: %s\n", tf ? dsim_errmsg() : "out of memory");
        free(tf);
        dsim_scenario_free(s);
        return 2;
    }
    if (o.print_tf) {
        printf("%s\n", tf);
        free(tf);
        dsim_cluster_free(&c);
        dsim_scenario_free(s);
        return 0;
    }
    dsim_mh_opts mo = {
        .scenario_text = s->text,
        .scenario_len = s->text ? strlen(s->text) : 0,
        .secret_file = o.secret,
        .timeout_ns = (int64_t)(o.timeout_s * 1e9),
        .progress = stderr,
    };
    bool chief = c.is_chief != 0;
    wk_db = o.db ? o.db : "dsim.db";
    if (chief)
        wk_signals_chief();
    else
        wk_signals_agent();
    dsim_mh mh;
    dsim_err e = dsim_mh_open(&c, cfg, &mo, &mh);
    if (e == DSIM_OK) {
        fprintf(stderr, "dsim worker: task %d of %d (%s %d%s%s), scenario %s\n", mh.hosts.task,
                mh.n_tasks, dsim_task_type_name(c.task_type), c.task_index, who ? ", from " : "",
                who ? who : "", o.file);
        e = dsim_mh_rendezvous(&mh);
    }
    /* a checkpoint to resume from must be the same file for every task */
    if (e == DSIM_OK && mh.is_chief && cfg->checkpoint_path &&
        (cfg->checkpoint_every || (s->recovery && strcmp(s->recovery, "restart") == 0))) {
        e = dsim_mh_check_shared(&mh, cfg->checkpoint_path);
        if (e != DSIM_OK)
            dsim_mh_bye(&mh);
    }
    if (e != DSIM_OK) {
        fprintf(stderr, "dsim worker: %s\n", dsim_errmsg());
        rc = e == DSIM_EINVAL ? 2 : 1;
    } else if (!mh.is_chief) {
        e = dsim_proc_agent(cfg, s->faults, s->n_faults, cfg->seed, &mh.hosts, mh.chief_fd);
        if (dsim_proc_agent_signal()) {
            fprintf(stderr, "dsim worker: task %d: interrupted; the chief ended the job\n",
                    mh.hosts.task);
            rc = 128 + dsim_proc_agent_signal();
        } else if (e != DSIM_OK) {
            fprintf(stderr, "dsim worker: task %d: %s\n", mh.hosts.task, dsim_errmsg());
            rc = 1;
        } else {
            fprintf(stderr, "dsim worker: task %d: the job is over\n", mh.hosts.task);
        }
    } else {
        const char *db = o.db ? o.db : "dsim.db";
        printf("%s (%s): %s, %d host%s x %d device%s, %d dsim worker task(s), seed %llu\n", s->name,
               o.file, cfg->strategy, cfg->hosts, cfg->hosts == 1 ? "" : "s", cfg->devices_per_host,
               cfg->devices_per_host == 1 ? "" : "s", mh.n_tasks, (unsigned long long)s->seed);
        fflush(stdout);
        pthread_mutex_lock(&wk_mh_lock);
        wk_mh = &mh;
        pthread_mutex_unlock(&wk_mh_lock);
        dsim_harness_opts run = {.size = sizeof run, .db_path = db, .hosts = &mh.hosts};
        dsim_harness_result rep;
        (void)dsim_harness_run(s, &run, &rep);
        pthread_mutex_lock(&wk_mh_lock);
        dsim_mh_bye(&mh);
        wk_mh = NULL;
        pthread_mutex_unlock(&wk_mh_lock);
        if (rep.note[0])
            fprintf(stderr, "dsim worker: %s: %s\n", o.file, rep.note);
        dsim_cli_print_run(o.file, s, &rep, db);
        rc = rep.harness_error ? 2 : (rep.status == DSIM_RUN_PASSED && !rep.n_failed) ? 0 : 1;
        dsim_harness_result_free(&rep);
    }
    dsim_mh_close(&mh);
    free(tf);
    dsim_cluster_free(&c);
    dsim_scenario_free(s);
    return rc;
}
