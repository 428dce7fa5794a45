"""Every check a run makes before anything is built or written.

A mistake in the request (a name, a device, a batch that does not divide, a
data file, an unwritable `model_dir`, a TF_CONFIG role the strategy does not
run as) costs one line and leaves no directory behind, because `make_plan`
only reads::

    precision = --mixed_precision, else Keras's global dtype policy
    role    = TF_CONFIG                          # who this process is
    spec    = strategies.get(config.strategy)    # the one place that knows it
    spec.check(sections, role); connect (tpu)
    devices, replicas
    logical CPUs and thread pools                # before anything else touches TF
    collective, optimizer name, the task (its data, its model name), mode
    the run directory, read once (engine.run_dir.plan_reading.read_for_plan):
      model_dir and the other folders writable (engine.run_dir.refusals),
      run.json, the lock free (engine.run_dir.run_lock: read-only probe), the
      newest checkpoint that reads, durable or this run's local one
    the batch (engine.assembly.batching.decide_batch), epochs, input sharding
    run.json's identity agrees; the cluster port is free

The result, a `Plan`, is all that `engine.assembly.run` needs to build the run.
It is plain data, and it carries what it read: `model_dir/run.json` is read
once, here, and handed down from the plan (`Plan.run_json`) to what needs it.
The batch arithmetic (`engine.assembly.batching`) and the file-system
refusals (`engine.run_dir.refusals`) live apart; this module decides.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Optional

import tensorflow as tf

from tfloop import collectives
from tfloop.collectives import device_names
from tfloop.engine.assembly.batching import Batching, decide_batch
from tfloop.engine.run_dir import checkpoint_files, plan_reading
from tfloop.engine.runtime import devices
from tfloop.engine.loop import served_input, task_inputs
from tfloop.engine.observe import watchers
from tfloop.engine.recipe import optimizers, precision
from tfloop.engine import strategies
from tfloop.engine.config import INT32_MAX, RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine import task as task_lib
from tfloop.engine.task import failures as task_failures
from tfloop.engine.task import ClassificationTask, Task
from tfloop.launch import tf_config

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the checks found; nothing in it has touched TensorFlow's runtime
    beyond device set-up.

    Attributes:
      config: the request.
      role: this process in the TF_CONFIG cluster (or outside one).
      spec: how to build and run the strategy (the evaluator's: one device).
      devices: canonical device names this process uses.
      replicas: replicas in sync.
      collective: the trainer's all-reduce; None for the evaluator task.
      task: what to train (`engine.task`), prepared: its data checked.
      mode: one of `config.RUN_MODES` (`continuous_evaluate`: the evaluator task).
      input_workers: processes the input is sharded over.
      shard_policy: how (`data`, `file`, `off`), `auto` resolved for the task's data.
      latest_checkpoint: the newest checkpoint in `model_dir` that reads, if any
        (or in `--local_checkpoint_dir`, when newer: `run_dir.local_checkpoints`).
      checkpoints: what `checkpoint_files.survey` found (damaged checkpoints
        skipped, the state file to rewrite); None for the evaluator task.
      lock: the `engine.run_dir.run_lock` lock this process holds while it runs
        (`train`: the chief; `evaluate`: --mode=evaluate and the evaluator
        task), None for the other tasks of a cluster.
      connection: what `spec.connect` found (tpu: resolver and cores).
      intra_op_threads: the intra-op pool size, None for TensorFlow's default.
      implementation: how the strategy itself all-reduces (multi_worker: ring,
        nccl or auto), decided here once; None where the collective does it all.
      batching: the batch arithmetic (`decide_batch`): global batch, replicas,
        micro-batches, and what changed since the run's last range.
      run_id: the run's id (`run_identity.run_id`): run.json's; for the chief
        of a new run (or of one whose run.json predates ids) a fresh one,
        which it writes there; None for another task of a new cluster run.
      run_json: `model_dir/run.json` as `make_plan` read it, before this run
        wrote anything (None: a new run). The one read of it in a run: the
        identity check, the batch decision, the numerics of a resumed
        `--deterministic` run, the examples earlier ranges trained on and
        the range this run appends (`run_identity.write`) all take this
        value. Read-only: `run_identity.write` builds a new record.
    """

    config: RunConfig
    role: tf_config.Role
    spec: strategies.StrategySpec
    devices: list
    replicas: int
    collective: Optional[collectives.Collective]
    task: Task
    mode: str
    input_workers: int
    shard_policy: str
    latest_checkpoint: Optional[str]
    batching: Batching
    connection: Any = None
    intra_op_threads: Optional[int] = None
    implementation: Optional[str] = None
    checkpoints: Optional[checkpoint_files.Survey] = None
    lock: Optional[str] = None
    run_json: Optional[Mapping[str, Any]] = None
    run_id: Optional[str] = None

    @property
    def schedule_replicas(self) -> int:
        """The replica count `--scale_learning_rate=linear` multiplies by: the
        one the run's global batch was first trained on (`Batching`), so a
        resume on another replica count keeps the learning rate."""
        return self.batching.schedule_replicas

    @property
    def sections(self) -> strategies.SpecSections:
        """The run's settings a spec reads (`StrategySpec.build`, the trainer)."""
        return spec_sections(self.config)

    @property
    def for_trainer(self) -> strategies.TrainerPlan:
        """What the spec builds the trainer from (`StrategySpec.build_trainer`)."""
        return strategies.TrainerPlan(sections=self.sections, role=self.role,
                                      collective=self.collective, inputs=self.inputs)

    @property
    def watched(self) -> watchers.WatchedRun:
        """What the hang watch, straggler table and TensorBoard marks need."""
        return watchers.WatchedRun(cluster=self.config.cluster, hparams=self.config.as_dict(),
                                   role=self.role,
                                   compares_workers=self.spec.compares_workers,
                                   loop_runs_here=self.spec.loop_runs_here)

    @property
    def inputs(self) -> task_inputs.InputPlacement:
        """What this process's input contexts share (`engine.loop.task_inputs`)."""
        return task_inputs.InputPlacement(
            global_batch_size=self.config.global_batch_size, replicas=self.replicas,
            input_workers=self.input_workers,
            pipeline_index=task_inputs.pipeline_index(self.role), shard_policy=self.shard_policy,
            seed=self.config.seed, deterministic=self.config.deterministic,
            run_json=self.run_json, data_service=self.config.data_service,
            service_job=(served_input.job_prefix(self.config.model_dir, self.role.cluster)
                         if self.config.data_service else ""))

    def describe(self, num_replicas: int) -> str:
        """The start-up line: who runs what, on which devices, reduced how,
        and the batch as `decide_batch` settled it (`Batching.describe`).
        `num_replicas`: the replicas the built strategy runs in sync."""
        collective = self.spec.describe_collective(self.collective, self.config.distribution,
                                                   self.devices, self.implementation)
        return "".join([
            f"{self.role.name}: " if self.role.in_cluster else "",
            "evaluator" if self.role.is_evaluator else self.spec.name,
            f" over {num_replicas} replica(s) [{device_names.short_list(self.devices)}], ",
            f"collective {collective}, {self.batching.describe()}",
            f", {self.intra_op_threads} intra-op thread(s) per op" if self.intra_op_threads else "",
        ])


def make_plan(config: RunConfig, task: Optional[Task] = None, *,
              adopted: bool = False) -> Plan:
    """Runs every check that can fail (`task.prepare()` among them), in the
    order of the module docstring, each step a function below; nothing is
    written. Without a task, the built-in `--model`/`--dataset` one.
    `adopted`: the run takes a strategy the script made
    (`engine.strategies.adoption`), whose devices and cluster exist already."""
    task = task or ClassificationTask.from_config(config)
    # The precision trained in: --mixed_precision, else Keras's global policy
    # (set by the script, or by --task's module, imported by now).
    config = dataclasses.replace(config, mixed_precision=precision.global_policy(config.speed))
    # --cluster_from: which source; logs it, the task and its peers; TF reads what it read
    role = tf_config.adopt(source=config.cluster_from)
    placed = _place(config, role, adopted=adopted)
    config = placed.config
    _prepare_task(config, task)
    mode = _resolve_mode(config, task, role)
    # The one trip into the run directory (engine.run_dir.plan_reading).
    found = plan_reading.read_for_plan(config.loop, config.keeping, role, mode,
                                       init_from=config.init_from,
                                       compares_workers=placed.spec.compares_workers)
    batching = decide_batch(config, placed.replicas, resumed=found.resumed, task=task)
    config = _resolve_epochs(batching.apply(config), task)
    input_workers, shard_policy = _shard_input(config, role, placed.spec, task)
    found.check_identity(config.model_and_data, config.loop, config.optimizer,
                         task_object=not config.task
                         and not isinstance(task, ClassificationTask))
    if role.in_cluster and not role.is_evaluator and not adopted:
        tf_config.check_port_free(role)  # unless the script's own strategy serves on it
    return Plan(config=config, role=role, spec=placed.spec, devices=placed.devices,
                replicas=placed.replicas, collective=placed.collective, task=task, mode=mode,
                input_workers=input_workers, shard_policy=shard_policy,
                latest_checkpoint=found.latest_checkpoint, connection=placed.connection,
                intra_op_threads=placed.intra_op_threads, checkpoints=found.checkpoints,
                lock=found.lock, implementation=placed.implementation, batching=batching,
                run_json=found.run_json, run_id=found.run_id)


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where this process's replicas run and how they all-reduce (`_place`);
    `config` with `--reduce_device` renumbered as the process sees its GPUs."""

    config: RunConfig
    spec: strategies.StrategySpec
    connection: Any
    devices: list
    replicas: int
    intra_op_threads: Optional[int]
    collective: Optional[collectives.Collective]
    implementation: Optional[str]


def _place(config: RunConfig, role: tf_config.Role, *, adopted: bool = False) -> _Placement:
    """The strategy, its devices and replicas, the thread pools and the
    collective: the first touch of TensorFlow's runtime, which logical CPU
    devices and thread pools must precede. An adopted strategy's devices
    exist and TensorFlow runs: they are taken as they are."""
    spec, connection = _strategy_for(config, role)
    named = devices.parse_devices(config.devices, virtual_gpus=config.virtual_gpus)
    if role.is_evaluator or role.task_type == tf_config.PS:
        # The sidecar evaluates on one device; a ps task only serves variables.
        named = devices.support_task_devices(named, role.name)
    replicas = spec.num_replicas(named, role=role, connection=connection)
    if adopted:
        prepared = [device_names.canonical(name) or name for name in named]
    else:
        prepared = devices.prepare_devices(named, memory_growth=config.gpu_memory_growth,
                                           virtual_gpus=config.virtual_gpus)
    config = renumber_reduce_device(config, dict(zip(named, prepared)))
    threads = (tf.config.threading.get_intra_op_parallelism_threads() or None) if adopted \
        else devices.configure_threads(prepared, config.intra_op_threads)
    trains = not role.is_evaluator
    return _Placement(
        config=config, spec=spec, connection=connection, devices=prepared, replicas=replicas,
        intra_op_threads=threads,
        collective=spec.create_collective(config.distribution, prepared) if trains else None,
        implementation=(spec.collective_implementation(config.distribution, prepared)
                        if trains else None))


def _shard_input(config: RunConfig, role: tf_config.Role, spec: strategies.StrategySpec,
                 task: Task) -> tuple[int, str]:
    """The processes the input is sharded over, and how (`auto` resolved for the task's data)."""
    input_workers = 1 if role.is_evaluator else spec.input_workers(role)
    shard_policy = task.resolve_shard_policy(config.auto_shard_policy, input_workers)
    if input_workers > 1:
        logger.info("%s: input sharded by %s over %d workers", role.name, shard_policy,
                    input_workers)
    return input_workers, shard_policy


def renumber_reduce_device(config: RunConfig, renamed: dict) -> RunConfig:
    """`--reduce_device=gpu:N` names a GPU as `--devices` does (physical
    numbers); the process sees only those GPUs, renumbered (`renamed`, from
    `devices.prepare_devices`), so the reduce device is renumbered with them,
    and a GPU outside `--devices`, now hidden, is refused in one line."""
    if not config.reduce_device or device_names.kind(config.reduce_device) != "gpu":
        return config
    by_name = {device_names.canonical(old): new for old, new in renamed.items()}
    wanted = device_names.canonical(config.reduce_device)
    if wanted not in by_name:
        raise ConfigError(
            f"--reduce_device={config.reduce_device} is not one of --devices="
            f"{device_names.short_list(renamed)}: a process sees only the GPUs --devices "
            "names; pick one of them, or a cpu:N")
    return dataclasses.replace(config, reduce_device=device_names.short(by_name[wanted]))


def spec_sections(config: RunConfig) -> strategies.SpecSections:
    """The sections of `config` a strategy's spec reads, each its room's."""
    return strategies.SpecSections(distribution=config.distribution, cluster=config.cluster,
                                   loop=config.loop, step=config.step, recipe=config.recipe)


def _strategy_for(config: RunConfig, role: tf_config.Role):
    """The spec this process runs (the evaluator task: one device) and its connection."""
    spec = strategies.get(config.strategy)
    if role.is_evaluator:
        return strategies.get("one_device"), None
    spec.check(spec_sections(config), role)
    return spec, spec.connect(config.distribution)


def _resolve_epochs(config: RunConfig, task: Task) -> RunConfig:
    """`--epochs` as the global step to train to: epochs x steps per epoch,
    an epoch being the train split's examples over the global batch, rounded
    up (or `--steps_per_epoch` for data of unknown size)."""
    if not config.epochs:
        return config
    steps_per_epoch = config.steps_per_epoch
    if not steps_per_epoch:
        with task_failures.calling(task, "train_examples"):
            examples = task.train_examples
        if not examples:
            raise ConfigError(
                f"--epochs={config.epochs} needs the size of the train split, and "
                f"{type(task).__name__}.train_examples is {examples!r}; define it, give "
                "--steps_per_epoch, or use --train_steps")
        steps_per_epoch = -(-examples // config.global_batch_size)
        logger.info("an epoch is %d steps (%d examples / global batch %d, rounded up); "
                    "--epochs=%d trains to step %d", steps_per_epoch, examples,
                    config.global_batch_size, config.epochs, config.epochs * steps_per_epoch)
    if config.epochs * steps_per_epoch > INT32_MAX:
        raise ConfigError(f"--epochs={config.epochs} of {steps_per_epoch} steps is beyond the "
                          f"last step a run can reach ({INT32_MAX}); train fewer epochs")
    return dataclasses.replace(config, train_steps=config.epochs * steps_per_epoch,
                               steps_per_epoch=steps_per_epoch)


def _prepare_task(config: RunConfig, task: Task) -> None:
    optimizers.check(config.optimizer)
    task_lib.check_defines(task)
    with task_failures.calling(task, "prepare"):
        task.prepare()
    with task_failures.calling(task, "describe"):
        logger.info(task.describe())


def _resolve_mode(config: RunConfig, task: Task, role: tf_config.Role) -> str:
    with task_failures.calling(task, "has_eval"):
        has_eval = task.has_eval
    data = (f"--dataset={config.dataset}" if isinstance(task, ClassificationTask)
            else f"task {type(task).__name__}")
    if role.is_evaluator:
        if not has_eval:
            raise ConfigError(f"the evaluator task needs an eval split, and {data} has none")
        return "continuous_evaluate"
    # In a cluster the sidecar evaluator evaluates; the workers train.
    default = "train_and_evaluate" if has_eval and not role.in_cluster else "train"
    mode = config.mode or default
    if mode != "train" and not has_eval:
        raise ConfigError(
            f"--mode={mode} needs an eval split, and {data} has none; "
            "use --mode=train")
    return mode
