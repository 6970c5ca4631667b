/* The observer of a run's steps (step rows, progress) and the
 * formation-progress thread: while the job forms, about once a second,
 * who is there and who is awaited -- never silence while a late worker is
 * waited for.
 *
 * The thread sleeps on a condition variable, not in ticks: the replica
 * whose first step completes the group wakes it, and so does the end of
 * training, so that a run never waits for it to notice; its only wake-ups
 * on the clock are the reports. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_int.h"

/* Every formation-progress thread of this process (dsim_harness_totals). */
static atomic_uint_fast64_t hf_threads, hf_wakeups, hf_reports, hf_idle, hf_late;

void h_observer(const dsim_train_step_info *info, void *user)
{
    h_run *r = user;
    if (r->formed && info->replica >= 0 && info->replica < r->replicas &&
        !atomic_exchange(&r->formed[info->replica], 1) &&
        atomic_fetch_add(&r->n_formed, 1) + 1 == r->replicas && r->forming_on) {
        /* the group is complete: the progress thread ends now */
        pthread_mutex_lock(&r->form_mu);
        pthread_cond_signal(&r->form_cv);
        pthread_mutex_unlock(&r->form_mu);
    }
    if (info->rerun) {
        /* A lost replica's step run again: the steps table keeps each
         * replica's own steps; the re-runs show in coverage and in node_loss. */
        atomic_fetch_add(&r->examples, info->examples);
        return;
    }
    if (r->store && !atomic_load(&r->store_failed)) {
        dsim_step_rec rec = {
            .replica = info->replica,
            .epoch = (int)info->epoch,
            .step = (int64_t)info->global_step,
            .loss = info->local_loss,
            .reduced_loss = info->loss,
            .checksum = info->checksum,
            .examples = (int64_t)info->examples,
            .t_start_ns = info->t_start,
            .t_end_ns = info->t_end,
        };
        dsim_err e = HG_STORE(dsim_store_step(r->store, r->id, &rec));
        if (e != DSIM_OK && atomic_exchange(&r->store_failed, 1) == 0)
            snprintf(r->store_err, sizeof r->store_err, "%s", dsim_errmsg());
    }
    uint64_t ex = atomic_fetch_add(&r->examples, info->examples) + info->examples;
    uint64_t seen = atomic_load(&r->steps_seen);
    while (info->global_step + 1 > seen &&
           !atomic_compare_exchange_weak(&r->steps_seen, &seen, info->global_step + 1))
        ;
    if (info->replica != 0 || !r->progress)
        return;
    dsim_harness_progress p = {
        .step = info->global_step + 1,
        .total = r->total,
        .loss = info->loss,
        .examples = ex,
        .elapsed_s = (double)(h_now_ns() - r->t0_ns) / 1e9,
    };
    r->progress(&p, r->progress_user);
}

/* One report: who has formed, who is awaited. */
static void h_forming_report(h_run *r, int n)
{
    dsim_harness_progress p = {.total = r->total,
                               .loss = NAN,
                               .elapsed_s = (double)(h_now_ns() - r->t0_ns) / 1e9,
                               .forming = true,
                               .formed = n,
                               .replicas = r->replicas};
    size_t o = 0;
    int listed = 0, left = 0;
    for (int i = 0; i < r->replicas; i++) {
        if (atomic_load(&r->formed[i]))
            continue;
        if (listed < 4 && o < sizeof p.awaiting) {
            o += (size_t)snprintf(p.awaiting + o, sizeof p.awaiting - o, "%sreplica %d (worker %d)",
                                  listed ? ", " : "", i, i / r->devices_per_host);
            listed++;
        } else {
            left++;
        }
    }
    if (left && o < sizeof p.awaiting)
        snprintf(p.awaiting + o, sizeof p.awaiting - o, " and %d more", left);
    r->progress(&p, r->progress_user);
}

static struct timespec h_ts(int64_t ns)
{
    return (struct timespec){.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
}

/* Until every replica has taken a step or training has ended: a report a
 * second (on wall time). */
static void *h_forming_main(void *arg)
{
    h_run *r = arg;
    atomic_fetch_add(&hf_threads, 1);
    int64_t next = r->t0_ns + 1000000000LL;
    pthread_mutex_lock(&r->form_mu);
    while (!r->form_stop && atomic_load(&r->n_formed) < r->replicas) {
        struct timespec until = h_ts(next);
        int rc = pthread_cond_timedwait(&r->form_cv, &r->form_mu, &until);
        atomic_fetch_add(&hf_wakeups, 1);
        int n = atomic_load(&r->n_formed);
        if (r->form_stop || n >= r->replicas) {
            if (rc != 0)
                atomic_fetch_add(&hf_late, 1); /* found the end on its own clock */
            break;
        }
        if (rc == 0 || h_now_ns() < next) {
            atomic_fetch_add(&hf_idle, 1); /* woken for nothing */
            continue;
        }
        pthread_mutex_unlock(&r->form_mu);
        h_forming_report(r, n);
        atomic_fetch_add(&hf_reports, 1);
        pthread_mutex_lock(&r->form_mu);
        next += 1000000000LL;
    }
    pthread_mutex_unlock(&r->form_mu);
    return NULL;
}

bool h_forming_start(h_run *r)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->form_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&r->form_mu, NULL);
    r->form_stop = false;
    r->forming_on = pthread_create(&r->forming, NULL, h_forming_main, r) == 0;
    if (!r->forming_on) {
        pthread_cond_destroy(&r->form_cv);
        pthread_mutex_destroy(&r->form_mu);
    }
    return r->forming_on;
}

void h_forming_stop(h_run *r)
{
    if (!r->forming_on)
        return;
    pthread_mutex_lock(&r->form_mu);
    r->form_stop = true;
    pthread_cond_signal(&r->form_cv);
    pthread_mutex_unlock(&r->form_mu);
    pthread_join(r->forming, NULL);
}

/* The thread's state is freed with the run: after h_forming_stop, and
 * only when no worker is stuck in the observer (which may signal it). */
void h_forming_destroy(h_run *r)
{
    if (!r->forming_on)
        return;
    r->forming_on = false;
    pthread_cond_destroy(&r->form_cv);
    pthread_mutex_destroy(&r->form_mu);
}

void dsim_harness_totals(dsim_harness_stats *out)
{
    if (!out)
        return;
    out->forming_threads = atomic_load(&hf_threads);
    out->forming_wakeups = atomic_load(&hf_wakeups);
    out->forming_reports = atomic_load(&hf_reports);
    out->forming_idle = atomic_load(&hf_idle);
    out->forming_late = atomic_load(&hf_late);
}
