"""`bin/gpu_check`: the checks a GPU host runs first, and their report.

    bin/gpu_check --output_dir=runs/gpu_check

On a GPU host (under about 30 minutes, most of it a first PTX JIT on GPUs
TensorFlow has no native kernels for):

  1. environment            TensorFlow's CUDA build, the GPUs it registers against
                            nvidia-smi's, a matmul on each GPU
  2. training_*             one GPU trains: plain, --jit_compile, mixed_float16;
                            the loss falls
  3. equivalence_gpus       2+ GPUs: every collective (nccl too) gives one GPU's
                            weights, TF32 off, relative difference < 1e-5
     busbw                  2+ GPUs: nccl, ring, hierarchical_copy at 1M and 64M
  4. equivalence_virtual_gpus  exactly one GPU: the same across 2 virtual GPUs,
                            every collective but nccl
     nccl_refused           --collective=nccl on virtual GPUs: one line
  5. multi_worker           2+ GPUs: bin/launch --num_workers=2 --gpus_per_task=1,
                            and the implementation each worker's start-up line names
  6. gpu_tests              in a checkout: the suite's `@pytest.mark.gpu` tests,
                            GPUs visible (the CPU suite deselects them)

A check that does not apply (one GPU: no NCCL busbw) is skipped with the
reason. Without a GPU the same checks run on logical CPUs (the CPU dry run,
about a minute): cpu:0..cpu:3 stand in for GPUs, NCCL only as its refusal,
the gpu tests only collected.

TensorFlow loads in `main`, after `check_request`: a mistake in the request
is one line at once, not after the seconds TensorFlow's import takes
(`bin/gpu_check` calls `check_request` before anything else).

Each check runs in its own process (`bench.gpu_checks`), with a timeout, its
log and runs in `output_dir/checks/<name>/`; the report (`report.json`,
`report.md`) is rewritten after each (`bench.check_report`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Optional

from tfloop.bench.check_report import FAIL, SKIPPED, CheckResult, Report
from tfloop.engine.errors import ConfigError

Progress = Callable[[str], None]

ALL_COLLECTIVES = ("nccl", "ring", "hierarchical_copy", "reduce_to_one_device", "auto")
NON_NCCL = tuple(c for c in ALL_COLLECTIVES if c != "nccl")
NEEDS_A_GPU = "nccl needs a GPU: its refusal is checked instead (nccl_refused)"


@dataclasses.dataclass(frozen=True)
class Check:
    """One step of the plan: the body `bench.gpu_checks.BODIES[body]` with
    `params`, in a process of its own, or skipped with `skip` as the reason."""

    name: str
    title: str
    body: str
    params: dict = dataclasses.field(default_factory=dict)
    timeout: float = 600.0
    skip: str = ""


def plan(*, gpus: int, bin_dir: str, timeout: float = 0.0) -> list[Check]:
    """The checks for a machine with `gpus` physical GPUs (0: the CPU dry run).

    `timeout` (seconds, 0: each check's own) bounds every check's process.
    """
    dry = gpus == 0
    own = (lambda gpu_s, cpu_s: timeout or (cpu_s if dry else gpu_s))
    one = ["/cpu:0"] if dry else ["/gpu:0"]
    many = ([f"/cpu:{i}" for i in range(4)] if dry
            else [f"/gpu:{i}" for i in range(gpus)])  # all: fewer could not be made visible again
    pair = ["/cpu:0", "/cpu:1"] if dry else ["/gpu:0", "/gpu:1"]
    models = ["mlp"] if dry else ["mlp", "cnn"]
    steps, steps_per_loop = (20, 5) if dry else (200, 50)
    checks = [Check("environment", "TensorFlow sees the GPUs and the CUDA libraries",
                    "environment", {}, own(900, 120))]
    for name, flags in (("plain", {}), ("xla", {"jit_compile": True}),
                        ("mixed_float16", {"mixed_precision": "mixed_float16"})):
        checks.append(Check(
            f"training_{name}", f"one device trains, {name}: the loss falls", "training",
            {"devices": one, "steps": steps, "steps_per_loop": steps_per_loop,
             "variant": flags}, own(600, 120)))
    several = "" if dry or gpus >= 2 else (
        f"needs 2+ physical GPUs, this machine has {gpus} (equivalence_virtual_gpus runs instead)")
    checks.append(Check(
        "equivalence_gpus", "every collective gives one device's weights (TF32 off)",
        "equivalence", {"devices": many, "models": models,
                        "collectives": NON_NCCL if dry else ALL_COLLECTIVES},
        own(900, 150), several))
    checks.append(Check(
        "busbw", "all-reduce bus bandwidth (collective benchmark)", "busbw",
        {"devices": many, "collectives": ("ring", "hierarchical_copy") if dry else
         ("nccl", "ring", "hierarchical_copy"), "sizes": "4K,64K" if dry else "1M,64M",
         "not_run": NEEDS_A_GPU if dry else ""}, own(600, 120), several))
    checks.append(Check(
        "equivalence_virtual_gpus", "2 virtual GPUs on one GPU give one device's weights "
        "(every collective but nccl)", "equivalence",
        {"devices": pair, "models": models, "collectives": NON_NCCL,
         "virtual_gpus": 0 if dry else 2}, own(900, 150),
        "" if dry or gpus == 1 else f"runs on exactly one GPU; this machine has {gpus} "
        "(equivalence_gpus covers them)"))
    checks.append(Check(
        "nccl_refused", "--collective=nccl where NCCL cannot run is one line", "nccl_refused",
        {"devices": pair, "virtual_gpus": 0 if dry else 2}, own(300, 120)))
    checks.append(Check(
        "multi_worker", "two workers through bin/launch (one GPU each): which collective ran",
        "multi_worker", {"devices": one, "bin_dir": bin_dir, "steps": 20 if dry else 100,
                         "gpus_per_task": 0 if dry else 1, "expected": "ring" if dry else "nccl",
                         "timeout": own(900, 200) - 10},
        own(900, 200), "" if dry or gpus >= 2 else
        f"needs 2 GPUs, one per worker (NCCL runs one rank per GPU); this machine has {gpus}"))
    checks.append(Check(
        "gpu_tests", "the suite's tests marked gpu (pytest -m gpu)", "gpu_tests",
        {"repo": os.path.dirname(os.path.abspath(bin_dir)), "timeout": own(900, 200) - 10},
        own(900, 200)))
    return checks


def check_output_dir(output_dir: str) -> str:
    """Creates `output_dir` (absolute); a file there, or a folder that cannot
    be written, is one line."""
    if not output_dir:
        raise ConfigError("--output_dir is empty; name a folder for the report, "
                          "e.g. --output_dir=runs/gpu_check")
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--output_dir={output_dir} is a file; name a folder for the report")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--output_dir={output_dir} cannot be created: "
                          f"{error.strerror or error}; name a writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--output_dir={output_dir} is not writable; name a writable folder")
    return path


def child_environment() -> dict[str, str]:
    """Quiet TensorFlow, unbuffered output, and a driver cache that holds
    TensorFlow's PTX-compiled kernels (the 256 MiB default does not)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.setdefault("CUDA_CACHE_MAXSIZE", str(4 << 30))
    return env


def run_child(command: list[str], *, timeout: float, log_path: str,
              result_path: str) -> tuple[str, str, dict]:
    """Runs one check's process; its outcome, or a failure saying how it ended."""
    if os.path.exists(result_path):
        os.remove(result_path)
    with open(log_path, "w") as log:
        try:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=child_environment(), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return FAIL, f"timed out after {timeout:g} s (log: {log_path})", {}
    if os.path.exists(result_path):
        with open(result_path) as file:
            outcome = json.load(file)
        return outcome["status"], outcome["reason"], outcome["numbers"]
    with open(log_path, errors="replace") as file:
        lines = [line.strip() for line in file if line.strip()]
    last = lines[-1] if lines else "no output"
    return FAIL, f"the check's process ended with status {done.returncode}: {last}", {}


def machine(gpus: int) -> dict[str, Any]:
    import tensorflow as tf

    return {"host": socket.gethostname(), "python": sys.version.split()[0],
            "tensorflow": tf.__version__, "tensorflow_gpus": gpus,
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}


def check_request(*, output_dir: str, timeout: float = 0.0,
                  only: Optional[list[str]] = None) -> str:
    """The request's refusals, each one line, before TensorFlow loads; the
    output folder (created, absolute). The check names are the same on any
    machine (the plan skips, never drops, what does not apply)."""
    if not timeout >= 0:
        raise ConfigError(f"--check_timeout={timeout:g} must be a number of seconds >= 0 "
                          "(0: each check's own)")
    output_dir = check_output_dir(output_dir)
    if only is not None:
        names = [c.name for c in plan(gpus=0, bin_dir="")]
        unknown = sorted(set(only) - set(names))
        if unknown:  # an empty name too: `--checks=,` is not "every check"
            named = ", ".join(name or "''" for name in unknown)
            raise ConfigError(f"--checks: {named} is not a check; choose from "
                              f"{', '.join(names)}")
    return output_dir


def main(*, output_dir: str, bin_dir: str, timeout: float = 0.0,
         only: Optional[list[str]] = None, progress: Progress = print) -> Report:
    """What `bin/gpu_check` does: plans, runs each check, writes the report.

    `only`: the names of the checks to run (the others are left out).
    Returns the report; `report.failed()` decides the exit status.
    """
    output_dir = check_request(output_dir=output_dir, timeout=timeout, only=only)
    import tensorflow as tf

    from tfloop.engine.runtime import devices as engine_devices

    gpus = len(tf.config.list_physical_devices("GPU"))
    checks = plan(gpus=gpus, bin_dir=bin_dir, timeout=timeout)
    if only is not None:
        checks = [c for c in checks if c.name in only]
    if not gpus:
        reason = engine_devices.missing_gpu_reason() or (
            "TensorFlow registers none" + ("" if shutil.which("nvidia-smi")
                                           else " and there is no nvidia-smi"))
        progress(f"no GPU visible ({reason}): running the CPU dry run of the same checks on "
                 "cpu:0..cpu:3")
    report = Report(output_dir, mode="cpu_dry_run" if not gpus else "gpu", machine=machine(gpus))
    progress(f"report: {report.markdown_path} (and {os.path.basename(report.json_path)}), "
             "rewritten after each check")
    for number, check in enumerate(checks, 1):
        head = f"[{number}/{len(checks)}] {check.name}"
        if check.skip:
            report.add(CheckResult(check.name, check.title, SKIPPED, check.skip))
            progress(f"{head}: skipped: {check.skip}")
            continue
        work_dir = os.path.join(output_dir, "checks", check.name)
        shutil.rmtree(work_dir, ignore_errors=True)  # a run left there would be resumed
        os.makedirs(work_dir)
        params = dict(check.params, dry_run=not gpus, work_dir=os.path.join(work_dir, "runs"))
        result_path = os.path.join(work_dir, "result.json")
        command = [sys.executable, "-m", "tfloop.bench.gpu_checks", check.body,
                   json.dumps(params), result_path]
        progress(f"{head}: {check.title} ...")
        start = time.perf_counter()
        status, reason, numbers = run_child(command, timeout=check.timeout,
                                            log_path=os.path.join(work_dir, "log.txt"),
                                            result_path=result_path)
        seconds = time.perf_counter() - start
        report.add(CheckResult(check.name, check.title, status, reason, numbers,
                               round(seconds, 1)))
        progress(f"{head}: {status} ({seconds:.0f} s): {reason}")
    report.finish()
    counts = report.counts()
    progress(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped: "
             f"{report.markdown_path}")
    return report
