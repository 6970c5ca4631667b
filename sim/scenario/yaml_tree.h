/* A YAML document as a small tree of mappings, sequences and scalars, each
 * with its 1-based line and column, built from libyaml's events.
 *
 * What is refused (DSIM_EINVAL, "FILE:LINE:COL: ..."):
 *   - syntax errors (libyaml's problem and its mark);
 *   - anchors (&a) and aliases (*a): a scenario is short enough to write out,
 *     and an alias can make a node its own ancestor or expand a small file
 *     into a huge tree;
 *   - explicit tags (!!str, !foo): types follow from the key;
 *   - a key that is not a scalar, and mappings nested deeper than
 *     DSIM_YAML_MAX_DEPTH;
 *   - more than one document in a file.
 * An empty stream (no document, or only comments) gives *root == NULL. */
#ifndef DSIM_SCENARIO_YAML_TREE_H
#define DSIM_SCENARIO_YAML_TREE_H

#include <stdbool.h>
#include <stddef.h>

#include "dsim/err.h"

#define DSIM_YAML_MAX_DEPTH 32

typedef enum dsim_yaml_kind {
    DSIM_YAML_SCALAR,
    DSIM_YAML_MAP, /* kid[2i] is a key (a scalar), kid[2i+1] its value */
    DSIM_YAML_SEQ,
} dsim_yaml_kind;

typedef struct dsim_yaml_node {
    dsim_yaml_kind kind;
    int line, column; /* 1-based */
    /* scalar: the text (NUL-terminated; len excludes the NUL, and the text
     * may hold NUL bytes of its own from "\0" escapes) */
    char *s;
    size_t len;
    bool plain; /* written without quotes or block indicators */
    struct dsim_yaml_node **kid;
    size_t n, cap;
} dsim_yaml_node;

/* Parses len bytes of text; path is used in messages only. */
dsim_err dsim_yaml_parse(const char *path, const char *text, size_t len, dsim_yaml_node **root);
void dsim_yaml_free(dsim_yaml_node *n);

/* After a syntax error at err_line: the first line up to it whose
 * indentation is off (a key indented unlike its siblings, between two
 * levels, or deeper than a key whose value is given; a tab), with where
 * (*line, *col) and a sentence saying so and what to do; false when the
 * indentation looks right (yaml_indent.c). */
bool dsim_yaml_indent_hint(const char *text, size_t len, int err_line, int *line, int *col,
                           char *msg, size_t cap);

/* A plain scalar YAML reads as null: empty, ~, null, Null, NULL. */
bool dsim_yaml_is_null(const dsim_yaml_node *n);

/* A deep copy of n, positions included; NULL when memory ran out. */
dsim_yaml_node *dsim_yaml_copy(const dsim_yaml_node *n);
/* The value of key in mapping map, or NULL. */
dsim_yaml_node *dsim_yaml_map_get(const dsim_yaml_node *map, const char *key);
/* Sets key in mapping map to value (taking value over: freed on failure),
 * replacing what was there; a new key node takes value's position.
 * DSIM_ENOMEM when memory ran out. */
dsim_err dsim_yaml_map_set(dsim_yaml_node *map, const char *key, dsim_yaml_node *value);

/* Removes key (and its value) from mapping map; false when it was not
 * there. */
bool dsim_yaml_map_del(dsim_yaml_node *map, const char *key);
/* A new plain scalar holding text (NULL when memory ran out). */
dsim_yaml_node *dsim_yaml_scalar(const char *text);
/* The tree as YAML text that dsim_yaml_parse reads back to the same tree
 * (positions aside): block mappings at the top, a collection of scalars
 * (and a sequence's items) in flow style, scalars plain where the source
 * had them plain and nothing in them would read otherwise, double-quoted
 * with escapes elsewhere. Comments are not kept. NULL when memory ran out;
 * the caller frees the text. */
char *dsim_yaml_emit(const dsim_yaml_node *root);

#endif
