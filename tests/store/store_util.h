/* Helpers shared by the store tests: scratch directories and plain SQLite
 * reads, so that what the store wrote is checked without going through it. */
#ifndef STORE_UTIL_H
#define STORE_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

/* A fresh directory under $TMPDIR (or /tmp); removed by su_rmdir. */
static inline void su_mkdtemp(char *dir, size_t n)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, n, "%s/dsim-store-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
}

static inline void su_rmdir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static inline sqlite3 *su_open(const char *path)
{
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        fprintf(stderr, "sqlite3_open %s: %s\n", path, db ? sqlite3_errmsg(db) : "?");
        exit(1);
    }
    return db;
}

static inline void su_exec(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "SQL failed: %s\n%s\n", err, sql);
        exit(1);
    }
}

/* The first column of the first row of a query (printf-style); -999999 when
 * there is no row, so that a missing row fails an equality assertion. */
static inline int64_t su_int(sqlite3 *db, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "prepare failed: %s\n%s\n", sqlite3_errmsg(db), sql);
        exit(1);
    }
    int64_t v = -999999;
    if (sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_type(s, 0) == SQLITE_NULL ? -888888 : sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

static inline double su_real(sqlite3 *db, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "prepare failed: %s\n%s\n", sqlite3_errmsg(db), sql);
        exit(1);
    }
    double v = -999999.0;
    if (sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_double(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* Text of the first column of the first row into buf ("<no row>" / "<null>"). */
static inline const char *su_text(sqlite3 *db, char *buf, size_t n, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) {
        fprintf(stderr, "prepare failed: %s\n%s\n", sqlite3_errmsg(db), sql);
        exit(1);
    }
    snprintf(buf, n, "<no row>");
    if (sqlite3_step(s) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(s, 0);
        snprintf(buf, n, "%s", t ? (const char *)t : "<null>");
    }
    sqlite3_finalize(s);
    return buf;
}

/* Whole file into a malloc'ed buffer (*len bytes); NULL if unreadable. */
static inline unsigned char *su_slurp(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    unsigned char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            unsigned char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
            }
            b = nb;
        }
    }
    fclose(f);
    *len = n;
    return b;
}

#endif
