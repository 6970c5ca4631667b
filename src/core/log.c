/* Logging: one handler, a level read once from DSIM_LOG. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <pthread.h>

#include "dsim/log.h"

static atomic_int log_level = -1; /* -1: not yet read from the environment */
static dsim_log_fn log_fn;
static void *log_user;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const log_names[] = {"error", "warn", "info", "debug", "trace"};

static int log_level_from_env(void)
{
    const char *s = getenv("DSIM_LOG");
    if (s && *s) {
        for (int i = 0; i <= DSIM_LOG_TRACE; i++)
            if (strcasecmp(s, log_names[i]) == 0)
                return i;
        fprintf(stderr,
                "dsim: DSIM_LOG='%s' is not a level (accepted: error, warn, info, "
                "debug, trace); using warn\n",
                s);
    }
    return DSIM_LOG_WARN;
}

void dsim_log_set_level(dsim_log_level level)
{
    atomic_store(&log_level, (int)level);
}

dsim_log_level dsim_log_get_level(void)
{
    int l = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (l < 0) {
        l = log_level_from_env();
        int expected = -1;
        atomic_compare_exchange_strong(&log_level, &expected, l);
        l = atomic_load(&log_level);
    }
    return (dsim_log_level)l;
}

int dsim_log_enabled(dsim_log_level level)
{
    return (int)level <= (int)dsim_log_get_level();
}

void dsim_log_set_handler(dsim_log_fn fn, void *user)
{
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_lock);
}

void dsim_log_write(dsim_log_level level, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* The lock keeps lines whole when workers log at once. */
    pthread_mutex_lock(&log_lock);
    if (log_fn)
        log_fn(level, file, line, msg, log_user);
    else
        fprintf(stderr, "dsim %s: %s\n", log_names[level <= DSIM_LOG_TRACE ? level : 0], msg);
    pthread_mutex_unlock(&log_lock);
}
