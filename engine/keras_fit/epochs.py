"""A Keras user's training data as the engine's fixed-size global batches, with exact epochs.

The engine's compiled step has one static shape and divides every step's
per-example loss by the global batch (`engine.loop.replica_step`). Keras's
`fit` instead walks a finite dataset's batches as they come: each epoch one
pass, every example once, and the last batch of a pass, when partial, trained
as a smaller step whose loss is the mean over the examples it holds.

Both hold here. A finite batched dataset of known cardinality C is one epoch
of C steps; every batch is padded to the global batch B with rows of weight 0,
and the n real rows of a batch get weight B/n (`inputs.exact_epochs`), so
`sum(weight * loss) / B` (the engine's division) is the mean over those n
examples: a partial last batch is exactly `fit`'s smaller step, and a full
one is unchanged (weight 1). The weight is the element's third component (Keras's `sample_weight`; a
user's own weights are multiplied in). The stream repeats the user's
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


def weighted_batches(dataset: tf.data.Dataset, global_batch_size: int) -> tf.data.Dataset:
    """Endless (x, y, weight) batches of exactly `global_batch_size` (see the
    module docstring): a finite dataset padded and repeated pass after pass
    (repeating an endless one changes nothing; and under parameter servers
    this runs traced, where the size is not known)."""

    def merge(*element):  # (x, y[, sample_weight], weight) -> (x, y, weight [* sample_weight])
        *batch, weight = element
        x, y, sample_weight = split_element(tuple(batch))
        if sample_weight is not None:
            weight *= tf.cast(tf.reshape(sample_weight, tf.shape(weight)), tf.float32)
        return x, y, weight

    dataset = exact_epochs.pad_to_global_batch(dataset, global_batch_size).map(merge)
    return dataset.repeat()
