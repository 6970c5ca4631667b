/* Sub-communicators: dsim_comm_split (MPI_Comm_split), dsim_comm_create_group
 * (MPI_Comm_create_group), their ids, names and flight records, and the
 * exchange log that tells a report what a strategy actually called.
 *
 * A sub-communicator is an ordinary dsim_comm whose ranks are renumbered:
 * rank r is endpoint ep_of[r] of the same fabric. Every transfer goes
 * through dsim_coll_ep (step.c), so the algorithms, fingerprints, the
 * failure check after a timeout and the flight recorder work on it
 * unchanged, and its frames pass the same transport, fault filter, health
 * check and network model as the parent's, under an id of its own.
 *
 *   world (comm 1)      0  1  2  3  4  5  6  7     endpoints 0..7
 *   split(color = r/4, key = -r):
 *     color 0 (id A)   [3  2  1  0]                rank 0 = endpoint 3, ...
 *     color 1 (id B)               [7  6  5  4]    rank 1 = endpoint 6, ...
 *
 * Ids. Every member must compute the same id with no message, a replay must
 * make the same ones, and two communicators that share an endpoint must
 * not share an id (the transport matches messages by source, id and tag):
 *   split:  mix(parent id, "split", the split's call number on the parent,
 *               color)
 *   group:  mix(parent id, "group", hash of the members' endpoint ranks in
 *               order, how many times this rank made that group from that
 *               parent before)
 * with the top bit set: ids a program chooses (dsim_comm_create, a
 * strategy's own messages) stay below 2^31. The split's call number agrees
 * on every rank of the parent because the split is one of its collectives;
 * the group's count agrees on every member because members make their
 * groups in the same order (dsim/comm.h). Two ids derived alike collide
 * with probability 2^-31.
 *
 * Flight records. A freed sub-communicator's recorder moves to the root
 * (the communicator made by dsim_comm_create it descends from), which keeps
 * the last COLL_RETIRED_MAX, so a strategy that frees its communicators in
 * replica_fini still leaves them for the driver's flight records. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

#define COLL_RETIRED_MAX 16
#define COLL_ID_SPLIT    0x53504C54u /* "SPLT" */
#define COLL_ID_GROUP    0x47525550u /* "GRUP" */

static uint64_t sub_mix(uint64_t h, uint64_t v)
{
    /* splitmix64's finaliser over the running hash and the next value */
    uint64_t z = h ^ (v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint32_t sub_derive_id(uint32_t parent, uint32_t kind, uint64_t a, uint64_t b)
{
    uint64_t h = sub_mix(sub_mix(sub_mix((uint64_t)parent, kind), a), b);
    uint32_t id = (uint32_t)(h >> 32) | 0x80000000u;
    return id == UINT32_MAX ? 0x80000000u : id;
}

const char *dsim_coll_comm_name(const dsim_comm *c, char *buf, size_t cap)
{
    switch ((dsim_comm_origin)c->origin) {
    case DSIM_COMM_ORIGIN_SPLIT:
        snprintf(buf, cap, "sub-communicator %u (split of %u, color %d)", (unsigned)c->comm_id,
                 (unsigned)c->parent_id, c->color);
        break;
    case DSIM_COMM_ORIGIN_GROUP:
        snprintf(buf, cap, "sub-communicator %u (group of %u)", (unsigned)c->comm_id,
                 (unsigned)c->parent_id);
        break;
    case DSIM_COMM_ORIGIN_CREATE:
    default:
        snprintf(buf, cap, "communicator %u", (unsigned)c->comm_id);
        break;
    }
    return buf;
}

const char *dsim_coll_rank_name(const dsim_comm *c, int r, char *buf, size_t cap)
{
    if (!c->ep_of || r < 0 || r >= c->size)
        snprintf(buf, cap, "rank %d", r);
    else
        snprintf(buf, cap, "rank %d (world rank %d)", r, c->ep_of[r]);
    return buf;
}

uint32_t dsim_comm_id(const dsim_comm *c)
{
    return c ? c->comm_id : 0;
}

int dsim_comm_virtual(const dsim_comm *c)
{
    return c && c->virt;
}

int dsim_comm_world_rank(const dsim_comm *c, int r)
{
    if (!c || r < 0 || r >= c->size)
        return -1;
    return dsim_coll_ep(c, r);
}

int dsim_comm_host(const dsim_comm *c, int r)
{
    if (!c || r < 0 || r >= c->size || c->local_size <= 0)
        return -1;
    return dsim_coll_ep(c, r) / c->local_size;
}

dsim_comm_origin dsim_comm_origin_of(const dsim_comm *c, uint32_t *parent_id, int *color)
{
    if (parent_id)
        *parent_id = c ? c->parent_id : 0;
    if (color)
        *color = c ? c->color : -1;
    return c ? (dsim_comm_origin)c->origin : DSIM_COMM_ORIGIN_CREATE;
}

const char *dsim_comm_describe(const dsim_comm *c, char *buf, size_t cap)
{
    if (!buf || !cap)
        return buf;
    if (!c) {
        snprintf(buf, cap, "no communicator (NULL)");
        return buf;
    }
    char n[96];
    dsim_coll_comm_name(c, n, sizeof n);
    size_t l = strlen(n);
    if (c->origin != DSIM_COMM_ORIGIN_CREATE && l > 0 && n[l - 1] == ')')
        snprintf(buf, cap, "%.*s; %d rank%s)", (int)(l - 1), n, c->size, c->size == 1 ? "" : "s");
    else
        snprintf(buf, cap, "%s (%d rank%s)", n, c->size, c->size == 1 ? "" : "s");
    return buf;
}

/* A new sub-communicator of parent: size ranks, this rank is `rank`,
 * ep_of (size entries, taken over) its endpoints. */
static dsim_err sub_make(dsim_comm *parent, int size, int rank, int *ep_of, uint32_t id,
                         dsim_comm_origin origin, int color, dsim_comm **out)
{
    dsim_comm *c = calloc(1, sizeof *c);
    if (!c) {
        free(ep_of);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for a sub-communicator");
    }
    c->ep = parent->ep;
    c->rt = parent->rt;
    c->rank = rank;
    c->size = size;
    c->ep_of = ep_of;
    c->ep_rank = ep_of[rank];
    c->comm_id = id;
    c->local_size = parent->local_size;
    c->timeout_ns = parent->timeout_ns;
    c->algo = parent->algo;
    c->decide = parent->decide;
    c->decide_user = parent->decide_user;
    c->fp_off = parent->fp_off;
    c->virt = parent->virt;
    c->fr_max = parent->fr_max;
    c->origin = origin;
    c->parent_id = parent->comm_id;
    c->color = color;
    c->fp_out.magic = DSIM_COLL_FP_MAGIC;
    c->fp_out.comm_id = id;
    c->fp_out.root = -1;
    c->fp_out.op = c->fp_out.dtype = DSIM_COLL_FP_NONE;
    c->err.code = DSIM_OK;
    c->err.peer = -1;
    /* Listed with the root: for its flight records and exchange log. */
    dsim_comm *root = parent->root;
    c->root = root;
    if (root) {
        c->made_seq = root->nmade++;
        c->sub_next = root->subs;
        if (root->subs)
            root->subs->sub_prev = c;
        root->subs = c;
    }
    *out = c;
    return DSIM_OK;
}

/* The split's order: by key, then by rank in the parent. */
typedef struct sub_member {
    int key, prank;
} sub_member;

static int sub_member_cmp(const void *a, const void *b)
{
    const sub_member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->prank > y->prank) - (x->prank < y->prank);
}

/* The split's exchange: every rank's (color, key) into all[2 * size]. */
static dsim_err sub_exchange(dsim_comm *parent, int color, int key, int32_t *all)
{
    dsim_coll x;
    dsim_coll_begin(parent, &x, "comm_split", "ring", DSIM_I32, DSIM_SUM,
                    dsim_coll_ring_allgather_steps(parent->size));
    dsim_coll_fp_set(&x, DSIM_COLL_SPLIT, DSIM_COLL_FP_NONE, DSIM_I32, 2, -1, DSIM_ALGO_RING);
    x.real = 1; /* the colors decide what is made: real bytes even when timing only */
    int32_t mine[2] = {color < 0 ? DSIM_COMM_UNDEFINED : color, key};
    dsim_err e = DSIM_OK;
    if (parent->size == 1)
        memcpy(all, mine, sizeof mine);
    else
        e = dsim_coll_ring_allgather(&x, mine, all, 2);
    return dsim_coll_end(&x, e);
}

dsim_err dsim_comm_split(dsim_comm *parent, int color, int key, dsim_comm **out)
{
    static const char fn[] = "dsim_comm_split";
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: out is NULL", fn);
    *out = NULL;
    if (!parent)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the parent communicator is NULL", fn);
    int n = parent->size;
    int32_t *all = malloc(2 * (size_t)n * sizeof *all);
    sub_member *m = malloc((size_t)n * sizeof *m);
    if (!all || !m) {
        free(all);
        free(m);
        DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory for the colors of %d ranks", fn, n);
        dsim_error_copy(&parent->err);
        return DSIM_ENOMEM;
    }
    uint64_t call = parent->calls; /* the split's call number: the same on every rank */
    dsim_err e = sub_exchange(parent, color, key, all);
    if (e != DSIM_OK || color < 0) {
        free(all);
        free(m);
        return e;
    }
    int k = 0, me = -1;
    for (int r = 0; r < n; r++)
        if (all[2 * r] == color)
            m[k++] = (sub_member){all[2 * r + 1], r};
    qsort(m, (size_t)k, sizeof *m, sub_member_cmp);
    int *ep_of = malloc((size_t)k * sizeof *ep_of);
    for (int i = 0; ep_of && i < k; i++) {
        ep_of[i] = dsim_coll_ep(parent, m[i].prank);
        if (m[i].prank == parent->rank)
            me = i;
    }
    free(all);
    free(m);
    if (!ep_of) {
        DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory for a communicator of %d ranks", fn, k);
        dsim_error_copy(&parent->err);
        return DSIM_ENOMEM;
    }
    uint32_t id = sub_derive_id(parent->comm_id, COLL_ID_SPLIT, call + 1, (uint32_t)color);
    return sub_make(parent, k, me, ep_of, id, DSIM_COMM_ORIGIN_SPLIT, color, out);
}

dsim_err dsim_comm_create_group(dsim_comm *parent, int n, const int *ranks, dsim_comm **out)
{
    static const char fn[] = "dsim_comm_create_group";
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: out is NULL", fn);
    *out = NULL;
    if (!parent)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the parent communicator is NULL", fn);
    if (n < 1 || n > parent->size || !ranks)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "%s: %d rank(s)%s; list 1 to %d ranks of the parent (its size)", fn, n,
                        ranks ? "" : " and ranks is NULL", parent->size);
    int *ep_of = malloc((size_t)n * sizeof *ep_of);
    uint8_t *seen = calloc((size_t)parent->size, 1);
    if (!ep_of || !seen) {
        free(ep_of);
        free(seen);
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory for %d ranks", fn, n);
    }
    int me = -1;
    uint64_t h = 0x6A09E667F3BCC909ULL;
    dsim_err e = DSIM_OK;
    for (int i = 0; i < n && e == DSIM_OK; i++) {
        int r = ranks[i];
        if (r < 0 || r >= parent->size)
            e = DSIM_ERR(DSIM_EINVAL, -1, "%s: ranks[%d] is %d, not a rank of the parent (0..%d)",
                         fn, i, r, parent->size - 1);
        else if (seen[r])
            e = DSIM_ERR(DSIM_EINVAL, -1, "%s: rank %d is listed twice (ranks[%d])", fn, r, i);
        else {
            seen[r] = 1;
            ep_of[i] = dsim_coll_ep(parent, r);
            h = sub_mix(h, (uint64_t)ep_of[i]);
            if (r == parent->rank)
                me = i;
        }
    }
    free(seen);
    if (e == DSIM_OK && me < 0) {
        char rn[48];
        e = DSIM_ERR(DSIM_EINVAL, -1,
                     "%s: the caller, %s of the parent, is not in the group of %d rank(s); only "
                     "the group's members call it (as MPI_Comm_create_group)",
                     fn, dsim_coll_rank_name(parent, parent->rank, rn, sizeof rn), n);
    }
    /* How many times this rank made this group from this parent before. */
    int gi = -1;
    for (int i = 0; e == DSIM_OK && i < parent->ngroups; i++)
        if (parent->groups[i].hash == h)
            gi = i;
    if (e == DSIM_OK && gi < 0) {
        dsim_coll_group_count *g =
            realloc(parent->groups, (size_t)(parent->ngroups + 1) * sizeof *g);
        if (!g)
            e = DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", fn);
        else {
            parent->groups = g;
            gi = parent->ngroups++;
            g[gi] = (dsim_coll_group_count){h, 0};
        }
    }
    if (e != DSIM_OK) {
        free(ep_of);
        return e;
    }
    uint32_t id = sub_derive_id(parent->comm_id, COLL_ID_GROUP, h, parent->groups[gi].made++);
    return sub_make(parent, n, me, ep_of, id, DSIM_COMM_ORIGIN_GROUP, -1, out);
}

/* c's recorder as a dump that names the communicator. */
static dsim_err sub_dump(const dsim_comm *c, dsim_fr_dump *d)
{
    DSIM_CHECK(dsim_comm_flight_dump(c, d));
    if (!c->ep_of)
        return DSIM_OK;
    d->world_ranks = malloc((size_t)c->size * sizeof *d->world_ranks);
    if (!d->world_ranks) {
        dsim_fr_dump_free(d);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory for a flight record");
    }
    memcpy(d->world_ranks, c->ep_of, (size_t)c->size * sizeof *d->world_ranks);
    return DSIM_OK;
}

void dsim_comm_free(dsim_comm *c)
{
    if (!c)
        return;
    if (c->origin == DSIM_COMM_ORIGIN_CREATE) {
        dsim_comm_destroy(c);
        return;
    }
    dsim_comm *root = c->root;
    if (root) {
        if (c->sub_prev)
            c->sub_prev->sub_next = c->sub_next;
        else
            root->subs = c->sub_next;
        if (c->sub_next)
            c->sub_next->sub_prev = c->sub_prev;
        /* Its recorder stays with the root, the oldest retired one going
         * first; out of memory, it is lost. */
        dsim_fr_dump d;
        if (c->calls && c->fr_max && sub_dump(c, &d) == DSIM_OK) {
            d.calls = c->calls;
            if (!root->retired)
                root->retired = calloc(COLL_RETIRED_MAX, sizeof *root->retired);
            if (!root->retired) {
                dsim_fr_dump_free(&d);
            } else {
                if (root->nretired == COLL_RETIRED_MAX) {
                    dsim_fr_dump_free(&root->retired[0]);
                    memmove(root->retired, root->retired + 1,
                            (COLL_RETIRED_MAX - 1) * sizeof *root->retired);
                    root->nretired--;
                }
                root->retired[root->nretired++] = d;
            }
        }
    }
    dsim_coll_comm_release(c);
}

void dsim_coll_subs_detach(dsim_comm *c)
{
    for (dsim_comm *s = c->subs; s; s = s->sub_next)
        s->root = NULL;
    c->subs = NULL;
    for (int i = 0; i < c->nretired; i++)
        dsim_fr_dump_free(&c->retired[i]);
    free(c->retired);
    c->retired = NULL;
    c->nretired = 0;
}

dsim_err dsim_comm_flight_dump_subs(const dsim_comm *c, dsim_fr_dump **out, size_t *n)
{
    if (!out || !n)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_flight_dump_subs: out or n is NULL");
    *out = NULL;
    *n = 0;
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_flight_dump_subs: the communicator is NULL");
    size_t live = 0;
    for (const dsim_comm *s = c->subs; s; s = s->sub_next)
        live++;
    size_t cap = live + (size_t)c->nretired;
    if (!cap)
        return DSIM_OK;
    dsim_fr_dump *d = calloc(cap, sizeof *d);
    if (!d)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_comm_flight_dump_subs: out of memory");
    size_t k = 0;
    dsim_err e = DSIM_OK;
    /* The retired ones in the order they were freed... */
    for (int i = 0; i < c->nretired && e == DSIM_OK; i++) {
        const dsim_fr_dump *r = &c->retired[i];
        d[k] = *r;
        d[k].entries = r->n ? malloc(r->n * sizeof *r->entries) : NULL;
        d[k].world_ranks = r->world_ranks ? malloc((size_t)r->size * sizeof(int)) : NULL;
        if ((r->n && !d[k].entries) || (r->world_ranks && !d[k].world_ranks)) {
            dsim_fr_dump_free(&d[k]);
            e = DSIM_ERR(DSIM_ENOMEM, -1, "dsim_comm_flight_dump_subs: out of memory");
            break;
        }
        if (r->n)
            memcpy(d[k].entries, r->entries, r->n * sizeof *r->entries);
        if (r->world_ranks)
            memcpy(d[k].world_ranks, r->world_ranks, (size_t)r->size * sizeof(int));
        k++;
    }
    /* ...then the live ones in the order made (the list is newest first). */
    const dsim_comm *last = c->subs;
    while (last && last->sub_next)
        last = last->sub_next;
    for (const dsim_comm *s = last; s && e == DSIM_OK; s = s->sub_prev) {
        if (!s->calls)
            continue;
        if ((e = sub_dump(s, &d[k])) == DSIM_OK)
            k++;
    }
    if (e != DSIM_OK) {
        for (size_t i = 0; i < k; i++)
            dsim_fr_dump_free(&d[i]);
        free(d);
        return e;
    }
    if (!k) {
        free(d);
        d = NULL;
    }
    *out = d;
    *n = k;
    return DSIM_OK;
}

/* ---- the exchange log ---- */

void dsim_comm_exchange_begin(dsim_comm *c)
{
    if (!c || c->origin != DSIM_COMM_ORIGIN_CREATE)
        return;
    if (!c->xlog && !(c->xlog = calloc(1, sizeof *c->xlog)))
        return; /* out of memory: no label, nothing worse */
    memset(c->xlog, 0, sizeof *c->xlog);
    c->xlog->on = 1;
}

void dsim_coll_xlog_note(const dsim_coll *x)
{
    const dsim_comm *c = x->c;
    dsim_coll_xlog *l = c->root->xlog;
    const dsim_coll_fp *fp = &c->fp_out;
    for (int i = 0; i < l->n; i++)
        if (l->e[i].comm_id == c->comm_id && l->e[i].coll == fp->coll && l->e[i].algo == fp->algo) {
            l->e[i].calls++;
            return;
        }
    if (l->n == DSIM_COLL_XLOG_MAX) {
        l->more++;
        return;
    }
    l->e[l->n].comm_id = c->comm_id;
    l->e[l->n].size = c->size;
    l->e[l->n].coll = fp->coll;
    l->e[l->n].algo = fp->algo;
    l->e[l->n].calls = 1;
    if (c->origin == DSIM_COMM_ORIGIN_CREATE)
        snprintf(l->e[l->n].name, sizeof l->e[l->n].name, "communicator %u", (unsigned)c->comm_id);
    else
        snprintf(l->e[l->n].name, sizeof l->e[l->n].name, "sub-communicator %u",
                 (unsigned)c->comm_id);
    l->n++;
}

const char *dsim_comm_exchange_end(dsim_comm *c, char *buf, size_t cap)
{
    if (!buf || !cap)
        return buf;
    buf[0] = '\0';
    if (!c || !c->xlog)
        return buf;
    dsim_coll_xlog *l = c->xlog;
    l->on = 0;
    if (l->n == 1 && !l->more && l->e[0].comm_id == c->comm_id &&
        l->e[0].coll == DSIM_COLL_ALLREDUCE && l->e[0].calls == 1) {
        snprintf(buf, cap, "%s", dsim_algo_name((dsim_algo)l->e[0].algo));
        return buf;
    }
    size_t o = 0;
    for (int i = 0; i < l->n && o < cap; i++) {
        char what[48];
        const char *kind = dsim_coll_kind_name((dsim_coll_kind)l->e[i].coll);
        if (l->e[i].coll == DSIM_COLL_ALLREDUCE)
            snprintf(what, sizeof what, "%s(%s)", kind, dsim_algo_name((dsim_algo)l->e[i].algo));
        else
            snprintf(what, sizeof what, "%s", kind);
        char times[24] = "";
        if (l->e[i].calls > 1)
            snprintf(times, sizeof times, "%u x ", (unsigned)l->e[i].calls);
        int w = snprintf(buf + o, cap - o, "%s%s%s on %s (%d rank%s)", i ? " + " : "", times, what,
                         l->e[i].name, l->e[i].size, l->e[i].size == 1 ? "" : "s");
        if (w < 0)
            break;
        o += (size_t)w;
    }
    if (l->more && o < cap)
        snprintf(buf + o, cap - o, " + %d more", l->more);
    return buf;
}
