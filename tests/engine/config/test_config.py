"""`engine.config`: the run's one frozen, validated record.

What the rest of the engine relies on: a `RunConfig` cannot change once
made, every way of making one (the constructor, `dataclasses.replace`, a
record read back from `as_dict`) runs the same checks, `check_field` (what
`bin/train` runs on its flags before TensorFlow loads) answers the same first
mistake as the constructor, and the parsed views of text fields
(`lr_decay_boundaries`, `profile_range`) and `changed` say what the fields
say. Each field's own range and the combinations refused:
tests/engine/runtime/test_devices.py and tests/engine/assembly/test_run_length.py.
No TensorFlow runtime; milliseconds.
"""

import dataclasses

import pytest

from tfloop.engine.config import RunConfig, check_field
from tfloop.engine.errors import ConfigError


def test_a_config_cannot_change_once_made():
    config = RunConfig(learning_rate=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.learning_rate = 0.1
    assert config.learning_rate == 0.5


@pytest.mark.parametrize("changes, message", [
    (dict(global_batch_size=0), "--global_batch_size=0 must be a positive integer"),
    (dict(mode="fit"), "--mode='fit' is not a mode; choose one of: train, evaluate"),
    (dict(steps_per_epoch=10), "is the length of an epoch for --epochs"),
])
def test_a_replaced_config_is_checked_as_a_new_one(changes, message):
    """The plan resolves fields with `dataclasses.replace`: a value the
    constructor refuses cannot enter that way either."""
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(RunConfig(), **changes)


def test_the_flat_record_makes_the_same_config_again():
    """`as_dict` is what `run.json` and `metrics.json` keep: flat field names
    that rebuild an equal config (and an equal config is an equal record)."""
    config = RunConfig(model_dir="runs/x", global_batch_size=64, lr_schedule="step",
                       lr_decay_steps="100,200", profile_steps="3,6", seed=7)
    record = config.as_dict()
    assert RunConfig(**record) == config
    assert RunConfig(**record).as_dict() == record
    assert record != RunConfig().as_dict()


@pytest.mark.parametrize("name, value", [
    ("train_steps", -1), ("global_batch_size", 2.5), ("seed", 2**32), ("mode", "fit"),
    ("learning_rate", float("nan")), ("profile_steps", "6,3"), ("lr_decay_steps", "200,100"),
    ("best_metric", "accuracy"), ("model_dir", ""),
])
def test_check_field_answers_the_constructors_first_mistake(name, value):
    """bin/train checks each flag it was given before TensorFlow loads; the
    line must be the one `RunConfig(...)` would say, not another wording."""
    with pytest.raises(ConfigError) as by_field:
        check_field(name, value)
    with pytest.raises(ConfigError) as by_config:
        RunConfig(**{name: value})
    assert str(by_field.value) == str(by_config.value)
    assert f"--{name}=" in str(by_field.value) or f"--{name} " in str(by_field.value)


def test_a_field_without_a_check_of_its_own_passes_check_field():
    check_field("strategy", "no_such_strategy")  # the strategy registry decides, later
    check_field("no_such_field", object())


def test_text_fields_read_as_steps():
    config = RunConfig(lr_schedule="step", lr_decay_steps="30000,60000", profile_steps="100,110")
    assert config.lr_decay_boundaries == (30000, 60000)
    assert config.profile_range == (100, 110)
    plain = RunConfig()
    assert plain.lr_decay_boundaries == () and plain.profile_range is None


def test_changed_names_only_the_fields_away_from_their_defaults():
    config = RunConfig(learning_rate=0.5, seed=0, nan_policy="skip_step")
    assert config.changed("learning_rate", "seed", "nan_policy", "optimizer") == [
        "--learning_rate=0.5", "--nan_policy=skip_step"]
    assert RunConfig().changed(*(f.name for f in dataclasses.fields(RunConfig))) == []
