"""Your own step, not only a loss: a WGAN-GP critic with a gradient penalty.

`Task.gradients(model, batch, step)` computes one replica's gradients however
it likes; the engine keeps the rest of the step: the one all-reduce per
objective, `--clip_norm`, `--accumulation_steps`, the NaN guard, the update,
`--ema_decay`. Here the critic's objective needs a second backward pass: the
gradient penalty of WGAN-GP (Gulrajani et al. 2017) is the norm of the
critic's gradient *with respect to its input*, at points between real and
generated ones, and the critic's own gradient is taken through it::

    critic    D(fake) - D(real) + 10 * (||dD(x_hat)/dx_hat|| - 1)^2   every step
    generator -D(G(z))                                                   every 2nd step

The generator keeps the engine's step (`step.default`). Every random number
(the noise, the interpolation) is drawn from the example's id, so four
replicas equal one device (tests/examples/test_wgan_gp.py). Run it::

    python examples/wgan_gp.py [model_dir]
    bin/train --task=examples.wgan_gp:RingWGAN --strategy=mirrored \\
        --devices=cpu:0,cpu:1,cpu:2,cpu:3 --model_dir=runs/wgan_gp
"""

from __future__ import annotations

import sys

import keras
import tensorflow as tf

import tfloop
from examples.gan import RingGAN

PENALTY = 10.0


class RingWGAN(RingGAN):
    name = "WGAN-GP on a ring of Gaussians"

    def objectives(self, model):
        return [
            tfloop.Objective("critic", self.critic_loss,
                             lambda m: m.discriminator.trainable_variables),  # --optimizer
            tfloop.Objective("generator", self.generator_loss,
                             lambda m: m.generator.trainable_variables,
                             optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5), every=2),
        ]

    @staticmethod
    def _mix(ids):
        """Each example's interpolation weight in [0, 1), drawn from its id."""
        return tf.map_fn(
            lambda i: tf.random.stateless_uniform([1], seed=tf.stack([i, tf.ones_like(i)])),
            ids, fn_output_signature=tf.float32)

    def critic_loss(self, model, batch, *, training: bool) -> tfloop.LossOutput:
        """The Wasserstein estimate alone: what evaluation reports."""
        points, ids = batch
        fake = model.generator(self._noise(ids), training=training)
        real_score = model.discriminator(points, training=training)[:, 0]
        fake_score = model.discriminator(fake, training=training)[:, 0]
        return tfloop.LossOutput(per_example_loss=fake_score - real_score,
                                 metrics={"wasserstein": real_score - fake_score})

    def generator_loss(self, model, batch, *, training: bool) -> tfloop.LossOutput:
        _, ids = batch
        score = model.discriminator(model.generator(self._noise(ids), training=training),
                                    training=training)[:, 0]
        return tfloop.LossOutput(per_example_loss=-score)

    def gradients(self, model, batch, step) -> tfloop.Gradients:
        if step.objective != "critic":
            return step.default(model, batch)        # the engine's own step
        points, ids = batch
        with tf.GradientTape() as tape:
            fake = model.generator(self._noise(ids), training=True)
            real_score = model.discriminator(points, training=True)[:, 0]
            fake_score = model.discriminator(fake, training=True)[:, 0]
            mix = self._mix(ids)
            between = mix * points + (1.0 - mix) * tf.stop_gradient(fake)
            with tf.GradientTape() as inner:         # the second backward pass
                inner.watch(between)
                between_score = model.discriminator(between, training=True)
            slope = tf.norm(inner.gradient(between_score, between), axis=1)
            penalty = PENALTY * tf.square(slope - 1.0)
            per_example_loss = fake_score - real_score + penalty
            total = step.total_loss(per_example_loss, model)  # / global batch, loss scale
        return tfloop.Gradients(
            gradients=tape.gradient(total, step.variables),
            per_example_loss=per_example_loss,
            metrics={"wasserstein": real_score - fake_score, "penalty": penalty})


def main(model_dir: str) -> None:
    result = tfloop.run(
        tfloop.RunConfig(strategy="mirrored", devices="cpu:0,cpu:1,cpu:2,cpu:3",
                         model_dir=model_dir, train_steps=400, steps_per_loop=100,
                         global_batch_size=64, mode="train"),
        task=RingWGAN(), verbose=True)
    print({k: v for k, v in result.items() if k.startswith("train/")})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/wgan_gp")
