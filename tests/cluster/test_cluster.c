/* The cluster spec: TF_CONFIG resolution and rejection, local clusters,
 * replica numbering and the TF_CONFIG round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dsim/cluster.h"
#include "dsim/err.h"

/* ---- valid TF_CONFIGs --------------------------------------------------- */

typedef struct valid_case {
    const char *name;
    const char *json;
    int dph;
    dsim_task_type type;
    int index;
    int is_chief;
    int worker_id;
    int num_workers;
    int from_tf_config;
    const char *rpc_layer;                   /* NULL: none */
    int ntasks[DSIM_TASK_TYPE_COUNT];        /* chief, worker, ps, evaluator */
    const char *first[DSIM_TASK_TYPE_COUNT]; /* address of task 0 of each job */
} valid_case;

static const valid_case valid_cases[] = {
    {
        .name = "workers only, worker 0 is chief",
        .json = "{\"cluster\": {\"worker\": [\"w0:2222\", \"w1:2222\", \"w2:2222\"]},"
                " \"task\": {\"type\": \"worker\", \"index\": 0}}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 3,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {0, 3, 0, 0},
        .first = {NULL, "w0:2222", NULL, NULL},
    },
    {
        .name = "workers only, worker 2",
        .json = "{\"cluster\": {\"worker\": [\"w0:2222\", \"w1:2222\", \"w2:2222\"]},"
                " \"task\": {\"type\": \"worker\", \"index\": 2}}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 2,
        .is_chief = 0,
        .worker_id = 2,
        .num_workers = 3,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {0, 3, 0, 0},
        .first = {NULL, "w0:2222", NULL, NULL},
    },
    {
        .name = "chief task",
        .json = "{\"cluster\": {\"chief\": [\"c:2222\"], \"worker\": [\"w0:2222\", \"w1:2222\"]},"
                " \"task\": {\"type\": \"chief\", \"index\": 0}}",
        .dph = 2,
        .type = DSIM_TASK_CHIEF,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 3,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {1, 2, 0, 0},
        .first = {"c:2222", "w0:2222", NULL, NULL},
    },
    {
        .name = "with a chief, worker 0 is not chief and has id 1",
        .json = "{\"cluster\": {\"chief\": [\"c:2222\"], \"worker\": [\"w0:2222\", \"w1:2222\"]},"
                " \"task\": {\"type\": \"worker\", \"index\": 0}}",
        .dph = 2,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 0,
        .worker_id = 1,
        .num_workers = 3,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {1, 2, 0, 0},
        .first = {"c:2222", "w0:2222", NULL, NULL},
    },
    {
        .name = "with a chief, worker 1 has id 2",
        .json = "{\"cluster\": {\"worker\": [\"w0:2222\", \"w1:2222\"], \"chief\": [\"c:2222\"]},"
                " \"task\": {\"type\": \"worker\", \"index\": 1}}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 1,
        .is_chief = 0,
        .worker_id = 2,
        .num_workers = 3,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {1, 2, 0, 0},
        .first = {"c:2222", "w0:2222", NULL, NULL},
    },
    {
        .name = "ps task is outside the all-reduce group",
        .json = "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w:1\"], \"ps\": [\"p0:1\", "
                "\"p1:1\"]},"
                " \"task\": {\"type\": \"ps\", \"index\": 1}}",
        .dph = 1,
        .type = DSIM_TASK_PS,
        .index = 1,
        .is_chief = 0,
        .worker_id = -1,
        .num_workers = 2,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {1, 1, 2, 0},
        .first = {"c:1", "w:1", "p0:1", NULL},
    },
    {
        .name = "evaluator in the cluster is its own chief",
        .json =
            "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w:1\"], \"evaluator\": [\"e:1\"]},"
            " \"task\": {\"type\": \"evaluator\", \"index\": 0}}",
        .dph = 1,
        .type = DSIM_TASK_EVALUATOR,
        .index = 0,
        .is_chief = 1,
        .worker_id = -1,
        .num_workers = 2,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {1, 1, 0, 1},
        .first = {"c:1", "w:1", NULL, "e:1"},
    },
    {
        .name = "evaluator may stand outside the cluster",
        .json = "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"]},"
                " \"task\": {\"type\": \"evaluator\", \"index\": 0}}",
        .dph = 1,
        .type = DSIM_TASK_EVALUATOR,
        .index = 0,
        .is_chief = 1,
        .worker_id = -1,
        .num_workers = 2,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {0, 2, 0, 0},
        .first = {NULL, "w0:1", NULL, NULL},
    },
    {
        .name = "evaluator-only cluster",
        .json = "{\"cluster\": {\"evaluator\": [\"e:1\"]}, \"task\": {\"type\": \"evaluator\", "
                "\"index\": 0}}",
        .dph = 3,
        .type = DSIM_TASK_EVALUATOR,
        .index = 0,
        .is_chief = 1,
        .worker_id = -1,
        .num_workers = 0,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {0, 0, 0, 1},
        .first = {NULL, NULL, NULL, "e:1"},
    },
    {
        .name = "unknown extra keys are tolerated",
        .json =
            "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"]}, \"environment\": \"cloud\","
            " \"session_master\": \"grpc://x:1\", \"task\": {\"type\": \"worker\", \"index\": 1,"
            " \"trial\": \"7\"}, \"rpc_layer\": \"grpc\", \"zzz\": [1, {\"a\": null}]}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 1,
        .is_chief = 0,
        .worker_id = 1,
        .num_workers = 2,
        .from_tf_config = 1,
        .rpc_layer = "grpc",
        .ntasks = {0, 2, 0, 0},
        .first = {NULL, "w0:1", NULL, NULL},
    },
    {
        .name = "index as a decimal string, as TF's int() takes it",
        .json = "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"]}, \"task\": {\"type\": \"worker\","
                " \"index\": \"01\"}}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 1,
        .is_chief = 0,
        .worker_id = 1,
        .num_workers = 2,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {0, 2, 0, 0},
        .first = {NULL, "w0:1", NULL, NULL},
    },
    {
        .name = "IPv6 and dotted addresses",
        .json = "{\"cluster\": {\"worker\": [\"[::1]:2222\", \"10.0.0.2:65535\"]},"
                " \"task\": {\"type\": \"worker\", \"index\": 0}, \"rpc_layer\": null}",
        .dph = 4,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 2,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {0, 2, 0, 0},
        .first = {NULL, "[::1]:2222", NULL, NULL},
    },
    {
        .name = "empty rpc_layer is none, as TF's truth test",
        .json =
            "{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0},"
            " \"rpc_layer\": \"\"}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 1,
        .from_tf_config = 1,
        .rpc_layer = NULL,
        .ntasks = {0, 1, 0, 0},
        .first = {NULL, "w:1", NULL, NULL},
    },
    {
        .name = "missing TF_CONFIG is a local single worker",
        .json = NULL,
        .dph = 2,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 1,
        .from_tf_config = 0,
        .rpc_layer = NULL,
        .ntasks = {0, 1, 0, 0},
        .first = {NULL, "localhost:2222", NULL, NULL},
    },
    {
        .name = "empty TF_CONFIG is local",
        .json = "",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 1,
        .from_tf_config = 0,
        .rpc_layer = NULL,
        .ntasks = {0, 1, 0, 0},
        .first = {NULL, "localhost:2222", NULL, NULL},
    },
    {
        .name = "{} is local",
        .json = "{}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 1,
        .from_tf_config = 0,
        .rpc_layer = NULL,
        .ntasks = {0, 1, 0, 0},
        .first = {NULL, "localhost:2222", NULL, NULL},
    },
    {
        .name = "null cluster and task, with rpc_layer, is local",
        .json = "{\"cluster\": null, \"task\": null, \"rpc_layer\": \"grpc+verbs\"}",
        .dph = 1,
        .type = DSIM_TASK_WORKER,
        .index = 0,
        .is_chief = 1,
        .worker_id = 0,
        .num_workers = 1,
        .from_tf_config = 0,
        .rpc_layer = "grpc+verbs",
        .ntasks = {0, 1, 0, 0},
        .first = {NULL, "localhost:2222", NULL, NULL},
    },
};

static void check_valid(const valid_case *vc, const dsim_cluster *c)
{
    assert_int_equal(c->task_type, vc->type);
    assert_int_equal(c->task_index, vc->index);
    assert_int_equal(c->is_chief, vc->is_chief);
    assert_int_equal(c->worker_id, vc->worker_id);
    assert_int_equal(c->num_workers, vc->num_workers);
    assert_int_equal(c->devices_per_host, vc->dph);
    assert_int_equal(c->num_replicas, vc->num_workers * vc->dph);
    assert_int_equal(c->from_tf_config, vc->from_tf_config);
    if (vc->rpc_layer)
        assert_string_equal(c->rpc_layer, vc->rpc_layer);
    else
        assert_null(c->rpc_layer);
    for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++) {
        assert_int_equal(c->jobs[t].ntasks, vc->ntasks[t]);
        if (vc->first[t])
            assert_string_equal(c->jobs[t].addrs[0], vc->first[t]);
        else
            assert_null(c->jobs[t].addrs);
    }
}

static void test_valid_tf_configs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof valid_cases / sizeof valid_cases[0]; i++) {
        const valid_case *vc = &valid_cases[i];
        print_message("valid: %s\n", vc->name);
        dsim_cluster c;
        dsim_err e = dsim_cluster_from_tf_config(vc->json, vc->dph, &c);
        if (e != DSIM_OK)
            fail_msg("%s: %s", vc->name, dsim_errmsg());
        check_valid(vc, &c);
        dsim_cluster_free(&c);
        assert_null(c.jobs[DSIM_TASK_WORKER].addrs);
        dsim_cluster_free(&c); /* twice is harmless */
    }
}

static void test_from_env(void **state)
{
    (void)state;
    dsim_cluster c;
    assert_int_equal(unsetenv("TF_CONFIG"), 0);
    assert_int_equal(dsim_cluster_from_env(3, &c), DSIM_OK);
    assert_int_equal(c.from_tf_config, 0);
    assert_int_equal(c.num_workers, 1);
    assert_int_equal(c.num_replicas, 3);
    assert_int_equal(c.is_chief, 1);
    dsim_cluster_free(&c);

    assert_int_equal(setenv("TF_CONFIG",
                            "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"a:1\", \"b:1\"]},"
                            " \"task\": {\"type\": \"worker\", \"index\": 1}}",
                            1),
                     0);
    assert_int_equal(dsim_cluster_from_env(1, &c), DSIM_OK);
    assert_int_equal(c.from_tf_config, 1);
    assert_int_equal(c.worker_id, 2);
    assert_int_equal(c.num_workers, 3);
    dsim_cluster_free(&c);

    assert_int_equal(setenv("TF_CONFIG", "{\"task\": 1", 1), 0);
    assert_int_equal(dsim_cluster_from_env(1, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "not valid JSON"));

    assert_int_equal(setenv("TF_CONFIG", "", 1), 0);
    assert_int_equal(dsim_cluster_from_env(1, &c), DSIM_OK);
    assert_int_equal(c.from_tf_config, 0);
    dsim_cluster_free(&c);
    assert_int_equal(unsetenv("TF_CONFIG"), 0);
}

/* ---- rejected TF_CONFIGs ------------------------------------------------ */

#define W2      "\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"]}"
#define TASK_W0 "\"task\": {\"type\": \"worker\", \"index\": 0}"

typedef struct invalid_case {
    const char *name;
    const char *json;
    int dph;
    const char *words[4]; /* each must appear in the message */
} invalid_case;

static const invalid_case invalid_cases[] = {
    /* TF's json.loads raises on it: not the same as unset or empty */
    {"only white space", " \n\t", 1, {"TF_CONFIG", "\" \\n\\t\"", "only white space"}},
    {"malformed JSON", "{\"cluster\": ", 1, {"TF_CONFIG", "not valid JSON", "line 1", "column"}},
    {"malformed JSON on line 3",
     "{\n  \"cluster\": {\n    \"worker\": [\"a:1\" \"b:1\"]\n  }\n}",
     1,
     {"not valid JSON", "line 3", "accepted"}},
    {"trailing garbage", "{} x", 1, {"not valid JSON", "end of file expected"}},
    {"top level is an array",
     "[{\"cluster\": {}}]",
     1,
     {"the top level is", "an array", "accepted"}},
    {"duplicate key", "{" W2 ", \"cluster\": {}}", 1, {"not valid JSON", "duplicate"}},
    {"two chiefs",
     "{\"cluster\": {\"chief\": [\"c0:1\", \"c1:1\"], \"worker\": [\"w:1\"]}, " TASK_W0 "}",
     1,
     {"\"cluster.chief\"", "2 tasks", "at most one 'chief'"}},
    {"two evaluators",
     "{\"cluster\": {\"worker\": [\"w:1\"], \"evaluator\": [\"e0:1\", \"e1:1\"]}, " TASK_W0 "}",
     1,
     {"\"cluster.evaluator\"", "2 tasks", "at most one 'evaluator'"}},
    {"index out of range",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": 3}}",
     1,
     {"\"task.index\" is 3", "job \"worker\" has 2 tasks", "accepted: 0..1"}},
    {"index equal to the job size",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": 2}}",
     1,
     {"\"task.index\" is 2", "accepted: 0..1"}},
    {"negative index",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": -1}}",
     1,
     {"\"task.index\" is -1", "accepted: 0..1"}},
    {"negative index as a string",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": \"-1\"}}",
     1,
     {"\"task.index\" is \"-1\"", "accepted: 0..1"}},
    {"index string out of range",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": \"99999999999999999999999\"}}",
     1,
     {"\"task.index\" is \"99999999999999999999999\"", "has 2 tasks"}},
    {"index beyond int",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": 4294967296}}",
     1,
     {"\"task.index\" is 4294967296", "accepted: 0..1"}},
    {"real index",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": 1.0}}",
     1,
     {"\"task.index\" is 1.0", "a real number", "non-negative integer"}},
    {"boolean index",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": true}}",
     1,
     {"\"task.index\" is true", "a boolean"}},
    {"non-numeric index string",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": \"one\"}}",
     1,
     {"\"task.index\" is \"one\"", "a string", "decimal digits"}},
    {"index string with a space",
     "{" W2 ", \"task\": {\"type\": \"worker\", \"index\": \"1 \"}}",
     1,
     {"\"task.index\" is \"1 \""}},
    {"unknown task type",
     "{" W2 ", \"task\": {\"type\": \"master\", \"index\": 0}}",
     1,
     {"\"task.type\" is \"master\"", "\"chief\", \"worker\", \"ps\", \"evaluator\""}},
    {"task type is not a string",
     "{" W2 ", \"task\": {\"type\": 0, \"index\": 0}}",
     1,
     {"\"task.type\" is 0", "accepted"}},
    {"task type not in the cluster",
     "{" W2 ", \"task\": {\"type\": \"chief\", \"index\": 0}}",
     1,
     {"\"task.type\" is \"chief\"", "no job \"chief\""}},
    {"ps task without a ps job",
     "{" W2 ", \"task\": {\"type\": \"ps\", \"index\": 0}}",
     1,
     {"\"task.type\" is \"ps\"", "no job \"ps\""}},
    {"unknown job in the cluster",
     "{\"cluster\": {\"worker\": [\"w:1\"], \"master\": [\"m:1\"]}, " TASK_W0 "}",
     1,
     {"\"cluster\" has a job named \"master\"", "accepted job names", "\"evaluator\""}},
    {"cluster is an array",
     "{\"cluster\": [\"w:1\"], " TASK_W0 "}",
     1,
     {"\"cluster\" is [\"w:1\"]", "an array", "accepted"}},
    {"job is a string",
     "{\"cluster\": {\"worker\": \"w:1\"}, " TASK_W0 "}",
     1,
     {"\"cluster.worker\" is \"w:1\"", "a string", "array of \"HOST:PORT\""}},
    {"sparse job object",
     "{\"cluster\": {\"worker\": {\"1\": \"w:1\"}}, " TASK_W0 "}",
     1,
     {"\"cluster.worker\"", "sparse", "task index order"}},
    {"empty job",
     "{\"cluster\": {\"worker\": [\"w:1\"], \"ps\": []}, " TASK_W0 "}",
     1,
     {"\"cluster.ps\" is []", "no tasks"}},
    {"address not a string",
     "{\"cluster\": {\"worker\": [\"w:1\", 2222]}, " TASK_W0 "}",
     1,
     {"\"cluster.worker[1]\" is 2222", "an integer", "HOST:PORT"}},
    {"address without port",
     "{\"cluster\": {\"worker\": [\"w\"]}, " TASK_W0 "}",
     1,
     {"\"cluster.worker[0]\" is \"w\"", "no \":PORT\"", "HOST:PORT"}},
    {"port 0",
     "{\"cluster\": {\"worker\": [\"w:0\"]}, " TASK_W0 "}",
     1,
     {"\"cluster.worker[0]\" is \"w:0\"", "PORT", "1..65535"}},
    {"port too large",
     "{\"cluster\": {\"worker\": [\"w:65536\"]}, " TASK_W0 "}",
     1,
     {"\"w:65536\"", "1..65535"}},
    {"port not a number",
     "{\"cluster\": {\"worker\": [\"w:http\"]}, " TASK_W0 "}",
     1,
     {"\"w:http\"", "PORT"}},
    {"empty host",
     "{\"cluster\": {\"worker\": [\":2222\"]}, " TASK_W0 "}",
     1,
     {"\":2222\"", "HOST is empty"}},
    {"white space in address",
     "{\"cluster\": {\"worker\": [\"w :1\"]}, " TASK_W0 "}",
     1,
     {"\"w :1\"", "white space"}},
    {"unbracketed IPv6",
     "{\"cluster\": {\"worker\": [\"::1:2222\"]}, " TASK_W0 "}",
     1,
     {"\"::1:2222\"", "brackets"}},
    {"NUL in an address",
     "{\"cluster\": {\"worker\": [\"w\\u0000x:1\"]}, " TASK_W0 "}",
     1,
     {"not valid JSON", "\\u0000"}},
    {"duplicate address across jobs",
     "{\"cluster\": {\"worker\": [\"w:1\", \"c:1\"], \"chief\": [\"c:1\"]}, " TASK_W0 "}",
     1,
     {"\"cluster.chief[0]\" and \"cluster.worker[1]\" are both \"c:1\"", "different"}},
    {"missing task", "{" W2 "}", 1, {"\"task\" is missing", "1 job", "\"type\""}},
    {"task is not an object",
     "{" W2 ", \"task\": \"worker:0\"}",
     1,
     {"\"task\" is \"worker:0\"", "a string", "accepted"}},
    {"task without type",
     "{" W2 ", \"task\": {\"index\": 0}}",
     1,
     {"\"task.type\" is missing", "\"worker\""}},
    {"task without index",
     "{" W2 ", \"task\": {\"type\": \"worker\"}}",
     1,
     {"\"task.index\" is missing", "job \"worker\""}},
    {"task without cluster", "{" TASK_W0 "}", 1, {"\"cluster\" is missing", "\"task\" is given"}},
    {"task with an empty cluster",
     "{\"cluster\": {}, " TASK_W0 "}",
     1,
     {"\"cluster\" is {}", "\"task\" is given"}},
    {"rpc_layer not a string",
     "{" W2 ", " TASK_W0 ", \"rpc_layer\": 5}",
     1,
     {"\"rpc_layer\" is 5", "an integer", "\"grpc\""}},
    {"ps with nobody to serve",
     "{\"cluster\": {\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}",
     1,
     {"no \"chief\" or \"worker\" job", "\"ps\""}},
    {"evaluator outside the cluster with index 1",
     "{" W2 ", \"task\": {\"type\": \"evaluator\", \"index\": 1}}",
     1,
     {"\"task.index\" is 1", "evaluator outside the cluster", "accepted: 0"}},
    {"zero devices per host", "{" W2 ", " TASK_W0 "}", 0, {"devices per host is 0", "1..4096"}},
    {"too many devices per host", NULL, 4097, {"devices per host is 4097", "1..4096"}},
    {"long values are cut in the message",
     "{" W2
     ", \"task\": {\"type\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "x"
     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "x"
     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "x"
     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "x"
     "xxxxxxxxx\", \"index\": 0}}",
     1,
     {"\"task.type\" is \"xxxx", "...", "\"chief\", \"worker\", \"ps\", \"evaluator\")"}},
};

static void test_invalid_tf_configs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof invalid_cases / sizeof invalid_cases[0]; i++) {
        const invalid_case *ic = &invalid_cases[i];
        print_message("invalid: %s\n", ic->name);
        dsim_cluster c;
        memset(&c, 0x5a, sizeof c);
        dsim_clear_error();
        dsim_err e = dsim_cluster_from_tf_config(ic->json, ic->dph, &c);
        if (e != DSIM_EINVAL)
            fail_msg("%s: got %d (%s) instead of DSIM_EINVAL", ic->name, (int)e, dsim_errmsg());
        assert_int_equal(dsim_last_error()->code, DSIM_EINVAL);
        const char *msg = dsim_errmsg();
        for (int w = 0; w < 4 && ic->words[w]; w++)
            if (!strstr(msg, ic->words[w]))
                fail_msg("%s: message lacks '%s': %s", ic->name, ic->words[w], msg);
        /* every TF_CONFIG rejection says what is accepted */
        if (!strstr(msg, "accepted"))
            fail_msg("%s: message does not say what is accepted: %s", ic->name, msg);
        /* a failed parse leaves nothing to free */
        for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++) {
            assert_int_equal(c.jobs[t].ntasks, 0);
            assert_null(c.jobs[t].addrs);
        }
        assert_null(c.rpc_layer);
        dsim_cluster_free(&c);
    }
}

/* ---- local clusters and replica numbering ------------------------------- */

static void test_local_cluster(void **state)
{
    (void)state;
    dsim_cluster c;
    assert_int_equal(dsim_cluster_local(4, 2, 2, &c), DSIM_OK);
    assert_int_equal(c.from_tf_config, 0);
    assert_int_equal(c.task_type, DSIM_TASK_WORKER);
    assert_int_equal(c.task_index, 2);
    assert_int_equal(c.is_chief, 0);
    assert_int_equal(c.worker_id, 2);
    assert_int_equal(c.num_workers, 4);
    assert_int_equal(c.num_replicas, 8);
    assert_int_equal(c.jobs[DSIM_TASK_CHIEF].ntasks, 0);
    assert_int_equal(c.jobs[DSIM_TASK_WORKER].ntasks, 4);
    for (int i = 0; i < 4; i++) {
        char want[32];
        snprintf(want, sizeof want, "localhost:%d", DSIM_CLUSTER_LOCAL_PORT_BASE + i);
        assert_string_equal(c.jobs[DSIM_TASK_WORKER].addrs[i], want);
        assert_string_equal(dsim_cluster_worker_address(&c, i), want);
    }
    assert_null(dsim_cluster_worker_address(&c, 4));
    assert_null(dsim_cluster_worker_address(&c, -1));
    dsim_cluster_free(&c);

    assert_int_equal(dsim_cluster_local(4, 2, 0, &c), DSIM_OK);
    assert_int_equal(c.is_chief, 1);
    dsim_cluster_free(&c);

    assert_int_equal(dsim_cluster_local(0, 1, 0, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "hosts is 0"));
    assert_int_equal(dsim_cluster_local(70000, 1, 0, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "hosts is 70000"));
    assert_int_equal(dsim_cluster_local(2, 1, 2, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "worker is 2"));
    assert_non_null(strstr(dsim_errmsg(), "0..1"));
    assert_int_equal(dsim_cluster_local(2, 0, 0, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "devices per host is 0"));
    assert_null(c.jobs[DSIM_TASK_WORKER].addrs);
    /* 63314 hosts x 4096 devices exceeds the replica bound */
    assert_int_equal(dsim_cluster_local(63314, 4096, 0, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "replicas"));
    assert_null(c.jobs[DSIM_TASK_WORKER].addrs);
}

static void test_replica_mapping(void **state)
{
    (void)state;
    const int shapes[][2] = {{1, 1}, {1, 8}, {5, 1}, {3, 4}, {7, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int hosts = shapes[s][0], dph = shapes[s][1];
        dsim_cluster c;
        assert_int_equal(dsim_cluster_local(hosts, dph, 0, &c), DSIM_OK);
        assert_int_equal(c.num_replicas, hosts * dph);
        int expect = 0;
        for (int w = 0; w < hosts; w++) {
            for (int d = 0; d < dph; d++) {
                int r = -1, w2 = -1, d2 = -1;
                assert_int_equal(dsim_cluster_replica(&c, w, d, &r), DSIM_OK);
                assert_int_equal(r, expect); /* worker-major, dense */
                assert_int_equal(dsim_cluster_replica_place(&c, r, &w2, &d2), DSIM_OK);
                assert_int_equal(w2, w);
                assert_int_equal(d2, d);
                expect++;
            }
        }
        int r, w, d;
        assert_int_equal(dsim_cluster_replica(&c, hosts, 0, &r), DSIM_EINVAL);
        assert_non_null(strstr(dsim_errmsg(), "worker"));
        assert_int_equal(dsim_cluster_replica(&c, 0, dph, &r), DSIM_EINVAL);
        assert_non_null(strstr(dsim_errmsg(), "device"));
        assert_int_equal(dsim_cluster_replica(&c, -1, 0, &r), DSIM_EINVAL);
        assert_int_equal(dsim_cluster_replica_place(&c, hosts * dph, &w, &d), DSIM_EINVAL);
        assert_non_null(strstr(dsim_errmsg(), "replica"));
        assert_int_equal(dsim_cluster_replica_place(&c, -1, &w, &d), DSIM_EINVAL);
        dsim_cluster_free(&c);
    }

    /* With a chief, worker id 0 is the chief and its replicas come first. */
    dsim_cluster c;
    assert_int_equal(dsim_cluster_from_tf_config(
                         "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"], \"chief\": [\"c:1\"]},"
                         " \"task\": {\"type\": \"worker\", \"index\": 1}}",
                         2, &c),
                     DSIM_OK);
    int r, w, d;
    assert_int_equal(dsim_cluster_replica(&c, c.worker_id, 1, &r), DSIM_OK);
    assert_int_equal(r, 5);
    assert_int_equal(dsim_cluster_replica_place(&c, 3, &w, &d), DSIM_OK);
    assert_int_equal(w, 1);
    assert_int_equal(d, 1);
    assert_string_equal(dsim_cluster_worker_address(&c, 0), "c:1");
    assert_string_equal(dsim_cluster_worker_address(&c, 1), "w0:1");
    assert_string_equal(dsim_cluster_worker_address(&c, 2), "w1:1");
    assert_null(dsim_cluster_worker_address(&c, 3));
    dsim_cluster_free(&c);
}

/* A TF_CONFIG written for each task parses back to the same cluster with
 * that task, and the worker ids of the tasks cover 0..num_workers-1 once. */
static void test_tf_config_round_trip(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof valid_cases / sizeof valid_cases[0]; i++) {
        const valid_case *vc = &valid_cases[i];
        dsim_cluster c;
        assert_int_equal(dsim_cluster_from_tf_config(vc->json, vc->dph, &c), DSIM_OK);
        int seen[16] = {0};
        int chiefs = 0;
        for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++) {
            for (int k = 0; k < c.jobs[t].ntasks; k++) {
                char *text = NULL;
                assert_int_equal(dsim_cluster_to_tf_config(&c, (dsim_task_type)t, k, &text),
                                 DSIM_OK);
                dsim_cluster back;
                if (dsim_cluster_from_tf_config(text, vc->dph, &back) != DSIM_OK)
                    fail_msg("%s: %s does not parse back: %s", vc->name, text, dsim_errmsg());
                free(text);
                assert_int_equal(back.task_type, t);
                assert_int_equal(back.task_index, k);
                assert_int_equal(back.num_workers, c.num_workers);
                assert_int_equal(back.from_tf_config, 1);
                if (c.rpc_layer)
                    assert_string_equal(back.rpc_layer, c.rpc_layer);
                else
                    assert_null(back.rpc_layer);
                for (int u = 0; u < DSIM_TASK_TYPE_COUNT; u++) {
                    assert_int_equal(back.jobs[u].ntasks, c.jobs[u].ntasks);
                    for (int j = 0; j < c.jobs[u].ntasks; j++)
                        assert_string_equal(back.jobs[u].addrs[j], c.jobs[u].addrs[j]);
                }
                if (back.worker_id >= 0) {
                    assert_true(back.worker_id < c.num_workers && back.worker_id < 16);
                    seen[back.worker_id]++;
                }
                chiefs += back.is_chief && t != DSIM_TASK_EVALUATOR;
                dsim_cluster_free(&back);
            }
        }
        for (int w = 0; w < c.num_workers; w++)
            assert_int_equal(seen[w], 1);
        assert_int_equal(chiefs, c.num_workers > 0 ? 1 : 0);

        char *text = (char *)"untouched";
        assert_int_equal(
            dsim_cluster_to_tf_config(&c, DSIM_TASK_PS, c.jobs[DSIM_TASK_PS].ntasks, &text),
            DSIM_EINVAL);
        assert_null(text);
        assert_int_equal(dsim_cluster_to_tf_config(&c, DSIM_TASK_TYPE_COUNT, 0, &text),
                         DSIM_EINVAL);
        dsim_cluster_free(&c);
    }
}

static void test_task_type_names(void **state)
{
    (void)state;
    assert_string_equal(dsim_task_type_name(DSIM_TASK_CHIEF), "chief");
    assert_string_equal(dsim_task_type_name(DSIM_TASK_WORKER), "worker");
    assert_string_equal(dsim_task_type_name(DSIM_TASK_PS), "ps");
    assert_string_equal(dsim_task_type_name(DSIM_TASK_EVALUATOR), "evaluator");
    assert_string_equal(dsim_task_type_name(DSIM_TASK_TYPE_COUNT), "?");
    assert_string_equal(dsim_task_type_name((dsim_task_type)-1), "?");
    dsim_cluster_free(NULL);
}

/* The sim engine runs thousands of workers: a big TF_CONFIG resolves, and
 * the duplicate check finds a repeat at the far end. */
static void test_large_cluster(void **state)
{
    (void)state;
    enum { N = 4000 };
    size_t cap = (size_t)N * 24 + 128;
    char *json = malloc(cap);
    assert_non_null(json);
    size_t n = (size_t)snprintf(json, cap, "{\"cluster\": {\"worker\": [");
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(json + n, cap - n, "%s\"h%d:2222\"", i ? ", " : "", i);
    snprintf(json + n, cap - n, "]}, \"task\": {\"type\": \"worker\", \"index\": %d}}", N - 1);
    dsim_cluster c;
    assert_int_equal(dsim_cluster_from_tf_config(json, 8, &c), DSIM_OK);
    assert_int_equal(c.num_workers, N);
    assert_int_equal(c.num_replicas, N * 8);
    assert_int_equal(c.worker_id, N - 1);
    dsim_cluster_free(&c);

    /* make the last address repeat the first */
    char *last = strstr(json, "\"h3999:2222\"");
    assert_non_null(last);
    memcpy(last, "\"h0:2222\"   ", 12);
    assert_int_equal(dsim_cluster_from_tf_config(json, 8, &c), DSIM_EINVAL);
    assert_non_null(strstr(dsim_errmsg(), "\"cluster.worker[0]\" and \"cluster.worker[3999]\""));
    free(json);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_tf_configs),   cmocka_unit_test(test_from_env),
        cmocka_unit_test(test_invalid_tf_configs), cmocka_unit_test(test_local_cluster),
        cmocka_unit_test(test_replica_mapping),    cmocka_unit_test(test_tf_config_round_trip),
        cmocka_unit_test(test_task_type_names),    cmocka_unit_test(test_large_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
