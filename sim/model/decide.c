/* What DSIM_ALGO_AUTO runs on a job whose network the cost model knows
 * (costmodel.h): the algorithm whose schedule the model finds fastest on
 * the job's own links and topology, instead of src/coll/decide.c's fixed
 * thresholds, which know bytes and ranks but not how slow a link is. The
 * library's own pick stands where it is within 1 % of the fastest (less
 * than the model can tell apart), so the two differ only where the model
 * says the thresholds lose time.
 *
 * The harness hands dsim_cost_decider_fn to the training driver
 * (dsim_train_cfg.decide). The world's and the sub-communicators' calls ask
 * it with their own shape; answers are kept per (bytes, ranks, hosts,
 * local), so a job evaluates each shape's schedules once. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/costmodel.h"

/* Algorithms auto may run on hosts x local: hierarchical needs two levels,
 * the torus is modelled as itself only on a TPU slice (elsewhere it runs as
 * a bidirectional ring, which the model does not tell from the ring), and
 * reduce_to_one never: it is TF's baseline, run on request (the model,
 * which charges no per-message cost at a receiver, would pick it for tiny
 * buffers, where rank 0 takes every other rank's message at once). */
static bool cd_runs(const dsim_topology *t, dsim_algo a)
{
    if (a == DSIM_ALGO_REDUCE_TO_ONE)
        return false;
    if (a == DSIM_ALGO_HIERARCHICAL)
        return t->hosts >= 2 && t->devices_per_host >= 2;
    if (a == DSIM_ALGO_TORUS)
        return t->tpu != NULL;
    return true;
}

dsim_algo dsim_cost_decide(const dsim_topology *t, size_t bytes, size_t esize, double *seconds)
{
    long long n = t ? (long long)t->hosts * t->devices_per_host : 0;
    dsim_algo own = t && n > 0 && n <= INT32_MAX
                        ? dsim_allreduce_decide_hosts(bytes, t->hosts, t->devices_per_host)
                        : DSIM_ALGO_RING;
    double own_s = INFINITY, best_s = INFINITY;
    dsim_algo best = own;
    dsim_error saved;
    dsim_error_copy(&saved); /* a schedule that cannot be evaluated is skipped */
    for (int k = DSIM_ALGO_AUTO + 1; t && k < DSIM_ALGO_COUNT; k++) {
        double x = 0;
        if (!cd_runs(t, (dsim_algo)k) ||
            dsim_cost_allreduce(t, (dsim_algo)k, bytes, esize, &x, NULL) != DSIM_OK)
            continue;
        if (k == (int)own)
            own_s = x;
        if (x < best_s) {
            best_s = x;
            best = (dsim_algo)k;
        }
    }
    dsim_error_restore(&saved);
    /* the library's pick where the model cannot tell them apart */
    if (own_s <= best_s * 1.01) {
        best = own;
        best_s = own_s;
    }
    if (seconds)
        *seconds = best_s;
    return best;
}

typedef struct cd_entry {
    size_t bytes;
    int nranks, hosts, local;
    dsim_algo algo;
} cd_entry;

struct dsim_cost_decider {
    dsim_topology t;
    pthread_mutex_t lock;
    cd_entry *e;
    size_t n, cap;
};

dsim_err dsim_cost_decider_create(const dsim_topology *t, dsim_cost_decider **out)
{
    if (!t || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_cost_decider_create: t and out must be set");
    dsim_cost_decider *d = calloc(1, sizeof *d);
    if (!d)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for the cost model's decision");
    d->t = *t;
    pthread_mutex_init(&d->lock, NULL);
    *out = d;
    return DSIM_OK;
}

void dsim_cost_decider_destroy(dsim_cost_decider *d)
{
    if (!d)
        return;
    pthread_mutex_destroy(&d->lock);
    free(d->e);
    free(d);
}

dsim_algo dsim_cost_decider_fn(void *user, size_t bytes, int nranks, int hosts, int local)
{
    dsim_cost_decider *d = user;
    if (!d || hosts < 1 || local < 1 || (long long)hosts * local != nranks)
        return DSIM_ALGO_AUTO; /* a shape the model does not know: no opinion */
    /* the element size only rounds the blocks: float32, or half precision */
    size_t esize = bytes % 4 == 0 ? 4 : bytes % 2 == 0 ? 2 : 1;
    dsim_topology t = d->t;
    if (t.tpu && (hosts != t.hosts || local != t.devices_per_host))
        return DSIM_ALGO_AUTO; /* a part of the slice: its ICI routes are not the slice's */
    t.hosts = hosts;
    t.devices_per_host = local;
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].bytes == bytes && d->e[i].nranks == nranks && d->e[i].hosts == hosts &&
            d->e[i].local == local) {
            dsim_algo a = d->e[i].algo;
            pthread_mutex_unlock(&d->lock);
            return a;
        }
    /* Evaluated under the lock: the other ranks of the call want the same
     * answer and wait for it rather than compute it again. */
    dsim_algo a = dsim_cost_decide(&t, bytes, esize, NULL);
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 16;
        cd_entry *e = realloc(d->e, cap * sizeof *e);
        if (e) {
            d->e = e;
            d->cap = cap;
        }
    }
    if (d->n < d->cap)
        d->e[d->n++] = (cd_entry){bytes, nranks, hosts, local, a};
    pthread_mutex_unlock(&d->lock);
    return a;
}
