/* The scenario's cluster: section (parse_int.h): hosts, devices_per_host,
 * ps, or a TF_CONFIG (tf_config) that gives them; the network (a preset or
 * custom latency and bandwidth, and the intra-host link) and the device
 * the compute model runs at; the network presets themselves. A TPU slice
 * (tpu, tpu_topology) gives all of these: parse_tpu.c. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "dsim/cluster.h"
#include "model/costmodel.h"
#include "scenario/defaults.h"
#include "scenario/parse_int.h"
#include "scenario/units.h"

static const scen_name scen_presets[] = {
    {"loopback", 0}, {"datacenter", 1}, {"ethernet_10g", 2}, {"1gbe", 3},   {"10gbe", 4},
    {"25gbe", 5},    {"ib100", 6},      {"pcie4", 7},        {"nvlink", 8}, {"custom", 9}};

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

enum { C_HOSTS, C_DPH, C_PS, C_TFC, C_NET, C_DEV, C_TPU, C_TPUTOPO, C_N };
static const char *const scen_cluster_keys[C_N] = {
    "hosts", "devices_per_host", "ps", "tf_config", "network", "device", "tpu", "tpu_topology"};
/* cluster.device: the compute model's presets (sim/model/costmodel.c) */
static const scen_name scen_devices[] = {{"v100", 0}, {"a100", 1}, {"h100", 2}, {"cpu", 3}};
enum { N_PRESET, N_LATENCY, N_BW, N_INTRA, N_N };
static const char *const scen_net_keys[N_N] = {"preset", "latency", "bandwidth", "intra"};
static const scen_name scen_intra[] = {{"none", 0},    {"pcie4", 1},   {"nvlink", 2},
                                       {"nvlink3", 3}, {"nvlink4", 4}, {"loopback", 5}};

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

/* cluster.tf_config: a TF_CONFIG (JSON text, or a mapping) instead of
 * hosts: its chief and worker tasks are the hosts, its ps tasks the
 * parameter servers. */
static dsim_err scen_tf_config(const scen_ctx *c, scen_map *m, dsim_train_cfg *t)
{
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
        return scen_fail(c, tv, "cluster.tf_config: %d ps tasks; accepted: 0..%d", ps, SCEN_MAX_PS);
    if (m->val[C_PS] && ps != t->num_ps)
        return scen_fail(c, m->val[C_PS],
                         "cluster.ps: %d, but tf_config's ps job has %d tasks; remove ps "
                         "(tf_config gives it)",
                         t->num_ps, ps);
    t->hosts = hosts;
    t->num_ps = ps;
    return DSIM_OK;
}

/* cluster.network: a preset, or custom latency and bandwidth; the
 * intra-host link. */
static dsim_err scen_network(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    scen_map *m = &st->cluster;
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

dsim_err scen_cluster(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    dsim_train_cfg *t = &s->train;
    scen_map *m = &st->cluster;
    DSIM_CHECK(scen_map_read(c, st->top.val[T_CLUSTER], st->top.key[T_CLUSTER], "cluster",
                             scen_cluster_keys, C_N, m));
    if (m->val[C_TPU] || m->val[C_TPUTOPO]) { /* a TPU slice gives the rest (parse_tpu.c) */
        static const int others[] = {C_HOSTS, C_DPH, C_PS, C_TFC, C_NET, C_DEV};
        return scen_tpu_cluster(c, st, C_TPU, C_TPUTOPO, others, SCEN_N(others));
    }
    int64_t v;
    v = t->hosts;
    DSIM_CHECK(scen_int(c, m, C_HOSTS, 1, SCEN_MAX_HOSTS, &v));
    t->hosts = (int)v;
    v = t->devices_per_host;
    DSIM_CHECK(scen_int(c, m, C_DPH, 1, DSIM_SCEN_MAX_DEVICES, &v));
    t->devices_per_host = (int)v;
    v = t->num_ps;
    DSIM_CHECK(scen_int(c, m, C_PS, 0, SCEN_MAX_PS, &v));
    t->num_ps = (int)v;

    if (m->val[C_TFC])
        DSIM_CHECK(scen_tf_config(c, m, t));
    s->cluster_pos = scen_pos(m->val[C_HOSTS] ? m->val[C_HOSTS]
                              : m->val[C_TFC] ? m->val[C_TFC]
                              : m->val[C_DPH] ? m->val[C_DPH]
                                              : st->top.key[T_CLUSTER]);
    s->network_pos = scen_pos(m->key[C_NET]);
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

    return scen_network(c, st);
}
