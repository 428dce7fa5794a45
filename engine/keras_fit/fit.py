"""`fit`: Keras's `model.fit`, run by the engine on any strategy.

    def build_and_compile_cnn_model():          # the tutorials' own function
        model = keras.Sequential([...])
        model.compile(loss=..., optimizer=..., metrics=["accuracy"])
        return model

    history = fit(build_and_compile_cnn_model, train_dataset, epochs=3,
                  validation_data=val_dataset, callbacks=[keras.callbacks.CSVLogger("log.csv")])
    history.history["loss"]                      # one value per epoch, as Keras's History

or, as the tutorials write it, the script's own model and strategy:

    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = build_and_compile_cnn_model()
    fit(model, train_dataset, epochs=3)          # was: model.fit(train_dataset, epochs=3)

`model_fn` is called under the engine's strategy scope (the tutorials'
`with strategy.scope(): build_and_compile_cnn_model()`); a compiled model is
trained in place on the strategy it was built under, which the engine adopts
(`engine.strategies.adoption`). Its compiled
loss, metrics and optimizer run through the engine's step
(`engine.keras_fit.fit_task`); callbacks run in the engine's loop
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
- a `keras.utils.PyDataset` (`keras.utils.Sequence`): each epoch its
  `len()` batches, its hooks called as Keras's fit calls them
  (`engine.keras_fit.py_dataset`);
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

import contextlib
import dataclasses
import json
import logging
import os
import posixpath
import tempfile
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import keras
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError, NonFinite
from tfloop.engine.keras_fit import arrays
from tfloop.engine.keras_fit import callbacks as callbacks_lib
from tfloop.engine.keras_fit import epochs as epochs_lib
from tfloop.engine.keras_fit import keras_state, py_dataset
from tfloop.engine.keras_fit.fit_task import CompiledModelTask
from tfloop.engine.loop.actions import RunActions, progress_logger
from tfloop.engine.assembly.run import run
from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import devices as devices_lib
from tfloop.engine.runtime import files, logs
from tfloop.engine.strategies import adoption
from tfloop.collectives import device_names

logger = logging.getLogger(__name__)


def fit(model_fn: Union[keras.Model, Callable[[], keras.Model]], train_data: Any,
        y: Any = None, *,
        epochs: int = 1, steps_per_epoch: Optional[int] = None, validation_data: Any = None,
        validation_steps: Optional[int] = None, callbacks: Sequence[Any] = (),
        batch_size: Optional[int] = None, config: Optional[RunConfig] = None,
        verbose: Any = "auto", shuffle: bool = True, sample_weight: Any = None,
        class_weight: Optional[dict] = None, initial_epoch: int = 0, validation_freq: int = 1,
        validation_batch_size: Optional[int] = None,
        validation_split: float = 0.0) -> keras.callbacks.History:
    """Trains the model `model_fn` builds and compiles (or the compiled model
    `model_fn` is, in place, on its own strategy) on `train_data`, as
    `model.fit` would, through the engine; see the module docstring.

    `config` (`RunConfig`) says the rest: strategy, devices (by default
    those `use_devices` named), collective, `model_dir` (the same `model_dir`
    resumes, mid-epoch included; a `BackupAndRestore` callback's `backup_dir`
    is one; left at its default outside a cluster, a temporary folder removed
    when `fit` returns), checkpoints (by default at least once per epoch).
    Its epoch, batch, mode and evaluation fields are set from the arguments.
    `validation_data` (batches, the last may be partial, or a tuple of arrays)
    is evaluated at the end of every `validation_freq`-th epoch;
    `validation_steps` batches of it, or all. `train_data` may be arrays with
    `y` (and `batch_size`, `shuffle`, `sample_weight`), as for `model.fit`
    (`engine.keras_fit.arrays`), or a `keras.utils.PyDataset` (`shuffle`
    shuffles its batch order each epoch, from `RunConfig.seed`);
    `class_weight` and `initial_epoch` are Keras's. docs/keras.md lists each argument against Keras's and the
    parity test that proves it.
    `verbose`: as Keras's ("auto" and 1: a progress bar, 2: one line per
    epoch, 0: silent); with 2 (as Keras advises where nobody watches a
    terminal: a cluster, a log file) the engine's lines too (set-up, resume,
    checkpoints, an early stop) but not its per-loop progress lines; with 1
    only its warnings, which would otherwise break the bar; with 0 nothing
    is printed, the engine's lines going to Python logging only.
    A model compiled with `jit_compile=True` trains with XLA (--jit_compile);
    its `steps_per_execution` is the length of the engine's loops (batch
    callbacks once per execution, as Keras's), unless `RunConfig.steps_per_loop`
    was set.

    Called again with the same `model_dir` after it finished, it trains
    nothing (the epochs are the run's total, as Keras's `initial_epoch`
    equal to `epochs`) and returns an empty History: the documented resume.

    Returns:
      a `keras.callbacks.History`: `history.history[name]` per epoch (the
      train means and `val_<name>`), `history.epoch`, `history.model`, and
      `history.run_result`, the engine's record (`engine.assembly.run.RunResult`).

    Raises:
      ConfigError: a model, data or callback `fit` cannot take (one line).
    """
    model = _adopted(model_fn)
    adopted = adoption.adopted_placement(model.distribute_strategy) if model else None
    config = config or RunConfig()
    callbacks = callbacks_lib.check(callbacks)
    verbose = _check_epochs(epochs, initial_epoch, validation_freq, verbose)
    train_data, validation_data = _data(
        train_data, y, sample_weight, class_weight, validation_split, validation_data,
        batch_size=batch_size, validation_batch_size=validation_batch_size, shuffle=shuffle,
        seed=config.seed, steps_per_epoch=steps_per_epoch)
    steps_per_epoch_given = steps_per_epoch is not None
    global_batch, steps_per_epoch = _batch_and_epoch(train_data, steps_per_epoch, batch_size,
                                                     config)
    counting = callbacks_lib.Epochs(
        steps_per_epoch=steps_per_epoch, epochs=epochs, validates=validation_data is not None,
        validation_freq=validation_freq, initial_epoch=initial_epoch, verbose=verbose)
    backup = callbacks_lib.backup_for(callbacks)
    loops = _Loops(steps_per_loop=config.steps_per_loop if config.changed("steps_per_loop")
                   else None, steps_per_epoch_given=steps_per_epoch_given)
    config, temporary = _run_config(config, train_data, counting, global_batch=global_batch,
                                    validation_steps=validation_steps, backup=backup,
                                    adopted=adopted)
    task = CompiledModelTask(model_fn, train_data, global_batch_size=global_batch,
                             validation_data=validation_data,
                             loop_length=lambda model: loops.execution(model, steps_per_epoch))
    history = keras.callbacks.History()
    driven: list[callbacks_lib.KerasCallbacks] = []
    add_actions = _keras_actions(callbacks, history, counting, task, driven)
    level = progress_logger.level
    if verbose == 2:  # Keras's epoch lines, and the engine's other lines (set-up, resume, stop)
        progress_logger.setLevel(logging.WARNING)
    # verbose=0: silent as Keras's; the engine's lines go to Python logging only.
    with logs.to_logging_only() if verbose == 0 else contextlib.nullcontext():
        try:
            result = _run(config, task, add_actions, driven, verbose=verbose == 2,
                          strategy=model.distribute_strategy if model else None)
        finally:
            progress_logger.setLevel(level)
            if temporary is not None:  # nobody can resume it: its name was never given
                _remove_run_folder(temporary)
        return _history(history, result, task, driven, config, backup=backup,
                        temporary=temporary)


def _adopted(model_fn: Any) -> Optional[keras.Model]:
    """The script's own compiled model, when `fit` is handed one (None: a
    function that builds and compiles it, which fit calls in its scope).

    The model is trained in place, on the strategy it was built under
    (`model.distribute_strategy`: the tutorials' `with strategy.scope():
    model = ...`, or none), which the engine adopts
    (`engine.strategies.adoption`): the script's `model` is the one trained,
    and `strategy.num_replicas_in_sync` is the truth."""
    if isinstance(model_fn, keras.Model):
        if not getattr(model_fn, "compiled", False) or model_fn.optimizer is None:
            raise ConfigError(f"fit: the model {model_fn.name!r} is not compiled; call "
                              "model.compile(optimizer=..., loss=..., metrics=[...]) first")
        return model_fn
    if not callable(model_fn):
        raise ConfigError(
            f"fit: the first argument is a {type(model_fn).__name__}; give the compiled "
            "keras.Model (built under your strategy's scope, or none) or the function that "
            "builds and compiles it, e.g. tfloop.fit(model, x, y)")
    return None


def _check_epochs(epochs: Any, initial_epoch: Any, validation_freq: Any, verbose: Any) -> int:
    """Refuses epoch counts Keras would refuse; returns the verbosity as a number."""
    verbose = _verbosity(verbose)
    if not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"fit: epochs={epochs!r} must be a positive integer")
    if not isinstance(initial_epoch, int) or not 0 <= initial_epoch < epochs:
        raise ConfigError(f"fit: initial_epoch={initial_epoch!r} must be an integer from 0 to "
                          f"epochs - 1 ({epochs - 1})")
    if not isinstance(validation_freq, int) or validation_freq < 1:
        raise ConfigError(f"fit: validation_freq={validation_freq!r} must be a positive "
                          "integer (validate every that many epochs)")
    return verbose


def _data(train_data: Any, y: Any, sample_weight: Any, class_weight: Optional[dict],
          validation_split: float, validation_data: Any, *, batch_size: Optional[int],
          validation_batch_size: Optional[int], shuffle: bool, seed: int,
          steps_per_epoch: Optional[int]) -> tuple[Any, Any]:
    """The training and validation data as the engine takes them: arrays
    batched (`engine.keras_fit.arrays`), a `keras.utils.PyDataset` as a
    function of the run's context (`engine.keras_fit.py_dataset`), a
    validation split cut off, class weights applied."""
    if py_dataset.is_py_dataset(train_data):
        train_data = py_dataset.PyDatasetInput(train_data, shuffle=shuffle,
                                               steps_per_epoch=steps_per_epoch)
    if py_dataset.is_py_dataset(validation_data):
        validation_data = py_dataset.PyDatasetInput(validation_data, shuffle=False,
                                                    validation=True,
                                                    where="validation_data")
    train_data, y, sample_weight, validation_data = arrays.split_for_validation(
        train_data, y, sample_weight, validation_split, validation_data)
    train_data = arrays.training_data(train_data, y, sample_weight, batch_size=batch_size,
                                      shuffle=shuffle, seed=seed)
    train_data = arrays.class_weighted(train_data, class_weight)
    validation_data = arrays.validation_data(validation_data,
                                             batch_size=validation_batch_size or batch_size)
    return train_data, validation_data


def _run_config(config: RunConfig, train_data: Any, counting: callbacks_lib.Epochs, *,
                global_batch: int, validation_steps: Optional[int], backup: Any,
                adopted: Optional[adoption.AdoptedPlacement] = None
                ) -> tuple[RunConfig, Optional[str]]:
    """The run's config from fit's arguments (epochs, batch, mode, evaluation,
    checkpoints, devices, model_dir), and the temporary model_dir made when
    none was named (None: one was). `adopted`: the strategy of the model
    handed in, which names the strategy and devices."""
    in_cluster = bool(os.environ.get("TF_CONFIG"))
    trained_epochs = counting.epochs - counting.initial_epoch
    steps_per_epoch, freq = counting.steps_per_epoch, counting.validation_freq
    changes = dict(global_batch_size=global_batch, per_replica_batch_size=0,
                   epochs=trained_epochs, steps_per_epoch=steps_per_epoch,
                   train_steps=trained_epochs * steps_per_epoch,
                   mode="train_and_evaluate" if counting.validates else "train",
                   # Keras validates after epochs e with (e + 1) % freq == 0; the
                   # callbacks skip any other evaluation (initial_epoch off the beat).
                   eval_interval=(steps_per_epoch * (freq if counting.initial_epoch % freq == 0
                                                     else 1)) if counting.validates else 0,
                   eval_steps=validation_steps or -1, export=False, task="")
    if not config.changed("steps_per_loop"):
        # The loops end where the compiled model's steps_per_execution says
        # (`_Loops`, known once it is built), at the latest at an epoch's end.
        changes["steps_per_loop"] = steps_per_epoch
    if in_cluster and isinstance(train_data, tf.data.Dataset) and _has_peers() and (
            adopted is None or adopted.strategy != "multi_worker"):
        raise ConfigError(
            "fit in a cluster: give train_data as a function, e.g. lambda context: "
            "mnist_dataset(batch), with batch_size=: a dataset made before fit has started "
            "TensorFlow, and a multi-worker strategy must set up its collectives first")
    if adopted is not None:  # the model's own strategy: its name and devices, nothing else
        adoption.check_agrees(adopted, strategy=config.strategy, devices=config.devices,
                              strategy_given=config.changed("strategy"),
                              devices_given=config.changed("devices"))
        changes.update(strategy=adopted.strategy, devices=adopted.devices)
    elif in_cluster and not config.changed("strategy") and _has_peers():
        changes["strategy"] = "multi_worker"  # the tutorial's MultiWorkerMirroredStrategy
    if (changes.get("strategy", config.strategy) == "parameter_server"
            and isinstance(train_data, py_dataset.PyDatasetInput)):
        raise ConfigError("fit: a PyDataset under parameter_server: its workers run the input "
                          "pipeline as a graph, where this process's Python cannot run; give "
                          "train_data as a function (InputContext) -> tf.data.Dataset")
    changes.update(_checkpoints(config, backup, steps_per_epoch))
    if adopted is None and not config.changed("devices") and devices_lib.chosen():
        changes["devices"] = devices_lib.chosen()  # tfloop.use_devices(...)
    if not in_cluster and adopted is None:
        _check_devices_in_time(changes.get("devices", config.devices))
    temporary = None
    if not config.changed("model_dir") and "model_dir" not in changes:
        if in_cluster:
            raise ConfigError("fit in a cluster needs config=RunConfig(model_dir=...), one "
                              "directory every worker names alike")
        temporary = changes["model_dir"] = tempfile.mkdtemp(prefix="tfloop-fit-")
    return dataclasses.replace(config, **changes), temporary


@dataclasses.dataclass(frozen=True)
class _Loops:
    """What decides the length of the engine's loops, as `fit` was called:
    `RunConfig.steps_per_loop` when the user set it (None: not set), and
    whether `steps_per_epoch` was given (not a finite dataset's own pass)."""

    steps_per_loop: Optional[int]
    steps_per_epoch_given: bool

    def execution(self, model: keras.Model, steps_per_epoch: int) -> Optional[int]:
        """The steps of one loop as the compiled model's `steps_per_execution`
        says (Keras's 1 by default: batch callbacks every batch, as Keras's
        `fit`), or None where `RunConfig.steps_per_loop` says it; a conflict
        of the two, and an epoch that is not whole executions of a stream,
        are refused in one line."""
        per_execution = getattr(model, "steps_per_execution", 1) or 1
        if not isinstance(per_execution, int) or per_execution < 1:
            raise ConfigError(f"fit: compile(steps_per_execution={per_execution!r}) must be a "
                              "positive integer")
        if self.steps_per_loop is not None:
            if per_execution not in (1, self.steps_per_loop):
                raise ConfigError(
                    f"fit: compile(steps_per_execution={per_execution}) and "
                    f"RunConfig(steps_per_loop={self.steps_per_loop}) both set the steps of one "
                    "loop (one batch-callback call each); give one")
            return per_execution if per_execution > 1 else None
        if self.steps_per_epoch_given and steps_per_epoch % per_execution:
            # Keras runs whole executions from a stream: ceil(5 / 4) * 4 = 8
            # steps in an epoch of steps_per_epoch=5 (measured, Keras 3.15).
            raise ConfigError(
                f"fit: steps_per_epoch={steps_per_epoch} is not a multiple of "
                f"compile(steps_per_execution={per_execution}); Keras's fit would train "
                f"{-(-steps_per_epoch // per_execution) * per_execution} steps per epoch "
                "(whole executions); give a multiple")
        return per_execution


def _keras_actions(callbacks: Sequence[Any], history: keras.callbacks.History,
                   counting: callbacks_lib.Epochs, task: CompiledModelTask,
                   driven: list) -> Callable[..., RunActions]:
    """`run`'s `add_actions`: the Keras callbacks driven by two actions, made
    once the model is built (and kept in `driven`, for what fit does after),
    the compiled metrics they may read built with the model, as Keras's `fit`
    builds them (`keras_state`), and the loops as long as its
    `steps_per_execution` (`_Loops`, decided when the task built the model)."""
    def add_actions(*, plan, strategy, model) -> RunActions:
        counted = dataclasses.replace(counting, steps_per_execution=task.steps_per_execution)
        keras_callbacks = callbacks_lib.KerasCallbacks(
            # History last, as in Keras: it records what callbacks add to the logs.
            [*callbacks, history], model=model, epochs=counted, is_chief=plan.role.is_chief,
            strategy=strategy if plan.spec.agrees_to_stop else None,
            task=callbacks_lib.TaskLogs(to_logs=task.keras_logs, val_logs=task.val_logs,
                                        reset_metrics=task.reset_metrics,
                                        epoch_state=task.epoch_state),
            model_dir=plan.config.model_dir)
        driven.append(keras_callbacks)
        return RunActions(train=[keras_callbacks.train_action],
                          eval=[keras_callbacks.eval_action])
    return add_actions


def _history(history: keras.callbacks.History, result: Any, task: CompiledModelTask,
             driven: list, config: RunConfig, *, backup: Any,
             temporary: Optional[str]) -> keras.callbacks.History:
    """What fit returns once the run ended: the callbacks told training
    ended, the History with the model and the record, and the backup
    removed as Keras removes it after training. As Keras's `fit`, the
    optimizer finalizes the weights before `on_train_end` (`keras_state`)."""
    if task.model is not None:
        keras_state.finalize(task.model)
    if driven:
        driven[0].train_end()
    history.run_result = result
    if history.model is None:
        history.set_model(getattr(result, "model", None) or task.model)
    chief = driven[0].is_chief if driven else True
    if backup is not None and backup.delete_checkpoint and _finished(result) and chief:
        _remove_run_folder(config.model_dir)  # as Keras deletes its backup after training
    elif temporary is None:
        logger.info("fit: checkpoints, summaries and metrics.json are in %s", config.model_dir)
    return history


def _run(config: RunConfig, task: CompiledModelTask, add_actions, driven, *,
         verbose: bool, strategy: Optional[tf.distribute.Strategy] = None) -> Any:
    """`run`; a loss that is not finite while a callback such as TerminateOnNaN
    wants to see it ends training the Keras way (`KerasCallbacks.stopped_by_non_finite`):
    the History has the epoch, `fit` returns; the record is metrics.json's
    (`status` "failed", the newest checkpoint the last finite one)."""
    try:
        return run(config, task=task, add_actions=add_actions, verbose=verbose,
                   strategy=strategy)
    except NonFinite as error:
        loop = getattr(error, "loop", None)
        if not (driven and loop and driven[0].stopped_by_non_finite(*loop)):
            raise
        logger.warning("fit: %s", error)
        return layout.read_json(layout.RunDir(config.model_dir).metrics_json) or {}


def _finished(result: Any) -> bool:
    return isinstance(result, Mapping) and result.get("status") in ("finished", "stopped_early")


def _verbosity(verbose: Any) -> int:
    """Keras's `verbose`: "auto" is 1; True/False (this function's older form) 1/0."""
    if verbose == "auto" or verbose is True:
        return 1
    if verbose is False or verbose in (0, 1, 2):
        return int(verbose)
    raise ConfigError(f"fit: verbose={verbose!r} must be \"auto\", 0, 1 or 2, as for Keras")


def _checkpoints(config: RunConfig, backup: Any, steps_per_epoch: int) -> dict:
    """`model_dir` and `checkpoint_interval` from a BackupAndRestore callback
    (its `backup_dir`, its `save_freq`), else at least once per epoch: a
    short fit killed after an epoch does not start again from step 0."""
    changes: dict = {}
    if backup is not None:
        if config.changed("model_dir") and (os.path.abspath(config.model_dir)
                                            != os.path.abspath(backup.backup_dir)):
            raise ConfigError(
                f"fit: BackupAndRestore(backup_dir={backup.backup_dir!r}) and "
                f"RunConfig(model_dir={config.model_dir!r}) name two places to resume from; "
                "give one (the backup_dir is the run's model_dir)")
        changes["model_dir"] = backup.backup_dir
        save_freq = backup.save_freq
        if save_freq is False:
            raise ConfigError("fit: BackupAndRestore(save_freq=False) saves nothing to resume "
                              "from; give save_freq=\"epoch\" or a number of steps")
        if not config.changed("checkpoint_interval"):
            changes["checkpoint_interval"] = (steps_per_epoch if save_freq == "epoch"
                                              else int(save_freq))
    if "checkpoint_interval" not in changes and not config.changed("checkpoint_interval"):
        changes["checkpoint_interval"] = min(config.checkpoint_interval, steps_per_epoch)
    return changes


def _check_devices_in_time(devices: str) -> None:
    """Logical CPU devices exist only if set before TensorFlow starts: a fit
    whose dataset was made first says so in one line, naming the call that
    comes in time."""
    cpu_ids = [device_names.index(name) for name in devices_lib.parse_devices(devices)
               if device_names.kind(name) == "cpu"] if devices else []
    try:
        if cpu_ids:
            devices_lib.ensure_logical_cpus(max(cpu_ids) + 1)
    except ConfigError:
        raise ConfigError(
            f"fit: devices={devices!r} came after TensorFlow started with fewer devices (a "
            f"dataset built before fit starts it); call tfloop.use_devices({devices!r}) at the "
            "top of the script, before anything else uses TensorFlow") from None


def _remove_run_folder(path: str) -> None:
    """Removes a run folder `fit` made or was told to remove, through the
    engine's one remover (`runtime.files`): a link is unlinked, never followed."""
    parent = posixpath.dirname(path.rstrip("/")) if "://" in path else os.path.dirname(
        os.path.abspath(path))
    files.remove_quietly(path, within=parent)


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
    if isinstance(train_data, py_dataset.PyDatasetInput):
        if batch_size is not None and batch_size != train_data.batch_size:
            raise ConfigError(f"fit: batch_size={batch_size} but the PyDataset's batches hold "
                              f"{train_data.batch_size}; a PyDataset makes its own batches")
        return train_data.batch_size, steps_per_epoch or train_data.num_batches
    if callable(train_data):
        if steps_per_epoch is None:
            raise ConfigError("fit: with a function for train_data give steps_per_epoch=, "
                              "the steps of one epoch")
        return batch_size or config.global_batch_size, steps_per_epoch
    raise ConfigError(f"fit: train_data is {type(train_data).__name__}; give a batched "
                      "tf.data.Dataset (dataset.batch(n)), a keras.utils.PyDataset or a "
                      "function (InputContext) -> dataset")
