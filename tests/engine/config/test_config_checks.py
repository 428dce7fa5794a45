"""Each field's own check at construction: the values refused with the line
that names the flag and its range, the limits admitted, and the collective's
options checked by the collectives. No TensorFlow runtime; milliseconds.
(The device specs and strategy mistakes: tests/engine/runtime/test_devices.py.)
"""

import pytest

from tfloop import collectives
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError


@pytest.mark.parametrize("field, value, message", [
    ("global_batch_size", 0, "must be a positive integer"),
    ("steps_per_loop", -1, "must be a positive integer"),
    ("train_steps", -5, "must be 0 or more"),
    ("eval_steps", 0, "or -1 for the whole eval split"),
    ("learning_rate", 0.0, "must be a positive number"),
    ("mode", "fit", "is not a mode"),
    ("virtual_gpus", -1, "--virtual_gpus=-1 must be 0 or more"),
])
def test_config_is_validated_at_construction(field, value, message):
    with pytest.raises(ConfigError) as error:
        RunConfig(**{field: value})
    assert message in str(error.value)


INT32_MAX = 2**31 - 1


@pytest.mark.parametrize("overrides, message", [
    # Step counts and intervals: the compiled loop counts in int32.
    (dict(train_steps=2**31), f"--train_steps=2147483648 must be 0 or more, at most {INT32_MAX}"),
    (dict(steps_per_loop=2**31), "--steps_per_loop=2147483648 must be a positive integer, at most"),
    (dict(checkpoint_interval=2**40), "--checkpoint_interval=1099511627776 must be 0 or more"),
    (dict(summary_interval=2**31), "--summary_interval=2147483648 must be 0 or more"),
    (dict(eval_interval=2**31), "--eval_interval=2147483648 must be 0 or more"),
    (dict(eval_steps=2**31), "--eval_steps=2147483648 must be a positive number of batches"),
    (dict(warmup_steps=2**31), "--warmup_steps=2147483648 must be 0 or more"),
    (dict(epochs=2**31), "--epochs=2147483648 must be 0 or more"),
    (dict(epochs=2**16, steps_per_epoch=2**16), "is beyond the last step a run can reach"),
    (dict(global_batch_size=2**31), "--global_batch_size=2147483648 must be a positive"),
    (dict(per_replica_batch_size=2**31), "--per_replica_batch_size=2147483648 must be 0 or"),
    (dict(accumulation_steps=2**31), "--accumulation_steps=2147483648 must be a positive"),
    (dict(max_checkpoints=2**31), "--max_checkpoints=2147483648 must be a positive"),
    (dict(early_stopping_patience=2**31), "--early_stopping_patience=2147483648 must be 0"),
    (dict(nan_policy="skip_step", nan_max_skips=2**31), "--nan_max_skips=2147483648 must be"),
    (dict(profile_steps="1,2147483648"), "0 <= A < B <= 2147483647"),
    (dict(lr_schedule="step", lr_decay_steps="10,2147483648"), "at most 2147483647"),
    # NumPy's generators take 32 bits.
    (dict(seed=2**32), "--seed=4294967296 must be 0 or more, at most 4294967295"),
    (dict(seed=-1), "--seed=-1 must be 0 or more"),
    (dict(intra_op_threads=100000), "--intra_op_threads=100000 must be -1"),
    (dict(image_size=10**6), "--image_size=1000000 must be 0 or more, at most 8192"),
    (dict(num_packs=2**31), "--num_packs=2147483648 must be at most 2147483647"),
    (dict(pack_bytes=2**41), "--pack_bytes=2199023255552 must be at most 1099511627776"),
    # Timeouts: nan, inf and negative are refused alike.
    (dict(collective_timeout=float("nan")), "--collective_timeout=nan must be 0 or more seconds"),
    (dict(collective_timeout=float("inf")), "--collective_timeout=inf must be 0 or more seconds"),
    (dict(collective_timeout=-1.0), "--collective_timeout=-1.0 must be 0 or more seconds"),
    (dict(eval_timeout=float("nan")), "--eval_timeout=nan must be 0 or more seconds"),
    (dict(startup_timeout=1e12), "--startup_timeout=1000000000000.0 must be 0 or more"),
    (dict(learning_rate=float("inf")), "--learning_rate=inf must be a positive number"),
    (dict(eval_fraction=float("nan")), "--eval_fraction=nan must be at least 0 and below 1"),
    (dict(train_steps=True), "--train_steps=True must be an integer"),
])
def test_every_numeric_field_has_a_range(overrides, message):
    with pytest.raises(ConfigError) as error:
        RunConfig(**overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_ranges_admit_their_limits():
    RunConfig(train_steps=INT32_MAX, steps_per_loop=INT32_MAX, seed=2**32 - 1,
              intra_op_threads=1024, collective_timeout=7 * 24 * 3600.0, image_size=8192,
              eval_steps=INT32_MAX)
    RunConfig(epochs=2**15, steps_per_epoch=2**16 - 1)


@pytest.mark.parametrize("field, value, message", [
    ("num_packs", -1, "--num_packs=-1 must be an integer >= 0"),
    ("pack_bytes", -5, "--pack_bytes=-5 must be an integer >= 0"),
    ("gradient_dtype", "int8", "--gradient_dtype='int8' is not supported"),
])
def test_collective_options_are_checked_at_construction_by_the_collectives(field, value, message):
    with pytest.raises(collectives.CollectiveError) as error:
        RunConfig(**{field: value})
    assert message in str(error.value)
