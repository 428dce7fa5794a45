"""The weights' moving average (`--ema_decay`): its values, its checkpoint, its use.

The reference is numpy: the average starts at the initial weights, and after
step t (from 0) it is d_t·average + (1-d_t)·w, d_t = min(decay, (1+t)/(10+t)),
from the weights the trainer actually had after each step.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop import collectives, inputs, models
from tfloop.engine.run_dir import checkpointing
from tfloop.engine.recipe import ema
from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.run import export_checkpoint, run
from tfloop.engine.loop.trainer import Trainer

DECAY = 0.5


def decay_at(step):
    return min(DECAY, (1 + step) / (10 + step))


def test_averages_follow_the_numpy_recurrence_on_four_replicas(cpu_devices):
    splits = inputs.load("synthetic", seed=3)
    keras.utils.set_random_seed(3)
    strategy = tf.distribute.MirroredStrategy(cpu_devices)
    with strategy.scope():
        net = models.build("mlp")
        optimizer = keras.optimizers.SGD(0.5)
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    weights = net.trainable_variables
    average = ema.WeightAverage(strategy, weights, [str(i) for i in range(len(weights))], DECAY)
    trainer = Trainer(strategy=strategy, model=net, optimizer=optimizer,
                      collective=collectives.create("reduce_to_one_device", devices=cpu_devices),
                      train_dataset=inputs.train_batches(splits.train, global_batch_size=32, seed=3),
                      global_batch_size=32, global_step=step, average=average)
    expected = [w.numpy() for w in weights]
    for step in range(12):  # d_t warms up to DECAY at step 8, then stays
        trainer.train(1)
        d = decay_at(step)
        expected = [d * e + (1 - d) * w.numpy() for e, w in zip(expected, weights)]
    for key, value in zip(average.averages, expected):
        copies = average.averages[key].values  # every replica's copy
        for copy in copies:
            np.testing.assert_allclose(copy.numpy(), value, rtol=1e-5, atol=1e-6)
    # The averages lag the weights: they are not a copy of them.
    assert max(float(np.max(np.abs(e - w.numpy()))) for e, w in zip(expected, weights)) > 1e-3

    trained = [w.numpy() for w in weights]
    with average.swapped():
        for w, value in zip(weights, expected):
            np.testing.assert_allclose(w.numpy(), value, rtol=1e-5, atol=1e-6)
    for w, value in zip(weights, trained):  # swapped back
        np.testing.assert_array_equal(w.numpy(), value)


def _config(model_dir, **overrides):
    values = dict(devices="cpu:0,cpu:1", model_dir=str(model_dir), global_batch_size=32,
                  steps_per_loop=2, checkpoint_interval=2, eval_steps=4, ema_decay=DECAY,
                  learning_rate=0.01, seed=5, deterministic=True)
    values.update(overrides)
    return RunConfig(**values)


def _stored(path, prefix):
    reader = tf.train.load_checkpoint(path)
    keys = sorted(k for k in reader.get_variable_to_shape_map()
                  if k.startswith(prefix + "/") and k.endswith("VARIABLE_VALUE"))
    return {k.split("/")[1]: reader.get_tensor(k) for k in keys}


def test_averages_resume_exactly(tmp_path):
    whole = run(_config(tmp_path / "whole", train_steps=6, mode="train", export=False))
    run(_config(tmp_path / "parts", train_steps=2, mode="train", export=False))
    parts = run(_config(tmp_path / "parts", train_steps=6, mode="train", export=False))
    assert whole["step"] == parts["step"] == 6
    one = _stored(str(tmp_path / "whole" / "ckpt-6"), checkpointing.AVERAGES)
    two = _stored(str(tmp_path / "parts" / "ckpt-6"), checkpointing.AVERAGES)
    weights = _stored(str(tmp_path / "whole" / "ckpt-6"), "model_weights")
    assert one and set(one) <= set(weights)  # keyed like model_weights/
    for key in one:
        np.testing.assert_allclose(one[key], two[key], rtol=1e-6, atol=1e-7)
    assert max(float(np.max(np.abs(one[k] - weights[k]))) for k in one) > 1e-4


def test_evaluation_and_export_use_the_averages(tmp_path):
    model_dir = tmp_path / "run"
    record = run(_config(model_dir, train_steps=4))
    with open(model_dir / "metrics.json") as f:
        assert json.load(f)["evaluated_weights"] == "moving_average"
    averages = _stored(str(model_dir / "ckpt-4"), checkpointing.AVERAGES)
    weights = _stored(str(model_dir / "ckpt-4"), "model_weights")

    exported = keras.models.load_model(os.path.join(record["export"], "model.keras"))
    by_key = checkpointing.named_weights(exported)
    for key, value in averages.items():
        np.testing.assert_allclose(by_key[key].numpy(), value, rtol=1e-6)
    assert any(not np.allclose(averages[k], weights[k]) for k in averages)

    # run()'s model is what was evaluated and exported; the trained weights come along.
    features = np.random.default_rng(0).normal(
        size=(4, *exported.input_shape[1:])).astype(np.float32)
    np.testing.assert_allclose(record.model.predict(features, verbose=0),
                               exported.predict(features, verbose=0), rtol=1e-5, atol=1e-6)
    for key, variable in checkpointing.named_weights(record.model).items():
        np.testing.assert_allclose(variable.numpy(), averages[key], rtol=1e-6)
        np.testing.assert_allclose(record.raw_weights[variable.path], weights[key], rtol=1e-6)

    # --mode=evaluate of the checkpoint evaluates the averages too (no flag needed).
    run(_config(model_dir, mode="evaluate", ema_decay=0.0))
    with open(model_dir / "evaluations.json") as f:
        evaluated = json.load(f)["evaluations"][-1]
    assert evaluated["eval/loss"] == pytest.approx(record["eval/loss"], rel=1e-5)

    # bin/export's path exports the averages of any kept checkpoint.
    path = export_checkpoint(_config(model_dir, ema_decay=0.0), step=2)
    again = checkpointing.named_weights(keras.models.load_model(os.path.join(path, "model.keras")))
    for key, value in _stored(str(model_dir / "ckpt-2"), checkpointing.AVERAGES).items():
        np.testing.assert_allclose(again[key].numpy(), value, rtol=1e-6)


def test_averages_start_from_the_weights_of_a_checkpoint_without_them(tmp_path, caplog):
    model_dir = tmp_path / "run"
    run(_config(model_dir, train_steps=2, mode="train", export=False, ema_decay=0.0))
    with caplog.at_level("INFO"):
        run(_config(model_dir, train_steps=2, mode="train", export=False))  # nothing to train
    assert "holds no moving averages: they start from its weights" in caplog.text
    averages = _stored(str(model_dir / "ckpt-2"), checkpointing.AVERAGES)
    assert not averages  # ckpt-2 was not rewritten: nothing trained
    run(_config(model_dir, train_steps=3, mode="train", export=False, steps_per_loop=1))
    before = _stored(str(model_dir / "ckpt-2"), "model_weights")
    after = _stored(str(model_dir / "ckpt-3"), "model_weights")
    averages = _stored(str(model_dir / "ckpt-3"), checkpointing.AVERAGES)
    for key, value in averages.items():  # one step from average = weights at step 2
        d = decay_at(2)
        np.testing.assert_allclose(value, d * before[key] + (1 - d) * after[key],
                                   rtol=1e-5, atol=1e-6)
