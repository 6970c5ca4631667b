/* Scenario files: YAML -> a validated dsim_scenario (see scenario.h and
 * scenarios/FORMAT.md).
 *
 * The file is read into a tree (yaml_tree.c) that keeps every node's line
 * and column; each section is then read against its list of accepted keys,
 * every value is typed and range-checked where it stands, and the
 * combinations are checked last (cluster shape against the strategy, model
 * against the data, faults against the cluster), pointing at the value that
 * decides. Nothing is run and nothing is loaded: a plugin's file is only
 * checked to exist. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libgen.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "dsim/cluster.h"
#include "dsim_config.h"
#include "engine/engine.h"
#include "model/costmodel.h"
#include "scenario/defaults.h"
#include "scenario/scenario.h"
#include "scenario/units.h"
#include "scenario/yaml_tree.h"

#define SCEN_MAX_FILE  (1u << 20)
#define SCEN_MAX_KEYS  24
#define SCEN_MAX_STR   4096
#define SCEN_MAX_HOSTS DSIM_TRAIN_MAX_REPLICAS
/* What the health check's first round costs per pair of workers, rounded
 * up from reports/bench-sim-scale.txt (dsim_scenario_runnable). */
#define SCEN_HEALTH_PAIR_BYTES 400
/* What a replica costs under sim (the same report: 0.31-0.45 MiB with a
 * small model, its store records included; 28 KiB timing only), rounded up,
 * before its model's parameters, gradient, optimizer state and copies (about
 * 20 bytes per float32 parameter). */
#define SCEN_REPLICA_BYTES        (512.0 * 1024)
#define SCEN_TIMING_REPLICA_BYTES (48.0 * 1024)
#define SCEN_PARAM_BYTES          20.0
/* dsim_train's limits (dsim/strategy.h), refused here with their position
 * rather than by the run. */
#define SCEN_MAX_PS DSIM_TRAIN_MAX_PS

typedef dsim_yaml_node scen_node;

typedef struct scen_ctx {
    const char *path;
    dsim_scenario *s;
    const scen_node *root;
} scen_ctx;

/* One mapping read against its accepted keys. */
typedef struct scen_map {
    const scen_node *node; /* the mapping; NULL when the section is absent */
    const scen_node *at;   /* where the section is (its key), for problems with no value */
    char path[64];         /* "strategy.health_check"; "" at the top */
    const char *const *names;
    size_t n;
    const scen_node *key[SCEN_MAX_KEYS], *val[SCEN_MAX_KEYS];
} scen_map;

typedef struct scen_name {
    const char *name;
    int value;
} scen_name;

#define SCEN_N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- messages ---- */

static dsim_err scen_fail(const scen_ctx *c, const scen_node *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static dsim_err scen_fail(const scen_ctx *c, const scen_node *at, const char *fmt, ...)
{
    char msg[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = at ? at->line : 1, col = at ? at->column : 1;
    return DSIM_ERR(DSIM_EINVAL, -1, "%s:%d:%d: %s", c->path, line, col, msg);
}

/* How a value reads in a message: 'text' (shortened, control bytes
 * escaped), "an empty value", "a mapping", "a list". */
static const char *scen_show(const scen_node *n, char *buf, size_t cap)
{
    if (!n)
        return "nothing";
    if (n->kind == DSIM_YAML_MAP)
        return "a mapping";
    if (n->kind == DSIM_YAML_SEQ)
        return "a list";
    if (dsim_yaml_is_null(n))
        return "an empty value";
    size_t o = 0;
    buf[o++] = '\'';
    for (size_t i = 0; i < n->len; i++) {
        unsigned char ch = (unsigned char)n->s[i];
        /* Stop only where a character starts, so that a shortened value is
         * still UTF-8; 12 bytes keep room for one more character (or its
         * escape), the "...", the quote and the NUL. */
        if ((ch & 0xc0) != 0x80 && (i >= 48 || o + 12 >= cap)) {
            o += (size_t)snprintf(buf + o, cap - o, "...");
            break;
        }
        if (ch < 0x20 || ch == 0x7f)
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else
            buf[o++] = (char)ch;
    }
    buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

static void scen_names_list(const scen_name *t, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < cap; i++) {
        int w = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", t[i].name);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

static void scen_keys_list(const char *const *k, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < cap; i++) {
        int w = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", k[i]);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

/* Edit distance, for "did you mean" on a misspelt key (short words only). */
static size_t scen_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    size_t row[41];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cur = row[j];
            size_t sub = prev + (a[i - 1] != b[j - 1]);
            size_t del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[lb];
}

static const char *scen_suggest(const char *word, const char *const *k, size_t n)
{
    const char *best = NULL;
    size_t bd = 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = scen_distance(word, k[i]);
        if (d < bd) {
            bd = d;
            best = k[i];
        }
    }
    return best;
}

static void scen_keypath(char *buf, size_t cap, const char *path, const char *key)
{
    if (path[0])
        snprintf(buf, cap, "%s.%s", path, key);
    else
        snprintf(buf, cap, "%s", key);
}

/* ---- reading a mapping against its keys ---- */

static dsim_err scen_map_read(const scen_ctx *c, const scen_node *node, const scen_node *at,
                              const char *path, const char *const *names, size_t n, scen_map *m)
{
    memset(m, 0, sizeof *m);
    m->node = node;
    m->at = at ? at : node;
    snprintf(m->path, sizeof m->path, "%s", path);
    m->names = names;
    m->n = n;
    char keys[400], show[96];
    if (!node || dsim_yaml_is_null(node)) {
        m->node = NULL;
        return DSIM_OK;
    }
    if (node->kind != DSIM_YAML_MAP) {
        scen_keys_list(names, n, keys, sizeof keys);
        return scen_fail(c, node,
                         "%s: %s is not a mapping; write it as keys under '%s:' "
                         "(accepted keys: %s)",
                         path[0] ? path : "the file", scen_show(node, show, sizeof show),
                         path[0] ? path : "the top level", keys);
    }
    for (size_t p = 0; p + 1 < node->n; p += 2) {
        const scen_node *k = node->kid[p];
        size_t i = 0;
        while (i < n && !(strlen(names[i]) == k->len && strcmp(names[i], k->s) == 0))
            i++;
        if (i == n) {
            scen_keys_list(names, n, keys, sizeof keys);
            const char *near = scen_suggest(k->s, names, n);
            char hint[64] = "";
            if (near)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            return scen_fail(c, k, "%s: unknown key %s%s; accepted: %s",
                             path[0] ? path : "top level", scen_show(k, show, sizeof show), hint,
                             keys);
        }
        if (m->key[i]) {
            char kp[96];
            scen_keypath(kp, sizeof kp, path, names[i]);
            return scen_fail(c, k,
                             "%s: the key appears twice (first at line %d, column %d); keep one",
                             kp, m->key[i]->line, m->key[i]->column);
        }
        m->key[i] = k;
        m->val[i] = node->kid[p + 1];
    }
    return DSIM_OK;
}

static void scen_kp(char *buf, size_t cap, const scen_map *m, int i)
{
    scen_keypath(buf, cap, m->path, m->names[i]);
}

/* Where to point for a problem about key i: its value, else the section. */
static const scen_node *scen_where(const scen_map *m, int i)
{
    if (i >= 0 && m->val[i])
        return m->val[i];
    return m->at;
}

/* ---- typed values ---- */

static bool scen_is_scalar(const scen_node *v)
{
    return v && v->kind == DSIM_YAML_SCALAR && !dsim_yaml_is_null(v);
}

/* A plain decimal integer (optional sign). */
static bool scen_parse_i64(const scen_node *v, int64_t *out)
{
    if (!scen_is_scalar(v) || !v->plain || strlen(v->s) != v->len)
        return false;
    const char *p = v->s;
    if (*p == '+' || *p == '-')
        p++;
    if (!*p)
        return false;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return false;
    errno = 0;
    char *end;
    long long x = strtoll(v->s, &end, 10);
    if (errno == ERANGE || *end)
        return false;
    *out = x;
    return true;
}

static dsim_err scen_int_v(const scen_ctx *c, const scen_node *v, const char *kp, int64_t lo,
                           int64_t hi, int64_t *out)
{
    char show[96];
    int64_t x;
    if (!scen_parse_i64(v, &x)) {
        /* "1e3" and "2.0" are numbers, but not whole numbers as written */
        const char *why = v && v->kind == DSIM_YAML_SCALAR && !v->plain && !dsim_yaml_is_null(v)
                              ? " (it is quoted, so it is text)"
                              : "";
        return scen_fail(c, v, "%s: %s is not a whole number%s; accepted: %" PRId64 "..%" PRId64,
                         kp, scen_show(v, show, sizeof show), why, lo, hi);
    }
    if (x < lo || x > hi)
        return scen_fail(c, v, "%s: %s is out of range; accepted: %" PRId64 "..%" PRId64, kp,
                         scen_show(v, show, sizeof show), lo, hi);
    *out = x;
    return DSIM_OK;
}

static dsim_err scen_int(const scen_ctx *c, const scen_map *m, int i, int64_t lo, int64_t hi,
                         int64_t *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96];
    scen_kp(kp, sizeof kp, m, i);
    return scen_int_v(c, m->val[i], kp, lo, hi, out);
}

static bool scen_parse_real(const scen_node *v, double *out)
{
    if (!scen_is_scalar(v) || !v->plain || strlen(v->s) != v->len)
        return false;
    for (const char *q = v->s; *q; q++)
        if (!strchr("0123456789.eE+-", *q))
            return false;
    errno = 0;
    char *end;
    double x = strtod(v->s, &end);
    if (*end || end == v->s || !isfinite(x))
        return false;
    *out = x;
    return true;
}

/* A number in lo..hi; lo_open/hi_open exclude the bound. */
static dsim_err scen_real_v(const scen_ctx *c, const scen_node *v, const char *kp, double lo,
                            double hi, bool lo_open, bool hi_open, double *out)
{
    char show[96], range[96];
    snprintf(range, sizeof range, "a number in %c%g, %g%c", lo_open ? '(' : '[', lo, hi,
             hi_open ? ')' : ']');
    double x;
    if (!scen_parse_real(v, &x))
        return scen_fail(c, v, "%s: %s is not a number; accepted: %s", kp,
                         scen_show(v, show, sizeof show), range);
    if (x < lo || x > hi || (lo_open && x == lo) || (hi_open && x == hi))
        return scen_fail(c, v, "%s: %s is out of range; accepted: %s", kp,
                         scen_show(v, show, sizeof show), range);
    *out = x;
    return DSIM_OK;
}

static dsim_err scen_real(const scen_ctx *c, const scen_map *m, int i, double lo, double hi,
                          bool lo_open, bool hi_open, double *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96];
    scen_kp(kp, sizeof kp, m, i);
    return scen_real_v(c, m->val[i], kp, lo, hi, lo_open, hi_open, out);
}

static bool scen_parse_bool(const scen_node *v, bool *out)
{
    if (!scen_is_scalar(v) || !v->plain)
        return false;
    if (!strcmp(v->s, "true") || !strcmp(v->s, "True") || !strcmp(v->s, "TRUE")) {
        *out = true;
        return true;
    }
    if (!strcmp(v->s, "false") || !strcmp(v->s, "False") || !strcmp(v->s, "FALSE")) {
        *out = false;
        return true;
    }
    return false;
}

static dsim_err scen_bool(const scen_ctx *c, const scen_map *m, int i, bool *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96], show[96];
    scen_kp(kp, sizeof kp, m, i);
    if (!scen_parse_bool(m->val[i], out))
        return scen_fail(c, m->val[i], "%s: %s is not a boolean; accepted: true, false", kp,
                         scen_show(m->val[i], show, sizeof show));
    return DSIM_OK;
}

/* Any non-empty scalar as text (no NUL bytes, at most SCEN_MAX_STR). */
static dsim_err scen_str_v(const scen_ctx *c, const scen_node *v, const char *kp, const char *what,
                           char **out)
{
    char show[96];
    if (!scen_is_scalar(v) || v->len == 0)
        return scen_fail(c, v, "%s: %s is not %s", kp, scen_show(v, show, sizeof show), what);
    if (strlen(v->s) != v->len)
        return scen_fail(c, v, "%s: the text holds a NUL byte; accepted: %s", kp, what);
    if (v->len > SCEN_MAX_STR)
        return scen_fail(c, v, "%s: the text is %zu bytes long; accepted: %s of at most %d bytes",
                         kp, v->len, what, SCEN_MAX_STR);
    char *d = strdup(v->s);
    if (!d)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    free(*out);
    *out = d;
    return DSIM_OK;
}

static dsim_err scen_enum_v(const scen_ctx *c, const scen_node *v, const char *kp, const char *noun,
                            const scen_name *t, size_t n, int *out)
{
    char show[96], names[256];
    if (scen_is_scalar(v) && strlen(v->s) == v->len) {
        for (size_t i = 0; i < n; i++) {
            if (strcasecmp(v->s, t[i].name) == 0) {
                *out = t[i].value;
                return DSIM_OK;
            }
        }
    }
    scen_names_list(t, n, names, sizeof names);
    return scen_fail(c, v, "%s: %s is not %s; accepted: %s", kp, scen_show(v, show, sizeof show),
                     noun, names);
}

static dsim_err scen_enum(const scen_ctx *c, const scen_map *m, int i, const char *noun,
                          const scen_name *t, size_t n, int *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96];
    scen_kp(kp, sizeof kp, m, i);
    return scen_enum_v(c, m->val[i], kp, noun, t, n, out);
}

static dsim_err scen_duration(const scen_ctx *c, const scen_map *m, int i, int64_t lo_ns,
                              int64_t *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96], show[96], why[200];
    scen_kp(kp, sizeof kp, m, i);
    const scen_node *v = m->val[i];
    int64_t ns;
    if (!scen_is_scalar(v) || strlen(v->s) != v->len) {
        return scen_fail(c, v,
                         "%s: %s is not a duration; accepted: a number with a unit, e.g. "
                         "30s or 500ms (units: ns, us, ms, s, m, h)",
                         kp, scen_show(v, show, sizeof show));
    }
    /* Where 0 means something (no deadline, off), a bare 0 needs no unit. */
    if (lo_ns == 0 && strcmp(v->s, "0") == 0)
        ns = 0;
    else if (!dsim_unit_duration(v->s, &ns, why, sizeof why))
        return scen_fail(c, v, "%s: %s %s", kp, scen_show(v, show, sizeof show), why);
    if (ns < lo_ns) {
        char lo[32];
        dsim_unit_format_duration(lo_ns, lo, sizeof lo);
        return scen_fail(c, v, "%s: %s is too short; accepted: %s or more", kp,
                         scen_show(v, show, sizeof show), lo_ns == 1 ? "1ns" : lo);
    }
    *out = ns;
    return DSIM_OK;
}

/* ---- enumerations ---- */

static const scen_name scen_presets[] = {
    {"loopback", 0}, {"datacenter", 1}, {"ethernet_10g", 2}, {"1gbe", 3},   {"10gbe", 4},
    {"25gbe", 5},    {"ib100", 6},      {"pcie4", 7},        {"nvlink", 8}, {"custom", 9}};
static const scen_name scen_ps_modes[] = {{"sync", DSIM_PS_SYNC}, {"async", DSIM_PS_ASYNC}};
static const scen_name scen_model_kinds[] = {
    {"linear", DSIM_MODEL_LINEAR}, {"softmax", DSIM_MODEL_SOFTMAX}, {"mlp", DSIM_MODEL_MLP}};
static const scen_name scen_losses[] = {
    {"auto", DSIM_LOSS_AUTO}, {"mse", DSIM_LOSS_MSE}, {"xent", DSIM_LOSS_XENT}};
static const scen_name scen_optims[] = {
    {"sgd", DSIM_OPTIM_SGD}, {"momentum", DSIM_OPTIM_MOMENTUM}, {"adam", DSIM_OPTIM_ADAM}};
static const scen_name scen_tasks[] = {{"classification", DSIM_DATA_CLASSIFICATION},
                                       {"regression", DSIM_DATA_REGRESSION}};
static const scen_name scen_policies[] = {{"off", DSIM_SHARD_OFF},
                                          {"auto", DSIM_SHARD_AUTO},
                                          {"file", DSIM_SHARD_FILE},
                                          {"data", DSIM_SHARD_DATA},
                                          {"hint", DSIM_SHARD_HINT}};
static const scen_name scen_hints[] = {
    {"none", DSIM_HINT_NONE}, {"files", DSIM_HINT_FILES}, {"elements", DSIM_HINT_ELEMENTS}};
static const scen_name scen_recoveries[] = {{"none", 0}, {"restart", 1}};
static const scen_name scen_fault_whats[] = {
    {"kill", DSIM_FAULT_KILL},           {"restart", DSIM_FAULT_RESTART},
    {"partition", DSIM_FAULT_PARTITION}, {"drop", DSIM_FAULT_DROP},
    {"delay", DSIM_FAULT_DELAY},         {"duplicate", DSIM_FAULT_DUPLICATE},
    {"corrupt", DSIM_FAULT_CORRUPT},     {"reorder", DSIM_FAULT_REORDER},
    {"slow", DSIM_FAULT_SLOW},           {"stagger", DSIM_FAULT_STAGGER},
    {"pause", DSIM_FAULT_PAUSE},         {"preempt", DSIM_FAULT_PREEMPT}};
/* dsim_phase names, and the names people also use for them. */
static const scen_name scen_phases[] = {{"start", DSIM_PHASE_START},
                                        {"rendezvous", DSIM_PHASE_RENDEZVOUS},
                                        {"connect", DSIM_PHASE_RENDEZVOUS},
                                        {"restore", DSIM_PHASE_RESTORE},
                                        {"create_variables", DSIM_PHASE_CREATE_VARIABLES},
                                        {"broadcast", DSIM_PHASE_CREATE_VARIABLES},
                                        {"compute", DSIM_PHASE_COMPUTE},
                                        {"first_step", DSIM_PHASE_COMPUTE},
                                        {"allreduce", DSIM_PHASE_ALLREDUCE},
                                        {"reduce_loss", DSIM_PHASE_REDUCE_LOSS},
                                        {"checkpoint", DSIM_PHASE_CHECKPOINT},
                                        {"finish", DSIM_PHASE_FINISH}};
static const scen_name scen_scopes[] = {
    {"one", DSIM_SCOPE_ONE}, {"all", DSIM_SCOPE_ALL}, {"majority", DSIM_SCOPE_MAJORITY}};
static const scen_name scen_directions[] = {{"to", 0}, {"from", 1}, {"both", 2}};

/* The built-in strategies and the cluster shapes they accept (strategy.h). */
typedef struct scen_builtin {
    const char *name;
    bool one_host, one_device, needs_ps, no_ps;
} scen_builtin;

static const scen_builtin scen_builtins[] = {
    {"one_device", true, true, false, true},
    {"mirrored", true, false, false, true},
    {"central_storage", true, false, false, true},
    {"multi_worker_mirrored", false, false, false, true},
    {"parameter_server", false, false, true, false},
};

static const scen_builtin *scen_builtin_find(const char *name)
{
    for (size_t i = 0; i < SCEN_N(scen_builtins); i++)
        if (strcmp(scen_builtins[i].name, name) == 0)
            return &scen_builtins[i];
    return NULL;
}

/* ---- network presets ---- */

/* The first three are the format's own; the others are the cost model's
 * link presets (sim/model/costmodel.c, with their sources), filled in from
 * there on first use. */
static dsim_network_preset scen_net_presets[] = {
    {"loopback", 2000, 20e9, "one machine: 2us, 20GB/s"},
    {"datacenter", 10000, 12.5e9, "100 Gb/s fabric: 10us, 12.5GB/s"},
    {"ethernet_10g", 50000, 1.25e9, "10 Gb/s Ethernet: 50us, 1.25GB/s"},
    {"1gbe", 0, 0, NULL},
    {"10gbe", 0, 0, NULL},
    {"25gbe", 0, 0, NULL},
    {"ib100", 0, 0, NULL},
    {"pcie4", 0, 0, NULL},
    {"nvlink", 0, 0, NULL},
};
static pthread_once_t scen_net_once = PTHREAD_ONCE_INIT;

static void scen_net_fill(void)
{
    for (size_t i = 0; i < SCEN_N(scen_net_presets); i++) {
        const dsim_link_model *l = dsim_link_preset(scen_net_presets[i].name);
        if (l && !scen_net_presets[i].what) {
            scen_net_presets[i].latency_ns = (int64_t)llround(l->latency_s * 1e9);
            scen_net_presets[i].bandwidth_Bps = l->bandwidth_Bps;
            scen_net_presets[i].what = l->what;
        }
    }
}

const dsim_network_preset *dsim_network_preset_find(const char *name)
{
    pthread_once(&scen_net_once, scen_net_fill);
    for (size_t i = 0; name && i < SCEN_N(scen_net_presets); i++)
        if (strcasecmp(scen_net_presets[i].name, name) == 0)
            return &scen_net_presets[i];
    return NULL;
}

const dsim_network_preset *dsim_network_preset_at(int i)
{
    pthread_once(&scen_net_once, scen_net_fill);
    return i >= 0 && (size_t)i < SCEN_N(scen_net_presets) ? &scen_net_presets[i] : NULL;
}

/* ---- sections ---- */

enum {
    T_NAME,
    T_DESC,
    T_SEED,
    T_ENGINE,
    T_CLUSTER,
    T_STRATEGY,
    T_MODEL,
    T_OPTIM,
    T_DATA,
    T_CKPT,
    T_FAULTS,
    T_RECOVERY,
    T_EXPECT,
    T_MATRIX,
    T_LIVENESS,
    T_N
};
static const char *const scen_top_keys[T_N] = {
    "name", "description", "seed",   "engine",   "cluster", "strategy", "model",   "optimizer",
    "data", "checkpoint",  "faults", "recovery", "expect",  "matrix",   "liveness"};

enum { C_HOSTS, C_DPH, C_PS, C_TFC, C_NET, C_DEV, C_N };
static const char *const scen_cluster_keys[C_N] = {"hosts",     "devices_per_host", "ps",
                                                   "tf_config", "network",          "device"};
/* cluster.device: the compute model's presets (sim/model/costmodel.c) */
static const scen_name scen_devices[] = {{"v100", 0}, {"a100", 1}, {"h100", 2}, {"cpu", 3}};
enum { N_PRESET, N_LATENCY, N_BW, N_INTRA, N_N };
static const char *const scen_net_keys[N_N] = {"preset", "latency", "bandwidth", "intra"};
static const scen_name scen_intra[] = {{"none", 0},    {"pcie4", 1},   {"nvlink", 2},
                                       {"nvlink3", 3}, {"nvlink4", 4}, {"loopback", 5}};

enum { S_NAME, S_PLUGIN, S_COMM, S_PSMODE, S_TIMEOUT, S_HEALTH, S_N };
static const char *const scen_strategy_keys[S_N] = {"name",    "plugin",  "communication",
                                                    "ps_mode", "timeout", "health_check"};
enum { H_INTERVAL, H_TIMEOUT, H_RETRIES, H_N };
static const char *const scen_health_keys[H_N] = {"interval", "timeout", "retries"};

enum { M_KIND, M_HIDDEN, M_LOSS, M_SYNTH, M_N };
static const char *const scen_model_keys[M_N] = {"kind", "hidden", "loss", "synthetic"};
enum { MS_PARAMS, MS_FLOPS, MS_N };
static const char *const scen_synth_keys[MS_N] = {"parameters", "flops_per_example"};

enum { O_KIND, O_LR, O_MOMENTUM, O_NESTEROV, O_BETA1, O_BETA2, O_EPSILON, O_N };
static const char *const scen_optim_keys[O_N] = {"kind",  "learning_rate", "momentum", "nesterov",
                                                 "beta1", "beta2",         "epsilon"};

enum {
    D_TASK,
    D_EXAMPLES,
    D_FEATURES,
    D_CLASSES,
    D_NOISE,
    D_FILES,
    D_POLICY,
    D_HINT,
    D_BATCH,
    D_EPOCHS,
    D_SHUFFLE,
    D_DROP,
    D_N
};
static const char *const scen_data_keys[D_N] = {
    "task",         "examples",   "features",     "classes", "noise",   "files",
    "shard_policy", "shard_hint", "global_batch", "epochs",  "shuffle", "drop_remainder"};

enum { K_PATH, K_EVERY, K_N };
static const char *const scen_ckpt_keys[K_N] = {"path", "every"};

enum {
    F_WHAT,
    F_STEP,
    F_PHASE,
    F_TIME,
    F_PROB,
    F_RANK,
    F_WORKER,
    F_LINK,
    F_DURATION,
    F_FACTOR,
    F_ONEWAY,
    F_LOSS,
    F_CORR,
    F_PS,
    F_RANKS,
    F_SCOPE,
    F_LATENCY,
    F_JITTER,
    F_DIRECTION,
    F_AFTER,
    F_RETRANSMIT,
    F_RTO,
    F_GRACE,
    F_N
};
static const char *const scen_fault_keys[F_N] = {
    "what",  "at_step",    "at_phase", "at_time", "probability", "rank",           "worker",
    "link",  "duration",   "factor",   "one_way", "loss",        "correlation",    "ps",
    "ranks", "scope",      "latency",  "jitter",  "direction",   "after_messages", "retransmit",
    "rto",   "grace_steps"};

/* What the sections leave for the checks across them. */
typedef struct scen_state {
    scen_map top, cluster, net, strategy, health, model, optim, data, ckpt;
    const scen_node *strategy_at; /* where the strategy's name decides */
} scen_state;

static dsim_err scen_set_str(const scen_ctx *c, char **dst, const char *src)
{
    char *d = strdup(src);
    if (!d)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    free(*dst);
    *dst = d;
    return DSIM_OK;
}

static dsim_src_pos scen_pos(const scen_node *n)
{
    dsim_src_pos p = {0, 0};
    if (n) {
        p.line = n->line;
        p.column = n->column;
    }
    return p;
}

/* A YAML subtree as JSON (for tf_config given as a mapping). Plain scalars
 * that read as integers, booleans or null become those; the rest strings. */
static dsim_err scen_to_json(const scen_ctx *c, const scen_node *n, json_t **out)
{
    *out = NULL;
    char show[96];
    json_t *j = NULL;
    if (n->kind == DSIM_YAML_SCALAR) {
        int64_t i;
        bool b;
        if (strlen(n->s) != n->len)
            return scen_fail(c, n, "cluster.tf_config: a value holds a NUL byte");
        if (dsim_yaml_is_null(n))
            j = json_null();
        else if (scen_parse_i64(n, &i))
            j = json_integer((json_int_t)i);
        else if (scen_parse_bool(n, &b))
            j = json_boolean(b);
        else
            j = json_string(n->s);
        if (!j)
            return scen_fail(c, n, "cluster.tf_config: %s is not valid UTF-8 text",
                             scen_show(n, show, sizeof show));
    } else if (n->kind == DSIM_YAML_SEQ) {
        j = json_array();
        for (size_t k = 0; j && k < n->n; k++) {
            json_t *e;
            dsim_err r = scen_to_json(c, n->kid[k], &e);
            if (r != DSIM_OK) {
                json_decref(j);
                return r;
            }
            json_array_append_new(j, e);
        }
    } else {
        j = json_object();
        for (size_t k = 0; j && k + 1 < n->n; k += 2) {
            const scen_node *key = n->kid[k];
            if (strlen(key->s) != key->len)
                return json_decref(j),
                       scen_fail(c, key, "cluster.tf_config: a key holds a NUL byte");
            if (json_object_get(j, key->s)) {
                json_decref(j);
                return scen_fail(c, key, "cluster.tf_config: the key %s appears twice; keep one",
                                 scen_show(key, show, sizeof show));
            }
            json_t *e;
            dsim_err r = scen_to_json(c, n->kid[k + 1], &e);
            if (r != DSIM_OK) {
                json_decref(j);
                return r;
            }
            json_object_set_new(j, key->s, e);
        }
    }
    if (!j)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    *out = j;
    return DSIM_OK;
}

static dsim_err scen_cluster(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    dsim_train_cfg *t = &s->train;
    scen_map *m = &st->cluster;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_CLUSTER], st->top.key[T_CLUSTER], "cluster",
                             scen_cluster_keys, C_N, m));
    int64_t v;
    v = t->hosts;
    DSIM_CHECK(scen_int(c, m, C_HOSTS, 1, SCEN_MAX_HOSTS, &v));
    t->hosts = (int)v;
    v = t->devices_per_host;
    DSIM_CHECK(scen_int(c, m, C_DPH, 1, DSIM_CLUSTER_MAX_DEVICES, &v));
    t->devices_per_host = (int)v;
    v = t->num_ps;
    DSIM_CHECK(scen_int(c, m, C_PS, 0, SCEN_MAX_PS, &v));
    t->num_ps = (int)v;

    if (m->val[C_TFC]) {
        const scen_node *tv = m->val[C_TFC];
        if (m->val[C_HOSTS])
            return scen_fail(c, m->key[C_TFC],
                             "cluster.tf_config: hosts (line %d) and tf_config both give the "
                             "workers; keep one of them",
                             m->key[C_HOSTS]->line);
        char *text = NULL;
        if (tv->kind == DSIM_YAML_MAP) {
            json_t *j;
            DSIM_CHECK(scen_to_json(c, tv, &j));
            text = json_dumps(j, JSON_COMPACT);
            json_decref(j);
            if (!text)
                return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
        } else {
            char show[96];
            if (!scen_is_scalar(tv) || strlen(tv->s) != tv->len)
                return scen_fail(c, tv,
                                 "cluster.tf_config: %s is not a TF_CONFIG; accepted: JSON text "
                                 "or a mapping with cluster and task",
                                 scen_show(tv, show, sizeof show));
            text = strdup(tv->s);
            if (!text)
                return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
        }
        dsim_cluster cl;
        dsim_err e = dsim_cluster_from_tf_config(text, t->devices_per_host, &cl);
        free(text);
        if (e != DSIM_OK) {
            char why[400];
            snprintf(why, sizeof why, "%s", dsim_errmsg());
            return scen_fail(c, tv, "cluster.tf_config: %s", why);
        }
        int hosts = cl.num_workers, ps = cl.jobs[DSIM_TASK_PS].ntasks;
        dsim_cluster_free(&cl);
        if (hosts < 1 || hosts > SCEN_MAX_HOSTS)
            return scen_fail(c, tv,
                             "cluster.tf_config: the cluster has %d chief and worker tasks; "
                             "accepted: 1..%d",
                             hosts, SCEN_MAX_HOSTS);
        if (ps > SCEN_MAX_PS)
            return scen_fail(c, tv, "cluster.tf_config: %d ps tasks; accepted: 0..%d", ps,
                             SCEN_MAX_PS);
        if (m->val[C_PS] && ps != t->num_ps)
            return scen_fail(c, m->val[C_PS],
                             "cluster.ps: %d, but tf_config's ps job has %d tasks; remove ps "
                             "(tf_config gives it)",
                             t->num_ps, ps);
        t->hosts = hosts;
        t->num_ps = ps;
    }
    if ((int64_t)t->hosts * t->devices_per_host > DSIM_TRAIN_MAX_REPLICAS) {
        const scen_node *at = m->val[C_TFC]     ? m->val[C_TFC]
                              : m->val[C_DPH]   ? m->val[C_DPH]
                              : m->val[C_HOSTS] ? m->val[C_HOSTS]
                                                : st->top.key[T_CLUSTER];
        return scen_fail(c, at,
                         "cluster: %d host(s) x %d device(s) is %lld replicas; accepted: at "
                         "most %d replicas in one run (hosts x devices_per_host)",
                         t->hosts, t->devices_per_host, (long long)t->hosts * t->devices_per_host,
                         DSIM_TRAIN_MAX_REPLICAS);
    }

    int64_t workers = (int64_t)t->hosts * t->devices_per_host * (1 + t->num_ps);
    if (workers > DSIM_TRAIN_MAX_WORKERS) {
        const scen_node *at = m->val[C_PS]    ? m->val[C_PS]
                              : m->val[C_TFC] ? m->val[C_TFC]
                                              : st->top.key[T_CLUSTER];
        return scen_fail(c, at,
                         "cluster: %d replica(s) with %d parameter server(s) need %lld runtime "
                         "workers (one per replica, one per server and replica); accepted: at "
                         "most %d; use fewer replicas or servers",
                         t->hosts * t->devices_per_host, t->num_ps, (long long)workers,
                         DSIM_TRAIN_MAX_WORKERS);
    }

    /* the device: its achieved FLOP/s is the compute model's rate */
    if (m->val[C_DEV]) {
        int dv = 0;
        DSIM_CHECK(
            scen_enum(c, m, C_DEV, "a device preset", scen_devices, SCEN_N(scen_devices), &dv));
        const dsim_device_model *dm = dsim_device_preset(scen_devices[dv].name);
        DSIM_CHECK(scen_set_str(c, &s->device_preset, scen_devices[dv].name));
        if (dm)
            t->device_flops = dm->peak_flops * dm->efficiency;
    }

    /* network */
    scen_map *n = &st->net;
    DSIM_CHECK(
        scen_map_read(c, m->val[C_NET], m->key[C_NET], "cluster.network", scen_net_keys, N_N, n));
    int preset = 0;
    DSIM_CHECK(
        scen_enum(c, n, N_PRESET, "a network preset", scen_presets, SCEN_N(scen_presets), &preset));
    DSIM_CHECK(scen_set_str(c, &s->network_preset, scen_presets[preset].name));
    s->network_given = m->val[C_NET] != NULL;
    int intra = 0;
    DSIM_CHECK(scen_enum(c, n, N_INTRA, "an intra-host link preset", scen_intra, SCEN_N(scen_intra),
                         &intra));
    const dsim_link_model *il = intra ? dsim_link_preset(scen_intra[intra].name) : NULL;
    s->intra_latency_ns = il ? (int64_t)llround(il->latency_s * 1e9) : 0;
    s->intra_Bps = il ? il->bandwidth_Bps : 0;
    if (il)
        DSIM_CHECK(scen_set_str(c, &s->intra_preset, il->name));
    const dsim_network_preset *p = dsim_network_preset_find(scen_presets[preset].name);
    if (p) {
        s->link_latency_ns = p->latency_ns;
        s->link_bandwidth_Bps = p->bandwidth_Bps;
    } else if (!n->val[N_LATENCY] || !n->val[N_BW]) {
        return scen_fail(c, scen_where(n, N_PRESET),
                         "cluster.network.preset: custom needs both latency and bandwidth "
                         "(missing: %s), e.g. latency: 5us and bandwidth: 10GB/s",
                         !n->val[N_LATENCY] && !n->val[N_BW] ? "latency, bandwidth"
                         : !n->val[N_LATENCY]                ? "latency"
                                                             : "bandwidth");
    }
    DSIM_CHECK(scen_duration(c, n, N_LATENCY, 0, &s->link_latency_ns));
    if (n->val[N_BW]) {
        const scen_node *bv = n->val[N_BW];
        char show[96], why[200];
        double bw;
        if (!scen_is_scalar(bv) || strlen(bv->s) != bv->len)
            return scen_fail(c, bv,
                             "cluster.network.bandwidth: %s is not a bandwidth; accepted: a size "
                             "per second, e.g. 10GB/s",
                             scen_show(bv, show, sizeof show));
        if (!dsim_unit_bandwidth(bv->s, &bw, why, sizeof why))
            return scen_fail(c, bv, "cluster.network.bandwidth: %s %s",
                             scen_show(bv, show, sizeof show), why);
        if (!(bw > 0))
            return scen_fail(c, bv,
                             "cluster.network.bandwidth: %s is zero; accepted: more than 0B/s",
                             scen_show(bv, show, sizeof show));
        s->link_bandwidth_Bps = bw;
    }
    return DSIM_OK;
}

static bool scen_strategy_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 31)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return false;
    return true;
}

/* Finds a strategy plugin. A path with a '/' is taken relative to the
 * scenario file's directory (or as is, when absolute). A bare file name is
 * looked for in that directory, then in each directory of $DSIM_PLUGIN_PATH
 * (colon-separated; `dsim run --plugin-dir` prepends to it), then in this
 * build's and the installed plugin directories (DSIM_PLUGIN_DIRS), so a
 * catalogue scenario can name its plugin without knowing where it was built.
 * Returns the first candidate that is a regular file, else NULL with the
 * places searched in `searched`. */
static int scen_is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static char *scen_join(const char *dir, size_t dlen, const char *file)
{
    char *out = NULL;
    if (dlen == 0) {
        /* a scenario path without a folder: relative to the working one */
        dir = ".";
        dlen = 1;
    }
    if (asprintf(&out, "%.*s/%s", (int)dlen, dir, file) < 0)
        return NULL;
    return out;
}

static char *scen_search_dirs(const char *dirs, const char *file, char *searched, size_t cap)
{
    for (const char *d = dirs; d && *d;) {
        const char *end = strchr(d, ':');
        size_t len = end ? (size_t)(end - d) : strlen(d);
        if (len) {
            char *cand = scen_join(d, len, file);
            if (cand && scen_is_file(cand))
                return cand;
            size_t used = strlen(searched);
            snprintf(searched + used, cap - used, "%s%.*s", used ? ", " : "", (int)len, d);
            free(cand);
        }
        d = end ? end + 1 : NULL;
    }
    return NULL;
}

static char *scen_resolve(const char *scenario_path, const char *p, char *searched, size_t cap)
{
    searched[0] = '\0';
    if (p[0] == '/') {
        snprintf(searched, cap, "%s", p);
        return scen_is_file(p) ? strdup(p) : NULL;
    }
    const char *slash = strrchr(scenario_path, '/');
    size_t dlen = slash ? (size_t)(slash - scenario_path) : 0;
    char *cand = scen_join(scenario_path, dlen, p);
    if (cand && scen_is_file(cand))
        return cand;
    snprintf(searched, cap, "%.*s", (int)(dlen ? dlen : 1), dlen ? scenario_path : ".");
    free(cand);
    if (strchr(p, '/'))
        return NULL;
    char *found = scen_search_dirs(getenv("DSIM_PLUGIN_PATH"), p, searched, cap);
    if (!found)
        found = scen_search_dirs(DSIM_PLUGIN_DIRS, p, searched, cap);
    return found;
}

static dsim_err scen_strategy(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    dsim_train_cfg *t = &s->train;
    scen_map *m = &st->strategy;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_STRATEGY], st->top.key[T_STRATEGY], "strategy",
                             scen_strategy_keys, S_N, m));
    char *name = NULL, *plugin = NULL;
    dsim_err e = DSIM_OK;
    if (m->val[S_NAME])
        e = scen_str_v(c, m->val[S_NAME], "strategy.name", "a strategy name", &name);
    else
        e = scen_set_str(c, &name, DSIM_SCENARIO_DEF_STRATEGY);
    if (e == DSIM_OK && m->val[S_PLUGIN])
        e = scen_str_v(c, m->val[S_PLUGIN], "strategy.plugin",
                       "the path of a strategy plugin (.so)", &plugin);
    if (e != DSIM_OK) {
        free(name);
        free(plugin);
        return e;
    }
    t->strategy = name;
    st->strategy_at = m->val[S_NAME] ? m->val[S_NAME] : NULL;
    char show[96], names[512];
    if (plugin) {
        const scen_node *pv = m->val[S_PLUGIN];
        if (!m->val[S_NAME]) {
            free(plugin);
            return scen_fail(c, m->key[S_PLUGIN],
                             "strategy.plugin: a plugin needs strategy.name: the name its "
                             "strategy registers under ([a-z0-9_], 1-31 characters)");
        }
        if (!scen_strategy_name_ok(name)) {
            free(plugin);
            return scen_fail(c, m->val[S_NAME],
                             "strategy.name: %s is not a strategy name; accepted: 1-31 "
                             "characters of a-z, 0-9 and _",
                             scen_show(m->val[S_NAME], show, sizeof show));
        }
        if (scen_builtin_find(name)) {
            free(plugin);
            return scen_fail(c, m->val[S_NAME],
                             "strategy.name: '%s' is a built-in strategy; a plugin registers "
                             "under a name of its own (or remove plugin: to run the built-in)",
                             name);
        }
        char searched[1024];
        char *resolved = scen_resolve(c->path, plugin, searched, sizeof searched);
        if (!resolved) {
            dsim_err fe = scen_fail(c, pv,
                                    "strategy.plugin: '%s' not found (looked in: %s); build the "
                                    "plugin, fix the path (relative to the scenario file), or "
                                    "add its directory to DSIM_PLUGIN_PATH / --plugin-dir",
                                    plugin, searched);
            free(plugin);
            return fe;
        }
        free(plugin);
        t->plugin_path = resolved;
        s->plugin_pos = scen_pos(pv);
    } else if (!dsim_strategy_exists(name)) {
        dsim_strategy_list(names, sizeof names);
        return scen_fail(c, scen_where(m, S_NAME),
                         "strategy.name: %s is not a registered strategy; accepted: %s (or "
                         "your own: add plugin: PATH/TO/strategy.so)",
                         scen_show(m->val[S_NAME], show, sizeof show), names);
    }

    scen_name algos[DSIM_ALGO_COUNT];
    for (int a = 0; a < DSIM_ALGO_COUNT; a++) {
        algos[a].name = dsim_algo_name((dsim_algo)a);
        algos[a].value = a;
    }
    int v = (int)t->communication;
    DSIM_CHECK(scen_enum(c, m, S_COMM, "an algorithm", algos, DSIM_ALGO_COUNT, &v));
    t->communication = (dsim_algo)v;
    v = (int)t->ps_mode;
    DSIM_CHECK(scen_enum(c, m, S_PSMODE, "a parameter-server mode", scen_ps_modes,
                         SCEN_N(scen_ps_modes), &v));
    t->ps_mode = (dsim_ps_mode)v;
    /* 0: no deadline (TF's timeout_seconds=None): only the health check or
     * an abort ends a wait. */
    DSIM_CHECK(scen_duration(c, m, S_TIMEOUT, 0, &t->timeout_ns));

    scen_map *h = &st->health;
    DSIM_CHECK(scen_map_read(c, m->val[S_HEALTH], m->key[S_HEALTH], "strategy.health_check",
                             scen_health_keys, H_N, h));
    DSIM_CHECK(scen_duration(c, h, H_INTERVAL, 0, &s->health_interval_ns));
    DSIM_CHECK(scen_duration(c, h, H_TIMEOUT, 1, &s->health_timeout_ns));
    int64_t r = s->health_retries;
    DSIM_CHECK(scen_int(c, h, H_RETRIES, 0, 1000, &r));
    s->health_retries = (int)r;
    t->health_interval_ns = s->health_interval_ns;
    t->health_timeout_ns = s->health_timeout_ns;
    t->health_retries = s->health_retries;

    /* the cluster's shape, for the built-ins (a plugin checks its own when
     * it is loaded) */
    const scen_builtin *b = scen_builtin_find(t->strategy);
    if (b && !t->plugin_path) {
        const scen_node *at = st->strategy_at ? st->strategy_at : st->cluster.at;
        char shape[128];
        snprintf(shape, sizeof shape, "%d host%s x %d device%s, %d parameter server%s", t->hosts,
                 t->hosts == 1 ? "" : "s", t->devices_per_host, t->devices_per_host == 1 ? "" : "s",
                 t->num_ps, t->num_ps == 1 ? "" : "s");
        if (b->one_device && (t->hosts != 1 || t->devices_per_host != 1 || t->num_ps != 0))
            return scen_fail(c, at,
                             "strategy.name: one_device runs on 1 host x 1 device without "
                             "parameter servers, but the cluster is %s; use mirrored (one host, "
                             "several devices) or multi_worker_mirrored (several hosts)",
                             shape);
        if (b->one_host && (t->hosts != 1 || t->num_ps != 0))
            return scen_fail(c, at,
                             "strategy.name: %s runs on one host without parameter servers, but "
                             "the cluster is %s; use multi_worker_mirrored for several hosts",
                             t->strategy, shape);
        if (b->no_ps && t->num_ps != 0)
            return scen_fail(c, at,
                             "strategy.name: %s runs without parameter servers, but the cluster "
                             "is %s; use parameter_server, or set cluster.ps: 0",
                             t->strategy, shape);
        if (b->needs_ps && t->num_ps < 1)
            return scen_fail(c, at,
                             "strategy.name: parameter_server needs at least one parameter "
                             "server, but the cluster is %s; set cluster.ps: 1 or more",
                             shape);
        if (!b->needs_ps && m->val[S_PSMODE])
            return scen_fail(c, m->key[S_PSMODE],
                             "strategy.ps_mode: only parameter_server has a mode; %s does not "
                             "use it (remove ps_mode)",
                             t->strategy);
    }
    return DSIM_OK;
}

static dsim_err scen_data(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    dsim_dataset_spec *d = &t->data;
    scen_map *m = &st->data;
    DSIM_CHECK(
        scen_map_read(c, st->top.val[T_DATA], st->top.key[T_DATA], "data", scen_data_keys, D_N, m));
    int v = DSIM_DATA_CLASSIFICATION;
    DSIM_CHECK(scen_enum(c, m, D_TASK, "a task", scen_tasks, SCEN_N(scen_tasks), &v));
    d->kind = (dsim_data_kind)v;
    bool cls = d->kind == DSIM_DATA_CLASSIFICATION;
    int64_t x = DSIM_SCENARIO_DEF_EXAMPLES;
    DSIM_CHECK(scen_int(c, m, D_EXAMPLES, 1, (int64_t)1 << 32, &x));
    d->n_examples = (size_t)x;
    x = DSIM_SCENARIO_DEF_FEATURES;
    DSIM_CHECK(scen_int(c, m, D_FEATURES, 1, DSIM_MODEL_MAX_DIM, &x));
    d->in_dim = (size_t)x;
    x = cls ? DSIM_SCENARIO_DEF_CLASSES : 1;
    if (m->val[D_CLASSES]) {
        char kp[96];
        scen_kp(kp, sizeof kp, m, D_CLASSES);
        if (cls) {
            DSIM_CHECK(scen_int_v(c, m->val[D_CLASSES], "data.classes (classification: classes)", 2,
                                  DSIM_MODEL_MAX_DIM, &x));
        } else {
            DSIM_CHECK(scen_int_v(c, m->val[D_CLASSES], "data.classes (regression: outputs)", 1,
                                  DSIM_MODEL_MAX_DIM, &x));
        }
    }
    d->out_dim = (size_t)x;
    d->noise = DSIM_SCENARIO_DEF_NOISE;
    if (cls)
        DSIM_CHECK(scen_real(c, m, D_NOISE, 0, 1, false, false, &d->noise));
    else
        DSIM_CHECK(scen_real(c, m, D_NOISE, 0, 1e6, false, false, &d->noise));
    x = DSIM_SCENARIO_DEF_FILES;
    DSIM_CHECK(scen_int(c, m, D_FILES, 0, (int64_t)DSIM_DATASET_MAX_FILES, &x));
    /* files: 0 is a source without files; the generator still makes one
     * (dsim_train ignores the split when in_memory is set). */
    t->in_memory = x == 0;
    d->n_files = x == 0 ? 1 : (size_t)x;
    d->seed = c->s->seed;
    d->teacher_hidden = 0;
    v = (int)t->shard;
    DSIM_CHECK(
        scen_enum(c, m, D_POLICY, "a shard policy", scen_policies, SCEN_N(scen_policies), &v));
    t->shard = (dsim_shard_policy)v;
    v = (int)t->hint;
    DSIM_CHECK(scen_enum(c, m, D_HINT, "a shard hint", scen_hints, SCEN_N(scen_hints), &v));
    t->hint = (dsim_shard_hint)v;
    if (m->val[D_HINT] && t->shard != DSIM_SHARD_HINT)
        return scen_fail(c, m->key[D_HINT],
                         "data.shard_hint: only used with shard_policy: hint (the policy is %s); "
                         "remove shard_hint or set shard_policy: hint",
                         dsim_shard_policy_name(t->shard));
    x = t->global_batch;
    DSIM_CHECK(scen_int(c, m, D_BATCH, 1, INT32_MAX, &x));
    t->global_batch = x;
    x = t->epochs;
    DSIM_CHECK(scen_int(c, m, D_EPOCHS, 1, 1000000, &x));
    t->epochs = (uint32_t)x;
    DSIM_CHECK(scen_bool(c, m, D_SHUFFLE, &t->shuffle));
    DSIM_CHECK(scen_bool(c, m, D_DROP, &t->drop_remainder));
    if (dsim_dataset_validate(d) != DSIM_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        return scen_fail(c, m->at, "data: %s", why);
    }
    return DSIM_OK;
}

/* model.synthetic: {parameters: 25.6M, flops_per_example: 4.1G}: a model
 * given by its size alone, run timing only (dsim_train_cfg.synthetic_params). */
static dsim_err scen_synthetic(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    scen_map *m = &st->model;
    for (int k = M_KIND; k <= M_LOSS; k++)
        if (m->val[k])
            return scen_fail(c, m->key[k],
                             "model.%s: a synthetic model has no layers or loss, only a size "
                             "(model.synthetic); remove %s or synthetic",
                             scen_model_keys[k], scen_model_keys[k]);
    scen_map sm;
    DSIM_CHECK(scen_map_read(c, m->val[M_SYNTH], m->key[M_SYNTH], "model.synthetic",
                             scen_synth_keys, MS_N, &sm));
    double val[MS_N] = {0, 0};
    static const double lo[MS_N] = {1, 0}, hi[MS_N] = {1e12, 1e18};
    for (int k = 0; k < MS_N; k++) {
        const scen_node *v = sm.val[k];
        char kp[64], show[96];
        snprintf(kp, sizeof kp, "model.synthetic.%s", scen_synth_keys[k]);
        if (!v)
            return scen_fail(c, sm.at,
                             "%s is missing: a synthetic model needs parameters and "
                             "flops_per_example, e.g. {parameters: 25.6M, flops_per_example: "
                             "4.1G}",
                             kp);
        if (!scen_is_scalar(v) || strlen(v->s) != v->len)
            return scen_fail(c, v, "%s: %s is not a number; accepted: e.g. 25.6M, 4.1G, 1e9", kp,
                             scen_show(v, show, sizeof show));
        if (dsim_cost_parse_count(kp, v->s, &val[k]) != DSIM_OK) {
            char why[300];
            snprintf(why, sizeof why, "%s", dsim_errmsg());
            return scen_fail(c, v, "%s", why);
        }
        if (val[k] < lo[k] || val[k] > hi[k])
            return scen_fail(c, v, "%s: %s is out of range; accepted: %g..%g", kp,
                             scen_show(v, show, sizeof show), lo[k], hi[k]);
    }
    t->synthetic_params = val[MS_PARAMS];
    t->synthetic_flops = val[MS_FLOPS];
    return DSIM_OK;
}

static dsim_err scen_model(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    dsim_model_spec *ms = &t->model;
    scen_map *m = &st->model;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_MODEL], st->top.key[T_MODEL], "model",
                             scen_model_keys, M_N, m));
    bool cls = t->data.kind == DSIM_DATA_CLASSIFICATION;
    memset(ms, 0, sizeof *ms);
    int v = cls ? DSIM_MODEL_SOFTMAX : DSIM_MODEL_LINEAR;
    DSIM_CHECK(
        scen_enum(c, m, M_KIND, "a model kind", scen_model_kinds, SCEN_N(scen_model_kinds), &v));
    ms->kind = (dsim_model_kind)v;
    v = DSIM_LOSS_AUTO;
    DSIM_CHECK(scen_enum(c, m, M_LOSS, "a loss", scen_losses, SCEN_N(scen_losses), &v));
    ms->loss = (dsim_loss)v;
    ms->in_dim = t->data.in_dim;
    ms->out_dim = t->data.out_dim;
    if (m->val[M_SYNTH])
        return scen_synthetic(c, st);
    const scen_node *hv = m->val[M_HIDDEN];
    if (ms->kind == DSIM_MODEL_MLP) {
        ms->n_hidden = 1;
        ms->hidden[0] = DSIM_SCENARIO_DEF_HIDDEN;
        if (hv && hv->kind == DSIM_YAML_SEQ) {
            if (hv->n < 1 || hv->n > DSIM_MODEL_MAX_HIDDEN)
                return scen_fail(c, hv,
                                 "model.hidden: a list of %zu widths; accepted: one or two "
                                 "widths, e.g. [16] or [32, 16]",
                                 hv->n);
            for (size_t i = 0; i < hv->n; i++) {
                int64_t w;
                char kp[40];
                snprintf(kp, sizeof kp, "model.hidden[%zu]", i);
                DSIM_CHECK(scen_int_v(c, hv->kid[i], kp, 1, DSIM_MODEL_MAX_DIM, &w));
                ms->hidden[i] = (size_t)w;
            }
            ms->n_hidden = hv->n;
        } else if (hv) {
            int64_t w;
            DSIM_CHECK(
                scen_int_v(c, hv, "model.hidden (one or two widths)", 1, DSIM_MODEL_MAX_DIM, &w));
            ms->hidden[0] = (size_t)w;
        }
    } else if (hv) {
        return scen_fail(c, m->key[M_HIDDEN],
                         "model.hidden: only an mlp has hidden layers (model.kind is %s); remove "
                         "hidden or set kind: mlp",
                         dsim_model_kind_name(ms->kind));
    }
    /* the model's loss must fit the data's targets */
    dsim_loss loss = ms->loss;
    if (loss == DSIM_LOSS_AUTO)
        loss = ms->kind == DSIM_MODEL_LINEAR ? DSIM_LOSS_MSE : DSIM_LOSS_XENT;
    if (cls && loss != DSIM_LOSS_XENT)
        return scen_fail(c, m->val[M_LOSS] ? m->val[M_LOSS] : scen_where(m, M_KIND),
                         "model: %s with loss mse cannot learn class labels (data.task is "
                         "classification); use kind: softmax, or an mlp with loss xent",
                         dsim_model_kind_name(ms->kind));
    if (!cls && loss != DSIM_LOSS_MSE)
        return scen_fail(c, m->val[M_LOSS] ? m->val[M_LOSS] : scen_where(m, M_KIND),
                         "model: %s with loss xent needs class labels, but data.task is "
                         "regression; use kind: linear, or an mlp with loss: mse",
                         dsim_model_kind_name(ms->kind));
    if (dsim_model_validate(ms) != DSIM_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        return scen_fail(c, m->at, "model: %s", why);
    }
    return DSIM_OK;
}

static dsim_err scen_optim(const scen_ctx *c, scen_state *st)
{
    dsim_optim_spec *o = &c->s->train.optim;
    scen_map *m = &st->optim;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_OPTIM], st->top.key[T_OPTIM], "optimizer",
                             scen_optim_keys, O_N, m));
    int v = DSIM_OPTIM_SGD;
    DSIM_CHECK(scen_enum(c, m, O_KIND, "an optimizer", scen_optims, SCEN_N(scen_optims), &v));
    dsim_optim_spec_default(o, (dsim_optim_kind)v);
    static const struct {
        int key;
        dsim_optim_kind kind;
    } own[] = {{O_MOMENTUM, DSIM_OPTIM_MOMENTUM},
               {O_NESTEROV, DSIM_OPTIM_MOMENTUM},
               {O_BETA1, DSIM_OPTIM_ADAM},
               {O_BETA2, DSIM_OPTIM_ADAM},
               {O_EPSILON, DSIM_OPTIM_ADAM}};
    for (size_t i = 0; i < SCEN_N(own); i++)
        if (m->val[own[i].key] && o->kind != own[i].kind)
            return scen_fail(c, m->key[own[i].key],
                             "optimizer.%s: only %s uses %s, but optimizer.kind is %s; remove "
                             "it or set kind: %s",
                             scen_optim_keys[own[i].key], dsim_optim_kind_name(own[i].kind),
                             scen_optim_keys[own[i].key], dsim_optim_kind_name(o->kind),
                             dsim_optim_kind_name(own[i].kind));
    DSIM_CHECK(scen_real(c, m, O_LR, 0, 1e6, true, false, &o->lr));
    DSIM_CHECK(scen_real(c, m, O_MOMENTUM, 0, 1, false, true, &o->momentum));
    bool nest = o->nesterov != 0;
    DSIM_CHECK(scen_bool(c, m, O_NESTEROV, &nest));
    o->nesterov = nest;
    DSIM_CHECK(scen_real(c, m, O_BETA1, 0, 1, false, true, &o->beta1));
    DSIM_CHECK(scen_real(c, m, O_BETA2, 0, 1, false, true, &o->beta2));
    DSIM_CHECK(scen_real(c, m, O_EPSILON, 0, 1, true, false, &o->epsilon));
    if (dsim_optim_validate(o) != DSIM_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        return scen_fail(c, m->at, "optimizer: %s", why);
    }
    return DSIM_OK;
}

static dsim_err scen_checkpoint(const scen_ctx *c, scen_state *st)
{
    dsim_train_cfg *t = &c->s->train;
    scen_map *m = &st->ckpt;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_CKPT], st->top.key[T_CKPT], "checkpoint",
                             scen_ckpt_keys, K_N, m));
    if (m->val[K_EVERY] && !m->val[K_PATH])
        return scen_fail(c, m->key[K_EVERY],
                         "checkpoint.every: there is no checkpoint.path to write to; add path: "
                         "(e.g. ckpt/%s.ckpt)",
                         c->s->name ? c->s->name : "run");
    if (!m->val[K_PATH])
        return DSIM_OK;
    char *p = NULL;
    DSIM_CHECK(scen_str_v(c, m->val[K_PATH], "checkpoint.path", "a file path", &p));
    t->checkpoint_path = p;
    c->s->checkpoint_pos = scen_pos(m->val[K_PATH]);
    int64_t every = DSIM_SCENARIO_DEF_CKPT_EVERY;
    DSIM_CHECK(scen_int(c, m, K_EVERY, 0, INT64_MAX / 2, &every));
    t->checkpoint_every = (uint64_t)every;
    return DSIM_OK;
}

static dsim_err scen_fault(const scen_ctx *c, const scen_node *fv, size_t idx, dsim_fault *f)
{
    const dsim_train_cfg *t = &c->s->train;
    char path[32], kp[64], show[96];
    snprintf(path, sizeof path, "faults[%zu]", idx);
    scen_map m;
    DSIM_CHECK(scen_map_read(c, fv, fv, path, scen_fault_keys, F_N, &m));
    if (!m.node)
        return scen_fail(c, fv,
                         "%s: an empty fault; write what:, when (at_step, at_phase, "
                         "at_time or probability) and where (rank, worker or link)",
                         path);
    dsim_src_pos pos = scen_pos(fv);
    f->line = pos.line;
    f->column = pos.column;
    f->rank = f->worker = f->ps = f->link_from = f->link_to = -1;
    f->step = -1;
    if (!m.val[F_WHAT])
        return scen_fail(c, fv,
                         "%s.what: missing; accepted: kill, restart, pause, partition, drop, "
                         "delay, duplicate, corrupt, reorder, slow, stagger",
                         path);
    int v = 0;
    DSIM_CHECK(scen_enum(c, &m, F_WHAT, "a fault", scen_fault_whats, SCEN_N(scen_fault_whats), &v));
    f->what = (dsim_fault_what)v;
    const char *what = scen_fault_whats[v].name;
    bool on_task =
        f->what == DSIM_FAULT_KILL || f->what == DSIM_FAULT_RESTART || f->what == DSIM_FAULT_PAUSE;

    /* when: one of them; at_phase may name its step with at_step */
    static const int whens[] = {F_STEP, F_PHASE, F_TIME, F_PROB, F_LOSS};
    int nwhen = 0, first = -1;
    for (size_t i = 0; i < SCEN_N(whens); i++) {
        if (!m.val[whens[i]])
            continue;
        bool pair = (first == F_STEP && whens[i] == F_PHASE);
        if (nwhen++ == 0 || pair) {
            if (first < 0)
                first = whens[i];
            continue;
        }
        return scen_fail(c, m.key[whens[i]],
                         "%s.%s: a fault has one 'when', and %s is already given; keep "
                         "one of at_step, at_phase (with at_step if you like), at_time, "
                         "probability, loss",
                         path, scen_fault_keys[whens[i]], scen_fault_keys[first]);
    }
    if (nwhen == 0 && f->what != DSIM_FAULT_STAGGER)
        return scen_fail(c, m.key[F_WHAT],
                         "%s: the %s fault has no 'when'; add one of at_step: N, at_phase: NAME, "
                         "at_time: DURATION, probability: P (loss: PERCENT for drops)",
                         path, what);
    if (m.val[F_PHASE]) {
        f->when = DSIM_WHEN_PHASE;
        DSIM_CHECK(scen_enum(c, &m, F_PHASE, "a phase", scen_phases, SCEN_N(scen_phases), &v));
        f->phase = strdup(dsim_phase_name((dsim_phase)v));
        if (!f->phase)
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
        if (m.val[F_STEP])
            DSIM_CHECK(scen_int(c, &m, F_STEP, 0, INT64_MAX / 2, &f->step));
    } else if (m.val[F_STEP]) {
        f->when = DSIM_WHEN_STEP;
        DSIM_CHECK(scen_int(c, &m, F_STEP, 0, INT64_MAX / 2, &f->step));
    } else if (m.val[F_TIME]) {
        f->when = DSIM_WHEN_TIME;
        DSIM_CHECK(scen_duration(c, &m, F_TIME, 0, &f->time_ns));
    } else if (m.val[F_PROB]) {
        f->when = DSIM_WHEN_PROBABILITY;
        DSIM_CHECK(scen_real(c, &m, F_PROB, 0, 1, true, false, &f->probability));
    } else if (m.val[F_LOSS]) {
        if (f->what != DSIM_FAULT_DROP)
            return scen_fail(c, m.key[F_LOSS],
                             "%s.loss: loss is the drop fault's rate; use probability: for a %s "
                             "fault",
                             path, what);
        f->when = DSIM_WHEN_PROBABILITY;
        double pct = 0;
        DSIM_CHECK(scen_real(c, &m, F_LOSS, 0, 100, true, false, &pct));
        f->probability = pct / 100.0;
    } else {
        f->when = DSIM_WHEN_PHASE; /* stagger: at the start */
        f->phase = strdup("start");
        if (!f->phase)
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    }
    if (m.val[F_CORR]) {
        if (f->when != DSIM_WHEN_PROBABILITY)
            return scen_fail(c, m.key[F_CORR],
                             "%s.correlation: only a fault drawn per frame (probability: or "
                             "loss:) has a correlation; remove it",
                             path);
        double pct = 0;
        DSIM_CHECK(scen_real(c, &m, F_CORR, 0, 100, false, false, &pct));
        f->correlation = pct / 100.0;
    }

    /* where: at most one */
    static const int wheres[] = {F_RANK, F_WORKER, F_PS, F_LINK, F_RANKS, F_SCOPE};
    int nwhere = 0;
    first = -1;
    for (size_t i = 0; i < SCEN_N(wheres); i++) {
        if (m.val[wheres[i]]) {
            if (nwhere++ == 0)
                first = wheres[i];
            else
                return scen_fail(c, m.key[wheres[i]],
                                 "%s.%s: a fault has one 'where', and %s is already given; keep "
                                 "one of rank, worker, ps, link, ranks, scope",
                                 path, scen_fault_keys[wheres[i]], scen_fault_keys[first]);
        }
    }
    int64_t replicas = (int64_t)t->hosts * t->devices_per_host;
    int64_t x;
    if (m.val[F_RANK]) {
        snprintf(kp, sizeof kp, "%s.rank", path);
        DSIM_CHECK(scen_int_v(c, m.val[F_RANK], kp, 0, replicas - 1, &x));
        f->rank = (int)x;
    }
    if (m.val[F_WORKER]) {
        snprintf(kp, sizeof kp, "%s.worker", path);
        DSIM_CHECK(scen_int_v(c, m.val[F_WORKER], kp, 0, t->hosts - 1, &x));
        f->worker = (int)x;
    }
    if (m.val[F_PS]) {
        snprintf(kp, sizeof kp, "%s.ps", path);
        if (t->num_ps < 1)
            return scen_fail(c, m.key[F_PS],
                             "%s: this job has no parameter servers (cluster.ps is 0); name a "
                             "rank or worker instead",
                             kp);
        DSIM_CHECK(scen_int_v(c, m.val[F_PS], kp, 0, t->num_ps - 1, &x));
        f->ps = (int)x;
    }
    if (m.val[F_SCOPE]) {
        DSIM_CHECK(scen_enum(c, &m, F_SCOPE, "a scope", scen_scopes, SCEN_N(scen_scopes), &v));
        f->scope = (dsim_fault_scope)v;
    }
    if (m.val[F_RANKS]) {
        const scen_node *lv = m.val[F_RANKS];
        snprintf(kp, sizeof kp, "%s.ranks", path);
        if (lv->kind != DSIM_YAML_SEQ || lv->n == 0 || lv->n > DSIM_FAULT_MAX_RANKS)
            return scen_fail(c, lv,
                             "%s: %s is not a list of ranks; accepted: [R, R, ...], 1 to %d "
                             "ranks in 0..%" PRId64,
                             kp, scen_show(lv, show, sizeof show), DSIM_FAULT_MAX_RANKS,
                             replicas - 1);
        for (size_t k = 0; k < lv->n; k++) {
            snprintf(kp, sizeof kp, "%s.ranks[%zu]", path, k);
            DSIM_CHECK(scen_int_v(c, lv->kid[k], kp, 0, replicas - 1, &x));
            f->ranks[f->n_ranks++] = (int)x;
        }
    }
    if (m.val[F_LINK]) {
        const scen_node *lv = m.val[F_LINK];
        snprintf(kp, sizeof kp, "%s.link", path);
        if (lv->kind != DSIM_YAML_SEQ || lv->n != 2)
            return scen_fail(c, lv,
                             "%s: %s is not a link; accepted: [FROM, TO], two ranks in "
                             "0..%" PRId64,
                             kp, scen_show(lv, show, sizeof show), replicas - 1);
        int64_t a, b;
        snprintf(kp, sizeof kp, "%s.link[0]", path);
        DSIM_CHECK(scen_int_v(c, lv->kid[0], kp, 0, replicas - 1, &a));
        snprintf(kp, sizeof kp, "%s.link[1]", path);
        DSIM_CHECK(scen_int_v(c, lv->kid[1], kp, 0, replicas - 1, &b));
        if (a == b)
            return scen_fail(c, lv,
                             "%s.link: [%" PRId64 ", %" PRId64 "] joins a rank to itself; "
                             "a link is two different ranks",
                             path, a, b);
        f->link_from = (int)a;
        f->link_to = (int)b;
    }
    if ((on_task || f->what == DSIM_FAULT_SLOW) && m.val[F_LINK] && f->what != DSIM_FAULT_SLOW)
        return scen_fail(c, m.key[F_LINK],
                         "%s: a %s fault acts on a process, not a link; use "
                         "rank:, worker:, ps:, ranks: or scope:",
                         path, what);
    if (on_task && nwhere == 0)
        return scen_fail(c, m.key[F_WHAT],
                         "%s: a %s fault needs a rank:, worker:, ps:, ranks: or scope: to act on",
                         path, what);
    if (f->what == DSIM_FAULT_SLOW && nwhere == 0)
        return scen_fail(c, m.key[F_WHAT],
                         "%s: a slow fault needs a rank: (a straggler) or a link: (a slow link)",
                         path);
    if (f->what == DSIM_FAULT_STAGGER && nwhere == 0)
        f->scope = DSIM_SCOPE_ALL;
    if (f->what == DSIM_FAULT_PARTITION && nwhere == 0)
        return scen_fail(c, m.key[F_WHAT],
                         "%s: a partition needs a link: [FROM, TO], a rank:, worker:, ranks: or "
                         "scope: to cut off",
                         path);
    if (m.val[F_PS] && f->what != DSIM_FAULT_KILL && f->what != DSIM_FAULT_PARTITION &&
        f->what != DSIM_FAULT_DELAY && f->what != DSIM_FAULT_DROP)
        return scen_fail(c, m.key[F_PS],
                         "%s.ps: a parameter server can be killed, cut off, delayed or lose "
                         "frames; a %s fault acts on replicas",
                         path, what);

    if (f->what == DSIM_FAULT_PREEMPT) {
        if (f->when != DSIM_WHEN_STEP)
            return scen_fail(c, m.key[F_WHAT],
                             "%s: a preemption notice comes at_step: N (after N steps); other "
                             "triggers are not supported for it",
                             path);
        if (nwhere)
            return scen_fail(c, m.key[first],
                             "%s.%s: a preemption notice goes to the whole job; remove it", path,
                             scen_fault_keys[first]);
        if (!c->s->train.checkpoint_path)
            return scen_fail(c, m.key[F_WHAT],
                             "%s: a preempted job saves a checkpoint to resume from; add "
                             "checkpoint: {path: ...}",
                             path);
    }
    if (m.val[F_GRACE] && f->what != DSIM_FAULT_PREEMPT)
        return scen_fail(c, m.key[F_GRACE], "%s.grace_steps: only a preemption has a grace", path);
    DSIM_CHECK(scen_int(c, &m, F_GRACE, 0, 1000000, &f->grace_steps));

    /* settings that belong to some kinds only */
    bool has_duration = f->what != DSIM_FAULT_KILL && f->what != DSIM_FAULT_PREEMPT;
    bool needs_duration = f->what == DSIM_FAULT_STAGGER;
    if (m.val[F_DURATION] && m.val[F_LATENCY])
        return scen_fail(c, m.key[F_LATENCY],
                         "%s.latency: latency and duration say the same for a delay; keep one",
                         path);
    if (m.val[F_LATENCY] && f->what != DSIM_FAULT_DELAY)
        return scen_fail(c, m.key[F_LATENCY], "%s.latency: only a delay has a latency", path);
    if (f->what == DSIM_FAULT_DELAY && !m.val[F_DURATION] && !m.val[F_LATENCY])
        return scen_fail(c, m.key[F_WHAT], "%s: a delay fault needs latency: (e.g. 50ms)", path);
    if (m.val[F_DURATION] && !has_duration)
        return scen_fail(c, m.key[F_DURATION],
                         "%s.duration: a kill is for good; use restart with a duration for a "
                         "process that comes back",
                         path);
    if (needs_duration && !m.val[F_DURATION])
        return scen_fail(c, m.key[F_WHAT], "%s: a %s fault needs duration: (e.g. 2s)", path, what);
    DSIM_CHECK(scen_duration(c, &m, m.val[F_LATENCY] ? F_LATENCY : F_DURATION,
                             needs_duration ? 1 : 0, &f->duration_ns));
    if (m.val[F_JITTER] && f->what != DSIM_FAULT_DELAY)
        return scen_fail(c, m.key[F_JITTER], "%s.jitter: only a delay has jitter", path);
    DSIM_CHECK(scen_duration(c, &m, F_JITTER, 0, &f->jitter_ns));
    if (m.val[F_FACTOR] && f->what != DSIM_FAULT_SLOW)
        return scen_fail(c, m.key[F_FACTOR], "%s.factor: only a slow fault has a factor; remove it",
                         path);
    if (f->what == DSIM_FAULT_SLOW && !m.val[F_FACTOR])
        return scen_fail(c, m.key[F_WHAT],
                         "%s: a slow fault needs factor: how many times slower (more than 1)",
                         path);
    DSIM_CHECK(scen_real(c, &m, F_FACTOR, 1, 1e6, true, false, &f->factor));
    if ((m.val[F_ONEWAY] || m.val[F_DIRECTION]) && !m.val[F_LINK])
        return scen_fail(c, m.val[F_ONEWAY] ? m.key[F_ONEWAY] : m.key[F_DIRECTION],
                         "%s: a direction is one of a link's two; add link: [FROM, TO] (to: FROM "
                         "-> TO only, from: TO -> FROM only, both)",
                         path);
    if (m.val[F_ONEWAY] && m.val[F_DIRECTION])
        return scen_fail(c, m.key[F_DIRECTION],
                         "%s.direction: one_way and direction say the same; keep direction", path);
    DSIM_CHECK(scen_bool(c, &m, F_ONEWAY, &f->one_way));
    if (m.val[F_DIRECTION]) {
        DSIM_CHECK(scen_enum(c, &m, F_DIRECTION, "a direction", scen_directions,
                             SCEN_N(scen_directions), &v));
        if (v == 1) { /* from: TO -> FROM */
            int tmp = f->link_from;
            f->link_from = f->link_to;
            f->link_to = tmp;
        }
        f->one_way = v != 2;
    }
    if (m.val[F_AFTER] && (!on_task || f->when != DSIM_WHEN_PHASE))
        return scen_fail(c, m.key[F_AFTER],
                         "%s.after_messages: only a kill, restart or pause at_phase: fires after "
                         "the frames it sent in that phase",
                         path);
    DSIM_CHECK(scen_int(c, &m, F_AFTER, 1, INT64_MAX / 2, &f->after_messages));
    if ((m.val[F_RETRANSMIT] || m.val[F_RTO]) && f->what != DSIM_FAULT_DROP)
        return scen_fail(c, m.val[F_RTO] ? m.key[F_RTO] : m.key[F_RETRANSMIT],
                         "%s: only a drop is retransmitted", path);
    DSIM_CHECK(scen_bool(c, &m, F_RETRANSMIT, &f->retransmit));
    if (m.val[F_RTO] && !f->retransmit)
        return scen_fail(c, m.key[F_RTO],
                         "%s.rto: set retransmit: true for a retransmission "
                         "timeout to apply",
                         path);
    DSIM_CHECK(scen_duration(c, &m, F_RTO, 1, &f->rto_ns));
    return DSIM_OK;
}

static dsim_err scen_faults(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    const scen_node *fv = st->top.val[T_FAULTS];
    if (!fv || dsim_yaml_is_null(fv))
        return DSIM_OK;
    char show[96];
    if (fv->kind != DSIM_YAML_SEQ)
        return scen_fail(c, fv,
                         "faults: %s is not a list; write each fault as an item "
                         "starting with '- what: ...'",
                         scen_show(fv, show, sizeof show));
    if (fv->n == 0)
        return DSIM_OK;
    s->faults = calloc(fv->n, sizeof *s->faults);
    if (!s->faults)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    for (size_t i = 0; i < fv->n; i++) {
        s->n_faults = i + 1; /* so that free releases what this one holds */
        DSIM_CHECK(scen_fault(c, fv->kid[i], i, &s->faults[i]));
    }
    return DSIM_OK;
}

static dsim_err scen_expect_check(const scen_ctx *c, const scen_node *key, const scen_node *val,
                                  const dsim_check_ops *ops, dsim_expect *x)
{
    char kp[96], show[96], keys[400];
    x->check = ops;
    x->pos = scen_pos(key);
    for (int i = 0; i < ops->n_params && i < DSIM_CHECK_MAX_PARAMS; i++)
        x->values[i] = ops->params[i].def;
    for (int i = ops->n_params; i < DSIM_CHECK_MAX_PARAMS; i++)
        x->values[i] = NAN;
    if (!val || dsim_yaml_is_null(val))
        return DSIM_OK;
    /* every threshold, then `expect` */
    size_t o = 0;
    keys[0] = '\0';
    for (int i = 0; i < ops->n_params && o < sizeof keys; i++)
        o += (size_t)snprintf(keys + o, sizeof keys - o, "%s, ", ops->params[i].key);
    if (o < sizeof keys)
        snprintf(keys + o, sizeof keys - o, "expect");
    if (val->kind != DSIM_YAML_MAP)
        return scen_fail(c, val,
                         "expect.%s: %s is not a mapping; accepted: {} or thresholds "
                         "(%s)",
                         ops->name, scen_show(val, show, sizeof show), keys);
    bool seen[DSIM_CHECK_MAX_PARAMS + 1] = {false};
    const scen_node *seen_at[DSIM_CHECK_MAX_PARAMS + 1] = {NULL};
    for (size_t p = 0; p + 1 < val->n; p += 2) {
        const scen_node *k = val->kid[p], *v = val->kid[p + 1];
        int idx = strlen(k->s) == k->len ? dsim_check_param_index(ops, k->s) : -1;
        bool is_expect = strcmp(k->s, "expect") == 0 && k->len == 6;
        if (idx < 0 && !is_expect)
            return scen_fail(c, k, "expect.%s: unknown threshold %s; accepted: %s", ops->name,
                             scen_show(k, show, sizeof show), keys);
        int slot = is_expect ? DSIM_CHECK_MAX_PARAMS : idx;
        if (seen[slot])
            return scen_fail(c, k,
                             "expect.%s.%s: the key appears twice (first at line %d, column %d); "
                             "keep one",
                             ops->name, k->s, seen_at[slot]->line, seen_at[slot]->column);
        seen[slot] = true;
        seen_at[slot] = k;
        snprintf(kp, sizeof kp, "expect.%s.%s", ops->name, k->s);
        if (is_expect) {
            static const scen_name outcomes[] = {{"pass", 0}, {"fail", 1}};
            int out = 0;
            DSIM_CHECK(scen_enum_v(c, v, kp, "an outcome", outcomes, 2, &out));
            x->expect_fail = out == 1;
            continue;
        }
        const dsim_check_param *pa = &ops->params[idx];
        double d;
        bool b;
        if (pa->integer && pa->min >= 0 && pa->max <= 1 && scen_parse_bool(v, &b)) {
            d = b ? 1 : 0;
        } else if (!scen_parse_real(v, &d)) {
            return scen_fail(c, v, "%s: %s is not a number; accepted: %s%g..%g (%s)", kp,
                             scen_show(v, show, sizeof show),
                             pa->integer ? "a whole number in " : "", pa->min, pa->max, pa->doc);
        }
        if (pa->integer && d != floor(d))
            return scen_fail(c, v,
                             "%s: %s is not a whole number; accepted: a whole number in "
                             "%g..%g (%s)",
                             kp, scen_show(v, show, sizeof show), pa->min, pa->max, pa->doc);
        if (d < pa->min || d > pa->max)
            return scen_fail(c, v, "%s: %s is out of range; accepted: %s%g..%g (%s)", kp,
                             scen_show(v, show, sizeof show),
                             pa->integer ? "a whole number in " : "", pa->min, pa->max, pa->doc);
        x->values[idx] = d;
    }
    return DSIM_OK;
}

static dsim_err scen_expect(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    const scen_node *ev = st->top.val[T_EXPECT];
    if (!ev || dsim_yaml_is_null(ev))
        return DSIM_OK;
    char show[96], names[400];
    size_t o = 0;
    names[0] = '\0';
    for (size_t i = 0; i < dsim_check_count() && o < sizeof names; i++)
        o += (size_t)snprintf(names + o, sizeof names - o, "%s, ", dsim_check_at(i)->name);
    if (o < sizeof names)
        snprintf(names + o, sizeof names - o, "error");
    if (ev->kind != DSIM_YAML_MAP)
        return scen_fail(c, ev, "expect: %s is not a mapping; accepted keys: %s",
                         scen_show(ev, show, sizeof show), names);
    s->expect = calloc(ev->n / 2 + 1, sizeof *s->expect);
    if (!s->expect)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    const scen_node *error_key = NULL;
    for (size_t p = 0; p + 1 < ev->n; p += 2) {
        const scen_node *k = ev->kid[p], *v = ev->kid[p + 1];
        bool nul = strlen(k->s) != k->len;
        if (!nul && strcmp(k->s, "error") == 0) {
            if (error_key)
                return scen_fail(c, k,
                                 "expect.error: the key appears twice (first at line %d, column "
                                 "%d); keep one",
                                 error_key->line, error_key->column);
            error_key = k;
            DSIM_CHECK(scen_str_v(c, v, "expect.error", "the text the run's error must contain",
                                  &s->expect_error));
            continue;
        }
        const dsim_check_ops *ops = nul ? NULL : dsim_check_find(k->s);
        if (!ops) {
            const char *near = NULL;
            size_t bd = 3;
            for (size_t i = 0; !nul && i < dsim_check_count(); i++) {
                size_t d = scen_distance(k->s, dsim_check_at(i)->name);
                if (d < bd) {
                    bd = d;
                    near = dsim_check_at(i)->name;
                }
            }
            char hint[64] = "";
            if (near)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            return scen_fail(c, k, "expect: unknown check %s%s; accepted: %s",
                             scen_show(k, show, sizeof show), hint, names);
        }
        for (size_t i = 0; i < s->n_expect; i++)
            if (s->expect[i].check == ops)
                return scen_fail(c, k,
                                 "expect.%s: the key appears twice (first at line %d, column "
                                 "%d); keep one",
                                 ops->name, s->expect[i].pos.line, s->expect[i].pos.column);
        DSIM_CHECK(scen_expect_check(c, k, v, ops, &s->expect[s->n_expect]));
        s->n_expect++;
    }
    if (error_key && s->n_expect > 0)
        return scen_fail(c, error_key,
                         "expect.error: a run that must fail runs no checks, but %s is also "
                         "expected (line %d); keep either error or the checks",
                         s->expect[0].check->name, s->expect[0].pos.line);
    return DSIM_OK;
}

static bool scen_name_ok(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.' && *s != '-')
            return false;
    return true;
}

static dsim_err scen_top(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    char show[96];
    const scen_node *root = c->root;
    if (!root)
        return scen_fail(c, NULL,
                         "the file is empty; a scenario needs at least 'name: NAME' (see "
                         "scenarios/FORMAT.md or dsim validate --defaults)");
    if (root->kind != DSIM_YAML_MAP)
        return scen_fail(c, root,
                         "the top level is %s, not a mapping; a scenario is keys such as "
                         "'name: NAME' (see dsim validate --defaults)",
                         scen_show(root, show, sizeof show));
    scen_map *m = &st->top;
    DSIM_CHECK(scen_map_read(c, root, root, "", scen_top_keys, T_N, m));
    if (!m->val[T_NAME])
        return scen_fail(c, root,
                         "name: missing; every scenario has a name ([A-Za-z0-9_.-]+), "
                         "e.g. name: quickstart");
    DSIM_CHECK(scen_str_v(c, m->val[T_NAME], "name", "a name ([A-Za-z0-9_.-]+)", &s->name));
    if (!scen_name_ok(s->name) || strlen(s->name) > 128)
        return scen_fail(c, m->val[T_NAME],
                         "name: %s is not a name; accepted: 1-128 characters of A-Z, a-z, 0-9, "
                         "_, . and -",
                         scen_show(m->val[T_NAME], show, sizeof show));
    if (m->val[T_DESC])
        DSIM_CHECK(scen_str_v(c, m->val[T_DESC], "description", "text", &s->description));
    if (m->val[T_SEED]) {
        const scen_node *v = m->val[T_SEED];
        bool ok = scen_is_scalar(v) && v->plain && strlen(v->s) == v->len && v->s[0] >= '0' &&
                  v->s[0] <= '9';
        for (const char *q = ok ? v->s : ""; *q; q++)
            ok = ok && *q >= '0' && *q <= '9';
        errno = 0;
        char *end = NULL;
        unsigned long long x = ok ? strtoull(v->s, &end, 10) : 0;
        if (!ok || errno == ERANGE || *end)
            return scen_fail(c, v, "seed: %s is %s; accepted: 0..18446744073709551615",
                             scen_show(v, show, sizeof show),
                             ok ? "out of range" : "not a whole number");
        s->seed = x;
    }
    s->train.seed = s->seed;
    int v = 0;
    scen_name engines[8]; /* the engine table's (engine/engine.h) */
    size_t ne = 0;
    for (const dsim_engine_ops *e; ne < SCEN_N(engines) && (e = dsim_engine_at((int)ne)); ne++)
        engines[ne] = (scen_name){e->name, (int)ne};
    DSIM_CHECK(scen_enum(c, m, T_ENGINE, "an engine", engines, ne, &v));
    DSIM_CHECK(scen_set_str(c, &s->engine, engines[v].name));
    s->train.engine = s->engine;
    s->engine_pos = scen_pos(m->val[T_ENGINE]);
    v = 0;
    s->max_restarts = DSIM_SCENARIO_DEF_MAX_RESTARTS;
    const scen_node *rv = m->val[T_RECOVERY];
    if (rv && rv->kind == DSIM_YAML_MAP) {
        /* recovery: {policy: restart, max_restarts: 3} */
        enum { R_POLICY, R_MAX, R_N };
        static const char *const rkeys[R_N] = {"policy", "max_restarts"};
        scen_map rm;
        DSIM_CHECK(scen_map_read(c, rv, m->key[T_RECOVERY], "recovery", rkeys, R_N, &rm));
        DSIM_CHECK(scen_enum(c, &rm, R_POLICY, "a recovery", scen_recoveries,
                             SCEN_N(scen_recoveries), &v));
        int64_t mx = DSIM_SCENARIO_DEF_MAX_RESTARTS;
        DSIM_CHECK(scen_int(c, &rm, R_MAX, 0, 100, &mx));
        if (rm.val[R_MAX] && v == 0)
            return scen_fail(c, rm.key[R_MAX],
                             "recovery.max_restarts: policy is none, so nothing restarts; set "
                             "policy: restart or remove it");
        s->max_restarts = (int)mx;
    } else {
        DSIM_CHECK(scen_enum(c, m, T_RECOVERY, "a recovery", scen_recoveries,
                             SCEN_N(scen_recoveries), &v));
    }
    DSIM_CHECK(scen_set_str(c, &s->recovery, scen_recoveries[v].name));
    s->recovery_pos = scen_pos(m->val[T_RECOVERY]);
    const scen_node *lv = m->val[T_LIVENESS];
    if (lv) {
        /* liveness: {reach_step: 40, within: 60s} */
        enum { L_STEP, L_WITHIN, L_N };
        static const char *const lkeys[L_N] = {"reach_step", "within"};
        scen_map lm;
        DSIM_CHECK(scen_map_read(c, lv, m->key[T_LIVENESS], "liveness", lkeys, L_N, &lm));
        if (!lm.val[L_STEP] || !lm.val[L_WITHIN])
            return scen_fail(c, m->key[T_LIVENESS],
                             "liveness: needs both reach_step (the global step the healed job "
                             "must reach) and within (how long it may take)");
        int64_t step = 0, within = 0;
        DSIM_CHECK(scen_int(c, &lm, L_STEP, 1, INT64_MAX / 2, &step));
        DSIM_CHECK(scen_duration(c, &lm, L_WITHIN, 1, &within));
        s->has_liveness = true;
        s->liveness_step = (uint64_t)step;
        s->liveness_within_ns = within;
    }
    return DSIM_OK;
}

/* ---- matrix: one file, a cross product of runs ----
 *
 *   matrix:
 *     cluster: [{hosts: 1, devices_per_host: 3}, {hosts: 5, devices_per_host: 1}]
 *     data.features: [1, 6]
 *     strategy.communication: [ring, rhd]
 *     seed: [1, 2]
 *
 * Each key is a section ("cluster", "seed") or a section's key
 * ("data.features"); each value a list of what to put there. Combination k
 * counts through the lists like digits, the first key slowest. A mapping
 * put on a section is merged into it key by key. The combination is then
 * parsed as if the file said it, so a bad value is reported where the
 * matrix gives it. */
#define SCEN_MAX_COMBINATIONS 256

static const char *const scen_matrix_sections[] = {"seed",  "engine",    "cluster", "strategy",
                                                   "model", "optimizer", "data",    "checkpoint"};

/* Checks the matrix, counts its combinations, and for k >= 0 writes
 * combination k into the tree and its label into label[cap]. */
static dsim_err scen_matrix(const scen_ctx *c, scen_node *root, const scen_node *mx, long k,
                            size_t *count, char *label, size_t cap)
{
    char show[96];
    *count = 1;
    label[0] = '\0';
    if (mx->kind != DSIM_YAML_MAP || mx->n == 0)
        return scen_fail(c, mx,
                         "matrix: %s is not a mapping of keys to lists; e.g. matrix: {seed: [1, "
                         "2], data.features: [3, 7]}",
                         scen_show(mx, show, sizeof show));
    for (size_t p = 0; p + 1 < mx->n; p += 2) {
        const scen_node *key = mx->kid[p], *val = mx->kid[p + 1];
        char sec[64];
        snprintf(sec, sizeof sec, "%.*s", (int)strcspn(key->s, "."), key->s);
        bool ok = false;
        for (size_t i = 0; i < SCEN_N(scen_matrix_sections); i++)
            ok = ok || strcmp(sec, scen_matrix_sections[i]) == 0;
        const char *dot = strchr(key->s, '.');
        if (!ok || (dot && (!dot[1] || strchr(dot + 1, '.'))))
            return scen_fail(c, key,
                             "matrix.%s: not a setting a matrix can vary; accepted: seed, "
                             "engine, cluster, strategy, model, optimizer, data, checkpoint, or "
                             "one of their keys (cluster.hosts, data.features, "
                             "strategy.communication, ...)",
                             key->s);
        if (val->kind != DSIM_YAML_SEQ || val->n == 0)
            return scen_fail(c, val, "matrix.%s: %s is not a list of values; e.g. [1, 2]", key->s,
                             scen_show(val, show, sizeof show));
        if (*count * val->n > SCEN_MAX_COMBINATIONS)
            return scen_fail(c, val,
                             "matrix.%s: the matrix makes more than %d combinations; run fewer "
                             "(split the file)",
                             key->s, SCEN_MAX_COMBINATIONS);
        *count *= val->n;
    }
    if (k < 0)
        return DSIM_OK;
    size_t stride = *count;
    for (size_t p = 0; p + 1 < mx->n; p += 2) {
        const scen_node *key = mx->kid[p], *val = mx->kid[p + 1];
        stride /= val->n;
        const scen_node *pick = val->kid[((size_t)k / stride) % val->n];
        /* the label: axis=value, or the keys of a mapping */
        size_t ll = strlen(label);
        if (pick->kind == DSIM_YAML_MAP) {
            for (size_t q = 0; q + 1 < pick->n; q += 2)
                snprintf(label + strlen(label), cap - strlen(label), "%s%s=%s",
                         strlen(label) ? "," : "", pick->kid[q]->s,
                         pick->kid[q + 1]->kind == DSIM_YAML_SCALAR ? pick->kid[q + 1]->s : "...");
        } else {
            snprintf(label + ll, cap - ll, "%s%s=%s", ll ? "," : "", key->s,
                     pick->kind == DSIM_YAML_SCALAR ? pick->s : "...");
        }
        /* write it into the tree */
        char sec[64];
        snprintf(sec, sizeof sec, "%.*s", (int)strcspn(key->s, "."), key->s);
        const char *sub = strchr(key->s, '.');
        scen_node *target = dsim_yaml_map_get(root, sec);
        if (sub || (pick->kind == DSIM_YAML_MAP && target && target->kind == DSIM_YAML_MAP)) {
            if (!target || dsim_yaml_is_null(target)) {
                scen_node *m = calloc(1, sizeof *m);
                if (!m)
                    return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
                m->kind = DSIM_YAML_MAP;
                m->line = pick->line;
                m->column = pick->column;
                DSIM_CHECK(dsim_yaml_map_set(root, sec, m));
                target = m;
            } else if (target->kind != DSIM_YAML_MAP) {
                return scen_fail(c, key, "matrix.%s: the file's '%s' is %s, not a mapping", key->s,
                                 sec, scen_show(target, show, sizeof show));
            }
            if (sub) {
                scen_node *v = dsim_yaml_copy(pick);
                if (!v)
                    return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
                DSIM_CHECK(dsim_yaml_map_set(target, sub + 1, v));
            } else {
                for (size_t q = 0; q + 1 < pick->n; q += 2) {
                    scen_node *v = dsim_yaml_copy(pick->kid[q + 1]);
                    if (!v)
                        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
                    DSIM_CHECK(dsim_yaml_map_set(target, pick->kid[q]->s, v));
                }
            }
        } else {
            scen_node *v = dsim_yaml_copy(pick);
            if (!v)
                return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
            DSIM_CHECK(dsim_yaml_map_set(root, sec, v));
        }
    }
    return DSIM_OK;
}

/* ---- public ---- */

void dsim_scenario_free(dsim_scenario *s)
{
    if (!s)
        return;
    free(s->path);
    free(s->text);
    free(s->name);
    free(s->description);
    free(s->engine);
    free(s->network_preset);
    free(s->device_preset);
    free(s->intra_preset);
    free((void *)s->train.strategy);
    free((void *)s->train.plugin_path);
    free((void *)s->train.checkpoint_path);
    for (size_t i = 0; i < s->n_faults; i++)
        free(s->faults[i].phase);
    free(s->faults);
    free(s->recovery);
    free(s->expect);
    free(s->expect_error);
    free(s->label);
    free(s);
}

static dsim_err scen_parse(const char *path, const char *text, size_t len, long k,
                           dsim_scenario **out);

dsim_err dsim_scenario_parse(const char *path, const char *text, size_t len, dsim_scenario **out)
{
    return scen_parse(path, text, len, -1, out);
}

size_t dsim_scenario_combinations(const dsim_scenario *s)
{
    return s && s->n_combinations ? s->n_combinations : 1;
}

dsim_err dsim_scenario_combination(const dsim_scenario *s, size_t k, dsim_scenario **out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_combination: no scenario or out");
    *out = NULL;
    size_t n = dsim_scenario_combinations(s);
    if (k >= n)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: combination %zu does not exist; the matrix has %zu (0..%zu)", s->path,
                        k, n, n - 1);
    return scen_parse(s->path, s->text, strlen(s->text), s->n_combinations ? (long)k : -1, out);
}

static dsim_err scen_parse(const char *path, const char *text, size_t len, long k,
                           dsim_scenario **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_parse: out is NULL");
    *out = NULL;
    if (!path)
        path = "<scenario>";
    if (!text && len > 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_parse: %s: the text is NULL", path);
    if (len > SCEN_MAX_FILE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s:1:1: the file is %zu bytes; a scenario file is at most %u bytes", path,
                        len, SCEN_MAX_FILE);
    dsim_scenario *s = calloc(1, sizeof *s);
    if (!s)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    s->path = strdup(path);
    s->text = malloc(len + 1);
    if (!s->path || !s->text) {
        dsim_scenario_free(s);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    }
    if (len)
        memcpy(s->text, text, len);
    s->text[len] = '\0';
    s->seed = DSIM_SCENARIO_DEF_SEED;
    s->combination = -1;
    s->health_interval_ns = DSIM_SCENARIO_DEF_HEALTH_INT_NS;
    s->health_timeout_ns = DSIM_SCENARIO_DEF_HEALTH_TMO_NS;
    s->health_retries = DSIM_SCENARIO_DEF_HEALTH_RETRIES;
    dsim_train_cfg_init(&s->train);

    scen_node *root = NULL;
    dsim_err e = dsim_yaml_parse(path, s->text, len, &root);
    char label[256] = "";
    if (e == DSIM_OK && root && root->kind == DSIM_YAML_MAP) {
        scen_node *mx = dsim_yaml_map_get(root, "matrix");
        scen_ctx mc = {.path = path, .s = s, .root = root};
        if (mx)
            e = scen_matrix(&mc, root, mx, k, &s->n_combinations, label, sizeof label);
        s->combination = mx ? k : -1;
    }
    if (e == DSIM_OK) {
        scen_ctx c = {.path = path, .s = s, .root = root};
        scen_state *st = calloc(1, sizeof *st);
        if (!st)
            e = DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
        if (e == DSIM_OK)
            e = scen_top(&c, st);
        if (e == DSIM_OK)
            e = scen_cluster(&c, st);
        if (e == DSIM_OK)
            e = scen_strategy(&c, st);
        if (e == DSIM_OK)
            e = scen_data(&c, st);
        if (e == DSIM_OK)
            e = scen_model(&c, st);
        if (e == DSIM_OK)
            e = scen_optim(&c, st);
        if (e == DSIM_OK)
            e = scen_checkpoint(&c, st);
        if (e == DSIM_OK)
            e = scen_faults(&c, st);
        if (e == DSIM_OK)
            e = scen_expect(&c, st);
        free(st);
    }
    if (e == DSIM_OK && label[0]) {
        /* the combination's name: "name[hosts=1,devices_per_host=3,seed=2]" */
        char *name = NULL;
        if (asprintf(&name, "%s[%s]", s->name, label) < 0 || !(s->label = strdup(label))) {
            free(name);
            e = DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
        } else {
            free(s->name);
            s->name = name;
        }
    }
    dsim_yaml_free(root);
    if (e != DSIM_OK) {
        dsim_scenario_free(s);
        return e;
    }
    *out = s;
    return DSIM_OK;
}

static const char *scen_file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a named pipe";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "a special file";
}

dsim_err dsim_scenario_load(const char *path, dsim_scenario **out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_load: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_load: no file given");
    /* O_NONBLOCK: opening a named pipe for reading would otherwise wait for
     * a writer for ever; anything but a regular file is refused before a
     * byte is read (a pipe, a terminal or a device could block the read,
     * and a directory is no scenario). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return DSIM_ERR(errno == ENOENT ? DSIM_ENOENT : DSIM_EIO, -1, "%s: cannot open: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot open: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: is %s, not a regular file (accepted: a scenario file; dsim does "
                        "not read scenarios from pipes, devices or directories)",
                        path, scen_file_kind(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        close(fd);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot open: %s", path, strerror(err));
    }
    char *buf = malloc(SCEN_MAX_FILE + 1);
    if (!buf) {
        fclose(f);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, SCEN_MAX_FILE + 1, f);
    int bad = ferror(f);
    int err = errno;
    fclose(f);
    if (bad) {
        free(buf);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot read: %s", path, strerror(err));
    }
    if (n > SCEN_MAX_FILE) {
        free(buf);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s:1:1: the file is larger than %u bytes; a scenario file is at most "
                        "that",
                        path, SCEN_MAX_FILE);
    }
    dsim_err e = dsim_scenario_parse(path, buf, n, out);
    free(buf);
    return e;
}

const char *dsim_scenario_engine(const dsim_scenario *s)
{
    return s->train.engine ? s->train.engine : s->engine ? s->engine : "threads";
}

dsim_err dsim_scenario_runnable(const dsim_scenario *s)
{
    if (!s)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_scenario_runnable: the scenario is NULL");
    const char *eng = dsim_scenario_engine(s);
    const dsim_engine_ops *ops;
    if (dsim_engine_find(eng, &ops) != DSIM_OK) {
        dsim_error er;
        dsim_error_copy(&er);
        return DSIM_ERR(DSIM_ENOTSUP, -1, "%s: %s", s->path, er.msg);
    }
    int64_t replicas = (int64_t)s->train.hosts * s->train.devices_per_host;
    if ((ops->flags & DSIM_ENGINE_THREAD_PER_REPLICA) && replicas > DSIM_TRAIN_MAX_THREAD_REPLICAS)
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "%s: cluster: %lld replicas on engine %s, which runs a thread per "
                        "replica: accepted at most %d there; engine sim runs up to %d (a "
                        "coroutine each)",
                        s->path, (long long)replicas, eng, DSIM_TRAIN_MAX_THREAD_REPLICAS,
                        DSIM_TRAIN_MAX_REPLICAS);
    /* Under sim nothing but memory bounds a job below the parse limit, and
     * with the health check on its first round does: it pings every pair
     * of workers at once, as TF's check does (measured on this engine,
     * reports/bench-sim-scale.txt: some 300-400 bytes per pair in the
     * transport's sequence streams, the queued pings and the checks'
     * state, and about 2.5 us of CPU). Said before the run rather than
     * found by the kernel's out-of-memory killer midway. */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    if (!(ops->flags & DSIM_ENGINE_THREAD_PER_REPLICA) && have > 0) {
        /* A job of many replicas: each costs its share of the engine,
         * transport and store, and its model's copies, unless timing only. */
        bool timing = s->train.synthetic_params > 0;
        /* a model fitted to the data (in_dim 0) is about its linear one */
        double params = s->train.model.in_dim > 0
                            ? (double)dsim_model_num_params(&s->train.model)
                            : (double)(s->train.data.in_dim + 1) * (double)s->train.data.out_dim;
        double each = timing ? SCEN_TIMING_REPLICA_BYTES
                             : SCEN_REPLICA_BYTES + (params > 0 ? params : 0) * SCEN_PARAM_BYTES;
        double need = (double)replicas * each;
        if (need > have)
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "%s: cluster: %lld replicas under engine sim take about %.1f GiB "
                            "(some %.0f KiB each%s), more than this machine's %.1f GiB; run at "
                            "most %lld replicas here%s",
                            s->path, (long long)replicas, need / 1073741824.0, each / 1024.0,
                            timing ? ", timing only" : " with the model's copies",
                            have / 1073741824.0, (long long)(have / each),
                            timing ? ""
                                   : ", or cost the job without payloads (model.synthetic: "
                                     "timing only)");
    }
    if (dsim_train_runs_health_check(&s->train)) {
        double need = (double)s->train.hosts * (double)s->train.hosts * SCEN_HEALTH_PAIR_BYTES;
        if (have > 0 && need > have) {
            int fit = (int)sqrt(have / SCEN_HEALTH_PAIR_BYTES);
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "%s: cluster: %d workers with the health check on: its first "
                            "round pings every pair of workers, which takes about %.1f GiB "
                            "(%d^2 pairs x %d bytes), more than this machine's %.1f GiB; turn "
                            "the check off (strategy.health_check: {interval: 0}) or run at "
                            "most %d workers here",
                            s->path, s->train.hosts, need / 1073741824.0, s->train.hosts,
                            SCEN_HEALTH_PAIR_BYTES, have / 1073741824.0, fit);
        }
    }
    if (s->network_given && (ops->flags & DSIM_ENGINE_REAL_LINKS))
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "%s: cluster.network models the links of the threads and sim engines; "
                        "the processes engine's links are real (tcp over loopback): remove "
                        "cluster.network, or use engine sim",
                        s->path);
    if (s->train.synthetic_params > 0 && !(ops->flags & DSIM_ENGINE_VIRTUAL_TIME))
        return DSIM_ERR(DSIM_ENOTSUP, -1,
                        "%s: model.synthetic runs timing only, under engine sim (its virtual "
                        "clock charges the compute, its network model the messages); engine is "
                        "%s: use engine sim",
                        s->path, eng);
    for (size_t i = 0; i < s->n_expect; i++) {
        const dsim_expect *x = &s->expect[i];
        if (!x->check->available)
            return DSIM_ERR(DSIM_ENOTSUP, -1,
                            "%s:%d:%d: expect.%s: the %s check is not supported yet; remove it "
                            "to run the rest",
                            s->path, x->pos.line, x->pos.column, x->check->name, x->check->name);
    }
    /* A run would write its first checkpoint only after some steps: say now
     * that it cannot. */
    const char *ck = s->train.checkpoint_path;
    if (ck && s->train.checkpoint_every) {
        char *copy = strdup(ck);
        if (!copy)
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", s->path);
        const char *dir = dirname(copy);
        struct stat sb;
        dsim_err e = DSIM_OK;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            char cwd[512];
            if (!getcwd(cwd, sizeof cwd))
                snprintf(cwd, sizeof cwd, ".");
            e = DSIM_ERR(DSIM_ENOENT, -1,
                         "%s:%d:%d: checkpoint.path: the directory '%s' of '%s' does not exist "
                         "(a relative path is taken from the working directory, %s); create it "
                         "or change the path",
                         s->path, s->checkpoint_pos.line, s->checkpoint_pos.column, dir, ck, cwd);
        }
        free(copy);
        return e;
    }
    return DSIM_OK;
}
