"""The user's pipeline as written and Keras's input knobs, against Keras's own
`fit` under MirroredStrategy on the same logical CPUs (parity.py) (issue 39,
items 8, 9, 10, 12):

- the engine's dataset options never loosen the user's: a parallel `map`
  before a seeded `shuffle` comes out in its own order, as in Keras;
"""

import time

import keras
import numpy as np
import tensorflow as tf

import parity

EXAMPLES, BATCH = 88, 16


def classifier():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"])
    return model


def _slow_on_some(index):
    """Every eighth example takes 10 ms: a parallel map that may yield out of
    order then does (the bug: the engine set `deterministic=False` on it)."""
    if int(index) % 8 == 0:
        time.sleep(0.01)
    return index


def parallel_map_then_seeded_shuffle():
    """The same order every epoch (Keras's fit under MirroredStrategy draws an
    order of its own at each epoch boundary from a reshuffling one:
    test_parity_matrix.py::test_a_seeded_shuffled_dataset), from seeds fixed alike."""
    keras.utils.set_random_seed(3)  # the shuffle's seeds are fixed when it is made
    x, y = parity.data(EXAMPLES)
    indices = tf.data.Dataset.range(EXAMPLES).map(
        lambda i: tf.ensure_shape(tf.py_function(_slow_on_some, [i], tf.int64), []),
        num_parallel_calls=tf.data.AUTOTUNE)
    examples = indices.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
    return examples.shuffle(EXAMPLES, seed=1, reshuffle_each_iteration=False).batch(BATCH)


def test_a_parallel_map_before_a_seeded_shuffle_keeps_its_order_as_keras(tmp_path):
    """The user's dataset leaves `deterministic` unset (TensorFlow: in order);
    the engine adds its shard policy and keeps that: the same batches as
    Keras's fit (History and weights within 1e-6), and two tfloop runs are
    bit-identical."""
    _, ours = parity.compare(classifier, parallel_map_then_seeded_shuffle(), replicas=2,
                             model_dir=tmp_path / "first", epochs=2)
    again = parity.run_tfloop(classifier, parallel_map_then_seeded_shuffle(), replicas=2,
                              model_dir=tmp_path / "second", epochs=2)
    assert again.history == ours.history
    for (name, a), (_, b) in zip(ours.weights, again.weights):
        assert np.array_equal(a, b), name
