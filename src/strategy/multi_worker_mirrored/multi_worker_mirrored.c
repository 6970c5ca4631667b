/* multi_worker_mirrored: TF's MultiWorkerMirroredStrategy. Every device of
 * every worker holds a copy of the variables; one all-reduce over all
 * hosts x devices replicas (TF's CollectiveAllReduce) with the job's
 * `communication` algorithm, then the same update on every replica. The
 * chief (worker 0) broadcasts the initial values and writes checkpoints.
 *
 *   worker 0: r0 r1    worker 1: r2 r3     replica = worker * D + device
 *             \__\_______________/__/
 *                 all-reduce SUM over all replicas
 */
#include "../strategy_int.h"

static dsim_err mwm_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "multi_worker_mirrored takes no parameter servers; got %d host(s) x %d "
                        "device(s) with %d ps. Set num_ps to 0, or use parameter_server",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

const struct dsim_strategy_ops dsim_strategy_multi_worker_mirrored_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "multi_worker_mirrored",
    .summary = "variables mirrored on every device of every worker, one all-reduce over all "
               "replicas (TF MultiWorkerMirroredStrategy)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(dsim_replicated),
    .check_shape = mwm_check_shape,
    .replica_fini = dsim_replicated_fini,
    .create_variables = dsim_replicated_create,
    .apply_gradients = dsim_replicated_apply,
    .reduce = dsim_replicated_reduce,
    .save = dsim_replicated_save,
};
