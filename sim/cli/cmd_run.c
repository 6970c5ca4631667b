/* dsim run: run scenarios, judge them with their checks, store everything.
 *
 * A thin caller of the harness (sim/harness/harness.h), which does the run:
 * this file parses the flags, loads and prepares every scenario file before
 * anything runs (so a typo in the third file costs no time), opens the
 * results store once, hands each scenario to dsim_harness_run, and prints
 * the progress line, the table of checks or the --json summary.
 *
 * Plugins: a scenario's strategy.plugin is a path relative to the scenario
 * file, or a bare file name searched in --plugin-dir, $DSIM_PLUGIN_PATH and
 * this build's plugin directories; it is found when the file is loaded and
 * loaded by dsim_harness_prepare, so a plugin that cannot be loaded is bad
 * input (exit 2) found before any run.
 *
 * Interrupts: SIGINT and SIGTERM are taken by a thread of their own; it
 * lets the harness wait for the store calls in flight and close the store
 * (which marks the run in progress 'unfinished' and keeps every row
 * committed so far; a run already stored keeps its status, and the message
 * says which happened) and exits with 130 (SIGINT) or 143 (SIGTERM). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "check/check.h"
#include "cmds.h"
#include "dsim_cov.h"
#include "dsim/err.h"
#include "dsim/strategy.h"
#include "engine/engine.h"
#include "harness/harness.h"
#include "report.h"
#include "report_ci.h"
#include "store/store.h"
#include "scenario/scenario.h"
#include "store.h"

#define RUN_DEFAULT_SCENARIO "scenarios/quickstart.yaml"
#define RUN_TTY_REFRESH_NS   (100LL * 1000 * 1000)
#define RUN_PLAIN_LINES      10 /* progress lines per run when stdout is not a terminal */

/* The engines with (want) or without the flag, "a, b". */
static const char *run_engines_by(unsigned flag, bool want, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; dsim_engine_at(i) && used < cap; i++) {
        const dsim_engine_ops *e = dsim_engine_at(i);
        if (((e->flags & flag) != 0) == want) {
            int w = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", e->name);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    return buf;
}

void cmd_run_help(FILE *out)
{
    char engines[160], threaded[128], coroutines[128];
    run_engines_by(DSIM_ENGINE_THREAD_PER_REPLICA, true, threaded, sizeof threaded);
    run_engines_by(DSIM_ENGINE_THREAD_PER_REPLICA, false, coroutines, sizeof coroutines);
    fprintf(out,
            "usage: dsim run [SCENARIO...] [--engine E] [--transport T] [--seed N] [--db PATH]\n"
            "                [--plugin-dir DIR] [--combination K] [--no-plugins] [--json]\n"
            "                [--junit FILE] [--tap]\n"
            "                [--report] [--reference-after] [--keep-params]\n"
            "\n"
            "Runs each scenario file (default: %s), judges the run with\n"
            "the checks of the file's expect: section, stores it in the results store and\n"
            "prints a table of the checks: measured vs expected, PASS/FAIL, and a sentence\n"
            "saying what to look at. 'dsim list checks' shows every check's thresholds.\n"
            "\n"
            "  --engine E        override the scenario's engine: %s\n"
            "  --transport T     override the scenario's transport: inproc, shm or tcp (by\n"
            "                    default inproc in one address space, shm between the\n"
            "                    processes engine's processes, tcp across machines)\n"
            "  --seed N          override the scenario's seed (0 .. 2^64-1): model init,\n"
            "                    data and shuffling\n"
            "  --db PATH         the results store (default %s in the working directory)\n"
            "  --plugin-dir DIR  look for strategy plugins named by a bare file name in DIR\n"
            "                    first (then $DSIM_PLUGIN_PATH, then this build's plugins)\n"
            "  --combination K   of a file with a matrix: section, run only combination K\n"
            "                    (0-based; every combination is run, each as its own run,\n"
            "                    without it)\n"
            "  --no-plugins      refuse (exit 2) a scenario that names a strategy plugin:\n"
            "                    loading one runs its code in this process, so use this for\n"
            "                    scenario files you do not trust\n"
            "  --json            print a machine-readable summary on stdout instead of the\n"
            "                    table (progress goes to stderr when it is a terminal)\n"
            "  --junit FILE      also write a JUnit XML report for CI dashboards: one\n"
            "                    testcase per check per scenario, failures with the check's\n"
            "                    message, an error for a run that could not be judged\n"
            "  --tap             print TAP on stdout instead of the table (meson test's\n"
            "                    protocol: 'tap'): a test per check; the table goes to stderr\n"
            "  --report          at the end, write the HTML report of the runs ('dsim\n"
            "                    report') next to the results store, as dsim-report-ID.html\n"
            "                    (dsim-report-FIRST-LAST.html for several); the last line\n"
            "                    printed is its path (with --json: the summary's \"report\";\n"
            "                    with --tap: on stderr)\n"
            "  --reference-after replay the one-device reference after the job; by default\n"
            "                    it runs beside the job on the sim engine (a thread of its\n"
            "                    own, where the machine has a second CPU): the same result\n"
            "  --keep-params     keep the variables after every step in the results store\n"
            "                    (its params table; dsim export then writes them as\n"
            "                    params_per_step.npy without training the run again)\n"
            "\n"
            "Progress: on a terminal one line rewritten in place (step, loss, examples/s);\n"
            "otherwise about %d plain lines per run.\n"
            "\n"
            "Limits: a run has at most %d replicas on %s (as memory allows),\n"
            "%d on %s (a thread per replica); 'dsim validate --limits'\n"
            "lists every limit of a scenario file.\n"
            "\n"
            "Hangs and crashes: a replica that never returns is left running once the job\n"
            "has failed (or made no progress for twice the timeout) and a grace period\n"
            "has passed; the run is stored as 'hung' with where each stuck replica was. A\n"
            "replica that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) or calls\n"
            "exit() is named with its phase and step, and the run is stored as 'crashed'\n"
            "before the process dies (of the signal; status 1 after exit()). What no\n"
            "handler sees (SIGKILL from the out-of-memory killer, a strategy's _exit())\n"
            "is caught by a supervising parent process: the run is stored as 'crashed'\n"
            "with how the process ended and its peak memory, and dsim ends the same way.\n"
            "DSIM_NO_SUPERVISOR=1 runs without it (e.g. under a debugger).\n"
            "\n"
            "Exit status: 0 every check of every scenario met its expectation (a check the\n"
            "scenario expects to fail must fail), 1 a check did not or a run hung, 2 bad\n"
            "input (a scenario that does not parse or cannot run in this build, a bad\n"
            "option, a results store that cannot be opened or written). 130 when\n"
            "interrupted (SIGINT), 143 when terminated (SIGTERM): a run in progress is then\n"
            "stored as 'unfinished'; a run already stored keeps its status.\n"
            "\n"
            "Testing: DSIM_RUN_AFTER_STORED_S=S waits S seconds after each run is stored\n"
            "and its table printed (to interrupt dsim run exactly there).\n",
            RUN_DEFAULT_SCENARIO, dsim_engine_names(0, false, engines, sizeof engines),
            DSIM_STORE_DEFAULT_PATH, RUN_PLAIN_LINES, DSIM_TRAIN_MAX_REPLICAS, coroutines,
            DSIM_TRAIN_MAX_THREAD_REPLICAS, threaded);
}

/* ---- interrupts ---- */

/* run_store is the open store; run_store_lock guards the pointer between
 * the main thread (which opens and closes it) and the interrupt thread, and
 * the last run stored (run_last_id, 0 before the first). The harness guards
 * its own store calls (dsim_harness_shutdown). */
static pthread_mutex_t run_store_lock = PTHREAD_MUTEX_INITIALIZER;
static dsim_store *run_store;
static const char *run_db;
static dsim_run_id run_last_id;
static dsim_run_status run_last_status;
static atomic_bool run_interrupted;

static pthread_t run_sig_thread;
static bool run_sig_started;

/* The interrupt: the runs in progress are stored as unfinished; a run
 * whose end is stored already keeps its status, and the message says so
 * rather than claim a change. */
static void *run_sig_main(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    if (sigwait(set, &sig) != 0)
        return NULL;
    atomic_store(&run_interrupted, true);
    pthread_mutex_lock(&run_store_lock);
    dsim_run_id ids[8];
    size_t n = dsim_harness_shutdown(run_store, ids, 8);
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
    if (n > 0) {
        fprintf(stderr, "\ndsim run: interrupted (%s); run", name);
        for (size_t i = 0; i < n && i < 8; i++)
            fprintf(stderr, "%s %" PRId64, i ? "," : "", (int64_t)ids[i]);
        fprintf(stderr, " stored as unfinished in %s\n", run_db ? run_db : "the results store");
    } else if (run_last_id > 0) {
        fprintf(stderr,
                "\ndsim run: interrupted (%s) after run %" PRId64 " was stored; it stays %s, "
                "and no run was in progress\n",
                name, (int64_t)run_last_id, dsim_run_status_name(run_last_status));
    } else {
        fprintf(stderr, "\ndsim run: interrupted (%s); no run was in progress\n", name);
    }
    DSIM_COV_DUMP();
    _exit(128 + sig);
    return NULL;
}

/* Testing: DSIM_RUN_AFTER_STORED_S=S waits S seconds after each run is
 * stored and its table printed, so that a test can interrupt dsim run
 * exactly there. */
static void run_hold_after_stored(void)
{
    const char *v = getenv("DSIM_RUN_AFTER_STORED_S");
    char *end = NULL;
    double s = v && *v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(s > 0) || s > 3600)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static bool run_signals_start(void)
{
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    /* Blocked here, before any thread exists, so every thread (store writer,
     * workers) inherits the mask and only run_sig_main takes the signal. */
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return false;
    if (dsim_thread_start(&run_sig_thread, NULL, run_sig_main, &set) != 0) {
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
}

/* ---- options ---- */

typedef struct run_opts {
    const char **files;
    int n_files;
    const char *engine;
    const char *transport;
    bool has_seed;
    uint64_t seed;
    const char *db;
    bool json;
    long combination; /* --combination K, or -1: all */
    bool no_plugins;
    const char *junit; /* --junit FILE (report_ci.h) */
    bool tap;
    bool report;          /* --report: the HTML report next to the store */
    bool reference_after; /* --reference-after (dsim_harness_opts.reference_after) */
    bool keep_params;     /* --keep-params (dsim_harness_opts.keep_params) */
} run_opts;

static int run_parse(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->combination = -1;
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
        } else if (strcmp(a, "--no-plugins") == 0) {
            o->no_plugins = true;
        } else if (strcmp(a, "--tap") == 0) {
            o->tap = true;
        } else if (strcmp(a, "--report") == 0) {
            o->report = true;
        } else if (strcmp(a, "--reference-after") == 0) {
            o->reference_after = true;
        } else if (strcmp(a, "--keep-params") == 0) {
            o->keep_params = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--junit", &missing))) {
            o->junit = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--engine", &missing))) {
            const dsim_engine_ops *eng;
            if (dsim_engine_find(v, &eng) != DSIM_OK) {
                char names[160];
                fprintf(stderr, "dsim run: --engine is '%s' (accepted: %s)\n", v,
                        dsim_engine_names(0, false, names, sizeof names));
                return 2;
            }
            o->engine = v;
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--transport", &missing))) {
            if (strcmp(v, "inproc") != 0 && strcmp(v, "shm") != 0 && strcmp(v, "tcp") != 0) {
                fprintf(stderr, "dsim run: --transport is '%s' (accepted: inproc, shm, tcp)\n", v);
                return 2;
            }
            o->transport = v;
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
        } else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--combination", &missing))) {
            char *end = NULL;
            errno = 0;
            long x = strtol(v, &end, 10);
            if (!*v || *end || errno || x < 0) {
                fprintf(stderr,
                        "dsim run: --combination is '%s' (accepted: a combination number 0 .. "
                        "N-1 of the file's matrix)\n",
                        v);
                return 2;
            }
            o->combination = x;
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
                    "dsim run: unknown option '%s' (accepted: --engine E, --transport T, --seed N, "
                    "--db PATH, "
                    "--plugin-dir DIR, --no-plugins, --json, --junit FILE, --tap, --report, "
                    "--reference-after, --keep-params; see 'dsim run --help')\n",
                    a);
            return 2;
        } else {
            o->files[o->n_files++] = a;
        }
    }
    if (o->json && o->tap) {
        fprintf(stderr, "dsim run: --json and --tap both print on standard output (accepted: "
                        "one of them; --junit FILE goes with either)\n");
        return 2;
    }
    if (o->n_files == 0)
        o->files[o->n_files++] = RUN_DEFAULT_SCENARIO;
    return 0;
}

/* ---- progress ---- */

typedef struct run_progress {
    FILE *out; /* NULL: no progress */
    bool tty;
    pthread_mutex_t mu;
    int64_t last_print_ns;
    bool line_open;    /* tty: a line without its newline yet */
    int forming_lines; /* plain lines printed while the job formed */
} run_progress;

static int64_t run_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void run_progress_line(run_progress *p, const dsim_harness_progress *hp)
{
    double rate = hp->elapsed_s > 0 ? (double)hp->examples / hp->elapsed_s : 0;
    char step[64], lossbuf[32];
    if (hp->total)
        snprintf(step, sizeof step, "step %" PRIu64 "/%" PRIu64, hp->step, hp->total);
    else
        snprintf(step, sizeof step, "step %" PRIu64, hp->step);
    if (isnan(hp->loss))
        snprintf(lossbuf, sizeof lossbuf, "loss -");
    else
        snprintf(lossbuf, sizeof lossbuf, "loss %.4f", hp->loss);
    if (p->tty) {
        fprintf(p->out, "\r%s  %s  %.0f ex/s\033[K", step, lossbuf, rate);
        p->line_open = true;
    } else {
        fprintf(p->out, "%s  %s  %.0f ex/s\n", step, lossbuf, rate);
    }
    fflush(p->out);
    p->last_print_ns = run_now_ns();
}

/* The harness's progress callback: a line rewritten in place on a terminal,
 * about RUN_PLAIN_LINES plain lines otherwise. */
static void run_progress_cb(const dsim_harness_progress *hp, void *user)
{
    run_progress *p = user;
    if (!p->out)
        return;
    pthread_mutex_lock(&p->mu);
    if (hp->forming) {
        /* who is there and who is awaited, about once a second: on a
         * terminal in place, otherwise every second for 10 s, then every
         * 10 s */
        int k = p->forming_lines++;
        if (p->tty || k < 10 || k % 10 == 0) {
            fprintf(p->out,
                    "%sforming the group (%.0f s): %d of %d replicas have taken their "
                    "first step; awaiting %s%s",
                    p->tty ? "\r" : "", hp->elapsed_s, hp->formed, hp->replicas, hp->awaiting,
                    p->tty ? "\033[K" : "\n");
            p->line_open = p->tty;
            fflush(p->out);
        }
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (hp->finished) {
        if (p->tty && p->line_open) {
            fputc('\n', p->out);
            p->line_open = false;
        }
        pthread_mutex_unlock(&p->mu);
        return;
    }
    uint64_t every = hp->total >= RUN_PLAIN_LINES ? hp->total / RUN_PLAIN_LINES : 1;
    if (!hp->total)
        every = 10;
    bool last = hp->total && hp->step >= hp->total;
    if (p->tty) {
        if (last || run_now_ns() - p->last_print_ns >= RUN_TTY_REFRESH_NS)
            run_progress_line(p, hp);
    } else if (last || hp->step % every == 0) {
        run_progress_line(p, hp);
    }
    pthread_mutex_unlock(&p->mu);
}

/* One scenario, loaded and adjusted by the options. */
typedef struct run_item {
    const char *file;
    dsim_scenario *s;
} run_item;

static int run_load(const run_opts *o, run_item *it)
{
    dsim_err e = dsim_scenario_load(it->file, &it->s);
    if (e != DSIM_OK) {
        fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
        return 2;
    }
    if (o->no_plugins && it->s->model_plugin) {
        DSIM_ERR(DSIM_EINVAL, -1,
                 "%s:%d:%d: model.plugin: the scenario names a model plugin (%s) and "
                 "--no-plugins forbids loading one (its code would run in this process)",
                 it->file, it->s->model_plugin_pos.line, it->s->model_plugin_pos.column,
                 it->s->model_plugin);
        fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
        return 2;
    }
    if (o->no_plugins && it->s->train.plugin_path) {
        DSIM_ERR(DSIM_EINVAL, -1,
                 "%s:%d:%d: strategy.plugin: the scenario names a plugin (%s) and --no-plugins "
                 "forbids loading one (its code would run in this process)",
                 it->file, it->s->plugin_pos.line, it->s->plugin_pos.column,
                 it->s->train.plugin_path);
        fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
        return 2;
    }
    dsim_harness_opts ho = {
        .size = sizeof ho,
        .engine_override = o->engine,
        .transport_override = o->transport,
        .has_seed = o->has_seed,
        .seed = o->seed,
    };
    if (dsim_harness_prepare(it->s, &ho) != DSIM_OK) {
        fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
        return 2;
    }
    return 0;
}

/* Loads every file; a file with a matrix becomes one item per combination
 * (only --combination K's when given). On failure the items loaded so far
 * are in *items (to free) and the status is 2. */
static int run_expand(const run_opts *o, dsim_ci_report *ci, run_item **items, int *n)
{
    int cap = o->n_files, rc = 0;
    *items = calloc((size_t)cap, sizeof **items);
    *n = 0;
    if (!*items) {
        fprintf(stderr, "dsim run: out of memory\n");
        return 2;
    }
    for (int f = 0; f < o->n_files && rc == 0; f++) {
        run_item base = {.file = o->files[f]};
        if ((rc = run_load(o, &base)) != 0) {
            dsim_ci_load_failed(ci, base.file, dsim_errmsg());
            dsim_scenario_free(base.s);
            break;
        }
        size_t nc = dsim_scenario_combinations(base.s);
        if (o->combination >= 0 && (size_t)o->combination >= nc) {
            fprintf(stderr,
                    "dsim run: %s: --combination %ld does not exist; the file makes %zu "
                    "run%s (0..%zu)\n",
                    base.file, o->combination, nc, nc == 1 ? "" : "s", nc - 1);
            dsim_scenario_free(base.s);
            rc = 2;
            break;
        }
        if (nc == 1 && !base.s->n_combinations) {
            (*items)[(*n)++] = base; /* no matrix: the file as it is */
            continue;
        }
        size_t first = o->combination >= 0 ? (size_t)o->combination : 0;
        size_t last = o->combination >= 0 ? first + 1 : nc;
        if (*n + (int)(last - first) > cap) {
            int ncap = *n + (int)(last - first) + o->n_files;
            run_item *grown = realloc(*items, (size_t)ncap * sizeof *grown);
            if (!grown) {
                fprintf(stderr, "dsim run: out of memory\n");
                dsim_scenario_free(base.s);
                rc = 2;
                break;
            }
            *items = grown;
            cap = ncap;
        }
        for (size_t k = first; k < last && rc == 0; k++) {
            run_item it = {.file = base.file};
            if (dsim_scenario_combination(base.s, k, &it.s) != DSIM_OK) {
                fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
                rc = 2;
                break;
            }
            dsim_harness_opts ho = {.size = sizeof ho,
                                    .engine_override = o->engine,
                                    .transport_override = o->transport,
                                    .has_seed = o->has_seed,
                                    .seed = o->seed};
            if (dsim_harness_prepare(it.s, &ho) != DSIM_OK) {
                fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
                dsim_ci_load_failed(ci, base.file, dsim_errmsg());
                dsim_scenario_free(it.s);
                rc = 2;
                break;
            }
            (*items)[(*n)++] = it;
        }
        dsim_scenario_free(base.s);
    }
    return rc;
}

/* Runs one scenario on the open store. */
static void run_one(const run_opts *o, dsim_store *st, run_item *it, dsim_harness_result *rep)
{
    dsim_scenario *s = it->s;
    const dsim_train_cfg *cfg = &s->train;
    run_progress prog;
    memset(&prog, 0, sizeof prog);
    pthread_mutex_init(&prog.mu, NULL);
    prog.out = o->json ? (isatty(STDERR_FILENO) ? stderr : NULL) : stdout;
    prog.tty = prog.out && isatty(fileno(prog.out));
    char mp[96] = "";
    if (cfg->precision > DSIM_POLICY_FLOAT32 || cfg->gradient_dtype != DSIM_F32)
        snprintf(mp, sizeof mp, ", %s, gradients all-reduced in %s",
                 dsim_precision_policy_name(
                     cfg->precision == DSIM_POLICY_DEFAULT ? DSIM_POLICY_FLOAT32 : cfg->precision),
                 dsim_precision_dtype_name(cfg->gradient_dtype));
    /* the transport, where it is not the one address space's inproc */
    const dsim_engine_ops *eng = NULL;
    const char *tp = cfg->transport;
    if (!tp && dsim_engine_find(dsim_scenario_engine(s), &eng) == DSIM_OK &&
        (eng->flags & DSIM_ENGINE_FORKS))
        tp = "shm";
    if (tp && strcmp(tp, "inproc") == 0)
        tp = NULL;
    if (!o->json)
        printf("%s (%s): %s, %d host%s x %d device%s%s, engine %s%s%s, seed %" PRIu64 "%s\n",
               s->name, it->file, cfg->strategy, cfg->hosts, cfg->hosts == 1 ? "" : "s",
               cfg->devices_per_host, cfg->devices_per_host == 1 ? "" : "s",
               cfg->num_ps ? (cfg->ps_mode == DSIM_PS_ASYNC ? ", async ps" : ", sync ps") : "",
               dsim_scenario_engine(it->s), tp ? " over " : "", tp ? tp : "", s->seed, mp);
    if (!o->json && s->tpu_notes)
        printf("%s", s->tpu_notes); /* simulated, no TPU used; precision; warnings */
    char cpu_note[640];
    if (!o->json && dsim_scenario_cpu_warning(it->s, cpu_note, sizeof cpu_note))
        printf("%s", cpu_note);
    fflush(stdout);
    dsim_harness_opts ho = {
        .size = sizeof ho,
        .store = st,
        .progress = run_progress_cb,
        .progress_user = &prog,
        .reference_after = o->reference_after,
        .keep_params = o->keep_params,
    };
    (void)dsim_harness_run(s, &ho, rep);
    if (rep->note[0] && !o->json)
        fprintf(stderr, "dsim run: %s: %s\n", it->file, rep->note);
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

static void run_print_table(const run_item *it, const dsim_harness_result *rep, const char *db)
{
    if (rep->fault_summary[0])
        printf("\n%s\n", rep->fault_summary);
    if (rep->timeline)
        fputs(rep->timeline, stdout);
    if (rep->n_checks) {
        printf("\n  %-22s %-8s %-12s %-12s %s\n", "CHECK", "EXPECTS", "MEASURED", "EXPECTED",
               "RESULT");
        bool defaults = false;
        for (size_t i = 0; i < rep->n_checks; i++) {
            const dsim_check_outcome *c = &rep->checks[i];
            char meas[32], exp[32];
            run_fmt_num(meas, sizeof meas, c->result.measured);
            run_fmt_num(exp, sizeof exp, c->result.expected);
            defaults |= c->by_default;
            printf("  %-22s %-8s %-12s %-12s %s\n      %s\n", c->name,
                   c->by_default    ? "pass*"
                   : c->expect_fail ? "fail"
                                    : "pass",
                   meas, exp,
                   c->not_applicable ? "N/A"
                   : c->passed       ? "PASS"
                                     : "FAIL",
                   c->result.message);
        }
        if (defaults)
            printf("  * judged by default: it applies to this run and the scenario does not "
                   "name it (`NAME: off` under expect: turns it off)\n");
    } else if (!rep->harness_error)
        printf("\n  no checks: the scenario has no expect: section, so the run is stored but "
               "nothing was judged\n");
    if (rep->whatif[0])
        printf("\n%s\n", rep->whatif);
    if (rep->harness_error)
        printf("\n  harness error: %s\n", rep->harness_msg);
    if (rep->status == DSIM_RUN_HUNG) {
        /* told once, here: the checks that could not judge it say only that */
        if (rep->n_stuck)
            printf("\n  the run hung; left running:\n");
        for (size_t i = 0; i < rep->n_stuck; i++) {
            char where[256];
            dsim_train_stuck_describe(&rep->stuck[i], where, sizeof where);
            printf("    %s\n", where);
        }
        printf("%s  %s\n", rep->n_stuck ? "" : "\n",
               rep->train_msg[0] ? rep->train_msg : "the run hung");
    }
    printf("\n%s: %s", it->s->name, dsim_run_status_name(rep->status));
    if (rep->n_checks) {
        size_t nj = 0; /* could not judge the run (N/A): met, but say so */
        for (size_t i = 0; rep->checks && i < rep->n_checks; i++)
            nj += rep->checks[i].not_applicable || rep->checks[i].result.not_judged;
        printf(" (%zu of %zu checks met their expectation", rep->n_checks - rep->n_failed,
               rep->n_checks);
        if (nj)
            printf(", %zu of them not judged", nj);
        printf(")");
    }
    printf("; %" PRIu64 " steps", rep->steps);
    if (rep->steps_rerun)
        printf(" (%" PRIu64 " of them run twice: rolled back by a restart)", rep->steps_rerun);
    printf(", %.2f s, %.0f examples/s", rep->wall_s, rep->examples_per_s);
    if (rep->restarts)
        printf(", %d restart(s)", rep->restarts);
    if (rep->deterministic)
        printf(", %.6f s virtual%s", (double)rep->engine_ns / 1e9,
               rep->restarts ? " (the last attempt)" : "");
    printf("\n");
    if (rep->deterministic)
        printf("trace %016" PRIx64 " (%" PRIu64 " events)\n", rep->trace_hash, rep->trace_events);
    if (rep->run_id > 0)
        printf("run %" PRId64 " stored in %s\n", (int64_t)rep->run_id, db);
    if (rep->flight_path[0])
        printf("flight records in %s: 'dsim trace desync %" PRId64 "%s%s' says which rank did "
               "not join which collective\n",
               rep->flight_path, (int64_t)rep->run_id, strcmp(db, "dsim.db") ? " --db " : "",
               strcmp(db, "dsim.db") ? db : "");
    if (rep->deterministic && rep->run_id > 0 && rep->status != DSIM_RUN_PASSED)
        printf("replay it (same scenario text, seed and engine; the trace hash must match):\n"
               "  dsim replay %" PRId64 " --db %s\n",
               (int64_t)rep->run_id, db);
    fflush(stdout);
}

void dsim_cli_print_run(const char *file, const dsim_scenario *s, const dsim_harness_result *rep,
                        const char *db)
{
    run_item it = {.file = file, .s = (dsim_scenario *)s};
    run_print_table(&it, rep, db);
}

static json_t *run_num_json(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *run_report_json(const run_item *it, const dsim_harness_result *rep)
{
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, rep->trace_hash);
    json_t *checks = json_array();
    for (size_t i = 0; i < rep->n_checks; i++) {
        const dsim_check_outcome *c = &rep->checks[i];
        json_array_append_new(
            checks,
            json_pack("{s:s, s:b, s:b, s:b, s:b, s:o, s:o, s:s}", "name", c->name, "expect_fail",
                      c->expect_fail, "by_default", c->by_default, "check_passed", c->check_passed,
                      "passed", c->passed, "measured", run_num_json(c->result.measured), "expected",
                      run_num_json(c->result.expected), "message", c->result.message));
    }
    json_t *stuck = json_array();
    for (size_t i = 0; i < rep->n_stuck; i++) {
        const dsim_train_stuck *k = &rep->stuck[i];
        char where[256];
        dsim_train_stuck_describe(k, where, sizeof where);
        json_array_append_new(stuck, json_pack("{s:i, s:i, s:s, s:I, s:s?, s:I, s:s}", "replica",
                                               k->where.replica, "server", k->where.server, "phase",
                                               dsim_phase_name(k->where.phase), "global_step",
                                               (json_int_t)k->where.global_step, "collective",
                                               k->collective, "collective_calls",
                                               (json_int_t)k->collective_calls, "message", where));
    }
    return json_pack(
        "{s:s, s:s, s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:o, s:s?, s:s?, s:o, s:o, "
        "s:s?}",
        "scenario", it->s->name, "file", it->file, "run_id", (json_int_t)rep->run_id, "status",
        dsim_run_status_name(rep->status), "strategy", it->s->train.strategy, "engine",
        dsim_scenario_engine(it->s), "seed", (json_int_t)it->s->seed, "steps",
        (json_int_t)rep->steps, "examples", (json_int_t)rep->examples, "wall_s", rep->wall_s,
        "examples_per_s", rep->examples_per_s, "final_loss", run_num_json(rep->final_loss), "error",
        rep->train_err != DSIM_OK ? rep->train_msg : NULL, "harness_error",
        rep->harness_error ? rep->harness_msg : NULL, "checks", checks, "stuck", stuck,
        "trace_hash", rep->deterministic ? hash : NULL);
}

/* --report: the runs' HTML report in the store's directory. Returns the
 * path (to free) or NULL after a message. */
static char *run_write_report(const char *db, const dsim_harness_result *reps, int n)
{
    int64_t *ids = calloc((size_t)n + 1, sizeof *ids);
    size_t k = 0;
    for (int i = 0; ids && i < n; i++)
        if (reps[i].run_id > 0)
            ids[k++] = (int64_t)reps[i].run_id;
    char *path = NULL;
    if (!ids || k == 0) {
        fprintf(stderr, "dsim run: no report: %s\n", ids ? "no run was stored" : "out of memory");
        free(ids);
        return NULL;
    }
    const char *slash = strrchr(db, '/');
    int dlen = slash ? (int)(slash - db) + 1 : 0;
    int ok = k == 1 ? asprintf(&path, "%.*sdsim-report-%" PRId64 ".html", dlen, db, ids[0])
                    : asprintf(&path, "%.*sdsim-report-%" PRId64 "-%" PRId64 ".html", dlen, db,
                               ids[0], ids[k - 1]);
    if (ok < 0) {
        fprintf(stderr, "dsim run: no report: out of memory\n");
        free(ids);
        return NULL;
    }
    if (dsim_report_html_write(db, ids, k, path) != DSIM_OK) {
        fprintf(stderr, "dsim run: writing the report: %s\n", dsim_errmsg());
        free(path);
        path = NULL;
    }
    free(ids);
    return path;
}

int cmd_run(int argc, char **argv)
{
    run_opts o;
    int rc = run_parse(argc, argv, &o);
    if (rc != 0) {
        free(o.files);
        return rc;
    }
    dsim_ci_report *ci = NULL;
    rc = dsim_ci_open("dsim run", o.junit, o.tap, &ci);
    /* A file with a matrix: section is one run per combination. */
    int n_items = 0;
    run_item *items = NULL;
    if (rc == 0)
        rc = run_expand(&o, ci, &items, &n_items);
    for (int i = 0; rc == 0 && i < n_items; i++) {
        /* tens of thousands of workers under sim: huge pages (harness.h) */
        if (dsim_harness_wants_hugepages(items[i].s)) {
            dsim_harness_reexec_hugepages(argv - 1);
            break;
        }
    }
    dsim_harness_result *reps = calloc((size_t)(n_items ? n_items : 1), sizeof *reps);
    if (!reps) {
        fprintf(stderr, "dsim run: out of memory\n");
        rc = 2;
    }
    const char *db = o.db ? o.db : DSIM_STORE_DEFAULT_PATH;
    int n_loaded = n_items;
    o.n_files = n_items;
    bool json_out_ok = true;
    int n_ran = 0;
    if (rc == 0) {
        dsim_harness_supervise(db, "dsim run");
        if (!run_signals_start())
            fprintf(stderr, "dsim run: cannot watch for interrupts; an interrupted run stays "
                            "'running' until the store is next opened\n");
        dsim_store *st = NULL;
        if (dsim_store_open(o.db, &st) != DSIM_OK) {
            fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
            rc = 2;
        } else {
            pthread_mutex_lock(&run_store_lock);
            run_store = st;
            run_db = db;
            pthread_mutex_unlock(&run_store_lock);
            for (int i = 0; i < o.n_files && !atomic_load(&run_interrupted); i++) {
                run_one(&o, st, &items[i], &reps[i]);
                n_ran = i + 1;
                dsim_ci_run(ci, items[i].file, items[i].s, &reps[i]);
                if (!o.json)
                    run_print_table(&items[i], &reps[i], db);
                if (reps[i].harness_error) {
                    fprintf(stderr, "dsim run: %s: %s\n", items[i].file, reps[i].harness_msg);
                    rc = 2;
                } else if ((reps[i].n_failed || reps[i].status != DSIM_RUN_PASSED) && rc == 0) {
                    rc = 1;
                }
                pthread_mutex_lock(&run_store_lock);
                if (reps[i].run_id > 0) {
                    run_last_id = reps[i].run_id;
                    run_last_status = reps[i].status;
                }
                pthread_mutex_unlock(&run_store_lock);
                run_hold_after_stored();
                if (!o.json && i + 1 < o.n_files)
                    printf("\n");
            }
            pthread_mutex_lock(&run_store_lock);
            st = run_store;
            run_store = NULL;
            pthread_mutex_unlock(&run_store_lock);
            if (dsim_store_close(st) != DSIM_OK) {
                fprintf(stderr, "dsim run: %s\n", dsim_errmsg());
                rc = 2;
            }
        }
        run_signals_stop();
    }
    char *report = NULL;
    if (o.report && n_ran > 0 && !atomic_load(&run_interrupted)) {
        report = run_write_report(db, reps, n_ran);
        if (!report)
            rc = 2;
    }
    if (o.json && n_ran > 0) {
        json_t *arr = json_array();
        for (int i = 0; i < n_ran; i++)
            json_array_append_new(arr, run_report_json(&items[i], &reps[i]));
        json_t *root = json_pack("{s:s, s:b, s:i, s:o, s:s?}", "db", db, "passed", rc == 0,
                                 "exit_status", rc, "runs", arr, "report", report);
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
    if (report && !o.json)
        fprintf(o.tap ? stderr : stdout, "%s\n", report);
    free(report);
    if (dsim_ci_close(ci) != 0)
        rc = 2;
    for (int i = 0; i < n_loaded; i++) {
        dsim_scenario_free(items[i].s);
        dsim_harness_result_free(&reps[i]);
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
