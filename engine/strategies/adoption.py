"""A strategy the script made itself, adopted by the engine instead of built.

Keras's tutorials make their strategy first (`strategy =
tf.distribute.MirroredStrategy()`, `MultiWorkerMirroredStrategy()`), then the
dataset and, under `strategy.scope()`, the model. A script handing that
model to `tfloop.fit` has already decided where it trains: its variables are
that strategy's, and a multi-worker one has already formed the cluster (a
second one in the process would never complete an all-reduce, and the
engine's check that the cluster port is free would see the script's own
server). So the engine runs on that very object: `adopted_placement` says
which `--strategy` and `--devices` it is, for the plan and the records, and
`engine.assembly.run` uses the object where it would have built one.

Only what the engine can run as it is comes in; anything else (a TPU,
parameter servers) is refused in one line naming the way that works.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfloop.collectives import device_names
from tfloop.engine.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class AdoptedPlacement:
    """The `--strategy` name and `--devices` (short names, this process's) of
    a strategy object."""

    strategy: str
    devices: str


def adopted_placement(strategy: tf.distribute.Strategy) -> AdoptedPlacement:
    """Which of the engine's strategies `strategy` is, on which local devices."""
    kind = type(strategy).__name__
    if not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy():
        return AdoptedPlacement("default", "cpu:0")
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return AdoptedPlacement("multi_worker", _local_devices(strategy))
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return AdoptedPlacement("mirrored", _local_devices(strategy))
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return AdoptedPlacement("one_device", _local_devices(strategy))
    if isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy):
        return AdoptedPlacement("central_storage", _local_devices(strategy))
    raise ConfigError(
        f"fit: the model was built under a {kind}, which fit cannot adopt (it runs "
        "MirroredStrategy, MultiWorkerMirroredStrategy, OneDeviceStrategy, "
        "CentralStorageStrategy or none as they are); give fit the function that builds and "
        "compiles the model, and RunConfig(strategy=...) to say which strategy")


def _local_devices(strategy: tf.distribute.Strategy) -> str:
    """This process's replica devices, as `--devices` names them (`cpu:0,cpu:1`)."""
    return device_names.short_list(strategy.extended.worker_devices)


def check_agrees(placement: AdoptedPlacement, *, strategy: str, devices: str,
                 strategy_given: bool, devices_given: bool) -> None:
    """Refuses a `RunConfig` that names another strategy or other devices
    than the model's own: the model's variables live where its strategy put
    them, and training them elsewhere cannot be done without a copy."""
    if strategy_given and strategy != placement.strategy:
        raise ConfigError(
            f"fit: RunConfig(strategy={strategy!r}) but the model was built under its own "
            f"{placement.strategy} strategy, which fit adopts; drop strategy= (or build the "
            "model under the strategy you mean)")
    if placement.strategy == "default":
        if devices_given and len(_normal(devices)) > 1:
            raise ConfigError(
                f"fit: RunConfig(devices={devices!r}) but the model was built outside any "
                "strategy's scope, so its variables live on one device; build it under `with "
                "tf.distribute.MirroredStrategy().scope():` (or give fit the function that "
                "builds and compiles it)")
        return
    if devices_given and _normal(devices) != _normal(placement.devices):
        raise ConfigError(
            f"fit: RunConfig(devices={devices!r}) but the model's strategy runs on "
            f"{placement.devices!r}, which fit adopts; drop devices= (or build the model under "
            "a strategy on the devices you mean)")


def _normal(devices: str) -> list[str]:
    return [device_names.short(d) for d in devices.split(",") if d.strip()]
