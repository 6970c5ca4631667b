/* libfiu fault points (ARCHITECTURE.md §1, §6): named places where a test makes an
 * operation fail as it would fail for real, without a scenario.
 *
 * Built with libfiu (meson option `fiu`, auto), these points are compiled
 * in; each fails with the error the real operation returns:
 *
 *   dsim/ckpt/open     creating PATH.tmp of a checkpoint (dsim_checkpoint_write)
 *   dsim/ckpt/write    each write(2) of a checkpoint's bytes
 *   dsim/ckpt/fsync    the fsync(2) of PATH.tmp
 *   dsim/ckpt/rename   the rename(2) of PATH.tmp over PATH
 *                      all four: DSIM_EIO naming the file and strerror(errno);
 *                      errno is the point's failinfo (e.g. (void *)28, ENOSPC),
 *                      or EIO when it is 0, and the temporary file is removed
 *                      as after a real failure
 *   dsim/tp/send       dsim_isend, before the request is made or a sequence
 *                      number taken: DSIM_EPEER naming the destination rank
 *                      (a reset connection; errno from failinfo, default
 *                      ECONNRESET)
 *
 * The shm transport's points stop the process (SIGSTOP) half-way through a
 * copy, where a kill would land, so that a test can kill it there:
 *
 *   dsim/shm/ring_write  a sender, half of a record's payload in the ring
 *   dsim/shm/pull        a receiver, half of a large message read
 *   dsim/shm/push        a sender, half of a large message in the bounce
 *                        buffer
 *
 * and two hold something up, so that events meet in a given order:
 *
 *   dsim/shm/poll_late   every look at the rings of the process (20 ms):
 *                        what a peer did last and its departure arrive as
 *                        news at the same look
 *   dsim/shm/watch_late  the watcher, 300 ms after it sees a peer process
 *                        end: a reader of that peer's memory learns of the
 *                        death first
 *   dsim/coll/probe_late a collective's look at a late peer's fingerprint
 *                        (src/coll/step.c), 300 ms before it posts its
 *                        receive: the peer's part and its departure then
 *                        arrive while the look goes on
 *
 * The results store (sim/store) has dsim/store/open and dsim/store/write.
 *
 * Arming. libfiu's fiu_fail() takes a process-wide lock and looks the name
 * up on every call, which on a send path shared by many threads costs more
 * than the flag test it replaces. So a point asks libfiu only while points
 * are armed: from the start in a process run under fiu-run (which exports
 * FIU_ENABLE), or after dsim_fiu_arm(1), which a test calls before it
 * enables a point with fiu_enable*() (after fiu_init). Disarmed, a point is
 * one relaxed atomic load. */
#ifndef DSIM_FIU_H
#define DSIM_FIU_H

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arms (on != 0) or disarms every dsim/... point. DSIM_ENOTSUP when this
 * libdsim was built without libfiu: it has no points to arm. */
DSIM_API dsim_err dsim_fiu_arm(int on);

/* 1 while points are armed (never in a build without libfiu). */
DSIM_API int dsim_fiu_armed(void);

#ifdef __cplusplus
}
#endif
#endif
