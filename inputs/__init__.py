"""Input pipelines: datasets by name, `tf.data` global-batch pipelines, and
a task's data as users have it (NumPy arrays: `ArrayData`, `from_npz`; their
own TFRecords of `tf.train.Example`s: `RecordData`)."""

from tfloop.inputs.arrays import ArrayData, from_npz
from tfloop.inputs.context import InputContext, examples_per_step
from tfloop.inputs.errors import InputError
from tfloop.inputs.splits import (IMAGENET_NORMALIZATION, Examples, ImageFiles, ImageNetRecords,
                                  Normalization, RecordFiles, Split, Splits)
from tfloop.inputs.pipeline import (eval_batches, normalize_unit, resolve_shard_policy, to_float,
                                    train_batches, with_run_options, with_shard_policy)
from tfloop.inputs.records import RecordData
from tfloop.inputs.registry import available, load, register

__all__ = [
    "IMAGENET_NORMALIZATION", "ImageNetRecords", "Normalization", "normalize_unit",
    "ArrayData", "Examples", "ImageFiles", "InputContext", "InputError", "examples_per_step", "RecordData",
    "RecordFiles", "Split", "Splits", "available", "eval_batches", "from_npz", "load",
    "register", "resolve_shard_policy", "to_float", "train_batches", "with_run_options",
    "with_shard_policy",
]
