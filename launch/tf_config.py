"""The one model of a `TF_CONFIG` task: read by the engine, written by the launcher.

`TF_CONFIG` is JSON: `{"cluster": {"chief": [...], "worker": [...], "ps": [...]},
"task": {"type": "worker", "index": 1}}`. Two conventions are common: a
separate `chief` job, or none, in which case worker 0 is the chief. An
`evaluator` task is not part of the training cluster: it only reads the
chief's checkpoints. `bin/launch` lists it in no task's `cluster`; Kubeflow's
TFJob lists every replica type there, the evaluator too, which TensorFlow
accepts (one evaluator at most: `multi_worker_util._validate_cluster_spec`),
so it is read and kept apart (`Role.evaluator_address`): `Role.cluster` is
always the training cluster.

What the platforms write, and is read here as TensorFlow reads it:

- extra keys (`environment: "cloud"` from TFJob and Vertex AI, `job`,
  `trial`, `rpc_layer`) are ignored;
- a job may be a dict of index -> address, as `tf.train.ClusterSpec` takes
  it: TFJob's `enableDynamicWorker` gives each worker only its own entry,
  `"worker": {"1": "host:2222"}`. A dict with every index 0..n-1 is the
  list; otherwise the job is *sparse* (`Role.is_sparse`): this task knows of
  only some of its tasks. `parse` reads it as TensorFlow does; the engine
  (`adopt`) refuses it in one line, since every strategy it runs needs the
  whole cluster (TensorFlow's own check refuses worker 1 of a one-entry job,
  and TFJob gives the chief no cluster at all). An empty job (`[]`, `{}`)
  is no job;
- `master`, AI Platform's (and legacy TFJob's) name for the chief, is read as
  `chief`, said so in one log line. TensorFlow itself refuses it ("Disallowed
  task type"), so the engine hands TensorFlow the renamed value (`adopt`).

The same address written two ways (`localhost:P` and `127.0.0.1:P`, or a
name that resolves to the same address) is refused in one line: the tasks
would wait for each other until `--startup_timeout`. Names are resolved only
where two tasks share a port, all at once and for at most
`RESOLVE_TIMEOUT` seconds; a name that does not resolve (yet: a peer's DNS
record on Kubernetes appears when its pod does) is compared as written.

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
import ipaddress
import json
import logging
import os
import re
import socket
import threading
import time
from typing import Callable, Iterable, Mapping, Optional, Sequence

from tfloop.launch import platforms

logger = logging.getLogger(__name__)

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
#: AI Platform's name for the chief (`masterConfig`), read as `chief`.
MASTER = "master"
#: Seconds the duplicate-address check may spend resolving host names, in all.
RESOLVE_TIMEOUT = 2.0


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
      cluster: the training cluster: job (chief, worker, ps) → tuple of
        `host:port`, or, for a sparse job, a dict task index → `host:port`.
      evaluator_address: the evaluator's `host:port` where `TF_CONFIG` lists
        it in `cluster` (TFJob does), else None. Not a cluster member.
    """

    task_type: Optional[str] = None
    task_index: int = 0
    cluster: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    evaluator_address: Optional[str] = None

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
        """Training processes: the chief (if separate) plus the workers (those
        listed, where a job is sparse)."""
        return sum(len(self.cluster.get(job, ())) for job in TRAINING_JOBS)

    @property
    def is_sparse(self) -> bool:
        """A job lists only some of its tasks (TFJob's `enableDynamicWorker`):
        enough to serve, not to count or form the cluster."""
        return any(isinstance(tasks, Mapping) for tasks in self.cluster.values())

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
                         for i, address in _indexed(tasks))

    def tf_cluster(self) -> dict:
        """The `cluster` of TF_CONFIG as TensorFlow reads it (JSON-ready): the
        training cluster, a sparse job as a dict, and the evaluator where listed."""
        cluster: dict = {job: ({str(i): address for i, address in tasks.items()}
                               if isinstance(tasks, Mapping) else list(tasks))
                         for job, tasks in self.cluster.items()}
        if self.evaluator_address is not None:
            cluster[EVALUATOR] = [self.evaluator_address]
        return cluster


def _indexed(tasks) -> Iterable[tuple[int, str]]:
    """(index, address) of a job's tasks, a list or a sparse dict."""
    return sorted(tasks.items()) if isinstance(tasks, Mapping) else enumerate(tasks)


# -- reading -----------------------------------------------------------------------------

#: `resolve(hosts) -> {host: addresses}`: the duplicate-address check's name lookup.
Resolver = Callable[[Iterable[str]], Mapping[str, frozenset]]
#: At most this many names are looked up for one check: each task of a big
#: cluster checks every peer, and a platform that writes names writes them alike.
MAX_RESOLVED = 32
_LOOPBACK = "loopback"  # any 127.x or ::1: this machine, whose port is taken on every address


def _fail(message: str) -> None:
    raise TFConfigError(f"TF_CONFIG {message}")


def _ip(host: str) -> Optional[str]:
    """`host` as an IP address, loopbacks as one, or None for a name."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return _LOOPBACK if address.is_loopback or address.is_unspecified else str(address)


def resolve_hosts(hosts: Iterable[str], timeout: float = RESOLVE_TIMEOUT
                  ) -> dict[str, frozenset]:
    """host -> the addresses it resolves to (loopbacks as one), for those that
    resolve within `timeout` seconds in all; the others are left out.

    IP literals need no lookup, and `localhost` is answered from /etc/hosts.
    Names are looked up all at once in daemon threads, so a slow DNS costs at
    most `timeout` and a lookup still running is simply abandoned.
    """
    results: dict[str, frozenset] = {}

    def look_up(host: str) -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return
        found = frozenset(_ip(info[4][0]) or info[4][0] for info in infos)
        if found:
            results[host] = found

    threads = []
    for host in dict.fromkeys(hosts):
        literal = _ip(host)
        if literal is not None:
            results[host] = frozenset({literal})
        else:
            thread = threading.Thread(target=look_up, args=(host,), daemon=True,
                                      name=f"tfloop-resolve-{host}")
            thread.start()
            threads.append(thread)
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(results)


def _job_tasks(job: str, addresses) -> dict[int, str]:
    """A job's tasks as index -> address: a list, or a dict as `tf.train.ClusterSpec`
    takes it (JSON keys are strings: `{"1": "host:port"}`)."""
    if isinstance(addresses, list):
        tasks = dict(enumerate(addresses))
    elif isinstance(addresses, dict):
        tasks = {}
        for key, address in addresses.items():
            if not str(key).isdecimal():
                _fail(f"cluster job {job!r} has task index {key!r}; a job written as a dict "
                      'maps task indices to host:port, e.g. {"1": "host:2222"}')
            if int(key) in tasks:
                _fail(f"cluster job {job!r} lists task index {int(key)} twice")
            tasks[int(key)] = address
    else:
        _fail(f"cluster job {job!r} must be a list of host:port (or a dict of task index "
              "to host:port)")
    for index, address in tasks.items():
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not (port.isascii() and port.isdecimal()):  # not '２２２２'
            _fail(f"cluster job {job!r} has address {address!r}; write host:port")
        if not 1 <= int(port) <= 65535:
            _fail(f"cluster job {job!r} has address {address!r}, whose port is not "
                  "between 1 and 65535")
        problem = _host_problem(host)
        if problem:
            _fail(f"cluster job {job!r} has address {address!r}: {problem}")
    return tasks


#: A host name as gRPC takes it: labels of letters, digits, `-` and `_`, joined by dots.
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?"
                        r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?")


def _host_problem(host: str) -> Optional[str]:
    """Why `host` (of `host:port`) is no address a task can be reached at, or
    None. Accepted as written, such a host makes every task wait for a peer
    that cannot be found until `--startup_timeout`, then exit 138, the
    retryable class, so that a platform restarts it into the same wait."""
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is not an IPv6 address; write [address]:port, e.g. [::1]:2222"
        return None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "a host name has no ':'; write host:port"
        return f"an IPv6 address takes brackets: write [{host}]:port"
    if len(host) > 253 or not _HOST_NAME.fullmatch(host):
        return ("the host is not a host name (letters, digits, '-', '_' and dots, no spaces) "
                "nor an IP address")
    return None


def _check_distinct(tasks: Sequence[tuple[str, str]], lookup: Resolver) -> None:
    """Refuses two tasks given one address, as written or once resolved.

    `tasks`: (name, host:port). Only tasks that share a port can collide, so
    only their hosts are resolved, and only if there are few enough of them.
    """
    by_port: dict[int, dict[str, str]] = {}  # port -> host (as written, lower case) -> task
    addresses = dict(tasks)
    for name, address in tasks:
        host, _, port = address.rpartition(":")
        hosts = by_port.setdefault(int(port), {})
        key = host.lower().strip("[]")
        if key in hosts:
            _fail(f"gives {address!r} to both {hosts[key]} and {name}; every task needs an "
                  "address of its own (bin/launch picks free ports)")
        hosts[key] = name
    shared = [hosts for hosts in by_port.values() if len(hosts) > 1]
    names = {host for hosts in shared for host in hosts}
    if not shared or len(names) > MAX_RESOLVED:
        return
    resolved = lookup(names)
    for hosts in shared:
        seen: dict[str, str] = {}  # resolved address -> task
        for host, name in hosts.items():
            for address in sorted(resolved.get(host, ())):
                if address in seen and seen[address] != name:
                    other = seen[address]
                    where = "this machine's loopback" if address == _LOOPBACK else address
                    _fail(f"gives {addresses[other]!r} to {other} and {addresses[name]!r} to "
                          f"{name}, which are the same address ({where}); every task needs "
                          "an address of its own (bin/launch picks free ports)")
                seen[address] = name


_DYNAMIC = ("; Kubeflow's enableDynamicWorker writes such a TF_CONFIG for its chief and ps "
            "tasks, which need the whole cluster: set enableDynamicWorker: false")


def _read_cluster(cluster, lookup: Resolver) -> tuple[dict, Optional[str], bool]:
    """(training cluster, the evaluator's address or None, whether `master` was renamed)."""
    if not isinstance(cluster, dict) or not cluster:
        _fail("has no 'cluster' (job name → list of host:port), e.g. "
              '{"worker": ["localhost:12345", "localhost:12346"]}')
    if MASTER in cluster and CHIEF in cluster:
        _fail("cluster has both a 'master' and a 'chief' job; 'master' is AI Platform's name "
              "for the chief: keep one")
    jobs: dict[str, dict[int, str]] = {}
    for job, addresses in cluster.items():
        if job not in JOBS and job != MASTER:
            _fail(f"cluster has a job {job!r}; jobs are chief (or master), worker, ps and "
                  "evaluator")
        tasks = _job_tasks(job, addresses)
        if tasks:  # an empty job is no job, as for TensorFlow
            jobs[CHIEF if job == MASTER else job] = tasks
    dynamic = _DYNAMIC if any(not tasks or isinstance(tasks, dict)
                              for tasks in cluster.values()) else ""
    if not jobs:
        _fail(f"cluster lists no task{dynamic}")
    _check_distinct([(f"{job}:{i}", address) for job, tasks in jobs.items()
                     for i, address in sorted(tasks.items())], lookup)
    for job in (CHIEF, EVALUATOR):
        if len(jobs.get(job, ())) > 1:
            _fail(f"cluster has {len(jobs[job])} {job}s; there is at most one")
        if job in jobs and 0 not in jobs[job]:
            _fail(f"cluster lists the {job} as task {min(jobs[job])}; it is task 0")
    if not any(job in jobs for job in TRAINING_JOBS):
        _fail(f"cluster has neither a 'chief' nor a 'worker' job{dynamic}")
    evaluator = jobs.pop(EVALUATOR, {}).get(0)
    training = {job: (tuple(tasks[i] for i in range(len(tasks)))
                      if sorted(tasks) == list(range(len(tasks))) else dict(sorted(tasks.items())))
                for job, tasks in jobs.items()}
    return training, evaluator, MASTER in cluster


def _check_task(task, cluster: Mapping) -> tuple[str, int, bool]:
    """(task type, index, whether `master` was renamed) of the `task` entry."""
    if not isinstance(task, dict) or "type" not in task:
        _fail("has no 'task'; add \"task\": {\"type\": \"worker\", \"index\": N}")
    if "index" not in task:
        # TensorFlow's resolver would take the task id as None and fail with a
        # traceback ("you must also specify task_type and task_id").
        _fail(f"task {task!r} has no 'index'; add \"index\": N (0 for the chief and the "
              "evaluator)")
    task_type, index = task.get("type"), task.get("index")
    if task_type not in JOBS and task_type != MASTER:
        _fail(f"task type {task_type!r} is not one of {', '.join(JOBS)} (or master, the chief)")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        _fail(f"task index {index!r} must be a non-negative integer")
    job = CHIEF if task_type == MASTER else task_type
    named = repr(task_type) if job == task_type else f"{task_type!r} (the chief)"
    tasks = cluster.get(job)
    if job == EVALUATOR:
        if index != 0:
            _fail(f"task index {index} for the evaluator; there is one evaluator, index 0")
    elif tasks is None:
        _fail(f"task type {named} has no job in the cluster ({', '.join(cluster)})")
    elif isinstance(tasks, Mapping):
        if index not in tasks:
            _fail(f"task index {index} is not in job {job!r}, which lists task(s) "
                  f"{', '.join(map(str, tasks))}")
    elif index >= len(tasks):
        _fail(f"task index {index} is out of range: job {job!r} has "
              f"{len(tasks)} task(s), indices 0..{len(tasks) - 1}")
    return job, index, job != task_type


def parse(text: Optional[str], *, lookup: Resolver = resolve_hosts) -> Role:
    """Parses and checks a `TF_CONFIG` value; empty or None means no cluster.

    `lookup`: the name lookup of the duplicate-address check (tests give their own).
    """
    if text is None or not text:
        return Role()
    if not text.strip():
        # TensorFlow reads an empty TF_CONFIG as none, but a blank one as JSON
        # (a JSONDecodeError traceback from inside the strategy).
        _fail(f"is blank ({text!r}); unset it (no cluster) or give the cluster as JSON")
    config = load_json(text, "TF_CONFIG")
    if not isinstance(config, dict):
        _fail("must be a JSON object with 'cluster' and 'task'")
    rpc_layer = config.get("rpc_layer", "grpc")
    if rpc_layer not in RPC_LAYERS:
        _fail(f"has rpc_layer {rpc_layer!r}, which TensorFlow serves no cluster over; write "
              f"{' or '.join(map(repr, RPC_LAYERS))}, or leave it out")
    cluster, evaluator, renamed_job = _read_cluster(config.get("cluster"), lookup)
    task_type, index, renamed_task = _check_task(config.get("task"), cluster)
    if renamed_job or renamed_task:
        logger.info("TF_CONFIG calls the chief 'master' (AI Platform's name for it); "
                    "read as 'chief'")
    return Role(task_type=task_type, task_index=index, cluster=cluster,
                evaluator_address=evaluator)


#: The `rpc_layer` values TensorFlow 2.21 has a server for (its only server factory is gRPC).
RPC_LAYERS = ("grpc",)


def load_json(text: str, name: str = "TF_CONFIG"):
    """`json.loads(text)`, every way it fails (deep nesting too) one `TFConfigError` line."""
    try:
        return platforms.load_json(text, name)
    except platforms.PlatformEnvError as error:
        raise TFConfigError(str(error)) from None


def renamed_master(text: Optional[str]) -> bool:
    """Whether a `TF_CONFIG` value says `master`, which TensorFlow refuses and
    `parse` reads as `chief`: then TensorFlow must be handed `tf_config_for`'s."""
    try:
        config = json.loads(text or "{}")
    except json.JSONDecodeError:
        return False
    if not isinstance(config, dict):
        return False
    cluster, task = config.get("cluster"), config.get("task")
    return ((isinstance(cluster, dict) and MASTER in cluster)
            or (isinstance(task, dict) and task.get("type") == MASTER))


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Where this process's cluster came from, and what TensorFlow must read.

    Attributes:
      source: `tf_config`, `vertex`, `jobset` (`launch.platforms.SOURCES`),
        or None: no cluster.
      role: this process's role.
      tf_config: the TF_CONFIG value TensorFlow must read (None outside a
        cluster): `$TF_CONFIG` itself where it needs no change.
      rewritten: `tf_config` is not `$TF_CONFIG` (built from a platform's
        variables, or `master` renamed): `adopt` sets it for TensorFlow.
    """

    source: Optional[str]
    role: Role
    tf_config: Optional[str] = None
    rewritten: bool = False

    def describe(self, limit: int = 8) -> str:
        """The start-up line: which source, which task, which peers (the first
        `limit` of them, and how many more)."""
        role = self.role
        if not role.in_cluster:
            return "no cluster: TF_CONFIG is not set and no platform's cluster was found"
        peers = [f"{job}:{i}={address}" for job, tasks in role.cluster.items()
                 for i, address in _indexed(tasks)]
        if role.evaluator_address:
            peers.append(f"evaluator={role.evaluator_address}")
        shown = ", ".join(peers[:limit]) + (f" and {len(peers) - limit} more"
                                            if len(peers) > limit else "")
        where = f" at {role.address}" if role.address else ""
        sparse = " (sparse: only some listed)" if role.is_sparse else ""
        return (f"cluster from {platforms.SOURCE_NAMES[self.source]}: this task is "
                f"{role.name}{where}; {len(peers)} task(s){sparse}: {shown}")


def resolve(environ: Mapping[str, str] = os.environ, source: str = "auto", *,
            lookup: Resolver = resolve_hosts) -> Resolution:
    """This process's cluster from `environ`: `$TF_CONFIG` first, else a
    platform's variables (`launch.platforms` has the sources and precedence).

    `source`: `auto`, or one source only (`tf_config`, `vertex`, `jobset`).
    Any mistake is one `TFConfigError` line.
    """
    try:
        found, text = platforms.find(environ, source)
    except platforms.PlatformEnvError as error:
        raise TFConfigError(str(error)) from None
    try:
        role = parse(text, lookup=lookup)
    except TFConfigError as error:
        if found == "tf_config":
            raise
        raise TFConfigError(f"{error} (the TF_CONFIG built from "
                            f"{platforms.SOURCE_NAMES[found]})") from None
    if not role.in_cluster:
        return Resolution(source=None, role=role)
    rewritten = found != "tf_config" or renamed_master(text)
    if rewritten:
        extras = {k: v for k, v in json.loads(text).items() if k not in ("cluster", "task")}
        text = json.dumps({**extras, "cluster": role.tf_cluster(),
                           "task": {"type": role.task_type, "index": role.task_index}})
    return Resolution(source=found, role=role, tf_config=text, rewritten=rewritten)


def current_role(environ: Mapping[str, str] = os.environ) -> Role:
    """This process's role: from `$TF_CONFIG`, or where a platform writes none,
    from its environment (`resolve`)."""
    return resolve(environ).role


def adopt(environ=os.environ, source: str = "auto") -> Role:
    """The engine's start: `resolve`, log where the cluster came from, and hand
    TensorFlow (whose strategies read `$TF_CONFIG` themselves) the value read.

    A sparse cluster is refused here, in one line: the engine's strategies
    need every task (TensorFlow's would fail later, with a traceback)."""
    resolution = resolve(environ, source)
    if resolution.role.is_sparse:
        raise TFConfigError(
            f"TF_CONFIG lists only some tasks of a job ({resolution.role.describe_cluster()}); "
            "the engine needs every task of the cluster: Kubeflow's enableDynamicWorker writes "
            "such a TF_CONFIG, so set enableDynamicWorker: false")
    if resolution.role.in_cluster:
        logger.info("%s", resolution.describe())
    if resolution.rewritten:
        environ["TF_CONFIG"] = resolution.tf_config
    return resolution.role


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
