/* The message log: which transport frame went from which rank to which,
 * when it was sent and when it arrived, for the arrows from a send to its
 * receive in `dsim trace` (sim/report/trace_events.c).
 *
 * Frames are seen where the fault layer sees them (dsim/spi/transport.h):
 * a send when the sender's endpoint handed it to the backend (on_sent), an
 * arrival when it reached the receiver's endpoint and was passed on (a frame
 * a fault held is logged when it is released; one dropped is never logged
 * as arrived). On a run without faults the log is the transport filter
 * itself (dsim_msg_log_attach); under faults, the faults' filter feeds it
 * (dsim_faults_set_msg_log). Each side is a half record; dsim_msg_log_join
 * pairs them by (attempt, src, dst, comm, epoch, seq), so halves logged in
 * different processes (the processes engine: each child logs its ranks'
 * sends and arrivals and ships the halves to the parent) join the same way.
 *
 * Bounded: only the first DSIM_MSG_LOG_PER_LINK frames of each link and
 * communicator (src, dst, comm) per attempt are logged: sender and receiver
 * decide alike from the sequence number alone, so both halves of a logged
 * frame are kept in every process. Later frames are counted as dropped (on
 * the sending side), as are frames beyond DSIM_MSG_LOG_CAP halves in one
 * log. Times are the job's runtime clock (the steps' clock: virtual under
 * sim, CLOCK_MONOTONIC otherwise).
 *
 * Thread-safety: every call but create/destroy may come from any thread. */
#ifndef DSIM_SIM_MSGLOG_H
#define DSIM_SIM_MSGLOG_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/spi/transport.h"
#include "dsim/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_MSG_LOG_PER_LINK 256
#define DSIM_MSG_LOG_CAP      (1 << 17)
/* Runs with more ranks than this are not logged (the harness's rule). */
#define DSIM_MSG_LOG_MAX_RANKS 16

/* A frame, or half of one: t_sent_ns / t_recv_ns < 0 where not seen. */
typedef struct dsim_msg_rec {
    int attempt;
    int src, dst;
    uint32_t comm_id, epoch, tag;
    uint64_t seq, bytes;
    int64_t t_sent_ns, t_recv_ns;
} dsim_msg_rec;

typedef struct dsim_msg_log dsim_msg_log;

dsim_err dsim_msg_log_create(dsim_msg_log **out);
void dsim_msg_log_destroy(dsim_msg_log *log);

/* A new attempt begins (its fabric numbers frames from 1 again): the
 * halves logged from now on carry the next attempt number. The first
 * attempt is 0; call this before each later one. */
void dsim_msg_log_next_attempt(dsim_msg_log *log);
int dsim_msg_log_attempt(dsim_msg_log *log);

/* A frame src -> hdr->dst was sent at t, or arrived at hdr->dst from
 * hdr->src at t (the filter's view). */
void dsim_msg_log_sent(dsim_msg_log *log, int src, const dsim_tp_hdr *hdr, int64_t t);
void dsim_msg_log_arrived(dsim_msg_log *log, int dst, const dsim_tp_hdr *hdr, int64_t t);

/* Appends halves logged elsewhere (another process's), stamped with this
 * log's attempt, and `dropped` more frames not logged there. */
void dsim_msg_log_add(dsim_msg_log *log, const dsim_msg_rec *halves, size_t n, uint64_t dropped);

/* The halves so far (a copy in *out, free()d by the caller; NULL when none
 * or out of memory) and the frames not logged. */
size_t dsim_msg_log_halves(dsim_msg_log *log, dsim_msg_rec **out, uint64_t *dropped);

/* The frames: the halves joined, sorted by send time (then arrival);
 * *out is malloc()ed (NULL when none). */
dsim_err dsim_msg_log_join(dsim_msg_log *log, dsim_msg_rec **out, size_t *n, uint64_t *dropped);

/* For a run without faults: points cfg's transport filter at the log (cfg
 * must have none). The log must outlive the run. */
void dsim_msg_log_attach(dsim_msg_log *log, dsim_train_cfg *cfg);

#ifdef __cplusplus
}
#endif
#endif
