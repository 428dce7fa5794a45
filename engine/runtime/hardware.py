"""How much arithmetic the run's devices can do, and how much memory it has used.

`mfu` (model FLOPs utilization, `engine.observe.step_flops`) divides the FLOPs a
loop did by its seconds and by `peak(...)`, the rate the run's devices can
reach in the run's compute dtype:

* **GPUs** known by name: their datasheet's dense rate (no 2:4 sparsity), in
  the dtype the matmuls run in: bfloat16/float16 tensor cores under
  `--mixed_precision`; for float32 the TF32 tensor-core rate where TensorFlow
  runs float32 matmuls in TF32 (its default on Ampere and later), else the
  plain FP32 rate. Summed over the run's local GPUs. Sources, per row below:
  NVIDIA's datasheets (A100: "NVIDIA A100 Tensor Core GPU" datasheet, 2021;
  H100/H200: "NVIDIA H100 Tensor Core GPU" datasheet, 2023, and the H200
  product page; L4: "NVIDIA L4 Tensor Core GPU" datasheet; T4: "NVIDIA T4"
  datasheet; V100: "NVIDIA V100 Tensor Core GPU" datasheet).
* **any other device** (CPUs, an unknown GPU): measured, one chain of
  matmuls per device all at once, in the compute dtype, with the process's
  own threads (`matmul_flops_per_second`): what this machine does as the run
  loads it (about 0.1-1 s, when the first `mfu` is due). A probe on a busy
  machine reads low, so a CPU's peak is the best rate of this machine's
  first `CPU_PROBES` probes, kept on disk in `$TFLOOP_CACHE_DIR` (default
  `~/.cache/tfloop/cpu_peaks.json`) per CPU model, device count, threads and
  dtype; once it holds that many, no run probes again: its start is that much
  shorter, and the mfu of one run compares with another's (the same peak).
  Removing the file measures anew. A CPU's peak in bfloat16
  or float16 is at least its float32 rate (most CPUs convert those dtypes to
  float32 and run slower in them than in float32).

`peak_memory()` is the process's peak host RSS (`resource.getrusage`) and,
with GPUs, TensorFlow's peak allocation on each (`get_memory_info`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import sys
import time
from typing import Optional, Sequence

import tensorflow as tf

from tfloop.collectives import device_names
from tfloop.engine.runtime import files

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Peak:
    """The run's devices' peak rate (FLOP/s, all local devices together) and
    where that number comes from (one phrase, for logs and metrics.json)."""

    flops_per_second: float
    source: str


# name substrings (all must match, lower case) -> dense peak TFLOP/s by kind:
# fp32 (CUDA cores), tf32, bf16 and fp16 (tensor cores). The first match wins,
# so the more specific rows come first.
_T = 1e12
GPU_PEAKS: tuple[tuple[tuple[str, ...], str, dict[str, float]], ...] = (
    (("h200", "nvl"), "H200 NVL", dict(fp32=60 * _T, tf32=417.5 * _T, bf16=835 * _T, fp16=835 * _T)),
    (("h200",), "H200 SXM", dict(fp32=67 * _T, tf32=494.7 * _T, bf16=989.4 * _T, fp16=989.4 * _T)),
    (("h100", "nvl"), "H100 NVL", dict(fp32=60 * _T, tf32=417.5 * _T, bf16=835 * _T, fp16=835 * _T)),
    (("h100", "pcie"), "H100 PCIe", dict(fp32=51 * _T, tf32=378 * _T, bf16=756 * _T, fp16=756 * _T)),
    (("h100",), "H100 SXM", dict(fp32=67 * _T, tf32=494.7 * _T, bf16=989.4 * _T, fp16=989.4 * _T)),
    (("a100",), "A100", dict(fp32=19.5 * _T, tf32=156 * _T, bf16=312 * _T, fp16=312 * _T)),
    (("l4",), "L4", dict(fp32=30.3 * _T, tf32=60 * _T, bf16=121 * _T, fp16=121 * _T)),
    (("t4",), "T4", dict(fp32=8.1 * _T, fp16=65 * _T)),
    (("v100", "pcie"), "V100 PCIe", dict(fp32=14 * _T, fp16=112 * _T)),
    (("v100",), "V100 SXM2", dict(fp32=15.7 * _T, fp16=125 * _T)),
)

_COMPUTE_DTYPE = {"float32": "float32", "mixed_float16": "float16",
                  "mixed_bfloat16": "bfloat16"}


def gpu_peak(device_name: str, precision: str = "float32", *,
             tf32: bool = True) -> Optional[tuple[str, str, float]]:
    """(GPU, kind, FLOP/s) of one GPU by its name (as TensorFlow or nvidia-smi
    gives it: "NVIDIA H100 80GB HBM3"), or None for a GPU not in the table or
    a dtype it has no tensor-core rate for (bfloat16 on a T4 or V100)."""
    name = device_name.lower()
    words = name.replace("-", " ").split()  # whole words for short names: an L40S is no L4
    for needles, label, rates in GPU_PEAKS:
        if all((needle in words) if needle in ("l4", "t4", "nvl") else (needle in name)
               for needle in needles):
            kind = {"float32": "tf32" if tf32 and "tf32" in rates else "fp32",
                    "mixed_float16": "fp16", "mixed_bfloat16": "bf16"}[precision]
            return (label, kind, rates[kind]) if kind in rates else None
    return None


def local_devices(strategy: tf.distribute.Strategy) -> tuple[str, ...]:
    """The devices of this process's replicas (the default strategy's: its one device)."""
    try:
        return tuple(strategy.extended.worker_devices)
    except Exception:  # noqa: BLE001 -- the default strategy's says "unsupported"
        return (tf.config.list_logical_devices()[0].name,)


def _device_kind(name: str) -> str:
    return tf.DeviceSpec.from_string(name).device_type or "CPU"


def all_cpus(devices: Sequence[str]) -> bool:
    """Whether every one of `devices` is a CPU: the host computes the steps
    itself, so a host op that reads their tensors waits for no other device."""
    return bool(devices) and all(device_names.kind(d) == "cpu" for d in devices)


def _gpu_names(devices: Sequence[str]) -> list[str]:
    """The model name of each physical GPU under `devices` (virtual GPUs
    split one physical GPU, which counts once; the process sees only the
    GPUs its --devices names: `engine.runtime.devices.restrict_gpus`)."""
    physical = tf.config.list_physical_devices("GPU")[:len(devices)]
    return [tf.config.experimental.get_device_details(gpu).get("device_name", "")
            for gpu in physical]


def peak(devices: Sequence[str], precision: str = "float32") -> Optional[Peak]:
    """The peak rate of `devices` (the run's local replicas' devices) in the
    compute dtype of `precision`; None when it cannot be had (no device)."""
    if not devices:
        return None
    if _device_kind(devices[0]).upper() == "GPU":
        names = _gpu_names(devices)
        found = [gpu_peak(name, precision,
                          tf32=tf.config.experimental.tensor_float_32_execution_enabled())
                 for name in names]
        if names and all(found):
            label, kind, _ = found[0]
            return Peak(sum(f[2] for f in found),
                        f"{len(found)} x {label} dense {kind} (datasheet)")
    return _measured(devices, precision)


_MEASURED: dict[str, Peak] = {}

#: Probes of a CPU's peak (per cache key) whose best is its peak from then on.
CPU_PROBES = 3


def _cache_path() -> str:
    folder = os.environ.get("TFLOOP_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfloop")
    # Not peak_flops.json, where tfloop before 2026-11-30 kept one rate per
    # key and raised it every run: a version that reads it fails on entries
    # of this shape, and the two may share the folder.
    return os.path.join(folder, "cpu_peaks.json")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return sys.platform


def _measured(devices: Sequence[str], precision: str) -> Peak:
    """The measured peak in the compute dtype of `precision`; on a CPU, in a
    lower precision, at least its float32 rate (see `_measured_in`)."""
    dtype = _COMPUTE_DTYPE[precision]
    found = _measured_in(devices, dtype)
    if _device_kind(devices[0]).lower() == "cpu" and dtype != "float32":
        # A CPU without native bfloat16/float16 arithmetic (most: no AMX nor
        # AVX512_BF16) converts to float32: its bfloat16 probe read 28-45
        # GFLOP/s on this project's machines against 130-160 in float32, the
        # model's own kernels (oneDNN's fused ones) beat that "peak", and a
        # speed-flags run printed mfu 1.35. The machine's peak is the faster.
        as_float32 = _measured_in(devices, "float32")
        if as_float32.flops_per_second > found.flops_per_second:
            found = Peak(as_float32.flops_per_second,
                         f"{as_float32.source} (its {dtype} rate, "
                         f"{found.flops_per_second / 1e9:.1f} GFLOP/s, is lower)")
    return found


def _measured_in(devices: Sequence[str], dtype: str) -> Peak:
    kind = _device_kind(devices[0]).lower()
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    key = (f"{_cpu_model()}|{os.cpu_count()} cores|{len(devices)} {kind}|"
           f"threads {threads or 'default'}|{dtype}")
    if key in _MEASURED:
        return _MEASURED[key]
    kept = _read_cache().get(key) if kind == "cpu" else None
    if kept is not None and kept["probes"] >= CPU_PROBES:
        found = Peak(kept["best"], f"best measured {dtype} matmul rate of {len(devices)} {kind} "
                                   f"device(s) in {kept['probes']} runs, kept in {_cache_path()}")
        _MEASURED[key] = found
        return found
    began = time.perf_counter()
    rate = matmul_flops_per_second(devices, dtype=dtype)
    logger.debug("measured the %s matmul rate of %s in %.2fs: %.1f GFLOP/s", dtype,
                 ",".join(devices), time.perf_counter() - began, rate / 1e9)
    found = Peak(rate, f"measured {dtype} matmul rate of {len(devices)} {kind} device(s)")
    if kind == "cpu":
        # A probe on a busy machine reads low (and mfu high): the peak is the
        # best rate of the machine's first CPU_PROBES probes, kept on disk.
        best = kept["best"] if kept is not None else 0.0
        probes = (kept["probes"] if kept is not None else 0) + 1
        if best > rate:
            found = Peak(best, f"best measured {dtype} matmul rate of {len(devices)} {kind} "
                               f"device(s), kept in {_cache_path()}")
        _write_cache(key, {"best": max(best, rate), "probes": probes})
    _MEASURED[key] = found
    return found


def _read_cache() -> dict[str, dict]:
    """key -> {"best": FLOP/s, "probes": how many}; an entry of another
    shape is left out (measured again)."""
    try:
        with open(_cache_path()) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    kept = {}
    for key, value in (data.items() if isinstance(data, dict) else ()):
        if (isinstance(value, dict) and isinstance(value.get("best"), (int, float))
                and isinstance(value.get("probes"), int) and value["best"] > 0):
            kept[key] = {"best": float(value["best"]), "probes": value["probes"]}
    return kept


def _write_cache(key: str, entry: dict) -> None:
    """Best effort, atomically (a reader never sees half a file): a cache that
    cannot be written is measured again next time."""
    path = _cache_path()
    try:
        files.make_dirs(os.path.dirname(path))
        data = _read_cache()
        data[key] = entry
        files.write_atomically(path, json.dumps(data, indent=1))  # never through a link
    except OSError as error:
        logger.debug("could not cache the matmul rate in %s: %s", path, error)


def matmul_flops_per_second(devices: Sequence[str] = ("/cpu:0",), *, size: int = 512,
                            iters: int = 4, repeats: int = 3, dtype: str = "float32") -> float:
    """The devices' matmul rate (FLOP/s), best of `repeats`: one chain of
    `iters` `size`² matmuls per device, all running at once.

    One chain per device because that is how training loads the machine:
    with one intra-op thread per CPU replica (`engine.runtime.devices`) one
    matmul uses one core and the replicas side by side use them all; with
    TF's default pool one matmul already uses every core. Best of several,
    because interference on a shared machine only ever adds time.
    """
    operands = []
    for i, device in enumerate(devices):
        with tf.device(device):
            operands.append((tf.cast(tf.random.normal([size, size], seed=2 * i + 1), dtype),
                             tf.cast(tf.random.normal([size, size], seed=2 * i + 2), dtype)))

    @tf.function
    def loop():
        out = []
        for device, (a, b) in zip(devices, operands):
            with tf.device(device):
                acc = tf.zeros([size, size], dtype)
                for _ in tf.range(iters):
                    acc += tf.matmul(a, b)
                out.append(tf.reduce_sum(acc[:1, :1]))
        return out

    loop()  # trace, warm up
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        [value.numpy() for value in loop()]
        best = min(best, time.perf_counter() - began)
    return 2.0 * size ** 3 * iters * len(devices) / best


def peak_memory(devices: Sequence[str] = ()) -> dict[str, float]:
    """`host_peak_mb`: the process's peak resident memory; with GPUs among
    `devices`, `gpu_peak_mb`: TensorFlow's peak allocation on the busiest one."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    memory = {"host_peak_mb": round(rss / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)}
    gpus = [d for d in devices if _device_kind(d).upper() == "GPU"]
    peaks = []
    for device in gpus:
        spec = tf.DeviceSpec.from_string(device)
        try:
            peaks.append(tf.config.experimental.get_memory_info(
                f"GPU:{spec.device_index or 0}")["peak"])
        except (ValueError, tf.errors.OpError):
            pass
    if peaks:
        memory["gpu_peak_mb"] = round(max(peaks) / (1 << 20), 1)
    return memory
