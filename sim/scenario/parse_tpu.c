/* A scenario on a TPU slice (parse_int.h): cluster.tpu (an accelerator type,
 * "v3-32", or a generation with cluster.tpu_topology, "4x4x2") resolved to
 * hosts, replicas per host and torus coordinates (dsim/tpu.h); the slice's
 * ICI and chip as the network and device models; and, once every section is
 * read, TensorFlow's shape rules (static shapes refused with the fix) and
 * what dsim says about the job: that it is simulated (no TPU is used), its
 * precision, and a global batch that leaves cores part-empty. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/tpu.h"
#include "model/costmodel.h"
#include "scenario/parse_int.h"

/* The precision a TPU job trains in: Keras' mixed_bfloat16
 * (DSIM_TPU_DEFAULT_POLICY), as TensorFlow's TPU jobs do, unless the
 * scenario names a policy (mixed_precision:); a timing-only job (a synthetic
 * model) computes nothing and keeps float32. *note says which and why. */
static void scen_tpu_policy(const scen_state *st, dsim_scenario *s, char *note, size_t cap)
{
    dsim_train_cfg *t = &s->train;
    if (st->top.val[T_MIXED]) {
        snprintf(note, cap, "precision: %s, as mixed_precision: says",
                 dsim_precision_policy_name(t->precision));
    } else if (t->synthetic_params > 0) {
        snprintf(note, cap,
                 "precision: float32 (a timing-only job computes nothing; on a TPU it would "
                 "train in %s)",
                 DSIM_TPU_DEFAULT_POLICY);
    } else {
        t->precision = DSIM_POLICY_MIXED_BFLOAT16;
        snprintf(note, cap,
                 "precision: %s, TPU jobs' default (Keras' policy: bfloat16 compute, float32 "
                 "variables); mixed_precision: {policy: float32} trains in float32",
                 DSIM_TPU_DEFAULT_POLICY);
    }
}

/* The slice's network and device (the cost model's TPU presets). */
static dsim_err scen_tpu_models(const scen_ctx *c, const dsim_tpu_topology *t)
{
    dsim_scenario *s = c->s;
    dsim_link_model ici, chip;
    dsim_tpu_link_models(t->gen, &ici, &chip);
    const dsim_device_model *dev = dsim_tpu_device_model(t->gen);
    DSIM_CHECK(scen_set_str(c, &s->network_preset, ici.name));
    if (t->replicas_per_chip > 1)
        DSIM_CHECK(scen_set_str(c, &s->intra_preset, chip.name));
    DSIM_CHECK(scen_set_str(c, &s->device_preset, dev->name));
    s->tpu_ici_latency_ns = (int64_t)llround(ici.latency_s * 1e9);
    s->tpu_ici_Bps = ici.bandwidth_Bps;
    s->tpu_chip_latency_ns = (int64_t)llround(chip.latency_s * 1e9);
    s->tpu_chip_Bps = chip.bandwidth_Bps;
    s->train.device_flops = dev->peak_flops * dev->efficiency;
    return DSIM_OK;
}

dsim_err scen_tpu_cluster(const scen_ctx *c, scen_state *st, int k_tpu, int k_topo,
                          const int *others, size_t n_others)
{
    dsim_scenario *s = c->s;
    scen_map *m = &st->cluster;
    const scen_node *tv = m->val[k_tpu], *sv = m->val[k_topo];
    char kp[64];
    if (!tv)
        return scen_fail(c, m->key[k_topo],
                         "cluster.tpu_topology: a chip shape needs its generation: add tpu: v4 "
                         "(or v2, v3, v5e), or name the slice instead (tpu: v4-128)");
    for (size_t i = 0; i < n_others; i++) {
        if (!m->val[others[i]])
            continue;
        scen_kp(kp, sizeof kp, m, others[i]);
        return scen_fail(c, m->key[others[i]],
                         "%s: the TPU slice (cluster.tpu, line %d) gives the cluster: its hosts, "
                         "its cores, its ICI network and its chip; remove %s",
                         kp, tv->line, kp);
    }
    char *name = NULL;
    DSIM_CHECK(scen_str_v(c, tv, "cluster.tpu", "a TPU slice such as v3-32", &name));
    dsim_tpu_topology t;
    dsim_err e;
    char why[600];
    if (sv) {
        dsim_tpu_gen g;
        e = dsim_tpu_gen_parse(name, &g);
        if (e != DSIM_OK) {
            snprintf(why, sizeof why, "%s", dsim_errmsg());
            free(name);
            return scen_fail(c, tv,
                             "cluster.tpu: with tpu_topology, tpu is the generation: %s (and "
                             "the slice's size comes from the shape)",
                             why);
        }
        char *shape = NULL;
        e = scen_str_v(c, sv, "cluster.tpu_topology", "a chip shape such as 4x4x2", &shape);
        if (e == DSIM_OK && (e = dsim_tpu_topology_shape(g, shape, &t)) != DSIM_OK) {
            snprintf(why, sizeof why, "%s", dsim_errmsg());
            e = scen_fail(c, sv, "cluster.tpu_topology: %s", why);
        }
        free(shape);
    } else if ((e = dsim_tpu_topology_parse(name, &t)) != DSIM_OK) {
        snprintf(why, sizeof why, "%s", dsim_errmsg());
        e = scen_fail(c, tv, "cluster.tpu: %s", why);
    }
    free(name);
    if (e != DSIM_OK)
        return e;
    if (t.replicas > DSIM_TRAIN_MAX_REPLICAS)
        return scen_fail(c, tv, "cluster.tpu: %s has %d replicas; accepted: at most %d", t.name,
                         t.replicas, DSIM_TRAIN_MAX_REPLICAS);
    s->train.tpu = t;
    s->train.hosts = t.hosts;
    s->train.devices_per_host = t.replicas_per_host;
    s->train.num_ps = 0;
    st->tpu_at = tv;
    return scen_tpu_models(c, &t);
}

/* Appends a line to the scenario's notes. */
static dsim_err scen_note(const scen_ctx *c, const char *line)
{
    dsim_scenario *s = c->s;
    size_t had = s->tpu_notes ? strlen(s->tpu_notes) : 0, add = strlen(line);
    char *n = realloc(s->tpu_notes, had + add + 2);
    if (!n)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    memcpy(n + had, line, add);
    n[had + add] = '\n';
    n[had + add + 1] = '\0';
    s->tpu_notes = n;
    return DSIM_OK;
}

dsim_err scen_tpu_finish(const scen_ctx *c, scen_state *st)
{
    dsim_scenario *s = c->s;
    const dsim_train_cfg *t = &s->train;
    if (t->static_shapes) {
        if (dsim_train_check_static_shapes(t) != DSIM_OK) {
            char why[700];
            snprintf(why, sizeof why, "%s", dsim_errmsg());
            return scen_fail(c, st->dyn_at ? st->dyn_at : st->top.key[T_STRATEGY],
                             "strategy.dynamic_batch_size: false: %s", why);
        }
    }
    const dsim_tpu_topology *tp = &t->tpu;
    if (tp->replicas == 0)
        return DSIM_OK;
    const dsim_tpu_gen_info *gi = dsim_tpu_gen_get(tp->gen);
    char line[600], shape[48];
    if (tp->ndims == 3)
        snprintf(shape, sizeof shape, "%dx%dx%d", tp->dims[0], tp->dims[1], tp->dims[2]);
    else
        snprintf(shape, sizeof shape, "%dx%d", tp->dims[0], tp->dims[1]);
    bool wraps = tp->wrap[0] || tp->wrap[1] || tp->wrap[2];
    snprintf(line, sizeof line,
             "TPU %s is simulated: no TPU is used. Its %d replicas (%s) run as dsim workers on "
             "this machine, %d host(s) x %d, over dsim's transport; %s chips, %s",
             tp->name, tp->replicas,
             tp->replicas_per_chip > 1 ? "one per TensorCore"
             : gi->cores_per_chip > 1  ? "one per chip, its 2 TensorCores as one megacore"
                                       : "one per chip",
             tp->hosts, tp->replicas_per_host, shape,
             wraps ? "wrap-around where a dimension has it" : "a mesh (no wrap-around)");
    DSIM_CHECK(scen_note(c, line));
    scen_tpu_policy(st, s, line, sizeof line);
    DSIM_CHECK(scen_note(c, line));
    long long cores = (long long)tp->replicas * tp->cores_per_replica;
    if (t->global_batch % cores != 0) {
        long long per = (t->global_batch + tp->replicas - 1) / tp->replicas;
        snprintf(line, sizeof line,
                 "warning: the global batch %lld is not a multiple of the %lld TensorCores of "
                 "%s: the cores run part-empty (%s); a multiple of %lld fills them",
                 (long long)t->global_batch, cores, tp->name,
                 t->static_shapes ? "refused above unless the replicas divide it"
                 : per * tp->replicas == t->global_batch
                     ? "each megacore replica's batch splits unevenly over its 2 cores"
                     : "every step's short batches are padded and the padding masked",
                 cores);
        DSIM_CHECK(scen_note(c, line));
    }
    return DSIM_OK;
}
