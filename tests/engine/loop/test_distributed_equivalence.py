"""N replicas on a global batch B must train exactly like one device on B.

This is the test that proves the distribution is right: a loss divided by the
per-replica instead of the global batch, or gradients reduced twice (the
Keras 3 optimizer would happily sum them again), makes the update N times too
large or too small, far outside float32 rounding.
"""

import numpy as np
import keras
import pytest

from equivalence import train_weights  # tests/equivalence.py, shared with central_storage's
from tfloop.engine.runtime.devices import max_relative_difference


# The one-device references every case reads (never changes): trained once per
# module, each the run the cases below trained again before. The tests reading
# them share an xdist group, so that one worker builds them once.
SHARED = pytest.mark.xdist_group("distributed_equivalence_one_device")


@pytest.fixture(scope="module")
def one_device_weights(cpu_devices):
    """One device, STEPS steps of SGD."""
    return train_weights(cpu_devices[:1])


@pytest.fixture(scope="module")
def one_device_initial(cpu_devices):
    """One device, no step: the initial weights."""
    return train_weights(cpu_devices[:1], steps=0)


@pytest.fixture(scope="module")
def one_device_one_step(cpu_devices):
    """One device, one step of SGD: the compressed cases' reference."""
    return train_weights(cpu_devices[:1], steps=1)


@SHARED
def test_initial_weights_do_not_depend_on_strategy(cpu_devices, one_device_initial):
    four = train_weights(cpu_devices, steps=0)
    assert max_relative_difference(one_device_initial, four) == 0.0


@SHARED
def test_four_replicas_match_one_device(cpu_devices, one_device_weights, one_device_initial):
    four = train_weights(cpu_devices)
    initial = one_device_initial
    # Training moved the weights far more than the replicas disagree.
    assert max_relative_difference(one_device_weights, initial) > 1e-2
    assert max_relative_difference(one_device_weights, four) < 1e-5


def test_adam_four_replicas_match_one_device(cpu_devices):
    adam = lambda: keras.optimizers.Adam(1e-3)  # noqa: E731
    one = train_weights(cpu_devices[:1], optimizer=adam)
    four = train_weights(cpu_devices, optimizer=adam)
    assert max_relative_difference(one, four) < 1e-5


def test_cnn_two_replicas_match_one_device(cpu_devices):
    one = train_weights(cpu_devices[:1], model="cnn")
    two = train_weights(cpu_devices[:2], model="cnn")
    assert max_relative_difference(one, two) < 1e-5


CPU_COLLECTIVES = ["ring", "hierarchical_copy", "reduce_to_one_device", "auto"]


@SHARED
@pytest.mark.parametrize("packing", [{}, {"num_packs": 2}, {"pack_bytes": 64 << 10}],
                         ids=["unpacked", "num_packs=2", "pack_bytes=64K"])
@pytest.mark.parametrize("collective", CPU_COLLECTIVES)
def test_every_cpu_collective_matches_one_device(cpu_devices, one_device_weights, collective, packing):
    four = train_weights(cpu_devices, collective=collective, **packing)
    assert max_relative_difference(one_device_weights, four) < 1e-5


def _update_relative_error(reference, initial, other):
    """Largest weight error relative to the largest update training made."""
    return max(float(np.max(np.abs(o - r)) / np.max(np.abs(r - i)))
               for r, i, o in zip(reference, initial, other))


# One step, so the error measured is that of one compressed all-reduce (over
# several steps ReLU switching amplifies any difference, rounding or not).
# Gradients are rounded to the compressed dtype on each replica and summed in
# it: 4 replicas add at most 3 roundings to the cast's one, each at most a
# unit roundoff u (bfloat16 2^-8 = 3.9e-3, float16 2^-11 = 4.9e-4) relative to
# the gradient, so the update's error stays below 4u (measured: 2.2u and
# 1.4u). A double reduction or a lost cast-back is off by O(1).
@SHARED
@pytest.mark.parametrize("dtype, unit_roundoff", [("bfloat16", 2.0**-8), ("float16", 2.0**-11)])
@pytest.mark.parametrize("collective", ["ring", "reduce_to_one_device"])
def test_compressed_gradients_match_within_the_dtype_rounding(
        cpu_devices, one_device_initial, one_device_one_step, collective, dtype, unit_roundoff):
    initial, reference = one_device_initial, one_device_one_step
    compressed = train_weights(cpu_devices, collective=collective, gradient_dtype=dtype, steps=1)
    error = _update_relative_error(reference, initial, compressed)
    assert 0 < error < 4 * unit_roundoff
