"""`--collective=hierarchical_copy`: TF's `HierarchicalCopyAllReduce`.

Built for DGX-1 GPU topologies: the replicas split into two halves, each half
sums on one device, the two partial sums are added and copied back down the
tree. It also runs on logical CPU devices. With an odd replica count the two
halves miss the last replica and the sum is silently wrong (measured: 3
replicas on TF 2.21 return the sum of the first two), so odd counts are
refused. `num_packs` is TF's own concat-and-split packing.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tfloop.collectives import device_names
from tfloop.collectives.base import TFPackedAllReduce
from tfloop.collectives.interface import CollectiveError
from tfloop.collectives.registry import register


@register("hierarchical_copy")
class HierarchicalCopy(TFPackedAllReduce):
    """Two-level tree all-reduce by device-to-device copies; even replica counts."""

    def _make_ops(self, num_packs: int) -> tf.distribute.CrossDeviceOps:
        return tf.distribute.HierarchicalCopyAllReduce(num_packs=num_packs)

    def check_devices(self, devices: Sequence[str]) -> None:
        if len(devices) > 1 and len(devices) % 2:
            raise CollectiveError(
                f"--collective=hierarchical_copy needs an even number of devices (TF's "
                f"two-halves tree leaves out the last of an odd count), but there are "
                f"{len(devices)}: {device_names.short_list(devices)}; use ring or "
                "reduce_to_one_device, or an even device count"
            )

    def _check_replicas(self, devices: tuple[str, ...]) -> None:
        self.check_devices(devices)
