"""Input pipelines: datasets by name, and `tf.data` global-batch pipelines."""

from inputs.errors import InputError
from inputs.splits import Examples, ImageFiles, RecordFiles, Split, Splits
from inputs.pipeline import eval_batches, resolve_shard_policy, train_batches
from inputs.registry import available, load, register

__all__ = [
    "Examples", "ImageFiles", "InputError", "RecordFiles", "Split", "Splits", "available",
    "eval_batches", "load", "register", "resolve_shard_policy", "train_batches",
]
