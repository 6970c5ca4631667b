/* dsim whatif: what a synchronous data-parallel job would take on a cluster
 * this machine is not -- step time, all-reduce time and share, speed-up over
 * one device, per network -- from the cost models (sim/model). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <sys/stat.h>

#include <jansson.h>

#include "cmds.h"
#include "harness.h"
#include "model/costmodel.h"
#include "scenario/scenario.h"

/* The help's --algo line: every algorithm after auto, wrapped under the
 * option's column like the rest of the help. */
static void whatif_help_algos(FILE *out)
{
    const char *head = "  --algo ALGO      auto (default: the model's fastest, as a job runs),";
    int col = fprintf(out, "%s", head);
    for (int a = DSIM_ALGO_AUTO + 1; a < DSIM_ALGO_COUNT; a++) {
        const char *name = dsim_algo_name((dsim_algo)a);
        int len = (int)strlen(name) + (a + 1 < DSIM_ALGO_COUNT ? 1 : 0);
        if (col + 1 + len > 79)
            col = fprintf(out, "\n%19s", "") - 1;
        else
            col += fprintf(out, " ");
        col += fprintf(out, "%s%s", name, a + 1 < DSIM_ALGO_COUNT ? "," : "");
    }
    fprintf(out, "\n");
}

void cmd_whatif_help(FILE *out)
{
    fprintf(out,
            "usage: dsim whatif [SCENARIO] [--hosts H] [--devices D] [--device NAME]\n"
            "                   [--network NAME[,NAME...]] [--intra NAME] [--params N]\n"
            "                   [--flops N] [--batch N] [--algo ALGO] [--presets]\n"
            "                   [--tpu SLICE [--tpu-topology SHAPE]]\n"
            "\n"
            "Predicts, from the alpha-beta network model and the compute model, one\n"
            "synchronous training step of a data-parallel job: every replica computes\n"
            "on its share of the global batch, then the gradients (one float32 per\n"
            "parameter) are all-reduced, without overlap. One row per network:\n"
            "  allreduce   the all-reduce's time, evaluated over the steps of dsim's own\n"
            "              algorithm (flows of a host's devices share its NIC)\n"
            "  compute     forward + backward: 3 x flops x batch / (peak x efficiency)\n"
            "  share       allreduce / step;  speedup: one device on the whole global\n"
            "              batch / the step;  efficiency: speedup / replicas\n"
            "  best        the algorithm the model finds fastest, and its time\n"
            "A scenario whose strategy is a plugin (strategy.plugin) makes its own\n"
            "exchange: it is timed by running the plugin's real schedule -- its\n"
            "collectives on the world and on its own sub-communicators -- under the sim\n"
            "engine with virtual payloads (a synthetic model of the same size), once per\n"
            "network; the rows then say 'exchange' and name what the plugin called.\n"
            "\n"
            "  SCENARIO         take hosts, devices, global batch, the model's parameter\n"
            "                   count (and forward FLOPs: 2 per weight; a synthetic model's\n"
            "                   own), the algorithm, cluster.device and cluster.network\n"
            "                   (preset and intra) from a scenario file; the flags override it\n"
            "  --hosts H, --devices D   the cluster (default 4 x 4)\n"
            "  --device NAME    v100 (default), a100, h100, cpu (measured here)\n"
            "  --network LIST   inter-host links, comma-separated (default 1gbe,10gbe,ib100)\n"
            "  --intra NAME     link between the devices of a host (default nvlink)\n"
            "  --params N       parameters, e.g. 25.6M (default: a ResNet-50's 25.6M)\n"
            "  --flops N        forward FLOPs per example, e.g. 4.1G (default 4.1G)\n"
            "  --batch N        global batch (default 32 per device)\n"
            "  --tpu SLICE      a TPU slice instead of hosts x devices: v3-32, v4-128,\n"
            "                   v5e-16, ... (or a generation with --tpu-topology 4x4x2). No\n"
            "                   TPU is used: the slice's replicas, its ICI (hop by hop,\n"
            "                   each link direction its own) and its chip are modelled\n"
            "                   from published figures (see --presets); one row, ici-GEN\n");
    whatif_help_algos(out);
    fprintf(out, "  --presets        list the link and device presets with their figures and\n"
                 "                   sources, and exit\n"
                 "  --chakra DIR     also write one training step of every rank as an execution\n"
                 "                   trace, DIR/trace.RANK.json, in the JSON form of Chakra's ET\n"
                 "                   schema (global_metadata, nodes: COMP_NODE forward+backward,\n"
                 "                   COMM_COLL_NODE ALL_REDUCE with comm_size, COMP_NODE update;\n"
                 "                   data_deps between them) for a network simulator such as\n"
                 "                   ASTRA-sim; at most 4096 ranks\n"
                 "\n"
                 "Exit status: 0, or 2 on bad input.\n");
}

static void whatif_presets(void)
{
    printf("links (alpha: one-way latency; bandwidth per direction):\n");
    for (size_t i = 0; dsim_link_preset_at(i); i++) {
        const dsim_link_model *l = dsim_link_preset_at(i);
        printf("  %-9s %8.1f us %9.3f GB/s  %s\n            source: %s\n", l->name,
               l->latency_s * 1e6, l->bandwidth_Bps / 1e9, l->what, l->source);
    }
    printf("TPU generations (dsim/tpu.h; simulated: no TPU is used):\n");
    for (int g = 0; g < DSIM_TPU_GEN_COUNT; g++) {
        const dsim_tpu_gen_info *gi = dsim_tpu_gen_get((dsim_tpu_gen)g);
        printf("  %-9s %d TensorCore(s)/chip, %d replica(s)/chip, %d chips/host, %d-D ICI "
               "(pod %dx%d%s), %d links of %.3g GB/s each way, %.1f us a hop; %.0f TFLOP/s "
               "bf16, %.1f GiB HBM at %.0f GB/s per chip; %s\n            source: %s\n",
               gi->name, gi->cores_per_chip, gi->replicas_per_chip, gi->chips_per_host, gi->ndims,
               gi->pod_dims[0], gi->pod_dims[1], gi->ndims == 3 ? "x16" : "", gi->ici_links,
               gi->ici_link_Bps / 1e9, gi->ici_latency_s * 1e6, gi->peak_bf16_flops / 1e12,
               gi->hbm_bytes / (1 << 30), gi->hbm_Bps / 1e9, gi->wrap_rule, gi->source);
    }
    printf("devices (FP32 peak for GPUs, bf16 for TPUs; efficiency: the share of peak a "
           "training step reaches):\n");
    for (size_t i = 0; dsim_device_preset_at(i); i++) {
        const dsim_device_model *d = dsim_device_preset_at(i);
        printf("  %-9s %8.2f TFLOP/s x %.2f, memory %7.1f GB/s  %s\n            source: %s\n",
               d->name, d->peak_flops / 1e12, d->efficiency, d->mem_Bps / 1e9, d->what, d->source);
    }
}

static int whatif_bad(const char *msg);

static json_t *whatif_attr_i(const char *name, double v)
{
    return json_pack("{s:s, s:I}", "name", name, "int64_val", (json_int_t)llround(v));
}

static json_t *whatif_node(int id, const char *name, const char *type, double micros, int dep)
{
    json_t *n =
        json_pack("{s:i, s:s, s:s, s:I, s:[], s:[], s:[]}", "id", id, "name", name, "type", type,
                  "duration_micros", (json_int_t)llround(micros), "data_deps", "ctrl_deps", "attr");
    if (n && dep >= 0)
        json_array_append_new(json_object_get(n, "data_deps"), json_integer(dep));
    return n;
}

/* One step per rank in the JSON form of Chakra's execution trace schema
 * (ET 0.0.4): what ASTRA-sim replays, with the network its own. */
static int whatif_chakra(const char *dir, int N, double fwd_bwd_ops, double compute_s,
                         size_t grad_bytes, double params, const dsim_device_model *dev)
{
    if (N > 4096) {
        fprintf(stderr,
                "dsim whatif: --chakra writes a file per rank; %d ranks is more than the "
                "4096 it writes\n",
                N);
        return 2;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "dsim whatif: --chakra %s: cannot create the directory: %s\n", dir,
                strerror(errno));
        return 2;
    }
    /* the update: SGD reads a weight and a gradient and writes the weight */
    double upd_ops = 2 * params, upd_s = 3 * 4 * params / dev->mem_Bps;
    for (int r = 0; r < N; r++) {
        json_t *nodes = json_array();
        json_t *fb = whatif_node(0, "forward_backward", "COMP_NODE", compute_s * 1e6, -1);
        json_t *ar = whatif_node(1, "allreduce_gradients", "COMM_COLL_NODE", 0, 0);
        json_t *up = whatif_node(2, "optimizer_update", "COMP_NODE", upd_s * 1e6, 1);
        if (!nodes || !fb || !ar || !up) {
            json_decref(nodes);
            json_decref(fb);
            json_decref(ar);
            json_decref(up);
            return whatif_bad("out of memory");
        }
        json_array_append_new(json_object_get(fb, "attr"), whatif_attr_i("num_ops", fwd_bwd_ops));
        json_array_append_new(json_object_get(fb, "attr"),
                              json_pack("{s:s, s:b}", "name", "is_cpu_op", "bool_val", 0));
        json_array_append_new(
            json_object_get(ar, "attr"),
            json_pack("{s:s, s:s}", "name", "comm_type", "string_val", "ALL_REDUCE"));
        json_array_append_new(json_object_get(ar, "attr"),
                              whatif_attr_i("comm_size", (double)grad_bytes));
        json_array_append_new(json_object_get(ar, "attr"),
                              json_pack("{s:s, s:b}", "name", "is_cpu_op", "bool_val", 0));
        json_array_append_new(json_object_get(up, "attr"), whatif_attr_i("num_ops", upd_ops));
        json_array_append_new(json_object_get(up, "attr"),
                              json_pack("{s:s, s:b}", "name", "is_cpu_op", "bool_val", 0));
        json_array_append_new(nodes, fb);
        json_array_append_new(nodes, ar);
        json_array_append_new(nodes, up);
        json_t *doc = json_pack("{s:{s:s, s:i, s:i}, s:o}", "global_metadata", "version", "0.0.4",
                                "rank", r, "ranks", N, "nodes", nodes);
        char path[4096];
        snprintf(path, sizeof path, "%s/trace.%d.json", dir, r);
        int bad = !doc || json_dump_file(doc, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0;
        json_decref(doc);
        if (bad) {
            fprintf(stderr, "dsim whatif: --chakra: cannot write %s\n", path);
            return 2;
        }
    }
    printf("chakra: %d execution traces written to %s/trace.RANK.json\n", N, dir);
    return 0;
}

static int whatif_bad(const char *msg)
{
    fprintf(stderr, "dsim whatif: %s\n", msg);
    return 2;
}

static int whatif_int(const char *flag, const char *v, long lo, long hi, int *out)
{
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "dsim whatif: %s '%s' is not a whole number in %ld..%ld\n", flag, v, lo,
                hi);
        return 2;
    }
    *out = (int)x;
    return 0;
}

/* What the flags (and a scenario) ask for. */
typedef struct whatif_opts {
    int hosts, devices, batch;
    const char *device, *networks, *intra, *params_s, *flops_s, *algo_s, *scenario, *chakra;
    const char *tpu_s, *tpu_topo_s;
    bool have_hosts, have_devices, have_device, have_network, have_intra;
    dsim_tpu_topology tpu; /* tpu.replicas > 0: a slice */
    double params, flops;
    dsim_algo algo;
    dsim_scenario *plugin; /* the scenario, kept when its strategy is a plugin */
} whatif_opts;

/* The flags into o: -1 to go on, else the exit status (--help, --presets,
 * bad input). */
static int whatif_args(int argc, char **argv, whatif_opts *o)
{
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cmd_whatif_help(stdout);
            return 0;
        } else if (strcmp(argv[i], "--presets") == 0) {
            whatif_presets();
            return 0;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--hosts", &missing))) {
            if (whatif_int("--hosts", v, 1, 65536, &o->hosts))
                return 2;
            o->have_hosts = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--devices", &missing))) {
            if (whatif_int("--devices", v, 1, 64, &o->devices))
                return 2;
            o->have_devices = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--batch", &missing))) {
            if (whatif_int("--batch", v, 1, 1 << 30, &o->batch))
                return 2;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--device", &missing))) {
            o->device = v;
            o->have_device = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--network", &missing))) {
            o->networks = v;
            o->have_network = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--intra", &missing))) {
            o->intra = v;
            o->have_intra = true;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--params", &missing))) {
            o->params_s = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--flops", &missing))) {
            o->flops_s = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--algo", &missing))) {
            o->algo_s = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--chakra", &missing))) {
            o->chakra = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--tpu-topology", &missing))) {
            o->tpu_topo_s = v;
        } else if ((v = dsim_cli_flag(argc, argv, &i, "--tpu", &missing))) {
            o->tpu_s = v;
        } else if (missing) {
            fprintf(stderr, "dsim whatif: %s needs a value\n", argv[i]);
            return 2;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dsim whatif: unknown option '%s' (see dsim whatif --help)\n", argv[i]);
            return 2;
        } else if (!o->scenario) {
            o->scenario = argv[i];
        } else {
            return whatif_bad("one scenario at a time");
        }
    }
    return -1;
}

/* The scenario's job and cluster, where no flag gave them: -1 to go on,
 * else the exit status. */
static int whatif_scenario(whatif_opts *o)
{
    dsim_scenario *s = NULL;
    if (dsim_scenario_load(o->scenario, &s) != DSIM_OK) {
        fprintf(stderr, "dsim whatif: %s\n", dsim_errmsg());
        return 2;
    }
    if (!o->have_hosts)
        o->hosts = s->train.hosts;
    if (!o->have_devices)
        o->devices = s->train.devices_per_host;
    if (!o->batch)
        o->batch = s->train.global_batch;
    if (s->train.synthetic_params > 0) {
        o->params = s->train.synthetic_params;
        o->flops = s->train.synthetic_flops;
    } else {
        size_t np = dsim_model_num_params(&s->train.model);
        o->params = (double)np;
        o->flops = 2.0 * (double)np; /* a dense model: a multiply and an add per weight */
    }
    o->algo = s->train.communication;
    bool plugin = s->train.plugin_path != NULL;
    if (!o->tpu_s && s->train.tpu.replicas > 0)
        o->tpu = s->train.tpu;
    /* the scenario's cluster, where it names one; the flags override it */
    static char dev_s[16], net_s[32], intra_s[32];
    if (!o->have_device && s->device_preset) {
        snprintf(dev_s, sizeof dev_s, "%s", s->device_preset);
        o->device = dev_s;
    }
    if (!o->have_network && s->network_given && s->network_preset &&
        dsim_link_preset(s->network_preset)) {
        snprintf(net_s, sizeof net_s, "%s", s->network_preset);
        o->networks = net_s;
    }
    if (!o->have_intra && s->intra_preset) {
        snprintf(intra_s, sizeof intra_s, "%s", s->intra_preset);
        o->intra = intra_s;
    }
    if (plugin)
        o->plugin = s; /* its own exchange: timed by running it */
    else
        dsim_scenario_free(s);
    return -1;
}

/* A plugin's exchange over one network: the scenario run timing only under
 * the sim engine (a synthetic model of o's size, three steps of o's batch),
 * the network and device models of o, no checks, no faults. *x gets the
 * exchange the plugin made. */
static dsim_err whatif_plugin_run(const whatif_opts *o, const dsim_link_model *l,
                                  const dsim_link_model *in, const dsim_device_model *dev,
                                  dsim_harness_result *res)
{
    dsim_scenario *s = o->plugin;
    free(s->network_preset);
    s->network_preset = strdup(l->name);
    s->network_given = true;
    s->link_latency_ns = (int64_t)(l->latency_s * 1e9);
    s->link_bandwidth_Bps = l->bandwidth_Bps;
    s->intra_latency_ns = (int64_t)(in->latency_s * 1e9);
    s->intra_Bps = in->bandwidth_Bps;
    s->train.hosts = o->hosts;
    s->train.devices_per_host = o->devices;
    s->train.synthetic_params = o->params;
    s->train.synthetic_flops = o->flops;
    s->train.device_flops = dev->peak_flops * dev->efficiency;
    s->train.global_batch = o->batch;
    s->train.data.n_examples = 3 * (uint64_t)o->batch;
    s->train.epochs = 1;
    free((void *)s->train.checkpoint_path); /* the scenario's own: no checkpoint here */
    s->train.checkpoint_path = NULL;
    s->train.restore = false;
    for (size_t i = 0; i < s->n_faults; i++)
        free(s->faults[i].phase);
    s->n_faults = 0;
    s->n_expect = 0;
    free(s->expect_error);
    s->expect_error = NULL;
    s->has_liveness = false;
    free(s->recovery);
    s->recovery = NULL;
    dsim_harness_opts ho = {.size = sizeof ho, .engine_override = "sim", .no_crash_guard = true};
    return dsim_harness_run(s, &ho, res);
}

/* One row per network for a plugin's own exchange, timed by running it. */
static int whatif_plugin_rows(const whatif_opts *o, const dsim_device_model *dev,
                              const dsim_link_model *in, size_t bytes, double t1, double tc)
{
    int N = o->hosts * o->devices;
    char *list = strdup(o->networks);
    if (!list)
        return whatif_bad("out of memory");
    int rc = 0;
    char exchange[256] = "";
    for (char *save = NULL, *net = strtok_r(list, ",", &save); net && !rc;
         net = strtok_r(NULL, ",", &save)) {
        const dsim_link_model *l = dsim_link_preset(net);
        if (!l) {
            fprintf(stderr, "dsim whatif: --network '%s' is not a link preset (see --presets)\n",
                    net);
            rc = 2;
            break;
        }
        dsim_harness_result res;
        dsim_err e = whatif_plugin_run(o, l, in, dev, &res);
        if (e != DSIM_OK || res.train_err != DSIM_OK || !(res.step_s > 0)) {
            fprintf(stderr, "dsim whatif: running the plugin's exchange over %s: %s\n", net,
                    e != DSIM_OK ? dsim_errmsg() : res.train_msg);
            dsim_harness_result_free(&res);
            rc = 2;
            break;
        }
        /* the exchange's median time in a step, without the compute */
        double ar = res.exchange_s, step = tc + ar, speed = t1 / step;
        const char *w = strstr(res.whatif, "exchange ");
        const char *a = strstr(res.whatif, "all-reduce algorithm ");
        if (!exchange[0] && !w && a) {
            /* one all-reduce on the world: the what-if line names its
             * algorithm only */
            a += strlen("all-reduce algorithm ");
            snprintf(exchange, sizeof exchange, "allreduce(%.*s) on the world communicator",
                     (int)strcspn(a, " \n"), a);
        } else if (!exchange[0] && w) {
            snprintf(exchange, sizeof exchange, "%s", w + 9);
            char *end = strstr(exchange, " (the strategy's own)");
            if (!end)
                end = strchr(exchange, '\n');
            if (end)
                *end = '\0';
        }
        dsim_topology t = {.hosts = o->hosts,
                           .devices_per_host = o->devices,
                           .intra = *in,
                           .inter = *l,
                           .device = *dev};
        double best_t = INFINITY;
        dsim_algo best = DSIM_ALGO_RING;
        for (int k = DSIM_ALGO_AUTO + 1; k < DSIM_ALGO_COUNT; k++) {
            double x = 0;
            if (dsim_cost_allreduce(&t, (dsim_algo)k, bytes, 4, &x, NULL) == DSIM_OK &&
                x < best_t) {
                best_t = x;
                best = (dsim_algo)k;
            }
        }
        printf("%-9s %-14s %12.3f %11.2f %10.2f %6.0f%% %8.2f %10.2f  %s (%.3f)\n", l->name,
               "(its own)", ar * 1e3, tc * 1e3, step * 1e3, 100 * ar / step, speed, speed / N,
               dsim_algo_name(best), best_t * 1e3);
        dsim_harness_result_free(&res);
    }
    free(list);
    if (!rc)
        printf("\nexchange (the plugin's own, timed under the sim engine with virtual payloads): "
               "%s\n",
               exchange[0] ? exchange : "no collective");
    return rc;
}

/* One row: the all-reduce's time on topology t with the algorithm asked
 * for, the step, and the fastest algorithm. */
static int whatif_row(const whatif_opts *o, const dsim_topology *t, const char *net, size_t bytes,
                      double t1, double tc)
{
    int N = o->hosts * o->devices;
    /* auto: what a job on this network runs, the model's pick */
    dsim_algo a = o->algo == DSIM_ALGO_AUTO ? dsim_cost_decide(t, bytes, 4, NULL) : o->algo;
    double ar = 0, best_t = INFINITY;
    dsim_algo best = a;
    if (dsim_cost_allreduce(t, a, bytes, 4, &ar, NULL) != DSIM_OK)
        return whatif_bad(dsim_errmsg());
    for (int k = DSIM_ALGO_AUTO + 1; k < DSIM_ALGO_COUNT; k++) {
        double x = 0;
        if (dsim_cost_allreduce(t, (dsim_algo)k, bytes, 4, &x, NULL) == DSIM_OK && x < best_t) {
            best_t = x;
            best = (dsim_algo)k;
        }
    }
    double step = tc + ar, speed = t1 / step;
    printf("%-9s %-14s %12.3f %11.2f %10.2f %6.0f%% %8.2f %10.2f  %s (%.3f)\n", net,
           dsim_algo_name(a), ar * 1e3, tc * 1e3, step * 1e3, 100 * ar / step, speed, speed / N,
           dsim_algo_name(best), best_t * 1e3);
    return 0;
}

/* One row per network of o->networks (or the slice's ICI). */
static int whatif_rows(const whatif_opts *o, const dsim_device_model *dev,
                       const dsim_link_model *in, size_t bytes, double t1, double tc)
{
    if (o->tpu.replicas > 0) {
        dsim_topology t = {.hosts = o->hosts,
                           .devices_per_host = o->devices,
                           .intra = *in,
                           .inter = *in,
                           .device = *dev,
                           .tpu = &o->tpu};
        dsim_tpu_link_models(o->tpu.gen, &t.ici, &t.on_chip);
        return whatif_row(o, &t, t.ici.name, bytes, t1, tc);
    }
    char *list = strdup(o->networks);
    if (!list)
        return whatif_bad("out of memory");
    int rc = 0;
    for (char *save = NULL, *net = strtok_r(list, ",", &save); net && rc == 0;
         net = strtok_r(NULL, ",", &save)) {
        const dsim_link_model *l = dsim_link_preset(net);
        if (!l) {
            fprintf(stderr, "dsim whatif: --network '%s' is not a link preset (see --presets)\n",
                    net);
            rc = 2;
            break;
        }
        dsim_topology t = {.hosts = o->hosts,
                           .devices_per_host = o->devices,
                           .intra = *in,
                           .inter = *l,
                           .device = *dev};
        rc = whatif_row(o, &t, l->name, bytes, t1, tc);
    }
    free(list);
    return rc;
}

/* --tpu (and --tpu-topology): the slice, its hosts and replicas, its chip as
 * the device and its on-chip link as the intra-host one. -1 to go on, else
 * the exit status. */
static int whatif_tpu(whatif_opts *o)
{
    if (o->tpu_topo_s && !o->tpu_s)
        return whatif_bad("--tpu-topology needs --tpu GEN (v2, v3, v4, v5e)");
    if (o->tpu_s) {
        if (o->have_hosts || o->have_devices || o->have_network || o->have_intra || o->have_device)
            return whatif_bad("--tpu gives the hosts, devices, device and network: drop "
                              "--hosts, --devices, --device, --network and --intra");
        dsim_err e;
        if (o->tpu_topo_s) {
            dsim_tpu_gen g;
            e = dsim_tpu_gen_parse(o->tpu_s, &g);
            if (e == DSIM_OK)
                e = dsim_tpu_topology_shape(g, o->tpu_topo_s, &o->tpu);
        } else {
            e = dsim_tpu_topology_parse(o->tpu_s, &o->tpu);
        }
        if (e != DSIM_OK)
            return whatif_bad(dsim_errmsg());
    }
    if (o->tpu.replicas == 0)
        return -1;
    static char dev_s[24], intra_s[24];
    dsim_link_model ici, chip;
    dsim_tpu_link_models(o->tpu.gen, &ici, &chip);
    snprintf(dev_s, sizeof dev_s, "%s", dsim_tpu_device_model(o->tpu.gen)->name);
    snprintf(intra_s, sizeof intra_s, "%s", chip.name);
    o->device = dev_s;
    o->intra = intra_s;
    o->hosts = o->tpu.hosts;
    o->devices = o->tpu.replicas_per_host;
    return -1;
}

/* Everything after the flags and the scenario: the checks of the figures,
 * the header and the rows. */
static int whatif_run(whatif_opts *op)
{
    whatif_opts o = *op;
    int rc;
    if (o.params_s && dsim_cost_parse_count("--params", o.params_s, &o.params) != DSIM_OK)
        return whatif_bad(dsim_errmsg());
    if (o.flops_s && dsim_cost_parse_count("--flops", o.flops_s, &o.flops) != DSIM_OK)
        return whatif_bad(dsim_errmsg());
    if (o.params < 1 || o.params > 1e12)
        return whatif_bad("--params must be between 1 and 1T");
    if (strcmp(o.algo_s, "auto") != 0 || !o.scenario) {
        if (dsim_algo_parse(o.algo_s, &o.algo) != DSIM_OK)
            return whatif_bad(dsim_errmsg());
    }
    const dsim_device_model *dev = dsim_device_preset(o.device);
    if (!dev) {
        fprintf(stderr,
                "dsim whatif: --device '%s' is not a preset (v100, a100, h100, tpu-v2, tpu-v3, "
                "tpu-v4, tpu-v5e, cpu)\n",
                o.device);
        return 2;
    }
    const dsim_link_model *in = dsim_link_preset(o.intra);
    if (!in) {
        fprintf(stderr, "dsim whatif: --intra '%s' is not a link preset (see --presets)\n",
                o.intra);
        return 2;
    }
    int N = o.hosts * o.devices;
    if (!o.batch)
        o.batch = 32 * N;
    size_t bytes = (size_t)o.params * 4;
    double per = (double)o.batch / N;
    double t1 = dsim_cost_compute(dev, o.flops, o.batch), tc = dsim_cost_compute(dev, o.flops, per);
    printf("what if: %d host(s) x %d %s (%s), %.4g parameters (%.1f MB of float32 gradients), "
           "%.3g FLOPs per example forward, global batch %d (%.4g per replica); intra-host %s\n",
           o.hosts, o.devices, dev->name, dev->what, o.params, (double)bytes / 1e6, o.flops,
           o.batch, per, in->name);
    if (o.tpu.replicas > 0)
        printf("TPU %s, simulated: no TPU is used; its %d replicas on %dx%dx%d chips, ICI "
               "modelled hop by hop from published figures\n",
               o.tpu.name, o.tpu.replicas, o.tpu.dims[0], o.tpu.dims[1], o.tpu.dims[2]);
    printf("one %s on the whole global batch: %.2f ms a step\n\n", dev->name, t1 * 1e3);
    printf("%-9s %-14s %12s %11s %10s %7s %8s %10s  %s\n", "network",
           o.plugin ? "exchange" : "algorithm", o.plugin ? "exchange_ms" : "allreduce_ms",
           "compute_ms", "step_ms", "share", "speedup", "efficiency",
           o.plugin ? "best built-in all-reduce (ms)" : "best (ms)");
    rc = o.plugin ? whatif_plugin_rows(&o, dev, in, bytes, t1, tc)
                  : whatif_rows(&o, dev, in, bytes, t1, tc);
    if (rc == 0 && o.chakra)
        rc = whatif_chakra(o.chakra, N, 3 * o.flops * per, tc, bytes, o.params, dev);
    if (rc == 0)
        printf("\nfigures: the presets' datasheet and measured values with their sources "
               "(dsim whatif --presets); no overlap of communication with the backward pass\n");
    return rc;
}

int cmd_whatif(int argc, char **argv)
{
    whatif_opts o = {.hosts = 4,
                     .devices = 4,
                     .device = "v100",
                     .networks = "1gbe,10gbe,ib100",
                     .intra = "nvlink",
                     .algo_s = "auto",
                     .params = 25.6e6,
                     .flops = 4.1e9,
                     .algo = DSIM_ALGO_AUTO};
    int rc = whatif_args(argc, argv, &o);
    if (rc < 0 && o.scenario)
        rc = whatif_scenario(&o);
    if (rc < 0)
        rc = whatif_tpu(&o);
    if (rc < 0)
        rc = whatif_run(&o);
    dsim_scenario_free(o.plugin);
    return rc;
}
