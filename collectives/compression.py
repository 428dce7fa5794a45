"""Compression: gradients travel in 16 bits, arrive in their own dtype.

Halves the bytes every all-reduce moves, for a rounding error per element of
at most about (replicas) x (unit roundoff): 2^-8 relative for bfloat16, 2^-11
for float16. bfloat16 keeps float32's range; float16 overflows above 65504,
so unscaled large gradients become inf (use bfloat16 unless the hardware
reduces float16 much faster)::

    per device: g16 = cast(g, dtype)        # only float gradients wider than dtype
    s16 = inner.batch_all_reduce(g16)
    per device: s = cast(s16, g.dtype)      # one Mirrored value per gradient

Integer, already-narrow and sparse (`IndexedSlices`) values pass unchanged.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfloop.collectives import _values
from tfloop.collectives.base import Wrapper
from tfloop.collectives.interface import Collective, CollectiveError

_DTYPES = {"bfloat16": tf.bfloat16, "float16": tf.float16}


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

    def _sum_replicas(self, values: list[Any], destinations: list[Any]) -> list[Any]:
        original = [
            _values.components(v)[0].dtype if self._compresses(v) else None for v in values
        ]
        narrow = [
            _values.map_components(lambda c: tf.cast(c, self.dtype), v, mirrored=False)
            if dtype is not None else v
            for v, dtype in zip(values, original)
        ]
        reduced = self.inner.batch_all_reduce(narrow, destinations)
        return [
            _values.map_components(lambda c, d=dtype: tf.cast(c, d), r, mirrored=True)
            if dtype is not None else r
            for r, dtype in zip(reduced, original)
        ]
