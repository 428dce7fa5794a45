"""Exact epochs with the engine's fixed global batch: the last batch of a pass padded and weighted.

The compiled step has one static shape and divides each step's summed
per-example loss by the global batch B (`tf.nn.compute_average_loss`).
Keras's `fit` walks one pass per epoch, every example once, and trains a
partial last batch of n < B examples as a smaller step: the mean over its n.

`pad_to_global_batch` gives both: each batch is padded to B with zero rows
and gets one more component, a per-example weight of B/n for its n real rows
and 0 for the padding. A loss that multiplies its per-example values (and
metrics) by that weight sums to `sum(loss) * B/n`, and the engine's
division by B leaves the mean over the n real examples: a full batch is
unchanged (weight 1) and a partial one is exactly `fit`'s smaller step. The
padded rows add nothing to any sum. (The loop's means are then means of the
steps' means, each step weighing the same, as Keras's per-batch logs.)
"""

from __future__ import annotations

import tensorflow as tf

#: The weight component's name in docs and errors.
WEIGHT = "weight"


def pad_to_global_batch(dataset: tf.data.Dataset, global_batch_size: int) -> tf.data.Dataset:
    """Batches of at most `global_batch_size` (tuples) → batches of exactly
    that size with a last component, the per-example weight (see above)."""
    size = global_batch_size

    def pad(*components):
        n = tf.shape(tf.nest.flatten(components)[0])[0]
        weight = tf.fill([n], tf.cast(size, tf.float32) / tf.cast(n, tf.float32))

        def padded(t):
            t = tf.convert_to_tensor(t)
            rows = tf.pad(t, [[0, size - n]] + [[0, 0]] * (t.shape.rank - 1))
            return tf.ensure_shape(rows, [size] + t.shape[1:])
        return tf.nest.map_structure(padded, (*components, weight))

    return dataset.map(pad)
