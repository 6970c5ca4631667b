/* Error codes and the per-thread error context. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "dsim/err.h"
#include "dsim/log.h"
#include "dsim/spi/rt.h"

static _Thread_local dsim_error err_tls = {.code = DSIM_OK, .peer = -1};
static const dsim_error err_init = {.code = DSIM_OK, .peer = -1};

/* Each worker has its own last error, also when an engine runs many on one
 * OS thread (spi/rt.h). */
static void *err_tls_addr(void)
{
    return &err_tls;
}

/* What a switch carries: the fields and the message up to its end (mostly
 * empty), not the whole buffer. */
static size_t err_used(const void *p)
{
    const dsim_error *e = p;
    return offsetof(dsim_error, msg) + strnlen(e->msg, sizeof e->msg - 1) + 1;
}

__attribute__((constructor)) static void err_register_state(void)
{
    dsim_rt_worker_state_add_used(err_tls_addr, &err_init, sizeof err_tls, err_used);
}

static const char *const err_names[DSIM_ERR_COUNT] = {
    [DSIM_OK] = "success",
    [DSIM_EINVAL] = "invalid argument or input",
    [DSIM_ENOMEM] = "out of memory",
    [DSIM_ETIMEDOUT] = "deadline passed",
    [DSIM_EABORTED] = "operation aborted",
    [DSIM_EPEER] = "peer failed",
    [DSIM_ESTALE] = "stale or misrouted message",
    [DSIM_ETRUNC] = "message longer than the receive buffer",
    [DSIM_ENOTSUP] = "not supported",
    [DSIM_ENOENT] = "not found",
    [DSIM_EIO] = "input/output error",
    [DSIM_EPROTO] = "protocol error or corrupt data",
    [DSIM_ESTATE] = "called in the wrong state",
    [DSIM_EPREEMPTED] = "preempted: restart from the checkpoint",
    [DSIM_EHUNG] = "a worker hung (did not return in time)",
};

const char *dsim_strerror(dsim_err e)
{
    if ((int)e < 0 || e >= DSIM_ERR_COUNT)
        return "unknown error code";
    return err_names[e];
}

const dsim_error *dsim_last_error(void)
{
    return &err_tls;
}

const char *dsim_errmsg(void)
{
    return err_tls.msg;
}

void dsim_clear_error(void)
{
    err_tls.code = DSIM_OK;
    err_tls.peer = -1;
    err_tls.file = NULL;
    err_tls.line = 0;
    err_tls.msg[0] = '\0';
}

dsim_err dsim_set_error(dsim_err code, int peer, const char *file, int line, const char *fmt, ...)
{
    /* Format into a scratch buffer first: fmt's arguments may point into the
     * current message (re-raising with more context). */
    char buf[sizeof err_tls.msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(err_tls.msg, buf, sizeof buf);
    err_tls.code = code;
    err_tls.peer = peer;
    err_tls.file = file;
    err_tls.line = line;
    dsim_debug("error %s at %s:%d: %s", dsim_strerror(code), file, line, err_tls.msg);
    return code;
}

void dsim_error_copy(dsim_error *dst)
{
    *dst = err_tls;
}

void dsim_error_restore(const dsim_error *src)
{
    if (src != &err_tls)
        err_tls = *src;
}

void dsim_error_trace(dsim_err e, const char *file, int line)
{
    /* A failure raised without a message still gets one a person can read. */
    if (err_tls.code != e || err_tls.msg[0] == '\0') {
        err_tls.code = e;
        err_tls.peer = -1;
        err_tls.file = file;
        err_tls.line = line;
        snprintf(err_tls.msg, sizeof err_tls.msg, "%s", dsim_strerror(e));
    }
    dsim_trace("propagating %s from %s:%d", dsim_strerror(e), file, line);
}
