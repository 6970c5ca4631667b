/* The all-reduce algorithms' names (dsim_algo_name, dsim_algo_parse). A
 * leaf: the fingerprints (fingerprint.c) and the failure messages of every
 * step (step.c) name the algorithm, and must not reach the communicator
 * code that runs the algorithms, which itself runs the steps. */
#include <strings.h>

#include "dsim/comm.h"

static const char *const algo_names[DSIM_ALGO_COUNT] = {
    [DSIM_ALGO_AUTO] = "auto",
    [DSIM_ALGO_RING] = "ring",
    [DSIM_ALGO_RHD] = "rhd",
    [DSIM_ALGO_TREE] = "tree",
    [DSIM_ALGO_REDUCE_TO_ONE] = "reduce_to_one",
};

const char *dsim_algo_name(dsim_algo a)
{
    if ((int)a < 0 || a >= DSIM_ALGO_COUNT)
        return "unknown";
    return algo_names[a];
}

dsim_err dsim_algo_parse(const char *s, dsim_algo *out)
{
    if (!s || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_algo_parse: %s is NULL", !s ? "the name" : "out");
    for (int a = 0; a < DSIM_ALGO_COUNT; a++) {
        if (strcasecmp(s, algo_names[a]) == 0) {
            *out = (dsim_algo)a;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "unknown allreduce algorithm \"%s\"; use one of auto, ring, rhd, tree, "
                    "reduce_to_one",
                    s);
}
