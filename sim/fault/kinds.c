/* The fault kinds: one entry each, with its name and summary (what the
 * scenario format, `dsim list faults` and the messages say) and its
 * handlers: what it does to a frame on arrival (a link fault, called from
 * filter.c) and to a replica entering a phase (hooks.c). fault.h tells what
 * each kind does; fault_int.h what a handler may decide.
 *
 * fs_kind_get's switch has no default: a dsim_fault_what added to fault.h
 * without its entry here does not compile (-Wswitch, -Werror).
 *
 * Every handler runs with the faults' lock held. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dsim/rng.h"
#include "fault_int.h"

/* The frame is held until t for fault i, unless something holds it longer. */
static void frame_hold(fs_frame *fr, int64_t t, size_t i)
{
    if (t > fr->hold_until) {
        fr->hold_until = t;
        fr->hold_why = (int)i;
    }
}

/* Does fault i trigger for whichever replica gets there first? (A link
 * fault, or a fault on a parameter server, which has no phases of its own.) */
static bool first_there(dsim_faults *fs, size_t i, const fs_enter *e)
{
    fs_state *st = &fs->st[i];
    bool save = st->victim[e->r];
    st->victim[e->r] = true;
    bool hit = fs_triggers_locked(fs, i, e->r, e->p, e->gs, e->now);
    st->victim[e->r] = save;
    return hit;
}

/* ---- link faults ---- */

/* A link fault with a step or phase trigger starts when the first replica
 * gets there (a time trigger starts in filter.c; a probability is always
 * in force). */
static void link_phase(dsim_faults *fs, size_t i, fs_enter *e)
{
    const dsim_fault *f = &fs->list[i];
    if (fs->st[i].fired || (f->when != DSIM_WHEN_STEP && f->when != DSIM_WHEN_PHASE) ||
        !first_there(fs, i, e))
        return;
    fs_fire_locked(fs, i, e->now);
    if (fs->st[i].kind->cut && f->duration_ns == 0)
        fs_lost_locked(fs, f->link_from >= 0 ? f->link_to : fs_first_victim(fs, i), e->now);
    fs_event_locked(fs, (int)i, -1, e->now, "fault %zu (%s) starts at %s of step %" PRIu64, i,
                    dsim_fault_what_name(f->what), dsim_phase_name(e->p), e->gs);
}

static bool partition_frame(dsim_faults *fs, size_t i, fs_frame *fr)
{
    const dsim_fault *f = &fs->list[i];
    frame_hold(fr, f->duration_ns > 0 ? fs->st[i].t_fire + f->duration_ns : FS_FOREVER, i);
    return false;
}

static bool drop_frame(dsim_faults *fs, size_t i, fs_frame *fr)
{
    const dsim_fault *f = &fs->list[i];
    if (f->retransmit) {
        fs->stats.retransmitted++;
        frame_hold(fr, fr->now + (f->rto_ns > 0 ? f->rto_ns : FS_DEFAULT_RTO), i);
        return false;
    }
    fs->stats.dropped++;
    if (f->when != DSIM_WHEN_PROBABILITY || fs->stats.dropped <= 16)
        fs_event_locked(fs, (int)i, fr->src, fr->now,
                        "fault %zu dropped a frame %d -> %d (comm %" PRIu32 ", tag %" PRIu32
                        ", %zu bytes)",
                        i, fr->src, fr->dst, fr->hdr->comm_id, fr->hdr->tag, fr->len);
    return true;
}

static bool delay_frame(dsim_faults *fs, size_t i, fs_frame *fr)
{
    const dsim_fault *f = &fs->list[i];
    int64_t d = f->duration_ns;
    if (f->jitter_ns > 0)
        d += (int64_t)(fs_draw(fs, fr->l, fr->src, fr->dst, 0) * (double)f->jitter_ns);
    frame_hold(fr, fr->now + d, i);
    fs->stats.delayed++;
    return false;
}

static bool duplicate_frame(dsim_faults *fs, size_t i, fs_frame *fr)
{
    (void)fs;
    (void)i;
    fr->duplicate = true;
    return false;
}

static bool corrupt_frame(dsim_faults *fs, size_t i, fs_frame *fr)
{
    fr->corrupt = true;
    fs_event_locked(fs, (int)i, fr->src, fr->now,
                    "fault %zu corrupted a frame %d -> %d (comm %" PRIu32 ", tag %" PRIu32
                    ", %zu bytes)",
                    i, fr->src, fr->dst, fr->hdr->comm_id, fr->hdr->tag, fr->len);
    return false;
}

static bool reorder_frame(dsim_faults *fs, size_t i, fs_frame *fr)
{
    /* Held until the link's next frame has passed it (filter.c). */
    frame_hold(fr, FS_FOREVER, i);
    fs->stats.reordered++;
    return false;
}

/* ---- replica faults ---- */

/* kill and restart */
static void kill_phase(dsim_faults *fs, size_t i, fs_enter *e)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    if (st->fired && f->when != DSIM_WHEN_PROBABILITY)
        return;
    if (f->ps >= 0) {
        if (first_there(fs, i, e))
            fs_kill_locked(fs, i, fs->N + f->ps, e->now, "at its trigger");
        return;
    }
    if (!fs_triggers_locked(fs, i, e->r, e->p, e->gs, e->now))
        return;
    if (f->after_messages > 0) {
        /* counted down where its frames are sent (filter.c) */
        if (st->armed < 0) {
            st->armed = f->after_messages;
            st->armed_rank = e->r;
        }
        return;
    }
    fs_kill_locked(fs, i, e->r, e->now, "at its trigger");
    e->die = true;
}

static void pause_phase(dsim_faults *fs, size_t i, fs_enter *e)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    if (st->fired || !fs_triggers_locked(fs, i, e->r, e->p, e->gs, e->now))
        return;
    fs_fire_locked(fs, i, e->now);
    for (int k = 0; k < fs->R; k++) {
        if (!st->victim[k])
            continue;
        fs->pause_end[k] = f->duration_ns > 0 ? e->now + f->duration_ns : FS_FOREVER;
        if (f->duration_ns == 0)
            fs_lost_locked(fs, k, e->now);
        fs_event_locked(
            fs, (int)i, k, e->now, "fault %zu: rank %d paused at %s of step %" PRIu64 " (%s)", i, k,
            dsim_phase_name(e->p), e->gs, f->duration_ns > 0 ? "for a while" : "for good");
    }
}

static void slow_phase(dsim_faults *fs, size_t i, fs_enter *e)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    int r = e->r;
    if (!st->victim[r])
        return;
    if (!st->fired && fs_triggers_locked(fs, i, r, e->p, e->gs, e->now)) {
        fs_fire_locked(fs, i, e->now);
        fs_event_locked(fs, (int)i, r, e->now, "fault %zu: rank %d slowed %.1fx", i, r, f->factor);
    }
    /* its compute took (factor - 1) x as long again, charged as it leaves */
    if (st->fired && (f->duration_ns == 0 || e->now < st->t_fire + f->duration_ns) &&
        e->p == DSIM_PHASE_ALLREDUCE && e->prev == DSIM_PHASE_COMPUTE && fs->t_compute[r] > 0)
        e->slow_ns += (int64_t)((f->factor - 1.0) * (double)(e->now - fs->t_compute[r]));
}

static void stagger_phase(dsim_faults *fs, size_t i, fs_enter *e)
{
    const dsim_fault *f = &fs->list[i];
    int r = e->r;
    if (e->p != DSIM_PHASE_START || !fs->st[i].victim[r])
        return;
    int w = r / fs->D;
    dsim_rng g;
    dsim_rng_init(&g, fs->seed, "fault.stagger", (uint64_t)w);
    int64_t d = (int64_t)(dsim_rng_uniform(&g) * (double)f->duration_ns);
    if (e->now + d > e->sleep_until)
        e->sleep_until = e->now + d;
    if (r % fs->D == 0)
        fs_event_locked(fs, (int)i, r, e->now, "fault %zu: worker %d starts %.3f s late", i, w,
                        (double)d / 1e9);
}

/* ---- the table ---- */

#define FS_KIND(w, n, s, l)                                                                        \
    .info = {                                                                                      \
        .size = sizeof(dsim_fault_kind), .what = (w), .name = (n), .summary = (s), .loses = (l)}

static const fs_kind kind_kill = {
    FS_KIND(DSIM_FAULT_KILL, "kill",
            "a replica (every replica of a worker) stops as a killed process would",
            DSIM_FAULT_LOSES_PEER),
    .on_phase = kill_phase,
};
static const fs_kind kind_restart = {
    FS_KIND(DSIM_FAULT_RESTART, "restart",
            "a kill whose process comes back after duration, as a new incarnation",
            DSIM_FAULT_LOSES_PEER),
    .on_phase = kill_phase,
};
static const fs_kind kind_pause = {
    FS_KIND(DSIM_FAULT_PAUSE, "pause",
            "a replica stops answering for duration (0: for good); its frames are held",
            DSIM_FAULT_LOSES_PEER),
    .on_phase = pause_phase,
};
static const fs_kind kind_partition = {
    FS_KIND(DSIM_FAULT_PARTITION, "partition",
            "frames across a cut are held until it heals after duration, or lost (0)",
            DSIM_FAULT_LOSES_PEER),
    .on_frame = partition_frame,
    .on_phase = link_phase,
    .heals = true,
    .cut = true,
};
static const fs_kind kind_drop = {
    FS_KIND(DSIM_FAULT_DROP, "drop",
            "a frame is lost, or with retransmit: true arrives rto late as TCP's would",
            DSIM_FAULT_LOSES_MESSAGE),
    .on_frame = drop_frame,
    .on_phase = link_phase,
    .one_frame = true,
    .heals = true,
};
static const fs_kind kind_delay = {
    FS_KIND(DSIM_FAULT_DELAY, "delay", "frames are held latency (+ uniform jitter)",
            DSIM_FAULT_LOSES_NOTHING),
    .on_frame = delay_frame,
    .on_phase = link_phase,
};
static const fs_kind kind_duplicate = {
    FS_KIND(DSIM_FAULT_DUPLICATE, "duplicate",
            "a frame arrives twice (the copy is rejected as stale)", DSIM_FAULT_LOSES_NOTHING),
    .on_frame = duplicate_frame,
    .on_phase = link_phase,
    .one_frame = true,
    .heals = true,
};
static const fs_kind kind_corrupt = {
    FS_KIND(DSIM_FAULT_CORRUPT, "corrupt",
            "a frame arrives not matching its checksum: discarded, its receive fails",
            DSIM_FAULT_LOSES_MESSAGE),
    .on_frame = corrupt_frame,
    .on_phase = link_phase,
    .one_frame = true,
    .heals = true,
};
static const fs_kind kind_reorder = {
    FS_KIND(DSIM_FAULT_REORDER, "reorder",
            "a frame is overtaken by the next one on its link (the gap is detected)",
            DSIM_FAULT_LOSES_NOTHING),
    .on_frame = reorder_frame,
    .on_phase = link_phase,
    .one_frame = true,
    .heals = true,
};
static const fs_kind kind_slow = {
    FS_KIND(DSIM_FAULT_SLOW, "slow", "a rank computes factor times slower (a straggler)",
            DSIM_FAULT_LOSES_NOTHING),
    .on_phase = slow_phase,
};
static const fs_kind kind_stagger = {
    FS_KIND(DSIM_FAULT_STAGGER, "stagger", "workers start at seeded random times within duration",
            DSIM_FAULT_LOSES_NOTHING),
    .on_phase = stagger_phase,
};
static const fs_kind kind_preempt = {
    FS_KIND(DSIM_FAULT_PREEMPT, "preempt",
            "a preemption notice: grace_steps more, the chief saves, the job stops",
            DSIM_FAULT_LOSES_NOTHING),
    /* carried out by the driver (dsim_faults_attach sets preempt_after) */
};

const fs_kind *fs_kind_get(dsim_fault_what w)
{
    /* No default: every dsim_fault_what must be named here. */
    switch (w) {
    case DSIM_FAULT_KILL:
        return &kind_kill;
    case DSIM_FAULT_RESTART:
        return &kind_restart;
    case DSIM_FAULT_PARTITION:
        return &kind_partition;
    case DSIM_FAULT_DROP:
        return &kind_drop;
    case DSIM_FAULT_DELAY:
        return &kind_delay;
    case DSIM_FAULT_DUPLICATE:
        return &kind_duplicate;
    case DSIM_FAULT_CORRUPT:
        return &kind_corrupt;
    case DSIM_FAULT_REORDER:
        return &kind_reorder;
    case DSIM_FAULT_SLOW:
        return &kind_slow;
    case DSIM_FAULT_STAGGER:
        return &kind_stagger;
    case DSIM_FAULT_PAUSE:
        return &kind_pause;
    case DSIM_FAULT_PREEMPT:
        return &kind_preempt;
    case DSIM_FAULT_WHAT_COUNT:
        break;
    }
    return NULL;
}

const dsim_fault_kind *dsim_fault_kind_of(dsim_fault_what w)
{
    const fs_kind *k = fs_kind_get(w);
    return k ? &k->info : NULL;
}

const char *dsim_fault_what_name(dsim_fault_what w)
{
    const fs_kind *k = fs_kind_get(w);
    return k ? k->info.name : "unknown";
}

const char *dsim_fault_kind_list(char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return "";
    buf[0] = '\0';
    size_t o = 0;
    for (int w = 0; w < DSIM_FAULT_WHAT_COUNT && o < cap; w++) {
        int n = snprintf(buf + o, cap - o, "%s%s", w ? ", " : "",
                         dsim_fault_what_name((dsim_fault_what)w));
        if (n < 0)
            break;
        o += (size_t)n;
    }
    return buf;
}
