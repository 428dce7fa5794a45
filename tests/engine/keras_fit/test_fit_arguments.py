"""`fit`'s Keras arguments that cannot work: one line each, before anything runs."""

import pytest

import parity
from tfloop.engine import ConfigError, fit
from test_parity_basics import data, dataset, dense

X, Y = data()


@pytest.mark.parametrize("arguments, says", [
    (dict(epochs=2, initial_epoch=2), "initial_epoch=2 must be an integer from 0 to epochs - 1"),
    (dict(validation_freq=0), "validation_freq=0 must be a positive integer"),
    (dict(class_weight={1: 2.0}), r"no weight for class\(es\) \[0\]"),
    (dict(class_weight={"cat": 2.0}), "class_weight must be a dict"),
    (dict(validation_split=0.2), "validation_split= needs arrays"),
    (dict(y=Y), "y= and sample_weight= go with arrays"),
    (dict(validation_data=[1]), "validation_data is list"),
], ids=["initial_epoch", "validation_freq", "class_weight_missing", "class_weight_keys",
        "validation_split_dataset", "y_with_a_dataset", "validation_data_list"])
def test_a_dataset_with_arguments_that_cannot_work(tmp_path, arguments, says):
    with pytest.raises(ConfigError, match=says) as error:
        fit(dense, dataset(), config=parity.config(tmp_path / "run"), verbose=False,
            **arguments)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arguments, says", [
    (dict(), "no y="),
    (dict(y=Y[:10]), "the same number of examples"),
    (dict(y=Y, validation_split=1.5), "must be between 0 and 1"),
    (dict(y=Y, validation_split=0.2, validation_data=(X, Y)), "not both"),
], ids=["no_y", "y_too_short", "validation_split_range", "validation_split_and_data"])
def test_arrays_with_arguments_that_cannot_work(tmp_path, arguments, says):
    with pytest.raises(ConfigError, match=says) as error:
        fit(dense, X, config=parity.config(tmp_path / "run"), verbose=False, **arguments)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_a_model_built_outside_the_strategy_the_config_names_is_one_line(tmp_path):
    # fit adopts a compiled model's own strategy (here none: one device), so
    # a config naming mirrored on two CPUs asks for what cannot be done in place.
    with pytest.raises(ConfigError, match=r"^fit: RunConfig\(devices='cpu:0,cpu:1'\) but the "
                       r"model was built outside any strategy's scope") as error:
        fit(dense(), X, Y, batch_size=8, config=parity.config(tmp_path / "run"), verbose=False)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"^fit: the first argument is a str; give the compiled "
                       r"keras.Model"):
        fit("model", X, Y, config=parity.config(tmp_path / "run"), verbose=False)
