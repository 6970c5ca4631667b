/* Communicators and collectives.
 *
 * A communicator is `size` ranks over one fabric; every rank creates its own
 * dsim_comm with the same comm_id. Every collective must be called by every
 * rank in the same order. Each call has a deadline (now + the comm's
 * timeout, TF's CommunicationOptions.timeout_seconds); on timeout, peer loss
 * or abort every rank returns an error and dsim_comm_error() names the failed
 * peer. A communicator without a timeout (0) waits until the call completes
 * or the fabric is aborted (dsim_fabric_abort, which is what the health
 * check of dsim/health.h does when a peer stops answering): with neither, a
 * lost peer is waited for for ever.
 *
 * After an abort every later call fails at once with DSIM_EABORTED, and its
 * message carries the abort's reason (the peer and why), until the group is
 * formed again on a new fabric.
 *
 * Every rank ends an allreduce with identical bits, and the same inputs,
 * algorithm and rank count give the same bits on every run. */
#ifndef DSIM_COMM_H
#define DSIM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/reduce.h"
#include "dsim/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_algo {
    DSIM_ALGO_AUTO = 0,
    DSIM_ALGO_RING,          /* reduce-scatter + all-gather around a ring */
    DSIM_ALGO_RHD,           /* Rabenseifner recursive halving/doubling */
    DSIM_ALGO_TREE,          /* binomial reduce + binomial broadcast */
    DSIM_ALGO_REDUCE_TO_ONE, /* TF's ReductionToOneDevice: gather to rank 0, broadcast */
    DSIM_ALGO_COUNT
} dsim_algo;

/* "auto", "ring", "rhd", "tree", "reduce_to_one". */
const char *dsim_algo_name(dsim_algo a);
dsim_err dsim_algo_parse(const char *s, dsim_algo *out);

/* The decision function: which algorithm AUTO uses for an allreduce of
 * `bytes` bytes over `nranks` ranks. */
dsim_algo dsim_allreduce_decide(size_t bytes, int nranks);

typedef struct dsim_comm dsim_comm;

/* A collective timeout that asks for the default, DSIM_COMM_DEFAULT_TIMEOUT_NS
 * (any negative value does). */
#define DSIM_TIMEOUT_DEFAULT         (-1)
#define DSIM_COMM_DEFAULT_TIMEOUT_NS (30LL * 1000 * 1000 * 1000)

typedef struct dsim_comm_cfg {
    dsim_ep *ep;        /* this rank's endpoint; its rank is the comm rank */
    int size;           /* ranks in the communicator */
    uint32_t comm_id;   /* same on every rank; distinct per communicator */
    int64_t timeout_ns; /* per collective call: > 0 the bound; 0 none (only an abort
                           ends a wait); < 0 (DSIM_TIMEOUT_DEFAULT) 30 s */
    dsim_algo algo;     /* allreduce algorithm; AUTO lets the decision pick */
} dsim_comm_cfg;

dsim_err dsim_comm_create(const dsim_comm_cfg *cfg, dsim_comm **out);
void dsim_comm_destroy(dsim_comm *c);
int dsim_comm_rank(const dsim_comm *c);
int dsim_comm_size(const dsim_comm *c);
/* As dsim_comm_cfg.timeout_ns: > 0 the bound, 0 none, < 0 the default. */
void dsim_comm_set_timeout(dsim_comm *c, int64_t timeout_ns);
void dsim_comm_set_algo(dsim_comm *c, dsim_algo a);
/* The last collective begun on this communicator ("allreduce", a static
 * string; NULL before the first) and how many were begun. Safe from any
 * thread while the communicator is in use: a watchdog's view of a rank. */
void dsim_comm_last_call(const dsim_comm *c, const char **op, uint64_t *calls);
/* The last error on this communicator (code DSIM_OK if none); peer is the
 * failed rank when one is to blame. */
const dsim_error *dsim_comm_error(const dsim_comm *c);

/* sendbuf == recvbuf is allowed (in place) for allreduce. */
dsim_err dsim_allreduce(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                        dsim_dtype t, dsim_op op);
/* The same with a forced algorithm (AUTO = decide). */
dsim_err dsim_allreduce_with(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             dsim_dtype t, dsim_op op, dsim_algo algo);
/* recvbuf is only written on root. */
dsim_err dsim_reduce(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t count, dsim_dtype t,
                     dsim_op op, int root);
dsim_err dsim_broadcast(dsim_comm *c, void *buf, size_t count, dsim_dtype t, int root);
/* recvbuf holds size * sendcount elements, rank r's block at r * sendcount. */
dsim_err dsim_allgather(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount,
                        dsim_dtype t);
/* sendbuf holds size * recvcount elements; rank r receives the reduction of
 * block r. */
dsim_err dsim_reduce_scatter(dsim_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                             dsim_dtype t, dsim_op op);
dsim_err dsim_barrier(dsim_comm *c);

#ifdef __cplusplus
}
#endif
#endif
