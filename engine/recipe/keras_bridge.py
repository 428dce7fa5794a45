"""The one place the engine reaches into Keras internals. Six reasons:

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
   a `MeanMetricWrapper` keeps the function it averages in the private `_fn`,
   and that function's arguments (`SparseTopKCategoricalAccuracy(k=2)`'s
   `k`) in the private `_fn_kwargs`.
4. A compiled model's state, built before training as Keras's `fit` builds
   it (`engine.keras_fit.keras_state`): Keras's private
   `Trainer._symbolic_build` builds the compiled metrics, the compiled loss
   and the optimizer on a symbolic batch, and nothing public does;
   callbacks read `model.metrics`, and the engine updates those very metric
   objects, which Keras keeps in the private `_compile_metrics` (one list per
   argument, `metrics=` and `weighted_metrics=`) and `_loss_tracker`.
5. A model's own `train_step` (`engine.keras_fit.steps`) applies its update
   with `self.optimizer.apply(...)`, whose only place for the engine's
   all-reduce is the hook of reason 1: `reducing_gradients` puts the run's
   collective there while the step is traced.
6. An optimizer made outside the run's strategy scope (`run(optimizer=...)`,
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

import contextlib
import functools
from typing import Callable, Iterator

import keras

_HOOK = "_all_reduce_sum_gradients"
_STRATEGY = "_distribution_strategy"


def _innermost(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    # A LossScaleOptimizer delegates the update (and so the reduction) inward.
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _hooked(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that owns the reduction hook, checked to still have it."""
    target = _innermost(optimizer)
    if not callable(getattr(type(target), _HOOK, None)):
        raise RuntimeError(
            f"{type(target).__name__} has no {_HOOK}: Keras changed how its TensorFlow "
            "optimizer reduces gradients; update engine/recipe/keras_bridge.py"
        )
    return target


def disable_implicit_gradient_reduction(optimizer: keras.optimizers.Optimizer) -> None:
    """Makes `optimizer.apply_gradients` apply gradients exactly as given."""
    setattr(_hooked(optimizer), _HOOK, lambda grads_and_vars: list(grads_and_vars))


def restore_implicit_gradient_reduction(optimizer: keras.optimizers.Optimizer) -> None:
    """Undoes `disable_implicit_gradient_reduction` when a run ends: the
    optimizer is the user's (a compiled model's, `run(optimizer=)`'s), and
    Keras's own `model.fit` under a strategy afterwards must reduce the
    replicas' gradients again, or it would apply one replica's alone."""
    vars(_hooked(optimizer)).pop(_HOOK, None)


@contextlib.contextmanager
def reducing_gradients(optimizer: keras.optimizers.Optimizer,
                       all_reduce: Callable[[list, list], list]) -> Iterator[None]:
    """While it is open, `optimizer.apply(...)` (and `apply_gradients`)
    reduces its gradients with `all_reduce(gradients, variables)` (the
    replica's gradients, None left out, and their variables; it returns the
    sums), where Keras would reduce them with the strategy's own all-reduce:
    Keras clips (`clipnorm`) before this point, as Keras's `fit` does. For
    the trace of a model's own `train_step`; the hook before it is put back
    after."""
    target = _hooked(optimizer)
    before = vars(target).get(_HOOK)
    setattr(target, _HOOK, functools.partial(_reduce_present, all_reduce))
    try:
        yield
    finally:
        if before is None:
            delattr(target, _HOOK)
        else:
            setattr(target, _HOOK, before)


def _reduce_present(all_reduce: Callable, grads_and_vars) -> list:
    """`all_reduce` of the gradients that are not None, Nones kept in place
    (Keras's own hook skips them alike)."""
    pairs = list(grads_and_vars)
    present = [i for i, (grad, _) in enumerate(pairs) if grad is not None]
    if not present:
        return pairs
    reduced = all_reduce([pairs[i][0] for i in present], [pairs[i][1] for i in present])
    out = list(pairs)
    for i, grad in zip(present, reduced):
        out[i] = (grad, pairs[i][1])
    return out


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
    """The per-example function a stateful Keras mean metric wraps, with the
    arguments it was given (`keras.metrics.MeanMetricWrapper._fn` and
    `_fn_kwargs`: `SparseTopKCategoricalAccuracy(k=2)` is
    `sparse_top_k_categorical_accuracy(..., k=2)` averaged), or None for a
    metric that is not a mean of per-example values (AUC, Precision): the
    engine averages per-example values itself (`engine.loop.replica_sums`),
    and the metric object computes the others (`engine.task.compiled_model`)."""
    if not isinstance(metric, keras.metrics.MeanMetricWrapper):
        return None
    fn = getattr(metric, "_fn", None)
    kwargs = getattr(metric, "_fn_kwargs", None)
    if fn is None or kwargs is None:
        raise RuntimeError(
            "keras.metrics.MeanMetricWrapper has no _fn or _fn_kwargs: Keras changed where a "
            "mean metric keeps its function; update engine/recipe/keras_bridge.py")
    return functools.partial(fn, **kwargs) if kwargs else fn


def symbolic_build(model: keras.Model, data_batch) -> None:
    """Builds what Keras's `fit` builds before its first epoch
    (`Trainer._symbolic_build`: the model, the compiled metrics, the
    compiled loss and the optimizer) on `data_batch`, a Keras-style
    `(x, y[, sample_weight])` of symbolic tensors (`keras.KerasTensor`s),
    so that `model.metrics` lists Keras's metrics (names, classes) and their
    variables exist before any step is traced. What is built already is
    left as is."""
    build = getattr(model, "_symbolic_build", None)
    if not callable(build) or not hasattr(model, "_compile_metrics"):
        raise RuntimeError(
            "keras.Model has no _symbolic_build or _compile_metrics: Keras changed how fit "
            "builds a compiled model; update engine/recipe/keras_bridge.py")
    build(data_batch=data_batch)


def compiled_metric_objects(model: keras.Model) -> tuple[list, list]:
    """The metric objects Keras built for `compile(metrics=...)` and for
    `compile(weighted_metrics=...)` (a model of one output), in the order
    given: what Keras's `compute_metrics` updates. Empty lists before
    `symbolic_build` or without metrics."""
    compiled = getattr(model, "_compile_metrics", None)
    if compiled is None or not getattr(compiled, "built", False):
        return [], []
    lists = []
    for flat in (compiled._flat_metrics, compiled._flat_weighted_metrics):
        lists.append([metric for group in flat if group is not None
                      for metric in group.metrics])
    return lists[0], lists[1]


def loss_tracker(model: keras.Model):
    """Keras's `Mean(name="loss")` of a compiled model (the first of
    `model.metrics`), which Keras's own `train_step` updates; None when the
    model was not compiled."""
    return getattr(model, "_loss_tracker", None)
