"""A task's objectives, bound to variables and built optimizers.

`Task.objectives(model)` names what to minimize (`engine.task.Objective`);
this module turns that into what the trainers run: each objective's variable
list and an optimizer that exists under the strategy scope, has its slots,
and applies already-reduced gradients (the engine's collective does the one
all-reduce per gradient). It runs inside `strategy.scope()`.

The usual task has one objective over every trainable variable with the
run's `--optimizer`; its checkpoint keeps the single-optimizer layout
(`optimizer=`), so runs written before tasks existed still resume.

The recipe flags (`--lr_schedule`, `--warmup_steps`, `--scale_learning_rate`,
`--weight_decay`) shape the optimizers the engine builds from a name: each
such objective carries the run's `engine.recipe.schedules.LearningRate`, which the
trainers assign before each step, and its optimizer decays the variables
`--weight_decay_exclude` does not exclude. An optimizer object a task or
caller supplies keeps its own learning rate and decay.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.engine.recipe import keras_bridge, optimizers, precision, schedules
from tfloop.engine.task import failures as task_failures
from tfloop.engine.recipe.settings import Recipe
from tfloop.engine.runtime.settings import Speed
if TYPE_CHECKING:  # annotations only: the loop's room sits above this one
    from tfloop.engine.loop.settings import Step
from tfloop.engine.errors import ConfigError
from tfloop.engine.task.losses import LossFn, LossOutput
from tfloop.engine.recipe.schedules import LearningRate
from tfloop.engine.task import Task

logger = logging.getLogger(__name__)

#: The flags that shape only the optimizers the engine builds.
_RECIPE_FLAGS = ("lr_schedule", "warmup_steps", "scale_learning_rate", "weight_decay")


@dataclasses.dataclass(frozen=True)
class BoundObjective:
    """One objective as a trainer runs it.

    `learning_rate`: the schedule the trainers assign to `optimizer` before
    each step (an optimizer the engine built from a name); None for an
    optimizer object, which keeps its own rate. `weight_decay`: what its
    optimizer decays, for the start-up log; None when it does not.
    """

    name: str
    loss: LossFn
    variables: tuple
    optimizer: keras.optimizers.Optimizer
    every: int = 1
    learning_rate: Optional[LearningRate] = None
    weight_decay: Optional[optimizers.WeightDecay] = None
    #: The task's own step (`Task.gradients`), in place of the loss's
    #: gradients; None: the engine's (`engine.loop.replica_step`).
    gradients: Optional[Any] = None
    #: The task's whole step, its update included (`Task.train_step`: a
    #: Keras model's own `train_step`); None: the engine's.
    train_step: Optional[Any] = None


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


def bind(task: Task, model: Any, recipe: Recipe, step: Step, speed: Speed, *,
         num_replicas: int, total_steps: int,
         default_optimizer: Optional[keras.optimizers.Optimizer] = None) -> list[BoundObjective]:
    """`task.objectives(model)` with optimizers built (names → `--learning_rate`
    on the run's schedule over `num_replicas` replicas and `total_steps`
    steps, with `--weight_decay`; None → `default_optimizer` or
    `--optimizer`), wrapped for mixed precision and given their slots.

    The run's sections it reads: `recipe` (the optimizer, its schedule and
    decay), `step` (what a task's whole step cannot run with) and `speed`
    (precision, the fused update).

    Raises:
      ConfigError: no objectives, a repeated name, an objective without
        variables, one variable updated by two objectives, or recipe flags
        (schedule, warmup, scaling, weight decay) when every optimizer is an
        object that sets its own.
    """
    with task_failures.calling(task, "objectives"):
        declared = list(task.objectives(model))
    task_name = type(task).__name__
    if not declared:
        raise ConfigError(f"{task_name}.objectives(model) returned none; return at least one")
    bound, owner = [], {}
    schedule = None
    for objective in declared:
        if objective.name in {b.name for b in bound}:
            raise ConfigError(f"{task_name} has two objectives named {objective.name!r}; "
                              "give each its own name")
        with task_failures.calling(task, f"objectives()'s {objective.name!r}.variables"):
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
        given = objective.optimizer
        if given is None and default_optimizer is not None:
            given = default_optimizer
        if isinstance(given, keras.optimizers.Optimizer):
            optimizer = precision.wrap_optimizer(_in_scope(given), speed.mixed_precision)
            bound.append(BoundObjective(objective.name, objective.loss, variables,
                                        _ready(optimizer, variables), objective.every))
            continue
        schedule = schedule or schedules.from_config(recipe, num_replicas=num_replicas,
                                                     total_steps=total_steps)
        optimizer, decay = _build_optimizer(given or recipe.optimizer, recipe, speed, schedule,
                                            variables)
        bound.append(BoundObjective(objective.name, objective.loss, variables,
                                    _ready(optimizer, variables), objective.every,
                                    learning_rate=schedule, weight_decay=decay))
    if schedule is None:
        _refuse_recipe_flags(recipe, task_name)
    own_step = own_gradients(task)
    if own_step is not None:
        bound = [dataclasses.replace(b, gradients=own_step) for b in bound]
    whole_step = task.train_step
    if whole_step is not None:
        _check_whole_step(task, whole_step, bound, step)
        bound = [dataclasses.replace(b, train_step=whole_step) for b in bound]
    return bound


#: What the engine does inside its own step, which a task's whole step
#: (`Task.train_step`) replaces: (whether the run's step asks for it, its flag).
_INSIDE_THE_STEP = (
    (lambda c: c.nan_policy == "skip_step", "--nan_policy=skip_step"),
    (lambda c: bool(c.clip_norm), "--clip_norm"),
    (lambda c: c.accumulation_steps > 1, "--accumulation_steps"),
    (lambda c: c.jit_compile, "--jit_compile"),
)


def _check_whole_step(task: Task, whole_step: Any, bound: Sequence[BoundObjective],
                      step: Step) -> None:
    """Refuses, in one line, what a whole step cannot run with: the options
    the engine applies inside its own step (skipping a non-finite update,
    clipping, accumulating, XLA, which cannot compile an all-reduce inside a
    replica's step), several objectives and `gradients`. The fused update
    runs: it is the optimizer's `apply`, which the step calls."""
    where = getattr(whole_step, "__qualname__", None) or f"{type(task).__name__}.train_step"
    if len(bound) > 1 or own_gradients(task) is not None:
        raise ConfigError(f"{where} is the whole step of one objective; give "
                          f"{type(task).__name__} one objective and no gradients()")
    for on, flag in _INSIDE_THE_STEP:
        if on(step):
            raise ConfigError(f"{flag} acts inside the engine's own step, and {where} runs "
                              "whole in its place (its update included); drop the flag")
    if task.jit_compile:
        raise ConfigError(f"compile(jit_compile=True) with {where}: XLA cannot compile the "
                          "all-reduce inside the replicas' step, which the engine runs whole; "
                          "compile without it (jit_compile=False)")


def release(objectives: Sequence[BoundObjective]) -> None:
    """Gives the optimizers back as they came: Keras's own gradient
    reduction, which `_ready` turned off for the run, is on again."""
    for objective in objectives:
        keras_bridge.restore_implicit_gradient_reduction(objective.optimizer)


def own_gradients(task: Any):
    """The task's own step, `task.gradients`, where its class defines one
    (the base `Task.gradients` is the engine's step); else None."""
    method = getattr(type(task), "gradients", None)
    if method is None or method is getattr(Task, "gradients", None):
        return None
    return task.gradients


def _build_optimizer(name: str, recipe: Recipe, speed: Speed, schedule: LearningRate,
                     variables: Sequence):
    """The optimizer named `name`, decaying all of `variables` but those
    excluded, and its `WeightDecay` (None: no decay)."""
    optimizers.check(name)
    build = optimizers.build_fused if speed.fused_optimizer else optimizers.build
    optimizer = build(name, schedule.peak, weight_decay=recipe.weight_decay)
    # Before wrapping: the inner optimizer applies the decay, and before
    # `_ready` builds it, which Keras requires.
    decay = optimizers.exclude_from_decay(
        optimizer, variables, recipe.weight_decay_exclude,
        adamw_default=name == "adamw" and not recipe.weight_decay)
    return precision.wrap_optimizer(optimizer, speed.mixed_precision), decay


def _refuse_recipe_flags(recipe: Recipe, task_name: str) -> None:
    """The recipe flags shape only optimizers the engine builds; asked for
    when there is none, they would be ignored in silence."""
    given = recipe.changed(*_RECIPE_FLAGS)
    if given:
        raise ConfigError(
            f"{', '.join(given)}: every objective of {task_name} trains with an optimizer "
            "object, which sets its own learning rate and decay; drop the flag, or let the "
            "engine build the optimizer (--optimizer, or a name in Objective(optimizer=...))")


def _in_scope(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """`optimizer` itself, its variables in the current strategy's scope.

    The instance trains as given: whatever it holds (a schedule object,
    `exclude_from_weight_decay`, EMA, clipping, gradient accumulation, a
    subclass's own state) is what a copy from `get_config()` would drop.
    One made under the run's scope (`fit`'s `model_fn`, `Task.build_optimizer`)
    is already the strategy's. A Keras 3 optimizer makes its step counter and
    learning rate when constructed, so one made outside (the natural way to
    pass one to `run()`) is moved: those variables are remade in the scope
    and the instance updates through the run's strategy
    (`keras_bridge.place_optimizer`). A built one outside the scope has slots
    for other variables than the run's: refused.
    """
    strategy = tf.distribute.get_strategy()
    _refuse_conditional_updates(optimizer, strategy)
    if keras_bridge.optimizer_strategy(optimizer) is strategy:
        return optimizer
    if optimizer.built:
        raise ConfigError(
            f"the optimizer {optimizer.name!r} ({type(optimizer).__name__}) was built for other "
            "variables under another strategy (optimizer.build, or an earlier run); pass a new, "
            "unbuilt one: the engine builds it for the run's model in the run's scope")
    keras_bridge.place_optimizer(optimizer, strategy)
    return optimizer


#: Optimizer settings whose update Keras puts in a `tf.cond`, and what to do instead.
_CONDITIONAL_UPDATES = {
    "gradient_accumulation_steps": "batch N times larger with RunConfig(accumulation_steps=N) "
                                   "(--accumulation_steps), which sums micro-batches in one step",
    "ema_overwrite_frequency": "drop it (fit still ends with use_ema's average in the weights)",
}


def _refuse_conditional_updates(optimizer: keras.optimizers.Optimizer, strategy) -> None:
    """Keras updates every N steps inside a `tf.cond`, whose branches
    `merge_call`: a MirroredStrategy (Keras's own `fit` under it too) fails
    there with a long traceback; the default and one-device strategies run it."""
    if not tf.distribute.has_strategy() or isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    for name, instead in _CONDITIONAL_UPDATES.items():
        if getattr(optimizer, name, None):
            raise ConfigError(
                f"the optimizer's {name}={getattr(optimizer, name)!r} updates inside a tf.cond, "
                f"which {type(strategy).__name__} cannot run (Keras's own fit under it fails "
                f"alike); {instead}, or train on one device")


def checkpointed(objectives: Sequence[BoundObjective]) -> Any:
    """What a checkpoint's `optimizer=` holds: the optimizer of a one-objective
    run (the layout every earlier run has), else `{name: optimizer}`."""
    if len(objectives) == 1:
        return objectives[0].optimizer
    return {objective.name: objective.optimizer for objective in objectives}


def learning_rates(objectives: Sequence[BoundObjective]) -> dict:
    """The train metric `learning_rate` (`<objective>/learning_rate` with
    several): the rate the last step used, for each objective on the run's
    schedule. Call where the step ran (inside the trainer's loop)."""
    return {metric_name(objectives, o, "learning_rate"):
            tf.convert_to_tensor(o.optimizer.learning_rate)
            for o in objectives if o.learning_rate is not None}


def announce(objectives: Sequence[BoundObjective], *, start_step: int, resumed: bool) -> None:
    """The start-up lines of a training run: the learning rate schedule, a
    rate changed by the flags on resume (`engine.recipe.schedules.announce`), and
    what weight decay applies to."""
    schedules.announce(objectives, start_step=start_step, resumed=resumed)
    for objective in objectives:
        if objective.weight_decay is not None:
            prefix = f"{objective.name}: " if len(objectives) > 1 else ""
            logger.info("%s%s", prefix, objective.weight_decay.describe())


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
