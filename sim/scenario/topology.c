/* The cost model's view of a scenario's network: what decides
 * `communication: auto` on the engines that model the links (costmodel.h,
 * dsim_cost_decide), and what `dsim plan` says it picks. */
#include <string.h>

#include "engine/engine.h"
#include "model/costmodel.h"
#include "scenario/scenario.h"

/* A link the file gave no time (bandwidth 0: at once) is modelled as one
 * no transfer waits on. */
static dsim_link_model topo_link(const char *name, int64_t latency_ns, double Bps)
{
    return (dsim_link_model){.name = name,
                             .what = name,
                             .latency_s = (double)latency_ns / 1e9,
                             .bandwidth_Bps = Bps > 0 ? Bps : 1e18,
                             .source = "the scenario"};
}

bool dsim_scenario_topology(const dsim_scenario *s, const char *engine, dsim_topology *t)
{
    const dsim_engine_ops *eng = NULL;
    if (!s || !t || dsim_engine_find(engine ? engine : s->engine, &eng) != DSIM_OK)
        return false;
    bool tpu = s->train.tpu.replicas > 0 && (eng->flags & DSIM_ENGINE_VIRTUAL_TIME);
    if (!tpu && (!s->network_given || (eng->flags & DSIM_ENGINE_REAL_LINKS)))
        return false; /* the links are real, or not modelled */
    memset(t, 0, sizeof *t);
    t->hosts = s->train.hosts;
    t->devices_per_host = s->train.devices_per_host;
    t->inter = topo_link(s->network_preset ? s->network_preset : "network", s->link_latency_ns,
                         s->link_bandwidth_Bps);
    t->intra =
        topo_link(s->intra_preset ? s->intra_preset : "intra", s->intra_latency_ns, s->intra_Bps);
    const dsim_device_model *d = s->device_preset ? dsim_device_preset(s->device_preset) : NULL;
    if (d)
        t->device = *d; /* its memory bandwidth times the reductions */
    if (tpu) {
        t->tpu = &s->train.tpu;
        t->ici = topo_link("ici", s->tpu_ici_latency_ns, s->tpu_ici_Bps);
        t->on_chip = topo_link("on_chip", s->tpu_chip_latency_ns, s->tpu_chip_Bps);
    }
    return true;
}
