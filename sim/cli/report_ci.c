/* JUnit XML and TAP reports of `dsim run` (report_ci.h). */
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "report_ci.h"

struct dsim_ci_report {
    char cmd[32]; /* "dsim run": starts the messages */
    /* JUnit: the <testsuite> elements so far, in memory until the end */
    char *junit_path;
    FILE *suites;
    char *suites_buf;
    size_t suites_len;
    long tests, failures, errors, skipped, n_suites;
    double time_s;
    char host[256];
    /* TAP: the real standard output */
    FILE *tap;
    long tap_n;
};

/* ---- text ---- */

/* The length of the valid UTF-8 sequence at p (of at most n bytes) that
 * XML 1.0 allows as a character, or 0. */
static size_t ci_utf8_char(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80)
        return c >= 0x20 || c == '\t' || c == '\n' || c == '\r' ? 1 : 0;
    size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4
                                          : 0;
    if (!len || len > n)
        return 0;
    uint32_t cp = c & (0xffu >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3fu);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0; /* overlong or out of range */
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff)
        return 0; /* surrogates and the two non-characters XML excludes */
    return len;
}

/* s as XML character data or attribute text: markup escaped, and anything
 * that is not a character XML 1.0 allows (control bytes, bad UTF-8) written
 * as U+FFFD, so the file always parses. */
static void ci_xml(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    while (n) {
        size_t k = ci_utf8_char(p, n);
        if (!k) {
            fputs("\xef\xbf\xbd", f);
            p++;
            n--;
            continue;
        }
        if (k == 1) {
            switch (*p) {
            case '&':
                fputs("&amp;", f);
                break;
            case '<':
                fputs("&lt;", f);
                break;
            case '>':
                fputs("&gt;", f);
                break;
            case '"':
                fputs("&quot;", f);
                break;
            case '\'':
                fputs("&apos;", f);
                break;
            case '\n':
                fputs("&#10;", f);
                break;
            case '\r':
                fputs("&#13;", f);
                break;
            case '\t':
                fputs("&#9;", f);
                break;
            default:
                fputc(*p, f);
                break;
            }
        } else {
            fwrite(p, 1, k, f);
        }
        p += k;
        n -= k;
    }
}

/* The same for element content, where line breaks may stay as they are. */
static void ci_xml_text(FILE *f, const char *s)
{
    for (const char *line = s ? s : ""; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char *copy = strndup(line, len);
        ci_xml(f, copy ? copy : "");
        free(copy);
        if (!nl)
            break;
        fputc('\n', f);
        line = nl + 1;
    }
}

/* One line of s for a TAP description or comment: no line breaks, no '#'
 * in a description (it would start a directive). */
static void ci_tap_text(FILE *f, const char *s, bool description)
{
    for (const char *p = s ? s : ""; *p; p++) {
        if (*p == '\n' || *p == '\r')
            fputs(" / ", f);
        else if (description && *p == '#')
            fputs("No.", f);
        else if ((unsigned char)*p < 0x20 || *p == 0x7f)
            fputc('?', f);
        else
            fputc(*p, f);
    }
}

static void ci_num(char *buf, size_t cap, double v)
{
    if (isnan(v))
        snprintf(buf, cap, "-");
    else if (v >= DSIM_CHECK_NO_LIMIT)
        snprintf(buf, cap, "no limit");
    else
        snprintf(buf, cap, "%.6g", v);
}

static const char *ci_status(dsim_run_status st)
{
    return dsim_run_status_name(st);
}

/* ---- open ---- */

int dsim_ci_open(const char *cmd, const char *junit_path, bool tap, dsim_ci_report **out)
{
    *out = NULL;
    if (!junit_path && !tap)
        return 0;
    dsim_ci_report *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        return 2;
    }
    snprintf(r->cmd, sizeof r->cmd, "%s", cmd);
    if (gethostname(r->host, sizeof r->host - 1) != 0 || !r->host[0])
        snprintf(r->host, sizeof r->host, "localhost");
    if (junit_path) {
        /* Said now, not after an hour of runs. */
        char *copy = strdup(junit_path);
        const char *dir = copy ? dirname(copy) : ".";
        if (!*junit_path || access(dir, W_OK) != 0) {
            fprintf(stderr,
                    "%s: --junit is '%s', but its folder '%s' %s (accepted: a file path "
                    "in a writable folder)\n",
                    cmd, junit_path, dir, !*junit_path ? "is not given" : strerror(errno));
            free(copy);
            free(r);
            return 2;
        }
        free(copy);
        r->junit_path = strdup(junit_path);
        r->suites = open_memstream(&r->suites_buf, &r->suites_len);
        if (!r->junit_path || !r->suites) {
            fprintf(stderr, "%s: out of memory\n", cmd);
            free(r->junit_path);
            free(r);
            return 2;
        }
    }
    if (tap) {
        /* Everything dsim run prints for people goes to stderr from now on;
         * only the TAP stream stays on the real standard output. */
        fflush(stdout);
        int fd = dup(STDOUT_FILENO);
        r->tap = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!r->tap || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
            fprintf(stderr, "%s: cannot set standard output aside for --tap: %s\n", cmd,
                    strerror(errno));
            if (r->tap)
                fclose(r->tap);
            else if (fd >= 0)
                close(fd);
            if (r->suites)
                fclose(r->suites);
            free(r->suites_buf);
            free(r->junit_path);
            free(r);
            return 2;
        }
        fputs("TAP version 13\n", r->tap);
        fflush(r->tap);
    }
    *out = r;
    return 0;
}

/* ---- TAP ---- */

/* skip: TAP's SKIP directive (a check with nothing in the run to judge) */
static void ci_tap_line(dsim_ci_report *r, bool ok, const char *scenario, const char *test,
                        const char *comment, bool skip)
{
    if (!r->tap)
        return;
    fprintf(r->tap, "%s %ld - ", ok ? "ok" : "not ok", ++r->tap_n);
    ci_tap_text(r->tap, scenario, true);
    fputs(": ", r->tap);
    ci_tap_text(r->tap, test, true);
    if (skip) /* TAP's directive: the harness counts it as skipped */
        fputs(" # SKIP not judged", r->tap);
    fputc('\n', r->tap);
    if (comment && *comment) {
        fputs("# ", r->tap);
        ci_tap_text(r->tap, comment, false);
        fputc('\n', r->tap);
    }
}

/* A check met its expectation without judging the run (N/A: the run has
 * nothing it measures): CI shows it skipped. */
static bool ci_check_skipped(const dsim_check_outcome *c)
{
    return c->passed && (c->not_applicable || c->result.not_judged);
}

/* ---- JUnit ---- */

static void ci_timestamp(char *buf, size_t cap, double ago_s)
{
    time_t t = time(NULL) - (time_t)(ago_s > 0 ? ago_s : 0);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        snprintf(buf, cap, "1970-01-01T00:00:00");
}

static void ci_property(FILE *f, const char *name, const char *value)
{
    fputs("      <property name=\"", f);
    ci_xml(f, name);
    fputs("\" value=\"", f);
    ci_xml(f, value);
    fputs("\"/>\n", f);
}

static void ci_suite_open(dsim_ci_report *r, const char *name, long tests, long failures,
                          long errors, long skipped, double time_s)
{
    FILE *f = r->suites;
    char ts[32];
    ci_timestamp(ts, sizeof ts, time_s);
    fputs("  <testsuite name=\"", f);
    ci_xml(f, name);
    fprintf(f,
            "\" tests=\"%ld\" failures=\"%ld\" errors=\"%ld\" skipped=\"%ld\" time=\"%.3f\" "
            "timestamp=\"%s\" hostname=\"",
            tests, failures, errors, skipped, time_s, ts);
    ci_xml(f, r->host);
    fprintf(f, "\" id=\"%ld\" package=\"dsim\">\n", r->n_suites);
    r->n_suites++;
    r->tests += tests;
    r->failures += failures;
    r->errors += errors;
    r->skipped += skipped;
    r->time_s += time_s;
}

/* kind: NULL (passed), "failure" or "error" */
static void ci_case(FILE *f, const char *scenario, const char *name, double time_s,
                    const char *kind, const char *type, const char *message, const char *body)
{
    fputs("    <testcase name=\"", f);
    ci_xml(f, name);
    fputs("\" classname=\"dsim.", f);
    ci_xml(f, scenario);
    fprintf(f, "\" time=\"%.3f\"", time_s);
    if (!kind) {
        fputs("/>\n", f);
        return;
    }
    fprintf(f, ">\n      <%s message=\"", kind);
    ci_xml(f, message);
    if (!type) { /* skipped: a message only */
        fprintf(f, "\"/>\n    </testcase>\n");
        return;
    }
    fprintf(f, "\" type=\"%s\">", type);
    ci_xml_text(f, body);
    fprintf(f, "</%s>\n    </testcase>\n", kind);
}

static void ci_suite_close(FILE *f, const char *out, const char *err)
{
    fputs("    <system-out>", f);
    ci_xml_text(f, out);
    fputs("</system-out>\n    <system-err>", f);
    ci_xml_text(f, err);
    fputs("</system-err>\n  </testsuite>\n", f);
}

/* ---- what a run came to ---- */

void dsim_ci_load_failed(dsim_ci_report *r, const char *file, const char *msg)
{
    if (!r)
        return;
    const char *why = msg && *msg ? msg : "refused (the reason is on standard error)";
    ci_tap_line(r, false, file, "load", why, false);
    if (r->tap)
        fflush(r->tap);
    if (!r->suites)
        return;
    ci_suite_open(r, file, 1, 0, 1, 0, 0);
    fputs("    <properties>\n", r->suites);
    ci_property(r->suites, "file", file);
    fputs("    </properties>\n", r->suites);
    ci_case(r->suites, file, "load", 0, "error", "load", why, why);
    ci_suite_close(r->suites, "", why);
}

void dsim_ci_skipped(dsim_ci_report *r, const char *name, const char *reason)
{
    if (!r)
        return;
    if (r->tap) {
        fprintf(r->tap, "ok %ld - ", ++r->tap_n);
        ci_tap_text(r->tap, name, true);
        fputs(": run # SKIP ", r->tap);
        ci_tap_text(r->tap, reason, false);
        fputc('\n', r->tap);
        fflush(r->tap);
    }
    if (!r->suites)
        return;
    ci_suite_open(r, name, 1, 0, 0, 1, 0);
    fputs("    <properties>\n", r->suites);
    ci_property(r->suites, "case", name);
    fputs("    </properties>\n", r->suites);
    ci_case(r->suites, name, "run", 0, "skipped", NULL, reason, NULL);
    ci_suite_close(r->suites, "", "");
}

/* Why a run could not be judged, or NULL when it could: the harness
 * failed, or the run did not end as passed or failed (hung: the watchdog
 * left workers running; its message names them). */
static const char *ci_not_judged(const dsim_harness_result *rep)
{
    if (rep->harness_error)
        return rep->harness_msg[0] ? rep->harness_msg : "the harness failed";
    if (rep->status != DSIM_RUN_PASSED && rep->status != DSIM_RUN_FAILED)
        return rep->train_msg[0] ? rep->train_msg : "the run did not end normally";
    return NULL;
}

void dsim_ci_run(dsim_ci_report *r, const char *file, const dsim_scenario *s,
                 const dsim_harness_result *rep)
{
    if (!r)
        return;
    const char *name = s && s->name ? s->name : file;
    const char *broken = ci_not_judged(rep);
    bool run_case = broken || rep->n_checks == 0;
    char train[700] = "";
    if (rep->train_err != DSIM_OK)
        snprintf(train, sizeof train, "the run ended with an error: %s", rep->train_msg);

    /* TAP, as each test is judged */
    for (size_t i = 0; i < rep->n_checks; i++) {
        const dsim_check_outcome *c = &rep->checks[i];
        char meas[32], exp[32], comment[1200];
        ci_num(meas, sizeof meas, c->result.measured);
        ci_num(exp, sizeof exp, c->result.expected);
        snprintf(comment, sizeof comment, "%s%sexpects %s, measured %s, expected %s: %s",
                 c->passed ? "" : "FAILED: ", c->by_default ? "judged by default, " : "",
                 c->expect_fail ? "fail" : "pass", meas, exp, c->result.message);
        ci_tap_line(r, c->passed, name, c->name, comment, ci_check_skipped(c));
    }
    if (run_case)
        ci_tap_line(r, !broken, name, "run",
                    broken ? broken
                           : "no checks: the scenario has no expect: section, nothing was judged",
                    false);
    if (r->tap)
        fflush(r->tap);
    if (!r->suites)
        return;

    long failures = 0, skipped = 0;
    for (size_t i = 0; i < rep->n_checks; i++) {
        failures += !rep->checks[i].passed;
        skipped += ci_check_skipped(&rep->checks[i]);
    }
    long tests = (long)rep->n_checks + (run_case ? 1 : 0);
    FILE *f = r->suites;
    ci_suite_open(r, name, tests, failures, broken ? 1 : 0, skipped, rep->wall_s);
    char num[64];
    fputs("    <properties>\n", f);
    ci_property(f, "file", file);
    if (s) {
        ci_property(f, "strategy", s->train.strategy);
        ci_property(f, "engine", dsim_scenario_engine(s));
        snprintf(num, sizeof num, "%" PRIu64, s->seed);
        ci_property(f, "seed", num);
    }
    snprintf(num, sizeof num, "%" PRId64, (int64_t)rep->run_id);
    ci_property(f, "run_id", num);
    ci_property(f, "status", ci_status(rep->status));
    snprintf(num, sizeof num, "%" PRIu64, rep->steps);
    ci_property(f, "steps", num);
    /* the checks judged by default (the scenario does not name them) */
    char byd[256] = "";
    for (size_t i = 0; i < rep->n_checks; i++)
        if (rep->checks[i].by_default && strlen(byd) + strlen(rep->checks[i].name) + 2 < sizeof byd)
            snprintf(byd + strlen(byd), sizeof byd - strlen(byd), "%s%s", byd[0] ? "," : "",
                     rep->checks[i].name);
    if (byd[0])
        ci_property(f, "checks_by_default", byd);
    fputs("    </properties>\n", f);
    for (size_t i = 0; i < rep->n_checks; i++) {
        const dsim_check_outcome *c = &rep->checks[i];
        if (ci_check_skipped(c)) {
            ci_case(f, name, c->name, 0, "skipped", NULL, c->result.message, NULL);
            continue;
        }
        if (c->passed) {
            ci_case(f, name, c->name, 0, NULL, NULL, NULL, NULL);
            continue;
        }
        char meas[32], exp[32], body[2048];
        ci_num(meas, sizeof meas, c->result.measured);
        ci_num(exp, sizeof exp, c->result.expected);
        snprintf(body, sizeof body, "%s: %s to %s; it %s (measured %s, expected %s)\n%s%s%s",
                 c->name,
                 c->by_default ? "judged by default (the scenario does not name it), expected"
                               : "the scenario expects it",
                 c->expect_fail ? "fail" : "pass", c->check_passed ? "passed" : "failed", meas, exp,
                 c->result.message, train[0] ? "\n" : "", train);
        ci_case(f, name, c->name, 0, "failure", c->expect_fail ? "expected_failure" : "check",
                c->result.message, body);
    }
    if (run_case) {
        if (broken)
            ci_case(f, name, "run", rep->wall_s, "error", "run", broken, broken);
        else
            ci_case(f, name, "run", rep->wall_s, NULL, NULL, NULL, NULL);
    }
    char *out = NULL;
    size_t out_len = 0;
    FILE *o = open_memstream(&out, &out_len);
    if (o) {
        if (rep->fault_summary[0])
            fprintf(o, "%s\n", rep->fault_summary);
        if (rep->timeline)
            fputs(rep->timeline, o);
        fprintf(o, "%s: %s; %" PRIu64 " steps, %.2f s", name, ci_status(rep->status), rep->steps,
                rep->wall_s);
        if (rep->run_id > 0)
            fprintf(o, "; run %" PRId64, (int64_t)rep->run_id);
        fclose(o);
    }
    char err[2400];
    snprintf(err, sizeof err, "%s%s%s%s%s", train, train[0] && rep->note[0] ? "\n" : "", rep->note,
             rep->harness_error && (train[0] || rep->note[0]) ? "\n" : "",
             rep->harness_error ? rep->harness_msg : "");
    ci_suite_close(f, out ? out : "", err);
    free(out);
}

/* ---- close ---- */

static int ci_junit_write(dsim_ci_report *r)
{
    if (fflush(r->suites) != 0)
        return -1;
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp", r->junit_path) < 0)
        return -1;
    FILE *f = fopen(tmp, "w");
    int bad = !f;
    if (f) {
        fprintf(f,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<testsuites name=\"dsim\" tests=\"%ld\" failures=\"%ld\" errors=\"%ld\" "
                "skipped=\"%ld\" time=\"%.3f\">\n",
                r->tests, r->failures, r->errors, r->skipped, r->time_s);
        fwrite(r->suites_buf, 1, r->suites_len, f);
        fputs("</testsuites>\n", f);
        bad = ferror(f) != 0;
        bad |= fclose(f) != 0;
    }
    if (!bad && rename(tmp, r->junit_path) != 0)
        bad = 1;
    if (bad) {
        int err = errno;
        unlink(tmp);
        errno = err;
    }
    free(tmp);
    return bad ? -1 : 0;
}

int dsim_ci_close(dsim_ci_report *r)
{
    if (!r)
        return 0;
    int rc = 0;
    if (r->tap) {
        fprintf(r->tap, "1..%ld\n", r->tap_n);
        if (fclose(r->tap) != 0) {
            fprintf(stderr, "%s: could not write the TAP stream: %s\n", r->cmd, strerror(errno));
            rc = 2;
        }
    }
    if (r->suites) {
        if (ci_junit_write(r) != 0) {
            fprintf(stderr, "%s: could not write the JUnit report '%s': %s\n", r->cmd,
                    r->junit_path, strerror(errno));
            rc = 2;
        }
        fclose(r->suites);
    }
    free(r->suites_buf);
    free(r->junit_path);
    free(r);
    return rc;
}
