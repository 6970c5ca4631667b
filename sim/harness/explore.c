/* dsim explore: randomised fault search with shrinking (explore.h). */
#include "explore.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsim/rng.h"
#include "engine/engine.h"
#include "harness.h"
#include "isolate.h"
#include "scenario/scenario.h"
#include "scenario/yaml_tree.h"

static const char *const ex_kind_names[] = {"kill",  "pause", "partition", "drop",
                                            "delay", "slow",  "corrupt"};
#define EX_NKINDS 7

unsigned dsim_explore_kind(const char *name)
{
    for (int k = 0; k < EX_NKINDS; k++)
        if (strcmp(name, ex_kind_names[k]) == 0)
            return 1u << k;
    return 0;
}

/* The engine explore runs on: a deterministic one, so that a failure found
 * replays event for event. */
static const char *ex_engine(void)
{
    const dsim_engine_ops *e = dsim_engine_with(DSIM_ENGINE_DETERMINISTIC);
    return e ? e->name : "sim";
}

const char *dsim_explore_kind_names(void)
{
    return "kill, pause, partition, drop, delay, slow, corrupt";
}

/* One fault of a schedule. Where: a rank (kill, pause, slow; partition of
 * one rank against the rest), a worker (kill, pause, partition) or a link
 * of two ranks (drop, delay, corrupt). */
enum { EX_RANK, EX_WORKER, EX_LINK };

typedef struct ex_fault {
    int kind; /* index into ex_kind_names */
    uint64_t step;
    int scope;
    int a, b;       /* rank / worker in a; a link is [a, b] */
    int64_t dur_ms; /* pause, partition, delay; 0: for good (pause, partition) */
    int factor;     /* slow */
} ex_fault;

typedef struct ex_sched {
    ex_fault f[DSIM_EXPLORE_MAX_FAULTS];
    int n;
    int hosts; /* the cluster's hosts for this run */
} ex_sched;

/* What one run came to, handed from the child through a pipe. */
typedef struct ex_outcome {
    bool failed;
    char signature[128];
    char message[512];
    uint64_t steps;
} ex_outcome;

typedef struct ex_ctx {
    const dsim_explore_opts *o;
    char *base; /* the file's text without faults, engine and seed */
    uint64_t scen_seed;
    int hosts, dph; /* the file's cluster */
    uint64_t steps; /* the fault-free run's steps */
} ex_ctx;

static void ex_say(const ex_ctx *c, const char *fmt, ...)
{
    if (!c->o->say)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->o->say(line, c->o->say_user);
}

/* ---- text ------------------------------------------------------------ */

typedef struct ex_buf {
    char *p;
    size_t len, cap;
    bool oom;
} ex_buf;

static void ex_put(ex_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (n >= 0 && b->len + (size_t)n + 1 > cap)
            cap *= 2;
        char *np = n < 0 ? NULL : realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            va_end(ap2);
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

/* The top-level key a line begins ("faults" for "faults:"), or "" when the
 * line belongs to the block above (indented, a sequence item, blank). A
 * comment at column 0 ends a block: it is kept. */
static void ex_top_key(const char *line, size_t len, char *key, size_t cap)
{
    key[0] = '\0';
    if (len == 0 || line[0] == ' ' || line[0] == '\t' || line[0] == '-' || line[0] == '\r')
        return;
    if (line[0] == '#') {
        snprintf(key, cap, "#");
        return;
    }
    size_t k = 0;
    while (k < len && line[k] != ':' && k + 1 < cap) {
        key[k] = line[k];
        k++;
    }
    key[k] = '\0';
}

/* The next line of *p (without its newline) and its top-level key;
 * false at the end of the text. */
static bool ex_line(const char **p, const char **line, size_t *len, char *key, size_t cap)
{
    if (!**p)
        return false;
    const char *nl = strchr(*p, '\n');
    *line = *p;
    *len = nl ? (size_t)(nl - *p) : strlen(*p);
    ex_top_key(*line, *len, key, cap);
    *p = nl ? nl + 1 : *p + *len;
    return true;
}

/* text without the top-level blocks faults, engine, seed and matrix (the
 * file's own shape is explored: a written scenario with the matrix would
 * run every combination, a drawn link fault out of range in some). */
static char *ex_strip(const char *text)
{
    ex_buf b = {0};
    bool skip = false;
    const char *p = text, *line;
    size_t len;
    char key[64];
    while (ex_line(&p, &line, &len, key, sizeof key)) {
        if (key[0])
            skip = strcmp(key, "faults") == 0 || strcmp(key, "engine") == 0 ||
                   strcmp(key, "seed") == 0 || strcmp(key, "matrix") == 0;
        bool blank = true;
        for (size_t i = 0; i < len; i++)
            if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
                blank = false;
        if (!skip && !(blank && !*p))
            ex_put(&b, "%.*s\n", (int)len, line);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p ? b.p : strdup("");
}

/* The cluster block's "hosts: N" set to `hosts` (the first "hosts:" in the
 * top-level cluster block, block or flow style). false when there is none. */
static bool ex_set_hosts(ex_buf *b, const char *text, int hosts)
{
    const char *p = text, *line;
    size_t len;
    char key[64];
    bool in_cluster = false, done = false;
    while (ex_line(&p, &line, &len, key, sizeof key)) {
        if (key[0])
            in_cluster = strcmp(key, "cluster") == 0;
        const char *h = NULL;
        if (in_cluster && !done) {
            for (size_t i = 0; i + 6 <= len; i++) {
                if (strncmp(line + i, "hosts:", 6) == 0 &&
                    (i == 0 || line[i - 1] == ' ' || line[i - 1] == '{' || line[i - 1] == ',')) {
                    h = line + i;
                    break;
                }
            }
        }
        if (h) {
            const char *v = h + 6;
            while (*v == ' ')
                v++;
            const char *e = v;
            while (*e >= '0' && *e <= '9')
                e++;
            ex_put(b, "%.*shosts: %d%.*s\n", (int)(h - line), line, hosts, (int)(line + len - e),
                   e);
            done = true;
        } else {
            ex_put(b, "%.*s\n", (int)len, line);
        }
    }
    return done;
}

static void ex_fault_yaml(ex_buf *b, const ex_fault *f)
{
    ex_put(b, "{what: %s, at_step: %" PRIu64, ex_kind_names[f->kind], f->step);
    if (f->scope == EX_RANK)
        ex_put(b, ", rank: %d", f->a);
    else if (f->scope == EX_WORKER)
        ex_put(b, ", worker: %d", f->a);
    else
        ex_put(b, ", link: [%d, %d]", f->a, f->b);
    if (f->dur_ms > 0)
        ex_put(b, ", duration: %" PRId64 "ms", f->dur_ms);
    if (f->kind == 5)
        ex_put(b, ", factor: %d", f->factor);
    ex_put(b, "}");
}

/* The whole scenario text of a schedule; NULL when out of memory. */
static char *ex_text(const ex_ctx *c, const ex_sched *s, const char *header)
{
    ex_buf b = {0};
    if (header)
        ex_put(&b, "%s", header);
    if (s->hosts != c->hosts) {
        if (!ex_set_hosts(&b, c->base, s->hosts)) {
            free(b.p);
            return NULL;
        }
    } else {
        ex_put(&b, "%s", c->base);
    }
    ex_put(&b,
           "\n# dsim explore: the run's engine, seed and faults\nengine: %s\nseed: %" PRIu64
           "\nfaults:%s\n",
           ex_engine(), c->scen_seed, s->n ? "" : " []");
    for (int i = 0; i < s->n; i++) {
        ex_put(&b, "  - ");
        ex_fault_yaml(&b, &s->f[i]);
        ex_put(&b, "\n");
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static void ex_sched_lines(const ex_sched *s, char *out, size_t cap)
{
    ex_buf b = {0};
    for (int i = 0; i < s->n; i++) {
        ex_put(&b, "  - ");
        ex_fault_yaml(&b, &s->f[i]);
        ex_put(&b, "\n");
    }
    snprintf(out, cap, "%s", b.p && !b.oom ? b.p : "");
    free(b.p);
}

static void ex_fault_short(const ex_fault *f, char *out, size_t cap)
{
    ex_buf b = {0};
    ex_fault_yaml(&b, f);
    snprintf(out, cap, "%s", b.p && !b.oom ? b.p : "?");
    free(b.p);
}

/* ---- one run, in a child ---------------------------------------------- */

/* Runs `text` (named `path` in messages and for a relative plugin) in a
 * child process bounded by the run timeout (isolate.h). */
static void ex_run(const ex_ctx *c, const char *path, const char *text, ex_outcome *out)
{
    memset(out, 0, sizeof *out);
    dsim_harness_opts ho = {.size = sizeof ho, .engine_override = ex_engine()};
    dsim_isolated iso;
    if (dsim_isolated_run(path, text, &ho, c->o->run_timeout_s, NULL, &iso) != DSIM_OK) {
        out->failed = true;
        snprintf(out->signature, sizeof out->signature, "error");
        snprintf(out->message, sizeof out->message, "%.500s", dsim_errmsg());
        return;
    }
    dsim_isolated_signature(&iso, out->signature, sizeof out->signature, out->message,
                            sizeof out->message);
    out->failed = out->signature[0] != '\0';
    out->steps = iso.r.steps;
    dsim_isolated_free(&iso);
}

/* Parses a candidate before running it: a schedule this scenario refuses
 * is no run (and never a failure). */
static bool ex_valid(const char *path, const char *text, char *why, size_t cap)
{
    dsim_scenario *s = NULL;
    if (dsim_scenario_parse(path, text, strlen(text), &s) != DSIM_OK) {
        snprintf(why, cap, "%s", dsim_errmsg());
        return false;
    }
    dsim_scenario_free(s);
    return true;
}

/* text without expect.node_loss: that check judges a fault that loses a
 * node, and a run without faults has none to judge (it would fail it).
 * text itself when there is no such check (or the text does not parse:
 * ex_valid says why); NULL when out of memory. Frees text when it returns
 * another. */
static char *ex_without_node_loss(const char *path, char *text, bool *dropped)
{
    *dropped = false;
    dsim_yaml_node *t = NULL;
    if (dsim_yaml_parse(path, text, strlen(text), &t) != DSIM_OK) {
        dsim_clear_error();
        return text;
    }
    dsim_yaml_node *ex = dsim_yaml_map_get(t, "expect");
    if (!ex || ex->kind != DSIM_YAML_MAP || !dsim_yaml_map_get(ex, "node_loss")) {
        dsim_yaml_free(t);
        return text;
    }
    dsim_yaml_map_del(ex, "node_loss");
    char *out = dsim_yaml_emit(t);
    dsim_yaml_free(t);
    free(text);
    *dropped = out != NULL;
    return out;
}

void dsim_explore_write_base(const dsim_explore_opts *o, dsim_explore_result *out, const char *what,
                             const char *signature, const char *text)
{
    if (!out->out_path[0])
        return;
    FILE *f = fopen(out->out_path, "w");
    bool ok = f && fprintf(f,
                           "# Written by dsim explore %s: the scenario %s, which fails (%s); "
                           "explore needs it to pass.\n"
                           "# Reproduce: dsim run %s%s\n%s",
                           o->path, what, signature, out->out_path, o->run_args ? o->run_args : "",
                           text) > 0;
    if (f && fclose(f) != 0)
        ok = false;
    out->baseline_written = ok;
}

/* ---- drawing a schedule ------------------------------------------------ */

static void ex_draw(const ex_ctx *c, uint64_t run, ex_sched *s)
{
    dsim_rng st;
    dsim_rng_init(&st, c->o->seed, "explore", run);
    int kinds[EX_NKINDS], nk = 0;
    for (int k = 0; k < EX_NKINDS; k++)
        if (c->o->kinds & (1u << k))
            kinds[nk++] = k;
    int ranks = c->hosts * c->dph;
    memset(s, 0, sizeof *s);
    s->hosts = c->hosts;
    s->n = 1 + (int)dsim_rng_below(&st, (uint64_t)c->o->max_faults);
    for (int i = 0; i < s->n; i++) {
        ex_fault *f = &s->f[i];
        f->kind = kinds[dsim_rng_below(&st, (uint64_t)nk)];
        f->step = dsim_rng_below(&st, c->steps ? c->steps : 1);
        switch (f->kind) {
        case 0: /* kill */
        case 1: /* pause */
        case 2: /* partition */
            if (c->hosts > 1 && dsim_rng_below(&st, 2)) {
                f->scope = EX_WORKER;
                f->a = (int)dsim_rng_below(&st, (uint64_t)c->hosts);
            } else {
                f->scope = EX_RANK;
                f->a = (int)dsim_rng_below(&st, (uint64_t)ranks);
            }
            if (f->kind == 1 && dsim_rng_below(&st, 2))
                f->dur_ms = 0; /* paused for good: a lost peer */
            else if (f->kind != 0)
                f->dur_ms = 10 * (1 + (int64_t)dsim_rng_below(&st, 300)); /* 10 ms .. 3 s */
            break;
        case 3: /* drop */
        case 4: /* delay */
        case 6: /* corrupt */
            f->scope = EX_LINK;
            f->a = (int)dsim_rng_below(&st, (uint64_t)ranks);
            f->b = (int)dsim_rng_below(&st, (uint64_t)(ranks - 1));
            if (f->b >= f->a)
                f->b++;
            if (f->kind == 4)
                f->dur_ms = 1 + (int64_t)dsim_rng_below(&st, 2000);
            break;
        case 5: /* slow */
            f->scope = EX_RANK;
            f->a = (int)dsim_rng_below(&st, (uint64_t)ranks);
            f->factor = 2 + (int)dsim_rng_below(&st, 19);
            break;
        }
    }
}

/* ---- shrinking ---------------------------------------------------------- */

typedef struct ex_shrink {
    ex_ctx *c;
    ex_sched cur;
    const char *sig;
    ex_outcome last;
    int tries, kept;
    bool no_fewer_hosts; /* a smaller cluster failed without faults */
} ex_shrink;

/* Runs candidate `cand`; keeps it when it fails with the same signature. */
static bool ex_try(ex_shrink *sh, const ex_sched *cand, const char *what)
{
    if (sh->tries >= sh->c->o->max_shrink_runs)
        return false;
    char *text = ex_text(sh->c, cand, NULL);
    char why[512];
    if (!text || !ex_valid(sh->c->o->path, text, why, sizeof why)) {
        free(text);
        return false;
    }
    sh->tries++;
    ex_outcome o;
    ex_run(sh->c, sh->c->o->path, text, &o);
    free(text);
    bool keep = o.failed && strcmp(o.signature, sh->sig) == 0;
    if (keep || !o.failed)
        ex_say(sh->c, "shrink %d: %s: %s", sh->tries, what,
               keep ? "still fails the same way, kept" : "passes, undone");
    else
        ex_say(sh->c, "shrink %d: %s: fails otherwise (%s), undone", sh->tries, what, o.signature);
    if (keep) {
        sh->cur = *cand;
        sh->last = o;
        sh->kept++;
    }
    return keep;
}

/* Whether the scenario passes without faults on `hosts` hosts (a shrink
 * run of its own). */
static bool ex_shape_passes(ex_shrink *sh, int hosts, const char *what)
{
    if (sh->tries >= sh->c->o->max_shrink_runs)
        return false;
    ex_sched none = {.hosts = hosts};
    char *text = ex_text(sh->c, &none, NULL);
    bool no_nl;
    if (text)
        text = ex_without_node_loss(sh->c->o->path, text, &no_nl);
    char why[512];
    if (!text || !ex_valid(sh->c->o->path, text, why, sizeof why)) {
        free(text);
        ex_say(sh->c, "shrink: %s: that cluster does not load, not tried", what);
        return false;
    }
    sh->tries++;
    ex_outcome o;
    ex_run(sh->c, sh->c->o->path, text, &o);
    free(text);
    if (o.failed)
        ex_say(sh->c, "shrink %d: %s: fails without any fault (%s: %.200s), not tried", sh->tries,
               what, o.signature, o.message);
    return !o.failed;
}

static bool ex_fits(const ex_sched *s, int hosts, int dph)
{
    int ranks = hosts * dph;
    for (int i = 0; i < s->n; i++) {
        const ex_fault *f = &s->f[i];
        if (f->scope == EX_WORKER && f->a >= hosts)
            return false;
        if (f->scope != EX_WORKER && (f->a >= ranks || (f->scope == EX_LINK && f->b >= ranks)))
            return false;
    }
    return true;
}

static void ex_shrink_run(ex_shrink *sh)
{
    char what[512], fs[256];
    bool changed = true;
    while (changed && sh->tries < sh->c->o->max_shrink_runs) {
        changed = false;
        /* drop a fault */
        for (int i = sh->cur.n - 1; i >= 0 && sh->cur.n > 1; i--) {
            ex_sched cand = sh->cur;
            ex_fault_short(&cand.f[i], fs, sizeof fs);
            memmove(&cand.f[i], &cand.f[i + 1], (size_t)(cand.n - i - 1) * sizeof cand.f[0]);
            cand.n--;
            snprintf(what, sizeof what, "drop %s (%d faults left)", fs, cand.n);
            if (ex_try(sh, &cand, what))
                changed = true;
        }
        for (int i = 0; i < sh->cur.n; i++) {
            /* move it earlier */
            uint64_t step = sh->cur.f[i].step;
            uint64_t to[3] = {0, step / 2, step ? step - 1 : 0};
            for (int k = 0; k < 3; k++) {
                /* (step 1: all three are 0; tried once) */
                if (to[k] >= sh->cur.f[i].step || (k > 0 && to[k] == to[k - 1]) ||
                    (k > 1 && to[k] == to[0]))
                    continue;
                ex_sched cand = sh->cur;
                cand.f[i].step = to[k];
                ex_fault_short(&sh->cur.f[i], fs, sizeof fs);
                snprintf(what, sizeof what, "%s to step %" PRIu64, fs, to[k]);
                if (ex_try(sh, &cand, what)) {
                    changed = true;
                    break;
                }
            }
            /* narrow a worker to its first rank */
            if (sh->cur.f[i].scope == EX_WORKER) {
                ex_sched cand = sh->cur;
                cand.f[i].scope = EX_RANK;
                cand.f[i].a = sh->cur.f[i].a * sh->c->dph;
                ex_fault_short(&sh->cur.f[i], fs, sizeof fs);
                snprintf(what, sizeof what, "%s on rank %d only", fs, cand.f[i].a);
                if (ex_try(sh, &cand, what))
                    changed = true;
            }
            /* a lower rank, worker or link: the faults then fit fewer hosts */
            if (sh->cur.f[i].a > 0) {
                int to_a[2] = {0, sh->cur.f[i].a / 2};
                for (int k = 0; k < 2; k++) {
                    if (k == 1 && to_a[1] == 0)
                        break;
                    ex_sched cand = sh->cur;
                    cand.f[i].a = to_a[k];
                    if (cand.f[i].scope == EX_LINK && cand.f[i].b == to_a[k])
                        cand.f[i].b = sh->cur.f[i].a; /* [a, b] -> [b', a]: still a link */
                    ex_fault_short(&sh->cur.f[i], fs, sizeof fs);
                    snprintf(what, sizeof what, "%s on %s %d", fs,
                             cand.f[i].scope == EX_WORKER ? "worker" : "rank", to_a[k]);
                    if (ex_try(sh, &cand, what)) {
                        changed = true;
                        break;
                    }
                }
            }
            if (sh->cur.f[i].scope == EX_LINK && sh->cur.f[i].b > 0) {
                ex_sched cand = sh->cur;
                cand.f[i].b = sh->cur.f[i].a == 0 ? 1 : 0;
                if (cand.f[i].b < sh->cur.f[i].b) {
                    ex_fault_short(&sh->cur.f[i], fs, sizeof fs);
                    snprintf(what, sizeof what, "%s to rank %d", fs, cand.f[i].b);
                    if (ex_try(sh, &cand, what))
                        changed = true;
                }
            }
            /* halve a duration or a slow factor */
            if (sh->cur.f[i].dur_ms > 1) {
                ex_sched cand = sh->cur;
                cand.f[i].dur_ms /= 2;
                ex_fault_short(&sh->cur.f[i], fs, sizeof fs);
                snprintf(what, sizeof what, "%s for %" PRId64 "ms", fs, cand.f[i].dur_ms);
                if (ex_try(sh, &cand, what))
                    changed = true;
            }
            if (sh->cur.f[i].kind == 5 && sh->cur.f[i].factor > 2) {
                ex_sched cand = sh->cur;
                cand.f[i].factor = (cand.f[i].factor + 1) / 2 < 2 ? 2 : (cand.f[i].factor + 1) / 2;
                ex_fault_short(&sh->cur.f[i], fs, sizeof fs);
                snprintf(what, sizeof what, "%s with factor %d", fs, cand.f[i].factor);
                if (ex_try(sh, &cand, what))
                    changed = true;
            }
        }
        /* one host fewer, where that cluster passes without faults: a
         * smaller cluster can fail on its own (a global batch the replicas
         * no longer divide), and that failure is not the faults' */
        if (sh->cur.hosts > 2 && !sh->no_fewer_hosts &&
            ex_fits(&sh->cur, sh->cur.hosts - 1, sh->c->dph)) {
            ex_sched cand = sh->cur;
            cand.hosts--;
            snprintf(what, sizeof what, "%d hosts instead of %d", cand.hosts, sh->cur.hosts);
            if (ex_shape_passes(sh, cand.hosts, what)) {
                if (ex_try(sh, &cand, what))
                    changed = true;
            } else {
                sh->no_fewer_hosts = true;
            }
        }
    }
}

/* ---- the search ----------------------------------------------------------- */

static char *ex_default_out(const char *name)
{
    size_t n = strlen(name) + 16;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s.explore.yaml", name);
    return p;
}

static double ex_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static dsim_err ex_opts_check(const dsim_explore_opts *o)
{
    if (!o || o->size < sizeof *o || !o->path)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_explore: no scenario");
    if (o->runs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "--runs is 0 (accepted: a whole number >= 1)");
    if (o->max_faults < 1 || o->max_faults > DSIM_EXPLORE_MAX_FAULTS)
        return DSIM_ERR(DSIM_EINVAL, -1, "--max-faults is %d (accepted: 1 to %d)", o->max_faults,
                        DSIM_EXPLORE_MAX_FAULTS);
    if (!(o->kinds & DSIM_EXPLORE_ALL_KINDS))
        return DSIM_ERR(DSIM_EINVAL, -1, "no fault kinds (accepted: %s)",
                        dsim_explore_kind_names());
    if (!(o->run_timeout_s > 0) || o->max_shrink_runs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "a run's timeout and the shrink runs must be > 0");
    return DSIM_OK;
}

/* The scenario, loaded and checked for this engine: c's seed, shape and
 * base text (without faults, engine and seed) and its name. */
static dsim_err ex_load(const dsim_explore_opts *o, ex_ctx *c, char **name)
{
    dsim_scenario *s = NULL;
    DSIM_CHECK(dsim_scenario_load(o->path, &s));
    dsim_harness_opts ho = {.size = sizeof ho, .engine_override = ex_engine()};
    dsim_err e = dsim_harness_prepare(s, &ho);
    if (e == DSIM_OK && s->expect_error)
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "%s expects an error (expect.error): a run that must fail has nothing "
                     "to explore",
                     o->path);
    if (e == DSIM_OK) {
        *c = (ex_ctx){.o = o,
                      .scen_seed = s->seed,
                      .hosts = s->train.hosts,
                      .dph = s->train.devices_per_host};
        *name = strdup(s->name ? s->name : "scenario");
        c->base = ex_strip(s->text ? s->text : "");
    }
    dsim_scenario_free(s);
    return e;
}

/* The fault-free run: it must pass, and it says how many steps there are.
 * False when there is nothing to explore (*rc says whether that is an
 * error). */
static bool ex_baseline(ex_ctx *c, const char *name, dsim_explore_result *out, dsim_err *rc)
{
    const dsim_explore_opts *o = c->o;
    ex_sched none = {.hosts = c->hosts};
    char *text = ex_text(c, &none, NULL);
    bool no_nl = false;
    if (text)
        text = ex_without_node_loss(o->path, text, &no_nl);
    char why[512];
    if (!text || !ex_valid(o->path, text, why, sizeof why)) {
        *rc = DSIM_ERR(DSIM_EINVAL, -1, "%s without its faults does not load: %s", o->path,
                       text ? why : "out of memory");
        free(text);
        return false;
    }
    ex_outcome base;
    ex_run(c, o->path, text, &base);
    if (base.failed)
        dsim_explore_write_base(o, out, "without its faults", base.signature, text);
    free(text);
    if (base.failed) {
        out->baseline_failed = true;
        out->found = true;
        snprintf(out->signature, sizeof out->signature, "%s", base.signature);
        snprintf(out->message, sizeof out->message, "%s", base.message);
        ex_say(c, "the scenario fails without any fault (%s: %s): nothing to explore",
               base.signature, base.message);
        return false;
    }
    c->steps = base.steps;
    if (no_nl)
        ex_say(c, "the run without faults is not judged by node_loss (it judges a fault that "
                  "loses a node; every drawn schedule is)");
    ex_say(c,
           "%s: %d hosts x %d devices, %" PRIu64 " steps without faults; exploring %" PRIu64
           " runs of up to %d faults (seed %" PRIu64 ")",
           name, c->hosts, c->dph, c->steps, o->runs, o->max_faults, o->seed);
    return true;
}

/* Runs drawn schedules until one fails (*found, *fo, out->found) or the
 * runs are spent. */
static dsim_err ex_search(ex_ctx *c, dsim_explore_result *out, ex_sched *found, ex_outcome *fo)
{
    const dsim_explore_opts *o = c->o;
    uint64_t next_report = 1;
    double t0 = ex_now(), last_say = t0;
    char why[512];
    for (uint64_t i = 1; i <= o->runs; i++) {
        ex_sched sc;
        ex_draw(c, i, &sc);
        char *text = ex_text(c, &sc, NULL);
        if (!text || !ex_valid(o->path, text, why, sizeof why)) {
            dsim_err e =
                DSIM_ERR(DSIM_EINVAL, -1, "run %" PRIu64 ": the drawn schedule does not load: %s",
                         i, text ? why : "out of memory");
            free(text);
            return e;
        }
        ex_outcome r;
        ex_run(c, o->path, text, &r);
        free(text);
        out->runs_done = i;
        double now = ex_now();
        if (r.failed) {
            *found = sc;
            *fo = r;
            out->found = true;
            out->failing_run = i;
            ex_say(c, "run %" PRIu64 "/%" PRIu64 ": FAILED (%s) with %d faults: %s", i, o->runs,
                   r.signature, sc.n, r.message);
            return DSIM_OK;
        }
        if (i == next_report || now - last_say >= 1.0 || i == o->runs) {
            ex_say(c, "run %" PRIu64 "/%" PRIu64 ": passed; 0 failures so far (%.1f s)", i, o->runs,
                   now - t0);
            last_say = now;
            next_report = i < 10 ? i + 1 : i * 2;
        }
    }
    ex_say(c, "%" PRIu64 " runs, no failure", out->runs_done);
    return DSIM_OK;
}

/* Shrinks the failing schedule, writes it to outp as a scenario and runs
 * that file once more, as `dsim run` will. */
static dsim_err ex_shrink_write(ex_ctx *c, const char *outp, const ex_sched *found,
                                const ex_outcome *fo, dsim_explore_result *out)
{
    const dsim_explore_opts *o = c->o;
    snprintf(out->signature, sizeof out->signature, "%s", fo->signature);
    out->faults_found = found->n;
    ex_shrink sh = {.c = c, .cur = *found, .sig = out->signature, .last = *fo};
    ex_say(c, "shrinking %d faults (keeping a change only if the run still fails with %s)",
           found->n, out->signature);
    ex_shrink_run(&sh);
    out->shrink_steps = sh.kept;
    out->shrink_runs = sh.tries;
    out->faults_final = sh.cur.n;
    out->hosts_final = sh.cur.hosts;
    snprintf(out->message, sizeof out->message, "%s", sh.last.message);
    ex_sched_lines(&sh.cur, out->schedule, sizeof out->schedule);
    ex_say(c, "shrunk to %d fault%s in %d kept change%s of %d runs", sh.cur.n,
           sh.cur.n == 1 ? "" : "s", sh.kept, sh.kept == 1 ? "" : "s", sh.tries);
    char header[1024];
    snprintf(header, sizeof header,
             "# Written by dsim explore %s --seed %" PRIu64 " (run %" PRIu64
             " failed with %s; shrunk from %d faults to %d).\n"
             "# Reproduce: dsim run %s%s\n",
             o->path, o->seed, out->failing_run, out->signature, out->faults_found, sh.cur.n, outp,
             o->run_args ? o->run_args : "");
    char *text = ex_text(c, &sh.cur, header);
    FILE *f = text ? fopen(outp, "w") : NULL;
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) {
        free(text);
        return DSIM_ERR(DSIM_EIO, -1, "cannot write %s: %s", outp, strerror(errno));
    }
    /* verify: run the written file, as `dsim run` will */
    ex_outcome v;
    ex_run(c, outp, text, &v);
    free(text);
    out->reproduced = v.failed && strcmp(v.signature, out->signature) == 0;
    ex_say(c, "verify: %s %s", outp,
           out->reproduced ? "fails the same way again" : "did NOT fail the same way again");
    return DSIM_OK;
}

dsim_err dsim_explore(const dsim_explore_opts *o, dsim_explore_result *out)
{
    memset(out, 0, sizeof *out);
    DSIM_CHECK(ex_opts_check(o));
    ex_ctx c;
    char *name = NULL;
    DSIM_CHECK(ex_load(o, &c, &name));
    char *outp = o->out_path ? strdup(o->out_path) : (name ? ex_default_out(name) : NULL);
    if (!c.base || !name || !outp) {
        free(c.base);
        free(name);
        free(outp);
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim explore: out of memory");
    }
    snprintf(out->out_path, sizeof out->out_path, "%s", outp);
    dsim_err rc = DSIM_OK;
    ex_sched found = {0};
    ex_outcome fo = {0};
    if (ex_baseline(&c, name, out, &rc) && (rc = ex_search(&c, out, &found, &fo)) == DSIM_OK &&
        out->found)
        rc = ex_shrink_write(&c, outp, &found, &fo, out);
    free(c.base);
    free(name);
    free(outp);
    return rc;
}
