"""The run's runner: built once, in order, then run (Model Garden's `OrbitExperimentRunner`).

`engine.assembly.run.run` checks the request (`make_plan`), builds the
strategy and the parts every mode needs (`engine.assembly.parts`), then::

    Runner(plan, parts, hooks=, lock=).run_mode()
      train, train_and_evaluate:
        checkpoints = build_checkpointing(write_dir)   # the manager; the newest checkpoint restored
        clock       = build_clock()                    # engine.observe.clock: times the loops
        trainer     = plan.spec.build_trainer(..., clock=clock)  # skips the batches trained on
        actions     = build_actions(trainer, checkpoints)  # both lists, in their final order
        controller  = build_controller(trainer, checkpoints, actions)
        Controller.train to the last step; export; metrics.json says how it ended
      evaluate: build_checkpointing(None, the newest) (reads only); Controller.evaluate once
      continuous_evaluate (the evaluator task): the same three steps, for its
        role (a checkpoint of the model and step, no manager, no stop
        request: a signal stops it at once); each new checkpoint as it appears

The checkpoint a run restores is handed to `build_checkpointing` as a value:
the plan's, or in a cluster with `--local_checkpoint_dir` the newer local
one every worker holds (`_agreed_checkpoint`, a collective).

Each step builds its piece whole: nothing is patched after it is built, and
no piece reads one that does not exist yet (the hang watch gets the
Controller at `Watchers.start`). `metrics.json`'s progress is an action
(`actions.RecordProgress`), told of each checkpoint by the Controller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import posixpath
import shutil
import signal
import time
from typing import Any, Callable, Optional

import tensorflow as tf

from tfloop.engine.assembly import serving
from tfloop.engine.assembly.parts import Parts
from tfloop.engine.assembly.plan import Plan
from tfloop.engine.errors import ExportFailure
from tfloop.engine.loop import actions, best, preemption
from tfloop.engine.loop.contracts import AbstractTrainer
from tfloop.engine.loop.controller import Controller
from tfloop.engine.loop.summaries import SummaryWriter
from tfloop.engine.observe import clock, step_time
from tfloop.engine.observe.watchers import Watchers
from tfloop.engine.recipe import ema
from tfloop.engine.recipe import objectives as objectives_lib
from tfloop.engine.run_dir import (checkpointing, layout, local_checkpoints, run_identity,
                                   run_lock, run_record, warm_start)
from tfloop.engine.runtime import devices
from tfloop.engine.task import Task
from tfloop.engine.task import failures as task_failures
from tfloop.inputs import data_errors

#: The run's one logger (`engine.assembly.run`'s): users and tests filter by its name.
logger = logging.getLogger("tfloop.engine.assembly.run")


class RunResult(dict):
    """What `run()` returns: the metrics.json record (a dict, as before), and
    for a caller that goes on in Python:

    Attributes:
      model: the trained model, holding the weights that were evaluated and
        exported: with `--ema_decay`, their moving average.
      raw_weights: with `--ema_decay`, the trained weights themselves, by
        variable path (`{"sequential/dense/kernel": array}`); None without.
      history: every train loop and evaluation of this call, in order:
        `{"kind": "train" | "eval", "step": N, "loss": ..., <metric>: ...}`
        (the record itself keeps only the last of each).
      task: the task that ran.
    """

    def __init__(self, record: dict, *, model: Any = None, task: Optional[Task] = None,
                 history: Optional[list] = None, raw_weights: Optional[dict] = None):
        super().__init__(record)
        self.model = model
        self.task = task
        self.history = list(history or [])
        self.raw_weights = raw_weights


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What a caller of `run()` adds to the engine's own actions.

    Attributes:
      on_loop_end: `hook(step, metrics)` after every train loop.
      add_actions: `add_actions(plan=, strategy=, model=) -> actions.RunActions`,
        called once for a run that trains (`engine.keras_fit`'s callbacks).
    """

    on_loop_end: Optional[actions.LoopHook] = None
    add_actions: Optional[Callable[..., actions.RunActions]] = None


@dataclasses.dataclass(frozen=True)
class Checkpoints:
    """What `build_checkpointing` makes: the run's checkpoint, its manager
    (None: the run only reads), the checkpoint restored (None: none) and the
    step the run starts from."""

    checkpoint: tf.train.Checkpoint
    manager: Optional[checkpointing.Manager]
    restored: Optional[str]
    start_step: int


@dataclasses.dataclass(frozen=True)
class LoopActions:
    """What `build_actions` makes: the Controller's two lists in their final
    order, and the pieces the run starts, reads back or closes."""

    train: list[actions.Action]
    eval: list[actions.Action]
    stop_request: Optional[preemption.StopRequest]
    writers: tuple[Optional[SummaryWriter], Optional[SummaryWriter]]
    watchers: Optional[Watchers] = None
    keep_best: Optional[best.KeepBest] = None
    progress: Optional[actions.RecordProgress] = None
    #: The local checkpoints' saver (`--local_checkpoint_dir`), which a finished training removes.
    local_saver: Optional[local_checkpoints.Saver] = None

    def close(self, controller: Controller) -> None:
        """The signal handlers back, the watchers stopped, the writers closed."""
        if self.stop_request is not None:
            self.stop_request.uninstall()
        if self.watchers is not None:
            self.watchers.finish(controller)
        for writer in self.writers:
            if writer is not None:
                writer.close()


@dataclasses.dataclass
class _Ending:
    """How the loops ended, for metrics.json: `status` stays "failed" unless told otherwise."""

    began: float
    status: str = "failed"
    exported: Optional[str] = None
    exporting: bool = False

    def stopped_by(self, error: BaseException, model_dir: str) -> None:
        if isinstance(error, KeyboardInterrupt):  # a second Ctrl-C (or one during the export)
            logger.info("stopped %s; the last checkpoint is %s",
                        "during the export, which was not written" if self.exporting
                        else "without saving", tf.train.latest_checkpoint(model_dir) or "none")
        if isinstance(error, preemption.Preempted) or not isinstance(error, Exception):
            self.status = "interrupted"  # a signal (bin/cli turns one into an exception)


def exit_class(plan: Plan, *, step: Optional[Callable[[], int]] = None,
               checkpoint: Callable[[], Optional[str]],
               running: Optional[Callable[[], tuple]] = None):
    """`task_failures.exit_class` for this run's role and strategy: every stage
    of `run` runs under it. Before the loop runs (`step` None), a peer lost
    while the model, the checkpoint restore, the datasets or the trainer are
    built (the survivor's collective reports `UnavailableError ... Collective
    ops is aborted`, in the engine's code or a task method's) is the same
    event as a peer lost mid-run: one line and the retryable class, not a
    traceback and 1, nor a task's mistake and 2. `running()` gives the
    Controller's phase and steps, by which a mid-run `OpError` is traced to
    the task (`task_failures.explain`)."""
    return task_failures.exit_class(
        plan.role.name, step=step, checkpoint=checkpoint,
        lost_peer_errors=plan.spec.lost_peer_errors,
        unrecoverable_errors=plan.spec.unrecoverable_errors,
        explain_task=task_failures.explainer(plan.task, running, plan.config.model_dir)
        if running is not None else None)


class Runner:
    """One run's assembly: the plan, its parts and the caller's hooks, built
    by the same steps for every mode and run in the plan's mode (see the
    module docstring).

    Args:
      plan: the checked request (`engine.assembly.plan.make_plan`).
      parts: the model, objectives, evaluator, ... (`engine.assembly.parts`).
      hooks: what the caller adds (`Hooks`).
      lock: `model_dir`'s lock, kept once the run starts writing; None: none taken.
    """

    def __init__(self, plan: Plan, parts: Parts, *, hooks: Hooks = Hooks(),
                 lock: Optional[run_lock.RunLock] = None):
        self.plan, self.parts, self.hooks, self.lock = plan, parts, hooks, lock
        self.run_dir = layout.RunDir(plan.config.model_dir, plan.config.summaries_dir or None)
        #: RunResult.history: filled by the History actions.
        self.history: list = []

    # --- The modes. ---

    def run_mode(self) -> RunResult:
        """Runs the plan's mode (`MODES`: config.RUN_MODES, one method each)."""
        return MODES[self.plan.mode](self)

    def train(self) -> RunResult:
        """`train` and `train_and_evaluate`: resume or warm-start, train to the
        last step (evaluating between loops in the latter), export."""
        plan, parts = self.plan, self.parts
        config, role = plan.config, plan.role
        # Workers other than the chief take part in saving, into a directory of their own.
        write_dir = (config.model_dir if role.is_chief
                     else checkpointing.worker_save_dir(config.model_dir, role.name))
        checkpoints = self.build_checkpointing(write_dir, self._agreed_checkpoint())
        start_step = checkpoints.start_step
        trainer = plan.spec.build_trainer(
            plan.for_trainer, strategy=parts.strategy, model=parts.model, objectives=parts.objectives,
            global_step=parts.global_step, start_step=start_step, task=parts.task,
            average=parts.average, clock=self.build_clock())
        objectives_lib.announce(parts.objectives, start_step=start_step,
                                resumed=bool(checkpoints.restored))
        if self.lock is not None:
            self.lock.keep()  # training starts: what model_dir gets from here on is the run's
        export_final = (functools.partial(self._export_final, checkpoints.manager)
                        if config.export else None)
        try:
            with data_errors.naming():  # damaged data mid-run: one line naming the file
                record = self.run_loops(trainer, checkpoints, drive=self._train_to_the_end,
                                        export_final=export_final)
        finally:
            if not plan.role.is_chief:
                shutil.rmtree(write_dir, ignore_errors=True)
        return self._result(record)

    def evaluate(self) -> RunResult:
        """`--mode=evaluate`: the newest checkpoint, evaluated once; reads only
        (no checkpoint manager), and adds to evaluations.json."""
        checkpoints = self.build_checkpointing(None, self.plan.latest_checkpoint)
        if self.lock is not None:
            self.lock.keep()
        with data_errors.naming():
            record = self.run_loops(
                None, checkpoints,
                drive=lambda controller, _: controller.evaluate(self.plan.config.eval_steps))
        return self._result(record)

    def continuous_evaluate(self) -> RunResult:
        """The evaluator task of a cluster (the sidecar evaluator): evaluates
        every new checkpoint in `model_dir` as it appears, writes
        `summaries/eval` beside the chief's and adds to evaluations.json, and
        returns after the checkpoint of step `train_steps` (or after
        `eval_timeout` seconds with no new checkpoint). With `--best_metric`
        it keeps the best in `model_dir/best/` (the model and the step: an
        evaluator restores no optimizer). Its eval data failing mid-run is
        one line (`engine.task.failures`). Built by the same steps as every
        mode; its record is the last evaluation's, not metrics.json's."""
        config, parts = self.plan.config, self.parts
        if self.lock is not None:
            self.lock.keep()
        checkpoints = self.build_checkpointing(None, None)  # each one restored as it appears
        loop = self.build_actions(None, checkpoints)
        controller = self.build_controller(None, checkpoints, loop)
        try:
            with task_failures.exit_class(
                    "evaluator", step=lambda: controller.step,
                    checkpoint=lambda: tf.train.latest_checkpoint(config.model_dir),
                    explain_task=task_failures.explainer(parts.task, controller.phase,
                                                         config.model_dir)):
                last = controller.evaluate_continuously(
                    config.eval_steps, timeout=config.eval_timeout, last_step=config.train_steps,
                    restore=functools.partial(_restore_averages_if_any, parts.model,
                                              parts.global_step),
                    directory=config.model_dir)
        finally:
            loop.close(controller)
        return RunResult({"step": controller.step, **{f"eval/{k}": v for k, v in last.items()},
                          "best": loop.keep_best.record if loop.keep_best else None},
                         model=parts.model, task=parts.task, history=self.history)

    # --- The build steps, the same for every mode. ---

    def build_checkpointing(self, write_dir: Optional[str],
                            restore_from: Optional[str]) -> Checkpoints:
        """The checkpoint and its manager saving into `write_dir` (None: the
        run reads only), `restore_from` restored (or, for a fresh run,
        `--init_from`'s weights). The evaluator task's checkpoint holds the
        model and the step only (an evaluator restores no optimizer), each
        checkpoint restored as it appears: nothing restored here."""
        plan, parts = self.plan, self.parts
        config = plan.config
        if plan.role.is_evaluator:
            return Checkpoints(
                checkpoint=tf.train.Checkpoint(
                    model=parts.model, global_step=parts.global_step,
                    model_weights=checkpointing.named_weights(parts.model)),
                manager=None, restored=None, start_step=int(parts.global_step.numpy()))
        pieces = checkpointing.parts(parts.model, objectives_lib.checkpointed(parts.objectives),
                                   parts.global_step)
        checkpoint, manager = checkpointing.create(
            model=parts.model, optimizer=pieces["optimizer"], global_step=parts.global_step,
            directory=write_dir, max_to_keep=config.max_checkpoints if plan.role.is_chief else 1,
            averages=parts.average.averages if parts.average else None,
            extra=parts.task.checkpointed())
        restored = _restore(plan, restore_from, checkpoint, pieces, parts.average)
        start_step = int(parts.global_step.numpy())
        if restored:
            logger.info("resuming from %s at step %d%s", restored, start_step,
                        f" (ignoring --init_from={config.init_from})" if config.init_from else "")
        elif write_dir is not None and config.init_from:
            logger.info("starting from the %s", warm_start.load_initial_weights(
                parts.model, config.init_from, skip_mismatch=config.init_from_skip_mismatch))
            if parts.average is not None:
                parts.average.reset()  # the average starts from the weights training starts from
        return Checkpoints(checkpoint=checkpoint, manager=manager, restored=restored,
                           start_step=start_step)

    def build_clock(self) -> Optional[clock.SampledClock]:
        """The clock that times the trainer's loops (`engine.observe.clock`),
        handed to `build_trainer`; None where the loops run on other machines
        (`StrategySpec.loop_runs_here`: parameter_server's). The straggler
        table compares every loop's own time of each worker: a multi-worker
        cluster with `--straggler_threshold` samples every loop. The run's
        last step tells it whether a run on CPUs is short."""
        plan = self.plan
        if not plan.spec.loop_runs_here:
            return None
        in_cluster = plan.role.num_workers > 1
        return clock.for_run(
            self.parts.strategy, precision=plan.config.mixed_precision,
            compares_every_loop=bool(plan.spec.compares_workers and in_cluster
                                     and plan.config.straggler_threshold),
            in_cluster=in_cluster, target_step=plan.config.train_steps)

    def build_actions(self, trainer: Optional[AbstractTrainer],
                      checkpoints: Checkpoints) -> LoopActions:
        """Both action lists in their final order (`engine.loop.actions`):

            train: metrics.json progress, History, Profile, TrainProgress,
                   TrainSummaries, step time, the caller's hook, the caller's
                   actions, the watchers, local checkpoints, the stop request
            eval:  History, EvalProgress, EvalSummaries, evaluations.json
                   (a run that only evaluates), the caller's, the best checkpoint

        History first, so a loop that stops the run is in the history; the
        stop request last, so a stopping run has logged its last loop; the
        best checkpoint last, as it may stop training. The chief writes the
        summaries, the evaluator task its `summaries/eval`."""
        plan, config, role = self.plan, self.plan.config, self.plan.role
        chief = role.is_chief
        writers = (SummaryWriter(self.run_dir.summaries("train")) if chief else None,
                   SummaryWriter(self.run_dir.summaries("eval"))
                   if chief or role.is_evaluator else None)
        stop_request = self._stop_request(trainer)
        progress = self._progress(checkpoints) if chief and trainer is not None else None
        watchers = (Watchers(run=plan.watched, strategy=self.parts.strategy, trainer=trainer,
                             train_summaries=writers[0], eval_summaries=writers[1],
                             start_step=checkpoints.start_step, run_dir=self.run_dir)
                    if trainer is not None else None)
        extra = self._caller_actions(trainer)
        local_saver = self._local_saver(trainer, checkpoints)
        train = [
            *([progress] if progress else []),
            actions.History("train", self.history),
            *([actions.Profile(steps=config.profile_range,
                               logdir=self.run_dir.summaries("train") if chief else None)]
              if config.profile_range is not None else []),
            actions.TrainProgress(global_batch_size=config.global_batch_size,
                                  steps_per_epoch=config.steps_per_epoch, epochs=config.epochs),
            actions.TrainSummaries(writer=writers[0], interval=config.summary_interval,
                                   global_batch_size=config.global_batch_size),
            *self._step_time(trainer, writers[0]),
            *([actions.OnLoopEnd(self.hooks.on_loop_end)] if self.hooks.on_loop_end else []),
            *extra.train,
            *(watchers.actions if watchers else []),
            *([actions.SaveLocal(saver=local_saver, interval=config.local_checkpoint_interval,
                                 durable_interval=config.checkpoint_interval)]
              if local_saver is not None else []),
            *([actions.StopOnSignal(request=stop_request, checkpoint_manager=checkpoints.manager)]
              if stop_request is not None else []),
        ]
        keep_best = self._keep_best(checkpoints)
        evaluations = [actions.History("eval", self.history), *actions.for_evaluation(
            writers[1], self._record_evaluations(trainer)), *extra.eval,
            *([keep_best] if keep_best else [])]
        return LoopActions(train=train, eval=evaluations, stop_request=stop_request,
                           writers=writers, watchers=watchers, keep_best=keep_best,
                           progress=progress, local_saver=local_saver)

    def build_controller(self, trainer: Optional[AbstractTrainer], checkpoints: Checkpoints,
                         loop: LoopActions) -> Controller:
        """The outer loop over the trainer, the evaluator and the actions."""
        config = self.plan.config
        return Controller(
            global_step=self.parts.global_step, trainer=trainer, evaluator=self.parts.evaluator,
            steps_per_loop=config.steps_per_loop, checkpoint_manager=checkpoints.manager,
            checkpoint_interval=config.checkpoint_interval,
            train_actions=loop.train, eval_actions=loop.eval)

    # --- Running the loops. ---

    def run_loops(self, trainer: Optional[AbstractTrainer], checkpoints: Checkpoints, *,
                  drive: Callable[[Controller, LoopActions], Any],
                  export_final: Optional[Callable[[], Optional[str]]] = None) -> dict:
        """Runs the loops (`drive(controller, actions)`: the mode's train or evaluate
        calls; `trainer` None for a run that only evaluates), then
        `export_final` (the end-of-training export). metrics.json says
        "running" (the step of the last checkpoint) until it says how the run
        ended: `finished` only once the export is written too (`export`: its
        path, None without one), `failed` or `interrupted` when the export
        failed or a signal stopped it (the final checkpoint is saved then, and
        the same command writes the export)."""
        if self.plan.role.is_chief:
            self._prepare_model_dir(trainer is not None, checkpoints.start_step)
        loop = self.build_actions(trainer, checkpoints)
        controller = self.build_controller(trainer, checkpoints, loop)
        ending = _Ending(began=time.time())
        if loop.watchers is not None:
            loop.watchers.start(controller)
        try:
            with exit_class(self.plan, step=lambda: controller.step,
                            checkpoint=lambda: tf.train.latest_checkpoint(
                                self.plan.config.model_dir), running=controller.phase):
                drive(controller, loop)
                if export_final is not None:
                    self._export_at_the_end(controller, loop, export_final, ending)
            ending.status = "stopped_early" if controller.stopped_early else "finished"
        except BaseException as error:
            ending.stopped_by(error, self.plan.config.model_dir)
            raise
        finally:
            loop.close(controller)
            summary = self._record(controller, checkpoints, loop, ending,
                                   writes=loop.progress is not None)
        return summary

    def _export_at_the_end(self, controller: Controller, loop: LoopActions,
                           export_final: Callable[[], Optional[str]], ending: _Ending) -> None:
        """A signal during the last loop, the final evaluation or save: the
        checkpoint is saved; the export is left to the same command rather
        than started in a preemption's grace period (agreed by every worker:
        the export is collective). From here a signal stops the export at
        once (bin/train: exit 130/143), for the same reason."""
        if loop.stop_request.agreed():
            manager = controller.checkpoint_manager
            raise preemption.Preempted(controller.step,
                                       manager.latest_checkpoint if manager else None,
                                       loop.stop_request.signum or signal.SIGTERM)
        loop.stop_request.uninstall()
        ending.exporting = True
        ending.exported = export_final()
        ending.exporting = False

    def _record(self, controller: Controller, checkpoints: Checkpoints, loop: LoopActions,
                ending: _Ending, *, writes: bool) -> dict:
        """The run's record (`run_record.summarize`); the chief that trains writes it."""
        saved_step, saved = (loop.progress.last if loop.progress is not None
                             else (checkpoints.start_step, checkpoints.restored))
        summary = run_record.summarize(
            self.plan, controller.outcome(),
            num_replicas=self.parts.strategy.num_replicas_in_sync,
            restored=checkpoints.restored, start_step=checkpoints.start_step,
            status=ending.status, saved_step=saved_step, checkpoint=saved,
            wall_seconds=time.time() - ending.began,
            best=loop.keep_best.record if loop.keep_best else None, export=ending.exported)
        if writes:
            layout.write_final(self.run_dir.metrics_json, summary,
                               failing=ending.status not in ("finished", "stopped_early"))
        return summary

    def _train_to_the_end(self, controller: Controller, loop: LoopActions) -> None:
        """The train modes' loops: to the last step, evaluating every
        `--eval_interval` steps in `train_and_evaluate`; then the local
        checkpoints are removed (`loop.local_saver`)."""
        config, start_step = self.plan.config, controller.step
        if start_step >= config.train_steps and start_step == 0:
            logger.info("train_steps=0: nothing to train")
        elif start_step >= config.train_steps:
            # A warning, not an info line: in a notebook, running the same cell
            # again trains nothing, and must say so without verbose=True.
            target = (f"epochs={config.epochs}, step {config.train_steps}" if config.epochs
                      else f"train_steps={config.train_steps}")
            logger.warning(
                "%s already holds step %d (%s): nothing to train; to train more raise "
                "train_steps%s (it resumes from step %d), to start fresh give another model_dir",
                config.model_dir, start_step, target, " or epochs" if config.epochs else "",
                start_step)
        controller.train(
            config.train_steps,
            eval_interval=(config.eval_interval or config.train_steps)
            if self.plan.mode == "train_and_evaluate" else 0,
            eval_steps=config.eval_steps)
        if loop.local_saver is not None:  # trained to the end, the final checkpoint saved
            loop.local_saver.finish()

    # --- Small pieces of the steps. ---

    def _prepare_model_dir(self, trains: bool, start_step: int) -> None:
        """The chief's model_dir, and for a run that trains its run.json."""
        plan, config = self.plan, self.plan.config
        tf.io.gfile.makedirs(config.model_dir)
        if not trains:
            return
        numerics = devices.numerics(plan.intra_op_threads)
        if config.deterministic and start_step > 0:
            differ = run_identity.numerics_differ(plan.run_json, numerics)
            if differ:
                logger.warning(differ)
        run_identity.write(config, plan.run_json, start_step=start_step, numerics=numerics,
                           batching=plan.batching, run_id_if_new=plan.run_id)

    def _agreed_checkpoint(self) -> Optional[str]:
        """The checkpoint a training run restores: the plan's newest durable
        one, or in a cluster with `--local_checkpoint_dir` the newer local
        checkpoint every worker holds (agreed: every worker calls it)."""
        plan = self.plan
        config, role = plan.config, plan.role
        if not (role.in_cluster and config.local_checkpoint_dir):
            return plan.latest_checkpoint
        return local_checkpoints.newer_on_every_worker(
            config.loop, role.name, self.parts.strategy, plan.latest_checkpoint,
            run_id=run_identity.run_id(plan.run_json)) or plan.latest_checkpoint

    def _progress(self, checkpoints: Checkpoints) -> actions.RecordProgress:
        record = functools.partial(run_record.running, self.plan,
                                   start_step=checkpoints.start_step,
                                   restored=checkpoints.restored)
        return actions.RecordProgress(
            path=self.run_dir.metrics_json,
            record=lambda step, checkpoint: record(step=step, checkpoint=checkpoint),
            step=checkpoints.start_step, checkpoint=checkpoints.restored)

    def _stop_request(self, trainer: Optional[AbstractTrainer]) -> Optional[preemption.StopRequest]:
        """What a signal asks of the loops, installed: one process stops at the
        step it arrives in, a cluster at a loop's end, agreed. None for the
        evaluator task, which a signal stops at once (it saves nothing)."""
        if self.plan.role.is_evaluator:
            return None
        return (preemption.StopRequest(self.parts.strategy) if self.plan.spec.agrees_to_stop
                else preemption.StopRequest(
                    stop_step=trainer.request_stop if trainer is not None else None)).install()

    def _caller_actions(self, trainer: Optional[AbstractTrainer]) -> actions.RunActions:
        """The caller's own actions (`Hooks.add_actions`), for a run that trains."""
        if self.hooks.add_actions is None or trainer is None:
            return actions.RunActions(train=[], eval=[])
        return self.hooks.add_actions(plan=self.plan, strategy=self.parts.strategy,
                                      model=self.parts.model)

    def _step_time(self, trainer: Optional[AbstractTrainer],
                   writer: Optional[SummaryWriter]) -> list[actions.Action]:
        """Where the time goes (`engine.observe.step_time`), where the trainer's clock times."""
        report = step_time.for_trainer(trainer, writer=writer,
                                       interval=self.plan.config.summary_interval)
        return [report] if report is not None else []

    def _local_saver(self, trainer: Optional[AbstractTrainer],
                     checkpoints: Checkpoints) -> Optional[local_checkpoints.Saver]:
        """Fast local checkpoints (`--local_checkpoint_dir`), for a run that trains."""
        config, role, manager = self.plan.config, self.plan.role, checkpoints.manager
        if trainer is None or manager is None:
            return None
        return local_checkpoints.create(config.loop, manager.checkpoint, self.parts.global_step,
                                        role.name if role.in_cluster else "",
                                        run_id=self.plan.run_id)

    def _record_evaluations(
            self, trainer: Optional[AbstractTrainer]) -> Optional[actions.RecordEvaluation]:
        """A run that only evaluates adds to evaluations.json, beside the
        training record: `--mode=evaluate`'s chief, and the evaluator task."""
        role = self.plan.role
        if trainer is not None or not (role.is_chief or role.is_evaluator):
            return None
        return actions.RecordEvaluation(path=self.run_dir.evaluations_json,
                                        by="evaluator" if role.is_evaluator else "--mode=evaluate")

    def _keep_best(self, checkpoints: Checkpoints) -> Optional[best.KeepBest]:
        """The best checkpoint's action where this process evaluates while it
        trains, or is the evaluator task (`best.check_request` refused the
        rest). The evaluator's keeps the model and the step it evaluated, and
        stops nothing (no patience: it trains nothing)."""
        config, plan = self.plan.config, self.plan
        if not config.best_metric:
            return None
        if self.parts.evaluator is None:
            logger.info("--best_metric=%s: the evaluator task keeps the best checkpoint",
                        config.best_metric)
            return None
        mode = best.resolve_mode(config.best_metric, config.best_mode)
        if plan.role.is_evaluator:
            return best.KeepBest(metric=config.best_metric, mode=mode,
                                 checkpoint=checkpoints.checkpoint, model_dir=config.model_dir,
                                 export_fn=self.parts.best_export)
        logger.info("keeping the best checkpoint by %s (%s%s) in %s%s", config.best_metric, mode,
                    ", by --best_mode=auto" if config.best_mode == "auto" else "",
                    best.best_dir(config.model_dir),
                    f"; stopping after {config.early_stopping_patience} evaluations without "
                    "improvement" if config.early_stopping_patience else "")
        manager = checkpoints.manager
        return best.KeepBest(
            metric=config.best_metric, mode=mode, checkpoint=manager.checkpoint,
            model_dir=config.model_dir, write_dir=manager.directory, is_chief=plan.role.is_chief,
            export_fn=self.parts.best_export, patience=config.early_stopping_patience,
            start_step=checkpoints.start_step)

    def _export_final(self, manager: Optional[checkpointing.Manager]) -> Optional[str]:
        """The end-of-training export (of the moving average with --ema_decay);
        a failed one says the checkpoints are intact and how to write it later."""
        parts = self.parts
        try:
            with parts.average.swapped() if parts.average else contextlib.nullcontext():
                return serving.export_trained(self.plan, parts.strategy, parts.model,
                                              int(parts.global_step.numpy()))
        except ExportFailure as failure:
            latest = manager.latest_checkpoint if manager else None
            raise ExportFailure(
                f"{failure}; the checkpoints are intact (the latest is "
                f"{posixpath.basename(latest) if latest else 'none'}): {failure.fix} and "
                "run the same command to write the export", fix=failure.fix) from None

    def _result(self, record: dict) -> RunResult:
        """The mode's record as `run()` returns it. With a moving average the
        model keeps the averaged weights from here on (what was evaluated and
        exported), and the raw ones come along as `raw_weights`."""
        parts, raw = self.parts, None
        if parts.average is not None:
            paths = {key: getattr(variable, "path", None) or variable.name
                     for key, variable in checkpointing.named_weights(parts.model).items()}
            raw = {paths.get(key, key): value for key, value in parts.average.adopt().items()}
        return RunResult(record, model=parts.model, task=parts.task, history=self.history,
                         raw_weights=raw)


#: Each run mode's method, selected once by `Runner.run_mode` from the plan's
#: mode (config.RUN_MODES: --mode's values, and the evaluator task's own).
MODES: dict[str, Callable[[Runner], RunResult]] = {
    "train": Runner.train, "train_and_evaluate": Runner.train, "evaluate": Runner.evaluate,
    "continuous_evaluate": Runner.continuous_evaluate}


def _restore(plan: Plan, path: Optional[str], checkpoint: tf.train.Checkpoint, parts: dict,
             average: Optional[ema.WeightAverage]) -> Optional[str]:
    """Restores checkpoint `path`, if any, whether or not it holds the
    moving averages this run keeps."""
    model_dir = plan.config.model_dir
    holds_averages = checkpointing.holds(path, checkpointing.AVERAGES)
    if path and average is not None and not holds_averages:
        restored = checkpointing.restore(tf.train.Checkpoint(**parts), path, model_dir)
        average.reset()
        logger.info("%s holds no moving averages: they start from its weights", path)
        return restored
    if path and average is None and holds_averages and plan.mode != "evaluate":
        logger.info("not continuing the moving averages %s holds (--ema_decay=0)", path)
        return checkpointing.restore(checkpoint, path, model_dir, partial=True)
    return checkpointing.restore(checkpoint, path, model_dir)


def _restore_averages_if_any(model: Any, global_step: tf.Variable, path: str) -> None:
    """The evaluator task's restore: the moving averages where a checkpoint holds them."""
    if checkpointing.restore_for_inference(model, global_step, path):
        logger.info("%s holds moving averages of the weights: evaluating those", path)
