"""The one place the engine reaches into Keras internals. Five reasons:

1. The implicit gradient reduction. Keras 3's TensorFlow optimizer sums
   gradients across replicas by itself whenever `apply_gradients` runs in a
   replica context (`TFOptimizer._all_reduce_sum_gradients`), and has no
   public switch to say "already reduced" (Keras 2's
   `experimental_aggregate_gradients=False` is gone). The engine all-reduces
   explicitly, through the collective the user chose, so it turns the
   implicit reduction off on its own optimizer instance. Left on, every
   update would be `num_replicas` times too large.
2. The optimizer slots of one variable, for the fused updates
   (`engine.recipe.optimizers`): Keras finds a variable's index with the private
   `_get_variable_index` and keeps Adam's moments in the private
   `_momentums` and `_velocities` lists; SGD's are in `momentums`.
3. A compiled model's metrics as per-example values (`engine.keras_fit`):
   a `MeanMetricWrapper` keeps the function it averages in the private `_fn`.
4. A compiled model's metric objects, built before training as Keras's `fit`
   builds them (`engine.keras_fit.keras_state`): callbacks read
   `model.metrics`, and Keras keeps them in the private `_compile_metrics`.
5. An optimizer made outside the run's strategy scope (`run(optimizer=...)`,
   `Objective(optimizer=...)`), trained as the same instance
   (`engine.recipe.objectives`): a Keras 3 TensorFlow optimizer makes its
   step counter and learning rate when constructed and keeps the strategy
   of that moment in the private `_distribution_strategy`, which its update
   uses; `place_optimizer` remakes those variables' TensorFlow variables in
   the run's scope (Keras's own `Variable._initialize`, the same
   `keras.Variable` objects) and points the optimizer at the run's strategy,
   so nothing it holds (a schedule object, weight-decay exclusions, EMA,
   clipping) is lost to a copy from `get_config()`.

`tests/engine/recipe/test_keras_bridge.py` fails loudly if Keras moves or renames any
of these, and the N-replicas-equals-one-device tests catch any double
reduction.
"""

from __future__ import annotations

import keras

_HOOK = "_all_reduce_sum_gradients"
_STRATEGY = "_distribution_strategy"


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
            "optimizer reduces gradients; update engine/recipe/keras_bridge.py"
        )
    setattr(target, _HOOK, lambda grads_and_vars: list(grads_and_vars))


def optimizer_strategy(optimizer: keras.optimizers.Optimizer):
    """The strategy `optimizer` was made under (its variables' and its
    update's), or None for an optimizer of another backend."""
    return getattr(optimizer, _STRATEGY, None)


def place_optimizer(optimizer: keras.optimizers.Optimizer, strategy) -> None:
    """Moves an unbuilt `optimizer` (and the one a `LossScaleOptimizer`
    wraps) to `strategy`: its variables (step counter, learning rate)
    remade under `strategy.scope()` with their current values, the same
    `keras.Variable` objects, so every reference to them holds; its update
    then runs through `strategy`. Raises ValueError for a built one: its
    slots belong to the variables it was built for."""
    if optimizer.built:
        raise ValueError(f"{type(optimizer).__name__} is built; only an unbuilt one moves")
    chain = [optimizer]
    while hasattr(chain[-1], "inner_optimizer"):
        chain.append(chain[-1].inner_optimizer)
    for level in chain:
        if not hasattr(level, _STRATEGY):
            raise RuntimeError(
                f"{type(level).__name__} has no {_STRATEGY}: Keras changed where its TensorFlow "
                "optimizer keeps its strategy; update engine/recipe/keras_bridge.py")
    with strategy.scope():
        for variable in optimizer.variables:
            if not callable(getattr(variable, "_initialize", None)):
                raise RuntimeError(
                    "keras.Variable has no _initialize: Keras changed how a variable makes its "
                    "TensorFlow variable; update engine/recipe/keras_bridge.py")
            variable._initialize(variable.numpy())
    for level in chain:
        setattr(level, _STRATEGY, strategy)


def adam_slots(optimizer: keras.optimizers.Adam, variable) -> tuple[keras.Variable, keras.Variable]:
    """Adam's first and second moment (`m`, `v`) of `variable`."""
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def momentum_slot(optimizer: keras.optimizers.SGD, variable) -> keras.Variable:
    """SGD's momentum accumulator of `variable` (when `momentum` is set)."""
    return optimizer.momentums[optimizer._get_variable_index(variable)]


def per_example_metric_fn(metric):
    """The per-example function a stateful Keras mean metric wraps
    (`keras.metrics.MeanMetricWrapper._fn`: `SparseCategoricalAccuracy()` is
    `sparse_categorical_accuracy` averaged), or None for a metric that is not
    a mean of per-example values (AUC, Precision): the engine averages
    per-example values itself (`engine.loop.replica_sums`)."""
    if isinstance(metric, keras.metrics.MeanMetricWrapper):
        return getattr(metric, "_fn", None)
    return None


def build_compiled_metrics(model: keras.Model, y_true, y_pred) -> None:
    """Builds the metrics `model.compile(metrics=..., weighted_metrics=...)`
    made, on symbolic targets and predictions (`keras.KerasTensor`s), as
    Keras's `fit` builds them before its first epoch (`Trainer._symbolic_build`),
    so that `model.metrics` lists them (Keras's names and classes). Keras keeps
    them in the private `_compile_metrics` (a `CompileMetrics`, None when no
    metric was compiled) and builds them only in its own steps; nothing public
    builds them without running one. A model already built is left as is."""
    if not hasattr(model, "_compile_metrics"):
        raise RuntimeError(
            "keras.Model has no _compile_metrics: Keras changed where it keeps the compiled "
            "metrics; update engine/recipe/keras_bridge.py")
    compiled = model._compile_metrics
    if compiled is not None and not compiled.built:
        compiled.build(y_true, y_pred)
