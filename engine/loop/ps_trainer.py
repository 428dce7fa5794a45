"""`--strategy=parameter_server`: asynchronous training, coordinated from the chief.

A `TF_CONFIG` cluster of one chief, workers and ps tasks (`bin/launch --chief
--num_workers=2 --num_ps=1 -- bin/train --strategy=parameter_server ...`)::

    ps, worker   serve(): a tf.distribute.Server, until stopped (SIGTERM)
    chief        ParameterServerStrategy: variables on the ps tasks
                 ClusterCoordinator: schedules closures on the workers
                 ParameterServerTrainer.train(n), once per Controller loop:
                     split n steps into one closure per worker
                     schedule each: `k` steps in one tf.function, each step
                         learning rate = schedule(global_step)  (a ps variable)
                         strategy.run(replica_step, next(worker's iterator))
                         global_step += 1          (a ps variable)
                     coordinator.join()            (the loop boundary)
                 then, as for every strategy: progress line, summaries,
                 ckpt-<step> in model_dir (CheckpointManager), metrics.json

Training is asynchronous: every step is one worker's, on a whole
`--global_batch_size` batch, applied to the ps variables without waiting
for the other workers, so the weights do not match a synchronous run and a
rerun does not reproduce them. There is no all-reduce (`--collective` is
refused); the Keras optimizer's own reduction sums over a worker's local
GPUs, if it has several.

Input: each worker builds its own pipeline from the same dataset function
(`create_per_worker_dataset` over `distribute_datasets_from_function`, whose
`InputContext` gives the per-replica batch). The function is traced once,
on the chief, with no global seed, so each worker shuffles in its own
order (a fixed seed would feed every worker the same batches). A resumed
run restores the weights, optimizer and step; its data order is new.

Failures, as TensorFlow's coordinator allows: a worker that dies has its
closure re-run on another worker (the steps it had applied stay applied and
may count twice in `global_step`) and is used again if it comes back; a ps
task or the chief dying ends the run, which resumes from the last checkpoint.
`bin/launch` carries on when a worker of such a cluster dies (see
`launch.launcher`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import keras
import tensorflow as tf

from tfloop.engine.recipe import schedules
from tfloop.engine.recipe.objectives import BoundObjective
from tfloop.engine.errors import ConfigError
from tfloop.engine.loop.replica_step import metric_names, replica_gradients
from tfloop.engine.loop.replica_sums import EXAMPLES
from tfloop.engine.loop.contracts import AbstractTrainer, Metrics
from tfloop.launch import tf_config

logger = logging.getLogger(__name__)

_HOW = ("start one with bin/launch --chief --num_workers=2 --num_ps=1 -- "
        "bin/train --strategy=parameter_server ...")


def check(role: tf_config.Role, *, mode: str, jit_compile: bool = False) -> None:
    """Refuses what parameter_server cannot do, in one line, before anything is built."""
    if not role.in_cluster:
        raise ConfigError("--strategy=parameter_server needs a TF_CONFIG cluster with a chief, "
                          f"workers and ps tasks; {_HOW}")
    missing = [job for job in ("chief", "worker", "ps") if job not in role.cluster]
    if missing:
        raise ConfigError(f"--strategy=parameter_server needs chief, worker and ps jobs in "
                          f"TF_CONFIG, and it has no {' or '.join(missing)}; {_HOW}")
    if role.is_chief and mode not in ("", "train"):
        raise ConfigError(f"--mode={mode}: under --strategy=parameter_server the chief only "
                          "trains; evaluate with a sidecar evaluator (bin/launch --evaluator) "
                          "or --mode=evaluate without TF_CONFIG")
    if jit_compile:
        raise ConfigError("--jit_compile does not apply to --strategy=parameter_server in this "
                          "version; drop it")


def serve(role: tf_config.Role) -> dict:
    """A worker or ps task: serves the coordinator until the process is stopped."""
    server = tf.distribute.Server(
        tf.train.ClusterSpec({job: list(tasks) for job, tasks in role.cluster.items()}),
        job_name=role.task_type, task_index=role.task_index, protocol="grpc", start=True)
    logger.info("%s: serving at %s (pid %d) until stopped", role.name,
                role.cluster[role.task_type][role.task_index], os.getpid())
    server.join()  # returns only when the process is killed
    return {}


class ParameterServerTrainer(AbstractTrainer):
    """The chief's train loop: `train(n)` runs `n` steps spread over the workers.

    An `engine.loop.contracts.AbstractTrainer`, as `engine.loop.trainer.Trainer` is.

    Args:
      strategy: the `ParameterServerStrategy` model and optimizer were built under.
      model: built under `strategy.scope()`.
      objective: what a step does (`engine.recipe.objectives.BoundObjective`,
        the task's one objective): its per-example `loss` (see
        `engine.task.losses`), its `optimizer` (built under `strategy.scope()`)
        and the `learning_rate` schedule assigned to it before each step
        (`engine.recipe.schedules`; None: the optimizer keeps its own rate).
      train_dataset_fn: `batch_size -> tf.data.Dataset` of endless batches of
        that size, built on each worker (seedless: see below).
      global_batch_size: examples per step (each step is one worker's).
      global_step: the int64 step counter, a ps variable.
      num_workers: the cluster's workers; each loop gets one closure per worker.
      seed: the run's seed, restored after the per-worker input is traced.
    """

    def __init__(self, *, strategy: tf.distribute.Strategy, model: Any,
                 objective: BoundObjective, train_dataset_fn: Any,
                 global_batch_size: int, global_step: tf.Variable,
                 num_workers: int, seed: int = 0):
        self.strategy = strategy
        self.model = model
        self.optimizer = objective.optimizer
        self.global_step = global_step
        self.global_batch_size = global_batch_size
        self._loss_fn = objective.loss
        self._learning_rate = objective.learning_rate
        self._variables = list(model.trainable_variables)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        self._num_workers = num_workers

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return train_dataset_fn(context.get_per_replica_batch_size(global_batch_size))

        spec = dataset_fn(tf.distribute.InputContext()).element_spec
        self._names = [EXAMPLES, "loss"] + [
            n for n in metric_names(self._loss_fn, model, spec) if n not in (EXAMPLES, "loss")]

        @tf.function
        def per_worker_dataset():
            return strategy.distribute_datasets_from_function(dataset_fn)

        # Traced here, once, then sent to every worker: without a global seed
        # each worker's shuffle draws its own seed at run time.
        tf.random.set_seed(None)
        try:
            self._iterator = iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))
        finally:
            keras.utils.set_random_seed(seed)
        self._closure = tf.function(self._steps)

    def train(self, num_steps: int) -> Metrics:
        """Runs `num_steps` steps on the workers, waits for all; mean metrics."""
        share, extra = divmod(num_steps, self._num_workers)
        counts = [share + (i < extra) for i in range(self._num_workers) if share + (i < extra)]
        results = [self.coordinator.schedule(self._closure,
                                             args=(self._iterator, tf.constant(n, tf.int32)))
                   for n in counts]
        self.coordinator.join()
        totals = {name: 0.0 for name in self._names}
        for result in results:
            for name, value in result.fetch().items():
                totals[name] += float(value)
        count = totals[EXAMPLES]
        means = {name: total / count if count else 0.0
                 for name, total in totals.items() if name != EXAMPLES}
        means[EXAMPLES] = count
        if self._learning_rate is not None:  # the rate of the last step any worker ran
            means["learning_rate"] = float(tf.convert_to_tensor(self.optimizer.learning_rate))
        return means

    def _steps(self, iterator, num_steps):
        """One closure, on one worker: `num_steps` steps; summed metrics."""
        sums = {name: tf.constant(0.0) for name in self._names}
        for _ in tf.range(num_steps):
            schedules.assign_rate(self.optimizer, self._learning_rate, self.global_step)
            per_replica = self.strategy.run(self._replica_step, args=(next(iterator),))
            sums = {name: sums[name] + self.strategy.reduce(
                tf.distribute.ReduceOp.SUM, per_replica[name], axis=None) for name in self._names}
            self.global_step.assign_add(1)
        return sums

    def _replica_step(self, batch):
        grads, reported, metrics = replica_gradients(
            self._loss_fn, self.model, batch, self._variables, optimizer=self.optimizer,
            global_batch_size=self.global_batch_size)
        self.optimizer.apply_gradients(
            [(g, v) for g, v in zip(grads, self._variables) if g is not None])
        values = {"loss": reported, **metrics}
        sums = {name: tf.reduce_sum(tf.cast(values[name], tf.float32))
                for name in self._names if name != EXAMPLES}
        sums[EXAMPLES] = tf.cast(tf.shape(reported)[0], tf.float32)
        return sums
