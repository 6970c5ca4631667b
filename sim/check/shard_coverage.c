/* shard_coverage (ARCHITECTURE.md §8): from the run's ledger, per epoch, every
 * example is read exactly as often as the shard policy says — once, or once
 * per worker when nothing is sharded (OFF, or HINT without a placeholder) —
 * and no replica sits idle or carries far more than another beyond the
 * scenario's thresholds. A strategy that distributes its own input (its
 * input_fn, distribute_datasets_from_function) must read every example once
 * per epoch, and a failure says which of the common input_fn bugs the reads
 * look like (every pipeline reads everything; pipelines numbered per
 * replica; the remainder of an uneven split dropped).
 *
 * Each threshold is judged on the worst epoch. The measured/expected pair is
 * that of the first threshold broken, in the order duplicates, misses, idle,
 * imbalance (so the table shows what failed); when none is broken it is the
 * worst epoch's examples not read exactly as expected against
 * max_duplicates + max_misses. A threshold at DSIM_CHECK_NO_LIMIT or above
 * is no limit. Ids outside the dataset always fail the check.
 *
 * Across a restart (recovery: restart) coverage is Keras BackupAndRestore's:
 * the steps after the checkpoint a restart resumes from are run again, so
 * their examples are read again; the steps rolled back do not count. The
 * harness gives the run's ledger over the committed steps of every attempt
 * (dsim_ledger_copy_steps), and every example must be read exactly once
 * there; the re-reads of rolled-back steps are reported as such. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check/check_int.h"
#include "dsim/data.h"

enum { SC_MAX_DUP, SC_MAX_MISS, SC_MAX_IDLE, SC_MAX_IMBALANCE };

#define SC_LIST    5  /* ids named in a message */
#define SC_READERS 16 /* reads of one id named */

static bool sc_over(double value, double limit)
{
    return limit < DSIM_CHECK_NO_LIMIT && value > limit;
}

static void sc_list_ids(const dsim_ledger *l, uint32_t epoch, uint32_t expected,
                        dsim_ledger_list_kind kind, char *msg, size_t cap)
{
    uint64_t ids[SC_LIST];
    size_t total = 0;
    if (dsim_ledger_list(l, epoch, -1, expected, kind, ids, SC_LIST, &total) != DSIM_OK)
        return;
    size_t n = total < SC_LIST ? total : SC_LIST;
    for (size_t i = 0; i < n; i++)
        dsim_check_msg_append(msg, cap, "%s%" PRIu64, i ? ", " : " (ids ", ids[i]);
    if (n)
        dsim_check_msg_append(msg, cap, "%s)", total > n ? ", ..." : "");
}

/* "replicas 0 and 2", "replica 1 twice", "replicas 0, 1 and 3": who read an
 * example, one entry per read (sorted by replica). */
static void sc_readers(const int *who, size_t nw, int devices, char *msg, size_t cap)
{
    int uniq[SC_READERS], times[SC_READERS];
    size_t nu = 0;
    for (size_t k = 0; k < nw; k++) {
        if (nu && uniq[nu - 1] == who[k])
            times[nu - 1]++;
        else if (nu < SC_READERS) {
            uniq[nu] = who[k];
            times[nu++] = 1;
        }
    }
    if (nu == 1) {
        dsim_check_msg_append(msg, cap, "replica %d (worker %d) %d times", uniq[0],
                              uniq[0] / devices, times[0]);
        return;
    }
    dsim_check_msg_append(msg, cap, "replicas ");
    for (size_t k = 0; k < nu; k++) {
        dsim_check_msg_append(msg, cap, "%s%d",
                              k == 0        ? ""
                              : k + 1 == nu ? " and "
                                            : ", ",
                              uniq[k]);
        if (times[k] > 1)
            dsim_check_msg_append(msg, cap, " (%d times)", times[k]);
    }
    /* the workers, when replicas of more than one read it */
    int w0 = uniq[0] / devices, same = 1;
    for (size_t k = 1; k < nu; k++)
        same &= uniq[k] / devices == w0;
    if (devices > 1 && !same) {
        dsim_check_msg_append(msg, cap, " (workers ");
        for (size_t k = 0; k < nu; k++)
            dsim_check_msg_append(msg, cap, "%s%d",
                                  k == 0        ? ""
                                  : k + 1 == nu ? " and "
                                                : ", ",
                                  uniq[k] / devices);
        dsim_check_msg_append(msg, cap, ")");
    }
}

/* 1 when who[0..nw) (sorted) is every replica of one worker, once each:
 * the read pattern of a host whose cores are all fed its whole pipeline. */
static int sc_once_per_device(const int *who, size_t nw, int devices)
{
    if (devices < 2 || nw != (size_t)devices || who[0] % devices != 0)
        return 0;
    for (size_t k = 1; k < nw; k++)
        if (who[k] != who[0] + (int)k)
            return 0;
    return 1;
}

/* The duplicated examples of an epoch with the replicas that read them:
 * "example 3 by replicas 0 and 2; example 7 by replica 1 (worker 0) 2 times;
 * ... and 59 more", then the replicas the first ones have in common.
 * Returns 1 when every example listed was read once by each replica of its
 * worker (*per_device: the message then says why). */
static int sc_list_dups(const dsim_ledger *l, uint32_t epoch, uint32_t expected, int devices,
                        char *msg, size_t cap)
{
    uint64_t ids[SC_LIST];
    size_t total = 0;
    if (dsim_ledger_list(l, epoch, -1, expected, DSIM_LEDGER_DUPLICATES, ids, SC_LIST, &total) !=
        DSIM_OK)
        return 0;
    size_t n = total < SC_LIST ? total : SC_LIST;
    if (devices < 1)
        devices = 1;
    int first[SC_READERS], nfirst = -1, same_set = 1, per_device = n > 0;
    for (size_t i = 0; i < n; i++) {
        int who[SC_READERS];
        size_t nw = 0;
        dsim_check_msg_append(msg, cap, "%sexample %" PRIu64 " by ", i ? "; " : ": ", ids[i]);
        if (dsim_ledger_readers(l, epoch, ids[i], who, SC_READERS, &nw) != DSIM_OK || nw == 0) {
            dsim_check_msg_append(msg, cap, "?");
            same_set = 0;
            continue;
        }
        if (nw > SC_READERS)
            nw = SC_READERS;
        per_device &= expected == 1 && sc_once_per_device(who, nw, devices);
        sc_readers(who, nw, devices, msg, cap);
        if (nfirst < 0) {
            memcpy(first, who, nw * sizeof *who);
            nfirst = (int)nw;
        } else if ((int)nw != nfirst || memcmp(first, who, nw * sizeof *who) != 0) {
            same_set = 0;
        }
    }
    if (total > n)
        dsim_check_msg_append(msg, cap, "; and %zu more", total - n);
    if (per_device)
        return 1;
    if (n > 1 && same_set && nfirst > 1)
        dsim_check_msg_append(msg, cap,
                              ". The same replicas read each of these: their shards "
                              "overlap");
    return 0;
}

/* After "N of M examples read more than once": which examples, by whom,
 * and why: every device of a host fed its host's whole pipeline (each
 * example read once per device), or the shard policy (and, after a
 * restart, where it resumed). */
static void sc_why_dup(const dsim_check_ctx *ctx, const dsim_coverage *c, uint32_t expected,
                       int restarts, char *msg, size_t cap)
{
    const dsim_train_result *r = ctx->run;
    char list[sizeof((dsim_check_result *)0)->message];
    list[0] = '\0';
    int per_device =
        sc_list_dups(r->ledger, c->epoch, expected, r->devices_per_host, list, sizeof list);
    if (per_device && c->reads == c->n_examples * (uint64_t)r->devices_per_host) {
        /* the reason first: the listing would not leave room for it */
        dsim_check_msg_append(
            msg, cap,
            ": each was read once per device (core) of its host, by all %d of them: every "
            "device is fed its host's whole input pipeline instead of its share (with one "
            "pipeline per host, TPUStrategy's num_input_pipelines = hosts, a host's batch "
            "is split over its devices)%s",
            r->devices_per_host, list);
        return;
    }
    dsim_check_msg_append(msg, cap, "%s", list);
    if (c->misses)
        dsim_check_msg_append(msg, cap, "; %" PRIu64 " read less", c->misses);
    if (restarts)
        dsim_check_msg_append(msg, cap,
                              "; over the committed steps of the job's %d attempts, so not the "
                              "re-run of rolled-back steps: check the shard policy (%s applied) "
                              "and where the restart resumed",
                              restarts + 1, dsim_shard_policy_name(r->shard_applied));
    else
        dsim_check_msg_append(msg, cap, "; check the shard policy (%s applied)",
                              dsim_shard_policy_name(r->shard_applied));
}

/* Why examples were read less than expected: a node lost and the job
 * finished without it, a restart that did not run again what it rolled
 * back, or examples left to nobody. */
static void sc_why_missed(const dsim_check_ctx *ctx, int restarts, char *msg, size_t cap)
{
    const dsim_train_result *r = ctx->run;
    const dsim_check_faults *fx = ctx->faults;
    if (fx && fx->lost && !restarts) {
        char lost[160];
        dsim_check_ranks_text(fx->lost, fx->n_ranks, r->num_replicas, r->devices_per_host, lost,
                              sizeof lost);
        bool many = strstr(lost, "ranks ") == lost;
        dsim_check_msg_append(msg, cap,
                              "; %s %s lost and the job finished without reading what was left "
                              "to %s: a synchronous job must fail (or restart) when a replica is "
                              "lost, not end short of data",
                              lost, many ? "were" : "was", many ? "them" : "it");
    } else if (restarts) {
        dsim_check_msg_append(msg, cap,
                              " over the committed steps of the job's %d attempts (each one's up "
                              "to the checkpoint the next resumed from); a restart must run again "
                              "every step after that checkpoint, or examples were dropped "
                              "(drop_remainder, or shards that leave examples to nobody)",
                              restarts + 1);
    } else {
        dsim_check_msg_append(msg, cap,
                              "; examples were dropped (drop_remainder, or shards that leave "
                              "examples to nobody)");
    }
}

/* What a strategy's own input_fn (distribute_datasets_from_function) did
 * wrong, from epoch c's counts: the three ways such a function commonly
 * goes wrong are told apart by the shape of the reads. */
static void sc_input_fn_why(const dsim_train_result *r, const dsim_coverage *c, char *msg,
                            size_t cap)
{
    uint64_t n = c->n_examples;
    int W = r->num_workers > 0 ? r->num_workers : 1;
    int N = r->num_replicas > 0 ? r->num_replicas : 1;
    dsim_coverage all;
    if (W > 1 && dsim_ledger_coverage(r->ledger, c->epoch, -1, (uint32_t)W, &all) == DSIM_OK &&
        all.exact == n) {
        dsim_check_msg_append(msg, cap,
                              "; every example was read %d times, once by each of the %d input "
                              "pipelines: the strategy's input_fn does not shard by "
                              "input_context.input_pipeline_id (every worker reads the whole "
                              "dataset); shard it num_input_pipelines ways",
                              W, W);
        return;
    }
    double want = (double)n * W / N;
    if (c->misses && !c->duplicates && N > W && fabs((double)c->reads - want) <= N) {
        dsim_check_msg_append(
            msg, cap,
            "; only %" PRIu64 " of %" PRIu64 " examples were read, each once: %d/%d of the "
            "dataset, as if it were split into num_replicas_in_sync (%d) shards of which "
            "only the first %d are read: the strategy's input_fn numbers its pipelines per "
            "replica, but there is one pipeline per worker (num_input_pipelines %d); shard "
            "by num_input_pipelines and input_pipeline_id",
            c->reads, n, W, N, N, W, W);
        return;
    }
    uint64_t ids[64];
    size_t total = 0;
    if (c->misses && !c->duplicates && c->misses < (uint64_t)W &&
        dsim_ledger_list(r->ledger, c->epoch, -1, 1, DSIM_LEDGER_MISSES, ids, 64, &total) ==
            DSIM_OK &&
        total == c->misses && ids[0] == n - total && ids[total - 1] == n - 1) {
        dsim_check_msg_append(msg, cap,
                              "; the dataset's last %zu example(s) (ids %" PRIu64 "..%" PRIu64
                              ") were read by nobody: the strategy's input_fn gives each of "
                              "the %d pipelines %" PRIu64 " / %d examples rounded down and "
                              "drops the remainder of the uneven split; give the first n %% %d "
                              "pipelines one example more (dsim_strategy_shard_range)",
                              total, n - total, n - 1, W, n, W, W);
        return;
    }
    dsim_check_msg_append(msg, cap,
                          "; the batches are the strategy's own (its input_fn, "
                          "distribute_datasets_from_function): look at which ids it lists for "
                          "each input pipeline and epoch");
}

/* The verdict when every threshold holds. */
static void sc_passed(const dsim_check_ctx *ctx, const char *reads, uint32_t epochs,
                      uint64_t worst_bad, const dsim_coverage *idle, const dsim_coverage *imb,
                      const uint64_t counts[3], char *msg, size_t cap)
{
    const dsim_train_result *r = ctx->run;
    int restarts = ctx->faults ? ctx->faults->restarts : 0;
    uint64_t reruns = counts[0], rolled = counts[1], rolled_steps = counts[2];
    char sharding[48];
    snprintf(sharding, sizeof sharding, "%s sharding", dsim_shard_policy_name(r->shard_applied));
    dsim_check_msg(msg, cap,
                   "%" PRIu32 " epoch%s: every example read %s%s (%s, %d replica%s); "
                   "in any epoch at most %" PRIu64 " idle (step, replica) pair%s and a load "
                   "imbalance of %.3g",
                   epochs, epochs == 1 ? "" : "s", reads, worst_bad ? " within the thresholds" : "",
                   r->input_from_strategy ? "the strategy's own input_fn" : sharding,
                   r->num_replicas, r->num_replicas == 1 ? "" : "s", idle->idle,
                   idle->idle == 1 ? "" : "s", imb->imbalance);
    if (restarts)
        dsim_check_msg_append(msg, cap, "; over the committed steps of %d attempts", restarts + 1);
    if (rolled)
        dsim_check_msg_append(msg, cap,
                              "; %" PRIu64 " example read(s) of %" PRIu64
                              " step(s) that %d restart(s) rolled back were read again after it "
                              "(BackupAndRestore runs the steps after the checkpoint again; they "
                              "count once)",
                              rolled, rolled_steps, restarts);
    if (reruns)
        dsim_check_msg_append(msg, cap,
                              "; %" PRIu64 " example read(s) repeated because a lost replica's "
                              "step ran again (at least once, as re-run closures are)",
                              reruns);
    if (r->padded_total)
        dsim_check_msg_append(msg, cap,
                              "; %" PRIu64 " padding rows computed to fill static batches, "
                              "masked and not counted as read",
                              r->padded_total);
}

static dsim_err sc_run(const dsim_check_ctx *ctx, const double *v, dsim_check_result *out)
{
    const dsim_train_result *r = ctx->run;
    char *msg = out->message;
    size_t cap = sizeof out->message;
    msg[0] = '\0';
    out->passed = false;
    out->measured = NAN;
    out->expected = v[SC_MAX_DUP] + v[SC_MAX_MISS];

    if (!r->ledger) {
        dsim_check_msg(msg, cap, "the run kept no coverage ledger, so coverage cannot be judged");
        return DSIM_OK;
    }
    /* A strategy's own input_fn shards as it likes: every example once. */
    bool unsharded =
        !r->input_from_strategy &&
        (r->shard_applied == DSIM_SHARD_OFF ||
         (r->shard_applied == DSIM_SHARD_HINT && ctx->cfg && ctx->cfg->hint == DSIM_HINT_NONE));
    uint32_t expected = unsharded ? (uint32_t)(r->num_workers > 0 ? r->num_workers : 1) : 1;
    uint32_t epochs = ctx->cfg && ctx->cfg->epochs > 0 ? ctx->cfg->epochs : 1;

    dsim_coverage worst_dup = {0}, worst_miss = {0}, worst_idle = {0}, worst_imb = {0};
    uint64_t worst_bad = 0, oor = 0, n_examples = 0, reruns = 0, rolled = 0, rolled_steps = 0;
    int restarts = ctx->faults ? ctx->faults->restarts : 0;
    uint32_t oor_epoch = 0;
    worst_imb.imbalance = 1;
    for (uint32_t e = 0; e < epochs; e++) {
        dsim_coverage c;
        dsim_err err = dsim_ledger_coverage(r->ledger, e, -1, expected, &c);
        if (err != DSIM_OK) {
            dsim_check_msg(msg, cap, "reading the coverage ledger of epoch %" PRIu32 " failed: %s",
                           e, dsim_errmsg());
            return DSIM_OK;
        }
        n_examples = c.n_examples;
        reruns += c.reruns;
        rolled += c.rolled_back;
        rolled_steps += c.rolled_back_steps;
        if (c.duplicates > worst_dup.duplicates)
            worst_dup = c;
        if (c.misses > worst_miss.misses)
            worst_miss = c;
        if (c.idle > worst_idle.idle)
            worst_idle = c;
        if (c.imbalance > worst_imb.imbalance)
            worst_imb = c;
        if (c.duplicates + c.misses > worst_bad)
            worst_bad = c.duplicates + c.misses;
        if (c.out_of_range && !oor) {
            oor = c.out_of_range;
            oor_epoch = e;
        }
    }

    const char *reads = expected == 1 ? "once" : "once per worker";
    if (oor) {
        dsim_check_msg(msg, cap,
                       "epoch %" PRIu32 ": %" PRIu64 " reads of ids outside the dataset's %" PRIu64
                       " examples; the input pipeline produced ids that do not exist",
                       oor_epoch, oor, n_examples);
        out->measured = (double)oor;
        out->expected = 0;
        return DSIM_OK;
    }
    if (sc_over((double)worst_dup.duplicates, v[SC_MAX_DUP])) {
        const dsim_coverage *c = &worst_dup;
        dsim_check_msg(msg, cap,
                       "epoch %" PRIu32 ": %" PRIu64 " of %" PRIu64 " examples read more than %s "
                       "(max_duplicates %.0f)",
                       c->epoch, c->duplicates, c->n_examples, reads, v[SC_MAX_DUP]);
        if (r->input_from_strategy) { /* the cause first: the list can be long */
            sc_input_fn_why(r, c, msg, cap);
            sc_list_dups(r->ledger, c->epoch, expected, r->devices_per_host, msg, cap);
        } else {
            sc_why_dup(ctx, c, expected, restarts, msg, cap);
        }
        out->measured = (double)c->duplicates;
        out->expected = v[SC_MAX_DUP];
        return DSIM_OK;
    }
    if (sc_over((double)worst_miss.misses, v[SC_MAX_MISS])) {
        const dsim_coverage *c = &worst_miss;
        dsim_check_msg(msg, cap,
                       "epoch %" PRIu32 ": %" PRIu64 " of %" PRIu64 " examples read less than %s "
                       "(max_misses %.0f)",
                       c->epoch, c->misses, c->n_examples, reads, v[SC_MAX_MISS]);
        sc_list_ids(r->ledger, c->epoch, expected, DSIM_LEDGER_MISSES, msg, cap);
        if (r->input_from_strategy && !restarts && !(ctx->faults && ctx->faults->lost))
            sc_input_fn_why(r, c, msg, cap);
        else
            sc_why_missed(ctx, restarts, msg, cap);
        out->measured = (double)c->misses;
        out->expected = v[SC_MAX_MISS];
        return DSIM_OK;
    }
    if (sc_over((double)worst_idle.idle, v[SC_MAX_IDLE])) {
        const dsim_coverage *c = &worst_idle;
        dsim_check_msg(msg, cap,
                       "epoch %" PRIu32 ": %" PRIu64
                       " (step, replica) pairs with an empty batch while "
                       "other replicas had data (max_idle %.0f)",
                       c->epoch, c->idle, v[SC_MAX_IDLE]);
        dsim_idle idle[SC_LIST];
        size_t total = 0;
        if (dsim_ledger_idle(r->ledger, c->epoch, -1, idle, SC_LIST, &total) == DSIM_OK) {
            size_t n = total < SC_LIST ? total : SC_LIST;
            for (size_t i = 0; i < n; i++)
                dsim_check_msg_append(msg, cap, "%sstep %" PRIu64 " replica %d", i ? ", " : ": ",
                                      idle[i].step, idle[i].replica);
            if (total > n)
                dsim_check_msg_append(msg, cap, ", ...");
        }
        out->measured = (double)c->idle;
        out->expected = v[SC_MAX_IDLE];
        return DSIM_OK;
    }
    if (sc_over(worst_imb.imbalance, v[SC_MAX_IMBALANCE])) {
        const dsim_coverage *c = &worst_imb;
        dsim_check_msg(msg, cap,
                       "epoch %" PRIu32
                       ": load imbalance %.3g (max_imbalance %.3g): replica %d read "
                       "%" PRIu64 " examples, replica %d read %" PRIu64,
                       c->epoch, c->imbalance, v[SC_MAX_IMBALANCE], c->max_replica, c->max_examples,
                       c->min_replica, c->min_examples);
        out->measured = c->imbalance;
        out->expected = v[SC_MAX_IMBALANCE];
        return DSIM_OK;
    }

    out->passed = true;
    out->measured = (double)worst_bad;
    const uint64_t counts[3] = {reruns, rolled, rolled_steps};
    sc_passed(ctx, reads, epochs, worst_bad, &worst_idle, &worst_imb, counts, msg, cap);
    return DSIM_OK;
}

const dsim_check_ops dsim_check_shard_coverage = {
    .size = sizeof(dsim_check_ops),
    .name = "shard_coverage",
    .summary = "every example read exactly once per epoch (once per worker under OFF); after a "
               "restart, over the committed steps (BackupAndRestore)",
    .available = true,
    .n_params = 4,
    .params =
        {
            {"max_duplicates", "examples read more often than expected, per epoch", 0, 1e15, 0,
             true},
            {"max_misses", "examples read less often than expected, per epoch", 0, 1e15, 0, true},
            {"max_idle", "(step, replica) pairs with no data while others had some, per epoch", 0,
             1e15, 1e15, true},
            {"max_imbalance", "largest accepted max/min examples per replica in an epoch", 1, 1e15,
             1e15, false},
        },
    .run = sc_run,
    .by_default = "every run",
};
