"""Input pipelines: datasets by name, and `tf.data` global-batch pipelines."""

from tfloop.inputs.context import InputContext
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import Examples, ImageFiles, RecordFiles, Split, Splits
from tfloop.inputs.pipeline import eval_batches, resolve_shard_policy, train_batches
from tfloop.inputs.registry import available, load, register

__all__ = [
    "Examples", "ImageFiles", "InputContext", "InputError", "RecordFiles", "Split", "Splits", "available",
    "eval_batches", "load", "register", "resolve_shard_policy", "train_batches",
]
