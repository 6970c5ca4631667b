/* The allreduce decision function: what DSIM_ALGO_AUTO runs.
 *
 * Cost per call in the usual alpha-beta model (alpha per step, beta per
 * byte moved and combined; S bytes, n ranks, p the largest power of two
 * <= n, L = ceil(log2 n)):
 *
 *   tree           2L alpha + 2L S beta          few steps, whole buffers
 *   recursive_doubling  log2(p) (alpha + S beta) + (n != p: 2 alpha + 2 S beta)
 *   rhd            2 log2(p) alpha + 2 (p-1)/p S beta
 *                  + (n != p: 2 alpha + 2 S beta for the folded ranks)
 *   ring           2 (n-1) alpha + 2 (n-1)/n S beta
 *   reduce_to_one  rank 0 alone moves and combines (n-1) S twice: never
 *                  chosen; it is TF's baseline, run on request
 *
 * Thresholds, from that model and from measurements on inproc (threads
 * engine, f32 sum, 2 cores, 4 to 16 ranks; tests/coll/bench_allreduce):
 *
 *   n a power of two, S <= 8 KiB: recursive doubling. log2(n) steps, every
 *     rank exchanging its whole partial result, against the tree's 2 log2(n)
 *     with half the ranks idle; the extra bytes (log2(n) S a rank) cost
 *     nothing at these sizes. Measured (threads, 2 cores, medians of 3):
 *     4 ranks 8 B 13.1 us against the tree's 19.2, 2 KiB 9.9 against 14.7,
 *     8 KiB 14.6 against 17.8, 32 KiB 21.0 against 18.2 (the tree ahead);
 *     8 ranks 8 B-8 KiB 0.75-1.05x the tree's time, 32 KiB 1.5x; processes
 *     over tcp, 4 ranks: 0.68-0.95x up to 8 KiB. On other rank counts the
 *     fold's two extra steps leave it even with the tree (3 ranks: 0.97-1.05x
 *     up to 2 KiB), so the tree stays there.
 *   S <= 64 KiB otherwise: tree. The step count dominates. Measured: 16 KiB on 4 ranks
 *     tree 73 us, rhd 86 us, ring 136 us; 16 KiB on 16 ranks tree 163 us,
 *     rhd 290 us, ring 591 us; at 64 KiB tree is still first or within
 *     10 %. Blocks of S/n bytes are too small for splitting to pay.
 *   n a power of two, S > 64 KiB: rhd. As few steps as the tree but only
 *     2 (p-1)/p S on the wire per rank, the same as the ring. Measured on 4
 *     ranks: 4 MiB rhd 0.66 ms vs ring 0.75 ms; 16-64 MiB all algorithms
 *     are within noise of each other (2-4 GB/s busbw; memory bound on 2
 *     cores) and above Open MPI's MPI_Allreduce here (about 1 GB/s).
 *   n a power of two, blocks S/n of 16 MiB and more: ring. In one address
 *     space and over shared memory the two are even there (64 MiB on 4
 *     ranks: threads rhd 34.9 ms, ring 34.5; processes over shm 66.9 and
 *     67.8), but over sockets rhd's first halving moves half the buffer to
 *     one peer in one frame while the ring streams blocks to its neighbour
 *     (processes over tcp: rhd 208 ms, ring 187; medians of 4).
 *   n not a power of two: the fold sends whole buffers to and from the
 *     2 (n-p) folded ranks, up to twice the ring's traffic, while the
 *     ring's extra cost is 2 (n-1) steps. Once each rank's block S/n
 *     reaches 1 MiB the bytes dominate and the ring wins (7 ranks: 4 MiB
 *     rhd 2.1 ms vs ring 2.6 ms; 64 MiB ring 54 ms vs rhd 60 ms); below it,
 *     rhd. The ring is also the only one that talks to neighbours alone,
 *     which is what real networks (tcp between hosts) reward at large S.
 *
 * Over hosts (the communicator's topology is known, dsim_comm_cfg.local_size,
 * and its ranks sit L to a host on H >= 2 hosts, L >= 2): hierarchical for
 * S > 64 KiB. Intra-host links are faster than a host's NIC (NVLink 150-450
 * GB/s, PCIe 25 GB/s, shared memory against 0.1-12 GB/s NICs: costmodel.c),
 * and a flat algorithm paces most of its steps by the NIC. From the cost
 * model's schedules (sim/model/algo_cost.c: NIC shared by a host's flows,
 * intra-host links per device; N = H L, alpha_e, B_e the NIC's, alpha_a,
 * B_a the host's):
 *
 *   ring           2 (N-1) (alpha_e + S / (N B_e))      (one flow per NIC)
 *   hierarchical   2 (L-1) (alpha_a + S / (L B_a)) + 2 (H-1) (alpha_e + S / (H B_e))
 *   ring - hier =  2 (L-1) [ (H alpha_e - alpha_a) + S/L (1 / (H B_e) - 1 / B_a) ]
 *
 * Against the ring the latency part always favours hierarchical (2 (H-1)
 * slow steps instead of 2 (N-1)); the bandwidth part too unless the host's
 * link is slower than H NICs together, and even there (16 hosts on 100 Gb/s
 * InfiniBand with NVLink 2.0) the two stay within 1 % up to ResNet-50's
 * 102 MB. So where the flat decision says ring, hierarchical.
 *
 * Against rhd it is a trade. rhd's halvings cross hosts first: log2 H slow
 * steps, but every one of a host's L ranks sends through the one NIC at
 * once, 2 L S (H-1)/H bytes per NIC against the two levels' 2 S (H-1)/H:
 *
 *   rhd - hier ~ 2 (L-1) S (H-1) / (H B_e) - 2 (H-1-log2 H) alpha_e
 *
 * (the in-host parts are alike and small). The library does not know
 * alpha_e B_e, the slow link's bandwidth-delay product; the presets' largest
 * (1gbe 5.9 KB, ib100 12.1 KB, 10gbe 23.5 KB, 25gbe 29.4 KB: costmodel.c) is
 * under DECIDE_LINK_BDP_BYTES, so hierarchical is chosen when
 * (L-1) S (H-1)/H >= (H-1-log2 H) x 32 KiB and rhd otherwise: the two
 * levels' ring across hosts grows with H while rhd's steps grow with log2 H.
 * 4 x 4 and 16 x 8 with 102 MB: hierarchical by a wide margin (3.7x and
 * 7.9x faster than rhd on 10GbE); 512 x 8 with 4 MB: hierarchical (29 MB
 * against 16 MB; simulated on 10GbE 23 ms against rhd's 55 ms); 8,192 x 8
 * with 4 MB: rhd (the two levels' 16,382 slow steps would cost 0.33 s of
 * latency alone). Small buffers stay with the flat choice (recursive
 * doubling's log2 N steps or the tree's 2 log2 N, against 2 (L-1) + 2 (H-1)).
 * Figures: reports/hierarchical.md.
 *
 * A caller overrides the choice with cfg.algo, dsim_comm_set_algo or
 * dsim_allreduce_with. A cost model that knows the job's network decides
 * instead of the thresholds above through dsim_comm_set_decide (the
 * harness's: sim/model/costmodel.c, dsim_cost_decide). */
#include <stdint.h>

#include "coll_int.h"

#define DECIDE_TINY_BYTES       ((size_t)8 << 10)
#define DECIDE_SMALL_BYTES      ((size_t)64 << 10)
#define DECIDE_RING_BLOCK_BYTES ((size_t)1 << 20)
#define DECIDE_RING_POW2_BYTES  ((size_t)16 << 20)
#define DECIDE_LINK_BDP_BYTES   32768.0

dsim_algo dsim_allreduce_decide(size_t bytes, int nranks)
{
    if (nranks <= 1)
        return DSIM_ALGO_RING; /* nothing moves; any answer is right */
    int pow2 = (nranks & (nranks - 1)) == 0;
    if (pow2 && bytes <= DECIDE_TINY_BYTES)
        return DSIM_ALGO_RECURSIVE_DOUBLING;
    if (bytes <= DECIDE_SMALL_BYTES)
        return DSIM_ALGO_TREE;
    if (!pow2 && bytes / (size_t)nranks >= DECIDE_RING_BLOCK_BYTES)
        return DSIM_ALGO_RING;
    if (pow2 && bytes / (size_t)nranks >= DECIDE_RING_POW2_BYTES)
        return DSIM_ALGO_RING;
    return DSIM_ALGO_RHD;
}

/* Hierarchical or what the flat decision says, for H hosts of L ranks
 * (H, L >= 2) and S > 64 KiB: the trade above. */
static dsim_algo decide_levels(size_t bytes, int H, int L)
{
    long long n = (long long)H * L;
    dsim_algo flat = dsim_allreduce_decide(bytes, n <= INT32_MAX ? (int)n : INT32_MAX);
    if (flat != DSIM_ALGO_RHD)
        return DSIM_ALGO_HIERARCHICAL; /* against the ring (or the tree's sizes: not here) */
    int lg = 0;
    while ((2LL << lg) <= H)
        lg++;
    double saved = (double)(L - 1) * (double)bytes * (double)(H - 1) / (double)H;
    double lost = (double)(H - 1 - lg) * DECIDE_LINK_BDP_BYTES;
    return saved >= lost ? DSIM_ALGO_HIERARCHICAL : DSIM_ALGO_RHD;
}

dsim_algo dsim_allreduce_decide_hosts(size_t bytes, int hosts, int local)
{
    if (hosts >= 2 && local >= 2 && bytes > DECIDE_SMALL_BYTES)
        return decide_levels(bytes, hosts, local);
    long long n = (long long)hosts * local;
    return dsim_allreduce_decide(bytes, n > 0 && n <= INT32_MAX ? (int)n : 1);
}

/* The hosts x local the communicator's ranks sit on, 0 x 0 if uneven or
 * not known. */
static void decide_shape(dsim_comm *c, int *hosts, int *local)
{
    *hosts = *local = 0;
    if (c->local_size >= 2) {
        const dsim_coll_hier *h = dsim_coll_hier_of(c);
        if (h && h->uniform && h->H >= 2 && h->L >= 2) {
            *hosts = h->H;
            *local = h->L;
        } else if (!c->ep_of && c->size == c->local_size) {
            *hosts = 1; /* the world of one host */
            *local = c->size;
        }
    } else if (c->local_size == 1) {
        *hosts = c->size; /* a rank per host */
        *local = 1;
    }
}

dsim_algo dsim_coll_decide(dsim_comm *c, size_t bytes)
{
    int H, L;
    decide_shape(c, &H, &L);
    if (c->decide) {
        dsim_algo a = c->decide(c->decide_user, bytes, c->size, H, L);
        if (a > DSIM_ALGO_AUTO && a < DSIM_ALGO_COUNT &&
            (a != DSIM_ALGO_HIERARCHICAL || (H >= 2 && L >= 2)))
            return a;
    }
    if (H >= 2 && L >= 2 && bytes > DECIDE_SMALL_BYTES)
        return decide_levels(bytes, H, L);
    return dsim_allreduce_decide(bytes, c->size);
}
