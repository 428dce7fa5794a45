"""An exponential moving average of the trained weights (`--ema_decay`).

After every optimizer step `t` (the global step it completes, from 0), for
every trained variable `w`::

    d_t     = min(decay, (1 + t) / (10 + t))
    average = d_t * average + (1 - d_t) * w

The warm-up of `d_t` is TensorFlow's `ExponentialMovingAverage(num_updates=t)`
(and the Model Garden's `dynamic_decay`): with a fixed 0.999 the average
would stay within a few percent of the *initial* weights for the first
thousand steps, and an early evaluation would measure those. It is a
function of the global step, so a resumed run continues it exactly.

The averages live beside the weights, one per variable on every device
that holds the variable, and are updated where they live
(`strategy.extended.update`): a replica's average moves toward that
replica's copy of the weight, which every replica has identical after the
all-reduce, so the update costs no communication and the averages stay
identical too. (Keras's own `use_ema=True` keeps the average inside the
optimizer and is updated once per optimizer, which a task with several
objectives has several of.)

The averages start equal to the weights (at step 0, or to the weights a
warm start or a checkpoint without averages brings) and are checkpointed
under `ema/<key>`, where `<key>` is the variable's `model_weights/<key>`
(`engine.run_dir.checkpointing.named_weights`). That is what lets inference read
them with nothing but a checkpoint: restoring `ema/<key>` *into the model's
own variable* of the same key gives the model the averaged weights
(`checkpointing.restore_for_inference`, used by `bin/export` and the
evaluator task).

Evaluation and export use the averages (`swapped()`): the weights and the
averages trade places for the duration and trade back after, so training
goes on from its own weights.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import tensorflow as tf



def _tf_variable(variable: Any) -> tf.Variable:
    """The TensorFlow variable behind a Keras 3 variable (a distributed one
    under a strategy); a tf.Variable as is."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def _move_toward(average, weight, decay):
    return average.assign_sub((1.0 - decay) * (average - tf.cast(weight, average.dtype)))


def _trade(weight, average):
    held = tf.identity(weight)
    weight.assign(average)
    return average.assign(held)


class WeightAverage:
    """Moving averages of `variables` (named by `keys`), created under
    `strategy.scope()` (it enters the scope itself).

    Args:
      strategy: the strategy the variables were created under.
      variables: the trained variables (Keras or TensorFlow), in a fixed order.
      keys: each one's `model_weights` key; the checkpoint names averages by them.
      decay: in [0, 1); 0.999 averages over about the last thousand steps.
    """

    def __init__(self, strategy: tf.distribute.Strategy, variables: Sequence[Any],
                 keys: Sequence[str], decay: float):
        if not 0 <= decay < 1:
            raise ValueError(f"`decay` ({decay!r}) must be in [0, 1)")
        if len(keys) != len(variables):
            raise ValueError(f"{len(keys)} keys for {len(variables)} variables")
        self.strategy = strategy
        self.decay = decay
        self._weights = [_tf_variable(v) for v in variables]
        with strategy.scope():
            self.averages = {
                key: tf.Variable(weight.read_value(), trainable=False, name=f"ema_{key}",
                                 aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                for key, weight in zip(keys, self._weights)}
        self._pairs = list(zip(self._weights, self.averages.values()))
        # Graph-building Python only: no autograph (engine.task.user_code says why).
        self._trade_all = tf.function(self._trade_places, autograph=False)
        self._reset_all = tf.function(self._copy_weights, autograph=False)

    def update(self, step: tf.Tensor) -> None:
        """The average after global step `step`; cross-replica context (the
        compiled train loop)."""
        step = tf.cast(step, tf.float32)
        decay = tf.minimum(tf.constant(self.decay, tf.float32), (1.0 + step) / (10.0 + step))
        for weight, average in self._pairs:
            self.strategy.extended.update(average, _move_toward, args=(weight, decay),
                                          group=False)

    def reset(self) -> None:
        """Sets every average to its weight's current value (after a warm start,
        or a resume from a checkpoint that has no averages)."""
        self._reset_all()

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The model holds the averages inside the block, its own weights after."""
        self._trade_all()
        try:
            yield
        finally:
            self._trade_all()

    def adopt(self) -> dict:
        """The model keeps the averages from now on (the end of a run: what
        `run()` returns is what was evaluated and exported); returns the
        trained weights it held, `{key: numpy array}`. The average is of no
        further use to training after this."""
        self._trade_all()
        return {key: tf.convert_to_tensor(average).numpy()
                for key, average in self.averages.items()}

    def _trade_places(self):
        for weight, average in self._pairs:
            self.strategy.extended.update(weight, _trade, args=(average,), group=False)

    def _copy_weights(self):
        for weight, average in self._pairs:
            self.strategy.extended.update(average, lambda a, w: a.assign(w), args=(weight,),
                                          group=False)
