"""Keras callbacks in the engine's loop.

The engine runs compiled loops of `steps_per_loop` steps and owns its
checkpoints; a Keras callback sees the run as `fit` would show it:

    on_train_begin                       Controller.train starts
    on_epoch_begin(epoch)                before the first loop of an epoch (loops end on
                                         epoch boundaries), after the model's metrics
                                         are reset, as Keras resets them
    on_train_batch_begin/end(batch, logs)  once per loop: a loop is the compiled model's
                                         `steps_per_execution` steps (Keras's 1 by
                                         default; `RunConfig.steps_per_loop` when set),
                                         counted from each epoch's start; `batch` and
                                         the logs (the epoch's so far) are Keras's for
                                         each execution (`Epochs.steps_per_execution`)
    on_test_begin/end(logs)              around the validation at an epoch's end; the
                                         model's metrics are reset after on_test_begin
    on_epoch_end(epoch, logs)            the epoch's logs, as Keras computes them
                                         (`CompiledLoss.keras_logs`), and `val_<name>` of
                                         its validation (after every `validation_freq`-th
                                         epoch, numbered from `initial_epoch`)
    on_train_end(logs)                   after training, stopped early or not (`fit`)

The callbacks are the user's in their order, then `History` (so it sees
what they add to the logs: LearningRateScheduler's `learning_rate`), then,
with `verbose` 1 or 2, Keras's own `ProgbarLogger`, as `model.fit` orders
them. The logs are Keras's: the compiled loss and metrics (the engine's
`grad_norm`, `skipped_steps`, `examples` and `mfu` are not in them). A validation of no
example gives no `val_` logs: there is no result to pass.

`model.stop_training` set by any callback ends training at that loop's or
epoch's end (the step reached is checkpointed), as `fit` does; in a cluster
every worker runs the callbacks that decide (EarlyStopping sees the same
all-reduced metrics on each) and the stop is agreed by an all-reduce of the
workers' flags, so no worker is left in a collective. Callbacks that write
(CSVLogger, TensorBoard, ProgbarLogger, RemoteMonitor, ModelCheckpoint, and
any callback with `chief_only = True`) run on the chief only.
`BackupAndRestore` is the engine's own resume (`fit` takes its `backup_dir`
as `model_dir`: `backup_for`).

Across a kill (exact resume, mid-epoch included):

- the epoch's running sums are in every checkpoint (`EpochState`, a string
  variable `fit`'s task adds to the run's checkpoint), so the epoch a run
  resumes inside logs the means of all its steps, not of those after the
  resume;
- each epoch's end is told once: after `on_epoch_end` the chief records the
  epoch in `model_dir/fit_epochs.json`; a run resumed from a checkpoint
  before that epoch's end retrains it (exactly) without telling its end
  again, so CSVLogger writes no row twice, and a resumed CSVLogger appends
  (`append=False` would empty the file of the epochs before the kill).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.loop.actions import Action, LoopEnd, StopTraining, next_multiple
from tfloop.engine.loop.preemption import StopRequest
from tfloop.engine.observe.step_flops import MFU
from tfloop.engine.loop.trainer import GRAD_NORM, SKIPPED_STEPS
from tfloop.engine.run_dir import layout

logger = logging.getLogger(__name__)

#: Keras callbacks that write files or send logs: the chief's job in a cluster.
_WRITERS = (keras.callbacks.CSVLogger, keras.callbacks.TensorBoard,
            keras.callbacks.ProgbarLogger, keras.callbacks.RemoteMonitor,
            keras.callbacks.ModelCheckpoint)

#: Engine metrics that are not Keras logs: counts, speed (mfu differs by
#: worker, and a callback's decision must be the same on every one), the
#: gradient norm and the steps a LossScaleOptimizer skipped (Keras's fit logs
#: neither; the engine's records and its warning line keep them).
_NOT_LOGGED = ("examples", MFU, GRAD_NORM, SKIPPED_STEPS)


def check(callbacks: Sequence[Any]) -> list:
    """The callbacks as a list, each a `keras.callbacks.Callback`."""
    checked = []
    for callback in callbacks or ():
        if not isinstance(callback, keras.callbacks.Callback):
            raise ConfigError(f"callbacks holds {type(callback).__name__}, not a "
                              "keras.callbacks.Callback")
        checked.append(callback)
    backup_for(checked)  # at most one
    return checked


def backup_for(callbacks: Sequence[Any]) -> Optional[keras.callbacks.BackupAndRestore]:
    """The one `BackupAndRestore` among `callbacks`, or None. It is not run as
    a callback: its `backup_dir` is the run's `model_dir`, whose checkpoints
    resume exactly, mid-epoch included (`fit`)."""
    backups = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
    if len(backups) > 1:
        raise ConfigError("callbacks holds BackupAndRestore twice; give one (its backup_dir "
                          "is where the run resumes from)")
    return backups[0] if backups else None


def runs_here(callback: Any, is_chief: bool) -> bool:
    """Writers run on the chief only; callbacks that decide run everywhere."""
    writes = isinstance(callback, _WRITERS) or getattr(callback, "chief_only", False)
    return is_chief or not writes


def _engine_means(metrics) -> dict:
    """The engine's means of a loop or evaluation that become Keras's logs
    (`to_logs`); none of an evaluation of no example: no result to pass."""
    if metrics.get("examples", 1) == 0:
        return {}
    return {name: float(value) for name, value in metrics.items() if name not in _NOT_LOGGED}


class EpochState:
    """The running sums of the epoch a checkpoint is inside, in the checkpoint.

    One string variable holding JSON, `{"step": s, "sums": {...}, "steps": n}`:
    the names of the metrics are not known when the checkpoint is made, and a
    string is cheap next to the weights. `fit`'s task adds `variable` to the
    run's checkpoint (`CompiledModelTask.checkpointed`); it is made on first
    use, outside any strategy's scope (every worker keeps its own copy; they
    agree, since the metrics are all-reduced).
    """

    def __init__(self):
        self._variable: Optional[tf.Variable] = None

    @property
    def variable(self) -> tf.Variable:
        if self._variable is None:
            with tf.init_scope():
                self._variable = tf.Variable("", dtype=tf.string, trainable=False,
                                             name="fit_epoch_state")
        return self._variable

    def store(self, step: int, sums: dict, steps: int) -> None:
        self.variable.assign(json.dumps({"step": step, "sums": sums, "steps": steps}))

    def at(self, step: int) -> Optional[tuple[dict, int]]:
        """(sums, steps) stored for `step`, or None (none stored, or another step's)."""
        text = self.variable.numpy().decode() if self._variable is not None else ""
        try:
            state = json.loads(text) if text else None
        except ValueError:
            return None
        if not isinstance(state, dict) or state.get("step") != step:
            return None
        return dict(state.get("sums") or {}), int(state.get("steps") or 0)


@dataclasses.dataclass(frozen=True)
class Epochs:
    """How `fit` counts epochs, as Keras's arguments say it.

    Attributes:
      steps_per_epoch: the steps of one epoch.
      epochs: the epoch training ends at (Keras's `epochs`).
      validates: whether there is validation data.
      validation_freq: validate after every that many epochs.
      initial_epoch: the epoch the engine's step 0 starts (Keras's `initial_epoch`).
      verbose: Keras's verbosity (0 silent, 1 a progress bar, 2 a line per epoch).
      steps_per_execution: the compiled model's `steps_per_execution` when it
        sets the loops (None: `RunConfig.steps_per_loop` does): loops of that
        many steps from each epoch's start, the epoch's last one shorter, as
        Keras's executions, and `on_train_batch_end`'s `batch` as Keras numbers
        them (`batch_end`).
    """

    steps_per_epoch: int
    epochs: int
    validates: bool = False
    validation_freq: int = 1
    initial_epoch: int = 0
    verbose: int = 0
    steps_per_execution: Optional[int] = None

    def next_stop(self, step: int) -> int:
        """Where the loop from global step `step` ends: the epoch's end, or
        before it the next execution's start."""
        stop = next_multiple(step, self.steps_per_epoch)
        if self.steps_per_execution:
            epoch_start = step - step % self.steps_per_epoch
            stop = min(stop, epoch_start + next_multiple(step - epoch_start,
                                                         self.steps_per_execution))
        return stop

    def batch_end(self, start: int, step: int) -> int:
        """`on_train_batch_end`'s `batch` for the loop of global steps `start`
        to `step`: its last step in the epoch; Keras numbers an epoch's last,
        shorter execution as a whole one (11 batches at steps_per_execution=4:
        3, 7, 11)."""
        begin = start % self.steps_per_epoch
        if (self.steps_per_execution and step % self.steps_per_epoch == 0
                and begin % self.steps_per_execution == 0):
            return begin + self.steps_per_execution - 1
        return (step - 1) % self.steps_per_epoch


@dataclasses.dataclass(frozen=True)
class TaskLogs:
    """What the callbacks take from `fit`'s task (`CompiledModelTask`).

    Attributes:
      to_logs: Keras's logs of a train loop from the engine's means.
      val_logs: Keras's logs of a validation (None: `to_logs`).
      reset_metrics: resets the model's metric objects, called where Keras's
        `fit` calls `model.reset_metrics()` (an epoch's start, a validation's
        start after `on_test_begin`; not at a resume inside an epoch, whose
        objects the checkpoint restored).
      epoch_state: the running sums a resume inside an epoch restores.
    """

    to_logs: Callable[[dict], dict] = dict
    val_logs: Optional[Callable[[dict], dict]] = None
    reset_metrics: Callable[[], None] = lambda: None
    epoch_state: Optional[EpochState] = None


class KerasCallbacks:
    """The callbacks of one run, driven by two actions: `train_action` after
    each train loop, `eval_action` after each validation (an epoch with
    validation ends there, with the val_ logs). `task` (`TaskLogs`) makes
    Keras's logs from the engine's means and resets the model's metrics;
    `strategy` (None: this process decides alone) agrees on
    `model.stop_training`; `model_dir` holds fit_epochs.json."""

    def __init__(self, callbacks: Sequence[Any], *, model: Any, epochs: Epochs, is_chief: bool,
                 strategy: Any = None, task: TaskLogs = TaskLogs(),
                 model_dir: Optional[str] = None):
        verbose, steps_per_epoch = epochs.verbose, epochs.steps_per_epoch
        history = [c for c in callbacks if isinstance(c, keras.callbacks.History)]
        here = [c for c in callbacks if runs_here(c, is_chief)
                and not isinstance(c, (keras.callbacks.History,
                                       keras.callbacks.BackupAndRestore))]
        # The user's callbacks, then History, then the progress bar: model.fit's order.
        self.callbacks = keras.callbacks.CallbackList(
            [*here, *history], add_history=False, add_progbar=bool(verbose) and is_chief,
            model=model, verbose=verbose, epochs=epochs.epochs, steps=steps_per_epoch)
        self.model = model
        self.counting = epochs
        self.steps_per_epoch, self.epochs = steps_per_epoch, epochs.epochs
        self.validates = epochs.validates
        self.is_chief = is_chief
        # Keras validates after the epochs whose count is a multiple of
        # validation_freq, and numbers epochs from initial_epoch: the engine's
        # step 0 is the start of epoch initial_epoch.
        self.validation_freq, self.initial_epoch = epochs.validation_freq, epochs.initial_epoch
        # The engine's means -> Keras's logs (`CompiledModelTask.keras_logs`).
        self._to_logs = task.to_logs
        self._val_logs = task.val_logs or task.to_logs
        self._reset_metrics = task.reset_metrics
        # In a cluster one tiny all-reduce per loop agrees on model.stop_training
        # (strategy None: this process decides alone).
        self._agree = StopRequest(strategy)
        self._epoch_state = task.epoch_state
        self._told_path = layout.RunDir(model_dir).fit_epochs_json if model_dir else None
        self._told = -1  # the last epoch whose end the callbacks were told (fit_epochs.json)
        self._epoch_sums: dict[str, float] = {}
        self._epoch_steps = 0
        self._pending: Optional[tuple[int, dict]] = None  # an epoch waiting for its validation
        self._epoch_open: Optional[int] = None
        self._resumed: Optional[tuple[dict, int]] = None  # sums restored for the first epoch
        self.last_logs: dict = {}
        self.train_action = _TrainSide(self)
        self.eval_action = _EvalSide(self)

    def train_begin(self, step: int) -> None:
        self.model.stop_training = False
        if self._told_path:
            self._told = int((layout.read_json(self._told_path) or {}).get("epoch", -1))
        if step % self.steps_per_epoch and self._epoch_state is not None:
            # Resumed inside an epoch: its steps before the resume count too.
            self._resumed = self._epoch_state.at(step)
        if step:  # a resumed run goes on with the file the run before it wrote
            for callback in self.callbacks.callbacks:
                if isinstance(callback, keras.callbacks.CSVLogger):
                    callback.append = True
        self.callbacks.on_train_begin()

    def _epoch(self, step: int) -> int:
        return self.initial_epoch + step // self.steps_per_epoch

    def loop_begin(self, step: int) -> None:
        epoch = self._epoch(step)
        if self._epoch_open != epoch:
            self._epoch_open = epoch
            self._epoch_sums, self._epoch_steps = self._resumed or ({}, 0)
            self._resumed = None
            if step % self.steps_per_epoch == 0:  # not a resume inside the epoch
                self._reset_metrics()
            self.callbacks.on_epoch_begin(epoch)
        self.callbacks.on_train_batch_begin(step % self.steps_per_epoch)

    def loop_end(self, loop: LoopEnd) -> None:
        # Every step counts the same rows, so loops weigh by their steps; the
        # logs are the epoch's so far, as Keras's metrics are after each batch.
        epoch = self._epoch(loop.start)
        means = self._add(loop)
        self.callbacks.on_train_batch_end(self.counting.batch_end(loop.start, loop.step),
                                          dict(means))
        self._stop_if_asked("on_train_batch_end")
        if loop.step % self.steps_per_epoch == 0:  # the epoch's last loop
            if self.validates and (epoch + 1) % self.validation_freq == 0:
                self._pending = (epoch, means)
                self.callbacks.on_test_begin()
                self._reset_metrics()  # Keras's evaluate, after on_test_begin
            else:
                self._end_epoch(epoch, means)

    def _add(self, loop: LoopEnd) -> dict:
        """Adds the loop to the epoch's sums; Keras's logs of the epoch so far."""
        steps = loop.step - loop.start
        for name, value in _engine_means(loop.metrics).items():
            self._epoch_sums[name] = self._epoch_sums.get(name, 0.0) + value * steps
        self._epoch_steps += steps
        if self._epoch_state is not None:  # what the checkpoint of this step holds
            self._epoch_state.store(loop.step, self._epoch_sums, self._epoch_steps)
        return self._to_logs({k: v / self._epoch_steps for k, v in self._epoch_sums.items()})

    def validated(self, loop: LoopEnd) -> None:
        if self._pending is None:
            # Not an epoch's validation (a finished run called again evaluates
            # once more; an epoch off validation_freq's beat): the callbacks
            # were not told a test began.
            return
        means = _engine_means(loop.metrics)
        val = self._val_logs(means) if means else {}
        self.callbacks.on_test_end(val)
        epoch, means = self._pending
        self._pending = None
        self._end_epoch(epoch, {**means, **{f"val_{k}": v for k, v in val.items()}})

    def _end_epoch(self, epoch: int, logs: dict, *, agree: bool = True) -> None:
        self._epoch_open = None
        self.last_logs = logs
        if epoch <= self._told:
            # Told before a kill that came ahead of this step's checkpoint: this
            # run retrained the epoch's last steps (exactly) and says nothing twice.
            logger.info("epoch %d: its end was recorded before the run was interrupted; "
                        "not telling the callbacks again", epoch + 1)
            return
        self.callbacks.on_epoch_end(epoch, logs)
        self._told = epoch
        if self._told_path and self.is_chief:
            layout.write_json(self._told_path, {"epoch": epoch})
        if agree:
            self._stop_if_asked("on_epoch_end")

    def _stop_if_asked(self, where: str) -> None:
        self._agree.requested = bool(getattr(self.model, "stop_training", False))
        if self._agree.agreed():
            self.model.stop_training = True
            raise StopTraining(f"a Keras callback set model.stop_training ({where})")

    def stopped_by_non_finite(self, start: int, step: int, metrics: dict) -> bool:
        """The loop from `start` to `step` gave a NaN or Inf loss and the engine
        stopped (`NonFinite`): the callbacks see that loop, as Keras's fit
        shows its batch; when one sets `model.stop_training` (TerminateOnNaN),
        the epoch ends with those logs, as in Keras (without validating the
        diverged weights), and True: `fit` returns its History."""
        epoch = self._epoch(start)
        means = self._add(LoopEnd(start=start, step=step, target=step, num_steps=step - start,
                                  seconds=0.0, metrics=metrics))
        self.callbacks.on_train_batch_end(self.counting.batch_end(start, step), dict(means))
        if not getattr(self.model, "stop_training", False):
            return False
        self._end_epoch(epoch, means, agree=False)  # every worker saw the same numbers
        return True

    def train_end(self) -> None:
        """`on_train_end` with the last epoch's logs (`fit` calls it after the run)."""
        self.callbacks.on_train_end(self.last_logs)


class _TrainSide(Action):
    """After each train loop; loops end on epoch boundaries."""

    def __init__(self, owner: KerasCallbacks):
        self.owner = owner

    def train_begin(self, step: int) -> None:
        self.owner.train_begin(step)

    def next_stop(self, step: int) -> Optional[int]:
        return self.owner.counting.next_stop(step)

    def loop_begin(self, step: int) -> None:
        self.owner.loop_begin(step)

    def __call__(self, loop: LoopEnd) -> None:
        self.owner.loop_end(loop)


class _EvalSide(Action):
    """After each validation."""

    def __init__(self, owner: KerasCallbacks):
        self.owner = owner

    def __call__(self, loop: LoopEnd) -> None:
        self.owner.validated(loop)
