"""`--fused_optimizer`: one TensorFlow training kernel per variable, Keras's
formulas and slots, so fused and Keras updates agree to float32 rounding."""

import keras
import numpy as np
import pytest

from engine import optimizers


def _train(optimizer, steps=3):
    variables = [keras.Variable(np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)),
                 keras.Variable(np.full([4], 0.5, dtype="float32"))]
    optimizer.build(variables)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        optimizer.apply_gradients(zip(grads, variables))
    return [v.numpy() for v in variables], [v.numpy() for v in optimizer.variables]


@pytest.mark.parametrize("name", optimizers.available())
def test_fused_updates_equal_the_keras_updates(name):
    weights, slots = _train(optimizers.build(name, 0.1))
    fused_weights, fused_slots = _train(optimizers.build_fused(name, 0.1))
    assert len(fused_slots) == len(slots)
    for want, got in zip(weights + slots, fused_weights + fused_slots):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
