"""`tf.data` pipelines that turn any split into global batches.

Batches are *global*: `strategy.experimental_distribute_dataset` splits each
one across the replicas, so the global batch size is per-replica batch times
replica count whatever the device layout.

Every split kind goes through the same stages; only the first and the decode
differ::

    source, shuffled each epoch (seeded)   Examples: in-memory (x, y), cached
                                           RecordFiles: sorted file list, shuffled,
                                             interleaved (fixed cycle, deterministic),
                                             then the serialized records shuffled
                                           ImageNetRecords: as RecordFiles
                                           ImageFiles: (path, label), shuffled
    repeat
    number (position in the stream)        augmented splits only (`inputs.augment`)
    skip(start_step × examples per step)   exact resume, before any decoding
    decode (parallel, order kept)          PNG records / image files → uint8;
                                           JPEG records: cropped (at random by
                                           (seed, position) to train), resized
    batch(global batch, drop remainder)
    cast to float in [0, 1]                with image_dtype="float32" (the default);
                                           "uint8" leaves it to the step (`to_float`;
                                           ImageNet's mean/std where the split has it)

A GPU step should get uint8 batches and cast them itself: the host-to-device
copy is then a quarter of the bytes, and the cast runs on the device inside
the compiled step. The engine's built-in task does that
(`ClassificationTask`); `to_float` is the one normalization both places use,
so the numbers are the same either way.

Damaged data stops the run with one line naming the file (`data_errors`):
TFRecord records travel with their file and index, so a wrong label or image
size names them; a damaged frame or an image that does not decode is traced
to its file after the failure.

The order depends only on `seed` and the split (not on the machine: the
interleave's cycle length is a constant), so a resumed run that skips the
examples it already trained on sees exactly the batches an uninterrupted run
sees.

Multi-worker sharding (`--auto_shard_policy`): `auto` is resolved here, to
`file` for TFRecord splits with at least one file per worker and to `data`
otherwise, and set explicitly, so the skip arithmetic and TensorFlow agree.
With `data` every worker reads the whole stream and keeps its part of each
global batch (it consumes one global batch per step); with `file`,
TensorFlow deals the sorted file list to the workers and each worker's own
stream of global batches is cut into `workers × replicas` pieces, so a worker
consumes global_batch / workers of its examples per step, and the skip
follows that (`off` too: every worker reads everything, and the same cut
applies).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from tfloop.inputs import data_errors, exact_epochs, image_folder, imagenet, tfrecord
from tfloop.inputs.context import examples_per_step
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import (Examples, ImageFiles, ImageNetRecords, Normalization,
                                  RecordFiles, Split)

_SHUFFLE_BUFFER = 16384
_SHUFFLE_BYTES = 256 << 20  # memory bound of the record shuffle buffer
_CYCLE_LENGTH = 8  # TFRecord files read at once; fixed, so the order is machine-independent

_SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}


def resolve_shard_policy(split: Split, policy: str, num_workers: int = 1) -> str:
    """`auto` → `file` or `data`, as described above; other names unchanged.

    Raises:
      InputError: `file` sharding over several workers of a split that is not
        TFRecord files, or of fewer files than workers (TensorFlow would fail
        at the first step).
    """
    is_records = isinstance(split, (RecordFiles, ImageNetRecords))
    if policy == "auto":
        return "file" if is_records and len(split.files) >= num_workers else "data"
    if policy == "file" and num_workers > 1:
        if not is_records:
            raise InputError(
                "--auto_shard_policy=file needs a dataset of files to deal out; this one is "
                f"{'an image folder' if isinstance(split, ImageFiles) else 'in memory'}: "
                "convert it with bin/convert_to_tfrecord and use --dataset=tfrecord, or use "
                "--auto_shard_policy=data"
            )
        if len(split.files) < num_workers:
            raise InputError(
                f"--auto_shard_policy=file deals {len(split.files)} file(s) to {num_workers} "
                f"workers; write at least {num_workers} shards (bin/convert_to_tfrecord "
                "--num_shards) or use --auto_shard_policy=data"
            )
    return policy


def with_shard_policy(ds: tf.data.Dataset, policy: str, deterministic: bool = True) -> tf.data.Dataset:
    """How a multi-worker strategy splits this dataset between workers
    (single-process strategies ignore it), and whether stages that do not pin
    their order may yield out of order (`deterministic=False`, faster: a slow
    element does not hold up the ones behind it). Every stage that decides
    which batch a train step sees pins `deterministic=True`, so exact resume
    holds either way."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _SHARD_POLICIES[policy]
    options.deterministic = deterministic
    return ds.with_options(options)


def with_run_options(ds: tf.data.Dataset, policy: str, deterministic: bool,
                     where: str = "the dataset") -> tf.data.Dataset:
    """The run's options on a dataset the engine did not build (a task's, the
    data handed to `tfloop.fit`), merged into the dataset's own and never
    loosening them: its order is part of what it asks for. A dataset whose
    options leave `deterministic` unset is deterministic in TensorFlow (a
    parallel `map` before a seeded `shuffle` keeps its order), so
    `--deterministic=false` leaves it as it is (it relaxes only the engine's
    own pipelines, `train_batches`/`eval_batches`); `--deterministic` makes
    it deterministic whatever it set. The shard policy is the run's (the
    resume's skip arithmetic assumes it); a dataset that chose another one
    (not AUTO) is refused rather than overridden, except `off` under a `file`
    run, which is kept: both cut each global batch the same way (a worker
    feeds global batch / workers of its own stream), and such a dataset deals
    its files to the workers itself (`train_batches` does for an augmented
    stream, which TensorFlow's `file` rewrite cannot walk through).

    Raises:
      InputError: the dataset's own `auto_shard_policy` differs from the run's.
    """
    own = ds.options()
    run_policy = _SHARD_POLICIES[policy]
    chosen = own.experimental_distribute.auto_shard_policy
    if policy == "file" and chosen == tf.data.experimental.AutoShardPolicy.OFF:
        run_policy = chosen
    if chosen not in (tf.data.experimental.AutoShardPolicy.AUTO, run_policy):
        name = tf.data.experimental.AutoShardPolicy(chosen).name
        instead = (f" or run with --auto_shard_policy={name.lower()}"
                   if name.lower() in _SHARD_POLICIES else "")
        raise InputError(
            f"{where} sets options.experimental_distribute.auto_shard_policy={name} and the run "
            f"shards by --auto_shard_policy={policy}; drop the dataset's option{instead}")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = run_policy
    if deterministic and own.deterministic is not True:
        options.deterministic = True
    return ds.with_options(options)


#: What `train_batches`/`eval_batches` may hand over: floats in [0, 1], or the uint8 pixels.
IMAGE_DTYPES = ("float32", "uint8")


#: pixel value → value / 255 in float32, divided once in NumPy (correctly rounded).
_SCALED = np.arange(256, dtype=np.float32) / np.float32(255)


@tf.autograph.experimental.do_not_convert  # graph code, run in tf.data and in steps alike
def to_float(images: tf.Tensor, normalization: Optional[Normalization] = None) -> tf.Tensor:
    """uint8 pixels 0..255 → float32 in [0, 1], or with `normalization`
    (a dataset's per-channel mean and std, `Splits.normalization`: ImageNet's)
    `(pixel - mean) / std` per channel; on the host (`image_dtype="float32"`)
    or, for uint8 batches, inside the step on the device.

    A table lookup, not `x / 255`: inside a `tf.function` Grappler rewrites
    the division into a multiplication by 1/255, which differs in the last
    bit for some pixels, so the same division on the host (tf.data) and in
    the step gave different floats. The lookup is exact wherever it runs
    (the normalized table is computed once in float64, rounded to float32).
    """
    indices = tf.cast(images, tf.int32)
    if normalization is None:
        return tf.gather(tf.constant(_SCALED), indices)
    channels = len(normalization.mean)
    table = ((np.arange(256, dtype=np.float64)[:, None] - np.asarray(normalization.mean))
             / np.asarray(normalization.std)).astype(np.float32).reshape(-1)
    return tf.gather(tf.constant(table), indices * channels + tf.range(channels))


def normalize_unit(images: tf.Tensor, normalization: Normalization) -> tf.Tensor:
    """Float images in [0, 1] → `(255 x - mean) / std` per channel: the
    export's `serving_default` takes [0, 1] floats as every built-in task's
    does, and gives the model what `to_float(pixels, normalization)` gave it
    in training (to float32 rounding: the lookup there is exact, this is
    arithmetic)."""
    mean = tf.constant(np.asarray(normalization.mean) / 255.0, tf.float32)
    std = tf.constant(np.asarray(normalization.std) / 255.0, tf.float32)
    return (tf.cast(images, tf.float32) - mean) / std


def _host_cast(split: Split):
    """The host-side `to_float` of `image_dtype="float32"` batches of `split`
    (the split's normalization, if any), for batches of any arity."""
    normalization = getattr(split, "normalization", None)
    # Not converted by autograph (tf.data's map would, parsing this whole file for the lambda).
    return tf.autograph.experimental.do_not_convert(
        lambda images, *rest: (to_float(images, normalization), *rest))


def _check_image_dtype(image_dtype: str) -> None:
    if image_dtype not in IMAGE_DTYPES:
        raise InputError(f"image_dtype={image_dtype!r} is not one of {', '.join(IMAGE_DTYPES)}")


def read_records(files: tf.data.Dataset, cycle_length: int, compression: str = "", *,
                 named: bool = False) -> tf.data.Dataset:
    """The records of `files`, interleaved `cycle_length` at a time in a fixed
    order; with `named`, each as (file path, index in the file, record), so a
    check further down can say which record is wrong."""
    def read(path):
        records = tf.data.TFRecordDataset(path, compression_type=compression)
        if not named:
            return records
        return records.enumerate().map(lambda index, record: (path, index, record))

    return files.interleave(read, cycle_length=cycle_length, block_length=1,
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def record_shuffle_buffer(records: int, record_bytes: int) -> int:
    """At most `records` records, and at most `_SHUFFLE_BYTES` of them."""
    return max(1, min(records, _SHUFFLE_BYTES // max(1, record_bytes)))


def shuffled_records(files, *, seed, buffer: int, compression: str = "",
                     named: bool = False) -> tf.data.Dataset:
    """The records of TFRecord `files`, reshuffled every epoch: the file list
    shuffled, read `_CYCLE_LENGTH` files at a time (a constant, so the order
    does not depend on the machine), the records shuffled in `buffer`
    (`named`: as `read_records` says)."""
    paths = list(files)
    files = tf.data.Dataset.from_tensor_slices(paths)
    files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    records = read_records(files, min(len(paths), _CYCLE_LENGTH), compression, named=named)
    return records.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)


def _watch(split: Split) -> None:
    """What names the file when a file split fails mid-run (`data_errors`)."""
    if isinstance(split, (RecordFiles, ImageNetRecords)):
        data_errors.watch_records(split.files)
    elif isinstance(split, ImageFiles):
        data_errors.watch(split.paths, lambda error: image_folder.explain(error, split))


def _parse_record(split: RecordFiles):
    return lambda path, index, record: tfrecord.parse(record, split.image_shape,
                                                      split.num_classes, path, index)


def _shuffled_source(split: Split, seed: int):
    """(finite dataset of cheap elements, reshuffled every epoch; decode fn or None)."""
    if isinstance(split, Examples):
        # No .cache(): the arrays are in memory already, and a cache would make
        # each tf.data service worker replay its own first share (`inputs.service`).
        ds = tf.data.Dataset.from_tensor_slices((split.x, split.y))
        return ds.shuffle(min(len(split), _SHUFFLE_BUFFER), seed=seed,
                          reshuffle_each_iteration=True), None
    if isinstance(split, RecordFiles):
        records = shuffled_records(split.files, seed=seed, buffer=record_shuffle_buffer(
            min(split.count, _SHUFFLE_BUFFER), split.record_bytes), named=True)
        return records, _parse_record(split)
    if isinstance(split, ImageNetRecords):
        records = shuffled_records(split.files, seed=seed, buffer=record_shuffle_buffer(
            min(split.count or _SHUFFLE_BUFFER, _SHUFFLE_BUFFER), split.record_bytes),
            named=True)
        return records, imagenet.decoder(split, seed, random=split.augmented)
    if isinstance(split, ImageFiles):
        ds = tf.data.Dataset.from_tensor_slices((list(split.paths), list(split.labels)))
        ds = ds.shuffle(len(split), seed=seed, reshuffle_each_iteration=True)
        return ds, image_folder.decoder(split, seed, random=split.augmented)
    raise TypeError(f"not a split: {type(split).__name__}")


def _ordered_source(split: Split):
    """(the split once, in its stored order; decode fn or None)."""
    if isinstance(split, Examples):
        return tf.data.Dataset.from_tensor_slices((split.x, split.y)), None
    if isinstance(split, RecordFiles):
        files = tf.data.Dataset.from_tensor_slices(list(split.files))
        return read_records(files, 1, named=True), _parse_record(split)
    if isinstance(split, ImageNetRecords):
        files = tf.data.Dataset.from_tensor_slices(list(split.files))
        return read_records(files, 1, named=True), imagenet.decoder(split, 0, random=False)
    if isinstance(split, ImageFiles):
        ds = tf.data.Dataset.from_tensor_slices((list(split.paths), list(split.labels)))
        return ds, image_folder.decoder(split, 0, random=False)
    raise TypeError(f"not a split: {type(split).__name__}")


def train_batches(
    split: Split, *, global_batch_size: int, seed: Optional[int], start_step: int = 0,
    shard_policy: str = "auto", num_workers: int = 1, deterministic: bool = True,
    examples_to_skip: Optional[int] = None,
    image_dtype: str = "float32",
    exact_epochs: bool = False,
    input_pipeline_id: int = 0,
) -> tf.data.Dataset:
    """An endless, seeded, reshuffled-every-epoch stream of full global batches.

    `start_step` skips what a restored run has already trained on, so a
    resumed run sees the data an uninterrupted one would. `num_workers` is the
    multi-worker cluster's worker count (1 otherwise); with `file` sharding a
    worker consumes `global_batch_size / num_workers` of its examples per step.
    `examples_to_skip` (`InputContext.examples_to_skip`) replaces that count
    when the steps before `start_step` had other batch sizes.
    `image_dtype="uint8"` hands the pixels over as they are, for the step to
    cast with `to_float` on its device.

    A split whose examples are augmented at random (`split.augmented`: the
    ImageNet train split, an image folder with `augment="inception"`) has each
    example numbered with its position in the endless stream *before* the
    skip, and its crop and flip drawn from (`seed`, position) statelessly
    (`inputs.augment`), so a resumed run sees the very pixels an uninterrupted
    one sees. Under `file` sharding over several workers such a stream takes
    worker `input_pipeline_id`'s files itself (those TensorFlow would deal it)
    and numbers its examples `id, id + workers, ...`: the workers' streams
    differ, and so must their positions.

    `exact_epochs` (`--epochs`): each epoch one pass, every example once, its
    last batch padded and a third component, the per-example weight, added
    (`inputs.exact_epochs`: a partial batch trains as Keras's `fit` trains
    it); resume skips `start_step` whole batches. Without it the passes run
    into each other (the leftovers of one share a batch with the next). Not
    under `file` sharding over several workers, where each reads its own files.
    """
    _check_image_dtype(image_dtype)
    policy = resolve_shard_policy(split, shard_policy, num_workers)
    _watch(split)
    positional = getattr(split, "augmented", False)
    tf_policy = policy
    if positional and policy == "file" and num_workers > 1:
        split, tf_policy = _own_files(split, input_pipeline_id, num_workers), "off"
    ds, decode = _shuffled_source(split, seed)
    if exact_epochs and (policy != "file" or num_workers == 1):
        start = (examples_to_skip // global_batch_size if examples_to_skip is not None
                 else start_step)
        ds = (_exact_epochs_positional(ds, decode, global_batch_size, split.image_shape,
                                       start_step=start) if positional else
              _exact_epochs(ds, decode, global_batch_size, start_step=start))
        if image_dtype == "float32":
            ds = ds.map(_host_cast(split), num_parallel_calls=tf.data.AUTOTUNE,
                        deterministic=True)
        return with_shard_policy(ds.prefetch(tf.data.AUTOTUNE), tf_policy, deterministic)
    ds = ds.repeat()
    if positional:
        first, stride = (input_pipeline_id, num_workers) if policy == "file" else (0, 1)
        ds = _numbered(ds, first=first, stride=stride)
    if examples_to_skip is None:
        examples_to_skip = start_step * examples_per_step(global_batch_size, policy, num_workers)
    if examples_to_skip:
        ds = ds.skip(examples_to_skip)
    if decode is not None:
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # Full batches only: every step divides by the same global batch size and
    # the compiled step sees one static shape.
    ds = ds.batch(global_batch_size, drop_remainder=True)
    if image_dtype == "float32":
        ds = ds.map(_host_cast(split), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return with_shard_policy(ds.prefetch(tf.data.AUTOTUNE), tf_policy, deterministic)


def _own_files(split: ImageNetRecords, worker: int, workers: int) -> ImageNetRecords:
    """The files TensorFlow's `file` auto-sharding would deal worker `worker`
    (`files[worker::workers]` of the sorted list), taken here: TensorFlow's
    rewrite cannot walk through the `scan` that numbers an augmented stream,
    so the dataset is then marked `off` (the same cut of each global batch)."""
    if not 0 <= worker < workers:
        raise InputError(f"input_pipeline_id={worker} is not a worker of {workers}")
    return dataclasses.replace(split, files=split.files[worker::workers], count=None)


def _numbered(ds: tf.data.Dataset, *, first: int = 0, stride: int = 1) -> tf.data.Dataset:
    """(position, *element): positions `first, first + stride, ...` (int64).

    TensorFlow's `file` auto-sharding cannot walk through it (nor through
    `enumerate`'s `range`): `train_batches` shards such a stream's files itself.
    """
    def number(position, element):
        element = element if isinstance(element, tuple) else (element,)
        return position + stride, (position, *element)
    return ds.scan(tf.constant(first, tf.int64), number)


def _exact_epochs(ds, decode, global_batch_size: int, *, start_step: int) -> tf.data.Dataset:
    """`train_batches(exact_epochs=True)`: one pass per epoch, padded and weighted."""
    if decode is not None:
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = exact_epochs.pad_to_global_batch(ds.batch(global_batch_size), global_batch_size)
    ds = ds.repeat()  # each pass reshuffles (the source's seeded shuffle)
    return ds.skip(start_step) if start_step else ds


def _exact_epochs_positional(ds, decode, global_batch_size: int, image_shape, *,
                             start_step: int) -> tf.data.Dataset:
    """`_exact_epochs` for an augmented split: the passes' undecoded batches
    are numbered (k) and skipped before decoding, and row j of batch k is
    decoded at position k * global batch + j (unique over the endless stream,
    partial batches included)."""
    size = global_batch_size
    ds = _numbered(ds.batch(size).repeat())
    if start_step:
        ds = ds.skip(start_step)

    def decode_batch(batch_index, *rows):
        positions = batch_index * size + tf.range(tf.shape(rows[0], out_type=tf.int64)[0])
        spec = (tf.TensorSpec(image_shape, tf.uint8), tf.TensorSpec([], tf.int64))
        return tf.map_fn(lambda args: decode(*args), (positions, *rows),
                         fn_output_signature=spec)

    ds = ds.map(decode_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return exact_epochs.pad_to_global_batch(ds, size)


def eval_batches(
    split: Split, *, global_batch_size: int, shard_policy: str = "auto", num_workers: int = 1,
    deterministic: bool = True, image_dtype: str = "float32",
) -> tf.data.Dataset:
    """One pass over `split` in its stored order, the last batch possibly
    partial (every example is counted exactly once by the evaluator);
    `image_dtype` as for `train_batches`."""
    _check_image_dtype(image_dtype)
    policy = resolve_shard_policy(split, shard_policy, num_workers)
    _watch(split)
    ds, decode = _ordered_source(split)
    if decode is not None:
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(global_batch_size, drop_remainder=False)
    if image_dtype == "float32":
        ds = ds.map(_host_cast(split), num_parallel_calls=tf.data.AUTOTUNE)
    if isinstance(split, Examples):
        ds = ds.cache()  # small and in memory already; file splits may not fit as floats
    return with_shard_policy(ds.prefetch(tf.data.AUTOTUNE), policy, deterministic)
