"""Checkpoints through `tf.train.CheckpointManager`: `ckpt-<step>` in `model_dir`.

What is saved is the model, the optimizer (its slots and iteration count) and
the global step. Every model variable is also listed under a flat, ordered
name, `model_weights/<index>_<name>` (`model_weights/000_kernel`, ...): a
checkpoint names each variable by its shortest path (ties: the attribute that
sorts first), which would otherwise be the optimizer's
(`optimizer/_trainable_variables/0`); this makes the names depend on the model
alone, and `tf.train.load_checkpoint` reads two
runs' checkpoints variable by variable.

Which checkpoint a run resumes from (the newest that reads) is
`engine.run_dir.checkpoint_files`'s business. A save that fails (a full disk) is a
`RunFailure` naming the directory and its free space; the manager updates
its state file only after a complete write, so the previous checkpoint stays
the latest.
"""

from __future__ import annotations

import collections
import glob
import logging
import os
import posixpath
import tempfile
from typing import Any, Optional

import tensorflow as tf

from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import disk, files
from tfloop.engine.errors import ConfigError, RunFailure, one_line

logger = logging.getLogger(__name__)

#: Where a checkpoint keeps the weights' moving averages (`engine.recipe.ema`).
AVERAGES = "ema"


def named_weights(model: Any) -> dict[str, tf.Variable]:
    """`{"000_kernel": variable, ...}` in the model's variable order."""
    variables = getattr(model, "variables", None) or model.trainable_variables
    return {
        f"{index:03d}_{variable.name.split('/')[-1].split(':')[0]}": variable
        for index, variable in enumerate(variables)
    }


def parts(model: Any, optimizer: Any, global_step: tf.Variable) -> dict:
    """What every training checkpoint holds, by attribute name; a run that
    starts keeping averages restores an older checkpoint through these alone."""
    return dict(model=model, optimizer=optimizer, global_step=global_step,
                model_weights=named_weights(model))


#: The run's checkpoint manager, TensorFlow's own: who hears of a new
#: checkpoint is the Controller's business (`Action.saved`), not the manager's.
Manager = tf.train.CheckpointManager


def create(
    *, model: Any, optimizer: Any, global_step: tf.Variable, directory: Optional[str],
    max_to_keep: int, averages: Optional[dict] = None, extra: Optional[dict] = None,
) -> tuple[tf.train.Checkpoint, Optional[Manager]]:
    """The run's checkpoint and its manager (None without a `directory`: a
    run that only reads); `averages`: the weights' moving averages by
    `named_weights` key (`engine.recipe.ema`), saved under `ema/`; `extra`:
    the task's own trackables by name (`Task.checkpointed`)."""
    extra = dict(extra or {})
    if averages is not None:
        extra[AVERAGES] = averages
    checkpoint = tf.train.Checkpoint(**parts(model, optimizer, global_step), **extra)
    if directory is None:
        return checkpoint, None
    manager = Manager(checkpoint, directory=directory, max_to_keep=max_to_keep,
                      step_counter=global_step)
    return checkpoint, manager


def save(manager: Optional[tf.train.CheckpointManager], step: int) -> Optional[str]:
    """Saves `ckpt-<step>` unless one exists for this step already.

    Several parties may ask for the same step (a checkpoint boundary that is
    also the last step, a stop request on a boundary); the second ask costs
    nothing. Without a manager nothing is saved and the answer is None.
    """
    if manager is None:
        return None
    latest = manager.latest_checkpoint
    if latest and latest.endswith(f"-{step}"):
        return latest
    try:
        path = manager.save(checkpoint_number=step, check_interval=False)
    except (tf.errors.OpError, OSError) as error:
        _remove_partial_save(manager.directory, step)
        raise SaveFailure(manager.directory, step, latest, error) from None
    logger.info("saved checkpoint %s", path)
    return path


class SaveFailure(RunFailure):
    """A save that failed (a full disk): the one line says where, why, the
    free space, what is still there and what to do; `reason` (a few words)
    and `free` are kept apart for a caller that words it otherwise (a local
    save, after which training goes on: `engine.run_dir.local_checkpoints`)."""

    def __init__(self, directory: str, step: int, latest: Optional[str], error: Exception):
        self.free = disk.free_there(directory)
        self.reason = one_line(
            (str(error) or type(error).__name__).replace(directory.rstrip("/") + "/", ""), 100)
        super().__init__(
            f"could not save ckpt-{step} in {directory} ({self.reason}); {self.free}; the latest "
            f"checkpoint is still {posixpath.basename(latest) if latest else 'none'}: "
            f"{disk.advice(error, directory, self.reason)} and run the same command to resume "
            "from it")


def _remove_partial_save(directory: str, step: int) -> None:
    """What a failed save of `step` left: TensorFlow's `ckpt-<step>_temp/`
    and any `ckpt-<step>.*` file it had moved into place (the state file
    does not name them: it is written last)."""
    prefix = layout.RunDir(directory).checkpoint(step)
    try:
        found = tf.io.gfile.glob(prefix + ".*")
    except (tf.errors.OpError, OSError):
        found = []
    for path in [*found, layout.RunDir(directory).checkpoint_temp(step)]:
        # Best effort: start-up moves a damaged leftover aside anyway.
        files.remove_quietly(path, within=directory)


def stored_names(path: str) -> list[str]:
    """The keys checkpoint `path` (a `ckpt-N` prefix) holds.

    Through `NewCheckpointReader` on the prefix itself: `tf.train.list_variables`
    first asks whether the path is a directory, which TensorFlow's `ram://`
    filesystem answers yes for any prefix, and then fails to find a
    `checkpoint` file inside it.
    """
    return list(tf.compat.v1.train.NewCheckpointReader(path).get_variable_to_shape_map())


def holds(path: Optional[str], name: str) -> bool:
    """Whether checkpoint `path` has anything saved under the attribute `name`."""
    if not path:
        return False
    return any(key.split("/")[0] == name for key in stored_names(path))


def weight_keys(path: str, reader: Any) -> Optional[dict[str, str]]:
    """`{"000_kernel": its checkpoint key, ...}` of the `model_weights` listing of
    checkpoint `path` (`reader` reads it); None if it has none.

    The key is mostly `model_weights/000_kernel/.ATTRIBUTES/VARIABLE_VALUE`,
    but a checkpoint stores each variable once, under its shortest path from
    the root: one set on the model itself (`self.scale = self.add_weight(...)`)
    is `model/scale/...`. The same breadth-first walk over the object graph
    (public `tf.train.CheckpointView`, children in the order it lists them)
    finds that path.
    """
    view = tf.train.CheckpointView(path)
    listing = view.children(0).get("model_weights")
    if listing is None:
        return None
    paths, queue = {0: ""}, collections.deque([0])
    while queue:
        node = queue.popleft()
        for name, child in view.children(node).items():
            if child not in paths:
                # A checkpoint writes '.' doubled and '/' as '.S' in a path step.
                step = name.replace(".", "..").replace("/", ".S")
                paths[child] = f"{paths[node]}/{step}".lstrip("/")
                queue.append(child)
    stored = set(reader.get_variable_to_shape_map())
    keys = {name: f"{paths[node]}/.ATTRIBUTES/VARIABLE_VALUE"
            for name, node in view.children(listing).items()}
    return {name: key for name, key in keys.items() if key in stored}


def restore_for_inference(model: Any, global_step: tf.Variable, path: str) -> bool:
    """Reads the model's weights and the step from checkpoint `path` (no
    optimizer), the moving averages in place of the trained weights when it
    holds them (`engine.recipe.ema`); returns whether it did."""
    checkpoint = tf.train.Checkpoint(model=model, global_step=global_step,
                                     model_weights=named_weights(model))
    restore(checkpoint, path, posixpath.dirname(path), partial=True)
    if not holds(path, AVERAGES):
        return False
    stored = {key.split("/")[1] for key in stored_names(path)
              if key.startswith(AVERAGES + "/")}
    weights = {key: v for key, v in named_weights(model).items() if key in stored}
    tf.train.Checkpoint(**{AVERAGES: weights}).restore(path).expect_partial()
    return True


def worker_save_dir(model_dir: str, role_name: str) -> str:
    """A fresh temporary directory for a non-chief worker's share of saving.

    Saving is collective in a multi-worker cluster, so every worker writes a
    checkpoint, but only the chief's belongs in `model_dir`. The caller
    removes the directory at the end; one left behind by a worker that was
    killed (SIGKILL gives no chance to clean up) is removed here, on the next
    start of the same task of the same run: the name carries the task and a
    digest of `model_dir`, and one task of one run cannot run twice at once.
    """
    prefix = f"tfloop-{role_name.replace(':', '')}-{layout.run_digest(model_dir)}-"
    for stale in glob.glob(os.path.join(tempfile.gettempdir(), prefix + "*")):
        logger.info("removing %s, left by an earlier %s of this run", stale, role_name)
        # In a shared folder: a link there (anyone's) goes as a link, never its target.
        files.remove_quietly(stale, within=tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=prefix)


def restore(checkpoint: tf.train.Checkpoint, path: Optional[str], model_dir: str, *,
            partial: bool = False) -> Optional[str]:
    """Restores `path` (the newest readable checkpoint of `model_dir`), if any.

    A checkpoint written by another model is a user mistake (a reused
    `--model_dir`), reported as one line naming the first variable that
    differs, found by comparing the stored `model_weights/...` shapes and
    dtypes with the model's before restoring anything: a failed restore
    would leave the model half restored and TensorFlow warning about every
    value it did not place. `partial`: `checkpoint` holds only part of what
    was saved (the model, not the optimizer), and the rest is not to be
    warned about.
    """
    if not path:
        return None
    name = posixpath.basename(path)
    misfit = _misfit(path, getattr(checkpoint, "model_weights", None))
    if misfit:
        raise ConfigError(
            f"--model_dir={model_dir} holds {name}, which does not fit this model ({misfit}); "
            "use a new --model_dir, or the flags that wrote it")
    try:
        status = checkpoint.restore(path)
    except (ValueError, tf.errors.OpError) as error:
        raise _unusable(model_dir, name, error) from None
    try:
        status.assert_existing_objects_matched()
    except AssertionError as error:
        status.expect_partial()  # no warnings about what was not restored
        raise _unusable(model_dir, name, error) from None
    if partial:
        status.expect_partial()
    return path


def _unusable(model_dir: str, name: str, error: Exception) -> ConfigError:
    reason = one_line(str(error), 160)
    if isinstance(error, tf.errors.OpError):
        return ConfigError(f"--model_dir={model_dir}: {name} could not be read ({reason}); "
                           "move it away to resume from the checkpoint before it")
    return ConfigError(f"--model_dir={model_dir} holds {name}, which does not fit this model "
                       f"and optimizer ({reason}); use a new --model_dir, or the flags that "
                       "wrote it")


def _misfit(path: str, weights: Any) -> Optional[str]:
    """The first of the model's variables (`named_weights`) whose stored
    value is missing or of another shape or dtype in checkpoint `path`, in a
    few words; None when they all fit (or the checkpoint predates
    `model_weights/`)."""
    if not weights:
        return None
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    stored = weight_keys(path, reader)
    if not stored:
        return None
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    for key, variable in weights.items():
        name = f"model_weights/{key}"
        if key not in stored:
            return (f"this model's {name} {_describe(variable.dtype, variable.shape)} is not "
                    f"in it; it holds {len(stored)} model variables, this model has {len(weights)}")
        shape, dtype = shapes[stored[key]], dtypes[stored[key]]
        if (list(shape) != list(variable.shape)
                or tf.as_dtype(dtype).base_dtype != tf.as_dtype(variable.dtype).base_dtype):
            return (f"{name} is {_describe(dtype, shape)} there and "
                    f"{_describe(variable.dtype, variable.shape)} in this model")
    extra = sorted(set(stored) - set(weights))
    if extra:
        return (f"it holds model_weights/{extra[0]}, which this model does not have "
                f"({len(stored)} model variables there, {len(weights)} in this model)")
    return None


def _describe(dtype: Any, shape: Any) -> str:
    return f"{tf.as_dtype(dtype).name} {tuple(shape)}"
