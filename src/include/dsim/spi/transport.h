/* For people who write a transport backend: the ops table and the calls a
 * backend makes into the shared transport layer.
 *
 * Division of work. The shared layer (src/transport/; transport.c lists
 * its files) owns endpoints, requests, headers, matching, sequence numbers,
 * epochs, deadlines, cancellation and abort. A backend only moves frames:
 *
 *   send side:    dsim_isend builds the header (src, dst, comm_id, epoch,
 *                 tag, seq, len) and calls ops->send(ep, to, hdr, payload,
 *                 len, req). The backend moves the frame and completes req
 *                 with dsim_tp_complete once the payload is no longer needed
 *                 (or hands req to dsim_tp_deliver as a zero-copy frame).
 *   receive side: when a frame arrives for endpoint ep, the backend calls
 *                 dsim_tp_deliver(ep, hdr, payload, len, ...). The shared
 *                 layer checks the header (corrupt, misrouted, stale,
 *                 duplicate, gap), counts and drops bad frames, and matches
 *                 good ones against posted receives.
 *
 * Threading: ops may be called from any worker thread at the same time,
 * except that the shared layer serialises ops->send per sending endpoint (so
 * frames from one endpoint leave in sequence order). A backend must not block
 * except through the runtime API (dsim/rt.h): the same code runs under the
 * virtual-clock engine. */
#ifndef DSIM_SPI_TRANSPORT_H
#define DSIM_SPI_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_TP_MAGIC   0x50545344u /* "DSTP" read as little-endian bytes */
#define DSIM_TP_VERSION 2           /* 2: frames may carry a sideband (DSIM_TP_F_SIDE) */
/* Frames longer than this are corrupt whatever the backend. */
#define DSIM_TP_MAX_LEN ((uint64_t)1 << 40)

/* hdr.flags: checksum holds dsim_tp_checksum of the payload as sent. The
 * shared layer verifies it on delivery unless DSIM_TP_F_VERIFIED is set too
 * (a receiving backend that checked it already sets that). A frame whose
 * checksum does not match is never delivered: it fails the oldest receive
 * from that peer and communicator with DSIM_EPROTO ("corrupt"), and is
 * counted in dsim_ep_stats.rejected_corrupt. */
#define DSIM_TP_F_CHECKSUM 0x1u
#define DSIM_TP_F_VERIFIED 0x2u
/* hdr.flags: a virtual frame (dsim_isend_virtual): its 8-byte payload is
 * the uint64_t length of a payload that was not sent. Delivered like any
 * other frame; a cost model (the sim network model) charges that length. */
#define DSIM_TP_F_VIRTUAL 0x4u
/* hdr.flags: hdr.side holds DSIM_TP_SIDE_LEN bytes that travel with the
 * payload (dsim_isend_side) and reach the receive that takes it. Without
 * the flag hdr.side is not part of the frame (tcp does not carry it). */
#define DSIM_TP_F_SIDE 0x8u

/* The header of every frame (48 bytes and an optional sideband, host byte order; a backend that
 * crosses machines converts it). seq counts from 1 per (src, dst, comm_id)
 * within one epoch of comm_id, whatever the tag, and restarts at 1 when the
 * sender's epoch for comm_id changes. Keying it by pair and not by tag keeps
 * the tables one entry per peer and communicator even though collectives use
 * a fresh tag for every call; a backend therefore delivers the frames of one
 * (src, dst) pair in the order they were sent. */
typedef struct dsim_tp_hdr {
    uint32_t magic;    /* DSIM_TP_MAGIC */
    uint16_t version;  /* DSIM_TP_VERSION */
    uint16_t flags;    /* DSIM_TP_F_*; 0 on inproc */
    int32_t src;       /* sending rank */
    int32_t dst;       /* receiving rank */
    uint32_t comm_id;  /* communicator */
    uint32_t epoch;    /* the sender's epoch for comm_id */
    uint32_t tag;      /* never DSIM_ANY_TAG */
    uint32_t checksum; /* reserved for backends that checksum payloads (tcp) */
    uint64_t seq;
    uint64_t len; /* payload bytes */
    /* Only with DSIM_TP_F_SIDE; not counted in len. On tcp it follows the
     * 48 header bytes and the checksum covers it. */
    uint8_t side[DSIM_TP_SIDE_LEN];
} dsim_tp_hdr;

struct dsim_tp_ops {
    /* sizeof(struct dsim_tp_ops) as the backend was compiled; registration
     * accepts shorter (older) tables and treats missing members as NULL. */
    size_t size;
    /* Backend name used in dsim_fabric_cfg.backend: [a-z0-9_]+, unique. */
    const char *name;
    /* Bytes of backend state per fabric / endpoint / request, zeroed, found
     * with dsim_tp_fabric_priv / dsim_tp_ep_priv / dsim_tp_req_priv. */
    size_t fabric_priv_size;
    size_t ep_priv_size;
    size_t req_priv_size;

    /* Required. Sets up the fabric's backend state; options is the
     * "key=value,..." string from dsim_fabric_cfg (NULL if none). An unknown
     * key is an error (DSIM_EINVAL naming the key and the known ones). On
     * failure fabric_close is not called. */
    dsim_err (*fabric_open)(dsim_fabric *f, const char *options);
    /* Required. Releases the fabric's backend state. Every endpoint has been
     * closed and no call is in flight. */
    void (*fabric_close)(dsim_fabric *f);
    /* Required. Makes the local endpoint of ep's rank reachable. Frames may
     * be delivered to an endpoint before it is opened (they queue). */
    dsim_err (*ep_open)(dsim_ep *ep);
    /* Required. Called after every request of ep is finished and no more
     * frames are accepted for it; releases its backend state. */
    void (*ep_close)(dsim_ep *ep);
    /* Required. Moves one frame from ep to rank `to` (hdr->dst names the
     * intended rank; they differ only for injected misrouted frames, and
     * hdr->len differs from len only for injected corrupt ones: send hdr as
     * given and len bytes of payload). On DSIM_OK the backend owns req until
     * it calls dsim_tp_complete(req, ...) or passes req to dsim_tp_deliver as
     * zc_send; payload stays valid until then. On an error return req is
     * untouched and the shared layer frees it; record a message with
     * DSIM_ERR naming `to`. */
    dsim_err (*send)(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload, size_t len,
                     dsim_req *req);
    /* Optional. Withdraws a send that the backend still holds: DSIM_OK if
     * withdrawn (the backend will never touch req or its payload again; the
     * shared layer frees it), anything else if it is in progress (the shared
     * layer then waits for dsim_tp_complete, so complete it soon). Not
     * supported = always "in progress". Sends passed to dsim_tp_deliver as
     * zc_send are withdrawn by the shared layer, not by this call. */
    dsim_err (*cancel_send)(dsim_ep *ep, dsim_req *req);
    /* Optional. Called once after the fabric has been revoked locally (every
     * local waiter already woken): tell the peers this process can reach.
     * Not supported = nothing to tell (all ranks share this address space). */
    void (*abort)(dsim_fabric *f, int failed_peer, const char *why);
    /* Optional. How long ep's connections took to set up so far
     * (dsim_ep_get_conn_stats; out comes zeroed, slowest_peer -1). Not
     * supported = none (ranks that share memory connect nothing). */
    void (*conn_stats)(dsim_ep *ep, struct dsim_ep_conn_stats *out);
    /* Optional. Called by a thread about to sleep until req finishes (no
     * lock held; req is ep's): a backend whose frames are moved by a
     * progress thread may move them from the waiting thread for a short
     * while instead, returning as soon as dsim_req_done(req), or when
     * it gives up (its own budget, or deadline: the engine's clock). The
     * waiter then sleeps as usual. Not supported = the waiter sleeps at once. */
    void (*wait_assist)(dsim_ep *ep, dsim_req *req, int64_t deadline);
};

/* Registers a backend by name. The table is checked (size, name, required
 * members: DSIM_EINVAL with a message naming what is wrong; a taken name:
 * DSIM_EINVAL) and copied, missing optional members replaced by "not
 * supported" stubs. Built-in backends register themselves on first use. */
DSIM_API dsim_err dsim_transport_register(const struct dsim_tp_ops *ops);

/* The built-in backends. */
DSIM_API extern const struct dsim_tp_ops dsim_tp_inproc_ops;
/* tcp: sockets, in one process (every rank local, 127.0.0.1) or across
 * processes and machines. Options: addrs=HOST:PORT;HOST:PORT;... or
 * addrs_file=PATH (one address per rank), local=A-B (the ranks this process
 * hosts), connect_timeout=30s, io_threads=1, max_frame=1g; see tcp.c. */
DSIM_API extern const struct dsim_tp_ops dsim_tp_tcp_ops;

/* Backend state and context. */
DSIM_API void *dsim_tp_fabric_priv(dsim_fabric *f);
DSIM_API void *dsim_tp_ep_priv(dsim_ep *ep);
DSIM_API void *dsim_tp_req_priv(dsim_req *req);

DSIM_API dsim_rt *dsim_tp_fabric_rt(dsim_fabric *f);
DSIM_API dsim_fabric *dsim_tp_ep_fabric(dsim_ep *ep);
/* The shared-layer endpoint of `rank` in this address space, created on
 * first use (open or not yet); NULL if rank is out of range or memory ran
 * out (with an error recorded). Lives until the fabric closes. */
DSIM_API dsim_ep *dsim_tp_fabric_ep(dsim_fabric *f, int rank);

/* Hands an arrived frame to ep's receive path. payload holds len bytes.
 * Frames from one source must be handed over one at a time, in the order
 * they were sent (ops->send is already serialised per sending endpoint).
 * zc_send NULL: payload is only read during the call (copied into a posted
 * receive, or into a buffer). zc_send set (same address space only, and
 * only from within ops->send for that request): payload is the sender's
 * buffer and stays valid until the shared layer completes zc_send, which it
 * does once the payload has been copied or reduced by whichever side matches
 * it, or dropped; cancellation of zc_send is handled here too.
 * Returns DSIM_OK when the frame was taken, including when it was rejected
 * (rejections are counted in ep's dsim_ep_stats, never delivered, and never
 * reported to the sender, as on a real network). DSIM_EABORTED / DSIM_EPEER
 * (ep closed): the frame was not taken and zc_send is untouched. */
DSIM_API dsim_err dsim_tp_deliver(dsim_ep *ep, const dsim_tp_hdr *hdr, const void *payload,
                                  size_t len, dsim_req *zc_send);

/* A frame whose payload the backend reads on demand, straight into the
 * memory it ends in (the shm backend's cross-memory attach): one copy where
 * dsim_tp_deliver needs the payload whole in a buffer first.
 *
 * read(ctx, dst, off, n) puts payload bytes [off, off + n) at dst: 0, or an
 * errno (ESRCH: the sender's process is gone). It is called in order of
 * off, on the delivering thread, with no lock held. scratch (scratch_len
 * bytes, at least 64) is the backend's buffer for a reducing receive, which
 * reads the payload through it in pieces and reduces each piece while it is
 * still in cache.
 *
 * Parking (optional): a frame that no posted receive matches yet is read
 * into a buffer of its own at once, unless park is set and park(ctx)
 * returns a context that lasts (NULL: not now). Then the frame is queued
 * unread, and the receive that takes it reads it with read(that context,
 * ...) on the thread that posts it: the first read may return ECANCELED
 * (the sender withdrew the frame: the receive goes on as if it had never
 * come). release(that context, how) follows exactly once, when the payload
 * is no longer read: how 0 read whole, an errno (the read failed, or
 * ECANCELED), DSIM_TP_PULL_DROPPED (dropped unread as stale, which to the
 * sender is delivery) or DSIM_TP_PULL_REFUSED (dropped unread: the
 * endpoint closed first). release may be called under the endpoint's lock
 * and must not call back into the transport. */
#define DSIM_TP_PULL_DROPPED (-1)
#define DSIM_TP_PULL_REFUSED (-2)
typedef struct dsim_tp_pull {
    int (*read)(void *ctx, void *dst, size_t off, size_t n);
    void *ctx;
    void *scratch;
    size_t scratch_len;
    int err; /* out: the errno of the read that failed */
    void *(*park)(void *ctx);
    void (*release)(void *ctx, int how);
    int parked; /* out: 1 if the frame was queued unread (release follows) */
} dsim_tp_pull;

/* Delivers a frame of len payload bytes that p reads (the header's checks,
 * counts and matching as dsim_tp_deliver). Returns:
 *   DSIM_OK       taken (delivered, queued, or rejected as dsim_tp_deliver
 *                 rejects frames); the payload is no longer read by this
 *                 call (p->parked: it is read later, then released).
 *   DSIM_ENOTSUP  not taken, nothing read: a fault filter is installed or the
 *                 checksum is to be verified, both of which need the payload
 *                 whole first; hand it over with dsim_tp_deliver.
 *   DSIM_EIO      a read failed (p->err): the frame's sequence number is used
 *                 up and a receive it had matched is posted again, so that
 *                 the news of the sender's loss (dsim_tp_peer_lost), which the
 *                 backend must give, fails it; the backend must deliver
 *                 nothing more from that source.
 *   DSIM_EABORTED / DSIM_EPEER as dsim_tp_deliver: not taken, nothing read. */
DSIM_API dsim_err dsim_tp_deliver_pull(dsim_ep *ep, const dsim_tp_hdr *hdr, size_t len,
                                       dsim_tp_pull *p);

/* Completes a send request the backend owns. status != DSIM_OK: the calling
 * thread's error context (set with DSIM_ERR just before) goes with the
 * request and is what dsim_wait reports. */
DSIM_API void dsim_tp_complete(dsim_req *req, dsim_err status);

/* A send to rank `to` of this address space, from within ops->send, as
 * inproc sends every frame and shm those between ranks of one process: up
 * to eager_max bytes are copied (into a posted receive, or a buffer) and
 * req done at once; a larger frame goes as zero-copy, its payload read by
 * the receive that takes it, req done (or withdrawn on a cancel) by the
 * shared layer. Every frame of a pair sent this way arrives in order. */
static inline dsim_err dsim_tp_hand_over(dsim_fabric *f, int to, const dsim_tp_hdr *hdr,
                                         const void *payload, size_t len, size_t eager_max,
                                         dsim_req *req)
{
    dsim_ep *dst = dsim_tp_fabric_ep(f, to);
    if (!dst)
        return dsim_last_error()->code;
    if (len > eager_max)
        return dsim_tp_deliver(dst, hdr, payload, len, req);
    dsim_err e = dsim_tp_deliver(dst, hdr, payload, len, NULL);
    if (e == DSIM_OK)
        dsim_tp_complete(req, DSIM_OK);
    return e;
}

/* Sends a hand-made frame from ep to rank `to` through the backend, as
 * ops->send would, bypassing header construction and sequence numbering:
 * for conformance tests and the fault decorator (stale, misrouted, corrupt,
 * duplicate frames). Returns a send request like dsim_isend. */
DSIM_API dsim_err dsim_tp_inject(dsim_ep *ep, int to, const dsim_tp_hdr *hdr, const void *payload,
                                 size_t len, dsim_req **req);

/* The header dsim_isend would put on the next frame from ep to dst
 * (comm_id, tag, len; seq is the next one), without sending anything. */
DSIM_API dsim_err dsim_tp_hdr_next(dsim_ep *ep, int dst, uint32_t comm_id, uint32_t tag, size_t len,
                                   dsim_tp_hdr *out);

/* CRC-32C (Castagnoli) of n bytes: the payload checksum of every backend. */
DSIM_API uint32_t dsim_tp_checksum(const void *p, size_t n);
/* The same, zlib-style incremental: dsim_tp_crc32c(dsim_tp_crc32c(0, a), b)
 * is the CRC of a then b. */
DSIM_API uint32_t dsim_tp_crc32c(uint32_t crc, const void *buf, size_t n);

/* ---- fault filters ----
 *
 * A filter sees every frame as it arrives at a local endpoint, after the
 * backend and before the shared layer's checks, whatever the backend: this
 * is where injected faults live (ARCHITECTURE.md §1, the fault layer as a
 * receive-side filter), so drop, delay, duplicate, corrupt and partitions
 * behave the same on inproc, tcp and shm and in every process of a
 * multi-process job. Deciding at
 * the receiving side means a held frame is always re-delivered locally. */
typedef enum dsim_tp_filter_verdict {
    DSIM_TP_FILTER_PASS = 0, /* deliver as usual (the filter may have changed
                                hdr->flags and hdr->checksum) */
    DSIM_TP_FILTER_TAKEN,    /* the filter took the frame: it copied what it
                                needs (or dropped it) and may hand it over later
                                with dsim_tp_deliver_held; the sender's request
                                completes now, as for a message on the wire */
} dsim_tp_filter_verdict;

struct dsim_tp_filter {
    size_t size; /* sizeof(struct dsim_tp_filter) */
    /* Optional. Called once by dsim_fabric_open before the backend opens
     * (a backend may deliver frames from then on), e.g. to spawn a runtime
     * worker that re-delivers held frames. A failure fails the open; if the
     * backend then fails to open, detach is called. */
    dsim_err (*attach)(void *user, dsim_fabric *f);
    /* Optional. Called by dsim_fabric_close once the backend has closed (no
     * more frames arrive): stop handing frames over and release every held
     * one (endpoints are still allocated, closed). */
    void (*detach)(void *user, dsim_fabric *f);
    /* Required. A frame from hdr->src arrived for the local endpoint ep.
     * Called on whatever thread delivers (a sender's worker on inproc, an
     * I/O thread on tcp); frames of one (src, dst) pair come one at a time
     * in order, and a filter that holds one must hold the later ones of
     * that pair behind it. Must not block; must not call into the
     * transport except dsim_tp_fabric_ep / dsim_ep_rank. */
    dsim_tp_filter_verdict (*on_deliver)(void *user, dsim_ep *ep, dsim_tp_hdr *hdr,
                                         const void *payload, size_t len);
    /* Optional. The local endpoint ep handed a frame to the backend (after
     * the backend took it; on inproc it may already have been delivered).
     * Called on the sender's thread, without transport locks held; the
     * filter sees the frames a local rank sends even when their receiver is
     * another process (a fault that fires after a rank's Nth frame). Must
     * not call into the transport. */
    void (*on_sent)(void *user, dsim_ep *ep, const dsim_tp_hdr *hdr);
    /* Optional. Modelled connection set-up times of the local endpoint ep
     * (dsim_ep_get_conn_stats): when set, they replace the backend's (a
     * network model stands for the links the backend does not have). Must
     * not call into the transport. */
    void (*conn_stats)(void *user, dsim_ep *ep, struct dsim_ep_conn_stats *out);
    /* Optional. The backend says the link that brought frames from `peer`
     * to the local endpoint ep broke (dsim_tp_peer_lost: the peer closed
     * its connection or its process ended). Frames of that pair the filter
     * holds arrived before the break, and a receiver must get them before
     * it hears of it: return DSIM_TP_FILTER_TAKEN to take the break (copy
     * msg) and hand it over after them with dsim_tp_peer_lost_held, or
     * DSIM_TP_FILTER_PASS to let it go now. Same threading rules as
     * on_deliver. */
    dsim_tp_filter_verdict (*on_peer_lost)(void *user, dsim_ep *ep, int peer, int blame,
                                           dsim_err code, const char *msg);
};

/* Hands a frame the filter took to ep's receive path, bypassing the filter
 * (payload is read during the call only). Same results as dsim_tp_deliver. */
DSIM_API dsim_err dsim_tp_deliver_held(dsim_ep *ep, const dsim_tp_hdr *hdr, const void *payload,
                                       size_t len);
/* Hands a link break the filter took (on_peer_lost) to ep, bypassing the
 * filter: as dsim_tp_peer_lost_blaming with the message as given. */
DSIM_API void dsim_tp_peer_lost_held(dsim_ep *ep, int peer, int blame, dsim_err code,
                                     const char *msg);

/* For backends whose links can break (a connection closes, is reset, or
 * carries a corrupt frame: a byte stream cannot be resynchronised): the link
 * that brought frames from rank `peer` to ep is gone for good. Every receive
 * posted at ep from peer, on any comm and tag, fails now with code and the
 * message, and so does every later one that finds no message from peer
 * already queued (what arrived before the break is still received). Sends are
 * the backend's business: it fails them with DSIM_EPEER naming the peer. The
 * first call per peer stands.
 *
 * The rule for a send that fails after dsim_isend took its sequence number
 * (else the receiver would see a gap): a frame withdrawn before any byte left
 * is replaced by its header alone, handed to dsim_tp_withdrawn on the other
 * side, so the sequence stays in step; a frame partly on the wire is finished
 * from a copy (it completes DSIM_OK); a frame whose write fails breaks the
 * link for good: the sender fails it and every later send to that peer with
 * DSIM_EPEER, the receiver sees the link go and calls dsim_tp_peer_lost. A
 * sequence gap is therefore never skipped silently on a live link. */
DSIM_API void dsim_tp_peer_lost(dsim_ep *ep, int peer, dsim_err code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* As dsim_tp_peer_lost, for a link that went as a consequence of another
 * rank's failure (a peer that closed after it saw `blame` die): the failed
 * receives name `blame` as the failed peer, so that the error points at the
 * cause. */
DSIM_API void dsim_tp_peer_lost_blaming(dsim_ep *ep, int peer, int blame, dsim_err code,
                                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Counts one frame for ep that the backend dropped as corrupt before it could
 * hand it over (bad checksum or framing), in dsim_ep_stats.rejected_corrupt. */
DSIM_API void dsim_tp_count_corrupt(dsim_ep *ep);
/* The header of a frame whose sender withdrew it after it took its sequence
 * number: the receive path checks it and advances the sequence of its pair
 * as for a delivered frame (a gap before it is still reported), but delivers
 * nothing. Same ordering rule and return values as dsim_tp_deliver. */
DSIM_API dsim_err dsim_tp_withdrawn(dsim_ep *ep, const dsim_tp_hdr *hdr);

/* Walks a backend options string "key=value,key=value". Each call stores
 * the next pair (NUL-terminated) and returns 1; 0 at the end; -1 on a
 * malformed item or one too long for the buffers (with an error recorded
 * naming the backend and the item). *cursor starts at the string (or NULL). */
DSIM_API int dsim_tp_opt_next(const char *backend, const char **cursor, char *key, size_t kcap,
                              char *val, size_t vcap);
/* Parses a byte count with an optional k/m/g suffix (powers of 1024). */
DSIM_API dsim_err dsim_tp_opt_size(const char *backend, const char *key, const char *val,
                                   size_t *out);

#ifdef __cplusplus
}
#endif
#endif
