"""The suite's iterators read their pipelines without autotune
(tests/quiet_teardown.py), and the canary for the private classes it patches."""

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops, multi_device_iterator_ops

import quiet_teardown


def test_the_suite_builds_its_iterators_through_the_patch():
    assert quiet_teardown.installed(), (
        "tests/conftest.py no longer installs tests/quiet_teardown.py: garbage collections "
        "in pytest workers will stand idle for seconds again")
    assert quiet_teardown.PATCHED == (multi_device_iterator_ops.OwnedMultiDeviceIterator,
                                      iterator_ops.OwnedIterator)
    for cls in quiet_teardown.PATCHED:
        assert cls.__init__.__wrapped__ is quiet_teardown._original_inits[cls]


def _recording(monkeypatch, cls):
    """The options' autotune of each dataset an iterator of `cls` is built on."""
    seen, original = [], quiet_teardown._original_inits[cls]

    def recording(self, dataset=None, *args, **kwargs):
        seen.append(None if dataset is None else dataset.options().autotune.enabled)
        return original(self, dataset, *args, **kwargs)

    monkeypatch.setitem(quiet_teardown._original_inits, cls, recording)
    return seen


def _chosen(dataset):
    options = tf.data.Options()
    options.autotune.enabled = True
    return dataset.with_options(options)


def test_a_distributed_iterator_reads_its_source_without_autotune_unless_the_test_chose(
        cpu_devices, monkeypatch):
    seen = _recording(monkeypatch, multi_device_iterator_ops.OwnedMultiDeviceIterator)
    strategy = tf.distribute.MirroredStrategy(cpu_devices[:2])
    plain = tf.data.Dataset.range(8).batch(4)
    for dataset in (plain, _chosen(plain)):
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        values = strategy.experimental_local_results(next(iterator))
        assert [v.numpy().tolist() for v in values] == [[0, 1], [2, 3]]
        del iterator
    assert seen == [False, True]


def test_a_plain_iterator_reads_without_autotune_unless_the_test_chose(monkeypatch):
    seen = _recording(monkeypatch, iterator_ops.OwnedIterator)
    plain = tf.data.Dataset.range(6).shuffle(6, seed=1, reshuffle_each_iteration=False).batch(4)
    expected = [[int(x) for x in batch] for batch in plain.as_numpy_iterator()]
    seen.clear()
    for dataset in (plain, _chosen(plain)):
        assert [[int(x) for x in batch] for batch in dataset] == expected  # the same elements
    assert seen == [False, True]
