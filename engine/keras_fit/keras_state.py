"""Keras's own state around `fit`: what Keras's `fit` builds before the first
epoch and does after the last, so that callbacks find what they find there.

- **Before `on_train_begin`** Keras's `fit` builds its compiled metrics,
  compiled loss and optimizer on the first batch (`Trainer._symbolic_build`):
  `model.metrics` lists the metrics then, and a `mode="auto"` monitor
  (EarlyStopping, ModelCheckpoint, ReduceLROnPlateau) finds a metric's
  direction there (`val_accuracy`: "max"); unbuilt, it raises "isn't able to
  automatically determine whether that metric should be maximized or
  minimized" after the first epoch. `symbolic_build` calls that same method
  (through `engine.recipe.keras_bridge`) from the data's element spec,
  symbolically (nothing runs, nothing is updated), under the strategy's scope
  as Keras does, when `fit`'s task builds the model: the metric objects'
  variables (SyncOnRead, summed over replicas when read, as Keras makes them)
  must exist before the engine traces a step that updates them
  (`engine.task.compiled_model`, `engine.keras_fit.steps`), and before the
  run's checkpoint is made, which holds them (`CompiledModelTask.checkpointed`;
  Keras's own checkpoints do not).
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

from tfloop.engine.recipe import keras_bridge


def symbolic_build(model: keras.Model, element_spec: Any, strategy: Any) -> None:
    """Builds `model`'s compiled metrics, loss and optimizer for batches of
    `element_spec` (the user's `(x, y)` or `(x, y, sample_weight)`) under
    `strategy`'s scope, as Keras's `fit` builds them before training."""
    with strategy.scope():
        keras_bridge.symbolic_build(model, tf.nest.map_structure(_symbolic, element_spec))


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
