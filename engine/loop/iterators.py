"""Distributed iterators whose destruction does not stall.

Destroying a distributed dataset's iterator used to block the thread that
dropped it for up to a minute or more with the CPU idle: in a test suite between tests, in
a script after `run()` returned, in `bin/bench_train` between variants. The
cause, measured on TF 2.21 (docs/performance/teardown_stall.py): a
`MultiDeviceIterator` feeds each device from a small pipeline of its own
(TensorFlow's `_create_device_dataset`: a generator and a `prefetch(1)`),
built with default options, so each runs tf.data's autotune thread. That
thread sleeps between optimizations for a period that doubles up to 60 s,
and the iterator's destructor waits for it to wake instead of waking it
(measured clusters 2.2, 7.35, 17.6, 38 s; several iterators in a row up to
74 s). Turning autotune off on the user's dataset does not reach those
per-device pipelines.

They have nothing to tune (a fixed one-element prefetch), so `distributed`
builds them with autotune off, which starts no such thread: destruction then
took 0.16-0.22 s in every try (plain `iter()`: 0.2 to 74 s). There is no
public option for it: this module patches TensorFlow's private
`multi_device_iterator_ops._create_device_dataset` for the duration of
`iter()` only. If TensorFlow moves it, iterators are built as before (the
stall comes back, nothing breaks), and `tests/engine/loop/test_iterators.py`
fails loudly.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import tensorflow as tf

try:  # private TF: see the module docstring
    from tensorflow.python.data.ops import multi_device_iterator_ops as _mdi
except ImportError:  # pragma: no cover - a TF that moved it
    _mdi = None

_PATCH_LOCK = threading.Lock()


def patchable() -> bool:
    """True when this TensorFlow has the per-device dataset factory patched here."""
    return _mdi is not None and callable(getattr(_mdi, "_create_device_dataset", None))


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with autotune off: no autotune thread for its destructor to
    wait out, for the engine's own pipelines with nothing to tune (and probes)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _without_autotune(create):
    def create_device_dataset(*args, **kwargs):
        return without_autotune(create(*args, **kwargs))
    return create_device_dataset


@contextlib.contextmanager
def _device_pipelines_without_autotune():
    if not patchable():
        yield
        return
    with _PATCH_LOCK:
        original = _mdi._create_device_dataset
        _mdi._create_device_dataset = _without_autotune(original)
        try:
            yield
        finally:
            _mdi._create_device_dataset = original


def distributed(dataset) -> Iterator:
    """`iter(dataset)` for a `strategy.experimental_distribute_dataset(...)`
    result (or any iterable), with per-device pipelines that can be destroyed
    at once."""
    with _device_pipelines_without_autotune():
        return iter(dataset)
