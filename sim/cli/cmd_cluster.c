/* dsim cluster: resolve a TF_CONFIG (or a local hosts x devices cluster, or
 * a TPU slice) and print what this task is in it, as JSON. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cmds.h"
#include "dsim/cluster.h"
#include "dsim/err.h"
#include "dsim/tpu.h"

void cmd_cluster_help(FILE *out)
{
    fprintf(out,
            "usage: dsim cluster [--tf-config JSON] [--devices-per-host N] [--hosts N]\n"
            "       dsim cluster --tpu SLICE [--tpu-topology SHAPE]\n"
            "\n"
            "Resolves the cluster and prints it as JSON: task {type, index}, is_chief,\n"
            "worker_id (null for ps and evaluator tasks), num_workers (chief + workers),\n"
            "devices_per_host, num_replicas, replicas [{replica, worker, device}],\n"
            "cluster {job: [addresses]} and rpc_layer.\n"
            "\n"
            "  --tpu SLICE             a TPU slice as TPUClusterResolver names it: v2-8,\n"
            "                          v3-32, v4-128, v5e-16, ... (or a generation, v4, with\n"
            "                          --tpu-topology 4x4x2). Simulated: no TPU is used. The\n"
            "                          cluster is the slice's hosts (one worker each) and\n"
            "                          replicas; \"tpu\" gives its shape, wrap-around, ICI and\n"
            "                          sources, and each replica its host, device, chip, core\n"
            "                          and the chip's torus coordinates [x, y, z]\n"
            "  --tf-config JSON        a TF_CONFIG text; default: $TF_CONFIG, and a local\n"
            "                          single worker when that is unset or empty (only\n"
            "                          white space is refused, as TensorFlow does)\n"
            "  --devices-per-host N    devices (replicas) per worker, 1..%d (default 1)\n"
            "  --hosts N               a local cluster of N workers at localhost:%d.. instead\n"
            "                          of TF_CONFIG; this task is worker 0\n"
            "\n"
            "Exit status: 0 resolved, 2 bad input (the reason is printed on stderr).\n",
            DSIM_CLUSTER_MAX_DEVICES, DSIM_CLUSTER_LOCAL_PORT_BASE);
}

/* A whole decimal number in [lo, hi]; 0 when s is anything else. */
static int cluster_cli_int(const char *s, int lo, int hi, int *v)
{
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || x < lo || x > hi)
        return 0;
    *v = (int)x;
    return 1;
}

/* The slice (dsim cluster --tpu): its shape and figures, and where each
 * replica is. */
static int cluster_cli_tpu(json_t *root, const dsim_tpu_topology *t)
{
    const dsim_tpu_gen_info *gi = dsim_tpu_gen_get(t->gen);
    int bad = 0;
    json_t *o = json_object();
    bad |= json_object_set_new(root, "tpu", o);
    bad |= json_object_set_new(o, "name", json_string(t->name));
    bad |= json_object_set_new(o, "generation", json_string(gi->name));
    bad |= json_object_set_new(o, "simulated",
                               json_string("no TPU is used: every replica is a dsim worker on "
                                           "this machine, over dsim's transport"));
    bad |=
        json_object_set_new(o, "chips", json_pack("[i, i, i]", t->dims[0], t->dims[1], t->dims[2]));
    bad |=
        json_object_set_new(o, "wrap", json_pack("[b, b, b]", t->wrap[0], t->wrap[1], t->wrap[2]));
    bad |= json_object_set_new(o, "wrap_rule", json_string(gi->wrap_rule));
    bad |= json_object_set_new(o, "hosts", json_integer(t->hosts));
    bad |= json_object_set_new(
        o, "host_chips", json_pack("[i, i, i]", t->host_dims[0], t->host_dims[1], t->host_dims[2]));
    bad |= json_object_set_new(o, "replicas_per_chip", json_integer(t->replicas_per_chip));
    bad |= json_object_set_new(o, "tensorcores_per_replica", json_integer(t->cores_per_replica));
    bad |= json_object_set_new(o, "replicas", json_integer(t->replicas));
    bad |= json_object_set_new(o, "input_pipelines", json_integer(t->hosts));
    bad |= json_object_set_new(o, "ici",
                               json_pack("{s:i, s:f, s:f}", "links_per_chip", gi->ici_links,
                                         "link_bytes_per_s_one_way", gi->ici_link_Bps,
                                         "hop_latency_s", gi->ici_latency_s));
    bad |=
        json_object_set_new(o, "chip",
                            json_pack("{s:f, s:f, s:f}", "peak_bf16_flops", gi->peak_bf16_flops,
                                      "hbm_bytes", gi->hbm_bytes, "hbm_bytes_per_s", gi->hbm_Bps));
    bad |= json_object_set_new(o, "source", json_string(gi->source));
    json_t *reps = json_object_get(root, "replicas");
    for (int r = 0; !bad && r < t->replicas; r++) {
        dsim_tpu_place pl;
        json_t *e = json_array_get(reps, (size_t)r);
        if (!e || dsim_tpu_place_of(t, r, &pl) != DSIM_OK)
            return 1;
        bad |= json_object_set_new(e, "host", json_integer(pl.host));
        bad |= json_object_set_new(e, "chip", json_integer(pl.chip));
        bad |= json_object_set_new(e, "core", json_integer(pl.core));
        bad |= json_object_set_new(
            e, "coords", json_pack("[i, i, i]", pl.coords[0], pl.coords[1], pl.coords[2]));
    }
    return bad;
}

static json_t *cluster_cli_json(const dsim_cluster *c)
{
    json_t *root = json_object();
    if (!root)
        return NULL;
    int bad = 0;
    bad |=
        json_object_set_new(root, "source", json_string(c->from_tf_config ? "tf_config" : "local"));
    bad |= json_object_set_new(
        root, "task",
        json_pack("{s:s, s:i}", "type", dsim_task_type_name(c->task_type), "index", c->task_index));
    bad |= json_object_set_new(root, "is_chief", json_boolean(c->is_chief));
    bad |= json_object_set_new(root, "worker_id",
                               c->worker_id >= 0 ? json_integer(c->worker_id) : json_null());
    bad |= json_object_set_new(root, "num_workers", json_integer(c->num_workers));
    bad |= json_object_set_new(root, "devices_per_host", json_integer(c->devices_per_host));
    bad |= json_object_set_new(root, "num_replicas", json_integer(c->num_replicas));
    json_t *reps = json_array();
    bad |= json_object_set_new(root, "replicas", reps);
    for (int r = 0; !bad && r < c->num_replicas; r++) {
        int w, d;
        if (dsim_cluster_replica_place(c, r, &w, &d) != DSIM_OK)
            bad = 1;
        else
            bad |= json_array_append_new(
                reps, json_pack("{s:i, s:i, s:i}", "replica", r, "worker", w, "device", d));
    }
    json_t *jobs = json_object();
    bad |= json_object_set_new(root, "cluster", jobs);
    for (int t = 0; !bad && t < DSIM_TASK_TYPE_COUNT; t++) {
        if (c->jobs[t].ntasks == 0)
            continue;
        json_t *arr = json_array();
        bad |= json_object_set_new(jobs, dsim_task_type_name((dsim_task_type)t), arr);
        for (int i = 0; !bad && i < c->jobs[t].ntasks; i++)
            bad |= json_array_append_new(arr, json_string(c->jobs[t].addrs[i]));
    }
    bad |= json_object_set_new(root, "rpc_layer",
                               c->rpc_layer ? json_string(c->rpc_layer) : json_null());
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

int cmd_cluster(int argc, char **argv)
{
    const char *tf_config = NULL, *hosts_s = NULL, *dph_s = NULL, *tpu_s = NULL, *topo_s = NULL;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = dsim_cli_flag(argc, argv, &i, "--tf-config", &missing)))
            tf_config = v;
        else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--hosts", &missing)))
            hosts_s = v;
        else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--devices-per-host", &missing)))
            dph_s = v;
        else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--tpu-topology", &missing)))
            topo_s = v;
        else if (!missing && (v = dsim_cli_flag(argc, argv, &i, "--tpu", &missing)))
            tpu_s = v;
        else if (missing) {
            fprintf(stderr, "dsim cluster: %s needs a value; see 'dsim cluster --help'\n", argv[i]);
            return 2;
        } else {
            fprintf(stderr,
                    "dsim cluster: unknown argument '%s' (accepted: --tf-config JSON, "
                    "--devices-per-host N, --hosts N, --tpu SLICE, --tpu-topology SHAPE)\n",
                    argv[i]);
            return 2;
        }
    }
    int dph = 1, hosts = 0;
    if (dph_s && !cluster_cli_int(dph_s, 1, DSIM_CLUSTER_MAX_DEVICES, &dph)) {
        fprintf(stderr, "dsim cluster: --devices-per-host is '%s' (accepted: 1..%d)\n", dph_s,
                DSIM_CLUSTER_MAX_DEVICES);
        return 2;
    }
    if (hosts_s && !cluster_cli_int(hosts_s, 1, INT_MAX, &hosts)) {
        fprintf(stderr, "dsim cluster: --hosts is '%s' (accepted: a whole number >= 1)\n", hosts_s);
        return 2;
    }
    if (hosts_s && tf_config) {
        fprintf(stderr, "dsim cluster: --hosts and --tf-config both describe the cluster "
                        "(accepted: one of them)\n");
        return 2;
    }

    dsim_tpu_topology tpu = {0};
    if (topo_s && !tpu_s) {
        fprintf(stderr, "dsim cluster: --tpu-topology needs --tpu GEN (v2, v3, v4, v5e)\n");
        return 2;
    }
    if (tpu_s) {
        if (hosts_s || dph_s || tf_config) {
            fprintf(stderr, "dsim cluster: --tpu gives the hosts and devices (accepted: --tpu "
                            "alone, or --hosts/--devices-per-host/--tf-config)\n");
            return 2;
        }
        dsim_tpu_gen g;
        dsim_err te = topo_s ? dsim_tpu_gen_parse(tpu_s, &g) : DSIM_OK;
        if (te == DSIM_OK)
            te = topo_s ? dsim_tpu_topology_shape(g, topo_s, &tpu)
                        : dsim_tpu_topology_parse(tpu_s, &tpu);
        if (te != DSIM_OK) {
            fprintf(stderr, "dsim cluster: %s\n", dsim_errmsg());
            return 2;
        }
        hosts = tpu.hosts;
        dph = tpu.replicas_per_host;
        hosts_s = "tpu";
    }
    dsim_cluster c;
    dsim_err e;
    if (hosts_s)
        e = dsim_cluster_local(hosts, dph, 0, &c);
    else if (tf_config)
        e = dsim_cluster_from_tf_config(tf_config, dph, &c);
    else
        e = dsim_cluster_from_env(dph, &c);
    if (e != DSIM_OK) {
        fprintf(stderr, "dsim cluster: %s%s\n", dsim_errmsg(),
                !hosts_s && !tf_config ? " [from $TF_CONFIG]" : "");
        return e == DSIM_EINVAL ? 2 : 1;
    }
    json_t *j = cluster_cli_json(&c);
    dsim_cluster_free(&c);
    if (j && tpu.replicas > 0 && cluster_cli_tpu(j, &tpu) != 0) {
        json_decref(j);
        j = NULL;
    }
    if (!j) {
        fprintf(stderr, "dsim cluster: out of memory while printing the cluster\n");
        return 1;
    }
    int rc = json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (rc != 0 || fputc('\n', stdout) == EOF || fflush(stdout) != 0) {
        fprintf(stderr, "dsim cluster: could not write to standard output\n");
        return 1;
    }
    return 0;
}
