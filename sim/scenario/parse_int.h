/* Internal to the scenario parser: what its files share. A scenario file
 * is read into a tree (yaml_tree.c); each section is then read against its
 * list of accepted keys by the typed readers of parse_values.c, one file per
 * section:
 *
 *   parse_top.c       name, description, seed, engine, recovery, liveness
 *   parse_cluster.c   cluster: hosts, devices, ps, tf_config, network, device
 *   parse_tpu.c       cluster: tpu, tpu_topology (a TPU slice), TPU notes
 *   parse_strategy.c  strategy: name, plugin, communication, timeout, health
 *   parse_train.c     data:, model:, optimizer:, checkpoint:
 *   parse_faults.c    faults:
 *   parse_expect.c    expect:
 *   parse_matrix.c    matrix: (a combination written into the tree first)
 *
 * and scenario.c runs them in that order (cluster before strategy, data
 * before model: the combinations are checked where the later one is read). */
#ifndef DSIM_SCENARIO_PARSE_INT_H
#define DSIM_SCENARIO_PARSE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/err.h"
#include "scenario/scenario.h"
#include "scenario/yaml_tree.h"

#include "scenario/scenario_limits.h"

#define SCEN_MAX_KEYS  24
#define SCEN_MAX_STR   DSIM_SCEN_MAX_STR
#define SCEN_MAX_HOSTS DSIM_SCEN_MAX_HOSTS
/* dsim_train's limits (dsim/strategy.h), refused here with their position
 * rather than by the run. */
#define SCEN_MAX_PS DSIM_SCEN_MAX_PS

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

/* The top level's keys (parse_top.c): the sections are read from
 * st->top.val[T_...]. */
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
    T_TRANSPORT,
    T_MIXED,
    T_N
};

/* What the sections leave for the checks across them. */
typedef struct scen_state {
    scen_map top, cluster, net, strategy, health, model, optim, data, ckpt;
    const scen_node *strategy_at; /* where the strategy's name decides */
    const scen_node *tpu_at;      /* cluster.tpu's value, when the job is on a TPU slice */
    const scen_node *dyn_at;      /* strategy.dynamic_batch_size's value, when given */
} scen_state;

/* ---- messages and typed readers (parse_values.c) ----
 *
 * Each reader takes the map a section was read into and the index of its
 * key; an absent key leaves *out as it was (the default) and returns
 * DSIM_OK. A bad value returns DSIM_EINVAL with FILE:LINE:COLUMN, the key's
 * path, the value as written and what is accepted. The *_v forms read a
 * value that is not a map's (a list item). */

/* DSIM_EINVAL with "FILE:LINE:COLUMN: " (at's position) before the text. */
dsim_err scen_fail(const scen_ctx *c, const scen_node *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* How a value reads in a message: 'text' (shortened, control bytes
 * escaped), "an empty value", "a mapping", "a list". */
const char *scen_show(const scen_node *n, char *buf, size_t cap);

/* A plugin's file (parse_strategy.c): relative to the scenario's folder, or
 * a bare name searched in $DSIM_PLUGIN_PATH and the plugin folders; NULL
 * with the places searched; *how: DSIM_PLUGIN_*. */
char *scen_plugin_resolve(const char *scenario_path, const char *p, char *searched, size_t cap,
                          int *how);
/* Edit distance, for "did you mean" (short words only). */
size_t scen_distance(const char *a, const char *b);
/* Reads mapping node (or nothing) against its accepted keys into *m; path
 * is the section's ("strategy.health_check", "" at the top), at where it
 * is when the mapping is absent. */
dsim_err scen_map_read(const scen_ctx *c, const scen_node *node, const scen_node *at,
                       const char *path, const char *const *names, size_t n, scen_map *m);
/* "section.key" of key i, for messages. */
void scen_kp(char *buf, size_t cap, const scen_map *m, int i);
/* Where to point for a problem about key i: its value, else the section. */
const scen_node *scen_where(const scen_map *m, int i);
bool scen_is_scalar(const scen_node *v);
bool scen_parse_i64(const scen_node *v, int64_t *out);
bool scen_parse_real(const scen_node *v, double *out);
bool scen_parse_bool(const scen_node *v, bool *out);
dsim_err scen_int_v(const scen_ctx *c, const scen_node *v, const char *kp, int64_t lo, int64_t hi,
                    int64_t *out);
dsim_err scen_int(const scen_ctx *c, const scen_map *m, int i, int64_t lo, int64_t hi,
                  int64_t *out);
/* A number in lo..hi; lo_open/hi_open exclude the bound. */
dsim_err scen_real(const scen_ctx *c, const scen_map *m, int i, double lo, double hi, bool lo_open,
                   bool hi_open, double *out);
dsim_err scen_bool(const scen_ctx *c, const scen_map *m, int i, bool *out);
/* Any non-empty scalar as text (no NUL bytes, at most SCEN_MAX_STR). */
dsim_err scen_str_v(const scen_ctx *c, const scen_node *v, const char *kp, const char *what,
                    char **out);
/* One of the names t[0..n) (any case): its value. noun: "an algorithm". */
dsim_err scen_enum_v(const scen_ctx *c, const scen_node *v, const char *kp, const char *noun,
                     const scen_name *t, size_t n, int *out);
dsim_err scen_enum(const scen_ctx *c, const scen_map *m, int i, const char *noun,
                   const scen_name *t, size_t n, int *out);
/* A duration with a unit, at least lo_ns (a bare 0 where lo_ns is 0). */
dsim_err scen_duration(const scen_ctx *c, const scen_map *m, int i, int64_t lo_ns, int64_t *out);
/* *dst = a copy of src (the old one freed). */
dsim_err scen_set_str(const scen_ctx *c, char **dst, const char *src);
/* Where node n is in the file. */
dsim_src_pos scen_pos(const scen_node *n);

/* ---- the sections, in the order scen_parse reads them ---- */
dsim_err scen_top(const scen_ctx *c, scen_state *st);
dsim_err scen_cluster(const scen_ctx *c, scen_state *st);
dsim_err scen_strategy(const scen_ctx *c, scen_state *st);
dsim_err scen_data(const scen_ctx *c, scen_state *st);
dsim_err scen_model(const scen_ctx *c, scen_state *st);
dsim_err scen_optim(const scen_ctx *c, scen_state *st);
dsim_err scen_mixed_precision(const scen_ctx *c, scen_state *st);
/* dsim_train_check_builtin on what is parsed so far, refused at `at` as
 * "KEY: why": called as each key it judges is read (gradient_dtype, then
 * global_clipnorm, then the mixed-precision policy), so a refusal names the
 * key just read. */
dsim_err scen_builtin_fits(const scen_ctx *c, const scen_node *at, const char *key);
dsim_err scen_checkpoint(const scen_ctx *c, scen_state *st);
dsim_err scen_faults(const scen_ctx *c, scen_state *st);
dsim_err scen_expect(const scen_ctx *c, scen_state *st);
/* cluster.tpu (key k_tpu) and cluster.tpu_topology (k_topo): the slice, its
 * hosts, replicas, ICI and chip; refuses the keys others[0..n) (hosts, ps,
 * network, ...), which the slice gives. */
dsim_err scen_tpu_cluster(const scen_ctx *c, scen_state *st, int k_tpu, int k_topo,
                          const int *others, size_t n_others);
/* After every section: static shapes refused with the fix (at
 * strategy.dynamic_batch_size), and the TPU job's notes. */
dsim_err scen_tpu_finish(const scen_ctx *c, scen_state *st);
/* The matrix: checks it, counts its combinations into *count and, for k
 * >= 0, writes combination k into the tree and its label into label[cap]. */
dsim_err scen_matrix(const scen_ctx *c, scen_node *root, const scen_node *mx, long k, size_t *count,
                     char *label, size_t cap);

#endif
