/* The backends' option strings ("key=value,key=value"): the tokenizer and
 * byte counts with k/m/g suffixes, shared by every backend. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/spi/transport.h"

int dsim_tp_opt_next(const char *backend, const char **cursor, char *key, size_t kcap, char *val,
                     size_t vcap)
{
    const char *p = *cursor;
    if (!p)
        return 0;
    while (*p == ',' || *p == ' ')
        p++;
    if (!*p) {
        *cursor = p;
        return 0;
    }
    const char *end = strchr(p, ',');
    if (!end)
        end = p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    size_t klen = eq ? (size_t)(eq - p) : 0;
    size_t vlen = eq ? (size_t)(end - eq - 1) : 0;
    if (!eq || klen == 0 || klen >= kcap || vlen >= vcap) {
        DSIM_ERR(DSIM_EINVAL, -1,
                 "%s option '%.*s' is malformed: write key=value, items separated by commas",
                 backend, (int)(end - p), p);
        return -1;
    }
    memcpy(key, p, klen);
    key[klen] = '\0';
    memcpy(val, eq + 1, vlen);
    val[vlen] = '\0';
    *cursor = end;
    return 1;
}

dsim_err dsim_tp_opt_size(const char *backend, const char *key, const char *val, size_t *out)
{
    char *end = NULL;
    /* strtoull would skip leading blanks and negate a "-": "eager_max= -5"
     * must not become 2^64 - 5. */
    if (!val || *val < '0' || *val > '9')
        goto bad;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno == ERANGE || end == val)
        goto bad;
    unsigned long long mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1ULL << 10;
    else if (*end == 'm' || *end == 'M')
        mul = 1ULL << 20;
    else if (*end == 'g' || *end == 'G')
        mul = 1ULL << 30;
    if (mul != 1)
        end++;
    if (end == val || *end || v > (unsigned long long)SIZE_MAX / mul)
        goto bad;
    *out = (size_t)(v * mul);
    return DSIM_OK;
bad:
    return DSIM_ERR(DSIM_EINVAL, -1, "%s option %s=%s: expected a byte count such as 65536 or 64k",
                    backend, key, val ? val : "");
}
