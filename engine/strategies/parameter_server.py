"""`--strategy=parameter_server`: asynchronous training with variables on ps tasks.

Only the chief builds the strategy and trains (a `ClusterCoordinator` sends
closures to the workers); workers and ps tasks serve it until stopped.
"""

from __future__ import annotations

import tensorflow as tf

from tfloop.engine import ps_trainer
from tfloop.engine.strategies.registry import register
from tfloop.engine.strategies.spec import NO_CLUSTER, ReducesItself, local_replicas_of_a_cluster_task


@register
class ParameterServer(ReducesItself):
    name = "parameter_server"
    summary = "asynchronous training: a chief, workers and ps tasks from TF_CONFIG"
    cluster_jobs = frozenset({"chief", "worker", "ps"})
    reduction = "whose workers update the variables on the ps tasks, with no all-reduce"

    def check(self, config, role) -> None:
        super().check(config, role)
        ps_trainer.check(role, mode=config.mode, jit_compile=config.jit_compile)

    def num_replicas(self, devices, *, role=NO_CLUSTER, connection=None) -> int:
        """The replicas *of one worker*: each scheduled step is one worker's, on a
        whole global batch, applied to the ps variables without waiting for the
        other workers."""
        return local_replicas_of_a_cluster_task(self.name, devices)

    def serves_only(self, role) -> bool:
        return role.task_type in ("worker", "ps")

    def serve(self, role) -> dict:
        return ps_trainer.serve(role)

    def build(self, devices, **unused) -> tf.distribute.Strategy:
        return tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver())

    def build_trainer(self, plan, *, strategy, model, optimizer, global_step, start_step,
                      loss_fn):
        config = plan.config
        return ps_trainer.ParameterServerTrainer(
            strategy=strategy, model=model, optimizer=optimizer, train_split=plan.splits.train,
            global_batch_size=config.global_batch_size, global_step=global_step,
            num_workers=len(plan.role.cluster["worker"]), loss_fn=loss_fn, seed=config.seed)
