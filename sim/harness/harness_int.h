/* Inside the harness: what its files share.
 *
 *   harness.c    the public calls (harness.h): prepare, run, replay
 *   guard.c      the store guard (every store call of a run, and the
 *                shutdown that closes the stores) and the crash guard
 *   run.c        one run, step by step: store, form, train, reference,
 *                judge, record
 *   forming.c    the observer of the steps and the formation-progress
 *                thread
 *   record.c     what is stored with a run (configuration, flight
 *                records, phases, messages, metrics, the what-if lines)
 *   judge.c      the one-device baselines and the liveness phase
 *   supervise.c  the supervising parent process and the huge-page re-exec
 *                that a program running scenarios starts with
 *
 * and, above the calls of harness.h, what runs many scenarios:
 *   isolate.c      one run in a child process of its own (isolate.h)
 *   explore.c      dsim explore: fault schedules searched and shrunk
 *   shapes.c       dsim explore --shapes: sizes searched and shrunk
 *   conformance.c  dsim conformance: the battery fitted to a strategy and
 *                  run (conformance.h)
 *   battery.c      the battery's cases, one row each */
#ifndef DSIM_SIM_HARNESS_INT_H
#define DSIM_SIM_HARNESS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "check/check.h"
#include "engine/engine.h"
#include "fault/msglog.h"
#include "harness.h"
#include "model/costmodel.h"
#include "phase_rec.h"
#include "recovery.h"

static inline int64_t h_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- guard.c ---- */

/* The store guard's lock and whether the process is going down (no store
 * call any more). Every store call of a run goes through HG_STORE, which
 * holds the lock for reading; a thread that is about to end the process (an
 * interrupt) takes it for writing in dsim_harness_shutdown, so it closes
 * the stores only between calls, and no call starts afterwards. */
extern pthread_rwlock_t hg_lock;
extern bool hg_down;
void hg_init_once(void);

/* A store call of a run, refused once the process is going down. */
#define HG_STORE(call)                                                                             \
    ({                                                                                             \
        pthread_rwlock_rdlock(&hg_lock);                                                           \
        dsim_err hg_e_ =                                                                           \
            hg_down ? DSIM_ERR(DSIM_ESTATE, -1, "the process is shutting down") : (call);          \
        pthread_rwlock_unlock(&hg_lock);                                                           \
        hg_e_;                                                                                     \
    })

/* Registers a run in progress; the slot, or -1 when the table is full (the
 * run then goes on unguarded: a crash or an interrupt leaves it 'running'
 * until the store is next opened, which marks it 'unfinished'). */
int hg_run_add(dsim_store *st);
void hg_run_set_id(int slot, dsim_run_id id);
void hg_run_remove(int slot);
/* Installs the crash guard, once per process (harness.h, "Crashes"). */
void hg_guard_install_once(void);

/* ---- harness.c ---- */

typedef struct h_opts {
    dsim_store *store;
    const char *db_path;
    const char *engine;
    bool has_seed;
    uint64_t seed;
    dsim_harness_progress_fn progress;
    void *progress_user;
    int64_t grace_ns, progress_timeout_ns;
    bool no_crash_guard;
    const struct dsim_proc_hosts *hosts;
    bool reference_after;
    const char *transport;
    bool keep_params;
} h_opts;

/* The engine s runs on (a job over machines: the one that runs those). */
dsim_err h_engine_of(const dsim_scenario *s, const h_opts *o, const dsim_engine_ops **out);

/* The scenario of stored run `id` (harness.c). */
dsim_err h_stored_scenario(const char *db, dsim_run_id id, const dsim_stored_run *sr,
                           dsim_scenario **out);

/* out->harness_msg := "what: the calling thread's error", once. */
void h_fail(dsim_harness_result *out, const char *what);

/* ---- forming.c ---- */

/* What the observer shares with the run (heap: the workers reach it). */
typedef struct h_run {
    dsim_store *store; /* NULL: no store */
    dsim_run_id id;
    dsim_harness_progress_fn progress;
    void *progress_user;
    uint64_t total;
    int64_t t0_ns;
    atomic_uint_fast64_t examples;
    atomic_uint_fast64_t steps_seen; /* highest global step reported, + 1 */
    atomic_int store_failed;
    char store_err[400]; /* written once, by whoever sets store_failed */
    /* forming the group: which replicas have taken their first step */
    int replicas, devices_per_host;
    atomic_uchar *formed;
    atomic_int n_formed;
    /* the formation-progress thread: woken by the last replica to form
     * and by the end of training (form_stop), or once a second to report */
    bool forming_on;
    pthread_t forming;
    pthread_mutex_t form_mu;
    pthread_cond_t form_cv;
    bool form_stop; /* under form_mu */
} h_run;

/* The driver's observer (dsim_train_cfg.observer) for an h_run. */
void h_observer(const dsim_train_step_info *info, void *user);

/* Starts the formation-progress thread of r (r->formed set); false when it
 * could not. h_forming_stop wakes it and waits for it. */
bool h_forming_start(h_run *r);
void h_forming_stop(h_run *r);
/* Releases the thread's state (after h_forming_stop). */
void h_forming_destroy(h_run *r);

/* ---- record.c ---- */

/* The resolved configuration, as stored with the run. */
json_t *h_config_json(const dsim_scenario *s);
/* Whether the expect list has the check named so. */
bool h_expects(const dsim_scenario *s, const char *check);
dsim_err h_store_flight(dsim_store *st, dsim_run_id run, const dsim_train_result *res);
void h_store_stuck(dsim_store *st, const dsim_harness_result *out, int64_t t);
void h_store_phases(dsim_store *st, dsim_harness_result *out, const dsim_train_result *r);
dsim_err h_store_messages(dsim_msg_log *log, dsim_store *st, dsim_run_id run);
/* A message log that a worker left running may still write to: kept for
 * the life of the process. */
void h_keep_log(dsim_msg_log *log);
/* The bytes of gradients a replica all-reduces each step. */
size_t h_grad_bytes(const dsim_train_cfg *cfg, const dsim_train_result *res);
/* The exchange a run made, as the store, the report, the trace and the
 * what-if name it: the strategy's own (dsim_train_result.exchange: "ring",
 * or "reduce on sub-communicator ... + ..."), else what the scenario's
 * communication resolves to over its hosts (a run that failed before its
 * first exchange); NULL when there is none (one replica, parameter
 * servers). */
const char *h_exchange(const dsim_train_cfg *cfg, const dsim_train_result *res, int R, char *buf,
                       size_t cap);
/* out->whatif: what the modelled cluster would take, and the sources;
 * exchange as h_exchange says it. */
void h_whatif_summary(const dsim_scenario *s, const dsim_train_cfg *cfg, const dsim_perf *perf,
                      const char *exchange, dsim_harness_result *out);
/* The run's metrics (wall time, rates, losses, the performance figures). */
void h_store_metrics(dsim_store *st, const dsim_train_cfg *cfg, const dsim_train_result *res,
                     const dsim_train_result *ref, const dsim_perf *perf, int R,
                     dsim_harness_result *out);

/* ---- judge.c ---- */

/* A timing-only run's one-device baseline: the compute model's time for
 * the whole global batch of each step on one device, no exchange. */
dsim_err h_synthetic_reference(const dsim_train_cfg *cfg, const dsim_train_result *run,
                               dsim_train_result *ref);
/* The liveness phase, judged as one more outcome; the hash of its trace. */
uint64_t h_liveness(const dsim_scenario *s, const dsim_engine_ops *eng,
                    const dsim_train_cfg *run_cfg, dsim_harness_result *out);
/* What the settings guarantee after a node is lost; 0 when nothing bounds
 * it. */
int64_t h_detection_bound(const dsim_scenario *s, const dsim_train_result *broken, int lost);

/* ---- run.c ---- */

void h_run_one(const dsim_scenario *s, const h_opts *o, const dsim_engine_ops *eng, dsim_store *st,
               int slot, dsim_harness_result *out);

#endif
