"""A task whose weights count which examples each step trained on.

For the elastic-resume tests (`test_elastic_resume.py`): the example ids
0..63 come in order, as one-hot features; the `counts` kernel's loss is
-16 x its output, so plain SGD adds learning_rate x (times seen) / (global
batch 16 / 16) to the id's weight. With `--lr_schedule=step` halving the rate
at every step (`FLAGS`), step s adds exactly 2**-s: the final `counts` weights
say, bit by bit, which ids every step saw, however the step was split over
replicas and micro-batches. A small `head` (a classifier of the same
features) trains beside it, so the float comparison with an uninterrupted
run has a non-linear model to compare.
"""

import keras
import tensorflow as tf

from tfloop.engine.losses import LossOutput
from tfloop.engine.task import Task

IDS = 64
BATCH = 16
STEPS = 8
#: bin/train flags that make `counts` a record of the steps (the batch: the caller's).
FLAGS = ["--task=counting_task:Counting", "--optimizer=sgd",
         "--learning_rate=1", "--lr_schedule=step", "--lr_decay_rate=0.5",
         "--lr_decay_steps=" + ",".join(str(s) for s in range(1, STEPS)),
         f"--train_steps={STEPS}", "--steps_per_loop=2", "--checkpoint_interval=2",
         "--mode=train", "--noexport"]


class Counting(Task):
    has_eval = False

    def build_model(self):
        ids = keras.Input((IDS,))
        counts = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros",
                                    name="counts")(ids)
        hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(ids)
        logits = keras.layers.Dense(3, name="head")(hidden)
        return keras.Model(ids, [counts, logits])

    def train_dataset(self, context):
        ids = tf.data.Dataset.range(IDS).repeat()
        return ids.map(lambda i: (tf.one_hot(i, IDS), i % 3)).batch(
            context.global_batch_size, drop_remainder=True)

    def loss(self, model, batch, *, training):
        features, labels = batch
        counts, logits = model(features, training=training)
        cross_entropy = keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True)
        return LossOutput(per_example_loss=cross_entropy - BATCH * counts[:, 0])


def steps_seen(counts) -> list[list[int]]:
    """The ids each step trained on, read from the final `counts` kernel."""
    bits = [round(float(value) * 2 ** (STEPS - 1)) for value in counts.reshape(-1)]
    return [[i for i, b in enumerate(bits) if b >> (STEPS - 1 - step) & 1]
            for step in range(STEPS)]


def expected_steps() -> list[list[int]]:
    """The ids of each step of the stream: 16 in order, wrapping at 64."""
    return [sorted((step * BATCH + j) % IDS for j in range(BATCH)) for step in range(STEPS)]
