/* cold_start (ARCHITECTURE.md §7, §8): how long the job takes to form. Per replica,
 * from the driver's phase times (dsim_train_replica_end.t_first, on the
 * engine's clock: wall under threads and processes, virtual under sim):
 *
 *   job start ──> start ──> rendezvous ──> [restore] ──> create_variables ──> first step done
 *              (late start)  (the group)    (checkpoint)  (chief's broadcast)  (one step)
 *
 * Connection set-up per peer runs inside those phases (a transport with
 * connections opens each pair at its first message: during the broadcast
 * and the first step), so it is judged on its own: each replica's slowest
 * connection by the end of its first step (measured on tcp, modelled by
 * the network model under sim and threads; none on bare inproc), held to
 * max_connect_s.
 *
 * Each phase's slowest replica is held to its own bound; the total (job
 * start until every replica finished its first step) to max_first_step_s
 * and to total_base_s + total_per_worker_s x workers, the growth a scenario
 * states. At least one bound must be set. */
#include <math.h>
#include <stdio.h>

#include "check/check_int.h"

enum {
    CS_START,
    CS_RENDEZVOUS,
    CS_RESTORE,
    CS_BROADCAST,
    CS_FIRST_STEP,
    CS_BASE,
    CS_PER_WORKER,
    CS_CONNECT
};

static const char *const cs_names[] = {"start", "rendezvous", "restore", "broadcast"};

/* The slowest replica's time in each phase, and the total, in seconds;
 * replicas that never did a first step are left out. */
typedef struct cs_times {
    double phase[4], total;
    int slowest[4], slowest_total;
    int counted;
    /* connections: the slowest one of any replica, whose and to whom */
    double conn_max;
    int conn_replica, conn_peer, conn_total, conn_modelled;
} cs_times;

static void cs_measure(const dsim_train_result *r, cs_times *t)
{
    *t = (cs_times){.total = -1, .slowest_total = -1, .conn_replica = -1, .conn_peer = -1};
    for (int k = 0; k < 4; k++) {
        t->phase[k] = 0;
        t->slowest[k] = -1;
    }
    for (int i = 0; r->replicas && i < r->num_replicas; i++) {
        const dsim_train_replica_end *e = &r->replicas[i];
        if (!e->t_first_step)
            continue;
        t->counted++;
        int64_t rdv = e->t_first[DSIM_PHASE_RENDEZVOUS], res = e->t_first[DSIM_PHASE_RESTORE],
                cv = e->t_first[DSIM_PHASE_CREATE_VARIABLES], c = e->t_first[DSIM_PHASE_COMPUTE];
        double d[4] = {
            (double)(e->t_first[DSIM_PHASE_START] - r->t_start) / 1e9,
            (double)((res ? res : cv) - rdv) / 1e9,
            res ? (double)(cv - res) / 1e9 : 0,
            (double)(c - cv) / 1e9,
        };
        for (int k = 0; k < 4; k++)
            if (t->slowest[k] < 0 || d[k] > t->phase[k]) {
                t->phase[k] = d[k];
                t->slowest[k] = i;
            }
        if (e->conn_count > 0) {
            t->conn_total += e->conn_count;
            t->conn_modelled |= e->conn_modelled;
            double cm = (double)e->conn_max_ns / 1e9;
            if (t->conn_replica < 0 || cm > t->conn_max) {
                t->conn_max = cm;
                t->conn_replica = i;
                t->conn_peer = e->conn_slowest_peer;
            }
        }
        double total = (double)(e->t_first_step - r->t_start) / 1e9;
        if (total > t->total) {
            t->total = total;
            t->slowest_total = i;
        }
    }
}

static dsim_err cs_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    const dsim_train_result *r = ctx->run;
    char *msg = out->message;
    size_t cap = sizeof out->message;
    out->passed = false;
    out->measured = NAN;
    out->expected = NAN;
    bool any = false;
    for (int k = CS_START; k <= CS_CONNECT; k++)
        any |= !DSIM_CHECK_UNSET(v[k]);
    if (!any) {
        dsim_check_msg(msg, cap,
                       "no bound to judge the start-up against: set cold_start.max_first_step_s, "
                       "a phase's max_*_s (max_connect_s for connections), or total_base_s / "
                       "total_per_worker_s");
        return DSIM_OK;
    }
    cs_times t;
    cs_measure(r, &t);
    if (t.counted == 0) {
        dsim_check_msg(msg, cap,
                       "no replica finished a first step, so the job never formed: see the run's "
                       "error and the replicas' phases");
        return DSIM_OK;
    }
    int workers = r->num_workers > 0 ? r->num_workers : r->num_replicas;
    double bound = v[CS_FIRST_STEP];
    bool has_growth = !DSIM_CHECK_UNSET(v[CS_BASE]) || !DSIM_CHECK_UNSET(v[CS_PER_WORKER]);
    double growth = (DSIM_CHECK_UNSET(v[CS_BASE]) ? 0 : v[CS_BASE]) +
                    (DSIM_CHECK_UNSET(v[CS_PER_WORKER]) ? 0 : v[CS_PER_WORKER]) * workers;
    if (has_growth && (DSIM_CHECK_UNSET(bound) || growth < bound))
        bound = growth;
    out->measured = t.total;
    out->expected = bound;
    bool ok = DSIM_CHECK_UNSET(bound) || t.total <= bound;
    dsim_check_msg(msg, cap, "first step done on all %d replica(s) after %.6g s (replica %d last)",
                   t.counted, t.total, t.slowest_total);
    if (!DSIM_CHECK_UNSET(bound))
        dsim_check_msg_append(msg, cap, ", %s the %.6g s allowed%s", ok ? "within" : "OVER", bound,
                              has_growth ? " (total_base_s + total_per_worker_s x workers)" : "");
    dsim_check_msg_append(msg, cap, "; slowest phases:");
    for (int k = 0; k < 4; k++) {
        double lim = v[CS_START + k];
        bool over = !DSIM_CHECK_UNSET(lim) && t.phase[k] > lim;
        ok &= !over;
        if (k == 2 && t.phase[k] == 0 && DSIM_CHECK_UNSET(lim))
            continue; /* no restore in this run */
        dsim_check_msg_append(msg, cap, " %s %.3g s (replica %d)%s", cs_names[k], t.phase[k],
                              t.slowest[k], over ? " OVER its bound" : "");
    }
    double clim = v[CS_CONNECT];
    if (t.conn_total > 0) {
        bool over = !DSIM_CHECK_UNSET(clim) && t.conn_max > clim;
        ok &= !over;
        dsim_check_msg_append(msg, cap,
                              "; %d connection(s) set up%s, the slowest %.3g s (replica %d to "
                              "peer %d)%s",
                              t.conn_total, t.conn_modelled ? " (modelled)" : "", t.conn_max,
                              t.conn_replica, t.conn_peer, over ? " OVER its bound" : "");
    } else if (!DSIM_CHECK_UNSET(clim)) {
        /* A bound on connections where the transport makes none would
         * pass unjudged: say so rather than pass in silence. */
        dsim_check_msg_append(msg, cap,
                              "; max_connect_s was set but no connection was set up (the inproc "
                              "transport shares memory: run on the processes engine, or give "
                              "the cluster a network model to have them modelled)");
        ok = false;
    }
    if (!ok)
        dsim_check_msg_append(msg, cap,
                              "; find what the slow phase waits for (a late worker, a peer that "
                              "is slow to accept connections, the chief's broadcast, a "
                              "checkpoint read) or relax the bound");
    out->passed = ok;
    return DSIM_OK;
}

const dsim_check_ops dsim_check_cold_start = {
    .size = sizeof(dsim_check_ops),
    .name = "cold_start",
    .summary = "each start-up phase (late start, rendezvous, restore, broadcast, connection "
               "set-up, first step) under its bound",
    .available = true,
    .n_params = 8,
    .params =
        {
            {"max_start_s", "seconds a worker may start after the job", 0, 86400, NAN, false},
            {"max_rendezvous_s", "seconds a replica may spend joining the group", 0, 86400, NAN,
             false},
            {"max_restore_s", "seconds a replica may spend restoring a checkpoint", 0, 86400, NAN,
             false},
            {"max_broadcast_s", "seconds for the chief's initial variables to reach a replica", 0,
             86400, NAN, false},
            {"max_first_step_s", "seconds until the first step is done on every replica", 0, 86400,
             NAN, false},
            {"total_base_s",
             "with total_per_worker_s: the first step done within base + "
             "per_worker x workers seconds",
             0, 86400, NAN, false},
            {"total_per_worker_s", "the growth per worker of that bound", 0, 86400, NAN, false},
            {"max_connect_s",
             "seconds a replica's slowest connection to a peer may take to set "
             "up",
             0, 86400, NAN, false},
        },
    .run = cs_run,
};
