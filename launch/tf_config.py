"""The one model of a `TF_CONFIG` task: read by the engine, written by the launcher.

`TF_CONFIG` is JSON: `{"cluster": {"chief": [...], "worker": [...], "ps": [...]},
"task": {"type": "worker", "index": 1}}`. Two conventions are common: a
separate `chief` job, or none, in which case worker 0 is the chief. An
`evaluator` task is not part of the training cluster: its `TF_CONFIG` names
the training cluster, no task's `cluster` lists it, and it only reads the
chief's checkpoints.

Both directions live here so that they cannot drift apart: `parse` turns a
value into a `Role` (TensorFlow's own parser reports a malformed value late and
as a traceback from deep inside the strategy; this one turns each mistake into
one line naming what is wrong), and `cluster_spec` / `tf_config_for` write the
values `bin/launch` hands its tasks. Standard library only: the launcher
imports it without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
from typing import Iterable, Mapping, Optional, Sequence

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"

#: Jobs of the training cluster, in the order tasks start and are listed.
CLUSTER_JOBS = (CHIEF, WORKER, PS)
#: Tasks whose successful exit ends training.
TRAINING_JOBS = (CHIEF, WORKER)
#: Every task type `TF_CONFIG` may name.
JOBS = (CHIEF, WORKER, PS, EVALUATOR)


class TFConfigError(ValueError):
    """`TF_CONFIG` is malformed or unusable; the one-line message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class Role:
    """Who one process of a cluster is.

    The engine gets this process's role from `current_role()`; the launcher
    plans one per task (`cluster` still empty: the ports are picked at each
    start) and writes each one's `TF_CONFIG` with `tf_config_for`.

    Attributes:
      task_type: `chief`, `worker`, `ps`, `evaluator`, or None outside a cluster.
      task_index: index within its job.
      cluster: job name → tuple of `host:port`.
    """

    task_type: Optional[str] = None
    task_index: int = 0
    cluster: Mapping[str, tuple] = dataclasses.field(default_factory=dict)

    @property
    def in_cluster(self) -> bool:
        """This process has a `TF_CONFIG` (the evaluator too)."""
        return self.task_type is not None

    @property
    def is_member(self) -> bool:
        """Listed in the `cluster` of `TF_CONFIG`: every task but the evaluator."""
        return self.task_type in CLUSTER_JOBS

    @property
    def is_training(self) -> bool:
        """A chief or worker: training is over when all of these exited 0."""
        return self.task_type in TRAINING_JOBS

    @property
    def is_chief(self) -> bool:
        """Writes checkpoints, summaries and metrics.json to `--model_dir`."""
        if self.task_type is None or self.task_type == CHIEF:
            return True
        return self.task_type == WORKER and self.task_index == 0 and CHIEF not in self.cluster

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == EVALUATOR

    @property
    def num_workers(self) -> int:
        """Training processes: the chief (if separate) plus the workers."""
        return sum(len(self.cluster.get(job, ())) for job in TRAINING_JOBS)

    @property
    def name(self) -> str:
        """`worker:1`, `evaluator:0`, or `local` outside a cluster: for the engine's messages."""
        return f"{self.task_type}:{self.task_index}" if self.in_cluster else "local"

    @property
    def label(self) -> str:
        """`worker:1`, or `evaluator` (there is one): the launcher's output prefix."""
        return EVALUATOR if self.is_evaluator else self.name

    @property
    def address(self) -> Optional[str]:
        """This task's `host:port` in the cluster (None outside it, and for the evaluator)."""
        if self.task_type not in self.cluster:
            return None
        return self.cluster[self.task_type][self.task_index]

    def describe_cluster(self) -> str:
        """`chief:0=host:port, worker:0=...`: for messages about the cluster."""
        return ", ".join(f"{job}:{i}={address}" for job, tasks in self.cluster.items()
                         for i, address in enumerate(tasks))


# -- reading -----------------------------------------------------------------------------


def _fail(message: str) -> None:
    raise TFConfigError(f"TF_CONFIG {message}")


def _check_cluster(cluster) -> None:
    if not isinstance(cluster, dict) or not cluster:
        _fail("has no 'cluster' (job name → list of host:port), e.g. "
              '{"worker": ["localhost:12345", "localhost:12346"]}')
    tasks: dict[str, str] = {}  # host:port (as the OS reads it) -> the task given it
    for job, addresses in cluster.items():
        if job not in JOBS or job == EVALUATOR:
            _fail(f"cluster has a job {job!r}; jobs are chief, worker and ps "
                  "(the evaluator is not part of the cluster)")
        if not isinstance(addresses, list) or not addresses:
            _fail(f"cluster job {job!r} must be a non-empty list of host:port")
        for index, address in enumerate(addresses):
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit():
                _fail(f"cluster job {job!r} has address {address!r}; write host:port")
            if not 1 <= int(port) <= 65535:
                _fail(f"cluster job {job!r} has address {address!r}, whose port is not "
                      "between 1 and 65535")
            key = f"{host.lower()}:{int(port)}"
            if key in tasks:
                _fail(f"gives {address!r} to both {tasks[key]} and {job}:{index}; every task "
                      "needs an address of its own (bin/launch picks free ports)")
            tasks[key] = f"{job}:{index}"
    if len(cluster.get(CHIEF, [])) > 1:
        _fail(f"cluster has {len(cluster[CHIEF])} chiefs; there is at most one")
    if not any(job in cluster for job in TRAINING_JOBS):
        _fail("cluster has neither a 'chief' nor a 'worker' job")


def _check_task(task, cluster: dict) -> tuple[str, int]:
    if not isinstance(task, dict) or "type" not in task:
        _fail("has no 'task'; add \"task\": {\"type\": \"worker\", \"index\": N}")
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in JOBS:
        _fail(f"task type {task_type!r} is not one of {', '.join(JOBS)}")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        _fail(f"task index {index!r} must be a non-negative integer")
    if task_type == EVALUATOR:
        if index != 0:
            _fail(f"task index {index} for the evaluator; there is one evaluator, index 0")
    elif task_type not in cluster:
        _fail(f"task type {task_type!r} has no job in the cluster ({', '.join(cluster)})")
    elif index >= len(cluster[task_type]):
        _fail(f"task index {index} is out of range: job {task_type!r} has "
              f"{len(cluster[task_type])} task(s), indices 0..{len(cluster[task_type]) - 1}")
    return task_type, index


def parse(text: Optional[str]) -> Role:
    """Parses and checks a `TF_CONFIG` value; empty or None means no cluster."""
    if text is None or not text.strip():
        return Role()
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        _fail(f"is not valid JSON ({error.msg} at character {error.pos}); "
              'expected {"cluster": {...}, "task": {"type": ..., "index": ...}}')
    if not isinstance(config, dict):
        _fail("must be a JSON object with 'cluster' and 'task'")
    cluster = config.get("cluster")
    _check_cluster(cluster)
    task_type, index = _check_task(config.get("task"), cluster)
    return Role(
        task_type=task_type,
        task_index=index,
        cluster={job: tuple(addresses) for job, addresses in cluster.items()},
    )


def current_role(environ: Mapping[str, str] = os.environ) -> Role:
    """This process's role, from `$TF_CONFIG`."""
    return parse(environ.get("TF_CONFIG"))


def check_port_free(role: Role) -> None:
    """Refuses a task whose own port another process already holds.

    TensorFlow would find out only when it starts its server, and report it
    as "Could not start gRPC server". Checking here, before anything is
    built, costs one bind. (Another process may still take the port between
    this check and TensorFlow's bind; the strategy reports that case too.)
    """
    if role.address is None:
        return
    port = int(role.address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Like gRPC: a port left in TIME_WAIT by an earlier run is free to use.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise TFConfigError(
                f"TF_CONFIG gives {role.name} the address {role.address}, but port {port} is "
                "in use by another process; stop that process or give this task a free port "
                "(bin/launch picks free ports)"
            ) from None


# -- writing -----------------------------------------------------------------------------


def cluster_spec(roles: Iterable[Role], ports: Sequence[int]) -> dict[str, list[str]]:
    """The `cluster` dict of TF_CONFIG: job → `localhost:PORT` per task.

    `ports` holds one port per cluster member (the evaluator has none), in the
    order of `roles`. Jobs without tasks are left out.
    """
    members = [role for role in roles if role.is_member]
    if len(ports) != len(members):
        raise ValueError(f"need {len(members)} ports for {[r.label for r in members]}, "
                         f"got {len(ports)}")
    cluster: dict[str, list[str]] = {}
    for role, port in zip(members, ports):
        addresses = cluster.setdefault(role.task_type, [])
        if role.task_index != len(addresses):
            raise ValueError(f"tasks of job {role.task_type!r} must come in index order; "
                             f"got {role.label} after {len(addresses)} of them")
        addresses.append(f"localhost:{port}")
    return {job: cluster[job] for job in CLUSTER_JOBS if job in cluster}


def tf_config_for(role: Role, cluster: Mapping[str, Sequence[str]]) -> dict:
    """The TF_CONFIG of one task (the evaluator gets the training cluster too)."""
    return {"cluster": {job: list(addresses) for job, addresses in cluster.items()},
            "task": {"type": role.task_type, "index": role.task_index}}
