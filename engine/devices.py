"""Device specs (`gpu:0,gpu:1`, `cpu:0,...,cpu:3`) and logical CPU devices.

TensorFlow lets a process split its CPU into logical devices only before the
runtime initializes, and only once. That is how every multi-device run on a
CPU-only machine works, so this module is the single place that does it and
the single place that says, in one line, when it can no longer be done. The
size of TF's intra-op thread pool is fixed at the same moment, so it is set
here too (`configure_threads`).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import tensorflow as tf

from tfloop.collectives import device_names
from tfloop.engine.errors import ConfigError


#: The most CPU devices `--devices` may name (`cpu:0..cpu:63`). Each logical
#: CPU is a whole TensorFlow device (its executor, allocator and a replica's
#: copy of every variable) sharing the same cores: they exist to test
#: multi-device code on one machine, which 64 covers many times over, while
#: `cpu:100000` spent minutes and gigabytes creating 100001 of them.
MAX_LOGICAL_CPUS = 64


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
        name = device_names.canonical(item)
        if name is None:
            raise ConfigError(
                f"--devices: {item.strip()!r} is not a device; write a comma-separated "
                "list of gpu:N or cpu:N, e.g. --devices=gpu:0,gpu:1 or --devices=cpu:0,cpu:1"
            )
        names.append(name)
    too_high = [n for n in names if device_names.kind(n) == "cpu"
                and device_names.index(n) >= MAX_LOGICAL_CPUS]
    if too_high:
        raise ConfigError(
            f"--devices: {device_names.short_list(too_high[:1])} is beyond the "
            f"{MAX_LOGICAL_CPUS} logical CPU devices one process may create "
            f"(cpu:0..cpu:{MAX_LOGICAL_CPUS - 1}); name fewer CPU devices")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"--devices: {device_names.short_list(duplicates, ', ')} listed more than once; "
            "name each device once"
        )
    return names


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
    cpu_ids = [device_names.index(n) for n in names if device_names.kind(n) == "cpu"]
    gpu_ids = [device_names.index(n) for n in names if device_names.kind(n) == "gpu"]
    if gpu_ids:
        num_gpus = len(tf.config.list_physical_devices("GPU"))
        missing = [i for i in gpu_ids if i >= num_gpus]
        if missing and not num_gpus:
            raise ConfigError(
                f"--devices: gpu:{missing[0]} does not exist: TensorFlow sees no GPU on this "
                "machine; for an NVIDIA GPU install GPU support with pip install '.[gpu]' "
                "(TensorFlow's CUDA wheels, Linux) and check that nvidia-smi lists it, or use "
                "cpu:N devices, e.g. --devices=cpu:0,cpu:1")
        if missing:
            raise ConfigError(
                f"--devices: gpu:{missing[0]} does not exist; this machine has {num_gpus} GPU(s) "
                f"(gpu:0..gpu:{num_gpus - 1})")
    if cpu_ids:
        ensure_logical_cpus(max(cpu_ids) + 1)


#: `configure_threads`: TF's own default (one intra-op thread per core).
TF_DEFAULT_THREADS = 0
#: `configure_threads`: one core's share per CPU replica when there are several.
AUTO_THREADS = -1


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def intra_op_threads_for(names: Sequence[str], requested: int = AUTO_THREADS) -> Optional[int]:
    """The intra-op pool size to use, or None for TensorFlow's default.

    Auto gives each CPU replica its share of the cores: the replicas already
    run side by side (one inter-op task each), so also splitting every op
    across all cores makes them hand work between threads for nothing. On
    this 2-core machine with 4 logical CPUs (bin/bench_collectives) a 256 KiB
    reduce-to-one-device all-reduce took 76 us with one intra-op thread
    against 180-360 us with TF's default of two, 1 MiB 154 us against
    190-340 us, and the mlp trained 26k examples/s against 19k (docs/collectives.md,
    docs/performance.md). One CPU device, or GPUs, keep TF's default.
    """
    if requested > 0:
        return requested
    if requested == TF_DEFAULT_THREADS:
        return None
    cpu_replicas = sum(1 for n in names if device_names.kind(n) == "cpu")
    if cpu_replicas < 2:
        return None
    return max(1, usable_cores() // cpu_replicas)


def configure_threads(names: Sequence[str], requested: int = AUTO_THREADS) -> Optional[int]:
    """Sets TF's intra-op pool for `names` (see `intra_op_threads_for`);
    returns the size in force when it is not TF's default.

    Like logical devices, this only works before TensorFlow initializes: an
    explicit size that comes too late is a `ConfigError`; the automatic one
    quietly leaves TF's default (tests that share one process do that).
    """
    threads = intra_op_threads_for(names, requested)
    current = tf.config.threading.get_intra_op_parallelism_threads()
    if threads is None or threads == current:
        return current or None
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:
        if requested > 0:
            raise ConfigError(
                f"--intra_op_threads={requested} comes too late: TensorFlow already started in "
                "this process with its thread pools sized; set it before anything else runs "
                "(start a new process)"
            ) from None
        return current or None
    return threads
