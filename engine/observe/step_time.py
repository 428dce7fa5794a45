"""Where a loop's time goes: input wait, all-reduce, and the rest (compute).

Every loop is timed on the host (its wall time: free). The per-step stamps
(`tf.timestamp()` inside the compiled loop) are taken only in *sampled*
loops (`engine.observe.clock.SampledClock`: the second loop, one in
`SAMPLE_EVERY` after (every loop where the straggler table compares the
workers of a cluster), and the loop after a SIGUSR1). A stamp is a host
op: one that waits for a device tensor makes the host wait for the device,
and the all-reduce held until its `ready` stamp makes the device wait for
the host, every step (on one H200, cnn at batch 256, that cost 0.64x the
hand-written loop's speed). An unsampled loop's graph holds no `Timestamp`
and no `held_until` identity: the trainer traces two loop functions, with
and without the stamps (`Stamps` / the do-nothing `engine.loop.contracts.StepStamps`).

A sampled loop takes them at three points of each step::

    batch = next(iterator);  got = now() once every replica's batch is there and
        the previous step has ended (its `stepped` stamp, carried by the loop)
        input wait += got - stepped        # the replicas waiting on tf.data (get_next)
    on each replica: ready = now() once its gradients are computed; the all-reduce
        starts only after `ready`; done = now() once it holds the reduced gradients
        all-reduce += max(done) - max(ready)    # from the last replica's arrival to
                                                # the last replica's result
    stepped = now() once the step's all-reduce is done and its updates applied
              (read after each optimizer's step counter, which the update increments)
    the loop's stamped seconds: the last `stepped` - the first (taken at its start)
        compute = stamped seconds - input wait - all-reduce
                  (forward, backward, the update, and the loop's own overhead)

So `input` is what tf.data failed to hide: with a pipeline that keeps ahead
(prefetch), the next batch is there when a step ends and the share is small;
a starved pipeline makes it most of the loop. (The iterations of the
compiled loop may overlap where nothing orders them: a stamp taken at the
top of the body could run while the previous step still computes, which is
why the wait is measured from the previous step's end.) `all_reduce` is the collective's own
time once every replica has arrived: a replica waiting for a slower one
counts in compute.

`Report`, a train action, turns that into: one line after the first sampled
loop and after the loop a SIGUSR1 asked for (`kill -USR1 <pid>`); a warning,
once, when a sampled loop is input-bound (input wait above `INPUT_BOUND` of
the loop) *and* the pipeline alone cannot keep up (`pipeline_rate`: its
batches per second, pulled without training from a pipeline built for the
probe, `AbstractTrainer.input_probe`, never from the run's own: a second
iterator of a seeded reshuffling dataset takes the seeds of the run's later
epochs, and resume would no longer be exact), under `KEEPS_UP` times the
loop's steps per second; a pipeline that can is waited on for the iterator's
own hand-over, which no tf.data remedy shortens; in a multi-worker cluster
the share alone decides: a probe would hold its peers); and TensorBoard scalars under `time/`
(`step_ms` from every loop's wall time, the shares from the latest sampled
loop; the peak memory under `memory/`) at the summaries' steps. See
docs/performance.md, "Where the time goes".
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time as clock_time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from tfloop.engine.loop import iterators
from tfloop.engine.loop.actions import Action, LoopEnd, crossed
from tfloop.engine.loop.contracts import StepStamps
from tfloop.engine.loop.summaries import SummaryWriter
from tfloop.engine.observe.step_flops import MFU
from tfloop.engine.runtime import hardware, signals

logger = logging.getLogger(__name__)

#: A loop whose replicas waited on tf.data this share of its time or more is input-bound.
INPUT_BOUND = 0.4
#: ...if the pipeline alone delivers under this many times the loop's steps per second.
KEEPS_UP = 2.0

#: What to do about an input-bound run (the warning's second half).
REMEDIES = ("prefetch (dataset.prefetch(tf.data.AUTOTUNE) last), parallel map "
            "(map(..., num_parallel_calls=tf.data.AUTOTUNE)), cache() what fits in memory "
            "after the expensive steps, or the tf.data service to preprocess on other "
            "machines (bin/data_service, --data_service; with it, more data workers) "
            "(docs/performance.md#where-the-time-goes)")


# --- inside the compiled loop of a sampled loop --------------------------------------------


def timestamps_allowed() -> bool:
    """Whether `tf.timestamp` runs here: not once op determinism is enabled
    (`--deterministic`: "Timestamp cannot be called when determinism is
    enabled"; process-wide, and the probe is the public way to ask). There
    no loop is sampled: its breakdown and the straggler table say so."""
    try:
        tf.timestamp()
    except tf.errors.FailedPreconditionError:
        return False
    return True


def now() -> tf.Tensor:
    """Seconds since the epoch (float64)."""
    return tf.timestamp()


def stamp_after(tensors) -> tf.Tensor:
    """Seconds since the epoch (float64), taken once all of `tensors` are computed."""
    with tf.control_dependencies([t for t in tf.nest.flatten(tensors) if t is not None]):
        return now()


def held_until(tensors: Sequence[tf.Tensor], stamp: tf.Tensor) -> list[tf.Tensor]:
    """`tensors` as they are, but not available before `stamp` is taken (so
    what consumes them starts after it)."""
    with tf.control_dependencies([stamp]):
        return [tf.identity(t, name="held_until") for t in tensors]


def zero() -> tf.Tensor:
    return tf.constant(0.0, tf.float64)


class Stamps(StepStamps):
    """The stamps of a sampled loop (see the module docstring): the trainer
    calls them where `engine.loop.contracts.StepStamps` says."""

    def start(self) -> dict:
        began = now()
        return {"input": zero(), "all_reduce": zero(), "stepped": began, "began": began}

    def input(self, state: dict, batch) -> dict:
        got = stamp_after([state["stepped"], batch])
        return {**state, "input": state["input"] + got - state["stepped"]}

    def ready(self, grads: list) -> tuple[list, tf.Tensor]:
        ready = stamp_after(grads)
        return held_until(grads, ready), ready

    def done(self, reduced) -> tf.Tensor:
        return stamp_after(reduced)

    def span(self, readies, dones) -> tf.Tensor:
        return tf.reduce_max(tf.stack(list(dones))) - tf.reduce_max(tf.stack(list(readies)))

    def all_reduce(self, state: dict, span) -> dict:
        return {**state, "all_reduce": state["all_reduce"] + span}

    def step_end(self, state: dict, tensors) -> dict:
        return {**state, "stepped": stamp_after(tensors)}

    def totals(self, state: dict) -> dict:
        return {"input": state["input"], "all_reduce": state["all_reduce"],
                "stamped": state["stepped"] - state["began"]}


# --- after the loop -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoopTime:
    """One loop's seconds: the whole (wall, on the host), and in a sampled
    loop the input wait and all-reduce in it (its stamped seconds: the
    stamps' own span, which leaves out the Python call and any tracing).

    `sampled`: the loop took per-step stamps (else `input` and `all_reduce`
    are 0 and mean nothing); `scheduled`: it was sampled by the schedule
    every worker follows alike (not only because a SIGUSR1 asked);
    `asked`: a SIGUSR1 asked for it.
    """

    start: int
    steps: int
    seconds: float
    input: float = 0.0
    all_reduce: float = 0.0
    sampled: bool = True
    scheduled: bool = True
    asked: bool = False
    stamped: Optional[float] = None

    @property
    def measured(self) -> float:
        """The seconds the shares divide: the stamped ones where there are."""
        return self.stamped if self.stamped else self.seconds

    @property
    def compute(self) -> float:
        return max(self.measured - self.input - self.all_reduce, 0.0)

    def shares(self) -> dict[str, float]:
        """Each part's fraction of the loop (they add up to 1)."""
        total = max(self.measured, self.input + self.all_reduce, 1e-12)
        return {"input": self.input / total, "all_reduce": self.all_reduce / total,
                "compute": self.compute / total}

    @property
    def input_bound(self) -> bool:
        return self.sampled and self.shares()["input"] >= INPUT_BOUND

    def scalars(self) -> dict[str, float]:
        """TensorBoard's `time/` share scalars (a sampled loop's)."""
        shares = self.shares()
        return {"time/input_share": shares["input"], "time/all_reduce_share": shares["all_reduce"],
                "time/compute_share": shares["compute"]}


def describe(time: LoopTime, mfu: Optional[float] = None,
             memory: Optional[dict] = None) -> str:
    """The one line: steps, ms/step, the shares, mfu and peak memory."""
    shares = time.shares()
    text = (f"step time, steps {time.start + 1}-{time.start + time.steps}: "
            f"{1e3 * time.measured / max(time.steps, 1):.2f} ms/step = input wait "
            f"{shares['input']:.0%} + all-reduce {shares['all_reduce']:.0%} + compute "
            f"{shares['compute']:.0%}")
    if mfu is not None:
        text += f"; mfu {mfu:.1%}"
    if memory:
        text += "; peak memory " + ", ".join(
            f"{name.replace('_peak_mb', '')} {value:,.0f} MB" for name, value in memory.items())
    return text


def pipeline_rate(dataset: tf.data.Dataset, *, batches: int = 20,
                  seconds: float = 2.0) -> Optional[float]:
    """Batches per second `dataset` delivers alone (a pipeline built for the
    probe, never the run's; a fresh iterator, no training; at most `batches` after the first, or `seconds`); None when it
    cannot be read (an empty or failing pipeline: no claim either way).

    Pulled on a thread of its own and waited for `seconds` plus the first
    batch's `seconds`, no longer: one batch that blocks (a pipeline waiting
    on storage) counts as a pipeline that does not keep up, and the run
    goes on (the thread ends with its next batch)."""
    progress = {"pulled": 0, "began": None, "failed": False}

    def pull():
        try:
            # No autotune thread for the iterator's destructor to wait out.
            iterator = iter(iterators.without_autotune(dataset))
            next(iterator)
            progress["began"] = clock_time.perf_counter()
            while (progress["pulled"] < batches
                   and clock_time.perf_counter() - progress["began"] < seconds):
                next(iterator)
                progress["pulled"] += 1
        except (StopIteration, tf.errors.OpError, TypeError, ValueError) as error:
            logger.debug("could not measure the input pipeline's own rate: %s", error)
            progress["failed"] = True

    thread = threading.Thread(target=pull, name="tfloop-pipeline-rate", daemon=True)
    thread.start()
    thread.join(2 * seconds)
    if progress["failed"] and not progress["pulled"]:
        return None
    began = progress["began"]
    if began is None:
        return 0.0  # not even the first batch in that time
    elapsed = clock_time.perf_counter() - began if thread.is_alive() else None
    if elapsed is None:
        elapsed = max(min(seconds, clock_time.perf_counter() - began), 1e-9)
    return progress["pulled"] / elapsed


class Report(Action):
    """The breakdown's line, warning and TensorBoard scalars (see the module docstring).

    Args:
      clock: the trainer's clock (`engine.observe.clock.SampledClock`): its
        `last` loop's `LoopTime` (None before any) and `ask()` (SIGUSR1).
      writer: where `time/` and `memory/` scalars go (None: a worker that is
        not the chief; it still logs its own line).
      interval: the summaries' interval (`--summary_interval`; 0: no scalars).
      devices: the run's local devices (the GPUs among them: their memory).
      pipeline_rate: `() -> batches/s` of the training input alone (None:
        unknown), asked once, when a sampled loop looks input-bound.
    """

    def __init__(self, *, clock, writer: Optional[SummaryWriter], interval: int,
                 devices: Sequence[str] = (),
                 pipeline_rate: Optional[Callable[[], Optional[float]]] = None):
        self.clock = clock
        self.writer = writer
        self.interval = interval
        self.devices = tuple(devices)
        self.pipeline_rate = pipeline_rate
        self.loops = 0
        self.warned = False
        self.judged = False
        self.sample: Optional[LoopTime] = None
        self._asking: Optional[signals.Installed] = None
        self._reported: Optional[LoopTime] = None

    def train_begin(self, step: int) -> None:
        self.loops = 0
        if self._asking is None and hasattr(signal, "SIGUSR1"):  # once, until close
            self._asking = signals.install(signal.SIGUSR1, self._ask)

    def _ask(self, signum, frame) -> None:
        self.clock.ask()  # the next loop is sampled; its line printed at its end

    def __call__(self, loop: LoopEnd) -> None:
        time = self.clock.last
        if time is None:
            return
        self.loops += 1
        mfu = loop.metrics.get(MFU)
        if time.sampled:
            first = self.sample is None
            self.sample = time
            if first or time.asked:
                self._log(time, mfu)
            if time.input_bound and not self.warned and not self.judged:
                self._judge(time)
        if (self.writer is not None and self.interval and self.loops >= 2
                and (crossed(loop.start, loop.step, self.interval) or loop.step >= loop.target)):
            scalars = {"time/step_ms": 1e3 * time.seconds / max(time.steps, 1)}
            if self.sample is not None:
                scalars.update(self.sample.scalars())
            self.writer.write(loop.step, {**scalars, **{
                f"memory/{name}": value
                for name, value in hardware.peak_memory(self.devices).items()}})

    def _judge(self, time: LoopTime) -> None:
        """Warns once that the run is input-bound, unless the pipeline alone
        keeps well ahead of the loop (then the wait is the iterator's own
        hand-over: said once, at info)."""
        self.judged = True
        rate = self.pipeline_rate() if self.pipeline_rate is not None else None
        steps_per_second = time.steps / max(time.measured, 1e-12)
        share = 100 * time.shares()["input"]
        span = f"steps {time.start + 1}-{time.start + time.steps}"
        if rate is not None and rate >= KEEPS_UP * steps_per_second:
            logger.info("input wait %.0f%% of %s, but the input pipeline alone delivers %.0f "
                        "batches/s, %.1fx the loop's %.0f steps/s: not input-bound (the wait "
                        "is the distributed iterator's hand-over and the host's load)",
                        share, span, rate, rate / steps_per_second, steps_per_second)
            return
        self.warned = True
        alone = (f" (the pipeline alone delivers {rate:.0f} batches/s against "
                 f"{steps_per_second:.0f} steps/s)" if rate is not None else "")
        logger.warning("input-bound: the replicas waited on tf.data for %.0f%% of %s%s; speed "
                       "up the input pipeline: %s", share, span, alone, REMEDIES)

    def _log(self, time: LoopTime, mfu: Optional[float]) -> None:
        self._reported = time
        logger.info(describe(time, mfu, hardware.peak_memory(self.devices)))

    def close(self) -> None:
        if self._asking is not None:
            self._asking.restore()
            self._asking = None
        time = self.clock.last
        if self.loops == 1 and time is not None and self._reported is None:
            # A run of one loop: its wall time includes tracing, but it is all there is.
            logger.info("loop time, steps %d-%d: %.2f ms/step (one loop, tracing included; "
                        "no breakdown: the first loop is not sampled)", time.start + 1,
                        time.start + time.steps, 1e3 * time.seconds / max(time.steps, 1))


def for_trainer(trainer, *, writer: Optional[SummaryWriter], interval: int) -> Optional[Report]:
    """The report of a trainer whose clock times its loops (the engine's
    `Trainer` with a `SampledClock`); None for no trainer or one that does
    not (the parameter-server trainer's steps run on other machines)."""
    clock = getattr(trainer, "clock", None)
    if trainer is None or clock is None or not hasattr(clock, "ask"):
        return None
    build = trainer.input_probe
    devices = hardware.local_devices(trainer.strategy)
    # Not in a cluster: the probe would hold this worker while its peers wait
    # in the next collective (there the share decides, and the straggler line
    # names a worker whose input is slow).
    alone = trainer.strategy.num_replicas_in_sync <= len(devices)
    return Report(clock=clock, writer=writer, interval=interval, devices=devices,
                  pipeline_rate=(lambda: probe_rate(build))
                  if build is not None and alone else None)


def probe_rate(build: Callable[[], Optional[tf.data.Dataset]]) -> Optional[float]:
    """`pipeline_rate` of the dataset `build` makes for the probe (a pipeline
    of its own: the run's is never read here); None without one."""
    dataset = build()
    return pipeline_rate(dataset) if dataset is not None else None
