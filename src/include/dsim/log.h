/* Logging. Level from DSIM_LOG (error|warn|info|debug|trace; default warn). */
#ifndef DSIM_LOG_H
#define DSIM_LOG_H

#include "dsim/api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_log_level {
    DSIM_LOG_ERROR = 0,
    DSIM_LOG_WARN,
    DSIM_LOG_INFO,
    DSIM_LOG_DEBUG,
    DSIM_LOG_TRACE,
} dsim_log_level;

typedef void (*dsim_log_fn)(dsim_log_level level, const char *file, int line, const char *msg,
                            void *user);

DSIM_API void dsim_log_set_level(dsim_log_level level);
DSIM_API dsim_log_level dsim_log_get_level(void);
/* Routes messages to fn (NULL restores the default: stderr). */
DSIM_API void dsim_log_set_handler(dsim_log_fn fn, void *user);
DSIM_API int dsim_log_enabled(dsim_log_level level);
DSIM_API void dsim_log_write(dsim_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define DSIM_LOG(level, ...)                                                                       \
    do {                                                                                           \
        if (dsim_log_enabled(level))                                                               \
            dsim_log_write((level), __FILE__, __LINE__, __VA_ARGS__);                              \
    } while (0)
#define dsim_error_log(...) DSIM_LOG(DSIM_LOG_ERROR, __VA_ARGS__)
#define dsim_warn(...)      DSIM_LOG(DSIM_LOG_WARN, __VA_ARGS__)
#define dsim_info(...)      DSIM_LOG(DSIM_LOG_INFO, __VA_ARGS__)
#define dsim_debug(...)     DSIM_LOG(DSIM_LOG_DEBUG, __VA_ARGS__)
#define dsim_trace(...)     DSIM_LOG(DSIM_LOG_TRACE, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
