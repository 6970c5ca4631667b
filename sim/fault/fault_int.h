/* Internal to sim/fault: the state of a fault list in a run, shared by its
 * files, and the table of fault kinds (kinds.c).
 *
 *   fault.c   the life of a dsim_faults: create, attach, restart, what fired;
 *             events; which ranks a fault acts on (its victims)
 *   kinds.c   one entry per fault kind: its name and summary, and its
 *             handlers: what it does to a frame, to a replica entering a phase
 *   filter.c  the transport filter: every frame on arrival, through the link
 *             faults in force, the network model, into the held frames or on
 *   held.c    per-link state, the held frames (a heap by due time) and the
 *             runtime worker that delivers them when due
 *   hooks.c   the driver's hooks: every replica entering every phase, through
 *             the triggers and the replica faults; kills, sleeps
 *
 * One lock (the wait queue fs->q, a leaf lock) guards all state: functions
 * named *_locked are called with it held. Nothing is delivered while it is
 * held: a held frame is unlinked, delivered unlocked, and only then does its
 * link stop counting it, so a frame arriving meanwhile is held behind it and
 * the link's order is kept. */
#ifndef DSIM_FAULT_INT_H
#define DSIM_FAULT_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsim/rng.h"
#include "dsim/rt.h"
#include "dsim/spi/transport.h"
#include "dsim_config.h"
#include "fault.h"
#include "msglog.h"

#if DSIM_HAVE_FIU && defined(FIU_ENABLE)
#include <fiu.h>
#define FS_FIU(name) fiu_fail(name)
#else
#define FS_FIU(name) 0
#endif

#define FS_WORKER_ID   (1 << 24)
#define FS_POLL_NS     (10LL * 1000 * 1000) /* a paused replica re-checks the job this often */
#define FS_DEFAULT_RTO (200LL * 1000 * 1000)
#define FS_FOREVER     INT64_MAX

typedef struct fs_link fs_link;

typedef struct fs_held {
    dsim_ep *ep;
    dsim_tp_hdr hdr;
    int64_t due;  /* FS_FOREVER: until released */
    uint64_t seq; /* order of holding: frames due together leave in it */
    union {
        fs_link *link;
        struct fs_held *next_free; /* on the free list of small frames */
    };
    int why; /* the fault index that held it, -1 (queued behind others), -2
                (a dead or paused end) or FS_HELD_BREAK */
    size_t len;
    unsigned char data[];
} fs_held;

/* A held entry that is no frame: the link broke (the peer closed or died)
 * after the frames held before it, and its receiver hears of it after them
 * (hdr.src is the peer; data holds an fs_break). */
#define FS_HELD_BREAK (-3)
typedef struct fs_break {
    int blame;
    dsim_err code;
    char msg[];
} fs_break;

/* Frames of up to FS_SMALL bytes (a timing-only frame carries 8) are held
 * in blocks of one size that are kept on a free list for the next one,
 * not given back to malloc each time. */
#define FS_SMALL 64

/* A heap entry: the key is kept beside the frame, so that ordering the
 * heap reads the heap's array only. */
typedef struct fs_hent {
    int64_t due;
    uint64_t seq;
    fs_held *h;
} fs_hent;

/* A slot of the link table: the key beside the link, so that probing reads
 * the table only. An empty slot has l == NULL. */
typedef struct fs_lslot {
    uint64_t key;
    fs_link *l;
} fs_lslot;

struct fs_link {
    uint64_t key; /* src * R + dst */
    dsim_rng rng;
    bool rng_ready;
    double last; /* the last uniform draw, for correlation */
    int held;    /* frames of this link in the held list or being delivered */
    int64_t last_due;
    int64_t net_free; /* the network model: when the link's last frame has left */
    bool net_up;      /* the network model: the link's connection is set up */
};

/* Links are made in chunks and never move (held frames point at them). */
#define FS_LCHUNK 4096
typedef struct fs_lchunk {
    struct fs_lchunk *next;
    size_t used;
    fs_link v[FS_LCHUNK];
} fs_lchunk;

/* A fault's life in the current run. */
typedef struct fs_kind fs_kind;
typedef struct fs_state {
    const fs_kind *kind; /* fs_kind_get(its what), looked up once */
    bool fired, done;
    int64_t t_fire;
    bool *victim;   /* [R] ranks it acts on */
    int64_t armed;  /* after_messages countdown once its phase is entered; -1 not armed */
    int armed_rank; /* the rank being counted */
    bool fired_before_restart;
} fs_state;

/* A revocation scheduled by a restart. */
typedef struct fs_timer {
    int64_t due;
    int rank;
    bool pending;
} fs_timer;

struct dsim_faults {
    /* hooks that were in the configuration before attach: called after
     * the faults' own phase hook (fs_phase) */
    const dsim_train_hooks *next_hooks;
    void *next_user;
    dsim_fault *list;
    size_t n;
    bool any_reorder; /* some fault reorders: a held frame may wait to be overtaken */
    uint64_t seed;
    int hosts, D, N, P, R;
    fs_state *st;
    /* per rank */
    bool *dead;
    int64_t *pause_end; /* 0 none; FS_FOREVER for good */
    int *phase;
    uint64_t *step;
    int64_t *t_compute;
    /* per link, made on first use: a hash table by src * R + dst (open
     * addressing, lcap a power of two), so that a job of 65,536 ranks pays
     * for the links it uses, not for R x R of them */
    fs_lslot *links;
    size_t lcap, lcount;
    fs_lchunk *lchunks;
    /* the run */
    dsim_rt *rt;
    dsim_fabric *fab;
    dsim_waitq *q;
    dsim_task *worker;
    bool stopping;
    int64_t t0;
    /* held frames: a 4-ary heap by (due, seq), so that a step in which
     * every one of thousands of ranks sends costs log n per frame */
    fs_hent *held;
    size_t nheld, capheld;
    fs_held *free_held; /* blocks for frames of up to FS_SMALL bytes */
    uint64_t hseq;
    fs_timer *timers;
    size_t n_timers;
    dsim_faults_stats stats;
    int64_t t_loss; /* absolute runtime time the first node was lost, or -1 */
    int lost_rank;
    bool loss_unreported; /* the next event says lost_rank was lost */
    dsim_fault_event *ev;
    size_t n_ev, cap_ev;
    dsim_train_hooks hooks;
    struct dsim_tp_filter filter;
    dsim_faults_process_hooks proc;
    /* the network model (dsim_faults_set_network); NULL arrays: none */
    dsim_net_links net;
    int64_t *nic_out_free, *nic_in_free; /* [hosts + P]: when each NIC is free */
    /* a TPU slice's ICI (net.tpu): when each directed link (chip x dimension
     * x direction) is free, and every replica's chip and coordinates */
    int64_t *ici_free;
    int *tpu_chip, *tpu_coords;
    /* [R]: the modelled connections each rank set up in this run */
    int *conn_n, *conn_slowest;
    int64_t *conn_total, *conn_max;
    int pending_kill[8]; /* kills to report to proc.on_kill once unlocked */
    /* written under q; read without it too, to skip fs_flush_kills */
    atomic_int n_pending_kill;
    dsim_msg_log *msgs; /* frames for the trace's arrows (msglog.h), or NULL */
};

/* ---- the fault kinds (kinds.c) ---- */

/* One frame as the link faults see it on arrival (filter.c), and what they
 * decide for it. */
typedef struct fs_frame {
    dsim_ep *ep; /* the receiving endpoint */
    dsim_tp_hdr *hdr;
    const void *payload;
    size_t len;
    int src, dst;
    fs_link *l;
    int64_t now;
    /* the decisions: hold until hold_until (0: do not hold) for fault
     * hold_why (-1: none); deliver a copy too; spoil its checksum */
    int64_t hold_until;
    int hold_why;
    bool duplicate, corrupt;
} fs_frame;

/* One replica entering a phase as the replica faults see it (hooks.c), and
 * what they decide for it. */
typedef struct fs_enter {
    int r;
    dsim_phase p;
    uint64_t gs;
    int64_t now;
    int prev; /* the phase it left */
    /* the decisions: it dies; it sleeps until sleep_until; it computed
     * slow_ns too fast (a straggler's extra time) */
    bool die;
    int64_t sleep_until, slow_ns;
} fs_enter;

/* A fault kind: what `what:` names, and how it acts. */
struct fs_kind {
    dsim_fault_kind info; /* name, summary, what it loses (fault.h) */
    /* A link fault: fault i, in force and matching the frame (drawn, for a
     * probability), acts on it. Returns true when it took the frame (lost
     * it). NULL for a replica fault. Locked. */
    bool (*on_frame)(dsim_faults *fs, size_t i, fs_frame *fr);
    /* Fault i, not done yet, sees replica e->r enter a phase. Link faults
     * start here when their trigger is a step or a phase. NULL: nothing to
     * do at phases (preempt: the driver carries it out). Locked. */
    void (*on_phase)(dsim_faults *fs, size_t i, fs_enter *e);
    /* Without a probability or a duration, it touches one frame, then is
     * done. */
    bool one_frame;
    /* Its duration is how long it lasts: it heals then (a delay's duration
     * is the latency it adds, for as long as the run). */
    bool heals;
    /* It cuts the ranks it names off from the others (a frame matches when
     * exactly one end is a victim, not either); for good, that loses a
     * node. */
    bool cut;
};

/* The kind of w, never NULL for a dsim_fault_what (dsim_faults_create
 * refuses any other value). */
const fs_kind *fs_kind_get(dsim_fault_what w);

/* ---- shared between the files ---- */

/* fault.c: records an event (and traces it), with the loss it reports. */
void fs_event_locked(dsim_faults *fs, int fault, int rank, int64_t now, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* fault.c: the first victim of fault i (-1: none). */
int fs_first_victim(const dsim_faults *fs, size_t i);

/* held.c: the state of link src -> dst, made on first use (NULL: out of
 * memory); a seeded, correlated uniform draw on it (netem's). */
fs_link *fs_link_get(dsim_faults *fs, int src, int dst);
double fs_draw(dsim_faults *fs, fs_link *l, int src, int dst, double corr);
/* held.c: holds a copy of the frame until due for fault why (-1 none, -2 a
 * dead or paused end, FS_HELD_BREAK a link's break, not counted as a
 * frame), behind the link's earlier frames; false (counted as dropped)
 * when out of memory. */
bool fs_hold_locked(dsim_faults *fs, dsim_ep *ep, const dsim_tp_hdr *hdr, const void *payload,
                    size_t len, int64_t due, int why, fs_link *l);
/* held.c: the index of the reordered frame waiting on link l for the next
 * one to pass it, or fs->nheld when none waits. */
size_t fs_reordered_at(const dsim_faults *fs, const fs_link *l);
/* held.c: holds the break of link l (from peer to ep) behind its held
 * frames, a reordered frame there going now (no next frame will pass it);
 * false when a frame there is held for good (a partition that never heals)
 * or out of memory: the break then goes at once. */
bool fs_hold_break_locked(dsim_faults *fs, dsim_ep *ep, int peer, int blame, dsim_err code,
                          const char *msg, fs_link *l, int64_t now);
/* held.c: holds h again (its due set), after every frame due no later. */
void fs_hold_insert_locked(dsim_faults *fs, fs_held *h);
/* held.c: takes held frame i out of the heap. */
fs_held *fs_heap_take(dsim_faults *fs, size_t i);
/* held.c: moves the held frames of fault why, or to or from rank, to due. */
void fs_release_locked(dsim_faults *fs, int64_t due, int rank, int why);
/* held.c: the runtime worker that delivers held frames and fires timers. */
void fs_worker_main(void *arg);
/* held.c: drops every held frame (counted) and forgets the links' timing,
 * when the fabric goes (the next one connects anew). */
void fs_held_clear(dsim_faults *fs);

/* filter.c: the transport filter's members (dsim/spi/transport.h). */
dsim_tp_filter_verdict fs_on_deliver(void *user, dsim_ep *ep, dsim_tp_hdr *hdr, const void *payload,
                                     size_t len);
void fs_on_sent(void *user, dsim_ep *ep, const dsim_tp_hdr *hdr);
dsim_tp_filter_verdict fs_on_peer_lost(void *user, dsim_ep *ep, int peer, int blame, dsim_err code,
                                       const char *msg);
void fs_conn_stats(void *user, dsim_ep *ep, dsim_ep_conn_stats *out);
dsim_err fs_attach(void *user, dsim_fabric *f);
void fs_detach(void *user, dsim_fabric *f);
/* filter.c: reports the kills fired under the lock to the process hooks;
 * called right after unlocking. */
void fs_flush_kills(dsim_faults *fs);

/* hooks.c: the driver's hooks (dsim_train_hooks). */
dsim_hook_action fs_phase(void *user, int r, dsim_phase p, uint64_t gs);
void fs_batch(void *user, int r, uint32_t epoch, uint64_t step, const uint64_t *ids, uint64_t n);
int fs_killed(void *user, int r);
/* hooks.c: the first node lost for good, if none was before. */
void fs_lost_locked(dsim_faults *fs, int rank, int64_t now);
/* hooks.c: fault i kills rank (a worker's every replica when it names a
 * worker); how: "at its trigger". */
void fs_kill_locked(dsim_faults *fs, size_t i, int rank, int64_t now, const char *how);
/* hooks.c: does replica-level fault i trigger for replica r entering phase p
 * at global step gs? */
bool fs_triggers_locked(dsim_faults *fs, size_t i, int r, dsim_phase p, uint64_t gs, int64_t now);
/* hooks.c: fault i fires now (counted once). */
void fs_fire_locked(dsim_faults *fs, size_t i, int64_t now);

#endif
