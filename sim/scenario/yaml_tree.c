/* Builds a dsim_yaml_node tree from libyaml's event stream (see
 * yaml_tree.h). The event API, not the document API, because the document
 * loader resolves aliases silently and we want to refuse them with their
 * position. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "scenario/yaml_tree.h"

static dsim_err ytree_fail(const char *path, int line, int col, const char *fmt, const char *a,
                           const char *b)
{
    char msg[400];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    return DSIM_ERR(DSIM_EINVAL, -1, "%s:%d:%d: %s", path, line, col, msg);
}

/* libyaml's reader errors carry a byte offset, not a mark. */
static void ytree_offset_pos(const char *text, size_t len, size_t off, int *line, int *col)
{
    int l = 1, c = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (text[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int ytree_mark_line(yaml_mark_t m)
{
    return m.line < 1000000000 ? (int)m.line + 1 : 1000000000;
}

static int ytree_mark_col(yaml_mark_t m)
{
    return m.column < 1000000000 ? (int)m.column + 1 : 1000000000;
}

static dsim_err ytree_syntax(const char *path, const char *text, size_t len, const yaml_parser_t *p)
{
    int line, col;
    const char *problem = p->problem ? p->problem : "unreadable YAML";
    char what[300];
    switch (p->error) {
    case YAML_MEMORY_ERROR:
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory while reading the YAML", path);
    case YAML_READER_ERROR:
        ytree_offset_pos(text, len, p->problem_offset, &line, &col);
        if (p->problem_value != -1)
            snprintf(what, sizeof what, "%s (byte 0x%02x); a scenario file is UTF-8 text", problem,
                     (unsigned)p->problem_value & 0xff);
        else
            snprintf(what, sizeof what, "%s; a scenario file is UTF-8 text", problem);
        return ytree_fail(path, line, col, "YAML syntax: %s%s", what, NULL);
    default:
        line = ytree_mark_line(p->problem_mark);
        col = ytree_mark_col(p->problem_mark);
        if (p->context)
            snprintf(what, sizeof what, "%s (%s at line %d, column %d)", problem, p->context,
                     ytree_mark_line(p->context_mark), ytree_mark_col(p->context_mark));
        else
            snprintf(what, sizeof what, "%s", problem);
        /* A key indented wrongly is often reported on the line after it:
         * point at the line that is off, and keep libyaml's words. */
        int hl, hc;
        char hint[300];
        if (p->error == YAML_SCANNER_ERROR || p->error == YAML_PARSER_ERROR) {
            if (dsim_yaml_indent_hint(text, len, line, &hl, &hc, hint, sizeof hint)) {
                char both[700];
                snprintf(both, sizeof both, "%s (YAML syntax at line %d, column %d: %s)", hint,
                         line, col, what);
                return DSIM_ERR(DSIM_EINVAL, -1, "%s:%d:%d: %s", path, hl, hc, both);
            }
        }
        return ytree_fail(path, line, col, "YAML syntax: %s%s", what, NULL);
    }
}

void dsim_yaml_free(dsim_yaml_node *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n; i++)
        dsim_yaml_free(n->kid[i]);
    free(n->kid);
    free(n->s);
    free(n);
}

bool dsim_yaml_is_null(const dsim_yaml_node *n)
{
    if (!n || n->kind != DSIM_YAML_SCALAR || !n->plain)
        return false;
    return n->len == 0 || strcmp(n->s, "~") == 0 || strcmp(n->s, "null") == 0 ||
           strcmp(n->s, "Null") == 0 || strcmp(n->s, "NULL") == 0;
}

dsim_yaml_node *dsim_yaml_copy(const dsim_yaml_node *n)
{
    if (!n)
        return NULL;
    dsim_yaml_node *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->kind = n->kind;
    c->line = n->line;
    c->column = n->column;
    c->plain = n->plain;
    c->len = n->len;
    if (n->s) {
        c->s = malloc(n->len + 1);
        if (!c->s) {
            free(c);
            return NULL;
        }
        memcpy(c->s, n->s, n->len + 1);
    }
    if (n->n) {
        c->kid = calloc(n->n, sizeof *c->kid);
        if (!c->kid) {
            dsim_yaml_free(c);
            return NULL;
        }
        c->cap = n->n;
        for (size_t i = 0; i < n->n; i++) {
            if (!(c->kid[i] = dsim_yaml_copy(n->kid[i]))) {
                dsim_yaml_free(c);
                return NULL;
            }
            c->n = i + 1;
        }
    }
    return c;
}

dsim_yaml_node *dsim_yaml_map_get(const dsim_yaml_node *map, const char *key)
{
    if (!map || map->kind != DSIM_YAML_MAP || !key)
        return NULL;
    size_t kl = strlen(key);
    for (size_t p = 0; p + 1 < map->n; p += 2)
        if (map->kid[p]->len == kl && strcmp(map->kid[p]->s, key) == 0)
            return map->kid[p + 1];
    return NULL;
}

dsim_err dsim_yaml_map_set(dsim_yaml_node *map, const char *key, dsim_yaml_node *value)
{
    size_t kl = strlen(key);
    for (size_t p = 0; p + 1 < map->n; p += 2) {
        if (map->kid[p]->len == kl && strcmp(map->kid[p]->s, key) == 0) {
            dsim_yaml_free(map->kid[p + 1]);
            map->kid[p + 1] = value;
            return DSIM_OK;
        }
    }
    dsim_yaml_node *k = calloc(1, sizeof *k);
    if (k)
        k->s = strdup(key);
    if (!k || !k->s || map->n + 2 > map->cap) {
        size_t cap = map->cap ? map->cap * 2 : 8;
        while (cap < map->n + 2)
            cap *= 2;
        dsim_yaml_node **kids = k && k->s ? realloc(map->kid, cap * sizeof *kids) : NULL;
        if (!kids) {
            dsim_yaml_free(k);
            dsim_yaml_free(value);
            return DSIM_ERR(DSIM_ENOMEM, -1, "out of memory building a scenario");
        }
        map->kid = kids;
        map->cap = cap;
    }
    k->kind = DSIM_YAML_SCALAR;
    k->plain = true;
    k->len = kl;
    k->line = value->line;
    k->column = value->column;
    map->kid[map->n++] = k;
    map->kid[map->n++] = value;
    return DSIM_OK;
}

static dsim_err ytree_add(const char *path, dsim_yaml_node *parent, dsim_yaml_node *kid)
{
    if (parent->kind == DSIM_YAML_MAP && parent->n % 2 == 0 && kid->kind != DSIM_YAML_SCALAR)
        return ytree_fail(path, kid->line, kid->column,
                          "a key must be a plain word such as 'hosts', not a %s%s",
                          kid->kind == DSIM_YAML_MAP ? "mapping" : "list", NULL);
    if (parent->n == parent->cap) {
        size_t cap = parent->cap ? parent->cap * 2 : 8;
        dsim_yaml_node **k = realloc(parent->kid, cap * sizeof *k);
        if (!k)
            return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory while reading the YAML", path);
        parent->kid = k;
        parent->cap = cap;
    }
    parent->kid[parent->n++] = kid;
    return DSIM_OK;
}

static dsim_yaml_node *ytree_node(dsim_yaml_kind kind, yaml_mark_t m)
{
    dsim_yaml_node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->kind = kind;
    n->line = ytree_mark_line(m);
    n->column = ytree_mark_col(m);
    return n;
}

/* Anchors and tags on a node are refused; returns DSIM_OK if it has none. */
static dsim_err ytree_plain_node(const char *path, const yaml_event_t *ev,
                                 const yaml_char_t *anchor, const yaml_char_t *tag)
{
    int line = ytree_mark_line(ev->start_mark), col = ytree_mark_col(ev->start_mark);
    if (anchor)
        return ytree_fail(path, line, col,
                          "anchors (&%.40s) and aliases are not supported in scenario files; "
                          "write the value out%s",
                          (const char *)anchor, NULL);
    if (tag)
        return ytree_fail(path, line, col,
                          "tags (%.40s) are not supported in scenario files; remove it (each "
                          "key's type is fixed)%s",
                          (const char *)tag, NULL);
    return DSIM_OK;
}

dsim_err dsim_yaml_parse(const char *path, const char *text, size_t len, dsim_yaml_node **root)
{
    *root = NULL;
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory starting the YAML parser", path);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    yaml_parser_set_encoding(&p, YAML_UTF8_ENCODING);

    dsim_yaml_node *stack[DSIM_YAML_MAX_DEPTH + 1];
    int depth = 0;
    dsim_yaml_node *doc = NULL;
    int docs = 0;
    dsim_err e = DSIM_OK;
    bool done = false;
    while (!done && e == DSIM_OK) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            e = ytree_syntax(path, text, len, &p);
            break;
        }
        dsim_yaml_node *n = NULL;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1)
                e = ytree_fail(path, ytree_mark_line(ev.start_mark), ytree_mark_col(ev.start_mark),
                               "a second YAML document ('---'); one file holds one scenario%s%s",
                               NULL, NULL);
            break;
        case YAML_ALIAS_EVENT:
            e = ytree_fail(path, ytree_mark_line(ev.start_mark), ytree_mark_col(ev.start_mark),
                           "aliases (*%.40s) and anchors are not supported in scenario files; "
                           "write the value out%s",
                           (const char *)ev.data.alias.anchor, NULL);
            break;
        case YAML_SCALAR_EVENT:
            e = ytree_plain_node(path, &ev, ev.data.scalar.anchor, ev.data.scalar.tag);
            if (e != DSIM_OK)
                break;
            n = ytree_node(DSIM_YAML_SCALAR, ev.start_mark);
            if (n) {
                n->len = ev.data.scalar.length;
                n->s = malloc(n->len + 1);
                if (n->s) {
                    memcpy(n->s, ev.data.scalar.value, n->len);
                    n->s[n->len] = '\0';
                }
                n->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
            }
            if (!n || !n->s) {
                dsim_yaml_free(n);
                n = NULL;
                e = DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory while reading the YAML", path);
            }
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
            bool map = ev.type == YAML_MAPPING_START_EVENT;
            e = ytree_plain_node(path, &ev,
                                 map ? ev.data.mapping_start.anchor : ev.data.sequence_start.anchor,
                                 map ? ev.data.mapping_start.tag : ev.data.sequence_start.tag);
            if (e != DSIM_OK)
                break;
            if (depth == DSIM_YAML_MAX_DEPTH) {
                e = ytree_fail(path, ytree_mark_line(ev.start_mark), ytree_mark_col(ev.start_mark),
                               "nested deeper than %s levels; a scenario needs a few%s", "32",
                               NULL);
                break;
            }
            n = ytree_node(map ? DSIM_YAML_MAP : DSIM_YAML_SEQ, ev.start_mark);
            if (!n)
                e = DSIM_ERR(DSIM_ENOMEM, -1, "%s: out of memory while reading the YAML", path);
            break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            if (depth > 0)
                depth--;
            break;
        default: /* stream start, document end */
            break;
        }
        if (n) {
            if (depth > 0) {
                e = ytree_add(path, stack[depth - 1], n);
                if (e != DSIM_OK)
                    dsim_yaml_free(n);
            } else if (!doc) {
                doc = n;
            } else {
                dsim_yaml_free(n); /* cannot happen: a document has one root */
                n = NULL;
            }
            if (e == DSIM_OK && n && n->kind != DSIM_YAML_SCALAR)
                stack[depth++] = n;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    if (e != DSIM_OK) {
        dsim_yaml_free(doc);
        return e;
    }
    *root = doc;
    return DSIM_OK;
}

bool dsim_yaml_map_del(dsim_yaml_node *map, const char *key)
{
    size_t kl = strlen(key);
    for (size_t p = 0; p + 1 < map->n; p += 2) {
        if (map->kid[p]->len == kl && strcmp(map->kid[p]->s, key) == 0) {
            dsim_yaml_free(map->kid[p]);
            dsim_yaml_free(map->kid[p + 1]);
            memmove(&map->kid[p], &map->kid[p + 2], (map->n - p - 2) * sizeof *map->kid);
            map->n -= 2;
            return true;
        }
    }
    return false;
}

dsim_yaml_node *dsim_yaml_scalar(const char *text)
{
    dsim_yaml_node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->kind = DSIM_YAML_SCALAR;
    n->plain = true;
    n->s = strdup(text);
    if (!n->s) {
        free(n);
        return NULL;
    }
    n->len = strlen(text);
    return n;
}

/* ---- writing a tree back as text ---- */

/* Whether a scalar may be written plain here (in flow: inside [ ] or { }). */
static bool ytree_plain_ok(const dsim_yaml_node *n, bool flow)
{
    if (!n->plain || n->len == 0 || n->len != strlen(n->s))
        return false;
    const char *s = n->s;
    if (strchr(",[]{}#&*!|>'\"%@` \t", s[0]))
        return false;
    if (strchr("-?:", s[0]) && (s[1] == '\0' || s[1] == ' '))
        return false;
    if (s[n->len - 1] == ' ' || s[n->len - 1] == ':')
        return false;
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return false;
        if ((p[0] == ':' && p[1] == ' ') || (p[0] == ' ' && p[1] == '#'))
            return false;
        if (flow && strchr(",[]{}", *p))
            return false;
    }
    return true;
}

static void ytree_scalar(FILE *f, const dsim_yaml_node *n, bool flow)
{
    if (ytree_plain_ok(n, flow)) {
        fputs(n->s, f);
        return;
    }
    fputc('"', f);
    for (size_t i = 0; i < n->len; i++) {
        unsigned char c = (unsigned char)n->s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void ytree_flow(FILE *f, const dsim_yaml_node *n)
{
    if (n->kind == DSIM_YAML_SCALAR) {
        ytree_scalar(f, n, true);
        return;
    }
    bool map = n->kind == DSIM_YAML_MAP;
    fputc(map ? '{' : '[', f);
    for (size_t i = 0; i < n->n; i++) {
        if (i)
            fputs(map && i % 2 ? ": " : ", ", f);
        ytree_flow(f, n->kid[i]);
    }
    fputc(map ? '}' : ']', f);
}

/* A collection whose items are all scalars. */
static bool ytree_leaf(const dsim_yaml_node *n)
{
    for (size_t i = 0; i < n->n; i++)
        if (n->kid[i]->kind != DSIM_YAML_SCALAR)
            return false;
    return true;
}

static void ytree_block(FILE *f, const dsim_yaml_node *n, int indent)
{
    if (n->kind == DSIM_YAML_SEQ) {
        for (size_t i = 0; i < n->n; i++) {
            fprintf(f, "%*s- ", indent, "");
            ytree_flow(f, n->kid[i]);
            fputc('\n', f);
        }
        return;
    }
    for (size_t p = 0; p + 1 < n->n; p += 2) {
        const dsim_yaml_node *v = n->kid[p + 1];
        fprintf(f, "%*s", indent, "");
        ytree_scalar(f, n->kid[p], false);
        fputc(':', f);
        if (v->kind == DSIM_YAML_SCALAR || v->n == 0 ||
            (v->kind == DSIM_YAML_MAP && ytree_leaf(v)) ||
            (v->kind == DSIM_YAML_SEQ && ytree_leaf(v))) {
            fputc(' ', f);
            ytree_flow(f, v);
            fputc('\n', f);
        } else {
            fputc('\n', f);
            ytree_block(f, v, indent + 2);
        }
    }
}

char *dsim_yaml_emit(const dsim_yaml_node *root)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    if (!root)
        fputs("{}\n", f);
    else if (root->kind == DSIM_YAML_SEQ || root->kind == DSIM_YAML_MAP)
        ytree_block(f, root, 0);
    else {
        ytree_scalar(f, root, false);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
