"""`--fused_optimizer`: one TensorFlow training kernel per variable, Keras's
formulas and slots, so fused and Keras updates agree to float32 rounding."""

import keras
import numpy as np
import pytest

from tfloop.engine.recipe import optimizers


def _train(optimizer, steps=3):
    variables = [keras.Variable(np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)),
                 keras.Variable(np.full([4], 0.5, dtype="float32"))]
    optimizer.build(variables)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        optimizer.apply_gradients(zip(grads, variables))
    return [v.numpy() for v in variables], [v.numpy() for v in optimizer.variables]


@pytest.mark.parametrize("name", optimizers.available())
def test_fused_updates_equal_the_keras_updates(name):
    weights, slots = _train(optimizers.build(name, 0.1))
    fused_weights, fused_slots = _train(optimizers.build_fused(name, 0.1))
    assert len(fused_slots) == len(slots)
    for want, got in zip(weights + slots, fused_weights + fused_slots):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("prebuilt", [False, True])
def test_the_trainer_builds_the_optimizer_once(prebuilt):
    """`engine.assembly.run` builds the optimizer before restoring a checkpoint; the
    Trainer must not build it again (a LossScaleOptimizer would make a second
    loss scale and step counter, unrestored)."""
    import tensorflow as tf

    from tfloop import collectives
    from tfloop.engine.loop.trainer import Trainer

    strategy = tf.distribute.get_strategy()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    built_once = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    built_once.build(model.trainable_variables)
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    if prebuilt:
        optimizer.build(model.trainable_variables)
    data = tf.data.Dataset.from_tensors((tf.zeros([4, 3]), tf.zeros([4], tf.int64))).repeat()
    Trainer(strategy=strategy, model=model, optimizer=optimizer,
            collective=collectives.create("reduce_to_one_device", devices=["/cpu:0"]),
            train_dataset=data, global_batch_size=4, global_step=tf.Variable(0, dtype=tf.int64))
    assert optimizer.built
    assert len(optimizer.variables) == len(built_once.variables)
