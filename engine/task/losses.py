"""The user's part of a step: a loss function over one replica's batch.

The engine owns distribution, reduction and compilation; the user owns the
maths. A loss function sees the model(s) and the *per-replica* batch and
returns per-example values, never means, so the engine can divide by the
global batch (`tf.nn.compute_average_loss`) and count every example exactly
once when batches are partial::

    def loss_fn(model, batch, *, training):
        images, labels = batch
        logits = model(images, training=training)
        return LossOutput(
            per_example_loss=keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True),
            metrics={"accuracy": tf.cast(tf.argmax(logits, -1) == labels, tf.float32)},
        )

`model` is whatever the task built: one Keras model, or a `keras.Model`
holding several (see `examples/gan.py`; a plain `tf.Module` does not list
Keras 3 variables in `trainable_variables`, which are not `tf.Variable`s).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol

import keras
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LossOutput:
    """Per-example values for one replica's batch.

    Attributes:
      per_example_loss: shape (batch,); the training objective per example.
      metrics: name → per-example values of shape (batch,), averaged by the
        engine over every example of a loop or of an evaluation.
    """

    per_example_loss: tf.Tensor
    metrics: Mapping[str, tf.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Gradients:
    """What a task's own step (`Task.gradients`) returns for one replica.

    Attributes:
      gradients: one per variable of `step.variables`, in that order (None
        for a variable the step does not reach), of the loss over the
        *global* batch: differentiate `step.total_loss(...)`, or divide
        sums by `step.global_batch_size` yourself. The engine sums them
        over replicas (the one all-reduce), clips, accumulates, guards
        against NaN and applies them.
      per_example_loss: shape (batch,): what the loop reports as `loss`.
      metrics: name -> per-example values of shape (batch,), as in `LossOutput`.
    """

    gradients: Any
    per_example_loss: tf.Tensor
    metrics: Mapping[str, tf.Tensor] = dataclasses.field(default_factory=dict)


class LossFn(Protocol):
    def __call__(self, model: Any, batch: Any, *, training: bool) -> LossOutput: ...


@tf.autograph.experimental.do_not_convert  # the engine's own code (engine.task.user_code)
def classification_loss(model: Callable, batch, *, training: bool) -> LossOutput:
    """Sparse softmax cross-entropy on logits, with accuracy.

    Logits are cast to float32 first: under a mixed precision policy the model
    computes in float16/bfloat16, and the softmax and its log belong in float32.
    """
    images, labels = batch
    logits = tf.cast(model(images, training=training), tf.float32)
    per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1), tf.cast(labels, tf.int64)), tf.float32)
    return LossOutput(per_example_loss=per_example, metrics={"accuracy": correct})
