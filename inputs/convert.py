"""The TFRecord converter: any split kind in, a `tfrecord` folder out.

`bin/convert_to_tfrecord` calls `convert`, which loads a source as
`--dataset=<source>` would and hands it to `write`; tests call `write` on
splits they make. The folder's format (names, features, metadata.json) is
`inputs.tfrecord`'s, which reads it back; this module only writes, so the
loaders never depend on the converter.

The writer is atomic on a local disk: it writes into a temporary sibling
folder and renames it into place, so a crash leaves no half-written dataset
behind. Everything is written through `tf.io.gfile`, so `--output_dir` may
also be `gs://...` or `ram://...`; there (no atomic folder rename) the files
are moved into place one by one, `metadata.json` last, and a folder without
it is refused by the loader.

A converter killed mid-write (SIGKILL, a crash) leaves its hidden staging
folder (`.<name>.tmp-*`) behind; the next conversion to the same local
`--output_dir` removes it, with a log line. A staging folder is stale when no
process holds the `fcntl` lock on its lock file (the lock dies with its
holder), so a conversion still running is left alone. On `gs://`-like
filesystems there is no such lock and stale staging folders stay.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from typing import Iterator

import numpy as np
import tensorflow as tf

from tfloop.inputs import image_folder, registry, tfrecord
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Examples, ImageFiles, Split, Splits

logger = logging.getLogger(__name__)


def _is_local(path: str) -> bool:
    """A path on this machine's disk, not a `scheme://` filesystem (gs, ram, hdfs, ...)."""
    return "://" not in path


def _check_output_dir(output_dir: str) -> str:
    if not output_dir:
        raise InputError("--output_dir is empty; name the folder to write the TFRecords into")
    output_dir = os.path.abspath(output_dir) if _is_local(output_dir) else output_dir.rstrip("/")
    if tf.io.gfile.exists(output_dir):
        if not tf.io.gfile.isdir(output_dir):
            raise InputError(f"--output_dir={output_dir} is a file; name a new directory")
        if tf.io.gfile.listdir(output_dir):
            raise InputError(
                f"--output_dir={output_dir} is not empty; name a new or empty directory "
                "(the converter never overwrites a dataset)"
            )
    if _is_local(output_dir):
        existing = _nearest_existing(os.path.dirname(output_dir))
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            raise InputError(f"--output_dir={output_dir} cannot be created: {existing} is not a "
                             "writable directory")
    return output_dir


def _nearest_existing(path: str) -> str:
    """`path` or its nearest ancestor that exists: missing parents are
    created when the conversion writes (`_make_staging`), as --model_dir's are."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


_LOCK = ".writing"  # in a local staging folder, locked while its converter runs
_UNLOCKED_GRACE_S = 60  # a staging folder without a lock file younger than this may be new


def _staging_prefix(output_dir: str) -> str:
    parent, name = os.path.split(output_dir)
    return os.path.join(parent, f".{name}.tmp-")


def _holds_lock(staging: str):
    """Opens and locks `staging`'s lock file; returns the open file, or None
    when another process holds it."""
    handle = open(os.path.join(staging, _LOCK), "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def remove_stale_staging(output_dir: str) -> list[str]:
    """Removes the staging folders of `output_dir` (local) that no running
    converter owns; returns them."""
    removed = []
    for staging in sorted(glob.glob(glob.escape(_staging_prefix(output_dir)) + "*")):
        # Only a real folder: never one reached through a link (the engine's
        # rule, engine.runtime.files; this library may not import it).
        if os.path.islink(staging) or not os.path.isdir(staging):
            continue
        if not os.path.exists(os.path.join(staging, _LOCK)):
            # An older converter's, or one between mkdtemp and its lock: by age.
            if time.time() - os.path.getmtime(staging) < _UNLOCKED_GRACE_S:
                continue
        else:
            handle = _holds_lock(staging)
            if handle is None:
                continue  # a converter is writing it now
            handle.close()
        shutil.rmtree(staging, ignore_errors=True)
        logger.info("removed %s, left by an interrupted conversion", staging)
        removed.append(staging)
    return removed


def _make_staging(output_dir: str):
    """An empty hidden sibling of `output_dir` to write into
    (`.<name>.tmp-<random>`), and, when local, its held lock (or None)."""
    if _is_local(output_dir):
        try:  # os.access passes what the filesystem still refuses (root, read-only, /proc)
            os.makedirs(os.path.dirname(output_dir), exist_ok=True)  # data/ in a fresh clone
            staging = tempfile.mkdtemp(prefix=os.path.basename(_staging_prefix(output_dir)),
                                       dir=os.path.dirname(output_dir))
        except OSError as error:
            raise InputError(f"--output_dir={output_dir} cannot be written: no folder can be "
                             f"created in {os.path.dirname(output_dir)} "
                             f"({error.strerror or type(error).__name__})") from None
        umask = os.umask(0o077)
        os.umask(umask)
        # mkdtemp's 0700 is for the temporary name only; at most 0755 whatever the umask
        os.chmod(staging, 0o755 & ~umask)
        return staging, _holds_lock(staging)
    parent, _, name = output_dir.rpartition("/")
    staging = f"{parent}/.{name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tf.io.gfile.makedirs(staging)
    except tf.errors.OpError as error:
        raise InputError(f"--output_dir={output_dir} cannot be written: {staging} cannot be "
                         f"created ({type(error).__name__})") from None
    return staging, None


def _release(staging: str, lock) -> None:
    """Unlocks and deletes the lock file: it is no part of the dataset."""
    if lock is not None:
        os.remove(os.path.join(staging, _LOCK))
        lock.close()


def _move_into_place(staging: str, output_dir: str, last: str) -> None:
    if _is_local(output_dir):
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # empty, checked before writing
        os.rename(staging, output_dir)
        return
    tf.io.gfile.makedirs(output_dir)
    names = sorted(tf.io.gfile.listdir(staging), key=lambda n: n == last)
    for name in names:  # `last` (metadata.json) last: without it the loader refuses the folder
        tf.io.gfile.rename(f"{staging}/{name}", f"{output_dir}/{name}")
    tf.io.gfile.rmtree(staging)


def _remove(staging: str) -> None:
    try:
        tf.io.gfile.rmtree(staging)
    except tf.errors.OpError:
        pass


def _examples(split: Split, batch: int = 256) -> Iterator[tuple[np.ndarray, int]]:
    """(uint8 image, label) in the split's order; image files are decoded in tf.data."""
    if isinstance(split, Examples):
        for image, label in zip(split.x, split.y):
            yield image, int(label)
        return
    if isinstance(split, ImageFiles):
        for images, labels in image_folder.decoded(split).batch(batch):
            for image, label in zip(images.numpy(), labels.numpy()):
                yield image, int(label)
        return
    raise TypeError(f"cannot convert a {type(split).__name__}")


def _serialize(image: np.ndarray, label: int) -> bytes:
    encoded = tf.io.encode_png(image).numpy()
    return tf.train.Example(features=tf.train.Features(feature={
        tfrecord.IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        tfrecord.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def _write_split(directory: str, name: str, split: Split, num_shards: int) -> dict:
    """Contiguous shards: example i goes to shard i * num_shards // count, so
    reading the files in name order gives the source order back. Each shard's
    record count and byte size go into the metadata: the loader compares the
    sizes with the files' (a truncated or replaced shard costs a `stat` to see)."""
    count = len(split)
    num_shards = min(num_shards, count) if name != "train" else num_shards
    files = [tfrecord.shard_name(name, i, num_shards) for i in range(num_shards)]
    writers, counts = [None] * num_shards, [0] * num_shards
    try:
        written = 0
        for index, (image, label) in enumerate(_examples(split)):
            shard = index * num_shards // count
            if writers[shard] is None:
                writers[shard] = tf.io.TFRecordWriter(os.path.join(directory, files[shard]))
            writers[shard].write(_serialize(image, label))
            counts[shard] += 1
            written += 1
    finally:
        for writer in writers:
            if writer is not None:
                writer.close()
    if written != count:
        raise InputError(f"the {name} split gave {written} examples, expected {count}")
    sizes = [tf.io.gfile.stat(os.path.join(directory, f)).length for f in files]
    return {"count": count, "files": files, "counts": counts, "bytes": sizes}


@contextlib.contextmanager
def staged(output_dir: str, *, last: str) -> Iterator[tuple[str, str]]:
    """Writes a dataset folder atomically (module docstring): checks
    `output_dir` (new or empty), removes stale staging folders, yields
    (staging folder, checked output path) to write into, and moves the
    staging folder into place when the block ends without an error (on a
    remote filesystem file by file, `last` last); on an error it is removed."""
    output_dir = _check_output_dir(output_dir)
    if _is_local(output_dir):
        remove_stale_staging(output_dir)
    staging, lock = _make_staging(output_dir)
    try:
        yield staging, output_dir
        _release(staging, lock)
        lock = None
        _move_into_place(staging, output_dir, last)
    except BaseException:
        _remove(staging)
        if lock is not None:
            lock.close()
        raise


def write(splits: Splits, output_dir: str, *, num_shards: int, source: str = "") -> str:
    """Writes `splits` as sharded TFRecords + metadata.json into `output_dir`.

    `output_dir` (a local path, or any `tf.io.gfile` one) must not exist or
    be empty. Everything is written into a temporary sibling first and moved
    into place at the end. Returns the output path (absolute when local).

    This is also the way to make a TFRecord folder in a test::

        convert.write(synthetic.load(seed=0, num_train=512, num_eval=128),
                      str(tmp_path / "records"), num_shards=4)
    """
    if num_shards < 1:
        raise InputError(f"--num_shards={num_shards} must be a positive integer")
    if len(splits.train) < num_shards:
        raise InputError(
            f"--num_shards={num_shards} is more than the {len(splits.train)} train examples; "
            "use fewer shards"
        )
    with staged(output_dir, last=tfrecord.METADATA) as (staging, output_dir):
        meta = {
            "format": tfrecord.FORMAT, "version": tfrecord.VERSION, "source": source,
            "image_shape": [int(d) for d in splits.input_shape],
            "num_classes": int(splits.num_classes),
            "class_names": list(splits.class_names),
            "features": {tfrecord.IMAGE_KEY: "PNG-encoded uint8 image",
                         tfrecord.LABEL_KEY: "int64 class index"},
            "splits": {},
        }
        for name, split in (("train", splits.train), ("eval", splits.eval)):
            if split is not None and len(split):
                meta["splits"][name] = _write_split(staging, name, split, num_shards)
        with tf.io.gfile.GFile(os.path.join(staging, tfrecord.METADATA), "w") as f:
            f.write(json.dumps(meta, indent=2) + "\n")
    logger.info("wrote %s: %s", output_dir, ", ".join(
        f"{name} {entry['count']} examples in {len(entry['files'])} files"
        for name, entry in meta["splits"].items()))
    return output_dir


SOURCES = ("synthetic", "mnist", "image_folder")


def convert(source: str, *, output_dir: str, num_shards: int, data_dir: str = "",
            image_size: int = 0, eval_fraction: float = 0.2, seed: int = 0) -> str:
    """`bin/convert_to_tfrecord`: loads `source` as `--dataset=<source>` would and writes it."""
    if source not in SOURCES:
        raise InputError(f"--source={source!r} is not a source; choose one of: {', '.join(SOURCES)}")
    checked = _check_output_dir(output_dir)  # before the (possibly long) load
    if _is_local(checked):
        remove_stale_staging(checked)
    splits = registry.load(source, data_dir=data_dir, seed=seed, image_size=image_size,
                           eval_fraction=eval_fraction)
    return write(splits, output_dir, num_shards=num_shards, source=source)
