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
several runs and tasks; it keeps the newest `TO_KEEP`. A name anyone can
compute, in a place anyone may write, is trusted only as far as
`engine.run_dir.local_folder` says: this user's 0700 folder, no link, its
state file never read, the run id of `model_dir/run.json` in its `run_id`
file (a `model_dir` removed and made again is another run, whose local
checkpoints are not the new one's). A restart resumes from the newest local
checkpoint that reads (`checkpoint_files.damage`) when it is newer than the
newest durable one that reads (or every durable one is damaged). A run that
finishes training removes its folder: the durable final checkpoint holds it.

In a synchronous cluster (multi_worker) every worker must restore the same
step: each worker lists its own local steps that read, the lists are
gathered across the workers (`agree`, one all-gather), and all resume from
the newest step every worker holds, else from the durable checkpoint. A
parameter-server cluster is refused (`check`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Callable, Optional

import tensorflow as tf

if TYPE_CHECKING:  # annotations only: the loop's room sits above this one
    from tfloop.engine.loop.settings import Loop
from tfloop.engine.errors import ConfigError, RunFailure
from tfloop.engine.run_dir import (checkpoint_files, checkpointing, layout, local_folder,
                                   refusals, run_identity)

logger = logging.getLogger(__name__)

#: Local checkpoints kept per run: the newest, and one before it should it not read.
TO_KEEP = 2


def folder(local_checkpoint_dir: str, model_dir: str, task: str = "") -> str:
    """This run's (and cluster `task`'s) folder under `local_checkpoint_dir`."""
    name = "tfloop-" + layout.run_digest(model_dir)
    return os.path.join(local_checkpoint_dir, name + (f"-{task.replace(':', '')}" if task else ""))


def check(loop: Loop, *, asynchronous_cluster: bool) -> None:
    """Refuses `--local_checkpoint_dir` where it cannot work, before anything is written."""
    if not loop.local_checkpoint_dir:
        return
    if asynchronous_cluster:
        raise ConfigError(
            f"--local_checkpoint_dir={loop.local_checkpoint_dir} is for one-process and "
            "multi_worker runs: a parameter-server cluster's variables live on its ps tasks; "
            "drop it, and resume from --model_dir's checkpoints (--checkpoint_interval)")
    if "://" in loop.local_checkpoint_dir:
        raise ConfigError(
            f"--local_checkpoint_dir={loop.local_checkpoint_dir} is a URL; name a local "
            "folder (a RAM disk such as /dev/shm, or a local SSD)")
    # The walk --model_dir's check makes: a writable folder at or above it.
    refusals.writable_ancestor(loop.local_checkpoint_dir, "--local_checkpoint_dir",
                               shown=loop.local_checkpoint_dir)


def _adoptable(loop: Loop, task: str, run_id: Optional[str], *,
               quiet: bool = False) -> dict[int, str]:
    """`{step: prefix}` of the local checkpoints this run (cluster `task`) may
    resume from: none without the run's id (`run_id`: run.json's), in a folder
    that fails `local_folder.problem` (the saver says so, once), or that holds
    another run's; read-only."""
    if not loop.local_checkpoint_dir or run_id is None:
        return {}
    directory = folder(loop.local_checkpoint_dir, loop.model_dir, task)
    if not os.path.lexists(directory) or local_folder.problem(directory):
        return {}
    found = local_folder.checkpoints(directory)
    if local_folder.run_id_of(directory) != run_id:
        if found and not quiet:
            logger.info("not resuming from the local checkpoints in %s: they are another run's "
                        "(another run id than %s's: a model_dir made again at this path)",
                        directory, layout.RUN_JSON)
        return {}
    return found


def newer(loop: Loop, durable: Optional[str], *, run_id: Optional[str]) -> Optional[str]:
    """The local checkpoint to resume from: the newest that reads, when it is
    newer than `durable` (the newest durable one that reads, or None) and
    the folder is this run's (`run_id`: run.json's; None: a new run); else
    None. Logs the choice."""
    found = _adoptable(loop, "", run_id)
    durable_step = checkpoint_files.step_of(durable) if durable else -1
    for step in sorted(found, reverse=True):
        if step <= durable_step:
            break
        reason = checkpoint_files.damage(found[step])
        if reason:
            logger.info("local %s is damaged (%s); skipping it", os.path.basename(found[step]),
                        reason)
            continue
        logger.info("resuming from the local checkpoint %s, newer than the durable %s",
                    found[step], os.path.basename(durable) if durable else "none")
        return found[step]
    if found:
        logger.info("no local checkpoint newer than the durable %s",
                    os.path.basename(durable) if durable else "none")
    return None


def held(loop: Loop, task: str = "", *, run_id: Optional[str]) -> bool:
    """Whether this run (cluster `task`) has local checkpoint files to resume from."""
    return bool(_adoptable(loop, task, run_id, quiet=True))


def readable_steps(found: dict[int, str]) -> list[int]:
    """The steps of the newest `TO_KEEP` of `found` (`{step: prefix}`) that read, newest first."""
    steps = []
    for step, prefix in sorted(found.items(), reverse=True):
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


def newer_on_every_worker(loop: Loop, task: str, strategy: tf.distribute.Strategy,
                          durable: Optional[str], *, run_id: Optional[str]) -> Optional[str]:
    """In a synchronous cluster: this worker's local checkpoint of the newest
    step every worker holds, when newer than `durable` and the folder is
    this run's (`run_id`: run.json's, as the plan read it; None: a new run);
    else None. Every worker must call it (`agree` is collective)."""
    directory = folder(loop.local_checkpoint_dir, loop.model_dir, task)
    steps = readable_steps(_adoptable(loop, task, run_id))
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


def create(loop: Loop, checkpoint: tf.train.Checkpoint, global_step: tf.Variable,
           task: str = "", *, run_id: Optional[str]) -> Optional["Saver"]:
    """The saver of `checkpoint` into this run's (cluster `task`'s) local
    folder, or None without `--local_checkpoint_dir`. `run_id`: the run's
    (`Plan.run_id`); None for a task of a new cluster run that did not make
    it, which reads it from run.json at its first save (the chief wrote it
    before the first step, which every task shares)."""
    if not loop.local_checkpoint_dir:
        return None
    return Saver(checkpoint, global_step,
                 directory=folder(loop.local_checkpoint_dir, loop.model_dir, task),
                 run_id=(lambda: run_id) if run_id else _run_json_id(loop.model_dir),
                 durable_interval=loop.checkpoint_interval)


def _run_json_id(model_dir: str) -> Callable[[], Optional[str]]:
    def read() -> Optional[str]:
        try:
            return run_identity.run_id(layout.read_json(layout.RunDir(model_dir).run_json))
        except (ConfigError, tf.errors.OpError):
            return None
    return read


class Saver:
    """Saves local checkpoints into a folder `local_folder` lets the run use;
    never raises for a local reason: the durable checkpoints hold the run.

    `prepare` (at the start of training, or the first save) makes or checks
    the folder and claims it (`local_folder.claim`); a folder that fails is
    ignored with one warning. `save` removes links at the names it writes,
    saves, and keeps the newest `TO_KEEP`; a failed save is one warning,
    said once. `finish` removes the folder once training is over."""

    def __init__(self, checkpoint: tf.train.Checkpoint, global_step: tf.Variable, *,
                 directory: str, run_id: Callable[[], Optional[str]], durable_interval: int):
        self.checkpoint, self.global_step = checkpoint, global_step
        self.directory, self.run_id, self.durable_interval = directory, run_id, durable_interval
        self.manager: Optional[tf.train.CheckpointManager] = None
        self.ignored = self.failing = False

    def prepare(self) -> bool:
        """Whether the folder is ready for saves (made, checked, claimed)."""
        if self.manager is not None or self.ignored:
            return not self.ignored
        run_id = self.run_id()
        if run_id is None:  # a task of a new cluster run, before the chief's run.json
            return False
        try:
            reason = local_folder.open_folder(self.directory)
            if reason is None:
                local_folder.claim(self.directory, run_id)
        except (OSError, RunFailure, ConfigError) as error:
            reason = f"could not be prepared ({error})"
        if reason:
            self.ignored = True
            logger.warning("not using the local checkpoint folder %s: it %s; this run neither "
                           "resumes from nor saves local checkpoints there and goes on with %s "
                           "(remove it, or give another --local_checkpoint_dir)",
                           self.directory, reason, self._durable())
            return False
        # After `claim` removed the state file, which TensorFlow's manager reads here.
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory,
                                                  max_to_keep=TO_KEEP,
                                                  step_counter=self.global_step)
        return True

    def save(self, step: int) -> Optional[str]:
        """`ckpt-<step>` in the folder, or None (ignored, or failed: said once)."""
        try:
            if not self.prepare():
                if self.ignored:
                    return None
                raise RunFailure(f"{layout.RUN_JSON} holds no run id yet")
            reason = local_folder.problem(self.directory)
            if reason:
                raise RunFailure(f"{self.directory} {reason}")
            local_folder.unlink_links(self.directory)
            path = checkpointing.save(self.manager, step)
            local_folder.rotate(self.directory, TO_KEEP, step)
        except checkpointing.SaveFailure as failure:
            return self._failed(step, f"{failure.reason}; {failure.free}")
        except (OSError, RunFailure, ConfigError) as error:
            return self._failed(step, str(error))
        if self.failing:
            logger.info("local checkpoints are saved again (ckpt-%d)", step)
            self.failing = False
        return path

    def finish(self) -> None:
        """Training is over and the durable final checkpoint saved: the
        folder goes (its checkpoints would only hold RAM disk space)."""
        try:
            if self.prepare() and local_folder.remove_folder(self.directory):
                logger.info("removed the local checkpoint folder %s: training is over, the "
                            "durable checkpoint holds the run", self.directory)
        except (OSError, RunFailure, ConfigError) as error:
            logger.warning("could not remove the local checkpoint folder %s (%s)",
                           self.directory, error)

    def _failed(self, step: int, reason: str) -> None:
        level = logging.DEBUG if self.failing else logging.WARNING
        self.failing = True
        logger.log(level, "local checkpoint at step %d not saved in %s (%s); training goes on "
                   "with %s (said once; the next local saves are still tried)", step,
                   self.directory, reason, self._durable())

    def _durable(self) -> str:
        every = self.durable_interval
        return (f"durable checkpoints every {every} steps" if every
                else "a durable checkpoint at the end only")
