"""Keras's `PyDataset` (`keras.utils.Sequence`) as fit's data, read as Keras's `fit` reads it.

`model.fit(py_dataset)` takes an object whose `py_dataset[i]` is the batch
`(x, y)` or `(x, y, sample_weight)` (NumPy arrays, or structures of them) and
whose `num_batches` (`len()`) is the batches of one epoch (None: endless,
then `steps_per_epoch` says an epoch). Keras's `fit` reads it as
`keras/src/trainers/data_adapters/py_dataset_adapter.py` does (Keras 3.15):
each epoch `on_epoch_begin()`, the batches in index order (with
`shuffle=True`, fit's default, the indices of each epoch shuffled), then
`on_epoch_end()`. Under a distribution strategy (`MirroredStrategy`) it
peeks at the first batch when it starts (`_maybe_symbolic_build`) and resets
after, so `fit` begins with `on_epoch_begin()`, `on_epoch_end()`, and each
validation with the same pair before its own `on_epoch_begin()`, batches,
`on_epoch_end()`. `workers > 1` reads batches ahead on that many threads,
in order, at most `max_queue_size` ahead.

Here the same object feeds the engine's pipeline as a function of the
`InputContext` (`PyDatasetInput`, built once the run's strategy is up, so it
works in a cluster too): a pass is a `tf.data` generator that calls the hooks
and reads the batches in the pass's order, so the hooks fall between the
last batch read of one pass and the first of the next, in data order (the
pipeline reads ahead of training: a hook may run before the epoch's last
step trains). The order of a shuffled pass comes from the run's seed, each
pass a new one (not Keras's, which comes from Python's global `random`):
deterministic, so a resumed run, which reads the batches before its step
again (the hooks with them), sees what an uninterrupted one saw.
`use_multiprocessing=True` is refused: the engine reads on threads.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
from typing import Any, Callable, Iterator, Optional

import keras
import numpy as np
import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.keras_fit.arrays import _slices as tuples
from tfloop.inputs import InputContext

#: Batches read for the element spec, as Keras reads them (its NUM_BATCHES_FOR_TENSOR_SPEC).
_SPEC_BATCHES = 2


def is_py_dataset(data: Any) -> bool:
    return isinstance(data, keras.utils.PyDataset)


class PyDatasetInput:
    """A `PyDataset` as fit's data: called with the run's `InputContext`, one
    pass over it as a `tf.data.Dataset` (endless for an endless one), its
    batches standardized as Keras standardizes them. `batch_size` is its
    largest first batch's (the engine's global batch), `num_batches` its
    `num_batches` (None: endless), `element_spec` what the pipeline yields."""

    def __init__(self, py_dataset: Any, *, shuffle: bool, validation: bool = False,
                 steps_per_epoch: Optional[int] = None, where: str = "the training data"):
        self.py_dataset, self.where = py_dataset, where
        self.validation = validation
        self._check_workers()
        self.num_batches = self._num_batches()
        if self.num_batches is None and validation:
            raise ConfigError(f"fit: {where} is a PyDataset with no end (num_batches None), and "
                              "a validation is one pass; give it a num_batches (__len__)")
        if self.num_batches is None and steps_per_epoch is None:
            raise ConfigError(f"fit: {where} is a PyDataset with no end (num_batches None), so "
                              "give steps_per_epoch=, the steps of one epoch")
        self.shuffle = shuffle and self.num_batches is not None  # Keras: endless is not shuffled
        self.steps_per_epoch = steps_per_epoch
        first = [self._batch(i) for i in range(min(_SPEC_BATCHES, self.num_batches or
                                                   _SPEC_BATCHES))]
        if not first:
            raise ConfigError(f"fit: {where} is an empty PyDataset (num_batches 0)")
        self.element_spec = _spec(first)
        self.batch_size = max(len(tf.nest.flatten(batch)[0]) for batch in first)
        self._transforms: list[Callable[[tf.data.Dataset], tf.data.Dataset]] = []

    def mapped(self, transform: Callable[[tf.data.Dataset], tf.data.Dataset]) -> "PyDatasetInput":
        """This input with `transform` applied to the pipeline it builds
        (class weights: `arrays.class_weighted`)."""
        self._transforms.append(transform)
        return self

    def __call__(self, context: InputContext) -> tf.data.Dataset:
        if not self.validation:
            _keras_peek(self.py_dataset)  # as Keras's fit does when it starts
        signature = self.element_spec
        if self.num_batches is None:
            dataset = tf.data.Dataset.from_generator(self._endless, output_signature=signature)
            size = tf.data.INFINITE_CARDINALITY
        else:
            order = tf.data.Dataset.range(self.num_batches)
            if self.shuffle:
                order = order.shuffle(self.num_batches, seed=context.seed,
                                      reshuffle_each_iteration=True)
            # One element per pass, its order: each repeat of the pass reads a new one.
            dataset = order.batch(self.num_batches).flat_map(
                lambda indices: tf.data.Dataset.from_generator(
                    self._pass, args=(indices,), output_signature=signature))
            size = self.num_batches
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(size))
        for transform in self._transforms:
            dataset = transform(dataset)
        return dataset

    def _pass(self, indices: np.ndarray) -> Iterator[tuple]:
        """One pass: the hooks around the batches at `indices`, in that order."""
        hooks = self.py_dataset
        if self.validation:
            _keras_peek(hooks)  # as each of Keras's evaluations does first
        hooks.on_epoch_begin()
        yield from self._read(int(i) for i in indices)
        hooks.on_epoch_end()

    def _endless(self) -> Iterator[tuple]:
        """Batch 0, 1, ... with the hooks at every `steps_per_epoch` batches, as
        Keras's fit calls them at each epoch of an endless PyDataset."""
        hooks, every = self.py_dataset, self.steps_per_epoch
        for index, batch in enumerate(self._read(itertools.count())):
            if index % every == 0:
                if index:
                    hooks.on_epoch_end()
                hooks.on_epoch_begin()
            yield batch

    def _read(self, indices: Iterator[int]) -> Iterator[tuple]:
        """The batches at `indices`, in order: on `workers` threads at most
        `max_queue_size` ahead when it asks for several, as Keras's
        OrderedEnqueuer reads them."""
        workers = int(getattr(self.py_dataset, "workers", 1) or 1)
        if workers <= 1:
            for index in indices:
                yield self._batch(index)
            return
        ahead = max(int(getattr(self.py_dataset, "max_queue_size", 10) or 10), workers)
        pool = concurrent.futures.ThreadPoolExecutor(workers,
                                                     thread_name_prefix="tfloop-pydataset")
        try:
            pending = collections.deque(pool.submit(self._batch, index)
                                        for index in itertools.islice(indices, ahead))
            while pending:
                batch = pending.popleft().result()
                for index in itertools.islice(indices, 1):
                    pending.append(pool.submit(self._batch, index))
                yield batch
        finally:  # a pass left early (training ended, validation_steps): no read left running
            pool.shutdown(wait=True, cancel_futures=True)

    def _batch(self, index: int) -> tuple:
        """`py_dataset[index]` as Keras standardizes it: a tuple (x, y) or
        (x, y, sample_weight), lists as tuples, leaves as arrays."""
        batch = self.py_dataset[index]
        if isinstance(batch, list):
            batch = tuple(batch)
        if not isinstance(batch, tuple) or len(batch) not in (2, 3):
            raise ConfigError(
                f"fit: {self.where}[{index}] is {type(batch).__name__}"
                f"{f' of {len(batch)}' if isinstance(batch, tuple) else ''}; a PyDataset for "
                "fit returns (x, y) or (x, y, sample_weight)")
        return tf.nest.map_structure(np.asarray, tuples(batch))

    def _num_batches(self) -> Optional[int]:
        try:
            count = self.py_dataset.num_batches
        except NotImplementedError:
            raise ConfigError(f"fit: {self.where} ({type(self.py_dataset).__name__}) has neither "
                              "__len__ nor num_batches; define one (None: endless)") from None
        if count is not None and (not isinstance(count, (int, np.integer)) or count < 0):
            raise ConfigError(f"fit: {self.where}'s num_batches is {count!r}; give a "
                              "non-negative integer (None: endless)")
        if count == 0:
            raise ConfigError(f"fit: {self.where} is an empty PyDataset (num_batches 0)")
        return None if count is None else int(count)

    def _check_workers(self) -> None:
        if getattr(self.py_dataset, "use_multiprocessing", False):
            raise ConfigError(
                f"fit: {self.where} is a PyDataset with use_multiprocessing=True; the engine "
                "reads a PyDataset's batches on threads (workers=N), not processes: pass "
                "use_multiprocessing=False")


def _keras_peek(py_dataset: Any) -> None:
    """The hooks Keras's fit and evaluate call before their first epoch under
    a strategy: an epoch begun to peek at a batch, and the reset after it."""
    py_dataset.on_epoch_begin()
    py_dataset.on_epoch_end()


def _spec(batches: list) -> Any:
    """The element spec of `batches`, as Keras's: the batch dimension None,
    each other dimension where the batches agree, else None."""
    def leaf(*arrays):
        if arrays[0].ndim < 1:
            raise ConfigError("fit: a PyDataset's batches hold arrays of rank 1 or more, "
                              f"not {arrays[0]!r}")
        shape = [None] + [dims[0] if len(set(dims)) == 1 else None
                          for dims in zip(*(a.shape[1:] for a in arrays))]
        return tf.TensorSpec(shape, tf.as_dtype(arrays[0].dtype))
    try:
        return tf.nest.map_structure(leaf, *batches)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"fit: a PyDataset's first batches differ in structure: "
                          f"{str(error).splitlines()[0]}") from None
