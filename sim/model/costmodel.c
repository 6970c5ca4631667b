/* Cost models: presets, the all-reduce schedules evaluated under the
 * alpha-beta model, and the compute model (costmodel.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
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

/* TPU presets, one per generation, made from libdsim's table of TPU
 * figures (src/cluster/tpu.c, whose sources they carry): "ici-v3" is one
 * ICI link in one direction, "tpu-v3" one replica. No TPU was measured:
 * every figure is a published one, and the efficiency is the GPU presets'
 * (a convolutional network's training step reaching 0.3 of peak), not a
 * measurement on a TPU. */
static dsim_link_model tpu_ici[DSIM_TPU_GEN_COUNT], tpu_chip[DSIM_TPU_GEN_COUNT];
static dsim_device_model tpu_dev[DSIM_TPU_GEN_COUNT];
static char tpu_names[DSIM_TPU_GEN_COUNT][3][24];
static char tpu_whats[DSIM_TPU_GEN_COUNT][3][96];
static char tpu_sources[DSIM_TPU_GEN_COUNT][3][512];
static pthread_once_t tpu_once = PTHREAD_ONCE_INIT;

static void tpu_presets_fill(void)
{
    for (int g = 0; g < DSIM_TPU_GEN_COUNT; g++) {
        const dsim_tpu_gen_info *gi = dsim_tpu_gen_get((dsim_tpu_gen)g);
        char(*nm)[24] = tpu_names[g];
        char(*wh)[96] = tpu_whats[g];
        char(*so)[512] = tpu_sources[g];
        snprintf(nm[0], sizeof nm[0], "ici-%s", gi->name);
        snprintf(wh[0], sizeof wh[0], "TPU %s ICI: one of a chip's %d links, one direction",
                 gi->name, gi->ici_links);
        snprintf(so[0], sizeof so[0], "%s", gi->source);
        tpu_ici[g] = (dsim_link_model){nm[0], wh[0], gi->ici_latency_s, gi->ici_link_Bps, so[0]};
        snprintf(nm[1], sizeof nm[1], "chip-%s", gi->name);
        snprintf(wh[1], sizeof wh[1], "TPU %s: between the %d replicas of one chip", gi->name,
                 gi->replicas_per_chip);
        snprintf(so[1], sizeof so[1],
                 "no public figure: one TensorCore's share of the chip's HBM bandwidth (%.0f "
                 "GB/s of %.0f) and the ICI's hop latency, dsim's assumption",
                 gi->hbm_Bps / gi->cores_per_chip / 1e9, gi->hbm_Bps / 1e9);
        tpu_chip[g] = (dsim_link_model){nm[1], wh[1], gi->ici_latency_s,
                                        gi->hbm_Bps / gi->cores_per_chip, so[1]};
        snprintf(nm[2], sizeof nm[2], "tpu-%s", gi->name);
        snprintf(wh[2], sizeof wh[2], "TPU %s, one replica (%s)", gi->name,
                 gi->replicas_per_chip > 1 ? "a TensorCore"
                 : gi->cores_per_chip > 1  ? "a chip, megacore"
                                           : "a chip");
        snprintf(so[2], sizeof so[2],
                 "bf16 peak per chip over its replicas; efficiency 0.3 is the GPU presets' "
                 "share of peak, not a TPU measurement; %s",
                 gi->source);
        tpu_dev[g] = (dsim_device_model){nm[2],
                                         wh[2],
                                         gi->peak_bf16_flops / gi->replicas_per_chip,
                                         0.3,
                                         gi->hbm_Bps / gi->replicas_per_chip,
                                         so[2]};
    }
}

void dsim_tpu_link_models(dsim_tpu_gen gen, dsim_link_model *ici, dsim_link_model *on_chip)
{
    pthread_once(&tpu_once, tpu_presets_fill);
    if ((int)gen < 0 || gen >= DSIM_TPU_GEN_COUNT)
        return;
    if (ici)
        *ici = tpu_ici[gen];
    if (on_chip)
        *on_chip = tpu_chip[gen];
}

const dsim_device_model *dsim_tpu_device_model(dsim_tpu_gen gen)
{
    pthread_once(&tpu_once, tpu_presets_fill);
    if ((int)gen < 0 || gen >= DSIM_TPU_GEN_COUNT)
        return NULL;
    return &tpu_dev[gen];
}

const dsim_link_model *dsim_link_preset(const char *name)
{
    for (size_t i = 0; name && dsim_link_preset_at(i); i++)
        if (strcmp(dsim_link_preset_at(i)->name, name) == 0)
            return dsim_link_preset_at(i);
    return NULL;
}

const dsim_link_model *dsim_link_preset_at(size_t i)
{
    pthread_once(&tpu_once, tpu_presets_fill);
    if (i < N_LINKS)
        return &link_presets[i];
    i -= N_LINKS;
    if (i < DSIM_TPU_GEN_COUNT)
        return &tpu_ici[i];
    i -= DSIM_TPU_GEN_COUNT;
    return i < DSIM_TPU_GEN_COUNT ? &tpu_chip[i] : NULL;
}

const dsim_device_model *dsim_device_preset(const char *name)
{
    if (name && strcmp(name, "cpu") == 0)
        return dsim_device_cpu_measured();
    for (size_t i = 0; name && i < N_DEVICES + DSIM_TPU_GEN_COUNT; i++)
        if (strcmp(dsim_device_preset_at(i)->name, name) == 0)
            return dsim_device_preset_at(i);
    return NULL;
}

const dsim_device_model *dsim_device_preset_at(size_t i)
{
    pthread_once(&tpu_once, tpu_presets_fill);
    if (i < N_DEVICES)
        return &device_presets[i];
    if (i < N_DEVICES + DSIM_TPU_GEN_COUNT)
        return &tpu_dev[i - N_DEVICES];
    return i == N_DEVICES + DSIM_TPU_GEN_COUNT ? dsim_device_cpu_measured() : NULL;
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

static int cm_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* The most hops of a path over a slice: every dimension crossed end to end. */
#define CM_MAX_HOPS (3 * 1024)

/* The directed ICI links (chip x dimension x direction) a transfer from
 * rank src's chip to rank dst's crosses, dimension by dimension, the short
 * way round where the dimension wraps (ties go the + way); returns how many. */
static int cm_tpu_path(const cm_eval *ev, int src, int dst, int *path)
{
    const dsim_tpu_topology *tp = ev->t->tpu;
    int c[DSIM_TPU_DIMS];
    memcpy(c, &ev->coords[src * DSIM_TPU_DIMS], sizeof c);
    const int *b = &ev->coords[dst * DSIM_TPU_DIMS];
    int n = 0;
    for (int d = 0; d < DSIM_TPU_DIMS; d++) {
        int D = tp->dims[d], dir = 1, steps;
        if (tp->wrap[d]) {
            int fwd = cm_mod(b[d] - c[d], D);
            steps = fwd <= D - fwd ? fwd : D - fwd;
            dir = fwd <= D - fwd ? 1 : -1;
        } else {
            dir = b[d] >= c[d] ? 1 : -1;
            steps = (b[d] - c[d]) * dir;
        }
        for (int k = 0; k < steps && n < CM_MAX_HOPS; k++) {
            int chip = c[0] + tp->dims[0] * (c[1] + tp->dims[1] * c[2]);
            path[n++] = (chip * DSIM_TPU_DIMS + d) * 2 + (dir < 0);
            c[d] = cm_mod(c[d] + dir, D);
        }
    }
    return n;
}

/* One step on a TPU slice: ICI links carry each direction on its own, and
 * a transfer's bandwidth is its share of the busiest link on its path. */
static void cm_tpu_step(cm_eval *ev, const cm_xfer *x, int n)
{
    const dsim_topology *t = ev->t;
    int p = ev->p, chips = t->tpu->chips;
    int path[CM_MAX_HOPS];
    memset(ev->link_n, 0, (size_t)chips * DSIM_TPU_DIMS * 2 * sizeof *ev->link_n);
    memset(ev->out_n, 0, (size_t)p * sizeof *ev->out_n);
    for (int r = 0; r < p; r++)
        ev->arrive[r] = ev->reduce[r] = 0;
    for (int i = 0; i < n; i++) {
        if (ev->chip[x[i].src] == ev->chip[x[i].dst]) {
            ev->out_n[x[i].src]++;
            continue;
        }
        int h = cm_tpu_path(ev, x[i].src, x[i].dst, path);
        for (int k = 0; k < h; k++)
            ev->link_n[path[k]]++;
    }
    double gamma = t->device.mem_Bps > 0 ? 3.0 / t->device.mem_Bps : 0;
    for (int i = 0; i < n; i++) {
        double tt;
        if (ev->chip[x[i].src] == ev->chip[x[i].dst]) {
            tt = t->on_chip.latency_s +
                 x[i].bytes * (double)ev->out_n[x[i].src] / t->on_chip.bandwidth_Bps;
        } else {
            int h = cm_tpu_path(ev, x[i].src, x[i].dst, path), share = 1;
            for (int k = 0; k < h; k++)
                if (ev->link_n[path[k]] > share)
                    share = ev->link_n[path[k]];
            tt = h * t->ici.latency_s + x[i].bytes * (double)share / t->ici.bandwidth_Bps;
        }
        if (tt > ev->arrive[x[i].dst])
            ev->arrive[x[i].dst] = tt;
        ev->reduce[x[i].dst] += x[i].reduce * gamma;
    }
    double worst = 0;
    for (int r = 0; r < p; r++)
        if (ev->arrive[r] + ev->reduce[r] > worst)
            worst = ev->arrive[r] + ev->reduce[r];
    ev->total += worst;
    ev->steps++;
}

#define CM_CAPTURE_MAX (1 << 22)

/* Appends a step's transfers to ev->capture (its arrays grown by
 * doubling); on running out of memory the capture is marked failed
 * (steps = -1) and records nothing more. */
static void cm_capture_step(cm_eval *ev, const cm_xfer *x, int n)
{
    dsim_cost_pattern *c = ev->capture;
    if (c->steps < 0)
        return;
    if (c->n + n > CM_CAPTURE_MAX) { /* more than a calibration replays */
        c->steps = -1;
        return;
    }
    int cap = 1;
    while (cap < c->n + n)
        cap *= 2;
    int *off = realloc(c->off, (size_t)(c->steps + 2) * sizeof *off);
    if (off)
        c->off = off;
    int *src = off ? realloc(c->src, (size_t)cap * sizeof *src) : NULL;
    if (src)
        c->src = src;
    int *dst = src ? realloc(c->dst, (size_t)cap * sizeof *dst) : NULL;
    if (!dst) {
        c->steps = -1;
        return;
    }
    c->dst = dst;
    if (c->steps == 0)
        c->off[0] = 0;
    for (int i = 0; i < n; i++) {
        c->src[c->n + i] = x[i].src;
        c->dst[c->n + i] = x[i].dst;
    }
    c->n += n;
    c->off[++c->steps] = c->n;
    ev->steps++;
}

void dsim_cost_step(cm_eval *ev, const cm_xfer *x, int n)
{
    int p = ev->p, H = ev->t->hosts;
    if (n == 0)
        return;
    if (ev->capture) {
        cm_capture_step(ev, x, n);
        return;
    }
    if (ev->t->tpu) {
        cm_tpu_step(ev, x, n);
        return;
    }
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
    if (t->tpu &&
        (t->tpu->replicas != p || t->ici.bandwidth_Bps <= 0 || t->on_chip.bandwidth_Bps <= 0))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cost model: TPU %s has %d replicas but the topology %d host(s) x %d "
                        "device(s), or its ICI or on-chip link has no bandwidth",
                        t->tpu->name, t->tpu->replicas, t->hosts, t->devices_per_host);
    cm_eval ev = {.t = t, .p = p};
    dsim_err e = DSIM_OK;
    cm_xfer *x = NULL;
    if (t->tpu) {
        size_t chips = (size_t)t->tpu->chips;
        ev.chip = calloc((size_t)p, sizeof *ev.chip);
        ev.coords = calloc((size_t)p * DSIM_TPU_DIMS, sizeof *ev.coords);
        ev.link_n = calloc(chips * DSIM_TPU_DIMS * 2, sizeof *ev.link_n);
        for (int r = 0; ev.chip && ev.coords && r < p; r++) {
            dsim_tpu_place pl;
            if (dsim_tpu_place_of(t->tpu, r, &pl) != DSIM_OK) {
                e = DSIM_ERR(DSIM_EINVAL, -1, "cost model: %s", dsim_errmsg());
                goto out;
            }
            ev.chip[r] = pl.chip;
            memcpy(&ev.coords[r * DSIM_TPU_DIMS], pl.coords, sizeof pl.coords);
        }
    }
    ev.out_n = calloc((size_t)p, sizeof *ev.out_n);
    ev.in_n = calloc((size_t)p, sizeof *ev.in_n);
    ev.nic_out = calloc((size_t)t->hosts, sizeof *ev.nic_out);
    ev.nic_in = calloc((size_t)t->hosts, sizeof *ev.nic_in);
    ev.arrive = calloc((size_t)p, sizeof *ev.arrive);
    ev.reduce = calloc((size_t)p, sizeof *ev.reduce);
    x = calloc(2 * (size_t)p, sizeof *x);
    if (!ev.out_n || !ev.in_n || !ev.nic_out || !ev.nic_in || !ev.arrive || !ev.reduce || !x ||
        (t->tpu && (!ev.chip || !ev.coords || !ev.link_n))) {
        e = DSIM_ERR(DSIM_ENOMEM, -1, "cost model: out of memory for %d ranks", p);
        goto out;
    }
    size_t count = bytes / esize;
    cost->schedule(&ev, x, count, (double)esize);
    *seconds = ev.total;
    if (steps)
        *steps = ev.steps;
out:
    free(ev.chip);
    free(ev.coords);
    free(ev.link_n);
    free(ev.out_n);
    free(ev.in_n);
    free(ev.nic_out);
    free(ev.nic_in);
    free(ev.arrive);
    free(ev.reduce);
    free(x);
    return e;
}

void dsim_cost_step_times(cm_eval *ev, const cm_xfer *x, int n, int times)
{
    if (ev->capture) {
        for (int k = 0; k < times; k++)
            dsim_cost_step(ev, x, n);
        return;
    }
    double before = ev->total;
    dsim_cost_step(ev, x, n);
    ev->total = before + (ev->total - before) * (double)times;
    ev->steps += times - 1;
}

dsim_err dsim_cost_pattern_of(dsim_algo algo, int p, dsim_cost_pattern *out)
{
    memset(out, 0, sizeof *out);
    const dsim_algo_cost *cost = dsim_algo_cost_of(algo);
    if (!cost || p < 2 || p > (1 << 20)) {
        char names[256];
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cost model: the pattern of algorithm %d over %d ranks: 2 to %d ranks "
                        "and one of %s needed",
                        (int)algo, p, 1 << 20, dsim_algo_list(names, sizeof names, 0, ", ", ", "));
    }
    /* one host of p devices, unit links: the schedules read the shape only */
    dsim_link_model l = {"pattern", "", 0, 1, ""};
    dsim_topology t = {.hosts = 1, .devices_per_host = p, .intra = l, .inter = l};
    cm_eval ev = {.t = &t, .p = p, .capture = out};
    cm_xfer *x = calloc(2 * (size_t)p, sizeof *x);
    if (x) /* 64 elements a rank: every block of every schedule non-empty */
        cost->schedule(&ev, x, 64 * (size_t)p, 4.0);
    free(x);
    if (!x || out->steps < 0) {
        dsim_cost_pattern_free(out);
        return DSIM_ERR(DSIM_ENOMEM, -1,
                        "cost model: the pattern of %s over %d ranks is larger than %d transfers "
                        "or than memory allows",
                        dsim_algo_name(algo), p, CM_CAPTURE_MAX);
    }
    return DSIM_OK;
}

void dsim_cost_pattern_free(dsim_cost_pattern *pt)
{
    free(pt->off);
    free(pt->src);
    free(pt->dst);
    memset(pt, 0, sizeof *pt);
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
