/* The parts of the collective benchmark that `dsim bench` and the MPI
 * comparison program share (see bench_common.h). */
#include "bench_common.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsim/comm.h"

static const char *const bench_coll_names[BENCH_COLL_COUNT] = {
    [BENCH_ALLREDUCE] = "allreduce",
    [BENCH_REDUCE_SCATTER] = "reduce_scatter",
    [BENCH_ALLGATHER] = "allgather",
    [BENCH_BROADCAST] = "broadcast",
};

const char *bench_coll_name(bench_coll c)
{
    if ((int)c < 0 || c >= BENCH_COLL_COUNT)
        return "?";
    return bench_coll_names[c];
}

int bench_coll_parse(const char *s, bench_coll *out)
{
    for (int i = 0; i < BENCH_COLL_COUNT; i++) {
        if (strcmp(s, bench_coll_names[i]) == 0) {
            *out = (bench_coll)i;
            return 0;
        }
    }
    return -1;
}

void bench_opts_default(bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->coll = BENCH_ALLREDUCE;
    o->minbytes = 32u << 20;
    o->maxbytes = 32u << 20;
    o->stepfactor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->op = DSIM_SUM;
    o->dtype = DSIM_F32;
    o->root = 0;
    o->ranks = 4;
    o->algo = "auto";
    o->transport = "inproc";
    o->engine = "threads";
    o->fingerprint = 1;
}

int bench_parse_size(const char *s, size_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno == ERANGE)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'B' || (*end == 'b' && shift))
        end++;
    if (*end != '\0')
        return -1;
    if (shift && v > (SIZE_MAX >> shift))
        return -1;
    if (v > SIZE_MAX)
        return -1;
    *out = (size_t)v << shift;
    return 0;
}

static int bench_parse_int(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s)
        return -1;
    errno = 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* One flag of the table: its short and long names and what its value is. */
typedef enum bench_key {
    BENCH_K_MINBYTES,
    BENCH_K_MAXBYTES,
    BENCH_K_STEPFACTOR,
    BENCH_K_ITERS,
    BENCH_K_WARMUP,
    BENCH_K_CHECK,
    BENCH_K_OP,
    BENCH_K_DTYPE,
    BENCH_K_ROOT,
    BENCH_K_RANKS,
    BENCH_K_ALGO,
    BENCH_K_TRANSPORT,
    BENCH_K_FINGERPRINT,
    BENCH_K_MODEL,
    BENCH_K_ENGINE,
} bench_key;

typedef struct bench_flag {
    char shortname; /* 0: long form only */
    const char *longname;
    bench_key key;
    unsigned needs; /* a BENCH_FLAG_* bit the program must accept; 0 always */
    const char *help;
} bench_flag;

static const bench_flag bench_flags[] = {
    {'b', "minbytes", BENCH_K_MINBYTES, 0,
     "smallest size in bytes; K, M, G suffixes are powers of 1024 (default 32M)"},
    {'e', "maxbytes", BENCH_K_MAXBYTES, 0, "largest size in bytes (default 32M)"},
    {'f', "stepfactor", BENCH_K_STEPFACTOR, 0,
     "multiply the size by this from -b up to -e (integer >= 2, default 2)"},
    {'n', "iters", BENCH_K_ITERS, 0, "timed iterations per size (default 20)"},
    {'w', "warmup_iters", BENCH_K_WARMUP, 0, "untimed iterations before them (default 5)"},
    {'c', "check", BENCH_K_CHECK, 0,
     "1: check every rank's output, count wrong elements, exit 1 if any (default 1)"},
    {'o', "op", BENCH_K_OP, 0, "sum, prod, min, max, avg (or mean) (default sum)"},
    {'d', "datatype", BENCH_K_DTYPE, 0,
     "float, double, half, bfloat16, int32, int64 (or f32 f64 f16 bf16 i32 i64) "
     "(default float)"},
    {'r', "root", BENCH_K_ROOT, 0, "root rank of broadcast (default 0)"},
    {0, "ranks", BENCH_K_RANKS, BENCH_FLAG_DSIM, "ranks, each a worker thread (1-128, default 4)"},
    {0, "algo", BENCH_K_ALGO, BENCH_FLAG_DSIM,
     "allreduce algorithm: auto, ring, rhd, tree, reduce_to_one, recursive_doubling, ... "
     "(dsim list algorithms; default auto)"},
    {0, "transport", BENCH_K_TRANSPORT, BENCH_FLAG_DSIM,
     "inproc (threads only), shm (one shared mapping) or tcp (sockets over 127.0.0.1) "
     "(default: inproc for threads, shm for processes)"},
    {0, "fingerprint", BENCH_K_FINGERPRINT, BENCH_FLAG_DSIM,
     "0: run without collective fingerprints, to measure what checking them costs "
     "(default 1)"},
    {0, "model", BENCH_K_MODEL, BENCH_FLAG_DSIM,
     "1: after the table, the cost model calibrated on this machine next to each measured "
     "allreduce time, with its error (allreduce; threads over inproc, or processes; "
     "default 0)"},
    {0, "engine", BENCH_K_ENGINE, BENCH_FLAG_DSIM,
     "the engine that runs the ranks (engines: below; default threads)"},
};
#define BENCH_NFLAGS (sizeof bench_flags / sizeof bench_flags[0])

void bench_flags_help(FILE *out, unsigned flags)
{
    for (size_t i = 0; i < BENCH_NFLAGS; i++) {
        const bench_flag *f = &bench_flags[i];
        if (f->needs && !(flags & f->needs))
            continue;
        char names[48];
        if (f->shortname)
            snprintf(names, sizeof names, "-%c, --%s", f->shortname, f->longname);
        else
            snprintf(names, sizeof names, "    --%s", f->longname);
        fprintf(out, "  %-22s %s\n", names, f->help);
    }
}

/* Applies one flag's value; on bad input writes the message and returns 2. */
static int bench_apply(const char *prog, const char *shown, const bench_flag *f, const char *val,
                       bench_opts *o, FILE *err)
{
    long v = 0;
    switch (f->key) {
    case BENCH_K_MINBYTES:
    case BENCH_K_MAXBYTES: {
        size_t s = 0;
        if (bench_parse_size(val, &s) != 0 || s == 0) {
            fprintf(err,
                    "%s: %s '%s' is not a size; accepted: a whole number of bytes >= 1 with an "
                    "optional K, M or G suffix (powers of 1024), e.g. %s 16M\n",
                    prog, shown, val, shown);
            return 2;
        }
        if (f->key == BENCH_K_MINBYTES)
            o->minbytes = s;
        else
            o->maxbytes = s;
        return 0;
    }
    case BENCH_K_STEPFACTOR:
        if (bench_parse_int(val, 2, 1L << 20, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not a step factor; accepted: an integer from 2 to %ld\n",
                    prog, shown, val, 1L << 20);
            return 2;
        }
        o->stepfactor = (size_t)v;
        return 0;
    case BENCH_K_ITERS:
        if (bench_parse_int(val, 1, 1000000, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not an iteration count; accepted: 1 to 1000000\n", prog,
                    shown, val);
            return 2;
        }
        o->iters = (int)v;
        return 0;
    case BENCH_K_WARMUP:
        if (bench_parse_int(val, 0, 1000000, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not a warm-up count; accepted: 0 to 1000000\n", prog,
                    shown, val);
            return 2;
        }
        o->warmup = (int)v;
        return 0;
    case BENCH_K_CHECK:
        if (bench_parse_int(val, 0, 1, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not a check setting; accepted: 0 or 1\n", prog, shown,
                    val);
            return 2;
        }
        o->check = (int)v;
        return 0;
    case BENCH_K_OP:
        if (dsim_op_parse(val, &o->op) != DSIM_OK) {
            fprintf(err,
                    "%s: %s '%s' is not a reduction op; accepted: sum, prod, min, max, avg "
                    "(or mean)\n",
                    prog, shown, val);
            return 2;
        }
        return 0;
    case BENCH_K_DTYPE:
        if (dsim_dtype_parse(val, &o->dtype) != DSIM_OK) {
            fprintf(err,
                    "%s: %s '%s' is not a datatype; accepted: float, double, half, bfloat16, "
                    "int32, int64 (or f32, f64, f16, bf16, i32, i64)\n",
                    prog, shown, val);
            return 2;
        }
        return 0;
    case BENCH_K_ROOT:
        if (bench_parse_int(val, 0, BENCH_MAX_RANKS - 1, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not a root rank; accepted: 0 to the rank count - 1\n",
                    prog, shown, val);
            return 2;
        }
        o->root = (int)v;
        return 0;
    case BENCH_K_RANKS:
        if (bench_parse_int(val, 1, BENCH_MAX_RANKS, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not a rank count; accepted: 1 to %d\n", prog, shown, val,
                    BENCH_MAX_RANKS);
            return 2;
        }
        o->ranks = (int)v;
        return 0;
    case BENCH_K_ALGO:
        if (!*val) {
            char names[256];
            fprintf(err, "%s: %s '' is not an algorithm; accepted: %s\n", prog, shown,
                    dsim_algo_list(names, sizeof names, 1, ", ", ", "));
            return 2;
        }
        o->algo = val;
        return 0;
    case BENCH_K_TRANSPORT:
        if (!*val) {
            fprintf(err, "%s: %s '' is not a transport; accepted: inproc, shm, tcp\n", prog, shown);
            return 2;
        }
        o->transport = val;
        return 0;
    case BENCH_K_FINGERPRINT:
        if (bench_parse_int(val, 0, 1, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not a fingerprint setting; accepted: 0 or 1\n", prog,
                    shown, val);
            return 2;
        }
        o->fingerprint = (int)v;
        return 0;
    case BENCH_K_ENGINE:
        if (!*val) {
            fprintf(err, "%s: %s '' is not an engine; name one (see '%s --help')\n", prog, shown,
                    prog);
            return 2;
        }
        o->engine = val;
        return 0;
    case BENCH_K_MODEL:
        if (bench_parse_int(val, 0, 1, &v) != 0) {
            fprintf(err, "%s: %s '%s' is not a model setting; accepted: 0 or 1\n", prog, shown,
                    val);
            return 2;
        }
        o->model = (int)v;
        return 0;
    }
    return 2;
}

int bench_parse(const char *prog, int argc, char **argv, int first, unsigned flags, bench_opts *o,
                FILE *err)
{
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == '\0') {
            bench_coll c;
            if (bench_coll_parse(a, &c) != 0) {
                fprintf(err,
                        "%s: unknown collective '%s'; accepted: allreduce, reduce_scatter, "
                        "allgather, broadcast\n",
                        prog, a);
                return 2;
            }
            if (o->have_coll && c != o->coll) {
                fprintf(err, "%s: two collectives given ('%s' and '%s'); name one\n", prog,
                        bench_coll_name(o->coll), a);
                return 2;
            }
            o->have_coll = 1;
            o->coll = c;
            continue;
        }
        const bench_flag *f = NULL;
        const char *val = NULL;
        char shown[40];
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            for (size_t k = 0; k < BENCH_NFLAGS; k++) {
                if (strlen(bench_flags[k].longname) == len &&
                    strncmp(bench_flags[k].longname, name, len) == 0)
                    f = &bench_flags[k];
            }
            if (eq)
                val = eq + 1;
            snprintf(shown, sizeof shown, "--%.*s", (int)(len < 30 ? len : 30), name);
        } else {
            for (size_t k = 0; k < BENCH_NFLAGS; k++) {
                if (bench_flags[k].shortname && bench_flags[k].shortname == a[1])
                    f = &bench_flags[k];
            }
            if (a[2] != '\0')
                val = a + 2;
            snprintf(shown, sizeof shown, "-%c", a[1]);
        }
        if (!f || (f->needs && !(flags & f->needs))) {
            fprintf(err, "%s: unknown flag '%s'; run '%s --help' for the flags\n", prog, a, prog);
            return 2;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(err, "%s: %s needs a value (%s)\n", prog, shown, f->help);
                return 2;
            }
            val = argv[++i];
        }
        int rc = bench_apply(prog, shown, f, val, o, err);
        if (rc != 0)
            return rc;
    }
    if (o->maxbytes < o->minbytes) {
        fprintf(err, "%s: -e %zu is below -b %zu; accepted: -e (maxbytes) >= -b (minbytes)\n", prog,
                o->maxbytes, o->minbytes);
        return 2;
    }
    return 0;
}

bench_size bench_size_for(bench_coll c, size_t bytes, int nranks, dsim_dtype t)
{
    bench_size s = {0, 0, 0};
    size_t es = dsim_dtype_size(t);
    if (es == 0 || nranks < 1)
        return s;
    if (c == BENCH_REDUCE_SCATTER || c == BENCH_ALLGATHER) {
        s.rank_count = bytes / (es * (size_t)nranks);
        s.count = s.rank_count * (size_t)nranks;
    } else {
        s.count = bytes / es;
        s.rank_count = s.count;
    }
    s.bytes = s.count * es;
    return s;
}

int bench_nsteps(const bench_opts *o)
{
    int n = 0;
    size_t b = o->minbytes;
    while (b <= o->maxbytes && n < 64) {
        n++;
        if (b > o->maxbytes / o->stepfactor)
            break;
        b *= o->stepfactor;
    }
    return n;
}

size_t bench_step_bytes(const bench_opts *o, int step)
{
    size_t b = o->minbytes;
    for (int i = 0; i < step; i++)
        b *= o->stepfactor;
    return b;
}

double bench_busbw_factor(bench_coll c, int nranks)
{
    double n = nranks;
    switch (c) {
    case BENCH_ALLREDUCE:
        return 2.0 * (n - 1.0) / n;
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALLGATHER:
        return (n - 1.0) / n;
    case BENCH_BROADCAST:
    default:
        return 1.0;
    }
}

double bench_traffic_bytes(bench_coll c, int nranks, size_t bytes)
{
    double n = nranks, s = (double)bytes;
    switch (c) {
    case BENCH_ALLREDUCE:
        return 2.0 * n * s;
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALLGATHER:
        return (n + 1.0) * s;
    case BENCH_BROADCAST:
    default:
        return n * s;
    }
}

static double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double bench_copy_bandwidth(size_t bytes, int runs)
{
    if (bytes == 0)
        bytes = (size_t)128 << 20;
    if (runs < 1)
        runs = 1;
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0.0;
    }
    /* Touch every page first so that the timed copies measure memory, not
     * page faults. */
    memset(src, 0x5a, bytes);
    memset(dst, 0xa5, bytes);
    double best = 0.0;
    unsigned sink = 0;
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now_s();
        memcpy(dst, src, bytes);
        double t = bench_now_s() - t0;
        /* A read of the destination keeps the copy from being optimised
         * away as a dead store. */
        sink += dst[(size_t)r * 4099 % bytes];
        src[(size_t)r * 8191 % bytes] ^= 1;
        if (t > 0 && (best == 0.0 || t < best))
            best = t;
    }
    volatile unsigned keep = sink;
    (void)keep;
    free(src);
    free(dst);
    return best > 0 ? (double)bytes / best : 0.0;
}

double bench_bound_seconds(bench_coll c, int nranks, size_t bytes, double copy_bw)
{
    if (copy_bw <= 0)
        return 0.0;
    return bench_traffic_bytes(c, nranks, bytes) / (2.0 * copy_bw);
}

/* The largest integer m for which every integer in [-m, m] and every sum of
 * such is exact in the dtype. */
static double bench_exact_limit(dsim_dtype t)
{
    switch (t) {
    case DSIM_F16:
        return 2048.0;
    case DSIM_BF16:
        return 256.0;
    case DSIM_F32:
        return 16777216.0;
    default:
        return 1e15;
    }
}

static long bench_clamp_mag(double limit, int nranks, long sub)
{
    long m = (long)(limit / nranks) - sub;
    if (m > 3)
        m = 3;
    if (m < 1)
        m = 1;
    return m;
}

/* The value of a reducing collective's input: rank `rank`, element i. */
static double bench_reduce_value(dsim_op op, dsim_dtype t, int nranks, int rank, size_t i)
{
    double lim = bench_exact_limit(t);
    switch (op) {
    case DSIM_SUM: {
        long m = bench_clamp_mag(lim, nranks, 0);
        return (double)((long)((i + 3u * (size_t)rank) % (size_t)(2 * m + 1)) - m);
    }
    case DSIM_MEAN: {
        /* The ranks of each pair (2k, 2k+1) add +h and -h around a common
         * g, so the sum is nranks * g and the mean is exact in every dtype
         * (and under integer truncation). */
        long m = bench_clamp_mag(lim, nranks, 1);
        double g = (double)((long)(i % (size_t)(2 * m + 1)) - m);
        double h = (double)((i + (size_t)rank / 2) % 2);
        if (rank % 2 == 1)
            return g - h;
        if (rank + 1 < nranks)
            return g + h;
        return g;
    }
    case DSIM_PROD: {
        /* One rank gives 2 and sometimes another -1, the rest 1: the product
         * is +-2 whatever the rank count, and each position counts. */
        size_t n = (size_t)nranks;
        if ((size_t)rank == i % n)
            return 2.0;
        if (nranks > 1 && (size_t)rank == (i + 1) % n && (i / n) % 2 == 1)
            return -1.0;
        return 1.0;
    }
    case DSIM_MAX:
    case DSIM_MIN:
    default:
        return (double)((long)((i * 5u + (size_t)rank * 3u) % 11u) - 5);
    }
}

/* Data that is moved, not reduced: distinct per owner rank and position. */
static double bench_data_value(int owner, size_t i)
{
    return (double)((long)((i * 7u + (size_t)owner * 13u) % 199u) - 99);
}

double bench_value(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int rank, size_t i)
{
    switch (c) {
    case BENCH_ALLGATHER:
    case BENCH_BROADCAST:
        return bench_data_value(rank, i);
    case BENCH_ALLREDUCE:
    case BENCH_REDUCE_SCATTER:
    default:
        return bench_reduce_value(op, t, nranks, rank, i);
    }
}

size_t bench_in_count(bench_coll c, const bench_size *sz)
{
    return c == BENCH_ALLGATHER ? sz->rank_count : sz->count;
}

size_t bench_out_count(bench_coll c, const bench_size *sz)
{
    return c == BENCH_REDUCE_SCATTER ? sz->rank_count : sz->count;
}

void bench_fill(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int root, int rank,
                const bench_size *sz, void *buf, double *scratch)
{
    size_t es = dsim_dtype_size(t);
    size_t n = bench_in_count(c, sz);
    size_t base = c == BENCH_ALLGATHER ? (size_t)rank * sz->rank_count : 0;
    for (size_t k = 0; k < n; k += BENCH_CHUNK) {
        size_t m = n - k < BENCH_CHUNK ? n - k : BENCH_CHUNK;
        for (size_t j = 0; j < m; j++) {
            size_t i = base + k + j;
            if (c == BENCH_BROADCAST && rank != root)
                scratch[j] = 100.0 + (double)(i % 7u); /* never one of the root's values */
            else
                scratch[j] = bench_value(c, op, t, nranks, rank, i);
        }
        dsim_convert((char *)buf + k * es, t, scratch, DSIM_F64, m);
    }
}

static double bench_reduce_expected(dsim_op op, dsim_dtype t, int nranks, size_t i)
{
    double acc = bench_reduce_value(op, t, nranks, 0, i);
    for (int r = 1; r < nranks; r++) {
        double v = bench_reduce_value(op, t, nranks, r, i);
        switch (op) {
        case DSIM_SUM:
        case DSIM_MEAN:
            acc += v;
            break;
        case DSIM_PROD:
            acc *= v;
            break;
        case DSIM_MAX:
            acc = v > acc ? v : acc;
            break;
        case DSIM_MIN:
        default:
            acc = v < acc ? v : acc;
            break;
        }
    }
    if (op == DSIM_MEAN)
        acc = trunc(acc / nranks);
    return acc;
}

void bench_expected(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int root, int rank,
                    const bench_size *sz, size_t first, size_t n, void *out, double *scratch)
{
    size_t es = dsim_dtype_size(t);
    size_t base = c == BENCH_REDUCE_SCATTER ? (size_t)rank * sz->rank_count : 0;
    for (size_t k = 0; k < n; k += BENCH_CHUNK) {
        size_t m = n - k < BENCH_CHUNK ? n - k : BENCH_CHUNK;
        for (size_t j = 0; j < m; j++) {
            size_t i = base + first + k + j;
            switch (c) {
            case BENCH_ALLGATHER:
                scratch[j] = bench_data_value((int)(i / sz->rank_count), i);
                break;
            case BENCH_BROADCAST:
                scratch[j] = bench_data_value(root, i);
                break;
            case BENCH_ALLREDUCE:
            case BENCH_REDUCE_SCATTER:
            default:
                scratch[j] = bench_reduce_expected(op, t, nranks, i);
                break;
            }
        }
        dsim_convert((char *)out + k * es, t, scratch, DSIM_F64, m);
    }
}

size_t bench_count_wrong(const void *got, const void *want, size_t n, dsim_dtype t)
{
    size_t es = dsim_dtype_size(t);
    if (memcmp(got, want, n * es) == 0)
        return 0;
    size_t wrong = 0;
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < n; i++)
        wrong += memcmp(g + i * es, w + i * es, es) != 0;
    return wrong;
}

int bench_check_output(bench_coll c, dsim_op op, dsim_dtype t, int nranks, int root, int rank,
                       const bench_size *sz, const void *out, size_t *wrong)
{
    size_t es = dsim_dtype_size(t);
    size_t n = bench_out_count(c, sz);
    /* On the heap: worker threads may run on small stacks. want is sized
     * for the widest dtype (8 bytes). */
    double *scratch = malloc(BENCH_CHUNK * sizeof *scratch);
    uint64_t *want = malloc(BENCH_CHUNK * sizeof *want);
    if (!scratch || !want) {
        free(scratch);
        free(want);
        return -1;
    }
    *wrong = 0;
    for (size_t k = 0; k < n; k += BENCH_CHUNK) {
        size_t m = n - k < BENCH_CHUNK ? n - k : BENCH_CHUNK;
        bench_expected(c, op, t, nranks, root, rank, sz, k, m, want, scratch);
        *wrong += bench_count_wrong((const char *)out + k * es, want, m, t);
    }
    free(scratch);
    free(want);
    return 0;
}

const char *bench_redop_name(bench_coll c, dsim_op op)
{
    if (c == BENCH_ALLGATHER || c == BENCH_BROADCAST)
        return "none";
    /* nccl-tests calls the mean "avg". */
    return op == DSIM_MEAN ? "avg" : dsim_op_name(op);
}

void bench_row_finish(bench_row *r, bench_coll c, int nranks, double copy_bw)
{
    r->algbw = r->busbw = r->pct_bound = 0.0;
    if (r->seconds <= 0)
        return;
    r->algbw = (double)r->sz.bytes / r->seconds / 1e9;
    r->busbw = r->algbw * bench_busbw_factor(c, nranks);
    r->pct_bound = 100.0 * bench_bound_seconds(c, nranks, r->sz.bytes, copy_bw) / r->seconds;
}

void bench_print_header(FILE *out, const bench_opts *o, double copy_bw, size_t copy_bytes,
                        const char *timing)
{
    fprintf(out,
            "# minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d "
            "validation: %d",
            o->minbytes, o->maxbytes, o->stepfactor, o->warmup, o->iters, o->check);
    if (o->coll == BENCH_BROADCAST)
        fprintf(out, " root: %d", o->root);
    fprintf(out, "\n");
    fprintf(out,
            "# copy bandwidth: %.2f GB/s (memcpy of %zu MiB, best of 5, one thread; bytes "
            "copied per second)\n",
            copy_bw / 1e9, copy_bytes >> 20);
    fprintf(out, "# %%bound: time to read each rank's input once and write its output once "
                 "at that rate, over the measured time\n");
    fprintf(out, "# time: %s\n", timing);
    fprintf(out, "#\n");
    fprintf(out, "#%11s  %12s  %8s  %6s  %9s  %8s  %8s  %6s  %6s\n", "size", "count", "type",
            "redop", "time", "algbw", "busbw", "#wrong", "%bound");
    fprintf(out, "#%11s  %12s  %8s  %6s  %9s  %8s  %8s\n", "(B)", "(elements)", "", "", "(us)",
            "(GB/s)", "(GB/s)");
    fflush(out);
}

void bench_print_row(FILE *out, const bench_row *r)
{
    double us = r->seconds * 1e6;
    char tbuf[32], wbuf[24];
    if (us >= 10000.0)
        snprintf(tbuf, sizeof tbuf, "%9.0f", us);
    else if (us >= 100.0)
        snprintf(tbuf, sizeof tbuf, "%9.1f", us);
    else
        snprintf(tbuf, sizeof tbuf, "%9.2f", us);
    if (r->checked)
        snprintf(wbuf, sizeof wbuf, "%" PRIu64, r->wrong);
    else
        snprintf(wbuf, sizeof wbuf, "N/A");
    fprintf(out, "%12zu  %12zu  %8s  %6s  %s  %8.2f  %8.2f  %6s  %6.1f\n", r->sz.bytes, r->sz.count,
            dsim_dtype_name(r->dtype), r->redop, tbuf, r->algbw, r->busbw, wbuf, r->pct_bound);
    fflush(out);
}

void bench_print_footer(FILE *out, uint64_t wrong, int checked, double avg_busbw)
{
    if (checked)
        fprintf(out, "# Out of bounds values : %" PRIu64 " %s\n", wrong, wrong ? "FAILED" : "OK");
    else
        fprintf(out, "# Out of bounds values : not checked (-c 0)\n");
    fprintf(out, "# Avg bus bandwidth    : %.3f\n", avg_busbw);
    fprintf(out, "#\n");
    fflush(out);
}

void *bench_buf_alloc(size_t bytes)
{
    return dsim_buf_alloc(bytes);
}
