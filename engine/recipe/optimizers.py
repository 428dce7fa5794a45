"""Keras optimizers by name (`--optimizer=sgd|momentum|adam|adamw`), with
decoupled weight decay (`--weight_decay`, `--weight_decay_exclude`).

Weight decay is Keras 3's own, for every optimizer (its `weight_decay=`
constructor argument): before each update, `w -= learning_rate *
weight_decay * w` on every variable not excluded, then the optimizer's
update from the gradient (AdamW's decoupled decay, Loshchilov & Hutter
2019). The decay is not part of the gradient, so it is not all-reduced, not
loss-scaled, and not seen by Adam's moments; it scales with the scheduled
learning rate. The fused optimizers below inherit it: Keras applies it in
`apply`, before `update_step`, which is all they replace.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.engine.recipe import keras_bridge
from tfloop.engine.recipe.settings import BIASES_AND_NORMS
from tfloop.engine.errors import ConfigError

#: `--optimizer=adamw` with `--weight_decay=0`: Keras's AdamW default.
ADAMW_DEFAULT_DECAY = 0.004

_OPTIMIZERS = {
    "sgd": lambda lr, wd: keras.optimizers.SGD(learning_rate=lr, weight_decay=wd),
    "momentum": lambda lr, wd: keras.optimizers.SGD(learning_rate=lr, momentum=0.9,
                                                    weight_decay=wd),
    "adam": lambda lr, wd: keras.optimizers.Adam(learning_rate=lr, weight_decay=wd),
    "adamw": lambda lr, wd: keras.optimizers.AdamW(learning_rate=lr, weight_decay=wd),
}


def available() -> list[str]:
    return sorted(_OPTIMIZERS)


def check(name: str) -> None:
    """Raises the one-line error for an unknown name, without building anything."""
    if name not in _OPTIMIZERS:
        raise ConfigError(
            f"--optimizer={name!r} is not an optimizer; choose one of: {', '.join(available())}"
        )


def weight_decay_for(name: str, weight_decay: float) -> float:
    """The decay optimizer `name` applies: `weight_decay`, or AdamW's default
    when `adamw` is asked for with none."""
    if name == "adamw" and not weight_decay:
        return ADAMW_DEFAULT_DECAY
    return weight_decay


def build(name: str, learning_rate: float, *, weight_decay: float = 0.0
          ) -> keras.optimizers.Optimizer:
    """Builds optimizer `name` (decoupled `weight_decay`, see `weight_decay_for`);
    call inside `strategy.scope()`."""
    check(name)
    return _OPTIMIZERS[name](float(learning_rate), weight_decay_for(name, weight_decay) or None)


class WeightDecay(NamedTuple):
    """What `exclude_from_decay` set up, for the start-up log line."""

    rate: float
    decayed: int
    excluded: int
    exclude: str
    adamw_default: bool = False

    def describe(self) -> str:
        default = " (adamw's default; --weight_decay=0)" if self.adamw_default else ""
        return (f"weight decay {self.rate:g}{default}: {self.decayed} variable(s) decay, "
                f"{self.excluded} excluded (--weight_decay_exclude={self.exclude})")


def excluded_from_decay(variables: Sequence, exclude: str) -> list:
    """The variables `--weight_decay_exclude=exclude` leaves alone:
    `biases_and_norms` those of at most one dimension, `none` nothing, else
    those whose path contains one of the comma-separated substrings."""
    if exclude == BIASES_AND_NORMS:
        return [v for v in variables if len(v.shape) <= 1]
    if exclude in ("none", ""):
        return []
    patterns = [p.strip() for p in exclude.split(",") if p.strip()]
    return [v for v in variables if any(p in _path(v) for p in patterns)]


def _path(variable) -> str:
    """A Keras variable's path (`dense/kernel`); a plain tf.Variable's name."""
    return getattr(variable, "path", None) or variable.name


def exclude_from_decay(optimizer: keras.optimizers.Optimizer, variables: Sequence,
                       exclude: str, *, adamw_default: bool = False) -> Optional[WeightDecay]:
    """Tells an unbuilt `optimizer` (the one that applies the decay, not a
    loss-scale wrapper) which of `variables` not to decay, through Keras's
    public `exclude_from_weight_decay`; None when it does not decay."""
    if not optimizer.weight_decay:
        return None
    excluded = excluded_from_decay(variables, exclude)
    optimizer.exclude_from_weight_decay(var_list=excluded)
    return WeightDecay(rate=float(optimizer.weight_decay),
                       decayed=len(variables) - len(excluded), excluded=len(excluded),
                       exclude=exclude, adamw_default=adamw_default)


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
#
# They are the default (`--nofused_optimizer` gives Keras's own update). One
# difference is deliberate: a sparse gradient (an Embedding's `IndexedSlices`)
# is applied as the dense gradient it stands for, rows repeated in the batch
# summed first, as Adam's formula and Keras 2 had it; Keras 3's own Adam
# squares each slice before summing repeated rows, so on such a batch the two
# differ (`tests/engine/recipe/test_optimizers.py`).


def _handle(variable):
    """The resource handle of `variable` on the device being updated."""
    if isinstance(variable, keras.Variable):
        variable = variable.value  # the tf.Variable (a MirroredVariable under a strategy)
    return variable.handle


class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose update is one `ResourceApplyAdam` per variable.

    The step's scalars (βᵗ powers, the learning rate in the variable's dtype)
    are computed once per update and device, not once per variable as
    Keras's `update_step` does: a ResNet-50 has 161 variables, and each
    scalar op is a kernel launch and a read of `iterations` on a GPU.
    """

    def apply(self, grads, trainable_variables=None):
        # Called by `apply_gradients` in every replica's context; the one
        # cross-replica update runs inside, once all replicas are in. The
        # cache lives for this update only: its tensors belong to its graph.
        self._scalars = {}
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._scalars = None

    def _step_scalars(self, variable, learning_rate):
        """(lr, β₁ᵗ, β₂ᵗ) for this update on `variable`'s device and dtype
        (computed afresh when `update_step` is called outside `apply`)."""
        dtype = variable.dtype
        key = (_handle(variable).device, dtype)
        cache = getattr(self, "_scalars", None)
        if cache is None:
            cache = {}
        if key not in cache:
            local_step = tf.cast(self.iterations + 1, dtype)
            cache[key] = (tf.cast(learning_rate, dtype),
                          tf.pow(tf.cast(self.beta_1, dtype), local_step),
                          tf.pow(tf.cast(self.beta_2, dtype), local_step))
        return cache[key]

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        lr, beta1_power, beta2_power = self._step_scalars(variable, learning_rate)
        m, v = keras_bridge.adam_slots(self, variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(m), v=_handle(v),
            beta1_power=beta1_power, beta2_power=beta2_power,
            lr=lr, beta1=tf.cast(self.beta_1, dtype),
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
    "sgd": lambda lr, wd: FusedSGD(learning_rate=lr, weight_decay=wd),
    "momentum": lambda lr, wd: FusedSGD(learning_rate=lr, momentum=0.9, weight_decay=wd),
    "adam": lambda lr, wd: FusedAdam(learning_rate=lr, weight_decay=wd),
    # Keras's AdamW is Adam with a default decay; the fused Adam decays the same way.
    "adamw": lambda lr, wd: FusedAdam(learning_rate=lr, weight_decay=wd),
}


def build_fused(name: str, learning_rate: float, *, weight_decay: float = 0.0
                ) -> keras.optimizers.Optimizer:
    """Like `build`, with the fused update kernels; call inside `strategy.scope()`."""
    check(name)
    return _FUSED[name](float(learning_rate), weight_decay_for(name, weight_decay) or None)
