"""A platform's job spec, read as the platform reads it: its pods, each pod's
environment, and what the platform does with each exit status.

`deploy/` holds one spec per platform (a Kubeflow TFJob, a JobSet, a Vertex AI
CustomJob config). Nothing here can run them, but every pod's environment is a
pure function of the spec, so it is computed here exactly as the platform
computes it, and then read by the engine's own parser (`tf_config.resolve`)
and by TensorFlow's resolver (`tests/deploy/test_specs.py`), and run on
loopback by `bin/launch --spec` (`launch.rehearsal`). One port of each
platform, shared by the tests and the rehearsal, so they cannot drift apart:

- TFJob: Kubeflow training-operator `release-1.9`,
  `pkg/controller.v1/tensorflow/tensorflow.go`, `genClusterSpec` (every replica
  type in `cluster`, the evaluator too; `<job>-<type>-<i>.<namespace>.svc:<port>`,
  the port of the container port named `tfjob-port`, else 2222:
  `GetPortFromTFJob` in `.../tensorflow/util.go`) and `genTFConfigJSONStr`
  (`environment: "cloud"`); no TF_CONFIG at all for a job of one replica
  (`isDistributed`). Exit statuses: `restartPolicy: ExitCode` recreates the
  failed pod on 128 and above (`pkg/util/train/train_util.go`,
  `IsRetryableExitCode`) and fails the job below.
- JobSet (jobset.x-k8s.io/v1alpha2): each replicated job's Jobs are named
  `<jobSet>-<replicatedJob>-<jobIndex>`; an Indexed Job gives each pod
  `JOB_COMPLETION_INDEX` and the hostname `<job>-<index>` under the subdomain
  `spec.network.subdomain`, else the JobSet's name (`GetSubdomain`,
  `pkg/controllers/jobset_controller.go`); the pod annotations
  `jobset.sigs.k8s.io/jobset-name`, `.../replicatedjob-name`, `.../job-index`
  reach the container through the downward API. Exit statuses: the Job's
  `podFailurePolicy` rules in order, else the pod counts against
  `backoffLimit`; a failed Job restarts the whole JobSet (`failurePolicy`,
  default action `RestartJobSet`, `pkg/controllers/failure_policy.go`) up to
  `maxRestarts`, unless a rule says `FailJobSet` for its failure reason.
- Vertex AI: worker pool N of `workerPoolSpecs` is `workerpoolN` of
  `CLUSTER_SPEC` (0 the chief, 1 workers, 2 ps, 3 evaluators) and a job of
  `TF_CONFIG`; `baseOutputDirectory` gives `AIP_MODEL_DIR`,
  `AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR`. Host names are Vertex's
  own (`cmle-training-workerpool0-<id>-0`; the engine depends on none). Exit
  statuses: a worker that exits non-zero is restarted on its VM, and with
  `scheduling.restartJobOnWorkerRestart` the whole job with it
  (cloud.google.com/vertex-ai/docs/training/understanding-training-service);
  Vertex does not choose by exit status.

Standard library only: specs arrive here already parsed (YAML is read in `bin/`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Callable, Mapping, Optional

from tfloop.launch import platforms
from tfloop.launch.tf_config import CHIEF, EVALUATOR, MASTER, PS, WORKER, Role

TFJOB, JOBSET, VERTEX = "tfjob", "jobset", "vertex"
#: Every pod's training container (TFJob's `TFJobDefaultContainerName`; the
#: JobSet spec here uses the same name, which its podFailurePolicy names).
CONTAINER = "tensorflow"
#: TFJob's `TFJobDefaultPortName` and `TFJobDefaultPort`.
TFJOB_PORT_NAME, DEFAULT_PORT = "tfjob-port", platforms.DEFAULT_PORT
#: TFJob replica types as they appear in a spec, as TF_CONFIG jobs.
TFJOB_TYPES = {"Chief": CHIEF, "Master": MASTER, "Worker": WORKER, "PS": PS,
               "Evaluator": EVALUATOR}
#: The order tasks are listed and started in.
TASK_ORDER = (CHIEF, WORKER, PS, EVALUATOR)
#: A made-up Vertex job id for its host names.
VERTEX_JOB_ID = "0123456789"
#: What a platform does with a task's exit status.
DONE, RESTART, FAIL = "done", "restart", "fail"

#: `address(task_type, index)` -> `host:port`: where a task listens (the
#: platform's DNS name by default; the rehearsal gives loopback ports).
Addresses = Callable[[str, int], str]


class SpecError(ValueError):
    """A job spec the engine cannot run as written; the one line says what to change."""


def _fail(path: str, message: str) -> None:
    raise SpecError(f"{path}: {message}")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One job spec, read.

    Attributes:
      platform: `tfjob`, `jobset` or `vertex`.
      name: the job's name (`metadata.name`; Vertex: `displayName` or the file's).
      path: the file it came from, for messages.
      replicas: task type (TF_CONFIG's: chief, worker, ps, evaluator; a TFJob's
        `Master` as chief) -> count, in `TASK_ORDER`.
      command: the container's command then args, as written (empty: the
        image's entry point).
      env: the container's plain `env` values (the platform adds its own).
      max_restarts: how often the platform restarts the job after a failure.
      grace_period_s: seconds between SIGTERM and SIGKILL (`terminationGracePeriodSeconds`).
      doc: the whole document.
    """

    platform: str
    name: str
    path: str
    replicas: Mapping[str, int]
    command: tuple
    env: Mapping[str, str]
    max_restarts: int
    grace_period_s: Optional[float]
    doc: Mapping

    def with_replicas(self, replicas: Mapping[str, int]) -> "Spec":
        """The same spec with fewer (or more) tasks of some types (0 drops a type)."""
        counts = dict(self.replicas)
        for task_type, count in replicas.items():
            if task_type not in TASK_ORDER:
                _fail(self.path, f"--replicas names {task_type!r}; task types are "
                      f"{', '.join(TASK_ORDER)}")
            if not isinstance(count, int) or count < 0 or (
                    task_type in (CHIEF, EVALUATOR) and count > 1):
                _fail(self.path, f"--replicas={task_type}:{count}: a count from 0 to "
                      f"{1 if task_type in (CHIEF, EVALUATOR) else 'any'}")
            counts[task_type] = count
        counts = {t: counts[t] for t in TASK_ORDER if counts.get(t)}
        if not counts.get(CHIEF) and not counts.get(WORKER):
            _fail(self.path, "no chief and no worker left to train")
        return dataclasses.replace(self, replicas=counts)


# -- reading ----------------------------------------------------------------------------------


def _get(doc, *keys, default=None):
    for key in keys:
        if not isinstance(doc, Mapping):
            return default
        doc = doc.get(key)
        if doc is None:
            return default
    return doc


def _count(value, path: str, what: str) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(path, f"{what} ({value!r}) must be a whole number")
    return value


def _container(pod_spec, path: str, what: str) -> Mapping:
    for container in _get(pod_spec, "containers") or []:
        if isinstance(container, Mapping) and container.get("name") == CONTAINER:
            return container
    _fail(path, f"{what} has no container named {CONTAINER!r} (the platform sets TF_CONFIG, "
          "and the rehearsal runs, only that one)")


def _plain_env(container: Mapping) -> dict:
    return {e["name"]: str(e["value"]) for e in container.get("env") or []
            if isinstance(e, Mapping) and "name" in e and "value" in e}


def _command(container: Mapping, path: str) -> tuple:
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if not all(isinstance(word, (str, int, float)) for word in command):
        _fail(path, "the container's command and args must be lists of strings")
    return tuple(str(word) for word in command)


def _one_command(commands: dict, path: str) -> tuple:
    if len(set(commands.values())) > 1:
        _fail(path, "the replica types run different commands "
              f"({', '.join(commands)}); give them one (the engine reads its role from "
              "TF_CONFIG), as the rehearsal runs one")
    return next(iter(commands.values()))


#: A Kubernetes object name that pods' host names and Services are built from:
#: a DNS-1123 label (`<name>-worker-0` must be one too, hence the 63).
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _name(doc: Mapping, path: str, kind: str) -> str:
    """`metadata.name`, checked as Kubernetes checks it. It names the
    rehearsal's folder (`runs/rehearsal/<name>`) and every pod's host, so an
    absolute or `../` name would move that folder out of `runs/rehearsal/`."""
    name = _get(doc, "metadata", "name", default=kind.lower())
    if not isinstance(name, str) or not _K8S_NAME.fullmatch(name):
        shown = name if not isinstance(name, str) or len(name) <= 80 else name[:77] + "..."
        _fail(path, f"metadata.name {shown!r} is not a {kind} name: lower-case letters, digits "
              "and '-', starting and ending with a letter or digit, at most 63 characters "
              "(a DNS label, as Kubernetes requires)")
    return name


def _display_name(doc: Mapping, path: str) -> str:
    """A Vertex AI job's `displayName` (free text to Vertex), else the file's
    name: it names the rehearsal's folder, so it must be one folder name."""
    name = doc.get("displayName") or os.path.splitext(os.path.basename(path))[0]
    if (not isinstance(name, str) or name in (".", "..") or len(name) > 128
            or any(c in name for c in "/\\") or not name.isprintable()):
        _fail(path, f"displayName {name!r} cannot name the rehearsal's folder "
              "(runs/rehearsal/<displayName>): give one without '/', '\\' or control "
              "characters, not '.' or '..', at most 128 characters, or --local_model_dir")
    return name


def _one_each(replicas: Mapping[str, int], path: str, names: Mapping[str, str]) -> None:
    """Refuses more than one chief or evaluator (`names`: task type -> how the
    spec calls its count): TensorFlow accepts one of each, and the engine's
    cluster would fail later with a traceback."""
    for task_type in (CHIEF, EVALUATOR):
        if replicas.get(task_type, 0) > 1:
            _fail(path, f"{names[task_type]} is {replicas[task_type]}; a cluster has at most one "
                  f"{task_type} (TensorFlow refuses more): make it 1, or add workers instead")


def _read_tfjob(doc: Mapping, path: str) -> Spec:
    specs = _get(doc, "spec", "tfReplicaSpecs")
    if not isinstance(specs, Mapping) or not specs:
        _fail(path, "a TFJob needs spec.tfReplicaSpecs")
    if _get(doc, "spec", "enableDynamicWorker"):
        _fail(path, "enableDynamicWorker: true gives workers a sparse TF_CONFIG, which no "
              "strategy of the engine can run; set it false")
    if "Chief" in specs and "Master" in specs:
        _fail(path, "tfReplicaSpecs has both Chief and Master, two names for the chief; keep one")
    replicas, commands, envs, graces = {}, {}, {}, []
    for rtype, rspec in specs.items():
        if rtype not in TFJOB_TYPES:
            _fail(path, f"replica type {rtype!r} is not one of {', '.join(TFJOB_TYPES)}")
        task_type = CHIEF if TFJOB_TYPES[rtype] == MASTER else TFJOB_TYPES[rtype]
        replicas[task_type] = _count(_get(rspec, "replicas"), path,
                                     f"{rtype}.replicas")
        pod = _get(rspec, "template", "spec")
        container = _container(pod, path, f"{rtype}'s pod")
        commands[rtype], envs[rtype] = _command(container, path), _plain_env(container)
        graces.append(_get(pod, "terminationGracePeriodSeconds"))
    _one_each(replicas, path, {CHIEF: f"{'Master' if 'Master' in specs else 'Chief'}.replicas",
                               EVALUATOR: "Evaluator.replicas"})
    policy = _get(doc, "spec", "runPolicy") or {}
    backoff = policy.get("backoffLimit")
    policies = {_get(rspec, "restartPolicy") for rspec in specs.values()}
    restarts = 0 if policies <= {"Never", None} else (3 if backoff is None else backoff)
    return Spec(TFJOB, _name(doc, path, "TFJob"), path,
                {t: replicas[t] for t in TASK_ORDER if replicas.get(t)},
                _one_command(commands, path), next(iter(envs.values())), restarts,
                min((g for g in graces if g is not None), default=None), doc)


def _read_jobset(doc: Mapping, path: str) -> Spec:
    jobs = _get(doc, "spec", "replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        _fail(path, "a JobSet needs spec.replicatedJobs")
    replicas, commands, env, graces = {}, {}, {}, []
    for job in jobs:
        name = job.get("name")
        if name not in platforms.REPLICATED_JOBS:
            _fail(path, f"replicated job {name!r}: name them "
                  f"{', '.join(platforms.REPLICATED_JOBS)} (the name is the pods' task type)")
        if _count(job.get("replicas"), path, f"{name}.replicas") != 1:
            _fail(path, f"replicated job {name!r} needs replicas: 1 (its task count is "
                  "completions)")
        job_spec = _get(job, "template", "spec") or {}
        if job_spec.get("completionMode") != "Indexed":
            _fail(path, f"replicated job {name!r} needs completionMode: Indexed (each pod's "
                  "JOB_COMPLETION_INDEX is its task index)")
        replicas[name] = _count(job_spec.get("completions"), path, f"{name}.completions")
        pod = _get(job_spec, "template", "spec")
        container = _container(pod, path, f"replicated job {name!r}")
        commands[name] = _command(container, path)
        env.update(_plain_env(container))
        graces.append(_get(pod, "terminationGracePeriodSeconds"))
    _one_each(replicas, path, {CHIEF: "the completions of replicated job 'chief'",
                               EVALUATOR: "the completions of replicated job 'evaluator'"})
    for variable, task_type in (("TFLOOP_NUM_WORKERS", WORKER), ("TFLOOP_NUM_PS", PS)):
        if env.get(variable, "0") != str(replicas.get(task_type, 0)):
            _fail(path, f"{variable}={env.get(variable)!r}, but replicated job {task_type!r} "
                  f"has {replicas.get(task_type, 0)} pod(s): give every pod the counts of the "
                  "JobSet (launch/platforms.py)")
    for variable, task_type in (("TFLOOP_CHIEF", CHIEF), ("TFLOOP_EVALUATOR", EVALUATOR)):
        if (env.get(variable, "0") in ("1", "true", "yes")) != bool(replicas.get(task_type)):
            _fail(path, f"{variable}={env.get(variable)!r}, but the JobSet has "
                  f"{replicas.get(task_type, 0)} {task_type} pod(s)")
    policy = _get(doc, "spec", "failurePolicy") or {}
    return Spec(JOBSET, _name(doc, path, "JobSet"), path,
                {t: replicas[t] for t in TASK_ORDER if replicas.get(t)},
                _one_command(commands, path), env, int(policy.get("maxRestarts") or 0),
                min((g for g in graces if g is not None), default=None), doc)


#: Vertex AI restarts a failed worker with no stated bound; the rehearsal's.
VERTEX_REHEARSAL_RESTARTS = 3


def _read_vertex(doc: Mapping, path: str) -> Spec:
    pools = doc.get("workerPoolSpecs")
    if not isinstance(pools, list) or not pools or len(pools) > len(platforms.VERTEX_POOLS):
        _fail(path, "a Vertex AI CustomJob needs workerPoolSpecs (1 to 4 pools)")
    replicas, commands, env = {}, {}, {}
    for number, pool in enumerate(pools):
        task_type = platforms.VERTEX_POOLS[f"workerpool{number}"]
        if not pool:  # an empty pool keeps the numbering
            continue
        replicas[task_type] = _count(pool.get("replicaCount"), path,
                                     f"workerPoolSpecs[{number}].replicaCount")
        container = pool.get("containerSpec")
        if not isinstance(container, Mapping):
            _fail(path, f"workerPoolSpecs[{number}] needs a containerSpec (the tfloop image)")
        commands[task_type] = _command(container, path)
        env.update(_plain_env(container))
    if replicas.get(CHIEF, 0) != 1:
        _fail(path, "workerPoolSpecs[0] (the chief) must have replicaCount: 1")
    _one_each(replicas, path, {CHIEF: "workerPoolSpecs[0].replicaCount",
                               EVALUATOR: "workerPoolSpecs[3].replicaCount"})
    restart = bool(_get(doc, "scheduling", "restartJobOnWorkerRestart"))
    name = _display_name(doc, path)
    return Spec(VERTEX, name, path,
                {t: replicas[t] for t in TASK_ORDER if replicas.get(t)},
                _one_command(commands, path), env,
                VERTEX_REHEARSAL_RESTARTS if restart else 0, None, doc)


def read(doc, path: str = "spec") -> Spec:
    """The `Spec` of a parsed document: a TFJob, a JobSet, or a Vertex AI
    CustomJob config (`gcloud ai custom-jobs create --config`)."""
    if not isinstance(doc, Mapping):
        _fail(path, "is not a job spec (a YAML mapping: a TFJob, a JobSet, or a Vertex AI "
              "CustomJob config with workerPoolSpecs)")
    kind = doc.get("kind")
    if kind == "TFJob":
        return _read_tfjob(doc, path)
    if kind == "JobSet":
        return _read_jobset(doc, path)
    if kind is None and "workerPoolSpecs" in doc:
        return _read_vertex(doc, path)
    _fail(path, f"kind {kind!r} is none of TFJob, JobSet, or a Vertex AI CustomJob config "
          "(workerPoolSpecs)")


# -- every pod's environment -------------------------------------------------------------------


def pods(spec: Spec) -> list[Role]:
    """Every pod of `spec` as the task it is (`Role`, no cluster yet), in `TASK_ORDER`."""
    return [Role(task_type, i) for task_type in TASK_ORDER
            for i in range(spec.replicas.get(task_type, 0))]


def _tfjob_types(spec: Spec) -> dict:
    """TF_CONFIG job (as the operator writes it: `master` stays `master`) -> task type."""
    written = {TFJOB_TYPES[rtype] for rtype in spec.doc["spec"]["tfReplicaSpecs"]}
    return {(MASTER if t == CHIEF and MASTER in written else t): t for t in spec.replicas}


def _tfjob_port(spec: Spec, task_type: str) -> int:
    """`GetPortFromTFJob`: the `tensorflow` container's port named `tfjob-port`, else 2222."""
    for rtype, rspec in spec.doc["spec"]["tfReplicaSpecs"].items():
        if (CHIEF if TFJOB_TYPES[rtype] == MASTER else TFJOB_TYPES[rtype]) == task_type:
            container = _container(rspec["template"]["spec"], spec.path, rtype)
            for port in container.get("ports") or []:
                if port.get("name") == TFJOB_PORT_NAME:
                    return int(port["containerPort"])
    return DEFAULT_PORT


def tfjob_address(spec: Spec, task_type: str, index: int) -> str:
    """`genClusterSpec`: `<job>-<type>-<i>.<namespace>.svc:<port>` (the operator's
    `CUSTOM_CLUSTER_DOMAIN` unset)."""
    written = next(job for job, t in _tfjob_types(spec).items() if t == task_type)
    namespace = _get(spec.doc, "metadata", "namespace", default="default")
    return f"{spec.name}-{written}-{index}.{namespace}.svc:{_tfjob_port(spec, task_type)}"


def _tfjob_env(spec: Spec, task: Role, address: Addresses) -> dict:
    """`genTFConfigJSONStr` (enableDynamicWorker refused by `read`): every
    replica type in `cluster`, `environment: cloud`; none for one replica."""
    if sum(spec.replicas.values()) == 1:  # isDistributed
        return {}
    types = _tfjob_types(spec)
    cluster = {job: [address(t, i) for i in range(spec.replicas[t])] for job, t in types.items()}
    own = next(job for job, t in types.items() if t == task.task_type)
    return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                     "task": {"type": own, "index": task.task_index},
                                     "environment": "cloud"})}


def jobset_hostname(spec: Spec, task: Role) -> str:
    """`<jobSet>-<replicatedJob>-<jobIndex>-<podIndex>` (one Job per replicated job)."""
    return f"{spec.name}-{task.task_type}-0-{task.task_index}"


def _jobset_env(spec: Spec, task: Role) -> dict:
    """What Kubernetes and JobSet give one pod, with the spec's downward API
    references resolved; the `TFLOOP_*` contract comes from the spec's own env."""
    annotations = {"jobset.sigs.k8s.io/jobset-name": spec.name,
                   "jobset.sigs.k8s.io/replicatedjob-name": task.task_type,
                   "jobset.sigs.k8s.io/job-index": "0",
                   "batch.kubernetes.io/job-completion-index": str(task.task_index)}
    job = next(j for j in spec.doc["spec"]["replicatedJobs"] if j["name"] == task.task_type)
    container = _container(job["template"]["spec"]["template"]["spec"], spec.path, job["name"])
    env = {"JOB_COMPLETION_INDEX": str(task.task_index), "HOSTNAME": jobset_hostname(spec, task)}
    for entry in container.get("env") or []:
        if "value" in entry:  # spec.env: the same, unless a rehearsal shrank the counts
            env[entry["name"]] = spec.env.get(entry["name"], str(entry["value"]))
            continue
        field = _get(entry, "valueFrom", "fieldRef", "fieldPath", default="")
        key = field.partition("['")[2].rstrip("']")
        if not field.startswith(("metadata.annotations[", "metadata.labels[")) or (
                key not in annotations):
            _fail(spec.path, f"env {entry.get('name')!r}: {field or entry!r} is not a value "
                  "this port of JobSet computes")
        env[entry["name"]] = annotations[key]
    return env


def vertex_address(spec: Spec, task_type: str, index: int) -> str:
    pool = next(p for p, t in platforms.VERTEX_POOLS.items() if t == task_type)
    return f"cmle-training-{pool}-{VERTEX_JOB_ID}-{index}:{DEFAULT_PORT}"


def _vertex_env(spec: Spec, task: Role, address: Addresses, tf_config: bool) -> dict:
    """`CLUSTER_SPEC` (and, where `tf_config`, Vertex's `TF_CONFIG` beside it),
    and the `AIP_*` directories of `baseOutputDirectory`."""
    pools = {pool: t for pool, t in platforms.VERTEX_POOLS.items() if spec.replicas.get(t)}
    job = json.dumps({"worker_pool_specs": spec.doc["workerPoolSpecs"]})
    own = next(pool for pool, t in pools.items() if t == task.task_type)
    env = {"CLUSTER_SPEC": json.dumps({
        "cluster": {pool: [address(t, i) for i in range(spec.replicas[t])]
                    for pool, t in pools.items()},
        "environment": "cloud", "task": {"type": own, "index": task.task_index}, "job": job})}
    if tf_config:
        env["TF_CONFIG"] = json.dumps({
            "cluster": {t: [address(t, i) for i in range(spec.replicas[t])]
                        for t in pools.values()},
            "environment": "cloud", "task": {"type": task.task_type, "index": task.task_index},
            "job": job})
    base = _get(spec.doc, "baseOutputDirectory", "outputUriPrefix")
    if base:
        base = base.rstrip("/")
        env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                   AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/")
    return env


def environment(spec: Spec, task: Role, address: Optional[Addresses] = None, *,
                vertex_tf_config: bool = True) -> dict:
    """The variables the platform gives `task`'s container, beyond the spec's own
    `env` (`spec.env`, which a JobSet pod gets resolved here too).

    `address`: where each task listens, default the platform's DNS names.
    `vertex_tf_config`: Vertex sets `TF_CONFIG` beside `CLUSTER_SPEC`; False
    leaves it out, so that the engine reads `CLUSTER_SPEC`.
    """
    if spec.platform == TFJOB:
        return _tfjob_env(spec, task, address or (lambda t, i: tfjob_address(spec, t, i)))
    if spec.platform == JOBSET:
        return _jobset_env(spec, task)
    return _vertex_env(spec, task, address or (lambda t, i: vertex_address(spec, t, i)),
                       vertex_tf_config)


# -- exit statuses -----------------------------------------------------------------------------


def _jobset_pod_failure(spec: Spec, task_type: str, status: int) -> str:
    """A failed pod's fate in its Job, then the Job's in the JobSet: `FAIL` or `RESTART`."""
    job = next(j for j in spec.doc["spec"]["replicatedJobs"] if j["name"] == task_type)
    job_spec = job["template"]["spec"]
    reason = None  # the Job's failure reason, once it fails
    for rule in _get(job_spec, "podFailurePolicy", "rules", default=[]):
        codes = rule.get("onExitCodes")
        if not codes or codes.get("containerName") not in (None, CONTAINER):
            continue  # onPodConditions (DisruptionTarget): an exit status matches none
        if (status in codes.get("values", ())) != (codes.get("operator") == "In"):
            continue
        if rule["action"] == "Ignore":
            return RESTART  # the pod is recreated and not counted
        if rule["action"] == "FailJob":
            reason = "PodFailurePolicy"
        break  # Count: counted against backoffLimit, as without a rule
    if reason is None:
        if (job_spec.get("backoffLimit") or 0) > 0:
            return RESTART  # the Job recreates the pod (while under its backoffLimit)
        reason = "BackoffLimitExceeded"
    policy = _get(spec.doc, "spec", "failurePolicy")
    if policy is None:
        return FAIL  # no failurePolicy: a failed Job fails the JobSet
    for rule in policy.get("rules") or []:
        if reason in (rule.get("onJobFailureReasons") or [reason]) and task_type in (
                rule.get("targetReplicatedJobs") or [task_type]):
            return FAIL if rule["action"] == "FailJobSet" else RESTART
    return RESTART if spec.max_restarts > 0 else FAIL  # RestartJobSet, the default action


def outcome(spec: Spec, status: int, task_type: str = WORKER) -> str:
    """What the platform does when a `task_type` pod exits with `status`:
    `DONE`, `RESTART` (the job goes on: the pod, or every pod, is started
    again) or `FAIL` (the job is over)."""
    if status == 0:
        return DONE
    if spec.platform == TFJOB:
        rtype = next(r for r, t in TFJOB_TYPES.items()
                     if (CHIEF if t == MASTER else t) == task_type
                     and r in spec.doc["spec"]["tfReplicaSpecs"])
        policy = spec.doc["spec"]["tfReplicaSpecs"][rtype].get("restartPolicy", "Never")
        if policy == "ExitCode":
            return RESTART if status >= 128 else FAIL  # IsRetryableExitCode
        return {"Never": FAIL, "OnFailure": RESTART, "Always": RESTART}[policy]
    if spec.platform == JOBSET:
        return _jobset_pod_failure(spec, task_type, status)
    return RESTART  # Vertex restarts a worker that exits non-zero, whatever the status
