"""`fit`: Keras's `model.fit`, run by the engine on any strategy.

    def build_and_compile_cnn_model():          # the tutorials' own function
        model = keras.Sequential([...])
        model.compile(loss=..., optimizer=..., metrics=["accuracy"])
        return model

    history = fit(build_and_compile_cnn_model, train_dataset, epochs=3,
                  validation_data=val_dataset, callbacks=[keras.callbacks.CSVLogger("log.csv")])
    history.history["loss"]                      # one value per epoch, as Keras's History

`model_fn` is called under the engine's strategy scope (the tutorials'
`with strategy.scope(): build_and_compile_cnn_model()`), and its compiled
loss, metrics and optimizer run through the engine's step
(`engine.keras_fit.compiled`); callbacks run in the engine's loop
(`engine.keras_fit.callbacks`). How the training data is given:

- a batched `tf.data.Dataset` of (x, y) or (x, y, sample_weight), finite with
  a known size: each epoch is one pass over it (its batches, the last partial
  one trained as `fit` trains it: `engine.keras_fit.epochs`), and the global
  batch is its batch size; `steps_per_epoch` cuts epochs of that many steps
  instead (the passes then run on across epochs);
- an endless one (`.repeat()`, as the multi-worker tutorial writes it), with
  `steps_per_epoch` (required);
- NumPy arrays `x, y` (a tuple or dict of them for several inputs), with
  `batch_size` (32 when not given), as `model.fit(x, y)` takes them;
- a function `(InputContext) -> dataset` of global batches of
  `context.global_batch_size` (= `batch_size=`, else `config.global_batch_size`),
  built once per input pipeline, with `steps_per_epoch`. In a cluster this is
  the only form: a dataset made before `fit` has started TensorFlow, and a
  multi-worker strategy must set up its collectives before that (the
  tutorial makes its strategy before its dataset for the same reason).

In a cluster (`TF_CONFIG`, e.g. under `bin/launch`) every worker feeds the
whole global batch and the engine shards it (`--auto_shard_policy=data`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.keras_fit import arrays
from tfloop.engine.keras_fit import callbacks as callbacks_lib
from tfloop.engine.keras_fit import epochs as epochs_lib
from tfloop.engine.keras_fit.compiled import CompiledModelTask
from tfloop.engine.loop.actions import RunActions
from tfloop.engine.run import run

logger = logging.getLogger(__name__)


def fit(model_fn: Callable[[], keras.Model], train_data: Any, y: Any = None, *,
        epochs: int = 1, steps_per_epoch: Optional[int] = None, validation_data: Any = None,
        validation_steps: Optional[int] = None, callbacks: Sequence[Any] = (),
        batch_size: Optional[int] = None, config: Optional[RunConfig] = None,
        verbose: bool = True, shuffle: bool = True, sample_weight: Any = None,
        class_weight: Optional[dict] = None, initial_epoch: int = 0, validation_freq: int = 1,
        validation_batch_size: Optional[int] = None,
        validation_split: float = 0.0) -> keras.callbacks.History:
    """Trains the model `model_fn` builds and compiles on `train_data`, as
    `model.fit` would, through the engine; see the module docstring.

    `config` (`RunConfig`) says the rest: strategy, devices, collective,
    `model_dir` (a new temporary one when left at its default outside a
    cluster; the same `model_dir` resumes, mid-epoch included), checkpoints.
    Its epoch, batch, mode and evaluation fields are set from the arguments.
    `validation_data` (batches, the last may be partial, or a tuple of arrays)
    is evaluated at the end of every `validation_freq`-th epoch;
    `validation_steps` batches of it, or all. `train_data` may be arrays with
    `y` (and `batch_size`, `shuffle`, `sample_weight`), as for `model.fit`
    (`engine.keras_fit.arrays`); `class_weight` and `initial_epoch` are
    Keras's. docs/keras.md lists each argument against Keras's and the
    parity test that proves it.

    Returns:
      a `keras.callbacks.History`: `history.history[name]` per epoch (the
      train means and `val_<name>`), `history.epoch`, `history.model`, and
      `history.run_result`, the engine's record (`engine.run.RunResult`).

    Raises:
      ConfigError: a model, data or callback `fit` cannot take (one line).
    """
    config = config or RunConfig()
    callbacks = callbacks_lib.check(callbacks)
    if not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"fit: epochs={epochs!r} must be a positive integer")
    if not isinstance(initial_epoch, int) or not 0 <= initial_epoch < epochs:
        raise ConfigError(f"fit: initial_epoch={initial_epoch!r} must be an integer from 0 to "
                          f"epochs - 1 ({epochs - 1})")
    if not isinstance(validation_freq, int) or validation_freq < 1:
        raise ConfigError(f"fit: validation_freq={validation_freq!r} must be a positive "
                          "integer (validate every that many epochs)")
    seed = config.seed
    train_data, y, sample_weight, validation_data = arrays.split_for_validation(
        train_data, y, sample_weight, validation_split, validation_data)
    train_data = arrays.training_data(train_data, y, sample_weight, batch_size=batch_size,
                                      shuffle=shuffle, seed=seed)
    train_data = arrays.class_weighted(train_data, class_weight)
    validation_data = arrays.validation_data(validation_data,
                                             batch_size=validation_batch_size or batch_size)
    global_batch, steps_per_epoch = _batch_and_epoch(train_data, steps_per_epoch, batch_size,
                                                     config)
    in_cluster = bool(os.environ.get("TF_CONFIG"))
    validates = validation_data is not None
    trained_epochs = epochs - initial_epoch
    changes = dict(global_batch_size=global_batch, per_replica_batch_size=0,
                   epochs=trained_epochs, steps_per_epoch=steps_per_epoch,
                   train_steps=trained_epochs * steps_per_epoch,
                   mode="train_and_evaluate" if validates else "train",
                   # Keras validates after epochs e with (e + 1) % freq == 0; the
                   # callbacks skip any other evaluation (initial_epoch off the beat).
                   eval_interval=(steps_per_epoch * (validation_freq
                                                     if initial_epoch % validation_freq == 0
                                                     else 1)) if validates else 0,
                   eval_steps=validation_steps or -1, export=False, task="")
    if in_cluster and isinstance(train_data, tf.data.Dataset) and _has_peers():
        raise ConfigError(
            "fit in a cluster: give train_data as a function, e.g. lambda context: "
            "mnist_dataset(batch), with batch_size=: a dataset made before fit has started "
            "TensorFlow, and a multi-worker strategy must set up its collectives first")
    if in_cluster and not config.changed("strategy") and _has_peers():
        changes["strategy"] = "multi_worker"  # the tutorial's MultiWorkerMirroredStrategy
    if not config.changed("model_dir"):
        if in_cluster:
            raise ConfigError("fit in a cluster needs config=RunConfig(model_dir=...), one "
                              "directory every worker names alike")
        changes["model_dir"] = tempfile.mkdtemp(prefix="tfloop-fit-")
    config = dataclasses.replace(config, **changes)
    task = CompiledModelTask(model_fn, train_data, global_batch_size=global_batch,
                             validation_data=validation_data)
    history = keras.callbacks.History()
    driven: list[callbacks_lib.KerasCallbacks] = []

    def add_actions(*, plan, strategy, model) -> RunActions:
        keras_callbacks = callbacks_lib.KerasCallbacks(
            # History last, as in Keras: it records what callbacks add to the logs.
            [*callbacks, history], model=model, steps_per_epoch=steps_per_epoch, epochs=epochs,
            validates=validates, validation_freq=validation_freq, initial_epoch=initial_epoch,
            is_chief=plan.role.is_chief,
            strategy=strategy if plan.spec.agrees_to_stop else None, to_logs=task.keras_logs)
        driven.append(keras_callbacks)
        return RunActions(train=[keras_callbacks.train_action],
                          eval=[keras_callbacks.eval_action])

    result = run(config, task=task, add_actions=add_actions, verbose=verbose)
    if driven:
        driven[0].train_end()
    history.run_result = result
    if history.model is None:
        history.set_model(result.model)
    logger.info("fit: checkpoints, summaries and metrics.json are in %s", config.model_dir)
    return history


def _has_peers() -> bool:
    """Whether TF_CONFIG names more than one task (a real cluster)."""
    try:
        cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
    except (ValueError, AttributeError, RecursionError):
        return False  # the engine's plan says what is wrong with it
    return sum(len(tasks) for tasks in cluster.values()) > 1


def _batch_and_epoch(train_data: Any, steps_per_epoch: Optional[int],
                     batch_size: Optional[int], config: RunConfig) -> tuple[int, int]:
    """The global batch and the steps of one epoch, from the data as given."""
    if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int)
                                        or steps_per_epoch < 1):
        raise ConfigError(f"fit: steps_per_epoch={steps_per_epoch!r} must be a positive integer")
    if isinstance(train_data, tf.data.Dataset):
        global_batch = epochs_lib.batch_size_of(train_data)
        if batch_size is not None and batch_size != global_batch:
            raise ConfigError(f"fit: batch_size={batch_size} but the training data's batches "
                              f"hold {global_batch}; batch the dataset with the size you mean")
        one_pass = epochs_lib.steps_in_one_pass(train_data)
        if one_pass is None and steps_per_epoch is None:
            raise ConfigError("fit: the training data never ends (.repeat()), so give "
                              "steps_per_epoch=, the steps of one epoch")
        return global_batch, steps_per_epoch or one_pass
    if callable(train_data):
        if steps_per_epoch is None:
            raise ConfigError("fit: with a function for train_data give steps_per_epoch=, "
                              "the steps of one epoch")
        return batch_size or config.global_batch_size, steps_per_epoch
    raise ConfigError(f"fit: train_data is {type(train_data).__name__}; give a batched "
                      "tf.data.Dataset (dataset.batch(n)) or a function (InputContext) -> "
                      "dataset")
