/* The shm transport: the ranks of a job in processes of one host (or
 * threads of one process) connected through one shared mapping.
 *
 * The mapping. One per job, made by dsim_shm_create before the processes
 * are forked: the parent creates it, every child inherits the descriptor and
 * opens its fabric with options "fd=N,local=A-B" (the ranks it hosts). A
 * fabric opened without fd= makes a mapping of its own and hosts every rank
 * (threads of one process). A rank is hosted once per mapping: a job that
 * restarts its processes makes a new mapping.
 *
 * Options ("key=value,key=value"):
 *   fd=N           the descriptor of a mapping made by dsim_shm_create
 *   local=A-B | A  the ranks this process hosts (default: all); needs fd=
 *   ring=BYTES     each ordered pair's ring for small messages (default
 *                  512k; power of two, 16k..64m); only where the mapping
 *                  is made (without fd=, or in dsim_shm_create)
 *   bounce=BYTES   each pair's bounce buffer for large messages where cross
 *                  memory attach is refused (default 1m; 64k..1g); likewise.
 *                  The mapping may take at most 256 GiB of address space:
 *                  for a job of more than 418 ranks the sizes not given are
 *                  halved (down to 16k and 64k) until it fits (1024 ranks:
 *                  ring=128k, bounce=64k); beyond 1,832 ranks nothing fits
 *   eager_max=BYTES  messages up to this size go through the ring (default
 *                  64k, or less where a quarter of the ring is less; at
 *                  most a quarter of the ring); larger ones by rendezvous
 *   cma=auto|staged|off  auto (default): the receiver reads a large
 *                  message from the sender's memory (process_vm_readv)
 *                  straight into the receive that takes it, one copy (a
 *                  reducing receive in pieces, piece=, reduced while in cache;
 *                  the first message from a peer, and every one where a
 *                  fault filter or a checksum needs the payload whole
 *                  first, goes through a staging buffer, two copies);
 *                  falling back to the bounce buffer for a peer whose
 *                  memory the kernel does not let it read (EPERM: Yama's
 *                  ptrace_scope 2 or 3, a seccomp filter; under scope 1
 *                  each process lets the others read it, PR_SET_PTRACER_ANY,
 *                  as Open MPI does); staged: always through
 *                  the staging buffer; off: always the bounce buffer. The
 *                  environment variable DSIM_SHM_CMA sets the default.
 *   piece=BYTES    the pieces a reducing receive reads the sender's memory
 *                  in, each reduced while in cache (default: an eighth of
 *                  the L2 cache, 32k..256k, or 128k where the C library
 *                  does not say; 16k..4m in 4k steps). DSIM_SHM_PIECE sets
 *                  the default
 *   park=on|off    on (default): a large message that comes before its
 *                  receive is posted waits unread (its send is not done)
 *                  and the receive reads it when posted, as inproc does
 *                  with large messages; at most 8 per pair wait so, the
 *                  rest are read at once into a buffer. off: every one is
 *                  read at once. DSIM_SHM_PARK sets the default.
 *   direct=on|off  on (default): a send between two ranks of this process
 *                  is handed straight to the receiving endpoint, as inproc
 *                  does (a small message copied, a large one read by the
 *                  receive out of the sender's buffer); off: through the
 *                  rings and the progress thread, as between processes
 *                  (what the tests of the rings use). DSIM_SHM_DIRECT sets
 *                  the default.
 *   spin=T         how long the progress thread polls before it sleeps on
 *                  its futex (default 0: it sleeps at once; T is a number
 *                  with us, ms or s)
 *   assist=T       how long a worker about to sleep until its request
 *                  finishes reads the rings itself, yielding the CPU
 *                  between looks that find nothing (default 50us; 0: it
 *                  sleeps at once and the progress thread moves every
 *                  frame). Saves the progress thread's wake-up and the
 *                  worker's on each small message. Past T, a worker goes on
 *                  while a large send of its process is being read (or about
 *                  to be, or just was) by its receiver, up to 5 ms from the
 *                  start of its wait: that send ends a copy later, and a
 *                  sleep would cost a wake-up on each side. The variable
 *                  DSIM_SHM_ASSIST sets the default. A worker's own send
 *                  to a process none of whose workers assists gives them
 *                  2 us to begin (reading its own rings meanwhile, as an
 *                  assisting worker) before it wakes that process's
 *                  progress thread: both sides of an exchange send and
 *                  then wait, and then neither wakes the other.
 *
 * Failures. A process that hosts ranks watches the processes of its peers
 * (pidfd): when one ends, whatever of its frames are complete in the rings
 * are delivered, then every receive from its ranks fails with DSIM_EPEER
 * ("peer 3 died: ..."), as do the sends to them. A frame is visible only
 * once it is whole, and a large message is handed over only once all of it
 * has been read, so a peer killed half-way through never yields torn data
 * (a receive it was being read into fails with the death, whatever it
 * holds). */
#ifndef DSIM_SPI_SHM_H
#define DSIM_SPI_SHM_H

#include <stdint.h>

#include "dsim/spi/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

DSIM_API extern const struct dsim_tp_ops dsim_tp_shm_ops;

/* Makes the shared mapping of an nranks-rank job and returns its
 * descriptor in *fd (close-on-exec: a process that execs its workers clears
 * FD_CLOEXEC first). options: NULL, or ring= and bounce= as above. The
 * caller closes *fd once every process that needs it has it (fabrics map
 * the descriptor and do not keep or close it). The mapping's size is about
 * nranks^2 * (ring + bounce). Where its rings come to at most 64 MiB in all
 * (up to 11 ranks at the default ring), each process's fabric maps in the
 * rings its ranks send into and read from when it opens, so that the first
 * messages through a ring take no page faults; beyond that, and for the
 * bounce buffers, pages are touched only where pairs talk, and most of the
 * mapping is address space. */
DSIM_API dsim_err dsim_shm_create(int nranks, const char *options, int *fd);

/* What moved how, as seen by the ranks of this process (the receiving side
 * counts a message). */
typedef struct dsim_shm_stats {
    uint64_t eager_msgs, eager_bytes;   /* through the rings */
    uint64_t cma_msgs, cma_bytes;       /* read from the sender's memory (process_vm_readv) */
    uint64_t bounce_msgs, bounce_bytes; /* through a bounce buffer */
    uint64_t local_msgs, local_bytes;   /* between ranks of this process: every message where
                                           direct=on, else the large ones (handed over) */
    uint64_t cma_refused;               /* peers whose memory the kernel would not let us read */
    uint64_t sleeps;                    /* times the progress thread slept on its futex */
    uint64_t peers_died;                /* peer processes seen to end without closing */
    uint64_t assisted;                  /* waits that ended while the waiter read the rings */
    uint64_t cma_direct;                /* of cma_msgs, read straight into the receive that took
                                           them (one copy); the rest went through a staging buffer */
    uint64_t wakes;                     /* progress threads this process woke (FUTEX_WAKE) */
    uint64_t graces;                    /* sends that gave a sleeping receiver 2 us first */
    uint64_t cma_reads;                 /* process_vm_readv calls of the cma_direct messages: one
                                           for a plain receive, one a piece (shm option piece=)
                                           for a reducing one */
} dsim_shm_stats;

/* The counters of an shm fabric; DSIM_EINVAL if f is not one. */
DSIM_API dsim_err dsim_shm_get_stats(dsim_fabric *f, dsim_shm_stats *out);

#ifdef __cplusplus
}
#endif
#endif
