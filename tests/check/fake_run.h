/* What the checks' unit tests share: a hand-made finished run (fake_run),
 * its context, the check's values and one judgement. */
#ifndef DSIM_TEST_FAKE_RUN_H
#define DSIM_TEST_FAKE_RUN_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "check/check.h"
#include "check/check_int.h"
#include "dsim/data.h"
#include "dsim/strategy.h"

#define NP 4

static inline void assert_has(const char *text, const char *needle)
{
    if (strstr(text, needle) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", text, needle);
}

/* A finished run of `replicas` replicas (1 device each) and `steps` steps
 * whose replicas agree after every step. */
typedef struct fake_run {
    dsim_train_result res, ref;
    dsim_train_cfg cfg;
    float params[NP], ref_params[NP];
    uint64_t checksum[64];
} fake_run;

static inline void fake_init(fake_run *f, int replicas, uint64_t steps)
{
    memset(f, 0, sizeof *f);
    dsim_train_cfg_init(&f->cfg);
    f->cfg.strategy = "mirrored";
    f->cfg.hosts = replicas;
    f->cfg.devices_per_host = 1;
    for (int i = 0; i < NP; i++)
        f->params[i] = f->ref_params[i] = 0.25f * (float)(i + 1);
    assert_true((size_t)replicas * steps <= 64);
    for (uint64_t s = 0; s < steps; s++)
        for (int r = 0; r < replicas; r++)
            f->checksum[s * (uint64_t)replicas + (uint64_t)r] = 0x1000 + s;
    dsim_train_result *r = &f->res;
    snprintf(r->strategy, sizeof r->strategy, "mirrored");
    r->num_workers = replicas;
    r->devices_per_host = 1;
    r->num_replicas = replicas;
    r->num_replicas_in_sync = replicas;
    r->steps = steps;
    r->n_params = NP;
    r->params = f->params;
    r->checksum = f->checksum;
    r->replicas_agree = true;
    r->in_sync_every_step = true;
    r->final_loss = 0.5;
    r->initial_loss = 1.4;
    f->ref.num_replicas = 1;
    f->ref.steps = steps;
    f->ref.n_params = NP;
    f->ref.params = f->ref_params;
    f->ref.final_loss = 0.5;
}

static inline dsim_check_ctx fake_ctx(fake_run *f)
{
    dsim_check_ctx c = {
        .cfg = &f->cfg,
        .run = &f->res,
        .reference = &f->ref,
        .run_err = DSIM_OK,
    };
    return c;
}

/* The check's defaults, with overrides as key/value pairs ending in NULL. */
static inline void values_of(const dsim_check_ops *ops, double *v, ...)
{
    for (int i = 0; i < ops->n_params; i++)
        v[i] = ops->params[i].def;
    va_list ap;
    va_start(ap, v);
    const char *key;
    while ((key = va_arg(ap, const char *)) != NULL) {
        double x = va_arg(ap, double);
        int k = dsim_check_param_index(ops, key);
        assert_true(k >= 0);
        v[k] = x;
    }
    va_end(ap);
}

static inline dsim_check_result judge(const char *name, const dsim_check_ctx *ctx, const double *v)
{
    const dsim_check_ops *ops = dsim_check_find(name);
    assert_non_null(ops);
    assert_true(ops->available);
    dsim_check_result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(ops->run(ctx, v, &r), DSIM_OK);
    assert_true(r.message[0] != '\0');
    return r;
}

#endif
