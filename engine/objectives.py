"""A task's objectives, bound to variables and built optimizers.

`Task.objectives(model)` names what to minimize (`engine.task.Objective`);
this module turns that into what the trainers run: each objective's variable
list and an optimizer that exists under the strategy scope, has its slots,
and applies already-reduced gradients (the engine's collective does the one
all-reduce per gradient). It runs inside `strategy.scope()`.

The usual task has one objective over every trainable variable with the
run's `--optimizer`; its checkpoint keeps the single-optimizer layout
(`optimizer=`), so runs written before tasks existed still resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.engine import keras_bridge, optimizers, precision
from tfloop.engine.errors import ConfigError
from tfloop.engine.losses import LossFn, LossOutput


@dataclasses.dataclass(frozen=True)
class BoundObjective:
    """One objective as a trainer runs it."""

    name: str
    loss: LossFn
    variables: tuple
    optimizer: keras.optimizers.Optimizer
    every: int = 1


def single(loss: LossFn, variables: Sequence, optimizer: keras.optimizers.Optimizer
           ) -> list[BoundObjective]:
    """The one-objective case, for trainers built by hand (tests, benchmarks);
    call under the strategy scope."""
    return [BoundObjective("loss", loss, tuple(variables), _ready(optimizer, variables))]


def _ready(optimizer: keras.optimizers.Optimizer, variables: Sequence
           ) -> keras.optimizers.Optimizer:
    """`optimizer` with its slots (so a checkpoint restore fills them at once)
    and without Keras's own gradient all-reduce (the collective does it).
    Built once only: `LossScaleOptimizer.build` makes new scale variables
    each call."""
    if not optimizer.built:
        optimizer.build(list(variables))
    keras_bridge.disable_implicit_gradient_reduction(optimizer)
    return optimizer


def bind(task: Any, model: Any, config: Any, *,
         default_optimizer: Optional[keras.optimizers.Optimizer] = None) -> list[BoundObjective]:
    """`task.objectives(model)` with optimizers built (names → `--learning_rate`,
    None → `default_optimizer` or `--optimizer`), wrapped for mixed precision
    and given their slots.

    Raises:
      ConfigError: no objectives, a repeated name, an objective without
        variables, or one variable updated by two objectives.
    """
    declared = list(task.objectives(model))
    task_name = type(task).__name__
    if not declared:
        raise ConfigError(f"{task_name}.objectives(model) returned none; return at least one")
    bound, owner = [], {}
    for objective in declared:
        if objective.name in {b.name for b in bound}:
            raise ConfigError(f"{task_name} has two objectives named {objective.name!r}; "
                              "give each its own name")
        variables = tuple(objective.variables(model))
        if not variables:
            raise ConfigError(f"{task_name}'s objective {objective.name!r} has no variables "
                              "to train; its variables(model) returned none")
        for variable in variables:
            other = owner.setdefault(id(variable), objective.name)
            if other != objective.name:
                raise ConfigError(
                    f"{task_name}: {variable.name} is trained by both {other!r} and "
                    f"{objective.name!r}; give each variable to one objective")
        optimizer = _ready(_build_optimizer(objective.optimizer, config, default_optimizer),
                           variables)
        bound.append(BoundObjective(objective.name, objective.loss, variables, optimizer,
                                    objective.every))
    return bound


def _build_optimizer(given, config, default_optimizer) -> keras.optimizers.Optimizer:
    if given is None and default_optimizer is not None:
        given = default_optimizer
    if isinstance(given, keras.optimizers.Optimizer):
        return precision.wrap_optimizer(_in_scope(given), config.mixed_precision)
    name = given or config.optimizer
    optimizers.check(name)
    build = optimizers.build_fused if config.fused_optimizer else optimizers.build
    return precision.wrap_optimizer(build(name, config.learning_rate), config.mixed_precision)


def _in_scope(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """A copy (from `get_config()`) made under the current strategy scope.

    A Keras 3 optimizer creates its step counter and learning rate variables
    when it is constructed, so one made outside `strategy.scope()` (the
    natural way to pass one to `run()`) belongs to another strategy and
    cannot update distributed variables. A copy of an unused optimizer loses
    nothing; a built one (slots and all) is the caller's to place, as is.
    """
    if optimizer.built:
        return optimizer
    return type(optimizer).from_config(optimizer.get_config())


def checkpointed(objectives: Sequence[BoundObjective]) -> Any:
    """What a checkpoint's `optimizer=` holds: the optimizer of a one-objective
    run (the layout every earlier run has), else `{name: optimizer}`."""
    if len(objectives) == 1:
        return objectives[0].optimizer
    return {objective.name: objective.optimizer for objective in objectives}


def metric_name(objectives: Sequence[BoundObjective], objective: BoundObjective,
                metric: str) -> str:
    """`loss`, `accuracy` for one objective; `<objective>/loss` for several."""
    return metric if len(objectives) == 1 else f"{objective.name}/{metric}"


def combined_loss(objectives: Sequence[BoundObjective]) -> LossFn:
    """One loss function reporting every objective, for evaluation: their
    per-example losses summed, each objective's loss and metrics by name."""
    if len(objectives) == 1:
        return objectives[0].loss

    def loss(model, batch, *, training: bool) -> LossOutput:
        outputs = [(o, o.loss(model, batch, training=training)) for o in objectives]
        metrics = {}
        for objective, output in outputs:
            metrics[f"{objective.name}/loss"] = tf.cast(output.per_example_loss, tf.float32)
            for key, value in output.metrics.items():
                metrics[metric_name(objectives, objective, key)] = value
        total = tf.add_n([metrics[f"{o.name}/loss"] for o, _ in outputs])
        return LossOutput(per_example_loss=total, metrics=metrics)

    return loss
