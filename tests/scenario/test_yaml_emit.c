/* The YAML tree written back as text (dsim_yaml_emit, what dsim explore
 * --shapes writes): parsed again it is the same tree, for awkward scalars
 * and for every scenario of the catalogue, and the catalogue's scenarios
 * load from it as from their files.
 *
 * usage: test_yaml_emit SCENARIO_DIR */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "scenario/scenario.h"
#include "scenario/yaml_tree.h"

static const char *te_dir;

/* Same kinds, same keys and scalars, same order. */
static void te_same(const dsim_yaml_node *a, const dsim_yaml_node *b, const char *where)
{
    if (!a || !b) {
        if (a != b)
            fail_msg("%s: one tree is empty", where);
        return;
    }
    if (a->kind != b->kind || a->n != b->n)
        fail_msg("%s: line %d: kind %d/%d, %zu/%zu children", where, a->line, a->kind, b->kind,
                 a->n, b->n);
    if (a->kind == DSIM_YAML_SCALAR) {
        if (a->len != b->len || memcmp(a->s, b->s, a->len) != 0)
            fail_msg("%s: line %d: scalar '%s' came back as '%s'", where, a->line, a->s, b->s);
        /* a plain null stays a null, a quoted "null" a string */
        if (dsim_yaml_is_null(a) != dsim_yaml_is_null(b))
            fail_msg("%s: line %d: '%s' changed between null and text", where, a->line, a->s);
    }
    for (size_t i = 0; i < a->n; i++)
        te_same(a->kid[i], b->kid[i], where);
}

static char *te_roundtrip(const char *where, const char *text)
{
    dsim_yaml_node *a = NULL, *b = NULL;
    if (dsim_yaml_parse(where, text, strlen(text), &a) != DSIM_OK)
        fail_msg("%s does not parse: %s", where, dsim_errmsg());
    char *out = dsim_yaml_emit(a);
    assert_non_null(out);
    if (dsim_yaml_parse(where, out, strlen(out), &b) != DSIM_OK)
        fail_msg("%s written back does not parse: %s\n%s", where, dsim_errmsg(), out);
    te_same(a, b, where);
    dsim_yaml_free(a);
    dsim_yaml_free(b);
    return out;
}

static void test_awkward_scalars(void **state)
{
    (void)state;
    static const char text[] = "name: \"a: b # c\"\n"
                               "description: 'it''s \"quoted\", with [brackets] and {braces}'\n"
                               "empty: \"\"\n"
                               "nothing: ~\n"
                               "null_text: \"null\"\n"
                               "dash: \"- not a list\"\n"
                               "negative: -5\n"
                               "colon_end: \"ends:\"\n"
                               "tab: \"a\\tb\"\n"
                               "newline: \"two\\nlines\"\n"
                               "unicode: \"\xc3\xa9t\xc3\xa9\"\n"
                               "list: [1, \"two, three\", {k: v}]\n"
                               "nested:\n"
                               "  deeper: {a: 1, b: [x, y]}\n"
                               "  items:\n"
                               "    - {what: kill, at_step: 3}\n"
                               "    - [1, 2]\n"
                               "  seq_of_maps_of_maps:\n"
                               "    - {a: {b: c}}\n";
    free(te_roundtrip("awkward", text));
}

/* Every catalogue scenario: the same tree, and the same scenario loaded. */
static void te_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *out = te_roundtrip(path, text);
    dsim_scenario *a = NULL, *b = NULL;
    if (dsim_scenario_parse(path, text, n, &a) == DSIM_OK) {
        if (dsim_scenario_parse(path, out, strlen(out), &b) != DSIM_OK)
            fail_msg("%s written back does not load: %s\n%s", path, dsim_errmsg(), out);
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->seed, b->seed);
        assert_int_equal(a->train.hosts, b->train.hosts);
        assert_int_equal(a->train.devices_per_host, b->train.devices_per_host);
        assert_string_equal(a->train.strategy, b->train.strategy);
        assert_int_equal(a->n_faults, b->n_faults);
        assert_int_equal(a->n_expect, b->n_expect);
        assert_int_equal(a->n_combinations, b->n_combinations);
        dsim_scenario_free(b);
    }
    dsim_scenario_free(a);
    free(out);
}

static int te_files_in(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        fail_msg("cannot open %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".yaml") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        te_file(path);
        n++;
    }
    closedir(d);
    return n;
}

static void test_catalogue(void **state)
{
    (void)state;
    char sub[4096];
    int n = te_files_in(te_dir);
    snprintf(sub, sizeof sub, "%s/faults", te_dir);
    n += te_files_in(sub);
    assert_true(n >= 30); /* the catalogue and its faults */
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_yaml_emit SCENARIO_DIR\n");
        return 2;
    }
    te_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awkward_scalars),
        cmocka_unit_test(test_catalogue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
