"""The ImageNet-layout converter: a class-per-folder tree of images in, that layout out.

`bin/convert_to_tfrecord --source=image_folder --format=imagenet` calls
`write`. It writes what tensorflow/models' `build_imagenet_data.py` writes
(the layout `inputs.imagenet` reads; that module does not depend on this
one), from the trees `--dataset=image_folder` reads (`DIR/train/<class>/`
and `DIR/validation/<class>/`, or `DIR/<class>/` with `--eval_fraction` held
out by the same fixed permutation):

- `train-NNNNN-of-NNNNN` and `validation-NNNNN-of-NNNNN`, each a contiguous
  block of its split; the train examples shuffled first with
  `random.Random(12345)`, as `build_imagenet_data.py` does, so that every
  shard (and so every worker under `file` sharding) holds every class;
  validation in its source order (class, then file name);
- per record the standard keys: `image/encoded` (a JPEG's bytes as they are;
  any other format decoded and re-encoded as JPEG at quality 100, as the
  reference does with PNGs), `image/height`, `image/width`, `image/channels`
  (3), `image/colorspace` (`RGB`), `image/format` (`JPEG`), `image/filename`,
  `image/class/label` (1-based: class folder k in sorted order is k + 1),
  `image/class/synset` and `image/class/text` (the folder's name);
- `synsets.txt`: the class folders' names, line L for label L, from which
  the loader knows the class count.

It writes atomically, as the TFRecord converter does (`convert.staged`).
"""

from __future__ import annotations

import logging
import os
import random

import tensorflow as tf

from tfloop.inputs import convert, image_folder, imagenet
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import ImageFiles

logger = logging.getLogger(__name__)

#: build_imagenet_data.py's shuffle seed for the file order.
SHUFFLE_SEED = 12345


def _jpeg(path):
    """File → (JPEG bytes, height, width): a JPEG's bytes untouched, any other
    image decoded (RGB) and encoded as JPEG at quality 100."""
    contents = tf.io.read_file(path)

    def reencoded():
        image = tf.io.decode_image(contents, channels=3, expand_animations=False)
        return tf.io.encode_jpeg(image, format="rgb", quality=100)
    encoded = tf.cond(tf.io.is_jpeg(contents), lambda: contents, reencoded)
    shape = tf.image.extract_jpeg_shape(encoded)
    return encoded, shape[0], shape[1]


def _example(encoded: bytes, height: int, width: int, path: str, label: int,
             class_name: str) -> bytes:
    def text(value: str):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))

    def integer(value: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature={
        imagenet.IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "image/height": integer(height), "image/width": integer(width),
        "image/channels": integer(3), "image/colorspace": text("RGB"),
        "image/format": text("JPEG"), "image/filename": text(os.path.basename(path)),
        imagenet.LABEL_KEY: integer(label + 1),
        "image/class/synset": text(class_name), "image/class/text": text(class_name),
    })).SerializeToString()


def _write_split(directory: str, name: str, paths, labels, class_names,
                 num_shards: int) -> list[str]:
    """Contiguous shards of (paths, labels) in the given order; their names."""
    count = len(paths)
    files = [imagenet.shard_name(name, i, num_shards) for i in range(num_shards)]
    images = tf.data.Dataset.from_tensor_slices(list(paths)).map(
        _jpeg, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    writer, current = None, -1
    try:
        for index, (encoded, height, width) in enumerate(_named(images, paths, labels)):
            shard = index * num_shards // count
            if shard != current:
                if writer is not None:
                    writer.close()
                writer = tf.io.TFRecordWriter(os.path.join(directory, files[shard]))
                current = shard
            writer.write(_example(encoded, int(height), int(width), paths[index],
                                  labels[index], class_names[labels[index]]))
    finally:
        if writer is not None:
            writer.close()
    return files


def _named(images: tf.data.Dataset, paths, labels):
    """`images` as NumPy; an image that passed the loader's signature check
    but does not decode stops the conversion with one line naming it
    (`image_folder.explain`), not a TensorFlow traceback."""
    try:
        yield from images.as_numpy_iterator()
    except tf.errors.OpError as error:
        named = image_folder.explain(error, ImageFiles(tuple(paths), tuple(labels), (1, 1, 3)))
        if named is None:
            raise
        raise InputError(named.replace("the run stopped", "the conversion stopped")) from None


def write(data_dir: str, output_dir: str, *, num_shards: int,
          eval_fraction: float = 0.2) -> str:
    """Converts the image tree `data_dir` into the ImageNet layout in
    `output_dir` (new or empty): `num_shards` train files, and as many
    validation files (at most one per validation image). Returns the output
    path (absolute when local)."""
    if num_shards < 1:
        raise InputError(f"--num_shards={num_shards} must be a positive integer")
    with convert.staged(output_dir, last=imagenet.SYNSETS) as (staging, output_dir):
        splits = image_folder.load(data_dir=data_dir, image_size=image_folder.DEFAULT_SIZE,
                                   eval_fraction=eval_fraction)
        if len(splits.train) < num_shards:
            raise InputError(f"--num_shards={num_shards} is more than the "
                             f"{len(splits.train)} train images; use fewer shards")
        order = list(range(len(splits.train)))
        random.Random(SHUFFLE_SEED).shuffle(order)
        train = ImageFiles(tuple(splits.train.paths[i] for i in order),
                           tuple(splits.train.labels[i] for i in order),
                           splits.train.image_shape)
        written = {"train": _write_split(staging, "train", train.paths, train.labels,
                                         splits.class_names, num_shards)}
        if splits.eval is not None:
            written["validation"] = _write_split(
                staging, "validation", splits.eval.paths, splits.eval.labels,
                splits.class_names, min(num_shards, len(splits.eval)))
        with tf.io.gfile.GFile(os.path.join(staging, imagenet.SYNSETS), "w") as f:
            f.write("".join(f"{name}\n" for name in splits.class_names))
    logger.info("wrote %s in the ImageNet layout: %s; %d classes in %s", output_dir,
                ", ".join(f"{name} {len(split)} images in {len(written[name])} files"
                          for name, split in (("train", train), ("validation", splits.eval))
                          if name in written), splits.num_classes, imagenet.SYNSETS)
    return output_dir
