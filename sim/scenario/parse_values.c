/* The scenario parser's typed readers (parse_int.h): messages that point at
 * FILE:LINE:COLUMN with the key's path and what is accepted, a mapping read
 * against its accepted keys (with "did you mean"), and whole numbers,
 * numbers, booleans, text, names and durations. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "scenario/parse_int.h"
#include "scenario/units.h"

/* ---- messages ---- */

dsim_err scen_fail(const scen_ctx *c, const scen_node *at, const char *fmt, ...)
{
    char msg[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = at ? at->line : 1, col = at ? at->column : 1;
    return DSIM_ERR(DSIM_EINVAL, -1, "%s:%d:%d: %s", c->path, line, col, msg);
}

const char *scen_show(const scen_node *n, char *buf, size_t cap)
{
    if (!n)
        return "nothing";
    if (n->kind == DSIM_YAML_MAP)
        return "a mapping";
    if (n->kind == DSIM_YAML_SEQ)
        return "a list";
    if (dsim_yaml_is_null(n))
        return "an empty value";
    size_t o = 0;
    buf[o++] = '\'';
    for (size_t i = 0; i < n->len; i++) {
        unsigned char ch = (unsigned char)n->s[i];
        /* Stop only where a character starts, so that a shortened value is
         * still UTF-8; 12 bytes keep room for one more character (or its
         * escape), the "...", the quote and the NUL. */
        if ((ch & 0xc0) != 0x80 && (i >= 48 || o + 12 >= cap)) {
            o += (size_t)snprintf(buf + o, cap - o, "...");
            break;
        }
        if (ch < 0x20 || ch == 0x7f)
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else
            buf[o++] = (char)ch;
    }
    buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

static void scen_names_list(const scen_name *t, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < cap; i++) {
        int w = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", t[i].name);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

static void scen_keys_list(const char *const *k, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < cap; i++) {
        int w = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", k[i]);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

size_t scen_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    size_t row[41];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cur = row[j];
            size_t sub = prev + (a[i - 1] != b[j - 1]);
            size_t del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[lb];
}

static const char *scen_suggest(const char *word, const char *const *k, size_t n)
{
    const char *best = NULL;
    size_t bd = 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = scen_distance(word, k[i]);
        if (d < bd) {
            bd = d;
            best = k[i];
        }
    }
    return best;
}

static void scen_keypath(char *buf, size_t cap, const char *path, const char *key)
{
    if (path[0])
        snprintf(buf, cap, "%s.%s", path, key);
    else
        snprintf(buf, cap, "%s", key);
}

/* ---- reading a mapping against its keys ---- */

dsim_err scen_map_read(const scen_ctx *c, const scen_node *node, const scen_node *at,
                       const char *path, const char *const *names, size_t n, scen_map *m)
{
    memset(m, 0, sizeof *m);
    m->node = node;
    m->at = at ? at : node;
    snprintf(m->path, sizeof m->path, "%s", path);
    m->names = names;
    m->n = n;
    char keys[400], show[96];
    if (!node || dsim_yaml_is_null(node)) {
        m->node = NULL;
        return DSIM_OK;
    }
    if (node->kind != DSIM_YAML_MAP) {
        scen_keys_list(names, n, keys, sizeof keys);
        return scen_fail(c, node,
                         "%s: %s is not a mapping; write it as keys under '%s:' "
                         "(accepted keys: %s)",
                         path[0] ? path : "the file", scen_show(node, show, sizeof show),
                         path[0] ? path : "the top level", keys);
    }
    for (size_t p = 0; p + 1 < node->n; p += 2) {
        const scen_node *k = node->kid[p];
        size_t i = 0;
        while (i < n && !(strlen(names[i]) == k->len && strcmp(names[i], k->s) == 0))
            i++;
        if (i == n) {
            scen_keys_list(names, n, keys, sizeof keys);
            const char *near = scen_suggest(k->s, names, n);
            char hint[64] = "";
            if (near)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
            return scen_fail(c, k, "%s: unknown key %s%s; accepted: %s",
                             path[0] ? path : "top level", scen_show(k, show, sizeof show), hint,
                             keys);
        }
        if (m->key[i]) {
            char kp[96];
            scen_keypath(kp, sizeof kp, path, names[i]);
            return scen_fail(c, k,
                             "%s: the key appears twice (first at line %d, column %d); keep one",
                             kp, m->key[i]->line, m->key[i]->column);
        }
        m->key[i] = k;
        m->val[i] = node->kid[p + 1];
    }
    return DSIM_OK;
}

void scen_kp(char *buf, size_t cap, const scen_map *m, int i)
{
    scen_keypath(buf, cap, m->path, m->names[i]);
}

const scen_node *scen_where(const scen_map *m, int i)
{
    if (i >= 0 && m->val[i])
        return m->val[i];
    return m->at;
}

/* ---- typed values ---- */

bool scen_is_scalar(const scen_node *v)
{
    return v && v->kind == DSIM_YAML_SCALAR && !dsim_yaml_is_null(v);
}

/* A plain decimal integer (optional sign). */
bool scen_parse_i64(const scen_node *v, int64_t *out)
{
    if (!scen_is_scalar(v) || !v->plain || strlen(v->s) != v->len)
        return false;
    const char *p = v->s;
    if (*p == '+' || *p == '-')
        p++;
    if (!*p)
        return false;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return false;
    errno = 0;
    char *end;
    long long x = strtoll(v->s, &end, 10);
    if (errno == ERANGE || *end)
        return false;
    *out = x;
    return true;
}

dsim_err scen_int_v(const scen_ctx *c, const scen_node *v, const char *kp, int64_t lo, int64_t hi,
                    int64_t *out)
{
    char show[96];
    int64_t x;
    if (!scen_parse_i64(v, &x)) {
        /* "1e3" and "2.0" are numbers, but not whole numbers as written */
        const char *why = v && v->kind == DSIM_YAML_SCALAR && !v->plain && !dsim_yaml_is_null(v)
                              ? " (it is quoted, so it is text)"
                              : "";
        return scen_fail(c, v, "%s: %s is not a whole number%s; accepted: %" PRId64 "..%" PRId64,
                         kp, scen_show(v, show, sizeof show), why, lo, hi);
    }
    if (x < lo || x > hi)
        return scen_fail(c, v, "%s: %s is out of range; accepted: %" PRId64 "..%" PRId64, kp,
                         scen_show(v, show, sizeof show), lo, hi);
    *out = x;
    return DSIM_OK;
}

dsim_err scen_int(const scen_ctx *c, const scen_map *m, int i, int64_t lo, int64_t hi, int64_t *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96];
    scen_kp(kp, sizeof kp, m, i);
    return scen_int_v(c, m->val[i], kp, lo, hi, out);
}

bool scen_parse_real(const scen_node *v, double *out)
{
    if (!scen_is_scalar(v) || !v->plain || strlen(v->s) != v->len)
        return false;
    for (const char *q = v->s; *q; q++)
        if (!strchr("0123456789.eE+-", *q))
            return false;
    errno = 0;
    char *end;
    double x = strtod(v->s, &end);
    if (*end || end == v->s || !isfinite(x))
        return false;
    *out = x;
    return true;
}

/* A number in lo..hi; lo_open/hi_open exclude the bound. */
static dsim_err scen_real_v(const scen_ctx *c, const scen_node *v, const char *kp, double lo,
                            double hi, bool lo_open, bool hi_open, double *out)
{
    char show[96], range[96];
    snprintf(range, sizeof range, "a number in %c%g, %g%c", lo_open ? '(' : '[', lo, hi,
             hi_open ? ')' : ']');
    double x;
    if (!scen_parse_real(v, &x))
        return scen_fail(c, v, "%s: %s is not a number; accepted: %s", kp,
                         scen_show(v, show, sizeof show), range);
    if (x < lo || x > hi || (lo_open && x == lo) || (hi_open && x == hi))
        return scen_fail(c, v, "%s: %s is out of range; accepted: %s", kp,
                         scen_show(v, show, sizeof show), range);
    *out = x;
    return DSIM_OK;
}

dsim_err scen_real(const scen_ctx *c, const scen_map *m, int i, double lo, double hi, bool lo_open,
                   bool hi_open, double *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96];
    scen_kp(kp, sizeof kp, m, i);
    return scen_real_v(c, m->val[i], kp, lo, hi, lo_open, hi_open, out);
}

bool scen_parse_bool(const scen_node *v, bool *out)
{
    if (!scen_is_scalar(v) || !v->plain)
        return false;
    if (!strcmp(v->s, "true") || !strcmp(v->s, "True") || !strcmp(v->s, "TRUE")) {
        *out = true;
        return true;
    }
    if (!strcmp(v->s, "false") || !strcmp(v->s, "False") || !strcmp(v->s, "FALSE")) {
        *out = false;
        return true;
    }
    return false;
}

dsim_err scen_bool(const scen_ctx *c, const scen_map *m, int i, bool *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96], show[96];
    scen_kp(kp, sizeof kp, m, i);
    if (!scen_parse_bool(m->val[i], out))
        return scen_fail(c, m->val[i], "%s: %s is not a boolean; accepted: true, false", kp,
                         scen_show(m->val[i], show, sizeof show));
    return DSIM_OK;
}

/* Any non-empty scalar as text (no NUL bytes, at most SCEN_MAX_STR). */
dsim_err scen_str_v(const scen_ctx *c, const scen_node *v, const char *kp, const char *what,
                    char **out)
{
    char show[96];
    if (!scen_is_scalar(v) || v->len == 0)
        return scen_fail(c, v, "%s: %s is not %s", kp, scen_show(v, show, sizeof show), what);
    if (strlen(v->s) != v->len)
        return scen_fail(c, v, "%s: the text holds a NUL byte; accepted: %s", kp, what);
    if (v->len > SCEN_MAX_STR)
        return scen_fail(c, v, "%s: the text is %zu bytes long; accepted: %s of at most %d bytes",
                         kp, v->len, what, SCEN_MAX_STR);
    char *d = strdup(v->s);
    if (!d)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    free(*out);
    *out = d;
    return DSIM_OK;
}

dsim_err scen_enum_v(const scen_ctx *c, const scen_node *v, const char *kp, const char *noun,
                     const scen_name *t, size_t n, int *out)
{
    char show[96], names[256];
    if (scen_is_scalar(v) && strlen(v->s) == v->len) {
        for (size_t i = 0; i < n; i++) {
            if (strcasecmp(v->s, t[i].name) == 0) {
                *out = t[i].value;
                return DSIM_OK;
            }
        }
    }
    scen_names_list(t, n, names, sizeof names);
    return scen_fail(c, v, "%s: %s is not %s; accepted: %s", kp, scen_show(v, show, sizeof show),
                     noun, names);
}

dsim_err scen_enum(const scen_ctx *c, const scen_map *m, int i, const char *noun,
                   const scen_name *t, size_t n, int *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96];
    scen_kp(kp, sizeof kp, m, i);
    return scen_enum_v(c, m->val[i], kp, noun, t, n, out);
}

dsim_err scen_duration(const scen_ctx *c, const scen_map *m, int i, int64_t lo_ns, int64_t *out)
{
    if (!m->val[i])
        return DSIM_OK;
    char kp[96], show[96], why[200];
    scen_kp(kp, sizeof kp, m, i);
    const scen_node *v = m->val[i];
    int64_t ns;
    if (!scen_is_scalar(v) || strlen(v->s) != v->len) {
        return scen_fail(c, v,
                         "%s: %s is not a duration; accepted: a number with a unit, e.g. "
                         "30s or 500ms (units: ns, us, ms, s, m, h)",
                         kp, scen_show(v, show, sizeof show));
    }
    /* Where 0 means something (no deadline, off), a bare 0 needs no unit. */
    if (lo_ns == 0 && strcmp(v->s, "0") == 0)
        ns = 0;
    else if (!dsim_unit_duration(v->s, &ns, why, sizeof why))
        return scen_fail(c, v, "%s: %s %s", kp, scen_show(v, show, sizeof show), why);
    if (ns < lo_ns) {
        char lo[32];
        dsim_unit_format_duration(lo_ns, lo, sizeof lo);
        return scen_fail(c, v, "%s: %s is too short; accepted: %s or more", kp,
                         scen_show(v, show, sizeof show), lo_ns == 1 ? "1ns" : lo);
    }
    *out = ns;
    return DSIM_OK;
}

dsim_err scen_set_str(const scen_ctx *c, char **dst, const char *src)
{
    char *d = strdup(src);
    if (!d)
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory", c->path);
    free(*dst);
    *dst = d;
    return DSIM_OK;
}

dsim_src_pos scen_pos(const scen_node *n)
{
    dsim_src_pos p = {0, 0};
    if (n) {
        p.line = n->line;
        p.column = n->column;
    }
    return p;
}
