/* The cluster a job runs on: TensorFlow's TF_CONFIG, or hosts x devices.
 *
 * A cluster is a set of jobs (chief, worker, ps, evaluator), each a list of
 * "HOST:PORT" addresses, plus the task this process is (type, index). The
 * all-reduce group is the chief (if any) followed by the workers: the chief
 * has worker id 0 and worker i has id i + (number of chiefs), exactly as
 * tf.distribute's multi_worker_util.id_in_cluster. ps and evaluator tasks are
 * not in that group. Each worker drives devices_per_host devices, and replica
 * r lives on worker r / devices_per_host, device r % devices_per_host.
 *
 * Parsing follows tf.distribute (TFConfigClusterResolver and
 * multi_worker_util._validate_cluster_spec) and is stricter where TensorFlow
 * would fail later or silently do something surprising; each such place is
 * marked "stricter than TF" below. Every rejection returns DSIM_EINVAL and
 * records a message (dsim_errmsg()) naming the key path, the value and what is
 * accepted, e.g.
 *   TF_CONFIG: "task.index" is 3 but job "worker" has 2 tasks (accepted: 0..1)
 *
 * What is accepted:
 *   - The text is a JSON object; duplicate keys at any level are rejected
 *     (stricter than TF, whose json.loads keeps the last one silently).
 *     Unknown keys at the top level ("environment", "session_master", ...)
 *     and inside "task" are ignored, as in TF.
 *   - "cluster": an object of job name -> non-empty array of address strings.
 *     Job names are chief, worker, ps, evaluator (TF raises "Disallowed task
 *     type found in cluster spec" for others); at most one chief and at most
 *     one evaluator task. TF's sparse form (an object of index -> address) is
 *     rejected: from JSON its keys are strings, which TF's ClusterSpec cannot
 *     store either. An address is HOST:PORT with a non-empty HOST (an IPv6
 *     HOST in brackets, "[::1]:2222") and a decimal PORT in 1..65535
 *     (stricter than TF, which passes the string to gRPC unchecked). The same
 *     address twice in the cluster is rejected (two tasks cannot listen on
 *     one port).
 *   - "task": an object with "type" (a string naming one of the four task
 *     types) and "index" (a JSON integer, or a string of decimal digits, since
 *     TF applies int() to it; reals and booleans are rejected, which TF would
 *     truncate or coerce). The index must be >= 0 and below the job's size.
 *     The task's type must be a job of the cluster, except "evaluator", which
 *     TF allows to stand outside the cluster.
 *   - "rpc_layer": a string, or absent/null.
 *   - A cluster must have a chief or a worker job, unless the task is an
 *     evaluator (which may live in its own cluster).
 *   - "task" without a non-empty "cluster", or a non-empty "cluster" without
 *     "task", is rejected (TF ignores the task, or fails later, respectively).
 *     "{}" (no cluster, no task), an empty string, or an unset TF_CONFIG is a
 *     local single worker, as in TF. A text of only white space is rejected
 *     (it is not JSON: TF's json.loads raises on it), naming the value.
 *
 * Derived values (TF's multi_worker_util):
 *   is_chief:  the chief task; else worker 0 when there is no chief job; an
 *              evaluator task is also chief (of its own partition), as in TF.
 *   worker_id: 0 for the chief, index + number of chiefs for a worker, and -1
 *              for ps and evaluator tasks, which have no place in the
 *              all-reduce group (TF gives an evaluator its index within its
 *              own partition; dsim keeps that out of the replica numbering).
 *   num_workers: chiefs + workers of the cluster, whatever this task is.
 *   num_replicas: num_workers * devices_per_host. */
#ifndef DSIM_CLUSTER_H
#define DSIM_CLUSTER_H

#include "dsim/api.h"
#include "dsim/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsim_task_type {
    DSIM_TASK_CHIEF = 0,
    DSIM_TASK_WORKER,
    DSIM_TASK_PS,
    DSIM_TASK_EVALUATOR,
    DSIM_TASK_TYPE_COUNT
} dsim_task_type;

/* "chief", "worker", "ps", "evaluator"; "?" for anything else. Never NULL. */
DSIM_API const char *dsim_task_type_name(dsim_task_type t);

/* One job: its tasks' addresses in index order. ntasks == 0: no such job. */
typedef struct dsim_cluster_job {
    int ntasks;
    char **addrs; /* ntasks owned "HOST:PORT" strings */
} dsim_cluster_job;

/* A resolved cluster. A plain value: every string is owned and released by
 * dsim_cluster_free. Treat it as read-only; the derived fields are computed
 * by the constructors. */
typedef struct dsim_cluster {
    dsim_cluster_job jobs[DSIM_TASK_TYPE_COUNT]; /* indexed by dsim_task_type */
    dsim_task_type task_type;                    /* this task */
    int task_index;
    char *rpc_layer;      /* owned; NULL when TF_CONFIG gave none */
    int from_tf_config;   /* 1: parsed from TF_CONFIG; 0: built locally */
    int devices_per_host; /* >= 1 */
    /* derived */
    int is_chief;
    int worker_id;    /* 0..num_workers-1, or -1 for ps and evaluator */
    int num_workers;  /* chiefs + workers */
    int num_replicas; /* num_workers * devices_per_host */
} dsim_cluster;

/* The most devices per host and the most replicas a cluster may have. */
#define DSIM_CLUSTER_MAX_DEVICES  4096
#define DSIM_CLUSTER_MAX_REPLICAS (1 << 24)

/* The first port of a local cluster: host i listens on localhost:(base + i),
 * TensorFlow's customary 2222 being host 0. */
#define DSIM_CLUSTER_LOCAL_PORT_BASE 2222

/* Releases the owned strings and zeroes *c. Safe on a zeroed or already
 * freed value, and on NULL. */
DSIM_API void dsim_cluster_free(dsim_cluster *c);

/* A local cluster of `hosts` hosts: job "worker" only (so worker 0 is the
 * chief, as under MultiWorkerMirroredStrategy without a chief job), host i at
 * "localhost:<DSIM_CLUSTER_LOCAL_PORT_BASE + i>", this task being worker
 * `worker` (0..hosts-1). from_tf_config is 0 and rpc_layer NULL. The
 * addresses are real enough to listen on for the processes engine; engines
 * inside one address space ignore them. On failure *out is zeroed. */
DSIM_API dsim_err dsim_cluster_local(int hosts, int devices_per_host, int worker,
                                     dsim_cluster *out);

/* Parses TF_CONFIG text (see the top of this file). json NULL or empty is a
 * local single worker (dsim_cluster_local(1, dph, 0)); only white space is
 * DSIM_EINVAL.
 * On failure *out is zeroed and the error context says why. */
DSIM_API dsim_err dsim_cluster_from_tf_config(const char *json, int devices_per_host,
                                              dsim_cluster *out);

/* dsim_cluster_from_tf_config on $TF_CONFIG (unset = local single worker). */
DSIM_API dsim_err dsim_cluster_from_env(int devices_per_host, dsim_cluster *out);

/* TF_CONFIG text for task (type, index) of c's cluster, such that parsing it
 * gives back c's jobs and rpc_layer with that task: what a launcher hands
 * each process. *json is malloc'd (free()); compact, keys in a fixed order. */
DSIM_API dsim_err dsim_cluster_to_tf_config(const dsim_cluster *c, dsim_task_type type, int index,
                                            char **json);

/* Replica <-> (worker id, device): replica = worker * devices_per_host +
 * device. DSIM_EINVAL when an argument is out of range. */
DSIM_API dsim_err dsim_cluster_replica(const dsim_cluster *c, int worker, int device, int *replica);
DSIM_API dsim_err dsim_cluster_replica_place(const dsim_cluster *c, int replica, int *worker,
                                             int *device);

/* The address of worker id `worker` (0..num_workers-1): the chief's when
 * there is one and worker is 0, else that of the matching "worker" task.
 * NULL when out of range. Owned by c. */
DSIM_API const char *dsim_cluster_worker_address(const dsim_cluster *c, int worker);

#ifdef __cplusplus
}
#endif
#endif
