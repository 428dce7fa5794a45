"""Keras's own state around `fit`: what Keras's `fit` builds before the first
epoch and does after the last, so that callbacks find what they find there.

- **Before `on_train_begin`** Keras's `fit` builds its compiled metrics on the
  first batch (`Trainer._symbolic_build`): `model.metrics` lists them then, and
  a `mode="auto"` monitor (EarlyStopping, ModelCheckpoint, ReduceLROnPlateau)
  finds a metric's direction there (`val_accuracy`: "max"); unbuilt, it raises
  "isn't able to automatically determine whether that metric should be
  maximized or minimized" after the first epoch. The engine computes the
  metrics' values itself (`engine.task.compiled_model`), so only the objects
  must exist: `build_compiled_metrics` builds them from the data's element
  spec and the model's output spec, symbolically (nothing runs, nothing is
  updated), under the strategy's scope as Keras does. They are not in the
  checkpoints (Keras does not track them). The optimizer's variables exist
  already: the engine builds the optimizer with the model
  (`engine.recipe.objectives`).
- **After the last epoch, before `on_train_end`** Keras's `fit` calls
  `optimizer.finalize_variable_values(model.trainable_weights)` (`finalize`):
  with `use_ema=True` it copies the optimizer's moving average into the
  weights. The engine's own `--ema_decay` average never enters the weights
  (it is swapped in for evaluation and export only), so one average is
  applied, once; the run's checkpoints keep the weights as trained (and the
  average, in the optimizer), so a resumed run trains on from them.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfloop.engine.keras_fit import epochs
from tfloop.engine.recipe import keras_bridge


def build_compiled_metrics(model: keras.Model, element_spec: Any, strategy: Any) -> None:
    """Builds `model`'s compiled metrics for batches of `element_spec` (the
    user's `(x, y)` or `(x, y, sample_weight)`; None: unknown, nothing built)
    under `strategy`'s scope, as Keras's `fit` builds them before training."""
    if element_spec is None:
        return
    x, y, _ = epochs.split_element(element_spec)
    with strategy.scope():
        y_pred = model.compute_output_spec(tf.nest.map_structure(_symbolic, x))
        keras_bridge.build_compiled_metrics(model, tf.nest.map_structure(_symbolic, y), y_pred)


def _symbolic(spec: Any) -> keras.KerasTensor:
    """A Keras symbolic tensor of a `tf.data` element's spec."""
    return keras.KerasTensor(tuple(spec.shape.as_list()), dtype=spec.dtype.name,
                             sparse=isinstance(spec, tf.SparseTensorSpec),
                             ragged=isinstance(spec, tf.RaggedTensorSpec))


def finalize(model: Any) -> None:
    """Keras's `fit`'s last act before `on_train_end`:
    `optimizer.finalize_variable_values(model.trainable_weights)`."""
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer.finalize_variable_values(model.trainable_weights)
