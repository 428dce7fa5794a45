"""Checkpoints through `tf.train.CheckpointManager`: `ckpt-<step>` in `model_dir`.

What is saved is the model, the optimizer (its slots and iteration count) and
the global step; variable names depend only on the model, so
`tf.train.load_checkpoint` reads two runs' checkpoints variable by variable.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import tensorflow as tf

from engine.errors import ConfigError

logger = logging.getLogger("engine")


def create(
    *, model: Any, optimizer: Any, global_step: tf.Variable, directory: str, max_to_keep: int
) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=global_step)
    manager = tf.train.CheckpointManager(
        checkpoint, directory=directory, max_to_keep=max_to_keep, step_counter=global_step
    )
    return checkpoint, manager


def restore_latest(
    checkpoint: tf.train.Checkpoint, manager: tf.train.CheckpointManager
) -> Optional[str]:
    """Restores the newest checkpoint in the manager's directory, if any.

    A checkpoint written by another model is a user mistake (a reused
    `--model_dir`), reported as one line rather than a shape-mismatch trace.
    """
    path = manager.latest_checkpoint
    if not path:
        return None
    try:
        checkpoint.restore(path).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        reason = str(error).strip().splitlines()[0][:200]
        raise ConfigError(
            f"--model_dir={manager.directory} holds {path}, which does not fit this model "
            f"and optimizer ({reason}); use a new --model_dir, or the flags that wrote it"
        ) from None
    return path
