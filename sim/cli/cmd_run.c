/* dsim run: run scenarios, judge them with their checks, store everything.
 *
 * For each scenario file: load and validate it (all of them before anything
 * runs, so a typo in the third file costs no time), open the results store,
 * begin a run row, train under the scenario's strategy with an observer that
 * queues one step row per replica per step and keeps a progress line, replay
 * the same global batches on one device when a check needs it, judge the
 * expect list, store the checks and metrics, end the run row, print the
 * table.
 *
 * Plugins: a scenario's strategy.plugin is a path relative to the scenario
 * file, or a bare file name searched in --plugin-dir, $DSIM_PLUGIN_PATH and
 * this build's plugin directories; it is found when the file is loaded; the plugin is loaded before
 * the run row is begun, so a plugin that cannot be loaded is bad input (exit 2).
 *
 * Interrupts: SIGINT and SIGTERM are taken by a thread of their own; it
 * waits for the store calls in flight, closes the store (which marks the
 * run 'unfinished' and keeps every row committed so far) and exits with
 * 130 (SIGINT) or 143 (SIGTERM). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "check/check.h"
#include "cmds.h"
#include "dsim/comm.h"
#include "dsim/data.h"
#include "dsim/dataset.h"
#include "dsim/err.h"
#include "dsim/strategy.h"
#include "dsim_config.h"
#include "scenario/scenario.h"
#include "store.h"

#define RUN_DEFAULT_SCENARIO "scenarios/quickstart.yaml"
#define RUN_TTY_REFRESH_NS   (100LL * 1000 * 1000)
#define RUN_PLAIN_LINES      10 /* progress lines per run when stdout is not a terminal */

void cmd_run_help(FILE *out)
{
    fprintf(out,
            "usage: dsim run [SCENARIO...] [--engine E] [--seed N] [--db PATH] [--plugin-dir DIR]\n"
            "                [--json]\n"
            "\n"
            "Runs each scenario file (default: %s), judges the run with\n"
            "the checks of the file's expect: section, stores it in the results store and\n"
            "prints a table of the checks: measured vs expected, PASS/FAIL, and a sentence\n"
            "saying what to look at. 'dsim list checks' shows every check's thresholds.\n"
            "\n"
            "  --engine E        override the scenario's engine: threads, processes, sim\n"
            "                    (this build runs threads)\n"
            "  --seed N          override the scenario's seed (0 .. 2^64-1): model init,\n"
            "                    data and shuffling\n"
            "  --db PATH         the results store (default %s in the working directory)\n"
            "  --plugin-dir DIR  look for strategy plugins named by a bare file name in DIR\n"
            "                    first (then $DSIM_PLUGIN_PATH, then this build's plugins)\n"
            "  --json            print a machine-readable summary on stdout instead of the\n"
            "                    table (progress goes to stderr when it is a terminal)\n"
            "\n"
            "Progress: on a terminal one line rewritten in place (step, loss, examples/s);\n"
            "otherwise about %d plain lines per run.\n"
            "\n"
            "Exit status: 0 every check of every scenario met its expectation (a check the\n"
            "scenario expects to fail must fail), 1 a check did not, 2 bad input (a scenario\n"
            "that does not parse or cannot run in this build, a bad option, a results store\n"
            "that cannot be opened or written). 130 when interrupted; the run is then\n"
            "stored as 'unfinished'.\n",
            RUN_DEFAULT_SCENARIO, DSIM_STORE_DEFAULT_PATH, RUN_PLAIN_LINES);
}

/* ---- the store, guarded for the interrupt thread ---- */

/* Every store call holds run_store_lock for reading; the interrupt thread
 * takes it for writing, so it closes the store only between calls. */
static pthread_rwlock_t run_store_lock;
static dsim_store *run_store;
static atomic_bool run_interrupted;

static pthread_t run_sig_thread;
static bool run_sig_started;

static void *run_sig_main(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    if (sigwait(set, &sig) != 0)
        return NULL;
    atomic_store(&run_interrupted, true);
    fprintf(stderr, "\ndsim run: interrupted; storing the run as unfinished\n");
    pthread_rwlock_wrlock(&run_store_lock);
    if (run_store)
        dsim_store_close(run_store);
    run_store = NULL;
    _exit(128 + sig);
    return NULL;
}

static bool run_signals_start(void)
{
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* the interrupt must not starve behind a stream of step rows */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&run_store_lock, &ra);
    pthread_rwlockattr_destroy(&ra);

    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    /* Blocked here, before any thread exists, so every thread (store writer,
     * workers) inherits the mask and only run_sig_main takes the signal. */
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return false;
    if (pthread_create(&run_sig_thread, NULL, run_sig_main, &set) != 0) {
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        return false;
    }
    run_sig_started = true;
    return true;
}

static void run_signals_stop(void)
{
    if (run_sig_started) {
        pthread_cancel(run_sig_thread);
        pthread_join(run_sig_thread, NULL);
        run_sig_started = false;
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    }
    pthread_rwlock_destroy(&run_store_lock);
}

#define RUN_STORE(call)                                                                            \
    ({                                                                                             \
        pthread_rwlock_rdlock(&run_store_lock);                                                    \
        dsim_err run_store_e_ = run_store ? (call) : DSIM_ESTATE;                                  \
        pthread_rwlock_unlock(&run_store_lock);                                                    \
        run_store_e_;                                                                              \
    })

/* ---- options ---- */

typedef struct run_opts {
    const char **files;
    int n_files;
    const char *engine;
    bool has_seed;
    uint64_t seed;
    const char *db;
    bool json;
} run_opts;

static int run_parse(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->files = calloc((size_t)argc + 1, sizeof *o->files);
    if (!o->files) {
        fprintf(stderr, "dsim run: out of memory\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            o->json = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--engine", &missing))) {
            if (strcmp(v, "threads") != 0 && strcmp(v, "processes") != 0 && strcmp(v, "sim") != 0) {
                fprintf(stderr, "dsim run: --engine is '%s' (accepted: threads, processes, sim)\n",
                        v);
                return 2;
            }
            o->engine = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--seed", &missing))) {
            char *end = NULL;
            errno = 0;
            unsigned long long x = strtoull(v, &end, 0);
            if (!*v || *end || errno || v[0] == '-') {
                fprintf(stderr, "dsim run: --seed is '%s' (accepted: a whole number 0 .. 2^64-1)\n",
                        v);
                return 2;
            }
            o->has_seed = true;
            o->seed = x;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--db", &missing))) {
            if (!*v) {
                fprintf(stderr, "dsim run: --db is empty (accepted: a file path)\n");
                return 2;
            }
            o->db = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--plugin-dir", &missing))) {
            /* Searched before $DSIM_PLUGIN_PATH by the scenario loader. */
            const char *old = getenv("DSIM_PLUGIN_PATH");
            char *path = NULL;
            if (!*v || asprintf(&path, "%s%s%s", v, old && *old ? ":" : "", old ? old : "") < 0) {
                fprintf(stderr, "dsim run: --plugin-dir is '%s' (accepted: a directory)\n", v);
                return 2;
            }
            setenv("DSIM_PLUGIN_PATH", path, 1);
            free(path);
        } else if (missing) {
            fprintf(stderr, "dsim run: %s needs a value; see 'dsim run --help'\n", a);
            return 2;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr,
                    "dsim run: unknown option '%s' (accepted: --engine E, --seed N, --db PATH, "
                    "--plugin-dir DIR, --json; see 'dsim run --help')\n",
                    a);
            return 2;
        } else {
            o->files[o->n_files++] = a;
        }
    }
    if (o->n_files == 0)
        o->files[o->n_files++] = RUN_DEFAULT_SCENARIO;
    return 0;
}

/* ---- one scenario's state ---- */

typedef struct run_progress {
    FILE *out; /* NULL: no progress */
    bool tty;
    uint64_t total; /* steps in the run, 0 if unknown */
    uint64_t every; /* plain mode: a line every this many steps */
    int64_t t0_ns;
    atomic_uint_fast64_t examples;
    atomic_uint_fast64_t steps_seen; /* highest global step reported, + 1 */
    atomic_int store_failed;
    pthread_mutex_t mu;
    int64_t last_print_ns;
    bool line_open; /* tty: a line without its newline yet */
    char store_err[400];
    dsim_run_id run;
} run_progress;

static int64_t run_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void run_progress_line(run_progress *p, uint64_t done, double loss, bool final)
{
    int64_t now = run_now_ns();
    double secs = (double)(now - p->t0_ns) / 1e9;
    double rate = secs > 0 ? (double)atomic_load(&p->examples) / secs : 0;
    char step[64], lossbuf[32];
    if (p->total)
        snprintf(step, sizeof step, "step %" PRIu64 "/%" PRIu64, done, p->total);
    else
        snprintf(step, sizeof step, "step %" PRIu64, done);
    if (isnan(loss))
        snprintf(lossbuf, sizeof lossbuf, "loss -");
    else
        snprintf(lossbuf, sizeof lossbuf, "loss %.4f", loss);
    if (p->tty) {
        fprintf(p->out, "\r%s  %s  %.0f ex/s\033[K", step, lossbuf, rate);
        p->line_open = !final;
        if (final)
            fputc('\n', p->out);
    } else {
        fprintf(p->out, "%s  %s  %.0f ex/s\n", step, lossbuf, rate);
    }
    fflush(p->out);
    p->last_print_ns = now;
}

static void run_observer(const dsim_train_step_info *info, void *user)
{
    run_progress *p = user;
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
    if (!atomic_load(&p->store_failed)) {
        dsim_err e = RUN_STORE(dsim_store_step(run_store, p->run, &rec));
        if (e != DSIM_OK && atomic_exchange(&p->store_failed, 1) == 0)
            snprintf(p->store_err, sizeof p->store_err, "%s", dsim_errmsg());
    }
    atomic_fetch_add(&p->examples, info->examples);
    uint64_t seen = atomic_load(&p->steps_seen);
    while (info->global_step + 1 > seen &&
           !atomic_compare_exchange_weak(&p->steps_seen, &seen, info->global_step + 1))
        ;
    if (info->replica != 0 || !p->out)
        return;
    uint64_t done = info->global_step + 1;
    bool last = p->total && done >= p->total;
    pthread_mutex_lock(&p->mu);
    if (p->tty) {
        if (last || run_now_ns() - p->last_print_ns >= RUN_TTY_REFRESH_NS)
            run_progress_line(p, done, info->loss, false);
    } else if (last || done % p->every == 0) {
        run_progress_line(p, done, info->loss, false);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Steps the run will take, from worker 0's input (every worker takes the
 * same number); 0 when the input cannot be made (the run will say why). */
static uint64_t run_total_steps(const dsim_train_cfg *cfg)
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

/* The resolved configuration, as stored with the run. */
static json_t *run_config_json(const dsim_scenario *s)
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

/* One scenario, loaded and adjusted by the options. */
typedef struct run_item {
    const char *file;
    dsim_scenario *s;
} run_item;

/* What one scenario's run came to. */
typedef struct run_report {
    dsim_run_id id;
    dsim_run_status status;
    bool harness_error; /* the store failed: exit 2 */
    char harness_msg[600];
    dsim_check_outcome *outcomes;
    size_t n_outcomes, n_failed;
    dsim_err train_err;
    char train_msg[512];
    double wall_s, examples_per_s, final_loss;
    uint64_t steps, examples;
} run_report;

static int run_load(const run_opts *o, run_item *it)
{
    dsim_err e = dsim_scenario_load(it->file, &it->s);
    if (e != DSIM_OK) {
        fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
        return 2;
    }
    dsim_scenario *s = it->s;
    if (o->engine) {
        /* the scenario frees s->engine; train.engine points at it */
        char *eng = strdup(o->engine);
        if (!eng) {
            fprintf(stderr, "dsim run: out of memory\n");
            return 2;
        }
        free(s->engine);
        s->engine = eng;
        s->train.engine = eng;
    }
    if (o->has_seed) {
        s->seed = o->seed;
        s->train.seed = o->seed;
        s->train.data.seed = o->seed;
    }
    if (o->engine && strcmp(o->engine, "threads") != 0) {
        fprintf(stderr,
                "dsim run: %s: --engine %s is not supported by this build yet (accepted: "
                "threads)\n",
                it->file, o->engine);
        return 2;
    }
    if (dsim_scenario_runnable(s) != DSIM_OK) {
        fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
        return 2;
    }
    /* A plugin that cannot be loaded is bad input, found before any run. */
    if (s->train.plugin_path &&
        dsim_strategy_load(s->train.strategy, s->train.plugin_path) != DSIM_OK) {
        fprintf(stderr, "dsim run: %s: strategy.plugin: %s\n", it->file, dsim_errmsg());
        return 2;
    }
    return 0;
}

static const char *run_engine(const run_item *it)
{
    if (it->s->train.engine)
        return it->s->train.engine;
    return it->s->engine ? it->s->engine : "threads";
}

static const char *run_status_name(dsim_run_status st)
{
    return st == DSIM_RUN_PASSED ? "passed" : st == DSIM_RUN_FAILED ? "failed" : "error";
}

static void run_harness_error(run_report *rep, const char *what)
{
    if (rep->harness_error)
        return;
    rep->harness_error = true;
    snprintf(rep->harness_msg, sizeof rep->harness_msg, "%s: %s", what, dsim_errmsg());
}

/* Runs one scenario; the store is open. */
static void run_one(const run_opts *o, run_item *it, run_report *rep)
{
    dsim_scenario *s = it->s;
    dsim_train_cfg cfg = s->train;
    memset(rep, 0, sizeof *rep);
    rep->final_loss = NAN;

    FILE *pout = o->json ? (isatty(STDERR_FILENO) ? stderr : NULL) : stdout;
    bool tty = pout && isatty(fileno(pout));
    if (!o->json)
        printf("%s (%s): %s, %d host%s x %d device%s%s, engine %s, seed %" PRIu64 "\n", s->name,
               it->file, cfg.strategy, cfg.hosts, cfg.hosts == 1 ? "" : "s", cfg.devices_per_host,
               cfg.devices_per_host == 1 ? "" : "s",
               cfg.num_ps ? (cfg.ps_mode == DSIM_PS_ASYNC ? ", async ps" : ", sync ps") : "",
               run_engine(it), s->seed);
    fflush(stdout);

    char *config = NULL;
    json_t *cj = run_config_json(s);
    if (cj) {
        config = json_dumps(cj, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(cj);
    }
    dsim_run_info info = {
        .scenario = s->name,
        .scenario_text = s->text,
        .seed = s->seed,
        .engine = run_engine(it),
        .strategy = cfg.strategy,
        .config_json = config,
    };
    dsim_err e = RUN_STORE(dsim_store_begin_run(run_store, &info, &rep->id));
    free(config);
    if (e != DSIM_OK) {
        run_harness_error(rep, "beginning the run in the results store");
        rep->status = DSIM_RUN_ERROR;
        return;
    }
    int R = cfg.hosts * cfg.devices_per_host;
    for (int r = 0; r < R && !rep->harness_error; r++) {
        int w = r / cfg.devices_per_host, d = r % cfg.devices_per_host;
        char dev[96], host[64];
        snprintf(dev, sizeof dev, "/job:worker/replica:0/task:%d/device:CPU:%d", w, d);
        snprintf(host, sizeof host, "worker-%d", w);
        if (RUN_STORE(dsim_store_replica(run_store, rep->id, r, w, dev, host)) != DSIM_OK)
            run_harness_error(rep, "recording the replicas");
    }

    run_progress prog;
    memset(&prog, 0, sizeof prog);
    pthread_mutex_init(&prog.mu, NULL);
    prog.out = pout;
    prog.tty = tty;
    prog.run = rep->id;
    prog.total = run_total_steps(&cfg);
    prog.every = prog.total >= RUN_PLAIN_LINES ? prog.total / RUN_PLAIN_LINES : 1;
    if (!prog.total)
        prog.every = 10;
    prog.t0_ns = run_now_ns();
    prog.last_print_ns = 0;
    cfg.observer = run_observer;
    cfg.observer_user = &prog;

    dsim_train_result res, ref;
    memset(&res, 0, sizeof res);
    memset(&ref, 0, sizeof ref);
    bool have_ref = false;
    int64_t t_start = run_now_ns();
    rep->train_err = dsim_train(&cfg, &res);
    int64_t t_end = run_now_ns();
    if (rep->train_err != DSIM_OK && res.error.code == DSIM_OK) {
        /* failed before the driver filled the result: keep the thread's message */
        dsim_error_copy(&res.error);
    }
    if (prog.tty && prog.line_open) {
        pthread_mutex_lock(&prog.mu);
        fputc('\n', prog.out);
        prog.line_open = false;
        pthread_mutex_unlock(&prog.mu);
    }
    rep->wall_s = (double)(t_end - t_start) / 1e9;
    rep->examples = atomic_load(&prog.examples);
    rep->examples_per_s = rep->wall_s > 0 ? (double)rep->examples / rep->wall_s : 0;
    /* A failed run's result still holds the steps it was to take: count
     * the steps that were reported instead. */
    rep->steps = rep->train_err == DSIM_OK ? res.steps : atomic_load(&prog.steps_seen);
    rep->final_loss = rep->train_err == DSIM_OK ? res.final_loss : NAN;
    if (atomic_load(&prog.store_failed) && !rep->harness_error) {
        rep->harness_error = true;
        snprintf(rep->harness_msg, sizeof rep->harness_msg, "storing step rows: %s",
                 prog.store_err);
    }

    if (rep->train_err != DSIM_OK) {
        snprintf(rep->train_msg, sizeof rep->train_msg, "%s", res.error.msg);
        char *detail = NULL;
        json_t *ej = json_pack("{s:s, s:s, s:i}", "error", dsim_strerror(rep->train_err), "message",
                               res.error.msg, "peer", res.error.peer);
        if (ej) {
            detail = json_dumps(ej, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(ej);
        }
        /* events share the steps' clock: the threads engine's is CLOCK_MONOTONIC */
        if (RUN_STORE(dsim_store_event(run_store, rep->id, -1, t_end, DSIM_EVENT_ERROR,
                                       detail ? detail : res.error.msg)) != DSIM_OK)
            run_harness_error(rep, "recording the run's error");
        free(detail);
    } else if (dsim_check_needs_reference(s)) {
        dsim_train_cfg rc = s->train;
        rc.observer = NULL;
        rc.observer_user = NULL;
        rc.record_params = false;
        if (dsim_train_reference(&rc, &ref) == DSIM_OK) {
            have_ref = true;
        } else {
            char msg[600];
            snprintf(msg, sizeof msg, "the one-device reference failed: %s", dsim_errmsg());
            if (!o->json)
                fprintf(stderr, "dsim run: %s: %s\n", it->file, msg);
            (void)RUN_STORE(
                dsim_store_event(run_store, rep->id, -1, run_now_ns(), DSIM_EVENT_ERROR, msg));
        }
    }

    size_t n = dsim_check_outcome_count(s);
    rep->outcomes = calloc(n ? n : 1, sizeof *rep->outcomes);
    dsim_check_ctx ctx = {
        .scenario = s,
        .cfg = &s->train,
        .run = &res,
        .reference = have_ref ? &ref : NULL,
        .run_err = rep->train_err,
    };
    if (!rep->outcomes ||
        dsim_check_run_all(&ctx, rep->outcomes, &rep->n_outcomes, &rep->n_failed) != DSIM_OK) {
        run_harness_error(rep, "judging the run");
        rep->n_outcomes = 0;
    }
    for (size_t i = 0; i < rep->n_outcomes; i++) {
        const dsim_check_outcome *c = &rep->outcomes[i];
        if (RUN_STORE(dsim_store_check(run_store, rep->id, c->name, c->passed, c->result.measured,
                                       c->result.expected, c->result.message)) != DSIM_OK)
            run_harness_error(rep, "storing the checks");
    }

    struct {
        const char *name;
        double value;
        const char *unit;
    } m[] = {
        {"wall_time", rep->wall_s, "s"},
        {"examples_per_s", rep->examples_per_s, "examples/s"},
        {"steps", (double)rep->steps, "steps"},
        {"examples", (double)rep->examples, "examples"},
        {"replicas", (double)R, "replicas"},
        {"initial_loss", rep->train_err == DSIM_OK ? res.initial_loss : NAN, "loss"},
        {"final_loss", rep->final_loss, "loss"},
        {"reference_final_loss", have_ref ? ref.final_loss : NAN, "loss"},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        if (isnan(m[i].value))
            continue;
        if (RUN_STORE(dsim_store_metric(run_store, rep->id, m[i].name, m[i].value, m[i].unit,
                                        -1)) != DSIM_OK)
            run_harness_error(rep, "storing the metrics");
    }
    if (cfg.num_ps > 0 && rep->train_err == DSIM_OK &&
        RUN_STORE(dsim_store_metric(run_store, rep->id, "max_staleness", (double)res.max_staleness,
                                    "updates", -1)) != DSIM_OK)
        run_harness_error(rep, "storing the metrics");
    if (R > 1 && cfg.num_ps == 0 && rep->train_err == DSIM_OK) {
        /* the algorithm's name goes in the unit column: a metric is a number */
        dsim_algo a = cfg.communication;
        if (a == DSIM_ALGO_AUTO)
            a = dsim_allreduce_decide(res.n_params * sizeof(float), R);
        if (RUN_STORE(dsim_store_metric(run_store, rep->id, "allreduce_algorithm", (double)a,
                                        dsim_algo_name(a), -1)) != DSIM_OK)
            run_harness_error(rep, "storing the metrics");
    }

    rep->status = rep->harness_error ? DSIM_RUN_ERROR
                  : rep->n_failed    ? DSIM_RUN_FAILED
                                     : DSIM_RUN_PASSED;
    if (RUN_STORE(dsim_store_end_run(run_store, rep->id, rep->status, NULL, 0)) != DSIM_OK) {
        run_harness_error(rep, "ending the run in the results store");
        rep->status = DSIM_RUN_ERROR;
    }
    dsim_train_result_free(&res);
    if (have_ref)
        dsim_train_result_free(&ref);
    pthread_mutex_destroy(&prog.mu);
}

static void run_fmt_num(char *buf, size_t cap, double v)
{
    if (isnan(v))
        snprintf(buf, cap, "-");
    else if (isinf(v))
        snprintf(buf, cap, v > 0 ? "inf" : "-inf");
    else if (v >= DSIM_CHECK_NO_LIMIT)
        snprintf(buf, cap, "no limit");
    else
        snprintf(buf, cap, "%.6g", v);
}

static void run_print_table(const run_item *it, const run_report *rep, const char *db)
{
    if (rep->n_outcomes) {
        printf("\n  %-22s %-8s %-12s %-12s %s\n", "CHECK", "EXPECTS", "MEASURED", "EXPECTED",
               "RESULT");
        for (size_t i = 0; i < rep->n_outcomes; i++) {
            const dsim_check_outcome *c = &rep->outcomes[i];
            char meas[32], exp[32];
            run_fmt_num(meas, sizeof meas, c->result.measured);
            run_fmt_num(exp, sizeof exp, c->result.expected);
            printf("  %-22s %-8s %-12s %-12s %s\n      %s\n", c->name,
                   c->expect_fail ? "fail" : "pass", meas, exp, c->passed ? "PASS" : "FAIL",
                   c->result.message);
        }
    } else if (!rep->harness_error)
        printf("\n  no checks: the scenario has no expect: section, so the run is stored but "
               "nothing was judged\n");
    if (rep->harness_error)
        printf("\n  harness error: %s\n", rep->harness_msg);
    printf("\n%s: %s", it->s->name, run_status_name(rep->status));
    if (rep->n_outcomes)
        printf(" (%zu of %zu checks met their expectation)", rep->n_outcomes - rep->n_failed,
               rep->n_outcomes);
    printf("; %" PRIu64 " steps, %.2f s, %.0f examples/s\n", rep->steps, rep->wall_s,
           rep->examples_per_s);
    if (rep->id > 0)
        printf("run %" PRId64 " stored in %s\n", (int64_t)rep->id, db);
    fflush(stdout);
}

static json_t *run_num_json(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *run_report_json(const run_item *it, const run_report *rep)
{
    json_t *checks = json_array();
    for (size_t i = 0; i < rep->n_outcomes; i++) {
        const dsim_check_outcome *c = &rep->outcomes[i];
        json_array_append_new(
            checks, json_pack("{s:s, s:b, s:b, s:b, s:o, s:o, s:s}", "name", c->name, "expect_fail",
                              c->expect_fail, "check_passed", c->check_passed, "passed", c->passed,
                              "measured", run_num_json(c->result.measured), "expected",
                              run_num_json(c->result.expected), "message", c->result.message));
    }
    return json_pack(
        "{s:s, s:s, s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:o, s:s?, s:s?, s:o}", "scenario",
        it->s->name, "file", it->file, "run_id", (json_int_t)rep->id, "status",
        run_status_name(rep->status), "strategy", it->s->train.strategy, "engine", run_engine(it),
        "seed", (json_int_t)it->s->seed, "steps", (json_int_t)rep->steps, "examples",
        (json_int_t)rep->examples, "wall_s", rep->wall_s, "examples_per_s", rep->examples_per_s,
        "final_loss", run_num_json(rep->final_loss), "error",
        rep->train_err != DSIM_OK ? rep->train_msg : NULL, "harness_error",
        rep->harness_error ? rep->harness_msg : NULL, "checks", checks);
}

int cmd_run(int argc, char **argv)
{
    run_opts o;
    int rc = run_parse(argc, argv, &o);
    if (rc != 0) {
        free(o.files);
        return rc;
    }
    run_item *items = calloc((size_t)o.n_files, sizeof *items);
    run_report *reps = calloc((size_t)o.n_files, sizeof *reps);
    if (!items || !reps) {
        fprintf(stderr, "dsim run: out of memory\n");
        free(items);
        free(reps);
        free(o.files);
        return 2;
    }
    const char *db = o.db ? o.db : DSIM_STORE_DEFAULT_PATH;
    int n_loaded = 0;
    for (int i = 0; i < o.n_files && rc == 0; i++) {
        items[i].file = o.files[i];
        rc = run_load(&o, &items[i]);
        n_loaded = i + 1;
    }
    bool json_out_ok = true;
    int n_ran = 0;
    if (rc == 0) {
        if (!run_signals_start())
            fprintf(stderr, "dsim run: cannot watch for interrupts; an interrupted run stays "
                            "'running' until the store is next opened\n");
        dsim_store *st = NULL;
        if (dsim_store_open(o.db, &st) != DSIM_OK) {
            fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
            rc = 2;
        } else {
            pthread_rwlock_wrlock(&run_store_lock);
            run_store = st;
            pthread_rwlock_unlock(&run_store_lock);
            for (int i = 0; i < o.n_files && !atomic_load(&run_interrupted); i++) {
                run_one(&o, &items[i], &reps[i]);
                n_ran = i + 1;
                if (!o.json)
                    run_print_table(&items[i], &reps[i], db);
                if (reps[i].harness_error) {
                    fprintf(stderr, "dsim run: %s: %s\n", items[i].file, reps[i].harness_msg);
                    rc = 2;
                } else if (reps[i].n_failed && rc == 0) {
                    rc = 1;
                }
                if (!o.json && i + 1 < o.n_files)
                    printf("\n");
            }
            pthread_rwlock_wrlock(&run_store_lock);
            st = run_store;
            run_store = NULL;
            pthread_rwlock_unlock(&run_store_lock);
            if (dsim_store_close(st) != DSIM_OK) {
                fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
                rc = 2;
            }
        }
        run_signals_stop();
    }
    if (o.json && n_ran > 0) {
        json_t *arr = json_array();
        for (int i = 0; i < n_ran; i++)
            json_array_append_new(arr, run_report_json(&items[i], &reps[i]));
        json_t *root = json_pack("{s:s, s:b, s:i, s:o}", "db", db, "passed", rc == 0, "exit_status",
                                 rc, "runs", arr);
        char *txt = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        if (txt)
            printf("%s\n", txt);
        else
            json_out_ok = false;
        free(txt);
        json_decref(root);
    } else if (!o.json && n_ran > 1) {
        int passed = 0;
        for (int i = 0; i < n_ran; i++)
            passed += reps[i].status == DSIM_RUN_PASSED;
        printf("\n%d scenarios: %d passed, %d did not\n", n_ran, passed, n_ran - passed);
    }
    for (int i = 0; i < n_loaded; i++) {
        dsim_scenario_free(items[i].s);
        free(reps[i].outcomes);
    }
    free(items);
    free(reps);
    free(o.files);
    if (!json_out_ok) {
        fprintf(stderr, "dsim run: out of memory writing the JSON summary\n");
        return 2;
    }
    return rc;
}
