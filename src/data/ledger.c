/* The coverage ledger.
 *
 * Each replica owns an append-only log (its records and the ids they read),
 * padded to its own cache lines, so recording needs no lock and replicas do
 * not share a written line. Queries walk every log; they run after the
 * recording threads have been joined, and find an epoch's records by
 * binary search in a log in epoch order (ledger_span). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/data.h"

typedef struct ledger_rec {
    uint64_t step;
    uint64_t begin; /* index into the log's ids */
    uint64_t n;
    uint32_t epoch;
    int32_t rerun_of; /* -1: the log's replica's own step; LEDGER_ROLLED_BACK: a step a
                         restart rolled back; else the lost replica's */
} ledger_rec;

#define LEDGER_ROLLED_BACK (-2)

typedef struct ledger_log {
    _Alignas(64) ledger_rec *recs;
    size_t nrecs, caprecs;
    uint64_t *ids;
    size_t nids, capids;
    /* A replica's own steps come in epoch order, so a query of one epoch
     * finds its records by binary search; a record of an earlier epoch
     * after a later one (a lost replica's step re-run, a copy) makes the
     * log unsorted, and its queries walk all of it. */
    uint32_t last_epoch;
    bool unsorted;
} ledger_log;

struct dsim_ledger {
    uint64_t n;
    uint32_t epochs;
    int nw, rp, n_rep;
    ledger_log *logs;
};

dsim_err dsim_ledger_create(uint64_t n_examples, uint32_t epochs, int num_workers,
                            int replicas_per_worker, dsim_ledger **out)
{
    if (out == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger: out must not be NULL");
    *out = NULL;
    if (n_examples == 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger: the dataset is empty (0 examples)");
    if (epochs < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger: epochs is 0: it must be >= 1");
    if (num_workers < 1 || replicas_per_worker < 1)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger: %d workers x %d replicas: both must be >= 1",
                        num_workers, replicas_per_worker);
    if ((int64_t)num_workers * replicas_per_worker > DSIM_MAX_REPLICAS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "ledger: %d workers x %d replicas is more than the %d supported",
                        num_workers, replicas_per_worker, DSIM_MAX_REPLICAS);
    dsim_ledger *l = calloc(1, sizeof *l);
    if (l == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "ledger: no memory");
    l->n = n_examples;
    l->epochs = epochs;
    l->nw = num_workers;
    l->rp = replicas_per_worker;
    l->n_rep = num_workers * replicas_per_worker;
    l->logs = aligned_alloc(64, (size_t)l->n_rep * sizeof *l->logs);
    if (l->logs == NULL) {
        free(l);
        return DSIM_ERR(DSIM_ENOMEM, -1, "ledger: no memory for %d replicas",
                        num_workers * replicas_per_worker);
    }
    memset(l->logs, 0, (size_t)l->n_rep * sizeof *l->logs);
    *out = l;
    return DSIM_OK;
}

void dsim_ledger_destroy(dsim_ledger *l)
{
    if (l == NULL)
        return;
    for (int i = 0; i < l->n_rep; i++) {
        free(l->logs[i].recs);
        free(l->logs[i].ids);
    }
    free(l->logs);
    free(l);
}

static int ledger_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

static dsim_err ledger_append(dsim_ledger *l, int replica, int rerun_of, uint32_t epoch,
                              uint64_t step, const uint64_t *ids, uint64_t n)
{
    if (l == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger record: ledger must not be NULL");
    if (replica < 0 || replica >= l->n_rep)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger record: replica %d is outside [0, %d)", replica,
                        l->n_rep);
    if ((rerun_of < -1 && rerun_of != LEDGER_ROLLED_BACK) || rerun_of >= l->n_rep ||
        rerun_of == replica)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "ledger record: replica %d re-ran replica %d's step, which is not "
                        "another of [0, %d)",
                        replica, rerun_of, l->n_rep);
    if (epoch >= l->epochs)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "ledger record: epoch %u is outside the %u epochs the ledger was made for",
                        epoch, l->epochs);
    if (n > 0 && ids == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger record: %" PRIu64 " ids but ids is NULL", n);
    ledger_log *g = &l->logs[replica];
    if (ledger_grow((void **)&g->recs, &g->caprecs, g->nrecs + 1, sizeof *g->recs) != 0 ||
        ledger_grow((void **)&g->ids, &g->capids, g->nids + (size_t)n, sizeof *g->ids) != 0)
        return DSIM_ERR(DSIM_ENOMEM, replica, "ledger record: no memory for replica %d's log",
                        replica);
    if (g->nrecs > 0 && epoch < g->last_epoch)
        g->unsorted = true;
    g->last_epoch = epoch;
    g->recs[g->nrecs++] =
        (ledger_rec){.step = step, .begin = g->nids, .n = n, .epoch = epoch, .rerun_of = rerun_of};
    if (n > 0)
        memcpy(g->ids + g->nids, ids, (size_t)n * sizeof *ids);
    g->nids += (size_t)n;
    return DSIM_OK;
}

dsim_err dsim_ledger_record(dsim_ledger *l, int replica, uint32_t epoch, uint64_t step,
                            const uint64_t *ids, uint64_t n)
{
    return ledger_append(l, replica, -1, epoch, step, ids, n);
}

dsim_err dsim_ledger_record_rerun(dsim_ledger *l, int replica, int lost, uint32_t epoch,
                                  uint64_t step, const uint64_t *ids, uint64_t n)
{
    if (lost < 0)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger record: the lost replica %d is negative", lost);
    return ledger_append(l, replica, lost, epoch, step, ids, n);
}

/* Whose step a record is: a re-run counts for the lost replica; a step a
 * restart rolled back counts for nobody (-1). */
static int ledger_owner(int log, const ledger_rec *rc)
{
    if (rc->rerun_of == LEDGER_ROLLED_BACK)
        return -1;
    return rc->rerun_of >= 0 ? rc->rerun_of : log;
}

/* In a log in epoch order, the first record from lo on of an epoch > e. */
static size_t ledger_after(const ledger_log *g, size_t lo, uint32_t e)
{
    for (size_t hi = g->nrecs; lo < hi;) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->recs[mid].epoch <= e)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The records of g that may be of epoch e: [*k0, *k1). A sorted log's of
 * that epoch alone (two binary searches), an unsorted log's all of them
 * (the caller still tests each record's epoch). Queries per epoch over a
 * long run so cost what the epoch holds, not the run. */
static void ledger_span(const ledger_log *g, uint32_t e, size_t *k0, size_t *k1)
{
    *k0 = 0;
    *k1 = g->nrecs;
    if (g->unsorted)
        return;
    *k0 = e > 0 ? ledger_after(g, 0, e - 1) : 0;
    *k1 = ledger_after(g, *k0, e);
}

dsim_err dsim_ledger_copy_steps(dsim_ledger *dst, const dsim_ledger *src, uint64_t steps_per_epoch,
                                uint64_t from, uint64_t to, bool rolled_back)
{
    if (dst == NULL || src == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger copy: both ledgers are needed");
    if (dst->n != src->n || dst->epochs != src->epochs || dst->nw != src->nw || dst->rp != src->rp)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "ledger copy: the ledgers differ in shape (%" PRIu64 " examples, %u "
                        "epochs, %d x %d replicas against %" PRIu64 ", %u, %d x %d)",
                        dst->n, dst->epochs, dst->nw, dst->rp, src->n, src->epochs, src->nw,
                        src->rp);
    for (int i = 0; i < src->n_rep; i++) {
        const ledger_log *g = &src->logs[i];
        for (size_t k = 0; k < g->nrecs; k++) {
            const ledger_rec *rc = &g->recs[k];
            uint64_t gs = (uint64_t)rc->epoch * steps_per_epoch + rc->step;
            if (gs < from || gs >= to || rc->rerun_of == LEDGER_ROLLED_BACK)
                continue;
            int tag = rolled_back ? LEDGER_ROLLED_BACK : rc->rerun_of;
            DSIM_CHECK(ledger_append(dst, i, tag, rc->epoch, rc->step, g->ids + rc->begin, rc->n));
        }
    }
    return DSIM_OK;
}

dsim_err dsim_ledger_record_step(dsim_ledger *l, int worker, const dsim_input_step *st)
{
    if (l == NULL || st == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger record: ledger and step must not be NULL");
    if (st->done)
        return DSIM_OK;
    if (worker < 0 || worker >= l->nw || st->replicas != l->rp)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "ledger record: worker %d with %d replicas does not fit the ledger's %d "
                        "workers x %d replicas",
                        worker, st->replicas, l->nw, l->rp);
    for (int r = 0; r < st->replicas; r++)
        DSIM_CHECK(dsim_ledger_record(l, worker * l->rp + r, st->epoch, st->step, st->batch[r].ids,
                                      st->batch[r].n));
    return DSIM_OK;
}

static dsim_err ledger_range(const dsim_ledger *l, uint32_t epoch, int worker, int *lo, int *hi)
{
    if (l == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger: ledger must not be NULL");
    if (epoch >= l->epochs)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger: epoch %u is outside the %u epochs recorded",
                        epoch, l->epochs);
    if (worker < -1 || worker >= l->nw)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "ledger: worker %d is outside [0, %d) (or -1 for every worker)", worker,
                        l->nw);
    *lo = worker < 0 ? 0 : worker * l->rp;
    *hi = worker < 0 ? l->n_rep : (worker + 1) * l->rp;
    return DSIM_OK;
}

/* Reads per id of the steps owned by replicas [lo, hi): into own the
 * replicas' own steps, into rerun (if not NULL) the re-runs of lost
 * replicas' steps; with rerun NULL both go into own. */
static void ledger_count(const dsim_ledger *l, uint32_t epoch, int lo, int hi, uint32_t *own,
                         uint32_t *rerun)
{
    memset(own, 0, (size_t)l->n * sizeof *own);
    if (rerun)
        memset(rerun, 0, (size_t)l->n * sizeof *rerun);
    for (int i = 0; i < l->n_rep; i++) {
        const ledger_log *g = &l->logs[i];
        size_t k0, k1;
        ledger_span(g, epoch, &k0, &k1);
        for (size_t k = k0; k < k1; k++) {
            const ledger_rec *rc = &g->recs[k];
            int who = ledger_owner(i, rc);
            if (rc->epoch != epoch || who < 0 || who < lo || who >= hi)
                continue;
            uint32_t *counts = rerun && rc->rerun_of >= 0 ? rerun : own;
            for (uint64_t j = 0; j < rc->n; j++) {
                uint64_t id = g->ids[rc->begin + j];
                if (id < l->n && counts[id] < UINT32_MAX)
                    counts[id]++;
            }
        }
    }
}

dsim_err dsim_ledger_counts(const dsim_ledger *l, uint32_t epoch, int worker, uint32_t *counts)
{
    int lo = 0, hi = 0;
    DSIM_CHECK(ledger_range(l, epoch, worker, &lo, &hi));
    if (counts == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger counts: counts must not be NULL");
    ledger_count(l, epoch, lo, hi, counts, NULL);
    return DSIM_OK;
}

/* One (step, replica) of an epoch with the examples it read then. */
typedef struct ledger_cell {
    uint64_t step;
    uint64_t n;
    int replica;
} ledger_cell;

static int ledger_cell_cmp(const void *a, const void *b)
{
    const ledger_cell *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return (x->replica > y->replica) - (x->replica < y->replica);
}

/* The epoch's cells of replicas [lo, hi), by step then replica, one per
 * (step, replica) with the reads of repeated records summed. */
static dsim_err ledger_cells(const dsim_ledger *l, uint32_t epoch, int lo, int hi,
                             ledger_cell **out, size_t *count)
{
    size_t total = 0, k0, k1;
    for (int i = 0; i < l->n_rep; i++) {
        ledger_span(&l->logs[i], epoch, &k0, &k1);
        total += k1 - k0;
    }
    ledger_cell *c = malloc((total ? total : 1) * sizeof *c);
    if (c == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "ledger: no memory for %zu records", total);
    size_t k = 0;
    for (int i = 0; i < l->n_rep; i++) {
        const ledger_log *g = &l->logs[i];
        ledger_span(g, epoch, &k0, &k1);
        for (size_t j = k0; j < k1; j++) {
            int who = ledger_owner(i, &g->recs[j]);
            if (g->recs[j].epoch == epoch && who >= 0 && who >= lo && who < hi)
                c[k++] = (ledger_cell){.step = g->recs[j].step, .n = g->recs[j].n, .replica = who};
        }
    }
    qsort(c, k, sizeof *c, ledger_cell_cmp);
    size_t m = 0;
    for (size_t j = 0; j < k; j++) {
        if (m > 0 && c[m - 1].step == c[j].step && c[m - 1].replica == c[j].replica)
            c[m - 1].n += c[j].n;
        else
            c[m++] = c[j];
    }
    *out = c;
    *count = m;
    return DSIM_OK;
}

/* Walks the idle (step, replica) pairs: in a step where some replica of
 * [lo, hi) read examples, every other replica of the range (recorded with
 * nothing, or not recorded at all) is idle. */
static uint64_t ledger_walk_idle(const ledger_cell *c, size_t count, int lo, int hi, dsim_idle *out,
                                 size_t cap)
{
    uint64_t idle = 0;
    for (size_t a = 0; a < count;) {
        size_t b = a;
        int with_data = 0;
        while (b < count && c[b].step == c[a].step) {
            with_data += c[b].n > 0;
            b++;
        }
        if (with_data > 0) {
            size_t j = a;
            for (int r = lo; r < hi; r++) {
                while (j < b && c[j].replica < r)
                    j++;
                bool has = j < b && c[j].replica == r && c[j].n > 0;
                if (!has) {
                    if (out != NULL && idle < cap)
                        out[idle] = (dsim_idle){.step = c[a].step, .replica = r};
                    idle++;
                }
            }
        }
        a = b;
    }
    return idle;
}

static int ledger_u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The distinct steps of an epoch a restart rolled back. */
static dsim_err ledger_rolled_back_steps(const dsim_ledger *l, uint32_t epoch, uint64_t *out)
{
    size_t total = 0, k = 0, k0, k1;
    for (int i = 0; i < l->n_rep; i++) {
        ledger_span(&l->logs[i], epoch, &k0, &k1);
        for (size_t j = k0; j < k1; j++)
            total += l->logs[i].recs[j].rerun_of == LEDGER_ROLLED_BACK;
    }
    *out = 0;
    if (!total)
        return DSIM_OK;
    uint64_t *st = malloc(total * sizeof *st);
    if (st == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "ledger: no memory for %zu records", total);
    for (int i = 0; i < l->n_rep; i++) {
        ledger_span(&l->logs[i], epoch, &k0, &k1);
        for (size_t j = k0; j < k1; j++) {
            const ledger_rec *rc = &l->logs[i].recs[j];
            if (rc->rerun_of == LEDGER_ROLLED_BACK && rc->epoch == epoch)
                st[k++] = rc->step;
        }
    }
    qsort(st, k, sizeof *st, ledger_u64_cmp);
    for (size_t j = 0; j < k; j++)
        *out += j == 0 || st[j] != st[j - 1];
    free(st);
    return DSIM_OK;
}

dsim_err dsim_ledger_coverage(const dsim_ledger *l, uint32_t epoch, int worker, uint32_t expected,
                              dsim_coverage *out)
{
    int lo = 0, hi = 0;
    DSIM_CHECK(ledger_range(l, epoch, worker, &lo, &hi));
    if (out == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger coverage: out must not be NULL");
    memset(out, 0, sizeof *out);
    out->epoch = epoch;
    out->worker = worker;
    out->expected = expected;
    out->n_examples = l->n;
    uint32_t *counts = malloc(2 * (size_t)l->n * sizeof *counts);
    if (counts == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "ledger coverage: no memory for %" PRIu64 " counters",
                        l->n);
    uint32_t *rerun = counts + l->n;
    ledger_count(l, epoch, lo, hi, counts, rerun);
    for (uint64_t id = 0; id < l->n; id++) {
        uint64_t all = (uint64_t)counts[id] + rerun[id];
        if (counts[id] > expected)
            out->duplicates++;
        else if (all < expected)
            out->misses++;
        else if (all > expected)
            out->reruns++; /* at least once: a lost replica's step ran again */
        else
            out->exact++;
    }
    free(counts);

    uint64_t *per = calloc((size_t)(hi - lo) + 1, sizeof *per);
    if (per == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "ledger coverage: no memory for %d replicas", hi - lo);
    for (int li = 0; li < l->n_rep; li++) {
        const ledger_log *g = &l->logs[li];
        size_t k0, k1;
        ledger_span(g, epoch, &k0, &k1);
        for (size_t k = k0; k < k1; k++) {
            const ledger_rec *rc = &g->recs[k];
            int who = ledger_owner(li, rc);
            if (rc->epoch == epoch && who < 0) {
                out->rolled_back += rc->n;
                continue;
            }
            if (rc->epoch != epoch || who < lo || who >= hi)
                continue;
            per[who - lo] += rc->n;
            for (uint64_t j = 0; j < rc->n; j++)
                out->out_of_range += g->ids[rc->begin + j] >= l->n;
        }
    }
    for (int i = lo; i < hi; i++) {
        uint64_t mine = per[i - lo];
        out->reads += mine;
        if (i == lo || mine < out->min_examples) {
            out->min_examples = mine;
            out->min_replica = i;
        }
        if (i == lo || mine > out->max_examples) {
            out->max_examples = mine;
            out->max_replica = i;
        }
    }
    free(per);
    if (out->max_examples == 0)
        out->imbalance = 1.0;
    else if (out->min_examples == 0)
        out->imbalance = INFINITY;
    else
        out->imbalance = (double)out->max_examples / (double)out->min_examples;

    if (out->rolled_back)
        DSIM_CHECK(ledger_rolled_back_steps(l, epoch, &out->rolled_back_steps));
    ledger_cell *c;
    size_t count;
    DSIM_CHECK(ledger_cells(l, epoch, lo, hi, &c, &count));
    out->steps = count ? c[count - 1].step + 1 : 0;
    out->idle = ledger_walk_idle(c, count, lo, hi, NULL, 0);
    free(c);
    return DSIM_OK;
}

dsim_err dsim_ledger_list(const dsim_ledger *l, uint32_t epoch, int worker, uint32_t expected,
                          dsim_ledger_list_kind kind, uint64_t *ids, size_t cap, size_t *total)
{
    int lo = 0, hi = 0;
    DSIM_CHECK(ledger_range(l, epoch, worker, &lo, &hi));
    if (kind != DSIM_LEDGER_DUPLICATES && kind != DSIM_LEDGER_MISSES)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger list: kind %d is not duplicates (0) or misses (1)",
                        (int)kind);
    if ((ids == NULL && cap > 0) || total == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger list: ids (with cap > 0) and total needed");
    uint32_t *counts = malloc(2 * (size_t)l->n * sizeof *counts);
    if (counts == NULL)
        return DSIM_ERR(DSIM_ENOMEM, -1, "ledger list: no memory for %" PRIu64 " counters", l->n);
    uint32_t *rerun = counts + l->n;
    ledger_count(l, epoch, lo, hi, counts, rerun);
    dsim_err e = DSIM_OK;
    size_t k = 0;
    for (uint64_t id = 0; id < l->n; id++) {
        bool hit = kind == DSIM_LEDGER_DUPLICATES ? counts[id] > expected
                                                  : (uint64_t)counts[id] + rerun[id] < expected;
        if (!hit)
            continue;
        if (k < cap)
            ids[k] = id;
        k++;
    }
    free(counts);
    *total = k;
    return e;
}

dsim_err dsim_ledger_idle(const dsim_ledger *l, uint32_t epoch, int worker, dsim_idle *out,
                          size_t cap, size_t *total)
{
    int lo = 0, hi = 0;
    DSIM_CHECK(ledger_range(l, epoch, worker, &lo, &hi));
    if ((out == NULL && cap > 0) || total == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1, "ledger idle: out (with cap > 0) and total needed");
    ledger_cell *c;
    size_t count;
    DSIM_CHECK(ledger_cells(l, epoch, lo, hi, &c, &count));
    *total = (size_t)ledger_walk_idle(c, count, lo, hi, out, cap);
    free(c);
    return DSIM_OK;
}

dsim_err dsim_ledger_readers(const dsim_ledger *l, uint32_t epoch, uint64_t id, int *replicas,
                             size_t cap, size_t *total)
{
    int lo = 0, hi = 0;
    DSIM_CHECK(ledger_range(l, epoch, -1, &lo, &hi));
    if ((replicas == NULL && cap > 0) || total == NULL)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "ledger readers: replicas (with cap > 0) and total needed");
    size_t k = 0;
    for (int i = lo; i < hi; i++) {
        const ledger_log *g = &l->logs[i];
        size_t k0, k1;
        ledger_span(g, epoch, &k0, &k1);
        for (size_t j = k0; j < k1; j++) {
            const ledger_rec *rc = &g->recs[j];
            if (rc->epoch != epoch || rc->rerun_of == LEDGER_ROLLED_BACK)
                continue;
            for (uint64_t x = 0; x < rc->n; x++) {
                if (g->ids[rc->begin + x] != id)
                    continue;
                if (k < cap)
                    replicas[k] = i;
                k++;
            }
        }
    }
    *total = k;
    return DSIM_OK;
}
