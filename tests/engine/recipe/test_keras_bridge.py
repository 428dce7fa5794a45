"""Canary for the Keras internals the engine relies on, all in engine/recipe/keras_bridge.py.

If this fails, Keras changed how its TensorFlow optimizer reduces gradients
or where it keeps a variable's slots: update engine/recipe/keras_bridge.py (the
equivalence tests then tell whether gradients are reduced exactly once, and
tests/engine/recipe/test_optimizers.py whether the fused updates still match).
"""

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine.recipe import keras_bridge


def test_keras_optimizer_still_has_the_implicit_reduction_hook():
    optimizer = keras.optimizers.SGD(0.1)
    assert callable(getattr(type(optimizer), keras_bridge._HOOK, None)), (
        "Keras moved TFOptimizer._all_reduce_sum_gradients; update engine/recipe/keras_bridge.py"
    )


def test_disabled_reduction_passes_gradients_through():
    optimizer = keras.optimizers.SGD(0.1)
    keras_bridge.disable_implicit_gradient_reduction(optimizer)
    pairs = [(tf.constant(1.0), tf.Variable(2.0))]
    assert getattr(optimizer, keras_bridge._HOOK)(pairs) == pairs


def test_loss_scale_optimizer_is_bridged_at_its_inner_optimizer():
    inner = keras.optimizers.SGD(0.1)
    keras_bridge.disable_implicit_gradient_reduction(keras.optimizers.LossScaleOptimizer(inner))
    assert keras_bridge._HOOK in vars(inner)


def test_adam_slots_are_the_moments_keras_updates():
    """The fused Adam update writes these: they must be the optimizer's own
    first and second moment of that variable (same shape, in its variables)."""
    variables = [tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([2, 2]))]
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(variables)
    owned = {id(v) for v in optimizer.variables}
    for variable in variables:
        m, v = keras_bridge.adam_slots(optimizer, variable)
        assert m.shape == v.shape == variable.shape and m is not v
        assert id(m) in owned and id(v) in owned, (
            "Keras moved Adam's moments; update engine/recipe/keras_bridge.py")
    optimizer.apply_gradients([(tf.ones([3]), variables[0]), (tf.ones([2, 2]), variables[1])])
    m, v = keras_bridge.adam_slots(optimizer, variables[0])
    assert float(tf.reduce_min(m)) > 0 and float(tf.reduce_min(v)) > 0  # Keras updated these


def test_momentum_slot_is_the_accumulator_keras_updates():
    variables = [tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([4]))]
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(variables)
    accumulator = keras_bridge.momentum_slot(optimizer, variables[1])
    assert accumulator.shape == variables[1].shape
    assert id(accumulator) in {id(v) for v in optimizer.variables}
    optimizer.apply_gradients([(tf.ones([3]), variables[0]), (tf.ones([4]), variables[1])])
    assert float(tf.reduce_max(tf.abs(accumulator))) > 0  # Keras updated this one


def test_symbolic_build_builds_the_compiled_metrics_where_keras_callbacks_look_for_them():
    """`model.metrics` lists the compiled metrics after the bridge builds them
    (Keras's names, classes and directions: what a mode="auto" monitor reads),
    and `compiled_metric_objects` are those very objects, per argument, with
    Keras's loss tracker and a built optimizer beside them."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd",
                  metrics=["accuracy", "mae"], weighted_metrics=[keras.metrics.AUC(name="w")])
    keras_bridge.symbolic_build(model, (keras.KerasTensor((None, 3), "float32"),
                                        keras.KerasTensor((None,), "int64")))
    built = [(m.name, type(m).__name__, m._direction) for c in model.metrics
             if hasattr(c, "metrics") for m in c.metrics]
    assert built == [("accuracy", "SparseCategoricalAccuracy", "up"),
                     ("mae", "MeanAbsoluteError", "down"), ("w", "AUC", "up")], (
        "Keras moved its compiled metrics (Model._compile_metrics); update "
        "engine/recipe/keras_bridge.py")
    metrics, weighted = keras_bridge.compiled_metric_objects(model)
    compiled = [m for c in model.metrics if hasattr(c, "metrics") for m in c.metrics]
    assert [id(m) for m in metrics + weighted] == [id(m) for m in compiled]
    assert [m.name for m in weighted] == ["w"], "Keras moved _flat_weighted_metrics"
    assert keras_bridge.loss_tracker(model) is model.metrics[0], "Keras moved _loss_tracker"
    assert model.optimizer.built


def test_a_mean_metric_keeps_the_arguments_it_was_given():
    """`SparseTopKCategoricalAccuracy(k=2)` is its function with k=2 (Keras
    keeps it in `_fn_kwargs`), not the function's default k=5."""
    fn = keras_bridge.per_example_metric_fn(keras.metrics.SparseTopKCategoricalAccuracy(k=2))
    y_pred = tf.constant([[0.1, 0.2, 0.3, 0.4]])
    assert float(fn(tf.constant([1]), y_pred)[0]) == 0.0  # class 1 is third: not in the top 2
    fn = keras_bridge.per_example_metric_fn(keras.metrics.BinaryAccuracy(threshold=0.7))
    assert float(tf.reshape(fn(tf.constant([[1.0]]), tf.constant([[0.6]])), [])) == 0.0
    assert keras_bridge.per_example_metric_fn(keras.metrics.AUC()) is None


def test_reducing_gradients_puts_the_given_all_reduce_where_keras_reduces():
    """Inside `reducing_gradients`, `optimizer.apply` hands its gradients
    (Nones left out) to the given all-reduce and applies what it returns;
    after it, the hook it replaced is back."""
    variables = [tf.Variable([1.0, 1.0]), tf.Variable(3.0)]
    optimizer = keras.optimizers.SGD(1.0)
    optimizer.build(variables)
    keras_bridge.disable_implicit_gradient_reduction(optimizer)
    before = getattr(optimizer, keras_bridge._HOOK)
    seen = []

    def all_reduce(grads, variables):
        seen.append((len(grads), len(variables)))
        return [g * 10 for g in grads]

    with keras_bridge.reducing_gradients(optimizer, all_reduce):
        optimizer.apply([tf.constant([0.1, 0.2]), None], variables)
    assert seen == [(1, 1)]
    np.testing.assert_allclose(variables[0].numpy(), [0.0, -1.0], rtol=1e-6)
    assert float(variables[1].numpy()) == 3.0
    assert getattr(optimizer, keras_bridge._HOOK) is before


def test_an_optimizer_made_outside_a_scope_moves_to_the_strategy_as_the_same_instance(
        cpu_devices):
    """`place_optimizer`: the same optimizer and `keras.Variable` objects,
    their values kept, their TensorFlow variables now the strategy's, and the
    update through it (a LossScaleOptimizer's inner optimizer too)."""
    # Reduction to one device: a fresh MirroredStrategy's default collective
    # ops share instance keys with other strategies of the same test process
    # (measured: a shape mismatch with another test's all-reduce under xdist).
    strategy = tf.distribute.MirroredStrategy(
        cpu_devices[:2], cross_device_ops=tf.distribute.ReductionToOneDevice())
    inner = keras.optimizers.SGD(0.25)
    optimizer = keras.optimizers.LossScaleOptimizer(inner)
    variables = list(optimizer.variables)
    assert keras_bridge.optimizer_strategy(inner) is not strategy
    keras_bridge.place_optimizer(optimizer, strategy)
    assert [id(v) for v in optimizer.variables] == [id(v) for v in variables]
    assert all(strategy.extended.variable_created_in_scope(v.value) for v in variables), (
        "keras.Variable._initialize no longer remakes its TensorFlow variable; update "
        "engine/recipe/keras_bridge.py")
    assert float(inner.learning_rate.numpy()) == 0.25
    assert keras_bridge.optimizer_strategy(optimizer) is keras_bridge.optimizer_strategy(
        inner) is strategy
    with strategy.scope():
        weight = tf.Variable(1.0)
        optimizer.build([weight])

    @tf.function
    def step():
        strategy.run(lambda: optimizer.apply_gradients([(tf.constant(1.0), weight)]))

    step()
    assert float(weight.numpy()) != 1.0 and int(inner.iterations.numpy()) == 1
