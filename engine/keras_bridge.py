"""The one place the engine reaches into Keras internals.

Why it must: Keras 3's TensorFlow optimizer sums gradients across replicas by
itself whenever `apply_gradients` runs in a replica context
(`TFOptimizer._all_reduce_sum_gradients`), and has no public switch to say
"already reduced" (Keras 2's `experimental_aggregate_gradients=False` is
gone). The engine all-reduces explicitly, through the collective the user
chose, so it turns the implicit reduction off on its own optimizer instance.
Left on, every update would be `num_replicas` times too large.

`tests/engine/test_keras_bridge.py` fails loudly if Keras moves or renames the
hook, and the N-replicas-equals-one-device tests catch any double reduction.
"""

from __future__ import annotations

import keras

_HOOK = "_all_reduce_sum_gradients"


def _innermost(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    # A LossScaleOptimizer delegates the update (and so the reduction) inward.
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


def disable_implicit_gradient_reduction(optimizer: keras.optimizers.Optimizer) -> None:
    """Makes `optimizer.apply_gradients` apply gradients exactly as given."""
    target = _innermost(optimizer)
    if not callable(getattr(type(target), _HOOK, None)):
        raise RuntimeError(
            f"{type(target).__name__} has no {_HOOK}: Keras changed how its TensorFlow "
            "optimizer reduces gradients; update engine/keras_bridge.py"
        )
    setattr(target, _HOOK, lambda grads_and_vars: list(grads_and_vars))
