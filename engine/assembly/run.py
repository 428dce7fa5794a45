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
    restore the latest checkpoint in model_dir   # "resuming from ckpt-N"
    the plan's mode, one function each (_MODES):
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

import contextlib
import dataclasses
import functools
import logging
import posixpath
import shutil
import signal
import time
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tfloop.engine.loop import actions, best, preemption
from tfloop.engine.observe import step_time
from tfloop.engine.run_dir import (checkpoint_files, checkpointing, export, layout,
                                   local_checkpoints, run_identity, run_lock, run_record)
from tfloop.engine.runtime import devices, logs, script_exit
from tfloop.engine.recipe import ema, precision
from tfloop.engine.recipe import objectives as objectives_lib
from tfloop.engine.assembly import serving
from tfloop.engine.task import failures as task_failures
from tfloop.engine.run_dir import warm_start
from tfloop.engine import task as task_lib
from tfloop.engine.keras_fit import compiled as keras_compiled
from tfloop.engine.loop import task_inputs
from tfloop.engine.config import RunConfig
from tfloop.engine.loop.controller import Controller
from tfloop.engine.errors import ConfigError, ExportFailure
from tfloop.engine.loop.evaluator import AveragedEvaluator, Evaluator
from tfloop.engine.assembly.plan import Plan, make_plan
from tfloop.engine.loop.summaries import SummaryWriter
from tfloop.engine.observe.watchers import Watchers
from tfloop.engine.task import ClassificationTask, Task
from tfloop.inputs import data_errors

logger = logging.getLogger(__name__)


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


def run(
    config: RunConfig,
    *,
    task: Optional[Task] = None,
    optimizer: Optional[keras.optimizers.Optimizer] = None,
    on_loop_end: Optional[Callable[[int, dict], None]] = None,
    verbose: bool = False,
    add_actions: Optional[Callable[..., actions.RunActions]] = None,
) -> RunResult:
    """Trains and/or evaluates as `config` says; returns what metrics.json holds.

    `task` (`engine.task.Task`) supplies the model, data and loss; without
    one, `--task` names it, else the built-in `--model`/`--dataset`
    classification runs (`ClassificationTask.from_config(config, model_fn=,
    loss_fn=)` swaps its model or loss).
    `optimizer`, a Keras optimizer object (made inside `strategy.scope()` is
    not needed: it builds its variables there), replaces `--optimizer` and
    `--learning_rate` (a task's `build_optimizer` or objectives may name
    their own). `on_loop_end(step, metrics)` is called after every train loop (e.g. by
    the training benchmark, to time loops from outside). `verbose` prints
    the progress lines `bin/train` prints (`engine.runtime.logs.configure_logging`).
    `add_actions(plan=, strategy=, model=)`, called once the model is built,
    returns `engine.loop.actions.RunActions` to run beside the engine's own
    (`engine.keras_fit` drives Keras callbacks with it).

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
    task = _task_for(config, task)
    plan = make_plan(config, task)
    config = plan.config  # with what the plan resolved: --epochs, --per_replica_batch_size
    if plan.spec.serves_only(plan.role):
        return RunResult(plan.spec.serve(plan.role))  # until stopped: the chief trains
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Before the lock (which creates model_dir): joining a cluster can end in
    # the watchdog's signal (engine.runtime.watchdog), which leaves no chance to clean up.
    strategy = _build_strategy(plan)
    lock = run_lock.acquire(config.model_dir, plan.lock) if plan.lock else None
    try:
        with _exit_class(plan, checkpoint=lambda: plan.latest_checkpoint):
            return _run_planned(plan, task, strategy, optimizer=optimizer,
                                on_loop_end=on_loop_end, lock=lock, add_actions=add_actions)
    except BaseException:
        if lock is not None:
            lock.discard()  # removes model_dir if this run created it and never trained
        raise
    finally:
        if lock is not None:
            lock.release()


def _exit_class(plan: Plan, *, step: Optional[Callable[[], int]] = None,
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


@dataclasses.dataclass
class _Built:
    """What every mode runs with, built once by `_run_planned`."""

    task: Task
    strategy: tf.distribute.Strategy
    model: Any
    objectives: Any
    global_step: tf.Variable
    average: Optional[ema.WeightAverage]
    evaluator: Optional[Any]
    best_export: Optional[best.ExportFn]
    on_loop_end: Optional[Callable[[int, dict], None]]
    lock: Optional[run_lock.RunLock]
    add_actions: Optional[Callable[..., actions.RunActions]] = None
    #: RunResult.history: filled by `_run_controller`'s actions.
    history: list = dataclasses.field(default_factory=list)

    def result(self, record: dict) -> RunResult:
        """The mode's record as `run()` returns it. With a moving average the
        model keeps the averaged weights from here on (what was evaluated and
        exported), and the raw ones come along as `raw_weights`."""
        raw = None
        if self.average is not None:
            paths = {key: getattr(variable, "path", None) or variable.name
                     for key, variable in checkpointing.named_weights(self.model).items()}
            raw = {paths.get(key, key): value for key, value in self.average.adopt().items()}
        return RunResult(record, model=self.model, task=self.task, history=self.history,
                         raw_weights=raw)


def _run_planned(plan: Plan, task: Task, strategy: tf.distribute.Strategy, *, optimizer,
                 on_loop_end, lock: Optional[run_lock.RunLock],
                 add_actions=None) -> RunResult:
    """`run` once the plan holds, the strategy is built and this process
    holds its lock: builds what every mode needs, then runs the plan's mode
    (`_MODES`, one function each)."""
    config = plan.config
    if plan.lock == run_lock.TRAIN and plan.checkpoints is not None:
        checkpoint_files.set_aside(plan.checkpoints)
        checkpoint_files.remove_stale_temp(config.model_dir)
        export.remove_stale_staging(config.model_dir)
    model, objectives, global_step = _build_model_and_objectives(plan, strategy, optimizer)
    average = _build_average(plan, strategy, model, objectives)
    evaluator = _build_evaluator(plan, strategy, model, objectives, average)
    best.check_request(config, mode=plan.mode, in_cluster=plan.role.in_cluster,
                       available=evaluator.metric_names if evaluator else None)
    if evaluator is not None:
        best.check_evaluation_not_empty(config, evaluator)
    best_export = (_best_export(plan, strategy, model, global_step, average)
                   if config.best_metric and config.export else None)
    built = _Built(task=task, strategy=strategy, model=model, objectives=objectives,
                   global_step=global_step, average=average, evaluator=evaluator,
                   best_export=best_export, on_loop_end=on_loop_end, lock=lock,
                   add_actions=add_actions)
    return _MODES[plan.mode](plan, built)


def _train(plan: Plan, b: _Built) -> RunResult:
    """`train` and `train_and_evaluate`: resume or warm-start, train to the
    last step (evaluating between loops in the latter), export."""
    config = plan.config
    # Workers other than the chief take part in saving, into a directory of their own.
    write_dir = (config.model_dir if plan.role.is_chief
                 else checkpointing.worker_save_dir(config.model_dir, plan.role.name))
    if plan.role.in_cluster and config.local_checkpoint_dir:  # agreed by every worker
        plan = dataclasses.replace(plan, latest_checkpoint=local_checkpoints.newer_on_every_worker(
            config, plan.role.name, b.strategy, plan.latest_checkpoint,
            run_exists=plan.run_json is not None) or plan.latest_checkpoint)
    manager, restored, start_step = _restore_checkpoints(plan, b, write_dir)
    if not restored and config.init_from:
        logger.info("starting from the %s",
                    warm_start.load_initial_weights(
                        b.model, config.init_from,
                        skip_mismatch=config.init_from_skip_mismatch))
        if b.average is not None:
            b.average.reset()  # the average starts from the weights training starts from
    trainer = plan.spec.build_trainer(
        plan.for_trainer, strategy=b.strategy, model=b.model, objectives=b.objectives,
        global_step=b.global_step, start_step=start_step, task=b.task, average=b.average)
    objectives_lib.announce(b.objectives, start_step=start_step, resumed=bool(restored))
    if b.lock is not None:
        b.lock.keep()  # training starts: what model_dir gets from here on is the run's
    export_final = (functools.partial(_export_final, plan, b.strategy, b.model, b.global_step,
                                      b.average, manager) if config.export else None)
    try:
        with data_errors.naming():  # damaged data mid-run: one line naming the file
            record = _run_controller(
                plan, b, trainer, manager, restored=restored, start_step=start_step,
                drive=functools.partial(_train_to_the_end, plan, start_step=start_step),
                export_final=export_final)
    finally:
        if not plan.role.is_chief:
            shutil.rmtree(write_dir, ignore_errors=True)
    return b.result(record)


def _evaluate(plan: Plan, b: _Built) -> RunResult:
    """`--mode=evaluate`: the newest checkpoint, evaluated once; reads only
    (no checkpoint manager), and adds to evaluations.json."""
    manager, restored, start_step = _restore_checkpoints(plan, b, None)
    if b.lock is not None:
        b.lock.keep()
    with data_errors.naming():
        record = _run_controller(
            plan, b, None, manager, restored=restored, start_step=start_step,
            drive=lambda controller: controller.evaluate(plan.config.eval_steps))
    return b.result(record)


def _continuous_evaluate(plan: Plan, b: _Built) -> RunResult:
    """The evaluator task of a cluster: every new checkpoint as it appears."""
    if b.lock is not None:
        b.lock.keep()
    return RunResult(
        evaluate_each_checkpoint(plan.config, strategy=b.strategy, model=b.model,
                                 global_step=b.global_step, evaluator=b.evaluator,
                                 best_export=b.best_export, task=b.task),
        model=b.model, task=b.task)


#: Each run mode's function, selected once by `_run_planned` from the plan's
#: mode (config.RUN_MODES: --mode's values, and the evaluator task's own).
_MODES: dict[str, Callable[[Plan, _Built], RunResult]] = {
    "train": _train, "train_and_evaluate": _train, "evaluate": _evaluate,
    "continuous_evaluate": _continuous_evaluate}


def _restore_checkpoints(plan: Plan, b: _Built, write_dir: Optional[str]):
    """The checkpoint (a manager saving into `write_dir`; None: reads only),
    the newest one restored: (manager, restored path or None, start step)."""
    config = plan.config
    parts = checkpointing.parts(b.model, objectives_lib.checkpointed(b.objectives),
                                b.global_step)
    checkpoint, manager = checkpointing.create(
        model=b.model, optimizer=parts["optimizer"], global_step=b.global_step,
        directory=write_dir, max_to_keep=config.max_checkpoints if plan.role.is_chief else 1,
        averages=b.average.averages if b.average else None,
        extra=getattr(b.task, "checkpointed", dict)())
    restored = _restore(plan, checkpoint, parts, b.average)
    start_step = int(b.global_step.numpy())
    if restored:
        logger.info("resuming from %s at step %d%s", restored, start_step,
                    f" (ignoring --init_from={config.init_from})" if config.init_from else "")
    return manager, restored, start_step


def _export_final(plan: Plan, strategy, model, global_step: tf.Variable, average,
                  manager) -> Optional[str]:
    """The end-of-training export (of the moving average with --ema_decay);
    a failed one says the checkpoints are intact and how to write it later."""
    try:
        with average.swapped() if average else contextlib.nullcontext():
            return serving.export_trained(plan, strategy, model, int(global_step.numpy()))
    except ExportFailure as failure:
        latest = manager.latest_checkpoint if manager else None
        raise ExportFailure(
            f"{failure}; the checkpoints are intact (the latest is "
            f"{posixpath.basename(latest) if latest else 'none'}): {failure.fix} and "
            "run the same command to write the export", fix=failure.fix) from None


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
    model, _, global_step = _build_model_and_objectives(plan, strategy)
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
    compiles, trained on the built-in `--dataset` (`engine.keras_fit.compiled`)."""
    return keras_compiled.CompiledClassificationTask.for_function(model_fn, config)


def _build_strategy(plan: Plan) -> tf.distribute.Strategy:
    strategy = plan.spec.build(plan.devices, config=plan.config, role=plan.role,
                               connection=plan.connection, implementation=plan.implementation)
    logger.info(plan.describe(strategy.num_replicas_in_sync))
    return strategy


def _build_model_and_objectives(plan: Plan, strategy: tf.distribute.Strategy,
                                optimizer: Optional[keras.optimizers.Optimizer] = None):
    """The model, its objectives (optimizers built, slots too) and the global
    step, under the scope."""
    config, task = plan.config, plan.task
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        with precision.model_policy(config.mixed_precision), \
                task_failures.calling(task, "build_model"):
            model = task.build_model()
        if not hasattr(model, "trainable_variables"):
            raise ConfigError(f"{type(task).__name__}.build_model() returned "
                              f"{type(model).__name__}, not a model; return a keras.Model (for "
                              "several models, one keras.Model that holds them)")
        _check_built_in_scope(task, model, strategy)
        if getattr(model, "compiled", False) and not getattr(task, "uses_compile", False):
            logger.info("the model arrives compile()d: its compiled optimizer, loss and metrics "
                        "are not used; %s's objectives and optimizers train it (fit and "
                        "--task=module:function train with them: docs/keras.md)",
                        type(task).__name__)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        if optimizer is None:
            with task_failures.calling(task, "build_optimizer"):
                optimizer = task.build_optimizer()
        objectives = objectives_lib.bind(task, model, config,
                                         num_replicas=plan.schedule_replicas,
                                         total_steps=config.train_steps,
                                         default_optimizer=optimizer)
        if getattr(task, "uses_compile", False):
            # The engine trains with its copy made in the scope (objectives._in_scope):
            # model.optimizer is that one, for callbacks (ReduceLROnPlateau) and the caller.
            model.optimizer = objectives[0].optimizer
    return model, objectives, global_step


def _check_built_in_scope(task: Task, model: Any, strategy: tf.distribute.Strategy) -> None:
    """Refuses a model made before `build_model` was called (in the task's
    `__init__`, say): its variables are not the strategy's, and TensorFlow's
    own complaint comes later, from the optimizer, naming neither."""
    for variable in model.trainable_variables:
        if not strategy.extended.variable_created_in_scope(getattr(variable, "value", variable)):
            raise ConfigError(
                f"{type(task).__name__}.build_model() returned a model whose variables were made "
                f"outside strategy.scope() ({getattr(variable, 'path', variable.name)}): create the "
                "model inside build_model(), not in __init__ or before run()")


def _build_average(plan: Plan, strategy, model, objectives) -> Optional[ema.WeightAverage]:
    """The weights' moving average: with --ema_decay, and for `--mode=evaluate`
    of a checkpoint that holds one (evaluation uses the average when there is one)."""
    config = plan.config
    if plan.role.is_evaluator or not (config.ema_decay or (
            plan.mode == "evaluate"
            and checkpointing.holds(plan.latest_checkpoint, checkpointing.AVERAGES))):
        return None
    keys = {id(variable): key for key, variable in checkpointing.named_weights(model).items()}
    variables = [v for objective in objectives for v in objective.variables]
    outside = [v.name for v in variables if id(v) not in keys]
    if outside:
        raise ConfigError(f"--ema_decay averages the model's variables, and {outside[0]} is "
                          "trained but not held by the model; make it part of build_model()'s model")
    average = ema.WeightAverage(strategy, variables, [keys[id(v)] for v in variables],
                                config.ema_decay)
    logger.info("%s the moving average of the weights%s",
                "evaluation and export use" if plan.mode != "evaluate" and config.export
                else "evaluation uses",
                f" (--ema_decay={config.ema_decay})" if config.ema_decay else
                f" that {plan.latest_checkpoint} holds")
    return average


def _restore(plan: Plan, checkpoint: tf.train.Checkpoint, parts: dict,
             average: Optional[ema.WeightAverage]) -> Optional[str]:
    """Restores the newest checkpoint, if any, whether or not it holds the
    moving averages this run keeps."""
    path, model_dir = plan.latest_checkpoint, plan.config.model_dir
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


def _build_evaluator(plan: Plan, strategy, model, objectives,
                     average: Optional[ema.WeightAverage]):
    if plan.mode == "train":
        return None
    eval_dataset = task_inputs.eval_dataset(plan.task, task_inputs.context_for(plan.inputs))
    evaluator = Evaluator(strategy=strategy, model=model, eval_dataset=eval_dataset,
                          loss_fn=objectives_lib.combined_loss(objectives))
    return AveragedEvaluator(evaluator, average) if average else evaluator


def _best_export(plan: Plan, strategy, model, global_step: tf.Variable,
                 average: Optional[ema.WeightAverage]) -> best.ExportFn:
    """How the best checkpoint is exported: the weights just evaluated (the
    moving average, with one), into `<export_root>/export/<step>/`
    (`export_root` is `model_dir/best`)."""
    def export_best(export_root: str) -> Optional[str]:
        with average.swapped() if average else contextlib.nullcontext():
            return serving.export_trained(plan, strategy, model, int(global_step.numpy()),
                                          directory=export_root)
    return export_best


def _keep_best(plan: Plan, evaluator, manager, start_step: int,
               export_fn: Optional[best.ExportFn]) -> Optional[best.KeepBest]:
    """The best checkpoint's action where this process evaluates while it
    trains (`best.check_request` refused the rest)."""
    config = plan.config
    if not config.best_metric:
        return None
    if evaluator is None:
        logger.info("--best_metric=%s: the evaluator task keeps the best checkpoint",
                    config.best_metric)
        return None
    mode = best.resolve_mode(config.best_metric, config.best_mode)
    logger.info("keeping the best checkpoint by %s (%s%s) in %s%s", config.best_metric, mode,
                ", by --best_mode=auto" if config.best_mode == "auto" else "",
                best.best_dir(config.model_dir),
                f"; stopping after {config.early_stopping_patience} evaluations without "
                "improvement" if config.early_stopping_patience else "")
    return best.KeepBest(
        metric=config.best_metric, mode=mode, checkpoint=manager.checkpoint,
        model_dir=config.model_dir, write_dir=manager.directory, is_chief=plan.role.is_chief,
        export_fn=export_fn, patience=config.early_stopping_patience, start_step=start_step)


def _run_controller(plan: Plan, b: _Built, trainer, manager, *, restored: Optional[str],
                    start_step: int, drive: Callable[[Controller], None],
                    export_final: Optional[Callable[[], Optional[str]]] = None) -> dict:
    """Runs the loops (`drive(controller)`: the mode's train or evaluate calls;
    `trainer` None for a run that only evaluates), then `export_final` (the
    end-of-training export);
    metrics.json says "running" (the step of the last checkpoint, updated at
    each save) until it says how the run ended: `finished` only once the
    export is written too (`export`: its path, None without one), `failed`
    or `interrupted` when the export failed or a signal stopped it (the final
    checkpoint is saved then, and the same command writes the export)."""
    config, role = plan.config, plan.role
    run_dir = layout.RunDir(config.model_dir, config.summaries_dir or None)
    strategy, evaluator = b.strategy, b.evaluator
    trains = trainer is not None
    records = role.is_chief and trains
    if role.is_chief:
        tf.io.gfile.makedirs(config.model_dir)
        if trains:
            numerics = devices.numerics(plan.intra_op_threads)
            if config.deterministic and start_step > 0:
                differ = run_identity.numerics_differ(plan.run_json, numerics)
                if differ:
                    logger.warning(differ)
            run_identity.write(config, plan.run_json, start_step=start_step, numerics=numerics,
                               batching=plan.batching)
    saved = {"step": start_step, "checkpoint": restored}
    if records:
        progress = functools.partial(run_record.running, plan, start_step=start_step,
                                     restored=restored)
        layout.write_json(run_dir.metrics_json, progress(step=start_step, checkpoint=restored))

        def after_save(step: int, path: str) -> None:
            saved.update(step=step, checkpoint=path)
            layout.write_json(run_dir.metrics_json, progress(step=step, checkpoint=path))

        manager.after_save.append(after_save)
    keep_best = _keep_best(plan, evaluator, manager, start_step, b.best_export)
    train_summaries = SummaryWriter(run_dir.summaries("train")) if role.is_chief else None
    eval_summaries = SummaryWriter(run_dir.summaries("eval")) if role.is_chief else None
    stop_request = preemption.StopRequest(
        strategy if plan.spec.agrees_to_stop else None).install()
    run_actions = actions.for_run(
        is_chief=role.is_chief, global_batch_size=config.global_batch_size,
        summary_interval=config.summary_interval, profile_steps=config.profile_range,
        profile_dir=run_dir.summaries("train"), train_summaries=train_summaries,
        eval_summaries=eval_summaries, stop_request=stop_request, checkpoint_manager=manager,
        on_loop_end=b.on_loop_end, steps_per_epoch=config.steps_per_epoch, epochs=config.epochs,
        # A run that only evaluates adds to evaluations.json, beside the training record.
        record_evaluations=actions.RecordEvaluation(path=run_dir.evaluations_json,
                                                    by="--mode=evaluate")
        if role.is_chief and not trains else None,
        keep_best=keep_best, step_time=step_time.for_trainer(
            trainer, writer=train_summaries, interval=config.summary_interval),
        extra=b.add_actions(plan=plan, strategy=strategy, model=b.model)
        if b.add_actions is not None and trains else None)
    # First, so an action that stops the run (the best checkpoint's patience,
    # a signal) stops it after its loop is in the history.
    run_actions.train.insert(0, actions.History("train", b.history))
    run_actions.eval.insert(0, actions.History("eval", b.history))
    # Hang dumps, stragglers, TensorBoard's restart mark, HParams and graph
    # (engine.observe.watchers), before the stop request: the last action.
    watchers = Watchers(
        run=plan.watched, strategy=strategy, trainer=trainer, train_summaries=train_summaries,
        eval_summaries=eval_summaries, start_step=start_step, run_dir=run_dir,
        phase=lambda: (controller.running, controller.running_steps)) if trains else None
    if watchers is not None:
        run_actions.train[-1:-1] = watchers.actions
    local = (local_checkpoints.create(config, manager.checkpoint, b.global_step,
                                      role.name if role.in_cluster else "")
             if trains and manager is not None else None)
    if local is not None:  # before the stop request, the last action
        run_actions.train[-1:-1] = [actions.SaveLocal(
            manager=local, interval=config.local_checkpoint_interval,
            durable_interval=config.checkpoint_interval)]
    controller = Controller(
        global_step=b.global_step, trainer=trainer, evaluator=evaluator,
        steps_per_loop=config.steps_per_loop, checkpoint_manager=manager,
        checkpoint_interval=config.checkpoint_interval,
        train_actions=run_actions.train, eval_actions=run_actions.eval)
    began, status, exported, exporting = time.time(), "failed", None, False
    if watchers is not None:
        watchers.start()
    try:
        with _exit_class(plan, step=lambda: controller.step,
                         checkpoint=lambda: tf.train.latest_checkpoint(config.model_dir),
                         running=lambda: (controller.running, controller.running_steps)):
            drive(controller)
            if export_final is not None:
                # A signal during the last loop, the final evaluation or save: the
                # checkpoint is saved; the export is left to the same command
                # rather than started in a preemption's grace period. (Agreed by
                # every worker: the export is collective.)
                if stop_request.agreed():
                    raise preemption.Preempted(
                        controller.step, manager.latest_checkpoint if manager else None,
                        stop_request.signum or signal.SIGTERM)
                # From here a signal stops the export at once (bin/train: exit
                # 130/143), for the same reason.
                stop_request.uninstall()
                exporting = True
                exported = export_final()
                exporting = False
        status = "stopped_early" if controller.stopped_early else "finished"
    except KeyboardInterrupt:  # a second Ctrl-C (or one during the export): stop at once
        status = "interrupted"
        logger.info("stopped %s; the last checkpoint is %s",
                    "during the export, which was not written" if exporting else "without saving",
                    tf.train.latest_checkpoint(config.model_dir) or "none")
        raise
    except preemption.Preempted:
        status = "interrupted"
        raise
    except BaseException as error:
        if not isinstance(error, Exception):  # a signal turned into an exception (bin/cli)
            status = "interrupted"
        raise
    finally:
        stop_request.uninstall()
        if watchers is not None:
            watchers.finish(controller)
        for writer in (train_summaries, eval_summaries):
            if writer is not None:
                writer.close()
        summary = run_record.summarize(
            plan, controller, num_replicas=strategy.num_replicas_in_sync, restored=restored,
            start_step=start_step, status=status, saved_step=saved["step"],
            checkpoint=saved["checkpoint"], wall_seconds=time.time() - began,
            best=keep_best.record if keep_best else None,
            export=exported)
        if records:
            layout.write_final(run_dir.metrics_json, summary,
                               failing=status not in ("finished", "stopped_early"))
    return summary


def _train_to_the_end(plan: Plan, controller: Controller, *, start_step: int) -> None:
    """The train modes' loops: to the last step, evaluating every
    `--eval_interval` steps in `train_and_evaluate`."""
    config = plan.config
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
        if plan.mode == "train_and_evaluate" else 0,
        eval_steps=config.eval_steps)


def _restore_averages_if_any(model: Any, global_step: tf.Variable, path: str) -> None:
    """The evaluator task's restore: the moving averages where a checkpoint holds them."""
    if checkpointing.restore_for_inference(model, global_step, path):
        logger.info("%s holds moving averages of the weights: evaluating those", path)


def evaluate_each_checkpoint(
    config: RunConfig, *, strategy, model, global_step: tf.Variable, evaluator: Evaluator,
    best_export: Optional[best.ExportFn] = None, task: Optional[Task] = None,
) -> dict:
    """The sidecar evaluator: evaluates every new checkpoint in `model_dir` as it
    appears, writes `summaries/eval` beside the chief's, and returns after the
    checkpoint of step `train_steps` (or after `eval_timeout` seconds with no
    new checkpoint). With `--best_metric` it keeps the best in `model_dir/best/`
    (the model and the step: an evaluator restores no optimizer). With the
    `task`, its eval data failing mid-run is one line (`engine.task.failures`)."""
    checkpoint = tf.train.Checkpoint(model=model, global_step=global_step,
                                     model_weights=checkpointing.named_weights(model))
    run_dir = layout.RunDir(config.model_dir, config.summaries_dir or None)
    writer = SummaryWriter(run_dir.summaries("eval"))
    keep_best = best.KeepBest(
        metric=config.best_metric, mode=best.resolve_mode(config.best_metric, config.best_mode),
        checkpoint=checkpoint, model_dir=config.model_dir, export_fn=best_export,
    ) if config.best_metric else None
    controller = Controller(global_step=global_step, evaluator=evaluator,
                            eval_actions=actions.for_evaluation(writer, actions.RecordEvaluation(
                                path=run_dir.evaluations_json, by="evaluator"), keep_best))
    explain = task_failures.explainer(
        task, lambda: (controller.running, controller.running_steps),
        config.model_dir) if task is not None else None
    try:
        with task_failures.exit_class("evaluator", step=lambda: controller.step,
                                      checkpoint=lambda: tf.train.latest_checkpoint(
                                          config.model_dir), explain_task=explain):
            last = controller.evaluate_continuously(
                config.eval_steps, timeout=config.eval_timeout, last_step=config.train_steps,
                restore=functools.partial(_restore_averages_if_any, model, global_step),
                directory=config.model_dir)
    finally:
        writer.close()
    return {"step": controller.step, **{f"eval/{k}": v for k, v in last.items()},
            "best": keep_best.record if keep_best else None}
