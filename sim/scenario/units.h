/* Quantities with units, as scenario files write them.
 *
 *   duration   a number and one of ns, us, ms, s, m, h      500ms, 1.5s, 2m
 *   size       a number and one of B, KiB, MiB, GiB, TiB     16MiB, 512B
 *              (powers of 1024) or KB, MB, GB, TB (of 1000)
 *   bandwidth  a size per second                             10GB/s, 1GiB/s
 *
 * The number is decimal digits with an optional fraction ("1.5s"); no sign,
 * no exponent. A space between the number and the unit is accepted. A bare
 * number is refused, because a duration of "30" could mean seconds or
 * milliseconds and a size could mean bytes or MiB: the message says to add a
 * unit. A value that does not fit (durations: int64 nanoseconds, about 292
 * years; sizes: uint64 bytes) is refused, never wrapped. Fractions are
 * rounded to the nearest nanosecond or byte; a value written as more than
 * zero that would round to 0 ("0.1ns") is refused, since 0 means "none" or
 * "off" where it is allowed.
 *
 * Each parser returns true on success; on failure it writes a phrase that
 * completes "'VALUE' ..." into why (e.g. "has no unit; write it with one,
 * e.g. 30s or 500ms (units: ns, us, ms, s, m, h)"). */
#ifndef DSIM_SCENARIO_UNITS_H
#define DSIM_SCENARIO_UNITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

bool dsim_unit_duration(const char *s, int64_t *ns, char *why, size_t cap);
bool dsim_unit_size(const char *s, uint64_t *bytes, char *why, size_t cap);
bool dsim_unit_bandwidth(const char *s, double *bytes_per_s, char *why, size_t cap);

/* The shortest exact spelling: 30000000000 -> "30s", 500000 -> "500us",
 * 1500000000 -> "1500ms"; 0 -> "0s". */
void dsim_unit_format_duration(int64_t ns, char *buf, size_t cap);
/* Bytes per second as the largest decimal unit that keeps it whole
 * ("10GB/s", "1250MB/s"), else in B/s. */
void dsim_unit_format_bandwidth(double bytes_per_s, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
