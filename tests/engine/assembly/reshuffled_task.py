"""A task whose input reshuffles every epoch, as the Task docstring teaches.

For the exact-resume tests (tests/engine/assembly/test_exact_resume.py): 64 examples
in global batches of 8 (8 steps an epoch), `shuffle(seed=context.seed,
reshuffle_each_iteration=True)`, whose one seed generator every iterator of
the dataset shares: a second iterator of it (a probe reading the run's own
pipeline) takes the seeds of the run's later epochs.

`bin/train --task=reshuffled_task:Reshuffled` builds it with no arguments.
"""

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine.task import Task
from tfloop.engine.task.losses import LossOutput

EXAMPLES = 64


class Reshuffled(Task):
    has_eval = False

    def build_model(self):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="tanh"),
                                 keras.layers.Dense(3)])

    def train_dataset(self, context):
        data = np.random.RandomState(0)
        features = data.normal(size=(EXAMPLES, 4)).astype(np.float32)
        labels = data.randint(0, 3, size=EXAMPLES).astype(np.int64)
        examples = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(
            EXAMPLES, seed=context.seed, reshuffle_each_iteration=True).repeat()
        return examples.batch(context.global_batch_size, drop_remainder=True)

    def loss(self, model, batch, *, training):
        features, labels = batch
        logits = model(features, training=training)
        return LossOutput(per_example_loss=keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True))
