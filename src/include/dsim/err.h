/* Error codes and the per-thread error context.
 *
 * Every fallible call returns a dsim_err. The code says what kind of failure
 * it was; the error context (dsim_last_error) says where and why, in a sentence
 * a person can act on, and names the peer rank when a peer is to blame. */
#ifndef DSIM_ERR_H
#define DSIM_ERR_H

#include "dsim/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_err {
    DSIM_OK = 0,
    DSIM_EINVAL,     /* a bad argument or bad input */
    DSIM_ENOMEM,     /* out of memory */
    DSIM_ETIMEDOUT,  /* a deadline passed */
    DSIM_EABORTED,   /* the operation was aborted (revoked); permanent until restart */
    DSIM_EPEER,      /* a peer failed or is down */
    DSIM_ESTALE,     /* a stale or misrouted message */
    DSIM_ETRUNC,     /* a message longer than the receive buffer */
    DSIM_ENOTSUP,    /* not supported by this backend/strategy */
    DSIM_ENOENT,     /* no such backend, strategy, file, ... */
    DSIM_EIO,        /* an I/O error */
    DSIM_EPROTO,     /* a protocol violation or corrupt frame */
    DSIM_ESTATE,     /* called in the wrong state */
    DSIM_EPREEMPTED, /* stopped by a preemption notice after saving a checkpoint:
                        restart from it (dsim_train) */
    DSIM_EHUNG,      /* a worker did not return in time and was left running */
    DSIM_ERR_COUNT
} dsim_err;

/* A short, static description of a code ("deadline passed"). Never NULL. */
DSIM_API const char *dsim_strerror(dsim_err e);

/* The error context of the calling thread: the last error set on it. */
typedef struct dsim_error {
    dsim_err code;
    int peer;         /* the rank to blame, or -1 */
    const char *file; /* where it was raised (static string) */
    int line;
    char msg[512]; /* a sentence a person can act on */
} dsim_error;

/* The calling thread's last error (code DSIM_OK and empty msg if none). */
DSIM_API const dsim_error *dsim_last_error(void);
/* Shorthand for dsim_last_error()->msg. */
DSIM_API const char *dsim_errmsg(void);
DSIM_API void dsim_clear_error(void);

/* Records an error on the calling thread and returns code, so that
 * `return DSIM_ERR(DSIM_EINVAL, -1, "count %zu too large", n);` reads well. */
DSIM_API dsim_err dsim_set_error(dsim_err code, int peer, const char *file, int line,
                                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define DSIM_ERR(code, peer, ...) dsim_set_error((code), (peer), __FILE__, __LINE__, __VA_ARGS__)

/* Copies the calling thread's error context into dst (for objects that keep
 * their own last error, such as a communicator). */
DSIM_API void dsim_error_copy(dsim_error *dst);
/* Makes src the calling thread's error context again (after a call that may
 * have replaced it, when that call's failure is not the one to report). */
DSIM_API void dsim_error_restore(const dsim_error *src);

/* Propagates a failure; records file:line of the propagation in debug logs. */
DSIM_API void dsim_error_trace(dsim_err e, const char *file, int line);
#define DSIM_CHECK(expr)                                                                           \
    do {                                                                                           \
        dsim_err dsim_check_e_ = (expr);                                                           \
        if (dsim_check_e_ != DSIM_OK) {                                                            \
            dsim_error_trace(dsim_check_e_, __FILE__, __LINE__);                                   \
            return dsim_check_e_;                                                                  \
        }                                                                                          \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
