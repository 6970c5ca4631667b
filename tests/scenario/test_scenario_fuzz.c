/* Hostile input: every prefix of a valid scenario, and byte-mutated copies
 * of it, must parse or be refused with DSIM_EINVAL and a FILE:LINE:COL
 * message; never crash, leak or read out of bounds (run under ASan/UBSan).
 * Files that parse are also planned when small enough to plan quickly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "scenario/plan.h"
#include "scenario/scenario.h"

static const char fuzz_base[] =
    "name: fuzz\n"
    "description: 'every section'\n"
    "seed: 7\n"
    "engine: threads\n"
    "cluster:\n"
    "  hosts: 2\n"
    "  devices_per_host: 2\n"
    "  network: {preset: custom, latency: 5us, bandwidth: 10GB/s}\n"
    "strategy:\n"
    "  name: multi_worker_mirrored\n"
    "  communication: ring\n"
    "  timeout: 30s\n"
    "  health_check: {interval: 30s, timeout: 10s, retries: 3}\n"
    "model:\n"
    "  kind: mlp\n"
    "  hidden: [16, 8]\n"
    "optimizer: {kind: momentum, learning_rate: 0.1, momentum: 0.9, nesterov: true,\n"
    "            global_clipnorm: 1.0, weight_decay: 0.01, gradient_accumulation_steps: 2,\n"
    "            schedule: {kind: piecewise_constant, boundaries: [4, 9], values: [0.1, 0.05, "
    "0.01]}}\n"
    "data:\n"
    "  examples: 64\n"
    "  features: 4\n"
    "  classes: 3\n"
    "  files: 4\n"
    "  shard_policy: auto\n"
    "  global_batch: 8\n"
    "  epochs: 2\n"
    "  shuffle: true\n"
    "checkpoint: {path: ckpt/fuzz.ckpt, every: 4}\n"
    "faults:\n"
    "  - {what: delay, at_step: 3, link: [0, 1], duration: 2ms}\n"
    "  - what: kill\n"
    "    at_time: 1.5s\n"
    "    rank: 3\n"
    "recovery: none\n"
    "expect:\n"
    "  gradient_consistency: {max_rel_error: 1e-4}\n"
    "  shard_coverage: {expect: fail}\n";

/* A small deterministic generator (splitmix64): the test must repeat. */
static uint64_t fuzz_state = 0x5eed5ca1ab1e;

static uint64_t fuzz_next(void)
{
    uint64_t z = (fuzz_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t fuzz_ok, fuzz_refused, fuzz_planned;

static void fuzz_one(const char *text, size_t len)
{
    dsim_scenario *s = NULL;
    dsim_err e = dsim_scenario_parse("f.yaml", text, len, &s);
    if (e == DSIM_OK) {
        assert_non_null(s);
        fuzz_ok++;
        (void)dsim_scenario_runnable(s);
        const dsim_train_cfg *t = &s->train;
        if (t->data.n_examples <= 4096 && t->hosts * t->devices_per_host <= 64 &&
            t->epochs <= 100) {
            json_t *j = NULL;
            dsim_err pe = dsim_scenario_plan(s, &j);
            assert_true(pe != DSIM_ENOMEM);
            assert_non_null(j);
            json_decref(j);
            fuzz_planned++;
        }
        dsim_scenario_free(s);
        return;
    }
    fuzz_refused++;
    assert_null(s);
    if (e != DSIM_EINVAL)
        fail_msg("error %d (%s) is not DSIM_EINVAL", (int)e, dsim_errmsg());
    const char *m = dsim_errmsg();
    int line = 0, col = 0, n = 0;
    if (sscanf(m, "f.yaml:%d:%d: %n", &line, &col, &n) != 2 || n == 0 || line < 1 || col < 1)
        fail_msg("no f.yaml:LINE:COL in: %s", m);
    /* the place is inside the text (or just past its end) */
    int lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    if (line > lines + 1)
        fail_msg("line %d is past the end (%d lines): %s", line, lines, m);
}

static void test_prefixes(void **state)
{
    (void)state;
    size_t n = strlen(fuzz_base);
    fuzz_ok = fuzz_refused = fuzz_planned = 0;
    /* the whole file is valid (the last fault makes it not runnable) */
    fuzz_one(fuzz_base, n);
    assert_int_equal(fuzz_ok, 1);
    assert_int_equal(fuzz_planned, 1);
    for (size_t len = 0; len < n; len++) {
        /* a copy of exactly len bytes, so ASan sees a read past the end */
        char *t = malloc(len ? len : 1);
        assert_non_null(t);
        memcpy(t, fuzz_base, len);
        fuzz_one(t, len);
        free(t);
    }
    assert_true(fuzz_refused > 0);
    assert_true(fuzz_ok > 1);
}

static void test_mutations(void **state)
{
    (void)state;
    static const char interesting[] = ":-[]{},&*!|>'\"#%@`\n\t 0123456789.eE\\";
    size_t n = strlen(fuzz_base);
    fuzz_ok = fuzz_refused = 0;
    for (int iter = 0; iter < 4000; iter++) {
        char *t = malloc(n + 8);
        assert_non_null(t);
        memcpy(t, fuzz_base, n);
        size_t len = n;
        int edits = 1 + (int)(fuzz_next() % 3);
        for (int k = 0; k < edits; k++) {
            size_t at = fuzz_next() % len;
            uint64_t how = fuzz_next() % 4;
            unsigned char b =
                how == 0 ? (unsigned char)(fuzz_next() & 0xff)
                         : (unsigned char)interesting[fuzz_next() % (sizeof interesting - 1)];
            if (how == 3 && len > 1) { /* delete a byte */
                memmove(t + at, t + at + 1, len - at - 1);
                len--;
            } else if (how == 2 && len < n + 7) { /* insert */
                memmove(t + at + 1, t + at, len - at);
                t[at] = (char)b;
                len++;
            } else {
                t[at] = (char)b;
            }
        }
        fuzz_one(t, len);
        free(t);
    }
    /* both outcomes happen: the mutations are neither all harmless nor all fatal */
    assert_true(fuzz_ok > 0);
    assert_true(fuzz_refused > 0);
}

/* Shapes a byte mutation rarely makes. */
static void test_odd_shapes(void **state)
{
    (void)state;
    static const char *const odd[] = {
        "\0",
        "name: a\0b\n",
        "\xef\xbb\xbfname: bom\n",
        "name: a\r\nseed: 2\r\n",
        "{name: a, cluster: {hosts: 1}}",
        "[",
        "]",
        "{",
        "}",
        "name: [",
        "name: {a: b}",
        "name: a\nexpect: {error: ''}\n",
        "name: a\nmodel: {hidden: []}\n",
        "name: a\nmodel: {kind: mlp, hidden: []}\n",
        "name: a\nfaults: [[]]\n",
        "name: a\nfaults: [{what: kill, at_step: 1, rank: 0, link: 5}]\n",
        "name: a\nfaults: [{what: drop, at_step: 1, link: [0]}]\n",
        "name: a\ncluster: {tf_config: [1, 2]}\n",
        "name: a\ncluster: {tf_config: ''}\n",
        "name: a\ncluster: {tf_config: {cluster: {worker: [{a: 1}]}}}\n",
        "%YAML 1.1\n---\nname: a\n",
        "--- |\n  text\n",
        "name: >\n  folded\n",
        "? name\n: a\n",
        "name: a\n...\n",
        "name: a\n--- \n",
        "&a name: b\n",
        "!t {}\n",
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        size_t len = strlen(odd[i]);
        fuzz_one(odd[i], len ? len : 1);
    }
    /* a deep flow nest and a long line */
    size_t deep = 100000;
    char *t = malloc(deep * 2 + 16);
    assert_non_null(t);
    size_t o = (size_t)sprintf(t, "name: a\nx: ");
    for (size_t i = 0; i < deep; i++)
        t[o++] = '[';
    for (size_t i = 0; i < deep; i++)
        t[o++] = ']';
    fuzz_one(t, o);
    memset(t, 'a', deep);
    memcpy(t, "name: ", 6);
    fuzz_one(t, deep);
    free(t);
    /* over the size limit */
    size_t big = (1u << 20) + 1;
    t = calloc(big, 1);
    assert_non_null(t);
    memset(t, '#', big);
    dsim_scenario *s = NULL;
    assert_int_equal(dsim_scenario_parse("f.yaml", t, big, &s), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "f.yaml:1:1: the file is"));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_odd_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
