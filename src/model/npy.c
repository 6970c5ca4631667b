/* NumPy .npy headers, read strictly, and .npy files written (dsim/npy.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsim/npy.h"

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static const struct npy_type_info {
    const char *name;
    char kind; /* descr's letter */
    size_t size;
} npy_types[DSIM_NPY_TYPE_COUNT] = {
    [DSIM_NPY_F32] = {"float32", 'f', 4}, [DSIM_NPY_F64] = {"float64", 'f', 8},
    [DSIM_NPY_I8] = {"int8", 'i', 1},     [DSIM_NPY_I16] = {"int16", 'i', 2},
    [DSIM_NPY_I32] = {"int32", 'i', 4},   [DSIM_NPY_I64] = {"int64", 'i', 8},
    [DSIM_NPY_U8] = {"uint8", 'u', 1},    [DSIM_NPY_U16] = {"uint16", 'u', 2},
    [DSIM_NPY_U32] = {"uint32", 'u', 4},  [DSIM_NPY_U64] = {"uint64", 'u', 8},
};

const char *dsim_npy_type_name(dsim_npy_type t)
{
    return (unsigned)t < DSIM_NPY_TYPE_COUNT ? npy_types[t].name : "unknown";
}

int dsim_npy_type_is_float(dsim_npy_type t)
{
    return t == DSIM_NPY_F32 || t == DSIM_NPY_F64;
}

/* ---- the header's dict literal ---- */

typedef struct npy_lex {
    const char *name; /* the file, for messages */
    const char *p, *end;
    const char *start; /* the dict's first byte, for offsets in messages */
} npy_lex;

static void npy_ws(npy_lex *x)
{
    while (x->p < x->end && (*x->p == ' ' || *x->p == '\t'))
        x->p++;
}

static dsim_err npy_bad(const npy_lex *x, const char *what)
{
    size_t at = (size_t)(x->p - x->start);
    char near[24];
    size_t n = 0;
    for (const char *q = x->p; q < x->end && n + 1 < sizeof near; q++)
        near[n++] = (*q >= 0x20 && *q < 0x7f) ? *q : '?';
    near[n] = '\0';
    return DSIM_ERR(DSIM_EPROTO, -1,
                    "%s: malformed .npy header: %s at character %zu of the header (near \"%s\"); "
                    "write the file with numpy.save",
                    x->name, what, at, near);
}

/* A quoted string into buf (at most cap-1 characters; longer is refused). */
static dsim_err npy_string(npy_lex *x, char *buf, size_t cap, const char *what)
{
    npy_ws(x);
    if (x->p >= x->end || (*x->p != '\'' && *x->p != '"'))
        return npy_bad(x, what);
    char q = *x->p++;
    size_t n = 0;
    while (x->p < x->end && *x->p != q) {
        if (*x->p == '\\' || n + 1 >= cap)
            return npy_bad(x, what);
        buf[n++] = *x->p++;
    }
    if (x->p >= x->end)
        return npy_bad(x, "an unterminated string");
    x->p++;
    buf[n] = '\0';
    return DSIM_OK;
}

static int npy_take(npy_lex *x, char c)
{
    npy_ws(x);
    if (x->p < x->end && *x->p == c) {
        x->p++;
        return 1;
    }
    return 0;
}

static dsim_err npy_descr(npy_lex *x, dsim_npy_header *h)
{
    npy_ws(x);
    if (x->p < x->end && (*x->p == '[' || *x->p == '('))
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: the .npy file holds a structured array (descr is a list of fields); "
                        "save a plain numeric array (e.g. np.save(path, arr.astype(np.float32)))",
                        x->name);
    char d[16];
    DSIM_CHECK(npy_string(x, d, sizeof d, "descr is not a quoted type such as '<f4'"));
    size_t len = strlen(d);
    const char *why = NULL;
    if (len < 3)
        why = "too short";
    else if (d[0] != '<' && d[0] != '>' && d[0] != '|')
        why = "its byte order is not '<', '>' or '|'";
    for (int t = 0; !why && t < DSIM_NPY_TYPE_COUNT; t++) {
        char want[8];
        snprintf(want, sizeof want, "%c%zu", npy_types[t].kind, npy_types[t].size);
        if (strcmp(d + 1, want) != 0)
            continue;
        if (npy_types[t].size == 1 ? d[0] == '>' : d[0] == '|')
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s: .npy descr '%s': byte order '%c' does not fit a %zu-byte type "
                            "(numpy writes '%s%s')",
                            x->name, d, d[0], npy_types[t].size, npy_types[t].size == 1 ? "|" : "<",
                            d + 1);
        h->type = (dsim_npy_type)t;
        h->itemsize = npy_types[t].size;
        h->big_endian = d[0] == '>';
        return DSIM_OK;
    }
    const char *k = "";
    switch (d[1]) {
    case 'f':
        k = d[2] == '2' ? " (half floats are not read: save float32)" : "";
        break;
    case 'b':
    case '?':
        k = " (bool: save the labels as an integer type)";
        break;
    case 'c':
        k = " (complex)";
        break;
    case 'U':
    case 'S':
    case 'a':
        k = " (strings: convert to numbers first)";
        break;
    case 'O':
        k = " (Python objects)";
        break;
    case 'M':
    case 'm':
        k = " (dates and times)";
        break;
    case 'V':
        k = " (raw bytes)";
        break;
    default:
        break;
    }
    return DSIM_ERR(DSIM_EPROTO, -1,
                    "%s: unknown .npy descr '%s'%s%s%s; accepted: float32 ('<f4'), float64 "
                    "('<f8'), int8-int64 ('|i1' '<i2' '<i4' '<i8'), uint8-uint64, little- or "
                    "big-endian ('>')",
                    x->name, d, k, why ? ": " : "", why ? why : "");
}

static dsim_err npy_fortran(npy_lex *x, dsim_npy_header *h)
{
    npy_ws(x);
    if ((size_t)(x->end - x->p) >= 4 && memcmp(x->p, "True", 4) == 0) {
        x->p += 4;
        h->fortran_order = 1;
        return DSIM_OK;
    }
    if ((size_t)(x->end - x->p) >= 5 && memcmp(x->p, "False", 5) == 0) {
        x->p += 5;
        h->fortran_order = 0;
        return DSIM_OK;
    }
    return npy_bad(x, "fortran_order is not True or False");
}

static dsim_err npy_shape(npy_lex *x, dsim_npy_header *h)
{
    if (!npy_take(x, '('))
        return npy_bad(x, "shape is not a tuple such as (100, 8)");
    h->ndim = 0;
    int comma = 0; /* the last number was followed by ',' */
    for (;;) {
        npy_ws(x);
        if (npy_take(x, ')'))
            break;
        if (x->p >= x->end || *x->p < '0' || *x->p > '9')
            return npy_bad(x, "shape holds something that is not a whole number >= 0");
        uint64_t v = 0;
        while (x->p < x->end && *x->p >= '0' && *x->p <= '9') {
            unsigned dgt = (unsigned)(*x->p - '0');
            if (v > (UINT64_MAX - dgt) / 10)
                return npy_bad(x, "a dimension of shape is too large");
            v = v * 10 + dgt;
            x->p++;
        }
        if (h->ndim == DSIM_NPY_MAX_DIMS)
            return DSIM_ERR(DSIM_EPROTO, -1, "%s: the .npy array has more than %d dimensions",
                            x->name, DSIM_NPY_MAX_DIMS);
        h->shape[h->ndim++] = v;
        comma = npy_take(x, ',');
        if (comma)
            continue;
        if (npy_take(x, ')'))
            break;
        return npy_bad(x, "shape's numbers are not separated by ','");
    }
    /* Python writes a one-tuple with its comma: "(5,)"; "(5)" is a number. */
    if (h->ndim == 1 && !comma)
        return npy_bad(x, "shape (N) is not a tuple: write (N,)");
    return DSIM_OK;
}

/* The dict: exactly descr, fortran_order and shape. */
static dsim_err npy_dict(npy_lex *x, dsim_npy_header *h)
{
    static const char *const keys[3] = {"descr", "fortran_order", "shape"};
    int seen[3] = {0, 0, 0};
    if (!npy_take(x, '{'))
        return npy_bad(x, "the header is not a dict: it must begin with '{'");
    for (;;) {
        if (npy_take(x, '}'))
            break;
        char key[32];
        DSIM_CHECK(npy_string(x, key, sizeof key, "a key is not a quoted name"));
        int k = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(key, keys[i]) == 0)
                k = i;
        if (k < 0)
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s: malformed .npy header: unknown key '%s' (a .npy header has "
                            "exactly 'descr', 'fortran_order' and 'shape')",
                            x->name, key);
        if (seen[k]++)
            return DSIM_ERR(DSIM_EPROTO, -1, "%s: malformed .npy header: key '%s' appears twice",
                            x->name, key);
        if (!npy_take(x, ':'))
            return npy_bad(x, "a key is not followed by ':'");
        dsim_err e = k == 0 ? npy_descr(x, h) : k == 1 ? npy_fortran(x, h) : npy_shape(x, h);
        if (e != DSIM_OK)
            return e;
        if (npy_take(x, ','))
            continue;
        if (npy_take(x, '}'))
            break;
        return npy_bad(x, "the dict's entries are not separated by ','");
    }
    for (int i = 0; i < 3; i++)
        if (!seen[i])
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s: malformed .npy header: key '%s' is missing (a .npy header has "
                            "exactly 'descr', 'fortran_order' and 'shape')",
                            x->name, keys[i]);
    npy_ws(x);
    if (x->p != x->end)
        return npy_bad(x, "text after the dict's '}'");
    return DSIM_OK;
}

static uint64_t npy_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The preamble: magic, version, header length; *hlen and *off set. */
static dsim_err npy_preamble(const char *name, const unsigned char *b, size_t len,
                             uint64_t file_size, dsim_npy_header *h, uint64_t *hlen)
{
    size_t have = len < file_size ? len : (size_t)file_size;
    if (have < sizeof npy_magic || memcmp(b, npy_magic, sizeof npy_magic) != 0) {
        if (have < sizeof npy_magic && memcmp(b, npy_magic, have) == 0)
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s: truncated .npy file: %llu bytes, not even the 6-byte magic", name,
                            (unsigned long long)file_size);
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: not a .npy file (bad magic: it does not begin with \"\\x93NUMPY\"); "
                        "save arrays with numpy.save, or give a CSV file as csv:",
                        name);
    }
    if (have < 8)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: truncated .npy header: %llu bytes", name,
                        (unsigned long long)file_size);
    h->major = b[6];
    h->minor = b[7];
    if (h->major < 1 || h->major > 3 || h->minor != 0)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: .npy format version %u.%u is not one this reader knows (1.0, 2.0, "
                        "3.0)",
                        name, h->major, h->minor);
    int lw = h->major == 1 ? 2 : 4;
    if (have < (size_t)(8 + lw))
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: truncated .npy header: %llu bytes, the header length alone needs %d",
                        name, (unsigned long long)file_size, 8 + lw);
    *hlen = npy_le(b + 8, lw);
    h->data_offset = 8 + (uint64_t)lw + *hlen;
    if (*hlen > DSIM_NPY_MAX_HEADER)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: .npy header of %llu bytes is longer than the %u this reader takes",
                        name, (unsigned long long)*hlen, DSIM_NPY_MAX_HEADER);
    if (h->data_offset > file_size || h->data_offset > len)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: truncated .npy header: it announces %llu bytes of header but the "
                        "file has %llu bytes",
                        name, (unsigned long long)h->data_offset, (unsigned long long)file_size);
    return DSIM_OK;
}

dsim_err dsim_npy_parse_header(const char *name, const void *buf, size_t len, uint64_t file_size,
                               dsim_npy_header *out)
{
    if (!name)
        name = "(.npy)";
    if (!buf || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_npy_parse_header: NULL argument");
    memset(out, 0, sizeof *out);
    const unsigned char *b = buf;
    uint64_t hlen = 0;
    DSIM_CHECK(npy_preamble(name, b, len, file_size, out, &hlen));
    const char *hs = (const char *)b + (out->data_offset - hlen);
    if (hlen == 0 || hs[hlen - 1] != '\n')
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: malformed .npy header: it does not end with a newline (the file is "
                        "truncated or was not written by numpy)",
                        name);
    for (uint64_t i = 0; i + 1 < hlen; i++) {
        unsigned char c = (unsigned char)hs[i];
        if (c < 0x20 || c > 0x7e)
            return DSIM_ERR(DSIM_EPROTO, -1,
                            "%s: malformed .npy header: byte 0x%02x at character %llu is not "
                            "printable ASCII",
                            name, c, (unsigned long long)i);
    }
    npy_lex x = {.name = name, .p = hs, .end = hs + hlen - 1, .start = hs};
    /* numpy pads with spaces before the '\n' */
    while (x.end > x.p && x.end[-1] == ' ')
        x.end--;
    DSIM_CHECK(npy_dict(&x, out));
    uint64_t count = 1;
    for (size_t d = 0; d < out->ndim; d++) {
        if (out->shape[d] && count > UINT64_MAX / out->shape[d])
            return DSIM_ERR(DSIM_EPROTO, -1, "%s: the .npy shape's element count overflows", name);
        count *= out->shape[d];
    }
    if (count > (UINT64_MAX - out->data_offset) / out->itemsize)
        return DSIM_ERR(DSIM_EPROTO, -1, "%s: the .npy shape's byte count overflows", name);
    out->count = count;
    out->data_bytes = count * out->itemsize;
    uint64_t want = out->data_offset + out->data_bytes;
    char shape[160];
    size_t n = (size_t)snprintf(shape, sizeof shape, "(");
    for (size_t d = 0; d < out->ndim && n < sizeof shape; d++)
        n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%llu", d ? ", " : "",
                              (unsigned long long)out->shape[d]);
    if (n < sizeof shape)
        snprintf(shape + n, sizeof shape - n, "%s)", out->ndim == 1 ? "," : "");
    if (file_size < want)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: truncated .npy file: shape %s of %s needs %llu bytes of data after "
                        "the %llu-byte header, but the file has %llu",
                        name, shape, dsim_npy_type_name(out->type),
                        (unsigned long long)out->data_bytes, (unsigned long long)out->data_offset,
                        (unsigned long long)(file_size - out->data_offset));
    if (file_size > want)
        return DSIM_ERR(DSIM_EPROTO, -1,
                        "%s: the .npy file has %llu bytes after its data that shape %s of %s does "
                        "not describe (the shape does not match the file size)",
                        name, (unsigned long long)(file_size - want), shape,
                        dsim_npy_type_name(out->type));
    return DSIM_OK;
}

double dsim_npy_get(const dsim_npy_header *h, const void *data, uint64_t i)
{
    const unsigned char *p = (const unsigned char *)data + i * h->itemsize;
    uint64_t v = 0;
    for (size_t k = 0; k < h->itemsize; k++) {
        size_t at = h->big_endian ? h->itemsize - 1 - k : k;
        v |= (uint64_t)p[at] << (8 * k);
    }
    switch (h->type) {
    case DSIM_NPY_F32: {
        uint32_t u = (uint32_t)v;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    case DSIM_NPY_F64: {
        double d;
        memcpy(&d, &v, sizeof d);
        return d;
    }
    case DSIM_NPY_I8:
        return (int8_t)(uint8_t)v;
    case DSIM_NPY_I16:
        return (int16_t)(uint16_t)v;
    case DSIM_NPY_I32:
        return (int32_t)(uint32_t)v;
    case DSIM_NPY_I64:
        return (double)(int64_t)v;
    case DSIM_NPY_U8:
    case DSIM_NPY_U16:
    case DSIM_NPY_U32:
    case DSIM_NPY_U64:
        return (double)v;
    case DSIM_NPY_TYPE_COUNT:
        break;
    }
    return 0.0;
}

/* ---- writing ---- */

static int npy_host_le(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static int npy_write_data(FILE *fp, const unsigned char *p, uint64_t count, size_t size)
{
    if (count == 0)
        return 1;
    if (npy_host_le())
        return fwrite(p, size, (size_t)count, fp) == (size_t)count;
    unsigned char tmp[8];
    for (uint64_t i = 0; i < count; i++) {
        for (size_t k = 0; k < size; k++)
            tmp[k] = p[i * size + size - 1 - k];
        if (fwrite(tmp, 1, size, fp) != size)
            return 0;
    }
    return 1;
}

dsim_err dsim_npy_write(const char *path, dsim_npy_type type, const uint64_t *shape, size_t ndim,
                        const void *data)
{
    if (!path || (unsigned)type >= DSIM_NPY_TYPE_COUNT || ndim > DSIM_NPY_MAX_DIMS ||
        (ndim && !shape))
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_npy_write: bad arguments");
    uint64_t count = 1;
    char dict[512];
    const struct npy_type_info *ti = &npy_types[type];
    int n = snprintf(dict, sizeof dict, "{'descr': '%c%c%zu', 'fortran_order': False, 'shape': (",
                     ti->size == 1 ? '|' : '<', ti->kind, ti->size);
    for (size_t d = 0; d < ndim; d++) {
        count *= shape[d];
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%s%llu", d ? ", " : "",
                      (unsigned long long)shape[d]);
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }", ndim == 1 ? "," : "");
    if (count && !data)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_npy_write: %s: no data", path);
    /* magic (6) + version (2) + length (2) + dict + spaces + '\n': a
     * multiple of 64, so the data is aligned for a reader that maps it */
    size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;
    size_t hlen = total - 10;
    unsigned char pre[10];
    memcpy(pre, npy_magic, 6);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(hlen & 0xff);
    pre[9] = (unsigned char)(hlen >> 8);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return DSIM_ERR(DSIM_EINVAL, -1, "%s: the path is too long", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp)
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot create: %s", tmp, strerror(errno));
    int ok =
        fwrite(pre, 1, sizeof pre, fp) == sizeof pre && fwrite(dict, 1, (size_t)n, fp) == (size_t)n;
    for (size_t k = (size_t)n; ok && k + 1 < hlen; k++)
        ok = fputc(' ', fp) != EOF;
    ok = ok && fputc('\n', fp) != EOF;
    ok = ok && npy_write_data(fp, data, count, ti->size);
    int er = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        er = errno;
    }
    if (!ok) {
        unlink(tmp);
        return DSIM_ERR(DSIM_EIO, -1, "%s: write failed: %s", tmp, strerror(er));
    }
    if (rename(tmp, path) != 0) {
        er = errno;
        unlink(tmp);
        return DSIM_ERR(DSIM_EIO, -1, "%s: cannot rename into place: %s", path, strerror(er));
    }
    return DSIM_OK;
}
