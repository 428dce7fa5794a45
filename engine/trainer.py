"""The replicated training step and the compiled loop that runs it.

One call of `Trainer.train(num_steps)` is one loop: a single `tf.function`
call whose body is a `tf.while_loop`, so Python runs once per loop, not once
per step::

    for _ in tf.range(num_steps):                  # inside one tf.function
        strategy.run(replica_step, next(iterator))
        global_step += 1

    replica_step(batch):                           # on every replica
        out  = loss_fn(model, batch, training=True)        # these four lines are
        loss = compute_average_loss(out.per_example_loss, global_batch_size)
               + scale_regularization_loss(model.losses)
        grads = tape.gradient(optimizer.scale_loss(loss), variables)   # XLA's (jit_compile)
        grads = all-reduce(grads)                  # the one all-reduce, via the collective
        optimizer.apply_gradients(grads)           # applies; does not reduce again

The forward and backward lines are `engine.replica_step.replica_gradients`,
which the parameter-server trainer shares.

`jit_compile=True` compiles only the per-replica forward and backward pass
(a nested `tf.function(jit_compile=True)`): the all-reduce goes through
`merge_call` into the collective's cross-device ops and the Keras update
through `distribution.extended.update`, neither of which XLA can compile
inside a replica context on TF 2.21 (and the loop's `next(iterator)` is a
host-side op). The compiled part is where the arithmetic is.

Under `mixed_float16` the optimizer is a `LossScaleOptimizer`:
`scale_loss` multiplies by the dynamic scale before differentiating, and its
`apply_gradients` unscales the already reduced gradients (see
`engine.precision`). For any other optimizer `scale_loss` is the identity.
"""

from __future__ import annotations

from typing import Any, Optional

import keras
import tensorflow as tf

from tfloop.collectives.interface import Collective
from tfloop.engine import keras_bridge
from tfloop.engine.losses import LossFn, classification_loss
from tfloop.engine.replica_step import metric_names, replica_gradients
from tfloop.engine.replica_sums import ReplicaSums
from tfloop.engine.runner import AbstractTrainer, Metrics


class Trainer(AbstractTrainer):
    """Owns the replicated train step and its compiled loop of steps.

    Args:
      strategy: the `tf.distribute.Strategy` the model and optimizer were
        created under.
      model: a Keras model, or any trackable with `trainable_variables` (a
        `tf.Module` holding several models); passed to `loss_fn` as is.
      optimizer: a Keras 3 optimizer created under `strategy.scope()`.
      collective: how gradients are summed across replicas.
      train_dataset: a `tf.data.Dataset` of *global* batches.
      global_batch_size: examples per step across all replicas.
      global_step: the int64 step counter saved in checkpoints.
      loss_fn: the user's per-example loss (see `engine.losses`).
      jit_compile: compile each replica's forward and backward pass with XLA.
    """

    def __init__(
        self,
        *,
        strategy: tf.distribute.Strategy,
        model: Any,
        optimizer: keras.optimizers.Optimizer,
        collective: Collective,
        train_dataset: tf.data.Dataset,
        global_batch_size: int,
        global_step: tf.Variable,
        loss_fn: Optional[LossFn] = None,
        jit_compile: bool = False,
    ):
        if global_batch_size <= 0:
            raise ValueError(f"`global_batch_size` ({global_batch_size}) must be positive")
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.collective = collective
        self.global_step = global_step
        self.global_batch_size = global_batch_size
        self._loss_fn = loss_fn or classification_loss
        self._variables = list(model.trainable_variables)
        if not optimizer.built:  # engine.run builds it before restoring a checkpoint
            with strategy.scope():
                # Slots exist before the first step (and before a checkpoint restore).
                # Once only: LossScaleOptimizer.build makes new scale variables each call.
                optimizer.build(self._variables)
        keras_bridge.disable_implicit_gradient_reduction(optimizer)
        self._sums = ReplicaSums(
            strategy, ["loss"] + metric_names(self._loss_fn, model, train_dataset.element_spec)
        )
        self._iterator = iter(strategy.experimental_distribute_dataset(train_dataset))
        self._gradients = (tf.function(self._compute_gradients, jit_compile=True)
                           if jit_compile else self._compute_gradients)
        self._loop = tf.function(self._train_loop)

    def train(self, num_steps: int) -> Metrics:
        """Runs one compiled loop of `num_steps` steps; returns its mean metrics."""
        results = self._loop(self._iterator, tf.constant(num_steps, tf.int32))
        return {name: float(value) for name, value in results.items()}

    def _train_loop(self, iterator, num_steps):
        self._sums.reset()
        for _ in tf.range(num_steps):
            self.strategy.run(self._replica_step, args=(next(iterator),))
            self.global_step.assign_add(1)
        return self._sums.means()

    def _compute_gradients(self, batch):
        """Forward and backward pass of one replica (XLA-compiled with jit_compile)."""
        return replica_gradients(self._loss_fn, self.model, batch, self._variables,
                                 optimizer=self.optimizer,
                                 global_batch_size=self.global_batch_size)

    def _replica_step(self, batch):
        grads, reported_loss, metrics = self._gradients(batch)
        present = [i for i, g in enumerate(grads) if g is not None]
        # The one gradient all-reduce of the step, through the selected collective.
        reduced = tf.distribute.get_replica_context().merge_call(
            self._all_reduce, args=([grads[i] for i in present], [self._variables[i] for i in present])
        )
        self.optimizer.apply_gradients(zip(reduced, [self._variables[i] for i in present]))

        count = tf.shape(reported_loss)[0]
        self._sums.add(count, {"loss": reported_loss, **metrics})

    @tf.autograph.experimental.do_not_convert  # graph-building Python, not a loop body
    def _all_reduce(self, strategy, grads, destinations):
        if strategy.num_replicas_in_sync == 1:
            return grads
        return self.collective.batch_all_reduce(grads, destinations)
