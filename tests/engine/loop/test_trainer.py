"""`engine.loop.trainer.Trainer`: one compiled loop of replicated steps.

The trainer's own contract, on a linear model whose loss and gradient NumPy
computes exactly: `train(n)` advances the global step by n and returns the
loop's mean `loss` and `grad_norm` (the reduced gradients' global norm, before
any clipping); loops of any length cut the same stream of batches, so two
loops of 2 and 3 steps end with the weights and step of one loop of 5; bad
arguments are refused at construction, naming the argument and its value.
What the step computes on several replicas: tests/engine/loop/test_distributed_equivalence.py;
accumulation and clipping: tests/engine/loop/test_step_options.py; non-finite values:
tests/engine/loop/test_nan_guard.py. In process, one CPU device, a few steps.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfloop import collectives
from tfloop.engine.task.losses import LossOutput
from tfloop.engine.loop.settings import Step
from tfloop.engine.loop.trainer import GRAD_NORM, Trainer

BATCH, FEATURES, LEARNING_RATE = 8, 3, 0.05


def _batches(num):
    """`num` distinct global batches of a linear regression."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num, BATCH, FEATURES)).astype(np.float32)
    return x, (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)


def _loss(model, batch, *, training):
    x, y = batch
    return LossOutput(per_example_loss=(model(x, training=training)[:, 0] - y) ** 2)


def _parts():
    keras.utils.set_random_seed(3)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
        step = tf.Variable(0, dtype=tf.int64, trainable=False)
    return strategy, model, optimizer, step


def _trainer(x, y, **overrides):
    strategy, model, optimizer, step = _parts()
    arguments = dict(
        strategy=strategy, model=model, optimizer=optimizer, loss_fn=_loss,
        collective=collectives.create("reduce_to_one_device", devices=["/cpu:0"]),
        train_dataset=tf.data.Dataset.from_tensor_slices((x, y)).repeat(),
        global_batch_size=BATCH, global_step=step)
    options = {name: overrides.pop(name) for name in list(overrides)
               if name in Step.__dataclass_fields__}
    return Trainer(**{**arguments, **overrides}, options=Step(**options)), model, step


def test_a_loop_returns_the_mean_loss_and_gradient_norm_of_its_steps():
    x, y = _batches(2)
    trainer, model, step = _trainer(x, y)
    kernel, bias = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    expected_loss, expected_norm = [], []
    for features, target in zip(x.astype(np.float64), y):  # plain SGD, in float64
        residual = features @ kernel[:, 0] + bias[0] - target
        grad_kernel = 2 / BATCH * features.T @ residual
        grad_bias = 2 / BATCH * residual.sum()
        expected_loss.append(np.mean(residual ** 2))
        expected_norm.append(np.sqrt(np.sum(grad_kernel ** 2) + grad_bias ** 2))
        kernel -= LEARNING_RATE * grad_kernel[:, None]
        bias -= LEARNING_RATE * grad_bias

    metrics = trainer.train(2)
    assert int(step.numpy()) == 2
    assert {"loss", GRAD_NORM} <= set(metrics)
    np.testing.assert_allclose(metrics["loss"], np.mean(expected_loss), rtol=1e-5)
    np.testing.assert_allclose(metrics[GRAD_NORM], np.mean(expected_norm), rtol=1e-5)
    np.testing.assert_allclose(model.trainable_variables[0].numpy(), kernel, rtol=1e-5)


def test_loops_of_any_length_train_the_same_stream_of_batches():
    x, y = _batches(5)
    cut, cut_model, cut_step = _trainer(x, y)
    first, second = cut.train(2), cut.train(3)
    whole, whole_model, whole_step = _trainer(x, y)
    together = whole.train(5)
    assert int(cut_step.numpy()) == int(whole_step.numpy()) == 5
    for a, b in zip(cut_model.trainable_variables, whole_model.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose((2 * first["loss"] + 3 * second["loss"]) / 5, together["loss"],
                               rtol=1e-6)


@pytest.mark.parametrize("overrides, message", [
    (dict(global_batch_size=0), r"`global_batch_size` \(0\) must be positive"),
    # The step's options are its flags' section (`Step`), checked as the flags are.
    (dict(accumulation_steps=0), r"^--accumulation_steps=0 must be a positive integer"),
    (dict(clip_norm=-1.0), r"^--clip_norm=-1.0 must be 0 or a positive number$"),
    (dict(nan_policy="ignore"), r"^--nan_policy='ignore' is not a policy; choose one of: stop, "
                                "skip_step$"),
    (dict(nan_max_skips=0), r"^--nan_max_skips=0 must be a positive integer"),
    (dict(optimizer=None), r"Trainer needs `objectives`, or an `optimizer`"),
])
def test_bad_arguments_are_refused_at_construction_naming_the_value(overrides, message):
    x, y = _batches(1)
    with pytest.raises(ValueError, match=message):
        _trainer(x, y, **overrides)


@pytest.mark.parametrize("num_steps", [-1, 2**31])
def test_a_loop_longer_than_int32_or_negative_is_refused_and_nothing_runs(num_steps):
    x, y = _batches(1)
    trainer, model, step = _trainer(x, y)
    before = [v.numpy() for v in model.trainable_variables]
    with pytest.raises(ValueError, match=rf"`num_steps` \({num_steps}\) must be between 0 and "
                       r"2\*\*31 - 1"):
        trainer.train(num_steps)
    assert int(step.numpy()) == 0
    for was, now in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(was, now.numpy())


def test_the_global_step_is_counted_only_after_every_replicas_batch_arrived(mirrored_trainer):
    """The traced loop body: the global step's increment has, among its
    ancestors (data and control edges), the input op of every replica's
    batch, so a batch that fails on any replica is never counted (a fresh
    clone's run once saw `unsaved_step` 7 where 6 steps trained, when only
    the optimizer's step count ordered the increment)."""
    from tfloop.engine.loop import trainer as trainer_lib

    dataset = tf.data.Dataset.from_tensors(
        (tf.zeros([8, 8]), tf.zeros([8], tf.int64))).repeat()
    trainer = mirrored_trainer(dataset, features=8, outputs=4)
    graph_def = trainer._loop.get_concrete_function(
        trainer._iterator, tf.constant(2), False).graph.as_graph_def()
    (body,) = [f for f in graph_def.library.function
               if f.signature.name.startswith("while_body")]
    nodes = {node.name: node for node in body.node_def}

    def ancestors(name):
        seen, frontier = set(), [name]
        while frontier:
            for edge in nodes[frontier.pop()].input:
                parent = edge.lstrip("^").split(":")[0]
                if parent in nodes and parent not in seen:
                    seen.add(parent)
                    frontier.append(parent)
        return seen

    counts = [name for name, node in nodes.items()
              if node.op == "AssignAddVariableOp" and trainer_lib.COUNT_SCOPE in name]
    inputs = [name for name, node in nodes.items() if node.op.startswith(
        ("IteratorGetNext", "MultiDeviceIteratorGetNextFromShard"))]
    assert counts and len(inputs) == trainer.strategy.num_replicas_in_sync, (counts, inputs)
    for count in counts:
        assert set(inputs) <= ancestors(count), (count, set(inputs) - ancestors(count))
