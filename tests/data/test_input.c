/* The input pipeline: batch_sizes_for_worker, shard policies, the iterator
 * against a literal model of TF's dataset ops, coverage, shuffling, the
 * partial last batch, epochs and the plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <cmocka.h>

#include "dsim/data.h"
#include "dsim/err.h"
#include "dsim/rng.h"

/* ---- helpers ------------------------------------------------------------- */

static dsim_input_config cfg_make(const dsim_dataset_desc *d, dsim_shard_policy p, int64_t g, int w,
                                  int r)
{
    return (dsim_input_config){.dataset = d,
                               .policy = p,
                               .global_batch = g,
                               .num_workers = w,
                               .replicas_per_worker = r,
                               .worker = 0,
                               .seed = 42,
                               .shuffle = false,
                               .drop_remainder = false,
                               .epochs = 1};
}

static void assert_msg_has(const char *needle)
{
    if (strstr(dsim_errmsg(), needle) == NULL)
        fail_msg("error message \"%s\" lacks \"%s\"", dsim_errmsg(), needle);
}

/* Expects one step of worker `in` to hand replica r exactly ids[r]. */
static void expect_step(dsim_input *in, int replicas, const int64_t *const *ids, const int *n)
{
    dsim_input_step st;
    assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
    assert_false(st.done);
    assert_int_equal(st.replicas, replicas);
    for (int r = 0; r < replicas; r++) {
        assert_int_equal(st.batch[r].n, n[r]);
        for (int k = 0; k < n[r]; k++)
            assert_int_equal(st.batch[r].ids[k], ids[r][k]);
    }
}

/* ---- batch_sizes_for_worker ----------------------------------------------- */

static void test_batch_sizes_tf_examples(void **state)
{
    (void)state;
    int64_t s[4];
    assert_int_equal(dsim_batch_sizes_for_worker(7, 2, 2, 0, s), DSIM_OK);
    assert_int_equal(s[0], 2);
    assert_int_equal(s[1], 2);
    assert_int_equal(s[2], 2);
    assert_int_equal(s[3], 1);
    assert_int_equal(dsim_batch_sizes_for_worker(7, 2, 2, 1, s), DSIM_OK);
    assert_int_equal(s[0], 2);
    assert_int_equal(s[1], 1);
    assert_int_equal(s[2], 2);
    assert_int_equal(s[3], 2);
    /* rebatch_dataset_test.py: G=4, W=3, R=1. */
    static const int64_t want[3][3] = {{2, 1, 1}, {1, 1, 2}, {1, 2, 1}};
    for (int w = 0; w < 3; w++) {
        assert_int_equal(dsim_batch_sizes_for_worker(4, 3, 1, w, s), DSIM_OK);
        for (int i = 0; i < 3; i++)
            assert_int_equal(s[i], want[w][i]);
    }
}

/* The formula written the way TF writes it: build worker 0's list, then
 * concatenate list[offset:] + list[:offset]. */
static void ref_batch_sizes(int64_t g, int w, int r, int worker, int64_t *out)
{
    int n = w * r;
    int64_t *w0 = malloc((size_t)n * sizeof *w0);
    int64_t fl = g / n, nc = g - n * fl;
    int k = 0;
    for (int64_t i = 0; i < nc; i++)
        w0[k++] = fl + 1;
    while (k < n)
        w0[k++] = fl;
    int off = worker * r;
    k = 0;
    for (int i = off; i < n; i++)
        out[k++] = w0[i];
    for (int i = 0; i < off; i++)
        out[k++] = w0[i];
    free(w0);
}

static void test_batch_sizes_formula(void **state)
{
    (void)state;
    int64_t got[64], want[64], per_worker[8][64];
    for (int64_t g = 0; g <= 45; g++) {
        for (int w = 1; w <= 5; w++) {
            for (int r = 1; r <= 4; r++) {
                int n = w * r;
                for (int x = 0; x < w; x++) {
                    assert_int_equal(dsim_batch_sizes_for_worker(g, w, r, x, got), DSIM_OK);
                    ref_batch_sizes(g, w, r, x, want);
                    int64_t sum = 0, lo = INT64_MAX, hi = 0;
                    for (int i = 0; i < n; i++) {
                        assert_int_equal(got[i], want[i]);
                        sum += got[i];
                        lo = got[i] < lo ? got[i] : lo;
                        hi = got[i] > hi ? got[i] : hi;
                        per_worker[x][i] = got[i];
                    }
                    assert_int_equal(sum, g);  /* (B) */
                    assert_true(hi - lo <= 1); /* (D) */
                    if (g < n)                 /* some replicas get 0 */
                        assert_int_equal(lo, 0);
                }
                /* (C): each global step (R sub-batches per worker) sums to G. */
                for (int step = 0; step < w; step++) {
                    int64_t sum = 0;
                    for (int x = 0; x < w; x++)
                        for (int i = step * r; i < step * r + r; i++)
                            sum += per_worker[x][i];
                    assert_int_equal(sum, g);
                }
            }
        }
    }
}

static void test_batch_sizes_errors(void **state)
{
    (void)state;
    int64_t s[8];
    assert_int_equal(dsim_batch_sizes_for_worker(-3, 2, 2, 0, s), DSIM_EINVAL);
    assert_msg_has("-3");
    assert_int_equal(dsim_batch_sizes_for_worker(8, 0, 2, 0, s), DSIM_EINVAL);
    assert_msg_has("workers 0");
    assert_int_equal(dsim_batch_sizes_for_worker(8, 2, 0, 0, s), DSIM_EINVAL);
    assert_msg_has("replicas per worker 0");
    assert_int_equal(dsim_batch_sizes_for_worker(8, 2, 2, 2, s), DSIM_EINVAL);
    assert_msg_has("worker index 2");
    assert_int_equal(dsim_batch_sizes_for_worker(8, 2, 2, -1, s), DSIM_EINVAL);
    assert_int_equal(dsim_batch_sizes_for_worker(8, 2, 2, 0, NULL), DSIM_EINVAL);
    assert_int_equal(dsim_batch_sizes_for_worker(8, 1 << 13, 1 << 12, 0, s), DSIM_EINVAL);
    assert_msg_has("supported");
}

/* ---- names and descriptions ---------------------------------------------- */

static void test_policy_names(void **state)
{
    (void)state;
    static const char *names[] = {"off", "AUTO", "File", "data", "hInT"};
    static const dsim_shard_policy want[] = {DSIM_SHARD_OFF, DSIM_SHARD_AUTO, DSIM_SHARD_FILE,
                                             DSIM_SHARD_DATA, DSIM_SHARD_HINT};
    for (int i = 0; i < 5; i++) {
        dsim_shard_policy p;
        assert_int_equal(dsim_shard_policy_parse(names[i], &p), DSIM_OK);
        assert_int_equal(p, want[i]);
        dsim_shard_policy q;
        assert_int_equal(dsim_shard_policy_parse(dsim_shard_policy_name(p), &q), DSIM_OK);
        assert_int_equal(q, p);
    }
    dsim_shard_policy p = DSIM_SHARD_DATA;
    assert_int_equal(dsim_shard_policy_parse("files", &p), DSIM_EINVAL);
    assert_int_equal(p, DSIM_SHARD_DATA);
    assert_msg_has("\"files\"");
    assert_msg_has("off, auto, file, data, hint");
    assert_int_equal(dsim_shard_policy_parse("", &p), DSIM_EINVAL);
    assert_int_equal(dsim_shard_policy_parse(NULL, &p), DSIM_EINVAL);
    assert_string_equal(dsim_shard_policy_name((dsim_shard_policy)7), "unknown");

    dsim_shard_hint h;
    assert_int_equal(dsim_shard_hint_parse("Elements", &h), DSIM_OK);
    assert_int_equal(h, DSIM_HINT_ELEMENTS);
    assert_int_equal(dsim_shard_hint_parse("file", &h), DSIM_OK);
    assert_int_equal(h, DSIM_HINT_FILES);
    assert_int_equal(dsim_shard_hint_parse("none", &h), DSIM_OK);
    assert_int_equal(h, DSIM_HINT_NONE);
    assert_int_equal(dsim_shard_hint_parse("everywhere", &h), DSIM_EINVAL);
    assert_msg_has("none, files, elements");
    assert_string_equal(dsim_shard_hint_name(DSIM_HINT_FILES), "files");
}

static void test_dataset_layouts_and_checks(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 10, 3, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    static const uint64_t start[] = {0, 4, 7, 10};
    for (int f = 0; f <= 3; f++)
        assert_int_equal(d.file_start[f], start[f]);
    for (uint64_t i = 0; i < 10; i++)
        assert_int_equal(d.file_ids[i], i);
    assert_int_equal(dsim_dataset_desc_check(&d), DSIM_OK);
    dsim_dataset_desc_release(&d);

    assert_int_equal(dsim_dataset_desc_init(&d, 10, 3, DSIM_FILES_STRIDED), DSIM_OK);
    static const uint64_t strided[] = {0, 3, 6, 9, 1, 4, 7, 2, 5, 8};
    for (int f = 0; f <= 3; f++)
        assert_int_equal(d.file_start[f], start[f]);
    for (int i = 0; i < 10; i++)
        assert_int_equal(d.file_ids[i], strided[i]);
    assert_int_equal(dsim_dataset_desc_check(&d), DSIM_OK);
    dsim_dataset_desc_release(&d);

    /* More files than examples: some files are empty, which is allowed. */
    assert_int_equal(dsim_dataset_desc_init(&d, 2, 5, DSIM_FILES_STRIDED), DSIM_OK);
    assert_int_equal(d.file_start[5], 2);
    assert_int_equal(dsim_dataset_desc_check(&d), DSIM_OK);
    dsim_dataset_desc_release(&d);

    uint64_t fs[] = {0, 2, 4}, ids[] = {0, 1, 1, 3};
    dsim_dataset_desc bad = {.n_examples = 4, .n_files = 2, .file_start = fs, .file_ids = ids};
    assert_int_equal(dsim_dataset_desc_check(&bad), DSIM_EINVAL);
    assert_msg_has("id 1 appears twice");
    ids[2] = 9;
    assert_int_equal(dsim_dataset_desc_check(&bad), DSIM_EINVAL);
    assert_msg_has("id 9");
    ids[2] = 2;
    assert_int_equal(dsim_dataset_desc_check(&bad), DSIM_OK);
    fs[2] = 3;
    assert_int_equal(dsim_dataset_desc_check(&bad), DSIM_EINVAL);
    assert_msg_has("hold 3 ids but the dataset has 4");
    fs[2] = 4;
    fs[1] = 5;
    assert_int_equal(dsim_dataset_desc_check(&bad), DSIM_EINVAL);
    assert_msg_has("file 1 ends");
    fs[1] = 2;
    bad.file_ids = NULL;
    assert_int_equal(dsim_dataset_desc_check(&bad), DSIM_EINVAL);
    dsim_dataset_desc empty = {.n_examples = 0};
    assert_int_equal(dsim_dataset_desc_check(&empty), DSIM_EINVAL);
    assert_msg_has("empty");
    dsim_dataset_desc hint_no_files = {.n_examples = 4, .hint = DSIM_HINT_FILES};
    assert_int_equal(dsim_dataset_desc_check(&hint_no_files), DSIM_EINVAL);
    assert_msg_has("no files");
}

/* ---- configuration errors ------------------------------------------------ */

static void expect_create_error(const dsim_input_config *c, const char *a, const char *b)
{
    dsim_input *in = (dsim_input *)(uintptr_t)1;
    assert_int_equal(dsim_input_create(c, &in), DSIM_EINVAL);
    assert_null(in);
    if (a)
        assert_msg_has(a);
    if (b)
        assert_msg_has(b);
}

static void test_config_errors(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 20, 3, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_DATA, 4, 2, 2);
    c.global_batch = 0;
    expect_create_error(&c, "global batch size 0", ">= 1");
    c.global_batch = -5;
    expect_create_error(&c, "-5", ">= 1");
    c = cfg_make(&d, DSIM_SHARD_DATA, 4, 0, 2);
    expect_create_error(&c, "workers 0", ">= 1");
    c = cfg_make(&d, DSIM_SHARD_DATA, 4, 2, 0);
    expect_create_error(&c, "replicas per worker 0", ">= 1");
    c = cfg_make(&d, DSIM_SHARD_DATA, 4, 2, 2);
    c.worker = 2;
    expect_create_error(&c, "worker index 2", "[0, 2)");
    c.worker = 0;
    c.epochs = 0;
    expect_create_error(&c, "epochs", ">= 1");
    c.epochs = 1;
    c.policy = (dsim_shard_policy)9;
    expect_create_error(&c, "policy 9", "off (-1), auto (0), file (1), data (2), hint (3)");
    c.policy = DSIM_SHARD_DATA;
    c.dataset = NULL;
    expect_create_error(&c, "dataset", NULL);
    dsim_dataset_desc empty = {.n_examples = 0};
    c.dataset = &empty;
    expect_create_error(&c, "empty", NULL);
    expect_create_error(NULL, "config", NULL);
    c.dataset = &d;
    /* drop_remainder with every share smaller than G: no step at all. */
    c = cfg_make(&d, DSIM_SHARD_FILE, 8, 3, 1);
    c.drop_remainder = true;
    expect_create_error(&c, "global batch 8", "drop_remainder");
    c = cfg_make(&d, DSIM_SHARD_DATA, 21, 2, 1);
    c.drop_remainder = true;
    expect_create_error(&c, "global batch 21", "drop_remainder");
    assert_int_equal(dsim_input_create(&c, NULL), DSIM_EINVAL);
    dsim_dataset_desc_release(&d);
}

static void test_file_error_names_both_counts(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 30, 3, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_FILE, 6, 4, 1);
    expect_create_error(&c, "3 file(s)", "4 workers");
    assert_msg_has("data or off");
    /* AUTO finds the files and applies FILE: the same error, not a fallback. */
    c.policy = DSIM_SHARD_AUTO;
    expect_create_error(&c, "3 file(s)", "4 workers");
    assert_msg_has("auto chose FILE");
    /* A placeholder on the file list shards files the same way. */
    d.hint = DSIM_HINT_FILES;
    c.policy = DSIM_SHARD_HINT;
    expect_create_error(&c, "3 file(s)", "4 workers");
    /* Exactly as many files as workers is fine. */
    c.num_workers = 3;
    dsim_input *in;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    dsim_input_destroy(in);
    c.policy = DSIM_SHARD_FILE;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    dsim_input_destroy(in);
    dsim_dataset_desc_release(&d);

    /* FILE on a dataset without files. */
    dsim_dataset_desc nf = {.n_examples = 10};
    c = cfg_make(&nf, DSIM_SHARD_FILE, 2, 2, 1);
    expect_create_error(&c, "no files", "2 workers");
    /* ... except with one worker, where TF does not rewrite the pipeline. */
    c.num_workers = 1;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    assert_int_equal(dsim_input_policy_applied(in), DSIM_SHARD_FILE);
    assert_int_equal(dsim_input_worker_examples(in), 10);
    dsim_input_destroy(in);

    /* A placeholder on the examples with fewer examples than workers. */
    nf.n_examples = 3;
    nf.hint = DSIM_HINT_ELEMENTS;
    c = cfg_make(&nf, DSIM_SHARD_HINT, 2, 4, 1);
    expect_create_error(&c, "3 example(s)", "4 workers");
}

static void test_auto_reports_policy(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    dsim_input *in;
    assert_int_equal(dsim_dataset_desc_init(&d, 40, 4, DSIM_FILES_STRIDED), DSIM_OK);
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_AUTO, 8, 2, 2);
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    assert_int_equal(dsim_input_policy_applied(in), DSIM_SHARD_FILE);
    assert_non_null(strstr(dsim_input_policy_reason(in), "AUTO applied FILE"));
    dsim_input_destroy(in);
    dsim_dataset_desc_release(&d);

    dsim_dataset_desc nf = {.n_examples = 40};
    c.dataset = &nf;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    assert_int_equal(dsim_input_policy_applied(in), DSIM_SHARD_DATA);
    assert_non_null(strstr(dsim_input_policy_reason(in), "AUTO applied DATA"));
    assert_non_null(strstr(dsim_input_policy_reason(in), "no files"));
    dsim_input_destroy(in);

    /* Explicit policies are reported as themselves. */
    static const dsim_shard_policy ps[] = {DSIM_SHARD_OFF, DSIM_SHARD_DATA, DSIM_SHARD_HINT};
    for (int i = 0; i < 3; i++) {
        c.policy = ps[i];
        assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
        assert_int_equal(dsim_input_policy_applied(in), ps[i]);
        assert_true(strlen(dsim_input_policy_reason(in)) > 10);
        dsim_input_destroy(in);
    }
}

/* ---- the docstring examples ---------------------------------------------- */

static void test_tf_docstring_example(void **state)
{
    (void)state;
    /* Two files of 7 (A = ids 0..6, B = 7..13), G=7, W=2, R=2, FILE. */
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 14, 2, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_FILE, 7, 2, 2);
    dsim_input *w0, *w1;
    assert_int_equal(dsim_input_create(&c, &w0), DSIM_OK);
    c.worker = 1;
    assert_int_equal(dsim_input_create(&c, &w1), DSIM_OK);
    assert_int_equal(dsim_input_steps_per_epoch(w0), 2);
    assert_int_equal(dsim_input_steps_per_epoch(w1), 2);
    static const int64_t a01[] = {0, 1}, a23[] = {2, 3}, a45[] = {4, 5}, a6[] = {6};
    static const int64_t b01[] = {7, 8}, b2[] = {9}, b34[] = {10, 11}, b56[] = {12, 13};
    expect_step(w0, 2, (const int64_t *const[]){a01, a23}, (const int[]){2, 2});
    expect_step(w1, 2, (const int64_t *const[]){b01, b2}, (const int[]){2, 1});
    expect_step(w0, 2, (const int64_t *const[]){a45, a6}, (const int[]){2, 1});
    expect_step(w1, 2, (const int64_t *const[]){b34, b56}, (const int[]){2, 2});
    dsim_input_step st;
    assert_int_equal(dsim_input_next(w0, &st), DSIM_OK);
    assert_true(st.done);
    dsim_input_destroy(w0);
    dsim_input_destroy(w1);
    dsim_dataset_desc_release(&d);
}

static void test_data_policy_rebatch(void **state)
{
    (void)state;
    /* DATA rewrites the rebatch to the legacy one: each global batch of 7 is
     * cut into ceil(7/4) = 2, 2, 2, 1 and minibatch k goes to worker k % 2. */
    dsim_dataset_desc d = {.n_examples = 14};
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_DATA, 7, 2, 2);
    dsim_input *w0, *w1;
    assert_int_equal(dsim_input_create(&c, &w0), DSIM_OK);
    c.worker = 1;
    assert_int_equal(dsim_input_create(&c, &w1), DSIM_OK);
    assert_int_equal(dsim_input_steps_per_epoch(w0), 2);
    assert_int_equal(dsim_input_worker_examples(w0), 8);
    assert_int_equal(dsim_input_worker_examples(w1), 6);
    static const int64_t s0[] = {0, 1}, s1[] = {2, 3}, s2[] = {4, 5}, s3[] = {6};
    static const int64_t t0[] = {7, 8}, t1[] = {9, 10}, t2[] = {11, 12}, t3[] = {13};
    expect_step(w0, 2, (const int64_t *const[]){s0, s2}, (const int[]){2, 2});
    expect_step(w1, 2, (const int64_t *const[]){s1, s3}, (const int[]){2, 1});
    expect_step(w0, 2, (const int64_t *const[]){t0, t2}, (const int[]){2, 2});
    expect_step(w1, 2, (const int64_t *const[]){t1, t3}, (const int[]){2, 1});
    dsim_input_destroy(w0);
    dsim_input_destroy(w1);

    /* G=6 over N=4: slices of 2 leave the last replica (w1 r1) empty. */
    c = cfg_make(&d, DSIM_SHARD_DATA, 6, 2, 2);
    c.worker = 1;
    assert_int_equal(dsim_input_create(&c, &w1), DSIM_OK);
    static const int64_t u1[] = {2, 3};
    expect_step(w1, 2, (const int64_t *const[]){u1, NULL}, (const int[]){2, 0});
    dsim_input_destroy(w1);
}

/* ---- a literal model of TF's dataset ops ----------------------------------- */

typedef struct ref_out {
    uint64_t *ids;
    uint64_t n;
} ref_out;

typedef struct ref_worker {
    ref_out *outs;
    uint64_t nouts, cap;
    uint64_t kept;
} ref_worker;

static void ref_push(ref_worker *rw, const uint64_t *ids, uint64_t n)
{
    if (rw->nouts == rw->cap) {
        rw->cap = rw->cap ? rw->cap * 2 : 16;
        rw->outs = realloc(rw->outs, rw->cap * sizeof *rw->outs);
    }
    ref_out *o = &rw->outs[rw->nouts++];
    o->ids = malloc((n ? n : 1) * sizeof *o->ids);
    memcpy(o->ids, ids, n * sizeof *ids);
    o->n = n;
    rw->kept += n;
}

static void ref_free(ref_worker *rw)
{
    for (uint64_t i = 0; i < rw->nouts; i++)
        free(rw->outs[i].ids);
    free(rw->outs);
    memset(rw, 0, sizeof *rw);
}

static void ref_shuffle(uint64_t seed, uint32_t epoch, uint64_t *v, uint64_t n)
{
    dsim_rng r;
    dsim_rng_init(&r, seed, "data.shuffle", epoch);
    dsim_rng_shuffle_u64(&r, v, n);
}

enum { REF_ALL, REF_FILES, REF_ELEMENTS, REF_LEGACY };

/* Which rewrite TF applies; -1 when it is an error. */
static int ref_mode(const dsim_dataset_desc *d, dsim_shard_policy p, int nw)
{
    switch (p) {
    case DSIM_SHARD_OFF:
        return REF_ALL;
    case DSIM_SHARD_FILE:
        if (nw == 1)
            return REF_ALL;
        return d->n_files >= (uint32_t)nw ? REF_FILES : -1;
    case DSIM_SHARD_DATA:
        return REF_LEGACY;
    case DSIM_SHARD_AUTO:
        if (d->n_files == 0)
            return REF_LEGACY;
        return d->n_files >= (uint32_t)nw ? REF_FILES : -1;
    case DSIM_SHARD_HINT:
        if (d->hint == DSIM_HINT_NONE)
            return REF_ALL;
        if (d->hint == DSIM_HINT_FILES)
            return d->n_files >= (uint32_t)nw ? REF_FILES : -1;
        return d->n_examples >= (uint64_t)nw ? REF_ELEMENTS : -1;
    }
    return -1;
}

/* Worker w's sub-batches for one epoch, op by op. */
static void ref_worker_outputs(const dsim_input_config *c, int mode, int w, uint32_t epoch,
                               ref_worker *rw)
{
    const dsim_dataset_desc *d = c->dataset;
    uint64_t n = d->n_examples, g = (uint64_t)c->global_batch;
    int nw = c->num_workers, rp = c->replicas_per_worker, nrep = nw * rp;
    uint64_t *order = malloc(n * sizeof *order), *stream = malloc(n * sizeof *stream);
    uint64_t m = 0;
    for (uint64_t i = 0; i < n; i++)
        order[i] = d->n_files ? d->file_ids[i] : i;
    if (mode == REF_FILES) {
        for (uint32_t f = 0; f < d->n_files; f++)
            if (f % (uint32_t)nw == (uint32_t)w)
                for (uint64_t k = d->file_start[f]; k < d->file_start[f + 1]; k++)
                    stream[m++] = d->file_ids[k];
        if (c->shuffle)
            ref_shuffle(c->seed, epoch, stream, m);
    } else {
        if (c->shuffle)
            ref_shuffle(c->seed, epoch, order, n);
        for (uint64_t i = 0; i < n; i++)
            if (mode != REF_ELEMENTS || i % (uint64_t)nw == (uint64_t)w)
                stream[m++] = order[i];
    }
    /* batch(G, drop_remainder) */
    uint64_t nb = c->drop_remainder ? m / g : (m + g - 1) / g;
    memset(rw, 0, sizeof *rw);
    if (mode == REF_LEGACY) {
        /* RebatchDataset(num_replicas = N) then shard(W, w). */
        uint64_t j = 0;
        for (uint64_t b = 0; b < nb; b++) {
            uint64_t bs = (b + 1) * g <= m ? g : m - b * g;
            uint64_t iv = (bs + (uint64_t)nrep - 1) / (uint64_t)nrep;
            for (int k = 0; k < nrep; k++, j++) {
                uint64_t st = (uint64_t)k * iv, en = st + iv;
                if (en > bs)
                    en = bs;
                if (st >= en)
                    st = en;
                if (j % (uint64_t)nw == (uint64_t)w)
                    ref_push(rw, stream + b * g + st, en - st);
            }
        }
    } else {
        /* RebatchDatasetV2(batch_sizes_for_worker), GetNextInternal as in
         * rebatch_dataset_op.cc: slices may span input batches. */
        int64_t *sizes = malloc((size_t)nrep * sizeof *sizes);
        ref_batch_sizes(c->global_batch, nw, rp, w, sizes);
        uint64_t *buf = malloc((g + 1) * sizeof *buf);
        int64_t offset = -1;
        uint64_t bi = 0, cur_len = 0, cur_start = 0, idx = 0;
        bool eos = false;
        for (;;) {
            if (eos)
                break;
            uint64_t desired = (uint64_t)sizes[idx], have = 0;
            while (have < desired) {
                if (offset == -1) {
                    if (bi == nb) {
                        eos = true;
                        break;
                    }
                    cur_start = bi * g;
                    cur_len = (bi + 1) * g <= m ? g : m - bi * g;
                    bi++;
                    offset = 0;
                }
                uint64_t end = (uint64_t)offset + desired - have;
                if (end > cur_len)
                    end = cur_len;
                memcpy(buf + have, stream + cur_start + (uint64_t)offset,
                       (end - (uint64_t)offset) * sizeof *buf);
                have += end - (uint64_t)offset;
                offset = (int64_t)end;
                if ((uint64_t)offset == cur_len)
                    offset = -1;
            }
            idx = (idx + 1) % (uint64_t)nrep;
            if (have == 0 && desired > 0)
                break;
            ref_push(rw, buf, have);
        }
        free(buf);
        free(sizes);
    }
    free(order);
    free(stream);
}

static int ref_compare_config(const dsim_input_config *base)
{
    dsim_input_config c = *base;
    int nw = c.num_workers, rp = c.replicas_per_worker;
    int mode = ref_mode(c.dataset, c.policy, nw);
    dsim_input **ins = calloc((size_t)nw, sizeof *ins);
    ref_worker *rws = calloc((size_t)nw, sizeof *rws);
    int checked = 0;
    for (int w = 0; w < nw; w++) {
        c.worker = w;
        dsim_err e = dsim_input_create(&c, &ins[w]);
        if (mode < 0) {
            assert_int_equal(e, DSIM_EINVAL);
            goto out;
        }
        if (e != DSIM_OK) {
            /* Only an epoch without any example may be refused. */
            assert_int_equal(e, DSIM_EINVAL);
            assert_msg_has("drop_remainder");
            uint64_t total = 0;
            for (int x = 0; x < nw; x++) {
                ref_worker rw;
                ref_worker_outputs(&c, mode, x, 0, &rw);
                total += rw.kept;
                ref_free(&rw);
            }
            assert_int_equal(total, 0);
            goto out;
        }
    }
    for (uint32_t ep = 0; ep < c.epochs; ep++) {
        uint64_t steps = 0;
        for (int w = 0; w < nw; w++) {
            ref_worker_outputs(&c, mode, w, ep, &rws[w]);
            uint64_t s = (rws[w].nouts + (uint64_t)rp - 1) / (uint64_t)rp;
            steps = s > steps ? s : steps;
        }
        for (int w = 0; w < nw; w++) {
            assert_int_equal(dsim_input_steps_per_epoch(ins[w]), steps);
            assert_int_equal(dsim_input_worker_examples(ins[w]), rws[w].kept);
            for (uint64_t s = 0; s < steps; s++) {
                dsim_input_step st;
                assert_int_equal(dsim_input_next(ins[w], &st), DSIM_OK);
                assert_false(st.done);
                assert_int_equal(st.epoch, ep);
                assert_int_equal(st.step, s);
                assert_int_equal(st.end_of_epoch, s + 1 == steps);
                assert_int_equal(st.worker_has_value, s * (uint64_t)rp < rws[w].nouts);
                for (int r = 0; r < rp; r++) {
                    uint64_t j = s * (uint64_t)rp + (uint64_t)r;
                    bool has = j < rws[w].nouts;
                    assert_int_equal(st.batch[r].has_value, has);
                    uint64_t want_n = has ? rws[w].outs[j].n : 0;
                    if (st.batch[r].n != want_n)
                        fail_msg("n=%llu files=%u G=%lld W=%d R=%d policy=%s drop=%d shuffle=%d "
                                 "worker %d epoch %u step %llu replica %d: %llu examples, "
                                 "TF's ops give %llu",
                                 (unsigned long long)c.dataset->n_examples, c.dataset->n_files,
                                 (long long)c.global_batch, nw, rp,
                                 dsim_shard_policy_name(c.policy), c.drop_remainder, c.shuffle, w,
                                 ep, (unsigned long long)s, r, (unsigned long long)st.batch[r].n,
                                 (unsigned long long)want_n);
                    for (uint64_t k = 0; k < want_n; k++)
                        assert_int_equal(st.batch[r].ids[k], rws[w].outs[j].ids[k]);
                }
            }
            ref_free(&rws[w]);
        }
    }
    for (int w = 0; w < nw; w++) {
        dsim_input_step st;
        assert_int_equal(dsim_input_next(ins[w], &st), DSIM_OK);
        assert_true(st.done);
    }
    checked = 1;
out:
    for (int w = 0; w < nw; w++)
        dsim_input_destroy(ins[w]);
    free(ins);
    free(rws);
    return checked;
}

static void test_against_tf_ops(void **state)
{
    (void)state;
    static const uint64_t ns[] = {1, 5, 7, 13, 31};
    static const uint32_t files[] = {0, 1, 2, 3, 5};
    static const int64_t gs[] = {1, 2, 3, 5, 7, 12, 40};
    static const dsim_shard_policy ps[] = {DSIM_SHARD_OFF, DSIM_SHARD_FILE, DSIM_SHARD_DATA,
                                           DSIM_SHARD_AUTO, DSIM_SHARD_HINT};
    int configs = 0, checked = 0, combo = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof files / sizeof *files; b++) {
            dsim_dataset_desc d;
            combo++;
            assert_int_equal(
                dsim_dataset_desc_init(&d, ns[a], files[b],
                                       combo % 2 ? DSIM_FILES_STRIDED : DSIM_FILES_CONTIGUOUS),
                DSIM_OK);
            for (int nw = 1; nw <= 4; nw++)
                for (int rp = 1; rp <= 3; rp++)
                    for (size_t gi = 0; gi < sizeof gs / sizeof *gs; gi++)
                        for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++)
                            for (int flags = 0; flags < 4; flags++) {
                                d.hint = (dsim_shard_hint)((configs + flags) % 3);
                                if (d.hint == DSIM_HINT_FILES && d.n_files == 0)
                                    d.hint = DSIM_HINT_ELEMENTS;
                                dsim_input_config c = cfg_make(&d, ps[pi], gs[gi], nw, rp);
                                c.drop_remainder = flags & 1;
                                c.shuffle = flags & 2;
                                c.seed = 1000 + (uint64_t)configs;
                                c.epochs = 2;
                                configs++;
                                checked += ref_compare_config(&c);
                            }
            dsim_dataset_desc_release(&d);
        }
    /* Most combinations run; the rest are the documented errors. */
    assert_true(checked > configs / 2);
    print_message("compared %d of %d configurations with TF's ops\n", checked, configs);
}

/* ---- shard assignment tables --------------------------------------------- */

/* Which worker keeps id under the policy, computed from the rules alone. */
static void test_shard_tables(void **state)
{
    (void)state;
    static const uint64_t ns[] = {6, 10, 17, 24};
    static const uint32_t files[] = {1, 2, 3, 4, 6, 9};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 6; b++)
            for (int lay = 0; lay < 2; lay++)
                for (int nw = 1; nw <= 5; nw++) {
                    dsim_dataset_desc d;
                    assert_int_equal(
                        dsim_dataset_desc_init(&d, ns[a], files[b],
                                               lay ? DSIM_FILES_STRIDED : DSIM_FILES_CONTIGUOUS),
                        DSIM_OK);
                    /* file of each id */
                    uint32_t *file_of = calloc(ns[a], sizeof *file_of);
                    uint64_t *pos_of = calloc(ns[a], sizeof *pos_of);
                    for (uint32_t f = 0; f < d.n_files; f++)
                        for (uint64_t k = d.file_start[f]; k < d.file_start[f + 1]; k++) {
                            file_of[d.file_ids[k]] = f;
                            pos_of[d.file_ids[k]] = k;
                        }
                    for (int pol = 0; pol < 4; pol++) {
                        dsim_shard_policy p = pol == 0   ? DSIM_SHARD_FILE
                                              : pol == 1 ? DSIM_SHARD_AUTO
                                              : pol == 2 ? DSIM_SHARD_OFF
                                                         : DSIM_SHARD_HINT;
                        d.hint = DSIM_HINT_ELEMENTS;
                        dsim_input_config c = cfg_make(&d, p, 4, nw, 2);
                        bool fewer = d.n_files < (uint32_t)nw;
                        int *reads = calloc(ns[a] * (size_t)nw, sizeof *reads);
                        for (int w = 0; w < nw; w++) {
                            dsim_input *in;
                            c.worker = w;
                            dsim_err e = dsim_input_create(&c, &in);
                            bool want_err =
                                (p == DSIM_SHARD_FILE || p == DSIM_SHARD_AUTO) && nw > 1 && fewer;
                            want_err |= p == DSIM_SHARD_HINT && ns[a] < (uint64_t)nw;
                            if (want_err) {
                                assert_int_equal(e, DSIM_EINVAL);
                                break;
                            }
                            assert_int_equal(e, DSIM_OK);
                            dsim_input_step st;
                            while (dsim_input_next(in, &st) == DSIM_OK && !st.done)
                                for (int r = 0; r < st.replicas; r++)
                                    for (uint64_t k = 0; k < st.batch[r].n; k++)
                                        reads[st.batch[r].ids[k] * (uint64_t)nw + (uint64_t)w]++;
                            dsim_input_destroy(in);
                        }
                        for (uint64_t id = 0; id < ns[a]; id++)
                            for (int w = 0; w < nw; w++) {
                                int got = reads[id * (uint64_t)nw + (uint64_t)w], want;
                                if (p == DSIM_SHARD_OFF)
                                    want = 1;
                                else if (p == DSIM_SHARD_HINT)
                                    want = pos_of[id] % (uint64_t)nw == (uint64_t)w;
                                else
                                    want = file_of[id] % (uint32_t)nw == (uint32_t)w;
                                if ((p == DSIM_SHARD_FILE || p == DSIM_SHARD_AUTO) && nw > 1 &&
                                    fewer)
                                    want = 0;
                                if (p == DSIM_SHARD_HINT && ns[a] < (uint64_t)nw)
                                    want = 0;
                                if (got != want)
                                    fail_msg("n=%llu files=%u W=%d %s: worker %d read id %llu "
                                             "%d times, want %d",
                                             (unsigned long long)ns[a], files[b], nw,
                                             dsim_shard_policy_name(p), w, (unsigned long long)id,
                                             got, want);
                            }
                        free(reads);
                    }
                    free(file_of);
                    free(pos_of);
                    dsim_dataset_desc_release(&d);
                }
}

/* ---- the partial last batch ----------------------------------------------- */

static void test_partial_last_batch(void **state)
{
    (void)state;
    /* Files of 5 and 2 examples, G=4, W=2, R=2: sizes [1,1,1,1] on both.
     * Worker 0 has 5 sub-batches, worker 1 has 2, so the epoch is 3 steps:
     * in the last one only w0 r0 has data; w0 r1 and all of w1 get empty
     * batches without a value, and worker 1 reports no data. */
    uint64_t fs[] = {0, 5, 7}, ids[] = {0, 1, 2, 3, 4, 5, 6};
    dsim_dataset_desc d = {.n_examples = 7, .n_files = 2, .file_start = fs, .file_ids = ids};
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_FILE, 4, 2, 2);
    dsim_input *w0, *w1;
    assert_int_equal(dsim_input_create(&c, &w0), DSIM_OK);
    c.worker = 1;
    assert_int_equal(dsim_input_create(&c, &w1), DSIM_OK);
    assert_int_equal(dsim_input_steps_per_epoch(w1), 3);
    dsim_input_step a, b;
    for (int s = 0; s < 3; s++) {
        assert_int_equal(dsim_input_next(w0, &a), DSIM_OK);
        assert_int_equal(a.end_of_epoch, s == 2);
        assert_true(a.worker_has_value);
        assert_int_equal(a.batch[0].n, 1);
        assert_int_equal(a.batch[0].ids[0], 2 * s);
        assert_int_equal(a.batch[1].n, s < 2 ? 1 : 0);
        assert_int_equal(a.batch[1].has_value, s < 2);
        assert_int_equal(dsim_input_next(w1, &b), DSIM_OK);
        assert_int_equal(b.worker_has_value, s == 0);
        assert_int_equal(b.examples, s == 0 ? 2 : 0);
        assert_int_equal(b.batch[0].has_value, s == 0);
        assert_int_equal(b.batch[1].has_value, s == 0);
    }
    dsim_input_destroy(w0);
    dsim_input_destroy(w1);

    /* G < N: sizes are 0 or 1. G=1, W=2, R=1, files of 2 and 1: w0 sizes
     * [1,0] give [a0] [] [a1] [] and w1 sizes [0,1] give [] [b0] []: the
     * zero-size sub-batches after an exact end still have a value. */
    uint64_t fs2[] = {0, 2, 3}, ids2[] = {0, 1, 2};
    dsim_dataset_desc d2 = {.n_examples = 3, .n_files = 2, .file_start = fs2, .file_ids = ids2};
    c = cfg_make(&d2, DSIM_SHARD_FILE, 1, 2, 1);
    assert_int_equal(dsim_input_create(&c, &w0), DSIM_OK);
    c.worker = 1;
    assert_int_equal(dsim_input_create(&c, &w1), DSIM_OK);
    assert_int_equal(dsim_input_steps_per_epoch(w0), 4);
    static const int n0[] = {1, 0, 1, 0}, n1[] = {0, 1, 0, 0};
    static const bool v1[] = {true, true, true, false};
    for (int s = 0; s < 4; s++) {
        assert_int_equal(dsim_input_next(w0, &a), DSIM_OK);
        assert_int_equal(dsim_input_next(w1, &b), DSIM_OK);
        assert_int_equal(a.batch[0].n, n0[s]);
        assert_true(a.batch[0].has_value);
        assert_int_equal(b.batch[0].n, n1[s]);
        assert_int_equal(b.batch[0].has_value, v1[s]);
    }
    dsim_input_destroy(w0);
    dsim_input_destroy(w1);
}

/* ---- shuffling ------------------------------------------------------------ */

/* All ids worker w hands out in epoch ep, in order. */
static uint64_t collect_epoch(dsim_input *in, uint32_t ep, uint64_t *out)
{
    uint64_t k = 0;
    assert_int_equal(dsim_input_seek(in, ep, 0), DSIM_OK);
    for (;;) {
        dsim_input_step st;
        assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
        if (st.done || st.epoch != ep)
            break;
        for (int r = 0; r < st.replicas; r++)
            for (uint64_t i = 0; i < st.batch[r].n; i++)
                out[k++] = st.batch[r].ids[i];
    }
    return k;
}

static void test_shuffle_per_epoch(void **state)
{
    (void)state;
    enum { N = 64 };
    dsim_dataset_desc d = {.n_examples = N};
    static const dsim_shard_policy ps[] = {DSIM_SHARD_OFF, DSIM_SHARD_DATA};
    for (int pi = 0; pi < 2; pi++) {
        dsim_input_config c = cfg_make(&d, ps[pi], 8, 2, 2);
        c.shuffle = true;
        c.epochs = 3;
        c.seed = 7;
        uint64_t e0[N * 2], e1[N * 2], again[N * 2];
        dsim_input *a, *b;
        assert_int_equal(dsim_input_create(&c, &a), DSIM_OK);
        uint64_t k0 = collect_epoch(a, 0, e0), k1 = collect_epoch(a, 1, e1);
        assert_int_equal(k0, k1);
        assert_memory_not_equal(e0, e1, k0 * sizeof *e0);
        /* Same seed: the same sequence, from a fresh input. */
        assert_int_equal(dsim_input_create(&c, &b), DSIM_OK);
        assert_int_equal(collect_epoch(b, 1, again), k1);
        assert_memory_equal(again, e1, k1 * sizeof *e1);
        dsim_input_destroy(b);
        /* Another seed: another order. */
        c.seed = 8;
        assert_int_equal(dsim_input_create(&c, &b), DSIM_OK);
        assert_int_equal(collect_epoch(b, 0, again), k0);
        assert_memory_not_equal(again, e0, k0 * sizeof *e0);
        dsim_input_destroy(b);
        dsim_input_destroy(a);
    }

    /* OFF: every worker hands out the same order (TF needs the same seed on
     * every worker); unshuffled, it is the dataset order. */
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_OFF, 8, 3, 2);
    c.shuffle = true;
    c.epochs = 2;
    uint64_t first[N], other[N];
    for (int w = 0; w < 3; w++) {
        dsim_input *in;
        c.worker = w;
        assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
        assert_int_equal(collect_epoch(in, 1, w ? other : first), N);
        if (w)
            assert_memory_equal(first, other, sizeof first);
        dsim_input_destroy(in);
    }
    c.shuffle = false;
    dsim_input *in;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    assert_int_equal(collect_epoch(in, 1, other), N);
    for (uint64_t i = 0; i < N; i++)
        assert_int_equal(other[i], i);
    dsim_input_destroy(in);

    /* FILE: each worker shuffles its own stream with the same random
     * stream, so equal-length shards get the same permutation. */
    dsim_dataset_desc fd;
    assert_int_equal(dsim_dataset_desc_init(&fd, 16, 2, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    c = cfg_make(&fd, DSIM_SHARD_FILE, 2, 2, 1);
    c.shuffle = true;
    uint64_t s0[8], s1[8];
    dsim_input *w0, *w1;
    assert_int_equal(dsim_input_create(&c, &w0), DSIM_OK);
    c.worker = 1;
    assert_int_equal(dsim_input_create(&c, &w1), DSIM_OK);
    assert_int_equal(collect_epoch(w0, 0, s0), 8);
    assert_int_equal(collect_epoch(w1, 0, s1), 8);
    bool moved = false;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(s1[i], s0[i] + 8);
        moved |= s0[i] != (uint64_t)i;
    }
    assert_true(moved);
    dsim_input_destroy(w0);
    dsim_input_destroy(w1);
    dsim_dataset_desc_release(&fd);
}

/* ---- drop_remainder, epochs, seek ------------------------------------------ */

static void test_drop_remainder(void **state)
{
    (void)state;
    /* FILE: two files of 10, G=4, one replica each: each worker batches its
     * own 10 into 4+4(+2): the 2 are dropped on each worker. */
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 20, 2, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_FILE, 4, 2, 1);
    for (int drop = 0; drop < 2; drop++) {
        c.drop_remainder = drop;
        for (int w = 0; w < 2; w++) {
            dsim_input *in;
            c.worker = w;
            assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
            assert_int_equal(dsim_input_worker_examples(in), drop ? 8 : 10);
            /* sizes [2,2] per worker: 10 -> 5 sub-batches, 8 -> 4 */
            assert_int_equal(dsim_input_steps_per_epoch(in), drop ? 4 : 5);
            uint64_t ids[16];
            uint64_t k = collect_epoch(in, 0, ids);
            assert_int_equal(k, drop ? 8 : 10);
            for (uint64_t i = 0; i < k; i++)
                assert_int_equal(ids[i], (uint64_t)w * 10 + i);
            dsim_input_destroy(in);
        }
    }
    dsim_dataset_desc_release(&d);

    /* DATA drops the whole dataset's partial batch: 10 with G=4 -> 8. */
    dsim_dataset_desc nf = {.n_examples = 10};
    c = cfg_make(&nf, DSIM_SHARD_DATA, 4, 2, 1);
    c.drop_remainder = true;
    uint64_t kept = 0;
    for (int w = 0; w < 2; w++) {
        dsim_input *in;
        c.worker = w;
        assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
        assert_int_equal(dsim_input_steps_per_epoch(in), 2);
        kept += dsim_input_worker_examples(in);
        dsim_input_destroy(in);
    }
    assert_int_equal(kept, 8);
}

static void test_epochs_and_seek(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 30, 4, DSIM_FILES_STRIDED), DSIM_OK);
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_FILE, 6, 2, 2);
    c.epochs = 3;
    c.shuffle = true;
    c.worker = 1;
    dsim_input *in;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
    uint64_t steps = dsim_input_steps_per_epoch(in);
    assert_true(steps > 1);
    uint64_t seen = 0, ends = 0;
    uint64_t rec[3][16][3];
    dsim_input_step st;
    for (;;) {
        assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
        if (st.done)
            break;
        assert_int_equal(st.epoch, seen / steps);
        assert_int_equal(st.step, seen % steps);
        assert_int_equal(st.end_of_epoch, st.step + 1 == steps);
        ends += st.end_of_epoch;
        rec[st.epoch][st.step][0] = st.batch[0].n;
        rec[st.epoch][st.step][1] = st.batch[0].n ? st.batch[0].ids[0] : UINT64_MAX;
        rec[st.epoch][st.step][2] = st.batch[1].n ? st.batch[1].ids[0] : UINT64_MAX;
        seen++;
    }
    assert_int_equal(seen, 3 * steps);
    assert_int_equal(ends, 3);
    /* done stays done */
    assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
    assert_true(st.done);
    /* Redo epoch 1 from step 1, as after a restore. */
    assert_int_equal(dsim_input_seek(in, 1, 1), DSIM_OK);
    for (uint64_t s = 1; s < steps; s++) {
        assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
        assert_int_equal(st.epoch, 1);
        assert_int_equal(st.step, s);
        assert_int_equal(st.batch[0].n, rec[1][s][0]);
        assert_int_equal(st.batch[0].n ? st.batch[0].ids[0] : UINT64_MAX, rec[1][s][1]);
        assert_int_equal(st.batch[1].n ? st.batch[1].ids[0] : UINT64_MAX, rec[1][s][2]);
    }
    /* Seeking to an epoch's end is the next epoch's start. */
    assert_int_equal(dsim_input_seek(in, 0, steps), DSIM_OK);
    assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
    assert_int_equal(st.epoch, 1);
    assert_int_equal(st.step, 0);
    assert_int_equal(dsim_input_seek(in, 3, 0), DSIM_EINVAL);
    assert_msg_has("3 epochs");
    assert_int_equal(dsim_input_seek(in, 0, steps + 1), DSIM_EINVAL);
    assert_int_equal(dsim_input_next(NULL, &st), DSIM_EINVAL);
    dsim_input_destroy(in);
    dsim_input_destroy(NULL);
    dsim_dataset_desc_release(&d);
}

/* ---- plan ----------------------------------------------------------------- */

static void test_plan(void **state)
{
    (void)state;
    dsim_dataset_desc d;
    assert_int_equal(dsim_dataset_desc_init(&d, 14, 2, DSIM_FILES_CONTIGUOUS), DSIM_OK);
    dsim_input_config c = cfg_make(&d, DSIM_SHARD_AUTO, 7, 2, 2);
    dsim_input_plan *p;
    assert_int_equal(dsim_input_plan_make(&c, &p), DSIM_OK);
    assert_int_equal(p->applied, DSIM_SHARD_FILE);
    assert_int_equal(p->requested, DSIM_SHARD_AUTO);
    assert_int_equal(p->steps, 2);
    static const uint64_t want[2][4] = {{2, 2, 2, 1}, {2, 1, 2, 2}};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(p->batch[s * 4 + i], want[s][i]);
    for (int w = 0; w < 2; w++) {
        assert_int_equal(p->files_start[w + 1] - p->files_start[w], 1);
        assert_int_equal(p->files[p->files_start[w]], w);
        assert_int_equal(p->reads[w], 7);
        assert_int_equal(p->kept_start[w + 1] - p->kept_start[w], 7);
        for (int k = 0; k < 7; k++)
            assert_int_equal(p->kept[p->kept_start[w] + (uint64_t)k], (uint64_t)(7 * w + k));
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(dsim_input_plan_print(p, f), DSIM_OK);
    fclose(f);
    assert_non_null(strstr(text, "shard policy file (requested auto)"));
    assert_non_null(strstr(text, "2 steps per epoch"));
    assert_non_null(strstr(text, "w1r1"));
    free(text);
    dsim_input_plan_free(p);

    /* Under DATA every worker reads every file and the whole dataset. */
    c.policy = DSIM_SHARD_DATA;
    assert_int_equal(dsim_input_plan_make(&c, &p), DSIM_OK);
    for (int w = 0; w < 2; w++) {
        assert_int_equal(p->files_start[w + 1] - p->files_start[w], 2);
        assert_int_equal(p->reads[w], 14);
    }
    assert_int_equal(p->kept_start[2], 14);
    dsim_input_plan_free(p);

    /* Errors come through with their message. */
    c.num_workers = 3;
    c.policy = DSIM_SHARD_FILE;
    p = (dsim_input_plan *)(uintptr_t)1;
    assert_int_equal(dsim_input_plan_make(&c, &p), DSIM_EINVAL);
    assert_null(p);
    assert_msg_has("2 file(s)");
    assert_msg_has("3 workers");
    dsim_input_plan_free(NULL);
    dsim_dataset_desc_release(&d);
}

/* DATA and OFF without a shuffle hand out the dataset in its own order: a
 * worker keeps only a step's ids, not a copy of the dataset (a job of W
 * workers over W x S examples would otherwise hold W^2 x S ids). Checked on
 * 2^26 examples (512 MiB of ids per worker before) with and without files;
 * the ids against the rebatch arithmetic: with G = N = 64 (DATA's legacy
 * rebatch) worker w's replica r takes example s*64 + w + r*32 at step s;
 * under OFF it takes s*2 + r of its own copy of the stream. */
static void test_unshuffled_stream_not_copied(void **state)
{
    (void)state;
    for (uint32_t nf = 0; nf <= 4; nf += 4) {
        dsim_dataset_desc d;
        assert_int_equal(dsim_dataset_desc_init(&d, 1ULL << 26, nf, DSIM_FILES_CONTIGUOUS),
                         DSIM_OK);
        for (int pol = 0; pol < 2; pol++) {
            dsim_input_config c = cfg_make(&d, pol ? DSIM_SHARD_OFF : DSIM_SHARD_DATA, 64, 32, 2);
            c.worker = 5;
            dsim_input *in;
#ifdef __GLIBC__
            struct mallinfo2 m0 = mallinfo2();
#endif
            assert_int_equal(dsim_input_create(&c, &in), DSIM_OK);
#ifdef __GLIBC__
            struct mallinfo2 m1 = mallinfo2();
            size_t grew = (m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd);
            print_message("%s, %u files: the input holds %zu bytes\n", pol ? "OFF" : "DATA", nf,
                          grew);
            assert_true(grew < 64 * 1024);
#endif
            for (uint64_t step = 0; step < 3; step++) {
                dsim_input_step st;
                assert_int_equal(dsim_input_next(in, &st), DSIM_OK);
                for (int r = 0; r < 2; r++) {
                    const dsim_replica_batch *b = &st.batch[r];
                    assert_true(b->has_value);
                    if (pol == 0) {
                        assert_int_equal(b->n, 1);
                        assert_int_equal(b->ids[0], step * 64 + 5 + (uint64_t)r * 32);
                    } else {
                        /* OFF: every worker reads the whole stream and its
                         * replicas take its sub-batches (size 1) in turn */
                        assert_int_equal(b->n, 1);
                        assert_int_equal(b->ids[0], step * 2 + (uint64_t)r);
                    }
                }
            }
            dsim_input_destroy(in);
        }
        dsim_dataset_desc_release(&d);
    }
}

/* A job's other inputs, made with steps_per_epoch from its first one, hand
 * out exactly the batches of inputs that compute it themselves, under every
 * policy, with and without files, shuffled or not; and a wrong dataset is
 * still refused when nothing is given. */
static void test_steps_given(void **state)
{
    (void)state;
    static const dsim_shard_policy ps[] = {DSIM_SHARD_OFF, DSIM_SHARD_FILE, DSIM_SHARD_DATA,
                                           DSIM_SHARD_AUTO, DSIM_SHARD_HINT};
    int compared = 0;
    for (uint32_t nf = 0; nf <= 9; nf += 9) {
        dsim_dataset_desc d;
        assert_int_equal(dsim_dataset_desc_init(&d, 53, nf, DSIM_FILES_STRIDED), DSIM_OK);
        d.hint = nf ? DSIM_HINT_FILES : DSIM_HINT_ELEMENTS;
        for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++)
            for (int nw = 1; nw <= 5; nw += 2)
                for (int64_t g = 3; g <= 24; g += 7)
                    for (int flags = 0; flags < 4; flags++) {
                        dsim_input_config c = cfg_make(&d, ps[pi], g, nw, 2);
                        c.shuffle = flags & 1;
                        c.drop_remainder = flags & 2;
                        c.epochs = 2;
                        dsim_input *first;
                        if (dsim_input_create(&c, &first) != DSIM_OK)
                            continue; /* a documented refusal (FILE with too few files...) */
                        uint64_t spe = dsim_input_steps_per_epoch(first);
                        dsim_input_destroy(first);
                        for (int w = 0; w < nw; w++) {
                            dsim_input *a, *b;
                            c.worker = w;
                            c.steps_per_epoch = 0;
                            assert_int_equal(dsim_input_create(&c, &a), DSIM_OK);
                            c.steps_per_epoch = spe;
                            assert_int_equal(dsim_input_create(&c, &b), DSIM_OK);
                            assert_int_equal(dsim_input_steps_per_epoch(b), spe);
                            assert_int_equal(dsim_input_worker_examples(a),
                                             dsim_input_worker_examples(b));
                            for (;;) {
                                dsim_input_step sa, sb;
                                assert_int_equal(dsim_input_next(a, &sa), DSIM_OK);
                                assert_int_equal(dsim_input_next(b, &sb), DSIM_OK);
                                assert_int_equal(sa.done, sb.done);
                                if (sa.done)
                                    break;
                                assert_int_equal(sa.worker_has_value, sb.worker_has_value);
                                assert_int_equal(sa.examples, sb.examples);
                                for (int r = 0; r < 2; r++) {
                                    assert_int_equal(sa.batch[r].n, sb.batch[r].n);
                                    assert_int_equal(sa.batch[r].has_value, sb.batch[r].has_value);
                                    if (sa.batch[r].n)
                                        assert_memory_equal(sa.batch[r].ids, sb.batch[r].ids,
                                                            sa.batch[r].n * sizeof(uint64_t));
                                }
                            }
                            dsim_input_destroy(a);
                            dsim_input_destroy(b);
                            compared++;
                        }
                    }
        dsim_dataset_desc_release(&d);
    }
    print_message("compared %d inputs made with the job's steps given\n", compared);
    assert_true(compared > 200);
    /* Nothing given: a bad file table is still found. */
    uint64_t start[] = {0, 2, 4}, ids[] = {0, 1, 1, 3};
    dsim_dataset_desc bad = {.n_examples = 4, .n_files = 2, .file_start = start, .file_ids = ids};
    dsim_input_config c = cfg_make(&bad, DSIM_SHARD_DATA, 2, 2, 1);
    dsim_input *in;
    assert_int_equal(dsim_input_create(&c, &in), DSIM_EINVAL);
    assert_msg_has("appears twice");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_sizes_tf_examples),
        cmocka_unit_test(test_batch_sizes_formula),
        cmocka_unit_test(test_batch_sizes_errors),
        cmocka_unit_test(test_policy_names),
        cmocka_unit_test(test_dataset_layouts_and_checks),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_file_error_names_both_counts),
        cmocka_unit_test(test_auto_reports_policy),
        cmocka_unit_test(test_tf_docstring_example),
        cmocka_unit_test(test_data_policy_rebatch),
        cmocka_unit_test(test_against_tf_ops),
        cmocka_unit_test(test_shard_tables),
        cmocka_unit_test(test_partial_last_batch),
        cmocka_unit_test(test_shuffle_per_epoch),
        cmocka_unit_test(test_drop_remainder),
        cmocka_unit_test(test_epochs_and_seek),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_unshuffled_stream_not_copied),
        cmocka_unit_test(test_steps_given),
    };
    return cmocka_run_group_tests_name("data", tests, NULL, NULL);
}
