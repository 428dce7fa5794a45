"""The one contract every `--strategy` name fulfils: a `StrategySpec`.

A spec says, in one place, everything the engine must know about a strategy
before and while it trains, so that assembling a run (`engine.assembly.run`) never asks
which strategy it has. The engine calls a spec in this order::

    spec.check(sections, role)                  # refuse what cannot work: one line
    connection = spec.connect(distribution)     # tpu: find the hardware (bounded)
    replicas = spec.num_replicas(devices, role=role, connection=connection)
    collective = spec.create_collective(distribution, devices)  # --collective is read here
    spec.collective_implementation(distribution, devices)  # multi_worker's ring/nccl/auto, once
    spec.describe_collective(collective, distribution, devices, implementation)  # start-up line
    ... devices are set up, nothing has been written ...
    strategy = spec.build(devices, sections=sections, role=role, connection=connection)
    trainer = spec.build_trainer(plan.for_trainer, strategy=..., model=..., clock=..., ...)
    StopRequest(strategy if spec.agrees_to_stop else None)
    except spec.lost_peer_errors: a peer died (one line, exit 138: restart every task)
    except spec.unrecoverable_errors: no restart can help (one line, exit 3)

`sections` (`SpecSections`) are the run's settings a spec reads, each as its
room declares it; `distribution` is `sections.distribution`. A spec never
takes the whole `RunConfig`.

Adding a strategy is one module in this package: a subclass that overrides
what differs from a single-process, all-reducing strategy, and `register`.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from typing import Any, ClassVar, Optional, Sequence

import tensorflow as tf

from tfloop import collectives
from tfloop.engine.loop import served_input, task_inputs
from tfloop.collectives import device_names
from tfloop.launch import tf_config
from tfloop.engine.errors import ConfigError
from tfloop.engine.loop.settings import Loop, Step
from tfloop.engine.recipe.settings import Recipe
from tfloop.engine.strategies.settings import Cluster, Distribution
from tfloop.engine.loop.contracts import AbstractTrainer, LoopClock
from tfloop.engine.loop.trainer import Trainer
from tfloop.engine.recipe.ema import WeightAverage
from tfloop.engine.recipe.objectives import BoundObjective
from tfloop.engine.task import Task

logger = logging.getLogger(__name__)

#: The role of a process outside any TF_CONFIG cluster.
NO_CLUSTER = tf_config.Role()

#: Options that wrap the collective (packing, compression), with their "off" values.
_WRAPPER_OFF = (("num_packs", 0), ("pack_bytes", 0), ("gradient_dtype", "float32"))


def wrapper_flags(*, num_packs: int = 0, pack_bytes: int = 0,
                  gradient_dtype: str = "float32") -> list[str]:
    """The packing/compression flags that are on, as `--name=value`."""
    given = {"num_packs": num_packs, "pack_bytes": pack_bytes, "gradient_dtype": gradient_dtype}
    return [f"--{name}={given[name]}" for name, off in _WRAPPER_OFF if given[name] != off]


@dataclasses.dataclass(frozen=True)
class SpecSections:
    """The sections of the run's settings a spec reads (the plan hands them;
    `RunConfig`, which composes every room's, lives on a floor above this one).

    Attributes:
      distribution: the strategy, devices and collective flags.
      cluster: `--startup_timeout` (the cluster forming, a served input's wait).
      loop: the mode and the global batch.
      step: the step's options (the trainer's; a spec's refusals).
      recipe: the seed, and `--ema_decay` for parameter_server's refusal.
    """

    distribution: Distribution
    cluster: Cluster
    loop: Loop
    step: Step
    recipe: Recipe


@dataclasses.dataclass(frozen=True)
class TrainerPlan:
    """What `StrategySpec.build_trainer` needs of the run's plan, as typed
    values (the `Plan` itself lives on the assembly's floor, above this one).

    Attributes:
      sections: the run's settings the trainer is built from (its batch,
        step and recipe flags).
      role: this process in the TF_CONFIG cluster.
      collective: the trainer's all-reduce (`create_collective`'s).
      inputs: where this process's input sits (`engine.loop.task_inputs`).
    """

    sections: SpecSections
    role: tf_config.Role
    collective: Optional[collectives.Collective]
    inputs: task_inputs.InputPlacement


class StrategySpec(abc.ABC):
    """One `--strategy` name; see the module docstring for when each part runs.

    The defaults describe a single-process strategy that all-reduces through
    the engine's collective (mirrored).
    """

    #: `--strategy=<name>`.
    name: ClassVar[str] = ""
    #: One line for `--help` and docs/clusters.md's strategy table.
    summary: ClassVar[str] = ""
    #: The TF_CONFIG jobs whose tasks run this strategy; empty: it runs in
    #: one process and a TF_CONFIG cluster is a mistake.
    cluster_jobs: ClassVar[frozenset[str]] = frozenset()
    #: Workers must agree on a stop request (a collective), or one would stop
    #: while the others wait for it in the next all-reduce.
    agrees_to_stop: ClassVar[bool] = False
    #: Errors that mean a peer process died (reported in one line, exit 138,
    #: the retryable class, rather than as a bug).
    lost_peer_errors: ClassVar[tuple[type[Exception], ...]] = ()
    #: Errors that mean the run can never work as asked (an NCCL set-up
    #: failure): reported as themselves in one line, exit 1, not restarted.
    unrecoverable_errors: ClassVar[tuple[type[Exception], ...]] = ()
    #: Synchronous workers, each with its own loop: their own times can be
    #: compared once per loop to name a straggler (engine.observe.stragglers).
    compares_workers: ClassVar[bool] = False
    #: The train loop's functions run in this process, so its loops are timed
    #: (the assembly builds the run's clock for its trainer) and its graph can
    #: be traced for TensorBoard (engine.observe.board); not where they run on
    #: other machines, whose loss would turn the trace's export into an error.
    loop_runs_here: ClassVar[bool] = True

    def check(self, sections: SpecSections, role: tf_config.Role) -> None:
        """Refuses a TF_CONFIG role this strategy does not run as."""
        if role.task_type == "ps" and "ps" not in self.cluster_jobs:
            raise ConfigError(
                "TF_CONFIG makes this process a ps task, which only --strategy=parameter_server "
                f"uses, but --strategy={self.name}; use --strategy=parameter_server")
        if role.in_cluster and not self.cluster_jobs:
            raise ConfigError(
                f"TF_CONFIG describes a cluster but --strategy={self.name}; "
                "use --strategy=multi_worker (or parameter_server), or unset TF_CONFIG")

    def connect(self, distribution: Distribution) -> Any:
        """Finds remote hardware before anything is built (tpu); None here."""
        return None

    def num_replicas(self, devices: Sequence[str], *, role: tf_config.Role = NO_CLUSTER,
                     connection: Any = None) -> int:
        """Replicas in sync; refuses a device layout the strategy cannot use."""
        return len(devices)

    def collective_name(self, collective: str, devices: Sequence[str], *, num_packs: int = 0,
                        pack_bytes: int = 0, gradient_dtype: str = "float32") -> str:
        """The `collectives` registry name `--collective` means for this strategy."""
        return collective

    def collective_implementation(self, distribution: Distribution,
                                  devices: Sequence[str]) -> Optional[str]:
        """How the strategy itself all-reduces, decided once by the plan from
        --collective (multi_worker: ring, nccl or auto); None where the
        engine's collective does it all."""
        return None

    def describe_collective(self, collective: Optional[collectives.Collective],
                            distribution: Distribution, devices: Sequence[str],
                            implementation: Optional[str] = None) -> str:
        """What really sums the gradients, for the start-up line; a `--collective`
        given to a task that does not train (the evaluator) is said to be unused."""
        if collective is not None:
            return collective.describe()
        if distribution.collective != "auto":
            return (f"none (--collective={distribution.collective} unused: this task does not "
                    "train)")
        return "none"

    def create_collective(self, distribution: Distribution,
                          devices: Sequence[str]) -> collectives.Collective:
        """The trainer's all-reduce; the one place `--collective` and its options are read."""
        wrappers = dict(num_packs=distribution.num_packs, pack_bytes=distribution.pack_bytes,
                        gradient_dtype=distribution.gradient_dtype)
        return collectives.create(
            self.collective_name(distribution.collective, devices, **wrappers),
            devices=devices, reduce_device=distribution.reduce_device or None,
            check_steps=distribution.check_collective, **wrappers)

    @abc.abstractmethod
    def build(self, devices: Sequence[str], *, sections: Optional[SpecSections] = None,
              role: tf_config.Role = NO_CLUSTER, connection: Any = None,
              implementation: Optional[str] = None) -> tf.distribute.Strategy:
        """The strategy itself (`implementation`: `collective_implementation`'s decision); runs after `check` and device set-up."""

    def input_workers(self, role: tf_config.Role) -> int:
        """Processes `experimental_distribute_dataset` shards the input over."""
        return 1

    def serves_only(self, role: tf_config.Role) -> bool:
        """True for processes that only serve others (parameter_server's workers and ps)."""
        return False

    def serve(self, role: tf_config.Role) -> dict:
        raise NotImplementedError(f"--strategy={self.name} has no serving tasks")

    def build_trainer(self, plan: TrainerPlan, *, strategy: tf.distribute.Strategy,
                      model: Any, objectives: Sequence[BoundObjective], global_step: tf.Variable,
                      start_step: int, task: Task,
                      average: Optional[WeightAverage] = None,
                      clock: Optional[LoopClock] = None) -> AbstractTrainer:
        """The train loop: the engine's replicated step over the task's distributed input.

        `average`: the weights' moving average (`engine.recipe.ema`), or None.
        `clock`: what times its loops (the assembly builds the engine's,
        `engine.observe.clock.for_run`, where `loop_runs_here`); None: untimed.
        """
        step, loop = plan.sections.step, plan.sections.loop
        # --synthetic_on_device trains on one batch kept on the devices: the
        # stream's first, whatever step the run resumes from (exact resume).
        served = bool(plan.inputs.data_service)
        context = task_inputs.context_for(
            plan.inputs, start_step=0 if step.synthetic_on_device else start_step,
            served=served)
        train_dataset = task_inputs.train_dataset(task, context)
        if served:  # --data_service: the pipeline runs on the service's data workers
            train_dataset = served_input.serve(
                train_dataset, address=plan.inputs.data_service, prefix=plan.inputs.service_job,
                start_step=start_step, global_batch_size=loop.global_batch_size,
                where=f"{type(task).__name__}.train_dataset",
                wait_s=plan.sections.cluster.startup_timeout)
        return Trainer(
            strategy=strategy, model=model, objectives=objectives, collective=plan.collective,
            train_dataset=train_dataset,
            # Built only if the step-time report asks (an input-bound loop):
            # a pipeline of its own, so the probe takes none of the run's seeds.
            # None when served: a local probe would time this host, not the pool.
            input_probe=lambda: None if served else task_inputs.probe_dataset(
                task, task_inputs.context_for(plan.inputs), trained_on=train_dataset),
            global_batch_size=loop.global_batch_size, global_step=global_step,
            average=average,
            options=dataclasses.replace(  # the run's step section, as the task compiles
                step, jit_compile=step.jit_compile or task.jit_compile),
            stops_at_any_step=not self.agrees_to_stop,
            clock=clock)


def announce_open_server(role: tf_config.Role) -> None:
    """The start-up line of a cluster task whose TensorFlow gRPC server starts.

    TensorFlow binds that server to `0.0.0.0:<port>` whatever host TF_CONFIG
    names, with insecure credentials (`GrpcServer::Init` in
    tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc:
    `AddListeningPort("0.0.0.0:" + port, GetServerCredentials(...))`), and no
    public API takes a bind address or credentials: `tf.distribute.Server`,
    `ServerDef` (its `port` field replaces the port only) and the strategies
    reach the same code. Anyone who can reach the port can run operations in
    the process (read its files, for one), so the user is told, once.
    """
    host, _, port = (role.address or "").rpartition(":")
    logger.info("%s: security: TensorFlow's gRPC server listens on port %s of every network "
                "interface (not only %s) and has no authentication; run the cluster on a "
                "trusted network or behind a firewall", role.name, port, host or "this host")


class ReducesItself(StrategySpec):
    """A strategy that reduces gradients itself (parameter servers, TPUs):
    the trainer's all-reduce goes through the strategy, and `--collective`
    and the packing/compression flags do not apply."""

    #: Why `--collective` does not apply, for the refusal.
    reduction: ClassVar[str] = ""

    def collective_name(self, collective: str, devices: Sequence[str], *, num_packs: int = 0,
                        pack_bytes: int = 0, gradient_dtype: str = "float32") -> str:
        wrappers = wrapper_flags(num_packs=num_packs, pack_bytes=pack_bytes,
                                 gradient_dtype=gradient_dtype)
        if collective != "auto" or wrappers:
            given = f"--collective={collective}" if collective != "auto" else wrappers[0]
            raise ConfigError(
                f"{given} does not apply to --strategy={self.name}, {self.reduction}; drop it")
        return "strategy"

    def describe_collective(self, collective, distribution, devices, implementation=None) -> str:
        return f"none: the strategy reduces itself, {self.reduction}"


def local_replicas_of_a_cluster_task(name: str, devices: Sequence[str]) -> int:
    """Replicas of one task of a TF_CONFIG cluster: the local GPUs, or one CPU."""
    gpus = [d for d in devices if device_names.kind(d) == "gpu"]
    if len(devices) > 1 and len(gpus) < len(devices):
        raise ConfigError(
            f"--strategy={name} replicates over one CPU or the local GPUs, got "
            f"--devices={device_names.short_list(devices)}; use cpu:0 or a list of gpu:N")
    return len(gpus) or 1
