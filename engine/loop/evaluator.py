"""Distributed evaluation over a finite dataset, every example counted once.

One `evaluate()` call is one compiled loop over a fresh iterator (a
`tf.while_loop`, the engine's code unconverted: `engine.task.user_code`)::

    while steps < num_steps or num_steps < 0:      # inside one tf.function
        batch = iterator.get_next_as_optional()
        if not batch.has_value(): break            # the dataset ended
        strategy.run(replica_eval_step, batch)

The last batch may be partial, and some replicas may then get an empty one;
sums of per-example values divided by the examples actually seen make that
exact.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from tfloop.engine.loop import iterators
from tfloop.engine.recipe.ema import WeightAverage
from tfloop.engine.task import user_code
from tfloop.engine.task.losses import LossFn, classification_loss
from tfloop.engine.loop.replica_step import metric_names
from tfloop.engine.loop.replica_sums import ReplicaSums
from tfloop.engine.loop.contracts import AbstractEvaluator, Metrics


class Evaluator(AbstractEvaluator):
    """Evaluates `model` on `eval_dataset` (global batches, finite).

    Attributes:
      metric_names: what `evaluate` reports besides `examples`: `loss`, then
        the loss function's metrics; known before the first evaluation (a run
        checks `--best_metric` against them before it writes anything).
    """

    def __init__(
        self,
        *,
        strategy: tf.distribute.Strategy,
        model: Any,
        eval_dataset: tf.data.Dataset,
        loss_fn: Optional[LossFn] = None,
    ):
        self.strategy = strategy
        self.model = model
        self._loss_fn = loss_fn or classification_loss
        self._dataset = strategy.experimental_distribute_dataset(eval_dataset)
        self.metric_names = ["loss"] + metric_names(self._loss_fn, model,
                                                    eval_dataset.element_spec)
        self._sums = ReplicaSums(strategy, self.metric_names)
        self._loss = user_code.converted(self._loss_fn)  # the loop itself is not (its docstring)
        self._loop = tf.function(self._eval_loop, autograph=False)

    def evaluate(self, num_steps: int = -1) -> Metrics:
        """Evaluates `num_steps` batches, or the whole dataset when negative.

        Returns mean metrics and `examples`, the number of examples seen.
        """
        # A fresh iterator each time, destroyed without a stall (engine.loop.iterators).
        results = self._loop(iterators.distributed(self._dataset),
                             tf.constant(num_steps, tf.int32))
        return {name: float(value) for name, value in results.items()}

    def _eval_loop(self, iterator, num_steps):
        self._sums.reset()

        def goes_on(step, more):
            return tf.logical_and(more, tf.logical_or(num_steps < 0, step < num_steps))

        def next_batch(step, more):
            batch = iterator.get_next_as_optional()

            def evaluate():
                self.strategy.run(self._replica_step, args=(batch.get_value(),))
                return step + 1

            more = batch.has_value()  # false: the dataset ended
            return tf.cond(more, evaluate, lambda: step), more

        tf.while_loop(goes_on, next_batch, (tf.constant(0, tf.int32), tf.constant(True)))
        return self._sums.means()

    def _replica_step(self, batch):
        output = self._loss(self.model, batch, training=False)
        count = tf.shape(output.per_example_loss)[0]
        self._sums.add(count, {"loss": output.per_example_loss, **output.metrics})


class AveragedEvaluator(AbstractEvaluator):
    """Evaluates the averaged weights: `evaluator` run inside `average.swapped()`
    (`--ema_decay`; the average itself is the recipe's, `engine.recipe.ema`)."""

    def __init__(self, evaluator: AbstractEvaluator, average: WeightAverage):
        self.evaluator = evaluator
        self.average = average

    @property
    def metric_names(self):
        return self.evaluator.metric_names

    def evaluate(self, num_steps: int = -1) -> Metrics:
        with self.average.swapped():
            return self.evaluator.evaluate(num_steps)
