"""The run directory as the plan reads it: one call, one frozen record.

`engine.assembly.plan.make_plan` needs a dozen things from `model_dir` and
the folders beside it; each used to be a trip of its own into this room
(20 calls: the refusals, run.json, the checkpoints on disk, the local ones,
the lock, the survey, the run id). `read_for_plan` makes them, in this
order, and returns what they found (`RunDirReading`)::

    refuse    model_dir, the folders kept in it, --local_checkpoint_dir
              (engine.run_dir.refusals, local_checkpoints.check)
    read      run.json, once (run_identity.load): Plan.run_json
    resuming? a checkpoint in model_dir, or this task's local one
    refuse    --summaries_dir, --init_from out of reach; warn: ram:// model_dir
    claim?    the lock this process will hold is free (run_lock.check_free)
    survey    model_dir's checkpoints (damaged ones skipped, with a line) and
              the newest that reads, local or durable

The identity check (`RunDirReading.check_identity`) comes later, once the
batch is decided: its line on a changed global batch quotes the decided one.
Read-only, like the whole plan: nothing here writes.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Mapping, Optional

import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import (checkpoint_files, local_checkpoints, refusals, run_identity,
                                   run_lock, storage)
from tfloop.launch import tf_config

if TYPE_CHECKING:  # annotations only: the loop's room sits above this one
    from tfloop.engine.loop.settings import Loop
    from tfloop.engine.run_dir.settings import Keeping
    from tfloop.engine.task.settings import ModelAndData

logger = logging.getLogger(__name__)

#: TensorFlow's in-memory filesystem: fine for tests, gone with the process.
IN_MEMORY = "ram://"


@dataclasses.dataclass(frozen=True)
class RunDirReading:
    """What `read_for_plan` found; plain data, read before anything is written.

    Attributes:
      run_json: `model_dir/run.json` as read (None: a new run), the run's one
        read of it (`Plan.run_json`).
      resuming: whether the run resumes from a checkpoint (in `model_dir`, or
        this task's `--local_checkpoint_dir` folder).
      run_id: run.json's id; for the chief of a new run (or of one whose
        run.json predates ids) a fresh one, which it writes there; None for
        another task of a new cluster run.
      lock: the `run_lock` lock this process will hold (`lock_name`), found free.
      checkpoints: `checkpoint_files.survey`'s answer; None for the evaluator task.
      latest_checkpoint: the newest checkpoint that reads, durable or local, if any.
    """

    run_json: Optional[Mapping[str, Any]]
    resuming: bool
    run_id: Optional[str]
    lock: Optional[str]
    checkpoints: Optional[checkpoint_files.Survey]
    latest_checkpoint: Optional[str]

    @property
    def resumed(self) -> Optional[dict]:
        """The newest range of run.json when the run resumes from a checkpoint
        (`run_identity.last_range`: the batch decision's), else None."""
        return run_identity.last_range(self.run_json) if self.run_json and self.resuming else None

    def check_identity(self, data: ModelAndData, loop: Loop, optimizer: str, *,
                       task_object: bool) -> None:
        """Refuses a run (`loop`: the batch decided) that contradicts the one it
        continues (`run_identity.check`: run.json's identity, `data`'s, and
        `optimizer`, the recipe's)."""
        run_identity.check(data, loop, optimizer, self.run_json, task_object=task_object)


def read_for_plan(loop: Loop, keeping: Keeping, role: tf_config.Role, mode: str, *,
                  init_from: str, compares_workers: bool) -> RunDirReading:
    """Every refusal and read of the run directory the plan makes, in the
    module docstring's order. `loop`, `keeping`: the run's sections (its
    folders, and what it keeps in `model_dir`); `mode`: the run's
    (`RUN_MODES`); `init_from`: `--init_from` (the recipe's), checked
    reachable; `compares_workers`: the strategy keeps its workers in step (no
    parameter-server cluster, which cannot resume from local checkpoints)."""
    refusals.check_model_dir(loop.model_dir)
    # The folders kept in it: a link there is refused before run.json is read through it.
    refusals.check_run_directories(loop, keeping)
    local_checkpoints.check(loop, asynchronous_cluster=role.in_cluster
                            and not compares_workers and not role.is_evaluator)
    stored = (run_identity.load(loop.model_dir) if tf.io.gfile.isdir(loop.model_dir)
              else None)
    stored_id = run_identity.run_id(stored)
    resuming = checkpoint_files.on_disk(loop.model_dir) or local_checkpoints.held(
        loop, role.name if role.in_cluster else "", run_id=stored_id)
    _check_other_paths(loop, init_from)
    lock = lock_name(role, mode)
    if lock:
        run_lock.check_free(loop.model_dir, lock)
    checkpoints, latest = _find_checkpoint(loop, role, mode, run_id=stored_id)
    return RunDirReading(
        run_json=stored, resuming=bool(resuming), lock=lock, checkpoints=checkpoints,
        latest_checkpoint=latest,
        run_id=stored_id or (run_identity.new_run_id() if role.is_chief else None))


def lock_name(role: tf_config.Role, mode: str) -> Optional[str]:
    """Which `engine.run_dir.run_lock` lock a process of `role` running `mode` holds:
    the ones that write `model_dir` (a cluster's other workers save elsewhere)."""
    if role.is_evaluator or (role.is_chief and mode == "evaluate"):
        return run_lock.EVALUATE
    return run_lock.TRAIN if role.is_chief else None


def _check_other_paths(loop: Loop, init_from: str) -> None:
    """The paths besides `model_dir` a run writes or reads, and a warning for
    an in-memory `model_dir`, which the process takes with it."""
    if loop.summaries_dir:  # its own folder (Vertex's $AIP_TENSORBOARD_LOG_DIR): checked alike
        refusals.check_directory(loop.summaries_dir, "--summaries_dir")
    if init_from:  # gs:// out of reach: 138 now, not a traceback at the warm start
        storage.check_reachable(init_from, "--init_from")
    if loop.model_dir.startswith(IN_MEMORY):
        logger.warning("--model_dir=%s is in memory: its checkpoints, metrics.json and export "
                       "vanish when this process ends; use a local path or gs:// to keep them",
                       loop.model_dir)


def _find_checkpoint(loop: Loop, role: tf_config.Role, mode: str, *,
                     run_id: Optional[str]) -> tuple[Optional[checkpoint_files.Survey],
                                                     Optional[str]]:
    """The survey of `model_dir`'s checkpoints (damaged ones skipped, with a
    line) and the newest that reads, local or durable: `--local_checkpoint_dir`'s
    where newer and this run's (`run_id`: run.json's), also when every
    durable one is damaged (a cluster's is settled across workers in
    `engine.assembly.runner`). The evaluator task surveys nothing: it reads
    each checkpoint as it appears. `--mode=evaluate` without a checkpoint is
    refused, and so is a `model_dir` whose checkpoints none reads, with no
    local one to resume from instead."""
    if role.is_evaluator:
        return None, None
    local = bool(loop.local_checkpoint_dir) and mode != "evaluate" and not role.in_cluster
    checkpoints = checkpoint_files.survey(loop.model_dir, strict=not local)
    latest = checkpoints.newest
    if local:
        latest = local_checkpoints.newer(loop, latest, run_id=run_id) or latest
        if latest is None and checkpoints.damaged:
            raise checkpoint_files.none_reads(checkpoints)
    skipped = checkpoints.skip_line("evaluating" if mode == "evaluate" else "resuming from",
                                    instead=latest)
    if skipped:
        logger.info(skipped)
    if mode == "evaluate" and not latest:
        raise ConfigError(
            f"--mode=evaluate found no checkpoint in --model_dir={loop.model_dir}; "
            "train first or point --model_dir at a trained run")
    return checkpoints, latest
