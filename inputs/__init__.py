"""Input pipelines: datasets by name, and `tf.data` global-batch pipelines."""

from inputs.examples import Examples, Splits
from inputs.pipeline import eval_batches, train_batches
from inputs.registry import available, load, register

__all__ = ["Examples", "Splits", "available", "eval_batches", "load", "register", "train_batches"]
