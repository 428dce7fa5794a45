"""`--dataset=imagenet`: the standard ImageNet TFRecord layout, as TF users already have it.

The layout tensorflow/models (`official/vision`, the legacy ResNet
`imagenet_preprocessing.py`) and tf_cnn_benchmarks read, and
`build_imagenet_data.py` (or `bin/convert_to_tfrecord --format=imagenet`)
writes::

    DATA_DIR/train-00000-of-01024 ... train-01023-of-01024
    DATA_DIR/validation-00000-of-00128 ... validation-00127-of-00128
    DATA_DIR/synsets.txt          optional: one class name (synset) per line,
                                  line L naming label L

Each record is a `tf.train.Example` with `image/encoded` (a JPEG of any
size; other formats are decoded too), `image/class/label` (int64, **1-based**
as the layout stores it: label L is class L - 1, as the references subtract),
and optionally `image/object/bbox/{xmin,ymin,xmax,ymax}` (float lists in [0, 1]),
which the train crop must cover at least a tenth of (`inputs.augment`).

The class count: the lines of `synsets.txt` when the folder has one (the
converter writes it), else 1000, ILSVRC-2012's, as the references assume. A
label outside [1, classes] stops the run with one line naming the file and the
record (`data_errors.check`).

`load` checks the folder in plain Python and `tf.io.gfile` (no TensorFlow
runtime: the multi-worker strategy must start first), so `--data_dir` may be
local, `gs://...` or `ram://...`: the names (train files present, one `-of-N`
total per split, no index missing), each split's first record (a readable
frame, an Example with the two keys and a label in range). The number of
examples: ILSVRC-2012's (1,281,167 and 50,000, as tensorflow/models
hard-codes them) when a split has its 1024 / 128 shards; otherwise counted
from the frames' headers on a local disk (12 bytes read per record: 160,000
records in 128 files took 3.2 s here); on a remote filesystem that would be a
read per record, so there it is unknown (`--epochs` then needs
`--steps_per_epoch`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
from typing import Optional

import tensorflow as tf

from tfloop.inputs import augment, data_errors, framing
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import ImageNetRecords, Splits

logger = logging.getLogger(__name__)

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
BBOX_KEYS = tuple(f"image/object/bbox/{k}" for k in ("ymin", "xmin", "ymax", "xmax"))
SYNSETS = "synsets.txt"
SPLIT_NAMES = ("train", "validation")
DEFAULT_CLASSES = 1000
DEFAULT_SIZE = 224
#: ILSVRC-2012 as build_imagenet_data.py shards it: (shards, examples) per split.
REFERENCE = {"train": (1024, 1_281_167), "validation": (128, 50_000)}
_NAME = re.compile(r"^(train|validation)-(\d{5})-of-(\d{5})$")


def shard_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}-{index:05d}-of-{num_shards:05d}"


# --- Reading (inside tf.data). ---


def parse(record, num_classes: int, path=None, index=None):
    """One serialized record → (JPEG bytes, 0-based int64 label, (N, 4) boxes
    [ymin, xmin, ymax, xmax]). With the record's `path` and `index`, a label
    outside [1, num_classes] stops the pipeline with one line naming them."""
    features = tf.io.parse_single_example(record, {
        IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
        **{key: tf.io.VarLenFeature(tf.float32) for key in BBOX_KEYS},
    })
    label = features[LABEL_KEY]
    if path is not None:
        ok = data_errors.check((label >= 1) & (label <= num_classes), lambda: tf.strings.join([
            path, " record ", tf.strings.as_string(index), ": ", LABEL_KEY, " ",
            tf.strings.as_string(label), f" is outside [1, {num_classes}] (the layout's labels "
            f"are 1-based; {num_classes} classes: {_classes_source()}); fix the record or "
            f"the class list"]))
        with tf.control_dependencies([ok]):
            label = tf.identity(label)
    boxes = tf.stack([tf.sparse.to_dense(features[key]) for key in BBOX_KEYS], axis=1)
    return features[IMAGE_KEY], label - 1, boxes


def _classes_source() -> str:
    return f"the lines of {SYNSETS}, else {DEFAULT_CLASSES}"


def decoder(split: ImageNetRecords, seed, *, random: bool):
    """The split's decode function inside `tf.data`, on (path, index, record)
    as `pipeline.read_records(named=True)` yields them: the central crop, or
    with `random` (an augmented train stream) `(position, path, index,
    record)` → the random crop and flip of `augment.example_seed(seed, position)`."""
    size = split.image_shape[0]
    if not random:
        def central(path, index, record):
            encoded, label, _ = parse(record, split.num_classes, path, index)
            return augment.eval_image(encoded, size), label
        return central
    seed = augment.run_seed(seed)

    def cropped(position, path, index, record):
        encoded, label, boxes = parse(record, split.num_classes, path, index)
        return augment.train_image(encoded, augment.example_seed(seed, position), size,
                                   boxes), label
    return cropped


# --- Loading (plain Python and tf.io.gfile: no TensorFlow runtime). ---


def _shards(data_dir: str, names: list[str], split: str) -> tuple[str, ...]:
    """The split's files in index order; refuses mixed totals and gaps."""
    found = {}
    for name in names:
        match = _NAME.match(name)
        if match and match.group(1) == split:
            found.setdefault(int(match.group(3)), []).append(int(match.group(2)))
    if not found:
        return ()
    if len(found) > 1:
        totals = ", ".join(f"-of-{t:05d}" for t in sorted(found))
        raise InputError(f"--data_dir={data_dir}: the {split} files name several totals "
                         f"({totals}); keep one complete set of {split}-*-of-N files")
    (total, indices), = found.items()
    missing = sorted(set(range(total)) - set(indices))
    if missing or max(indices) >= total:
        what = (f"{shard_name(split, missing[0], total)} is missing" if missing else
                f"{shard_name(split, max(indices), total)} is beyond its total")
        raise InputError(f"--data_dir={data_dir}: {what} ({len(set(indices))} of {total} "
                         f"{split} files found); copy the whole set or re-create it")
    return tuple(os.path.join(data_dir, shard_name(split, i, total)) for i in range(total))


def _check_first(path: str, num_classes: int) -> int:
    """The first record of `path` reads and is an example of the layout; its size."""
    try:
        record = framing.first_record(path)
    except framing.Damaged as damage:
        raise InputError(f"{path} is not a readable TFRecord file ({damage}); re-create it "
                         "(bin/convert_to_tfrecord --format=imagenet)") from None
    except (OSError, tf.errors.OpError) as error:
        reason = " ".join(str(getattr(error, "message", None) or error).split())[:80]
        raise InputError(f"{path} cannot be read ({type(error).__name__}: {reason})") from None
    if record is None:
        raise InputError(f"{path} holds no record (0 bytes); remove it and renumber, or "
                         "re-create the files")
    try:
        feature = tf.train.Example.FromString(record).features.feature
    except Exception:  # DecodeError (its module varies)
        raise InputError(f"{path} record 0 is not a tf.train.Example; re-create the file") \
            from None
    missing = [k for k in (IMAGE_KEY, LABEL_KEY) if k not in feature]
    if missing:
        raise InputError(f"{path} record 0 has no {' or '.join(missing)} (it has "
                         f"{', '.join(sorted(feature)) or 'no feature'}); --dataset=imagenet "
                         f"reads the ImageNet layout: {IMAGE_KEY} (JPEG), {LABEL_KEY} (1-based)")
    labels = feature[LABEL_KEY].int64_list.value
    if len(labels) != 1 or not 1 <= labels[0] <= num_classes:
        raise InputError(f"{path} record 0: {LABEL_KEY} {list(labels)} is not one label in "
                         f"[1, {num_classes}] (1-based; {num_classes} classes: "
                         f"{_classes_source()})")
    return len(record)


def _class_names(data_dir: str) -> tuple[str, ...]:
    path = os.path.join(data_dir, SYNSETS)
    if not tf.io.gfile.exists(path):
        return ()
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            names = [line.strip() for line in f.read().splitlines()]
    except (OSError, UnicodeDecodeError, tf.errors.OpError) as error:
        raise InputError(f"{path} cannot be read as text ({type(error).__name__}); it lists "
                         "one class name per line") from None
    while names and not names[-1]:
        names.pop()
    if not names or not all(names):
        raise InputError(f"{path} has {'no line' if not names else 'an empty line'}; it lists "
                         "one class name per line, line L for label L")
    return tuple(names)


def _count(data_dir: str, split: str, files: tuple[str, ...]) -> Optional[int]:
    """The split's examples: ILSVRC-2012's for its shard layout (as the
    references hard-code them), else counted from the headers on a local
    disk, else (remote) unknown."""
    shards, examples = REFERENCE[split]
    if len(files) == shards:
        logger.info("imagenet: %s holds ILSVRC-2012's %d %s shards: %d examples, as "
                    "tensorflow/models counts them (not read)", data_dir, shards, split, examples)
        return examples
    if "://" in data_dir:
        logger.info("imagenet: the %s examples of %s are not counted (a remote filesystem: a "
                    "read per record); --epochs needs --steps_per_epoch", split, data_dir)
        return None
    def count(path):
        try:
            return framing.count_records(path)
        except framing.Damaged as damage:
            raise InputError(f"{path} is damaged: {damage}; re-create it") from None
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return sum(pool.map(count, files))


def load(*, data_dir: str, image_size: int = 0, augment_train: str = "inception") -> Splits:
    """The `--dataset=imagenet` loader (the checks of the module docstring).
    `augment_train`: `inception` (the standard crop and flip) or `none` (the
    train split centrally cropped, as eval)."""
    augment.check(augment_train)
    if not data_dir:
        raise InputError("--dataset=imagenet needs --data_dir, a folder of train-*-of-* and "
                         "validation-*-of-* TFRecord files (the ImageNet layout)")
    if not tf.io.gfile.isdir(data_dir):
        raise InputError(f"--data_dir={data_dir} is not a directory; point it at the folder "
                         "of the ImageNet TFRecords")
    names = [n.rstrip("/") for n in tf.io.gfile.listdir(data_dir)]
    train_files = _shards(data_dir, names, "train")
    if not train_files:
        raise InputError(f"--data_dir={data_dir} holds no train-NNNNN-of-NNNNN files; write "
                         "them with bin/convert_to_tfrecord --format=imagenet (or "
                         "tensorflow/models' build_imagenet_data.py)")
    eval_files = _shards(data_dir, names, "validation")
    class_names = _class_names(data_dir)
    num_classes = len(class_names) or DEFAULT_CLASSES
    shape = (image_size or DEFAULT_SIZE,) * 2 + (3,)

    def split(files, name, train):
        first_bytes = _check_first(files[0], num_classes)
        return ImageNetRecords(files=files, count=_count(data_dir, name, files),
                               image_shape=shape, num_classes=num_classes, train=train,
                               augment=augment_train, record_bytes=first_bytes + 16)

    return Splits(train=split(train_files, "train", True),
                  eval=split(eval_files, "validation", False) if eval_files else None,
                  num_classes=num_classes, class_names=class_names)
