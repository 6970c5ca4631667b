/* The cluster secret: proving that a peer belongs to the job.
 *
 * A job may share a secret among its processes (a file, or the environment
 * variable DSIM_CLUSTER_SECRET); every connection between them then starts
 * with a challenge and response: the side that accepts sends a random
 * nonce, the side that connects answers with HMAC-SHA256(secret, label ||
 * nonce || what it says), and the accepting side answers the connector's own
 * nonce the same way, so each side knows the other holds the secret without
 * the secret crossing the wire. A stray peer or a port scanner is refused
 * before it can send a frame. The tcp transport and dsim worker's results
 * channel both use these helpers.
 *
 * This is authentication, not encryption: frames still travel in clear. */
#ifndef DSIM_SPI_AUTH_H
#define DSIM_SPI_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSIM_AUTH_NONCE   16
#define DSIM_AUTH_MAC     32
#define DSIM_AUTH_MAX_KEY 4096
#define DSIM_SECRET_ENV   "DSIM_CLUSTER_SECRET"

typedef struct dsim_secret {
    size_t len; /* 0: no secret (connections are not authenticated) */
    uint8_t key[DSIM_AUTH_MAX_KEY];
} dsim_secret;

/* SHA-256 of a buffer (FIPS 180-4). */
DSIM_API void dsim_sha256(const void *data, size_t len, uint8_t out[32]);

/* HMAC-SHA256 (RFC 2104) of the concatenation of n parts. */
DSIM_API void dsim_hmac_sha256(const uint8_t *key, size_t klen, const void *const *parts,
                               const size_t *lens, int n, uint8_t out[DSIM_AUTH_MAC]);

/* The MAC of a handshake message: HMAC(secret, label || nonce || msg). */
DSIM_API void dsim_auth_mac(const dsim_secret *s, const char *label,
                            const uint8_t nonce[DSIM_AUTH_NONCE], const void *msg, size_t len,
                            uint8_t out[DSIM_AUTH_MAC]);

/* 1 when a and b are equal, in time that does not depend on where they
 * differ. */
DSIM_API int dsim_auth_equal(const uint8_t *a, const uint8_t *b, size_t n);

/* Fills a nonce from the kernel's random source (getrandom). */
DSIM_API dsim_err dsim_auth_nonce(uint8_t out[DSIM_AUTH_NONCE]);

/* Loads the secret: from the file at path (its bytes, a trailing newline
 * dropped) when path is not NULL, else from $DSIM_CLUSTER_SECRET when set and
 * not empty, else none (s->len 0). An empty or unreadable file, or one over
 * DSIM_AUTH_MAX_KEY bytes, is DSIM_EINVAL naming the path. */
DSIM_API dsim_err dsim_secret_load(const char *path, dsim_secret *s);

#ifdef __cplusplus
}
#endif
#endif
