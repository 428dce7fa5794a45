"""The suite's distributed iterators are dropped without waiting out tf.data's autotune thread.

A distributed iterator's `MultiDeviceIterator` reads the distributed dataset
through one pipeline of its own. With autotune on (TensorFlow's default),
that pipeline runs an autotune thread which sleeps between optimizations for
a period that doubles up to 60 s. Dropping the iterator waits for that thread
to wake. Captured with gdb during one of these waits in a pytest worker (TF 2.21):

    EagerTensor_dealloc -> IteratorResource::~IteratorResource     (a per-device pipeline)
      -> GeneratorDataset::~Dataset -> MultiDeviceIterator::~MultiDeviceIterator
      -> RootDataset::Iterator::~Iterator -> LogicalThreadWrapper::~LogicalThreadWrapper
    meanwhile, thread "tf_data_model": Model::OptimizeLoop -> CondVar wait with a timeout

A pytest worker builds hundreds of these iterators. Many of them sit in
reference cycles, so one garbage collection drops dozens of them, and it stood
idle 6-11 s at a time (8.47 s of wall time for 0.43 s of CPU). One test, a
refusal that takes 8.6 s alone, took 123 s in the suite. Scripts that build
a few iterators (read in a tf.function or eagerly, to the end or not, kept
1-40 s, dropped at once or through a cycle, with the CPUs loaded or idle)
dropped each in 0.2 s: the wait was never reproduced outside a long-lived
process that builds hundreds. Without autotune on these sources, the idle
collections vanished (tests/engine/task, loop and run_dir: 101 s -> 85 s
under `-n 2`, gc time 29 s -> 9 s). So the suite
turns autotune off on these source pipelines, in its own processes only. It
changes neither the order nor the values of any element: autotune only sizes
buffers and parallelism. The engine leaves the user's pipeline as the user
built it. `engine/loop/iterators.py` already builds the per-device pipelines
without autotune.

The same wait, later (2026-11-29, after the above): a garbage collection
idle for 222 s (0.73 s of CPU) in one pytest worker, 48 s, 37 s and 27 s in
others, 5.6 min of idle workers in one whole-suite run. gdb showed a plain
iterator this time, no `MultiDeviceIterator` above it:

    EagerTensor_dealloc -> IteratorResource::~IteratorResource
      -> RootDataset::Iterator::~Iterator -> LogicalThreadWrapper::~LogicalThreadWrapper

the iterator of `iter(dataset)` (`OwnedIterator`): a test's, Keras's
(`fit`, `predict`) or a one-device strategy's. So plain iterators are built
without autotune too, with the same exception.

`tests/test_quiet_teardown.py` fails loudly if TensorFlow moves the classes
patched here (private APIs, so they live in this one module).
"""

from __future__ import annotations

import functools

from tensorflow.python.data.ops import iterator_ops, multi_device_iterator_ops  # private

from tfloop.engine.loop.iterators import without_autotune

#: The iterators built without autotune: a distributed dataset's, and `iter(dataset)`'s.
PATCHED = (multi_device_iterator_ops.OwnedMultiDeviceIterator, iterator_ops.OwnedIterator)
_original_inits = {cls: cls.__init__ for cls in PATCHED}


def _without_autotune(dataset):
    if dataset is None or dataset.options().autotune.enabled is not None:
        return dataset  # rebuilt from components, or the test chose autotune itself
    return without_autotune(dataset)


def _patched(cls):
    @functools.wraps(_original_inits[cls])
    def __init__(self, dataset=None, *args, **kwargs):
        _original_inits[cls](self, _without_autotune(dataset), *args, **kwargs)

    __init__.quiet_teardown = True
    return __init__


def install() -> None:
    """Builds every `OwnedMultiDeviceIterator` and `OwnedIterator` of this
    process on a pipeline without autotune, unless the dataset's own options set it."""
    for cls in PATCHED:
        if not getattr(cls.__init__, "quiet_teardown", False):
            cls.__init__ = _patched(cls)


def installed() -> bool:
    return all(getattr(cls.__init__, "quiet_teardown", False) for cls in PATCHED)
