/* parameter_server: TF's ParameterServerStrategy (async) and the synchronous
 * variant of TF1's SyncReplicasOptimizer (sync).
 *
 * The variables are one flat buffer cut into num_ps contiguous shards
 * (dsim_strategy_shard_range; TF's FixedShardsPartitioner); server s holds
 * shard s and the optimizer slots for it, and applies the updates. Replicas
 * hold no state of their own between steps but the values they last read.
 *
 *   replica r                         server s (one serve() worker per replica)
 *   ---------                         ------------------------------------------
 *   create_variables:
 *     chief: INIT(shard, slots, step) ->  keeps them; version = 0
 *     every: PULL                     ->  waits for INIT; replies (version, shard)
 *   each step:
 *     PUSH(version read, grad shard)  ->  sync:  waits for every replica's push of
 *                                                the step, sums them in replica
 *                                                order, applies once, version++
 *                                         async: applies it at once, version++
 *                                     <-  (version, shard after the update)
 *   lost_work (async, repeated):
 *     LOST (server 0 decides)         ->  a lost replica whose work nobody has
 *                                         taken yet, given to the asker, or none
 *     ADOPT(lost replica)             ->  every server notes who took it; replies
 *                                         the step after the last of its pushes
 *                                         the server applied
 *       ... the driver re-runs the lost replica's remaining steps here;
 *           their PUSHes name the replica whose closure they are ...
 *     DONE                            ->  as below; lost_work ends once all are done
 *   finish: DONE (repeated)           ->  holds the answer until every replica has
 *                                         said DONE (then: the final shard) or half
 *                                         the timeout passed (then: not yet)
 *           STOP                      ->  serve() returns
 *   save (chief): SAVE                ->  (shard, slots, step; async: the first
 *                                         step some replica's closures have not
 *                                         pushed yet, where the checkpoint then
 *                                         resumes: a lost worker's steps are never
 *                                         skipped by a restart)
 *
 * Each update's staleness (versions applied since the replica read the
 * values it computed with) is recorded with dsim_server_record_update: 0 for
 * every sync update; in async mode it grows with the number of replicas.
 *
 * Coordinator: TF2's ParameterServerStrategy has a coordinator (the chief)
 * that schedules step closures on workers. Here every replica runs its own
 * loop over its own input shard (TF1's between-graph replication), so the
 * coordinator is implicit: replica 0 initializes the variables and writes the
 * checkpoints, as the chief does in TF.
 *
 * A lost worker (async mode): TF's ClusterCoordinator puts the closures of a
 * worker that fails back on the queue and another worker runs them, so each
 * closure runs at least once. Here a replica's closures are its steps: when a
 * server's conversation with a replica ends before that replica said DONE,
 * the replica is lost; server 0 hands its remaining steps to the first
 * survivor that runs out of work (lost_work), and every server counts the
 * lost replica as done only once that survivor is. The survivor re-runs from
 * the step after the last push every server applied, so a step whose push
 * reached some servers and not others runs again: at least once, never
 * skipped. In sync mode a lost replica stops the round, and the job fails.
 *
 * Why one serve() worker per (server, replica): a receive names its source
 * (dsim/transport.h has no receive-from-any), so a server answers each
 * replica on a worker of its own, as a gRPC server runs a handler per
 * stream; the workers of one server share its shard under srv->lock.
 *
 * Loss scaling: sync mode scales by 1/global_batch (num_replicas_in_sync = N)
 * and SUMs the contributions. In async mode each update stands alone: as in
 * TF's ParameterServerStrategy with one replica per worker,
 * num_replicas_in_sync is 1 and each replica's loss is averaged over its own
 * share of the global batch. */
#include <stdlib.h>
#include <string.h>

#include "../strategy_int.h"

#define PS_COMM    (DSIM_STRATEGY_COMM_USER + 0u)
#define PS_TAG_REQ 1u
#define PS_TAG_REP 2u

enum { PS_INIT = 1, PS_PULL, PS_PUSH, PS_SAVE, PS_STOP, PS_DONE, PS_LOST, PS_ADOPT, PS_OP_END };

static const char *const ps_op_names[PS_OP_END] = {"?",    "INIT", "PULL", "PUSH", "SAVE",
                                                   "STOP", "DONE", "LOST", "ADOPT"};

/* Every message starts with this header, then floats. */
typedef struct ps_hdr {
    uint32_t op;
    uint32_t from;       /* the replica that asked */
    uint64_t version;    /* PUSH: version read; replies: the server's version */
    uint64_t step;       /* PUSH: the replica's global step; DONE replies: replicas done */
    uint64_t optim_step; /* INIT, SAVE replies */
    uint32_t closure;    /* PUSH: the replica whose step this is; ADOPT: the one taken */
    uint32_t spare;
} ps_hdr;

typedef struct ps_client {
    int nps;
    int slots;                  /* optimizer floats per parameter */
    size_t cap;                 /* largest message, bytes */
    size_t *first;              /* [nps] */
    size_t *count;              /* [nps] */
    uint64_t *version;          /* [nps]: server version of the values in ctx->params */
    unsigned char *sbuf, *rbuf; /* [nps * cap] */
    dsim_req **reqs;            /* [2 * nps] */
    int adopted;                /* the lost replica whose steps this one re-runs, or -1 */
} ps_client;

typedef struct ps_server {
    int slots;
    size_t first, count;
    float *shard;
    dsim_optim *opt;      /* NULL when the shard is empty */
    uint64_t initialized; /* 0 until the chief's INIT */
    uint64_t version;
    /* sync aggregation of one step */
    float *agg;      /* [N * count] */
    uint64_t *vread; /* [N] */
    uint64_t *gstep; /* [N] */
    int arrived;
    uint64_t round;
    /* the end of the job */
    unsigned char *done_from; /* [N]: the replica has said DONE (and took no work since) */
    /* lost replicas (async) */
    unsigned char *lost;  /* [N]: its conversation ended before it said DONE */
    int *adopted_by;      /* [N]: the replica re-running its steps, or -1 */
    uint64_t *applied_to; /* [N]: the step after the last of its steps pushed here */
} ps_server;

static int ps_slots(const dsim_optim_spec *o)
{
    return (int)dsim_optim_slots_per_param(o);
}

static size_t ps_msg_cap(size_t count, int slots)
{
    return sizeof(ps_hdr) + (size_t)(1 + slots) * count * sizeof(float);
}

static float *ps_payload(unsigned char *msg)
{
    return (float *)(void *)(msg + sizeof(ps_hdr));
}

/* ---- shape and scaling ---- */

static dsim_err ps_check_shape(const dsim_strategy_shape *s)
{
    if (s->num_ps < 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "parameter_server needs at least 1 parameter server (num_ps >= 1); got "
                        "%d host(s) x %d device(s) with %d ps",
                        s->hosts, s->devices_per_host, s->num_ps);
    if (s->ps_mode != DSIM_PS_SYNC && s->ps_mode != DSIM_PS_ASYNC)
        return DSIM_ERR(DSIM_EINVAL, -1, "parameter_server: ps mode %d is not sync or async",
                        (int)s->ps_mode);
    return DSIM_OK;
}

static int ps_replicas_in_sync(const dsim_strategy_shape *s)
{
    return s->ps_mode == DSIM_PS_ASYNC ? 1 : s->num_replicas;
}

/* ---- the replica (client) side ---- */

static dsim_err ps_replica_init(dsim_replica_ctx *ctx)
{
    ps_client *c = ctx->priv;
    int P = ctx->shape.num_ps;
    c->nps = P;
    c->slots = ps_slots(ctx->optim);
    c->first = calloc((size_t)P, sizeof *c->first);
    c->count = calloc((size_t)P, sizeof *c->count);
    c->version = calloc((size_t)P, sizeof *c->version);
    c->reqs = calloc(2 * (size_t)P, sizeof *c->reqs);
    size_t maxc = 0;
    for (int s = 0; c->first && c->count && s < P; s++) {
        dsim_strategy_shard_range(ctx->n_params, P, s, &c->first[s], &c->count[s]);
        if (c->count[s] > maxc)
            maxc = c->count[s];
    }
    c->cap = ps_msg_cap(maxc, c->slots);
    c->adopted = -1;
    c->sbuf = malloc((size_t)P * c->cap);
    c->rbuf = malloc((size_t)P * c->cap);
    if (!c->first || !c->count || !c->version || !c->reqs || !c->sbuf || !c->rbuf)
        return DSIM_ERR(DSIM_ENOMEM, -1, "parameter_server: replica %d: out of memory",
                        ctx->replica);
    return DSIM_OK;
}

static void ps_replica_fini(dsim_replica_ctx *ctx)
{
    ps_client *c = ctx->priv;
    free(c->first);
    free(c->count);
    free(c->version);
    free(c->reqs);
    free(c->sbuf);
    free(c->rbuf);
    memset(c, 0, sizeof *c);
}

/* Sends one request to every server (build fills message s and returns its
 * float count; NULL: a bare header) and waits for every reply, whose header
 * must answer the same op. With expect_reply 0 only the sends are waited
 * for. */
typedef size_t (*ps_build_fn)(dsim_replica_ctx *ctx, int s, ps_hdr *h, float *payload,
                              const void *arg);

/* The exchange's request slot (s: the send to server s; P + s: the receive
 * of its reply) failed with code and why: named as that server's failure. */
static dsim_err ps_slot_failed(const dsim_replica_ctx *ctx, int P, uint32_t op, int slot,
                               dsim_err code, const char *why)
{
    int server = slot >= 0 ? slot % P : -1;
    return DSIM_ERR(code, server >= 0 ? ctx->server_rank0 + server : -1,
                    "parameter_server: replica %d: %s %s parameter server %d failed: %s",
                    ctx->replica, ps_op_names[op], slot >= P ? "reply from" : "request to", server,
                    why);
}

static dsim_err ps_exchange(dsim_replica_ctx *ctx, uint32_t op, ps_build_fn build, const void *arg,
                            int expect_reply)
{
    ps_client *c = ctx->priv;
    int P = c->nps;
    for (int i = 0; i < 2 * P; i++)
        c->reqs[i] = NULL;
    dsim_err e = DSIM_OK;
    int at = -1; /* the server whose receive (P + s) or send (s) could not start */
    for (int s = 0; s < P && e == DSIM_OK && expect_reply; s++) {
        e = dsim_irecv(ctx->ep, ctx->server_rank0 + s, PS_COMM, PS_TAG_REP, c->rbuf + s * c->cap,
                       c->cap, &c->reqs[P + s]);
        at = P + s;
    }
    for (int s = 0; s < P && e == DSIM_OK; s++) {
        unsigned char *m = c->sbuf + s * c->cap;
        ps_hdr h = {.op = op, .from = (uint32_t)ctx->replica};
        size_t nf = build ? build(ctx, s, &h, ps_payload(m), arg) : 0;
        memcpy(m, &h, sizeof h);
        e = dsim_isend(ctx->ep, ctx->server_rank0 + s, PS_COMM, PS_TAG_REQ, m,
                       sizeof h + nf * sizeof(float), &c->reqs[s]);
        at = s;
    }
    if (e != DSIM_OK) {
        /* A send to a server whose link already broke fails here at once
         * (tcp): named as the failure of that server, as in the wait below. */
        dsim_error saved;
        dsim_error_copy(&saved);
        for (int i = 0; i < 2 * P; i++)
            if (c->reqs[i])
                dsim_req_cancel(c->reqs[i]);
        return ps_slot_failed(ctx, P, op, at, saved.code, saved.msg);
    }
    int failed = -1;
    int64_t deadline = dsim_rt_deadline(ctx->rt, ctx->timeout_ns);
    e = dsim_waitall(c->reqs, 2 * P, deadline, &failed);
    if (e != DSIM_OK)
        return ps_slot_failed(ctx, P, op, failed, e, dsim_errmsg());
    if (!expect_reply)
        return DSIM_OK;
    /* Every reply is checked before any is used. */
    for (int s = 0; s < P; s++) {
        ps_hdr h;
        memcpy(&h, c->rbuf + s * c->cap, sizeof h);
        if (h.op != op)
            return DSIM_ERR(DSIM_EPROTO, ctx->server_rank0 + s,
                            "parameter_server: replica %d asked server %d for %s and got an "
                            "answer to %s",
                            ctx->replica, s, ps_op_names[op],
                            h.op < PS_OP_END ? ps_op_names[h.op] : "?");
    }
    return DSIM_OK;
}

static size_t ps_build_init(dsim_replica_ctx *ctx, int s, ps_hdr *h, float *pl, const void *arg)
{
    const dsim_strategy_vars *init = arg;
    ps_client *c = ctx->priv;
    size_t f = c->first[s], n = c->count[s], N = ctx->n_params;
    memcpy(pl, init->params + f, n * sizeof(float));
    /* The slots are [slot 0: N][slot 1: N]...; a shard's are the same
     * ranges of each slot. */
    for (int k = 0; k < c->slots; k++)
        memcpy(pl + (size_t)(k + 1) * n, init->optim_state + (size_t)k * N + f, n * sizeof(float));
    h->optim_step = init->optim_step;
    return (size_t)(1 + c->slots) * n;
}

static size_t ps_build_push(dsim_replica_ctx *ctx, int s, ps_hdr *h, float *pl, const void *arg)
{
    const float *grad = arg;
    ps_client *c = ctx->priv;
    memcpy(pl, grad + c->first[s], c->count[s] * sizeof(float));
    h->version = c->version[s];
    h->step = ctx->global_step;
    h->closure = (uint32_t)(c->adopted >= 0 ? c->adopted : ctx->replica);
    return c->count[s];
}

/* Takes the shard values and version out of every reply to PULL or PUSH. */
static void ps_take_values(dsim_replica_ctx *ctx)
{
    ps_client *c = ctx->priv;
    for (int s = 0; s < c->nps; s++) {
        unsigned char *m = c->rbuf + s * c->cap;
        ps_hdr h;
        memcpy(&h, m, sizeof h);
        memcpy(ctx->params + c->first[s], ps_payload(m), c->count[s] * sizeof(float));
        c->version[s] = h.version;
    }
}

static dsim_err ps_create(dsim_replica_ctx *ctx, const dsim_strategy_vars *init)
{
    ps_client *c = ctx->priv;
    if (ctx->replica == 0) {
        size_t want = (size_t)c->slots * ctx->n_params;
        if (!init || init->n_params != ctx->n_params || init->optim_state_len != want)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "parameter_server: the chief needs initial values for %zu "
                            "parameters and %zu optimizer floats",
                            ctx->n_params, want);
        DSIM_CHECK(ps_exchange(ctx, PS_INIT, ps_build_init, init, 1));
    }
    DSIM_CHECK(ps_exchange(ctx, PS_PULL, NULL, NULL, 1));
    ps_take_values(ctx);
    return DSIM_OK;
}

static dsim_err ps_apply(dsim_replica_ctx *ctx, float *grad)
{
    DSIM_CHECK(ps_exchange(ctx, PS_PUSH, ps_build_push, grad, 1));
    ps_take_values(ctx);
    return DSIM_OK;
}

static dsim_err ps_reduce(dsim_replica_ctx *ctx, dsim_op op, const double *in, double *out,
                          size_t n)
{
    /* Async replicas are not in step: a collective here would make them so. */
    if (ctx->shape.ps_mode == DSIM_PS_ASYNC)
        return DSIM_ENOTSUP;
    return dsim_replicated_reduce(ctx, op, in, out, n);
}

static dsim_err ps_save(dsim_replica_ctx *ctx, dsim_strategy_vars *out)
{
    ps_client *c = ctx->priv;
    if (ctx->replica != 0)
        return DSIM_OK; /* the chief gathers the shards from the servers */
    size_t N = ctx->n_params;
    if (out->n_params != N || out->optim_state_len != (size_t)c->slots * N)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "parameter_server: save: the checkpoint's sizes do not "
                        "match the model's");
    DSIM_CHECK(ps_exchange(ctx, PS_SAVE, NULL, NULL, 1));
    for (int s = 0; s < c->nps; s++) {
        unsigned char *m = c->rbuf + s * c->cap;
        ps_hdr h;
        memcpy(&h, m, sizeof h);
        const float *pl = ps_payload(m);
        size_t f = c->first[s], n = c->count[s];
        memcpy(out->params + f, pl, n * sizeof(float));
        for (int k = 0; k < c->slots; k++)
            memcpy(out->optim_state + (size_t)k * N + f, pl + (size_t)(k + 1) * n,
                   n * sizeof(float));
        /* Every server applies every update, so their steps agree in sync
         * mode; in async mode server 0's is the one kept. */
        if (s == 0)
            out->optim_step = h.optim_step;
        /* async: resume where every replica's steps before are applied on
         * every server */
        if (ctx->shape.ps_mode == DSIM_PS_ASYNC && h.step <= ctx->global_step &&
            (!out->resume_before || h.step < out->resume_step)) {
            out->resume_before = true;
            out->resume_step = h.step;
        }
    }
    return DSIM_OK;
}

static size_t ps_build_adopt(dsim_replica_ctx *ctx, int s, ps_hdr *h, float *pl, const void *arg)
{
    (void)ctx;
    (void)s;
    (void)pl;
    h->closure = (uint32_t) * (const int *)arg;
    return 0;
}

/* Has every server answered DONE with all replicas done? */
static int ps_all_done(const dsim_replica_ctx *ctx)
{
    const ps_client *c = ctx->priv;
    for (int s = 0; s < c->nps; s++) {
        ps_hdr h;
        memcpy(&h, c->rbuf + s * c->cap, sizeof h);
        if (h.step != (uint64_t)ctx->shape.num_replicas)
            return 0;
    }
    return 1;
}

static dsim_err ps_lost_work(dsim_replica_ctx *ctx, int *replica, uint64_t *from_step)
{
    ps_client *c = ctx->priv;
    c->adopted = -1;
    *replica = -1;
    *from_step = 0;
    if (ctx->shape.ps_mode != DSIM_PS_ASYNC)
        return DSIM_OK; /* a lost replica fails a synchronous job */
    for (;;) {
        /* Server 0 decides who takes a lost replica's steps; the others
         * answer 0. */
        DSIM_CHECK(ps_exchange(ctx, PS_LOST, NULL, NULL, 1));
        ps_hdr h0;
        memcpy(&h0, c->rbuf, sizeof h0);
        if (h0.step > 0) {
            int lost = (int)h0.step - 1;
            if (lost < 0 || lost >= ctx->shape.num_replicas || lost == ctx->replica)
                return DSIM_ERR(DSIM_EPROTO, ctx->server_rank0,
                                "parameter_server: replica %d was given replica %d's steps to "
                                "re-run, which is not another replica of the %d",
                                ctx->replica, lost, ctx->shape.num_replicas);
            DSIM_CHECK(ps_exchange(ctx, PS_ADOPT, ps_build_adopt, &lost, 1));
            uint64_t from = UINT64_MAX;
            for (int s = 0; s < c->nps; s++) {
                ps_hdr h;
                memcpy(&h, c->rbuf + s * c->cap, sizeof h);
                if (h.step < from)
                    from = h.step;
            }
            c->adopted = lost;
            *replica = lost;
            *from_step = from;
            return DSIM_OK;
        }
        DSIM_CHECK(ps_exchange(ctx, PS_DONE, NULL, NULL, 1));
        if (ps_all_done(ctx))
            return DSIM_OK;
    }
}

static dsim_err ps_finish(dsim_replica_ctx *ctx)
{
    /* Once every replica has had its last push answered, the servers hold
     * the job's final values, the same for every replica. The servers tell
     * when that is: asynchronous replicas may end far apart (a straggler is
     * normal there), so a replica that is done asks again while the others
     * still push, rather than blocking in a collective that would time out
     * and blame a replica that is merely waiting. A replica that is really
     * gone still fails the job: its server times out waiting for it. */
    ps_client *c = ctx->priv;
    c->adopted = -1;
    do
        DSIM_CHECK(ps_exchange(ctx, PS_DONE, NULL, NULL, 1));
    while (!ps_all_done(ctx));
    ps_take_values(ctx);
    return ps_exchange(ctx, PS_STOP, NULL, NULL, 0);
}

/* ---- the server side ---- */

static dsim_err ps_server_init(dsim_server_ctx *srv)
{
    ps_server *p = srv->priv;
    int N = srv->shape.num_replicas;
    p->slots = ps_slots(srv->optim);
    dsim_strategy_shard_range(srv->n_params, srv->shape.num_ps, srv->server, &p->first, &p->count);
    size_t n = p->count ? p->count : 1;
    p->shard = calloc(n, sizeof(float));
    p->vread = calloc((size_t)N, sizeof *p->vread);
    p->gstep = calloc((size_t)N, sizeof *p->gstep);
    p->done_from = calloc((size_t)N, 1);
    p->lost = calloc((size_t)N, 1);
    p->adopted_by = malloc((size_t)N * sizeof *p->adopted_by);
    p->applied_to = calloc((size_t)N, sizeof *p->applied_to);
    for (int c = 0; p->adopted_by && c < N; c++)
        p->adopted_by[c] = -1;
    if (srv->shape.ps_mode == DSIM_PS_SYNC)
        p->agg = calloc((size_t)N * n, sizeof(float));
    if (!p->shard || !p->vread || !p->gstep || !p->done_from || !p->lost || !p->adopted_by ||
        !p->applied_to || (srv->shape.ps_mode == DSIM_PS_SYNC && !p->agg))
        return DSIM_ERR(DSIM_ENOMEM, -1, "parameter server %d: out of memory", srv->server);
    return DSIM_OK;
}

static void ps_server_fini(dsim_server_ctx *srv)
{
    ps_server *p = srv->priv;
    free(p->shard);
    free(p->agg);
    free(p->vread);
    free(p->gstep);
    free(p->done_from);
    free(p->lost);
    free(p->adopted_by);
    free(p->applied_to);
    dsim_optim_destroy(p->opt);
    memset(p, 0, sizeof *p);
}

/* Waits on srv->lock (held) until *value differs from `than`; an abort or the
 * deadline ends the wait with an error saying what was awaited. */
static dsim_err ps_wait_change(dsim_server_ctx *srv, const uint64_t *value, uint64_t than,
                               int64_t deadline, const char *what, int client)
{
    while (*value == than) {
        if (dsim_fabric_aborted(srv->fabric))
            return DSIM_ERR(DSIM_EABORTED, -1, "parameter server %d: the job was aborted while %s",
                            srv->server, what);
        if (dsim_waitq_wait(srv->lock, deadline) == DSIM_ETIMEDOUT && *value == than)
            return DSIM_ERR(DSIM_ETIMEDOUT, -1,
                            "parameter server %d: timed out after %lld ms %s (serving replica %d)",
                            srv->server, (long long)(srv->timeout_ns / 1000000), what, client);
    }
    return DSIM_OK;
}

/* Replicas done, lock held: those that said DONE, and the lost ones whose
 * steps a done replica re-ran (through a chain of at most N takers). */
static int ps_done_count(const ps_server *p, int N)
{
    int done = 0;
    for (int c = 0; c < N; c++) {
        int r = c;
        for (int hop = 0; hop < N && !p->done_from[r] && p->lost[r] && p->adopted_by[r] >= 0; hop++)
            r = p->adopted_by[r];
        done += p->done_from[r] != 0;
    }
    return done;
}

/* `taker` takes lost replica `lost`'s steps: it has work again. Lock held. */
static void ps_adopt(ps_server *p, int lost, int taker)
{
    p->lost[lost] = 1;
    p->adopted_by[lost] = taker;
    p->done_from[taker] = 0;
}

/* Applies the summed gradient to the shard; lock held. */
static dsim_err ps_server_update(ps_server *p, const float *grad)
{
    if (!p->opt)
        return DSIM_OK; /* an empty shard */
    return dsim_optim_apply(p->opt, p->shard, grad, p->count);
}

/* One request being answered, under srv->lock: the reply's header and
 * payload are filled here. */
typedef struct ps_call {
    dsim_server_ctx *srv;
    ps_server *p;
    int client;
    const ps_hdr *h;
    const float *pl; /* the request's payload */
    int64_t deadline;
    ps_hdr r;
    float *out;
    size_t out_floats;
} ps_call;

/* A request that is not one this replica may send is a protocol error. */
static dsim_err ps_check_request(dsim_server_ctx *srv, int client, const ps_hdr *h, size_t len)
{
    ps_server *p = srv->priv;
    size_t n = p->count;
    size_t want = h->op == PS_INIT   ? ps_msg_cap(n, p->slots)
                  : h->op == PS_PUSH ? ps_msg_cap(n, 0)
                                     : sizeof(ps_hdr);
    int N = srv->shape.num_replicas;
    bool closure_ok = h->op == PS_PUSH ? h->closure < (uint32_t)N
                      : h->op == PS_ADOPT
                          ? h->closure < (uint32_t)N && h->closure != (uint32_t)client
                          : true;
    if (h->op < PS_INIT || h->op >= PS_OP_END || len != want || h->from != (uint32_t)client ||
        !closure_ok)
        return DSIM_ERR(DSIM_EPROTO, client,
                        "parameter server %d: a malformed request from replica %d (op %u, %zu "
                        "bytes, from %u, closure %u)",
                        srv->server, client, h->op, len, h->from, h->closure);
    if (srv->shape.ps_mode != DSIM_PS_ASYNC &&
        (h->op == PS_LOST || h->op == PS_ADOPT || (h->op == PS_PUSH && h->closure != h->from)))
        return DSIM_ERR(DSIM_EPROTO, client,
                        "parameter server %d: replica %d asked to re-run another replica's steps "
                        "(%s), which only asynchronous training does",
                        srv->server, client, ps_op_names[h->op]);
    return DSIM_OK;
}

/* INIT: the chief's initial values and optimizer state for the shard. */
static dsim_err ps_op_init(ps_call *k)
{
    ps_server *p = k->p;
    size_t n = p->count;
    dsim_err e = DSIM_OK;
    if (k->client != 0)
        return DSIM_ERR(DSIM_EPROTO, k->client,
                        "parameter server %d: replica %d sent INIT; only the chief (replica 0) "
                        "creates the variables",
                        k->srv->server, k->client);
    memcpy(p->shard, k->pl, n * sizeof(float));
    if (n) {
        dsim_strategy_vars v = {
            .n_params = n,
            .optim_state_len = (size_t)p->slots * n,
            .optim_state = (float *)(k->pl + n),
            .optim_step = k->h->optim_step,
        };
        dsim_optim_destroy(p->opt);
        p->opt = NULL;
        e = dsim_strategy_optim_from_vars(k->srv->optim, n, &v, &p->opt);
    }
    p->version = 0;
    p->initialized = 1;
    dsim_waitq_wake(k->srv->lock);
    return e;
}

/* PULL and SAVE: the shard's values (and for SAVE its optimizer state). */
static dsim_err ps_op_read(ps_call *k)
{
    ps_server *p = k->p;
    size_t n = p->count;
    /* Replicas may ask before the chief's INIT has arrived. */
    dsim_err e = ps_wait_change(k->srv, &p->initialized, 0, k->deadline,
                                "waiting for the chief to create the variables", k->client);
    if (e != DSIM_OK)
        return e;
    memcpy(k->out, p->shard, n * sizeof(float));
    k->out_floats = n;
    if (k->h->op == PS_SAVE) {
        for (int s = 0; s < p->slots && p->opt; s++)
            memcpy(k->out + (size_t)(s + 1) * n, dsim_optim_state(p->opt) + (size_t)s * n,
                   n * sizeof(float));
        k->out_floats = (size_t)(1 + p->slots) * n;
        k->r.optim_step = p->opt ? dsim_optim_step(p->opt) : 0;
    }
    return DSIM_OK;
}

/* A synchronous PUSH: the last of the N replicas' gradients sums them (in
 * replica order, whatever the arrival order: the same bits on every run)
 * and updates the shard; the others wait for that. */
static dsim_err ps_push_sync(ps_call *k)
{
    ps_server *p = k->p;
    dsim_server_ctx *srv = k->srv;
    size_t n = p->count;
    int N = srv->shape.num_replicas, client = k->client;
    dsim_err e = DSIM_OK;
    memcpy(p->agg + (size_t)client * n, k->pl, n * sizeof(float));
    p->vread[client] = k->h->version;
    p->gstep[client] = k->h->step;
    uint64_t my_round = p->round;
    if (++p->arrived < N)
        return ps_wait_change(srv, &p->round, my_round, k->deadline,
                              "waiting for the other replicas' gradients of the step", client);
    for (int c = 1; c < N && e == DSIM_OK; c++)
        e = dsim_reduce_local(p->agg, p->agg + (size_t)c * n, n, DSIM_F32, DSIM_SUM);
    for (int c = 0; c < N && e == DSIM_OK; c++)
        e = dsim_server_record_update(srv, c, p->gstep[c], p->vread[c], p->version);
    if (e == DSIM_OK)
        e = ps_server_update(p, p->agg);
    p->version++;
    p->arrived = 0;
    p->round++;
    dsim_waitq_wake(srv->lock);
    return e;
}

/* PUSH: a replica's gradient (asynchronous: applied at once), answered with
 * the shard's values after it. */
static dsim_err ps_op_push(ps_call *k)
{
    ps_server *p = k->p;
    const ps_hdr *h = k->h;
    dsim_err e = DSIM_OK;
    if (!p->initialized)
        return DSIM_ERR(DSIM_EPROTO, k->client,
                        "parameter server %d: replica %d pushed before the variables existed",
                        k->srv->server, k->client);
    if (k->srv->shape.ps_mode == DSIM_PS_ASYNC) {
        e = dsim_server_record_update(k->srv, k->client, h->step, h->version, p->version);
        if (e == DSIM_OK)
            e = ps_server_update(p, k->pl);
        if (e == DSIM_OK) {
            p->version++;
            if (h->step + 1 > p->applied_to[h->closure])
                p->applied_to[h->closure] = h->step + 1;
        }
    } else {
        e = ps_push_sync(k);
    }
    if (e != DSIM_OK)
        return e;
    memcpy(k->out, p->shard, p->count * sizeof(float));
    k->out_floats = p->count;
    return DSIM_OK;
}

/* LOST: server 0 hands out lost replicas' steps, one taker each. */
static dsim_err ps_op_lost(ps_call *k)
{
    ps_server *p = k->p;
    int N = k->srv->shape.num_replicas;
    k->r.step = 0;
    for (int c = 0; k->srv->server == 0 && c < N; c++) {
        if (c != k->client && p->lost[c] && p->adopted_by[c] < 0 && !p->done_from[c]) {
            ps_adopt(p, c, k->client);
            k->r.step = (uint64_t)c + 1;
            dsim_waitq_wake(k->srv->lock);
            break;
        }
    }
    return DSIM_OK;
}

/* DONE: the replica has no more work; answered when every replica is done,
 * with the shard's final values, or within half the timeout whatever
 * happens, so that neither this replica's wait for the answer nor this
 * worker's wait for its next request times out while others still train.
 * Without a timeout (-1) nothing times out, so it waits for all of them. */
static dsim_err ps_op_done(ps_call *k)
{
    ps_server *p = k->p;
    dsim_server_ctx *srv = k->srv;
    int N = srv->shape.num_replicas;
    if (!p->done_from[k->client]) {
        p->done_from[k->client] = 1;
        dsim_waitq_wake(srv->lock);
    }
    int64_t poll =
        srv->timeout_ns < 0
            ? DSIM_NO_DEADLINE
            : dsim_rt_deadline(srv->rt, srv->timeout_ns / 2 > 0 ? srv->timeout_ns / 2 : 1);
    int done;
    while ((done = ps_done_count(p, N)) < N) {
        if (dsim_fabric_aborted(srv->fabric))
            return DSIM_ERR(DSIM_EABORTED, -1,
                            "parameter server %d: the job was aborted while replica %d waited "
                            "for the others to finish",
                            srv->server, k->client);
        if (dsim_waitq_wait(srv->lock, poll) == DSIM_ETIMEDOUT)
            break;
    }
    k->r.step = (uint64_t)done;
    if (done == N) {
        memcpy(k->out, p->shard, p->count * sizeof(float));
        k->out_floats = p->count;
    }
    return DSIM_OK;
}

static dsim_err ps_handle(dsim_server_ctx *srv, int client, unsigned char *req, size_t len,
                          unsigned char *rep, size_t *rep_len, int *stop)
{
    ps_server *p = srv->priv;
    ps_hdr h;
    memcpy(&h, req, sizeof h);
    DSIM_CHECK(ps_check_request(srv, client, &h, len));
    if (h.op == PS_STOP) {
        *stop = 1;
        return DSIM_OK;
    }
    ps_call k = {
        .srv = srv,
        .p = p,
        .client = client,
        .h = &h,
        .pl = ps_payload(req),
        .deadline = dsim_rt_deadline(srv->rt, srv->timeout_ns),
        .r = {.op = h.op, .from = h.from},
        .out = ps_payload(rep),
    };
    dsim_err e = DSIM_OK;
    dsim_waitq_lock(srv->lock);
    switch (h.op) {
    case PS_INIT:
        e = ps_op_init(&k);
        break;
    case PS_PULL:
        e = ps_op_read(&k);
        break;
    case PS_SAVE:
        e = ps_op_read(&k);
        /* async: the first step some replica's closures have not pushed
         * here yet (a lost replica's remaining steps, not re-run yet) */
        k.r.step = UINT64_MAX;
        for (int c = 0; srv->shape.ps_mode == DSIM_PS_ASYNC && c < srv->shape.num_replicas; c++)
            if (p->applied_to[c] < k.r.step)
                k.r.step = p->applied_to[c];
        break;
    case PS_PUSH:
        e = ps_op_push(&k);
        break;
    case PS_LOST:
        e = ps_op_lost(&k);
        break;
    case PS_ADOPT:
        ps_adopt(p, (int)h.closure, client);
        k.r.step = p->applied_to[h.closure];
        k.r.closure = h.closure;
        dsim_waitq_wake(srv->lock);
        break;
    case PS_DONE:
        e = ps_op_done(&k);
        break;
    }
    k.r.version = p->version;
    dsim_waitq_unlock(srv->lock);
    if (e != DSIM_OK)
        return e;
    memcpy(rep, &k.r, sizeof k.r);
    *rep_len = sizeof k.r + k.out_floats * sizeof(float);
    return DSIM_OK;
}

static dsim_err ps_serve(dsim_server_ctx *srv, int client)
{
    ps_server *p = srv->priv;
    size_t cap = ps_msg_cap(p->count, p->slots);
    unsigned char *req = malloc(cap), *rep = malloc(cap);
    if (!req || !rep) {
        free(req);
        free(rep);
        return DSIM_ERR(DSIM_ENOMEM, -1, "parameter server %d: out of memory", srv->server);
    }
    dsim_err e = DSIM_OK;
    for (int stop = 0; !stop && e == DSIM_OK;) {
        dsim_req *rq = NULL;
        size_t len = 0;
        e = dsim_irecv(srv->ep, client, PS_COMM, PS_TAG_REQ, req, cap, &rq);
        /* A client that is quiet may be waiting on another server: give its
         * own request timeouts (one timeout each) the time to fire first and
         * name the server that failed, rather than blaming the client. */
        if (e == DSIM_OK)
            e = dsim_wait(rq,
                          srv->timeout_ns < 0 ? DSIM_NO_DEADLINE
                                              : dsim_rt_deadline(srv->rt, 2 * srv->timeout_ns),
                          &len);
        if (e != DSIM_OK) {
            e = DSIM_ERR(e, client,
                         "parameter server %d: waiting for replica %d's next request: %s",
                         srv->server, client, dsim_errmsg());
            break;
        }
        size_t rep_len = 0;
        e = ps_handle(srv, client, req, len, rep, &rep_len, &stop);
        if (e != DSIM_OK || stop)
            break;
        dsim_req *rs = NULL;
        e = dsim_isend(srv->ep, client, PS_COMM, PS_TAG_REP, rep, rep_len, &rs);
        if (e == DSIM_OK)
            e = dsim_wait(rs, dsim_rt_deadline(srv->rt, srv->timeout_ns), NULL);
    }
    if (e != DSIM_OK && srv->shape.ps_mode == DSIM_PS_ASYNC) {
        /* Asynchronous training goes on without a replica that stopped
         * talking (TF's coordinator tolerates a lost worker): unless it had
         * said DONE, it is lost, and its steps (with those of any replica it
         * had taken over) go to a survivor, which lost_work finds. Whether
         * its silence fails the job is the driver's call (a killed replica
         * does not). */
        ps_server *p = srv->priv;
        int N = srv->shape.num_replicas;
        dsim_waitq_lock(srv->lock);
        if (!p->done_from[client]) {
            p->lost[client] = 1;
            for (int c = 0; c < N; c++)
                if (p->adopted_by[c] == client)
                    p->adopted_by[c] = -1;
        }
        dsim_waitq_wake(srv->lock);
        dsim_waitq_unlock(srv->lock);
    }
    free(req);
    free(rep);
    return e;
}

const struct dsim_strategy_ops dsim_strategy_parameter_server_ops = {
    .size = sizeof(struct dsim_strategy_ops),
    .name = "parameter_server",
    .summary = "variables sharded over parameter servers; replicas push gradients and pull "
               "values, sync or async (TF ParameterServerStrategy)",
    .placement = DSIM_PLACE_SHARDED,
    .replica_priv_size = sizeof(ps_client),
    .server_priv_size = sizeof(ps_server),
    .check_shape = ps_check_shape,
    .num_replicas_in_sync = ps_replicas_in_sync,
    .replica_init = ps_replica_init,
    .replica_fini = ps_replica_fini,
    .create_variables = ps_create,
    .apply_gradients = ps_apply,
    .reduce = ps_reduce,
    .save = ps_save,
    .finish = ps_finish,
    .lost_work = ps_lost_work,
    .server_init = ps_server_init,
    .serve = ps_serve,
    .server_fini = ps_server_fini,
};
