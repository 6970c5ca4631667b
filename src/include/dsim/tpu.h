/* TPU pod slices, as TensorFlow sees them: hosts, replicas, torus coordinates.
 *
 * There is no TPU here, and dsim does not pretend to run one. What this
 * header gives is a slice's shape -- which host drives which chip, which
 * TensorCore is which replica, where each chip sits on the inter-chip
 * interconnect (ICI) -- so that a strategy's logic runs on a TPU's shape,
 * with a TPU's rules, as ordinary dsim replicas over dsim's transport, and
 * the cost model prices it on a TPU's network. Every replica is a dsim
 * worker on this machine's CPU.
 *
 * What TensorFlow does, and what dsim mirrors:
 *   - TPUClusterResolver names a slice by its accelerator type ("v3-32") and
 *     hands TPUStrategy its TPU system: tf.tpu.experimental.Topology
 *     (tensorflow/python/tpu/topology.py) has mesh_shape [x, y, z, cores per
 *     chip] and device_coordinates[task][device] = (x, y, z, core);
 *   - TPUStrategy's replicas are the TPU devices sorted by task (host), then
 *     by device ordinal: replica = host * replicas_per_host + device, which
 *     is dsim's replica = worker * devices_per_host + device;
 *   - each host runs one input pipeline for its own devices (InputContext's
 *     num_input_pipelines is the number of hosts).
 *
 * The generations (figures per chip; sources in dsim_tpu_gen_info.source,
 * printed by `dsim cluster --tpu` and `dsim whatif --presets`):
 *
 *   gen  TensorCores  replicas  chips/host  torus  pod       name counts
 *        per chip     per chip  (block)
 *   v2   2            2         4 (2x2)     2-D    16x16     TensorCores
 *   v3   2            2         4 (2x2)     2-D    32x32     TensorCores
 *   v4   2 (megacore) 1         4 (2x2x1)   3-D    16x16x16  TensorCores
 *   v5e  1            1         8 (4x2)     2-D    16x16     chips
 *
 * On v2 and v3 every TensorCore is a replica (TF shows 8 TPU devices per
 * host); v4 runs its two TensorCores as one "megacore" device per chip (4
 * devices per host), so a v4 replica is a chip; a v5e chip has one core.
 *
 * Wrap-around links (what makes a dimension a ring rather than a line):
 *   - v2, v3, v5e: only along a dimension that spans the whole pod (v3-2048
 *     is a 32x32 torus; v3-32, 4x4 chips, is a 4x4 mesh). dsim's reading of
 *     the pods' 2-D torus and of "a functioning ring ... when we have a full
 *     16 axis" (How to Scale Your Model, 2025) for v5e.
 *   - v4: along every dimension that is a multiple of 4 (the 4x4x4 cube and
 *     its multiples are tori through the optical switches; 2x2x1 to 2x4x4
 *     are meshes in their short dimensions), Cloud TPU's v4 documentation.
 * The torus all-reduce runs its rings over a mesh dimension too (the ring's
 * closing hop crosses the line back); the cost model charges the hops.
 *
 * Placement: hosts hold blocks of chips (host_dims), numbered x fastest over
 * the slice; within a host, chips x fastest in its block, then device d is
 * core d % replicas_per_chip of chip d / replicas_per_chip of the block.
 * TensorFlow reads device_coordinates from the TPU system itself; this is
 * dsim's layout, the same rule for every slice, documented in docs/tpu.md. */
#ifndef DSIM_TPU_H
#define DSIM_TPU_H

#include <stdbool.h>
#include <stddef.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_tpu_gen {
    DSIM_TPU_V2 = 0,
    DSIM_TPU_V3,
    DSIM_TPU_V4,
    DSIM_TPU_V5E,
    DSIM_TPU_GEN_COUNT
} dsim_tpu_gen;

/* The precision policy TensorFlow's TPU jobs default to (Keras'
 * mixed_bfloat16: bfloat16 compute, float32 variables), and dsim's TPU
 * scenarios with them unless they name another (scen_tpu_policy,
 * sim/scenario/parse_tpu.c). */
#define DSIM_TPU_DEFAULT_POLICY "mixed_bfloat16"

/* The chip dimensions of a slice: x, y and z (z is 1 on a 2-D torus). */
#define DSIM_TPU_DIMS 3

/* What one generation is, per chip, with where each figure comes from. */
typedef struct dsim_tpu_gen_info {
    dsim_tpu_gen gen;
    const char *name;             /* "v2", "v3", "v4", "v5e" */
    const char *what;             /* one line */
    int ndims;                    /* 2 or 3: the ICI's dimensions */
    int cores_per_chip;           /* TensorCores on a chip */
    int replicas_per_chip;        /* TF devices (replicas) per chip: 2, or 1 (megacore, one core) */
    int chips_per_host;           /* on a host of a multi-host slice */
    int host_dims[DSIM_TPU_DIMS]; /* the block of chips one host drives */
    int pod_dims[DSIM_TPU_DIMS];  /* the whole pod */
    bool name_counts_cores;       /* vN-K: K TensorCores (v2, v3, v4); else K chips (v5e) */
    double peak_bf16_flops;       /* per chip, FLOP/s */
    double hbm_bytes;             /* per chip */
    double hbm_Bps;               /* per chip, bytes/s */
    int ici_links;                /* ICI ports per chip */
    double ici_link_Bps;          /* one link, one direction, bytes/s */
    double ici_latency_s;         /* one hop */
    const char *wrap_rule;        /* when a dimension has its wrap-around link */
    const char *source;           /* where the figures come from */
} dsim_tpu_gen_info;

/* The generation's entry; NULL when g is not a dsim_tpu_gen. */
DSIM_API const dsim_tpu_gen_info *dsim_tpu_gen_get(dsim_tpu_gen g);
/* "v2", "v3", "v4", "v5e" (also "v5litepod"; any case) into *out;
 * DSIM_EINVAL naming the accepted ones. */
DSIM_API dsim_err dsim_tpu_gen_parse(const char *s, dsim_tpu_gen *out);

/* A resolved slice. A plain value (no pointers): copy it freely. */
typedef struct dsim_tpu_topology {
    dsim_tpu_gen gen;
    char name[40];            /* "v3-32", or "v4 4x4x2" for an explicit shape */
    int ndims;                /* 2 or 3 */
    int dims[DSIM_TPU_DIMS];  /* chips along x, y, z (z = 1 when ndims is 2) */
    bool wrap[DSIM_TPU_DIMS]; /* the dimension has its wrap-around link */
    int chips;
    int hosts;
    int host_dims[DSIM_TPU_DIMS]; /* the chips of one host, as a block */
    int chips_per_host;
    int replicas_per_chip; /* 1 or 2 */
    int cores_per_replica; /* TensorCores behind one replica: 1, or 2 (v4 megacore) */
    int replicas_per_host; /* dsim's devices_per_host */
    int replicas;          /* hosts x replicas_per_host */
} dsim_tpu_topology;

/* The longest accepted list of slice names, for messages. */
#define DSIM_TPU_NAMES_MAX 640

/* Resolves an accelerator type: "v2-8", "v3-32", "v4-128", "v5e-16" (also
 * "v5litepod-16"), as TPUClusterResolver's accelerator_type names it. An
 * unknown name is DSIM_EINVAL with the accepted names of that generation
 * (or the generations) in the message. */
DSIM_API dsim_err dsim_tpu_topology_parse(const char *name, dsim_tpu_topology *out);

/* A slice of generation gen with an explicit chip shape "4x4x2" (v4: three
 * dimensions; v2, v3, v5e: two), as a topology flag would give it. Refused
 * (DSIM_EINVAL, naming the value and the rule): a dimension below 1, a shape
 * larger than the pod, or hosts that cannot each hold a whole block. */
DSIM_API dsim_err dsim_tpu_topology_shape(dsim_tpu_gen gen, const char *shape,
                                          dsim_tpu_topology *out);

/* Writes the accepted slice names of gen (all generations when gen is
 * DSIM_TPU_GEN_COUNT), comma-separated, into buf; returns buf. */
DSIM_API const char *dsim_tpu_names(dsim_tpu_gen gen, char *buf, size_t cap);

/* Where replica r of a slice is. */
typedef struct dsim_tpu_place {
    int replica;
    int host;   /* TF task */
    int device; /* TPU device ordinal on its host (dsim's device) */
    int chip;   /* chip index over the slice: x + X (y + Y z) */
    int core;   /* 0 .. replicas_per_chip - 1 (the TensorCore, or 0 for a megacore) */
    int coords[DSIM_TPU_DIMS]; /* the chip's (x, y, z) */
} dsim_tpu_place;

/* DSIM_EINVAL when r is not a replica of t. */
DSIM_API dsim_err dsim_tpu_place_of(const dsim_tpu_topology *t, int r, dsim_tpu_place *out);

/* The replica on chip coords (x, y, z), core `core`; -1 when outside. */
DSIM_API int dsim_tpu_replica_at(const dsim_tpu_topology *t, const int *coords, int core);

/* The most dimensions of the replicas' torus: the cores of a chip, x, y, z. */
#define DSIM_TPU_TORUS_DIMS 4

/* The torus the replicas form, for the torus all-reduce (dsim_comm_cfg's
 * torus_*): the dimensions of more than one replica, the cores of a chip
 * first (on-chip), then x, y, z; *ndims of them (0 for a single replica),
 * dims with room for DSIM_TPU_TORUS_DIMS.
 * rank_at (t->replicas entries, may be NULL) gets the replica at each
 * place, place = c0 + d0 (c1 + d1 (c2 ...)). */
DSIM_API void dsim_tpu_torus(const dsim_tpu_topology *t, int *dims, int *ndims, int *rank_at);

/* Hops between two chips over the ICI (dimension by dimension, the short
 * way round where a dimension wraps). */
DSIM_API int dsim_tpu_hops(const dsim_tpu_topology *t, const int *a, const int *b);

#ifdef __cplusplus
}
#endif
#endif
