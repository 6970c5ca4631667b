/* dsim list devices: what each device backend finds on this machine (the
 * host's CPU, CUDA GPUs with their memory, compute capability, peak memory
 * bandwidth and peer access), and in one last line whether replicas can go
 * on GPUs here: "GPUs found: N (cuda)" or "no GPU found: CPU". */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cmds.h"
#include "dsim/device.h"
#include "dsim/err.h"

static void devs_mem(char *buf, size_t cap, uint64_t bytes)
{
    if (bytes == 0)
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%.1f GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
}

static json_t *devs_info_json(const dsim_device_info *in)
{
    char cc[16] = "";
    if (in->cc_major)
        snprintf(cc, sizeof cc, "%d.%d", in->cc_major, in->cc_minor);
    return json_pack("{s:i, s:s, s:I, s:s, s:i, s:f, s:s}", "index", in->index, "name", in->name,
                     "total_bytes", (json_int_t)in->total_bytes, "compute_capability", cc,
                     "multiprocessors", in->multiprocessors, "mem_bw_gbs", in->mem_bw_gbs, "bus_id",
                     in->bus_id);
}

static void devs_print_info(const char *backend, const dsim_device_info *in)
{
    char mem[32], cc[16] = "-", bw[32] = "-";
    devs_mem(mem, sizeof mem, in->total_bytes);
    if (in->cc_major)
        snprintf(cc, sizeof cc, "%d.%d", in->cc_major, in->cc_minor);
    if (in->mem_bw_gbs > 0)
        snprintf(bw, sizeof bw, "%.0f GB/s", in->mem_bw_gbs);
    printf("%-8s %-6d %-44.44s %10s %5s %5d %11s %s\n", backend, in->index, in->name, mem, cc,
           in->multiprocessors, bw, in->bus_id[0] ? in->bus_id : "-");
}

/* The pairs of backend's devices and whether each reaches the other. */
static void devs_peers(const char *backend, int n, bool as_json, json_t *jb)
{
    json_t *arr = as_json ? json_array() : NULL;
    for (int a = 0; a < n; a++) {
        for (int b = 0; b < n; b++) {
            int yes = 0;
            if (a == b || dsim_device_can_access_peer(backend, a, b, &yes) != DSIM_OK)
                continue;
            if (as_json)
                json_array_append_new(arr, json_pack("{s:i, s:i, s:b}", "from", a, "to", b, yes));
            else
                printf("  peer access %s:%d -> %s:%d: %s\n", backend, a, backend, b,
                       yes ? "yes" : "no (copies staged through host memory)");
        }
    }
    if (as_json)
        json_object_set_new(jb, "peer_access", arr);
}

/* One backend: its devices, or why it has none. Returns its count. */
static int devs_backend(const char *name, bool registered, bool as_json, json_t *jarr)
{
    int n = 0;
    char why[256] = "";
    if (!registered)
        snprintf(why, sizeof why,
                 "not in this build (configured without CUDA; see README: Building and testing)");
    else if (dsim_device_count(name, &n, why, sizeof why) != DSIM_OK)
        snprintf(why, sizeof why, "%s", dsim_errmsg());
    json_t *jb = NULL, *jdevs = NULL;
    if (as_json) {
        jb = json_pack("{s:s, s:i, s:s?}", "name", name, "count", n, "why", n ? NULL : why);
        jdevs = json_array();
    }
    if (n == 0 && !as_json)
        printf("%-8s %-6s %s\n", name, "-", why);
    for (int i = 0; i < n; i++) {
        dsim_device_info in;
        if (dsim_device_query(name, i, &in) != DSIM_OK) {
            if (!as_json)
                printf("%-8s %-6d %s\n", name, i, dsim_errmsg());
            continue;
        }
        if (as_json) {
            json_array_append_new(jdevs, devs_info_json(&in));
        } else {
            devs_print_info(name, &in);
        }
    }
    if (n > 1 && strcmp(name, "host") != 0)
        devs_peers(name, n, as_json, jb);
    if (as_json) {
        json_object_set_new(jb, "devices", jdevs);
        json_array_append_new(jarr, jb);
    }
    return n;
}

int cmd_list_devices(bool as_json)
{
    const char *const *names = dsim_device_backends();
    json_t *jarr = as_json ? json_array() : NULL;
    if (!as_json)
        printf("%-8s %-6s %-44s %10s %5s %5s %11s %s\n", "BACKEND", "DEVICE", "NAME", "MEMORY",
               "CC", "SMS", "PEAK BW", "BUS");
    int gpus = 0;
    bool have_cuda = false;
    for (int i = 0; names[i]; i++) {
        int n = devs_backend(names[i], true, as_json, jarr);
        if (strcmp(names[i], "host") != 0)
            gpus += n;
        have_cuda |= strcmp(names[i], "cuda") == 0;
    }
    if (!have_cuda)
        devs_backend("cuda", false, as_json, jarr);
    char summary[64];
    if (gpus)
        snprintf(summary, sizeof summary, "GPUs found: %d (cuda)", gpus);
    else
        snprintf(summary, sizeof summary, "no GPU found: CPU");
    if (!as_json) {
        printf("\n%s\n", summary);
        return 0;
    }
    json_t *j = json_pack("{s:o, s:i, s:s}", "backends", jarr, "gpus", gpus, "summary", summary);
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!s) {
        fprintf(stderr, "dsim list devices: out of memory\n");
        return 2;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}
