"""Compression: gradients travel in 16 bits, arrive in their own dtype.

Halves the bytes every all-reduce moves, for a rounding error per element of
at most about (replicas) x (unit roundoff): 2^-8 relative for bfloat16, 2^-11
for float16. A compressed run therefore does not reproduce the weights of the
same run uncompressed; it trains like it, within that rounding per step.

bfloat16 keeps float32's range. float16 ends at 65504, and a sum over N
replicas can pass it where no single gradient does, so float16 values are
divided by N before the cast and multiplied by N after (the sum of N values of
at most 65504/N never overflows; N a power of two makes both steps exact)::

    per device: g16 = cast(g / n, dtype)    # only float gradients wider than dtype;
                                            # n = N for float16, 1 for bfloat16
    s16 = inner.batch_all_reduce(g16)
    per device: s = cast(s16, g.dtype) * n  # one Mirrored value per gradient

A single gradient above 65504 x N still overflows to inf (mixed_float16's
loss scaling then skips the step and lowers its scale; without it, use
bfloat16). Values below float16's smallest normal (6.1e-5 x N before the
scaling) lose bits: the other reason bfloat16 is the safer choice.

Integer, already-narrow and sparse (`IndexedSlices`) values pass unchanged.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfloop.collectives import _values
from tfloop.collectives.base import Wrapper
from tfloop.collectives.interface import Collective, CollectiveError

_DTYPES = {"bfloat16": tf.bfloat16, "float16": tf.float16}


def replicas_summed(value: Any) -> int:
    """How many replicas an all-reduce of `value` sums: its local copies, or
    the strategy's replicas in sync when it spans more (multi_worker)."""
    return max(len(_values.components(value)), tf.distribute.get_strategy().num_replicas_in_sync)


class Compression(Wrapper):
    """Casts float gradients to `dtype` around `inner`."""

    def __init__(self, inner: Collective, *, dtype: str):
        super().__init__(inner)
        if dtype not in _DTYPES:
            raise CollectiveError(
                f"--gradient_dtype={dtype!r} is not a compression dtype; choose one of "
                f"{'|'.join(_DTYPES)} (float32 = no compression)"
            )
        self.dtype = _DTYPES[dtype]

    def describe(self) -> str:
        return f"{self.inner.describe()}+{self.dtype.name}"

    def _compresses(self, value: Any) -> bool:
        return all(
            isinstance(c, tf.Tensor) and c.dtype.is_floating and c.dtype.size > self.dtype.size
            for c in _values.components(value)
        )

    def _divisor(self, value: Any) -> int:
        """What values are divided by before the cast: the replicas for float16 (range), else 1."""
        return replicas_summed(value) if self.dtype == tf.float16 else 1

    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        original = [
            _values.components(v)[0].dtype if self._compresses(v) else None for v in values
        ]
        divisors = [self._divisor(v) for v in values]

        def narrow(c, n):
            return tf.cast(c / tf.cast(n, c.dtype) if n > 1 else c, self.dtype)

        def widen(c, dtype, n):
            wide = tf.cast(c, dtype)
            return wide * tf.cast(n, dtype) if n > 1 else wide

        narrowed = [
            _values.map_components(lambda c, n=n: narrow(c, n), v, mirrored=False)
            if dtype is not None else v
            for v, dtype, n in zip(values, original, divisors)
        ]
        reduced = self.inner.batch_all_reduce(narrowed, destinations)
        return [
            _values.map_components(lambda c, d=dtype, n=n: widen(c, d, n), r, mirrored=True)
            if dtype is not None else r
            for r, dtype, n in zip(reduced, original, divisors)
        ]
