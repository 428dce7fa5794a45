"""Sharded TFRecord datasets: the format, the converter's writer, the loader.

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
must be configured first).

The writer is atomic: it writes into a temporary sibling folder and renames
it into place, so a crash leaves no half-written dataset behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Iterator

import numpy as np

from inputs.errors import InputError
from inputs.splits import Examples, ImageFiles, RecordFiles, Split, Splits

logger = logging.getLogger("engine")

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
    import tensorflow as tf

    features = tf.io.parse_single_example(serialized, {
        IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.io.decode_png(features[IMAGE_KEY], channels=image_shape[-1])
    return tf.ensure_shape(image, image_shape), features[LABEL_KEY]


# --- Loading (plain Python: no TensorFlow runtime). ---


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
    found = sorted(f for f in os.listdir(data_dir)
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
    total_bytes = sum(os.path.getsize(p) for p in paths)
    return RecordFiles(files=paths, count=entry["count"], image_shape=image_shape,
                       record_bytes=max(1, total_bytes // entry["count"]))


def load(*, data_dir: str) -> Splits:
    """The `--dataset=tfrecord` loader: checks the folder, reads no record."""
    if not data_dir:
        raise InputError(
            "--dataset=tfrecord needs --data_dir, a folder written by bin/convert_to_tfrecord"
        )
    if not os.path.isdir(data_dir):
        raise InputError(
            f"--data_dir={data_dir} is not a directory; write one with "
            "bin/convert_to_tfrecord --output_dir=..."
        )
    path = os.path.join(data_dir, METADATA)
    if not os.path.isfile(path):
        raise InputError(
            f"--data_dir={data_dir} has no {METADATA}; write the folder with "
            "bin/convert_to_tfrecord"
        )
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as error:
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


# --- Writing (the converter). ---


def _check_output_dir(output_dir: str) -> str:
    if not output_dir:
        raise InputError("--output_dir is empty; name the folder to write the TFRecords into")
    output_dir = os.path.abspath(output_dir)
    if os.path.exists(output_dir):
        if not os.path.isdir(output_dir):
            raise InputError(f"--output_dir={output_dir} is a file; name a new directory")
        if os.listdir(output_dir):
            raise InputError(
                f"--output_dir={output_dir} is not empty; name a new or empty directory "
                "(the converter never overwrites a dataset)"
            )
    parent = os.path.dirname(output_dir)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--output_dir={output_dir} cannot be created: {parent} is not a "
                          "writable directory")
    return output_dir


def _examples(split: Split, batch: int = 256) -> Iterator[tuple[np.ndarray, int]]:
    """(uint8 image, label) in the split's order; image files are decoded in tf.data."""
    if isinstance(split, Examples):
        for image, label in zip(split.x, split.y):
            yield image, int(label)
        return
    if isinstance(split, ImageFiles):
        from inputs import image_folder

        for images, labels in image_folder.decoded(split).batch(batch):
            for image, label in zip(images.numpy(), labels.numpy()):
                yield image, int(label)
        return
    raise TypeError(f"cannot convert a {type(split).__name__}")


def _serialize(image: np.ndarray, label: int) -> bytes:
    import tensorflow as tf

    encoded = tf.io.encode_png(image).numpy()
    return tf.train.Example(features=tf.train.Features(feature={
        IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def _write_split(directory: str, name: str, split: Split, num_shards: int) -> dict:
    """Contiguous shards: example i goes to shard i * num_shards // count, so
    reading the files in name order gives the source order back."""
    import tensorflow as tf

    count = len(split)
    num_shards = min(num_shards, count) if name != "train" else num_shards
    files = [shard_name(name, i, num_shards) for i in range(num_shards)]
    writers = [None] * num_shards
    try:
        written = 0
        for index, (image, label) in enumerate(_examples(split)):
            shard = index * num_shards // count
            if writers[shard] is None:
                writers[shard] = tf.io.TFRecordWriter(os.path.join(directory, files[shard]))
            writers[shard].write(_serialize(image, label))
            written += 1
    finally:
        for writer in writers:
            if writer is not None:
                writer.close()
    if written != count:
        raise InputError(f"the {name} split gave {written} examples, expected {count}")
    return {"count": count, "files": files}


def write(splits: Splits, output_dir: str, *, num_shards: int, source: str = "") -> str:
    """Writes `splits` as sharded TFRecords + metadata.json into `output_dir`.

    `output_dir` must not exist or be empty. Everything is written into a
    temporary sibling first and renamed into place at the end. Returns the
    absolute output path.

    This is also the way to make a TFRecord folder in a test::

        tfrecord.write(synthetic.load(seed=0, num_train=512, num_eval=128),
                       str(tmp_path / "records"), num_shards=4)
    """
    if num_shards < 1:
        raise InputError(f"--num_shards={num_shards} must be a positive integer")
    if len(splits.train) < num_shards:
        raise InputError(
            f"--num_shards={num_shards} is more than the {len(splits.train)} train examples; "
            "use fewer shards"
        )
    output_dir = _check_output_dir(output_dir)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.tmp-",
                               dir=os.path.dirname(output_dir))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 is for the temporary name only
    try:
        meta = {
            "format": FORMAT, "version": VERSION, "source": source,
            "image_shape": [int(d) for d in splits.input_shape],
            "num_classes": int(splits.num_classes),
            "class_names": list(splits.class_names),
            "features": {IMAGE_KEY: "PNG-encoded uint8 image", LABEL_KEY: "int64 class index"},
            "splits": {},
        }
        for name, split in (("train", splits.train), ("eval", splits.eval)):
            if split is not None and len(split):
                meta["splits"][name] = _write_split(staging, name, split, num_shards)
        with open(os.path.join(staging, METADATA), "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # empty, checked above
        os.rename(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("wrote %s: %s", output_dir, ", ".join(
        f"{name} {entry['count']} examples in {len(entry['files'])} files"
        for name, entry in meta["splits"].items()))
    return output_dir


SOURCES = ("synthetic", "mnist", "image_folder")


def convert(source: str, *, output_dir: str, num_shards: int, data_dir: str = "",
            image_size: int = 224, eval_fraction: float = 0.2, seed: int = 0) -> str:
    """`bin/convert_to_tfrecord`: loads `source` as `--dataset=<source>` would and writes it."""
    if source not in SOURCES:
        raise InputError(f"--source={source!r} is not a source; choose one of: {', '.join(SOURCES)}")
    _check_output_dir(output_dir)  # before the (possibly long) load
    from inputs import registry

    splits = registry.load(source, data_dir=data_dir, seed=seed, image_size=image_size,
                           eval_fraction=eval_fraction)
    return write(splits, output_dir, num_shards=num_shards, source=source)


def read_all(split: RecordFiles) -> Examples:
    """Every example of `split` in file order (tests and small tools)."""
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(list(split.files)).map(lambda r: parse(r, split.image_shape))
    images, labels = [], []
    for image, label in ds.batch(1024):
        images.append(image.numpy())
        labels.append(label.numpy())
    return Examples(x=np.concatenate(images), y=np.concatenate(labels))
