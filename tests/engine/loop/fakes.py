"""Stand-ins for the Controller's runners and writers: loop cutting and actions
are tested without building a model or a compiled loop."""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from tfloop.engine.loop.actions import Action, LoopEnd, Profile
from tfloop.engine.loop.contracts import AbstractEvaluator, AbstractTrainer


def step_variable(value: int = 0) -> tf.Variable:
    return tf.Variable(value, dtype=tf.int64, trainable=False, name="global_step")


class FakeTrainer(AbstractTrainer):
    """Advances the step by `num_steps`; records where each loop ended.

    `during(step)` runs inside each loop, after the step moved (e.g. to
    deliver a signal, as one would arrive while TensorFlow computes).
    """

    def __init__(self, step: tf.Variable, during: Optional[Callable[[int], None]] = None):
        self.step = step
        self.loop_ends: list[int] = []
        self._during = during

    def train(self, num_steps):
        self.step.assign_add(num_steps)
        end = int(self.step.numpy())
        self.loop_ends.append(end)
        if self._during:
            self._during(end)
        return {"loss": 1.0 / end, "examples": 8.0 * num_steps}


class FakeEvaluator(AbstractEvaluator):
    """Reports the global step it evaluated at as its `loss`."""

    def __init__(self, step: tf.Variable, after: Optional[Callable[[int], None]] = None):
        self.step = step
        self.evaluated: list[int] = []
        self._after = after

    def evaluate(self, num_steps=-1):
        step = int(self.step.numpy())
        self.evaluated.append(step)
        if self._after:
            self._after(step)
        return {"loss": float(step), "examples": 16.0}


class Recorder(Action):
    """Records every LoopEnd and loop_begin; optionally asks for a stop."""

    def __init__(self, every: int = 0):
        self.ends: list[LoopEnd] = []
        self.begins: list[int] = []
        self.closed = 0
        self._every = every

    def next_stop(self, step):
        return step + self._every - step % self._every if self._every else None

    def loop_begin(self, step):
        self.begins.append(step)

    def __call__(self, loop):
        self.ends.append(loop)

    def close(self):
        self.closed += 1


class RecordingWriter:
    """A `SummaryWriter` that keeps what it is given."""

    def __init__(self):
        self.writes: list[tuple[int, dict]] = []

    def write(self, step, scalars):
        self.writes.append((step, dict(scalars)))


class RecordingProfile(Profile):
    """`Profile` with the profiler replaced by a record of the steps it ran at."""

    def __init__(self, step: tf.Variable, **kwargs):
        super().__init__(**kwargs)
        self._step = step
        self.started: list[int] = []
        self.stopped: list[int] = []

    def _start(self):
        self.started.append(int(self._step.numpy()))

    def _stop(self):
        self.stopped.append(int(self._step.numpy()))
