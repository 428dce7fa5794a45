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
model_dir>` (and `-<task>` for each task of a cluster), so one RAM disk serves
several runs and tasks, and a run never resumes from another's; it keeps the
newest `TO_KEEP`. A restart resumes from the newest local checkpoint that
reads (`checkpoint_files.damage`) when it is newer than the durable one, and
only when `model_dir` still holds the run (its run.json): a `model_dir`
removed to start again does not resume from what its old run left on the
RAM disk.

In a synchronous cluster (multi_worker) every worker must restore the same
step: each worker lists its own local steps that read, the lists are
gathered across the workers (`agree`, one all-gather), and all resume from
the newest step every worker holds, else from the durable checkpoint. A
parameter-server cluster is refused (`check`).
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import checkpoint_files, checkpointing, layout
from tfloop.engine.runtime import files

logger = logging.getLogger(__name__)

#: Local checkpoints kept per run: the newest, and one before it should it not read.
TO_KEEP = 2


def folder(local_checkpoint_dir: str, model_dir: str, task: str = "") -> str:
    """This run's (and cluster `task`'s) folder under `local_checkpoint_dir`."""
    name = "tfloop-" + layout.run_digest(model_dir)
    return os.path.join(local_checkpoint_dir, name + (f"-{task.replace(':', '')}" if task else ""))


def check(config: RunConfig, *, asynchronous_cluster: bool) -> None:
    """Refuses `--local_checkpoint_dir` where it cannot work, before anything is written."""
    if not config.local_checkpoint_dir:
        return
    if asynchronous_cluster:
        raise ConfigError(
            f"--local_checkpoint_dir={config.local_checkpoint_dir} is for one-process and "
            "multi_worker runs: a parameter-server cluster's variables live on its ps tasks; "
            "drop it, and resume from --model_dir's checkpoints (--checkpoint_interval)")
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


def newer(config: RunConfig, durable: Optional[str], *, run_exists: bool) -> Optional[str]:
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


def held(config: RunConfig, task: str = "") -> bool:
    """Whether this run (cluster `task`) has local checkpoint files to resume from."""
    return bool(config.local_checkpoint_dir) and bool(checkpoint_files.on_disk(
        folder(config.local_checkpoint_dir, config.model_dir, task)))


def readable_steps(directory: str) -> list[int]:
    """The steps of the newest `TO_KEEP` checkpoints in `directory` that read, newest first."""
    steps = []
    for step, prefix in sorted(checkpoint_files.on_disk(directory).items(), reverse=True):
        reason = checkpoint_files.damage(prefix)
        if reason:
            logger.info("local %s is damaged (%s); skipping it", os.path.basename(prefix), reason)
        else:
            steps.append(step)
        if len(steps) == TO_KEEP:
            break
    return steps


def agree(strategy: tf.distribute.Strategy, steps: list[int]) -> Optional[int]:
    """The newest of `steps` (this worker's) that every worker of `strategy`
    holds, from one all-gather of every worker's list; None if there is none."""
    row = tf.constant([(steps + [-1] * TO_KEEP)[:TO_KEEP]], tf.int64)
    gathered = strategy.gather(strategy.run(lambda: tf.identity(row)), axis=0).numpy()
    common = set.intersection(*(set(int(s) for s in held) for held in gathered)) - {-1}
    return max(common) if common else None


def newer_on_every_worker(config: RunConfig, task: str, strategy: tf.distribute.Strategy,
                          durable: Optional[str], *, run_exists: bool) -> Optional[str]:
    """In a synchronous cluster: this worker's local checkpoint of the newest
    step every worker holds, when newer than `durable` and `run_exists`
    (model_dir holds the run's run.json, as the plan read it); else None.
    Every worker must call it (`agree` is collective)."""
    directory = folder(config.local_checkpoint_dir, config.model_dir, task)
    steps = readable_steps(directory) if run_exists else []
    step = agree(strategy, steps)
    durable_step = checkpoint_files.step_of(durable) if durable else 0
    if step is None or step <= durable_step:
        logger.info("no local checkpoint every worker holds newer than the durable %s "
                    "(this worker's: %s)", os.path.basename(durable) if durable else "none",
                    ", ".join(map(str, steps)) or "none")
        return None
    path = layout.RunDir(directory).checkpoint(step)
    logger.info("resuming from the local checkpoint %s, which every worker holds, newer than "
                "the durable %s", path, os.path.basename(durable) if durable else "none")
    return path


def create(config: RunConfig, checkpoint: tf.train.Checkpoint, global_step: tf.Variable,
           task: str = "") -> Optional[checkpointing.Manager]:
    """The manager saving `checkpoint` into this run's (cluster `task`'s)
    local folder, or None without `--local_checkpoint_dir`."""
    if not config.local_checkpoint_dir:
        return None
    directory = folder(config.local_checkpoint_dir, config.model_dir, task)
    files.make_dirs(directory)  # at most 0755, whatever the umask
    return checkpointing.Manager(checkpoint, directory=directory, max_to_keep=TO_KEEP,
                                 step_counter=global_step)
