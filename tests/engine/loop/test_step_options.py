"""Gradient accumulation and clipping: N replicas must still equal one device.

`--accumulation_steps=N` on 4 replicas must give the weights of one step of
the whole global batch on one device (the micro-batches' gradients sum to the
whole batch's), with one all-reduce per step, not per micro-batch.
`--clip_norm` clips the reduced gradients, so every replica clips by the same
factor and the result is the one-device clipped update, computed here in numpy.
"""

import numpy as np
import keras
import pytest
import tensorflow as tf

from tfloop import collectives, inputs, models
from tfloop.collectives.base import Wrapper
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.loop.settings import Step
from tfloop.engine.loop.trainer import Trainer

GLOBAL_BATCH = 64
STEPS = 4


class CountingCollective(Wrapper):
    """Counts, in a variable the compiled loop increments, how many times the
    trainer all-reduces."""

    def __init__(self, inner):
        super().__init__(inner)
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)

    def _sum_replicas(self, values, destinations):
        self.calls.assign_add(1)
        return self.inner.batch_all_reduce(values, destinations)


def _strategy(devices):
    if len(devices) == 1:
        return tf.distribute.OneDeviceStrategy(devices[0])
    return tf.distribute.MirroredStrategy(devices)


def train(devices, *, accumulation_steps=1, optimizer=lambda: keras.optimizers.SGD(0.1),
          clip_norm=0.0, steps=STEPS, loops=2, **collective_options):
    """(weights, train metrics, all-reduce count) after `steps` steps of the
    synthetic mlp from seed 7."""
    splits = inputs.load("synthetic", seed=7)
    keras.utils.set_random_seed(7)
    strategy = _strategy(devices)
    with strategy.scope():
        net = models.build("mlp")
        opt = optimizer()
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    collective = CountingCollective(
        collectives.create("reduce_to_one_device", devices=devices, **collective_options))
    trainer = Trainer(
        strategy=strategy, model=net, optimizer=opt, collective=collective,
        train_dataset=inputs.train_batches(splits.train, global_batch_size=GLOBAL_BATCH, seed=7),
        global_batch_size=GLOBAL_BATCH, global_step=step,
        options=Step(accumulation_steps=accumulation_steps, clip_norm=clip_norm))
    metrics = {}
    for _ in range(loops):
        metrics = trainer.train(steps // loops)
    assert int(step.numpy()) == steps
    assert int(opt.iterations.numpy()) == steps  # one update per step, not per micro-batch
    return [v.numpy() for v in net.trainable_variables], metrics, int(collective.calls.numpy())


def max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


# The one-device SGD run (STEPS steps, no accumulation, no clipping) and its
# initial weights are read, never changed, by several cases below: trained once
# per module instead of once per case. The readers share an xdist group so that
# one worker builds them once.
SHARED = pytest.mark.xdist_group("step_options_one_device_sgd")


@pytest.fixture(scope="module")
def one_device_sgd(cpu_devices):
    """train(cpu_devices[:1]): (weights, metrics, all-reduce count), SGD(0.1)."""
    return train(cpu_devices[:1])


@pytest.fixture(scope="module")
def one_device_sgd_initial(cpu_devices):
    """The same run's weights before any step."""
    return train(cpu_devices[:1], steps=0, loops=1)


@SHARED
@pytest.mark.parametrize("name, optimizer", [
    ("sgd", lambda: keras.optimizers.SGD(0.1)),
    ("adam", lambda: keras.optimizers.Adam(1e-3)),
])
def test_accumulated_micro_batches_on_four_replicas_equal_one_device_step(
        cpu_devices, request, name, optimizer):
    """The sgd case's one-device run is train()'s default (SGD(0.1)): the shared one."""
    if name == "sgd":
        (one, one_metrics, _), (initial, _, _) = (
            request.getfixturevalue("one_device_sgd"),
            request.getfixturevalue("one_device_sgd_initial"))
    else:
        one, one_metrics, _ = train(cpu_devices[:1], optimizer=optimizer)
        initial, _, _ = train(cpu_devices[:1], optimizer=optimizer, steps=0, loops=1)
    four, four_metrics, reductions = train(cpu_devices, accumulation_steps=4, optimizer=optimizer)
    assert max_difference(one, initial) > 1e-3  # the steps moved the weights
    assert max_difference(one, four) < 1e-5
    assert reductions == STEPS  # one all-reduce per optimizer step, not per micro-batch
    # Every example of the global batch was seen and counted once.
    assert four_metrics["examples"] == one_metrics["examples"] == STEPS // 2 * GLOBAL_BATCH
    assert four_metrics["loss"] == pytest.approx(one_metrics["loss"], rel=1e-5)


@SHARED
def test_accumulation_with_packing_equals_one_device(cpu_devices, one_device_sgd):
    one, _, _ = one_device_sgd
    four, _, reductions = train(cpu_devices, accumulation_steps=2, num_packs=2)
    assert max_difference(one, four) < 1e-5
    assert reductions == STEPS


def test_trainer_refuses_micro_batches_that_do_not_divide_the_replica_batch(cpu_devices):
    with pytest.raises(ValueError, match="does not divide into 3 micro-batches"):
        train(cpu_devices, accumulation_steps=3)


# --- clipping -----------------------------------------------------------------------------


def linear_model(features=3):
    """y = x·w + b, one output; its gradient is easy to write in numpy."""
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(
        1, kernel_initializer="ones", bias_initializer="zeros")])


def squared_error(model, batch, *, training):
    x, y = batch
    error = model(x, training=training)[:, 0] - y
    return LossOutput(per_example_loss=error ** 2, metrics={})


def _linear_data(n=32, features=3):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x @ np.array([2.0, -3.0, 0.5], np.float32) + 4.0).astype(np.float32)
    return x, y


def test_clipping_on_four_replicas_equals_the_numpy_one_device_update(cpu_devices):
    x, y = _linear_data()
    lr, clip, steps = 0.05, 0.5, 3
    strategy = tf.distribute.MirroredStrategy(cpu_devices)
    with strategy.scope():
        model = linear_model()
        optimizer = keras.optimizers.SGD(lr)
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    trainer = Trainer(strategy=strategy, model=model, optimizer=optimizer,
                      collective=collectives.create("reduce_to_one_device", devices=cpu_devices),
                      train_dataset=dataset, global_batch_size=len(x), global_step=step,
                      loss_fn=squared_error, options=Step(clip_norm=clip))

    w, b = np.ones(3, np.float32), np.float32(0.0)
    norms = []
    for _ in range(steps):
        metrics = trainer.train(1)
        error = x @ w + b - y                       # the whole global batch, one device
        grad_w, grad_b = 2 * x.T @ error / len(x), 2 * error.mean()
        norm = np.sqrt(np.sum(grad_w ** 2) + grad_b ** 2)
        scale = min(1.0, clip / norm)
        w, b = w - lr * scale * grad_w, b - lr * scale * grad_b
        norms.append(norm)
        assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)  # before clipping
    assert min(norms) > clip  # every step was clipped
    kernel, bias = model.layers[0].kernel.value, model.layers[0].bias.value
    for variable, expected in ((kernel, w[:, None]), (bias, np.array([b]))):
        copies = [c.numpy() for c in variable.values]   # each replica's copy
        for copy in copies:
            np.testing.assert_allclose(copy, expected, rtol=1e-5, atol=1e-6)
        assert all(np.array_equal(copies[0], c) for c in copies)  # identical, not only close


@SHARED
def test_clipped_four_replicas_equal_clipped_one_device(cpu_devices, one_device_sgd):
    one, one_metrics, _ = train(cpu_devices[:1], clip_norm=0.05)
    four, four_metrics, _ = train(cpu_devices, clip_norm=0.05)
    unclipped, unclipped_metrics, _ = one_device_sgd
    assert unclipped_metrics["grad_norm"] > 0.05  # the clip was active
    assert max_difference(one, unclipped) > 1e-4
    assert max_difference(one, four) < 1e-5
    assert four_metrics["grad_norm"] == pytest.approx(one_metrics["grad_norm"], rel=1e-5)
