"""`--collective=reduce_to_one_device`: sum on one device, copy back to all.

TF's `tf.distribute.ReductionToOneDevice`. The device that sums is
`reduce_device` (`--reduce_device=cpu:0`, say, to keep the sum off the
accelerators); by default it is the first destination device.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from tfloop.collectives import device_names
from tfloop.collectives.base import CrossDeviceOpsCollective
from tfloop.collectives.interface import CollectiveError
from tfloop.collectives.registry import register


def _parse_reduce_device(device: Optional[str]) -> Optional[str]:
    if device is None or device == "":
        return None
    name = device_names.canonical(device) if isinstance(device, str) else None
    if name is None:
        raise CollectiveError(
            f"--reduce_device={device!r} is not a device; write cpu:N or gpu:N, "
            "e.g. --reduce_device=cpu:0"
        )
    return name


@register("reduce_to_one_device")
class ReduceToOneDevice(CrossDeviceOpsCollective):
    """Sums every gradient on `reduce_device`, then broadcasts the sum."""

    native_options = frozenset({"reduce_device"})

    def __init__(self, *, reduce_device: Optional[str] = None):
        self.reduce_device = _parse_reduce_device(reduce_device)
        self._ops = tf.distribute.ReductionToOneDevice(reduce_to_device=self.reduce_device)

    def cross_device_ops(self, devices: tuple[str, ...]) -> tf.distribute.CrossDeviceOps:
        return self._ops

    def check_devices(self, devices: Sequence[str]) -> None:
        if self.reduce_device and device_names.kind(self.reduce_device) == "gpu":
            index = device_names.index(self.reduce_device)
            have = len(tf.config.list_physical_devices("GPU"))
            if index >= have:
                raise CollectiveError(
                    f"--reduce_device={device_names.short(self.reduce_device)} does not exist; this "
                    f"machine has {have} GPU(s); use --reduce_device=cpu:0 or one of the devices"
                )

    def describe(self) -> str:
        if not self.reduce_device:
            return self.name  # TF's default: the first destination device
        return f"{self.name}(reduce_device={device_names.short(self.reduce_device)})"
