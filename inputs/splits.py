"""The splits a dataset is made of: in memory (`Examples`) or in files.

Three kinds, one contract (`image_shape`, `len()`), so `inputs.pipeline` can
turn any of them into global batches:

- `Examples`: uint8 images and labels in memory (synthetic, mnist.npz).
- `RecordFiles`: sharded TFRecord files written by `bin/convert_to_tfrecord`;
  the pipeline starts from the file list, so multi-worker `file` sharding
  gives each worker its own files.
- `ImageFiles`: one JPEG/PNG file per example (an image folder), decoded and
  resized inside `tf.data`.

Images stay uint8 until they are batched: a quarter of the memory of float32
in the `tf.data` cache, and one vectorized cast per batch instead of one per
example. None of these types touches TensorFlow, so a dataset can be loaded
and checked before the strategy exists (multi-worker collectives must be
configured before the runtime starts).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

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

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])


@dataclasses.dataclass(frozen=True)
class RecordFiles:
    """A split stored as TFRecord shards of `tf.train.Example`s (`inputs.tfrecord`).

    Attributes:
      files: the shard paths, sorted (the order eval reads them in, and the
        order `file` sharding deals them to workers from).
      count: examples over all files.
      image_shape: (H, W, C) of every image.
      record_bytes: average serialized record size, which bounds the
        shuffle buffer's memory.
      num_classes: labels lie in [0, num_classes), checked as records are
        read; None: not checked.
    """

    files: tuple[str, ...]
    count: int
    image_shape: tuple[int, int, int]
    record_bytes: int = 1024
    num_classes: Optional[int] = None

    def __len__(self) -> int:
        return self.count


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """A split of image files, one example each (`inputs.image_folder`).

    Attributes:
      paths: image file paths, sorted by class then name.
      labels: the class index of each path.
      image_shape: (size, size, 3): every image is decoded to RGB and resized.
    """

    paths: tuple[str, ...]
    labels: tuple[int, ...]
    image_shape: tuple[int, int, int]

    def __post_init__(self):
        if len(self.paths) != len(self.labels):
            raise ValueError(f"{len(self.paths)} paths but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.paths)


Split = Union[Examples, RecordFiles, ImageFiles]


@dataclasses.dataclass(frozen=True)
class Splits:
    """What a dataset builder returns: a train split and, optionally, an eval split."""

    train: Split
    eval: Optional[Split]
    num_classes: int
    class_names: tuple[str, ...] = ()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.image_shape)
