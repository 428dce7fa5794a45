"""Image folders: one sub-folder of JPEG/PNG files per class, as cats vs dogs and
cassava are laid out once downloaded.

Two layouts, the two the Keras/TensorFlow tutorials use::

    DIR/cats/*.jpg  DIR/dogs/*.jpg             eval split = --eval_fraction of the
                                               files (Keras' validation_split=0.2)
    DIR/train/cats/...  DIR/validation/cats/   cats_and_dogs_filtered: the eval
    (or DIR/eval/...)                          split is the validation folder

Labels are the indices of the sorted class-folder names. The eval fraction is
drawn by a fixed permutation (not `--seed`), so runs with different seeds
evaluate on the same images.

Unreadable files are *skipped, with a logged count*, when the folder is
loaded: empty files, and files whose first bytes are not a JPEG, PNG, GIF or
BMP signature (or a PNG without its end chunk, i.e. truncated). The check
reads a few bytes per file, so it costs little on 25 000 images and runs
before TensorFlow's runtime starts. An image that passes it but still fails
to decode (a JPEG corrupted inside or truncated) stops the run at the batch
that holds it, with one line naming the file: dropping it at run time
(`ignore_errors`) would shift every later batch, and exact resume skips
batches by count before decoding. TensorFlow's decode error does not say
which file failed, and naming it inside the pipeline measured about 100
times slower than the decode itself (a nested dataset per image), so after
such a failure `explain` decodes the split's images once, in parallel, to
find it: one epoch's decoding, paid only by a run that has already failed.
Decoding every image up front would cost that on every start; it is not
done.

Decoding and resizing (bilinear, to `--image_size` square, RGB) happen in
`tf.data` with a parallel map, after shuffling and skipping the file names.
With `augment="inception"` (`--augment`) the train images are cropped at
random and flipped and the eval images centrally cropped instead, as
`inputs.augment` does for ImageNet (the default, `none`, resizes whole).

Folders are listed and files read through `tf.io.gfile` (which starts no
runtime either), so `--data_dir` may be `gs://...` or `ram://...`.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import tensorflow as tf

from tfloop.inputs import augment as augmentation
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import ImageFiles, Splits

logger = logging.getLogger(__name__)

EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
EVAL_FOLDERS = ("validation", "eval")
_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM")
_PNG_END = b"IEND\xaeB`\x82"
_SPLIT_SEED = 0  # the eval-fraction permutation; fixed on purpose (see above)


@dataclasses.dataclass(frozen=True)
class Scan:
    """What one class-per-folder directory holds."""

    class_names: tuple[str, ...]
    paths: tuple[str, ...]
    labels: tuple[int, ...]
    skipped: tuple[str, ...]  # image-named files that cannot be images


def readable(path: str) -> bool:
    """Cheap plausibility check: a known image signature (and, for PNG, its end chunk)."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            head = f.read(8)
            if not head.startswith(_SIGNATURES):
                return False
            if head.startswith(b"\x89PNG"):
                f.seek(max(0, f.size() - 12))
                return _PNG_END in f.read()
            return True
    except (OSError, tf.errors.OpError):
        return False


def _class_folders(root: str) -> list[str]:
    names = (d.rstrip("/") for d in tf.io.gfile.listdir(root))  # gs:// marks folders with '/'
    return sorted(d for d in names
                  if not d.startswith(".") and tf.io.gfile.isdir(os.path.join(root, d)))


def scan(root: str) -> Scan:
    """Lists `root/<class>/**/*.{jpg,png,...}`, sorted; raises InputError for
    a folder without class folders or a class without a readable image."""
    classes = _class_folders(root)
    if not classes:
        raise InputError(
            f"--data_dir={root} has no class sub-folders; put one folder of JPEG/PNG images "
            f"per class in it ({os.path.join(root, 'cats')}/*.jpg, "
            f"{os.path.join(root, 'dogs')}/*.jpg)"
        )
    if len(classes) < 2:
        raise InputError(f"--data_dir={root} has one class folder ({classes[0]}); "
                         "classification needs at least two")
    paths, labels, skipped = [], [], []
    for label, name in enumerate(classes):
        found = 0
        for folder, _, files in sorted(tf.io.gfile.walk(os.path.join(root, name))):
            for file in sorted(files):
                if file.startswith(".") or not file.lower().endswith(EXTENSIONS):
                    continue
                path = os.path.join(folder, file)
                if readable(path):
                    paths.append(path)
                    labels.append(label)
                    found += 1
                else:
                    skipped.append(path)
        if not found:
            raise InputError(f"class folder {os.path.join(root, name)} has no readable "
                             f"image ({', '.join(EXTENSIONS)}); remove it or add images")
    return Scan(tuple(classes), tuple(paths), tuple(labels), tuple(skipped))


def _log_skipped(skipped) -> None:
    if skipped:
        logger.warning("image_folder: skipped %d unreadable or non-image file(s), e.g. %s",
                       len(skipped), ", ".join(skipped[:3]))


#: --image_size when not given (0).
DEFAULT_SIZE = 224


def load(*, data_dir: str, image_size: int, eval_fraction: float,
         augment: str = "none") -> Splits:
    """The `--dataset=image_folder` loader (plain Python: lists and checks files);
    `image_size`: pixels a side (0: `DEFAULT_SIZE`); `augment`: `none` or
    `inception` (module docstring)."""
    augmentation.check(augment)
    if not data_dir:
        raise InputError(
            "--dataset=image_folder needs --data_dir, a folder with one sub-folder of "
            "JPEG/PNG images per class"
        )
    if not tf.io.gfile.isdir(data_dir):
        raise InputError(f"--data_dir={data_dir} is not a directory; point it at a folder "
                         "with one sub-folder of images per class")
    if not 0 <= eval_fraction < 1:
        raise InputError(f"--eval_fraction={eval_fraction} must be at least 0 and below 1")
    if image_size < 0:
        raise InputError(f"--image_size={image_size} must be a positive number of pixels "
                         f"(0 or left out: {DEFAULT_SIZE})")
    image_size = image_size or DEFAULT_SIZE
    shape = (image_size, image_size, 3)
    eval_root = next((os.path.join(data_dir, d) for d in EVAL_FOLDERS
                      if tf.io.gfile.isdir(os.path.join(data_dir, d))), None)
    if tf.io.gfile.isdir(os.path.join(data_dir, "train")) and eval_root:
        train, evaluation = scan(os.path.join(data_dir, "train")), scan(eval_root)
        if evaluation.class_names != train.class_names:
            raise InputError(
                f"{eval_root} has classes {', '.join(evaluation.class_names)} but "
                f"{os.path.join(data_dir, 'train')} has {', '.join(train.class_names)}; "
                "give both the same class folders"
            )
        _log_skipped(train.skipped + evaluation.skipped)
        return Splits(
            train=ImageFiles(train.paths, train.labels, shape, augment),
            eval=ImageFiles(evaluation.paths, evaluation.labels, shape, augment, train=False),
            num_classes=len(train.class_names), class_names=train.class_names,
        )
    found = scan(data_dir)
    _log_skipped(found.skipped)
    count = len(found.paths)
    num_eval = min(int(round(eval_fraction * count)), count - 1)
    order = np.random.default_rng(_SPLIT_SEED).permutation(count)
    is_eval = np.zeros(count, bool)
    is_eval[order[count - num_eval:]] = True

    def pick(mask, train):  # keeps class-then-name order inside each split
        return ImageFiles(tuple(p for p, m in zip(found.paths, mask) if m),
                          tuple(l for l, m in zip(found.labels, mask) if m), shape, augment,
                          train)

    return Splits(train=pick(~is_eval, True), eval=pick(is_eval, False) if num_eval else None,
                  num_classes=len(found.class_names), class_names=found.class_names)


# --- Decoding (inside tf.data). ---


def decode(path, label, image_shape: tuple[int, int, int]):
    """File name → (uint8 RGB image resized to `image_shape`, int64 label).

    Bilinear resize without cropping, as `keras.utils.image_dataset_from_directory`
    does; rounded back to uint8 so every split kind batches the same way.
    """
    image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
    image = tf.image.resize(image, image_shape[:2])
    image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
    image = tf.ensure_shape(image, image_shape)
    return image, tf.cast(label, tf.int64)


def decoder(split: ImageFiles, seed, *, random: bool):
    """The split's decode function inside `tf.data`: `decode` (augment
    `none`); the central crop (`inception`); or with `random` (the
    `inception` train stream) `(position, path, label)` → the random crop and
    flip of `augment.example_seed(seed, position)`."""
    size = split.image_shape[0]
    if split.augment == "none":
        return lambda path, label: decode(path, label, split.image_shape)
    if not random:
        return lambda path, label: (augmentation.eval_image(tf.io.read_file(path), size),
                                    tf.cast(label, tf.int64))
    seed = augmentation.run_seed(seed)
    return lambda position, path, label: (
        augmentation.train_image(tf.io.read_file(path),
                                 augmentation.example_seed(seed, position), size),
        tf.cast(label, tf.int64))


_DECODE_FAILURES = ("DecodeImage", "JPEG", "PNG", "GIF", "BMP", "Input is empty",
                    "channels inherent")


def explain(error: tf.errors.OpError, split: ImageFiles):
    """For `data_errors`: the file of `split` behind a decode `error`, as one
    line, or None (not a decode error, or every file decodes)."""
    if not any(marker in (error.message or "") for marker in _DECODE_FAILURES):
        return None
    path = first_undecodable(split.paths)
    if path is None:
        return None
    try:
        tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        reason = "it decodes alone"
    except tf.errors.OpError as failure:
        reason = (failure.message or type(failure).__name__).split("[Op:")[0].strip()
    return (f"{path} cannot be decoded as an image ({reason}); remove or replace the file "
            "(the run stopped at the batch that holds it)")


def first_undecodable(paths) -> "str | None":
    """The first of `paths` TensorFlow cannot decode, or None: each file is
    decoded once, in parallel; a failure leaves a gap in the indices."""
    ds = tf.data.Dataset.from_tensor_slices(list(paths)).enumerate()
    ds = ds.map(lambda index, path: (index, tf.shape(tf.io.decode_image(
        tf.io.read_file(path), channels=3, expand_animations=False))),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    expected = 0
    for indices, _ in ds.ignore_errors().batch(1024):
        indices = indices.numpy()
        gaps = np.flatnonzero(indices != np.arange(expected, expected + len(indices)))
        if gaps.size:
            return paths[expected + int(gaps[0])]
        expected += len(indices)
    return paths[expected] if expected < len(paths) else None


def decoded(split: ImageFiles):
    """The split's images decoded in order (the converter reads them this way)."""
    ds = tf.data.Dataset.from_tensor_slices((list(split.paths), list(split.labels)))
    return ds.map(lambda p, l: decode(p, l, split.image_shape),
                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
