"""How both benchmarks time: interleaved rounds, best or median, and the machine's ceiling.

Shared by `bench.collectives` and `bench.training`. The machines these run on
are small and shared (2 cores here), so every number is taken the same way:

* **interleaved, rotated**: the things compared run in turn, the order rotated
  from one round or repeat to the next (`rotated`), so a busy stretch of the
  machine lands on all of them instead of whichever ran at that moment;
* **best and median**: interference only ever adds time, so the fastest of many
  interleaved samples is what a graph can do (as `timeit` advises); the median
  is kept too (`Timing`);
* **garbage collected outside the clock** (`collect_garbage`);
* **against the machine's float32 matmul rate** measured in the same run
  (`matmul_gflops`), and described in the output (`machine_description`).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import platform
import statistics
import time
from typing import Callable, Optional, Sequence, TypeVar

import keras
import tensorflow as tf

from tfloop.engine.runtime import hardware

#: Where a benchmark reports what it is doing, one line at a time.
Progress = Callable[[str], None]

T = TypeVar("T")


def rotated(items: Sequence[T], shift: int) -> list[T]:
    """`items` starting at `shift` (mod its length): round `shift`'s running order."""
    items = list(items)
    if not items:
        return items
    shift %= len(items)
    return items[shift:] + items[:shift]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call of one timed thing: the best and the median sample."""

    best: float
    median: float


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How `time_interleaved` samples.

    Attributes:
      rounds: times the loops are built (traced) afresh, each followed by
        `repeats` interleaved repeats.
      repeats: timed repeats per round.
      warmup: untimed calls before timing (tracing is separate).
      iters: calls per timed sample, at least.
      min_sample_ms: raise the calls per sample until the fastest loop's
        timed sample lasts this long.
    """

    rounds: int
    repeats: int
    warmup: int
    iters: int
    min_sample_ms: float


def time_interleaved(make_loops: Callable[[], list], schedule: Schedule) -> tuple[list, list]:
    """Per loop a `Timing` (seconds per call), and the last loops built.

    Each loop is a `tf.function` taking `n` and doing its work `n` times in a
    row inside one call, so Python runs once per sample, not once per call.

    The best, not the median: on this 2-core VM identical graphs' medians
    differed by up to 1.5x at ~100 us; interference only ever adds time, so
    the fastest of many interleaved samples is what each graph can do. Tables
    report the best; the JSON and CSV keep both.

    `make_loops()` builds (traces) fresh loops; that happens `rounds` times,
    each round timing `repeats` interleaved repeats with the order rotated.
    Fresh traces because one traced loop could stay 1.5-1.8x slower than an
    identical one for a whole run (seen at 4 MiB: the same graph at 530 and
    320 us, 21 repeats each); a new trace each round makes that one round's
    samples, not the result. `n` is raised so that one timed call of the
    fastest loop lasts at least `min_sample_ms`: a 100 us all-reduce timed 20
    at a time was a 2 ms sample, and the scheduler's jitter on this 2-core
    machine moved such samples by 20-60%.
    """
    samples: list[list[float]] = []
    loops: list = []
    for _ in range(schedule.rounds):
        loops = make_loops()
        samples = samples or [[] for _ in loops]
        warmup = tf.constant(max(schedule.warmup, 1))
        fastest = math.inf
        for loop in loops:
            fetched(loop(warmup))  # Traces, and warms up.
            start = time.perf_counter()
            fetched(loop(warmup))
            fastest = min(fastest, (time.perf_counter() - start) / int(warmup))
        iters = max(schedule.iters,
                    math.ceil(schedule.min_sample_ms / 1e3 / max(fastest, 1e-9)))
        n = tf.constant(iters)
        for r in range(schedule.repeats):
            for k in rotated(range(len(loops)), r):
                start = time.perf_counter()
                fetched(loops[k](n))
                samples[k].append((time.perf_counter() - start) / iters)
    return [Timing(min(s), statistics.median(s)) for s in samples], loops


def fetched(result):
    """`result` with every tensor in it copied to the host.

    A `tf.function` call returns once its kernels are queued; on a GPU they
    run on after it, and a clock stopped at the return would miss them. A
    copy to the host waits for them, so timed loops return something small
    to fetch (`allreduce.chained_loop`: one element per device).
    """
    for tensor in tf.nest.flatten(result):
        if isinstance(tensor, tf.Tensor):
            tensor.numpy()
    return result


def collect_garbage(progress: Progress) -> None:
    """Frees the previous measurement's objects now, outside any timed section.

    Keras models and distributed iterators sit in reference cycles, so they
    die whenever Python's collector next runs, which could be in the middle
    of another variant's timed steps. Destroying a distributed dataset's
    iterator can block for seconds to minutes with the CPU idle (TF 2.21:
    the main thread waits in `UnboundedThreadPool::LogicalThreadWrapper`'s
    destructor, seen with gdb; the test suite meets the same stall), and that
    wait would be counted as that variant's training time.
    """
    began = time.perf_counter()
    gc.collect()
    waited = time.perf_counter() - began
    if waited > 1.0:
        progress(f"  (freeing the previous variant's objects took {waited:.0f}s; not timed)")


def matmul_gflops(devices: Sequence[str] = ("/cpu:0",), size: Optional[int] = None,
                  iters: int = 20, repeats: int = 3) -> float:
    """The machine's float32 matmul rate (GFLOP/s), best of `repeats`: one
    chain of matmuls per device, all running at once (the engine's own probe,
    `engine.runtime.hardware.matmul_flops_per_second`, with bigger matmuls:
    a benchmark can afford a longer measurement than a run's start). By
    default 1024² on CPUs and 4096² on GPUs: on an H200, 1024² matmuls are
    launch-bound and read 25 TFLOP/s where TensorFlow reaches 75-91."""
    if size is None:
        size = 4096 if any("gpu" in device.lower() for device in devices) else 1024
    return hardware.matmul_flops_per_second(devices, size=size, iters=iters,
                                            repeats=repeats) / 1e9


def machine_description() -> str:
    """One line: CPU model, cores, GPUs by name, TensorFlow and Keras versions, intra-op threads."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = tf.config.list_physical_devices("GPU")
    names = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
             for gpu in gpus]
    shown = (f"{len(gpus)} GPU(s)" + (f" ({', '.join(sorted(set(names)))})" if names else ""))
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    return (f"{cpu}, {os.cpu_count()} cores, {shown}, TensorFlow {tf.__version__}, "
            f"Keras {keras.__version__}, intra-op threads {threads or 'default'}")


def environment() -> dict:
    """The machine as JSON fields (bench_collectives.json's `environment`)."""
    return dict(tensorflow=tf.__version__, python=platform.python_version(),
                machine=platform.machine(), cpu_count=os.cpu_count(),
                intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads())
