"""A task with a train split only, of unknown size: endless zeros.

It does not override `eval_dataset` (so `--mode=train_and_evaluate` has nothing
to evaluate) nor `train_examples` (so epochs cannot be counted): the plan's
refusals of both are tested with it (test_plan.py, test_run_length.py).
"""

import keras
import tensorflow as tf

from tfloop.engine.task.losses import LossOutput
from tfloop.engine.task import Task


class TrainOnly(Task):
    """Endless zeros through one Dense layer; no eval split, no size."""

    def build_model(self):
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    def train_dataset(self, context):
        return tf.data.Dataset.from_tensors(
            (tf.zeros([context.global_batch_size, 2]), tf.zeros([context.global_batch_size]))
        ).repeat()

    def loss(self, model, batch, *, training):
        features, target = batch
        return LossOutput(per_example_loss=(model(features)[:, 0] - target) ** 2)
