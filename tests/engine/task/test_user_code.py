"""engine/task/user_code.py: the user's step code converted by autograph, the engine's not.

Also the canary of the private autograph API it fences: a TensorFlow release
that moves `ag_ctx` or `tf.__internal__.autograph.tf_convert` fails here by name.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx
from tensorflow.python.autograph.impl import api as autograph_api
from tensorflow.python.autograph.pyct import cache as autograph_cache
from tensorflow.python.autograph.pyct import transpiler

from tfloop import collectives, inputs
from tfloop.engine.loop.evaluator import Evaluator
from tfloop.engine.loop.trainer import Trainer
from tfloop.engine.run_dir import export
from tfloop.engine.task import user_code
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.task.plugin import ClassificationTask


def test_the_private_autograph_api_is_where_the_fence_expects_it():
    assert user_code._ENABLED.status == ag_ctx.Status.ENABLED
    assert callable(tf.__internal__.autograph.tf_convert)


def _branches(x):
    if tf.reduce_sum(x) > 0:  # Python `if` on a tensor: needs autograph in a graph
        return x * 2.0
    return -x


def test_a_users_function_is_converted_inside_a_function_traced_without_autograph():
    converted = tf.function(lambda x: user_code.converted(_branches)(x), autograph=False)
    np.testing.assert_array_equal(converted(tf.constant([1.0, 2.0])), [2.0, 4.0])
    np.testing.assert_array_equal(converted(tf.constant([-1.0, -2.0])), [1.0, 2.0])
    plain = tf.function(lambda x: _branches(x), autograph=False)
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        plain(tf.constant([1.0]))  # what the engine's own, unconverted code may not do
    assert user_code.converted(None) is None


def test_what_autograph_leaves_alone_stays_unconverted(fresh_conversions):
    left_alone = tf.autograph.experimental.do_not_convert(_branches)
    traced = tf.function(lambda x: user_code.converted(left_alone)(x), autograph=False)
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        traced(tf.constant([1.0]))
    layer = keras.layers.Dense(2)  # Keras's own code: autograph's allowlist, as in tf.function
    out = tf.function(lambda x: user_code.converted(layer)(x), autograph=False)(tf.ones([3, 4]))
    assert out.shape == (3, 2)
    assert fresh_conversions == []  # neither the marked function nor any of Keras's


def _branching_loss(model, batch, training):
    """A user's loss with Python control flow over tensors: a branch and a loop."""
    x, y = batch
    logits = model(x, training=training)
    per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    if tf.reduce_min(per_example) < 0:  # never: a cross-entropy is not negative
        per_example = -per_example
    rounds = tf.zeros_like(per_example)
    for _ in tf.range(3):
        rounds += 1.0
    return LossOutput(per_example, {"rounds": rounds})


@pytest.fixture
def fresh_conversions(monkeypatch):
    """Every function autograph converts from here on, as `module:qualname`
    (a cold cache: what a fresh process converts)."""
    converted = []
    original = transpiler.PyToPy.transform_function

    def recorded(self, fn, user_context):
        converted.append((getattr(fn, "__module__", "") or "") + ":" + getattr(fn, "__qualname__", ""))
        return original(self, fn, user_context)

    monkeypatch.setattr(autograph_api._TRANSPILER, "_cache", autograph_cache.CodeObjectCache())
    monkeypatch.setattr(transpiler.PyToPy, "transform_function", recorded)
    return converted


def test_the_engines_loops_convert_only_the_users_code(cpu_devices, fresh_conversions):
    splits = inputs.load("synthetic", seed=3)
    strategy = tf.distribute.MirroredStrategy(cpu_devices[:2])
    with strategy.scope():
        model = keras.Sequential([keras.Input(splits.input_shape), keras.layers.Flatten(),
                                  keras.layers.Dense(splits.num_classes)])
        optimizer = keras.optimizers.Adam(1e-3)
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    trainer = Trainer(
        strategy=strategy, model=model, optimizer=optimizer, loss_fn=_branching_loss,
        collective=collectives.create("reduce_to_one_device", devices=cpu_devices[:2]),
        train_dataset=inputs.train_batches(splits.train, global_batch_size=32, seed=3),
        global_batch_size=32, global_step=step)
    first = trainer.train(5)
    last = trainer.train(20)
    assert int(step.numpy()) == 25
    assert first["rounds"] == 3.0 and last["rounds"] == 3.0  # the user's loop ran, in the graph
    assert last["loss"] < first["loss"]
    evaluator = Evaluator(strategy=strategy, model=model,
                          eval_dataset=inputs.eval_batches(splits.eval, global_batch_size=32),
                          loss_fn=_branching_loss)
    evaluated = evaluator.evaluate()
    assert evaluated["rounds"] == 3.0 and evaluated["examples"] == len(splits.eval)
    engine = sorted({m for m in fresh_conversions if m.startswith("tfloop.")})
    assert engine == [], f"autograph converted the engine's own code: {engine}"
    assert f"{__name__}:_branching_loss" in fresh_conversions  # the user's loss was


class _ServesWithABranch(ClassificationTask):
    """A task's own `serve`: a Python `if` on a tensor, which only autograph can trace."""

    def serve(self, model, features):
        outputs = model(features, training=False)
        if tf.reduce_max(outputs) > 1e9:  # never
            outputs = outputs / 2.0
        return outputs


def test_the_default_task_and_the_export_run_unconverted_and_a_tasks_own_serve_converted(
        fresh_conversions):
    """The default task's loss (`ClassificationTask.loss`, `scaled`,
    `classification_loss`), its `serve` and the export's serving function are
    the engine's own code: a fresh process converted all six at every first
    run and export (0.64 s of the 4.6 s CPU of a 40-step `run`); none is now.
    A task's own `serve` still is, as its `loss` is."""
    task = _ServesWithABranch(seed=3)
    task.prepare()
    model = task.build_model()
    images = tf.zeros([4, *task.splits.input_shape], tf.uint8)
    labels = tf.zeros([4], tf.int64)
    step = tf.function(lambda x, y: user_code.converted(task.loss)(
        model, (x, y), training=True).per_example_loss, autograph=False)
    assert step(images, labels).shape == [4]
    spec = task.serving_spec(tf.TensorSpec([None, *task.splits.input_shape], tf.uint8))
    served = export._trace(model, task.serve, spec)
    assert served(tf.zeros([2, *task.splits.input_shape]))["outputs"].shape == [2, 10]
    plain = export._trace(model, ClassificationTask.serve.__get__(task), spec)
    assert plain(tf.zeros([1, *task.splits.input_shape]))["outputs"].shape == [1, 10]
    engine = sorted({m for m in fresh_conversions if m.startswith("tfloop.")})
    assert engine == [], f"autograph converted the engine's own code: {engine}"
    assert f"{__name__}:_ServesWithABranch.serve" in fresh_conversions
