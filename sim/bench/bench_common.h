/* What `dsim bench` and the MPI comparison program (tests/bench/mpi_bench.c)
 * share, so that their tables can be compared line by line: the flags, the
 * sizes they step through, the verifiable inputs and the check, the copy
 * bandwidth measured at start-up, and the columns.
 *
 * Uses libdsim's dtype and reduce helpers only; nothing here knows about
 * communicators, transports or MPI. */
#ifndef DSIM_SIM_BENCH_COMMON_H
#define DSIM_SIM_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsim/dtype.h"
#include "dsim/reduce.h"

typedef enum bench_coll {
    BENCH_ALLREDUCE = 0,
    BENCH_REDUCE_SCATTER,
    BENCH_ALLGATHER,
    BENCH_BROADCAST,
    BENCH_COLL_COUNT
} bench_coll;

/* "allreduce", "reduce_scatter", "allgather", "broadcast". */
const char *bench_coll_name(bench_coll c);
int bench_coll_parse(const char *s, bench_coll *out);

/* Ranks above this make the integer-valued inputs inexact in bfloat16. */
#define BENCH_MAX_RANKS 128

/* Which flags a program accepts beyond nccl-tests' common ones. */
enum {
    BENCH_FLAG_DSIM = 1 << 0, /* --ranks, --algo, --transport, --fingerprint, --model, --engine */
};

typedef struct bench_opts {
    int have_coll;         /* a collective was named on the command line */
    bench_coll coll;       /* default allreduce */
    size_t minbytes;       /* -b, default 32M (nccl-tests' default) */
    size_t maxbytes;       /* -e, default 32M */
    size_t stepfactor;     /* -f, default 2 */
    int iters;             /* -n, default 20 */
    int warmup;            /* -w, default 5 */
    int check;             /* -c, default 1 */
    dsim_op op;            /* -o, default sum */
    dsim_dtype dtype;      /* -d, default float */
    int root;              /* -r, default 0 (broadcast only) */
    int ranks;             /* --ranks, default 4 */
    const char *algo;      /* --algo as given, default "auto"; the caller parses it */
    const char *transport; /* --transport as given, default "inproc"; the caller checks it */
    int fingerprint;       /* --fingerprint, default 1: collective fingerprints checked */
    int model;             /* --model 1: the calibrated cost model beside each time */
    const char *engine;    /* --engine as given, default "threads"; the caller checks it */
} bench_opts;

void bench_opts_default(bench_opts *o);

/* Parses argv[first..argc). Every argument is a flag with a value (`-b 16M`,
 * `-b16M`, `--minbytes 16M`, `--minbytes=16M`) or a collective name. On bad
 * input writes one line to err naming the flag, the value and what is
 * accepted, and returns 2; else 0. Does not check ranks against root or
 * sizes against memory (the caller knows the rank count). */
int bench_parse(const char *prog, int argc, char **argv, int first, unsigned flags, bench_opts *o,
                FILE *err);

/* "16M" -> 16777216. K, M, G (either case) are powers of 1024 as in
 * nccl-tests; a trailing B is allowed ("16MB"). Returns 0, or -1 on junk,
 * a negative number or overflow. */
int bench_parse_size(const char *s, size_t *out);

/* The flags' help text (shared part), one flag a line. */
void bench_flags_help(FILE *out, unsigned flags);

/* One step of the size sweep, rounded down as nccl-tests does so that every
 * rank gets whole elements. `bytes` is the size column: the full buffer
 * (allreduce, broadcast: the message; reduce_scatter: the send buffer of
 * nranks blocks; allgather: the receive buffer of nranks blocks). `count`
 * is bytes / element size. `rank_count` is what each rank passes to the
 * call: count for allreduce and broadcast, count / nranks for the other two.
 * bytes == 0 when the step is too small for nranks whole elements. */
typedef struct bench_size {
    size_t bytes, count, rank_count;
} bench_size;
bench_size bench_size_for(bench_coll c, size_t bytes, int nranks, dsim_dtype t);

/* The number of sweep steps from minbytes to maxbytes (both included when
 * reached), multiplying by stepfactor; at most 64. */
int bench_nsteps(const bench_opts *o);
size_t bench_step_bytes(const bench_opts *o, int step);

/* nccl-tests' bus-bandwidth factor: allreduce 2(n-1)/n; reduce_scatter and
 * allgather (n-1)/n; broadcast 1. */
double bench_busbw_factor(bench_coll c, int nranks);

/* The least memory traffic (bytes read + bytes written, over all ranks) an
 * implementation needs, counting every rank's input read once and its
 * output written once, for a size column of S bytes over n ranks:
 *   allreduce       n*S read  + n*S written           = 2nS
 *   reduce_scatter  n*S read  (S each) + n*(S/n) written = (n+1)S
 *   allgather       n*(S/n) read + n*S written       = (n+1)S
 *   broadcast       S read on the root + (n-1)*S written on the others = nS
 *                   (in place: the root's buffer is its input and output)
 * Copies between ranks' buffers and reduction temporaries come on top, so
 * a real implementation is slower than this bound. */
double bench_traffic_bytes(bench_coll c, int nranks, size_t bytes);

/* Copy bandwidth of this machine in bytes copied per second (each copied
 * byte is one read plus one write): memcpy of `bytes` (default 128 MiB when
 * 0), best of `runs`, in the calling thread. 0 on allocation failure. */
double bench_copy_bandwidth(size_t bytes, int runs);

/* A contestant's send and receive buffers: every program (dsim bench,
 * mpi_bench, gloo_bench) allocates them as dsim allocates its own
 * (dsim_buf_alloc: from 2 MiB up on transparent huge pages), so that the
 * tables compare the transports, not the allocators. Release with free(). */
void *bench_buf_alloc(size_t bytes);

/* Time an ideal implementation would take: traffic at the copy rate, i.e.
 * traffic / (2 * copy_bw), in seconds. */
double bench_bound_seconds(bench_coll c, int nranks, size_t bytes, double copy_bw);

/* Verifiable inputs (nccl-tests' idea): every element is a small integer,
 * chosen per op so that every partial result of any reduction order is
 * exactly representable in the dtype (|sum| <= 256 for bfloat16, 2048 for
 * half), so the right answer is known bit for bit.
 *
 * Element `i` of rank `rank`'s contribution, as a double. For allreduce
 * and reduce_scatter i indexes the full send buffer; for allgather i is the
 * index in the gathered buffer (rank = i / rank_count); for broadcast the
 * root's buffer. */
double bench_value(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int rank, size_t i);

/* Elements in a rank's input buffer: sz.count, or sz.rank_count for
 * allgather. */
size_t bench_in_count(bench_coll c, const bench_size *sz);

/* Fills a rank's input buffer of bench_in_count elements (for broadcast:
 * the root's data, or on other ranks a pattern that differs from the
 * root's). `scratch` holds at least BENCH_CHUNK doubles. */
#define BENCH_CHUNK 4096
void bench_fill(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int root, int rank,
                const bench_size *sz, void *buf, double *scratch);

/* The expected output of `rank`, of elements [first, first + n) of its
 * output buffer, into out (dtype t). Output lengths: allreduce, broadcast,
 * allgather: sz.count; reduce_scatter: sz.rank_count. */
size_t bench_out_count(bench_coll c, const bench_size *sz);
void bench_expected(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int root, int rank,
                    const bench_size *sz, size_t first, size_t n, void *out, double *scratch);

/* The number of elements of got that differ bitwise from want. */
size_t bench_count_wrong(const void *got, const void *want, size_t n, dsim_dtype t);

/* Counts the elements of `rank`'s output that are wrong into *wrong;
 * computes the expected values chunk by chunk (no full-size copy). 0, or -1
 * when out of memory. */
int bench_check_output(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int root, int rank,
                       const bench_size *sz, const void *out, size_t *wrong);

/* The table. */
typedef struct bench_row {
    bench_size sz;
    dsim_dtype dtype;
    const char *redop; /* "sum", ...; "none" for allgather and broadcast */
    double seconds;    /* per iteration */
    int checked;       /* 0: #wrong prints N/A */
    uint64_t wrong;
    double algbw, busbw, pct_bound; /* GB/s (1e9 B/s), GB/s, percent */
} bench_row;

/* Fills algbw, busbw and pct_bound from sz, seconds, the rank count and
 * the copy bandwidth. */
void bench_row_finish(bench_row *r, bench_coll c, int nranks, double copy_bw);

/* Header lines after the program's own first lines: the sweep, the copy
 * bandwidth, how time is measured, then the column titles. */
void bench_print_header(FILE *out, const bench_opts *o, double copy_bw, size_t copy_bytes,
                        const char *timing);
void bench_print_row(FILE *out, const bench_row *r);
/* "# Out of bounds values : N OK|FAILED" and the average busbw. */
void bench_print_footer(FILE *out, uint64_t wrong, int checked, double avg_busbw);

/* The redop column for a collective and op. */
const char *bench_redop_name(bench_coll c, dsim_op op);

#endif
