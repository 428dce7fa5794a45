"""The outer loop: runs loops of compiled steps, checkpoints, summarizes, reports.

In the spirit of Orbit's `Controller`, `train(steps)` trains until the *global*
step reaches `steps`, so re-running after a restore continues where the
checkpoint left off::

    while global_step < steps:
        n = steps up to the next boundary (steps_per_loop, checkpoint,
            summary or eval interval, or the end)
        metrics = trainer.train(n)                 # one tf.function call
        report progress; _maybe_write_summaries(); _maybe_save_checkpoint()
        _maybe_evaluate()                          # train_and_evaluate only
    save the final checkpoint

Loops are cut at every boundary, so checkpoints land exactly on multiples of
`checkpoint_interval` (`ckpt-100`, `ckpt-200`, ...) and summaries on multiples
of `summary_interval`, whatever `steps_per_loop` is. `profile_steps=(A, B)`
adds the boundaries A and B: the profiler starts when the global step is A
and stops when it reaches B, so the trace holds exactly those loops' steps.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Callable, Optional

import tensorflow as tf

from engine.evaluator import Evaluator
from engine.preemption import Preempted, StopRequest
from engine.summaries import SummaryWriter
from engine.trainer import Trainer

logger = logging.getLogger("engine")


def _format_metrics(metrics: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "examples")


class Controller:
    """Runs training and evaluation loops; see the module docstring.

    Args:
      global_step: the step counter the trainer increments.
      trainer: the train loop, or None for evaluation only.
      evaluator: the eval loop, or None.
      steps_per_loop: steps per compiled loop (one Python round trip each).
      checkpoint_manager: saves `ckpt-<step>` every `checkpoint_interval`
        steps and at the end; None to never save.
      checkpoint_interval: steps between checkpoints; 0 saves only at the end.
      summary_interval: steps between training summaries; 0 disables them.
      train_summaries / eval_summaries: TensorBoard writers (created lazily).
      global_batch_size: for examples/sec in progress lines.
      on_loop_end: optional hook called with (step, train metrics) after
        each loop, for actions such as early stopping or custom logging.
      stop_request: asked after every loop; when it says stop, the controller
        saves a checkpoint at that step and raises `Preempted`.
      profile_steps: `(A, B)`: a TensorBoard profiler trace of the steps from
        global step A to B, written under `profile_dir` (TensorBoard's
        Profile tab finds it in `profile_dir/plugins/profile/`).
    """

    def __init__(
        self,
        *,
        global_step: tf.Variable,
        trainer: Optional[Trainer] = None,
        evaluator: Optional[Evaluator] = None,
        steps_per_loop: int = 100,
        checkpoint_manager: Optional[tf.train.CheckpointManager] = None,
        checkpoint_interval: int = 0,
        summary_interval: int = 0,
        train_summaries: Optional[SummaryWriter] = None,
        eval_summaries: Optional[SummaryWriter] = None,
        global_batch_size: int = 0,
        on_loop_end: Optional[Callable[[int, dict[str, float]], None]] = None,
        stop_request: Optional[StopRequest] = None,
        profile_steps: Optional[tuple[int, int]] = None,
        profile_dir: str = "",
    ):
        if not isinstance(steps_per_loop, int) or steps_per_loop < 1:
            raise ValueError(f"`steps_per_loop` ({steps_per_loop}) must be a positive integer")
        for name, value in [("checkpoint_interval", checkpoint_interval),
                            ("summary_interval", summary_interval)]:
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` ({value}) must be an integer >= 0 (0: off)")
        self.global_step = global_step
        self.trainer = trainer
        self.evaluator = evaluator
        self.steps_per_loop = steps_per_loop
        self.checkpoint_manager = checkpoint_manager
        self.checkpoint_interval = checkpoint_interval
        self.summary_interval = summary_interval
        self.train_summaries = train_summaries
        self.eval_summaries = eval_summaries
        self.global_batch_size = global_batch_size
        self.on_loop_end = on_loop_end
        self.stop_request = stop_request
        if profile_steps is not None:
            first, last = profile_steps
            if not 0 <= first < last or not profile_dir:
                raise ValueError(f"`profile_steps` {profile_steps} needs 0 <= A < B and a `profile_dir`")
        self.profile_steps = profile_steps
        self.profile_dir = profile_dir
        self._profiling = False
        self.last_train_metrics: dict[str, float] = {}
        self.last_eval_metrics: dict[str, float] = {}
        # Throughput excludes each train() call's first loop, which traces and
        # compiles; a run of a single loop has nothing else to report.
        self.train_seconds = 0.0
        self.train_steps_timed = 0
        self._first_loop = (0, 0.0)

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    def train(self, steps: int, *, eval_interval: int = 0, eval_steps: int = -1) -> None:
        """Trains until the global step reaches `steps`; with `eval_interval`,
        evaluates every that many steps and at the end."""
        if self.trainer is None:
            raise ValueError("`trainer` is None: this controller cannot train")
        if eval_interval and self.evaluator is None:
            raise ValueError("`eval_interval` needs an `evaluator`")
        try:
            self._train(steps, eval_interval, eval_steps)
        finally:
            self._stop_profiler()

    def _train(self, steps: int, eval_interval: int, eval_steps: int) -> None:
        first_loop = True
        while self.step < steps:
            start = self.step
            num_steps = self._steps_to_next_boundary(start, steps, eval_interval)
            self._maybe_start_profiler(start)
            began = time.perf_counter()
            metrics = self.trainer.train(num_steps)
            seconds = time.perf_counter() - began
            if self._profiling and self.step >= self.profile_steps[1]:
                self._stop_profiler()
            if first_loop:
                self._first_loop = (num_steps, seconds)
            else:
                self.train_seconds += seconds
                self.train_steps_timed += num_steps
            first_loop = False
            step = self.step
            self.last_train_metrics = metrics
            self._report(step, steps, metrics, num_steps, seconds)
            if self.on_loop_end:
                self.on_loop_end(step, metrics)
            if self.stop_request is not None and step < steps and self.stop_request.agreed():
                raise Preempted(step, self.save_checkpoint(),
                                self.stop_request.signum or signal.SIGTERM)
            if self._crossed(start, step, self.checkpoint_interval):
                self.save_checkpoint()
            if eval_interval and self._crossed(start, step, eval_interval) and step < steps:
                self.evaluate(eval_steps)
        self.save_checkpoint()
        if eval_interval:
            self.evaluate(eval_steps)

    def evaluate(self, steps: int = -1) -> dict[str, float]:
        """Evaluates `steps` batches (all when negative) at the current step."""
        if self.evaluator is None:
            raise ValueError("`evaluator` is None: this controller cannot evaluate")
        began = time.perf_counter()
        metrics = self.evaluator.evaluate(steps)
        seconds = time.perf_counter() - began
        step = self.step
        logger.info(
            "eval  step %d  %s  (%d examples, %.1fs)",
            step, _format_metrics(metrics), int(metrics.get("examples", 0)), seconds,
        )
        if self.eval_summaries:
            self.eval_summaries.write(step, {k: v for k, v in metrics.items() if k != "examples"})
        self.last_eval_metrics = metrics
        return metrics

    def save_checkpoint(self) -> Optional[str]:
        """Saves `ckpt-<step>` unless one exists for this step already."""
        if self.checkpoint_manager is None:
            return None
        step = self.step
        latest = self.checkpoint_manager.latest_checkpoint
        if latest and latest.endswith(f"-{step}"):
            return latest
        path = self.checkpoint_manager.save(checkpoint_number=step, check_interval=False)
        logger.info("saved checkpoint %s", path)
        return path

    @property
    def examples_per_second(self) -> float:
        steps, seconds = (self.train_steps_timed, self.train_seconds)
        if not seconds:
            steps, seconds = self._first_loop
        return steps * self.global_batch_size / seconds if seconds else 0.0

    def _steps_to_next_boundary(self, step: int, target: int, eval_interval: int) -> int:
        limit = min(self.steps_per_loop, target - step)
        for interval in (self.checkpoint_interval, self.summary_interval, eval_interval):
            if interval:
                limit = min(limit, interval - step % interval)
        for boundary in self.profile_steps or ():
            if step < boundary:
                limit = min(limit, boundary - step)
        return limit

    def _maybe_start_profiler(self, step: int) -> None:
        # Also from inside [A, B) when a resumed run starts there.
        if self.profile_steps is None or self._profiling:
            return
        first, last = self.profile_steps
        if first <= step < last:
            tf.profiler.experimental.start(self.profile_dir)
            self._profiling = True
            logger.info("profiling steps %d to %d into %s", step, last, self.profile_dir)

    def _stop_profiler(self) -> None:
        if self._profiling:
            self._profiling = False
            tf.profiler.experimental.stop()
            logger.info("profiler trace written under %s/plugins/profile", self.profile_dir)

    @staticmethod
    def _crossed(start: int, end: int, interval: int) -> bool:
        return bool(interval) and end // interval > start // interval

    def _report(self, step, target, metrics, num_steps, seconds) -> None:
        steps_per_sec = num_steps / seconds if seconds else 0.0
        logger.info(
            "train step %d/%d  %s  %.1f steps/s  %.0f examples/s",
            step, target, _format_metrics(metrics),
            steps_per_sec, steps_per_sec * self.global_batch_size,
        )
        if self.train_summaries and self._crossed(step - num_steps, step, self.summary_interval):
            scalars = {k: v for k, v in metrics.items() if k != "examples"}
            scalars["steps_per_second"] = steps_per_sec
            scalars["examples_per_second"] = steps_per_sec * self.global_batch_size
            self.train_summaries.write(step, scalars)
