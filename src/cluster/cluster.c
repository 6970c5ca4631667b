/* The cluster spec: TF_CONFIG parsing and validation, local clusters, and the
 * replica <-> (worker, device) numbering. The rules, and where they are
 * stricter than TensorFlow, are listed in dsim/cluster.h. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dsim/cluster.h"
#include "dsim/err.h"

static const char *const cluster_type_names[DSIM_TASK_TYPE_COUNT] = {
    [DSIM_TASK_CHIEF] = "chief",
    [DSIM_TASK_WORKER] = "worker",
    [DSIM_TASK_PS] = "ps",
    [DSIM_TASK_EVALUATOR] = "evaluator",
};

#define CLUSTER_TYPES_ACCEPTED "\"chief\", \"worker\", \"ps\", \"evaluator\""
#define CLUSTER_EXAMPLE                                                                            \
    "{\"cluster\": {\"worker\": [\"host0:2222\", \"host1:2222\"]}, "                               \
    "\"task\": {\"type\": \"worker\", \"index\": 0}}"

/* Values quoted in messages are cut here so that the key path and the
 * accepted values still fit in the 512-byte error message. */
#define CLUSTER_SHOW_MAX 80

const char *dsim_task_type_name(dsim_task_type t)
{
    if ((int)t < 0 || t >= DSIM_TASK_TYPE_COUNT)
        return "?";
    return cluster_type_names[t];
}

static int cluster_type_of(const char *name)
{
    for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++)
        if (strcmp(name, cluster_type_names[t]) == 0)
            return t;
    return -1;
}

void dsim_cluster_free(dsim_cluster *c)
{
    if (!c)
        return;
    for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++) {
        for (int i = 0; i < c->jobs[t].ntasks; i++)
            free(c->jobs[t].addrs[i]);
        free(c->jobs[t].addrs);
    }
    free(c->rpc_layer);
    memset(c, 0, sizeof *c);
}

/* ---- message helpers ---------------------------------------------------- */

typedef struct cluster_buf {
    char s[CLUSTER_SHOW_MAX + 8];
} cluster_buf;

static void cluster_clip(cluster_buf *b, const char *text)
{
    size_t n = strlen(text);
    if (n <= CLUSTER_SHOW_MAX) {
        memcpy(b->s, text, n + 1);
        return;
    }
    memcpy(b->s, text, CLUSTER_SHOW_MAX);
    memcpy(b->s + CLUSTER_SHOW_MAX, "...", 4);
}

/* A JSON value as JSON text (so strings keep their quotes and escapes). */
static const char *cluster_show(cluster_buf *b, const json_t *v)
{
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    cluster_clip(b, text ? text : "(unprintable)");
    free(text);
    return b->s;
}

/* A C string as a JSON string literal: a key may hold quotes or controls. */
static const char *cluster_quote(cluster_buf *b, const char *s)
{
    json_t *j = json_string(s);
    if (!j) {
        cluster_clip(b, "(not UTF-8)");
        return b->s;
    }
    cluster_show(b, j);
    json_decref(j);
    return b->s;
}

static const char *cluster_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "an unknown JSON value";
}

static dsim_err cluster_nomem(void)
{
    return DSIM_ERR(DSIM_ENOMEM, -1, "TF_CONFIG: out of memory while building the cluster");
}

/* ---- addresses ---------------------------------------------------------- */

/* NULL when a is HOST:PORT as dsim/cluster.h describes; else what is wrong. */
static const char *cluster_addr_problem(const char *a)
{
    for (const char *p = a; *p; p++)
        if (isspace((unsigned char)*p) || iscntrl((unsigned char)*p))
            return "it contains white space or a control character";
    const char *colon = strrchr(a, ':');
    if (!colon)
        return "it has no \":PORT\"";
    size_t hlen = (size_t)(colon - a);
    if (hlen == 0)
        return "its HOST is empty";
    if (a[0] == '[') {
        if (hlen < 3 || a[hlen - 1] != ']')
            return "its bracketed HOST is not closed with \"]\" before \":PORT\"";
    } else if (memchr(a, ':', hlen) || memchr(a, '[', hlen) || memchr(a, ']', hlen)) {
        return "its HOST has a \":\" or a bracket (an IPv6 HOST goes in brackets)";
    }
    const char *port = colon + 1;
    size_t plen = strlen(port);
    if (plen == 0 || plen > 5)
        return "its PORT is not a number in 1..65535";
    long v = 0;
    for (size_t i = 0; i < plen; i++) {
        if (!isdigit((unsigned char)port[i]))
            return "its PORT is not a number in 1..65535";
        v = v * 10 + (port[i] - '0');
    }
    if (v < 1 || v > 65535)
        return "its PORT is not a number in 1..65535";
    return NULL;
}

/* ---- derived values ----------------------------------------------------- */

static dsim_err cluster_derive(dsim_cluster *c)
{
    int nchief = c->jobs[DSIM_TASK_CHIEF].ntasks;
    long long nw = (long long)nchief + c->jobs[DSIM_TASK_WORKER].ntasks;
    long long nr = nw * c->devices_per_host;
    if (nr > DSIM_CLUSTER_MAX_REPLICAS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cluster: %lld workers x %d devices per host = %lld replicas "
                        "(accepted: at most %d replicas)",
                        nw, c->devices_per_host, nr, DSIM_CLUSTER_MAX_REPLICAS);
    c->num_workers = (int)nw;
    c->num_replicas = (int)nr;
    switch (c->task_type) {
    case DSIM_TASK_CHIEF:
        c->is_chief = 1;
        c->worker_id = 0;
        break;
    case DSIM_TASK_WORKER:
        c->is_chief = nchief == 0 && c->task_index == 0;
        c->worker_id = c->task_index + nchief;
        break;
    case DSIM_TASK_EVALUATOR:
        /* TF: the evaluator is the chief of its own partition. */
        c->is_chief = 1;
        c->worker_id = -1;
        break;
    default:
        c->is_chief = 0;
        c->worker_id = -1;
        break;
    }
    return DSIM_OK;
}

static dsim_err cluster_check_devices(int devices_per_host)
{
    if (devices_per_host < 1 || devices_per_host > DSIM_CLUSTER_MAX_DEVICES)
        return DSIM_ERR(DSIM_EINVAL, -1, "cluster: devices per host is %d (accepted: 1..%d)",
                        devices_per_host, DSIM_CLUSTER_MAX_DEVICES);
    return DSIM_OK;
}

/* ---- local clusters ----------------------------------------------------- */

dsim_err dsim_cluster_local(int hosts, int devices_per_host, int worker, dsim_cluster *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_cluster_local: out is NULL");
    memset(out, 0, sizeof *out);
    DSIM_CHECK(cluster_check_devices(devices_per_host));
    const int max_hosts = 65535 - DSIM_CLUSTER_LOCAL_PORT_BASE + 1;
    if (hosts < 1 || hosts > max_hosts)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cluster: hosts is %d (accepted: 1..%d, one port each from %d)", hosts,
                        max_hosts, DSIM_CLUSTER_LOCAL_PORT_BASE);
    if (worker < 0 || worker >= hosts)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cluster: worker is %d but there are %d hosts "
                        "(accepted: 0..%d)",
                        worker, hosts, hosts - 1);
    dsim_cluster_job *job = &out->jobs[DSIM_TASK_WORKER];
    job->addrs = calloc((size_t)hosts, sizeof *job->addrs);
    if (!job->addrs)
        return cluster_nomem();
    for (int i = 0; i < hosts; i++) {
        char a[32];
        snprintf(a, sizeof a, "localhost:%d", DSIM_CLUSTER_LOCAL_PORT_BASE + i);
        job->addrs[i] = strdup(a);
        if (!job->addrs[i]) {
            dsim_cluster_free(out);
            return cluster_nomem();
        }
        job->ntasks = i + 1;
    }
    out->task_type = DSIM_TASK_WORKER;
    out->task_index = worker;
    out->devices_per_host = devices_per_host;
    dsim_err e = cluster_derive(out);
    if (e != DSIM_OK)
        dsim_cluster_free(out);
    return e;
}

/* ---- TF_CONFIG ---------------------------------------------------------- */

static dsim_err cluster_parse_job(dsim_cluster *c, const char *name, const json_t *tasks)
{
    cluster_buf bn, bv;
    int t = cluster_type_of(name);
    if (t < 0)
        return DSIM_ERR(
            DSIM_EINVAL, -1,
            "TF_CONFIG: \"cluster\" has a job named %s (accepted job names: " CLUSTER_TYPES_ACCEPTED
            ")",
            cluster_quote(&bn, name));
    if (json_is_object(tasks))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"cluster.%s\" is %s, a sparse index -> address object, "
                        "which TF_CONFIG cannot carry (accepted: an array of \"HOST:PORT\" "
                        "strings in task index order)",
                        name, cluster_show(&bv, tasks));
    if (!json_is_array(tasks))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"cluster.%s\" is %s, %s (accepted: an array of "
                        "\"HOST:PORT\" strings)",
                        name, cluster_show(&bv, tasks), cluster_kind(tasks));
    size_t n = json_array_size(tasks);
    if (n == 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"cluster.%s\" is [], a job with no tasks (accepted: at "
                        "least one \"HOST:PORT\", or leave the job out)",
                        name);
    if ((t == DSIM_TASK_CHIEF || t == DSIM_TASK_EVALUATOR) && n > 1)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"cluster.%s\" has %zu tasks but there must be at most one "
                        "'%s' job (accepted: exactly one address; use \"worker\" for more)",
                        name, n, name);
    if (n > (size_t)DSIM_CLUSTER_MAX_REPLICAS)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"cluster.%s\" has %zu tasks (accepted: at most %d)", name, n,
                        DSIM_CLUSTER_MAX_REPLICAS);
    dsim_cluster_job *job = &c->jobs[t];
    job->addrs = calloc(n, sizeof *job->addrs);
    if (!job->addrs)
        return cluster_nomem();
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(tasks, i);
        if (!json_is_string(a))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "TF_CONFIG: \"cluster.%s[%zu]\" is %s, %s (accepted: a "
                            "\"HOST:PORT\" string)",
                            name, i, cluster_show(&bv, a), cluster_kind(a));
        const char *s = json_string_value(a);
        const char *why = cluster_addr_problem(s);
        if (why)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "TF_CONFIG: \"cluster.%s[%zu]\" is %s but %s (accepted: "
                            "\"HOST:PORT\" with PORT 1..65535, e.g. \"host0:2222\" or "
                            "\"[::1]:2222\")",
                            name, i, cluster_show(&bv, a), why);
        job->addrs[i] = strdup(s);
        if (!job->addrs[i])
            return cluster_nomem();
        job->ntasks = (int)i + 1;
    }
    return DSIM_OK;
}

typedef struct cluster_ref {
    const char *addr;
    int type, index;
} cluster_ref;

/* By address, then in cluster order, so the first of a pair comes first. */
static int cluster_ref_cmp(const void *x, const void *y)
{
    const cluster_ref *a = x, *b = y;
    int c = strcmp(a->addr, b->addr);
    if (c != 0)
        return c;
    if (a->type != b->type)
        return a->type < b->type ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

/* Two tasks cannot listen on one address; a repeated line in a generated
 * TF_CONFIG is a common slip that otherwise shows up later as a failed bind
 * or as messages reaching the wrong task. */
static dsim_err cluster_check_unique(const dsim_cluster *c)
{
    int total = 0;
    for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++)
        total += c->jobs[t].ntasks;
    if (total < 2)
        return DSIM_OK;
    cluster_ref *refs = malloc((size_t)total * sizeof *refs);
    if (!refs)
        return cluster_nomem();
    int k = 0;
    for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++)
        for (int i = 0; i < c->jobs[t].ntasks; i++)
            refs[k++] = (cluster_ref){c->jobs[t].addrs[i], t, i};
    /* Sorted, so that thousands of sim workers are not compared pairwise. */
    qsort(refs, (size_t)total, sizeof *refs, cluster_ref_cmp);
    dsim_err e = DSIM_OK;
    for (int i = 1; i < total; i++) {
        if (strcmp(refs[i - 1].addr, refs[i].addr) == 0) {
            const cluster_ref *x = &refs[i - 1], *y = &refs[i];
            cluster_buf b;
            e = DSIM_ERR(DSIM_EINVAL, -1,
                         "TF_CONFIG: \"cluster.%s[%d]\" and \"cluster.%s[%d]\" are both %s "
                         "(accepted: a different HOST:PORT for every task)",
                         cluster_type_names[x->type], x->index, cluster_type_names[y->type],
                         y->index, cluster_quote(&b, x->addr));
            break;
        }
    }
    free(refs);
    return e;
}

/* task.index: a JSON integer, or a decimal string since TF applies int(). */
static dsim_err cluster_parse_index(const json_t *v, long long *index)
{
    cluster_buf b;
    if (json_is_integer(v)) {
        *index = json_integer_value(v);
        return DSIM_OK;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        const char *p = s;
        if (*p == '+' || *p == '-')
            p++;
        int ok = *p != '\0';
        for (const char *q = p; ok && *q; q++)
            ok = isdigit((unsigned char)*q) != 0;
        if (ok) {
            errno = 0;
            long long x = strtoll(s, NULL, 10);
            /* Beyond long long is beyond every job's size: report it as huge. */
            *index = errno == ERANGE ? (s[0] == '-' ? LLONG_MIN : LLONG_MAX) : x;
            return DSIM_OK;
        }
    }
    return DSIM_ERR(DSIM_EINVAL, -1,
                    "TF_CONFIG: \"task.index\" is %s, %s (accepted: a non-negative integer "
                    "such as 0, or a string of decimal digits such as \"0\")",
                    cluster_show(&b, v), cluster_kind(v));
}

static int cluster_njobs(const dsim_cluster *c)
{
    int n = 0;
    for (int t = 0; t < DSIM_TASK_TYPE_COUNT; t++)
        n += c->jobs[t].ntasks > 0;
    return n;
}

static dsim_err cluster_parse(const json_t *root, int devices_per_host, dsim_cluster *c)
{
    cluster_buf b;
    if (!json_is_object(root))
        return DSIM_ERR(
            DSIM_EINVAL, -1,
            "TF_CONFIG: the top level is %s, %s (accepted: an object such as " CLUSTER_EXAMPLE ")",
            cluster_show(&b, root), cluster_kind(root));
    c->devices_per_host = devices_per_host;

    const json_t *rpc = json_object_get(root, "rpc_layer");
    if (rpc && !json_is_null(rpc)) {
        if (!json_is_string(rpc))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "TF_CONFIG: \"rpc_layer\" is %s, %s (accepted: a string such as "
                            "\"grpc\", or leave it out)",
                            cluster_show(&b, rpc), cluster_kind(rpc));
        /* TF treats an empty rpc_layer as none (`if rpc_layer:`). */
        if (json_string_length(rpc) > 0) {
            c->rpc_layer = strdup(json_string_value(rpc));
            if (!c->rpc_layer)
                return cluster_nomem();
        }
    }

    const json_t *cl = json_object_get(root, "cluster");
    if (cl && !json_is_null(cl)) {
        if (!json_is_object(cl))
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "TF_CONFIG: \"cluster\" is %s, %s (accepted: an object of job name "
                            "-> array of \"HOST:PORT\", e.g. {\"worker\": [\"host0:2222\"]})",
                            cluster_show(&b, cl), cluster_kind(cl));
        const char *name;
        const json_t *tasks;
        json_object_foreach((json_t *)cl, name, tasks)
        {
            DSIM_CHECK(cluster_parse_job(c, name, tasks));
        }
        DSIM_CHECK(cluster_check_unique(c));
    }
    int njobs = cluster_njobs(c);

    const json_t *task = json_object_get(root, "task");
    if (!task || json_is_null(task)) {
        if (njobs > 0)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "TF_CONFIG: \"task\" is missing but \"cluster\" has %d job%s "
                            "(accepted: \"task\": {\"type\": ..., \"index\": ...} naming this "
                            "process's place in the cluster)",
                            njobs, njobs == 1 ? "" : "s");
        /* No cluster, no task: TF's local case. */
        char *rpc_layer = c->rpc_layer;
        c->rpc_layer = NULL;
        dsim_err e = dsim_cluster_local(1, devices_per_host, 0, c);
        if (e != DSIM_OK) {
            free(rpc_layer);
            return e;
        }
        c->rpc_layer = rpc_layer;
        return DSIM_OK;
    }
    if (!json_is_object(task))
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"task\" is %s, %s (accepted: an object such as "
                        "{\"type\": \"worker\", \"index\": 0})",
                        cluster_show(&b, task), cluster_kind(task));
    const json_t *type = json_object_get(task, "type");
    if (!type)
        return DSIM_ERR(
            DSIM_EINVAL, -1,
            "TF_CONFIG: \"task.type\" is missing (accepted: one of " CLUSTER_TYPES_ACCEPTED ")");
    int t = json_is_string(type) ? cluster_type_of(json_string_value(type)) : -1;
    if (t < 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"task.type\" is %s, an unknown task type (accepted: one "
                        "of " CLUSTER_TYPES_ACCEPTED ")",
                        cluster_show(&b, type));
    const json_t *index = json_object_get(task, "index");
    if (!index)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"task.index\" is missing (accepted: this task's position "
                        "in job \"%s\", counting from 0)",
                        cluster_type_names[t]);
    long long idx = 0;
    DSIM_CHECK(cluster_parse_index(index, &idx));

    if (njobs == 0)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"cluster\" is %s but \"task\" is given (accepted: a "
                        "\"cluster\" object with at least the job \"%s\", or neither key for a "
                        "local single worker)",
                        cl && !json_is_null(cl) ? "{}" : "missing", cluster_type_names[t]);
    int ntasks = c->jobs[t].ntasks;
    if (ntasks == 0 && t != DSIM_TASK_EVALUATOR)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"task.type\" is \"%s\" but \"cluster\" has no job \"%s\" "
                        "(accepted: a job of the cluster, or add \"%s\" to \"cluster\")",
                        cluster_type_names[t], cluster_type_names[t], cluster_type_names[t]);
    /* TF lets an evaluator stand outside the cluster; there is only one. */
    int limit = ntasks > 0 ? ntasks : 1;
    if (idx < 0 || idx >= limit) {
        if (ntasks > 0)
            return DSIM_ERR(DSIM_EINVAL, -1,
                            "TF_CONFIG: \"task.index\" is %s but job \"%s\" has %d task%s "
                            "(accepted: 0..%d)",
                            cluster_show(&b, index), cluster_type_names[t], ntasks,
                            ntasks == 1 ? "" : "s", ntasks - 1);
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"task.index\" is %s for an evaluator outside the cluster "
                        "(accepted: 0, there is at most one evaluator)",
                        cluster_show(&b, index));
    }
    if (c->jobs[DSIM_TASK_CHIEF].ntasks + c->jobs[DSIM_TASK_WORKER].ntasks == 0 &&
        t != DSIM_TASK_EVALUATOR)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: \"cluster\" has no \"chief\" or \"worker\" job, so a \"%s\" "
                        "task has nobody to serve (accepted: a cluster with a \"chief\" and/or "
                        "\"worker\" job)",
                        cluster_type_names[t]);
    c->task_type = (dsim_task_type)t;
    c->task_index = (int)idx;
    c->from_tf_config = 1;
    return cluster_derive(c);
}

static int cluster_blank(const char *s)
{
    for (; *s; s++)
        if (!isspace((unsigned char)*s))
            return 0;
    return 1;
}

dsim_err dsim_cluster_from_tf_config(const char *json, int devices_per_host, dsim_cluster *out)
{
    if (!out)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_cluster_from_tf_config: out is NULL");
    memset(out, 0, sizeof *out);
    DSIM_CHECK(cluster_check_devices(devices_per_host));
    if (!json || !*json)
        return dsim_cluster_local(1, devices_per_host, 0, out);
    if (cluster_blank(json)) {
        /* Not "unset": TF's json.loads raises on it, and a TF_CONFIG that
         * came out blank is usually a template that did not expand. */
        cluster_buf bv;
        return DSIM_ERR(
            DSIM_EINVAL, -1,
            "TF_CONFIG: the text is %s, only white space, which is not JSON "
            "(TensorFlow rejects it too; accepted: a JSON object such as " CLUSTER_EXAMPLE
            ", or an unset or empty TF_CONFIG for a local single worker)",
            cluster_quote(&bv, json));
    }
    json_error_t jerr;
    /* Without JSON_ALLOW_NUL jansson refuses "\u0000", so every string below
     * is a whole C string. */
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "TF_CONFIG: not valid JSON at line %d, column %d: %s (accepted: a JSON "
                        "object such as " CLUSTER_EXAMPLE ")",
                        jerr.line, jerr.column, jerr.text);
    dsim_err e = cluster_parse(root, devices_per_host, out);
    json_decref(root);
    if (e != DSIM_OK)
        dsim_cluster_free(out);
    return e;
}

dsim_err dsim_cluster_from_env(int devices_per_host, dsim_cluster *out)
{
    return dsim_cluster_from_tf_config(getenv("TF_CONFIG"), devices_per_host, out);
}

dsim_err dsim_cluster_to_tf_config(const dsim_cluster *c, dsim_task_type type, int index,
                                   char **json)
{
    if (!c || !json)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_cluster_to_tf_config: NULL argument");
    *json = NULL;
    if ((int)type < 0 || type >= DSIM_TASK_TYPE_COUNT)
        return DSIM_ERR(DSIM_EINVAL, -1, "cluster: task type %d (accepted: a dsim_task_type)",
                        (int)type);
    int ntasks = c->jobs[type].ntasks;
    int limit = ntasks > 0 ? ntasks : type == DSIM_TASK_EVALUATOR;
    if (index < 0 || index >= limit)
        return DSIM_ERR(DSIM_EINVAL, -1,
                        "cluster: task %s:%d is not in the cluster (job \"%s\" has %d tasks)",
                        cluster_type_names[type], index, cluster_type_names[type], ntasks);
    /* The *_set_new and *_append_new calls take their value even when they
     * fail, so nothing leaks on an early stop. */
    json_t *root = json_object();
    json_t *cl = json_object();
    if (!root || !cl) {
        json_decref(root);
        json_decref(cl);
        return cluster_nomem();
    }
    int bad = json_object_set_new(root, "cluster", cl) != 0;
    for (int t = 0; !bad && t < DSIM_TASK_TYPE_COUNT; t++) {
        if (c->jobs[t].ntasks == 0)
            continue;
        json_t *arr = json_array();
        bad = json_object_set_new(cl, cluster_type_names[t], arr) != 0;
        for (int i = 0; !bad && i < c->jobs[t].ntasks; i++)
            bad = json_array_append_new(arr, json_string(c->jobs[t].addrs[i])) != 0;
    }
    if (!bad)
        bad = json_object_set_new(
                  root, "task",
                  json_pack("{s:s, s:i}", "type", cluster_type_names[type], "index", index)) != 0;
    if (!bad && c->rpc_layer)
        bad = json_object_set_new(root, "rpc_layer", json_string(c->rpc_layer)) != 0;
    if (!bad)
        *json = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!*json)
        return cluster_nomem();
    return DSIM_OK;
}

dsim_err dsim_cluster_replica(const dsim_cluster *c, int worker, int device, int *replica)
{
    if (!c || !replica)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_cluster_replica: NULL argument");
    if (worker < 0 || worker >= c->num_workers)
        return DSIM_ERR(DSIM_EINVAL, -1, "cluster: worker %d (accepted: 0..%d)", worker,
                        c->num_workers - 1);
    if (device < 0 || device >= c->devices_per_host)
        return DSIM_ERR(DSIM_EINVAL, -1, "cluster: device %d (accepted: 0..%d)", device,
                        c->devices_per_host - 1);
    *replica = worker * c->devices_per_host + device;
    return DSIM_OK;
}

dsim_err dsim_cluster_replica_place(const dsim_cluster *c, int replica, int *worker, int *device)
{
    if (!c || !worker || !device)
        return DSIM_ERR(DSIM_EINVAL, -1, "dsim_cluster_replica_place: NULL argument");
    if (replica < 0 || replica >= c->num_replicas)
        return DSIM_ERR(DSIM_EINVAL, -1, "cluster: replica %d (accepted: 0..%d)", replica,
                        c->num_replicas - 1);
    *worker = replica / c->devices_per_host;
    *device = replica % c->devices_per_host;
    return DSIM_OK;
}

const char *dsim_cluster_worker_address(const dsim_cluster *c, int worker)
{
    if (!c || worker < 0 || worker >= c->num_workers)
        return NULL;
    int nchief = c->jobs[DSIM_TASK_CHIEF].ntasks;
    if (worker < nchief)
        return c->jobs[DSIM_TASK_CHIEF].addrs[worker];
    return c->jobs[DSIM_TASK_WORKER].addrs[worker - nchief];
}
