/* The check registry: every check a scenario can name, with the thresholds
 * it accepts. A check's judging function lives in its own file. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"
#include "check/check_int.h"

static const dsim_check_ops *const check_table[] = {
    &dsim_check_gradient_consistency, &dsim_check_shard_coverage,
    &dsim_check_convergence,          &dsim_check_node_loss,
    &dsim_check_checkpoint_roundtrip, &dsim_check_cold_start,
    &dsim_check_performance,
};
#define CHECK_N (sizeof check_table / sizeof check_table[0])

size_t dsim_check_count(void)
{
    return CHECK_N;
}

const dsim_check_ops *dsim_check_at(size_t i)
{
    return i < CHECK_N ? check_table[i] : NULL;
}

const dsim_check_ops *dsim_check_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < CHECK_N; i++)
        if (strcmp(check_table[i]->name, name) == 0)
            return check_table[i];
    return NULL;
}

int dsim_check_param_index(const dsim_check_ops *ops, const char *key)
{
    if (!ops || !key)
        return -1;
    for (int i = 0; i < ops->n_params; i++)
        if (strcmp(ops->params[i].key, key) == 0)
            return i;
    return -1;
}

void dsim_check_msg(char *msg, size_t cap, const char *fmt, ...)
{
    if (!msg || cap == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
}

void dsim_check_msg_append(char *msg, size_t cap, const char *fmt, ...)
{
    if (!msg || cap == 0)
        return;
    size_t len = strnlen(msg, cap);
    if (len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + len, cap - len, fmt, ap);
    va_end(ap);
}
