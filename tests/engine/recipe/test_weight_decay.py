"""Decoupled weight decay (`--weight_decay`, `--weight_decay_exclude`,
`--optimizer=adamw`): a linear model's weights after a few scheduled steps
equal a NumPy reference, for Keras's and the fused optimizers; and N replicas
still train exactly like one device."""

import logging
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.runtime.devices import max_relative_difference
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.assembly.run import run
from tfloop.engine.task import Task

BATCH, STEPS, WARMUP, PEAK = 8, 5, 2, 0.1
_rng = np.random.default_rng(0)
X = _rng.normal(size=(BATCH, 4)).astype(np.float32)
Y = _rng.normal(size=(BATCH, 2)).astype(np.float32)
KERNEL = _rng.normal(scale=0.5, size=(4, 2)).astype(np.float32)
BIAS = np.array([0.5, -0.3], np.float32)


class Linear(Task):
    """y = x W + b with a squared error; every step the same global batch."""

    def build_model(self):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(
            2, name="linear", kernel_initializer=keras.initializers.Constant(KERNEL),
            bias_initializer=keras.initializers.Constant(BIAS))])

    def train_dataset(self, context):
        return tf.data.Dataset.from_tensor_slices((X, Y)).batch(
            context.global_batch_size, drop_remainder=True).repeat()

    def loss(self, model, batch, *, training):
        features, targets = batch
        return LossOutput(per_example_loss=tf.reduce_sum(
            (model(features, training=training) - targets) ** 2, axis=1))


def rates():
    """Warmup over 2 steps, then cosine to 0 at step 5 (the documented formula)."""
    return [PEAK * s / WARMUP if s < WARMUP else
            PEAK * 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / (STEPS - WARMUP)))
            for s in range(STEPS)]


def numpy_weights(optimizer, weight_decay, decays):
    """Keras's update order: decay with the step's rate, then the update from
    the gradient taken before it. `decays`: (kernel decays, bias decays)."""
    weights = [KERNEL.astype(np.float64), BIAS.astype(np.float64)]
    m = [np.zeros_like(w) for w in weights]
    v = [np.zeros_like(w) for w in weights]
    for t, lr in enumerate(rates(), start=1):
        error = X @ weights[0] + weights[1] - Y
        grads = [2 * X.T @ error / BATCH, 2 * error.sum(axis=0) / BATCH]
        for i, (grad, decay) in enumerate(zip(grads, decays)):
            if decay:
                weights[i] = weights[i] - lr * weight_decay * weights[i]
            if optimizer == "sgd":
                weights[i] = weights[i] - lr * grad
            else:  # adam, adamw (Keras: epsilon 1e-7 outside the square root)
                m[i] += (grad - m[i]) * (1 - 0.9)
                v[i] += (grad ** 2 - v[i]) * (1 - 0.999)
                alpha = lr * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
                weights[i] = weights[i] - alpha * m[i] / (np.sqrt(v[i]) + 1e-7)
    return weights


def _config(model_dir, **overrides):
    settings = dict(
        strategy="mirrored", devices="cpu:0,cpu:1,cpu:2,cpu:3", collective="reduce_to_one_device",
        model_dir=str(model_dir), global_batch_size=BATCH, train_steps=STEPS, steps_per_loop=STEPS,
        checkpoint_interval=0, summary_interval=0, mode="train", export=False,
        learning_rate=PEAK, lr_schedule="cosine", warmup_steps=WARMUP,
    )
    settings.update(overrides)
    return RunConfig(**settings)


@pytest.mark.parametrize("optimizer, fused, exclude, weight_decay, decays, line", [
    ("sgd", False, "biases_and_norms", 0.1, (True, False),
     "weight decay 0.1: 1 variable(s) decay, 1 excluded (--weight_decay_exclude=biases_and_norms)"),
    ("sgd", False, "none", 0.1, (True, True),
     "weight decay 0.1: 2 variable(s) decay, 0 excluded (--weight_decay_exclude=none)"),
    ("sgd", True, "kernel", 0.1, (False, True), "1 excluded (--weight_decay_exclude=kernel)"),
    ("adam", False, "biases_and_norms", 0.1, (True, False), "weight decay 0.1: 1 variable"),
    ("adam", True, "gamma,beta", 0.1, (True, True), "2 variable(s) decay, 0 excluded"),
    ("adamw", False, "biases_and_norms", 0.0, (True, False),
     "weight decay 0.004 (adamw's default; --weight_decay=0): 1 variable(s) decay"),
])
def test_decayed_weights_equal_numpy(tmp_path, caplog, optimizer, fused, exclude, weight_decay,
                                     decays, line):
    caplog.set_level(logging.INFO)
    result = run(_config(tmp_path, optimizer=optimizer, fused_optimizer=fused,
                         weight_decay=weight_decay, weight_decay_exclude=exclude), task=Linear())
    got = [v.numpy() for v in result.model.trainable_variables]
    rate = weight_decay or 0.004
    base = "sgd" if optimizer == "sgd" else "adam"
    want = numpy_weights(base, rate, decays)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)
        # Whether this variable decays shows, far beyond the tolerance.
        flipped = numpy_weights(base, rate, [d != (j == i) for j, d in enumerate(decays)])
        assert np.max(np.abs(w - flipped[i])) > 1e-4
    assert line in caplog.text


def _max_relative_difference(a, b):
    """The project's measure (`engine.runtime.devices`) over two dicts of weights by name."""
    return max_relative_difference([a[n] for n in sorted(a)], [b[n] for n in sorted(a)])


def test_four_replicas_train_like_one_device_with_a_schedule_and_weight_decay(tmp_path):
    settings = dict(model="mlp", dataset="synthetic", global_batch_size=32, train_steps=6,
                    steps_per_loop=3, optimizer="momentum", learning_rate=0.05,
                    warmup_steps=2, weight_decay=0.05, seed=11)
    weights = []
    for name, strategy, devices in (("four", "mirrored", "cpu:0,cpu:1,cpu:2,cpu:3"),
                                    ("one", "one_device", "cpu:0")):
        run(_config(tmp_path / name, strategy=strategy, devices=devices, **settings))
        reader = tf.train.load_checkpoint(str(tmp_path / name))
        weights.append({n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
                        if n.startswith("model_weights/")})
    four, one = weights
    assert len(one) == 6 and four.keys() == one.keys()
    assert _max_relative_difference(one, four) < 1e-5
