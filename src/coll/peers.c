/* Per-peer state of a communicator, kept only for the peers a rank
 * exchanges with (coll_int.h, dsim_coll_peer).
 *
 * A rank in a ring talks to two peers, in rhd or a tree to about log2(W);
 * only the failure check after a timeout talks to all. Arrays indexed by
 * rank would make a job of W ranks hold O(W^2) (at 65,536 ranks about 150
 * bytes x 65,536 x 65,536), so peers are made on first use and found
 * through a small hash table:
 *
 *   peer_map (open addressing, linear probing, at most half full)
 *   +------+------+------+------+------+------+------+------+
 *   |  .   | ->p7 |  .   | ->p1 | ->p3 |  .   |  .   |  .   |
 *   +------+------+------+------+------+------+------+------+
 *               |             |      |
 *   peer_chunks: [ p1 p3 p7 . . . . . ] -> [ ... ] -> ...
 *                (never moved: receives are posted into them)
 *
 * Only the table is reallocated as peers come (rehashed into twice the
 * slots); peers never go before the communicator does. */
#include <stdlib.h>

#include "coll_int.h"

/* The largest chunk, in peers (about 150 KiB). */
#define PEER_CHUNK_MAX 1024
#define PEER_CHUNK_MIN 8

static void peer_insert(dsim_coll_peer **map, uint32_t mask, dsim_coll_peer *q)
{
    uint32_t h = ((uint32_t)q->rank * 0x9E3779B1u) & mask;
    while (map[h])
        h = (h + 1) & mask;
    map[h] = q;
}

dsim_coll_peer *dsim_coll_peer_make(dsim_comm *c, int p)
{
    dsim_coll_peer *q = dsim_coll_peer_get(c, p);
    if (q)
        return q;
    /* Room in the table first (at most half full after the insert), then
     * in a chunk: a failure leaves everything as it was. */
    if (!c->peer_map || 2 * ((uint32_t)c->npeers + 1) > c->peer_mask + 1) {
        uint32_t nslots = c->peer_map ? 2 * (c->peer_mask + 1) : 16;
        dsim_coll_peer **map = calloc(nslots, sizeof *map);
        if (!map)
            return NULL;
        for (uint32_t i = 0; c->peer_map && i <= c->peer_mask; i++)
            if (c->peer_map[i])
                peer_insert(map, nslots - 1, c->peer_map[i]);
        free(c->peer_map);
        c->peer_map = map;
        c->peer_mask = nslots - 1;
    }
    dsim_coll_peer_chunk *k = c->peer_chunks;
    if (!k || k->used == k->cap) {
        int cap = c->npeers < PEER_CHUNK_MIN   ? PEER_CHUNK_MIN
                  : c->npeers > PEER_CHUNK_MAX ? PEER_CHUNK_MAX
                                               : c->npeers;
        k = calloc(1, sizeof *k + (size_t)cap * sizeof k->p[0]);
        if (!k)
            return NULL;
        k->cap = cap;
        k->next = c->peer_chunks;
        c->peer_chunks = k;
    }
    q = &k->p[k->used++];
    q->rank = p;
    q->fc_in[0].awaited = q->fc_in[1].awaited = -1;
    peer_insert(c->peer_map, c->peer_mask, q);
    c->npeers++;
    c->peer_last = q;
    return q;
}

void dsim_coll_peers_free(dsim_comm *c)
{
    while (c->peer_chunks) {
        dsim_coll_peer_chunk *k = c->peer_chunks;
        c->peer_chunks = k->next;
        free(k);
    }
    free(c->peer_map);
    c->peer_map = NULL;
    c->peer_mask = 0;
    c->npeers = 0;
    c->peer_last = NULL;
}

int dsim_coll_peer_count(const dsim_comm *c)
{
    return c ? c->npeers : 0;
}

size_t dsim_coll_peer_bytes(const dsim_comm *c)
{
    if (!c)
        return 0;
    size_t b = (size_t)c->fp_pend_cap * sizeof *c->fp_pend;
    if (c->peer_map)
        b += ((size_t)c->peer_mask + 1) * sizeof *c->peer_map;
    for (const dsim_coll_peer_chunk *k = c->peer_chunks; k; k = k->next)
        b += sizeof *k + (size_t)k->cap * sizeof k->p[0];
    return b;
}
