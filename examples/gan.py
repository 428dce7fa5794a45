"""A step that is more than a loss: a GAN, two objectives and two optimizers.

A generator maps noise to 2-D points; a discriminator tells them from points
of a ring of eight Gaussians. Each step takes one batch of real points and
runs two objectives on it, each over its own variables with its own
optimizer, each gradient all-reduced once through the run's `--collective`:

    discriminator  every step       -log D(real) - log(1 - D(G(z)))
    generator      every 2nd step   -log D(G(z))

The noise comes from a stateless generator seeded by the batch itself, so
every replica layout draws the same noise for the same example, and four
replicas equal one device. Run it::

    python examples/gan.py [model_dir]
    bin/train --task=examples.gan:RingGAN --strategy=mirrored \\
        --devices=cpu:0,cpu:1,cpu:2,cpu:3 --model_dir=runs/gan
"""

from __future__ import annotations

import sys

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine.task.losses import LossOutput
from tfloop.engine.task import Objective, Task

NOISE = 4


@keras.saving.register_keras_serializable(package="examples")
class GAN(keras.Model):
    """Holds both networks so one checkpoint (and `trainable_variables`) has both.

    Registered with Keras saving, so the export's `model.keras` loads back
    (`keras.models.load_model`) where this module is imported; its `__init__`
    takes only what Keras's own `get_config()` gives back (`name`,
    `trainable`, ...), so it needs no `get_config()` of its own."""

    def __init__(self, **kwargs):
        super().__init__(**{"name": "gan", **kwargs})
        self.generator = keras.Sequential(
            [keras.Input((NOISE,)), keras.layers.Dense(32, activation="relu"),
             keras.layers.Dense(2)], name="generator")
        self.discriminator = keras.Sequential(
            [keras.Input((2,)), keras.layers.Dense(32, activation="relu"),
             keras.layers.Dense(1)], name="discriminator")

    def call(self, noise, training=False):
        return self.generator(noise, training=training)


class RingGAN(Task):
    name = "GAN on a ring of Gaussians"

    def __init__(self, num_points: int = 4096, seed: int = 0):
        rng = np.random.default_rng(seed)
        angles = rng.integers(0, 8, num_points) * (np.pi / 4)
        centres = np.stack([np.cos(angles), np.sin(angles)], axis=1)
        self.points = (centres + 0.05 * rng.normal(size=centres.shape)).astype(np.float32)
        self.ids = np.arange(num_points, dtype=np.int64)  # seeds each example's noise

    def build_model(self) -> GAN:
        return GAN()

    def train_dataset(self, context) -> tf.data.Dataset:
        # Does not read context.start_step: the engine skips for it on resume.
        ds = tf.data.Dataset.from_tensor_slices((self.points, self.ids)).cache()
        ds = ds.shuffle(len(self.ids), seed=context.seed, reshuffle_each_iteration=True)
        return ds.repeat().batch(context.global_batch_size, drop_remainder=True)

    def objectives(self, model):
        return [
            Objective("discriminator", self.discriminator_loss,
                      lambda m: m.discriminator.trainable_variables, optimizer="adam"),
            Objective("generator", self.generator_loss,
                      lambda m: m.generator.trainable_variables,
                      optimizer=keras.optimizers.Adam(2e-3), every=2),
        ]

    def serving_spec(self, element_spec):
        return tf.TensorSpec([None, NOISE], tf.float32, name="noise")

    @staticmethod
    def _noise(ids):
        return tf.map_fn(
            lambda i: tf.random.stateless_normal([NOISE], seed=tf.stack([i, tf.zeros_like(i)])),
            ids, fn_output_signature=tf.float32)

    def discriminator_loss(self, model, batch, *, training: bool) -> LossOutput:
        points, ids = batch
        fake = model.generator(self._noise(ids), training=training)
        real_logit = model.discriminator(points, training=training)[:, 0]
        fake_logit = model.discriminator(fake, training=training)[:, 0]
        loss = (tf.nn.sigmoid_cross_entropy_with_logits(tf.ones_like(real_logit), real_logit)
                + tf.nn.sigmoid_cross_entropy_with_logits(tf.zeros_like(fake_logit), fake_logit))
        accuracy = 0.5 * (tf.cast(real_logit > 0, tf.float32) + tf.cast(fake_logit < 0, tf.float32))
        return LossOutput(per_example_loss=loss, metrics={"accuracy": accuracy})

    def generator_loss(self, model, batch, *, training: bool) -> LossOutput:
        _, ids = batch
        fake_logit = model.discriminator(
            model.generator(self._noise(ids), training=training), training=training)[:, 0]
        loss = tf.nn.sigmoid_cross_entropy_with_logits(tf.ones_like(fake_logit), fake_logit)
        return LossOutput(per_example_loss=loss)


def main(model_dir: str) -> None:
    from tfloop.engine.config import RunConfig
    from tfloop.engine.assembly.run import run

    result = run(RunConfig(strategy="mirrored", devices="cpu:0,cpu:1,cpu:2,cpu:3",
                           model_dir=model_dir, train_steps=400, steps_per_loop=100,
                           global_batch_size=64, mode="train"),
                 task=RingGAN(), verbose=True)
    print({k: v for k, v in result.items() if k.startswith("train/")})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/gan")
