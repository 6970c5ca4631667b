#include "coll_harness.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct harness_worker {
    coll_harness *h;
    int rank;
    coll_rank_fn fn;
    void *arg;
} harness_worker;

void coll_harness_close(coll_harness *h)
{
    if (h->comms)
        for (int r = 0; r < h->n; r++)
            dsim_comm_destroy(h->comms[r]);
    if (h->eps)
        for (int r = 0; r < h->n; r++)
            if (h->eps[r])
                dsim_ep_close(h->eps[r]);
    if (h->fab)
        dsim_fabric_close(h->fab);
    if (h->rt)
        dsim_rt_destroy(h->rt);
    if (h->bar_ready)
        pthread_barrier_destroy(&h->bar);
    free(h->comms);
    free(h->eps);
    memset(h, 0, sizeof *h);
}

dsim_err coll_harness_open(coll_harness *h, const coll_harness_cfg *cfg)
{
    memset(h, 0, sizeof *h);
    if (!cfg || cfg->nranks < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "coll_harness_open: nranks must be >= 1");
    h->n = cfg->nranks;
    h->eps = calloc((size_t)h->n, sizeof *h->eps);
    h->comms = calloc((size_t)h->n, sizeof *h->comms);
    if (!h->eps || !h->comms) {
        coll_harness_close(h);
        return DSIM_ERR(DSIM_ENOMEM, -1, "coll_harness_open: out of memory");
    }
    if (pthread_barrier_init(&h->bar, NULL, (unsigned)h->n) != 0) {
        coll_harness_close(h);
        return DSIM_ERR(DSIM_ENOMEM, -1, "coll_harness_open: pthread_barrier_init failed");
    }
    h->bar_ready = 1;
    dsim_err e = dsim_rt_create(cfg->engine ? cfg->engine : "threads", &h->rt);
    if (e != DSIM_OK) {
        coll_harness_close(h);
        return e;
    }
    dsim_fabric_cfg fc = {
        .backend = cfg->backend ? cfg->backend : "inproc",
        .nranks = h->n,
        .rt = h->rt,
        .options = cfg->options,
    };
    e = dsim_fabric_open(&fc, &h->fab);
    for (int r = 0; r < h->n && e == DSIM_OK; r++)
        e = dsim_ep_open(h->fab, r, &h->eps[r]);
    for (int r = 0; r < h->n && e == DSIM_OK; r++) {
        dsim_comm_cfg cc = {
            .ep = h->eps[r],
            .size = h->n,
            .comm_id = cfg->comm_id,
            .timeout_ns = cfg->timeout_ns > 0 ? cfg->timeout_ns : DSIM_TIMEOUT_DEFAULT,
            .algo = cfg->algo,
            .no_fingerprint = cfg->no_fingerprint || cfg->plain_rank == r + 1,
            .flight_recorder = cfg->flight_recorder,
            .local_size = cfg->local_size,
            .torus_ndims = cfg->torus_ndims,
            .torus_rank = cfg->torus_rank,
        };
        for (int i = 0; i < cfg->torus_ndims && i < DSIM_TORUS_MAX_DIMS; i++)
            cc.torus_dims[i] = cfg->torus_dims[i];
        e = dsim_comm_create(&cc, &h->comms[r]);
    }
    if (e != DSIM_OK)
        coll_harness_close(h);
    return e;
}

static void harness_main(void *p)
{
    harness_worker *w = p;
    w->fn(w->h, w->rank, w->arg);
}

dsim_err coll_harness_run(coll_harness *h, coll_rank_fn fn, void *arg)
{
    harness_worker *ws = calloc((size_t)h->n, sizeof *ws);
    dsim_task **ts = calloc((size_t)h->n, sizeof *ts);
    if (!ws || !ts) {
        free(ws);
        free(ts);
        return DSIM_ERR(DSIM_ENOMEM, -1, "coll_harness_run: out of memory");
    }
    dsim_err e = DSIM_OK;
    int started = 0;
    for (int r = 0; r < h->n; r++) {
        ws[r] = (harness_worker){h, r, fn, arg};
        e = dsim_rt_spawn(h->rt, r, harness_main, &ws[r], &ts[r]);
        if (e != DSIM_OK)
            break;
        started++;
    }
    /* A worker that could not start would leave the others stuck in
     * coll_harness_sync; the caller's rank functions bound every collective
     * by its deadline, so joining the started ones still ends. */
    for (int r = 0; r < started; r++) {
        dsim_err je = dsim_rt_join(h->rt, ts[r]);
        if (e == DSIM_OK)
            e = je;
    }
    free(ws);
    free(ts);
    return e;
}

void coll_harness_sync(coll_harness *h)
{
    pthread_barrier_wait(&h->bar);
}

void coll_fail(coll_failures *f, const char *fmt, ...)
{
    pthread_mutex_lock(&f->mu);
    if (f->failures++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->first, sizeof f->first, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&f->mu);
}
