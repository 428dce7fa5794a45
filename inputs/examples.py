"""In-memory labelled images, the common currency of the image datasets.

Images stay uint8 until they are batched: a quarter of the memory of float32
in the `tf.data` cache, and one vectorized cast per batch instead of one per
example.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Examples:
    """Images `x` (N, H, W, C) uint8 and integer labels `y` (N,)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self):
        if self.x.dtype != np.uint8 or self.x.ndim != 4:
            raise ValueError(f"x must be uint8 (N, H, W, C), got {self.x.dtype} {self.x.shape}")
        if self.y.shape != (self.x.shape[0],):
            raise ValueError(f"y must have shape ({self.x.shape[0]},), got {self.y.shape}")

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclasses.dataclass(frozen=True)
class Splits:
    """What a dataset builder returns: a train split and, optionally, an eval split."""

    train: Examples
    eval: Examples | None
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])
