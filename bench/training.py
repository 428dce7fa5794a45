"""Training throughput side by side: the engine, `Model.fit`, a hand-written loop.

`bin/bench_train` is flags and one call of `main` here. In one process, on the
same model, data pipeline, strategy, devices and optimizer, it times:

  engine            `engine.run.run(RunConfig)`: bin/train's own code path
                    (Controller, Trainer, collective, checkpoint at the end),
                    timed from outside between loop ends (`on_loop_end`), so
                    every bit of per-loop Python the engine does is counted;
  engine+features   the same with the speed flags asked for (`--jit_compile`,
                    `--mixed_precision`; `--nofused_optimizer` for Keras's own
                    update instead of the engine's default fused one);
  fit               `Model.fit`, compiled under the same strategy (the
                    strategy's all-reduce set to the engine's collective when
                    that is one of TF's cross-device ops), default
                    `steps_per_execution=1`;
  fit spe=N         the same with `steps_per_execution=N` (tuned);
  hand loop         the loop a user would write: `strategy.run` of a
                    GradientTape step, `steps` of them inside one
                    `tf.function`, the Keras optimizer's own all-reduce.

Each variant runs `warmup` untimed repetitions (2 by default: its one-time
work is done by then: the engine's first loop traces and warms its sampled
loop, its second is that sampled loop, after which it measures the devices'
peak and counts the step's FLOPs (on CPUs
too: the benchmark times a long run's loops, `engine.observe.clock`); fit's and
the hand loop's first traces) and then `repetitions` (5) timed repetitions
of `steps` steps, in `rounds` rounds of rotated order (`bench.timing`); the
report (`bench.report`) gives the median examples/sec, the spread (min and
max), ratios against each baseline, and `mfu` by the engine's one
definition: the step's FLOPs counted from its graph
(`engine.observe.step_flops`) over the devices' peak
(`engine.runtime.hardware.peak`: a GPU's datasheet dense rate in the compute
dtype, a measured matmul rate for CPUs), the same number the progress line,
TensorBoard and metrics.json give; and beside it the fraction of the float32
matmul rate measured in the same run ("of measured matmul").

The data is the engine's own (`--dataset`, `--image_size`, `--num_classes`):
`--model=resnet50` and `mobilenet_v2` on synthetic data get ImageNet-sized
images (224x224x3, 1000 classes) unless told otherwise. With
`--synthetic_on_device` every variant trains on one batch kept on the
devices (compute alone). `--tiny_step` times one device at global batch 8:
the loops' per-step overhead alone.
Logical CPU devices can be configured once per process, so a sweep over
device counts runs one subprocess per count (`bench.sweep`) and plots
examples/sec against them.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.bench import input_pipeline, report, sweep, timing
from tfloop.engine.loop import iterators
from tfloop.engine.loop.replica_step import replica_gradients
from tfloop.engine.loop.trainer import INPUT_OPTIONS
from tfloop.engine.observe import step_flops
from tfloop.bench.timing import Progress
from tfloop.bench.variants import DEFAULT_VARIANTS, VARIANTS
from tfloop.collectives import device_names
from tfloop.engine.config import RunConfig
from tfloop.engine.runtime import devices as engine_devices
from tfloop.engine.runtime import hardware
from tfloop.engine.errors import ConfigError
from tfloop.engine.task.losses import classification_loss

#: Models whose synthetic data defaults to ImageNet's size (they need >= 32x32).
IMAGENET_MODELS = ("resnet50", "mobilenet_v2")
IMAGENET_SIZE, IMAGENET_CLASSES = 224, 1000


def check_names(*, variants: Sequence[str], mixed_precision: str, model: str,
                optimizer: str) -> None:
    """Refuses an unknown variant, precision policy, model or optimizer, in that order."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ConfigError(f"--variants: {', '.join(unknown)} is not a variant; choose from: "
                          f"{', '.join(VARIANTS)}")
    from tfloop.engine.config import PRECISIONS

    if mixed_precision not in PRECISIONS:
        raise ConfigError(f"--mixed_precision={mixed_precision!r} is not a policy; "
                          f"choose one of: {', '.join(PRECISIONS)}")
    from tfloop import models
    from tfloop.engine.recipe import optimizers

    models.check(model)
    optimizers.check(optimizer)


@dataclasses.dataclass(frozen=True)
class TrainBenchConfig:
    """What to time; `variants` from `VARIANTS` (checked by `check_names`)."""

    model: str = "mlp"
    dataset: str = "synthetic"
    data_dir: str = ""
    augment: str = ""  # the dataset's own default (imagenet: inception)
    devices: tuple[str, ...] = ("/cpu:0",)
    global_batch_size: int = 256
    collective: str = "auto"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    steps: int = 100
    repetitions: int = 5
    warmup: int = 2
    rounds: int = 1
    steps_per_execution: int = 100
    jit_compile: bool = False
    mixed_precision: str = "float32"
    fused_optimizer: bool = RunConfig.fused_optimizer  # the engine's default (the fused update)
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    output_dir: str = ""
    seed: int = 0
    image_size: int = 0
    num_classes: int = 0
    synthetic_on_device: bool = False

    def __post_init__(self):
        for name in ("global_batch_size", "steps", "repetitions", "rounds", "steps_per_execution",
                     "warmup"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name}={getattr(self, name)} must be a positive integer")

    @property
    def features(self) -> str:
        """What `engine+features` turns on, in flag form."""
        on = ["jit_compile"] if self.jit_compile else []
        if not self.fused_optimizer:  # the engine's default is the fused update
            on.append("nofused_optimizer")
        if self.mixed_precision != "float32":
            on.append(f"mixed_precision={self.mixed_precision}")
        return ",".join(on)


@dataclasses.dataclass
class VariantRow:
    """One variant's timed repetitions and their examples/sec."""

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


# --- model arithmetic ---------------------------------------------------------------------


def train_flops_per_example(config: "TrainBenchConfig", splits) -> Optional[float]:
    """FLOPs of one example's training step, as the engine counts them for
    `mfu` (`engine.observe.step_flops`: the replica's forward and backward
    pass traced at the per-replica batch), divided by that batch."""
    from tfloop import models

    per_replica = config.global_batch_size // len(config.devices)
    model = models.build(config.model, input_shape=splits.input_shape,
                         num_classes=splits.num_classes)
    spec = (tf.TensorSpec([per_replica, *splits.input_shape], tf.uint8),
            tf.TensorSpec([per_replica], tf.int64))

    def loss(model, batch, *, training):
        images, labels = batch
        return classification_loss(model, (_to_float(images), labels), training=training)

    optimizer = keras.optimizers.SGD()  # made outside the traced function
    flops = step_flops.count(lambda batch: replica_gradients(
        loss, model, batch, model.trainable_variables, optimizer=optimizer,
        global_batch_size=config.global_batch_size), spec)
    return flops / per_replica if flops else None


def _to_float(images):
    from tfloop import inputs

    return inputs.to_float(images)


# --- the variants ---------------------------------------------------------------------------


def _collective(config: TrainBenchConfig):
    from tfloop import collectives

    return collectives.create(config.collective, devices=list(config.devices))


def baseline_strategy(config: TrainBenchConfig) -> tf.distribute.Strategy:
    """`MirroredStrategy` over the devices, all-reducing the way the engine's
    collective does when that is one of TF's cross-device ops."""
    from tfloop.collectives.base import CrossDeviceOpsCollective

    collective = _collective(config)
    target = getattr(collective, "chosen", None) or collective  # auto → what it picked
    ops = None
    if len(config.devices) > 1 and isinstance(target, CrossDeviceOpsCollective):
        ops = target.cross_device_ops(tuple(config.devices))
    return tf.distribute.MirroredStrategy(list(config.devices), cross_device_ops=ops)


def _splits(config: TrainBenchConfig):
    from tfloop import inputs

    return inputs.load(config.dataset, data_dir=config.data_dir, seed=config.seed,
                       image_size=config.image_size, num_classes=config.num_classes,
                       augment=config.augment)


def _train_dataset(config: TrainBenchConfig, image_dtype: str = "float32"):
    """The engine's pipeline over the same data: float32 for `Model.fit` (as
    a Keras user feeds it), uint8 cast on the device for the hand loop (as
    the engine does)."""
    from tfloop import inputs

    splits = _splits(config)
    return splits, inputs.train_batches(splits.train, global_batch_size=config.global_batch_size,
                                        seed=config.seed, image_dtype=image_dtype)


def _build(config: TrainBenchConfig, splits):
    from tfloop import models
    from tfloop.engine.recipe import optimizers

    keras.utils.set_random_seed(config.seed)
    model = models.build(config.model, input_shape=splits.input_shape,
                         num_classes=splits.num_classes)
    return model, optimizers.build(config.optimizer, config.learning_rate)


def run_config(config: TrainBenchConfig, model_dir: str, **fields) -> RunConfig:
    """The `RunConfig` bin/train would run for `config` (`fields` override it)."""
    values = dict(
        strategy="mirrored", devices=device_names.short_list(config.devices),
        collective=config.collective, model=config.model, dataset=config.dataset,
        data_dir=config.data_dir, augment=config.augment, model_dir=model_dir,
        image_size=config.image_size, num_classes=config.num_classes,
        synthetic_on_device=config.synthetic_on_device,
        global_batch_size=config.global_batch_size,
        train_steps=config.steps * (config.repetitions + config.warmup),
        steps_per_loop=config.steps,
        checkpoint_interval=0, summary_interval=0, mode="train",
        export=False,  # the model_dir is a temporary folder: nothing would read an export
        optimizer=config.optimizer, learning_rate=config.learning_rate, seed=config.seed,
        # What the process already runs with, as every other variant does.
        intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
    )
    return RunConfig(**dict(values, **fields))


def time_engine(config: TrainBenchConfig, **speed_flags) -> list[float]:
    """Seconds per timed repetition of `engine.assembly.run.run`, one loop of `steps` each.

    `speed_flags`: `RunConfig` fields to set (`jit_compile`, `mixed_precision`,
    `fused_optimizer`; `synthetic_on_device` for the step alone); the
    engine's own defaults otherwise."""
    from tfloop.engine.assembly.run import run
    from tfloop.engine.observe import clock

    ends: list[float] = []
    # The loops of a long run, whatever this one's length: on CPUs a short run
    # would keep the per-step stamps in every loop (engine.observe.clock).
    short_runs_stamped, clock.SHORT_RUNS_STAMPED = clock.SHORT_RUNS_STAMPED, False
    try:
        with tempfile.TemporaryDirectory(prefix="bench_train-") as model_dir:
            run(run_config(config, model_dir, **speed_flags),
                on_loop_end=lambda step, metrics: ends.append(time.perf_counter()))
    finally:
        clock.SHORT_RUNS_STAMPED = short_runs_stamped
    # Loop k's seconds: from the end of loop k-1 (the first loop, which
    # traces, has no start here and is always warm-up).
    return [b - a for a, b in zip(ends, ends[1:])][config.warmup - 1:]


def time_input(config: TrainBenchConfig) -> list[float]:
    """Seconds per repetition of `steps` batches of the run's own training
    pipeline, built anew and pulled alone (`bench.input_pipeline`)."""
    with tempfile.TemporaryDirectory(prefix="bench_train-") as model_dir:
        dataset = input_pipeline.run_pipeline(run_config(config, model_dir))
    return input_pipeline.time_batches(dataset, steps=config.steps,
                                       repetitions=config.repetitions, warmup=config.warmup)


class _EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter())


def time_fit(config: TrainBenchConfig, steps_per_execution: int) -> list[float]:
    """Seconds per timed epoch of `Model.fit` (one epoch = `steps` steps).
    With `synthetic_on_device`, one batch repeated from memory: Keras has no
    way to keep its input on the device."""
    splits, dataset = _train_dataset(config)
    if config.synthetic_on_device:
        dataset = dataset.take(1).cache().repeat()
    strategy = baseline_strategy(config)
    with strategy.scope():
        model, optimizer = _build(config, splits)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    timer = _EpochTimer()
    model.fit(dataset, epochs=config.repetitions + config.warmup, steps_per_epoch=config.steps,
              verbose=0, callbacks=[timer])
    return [b - a for a, b in zip(timer.ends, timer.ends[1:])][config.warmup - 1:]


def time_hand_loop(config: TrainBenchConfig) -> list[float]:
    """Seconds per repetition of a minimal custom loop: `steps` steps in one tf.function."""
    splits, dataset = _train_dataset(config, image_dtype="uint8")
    strategy = baseline_strategy(config)
    with strategy.scope():
        model, optimizer = _build(config, splits)
    iterator = iterators.distributed(
        strategy.experimental_distribute_dataset(dataset, options=INPUT_OPTIONS))
    on_device = next(iterator) if config.synthetic_on_device else None
    batch_size = config.global_batch_size

    def step(batch):
        images, labels = batch
        images = _to_float(images)  # on the device, as the engine's task does
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
            strategy.run(step, args=(on_device if on_device is not None else next(iterator),))
        return optimizer.iterations

    steps = tf.constant(config.steps)
    seconds = []
    for repetition in range(config.repetitions + config.warmup):
        began = time.perf_counter()
        loop(iterator, steps).numpy()  # on a GPU the call returns before its kernels end
        if repetition >= config.warmup:  # the first traces
            seconds.append(time.perf_counter() - began)
    return seconds


# --- the whole run --------------------------------------------------------------------------


@dataclasses.dataclass
class TrainBenchResult:
    """Every variant on one device layout, and what the rates compare with."""

    config: TrainBenchConfig
    rows: list[VariantRow]
    matmul_gflops: float
    train_flops_per_example: Optional[float]
    machine: str
    #: precision -> the devices' peak (`engine.runtime.hardware.peak`): what mfu divides by.
    peaks: dict = dataclasses.field(default_factory=dict)
    #: The cores the process could use (the input pipeline's).
    cores: int = dataclasses.field(default_factory=input_pipeline.cores)

    def verdict(self) -> Optional[input_pipeline.Verdict]:
        """Input or step: which bounds the run (with the `input` and `step` rows)."""
        return input_pipeline.verdict(self.rows, self.cores)

    def row(self, variant: str) -> Optional[VariantRow]:
        return next((r for r in self.rows if r.variant == variant), None)

    def ratios(self) -> dict[str, dict[str, float]]:
        """{variant: {baseline variant: median / baseline median}}."""
        baselines = [r for r in self.rows if r.variant in ("fit", "fit_tuned", "hand_loop")]
        return {r.variant: ({b.variant: r.median / b.median for b in baselines}
                            if r.variant != "input" else {})  # no step: no ratio to a loop
                for r in self.rows}

    def precision(self, row: VariantRow) -> str:
        """The compute dtype policy the row trained in."""
        return self.config.mixed_precision if row.variant == "engine+features" else "float32"

    def mfu(self, row: VariantRow) -> Optional[float]:
        """The engine's mfu (`engine.observe.step_flops.mfu`) of the row's median."""
        peak = self.peaks.get(self.precision(row))
        if not self.train_flops_per_example or peak is None or row.variant == "input":
            return None
        return step_flops.mfu(self.train_flops_per_example * self.config.global_batch_size,
                              1, self.config.global_batch_size / row.median,
                              peak.flops_per_second)

    def peak_fraction(self, row: VariantRow) -> Optional[float]:
        """Of the float32 matmul rate measured in this run ("of measured matmul");
        none for a row that computed in another dtype (mixed_float16 work over a
        float32 rate read 356% on an H200: the column would mislead)."""
        if (not self.train_flops_per_example or self.precision(row) != "float32"
                or row.variant == "input"):
            return None
        return row.median * self.train_flops_per_example / (self.matmul_gflops * 1e9)

    def as_dict(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config),
            "machine": self.machine,
            "num_devices": len(self.config.devices),
            "matmul_gflops": self.matmul_gflops,
            "train_flops_per_example": self.train_flops_per_example,
            "peaks": {precision: {"flops_per_second": peak.flops_per_second,
                                  "source": peak.source}
                      for precision, peak in self.peaks.items()},
            "rows": [dict(dataclasses.asdict(r), mfu=self.mfu(r),
                          peak_fraction=self.peak_fraction(r)) for r in self.rows],
            "ratios": self.ratios(),
            "cores": self.cores,
            "bound": _verdict_dict(self.verdict()),
        }


def _verdict_dict(verdict: Optional[input_pipeline.Verdict]) -> Optional[dict]:
    if verdict is None:
        return None
    return dict(dataclasses.asdict(verdict), bound=verdict.bound, ratio=verdict.ratio,
                per_core=verdict.per_core, cores_needed=verdict.cores_needed,
                line=verdict.line())


def _plans(config: TrainBenchConfig) -> dict[str, tuple[str, Callable[[], list[float]]]]:
    """variant → (its description in the table, what times it)."""
    # An epoch (one repetition) holds whole executions.
    spe = math.gcd(config.steps_per_execution, config.steps)
    return {
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
        "input": (f"input pipeline alone ({input_pipeline.cores()} cores, no step)",
                  lambda: time_input(config)),
        "step": ("engine, input on the devices (the step alone)",
                 lambda: time_engine(config, synthetic_on_device=True)),
    }


def _time_rounds(config: TrainBenchConfig, progress: Progress) -> list[VariantRow]:
    """Each round times every variant once, the order rotated from round to
    round, so a busy stretch of a shared machine lands on different variants
    instead of always on the one that happened to run then."""
    plans = _plans(config)
    examples = config.steps * config.global_batch_size
    seconds: dict[str, list[float]] = {variant: [] for variant in config.variants}
    for round_index in range(config.rounds):
        for variant in timing.rotated(config.variants, round_index):
            description, measure = plans[variant]
            timing.collect_garbage(progress)
            progress(f"[round {round_index + 1}/{config.rounds}] {description}: "
                     f"{config.warmup} warm-up + "
                     f"{config.repetitions} x {config.steps} steps on {len(config.devices)} "
                     "device(s) ...")
            began = time.perf_counter()
            seconds[variant].extend(measure())
            row = VariantRow(variant, description, seconds[variant], examples)
            progress(f"  {row.median:,.0f} examples/s so far (min {row.low:,.0f}, max "
                     f"{row.high:,.0f}) [{time.perf_counter() - began:.0f}s]")
    return [VariantRow(variant, plans[variant][0], seconds[variant], examples)
            for variant in config.variants]


def run(config: TrainBenchConfig, *, progress: Progress = print) -> TrainBenchResult:
    """Times every variant in `config.variants`; writes JSON and prints the table."""
    tf.get_logger().setLevel("ERROR")
    splits = _splits(config)
    flops = train_flops_per_example(config, splits)
    progress(f"{timing.machine_description()}")
    progress("measuring the float32 matmul rate ...")
    matmul = timing.matmul_gflops(config.devices)
    peaks = {precision: hardware.peak(config.devices, precision)
             for precision in sorted({"float32", config.mixed_precision})}
    progress(f"  {matmul:.1f} GFLOP/s; {config.model} on {'x'.join(map(str, splits.input_shape))} "
             f"images trains at {(flops or 0) / 1e6:.2f} MFLOP/example; mfu against "
             + "; ".join(f"{p}: {peak.flops_per_second / 1e12:.3g} TFLOP/s ({peak.source})"
                         for p, peak in peaks.items()))
    rows = _time_rounds(config, progress)
    # Measured again at the end, best kept: on a shared machine one measurement
    # can land in someone else's busy second.
    matmul = max(matmul, timing.matmul_gflops(config.devices))
    result = TrainBenchResult(config, rows, matmul, flops, timing.machine_description(),
                              peaks=peaks)
    progress(report.training_table([result]))
    if config.output_dir:
        path = report.write_training_result(result, config.output_dir)
        progress(f"wrote {path}")
    return result


def imagenet_defaults(options: dict, progress: Progress = print) -> dict:
    """`options` with ImageNet-sized synthetic data for the models that need
    it (`IMAGENET_MODELS`), where no size was asked for."""
    if (options.get("dataset") == "synthetic" and options.get("model") in IMAGENET_MODELS
            and not options.get("image_size")):
        options = dict(options, image_size=IMAGENET_SIZE,
                       num_classes=options.get("num_classes") or IMAGENET_CLASSES)
        progress(f"--model={options['model']}: synthetic {IMAGENET_SIZE}x{IMAGENET_SIZE}x3 "
                 f"images of {options['num_classes']} classes (--image_size, --num_classes "
                 "say otherwise)")
    return options


#: `--tiny_step`: one device, this global batch: the per-step overhead alone.
TINY_BATCH = 8


def main(*, devices: str, device_counts: Sequence[str] = (), intra_op_threads: int = -1,
         argv: Sequence[str] = (), script: str = "", progress: Progress = print,
         plot: bool = True, tiny_step: bool = False, **options: Any) -> None:
    """What `bin/bench_train` does with its flags' values.

    `options` are `TrainBenchConfig`'s fields but `devices`. With
    `device_counts`, runs `script argv` once per count instead (`bench.sweep`);
    otherwise times the variants on `devices` ("cpu:0,cpu:1") in this process.
    `plot`: draw `bench_train.png` after a sweep; without matplotlib that is
    refused before the sweep starts (`report.NO_PLOT`). `tiny_step`: the
    first device of `devices` only, global batch `TINY_BATCH` (overrides
    both): a step so small that the loops' own per-step cost is what is timed.
    """
    check_names(variants=options["variants"], mixed_precision=options["mixed_precision"],
                model=options["model"], optimizer=options["optimizer"])
    names = engine_devices.parse_devices(devices)
    if tiny_step:
        if device_counts:
            raise ConfigError("--tiny_step times one device; drop --device_counts")
        names = names[:1]
        options = dict(options, global_batch_size=TINY_BATCH)
        progress(f"tiny step: 1 device ({device_names.short_list(names)}), global batch "
                 f"{TINY_BATCH}: the per-step overhead of each loop")
    options = imagenet_defaults(options, progress)
    global_batch_size = options["global_batch_size"]
    if device_counts:
        counts = sweep.parse_device_counts(device_counts, global_batch_size=global_batch_size)
        if plot and not report.can_plot():
            raise ConfigError(report.NO_PLOT)
        sweep.sweep(counts, device_names.kind(names[0]), sweep.child_args(argv),
                    options["output_dir"], script=script, progress=progress, plot=plot)
        return
    if global_batch_size % len(names):
        raise ConfigError(f"--global_batch_size={global_batch_size} does not divide by the "
                          f"{len(names)} devices")
    config = TrainBenchConfig(devices=tuple(names), **options)
    names = engine_devices.prepare_devices(names)  # GPUs renumbered as the process sees them
    config = dataclasses.replace(config, devices=tuple(names))
    engine_devices.configure_threads(names, intra_op_threads)
    run(config, progress=progress)
