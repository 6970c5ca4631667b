/* `dsim cluster`, run as a program: exit status, JSON on stdout, the reason
 * on stderr. The executable's path comes from $DSIM_EXE (set by meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *cli_exe;

typedef struct cli_result {
    int status; /* exit status, or -1 if it did not exit normally */
    char out[65536];
    char err[4096];
} cli_result;

static void cli_slurp(FILE *f, char *buf, size_t cap)
{
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Runs `dsim cluster ARGS...` with TF_CONFIG set to tf_config (NULL: unset). */
static void cli_run(cli_result *res, const char *tf_config, const char *const *args)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)cli_exe;
    argv[argc++] = (char *)"cluster";
    for (int i = 0; args && args[i]; i++) {
        assert_true(argc < 15);
        argv[argc++] = (char *)args[i];
    }
    argv[argc] = NULL;

    /* The caller's environment (sanitizer options included) minus TF_CONFIG,
     * then ours. */
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **envp = calloc(nenv + 2, sizeof *envp);
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "TF_CONFIG=", 10) != 0)
            envp[k++] = environ[i];
    char *tfc = NULL;
    if (tf_config) {
        assert_int_not_equal(asprintf(&tfc, "TF_CONFIG=%s", tf_config), -1);
        envp[k++] = tfc;
    }
    FILE *out = tmpfile(), *err = tmpfile();
    assert_non_null(out);
    assert_non_null(err);
    posix_spawn_file_actions_t fa;
    assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
    assert_int_equal(posix_spawn_file_actions_adddup2(&fa, fileno(out), STDOUT_FILENO), 0);
    assert_int_equal(posix_spawn_file_actions_adddup2(&fa, fileno(err), STDERR_FILENO), 0);
    pid_t pid;
    int rc = posix_spawn(&pid, cli_exe, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(tfc);
    free(envp);
    assert_int_equal(rc, 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    res->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    cli_slurp(out, res->out, sizeof res->out);
    cli_slurp(err, res->err, sizeof res->err);
}

/* stdout as a JSON object; the test fails if it is not one. */
static json_t *cli_json(const cli_result *res)
{
    json_error_t jerr;
    json_t *j = json_loads(res->out, 0, &jerr);
    if (!j)
        fail_msg("stdout is not JSON (%s at %d:%d): %s", jerr.text, jerr.line, jerr.column,
                 res->out);
    assert_true(json_is_object(j));
    return j;
}

static long long cli_int(const json_t *j, const char *key)
{
    const json_t *v = json_object_get(j, key);
    if (!json_is_integer(v))
        fail_msg("\"%s\" is not an integer", key);
    return json_integer_value(v);
}

#define CHIEF_2W                                                                                   \
    "{\"cluster\": {\"chief\": [\"c:2222\"], \"worker\": [\"w0:2222\", \"w1:2222\"],"              \
    " \"ps\": [\"p:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 1},"                      \
    " \"rpc_layer\": \"grpc\"}"

static void test_local_default(void **state)
{
    (void)state;
    cli_result *r = malloc(sizeof *r);
    assert_non_null(r);
    cli_run(r, NULL, NULL);
    assert_int_equal(r->status, 0);
    json_t *j = cli_json(r);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "local");
    assert_int_equal(cli_int(j, "worker_id"), 0);
    assert_int_equal(cli_int(j, "num_workers"), 1);
    assert_true(json_is_true(json_object_get(j, "is_chief")));
    assert_true(json_is_null(json_object_get(j, "rpc_layer")));
    json_decref(j);
    free(r);
}

static void test_tf_config_flag_and_env(void **state)
{
    (void)state;
    cli_result *r = malloc(sizeof *r);
    assert_non_null(r);
    const char *flag_args[] = {"--tf-config", CHIEF_2W, "--devices-per-host=2", NULL};
    const char *env_args[] = {"--devices-per-host", "2", NULL};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) /* the flag wins over a different $TF_CONFIG */
            cli_run(r,
                    "{\"cluster\": {\"worker\": [\"x:1\"]}, \"task\": {\"type\": \"worker\", "
                    "\"index\": 0}}",
                    flag_args);
        else
            cli_run(r, CHIEF_2W, env_args);
        if (r->status != 0)
            fail_msg("pass %d: exit %d: %s", pass, r->status, r->err);
        json_t *j = cli_json(r);
        assert_string_equal(json_string_value(json_object_get(j, "source")), "tf_config");
        const json_t *task = json_object_get(j, "task");
        assert_string_equal(json_string_value(json_object_get(task, "type")), "worker");
        assert_int_equal(cli_int(task, "index"), 1);
        assert_int_equal(cli_int(j, "worker_id"), 2);
        assert_true(json_is_false(json_object_get(j, "is_chief")));
        assert_int_equal(cli_int(j, "num_workers"), 3);
        assert_int_equal(cli_int(j, "devices_per_host"), 2);
        assert_int_equal(cli_int(j, "num_replicas"), 6);
        const json_t *reps = json_object_get(j, "replicas");
        assert_int_equal(json_array_size(reps), 6);
        for (size_t k = 0; k < 6; k++) {
            const json_t *rep = json_array_get(reps, k);
            assert_int_equal(cli_int(rep, "replica"), (long long)k);
            assert_int_equal(cli_int(rep, "worker"), (long long)k / 2);
            assert_int_equal(cli_int(rep, "device"), (long long)k % 2);
        }
        const json_t *cl = json_object_get(j, "cluster");
        assert_string_equal(json_string_value(json_array_get(json_object_get(cl, "chief"), 0)),
                            "c:2222");
        assert_string_equal(json_string_value(json_array_get(json_object_get(cl, "worker"), 1)),
                            "w1:2222");
        assert_string_equal(json_string_value(json_array_get(json_object_get(cl, "ps"), 0)),
                            "p:2222");
        assert_null(json_object_get(cl, "evaluator"));
        assert_string_equal(json_string_value(json_object_get(j, "rpc_layer")), "grpc");
        json_decref(j);
    }
    free(r);
}

/* A TF_CONFIG of only white space is not "unset": TensorFlow's json.loads
 * raises on it, so it is refused naming the value, from the flag and from
 * the environment; an empty one is a local single worker. */
static void test_blank_tf_config(void **state)
{
    (void)state;
    cli_result *r = malloc(sizeof *r);
    assert_non_null(r);
    const char *args[] = {"--tf-config", "   ", NULL};
    cli_run(r, NULL, args);
    assert_int_equal(r->status, 2);
    assert_string_equal(r->out, "");
    if (!strstr(r->err, "TF_CONFIG: the text is \"   \", only white space"))
        fail_msg("stderr: %s", r->err);
    cli_run(r, " \t", NULL);
    assert_int_equal(r->status, 2);
    if (!strstr(r->err, "\" \\t\", only white space") || !strstr(r->err, "[from $TF_CONFIG]"))
        fail_msg("stderr: %s", r->err);
    cli_run(r, "", NULL);
    assert_int_equal(r->status, 0);
    const char *empty[] = {"--tf-config", "", NULL};
    cli_run(r, NULL, empty);
    assert_int_equal(r->status, 0);
    json_t *j = cli_json(r);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "local");
    json_decref(j);
    free(r);
}

static void test_ps_task_has_no_worker_id(void **state)
{
    (void)state;
    cli_result *r = malloc(sizeof *r);
    assert_non_null(r);
    const char *args[] = {"--tf-config",
                          "{\"cluster\": {\"worker\": [\"w:1\"], \"ps\": [\"p:1\"]},"
                          " \"task\": {\"type\": \"ps\", \"index\": 0}}",
                          NULL};
    cli_run(r, NULL, args);
    assert_int_equal(r->status, 0);
    json_t *j = cli_json(r);
    assert_true(json_is_null(json_object_get(j, "worker_id")));
    assert_int_equal(cli_int(j, "num_workers"), 1);
    json_decref(j);
    free(r);
}

static void test_hosts(void **state)
{
    (void)state;
    cli_result *r = malloc(sizeof *r);
    assert_non_null(r);
    const char *args[] = {"--hosts", "4", "--devices-per-host", "2", NULL};
    cli_run(r, CHIEF_2W, args); /* --hosts wins over $TF_CONFIG */
    assert_int_equal(r->status, 0);
    json_t *j = cli_json(r);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "local");
    assert_int_equal(cli_int(j, "num_workers"), 4);
    assert_int_equal(cli_int(j, "num_replicas"), 8);
    const json_t *rep = json_array_get(json_object_get(j, "replicas"), 5);
    assert_int_equal(cli_int(rep, "worker"), 2);
    assert_int_equal(cli_int(rep, "device"), 1);
    const json_t *workers = json_object_get(json_object_get(j, "cluster"), "worker");
    assert_int_equal(json_array_size(workers), 4);
    assert_string_equal(json_string_value(json_array_get(workers, 3)), "localhost:2225");
    json_decref(j);
    free(r);
}

/* dsim cluster --tpu: the slice's hosts as workers, and each replica's host,
 * chip, core and coordinates (no TPU is used). */
static void test_tpu(void **state)
{
    (void)state;
    cli_result *r = malloc(sizeof *r);
    assert_non_null(r);
    const char *args[] = {"--tpu", "v3-32", NULL};
    cli_run(r, NULL, args);
    assert_int_equal(r->status, 0);
    json_t *j = cli_json(r);
    assert_int_equal(cli_int(j, "num_workers"), 4);
    assert_int_equal(cli_int(j, "devices_per_host"), 8);
    assert_int_equal(cli_int(j, "num_replicas"), 32);
    const json_t *tpu = json_object_get(j, "tpu");
    assert_string_equal(json_string_value(json_object_get(tpu, "name")), "v3-32");
    assert_int_equal(cli_int(tpu, "input_pipelines"), 4);
    assert_non_null(strstr(json_string_value(json_object_get(tpu, "simulated")), "no TPU"));
    const json_t *rep = json_array_get(json_object_get(j, "replicas"), 11);
    assert_int_equal(cli_int(rep, "host"), 1);
    assert_int_equal(cli_int(rep, "chip"), 3); /* host 1: the block at x 2..3 */
    assert_int_equal(cli_int(rep, "core"), 1);
    const json_t *co = json_object_get(rep, "coords");
    assert_int_equal(json_integer_value(json_array_get(co, 0)), 3);
    assert_int_equal(json_integer_value(json_array_get(co, 1)), 0);
    json_decref(j);
    const char *args2[] = {"--tpu", "v4", "--tpu-topology", "2x2x4", NULL};
    cli_run(r, NULL, args2);
    assert_int_equal(r->status, 0);
    j = cli_json(r);
    assert_int_equal(cli_int(j, "num_replicas"), 16);
    assert_int_equal(cli_int(j, "devices_per_host"), 4);
    json_decref(j);
    free(r);
}

typedef struct bad_case {
    const char *tf_config; /* $TF_CONFIG, NULL: unset */
    const char *args[6];
    const char *word; /* must appear on stderr */
} bad_case;

static const bad_case bad_cases[] = {
    {NULL,
     {"--tf-config",
      "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"]}, \"task\": {\"type\": \"worker\", "
      "\"index\": 2}}",
      NULL},
     "\"task.index\" is 2 but job \"worker\" has 2 tasks (accepted: 0..1)"},
    {"{\"cluster\": {\"chief\": [\"a:1\", \"b:1\"]}, \"task\": {\"type\": \"chief\", \"index\": "
     "0}}",
     {NULL},
     "at most one 'chief'"},
    {"{\"cluster\": ", {NULL}, "line 1"},
    {NULL, {"--tf-config", "[]", NULL}, "top level"},
    {NULL, {"--bogus", NULL}, "unknown argument '--bogus'"},
    {NULL, {"extra", NULL}, "unknown argument 'extra'"},
    {NULL, {"--hosts", NULL}, "--hosts needs a value"},
    {NULL, {"--hosts", "0", NULL}, "--hosts is '0'"},
    {NULL, {"--hosts", "2x", NULL}, "--hosts is '2x'"},
    {NULL, {"--devices-per-host", "0", NULL}, "--devices-per-host is '0' (accepted: 1..4096)"},
    {NULL, {"--devices-per-host=-3", NULL}, "--devices-per-host is '-3'"},
    {NULL, {"--hosts", "2", "--tf-config", "{}", NULL}, "both describe the cluster"},
    {NULL, {"--hosts", "100000", NULL}, "hosts is 100000"},
    {NULL, {"--tpu", "v3-16", NULL}, "no v3 slice has 16 TensorCores (accepted: v3-8, v3-32"},
    {NULL, {"--tpu", "v3-8", "--hosts", "2", NULL}, "--tpu gives the hosts and devices"},
    {NULL, {"--tpu-topology", "4x4", NULL}, "--tpu-topology needs --tpu GEN"},
    {NULL, {"--tpu", "v4", "--tpu-topology", "4x4", NULL}, "is not 3 chip dimensions"},
};

static void test_bad_input_exits_2(void **state)
{
    (void)state;
    cli_result *r = malloc(sizeof *r);
    assert_non_null(r);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *bc = &bad_cases[i];
        cli_run(r, bc->tf_config, bc->args);
        if (r->status != 2)
            fail_msg("case %zu: exit %d, want 2; stderr: %s", i, r->status, r->err);
        if (!strstr(r->err, bc->word))
            fail_msg("case %zu: stderr lacks '%s': %s", i, bc->word, r->err);
        assert_non_null(strstr(r->err, "dsim cluster: "));
        assert_string_equal(r->out, "");
    }
    free(r);
}

int main(void)
{
    cli_exe = getenv("DSIM_EXE");
    if (!cli_exe || access(cli_exe, X_OK) != 0) {
        fprintf(stderr, "skip: $DSIM_EXE does not name the dsim executable\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_default),
        cmocka_unit_test(test_tf_config_flag_and_env),
        cmocka_unit_test(test_ps_task_has_no_worker_id),
        cmocka_unit_test(test_blank_tf_config),
        cmocka_unit_test(test_hosts),
        cmocka_unit_test(test_tpu),
        cmocka_unit_test(test_bad_input_exits_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
