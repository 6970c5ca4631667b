/* Cost models: presets, the all-reduce schedules evaluated under the
 * alpha-beta model, and the compute model (costmodel.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsim/model.h"
#include "model/cost_int.h"
#include "model/costmodel.h"

/* ---- presets ----
 *
 * Bandwidths are per direction. For Ethernet, TCP goodput with a 1500-byte
 * MTU (about 94 % of the line rate: 1460 payload bytes of every 1538 on the
 * wire); latencies are typical one-way figures for kernel TCP on a switched
 * LAN, an order of magnitude, not a promise. */
static const dsim_link_model link_presets[] = {
    {"loopback", "TCP over 127.0.0.1 on this machine", 15.2e-6, 3.0e9,
     "measured here: dsim's tcp transport ping-pong, half round trip 15.2 us at 8 B, "
     "2.0-3.8 GB/s at 1-8 MiB (reports/bench-allreduce-tcp-4ranks.txt)"},
    {"1gbe", "1 Gigabit Ethernet", 50e-6, 117.5e6,
     "IEEE 802.3ab 1 Gb/s; TCP goodput 940 Mb/s at MTU 1500; ~50 us one-way through a "
     "switch and two kernel TCP stacks"},
    {"10gbe", "10 Gigabit Ethernet", 20e-6, 1.175e9,
     "IEEE 802.3ae 10 Gb/s; TCP goodput 9.4 Gb/s at MTU 1500; ~20 us one-way with kernel TCP"},
    {"25gbe", "25 Gigabit Ethernet", 10e-6, 2.94e9,
     "IEEE 802.3by 25 Gb/s; TCP goodput 23.5 Gb/s at MTU 1500; ~10 us one-way"},
    {"ib100", "100 Gb/s InfiniBand (EDR), RDMA", 1.0e-6, 12.1e9,
     "InfiniBand EDR 4x: 100 Gb/s signalling, 64b/66b encoding: 12.1 GB/s of data; "
     "~1 us one-way (ConnectX-5 RDMA write latency about 0.6 us plus a switch hop)"},
    {"pcie4", "PCIe 4.0 x16 between devices of one host", 1.5e-6, 25e9,
     "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b: 31.5 GB/s raw; ~25 GB/s achieved in "
     "device-to-device copies; ~1.5 us per transfer"},
    {"nvlink", "NVLink 2.0 (V100, DGX-1): one GPU's links together", 3e-6, 150e9,
     "NVIDIA Tesla V100 datasheet: 6 NVLink 2.0 links, 300 GB/s bidirectional per GPU; "
     "~3 us per transfer (NCCL's small-message latency order)"},
    {"nvlink3", "NVLink 3.0 (A100, DGX A100 via NVSwitch)", 3e-6, 300e9,
     "NVIDIA A100 datasheet: 12 NVLink 3.0 links, 600 GB/s bidirectional per GPU"},
    {"nvlink4", "NVLink 4.0 (H100 SXM via NVSwitch)", 3e-6, 450e9,
     "NVIDIA H100 datasheet: 18 NVLink 4.0 links, 900 GB/s bidirectional per GPU"},
};

/* FP32 figures without tensor cores (the dsim models train in float32);
 * efficiency: the share of peak a convolutional network's training step
 * reaches, from NVIDIA's published ResNet-50 v1.5 FP32 throughput (about 390
 * images/s on a V100 at about 12 GFLOP per image forward and backward: 4.7
 * TFLOP/s of 15.7, so 0.3), used for every GPU preset. */
static const dsim_device_model device_presets[] = {
    {"v100", "NVIDIA V100 SXM2", 15.7e12, 0.3, 900e9,
     "NVIDIA Tesla V100 datasheet: 15.7 TFLOP/s FP32, HBM2 900 GB/s; efficiency from "
     "NVIDIA DeepLearningExamples ResNet-50 v1.5 FP32 throughput"},
    {"a100", "NVIDIA A100 SXM4 80GB", 19.5e12, 0.3, 2039e9,
     "NVIDIA A100 datasheet: 19.5 TFLOP/s FP32, HBM2e 2039 GB/s"},
    {"h100", "NVIDIA H100 SXM5", 67e12, 0.3, 3350e9,
     "NVIDIA H100 datasheet: 67 TFLOP/s FP32, HBM3 3.35 TB/s"},
};

#define N_LINKS   (sizeof link_presets / sizeof link_presets[0])
#define N_DEVICES (sizeof device_presets / sizeof device_presets[0])

const dsim_link_model *dsim_link_preset(const char *name)
{
    for (size_t i = 0; name && i < N_LINKS; i++)
        if (strcmp(link_presets[i].name, name) == 0)
            return &link_presets[i];
    return NULL;
}

const dsim_link_model *dsim_link_preset_at(size_t i)
{
    return i < N_LINKS ? &link_presets[i] : NULL;
}

const dsim_device_model *dsim_device_preset(const char *name)
{
    if (name && strcmp(name, "cpu") == 0)
        return dsim_device_cpu_measured();
    for (size_t i = 0; name && i < N_DEVICES; i++)
        if (strcmp(device_presets[i].name, name) == 0)
            return &device_presets[i];
    return NULL;
}

const dsim_device_model *dsim_device_preset_at(size_t i)
{
    if (i < N_DEVICES)
        return &device_presets[i];
    return i == N_DEVICES ? dsim_device_cpu_measured() : NULL;
}

static double cm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static dsim_device_model cm_cpu = {
    "cpu",
    "this machine's CPU, one thread, measured",
    0,
    1,
    0,
    "measured when asked: a 256x256 dense layer's forward and backward pass through dsim's "
    "model kernels (best of 5), and a 64 MiB memcpy (best of 5)"};
static int cm_cpu_done;

const dsim_device_model *dsim_device_cpu_measured(void)
{
    if (cm_cpu_done)
        return &cm_cpu;
    /* FLOP/s: an MLP 256 -> 256 -> 4 over 64 examples, as training runs it */
    dsim_model_spec spec = {.kind = DSIM_MODEL_MLP, .in_dim = 256, .n_hidden = 1, .out_dim = 4};
    spec.hidden[0] = 256;
    double flops_s = 0;
    size_t P = dsim_model_num_params(&spec), B = 64;
    size_t ydim = dsim_model_y_dim(&spec);
    float *w = calloc(P ? P : 1, sizeof(float)), *g = calloc(P ? P : 1, sizeof(float));
    float *x = calloc(B * 256, sizeof(float)), *y = calloc(B * (ydim ? ydim : 1), sizeof(float));
    if (P && w && g && x && y) {
        for (size_t i = 0; i < P; i++)
            w[i] = 0.01f * (float)(i % 7);
        for (size_t i = 0; i < B * 256; i++)
            x[i] = 0.001f * (float)(i % 13);
        for (size_t i = 0; i < B; i++)
            y[i * ydim] = (float)(i % 4); /* class labels */
        double best = INFINITY;
        for (int rep = 0; rep < 5; rep++) {
            double loss = 0, t0 = cm_now();
            if (dsim_model_loss_grad(&spec, w, x, y, B, 1.0f / (float)B, g, &loss) != DSIM_OK)
                break;
            double t = cm_now() - t0;
            if (t < best)
                best = t;
        }
        /* forward 2 FLOPs per weight per example, backward twice that */
        if (best > 0 && isfinite(best))
            flops_s = 6.0 * (double)P * (double)B / best;
    }
    free(w);
    free(g);
    free(x);
    free(y);
    size_t nb = (size_t)64 << 20;
    char *a = malloc(nb), *b = malloc(nb);
    double bw = 0;
    if (a && b) {
        memset(a, 1, nb);
        memset(b, 2, nb);
        double best = INFINITY;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = cm_now();
            memcpy(b, a, nb);
            double t = cm_now() - t0;
            if (t < best)
                best = t;
            a[rep] = b[nb - 1 - (size_t)rep]; /* keep the copies */
        }
        if (best > 0)
            bw = 2.0 * (double)nb / best; /* read + write */
    }
    free(a);
    free(b);
    cm_cpu.peak_flops = flops_s > 0 ? flops_s : 1e9;
    cm_cpu.mem_Bps = bw > 0 ? bw : 5e9;
    cm_cpu_done = 1;
    return &cm_cpu;
}

/* ---- the schedule evaluator ---- */

static int cm_host(const cm_eval *ev, int r)
{
    return r / ev->t->devices_per_host;
}

void dsim_cost_step(cm_eval *ev, const cm_xfer *x, int n)
{
    int p = ev->p, H = ev->t->hosts;
    if (n == 0)
        return;
    memset(ev->out_n, 0, (size_t)p * sizeof *ev->out_n);
    memset(ev->in_n, 0, (size_t)p * sizeof *ev->in_n);
    memset(ev->nic_out, 0, (size_t)H * sizeof *ev->nic_out);
    memset(ev->nic_in, 0, (size_t)H * sizeof *ev->nic_in);
    for (int p0 = 0; p0 < p; p0++)
        ev->arrive[p0] = ev->reduce[p0] = 0;
    for (int i = 0; i < n; i++) {
        int hs = cm_host(ev, x[i].src), hd = cm_host(ev, x[i].dst);
        if (hs != hd) {
            ev->nic_out[hs]++;
            ev->nic_in[hd]++;
        } else {
            ev->out_n[x[i].src]++;
            ev->in_n[x[i].dst]++;
        }
    }
    double gamma = ev->t->device.mem_Bps > 0 ? 3.0 / ev->t->device.mem_Bps : 0;
    double work = 0, alpha = 0; /* CPU time of the step's copies and reductions */
    for (int i = 0; i < n; i++) {
        int hs = cm_host(ev, x[i].src), hd = cm_host(ev, x[i].dst);
        const dsim_link_model *l = hs != hd ? &ev->t->inter : &ev->t->intra;
        int share = hs != hd ? (ev->nic_out[hs] > ev->nic_in[hd] ? ev->nic_out[hs] : ev->nic_in[hd])
                             : (ev->out_n[x[i].src] > ev->in_n[x[i].dst] ? ev->out_n[x[i].src]
                                                                         : ev->in_n[x[i].dst]);
        /* On one machine's own engines (cores > 0) a transfer is a copy by
         * some core, not a share of a NIC: transfers that leave one rank at
         * once take turns on the cores (the bound below), not on a link. */
        if (ev->t->cores > 0)
            share = 1;
        double move = ev->t->fused_reduce && x[i].reduce > 0
                          ? 0
                          : x[i].bytes * (double)share / l->bandwidth_Bps;
        double t = l->latency_s + move;
        if (t > ev->arrive[x[i].dst])
            ev->arrive[x[i].dst] = t;
        ev->reduce[x[i].dst] += x[i].reduce * gamma;
        work += move + x[i].reduce * gamma;
        if (l->latency_s > alpha)
            alpha = l->latency_s;
    }
    double worst = 0;
    for (int r = 0; r < p; r++)
        if (ev->arrive[r] + ev->reduce[r] > worst)
            worst = ev->arrive[r] + ev->reduce[r];
    /* on a machine of `cores` cores the step's work takes at least its share */
    if (ev->t->cores > 0 && alpha + work / ev->t->cores > worst)
        worst = alpha + work / ev->t->cores;
    ev->total += worst;
    ev->steps++;
}

dsim_err dsim_cost_allreduce(const dsim_topology *t, dsim_algo algo, size_t bytes, size_t esize,
                             double *seconds, int *steps)
{
    if (!t || !seconds || esize == 0 || bytes % esize != 0 || t->hosts < 1 ||
        t->devices_per_host < 1 || t->inter.bandwidth_Bps <= 0 || t->intra.bandwidth_Bps <= 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cost model: a topology of >= 1 host x >= 1 device with positive link "
                        "bandwidths and a whole number of elements are needed");
    long long pl = (long long)t->hosts * t->devices_per_host;
    if (pl > (1 << 20))
        return DSIM_ERR(DSIM_EINVAL, -1, "cost model: %lld ranks is more than the %d supported", pl,
                        1 << 20);
    int p = (int)pl;
    *seconds = 0;
    if (steps)
        *steps = 0;
    if (p == 1)
        return DSIM_OK;
    const dsim_algo_cost *cost = dsim_algo_cost_of(algo);
    if (!cost) {
        char names[256];
        return DSIM_ERR(DSIM_EINVAL, -1, "cost model: algorithm %d has no schedule (%s)", (int)algo,
                        dsim_algo_list(names, sizeof names, 0, ", ", ", "));
    }
    cm_eval ev = {.t = t, .p = p};
    ev.out_n = calloc((size_t)p, sizeof *ev.out_n);
    ev.in_n = calloc((size_t)p, sizeof *ev.in_n);
    ev.nic_out = calloc((size_t)t->hosts, sizeof *ev.nic_out);
    ev.nic_in = calloc((size_t)t->hosts, sizeof *ev.nic_in);
    ev.arrive = calloc((size_t)p, sizeof *ev.arrive);
    ev.reduce = calloc((size_t)p, sizeof *ev.reduce);
    cm_xfer *x = calloc((size_t)p, sizeof *x);
    dsim_err e = DSIM_OK;
    if (!ev.out_n || !ev.in_n || !ev.nic_out || !ev.nic_in || !ev.arrive || !ev.reduce || !x) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "cost model: out of memory for %d ranks", p);
        goto out;
    }
    size_t count = bytes / esize;
    cost->schedule(&ev, x, count, (double)esize);
    *seconds = ev.total;
    if (steps)
        *steps = ev.steps;
out:
    free(ev.out_n);
    free(ev.in_n);
    free(ev.nic_out);
    free(ev.nic_in);
    free(ev.arrive);
    free(ev.reduce);
    free(x);
    return e;
}

double dsim_cost_allreduce_formula(dsim_algo algo, int p, double n, double a, double b, double g)
{
    const dsim_algo_cost *cost = dsim_algo_cost_of(algo);
    if (p <= 1)
        return 0;
    return cost ? cost->formula(p, n, a, b, g) : NAN;
}

double dsim_cost_compute(const dsim_device_model *d, double flops_per_example, double examples)
{
    if (!d || d->peak_flops <= 0 || d->efficiency <= 0)
        return NAN;
    return 3.0 * flops_per_example * examples / (d->peak_flops * d->efficiency);
}

dsim_err dsim_cost_parse_count(const char *what, const char *s, double *out)
{
    if (!s || !*s)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: a number is needed, e.g. 25.6M", what);
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: '%s' is not a non-negative number (e.g. 25.6M, 4.1G, 1e9)", what, s);
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        mul = 1e3, end++;
        break;
    case 'M':
        mul = 1e6, end++;
        break;
    case 'G':
        mul = 1e9, end++;
        break;
    case 'T':
        mul = 1e12, end++;
        break;
    default:
        break;
    }
    if (*end)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: '%s' has '%s' after the number; accepted suffixes K, M, G, T", what, s,
                        end);
    *out = v * mul;
    return DSIM_OK;
}
