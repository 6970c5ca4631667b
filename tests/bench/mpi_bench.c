/* The MPI side of the comparison: times MPI_Allreduce (or MPI_Reduce_scatter_block,
 * MPI_Allgather, MPI_Bcast) with `dsim bench`'s flags, inputs, check and
 * columns (sim/bench/bench_common.c), one MPI process per rank:
 *
 *   mpirun --allow-run-as-root --oversubscribe -np 4 mpi_bench [allreduce] -b 16M -e 64M -f 4
 *
 * half and bfloat16 travel as 16-bit words reduced by a user op that calls
 * libdsim's kernels; avg is a sum followed by the division pass, inside the
 * timed loop, as NCCL's ncclAvg does it. */
#include <mpi.h>

#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

#define MPIB_PROG       "mpi_bench"
#define MPIB_COPY_BYTES ((size_t)128 << 20)

/* What the user-defined op reduces; one process runs one sweep. */
static dsim_dtype mpib_dtype;
static dsim_op mpib_op;

static void mpib_user_op(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    dsim_reduce_local(inout, in, (size_t)*len, mpib_dtype, mpib_op);
}

static MPI_Datatype mpib_mpi_type(dsim_dtype t)
{
    switch (t) {
    case DSIM_F32:
        return MPI_FLOAT;
    case DSIM_F64:
        return MPI_DOUBLE;
    case DSIM_I32:
        return MPI_INT32_T;
    case DSIM_I64:
        return MPI_INT64_T;
    case DSIM_F16:
    case DSIM_BF16:
    default:
        return MPI_UINT16_T;
    }
}

static MPI_Op mpib_mpi_op(dsim_op op, dsim_dtype t, MPI_Op *user)
{
    if (t == DSIM_F16 || t == DSIM_BF16) {
        if (*user == MPI_OP_NULL)
            MPI_Op_create(mpib_user_op, 1, user);
        return *user;
    }
    switch (op) {
    case DSIM_PROD:
        return MPI_PROD;
    case DSIM_MAX:
        return MPI_MAX;
    case DSIM_MIN:
        return MPI_MIN;
    case DSIM_SUM:
    case DSIM_MEAN:
    default:
        return MPI_SUM;
    }
}

typedef struct mpib_ctx {
    const bench_opts *o;
    bench_size sz;
    MPI_Datatype dt;
    MPI_Op op;
    int nranks;
} mpib_ctx;

static void mpib_run_once(const mpib_ctx *c, const void *send, void *recv)
{
    const bench_opts *o = c->o;
    switch (o->coll) {
    case BENCH_ALLREDUCE:
        MPI_Allreduce(send, recv, (int)c->sz.count, c->dt, c->op, MPI_COMM_WORLD);
        if (o->op == DSIM_MEAN)
            dsim_reduce_finish(recv, c->sz.count, o->dtype, o->op, c->nranks);
        break;
    case BENCH_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(send, recv, (int)c->sz.rank_count, c->dt, c->op, MPI_COMM_WORLD);
        if (o->op == DSIM_MEAN)
            dsim_reduce_finish(recv, c->sz.rank_count, o->dtype, o->op, c->nranks);
        break;
    case BENCH_ALLGATHER:
        MPI_Allgather(send, (int)c->sz.rank_count, c->dt, recv, (int)c->sz.rank_count, c->dt,
                      MPI_COMM_WORLD);
        break;
    case BENCH_BROADCAST:
    default:
        MPI_Bcast(recv, (int)c->sz.count, c->dt, o->root, MPI_COMM_WORLD);
        break;
    }
}

/* Rank 0 measures the copy bandwidth alone: the other ranks sleep rather
 * than spin in a barrier, which on an oversubscribed machine would steal
 * the core being measured. */
static double mpib_copy_bandwidth(int rank)
{
    double bw = 0;
    if (rank == 0)
        bw = bench_copy_bandwidth(MPIB_COPY_BYTES, 5);
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    MPI_Bcast(&bw, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return bw;
}

static void mpib_usage(FILE *out)
{
    fprintf(out,
            "usage: mpirun -np N %s [allreduce|reduce_scatter|allgather|broadcast] "
            "[flags]\n\nflags:\n",
            MPIB_PROG);
    bench_flags_help(out, 0);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, nranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    /* Every rank parses the same argv; only rank 0 speaks. */
    FILE *err = rank == 0 ? stderr : fopen("/dev/null", "w");
    if (!err)
        err = stderr;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            if (rank == 0)
                mpib_usage(stdout);
            MPI_Finalize();
            return 0;
        }
    }
    bench_opts o;
    bench_opts_default(&o);
    o.ranks = nranks;
    int rc = bench_parse(MPIB_PROG, argc, argv, 1, 0, &o, err);
    if (rc == 0 && o.root >= nranks) {
        fprintf(err, "%s: -r %d is not a rank of %d; accepted: 0 to %d\n", MPIB_PROG, o.root,
                nranks, nranks - 1);
        rc = 2;
    }
    if (rc == 0 && nranks > BENCH_MAX_RANKS) {
        fprintf(err, "%s: -np %d is above %d ranks, where the checked inputs stop being exact\n",
                MPIB_PROG, nranks, BENCH_MAX_RANKS);
        rc = 2;
    }
    int nsteps = bench_nsteps(&o);
    for (int s = 0; rc == 0 && s < nsteps; s++) {
        bench_size sz = bench_size_for(o.coll, bench_step_bytes(&o, s), nranks, o.dtype);
        if (sz.count > INT_MAX) {
            fprintf(err, "%s: -e %zu is %zu elements, above MPI's int count; lower -e\n", MPIB_PROG,
                    o.maxbytes, sz.count);
            rc = 2;
        }
    }
    if (rc != 0) {
        if (err != stderr)
            fclose(err);
        MPI_Finalize();
        return rc;
    }

    double copy_bw = mpib_copy_bandwidth(rank);
    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, ",\n")] = '\0';
        static const char *const calls[BENCH_COLL_COUNT] = {
            "MPI_Allreduce", "MPI_Reduce_scatter_block", "MPI_Allgather", "MPI_Bcast"};
        printf("# %s %s: %d ranks (one MPI process each, %ld CPUs online), %s, %s\n", MPIB_PROG,
               bench_coll_name(o.coll), nranks, sysconf(_SC_NPROCESSORS_ONLN), calls[o.coll], lib);
        bench_print_header(stdout, &o, copy_bw, MPIB_COPY_BYTES,
                           "the slowest rank's average per iteration; each rank times its -n "
                           "iterations from an MPI_Barrier after the -w warm-ups");
    }

    mpib_dtype = o.dtype;
    mpib_op = o.op;
    MPI_Op user = MPI_OP_NULL;
    mpib_ctx ctx = {.o = &o, .dt = mpib_mpi_type(o.dtype), .nranks = nranks};
    ctx.op = mpib_mpi_op(o.op, o.dtype, &user);
    size_t es = dsim_dtype_size(o.dtype);
    uint64_t wrong_total = 0;
    double busbw_sum = 0;
    int rows = 0;
    double *scratch = malloc(BENCH_CHUNK * sizeof *scratch);
    if (!scratch) {
        fprintf(stderr, "%s: rank %d: out of memory\n", MPIB_PROG, rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int s = 0; s < nsteps; s++) {
        ctx.sz = bench_size_for(o.coll, bench_step_bytes(&o, s), nranks, o.dtype);
        if (ctx.sz.bytes == 0) {
            if (rank == 0)
                printf("# %zu B: too small for whole %s elements on %d ranks; skipped\n",
                       bench_step_bytes(&o, s), dsim_dtype_name(o.dtype), nranks);
            continue;
        }
        size_t in_bytes = bench_in_count(o.coll, &ctx.sz) * es;
        size_t out_bytes = bench_out_count(o.coll, &ctx.sz) * es;
        void *send = o.coll == BENCH_BROADCAST ? NULL : bench_buf_alloc(in_bytes);
        void *recv = bench_buf_alloc(out_bytes);
        if (!recv || (o.coll != BENCH_BROADCAST && !send)) {
            fprintf(stderr, "%s: rank %d: out of memory for %zu B; lower -e\n", MPIB_PROG, rank,
                    ctx.sz.bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        bench_fill(o.coll, o.op, o.dtype, nranks, o.root, rank, &ctx.sz,
                   o.coll == BENCH_BROADCAST ? recv : send, scratch);
        if (o.coll != BENCH_BROADCAST)
            memset(recv, 0xff, out_bytes);

        for (int i = 0; i < o.warmup; i++)
            mpib_run_once(&ctx, send, recv);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < o.iters; i++)
            mpib_run_once(&ctx, send, recv);
        double mine = MPI_Wtime() - t0, slowest = 0;
        MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

        uint64_t wrong = 0, wrong_all = 0;
        if (o.check) {
            size_t w = 0;
            if (bench_check_output(o.coll, o.op, o.dtype, nranks, o.root, rank, &ctx.sz, recv,
                                   &w) != 0) {
                fprintf(stderr, "%s: rank %d: out of memory checking the output\n", MPIB_PROG,
                        rank);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            wrong = w;
        }
        MPI_Allreduce(&wrong, &wrong_all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        wrong_total += wrong_all;
        if (rank == 0) {
            bench_row row = {.sz = ctx.sz,
                             .dtype = o.dtype,
                             .redop = bench_redop_name(o.coll, o.op),
                             .seconds = slowest / o.iters,
                             .checked = o.check,
                             .wrong = wrong_all};
            bench_row_finish(&row, o.coll, nranks, copy_bw);
            bench_print_row(stdout, &row);
            busbw_sum += row.busbw;
        }
        rows++;
        free(send);
        free(recv);
    }
    if (rank == 0)
        bench_print_footer(stdout, wrong_total, o.check, rows ? busbw_sum / rows : 0.0);
    free(scratch);
    if (user != MPI_OP_NULL)
        MPI_Op_free(&user);
    if (err != stderr)
        fclose(err);
    MPI_Finalize();
    return wrong_total ? 1 : 0;
}
