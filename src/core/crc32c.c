/* CRC32C (Castagnoli, reflected 0x82F63B78, as iSCSI and ext4 use): the
 * checksum of every transport frame (dsim_tp_crc32c, dsim_tp_checksum in
 * dsim/spi/transport.h). Slicing-by-8 in software, SSE4.2's crc32
 * instruction where the CPU has it, three streams at once for long
 * buffers. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dsim/spi/transport.h"

static uint64_t crc_load64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static uint32_t crc_tab[8][256];
static int crc_hw;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC_LONG  8192
#define CRC_SHORT 256
static void crc_zeros(uint32_t zeros[4][256], size_t len);
static uint32_t crc_long[4][256], crc_short[4][256];
#endif
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_tab[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
    if (crc_hw) {
        crc_zeros(crc_long, CRC_LONG);
        crc_zeros(crc_short, CRC_SHORT);
    }
#endif
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = crc_tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        n--;
    }
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w = crc_load64(p) ^ c;
        c = crc_tab[7][w & 0xff] ^ crc_tab[6][(w >> 8) & 0xff] ^ crc_tab[5][(w >> 16) & 0xff] ^
            crc_tab[4][(w >> 24) & 0xff] ^ crc_tab[3][(w >> 32) & 0xff] ^
            crc_tab[2][(w >> 40) & 0xff] ^ crc_tab[1][(w >> 48) & 0xff] ^ crc_tab[0][w >> 56];
    }
    while (n--)
        c = crc_tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The crc32 instruction has a latency of three cycles and a throughput of
 * one, so three independent streams run at once and are joined with
 * "append n zero bytes" operators (Mark Adler's crc32c.c). */
static uint32_t crc_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1)
            sum ^= *mat;
    return sum;
}

static void crc_gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = crc_gf2_times(mat, mat[n]);
}

/* The operator that appends len zero bytes (len a power of two). */
static void crc_zeros(uint32_t zeros[4][256], size_t len)
{
    uint32_t even[32], odd[32];
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (uint32_t n = 1, row = 1; n < 32; n++, row <<= 1)
        odd[n] = row;
    crc_gf2_square(even, odd); /* two bits */
    crc_gf2_square(odd, even); /* four bits */
    uint32_t *op = odd;
    do {
        crc_gf2_square(even, odd); /* then one byte, two, four... */
        op = even;
        len >>= 1;
        if (!len)
            break;
        crc_gf2_square(odd, even);
        op = odd;
        len >>= 1;
    } while (len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = crc_gf2_times(op, n);
        zeros[1][n] = crc_gf2_times(op, n << 8);
        zeros[2][n] = crc_gf2_times(op, n << 16);
        zeros[3][n] = crc_gf2_times(op, n << 24);
    }
}

static uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi(c, *p++);
        n--;
    }
    uint64_t c0 = c;
    static const size_t spans[2] = {CRC_LONG, CRC_SHORT};
    for (int k = 0; k < 2; k++) {
        size_t span = spans[k];
        while (n >= 3 * span) {
            uint64_t c1 = 0, c2 = 0;
            for (const uint8_t *end = p + span; p < end; p += 8) {
                c0 = __builtin_ia32_crc32di(c0, crc_load64(p));
                c1 = __builtin_ia32_crc32di(c1, crc_load64(p + span));
                c2 = __builtin_ia32_crc32di(c2, crc_load64(p + 2 * span));
            }
            uint32_t(*zeros)[256] = k ? crc_short : crc_long;
            c0 = crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;
            c0 = crc_shift(zeros, (uint32_t)c0) ^ (uint32_t)c2;
            p += 2 * span;
            n -= 3 * span;
        }
    }
    for (; n >= 8; p += 8, n -= 8)
        c0 = __builtin_ia32_crc32di(c0, crc_load64(p));
    c = (uint32_t)c0;
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t dsim_tp_crc32c(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&crc_once, crc_init);
    uint32_t c = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (crc_hw)
        return ~crc_sse42(c, buf, n);
#endif
    return ~crc_sw(c, buf, n);
}

uint32_t dsim_tp_checksum(const void *p, size_t n)
{
    return dsim_tp_crc32c(0, p, n);
}
