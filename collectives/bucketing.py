"""Which gradients share a bucket: `Packing`'s plan on sizes alone, no TensorFlow.

The rule (`collectives.packing` says why) over one group of gradients of one
dtype and device set, in gradient order::

    target = pack_bytes, or ceil(total bytes / num_packs)
    a gradient of >= target bytes travels alone
    the others fill a bucket until it holds >= target bytes

It lives apart from `Packing` so that what runs and what is predicted are the
same rule: `Packing.plan` calls it on the gradients' byte sizes, and the
scaling model (`bench.scaling`) counts a step's all-reduces with it, without
importing TensorFlow.
"""

from __future__ import annotations

import math
from typing import Sequence


def target_bytes(sizes: Sequence[int], *, num_packs: int = 0, pack_bytes: int = 0) -> int:
    """The bytes a bucket fills up to: `pack_bytes`, or the total over `num_packs`."""
    if pack_bytes:
        return pack_bytes
    return max(1, math.ceil(sum(sizes) / num_packs))


def plan_buckets(sizes: Sequence[int], *, num_packs: int = 0, pack_bytes: int = 0
                 ) -> list[list[int]]:
    """Buckets of positions into `sizes` (one group's gradients, in order), in
    the order of their first member; exactly one of `num_packs` and
    `pack_bytes` is above 0."""
    target = target_bytes(sizes, num_packs=num_packs, pack_bytes=pack_bytes)
    buckets, bucket, filled = [], [], 0
    for i, size in enumerate(sizes):
        if size >= target:  # big enough alone: concatenating it only copies it
            buckets.append([i])
            continue
        bucket.append(i)
        filled += size
        if filled >= target:
            buckets.append(bucket)
            bucket, filled = [], 0
    if bucket:
        buckets.append(bucket)
    buckets.sort(key=lambda b: b[0])
    return buckets
