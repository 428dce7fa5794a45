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

Each all-reduce is timed `n` at a time in one `tf.function` call
(`bench.allreduce.chained_loop`). The loops are traced afresh `rounds` times,
each round timing `repeats` interleaved repeats; the reported time is the
best of all of them (the median is kept in the JSON and CSV; see
`bench.timing.time_interleaved`). Tables, CSV, JSON and the plot:
`bench.report`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from tfloop.bench import allreduce, report, timing
from tfloop.bench.sizes import format_size, parse_size  # noqa: F401  (this module's API too)
from tfloop.bench.timing import Progress
from tfloop.collectives import _values, registry
from tfloop.collectives.interface import Collective, CollectiveError
from tfloop.engine.runtime import devices as engine_devices

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
#: `bin/bench_collectives`' sweep without flags: about a minute on 4 logical CPUs of
#: a 2-core machine. `--full` is the nccl-tests range, about ten minutes there.
DEFAULT_SIZES = "4K:4M"
FULL_SIZES = "4K:256M"


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
class CollectiveBenchConfig:
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
        interleaved repeats (see `bench.timing.time_interleaved`).
      warmup: untimed all-reduces before timing (tracing is separate).
      repeats: timed repeats per round; the best is reported.
      model: a `models.registry` name whose gradient list model mode reduces
        ("" = no model mode).
      num_packs, pack_bytes, gradient_dtype: passed to `collectives.create`
        (model mode's packed variant; pack_bytes=256K when neither is set).
      overhead: also time TF's cross-device ops directly (plug-in overhead).
      output_dir: where the CSV, JSON and PNG go ("" = write nothing).
      seed: the inputs' random seed.
      plot: also draw the busbw PNG (needs matplotlib: without it the PNG is
        skipped with one line; the CSV and JSON are written first either way).
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
    plot: bool = True

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

    @property
    def schedule(self) -> timing.Schedule:
        return timing.Schedule(rounds=self.rounds, repeats=self.repeats, warmup=self.warmup,
                               iters=self.iters, min_sample_ms=self.min_sample_ms)

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
class CollectiveBenchResults:
    config: CollectiveBenchConfig
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


def _model_packed_options(config: CollectiveBenchConfig) -> dict[str, int]:
    if config.num_packs or config.pack_bytes:
        return dict(num_packs=config.num_packs, pack_bytes=config.pack_bytes)
    return dict(num_packs=0, pack_bytes=DEFAULT_MODEL_PACK_BYTES)


def _tolerance(config: CollectiveBenchConfig, dtype: str, compressed: bool) -> float:
    reduce_dtype = config.gradient_dtype if compressed else dtype
    unit = max(_UNIT_ROUNDOFF[reduce_dtype], _UNIT_ROUNDOFF[dtype])
    return 2.0 * len(config.devices) * unit


def run_sweep(config: CollectiveBenchConfig, results: CollectiveBenchResults,
              progress: Progress) -> None:
    """Per size, every collective (and TF's ops called directly) timed in one
    interleaved run: a burst of load from elsewhere slows all of them alike
    instead of whichever ran at that moment, so the per-size comparisons
    (auto against the fastest, the layer against TF) hold to a few percent
    where sequential runs differed by 20%."""
    collectives = {name: config.create(name) for name in config.collectives}
    compressed = config.gradient_dtype != "float32" and (
        _itemsize(config.dtype) > _itemsize(config.gradient_dtype))
    tol = _tolerance(config, config.dtype, compressed)
    for k, size in enumerate(config.sizes, 1):
        progress_prefix = f"[{k}/{len(config.sizes)}] {format_size(size)}"
        _sweep_size(config, collectives, size, tol, results, progress, progress_prefix)


def _sweep_size(config: CollectiveBenchConfig, collectives: dict[str, Collective], size: int,
                tol: float, results: CollectiveBenchResults, progress: Progress,
                progress_prefix: str) -> None:
    """One size of the sweep: a `SweepRow` per collective, an `OverheadRow`
    per collective that is exactly one of TF's cross-device ops."""
    n = len(config.devices)
    count = size // _itemsize(config.dtype)
    values, sums = allreduce.make_inputs(config.devices, [((count,), config.dtype)], config.seed)
    direct_index = {}  # collective name -> index of its direct-TF loop
    directs = []
    for name, collective in collectives.items():
        direct = allreduce.tf_ops_of(collective, values[0]) if config.overhead and n > 1 else None
        if direct is not None:
            direct_index[name] = len(collectives) + len(directs)
            directs.append(direct)

    def make_loops():
        return ([_chained(allreduce.reduce_via_layer(c), values) for c in collectives.values()]
                + [_chained(allreduce.reduce_direct(*d), values) for d in directs])

    progress(f"{progress_prefix}: timing "
             f"{', '.join(collectives)}{' and TF directly' if directs else ''}, interleaved, "
             f"{config.rounds} x {config.repeats} repeats")
    times, loops = timing.time_interleaved(make_loops, config.schedule)
    for i, (name, collective) in enumerate(collectives.items()):
        err = _error(collective, values, None, sums)
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
                                   direct_graph_ops=allreduce.graph_ops(loops[j]),
                                   layer_graph_ops=allreduce.graph_ops(loops[i]),
                                   median_ratio=times[i].median / times[j].median)
            results.overhead.append(overhead)
            line += (f"  (direct TF {overhead.direct_us:.1f} us, "
                     f"layer/direct {overhead.ratio:.3f})")
        progress(line)


def _chained(reduce_fn: allreduce.ReduceFn, values: list, destinations: Optional[list] = None):
    return allreduce.chained_loop(reduce_fn, values, destinations)


def _error(collective: Collective, values: list, destinations: Optional[list], sums) -> float:
    """The largest relative error of one all-reduce through `collective`."""
    call = allreduce.once(allreduce.reduce_via_layer(collective), values, destinations)
    return allreduce.check_sums(call(), sums)


def run_model(
    config: CollectiveBenchConfig,
    results: CollectiveBenchResults,
    build_model: Callable[[str], Any],
    progress: Progress,
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
    values, sums = allreduce.make_inputs(devices, specs, config.seed)
    total_bytes = sum(_values.nbytes(v) for v in values)
    packed_options = _model_packed_options(config)
    largest = max(range(len(values)), key=lambda i: _values.nbytes(values[i]))
    for name in config.collectives:
        unpacked = config.create(name, num_packs=0, pack_bytes=0)
        packed = config.create(name, **packed_options)

        def make_loops():
            loops = [_chained(allreduce.reduce_via_layer(c), values, destinations)
                     for c in (unpacked, packed)]
            return loops + [_chained(allreduce.reduce_via_layer(unpacked), [values[largest]],
                                     [destinations[largest]])]

        timings, _ = timing.time_interleaved(make_loops, config.schedule)
        unpacked_s, packed_s, largest_s = (t.best for t in timings)
        tol = _tolerance(config, "float32", config.gradient_dtype != "float32")
        correct = all(_error(c, values, destinations, sums) <= tol for c in (unpacked, packed))
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


def run(
    config: CollectiveBenchConfig,
    *,
    build_model: Optional[Callable[[str], Any]] = None,
    progress: Progress = print,
) -> CollectiveBenchResults:
    """Runs the sweep and, with `config.model`, model mode; writes the outputs.

    `build_model(name)` returns a Keras model (bin/bench_collectives passes
    `models.registry.build`); it is called inside the strategy's scope.
    """
    config.validate_collectives()
    results = CollectiveBenchResults(config=config)
    if config.sizes:
        run_sweep(config, results, progress)
    if config.model:
        if build_model is None:
            raise CollectiveError(
                f"--model={config.model!r} needs a model builder; pass build_model "
                "(bin/bench_collectives passes models.registry.build)"
            )
        run_model(config, results, build_model, progress)
    progress(report.collectives_report(results))
    if config.output_dir:
        results.files = report.write_collectives_outputs(results, progress=progress)
        progress(f"wrote {', '.join(results.files)}")
    return results


def wrong_sums(results: CollectiveBenchResults) -> str:
    """One line naming every collective whose sum was wrong (beyond the
    summation-order tolerance) and where; "" when every sum was right."""
    wrong: dict[str, list[str]] = {}
    for row in results.sweep:
        if not row.correct:
            wrong.setdefault(row.collective, []).append(
                f"{format_size(row.size)} (max relative error {row.max_rel_err:.3g} > "
                f"{row.tolerance:.3g})")
    for row in results.model:
        if not row.correct:
            wrong.setdefault(row.collective, []).append(f"the {row.model} gradients")
    if not wrong:
        return ""
    found = "; ".join(f"{name} at {', '.join(where)}" for name, where in wrong.items())
    return (f"wrong all-reduce sums: {found}; the timings of a collective that does not sum "
            "mean nothing (the table and files are written, marked WRONG)")


def main(*, devices: str, collectives: Sequence[str], sizes: str = DEFAULT_SIZES,
         full: bool = False, intra_op_threads: int = -1, progress: Progress = print,
         **options: Any) -> CollectiveBenchResults:
    """What `bin/bench_collectives` does with its flags' values.

    Parses `devices` ("cpu:0,cpu:1"), `collectives` (names, blanks dropped) and
    `sizes` ("4K:256M"; `full`: `FULL_SIZES`); `options` are the other
    `CollectiveBenchConfig` fields. Then sets up the devices and threads and runs.
    """
    # TF's per-trace INFO lines ("batch_all_reduce: ...") would bury the table.
    tf.get_logger().setLevel("ERROR")
    if full:
        if sizes != DEFAULT_SIZES:
            raise CollectiveError(f"--full sweeps {FULL_SIZES} and --sizes={sizes!r} asks for "
                                  "other sizes; give one of them")
        sizes = FULL_SIZES
    names = engine_devices.parse_devices(devices)
    config = CollectiveBenchConfig(
        devices=tuple(names),
        collectives=tuple(c.strip() for c in collectives if c.strip()),
        sizes=tuple(parse_sizes(sizes)),
        **options,
    )
    build_model = None
    if config.model:
        from tfloop.models import registry as model_registry

        if config.model not in model_registry.available():
            model_registry.build(config.model)  # raises the one-line "not a model" error
        build_model = model_registry.build
    names = engine_devices.prepare_devices(names)  # GPUs renumbered as the process sees them
    config = dataclasses.replace(config, devices=tuple(names))
    threads = engine_devices.configure_threads(names, intra_op_threads)
    progress(f"intra-op threads per op: {threads or 'TensorFlow default (all cores)'}")
    return run(config, build_model=build_model, progress=progress)
