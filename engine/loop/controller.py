"""The outer loop: runs loops of compiled steps, checkpoints, evaluates, runs actions.

In the spirit of Orbit's `Controller`, `train(steps)` trains until the *global*
step reaches `steps`, so re-running after a restore continues where the
checkpoint left off::

    while global_step < steps:
        n = steps up to the next stop: steps_per_loop, the end, the next
            checkpoint or eval boundary, or what a train action asks for
        metrics = trainer.train(n)                 # one tf.function call
        NaN or Inf in its loss or grad_norm: raise NonFinite, nothing saved
        run the train actions (progress, summaries, profiler, stop request, hooks)
        evaluate, then save a checkpoint, if this loop crossed their interval
    evaluate (with eval_interval); save the final checkpoint

Loops are cut at every boundary, so checkpoints land exactly on multiples of
`checkpoint_interval` (`ckpt-100`, `ckpt-200`, ...), whatever `steps_per_loop`
is; the actions' own boundaries (`engine.loop.actions`) put summaries on multiples
of `summary_interval` and the profiler trace on exactly its steps.

At a step that is both an eval and a checkpoint boundary the evaluation comes
first, so a checkpoint of step s always follows the evaluation of s: a run
resumed from it has made every evaluation up to s (early stopping counts
them exactly across a kill). An action ends training early and normally by
raising `StopTraining`: one log line, the checkpoint of the step reached, no
further evaluation.

`evaluate_continuously` is the sidecar evaluator's loop: each new checkpoint
in the manager's directory that reads (`engine.run_dir.checkpoint_files`) is restored
and evaluated, until the one of the final train step or until none comes for
`timeout` seconds.
"""

from __future__ import annotations

import logging
import posixpath
import time
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from tfloop.engine.run_dir import checkpoint_files, checkpointing, run_record
from tfloop.engine.runtime import hardware
from tfloop.engine.loop import finite
from tfloop.engine.loop.preemption import Preempted
from tfloop.engine.loop.actions import Action, LoopEnd, StopTraining, crossed, next_multiple
from tfloop.engine.option import INT32_MAX
from tfloop.engine.errors import NonFinite
from tfloop.engine.loop.contracts import AbstractEvaluator, AbstractTrainer, LoopClock, Metrics

logger = logging.getLogger(__name__)

# How often evaluate_continuously looks for a new checkpoint.
_POLL_SECONDS = 0.5


def _check_instance(name: str, value, kind: type, what: str, *, optional: bool = True) -> None:
    if not (isinstance(value, kind) or (optional and value is None)):
        raise ValueError(f"`{name}` ({value!r}) must be {what}{' or None' if optional else ''}")


def _check_actions(name: str, actions: Sequence[Action]) -> tuple[Action, ...]:
    for action in actions:
        if not isinstance(action, Action):
            raise ValueError(
                f"`{name}` holds {action!r}, which is not an engine.loop.actions.Action; wrap a "
                "function f(step, metrics) as engine.loop.actions.OnLoopEnd(f)")
    return tuple(actions)


class Controller:
    """Runs training and evaluation loops; see the module docstring.

    Args:
      global_step: the int64 step counter the trainer increments.
      trainer: the train runner, or None for evaluation only.
      evaluator: the eval runner, or None.
      steps_per_loop: steps per compiled loop (one Python round trip each).
      checkpoint_manager: saves `ckpt-<step>` every `checkpoint_interval`
        steps and at the end of `train`; `evaluate_continuously` watches its
        directory. None: never save.
      checkpoint_interval: steps between checkpoints; 0 saves only at the end.
      train_actions: run after every train loop, in order (`engine.loop.actions`).
      eval_actions: run after every evaluation, in order.
    """

    def __init__(
        self,
        *,
        global_step: tf.Variable,
        trainer: Optional[AbstractTrainer] = None,
        evaluator: Optional[AbstractEvaluator] = None,
        steps_per_loop: int = 100,
        checkpoint_manager: Optional[tf.train.CheckpointManager] = None,
        checkpoint_interval: int = 0,
        train_actions: Sequence[Action] = (),
        eval_actions: Sequence[Action] = (),
    ):
        _check_instance("global_step", global_step, tf.Variable, "a tf.Variable", optional=False)
        _check_instance("trainer", trainer, AbstractTrainer, "an engine.loop.contracts.AbstractTrainer")
        _check_instance("evaluator", evaluator, AbstractEvaluator,
                        "an engine.loop.contracts.AbstractEvaluator")
        if trainer is None and evaluator is None:
            raise ValueError("`trainer` and `evaluator` are both None; give at least one")
        if not isinstance(steps_per_loop, int) or not 1 <= steps_per_loop <= INT32_MAX:
            raise ValueError(f"`steps_per_loop` ({steps_per_loop!r}) must be a positive integer "
                             "below 2**31 (a loop counts its steps in int32)")
        if not isinstance(checkpoint_interval, int) or checkpoint_interval < 0:
            raise ValueError(f"`checkpoint_interval` ({checkpoint_interval!r}) must be an "
                             "integer >= 0 (0: only at the end)")
        _check_instance("checkpoint_manager", checkpoint_manager, tf.train.CheckpointManager,
                        "a tf.train.CheckpointManager")
        self.global_step = global_step
        self.trainer = trainer
        self.evaluator = evaluator
        self.steps_per_loop = steps_per_loop
        self.checkpoint_manager = checkpoint_manager
        self.checkpoint_interval = checkpoint_interval
        self.train_actions = _check_actions("train_actions", train_actions)
        self.eval_actions = _check_actions("eval_actions", eval_actions)
        self.last_train_metrics: Metrics = {}
        self.last_eval_metrics: Metrics = {}
        #: Why the last `train` call stopped early (`StopTraining`), or None.
        self.stopped_early: Optional[str] = None
        #: "train" or "evaluate" while the trainer's or the evaluator's loop
        #: runs (and after it raised), "save" while a checkpoint is written, else None, and the global steps it
        #: started after and was to end at: where an error came from
        #: (`engine.task.failures` names the task's dataset and steps by them;
        #: the global step itself may run ahead of a loop that failed).
        self.running: Optional[str] = None
        self.running_steps = (0, 0)
        # Throughput excludes each train() call's first loop, which traces and
        # compiles; a run of a single loop has nothing else to report.
        self._timed_steps = 0
        self._timed_seconds = 0.0
        self._first_loop = (0, 0.0)

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    def phase(self) -> tuple[Optional[str], tuple[int, int]]:
        """(`running`, `running_steps`): what the loop is doing now, for a
        hang dump (`engine.observe.watchers`) and for tracing an error to
        the task (`engine.task.failures`)."""
        return self.running, self.running_steps

    def outcome(self) -> run_record.Outcome:
        """What the loops did, as the run record takes it: steps, speed,
        last metrics, and what the trainer's clock counted for `mfu`."""
        trainer = self.trainer
        clock = (trainer.clock if trainer is not None else None) or LoopClock()
        strategy = trainer.strategy if trainer is not None else None
        return run_record.Outcome(
            step=self.step, steps_per_second=self.steps_per_second,
            stopped_early=self.stopped_early, train_metrics=dict(self.last_train_metrics),
            eval_metrics=dict(self.last_eval_metrics), flops_per_step=clock.flops,
            peak=clock.peak,
            devices=hardware.local_devices(strategy) if strategy is not None else ())

    @property
    def steps_per_second(self) -> float:
        """Training speed over the loops timed (each `train` call's first excluded)."""
        steps, seconds = self._timed_steps, self._timed_seconds
        if not seconds:
            steps, seconds = self._first_loop
        return steps / seconds if seconds else 0.0

    def train(self, steps: int, *, eval_interval: int = 0, eval_steps: int = -1) -> None:
        """Trains until the global step reaches `steps`; with `eval_interval`,
        evaluates every that many steps and at the end.

        An action ends training early by raising: `engine.loop.actions.StopOnSignal`
        saves a checkpoint and raises `engine.loop.preemption.Preempted`;
        `engine.loop.actions.StopTraining` (early stopping, also from an action's
        `train_begin`) is logged, the step reached is saved, and `train`
        returns. The train actions are closed either way (the profiler stops).

        Raises:
          NonFinite: a loop's loss or gradient norm (or, from the trainer,
            its weights) are not finite (`engine.loop.finite`); raised before that
            loop's actions, evaluation and checkpoint, so nothing is saved.
        """
        self._require("trainer", "train")
        if eval_interval and self.evaluator is None:
            raise ValueError("`eval_interval` needs an `evaluator`")
        self.stopped_early = None
        try:
            for action in (*self.train_actions, *self.eval_actions):
                action.train_begin(self.step)
            first_loop = True
            while self.step < steps:
                self._train_loop(steps, eval_interval, eval_steps, first_loop=first_loop)
                first_loop = False
            if eval_interval:
                self.evaluate(eval_steps)
            self.save_checkpoint()
        except StopTraining as stop:
            logger.info("stopping early at step %d: %s", self.step, stop.reason)
            self.stopped_early = stop.reason
            self.save_checkpoint()
        except Preempted as stop:  # the stop request saved its checkpoint: told as any save
            if stop.checkpoint:
                self._tell_saved(stop.step, stop.checkpoint)
            raise
        finally:
            for action in self.train_actions:
                action.close()

    def _train_loop(self, target: int, eval_interval: int, eval_steps: int, *,
                    first_loop: bool) -> None:
        start = self.step
        num_steps = self._steps_to_next_stop(start, target, eval_interval)
        for action in self.train_actions:
            action.loop_begin(start)
        began = time.perf_counter()
        try:
            self.running, self.running_steps = "train", (start, start + num_steps)
            metrics = self.trainer.train(num_steps)
            self.running = None
            finite.check_metrics(metrics, start, self.step)  # any runner's, before any save
        except NonFinite as error:
            stopped = NonFinite(f"{error}; stopped without saving: {self._last_good()}")
            stopped.loop = getattr(error, "loop", None)  # (start, step, metrics): the loop's
            raise stopped from None
        seconds = time.perf_counter() - began
        step = self.step
        if step <= start:
            raise RuntimeError(f"{type(self.trainer).__name__}.train({num_steps}) left the global "
                               f"step at {step}: a loop must advance it, or training never ends")
        # A loop a stop request ended early made fewer steps than asked.
        done = min(step - start, num_steps)
        if first_loop:
            self._first_loop = (done, seconds)
        else:
            self._timed_steps += done
            self._timed_seconds += seconds
        self.last_train_metrics = metrics
        loop = LoopEnd(start=start, step=step, target=target, num_steps=done,
                       seconds=seconds, metrics=metrics)
        for action in self.train_actions:
            action(loop)
        # The last loop's evaluation and checkpoint are train()'s, in that order.
        if crossed(start, step, eval_interval) and step < target:
            self.evaluate(eval_steps)
        if crossed(start, step, self.checkpoint_interval) and step < target:
            self.save_checkpoint()

    def evaluate(self, steps: int = -1) -> Metrics:
        """Evaluates `steps` batches (all when -1) at the current step, then
        runs the eval actions (`last_eval_metrics` is set before them: one
        may end training by raising)."""
        self._require("evaluator", "evaluate")
        began = time.perf_counter()
        self.running, self.running_steps = "evaluate", (self.step, self.step)
        metrics = self.evaluator.evaluate(steps)
        self.running = None
        seconds = time.perf_counter() - began
        if metrics.get("examples", 1) == 0:
            # No example, no result: its means (0) reach no record, summary or callback.
            metrics = {"examples": 0}
        step = self.step
        end = LoopEnd(start=step, step=step, target=step, num_steps=steps, seconds=seconds,
                      metrics=metrics)
        self.last_eval_metrics = metrics
        for action in self.eval_actions:
            action(end)
        return metrics

    def evaluate_continuously(self, steps: int = -1, *, timeout: float, last_step: int,
                              restore: Optional[Callable[[str], Any]] = None,
                              directory: Optional[str] = None) -> Metrics:
        """Evaluates each new checkpoint in `checkpoint_manager.directory` (or
        `directory`, with `restore`: no manager needed) as it appears, the
        newest that reads (`engine.run_dir.checkpoint_files.as_they_appear`).

        Restores the model and global step of each one (`expect_partial`: an
        evaluator has no optimizer; or `restore(path)` when given: the
        evaluator task reads the moving averages a checkpoint holds), evaluates
        `steps` batches and runs the eval actions. Returns the last evaluation's metrics after evaluating
        a checkpoint at `last_step` or later (the end of training), or after
        `timeout` seconds without a new checkpoint. A checkpoint written while
        an evaluation runs may be skipped for a newer one, never the last.
        """
        self._require("evaluator", "evaluate_continuously")
        if directory is None or restore is None:
            self._require("checkpoint_manager", "evaluate_continuously")
        directory = directory or self.checkpoint_manager.directory
        metrics: Metrics = {}
        for path in checkpoint_files.as_they_appear(directory, poll_seconds=_POLL_SECONDS,
                                                    timeout=timeout):
            if restore is None:
                self.checkpoint_manager.checkpoint.restore(path).expect_partial()
            else:
                restore(path)
            logger.info("evaluating %s", path)
            metrics = self.evaluate(steps)
            if self.step >= last_step:
                break
        else:
            logger.info("no new checkpoint in %s for %ds; stopping", directory, timeout)
        return metrics

    def _last_good(self) -> str:
        """Where a stopped run resumes from: the newest checkpoint (saved
        before the numbers diverged, since nothing is saved after)."""
        latest = self.checkpoint_manager.latest_checkpoint if self.checkpoint_manager else None
        if not latest:
            return "there is no checkpoint"
        return f"the newest checkpoint, {posixpath.basename(latest)}, is the last good one"

    def save_checkpoint(self) -> Optional[str]:
        """Saves `ckpt-<step>` unless one exists for this step already; the
        train actions are told of a new one (`Action.saved`)."""
        before = self.checkpoint_manager.latest_checkpoint if self.checkpoint_manager else None
        self.running = "save"  # for a hang dump (engine.runtime.hang); no error names it
        path = checkpointing.save(self.checkpoint_manager, self.step)
        self.running = None
        if path is not None and path != before:
            self._tell_saved(self.step, path)
        return path

    def _tell_saved(self, step: int, path: str) -> None:
        for action in self.train_actions:
            action.saved(step, path)

    def _steps_to_next_stop(self, step: int, target: int, eval_interval: int) -> int:
        stops = [step + self.steps_per_loop, target]
        for interval in (self.checkpoint_interval, eval_interval):
            if interval:
                stops.append(next_multiple(step, interval))
        for action in self.train_actions:
            stop = action.next_stop(step)
            if stop is not None and stop <= step:
                raise ValueError(f"{action!r}.next_stop({step}) returned {stop}, which is not "
                                 f"after step {step}")
            if stop is not None:
                stops.append(stop)
        return min(stops) - step

    def _require(self, attribute: str, method: str) -> None:
        if getattr(self, attribute) is None:
            raise ValueError(f"`{attribute}` is None: pass one to the Controller to call "
                             f"{method}()")
