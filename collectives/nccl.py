"""`--collective=nccl`: NVIDIA NCCL all-reduce between GPUs of one machine.

TF's `tf.distribute.NcclAllReduce`; `num_packs` is its own concat-and-split
packing. NCCL has no CPU kernel (the first step would fail with "No OpKernel
was registered to support Op 'NcclAllReduce'"), so any non-GPU device is
refused before anything is built.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfloop.collectives import device_names
from tfloop.collectives.base import TFPackedAllReduce
from tfloop.collectives.interface import CollectiveError
from tfloop.collectives.registry import register


@register("nccl")
class Nccl(TFPackedAllReduce):
    """NCCL all-reduce; GPUs only."""

    def _make_ops(self, num_packs: int) -> tf.distribute.CrossDeviceOps:
        return tf.distribute.NcclAllReduce(num_packs=num_packs)

    def check_devices(self, devices: Sequence[str]) -> None:
        if not devices or any(device_names.kind(d) != "gpu" for d in devices):
            raise CollectiveError(
                f"--collective=nccl needs GPUs, but the devices are "
                f"{device_names.short_list(devices) or 'none'}; on CPU use ring, hierarchical_copy "
                "or reduce_to_one_device"
            )
