/* Defaults and presets of scenario files, shared by the parser, `dsim
 * validate --defaults` and `dsim plan`. */
#ifndef DSIM_SCENARIO_DEFAULTS_H
#define DSIM_SCENARIO_DEFAULTS_H

#include <stdint.h>
#include <stdio.h>

#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a scenario takes when it does not say. */
#define DSIM_SCENARIO_DEF_SEED           1
#define DSIM_SCENARIO_DEF_ENGINE         "threads"
#define DSIM_SCENARIO_DEF_STRATEGY       "multi_worker_mirrored"
#define DSIM_SCENARIO_DEF_PRESET         "loopback"
#define DSIM_SCENARIO_DEF_HEALTH_INT_NS  (30ll * 1000000000ll)
#define DSIM_SCENARIO_DEF_HEALTH_TMO_NS  (10ll * 1000000000ll)
#define DSIM_SCENARIO_DEF_HEALTH_RETRIES 3
#define DSIM_SCENARIO_DEF_HIDDEN         16
#define DSIM_SCENARIO_DEF_EXAMPLES       512
#define DSIM_SCENARIO_DEF_FEATURES       8
#define DSIM_SCENARIO_DEF_CLASSES        4 /* classification; regression: 1 output */
#define DSIM_SCENARIO_DEF_NOISE          0.05
#define DSIM_SCENARIO_DEF_FILES          4
#define DSIM_SCENARIO_DEF_CKPT_EVERY     10
#define DSIM_SCENARIO_DEF_RECOVERY       "none"
#define DSIM_SCENARIO_DEF_MAX_RESTARTS   3

/* A network preset: one-way latency and bandwidth of every link, for the
 * sim engine's alpha-beta cost model. */
typedef struct dsim_network_preset {
    const char *name;
    int64_t latency_ns;
    double bandwidth_Bps;
    const char *what;
} dsim_network_preset;

/* loopback, datacenter, ethernet_10g, and the cost model's 1gbe, 10gbe,
 * 25gbe, ib100, pcie4, nvlink (custom has no values: it needs latency and
 * bandwidth). NULL for an unknown name. */
const dsim_network_preset *dsim_network_preset_find(const char *name);
const dsim_network_preset *dsim_network_preset_at(int i); /* NULL past the end */

/* Writes a complete scenario that states every default (what `dsim
 * validate --defaults` prints). Parsing it gives the same plan as a file
 * holding only `name: example`. Keys that apply only with another choice
 * (the mlp's hidden widths, an optimizer's own settings, ...) are written
 * as comments. */
dsim_err dsim_scenario_write_defaults(FILE *f);

#ifdef __cplusplus
}
#endif
#endif
