"""What every mode of a run works with, built once under the strategy's scope.

    parts = build_parts(plan, strategy, optimizer)
      model, objectives (optimizers built, slots too), global_step   # task.build_model() ...
      average      the weights' moving average (--ema_decay; a checkpoint's, for --mode=evaluate)
      evaluator    for the modes that evaluate
      best_export  how the best checkpoint is exported (--best_metric with --export)

`engine.assembly.runner.Runner` takes the parts and runs the plan's mode;
`export_checkpoint` builds the model alone (`build_model_and_objectives`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Optional

import keras
import tensorflow as tf

from tfloop.engine.assembly import serving
from tfloop.engine.assembly.plan import Plan
from tfloop.engine.errors import ConfigError
from tfloop.engine.loop import best, task_inputs
from tfloop.engine.loop.contracts import AbstractEvaluator
from tfloop.engine.loop.evaluator import AveragedEvaluator, Evaluator
from tfloop.engine.recipe import ema, precision
from tfloop.engine.recipe import objectives as objectives_lib
from tfloop.engine.run_dir import checkpointing
from tfloop.engine.task import Task
from tfloop.engine.task import failures as task_failures

#: The run's one logger (`engine.assembly.run`'s): users and tests filter by its name.
logger = logging.getLogger("tfloop.engine.assembly.run")


@dataclasses.dataclass(frozen=True)
class Parts:
    """What every mode runs with, built once by `build_parts`."""

    task: Task
    strategy: tf.distribute.Strategy
    model: keras.Model
    objectives: list
    global_step: tf.Variable
    average: Optional[ema.WeightAverage]
    evaluator: Optional[AbstractEvaluator]
    best_export: Optional[best.ExportFn]


def build_parts(plan: Plan, strategy: tf.distribute.Strategy,
                optimizer: Optional[keras.optimizers.Optimizer] = None) -> Parts:
    """The model, objectives, moving average, evaluator and best export, with
    the best checkpoint's request checked against the evaluator's metrics."""
    config = plan.config
    model, objectives, global_step = build_model_and_objectives(plan, strategy, optimizer)
    average = _build_average(plan, strategy, model, objectives)
    evaluator = _build_evaluator(plan, strategy, model, objectives, average)
    best.check_request(config.keeping, config.loop, mode=plan.mode, in_cluster=plan.role.in_cluster,
                       available=evaluator.metric_names if evaluator else None)
    if evaluator is not None:
        best.check_evaluation_not_empty(config.keeping, evaluator)
    best_export = (_best_export(plan, strategy, model, global_step, average)
                   if config.best_metric and config.export else None)
    return Parts(task=plan.task, strategy=strategy, model=model, objectives=objectives,
                 global_step=global_step, average=average, evaluator=evaluator,
                 best_export=best_export)


def build_model_and_objectives(plan: Plan, strategy: tf.distribute.Strategy,
                               optimizer: Optional[keras.optimizers.Optimizer] = None):
    """The model, its objectives (optimizers built, slots too) and the global
    step, under the scope."""
    config, task = plan.config, plan.task
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        with precision.model_policy(config.mixed_precision), \
                task_failures.calling(task, "build_model"):
            model = task.build_model()
        if not hasattr(model, "trainable_variables"):
            raise ConfigError(f"{type(task).__name__}.build_model() returned "
                              f"{type(model).__name__}, not a model; return a keras.Model (for "
                              "several models, one keras.Model that holds them)")
        _check_built_in_scope(task, model, strategy)
        if getattr(model, "compiled", False) and not task.uses_compile:
            logger.info("the model arrives compile()d: its compiled optimizer, loss and metrics "
                        "are not used; %s's objectives and optimizers train it (fit and "
                        "--task=module:function train with them: docs/keras.md)",
                        type(task).__name__)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        if optimizer is None:
            with task_failures.calling(task, "build_optimizer"):
                optimizer = task.build_optimizer()
        objectives = objectives_lib.bind(task, model, config.recipe, config.step, config.speed,
                                         num_replicas=plan.schedule_replicas,
                                         total_steps=config.train_steps,
                                         default_optimizer=optimizer)
        if task.uses_compile:
            # The compiled optimizer itself trains (objectives._in_scope); model.optimizer
            # is it, or the engine's LossScaleOptimizer around it (--mixed_precision).
            model.optimizer = objectives[0].optimizer
    return model, objectives, global_step


def _check_built_in_scope(task: Task, model: Any, strategy: tf.distribute.Strategy) -> None:
    """Refuses a model made before `build_model` was called (in the task's
    `__init__`, say): its variables are not the strategy's, and TensorFlow's
    own complaint comes later, from the optimizer, naming neither."""
    for variable in model.trainable_variables:
        if not strategy.extended.variable_created_in_scope(getattr(variable, "value", variable)):
            raise ConfigError(
                f"{type(task).__name__}.build_model() returned a model whose variables were made "
                f"outside strategy.scope() ({getattr(variable, 'path', variable.name)}): create the "
                "model inside build_model(), not in __init__ or before run()")


def _build_average(plan: Plan, strategy, model, objectives) -> Optional[ema.WeightAverage]:
    """The weights' moving average: with --ema_decay, and for `--mode=evaluate`
    of a checkpoint that holds one (evaluation uses the average when there is one)."""
    config = plan.config
    if plan.role.is_evaluator or not (config.ema_decay or (
            plan.mode == "evaluate"
            and checkpointing.holds(plan.latest_checkpoint, checkpointing.AVERAGES))):
        return None
    keys = {id(variable): key for key, variable in checkpointing.named_weights(model).items()}
    variables = [v for objective in objectives for v in objective.variables]
    outside = [v.name for v in variables if id(v) not in keys]
    if outside:
        raise ConfigError(f"--ema_decay averages the model's variables, and {outside[0]} is "
                          "trained but not held by the model; make it part of build_model()'s model")
    average = ema.WeightAverage(strategy, variables, [keys[id(v)] for v in variables],
                                config.ema_decay)
    logger.info("%s the moving average of the weights%s",
                "evaluation and export use" if plan.mode != "evaluate" and config.export
                else "evaluation uses",
                f" (--ema_decay={config.ema_decay})" if config.ema_decay else
                f" that {plan.latest_checkpoint} holds")
    return average


def _build_evaluator(plan: Plan, strategy, model, objectives,
                     average: Optional[ema.WeightAverage]) -> Optional[AbstractEvaluator]:
    if plan.mode == "train":
        return None
    eval_dataset = task_inputs.eval_dataset(plan.task, task_inputs.context_for(plan.inputs))
    evaluator = Evaluator(strategy=strategy, model=model, eval_dataset=eval_dataset,
                          loss_fn=objectives_lib.combined_loss(objectives))
    return AveragedEvaluator(evaluator, average) if average else evaluator


def _best_export(plan: Plan, strategy, model, global_step: tf.Variable,
                 average: Optional[ema.WeightAverage]) -> best.ExportFn:
    """How the best checkpoint is exported: the weights just evaluated (the
    moving average, with one), into `<export_root>/export/<step>/`
    (`export_root` is `model_dir/best`)."""
    def export_best(export_root: str) -> Optional[str]:
        with average.swapped() if average else contextlib.nullcontext():
            return serving.export_trained(plan, strategy, model, int(global_step.numpy()),
                                          directory=export_root)
    return export_best
