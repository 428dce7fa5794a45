"""A task whose train pipeline is slow on purpose and says which process ran it.

For tests/bin/test_data_service.py and the speed-up measured in
docs/performance.md: each example waits `$SERVED_TASK_SLEEP_MS` ms in the
pipeline (a wait that burns no CPU, so adding data workers on a 2-core machine
still shows what they add), and, when `$SERVED_TASK_MARKS` names a folder,
leaves an empty file `<pid>-<example>` there, the pid read from
/proc/self/stat by the pipeline itself: a data worker runs the pipeline in its
own process, so the files say which worker prepared which example, with no
timing involved. Only TensorFlow ops (a data worker cannot run Python).

`bin/train --task=served_task:Served` builds it with no arguments.
"""

import os

import keras
import tensorflow as tf
# The one wait in tf.data that burns no CPU; private, so only here, in a test helper.
from tensorflow.python.data.experimental.ops import testing

from tfloop.engine.task import Task
from tfloop.engine.task.losses import LossOutput

EXAMPLES = 64


class Served(Task):
    has_eval = False

    def __init__(self):
        self.marks = os.environ.get("SERVED_TASK_MARKS", "")
        self.sleep_us = int(float(os.environ.get("SERVED_TASK_SLEEP_MS", "5")) * 1000)

    def build_model(self):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])

    def _example(self, index):
        if self.marks:
            pid = tf.strings.split(tf.io.read_file("/proc/self/stat"), " ")[0]
            name = tf.strings.join([self.marks, "/", pid, "-", tf.strings.as_string(index)])
            with tf.control_dependencies([tf.io.write_file(name, "")]):
                index = tf.identity(index)
        features = tf.fill([4], tf.cast(index, tf.float32) / EXAMPLES)
        return features, index % 3

    def train_dataset(self, context):
        ds = tf.data.Dataset.range(EXAMPLES).shuffle(EXAMPLES, seed=context.seed).repeat()
        ds = ds.map(self._example).apply(testing.sleep(self.sleep_us))
        return ds.batch(context.global_batch_size, drop_remainder=True)

    def loss(self, model, batch, *, training):
        features, labels = batch
        return LossOutput(per_example_loss=keras.losses.sparse_categorical_crossentropy(
            labels, model(features, training=training), from_logits=True))
