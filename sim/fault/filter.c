/* The fault layer as the transport's filter (dsim/spi/transport.h): every
 * frame, on arrival at a local endpoint of any backend, goes through
 *
 *   a dead end?            dropped (a dead process neither sends nor receives)
 *   a paused end?          held until the pause ends
 *   the link faults        each in force and matching acts (kinds.c): drop,
 *                          hold, duplicate, corrupt, reorder
 *   an overtaken frame?    a reordered frame waiting alone goes after this one
 *   the network model      held for its latency and time on the wire
 *   frames held already?   held behind them (order per link)
 *
 * and the frames it holds go on from held.c's worker. A kill armed to fire
 * after N frames counts them here as they are sent. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_int.h"

static bool fs_any_victim(const dsim_faults *fs, size_t i)
{
    for (int r = 0; r < fs->R; r++)
        if (fs->st[i].victim[r])
            return true;
    return false;
}

/* Does a link fault touch the frame src -> dst? */
static bool fs_link_matches(const dsim_faults *fs, size_t i, int src, int dst)
{
    const dsim_fault *f = &fs->list[i];
    const bool *v = fs->st[i].victim;
    if (f->link_from >= 0) {
        if (src == f->link_from && dst == f->link_to)
            return true;
        return !f->one_way && src == f->link_to && dst == f->link_from;
    }
    if (!fs_any_victim(fs, i))
        return true; /* no where: every link */
    if (fs->st[i].kind->cut)
        return v[src] != v[dst]; /* the cut: one end on each side */
    return v[src] || v[dst];
}

/* Is link fault i in force at `now`? (Probability faults always are.) A
 * time trigger fires here, with the first frame after it. */
static bool fs_active_locked(dsim_faults *fs, size_t i, int64_t now)
{
    const dsim_fault *f = &fs->list[i];
    fs_state *st = &fs->st[i];
    const fs_kind *k = st->kind;
    if (st->done)
        return false;
    if (f->when == DSIM_WHEN_PROBABILITY)
        return true;
    if (!st->fired && f->when == DSIM_WHEN_TIME && now - fs->t0 >= f->time_ns) {
        fs_fire_locked(fs, i, now);
        if (k->cut && f->duration_ns == 0)
            fs_lost_locked(fs, f->link_from >= 0 ? f->link_to : fs_first_victim(fs, i), now);
        fs_event_locked(fs, (int)i, -1, now, "fault %zu (%s) fired at %.3f s", i, k->info.name,
                        (double)(now - fs->t0) / 1e9);
    }
    if (!st->fired)
        return false;
    if (f->duration_ns > 0 && now >= st->t_fire + f->duration_ns && k->heals) {
        st->done = true;
        fs_event_locked(fs, (int)i, -1, now, "fault %zu (%s) healed after %.3f s", i, k->info.name,
                        (double)f->duration_ns / 1e9);
        return false;
    }
    return true;
}

static bool fs_dead_or_paused_locked(dsim_faults *fs, int r, int64_t now, int64_t *until)
{
    if (r < 0 || r >= fs->R)
        return false;
    if (fs->dead[r]) {
        *until = -1;
        return true;
    }
    if (fs->pause_end[r] > now) {
        if (fs->pause_end[r] > *until)
            *until = fs->pause_end[r];
        return true;
    }
    return false;
}

/* Reports the kills fired under the lock to the process hooks: called right
 * after unlocking. */
void fs_flush_kills(dsim_faults *fs)
{
    if (!fs->proc.on_kill)
        return;
    int ranks[8], n;
    dsim_waitq_lock(fs->q);
    n = fs->n_pending_kill;
    memcpy(ranks, fs->pending_kill, (size_t)n * sizeof ranks[0]);
    fs->n_pending_kill = 0;
    dsim_waitq_unlock(fs->q);
    for (int k = 0; k < n; k++)
        fs->proc.on_kill(fs->proc.user, ranks[k], "a kill fault");
}

/* A kill armed to fire after N frames of its phase counts the victim's
 * frames where they are sent: in its own process, whoever receives them. */
void fs_on_sent(void *user, dsim_ep *ep, const dsim_tp_hdr *hdr)
{
    dsim_faults *fs = user;
    int src = dsim_ep_rank(ep);
    if (src < 0 || src >= fs->R)
        return;
    bool fired = false;
    dsim_waitq_lock(fs->q);
    int64_t now = dsim_rt_now(fs->rt);
    dsim_msg_log_sent(fs->msgs, src, hdr, now);
    for (size_t i = 0; i < fs->n; i++) {
        fs_state *st = &fs->st[i];
        if (st->armed > 0 && st->armed_rank == src && --st->armed == 0) {
            st->armed = -1;
            fs_kill_locked(fs, i, src, now, "after its frames in the phase");
            fired = true;
        }
    }
    dsim_waitq_unlock(fs->q);
    if (fired)
        fs_flush_kills(fs);
}

/* The host a rank is on for the network model: a replica's worker, or a
 * parameter server's own host after the workers'. */
static int fs_net_host(const dsim_faults *fs, int r)
{
    return r < fs->N ? r / fs->D : fs->hosts + (r - fs->N);
}

/* A TPU slice's ICI: every replica's chip and coordinates, and a free time
 * for every directed link. */
static dsim_err fs_net_tpu_init(dsim_faults *fs)
{
    free(fs->ici_free);
    free(fs->tpu_chip);
    free(fs->tpu_coords);
    fs->ici_free = NULL;
    fs->tpu_chip = fs->tpu_coords = NULL;
    const dsim_tpu_topology *t = fs->net.tpu;
    if (!t)
        return DSIM_OK;
    if (t->replicas != fs->N || fs->P != 0 || fs->net.ici_Bps <= 0 || fs->net.chip_Bps <= 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "faults: TPU %s has %d replicas, the job %d and %d servers, or a link "
                        "has no bandwidth",
                        t->name, t->replicas, fs->N, fs->P);
    fs->ici_free = calloc((size_t)t->chips * DSIM_TPU_DIMS * 2, sizeof *fs->ici_free);
    fs->tpu_chip = calloc((size_t)fs->N, sizeof *fs->tpu_chip);
    fs->tpu_coords = calloc((size_t)fs->N * DSIM_TPU_DIMS, sizeof *fs->tpu_coords);
    if (!fs->ici_free || !fs->tpu_chip || !fs->tpu_coords)
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory for the ICI of %s", t->name);
    for (int r = 0; r < fs->N; r++) {
        dsim_tpu_place pl;
        DSIM_CHECK(dsim_tpu_place_of(t, r, &pl));
        fs->tpu_chip[r] = pl.chip;
        memcpy(&fs->tpu_coords[r * DSIM_TPU_DIMS], pl.coords, sizeof pl.coords);
    }
    return DSIM_OK;
}

dsim_err dsim_faults_set_network(dsim_faults *fs, const dsim_net_links *net)
{
    if (!fs || !net || net->inter_Bps < 0 || net->intra_Bps < 0 || net->inter_latency_ns < 0 ||
        net->intra_latency_ns < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "faults: the network model needs non-negative latencies and bandwidths");
    size_t n = (size_t)fs->hosts + (size_t)fs->P;
    free(fs->nic_out_free);
    free(fs->nic_in_free);
    free(fs->conn_n);
    free(fs->conn_slowest);
    free(fs->conn_total);
    free(fs->conn_max);
    fs->nic_out_free = calloc(n, sizeof *fs->nic_out_free);
    fs->nic_in_free = calloc(n, sizeof *fs->nic_in_free);
    fs->conn_n = calloc((size_t)fs->R, sizeof *fs->conn_n);
    fs->conn_slowest = calloc((size_t)fs->R, sizeof *fs->conn_slowest);
    fs->conn_total = calloc((size_t)fs->R, sizeof *fs->conn_total);
    fs->conn_max = calloc((size_t)fs->R, sizeof *fs->conn_max);
    if (!fs->nic_out_free || !fs->nic_in_free || !fs->conn_n || !fs->conn_slowest ||
        !fs->conn_total || !fs->conn_max) {
        free(fs->nic_out_free);
        free(fs->nic_in_free);
        free(fs->conn_n);
        free(fs->conn_slowest);
        free(fs->conn_total);
        free(fs->conn_max);
        fs->nic_out_free = fs->nic_in_free = NULL;
        fs->conn_n = fs->conn_slowest = NULL;
        fs->conn_total = fs->conn_max = NULL;
        return DSIM_ERR(DSIM_ENOMEM, -1, "faults: out of memory for the network model");
    }
    fs->net = *net;
    return fs_net_tpu_init(fs);
}

/* The link faults in force act on the frame, in the list's order; true when
 * one took it. */
static bool fs_link_faults_locked(dsim_faults *fs, fs_frame *fr)
{
    for (size_t i = 0; i < fs->n; i++) {
        const dsim_fault *f = &fs->list[i];
        const fs_kind *k = fs->st[i].kind;
        if (!k->on_frame || !fs_link_matches(fs, i, fr->src, fr->dst) ||
            !fs_active_locked(fs, i, fr->now))
            continue;
        if (f->when == DSIM_WHEN_PROBABILITY &&
            fs_draw(fs, fr->l, fr->src, fr->dst, f->correlation) >= f->probability)
            continue;
        if (k->one_frame && f->when != DSIM_WHEN_PROBABILITY && f->duration_ns == 0)
            fs->st[i].done = true;
        if (k->on_frame(fs, i, fr))
            return true;
    }
    return false;
}

/* A reordered frame waiting alone on this link is overtaken by this one:
 * both go through the worker, this one first. True when it was. */
static bool fs_overtake_locked(dsim_faults *fs, fs_frame *fr)
{
    fs_link *l = fr->l;
    if (!fs->any_reorder || l->held != 1 || fr->hold_until != 0)
        return false;
    size_t i = fs_reordered_at(fs, l);
    if (i == fs->nheld)
        return false;
    fs_held *r = fs_heap_take(fs, i);
    l->held--;
    l->last_due = fr->now;
    fs_hold_locked(fs, fr->ep, fr->hdr, fr->payload, fr->len, fr->now, -1, l);
    r->due = fr->now;
    r->why = -1;
    l->held++;
    fs_hold_insert_locked(fs, r);
    fs_event_locked(fs, -1, fr->src, fr->now,
                    "a frame %d -> %d was overtaken by the next one on its link", fr->src, fr->dst);
    return true;
}

/* The bytes a frame stands for: a virtual frame (timing only) carries its
 * length, not its bytes. */
static uint64_t fs_net_bytes(const fs_frame *fr)
{
    uint64_t bytes = fr->len;
    if ((fr->hdr->flags & DSIM_TP_F_VIRTUAL) && fr->len == sizeof bytes && fr->payload)
        memcpy(&bytes, fr->payload, sizeof bytes);
    return bytes;
}

/* The most hops of a path over a slice (every dimension end to end). */
#define FS_MAX_HOPS (3 * 1024)

/* A TPU slice: the frame crosses the ICI link by link (dimension-ordered,
 * the short way round a wrapped dimension), waiting for every link of its
 * path, or the chip's own link between its replicas. */
static void fs_net_tpu_locked(dsim_faults *fs, fs_frame *fr)
{
    const dsim_tpu_topology *t = fs->net.tpu;
    int src = fr->src, dst = fr->dst;
    fs_link *l = fr->l;
    int64_t now = fr->now, start = now > l->net_free ? now : l->net_free;
    uint64_t bytes = fs_net_bytes(fr) + sizeof *fr->hdr;
    if (fs->tpu_chip[src] == fs->tpu_chip[dst]) {
        int64_t end = start + (int64_t)llround((double)bytes / fs->net.chip_Bps * 1e9);
        l->net_free = end;
        if (end + fs->net.chip_latency_ns > fr->hold_until)
            fr->hold_until = end + fs->net.chip_latency_ns;
        return;
    }
    int path[FS_MAX_HOPS], n = 0;
    int c[DSIM_TPU_DIMS];
    memcpy(c, &fs->tpu_coords[src * DSIM_TPU_DIMS], sizeof c);
    const int *b = &fs->tpu_coords[dst * DSIM_TPU_DIMS];
    for (int d = 0; d < DSIM_TPU_DIMS; d++) {
        int D = t->dims[d], fwd = ((b[d] - c[d]) % D + D) % D, dir, steps;
        if (t->wrap[d]) {
            dir = fwd <= D - fwd ? 1 : -1;
            steps = fwd <= D - fwd ? fwd : D - fwd;
        } else {
            dir = b[d] >= c[d] ? 1 : -1;
            steps = (b[d] - c[d]) * dir;
        }
        for (int k = 0; k < steps && n < FS_MAX_HOPS; k++) {
            int chip = c[0] + t->dims[0] * (c[1] + t->dims[1] * c[2]);
            path[n++] = (chip * DSIM_TPU_DIMS + d) * 2 + (dir < 0);
            c[d] = ((c[d] + dir) % D + D) % D;
        }
    }
    for (int k = 0; k < n; k++)
        if (fs->ici_free[path[k]] > start)
            start = fs->ici_free[path[k]];
    int64_t end = start + (int64_t)llround((double)bytes / fs->net.ici_Bps * 1e9);
    l->net_free = end;
    for (int k = 0; k < n; k++)
        fs->ici_free[path[k]] = end;
    int64_t arrive = end + (int64_t)n * fs->net.ici_latency_ns;
    if (arrive > fr->hold_until)
        fr->hold_until = arrive;
}

/* The network: latency plus the frame's time on the wire, behind the
 * link's earlier frames and, between hosts, behind the other flows through
 * the two hosts' NICs. */
static void fs_net_locked(dsim_faults *fs, fs_frame *fr)
{
    if (fs->ici_free) {
        fs_net_tpu_locked(fs, fr);
        return;
    }
    int src = fr->src, dst = fr->dst;
    fs_link *l = fr->l;
    int64_t now = fr->now;
    int hs = fs_net_host(fs, src), hd = fs_net_host(fs, dst);
    bool cross = hs != hd;
    int64_t lat = cross ? fs->net.inter_latency_ns : fs->net.intra_latency_ns;
    double bw = cross ? fs->net.inter_Bps : fs->net.intra_Bps;
    int64_t start = now > l->net_free ? now : l->net_free;
    if (!l->net_up && cross) {
        /* The link's first frame waits for its connection, as on tcp:
         * the handshake (SYN, SYN-ACK) and dsim's hello and its reply,
         * two round trips, charged to the sending rank's set-up.
         * Devices of one host share its memory and connect nothing. */
        int64_t conn = 4 * lat;
        l->net_up = true;
        start += conn;
        fs->conn_n[src]++;
        fs->conn_total[src] += conn;
        if (fs->conn_n[src] == 1 || conn > fs->conn_max[src]) {
            fs->conn_max[src] = conn;
            fs->conn_slowest[src] = dst;
        }
    }
    if (cross) {
        if (fs->nic_out_free[hs] > start)
            start = fs->nic_out_free[hs];
        if (fs->nic_in_free[hd] > start)
            start = fs->nic_in_free[hd];
    }
    /* a virtual frame (timing only) stands for the length it carries */
    uint64_t bytes = fs_net_bytes(fr);
    int64_t wire = bw > 0 ? (int64_t)llround((double)(bytes + sizeof *fr->hdr) / bw * 1e9) : 0;
    int64_t end = start + wire;
    l->net_free = end;
    if (cross)
        fs->nic_out_free[hs] = fs->nic_in_free[hd] = end;
    if (end + lat > now && end + lat > fr->hold_until)
        fr->hold_until = end + lat;
}

/* What becomes of a frame (the lock held): passed on now, or taken (lost,
 * or held to be delivered later). */
static dsim_tp_filter_verdict fs_deliver_locked(dsim_faults *fs, fs_frame *fr)
{
    if (!fr->l || FS_FIU("dsim/tp/deliver")) {
        fs->stats.dropped++;
        return DSIM_TP_FILTER_TAKEN;
    }
    int64_t until = 0;
    bool a = fs_dead_or_paused_locked(fs, fr->src, fr->now, &until);
    bool b = fs_dead_or_paused_locked(fs, fr->dst, fr->now, &until);
    if ((a || b) && until < 0) {
        fs->stats.dropped++; /* a dead process neither sends nor receives */
        return DSIM_TP_FILTER_TAKEN;
    }
    if (a || b) {
        fs_hold_locked(fs, fr->ep, fr->hdr, fr->payload, fr->len, until, -2, fr->l);
        return DSIM_TP_FILTER_TAKEN;
    }
    fr->corrupt = FS_FIU("dsim/tp/corrupt") != 0;
    if (fs_link_faults_locked(fs, fr))
        return DSIM_TP_FILTER_TAKEN;
    if (fr->corrupt) {
        /* The payload no longer matches what the header says was sent. */
        dsim_tp_hdr *hdr = fr->hdr;
        hdr->flags = (uint16_t)((hdr->flags | DSIM_TP_F_CHECKSUM) & ~DSIM_TP_F_VERIFIED);
        hdr->checksum = dsim_tp_checksum(fr->payload, fr->len) ^ 0x5A5A5A5Au;
        fs->stats.corrupted++;
    }
    if (fs_overtake_locked(fs, fr))
        return DSIM_TP_FILTER_TAKEN;
    if (fs->nic_out_free)
        fs_net_locked(fs, fr);
    if (fr->hold_until > 0 || fr->l->held > 0) {
        if (fr->hold_until < fr->now)
            fr->hold_until = fr->now;
        fs_hold_locked(fs, fr->ep, fr->hdr, fr->payload, fr->len, fr->hold_until, fr->hold_why,
                       fr->l);
        return DSIM_TP_FILTER_TAKEN;
    }
    if (fr->duplicate) {
        /* The original goes now; the copy follows it on the same link. */
        fs->stats.duplicated++;
        fs_hold_locked(fs, fr->ep, fr->hdr, fr->payload, fr->len, fr->now, -1, fr->l);
    }
    return DSIM_TP_FILTER_PASS;
}

dsim_tp_filter_verdict fs_on_deliver(void *user, dsim_ep *ep, dsim_tp_hdr *hdr, const void *payload,
                                     size_t len)
{
    dsim_faults *fs = user;
    int src = hdr->src, dst = dsim_ep_rank(ep);
    if (src < 0 || src >= fs->R || dst < 0 || dst >= fs->R)
        return DSIM_TP_FILTER_PASS; /* the shared layer rejects it */
    dsim_waitq_lock(fs->q);
    int64_t now = dsim_rt_now(fs->rt);
    fs->stats.frames_seen++;
    fs_frame fr = {.ep = ep,
                   .hdr = hdr,
                   .payload = payload,
                   .len = len,
                   .src = src,
                   .dst = dst,
                   .l = fs_link_get(fs, src, dst),
                   .now = now,
                   .hold_why = -1};
    dsim_tp_filter_verdict v = fs_deliver_locked(fs, &fr);
    dsim_waitq_unlock(fs->q);
    if (v == DSIM_TP_FILTER_PASS)
        dsim_msg_log_arrived(fs->msgs, dst, hdr, now);
    if (fs->n_pending_kill)
        fs_flush_kills(fs);
    return v;
}

dsim_tp_filter_verdict fs_on_peer_lost(void *user, dsim_ep *ep, int peer, int blame, dsim_err code,
                                       const char *msg)
{
    dsim_faults *fs = user;
    int dst = dsim_ep_rank(ep);
    if (!fs->q || peer < 0 || peer >= fs->R || dst < 0 || dst >= fs->R)
        return DSIM_TP_FILTER_PASS;
    dsim_tp_filter_verdict v = DSIM_TP_FILTER_PASS;
    dsim_waitq_lock(fs->q);
    fs_link *l = fs_link_get(fs, peer, dst);
    /* What this link's frames wait for (a delay, a retransmission, the
     * network model, a pause, a partition) the break waits for too: the
     * frames left the peer before it closed. */
    if (l && l->held > 0 &&
        fs_hold_break_locked(fs, ep, peer, blame, code, msg, l, dsim_rt_now(fs->rt)))
        v = DSIM_TP_FILTER_TAKEN;
    dsim_waitq_unlock(fs->q);
    return v;
}

void fs_conn_stats(void *user, dsim_ep *ep, dsim_ep_conn_stats *out)
{
    dsim_faults *fs = user;
    int r = dsim_ep_rank(ep);
    if (!fs->conn_n || !fs->q || r < 0 || r >= fs->R)
        return;
    dsim_waitq_lock(fs->q);
    out->connections = fs->conn_n[r];
    out->total_ns = fs->conn_total[r];
    out->max_ns = fs->conn_max[r];
    out->slowest_peer = fs->conn_n[r] ? fs->conn_slowest[r] : -1;
    out->modelled = 1;
    dsim_waitq_unlock(fs->q);
}

dsim_err fs_attach(void *user, dsim_fabric *f)
{
    dsim_faults *fs = user;
    if (fs->fab)
        return DSIM_ERR(DSIM_ESTATE, -1, "faults: already attached to a running fabric");
    fs->fab = f;
    fs->rt = dsim_tp_fabric_rt(f);
    DSIM_CHECK(dsim_waitq_create(fs->rt, &fs->q));
    fs->stopping = false;
    fs->t0 = dsim_rt_now(fs->rt);
    dsim_err e = dsim_rt_spawn(fs->rt, FS_WORKER_ID, fs_worker_main, fs, &fs->worker);
    if (e != DSIM_OK) {
        dsim_waitq_destroy(fs->q);
        fs->q = NULL;
        fs->fab = NULL;
    }
    return e;
}

void fs_detach(void *user, dsim_fabric *f)
{
    dsim_faults *fs = user;
    (void)f;
    if (!fs->q)
        return;
    dsim_waitq_lock(fs->q);
    fs->stopping = true;
    dsim_waitq_wake(fs->q);
    dsim_waitq_unlock(fs->q);
    dsim_rt_join(fs->rt, fs->worker);
    fs->worker = NULL;
    fs_held_clear(fs);
    for (int h = 0; fs->nic_out_free && h < fs->hosts + fs->P; h++)
        fs->nic_out_free[h] = fs->nic_in_free[h] = 0;
    for (int k = 0; fs->ici_free && fs->net.tpu && k < fs->net.tpu->chips * DSIM_TPU_DIMS * 2; k++)
        fs->ici_free[k] = 0;
    for (int r = 0; fs->conn_n && r < fs->R; r++) {
        fs->conn_n[r] = 0;
        fs->conn_total[r] = fs->conn_max[r] = 0;
    }
    dsim_waitq_destroy(fs->q);
    fs->q = NULL;
    fs->fab = NULL;
    fs->rt = NULL; /* the job's, gone with it: later events are not traced */
}
