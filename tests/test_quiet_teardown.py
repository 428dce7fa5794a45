"""The suite's own distributed iterators read their source without autotune
(tests/quiet_teardown.py), and the canary for the private class it patches."""

import tensorflow as tf

import quiet_teardown


def test_the_suite_builds_its_multi_device_iterators_through_the_patch():
    assert quiet_teardown.installed(), (
        "tests/conftest.py no longer installs tests/quiet_teardown.py: garbage collections "
        "in pytest workers will stand idle for seconds again")
    assert quiet_teardown.PATCHED.__init__.__wrapped__ is quiet_teardown._original_init


def test_a_distributed_iterator_reads_its_source_without_autotune_unless_the_test_chose(
        cpu_devices, monkeypatch):
    seen, original = [], quiet_teardown._original_init

    def recording(self, dataset=None, *args, **kwargs):
        seen.append(None if dataset is None else dataset.options().autotune.enabled)
        return original(self, dataset, *args, **kwargs)

    monkeypatch.setattr(quiet_teardown, "_original_init", recording)
    strategy = tf.distribute.MirroredStrategy(cpu_devices[:2])
    chosen = tf.data.Options()
    chosen.autotune.enabled = True
    plain = tf.data.Dataset.range(8).batch(4)
    for dataset in (plain, plain.with_options(chosen)):
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        values = strategy.experimental_local_results(next(iterator))
        assert [v.numpy().tolist() for v in values] == [[0, 1], [2, 3]]
        del iterator
    assert seen == [False, True]
