"""Keras callbacks in the engine's loop.

The engine runs compiled loops of `steps_per_loop` steps and owns its
checkpoints; a Keras callback sees the run as `fit` would show it:

    on_train_begin                       Controller.train starts
    on_epoch_begin(epoch)                before the first loop of an epoch (loops end on
                                         epoch boundaries)
    on_train_batch_begin/end(batch, logs)  once per loop, not per step: a loop of N steps
                                         is one call whose `batch` is the loop's last step
                                         in the epoch and whose logs are the epoch's so
                                         far, as Keras does with `steps_per_execution=N`
    on_test_begin/end(logs)              around the validation at an epoch's end
    on_epoch_end(epoch, logs)            the epoch's logs, as Keras computes them
                                         (`CompiledLoss.keras_logs`), and `val_<name>` of
                                         its validation (after every `validation_freq`-th
                                         epoch, numbered from `initial_epoch`)
    on_train_end(logs)                   after training, stopped early or not (`fit`)

`model.stop_training` set by any callback ends training at that loop's or
epoch's end (the step reached is checkpointed), as `fit` does; in a cluster
every worker runs the callbacks that decide (EarlyStopping sees the same
all-reduced metrics on each) and the stop is agreed by an all-reduce of the
workers' flags, so no worker is left in a collective. Callbacks that write
(CSVLogger, TensorBoard, ProgbarLogger, RemoteMonitor, and any callback with
`chief_only = True`) run on the chief only. ModelCheckpoint and
BackupAndRestore are refused: the engine's checkpoints and resume do that job.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import keras

from tfloop.engine.errors import ConfigError
from tfloop.engine.loop.actions import Action, LoopEnd, StopTraining, next_multiple
from tfloop.engine.loop.preemption import StopRequest
from tfloop.engine.observe.step_flops import MFU

#: Keras callbacks that write files or send logs: the chief's job in a cluster.
_WRITERS = (keras.callbacks.CSVLogger, keras.callbacks.TensorBoard,
            keras.callbacks.ProgbarLogger, keras.callbacks.RemoteMonitor)

#: Callbacks that would fight the engine, and what does their job instead.
_REFUSED = {
    keras.callbacks.ModelCheckpoint: "the engine checkpoints model_dir every "
    "checkpoint_interval steps and at the end, and keeps the best with best_metric=",
    keras.callbacks.BackupAndRestore: "the engine resumes from model_dir's latest checkpoint "
    "by itself, mid-epoch included: run the same call again",
}

#: Engine metrics that are not Keras logs: counts and speed (mfu differs by
#: worker, and a callback's decision must be the same on every one).
_NOT_LOGGED = ("examples", MFU)


def check(callbacks: Sequence[Any]) -> list:
    """The callbacks as a list, each a `keras.callbacks.Callback`; those that
    would fight the engine refused in one line."""
    checked = []
    for callback in callbacks or ():
        if not isinstance(callback, keras.callbacks.Callback):
            raise ConfigError(f"callbacks holds {type(callback).__name__}, not a "
                              "keras.callbacks.Callback")
        for kind, instead in _REFUSED.items():
            if isinstance(callback, kind):
                raise ConfigError(f"fit does not take keras.callbacks.{kind.__name__}: "
                                  f"{instead}")
        checked.append(callback)
    return checked


def runs_here(callback: Any, is_chief: bool) -> bool:
    """Writers run on the chief only; callbacks that decide run everywhere."""
    writes = isinstance(callback, _WRITERS) or getattr(callback, "chief_only", False)
    return is_chief or not writes


def _engine_means(metrics) -> dict:
    return {name: float(value) for name, value in metrics.items() if name not in _NOT_LOGGED}


class KerasCallbacks:
    """The callbacks of one run, driven by two actions: `train_action` after
    each train loop, `eval_action` after each validation (an epoch with
    validation ends there, with the val_ logs)."""

    def __init__(self, callbacks: Sequence[Any], *, model: Any, steps_per_epoch: int,
                 epochs: int, validates: bool, is_chief: bool, strategy: Any = None,
                 to_logs: Callable[[dict], dict] = dict, validation_freq: int = 1,
                 initial_epoch: int = 0):
        here = [c for c in callbacks if runs_here(c, is_chief)]
        self.callbacks = keras.callbacks.CallbackList(
            here, add_history=False, add_progbar=False, model=model, verbose=0,
            epochs=epochs, steps=steps_per_epoch)
        self.model = model
        self.steps_per_epoch, self.epochs = steps_per_epoch, epochs
        self.validates = validates
        # Keras validates after the epochs whose count is a multiple of
        # validation_freq, and numbers epochs from initial_epoch: the engine's
        # step 0 is the start of epoch initial_epoch.
        self.validation_freq, self.initial_epoch = validation_freq, initial_epoch
        # The engine's means -> Keras's logs (`CompiledModelTask.keras_logs`).
        self._to_logs = to_logs
        # In a cluster one tiny all-reduce per loop agrees on model.stop_training
        # (strategy None: this process decides alone).
        self._agree = StopRequest(strategy)
        self._epoch_sums: dict[str, float] = {}
        self._epoch_steps = 0
        self._pending: Optional[tuple[int, dict]] = None  # an epoch waiting for its validation
        self._epoch_open: Optional[int] = None
        self.last_logs: dict = {}
        self.train_action = _TrainSide(self)
        self.eval_action = _EvalSide(self)

    def train_begin(self) -> None:
        self.model.stop_training = False
        self.callbacks.on_train_begin()

    def _epoch(self, step: int) -> int:
        return self.initial_epoch + step // self.steps_per_epoch

    def loop_begin(self, step: int) -> None:
        epoch = self._epoch(step)
        if self._epoch_open != epoch:
            self._epoch_open = epoch
            self._epoch_sums, self._epoch_steps = {}, 0
            self.callbacks.on_epoch_begin(epoch)
        self.callbacks.on_train_batch_begin(step % self.steps_per_epoch)

    def loop_end(self, loop: LoopEnd) -> None:
        # Every step counts the same rows, so loops weigh by their steps; the
        # logs are the epoch's so far, as Keras's metrics are after each batch.
        epoch = self._epoch(loop.start)
        steps = loop.step - loop.start
        for name, value in _engine_means(loop.metrics).items():
            self._epoch_sums[name] = self._epoch_sums.get(name, 0.0) + value * steps
        self._epoch_steps += steps
        means = self._to_logs({k: v / self._epoch_steps for k, v in self._epoch_sums.items()})
        self.callbacks.on_train_batch_end(
            (loop.step - 1) % self.steps_per_epoch, dict(means))
        self._stop_if_asked("on_train_batch_end")
        if loop.step % self.steps_per_epoch == 0:  # the epoch's last loop
            if self.validates and (epoch + 1) % self.validation_freq == 0:
                self._pending = (epoch, means)
                self.callbacks.on_test_begin()
            else:
                self._end_epoch(epoch, means)

    def validated(self, loop: LoopEnd) -> None:
        if self._pending is None:  # the engine's closing evaluation, after an epoch
            return                   # Keras does not validate (validation_freq)
        val = self._to_logs(_engine_means(loop.metrics))
        self.callbacks.on_test_end(val)
        epoch, means = self._pending
        self._pending = None
        self._end_epoch(epoch, {**means, **{f"val_{k}": v for k, v in val.items()}})

    def _end_epoch(self, epoch: int, logs: dict) -> None:
        self._epoch_open = None
        self.last_logs = logs
        self.callbacks.on_epoch_end(epoch, logs)
        self._stop_if_asked("on_epoch_end")

    def _stop_if_asked(self, where: str) -> None:
        self._agree.requested = bool(getattr(self.model, "stop_training", False))
        if self._agree.agreed():
            self.model.stop_training = True
            raise StopTraining(f"a Keras callback set model.stop_training ({where})")

    def train_end(self) -> None:
        """`on_train_end` with the last epoch's logs (`fit` calls it after the run)."""
        self.callbacks.on_train_end(self.last_logs)


class _TrainSide(Action):
    """After each train loop; loops end on epoch boundaries."""

    def __init__(self, owner: KerasCallbacks):
        self.owner = owner

    def train_begin(self, step: int) -> None:
        self.owner.train_begin()

    def next_stop(self, step: int) -> Optional[int]:
        return next_multiple(step, self.owner.steps_per_epoch)

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
