/* mirrored: TF's MirroredStrategy. One worker, a copy of the variables on
 * each of its devices; each step the devices' gradients are SUM-all-reduced
 * (with the job's `communication` algorithm) and every device applies the
 * same update, so the copies stay bit-identical.
 *
 *   device 0   device 1   ...  device D-1
 *     g0         g1              gD-1       (each scaled by 1/global_batch)
 *      \_________|_______________/
 *            all-reduce SUM                 (ring | rhd | tree | reduce_to_one)
 *      /---------|---------------\
 *   w -= f(g)  w -= f(g)       w -= f(g)    (same bits everywhere)
 */
#include "../strategy_int.h"

static dsim_err mirrored_check_shape(const dsim_strategy_shape *s)
{
    if (s->hosts != 1 || s->num_ps != 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "mirrored runs on one worker without parameter servers (1 host x D "
                        "devices); got %d host(s) x %d device(s) with %d ps. Use "
                        "multi_worker_mirrored for several hosts, parameter_server for ps",
                        s->hosts, s->devices_per_host, s->num_ps);
    return DSIM_OK;
}

const struct dsim_strategy_ops dsim_strategy_mirrored_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "mirrored",
    .summary = "variables mirrored on every device of one worker, gradients all-reduced "
               "(TF MirroredStrategy)",
    .placement = DSIM_PLACE_MIRRORED,
    .replica_priv_size = sizeof(dsim_replicated),
    .check_shape = mirrored_check_shape,
    .replica_fini = dsim_replicated_fini,
    .create_variables = dsim_replicated_create,
    .apply_gradients = dsim_replicated_apply,
    .reduce = dsim_replicated_reduce,
    .save = dsim_replicated_save,
};
