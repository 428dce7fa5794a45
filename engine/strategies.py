"""`tf.distribute` strategies by name, built from a device list.

Every check that can fail runs before the strategy exists, so a wrong name or
layout costs one line on stderr and no TensorFlow state.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional, Sequence

import tensorflow as tf

from collectives import device_names
from engine import cluster, watchdog
from engine.errors import ConfigError

Communication = Optional[tf.distribute.experimental.CommunicationOptions]


def _multi_worker(
    devices: Sequence[str], communication: Communication, role: cluster.Role,
    startup_timeout: float,
) -> tf.distribute.Strategy:
    gpu_ids = [int(d.split(":")[1]) for d in devices if d.startswith("/gpu")]
    if gpu_ids:  # each worker replicates over the listed local GPUs only
        gpus = tf.config.list_physical_devices("GPU")
        tf.config.set_visible_devices([gpus[i] for i in gpu_ids], "GPU")
    program = os.path.basename(sys.argv[0]) or "train"
    never_formed = (
        f"{program}: error: {role.name} waited {startup_timeout:g} s for the cluster "
        f"({role.describe_cluster()}) and not every task came up; start every task of "
        "TF_CONFIG (bin/launch does), check their addresses, or raise --startup_timeout"
    )
    try:
        # The constructor blocks until every task has joined (see engine.watchdog).
        with watchdog.deadline(startup_timeout, never_formed):
            return tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
            tf.errors.InternalError, tf.errors.AbortedError, tf.errors.UnknownError) as error:
        reason = str(error).strip().splitlines()[0][:160]
        raise ConfigError(
            f"{role.name} could not form the cluster ({role.describe_cluster()}): {reason}; "
            "check that no other process holds their ports"
        ) from None


_BUILDERS: dict[str, Callable[..., tf.distribute.Strategy]] = {
    "default": lambda devices, *_: tf.distribute.get_strategy(),
    "one_device": lambda devices, *_: tf.distribute.OneDeviceStrategy(devices[0]),
    "mirrored": lambda devices, *_: tf.distribute.MirroredStrategy(list(devices)),
    "multi_worker": _multi_worker,
    # Variables on the CPU (on the device itself when there is only one),
    # compute replicated on `devices`.
    "central_storage": lambda devices, *_: tf.distribute.experimental.CentralStorageStrategy(
        list(devices)),
    # The chief's view of a TF_CONFIG cluster of workers and ps tasks; only the
    # chief builds it (engine.ps_trainer serves on the others).
    "parameter_server": lambda devices, *_: tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver()),
    "tpu": None,  # built from the resolver engine.tpu.connect returned (see `build`)
}

# Strategies that reduce gradients themselves: the trainer's explicit
# all-reduce goes through the strategy (the `strategy` collective), and
# `--collective` may only be auto (plus multi_worker's TF implementations).
_OWN_REDUCTION = {
    "parameter_server": "whose workers update the variables on the ps tasks, with no all-reduce",
    "tpu": "which all-reduces over the TPU interconnect",
}

# --collective for multi_worker picks TF's collective implementation.
_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def available() -> list[str]:
    return sorted(_BUILDERS)


def num_replicas(name: str, devices: Sequence[str], *, num_workers: int = 0,
                 tpu_cores: int = 0) -> int:
    """Replicas the strategy will have; validates the name/device combination.

    `num_workers` is the training processes of a `TF_CONFIG` cluster (0: none);
    `tpu_cores` the cores `engine.tpu.connect` found. For parameter_server it
    is the replicas *of one worker*: each scheduled step is one worker's, on
    a whole global batch, applied to the ps variables without waiting for
    the other workers.
    """
    if name == "tpu":
        if tpu_cores < 1:
            raise ConfigError("--strategy=tpu found no TPU cores; use --strategy=mirrored")
        return tpu_cores
    if name not in _BUILDERS:
        raise ConfigError(
            f"--strategy={name!r} is not a strategy; choose one of: {', '.join(available())}"
        )
    if name == "one_device" and len(devices) != 1:
        raise ConfigError(
            f"--strategy=one_device needs exactly one device, got --devices="
            f"{device_names.short_list(devices)}; name one, or use --strategy=mirrored"
        )
    if name == "default":
        return 1
    if name in ("multi_worker", "parameter_server"):
        if len(devices) > 1 and any(not d.startswith("/gpu") for d in devices):
            raise ConfigError(
                f"--strategy={name} replicates over one CPU or the local GPUs, got "
                f"--devices={device_names.short_list(devices)}; "
                "use cpu:0 or a list of gpu:N"
            )
        local = len(devices) if devices[0].startswith("/gpu") else 1
        return local if name == "parameter_server" else max(num_workers, 1) * local
    return len(devices)


def collective_name(strategy: str, collective: str, devices: Sequence[str], *, num_packs: int,
                    pack_bytes: int = 0, gradient_dtype: str = "float32") -> str:
    """The registry name of the collective the trainer uses for `strategy`.

    multi_worker reduces through the strategy itself, whose communication
    options `--collective` sets (see `communication_options`).
    central_storage's `auto` is the strategy's own reduction onto the
    variables' device; the explicit collectives work too (they match one
    device in tests), but not the packing and compression wrappers, whose
    results assume one copy per replica where central storage keeps one.
    parameter_server and tpu have no all-reduce of the engine's to choose.
    """
    wrappers = [f"--{flag}={value}" for flag, value, off in (
        ("num_packs", num_packs, 0), ("pack_bytes", pack_bytes, 0),
        ("gradient_dtype", gradient_dtype, "float32")) if value != off]
    if strategy in _OWN_REDUCTION:
        if collective != "auto" or wrappers:
            given = f"--collective={collective}" if collective != "auto" else wrappers[0]
            raise ConfigError(
                f"{given} does not apply to --strategy={strategy}, "
                f"{_OWN_REDUCTION[strategy]}; drop it")
        return "strategy"
    if strategy == "central_storage":
        if wrappers:
            raise ConfigError(
                f"{wrappers[0]} does not apply to --strategy=central_storage, whose gradients "
                "are reduced onto the one device that holds the variables; drop it, or use "
                "--strategy=mirrored")
        return "strategy" if collective == "auto" else collective
    if strategy != "multi_worker":
        return collective
    if collective not in _IMPLEMENTATIONS:
        raise ConfigError(
            f"--collective={collective} does not apply to --strategy=multi_worker, which "
            f"all-reduces across machines with TF collective ops; use one of: "
            f"{', '.join(_IMPLEMENTATIONS)}"
        )
    if collective == "nccl" and not all(d.startswith("/gpu") for d in devices):
        raise ConfigError(
            "--collective=nccl needs GPUs, but --devices are CPUs; use --collective=ring"
        )
    if num_packs:
        raise ConfigError(
            f"--num_packs={num_packs} does not apply to --strategy=multi_worker; "
            "use --pack_bytes (TF's bytes_per_pack)"
        )
    return "strategy"


def communication_options(
    collective: str, *, pack_bytes: int = 0, timeout_seconds: float = 0
) -> tf.distribute.experimental.CommunicationOptions:
    """multi_worker's collective settings: implementation, packing, timeout."""
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=pack_bytes,
        timeout_seconds=timeout_seconds or None,
        implementation=_IMPLEMENTATIONS.get(
            collective, tf.distribute.experimental.CommunicationImplementation.AUTO),
    )


def build(
    name: str,
    devices: Sequence[str],
    *,
    communication: Communication = None,
    role: Optional[cluster.Role] = None,
    startup_timeout: float = 0,
    tpu_resolver: Optional[tf.distribute.cluster_resolver.TPUClusterResolver] = None,
) -> tf.distribute.Strategy:
    """Builds the strategy; the keyword arguments apply to multi_worker only
    (`tpu_resolver`, from `engine.tpu.connect`, to tpu only).

    Args:
      communication: multi_worker's collective options.
      role: this process's place in the `TF_CONFIG` cluster.
      startup_timeout: seconds to wait for every task of the cluster to come
        up; past it the process prints one line and is killed (0: no limit).
    """
    if name == "tpu":
        return tf.distribute.TPUStrategy(tpu_resolver)
    return _BUILDERS[name](devices, communication, role or cluster.Role(), startup_timeout)
