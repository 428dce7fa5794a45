"""`--collective=ring`: TF's collective-op all-reduce with the RING algorithm.

The same machinery `MirroredStrategy` uses by default on CPUs
(`CollectiveAllReduce` with `CommunicationImplementation.RING`), selected
explicitly. Runs on CPUs and GPUs, one kind at a time. The class is private
in TensorFlow; it comes from `collectives._tf_private`.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Hashable, Sequence

import tensorflow as tf

from tfloop.collectives import _tf_private, _values, device_names
from tfloop.collectives.base import CrossDeviceOpsCollective
from tfloop.collectives.interface import CollectiveError
from tfloop.collectives.registry import register

# Group keys of our rings start far above the 1, 2, ... that every
# MirroredStrategy uses, and each ring gets its own range (room for 64 device
# sets), because TF rejects one group key used for two different device sets.
_GROUP_KEY_BASE = 1 << 20
_GROUP_KEY_STRIDE = 64
_group_key_starts = itertools.count(_GROUP_KEY_BASE, _GROUP_KEY_STRIDE)

# bytes_per_pack=1: one collective per tensor. With the default 0, TF's
# CollectiveAllReduce concatenates a whole batch into one tensor when traced
# (never eagerly), so "no packing" would silently mean "one pack", and a batch
# mixing dtypes would fail in ConcatV2. Packing, when asked for, is `Packing`'s.
_RING = tf.distribute.experimental.CommunicationOptions(
    bytes_per_pack=1,
    implementation=tf.distribute.experimental.CommunicationImplementation.RING,
)


@register("ring")
class Ring(CrossDeviceOpsCollective):
    """Ring all-reduce over TF collective ops."""

    communication_options = _RING

    def __init__(self):
        self._keys = _tf_private.CollectiveKeys(group_key_start=next(_group_key_starts))
        self._ops: dict[tuple[str, ...], tf.distribute.CrossDeviceOps] = {}
        self._lock = threading.Lock()

    def _batch_key(self, value: Any) -> Hashable:
        # TF still packs tensors of a few bytes together; never across dtypes.
        return _values.components(value)[0].dtype

    def check_devices(self, devices: Sequence[str]) -> None:
        kinds = {device_names.kind(d) for d in devices}
        if len(kinds) > 1:
            raise CollectiveError(
                f"--collective=ring runs on devices of one kind, but the devices are "
                f"{device_names.short_list(devices)}; use reduce_to_one_device for a mix of CPUs and GPUs"
            )

    def cross_device_ops(self, devices: tuple[str, ...]) -> tf.distribute.CrossDeviceOps:
        # One object per device set: it owns that set's group key.
        with self._lock:
            if devices not in self._ops:
                self._ops[devices] = _tf_private.CollectiveAllReduce(
                    devices=list(devices),
                    group_size=len(devices),
                    options=_RING,
                    collective_keys=self._keys,
                )
            return self._ops[devices]
