"""Sharded TFRecord datasets: the format and the loader (`inputs.convert` writes them).

A TFRecord folder, as `bin/convert_to_tfrecord` writes it::

    metadata.json                      image_shape, num_classes, class_names,
                                       and per split its count, file names, and
                                       each file's record count and byte size
    train-00000-of-00004.tfrecord      tf.train.Example records, examples in
    ...                                source order, cut into contiguous shards
    eval-00000-of-00004.tfrecord       (present when the source has an eval split)

Each record is a `tf.train.Example` with `image/encoded` (the uint8 image as
PNG: lossless, and how TensorFlow's own image TFRecords store pixels) and
`image/class/label` (int64), the feature names of TF Model Garden's image
datasets. The metadata lets the loader check the folder cheaply (a `stat`
and the first record of each shard: what is and is not checked is listed at
`_check_shards`), without starting TensorFlow's runtime (multi-worker
collectives must be configured first). Files are listed and read through `tf.io.gfile`
(which starts no runtime either), so the folder may be `gs://...` or
`ram://...`.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from typing import Optional

import numpy as np
import tensorflow as tf

from tfloop.inputs import data_errors, framing
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Examples, RecordFiles, Splits

METADATA = "metadata.json"
FORMAT = "tfloop.tfrecord"
VERSION = 2  # 2: each split also lists its shards' record counts and byte sizes
IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
SPLIT_NAMES = ("train", "eval")

logger = logging.getLogger(__name__)


def shard_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


# --- Reading (inside tf.data). ---


def parse(serialized, image_shape: tuple[int, int, int], num_classes: Optional[int] = None,
          path=None, index=None):
    """One serialized record → (uint8 image of `image_shape`, int64 label).

    With the record's `path` and `index` (as `pipeline.read_records(...,
    named=True)` yields them), an image of another height or width, or a
    label outside `[0, num_classes)`, stops the pipeline with one line naming
    the file and the record (`data_errors.check`); without them the shape
    still fails here, unnamed, rather than deep inside the model.
    """
    features = tf.io.parse_single_example(serialized, {
        IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.io.decode_png(features[IMAGE_KEY], channels=image_shape[-1])
    label = features[LABEL_KEY]
    if path is not None:
        where = lambda: tf.strings.join([path, " record ", tf.strings.as_string(index)])
        shape = tf.shape(image, out_type=tf.int64)[:2]
        ok = data_errors.check(tf.reduce_all(tf.equal(shape, image_shape[:2])), lambda: (
            tf.strings.join([where(), ": the image is ", tf.strings.as_string(shape[0]), "x",
                             tf.strings.as_string(shape[1]), f" but {METADATA} says "
                             f"{image_shape[0]}x{image_shape[1]}; re-create the folder with "
                             "bin/convert_to_tfrecord"])))
        if num_classes is not None:
            ok = data_errors.check(ok & (label >= 0) & (label < num_classes), lambda: (
                tf.strings.join([where(), ": label ", tf.strings.as_string(label),
                                 f" is outside [0, {num_classes}), the num_classes of "
                                 f"{METADATA}; fix the labels or the metadata"])))
        with tf.control_dependencies([ok]):
            image = tf.identity(image)
    return tf.ensure_shape(image, image_shape), label


# --- Loading (plain Python and tf.io.gfile: no TensorFlow runtime). ---


def _bad(data_dir: str, reason: str) -> InputError:
    return InputError(
        f"{os.path.join(data_dir, METADATA)} is not valid ({reason}); "
        "re-create the folder with bin/convert_to_tfrecord"
    )


def _split(data_dir: str, name: str, entry, image_shape, num_classes: int) -> RecordFiles:
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
    paths = tuple(os.path.join(data_dir, f) for f in entry["files"])
    sizes = [tf.io.gfile.stat(p).length for p in paths]
    _check_shards(data_dir, name, entry, paths, sizes, image_shape, num_classes)
    return RecordFiles(files=tuple(sorted(paths)), count=entry["count"], image_shape=image_shape,
                       record_bytes=max(1, sum(sizes) // entry["count"]), num_classes=num_classes)


def _check_shards(data_dir: str, name: str, entry: dict, paths, sizes, image_shape,
                  num_classes: int) -> None:
    """Refuses a shard that cannot hold what metadata.json says it holds.

    Version 2 metadata lists each shard's record count and byte size: a size
    that differs (a truncated, emptied or replaced shard) is refused at the
    cost of a `stat`. Every shard's first record header is read (12 bytes and
    its checksum: random bytes, a text file), and the first record itself
    (its label and PNG size). Older metadata has the split's total only: the
    shards' headers are walked to count their records (12 bytes read per
    record, on a local disk; skipped, with a log line, elsewhere). Damage
    inside a record's data is found only when training reads it
    (`data_errors`).
    """
    counts, byte_sizes = entry.get("counts"), entry.get("bytes")
    listed = isinstance(counts, list) and isinstance(byte_sizes, list) and (
        len(counts) == len(byte_sizes) == len(paths))
    if listed and sum(counts) != entry["count"]:
        raise _bad(data_dir, f"splits.{name}: its shards' counts add up to {sum(counts)}, "
                             f"not its count {entry['count']}")
    for i, (path, size) in enumerate(zip(paths, sizes)):
        if listed and size != byte_sizes[i]:
            raise InputError(
                f"{path} holds {size} bytes but {METADATA} says {byte_sizes[i]} "
                f"({counts[i]} records): the shard is truncated or was replaced; re-create "
                "the folder with bin/convert_to_tfrecord")
        try:
            record = framing.first_record(path)
        except framing.Damaged as damage:
            raise InputError(f"{path} is not a readable TFRecord shard ({damage}); re-create "
                             "the folder with bin/convert_to_tfrecord") from None
        except (OSError, tf.errors.OpError) as error:
            raise _unreadable(path, error) from None
        if record is None:
            raise InputError(f"{path} holds no record (0 bytes), and every shard the converter "
                             f"writes holds at least one: the {name} split has fewer than the "
                             f"{entry['count']} examples {METADATA} says; re-create the folder "
                             "with bin/convert_to_tfrecord")
        _check_first(path, record, image_shape, num_classes)
    if listed:
        return
    if "://" in data_dir:
        logger.info("%s: %s predates per-shard counts; the %s shards' records are not "
                    "counted on a remote filesystem", data_dir, METADATA, name)
        return
    found = []
    for path in paths:
        try:
            found.append(framing.count_records(path))
        except framing.Damaged as damage:
            raise InputError(f"{path} is damaged: {damage}; re-create the folder with "
                             "bin/convert_to_tfrecord") from None
        except (OSError, tf.errors.OpError) as error:
            raise _unreadable(path, error) from None
    if sum(found) != entry["count"]:
        raise InputError(
            f"--data_dir={data_dir}: the {name} shards hold {sum(found)} records "
            f"({', '.join(f'{os.path.basename(p)}: {n}' for p, n in zip(paths, found))}) but "
            f"{METADATA} says {entry['count']}; re-create the folder with "
            "bin/convert_to_tfrecord")


def _unreadable(path: str, error: Exception) -> InputError:
    """A shard the loader cannot open or read (a folder in its place, no permission)."""
    text = " ".join(str(getattr(error, "message", None) or error).split())
    return InputError(f"{path} cannot be read ({type(error).__name__}: {text[:80]}); re-create "
                      "the folder with bin/convert_to_tfrecord")


def _check_first(path: str, record: bytes, image_shape, num_classes: int) -> None:
    """The first record of a shard: a tf.train.Example with a label in
    [0, num_classes) and a PNG of the metadata's height and width (read from
    its header, not decoded)."""
    try:
        feature = tf.train.Example.FromString(record).features.feature
        label = feature[LABEL_KEY].int64_list.value[0]
        png = feature[IMAGE_KEY].bytes_list.value[0]
    except Exception:  # DecodeError (module varies), a missing key or value
        raise InputError(f"{path} record 0 is not an example of this format ({IMAGE_KEY}, "
                         f"{LABEL_KEY}); re-create the folder with bin/convert_to_tfrecord"
                         ) from None
    if not 0 <= label < num_classes:
        raise InputError(f"{path} record 0: label {label} is outside [0, {num_classes}), the "
                         f"num_classes of {METADATA}; fix the labels or the metadata")
    height, width = image_shape[:2]
    if png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR":
        png_width, png_height = struct.unpack(">II", png[16:24])
        if (png_height, png_width) != (height, width):
            raise InputError(f"{path} record 0: the image is {png_height}x{png_width} but "
                             f"{METADATA} says {height}x{width}; re-create the folder with "
                             "bin/convert_to_tfrecord")
    else:
        raise InputError(f"{path} record 0: {IMAGE_KEY} is not a PNG image; re-create the "
                         "folder with bin/convert_to_tfrecord")


def load(*, data_dir: str) -> Splits:
    """The `--dataset=tfrecord` loader: checks the folder and each shard's
    size and first record (`_check_shards`), without starting TensorFlow's runtime."""
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
    train = _split(data_dir, "train", splits["train"], image_shape, num_classes)
    evaluation = (_split(data_dir, "eval", splits["eval"], image_shape, num_classes)
                  if splits.get("eval") else None)
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
