"""The collective benchmark behind `bin/bench_collectives`, as a library.

Three measurements, each side by side in one process:

* **sweep**: one tensor of each size, all-reduced by each collective, in the
  style of nccl-tests: time per all-reduce, algorithm bandwidth
  (size / time) and bus bandwidth (algbw x 2(N-1)/N, what each device's
  links carry in a ring, comparable across device counts), plus a
  correctness column against the numpy sum of the inputs;
* **plug-in overhead**: the same all-reduce through TF's cross-device ops
  object called directly, and through our `Collective` layer, interleaved;
* **model**: the gradient list of a model (one tensor per trainable
  variable, with the variables as destinations, as in training), unpacked
  against packed.

Timing runs the all-reduce `iters` times in a `tf.while_loop` inside one
`tf.function` call, so Python runs once per measurement, not once per
all-reduce::

    loop(n):  x = inputs
              repeat n times:  x = all_reduce(x)   # each waits for the last
    warm-up: loop(warmup); then per repeat: time loop(n) / n

n is `iters`, raised so that one timed call of the fastest loop lasts at
least `min_sample_ms`: a 100 us all-reduce timed 20 at a time was a 2 ms
sample, and the scheduler's jitter on this 2-core machine moved such
samples by 20-60%. The loops are traced afresh `rounds` times, each round timing `repeats`
interleaved repeats; the reported time is the best of all of them (the
median is kept in the JSON and CSV; see `time_interleaved`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import platform
import re
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from collectives import _values, registry
from collectives.base import CrossDeviceOpsCollective
from collectives.interface import Collective, CollectiveError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"^(\d+)\s*([KMG]?)(?:I?B)?$", re.IGNORECASE)
#: Element types the sweep can reduce.
DTYPES = ("float32", "float64", "bfloat16", "float16")
#: Unit roundoff per dtype: the relative error of one rounding.
_UNIT_ROUNDOFF = {
    "float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11,
}
#: Packing used by model mode's "packed" variant when neither option is given:
#: gradients of 256 KiB or more travel alone, smaller ones share buckets. On
#: 4 logical CPUs it beat unpacked for every collective on the mlp and cnn
#: lists, where pack_bytes=1M (copying the mlp's 800 KB kernel into a
#: bucket) and num_packs=1 (copying the cnn's 11 MB one) made the copy-based
#: collectives slower (docs/collectives.md).
DEFAULT_MODEL_PACK_BYTES = 256 << 10


def parse_size(text: str) -> int:
    """"4K" → 4096 ("4KiB", "4kb", "4096" too; K/M/G are powers of 1024)."""
    match = _SIZE_RE.match(text.strip())
    if not match:
        raise ValueError(text)
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_size(num_bytes: int) -> str:
    for unit in ("G", "M", "K"):
        if num_bytes >= _UNITS[unit] and num_bytes % _UNITS[unit] == 0:
            return f"{num_bytes // _UNITS[unit]}{unit}"
    return str(num_bytes)


def parse_sizes(spec: str) -> list[int]:
    """Sizes in bytes: "4K:256M" (x4 steps), "4K:256M:2" (x2 steps) or "4K,64K,1M"."""
    hint = "write e.g. --sizes=4K:256M (x4 steps), 4K:256M:2 or 4K,64K,1M"
    spec = spec.strip()
    if not spec:
        return []
    try:
        if ":" in spec:
            parts = spec.split(":")
            if len(parts) not in (2, 3):
                raise ValueError(spec)
            low, high = parse_size(parts[0]), parse_size(parts[1])
            factor = int(parts[2]) if len(parts) == 3 else 4
            if low <= 0 or high < low or factor < 2:
                raise CollectiveError(
                    f"--sizes={spec!r} needs 0 < low <= high and a step factor >= 2; {hint}"
                )
            sizes = []
            while low <= high:
                sizes.append(low)
                low *= factor
            return sizes
        sizes = [parse_size(s) for s in spec.split(",")]
    except ValueError:
        raise CollectiveError(f"--sizes={spec!r} is not a list of sizes; {hint}") from None
    if any(s <= 0 for s in sizes):
        raise CollectiveError(f"--sizes={spec!r} has a size of 0; sizes must be positive; {hint}")
    return sizes


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to measure.

    Attributes:
      devices: canonical device names, one replica each ("/cpu:0", ...).
      collectives: registry names (or `module:Class`) to compare.
      sizes: per-replica tensor sizes in bytes for the sweep (empty: no sweep).
      dtype: element type of the sweep's tensors.
      iters: timed all-reduces per repeat, at least.
      min_sample_ms: raise the all-reduces per repeat until the fastest
        loop's timed call lasts this long.
      rounds: times the loops are traced afresh, each followed by `repeats`
        interleaved repeats (see `time_interleaved`).
      warmup: untimed all-reduces before timing (tracing is separate).
      repeats: timed repeats per round; the best is reported.
      model: a `models.registry` name whose gradient list model mode reduces
        ("" = no model mode).
      num_packs, pack_bytes, gradient_dtype: passed to `collectives.create`
        (model mode's packed variant; pack_bytes=256K when neither is set).
      overhead: also time TF's cross-device ops directly (plug-in overhead).
      output_dir: where the CSV, JSON and PNG go ("" = write nothing).
      seed: the inputs' random seed.
    """

    devices: tuple[str, ...]
    collectives: tuple[str, ...] = ("ring", "hierarchical_copy", "reduce_to_one_device", "auto")
    sizes: tuple[int, ...] = ()
    dtype: str = "float32"
    iters: int = 20
    min_sample_ms: float = 25.0
    rounds: int = 3
    warmup: int = 5
    repeats: int = 5
    model: str = ""
    num_packs: int = 0
    pack_bytes: int = 0
    gradient_dtype: str = "float32"
    overhead: bool = True
    output_dir: str = ""
    seed: int = 0

    def __post_init__(self):
        if not self.devices:
            raise CollectiveError("--devices is empty; name at least one device, e.g. cpu:0,cpu:1")
        if not self.collectives:
            raise CollectiveError(
                f"--collectives is empty; choose from {', '.join(registry.available())}"
            )
        if self.dtype not in DTYPES:
            raise CollectiveError(
                f"--dtype={self.dtype!r} is not supported; choose one of {'|'.join(DTYPES)}"
            )
        for arg, low in (("iters", 1), ("warmup", 0), ("repeats", 1), ("rounds", 1)):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise CollectiveError(f"--{arg}={value!r} must be an integer >= {low}")
        if isinstance(self.min_sample_ms, bool) or not (
                isinstance(self.min_sample_ms, (int, float)) and self.min_sample_ms >= 0):
            raise CollectiveError(f"--min_sample_ms={self.min_sample_ms!r} must be a number >= 0")
        if not self.sizes and not self.model:
            raise CollectiveError("--sizes is empty and no --model given; nothing to measure")
        for size in self.sizes:
            if size < _itemsize(self.dtype):
                raise CollectiveError(
                    f"--sizes: {size} bytes holds no {self.dtype} element; use sizes of at least "
                    f"{_itemsize(self.dtype)} bytes"
                )

    def create(self, name: str, **overrides) -> Collective:
        options = dict(num_packs=self.num_packs, pack_bytes=self.pack_bytes,
                       gradient_dtype=self.gradient_dtype)
        options.update(overrides)
        return registry.create(name, devices=list(self.devices), **options)

    def validate_collectives(self) -> None:
        """Builds each collective once, so a bad name fails before any work."""
        for name in self.collectives:
            self.create(name)
            if self.model:
                self.create(name, **_model_packed_options(self))


@dataclasses.dataclass
class SweepRow:
    size: int
    count: int
    dtype: str
    collective: str
    description: str
    devices: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    correct: bool
    max_rel_err: float
    tolerance: float
    median_us: float = math.nan  # time_us is the best sample


@dataclasses.dataclass
class OverheadRow:
    size: int
    collective: str
    direct_us: float
    layer_us: float
    ratio: float
    direct_graph_ops: int
    layer_graph_ops: int
    median_ratio: float = math.nan  # of the median samples; ratio is of the best


@dataclasses.dataclass
class ModelRow:
    model: str
    collective: str
    tensors: int
    total_bytes: int
    unpacked: str
    packed: str
    unpacked_us: float
    packed_us: float
    ratio: float
    correct: bool
    #: The largest gradient all-reduced alone: the floor no packing can go below.
    largest_alone_us: float = math.nan
    #: (unpacked - packed) / (unpacked - largest alone): the share of the
    #: many-tensor cost that packing removed (1.0 = all of it).
    removed: float = math.nan
    median_ratio: float = math.nan  # packed/unpacked of the median samples


@dataclasses.dataclass
class BenchResults:
    config: BenchConfig
    sweep: list[SweepRow] = dataclasses.field(default_factory=list)
    overhead: list[OverheadRow] = dataclasses.field(default_factory=list)
    model: list[ModelRow] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)

    def auto_vs_fastest(self) -> list[dict[str, Any]]:
        """Per size: the fastest collective other than auto, and auto's time.

        Each collective's time is its best over its loop through the layer
        and, where the overhead run timed one with the same node count, its
        loop calling TF directly: the same graph twice, so twice the samples
        and traces. For every collective alike; on this VM one trace of a
        graph could stay 1.4x slower than the other all run long.
        """
        direct = {(o.size, o.collective): o.direct_us for o in self.overhead
                  if o.direct_graph_ops == o.layer_graph_ops}

        def best_us(row: SweepRow) -> float:
            return min(row.time_us, direct.get((row.size, row.collective), math.inf))

        out = []
        for size in sorted({r.size for r in self.sweep}):
            rows = [r for r in self.sweep if r.size == size]
            auto = [r for r in rows if r.collective == "auto"]
            others = [r for r in rows if r.collective != "auto"]
            if not auto or not others:
                continue
            best = min(others, key=best_us)
            out.append(dict(size=size, fastest=best.collective, fastest_us=best_us(best),
                            auto=auto[0].description, auto_us=best_us(auto[0]),
                            ratio=best_us(auto[0]) / best_us(best)))
        return out


def _itemsize(dtype: str) -> int:
    return tf.as_dtype(dtype).size


def _busbw_factor(n: int) -> float:
    return 2.0 * (n - 1) / n if n > 1 else 1.0


def _model_packed_options(config: BenchConfig) -> dict[str, int]:
    if config.num_packs or config.pack_bytes:
        return dict(num_packs=config.num_packs, pack_bytes=config.pack_bytes)
    return dict(num_packs=0, pack_bytes=DEFAULT_MODEL_PACK_BYTES)


def make_inputs(
    devices: Sequence[str], specs: Sequence[tuple[Sequence[int], str]], seed: int
) -> tuple[list[Any], list[np.ndarray]]:
    """PerReplica values of the given (shape, dtype) specs, and their sums.

    Values are uniform in [0.5, 1.5): all positive, so a sum has no
    cancellation and its relative error is bounded by (replicas) x (unit
    roundoff) whatever the summation order.
    """
    rng = np.random.default_rng(seed)
    values, sums = [], []
    for shape, dtype in specs:
        np_dtype = tf.as_dtype(dtype).as_numpy_dtype
        total = np.zeros(shape, np.float64)
        parts = []
        for device in devices:
            array = rng.uniform(0.5, 1.5, size=shape).astype(np.float32).astype(np_dtype)
            total += array.astype(np.float64)
            with tf.device(device):
                parts.append(tf.identity(tf.constant(array)))
            del array
        values.append(_values.per_replica(parts))
        sums.append(total)
    return values, sums


def _loop(reduce_fn: Callable[[list, list], list], values: list, destinations: Optional[list]):
    """A `tf.function` running `reduce_fn` n times in sequence; see module doc.

    Each all-reduce takes the previous one's sums as its input, the loop
    counter waits for them, and the sums are returned. With the same inputs
    every time and only the counter fetched, Grappler hoisted or pruned the
    stateless reductions (TF's hierarchical copy, reduce to one device):
    measured, a 64 MiB "all-reduce" took 0.1-0.2 ms instead of 40 ms. Sums
    grow by the replica count per iteration and may overflow to inf, which
    costs the same to add; correctness is checked on a separate single call.
    """
    devices = [_values.devices_of(v) for v in values]

    @tf.function(autograph=False)
    def loop(n):
        def body(i, *flat):
            current, start = [], 0
            for value_devices in devices:
                parts = []
                for device, part in zip(value_devices, flat[start:]):
                    with tf.device(device):  # loop variables forget their device
                        parts.append(tf.identity(part))
                current.append(_values.per_replica(parts))
                start += len(value_devices)
            out = reduce_fn(current, destinations if destinations is not None else current)
            out = [c for o in out for c in _values.components(o)]
            with tf.control_dependencies(out):  # the next iteration waits for these sums
                return [i + 1] + out

        flat = [c for v in values for c in _values.components(v)]
        return tf.while_loop(lambda i, *_: i < n, body, [tf.constant(0)] + flat)

    return loop


def _once(reduce_fn, values, destinations):
    @tf.function(autograph=False)
    def once():
        out = reduce_fn(values, destinations if destinations is not None else values)
        return [[tf.identity(c) for c in _values.components(o)] for o in out]

    return once


def graph_ops(loop) -> int:
    """Nodes in a traced loop, its while body and every function it calls."""
    graph_def = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph.as_graph_def()
    return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


def time_interleaved(make_loops: Callable[[], list], config: BenchConfig) -> tuple[list, list]:
    """Per loop a `Timing` (seconds per all-reduce), and the last loops built.

    The best, not the median: on this 2-core VM identical graphs' medians
    differed by up to 1.5x at ~100 us; interference only ever adds time, so
    the fastest of many interleaved samples is what each graph can do (as
    `timeit` advises). Tables report the best; the JSON and CSV keep both.

    `make_loops()` builds (traces) fresh loops; that happens `rounds` times,
    each round timing `repeats` interleaved repeats with the order rotated.
    Fresh traces because one traced loop could stay 1.5-1.8x slower than an
    identical one for a whole run (seen at 4 MiB: the same graph at 530 and
    320 us, 21 repeats each); a new trace each round makes that one round's
    samples, not the result.
    """
    samples: list[list[float]] = []
    loops: list = []
    for _ in range(config.rounds):
        loops = make_loops()
        samples = samples or [[] for _ in loops]
        warmup = tf.constant(max(config.warmup, 1))
        fastest = math.inf
        for loop in loops:
            loop(warmup)  # Traces, and warms up.
            start = time.perf_counter()
            loop(warmup)
            fastest = min(fastest, (time.perf_counter() - start) / int(warmup))
        iters = max(config.iters, math.ceil(config.min_sample_ms / 1e3 / max(fastest, 1e-9)))
        n = tf.constant(iters)
        for r in range(config.repeats):
            for j in range(len(loops)):
                k = (j + r) % len(loops)
                start = time.perf_counter()
                loops[k](n)
                samples[k].append((time.perf_counter() - start) / iters)
    return [Timing(min(s), statistics.median(s)) for s in samples], loops


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per all-reduce of one loop: the best and the median sample."""

    best: float
    median: float


def _tolerance(config: BenchConfig, dtype: str, compressed: bool) -> float:
    reduce_dtype = config.gradient_dtype if compressed else dtype
    unit = max(_UNIT_ROUNDOFF[reduce_dtype], _UNIT_ROUNDOFF[dtype])
    return 2.0 * len(config.devices) * unit


def check_sums(outputs: list[list[Any]], sums: list[np.ndarray]) -> float:
    """The largest relative error of any device's result against the numpy sum."""
    worst = 0.0
    for per_device, want in zip(outputs, sums):
        for got in per_device:
            got = np.asarray(got.numpy(), np.float64)
            if got.shape != want.shape:
                return math.inf
            if want.size:
                worst = max(worst, float(np.max(np.abs(got - want) / np.abs(want))))
    return worst


def _reduce_via_layer(collective: Collective):
    return lambda values, destinations: collective.batch_all_reduce(values, destinations)


def _reduce_direct(ops: tf.distribute.CrossDeviceOps, options):
    return lambda values, destinations: ops.batch_reduce(
        tf.distribute.ReduceOp.SUM, list(zip(values, destinations)), options=options)


def _tf_ops_of(collective: Collective, value: Any):
    """TF's cross-device ops object (and its call options) that reduces
    `value` through `collective`, if that is exactly one; else None."""
    target = collective.collective_for(value) if hasattr(collective, "collective_for") else collective
    if isinstance(target, CrossDeviceOpsCollective):
        return target.cross_device_ops(_values.devices_of(value)), target.communication_options
    return None


def run_sweep(config: BenchConfig, results: BenchResults, progress: Callable[[str], None]) -> None:
    """Per size, every collective (and TF's ops called directly) timed in one
    interleaved run: a burst of load from elsewhere slows all of them alike
    instead of whichever ran at that moment, so the per-size comparisons
    (auto against the fastest, the layer against TF) hold to a few percent
    where sequential runs differed by 20%."""
    n = len(config.devices)
    collectives = {name: config.create(name) for name in config.collectives}
    compressed = config.gradient_dtype != "float32" and (
        _itemsize(config.dtype) > _itemsize(config.gradient_dtype))
    tol = _tolerance(config, config.dtype, compressed)
    for k, size in enumerate(config.sizes, 1):
        count = size // _itemsize(config.dtype)
        values, sums = make_inputs(config.devices, [((count,), config.dtype)], config.seed)
        direct_index = {}  # collective name -> index of its direct-TF loop
        directs = []
        for name, collective in collectives.items():
            direct = _tf_ops_of(collective, values[0]) if config.overhead and n > 1 else None
            if direct is not None:
                direct_index[name] = len(collectives) + len(directs)
                directs.append(direct)

        def make_loops():
            return ([_loop(_reduce_via_layer(c), values, None) for c in collectives.values()]
                    + [_loop(_reduce_direct(*d), values, None) for d in directs])

        progress(f"[{k}/{len(config.sizes)}] {format_size(size)}: timing "
                 f"{', '.join(collectives)}{' and TF directly' if directs else ''}, interleaved, "
                 f"{config.rounds} x {config.repeats} repeats")
        times, loops = time_interleaved(make_loops, config)
        for i, (name, collective) in enumerate(collectives.items()):
            err = check_sums(_once(_reduce_via_layer(collective), values, None)(), sums)
            algbw = size / times[i].best / 1e9
            row = SweepRow(size=size, count=count, dtype=config.dtype, collective=name,
                           description=collective.describe(), devices=n,
                           time_us=times[i].best * 1e6, algbw_gbs=algbw,
                           busbw_gbs=algbw * _busbw_factor(n), correct=err <= tol,
                           max_rel_err=err, tolerance=tol, median_us=times[i].median * 1e6)
            results.sweep.append(row)
            line = (f"      {format_size(size):>5} {row.description:<40} "
                    f"{row.time_us:10.1f} us  busbw {row.busbw_gbs:7.3f} GB/s  "
                    f"{'ok' if row.correct else 'WRONG'}")
            if name in direct_index:
                j = direct_index[name]
                overhead = OverheadRow(size=size, collective=name,
                                       direct_us=times[j].best * 1e6,
                                       layer_us=times[i].best * 1e6,
                                       ratio=times[i].best / times[j].best,
                                       direct_graph_ops=graph_ops(loops[j]),
                                       layer_graph_ops=graph_ops(loops[i]),
                                       median_ratio=times[i].median / times[j].median)
                results.overhead.append(overhead)
                line += (f"  (direct TF {overhead.direct_us:.1f} us, "
                         f"layer/direct {overhead.ratio:.3f})")
            progress(line)
        del values, sums, loops


def run_model(
    config: BenchConfig,
    results: BenchResults,
    build_model: Callable[[str], Any],
    progress: Callable[[str], None],
) -> None:
    """All-reduces the model's gradient list (synthetic values of the right
    shapes and dtypes, the model's mirrored variables as destinations)."""
    strategy = tf.distribute.MirroredStrategy(list(config.devices))
    with strategy.scope():
        model = build_model(config.model)
    variables = list(model.trainable_variables)
    destinations = [_values.as_destination(v) for v in variables]
    specs = [(tuple(v.shape), tf.as_dtype(v.dtype).name) for v in variables]
    devices = _values.devices_of(destinations[0])
    values, sums = make_inputs(devices, specs, config.seed)
    total_bytes = sum(_values.nbytes(v) for v in values)
    packed_options = _model_packed_options(config)
    largest = max(range(len(values)), key=lambda i: _values.nbytes(values[i]))
    for name in config.collectives:
        unpacked = config.create(name, num_packs=0, pack_bytes=0)
        packed = config.create(name, **packed_options)

        def make_loops():
            loops = [_loop(_reduce_via_layer(c), values, destinations) for c in (unpacked, packed)]
            return loops + [_loop(_reduce_via_layer(unpacked), [values[largest]],
                                  [destinations[largest]])]

        timings, _ = time_interleaved(make_loops, config)
        unpacked_s, packed_s, largest_s = (t.best for t in timings)
        tol = _tolerance(config, "float32", config.gradient_dtype != "float32")
        correct = all(
            check_sums(_once(_reduce_via_layer(c), values, destinations)(), sums) <= tol
            for c in (unpacked, packed)
        )
        row = ModelRow(model=config.model, collective=name, tensors=len(values),
                       total_bytes=total_bytes, unpacked=unpacked.describe(),
                       packed=packed.describe(), unpacked_us=unpacked_s * 1e6,
                       packed_us=packed_s * 1e6, ratio=packed_s / unpacked_s, correct=correct,
                       largest_alone_us=largest_s * 1e6,
                       removed=(unpacked_s - packed_s) / max(unpacked_s - largest_s, 1e-9),
                       median_ratio=timings[1].median / timings[0].median)
        results.model.append(row)
        progress(f"[model {config.model}] {name:<22} unpacked {row.unpacked_us:9.1f} us   "
                 f"packed ({row.packed}) {row.packed_us:9.1f} us   packed/unpacked "
                 f"{row.ratio:.3f}   largest alone {row.largest_alone_us:9.1f} us  "
                 f"{'ok' if correct else 'WRONG'}")


def format_report(results: BenchResults) -> str:
    """The tables printed at the end of a run."""
    config = results.config
    lines = []
    if results.sweep:
        lines.append(f"# all-reduce (sum) over {len(config.devices)} devices: "
                     f"{','.join(d.lstrip('/') for d in config.devices)}")
        width = max(22, *(len(r.description) for r in results.sweep))
        lines.append(f"# {'size':>12} {'count':>12} {'type':>9} {'collective':>{width}} "
                     f"{'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'correct':>8}")
        for r in results.sweep:
            lines.append(f"  {r.size:>12} {r.count:>12} {r.dtype:>9} {r.description:>{width}} "
                         f"{r.time_us:>12.1f} {r.algbw_gbs:>12.4f} {r.busbw_gbs:>12.4f} "
                         f"{'ok' if r.correct else 'WRONG':>8}")
    if results.overhead:
        lines.append("")
        lines.append("# plug-in overhead: TF cross-device ops called directly vs through "
                     "Collective")
        lines.append(f"# {'size':>12} {'collective':>22} {'direct(us)':>12} {'layer(us)':>12} "
                     f"{'ratio':>8} {'graph ops direct/layer':>24}")
        for r in results.overhead:
            lines.append(f"  {r.size:>12} {r.collective:>22} {r.direct_us:>12.1f} "
                         f"{r.layer_us:>12.1f} {r.ratio:>8.3f} "
                         f"{f'{r.direct_graph_ops}/{r.layer_graph_ops}':>24}")
        big = [r.ratio for r in results.overhead if r.size >= 1 << 20]
        if big:
            lines.append(f"# sizes >= 1M: layer/direct median {statistics.median(big):.3f}, "
                         f"max {max(big):.3f} over {len(big)} measurements")
    comparison = results.auto_vs_fastest()
    if comparison:
        lines.append("")
        lines.append("# auto vs the fastest other collective per size")
        width = max(30, *(len(c["auto"]) for c in comparison))
        lines.append(f"# {'size':>12} {'fastest':>22} {'time(us)':>12} {'auto':>{width}} "
                     f"{'time(us)':>12} {'auto/fastest':>12}")
        for c in comparison:
            lines.append(f"  {c['size']:>12} {c['fastest']:>22} {c['fastest_us']:>12.1f} "
                         f"{c['auto']:>{width}} {c['auto_us']:>12.1f} {c['ratio']:>12.3f}")
    if results.model:
        lines.append("")
        r0 = results.model[0]
        lines.append(f"# model {r0.model}: {r0.tensors} gradients, {r0.total_bytes} bytes "
                     "per replica; 'largest alone' = its largest gradient by itself, the floor "
                     "for packing; 'removed' = the share of the rest that packing took away")
        lines.append(f"# {'collective':>22} {'unpacked(us)':>13} {'packed(us)':>12} "
                     f"{'packed/unpacked':>16} {'largest alone(us)':>18} {'removed':>8} "
                     f"{'correct':>8}  packed as")
        for r in results.model:
            lines.append(f"  {r.collective:>22} {r.unpacked_us:>13.1f} {r.packed_us:>12.1f} "
                         f"{r.ratio:>16.3f} {r.largest_alone_us:>18.1f} {r.removed:>8.2f} "
                         f"{'ok' if r.correct else 'WRONG':>8}  {r.packed}")
    return "\n".join(lines)


def write_outputs(results: BenchResults) -> list[str]:
    """CSV per table, one JSON with everything, and the busbw plot."""
    out_dir = results.config.output_dir
    os.makedirs(out_dir, exist_ok=True)
    files = []
    for name, rows in (("sweep", results.sweep), ("overhead", results.overhead),
                       ("model", results.model)):
        if not rows:
            continue
        path = os.path.join(out_dir, f"bench_collectives_{name}.csv")
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dataclasses.asdict(rows[0])))
            writer.writeheader()
            for row in rows:
                writer.writerow(dataclasses.asdict(row))
        files.append(path)
    path = os.path.join(out_dir, "bench_collectives.json")
    with open(path, "w") as f:
        json.dump(dict(
            config=dataclasses.asdict(results.config),
            environment=dict(tensorflow=tf.__version__, python=platform.python_version(),
                             machine=platform.machine(), cpu_count=os.cpu_count(),
                             intra_op_threads=(
                                 tf.config.threading.get_intra_op_parallelism_threads())),
            sweep=[dataclasses.asdict(r) for r in results.sweep],
            overhead=[dataclasses.asdict(r) for r in results.overhead],
            auto_vs_fastest=results.auto_vs_fastest(),
            model=[dataclasses.asdict(r) for r in results.model],
        ), f, indent=2)
    files.append(path)
    if results.sweep:
        files.append(plot_busbw(results, os.path.join(out_dir, "bench_collectives_busbw.png")))
    return files


def plot_busbw(results: BenchResults, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in results.config.collectives:
        rows = sorted((r for r in results.sweep if r.collective == name), key=lambda r: r.size)
        if rows:
            ax.plot([r.size for r in rows], [r.busbw_gbs for r in rows], marker="o",
                    label=rows[0].description)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size per replica (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    config = results.config
    ax.set_title(f"all-reduce over {len(config.devices)} devices "
                 f"({','.join(d.lstrip('/') for d in config.devices)}), {config.dtype}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(
    config: BenchConfig,
    *,
    build_model: Optional[Callable[[str], Any]] = None,
    progress: Callable[[str], None] = print,
) -> BenchResults:
    """Runs the sweep and, with `config.model`, model mode; writes the outputs.

    `build_model(name)` returns a Keras model (bin/bench_collectives passes
    `models.registry.build`); it is called inside the strategy's scope.
    """
    config.validate_collectives()
    results = BenchResults(config=config)
    if config.sizes:
        run_sweep(config, results, progress)
    if config.model:
        if build_model is None:
            raise CollectiveError(
                f"--model={config.model!r} needs a model builder; pass build_model "
                "(bin/bench_collectives passes models.registry.build)"
            )
        run_model(config, results, build_model, progress)
    progress(format_report(results))
    if config.output_dir:
        results.files = write_outputs(results)
        progress(f"wrote {', '.join(results.files)}")
    return results
