/* The check registry: every check a scenario can name, with the thresholds
 * it accepts. A check's judging function lives in its own file. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check/check.h"
#include "dsim/precision.h"
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

void dsim_check_defaults(const dsim_check_ops *ops, double *v)
{
    for (int i = 0; i < DSIM_CHECK_MAX_PARAMS; i++)
        v[i] = i < ops->n_params ? ops->params[i].def : NAN;
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

double dsim_check_narrow_u(const dsim_train_result *run)
{
    double u = 0;
    dsim_dtype cd = dsim_precision_compute_dtype(run->precision);
    if (cd != DSIM_F32)
        u = dsim_dtype_unit_roundoff(cd);
    if (run->gradient_dtype == DSIM_F16 || run->gradient_dtype == DSIM_BF16)
        u = fmax(u, dsim_dtype_unit_roundoff(run->gradient_dtype));
    return u;
}

const char *ck_optim_title(const dsim_optim_spec *os)
{
    static const char *const t[DSIM_OPTIM_KIND_COUNT] = {
        "SGD",   "SGD with momentum", "Adam", "RMSprop", "Adagrad", "Lion", "Adamax", "LAMB",
        "Nadam", "Adadelta"};
    return (unsigned)os->kind < DSIM_OPTIM_KIND_COUNT ? t[os->kind] : "the optimizer";
}

void dsim_check_ranks_text(const bool *lost, int n, int replicas, int devices_per_host, char *buf,
                           size_t cap)
{
    if (!buf || cap == 0)
        return;
    buf[0] = '\0';
    int D = devices_per_host > 0 ? devices_per_host : 1, total = 0, groups = 0;
    bool worded = false;
    for (int r = 0; lost && r < n; r++)
        total += lost[r];
    if (!total) {
        dsim_check_msg(buf, cap, "no rank");
        return;
    }
    /* groups: runs of lost ranks of one worker (or one server each) */
    int ng = 0;
    for (int r = 0; r < n; r++)
        if (lost[r] && (r == 0 || !lost[r - 1] || r >= replicas || r % D == 0))
            ng++;
    for (int r = 0; r < n;) {
        if (!lost[r]) {
            r++;
            continue;
        }
        const char *sep = groups == 0 ? "" : groups + 1 == ng ? " and " : ", ";
        groups++;
        if (r >= replicas) {
            dsim_check_msg_append(buf, cap, "%sparameter server %d (rank %d)", sep, r - replicas,
                                  r);
            r++;
            continue;
        }
        int w = r / D, hi = r;
        while (hi + 1 < n && hi + 1 < replicas && lost[hi + 1] && (hi + 1) / D == w)
            hi++;
        const char *word = worded ? "" : total > 1 ? "ranks " : "rank ";
        worded = true;
        if (hi > r)
            dsim_check_msg_append(buf, cap, "%s%s%d-%d (worker %d)", sep, word, r, hi, w);
        else
            dsim_check_msg_append(buf, cap, "%s%s%d (worker %d)", sep, word, r, w);
        r = hi + 1;
    }
}
