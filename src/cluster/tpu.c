/* TPU pod slices (dsim/tpu.h): the generations' figures with their sources,
 * the accelerator types TPUClusterResolver names, explicit chip shapes, and
 * where each replica sits (host, device, chip, core, torus coordinates).
 *
 * Nothing here runs on a TPU or talks to one: it is the arithmetic of a
 * slice's shape, so that dsim's replicas can be laid out as a TPU's are. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dsim/tpu.h"

/* ---- the generations ----
 *
 * Sources (each figure's, in the entry's source string):
 *   [cloud-v2] https://cloud.google.com/tpu/docs/v2: a pod of 256 chips (512
 *     TensorCores); accelerator types count TensorCores (v2-8 .. v2-512).
 *   [cloud-v3] https://cloud.google.com/tpu/docs/v3: 2 TensorCores per chip,
 *     123 TFLOP/s bf16 per chip, 32 GiB HBM2 at 900 GB/s, a pod of 1024
 *     chips as a 2-D torus.
 *   [cloud-v4] https://cloud.google.com/tpu/docs/v4: 2 TensorCores per chip,
 *     275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s, a pod of 4096 chips, a 3-D
 *     torus on slices whose dimensions are multiples of 4.
 *   [cloud-v5e] https://cloud.google.com/tpu/docs/v5e: 1 TensorCore per chip,
 *     197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, 4 ICI ports and 8 chips per
 *     host, a pod of 256 chips as a 2-D torus.
 *   [jouppi20] N. Jouppi et al., "A Domain-Specific Supercomputer for
 *     Training Deep Neural Networks", CACM 63(7), 2020: TPUv2 46 TFLOP/s
 *     bf16, 16 GiB HBM at 700 GB/s, 4 ICI links of 496 Gbit/s per chip.
 *   [scaling] J. Austin et al., "How to Scale Your Model" (Google DeepMind,
 *     2025), https://jax-ml.github.io/scaling-book/tpus/: ICI bandwidth per
 *     link one way 1.0e11 B/s (v3), 4.5e10 (v4p, v5e); host sizes 2x2x1
 *     (v4p) and 4x2 (v5e); wrap-around on a full 16 axis (v5e) or an axis
 *     that is a multiple of 4 (v*p); and ~1 us per ICI hop
 *     (https://jax-ml.github.io/scaling-book/sharding/).
 *   [tf] tensorflow/python/tpu/topology.py (mesh_shape [x, y, z, cores],
 *     device_coordinates[task][device]) and tpu_strategy.py (devices by task
 *     then ordinal; one input pipeline per host). */
static const dsim_tpu_gen_info tpu_gens[DSIM_TPU_GEN_COUNT] = {
    [DSIM_TPU_V2] =
        {
            .gen = DSIM_TPU_V2,
            .name = "v2",
            .what = "TPU v2: 2 TensorCores per chip, each a replica; 2-D ICI",
            .ndims = 2,
            .cores_per_chip = 2,
            .replicas_per_chip = 2,
            .chips_per_host = 4,
            .host_dims = {2, 2, 1},
            .pod_dims = {16, 16, 1},
            .name_counts_cores = true,
            .peak_bf16_flops = 46e12,
            .hbm_bytes = 16.0 * (1 << 30),
            .hbm_Bps = 700e9,
            .ici_links = 4,
            .ici_link_Bps = 496e9 / 8,
            .ici_latency_s = 1e-6,
            .wrap_rule = "a dimension wraps only when it spans the pod (16)",
            .source = "cloud.google.com/tpu/docs/v2 (pod of 256 chips, v2-8..v2-512 count "
                      "TensorCores); Jouppi et al., CACM 63(7) 2020 (46 TFLOP/s bf16, 16 GiB "
                      "HBM at 700 GB/s, 4 ICI links of 496 Gbit/s, taken one way); ~1 us a hop "
                      "(How to Scale Your Model, 2025)",
        },
    [DSIM_TPU_V3] =
        {
            .gen = DSIM_TPU_V3,
            .name = "v3",
            .what = "TPU v3: 2 TensorCores per chip, each a replica; 2-D ICI",
            .ndims = 2,
            .cores_per_chip = 2,
            .replicas_per_chip = 2,
            .chips_per_host = 4,
            .host_dims = {2, 2, 1},
            .pod_dims = {32, 32, 1},
            .name_counts_cores = true,
            .peak_bf16_flops = 123e12,
            .hbm_bytes = 32.0 * (1 << 30),
            .hbm_Bps = 900e9,
            .ici_links = 4,
            .ici_link_Bps = 1.0e11,
            .ici_latency_s = 1e-6,
            .wrap_rule = "a dimension wraps only when it spans the pod (32)",
            .source = "cloud.google.com/tpu/docs/v3 (2 TensorCores/chip, 123 TFLOP/s bf16, 32 "
                      "GiB HBM2 at 900 GB/s, 1024-chip 2-D torus pod); ICI 1.0e11 B/s per "
                      "link one way and ~1 us a hop (How to Scale Your Model, 2025)",
        },
    [DSIM_TPU_V4] =
        {
            .gen = DSIM_TPU_V4,
            .name = "v4",
            .what = "TPU v4: 2 TensorCores per chip as one megacore replica; 3-D ICI",
            .ndims = 3,
            .cores_per_chip = 2,
            .replicas_per_chip = 1,
            .chips_per_host = 4,
            .host_dims = {2, 2, 1},
            .pod_dims = {16, 16, 16},
            .name_counts_cores = true,
            .peak_bf16_flops = 275e12,
            .hbm_bytes = 32.0 * (1 << 30),
            .hbm_Bps = 1200e9,
            .ici_links = 6,
            .ici_link_Bps = 4.5e10,
            .ici_latency_s = 1e-6,
            .wrap_rule = "a dimension wraps when it is a multiple of 4",
            .source = "cloud.google.com/tpu/docs/v4 (2 TensorCores/chip, 275 TFLOP/s bf16, 32 "
                      "GiB HBM2 at 1200 GB/s, 4096-chip pod, 3-D torus on dimensions that are "
                      "multiples of 4); 2x2x1 chips per host, ICI 4.5e10 B/s per link one way, "
                      "~1 us a hop (How to Scale Your Model, 2025)",
        },
    [DSIM_TPU_V5E] =
        {
            .gen = DSIM_TPU_V5E,
            .name = "v5e",
            .what = "TPU v5e: 1 TensorCore per chip; 2-D ICI",
            .ndims = 2,
            .cores_per_chip = 1,
            .replicas_per_chip = 1,
            .chips_per_host = 8,
            .host_dims = {4, 2, 1},
            .pod_dims = {16, 16, 1},
            .name_counts_cores = false,
            .peak_bf16_flops = 197e12,
            .hbm_bytes = 16e9,
            .hbm_Bps = 819e9,
            .ici_links = 4,
            .ici_link_Bps = 4.5e10,
            .ici_latency_s = 1e-6,
            .wrap_rule = "a dimension wraps only when it spans the pod (16)",
            .source = "cloud.google.com/tpu/docs/v5e (1 TensorCore/chip, 197 TFLOP/s bf16, 16 GB "
                      "HBM2 at 819 GB/s, 4 ICI ports, 8 chips per host, 256-chip 2-D torus "
                      "pod); 4x2 host, ICI 4.5e10 B/s per link one way, ~1 us a hop (How to "
                      "Scale Your Model, 2025)",
        },
};

/* The accelerator types of each generation and their default chip shapes
 * (Cloud TPU's tables of slices). */
typedef struct tpu_slice {
    dsim_tpu_gen gen;
    int count; /* the N of vX-N */
    int dims[DSIM_TPU_DIMS];
} tpu_slice;

static const tpu_slice tpu_slices[] = {
    {DSIM_TPU_V2, 8, {2, 2, 1}},      {DSIM_TPU_V2, 32, {4, 4, 1}},
    {DSIM_TPU_V2, 128, {8, 8, 1}},    {DSIM_TPU_V2, 256, {8, 16, 1}},
    {DSIM_TPU_V2, 512, {16, 16, 1}},  {DSIM_TPU_V3, 8, {2, 2, 1}},
    {DSIM_TPU_V3, 32, {4, 4, 1}},     {DSIM_TPU_V3, 64, {4, 8, 1}},
    {DSIM_TPU_V3, 128, {8, 8, 1}},    {DSIM_TPU_V3, 256, {8, 16, 1}},
    {DSIM_TPU_V3, 512, {16, 16, 1}},  {DSIM_TPU_V3, 1024, {16, 32, 1}},
    {DSIM_TPU_V3, 2048, {32, 32, 1}}, {DSIM_TPU_V4, 8, {2, 2, 1}},
    {DSIM_TPU_V4, 16, {2, 2, 2}},     {DSIM_TPU_V4, 32, {2, 2, 4}},
    {DSIM_TPU_V4, 64, {2, 4, 4}},     {DSIM_TPU_V4, 128, {4, 4, 4}},
    {DSIM_TPU_V4, 256, {4, 4, 8}},    {DSIM_TPU_V4, 512, {4, 8, 8}},
    {DSIM_TPU_V4, 1024, {8, 8, 8}},   {DSIM_TPU_V4, 1536, {8, 8, 12}},
    {DSIM_TPU_V4, 2048, {8, 8, 16}},  {DSIM_TPU_V4, 4096, {8, 16, 16}},
    {DSIM_TPU_V5E, 1, {1, 1, 1}},     {DSIM_TPU_V5E, 4, {2, 2, 1}},
    {DSIM_TPU_V5E, 8, {2, 4, 1}},     {DSIM_TPU_V5E, 16, {4, 4, 1}},
    {DSIM_TPU_V5E, 32, {4, 8, 1}},    {DSIM_TPU_V5E, 64, {8, 8, 1}},
    {DSIM_TPU_V5E, 128, {8, 16, 1}},  {DSIM_TPU_V5E, 256, {16, 16, 1}},
};

#define TPU_N_SLICES (sizeof tpu_slices / sizeof tpu_slices[0])

const dsim_tpu_gen_info *dsim_tpu_gen_get(dsim_tpu_gen g)
{
    if ((int)g < 0 || g >= DSIM_TPU_GEN_COUNT)
        return NULL;
    return &tpu_gens[g];
}

dsim_err dsim_tpu_gen_parse(const char *s, dsim_tpu_gen *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tpu_gen_parse: NULL argument");
    for (int g = 0; g < DSIM_TPU_GEN_COUNT; g++) {
        if (strcasecmp(s, tpu_gens[g].name) == 0) {
            *out = (dsim_tpu_gen)g;
            return DSIM_OK;
        }
    }
    if (strcasecmp(s, "v5litepod") == 0) {
        *out = DSIM_TPU_V5E;
        return DSIM_OK;
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "TPU generation \"%s\" is not one dsim knows (accepted: v2, v3, v4, v5e)", s);
}

const char *dsim_tpu_names(dsim_tpu_gen gen, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return "";
    buf[0] = '\0';
    size_t o = 0;
    for (size_t i = 0; i < TPU_N_SLICES && o < cap; i++) {
        if (gen != DSIM_TPU_GEN_COUNT && tpu_slices[i].gen != gen)
            continue;
        int w = snprintf(buf + o, cap - o, "%s%s-%d", o ? ", " : "",
                         tpu_gens[tpu_slices[i].gen].name, tpu_slices[i].count);
        if (w < 0)
            break;
        o += (size_t)w;
    }
    return buf;
}

/* The name's count for a slice of `chips` chips of generation g. */
static int tpu_count(const dsim_tpu_gen_info *gi, int chips)
{
    return gi->name_counts_cores ? chips * gi->cores_per_chip : chips;
}

/* Fills t from a generation and chip dims already checked to fit the pod. */
static dsim_err tpu_fill(dsim_tpu_gen g, const int *dims, dsim_tpu_topology *t)
{
    const dsim_tpu_gen_info *gi = &tpu_gens[g];
    memset(t, 0, sizeof *t);
    t->gen = g;
    t->ndims = gi->ndims;
    t->chips = 1;
    for (int d = 0; d < DSIM_TPU_DIMS; d++) {
        t->dims[d] = d < gi->ndims ? dims[d] : 1;
        t->chips *= t->dims[d];
    }
    char shape[32];
    if (gi->ndims == 3)
        snprintf(shape, sizeof shape, "%dx%dx%d", t->dims[0], t->dims[1], t->dims[2]);
    else
        snprintf(shape, sizeof shape, "%dx%d", t->dims[0], t->dims[1]);
    if (t->chips <= gi->chips_per_host) {
        /* a single-host slice: the host drives all of it */
        for (int d = 0; d < DSIM_TPU_DIMS; d++)
            t->host_dims[d] = t->dims[d];
    } else {
        for (int d = 0; d < DSIM_TPU_DIMS; d++) {
            if (t->dims[d] % gi->host_dims[d] != 0) {
                char block[32];
                if (gi->ndims == 3)
                    snprintf(block, sizeof block, "%dx%dx%d", gi->host_dims[0], gi->host_dims[1],
                             gi->host_dims[2]);
                else
                    snprintf(block, sizeof block, "%dx%d", gi->host_dims[0], gi->host_dims[1]);
                return DSIM_ERR(DSIM_EINVAL, -1,
                                "TPU %s %s: a slice of more than one host is made of %s-chip "
                                "host blocks (%d chips each), and dimension %c (%d) is not a "
                                "multiple of %d (accepted: a multiple of the block in every "
                                "dimension, or at most %d chips on one host)",
                                gi->name, shape, block, gi->chips_per_host, "xyz"[d], t -> dims[d],
                                gi -> host_dims[d], gi -> chips_per_host);
            }
            t->host_dims[d] = gi->host_dims[d];
        }
    }
    t->chips_per_host = t->host_dims[0] * t->host_dims[1] * t->host_dims[2];
    t->hosts = t->chips / t->chips_per_host;
    t->replicas_per_chip = gi->replicas_per_chip;
    t->cores_per_replica = gi->cores_per_chip / gi->replicas_per_chip;
    t->replicas_per_host = t->chips_per_host * t->replicas_per_chip;
    t->replicas = t->hosts * t->replicas_per_host;
    for (int d = 0; d < DSIM_TPU_DIMS; d++) {
        if (d >= gi->ndims || t->dims[d] < 2)
            t->wrap[d] = false;
        else if (g == DSIM_TPU_V4)
            t->wrap[d] = t->dims[d] % 4 == 0;
        else
            t->wrap[d] = t->dims[d] == gi->pod_dims[d];
    }
    snprintf(t->name, sizeof t->name, "%s-%d", gi->name, tpu_count(gi, t->chips));
    return DSIM_OK;
}

dsim_err dsim_tpu_topology_parse(const char *name, dsim_tpu_topology *out)
{
    if (!name || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tpu_topology_parse: NULL argument");
    memset(out, 0, sizeof *out);
    char all[DSIM_TPU_NAMES_MAX];
    const char *dash = strrchr(name, '-');
    char gen_s[16];
    size_t glen = dash ? (size_t)(dash - name) : 0;
    if (!dash || glen == 0 || glen >= sizeof gen_s)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TPU \"%s\" is not an accelerator type such as v3-32 (accepted: %s; or "
                        "a generation with an explicit chip shape)",
                        name, dsim_tpu_names(DSIM_TPU_GEN_COUNT, all, sizeof all));
    memcpy(gen_s, name, glen);
    gen_s[glen] = '\0';
    dsim_tpu_gen g;
    if (dsim_tpu_gen_parse(gen_s, &g) != DSIM_OK)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TPU \"%s\": \"%s\" is not a TPU generation dsim knows (accepted "
                        "generations: v2, v3, v4, v5e; slices: %s)",
                        name, gen_s, dsim_tpu_names(DSIM_TPU_GEN_COUNT, all, sizeof all));
    const char *num = dash + 1;
    char *end = NULL;
    long count = *num && isdigit((unsigned char)*num) ? strtol(num, &end, 10) : -1;
    for (size_t i = 0; count > 0 && end && !*end && i < TPU_N_SLICES; i++)
        if (tpu_slices[i].gen == g && tpu_slices[i].count == count)
            return tpu_fill(g, tpu_slices[i].dims, out);
    const dsim_tpu_gen_info *gi = &tpu_gens[g];
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "TPU \"%s\": no %s slice has %s %s (accepted: %s; or give the chip shape: "
                    "tpu: %s with tpu_topology: %s)",
                    name, gi->name, num, gi->name_counts_cores ? "TensorCores" : "chips",
                    dsim_tpu_names(g, all, sizeof all), gi->name, gi->ndims == 3 ? "4x4x2" : "4x4");
}

dsim_err dsim_tpu_topology_shape(dsim_tpu_gen gen, const char *shape, dsim_tpu_topology *out)
{
    if (!shape || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tpu_topology_shape: NULL argument");
    memset(out, 0, sizeof *out);
    const dsim_tpu_gen_info *gi = dsim_tpu_gen_get(gen);
    if (!gi)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tpu_topology_shape: %d is not a dsim_tpu_gen",
                        (int)gen);
    const char *example = gi->ndims == 3 ? "4x4x2" : "4x4";
    int dims[DSIM_TPU_DIMS] = {1, 1, 1}, n = 0;
    const char *p = shape;
    while (*p) {
        if (n == gi->ndims || !isdigit((unsigned char)*p))
            break;
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (v < 1 || v > 1 << 16)
            break;
        dims[n++] = (int)v;
        p = end;
        if (*p == 'x' || *p == 'X')
            p++;
        else
            break;
    }
    if (*p || n != gi->ndims)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TPU %s topology \"%s\" is not %d chip dimensions such as %s (accepted: "
                        "%s, each >= 1)",
                        gi->name, shape, gi->ndims, example,
                        gi->ndims == 3 ? "XxYxZ for v4" : "XxY for v2, v3 and v5e");
    for (int d = 0; d < gi->ndims; d++)
        if (dims[d] > gi->pod_dims[d])
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "TPU %s topology \"%s\": dimension %c is %d chips, more than the "
                            "pod's %d (a %s pod is %dx%d%s)",
                            gi->name, shape, "xyz"[d], dims[d], gi -> pod_dims[d], gi -> name,
                            gi -> pod_dims[0], gi -> pod_dims[1], gi -> ndims == 3 ? "x16" : "");
    return tpu_fill(gen, dims, out);
}

dsim_err dsim_tpu_place_of(const dsim_tpu_topology *t, int r, dsim_tpu_place *out)
{
    if (!t || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_tpu_place_of: NULL argument");
    if (r < 0 || r >= t->replicas)
        return DSIM_ERR(DSIM_EINVAL, -1, "TPU %s: replica %d (accepted: 0..%d)", t->name, r,
                        t->replicas - 1);
    memset(out, 0, sizeof *out);
    out->replica = r;
    out->host = r / t->replicas_per_host;
    out->device = r % t->replicas_per_host;
    out->core = out->device % t->replicas_per_chip;
    int local = out->device / t->replicas_per_chip;
    /* the host's block: hosts x fastest over the grid of blocks */
    int bx = t->dims[0] / t->host_dims[0], by = t->dims[1] / t->host_dims[1];
    int hb[DSIM_TPU_DIMS] = {out->host % bx, (out->host / bx) % by, out->host / (bx * by)};
    int lc[DSIM_TPU_DIMS] = {local % t->host_dims[0], (local / t->host_dims[0]) % t->host_dims[1],
                             local / (t->host_dims[0] * t->host_dims[1])};
    for (int d = 0; d < DSIM_TPU_DIMS; d++)
        out->coords[d] = hb[d] * t->host_dims[d] + lc[d];
    out->chip = out->coords[0] + t->dims[0] * (out->coords[1] + t->dims[1] * out->coords[2]);
    return DSIM_OK;
}

int dsim_tpu_replica_at(const dsim_tpu_topology *t, const int *c, int core)
{
    if (!t || !c || core < 0 || core >= t->replicas_per_chip)
        return -1;
    for (int d = 0; d < DSIM_TPU_DIMS; d++)
        if (c[d] < 0 || c[d] >= t->dims[d])
            return -1;
    int hb[DSIM_TPU_DIMS], lc[DSIM_TPU_DIMS];
    for (int d = 0; d < DSIM_TPU_DIMS; d++) {
        hb[d] = c[d] / t->host_dims[d];
        lc[d] = c[d] % t->host_dims[d];
    }
    int bx = t->dims[0] / t->host_dims[0], by = t->dims[1] / t->host_dims[1];
    int host = hb[0] + bx * (hb[1] + by * hb[2]);
    int local = lc[0] + t->host_dims[0] * (lc[1] + t->host_dims[1] * lc[2]);
    return host * t->replicas_per_host + local * t->replicas_per_chip + core;
}

void dsim_tpu_torus(const dsim_tpu_topology *t, int *dims, int *ndims, int *rank_at)
{
    int n = 0;
    if (t->replicas_per_chip > 1)
        dims[n++] = t->replicas_per_chip;
    for (int d = 0; d < DSIM_TPU_DIMS; d++)
        if (t->dims[d] > 1)
            dims[n++] = t->dims[d];
    *ndims = n;
    if (!rank_at)
        return;
    int rpc = t->replicas_per_chip;
    for (int place = 0; place < t->replicas; place++) {
        int core = place % rpc, chip = place / rpc;
        int c[DSIM_TPU_DIMS] = {chip % t->dims[0], (chip / t->dims[0]) % t->dims[1],
                                chip / (t->dims[0] * t->dims[1])};
        rank_at[place] = dsim_tpu_replica_at(t, c, core);
    }
}

int dsim_tpu_hops(const dsim_tpu_topology *t, const int *a, const int *b)
{
    int hops = 0;
    for (int d = 0; d < DSIM_TPU_DIMS; d++) {
        int k = a[d] > b[d] ? a[d] - b[d] : b[d] - a[d];
        if (t->wrap[d] && t->dims[d] - k < k)
            k = t->dims[d] - k;
        hops += k;
    }
    return hops;
}
