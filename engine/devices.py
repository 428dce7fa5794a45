"""Device specs (`gpu:0,gpu:1`, `cpu:0,...,cpu:3`), logical CPU and GPU devices.

TensorFlow lets a process split its CPU into logical devices only before the
runtime initializes, and only once. That is how every multi-device run on a
CPU-only machine works, so this module is the single place that does it and
the single place that says, in one line, when it can no longer be done. The
size of TF's intra-op thread pool is fixed at the same moment, so it is set
here too (`configure_threads`). The same holds for splitting a GPU into
virtual GPUs (`--virtual_gpus`, `split_gpus`), which lets one GPU run several
replicas and test every collective except NCCL (which needs one physical GPU
per replica; `collectives.gpus` tells the collectives which devices share one).

`exact_float32()` turns TF32 off for comparisons of float32 results: on
Ampere and later GPUs TensorFlow runs float32 matmuls and convolutions in
TF32 by default (10-bit mantissa), which differs from one device to the next
far more than the 1e-5 the equivalence checks allow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from typing import Iterator, Optional, Sequence

import tensorflow as tf

from tfloop.collectives import device_names, gpus
from tfloop.engine.errors import ConfigError

logger = logging.getLogger(__name__)


def parse_devices(spec: str, *, virtual_gpus: int = 0) -> list[str]:
    """Parses `gpu:0,gpu:1` into canonical names `["/gpu:0", "/gpu:1"]`;
    TensorFlow's own spellings of this process's devices (`/device:GPU:0`,
    `/job:localhost/replica:0/task:0/device:GPU:0`) are accepted too.

    An empty spec means "every GPU, or cpu:0 when there is none": every
    logical GPU, `virtual_gpus` per physical GPU when that is set.
    """
    spec = spec.strip()
    if not spec:
        count = (len(tf.config.list_physical_devices("GPU")) * virtual_gpus if virtual_gpus
                 else gpus.logical_gpu_count())
        return [f"/gpu:{i}" for i in range(count)] or ["/cpu:0"]
    names = []
    for item in spec.split(","):
        name = device_names.canonical(item)
        if name is None:
            raise ConfigError(
                f"--devices: {item.strip()!r} is not a device of this process; write a "
                "comma-separated list of gpu:N or cpu:N (or TensorFlow's /device:GPU:N), e.g. "
                "--devices=gpu:0,gpu:1 or --devices=cpu:0,cpu:1"
            )
        names.append(name)
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


#: Memory of each virtual GPU when the GPUs' own cannot be read (nvidia-smi).
FALLBACK_VIRTUAL_GPU_MB = 2048


def virtual_gpu_memory_mb(count: int, total_mb: Optional[int]) -> int:
    """Memory limit of each of `count` virtual GPUs on a GPU of `total_mb`:
    an equal share of 90% of it (the rest stays for CUDA's own context), or
    `FALLBACK_VIRTUAL_GPU_MB` when the size is unknown."""
    if not total_mb:
        return FALLBACK_VIRTUAL_GPU_MB
    return max(1, int(total_mb * 0.9) // count)


def _smallest_gpu_mb() -> Optional[int]:
    """The memory of the smallest GPU nvidia-smi lists, in MiB (None: unknown).
    Read without TensorFlow, which could only tell after it has started."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return min(int(line) for line in out.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def split_gpus(count: int) -> int:
    """`--virtual_gpus=count`: splits every GPU into `count` logical GPUs
    (`tf.config.set_logical_device_configuration`); returns each one's
    memory limit in MiB. Must run before TensorFlow initializes.

    Raises:
      ConfigError: no GPU, or TensorFlow already started with another layout.
    """
    physical = tf.config.list_physical_devices("GPU")
    if not physical:
        raise ConfigError(
            f"--virtual_gpus={count} splits each GPU, but TensorFlow sees no GPU on this "
            "machine; drop it (on CPUs, --devices=cpu:0,cpu:1,... makes logical CPU devices)")
    memory_mb = virtual_gpu_memory_mb(count, _smallest_gpu_mb())
    layout = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * count
    try:
        for gpu in physical:
            tf.config.set_logical_device_configuration(gpu, layout)
    except RuntimeError:
        raise ConfigError(
            f"--virtual_gpus={count} comes too late: TensorFlow already started with "
            f"{len(tf.config.list_logical_devices('GPU'))} GPU(s); virtual GPUs must be "
            "configured before anything else runs (start a new process)") from None
    logger.info("--virtual_gpus=%d: each of %d GPU(s) split into %d logical GPUs of %d MiB "
                "(NCCL cannot run on them; auto picks ring)", count, len(physical), count,
                memory_mb)
    return memory_mb


def prepare_devices(names: Sequence[str], *, virtual_gpus: int = 0) -> None:
    """Checks that every named device exists, creating logical CPUs on demand
    and splitting the GPUs when `virtual_gpus` is set.

    Must run before any other TensorFlow work in the process.
    """
    if virtual_gpus:
        split_gpus(virtual_gpus)
    cpu_ids = [device_names.index(n) for n in names if device_names.kind(n) == "cpu"]
    gpu_ids = [device_names.index(n) for n in names if device_names.kind(n) == "gpu"]
    if gpu_ids:
        num_gpus = gpus.logical_gpu_count()
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


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """TF32 off inside the block, restored after: float32 matmuls and
    convolutions in full float32 on GPUs (a no-op on CPUs), for checks that
    compare replicas with one device."""
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(previous)
