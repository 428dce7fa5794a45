"""Where a loop's time goes: input wait, all-reduce, and the rest (compute).

Measured on the real loop, every loop, by timestamps inside the compiled
loop (`tf.timestamp()`, a few microseconds a step) that the trainer
(`engine.loop.trainer`) takes at three points of each step::

    batch = next(iterator);  got = now() once every replica's batch is there and
        the previous step has ended (its `stepped` stamp, carried by the loop)
        input wait += got - stepped        # the replicas waiting on tf.data (get_next)
    on each replica: ready = now() once its gradients are computed; the all-reduce
        starts only after `ready`; done = now() once it holds the reduced gradients
        all-reduce += max(done) - max(ready)    # from the last replica's arrival to
                                                # the last replica's result
    stepped = now() once the step's all-reduce is done and its updates applied
              (read after each optimizer's step counter, which the update increments)
    the loop's seconds: wall time of the trainer's call (as steps/s takes it)
        compute = seconds - input wait - all-reduce
                  (forward, backward, the update, and the loop's own overhead)

So `input` is what tf.data failed to hide: with a pipeline that keeps ahead
(prefetch), the next batch is there when a step ends and the share is small;
a starved pipeline makes it most of the loop. (The iterations of the
compiled loop may overlap where nothing orders them: a stamp taken at the
top of the body could run while the previous step still computes, which is
why the wait is measured from the previous step's end.) `all_reduce` is the collective's own
time once every replica has arrived: a replica waiting for a slower one
counts in compute.

`Report`, a train action, turns that into: one line after warm-up (the
second loop; the first traces and compiles) and whenever the process gets
SIGUSR1 (`kill -USR1 <pid>`: at the next loop end); a warning, once, when a
loop is input-bound (input wait above `INPUT_BOUND` of the loop), naming
the remedies; and TensorBoard scalars under `time/` (and the peak memory
under `memory/`) at the summaries' steps. See docs/performance.md, "Where
the time goes".
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from typing import Callable, Optional, Sequence

import tensorflow as tf

from tfloop.engine.loop.actions import Action, LoopEnd, crossed
from tfloop.engine.loop.step_flops import MFU
from tfloop.engine.loop.summaries import SummaryWriter
from tfloop.engine.runtime import hardware

logger = logging.getLogger(__name__)

#: A loop whose replicas waited on tf.data this share of its time or more is input-bound.
INPUT_BOUND = 0.4

#: What to do about an input-bound run (the warning's second half).
REMEDIES = ("prefetch (dataset.prefetch(tf.data.AUTOTUNE) last), parallel map "
            "(map(..., num_parallel_calls=tf.data.AUTOTUNE)), cache() what fits in memory "
            "after the expensive steps, or the tf.data service to preprocess on other "
            "machines (docs/performance.md#where-the-time-goes)")


# --- inside the compiled loop ------------------------------------------------------------


def timestamps_allowed() -> bool:
    """Whether `tf.timestamp` runs here: not once op determinism is enabled
    (`--deterministic`: "Timestamp cannot be called when determinism is
    enabled"; process-wide, and the probe is the public way to ask). There
    the loop is not timed: its breakdown, mfu and the straggler table say so."""
    try:
        tf.timestamp()
    except tf.errors.FailedPreconditionError:
        return False
    return True


def now(timed: bool = True) -> tf.Tensor:
    """Seconds since the epoch (float64); 0 when the loop is not `timed`."""
    return tf.timestamp() if timed else zero()


def stamp_after(tensors, timed: bool = True) -> tf.Tensor:
    """Seconds since the epoch (float64), taken once all of `tensors` are
    computed; 0 when the loop is not `timed`."""
    with tf.control_dependencies([t for t in tf.nest.flatten(tensors) if t is not None]):
        return now(timed)


def held_until(tensors: Sequence[tf.Tensor], stamp: tf.Tensor) -> list[tf.Tensor]:
    """`tensors` as they are, but not available before `stamp` is taken (so
    what consumes them starts after it)."""
    with tf.control_dependencies([stamp]):
        return [tf.identity(t) for t in tensors]


def zero() -> tf.Tensor:
    return tf.constant(0.0, tf.float64)


# --- after the loop -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoopTime:
    """One loop's seconds: the whole (wall), and the input wait and all-reduce in it."""

    start: int
    steps: int
    seconds: float
    input: float
    all_reduce: float

    @property
    def compute(self) -> float:
        return max(self.seconds - self.input - self.all_reduce, 0.0)

    def shares(self) -> dict[str, float]:
        """Each part's fraction of the loop (they add up to 1)."""
        total = max(self.seconds, self.input + self.all_reduce, 1e-12)
        return {"input": self.input / total, "all_reduce": self.all_reduce / total,
                "compute": self.compute / total}

    @property
    def input_bound(self) -> bool:
        return self.shares()["input"] >= INPUT_BOUND

    def scalars(self) -> dict[str, float]:
        """TensorBoard's `time/` scalars."""
        shares = self.shares()
        return {"time/input_share": shares["input"], "time/all_reduce_share": shares["all_reduce"],
                "time/compute_share": shares["compute"],
                "time/step_ms": 1e3 * self.seconds / max(self.steps, 1)}


def describe(time: LoopTime, mfu: Optional[float] = None,
             memory: Optional[dict] = None) -> str:
    """The one line: steps, ms/step, the shares, mfu and peak memory."""
    shares = time.shares()
    text = (f"step time, steps {time.start + 1}-{time.start + time.steps}: "
            f"{1e3 * time.seconds / max(time.steps, 1):.2f} ms/step = input wait "
            f"{shares['input']:.0%} + all-reduce {shares['all_reduce']:.0%} + compute "
            f"{shares['compute']:.0%}")
    if mfu is not None:
        text += f"; mfu {mfu:.1%}"
    if memory:
        text += "; peak memory " + ", ".join(
            f"{name.replace('_peak_mb', '')} {value:,.0f} MB" for name, value in memory.items())
    return text


class Report(Action):
    """The breakdown's line, warning and TensorBoard scalars (see the module docstring).

    Args:
      source: the trainer's last loop's `LoopTime` (None before any).
      writer: where `time/` and `memory/` scalars go (None: a worker that is
        not the chief; it still logs its own line).
      interval: the summaries' interval (`--summary_interval`; 0: no scalars).
      devices: the run's local devices (the GPUs among them: their memory).
    """

    def __init__(self, *, source: Callable[[], Optional[LoopTime]],
                 writer: Optional[SummaryWriter], interval: int, devices: Sequence[str] = ()):
        self.source = source
        self.writer = writer
        self.interval = interval
        self.devices = tuple(devices)
        self.loops = 0
        self.warned = False
        self.asked = False
        self._previous_handler = None
        self._installed = False
        self._reported: Optional[LoopTime] = None

    def train_begin(self, step: int) -> None:
        self.loops = 0
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):
            self._previous_handler = signal.signal(signal.SIGUSR1, self._ask)
            self._installed = True

    def _ask(self, signum, frame) -> None:
        self.asked = True  # printed at the next loop end, from the loop's thread

    def __call__(self, loop: LoopEnd) -> None:
        time = self.source()
        if time is None:
            return
        self.loops += 1
        mfu = loop.metrics.get(MFU)
        if self.loops == 2 or self.asked:  # the first loop traces and compiles
            self.asked = False
            self._log(time, mfu)
        if self.loops >= 2 and time.input_bound and not self.warned:
            self.warned = True
            logger.warning("input-bound: the replicas waited on tf.data for %.0f%% of steps "
                           "%d-%d; speed up the input pipeline: %s", 100 * time.shares()["input"],
                           time.start + 1, time.start + time.steps, REMEDIES)
        if (self.writer is not None and self.interval and self.loops >= 2
                and (crossed(loop.start, loop.step, self.interval) or loop.step >= loop.target)):
            self.writer.write(loop.step, {**time.scalars(), **{
                f"memory/{name}": value
                for name, value in hardware.peak_memory(self.devices).items()}})

    def _log(self, time: LoopTime, mfu: Optional[float]) -> None:
        self._reported = time
        logger.info(describe(time, mfu, hardware.peak_memory(self.devices)))

    def close(self) -> None:
        if self._installed:
            signal.signal(signal.SIGUSR1, self._previous_handler or signal.SIG_DFL)
            self._installed = False
        time = self.source()
        if self.loops == 1 and time is not None and self._reported is None:
            # A run of one loop: its numbers include tracing, but they are all there is.
            logger.info("%s (one loop, tracing included)", describe(time))


def for_trainer(trainer, *, writer: Optional[SummaryWriter], interval: int) -> Optional[Report]:
    """The report of a trainer that times its loops (`last_loop_time`: the
    engine's `Trainer`); None for no trainer or one that does not (the
    parameter-server trainer's steps run on other machines)."""
    if trainer is None or not hasattr(trainer, "last_loop_time"):
        return None
    return Report(source=lambda: trainer.last_loop_time, writer=writer, interval=interval,
                  devices=hardware.local_devices(trainer.strategy))
