/* The transport registry: the backends by name (the built-in inproc and tcp,
 * and any a program registers), and dsim_fabric_open, the one place a
 * backend is chosen. Everything after the open goes through the fabric's
 * ops table (transport.c, request.c, post.c). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsim/log.h"
#include "tp_int.h"

#define TP_MAX_BACKENDS 16
#define TP_NAME_MAX     32
#define TP_MAX_RANKS    (1 << 20)
#define TP_MAX_BUCKETS  256

/* Registration is rare and has no runtime to lock with (no dsim_rt exists
 * yet), so a spin flag guards it; it is never contended in practice. */
static atomic_flag tp_reg_lock = ATOMIC_FLAG_INIT;
static struct dsim_tp_ops tp_reg[TP_MAX_BACKENDS];
static char tp_reg_names[TP_MAX_BACKENDS][TP_NAME_MAX];
static const char *tp_names[TP_MAX_BACKENDS + 1];
static int tp_nreg;
static int tp_builtins_done;

static void tp_reg_acquire(void)
{
    while (atomic_flag_test_and_set_explicit(&tp_reg_lock, memory_order_acquire))
        ;
}

static void tp_reg_release(void)
{
    atomic_flag_clear_explicit(&tp_reg_lock, memory_order_release);
}

static dsim_err tp_stub_cancel_send(dsim_ep *ep, dsim_req *req)
{
    (void)ep;
    (void)req;
    return DSIM_ENOTSUP; /* not supported: the shared layer waits for completion */
}

static void tp_stub_abort(dsim_fabric *f, int failed_peer, const char *why)
{
    /* not supported: every rank shares this address space, nobody to tell */
    (void)f;
    (void)failed_peer;
    (void)why;
}

static int tp_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= TP_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

#define TP_OPS_MIN_SIZE (offsetof(struct dsim_tp_ops, send) + sizeof(void *))

static dsim_err tp_register_locked(const struct dsim_tp_ops *ops)
{
    if (!ops)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_transport_register: ops is NULL");
    if (ops->size < TP_OPS_MIN_SIZE)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: ops->size is %zu, less than the %zu bytes "
                        "every table has; set .size = sizeof(struct dsim_tp_ops)",
                        ops->size, (size_t)TP_OPS_MIN_SIZE);
    if (!ops->name || !tp_name_ok(ops->name))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: backend name '%s' is not valid; use 1 to %d "
                        "characters from [a-z0-9_]",
                        ops->name ? ops->name : "(null)", TP_NAME_MAX - 1);
    const char *missing = !ops->fabric_open    ? "fabric_open"
                          : !ops->fabric_close ? "fabric_close"
                          : !ops->ep_open      ? "ep_open"
                          : !ops->ep_close     ? "ep_close"
                          : !ops->send         ? "send"
                                               : NULL;
    if (missing)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: backend '%s' leaves the required member "
                        "'%s' NULL",
                        ops->name, missing);
    for (int i = 0; i < tp_nreg; i++)
        if (strcmp(tp_reg_names[i], ops->name) == 0)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "dsim_transport_register: a backend named '%s' is already "
                            "registered",
                            ops->name);
    if (tp_nreg == TP_MAX_BACKENDS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_transport_register: already %d backends registered; cannot add "
                        "'%s'",
                        TP_MAX_BACKENDS, ops->name);
    struct dsim_tp_ops *c = &tp_reg[tp_nreg];
    memset(c, 0, sizeof *c);
    memcpy(c, ops, ops->size < sizeof *c ? ops->size : sizeof *c);
    c->size = sizeof *c;
    snprintf(tp_reg_names[tp_nreg], TP_NAME_MAX, "%s", ops->name);
    c->name = tp_reg_names[tp_nreg];
    if (!c->cancel_send)
        c->cancel_send = tp_stub_cancel_send;
    if (!c->abort)
        c->abort = tp_stub_abort;
    tp_names[tp_nreg] = c->name;
    tp_nreg++;
    tp_names[tp_nreg] = NULL;
    return DSIM_OK;
}

static void tp_builtins_locked(void)
{
    if (tp_builtins_done)
        return;
    tp_builtins_done = 1;
    static const struct dsim_tp_ops *const builtins[] = {&dsim_tp_inproc_ops, &dsim_tp_tcp_ops};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (tp_register_locked(builtins[i]) != DSIM_OK)
            dsim_error_log("built-in transport '%s' failed to register: %s", builtins[i]->name,
                           dsim_errmsg());
}

dsim_err dsim_transport_register(const struct dsim_tp_ops *ops)
{
    tp_reg_acquire();
    tp_builtins_locked();
    dsim_err e = tp_register_locked(ops);
    tp_reg_release();
    return e;
}

const char *const *dsim_transport_names(void)
{
    tp_reg_acquire();
    tp_builtins_locked();
    tp_reg_release();
    return tp_names;
}

static const struct dsim_tp_ops *tp_lookup(const char *name)
{
    const struct dsim_tp_ops *found = NULL;
    tp_reg_acquire();
    tp_builtins_locked();
    for (int i = 0; i < tp_nreg && !found; i++)
        if (strcmp(tp_reg_names[i], name) == 0)
            found = &tp_reg[i];
    tp_reg_release();
    return found;
}

static void tp_names_list(char *buf, size_t cap)
{
    size_t off = 0;
    buf[0] = '\0';
    for (const char *const *n = dsim_transport_names(); *n && off < cap; n++) {
        int w = snprintf(buf + off, cap - off, "%s%s", off ? ", " : "", *n);
        if (w < 0)
            break;
        off += (size_t)w;
    }
}

dsim_err dsim_fabric_open(const dsim_fabric_cfg *cfg, dsim_fabric **out)
{
    if (out)
        *out = NULL;
    if (!cfg || !out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_fabric_open: cfg and out must not be NULL");
    char names[256];
    if (!cfg->backend) {
        tp_names_list(names, sizeof names);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: no backend given; set cfg.backend to one of: %s", names);
    }
    if (cfg->nranks < 1 || cfg->nranks > TP_MAX_RANKS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: nranks is %d; it must be between 1 and %d", cfg->nranks,
                        TP_MAX_RANKS);
    if (!cfg->rt)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: cfg.rt is NULL; create one with dsim_rt_create");
    const struct dsim_tp_ops *ops = tp_lookup(cfg->backend);
    if (!ops) {
        tp_names_list(names, sizeof names);
        return DSIM_ERR(DSIM_ENOENT, -1, "no transport backend named '%s'; registered backends: %s",
                        cfg->backend, names);
    }
    size_t psz = ops->fabric_priv_size;
    dsim_fabric *f = calloc(1, tp_align(sizeof *f) + psz);
    if (!f)
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank fabric", cfg->nranks);
    f->ops = ops;
    f->rt = cfg->rt;
    f->nranks = cfg->nranks;
    if (cfg->filter &&
        (cfg->filter->size != sizeof(struct dsim_tp_filter) || !cfg->filter->on_deliver)) {
        free(f);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "dsim_fabric_open: the filter's size is %zu (expected %zu) or it has "
                        "no on_deliver",
                        cfg->filter->size, sizeof(struct dsim_tp_filter));
    }
    f->filter = cfg->filter;
    f->filter_user = cfg->filter_user;
    f->abort_peer = -1;
    atomic_init(&f->aborted, 0);
    atomic_flag_clear(&f->abort_claimed);
    f->priv = psz ? (char *)f + tp_align(sizeof *f) : NULL;
    unsigned nb = 1;
    while (nb < (unsigned)cfg->nranks && nb < TP_MAX_BUCKETS)
        nb *= 2;
    f->bucket_mask = nb - 1;
    f->eps = calloc((size_t)cfg->nranks, sizeof *f->eps);
    if (!f->eps) {
        free(f);
        return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory opening a %d-rank fabric", cfg->nranks);
    }
    for (int r = 0; r < cfg->nranks; r++)
        atomic_init(&f->eps[r], NULL);
    /* The filter first: a backend with threads of its own (tcp) may hand
     * frames over as soon as it is open. */
    dsim_err e = DSIM_OK;
    if (f->filter && f->filter->attach && (e = f->filter->attach(f->filter_user, f)) != DSIM_OK) {
        free(f->eps);
        free(f);
        return e;
    }
    e = ops->fabric_open(f, cfg->options);
    if (e != DSIM_OK) {
        if (f->filter && f->filter->detach)
            f->filter->detach(f->filter_user, f);
        free(f->eps);
        free(f);
        return e;
    }
    dsim_debug("transport: opened a %d-rank '%s' fabric", f->nranks, ops->name);
    *out = f;
    return DSIM_OK;
}
