/* Which line's indentation a YAML syntax error comes from (yaml_tree.h).
 *
 * libyaml reports a key indented wrongly where it stops understanding the
 * block, which is often the line after it: in
 *
 *   4  cluster:
 *   5   hosts: 2               <- one space in: the block's keys are 1 in
 *   6    devices_per_host: 2   <- read as more of the value '2 devices...'
 *
 * it says "mapping values are not allowed in this context" at 6:19. This
 * reads the lines up to the error as YAML's block structure does, with the
 * step the rest of the file indents by (the most common one), and names the
 * first key that sits off it: a first key of a block indented by another
 * step than its siblings after it, a key between two levels, or a key
 * deeper than the key above it, whose value is already given. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenario/yaml_tree.h"

typedef struct yi_line {
    int no;     /* 1-based */
    int indent; /* leading spaces */
    bool tab;   /* a tab in the leading whitespace */
    bool open;  /* "key:" with no value on the line: a block follows */
    bool key;   /* looks like "key: ..." */
    bool seq;   /* "- ..." */
    bool block_scalar;
    const char *text;
    size_t len;
} yi_line;

/* The lines that mean something (not blank, not only a comment), with
 * block scalars' bodies left out; at most `max` of them. */
static size_t yi_lines(const char *text, size_t len, yi_line *out, size_t max)
{
    size_t n = 0;
    int no = 0, scalar_body = -1; /* the indent of a block scalar's key */
    for (size_t i = 0; i < len && n < max;) {
        size_t end = i;
        while (end < len && text[end] != '\n')
            end++;
        no++;
        yi_line l = {.no = no, .text = text + i, .len = end - i};
        size_t k = i;
        while (k < end && (text[k] == ' ' || text[k] == '\t')) {
            l.tab = l.tab || text[k] == '\t';
            k++;
        }
        l.indent = (int)(k - i);
        bool blank = k == end || text[k] == '#' || (end - k == 1 && text[k] == '\r');
        if (!blank && scalar_body >= 0 && l.indent > scalar_body) {
            i = end + 1;
            continue; /* a line of a block scalar's text */
        }
        scalar_body = -1;
        if (!blank) {
            l.seq = text[k] == '-' && (k + 1 == end || text[k + 1] == ' ');
            size_t q = l.seq ? k + 2 : k;
            /* a plain key: up to ": " or ":" at the end */
            if (q < end && !strchr("{[\"'#&*!|>%@`", text[q])) {
                size_t c = q;
                while (c < end && !(text[c] == ':' &&
                                    (c + 1 == end || text[c + 1] == ' ' || text[c + 1] == '\r')))
                    c++;
                if (c < end) {
                    l.key = true;
                    size_t v = c + 1;
                    while (v < end && (text[v] == ' ' || text[v] == '\r'))
                        v++;
                    l.open = v == end || text[v] == '#';
                    l.block_scalar = v < end && (text[v] == '|' || text[v] == '>');
                }
            }
            if (l.block_scalar)
                scalar_body = l.indent;
            out[n++] = l;
        }
        i = end + 1;
    }
    return n;
}

/* The step the other blocks of the file (not the one under line `skip`)
 * are indented by, the most common one (2 when none says). */
static int yi_step(const yi_line *l, size_t n, size_t skip)
{
    int count[17] = {0};
    for (size_t i = 0; i + 1 < n; i++)
        if (i != skip && l[i].open && l[i + 1].indent > l[i].indent &&
            l[i + 1].indent - l[i].indent <= 16)
            count[l[i + 1].indent - l[i].indent]++;
    int best = 2;
    for (int s = 1; s <= 16; s++)
        if (count[s] > count[best])
            best = s;
    return best;
}

static void yi_name(const yi_line *l, char *buf, size_t cap)
{
    const char *p = l->text + l->indent + (l->seq ? 2 : 0);
    size_t k = 0;
    while (p + k < l->text + l->len && p[k] != ':' && k < 40)
        k++;
    snprintf(buf, cap, "%.*s", (int)k, p);
}

/* Whether a line after i in i's block (up to the error and one more) sits
 * at `want`. */
static bool yi_sibling_at(const yi_line *l, size_t n, size_t i, int parent_indent, int want,
                          int err_line)
{
    for (size_t k = i + 1; k < n && l[k].no <= err_line + 1; k++) {
        if (l[k].indent <= parent_indent)
            return false;
        if (l[k].indent == want && l[k].key)
            return true;
    }
    return false;
}

bool dsim_yaml_indent_hint(const char *text, size_t len, int err_line, int *line, int *col,
                           char *msg, size_t cap)
{
    enum { YI_MAX = 4096, YI_DEPTH = 64 };
    yi_line *l = malloc(YI_MAX * sizeof *l);
    if (!l)
        return false;
    size_t n = yi_lines(text, len, l, YI_MAX);
    int levels[YI_DEPTH] = {0};
    int depth = 1; /* levels[0]: the top level, 0 in */
    bool found = false;
    char name[48], pname[48];
    for (size_t i = 0; i < n && l[i].no <= err_line && !found; i++) {
        const yi_line *x = &l[i];
        if (x->tab) {
            *line = x->no;
            *col = 1;
            snprintf(msg, cap, "the indentation holds a tab; YAML indents with spaces only");
            found = true;
            break;
        }
        const yi_line *prev = i ? &l[i - 1] : NULL;
        yi_name(x, name, sizeof name);
        if (prev && prev->open &&
            (x->indent > prev->indent || (x->seq && x->indent == prev->indent))) {
            /* the first line of a block: its indent is the block's */
            int step = yi_step(l, n, i - 1);
            int want = prev->indent + step;
            if (x->key && x->indent != want && x->indent > prev->indent &&
                yi_sibling_at(l, n, i, prev->indent, want, err_line)) {
                yi_name(prev, pname, sizeof pname);
                *line = x->no;
                *col = x->indent + 1;
                snprintf(msg, cap,
                         "the indentation: '%s' is %d space%s in, where the other keys of '%s' "
                         "(line %d) are %d in; indent it like them",
                         name, x->indent, x->indent == 1 ? "" : "s", pname, prev->no, want);
                found = true;
                break;
            }
            if (depth < YI_DEPTH)
                levels[depth++] = x->indent;
            if (x->seq && x->key && depth < YI_DEPTH)
                levels[depth++] = x->indent + 2; /* the item's mapping */
            continue;
        }
        while (depth > 1 && levels[depth - 1] > x->indent)
            depth--;
        if (levels[depth - 1] == x->indent) {
            if (x->seq && x->key && depth < YI_DEPTH)
                levels[depth++] = x->indent + 2;
            continue;
        }
        if (!x->key)
            continue; /* more of a plain value, on a line of its own */
        *line = x->no;
        *col = x->indent + 1;
        if (x->indent > levels[depth - 1] && prev && prev->indent == levels[depth - 1])
            snprintf(msg, cap,
                     "the indentation: '%s' is %d space%s in, deeper than the key above it "
                     "(line %d, %d in), whose value is already given; indent it like that key",
                     name, x->indent, x->indent == 1 ? "" : "s", prev->no, prev->indent);
        else
            snprintf(msg, cap,
                     "the indentation: '%s' is %d space%s in, between the levels around it "
                     "(%d and %d); indent it like the other keys of its section",
                     name, x->indent, x->indent == 1 ? "" : "s", levels[depth - 1],
                     levels[depth - 1] + yi_step(l, n, n));
        found = true;
    }
    free(l);
    return found;
}
