"""`engine.run_dir.checkpointing`: what a checkpoint holds and how it comes back.

The module's contract, on a tiny Keras model in this process (no strategy,
no training loop): `ckpt-<step>` holds the model, the optimizer, the step and
the flat `model_weights/NNN_name` listing; a second save of a step costs
nothing; a restore puts back exactly what was
saved, refuses another model's checkpoint before touching a variable, and
for inference prefers the moving averages; a worker's temporary save folder
left by a killed run is removed by the next start of that task only.
Which checkpoint to resume from, and damaged ones:
tests/engine/run_dir/test_checkpoint_recovery.py; a full disk during a save:
the same file.
"""

import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import checkpointing


def _model(units=3, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])


def _trained(directory, *, units=3, seed=0, averages=None, steps=(5,)):
    """A model, an SGD optimizer that took one step, and its manager in `directory`."""
    model = _model(units, seed)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.apply_gradients([(tf.ones_like(v), v) for v in model.trainable_variables])
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint, manager = checkpointing.create(
        model=model, optimizer=optimizer, global_step=step, directory=str(directory),
        max_to_keep=3, averages=averages)
    paths = []
    for value in steps:
        step.assign(value)
        paths.append(checkpointing.save(manager, value))
    return model, optimizer, manager, paths


def test_a_checkpoint_lists_the_weights_by_order_and_name(tmp_path):
    model, _, _, (path,) = _trained(tmp_path)
    assert list(checkpointing.named_weights(model)) == ["000_kernel", "001_bias"]
    assert path == str(tmp_path / "ckpt-5")
    stored = checkpointing.stored_names(path)
    assert "model_weights/000_kernel/.ATTRIBUTES/VARIABLE_VALUE" in stored
    assert checkpointing.holds(path, "model_weights") and checkpointing.holds(path, "optimizer")
    assert not checkpointing.holds(path, checkpointing.AVERAGES)
    assert not checkpointing.holds(None, "model_weights")


def test_a_second_save_of_a_step_writes_nothing(tmp_path):
    _, _, manager, _ = _trained(tmp_path, steps=())
    first = checkpointing.save(manager, 5)
    written = {name: os.stat(tmp_path / name).st_mtime_ns for name in os.listdir(tmp_path)}
    again = checkpointing.save(manager, 5)
    assert again == first == str(tmp_path / "ckpt-5")
    assert {name: os.stat(tmp_path / name).st_mtime_ns
            for name in os.listdir(tmp_path)} == written
    assert checkpointing.save(None, 5) is None  # a run that only reads saves nothing


def test_a_restore_puts_back_the_weights_the_slots_and_the_step(tmp_path):
    model, optimizer, _, (path,) = _trained(tmp_path)
    fresh, fresh_optimizer = _model(seed=1), keras.optimizers.SGD(0.1, momentum=0.9)
    fresh_optimizer.build(fresh.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint, _ = checkpointing.create(model=fresh, optimizer=fresh_optimizer, global_step=step,
                                         directory=None, max_to_keep=1)
    assert checkpointing.restore(checkpoint, path, str(tmp_path)) == path
    assert int(step.numpy()) == 5
    for saved, restored in zip(model.variables, fresh.variables):
        np.testing.assert_array_equal(saved.numpy(), restored.numpy())
    for saved, restored in zip(optimizer.variables, fresh_optimizer.variables):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(restored))
    assert checkpointing.restore(checkpoint, None, str(tmp_path)) is None  # nothing to resume


def test_another_models_checkpoint_is_refused_before_any_variable_changes(tmp_path):
    _, _, _, (path,) = _trained(tmp_path, units=3)
    wider = _model(units=5, seed=1)
    before = [v.numpy() for v in wider.variables]
    checkpoint, _ = checkpointing.create(
        model=wider, optimizer=keras.optimizers.SGD(0.1), global_step=tf.Variable(0, tf.int64),
        directory=None, max_to_keep=1)
    with pytest.raises(ConfigError, match=r"holds ckpt-5, which does not fit this model "
                       r"\(model_weights/000_kernel is float32 \(4, 3\) there and float32 "
                       r"\(4, 5\) in this model\); use a new --model_dir"):
        checkpointing.restore(checkpoint, path, str(tmp_path))
    for was, now in zip(before, wider.variables):
        np.testing.assert_array_equal(was, now.numpy())


def test_inference_reads_the_moving_averages_where_the_checkpoint_has_them(tmp_path):
    model = _model()
    averages = {name: tf.Variable(tf.fill(v.shape, 7.0))
                for name, v in checkpointing.named_weights(model).items()}
    _, _, _, (with_averages,) = _trained(tmp_path / "ema", averages=averages)
    trained, _, _, (plain,) = _trained(tmp_path / "plain")

    reader, step = _model(seed=2), tf.Variable(0, dtype=tf.int64)
    assert checkpointing.restore_for_inference(reader, step, with_averages)
    assert int(step.numpy()) == 5
    assert all(np.all(v.numpy() == 7.0) for v in reader.variables)
    assert not checkpointing.restore_for_inference(reader, step, plain)
    for saved, restored in zip(trained.variables, reader.variables):
        np.testing.assert_array_equal(saved.numpy(), restored.numpy())


def test_a_workers_save_folder_left_by_a_kill_is_removed_by_that_task_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = checkpointing.worker_save_dir("runs/a", "worker:1")
    other_task = checkpointing.worker_save_dir("runs/a", "worker:2")
    other_run = checkpointing.worker_save_dir("runs/b", "worker:1")
    fresh = checkpointing.worker_save_dir("runs/a", "worker:1")
    assert fresh != killed and os.path.isdir(fresh) and not os.path.exists(killed)
    assert os.path.isdir(other_task) and os.path.isdir(other_run)
    assert os.path.dirname(fresh) == str(tmp_path)
