/* The all-reduce algorithms: one table, one entry per dsim_algo, with
 * everything src/ knows about each (its name, its one-line summary, its
 * step count and the function that runs it). dsim_allreduce dispatches
 * through it; dsim_algo_name, dsim_algo_parse, dsim_algo_summary and
 * dsim_algo_list read it, and through them the scenario parser, `dsim list
 * algorithms`, `dsim whatif`, `dsim bench` and `dsim calibrate`. What an
 * algorithm costs is not the library's business: sim/model/algo_cost.c has
 * the cost model's side, keyed by the same enum and checked by the compiler
 * to cover every algorithm.
 *
 * Adding an algorithm: its dsim_algo value (last before DSIM_ALGO_COUNT,
 * dsim/comm.h), its file here (steps and allreduce, declared in
 * coll_int.h, listed in meson.build), its entry below with its case in
 * dsim_coll_algo_get, and its cost in sim/model/algo_cost.c. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "coll_int.h"

static const dsim_coll_algo coll_auto = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_AUTO,
    .name = "auto",
    .summary = "the decision function picks by message size and rank count",
};

static const dsim_coll_algo coll_ring = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_RING,
    .name = "ring",
    .summary = "reduce-scatter then all-gather around a ring (bandwidth-optimal)",
    .steps = dsim_coll_ring_allreduce_steps,
    .allreduce = dsim_coll_ring_allreduce,
};

static const dsim_coll_algo coll_rhd = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_RHD,
    .name = "rhd",
    .summary = "Rabenseifner recursive halving/doubling (any rank count)",
    .steps = dsim_coll_rhd_allreduce_steps,
    .allreduce = dsim_coll_rhd_allreduce,
};

static const dsim_coll_algo coll_tree = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_TREE,
    .name = "tree",
    .summary = "binomial-tree reduce then binomial broadcast (latency-optimal)",
    .steps = dsim_coll_tree_allreduce_steps,
    .allreduce = dsim_coll_tree_allreduce,
};

static const dsim_coll_algo coll_r2o = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_REDUCE_TO_ONE,
    .name = "reduce_to_one",
    .summary = "TF's ReductionToOneDevice: gather to rank 0, then broadcast",
    .steps = dsim_coll_r2o_allreduce_steps,
    .allreduce = dsim_coll_r2o_allreduce,
};

static const dsim_coll_algo coll_hier = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_HIERARCHICAL,
    .name = "hierarchical",
    .summary = "reduce-scatter in each host, all-reduce across hosts, all-gather (two levels)",
    .steps = dsim_coll_hier_allreduce_steps,
    .allreduce = dsim_coll_hier_allreduce,
};

/* The torus's steps depend on its ring sizes only through the rank count. */
static int coll_torus_steps(dsim_comm *c)
{
    return dsim_coll_torus_allreduce_steps(c->size);
}

static const dsim_coll_algo coll_torus = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_TORUS,
    .name = "torus",
    .summary = "reduce-scatter then all-gather along each torus dimension, bidirectional "
               "rings (XLA's TPU all-reduce)",
    .steps = coll_torus_steps,
    .allreduce = dsim_coll_torus_allreduce,
};

static const dsim_coll_algo coll_rd = {
    .size = sizeof(dsim_coll_algo),
    .algo = DSIM_ALGO_RECURSIVE_DOUBLING,
    .name = "recursive_doubling",
    .summary = "whole buffers exchanged at distance 1, 2, 4, ... (fewest steps: small messages)",
    .steps = dsim_coll_rd_allreduce_steps,
    .allreduce = dsim_coll_rd_allreduce,
};

const dsim_coll_algo *dsim_coll_algo_get(dsim_algo a)
{
    /* No default: a dsim_algo without its entry here does not compile
     * (-Wswitch, -Werror). tests/coll/test_coll_misc.c checks each entry. */
    switch (a) {
    case DSIM_ALGO_AUTO:
        return &coll_auto;
    case DSIM_ALGO_RING:
        return &coll_ring;
    case DSIM_ALGO_RHD:
        return &coll_rhd;
    case DSIM_ALGO_TREE:
        return &coll_tree;
    case DSIM_ALGO_REDUCE_TO_ONE:
        return &coll_r2o;
    case DSIM_ALGO_HIERARCHICAL:
        return &coll_hier;
    case DSIM_ALGO_TORUS:
        return &coll_torus;
    case DSIM_ALGO_RECURSIVE_DOUBLING:
        return &coll_rd;
    case DSIM_ALGO_COUNT:
        break;
    }
    return NULL;
}

const char *dsim_algo_name(dsim_algo a)
{
    const dsim_coll_algo *al = dsim_coll_algo_get(a);
    return al ? al->name : "unknown";
}

const char *dsim_algo_summary(dsim_algo a)
{
    const dsim_coll_algo *al = dsim_coll_algo_get(a);
    return al ? al->summary : "";
}

const char *dsim_algo_list(char *buf, size_t cap, int with_auto, const char *sep, const char *last)
{
    if (!buf || cap == 0)
        return "";
    buf[0] = '\0';
    size_t o = 0;
    int first = with_auto ? DSIM_ALGO_AUTO : DSIM_ALGO_AUTO + 1;
    for (int a = first; a < DSIM_ALGO_COUNT && o < cap; a++) {
        const char *s = a == first ? "" : a == DSIM_ALGO_COUNT - 1 ? last : sep;
        int w = snprintf(buf + o, cap - o, "%s%s", s ? s : ", ",
                         dsim_coll_algo_get((dsim_algo)a)->name);
        if (w < 0)
            break;
        o += (size_t)w;
    }
    return buf;
}

const char *dsim_coll_algo_enum_name(dsim_algo a, char *buf, size_t cap)
{
    int w = snprintf(buf, cap, "DSIM_ALGO_%s", dsim_algo_name(a));
    for (int i = 10; w > 0 && i < w && (size_t)i < cap; i++)
        buf[i] = (char)toupper((unsigned char)buf[i]);
    return buf;
}

dsim_err dsim_algo_parse(const char *s, dsim_algo *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_algo_parse: %s is NULL", !s ? "the name" : "out");
    for (int a = 0; a < DSIM_ALGO_COUNT; a++) {
        if (strcasecmp(s, dsim_coll_algo_get((dsim_algo)a)->name) == 0) {
            *out = (dsim_algo)a;
            return DSIM_OK;
        }
    }
    char names[256];
    return DSIM_ERR(DSIM_EINVAL, -1, "unknown allreduce algorithm \"%s\"; use one of %s", s,
                    dsim_algo_list(names, sizeof names, 1, ", ", ", "));
}
