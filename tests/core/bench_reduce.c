/* Reduction kernel throughput against memcpy, in the same run.
 *
 * 16 MiB buffers are past L2 but, with three of them, about the size of a
 * server L3: part of the working set may stay in cache (the 2-operand case
 * touches two buffers, the 3-operand case three), and glibc's memcpy may
 * switch to non-temporal stores at this size. Read the ratios with that in
 * mind.
 *
 * Prints, for f32 SUM on 16 MiB: the 3-operand kernel (out = a + b), the
 * 2-operand kernel (io += in), a memcpy followed by the 2-operand kernel
 * (the alternative way to get a 3-operand result) and plain memcpy. Each
 * line gives the buffer rate (16 MiB / time), the memory traffic rate
 * (bytes read + written / time) and the traffic rate as a fraction of
 * memcpy's. The best of several repetitions counts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsim/err.h"
#include "dsim/reduce.h"

#define BENCH_BYTES ((size_t)16 << 20)
#define BENCH_REPS  15

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { BENCH_MEMCPY, BENCH_K3, BENCH_K2, BENCH_COPY_K2 };

static double bench_run(int which, float *out, const float *a, const float *b, size_t n)
{
    double best = 1e30;
    for (int rep = 0; rep < BENCH_REPS; rep++) {
        double t0 = bench_now();
        dsim_err e = DSIM_OK;
        switch (which) {
        case BENCH_MEMCPY:
            memcpy(out, a, n * sizeof *out);
            break;
        case BENCH_K3:
            e = dsim_reduce_local3(out, a, b, n, DSIM_F32, DSIM_SUM);
            break;
        case BENCH_K2:
            e = dsim_reduce_local(out, b, n, DSIM_F32, DSIM_SUM);
            break;
        case BENCH_COPY_K2:
            memcpy(out, a, n * sizeof *out);
            e = dsim_reduce_local(out, b, n, DSIM_F32, DSIM_SUM);
            break;
        }
        double t = bench_now() - t0;
        if (e != DSIM_OK) {
            fprintf(stderr, "bench_reduce: %s\n", dsim_errmsg());
            return -1;
        }
        if (t < best)
            best = t;
    }
    return best;
}

int main(void)
{
    size_t n = BENCH_BYTES / sizeof(float);
    float *a = aligned_alloc(64, BENCH_BYTES), *b = aligned_alloc(64, BENCH_BYTES),
          *out = aligned_alloc(64, BENCH_BYTES);
    if (!a || !b || !out) {
        fprintf(stderr, "bench_reduce: cannot allocate 3 x 16 MiB\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(i & 1023);
        b[i] = 0.5f;
        out[i] = 0.0f;
    }

    static const struct {
        int which;
        const char *name;
        double traffic; /* bytes moved per buffer byte */
    } cases[] = {
        {BENCH_MEMCPY, "memcpy", 2},
        {BENCH_K3, "f32 sum 3-operand (out = a + b)", 3},
        {BENCH_K2, "f32 sum 2-operand (io += in)", 3},
        {BENCH_COPY_K2, "memcpy + 2-operand", 5},
    };
    double memcpy_rate = 0;
    printf("reduce_kernels: %zu MiB buffers, best of %d\n", BENCH_BYTES >> 20, BENCH_REPS);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double t = bench_run(cases[c].which, out, a, b, n);
        if (t < 0)
            return 1;
        double buf_rate = (double)BENCH_BYTES / t / 1e9;
        double traffic_rate = buf_rate * cases[c].traffic;
        if (cases[c].which == BENCH_MEMCPY)
            memcpy_rate = traffic_rate;
        printf("  %-34s %7.3f ms  %6.2f GB/s buffer  %6.2f GB/s traffic  %5.2fx memcpy\n",
               cases[c].name, t * 1e3, buf_rate, traffic_rate, traffic_rate / memcpy_rate);
    }

    /* the timed code must also be right */
    if (dsim_reduce_local3(out, a, b, n, DSIM_F32, DSIM_SUM) != DSIM_OK)
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (out[i] != a[i] + b[i]) {
            fprintf(stderr, "bench_reduce: element %zu is %g, expected %g\n", i, out[i],
                    a[i] + b[i]);
            return 1;
        }
    }
    free(a);
    free(b);
    free(out);
    return 0;
}
