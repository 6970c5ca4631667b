/* The table of a scenario file's limits (scenario_limits.h), printed from the
 * constants the parser checks against and from the engine table. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>

#include "dsim/optim.h"
#include "dsim/tpu.h"
#include "engine/engine.h"
#include "scenario/scenario_limits.h"

/* The engines with (want) or without every flag of `flags`, "a, b". */
static const char *lim_engines(unsigned flags, bool want, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; dsim_engine_at(i); i++) {
        const dsim_engine_ops *e = dsim_engine_at(i);
        if (((e->flags & flags) == flags) != want)
            continue;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", e->name);
        if (w < 0 || (size_t)w >= cap - used)
            break;
        used += (size_t)w;
    }
    return buf;
}

/* The TPU pods, "v2 16x16, v3 32x32, ...". */
static const char *lim_pods(char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int g = 0; dsim_tpu_gen_get((dsim_tpu_gen)g); g++) {
        const dsim_tpu_gen_info *t = dsim_tpu_gen_get((dsim_tpu_gen)g);
        int w = t->ndims == 3 ? snprintf(buf + used, cap - used, "%s%s %dx%dx%d", used ? ", " : "",
                                         t->name, t->pod_dims[0], t->pod_dims[1], t->pod_dims[2])
                              : snprintf(buf + used, cap - used, "%s%s %dx%d", used ? ", " : "",
                                         t->name, t->pod_dims[0], t->pod_dims[1]);
        if (w < 0 || (size_t)w >= cap - used)
            break;
        used += (size_t)w;
    }
    return buf;
}

void dsim_scenario_limits_write(FILE *out)
{
    char threaded[128], coroutines[128], pods[160];
    lim_engines(DSIM_ENGINE_THREAD_PER_REPLICA, true, threaded, sizeof threaded);
    lim_engines(DSIM_ENGINE_THREAD_PER_REPLICA, false, coroutines, sizeof coroutines);
    fprintf(out, "| what | accepted | note |\n"
                 "|---|---|---|\n");
    fprintf(out, "| the file | at most %u bytes | one YAML document, nested at most %d deep |\n",
            DSIM_SCEN_MAX_FILE_BYTES, DSIM_YAML_MAX_DEPTH);
    fprintf(out,
            "| a text value | at most %d bytes | `name`, `description`, paths, `tf_config` |\n",
            DSIM_SCEN_MAX_STR);
    fprintf(out, "| `seed` | 0 .. %" PRIu64 " | |\n", UINT64_MAX);
    fprintf(out,
            "| `cluster.hosts` | 1 .. %d | workers; `tf_config`'s chief and worker tasks "
            "alike |\n",
            DSIM_SCEN_MAX_HOSTS);
    fprintf(out, "| `cluster.devices_per_host` | 1 .. %d | |\n", DSIM_SCEN_MAX_DEVICES);
    fprintf(out,
            "| `cluster.tpu`, `cluster.tpu_topology` | a slice of one pod, in chips: %s | "
            "every dimension a multiple of a host's block of chips, or at most one host's "
            "chips; `dsim cluster --tpu` names the accepted slices; the replicas' limits below "
            "apply |\n",
            lim_pods(pods, sizeof pods));
    fprintf(out, "| `cluster.ps` | 0 .. %d | parameter servers; `tf_config`'s ps tasks alike |\n",
            DSIM_SCEN_MAX_PS);
    fprintf(out,
            "| replicas (`hosts` x `devices_per_host`) | 1 .. %d | on %s (a coroutine each), "
            "as memory allows: about %.0f KiB a replica and %.0f bytes a parameter (%.0f KiB "
            "timing only); on %s (a thread each) 1 .. %d |\n",
            DSIM_TRAIN_MAX_REPLICAS, coroutines, DSIM_SCEN_REPLICA_BYTES / 1024,
            DSIM_SCEN_PARAM_BYTES, DSIM_SCEN_TIMING_REPLICA_BYTES / 1024, threaded,
            DSIM_TRAIN_MAX_THREAD_REPLICAS);
    fprintf(out,
            "| runtime workers (replicas x (1 + `ps`)) | at most %d | one a replica, one a "
            "server and replica |\n",
            DSIM_TRAIN_MAX_WORKERS);
    fprintf(out,
            "| workers with the health check on | as memory allows | its first round pings "
            "every pair of workers: about %d bytes a pair |\n",
            DSIM_SCEN_HEALTH_PAIR_BYTES);
    fprintf(out, "| `strategy.health_check.retries` | 0 .. %d | |\n", DSIM_SCEN_MAX_RETRIES);
    fprintf(out, "| `data.examples` | 1 .. %" PRId64 " | |\n", DSIM_SCEN_MAX_EXAMPLES);
    fprintf(out,
            "| `data.features`, `data.classes`, `model.hidden`'s widths | 1 .. %u | "
            "classification: `classes` 2 or more |\n",
            (unsigned)DSIM_SCEN_MAX_DIM);
    fprintf(out, "| `model.hidden` | 1 .. %d widths | |\n", DSIM_SCEN_MAX_HIDDEN);
    fprintf(out, "| `data.files` | 0 .. %zu | |\n", (size_t)DSIM_SCEN_MAX_FILES);
    fprintf(out, "| `data.global_batch` | 1 .. %d | |\n", DSIM_SCEN_MAX_BATCH);
    fprintf(out, "| `data.epochs` | 1 .. %d | |\n", DSIM_SCEN_MAX_EPOCHS);
    fprintf(out, "| `model.synthetic.parameters` | 1 .. %.0f | counts take K M G T |\n",
            DSIM_SCEN_MAX_SYNTH_PARAMS);
    fprintf(out, "| `model.synthetic.flops_per_example` | 0 .. %.0f | |\n",
            DSIM_SCEN_MAX_SYNTH_FLOPS);
    fprintf(out, "| `optimizer.learning_rate` | more than 0, at most %.0f | |\n", DSIM_SCEN_MAX_LR);
    fprintf(out,
            "| `optimizer.clipvalue`, `optimizer.global_clipnorm`, `optimizer.clipnorm` | more "
            "than 0, at most %g | one of the three |\n",
            DSIM_SCEN_MAX_CLIP);
    fprintf(out, "| `optimizer.weight_decay` | 0 .. %.0f | 0: off |\n", DSIM_SCEN_MAX_WD);
    fprintf(out, "| `optimizer.initial_accumulator_value` | 0 .. %.0f | adagrad |\n",
            DSIM_SCEN_MAX_IAV);
    fprintf(out, "| `optimizer.gradient_accumulation_steps` | 0 .. %d | 0 or 1: off |\n",
            DSIM_OPTIM_MAX_ACCUMULATION);
    fprintf(out,
            "| `optimizer.schedule`'s `decay_steps`, `first_decay_steps`, `warmup_steps`, "
            "`boundaries` | 1 .. %" PRId64
            " (`warmup_steps` from 0) | `boundaries` increasing, at most %d, one fewer than "
            "`values` |\n",
            (int64_t)DSIM_SCEN_MAX_STEP, DSIM_LR_MAX_VALUES - 1);
    fprintf(out,
            "| `optimizer.schedule`'s `values`, `warmup_target`, `end_learning_rate` | more than "
            "0, at most %.0f (`end_learning_rate` from 0) | `alpha` 0 .. 1 |\n",
            DSIM_SCEN_MAX_LR);
    fprintf(out,
            "| `optimizer.schedule`'s `t_mul`, `m_mul` | `t_mul` 1 .. %.0f, `m_mul` more than 0, "
            "at most %.0f | cosine_decay_restarts |\n",
            DSIM_SCEN_MAX_TMUL, DSIM_SCEN_MAX_TMUL);
    fprintf(out,
            "| a step or a count (`at_step`, `after_messages`, `checkpoint.every`, "
            "`liveness.reach_step`) | up to %" PRId64 " | |\n",
            (int64_t)DSIM_SCEN_MAX_STEP);
    fprintf(out, "| a fault's `ranks:` | 1 .. %d ranks | |\n", DSIM_SCEN_MAX_FAULT_RANKS);
    fprintf(out, "| `slow`'s `factor` | more than 1, at most %.0f | |\n",
            DSIM_SCEN_MAX_SLOW_FACTOR);
    fprintf(out, "| `preempt`'s `grace_steps` | 0 .. %d | |\n", DSIM_SCEN_MAX_GRACE_STEPS);
    fprintf(out, "| `recovery.max_restarts` | 0 .. %d | |\n", DSIM_SCEN_MAX_RESTARTS);
    fprintf(out, "| `matrix:` | at most %d runs | the product of its lists' lengths |\n",
            DSIM_SCEN_MAX_COMBINATIONS);
    fprintf(out,
            "| a duration | 0 or 1ns .. %" PRId64 "ns (about 292 years) | a value written "
            "as more than 0 that would round to 0 is refused: 0 means none or off |\n",
            INT64_MAX);
}
