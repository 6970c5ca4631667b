/* Collective fingerprints: how one is written in a message and which fields
 * two of them disagree on. Where they are sent and checked is in step.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

static const char *const fp_kind_names[DSIM_COLL_KIND_COUNT] = {
    [DSIM_COLL_NONE] = "none",           [DSIM_COLL_ALLREDUCE] = "allreduce",
    [DSIM_COLL_REDUCE] = "reduce",       [DSIM_COLL_BROADCAST] = "broadcast",
    [DSIM_COLL_ALLGATHER] = "allgather", [DSIM_COLL_REDUCE_SCATTER] = "reduce_scatter",
    [DSIM_COLL_BARRIER] = "barrier",     [DSIM_COLL_SPLIT] = "comm_split",
};

const char *dsim_coll_kind_name(dsim_coll_kind k)
{
    if ((int)k < 0 || k >= DSIM_COLL_KIND_COUNT)
        return "unknown";
    return fp_kind_names[k];
}

/* The names people know from NumPy and PyTorch, with the width in them:
 * "36 float32" reads at once where "36 float" leaves the size to guess. */
static const char *fp_dtype_name(unsigned t)
{
    static const char *const names[DSIM_DTYPE_COUNT] = {
        [DSIM_F32] = "float32",   [DSIM_F64] = "float64", [DSIM_F16] = "float16",
        [DSIM_BF16] = "bfloat16", [DSIM_I32] = "int32",   [DSIM_I64] = "int64",
    };
    return t < DSIM_DTYPE_COUNT ? names[t] : "elements of an unknown dtype";
}

const char *dsim_coll_fp_str(const dsim_coll_fp *fp, char *buf, size_t cap)
{
    if (!buf || !cap)
        return buf;
    if (!fp) {
        snprintf(buf, cap, "nothing");
        return buf;
    }
    const char *kind = dsim_coll_kind_name((dsim_coll_kind)fp->coll);
    const char *algo = dsim_algo_name((dsim_algo)fp->algo);
    char op[48] = "";
    if (fp->op != DSIM_COLL_FP_NONE)
        snprintf(op, sizeof op, "%s, ",
                 fp->op < DSIM_OP_COUNT ? dsim_op_name((dsim_op)fp->op) : "unknown op");
    switch ((dsim_coll_kind)fp->coll) {
    case DSIM_COLL_BARRIER:
    case DSIM_COLL_SPLIT:
    case DSIM_COLL_NONE:
        snprintf(buf, cap, "%s #%" PRIu64, kind, fp->seq);
        break;
    case DSIM_COLL_REDUCE:
        snprintf(buf, cap, "%s #%" PRIu64 " with %" PRIu64 " %s to root %d (%s%s)", kind, fp->seq,
                 fp->count, fp_dtype_name(fp->dtype), (int)fp->root, op, algo);
        break;
    case DSIM_COLL_BROADCAST:
        snprintf(buf, cap, "%s #%" PRIu64 " with %" PRIu64 " %s from root %d (%s%s)", kind, fp->seq,
                 fp->count, fp_dtype_name(fp->dtype), (int)fp->root, op, algo);
        break;
    case DSIM_COLL_ALLGATHER:
    case DSIM_COLL_REDUCE_SCATTER:
        snprintf(buf, cap, "%s #%" PRIu64 " with %" PRIu64 " %s per rank (%s%s)", kind, fp->seq,
                 fp->count, fp_dtype_name(fp->dtype), op, algo);
        break;
    default:
        snprintf(buf, cap, "%s #%" PRIu64 " with %" PRIu64 " %s (%s%s)", kind, fp->seq, fp->count,
                 fp_dtype_name(fp->dtype), op, algo);
        break;
    }
    return buf;
}

int dsim_coll_fp_diff(const dsim_coll_fp *a, const dsim_coll_fp *b, char *buf, size_t cap)
{
    const char *names[8];
    int n = 0;
    if (a->comm_id != b->comm_id)
        names[n++] = "communicator";
    if (a->seq != b->seq)
        names[n++] = "call number";
    if (a->coll != b->coll)
        names[n++] = "collective";
    if (a->op != b->op)
        names[n++] = "reduce op";
    if (a->dtype != b->dtype)
        names[n++] = "dtype";
    if (a->count != b->count)
        names[n++] = "count";
    if (a->root != b->root)
        names[n++] = "root";
    if (a->algo != b->algo)
        names[n++] = "algorithm";
    if (buf && cap) {
        buf[0] = '\0';
        size_t used = 0;
        for (int i = 0; i < n; i++) {
            const char *sep = i == 0 ? "" : i == n - 1 ? " and " : ", ";
            int w = snprintf(buf + used, cap - used, "%s%s", sep, names[i]);
            if (w < 0 || (size_t)w >= cap - used)
                break;
            used += (size_t)w;
        }
    }
    return n;
}

const dsim_coll_fp *dsim_comm_fingerprint(const dsim_comm *c)
{
    return c ? &c->fp_out : NULL;
}

const char *dsim_fr_state_name(dsim_fr_state s)
{
    static const char *const names[DSIM_FR_STATE_COUNT] = {
        [DSIM_FR_SCHEDULED] = "scheduled",
        [DSIM_FR_STARTED] = "started",
        [DSIM_FR_COMPLETED] = "completed",
    };
    return (int)s >= 0 && s < DSIM_FR_STATE_COUNT ? names[s] : "unknown";
}

dsim_err dsim_comm_flight_dump(const dsim_comm *c, dsim_fr_dump *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_flight_dump: out is NULL");
    memset(out, 0, sizeof *out);
    if (!c)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_comm_flight_dump: the communicator is NULL");
    out->rank = c->rank;
    out->size = c->size;
    out->comm_id = c->comm_id;
    out->calls = c->calls;
    out->color = -1;
    out->world_rank = c->ep_rank;
    if (c->origin != DSIM_COMM_ORIGIN_CREATE) {
        out->origin = c->origin;
        out->parent_id = c->parent_id;
        out->color = c->color;
    }
    size_t n = c->calls < c->fr_cap ? (size_t)c->calls : c->fr_cap;
    if (!n || !c->fr_max)
        return DSIM_OK;
    out->entries = malloc(n * sizeof *out->entries);
    if (!out->entries)
        return DSIM_ERR(DSIM_ENOMEM, -1, "dsim_comm_flight_dump: out of memory for %zu entries", n);
    for (size_t i = 0; i < n; i++)
        out->entries[i] = c->fr[(c->calls - n + i) % c->fr_max];
    out->n = n;
    return DSIM_OK;
}

void dsim_fr_dump_free(dsim_fr_dump *d)
{
    if (!d)
        return;
    free(d->entries);
    free(d->world_ranks);
    memset(d, 0, sizeof *d);
}
