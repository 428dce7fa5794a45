"""A custom training step: one trunk, two heads, two losses.

The engine keeps distribution, reduction and compilation; this file only says
what to compute on one replica's batch. Head one classifies the digit, head
two says whether it is even; the objective weighs both::

    loss = crossentropy(digit) + 0.5 * binary_crossentropy(parity)

As a task it is the built-in digits data (`ClassificationTask`: `--dataset`,
exact resume, sharding) with a model and a loss of its own. Run it (four
logical CPU replicas, synthetic digits)::

    python examples/two_heads.py [model_dir]
    bin/train --task=examples.two_heads:TwoHeads --strategy=mirrored \\
        --devices=cpu:0,cpu:1,cpu:2,cpu:3 --model_dir=runs/two_heads
"""

from __future__ import annotations

import sys

import keras
import tensorflow as tf

from tfloop.engine.task.losses import LossOutput
from tfloop.engine.task import ClassificationTask

PARITY_WEIGHT = 0.5


def build_model(input_shape, num_classes) -> keras.Model:
    images = keras.Input(input_shape)
    trunk = keras.layers.Flatten()(images)
    trunk = keras.layers.Dense(128, activation="relu", name="trunk")(trunk)
    digit = keras.layers.Dense(num_classes, name="digit")(trunk)
    parity = keras.layers.Dense(1, name="parity")(trunk)
    return keras.Model(images, {"digit": digit, "parity": parity}, name="two_heads")


def loss_fn(model, batch, *, training: bool) -> LossOutput:
    images, labels = batch
    outputs = model(images, training=training)
    labels = tf.cast(labels, tf.int64)
    is_even = tf.cast(labels % 2 == 0, tf.float32)[:, None]
    digit_loss = keras.losses.sparse_categorical_crossentropy(
        labels, outputs["digit"], from_logits=True)
    parity_loss = keras.losses.binary_crossentropy(is_even, outputs["parity"], from_logits=True)
    predicted_even = tf.cast(outputs["parity"] > 0, tf.float32)
    return LossOutput(
        per_example_loss=digit_loss + PARITY_WEIGHT * parity_loss,
        metrics={
            "digit_loss": digit_loss,
            "parity_loss": parity_loss,
            "digit_accuracy": tf.cast(tf.argmax(outputs["digit"], -1) == labels, tf.float32),
            "parity_accuracy": tf.cast(tf.equal(predicted_even, is_even), tf.float32)[:, 0],
        },
    )


class TwoHeads(ClassificationTask):
    """Digits (`--dataset`, synthetic by default) through one trunk and two heads."""

    name = "two heads on digits"

    def build_model(self) -> keras.Model:
        return build_model(self.splits.input_shape, self.splits.num_classes)

    def loss(self, model, batch, *, training: bool) -> LossOutput:
        return loss_fn(model, batch, training=training)


def main(model_dir: str) -> None:
    from tfloop.engine.config import RunConfig
    from tfloop.engine.assembly.run import run

    result = run(
        RunConfig(strategy="mirrored", devices="cpu:0,cpu:1,cpu:2,cpu:3", model_dir=model_dir,
                  train_steps=300, steps_per_loop=50, global_batch_size=128),
        task=TwoHeads(), verbose=True,
    )
    print({k: v for k, v in result.items() if k.startswith(("train/", "eval/"))})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/two_heads")
