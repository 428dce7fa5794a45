"""Fast local checkpoints beside the durable ones (`--local_checkpoint_dir`).

A durable checkpoint in `model_dir` (a bucket, a shared volume) is slow to
write, so it comes every few hundred steps, and a kill loses every step since
the last one. A checkpoint on the machine's own RAM disk or SSD costs little,
so it can come every K steps; it is lost with the machine, which is why the
durable ones stay::

    --checkpoint_interval=100 --local_checkpoint_interval=10
    kill -9 at step 157 -> the same command on the same machine resumes from
                           the local ckpt-150 (7 steps lost, not 57)
    on another machine  -> no local checkpoint: from the durable ckpt-100

The run's local folder is `<local_checkpoint_dir>/tfloop-<digest of
model_dir>`, so one RAM disk serves several runs and a run never resumes from
another's; it keeps the newest `TO_KEEP`. A restart resumes from the newest
local checkpoint that reads (`checkpoint_files.damage`) when it is newer
than the durable one, and only when `model_dir` still holds the run (its
run.json): a `model_dir` removed to start again does not resume from what its
old run left on the RAM disk.

One-process runs only (`check`): in a cluster every worker would have to
resume from a step all of them hold, which needs an agreement across the
workers that this engine does not make yet.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Optional

import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import checkpoint_files, checkpointing

logger = logging.getLogger(__name__)

#: Local checkpoints kept per run: the newest, and one before it should it not read.
TO_KEEP = 2


def folder(local_checkpoint_dir: str, model_dir: str) -> str:
    """This run's folder under `local_checkpoint_dir`, named by `model_dir`."""
    where = model_dir if "://" in model_dir else os.path.abspath(model_dir)
    return os.path.join(local_checkpoint_dir,
                        "tfloop-" + hashlib.sha1(where.encode()).hexdigest()[:10])


def check(config: Any, *, in_cluster: bool) -> None:
    """Refuses `--local_checkpoint_dir` where it cannot work, before anything is written."""
    if not config.local_checkpoint_dir:
        return
    if in_cluster:
        raise ConfigError(
            f"--local_checkpoint_dir={config.local_checkpoint_dir} is for one-process runs: in "
            "a cluster every worker would have to resume from a step all of them hold; drop "
            "it, and resume from --model_dir's checkpoints (--checkpoint_interval)")
    if "://" in config.local_checkpoint_dir:
        raise ConfigError(
            f"--local_checkpoint_dir={config.local_checkpoint_dir} is a URL; name a local "
            "folder (a RAM disk such as /dev/shm, or a local SSD)")
    existing = os.path.abspath(config.local_checkpoint_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--local_checkpoint_dir={config.local_checkpoint_dir} cannot be written "
            f"({existing} is not a writable directory); choose a directory you can write to")


def newer(config: Any, durable: Optional[str], *, run_exists: bool) -> Optional[str]:
    """The local checkpoint to resume from: the newest that reads, when it is
    newer than `durable` (the newest durable one, or None) and `run_exists`
    (model_dir holds the run's run.json); else None. Logs the choice."""
    if not config.local_checkpoint_dir or not run_exists:
        return None
    found = checkpoint_files.survey(folder(config.local_checkpoint_dir, config.model_dir),
                                    strict=False)
    for bad in found.damaged:
        logger.info("local %s is damaged (%s); skipping it", bad.name, bad.reason)
    durable_step = checkpoint_files.step_of(durable) if durable else 0
    if not found.newest or checkpoint_files.step_of(found.newest) <= durable_step:
        if found.damaged or found.newest:
            logger.info("no local checkpoint newer than the durable %s",
                        os.path.basename(durable) if durable else "none")
        return None
    logger.info("resuming from the local checkpoint %s, newer than the durable %s",
                found.newest, os.path.basename(durable) if durable else "none")
    return found.newest


def create(config: Any, checkpoint: tf.train.Checkpoint,
           global_step: tf.Variable) -> Optional[checkpointing.Manager]:
    """The manager saving `checkpoint` into this run's local folder, or None
    without `--local_checkpoint_dir`."""
    if not config.local_checkpoint_dir:
        return None
    directory = folder(config.local_checkpoint_dir, config.model_dir)
    tf.io.gfile.makedirs(directory)
    return checkpointing.Manager(checkpoint, directory=directory, max_to_keep=TO_KEEP,
                                 step_counter=global_step)
