"""A Keras user's training data as the engine's fixed-size global batches, with exact epochs.

The engine's compiled step has one static shape and divides every step's
per-example loss by the global batch (`engine.loop.replica_step`). Keras's
`fit` instead walks a finite dataset's batches as they come: each epoch one
pass, every example once, and the last batch of a pass, when partial, trained
as a smaller step whose loss is the mean over the examples it holds.

Both hold here. A finite batched dataset of known cardinality C is one epoch
of C steps; every batch is padded to the global batch B with zero rows,
and each row carries whether it is real (`weighted_batches`). The
compiled loss (`engine.keras_fit.fit_task`) runs the model on each
replica's real rows only (BatchNormalization's batch statistics never see
the padding) and weighs them so that the step is the one Keras's `fit`
takes under MirroredStrategy: each replica's mean over the examples it
holds, divided by the replicas. The user's `sample_weight` (the element's
third component) rides along. The stream repeats the user's
pipeline once per epoch (its seeded shuffle reshuffles as `fit`'s would), so
skipping `start_step` batches (`engine.loop.task_inputs`) resumes exactly,
mid-epoch included, when that pipeline is deterministic (a seeded shuffle).

An endless dataset (`.repeat()`, as the multi-worker tutorial writes it) has
no epochs of its own: `steps_per_epoch` says how long one is, and its batches
(which must all be full, B) carry weight 1.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.inputs import exact_epochs


def split_element(element: Any):
    """(x, y, sample_weight or None) of a Keras-style element: (x, y) or (x, y, w)."""
    if isinstance(element, (tuple, list)) and len(element) in (2, 3):
        return element[0], element[1], (element[2] if len(element) == 3 else None)
    raise ConfigError(f"the training data yields {type(element).__name__} elements; Keras "
                      "datasets yield (x, y) or (x, y, sample_weight) tuples")


def batch_size_of(dataset: tf.data.Dataset) -> int:
    """The dataset's batch size: its static leading dimension, else the first batch's."""
    sizes = {spec.shape[0] for spec in tf.nest.flatten(dataset.element_spec)
             if getattr(spec, "shape", None) is not None and spec.shape.rank}
    if not sizes:
        raise ConfigError("the training data yields unbatched elements; batch it "
                          "(dataset.batch(batch_size)) as for Keras's fit")
    static = {s for s in sizes if s is not None}
    if len(static) == 1:
        return static.pop()
    first = next(iter(dataset.take(1)), None)
    if first is None:
        raise ConfigError("the training data is empty")
    return int(tf.shape(tf.nest.flatten(first)[0])[0])


def steps_in_one_pass(dataset: tf.data.Dataset) -> Optional[int]:
    """Batches in one pass over a finite dataset of known size; None when endless
    or unknown."""
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        return None
    if cardinality < 0:
        raise ConfigError(
            "the size of the training data is unknown (a filter() or a file source, say), so "
            "neither an epoch nor the end of one is known; give steps_per_epoch= and end the "
            "dataset with .repeat(), or give it a known size (dataset.apply("
            "tf.data.experimental.assert_cardinality(batches)))")
    if cardinality == 0:
        raise ConfigError("the training data is empty")
    return cardinality


def weighted_batches(dataset: tf.data.Dataset, global_batch_size: int,
                     replicas: int = 1) -> tf.data.Dataset:
    """Endless (x, y, sample_weight, real) batches of exactly `global_batch_size`
    (see the module docstring): a finite dataset padded and repeated pass after
    pass (repeating an endless one changes nothing; and under parameter servers
    this runs traced, where the size is not known). `sample_weight` is the
    user's (1 where none is given) and 0 on the padding; `real` is 1 on the rows
    the data holds and 0 on the padding. The rows are laid out over `replicas`
    as `tf.distribute` splits a partial batch (`replica_layout`)."""

    def merge(*element):  # (x, y[, sample_weight], pad weight) -> (x, y, sample_weight, real)
        *batch, pad_weight = element
        x, y, sample_weight = split_element(tuple(batch))
        real = tf.cast(pad_weight > 0, tf.float32)
        weight = real
        if sample_weight is not None:
            weight *= tf.cast(tf.reshape(sample_weight, tf.shape(real)), tf.float32)
        rows, real = replica_layout(tf.cast(tf.reduce_sum(real), tf.int32), global_batch_size,
                                    replicas)
        return tf.nest.map_structure(lambda t: tf.gather(t, rows), (x, y, weight)) + (real,)

    dataset = exact_epochs.pad_to_global_batch(dataset, global_batch_size).map(merge)
    return dataset.repeat()


def replica_layout(held: tf.Tensor, global_batch_size: int, replicas: int):
    """(rows, real): which row of a padded batch (its `held` real rows first,
    then zero rows) goes to each of the global batch's places, and whether
    that place is real. `tf.distribute` gives each replica its slice of
    `global_batch_size / replicas` places, and splits a partial batch of n
    rows as ceil(n / replicas) per replica in order, the last ones fewer or
    none (6 rows over 4 replicas: 2, 2, 2, 0): Keras's `fit` under
    MirroredStrategy trains exactly those per-replica batches, and so does
    the engine with this layout. A full batch keeps its order."""
    size, slots = global_batch_size, global_batch_size // replicas
    place = tf.range(size)
    replica, within = place // slots, place % slots
    each = (held + replicas - 1) // replicas
    source = replica * each + within
    real = tf.logical_and(within < each, source < held)
    # A place that is not real takes a zero row (the first padded one, `held`).
    rows = tf.where(real, source, tf.minimum(held, size - 1))
    return rows, tf.cast(real, tf.float32)
