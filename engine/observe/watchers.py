"""What a training run adds to see inside itself, in one place for `engine.assembly.run`:

- the hang watch on every task (`engine.runtime.hang`, `--hang_timeout`),
  told by an action when each loop ends;
- the straggler table in a multi-worker cluster (`engine.observe.stragglers`,
  `--straggler_threshold`), an action on every worker;
- on the chief, TensorBoard's restart mark, HParams, the loop's graph and the
  final metrics (`engine.observe.board`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Mapping, Optional

import tensorflow as tf

from tfloop.engine.observe import board
from tfloop.engine.observe.clock import SampledClock
from tfloop.engine.loop.actions import Action, LoopEnd
from tfloop.engine.loop.controller import Controller
from tfloop.engine.loop.contracts import AbstractTrainer
from tfloop.engine.observe.stragglers import Stragglers
from tfloop.engine.loop.summaries import SummaryWriter
from tfloop.engine.run_dir import layout
from tfloop.engine.errors import RunFailure, one_line
from tfloop.engine.runtime import hang
from tfloop.launch import tf_config

if TYPE_CHECKING:  # annotations only: the strategies' room shares this floor
    from tfloop.engine.strategies.settings import Cluster

logger = logging.getLogger(__name__)


class _LoopEnded(Action):
    """Tells the hang watch that a loop ended."""

    def __init__(self, watch: hang.HangWatch):
        self.watch = watch

    def __call__(self, loop: LoopEnd) -> None:
        self.watch.loop_ended(loop.step)


@dataclasses.dataclass(frozen=True)
class WatchedRun:
    """What the watchers need to know of the run, as typed values (the plan
    and the strategy's spec live on floors above this one).

    Attributes:
      cluster: the cluster's section (`--hang_timeout`, `--straggler_threshold`).
      hparams: every flag's value by name (`RunConfig.as_dict()`), which the
        chief writes once for TensorBoard's HParams.
      role: this process in the TF_CONFIG cluster.
      compares_workers: the strategy's workers run synchronous loops whose
        times can be compared (`StrategySpec.compares_workers`).
      loop_runs_here: the train loop's functions run in this process, so its
        graph can be traced (`StrategySpec.loop_runs_here`).
    """

    cluster: Cluster
    hparams: Mapping[str, Any]
    role: tf_config.Role
    compares_workers: bool
    loop_runs_here: bool


class Watchers:
    """Built before the Controller (its actions go in the Controller's list);
    `start(controller)` hands it the Controller, whose phase a hang dump
    reads (`Controller.phase`), and `finish(controller)` its final metrics.

    Args:
      run: what the watchers need of the run's plan (`WatchedRun`).
      strategy: the run's strategy.
      trainer: the trainer (its `step_phase` and `clock`, where it has them).
      train_summaries, eval_summaries: the chief's writers, else None.
      start_step: the step training starts from.
      run_dir: the run's `RunDir` (where its summaries and diagnostics go).
    """

    def __init__(self, *, run: WatchedRun, strategy: tf.distribute.Strategy,
                 trainer: AbstractTrainer, train_summaries: Optional[SummaryWriter],
                 eval_summaries: Optional[SummaryWriter], start_step: int,
                 run_dir: layout.RunDir):
        role = run.role
        phase_marks, clock = trainer.step_phase, trainer.clock
        self._controller: Optional[Controller] = None
        self.watch = hang.HangWatch(
            timeout=run.cluster.hang_timeout, task=role.name,
            directory=hang.directory_for(run_dir.diagnostics),
            file_name=lambda number: layout.hang_dump_name(role.name, os.getpid(), number),
            phase=self._phase,
            step_phase=phase_marks.describe_phase if phase_marks is not None else None)
        self.actions: list[Action] = [_LoopEnded(self.watch)]
        # Every worker decides alike (the table is a collective): same flags, same determinism.
        if (run.compares_workers and role.num_workers > 1
                and run.cluster.straggler_threshold and clock is not None):
            if isinstance(clock, SampledClock) and clock.timed:
                self.actions.append(Stragglers(strategy=strategy,
                                               times=lambda: clock.last, role=role,
                                               threshold=run.cluster.straggler_threshold,
                                               writer=train_summaries))
            elif role.is_chief:
                logger.info("stragglers: not measured under --deterministic (TensorFlow "
                            "refuses tf.timestamp when op determinism is enabled)")
        self._writers = [w for w in (train_summaries, eval_summaries) if w is not None]
        self._root = SummaryWriter(run_dir.summaries()) if train_summaries is not None else None
        if train_summaries is not None and run.loop_runs_here:
            self.actions.append(board.TrainGraph(train_summaries))
        self._hparams = run.hparams
        self._start_step = start_step

    def _phase(self) -> tuple:
        """The Controller's phase and loop, once `start` has it."""
        return self._controller.phase() if self._controller is not None else (None, (0, 0))

    def start(self, controller: Controller) -> None:
        """The chief's TensorBoard marks, then the hang watch's thread, which
        reads `controller`'s phase."""
        self._controller = controller
        if self._root is not None:
            for writer in (*self._writers, self._root):
                board.mark_start(writer, self._start_step)
            board.write_hparams(self._root, self._hparams, step=self._start_step)
        self.watch.start()

    def finish(self, controller: Controller) -> None:
        """Stops the watch; the chief writes the final metrics for HParams."""
        self.watch.stop()
        if self._root is None:
            return
        metrics = {"train": controller.last_train_metrics, "eval": controller.last_eval_metrics}
        try:  # on the way out of a failing run too: its own error is the one to report
            board.write_final_metrics(self._root, controller.step, metrics)
            self._root.close()
        except (tf.errors.OpError, OSError, RunFailure) as error:
            logger.warning("could not write the final metrics for TensorBoard's HParams: %s",
                           one_line(str(error), 160))
