"""What happens at the end of a loop: one small action each.

The Controller runs the trainer's compiled loops and owns two boundaries of
its own, checkpoints and evaluations. Everything else a run does between
loops is an action: progress lines, TensorBoard summaries, the profiler
window, the stop request (SIGTERM, Ctrl-C) and the user's hook. An action may
also say at which step the next loop must end, which is how summaries land
on exact multiples of `summary_interval` and the profiler trace covers
exactly steps A to B, resumed runs included::

    while global_step < steps:                     # Controller.train
        n = min(steps_per_loop, steps left, next checkpoint / eval boundary,
                action.next_stop(step) - step for every train action)
        for action in train_actions: action.loop_begin(step)
        metrics = trainer.train(n)
        for action in train_actions: action(LoopEnd(...))   # in order
        maybe evaluate, then each eval action; maybe save a checkpoint,
            then for action in train_actions: action.saved(step, path)
    for action in train_actions: action.close()   # also on an exception

Order matters and is the caller's: the run's runner
(`engine.assembly.runner.Runner.build_actions`) puts the profiler first (its
trace stops before any logging), the user's hook after the summaries, and
the stop request last, so a stopping run has logged and summarized its last
loop before it saves and raises `Preempted`. Among the eval actions the
best checkpoint (`engine.loop.best.KeepBest`) comes last: it may end training
with `StopTraining`, after the evaluation was logged and recorded.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import signal
from typing import Callable, Mapping, NamedTuple, Optional, Protocol

import tensorflow as tf

from tfloop.engine.run_dir import checkpointing, layout, run_record
from tfloop.engine.loop.preemption import Preempted, StopRequest
from tfloop.engine.loop.summaries import SummaryWriter

logger = logging.getLogger(__name__)
#: The per-loop progress lines (TrainProgress, EvalProgress): `fit` with
#: Keras's progress bar quiets this one logger, not the run's other lines.
progress_logger = logging.getLogger(f"{__name__}.progress")

#: A user's hook, as `engine.run.run(on_loop_end=...)` takes it.
LoopHook = Callable[[int, dict], None]


class LocalSaver(Protocol):
    """What `SaveLocal` drives (`engine.run_dir.local_checkpoints.Saver`)."""

    def prepare(self) -> bool: ...

    def save(self, step: int) -> Optional[str]: ...


@dataclasses.dataclass(frozen=True)
class LoopEnd:
    """What an action sees after a train loop or an evaluation.

    Attributes:
      start: the global step before the loop.
      step: the global step after it (for an evaluation, the step evaluated).
      target: the step `Controller.train` trains to (for an evaluation, `step`).
      num_steps: the steps the loop ran: those asked for, fewer when a stop
        request ended it early (for an evaluation, the batches asked for; -1: all).
      seconds: wall time of the runner's call alone.
      metrics: the runner's mean metrics, and `examples`.
    """

    start: int
    step: int
    target: int
    num_steps: int
    seconds: float
    metrics: Mapping[str, float]


class StopTraining(Exception):
    """Raised by an action to end `Controller.train` early, and normally.

    Unlike `Preempted`, the run is over: the Controller logs `reason` in one
    line, saves the checkpoint of the step reached and returns (no further
    evaluation). Early stopping (`engine.loop.best.KeepBest`) raises it after an
    evaluation, or from `train_begin` when a resumed run had already stopped.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Action(abc.ABC):
    """A loop-end side effect; subclasses implement `__call__`, the rest is optional."""

    @abc.abstractmethod
    def __call__(self, loop: LoopEnd) -> None:
        """Runs after each loop (train actions) or each evaluation (eval actions)."""

    def next_stop(self, step: int) -> Optional[int]:
        """The first global step after `step` at which a loop must end; None: any."""
        return None

    def loop_begin(self, step: int) -> None:
        """Runs before each train loop, at global step `step`."""

    def train_begin(self, step: int) -> None:
        """Runs when `Controller.train` starts, at global step `step`, for train
        and eval actions alike; may raise `StopTraining` to train nothing."""

    def saved(self, step: int, path: str) -> None:
        """Runs after each checkpoint `Controller.train` saves (the stop
        request's included), with its step and path."""

    def close(self) -> None:
        """Runs when `Controller.train` returns or raises."""


def next_multiple(step: int, interval: int) -> int:
    """The first multiple of `interval` after `step` (a boundary the Controller shares)."""
    return step + interval - step % interval


def crossed(start: int, end: int, interval: int) -> bool:
    """Whether a loop from `start` to `end` reached a multiple of `interval` (0: never)."""
    return bool(interval) and end // interval > start // interval


def _scalars(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k != "examples"}


def _format_value(value: float) -> str:
    """Four decimals; small values (a learning rate of 1e-5) in scientific notation."""
    return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.3e}"


def _format_metrics(metrics: Mapping[str, float]) -> str:
    return "  ".join(f"{k} {_format_value(v)}" for k, v in _scalars(metrics).items())


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` ({value!r}) must be a positive integer")


class TrainProgress(Action):
    """One line per loop: `train step 200/1000  loss ...  12.5 steps/s  3200 examples/s`,
    with `(epoch 2/5)` after the step when the run is counted in epochs."""

    def __init__(self, *, global_batch_size: int, steps_per_epoch: int = 0, epochs: int = 0):
        _check_positive("global_batch_size", global_batch_size)
        self.global_batch_size = global_batch_size
        self.steps_per_epoch, self.epochs = steps_per_epoch, epochs

    def __call__(self, loop: LoopEnd) -> None:
        steps_per_sec = loop.num_steps / loop.seconds if loop.seconds else 0.0
        epoch = ""
        if self.steps_per_epoch and self.epochs:
            epoch = f" (epoch {-(-loop.step // self.steps_per_epoch)}/{self.epochs})"
        progress_logger.info("train step %d/%d%s  %s  %.1f steps/s  %.0f examples/s",
                    loop.step, loop.target, epoch, _format_metrics(loop.metrics),
                    steps_per_sec, steps_per_sec * self.global_batch_size)


class EvalProgress(Action):
    """One line per evaluation: `eval  step 200  loss ...  (2048 examples, 0.4s)`;
    a warning instead for one of no example, whose means are no result
    (`engine.loop.best.KeepBest` does not compare it either)."""

    def __call__(self, loop: LoopEnd) -> None:
        if loop.metrics.get("examples", 1) == 0:
            progress_logger.warning("eval  step %d: 0 examples, so no result (the evaluation dataset "
                           "is empty; its loss 0 means nothing)", loop.step)
            return
        progress_logger.info("eval  step %d  %s  (%d examples, %.1fs)", loop.step,
                    _format_metrics(loop.metrics), int(loop.metrics.get("examples", 0)),
                    loop.seconds)


class TrainSummaries(Action):
    """Train scalars (and steps/s, examples/s) on multiples of `interval`, and
    at the last step of training whatever it is, so the curve ends where the
    run did (the learning rate is one of the scalars: `engine.recipe.objectives`).

    Loops end on those multiples whether or not there is a `writer`: every
    worker of a cluster must end its loops at the same steps (the stop request
    is agreed by a collective at each loop end), and only the chief writes.
    `interval` 0: no summaries and no cutting.
    """

    def __init__(self, *, writer: Optional[SummaryWriter], interval: int, global_batch_size: int):
        if not isinstance(interval, int) or interval < 0:
            raise ValueError(f"`interval` ({interval!r}) must be an integer >= 0 (0: off)")
        _check_positive("global_batch_size", global_batch_size)
        self.writer = writer
        self.interval = interval
        self.global_batch_size = global_batch_size

    def next_stop(self, step: int) -> Optional[int]:
        return next_multiple(step, self.interval) if self.interval else None

    def __call__(self, loop: LoopEnd) -> None:
        if self.writer is None or not self.interval:
            return
        if not crossed(loop.start, loop.step, self.interval) and loop.step < loop.target:
            return
        steps_per_sec = loop.num_steps / loop.seconds if loop.seconds else 0.0
        scalars = _scalars(loop.metrics)
        scalars["steps_per_second"] = steps_per_sec
        scalars["examples_per_second"] = steps_per_sec * self.global_batch_size
        self.writer.write(loop.step, scalars)


class EvalSummaries(Action):
    """Eval scalars at the step evaluated, into `summaries/eval`."""

    def __init__(self, *, writer: SummaryWriter):
        if writer is None:
            raise ValueError("`writer` (None) must be a SummaryWriter; "
                             "leave the action out instead")
        self.writer = writer

    def __call__(self, loop: LoopEnd) -> None:
        scalars = _scalars(loop.metrics)
        if scalars:  # none for an evaluation of no example: no result to draw
            self.writer.write(loop.step, scalars)


class Profile(Action):
    """A TensorBoard profiler trace of global steps A to B (`--profile_steps=A,B`).

    Loops end at A and B, so the trace holds exactly those loops' steps; a
    run resumed inside [A, B) starts tracing at once. With `logdir=None` (a
    worker that is not the chief) loops are cut the same and nothing is
    traced, so every worker's loops end at the same steps. TensorBoard's
    Profile tab finds the trace in `logdir/plugins/profile/`.
    """

    def __init__(self, *, steps: tuple[int, int], logdir: Optional[str]):
        first, last = steps
        if not (isinstance(first, int) and isinstance(last, int) and 0 <= first < last):
            raise ValueError(f"`steps` {steps!r} must be two global steps A, B with 0 <= A < B")
        if logdir == "":
            raise ValueError("`logdir` ('') is empty; name the trace's directory, or None to "
                             "cut loops without tracing")
        self.first, self.last = first, last
        self.logdir = logdir
        self.profiling = False

    def next_stop(self, step: int) -> Optional[int]:
        later = [boundary for boundary in (self.first, self.last) if boundary > step]
        return min(later) if later else None

    def loop_begin(self, step: int) -> None:
        if self.logdir is not None and not self.profiling and self.first <= step < self.last:
            self._start()
            self.profiling = True
            logger.info("profiling steps %d to %d into %s", step, self.last, self.logdir)

    def __call__(self, loop: LoopEnd) -> None:
        if loop.step >= self.last:
            self.close()

    def close(self) -> None:
        if self.profiling:
            self.profiling = False
            self._stop()
            logger.info("profiler trace written under %s/plugins/profile", self.logdir)

    def _start(self) -> None:
        tf.profiler.experimental.start(self.logdir)

    def _stop(self) -> None:
        tf.profiler.experimental.stop()


class StopOnSignal(Action):
    """SIGTERM or Ctrl-C: save a checkpoint at this loop's step and raise `Preempted`.

    The signal only set a flag (see `engine.loop.preemption`); here, at a loop
    boundary, the workers agree on it. After the last loop the run ends with
    its own checkpoint anyway, so the question is not asked there (every
    worker is at the same step, so all of them skip the collective alike).
    """

    def __init__(self, *, request: StopRequest,
                 checkpoint_manager: Optional[tf.train.CheckpointManager]):
        if not isinstance(request, StopRequest):
            raise ValueError(f"`request` ({request!r}) must be an engine.loop.preemption.StopRequest")
        self.request = request
        self.checkpoint_manager = checkpoint_manager

    def __call__(self, loop: LoopEnd) -> None:
        if loop.step >= loop.target or not self.request.agreed():
            return
        raise Preempted(loop.step, checkpointing.save(self.checkpoint_manager, loop.step),
                        self.request.signum or signal.SIGTERM)


class OnLoopEnd(Action):
    """A user's function `hook(step, metrics)`, called after every train loop
    (`bench.training` times loops from outside with it)."""

    def __init__(self, hook: LoopHook):
        if not callable(hook):
            raise ValueError(f"`hook` ({hook!r}) must be callable as hook(step, metrics)")
        self.hook = hook

    def __call__(self, loop: LoopEnd) -> None:
        self.hook(loop.step, dict(loop.metrics))


class History(Action):
    """Appends each train loop's or evaluation's metrics to `entries`, in the
    order they happen: `{"kind": "train" | "eval", "step": N, <metric>: value}`
    (what `run()` returns as `RunResult.history`; metrics.json keeps only the
    last of each)."""

    def __init__(self, kind: str, entries: list):
        self.kind, self.entries = kind, entries

    def __call__(self, loop: LoopEnd) -> None:
        self.entries.append({"kind": self.kind, "step": loop.step, **_scalars(loop.metrics)})


class RunActions(NamedTuple):
    train: list[Action]
    eval: list[Action]


class RecordEvaluation(Action):
    """Appends each evaluation to `evaluations.json` (`engine.run_dir.run_record`)."""

    def __init__(self, *, path: str, by: str):
        self.path, self.by = path, by

    def __call__(self, loop: LoopEnd) -> None:
        run_record.add_evaluation(self.path, step=loop.step, by=self.by, metrics=loop.metrics)


def for_evaluation(eval_summaries: Optional[SummaryWriter],
                   record: Optional[RecordEvaluation] = None,
                   keep_best: Optional[Action] = None) -> list[Action]:
    """A run's eval actions: the progress line, summaries where there is a
    writer, the record of each evaluation where asked, and last the best
    checkpoint (`engine.loop.best.KeepBest`), which may stop training."""
    actions: list[Action] = [EvalProgress()]
    if eval_summaries is not None:
        actions.append(EvalSummaries(writer=eval_summaries))
    if record is not None:
        actions.append(record)
    if keep_best is not None:
        actions.append(keep_best)
    return actions


class RecordProgress(Action):
    """`metrics.json` while the run trains (`engine.run_dir.run_record.running`):
    written when training starts and after each checkpoint, so that after a
    kill -9 it names the checkpoint a resume starts from. `last` is that
    checkpoint, `(step, path)`: the run's final record reads it too.

    Args:
      path: the run's metrics.json.
      record: `(step, checkpoint) -> dict`, the record at a checkpoint.
      step, checkpoint: where training starts from (the restored checkpoint, or None).
    """

    def __init__(self, *, path: str, record: Callable[[int, Optional[str]], dict], step: int,
                 checkpoint: Optional[str]):
        if not callable(record):
            raise ValueError(f"`record` ({record!r}) must be callable as record(step, checkpoint)")
        self.path, self.record = path, record
        self.last: tuple[int, Optional[str]] = (step, checkpoint)

    def train_begin(self, step: int) -> None:
        self._write()

    def saved(self, step: int, path: str) -> None:
        self.last = (step, path)
        self._write()

    def __call__(self, loop: LoopEnd) -> None:
        """Nothing at a loop's end: only a checkpoint changes what a resume starts from."""

    def _write(self) -> None:
        layout.write_json(self.path, self.record(*self.last))


class SaveLocal(Action):
    """A fast local checkpoint (`engine.run_dir.local_checkpoints.Saver`) at
    every multiple of `interval`, except where the durable one is saved
    anyway (a multiple of `durable_interval`, the last step); loops are cut
    there (on every worker alike, whether or not its folder can be used).
    The saver prepares its folder when training starts and never raises for
    a local reason: a folder it may not use, or a save that fails (a full
    RAM disk), is one warning, and the durable checkpoints hold the run."""

    def __init__(self, *, saver: "LocalSaver", interval: int, durable_interval: int):
        _check_positive("interval", interval)
        self.saver = saver
        self.interval = interval
        self.durable_interval = durable_interval

    def train_begin(self, step: int) -> None:
        self.saver.prepare()

    def next_stop(self, step: int) -> Optional[int]:
        return next_multiple(step, self.interval)

    def __call__(self, loop: LoopEnd) -> None:
        if (not crossed(loop.start, loop.step, self.interval) or loop.step >= loop.target
                or crossed(loop.start, loop.step, self.durable_interval)):
            return
        self.saver.save(loop.step)
