"""The engine's clock: every loop timed on the host, per-step stamps in sampled loops only.

The trainer (`engine.loop.trainer`) calls its clock at three points and knows
nothing else about timing (`engine.loop.contracts.LoopClock`, whose base times
nothing)::

    with_stamps = clock.begin(start_step)  # a sampled loop: loop 2, one in SAMPLE_EVERY
                                           # after (every loop where the straggler table
                                           # compares workers), the loop after a SIGUSR1
                                           # (`ask`); on CPUs, every loop of a short run
    loop(..., stamps=clock.stamps(with_stamps))   # two traced loop functions at most
    metrics |= clock.end(trainer, start=, steps=, stamped=)   # the loop's wall time ends

`end` keeps the loop's `LoopTime` (`last`: what the breakdown's report,
`engine.observe.step_time.Report`, and the straggler table read), and adds
`mfu` to the loop's metrics from its second loop on (the first traces and
compiles). Its one-time work never lands in a timed loop: the step's FLOPs
are counted from its graph (`engine.observe.step_flops`) at the end of the
first loop, which is never timed; the second loop function is traced and
run for 0 steps (`trainer.warm(with_stamps)`) outside any loop's timer
(just before the first sampled loop's, or, for a long run on CPUs, just
after loop 2's), so it does not trace or instantiate the function inside
a timed loop either. A run of one loop never
samples and so never pays for that trace (seconds for a model with many
ops). What `mfu` divides (the step's FLOPs, `engine.observe.step_flops`)
and divides by (the devices' peak rate, `engine.runtime.hardware.peak`: on
CPUs a matmul probe of about half a second) are had once, at the end of
the first loop that reports `mfu`, the second, after its timer: a run's first
step does not wait for them, and a run of one loop (which reports no `mfu`)
never pays for them.

Who calls what: the assembly builds the clock (`for_run`, from
`engine.assembly.runner.Runner.build_clock`) and hands it to the strategy's
`build_trainer`, which gives it to the trainer; the trainer calls `begin`,
`stamps` and `end`; the step-time report (`engine.observe.step_time`) reads
`last` and calls `ask` on SIGUSR1; the straggler table reads `last`.

Why sample: a stamp is a host op, and one per step that waits on device
tensors makes the host wait for the device every step
(`engine.observe.step_time`). Wall time per loop costs nothing. The
schedule: the `first_samples` loops after the first (the breakdown's first
line), then one loop in `SAMPLE_EVERY`, which alone pays the stamps' cost.
A multi-worker cluster that compares its workers (`--straggler_threshold`,
`engine.observe.stragglers`) samples every loop (`sample_every=1`), as
before: the table compares each loop's own time of every worker, which a
loop's stamps give and its wall time (the same on every worker) does not;
`--straggler_threshold=0` turns both off. The loops the schedule samples are
the same on every worker (the table is a collective).

Short runs on CPUs (`short_runs_stamped`) trace one loop function. There a
stamp makes no host wait for a device and costs only its ops (about 4% of a
small mlp's step on 2 logical CPUs), while the second loop function's trace
and instantiation cost about a fifth of the CPU of a small `tfloop.fit`.
So the first loops take the stamps from the one function, sampled or not
(only the sampled loops' stamps are read), and at the end of loop 2, after
its timer, the clock decides once: if the rest of the run (`target_step`,
at loop 2's rate) will take longer than the first loop did (which traced
and instantiated one loop function: about what a second costs), it traces
the unstamped function there, and the unsampled loops run it, as on GPUs;
otherwise every loop keeps the stamps to the end. The lines, scalars and
straggler table are those of the same sampled loops either way.
`bin/bench_train` times a long run's loops, whatever its own length: it
turns this off (`SHORT_RUNS_STAMPED`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from tfloop.engine.loop.contracts import LoopClock, Metrics, StepStamps
from tfloop.engine.loop.trainer import Trainer
from tfloop.engine.observe import step_flops, step_time
from tfloop.engine.runtime import hardware
from tfloop.engine.runtime.hardware import Peak

logger = logging.getLogger(__name__)

#: After the first loop (which traces and compiles) and the first samples,
#: one loop in this many is sampled.
SAMPLE_EVERY = 10

#: Whether `for_run` stamps the short runs of CPU replicas (the module
#: docstring); the training benchmark sets it False while it times loops.
SHORT_RUNS_STAMPED = True


def for_run(strategy, *, precision: str, compares_every_loop: bool, in_cluster: bool = False,
            target_step: Optional[int] = None) -> "SampledClock":
    """The run's clock, built once by the assembly before the trainer:

    Args:
      strategy: the run's strategy; the peak rate is its local replicas' devices'.
      precision: `--mixed_precision`: the compute dtype the peak rate is of.
      compares_every_loop: the straggler table compares every loop's own
        time of each worker (a multi-worker cluster with
        `--straggler_threshold`): every loop is sampled.
      in_cluster: a multi-worker cluster, whose workers must trace the same
        loop functions at the same loops (their collectives): no short-run
        stamps, decided by each worker's own times.
      target_step: the step the run trains to (None: unknown, a long run).
    """
    devices = hardware.local_devices(strategy)
    return SampledClock(peak_of=lambda: hardware.peak(devices, precision),
                        timed=step_time.timestamps_allowed(),
                        sample_every=1 if compares_every_loop else SAMPLE_EVERY,
                        short_runs_stamped=(SHORT_RUNS_STAMPED and not in_cluster
                                            and hardware.all_cpus(devices)),
                        target_step=target_step)


class SampledClock(LoopClock):
    """The engine's clock (see the module docstring).

    Args:
      peak_of: measures the devices' peak rate (returning None: no `mfu`),
        called once, when the first `mfu` is due; None: no `mfu`.
      timed: False where TensorFlow refuses `tf.timestamp` (op determinism):
        no loop is sampled, every loop still has its wall time.
      sample_every: one loop in this many is sampled after the first samples.
      first_samples: loops 2 to 1 + first_samples are sampled
        (`engine.observe.stragglers.PERSISTENT` where workers are compared).
      short_runs_stamped: the first loops take the stamps, and all of them
        in a run too short for a second loop function (CPU replicas: the
        module docstring).
      target_step: the step the run trains to (None: unknown, a long run).
    """

    def __init__(self, *, peak_of: Optional[Callable[[], Optional[Peak]]] = None,
                 timed: bool = True,
                 sample_every: int = SAMPLE_EVERY, first_samples: int = 1,
                 short_runs_stamped: bool = False, target_step: Optional[int] = None):
        if sample_every < 1 or first_samples < 1:
            raise ValueError(f"`sample_every` ({sample_every!r}) and `first_samples` "
                             f"({first_samples!r}) must be positive integers")
        self.first_samples = first_samples
        self._peak_of = peak_of
        #: The devices' peak rate, once the first `mfu` measured it (None before).
        self.peak: Optional[Peak] = None
        self.timed = timed
        self.sample_every = sample_every
        self.short_runs_stamped = short_runs_stamped
        self.target_step = target_step
        #: FLOPs of one step, once the first `mfu` counted them (None before).
        self.flops: Optional[float] = None
        self.last: Optional[step_time.LoopTime] = None
        self.loops = 0
        self._asked = False
        self._sampling: tuple[bool, bool] = (False, False)  # (scheduled, asked) of this loop
        self._measured = False
        #: The trainer, kept after the first loop to warm its second loop
        #: function (`Trainer.warm`) when a loop first needs it.
        self._trainer: Optional[Trainer] = None
        #: The values of `with_stamps` whose loop function is traced.
        self._traced: set[bool] = set()
        #: Whether unsampled loops take the stamps too (a short run on CPUs).
        self._stamping = timed and short_runs_stamped
        self._first_seconds = 0.0  # the first loop's wall time (tracing included)
        self._began = 0.0

    def ask(self) -> None:
        """Samples the next loop (SIGUSR1, from any thread)."""
        self._asked = True

    def scheduled(self, loop: int) -> bool:
        """Whether the schedule samples loop number `loop` (1-based)."""
        last_first = 1 + self.first_samples
        return 2 <= loop <= last_first or (
            loop > last_first and (loop - last_first) % self.sample_every == 0)

    def begin(self, start_step: int) -> bool:
        number = self.loops + 1
        scheduled = self.timed and self.scheduled(number)
        asked = self.timed and self._asked and number >= 2
        if asked:
            self._asked = False
        self._sampling = (scheduled, asked)
        with_stamps = scheduled or asked or self._stamping
        self._warm(with_stamps)  # before the timer starts
        self._began = time.perf_counter()
        return with_stamps

    def _warm(self, with_stamps: bool) -> None:
        """Traces the loop function a loop is about to run, unless traced."""
        if with_stamps not in self._traced and self._trainer is not None:
            self._trainer.warm(with_stamps)
        self._traced.add(with_stamps)

    def _long_after(self, step: int, seconds_per_step: float) -> bool:
        """Whether the rest of the run, at `seconds_per_step`, takes longer
        than its first loop did (unknown: yes)."""
        if self.target_step is None:
            return True
        return (self.target_step - step) * seconds_per_step > self._first_seconds

    def stamps(self, with_stamps: bool) -> StepStamps:
        return step_time.Stamps() if with_stamps else StepStamps()

    def end(self, trainer: Trainer, *, start: int, steps: int, stamped: dict) -> Metrics:
        seconds = time.perf_counter() - self._began
        self.loops += 1
        if self.loops == 1:
            self._first_seconds = seconds
        scheduled, asked = self._sampling
        self._sampling = (False, False)
        if stamped and (scheduled or asked):  # an unsampled loop's stamps are not read
            self.last = step_time.LoopTime(
                start=start, steps=steps, seconds=seconds, input=float(stamped["input"]),
                all_reduce=float(stamped["all_reduce"]), sampled=True, scheduled=scheduled,
                asked=asked, stamped=float(stamped["stamped"]))
        else:
            self.last = step_time.LoopTime(start=start, steps=steps, seconds=seconds,
                                           sampled=False, scheduled=False)
        if self.loops == 1:
            if self.timed and hasattr(trainer, "warm"):
                self._trainer = trainer  # to `warm` its second loop function, if one comes
            return {}  # the first loop traces and compiles: its mfu would mean nothing
        if self.loops == 2 and self._stamping and steps:  # a short run's decision, once
            self._stamping = not self._long_after(start + steps, seconds / steps)
            if not self._stamping:
                self._warm(False)  # after loop 2's timer, before loop 3's
        self._measure(trainer)
        rate = step_flops.mfu(self.flops, steps, seconds,
                              self.peak.flops_per_second if self.peak else None)
        return {step_flops.MFU: rate} if rate is not None else {}

    def _measure(self, trainer: Trainer) -> None:
        """What `mfu` needs, had once, when the first is due (after that
        loop's timer): the devices' peak rate, then the step's FLOPs."""
        if self._measured:
            return
        self._measured = True
        self.peak = self._peak_of() if self._peak_of is not None else None
        if self.peak is not None:
            self.flops = step_flops.of_trainer(trainer)
