"""The standard ImageNet preprocessing: Inception-style crop + flip to train, central crop to eval.

As the references define it: tensorflow/models
`official/legacy/image_classification/preprocessing.py` (`decode_crop_and_flip`,
`decode_and_center_crop`, `MEAN_RGB`/`STDDEV_RGB`), the TPU and
`official/vision/ops/preprocess_ops.py` ResNet pipelines and tf_cnn_benchmarks'
`preprocessing.py`:

- train: the JPEG's shape from its header (`tf.image.extract_jpeg_shape`, no
  decode), a box drawn by `sample_distorted_bounding_box` (at least 0.1 of an
  object box, or of the whole image when the record has none; aspect ratio
  3/4..4/3; 8 %..100 % of the area; 10 attempts, else the whole image), only
  that box decoded (`tf.image.decode_and_crop_jpeg`), a left-right flip with
  probability 1/2, a bilinear resize to `image_size` square;
- eval: the central square of `image_size / (image_size + 32)` of the shorter
  side (224/256: `CROP_PADDING` 32), decoded alone, resized the same way.

Both give uint8 RGB (rounded, as `image_folder.decode` does): a quarter of
the bytes of float32 to batch and copy to the device, where the step scales
and normalizes them (`pipeline.to_float` with `splits.IMAGENET_NORMALIZATION`).

Randomness is *stateless*: each example's crop and flip are a function of
`example_seed(run seed, position)`, its position in the endless train stream
(attached before the resume `skip`), never of a generator's state. A resumed
run therefore sees exactly the crops and flips an uninterrupted one sees, two
runs with one seed see the same, and the same image gets another crop in the
next epoch (another position).

Images that are not JPEG (an image folder's PNG/GIF/BMP, a record written
by hand) are decoded whole and cropped with the very same box: the box depends
only on the shape and the seed.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from tfloop.inputs.errors import InputError

#: The names `--augment` takes: `none` (a dataset's plain decode) or `inception`.
AUGMENTATIONS = ("none", "inception")
CROP_PADDING = 32
MIN_OBJECT_COVERED = 0.1
ASPECT_RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
AREA_RANGE = (0.08, 1.0)
MAX_ATTEMPTS = 10


def run_seed(seed: Optional[int]) -> int:
    """The run's seed, or one drawn now where the run has none (a
    parameter-server worker draws its own order, and so its own crops)."""
    return int(np.random.SeedSequence().generate_state(1)[0]) if seed is None else int(seed)


def check(name: str) -> None:
    """Refuses an unknown `--augment` in one line."""
    if name not in AUGMENTATIONS:
        raise InputError(f"--augment={name!r} is not one of: {', '.join(AUGMENTATIONS)}")


def example_seed(run_seed, position) -> tf.Tensor:
    """The stateless seed (shape [2], int64) of the example at `position` of
    the stream of a run seeded `run_seed`."""
    return tf.stack([tf.cast(run_seed, tf.int64), tf.cast(position, tf.int64)])


def _either(encoded: tf.Tensor, preprocess) -> tf.Tensor:
    """`preprocess(shape, decode)` of the encoded image, where `shape` is its
    (height, width) and `decode(window)` gives uint8 RGB of the window
    [y, x, h, w]: a JPEG's shape is read from its header and only the window is
    decoded; another format is decoded once, whole, and sliced."""
    def jpeg():
        return preprocess(tf.image.extract_jpeg_shape(encoded)[:2],
                          lambda window: tf.image.decode_and_crop_jpeg(encoded, window,
                                                                       channels=3))

    def other():
        image = _decode_any(encoded)
        return preprocess(tf.shape(image)[:2], lambda window: tf.slice(
            image, tf.concat([window[:2], [0]], 0), tf.concat([window[2:], [3]], 0)))
    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def _decode_any(encoded: tf.Tensor) -> tf.Tensor:
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    return tf.ensure_shape(image, [None, None, 3])


def _resized(image: tf.Tensor, image_size: int) -> tf.Tensor:
    image = tf.image.resize(image, [image_size, image_size], method="bilinear")
    image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
    return tf.ensure_shape(image, [image_size, image_size, 3])


def train_image(encoded: tf.Tensor, seed: tf.Tensor, image_size: int,
                boxes: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Encoded image → (image_size, image_size, 3) uint8: random crop, flip,
    resize, as the module docstring says. `boxes`: (N, 4) object boxes
    [ymin, xmin, ymax, xmax] in [0, 1] (N may be 0: the whole image)."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if boxes is None:
        boxes = tf.zeros([0, 4], tf.float32)

    def preprocess(shape, decode):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.concat([shape, [3]], 0), bounding_boxes=tf.reshape(boxes, [1, -1, 4]),
            seed=crop_seed, min_object_covered=MIN_OBJECT_COVERED,
            aspect_ratio_range=ASPECT_RATIO_RANGE, area_range=AREA_RANGE,
            max_attempts=MAX_ATTEMPTS, use_image_if_no_bounding_boxes=True)
        image = decode(tf.stack([begin[0], begin[1], size[0], size[1]]))
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        return _resized(image, image_size)
    return _either(encoded, preprocess)


def central_window(shape: tf.Tensor, image_size: int) -> tf.Tensor:
    """[y, x, h, w] of the central square, `image_size / (image_size +
    CROP_PADDING)` of the shorter side (at least one pixel)."""
    fraction = image_size / (image_size + CROP_PADDING)
    side = tf.maximum(1, tf.cast(fraction * tf.cast(tf.reduce_min(shape), tf.float32), tf.int32))
    return tf.stack([(shape[0] - side + 1) // 2, (shape[1] - side + 1) // 2, side, side])


def eval_image(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
    """Encoded image → (image_size, image_size, 3) uint8: central crop, resize."""
    return _either(encoded, lambda shape, decode: _resized(
        decode(central_window(shape, image_size)), image_size))
