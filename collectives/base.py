"""Shared shapes for collectives: one over TF's cross-device ops, one wrapper.

Each TF-backed implementation module only says which `tf.distribute`
`CrossDeviceOps` it is and which devices it refuses; everything else (empty
tensors, one `batch_reduce` call per batch) is here, and the single-replica
shortcut and Keras variables as destinations are `Collective.batch_all_reduce`'s::

    class HierarchicalCopy(CrossDeviceOpsCollective):
        def cross_device_ops(self, devices):
            return self._ops                      # built once in __init__

`_sum_replicas` calls the object's `batch_reduce` itself. Going through
`strategy.extended.batch_reduce_to` instead would be wrong: MirroredStrategy
silently swaps in `ReductionToOneDevice` whenever the destinations are on CPU,
so the selected collective would never run.
"""

from __future__ import annotations

import abc
from typing import Any, Hashable, Optional, Sequence

import tensorflow as tf

from tfloop.collectives import _values, options
from tfloop.collectives.interface import Collective, CollectiveError


class CrossDeviceOpsCollective(Collective):
    """A collective that is one `tf.distribute.CrossDeviceOps` object.

    Subclasses implement `cross_device_ops(devices)`; they may override
    `_batch_key` to split a batch into several `batch_reduce` calls (TF's
    concat-and-split packer, for instance, cannot mix dtypes in one pack).
    """

    #: Passed to every `batch_reduce` call. TF's `CollectiveAllReduce` ignores
    #: the options it was constructed with and reads only these (without them
    #: a "ring" would run TF's AUTO implementation).
    communication_options: Optional[tf.distribute.experimental.CommunicationOptions] = None

    @abc.abstractmethod
    def cross_device_ops(self, devices: tuple[str, ...]) -> tf.distribute.CrossDeviceOps:
        """The TF object that reduces values living on `devices` (one per replica)."""

    def _batch_key(self, value: Any) -> Hashable:
        """Values with equal keys go to TF in one `batch_reduce` call."""
        return None

    def _check_replicas(self, devices: tuple[str, ...]) -> None:
        """Raises when the values' replica devices cannot be reduced here."""

    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        devices = _values.replica_devices(values[0])
        self._check_replicas(devices)
        ops = self.cross_device_ops(devices)
        results: list[Any] = [None] * len(values)
        batches: dict[Hashable, list[int]] = {}
        for i, value in enumerate(values):
            if _values.is_empty(value):
                # Nothing to sum, and TF's collective ops crash (segfault) on
                # an empty tensor that came from numpy: never send one.
                results[i] = _values.map_components(tf.identity, value, mirrored=True)
            else:
                batches.setdefault(self._batch_key(value), []).append(i)
        for indices in batches.values():
            reduced = ops.batch_reduce(
                tf.distribute.ReduceOp.SUM,
                [(values[i], destinations[i]) for i in indices],
                options=self.communication_options,
            )
            for i, r in zip(indices, reduced):
                results[i] = r
        return results


class TFPackedAllReduce(CrossDeviceOpsCollective):
    """TF's `AllReduceCrossDeviceOps` family (NCCL, hierarchical copy).

    These pack natively: `num_packs > 0` concatenates each batch into that
    many packs before reducing (0 = one reduction per tensor). TF's packer
    concatenates across dtypes and fails on a mixed batch, so a batch is
    split by dtype first.
    """

    native_options = frozenset({"num_packs"})
    #: TF's `AllReduceCrossDeviceOps.reduce_implementation` falls back to
    #: `ReductionToOneDevice` unless the destinations are the values' devices.
    needs_replica_destinations = True

    def __init__(self, *, num_packs: int = 0):
        self.num_packs = options.check_count("num_packs", num_packs)
        self._ops = self._make_ops(self.num_packs)

    @abc.abstractmethod
    def _make_ops(self, num_packs: int) -> tf.distribute.CrossDeviceOps:
        """The TF object configured with `num_packs`."""

    def cross_device_ops(self, devices: tuple[str, ...]) -> tf.distribute.CrossDeviceOps:
        return self._ops

    def _batch_key(self, value: Any) -> Hashable:
        return _values.components(value)[0].dtype if self.num_packs else None

    def describe(self) -> str:
        return f"{self.name}(num_packs={self.num_packs})"


class Wrapper(Collective):
    """A collective that transforms values around an inner collective."""

    def __init__(self, inner: Collective):
        if not isinstance(inner, Collective):
            raise CollectiveError(
                f"a {type(self).__name__} wraps a Collective, got {inner!r}; pass one "
                "made by collectives.create"
            )
        self.inner = inner

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    def check_devices(self, devices: Sequence[str]) -> None:
        self.inner.check_devices(devices)
