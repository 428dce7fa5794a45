"""Your own data and loss as a task: regression on dict features with sample weights.

Two named inputs (`size`, four floats; `rooms`, one float), a float target and
a per-example weight. The loss is the weighted squared error; MSE and MAE are
reported unweighted. The train stream skips what a resumed run has trained
on before batching (`context.examples_to_skip`), so resuming is exact and
cheap. Run it (four logical CPU replicas)::

    python examples/regression.py [model_dir]
    bin/train --task=examples.regression:Regression --strategy=mirrored \\
        --devices=cpu:0,cpu:1,cpu:2,cpu:3 --model_dir=runs/regression
"""

from __future__ import annotations

import sys

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine.task.losses import LossOutput
from tfloop.engine.task import Task


class Regression(Task):
    """y = size·w + 0.5·rooms + noise, weighted by how much each example counts."""

    name = "regression on size and rooms"

    def __init__(self, num_train: int = 2048, num_eval: int = 512, seed: int = 0):
        rng = np.random.default_rng(seed)
        count = num_train + num_eval
        features = {
            "size": rng.normal(size=(count, 4)).astype(np.float32),
            "rooms": rng.integers(1, 6, size=(count, 1)).astype(np.float32),
        }
        weights = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
        target = (features["size"] @ weights + 0.5 * features["rooms"][:, 0]
                  + 0.1 * rng.normal(size=count)).astype(np.float32)
        sample_weight = rng.uniform(0.5, 2.0, size=count).astype(np.float32)

        def part(selection):
            return ({k: v[selection] for k, v in features.items()}, target[selection],
                    sample_weight[selection])

        self.train = part(slice(0, num_train))
        self.eval = part(slice(num_train, count))

    def build_model(self) -> keras.Model:
        size = keras.Input((4,), name="size")
        rooms = keras.Input((1,), name="rooms")
        hidden = keras.layers.Dense(32, activation="relu")(
            keras.layers.Concatenate()([size, rooms]))
        price = keras.layers.Dense(1, name="price")(hidden)
        return keras.Model({"size": size, "rooms": rooms}, price, name="regression")

    def train_dataset(self, context) -> tf.data.Dataset:
        examples = len(self.train[1])
        ds = tf.data.Dataset.from_tensor_slices(self.train).cache()
        ds = ds.shuffle(examples, seed=context.seed, reshuffle_each_iteration=True).repeat()
        # Exact resume: start where the interrupted run stopped, before batching
        # (examples_to_skip reads context.start_step and counts what this
        # pipeline fed each step, which under file/off sharding is 1/W of a batch).
        ds = ds.skip(context.examples_to_skip)
        return ds.batch(context.global_batch_size, drop_remainder=True)

    def eval_dataset(self, context) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.eval).batch(context.global_batch_size)

    def loss(self, model, batch, *, training: bool) -> LossOutput:
        features, target, sample_weight = batch
        error = model(features, training=training)[:, 0] - target  # (batch,), not (batch, 1)
        return LossOutput(per_example_loss=sample_weight * tf.square(error),
                          metrics={"mse": tf.square(error), "mae": tf.abs(error)})


def main(model_dir: str) -> None:
    from tfloop.engine.config import RunConfig
    from tfloop.engine.assembly.run import run

    result = run(RunConfig(strategy="mirrored", devices="cpu:0,cpu:1,cpu:2,cpu:3",
                           model_dir=model_dir, train_steps=400, steps_per_loop=100,
                           global_batch_size=64, learning_rate=0.01),
                 task=Regression(), verbose=True)
    print({k: v for k, v in result.items() if k.startswith(("train/", "eval/"))})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/regression")
