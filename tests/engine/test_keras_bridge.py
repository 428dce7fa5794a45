"""Canary for the one private Keras hook the engine relies on.

If this fails, Keras changed how its TensorFlow optimizer reduces gradients:
update engine/keras_bridge.py (the equivalence tests then tell whether
gradients are reduced exactly once).
"""

import keras
import tensorflow as tf

from engine import keras_bridge


def test_keras_optimizer_still_has_the_implicit_reduction_hook():
    optimizer = keras.optimizers.SGD(0.1)
    assert callable(getattr(type(optimizer), keras_bridge._HOOK, None)), (
        "Keras moved TFOptimizer._all_reduce_sum_gradients; update engine/keras_bridge.py"
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
