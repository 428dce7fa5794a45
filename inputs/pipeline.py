"""`tf.data` pipelines that turn `Examples` into global batches.

Batches are *global*: `strategy.experimental_distribute_dataset` splits each
one across the replicas, so the global batch size is per-replica batch times
replica count whatever the device layout.
"""

from __future__ import annotations

import tensorflow as tf

from inputs.examples import Examples

_SHUFFLE_BUFFER = 16384

_SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}


def _with_shard_policy(ds: tf.data.Dataset, policy: str) -> tf.data.Dataset:
    """How a multi-worker strategy splits this dataset between workers
    (single-process strategies ignore it)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = _SHARD_POLICIES[policy]
    return ds.with_options(options)


def _to_float(x: tf.Tensor, y: tf.Tensor):
    return tf.cast(x, tf.float32) / 255.0, y


def train_batches(
    examples: Examples, *, global_batch_size: int, seed: int, start_step: int = 0,
    shard_policy: str = "auto",
) -> tf.data.Dataset:
    """An endless, seeded, reshuffled-every-epoch stream of full global batches.

    `start_step` skips the batches a restored run has already trained on, so a
    resumed run sees the data an uninterrupted one would (the pipeline is
    deterministic given `seed`). Skipping happens before decoding, on uint8.
    """
    ds = tf.data.Dataset.from_tensor_slices((examples.x, examples.y))
    ds = ds.cache()
    ds = ds.shuffle(min(len(examples), _SHUFFLE_BUFFER), seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat()
    # Full batches only: every step divides by the same global batch size and
    # the compiled step sees one static shape.
    ds = ds.batch(global_batch_size, drop_remainder=True)
    if start_step:
        ds = ds.skip(start_step)
    ds = ds.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
    return _with_shard_policy(ds.prefetch(tf.data.AUTOTUNE), shard_policy)


def eval_batches(
    examples: Examples, *, global_batch_size: int, shard_policy: str = "auto"
) -> tf.data.Dataset:
    """One pass over `examples`, the last batch possibly partial (every example
    is counted exactly once by the evaluator)."""
    ds = tf.data.Dataset.from_tensor_slices((examples.x, examples.y))
    ds = ds.batch(global_batch_size, drop_remainder=False)
    ds = ds.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
    return _with_shard_policy(ds.cache().prefetch(tf.data.AUTOTUNE), shard_policy)
