"""`--collective=auto`: picks an implementation for the devices at hand.

The rule, and the measurements behind it (docs/collectives.md has the
commands and full tables)::

    one device                  -> reduce_to_one_device  (nothing to sum; no group keys)
    every device a GPU          -> nccl                  (NVIDIA's all-reduce; the fastest
                                                           on GPUs everywhere it is published)
    CPUs, or CPUs and GPUs      -> reduce_to_one_device

On CPU devices (TF 2.21, 4 logical CPUs on 2 cores, bin/bench_collectives),
the ring was 1.8-12x slower than the fastest at every size from 4 KiB to
256 MiB: logical devices share host memory, so the copies that hierarchical
copy and reduce-to-one-device "send" are free, while the ring still moves
every chunk through the collective executor. Between the two,
reduce-to-one-device led from 1 MiB to 16 MiB by 13-44% and by 5% at 64 and
256 MiB; hierarchical copy led only at 4 KiB and 256 KiB, by 57 and 93 us.
Reduce-to-one-device also won on the mlp and cnn gradient lists, tied on 2
devices and, unlike hierarchical copy, works for any device count. The GPU
branch is not measured here (no GPU).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import tensorflow as tf

from collectives import _values, registry
from collectives.base import device_kind, short_devices
from collectives.interface import Collective, Destinations, PerReplicaGradients

logger = logging.getLogger(__name__)


def choose(devices: Sequence[str]) -> tuple[str, str]:
    """The collective `auto` uses on `devices`, and why (for the log)."""
    kinds = {device_kind(d) for d in devices}
    if len(devices) <= 1:
        return "reduce_to_one_device", "one device, nothing to all-reduce"
    if kinds == {"GPU"}:
        return "nccl", "every device is a GPU"
    if len(kinds) > 1:
        return "reduce_to_one_device", "CPUs and GPUs mixed; only it spans both kinds"
    return (
        "reduce_to_one_device",
        "CPU devices: measured fastest or within noise of it from 1 MiB up, on model "
        "gradient lists, and at any device count (docs/collectives.md)",
    )


@registry.register("auto")
class Auto(Collective):
    """Delegates to the collective `choose` picks for the devices."""

    native_options = frozenset({"num_packs", "pack_bytes", "gradient_dtype"})

    def __init__(
        self, *, num_packs: int = 0, pack_bytes: int = 0, gradient_dtype: str = "float32"
    ):
        self._options = dict(
            num_packs=num_packs, pack_bytes=pack_bytes, gradient_dtype=gradient_dtype
        )
        #: The collective in use, once the devices are known.
        self.chosen: Optional[Collective] = None

    def check_devices(self, devices: Sequence[str]) -> None:
        name, why = choose(devices)
        self.chosen = registry.create(name, devices=list(devices), **self._options)
        logger.info(
            "collective auto picked %s for %s: %s",
            self.chosen.describe(), short_devices(devices), why,
        )

    @tf.autograph.experimental.do_not_convert
    def batch_all_reduce(
        self, values: PerReplicaGradients, destinations: Destinations
    ) -> list[Any]:
        if self.chosen is None:
            values = list(values)
            if not values or not _values.is_distributed(values[0]):
                return values
            self.check_devices(list(_values.replica_devices(values[0])))
        return self.chosen.batch_all_reduce(values, destinations)

    def describe(self) -> str:
        return f"auto->{self.chosen.describe()}" if self.chosen else "auto"
