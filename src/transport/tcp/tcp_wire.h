/* The tcp backend's wire format (tcp.c describes it): the 48-byte frame
 * header and the 24-byte handshake, little-endian, and their checksums.
 * Everything here is a pure function of its arguments. */
#ifndef DSIM_TCP_WIRE_H
#define DSIM_TCP_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dsim/spi/auth.h"
#include "dsim/spi/transport.h"

#define TCP_HDR_LEN       48
#define TCP_HELLO_LEN     24
#define TCP_MAGIC_RAW     0x58545344u /* "DSTX" */
#define TCP_MAGIC_CTL     0x43545344u /* "DSTC" */
#define TCP_MAGIC_HELLO   0x48545344u /* "DSTH" */
#define TCP_MAGIC_ACK     0x41545344u /* "DSTA" */
#define TCP_MAGIC_CHAL    0x4e545344u /* "DSTN": a listener's challenge */
#define TCP_HELLO_AUTH    1u          /* hello status: a proof of the secret follows */
#define TCP_AUTH_HELLO    (TCP_HELLO_LEN + DSIM_AUTH_MAC + DSIM_AUTH_NONCE)
#define TCP_AUTH_ACK      (TCP_HELLO_LEN + DSIM_AUTH_MAC)
#define TCP_CTL_ABORT     1u /* body: failed rank (i32), reason */
#define TCP_CTL_WITHDRAWN 2u /* body: the 48 header bytes of a withdrawn frame */
#define TCP_CTL_MAX       4096u
#define TCP_WHY_MAX       255
#define TCP_SIDE_LEN      DSIM_TP_SIDE_LEN
/* On the wire only: the data frame's checksum covers its header and
 * sideband, not its payload (payload_checksum=0); never handed over. */
#define TCP_F_HEAD_ONLY 0x10u
/* The flags a data frame may carry on the wire. */
#define TCP_DATA_FLAGS (DSIM_TP_F_CHECKSUM | DSIM_TP_F_SIDE | DSIM_TP_F_VIRTUAL | TCP_F_HEAD_ONLY)

_Static_assert(offsetof(dsim_tp_hdr, side) == TCP_HDR_LEN,
               "dsim_tp_hdr is 48 bytes on the wire, then the sideband");

enum { TCP_K_DATA, TCP_K_RAW, TCP_K_CTL };

/* Handshake reply statuses. */
enum {
    TCP_ACCEPTED = 0,
    TCP_REFUSE_VERSION,
    TCP_REFUSE_RANK,
    TCP_REFUSE_NRANKS,
    TCP_REFUSE_SOURCE,
    TCP_REFUSE_CLOSED,
    TCP_REFUSE_DUP,
    TCP_REFUSE_LOST,
    TCP_REFUSE_AUTH,
    TCP_REFUSE_COUNT
};

/* CRC32C, as every backend computes it (dsim_tp_crc32c). */
#define tcp_crc32c dsim_tp_crc32c

static inline uint64_t tcp_load64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

/* ---- little-endian encoding ---- */

static inline void tcp_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void tcp_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void tcp_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t tcp_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t tcp_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void tcp_hdr_put(uint8_t *p, const dsim_tp_hdr *h)
{
    tcp_put32(p, h->magic);
    tcp_put16(p + 4, h->version);
    tcp_put16(p + 6, h->flags);
    tcp_put32(p + 8, (uint32_t)h->src);
    tcp_put32(p + 12, (uint32_t)h->dst);
    tcp_put32(p + 16, h->comm_id);
    tcp_put32(p + 20, h->epoch);
    tcp_put32(p + 24, h->tag);
    tcp_put32(p + 28, h->checksum);
    tcp_put64(p + 32, h->seq);
    tcp_put64(p + 40, h->len);
}

static inline void tcp_hdr_get(const uint8_t *p, dsim_tp_hdr *h)
{
    h->magic = tcp_get32(p);
    h->version = tcp_get16(p + 4);
    h->flags = tcp_get16(p + 6);
    h->src = (int32_t)tcp_get32(p + 8);
    h->dst = (int32_t)tcp_get32(p + 12);
    h->comm_id = tcp_get32(p + 16);
    h->epoch = tcp_get32(p + 20);
    h->tag = tcp_get32(p + 24);
    h->checksum = tcp_get32(p + 28);
    h->seq = tcp_load64(p + 32);
    h->len = tcp_load64(p + 40);
}

/* The checksum of a frame: its header with the checksum field zero, then
 * its body (for a wrapped frame, the inner header and the payload). */
static inline uint32_t tcp_hdr_crc(const uint8_t *hdr)
{
    uint8_t z[TCP_HDR_LEN];
    memcpy(z, hdr, sizeof z);
    memset(z + 28, 0, 4);
    return tcp_crc32c(0, z, sizeof z);
}

typedef struct tcp_hello {
    uint32_t magic;
    uint16_t version, status;
    int32_t from, to, nranks;
    int crc_ok;
} tcp_hello;

static inline void tcp_hello_put(uint8_t *p, uint32_t magic, uint16_t status, int from, int to,
                                 int nranks)
{
    tcp_put32(p, magic);
    tcp_put16(p + 4, DSIM_TP_VERSION);
    tcp_put16(p + 6, status);
    tcp_put32(p + 8, (uint32_t)from);
    tcp_put32(p + 12, (uint32_t)to);
    tcp_put32(p + 16, (uint32_t)nranks);
    tcp_put32(p + 20, tcp_crc32c(0, p, 20));
}

static inline void tcp_hello_get(const uint8_t *p, tcp_hello *h)
{
    h->magic = tcp_get32(p);
    h->version = tcp_get16(p + 4);
    h->status = tcp_get16(p + 6);
    h->from = (int32_t)tcp_get32(p + 8);
    h->to = (int32_t)tcp_get32(p + 12);
    h->nranks = (int32_t)tcp_get32(p + 16);
    h->crc_ok = tcp_get32(p + 20) == tcp_crc32c(0, p, 20);
}

#endif
