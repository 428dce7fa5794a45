"""A script's own strategy and compiled model handed to `fit` (issue 39, item 6).

The tutorials make `strategy = tf.distribute.MirroredStrategy()`, then the
model under `strategy.scope()`, then call `model.fit`. `tfloop.fit(model, ...)`
trains that very model on that very strategy (adopted, not rebuilt), equal to
Keras's own `fit` of the same model; a config that names another strategy or
devices, a model not compiled, and a strategy the engine cannot adopt are
refused in one line.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import parity
from tfloop.engine import RunConfig, fit
from tfloop.engine.errors import ConfigError
from tfloop.engine.strategies import adoption

EXAMPLES, BATCH = 64, 16


def _build():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"])
    return model


def _built_in(strategy, seed=3):
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        return _build()


@pytest.fixture(scope="module")
def keras_fit():
    """Keras's own `fit` of `_build` on 2 replicas, 2 epochs, validated each
    epoch on the training data: the reference of both comparing tests below
    (validation trains nothing: its weights are those of the same fit without
    it). Read only."""
    data = parity.dataset(EXAMPLES, BATCH)
    return parity.run_keras(_build, data, epochs=2, validation_data=data)


#: The tests reading `keras_fit`: one worker runs it once (`--dist loadgroup`).
KERAS_FIT = pytest.mark.xdist_group("test_fit_adopts_keras_fit")


@KERAS_FIT
@pytest.mark.compares  # trained against Keras's own fit (tests/tiers.py)
def test_fit_trains_the_scripts_model_on_its_strategy_as_keras_fit_does(tmp_path, keras_fit):
    data = parity.dataset(EXAMPLES, BATCH)
    strategy = parity.keras_strategy(2)
    theirs = keras_fit

    model = _built_in(strategy)
    before = [np.array(w) for w in model.get_weights()]
    history = fit(model, data, epochs=2, validation_data=data, verbose=0,
                  config=RunConfig(model_dir=str(tmp_path), steps_per_loop=1))

    assert history.model is model  # the script's own model, trained in place
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert history.run_result["num_replicas"] == strategy.num_replicas_in_sync == 2
    ours = parity.Side(dict(history.history), list(history.epoch), parity._weights(model),
                       model, history)
    parity.assert_same(theirs, ours)


def test_a_model_built_outside_any_strategy_trains_on_one_device(tmp_path):
    keras.utils.set_random_seed(3)
    model = _build()
    history = fit(model, parity.dataset(EXAMPLES, BATCH), epochs=1, verbose=0,
                  config=RunConfig(model_dir=str(tmp_path)))
    assert history.model is model
    assert history.run_result["num_replicas"] == 1


def test_a_config_naming_other_devices_or_another_strategy_is_refused_in_one_line(tmp_path):
    model = _built_in(parity.keras_strategy(2))
    data = parity.dataset(EXAMPLES, BATCH)
    with pytest.raises(ConfigError, match=r"^fit: RunConfig\(devices='cpu:0,cpu:1,cpu:2'\) "
                       r"but the model's strategy runs on 'cpu:0,cpu:1'"):
        fit(model, data, config=RunConfig(model_dir=str(tmp_path), devices="cpu:0,cpu:1,cpu:2"))
    with pytest.raises(ConfigError, match=r"^fit: RunConfig\(strategy='one_device'\) but the "
                       r"model was built under its own mirrored strategy"):
        fit(model, data, config=RunConfig(model_dir=str(tmp_path), strategy="one_device",
                                          devices="cpu:0"))
    assert not (tmp_path / "run.json").exists()


def test_a_model_not_compiled_is_refused_in_one_line():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    with pytest.raises(ConfigError, match=r"^fit: the model 'sequential\w*' is not compiled; "
                       r"call model.compile"):
        fit(model, parity.dataset(EXAMPLES, BATCH))


def test_which_strategies_are_adopted_and_as_what():
    mirrored = parity.keras_strategy(2)
    assert adoption.adopted_placement(mirrored) == adoption.AdoptedPlacement(
        "mirrored", "cpu:0,cpu:1")
    one = tf.distribute.OneDeviceStrategy("/cpu:1")
    assert adoption.adopted_placement(one) == adoption.AdoptedPlacement("one_device", "cpu:1")
    assert adoption.adopted_placement(tf.distribute.get_strategy()).strategy == "default"
    with pytest.raises(ConfigError, match=r"^fit: the model was built under a object, which fit "
                       r"cannot adopt"):
        adoption.adopted_placement(object())


@KERAS_FIT
@pytest.mark.compares  # trained against Keras's own fit (tests/tiers.py)
def test_after_fit_the_scripts_optimizer_reduces_as_keras_again(tmp_path, keras_fit):
    """The engine turns Keras's own gradient reduction off for its run and on
    again after it: one epoch of tfloop.fit then one of Keras's `model.fit`
    on the same model trains what two epochs of Keras's fit train (left off,
    Keras's epoch would apply each replica's gradient alone; the two epochs
    are `keras_fit`'s, whose validation trains nothing)."""
    data = parity.dataset(EXAMPLES, BATCH)
    strategy = parity.keras_strategy(2)
    theirs = keras_fit

    model = _built_in(strategy)
    fit(model, data, epochs=1, verbose=0,
        config=RunConfig(model_dir=str(tmp_path), steps_per_loop=1))
    optimizer = model.optimizer
    assert "_all_reduce_sum_gradients" not in vars(optimizer)
    with strategy.scope():
        model.fit(data, initial_epoch=1, epochs=2, verbose=0)
    for (name, a), (_, b) in zip(parity._weights(model), theirs.weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)
