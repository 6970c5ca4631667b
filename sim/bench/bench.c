/* The collective benchmark (bench.h): a rank program of the engine table
 * (sim/engine/engine.h) whose round s is size step s of the sweep. Every
 * rank times its -n iterations from a barrier after the -w warm-ups and
 * checks its output; the step's row is the slowest rank's time. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dsim/err.h"
#include "dsim/rt.h"
#include "dsim/transport.h"

/* One rank's outcome of one size step. */
typedef struct bench_result {
    int64_t ns;   /* this rank's time for the -n timed iterations */
    size_t wrong; /* wrong elements in its output */
    dsim_err err; /* DSIM_OK, or why the rank stopped */
    char msg[640];
} bench_result;

/* A step: what every rank shares (read only while the ranks run). */
typedef struct bench_step {
    const dsim_bench_sweep *sw;
    bench_size sz;
    uint32_t comm_id;
} bench_step;

static void bench_fail(bench_result *res, dsim_err e, const char *what, const char *detail)
{
    res->err = e;
    snprintf(res->msg, sizeof res->msg, "%s: %s (%s)", what, detail && *detail ? detail : "",
             dsim_strerror(e));
}

static dsim_err bench_run_once(const bench_step *st, dsim_comm *comm, const void *send, void *recv)
{
    const bench_opts *o = st->sw->o;
    switch (o->coll) {
    case BENCH_ALLREDUCE:
        return dsim_allreduce_with(comm, send, recv, st->sz.count, o->dtype, o->op, st->sw->algo);
    case BENCH_REDUCE_SCATTER:
        return dsim_reduce_scatter(comm, send, recv, st->sz.rank_count, o->dtype, o->op);
    case BENCH_ALLGATHER:
        return dsim_allgather(comm, send, recv, st->sz.rank_count, o->dtype);
    case BENCH_BROADCAST:
    default:
        return dsim_broadcast(comm, recv, st->sz.count, o->dtype, o->root);
    }
}

/* The warm-ups, the barrier, the timed iterations. */
static dsim_err bench_time(const bench_step *st, dsim_comm *comm, dsim_rt *rt, const void *send,
                           void *recv, bench_result *res)
{
    const bench_opts *o = st->sw->o;
    for (int i = 0; i < o->warmup; i++)
        DSIM_CHECK(bench_run_once(st, comm, send, recv));
    DSIM_CHECK(dsim_barrier(comm));
    int64_t t0 = dsim_rt_now(rt);
    for (int i = 0; i < o->iters; i++)
        DSIM_CHECK(bench_run_once(st, comm, send, recv));
    res->ns = dsim_rt_now(rt) - t0;
    return DSIM_OK;
}

/* One rank of one size step, with its endpoint: the communicator, the
 * buffers, the timing and the check. */
static void bench_rank(const bench_step *st, dsim_ep *ep, int rank, bench_result *res)
{
    const bench_opts *o = st->sw->o;
    dsim_rt *rt = dsim_ep_rt(ep);
    size_t es = dsim_dtype_size(o->dtype);
    size_t in_bytes = bench_in_count(o->coll, &st->sz) * es;
    size_t out_bytes = bench_out_count(o->coll, &st->sz) * es;
    void *send = NULL, *recv = NULL;
    dsim_comm *comm = NULL;
    res->err = DSIM_OK;
    /* Generous: a slow shared machine must not turn a large step into a
     * timeout, yet a real hang still ends. */
    int64_t timeout = 30000000000LL + 10 * (int64_t)st->sz.bytes * o->ranks;
    dsim_comm_cfg cfg = {.ep = ep,
                         .size = o->ranks,
                         .comm_id = st->comm_id,
                         .timeout_ns = timeout,
                         .algo = st->sw->algo,
                         .no_fingerprint = !o->fingerprint};
    dsim_err e = dsim_comm_create(&cfg, &comm);
    if (e != DSIM_OK) {
        bench_fail(res, e, "creating the communicator", dsim_errmsg());
        dsim_ep_abort(ep, rank, "a rank could not create its communicator");
        return;
    }
    double *scratch = malloc(BENCH_CHUNK * sizeof *scratch);
    /* Broadcast is in place: its one buffer is recv, filled like an input. */
    if (o->coll != BENCH_BROADCAST)
        send = bench_buf_alloc(in_bytes);
    recv = bench_buf_alloc(out_bytes);
    if (!scratch || !recv || (o->coll != BENCH_BROADCAST && !send)) {
        bench_fail(res, DSIM_ENOMEM, "allocating the buffers", "lower -e or --ranks");
        dsim_ep_abort(ep, rank, "a rank ran out of memory for its buffers");
        goto out;
    }
    bench_fill(o->coll, o->op, o->dtype, o->ranks, o->root, rank, &st->sz,
               o->coll == BENCH_BROADCAST ? recv : send, scratch);
    if (o->coll != BENCH_BROADCAST)
        memset(recv, 0xff, out_bytes);
    if ((e = bench_time(st, comm, rt, send, recv, res)) != DSIM_OK) {
        const dsim_error *ce = dsim_comm_error(comm);
        bench_fail(res, e, bench_coll_name(o->coll),
                   ce && ce->code != DSIM_OK ? ce->msg : dsim_errmsg());
        goto out;
    }
    if (rank == st->sw->corrupt_rank)
        ((unsigned char *)recv)[0] ^= 1;
    if (o->check && bench_check_output(o->coll, o->op, o->dtype, o->ranks, o->root, rank, &st->sz,
                                       recv, &res->wrong) != 0)
        bench_fail(res, DSIM_ENOMEM, "checking the output", "out of memory");
out:
    free(scratch);
    free(send);
    free(recv);
    dsim_comm_destroy(comm);
}

/* The step of round `round`: its sizes (bytes 0: skipped) and a fresh
 * communicator id, so that no message of one step can be matched by the
 * next. */
static bench_step bench_step_of(const dsim_bench_sweep *sw, int round)
{
    const bench_opts *o = sw->o;
    return (bench_step){.sw = sw,
                        .sz =
                            bench_size_for(o->coll, bench_step_bytes(o, round), o->ranks, o->dtype),
                        .comm_id = (uint32_t)round + 1};
}

/* The engine's rank_main: rank `rank` of size step `round`. */
static void bench_rank_main(dsim_ep *ep, int rank, int round, void *result, void *user)
{
    bench_step st = bench_step_of(user, round);
    if (st.sz.bytes)
        bench_rank(&st, ep, rank, result);
}

/* The engine's on_round: the slowest rank's time into the step's row;
 * non-zero after writing which rank failed and why. */
static int bench_on_round(int round, const void *results, void *user)
{
    const dsim_bench_sweep *sw = user;
    const bench_opts *o = sw->o;
    bench_step st = bench_step_of(sw, round);
    if (!st.sz.bytes)
        return sw->on_row(NULL, sw->algo, bench_step_bytes(o, round), sw->user);
    const bench_result *res = results;
    int64_t slowest = 0;
    uint64_t wrong = 0;
    for (int r = 0; r < o->ranks; r++) {
        if (res[r].err != DSIM_OK) {
            fprintf(sw->err, "dsim bench: %s of %zu B failed on rank %d: %s\n",
                    bench_coll_name(o->coll), st.sz.bytes, r, res[r].msg);
            return 1;
        }
        if (res[r].ns > slowest)
            slowest = res[r].ns;
        wrong += res[r].wrong;
    }
    bench_row row = {.sz = st.sz,
                     .dtype = o->dtype,
                     .redop = bench_redop_name(o->coll, o->op),
                     .seconds = (double)slowest / 1e9 / o->iters,
                     .checked = o->check,
                     .wrong = wrong};
    bench_row_finish(&row, o->coll, o->ranks, sw->copy_bw);
    dsim_algo used = o->coll == BENCH_ALLREDUCE && sw->algo == DSIM_ALGO_AUTO
                         ? dsim_allreduce_decide(row.sz.bytes, o->ranks)
                         : sw->algo;
    return sw->on_row(&row, used, st.sz.bytes, sw->user);
}

int dsim_bench_run(const dsim_bench_sweep *sw)
{
    const bench_opts *o = sw->o;
    dsim_engine_ranks job = {
        .nranks = o->ranks,
        .transport = dsim_bench_transport(sw->engine, o->transport),
        .rounds = bench_nsteps(o),
        .rank_main = bench_rank_main,
        .user = (void *)sw,
        .result_size = sizeof(bench_result),
        .on_round = bench_on_round,
    };
    if (sw->engine->ranks(&job) != DSIM_OK) {
        fprintf(sw->err, "dsim bench: engine %s: %s\n", sw->engine->name, dsim_errmsg());
        return 1;
    }
    return 0;
}

double dsim_bench_mem_needed(const bench_opts *o)
{
    double most = 0;
    size_t es = dsim_dtype_size(o->dtype);
    for (int s = 0; s < bench_nsteps(o); s++) {
        bench_size sz = bench_size_for(o->coll, bench_step_bytes(o, s), o->ranks, o->dtype);
        double per_rank = (double)bench_out_count(o->coll, &sz) * (double)es;
        if (o->coll != BENCH_BROADCAST)
            per_rank += (double)bench_in_count(o->coll, &sz) * (double)es;
        most = per_rank * o->ranks > most ? per_rank * o->ranks : most;
    }
    return most;
}

const char *dsim_bench_transport(const dsim_engine_ops *eng, const char *asked)
{
    /* ranks in processes of their own: shm (the default) or tcp; inproc,
     * the flag's default, cannot join them */
    if (eng->flags & DSIM_ENGINE_INPROC)
        return asked;
    return strcmp(asked, "tcp") == 0 ? "tcp" : "shm";
}

dsim_err dsim_bench_model(const bench_opts *o, const char *engine, const bench_row *rows,
                          const dsim_algo *used, int nrows, dsim_calib *cal, dsim_calib_row *cr)
{
    DSIM_CHECK(dsim_calib_measure(engine, o->ranks, cal));
    for (int i = 0; i < nrows; i++)
        cr[i] = (dsim_calib_row){.algo = used[i], .bytes = rows[i].sz.count * sizeof(float)};
    return dsim_calib_predict(cal, cr, nrows);
}
