/* Durations, sizes and bandwidths with units (see units.h). The arithmetic
 * is done in 128 bits so that "too large" is detected before anything wraps. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "scenario/units.h"

__extension__ typedef unsigned __int128 units_u128;

typedef struct units_unit {
    const char *name;
    uint64_t scale; /* in the base unit (ns or bytes) */
} units_unit;

static const units_unit units_time[] = {
    {"ns", 1ull},
    {"us", 1000ull},
    {"ms", 1000000ull},
    {"s", 1000000000ull},
    {"m", 60ull * 1000000000ull},
    {"h", 3600ull * 1000000000ull},
};

static const units_unit units_bytes[] = {
    {"B", 1ull},         {"KiB", 1ull << 10},   {"MiB", 1ull << 20},
    {"GiB", 1ull << 30}, {"TiB", 1ull << 40},   {"KB", 1000ull},
    {"MB", 1000000ull},  {"GB", 1000000000ull}, {"TB", 1000000000000ull},
};

#define UNITS_N(a) (sizeof(a) / sizeof((a)[0]))

static void units_list(const units_unit *u, size_t n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", u[i].name);
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

/* Parses "NUMBER[ ]UNIT" where UNIT is one of u and returns the value in the
 * base unit, at most max. `what` names the quantity in messages; `example`
 * is how to write one. */
static bool units_parse(const char *s, const units_unit *u, size_t nu, uint64_t max,
                        const char *what, const char *example, uint64_t *out, char *why, size_t cap)
{
    char names[96];
    units_list(u, nu, names, sizeof names);
    if (!s || !*s) {
        snprintf(why, cap, "is empty; write a %s with a unit, e.g. %s (units: %s)", what, example,
                 names);
        return false;
    }
    const char *p = s;
    if (*p == '-') {
        snprintf(why, cap, "is negative; a %s is 0 or more, e.g. %s", what, example);
        return false;
    }
    if (*p == '+')
        p++;
    if (!(*p >= '0' && *p <= '9') && !(*p == '.' && p[1] >= '0' && p[1] <= '9')) {
        snprintf(why, cap, "is not a %s; write a number and a unit, e.g. %s (units: %s)", what,
                 example, names);
        return false;
    }
    /* Whole part: more than 20 digits is already beyond any uint64. */
    units_u128 whole = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (digits > 0 || *p != '0')
            digits++;
        if (digits > 20) {
            snprintf(why, cap, "is too large for a %s", what);
            return false;
        }
        whole = whole * 10 + (unsigned)(*p - '0');
    }
    /* Fraction: the first 18 digits count; later ones are below any unit's
     * resolution after rounding. */
    uint64_t frac = 0, frac_den = 1;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) {
            snprintf(why, cap, "has a '.' without digits after it; write e.g. %s", example);
            return false;
        }
        int k = 0;
        for (; *p >= '0' && *p <= '9'; p++) {
            if (k < 18) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_den *= 10;
                k++;
            }
        }
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if (!*p) {
        snprintf(why, cap, "has no unit; write it with one, e.g. %s (units: %s)", example, names);
        return false;
    }
    if (*p == 'e' || *p == 'E') {
        snprintf(why, cap, "has an exponent; write the number in full with a unit, e.g. %s",
                 example);
        return false;
    }
    const units_unit *unit = NULL;
    for (size_t i = 0; i < nu; i++)
        if (strcmp(p, u[i].name) == 0)
            unit = &u[i];
    if (!unit) {
        snprintf(why, cap, "has the unit '%.16s'%s; accepted units: %s", p,
                 strlen(p) > 16 ? "..." : "", names);
        return false;
    }
    units_u128 v = whole * unit->scale;
    /* whole < 10^20 and scale < 2^42, so the product fits in 128 bits. */
    units_u128 f = ((units_u128)frac * unit->scale + frac_den / 2) / frac_den;
    v += f;
    /* A value written as more than zero must not become 0, which means
     * "none" or "off" where it is allowed (timeout: 0 is no deadline). */
    if (v == 0 && (whole > 0 || frac > 0)) {
        snprintf(why, cap,
                 "is more than 0 but less than 1%s, the smallest %s there is, so it would be 0; "
                 "write 0 if that is what you mean, else at least 1%s",
                 u[0].name, what, u[0].name);
        return false;
    }
    if (v > max) {
        snprintf(why, cap, "is too large for a %s (at most %" PRIu64 " %s)", what,
                 (uint64_t)(max / unit->scale), unit->name);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

bool dsim_unit_duration(const char *s, int64_t *ns, char *why, size_t cap)
{
    uint64_t v;
    if (!units_parse(s, units_time, UNITS_N(units_time), (uint64_t)INT64_MAX, "duration",
                     "30s or 500ms", &v, why, cap))
        return false;
    *ns = (int64_t)v;
    return true;
}

bool dsim_unit_size(const char *s, uint64_t *bytes, char *why, size_t cap)
{
    return units_parse(s, units_bytes, UNITS_N(units_bytes), UINT64_MAX, "size", "16MiB or 512B",
                       bytes, why, cap);
}

bool dsim_unit_bandwidth(const char *s, double *bytes_per_s, char *why, size_t cap)
{
    char names[96];
    units_list(units_bytes, UNITS_N(units_bytes), names, sizeof names);
    size_t n = s ? strlen(s) : 0;
    if (n < 3 || strcmp(s + n - 2, "/s") != 0) {
        snprintf(why, cap,
                 "is not a bandwidth; write a size per second, e.g. 10GB/s or "
                 "1GiB/s (size units: %s)",
                 names);
        return false;
    }
    char buf[64];
    if (n - 2 >= sizeof buf) {
        snprintf(why, cap, "is too long for a bandwidth; write e.g. 10GB/s");
        return false;
    }
    memcpy(buf, s, n - 2);
    buf[n - 2] = '\0';
    uint64_t v;
    if (!units_parse(buf, units_bytes, UNITS_N(units_bytes), UINT64_MAX, "bandwidth",
                     "10GB/s or 1GiB/s", &v, why, cap))
        return false;
    *bytes_per_s = (double)v;
    return true;
}

void dsim_unit_format_duration(int64_t ns, char *buf, size_t cap)
{
    static const struct {
        const char *name;
        int64_t scale;
    } f[] = {{"h", 3600000000000ll}, {"m", 60000000000ll}, {"s", 1000000000ll},
             {"ms", 1000000ll},      {"us", 1000ll},       {"ns", 1}};
    if (ns == 0) {
        snprintf(buf, cap, "0s");
        return;
    }
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (ns % f[i].scale == 0) {
            snprintf(buf, cap, "%" PRId64 "%s", ns / f[i].scale, f[i].name);
            return;
        }
    }
}

void dsim_unit_format_bandwidth(double bps, char *buf, size_t cap)
{
    static const struct {
        const char *name;
        double scale;
    } f[] = {{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        double q = bps / f[i].scale;
        if (q >= 1 && q == floor(q) && q < 1e15) {
            snprintf(buf, cap, "%.0f%s/s", q, f[i].name);
            return;
        }
    }
    snprintf(buf, cap, "%.0fB/s", bps);
}
