"""Device specs and configuration checks: each mistake is one clear line."""

import pytest

from engine import devices, strategies
from engine.config import RunConfig
from engine.errors import ConfigError


def test_parse_devices_canonicalizes():
    assert devices.parse_devices("gpu:0,GPU:1") == ["/gpu:0", "/gpu:1"]
    assert devices.parse_devices(" cpu:0 , /cpu:3") == ["/cpu:0", "/cpu:3"]
    assert devices.parse_devices("") == ["/cpu:0"]  # no GPU on the test machines


@pytest.mark.parametrize("spec, message", [
    ("tpu:0", "is not a device"),
    ("gpu0", "is not a device"),
    ("cpu:0,cpu:0", "more than once"),
])
def test_parse_devices_rejects(spec, message):
    with pytest.raises(ConfigError) as error:
        devices.parse_devices(spec)
    assert message in str(error.value)


def test_missing_gpu_is_refused_with_a_cpu_hint():
    with pytest.raises(ConfigError) as error:
        devices.prepare_devices(["/gpu:0"])
    assert "gpu:0 does not exist" in str(error.value)
    assert "cpu:N" in str(error.value)


def test_more_cpus_than_the_process_started_with_is_refused():
    with pytest.raises(ConfigError) as error:
        devices.prepare_devices(["/cpu:7"])
    assert "already started with 4" in str(error.value)


@pytest.mark.parametrize("name, devs, message", [
    ("mirored", ["/cpu:0"], "is not a strategy"),
    ("parameter_server", ["/cpu:0", "/cpu:1"], "one CPU or the local GPUs"),
    ("multi_worker", ["/cpu:0", "/cpu:1"], "one CPU or the local GPUs"),
    ("one_device", ["/cpu:0", "/cpu:1"], "exactly one device"),
])
def test_strategy_mistakes(name, devs, message):
    with pytest.raises(ConfigError) as error:
        strategies.num_replicas(name, devs)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("field, value, message", [
    ("global_batch_size", 0, "must be a positive integer"),
    ("steps_per_loop", -1, "must be a positive integer"),
    ("train_steps", -5, "must be 0 or more"),
    ("eval_steps", 0, "or -1 for the whole eval split"),
    ("learning_rate", 0.0, "must be positive"),
    ("mode", "fit", "is not a mode"),
])
def test_config_is_validated_at_construction(field, value, message):
    with pytest.raises(ConfigError) as error:
        RunConfig(**{field: value})
    assert message in str(error.value)
