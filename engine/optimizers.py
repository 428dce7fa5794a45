"""Keras optimizers by name (`--optimizer=sgd|momentum|adam`)."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfloop.engine import keras_bridge
from tfloop.engine.errors import ConfigError

_OPTIMIZERS = {
    "sgd": lambda lr: keras.optimizers.SGD(learning_rate=lr),
    "momentum": lambda lr: keras.optimizers.SGD(learning_rate=lr, momentum=0.9),
    "adam": lambda lr: keras.optimizers.Adam(learning_rate=lr),
}


def available() -> list[str]:
    return sorted(_OPTIMIZERS)


def check(name: str) -> None:
    """Raises the one-line error for an unknown name, without building anything."""
    if name not in _OPTIMIZERS:
        raise ConfigError(
            f"--optimizer={name!r} is not an optimizer; choose one of: {', '.join(available())}"
        )


def build(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
    """Builds optimizer `name`; call inside `strategy.scope()`."""
    check(name)
    return _OPTIMIZERS[name](learning_rate)


# --- fused updates (`--fused_optimizer`) --------------------------------------------------
#
# Keras 3 writes each update as about ten element-wise ops per variable (for
# Adam: m, v, their moments, sqrt, divide, assign), each a separate pass over
# the variable's memory and a separate kernel launch, on every replica. On
# the MLP over 4 logical CPUs that update is as large a share of a step as
# the forward and backward pass. TensorFlow's training kernels
# (`ResourceApplyAdam`, `ResourceApplyKerasMomentum`,
# `ResourceApplyGradientDescent`) do the same arithmetic in one pass and one
# op. The formulas are Keras's own (Adam: lr·√(1−β₂ᵗ)/(1−β₁ᵗ) · m/(√v+ε)), so
# fused and unfused runs agree to float32 rounding; slots, names and
# checkpoints are Keras's, so either can resume the other's checkpoint.


def _handle(variable):
    """The resource handle of `variable` on the device being updated."""
    if isinstance(variable, keras.Variable):
        variable = variable.value  # the tf.Variable (a MirroredVariable under a strategy)
    return variable.handle


class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose update is one `ResourceApplyAdam` per variable."""

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        local_step = tf.cast(self.iterations + 1, dtype)
        m, v = keras_bridge.adam_slots(self, variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(m), v=_handle(v),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), local_step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), local_step),
            lr=tf.cast(learning_rate, dtype), beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype), use_locking=False,
        )


class FusedSGD(keras.optimizers.SGD):
    """`keras.optimizers.SGD` (plain or momentum) with one fused op per variable."""

    def update_step(self, gradient, variable, learning_rate):
        if self.nesterov:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        lr, grad = tf.cast(learning_rate, dtype), tf.cast(gradient, dtype)
        if self.momentum:
            tf.raw_ops.ResourceApplyKerasMomentum(
                var=_handle(variable),
                accum=_handle(keras_bridge.momentum_slot(self, variable)),
                lr=lr, grad=grad, momentum=tf.cast(self.momentum, dtype), use_locking=False)
        else:
            tf.raw_ops.ResourceApplyGradientDescent(
                var=_handle(variable), alpha=lr, delta=grad, use_locking=False)


_FUSED = {
    "sgd": lambda lr: FusedSGD(learning_rate=lr),
    "momentum": lambda lr: FusedSGD(learning_rate=lr, momentum=0.9),
    "adam": lambda lr: FusedAdam(learning_rate=lr),
}


def build_fused(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
    """Like `build`, with the fused update kernels; call inside `strategy.scope()`."""
    check(name)
    return _FUSED[name](learning_rate)
