"""Keras's other ways to give `fit` its data, as the datasets the engine takes.

`model.fit(x, y, batch_size=32, shuffle=True, sample_weight=...,
class_weight=..., validation_data=(x_val, y_val))`: NumPy arrays (or tensors;
several inputs as a tuple or a dict of them) are sliced into a batched
`tf.data.Dataset` of (x, y[, sample_weight]), batches of `batch_size`
(Keras's 32 when not given), the last one partial. `shuffle=True` (Keras's
default for arrays) shuffles every epoch with the run's seed (`RunConfig.seed`):
each epoch is one pass over a new order, as in Keras, though not Keras's own
order (Keras draws it from its own random state); `shuffle=False` feeds
them in order, exactly as Keras does. `class_weight` multiplies each
training example's weight by its class's, as Keras does (not validation's).
"""

from __future__ import annotations

from typing import Any, Optional

import math

import numpy as np
import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.keras_fit.epochs import split_element

#: Keras's batch size when arrays come without one.
DEFAULT_BATCH = 32


def _slices(x: Any) -> Any:
    """Arrays as `from_tensor_slices` takes them: a list of inputs as a tuple
    (a list would be stacked into one tensor)."""
    if isinstance(x, list):
        return tuple(_slices(v) for v in x)
    if isinstance(x, tuple):
        return tuple(_slices(v) for v in x)
    if isinstance(x, dict):
        return {k: _slices(v) for k, v in x.items()}
    return x


def _is_data(x: Any) -> bool:
    return isinstance(x, tf.data.Dataset) or callable(x)


def training_data(x: Any, y: Any, sample_weight: Any, *, batch_size: Optional[int],
                  shuffle: bool, seed: int) -> Any:
    """`x` itself when it is a dataset or a function (then `y` and
    `sample_weight` must be None, as in Keras); arrays as a batched dataset."""
    if _is_data(x):
        if y is not None or sample_weight is not None:
            raise ConfigError("fit: y= and sample_weight= go with arrays; a dataset yields "
                              "(x, y) or (x, y, sample_weight) itself")
        return x
    if y is None:
        raise ConfigError(f"fit: the training data is {type(x).__name__} with no y=; give "
                          "fit(model_fn, x, y) with arrays, or a batched tf.data.Dataset")
    parts = (_slices(x), _slices(y)) + ((_slices(sample_weight),)
                                       if sample_weight is not None else ())
    try:
        dataset = tf.data.Dataset.from_tensor_slices(parts)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"fit: x, y and sample_weight must hold the same number of "
                          f"examples: {str(error).splitlines()[0]}") from None
    if shuffle:
        count = int(dataset.cardinality())
        dataset = dataset.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size or DEFAULT_BATCH)


def validation_data(data: Any, *, batch_size: Optional[int]) -> Any:
    """`validation_data` as Keras takes it: a dataset (or a function), or a
    tuple (x, y) / (x, y, sample_weight) of arrays, batched as the training
    arrays are."""
    if data is None or _is_data(data):
        return data
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        return tf.data.Dataset.from_tensor_slices(tuple(_slices(v) for v in data)).batch(
            batch_size or DEFAULT_BATCH)
    raise ConfigError(f"fit: validation_data is {type(data).__name__}; give a dataset or a "
                      "tuple (x_val, y_val) or (x_val, y_val, sample_weight)")


def class_weighted(data: Any, class_weight: Optional[dict]) -> Any:
    """The training batches with each example's weight times its class's
    weight (`class_weight[label]`; one-hot labels by their argmax), as Keras
    weighs them. A class missing from the dict is refused, as in Keras."""
    if not class_weight:
        return data
    if callable(getattr(data, "mapped", None)):  # a PyDataset (`py_dataset.PyDatasetInput`)
        _class_table(class_weight)  # refused now, not once the run started
        return data.mapped(lambda dataset: class_weighted(dataset, class_weight))
    if not isinstance(data, tf.data.Dataset):
        raise ConfigError("fit: class_weight= needs the training data as arrays or a "
                          "dataset, not a function; weigh the examples in it (a third "
                          "component, sample_weight)")
    table = tf.constant(_class_table(class_weight))

    def weigh(*element):
        x, y, sample_weight = split_element(element)
        if isinstance(y, dict) or isinstance(y, (tuple, list)):
            raise ConfigError("fit: class_weight= needs a single output's labels")
        labels = y
        if labels.shape.rank is not None and labels.shape.rank > 1:
            labels = (tf.argmax(labels, axis=-1) if labels.shape[-1] > 1
                      else tf.squeeze(labels, -1))
        weights = tf.gather(table, tf.cast(labels, tf.int32))
        if sample_weight is not None:
            weights *= tf.cast(tf.reshape(sample_weight, tf.shape(weights)), tf.float32)
        return x, y, weights

    return data.map(weigh)


def _class_table(class_weight: Any) -> np.ndarray:
    """`class_weight` as a table by class index; a class missing from the
    dict is refused, as in Keras."""
    if not isinstance(class_weight, dict) or not all(
            isinstance(k, (int, np.integer)) and k >= 0 for k in class_weight):
        raise ConfigError("fit: class_weight must be a dict {class index: weight}")
    table = np.zeros(max(class_weight) + 1, np.float32)
    missing = [i for i in range(len(table)) if i not in class_weight]
    if missing:
        raise ConfigError(f"fit: class_weight has no weight for class(es) {missing}; give "
                          "every class index from 0 to the largest one")
    for index, weight in class_weight.items():
        table[index] = weight
    return table


def split_for_validation(x: Any, y: Any, sample_weight: Any, validation_split: float,
                         validation_data: Any) -> tuple:
    """`validation_split` as Keras takes it: the last fraction of the arrays
    (before any shuffle) becomes `validation_data`. Returns (x, y,
    sample_weight, validation_data)."""
    if not validation_split:
        return x, y, sample_weight, validation_data
    if not 0 < validation_split < 1:
        raise ConfigError(f"fit: validation_split={validation_split!r} must be between 0 and 1")
    if _is_data(x):
        raise ConfigError("fit: validation_split= needs arrays (x, y); with a dataset give "
                          "validation_data=")
    if validation_data is not None:
        raise ConfigError("fit: give validation_split= or validation_data=, not both")
    size = len(tf.nest.flatten(_slices(x))[0])
    split_at = int(math.floor(size * (1.0 - validation_split)))
    if split_at in (0, size):
        raise ConfigError(f"fit: validation_split={validation_split} leaves no example on "
                          f"one side of {size}")
    train, held = ([tf.nest.map_structure(lambda t: t[part], _slices(v)) if v is not None
                    else None for v in (x, y, sample_weight)]
                   for part in (slice(None, split_at), slice(split_at, None)))
    validation = tuple(v for v in held if v is not None)
    return (*train, validation)
