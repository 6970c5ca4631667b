/* The phase recorder (phase_rec.h). The hook only claims a slot with an
 * atomic counter and fills it: replicas never wait on each other. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "phase_rec.h"

typedef struct pr_entry {
    int64_t t;
    uint64_t gs;
    int replica;
    int phase;
} pr_entry;

struct h_phase_rec {
    int replicas;
    uint64_t stride;
    /* per replica, touched only by its own worker: the next phase's entry
     * is wanted (it ends a span that is kept) */
    unsigned char *want_next;
    pr_entry *e;
    atomic_size_t n; /* slots claimed (may pass the cap: those are dropped) */
};

static int64_t pr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static bool pr_step_phase(int p)
{
    return p == DSIM_PHASE_COMPUTE || p == DSIM_PHASE_ALLREDUCE || p == DSIM_PHASE_REDUCE_LOSS;
}

/* Keeps (replica, p, gs) at time t, or not (sampling, the cap). */
static void pr_keep(h_phase_rec *pr, int replica, int p, uint64_t gs, int64_t t)
{
    if (replica < 0 || replica >= pr->replicas)
        return;
    bool kept = !pr_step_phase(p) || gs % pr->stride == 0;
    if (!kept && !pr->want_next[replica])
        return;
    /* an entry kept only to end the span before it ends the chain */
    pr->want_next[replica] = kept;
    size_t i = atomic_fetch_add_explicit(&pr->n, 1, memory_order_relaxed);
    if (i < DSIM_PHASE_REC_CAP)
        pr->e[i] = (pr_entry){.t = t, .gs = gs, .replica = replica, .phase = p};
}

static dsim_hook_action pr_phase(void *user, int replica, dsim_phase p, uint64_t gs)
{
    h_phase_rec *pr = user;
    if (replica >= 0 && replica < pr->replicas)
        pr_keep(pr, replica, (int)p, gs, pr_now());
    return DSIM_HOOK_GO;
}

void h_phase_rec_note(void *user, int replica, int phase, uint64_t gs, int64_t t_ns)
{
    pr_keep(user, replica, phase, gs, t_ns);
}

h_phase_rec *h_phase_rec_create(int replicas, uint64_t total_steps)
{
    h_phase_rec *pr = calloc(1, sizeof *pr);
    if (!pr)
        return NULL;
    pr->e = malloc(DSIM_PHASE_REC_CAP * sizeof *pr->e);
    pr->want_next = calloc(replicas > 0 ? (size_t)replicas : 1, 1);
    if (!pr->e || !pr->want_next) {
        free(pr->e);
        free(pr->want_next);
        free(pr);
        return NULL;
    }
    pr->replicas = replicas;
    pr->stride = total_steps > DSIM_PHASE_REC_STEPS
                     ? (total_steps + DSIM_PHASE_REC_STEPS - 1) / DSIM_PHASE_REC_STEPS
                     : 1;
    atomic_init(&pr->n, 0);
    return pr;
}

/* Static: a hung job's health check reads cfg->hooks after dsim_train has
 * returned (the driver's gate keeps the phase hook from being called then,
 * so the recorder itself may go). */
static const dsim_train_hooks pr_hooks = {.size = sizeof(dsim_train_hooks), .phase = pr_phase};

void h_phase_rec_attach(h_phase_rec *pr, dsim_train_cfg *cfg)
{
    cfg->hooks = &pr_hooks;
    cfg->hooks_user = pr;
}

void h_phase_rec_destroy(h_phase_rec *pr)
{
    if (!pr)
        return;
    free(pr->e);
    free(pr->want_next);
    free(pr);
}

static int pr_cmp(const void *a, const void *b)
{
    const pr_entry *x = a, *y = b;
    if (x->replica != y->replica)
        return x->replica < y->replica ? -1 : 1;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return 0;
}

/* Did the step go on normally after phase p (the next phase is one a
 * completed p leads to)? */
static bool pr_went_on(int p, int next)
{
    if (p == DSIM_PHASE_ALLREDUCE)
        return next == DSIM_PHASE_REDUCE_LOSS;
    return next == DSIM_PHASE_COMPUTE || next == DSIM_PHASE_CHECKPOINT ||
           next == DSIM_PHASE_FINISH || next == DSIM_PHASE_DONE;
}

dsim_err h_phase_rec_store(const h_phase_rec *pr, dsim_store *st, dsim_run_id run,
                           const char *algorithm, uint64_t grad_bytes)
{
    size_t claimed = atomic_load(&pr->n);
    size_t n = claimed < DSIM_PHASE_REC_CAP ? claimed : DSIM_PHASE_REC_CAP;
    pr_entry *e = malloc((n ? n : 1) * sizeof *e);
    if (!e)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory storing the phases");
    memcpy(e, pr->e, n * sizeof *e);
    qsort(e, n, sizeof *e, pr_cmp);
    dsim_err err = DSIM_OK;
    for (size_t i = 0; i + 1 < n && err == DSIM_OK; i++) {
        const pr_entry *a = &e[i], *b = &e[i + 1];
        if (b->replica != a->replica)
            continue;
        /* a START after anything is a restart: when the replica stopped
         * before it is not known */
        if (b->phase == DSIM_PHASE_START)
            continue;
        int p = a->phase;
        if (p == DSIM_PHASE_ALLREDUCE || p == DSIM_PHASE_REDUCE_LOSS) {
            bool ok = pr_went_on(p, b->phase);
            dsim_coll_rec c = {
                .replica = a->replica,
                .op = dsim_phase_name((dsim_phase)p),
                .algorithm = p == DSIM_PHASE_ALLREDUCE ? algorithm : NULL,
                .bytes = p == DSIM_PHASE_ALLREDUCE ? grad_bytes : sizeof(double),
                .t_start_ns = a->t,
                .t_end_ns = b->t,
                .status = ok ? DSIM_OK : DSIM_EABORTED,
            };
            err = dsim_store_collective(st, run, &c);
        } else if (p == DSIM_PHASE_START || p == DSIM_PHASE_RENDEZVOUS || p == DSIM_PHASE_RESTORE ||
                   p == DSIM_PHASE_CREATE_VARIABLES || p == DSIM_PHASE_FINISH ||
                   (p == DSIM_PHASE_CHECKPOINT && a->replica == 0)) {
            /* the checkpoint: the chief's (replica 0's) write; the others
             * only pass through the phase */
            char detail[160];
            snprintf(detail, sizeof detail,
                     "{\"phase\":\"%s\",\"global_step\":%" PRIu64 ",\"dur_ns\":%" PRId64 "}",
                     dsim_phase_name((dsim_phase)p), a->gs, b->t - a->t);
            err = dsim_store_event(
                st, run, a->replica, a->t,
                p == DSIM_PHASE_CHECKPOINT ? DSIM_EVENT_CHECKPOINT : DSIM_EVENT_PHASE, detail);
        }
    }
    free(e);
    if (err == DSIM_OK && pr->stride > 1)
        err = dsim_store_metric(st, run, "collective_sampling", (double)pr->stride,
                                "every k-th step", -1);
    if (err == DSIM_OK && claimed > DSIM_PHASE_REC_CAP)
        err = dsim_store_metric(st, run, "phase_entries_dropped",
                                (double)(claimed - DSIM_PHASE_REC_CAP), "entries", -1);
    return err;
}
