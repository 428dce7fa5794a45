"""The splits a dataset is made of: in memory (`Examples`) or in files.

Four kinds, one contract (`image_shape`, `len()`), so `inputs.pipeline` can
turn any of them into global batches:

- `Examples`: uint8 images and labels in memory (synthetic, mnist.npz).
- `RecordFiles`: sharded TFRecord files written by `bin/convert_to_tfrecord`;
  the pipeline starts from the file list, so multi-worker `file` sharding
  gives each worker its own files.
- `ImageFiles`: one JPEG/PNG file per example (an image folder), decoded and
  resized inside `tf.data` (or, with `augment="inception"`, cropped as
  `inputs.augment` does).
- `ImageNetRecords`: TFRecord shards in the standard ImageNet layout
  (`inputs.imagenet`): JPEGs of any size, cropped and resized in `tf.data`
  (`inputs.augment`), file-sharded between workers like `RecordFiles`.

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
class Normalization:
    """Per-channel `(pixel - mean) / std`, pixels in 0..255, applied where the
    uint8 pixels become floats (`pipeline.to_float`: in the step, on the device)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self):
        if len(self.mean) != len(self.std) or not all(s > 0 for s in self.std):
            raise ValueError(f"mean {self.mean} and std {self.std} must be per channel, "
                             "std positive")


#: ImageNet's per-channel statistics (tensorflow/models' MEAN_RGB, STDDEV_RGB).
IMAGENET_NORMALIZATION = Normalization(mean=(0.485 * 255, 0.456 * 255, 0.406 * 255),
                                       std=(0.229 * 255, 0.224 * 255, 0.225 * 255))


@dataclasses.dataclass(frozen=True)
class ImageNetRecords:
    """A split stored as TFRecord shards of the standard ImageNet layout.

    Attributes:
      files: the shard paths, sorted (`train-00000-of-01024`, ...).
      count: examples over all files, or None where it is not known (remote
        files not counted: `--epochs` then needs `--steps_per_epoch`).
      image_shape: (image_size, image_size, 3): what preprocessing yields.
      num_classes: labels (1-based in the files) lie in [1, num_classes].
      train: random crop and flip (`inputs.augment.train_image`) when True and
        `augment` is "inception"; the central crop otherwise.
      augment: "inception" or "none" (train with the eval preprocessing).
      record_bytes: average serialized record size (bounds the shuffle buffer).
      normalization: what the step applies when it scales the pixels.
    """

    files: tuple[str, ...]
    count: Optional[int]
    image_shape: tuple[int, int, int]
    num_classes: int
    train: bool = True
    augment: str = "inception"
    record_bytes: int = 110_000
    normalization: Optional[Normalization] = IMAGENET_NORMALIZATION

    def __len__(self) -> int:
        if self.count is None:
            raise TypeError("the split's size is unknown (its files were not counted)")
        return self.count

    @property
    def augmented(self) -> bool:
        """Whether each example's pixels depend on its stream position."""
        return self.train and self.augment == "inception"


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """A split of image files, one example each (`inputs.image_folder`).

    Attributes:
      paths: image file paths, sorted by class then name.
      labels: the class index of each path.
      image_shape: (size, size, 3): every image is decoded to RGB and resized.
      augment: "none" (resized whole, no randomness) or "inception" (the
        train split cropped at random and flipped, the eval split centrally
        cropped: `inputs.augment`).
      train: whether this is the train split (decides the crop above).
    """

    paths: tuple[str, ...]
    labels: tuple[int, ...]
    image_shape: tuple[int, int, int]
    augment: str = "none"
    train: bool = True

    @property
    def augmented(self) -> bool:
        """Whether each example's pixels depend on its stream position."""
        return self.train and self.augment == "inception"

    def __post_init__(self):
        if len(self.paths) != len(self.labels):
            raise ValueError(f"{len(self.paths)} paths but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.paths)


Split = Union[Examples, RecordFiles, ImageFiles, ImageNetRecords]


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

    @property
    def normalization(self) -> Optional[Normalization]:
        """What the step applies when it scales the uint8 pixels (None: to [0, 1])."""
        return getattr(self.train, "normalization", None)
