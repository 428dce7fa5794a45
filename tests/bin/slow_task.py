"""A task whose every step takes about `SLOW_STEP` seconds (a model at ~1 step/s, scaled down).

For tests/bin/test_stop_within_grace.py: each step waits on the host clock
and appends a line to `$SLOW_TASK_STEPS` (`tf.print` to a file), so the test
knows how many steps ran when it sends its signal without waiting for a
loop's progress line.

`bin/train --task=slow_task:Slow` builds it with no arguments.
"""

import os

import keras
import tensorflow as tf

from tfloop.engine.task import Task
from tfloop.engine.task.losses import LossOutput

SLOW_STEP = 0.1


class Slow(Task):
    has_eval = False

    def build_model(self):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])

    def train_dataset(self, context):
        return tf.data.Dataset.from_tensors(
            (tf.ones([context.global_batch_size, 4]),
             tf.zeros([context.global_batch_size], tf.int64))).repeat()

    def loss(self, model, batch, *, training):
        features, labels = batch
        start = tf.timestamp()
        waited = tf.while_loop(lambda now: now - start < SLOW_STEP,
                               lambda now: [tf.timestamp()], [start])
        with tf.control_dependencies(waited):
            stepped = tf.print("step", output_stream="file://" + os.environ["SLOW_TASK_STEPS"])
        with tf.control_dependencies([stepped]):
            features = tf.identity(features)
        return LossOutput(per_example_loss=keras.losses.sparse_categorical_crossentropy(
            labels, model(features, training=training), from_logits=True))
