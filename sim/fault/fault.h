/* Fault injection (ARCHITECTURE.md §1, §7): what a scenario's `faults:` list does to
 * a running job.
 *
 * A dsim_faults object is made from the fault list of one run and wired
 * into the job's configuration (dsim_faults_attach): it becomes the fabric's
 * filter (dsim/spi/transport.h), which sees every frame as it arrives at a
 * local endpoint, and the driver's hooks (dsim_train_hooks), which see every
 * replica enter every phase. Between them they carry out each fault:
 *
 *   kill       the replica (or every replica of a worker) stops at the
 *              trigger as a killed process would (DSIM_HOOK_DIE), and every
 *              frame to or from it is dropped from then on
 *   restart    a kill whose process comes back after `duration`: the new
 *              incarnation is not part of the group, so the survivors'
 *              transport is revoked naming it ("peer 3 restarted"), as a
 *              reset connection does
 *   pause      the replica stops in its phase hook for `duration` (0: for
 *              good) and frames to and from it are held, then released in
 *              order: alive, but not answering
 *   partition  frames across the cut (a link, one way or both, or a rank /
 *              worker against everyone) are held until it heals after
 *              `duration`, or dropped for good (duration 0)
 *   drop       a frame is lost (the receiver sees the gap in the sequence
 *              numbers and fails the receive), or with `retransmit: true`
 *              is delivered late by `rto` as TCP's retransmission would
 *   delay      frames are held `latency` (+ uniform `jitter`)
 *   duplicate  a frame is delivered twice (the copy is rejected as stale)
 *   corrupt    a frame arrives with a payload that does not match its
 *              checksum: it is discarded and its receive fails
 *   reorder    a frame is held behind the next one of its link: the
 *              receiver sees the sequence gap and fails the receive
 *   slow       a replica (straggler) computes `factor` times slower, or a
 *              link carries frames `factor` times slower
 *   stagger    workers start at seeded random times within `duration`
 *   preempt    a preemption notice (TF's PreemptionCheckpointHandler) at a
 *              step: the replicas agree on a step, run `grace_steps` more,
 *              the chief saves, the job stops asking to be restarted
 *
 * Triggers: at a global step, at a phase (optionally of a given step, and
 * optionally after the replica sent `after_messages` frames in it), at a
 * time after the start, or per frame with a seeded probability (`loss`,
 * with netem's `correlation`). Scopes: a rank, a worker, a link, a list of
 * ranks, or one / all / a majority of the ranks drawn with the run's seed.
 *
 * Randomness: every draw comes from a stream keyed by (seed, "fault.*",
 * link or rank), never from libfiu's or the C library's generator; frames of
 * one link arrive in order, so a link's draws do not depend on scheduling.
 *
 * Each fault point is also a libfiu point (when built with libfiu), so a
 * unit test can arm it with fiu_enable() without a scenario:
 *   dsim/tp/deliver   fail (drop) a frame on arrival
 *   dsim/tp/corrupt   corrupt a frame on arrival
 *   dsim/coll/allreduce, dsim/phase/<phase>  kill the replica entering it
 *   dsim/ckpt/write   fail the chief's checkpoint write (DSIM_EIO)
 *
 * Thread-safety: every call but create/destroy may come from any worker. */
#ifndef DSIM_SIM_FAULT_H
#define DSIM_SIM_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsim/err.h"
#include "dsim/strategy.h"
#include "dsim/tpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_fault_what {
    DSIM_FAULT_KILL,
    DSIM_FAULT_RESTART,
    DSIM_FAULT_PARTITION,
    DSIM_FAULT_DROP,
    DSIM_FAULT_DELAY,
    DSIM_FAULT_DUPLICATE,
    DSIM_FAULT_CORRUPT,
    DSIM_FAULT_REORDER,
    DSIM_FAULT_SLOW,
    DSIM_FAULT_STAGGER,
    DSIM_FAULT_PAUSE,
    DSIM_FAULT_PREEMPT,
    DSIM_FAULT_WHAT_COUNT
} dsim_fault_what;

/* What a fault of a kind loses, which the job's settings must detect
 * (scenario/detect.c). */
typedef enum dsim_fault_loses {
    DSIM_FAULT_LOSES_NOTHING, /* it delays or disturbs; nothing needs detecting */
    DSIM_FAULT_LOSES_PEER,    /* a rank stops answering: timeout or health check */
    DSIM_FAULT_LOSES_MESSAGE, /* a frame never comes: only the timeout helps */
} dsim_fault_loses;

/* A fault kind as the scenario format, `dsim list faults` and the messages
 * name it. The table is in fault/kinds.c, with each kind's handlers. */
typedef struct dsim_fault_kind {
    size_t size; /* sizeof(dsim_fault_kind) */
    dsim_fault_what what;
    const char *name;    /* "kill": what a scenario's `what:` says */
    const char *summary; /* one line */
    dsim_fault_loses loses;
} dsim_fault_kind;

/* The kind of w; NULL when w is not a dsim_fault_what. */
const dsim_fault_kind *dsim_fault_kind_of(dsim_fault_what w);
/* The kinds' names for a message, in the enum's order ("kill, restart,
 * ..., preempt"), written into buf[cap] and returned. */
const char *dsim_fault_kind_list(char *buf, size_t cap);

typedef enum dsim_fault_when {
    DSIM_WHEN_STEP,        /* at global step N */
    DSIM_WHEN_PHASE,       /* at a named phase (optionally of step N) */
    DSIM_WHEN_TIME,        /* at time T after the start */
    DSIM_WHEN_PROBABILITY, /* each frame (or step, for kills) with probability p */
} dsim_fault_when;

typedef enum dsim_fault_scope {
    DSIM_SCOPE_GIVEN = 0, /* rank, worker, link or ranks as written */
    DSIM_SCOPE_ONE,       /* one rank drawn with the seed */
    DSIM_SCOPE_ALL,       /* every rank */
    DSIM_SCOPE_MAJORITY,  /* floor(N/2)+1 ranks drawn with the seed */
} dsim_fault_scope;

#define DSIM_FAULT_MAX_RANKS 64

/* One `faults:` entry: when, what, where. */
typedef struct dsim_fault {
    dsim_fault_what what;
    dsim_fault_when when;
    int64_t step;           /* WHEN_STEP; with WHEN_PHASE: the step, or -1 for the first */
    char *phase;            /* WHEN_PHASE: a dsim_phase name */
    int64_t time_ns;        /* WHEN_TIME */
    double probability;     /* WHEN_PROBABILITY (loss: for drops) */
    double correlation;     /* netem's: 0..1, how much a draw follows the last */
    int64_t after_messages; /* kill/restart/pause: after this many frames sent in the phase */
    int rank, worker, ps;   /* -1 when not given (ps: a parameter server) */
    int link_from, link_to; /* -1 when not a link */
    int ranks[DSIM_FAULT_MAX_RANKS];
    int n_ranks; /* `ranks: [...]` */
    dsim_fault_scope scope;
    bool one_way;    /* partition: only link_from -> link_to */
    bool retransmit; /* drop: deliver late by rto instead of losing it */
    int64_t
        duration_ns;   /* pause/partition/slow length, delay latency, stagger window; 0: for good */
    int64_t jitter_ns; /* delay */
    int64_t rto_ns;    /* drop with retransmit (default 200 ms, Linux's minimum RTO) */
    double factor;     /* slow: how many times slower */
    int64_t grace_steps; /* preempt: steps run after the notice before the save */
    int line, column;    /* where it was written, for messages (0: unknown) */
} dsim_fault;

/* "kill", "restart", ...; "unknown" when w is not a dsim_fault_what. */
const char *dsim_fault_what_name(dsim_fault_what w);

/* One thing that happened: a fault fired or healed, a frame it touched. */
typedef struct dsim_fault_event {
    int64_t t_ns;  /* from the start of the attempt's fabric */
    int64_t t_abs; /* on the job's runtime clock (the steps' clock) */
    int fault;     /* index in the list */
    int rank;      /* -1: not one rank */
    int lost;      /* the rank this process first saw lost for good with this
                      event (a kill, a pause or partition for good), else -1:
                      how a parent engine learns of losses its children see */
    char text[160];
} dsim_fault_event;

typedef struct dsim_faults dsim_faults;

/* Makes the fault state of one run: faults[0..n) (copied), the job's shape
 * and seed. */
dsim_err dsim_faults_create(const dsim_fault *faults, size_t n, uint64_t seed, int hosts,
                            int devices_per_host, int num_ps, dsim_faults **out);
void dsim_faults_destroy(dsim_faults *fs);

/* The job's links under the alpha-beta model (a scenario's cluster.network):
 * a frame between ranks of two hosts arrives after the inter-host latency
 * plus its bytes over the bandwidth, queued behind the earlier frames of its
 * link and of both hosts' NICs (a NIC carries one frame at a time each way);
 * a frame within a host uses the intra-host figures (0 and 0: at once). A
 * parameter server is a host of its own. Times are the engine's: virtual
 * under sim, real (the frame is held) on threads. */
typedef struct dsim_net_links {
    int64_t inter_latency_ns;
    double inter_Bps; /* 0: no time on the wire */
    int64_t intra_latency_ns;
    double intra_Bps;
    /* A TPU slice (dsim/tpu.h; NULL: none; it must outlive the run). Then
     * the hosts' NICs and links above are not used: a frame between the
     * replicas of two chips crosses the ICI hop by hop, dimension by
     * dimension (x, y, z), the short way round where a dimension wraps; it
     * waits until every directed link of its path is free, holds them for
     * its bytes over ici_Bps and arrives a hop latency per link later. A
     * frame between the replicas of one chip takes the chip's own link
     * (chip_*). ICI links need no connection set-up. */
    const dsim_tpu_topology *tpu;
    int64_t ici_latency_ns;
    double ici_Bps;
    int64_t chip_latency_ns;
    double chip_Bps;
} dsim_net_links;
dsim_err dsim_faults_set_network(dsim_faults *fs, const dsim_net_links *net);

/* Points cfg's transport filter and hooks at fs (fs must outlive the run).
 * Hooks cfg had before are kept: their phase hook is called after the
 * faults' own for a replica that goes on. */
void dsim_faults_attach(dsim_faults *fs, dsim_train_cfg *cfg);

/* Logs every frame the filter sees into log (sim/fault/msglog.h; NULL:
 * none), from the next frame on. log must outlive the run. */
struct dsim_msg_log;
void dsim_faults_set_msg_log(dsim_faults *fs, struct dsim_msg_log *log);

/* For a job spread over processes (the processes engine): what to do when a
 * kill fires for a rank (this process's or another's, e.g. a kill armed
 * after N messages seen arriving here) and when a replica of this process
 * pauses. NULL members: act within the process (the threads engine). The
 * callbacks are called with no lock held; on_kill for a local rank need not
 * return (the process dies). */
typedef struct dsim_faults_process_hooks {
    void (*on_kill)(void *user, int rank, const char *why);
    void (*on_pause)(void *user, int rank, int64_t duration_ns);
    void *user;
} dsim_faults_process_hooks;
void dsim_faults_set_process_hooks(dsim_faults *fs, const dsim_faults_process_hooks *h);

/* Marks faults as done before a run: done[i] for each of the n faults
 * (a restarted job does not see again what fired in an earlier attempt). */
void dsim_faults_mark_done(dsim_faults *fs, const bool *done, size_t n);
/* done[i] = fault i fired in this run or an earlier one. */
void dsim_faults_fired(dsim_faults *fs, bool *done, size_t n);

/* The last attempt stopped for a preemption notice after at_step steps:
 * its preempt faults have fired. */
void dsim_faults_preempted(dsim_faults *fs, uint64_t at_step);

/* Forgets what fired, for a restarted job: a fault that fired does not fire
 * again (a recovered job runs with the faults that are still to come). */
void dsim_faults_rearm_for_restart(dsim_faults *fs);

/* Events so far, in the order they happened (valid until the next call or
 * destroy). */
size_t dsim_faults_events(dsim_faults *fs, const dsim_fault_event **out);

/* The first node lost for good in the last run (killed, paused for good,
 * cut off by a lasting partition): its rank (-1: none, or not one rank) and
 * *t_abs the runtime time it happened (-1: nothing was lost). */
int dsim_faults_first_loss(dsim_faults *fs, int64_t *t_abs);

/* 1 if the rank was killed (or is still paused) in the last run. */
int dsim_faults_rank_lost(dsim_faults *fs, int rank);

/* Counters of the last run. */
typedef struct dsim_faults_stats {
    uint64_t fired;       /* faults that fired */
    uint64_t frames_seen; /* frames the filter saw */
    uint64_t dropped, delayed, duplicated, corrupted, reordered, held;
    uint64_t retransmitted; /* drops delivered late (retransmit: true) */
} dsim_faults_stats;
void dsim_faults_get_stats(dsim_faults *fs, dsim_faults_stats *out);
/* sum += add, counter by counter. */
void dsim_faults_stats_add(dsim_faults_stats *sum, const dsim_faults_stats *add);
/* Did a fault fire or touch a frame (dropped, delayed, ...)? */
bool dsim_faults_stats_touched(const dsim_faults_stats *s);

#ifdef __cplusplus
}
#endif
#endif
