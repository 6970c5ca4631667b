/* SHA-256, HMAC-SHA256 and the cluster secret (dsim/spi/auth.h). A small
 * portable SHA-256 so that libdsim needs no crypto library: the handshake
 * hashes a few hundred bytes per connection. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "dsim/spi/auth.h"

typedef struct sha_ctx {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t used;
} sha_ctx;

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t sha_ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static void sha_block(sha_ctx *c, const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = sha_ror(w[i - 15], 7) ^ sha_ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = sha_ror(w[i - 2], 17) ^ sha_ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5],
             g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (sha_ror(e, 6) ^ sha_ror(e, 11) ^ sha_ror(e, 25)) + ((e & f) ^ (~e & g)) +
                      sha_k[i] + w[i];
        uint32_t t2 =
            (sha_ror(a, 2) ^ sha_ror(a, 13) ^ sha_ror(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = cc;
        cc = b;
        b = a;
        a = t1 + t2;
    }
    c->h[0] += a;
    c->h[1] += b;
    c->h[2] += cc;
    c->h[3] += d;
    c->h[4] += e;
    c->h[5] += f;
    c->h[6] += g;
    c->h[7] += h;
}

static void sha_init(sha_ctx *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->bytes = 0;
    c->used = 0;
}

static void sha_update(sha_ctx *c, const void *data, size_t len)
{
    const uint8_t *p = data;
    c->bytes += len;
    while (len) {
        size_t take = 64 - c->used < len ? 64 - c->used : len;
        memcpy(c->buf + c->used, p, take);
        c->used += take;
        p += take;
        len -= take;
        if (c->used == 64) {
            sha_block(c, c->buf);
            c->used = 0;
        }
    }
}

static void sha_final(sha_ctx *c, uint8_t out[32])
{
    uint64_t bits = c->bytes * 8;
    uint8_t pad = 0x80;
    sha_update(c, &pad, 1);
    pad = 0;
    while (c->used != 56)
        sha_update(c, &pad, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(c, len, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

void dsim_sha256(const void *data, size_t len, uint8_t out[32])
{
    sha_ctx c;
    sha_init(&c);
    sha_update(&c, data, len);
    sha_final(&c, out);
}

void dsim_hmac_sha256(const uint8_t *key, size_t klen, const void *const *parts, const size_t *lens,
                      int n, uint8_t out[DSIM_AUTH_MAC])
{
    uint8_t k[64] = {0}, pad[64], inner[32];
    if (klen > 64)
        dsim_sha256(key, klen, k);
    else if (klen)
        memcpy(k, key, klen);
    sha_ctx c;
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    sha_init(&c);
    sha_update(&c, pad, 64);
    for (int i = 0; i < n; i++)
        sha_update(&c, parts[i], lens[i]);
    sha_final(&c, inner);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, inner, sizeof inner);
    sha_final(&c, out);
}

void dsim_auth_mac(const dsim_secret *s, const char *label, const uint8_t nonce[DSIM_AUTH_NONCE],
                   const void *msg, size_t len, uint8_t out[DSIM_AUTH_MAC])
{
    const void *parts[3] = {label, nonce, msg};
    size_t lens[3] = {strlen(label) + 1, DSIM_AUTH_NONCE, len};
    dsim_hmac_sha256(s->key, s->len, parts, lens, 3, out);
}

int dsim_auth_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

dsim_err dsim_auth_nonce(uint8_t out[DSIM_AUTH_NONCE])
{
    size_t got = 0;
    while (got < DSIM_AUTH_NONCE) {
        ssize_t n = getrandom(out + got, DSIM_AUTH_NONCE - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return DSIM_ERR(DSIM_EIO, -1, "cannot draw a handshake nonce: getrandom: %s",
                            strerror(errno));
        got += (size_t)n;
    }
    return DSIM_OK;
}

dsim_err dsim_secret_load(const char *path, dsim_secret *s)
{
    s->len = 0;
    if (!path) {
        const char *v = getenv(DSIM_SECRET_ENV);
        if (!v || !*v)
            return DSIM_OK;
        size_t n = strlen(v);
        if (n > DSIM_AUTH_MAX_KEY)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "%s is %zu bytes long; a cluster secret is at most %d bytes",
                            DSIM_SECRET_ENV, n, DSIM_AUTH_MAX_KEY);
        memcpy(s->key, v, n);
        s->len = n;
        return DSIM_OK;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cluster secret file %s: cannot open it: %s (give a readable file, or "
                        "set %s)",
                        path, strerror(errno), DSIM_SECRET_ENV);
    size_t n = fread(s->key, 1, sizeof s->key, f);
    int more = fgetc(f) != EOF;
    fclose(f);
    while (n && (s->key[n - 1] == '\n' || s->key[n - 1] == '\r'))
        n--;
    if (more)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cluster secret file %s is longer than %d bytes; use a shorter secret "
                        "(32 random bytes are plenty)",
                        path, DSIM_AUTH_MAX_KEY);
    if (!n)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cluster secret file %s is empty; write the secret into it (e.g. head -c "
                        "32 /dev/urandom | base64 > %s)",
                        path, path);
    s->len = n;
    return DSIM_OK;
}
