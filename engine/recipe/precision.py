"""Mixed precision (`--mixed_precision`): compute in float16/bfloat16, keep float32 weights.

The run's precision is `--mixed_precision` when set to other than its
default float32 (`Speed.changed`), else Keras's global dtype policy at
the run's start
(`keras.mixed_precision.set_global_policy("mixed_float16")` at the top of a
script, as Keras's mixed precision guide writes it): `global_policy`
resolves it once (`engine.assembly.plan.make_plan`), so the model, the loss
scale, run.json's ranges and the HParams all say the precision trained.

Keras layers take their dtype policy when they are built, so the policy is
set only around model construction and restored at once: nothing else in the
process (another run, a test) inherits it. Under a `mixed_*` policy layers
keep float32 variables (the "master weights" the optimizer updates and
checkpoints hold) and cast them to the compute dtype when called.

float16 has a narrow exponent range, so small gradients underflow to zero.
`mixed_float16` therefore wraps the optimizer in Keras's
`LossScaleOptimizer` (Keras's `compile` already wraps a compiled model's,
when the model's policy is mixed_float16: that one is the run's, never
wrapped twice): the trainer multiplies the loss by the current scale
before differentiating (`optimizer.scale_loss`), all-reduces the *scaled*
gradients once through the collective, and `apply_gradients` divides by the
scale, skips the step and halves the scale when any gradient is not finite
(every replica sees the same reduced gradients, so they agree), and doubles
it after a run of finite steps. bfloat16 has float32's exponent range and
needs no scaling.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import keras
import tensorflow as tf

from tfloop.engine.runtime.settings import PRECISIONS, Speed
from tfloop.engine.errors import ConfigError

logger = logging.getLogger(__name__)


def global_policy(speed: Speed) -> str:
    """The precision the run trains in: `speed.mixed_precision` as given,
    else Keras's global dtype policy, as Keras's `fit` would honour it (a
    policy the engine does not train, float64 say, refused in one line)."""
    if speed.changed("mixed_precision"):
        return speed.mixed_precision
    name = keras.config.dtype_policy().name
    if name == speed.mixed_precision:
        return name
    if name not in PRECISIONS:
        raise ConfigError(
            f"Keras's global dtype policy is {name!r}, which tfloop does not train in; set "
            f"one of {', '.join(PRECISIONS)} (keras.config.set_dtype_policy) or "
            "RunConfig(mixed_precision=...) (--mixed_precision)")
    logger.info("mixed precision %s: Keras's global dtype policy (--mixed_precision left at "
                "float32)", name)
    return name


@contextlib.contextmanager
def model_policy(name: str) -> Iterator[None]:
    """Builds models created inside the block under dtype policy `name`."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, name: str) -> keras.optimizers.Optimizer:
    """Adds the dynamic loss scale `mixed_float16` needs (an optimizer that
    has one, as Keras's `compile` made it, is kept); other policies unchanged.

    Call inside `strategy.scope()`: the scale and its counter are variables.
    """
    if name == "mixed_float16" and not isinstance(optimizer,
                                                  keras.optimizers.LossScaleOptimizer):
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def loss_scale(optimizer: keras.optimizers.Optimizer):
    """The factor the optimizer's gradients still carry: the dynamic scale of
    a `LossScaleOptimizer` (a variable), else 1."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.cast(optimizer.dynamic_scale, tf.float32)
    return tf.constant(1.0)
