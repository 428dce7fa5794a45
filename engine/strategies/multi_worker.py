"""`--strategy=multi_worker`: synchronous data parallelism over a TF_CONFIG cluster.

The all-reduce across machines is TensorFlow's collective ops inside
`MultiWorkerMirroredStrategy`, so here `--collective` picks the collective
*implementation* (and `--pack_bytes` its `bytes_per_pack`) of the strategy's
`CommunicationOptions`; the trainer's all-reduce goes through the strategy.

`--collective=auto` is NCCL when every local device is a (physical) GPU:
TF's own AUTO runs the ring between GPUs too, since its collective resolver
picks NCCL only when asked explicitly. Elsewhere (CPUs, virtual GPUs) auto is
TF's choice, the ring. NCCL with bfloat16 gradients is refused up front (TF's
NCCL manager reduces no bfloat16 and would fail at step 1).

Errors: only what a dead or silent peer raises (unavailable, deadline
exceeded, aborted, cancelled) is "lost the cluster", which restarting every
task can fix (`ClusterFailure`, exit 138; so is a cluster that never formed).
An `InternalError` (an NCCL set-up or dtype failure, say) is reported as
itself, in one line, as a failure a restart cannot fix (`UnrecoverableFailure`,
exit status 1, which `bin/launch` does not restart).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import tensorflow as tf

from tfloop.collectives import device_names, gpus, nccl
from tfloop.collectives.interface import CollectiveError
from tfloop.engine.strategies.settings import Distribution
from tfloop.engine.runtime import watchdog
from tfloop.engine.errors import ClusterFailure, ConfigError, one_line
from tfloop.engine.strategies.registry import register
from tfloop.engine.strategies.spec import (NO_CLUSTER, StrategySpec, announce_open_server,
                                            local_replicas_of_a_cluster_task)

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}

#: How a collective reports a peer that died or stopped answering mid-step.
PEER_LOST = (tf.errors.UnavailableError, tf.errors.CancelledError,
             tf.errors.DeadlineExceededError, tf.errors.AbortedError)

#: Failures of the collectives themselves (NCCL set-up, a dtype NCCL lacks):
#: every restart would end the same way.
UNRECOVERABLE = (tf.errors.InternalError,)

#: How the strategy's constructor reports a cluster that cannot form.
_NOT_FORMED = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
               tf.errors.InternalError, tf.errors.AbortedError, tf.errors.UnknownError)


def implementation_name(collective: str, devices: Sequence[str]) -> str:
    """What `--collective` (auto, ring, nccl) means on these local devices:
    auto is nccl when every one is a GPU of its own, else TF's auto (the ring)."""
    if collective == "auto" and devices and all(
            device_names.kind(d) == "gpu" for d in devices) and not gpus.sharing(devices):
        return "nccl"
    return collective


def communication_options(distribution: Distribution, implementation: str
                          ) -> tf.distribute.experimental.CommunicationOptions:
    """The strategy's collective settings: the implementation the plan
    decided (`MultiWorker.collective_implementation`), and the packing and
    timeout of the run's distribution section (`RunConfig.distribution`)."""
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=distribution.pack_bytes,
        timeout_seconds=distribution.collective_timeout or None,
        implementation=_IMPLEMENTATIONS.get(
            implementation, tf.distribute.experimental.CommunicationImplementation.AUTO),
    )


@register
class MultiWorker(StrategySpec):
    name = "multi_worker"
    summary = "synchronous training over a TF_CONFIG cluster of workers (each: one CPU or its GPUs)"
    cluster_jobs = frozenset({"chief", "worker"})
    agrees_to_stop = True
    compares_workers = True
    lost_peer_errors = PEER_LOST
    unrecoverable_errors = UNRECOVERABLE

    def check(self, sections, role) -> None:
        super().check(sections, role)
        if "ps" in role.cluster:
            raise ConfigError(
                "TF_CONFIG has ps tasks, which --strategy=multi_worker does not use; "
                "use --strategy=parameter_server, or drop the ps job (bin/launch --num_ps=0)")

    def num_replicas(self, devices, *, role=NO_CLUSTER, connection=None) -> int:
        return max(role.num_workers, 1) * local_replicas_of_a_cluster_task(self.name, devices)

    def collective_name(self, collective: str, devices: Sequence[str], *, num_packs: int = 0,
                        pack_bytes: int = 0, gradient_dtype: str = "float32") -> str:
        if collective not in _IMPLEMENTATIONS:
            raise ConfigError(
                f"--collective={collective} does not apply to --strategy=multi_worker, which "
                "all-reduces across machines with TF collective ops; use one of: "
                f"{', '.join(_IMPLEMENTATIONS)}")
        if collective == "nccl" and any(device_names.kind(d) != "gpu" for d in devices):
            raise ConfigError(
                "--collective=nccl needs GPUs, but --devices are CPUs; use --collective=ring")
        if implementation_name(collective, devices) == "nccl":
            given = ("--collective=nccl" if collective == "nccl"
                     else "--collective=auto (NCCL between GPUs)")
            try:
                if collective == "nccl":
                    nccl.check_not_shared(devices, given=given)
                if gradient_dtype != "float32":
                    nccl.check_dtype(gradient_dtype, given=given)
            except CollectiveError as error:
                raise ConfigError(f"--strategy=multi_worker {error}") from None
        if num_packs:
            raise ConfigError(
                f"--num_packs={num_packs} does not apply to --strategy=multi_worker; "
                "use --pack_bytes (TF's bytes_per_pack)")
        return "strategy"

    def collective_implementation(self, distribution, devices: Sequence[str]) -> str:
        """ring, nccl or auto: what --collective means on these local devices,
        decided once by the plan; the strategy is built with it and the
        start-up line names it."""
        return implementation_name(distribution.collective, devices)

    def input_workers(self, role) -> int:
        return role.num_workers if role.in_cluster else 1

    def describe_collective(self, collective, distribution, devices, implementation=None) -> str:
        """TF's collective ops inside the strategy, the implementation named:
        not the `strategy` collective's own name, which says nothing."""
        if collective is None:
            return super().describe_collective(collective, distribution, devices)
        if distribution.collective == "auto":
            if implementation == "nccl":
                implementation = "NCCL (auto: every local device is a GPU)"
            elif all(device_names.kind(d) == "cpu" for d in devices):
                implementation = "auto (TF's choice: ring on CPUs)"
            else:
                implementation = "auto (TF's choice: ring on virtual GPUs)"
        else:
            implementation = distribution.collective
        options = ([f"bytes_per_pack={distribution.pack_bytes}"] if distribution.pack_bytes
                   else [])
        if distribution.gradient_dtype != "float32":
            options.append(f"gradients in {distribution.gradient_dtype}")
        if distribution.collective_timeout:
            options.append(f"timeout {distribution.collective_timeout:g} s")
        return (f"MultiWorkerMirroredStrategy's collective all-reduce across the workers, "
                f"implementation {implementation}" + "".join(f", {o}" for o in options))

    def build(self, devices, *, sections=None, role=NO_CLUSTER, connection=None,
              implementation=None):
        # Each worker replicates over the GPUs it sees, and it sees only the
        # ones --devices names: `devices` are already renumbered by
        # engine.runtime.devices.prepare_devices (setting the visible GPUs here again
        # would take the renumbered /gpu:0 for physical GPU 0).
        distribution, startup_timeout = sections.distribution, sections.cluster.startup_timeout
        options = communication_options(
            distribution, implementation or self.collective_implementation(distribution, devices))
        program = os.path.basename(sys.argv[0]) or "train"
        never_formed = (
            f"{program}: error: {role.name} waited {startup_timeout:g} s for the cluster "
            f"({role.describe_cluster()}) and not every task came up; start every task of "
            "TF_CONFIG (bin/launch does), check their addresses, or raise --startup_timeout")
        if role.in_cluster:
            announce_open_server(role)
        try:
            # The constructor blocks until every task has joined (see engine.runtime.watchdog).
            with watchdog.deadline(startup_timeout, never_formed):
                return tf.distribute.MultiWorkerMirroredStrategy(
                    communication_options=options)
        except _NOT_FORMED as error:
            # A peer that died while the cluster formed, or a port taken between
            # tf_config.check_port_free and TensorFlow's bind: the same command on
            # every task can work (bin/launch picks fresh ports), so the retryable
            # class, like the watchdog's (a port held for good was refused before).
            reason = one_line(str(error), 160)
            raise ClusterFailure(
                f"{role.name} could not form the cluster ({role.describe_cluster()}): {reason}; "
                "restart every task, and check that no other process holds their ports"
            ) from None
