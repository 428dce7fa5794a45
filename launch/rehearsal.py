"""`bin/launch --spec=FILE`: a platform's job spec rehearsed on this machine.

Each pod of the spec becomes a local process of one `Launcher` (the same
supervisor as `bin/launch --num_workers`), with the environment the platform
would give that pod (`launch.specs`), moved onto loopback:

- TFJob: the operator's `TF_CONFIG` (every replica type in `cluster`,
  `environment: cloud`), each task's address a free `127.0.0.1` port;
- Vertex AI: its `CLUSTER_SPEC` (no `TF_CONFIG`, so the engine builds it
  from that) on free ports, and the `AIP_*` directories under the local dir;
- JobSet: `JOB_COMPLETION_INDEX`, `HOSTNAME`, the downward-API variables and
  the spec's `TFLOOP_*`, and a `TF_CONFIG` with loopback ports beside them:
  the pods' DNS names and shared port 2222 cannot exist on one machine, so
  the `TF_CONFIG` the engine would build from those variables
  (`platforms.jobset_tf_config`, run here on them) is handed over with each
  address moved to loopback.

The container's command and args run with this Python (`tfloop-train` and
`bin/train` are `bin/train`; no command is the image's entry point,
`tfloop-train`), `--model_dir` moved to a local folder, the user's extra
flags after them. `--replicas=worker:2` shrinks a spec. Restarts follow the
spec's policy as far as one local supervisor can (`max_restarts` from the
TFJob's `backoffLimit`, the JobSet's `maxRestarts`, Vertex's
`restartJobOnWorkerRestart`), and every restart starts every task again,
which is where the survivors' retryable exits lead on a platform too. After a
task fails, the others get `peer_exit_wait_s` to exit on their own, and their
statuses are reported: those are what the platform would act on.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Optional, Sequence

from tfloop.launch import launcher, platforms, specs
from tfloop.launch.tf_config import CHIEF, EVALUATOR, PS, WORKER, Role

#: Seconds the other tasks get to exit on their own after one fails.
PEER_EXIT_WAIT_S = 30.0
#: The image's entry point (Dockerfile's ENTRYPOINT), run where a spec gives no command.
ENTRY_POINT = "tfloop-train"
#: The image's init (PID 1, Dockerfile): a rehearsal runs what follows its `--`.
INITS = ("tini", "/usr/bin/tini")
MODEL_DIR_FLAG = "--model_dir"
#: Every variable some platform sets: a task gets only those its platform would
#: give it, none inherited from the shell that started the rehearsal.
PLATFORM_VARIABLES = ("TF_CONFIG", "CLUSTER_SPEC", "JOB_COMPLETION_INDEX", "JOBSET_NAME",
                      "REPLICATED_JOB_NAME", "JOB_INDEX", "TFLOOP_NUM_WORKERS", "TFLOOP_CHIEF",
                      "TFLOOP_NUM_PS", "TFLOOP_EVALUATOR", "TFLOOP_PORT", "TFLOOP_SUBDOMAIN",
                      "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")
#: The JobSet contract's variables (`platforms.jobset_tf_config`), kept equal to the replicas.
_JOBSET_COUNTS = {"TFLOOP_NUM_WORKERS": WORKER, "TFLOOP_CHIEF": CHIEF, "TFLOOP_NUM_PS": PS,
                  "TFLOOP_EVALUATOR": EVALUATOR}


def parse_replicas(values: Sequence[str]) -> dict[str, int]:
    """`["worker:2", "evaluator:0"]` -> `{"worker": 2, "evaluator": 0}`."""
    replicas = {}
    for value in values:
        task_type, _, count = value.partition(":")
        if not count.isdecimal():
            raise specs.SpecError(f"--replicas={value}: give TYPE:COUNT, e.g. worker:2")
        replicas[task_type.strip().lower()] = int(count)
    return replicas


def local_command(spec: specs.Spec, *, python: str, bin_dir: str, model_dir: str,
                  extra_args: Sequence[str] = ()) -> tuple[str, ...]:
    """The container's command as a local process: this Python running `bin/`'s
    program, `--model_dir` moved to `model_dir`, then `extra_args`."""
    words = list(spec.command) or [ENTRY_POINT]
    if words[0] in INITS and "--" in words:
        words = words[words.index("--") + 1:] or [ENTRY_POINT]
    program, args = words[0], words[1:]
    name = os.path.basename(program)
    if program.startswith("tfloop-"):
        name = program[len("tfloop-"):].replace("-", "_")
    elif not program.startswith("bin/"):
        raise specs.SpecError(f"{spec.path}: the container runs {program!r}; a rehearsal "
                              f"runs the image's tfloop-* programs (or bin/*)")
    path = os.path.join(bin_dir, name)
    if not os.path.isfile(path):
        raise specs.SpecError(f"{spec.path}: the container runs {program!r}, which is no "
                              f"program of {bin_dir}")
    local, skip = [], False
    for word in args:
        if skip:
            skip = False
            continue
        if word == MODEL_DIR_FLAG:
            skip = True
            continue
        if not word.startswith(MODEL_DIR_FLAG + "="):
            local.append(word)
    return (python, path, *local, f"{MODEL_DIR_FLAG}={model_dir}", *extra_args)


def spec_model_dir(spec: specs.Spec) -> Optional[str]:
    """The `--model_dir` the spec's command gives (None: not given)."""
    words = list(spec.command)
    for i, word in enumerate(words):
        if word.startswith(MODEL_DIR_FLAG + "="):
            return word.partition("=")[2]
        if word == MODEL_DIR_FLAG and i + 1 < len(words):
            return words[i + 1]
    return None


def _loopback(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("localhost", "127.0.0.1") else address


class Environments:
    """The Launcher's `environments` hook for one spec: each task's variables at
    each start, on that start's loopback ports."""

    def __init__(self, spec: specs.Spec, model_dir: str):
        self.spec = spec
        self.model_dir = model_dir

    def __call__(self, tasks: list[Role], cluster: Mapping[str, Sequence[str]]) -> dict:
        # TFJob lists the evaluator in `cluster` too: it gets a port of its own
        # (nothing listens there: it serves nothing).
        extra = {EVALUATOR: [f"127.0.0.1:{launcher.pick_free_ports(1)[0]}"]}
        addresses = {job: [_loopback(a) for a in found] for job, found in cluster.items()}
        addresses.update({job: found for job, found in extra.items() if job not in addresses})
        unset = dict.fromkeys(PLATFORM_VARIABLES)
        return {task.label: {**unset, **self.spec.env, **self._platform_env(task, addresses)}
                for task in tasks}

    def _platform_env(self, task: Role, addresses: Mapping[str, Sequence[str]]) -> dict:
        spec = self.spec
        address = lambda task_type, index: addresses[task_type][index]  # noqa: E731
        if spec.platform == specs.TFJOB:
            return specs.environment(spec, task, address)
        if spec.platform == specs.VERTEX:
            env = specs.environment(spec, task, address, vertex_tf_config=False)
            return {**env, **self._aip_dirs(env)}
        env = specs.environment(spec, task)
        try:
            built = platforms.jobset_tf_config(env)
        except platforms.PlatformEnvError as error:
            raise specs.SpecError(f"{spec.path}: {error}") from None
        built["cluster"] = {job: [address(job, i) for i in range(len(found))]
                            for job, found in built["cluster"].items()}
        return {**env, "TF_CONFIG": json.dumps(built)}

    def _aip_dirs(self, env: Mapping[str, str]) -> dict:
        """Vertex's `AIP_*` folders, under the local dir (the checkpoint dir is
        `--model_dir` where the spec makes them one)."""
        remote = (spec_model_dir(self.spec) or "").rstrip("/")
        moved = {}
        for name, sub in (("AIP_MODEL_DIR", "model"), ("AIP_CHECKPOINT_DIR", "checkpoints"),
                          ("AIP_TENSORBOARD_LOG_DIR", "logs")):
            if name in env:
                moved[name] = (self.model_dir if env[name].rstrip("/") == remote
                               else os.path.join(self.model_dir + "-aip", sub)) + "/"
        return moved


def prepare(spec: specs.Spec, *, python: str, bin_dir: str, model_dir: str,
            replicas: Optional[Mapping[str, int]] = None, extra_args: Sequence[str] = (),
            max_restarts: Optional[int] = None, grace_period_s: Optional[float] = None,
            peer_exit_wait_s: float = PEER_EXIT_WAIT_S,
            **options) -> tuple[launcher.LaunchConfig, Environments]:
    """The `LaunchConfig` and `environments` hook that rehearse `spec` locally.

    `max_restarts`, `grace_period_s`: None takes the spec's. `options`: the
    other `LaunchConfig` fields (`evaluator_timeout_s`, `gpus_per_task`, ...).
    """
    if replicas:
        spec = spec.with_replicas(replicas)
    if spec.platform == specs.JOBSET:
        spec = _jobset_counts(spec)
    counts = spec.replicas
    if not counts.get(WORKER):
        raise specs.SpecError(f"{spec.path}: a rehearsal needs at least one worker "
                              "(--replicas=worker:N)")
    config = launcher.LaunchConfig(
        command=local_command(spec, python=python, bin_dir=bin_dir, model_dir=model_dir,
                              extra_args=extra_args),
        num_workers=counts[WORKER], chief=bool(counts.get(CHIEF)), num_ps=counts.get(PS, 0),
        evaluator=bool(counts.get(EVALUATOR)),
        max_restarts=spec.max_restarts if max_restarts is None else max_restarts,
        grace_period_s=(spec.grace_period_s or 10.0) if grace_period_s is None
        else grace_period_s, peer_exit_wait_s=peer_exit_wait_s, **options)
    return config, Environments(spec, model_dir)


def _jobset_counts(spec: specs.Spec) -> specs.Spec:
    """The spec's `TFLOOP_*` counts made equal to its (maybe shrunk) replicas."""
    env = dict(spec.env)
    for name, task_type in _JOBSET_COUNTS.items():
        if name in env or spec.replicas.get(task_type):
            env[name] = str(spec.replicas.get(task_type, 0))
    return dataclasses.replace(spec, env=env)


def describe(spec: specs.Spec, config: launcher.LaunchConfig) -> str:
    """The rehearsal's first line."""
    tasks = ", ".join(f"{t}:{n}" for t, n in
                      (("chief", int(config.chief)), ("worker", config.num_workers),
                       ("ps", config.num_ps), ("evaluator", int(config.evaluator))) if n)
    return (f"rehearsing {spec.path} ({spec.platform} {spec.name!r}) on loopback: {tasks}; "
            f"up to {config.max_restarts} restart(s) of every task")
