"""Where the platforms write no `TF_CONFIG`: the cluster from their own environment.

Each reader is a pure function of an environ mapping that returns the
`TF_CONFIG` value (a dict) the platform would have written; `tf_config.resolve`
checks it with the one parser and says which source it came from. Standard
library only, and nothing of the project: `tf_config` builds on this module.

Which source, with `source="auto"` (first found wins):

1. `TF_CONFIG`, where set and not empty (Kubeflow TFJob, Vertex AI, bin/launch,
   a user): what TensorFlow itself reads. A blank value is passed over for
   the next source; with none, it is refused (TensorFlow would fail on it).
2. `CLUSTER_SPEC` (Vertex AI sets it beside `TF_CONFIG`, so it is read only
   without one): `{"cluster": {"workerpool0": [...], ...}, "task": {"type":
   "workerpool1", "index": 0}}`. Worker pool 0 is the primary replica (the
   chief), 1 the workers, 2 the parameter servers, 3 the evaluators
   (cloud.google.com/vertex-ai/docs/training/distributed-training). A job of
   one replica is no cluster.
3. A JobSet or Indexed Job pod, told it is one by `TFLOOP_NUM_WORKERS` beside
   Kubernetes' `JOB_COMPLETION_INDEX` (an Indexed Job sets that on every pod
   for other uses too; it alone starts no cluster). See `jobset_tf_config`.
4. None: no cluster.

`source` = `tf_config`, `vertex` or `jobset` reads that one only, and a
missing or malformed variable is then an error naming it.

`platform_dirs` reads Vertex AI's output directories (`AIP_*`), which
`bin/train` may take as defaults for `--model_dir` and the summaries.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Mapping, Optional

#: What `source` may be; `auto` picks the first found, in this order.
SOURCES = ("auto", "tf_config", "vertex", "jobset")
#: How each source is named in messages and the start-up line.
SOURCE_NAMES = {
    "tf_config": "TF_CONFIG",
    "vertex": "Vertex AI's CLUSTER_SPEC",
    "jobset": "the JobSet / Indexed Job environment",
}

#: Vertex AI's worker pools, in `workerPoolSpecs[]` order, as TF_CONFIG's jobs.
VERTEX_POOLS = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
                "workerpool3": "evaluator"}

#: The TFJob default port (kubeflow training-operator `DefaultPort`), used when
#: `TFLOOP_PORT` is not set.
DEFAULT_PORT = 2222
#: Most pods of one kind a JobSet's variables may declare (`TFLOOP_NUM_WORKERS`,
#: `TFLOOP_NUM_PS`), as `bin/launch --num_workers` has its bound: the TF_CONFIG
#: built lists every task, so 100,000,000 grew to 14.5 GB in 60 s. Every
#: task of a cluster keeps a gRPC channel to every other; thousands is
#: already beyond what a synchronous all-reduce over TCP is used at.
MAX_TASKS = 4096
#: JobSet replicated-job names: each is the TF_CONFIG task type of its pods.
REPLICATED_JOBS = ("chief", "worker", "ps", "evaluator")
#: A JobSet pod's hostname: `<jobSet>-<replicatedJob>-<jobIndex>-<podIndex>`.
_JOBSET_HOSTNAME = re.compile(
    r"^(?P<jobset>.+)-(?P<rjob>chief|worker|ps|evaluator)-(?P<job>\d+)-(?P<pod>\d+)$")


class PlatformEnvError(ValueError):
    """A platform's variables are missing or malformed; the one line names which."""


def _fail(message: str) -> None:
    raise PlatformEnvError(message)


def load_json(text: str, name: str):
    """`json.loads(text)` of the variable `name`; every way it fails is one
    `PlatformEnvError` line: invalid JSON, and JSON nested deeper than Python's
    parser recurses (a `RecursionError` traceback otherwise)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        _fail(f"{name} is not valid JSON ({error.msg} at character {error.pos}); expected "
              '{"cluster": {...}, "task": {"type": ..., "index": ...}}')
    except RecursionError:
        _fail(f"{name} is nested too deeply to be a cluster description; expected "
              '{"cluster": {...}, "task": {"type": ..., "index": ...}}')


def _count(environ: Mapping[str, str], name: str, default: Optional[int] = None, *,
           minimum: int = 0, maximum: Optional[int] = None) -> int:
    value = environ.get(name, "").strip()
    if not value:
        if default is None:
            _fail(f"{name} is not set; set it to the number of tasks (see launch/platforms.py)")
        return default
    # (A number of 4,301 digits or more would be a ValueError from int().)
    if (not value.isdecimal() or len(value) > 12 or int(value) < minimum
            or int(value) > (maximum or int(value))):
        shown = value if len(value) <= 24 else f"{value[:20]}...({len(value)} characters)"
        _fail(f"{name}={shown!r} must be a whole number, at least {minimum}"
              + (f" and at most {maximum}" if maximum else ""))
    return int(value)


def _flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    _fail(f"{name}={value!r} must be 1 or 0")
    return False


# -- Vertex AI -----------------------------------------------------------------------------


def vertex_tf_config(environ: Mapping[str, str]) -> Optional[dict]:
    """The TF_CONFIG of Vertex AI's `CLUSTER_SPEC`, or None for a job of one replica.

    Worker pools become jobs (`VERTEX_POOLS`); other keys (`environment`,
    `job`, `trial`) are left to the parser, which ignores them. The
    evaluator's pool stays in `cluster`, as Vertex's own TF_CONFIG has it.
    """
    spec = load_json(environ.get("CLUSTER_SPEC", ""), "CLUSTER_SPEC")
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
        _fail("CLUSTER_SPEC has no 'cluster' of worker pools (workerpool0..3)")
    cluster = {}
    for pool, addresses in spec["cluster"].items():
        if pool not in VERTEX_POOLS:
            _fail(f"CLUSTER_SPEC has a worker pool {pool!r}; Vertex AI's are "
                  f"{', '.join(VERTEX_POOLS)}")
        if addresses:
            cluster[VERTEX_POOLS[pool]] = addresses
    task = spec.get("task")
    if not isinstance(task, dict) or task.get("type") not in VERTEX_POOLS:
        _fail(f"CLUSTER_SPEC's task {task!r} names none of {', '.join(VERTEX_POOLS)}")
    if sum(len(addresses) for addresses in cluster.values()) == 1:
        return None  # one replica: a single machine, no cluster
    return {**{k: v for k, v in spec.items() if k not in ("cluster", "task")},
            "cluster": cluster,
            "task": {"type": VERTEX_POOLS[task["type"]], "index": task.get("index", 0)}}


# -- JobSet / Indexed Job ------------------------------------------------------------------


def jobset_tf_config(environ: Mapping[str, str]) -> dict:
    """The TF_CONFIG of a JobSet or Indexed Job pod, from stable DNS names.

    What Kubernetes gives a pod of an Indexed Job: `JOB_COMPLETION_INDEX`
    (kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode)
    and the hostname `<job>-<index>`, reachable as `<hostname>.<subdomain>`
    where the pod template names a headless Service as its `subdomain`.
    JobSet names its Jobs `<jobSet>-<replicatedJob>-<jobIndex>`, so a pod's
    hostname is `<jobSet>-<replicatedJob>-<jobIndex>-<podIndex>`, and it makes
    the headless Service itself, named `spec.network.subdomain` or else the
    JobSet's name (jobset site/content/en/docs/concepts/_index.md, "DNS
    hostnames for Pods"; `GetSubdomain` in pkg/controllers/jobset_controller.go).
    Neither sets anything else: the shape of the cluster comes from the spec.

    The contract (the same variables on every pod; deploy/ specs set them):

      TFLOOP_NUM_WORKERS   worker pods (required; it is what says "a cluster")
      TFLOOP_CHIEF=1       a separate chief (else worker 0 is the chief)
      TFLOOP_NUM_PS        ps pods (default 0)
      TFLOOP_EVALUATOR=1   an evaluator pod (a sidecar, not in the cluster)
      TFLOOP_PORT          every task's port (default 2222, TFJob's)
      TFLOOP_SUBDOMAIN     the headless Service (default: the JobSet's name)

    JobSet: one replicated job per task type, *named* `chief`, `worker`,
    `ps` and `evaluator` (the name is the task type, which is how a pod
    knows its peers' hostnames), each `replicas: 1` with `completions` (and
    `parallelism`) = its task count. The JobSet and replicated job names are
    read from `JOBSET_NAME`, `REPLICATED_JOB_NAME` and `JOB_INDEX` where set
    (the downward API of the pod annotations `jobset.sigs.k8s.io/jobset-name`,
    `.../replicatedjob-name`, `.../job-index`), else from `HOSTNAME`.

    Indexed Job (no JobSet): one Job of `TFLOOP_NUM_WORKERS` worker pods,
    hostnames `<job>-<i>`, `TFLOOP_SUBDOMAIN` required (no chief, ps or
    evaluator: those need a JobSet).
    """
    index = environ.get("JOB_COMPLETION_INDEX", "").strip()
    if not index.isdecimal():
        _fail(f"JOB_COMPLETION_INDEX={index!r} is not a pod index; run in an Indexed Job "
              "or a JobSet (completionMode: Indexed)")
    num_workers = _count(environ, "TFLOOP_NUM_WORKERS", minimum=1, maximum=MAX_TASKS)
    counts = {"chief": int(_flag(environ, "TFLOOP_CHIEF")), "worker": num_workers,
              "ps": _count(environ, "TFLOOP_NUM_PS", 0, maximum=MAX_TASKS),
              "evaluator": int(_flag(environ, "TFLOOP_EVALUATOR"))}
    port = _count(environ, "TFLOOP_PORT", DEFAULT_PORT, minimum=1, maximum=65535)
    hostname = environ.get("HOSTNAME", "").strip().split(".")[0]
    jobset, rjob, job_index = (environ.get("JOBSET_NAME", "").strip(),
                               environ.get("REPLICATED_JOB_NAME", "").strip(),
                               environ.get("JOB_INDEX", "").strip() or "0")
    match = _JOBSET_HOSTNAME.match(hostname)
    if not (jobset and rjob) and match:
        jobset, rjob, job_index = match["jobset"], match["rjob"], match["job"]
        if match["pod"] != index:
            _fail(f"HOSTNAME={hostname!r} says pod {match['pod']}, but "
                  f"JOB_COMPLETION_INDEX={index}; set JOBSET_NAME and REPLICATED_JOB_NAME")
    subdomain = environ.get("TFLOOP_SUBDOMAIN", "").strip() or jobset
    if not (jobset and rjob):
        # A plain Indexed Job: every pod a worker.
        job = hostname[:-len(f"-{index}")] if hostname.endswith(f"-{index}") else ""
        if not job or not subdomain:
            _fail(f"HOSTNAME={hostname!r} is not an Indexed Job pod's <job>-{index}, or "
                  "TFLOOP_SUBDOMAIN (the Job's headless Service) is not set; in a JobSet, "
                  "set JOBSET_NAME and REPLICATED_JOB_NAME")
        if any(counts[job_type] for job_type in ("chief", "ps", "evaluator")):
            _fail("a chief, ps or evaluator needs a JobSet (one replicated job each); "
                  "an Indexed Job's pods are all workers")
        cluster = {"worker": [f"{job}-{i}.{subdomain}:{port}" for i in range(num_workers)]}
        return {"cluster": cluster, "task": {"type": "worker", "index": int(index)}}
    if rjob not in REPLICATED_JOBS:
        _fail(f"REPLICATED_JOB_NAME={rjob!r}; name the JobSet's replicated jobs "
              f"{', '.join(REPLICATED_JOBS)} (the name is the pod's task type)")
    if not job_index.isdecimal() or int(job_index) != 0:
        _fail(f"this pod is in Job {job_index} of replicated job {rjob!r}; give each "
              "replicated job replicas: 1 and its task count as completions")
    if not counts[rjob]:
        variable = {"chief": "TFLOOP_CHIEF=1", "ps": "TFLOOP_NUM_PS",
                    "evaluator": "TFLOOP_EVALUATOR=1"}[rjob]
        _fail(f"this pod is in replicated job {rjob!r}, but {variable} is not set; set the "
              "same TFLOOP_* variables on every pod")
    cluster = {job_type: [f"{jobset}-{job_type}-0-{i}.{subdomain}:{port}"
                          for i in range(counts[job_type])]
               for job_type in ("chief", "worker", "ps") if counts[job_type]}
    return {"cluster": cluster, "task": {"type": rjob, "index": int(index)}}


# -- choosing ----------------------------------------------------------------------------


def detect(environ: Mapping[str, str]) -> Optional[str]:
    """The source `auto` reads (see the module docstring), or None: no cluster."""
    if environ.get("TF_CONFIG", "").strip():
        return "tf_config"
    if environ.get("CLUSTER_SPEC", "").strip():
        return "vertex"
    if environ.get("JOB_COMPLETION_INDEX", "").strip() and environ.get("TFLOOP_NUM_WORKERS",
                                                                       "").strip():
        return "jobset"
    if environ.get("TF_CONFIG", ""):
        # Blank, and no other source: TensorFlow would read it as JSON and fail
        # with a traceback; the parser refuses it in one line.
        return "tf_config"
    return None


def find(environ: Mapping[str, str], source: str = "auto") -> tuple[Optional[str],
                                                                     Optional[str]]:
    """(source, the TF_CONFIG value it gives, or None for no cluster).

    The value of `tf_config` is `$TF_CONFIG` as written; the others are built.
    """
    if source not in SOURCES:
        _fail(f"cluster source {source!r} is not one of {', '.join(SOURCES)}")
    chosen = detect(environ) if source == "auto" else source
    if chosen is None:
        return None, None
    if chosen == "tf_config":
        text = environ.get("TF_CONFIG", "")
        if not text and source != "auto":
            _fail("TF_CONFIG is not set, and the cluster was asked of it")
        return chosen, text
    if chosen == "vertex":
        if not environ.get("CLUSTER_SPEC", "").strip():
            _fail("CLUSTER_SPEC is not set (Vertex AI sets it on each replica)")
        config = vertex_tf_config(environ)
    else:
        config = jobset_tf_config(environ)
    return chosen, (json.dumps(config) if config is not None else None)


# -- output directories --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlatformDirs:
    """Where a platform wants a job's output (None: it said nothing).

    Vertex AI sets these when the CustomJob has a `baseOutputDirectory`:
    `<base>/model/`, `<base>/checkpoints/`, `<base>/logs/` (per trial under a
    tuning job; `CustomJobSpec.baseOutputDirectory` in the Vertex API).

    Attributes:
      model_dir: `AIP_MODEL_DIR`, where the trained model is exported for Vertex
        to pick up.
      checkpoint_dir: `AIP_CHECKPOINT_DIR`, the run's checkpoints: the natural
        `--model_dir` (a restarted job resumes from it).
      tensorboard_log_dir: `AIP_TENSORBOARD_LOG_DIR`, the summaries.
    """

    model_dir: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    tensorboard_log_dir: Optional[str] = None

    @property
    def run_dir(self) -> Optional[str]:
        """The default `--model_dir`: the checkpoint directory, else the model's."""
        return self.checkpoint_dir if self.checkpoint_dir is not None else self.model_dir


def platform_dirs(environ: Mapping[str, str]) -> PlatformDirs:
    """The `AIP_*` directories of `environ`, as set (None: unset). A blank
    value is kept, not read as unset: the run would train into the default
    `runs/default` in silence; `bin/train` refuses it (`config.check_path_text`)."""
    return PlatformDirs(model_dir=environ.get("AIP_MODEL_DIR"),
                        checkpoint_dir=environ.get("AIP_CHECKPOINT_DIR"),
                        tensorboard_log_dir=environ.get("AIP_TENSORBOARD_LOG_DIR"))
