"""MNIST from a local `mnist.npz` in the Keras layout (no download, ever).

The file holds `x_train (N, 28, 28) uint8, y_train (N,), x_test, y_test`, as
written by `keras.datasets.mnist.load_data()`'s cache or `np.savez`. Float
pixels in [0, 1] (a preprocessed copy) are scaled back to 0..255; NaN or
infinite pixels are refused. The class count is the largest train label + 1,
and every class must have a train example (`_num_classes`). The file is
read through `tf.io.gfile`, so `--data_dir` may be `gs://...` or `ram://...`
(this starts no TensorFlow runtime).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import tensorflow as tf

from tfloop.inputs.arrays import read_npz
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Examples, Splits

logger = logging.getLogger(__name__)

FILENAME = "mnist.npz"
_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _as_uint8(path: str, name: str, x: np.ndarray) -> np.ndarray:
    """Pixels as uint8 0..255, the one layout the pipeline reads (it divides by 255).

    Float pixels in [0, 1] (how the multi-worker tutorial preprocesses MNIST)
    are scaled, not truncated: a plain cast would turn them into 0s and 1s.
    """
    if np.issubdtype(x.dtype, np.floating):
        bad = int(np.count_nonzero(~np.isfinite(x)))
        if bad:
            raise InputError(f"{path}: {name} holds {bad} NaN or infinite pixel(s); "
                             "fix or drop those images")
    low, high = float(x.min()), float(x.max())
    if low < 0 or high > 255:
        raise InputError(f"{path}: {name} pixels lie in {low:g}..{high:g}; write them as "
                         "0..255 (uint8) or as floats in [0, 1]")
    if np.issubdtype(x.dtype, np.floating) and high <= 1.0:
        logger.info("%s: %s holds float pixels in [0, 1]; scaling them to 0..255", path, name)
        return np.round(x * 255.0).astype(np.uint8)
    return np.round(x).astype(np.uint8)


def _examples(path: str, x: np.ndarray, y: np.ndarray, split: str) -> Examples:
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise InputError(
            f"{path}: x_{split} {x.shape} and y_{split} {y.shape} are not N images (N, H, W) "
            "with N labels; write the file in the Keras mnist.npz layout"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"{path}: y_{split} must hold integer labels, found {y.dtype}")
    if x.dtype != np.uint8:
        x = _as_uint8(path, f"x_{split}", x)
    return Examples(x=np.ascontiguousarray(x), y=y.astype(np.int64))


def load(*, data_dir: str) -> Splits:
    if not data_dir:
        raise InputError(
            f"--dataset=mnist needs --data_dir, the folder holding {FILENAME} "
            "(x_train, y_train, x_test, y_test)"
        )
    path = os.path.join(data_dir, FILENAME)
    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        raise InputError(
            f"{path} does not exist; put the Keras-layout {FILENAME} (x_train, y_train, "
            "x_test, y_test) in --data_dir"
        )
    arrays = read_npz(path)
    missing = [k for k in _KEYS if k not in arrays]
    if missing:
        raise InputError(f"{path} lacks {', '.join(missing)}; it needs the arrays "
                         f"{', '.join(_KEYS)}")
    train = _examples(path, arrays["x_train"], arrays["y_train"], "train")
    test = _examples(path, arrays["x_test"], arrays["y_test"], "test")
    if train.x.shape[1:] != test.x.shape[1:]:
        raise InputError(f"{path}: train images {train.x.shape[1:]} and test images "
                         f"{test.x.shape[1:]} differ in shape")
    return Splits(train=train, eval=test, num_classes=_num_classes(path, train.y, test.y))


def _num_classes(path: str, y_train: np.ndarray, y_test: np.ndarray) -> int:
    """The class count the labels imply (largest train label + 1), refused
    unless every class 0..N-1 has a train example and every test label is
    one of them: a stray -1 would fail mid-training, and a stray 10**9 would
    build a billion-class model."""
    for name, y in (("y_train", y_train), ("y_test", y_test)):
        negative = np.flatnonzero(y < 0)
        if negative.size:
            row = int(negative[0])
            raise InputError(f"{path}: {name}[{row}] is {int(y[row])}; labels must be class "
                             f"indices 0, 1, ... ({negative.size} negative label(s))")
    present = np.unique(y_train)
    num_classes = int(present[-1]) + 1
    if len(present) < num_classes:
        missing = int(np.argmax(present != np.arange(len(present))))  # sorted, so one is
        raise InputError(
            f"{path}: y_train's largest label is {num_classes - 1}, which makes {num_classes} "
            f"classes, but no train example has label {missing} ({len(present)} distinct "
            "labels); labels must be the class indices 0..N-1")
    outside = np.flatnonzero(y_test >= num_classes)
    if outside.size:
        row = int(outside[0])
        raise InputError(f"{path}: y_test[{row}] is {int(y_test[row])}, a class y_train never "
                         f"has (its labels are 0..{num_classes - 1})")
    return num_classes
