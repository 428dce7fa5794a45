"""Every check a run makes before anything is built or written.

A mistake in the request (a name, a device, a batch that does not divide, a
data file, an unwritable `model_dir`, a TF_CONFIG role the strategy does not
run as) costs one line and leaves no directory behind, because `make_plan`
only reads::

    precision = --mixed_precision, else Keras's global dtype policy
    role    = TF_CONFIG                          # who this process is
    spec    = strategies.get(config.strategy)    # the one place that knows it
    spec.check(config, role); connect (tpu)
    devices, replicas, batch divisibility
    logical CPUs and thread pools                # before anything else touches TF
    collective, optimizer name, the task (its data, its model name), mode
    model_dir writable, and not in use (engine.run_dir.run_lock: read-only probe);
      a warning for an in-memory ram:// one, which the process takes with it
    the newest checkpoint in it that reads (engine.run_dir.checkpoint_files), or
      this run's local one where newer (engine.run_dir.local_checkpoints)

The result, a `Plan`, is all that `engine.assembly.run` needs to build the run.
It is plain data, and it carries what it read: `model_dir/run.json` is read
once, here, and handed down from the plan (`Plan.run_json`) to what needs it.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from typing import Any, Mapping, Optional

import tensorflow as tf

from tfloop import collectives
from tfloop.collectives import device_names
from tfloop.engine.run_dir import (checkpoint_files, layout, local_checkpoints, run_identity,
                                   run_lock, storage)
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

#: TensorFlow's in-memory filesystem: fine for tests, gone with the process.
IN_MEMORY = "ram://"


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
    batching: "Batching"
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
    def for_trainer(self) -> strategies.TrainerPlan:
        """What the spec builds the trainer from (`StrategySpec.build_trainer`)."""
        return strategies.TrainerPlan(config=self.config, role=self.role,
                                      collective=self.collective, inputs=self.inputs)

    @property
    def watched(self) -> watchers.WatchedRun:
        """What the hang watch, straggler table and TensorBoard marks need."""
        return watchers.WatchedRun(config=self.config, role=self.role,
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
        collective = self.spec.describe_collective(self.collective, self.config, self.devices,
                                                   self.implementation)
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
    stored, resuming = _read_model_dir(config, role, placed.spec)
    resumed = run_identity.last_range(stored) if stored and resuming else None
    batching = decide_batch(config, placed.replicas, resumed=resumed, task=task)
    config = _resolve_epochs(batching.apply(config), task)
    input_workers, shard_policy = _shard_input(config, role, placed.spec, task)
    mode = _resolve_mode(config, task, role)
    _check_other_paths(config)
    lock = _check_claims(config, role, mode, stored, task, adopted=adopted)
    checkpoints, latest = _find_checkpoint(config, role, mode, run_id=run_identity.run_id(stored))
    run_id = run_identity.run_id(stored) or (run_identity.new_run_id() if role.is_chief else None)
    return Plan(config=config, role=role, spec=placed.spec, devices=placed.devices,
                replicas=placed.replicas, collective=placed.collective, task=task, mode=mode,
                input_workers=input_workers, shard_policy=shard_policy,
                latest_checkpoint=latest, connection=placed.connection,
                intra_op_threads=placed.intra_op_threads, checkpoints=checkpoints, lock=lock,
                implementation=placed.implementation, batching=batching, run_json=stored,
                run_id=run_id)


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
        collective=spec.create_collective(config, prepared) if trains else None,
        implementation=spec.collective_implementation(config, prepared) if trains else None)


def _read_model_dir(config: RunConfig, role: tf_config.Role,
                    spec: strategies.StrategySpec) -> tuple[Optional[dict], bool]:
    """Checks `model_dir` and the folders kept in it (a link there is refused
    before run.json is read through it), then reads run.json, the run's one
    read of it. Returns it (None: a new run) and whether the run resumes
    from a checkpoint (in `model_dir`, or this task's `--local_checkpoint_dir`)."""
    check_model_dir(config.model_dir)
    check_run_directories(config)
    local_checkpoints.check(config, asynchronous_cluster=role.in_cluster
                            and not spec.compares_workers and not role.is_evaluator)
    stored = (run_identity.load(config.model_dir) if tf.io.gfile.isdir(config.model_dir)
              else None)
    resuming = checkpoint_files.on_disk(config.model_dir) or local_checkpoints.held(
        config, role.name if role.in_cluster else "", run_id=run_identity.run_id(stored))
    return stored, resuming


def _shard_input(config: RunConfig, role: tf_config.Role, spec: strategies.StrategySpec,
                 task: Task) -> tuple[int, str]:
    """The processes the input is sharded over, and how (`auto` resolved for the task's data)."""
    input_workers = 1 if role.is_evaluator else spec.input_workers(role)
    shard_policy = task.resolve_shard_policy(config.auto_shard_policy, input_workers)
    if input_workers > 1:
        logger.info("%s: input sharded by %s over %d workers", role.name, shard_policy,
                    input_workers)
    return input_workers, shard_policy


def _check_other_paths(config: RunConfig) -> None:
    """The paths besides `model_dir` a run writes or reads, and a warning for
    an in-memory `model_dir`, which the process takes with it."""
    if config.summaries_dir:  # its own folder (Vertex's $AIP_TENSORBOARD_LOG_DIR): checked alike
        check_directory(config.summaries_dir, "--summaries_dir")
    if config.init_from:  # gs:// out of reach: 138 now, not a traceback at the warm start
        storage.check_reachable(config.init_from, "--init_from")
    if config.model_dir.startswith(IN_MEMORY):
        logger.warning("--model_dir=%s is in memory: its checkpoints, metrics.json and export "
                       "vanish when this process ends; use a local path or gs:// to keep them",
                       config.model_dir)


def _check_claims(config: RunConfig, role: tf_config.Role, mode: str,
                  stored: Optional[dict], task: Task, *, adopted: bool = False) -> Optional[str]:
    """What this process would take from others: `model_dir`'s lock (free, or
    refused; returns which one it will hold), the run it continues (run.json's
    identity and optimizer agree), and its cluster port (free, unless the
    script's own strategy already serves on it: adopted)."""
    lock = lock_name(role, mode)
    if lock:
        run_lock.check_free(config.model_dir, lock)
    run_identity.check(config, stored, task_object=not config.task
                       and not isinstance(task, ClassificationTask))
    if role.in_cluster and not role.is_evaluator and not adopted:
        tf_config.check_port_free(role)
    return lock


def _find_checkpoint(config: RunConfig, role: tf_config.Role, mode: str, *,
                     run_id: Optional[str]) -> tuple[Optional[checkpoint_files.Survey],
                                                     Optional[str]]:
    """The survey of `model_dir`'s checkpoints (damaged ones skipped, with a
    line) and the newest that reads, local or durable: `--local_checkpoint_dir`'s
    where newer and this run's (`run_id`: run.json's), also when every
    durable one is damaged (a cluster's is settled across workers in
    `engine.assembly.run`). The evaluator task surveys nothing: it reads
    each checkpoint as it appears. `--mode=evaluate` without a checkpoint is
    refused, and so is a `model_dir` whose checkpoints none reads, with no
    local one to resume from instead."""
    if role.is_evaluator:
        return None, None
    local = bool(config.local_checkpoint_dir) and mode != "evaluate" and not role.in_cluster
    checkpoints = checkpoint_files.survey(config.model_dir, strict=not local)
    latest = checkpoints.newest
    if local:
        latest = local_checkpoints.newer(config, latest, run_id=run_id) or latest
        if latest is None and checkpoints.damaged:
            raise checkpoint_files.none_reads(checkpoints)
    skipped = checkpoints.skip_line("evaluating" if mode == "evaluate" else "resuming from",
                                    instead=latest)
    if skipped:
        logger.info(skipped)
    if mode == "evaluate" and not latest:
        raise ConfigError(
            f"--mode=evaluate found no checkpoint in --model_dir={config.model_dir}; "
            "train first or point --model_dir at a trained run")
    return checkpoints, latest


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


def lock_name(role: tf_config.Role, mode: str) -> Optional[str]:
    """Which `engine.run_dir.run_lock` lock a process of `role` running `mode` holds:
    the ones that write `model_dir` (a cluster's other workers save elsewhere)."""
    if role.is_evaluator or (role.is_chief and mode == "evaluate"):
        return run_lock.EVALUATE
    return run_lock.TRAIN if role.is_chief else None


def _strategy_for(config: RunConfig, role: tf_config.Role):
    """The spec this process runs (the evaluator task: one device) and its connection."""
    spec = strategies.get(config.strategy)
    if role.is_evaluator:
        return strategies.get("one_device"), None
    spec.check(config, role)
    return spec, spec.connect(config)


#: What a --deterministic run says when it resumes on another replica count.
REPLICAS_DIFFER = (
    "--deterministic: resuming on %d -> %d replicas trains the same examples in the same "
    "steps, but the gradients' float32 sums add up in another order (per replica, across "
    "replicas, over micro-batches), so the weights cannot be bit-identical to an "
    "uninterrupted run's; they agree within 1e-5 relative (docs/reliability.md, Losing a "
    "machine)")
#: Replica counts a refusal offers, at most (the divisors of the global batch up to it).
_OFFERED_REPLICAS = 64


@dataclasses.dataclass(frozen=True)
class Batching:
    """One step's examples, decided once (`decide_batch`)::

        global batch = per-replica batch x replicas x micro-batches

    Attributes:
      global_batch_size: examples per optimizer update, over every replica and micro-batch.
      replicas: replicas in sync this run trains on.
      accumulation_steps: micro-batches per step.
      schedule_replicas: what `--scale_learning_rate=linear` multiplies by.
      resumed: the run.json range the run resumes after (None: a new run),
        for `change` and the log line.
    """

    global_batch_size: int
    replicas: int
    accumulation_steps: int
    schedule_replicas: int
    resumed: Optional[dict] = None

    @property
    def per_replica_batch_size(self) -> int:
        """Examples one replica computes at once (one micro-batch)."""
        return self.global_batch_size // (self.replicas * self.accumulation_steps)

    @property
    def change(self) -> Optional[dict]:
        """`{"from": R, "to": R', ...}` when the run resumes on another replica
        count than its last range recorded (for the log lines; run.json's
        `replica_changes` is `run_identity.write`'s); else None."""
        before = (self.resumed or {}).get("replicas")
        if not before or before == self.replicas:
            return None
        return {"from": before, "to": self.replicas,
                "accumulation_steps": [self.resumed.get("accumulation_steps", 1),
                                       self.accumulation_steps],
                "global_batch_size": self.global_batch_size}

    def describe(self) -> str:
        """`global batch 32 (8 per replica)`, or `... (8 per replica in 2
        micro-batches of 4)`: the start-up line's part (`Plan.describe`)."""
        per_replica = self.global_batch_size // self.replicas
        return "".join([
            f"global batch {self.global_batch_size} ({per_replica} per replica",
            f" in {self.accumulation_steps} micro-batches of {self.per_replica_batch_size})"
            if self.accumulation_steps > 1 else ")"])

    def apply(self, config: RunConfig) -> RunConfig:
        """`config` with the batch as decided: the global batch and the
        micro-batches set, the per-replica requests spent."""
        return dataclasses.replace(config, global_batch_size=self.global_batch_size,
                                   accumulation_steps=self.accumulation_steps,
                                   per_replica_batch_size=0, max_per_replica_batch_size=0)


def decide_batch(config: RunConfig, replicas: int, *, resumed: Optional[dict] = None,
                 task: Optional[Task] = None) -> Batching:
    """The one place the global batch and the micro-batches are decided, and
    every refusal of the batch made (each flag's own range: its option in
    `engine.config`; which flags ask for it: `RunConfig._check_batch_request`).

    `resumed` is the newest range of the run's run.json when it resumes from
    a checkpoint (`run_identity.last_range`), else None. Three requests:

    - `--global_batch_size=B` (`--accumulation_steps=A`): B and A as given;
      each replica takes B / (replicas x A), however many replicas there are.
    - `--per_replica_batch_size=P`: a new run trains B = P x replicas x A; a
      resumed one keeps the B it recorded and takes A = B / (P x replicas),
      so P stays what the run asked for on any replica count.
    - `--max_per_replica_batch_size=M`: B as given (a resume without
      --global_batch_size keeps the recorded one), and the fewest A that
      divide it into shares of at most M per replica.

    A batch that cannot be cut so is refused in one line naming the replica
    counts (or the flag) that would work; so is one larger than `task`'s
    train split, where its size is known (every step would repeat examples).
    The learning rate's linear scaling keeps the replica count of the
    recorded range while the global batch is the same: an elastic resume
    changes how a step is computed, not the step.
    """
    recorded = int((resumed or {}).get("global_batch_size") or 0)
    if config.per_replica_batch_size:
        batch, micro = _from_per_replica(config, replicas, recorded)
    elif config.max_per_replica_batch_size:
        batch, micro = _within_max_per_replica(config, replicas, recorded)
    else:
        batch, micro = config.global_batch_size, config.accumulation_steps
        _check_divides(batch, replicas, micro)
    if task is not None:
        _check_batch_fits(batch, task)
    scaled = replicas
    if resumed and resumed.get("schedule_replicas") and recorded == batch:
        scaled = int(resumed["schedule_replicas"])
    batching = Batching(global_batch_size=batch, replicas=replicas, accumulation_steps=micro,
                        schedule_replicas=scaled, resumed=resumed)
    if batching.change:
        logger.info("resuming on %d replica(s) after %d: global batch %d, %d per replica in "
                    "%d micro-batch(es) of %d", replicas, batching.change["from"], batch,
                    batch // replicas, micro, batching.per_replica_batch_size)
        if config.deterministic:
            logger.warning(REPLICAS_DIFFER, batching.change["from"], replicas)
    return batching


def _from_per_replica(config: RunConfig, replicas: int, recorded: int) -> tuple[int, int]:
    """`--per_replica_batch_size=P`: (global batch, micro-batches) of a new run
    (P x replicas x `--accumulation_steps`), or of a resumed one that keeps
    its `recorded` global batch (the micro-batches that make it)."""
    per_replica, micro = config.per_replica_batch_size, config.accumulation_steps
    if recorded:
        batch = recorded
        micro, rest = divmod(batch, per_replica * replicas)
        if rest or not micro:
            raise ConfigError(
                f"--per_replica_batch_size={per_replica} on {replicas} replica(s) cannot "
                f"make the global batch {batch} this run trained with: {batch} is not "
                f"{per_replica} x {replicas} x a whole number of micro-batches; resume on "
                f"{_replica_counts(batch // per_replica if batch % per_replica == 0 else 0)}"
                f" replica(s), or use --max_per_replica_batch_size={per_replica} to let "
                "the per-replica batch shrink")
    else:
        batch = per_replica * replicas * micro
    logger.info("global batch %d: --per_replica_batch_size=%d x %d replicas%s%s", batch,
                per_replica, replicas, f" x {micro} micro-batches" if micro > 1 else "",
                " (the global batch the run recorded)" if recorded else "")
    return batch, micro


def _within_max_per_replica(config: RunConfig, replicas: int,
                            recorded: int) -> tuple[int, int]:
    """`--max_per_replica_batch_size=M`: the global batch as given (a resume
    without --global_batch_size keeps the `recorded` one), and the fewest
    micro-batches that cut it into shares of at most M per replica."""
    most, batch = config.max_per_replica_batch_size, config.global_batch_size
    if recorded and not config.changed("global_batch_size"):
        batch = recorded
    micro = next((a for a in range(1, batch // replicas + 1)
                  if batch % (replicas * a) == 0 and batch // (replicas * a) <= most), 0)
    if not micro:
        raise ConfigError(
            f"--max_per_replica_batch_size={most} cannot cut the global batch {batch} "
            f"over {replicas} replica(s): {batch} does not divide by {replicas}; use "
            f"{_replica_counts(batch)} replica(s), or a global batch that divides by "
            f"{replicas}")
    logger.info("global batch %d over %d replica(s): %d micro-batch(es) of %d per "
                "replica (--max_per_replica_batch_size=%d)", batch, replicas, micro,
                batch // (replicas * micro), most)
    return batch, micro


def _check_divides(batch: int, replicas: int, micro: int) -> None:
    """`--global_batch_size` (with `--accumulation_steps`) as given: it must
    cut into equal shares, one per replica and micro-batch."""
    if batch % (replicas * micro):
        parts = replicas * micro
        into = (f"the {replicas} replicas" if micro == 1
                else f"{replicas} replicas x {micro} micro-batches (--accumulation_steps)")
        raise ConfigError(
            f"--global_batch_size={batch} does not divide by {into}; use a multiple of "
            f"{parts}, e.g. {max(parts, batch // parts * parts)}")


def _replica_counts(total: int) -> str:
    """`1, 2, 4 or 8`: the replica counts `total` divides by (up to a few)."""
    counts = [n for n in range(1, min(total, _OFFERED_REPLICAS) + 1) if total % n == 0]
    if not counts:
        return "no"
    return str(counts[0]) if len(counts) == 1 else ", ".join(map(str, counts[:-1])) + f" or {counts[-1]}"


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


def _check_batch_fits(batch: int, task: Task) -> None:
    """Refuses a global batch larger than the train split (where its size is
    known): every step would hold some examples twice."""
    with task_failures.calling(task, "train_examples"):
        examples = task.train_examples
    if examples and batch > examples:
        raise ConfigError(
            f"--global_batch_size={batch} is larger than the {examples} "
            f"examples {type(task).__name__} trains on: each step would repeat examples; "
            f"use a batch of at most {examples}")


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


def check_model_dir(path: str) -> None:
    """`check_directory` for `--model_dir`."""
    check_directory(path, "--model_dir")


def check_directory(path: str, flag: str) -> None:
    """Refuses a directory the run writes (`flag`: `--model_dir`,
    `--summaries_dir`) that cannot be written, before anything is created.

    A URL (`gs://...`, `ram://...`: any filesystem TensorFlow has registered)
    is checked for answering (`storage.check_reachable`: one line, exit 138
    or 2) and for being a file; writability shows at the first save.
    """
    if storage.is_url(path):
        storage.check_reachable(path, flag)
        if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
            raise ConfigError(f"{flag}={path} is a file; name a directory")
        return
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag}={path} is a file; name a directory")
    existing = path
    while not os.path.exists(existing):
        if os.path.islink(existing):  # os.makedirs would fail on it with a traceback
            raise ConfigError(_broken_link(path, existing, flag))
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{flag}={path} cannot be written ({existing} is not a writable directory); "
            "choose a directory you can write to")
    _check_name_lengths(path, existing, flag)


def _check_name_lengths(path: str, existing: str, flag: str) -> None:
    """Refuses a `model_dir` whose missing part has a name longer than the
    filesystem allows (an `OSError` traceback from `os.makedirs` otherwise),
    or that leaves no room under PATH_MAX for the run's own files."""
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        return
    for name in os.path.relpath(path, existing).split(os.sep):
        if len(os.fsencode(name)) > name_max:
            raise ConfigError(
                f"{flag}={path} cannot be created: the name {name[:24]}... is "
                f"{len(os.fsencode(name))} bytes, and names in {existing} may have at most "
                f"{name_max}; choose a shorter one")
    room = 256  # summaries/train/events.out.tfevents.<time>.<host>.<pid>.<n>.v2 and the like
    if len(os.fsencode(path)) + room > path_max:
        raise ConfigError(
            f"{flag}={path[:40]}... is {len(os.fsencode(path))} bytes long, which leaves "
            f"too little of the {path_max} a path may have for the files under it; choose a "
            "shorter path")


def check_run_directories(config: RunConfig) -> None:
    """Refuses a file where this run will keep a directory (`summaries`,
    `export` with --export, `best` with --best_metric): it would fail with a
    traceback at the first summary, or at the export after all of training;
    and a symbolic link where it keeps any file or folder (`RunDir.kept_paths`)."""
    run_dir = layout.RunDir(config.model_dir, config.summaries_dir or None)
    run_dir.refuse_links()  # a run never writes or removes through a link it did not make
    for where in run_dir.directories(export=config.export, best=bool(config.best_metric)):
        if tf.io.gfile.exists(where) and not tf.io.gfile.isdir(where):
            raise ConfigError(f"{where} is a file, where the run keeps a directory; move it "
                              "away and run again")


def _broken_link(model_dir: str, link: str, flag: str) -> str:
    """Why `model_dir` cannot be created through `link`, a symbolic link
    that leads nowhere (it dangles, or loops)."""
    try:
        os.stat(link)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return (f"{flag}={model_dir} cannot be created: {link} is a symbolic link "
                    f"loop; point {flag} at a directory, or fix the link")
    target = os.path.join(os.path.dirname(link), os.readlink(link))
    return (f"{flag}={model_dir} cannot be created: {link} is a symbolic link to "
            f"{os.path.normpath(target)}, which does not exist; create that directory, or "
            "remove the link")
