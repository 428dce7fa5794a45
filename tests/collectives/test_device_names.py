"""`collectives.device_names`: the one parser and spelling of device names that
the engine (`--devices`, logs) and the collectives (`--reduce_device`, errors)
share."""

import pytest

from tfloop.collectives import device_names


@pytest.mark.parametrize("item, name", [
    ("gpu:0", "/gpu:0"), (" GPU:1 ", "/gpu:1"), ("/cpu:3", "/cpu:3"), ("cpu:007", "/cpu:7"),
    ("tpu:0", None), ("gpu0", None), ("gpu:", None), ("", None),
    # TensorFlow's own spellings of a local device (tf.config, tensor.device):
    ("/device:GPU:0", "/gpu:0"), ("device:CPU:2", "/cpu:2"),
    ("/job:localhost/replica:0/task:0/device:GPU:1", "/gpu:1"),
    ("/job:localhost/replica:0/task:0/device:CPU:0", "/cpu:0"),
    # ... but not another task's device, a TPU, or a name without an index:
    ("/job:worker/replica:0/task:1/device:GPU:0", None), ("/device:TPU:0", None),
    ("/device:GPU", None), ("/job:localhost/device:GPU:x", None),
])
def test_canonical_accepts_cpu_and_gpu_numbers_only(item, name):
    assert device_names.canonical(item) == name


@pytest.mark.parametrize("device, kind, index, short", [
    ("/gpu:0", "gpu", 0, "gpu:0"),
    ("/cpu:3", "cpu", 3, "cpu:3"),
    ("/device:GPU:1", "gpu", 1, "gpu:1"),
    ("/job:worker/replica:0/task:1/device:CPU:2", "cpu", 2, "cpu:2"),
])
def test_every_tensorflow_spelling_has_one_kind_index_and_short_name(device, kind, index, short):
    assert device_names.kind(device) == kind
    assert device_names.index(device) == index
    assert device_names.short(device) == short


def test_kind_of_a_name_without_a_type_is_empty():
    assert device_names.kind("") == ""
    assert device_names.kind("/job:worker") == ""


def test_short_list_is_how_devices_are_written_on_the_command_line():
    assert device_names.short_list(["/cpu:0", "/device:CPU:1"]) == "cpu:0,cpu:1"
    assert device_names.short_list(["/gpu:0", "/gpu:1"], ", ") == "gpu:0, gpu:1"
    assert device_names.short_list([]) == ""
