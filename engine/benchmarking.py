"""Training throughput side by side: the engine, `Model.fit`, a hand-written loop.

`bin/bench_train` is a thin shell over this module. In one process, on the
same model, data pipeline, strategy, devices and optimizer, it times:

  engine            `engine.run.run(RunConfig)`: bin/train's own code path
                    (Controller, Trainer, collective, checkpoint at the end),
                    timed from outside between loop ends (`on_loop_end`), so
                    every bit of per-loop Python the engine does is counted;
  engine+features   the same with the speed flags asked for (`--jit_compile`,
                    `--mixed_precision`, `--fused_optimizer`);
  fit               `Model.fit`, compiled under the same strategy (the
                    strategy's all-reduce set to the engine's collective when
                    that is one of TF's cross-device ops), default
                    `steps_per_execution=1`;
  fit spe=N         the same with `steps_per_execution=N` (tuned);
  hand loop         the loop a user would write: `strategy.run` of a
                    GradientTape step, `steps` of them inside one
                    `tf.function`, the Keras optimizer's own all-reduce.

Each variant runs one untimed warm-up repetition (tracing, compilation,
autotuning) and then `repetitions` timed repetitions of `steps` steps; the
report gives the median examples/sec, the spread (min and max), ratios
against each baseline, and the fraction of the machine's float32 matmul rate
(measured in the same run) the training arithmetic reaches. Logical CPU
devices can be configured once per process, so a sweep over device counts
runs one subprocess per count (`sweep`) and plots examples/sec against them.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from engine.errors import ConfigError

Progress = Callable[[str], None]

FIT = "fit"
HAND = "hand loop"
ENGINE = "engine"
FEATURES = "engine+features"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    model: str = "mlp"
    dataset: str = "synthetic"
    devices: tuple[str, ...] = ("/cpu:0",)
    global_batch_size: int = 256
    collective: str = "auto"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    steps: int = 100
    repetitions: int = 5
    rounds: int = 1
    steps_per_execution: int = 100
    jit_compile: bool = False
    mixed_precision: str = "float32"
    fused_optimizer: bool = False
    variants: tuple[str, ...] = ("engine", "engine+features", "fit", "fit_tuned", "hand_loop")
    output_dir: str = ""
    seed: int = 0

    def __post_init__(self):
        for name in ("global_batch_size", "steps", "repetitions", "rounds", "steps_per_execution"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name}={getattr(self, name)} must be a positive integer")

    @property
    def features(self) -> str:
        """What `engine+features` turns on, in flag form."""
        on = [name for name, value in (("jit_compile", self.jit_compile),
                                       ("fused_optimizer", self.fused_optimizer)) if value]
        if self.mixed_precision != "float32":
            on.append(f"mixed_precision={self.mixed_precision}")
        return ",".join(on)


@dataclasses.dataclass
class Row:
    variant: str
    description: str
    seconds: list[float]  # one per timed repetition
    examples_per_rep: int
    median: float = 0.0  # examples/sec
    low: float = 0.0
    high: float = 0.0

    def __post_init__(self):
        rates = [self.examples_per_rep / s for s in self.seconds]
        self.median = statistics.median(rates)
        self.low, self.high = min(rates), max(rates)


# --- machine and model arithmetic ---------------------------------------------------------


def matmul_gflops(devices: Sequence[str] = ("/cpu:0",), size: int = 1024, iters: int = 20,
                  repeats: int = 3) -> float:
    """The machine's float32 matmul rate (GFLOP/s), best of `repeats`: one
    chain of matmuls per device, all running at once.

    One chain per device because that is how training loads the machine:
    with one intra-op thread per CPU replica (engine/devices.py) one matmul
    uses one core, and the replicas side by side use them all; with TF's
    default pool one matmul already uses every core.
    """
    operands = []
    for i, device in enumerate(devices):
        with tf.device(device):
            operands.append((tf.random.normal([size, size], seed=2 * i + 1),
                             tf.random.normal([size, size], seed=2 * i + 2)))

    @tf.function
    def loop():
        out = []
        for device, (a, b) in zip(devices, operands):
            with tf.device(device):
                acc = tf.zeros([size, size])
                for _ in tf.range(iters):
                    acc += tf.matmul(a, b)
                out.append(acc)
        return out

    loop()  # trace, warm up
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        [acc.numpy() for acc in loop()]
        best = min(best, time.perf_counter() - began)
    return 2.0 * size ** 3 * iters * len(devices) / best / 1e9


def train_flops_per_example(model: keras.Model, input_shape: Sequence[int]) -> float:
    """Forward FLOPs of one example (TensorFlow's graph profiler) × 3: the
    backward pass costs about twice the forward (input and weight gradients)."""
    @tf.function
    def forward(x):
        return model(x, training=False)

    graph = forward.get_concrete_function(tf.TensorSpec([1, *input_shape], tf.float32)).graph
    options = (tf.compat.v1.profiler.ProfileOptionBuilder(
        tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()).with_empty_output().build())
    flops = tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops
    return 3.0 * flops


# --- the variants ---------------------------------------------------------------------------


def _short(devices: Sequence[str]) -> str:
    return ",".join(d.lstrip("/") for d in devices)


def _collective(config: BenchConfig):
    import collectives

    return collectives.create(config.collective, devices=list(config.devices))


def baseline_strategy(config: BenchConfig) -> tf.distribute.Strategy:
    """`MirroredStrategy` over the devices, all-reducing the way the engine's
    collective does when that is one of TF's cross-device ops."""
    from collectives.base import CrossDeviceOpsCollective

    collective = _collective(config)
    target = getattr(collective, "chosen", None) or collective  # auto → what it picked
    ops = None
    if len(config.devices) > 1 and isinstance(target, CrossDeviceOpsCollective):
        ops = target.cross_device_ops(tuple(config.devices))
    return tf.distribute.MirroredStrategy(list(config.devices), cross_device_ops=ops)


def _train_dataset(config: BenchConfig):
    import inputs

    splits = inputs.load(config.dataset, seed=config.seed)
    return splits, inputs.train_batches(splits.train, global_batch_size=config.global_batch_size,
                                        seed=config.seed)


def _build(config: BenchConfig, splits):
    import models
    from engine import optimizers

    keras.utils.set_random_seed(config.seed)
    model = models.build(config.model, input_shape=splits.input_shape,
                         num_classes=splits.num_classes)
    return model, optimizers.build(config.optimizer, config.learning_rate)


def time_engine(config: BenchConfig, *, jit_compile: bool = False,
                mixed_precision: str = "float32", fused_optimizer: bool = False) -> list[float]:
    """Seconds per timed repetition of `engine.run.run`, one loop of `steps` each."""
    from engine.config import RunConfig
    from engine.run import run

    ends: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench_train-") as model_dir:
        run_config = RunConfig(
            strategy="mirrored", devices=_short(config.devices), collective=config.collective,
            model=config.model, dataset=config.dataset, model_dir=model_dir,
            global_batch_size=config.global_batch_size,
            train_steps=config.steps * (config.repetitions + 1), steps_per_loop=config.steps,
            checkpoint_interval=0, summary_interval=0, mode="train",
            optimizer=config.optimizer, learning_rate=config.learning_rate, seed=config.seed,
            jit_compile=jit_compile, mixed_precision=mixed_precision,
            fused_optimizer=fused_optimizer,
            # What the process already runs with, as every other variant does.
            intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
        )
        run(run_config, on_loop_end=lambda step, metrics: ends.append(time.perf_counter()))
    return [b - a for a, b in zip(ends, ends[1:])]


class _EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter())


def time_fit(config: BenchConfig, steps_per_execution: int) -> list[float]:
    """Seconds per timed epoch of `Model.fit` (one epoch = `steps` steps)."""
    splits, dataset = _train_dataset(config)
    strategy = baseline_strategy(config)
    with strategy.scope():
        model, optimizer = _build(config, splits)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    timer = _EpochTimer()
    model.fit(dataset, epochs=config.repetitions + 1, steps_per_epoch=config.steps, verbose=0,
              callbacks=[timer])
    return [b - a for a, b in zip(timer.ends, timer.ends[1:])]


def time_hand_loop(config: BenchConfig) -> list[float]:
    """Seconds per repetition of a minimal custom loop: `steps` steps in one tf.function."""
    splits, dataset = _train_dataset(config)
    strategy = baseline_strategy(config)
    with strategy.scope():
        model, optimizer = _build(config, splits)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    batch_size = config.global_batch_size

    def step(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.nn.compute_average_loss(
                keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True),
                global_batch_size=batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces

    @tf.function
    def loop(iterator, steps):
        for _ in tf.range(steps):
            strategy.run(step, args=(next(iterator),))

    steps = tf.constant(config.steps)
    seconds = []
    for repetition in range(config.repetitions + 1):
        began = time.perf_counter()
        loop(iterator, steps)
        if repetition:  # the first traces and warms up
            seconds.append(time.perf_counter() - began)
    return seconds


# --- the whole run --------------------------------------------------------------------------


@dataclasses.dataclass
class BenchResult:
    config: BenchConfig
    rows: list[Row]
    matmul_gflops: float
    train_flops_per_example: float
    machine: str

    def row(self, variant: str) -> Optional[Row]:
        return next((r for r in self.rows if r.variant == variant), None)

    def ratios(self) -> dict[str, dict[str, float]]:
        """{variant: {baseline variant: median / baseline median}}."""
        baselines = [r for r in self.rows if r.variant in ("fit", "fit_tuned", "hand_loop")]
        return {r.variant: {b.variant: r.median / b.median for b in baselines}
                for r in self.rows}

    def peak_fraction(self, row: Row) -> float:
        return row.median * self.train_flops_per_example / (self.matmul_gflops * 1e9)

    def as_dict(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config),
            "machine": self.machine,
            "num_devices": len(self.config.devices),
            "matmul_gflops": self.matmul_gflops,
            "train_flops_per_example": self.train_flops_per_example,
            "rows": [dict(dataclasses.asdict(r), peak_fraction=self.peak_fraction(r))
                     for r in self.rows],
            "ratios": self.ratios(),
        }


def machine_description() -> str:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = tf.config.list_physical_devices("GPU")
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    return (f"{cpu}, {os.cpu_count()} cores, {len(gpus)} GPU(s), TensorFlow {tf.__version__}, "
            f"Keras {keras.__version__}, intra-op threads {threads or 'default'}")


def run(config: BenchConfig, *, progress: Progress = print) -> BenchResult:
    """Times every variant in `config.variants`; writes JSON and prints the table."""
    import inputs
    import models

    tf.get_logger().setLevel("ERROR")
    splits = inputs.load(config.dataset, seed=config.seed)
    flops = train_flops_per_example(
        models.build(config.model, input_shape=splits.input_shape, num_classes=splits.num_classes),
        splits.input_shape)
    progress("measuring the float32 matmul rate ...")
    peak = matmul_gflops(config.devices)
    progress(f"  {peak:.1f} GFLOP/s; {config.model} trains at {flops / 1e6:.2f} MFLOP/example")

    examples = config.steps * config.global_batch_size
    # An epoch (one repetition) holds whole executions.
    spe = math.gcd(config.steps_per_execution, config.steps)
    plans = {
        "engine": (f"engine (steps_per_loop={config.steps})",
                   lambda: time_engine(config)),
        "engine+features": (f"engine + {config.features or 'no features'}",
                            lambda: time_engine(config, jit_compile=config.jit_compile,
                                                mixed_precision=config.mixed_precision,
                                                fused_optimizer=config.fused_optimizer)),
        "fit": ("Model.fit (steps_per_execution=1)", lambda: time_fit(config, 1)),
        "fit_tuned": (f"Model.fit (steps_per_execution={spe})", lambda: time_fit(config, spe)),
        "hand_loop": (f"hand-written loop ({config.steps} steps/tf.function)",
                      lambda: time_hand_loop(config)),
    }
    # Each round times every variant once, the order rotated from round to
    # round, so a busy stretch of a shared machine lands on different variants
    # instead of always on the one that happened to run then.
    seconds: dict[str, list[float]] = {variant: [] for variant in config.variants}
    for round_index in range(config.rounds):
        shift = round_index % len(config.variants)
        for variant in config.variants[shift:] + config.variants[:shift]:
            description, measure = plans[variant]
            _collect_garbage(progress)
            progress(f"[round {round_index + 1}/{config.rounds}] {description}: 1 warm-up + "
                     f"{config.repetitions} x {config.steps} steps on {len(config.devices)} "
                     "device(s) ...")
            began = time.perf_counter()
            seconds[variant].extend(measure())
            row = Row(variant, description, seconds[variant], examples)
            progress(f"  {row.median:,.0f} examples/s so far (min {row.low:,.0f}, max "
                     f"{row.high:,.0f}) [{time.perf_counter() - began:.0f}s]")
    rows = [Row(variant, plans[variant][0], seconds[variant], examples)
            for variant in config.variants]
    # Measured again at the end, best kept: on a shared machine one measurement
    # can land in someone else's busy second.
    peak = max(peak, matmul_gflops(config.devices))
    result = BenchResult(config, rows, peak, flops, machine_description())
    progress(format_table([result]))
    if config.output_dir:
        path = write_json(result, config.output_dir)
        progress(f"wrote {path}")
    return result


def _collect_garbage(progress: Progress) -> None:
    """Frees the previous variant's objects now, outside any timed section.

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


def write_json(result: BenchResult, output_dir: str) -> str:
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"bench_train_{result.config.model}_"
                                    f"{len(result.config.devices)}dev.json")
    with open(path, "w") as f:
        json.dump(result.as_dict(), f, indent=2)
        f.write("\n")
    return path


# --- reports --------------------------------------------------------------------------------


def format_table(results: Sequence[BenchResult | dict]) -> str:
    """One Markdown table: a row per (device count, variant)."""
    results = [r.as_dict() if isinstance(r, BenchResult) else r for r in results]
    header = ("| devices | variant | examples/s (median) | min – max | vs fit | vs fit tuned "
              "| vs hand loop | of matmul peak |")
    lines = [header, "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        ratios = result["ratios"]
        for row in result["rows"]:
            r = ratios[row["variant"]]
            cells = [str(result["num_devices"]), row["description"], f"{row['median']:,.0f}",
                     f"{row['low']:,.0f} – {row['high']:,.0f}"]
            cells += [f"{r[b]:.2f}×" if b in r else "–" for b in ("fit", "fit_tuned", "hand_loop")]
            cells.append(f"{row['peak_fraction']:.1%}")
            lines.append("| " + " | ".join(cells) + " |")
    first = results[0]
    lines.append("")
    lines.append(f"model {first['config']['model']}, global batch "
                 f"{first['config']['global_batch_size']}, optimizer "
                 f"{first['config']['optimizer']}, collective {first['config']['collective']}; "
                 f"{first['machine']}")
    for result in results:  # each device count ran in its own process
        lines.append(f"{result['num_devices']} device(s): float32 matmul rate "
                     f"{result['matmul_gflops']:.1f} GFLOP/s, "
                     f"{result['machine'].rsplit(', ', 1)[-1]}")
    return "\n".join(lines)


def plot(results: Sequence[dict], path: str) -> str:
    """examples/sec against device count, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    variants = [row["variant"] for row in results[0]["rows"]]
    for variant in variants:
        points = sorted((r["num_devices"], row) for r in results for row in r["rows"]
                        if row["variant"] == variant)
        xs = [n for n, _ in points]
        ax.errorbar(xs, [row["median"] for _, row in points],
                    yerr=[[row["median"] - row["low"] for _, row in points],
                          [row["high"] - row["median"] for _, row in points]],
                    marker="o", capsize=3, label=points[0][1]["description"])
    ax.set_xlabel("devices (logical CPUs)" if "cpu" in results[0]["config"]["devices"][0]
                  else "devices")
    ax.set_xticks(sorted({r["num_devices"] for r in results}))
    ax.set_ylabel("examples / second")
    config = results[0]["config"]
    ax.set_title(f"{config['model']}, global batch {config['global_batch_size']}, "
                 f"{config['optimizer']}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def sweep(device_counts: Sequence[int], device_kind: str, argv: Sequence[str], output_dir: str,
          *, script: str, progress: Progress = print) -> list[dict]:
    """Runs `script argv --devices=<kind>:0..N-1` once per count in a subprocess
    (logical devices are fixed per process); combines their JSON, prints one
    table, writes `bench_train.json` and the plot."""
    results = []
    for count in device_counts:
        devices = ",".join(f"{device_kind}:{i}" for i in range(count))
        sub_dir = os.path.join(output_dir, f"{count}dev")
        progress(f"=== {count} device(s): {devices}")
        subprocess.run([sys.executable, script, *argv, f"--devices={devices}",
                        "--device_counts=", f"--output_dir={sub_dir}"], check=True)
        [name] = [n for n in os.listdir(sub_dir) if n.endswith(".json")]
        with open(os.path.join(sub_dir, name)) as f:
            results.append(json.load(f))
    progress(format_table(results))
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "bench_train.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    figure = plot(results, os.path.join(output_dir, "bench_train.png"))
    progress(f"wrote {path}, {figure}")
    return results
