/* The reference models' compute kernels (internal to src/model).
 *
 * Dense layers over a block of examples, and the optimizers' element-wise
 * updates, each as one ops table per instruction set: "generic" (portable
 * C, whatever the compiler makes of it), and on x86-64 "avx2" and
 * "avx512" (the same source compiled for those targets, chosen at run time
 * by what the CPU has). Every table computes the same bits: the operation
 * order of each result is fixed by the source (8 interleaved partial sums
 * in a dot product, combined by one fixed tree; element-wise sums in index
 * order), never by the vector width, the blocking or the machine, and
 * nothing is fused (the project builds with -ffp-contract=off). Changing
 * a table changes only the speed; tests/model checks the bits agree.
 *
 * Layouts. W is out x in floats, row-major (dsim/model.h); b is out
 * floats. A block of activations, deltas or outputs is n rows of doubles,
 * one an example, row e at e * ld; ld is a multiple of KERN_LANES, and an
 * activation row (what dense_fwd reads) is zero from its width to ld. */
#ifndef DSIM_MODEL_KERN_H
#define DSIM_MODEL_KERN_H

#include <stddef.h>

#include "dsim/optim.h"

/* Lanes of a dot product's partial sums (dense_fwd) and the padding of a
 * row: fixed, so that the result does not depend on the vector width. */
#define KERN_LANES 8

/* Rounds a row width up to whole lanes. */
static inline size_t kern_ld(size_t width)
{
    return (width + KERN_LANES - 1) / KERN_LANES * KERN_LANES;
}

/* Where a layer's gradient sums start and end. Both buffers are laid out
 * as the layer's parameters: W (out x in), then b. */
typedef struct kern_wgrad_io {
    const double *from; /* the sums so far (an earlier block's), or NULL: start at +0 */
    double *to;         /* !final: the sums are left here (may equal from) */
    int final;          /* 1: round into g instead */
    float *g;           /* final: g[k] = (float)((double)g[k] + scale * sum[k]) */
    int set;            /* final, g not read: g[k] = (float)(+0.0 + scale * sum[k]) */
    double scale;
} kern_wgrad_io;

/* Nadam's coefficients of one step, each in float as Keras's ops compute
 * it: 1 - beta1, 1 - beta2, u(t+1), 1 - u_product u(t+1), 1 - u(t),
 * 1 - u_product, 1 - beta2^t. */
typedef struct kern_nadam_k {
    float lr, omb1, omb2, ut1, c1, omut, c0, c2, eps;
} kern_nadam_k;

typedef struct kern_ops {
    size_t size; /* sizeof(kern_ops) */
    const char *name;
    /* Z[e][j] = b[j] + dot(W[j], A[e]) for e < n, j < out, where dot is
     * sum over the 8 lanes L (i = L mod 8, i ascending from +0) combined as
     * ((L0 + L4) + (L2 + L6)) + ((L1 + L5) + (L3 + L7)). */
    void (*dense_fwd)(const float *W, const float *b, size_t in, size_t out, const double *A,
                      size_t lda, size_t n, double *Z, size_t ldz);
    /* B[e][i] = sum over j ascending (from +0) of W[j][i] * D[e][j], for
     * e < n, i < in, or +0 where M[e][i] > 0 is false (ReLU'(0) = 0, as
     * TensorFlow's ReluGrad; M has B's layout). Lanes of B past in are
     * left undefined. */
    void (*dense_bwd)(const float *W, size_t in, size_t out, const double *D, size_t ldd, size_t n,
                      const double *M, double *B, size_t ldb);
    /* R[e][j] = Z[e][j] > 0 ? Z[e][j] : +0 for j < width, and +0 from width
     * to ld (the padding dense_fwd reads); R and Z share the stride ld. */
    void (*relu)(const double *Z, double *R, size_t ld, size_t width, size_t n);
    /* The layer's gradient sums over the block, in example order: for the
     * weights sum[j][i] = (start) + D[0][j] A[0][i] + D[1][j] A[1][i] + ...
     * and for the bias sum[j] = (start) + D[0][j] + D[1][j] + ..., where
     * start is +0 or io->from's value; then into io->to or io->g. */
    void (*dense_wgrad)(size_t in, size_t out, const double *D, size_t ldd, const double *A,
                        size_t lda, size_t n, const kern_wgrad_io *io);
    /* The optimizers of optim.c, element by element in float (the
     * expressions of dsim/optim.h's update rules, operand for operand). */
    void (*sgd)(float *p, const float *g, size_t n, float lr);
    void (*momentum)(float *p, float *accum, const float *g, size_t n, float lr, float mom,
                     int nesterov);
    /* Keras's SGD with momentum: the velocity v holds lr */
    void (*keras_momentum)(float *p, float *v, const float *g, size_t n, float lr, float mom,
                           int nesterov);
    void (*adam)(float *p, float *m, float *v, const float *g, size_t n, float alpha, float omb1,
                 float omb2, float eps);
    /* mom NULL: no momentum; avg NULL: not centered */
    void (*rmsprop)(float *p, float *v, float *mom, float *avg, const float *g, size_t n, float lr,
                    float rho, float omr, float momentum, float eps);
    void (*adagrad)(float *p, float *acc, const float *g, size_t n, float lr, float eps);
    /* Keras 3's Nadam with this step's coefficients (optim.c) */
    void (*nadam)(float *p, float *m, float *v, const float *g, size_t n, const kern_nadam_k *c);
    /* LAMB's moments and its update before the trust ratio, into u: m +=
     * (g - m) omb1; v += (g^2 - v) omb2; u = (m / c1) / (sqrt(v / c2) + eps) */
    void (*lamb_u)(float *m, float *v, const float *g, float *u, size_t n, float omb1, float omb2,
                   float c1, float c2, float eps);
    /* Keras 3's Adadelta: omr = float(1 - rho) */
    void (*adadelta)(float *p, float *ag, float *ad, const float *g, size_t n, float lr, float rho,
                     float omr, float eps);
} kern_ops;

/* The table in use: the fastest the CPU runs, or the one chosen with
 * dsim_model_kernels_use. */
const kern_ops *kern_get(void);

#endif
