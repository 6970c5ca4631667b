/* The built-in checks' tables, each defined in its own file. */
#ifndef DSIM_CHECK_INT_H
#define DSIM_CHECK_INT_H

#include <stddef.h>

#include "check/check.h"

extern const dsim_check_ops dsim_check_gradient_consistency;
extern const dsim_check_ops dsim_check_shard_coverage;
extern const dsim_check_ops dsim_check_convergence;
extern const dsim_check_ops dsim_check_node_loss;
extern const dsim_check_ops dsim_check_checkpoint_roundtrip;
extern const dsim_check_ops dsim_check_performance;
extern const dsim_check_ops dsim_check_cold_start;

/* Writes (or appends) a message into msg[cap], truncating; always
 * terminated. Used instead of snprintf so that a long peer message is cut
 * rather than a compile-time truncation warning. */
void dsim_check_msg(char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void dsim_check_msg_append(char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
