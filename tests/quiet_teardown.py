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

`tests/test_quiet_teardown.py` fails loudly if TensorFlow moves the class
patched here (a private API, so it lives in this one module).
"""

from __future__ import annotations

import functools

from tensorflow.python.data.ops import multi_device_iterator_ops  # private: see above

from tfloop.engine.loop.iterators import without_autotune

PATCHED = multi_device_iterator_ops.OwnedMultiDeviceIterator
_original_init = PATCHED.__init__


def _without_autotune(dataset):
    if dataset is None or dataset.options().autotune.enabled is not None:
        return dataset  # rebuilt from components, or the test chose autotune itself
    return without_autotune(dataset)


def install() -> None:
    """Builds every `OwnedMultiDeviceIterator` of this process on a source
    pipeline without autotune, unless the dataset's own options set it."""
    if installed():
        return

    @functools.wraps(_original_init)
    def __init__(self, dataset=None, *args, **kwargs):
        _original_init(self, _without_autotune(dataset), *args, **kwargs)

    __init__.quiet_teardown = True
    PATCHED.__init__ = __init__


def installed() -> bool:
    return getattr(PATCHED.__init__, "quiet_teardown", False)
