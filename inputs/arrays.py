"""NumPy arrays as a task's datasets: what most users train on first.

A task hands its `train_dataset(context)` / `eval_dataset(context)` to an
`ArrayData`::

    data = inputs.ArrayData(features={"pixels": x, "age": age}, targets=y,
                            sample_weight=w, eval_fraction=0.2)
    data.describe()                      # "8192 train / 2048 eval examples"
    data.train_dataset(context)          # endless, shuffled, full global batches
    data.eval_dataset(context)           # one pass in stored order

or reads them from an `.npz` (`from_npz`, through `tf.io.gfile`, so a
`gs://` or `ram://` path works as a local one does).

Elements follow Keras: `(features, targets)`, or `(features, targets,
sample_weight)` when weights are given; `features` and `targets` are an array
or a dict of arrays, as passed. Floating arrays become float32 (NumPy makes
float64 by default; models compute in float32), and nothing else changes
dtype: integers stay the integers they are, so float features are never
truncated to uint8 and integer labels never become floats.

The train stream shuffles *indices*, not examples: `Dataset.range(N)` is
shuffled with `context.seed` (every epoch anew), repeated, skipped by
`context.start_step` global batches (exact resume: skipping integers costs
nothing), batched with `drop_remainder=True`, and each batch gathers its rows
from the arrays in one vectorized op. The arrays are captured in the dataset
as constants, so they must fit in memory and, under a multi-worker strategy
(which serializes the dataset graph to shard it), below protobuf's 2 GB; for
more, write TFRecords and use `inputs.RecordData`.

Mistakes in the arrays are one-line `InputError`s at construction: lengths
that differ (naming each array and its length), empty or scalar arrays,
strings or objects, NaN or infinity in a floating array (naming the first
row), a `sample_weight` that is not 1-D, negative or not finite, and, when
`num_classes` is given, a target outside `[0, num_classes)`. All of it is one
pass over arrays already in memory.
"""

from __future__ import annotations

import logging
import zipfile
from typing import Mapping, Optional, Union

import numpy as np
import tensorflow as tf

from tfloop.inputs.errors import InputError

logger = logging.getLogger(__name__)

Arrays = Union[np.ndarray, Mapping[str, np.ndarray]]
_NUMERIC_KINDS = "biuf"  # bool, signed, unsigned, floating
_SPLIT_SEED = 0  # the eval_fraction permutation: fixed, so every run seed evaluates the same rows


def _named(name: str, arrays) -> list[tuple[str, object]]:
    """[(display name, array-like)] for an array or a dict of them."""
    if isinstance(arrays, Mapping):
        if not arrays:
            raise InputError(f"{name} is an empty dict; give at least one array")
        return [(f"{name}[{key!r}]", value) for key, value in arrays.items()]
    return [(name, arrays)]


def _check_array(name: str, value, *, finite: bool = True) -> np.ndarray:
    """One numeric array of at least one row; floats as float32 (and, with
    `finite`, free of NaN and infinity)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:  # ragged lists
        raise InputError(f"{name} is not an array ({str(error).splitlines()[0][:80]}); "
                         "give a NumPy array with one row per example") from None
    if array.dtype.kind not in _NUMERIC_KINDS:
        raise InputError(f"{name} holds {array.dtype} values; give numbers (encode strings "
                         "and categories as integers first)")
    if array.ndim == 0:
        raise InputError(f"{name} is a scalar; give an array with one row per example")
    if array.shape[0] == 0:
        raise InputError(f"{name} is empty (shape {array.shape}); give at least one example")
    if array.dtype.kind == "f" and array.dtype != np.float32:
        array = array.astype(np.float32)
    if finite and array.dtype.kind == "f":
        _check_finite(name, array)
    return array


def _check_finite(name: str, array: np.ndarray, chunk_rows: int = 4096) -> None:
    """NaN or infinity anywhere in `array`: one line naming the first row.

    Checked a block of rows at a time, so the check needs little memory
    beside the array; one pass at memory speed."""
    rows = array.reshape(array.shape[0], -1)
    for start in range(0, rows.shape[0], chunk_rows):
        finite = np.isfinite(rows[start:start + chunk_rows]).all(axis=1)
        if not finite.all():
            row = start + int(np.argmin(finite))
            total = int(np.count_nonzero(~np.isfinite(rows)))
            raise InputError(f"{name} holds {total} NaN or infinite value(s), the first in row "
                             f"{row}; fix or drop those rows")


def _check_classes(name: str, targets: np.ndarray, num_classes: int) -> None:
    """Integer class indices in [0, num_classes): one line naming the first row outside."""
    if targets.dtype.kind not in "iu":
        raise InputError(f"{name} holds {targets.dtype} values but num_classes={num_classes} "
                         "asks for integer class indices")
    bad = ((targets < 0) | (targets >= num_classes)).reshape(targets.shape[0], -1).any(axis=1)
    if bad.any():
        row = int(np.argmax(bad))
        raise InputError(f"{name}[{row}] is {targets[row].tolist()}, outside [0, {num_classes}) "
                         f"(num_classes={num_classes}); {int(bad.sum())} row(s) outside")


def _structure(name: str, arrays) -> Union[np.ndarray, dict]:
    checked = {display: _check_array(display, value) for display, value in _named(name, arrays)}
    if isinstance(arrays, Mapping):
        return {key: checked[f"{name}[{key!r}]"] for key in arrays}
    return checked[name]


def _flat(name: str, structure) -> list[tuple[str, np.ndarray]]:
    if isinstance(structure, dict):
        return [(f"{name}[{key!r}]", value) for key, value in structure.items()]
    return [(name, structure)]


def _check_weights(name: str, weights: np.ndarray) -> np.ndarray:
    if weights.ndim != 1:
        raise InputError(f"{name} has shape {weights.shape}; give one weight per example, "
                         "shape (N,)")
    weights = weights.astype(np.float32)
    bad = ~np.isfinite(weights) | (weights < 0)
    if bad.any():
        row = int(np.argmax(bad))
        raise InputError(f"{name} has {int(bad.sum())} negative or non-finite value(s) "
                         f"(e.g. {weights[row]:g} at row {row}); weights must be finite and >= 0")
    return weights


def _rows(prefix: str, parts: list[tuple[str, np.ndarray]]) -> int:
    """The common row count of `parts`, or a one-line error naming the odd one."""
    first_name, first = parts[0]
    for name, array in parts[1:]:
        if array.shape[0] != first.shape[0]:
            raise InputError(
                f"{prefix}{name} has {array.shape[0]} rows but {first_name} has "
                f"{first.shape[0]}; every array needs one row per example")
    return int(first.shape[0])


def _like(eval_parts, train_parts) -> None:
    """Eval arrays must batch like the train arrays: same names, row shapes and dtypes."""
    eval_names = [name for name, _ in eval_parts]
    train_names = [name[len("eval_"):] for name in eval_names]
    expected = [name for name, _ in train_parts]
    if sorted(train_names) != sorted(expected):
        raise InputError(f"eval arrays {', '.join(eval_names)} do not match the train arrays "
                         f"{', '.join(expected)}; give the eval split the same names")
    train = dict(train_parts)
    for name, array in eval_parts:
        other = train[name[len("eval_"):]]
        if array.shape[1:] != other.shape[1:] or array.dtype != other.dtype:
            raise InputError(
                f"{name} rows are {array.dtype} {array.shape[1:]} but {name[len('eval_'):]} rows "
                f"are {other.dtype} {other.shape[1:]}; give both splits the same row shape "
                "and dtype")


def _take(structure, rows: np.ndarray):
    if isinstance(structure, dict):
        return {key: value[rows] for key, value in structure.items()}
    return structure[rows]


class ArrayData:
    """Train (and optionally eval) examples held as NumPy arrays.

    Args:
      features: an array (N, ...) or a dict name → array (N, ...): the model's input.
      targets: an array (N, ...) or a dict name → array: what the loss compares against.
      sample_weight: optional float weights (N,), each >= 0.
      eval_features, eval_targets, eval_sample_weight: an explicit eval split,
        with the names, row shapes and dtypes of the train arrays.
      eval_fraction: instead of an explicit eval split, this fraction of the
        examples (at least one, leaving at least one for training) is held
        out for eval. The rows are drawn by a fixed permutation (`split_seed`,
        not the run's seed), so runs with different seeds evaluate on the same
        examples; both splits keep the arrays' order.
      split_seed: the seed of that permutation.
      num_classes: when given, `targets` (one array) are class indices:
        each must lie in [0, num_classes), checked here, naming the first
        row outside; otherwise targets are not interpreted.

    Raises:
      InputError: one line naming the array that is wrong and how.
    """

    def __init__(self, *, features: Arrays, targets: Arrays,
                 sample_weight: Optional[np.ndarray] = None,
                 eval_features: Optional[Arrays] = None, eval_targets: Optional[Arrays] = None,
                 eval_sample_weight: Optional[np.ndarray] = None,
                 eval_fraction: float = 0.0, split_seed: int = _SPLIT_SEED,
                 num_classes: Optional[int] = None):
        train = self._split("", features, targets, sample_weight)
        if num_classes is not None:
            if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
                raise InputError(f"num_classes={num_classes!r} must be a positive integer")
            if isinstance(train[1], dict):
                raise InputError("num_classes checks targets given as one array, not a dict")
            _check_classes("targets", train[1], num_classes)
        has_eval_arrays = eval_features is not None or eval_targets is not None
        if has_eval_arrays and (eval_features is None or eval_targets is None):
            raise InputError("give both eval_features and eval_targets, or neither")
        if eval_sample_weight is not None and not has_eval_arrays:
            raise InputError("eval_sample_weight needs eval_features and eval_targets")
        if not 0 <= eval_fraction < 1:
            raise InputError(f"eval_fraction={eval_fraction} must be at least 0 and below 1")
        if has_eval_arrays and eval_fraction:
            raise InputError(f"give eval_features/eval_targets or eval_fraction={eval_fraction}, "
                             "not both")
        evaluation = None
        if has_eval_arrays:
            evaluation = self._split("eval_", eval_features, eval_targets, eval_sample_weight)
            if num_classes is not None:
                _check_classes("eval_targets", evaluation[1], num_classes)
            _like(self._parts("eval_", evaluation, weights=False),
                  self._parts("", train, weights=False))
        elif eval_fraction:
            train, evaluation = self._hold_out(train, eval_fraction, split_seed)
        self._train = train
        self._eval = evaluation

    # --- Construction. ---

    @staticmethod
    def _parts(prefix, split, *, weights=True) -> list[tuple[str, np.ndarray]]:
        parts = _flat(f"{prefix}features", split[0]) + _flat(f"{prefix}targets", split[1])
        if weights and len(split) == 3:
            parts.append((f"{prefix}sample_weight", split[2]))
        return parts

    @classmethod
    def _split(cls, prefix, features, targets, sample_weight) -> tuple:
        split = (_structure(f"{prefix}features", features),
                 _structure(f"{prefix}targets", targets))
        if sample_weight is not None:
            name = f"{prefix}sample_weight"
            split += (_check_weights(name, _check_array(name, sample_weight, finite=False)),)
        _rows("", cls._parts(prefix, split))
        return split

    @staticmethod
    def _hold_out(split, fraction: float, seed: int) -> tuple[tuple, tuple]:
        count = _rows("", ArrayData._parts("", split))
        if count < 2:
            raise InputError(f"eval_fraction={fraction} needs at least 2 examples to split; "
                             f"there is {count}")
        num_eval = min(max(1, int(round(fraction * count))), count - 1)
        is_eval = np.zeros(count, bool)
        is_eval[np.random.default_rng(seed).permutation(count)[:num_eval]] = True
        rows_train, rows_eval = np.flatnonzero(~is_eval), np.flatnonzero(is_eval)
        return (tuple(_take(part, rows_train) for part in split),
                tuple(_take(part, rows_eval) for part in split))

    # --- What it holds. ---

    @property
    def num_train(self) -> int:
        return _rows("", self._parts("", self._train))

    @property
    def num_eval(self) -> int:
        return 0 if self._eval is None else _rows("", self._parts("eval_", self._eval))

    @property
    def has_eval(self) -> bool:
        return self._eval is not None

    def describe(self) -> str:
        """One line for the start-up log: "8192 train / 2048 eval examples"."""
        if self._eval is None:
            return f"{self.num_train} train examples (no eval split)"
        return f"{self.num_train} train / {self.num_eval} eval examples"

    def __repr__(self) -> str:
        return f"ArrayData({self.describe()})"

    # --- Datasets. ---

    @staticmethod
    def _gatherer(split):
        """A batch of row indices → the batch's rows of every array (one gather each)."""
        with tf.device("/cpu:0"):  # tf.data runs on the host; keep the arrays there
            tensors = tf.nest.map_structure(tf.convert_to_tensor, split)

        def gather(rows):
            return tf.nest.map_structure(lambda t: tf.gather(t, rows), tensors)
        return gather

    def train_dataset(self, context):
        """Endless full global batches, reshuffled every epoch with
        `context.seed`, starting at `context.start_step` (exact resume).

        With `file` or `off` sharding over several input pipelines each worker's
        own stream feeds it `global_batch_size / num_input_pipelines` examples a
        step, and the skip follows that (as in `inputs.pipeline`).
        """
        batch, count = context.global_batch_size, self.num_train
        ds = tf.data.Dataset.range(count).shuffle(count, seed=context.seed,
                                                  reshuffle_each_iteration=True)
        ds = ds.repeat()
        ds = ds.skip(context.examples_to_skip)
        ds = ds.batch(batch, drop_remainder=True)
        ds = ds.map(self._gatherer(self._train), num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE)

    def eval_dataset(self, context):
        """The eval split once, in its stored order; the last batch may be
        partial. None when there is no eval split (nothing to evaluate)."""
        if self._eval is None:
            return None
        ds = tf.data.Dataset.range(self.num_eval).batch(context.global_batch_size)
        ds = ds.map(self._gatherer(self._eval), num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE)


def read_npz(path: str) -> dict:
    """Every array of the `.npz` at `path` (any `tf.io.gfile` filesystem)."""
    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        raise InputError(f"{path} does not exist or is a directory; give the path of an .npz "
                         "file (numpy.savez)")
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            npz = np.load(f, allow_pickle=False)
            if not isinstance(npz, np.lib.npyio.NpzFile):  # a single .npy array
                raise ValueError("one array, not an .npz archive")
            with npz:
                return {key: npz[key] for key in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, tf.errors.OpError) as error:
        raise InputError(f"{path} is not a readable .npz file ({type(error).__name__}); "
                         "re-create it with numpy.savez") from None


def from_npz(path: str, *, features: Union[str, Mapping[str, str]],
             targets: Union[str, Mapping[str, str]], sample_weight: Optional[str] = None,
             eval_features: Union[str, Mapping[str, str], None] = None,
             eval_targets: Union[str, Mapping[str, str], None] = None,
             eval_sample_weight: Optional[str] = None, eval_fraction: float = 0.0,
             split_seed: int = _SPLIT_SEED, num_classes: Optional[int] = None) -> ArrayData:
    """An `ArrayData` from the arrays of an `.npz` file, read through `tf.io.gfile`.

    Each argument names the file's key(s) for that role: `features="x_train"`,
    or a dict name → key (`{"pixels": "x", "age": "age"}`) for a dict of
    features; likewise `targets`, `sample_weight` and the `eval_` ones. A key
    the file lacks is one line listing the keys it has; any mistake in the
    arrays (a NaN, a label outside `num_classes`) is `ArrayData`'s one line,
    prefixed with the path.
    """
    arrays = read_npz(path)

    def pick(role, keys):
        if keys is None:
            return None
        wanted = keys if isinstance(keys, Mapping) else {None: keys}
        for key in wanted.values():
            if key not in arrays:
                raise InputError(f"{path} has no array {key!r} (for {role}); it has: "
                                 f"{', '.join(sorted(arrays)) or 'nothing'}")
        if not isinstance(keys, Mapping):
            return arrays[keys]
        return {name: arrays[key] for name, key in keys.items()}

    picked = dict(
        features=pick("features", features), targets=pick("targets", targets),
        sample_weight=pick("sample_weight", sample_weight),
        eval_features=pick("eval_features", eval_features),
        eval_targets=pick("eval_targets", eval_targets),
        eval_sample_weight=pick("eval_sample_weight", eval_sample_weight))
    try:
        data = ArrayData(**picked, eval_fraction=eval_fraction, split_seed=split_seed,
                         num_classes=num_classes)
    except InputError as error:
        raise InputError(f"{path}: {error}") from None
    logger.info("%s: %s", path, data.describe())
    return data
