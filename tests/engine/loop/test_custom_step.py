"""A user's own step (examples/two_heads.py) under the engine's distribution."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop import collectives
from tfloop import inputs
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.task.losses import LossOutput, classification_loss
from tfloop.engine.assembly.run import run
from tfloop.engine.task import ClassificationTask
from tfloop.engine.loop.trainer import Trainer
from examples import two_heads


def _trainer(devices, seed=11, optimizer=lambda: keras.optimizers.Adam(2e-3)):
    splits = inputs.load("synthetic", seed=seed)
    keras.utils.set_random_seed(seed)
    strategy = (tf.distribute.MirroredStrategy(devices) if len(devices) > 1
                else tf.distribute.OneDeviceStrategy(devices[0]))
    with strategy.scope():
        model = two_heads.build_model(splits.input_shape, splits.num_classes)
        optimizer = optimizer()
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    trainer = Trainer(
        strategy=strategy, model=model, optimizer=optimizer, loss_fn=two_heads.loss_fn,
        collective=collectives.create("reduce_to_one_device", devices=devices),
        train_dataset=inputs.train_batches(splits.train, global_batch_size=64, seed=seed),
        global_batch_size=64, global_step=step,
    )
    return trainer, model


def test_both_losses_fall_and_metrics_are_reported(cpu_devices):
    trainer, _ = _trainer(cpu_devices)
    first = trainer.train(10)
    for _ in range(4):
        last = trainer.train(20)
    assert {"loss", "digit_loss", "parity_loss", "digit_accuracy", "parity_accuracy"} <= set(last)
    assert last["digit_loss"] < 0.85 * first["digit_loss"]
    assert last["parity_loss"] < first["parity_loss"]
    # The objective is the weighted sum the step defines.
    np.testing.assert_allclose(
        last["loss"], last["digit_loss"] + two_heads.PARITY_WEIGHT * last["parity_loss"], rtol=1e-4)


@pytest.mark.compares  # four replicas trained against one device (tests/tiers.py)
def test_custom_step_on_four_replicas_matches_one_device(cpu_devices):
    weights = []
    for devices in (cpu_devices[:1], cpu_devices):
        trainer, model = _trainer(devices, optimizer=lambda: keras.optimizers.SGD(0.1))
        trainer.train(5)
        weights.append([v.numpy() for v in model.trainable_variables])
    for one, four in zip(*weights):
        assert np.max(np.abs(one - four)) / np.max(np.abs(one)) < 1e-5


def _broadcasting_loss(model, batch, *, training):
    images, labels = batch
    logits = model(images, training=training)
    targets = tf.cast(labels, tf.float32)[:, None]              # (batch, 1)
    predicted = tf.cast(tf.argmax(logits, -1), tf.float32)      # (batch,)
    return LossOutput(per_example_loss=tf.square(targets - predicted))  # (batch, batch)


def _mean_loss(model, batch, *, training):
    images, labels = batch
    logits = model(images, training=training)
    return LossOutput(per_example_loss=tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)))


def _broadcasting_metric(model, batch, *, training):
    output = classification_loss(model, batch, training=training)
    correct = output.metrics["accuracy"]
    return LossOutput(per_example_loss=output.per_example_loss,
                      metrics={"accuracy": correct[:, None] * correct})


@pytest.mark.parametrize("loss_fn, says", [
    (_broadcasting_loss, "per_example_loss has shape (batch, batch), not (batch,); "
                         "a (batch, 1) tensor against a (batch,) one broadcasts"),
    (_mean_loss, "per_example_loss has shape (), not (batch,); return one value per example, "
                 "not their mean"),
    (_broadcasting_metric, "metrics['accuracy'] has shape (batch, batch)"),
])
def test_a_loss_function_that_breaks_the_contract_is_one_line(tmp_path, loss_fn, says):
    model_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as error:
        config = RunConfig(strategy="mirrored", devices="cpu:0,cpu:1", global_batch_size=32,
                           train_steps=2, model_dir=str(model_dir))
        run(config, task=ClassificationTask.from_config(config, loss_fn=loss_fn))
    assert says in str(error.value) and "\n" not in str(error.value)
    assert not model_dir.exists()
