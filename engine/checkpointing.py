"""Checkpoints through `tf.train.CheckpointManager`: `ckpt-<step>` in `model_dir`.

What is saved is the model, the optimizer (its slots and iteration count) and
the global step. Every model variable is also listed under a flat, ordered
name, `model_weights/<index>_<name>` (`model_weights/000_kernel`, ...): a
checkpoint names each variable by its shortest path (ties: the attribute that
sorts first), which would otherwise be the optimizer's
(`optimizer/_trainable_variables/0`); this makes the names depend on the model
alone, and `tf.train.load_checkpoint` reads two
runs' checkpoints variable by variable.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import posixpath
import shutil
import tempfile
from typing import Any, Optional

import tensorflow as tf

from tfloop.engine.errors import ConfigError

logger = logging.getLogger(__name__)

#: Where a checkpoint keeps the weights' moving averages (`engine.ema`).
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


def create(
    *, model: Any, optimizer: Any, global_step: tf.Variable, directory: str, max_to_keep: int,
    averages: Optional[dict] = None,
) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
    """The run's checkpoint and its manager; `averages`: the weights' moving
    averages by `named_weights` key (`engine.ema`), saved under `ema/`."""
    extra = {AVERAGES: averages} if averages is not None else {}
    checkpoint = tf.train.Checkpoint(**parts(model, optimizer, global_step), **extra)
    manager = tf.train.CheckpointManager(
        checkpoint, directory=directory, max_to_keep=max_to_keep, step_counter=global_step
    )
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
    path = manager.save(checkpoint_number=step, check_interval=False)
    logger.info("saved checkpoint %s", path)
    return path


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


def restore_for_inference(model: Any, global_step: tf.Variable, path: str) -> bool:
    """Reads the model's weights and the step from checkpoint `path` (no
    optimizer), the moving averages in place of the trained weights when it
    holds them (`engine.ema`); returns whether it did."""
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
    where = model_dir if "://" in model_dir else os.path.abspath(model_dir)
    digest = hashlib.sha1(where.encode()).hexdigest()[:10]
    prefix = f"tfloop-{role_name.replace(':', '')}-{digest}-"
    for stale in glob.glob(os.path.join(tempfile.gettempdir(), prefix + "*")):
        logger.info("removing %s, left by an earlier %s of this run", stale, role_name)
        shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=prefix)


def restore(checkpoint: tf.train.Checkpoint, path: Optional[str], model_dir: str, *,
            partial: bool = False) -> Optional[str]:
    """Restores `path` (the newest checkpoint of `model_dir`), if any.

    A checkpoint written by another model is a user mistake (a reused
    `--model_dir`), reported as one line rather than a shape-mismatch trace.
    `partial`: `checkpoint` holds only part of what was saved (the model,
    not the optimizer), and the rest is not to be warned about.
    """
    if not path:
        return None
    try:
        status = checkpoint.restore(path).assert_existing_objects_matched()
        if partial:
            status.expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        reason = str(error).strip().splitlines()[0][:200]
        raise ConfigError(
            f"--model_dir={model_dir} holds {path}, which does not fit this model "
            f"and optimizer ({reason}); use a new --model_dir, or the flags that wrote it"
        ) from None
    return path
