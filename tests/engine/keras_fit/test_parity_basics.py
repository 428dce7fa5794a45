"""Parity with Keras's `fit` under MirroredStrategy: the plain cases (parity.py)."""

import keras
import pytest

import parity

EXAMPLES, BATCH = 88, 16  # 5 full batches and one of 8 per epoch (2 per replica on 4)


def data(n=EXAMPLES, seed=0, features=6):
    return parity.data(n, seed, features)


def dataset(n=EXAMPLES, batch=BATCH, seed=0):
    return parity.dataset(n, batch, seed)


def dense():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"])
    return model


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_dense_model_on_full_batches(tmp_path, replicas):
    parity.compare(dense, dataset(n=64), replicas=replicas, model_dir=tmp_path, epochs=2)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_a_partial_last_batch_and_validation(tmp_path, replicas):
    parity.compare(dense, dataset(), replicas=replicas, model_dir=tmp_path, epochs=2,
                   validation_data=dataset(n=40, seed=1))
