/* The kernels of kern.h, written once and compiled once per instruction set:
 * kern.c includes this file with
 *   KB(x)          the name of x in this set (x_avx2, ...)
 *   KB_ATTR        the attributes of every function (the target)
 *   KV, KVL, KVS   its vectors: KB_W doubles, KB_W int64, 2 KB_W floats
 *   KB_W           doubles in a vector (2, 4 or 8); a chunk of 8 lanes is
 *                  KB_NV = 8 / KB_W vectors
 *   KB_LDF(p), KB_STF(p, v)   KB_W floats at p to doubles, and back
 *   KB_SQRTS(v)    the square root of each float of a KVS
 *   KB_FJ, KB_FE   dense_fwd's tile: rows x examples
 *   KB_BE, KB_BI   dense_bwd's tile: examples x 8-lane chunks of inputs
 *   KB_WJ, KB_WI   dense_wgrad's tile: rows x 8-lane chunks of inputs
 * The tile sizes and the vector width only say how many sums are kept in
 * registers at once and how many lanes an instruction takes: each sum's
 * operations and their order are the same for all of them (kern.h). */

#define KB_NV (KERN_LANES / KB_W)

KB_ATTR static inline KV KB(ld)(const double *p)
{
    KV v;
    memcpy(&v, p, sizeof v);
    return v;
}

KB_ATTR static inline void KB(st)(double *p, KV v)
{
    memcpy(p, &v, sizeof v);
}

/* v where m > 0, +0 elsewhere (m NaN included): x > 0 ? x : 0.0 lane by
 * lane, without a branch. */
KB_ATTR static inline KV KB(keep_pos)(KV v, KV m)
{
    KVL bits;
    memcpy(&bits, &v, sizeof bits);
    bits &= (KVL)(m > 0.0);
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* The 8-lane chunk at p (floats: f, doubles: d), the lanes from k on +0. */
KB_ATTR static inline void KB(chunk_f)(const float *p, size_t k, KV *out)
{
    float t[KERN_LANES] = {0};
    if (k < KERN_LANES) {
        memcpy(t, p, k * sizeof(float));
        p = t;
    }
    KB_UNROLL
    for (size_t v = 0; v < KB_NV; v++)
        out[v] = KB_LDF(p + v * KB_W);
}

KB_ATTR static inline void KB(chunk_d)(const double *p, size_t k, KV *out)
{
    double t[KERN_LANES] = {0};
    if (k < KERN_LANES) {
        memcpy(t, p, k * sizeof(double));
        p = t;
    }
    KB_UNROLL
    for (size_t v = 0; v < KB_NV; v++)
        out[v] = KB(ld)(p + v * KB_W);
}

/* A chunk's 8 lanes combined by the tree of kern.h. */
KB_ATTR static inline double KB(hsum)(const KV *c)
{
    double l[KERN_LANES];
    KB_UNROLL
    for (size_t v = 0; v < KB_NV; v++)
        KB(st)(l + v * KB_W, c[v]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* ---- dense_fwd ------------------------------------------------------------ */

/* One step of the dot products: the chunk of every row times the chunk of
 * every example. */
__attribute__((always_inline)) KB_ATTR static inline void
KB(fwd_step)(KV acc[KB_FJ][KB_FE][KB_NV], const KV w[KB_FJ][KB_NV], const double *A, size_t lda,
             size_t e0, size_t EE, size_t JJ, size_t i)
{
    KB_UNROLL
    for (size_t ee = 0; ee < EE; ee++) {
        KB_UNROLL
        for (size_t v = 0; v < KB_NV; v++) {
            KV a = KB(ld)(A + (e0 + ee) * lda + i + v * KB_W);
            KB_UNROLL
            for (size_t jj = 0; jj < JJ; jj++)
                acc[jj][ee][v] += w[jj][v] * a;
        }
    }
}

/* Rows j0 .. j0+JJ-1 by examples e0 .. e0+EE-1 (JJ <= KB_FJ, EE <= KB_FE,
 * constants where it is called, so that the sums stay in registers). */
__attribute__((always_inline)) KB_ATTR static inline void
KB(fwd_tile)(const float *W, const float *b, size_t in, size_t j0, size_t JJ, const double *A,
             size_t lda, size_t e0, size_t EE, double *Z, size_t ldz)
{
    KV acc[KB_FJ][KB_FE][KB_NV];
    KV w[KB_FJ][KB_NV];
    size_t full = in / KERN_LANES, tail = in % KERN_LANES;
    KB_UNROLL
    for (size_t jj = 0; jj < JJ; jj++)
        KB_UNROLL
    for (size_t ee = 0; ee < EE; ee++)
        KB_UNROLL
    for (size_t v = 0; v < KB_NV; v++)
        acc[jj][ee][v] = (KV){0};
    for (size_t c = 0; c < full; c++) {
        size_t i = c * KERN_LANES;
        KB_UNROLL
        for (size_t jj = 0; jj < JJ; jj++)
            KB_UNROLL
        for (size_t v = 0; v < KB_NV; v++)
            w[jj][v] = KB_LDF(W + (j0 + jj) * in + i + v * KB_W);
        KB(fwd_step)(acc, w, A, lda, e0, EE, JJ, i);
    }
    if (tail) {
        size_t i = full * KERN_LANES;
        KB_UNROLL
        for (size_t jj = 0; jj < JJ; jj++)
            KB(chunk_f)(W + (j0 + jj) * in + i, tail, w[jj]);
        KB(fwd_step)(acc, w, A, lda, e0, EE, JJ, i);
    }
#ifdef KB_HSUM8
    /* 4 rows by 2 examples at a time: the 8 sums in one vector, the lower
     * half example ee's, the upper ee+1's (the same bits as hsum's). */
    if (JJ == 4 && EE % 2 == 0) {
        KV bias = (KV){0};
        KB_UNROLL
        for (size_t k = 0; k < 8; k++)
            bias[k] = (double)b[j0 + k % 4];
        KB_UNROLL
        for (size_t ee = 0; ee < EE; ee += 2) {
            KV c[8];
            KB_UNROLL
            for (size_t k = 0; k < 8; k++)
                c[k] = acc[k % 4][ee + k / 4][0];
            KV z = bias + KB_HSUM8(c);
            memcpy(Z + (e0 + ee) * ldz + j0, &z, 4 * sizeof(double));
            memcpy(Z + (e0 + ee + 1) * ldz + j0, (double *)&z + 4, 4 * sizeof(double));
        }
        return;
    }
#endif
    KB_UNROLL
    for (size_t ee = 0; ee < EE; ee++)
        KB_UNROLL
    for (size_t jj = 0; jj < JJ; jj++)
        Z[(e0 + ee) * ldz + j0 + jj] = (double)b[j0 + jj] + KB(hsum)(acc[jj][ee]);
}

KB_ATTR static void KB(fwd_rows)(const float *W, const float *b, size_t in, size_t j0, size_t JJ,
                                 const double *A, size_t lda, size_t n, double *Z, size_t ldz,
                                 size_t out)
{
    /* The next rows, while these compute: a replica's parameters are
     * usually not in the cache (every replica has its own). */
    size_t ahead = j0 + JJ < out ? (out - j0 - JJ < KB_FJ ? out - j0 - JJ : KB_FJ) : 0;
    for (size_t o = 0; o < ahead * in; o += 64 / sizeof(float))
        __builtin_prefetch(W + (j0 + JJ) * in + o);
    size_t e = 0;
    if (JJ == KB_FJ) {
        for (; e + KB_FE <= n; e += KB_FE)
            KB(fwd_tile)(W, b, in, j0, KB_FJ, A, lda, e, KB_FE, Z, ldz);
        for (; KB_FE > 2 && e + 2 <= n; e += 2)
            KB(fwd_tile)(W, b, in, j0, KB_FJ, A, lda, e, 2, Z, ldz);
        for (; e < n; e++)
            KB(fwd_tile)(W, b, in, j0, KB_FJ, A, lda, e, 1, Z, ldz);
        return;
    }
    for (; e + KB_FE <= n; e += KB_FE)
        KB(fwd_tile)(W, b, in, j0, 1, A, lda, e, KB_FE, Z, ldz);
    for (; e < n; e++)
        KB(fwd_tile)(W, b, in, j0, 1, A, lda, e, 1, Z, ldz);
}

KB_ATTR static void KB(dense_fwd)(const float *W, const float *b, size_t in, size_t out,
                                  const double *A, size_t lda, size_t n, double *Z, size_t ldz)
{
    size_t j = 0;
    for (; j + KB_FJ <= out; j += KB_FJ)
        KB(fwd_rows)(W, b, in, j, KB_FJ, A, lda, n, Z, ldz, out);
    for (; j < out; j++)
        KB(fwd_rows)(W, b, in, j, 1, A, lda, n, Z, ldz, out);
}

/* ---- dense_bwd ------------------------------------------------------------ */

/* Examples e0 .. e0+EE-1 by the 8-lane chunks c0 .. c0+II-1 of the inputs,
 * all whole (8 * (c0 + II) <= in). */
__attribute__((always_inline)) KB_ATTR static inline void
KB(bwd_tile)(const float *W, size_t in, size_t out, const double *D, size_t ldd, size_t e0,
             size_t EE, size_t c0, size_t II, const double *M, double *B, size_t ldb)
{
    KV acc[KB_BE][KB_BI][KB_NV];
    KV w[KB_BI][KB_NV];
    KB_UNROLL
    for (size_t ee = 0; ee < EE; ee++)
        KB_UNROLL
    for (size_t ii = 0; ii < II; ii++)
        KB_UNROLL
    for (size_t v = 0; v < KB_NV; v++)
        acc[ee][ii][v] = (KV){0};
    for (size_t j = 0; j < out; j++) {
        const float *row = W + j * in + c0 * KERN_LANES;
        KB_UNROLL
        for (size_t ii = 0; ii < II; ii++)
            KB_UNROLL
        for (size_t v = 0; v < KB_NV; v++)
            w[ii][v] = KB_LDF(row + ii * KERN_LANES + v * KB_W);
        KB_UNROLL
        for (size_t ee = 0; ee < EE; ee++) {
            double d = D[(e0 + ee) * ldd + j];
            KB_UNROLL
            for (size_t ii = 0; ii < II; ii++)
                KB_UNROLL
            for (size_t v = 0; v < KB_NV; v++)
                acc[ee][ii][v] += w[ii][v] * d;
        }
    }
    KB_UNROLL
    for (size_t ee = 0; ee < EE; ee++)
        KB_UNROLL
    for (size_t ii = 0; ii < II; ii++)
        KB_UNROLL
    for (size_t v = 0; v < KB_NV; v++) {
        size_t at = (e0 + ee) * ldb + (c0 + ii) * KERN_LANES + v * KB_W;
        KB(st)(B + at, KB(keep_pos)(acc[ee][ii][v], KB(ld)(M + at)));
    }
}

KB_ATTR static void KB(bwd_chunks)(const float *W, size_t in, size_t out, const double *D,
                                   size_t ldd, size_t n, size_t c0, size_t II, const double *M,
                                   double *B, size_t ldb)
{
    size_t e = 0;
    if (II == KB_BI) {
        for (; e + KB_BE <= n; e += KB_BE)
            KB(bwd_tile)(W, in, out, D, ldd, e, KB_BE, c0, KB_BI, M, B, ldb);
        for (; KB_BE > 2 && e + 2 <= n; e += 2)
            KB(bwd_tile)(W, in, out, D, ldd, e, 2, c0, KB_BI, M, B, ldb);
        for (; e < n; e++)
            KB(bwd_tile)(W, in, out, D, ldd, e, 1, c0, KB_BI, M, B, ldb);
        return;
    }
    if (KB_BI > 2 && II == 2) {
        for (; e + KB_BE <= n; e += KB_BE)
            KB(bwd_tile)(W, in, out, D, ldd, e, KB_BE, c0, 2, M, B, ldb);
        for (; e < n; e++)
            KB(bwd_tile)(W, in, out, D, ldd, e, 1, c0, 2, M, B, ldb);
        return;
    }
    for (; e + KB_BE <= n; e += KB_BE)
        KB(bwd_tile)(W, in, out, D, ldd, e, KB_BE, c0, 1, M, B, ldb);
    for (; e < n; e++)
        KB(bwd_tile)(W, in, out, D, ldd, e, 1, c0, 1, M, B, ldb);
}

KB_ATTR static void KB(dense_bwd)(const float *W, size_t in, size_t out, const double *D,
                                  size_t ldd, size_t n, const double *M, double *B, size_t ldb)
{
    size_t full = in / KERN_LANES, c = 0;
    for (; c + KB_BI <= full; c += KB_BI)
        KB(bwd_chunks)(W, in, out, D, ldd, n, c, KB_BI, M, B, ldb);
    for (; KB_BI > 2 && c + 2 <= full; c += 2)
        KB(bwd_chunks)(W, in, out, D, ldd, n, c, 2, M, B, ldb);
    for (; c < full; c++)
        KB(bwd_chunks)(W, in, out, D, ldd, n, c, 1, M, B, ldb);
    /* The last inputs, fewer than 8: one sum at a time, in the same order. */
    for (size_t i = full * KERN_LANES; i < in; i++) {
        for (size_t e = 0; e < n; e++) {
            double s = 0.0;
            for (size_t j = 0; j < out; j++)
                s += (double)W[j * in + i] * D[e * ldd + j];
            B[e * ldb + i] = M[e * ldb + i] > 0.0 ? s : 0.0;
        }
    }
}

/* ---- relu ----------------------------------------------------------------- */

KB_ATTR static void KB(relu)(const double *Z, double *R, size_t ld, size_t width, size_t n)
{
    size_t full = width / KB_W * KB_W;
    for (size_t e = 0; e < n; e++) {
        const double *z = Z + e * ld;
        double *r = R + e * ld;
        for (size_t j = 0; j < full; j += KB_W) {
            KV v = KB(ld)(z + j);
            KB(st)(r + j, KB(keep_pos)(v, v));
        }
        for (size_t j = full; j < width; j++)
            r[j] = z[j] > 0.0 ? z[j] : 0.0;
        for (size_t j = width; j < ld; j++)
            r[j] = 0.0;
    }
}

/* ---- dense_wgrad ---------------------------------------------------------- */

/* Where the sums of a tile start (+0, or from's) and end (to, or g rounded
 * once). */
typedef struct KB(wg_io) {
    const double *from;
    double *to;
    float *g;
    double scale;
    int final, set;
} KB(wg_io);

/* The k <= 8 sums at offset off of the layer: their start, and their end. */
KB_ATTR static inline void KB(wg_start)(const KB(wg_io) * io, size_t off, size_t k, KV *s)
{
    if (!io->from) {
        KB_UNROLL
        for (size_t v = 0; v < KB_NV; v++)
            s[v] = (KV){0};
        return;
    }
    KB(chunk_d)(io->from + off, k, s);
}

KB_ATTR static inline void KB(wg_end)(const KB(wg_io) * io, size_t off, size_t k, const KV *s)
{
    if (k == KERN_LANES) {
        KB_UNROLL
        for (size_t v = 0; v < KB_NV; v++) {
            size_t at = off + v * KB_W;
            if (io->final)
                KB_STF(io->g + at, (io->set ? (KV){0} : KB_LDF(io->g + at)) + s[v] * io->scale);
            else
                KB(st)(io->to + at, s[v]);
        }
        return;
    }
    if (io->final) {
        float t[KERN_LANES];
        KV g[KB_NV];
        KB(chunk_f)(io->g + off, io->set ? 0 : k, g);
        for (size_t v = 0; v < KB_NV; v++)
            KB_STF(t + v * KB_W, g[v] + s[v] * io->scale);
        memcpy(io->g + off, t, k * sizeof(float));
    } else {
        double t[KERN_LANES];
        for (size_t v = 0; v < KB_NV; v++)
            KB(st)(t + v * KB_W, s[v]);
        memcpy(io->to + off, t, k * sizeof(double));
    }
}

/* Rows j0 .. j0+JJ-1 by the input chunks c0 .. c0+II-1; the last chunk of
 * the tile holds k_last inputs (fewer than 8 at the end of a row). */
__attribute__((always_inline)) KB_ATTR static inline void
KB(wg_tile)(size_t in, const double *D, size_t ldd, const double *A, size_t lda, size_t n,
            size_t j0, size_t JJ, size_t c0, size_t II, size_t k_last, const KB(wg_io) * io)
{
    KV acc[KB_WJ][KB_WI][KB_NV];
    KB_UNROLL
    for (size_t jj = 0; jj < JJ; jj++)
        KB_UNROLL
    for (size_t ii = 0; ii < II; ii++)
        KB(wg_start)
    (io, (j0 + jj) * in + (c0 + ii) * KERN_LANES, ii + 1 == II ? k_last : KERN_LANES, acc[jj][ii]);
    for (size_t e = 0; e < n; e++) {
        KV a[KB_WI][KB_NV];
        KB_UNROLL
        for (size_t ii = 0; ii < II; ii++)
            KB_UNROLL
        for (size_t v = 0; v < KB_NV; v++)
            a[ii][v] = KB(ld)(A + e * lda + (c0 + ii) * KERN_LANES + v * KB_W);
        KB_UNROLL
        for (size_t jj = 0; jj < JJ; jj++) {
            double d = D[e * ldd + j0 + jj];
            KB_UNROLL
            for (size_t ii = 0; ii < II; ii++)
                KB_UNROLL
            for (size_t v = 0; v < KB_NV; v++)
                acc[jj][ii][v] += a[ii][v] * d;
        }
    }
    KB_UNROLL
    for (size_t jj = 0; jj < JJ; jj++)
        KB_UNROLL
    for (size_t ii = 0; ii < II; ii++)
        KB(wg_end)
    (io, (j0 + jj) * in + (c0 + ii) * KERN_LANES, ii + 1 == II ? k_last : KERN_LANES, acc[jj][ii]);
}

KB_ATTR static void KB(wg_rows)(size_t in, const double *D, size_t ldd, const double *A, size_t lda,
                                size_t n, size_t j0, size_t JJ, const KB(wg_io) * io)
{
    size_t chunks = kern_ld(in) / KERN_LANES, c = 0;
    size_t k_end = in % KERN_LANES ? in % KERN_LANES : KERN_LANES;
    if (JJ == KB_WJ) {
        for (; c + KB_WI < chunks; c += KB_WI)
            KB(wg_tile)(in, D, ldd, A, lda, n, j0, KB_WJ, c, KB_WI, KERN_LANES, io);
        for (; KB_WI > 2 && c + 2 < chunks; c += 2)
            KB(wg_tile)(in, D, ldd, A, lda, n, j0, KB_WJ, c, 2, KERN_LANES, io);
        for (; c < chunks; c++)
            KB(wg_tile)
        (in, D, ldd, A, lda, n, j0, KB_WJ, c, 1, c + 1 == chunks ? k_end : KERN_LANES, io);
        return;
    }
    for (; c + KB_WI < chunks; c += KB_WI)
        KB(wg_tile)(in, D, ldd, A, lda, n, j0, 1, c, KB_WI, KERN_LANES, io);
    for (; c < chunks; c++)
        KB(wg_tile)(in, D, ldd, A, lda, n, j0, 1, c, 1, c + 1 == chunks ? k_end : KERN_LANES, io);
}

KB_ATTR static void KB(dense_wgrad)(size_t in, size_t out, const double *D, size_t ldd,
                                    const double *A, size_t lda, size_t n, const kern_wgrad_io *kio)
{
    const KB(wg_io) io_ = {kio->from, kio->to, kio->g, kio->scale, kio->final, kio->set},
                    *io = &io_;
    size_t j = 0;
    for (; j + KB_WJ <= out; j += KB_WJ)
        KB(wg_rows)(in, D, ldd, A, lda, n, j, KB_WJ, io);
    for (; j < out; j++)
        KB(wg_rows)(in, D, ldd, A, lda, n, j, 1, io);
    /* The bias: sum[j] = start + D[0][j] + D[1][j] + ..., 8 rows at once. */
    size_t boff = out * in;
    for (size_t c = 0; c < kern_ld(out); c += KERN_LANES) {
        size_t k = out - c < KERN_LANES ? out - c : KERN_LANES;
        KV s[KB_NV], d[KB_NV];
        KB(wg_start)(io, boff + c, k, s);
        for (size_t e = 0; e < n; e++) {
            KB(chunk_d)(D + e * ldd + c, k, d);
            for (size_t v = 0; v < KB_NV; v++)
                s[v] += d[v];
        }
        KB(wg_end)(io, boff + c, k, s);
    }
}

/* ---- optimizers ----------------------------------------------------------- */

/* Element-wise, a vector of floats at a time and then one at a time: every
 * element gets the scalar expression's operations in its order, so any
 * width gives the same bits. */
#define KB_WS (2 * KB_W)

KB_ATTR static inline KVS KB(lds)(const float *p)
{
    KVS v;
    memcpy(&v, p, sizeof v);
    return v;
}

KB_ATTR static inline void KB(sts)(float *p, KVS v)
{
    memcpy(p, &v, sizeof v);
}

KB_ATTR static void KB(sgd)(float *p, const float *g, size_t n, float lr)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS)
        KB(sts)(p + k, KB(lds)(p + k) - lr * KB(lds)(g + k));
    for (; k < n; k++)
        p[k] -= lr * g[k];
}

KB_ATTR static void KB(momentum)(float *p, float *accum, const float *g, size_t n, float lr,
                                 float mom, int nesterov)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k);
        KVS ak = KB(lds)(accum + k) * mom + gk;
        KB(sts)(accum + k, ak);
        if (nesterov)
            KB(sts)(p + k, KB(lds)(p + k) - (gk * lr + ak * mom * lr));
        else
            KB(sts)(p + k, KB(lds)(p + k) - lr * ak);
    }
    for (; k < n; k++) {
        accum[k] = accum[k] * mom + g[k];
        if (nesterov)
            p[k] -= g[k] * lr + accum[k] * mom * lr;
        else
            p[k] -= lr * accum[k];
    }
}

/* Keras's SGD(momentum=m): v = v * m - g * lr; p += v; nesterov p += v * m
 * - g * lr (tf.keras's ResourceApplyKerasMomentum and Keras 3 alike). */
KB_ATTR static void KB(keras_momentum)(float *p, float *v, const float *g, size_t n, float lr,
                                       float mom, int nesterov)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k);
        KVS vk = KB(lds)(v + k) * mom - gk * lr;
        KB(sts)(v + k, vk);
        if (nesterov)
            KB(sts)(p + k, KB(lds)(p + k) + (vk * mom - gk * lr));
        else
            KB(sts)(p + k, KB(lds)(p + k) + vk);
    }
    for (; k < n; k++) {
        v[k] = v[k] * mom - g[k] * lr;
        if (nesterov)
            p[k] += v[k] * mom - g[k] * lr;
        else
            p[k] += v[k];
    }
}

/* Adam's moments, as Adam, Nadam and LAMB update them: m += (g - m) omb1,
 * v += (g^2 - v) omb2, stored at m and v and returned in *mo and *vo. */
KB_ATTR static inline void KB(moments)(float *m, float *v, KVS gk, float omb1, float omb2, KVS *mo,
                                       KVS *vo)
{
    KVS mk = KB(lds)(m), vk = KB(lds)(v);
    mk += (gk - mk) * omb1;
    vk += (gk * gk - vk) * omb2;
    KB(sts)(m, mk);
    KB(sts)(v, vk);
    *mo = mk;
    *vo = vk;
}

KB_ATTR static void KB(adam)(float *p, float *m, float *v, const float *g, size_t n, float alpha,
                             float omb1, float omb2, float eps)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k), mk, vk;
        KB(moments)(m + k, v + k, gk, omb1, omb2, &mk, &vk);
        KB(sts)(p + k, KB(lds)(p + k) - mk * alpha / (KB_SQRTS(vk) + eps));
    }
    for (; k < n; k++) {
        float gk = g[k];
        m[k] += (gk - m[k]) * omb1;
        v[k] += (gk * gk - v[k]) * omb2;
        p[k] -= m[k] * alpha / (sqrtf(v[k]) + eps);
    }
}

/* Keras 3's RMSprop, operand for operand: v = rho v + omr g^2; centered
 * a = rho a + omr g, d = (v - a^2) + eps, else d = v + eps; inc = (lr g) /
 * sqrt(d); with momentum m = momentum m + inc, p -= m; else p -= inc. */
KB_ATTR static void KB(rmsprop)(float *p, float *v, float *mom, float *avg, const float *g,
                                size_t n, float lr, float rho, float omr, float momentum, float eps)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k);
        KVS vk = rho * KB(lds)(v + k) + omr * (gk * gk), dk;
        KB(sts)(v + k, vk);
        if (avg) {
            KVS ak = rho * KB(lds)(avg + k) + omr * gk;
            KB(sts)(avg + k, ak);
            dk = (vk - ak * ak) + eps;
        } else {
            dk = vk + eps;
        }
        KVS inc = (lr * gk) / KB_SQRTS(dk);
        if (mom) {
            KVS mk = momentum * KB(lds)(mom + k) + inc;
            KB(sts)(mom + k, mk);
            KB(sts)(p + k, KB(lds)(p + k) - mk);
        } else {
            KB(sts)(p + k, KB(lds)(p + k) - inc);
        }
    }
    for (; k < n; k++) {
        float gk = g[k], dk;
        v[k] = rho * v[k] + omr * (gk * gk);
        if (avg) {
            avg[k] = rho * avg[k] + omr * gk;
            dk = (v[k] - avg[k] * avg[k]) + eps;
        } else {
            dk = v[k] + eps;
        }
        float inc = (lr * gk) / sqrtf(dk);
        if (mom) {
            mom[k] = momentum * mom[k] + inc;
            p[k] -= mom[k];
        } else {
            p[k] -= inc;
        }
    }
}

/* Keras 3's Adagrad: acc += g^2; p -= (lr g) / sqrt(acc + eps). */
KB_ATTR static void KB(adagrad)(float *p, float *acc, const float *g, size_t n, float lr, float eps)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k);
        KVS ak = KB(lds)(acc + k) + gk * gk;
        KB(sts)(acc + k, ak);
        KB(sts)(p + k, KB(lds)(p + k) - (lr * gk) / KB_SQRTS(ak + eps));
    }
    for (; k < n; k++) {
        float gk = g[k];
        acc[k] = acc[k] + gk * gk;
        p[k] -= (lr * gk) / sqrtf(acc[k] + eps);
    }
}

/* Keras 3's Nadam, operand for operand: m += (g - m) omb1; v += (g^2 - v)
 * omb2; p -= (((ut1 m) / c1 + (omut g) / c0) lr) / (sqrt(v / c2) + eps). */
KB_ATTR static void KB(nadam)(float *p, float *m, float *v, const float *g, size_t n,
                              const kern_nadam_k *c)
{
    const float lr = c->lr, omb1 = c->omb1, omb2 = c->omb2, ut1 = c->ut1, c1 = c->c1;
    const float omut = c->omut, c0 = c->c0, c2 = c->c2, eps = c->eps;
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k), mk, vk;
        KB(moments)(m + k, v + k, gk, omb1, omb2, &mk, &vk);
        KVS mh = (ut1 * mk) / c1 + (omut * gk) / c0;
        KB(sts)(p + k, KB(lds)(p + k) - (mh * lr) / (KB_SQRTS(vk / c2) + eps));
    }
    for (; k < n; k++) {
        m[k] += (g[k] - m[k]) * omb1;
        v[k] += (g[k] * g[k] - v[k]) * omb2;
        float mh = (ut1 * m[k]) / c1 + (omut * g[k]) / c0;
        p[k] -= (mh * lr) / (sqrtf(v[k] / c2) + eps);
    }
}

KB_ATTR static void KB(lamb_u)(float *m, float *v, const float *g, float *u, size_t n, float omb1,
                               float omb2, float c1, float c2, float eps)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k), mk, vk;
        KB(moments)(m + k, v + k, gk, omb1, omb2, &mk, &vk);
        KB(sts)(u + k, (mk / c1) / (KB_SQRTS(vk / c2) + eps));
    }
    for (; k < n; k++) {
        m[k] += (g[k] - m[k]) * omb1;
        v[k] += (g[k] * g[k] - v[k]) * omb2;
        u[k] = (m[k] / c1) / (sqrtf(v[k] / c2) + eps);
    }
}

/* Keras 3's Adadelta, operand for operand: ag = rho ag + omr g^2; d =
 * -((sqrt(ad + eps) g) / sqrt(ag + eps)); ad = rho ad + omr d^2; p += lr d. */
KB_ATTR static void KB(adadelta)(float *p, float *ag, float *ad, const float *g, size_t n, float lr,
                                 float rho, float omr, float eps)
{
    size_t k = 0;
    for (; k + KB_WS <= n; k += KB_WS) {
        KVS gk = KB(lds)(g + k);
        KVS agk = rho * KB(lds)(ag + k) + omr * (gk * gk);
        KVS adk = KB(lds)(ad + k);
        KVS d = -((KB_SQRTS(adk + eps) * gk) / KB_SQRTS(agk + eps));
        KB(sts)(ag + k, agk);
        KB(sts)(ad + k, rho * adk + omr * (d * d));
        KB(sts)(p + k, KB(lds)(p + k) + lr * d);
    }
    for (; k < n; k++) {
        ag[k] = rho * ag[k] + omr * (g[k] * g[k]);
        float d = -((sqrtf(ad[k] + eps) * g[k]) / sqrtf(ag[k] + eps));
        ad[k] = rho * ad[k] + omr * (d * d);
        p[k] += lr * d;
    }
}

#undef KB_NV
#undef KB_WS

static const kern_ops KB(ops) = {
    .size = sizeof(kern_ops),
    .name = KB_NAME,
    .dense_fwd = KB(dense_fwd),
    .dense_bwd = KB(dense_bwd),
    .dense_wgrad = KB(dense_wgrad),
    .relu = KB(relu),
    .sgd = KB(sgd),
    .momentum = KB(momentum),
    .keras_momentum = KB(keras_momentum),
    .adam = KB(adam),
    .rmsprop = KB(rmsprop),
    .adagrad = KB(adagrad),
    .nadam = KB(nadam),
    .lamb_u = KB(lamb_u),
    .adadelta = KB(adadelta),
};
