/* Transports: point-to-point messages between the ranks of one job.
 *
 * A fabric connects nranks ranks through one backend ("inproc", later
 * "tcp", "shm", "fault"). Each rank opens its endpoint on the fabric and
 * sends/receives with non-blocking calls that return request handles; a
 * request is finished (and freed) by dsim_wait/dsim_waitall, or by
 * dsim_req_cancel.
 *
 * Matching: a receive matches the oldest unmatched message with the same
 * source, communicator id and tag. Messages between one pair of ranks with
 * the same communicator id and tag arrive in the order they were sent.
 *
 * Every message carries a header (source, destination, communicator id and
 * epoch, tag, sequence number, length); a message whose header does not fit
 * the receiver (wrong destination, an old epoch, a repeated sequence number)
 * is rejected and counted, never delivered to a receive. Sequence numbers
 * run per (source, destination, communicator id), so a lost message is seen
 * at the next message of that pair whatever its tag; the oldest receive
 * posted from that pair on that communicator (else the next one posted),
 * whatever its tag, then fails with DSIM_EPROTO.
 *
 * Send buffers must stay untouched until the send request completes (large
 * messages on inproc are copied straight from them by the receiver). */
#ifndef DSIM_TRANSPORT_H
#define DSIM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/dtype.h"
#include "dsim/err.h"
#include "dsim/reduce.h"
#include "dsim/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsim_fabric dsim_fabric;
typedef struct dsim_ep dsim_ep;
typedef struct dsim_req dsim_req;
struct dsim_tp_filter;

#define DSIM_ANY_TAG UINT32_MAX

typedef struct dsim_fabric_cfg {
    const char *backend; /* "inproc", ... */
    int nranks;          /* ranks in the job, >= 1 */
    dsim_rt *rt;         /* the runtime all waits go through */
    const char *options; /* backend options "key=value,key=value", or NULL */
    /* Optional fault filter (dsim/spi/transport.h): sees every frame that
     * arrives at a local endpoint, whatever the backend. */
    const struct dsim_tp_filter *filter;
    void *filter_user;
} dsim_fabric_cfg;

DSIM_API dsim_err dsim_fabric_open(const dsim_fabric_cfg *cfg, dsim_fabric **out);
/* Closes the fabric; every endpoint has been closed. */
DSIM_API void dsim_fabric_close(dsim_fabric *f);
DSIM_API int dsim_fabric_nranks(const dsim_fabric *f);
DSIM_API const char *dsim_fabric_backend(const dsim_fabric *f);

/* Opens rank's endpoint (once per rank). */
DSIM_API dsim_err dsim_ep_open(dsim_fabric *f, int rank, dsim_ep **out);
/* Closes the endpoint; pending requests are cancelled. */
DSIM_API void dsim_ep_close(dsim_ep *ep);
DSIM_API int dsim_ep_rank(const dsim_ep *ep);
DSIM_API dsim_rt *dsim_ep_rt(const dsim_ep *ep);

/* Starts sending len bytes of buf to rank dst. */
DSIM_API dsim_err dsim_isend(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, const void *buf,
                             size_t len, dsim_req **req);
/* Starts a send that stands for vlen bytes without moving them (timing-only
 * runs): the frame carries vlen as its 8-byte payload and the flag
 * DSIM_TP_F_VIRTUAL, so that a cost model can charge vlen bytes on the
 * wire; the receiver posts an 8-byte receive and reads the length there.
 * side: NULL, or a sideband as dsim_isend_side carries (declared below). */
DSIM_API dsim_err dsim_isend_virtual(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag,
                                     uint64_t vlen, const void *side, dsim_req **req);
/* A sideband: DSIM_TP_SIDE_LEN bytes that one message carries next to its
 * payload, in its header, at no extra message (collective fingerprints ride
 * on the first payload to each peer this way). */
#define DSIM_TP_SIDE_LEN 32
/* dsim_isend that also carries the DSIM_TP_SIDE_LEN bytes at side (copied
 * before it returns). The receive that takes the message gets them from
 * dsim_wait_side; any other receive ignores them. */
DSIM_API dsim_err dsim_isend_side(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag,
                                  const void *buf, size_t len, const void *side, dsim_req **req);
/* Starts receiving at most cap bytes from rank src into buf. A longer
 * message fails the request with DSIM_ETRUNC. */
DSIM_API dsim_err dsim_irecv(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag, void *buf,
                             size_t cap, dsim_req **req);
/* Starts a receive that combines instead of copying: when the message
 * arrives, inout[i] = inout[i] (op) msg[i] for count elements of dtype t.
 * The message must be exactly count elements long (else DSIM_ETRUNC /
 * DSIM_EPROTO). Lets inproc reduce straight from the sender's buffer. */
DSIM_API dsim_err dsim_irecv_reduce(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag,
                                    void *inout, size_t count, dsim_dtype t, dsim_op op,
                                    dsim_req **req);
/* dsim_irecv_reduce out of place: out[i] = in[i] (op) msg[i], the same bits
 * as copying in to out first, without that pass over memory. in and out are
 * the same buffer or disjoint; out is not written before the message comes
 * (in full on success; on failure it may hold part of the result). */
DSIM_API dsim_err dsim_irecv_reduce_from(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag,
                                         const void *in, void *out, size_t count, dsim_dtype t,
                                         dsim_op op, dsim_req **req);

/* Looks, without receiving anything, for a message on comm_id from any
 * source that no receive has taken yet: 1 with *src (if not NULL) set to
 * the source of the oldest such message, else 0 (also when the fabric is
 * aborted or the endpoint is not open). A receive from *src on comm_id with
 * tag DSIM_ANY_TAG then takes the oldest message from that source there (or
 * fails with DSIM_EPROTO where frames from it were lost or corrupt). Lets a
 * service that any rank may call (the health check) serve W ranks without
 * keeping W receives posted. Costs the length of the endpoint's queue of
 * unexpected messages. */
DSIM_API int dsim_probe_any(dsim_ep *ep, uint32_t comm_id, int *src);
/* What an endpoint was sent and has not received (its unexpected queue),
 * one entry per source and communicator, in the order of their oldest
 * message. */
typedef struct dsim_unreceived {
    int src;
    uint32_t comm_id;
    uint32_t tag;   /* the oldest message's */
    uint64_t count; /* messages */
    uint64_t bytes; /* their payloads */
} dsim_unreceived;
/* Lists into out up to cap entries (one per source and communicator) of
 * the messages ep holds unreceived, leaving out those on the n_skip
 * communicators in skip (may be NULL), and returns how many such messages
 * it holds in all (those of entries beyond cap included; frames lost or
 * corrupt in transit are not messages and not counted). Entries not filled
 * have count 0. dsim_ep_close drops these messages: a driver that knows its
 * ranks are done calls this first to report what nothing received (a
 * peer's bug, or frames no rank asked for). */
DSIM_API uint64_t dsim_ep_unreceived(dsim_ep *ep, const uint32_t *skip, size_t n_skip,
                                     dsim_unreceived *out, size_t cap);
/* Waits for req until deadline, then frees it. On DSIM_OK, *len (if not
 * NULL) is the message length. On DSIM_ETIMEDOUT the request is cancelled
 * and freed too; the error context names the peer. */
DSIM_API dsim_err dsim_wait(dsim_req *req, int64_t deadline, size_t *len);
/* dsim_wait with a deadline already past (a poll: req is freed either way,
 * and kept if it finishes while being withdrawn), except that an unfinished
 * request returns DSIM_ETIMEDOUT without touching the error context: for
 * callers that poll often and expect "not yet". */
DSIM_API dsim_err dsim_poll(dsim_req *req, size_t *len);
/* dsim_wait_side with flags: DSIM_WAIT_QUIET makes a deadline that passes
 * return DSIM_ETIMEDOUT without touching the error context (an interim
 * deadline, after which the caller looks elsewhere and waits again). */
#define DSIM_WAIT_QUIET 1u
DSIM_API dsim_err dsim_wait_flags(dsim_req *req, int64_t deadline, unsigned flags, size_t *len,
                                  void *side, int *has_side);
/* dsim_wait that also hands over a receive's sideband: *has_side (if not
 * NULL) is 1 and side (DSIM_TP_SIDE_LEN bytes, if not NULL) holds it when
 * the message that the receive took carried one, whether or not its payload
 * fitted (DSIM_ETRUNC, DSIM_EPROTO of a reducing receive); else 0. */
DSIM_API dsim_err dsim_wait_side(dsim_req *req, int64_t deadline, size_t *len, void *side,
                                 int *has_side);
/* Looks, without receiving or waiting, for a queued message from rank src
 * on comm_id that carries a sideband and whose tag agrees with tag on the
 * bits of mask: copies the sideband of the oldest into side and returns 1;
 * else 0 (also when ep is closed). Lets a receiver that waits in vain read
 * what a peer sent under a tag it does not expect. */
DSIM_API int dsim_ep_peek_side(dsim_ep *ep, int src, uint32_t comm_id, uint32_t tag, uint32_t mask,
                               void *side);
/* Waits for all n requests (NULL entries are skipped) and frees them all,
 * whatever happens. Returns the first failure, the one that happened first
 * (of requests on one endpoint; not the first in index order when several
 * have failed by the time the caller looks); *failed (if not NULL) is the
 * index of the failed request, else -1. */
DSIM_API dsim_err dsim_waitall(dsim_req **reqs, int n, int64_t deadline, int *failed);
/* 1 if finished, 0 if not; does not free. */
DSIM_API int dsim_req_done(const dsim_req *req);
/* The peer rank of a request. */
DSIM_API int dsim_req_peer(const dsim_req *req);
/* Cancels (if still pending) and frees req. */
DSIM_API void dsim_req_cancel(dsim_req *req);

/* Revokes the fabric (ULFM semantics): every pending and future operation on
 * every endpoint fails with DSIM_EABORTED and every waiter wakes. failed_peer
 * (or -1) and why are kept and reported in each resulting error. Permanent
 * until the fabric is closed. */
DSIM_API void dsim_fabric_abort(dsim_fabric *f, int failed_peer, const char *why);
/* Aborts from one rank's side: the same as dsim_fabric_abort for backends
 * that share an address space; others tell the peers they can reach. */
DSIM_API void dsim_ep_abort(dsim_ep *ep, int failed_peer, const char *why);
DSIM_API int dsim_fabric_aborted(const dsim_fabric *f);

/* Counters of one endpoint. */
typedef struct dsim_ep_stats {
    uint64_t msgs_sent, bytes_sent;
    uint64_t msgs_recv, bytes_recv;
    uint64_t rejected_misrouted; /* header names another destination/comm */
    uint64_t rejected_stale;     /* old epoch or repeated sequence number */
    uint64_t rejected_corrupt;   /* bad magic, version, length or payload checksum */
    /* Sequence streams tracked, sent and received: one per (peer, comm id),
     * whatever the tags, so it stays bounded however many tags are used. */
    uint64_t seq_streams;
} dsim_ep_stats;
DSIM_API void dsim_ep_get_stats(const dsim_ep *ep, dsim_ep_stats *out);

/* How long an endpoint's connections took to set up (cold start: the
 * "connection set-up per peer" phase). A backend with connections (tcp)
 * measures each connection this endpoint opened, from its first attempt
 * until the peer accepted its handshake; the fabric's filter may model them
 * instead (dsim's network model charges each link's first frame a TCP
 * handshake and dsim's hello: two round trips). connections 0: none were
 * set up (inproc ranks share memory and connect nothing). */
typedef struct dsim_ep_conn_stats {
    int connections;  /* peers connected so far */
    int64_t total_ns; /* their set-up times added up */
    int64_t max_ns;   /* the slowest one's */
    int slowest_peer; /* whom that one reached; -1 when none */
    int modelled;     /* 1: the times are the filter's model, not measured */
} dsim_ep_conn_stats;
DSIM_API void dsim_ep_get_conn_stats(dsim_ep *ep, dsim_ep_conn_stats *out);

/* Communicator epochs: messages carry the sender's epoch for comm_id; after
 * dsim_ep_set_epoch raises it, messages of older epochs are stale. */
DSIM_API void dsim_ep_set_epoch(dsim_ep *ep, uint32_t comm_id, uint32_t epoch);

/* Names of registered backends, NULL-terminated (static storage). */
DSIM_API const char *const *dsim_transport_names(void);

#ifdef __cplusplus
}
#endif
#endif
