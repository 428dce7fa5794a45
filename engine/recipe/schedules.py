"""The run's learning rate as a function of the global step.

Why the global step, and not `optimizer.iterations`: the optimizer counts
its own updates, which fall behind the run's step under `Objective(every=k)`,
skipped loss-scale steps (`mixed_float16`) and gradient accumulation. The
global step is what checkpoints, summaries and the data position agree on,
so a resumed run continues the schedule exactly where it stopped.

Why a variable, and not a Keras `LearningRateSchedule`: the optimizers the
engine builds keep Keras's float learning-rate variable (the checkpoint
layout every earlier run has), and the train loop assigns
`schedule(global_step)` to it before each step's objectives run
(`assign`). A rate that does not vary with the step (constant, no warmup) is
assigned once per loop instead, before its steps (`assign_per_loop`): a
constant rate adds no op to a step. An optimizer object a task or caller
supplies keeps its own rate.

With peak `P` (`--learning_rate`), end `E` (`--end_learning_rate`), `W`
warmup steps, `T` the run's last step (`--train_steps`), `t = s - W` and
`D = T - W`, the rate at global step `s` is::

    s < W (warmup)   P * s / W                       (0 at step 0, as Keras's
                                                      CosineDecay and optax)
    constant         P
    cosine           E + (P - E) * 0.5 * (1 + cos(pi * min(t, D) / D))
    polynomial       E + (P - E) * (1 - min(t, D) / D) ** power
    step             P * rate ** (number of --lr_decay_steps <= s)

`--scale_learning_rate=linear` multiplies `P` and `E` by the replica count
(the linear scaling rule: a batch N times larger takes N times larger steps).
The formula is written once, in TensorFlow ops (`LearningRate.__call__`);
`value` runs the same code eagerly, for logs and tests.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Optional, Sequence

import tensorflow as tf

from tfloop.engine.recipe.settings import LR_SCHEDULES, Recipe
from tfloop.engine.errors import ConfigError

logger = logging.getLogger(__name__)

#: Relative difference below which a restored rate counts as the schedule's own.
_SAME_RATE = 1e-5


@dataclasses.dataclass(frozen=True)
class LearningRate:
    """One run's learning rate schedule (see the module docstring).

    Attributes:
      schedule: constant | cosine | step | polynomial.
      peak: the rate after warmup (scaled already).
      end: the rate cosine and polynomial reach at `total_steps` (scaled already).
      warmup_steps: steps of linear warmup from 0.
      total_steps: the run's last global step.
      boundaries: `step`: the global steps where the rate is multiplied by `decay_rate`.
      decay_rate: `step`: the factor at each boundary.
      power: `polynomial`: the power.
      base: the unscaled `--learning_rate`, for `describe`.
      num_replicas: the replica count `peak` was scaled by (1: not scaled).
    """

    schedule: str = "constant"
    peak: float = 0.001
    end: float = 0.0
    warmup_steps: int = 0
    total_steps: int = 0
    boundaries: tuple = ()
    decay_rate: float = 0.1
    power: float = 1.0
    base: float = 0.001
    num_replicas: int = 1

    def __post_init__(self):
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(f"`schedule` ({self.schedule!r}) must be one of: "
                             f"{', '.join(LR_SCHEDULES)}")

    def __call__(self, step: Any) -> tf.Tensor:
        """The rate at global step `step` (an integer tensor), as a float32 tensor."""
        s = tf.cast(step, tf.float32)
        peak = tf.constant(self.peak, tf.float32)
        end = tf.constant(self.end, tf.float32)
        warmup = float(self.warmup_steps)
        # max(.., 1): a run of no steps after warmup has nothing to decay over.
        span = float(max(self.total_steps - self.warmup_steps, 1))
        if self.schedule == "constant":
            rate = peak
        elif self.schedule == "cosine":
            fraction = tf.minimum(tf.maximum(s - warmup, 0.0), span) / span
            rate = end + (peak - end) * 0.5 * (1.0 + tf.cos(math.pi * fraction))
        elif self.schedule == "polynomial":
            fraction = tf.minimum(tf.maximum(s - warmup, 0.0), span) / span
            rate = end + (peak - end) * tf.pow(1.0 - fraction, self.power)
        else:  # step
            passed = tf.constant(0.0)
            for boundary in self.boundaries:
                passed += tf.cast(s >= float(boundary), tf.float32)
            rate = peak * tf.pow(tf.constant(self.decay_rate, tf.float32), passed)
        if self.warmup_steps:
            rate = tf.where(s < warmup, peak * s / warmup, rate)
        return rate

    def value(self, step: int) -> float:
        """The rate at `step`, computed eagerly by the same ops as `__call__`."""
        return float(self(tf.constant(step, tf.int64)))

    @property
    def varies(self) -> bool:
        """Whether the rate changes with the step: not for a constant rate without warmup."""
        return self.schedule != "constant" or bool(self.warmup_steps)

    def describe(self) -> str:
        """The start-up log line, e.g. `learning rate: warmup 0 -> 0.4 over 500
        steps, then cosine to 0 at step 10000 (0.1 x 4 replicas,
        --scale_learning_rate=linear)`."""
        if self.schedule == "cosine":
            after = f"cosine to {self.end:g} at step {self.total_steps}"
        elif self.schedule == "polynomial":
            after = (f"polynomial (power {self.power:g}) to {self.end:g} at step "
                     f"{self.total_steps}")
        elif self.schedule == "step":
            after = (f"times {self.decay_rate:g} at step(s) "
                     f"{', '.join(str(b) for b in self.boundaries)}")
        else:
            after = "constant"
        if self.warmup_steps:
            text = f"warmup 0 -> {self.peak:g} over {self.warmup_steps} steps, then {after}"
        else:
            text = f"{self.peak:g}" + ("" if self.schedule == "constant" else f", {after}")
        if self.num_replicas != 1:
            text += (f" ({self.base:g} x {self.num_replicas} replicas, "
                     "--scale_learning_rate=linear)")
        return f"learning rate: {text}"


def from_config(recipe: Recipe, *, num_replicas: int, total_steps: int) -> LearningRate:
    """The schedule the run's recipe (`RunConfig.recipe`, the section that
    holds every schedule flag) asks for, over `num_replicas` replicas and a
    run that ends at global step `total_steps`.

    Raises:
      ConfigError: warmup that does not end before the last step.
    """
    if recipe.warmup_steps and total_steps and recipe.warmup_steps >= total_steps:
        raise ConfigError(
            f"--warmup_steps={recipe.warmup_steps} must be below the run's last step "
            f"({total_steps}): the run would end before reaching --learning_rate")
    scale = num_replicas if recipe.scale_learning_rate == "linear" else 1
    return LearningRate(
        schedule=recipe.lr_schedule, peak=recipe.learning_rate * scale,
        end=recipe.end_learning_rate * scale, warmup_steps=recipe.warmup_steps,
        total_steps=total_steps, boundaries=tuple(recipe.lr_decay_boundaries),
        decay_rate=recipe.lr_decay_rate, power=recipe.lr_power, base=recipe.learning_rate,
        num_replicas=scale)


def assign_rate(optimizer: Any, schedule: Optional[LearningRate], step: Any) -> None:
    """Sets `optimizer`'s learning-rate variable to `schedule(step)` (no-op for None).

    A `LossScaleOptimizer`'s `learning_rate` is its inner optimizer's; Keras's
    setter assigns the variable in place (never replaces it), so the
    checkpointed variable is the one that changes.
    """
    if schedule is not None:
        optimizer.learning_rate = schedule(step)


def assign(objectives: Sequence[Any], step: Any) -> None:
    """Before a step's objectives run: the rate for `step` of each objective
    whose schedule varies (`assign_per_loop` set the others)."""
    for objective in objectives:
        if objective.learning_rate is not None and objective.learning_rate.varies:
            assign_rate(objective.optimizer, objective.learning_rate, step)


def assign_per_loop(objectives: Sequence[Any], step: Any) -> None:
    """Before a loop's steps: the rate of each objective whose schedule does
    not vary with the step (once per loop, so a resumed run whose flags
    changed trains on the new rate from its first step)."""
    for objective in objectives:
        if objective.learning_rate is not None and not objective.learning_rate.varies:
            assign_rate(objective.optimizer, objective.learning_rate, step)


def announce(objectives: Sequence[Any], *, start_step: int, resumed: bool) -> None:
    """Logs the schedule once; on a resumed run, says when the restored rate is
    not what the schedule gave the last step trained (the flags changed): the
    next step's assignment makes the new flags take effect."""
    described = []
    for objective in objectives:
        schedule = objective.learning_rate
        if schedule is None:
            continue
        if schedule.describe() not in described:
            described.append(schedule.describe())
            logger.info("%s", schedule.describe())
        if not resumed or start_step < 1:
            continue
        restored = float(tf.convert_to_tensor(objective.optimizer.learning_rate))
        expected = schedule.value(start_step - 1)
        if abs(restored - expected) > _SAME_RATE * max(abs(restored), abs(expected), 1e-12):
            prefix = f"{objective.name}: " if len(objectives) > 1 else ""
            logger.info("%slearning rate %g -> %g from step %d (the flags changed)", prefix,
                        restored, schedule.value(start_step), start_step)
