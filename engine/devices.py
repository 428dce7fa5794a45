"""Device specs (`gpu:0,gpu:1`, `cpu:0,...,cpu:3`) and logical CPU devices.

TensorFlow lets a process split its CPU into logical devices only before the
runtime initializes, and only once. That is how every multi-device run on a
CPU-only machine works, so this module is the single place that does it and
the single place that says, in one line, when it can no longer be done.
"""

from __future__ import annotations

import re
from typing import Sequence

import tensorflow as tf

from engine.errors import ConfigError

_DEVICE_RE = re.compile(r"^(cpu|gpu):(\d+)$")


def parse_devices(spec: str) -> list[str]:
    """Parses `gpu:0,gpu:1` into canonical names `["/gpu:0", "/gpu:1"]`.

    An empty spec means "every GPU, or cpu:0 when there is none".
    """
    spec = spec.strip()
    if not spec:
        gpus = tf.config.list_physical_devices("GPU")
        return [f"/gpu:{i}" for i in range(len(gpus))] or ["/cpu:0"]
    names = []
    for item in spec.split(","):
        match = _DEVICE_RE.match(item.strip().lower().lstrip("/"))
        if not match:
            raise ConfigError(
                f"--devices: {item.strip()!r} is not a device; write a comma-separated "
                "list of gpu:N or cpu:N, e.g. --devices=gpu:0,gpu:1 or --devices=cpu:0,cpu:1"
            )
        names.append(f"/{match.group(1)}:{int(match.group(2))}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"--devices: {', '.join(d.lstrip('/') for d in duplicates)} listed more than once; "
            "name each device once"
        )
    return names


def device_kind(name: str) -> str:
    """"gpu" or "cpu" for a canonical device name."""
    return name.lstrip("/").split(":")[0]


def ensure_logical_cpus(count: int) -> None:
    """Makes at least `count` CPU devices visible, splitting the physical CPU
    into logical devices if needed.

    Safe to call repeatedly; fails with a `ConfigError` if TensorFlow already
    initialized its devices with fewer CPUs (a process-lifetime limitation).
    """
    cpus = tf.config.list_physical_devices("CPU")
    if count <= len(cpus):
        return
    configured = tf.config.get_logical_device_configuration(cpus[0])
    if configured is not None and len(configured) >= count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
        )
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        raise ConfigError(
            f"--devices asks for {count} CPU devices but TensorFlow already started with "
            f"{have}; logical CPU devices must be configured before anything else runs "
            "(start a new process)"
        ) from None


def prepare_devices(names: Sequence[str]) -> None:
    """Checks that every named device exists, creating logical CPUs on demand.

    Must run before any other TensorFlow work in the process.
    """
    cpu_ids = [int(n.split(":")[1]) for n in names if device_kind(n) == "cpu"]
    gpu_ids = [int(n.split(":")[1]) for n in names if device_kind(n) == "gpu"]
    if gpu_ids:
        num_gpus = len(tf.config.list_physical_devices("GPU"))
        missing = [i for i in gpu_ids if i >= num_gpus]
        if missing:
            raise ConfigError(
                f"--devices: gpu:{missing[0]} does not exist; this machine has {num_gpus} GPU(s)"
                + (
                    f" (gpu:0..gpu:{num_gpus - 1})"
                    if num_gpus
                    else "; use cpu:N devices, e.g. --devices=cpu:0,cpu:1"
                )
            )
    if cpu_ids:
        ensure_logical_cpus(max(cpu_ids) + 1)
