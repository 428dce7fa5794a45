"""Packing (bucketing): many small all-reduces become a few large ones.

Every all-reduce pays a fixed cost (launching ops on every device, a ring's
handshakes), so a model with dozens of small gradients spends more on the
fixed costs than on the bytes. `Packing` concatenates the gradients into
buckets, reduces the buckets through any inner collective, and splits the
sums back into the original shapes on every device::

    per dtype and device set, in gradient order:
        a gradient of >= target bytes travels alone (never copied)
        the others fill a bucket until it holds >= target bytes
        per device: flat = concat(reshape(g, [-1]) for g in bucket)
    sums = inner.batch_all_reduce(buckets + unpackable values)
    per device: split(sum, sizes) -> reshape -> one Mirrored value per gradient

The target is `pack_bytes`, or total bytes / `num_packs`. Buckets hold whole
gradients, in order; one of at least the target travels alone, unchanged, so
the small gradients around a large one still share a bucket: on the `cnn`
(five tensors of 7 KB around one of 11 MB) that is two all-reduces instead
of six with no large copy, where concatenating the 11 MB kernel too made
every collective slower (docs/collectives.md). Every closed bucket, and
every gradient alone, holds at least the target, so `num_packs` still means
at most that many buckets per dtype. Sparse gradients (`IndexedSlices`) and tensors
whose shape is only known at run time are passed to the inner collective
as they are.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfloop.collectives import _values, bucketing, options
from tfloop.collectives.base import Wrapper
from tfloop.collectives.interface import Collective, CollectiveError


class Packing(Wrapper):
    """Buckets gradients around `inner`; exactly one of the two options is set."""

    def __init__(self, inner: Collective, *, num_packs: int = 0, pack_bytes: int = 0):
        super().__init__(inner)
        num_packs = options.check_count("num_packs", num_packs)
        pack_bytes = options.check_count("pack_bytes", pack_bytes)
        if bool(num_packs) == bool(pack_bytes):
            raise CollectiveError(
                f"Packing needs exactly one of --num_packs ({num_packs}) and --pack_bytes "
                f"({pack_bytes}) above 0"
            )
        self.num_packs = num_packs
        self.pack_bytes = pack_bytes

    def describe(self) -> str:
        if self.num_packs:
            option = f"num_packs={self.num_packs}"
        else:
            option = f"pack_bytes={self.pack_bytes}"
        return f"{self.inner.describe()}+packing({option})"

    def plan(self, values: list[Any], destinations: list[Any]) -> tuple[list[list[int]], list[int]]:
        """Buckets (lists of value indices, each reduced as one tensor) and the
        indices passed through unpacked."""
        groups: dict[tuple, list[int]] = {}
        passthrough = []
        for i, value in enumerate(values):
            if not _values.is_packable(value):
                passthrough.append(i)
                continue
            key = (
                _values.components(value)[0].dtype,
                _values.devices_of(value),
                _values.devices_of(destinations[i]),
            )
            groups.setdefault(key, []).append(i)
        buckets = []
        for indices in groups.values():
            sizes = [_values.nbytes(values[i]) for i in indices]
            for bucket in bucketing.plan_buckets(
                    sizes, num_packs=self.num_packs, pack_bytes=self.pack_bytes):
                buckets.append([indices[j] for j in bucket])
        buckets.sort(key=lambda b: b[0])
        return buckets, passthrough

    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        buckets, passthrough = self.plan(values, destinations)
        inner_values, inner_destinations = [], []
        for bucket in buckets:
            inner_values.append(values[bucket[0]] if len(bucket) == 1 else _concat(
                [values[i] for i in bucket]))
            # Destinations only place the result; the bucket's members share theirs.
            inner_destinations.append(destinations[bucket[0]])
        for i in passthrough:
            inner_values.append(values[i])
            inner_destinations.append(destinations[i])

        reduced = self.inner.batch_all_reduce(inner_values, inner_destinations)

        results: list[Any] = [None] * len(values)
        for bucket, summed in zip(buckets, reduced):
            if len(bucket) == 1:
                results[bucket[0]] = summed
                continue
            for i, value in zip(bucket, _split(summed, [values[i] for i in bucket])):
                results[i] = value
        for i, summed in zip(passthrough, reduced[len(buckets):]):
            results[i] = summed
        return results


def _concat(members: list[Any]) -> Any:
    """One PerReplica value: per replica, the members flattened end to end."""
    per_device = []
    for parts in zip(*(_values.components(m) for m in members)):
        with tf.device(parts[0].device):
            per_device.append(tf.concat([tf.reshape(p, [-1]) for p in parts], axis=0))
    return _values.per_replica(per_device)


def _split(summed: Any, members: list[Any]) -> list[Any]:
    """Undoes `_concat` on every device of `summed`: one Mirrored per member."""
    shapes = [_values.components(m)[0].shape for m in members]
    sizes = [s.num_elements() for s in shapes]
    per_member: list[list[tf.Tensor]] = [[] for _ in members]
    for flat in _values.components(summed):
        with tf.device(flat.device):
            for j, piece in enumerate(tf.split(flat, sizes, axis=0)):
                per_member[j].append(tf.reshape(piece, shapes[j]))
    return [_values.mirrored(tensors) for tensors in per_member]
