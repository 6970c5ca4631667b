/* The allreduce decision function: what DSIM_ALGO_AUTO runs.
 *
 * Cost per call in the usual alpha-beta model (alpha per step, beta per
 * byte moved and combined; S bytes, n ranks, p the largest power of two
 * <= n, L = ceil(log2 n)):
 *
 *   tree           2L alpha + 2L S beta          few steps, whole buffers
 *   rhd            2 log2(p) alpha + 2 (p-1)/p S beta
 *                  + (n != p: 2 alpha + 2 S beta for the folded ranks)
 *   ring           2 (n-1) alpha + 2 (n-1)/n S beta
 *   reduce_to_one  rank 0 alone moves and combines (n-1) S twice: never
 *                  chosen; it is TF's baseline, run on request
 *
 * Thresholds, from that model and from measurements on inproc (threads
 * engine, f32 sum, 2 cores, 4 to 16 ranks; tests/coll/bench_allreduce):
 *
 *   S <= 64 KiB: tree. The step count dominates. Measured: 16 KiB on 4 ranks
 *     tree 73 us, rhd 86 us, ring 136 us; 16 KiB on 16 ranks tree 163 us,
 *     rhd 290 us, ring 591 us; at 64 KiB tree is still first or within
 *     10 %. Blocks of S/n bytes are too small for splitting to pay.
 *   n a power of two, S > 64 KiB: rhd. As few steps as the tree but only
 *     2 (p-1)/p S on the wire per rank, the same as the ring. Measured on 4
 *     ranks: 4 MiB rhd 0.66 ms vs ring 0.75 ms; 16-64 MiB all algorithms
 *     are within noise of each other (2-4 GB/s busbw; memory bound on 2
 *     cores) and above Open MPI's MPI_Allreduce here (about 1 GB/s).
 *   n not a power of two: the fold sends whole buffers to and from the
 *     2 (n-p) folded ranks, up to twice the ring's traffic, while the
 *     ring's extra cost is 2 (n-1) steps. Once each rank's block S/n
 *     reaches 1 MiB the bytes dominate and the ring wins (7 ranks: 4 MiB
 *     rhd 2.1 ms vs ring 2.6 ms; 64 MiB ring 54 ms vs rhd 60 ms); below it,
 *     rhd. The ring is also the only one that talks to neighbours alone,
 *     which is what real networks (tcp between hosts) reward at large S.
 *
 * A caller overrides the choice with cfg.algo, dsim_comm_set_algo or
 * dsim_allreduce_with. */
#include "coll_int.h"

#define DECIDE_SMALL_BYTES      ((size_t)64 << 10)
#define DECIDE_RING_BLOCK_BYTES ((size_t)1 << 20)

dsim_algo dsim_allreduce_decide(size_t bytes, int nranks)
{
    if (nranks <= 1)
        return DSIM_ALGO_RING; /* nothing moves; any answer is right */
    if (bytes <= DECIDE_SMALL_BYTES)
        return DSIM_ALGO_TREE;
    int pow2 = (nranks & (nranks - 1)) == 0;
    if (!pow2 && bytes / (size_t)nranks >= DECIDE_RING_BLOCK_BYTES)
        return DSIM_ALGO_RING;
    return DSIM_ALGO_RHD;
}
