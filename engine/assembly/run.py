"""One run, end to end: the library function behind `bin/train`.

The order is the point. Everything that can be wrong with the request is
checked first (`engine.assembly.plan`), so a mistake costs one line and leaves no
directory behind; only then is anything built, and `model_dir` locked (and
so created) before anything is written to it::

    plan = make_plan(config)                     # checks only; writes nothing
    strategy = plan.spec.build(...)              # logical CPUs were made first
    take model_dir's lock (engine.run_dir.run_lock)      # one writer; model_dir comes into being
    the chief: damaged checkpoints to damaged/, the state file rewritten,
               stale ckpt-*_temp/ removed        # engine.run_dir.checkpoint_files
               stale export/.<step>.tmp-*/ removed  # engine.run_dir.export
    with strategy.scope(): task.build_model(), objectives and optimizers, global_step
                                                 # engine.assembly.parts
    Runner(plan, parts).run_mode()               # engine.assembly.runner: its build steps
      build_checkpointing, (build_clock, the trainer,) build_actions,
      build_controller, the same for every mode, then the mode:
      train, train_and_evaluate   restore or warm-start; trainer (skipping the batches
                                  already trained on); Controller.train; export
      evaluate                    restore; Controller.evaluate once (reads only)
      continuous_evaluate         the evaluator task: each new checkpoint as it appears
    metrics.json: "running", then how it ended

A mistake found after the lock (the model, the data, the step's contract)
removes the `model_dir` the run created: a user error still leaves nothing
written. Which strategy runs is the spec's business (`engine.strategies`):
nothing here asks for a strategy by name.
"""


from __future__ import annotations

import dataclasses
import logging
import posixpath
from typing import Callable, Optional

import keras
import tensorflow as tf

from tfloop.engine import task as task_lib
from tfloop.engine.strategies import adoption
from tfloop.engine.assembly import parts, serving
from tfloop.engine.assembly.plan import Plan, make_plan
from tfloop.engine.assembly.runner import Hooks, Runner, RunResult, exit_class
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError, ExportFailure
from tfloop.engine.loop import actions
from tfloop.engine.recipe import keras_bridge
from tfloop.engine.recipe import objectives as objectives_lib
from tfloop.engine.run_dir import checkpoint_files, checkpointing, export, run_lock
from tfloop.engine.runtime import logs, script_exit
from tfloop.engine.task import ClassificationTask, Task
from tfloop.engine.task import compiled_model

logger = logging.getLogger(__name__)

__all__ = ["RunResult", "export_checkpoint", "run"]


def run(
    config: RunConfig,
    *,
    task: Optional[Task] = None,
    optimizer: Optional[keras.optimizers.Optimizer] = None,
    on_loop_end: Optional[Callable[[int, dict], None]] = None,
    verbose: bool = False,
    add_actions: Optional[Callable[..., actions.RunActions]] = None,
    strategy: Optional[tf.distribute.Strategy] = None,
) -> RunResult:
    """Trains and/or evaluates as `config` says; returns what metrics.json holds.

    `task` (`engine.task.Task`) supplies the model, data and loss; without
    one, `--task` names it, else the built-in `--model`/`--dataset`
    classification runs (`ClassificationTask.from_config(config, model_fn=,
    loss_fn=)` swaps its model or loss).
    `optimizer`, a Keras optimizer object, replaces `--optimizer` and
    `--learning_rate` (a task's `build_optimizer` or objectives may name
    their own); that instance trains, with all it holds. Made outside
    `strategy.scope()` (no need to make it inside), its variables are remade
    in the scope on the same object (`engine.recipe.objectives`); a built
    one is refused. `on_loop_end(step, metrics)` is called after every train loop (e.g. by
    the training benchmark, to time loops from outside). `verbose` prints
    the progress lines `bin/train` prints (`engine.runtime.logs.configure_logging`).
    `add_actions(plan=, strategy=, model=)`, called once the model is built,
    returns `engine.loop.actions.RunActions` to run beside the engine's own
    (`engine.keras_fit` drives Keras callbacks with it).
    `strategy`, one the script made (the tutorials' `MirroredStrategy()`,
    `MultiWorkerMirroredStrategy()`), is run on as it is instead of one the
    engine builds (`engine.strategies.adoption`: `config.strategy` and
    `config.devices` must name it; `fit` sets them from a model it adopts).

    In a `TF_CONFIG` cluster only the chief writes to `model_dir`; the other
    workers save into temporary directories (saving is collective) that are
    removed at the end, and an `evaluator` task evaluates each new checkpoint.

    Raises:
      ConfigError (or the refusing package's InputError, ModelError,
        CollectiveError, TFConfigError): the request cannot be carried out
        (nothing was written).
      Preempted: on SIGTERM or Ctrl-C, after saving a checkpoint at the step reached.
      RunFailure: a checkpoint could not be saved (a full disk), or, as
        ClusterFailure, a multi-worker peer was lost mid-run, or, as
        UnrecoverableFailure, the collectives failed in a way a restart cannot fix.
      KeyboardInterrupt: on a second Ctrl-C, without saving.

    Left unhandled in a script (`python train.py`), `Preempted` and the
    `RunFailure`s end it with one line and their exit status, as `bin/train`
    (`engine.runtime.script_exit`, installed by the first call).
    """
    script_exit.install()  # a script's SIGTERM, lost peer, ...: one line, exit 143, 138, ...
    if verbose:
        logs.configure_logging()
    with script_exit.signals_of_a_script():  # a script's SIGTERM at any moment: one line, 143
        return _run(config, task=task, optimizer=optimizer,
                    hooks=Hooks(on_loop_end=on_loop_end, add_actions=add_actions),
                    adopted=strategy)


def _run(config: RunConfig, *, task: Optional[Task],
         optimizer: Optional[keras.optimizers.Optimizer], hooks: Hooks,
         adopted: Optional[tf.distribute.Strategy] = None) -> RunResult:
    """`run` once the script's signals are set."""
    task = _task_for(config, task)
    if adopted is not None:
        adoption.check_agrees(adoption.adopted_placement(adopted), strategy=config.strategy,
                              devices=config.devices, strategy_given=True, devices_given=True)
    plan = make_plan(config, task, adopted=adopted is not None)
    config = plan.config  # with what the plan resolved: --epochs, --per_replica_batch_size
    if plan.spec.serves_only(plan.role):
        # Until stopped: the chief trains. The server blocks in C++, where no
        # Python handler runs: SIGTERM keeps the action it had (no wait for SIGKILL).
        with script_exit.default_sigterm():
            return RunResult(plan.spec.serve(plan.role))
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Before the lock (which creates model_dir): joining a cluster can end in
    # the watchdog's signal (engine.runtime.watchdog), which leaves no chance to clean up.
    strategy = _build_strategy(plan, adopted)
    lock = run_lock.acquire(config.model_dir, plan.lock) if plan.lock else None
    try:
        with exit_class(plan, checkpoint=lambda: plan.latest_checkpoint):
            return _run_planned(plan, strategy, optimizer=optimizer, lock=lock, hooks=hooks)
    except BaseException:
        if lock is not None:
            lock.discard()  # removes model_dir if this run created it and never trained
        raise
    finally:
        if lock is not None:
            lock.release()


def _run_planned(plan: Plan, strategy: tf.distribute.Strategy, *,
                 optimizer: Optional[keras.optimizers.Optimizer], hooks: Hooks,
                 lock: Optional[run_lock.RunLock]) -> RunResult:
    """`run` once the plan holds, the strategy is built and this process
    holds its lock: the chief tidies model_dir, the parts every mode needs
    are built, and the runner runs the plan's mode."""
    config = plan.config
    if plan.lock == run_lock.TRAIN and plan.checkpoints is not None:
        checkpoint_files.set_aside(plan.checkpoints)
        checkpoint_files.remove_stale_temp(config.model_dir)
        export.remove_stale_staging(config.model_dir)
    built = parts.build_parts(plan, strategy, optimizer)
    try:
        return Runner(plan, built, hooks=hooks, lock=lock).run_mode()
    finally:  # the user's optimizers reduce their own gradients again (Keras's fit after)
        objectives_lib.release(built.objectives)


def export_checkpoint(config: RunConfig, *, step: Optional[int] = None,
                      task: Optional[Task] = None) -> str:
    """`bin/export`: writes `model_dir/export/<step>/` from checkpoint `step`
    (the latest when None) of the run `config` describes, on one device.

    Raises:
      ConfigError: no such checkpoint, or `config` contradicts the run.
    """
    config = dataclasses.replace(config, strategy="default", devices="cpu:0", mode="train")
    task = _task_for(config, task)
    path = serving.checkpoint_at(config.model_dir, step)
    plan = make_plan(config, task)
    strategy = _build_strategy(plan)
    model, _, global_step = parts.build_model_and_objectives(plan, strategy)
    if checkpointing.restore_for_inference(model, global_step, path):
        logger.info("exporting the moving average of the weights that %s holds", path)
    try:
        return serving.export_trained(plan, strategy, model, int(global_step.numpy()))
    except ExportFailure as failure:
        raise ExportFailure(f"{failure}; {posixpath.basename(path)} is intact: {failure.fix} "
                            "and export again", fix=failure.fix) from None


def _task_for(config: RunConfig, task: Optional[Task]) -> Task:
    if task is None and config.task:
        task = task_lib.load(config.task, config, from_function=_compiled_model_task)
    elif task is not None and config.task:
        raise ConfigError(f"run() got a task and --task={config.task}; give one")
    if task is None:
        return ClassificationTask.from_config(config)
    if not isinstance(task, Task):
        raise ConfigError(f"task must be a tfloop Task (subclass tfloop.engine.task.Task), "
                          f"got {type(task).__name__}")
    return task


def _compiled_model_task(model_fn: Callable, config: RunConfig) -> Task:
    """`--task=module:function`: the Keras model the function builds and
    compiles, trained on the built-in `--dataset` (`engine.task.compiled_model`)."""
    return compiled_model.CompiledClassificationTask.for_function(
        model_fn, config, mean_fn=keras_bridge.per_example_metric_fn)


def _build_strategy(plan: Plan,
                    adopted: Optional[tf.distribute.Strategy] = None) -> tf.distribute.Strategy:
    strategy = adopted or plan.spec.build(
        plan.devices, sections=plan.sections, role=plan.role, connection=plan.connection,
        implementation=plan.implementation)
    logger.info(plan.describe(strategy.num_replicas_in_sync))
    return strategy


