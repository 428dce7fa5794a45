"""A task whose weights count which examples each step trained on.

For the elastic-resume tests (tests/engine/assembly/test_elastic_resume.py,
tests/bin/test_lost_worker.py): the example ids 0..63 come in order, as
one-hot features; the `counts` kernel's loss is -(global batch) x its output,
so plain SGD adds the learning rate to an id's weight each time a step trains
on it. With `--lr_schedule=step` halving the rate at every step (`flags`),
step s adds exactly 2**-s: the final `counts` weights say, bit by bit, which
ids every step saw, however the step was split over replicas and
micro-batches. A small `head` (a classifier of the same features) trains
beside it, so the float comparison with an uninterrupted run has a
non-linear model to compare.

The global batch is $COUNTING_BATCH (16 without it): the loss needs it, and
`bin/train --task=counting_task:Counting` builds the task with no arguments.
"""

import os

import keras
import tensorflow as tf

from tfloop.engine.task.losses import LossOutput
from tfloop.engine.task import Task

IDS = 64


def flags(*, steps: int) -> list[str]:
    """bin/train flags that make `counts` a record of `steps` steps (the batch: the caller's)."""
    return ["--task=counting_task:Counting", "--optimizer=sgd", "--learning_rate=1",
            "--lr_schedule=step", "--lr_decay_rate=0.5",
            "--lr_decay_steps=" + ",".join(str(s) for s in range(1, steps)),
            f"--train_steps={steps}", "--mode=train", "--noexport"]


class Counting(Task):
    has_eval = False

    def __init__(self, batch: int = 0):
        self.batch = batch or int(os.environ.get("COUNTING_BATCH", "16"))

    def build_model(self):
        ids = keras.Input((IDS,))
        counts = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros",
                                    name="counts")(ids)
        hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(ids)
        logits = keras.layers.Dense(3, name="head")(hidden)
        return keras.Model(ids, [counts, logits])

    def train_dataset(self, context):
        assert context.global_batch_size == self.batch, (context.global_batch_size, self.batch)
        ids = tf.data.Dataset.range(IDS).repeat()
        return ids.map(lambda i: (tf.one_hot(i, IDS), i % 3)).batch(
            context.global_batch_size, drop_remainder=True)

    def loss(self, model, batch, *, training):
        features, labels = batch
        counts, logits = model(features, training=training)
        cross_entropy = keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True)
        return LossOutput(per_example_loss=cross_entropy - self.batch * counts[:, 0])


def counts_of(weights: dict):
    """The `counts` kernel among a checkpoint's model weights (the one of shape (64, 1))."""
    (value,) = [v for v in weights.values() if v.shape == (IDS, 1)]
    return value


def steps_seen(counts, *, steps: int) -> list[list[int]]:
    """The ids each of `steps` steps trained on, read from the final `counts` kernel."""
    bits = [round(float(value) * 2 ** (steps - 1)) for value in counts.reshape(-1)]
    return [[i for i, b in enumerate(bits) if b >> (steps - 1 - step) & 1]
            for step in range(steps)]


def expected_steps(*, batch: int, steps: int) -> list[list[int]]:
    """The ids of each step of the stream: `batch` in order, wrapping at 64."""
    return [sorted((step * batch + j) % IDS for j in range(batch)) for step in range(steps)]


def reference_config(model_dir: str, *, batch: int, steps: int, **overrides):
    """The RunConfig of `flags` for an in-process, uninterrupted run."""
    from tfloop.engine.config import RunConfig

    return RunConfig(
        model_dir=model_dir, global_batch_size=batch, optimizer="sgd", learning_rate=1.0,
        lr_schedule="step", lr_decay_rate=0.5,
        lr_decay_steps=",".join(str(s) for s in range(1, steps)), train_steps=steps,
        mode="train", export=False, **overrides)


def model_weights(model_dir) -> dict:
    """The model's weights in `model_dir`'s latest checkpoint, by name."""
    reader = tf.train.load_checkpoint(str(model_dir))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if n.startswith("model_weights/")}


def assert_exact_against_uninterrupted(weights: dict, reference_dir, *, batch: int, steps: int,
                                       steps_per_loop: int) -> None:
    """`weights` trained every step on the stream's examples, and equal (1e-5
    relative) an uninterrupted one-device run's, trained here into `reference_dir`."""
    import numpy as np
    from tfloop.engine.assembly.run import run

    assert steps_seen(counts_of(weights), steps=steps) == expected_steps(batch=batch, steps=steps)
    run(reference_config(str(reference_dir), batch=batch, steps=steps, devices="cpu:0",
                         steps_per_loop=steps_per_loop), task=Counting(batch))
    for name, value in model_weights(reference_dir).items():
        difference = np.linalg.norm(weights[name] - value) / max(np.linalg.norm(value), 1e-12)
        assert difference <= 1e-5, (name, difference)
