/* libFuzzer target: the TF_CONFIG parser (src/cluster). Every input must
 * resolve or be refused with DSIM_EINVAL and a message naming TF_CONFIG;
 * one that resolves must keep its promises: the derived fields agree with
 * the jobs, every replica maps to a (worker, device) and back, and the
 * TF_CONFIG dsim writes for the task (dsim_cluster_to_tf_config) parses
 * back to the same cluster.
 *
 * The first byte picks devices_per_host (1..4); the rest is the text.
 * Seeds: tests/fuzz/seeds/tf_config. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_REQUIRE(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_tf_config: %s failed: %s\n", #cond, dsim_errmsg());              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int fz_same(const dsim_cluster *a, const dsim_cluster *b)
{
    for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++) {
        if (a->jobs[t].ntasks != b->jobs[t].ntasks)
            return 0;
        for (int i = 0; i < a->jobs[t].ntasks; i++)
            if (strcmp(a->jobs[t].addrs[i], b->jobs[t].addrs[i]) != 0)
                return 0;
    }
    if (!a->rpc_layer != !b->rpc_layer || (a->rpc_layer && strcmp(a->rpc_layer, b->rpc_layer)))
        return 0;
    return a->task_type == b->task_type && a->task_index == b->task_index &&
           a->is_chief == b->is_chief && a->worker_id == b->worker_id &&
           a->num_workers == b->num_workers && a->num_replicas == b->num_replicas;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int dph = 1 + data[0] % 4;
    char *text = malloc(size);
    if (!text)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    dsim_cluster c;
    dsim_err e = dsim_cluster_from_tf_config(text, dph, &c);
    if (e != DSIM_OK) {
        FZ_REQUIRE(e == DSIM_EINVAL || e == DSIM_ENOMEM);
        FZ_REQUIRE(e == DSIM_ENOMEM || strstr(dsim_errmsg(), "TF_CONFIG") ||
                   strstr(dsim_errmsg(), "cluster:"));
        for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++)
            FZ_REQUIRE(c.jobs[t].ntasks == 0 && c.jobs[t].addrs == NULL);
        free(text);
        return 0;
    }
    int nw = c.jobs[DSIM_TASK_CHIEF].ntasks + c.jobs[DSIM_TASK_WORKER].ntasks;
    FZ_REQUIRE(c.num_workers == nw && c.num_replicas == nw * dph && c.devices_per_host == dph);
    FZ_REQUIRE(c.jobs[DSIM_TASK_CHIEF].ntasks <= 1 && c.jobs[DSIM_TASK_EVALUATOR].ntasks <= 1);
    FZ_REQUIRE(c.worker_id >= -1 && c.worker_id < (nw ? nw : 1));
    for (int r = 0; r < c.num_replicas && r < 64; r++) {
        int w = -1, d = -1, back = -1;
        FZ_REQUIRE(dsim_cluster_replica_place(&c, r, &w, &d) == DSIM_OK);
        FZ_REQUIRE(dsim_cluster_replica(&c, w, d, &back) == DSIM_OK && back == r);
        FZ_REQUIRE(dsim_cluster_worker_address(&c, w) != NULL);
    }
    if (c.from_tf_config) {
        char *again = NULL;
        e = dsim_cluster_to_tf_config(&c, c.task_type, c.task_index, &again);
        FZ_REQUIRE(e == DSIM_OK || e == DSIM_ENOMEM);
        if (e == DSIM_OK) {
            dsim_cluster c2;
            e = dsim_cluster_from_tf_config(again, dph, &c2);
            if (e != DSIM_OK || !fz_same(&c, &c2)) {
                fprintf(stderr, "fuzz_tf_config: %s\n  came back as %s\n  (%s)\n", text, again,
                        e == DSIM_OK ? "another cluster" : dsim_errmsg());
                abort();
            }
            dsim_cluster_free(&c2);
        }
        free(again);
    }
    dsim_cluster_free(&c);
    free(text);
    return 0;
}
