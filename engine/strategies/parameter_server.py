"""`--strategy=parameter_server`: asynchronous training with variables on ps tasks.

Only the chief builds the strategy and trains (a `ClusterCoordinator` sends
closures to the workers); workers and ps tasks serve it until stopped.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from tfloop.engine.loop import ps_trainer, task_inputs
from tfloop.engine.loop.contracts import AbstractTrainer, LoopClock
from tfloop.engine.errors import ConfigError
from tfloop.engine.recipe.ema import WeightAverage
from tfloop.engine.recipe.objectives import BoundObjective
from tfloop.engine.strategies.registry import register
from tfloop.engine.strategies.spec import (NO_CLUSTER, ReducesItself, TrainerPlan,
                                            announce_open_server,
                                            local_replicas_of_a_cluster_task)
from tfloop.engine.task import Task


@register
class ParameterServer(ReducesItself):
    name = "parameter_server"
    summary = "asynchronous training: a chief, workers and ps tasks from TF_CONFIG"
    cluster_jobs = frozenset({"chief", "worker", "ps"})
    reduction = "whose workers update the variables on the ps tasks, with no all-reduce"
    loop_runs_here = False  # the coordinator schedules its functions on the workers

    def check(self, sections, role) -> None:
        super().check(sections, role)
        step = sections.step
        ps_trainer.check(role, mode=sections.loop.mode, jit_compile=step.jit_compile)
        if step.nan_policy == "skip_step":
            raise ConfigError(
                "--nan_policy=skip_step does not apply to --strategy=parameter_server: each "
                "worker applies its own steps asynchronously, with no all-reduced norm for "
                "every replica to decide on; use --nan_policy=stop")
        step_options = (step.changed("accumulation_steps", "clip_norm")
                        + sections.recipe.changed("ema_decay")
                        + sections.loop.changed("max_per_replica_batch_size"))
        if step_options:
            raise ConfigError(
                f"{step_options[0]} is a step option of the synchronous strategies, and "
                "--strategy=parameter_server applies each worker's gradients as they come; "
                "drop it or use --strategy=multi_worker")

    def num_replicas(self, devices, *, role=NO_CLUSTER, connection=None) -> int:
        """The replicas *of one worker*: each scheduled step is one worker's, on a
        whole global batch, applied to the ps variables without waiting for the
        other workers."""
        return local_replicas_of_a_cluster_task(self.name, devices)

    def serves_only(self, role) -> bool:
        return role.task_type in ("worker", "ps")

    def serve(self, role) -> dict:
        announce_open_server(role)
        return ps_trainer.serve(role)

    def build(self, devices, *, role=NO_CLUSTER, **unused) -> tf.distribute.Strategy:
        announce_open_server(role)  # the chief's coordinator serves too
        return tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver())

    def build_trainer(self, plan: TrainerPlan, *, strategy: tf.distribute.Strategy,
                      model: Any, objectives: Sequence[BoundObjective],
                      global_step: tf.Variable, start_step: int, task: Task,
                      average: Optional[WeightAverage] = None,
                      clock: Optional[LoopClock] = None) -> AbstractTrainer:
        """The coordinator's trainer; its steps run on the workers, so nothing
        here times them (`loop_runs_here` is False: the assembly builds no clock)."""
        if task.jit_compile:  # a compiled Keras model's (fit)
            raise ConfigError("the model was compiled with jit_compile=True, which "
                              "--strategy=parameter_server does not run; compile without it")
        if len(objectives) > 1:
            raise ConfigError(
                f"--strategy=parameter_server trains one objective, and {type(task).__name__} "
                f"has {len(objectives)} ({', '.join(o.name for o in objectives)}); "
                "use --strategy=multi_worker")
        if objectives[0].train_step is not None:
            raise ConfigError(
                f"--strategy=parameter_server runs the task's loss, and "
                f"{getattr(objectives[0].train_step, '__qualname__', 'train_step')} is a step of "
                "its own; use --strategy=multi_worker")
        if objectives[0].gradients is not None:
            raise ConfigError(
                f"--strategy=parameter_server runs the task's loss, and {type(task).__name__} "
                "defines its own step (gradients()); use --strategy=multi_worker")

        def train_dataset_fn(batch_size: int) -> tf.data.Dataset:
            # Seedless: each worker draws its own order (see ps_trainer).
            context = task_inputs.context_for(plan.inputs, global_batch_size=batch_size,
                                              seeded=False)
            return task_inputs.train_dataset(task, context)

        return ps_trainer.ParameterServerTrainer(
            strategy=strategy, model=model, objective=objectives[0],
            train_dataset_fn=train_dataset_fn,
            global_batch_size=plan.sections.loop.global_batch_size, global_step=global_step,
            num_workers=len(plan.role.cluster["worker"]), seed=plan.sections.recipe.seed)
