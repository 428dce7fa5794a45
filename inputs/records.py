"""A user's own TFRecord files of `tf.train.Example`s as a task's datasets.

::

    data = inputs.RecordData(
        train_files="gs://bucket/train-*.tfrecord", eval_files="gs://bucket/eval-*",
        features={"age": "float", "tokens": ("int64", [8]),
                  "tags": tf.io.VarLenFeature(tf.string)},
        label_key="clicked", weight_key="importance")
    data.train_dataset(context)   # ({"age": (B,), "tokens": (B, 8), "tags": sparse}, (B,), (B,))
    data.eval_dataset(context)

Feature specs come in two forms:

- short: a type name `"float"` (float32), `"int64"` or `"bytes"` for one value
  per record, or `(type name, shape)` for a fixed-size array, e.g.
  `("int64", [8])`; each becomes a `tf.io.FixedLenFeature`;
- any `tf.io` parsing spec (`FixedLenFeature`, `VarLenFeature`,
  `RaggedFeature`, `SparseFeature`, `FixedLenSequenceFeature`), as
  `tf.io.parse_example` takes it.

The label is the feature `label_key` (spec `label_spec`, default `"int64"`);
the optional per-example weight is the float feature `weight_key`. Elements
follow Keras: `(features, label)` or `(features, label, weight)`.

Files: a glob pattern, or a list of paths and patterns, resolved with
`tf.io.gfile.glob` (so `gs://` and `ram://` work) and sorted; a pattern that
matches nothing is one line. The train stream is `inputs.pipeline`'s for
TFRecords: the file list shuffled with the seed (every epoch anew),
interleaved with a fixed cycle length (so the order depends only on the seed,
not on the machine), the serialized records shuffled, repeated, skipped by
`context.start_step` global batches before any parsing, batched (full batches
only) and parsed a batch at a time (`tf.io.parse_example`, much faster than
per record). Multi-worker `file` sharding deals the sorted files out.

At construction the first record frame of every file is read in plain
Python (`inputs.framing`: its header checksum; on a remote filesystem a
sample of 256 files), so a text file, random bytes or a compressed file read
as uncompressed is one line naming it; TensorFlow's runtime is not started,
so this may happen before the strategy exists. The first record (a
`tf.train.Example` protobuf) is checked against the specs: a missing key, a
value type or a fixed size that does not match is one line naming the key
and what the record has. Later records are parsed only at run time, where a
bad one stops the run with TensorFlow's error; damage inside a file found at
run time ("corrupted record at N") stops the run with one line naming the
file (`inputs.data_errors`). Nothing counts the records (that would read
every file).
"""

from __future__ import annotations

import logging
import zlib
from typing import Mapping, Optional, Sequence, Union

import tensorflow as tf

from tfloop.inputs.errors import InputError
from tfloop.inputs import data_errors, framing, pipeline

logger = logging.getLogger(__name__)

Files = Union[str, Sequence[str]]
Spec = Union[str, tuple, tf.io.FixedLenFeature, tf.io.VarLenFeature, tf.io.RaggedFeature,
             tf.io.SparseFeature, tf.io.FixedLenSequenceFeature]

_TYPES = {"float": tf.float32, "float32": tf.float32, "int64": tf.int64, "int": tf.int64,
          "bytes": tf.string, "string": tf.string}
_LIST_OF = {tf.float32: "float_list", tf.int64: "int64_list", tf.string: "bytes_list"}
_COMPRESSIONS = ("", "GZIP", "ZLIB")
_REMOTE_SAMPLE = 256  # files whose first frame is read at construction, on gs:// and the like


# --- Specs. ---


def _to_spec(name: str, spec: Spec):
    """A short spec (`"float"`, `("int64", [8])`) → `tf.io.FixedLenFeature`;
    a tf.io spec as it is."""
    if isinstance(spec, (tf.io.FixedLenFeature, tf.io.VarLenFeature, tf.io.RaggedFeature,
                         tf.io.SparseFeature, tf.io.FixedLenSequenceFeature)):
        return spec
    type_name, shape = (spec, []) if isinstance(spec, str) else (
        tuple(spec) if isinstance(spec, (tuple, list)) and len(spec) == 2 else (None, None))
    if not isinstance(type_name, str) or type_name not in _TYPES:
        raise InputError(
            f"{name}: {spec!r} is not a feature spec; give 'float', 'int64' or 'bytes', "
            "(type, shape) such as ('int64', [8]), or a tf.io spec (tf.io.FixedLenFeature, ...)")
    try:
        shape = None if isinstance(shape, (str, bytes)) else [int(d) for d in shape]
    except (TypeError, ValueError):
        shape = None
    if shape is None or any(d < 1 for d in shape):
        raise InputError(f"{name}: shape {spec[1]!r} must be a list of positive integers")
    return tf.io.FixedLenFeature(shape, _TYPES[type_name])


def _keys_read(key: str, spec) -> list[tuple[str, object, bool]]:
    """[(record key, dtype, required)] that parsing `spec` under `key` reads."""
    if isinstance(spec, tf.io.FixedLenFeature):
        return [(key, spec.dtype, spec.default_value is None)]
    if isinstance(spec, tf.io.FixedLenSequenceFeature):
        return [(key, spec.dtype, not spec.allow_missing)]
    if isinstance(spec, tf.io.VarLenFeature):
        return [(key, spec.dtype, False)]
    if isinstance(spec, tf.io.RaggedFeature):
        return [(spec.value_key or key, spec.dtype, False)]
    if isinstance(spec, tf.io.SparseFeature):
        index_keys = [spec.index_key] if isinstance(spec.index_key, str) else spec.index_key
        return [(spec.value_key, spec.dtype, False)] + [(k, tf.int64, False) for k in index_keys]
    return []


# --- Files. ---


def _resolve(argument: str, files: Files) -> tuple[str, ...]:
    """Sorted, de-duplicated paths matched by `files` (a pattern or a list of them)."""
    patterns = [files] if isinstance(files, str) else list(files)
    if not patterns:
        raise InputError(f"{argument} is empty; give a glob pattern or a list of TFRecord files")
    found = set()
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise InputError(f"{argument}: {pattern!r} is not a path or glob pattern")
        try:
            matches = tf.io.gfile.glob(pattern)
        except tf.errors.OpError as error:
            raise InputError(f"{argument}={pattern!r} cannot be listed "
                             f"({type(error).__name__}: {error.message[:80]})") from None
        matches = [m for m in matches if not tf.io.gfile.isdir(m)]
        if not matches:
            raise InputError(f"{argument}={pattern!r} matches no file; give a glob pattern "
                             "or paths of existing TFRecord files")
        found.update(matches)
    return tuple(sorted(found))


class RecordData:
    """Train (and optionally eval) examples in the user's own TFRecord files.

    Args:
      train_files: a glob pattern, or a list of paths and patterns.
      eval_files: the same for an eval split; None for none.
      features: model input name (= record key) → spec (see the module doc).
      label_key: the record key of the label.
      label_spec: its spec; `"int64"` (a class index) unless given.
      weight_key: the record key of a float per-example weight, or None.
      compression: `""`, `"GZIP"` or `"ZLIB"`, as the files were written.
      shuffle_buffer: records held for the record-level shuffle (bounded
        also to about 256 MB, judged by the size of the first record).

    Raises:
      InputError: one line: a pattern that matches nothing, a malformed spec,
        a first record that lacks a key or does not parse as specified.
    """

    def __init__(self, *, train_files: Files, features: Mapping[str, Spec], label_key: str,
                 eval_files: Optional[Files] = None, label_spec: Spec = "int64",
                 weight_key: Optional[str] = None, compression: str = "",
                 shuffle_buffer: int = 16384):
        if compression not in _COMPRESSIONS:
            raise InputError(f"compression={compression!r} is not one of: "
                             f"{', '.join(map(repr, _COMPRESSIONS))}")
        if not isinstance(features, Mapping) or not features:
            raise InputError("features must be a non-empty dict: record key → spec "
                             "(e.g. {'age': 'float'})")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
            raise InputError(f"shuffle_buffer={shuffle_buffer!r} must be a positive integer")
        for role, key in (("label_key", label_key), ("weight_key", weight_key)):
            if key is not None and key in features:
                raise InputError(f"{role}={key!r} is also in features; a record key is either "
                                 "an input or the label/weight, not both")
        if weight_key is not None and weight_key == label_key:
            raise InputError(f"weight_key and label_key are both {label_key!r}")
        self._specs = {key: _to_spec(f"features[{key!r}]", spec) for key, spec in features.items()}
        self._label_key, self._weight_key = label_key, weight_key
        self._specs[label_key] = _to_spec(f"label_spec (for {label_key!r})", label_spec)
        if weight_key is not None:
            self._specs[weight_key] = tf.io.FixedLenFeature([], tf.float32)
        self._compression = compression
        self._train_files = _resolve("train_files", train_files)
        self._eval_files = None if eval_files is None else _resolve("eval_files", eval_files)
        record_bytes = self._check("train_files", self._train_files)
        if self._eval_files is not None:
            self._check("eval_files", self._eval_files)
        self._shuffle_buffer = pipeline.record_shuffle_buffer(shuffle_buffer, record_bytes)

    def _check(self, argument: str, files: tuple[str, ...]) -> int:
        """Reads the first record frame of every file (of at most
        `_REMOTE_SAMPLE` spread over them on a remote filesystem, where each
        read is a request), so a damaged or foreign file is refused here and
        not mid-run; checks the first record against the specs; returns its
        size in bytes."""
        record, path = None, files[0]
        step = max(1, len(files) // _REMOTE_SAMPLE) if "://" in files[0] else 1
        for candidate in files[::step]:
            try:
                first = framing.first_record(candidate, self._compression)
            except framing.Damaged as damage:
                raise InputError(
                    f"{candidate} is not a TFRecord file ({damage})"
                    f"{'' if self._compression else '; if it is compressed, pass compression='}"
                ) from None
            except (OSError, EOFError, zlib.error, tf.errors.OpError) as error:
                raise InputError(
                    f"{candidate} cannot be read as a {self._compression or 'uncompressed'} "
                    f"TFRecord file ({type(error).__name__}); check compression= and the path"
                ) from None
            if record is None and first is not None:
                record, path = first, candidate
        if record is None:
            raise InputError(f"{argument}: the {len(files)} file(s) hold no record "
                             f"(e.g. {files[0]})")
        try:
            example = tf.train.Example.FromString(record)
        except Exception:  # protobuf's DecodeError; its module path varies by implementation
            raise InputError(f"{path}: the first record is not a tf.train.Example; "
                             "RecordData reads tf.train.Example records") from None
        have = example.features.feature
        for key, spec in self._specs.items():
            for record_key, dtype, required in _keys_read(key, spec):
                if record_key not in have:
                    if not required:
                        continue
                    raise InputError(
                        f"{path}: the first record has no feature {record_key!r}; it has: "
                        f"{', '.join(sorted(have)) or 'none'}")
                kind = have[record_key].WhichOneof("kind")  # None: present, no values
                if kind is not None and kind != _LIST_OF.get(dtype, kind):
                    raise InputError(
                        f"{path}: feature {record_key!r} holds a {kind} but its spec asks "
                        f"for {dtype.name} ({_LIST_OF[dtype]}); fix the spec")
                if isinstance(spec, tf.io.FixedLenFeature):
                    size = len(getattr(have[record_key], kind).value) if kind else 0
                    needed = 1
                    for d in spec.shape:
                        needed *= int(d)
                    if size != needed:
                        raise InputError(
                            f"{path}: feature {record_key!r} holds {size} value(s) but its "
                            f"fixed shape {list(spec.shape)} needs {needed}; fix the shape "
                            "or use tf.io.VarLenFeature")
        return max(1, len(record))

    # --- What it holds. ---

    @property
    def train_files(self) -> tuple[str, ...]:
        return self._train_files

    @property
    def eval_files(self) -> Optional[tuple[str, ...]]:
        return self._eval_files

    @property
    def has_eval(self) -> bool:
        return self._eval_files is not None

    def describe(self) -> str:
        """One line for the start-up log (files, not records: counting reads everything)."""
        train = f"{len(self._train_files)} train file(s)"
        if self._eval_files is None:
            return f"{train} (no eval split)"
        return f"{train} / {len(self._eval_files)} eval file(s)"

    def __repr__(self) -> str:
        return f"RecordData({self.describe()})"

    # --- Datasets. ---

    def _parse(self, serialized, batch_size=None):
        """A batch of serialized records → (features, label[, weight]).

        `batch_size`: every batch has this many records (train): sparse
        features (`VarLenFeature`) get it as their static first dimension,
        which `parse_example` leaves unknown, as dense ones have it.
        """
        parsed = tf.io.parse_example(serialized, self._specs)
        for value in parsed.values():
            if batch_size is not None and isinstance(value, tf.SparseTensor):
                value.set_shape([batch_size] + value.shape.as_list()[1:])
        label = parsed.pop(self._label_key)
        if self._weight_key is None:
            return parsed, label
        weight = parsed.pop(self._weight_key)
        return parsed, label, weight

    def train_dataset(self, context) -> tf.data.Dataset:
        """Endless full global batches, reshuffled every epoch with
        `context.seed`, starting at `context.start_step` (exact resume; with
        `file`/`off` sharding a worker's stream feeds it global_batch /
        num_input_pipelines records a step, and the skip follows that)."""
        data_errors.watch_records(self._train_files, self._compression)
        ds = pipeline.shuffled_records(
            self._train_files, seed=context.seed, buffer=self._shuffle_buffer,
            compression=self._compression).repeat()
        ds = ds.skip(context.examples_to_skip)
        ds = ds.batch(context.global_batch_size, drop_remainder=True)
        ds = ds.map(lambda records: self._parse(records, context.global_batch_size),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE)

    def eval_dataset(self, context) -> Optional[tf.data.Dataset]:
        """The eval files once, in sorted order, records in file order; the
        last batch may be partial. None when there are no eval files."""
        if self._eval_files is None:
            return None
        data_errors.watch_records(self._eval_files, self._compression)
        ds = pipeline.read_records(tf.data.Dataset.from_tensor_slices(list(self._eval_files)), 1,
                                   self._compression)
        ds = ds.batch(context.global_batch_size)
        ds = ds.map(self._parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE)
