#!/usr/bin/env python3
"""examples/kubernetes/tfjob.yaml against the Kubeflow training operator's
TFJob (kubeflow.org/v1), since no cluster runs here. The structure checked
is written down from the operator's API types and validation
(github.com/kubeflow/training-operator, pkg/apis/kubeflow.org/v1):

  tensorflow_types.go   TFJob{apiVersion, kind, metadata, spec}; TFJobSpec
                        {runPolicy, successPolicy ("" | AllWorkers),
                        tfReplicaSpecs (required), enableDynamicWorker};
                        replica types PS, Worker, Chief, Master, Evaluator;
                        the container "tensorflow", the port "tfjob-port"
                        (default 2222)
  common_types.go       ReplicaSpec{replicas, template, restartPolicy
                        (Always | OnFailure | Never | ExitCode)}; RunPolicy
                        {cleanPodPolicy (All | Running | None),
                        ttlSecondsAfterFinished, activeDeadlineSeconds,
                        backoffLimit, schedulingPolicy, suspend, managedBy}
  tensorflow_validation.go  metadata.name a DNS-1035 label; every replica
                        spec has containers, each with an image, one named
                        "tensorflow"; at most one of Chief/Master

Then the job against dsim: the operator's TF_CONFIG (controller.v1/
tensorflow/tensorflow.go, genClusterSpec: NAME-TYPE-I.NAMESPACE.svc:PORT,
"environment": "cloud") for every replica, given to `dsim worker SCENARIO
--print-tf-config`, must be accepted, and the container must declare the
ports a task of the scenario listens on (PORT .. PORT+D, D its devices).

Each rule is also shown to refuse a broken copy of the file.

    tfjob_schema.py DSIM TFJOB.yaml SCENARIO_DIR
"""
import copy
import json
import os
import re
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not installed (apt-get install python3-yaml)")
    sys.exit(77)

DSIM, TFJOB, SCEN = (os.path.abspath(a) for a in sys.argv[1:4])

REPLICA_TYPES = {"PS", "Worker", "Chief", "Master", "Evaluator"}
RESTART = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD = {"All", "Running", "None"}
SPEC_KEYS = {"runPolicy", "successPolicy", "tfReplicaSpecs", "enableDynamicWorker"}
REPLICA_KEYS = {"replicas", "template", "restartPolicy"}
RUN_POLICY_INTS = {"ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"}
RUN_POLICY_KEYS = RUN_POLICY_INTS | {"cleanPodPolicy", "schedulingPolicy", "suspend", "managedBy"}
# k8s.io/api/core/v1 Container
CONTAINER_KEYS = {
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
    "resizePolicy", "restartPolicy", "volumeMounts", "volumeDevices", "livenessProbe",
    "readinessProbe", "startupProbe", "lifecycle", "terminationMessagePath",
    "terminationMessagePolicy", "imagePullPolicy", "securityContext", "stdin", "stdinOnce", "tty"
}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # IANA_SVC_NAME, <= 15


def is_int(v, lo=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def tf_container(spec):
    for c in spec["template"]["spec"]["containers"]:
        if c.get("name") == "tensorflow":
            return c
    return None


def schema_errors(job):
    """The operator's structure: a list of what is wrong, empty when none."""
    e = []
    if job.get("apiVersion") != "kubeflow.org/v1":
        e.append(f"apiVersion is {job.get('apiVersion')!r}, not kubeflow.org/v1")
    if job.get("kind") != "TFJob":
        e.append(f"kind is {job.get('kind')!r}, not TFJob")
    name = (job.get("metadata") or {}).get("name", "")
    if not isinstance(name, str) or len(name) > 63 or not DNS1035.match(name):
        e.append(f"metadata.name {name!r} is not a DNS-1035 label")
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return e + ["spec is missing"]
    e += [f"spec.{k} is not a TFJobSpec field" for k in spec if k not in SPEC_KEYS]
    if spec.get("successPolicy", "") not in ("", "AllWorkers"):
        e.append(f"spec.successPolicy {spec['successPolicy']!r} is not '' or AllWorkers")
    rp = spec.get("runPolicy", {})
    if not isinstance(rp, dict):
        e.append("spec.runPolicy is not a mapping")
        rp = {}
    e += [f"spec.runPolicy.{k} is not a RunPolicy field" for k in rp if k not in RUN_POLICY_KEYS]
    if "cleanPodPolicy" in rp and rp["cleanPodPolicy"] not in CLEAN_POD:
        e.append(f"spec.runPolicy.cleanPodPolicy {rp['cleanPodPolicy']!r} is not one of "
                 f"{sorted(CLEAN_POD)}")
    e += [f"spec.runPolicy.{k} is not a non-negative integer" for k in RUN_POLICY_INTS
          if k in rp and not is_int(rp[k])]
    specs = spec.get("tfReplicaSpecs")
    if not isinstance(specs, dict) or not specs:
        return e + ["spec.tfReplicaSpecs is missing or empty"]
    if len({"Chief", "Master"} & set(specs)) > 1:
        e.append("spec.tfReplicaSpecs has more than 1 chief/master")
    for rt, rs in specs.items():
        at = f"spec.tfReplicaSpecs.{rt}"
        if rt not in REPLICA_TYPES:
            e.append(f"{at}: {rt!r} is not a replica type ({sorted(REPLICA_TYPES)})")
        if not isinstance(rs, dict):
            e.append(f"{at} is not a ReplicaSpec")
            continue
        e += [f"{at}.{k} is not a ReplicaSpec field" for k in rs if k not in REPLICA_KEYS]
        if "replicas" in rs and not is_int(rs["replicas"]):
            e.append(f"{at}.replicas {rs['replicas']!r} is not a non-negative integer")
        if "restartPolicy" in rs and rs["restartPolicy"] not in RESTART:
            e.append(f"{at}.restartPolicy {rs['restartPolicy']!r} is not one of {sorted(RESTART)}")
        cs = ((rs.get("template") or {}).get("spec") or {}).get("containers")
        if not isinstance(cs, list) or not cs:
            e.append(f"{at}: containers definition expected in template.spec.containers")
            continue
        for c in cs:
            cn = c.get("name")
            e += [f"{at} container {cn}: {k} is not a Container field" for k in c
                  if k not in CONTAINER_KEYS]
            if not c.get("image"):
                e.append(f"{at} container {cn}: image is undefined")
            for p in c.get("ports", []):
                pn = p.get("name", "")
                if not is_int(p.get("containerPort"), 1) or p["containerPort"] > 65535:
                    e.append(f"{at} container {cn}: containerPort {p.get('containerPort')!r}")
                if pn and (len(pn) > 15 or not PORT_NAME.match(pn)
                           or not re.search("[a-z]", pn)):
                    e.append(f"{at} container {cn}: port name {pn!r} is not an IANA_SVC_NAME")
        if not any(c.get("name") == "tensorflow" for c in cs):
            e.append(f"{at}: there is no container named tensorflow")
    return e


def tf_port(specs, rt):
    """GetPortFromTFJob: the tensorflow container's port named tfjob-port, else 2222."""
    for p in tf_container(specs[rt]).get("ports", []):
        if p.get("name") == "tfjob-port":
            return p["containerPort"]
    return 2222


def dsim_errors(job, namespace="default"):
    """The job as dsim worker tasks: the TF_CONFIG the operator gives each
    replica is accepted, and the declared ports cover what a task uses."""
    e = []
    specs = job["spec"]["tfReplicaSpecs"]
    name = job["metadata"]["name"]
    cluster = {}
    for rt, rs in specs.items():
        if rt == "Evaluator":
            continue
        port = tf_port(specs, rt)
        cluster[rt.lower()] = [f"{name}-{rt.lower()}-{i}.{namespace}.svc:{port}"
                               for i in range(rs.get("replicas", 1))]
    for rt, rs in specs.items():
        c = tf_container(rs)
        cmd = c.get("command", []) + c.get("args", [])
        if cmd[:2] != ["dsim", "worker"] or len(cmd) < 3:
            e.append(f"{rt}: the container does not run `dsim worker SCENARIO`: {cmd}")
            continue
        scen = os.path.join(SCEN, os.path.basename(cmd[2]))
        with open(scen) as f:
            devices = yaml.safe_load(f)["cluster"].get("devices_per_host", 1)
        port = tf_port(specs, rt)
        have = {p["containerPort"] for p in c.get("ports", [])}
        want = set(range(port, port + devices + 1))
        if not want <= have:
            e.append(f"{rt}: the container declares ports {sorted(have)}; a task of "
                     f"{os.path.basename(scen)} ({devices} devices) listens on {sorted(want)}")
        for i in range(rs.get("replicas", 1)):
            tf = {"cluster": cluster, "task": {"type": rt.lower(), "index": i},
                  "environment": "cloud"}
            env = dict(os.environ, TF_CONFIG=json.dumps(tf))
            env.pop("DSIM_CLUSTER_SECRET", None)
            p = subprocess.run([DSIM, "worker", scen, "--print-tf-config"], env=env,
                               capture_output=True, text=True, timeout=60)
            try:
                task = json.loads(p.stdout)["task"] if p.returncode == 0 else None
            except (ValueError, KeyError):
                task = None
            if task != {"type": rt.lower(), "index": i}:
                e.append(f"{rt} {i}: dsim worker refused the operator's TF_CONFIG "
                         f"(exit {p.returncode}): {p.stderr.strip()}")
    return e


with open(TFJOB) as f:
    job = yaml.safe_load(f)
failures = schema_errors(job)
if not failures:
    failures = dsim_errors(job)
failures = [f"{TFJOB}: {m}" for m in failures]
ran = 2


def broken(path, value, check, phrase):
    """A copy of the job with one value changed must be refused with phrase."""
    global ran
    ran += 1
    j = copy.deepcopy(job)
    node = j
    for k in path[:-1]:
        node = node[k]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    errs = check(j)
    if not any(phrase in m for m in errs):
        failures.append(f"{'.'.join(map(str, path))} = {value!r} was not refused with "
                        f"'{phrase}': {errs}")


W = ["spec", "tfReplicaSpecs", "Worker"]
C = W + ["template", "spec", "containers", 0]
broken(["apiVersion"], "kubeflow.org/v1beta2", schema_errors, "not kubeflow.org/v1")
broken(["kind"], "PyTorchJob", schema_errors, "not TFJob")
broken(["metadata", "name"], "Dsim_quickstart", schema_errors, "DNS-1035")
broken(["spec", "tfReplicaSpecs"], None, schema_errors, "tfReplicaSpecs is missing")
broken(["spec", "tfReplicaSpecs", "Workers"], job["spec"]["tfReplicaSpecs"]["Worker"],
       schema_errors, "is not a replica type")


def with_master(j):
    """The job given a Master beside its Chief."""
    j["spec"]["tfReplicaSpecs"]["Master"] = j["spec"]["tfReplicaSpecs"]["Chief"]
    return schema_errors(j)


broken(["spec", "tfReplicaSpecs", "Chief"], job["spec"]["tfReplicaSpecs"]["Worker"], with_master,
       "more than 1 chief/master")
broken(W + ["restartPolicy"], "Sometimes", schema_errors, "restartPolicy 'Sometimes'")
broken(W + ["replicas"], -1, schema_errors, "replicas -1")
broken(W + ["replica"], 2, schema_errors, "replica is not a ReplicaSpec field")
broken(["spec", "runPolicy", "cleanPodPolicy"], "Some", schema_errors, "cleanPodPolicy 'Some'")
broken(["spec", "runPolicy", "backoffLimit"], "0", schema_errors, "backoffLimit is not")
broken(C + ["name"], "dsim", schema_errors, "no container named tensorflow")
broken(C + ["image"], "", schema_errors, "image is undefined")
broken(C + ["commands"], ["dsim"], schema_errors, "commands is not a Container field")
broken(C + ["ports"], [{"name": "tfjob-port", "containerPort": 2222},
                       {"name": "dsim-rank-1", "containerPort": 2223}],
       dsim_errors, "listens on [2222, 2223, 2224]")
broken(W + ["replicas"], 3, dsim_errors, "dsim worker refused the operator's TF_CONFIG")

if failures:
    for m in failures:
        print(f"FAIL: {m}")
    sys.exit(1)
print(f"ok: {os.path.basename(TFJOB)} is a kubeflow.org/v1 TFJob of the operator's structure, its "
      f"{sum(r.get('replicas', 1) for r in job['spec']['tfReplicaSpecs'].values())} replicas' "
      f"TF_CONFIGs are accepted by dsim worker, and {ran - 2} broken copies are refused")
