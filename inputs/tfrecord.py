"""Sharded TFRecord datasets: the format and the loader (`inputs.convert` writes them).

A TFRecord folder, as `bin/convert_to_tfrecord` writes it::

    metadata.json                      image_shape, num_classes, class_names,
                                       and per split its count and file names
    train-00000-of-00004.tfrecord      tf.train.Example records, examples in
    ...                                source order, cut into contiguous shards
    eval-00000-of-00004.tfrecord       (present when the source has an eval split)

Each record is a `tf.train.Example` with `image/encoded` (the uint8 image as
PNG: lossless, and how TensorFlow's own image TFRecords store pixels) and
`image/class/label` (int64), the feature names of TF Model Garden's image
datasets. The metadata lets the loader check the folder without reading a
record, and without starting TensorFlow's runtime (multi-worker collectives
must be configured first). Files are listed and read through `tf.io.gfile`
(which starts no runtime either), so the folder may be `gs://...` or
`ram://...`.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Examples, RecordFiles, Splits

METADATA = "metadata.json"
FORMAT = "tfloop.tfrecord"
VERSION = 1
IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
SPLIT_NAMES = ("train", "eval")


def shard_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


# --- Reading (inside tf.data). ---


def parse(serialized, image_shape: tuple[int, int, int]):
    """One serialized record → (uint8 image of `image_shape`, int64 label).

    A record whose image has another shape fails here, at the first batch,
    rather than as a shape error deep inside the model.
    """
    features = tf.io.parse_single_example(serialized, {
        IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.io.decode_png(features[IMAGE_KEY], channels=image_shape[-1])
    return tf.ensure_shape(image, image_shape), features[LABEL_KEY]


# --- Loading (plain Python and tf.io.gfile: no TensorFlow runtime). ---


def _bad(data_dir: str, reason: str) -> InputError:
    return InputError(
        f"{os.path.join(data_dir, METADATA)} is not valid ({reason}); "
        "re-create the folder with bin/convert_to_tfrecord"
    )


def _split(data_dir: str, name: str, entry, image_shape) -> RecordFiles:
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), list) \
            or not isinstance(entry.get("count"), int) or entry["count"] < 1:
        raise _bad(data_dir, f"splits.{name} needs a positive 'count' and a 'files' list")
    listed = sorted(entry["files"])
    found = sorted(f for f in tf.io.gfile.listdir(data_dir)
                   if f.startswith(f"{name}-") and f.endswith(".tfrecord"))
    if not found:
        raise InputError(
            f"--data_dir={data_dir} holds no {name}-*.tfrecord files although {METADATA} lists "
            f"{len(listed)}; re-create the folder with bin/convert_to_tfrecord"
        )
    if found != listed:
        missing = sorted(set(listed) - set(found)) or sorted(set(found) - set(listed))
        raise InputError(
            f"--data_dir={data_dir}: the {name} files on disk differ from those {METADATA} lists "
            f"(e.g. {missing[0]}); re-create the folder with bin/convert_to_tfrecord"
        )
    paths = tuple(os.path.join(data_dir, f) for f in listed)
    total_bytes = sum(tf.io.gfile.stat(p).length for p in paths)
    return RecordFiles(files=paths, count=entry["count"], image_shape=image_shape,
                       record_bytes=max(1, total_bytes // entry["count"]))


def load(*, data_dir: str) -> Splits:
    """The `--dataset=tfrecord` loader: checks the folder, reads no record."""
    if not data_dir:
        raise InputError(
            "--dataset=tfrecord needs --data_dir, a folder written by bin/convert_to_tfrecord"
        )
    if not tf.io.gfile.isdir(data_dir):
        raise InputError(
            f"--data_dir={data_dir} is not a directory; write one with "
            "bin/convert_to_tfrecord --output_dir=..."
        )
    path = os.path.join(data_dir, METADATA)
    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        raise InputError(
            f"--data_dir={data_dir} has no {METADATA}; write the folder with "
            "bin/convert_to_tfrecord"
        )
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            meta = json.load(f)
    except (OSError, ValueError, tf.errors.OpError) as error:
        raise _bad(data_dir, f"{type(error).__name__}: {str(error)[:80]}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _bad(data_dir, f"'format' is not {FORMAT!r}")
    shape = meta.get("image_shape")
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(d, int) and d > 0 for d in shape)):
        raise _bad(data_dir, "'image_shape' must be [height, width, channels]")
    if shape[-1] not in (1, 3, 4):
        raise _bad(data_dir, f"images have {shape[-1]} channels; PNG holds 1, 3 or 4")
    num_classes = meta.get("num_classes")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise _bad(data_dir, "'num_classes' must be a positive integer")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or "train" not in splits:
        raise _bad(data_dir, "'splits' must name at least a 'train' split")
    image_shape = tuple(shape)
    train = _split(data_dir, "train", splits["train"], image_shape)
    evaluation = _split(data_dir, "eval", splits["eval"], image_shape) if splits.get("eval") else None
    names = meta.get("class_names") or []
    return Splits(train=train, eval=evaluation, num_classes=num_classes,
                  class_names=tuple(str(n) for n in names))


def read_all(split: RecordFiles) -> Examples:
    """Every example of `split` in file order (tests and small tools)."""
    ds = tf.data.TFRecordDataset(list(split.files)).map(lambda r: parse(r, split.image_shape))
    images, labels = [], []
    for image, label in ds.batch(1024):
        images.append(image.numpy())
        labels.append(label.numpy())
    return Examples(x=np.concatenate(images), y=np.concatenate(labels))
