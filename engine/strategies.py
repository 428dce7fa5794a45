"""`tf.distribute` strategies by name, built from a device list.

Every check that can fail runs before the strategy exists, so a wrong name or
layout costs one line on stderr and no TensorFlow state.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from engine.errors import ConfigError

_BUILDERS: dict[str, Callable[[Sequence[str]], tf.distribute.Strategy]] = {
    "default": lambda devices: tf.distribute.get_strategy(),
    "one_device": lambda devices: tf.distribute.OneDeviceStrategy(devices[0]),
    "mirrored": lambda devices: tf.distribute.MirroredStrategy(list(devices)),
}

# Names the design reserves; they get a clear "not yet" instead of "unknown".
_PLANNED = ("multi_worker", "central_storage", "parameter_server")


def available() -> list[str]:
    return sorted(_BUILDERS)


def num_replicas(name: str, devices: Sequence[str]) -> int:
    """Replicas the strategy will have; validates the name/device combination."""
    if name in _PLANNED:
        raise ConfigError(
            f"--strategy={name} is not available in this version; use one of: "
            f"{', '.join(available())}"
        )
    if name not in _BUILDERS:
        raise ConfigError(
            f"--strategy={name!r} is not a strategy; choose one of: {', '.join(available())}"
        )
    if name == "one_device" and len(devices) != 1:
        raise ConfigError(
            f"--strategy=one_device needs exactly one device, got --devices="
            f"{','.join(d.lstrip('/') for d in devices)}; name one, or use --strategy=mirrored"
        )
    if name == "default":
        return 1
    return len(devices)


def build(name: str, devices: Sequence[str]) -> tf.distribute.Strategy:
    num_replicas(name, devices)
    return _BUILDERS[name](devices)
